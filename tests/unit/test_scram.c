/*
 * test_scram.c - the server side of SCRAM-SHA-256 and SCRAM-SHA-1: the
 * published example conversations byte for byte, refused proofs, nonces
 * and malformed messages from tables, SASLprep, key derivation, and the
 * entries of scram_make_user and `relaybus-proxy --make-user` verified
 * by a client.
 *
 * The vectors do not come from this implementation:
 * - SCRAM-SHA-256: RFC 7677 section 3 (user "user", password "pencil"),
 *   also in the MongoDB driver authentication specification;
 * - SCRAM-SHA-1 with mongod's password digest: the specification's
 *   example (client nonce fyko+d2lbbFgONRv9qkxdawL, i=10000);
 * - the StoredKey and ServerKey of both were computed with Python's
 *   hashlib (pbkdf2_hmac, then hmac "Client Key" hashed and hmac
 *   "Server Key"; SCRAM-SHA-1 on hashlib.md5(b"user:mongo:pencil").hexdigest()).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "base/authfile.h"
#include "codec/scram.h"

#ifndef RELAYBUS_PROXY_BIN
#define RELAYBUS_PROXY_BIN "./relaybus-proxy"
#endif

/* RFC 7677's user, as an auth-file line. */
#define RFC7677_ENTRY                                                                                   \
   "user:SCRAM-SHA-256:4096:W22ZaJ0SNY7soEsUEjb6gQ==:WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:"    \
   "wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=\n"
#define RFC7677_CLIENT_FIRST "n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
#define RFC7677_SERVER_NONCE "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
#define RFC7677_SERVER_FIRST "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
#define RFC7677_NONCE "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
#define RFC7677_PROOF "dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
#define RFC7677_CLIENT_FINAL "c=biws,r=" RFC7677_NONCE ",p=" RFC7677_PROOF
#define RFC7677_SERVER_FINAL "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="

/* The specification's SCRAM-SHA-1 example (mongod's digest of "pencil"). */
#define SHA1_ENTRY                                                                                     \
   "user:SCRAM-SHA-1:10000:rQ9ZY3MntBeuP3E1TDVC4w==:p5z6n7Utqf+pLBkaeJk4T3eBOOA=:lRrVHyqMX+OOqGvpcvv9anlA8IQ=\n"
#define SHA1_CLIENT_FIRST "n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL"
#define SHA1_SERVER_NONCE "Ho+Vgk7qvUOKUwuWLIWg4l/9SraGMHEE"
#define SHA1_SERVER_FIRST "r=fyko+d2lbbFgONRv9qkxdawLHo+Vgk7qvUOKUwuWLIWg4l/9SraGMHEE,s=rQ9ZY3MntBeuP3E1TDVC4w==,i=10000"
#define SHA1_CLIENT_FINAL \
   "c=biws,r=fyko+d2lbbFgONRv9qkxdawLHo+Vgk7qvUOKUwuWLIWg4l/9SraGMHEE,p=MC2T8BvbmWRckDw8oWl5IVghwCY="
#define SHA1_SERVER_FINAL "v=UMWeI25JD1yNYZRMpZ4VHvhZ9e0="

static authfile_t *
users_of (const char *text)
{
   bson_error_t error;
   authfile_t *af = authfile_parse (text, strlen (text), "test.auth", &error);
   if (!af)
      fail_msg ("auth file refused: %s", error.message);
   return af;
}

/* Runs client-first; returns server-first (caller frees) or NULL. */
static char *
first (scram_server_t *conv, const authfile_t *af, const char *msg, bson_error_t *error)
{
   char *out = NULL;
   size_t out_len = 0;
   if (!scram_server_first (conv, af, (const uint8_t *) msg, strlen (msg), &out, &out_len, error))
      return NULL;
   assert_int_equal (out_len, strlen (out));
   return out;
}

static char *
final (scram_server_t *conv, const char *msg, bson_error_t *error)
{
   char *out = NULL;
   size_t out_len = 0;
   if (!scram_server_final (conv, (const uint8_t *) msg, strlen (msg), &out, &out_len, error))
      return NULL;
   assert_int_equal (out_len, strlen (out));
   return out;
}

/* A conversation of `entry` up to server-first with a fixed server nonce. */
static scram_server_t *
started (authfile_t *af, authfile_mech_t mech, const char *client_first, const char *server_nonce,
         const char *expect_server_first)
{
   bson_error_t error;
   scram_server_t *conv = scram_server_new (mech);
   char *sf;

   assert_true (scram_server_set_nonce (conv, server_nonce, &error));
   sf = first (conv, af, client_first, &error);
   if (!sf)
      fail_msg ("client-first refused: %s", error.message);
   assert_string_equal (sf, expect_server_first);
   assert_int_equal (scram_server_state (conv), SCRAM_STATE_FIRST_SENT);
   bson_free (sf);
   return conv;
}

static void
test_rfc7677_conversation (void **state)
{
   (void) state;
   authfile_t *af = users_of (RFC7677_ENTRY);
   scram_server_t *conv =
      started (af, AUTHFILE_SCRAM_SHA_256, RFC7677_CLIENT_FIRST, RFC7677_SERVER_NONCE, RFC7677_SERVER_FIRST);
   bson_error_t error;
   char *sf = final (conv, RFC7677_CLIENT_FINAL, &error);

   if (!sf)
      fail_msg ("client-final refused: %s", error.message);
   assert_string_equal (sf, RFC7677_SERVER_FINAL);
   assert_int_equal (scram_server_state (conv), SCRAM_STATE_DONE);
   assert_string_equal (scram_server_user (conv), "user");
   /* Nothing after the end. */
   assert_null (final (conv, RFC7677_CLIENT_FINAL, &error));
   assert_int_equal (error.code, SCRAM_ERR_STATE);
   bson_free (sf);
   scram_server_destroy (conv);
   authfile_destroy (af);
}

static void
test_sha1_mongo_conversation (void **state)
{
   (void) state;
   authfile_t *af = users_of (SHA1_ENTRY);
   scram_server_t *conv = started (af, AUTHFILE_SCRAM_SHA_1, SHA1_CLIENT_FIRST, SHA1_SERVER_NONCE, SHA1_SERVER_FIRST);
   bson_error_t error;
   char *sf = final (conv, SHA1_CLIENT_FINAL, &error);

   if (!sf)
      fail_msg ("client-final refused: %s", error.message);
   assert_string_equal (sf, SHA1_SERVER_FINAL);
   assert_int_equal (scram_server_state (conv), SCRAM_STATE_DONE);
   bson_free (sf);
   scram_server_destroy (conv);
   authfile_destroy (af);
}

/* The keys scram_derive_key makes are the ones Python's hashlib made. */
static void
test_derive_key (void **state)
{
   (void) state;
   authfile_t *af = users_of (RFC7677_ENTRY SHA1_ENTRY);
   const authfile_user_t *u = authfile_lookup (af, "user", 4);
   authfile_key_t key;
   bson_error_t error;
   uint8_t salt[64];
   size_t n;

   assert_non_null (u);
   assert_true (authfile_b64_decode ("W22ZaJ0SNY7soEsUEjb6gQ==", 24, salt, sizeof salt, &n));
   assert_true (scram_derive_key (AUTHFILE_SCRAM_SHA_256, "user", "pencil", salt, n, 4096, &key, &error));
   assert_memory_equal (key.stored_key, u->keys[AUTHFILE_SCRAM_SHA_256].stored_key, 32);
   assert_memory_equal (key.server_key, u->keys[AUTHFILE_SCRAM_SHA_256].server_key, 32);

   assert_true (authfile_b64_decode ("rQ9ZY3MntBeuP3E1TDVC4w==", 24, salt, sizeof salt, &n));
   assert_true (scram_derive_key (AUTHFILE_SCRAM_SHA_1, "user", "pencil", salt, n, 10000, &key, &error));
   assert_memory_equal (key.stored_key, u->keys[AUTHFILE_SCRAM_SHA_1].stored_key, 20);
   assert_memory_equal (key.server_key, u->keys[AUTHFILE_SCRAM_SHA_1].server_key, 20);
   /* SCRAM-SHA-1 hashes the user name in: another user, other keys. */
   assert_true (scram_derive_key (AUTHFILE_SCRAM_SHA_1, "User", "pencil", salt, n, 10000, &key, &error));
   assert_memory_not_equal (key.stored_key, u->keys[AUTHFILE_SCRAM_SHA_1].stored_key, 20);
   authfile_destroy (af);
}

/* The RFC's proof for "pencil" against entries of other passwords. */
static void
test_wrong_password (void **state)
{
   (void) state;
   authfile_user_t user;
   bson_error_t error;
   uint8_t salt[64];
   size_t n;
   char *text;

   memset (&user, 0, sizeof user);
   strcpy (user.name, "user");
   assert_true (authfile_b64_decode ("W22ZaJ0SNY7soEsUEjb6gQ==", 24, salt, sizeof salt, &n));
   assert_true (scram_derive_key (AUTHFILE_SCRAM_SHA_256, "user", "pencil2", salt, n, 4096,
                                  &user.keys[AUTHFILE_SCRAM_SHA_256], &error));
   text = authfile_format_user (&user);
   authfile_t *af = users_of (text);
   scram_server_t *conv =
      started (af, AUTHFILE_SCRAM_SHA_256, RFC7677_CLIENT_FIRST, RFC7677_SERVER_NONCE, RFC7677_SERVER_FIRST);

   assert_null (final (conv, RFC7677_CLIENT_FINAL, &error));
   assert_int_equal (error.domain, SCRAM_ERROR_DOMAIN);
   assert_int_equal (error.code, SCRAM_ERR_AUTH_FAILED);
   assert_non_null (strstr (error.message, "wrong proof"));
   assert_int_equal (scram_server_state (conv), SCRAM_STATE_FAILED);
   scram_server_destroy (conv);
   authfile_destroy (af);
   bson_free (text);
}

/* Each character of the proof changed in turn is refused. */
static void
test_tampered_proof (void **state)
{
   (void) state;
   authfile_t *af = users_of (RFC7677_ENTRY);
   const char *proof = RFC7677_PROOF;

   for (size_t i = 0; i < strlen (proof) - 1; i++) { /* the last is '=' */
      char msg[256];
      bson_error_t error;
      scram_server_t *conv =
         started (af, AUTHFILE_SCRAM_SHA_256, RFC7677_CLIENT_FIRST, RFC7677_SERVER_NONCE, RFC7677_SERVER_FIRST);
      snprintf (msg, sizeof msg, "%s", RFC7677_CLIENT_FINAL);
      char *p = strstr (msg, ",p=") + 3 + i;
      *p = *p == 'A' ? 'B' : 'A';
      char *out = final (conv, msg, &error);
      if (out)
         fail_msg ("tampered proof accepted: %s", msg);
      /* Changing the last data character may leave the decoded bytes
       * whole or change them; either way it is refused. */
      assert_true (error.code == SCRAM_ERR_AUTH_FAILED || error.code == SCRAM_ERR_MALFORMED);
      scram_server_destroy (conv);
   }
   authfile_destroy (af);
}

typedef struct {
   const char *msg;
   int code;
   const char *words; /* in the error message */
} bad_t;

static void
test_bad_client_first (void **state)
{
   (void) state;
   static const bad_t table[] = {
      {"p=tls-unique,,n=user,r=abc", SCRAM_ERR_MALFORMED, "channel binding (p=) is not supported"},
      {"n,a=admin,n=user,r=abc", SCRAM_ERR_MALFORMED, "authorization identity"},
      {"x,,n=user,r=abc", SCRAM_ERR_MALFORMED, "gs2 header"},
      {"n,n=user,r=abc", SCRAM_ERR_MALFORMED, "authorization identity"},
      {"", SCRAM_ERR_MALFORMED, "is empty"},
      {"n,,m=ext,n=user,r=abc", SCRAM_ERR_MALFORMED, "mandatory extension"},
      {"n,,r=abc", SCRAM_ERR_MALFORMED, "no user name"},
      {"n,,n=,r=abc", SCRAM_ERR_MALFORMED, "user name (n=) is empty"},
      {"n,,n=us=er,r=abc", SCRAM_ERR_MALFORMED, "'=' not followed by 2C or 3D"},
      {"n,,n=user=2", SCRAM_ERR_MALFORMED, "'=' not followed"},
      {"n,,n=user", SCRAM_ERR_MALFORMED, "no nonce"},
      {"n,,n=user,x=abc", SCRAM_ERR_MALFORMED, "no nonce"},
      {"n,,n=user,r=", SCRAM_ERR_MALFORMED, "client nonce (r=) is empty"},
      {"n,,n=user,r=abc,", SCRAM_ERR_MALFORMED, "ends with ','"},
      {"n,,n=user,r=ab c", SCRAM_ERR_MALFORMED, "not printable"},
      {"n,,n=user,r=ab\x01", SCRAM_ERR_MALFORMED, "not printable"},
      {"n,,n=user,r=abc,=x", SCRAM_ERR_MALFORMED, "malformed attribute"},
      {"n,,n=user,r=abc\xff", SCRAM_ERR_MALFORMED, "UTF-8"},
      {"n,,n=nobody,r=abc", SCRAM_ERR_AUTH_FAILED, "unknown user"},
   };
   authfile_t *af = users_of (RFC7677_ENTRY);

   for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
      bson_error_t error;
      scram_server_t *conv = scram_server_new (AUTHFILE_SCRAM_SHA_256);
      char *out = first (conv, af, table[i].msg, &error);
      if (out)
         fail_msg ("accepted: '%s' -> %s", table[i].msg, out);
      if ((int) error.code != table[i].code || !strstr (error.message, table[i].words))
         fail_msg ("'%s': got %u '%s', expected %d '%s'", table[i].msg, error.code, error.message, table[i].code,
                   table[i].words);
      assert_int_equal (scram_server_state (conv), SCRAM_STATE_FAILED);
      scram_server_destroy (conv);
   }
   /* A NUL byte inside the message (length given). */
   {
      bson_error_t error;
      char *out = NULL;
      size_t out_len;
      scram_server_t *conv = scram_server_new (AUTHFILE_SCRAM_SHA_256);
      assert_false (scram_server_first (conv, af, (const uint8_t *) "n,,n=us\0er,r=abc", 16, &out, &out_len, &error));
      assert_non_null (strstr (error.message, "NUL"));
      scram_server_destroy (conv);
   }
   /* A message exactly as long as its bytes, with nothing after them (as
    * a BSON binary payload arrives): nothing may read past it (valgrind
    * and ASan check). */
   {
      bson_error_t error;
      char *out = NULL;
      size_t out_len, len = strlen (RFC7677_CLIENT_FIRST);
      uint8_t *exact = bson_malloc (len);
      scram_server_t *conv = scram_server_new (AUTHFILE_SCRAM_SHA_256);
      memcpy (exact, RFC7677_CLIENT_FIRST, len);
      assert_true (scram_server_first (conv, af, exact, len, &out, &out_len, &error));
      bson_free (out);
      bson_free (exact);
      scram_server_destroy (conv);
   }
   /* Too long. */
   {
      bson_error_t error;
      char *out = NULL, *big = bson_malloc (SCRAM_MAX_MESSAGE + 2);
      size_t out_len;
      scram_server_t *conv = scram_server_new (AUTHFILE_SCRAM_SHA_256);
      memset (big, 'a', SCRAM_MAX_MESSAGE + 1);
      memcpy (big, "n,,n=user,r=", 12);
      assert_false (scram_server_first (conv, af, (const uint8_t *) big, SCRAM_MAX_MESSAGE + 1, &out, &out_len, &error));
      assert_int_equal (error.code, SCRAM_ERR_TOO_LARGE);
      bson_free (big);
      scram_server_destroy (conv);
   }
   authfile_destroy (af);
}

static void
test_bad_client_final (void **state)
{
   (void) state;
   static const bad_t table[] = {
      {"r=" RFC7677_NONCE ",p=" RFC7677_PROOF, SCRAM_ERR_MALFORMED, "must start with c="},
      {"c=eSws,r=" RFC7677_NONCE ",p=" RFC7677_PROOF, SCRAM_ERR_MALFORMED, "does not match the gs2 header"},
      {"c=biws=,r=" RFC7677_NONCE ",p=" RFC7677_PROOF, SCRAM_ERR_MALFORMED, "not valid base64"},
      {"c=b!ws,r=" RFC7677_NONCE ",p=" RFC7677_PROOF, SCRAM_ERR_MALFORMED, "not valid base64"},
      {"c=biws,p=" RFC7677_PROOF, SCRAM_ERR_MALFORMED, "no nonce"},
      {"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k1,p=" RFC7677_PROOF, SCRAM_ERR_MALFORMED,
       "nonce mismatch"},
      {"c=biws,r=rOprNGfwEbeRWgbNEkqO,p=" RFC7677_PROOF, SCRAM_ERR_MALFORMED, "nonce mismatch"},
      {"c=biws,r=" RFC7677_NONCE "x,p=" RFC7677_PROOF, SCRAM_ERR_MALFORMED, "nonce mismatch"},
      {"c=biws,r=" RFC7677_NONCE, SCRAM_ERR_MALFORMED, "does not end with the proof"},
      {"c=biws,r=" RFC7677_NONCE ",p=" RFC7677_PROOF ",x=1", SCRAM_ERR_MALFORMED, "does not end with the proof"},
      {"c=biws,r=" RFC7677_NONCE ",p=dHzbZapWIk4jUhN", SCRAM_ERR_MALFORMED, "proof (p=) is not base64"},
      {"c=biws,r=" RFC7677_NONCE ",p=dHzbZapWIk4jUhN+Ute9yQ==", SCRAM_ERR_MALFORMED, "proof (p=) is not base64"},
      {"c=biws,r=" RFC7677_NONCE ",1=x,p=" RFC7677_PROOF, SCRAM_ERR_MALFORMED, "malformed attribute before p="},
   };
   authfile_t *af = users_of (RFC7677_ENTRY);

   for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
      bson_error_t error;
      scram_server_t *conv =
         started (af, AUTHFILE_SCRAM_SHA_256, RFC7677_CLIENT_FIRST, RFC7677_SERVER_NONCE, RFC7677_SERVER_FIRST);
      char *out = final (conv, table[i].msg, &error);
      if (out)
         fail_msg ("accepted: '%s' -> %s", table[i].msg, out);
      if ((int) error.code != table[i].code || !strstr (error.message, table[i].words))
         fail_msg ("'%s': got %u '%s', expected %d '%s'", table[i].msg, error.code, error.message, table[i].code,
                   table[i].words);
      assert_int_equal (scram_server_state (conv), SCRAM_STATE_FAILED);
      scram_server_destroy (conv);
   }
   /* An optional extension before the proof is part of AuthMessage: the
    * RFC's proof no longer matches, so it is refused as a wrong proof (not
    * as malformed). */
   {
      bson_error_t error;
      scram_server_t *conv =
         started (af, AUTHFILE_SCRAM_SHA_256, RFC7677_CLIENT_FIRST, RFC7677_SERVER_NONCE, RFC7677_SERVER_FIRST);
      assert_null (final (conv, "c=biws,r=" RFC7677_NONCE ",x=1,p=" RFC7677_PROOF, &error));
      assert_int_equal (error.code, SCRAM_ERR_AUTH_FAILED);
      scram_server_destroy (conv);
   }
   authfile_destroy (af);
}

static void
test_order_and_mechanism (void **state)
{
   (void) state;
   authfile_t *af = users_of (RFC7677_ENTRY);
   bson_error_t error;
   scram_server_t *conv = scram_server_new (AUTHFILE_SCRAM_SHA_256);

   /* client-final first. */
   assert_null (final (conv, RFC7677_CLIENT_FINAL, &error));
   assert_int_equal (error.code, SCRAM_ERR_STATE);
   assert_null (first (conv, af, RFC7677_CLIENT_FIRST, &error));
   assert_int_equal (error.code, SCRAM_ERR_STATE);
   scram_server_destroy (conv);

   /* The user has no SCRAM-SHA-1 entry. */
   conv = scram_server_new (AUTHFILE_SCRAM_SHA_1);
   assert_null (first (conv, af, SHA1_CLIENT_FIRST, &error));
   assert_int_equal (error.code, SCRAM_ERR_AUTH_FAILED);
   assert_non_null (strstr (error.message, "no entry for this mechanism"));
   scram_server_destroy (conv);

   /* Bad fixed nonces. */
   conv = scram_server_new (AUTHFILE_SCRAM_SHA_256);
   assert_false (scram_server_set_nonce (conv, "a,b", &error));
   assert_false (scram_server_set_nonce (conv, "", &error));
   scram_server_destroy (conv);
   scram_server_destroy (NULL);
   authfile_destroy (af);
}

/* "=2C" and "=3D" in n= stand for ',' and '='. */
static void
test_escaped_user (void **state)
{
   (void) state;
   authfile_t *af = users_of ("a,b=c:SCRAM-SHA-256:4096:W22ZaJ0SNY7soEsUEjb6gQ==:"
                              "WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=\n");
   bson_error_t error;
   scram_server_t *conv = scram_server_new (AUTHFILE_SCRAM_SHA_256);
   char *sf = first (conv, af, "n,,n=a=2Cb=3Dc,r=abc", &error);

   if (!sf)
      fail_msg ("refused: %s", error.message);
   assert_string_equal (scram_server_user (conv), "a,b=c");
   bson_free (sf);
   scram_server_destroy (conv);
   authfile_destroy (af);
}

/* A random server nonce: the client's, then 32 base64 characters, new
 * each time. */
static void
test_random_nonce (void **state)
{
   (void) state;
   authfile_t *af = users_of (RFC7677_ENTRY);
   char *sf[2];

   for (int k = 0; k < 2; k++) {
      bson_error_t error;
      scram_server_t *conv = scram_server_new (AUTHFILE_SCRAM_SHA_256);
      sf[k] = first (conv, af, "y,,n=user,r=clientnonce", &error);
      assert_non_null (sf[k]);
      assert_int_equal (strncmp (sf[k], "r=clientnonce", 13), 0);
      assert_int_equal (strchr (sf[k], ',') - sf[k], 2 + 11 + 32);
      assert_non_null (strstr (sf[k], ",s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"));
      scram_server_destroy (conv);
   }
   assert_string_not_equal (sf[0], sf[1]);
   bson_free (sf[0]);
   bson_free (sf[1]);
   authfile_destroy (af);
}

static void
test_saslprep (void **state)
{
   (void) state;
   static const struct {
      const char *in, *out, *words;
   } table[] = {
      /* RFC 4013 section 3 examples that are ASCII, and ASCII rules. */
      {"user", "user", NULL},
      {"USER", "USER", NULL},
      {"\x07", NULL, "prohibited character"},
      {"pass word", "pass word", NULL}, /* ASCII space is allowed (only non-ASCII spaces map) */
      {"tab\there", NULL, "prohibited character"},
      {"del\x7f", NULL, "prohibited character"},
      {"", NULL, "empty"},
      /* The non-ASCII examples of RFC 4013: refused, not mis-prepared. */
      {"I\xc2\xadX", NULL, "non-ASCII characters is not implemented"},
      {"\xc2\xaa", NULL, "non-ASCII characters is not implemented"},
      {"\xe2\x85\xa8", NULL, "non-ASCII characters is not implemented"},
      {"\xd8\xa7" "1", NULL, "non-ASCII characters is not implemented"},
   };

   for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
      bson_error_t error;
      char *out = NULL;
      bool ok = scram_saslprep (table[i].in, strlen (table[i].in), &out, &error);
      if (table[i].out) {
         if (!ok)
            fail_msg ("'%s' refused: %s", table[i].in, error.message);
         assert_string_equal (out, table[i].out);
      } else {
         assert_false (ok);
         assert_null (out);
         assert_int_equal (error.code, SCRAM_ERR_SASLPREP);
         if (!strstr (error.message, table[i].words))
            fail_msg ("'%s': %s", table[i].in, error.message);
      }
      bson_free (out);
   }
   /* scram_derive_key refuses a non-ASCII SCRAM-SHA-256 password, while
    * SCRAM-SHA-1 (never SASLprepped) takes it. */
   {
      authfile_key_t key;
      bson_error_t error;
      const uint8_t salt[4] = {1, 2, 3, 4};
      assert_false (scram_derive_key (AUTHFILE_SCRAM_SHA_256, "u", "p\xc3\xa4ss", salt, 4, 4096, &key, &error));
      assert_int_equal (error.code, SCRAM_ERR_SASLPREP);
      assert_true (scram_derive_key (AUTHFILE_SCRAM_SHA_1, "u", "p\xc3\xa4ss", salt, 4, 4096, &key, &error));
   }
}

/* ---- a SCRAM client, written here from RFC 5802, to check new entries ---- */

static void
b64 (const uint8_t *in, size_t len, char *out)
{
   EVP_EncodeBlock ((unsigned char *) out, in, (int) len);
}

/* The client's final message for `password` after server-first `sf`. */
static char *
client_final (authfile_mech_t mech, const char *user, const char *password, const char *client_first_bare,
              const char *sf)
{
   const EVP_MD *md = mech == AUTHFILE_SCRAM_SHA_1 ? EVP_sha1 () : EVP_sha256 ();
   size_t klen = mech == AUTHFILE_SCRAM_SHA_1 ? 20 : 32;
   char pw[64], salt_b64[128], nonce[256], proof_b64[64];
   uint8_t salt[64], salted[32], ck[32], sk[32], sig[32], proof[32];
   unsigned iterations, n;
   int salt_len;

   assert_int_equal (sscanf (sf, "r=%255[^,],s=%127[^,],i=%u", nonce, salt_b64, &iterations), 3);
   EVP_DecodeBlock (salt, (const unsigned char *) salt_b64, (int) strlen (salt_b64));
   /* EVP_DecodeBlock counts the padding as data. */
   salt_len = (int) (strlen (salt_b64) / 4 * 3) -
              (salt_b64[strlen (salt_b64) - 1] == '=') - (salt_b64[strlen (salt_b64) - 2] == '=');
   if (mech == AUTHFILE_SCRAM_SHA_1) {
      char in[256];
      uint8_t md5[16];
      snprintf (in, sizeof in, "%s:mongo:%s", user, password);
      EVP_Digest (in, strlen (in), md5, &n, EVP_md5 (), NULL);
      for (int i = 0; i < 16; i++)
         snprintf (pw + 2 * i, 3, "%02x", md5[i]);
   } else {
      snprintf (pw, sizeof pw, "%s", password);
   }
   PKCS5_PBKDF2_HMAC (pw, (int) strlen (pw), salt, salt_len, (int) iterations, md, (int) klen, salted);
   HMAC (md, salted, (int) klen, (const uint8_t *) "Client Key", 10, ck, &n);
   EVP_Digest (ck, klen, sk, &n, md, NULL);
   char *without_proof = bson_strdup_printf ("c=biws,r=%s", nonce);
   char *am = bson_strdup_printf ("%s,%s,%s", client_first_bare, sf, without_proof);
   HMAC (md, sk, (int) klen, (const uint8_t *) am, strlen (am), sig, &n);
   for (size_t i = 0; i < klen; i++)
      proof[i] = ck[i] ^ sig[i];
   b64 (proof, klen, proof_b64);
   char *msg = bson_strdup_printf ("%s,p=%s", without_proof, proof_b64);
   bson_free (without_proof);
   bson_free (am);
   return msg;
}

/* Authenticates `user` with `password` against `af` with `mech`: true if
 * the server accepted the proof. */
static bool
login (const authfile_t *af, authfile_mech_t mech, const char *user, const char *password)
{
   bson_error_t error;
   scram_server_t *conv = scram_server_new (mech);
   char *bare = bson_strdup_printf ("n=%s,r=Zm9vYmFyYmF6cXV4", user);
   char *cf = bson_strdup_printf ("n,,%s", bare);
   char *sf = first (conv, af, cf, &error);
   char *fin, *sfin;
   bool ok;

   if (!sf)
      fail_msg ("client-first refused: %s", error.message);
   fin = client_final (mech, user, password, bare, sf);
   sfin = final (conv, fin, &error);
   ok = sfin != NULL;
   if (ok) {
      assert_int_equal (strncmp (sfin, "v=", 2), 0);
      assert_int_equal (scram_server_state (conv), SCRAM_STATE_DONE);
   } else {
      assert_int_equal (error.code, SCRAM_ERR_AUTH_FAILED);
   }
   bson_free (sfin);
   bson_free (fin);
   bson_free (sf);
   bson_free (cf);
   bson_free (bare);
   scram_server_destroy (conv);
   return ok;
}

/* The test client itself agrees with the RFC: it produces the RFC's
 * client-final from the RFC's server-first. */
static void
test_client_matches_rfc (void **state)
{
   (void) state;
   char *fin = client_final (AUTHFILE_SCRAM_SHA_256, "user", "pencil", "n=user,r=rOprNGfwEbeRWgbNEkqO",
                             RFC7677_SERVER_FIRST);
   assert_string_equal (fin, RFC7677_CLIENT_FINAL);
   bson_free (fin);
   fin = client_final (AUTHFILE_SCRAM_SHA_1, "user", "pencil", "n=user,r=fyko+d2lbbFgONRv9qkxdawL", SHA1_SERVER_FIRST);
   assert_string_equal (fin, SHA1_CLIENT_FINAL);
   bson_free (fin);
}

static void
check_made_entry (const char *text, const char *name, const char *password)
{
   authfile_t *af = users_of (text);
   const authfile_user_t *u = authfile_lookup (af, name, strlen (name));

   assert_non_null (u);
   assert_int_equal (authfile_count (af), 1);
   assert_true (u->keys[AUTHFILE_SCRAM_SHA_256].present);
   assert_true (u->keys[AUTHFILE_SCRAM_SHA_1].present);
   assert_int_equal (u->keys[AUTHFILE_SCRAM_SHA_256].iterations, SCRAM_SHA_256_ITERATIONS);
   assert_int_equal (u->keys[AUTHFILE_SCRAM_SHA_1].iterations, SCRAM_SHA_1_ITERATIONS);
   assert_int_equal (u->keys[AUTHFILE_SCRAM_SHA_256].salt_len, 28);
   assert_int_equal (u->keys[AUTHFILE_SCRAM_SHA_1].salt_len, 16);
   /* The passwords used here hold a character base64 never has. */
   assert_null (strstr (text, password));
   assert_true (login (af, AUTHFILE_SCRAM_SHA_256, name, password));
   assert_true (login (af, AUTHFILE_SCRAM_SHA_1, name, password));
   assert_false (login (af, AUTHFILE_SCRAM_SHA_256, name, "wrong"));
   assert_false (login (af, AUTHFILE_SCRAM_SHA_1, name, "wrong"));
   authfile_destroy (af);
}

static void
test_make_user (void **state)
{
   (void) state;
   authfile_user_t user;
   bson_error_t error;
   char *text;

   assert_true (scram_make_user ("alice", "s3cret pass", &user, &error));
   text = authfile_format_user (&user);
   assert_int_equal (strncmp (text, "alice:SCRAM-SHA-256:15000:", 26), 0);
   check_made_entry (text, "alice", "s3cret pass");
   bson_free (text);

   assert_false (scram_make_user ("", "x", &user, &error));
   assert_false (scram_make_user ("#x", "x", &user, &error));
   assert_false (scram_make_user ("bob", "", &user, &error));
   assert_false (scram_make_user ("bob", "caf\xc3\xa9", &user, &error));
   assert_non_null (strstr (error.message, "not implemented"));
}

/* Runs `relaybus-proxy --make-user NAME` with `input` on stdin; returns
 * its exit status and sets *out (caller frees) to its stdout. */
static int
run_make_user (const char *name, const char *input, char **out)
{
   char cmd[512];
   char buf[4096];
   size_t n = 0;
   FILE *f;
   FILE *in = tmpfile ();

   assert_non_null (in);
   fputs (input, in);
   rewind (in);
   /* The child reads the temporary file as its stdin. */
   snprintf (cmd, sizeof cmd, "exec %s --make-user '%s' </dev/fd/%d 2>/dev/null", RELAYBUS_PROXY_BIN, name,
             fileno (in));
   f = popen (cmd, "r");
   assert_non_null (f);
   n = fread (buf, 1, sizeof buf - 1, f);
   buf[n] = '\0';
   int status = pclose (f);
   fclose (in);
   *out = bson_strdup (buf);
   return WIFEXITED (status) ? WEXITSTATUS (status) : -1;
}

static void
test_make_user_command (void **state)
{
   (void) state;
   char *out;

   assert_int_equal (run_make_user ("carol", "open sesame\n", &out), 0);
   check_made_entry (out, "carol", "open sesame");
   bson_free (out);

   /* Without a newline at the end, too. */
   assert_int_equal (run_make_user ("dave", "no-newline!", &out), 0);
   check_made_entry (out, "dave", "no-newline!");
   bson_free (out);

   assert_int_equal (run_make_user ("carol", "\n", &out), 2);
   assert_string_equal (out, "");
   bson_free (out);
   assert_int_equal (run_make_user ("carol", "", &out), 2);
   bson_free (out);
   assert_int_equal (run_make_user ("#carol", "pw\n", &out), 2);
   bson_free (out);
   assert_int_equal (run_make_user ("carol", "caf\xc3\xa9\n", &out), 2);
   bson_free (out);
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_rfc7677_conversation),
      cmocka_unit_test (test_sha1_mongo_conversation),
      cmocka_unit_test (test_derive_key),
      cmocka_unit_test (test_wrong_password),
      cmocka_unit_test (test_tampered_proof),
      cmocka_unit_test (test_bad_client_first),
      cmocka_unit_test (test_bad_client_final),
      cmocka_unit_test (test_order_and_mechanism),
      cmocka_unit_test (test_escaped_user),
      cmocka_unit_test (test_random_nonce),
      cmocka_unit_test (test_saslprep),
      cmocka_unit_test (test_client_matches_rfc),
      cmocka_unit_test (test_make_user),
      cmocka_unit_test (test_make_user_command),
   };
   return cmocka_run_group_tests (tests, NULL, NULL);
}
