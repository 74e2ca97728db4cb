/*
 * fuzz_scram.c - libFuzzer target for the SCRAM parsers of both sides
 * (codec/scram.c) and the auth-file parser (base/authfile.c): untrusted
 * client messages, untrusted server messages and an operator's file.
 *
 * The first byte picks the mode:
 *   0: the rest is an auth file: parsed, and every user it yields formats
 *      back into lines that parse to the same keys;
 *   1: base64: what decodes re-encodes to the same text;
 *   2, 3 (SCRAM-SHA-256), 4, 5 (SCRAM-SHA-1): the rest, up to the first
 *      '\n', is client-first, the remainder client-final, against RFC
 *      7677's user (odd modes use the RFC's fixed server nonce, so the
 *      RFC's client-final is reachable);
 *   6 (SCRAM-SHA-256), 7 (SCRAM-SHA-1): a client conversation as "user"
 *      with password "pencil" and RFC 7677's client nonce; the rest, up to
 *      the first '\n', is server-first, the remainder server-final (so
 *      RFC 7677's exchange is reachable in mode 6).
 * Oracles: a refused step leaves the conversation failed with a SCRAM
 * error; an accepted client-first answers "r=" + the client's nonce; an
 * accepted client-final answers "v=" + base64 and leaves it done; an
 * accepted server-first gives "c=biws,r=" + a nonce that extends the
 * client's + ",p=" + base64 of a digest, within SCRAM_MAX_MESSAGE, and
 * fills the salt cache; only an accepted server-final leaves the client
 * done.
 */
#include <string.h>

#include "base/authfile.h"
#include "codec/scram.h"
#include "fuzz_util.h"

static const char users_text[] =
   "user:SCRAM-SHA-256:4096:W22ZaJ0SNY7soEsUEjb6gQ==:WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:"
   "wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=\n"
   "user:SCRAM-SHA-1:4096:W22ZaJ0SNY7soEsUEjb6gQ==:p5z6n7Utqf+pLBkaeJk4T3eBOOA=:lRrVHyqMX+OOqGvpcvv9anlA8IQ=\n";

static void
fuzz_authfile (const uint8_t *data, size_t size)
{
   bson_error_t error;
   authfile_t *af = authfile_parse ((const char *) data, size, "fuzz", &error);

   if (!af) {
      CHECK (error.domain == AUTHFILE_ERROR_DOMAIN);
      return;
   }
   /* Every user formats to lines that parse back to the same entries. */
   for (size_t i = 0; i < authfile_count (af) && i < 64; i++) {
      const authfile_user_t *u = authfile_user_at (af, i);
      char *lines = authfile_format_user (u);
      authfile_t *again = authfile_parse (lines, strlen (lines), "fuzz-again", &error);
      CHECK (again && authfile_count (again) == 1);
      const authfile_user_t *v = authfile_lookup (again, u->name, strlen (u->name));
      CHECK (v);
      for (int m = 0; m < AUTHFILE_N_MECHS; m++) {
         const authfile_key_t *a = &u->keys[m], *b = &v->keys[m];
         size_t klen = authfile_key_len ((authfile_mech_t) m);
         CHECK (a->present == b->present);
         if (!a->present)
            continue;
         CHECK (a->iterations == b->iterations && a->salt_len == b->salt_len);
         CHECK (memcmp (a->salt, b->salt, a->salt_len) == 0);
         CHECK (memcmp (a->stored_key, b->stored_key, klen) == 0 && memcmp (a->server_key, b->server_key, klen) == 0);
      }
      authfile_destroy (again);
      bson_free (lines);
   }
   authfile_destroy (af);
}

/* What decodes re-encodes to text of the same length that decodes to the
 * same bytes (the text itself may differ in unused trailing bits). */
static void
fuzz_b64 (const uint8_t *data, size_t size)
{
   uint8_t out[1024], again[1024];
   char back[1400];
   size_t n, m;

   if (size > 1360 || !authfile_b64_decode ((const char *) data, size, out, sizeof out, &n))
      return;
   CHECK (authfile_b64_encode (out, n, back, sizeof back) == size);
   CHECK (authfile_b64_decode (back, size, again, sizeof again, &m) && m == n && memcmp (out, again, n) == 0);
}

static void
fuzz_conversation (int mode, const uint8_t *data, size_t size)
{
   static authfile_t *users;
   authfile_mech_t mech = mode < 4 ? AUTHFILE_SCRAM_SHA_256 : AUTHFILE_SCRAM_SHA_1;
   const uint8_t *nl = memchr (data, '\n', size);
   size_t first_len = nl ? (size_t) (nl - data) : size;
   bson_error_t error;
   scram_server_t *conv;
   char *out = NULL;
   size_t out_len;

   if (!users) {
      users = authfile_parse (users_text, strlen (users_text), "fuzz", &error);
      CHECK (users);
   }
   conv = scram_server_new (mech);
   if (mode % 2 == 1)
      CHECK (scram_server_set_nonce (conv, "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0", &error));
   if (!scram_server_first (conv, users, data, first_len, &out, &out_len, &error)) {
      CHECK (out == NULL && error.domain == SCRAM_ERROR_DOMAIN);
      CHECK (scram_server_state (conv) == SCRAM_STATE_FAILED);
      goto done;
   }
   CHECK (out_len == strlen (out) && strncmp (out, "r=", 2) == 0);
   CHECK (scram_server_state (conv) == SCRAM_STATE_FIRST_SENT);
   CHECK (strcmp (scram_server_user (conv), "user") == 0);
   bson_free (out);
   out = NULL;
   if (!nl)
      goto done;
   if (!scram_server_final (conv, nl + 1, size - first_len - 1, &out, &out_len, &error)) {
      CHECK (out == NULL && error.domain == SCRAM_ERROR_DOMAIN);
      CHECK (scram_server_state (conv) == SCRAM_STATE_FAILED);
      goto done;
   }
   CHECK (strncmp (out, "v=", 2) == 0 && out_len == 2 + 4 * ((authfile_key_len (mech) + 2) / 3));
   CHECK (scram_server_state (conv) == SCRAM_STATE_DONE);

done:
   bson_free (out);
   scram_server_destroy (conv);
}

/* True when server-first's i= could hold more than five digits: PBKDF2 at
 * up to 10,000,000 iterations costs a second an input, which would starve
 * the fuzzer.  Crude on purpose (any ",i=" followed by six digits), so it
 * skips a superset; the count's bounds are unit-tested (test_scram.c). */
static bool
costly_count (const uint8_t *data, size_t size)
{
   for (size_t i = 0; i + 3 <= size; i++) {
      size_t digits = 0;
      if (data[i] != ',' || data[i + 1] != 'i' || data[i + 2] != '=')
         continue;
      while (i + 3 + digits < size && data[i + 3 + digits] >= '0' && data[i + 3 + digits] <= '9')
         digits++;
      if (digits > 5)
         return true;
   }
   return false;
}

static void
fuzz_client (int mode, const uint8_t *data, size_t size)
{
   /* Kept across inputs, as pooled mode keeps one per upstream user: most
    * mutations keep the salt and count, so most inputs hit it. */
   static scram_salt_cache_t cache;
   static const char nonce[] = "rOprNGfwEbeRWgbNEkqO";
   authfile_mech_t mech = mode == 6 ? AUTHFILE_SCRAM_SHA_256 : AUTHFILE_SCRAM_SHA_1;
   size_t klen = authfile_key_len (mech), b64 = 4 * ((klen + 2) / 3);
   const uint8_t *nl = memchr (data, '\n', size);
   size_t first_len = nl ? (size_t) (nl - data) : size;
   bson_error_t error;
   scram_client_t *conv;
   char *out = NULL;
   size_t out_len;

   if (costly_count (data, first_len))
      return;
   conv = scram_client_new (mech, "user", "pencil", &error);
   CHECK (conv);
   CHECK (scram_client_set_nonce (conv, nonce, &error));
   CHECK (scram_client_first (conv, &out, &out_len, &error));
   CHECK (strcmp (out, "n,,n=user,r=rOprNGfwEbeRWgbNEkqO") == 0 && out_len == strlen (out));
   bson_free (out);
   out = NULL;

   if (!scram_client_final (conv, data, first_len, &cache, &out, &out_len, &error)) {
      CHECK (out == NULL && error.domain == SCRAM_ERROR_DOMAIN);
      CHECK (scram_client_state (conv) == SCRAM_STATE_FAILED && !scram_client_done (conv));
      goto done;
   }
   /* "c=biws,r=" NONCE ",p=" PROOF, NONCE extending the client's. */
   CHECK (out_len == strlen (out) && out_len <= SCRAM_MAX_MESSAGE);
   CHECK (strncmp (out, "c=biws,r=rOprNGfwEbeRWgbNEkqO", 29) == 0 && out[29] != ',');
   const char *proof = strstr (out, ",p=");
   CHECK (proof && strchr (out + 9, ',') == proof && strlen (proof + 3) == b64);
   /* ... and NONCE is server-first's r=, which comes first. */
   size_t nonce_len = (size_t) (proof - (out + 9));
   CHECK (first_len > 2 + nonce_len && memcmp (data, "r=", 2) == 0 && memcmp (data + 2, out + 9, nonce_len) == 0 &&
          data[2 + nonce_len] == ',');
   CHECK (scram_client_state (conv) == SCRAM_STATE_FINAL_SENT);
   CHECK (cache.valid && cache.mech == mech && cache.iterations >= AUTHFILE_MIN_ITERATIONS &&
          cache.iterations <= AUTHFILE_MAX_ITERATIONS && cache.salt_len >= 1 && cache.salt_len <= AUTHFILE_MAX_SALT);
   if (!nl)
      goto done;
   if (!scram_client_verify (conv, nl + 1, size - first_len - 1, &error)) {
      CHECK (error.domain == SCRAM_ERROR_DOMAIN);
      CHECK (scram_client_state (conv) == SCRAM_STATE_FAILED && !scram_client_done (conv));
      goto done;
   }
   CHECK (scram_client_done (conv) && scram_client_state (conv) == SCRAM_STATE_DONE);
   CHECK (size - first_len - 1 >= 2 + b64 && memcmp (nl + 1, "v=", 2) == 0);

done:
   bson_free (out);
   scram_client_destroy (conv);
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
   if (size < 1)
      return 0;
   switch (data[0] % 8) {
   case 0:
      fuzz_authfile (data + 1, size - 1);
      break;
   case 1:
      fuzz_b64 (data + 1, size - 1);
      break;
   case 6:
   case 7:
      fuzz_client (data[0] % 8, data + 1, size - 1);
      break;
   default:
      fuzz_conversation (data[0] % 8, data + 1, size - 1);
      break;
   }
   return 0;
}
