/*
 * test_scram.c - both sides of SCRAM-SHA-256 and SCRAM-SHA-1.  The server:
 * the published example conversations byte for byte, refused proofs,
 * nonces and malformed messages from tables, SASLprep, key derivation,
 * and the entries of scram_make_user and `relaybus-proxy --make-user`
 * verified by a client written here.  The client (scram_client_*): the
 * same examples byte for byte, round trips against the server, hostile
 * server messages from tables, steps out of order, and the salt cache.
 *
 * The vectors do not come from this implementation:
 * - SCRAM-SHA-256: RFC 7677 section 3 (user "user", password "pencil"),
 *   also in the MongoDB driver authentication specification;
 * - SCRAM-SHA-1 with mongod's password digest: the specification's
 *   example (client nonce fyko+d2lbbFgONRv9qkxdawL, i=10000);
 * - the StoredKey and ServerKey of both were computed with Python's
 *   hashlib (pbkdf2_hmac, then hmac "Client Key" hashed and hmac
 *   "Server Key"; SCRAM-SHA-1 on hashlib.md5(b"user:mongo:pencil").hexdigest());
 * - SCRAM-SHA-1 per RFC 5802 section 5 (client nonce fyko+d2lbbFgONRv9qkxdawL,
 *   salt QSXCR+Q6sek8bf92, i=4096) with mongod's password digest in place
 *   of "pencil": see RFC5802_MONGO_* below for how it was computed.
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

/* RFC 5802 section 5's SCRAM-SHA-1 example, as MongoDB runs it: the same
 * messages up to server-first, but PBKDF2 takes the hex MD5 of
 * "user:mongo:pencil" (1c33006ec1ffd90f9cadcbcc0e118200), not "pencil", so
 * the proof, the signature and the keys differ from the RFC's.  Computed
 * with /usr/bin/python3's hashlib and hmac:
 *   pw = hashlib.md5(b"user:mongo:pencil").hexdigest().encode()
 *   salted = hashlib.pbkdf2_hmac("sha1", pw, b64decode("QSXCR+Q6sek8bf92"), 4096)
 *   ck = hmac(salted, "Client Key"); sk = sha1(ck); srv = hmac(salted, "Server Key")
 *   am = "n=user,r=fyko+d2lbbFgONRv9qkxdawL" "," server-first "," "c=biws,r=" nonce
 *   p = b64(ck XOR hmac(sk, am)); v = b64(hmac(srv, am))
 * (the same script gives the RFC's own p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts= and
 * v=rmF9pqV8S7suAoZWja4dJRkFsKQ= with "pencil" itself, and RFC 7677's
 * values.)  The entry line is StoredKey and ServerKey in base64. */
#define RFC5802_MONGO_ENTRY \
   "user:SCRAM-SHA-1:4096:QSXCR+Q6sek8bf92:TQJLWkI33z/g0P3zZnPYaYZ4NnI=:WpPcyHmWMNP5GjSK3hZhQYmp31E=\n"
#define RFC5802_CLIENT_NONCE "fyko+d2lbbFgONRv9qkxdawL"
#define RFC5802_CLIENT_FIRST "n,,n=user,r=" RFC5802_CLIENT_NONCE
#define RFC5802_SERVER_NONCE "3rfcNHYJY1ZVvWVs7j"
#define RFC5802_SERVER_FIRST "r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096"
#define RFC5802_MONGO_CLIENT_FINAL "c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=JDntyRhQfJWIGDV27H0LEifJQLE="
#define RFC5802_MONGO_SERVER_FINAL "v=kDkyBj41ObwwX3x4AfqHbtVnO/4="

/* SaltedPassword of the examples (hashlib.pbkdf2_hmac, hex), for the salt
 * cache's checks. */
#define RFC7677_SALTED "c4a49510323ab4f952cac1fa99441939e78ea74d6be81ddf7096e87513dc615d"
#define RFC5802_MONGO_SALTED "28d99d0aa85f6d84c85076d14dc9795ef1b54405"

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

/* A table row's message was refused (`out` is NULL) with its code and words. */
static void
check_refused (const bad_t *row, const void *out, const bson_error_t *error)
{
   if (out)
      fail_msg ("accepted: '%s'", row->msg);
   if (error->domain != SCRAM_ERROR_DOMAIN || (int) error->code != row->code || !strstr (error->message, row->words))
      fail_msg ("'%s': got %u '%s', expected %d '%s'", row->msg, error->code, error->message, row->code, row->words);
}

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
      check_refused (&table[i], out, &error);
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
      check_refused (&table[i], out, &error);
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
      /* RFC 4013 section 3, its seven examples. */
      {"I\xc2\xadX", "IX", NULL},                         /* SOFT HYPHEN mapped to nothing */
      {"user", "user", NULL},                             /* no transformation */
      {"USER", "USER", NULL},                             /* case preserved, will not match #2 */
      {"\xc2\xaa", "a", NULL},                            /* output is NFKC, input in ISO 8859-1 */
      {"\xe2\x85\xa8", "IX", NULL},                        /* output is NFKC, will match #1 */
      {"\x07", NULL, "prohibited character"},             /* Error - prohibited character */
      {"\xd8\xa7" "1", NULL, "Malformed bidirectional string"}, /* Error - bidirectional check */
      /* ASCII rules. */
      {"pass word", "pass word", NULL}, /* ASCII space is allowed */
      {"tab\there", NULL, "prohibited character"},
      {"del\x7f", NULL, "prohibited character"},
      {"", NULL, "empty"},
      /* Beyond ASCII: a non-ASCII space maps to ' ', other letters stay. */
      {"a\xc2\xa0" "b", "a b", NULL},
      {"p\xc3\xa4ss", "p\xc3\xa4ss", NULL},
      {"\xc2\xad", NULL, "empty once prepared"},         /* only what maps to nothing */
      {"\xf3\xa0\x80\x81x", NULL, "Prohibited code points"}, /* a tagging character (C.9) */
      {"p\xff\xfe", NULL, "SASLprep:"},                   /* not UTF-8 */
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
   /* scram_derive_key preps a SCRAM-SHA-256 password: RFC 4013's #1 and
    * #5 derive the keys of "IX"; one SASLprep refuses is refused.
    * SCRAM-SHA-1 (never SASLprepped) takes the bytes as they are. */
   {
      authfile_key_t key, ix, ix2;
      bson_error_t error;
      const uint8_t salt[4] = {1, 2, 3, 4};
      assert_true (scram_derive_key (AUTHFILE_SCRAM_SHA_256, "u", "IX", salt, 4, 4096, &ix, &error));
      assert_true (scram_derive_key (AUTHFILE_SCRAM_SHA_256, "u", "I\xc2\xadX", salt, 4, 4096, &key, &error));
      assert_memory_equal (&key, &ix, sizeof key);
      assert_true (scram_derive_key (AUTHFILE_SCRAM_SHA_256, "u", "\xe2\x85\xa8", salt, 4, 4096, &ix2, &error));
      assert_memory_equal (&ix2, &ix, sizeof ix);
      assert_false (scram_derive_key (AUTHFILE_SCRAM_SHA_256, "u", "\xd8\xa7" "1", salt, 4, 4096, &key, &error));
      assert_int_equal (error.code, SCRAM_ERR_SASLPREP);
      assert_true (scram_derive_key (AUTHFILE_SCRAM_SHA_1, "u", "I\xc2\xadX", salt, 4, 4096, &key, &error));
      assert_true (scram_derive_key (AUTHFILE_SCRAM_SHA_1, "u", "IX", salt, 4, 4096, &ix, &error));
      assert_memory_not_equal (&key, &ix, sizeof key);
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
   /* Beyond ASCII: the SCRAM-SHA-256 entry is derived from the SASLprep
    * of the password; one SASLprep refuses is refused. */
   assert_true (scram_make_user ("bob", "caf\xc3\xa9", &user, &error));
   text = authfile_format_user (&user);
   check_made_entry (text, "bob", "caf\xc3\xa9");
   bson_free (text);
   assert_false (scram_make_user ("bob", "\xd8\xa7" "1", &user, &error));
   assert_non_null (strstr (error.message, "bidirectional"));
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
   assert_int_equal (run_make_user ("carol", "caf\xc3\xa9\n", &out), 0);
   check_made_entry (out, "carol", "caf\xc3\xa9");
   bson_free (out);
   assert_int_equal (run_make_user ("carol", "\xd8\xa7" "1\n", &out), 2);
   bson_free (out);
}

/* ---- the client side: scram_client_* ---- */

/* A client conversation with a fixed nonce (or a random one if NULL). */
static scram_client_t *
client_of (authfile_mech_t mech, const char *user, const char *password, const char *nonce)
{
   bson_error_t error;
   scram_client_t *conv = scram_client_new (mech, user, password, &error);

   if (!conv)
      fail_msg ("scram_client_new refused: %s", error.message);
   if (nonce && !scram_client_set_nonce (conv, nonce, &error))
      fail_msg ("scram_client_set_nonce refused: %s", error.message);
   assert_int_equal (scram_client_state (conv), SCRAM_STATE_NEW);
   assert_int_equal (scram_client_mech (conv), mech);
   return conv;
}

/* client-first, which must succeed. */
static char *
cfirst (scram_client_t *conv)
{
   bson_error_t error;
   char *out = NULL;
   size_t out_len = 0;

   if (!scram_client_first (conv, &out, &out_len, &error))
      fail_msg ("scram_client_first refused: %s", error.message);
   assert_int_equal (out_len, strlen (out));
   assert_int_equal (scram_client_state (conv), SCRAM_STATE_FIRST_SENT);
   return out;
}

/* server-first msg[0..len) -> client-final (caller frees), or NULL. */
static char *
cfinal_n (scram_client_t *conv, const char *msg, size_t len, scram_salt_cache_t *cache, bson_error_t *error)
{
   char *out = NULL;
   size_t out_len = 0;

   if (!scram_client_final (conv, (const uint8_t *) msg, len, cache, &out, &out_len, error)) {
      assert_null (out);
      assert_int_equal (error->domain, SCRAM_ERROR_DOMAIN);
      assert_int_equal (scram_client_state (conv), SCRAM_STATE_FAILED);
      return NULL;
   }
   assert_int_equal (out_len, strlen (out));
   assert_int_equal (scram_client_state (conv), SCRAM_STATE_FINAL_SENT);
   return out;
}

static char *
cfinal (scram_client_t *conv, const char *msg, scram_salt_cache_t *cache, bson_error_t *error)
{
   return cfinal_n (conv, msg, strlen (msg), cache, error);
}

static bool
cverify (scram_client_t *conv, const char *msg, bson_error_t *error)
{
   bool ok = scram_client_verify (conv, (const uint8_t *) msg, strlen (msg), error);

   assert_true (ok == scram_client_done (conv));
   assert_int_equal (scram_client_state (conv), ok ? SCRAM_STATE_DONE : SCRAM_STATE_FAILED);
   if (!ok)
      assert_int_equal (error->domain, SCRAM_ERROR_DOMAIN);
   return ok;
}

static void
hex_to_bytes (const char *hex, uint8_t *out)
{
   for (size_t i = 0; hex[2 * i]; i++)
      assert_int_equal (sscanf (hex + 2 * i, "%2hhx", &out[i]), 1);
}

/* The published conversations, the client's half byte for byte; then the
 * codec's own server, given the example's entry and server nonce, answers
 * the client with the same server-first and server-final. */
typedef struct {
   const char *name;
   authfile_mech_t mech;
   const char *entry, *client_nonce, *server_nonce;
   const char *client_first, *server_first, *client_final, *server_final;
} vector_t;

static const vector_t vectors[] = {
   {"RFC 7677", AUTHFILE_SCRAM_SHA_256, RFC7677_ENTRY, "rOprNGfwEbeRWgbNEkqO", RFC7677_SERVER_NONCE,
    RFC7677_CLIENT_FIRST, RFC7677_SERVER_FIRST, RFC7677_CLIENT_FINAL, RFC7677_SERVER_FINAL},
   {"RFC 5802, mongod's digest", AUTHFILE_SCRAM_SHA_1, RFC5802_MONGO_ENTRY, RFC5802_CLIENT_NONCE,
    RFC5802_SERVER_NONCE, RFC5802_CLIENT_FIRST, RFC5802_SERVER_FIRST, RFC5802_MONGO_CLIENT_FINAL,
    RFC5802_MONGO_SERVER_FINAL},
   {"MongoDB specification, SCRAM-SHA-1", AUTHFILE_SCRAM_SHA_1, SHA1_ENTRY, "fyko+d2lbbFgONRv9qkxdawL",
    SHA1_SERVER_NONCE, SHA1_CLIENT_FIRST, SHA1_SERVER_FIRST, SHA1_CLIENT_FINAL, SHA1_SERVER_FINAL},
};

static void
test_client_vectors (void **state)
{
   (void) state;
   for (size_t i = 0; i < sizeof vectors / sizeof vectors[0]; i++) {
      const vector_t *v = &vectors[i];
      bson_error_t error;
      scram_client_t *conv = client_of (v->mech, "user", "pencil", v->client_nonce);
      char *cf = cfirst (conv), *fin, *sfin;

      assert_string_equal (cf, v->client_first);
      fin = cfinal (conv, v->server_first, NULL, &error);
      if (!fin)
         fail_msg ("%s: server-first refused: %s", v->name, error.message);
      if (strcmp (fin, v->client_final) != 0)
         fail_msg ("%s: client-final\n   %s\nexpected\n   %s", v->name, fin, v->client_final);
      if (!cverify (conv, v->server_final, &error))
         fail_msg ("%s: server-final refused: %s", v->name, error.message);

      /* The server side agrees on every message. */
      authfile_t *af = users_of (v->entry);
      scram_server_t *srv = started (af, v->mech, cf, v->server_nonce, v->server_first);
      sfin = final (srv, fin, &error);
      if (!sfin)
         fail_msg ("%s: the server refused the client's final: %s", v->name, error.message);
      assert_string_equal (sfin, v->server_final);

      bson_free (sfin);
      scram_server_destroy (srv);
      authfile_destroy (af);
      bson_free (fin);
      bson_free (cf);
      scram_client_destroy (conv);
   }
}

/* One conversation of the client against the codec's server, with random
 * nonces on both sides.  `tamper` changes one character of server-final
 * on its way to the client.  Returns how far it got: 0 the server
 * refused the proof, 1 the client refused server-final, 2 both done. */
static int
round_trip (const authfile_t *af, authfile_mech_t mech, const char *user, const char *password,
            scram_salt_cache_t *cache, bool tamper, bson_error_t *error)
{
   scram_client_t *conv = client_of (mech, user, password, NULL);
   scram_server_t *srv = scram_server_new (mech);
   char *cf = cfirst (conv), *sf, *fin, *sfin = NULL;
   int reached = 0;

   /* n= carries the name escaped; the random nonce is 32 base64 characters. */
   assert_int_equal (strncmp (cf, "n,,n=", 5), 0);
   assert_int_equal (strlen (strstr (cf, ",r=") + 3), 32);
   sf = first (srv, af, cf, error);
   if (!sf)
      fail_msg ("the server refused client-first '%s': %s", cf, error->message);
   assert_string_equal (scram_server_user (srv), user);
   fin = cfinal (conv, sf, cache, error);
   if (!fin)
      fail_msg ("the client refused server-first '%s': %s", sf, error->message);
   sfin = final (srv, fin, error);
   if (!sfin) {
      assert_int_equal (scram_server_state (srv), SCRAM_STATE_FAILED);
      goto done;
   }
   reached = 1;
   assert_int_equal (scram_server_state (srv), SCRAM_STATE_DONE);
   if (tamper) {
      char *c = sfin + 2 + 5;
      *c = *c == 'A' ? 'B' : 'A';
   }
   if (cverify (conv, sfin, error))
      reached = 2;

done:
   bson_free (sfin);
   bson_free (fin);
   bson_free (sf);
   bson_free (cf);
   scram_server_destroy (srv);
   scram_client_destroy (conv);
   return reached;
}

static void
test_client_round_trip (void **state)
{
   (void) state;
   static const char *const names[] = {"alice", "a,b=c", "=2C,,==", "app:reports"};

   for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
      authfile_user_t user;
      bson_error_t error;
      char *text;

      assert_true (scram_make_user (names[i], "s3cret pass", &user, &error));
      text = authfile_format_user (&user);
      authfile_t *af = users_of (text);
      for (int m = 0; m < AUTHFILE_N_MECHS; m++) {
         scram_salt_cache_t cache = {0};
         /* Right password: both sides done; twice, the second from the cache. */
         assert_int_equal (round_trip (af, (authfile_mech_t) m, names[i], "s3cret pass", &cache, false, &error), 2);
         assert_true (cache.valid);
         assert_int_equal (round_trip (af, (authfile_mech_t) m, names[i], "s3cret pass", &cache, false, &error), 2);
         assert_int_equal (round_trip (af, (authfile_mech_t) m, names[i], "s3cret pass", NULL, false, &error), 2);
         /* Wrong password: the server refuses the proof. */
         assert_int_equal (round_trip (af, (authfile_mech_t) m, names[i], "s3cret pasS", NULL, false, &error), 0);
         assert_int_equal (error.code, SCRAM_ERR_AUTH_FAILED);
         assert_non_null (strstr (error.message, "wrong proof"));
         /* A server-final changed on the way: the client refuses it. */
         assert_int_equal (round_trip (af, (authfile_mech_t) m, names[i], "s3cret pass", NULL, true, &error), 1);
         assert_int_equal (error.code, SCRAM_ERR_AUTH_FAILED);
         assert_non_null (strstr (error.message, "wrong server signature"));
         scram_salt_cache_clear (&cache);
      }
      authfile_destroy (af);
      bson_free (text);
   }
   /* SCRAM-SHA-256 with a password beyond ASCII: the entry is derived from
    * its SASLprep, and a client that sends the same password, or another
    * spelling of it SASLprep maps to the same ("\u2168" for "IX"), logs in. */
   {
      authfile_user_t user;
      bson_error_t error;
      const uint8_t salt[16] = {16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1};
      char *text;

      memset (&user, 0, sizeof user);
      strcpy (user.name, "b\xc3\xa9" "a");
      assert_true (scram_derive_key (AUTHFILE_SCRAM_SHA_256, user.name, "p\xc3\xa4ss\xc2\xa0\xe2\x85\xa8", salt,
                                     sizeof salt, 4096, &user.keys[AUTHFILE_SCRAM_SHA_256], &error));
      text = authfile_format_user (&user);
      authfile_t *af = users_of (text);
      assert_int_equal (round_trip (af, AUTHFILE_SCRAM_SHA_256, user.name, "p\xc3\xa4ss\xc2\xa0\xe2\x85\xa8", NULL, false,
                                    &error), 2);
      assert_int_equal (round_trip (af, AUTHFILE_SCRAM_SHA_256, user.name, "p\xc3\xa4ss IX", NULL, false, &error), 2);
      assert_int_equal (round_trip (af, AUTHFILE_SCRAM_SHA_256, user.name, "pass IX", NULL, false, &error), 0);
      assert_int_equal (error.code, SCRAM_ERR_AUTH_FAILED);
      authfile_destroy (af);
      bson_free (text);
   }
   /* SCRAM-SHA-1 is never SASLprepped: a non-ASCII password works. */
   {
      authfile_user_t user;
      bson_error_t error;
      const uint8_t salt[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
      char *text;

      memset (&user, 0, sizeof user);
      strcpy (user.name, "bob");
      assert_true (scram_derive_key (AUTHFILE_SCRAM_SHA_1, "bob", "p\xc3\xa4ss", salt, sizeof salt, 4096,
                                     &user.keys[AUTHFILE_SCRAM_SHA_1], &error));
      text = authfile_format_user (&user);
      authfile_t *af = users_of (text);
      assert_int_equal (round_trip (af, AUTHFILE_SCRAM_SHA_1, "bob", "p\xc3\xa4ss", NULL, false, &error), 2);
      authfile_destroy (af);
      bson_free (text);
   }
}

/* What scram_client_new refuses. */
static void
test_client_new_refusals (void **state)
{
   (void) state;
   char long_name[AUTHFILE_MAX_NAME + 2], long_password[AUTHFILE_MAX_PASSWORD + 2];
   memset (long_name, 'u', sizeof long_name - 1);
   long_name[sizeof long_name - 1] = '\0';
   memset (long_password, 'p', sizeof long_password - 1);
   long_password[sizeof long_password - 1] = '\0';
   const struct {
      authfile_mech_t mech;
      const char *user, *password;
      int code;
      const char *words;
   } table[] = {
      {AUTHFILE_SCRAM_SHA_256, "", "pencil", SCRAM_ERR_MALFORMED, "user name must be 1 to 256 bytes"},
      {AUTHFILE_SCRAM_SHA_256, long_name, "pencil", SCRAM_ERR_MALFORMED, "user name must be 1 to 256 bytes"},
      {AUTHFILE_SCRAM_SHA_1, "us\xff" "er", "pencil", SCRAM_ERR_MALFORMED, "UTF-8"},
      {AUTHFILE_SCRAM_SHA_256, "user", "", SCRAM_ERR_MALFORMED, "password must be 1 to 1024 bytes"},
      {AUTHFILE_SCRAM_SHA_1, "user", "", SCRAM_ERR_MALFORMED, "password must be 1 to 1024 bytes"},
      {AUTHFILE_SCRAM_SHA_1, "user", long_password, SCRAM_ERR_MALFORMED, "password must be 1 to 1024 bytes"},
      {AUTHFILE_SCRAM_SHA_256, "user", "\xd8\xa7" "1", SCRAM_ERR_SASLPREP, "bidirectional"},
      {AUTHFILE_SCRAM_SHA_256, "user", "tab\tbed", SCRAM_ERR_SASLPREP, "prohibited character"},
      {(authfile_mech_t) 7, "user", "pencil", SCRAM_ERR_MALFORMED, "unknown SCRAM mechanism"},
   };

   for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
      bson_error_t error;
      scram_client_t *conv = scram_client_new (table[i].mech, table[i].user, table[i].password, &error);
      if (conv)
         fail_msg ("row %zu accepted", i);
      if (error.domain != SCRAM_ERROR_DOMAIN || (int) error.code != table[i].code ||
          !strstr (error.message, table[i].words))
         fail_msg ("row %zu: got %u '%s', expected %d '%s'", i, error.code, error.message, table[i].code,
                   table[i].words);
   }
   /* The longest name and password are taken; the name is escaped. */
   long_name[AUTHFILE_MAX_NAME] = '\0';
   long_password[AUTHFILE_MAX_PASSWORD] = '\0';
   scram_client_t *conv = client_of (AUTHFILE_SCRAM_SHA_256, long_name, long_password, "abc");
   scram_client_destroy (conv);
   conv = client_of (AUTHFILE_SCRAM_SHA_1, "a,b=c", "pencil", "abc");
   char *cf = cfirst (conv);
   assert_string_equal (cf, "n,,n=a=2Cb=3Dc,r=abc");
   bson_free (cf);
   scram_client_destroy (conv);
}

/* Hostile or broken server-first messages, after the RFC 7677 client-first. */
static void
test_client_bad_server_first (void **state)
{
   (void) state;
#define SALT ",s=W22ZaJ0SNY7soEsUEjb6gQ=="
#define NONCE "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
   /* Salts of 65 and 66 bytes ('A's) still fit the 88 characters of 64
    * bytes in base64; 67 do not. */
#define SALT65 ",s=" "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE="
#define SALT66 ",s=" "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFB"
#define SALT67 ",s=" "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQQ=="
   static const bad_t table[] = {
      /* the nonce */
      {"r=XOprNGfwEbeRWgbNEkqO%hvYD" SALT ",i=4096", SCRAM_ERR_MALFORMED, "does not start with the client nonce"},
      {"r=rOprNGfwEbeRWgbNEkq" SALT ",i=4096", SCRAM_ERR_MALFORMED, "does not start with the client nonce"},
      {"r=rOprNGfwEbeRWgbNEkqO" SALT ",i=4096", SCRAM_ERR_MALFORMED, "no server part"},
      {"r=" SALT ",i=4096", SCRAM_ERR_MALFORMED, "does not start with the client nonce"},
      {"r=rOprNGfwEbeRWgbNEkqO%h v" SALT ",i=4096", SCRAM_ERR_MALFORMED, "not printable"},
      {"r=rOprNGfwEbeRWgbNEkqO%h\x01v" SALT ",i=4096", SCRAM_ERR_MALFORMED, "not printable"},
      {"r=rOprNGfwEbeRWgbNEkqO\xc3\xa9" SALT ",i=4096", SCRAM_ERR_MALFORMED, "not printable"},
      /* the iteration count */
      {NONCE SALT ",i=0", SCRAM_ERR_MALFORMED, "iteration count 0 is below the minimum of 4096"},
      {NONCE SALT ",i=1", SCRAM_ERR_MALFORMED, "iteration count 1 is below the minimum of 4096"},
      {NONCE SALT ",i=4095", SCRAM_ERR_MALFORMED, "iteration count 4095 is below the minimum of 4096"},
      {NONCE SALT ",i=10000001", SCRAM_ERR_MALFORMED, "above the maximum of 10000000"},
      {NONCE SALT ",i=4294967296", SCRAM_ERR_MALFORMED, "above the maximum"},
      {NONCE SALT ",i=99999999999999999999999999999999", SCRAM_ERR_MALFORMED, "above the maximum"},
      {NONCE SALT ",i=04096", SCRAM_ERR_MALFORMED, "not a decimal number"},
      {NONCE SALT ",i=-4096", SCRAM_ERR_MALFORMED, "not a decimal number"},
      {NONCE SALT ",i=+4096", SCRAM_ERR_MALFORMED, "not a decimal number"},
      {NONCE SALT ",i=4096x", SCRAM_ERR_MALFORMED, "not a decimal number"},
      {NONCE SALT ",i= 4096", SCRAM_ERR_MALFORMED, "not a decimal number"},
      {NONCE SALT ",i=", SCRAM_ERR_MALFORMED, "not a decimal number"},
      /* the salt */
      {NONCE ",s=,i=4096", SCRAM_ERR_MALFORMED, "salt (s=) is empty"},
      {NONCE ",s=!!!!,i=4096", SCRAM_ERR_MALFORMED, "salt (s=) is not valid base64"},
      {NONCE ",s=W22ZaJ0SNY7soEsUEjb6gQ=,i=4096", SCRAM_ERR_MALFORMED, "salt (s=) is not valid base64"},
      {NONCE ",s=W22ZaJ0SNY7soEsUEjb6gQ,i=4096", SCRAM_ERR_MALFORMED, "salt (s=) is not valid base64"},
      {NONCE ",s=W22Z aJ0SNY7soEsUEjb6gQ=,i=4096", SCRAM_ERR_MALFORMED, "salt (s=) is not valid base64"},
      {NONCE ",s====,i=4096", SCRAM_ERR_MALFORMED, "salt (s=)"},
      {NONCE SALT65 ",i=4096", SCRAM_ERR_MALFORMED, "salt (s=) must decode to 1 to 64 bytes"},
      {NONCE SALT66 ",i=4096", SCRAM_ERR_MALFORMED, "salt (s=) must decode to 1 to 64 bytes"},
      {NONCE SALT67 ",i=4096", SCRAM_ERR_MALFORMED, "salt (s=) is longer than 64 bytes"},
      /* missing fields, order, extensions */
      {"", SCRAM_ERR_MALFORMED, "is empty"},
      {SALT + 1, SCRAM_ERR_MALFORMED, "must start with the nonce (r=)"},
      {NONCE, SCRAM_ERR_MALFORMED, "no salt (s=)"},
      {NONCE ",i=4096", SCRAM_ERR_MALFORMED, "no salt (s=)"},
      {NONCE ",i=4096" SALT, SCRAM_ERR_MALFORMED, "no salt (s=)"},
      {NONCE SALT, SCRAM_ERR_MALFORMED, "no iteration count (i=)"},
      {NONCE SALT ",x=1", SCRAM_ERR_MALFORMED, "no iteration count (i=)"},
      {"i=4096," NONCE SALT, SCRAM_ERR_MALFORMED, "must start with the nonce (r=)"},
      {"m=ext," NONCE SALT ",i=4096", SCRAM_ERR_MALFORMED, "mandatory extension (m=) is not supported"},
      {NONCE SALT ",i=4096,", SCRAM_ERR_MALFORMED, "ends with ','"},
      {NONCE SALT ",i=4096,1=x", SCRAM_ERR_MALFORMED, "malformed attribute after i="},
      {NONCE SALT ",i=4096,x", SCRAM_ERR_MALFORMED, "malformed attribute after i="},
      {NONCE SALT ",i=4096,x=1,", SCRAM_ERR_MALFORMED, "malformed attribute after i="},
      {"e=other-error", SCRAM_ERR_MALFORMED, "must start with the nonce (r=)"},
      {NONCE SALT ",i=4096\xff", SCRAM_ERR_MALFORMED, "not valid UTF-8"},
   };

   for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
      bson_error_t error;
      scram_client_t *conv = client_of (AUTHFILE_SCRAM_SHA_256, "user", "pencil", "rOprNGfwEbeRWgbNEkqO");
      char *cf = cfirst (conv);
      char *out = cfinal (conv, table[i].msg, NULL, &error);
      check_refused (&table[i], out, &error);
      /* Failed for good: server-final is refused too. */
      assert_false (scram_client_verify (conv, (const uint8_t *) RFC7677_SERVER_FINAL,
                                         strlen (RFC7677_SERVER_FINAL), &error));
      assert_int_equal (error.code, SCRAM_ERR_STATE);
      bson_free (cf);
      scram_client_destroy (conv);
   }

   /* Messages built to a length. */
   {
      bson_error_t error;
      scram_client_t *conv = client_of (AUTHFILE_SCRAM_SHA_256, "user", "pencil", "rOprNGfwEbeRWgbNEkqO");
      char *cf = cfirst (conv);
      char *big = bson_malloc0 (SCRAM_MAX_MESSAGE + 2);

      /* One byte over the bound. */
      memset (big, 'a', SCRAM_MAX_MESSAGE + 1);
      memcpy (big, NONCE, strlen (NONCE));
      assert_null (cfinal_n (conv, big, SCRAM_MAX_MESSAGE + 1, NULL, &error));
      assert_int_equal (error.code, SCRAM_ERR_TOO_LARGE);
      assert_non_null (strstr (error.message, "longer than 4096 bytes"));
      scram_client_destroy (conv);
      bson_free (cf);

      /* Within the bound, but a nonce that would push client-final past it. */
      conv = client_of (AUTHFILE_SCRAM_SHA_256, "user", "pencil", "rOprNGfwEbeRWgbNEkqO");
      cf = cfirst (conv);
      memset (big, 0, SCRAM_MAX_MESSAGE + 2);
      memset (big, 'x', SCRAM_MAX_MESSAGE - strlen (SALT ",i=4096"));
      memcpy (big, "r=rOprNGfwEbeRWgbNEkqO", 22);
      strcat (big, SALT ",i=4096");
      assert_int_equal (strlen (big), SCRAM_MAX_MESSAGE);
      assert_null (cfinal (conv, big, NULL, &error));
      assert_int_equal (error.code, SCRAM_ERR_TOO_LARGE);
      assert_non_null (strstr (error.message, "nonce (r=) is longer than"));
      scram_client_destroy (conv);
      bson_free (cf);

      /* A NUL byte inside the given length. */
      conv = client_of (AUTHFILE_SCRAM_SHA_256, "user", "pencil", "rOprNGfwEbeRWgbNEkqO");
      cf = cfirst (conv);
      assert_null (cfinal_n (conv, NONCE "\0" SALT ",i=4096", strlen (NONCE SALT ",i=4096") + 1, NULL, &error));
      assert_non_null (strstr (error.message, "NUL"));
      scram_client_destroy (conv);
      bson_free (cf);

      /* The RFC's server-first exactly as long as its bytes (as a BSON
       * binary payload arrives): nothing may read past it. */
      conv = client_of (AUTHFILE_SCRAM_SHA_256, "user", "pencil", "rOprNGfwEbeRWgbNEkqO");
      cf = cfirst (conv);
      size_t len = strlen (RFC7677_SERVER_FIRST);
      char *exact = bson_malloc (len), *fin;
      memcpy (exact, RFC7677_SERVER_FIRST, len);
      fin = cfinal_n (conv, exact, len, NULL, &error);
      assert_non_null (fin);
      assert_string_equal (fin, RFC7677_CLIENT_FINAL);
      bson_free (fin);
      bson_free (exact);
      scram_client_destroy (conv);
      bson_free (cf);
      bson_free (big);
   }

   /* What the grammar allows: extensions after i= (part of AuthMessage, so
    * the proof differs from the RFC's), the longest salt, the largest
    * count (reached through a cache that holds it: PBKDF2 at 10,000,000
    * iterations would take a second, a minute under valgrind). */
   {
      static const char *const good[] = {
         NONCE SALT ",i=4096,x=1",
         NONCE SALT ",i=4096,x=1,y=",
         NONCE ",s=QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQQ==,i=4096",
         NONCE ",s=AA==,i=10000000",
      };
      for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
         bson_error_t error;
         scram_salt_cache_t cache = {.valid = true,
                                     .mech = AUTHFILE_SCRAM_SHA_256,
                                     .iterations = AUTHFILE_MAX_ITERATIONS,
                                     .salt_len = 1};
         scram_client_t *conv = client_of (AUTHFILE_SCRAM_SHA_256, "user", "pencil", "rOprNGfwEbeRWgbNEkqO");
         char *cf = cfirst (conv), *fin = cfinal (conv, good[i], &cache, &error);
         if (!fin)
            fail_msg ("refused: '%s': %s", good[i], error.message);
         assert_int_equal (strncmp (fin, "c=biws," NONCE ",p=", strlen ("c=biws," NONCE ",p=")), 0);
         assert_string_not_equal (fin, RFC7677_CLIENT_FINAL);
         bson_free (fin);
         bson_free (cf);
         scram_client_destroy (conv);
      }
   }
#undef SALT
#undef SALT65
#undef SALT66
#undef SALT67
#undef NONCE
}

/* Broken, hostile or refusing server-final messages, after the RFC 7677
 * exchange up to client-final. */
static void
test_client_bad_server_final (void **state)
{
   (void) state;
   static const bad_t table[] = {
      {"e=invalid-proof", SCRAM_ERR_AUTH_FAILED, "the server refused the authentication: e=invalid-proof"},
      {"e=other-error,x=1", SCRAM_ERR_AUTH_FAILED, "the server refused the authentication: e=other-error"},
      {"e=forged\nline", SCRAM_ERR_AUTH_FAILED, "e=forged line"},
      {"e=", SCRAM_ERR_AUTH_FAILED, "the server refused the authentication: e="},
      {"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl96G4=", SCRAM_ERR_AUTH_FAILED, "wrong server signature"},
      {"v=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=", SCRAM_ERR_AUTH_FAILED, "wrong server signature"},
      {"v=6rriTRBi23WpRR/wtup+mMhUZUn", SCRAM_ERR_MALFORMED, "not base64 of a SCRAM-SHA-256 digest"},
      {"v=UMWeI25JD1yNYZRMpZ4VHvhZ9e0=", SCRAM_ERR_MALFORMED, "not base64 of a SCRAM-SHA-256 digest"},
      {"v=", SCRAM_ERR_MALFORMED, "not base64 of a SCRAM-SHA-256 digest"},
      {"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=,", SCRAM_ERR_MALFORMED, "malformed attribute after v="},
      {"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=,1=2", SCRAM_ERR_MALFORMED, "malformed attribute after v="},
      {"x=1", SCRAM_ERR_MALFORMED, "must start with v= or e="},
      {RFC7677_SERVER_FIRST, SCRAM_ERR_MALFORMED, "must start with v= or e="},
      {"", SCRAM_ERR_MALFORMED, "is empty"},
      {"v=6rriTRBi23WpRR\xc0\xaf", SCRAM_ERR_MALFORMED, "not valid UTF-8"},
   };

   for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
      bson_error_t error;
      scram_client_t *conv = client_of (AUTHFILE_SCRAM_SHA_256, "user", "pencil", "rOprNGfwEbeRWgbNEkqO");
      char *cf = cfirst (conv), *fin = cfinal (conv, RFC7677_SERVER_FIRST, NULL, &error);

      assert_string_equal (fin, RFC7677_CLIENT_FINAL);
      check_refused (&table[i], cverify (conv, table[i].msg, &error) ? "" : NULL, &error);
      /* Once refused, even the right server-final is. */
      assert_false (cverify (conv, RFC7677_SERVER_FINAL, &error));
      assert_int_equal (error.code, SCRAM_ERR_STATE);
      bson_free (fin);
      bson_free (cf);
      scram_client_destroy (conv);
   }
   /* Too long, and an extension after the right signature (accepted). */
   {
      bson_error_t error;
      scram_client_t *conv = client_of (AUTHFILE_SCRAM_SHA_256, "user", "pencil", "rOprNGfwEbeRWgbNEkqO");
      char *cf = cfirst (conv), *fin = cfinal (conv, RFC7677_SERVER_FIRST, NULL, &error);
      char *big = bson_malloc0 (SCRAM_MAX_MESSAGE + 2);

      memset (big, 'a', SCRAM_MAX_MESSAGE + 1);
      memcpy (big, RFC7677_SERVER_FINAL ",x=", strlen (RFC7677_SERVER_FINAL ",x="));
      assert_false (scram_client_verify (conv, (const uint8_t *) big, SCRAM_MAX_MESSAGE + 1, &error));
      assert_int_equal (error.code, SCRAM_ERR_TOO_LARGE);
      bson_free (big);
      bson_free (fin);
      bson_free (cf);
      scram_client_destroy (conv);

      conv = client_of (AUTHFILE_SCRAM_SHA_256, "user", "pencil", "rOprNGfwEbeRWgbNEkqO");
      cf = cfirst (conv);
      fin = cfinal (conv, RFC7677_SERVER_FIRST, NULL, &error);
      if (!cverify (conv, RFC7677_SERVER_FINAL ",x=1", &error))
         fail_msg ("refused: %s", error.message);
      bson_free (fin);
      bson_free (cf);
      scram_client_destroy (conv);
   }
}

/* Steps out of order, and after the end. */
static void
test_client_order (void **state)
{
   (void) state;
   bson_error_t error;
   scram_client_t *conv;
   char *cf, *fin, *out = NULL;
   size_t out_len = 0;

   /* server-first before client-first. */
   conv = client_of (AUTHFILE_SCRAM_SHA_256, "user", "pencil", "rOprNGfwEbeRWgbNEkqO");
   assert_null (cfinal (conv, RFC7677_SERVER_FIRST, NULL, &error));
   assert_int_equal (error.code, SCRAM_ERR_STATE);
   assert_non_null (strstr (error.message, "server-first message is not expected in state new"));
   assert_false (scram_client_first (conv, &out, &out_len, &error));
   assert_null (out);
   assert_int_equal (error.code, SCRAM_ERR_STATE);
   assert_non_null (strstr (error.message, "in state failed"));
   scram_client_destroy (conv);

   /* server-final before client-final. */
   conv = client_of (AUTHFILE_SCRAM_SHA_256, "user", "pencil", "rOprNGfwEbeRWgbNEkqO");
   cf = cfirst (conv);
   assert_false (cverify (conv, RFC7677_SERVER_FINAL, &error));
   assert_int_equal (error.code, SCRAM_ERR_STATE);
   assert_non_null (strstr (error.message, "server-final message is not expected in state first_sent"));
   assert_null (cfinal (conv, RFC7677_SERVER_FIRST, NULL, &error));
   assert_int_equal (error.code, SCRAM_ERR_STATE);
   bson_free (cf);
   scram_client_destroy (conv);

   /* server-final before anything. */
   conv = client_of (AUTHFILE_SCRAM_SHA_256, "user", "pencil", NULL);
   assert_false (cverify (conv, RFC7677_SERVER_FINAL, &error));
   assert_int_equal (error.code, SCRAM_ERR_STATE);
   scram_client_destroy (conv);

   /* client-first twice; the nonce set after client-first; server-first twice. */
   conv = client_of (AUTHFILE_SCRAM_SHA_256, "user", "pencil", "rOprNGfwEbeRWgbNEkqO");
   cf = cfirst (conv);
   assert_false (scram_client_set_nonce (conv, "abc", &error));
   assert_int_equal (error.code, SCRAM_ERR_STATE);
   assert_false (scram_client_first (conv, &out, &out_len, &error));
   assert_int_equal (error.code, SCRAM_ERR_STATE);
   bson_free (cf);
   scram_client_destroy (conv);

   conv = client_of (AUTHFILE_SCRAM_SHA_256, "user", "pencil", "rOprNGfwEbeRWgbNEkqO");
   cf = cfirst (conv);
   fin = cfinal (conv, RFC7677_SERVER_FIRST, NULL, &error);
   assert_non_null (fin);
   assert_false (scram_client_done (conv));
   assert_null (cfinal (conv, RFC7677_SERVER_FIRST, NULL, &error));
   assert_int_equal (error.code, SCRAM_ERR_STATE);
   assert_non_null (strstr (error.message, "in state final_sent"));
   bson_free (fin);
   bson_free (cf);
   scram_client_destroy (conv);

   /* Nothing after the end. */
   conv = client_of (AUTHFILE_SCRAM_SHA_256, "user", "pencil", "rOprNGfwEbeRWgbNEkqO");
   cf = cfirst (conv);
   fin = cfinal (conv, RFC7677_SERVER_FIRST, NULL, &error);
   assert_true (cverify (conv, RFC7677_SERVER_FINAL, &error));
   assert_string_equal (scram_state_name (scram_client_state (conv)), "done");
   assert_false (scram_client_verify (conv, (const uint8_t *) RFC7677_SERVER_FINAL, strlen (RFC7677_SERVER_FINAL),
                                      &error));
   assert_int_equal (error.code, SCRAM_ERR_STATE);
   assert_non_null (strstr (error.message, "in state done"));
   bson_free (fin);
   bson_free (cf);
   scram_client_destroy (conv);

   /* Bad fixed nonces. */
   conv = client_of (AUTHFILE_SCRAM_SHA_256, "user", "pencil", NULL);
   assert_false (scram_client_set_nonce (conv, "a,b", &error));
   assert_non_null (strstr (error.message, "client nonce holds a character"));
   assert_false (scram_client_set_nonce (conv, "a b", &error));
   assert_false (scram_client_set_nonce (conv, "", &error));
#define N64 "0123456789012345678901234567890123456789012345678901234567890123"
   assert_false (scram_client_set_nonce (conv, N64 "4", &error));
   assert_non_null (strstr (error.message, "client nonce must be 1 to 64 characters"));
   assert_true (scram_client_set_nonce (conv, N64, &error));
   cf = cfirst (conv);
   assert_string_equal (cf, "n,,n=user,r=" N64);
#undef N64
   bson_free (cf);
   scram_client_destroy (conv);
   scram_client_destroy (NULL);
   scram_salt_cache_clear (NULL);
}

/* The salt cache: a hit costs no PBKDF2 and uses the cached value as it
 * is; anything that differs (salt, iterations, mechanism) refills it. */
static void
test_client_salt_cache (void **state)
{
   (void) state;
   authfile_t *af = users_of (RFC7677_ENTRY);
   uint8_t rfc_salted[32], salt[64];
   size_t salt_len;
   bson_error_t error;
   scram_salt_cache_t cache = {0};
   scram_client_t *conv;
   char *cf, *fin;

   hex_to_bytes (RFC7677_SALTED, rfc_salted);
   assert_true (authfile_b64_decode ("W22ZaJ0SNY7soEsUEjb6gQ==", 24, salt, sizeof salt, &salt_len));

   /* An empty cache is filled with the RFC's salted password. */
   conv = client_of (AUTHFILE_SCRAM_SHA_256, "user", "pencil", "rOprNGfwEbeRWgbNEkqO");
   cf = cfirst (conv);
   fin = cfinal (conv, RFC7677_SERVER_FIRST, &cache, &error);
   assert_string_equal (fin, RFC7677_CLIENT_FINAL);
   assert_true (cache.valid);
   assert_int_equal (cache.mech, AUTHFILE_SCRAM_SHA_256);
   assert_int_equal (cache.iterations, 4096);
   assert_int_equal (cache.salt_len, salt_len);
   assert_memory_equal (cache.salt, salt, salt_len);
   assert_memory_equal (cache.salted, rfc_salted, 32);
   assert_true (cverify (conv, RFC7677_SERVER_FINAL, &error));
   bson_free (fin);
   bson_free (cf);
   scram_client_destroy (conv);

   /* A hit is used as it is: a deliberately wrong salted password for the
    * same salt and count gives a proof the server refuses, and the client
    * would refuse the server's signature. */
   memset (cache.salted, 0x55, sizeof cache.salted);
   {
      scram_server_t *srv =
         started (af, AUTHFILE_SCRAM_SHA_256, RFC7677_CLIENT_FIRST, RFC7677_SERVER_NONCE, RFC7677_SERVER_FIRST);
      conv = client_of (AUTHFILE_SCRAM_SHA_256, "user", "pencil", "rOprNGfwEbeRWgbNEkqO");
      cf = cfirst (conv);
      fin = cfinal (conv, RFC7677_SERVER_FIRST, &cache, &error);
      assert_non_null (fin);
      assert_string_not_equal (fin, RFC7677_CLIENT_FINAL);
      assert_null (final (srv, fin, &error));
      assert_int_equal (error.code, SCRAM_ERR_AUTH_FAILED);
      assert_false (cverify (conv, RFC7677_SERVER_FINAL, &error));
      assert_int_equal (error.code, SCRAM_ERR_AUTH_FAILED);
      /* Not refreshed behind the caller's back. */
      for (size_t i = 0; i < 32; i++)
         assert_int_equal (cache.salted[i], 0x55);
      bson_free (fin);
      bson_free (cf);
      scram_client_destroy (conv);
      scram_server_destroy (srv);
   }

   /* Each difference refills the (wrong) cache: the RFC's messages again. */
   {
      static const struct {
         const char *what;
         int salt_delta; /* added to the first salt byte */
         int iterations_delta;
         bool other_mech, shorter_salt, invalid;
      } misses[] = {
         {"another salt", 1, 0, false, false, false},
         {"a salt that is a prefix", 0, 0, false, true, false},
         {"another count", 0, 1, false, false, false},
         {"another mechanism", 0, 0, true, false, false},
         {"not valid", 0, 0, false, false, true},
      };
      for (size_t i = 0; i < sizeof misses / sizeof misses[0]; i++) {
         cache.valid = !misses[i].invalid;
         cache.mech = misses[i].other_mech ? AUTHFILE_SCRAM_SHA_1 : AUTHFILE_SCRAM_SHA_256;
         cache.iterations = 4096 + (uint32_t) misses[i].iterations_delta;
         cache.salt_len = misses[i].shorter_salt ? salt_len - 1 : salt_len;
         memcpy (cache.salt, salt, salt_len);
         cache.salt[0] = (uint8_t) (cache.salt[0] + misses[i].salt_delta);
         memset (cache.salted, 0x55, sizeof cache.salted);

         conv = client_of (AUTHFILE_SCRAM_SHA_256, "user", "pencil", "rOprNGfwEbeRWgbNEkqO");
         cf = cfirst (conv);
         fin = cfinal (conv, RFC7677_SERVER_FIRST, &cache, &error);
         if (strcmp (fin, RFC7677_CLIENT_FINAL) != 0)
            fail_msg ("%s: the cache was used", misses[i].what);
         assert_true (cache.valid);
         assert_int_equal (cache.mech, AUTHFILE_SCRAM_SHA_256);
         assert_int_equal (cache.iterations, 4096);
         assert_int_equal (cache.salt_len, salt_len);
         assert_memory_equal (cache.salt, salt, salt_len);
         assert_memory_equal (cache.salted, rfc_salted, 32);
         assert_true (cverify (conv, RFC7677_SERVER_FINAL, &error));
         bson_free (fin);
         bson_free (cf);
         scram_client_destroy (conv);
      }
   }

   /* The same cache serves the other mechanism after a refill: SCRAM-SHA-1
    * of RFC 5802 fills it with that salted password (20 bytes). */
   {
      uint8_t sha1_salted[20];
      hex_to_bytes (RFC5802_MONGO_SALTED, sha1_salted);
      conv = client_of (AUTHFILE_SCRAM_SHA_1, "user", "pencil", RFC5802_CLIENT_NONCE);
      cf = cfirst (conv);
      fin = cfinal (conv, RFC5802_SERVER_FIRST, &cache, &error);
      assert_string_equal (fin, RFC5802_MONGO_CLIENT_FINAL);
      assert_int_equal (cache.mech, AUTHFILE_SCRAM_SHA_1);
      assert_memory_equal (cache.salted, sha1_salted, 20);
      bson_free (fin);
      bson_free (cf);
      scram_client_destroy (conv);
   }

   /* A refused server-first leaves the cache as it was. */
   {
      scram_salt_cache_t before = cache;
      conv = client_of (AUTHFILE_SCRAM_SHA_256, "user", "pencil", "rOprNGfwEbeRWgbNEkqO");
      cf = cfirst (conv);
      assert_null (cfinal (conv, "r=rOprNGfwEbeRWgbNEkqOx,s=AAAA,i=4095", &cache, &error));
      assert_memory_equal (&before, &cache, sizeof cache);
      bson_free (cf);
      scram_client_destroy (conv);
   }

   scram_salt_cache_clear (&cache);
   assert_false (cache.valid);
   for (size_t i = 0; i < sizeof cache.salted; i++)
      assert_int_equal (cache.salted[i], 0);
   authfile_destroy (af);
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
      cmocka_unit_test (test_client_vectors),
      cmocka_unit_test (test_client_round_trip),
      cmocka_unit_test (test_client_new_refusals),
      cmocka_unit_test (test_client_bad_server_first),
      cmocka_unit_test (test_client_bad_server_final),
      cmocka_unit_test (test_client_order),
      cmocka_unit_test (test_client_salt_cache),
   };
   return cmocka_run_group_tests (tests, NULL, NULL);
}
