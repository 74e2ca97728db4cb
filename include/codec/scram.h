/*
 * codec/scram.h - the server side of SCRAM-SHA-256 and SCRAM-SHA-1 as
 * mongod speaks them (RFC 5802, RFC 7677), and the derivation of the keys
 * the auth file stores.
 *
 * Thread: any (pure: no I/O, no shared state).  PBKDF2 costs the entry's
 * iteration count only in scram_make_user (--make-user); a conversation
 * does two HMACs and a hash per step, so it may run on the forwarding loop.
 *
 * One scram_server_t is one conversation: feed it the client-first
 * message (saslStart's payload, or hello's speculativeAuthenticate), send
 * back what it returns (server-first), feed it client-final, and send back
 * server-final (v=ServerSignature) if it returns true.  A false return
 * fills error; the conversation is then failed and refuses further steps.
 * What mongod adds around these messages (conversationId, done, the empty
 * saslContinue, code 18 AuthenticationFailed) belongs to the caller.
 *
 * MongoDB's rules (the driver authentication specification): user names
 * are never SASLprepped; SCRAM-SHA-1 derives its keys from the hex MD5 of
 * "user:mongo:password" instead of the password; SCRAM-SHA-256 SASLpreps the
 * password.  Channel binding is not supported: the gs2 header is "n,," or
 * "y,,", nothing else.
 */
#ifndef RELAYBUS_SCRAM_H
#define RELAYBUS_SCRAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>

#include "base/authfile.h"

#define SCRAM_ERROR_DOMAIN 0x5343 /* "SC" */

/* Error codes in SCRAM_ERROR_DOMAIN. */
typedef enum {
   SCRAM_ERR_MALFORMED = 1, /* a message breaks RFC 5802's grammar or its rules */
   SCRAM_ERR_AUTH_FAILED,   /* unknown user, no entry for the mechanism, wrong proof */
   SCRAM_ERR_STATE,         /* a step out of order, or after a failure */
   SCRAM_ERR_SASLPREP,      /* a prohibited character, or non-ASCII (not implemented) */
   SCRAM_ERR_CRYPTO,        /* OpenSSL failed (no randomness, no digest) */
   SCRAM_ERR_TOO_LARGE,     /* a message beyond SCRAM_MAX_MESSAGE */
} scram_error_code_t;

/* No SCRAM message of a real client comes near this. */
#define SCRAM_MAX_MESSAGE 4096
/* Random bytes of the server's part of the nonce (base64: 32 characters). */
#define SCRAM_SERVER_NONCE_BYTES 24
/* Characters of a fixed nonce (scram_server_set_nonce). */
#define SCRAM_MAX_FIXED_NONCE 64

/* The iteration counts and salt lengths of new entries: mongod's defaults
 * (scramSHA256IterationCount, scramIterationCount; salt = digest - 4). */
#define SCRAM_SHA_256_ITERATIONS 15000
#define SCRAM_SHA_1_ITERATIONS 10000

/* States of a conversation; scram_state_name gives each a name for logs. */
typedef enum {
   SCRAM_STATE_NEW = 0,   /* waiting for client-first */
   SCRAM_STATE_FIRST_SENT, /* server-first returned, waiting for client-final */
   SCRAM_STATE_DONE,       /* the proof was right; server-final returned */
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

/* SASLprep (RFC 4013) of in[0..len) as a stored string, for ASCII: the
 * mapping and normalisation leave ASCII unchanged, and the prohibited
 * output among ASCII is the control characters (C.2.1).  Non-ASCII input
 * is refused with SCRAM_ERR_SASLPREP (its tables are not implemented), as
 * is an empty result.  Sets *out (free with bson_free). */
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
