/*
 * codec/scram.c - both sides of a SCRAM conversation, and the keys.
 *
 * RFC 5802 section 3, with H = SHA-1 or SHA-256 (RFC 7677):
 *
 *   SaltedPassword  = PBKDF2-HMAC-H(password', salt, i)
 *   ClientKey       = HMAC(SaltedPassword, "Client Key")
 *   StoredKey       = H(ClientKey)
 *   ServerKey       = HMAC(SaltedPassword, "Server Key")
 *   AuthMessage     = client-first-bare "," server-first "," client-final-without-proof
 *   ClientSignature = HMAC(StoredKey, AuthMessage)
 *   ClientProof     = ClientKey XOR ClientSignature
 *   ServerSignature = HMAC(ServerKey, AuthMessage)
 *
 * The server holds only StoredKey and ServerKey: it recovers ClientKey
 * from the proof and checks H(ClientKey) == StoredKey in constant time.
 * The client holds password' and derives everything; SaltedPassword is
 * the costly step, so the caller may keep it in a scram_salt_cache_t.
 * The client checks ServerSignature in constant time: a server that
 * does not know the keys cannot pass as mongod.
 * password' is SASLprep(password) for SCRAM-SHA-256 (libidn's profile for
 * anything beyond ASCII) and
 * hex(MD5(user ":mongo:" password)) for MongoDB's SCRAM-SHA-1.
 *
 * Every message is bounded (SCRAM_MAX_MESSAGE) and parsed in place; the
 * conversation keeps copies of what AuthMessage needs.  The server's
 * messages are as untrusted to the client as the client's to the server:
 * both sides parse with the same helpers and the same bounds.  Secrets
 * (keys, salted passwords, signatures) are cleared before their memory is
 * given back.
 */
#include "codec/scram.h"

#include <stdlib.h>
#include <string.h>

#include <stringprep.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "base/utf8.h"

#define B64_LEN(n) (4 * (((n) + 2) / 3))
/* The gs2 header the client sends, and its base64 for c= of client-final. */
#define CLIENT_GS2 "n,,"
#define CLIENT_CBIND "biws"
/* The longest combined nonce (r=) the client takes from server-first: its
 * client-final, "c=biws,r=" NONCE ",p=" PROOF, stays within
 * SCRAM_MAX_MESSAGE. */
#define CLIENT_MAX_NONCE \
   (SCRAM_MAX_MESSAGE - ((int) sizeof ("c=" CLIENT_CBIND ",r=,p=") - 1) - B64_LEN (AUTHFILE_KEY_MAX))

_Static_assert (B64_LEN (SCRAM_CLIENT_NONCE_BYTES) <= SCRAM_MAX_FIXED_NONCE, "a client nonce fits its buffer");
_Static_assert (SCRAM_SERVER_NONCE_BYTES <= 64 && SCRAM_CLIENT_NONCE_BYTES <= 64, "random_nonce's buffer");

struct scram_server {
   authfile_mech_t mech;
   scram_state_t state;
   char user[AUTHFILE_MAX_NAME + 1]; /* unescaped n= of client-first */
   bool have_user;
   authfile_key_t key;  /* a copy of the user's entry; cleared on destroy */
   char gs2[4];         /* "n,," or "y,," */
   char *first_bare;    /* client-first-message-bare; owned */
   char *server_first;  /* what step 1 returned; owned */
   char *nonce;         /* client nonce + server nonce; owned */
   char fixed_nonce[SCRAM_MAX_FIXED_NONCE + 1]; /* scram_server_set_nonce, or "" */
};

/* The client's conversation.  Everything is owned by it; the secrets
 * (password', the expected server signature) are cleared by destroy, and
 * the signature as soon as server-final has been checked. */
struct scram_client {
   authfile_mech_t mech;
   scram_state_t state;
   char *user;     /* the escaped user name, as n= carries it */
   char *prepared; /* password': hex MD5 or SASLprep'd password; secret */
   size_t prepared_len;
   char nonce[SCRAM_MAX_FIXED_NONCE + 1]; /* the client nonce; "" until set or made */
   char *first_bare;                       /* client-first-message-bare, once made */
   uint8_t server_signature[AUTHFILE_KEY_MAX]; /* what v= must be, once client-final is made */
};

static const char *const state_names[SCRAM_N_STATES] = {
   [SCRAM_STATE_NEW] = "new",
   [SCRAM_STATE_FIRST_SENT] = "first_sent",
   [SCRAM_STATE_FINAL_SENT] = "final_sent",
   [SCRAM_STATE_DONE] = "done",
   [SCRAM_STATE_FAILED] = "failed",
};

const char *
scram_state_name (scram_state_t state)
{
   return (unsigned) state < SCRAM_N_STATES ? state_names[state] : "unknown";
}

static const EVP_MD *
mech_md (authfile_mech_t mech)
{
   return mech == AUTHFILE_SCRAM_SHA_1 ? EVP_sha1 () : EVP_sha256 ();
}

scram_server_t *
scram_server_new (authfile_mech_t mech)
{
   scram_server_t *conv = bson_malloc0 (sizeof *conv);
   conv->mech = mech;
   conv->state = SCRAM_STATE_NEW;
   return conv;
}

void
scram_server_destroy (scram_server_t *conv)
{
   if (!conv)
      return;
   bson_free (conv->first_bare);
   bson_free (conv->server_first);
   bson_free (conv->nonce);
   OPENSSL_cleanse (conv, sizeof *conv);
   bson_free (conv);
}

scram_state_t
scram_server_state (const scram_server_t *conv)
{
   return conv->state;
}

authfile_mech_t
scram_server_mech (const scram_server_t *conv)
{
   return conv->mech;
}

const char *
scram_server_user (const scram_server_t *conv)
{
   return conv->have_user ? conv->user : NULL;
}

/* A NUL-terminated copy of s[0..len), which need not be terminated
 * (bson_strndup may read one byte past it). */
static char *
copy_bytes (const char *s, size_t len)
{
   char *out = bson_malloc (len + 1);
   memcpy (out, s, len);
   out[len] = '\0';
   return out;
}

/* RFC 5802 "printable": %x21-2B / %x2D-7E (no ',' and no blank). */
static bool
is_printable (char c)
{
   return c >= 0x21 && c <= 0x7e && c != ',';
}

/* Checks a fixed nonce for a conversation in `state` (either side; `whose`
 * is "server" or "client"). */
static bool
check_fixed_nonce (scram_state_t state, const char *nonce, const char *whose, bson_error_t *error)
{
   size_t len = strlen (nonce);

   if (state != SCRAM_STATE_NEW) {
      bson_set_error (error, SCRAM_ERROR_DOMAIN, SCRAM_ERR_STATE, "the %s nonce is set before client-first", whose);
      return false;
   }
   if (len == 0 || len > SCRAM_MAX_FIXED_NONCE) {
      bson_set_error (error, SCRAM_ERROR_DOMAIN, SCRAM_ERR_MALFORMED, "%s nonce must be 1 to %d characters", whose,
                      SCRAM_MAX_FIXED_NONCE);
      return false;
   }
   for (size_t i = 0; i < len; i++) {
      if (!is_printable (nonce[i])) {
         bson_set_error (error, SCRAM_ERROR_DOMAIN, SCRAM_ERR_MALFORMED,
                         "%s nonce holds a character that is not printable or is ','", whose);
         return false;
      }
   }
   return true;
}

bool
scram_server_set_nonce (scram_server_t *conv, const char *nonce, bson_error_t *error)
{
   if (!check_fixed_nonce (conv->state, nonce, "server", error))
      return false;
   bson_strncpy (conv->fixed_nonce, nonce, sizeof conv->fixed_nonce);
   return true;
}

/* `bytes` random bytes in base64 into out (out_len >= B64_LEN (bytes) + 1). */
static bool
random_nonce (size_t bytes, char *out, size_t out_len)
{
   uint8_t rnd[64];

   if (bytes > sizeof rnd || RAND_bytes (rnd, (int) bytes) != 1)
      return false;
   authfile_b64_encode (rnd, bytes, out, out_len);
   return true;
}

/* Fails the conversation (every later step is refused) with an error;
 * evaluates to false.  Expects `conv` and `error` in scope. */
#define FAIL(code, ...) \
   (conv->state = SCRAM_STATE_FAILED, bson_set_error (error, SCRAM_ERROR_DOMAIN, (code), __VA_ARGS__), false)

/* Refuses a step out of order: unless *state is `want`, fails it. */
static bool
check_state (scram_state_t *state, scram_state_t want, const char *what, bson_error_t *error)
{
   if (*state == want)
      return true;
   bson_set_error (error, SCRAM_ERROR_DOMAIN, SCRAM_ERR_STATE, "%s is not expected in state %s", what,
                   scram_state_name (*state));
   *state = SCRAM_STATE_FAILED;
   return false;
}

/* Common checks of an incoming message, on either side: its step, size
 * and bytes.  A refusal fails the conversation whose state is *state. */
static bool
check_message (scram_state_t *state, scram_state_t want, const uint8_t *msg, size_t len, const char *what,
               bson_error_t *error)
{
   if (!check_state (state, want, what, error))
      return false;
   if (len > SCRAM_MAX_MESSAGE) {
      *state = SCRAM_STATE_FAILED;
      bson_set_error (error, SCRAM_ERROR_DOMAIN, SCRAM_ERR_TOO_LARGE, "%s is longer than %d bytes", what,
                      SCRAM_MAX_MESSAGE);
      return false;
   }
   if (len == 0) {
      *state = SCRAM_STATE_FAILED;
      bson_set_error (error, SCRAM_ERROR_DOMAIN, SCRAM_ERR_MALFORMED, "%s is empty", what);
      return false;
   }
   if (!utf8_valid ((const char *) msg, len)) {
      *state = SCRAM_STATE_FAILED;
      bson_set_error (error, SCRAM_ERROR_DOMAIN, SCRAM_ERR_MALFORMED, "%s is not valid UTF-8 or holds a NUL byte",
                      what);
      return false;
   }
   return true;
}

/* The value of attribute `name` at *p (up to the next ',' or end), or
 * false when *p does not start with "name=".  Advances *p past the value
 * and its ','. */
static bool
take_attr (const char **p, const char *end, char name, const char **val, size_t *vlen)
{
   const char *s = *p, *comma;

   if (end - s < 2 || s[0] != name || s[1] != '=')
      return false;
   s += 2;
   comma = memchr (s, ',', (size_t) (end - s));
   *val = s;
   *vlen = (size_t) ((comma ? comma : end) - s);
   *p = comma ? comma + 1 : end;
   return true;
}

/* True if [s, end) is a list of "x=value" extensions (RFC 5802 attr-val). */
static bool
valid_extensions (const char *s, const char *end)
{
   while (s < end) {
      const char *comma = memchr (s, ',', (size_t) (end - s));
      const char *e = comma ? comma : end;
      if (e - s < 2 || !((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z')) || s[1] != '=')
         return false;
      s = comma ? comma + 1 : end;
      if (comma && s == end)
         return false; /* a trailing ',' */
   }
   return true;
}

static bool
hmac (authfile_mech_t mech, const uint8_t *key, size_t key_len, const void *data, size_t len, uint8_t *out)
{
   unsigned int out_len = 0;
   return HMAC (mech_md (mech), key, (int) key_len, data, len, out, &out_len) != NULL &&
          out_len == authfile_key_len (mech);
}

static bool
digest (authfile_mech_t mech, const uint8_t *data, size_t len, uint8_t *out)
{
   unsigned int out_len = 0;
   return EVP_Digest (data, len, out, &out_len, mech_md (mech), NULL) == 1 && out_len == authfile_key_len (mech);
}

/* SaltedPassword = PBKDF2-HMAC-H(password', salt, i): the costly step. */
static bool
salt_password (authfile_mech_t mech, const char *prepared, size_t prepared_len, const uint8_t *salt, size_t salt_len,
               uint32_t iterations, uint8_t *salted)
{
   return PKCS5_PBKDF2_HMAC (prepared, (int) prepared_len, salt, (int) salt_len, (int) iterations, mech_md (mech),
                             (int) authfile_key_len (mech), salted) == 1;
}

/* ClientKey, StoredKey = H(ClientKey) and ServerKey of a salted password. */
static bool
salted_keys (authfile_mech_t mech, const uint8_t *salted, uint8_t *client_key, uint8_t *stored_key,
             uint8_t *server_key)
{
   size_t klen = authfile_key_len (mech);
   return hmac (mech, salted, klen, "Client Key", 10, client_key) && digest (mech, client_key, klen, stored_key) &&
          hmac (mech, salted, klen, "Server Key", 10, server_key);
}

/* AuthMessage: client-first-bare "," server-first "," client-final-without-proof.
 * Free with bson_string_free (s, true); it holds nothing secret. */
static bson_string_t *
auth_message_of (const char *first_bare, const char *server_first, size_t server_first_len, const char *final,
                 size_t final_len)
{
   bson_string_t *am = bson_string_new (first_bare);
   bson_string_append_c (am, ',');
   bson_string_append_printf (am, "%.*s", (int) server_first_len, server_first);
   bson_string_append_c (am, ',');
   bson_string_append_printf (am, "%.*s", (int) final_len, final);
   return am;
}

/* out[i] = a[i] ^ b[i]: ClientProof from ClientKey and ClientSignature,
 * and back. */
static void
xor_bytes (uint8_t *out, const uint8_t *a, const uint8_t *b, size_t n)
{
   for (size_t i = 0; i < n; i++)
      out[i] = a[i] ^ b[i];
}

bool
scram_server_first (scram_server_t *conv, const authfile_t *users, const uint8_t *msg, size_t len,
                    char **out, size_t *out_len, bson_error_t *error)
{
   const char *m = (const char *) msg, *end = m + len, *p, *val;
   const authfile_user_t *user;
   size_t vlen, n = 0;
   char server_nonce[B64_LEN (SCRAM_SERVER_NONCE_BYTES) + SCRAM_MAX_FIXED_NONCE + 1];
   char salt[B64_LEN (AUTHFILE_MAX_SALT) + 1];

   *out = NULL;
   *out_len = 0;
   if (!check_message (&conv->state, SCRAM_STATE_NEW, msg, len, "client-first message", error))
      return false;

   /* gs2-header: channel binding and authzid are not supported. */
   if (len >= 2 && m[0] == 'p' && m[1] == '=')
      return FAIL (SCRAM_ERR_MALFORMED, "channel binding (p=) is not supported");
   if (len < 3 || (m[0] != 'n' && m[0] != 'y') || m[1] != ',')
      return FAIL (SCRAM_ERR_MALFORMED, "client-first message must start with the gs2 header \"n,,\" or \"y,,\"");
   if (m[2] != ',')
      return FAIL (SCRAM_ERR_MALFORMED, "an authorization identity (a=) is not supported");
   memcpy (conv->gs2, m, 3);
   conv->gs2[3] = '\0';
   p = m + 3;

   if (end - p >= 2 && p[0] == 'm' && p[1] == '=')
      return FAIL (SCRAM_ERR_MALFORMED, "mandatory extension (m=) is not supported");
   conv->first_bare = copy_bytes (p, (size_t) (end - p));

   if (!take_attr (&p, end, 'n', &val, &vlen))
      return FAIL (SCRAM_ERR_MALFORMED, "client-first message has no user name (n=)");
   /* saslname: ',' and '=' arrive as "=2C" and "=3D"; no other '='. */
   for (size_t i = 0; i < vlen; i++) {
      char c = val[i];
      if (c == '=') {
         if (i + 2 < vlen && val[i + 1] == '2' && val[i + 2] == 'C')
            c = ',';
         else if (i + 2 < vlen && val[i + 1] == '3' && val[i + 2] == 'D')
            c = '=';
         else
            return FAIL (SCRAM_ERR_MALFORMED, "user name holds '=' not followed by 2C or 3D");
         i += 2;
      }
      if (n == AUTHFILE_MAX_NAME)
         return FAIL (SCRAM_ERR_MALFORMED, "user name is too long");
      conv->user[n++] = c;
   }
   conv->user[n] = '\0';
   if (n == 0)
      return FAIL (SCRAM_ERR_MALFORMED, "user name (n=) is empty");
   conv->have_user = true;

   if (!take_attr (&p, end, 'r', &val, &vlen))
      return FAIL (SCRAM_ERR_MALFORMED, "client-first message has no nonce (r=) after n=");
   if (vlen == 0)
      return FAIL (SCRAM_ERR_MALFORMED, "client nonce (r=) is empty");
   for (size_t i = 0; i < vlen; i++)
      if (!is_printable (val[i]))
         return FAIL (SCRAM_ERR_MALFORMED, "client nonce holds a character that is not printable");
   if (p > m && p[-1] == ',' && p == end)
      return FAIL (SCRAM_ERR_MALFORMED, "client-first message ends with ','");
   if (!valid_extensions (p, end))
      return FAIL (SCRAM_ERR_MALFORMED, "client-first message has a malformed attribute after r=");

   /* The user and its entry for this mechanism.  mongod answers both an
    * unknown user and a missing mechanism with AuthenticationFailed. */
   user = authfile_lookup (users, conv->user, n);
   if (!user)
      return FAIL (SCRAM_ERR_AUTH_FAILED, "unknown user '%s'", conv->user);
   if (!user->keys[conv->mech].present)
      return FAIL (SCRAM_ERR_AUTH_FAILED, "user '%s' has no entry for this mechanism", conv->user);
   conv->key = user->keys[conv->mech];

   if (conv->fixed_nonce[0]) {
      bson_strncpy (server_nonce, conv->fixed_nonce, sizeof server_nonce);
   } else if (!random_nonce (SCRAM_SERVER_NONCE_BYTES, server_nonce, sizeof server_nonce)) {
      return FAIL (SCRAM_ERR_CRYPTO, "RAND_bytes failed: no server nonce");
   }
   conv->nonce = bson_strdup_printf ("%.*s%s", (int) vlen, val, server_nonce);
   authfile_b64_encode (conv->key.salt, conv->key.salt_len, salt, sizeof salt);
   conv->server_first = bson_strdup_printf ("r=%s,s=%s,i=%u", conv->nonce, salt, (unsigned) conv->key.iterations);
   *out_len = strlen (conv->server_first);
   *out = copy_bytes (conv->server_first, *out_len);
   conv->state = SCRAM_STATE_FIRST_SENT;
   return true;
}

bool
scram_server_final (scram_server_t *conv, const uint8_t *msg, size_t len, char **out, size_t *out_len,
                    bson_error_t *error)
{
   const char *m = (const char *) msg, *end = m + len, *p = m, *val, *proof_at;
   size_t vlen, got, klen = authfile_key_len (conv->mech);
   uint8_t cbind[8], proof[AUTHFILE_KEY_MAX + 3], sig[AUTHFILE_KEY_MAX], client_key[AUTHFILE_KEY_MAX];
   uint8_t stored[AUTHFILE_KEY_MAX];
   char sig_b64[B64_LEN (AUTHFILE_KEY_MAX) + 1];
   bson_string_t *auth_message = NULL;
   bool ok = false;

   *out = NULL;
   *out_len = 0;
   if (!check_message (&conv->state, SCRAM_STATE_FIRST_SENT, msg, len, "client-final message", error))
      return false;

   if (!take_attr (&p, end, 'c', &val, &vlen)) {
      (void) FAIL (SCRAM_ERR_MALFORMED, "client-final message must start with c=");
      goto done;
   }
   if (!authfile_b64_decode (val, vlen, cbind, sizeof cbind, &got)) {
      (void) FAIL (SCRAM_ERR_MALFORMED, "channel binding (c=) is not valid base64");
      goto done;
   }
   if (got != 3 || memcmp (cbind, conv->gs2, 3) != 0) {
      (void) FAIL (SCRAM_ERR_MALFORMED, "channel binding (c=) does not match the gs2 header");
      goto done;
   }
   if (!take_attr (&p, end, 'r', &val, &vlen)) {
      (void) FAIL (SCRAM_ERR_MALFORMED, "client-final message has no nonce (r=) after c=");
      goto done;
   }
   if (vlen != strlen (conv->nonce) || memcmp (val, conv->nonce, vlen) != 0) {
      (void) FAIL (SCRAM_ERR_MALFORMED, "nonce mismatch: r= is not the nonce of server-first");
      goto done;
   }
   /* The proof is the last attribute: ",p=" then no ','. */
   proof_at = NULL;
   for (const char *q = p; q + 2 <= end; q++) {
      if ((q == p || q[-1] == ',') && q[0] == 'p' && q[1] == '=' && !memchr (q, ',', (size_t) (end - q))) {
         proof_at = q;
         break;
      }
   }
   if (!proof_at || p == end) {
      (void) FAIL (SCRAM_ERR_MALFORMED, "client-final message does not end with the proof (p=)");
      goto done;
   }
   if (proof_at > p && !valid_extensions (p, proof_at - 1)) {
      (void) FAIL (SCRAM_ERR_MALFORMED, "client-final message has a malformed attribute before p=");
      goto done;
   }
   if (!authfile_b64_decode (proof_at + 2, (size_t) (end - proof_at - 2), proof, sizeof proof, &got) ||
       got != klen) {
      (void) FAIL (SCRAM_ERR_MALFORMED, "proof (p=) is not base64 of a %s digest",
            authfile_mech_name (conv->mech));
      goto done;
   }

   auth_message = auth_message_of (conv->first_bare, conv->server_first, strlen (conv->server_first), m,
                                   (size_t) (proof_at - 1 - m));

   if (!hmac (conv->mech, conv->key.stored_key, klen, auth_message->str, auth_message->len, sig)) {
      (void) FAIL (SCRAM_ERR_CRYPTO, "HMAC failed");
      goto done;
   }
   xor_bytes (client_key, proof, sig, klen);
   if (!digest (conv->mech, client_key, klen, stored)) {
      (void) FAIL (SCRAM_ERR_CRYPTO, "digest failed");
      goto done;
   }
   if (CRYPTO_memcmp (stored, conv->key.stored_key, klen) != 0) {
      (void) FAIL (SCRAM_ERR_AUTH_FAILED, "wrong proof for user '%s'", conv->user);
      goto done;
   }
   if (!hmac (conv->mech, conv->key.server_key, klen, auth_message->str, auth_message->len, sig)) {
      (void) FAIL (SCRAM_ERR_CRYPTO, "HMAC failed");
      goto done;
   }
   authfile_b64_encode (sig, klen, sig_b64, sizeof sig_b64);
   *out = bson_strdup_printf ("v=%s", sig_b64);
   *out_len = strlen (*out);
   conv->state = SCRAM_STATE_DONE;
   ok = true;

done:
   if (auth_message)
      bson_string_free (auth_message, true);
   OPENSSL_cleanse (sig, sizeof sig);
   OPENSSL_cleanse (client_key, sizeof client_key);
   OPENSSL_cleanse (proof, sizeof proof);
   return ok;
}

/* SASLprep of a string with a byte >= 0x80, by libidn's "SASLprep"
 * profile as a stored string (unassigned code points refused, as the
 * drivers' own SASLprep does).  `in` is not NUL-terminated: a copy is. */
static bool
saslprep_unicode (const char *in, size_t len, char **out, bson_error_t *error)
{
   char *copy = copy_bytes (in, len), *prepped = NULL;
   int rc = stringprep_profile (copy, &prepped, "SASLprep", STRINGPREP_NO_UNASSIGNED);
   bool ok = false;

   if (rc != STRINGPREP_OK) {
      /* The message says which rule, never the password. */
      bson_set_error (error, SCRAM_ERROR_DOMAIN, SCRAM_ERR_SASLPREP, "SASLprep: %s", stringprep_strerror ((Stringprep_rc) rc));
      goto done;
   }
   if (!prepped[0]) {
      bson_set_error (error, SCRAM_ERROR_DOMAIN, SCRAM_ERR_SASLPREP, "SASLprep: the string is empty once prepared");
      goto done;
   }
   *out = copy_bytes (prepped, strlen (prepped));
   ok = true;
done:
   if (prepped) {
      OPENSSL_cleanse (prepped, strlen (prepped));
      free (prepped); /* libidn's, from malloc */
   }
   OPENSSL_cleanse (copy, len);
   bson_free (copy);
   return ok;
}

bool
scram_saslprep (const char *in, size_t len, char **out, bson_error_t *error)
{
   *out = NULL;
   if (len == 0) {
      bson_set_error (error, SCRAM_ERROR_DOMAIN, SCRAM_ERR_SASLPREP, "SASLprep: the string is empty");
      return false;
   }
   /* ASCII, the usual case, without libidn: the mapping and NFKC leave it
    * unchanged, and its only prohibited characters are the controls.  A
    * NUL is one of them, which the C string libidn takes could not show. */
   for (size_t i = 0; i < len; i++) {
      unsigned char c = (unsigned char) in[i];
      if (c < 0x20 || c == 0x7f) {
         bson_set_error (error, SCRAM_ERROR_DOMAIN, SCRAM_ERR_SASLPREP,
                         "SASLprep: prohibited character (ASCII control, RFC 4013 C.2.1) at byte %zu", i + 1);
         return false;
      }
   }
   for (size_t i = 0; i < len; i++)
      if ((unsigned char) in[i] >= 0x80)
         return saslprep_unicode (in, len, out, error);
   *out = copy_bytes (in, len);
   return true;
}

/* password' as MongoDB derives it: the hex MD5 of "user:mongo:password"
 * for SCRAM-SHA-1 (never SASLprepped), SASLprep(password) for
 * SCRAM-SHA-256.  Sets *out and *out_len; *out is a secret, which the
 * caller clears (free_secret) and frees. */
static bool
prepare_password (authfile_mech_t mech, const char *user, const char *password, char **out, size_t *out_len,
                  bson_error_t *error)
{
   uint8_t md5[16];
   char hex[33];
   bool ok = false;

   *out = NULL;
   *out_len = 0;
   if (mech == AUTHFILE_SCRAM_SHA_1) {
      EVP_MD_CTX *ctx = EVP_MD_CTX_new ();
      unsigned int n = 0;
      bool md_ok = ctx && EVP_DigestInit_ex (ctx, EVP_md5 (), NULL) == 1 &&
                   EVP_DigestUpdate (ctx, user, strlen (user)) == 1 &&
                   EVP_DigestUpdate (ctx, ":mongo:", 7) == 1 &&
                   EVP_DigestUpdate (ctx, password, strlen (password)) == 1 &&
                   EVP_DigestFinal_ex (ctx, md5, &n) == 1 && n == sizeof md5;
      EVP_MD_CTX_free (ctx);
      if (!md_ok) {
         bson_set_error (error, SCRAM_ERROR_DOMAIN, SCRAM_ERR_CRYPTO, "MD5 is not available (needed by SCRAM-SHA-1)");
         goto done;
      }
      for (size_t i = 0; i < sizeof md5; i++)
         bson_snprintf (hex + 2 * i, 3, "%02x", md5[i]);
      *out = copy_bytes (hex, 32);
   } else if (!scram_saslprep (password, strlen (password), out, error)) {
      goto done;
   }
   *out_len = strlen (*out);
   ok = true;

done:
   OPENSSL_cleanse (hex, sizeof hex);
   OPENSSL_cleanse (md5, sizeof md5);
   return ok;
}

/* Clears and frees a NUL-terminated secret (NULL ok). */
static void
free_secret (char *s)
{
   if (!s)
      return;
   OPENSSL_cleanse (s, strlen (s));
   bson_free (s);
}

bool
scram_derive_key (authfile_mech_t mech, const char *user, const char *password, const uint8_t *salt,
                  size_t salt_len, uint32_t iterations, authfile_key_t *out, bson_error_t *error)
{
   uint8_t salted[AUTHFILE_KEY_MAX], client_key[AUTHFILE_KEY_MAX];
   char *prepared = NULL;
   size_t prepared_len;
   bool ok = false;

   memset (out, 0, sizeof *out);
   if (salt_len == 0 || salt_len > AUTHFILE_MAX_SALT || iterations < 1 || iterations > AUTHFILE_MAX_ITERATIONS) {
      bson_set_error (error, SCRAM_ERROR_DOMAIN, SCRAM_ERR_MALFORMED, "salt of 1 to %d bytes and iterations of 1 to %d expected",
                      AUTHFILE_MAX_SALT, AUTHFILE_MAX_ITERATIONS);
      goto done;
   }
   if (!prepare_password (mech, user, password, &prepared, &prepared_len, error))
      goto done;
   if (!salt_password (mech, prepared, prepared_len, salt, salt_len, iterations, salted) ||
       !salted_keys (mech, salted, client_key, out->stored_key, out->server_key)) {
      bson_set_error (error, SCRAM_ERROR_DOMAIN, SCRAM_ERR_CRYPTO, "key derivation failed");
      goto done;
   }
   out->present = true;
   out->iterations = iterations;
   out->salt_len = salt_len;
   memcpy (out->salt, salt, salt_len);
   ok = true;

done:
   free_secret (prepared);
   OPENSSL_cleanse (salted, sizeof salted);
   OPENSSL_cleanse (client_key, sizeof client_key);
   if (!ok)
      OPENSSL_cleanse (out, sizeof *out);
   return ok;
}

bool
scram_make_user (const char *name, const char *password, authfile_user_t *out, bson_error_t *error)
{
   static const struct {
      authfile_mech_t mech;
      uint32_t iterations;
   } plan[] = {
      {AUTHFILE_SCRAM_SHA_256, SCRAM_SHA_256_ITERATIONS},
      {AUTHFILE_SCRAM_SHA_1, SCRAM_SHA_1_ITERATIONS},
   };
   uint8_t salt[AUTHFILE_KEY_MAX];

   memset (out, 0, sizeof *out);
   if (!authfile_name_valid (name, error))
      return false;
   if (!password[0]) {
      bson_set_error (error, SCRAM_ERROR_DOMAIN, SCRAM_ERR_MALFORMED, "password is empty");
      return false;
   }
   bson_strncpy (out->name, name, sizeof out->name);
   for (size_t i = 0; i < sizeof plan / sizeof plan[0]; i++) {
      /* mongod's salt: the digest length less 4 bytes (16 or 28). */
      size_t salt_len = authfile_key_len (plan[i].mech) - 4;
      if (RAND_bytes (salt, (int) salt_len) != 1) {
         bson_set_error (error, SCRAM_ERROR_DOMAIN, SCRAM_ERR_CRYPTO, "RAND_bytes failed: no salt");
         OPENSSL_cleanse (out, sizeof *out);
         return false;
      }
      if (!scram_derive_key (plan[i].mech, name, password, salt, salt_len, plan[i].iterations,
                             &out->keys[plan[i].mech], error)) {
         OPENSSL_cleanse (out, sizeof *out);
         return false;
      }
   }
   return true;
}

/* ---- the client side ---- */

void
scram_salt_cache_clear (scram_salt_cache_t *cache)
{
   if (!cache)
      return;
   OPENSSL_cleanse (cache, sizeof *cache);
   cache->valid = false;
}

scram_client_t *
scram_client_new (authfile_mech_t mech, const char *user, const char *password, bson_error_t *error)
{
   scram_client_t *conv = NULL;
   bson_string_t *escaped = NULL;
   size_t user_len = strlen (user), password_len = strlen (password);

   if (mech != AUTHFILE_SCRAM_SHA_1 && mech != AUTHFILE_SCRAM_SHA_256) {
      bson_set_error (error, SCRAM_ERROR_DOMAIN, SCRAM_ERR_MALFORMED, "unknown SCRAM mechanism %d", (int) mech);
      return NULL;
   }
   if (user_len == 0 || user_len > AUTHFILE_MAX_NAME || !utf8_valid (user, user_len)) {
      bson_set_error (error, SCRAM_ERROR_DOMAIN, SCRAM_ERR_MALFORMED, "user name must be 1 to %d bytes of UTF-8",
                      AUTHFILE_MAX_NAME);
      return NULL;
   }
   if (password_len == 0 || password_len > AUTHFILE_MAX_PASSWORD) {
      bson_set_error (error, SCRAM_ERROR_DOMAIN, SCRAM_ERR_MALFORMED, "password must be 1 to %d bytes",
                      AUTHFILE_MAX_PASSWORD);
      return NULL;
   }

   conv = bson_malloc0 (sizeof *conv);
   conv->mech = mech;
   conv->state = SCRAM_STATE_NEW;
   if (!prepare_password (mech, user, password, &conv->prepared, &conv->prepared_len, error)) {
      scram_client_destroy (conv);
      return NULL;
   }
   /* saslname (RFC 5802): ',' and '=' travel as "=2C" and "=3D". */
   escaped = bson_string_new (NULL);
   for (size_t i = 0; i < user_len; i++) {
      if (user[i] == ',')
         bson_string_append (escaped, "=2C");
      else if (user[i] == '=')
         bson_string_append (escaped, "=3D");
      else
         bson_string_append_c (escaped, user[i]);
   }
   conv->user = bson_string_free (escaped, false);
   return conv;
}

void
scram_client_destroy (scram_client_t *conv)
{
   if (!conv)
      return;
   free_secret (conv->prepared);
   bson_free (conv->user);
   bson_free (conv->first_bare);
   OPENSSL_cleanse (conv, sizeof *conv);
   bson_free (conv);
}

scram_state_t
scram_client_state (const scram_client_t *conv)
{
   return conv->state;
}

authfile_mech_t
scram_client_mech (const scram_client_t *conv)
{
   return conv->mech;
}

bool
scram_client_done (const scram_client_t *conv)
{
   return conv->state == SCRAM_STATE_DONE;
}

bool
scram_client_set_nonce (scram_client_t *conv, const char *nonce, bson_error_t *error)
{
   if (!check_fixed_nonce (conv->state, nonce, "client", error))
      return false;
   bson_strncpy (conv->nonce, nonce, sizeof conv->nonce);
   return true;
}

bool
scram_client_first (scram_client_t *conv, char **out, size_t *out_len, bson_error_t *error)
{
   *out = NULL;
   *out_len = 0;
   if (!check_state (&conv->state, SCRAM_STATE_NEW, "client-first message", error))
      return false;
   if (!conv->nonce[0] && !random_nonce (SCRAM_CLIENT_NONCE_BYTES, conv->nonce, sizeof conv->nonce))
      return FAIL (SCRAM_ERR_CRYPTO, "RAND_bytes failed: no client nonce");
   conv->first_bare = bson_strdup_printf ("n=%s,r=%s", conv->user, conv->nonce);
   *out = bson_strdup_printf (CLIENT_GS2 "%s", conv->first_bare);
   *out_len = strlen (*out);
   conv->state = SCRAM_STATE_FIRST_SENT;
   return true;
}

/* i= of server-first: RFC 5802's posit-number (no sign, no leading zero),
 * or "0" so that it is refused for its value.  Values beyond
 * AUTHFILE_MAX_ITERATIONS come back as AUTHFILE_MAX_ITERATIONS + 1, which
 * the caller refuses: no overflow whatever the digits. */
static bool
parse_iterations (const char *s, size_t len, uint32_t *out)
{
   uint32_t v = 0;

   if (len == 0 || (s[0] == '0' && len > 1))
      return false;
   for (size_t i = 0; i < len; i++) {
      if (s[i] < '0' || s[i] > '9')
         return false;
      if (v <= AUTHFILE_MAX_ITERATIONS)
         v = v * 10 + (uint32_t) (s[i] - '0');
   }
   *out = v > AUTHFILE_MAX_ITERATIONS ? AUTHFILE_MAX_ITERATIONS + 1 : v;
   return true;
}

/* The salted password for (salt, iterations): the cache's when it holds
 * this very one, else PBKDF2's, which then refills the cache. */
static bool
client_salted (scram_client_t *conv, const uint8_t *salt, size_t salt_len, uint32_t iterations,
               scram_salt_cache_t *cache, uint8_t *salted)
{
   size_t klen = authfile_key_len (conv->mech);

   if (cache && cache->valid && cache->mech == conv->mech && cache->iterations == iterations &&
       cache->salt_len == salt_len && memcmp (cache->salt, salt, salt_len) == 0) {
      memcpy (salted, cache->salted, klen);
      return true;
   }
   if (!salt_password (conv->mech, conv->prepared, conv->prepared_len, salt, salt_len, iterations, salted))
      return false;
   if (cache) {
      scram_salt_cache_clear (cache);
      cache->mech = conv->mech;
      cache->iterations = iterations;
      cache->salt_len = salt_len;
      memcpy (cache->salt, salt, salt_len);
      memcpy (cache->salted, salted, klen);
      cache->valid = true;
   }
   return true;
}

bool
scram_client_final (scram_client_t *conv, const uint8_t *msg, size_t len, scram_salt_cache_t *cache, char **out,
                    size_t *out_len, bson_error_t *error)
{
   const char *m = (const char *) msg, *end = m + len, *p = m, *nonce, *val;
   size_t nonce_len, vlen, salt_len, klen = authfile_key_len (conv->mech), ours = strlen (conv->nonce);
   uint32_t iterations;
   uint8_t salt[AUTHFILE_MAX_SALT + 2]; /* what B64_LEN (AUTHFILE_MAX_SALT) characters may decode to */
   uint8_t salted[AUTHFILE_KEY_MAX], client_key[AUTHFILE_KEY_MAX], stored_key[AUTHFILE_KEY_MAX];
   uint8_t server_key[AUTHFILE_KEY_MAX], sig[AUTHFILE_KEY_MAX], proof[AUTHFILE_KEY_MAX];
   char proof_b64[B64_LEN (AUTHFILE_KEY_MAX) + 1];
   char *without_proof = NULL;
   bson_string_t *am = NULL;
   bool ok = false;

   *out = NULL;
   *out_len = 0;
   if (!check_message (&conv->state, SCRAM_STATE_FIRST_SENT, msg, len, "server-first message", error))
      return false;

   /* server-first = [reserved-mext ","] nonce "," salt "," iteration-count ["," extensions] */
   if (len >= 2 && m[0] == 'm' && m[1] == '=')
      return FAIL (SCRAM_ERR_MALFORMED, "mandatory extension (m=) is not supported");
   if (!take_attr (&p, end, 'r', &nonce, &nonce_len))
      return FAIL (SCRAM_ERR_MALFORMED, "server-first message must start with the nonce (r=)");
   if (nonce_len < ours || memcmp (nonce, conv->nonce, ours) != 0)
      return FAIL (SCRAM_ERR_MALFORMED, "nonce (r=) does not start with the client nonce");
   if (nonce_len == ours)
      return FAIL (SCRAM_ERR_MALFORMED, "nonce (r=) has no server part after the client nonce");
   if (nonce_len > CLIENT_MAX_NONCE)
      return FAIL (SCRAM_ERR_TOO_LARGE, "nonce (r=) is longer than %d characters", CLIENT_MAX_NONCE);
   for (size_t i = ours; i < nonce_len; i++)
      if (!is_printable (nonce[i]))
         return FAIL (SCRAM_ERR_MALFORMED, "server nonce holds a character that is not printable");

   if (!take_attr (&p, end, 's', &val, &vlen))
      return FAIL (SCRAM_ERR_MALFORMED, "server-first message has no salt (s=) after r=");
   if (vlen == 0)
      return FAIL (SCRAM_ERR_MALFORMED, "salt (s=) is empty");
   if (vlen > B64_LEN (AUTHFILE_MAX_SALT))
      return FAIL (SCRAM_ERR_MALFORMED, "salt (s=) is longer than %d bytes", AUTHFILE_MAX_SALT);
   if (!authfile_b64_decode (val, vlen, salt, sizeof salt, &salt_len))
      return FAIL (SCRAM_ERR_MALFORMED, "salt (s=) is not valid base64");
   if (salt_len == 0 || salt_len > AUTHFILE_MAX_SALT)
      return FAIL (SCRAM_ERR_MALFORMED, "salt (s=) must decode to 1 to %d bytes", AUTHFILE_MAX_SALT);

   if (!take_attr (&p, end, 'i', &val, &vlen))
      return FAIL (SCRAM_ERR_MALFORMED, "server-first message has no iteration count (i=) after s=");
   if (!parse_iterations (val, vlen, &iterations))
      return FAIL (SCRAM_ERR_MALFORMED, "iteration count (i=) is not a decimal number without leading zeros");
   if (iterations < AUTHFILE_MIN_ITERATIONS)
      return FAIL (SCRAM_ERR_MALFORMED, "iteration count %u is below the minimum of %d", (unsigned) iterations,
                   AUTHFILE_MIN_ITERATIONS);
   if (iterations > AUTHFILE_MAX_ITERATIONS)
      return FAIL (SCRAM_ERR_MALFORMED, "iteration count (i=) is above the maximum of %d", AUTHFILE_MAX_ITERATIONS);
   if (p[-1] == ',' && p == end)
      return FAIL (SCRAM_ERR_MALFORMED, "server-first message ends with ','");
   if (!valid_extensions (p, end))
      return FAIL (SCRAM_ERR_MALFORMED, "server-first message has a malformed attribute after i=");

   if (!client_salted (conv, salt, salt_len, iterations, cache, salted)) {
      (void) FAIL (SCRAM_ERR_CRYPTO, "PBKDF2 failed");
      goto done;
   }
   if (!salted_keys (conv->mech, salted, client_key, stored_key, server_key)) {
      (void) FAIL (SCRAM_ERR_CRYPTO, "key derivation failed");
      goto done;
   }
   without_proof = bson_strdup_printf ("c=" CLIENT_CBIND ",r=%.*s", (int) nonce_len, nonce);
   am = auth_message_of (conv->first_bare, m, len, without_proof, strlen (without_proof));
   if (!hmac (conv->mech, stored_key, klen, am->str, am->len, sig) ||
       !hmac (conv->mech, server_key, klen, am->str, am->len, conv->server_signature)) {
      (void) FAIL (SCRAM_ERR_CRYPTO, "HMAC failed");
      goto done;
   }
   xor_bytes (proof, client_key, sig, klen);
   authfile_b64_encode (proof, klen, proof_b64, sizeof proof_b64);
   *out = bson_strdup_printf ("%s,p=%s", without_proof, proof_b64);
   *out_len = strlen (*out);
   conv->state = SCRAM_STATE_FINAL_SENT;
   ok = true;

done:
   if (am)
      bson_string_free (am, true);
   bson_free (without_proof);
   OPENSSL_cleanse (salted, sizeof salted);
   OPENSSL_cleanse (client_key, sizeof client_key);
   OPENSSL_cleanse (stored_key, sizeof stored_key);
   OPENSSL_cleanse (server_key, sizeof server_key);
   OPENSSL_cleanse (sig, sizeof sig);
   OPENSSL_cleanse (proof, sizeof proof);
   if (!ok)
      OPENSSL_cleanse (conv->server_signature, sizeof conv->server_signature);
   return ok;
}

bool
scram_client_verify (scram_client_t *conv, const uint8_t *msg, size_t len, bson_error_t *error)
{
   const char *m = (const char *) msg, *end = m + len, *p = m, *val;
   size_t vlen, got, klen = authfile_key_len (conv->mech);
   uint8_t sig[AUTHFILE_KEY_MAX + 3];
   char text[128];
   bool ok = false;

   if (!check_message (&conv->state, SCRAM_STATE_FINAL_SENT, msg, len, "server-final message", error))
      goto done;

   /* server-final = (server-error / verifier) ["," extensions] */
   if (take_attr (&p, end, 'e', &val, &vlen)) {
      /* The server's words, untrusted: valid UTF-8 already, controls
       * blanked so that they cannot forge a log line. */
      utf8_sanitize (val, vlen, text, sizeof text, UTF8_CONTROLS_AS_SPACE);
      (void) FAIL (SCRAM_ERR_AUTH_FAILED, "the server refused the authentication: e=%s", text);
      goto done;
   }
   if (!take_attr (&p, end, 'v', &val, &vlen)) {
      (void) FAIL (SCRAM_ERR_MALFORMED, "server-final message must start with v= or e=");
      goto done;
   }
   if (!authfile_b64_decode (val, vlen, sig, sizeof sig, &got) || got != klen) {
      (void) FAIL (SCRAM_ERR_MALFORMED, "server signature (v=) is not base64 of a %s digest",
                   authfile_mech_name (conv->mech));
      goto done;
   }
   if ((p[-1] == ',' && p == end) || !valid_extensions (p, end)) {
      (void) FAIL (SCRAM_ERR_MALFORMED, "server-final message has a malformed attribute after v=");
      goto done;
   }
   if (CRYPTO_memcmp (sig, conv->server_signature, klen) != 0) {
      (void) FAIL (SCRAM_ERR_AUTH_FAILED, "wrong server signature (v=): the server does not hold this user's keys");
      goto done;
   }
   conv->state = SCRAM_STATE_DONE;
   ok = true;

done:
   /* Server-final is checked once, right or wrong. */
   OPENSSL_cleanse (conv->server_signature, sizeof conv->server_signature);
   OPENSSL_cleanse (sig, sizeof sig);
   return ok;
}
