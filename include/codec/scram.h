/*
 * codec/scram.h - both sides of SCRAM-SHA-256 and SCRAM-SHA-1 as mongod
 * speaks them (RFC 5802, RFC 7677): the server side, for clients that
 * authenticate at the proxy; the client side, for the proxy's own
 * connections to mongod (pooled mode's upstream user); and the derivation
 * of the keys the auth file stores.
 *
 * Thread: any (pure: no I/O, no shared state).  PBKDF2 costs the entry's
 * iteration count (10-20 ms at mongod's) only in scram_make_user
 * (--make-user) and in scram_client_final when its salt cache misses; a
 * server conversation does two HMACs and a hash per step, so it may run on
 * the forwarding loop.
 *
 * One scram_server_t is one conversation: feed it the client-first
 * message (saslStart's payload, or hello's speculativeAuthenticate), send
 * back what it returns (server-first), feed it client-final, and send back
 * server-final (v=ServerSignature) if it returns true.  A false return
 * fills error; the conversation is then failed and refuses further steps.
 * What mongod adds around these messages (conversationId, done, the empty
 * saslContinue, code 18 AuthenticationFailed) belongs to the caller.
 *
 * One scram_client_t is the other end: scram_client_first gives
 * client-first, scram_client_final turns server-first into client-final,
 * and scram_client_verify checks server-final, which proves the server
 * knows the password too.  Every server message is untrusted input.  The
 * same rules apply: a false return fails the conversation, and the SASL
 * commands around the messages (saslStart, saslContinue, the empty last
 * saslContinue mongod may ask for) belong to the caller.
 *
 * MongoDB's rules (the driver authentication specification): user names
 * are never SASLprepped; SCRAM-SHA-1 derives its keys from the hex MD5 of
 * "user:mongo:password" instead of the password; SCRAM-SHA-256 SASLpreps the
 * password.  Channel binding is not supported: the gs2 header is "n,," or
 * "y,,", nothing else (the client always sends "n,,").
 */
#ifndef RELAYBUS_SCRAM_H
#define RELAYBUS_SCRAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>

#include "base/authfile.h"
#include "base/errors.h"

/* Error codes in SCRAM_ERROR_DOMAIN. */
typedef enum {
   SCRAM_ERR_MALFORMED = 1, /* a message breaks RFC 5802's grammar or its rules */
   SCRAM_ERR_AUTH_FAILED,   /* unknown user, no entry for the mechanism, wrong proof */
   SCRAM_ERR_STATE,         /* a step out of order, or after a failure */
   SCRAM_ERR_SASLPREP,      /* SASLprep refused the string (prohibited character, bidi rule, unassigned, empty) */
   SCRAM_ERR_CRYPTO,        /* OpenSSL failed (no randomness, no digest) */
   SCRAM_ERR_TOO_LARGE,     /* a message beyond SCRAM_MAX_MESSAGE */
} scram_error_code_t;

/* No SCRAM message of a real client comes near this. */
#define SCRAM_MAX_MESSAGE 4096
/* Random bytes of the server's part of the nonce (base64: 32 characters). */
#define SCRAM_SERVER_NONCE_BYTES 24
/* Random bytes of the client's nonce (base64: 32 characters), as drivers. */
#define SCRAM_CLIENT_NONCE_BYTES 24
/* Characters of a fixed nonce (scram_server_set_nonce, scram_client_set_nonce). */
#define SCRAM_MAX_FIXED_NONCE 64

/* The iteration counts and salt lengths of new entries: mongod's defaults
 * (scramSHA256IterationCount, scramIterationCount; salt = digest - 4). */
#define SCRAM_SHA_256_ITERATIONS 15000
#define SCRAM_SHA_1_ITERATIONS 10000

/* States of a conversation, either side; scram_state_name gives each a
 * name for logs. */
typedef enum {
   SCRAM_STATE_NEW = 0,    /* server: waiting for client-first; client: client-first not made yet */
   SCRAM_STATE_FIRST_SENT, /* server: server-first returned, waiting for client-final;
                              client: client-first returned, waiting for server-first */
   SCRAM_STATE_FINAL_SENT, /* client only: client-final returned, waiting for server-final */
   SCRAM_STATE_DONE,       /* server: the proof was right, server-final returned;
                              client: the server's signature was right */
   SCRAM_STATE_FAILED,     /* a step failed; nothing more is accepted */
   SCRAM_N_STATES,
} scram_state_t;

typedef struct scram_server scram_server_t;

const char *scram_state_name (scram_state_t state);

/* A conversation for `mech`.  The caller owns it and frees it with
 * scram_server_destroy (which clears its secrets). */
scram_server_t *scram_server_new (authfile_mech_t mech);
void scram_server_destroy (scram_server_t *conv);

/* Uses `nonce` (printable ASCII without ',', 1..SCRAM_MAX_FIXED_NONCE
 * characters) as the server's part of the nonce instead of random bytes:
 * for fixed test vectors only.  Before scram_server_first. */
bool scram_server_set_nonce (scram_server_t *conv, const char *nonce, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* Step 1: parses client-first msg[0..len), looks its user up in `users`
 * (which must outlive the conversation) and sets *out (NUL-terminated,
 * *out_len bytes, free with bson_free) to server-first. */
bool scram_server_first (scram_server_t *conv, const authfile_t *users, const uint8_t *msg, size_t len,
                         char **out, size_t *out_len, bson_error_t *error) __attribute__ ((warn_unused_result));

/* Step 2: verifies client-final msg[0..len); on a right proof sets *out to
 * server-final ("v=...") and the state to SCRAM_STATE_DONE. */
bool scram_server_final (scram_server_t *conv, const uint8_t *msg, size_t len, char **out, size_t *out_len,
                         bson_error_t *error) __attribute__ ((warn_unused_result));

scram_state_t scram_server_state (const scram_server_t *conv);
authfile_mech_t scram_server_mech (const scram_server_t *conv);
/* The user name of client-first (unescaped), or NULL before it; once the
 * state is SCRAM_STATE_DONE, the authenticated user. */
const char *scram_server_user (const scram_server_t *conv);

/* ---- the client side ---- */

typedef struct scram_client scram_client_t;

/* The salted password Hi(password', salt, i) of one (mechanism, salt,
 * iterations).  PBKDF2 costs 10-20 ms at mongod's iteration counts, so the
 * caller keeps one of these per upstream user and passes it to each of
 * that user's conversations: scram_client_final reuses `salted` when the
 * server's salt and count match and refills the cache when they do not.
 *
 * Caller-owned; zero-initialised it is empty.  It belongs to one user
 * name and password: the caller empties it (scram_salt_cache_clear) when
 * they change, and serialises access (the codec has no shared state).
 * `salted` is a secret (it is enough to authenticate as the user), so
 * clear the cache before its memory is given back. */
typedef struct {
   bool valid;
   authfile_mech_t mech;
   uint32_t iterations;
   size_t salt_len;
   uint8_t salt[AUTHFILE_MAX_SALT];
   uint8_t salted[AUTHFILE_KEY_MAX]; /* authfile_key_len (mech) bytes */
} scram_salt_cache_t;

/* Empties the cache and wipes its secret (NULL ok). */
void scram_salt_cache_clear (scram_salt_cache_t *cache);

/* A conversation for `mech` as `user` with `password`, prepared as
 * MongoDB does: SCRAM-SHA-1 uses the hex MD5 of "user:mongo:password",
 * SCRAM-SHA-256 scram_saslprep's the password (a password SASLprep
 * refuses is SCRAM_ERR_SASLPREP).  The user name (1..AUTHFILE_MAX_NAME bytes of
 * UTF-8) is escaped for n= (',' as "=2C", '=' as "=3D"), never SASLprepped.
 * The password (1..AUTHFILE_MAX_PASSWORD bytes) is not kept, only what
 * it was prepared into.  Returns NULL and fills error for a user or
 * password it refuses.  The caller owns the conversation and frees it
 * with scram_client_destroy (which clears its secrets). */
scram_client_t *scram_client_new (authfile_mech_t mech, const char *user, const char *password, bson_error_t *error)
   __attribute__ ((warn_unused_result));
void scram_client_destroy (scram_client_t *conv);

/* Uses `nonce` (printable ASCII without ',', 1..SCRAM_MAX_FIXED_NONCE
 * characters) as the client nonce instead of random bytes: for fixed test
 * vectors only.  Before scram_client_first. */
bool scram_client_set_nonce (scram_client_t *conv, const char *nonce, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* Step 1: sets *out (NUL-terminated, *out_len bytes, free with bson_free)
 * to client-first, "n,,n=USER,r=NONCE" (NONCE: SCRAM_CLIENT_NONCE_BYTES
 * random bytes in base64, from RAND_bytes). */
bool scram_client_first (scram_client_t *conv, char **out, size_t *out_len, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* Step 2: parses server-first msg[0..len) and sets *out to client-final,
 * "c=biws,r=NONCE,p=PROOF" (at most SCRAM_MAX_MESSAGE bytes).  Refuses
 * (SCRAM_ERR_MALFORMED) a nonce that does not extend the client's, an
 * iteration count outside AUTHFILE_MIN_ITERATIONS..AUTHFILE_MAX_ITERATIONS,
 * a salt that is not base64 of 1..AUTHFILE_MAX_SALT bytes, a mandatory
 * extension (m=), and anything else RFC 5802's grammar does not allow; a
 * nonce too long for client-final to fit is SCRAM_ERR_TOO_LARGE.  `cache`
 * may be NULL (then every call runs PBKDF2).  On a cache miss the server
 * chooses the cost: up to AUTHFILE_MAX_ITERATIONS, about a second. */
bool scram_client_final (scram_client_t *conv, const uint8_t *msg, size_t len, scram_salt_cache_t *cache,
                         char **out, size_t *out_len, bson_error_t *error) __attribute__ ((warn_unused_result));

/* Step 3: checks server-final msg[0..len).  "v=ServerSignature" must be
 * the signature the password gives (compared in constant time), else
 * SCRAM_ERR_AUTH_FAILED: the server does not know the password.  "e=..."
 * is the server's refusal, SCRAM_ERR_AUTH_FAILED with its text (control
 * characters blanked).  On success the state is SCRAM_STATE_DONE. */
bool scram_client_verify (scram_client_t *conv, const uint8_t *msg, size_t len, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* True once scram_client_verify accepted server-final. */
bool scram_client_done (const scram_client_t *conv);
scram_state_t scram_client_state (const scram_client_t *conv);
authfile_mech_t scram_client_mech (const scram_client_t *conv);

/* ---- both sides ---- */

/* SASLprep (RFC 4013) of in[0..len) (UTF-8) as a stored string: ASCII
 * here (the mapping and normalisation leave it unchanged; its prohibited
 * characters are the controls, C.2.1), anything else through libidn's
 * "SASLprep" profile with unassigned code points refused, as the drivers
 * prepare passwords: non-ASCII spaces become ' ', soft hyphens and the
 * like vanish, NFKC composes, and prohibited characters, wrong
 * bidirectional strings, invalid UTF-8 and an empty result are refused
 * with SCRAM_ERR_SASLPREP (the message names the rule, never the input).
 * Sets *out (a secret when it is a password: clear it, free with
 * bson_free). */
bool scram_saslprep (const char *in, size_t len, char **out, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* Derives the stored entry for `mech` from a user name and password with
 * the given salt and iteration count (SCRAM-SHA-256 SASLpreps the
 * password; SCRAM-SHA-1 uses hex MD5("user:mongo:password")). */
bool scram_derive_key (authfile_mech_t mech, const char *user, const char *password, const uint8_t *salt,
                       size_t salt_len, uint32_t iterations, authfile_key_t *out, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* An auth-file user with entries for both mechanisms, random salts and
 * mongod's default iteration counts: what --make-user prints. */
bool scram_make_user (const char *name, const char *password, authfile_user_t *out, bson_error_t *error)
   __attribute__ ((warn_unused_result));

#endif /* RELAYBUS_SCRAM_H */
