/*
 * codec/sasl.h - who a session-mode connection authenticated as, read from
 * the SASL conversation the proxy relays between its client and the
 * server.
 *
 * Thread: any (pure: no I/O, no shared state; one sasl_watch_t belongs to
 * one connection, proxy/pump.c's, on its forwarding loop).
 *
 * In session mode the server authenticates the client; the proxy only
 * relays the conversation.  To know the user (the `consumers` list of a
 * pull handler, docs/consumers.md), the proxy reads two things of it:
 * the user a conversation is for, from the client's saslStart (or a hello's
 * speculativeAuthenticate): the n= of the SCRAM client-first message
 * "n,,n=USER,r=NONCE" (RFC 5802, ',' and '=' escaped as "=2C" and "=3D")
 * and the command's database; and the server's verdict, the reply that
 * ends the conversation: {done: true, ok: 1} records the user, an ok: 0
 * records nothing and ends the conversation.  A MONGODB-X509 authenticate
 * names its user (the certificate's subject) itself, and its ok: 1 records
 * it (proxy/pump.c refuses X.509 before it is relayed today: client
 * connections present no certificate upstream).
 *
 * Only the verdict decides: the proxy checks no proof, it believes the
 * server that did.  So the watch must never pair a verdict with another
 * conversation's user: drivers send one SASL command at a time and wait
 * for its reply, and a second SASL command sent while one waits (a
 * pipelined login) puts the watch in SASL_WATCH_LOST for good, which
 * records nothing more and forgets the user.  A logout forgets it too.
 *
 * Not here: the relay (proxy/pump.c), the proxy's own SCRAM server for
 * pooled mode (codec/scram.h, proxy/login.h).
 */
#ifndef RELAYBUS_CODEC_SASL_H
#define RELAYBUS_CODEC_SASL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>

#include "base/errors.h"

/* Error codes in SASL_ERROR_DOMAIN. */
typedef enum {
   SASL_ERR_MALFORMED = 1, /* not a SCRAM client-first message */
   SASL_ERR_TOO_LONG,      /* the user name does not fit the caller's buffer */
} sasl_error_code_t;

/* Bytes of a user name and of a database name the watch keeps (MongoDB's
 * own bounds are lower: user names are not limited, but a database name
 * is at most 64 bytes; a longer user is recorded as nobody). */
#define SASL_USER_MAX 256
#define SASL_DB_MAX 128

/* Reads the user of a SCRAM client-first message msg[0..len) ("n,,n=USER,
 * r=..." or "y,,..."), unescaping "=2C" and "=3D", into user (NUL-
 * terminated, at most user_len - 1 bytes).  False (error set) for a
 * message that is not one, an empty name, '=' not followed by 2C or 3D,
 * a NUL byte, or a name that does not fit. */
/* The string or binary field `name` of a SASL command (its "payload",
 * which drivers send as binary and mongosh's older versions as a string):
 * borrowed from `doc`.  False when the field is missing or of another type. */
bool sasl_payload (const bson_t *doc, const char *name, const uint8_t **data, uint32_t *len);

bool sasl_client_first_user (const uint8_t *msg, size_t len, char *user, size_t user_len, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* The states of a watch. */
typedef enum {
   SASL_WATCH_IDLE = 0,     /* no conversation, or between its steps */
   SASL_WATCH_STARTED,      /* a saslStart (or hello's speculativeAuthenticate) waits for its reply */
   SASL_WATCH_CONVERSING,   /* the server took the start; its end has not come */
   SASL_WATCH_CONTINUED,    /* a saslContinue waits for its reply */
   SASL_WATCH_AUTHENTICATE, /* an X.509 authenticate waits for its reply */
   SASL_WATCH_LOST,         /* a SASL command was pipelined: nothing is recorded any more */
   SASL_WATCH_N_STATES,
} sasl_watch_state_t;

/* One connection's watch.  Zero-initialised it is IDLE with no user. */
typedef struct {
   sasl_watch_state_t state;
   char pending_user[SASL_USER_MAX]; /* of the conversation in progress; "" when not understood */
   char pending_db[SASL_DB_MAX];
   char user[SASL_USER_MAX]; /* the accepted user; "" none */
   char db[SASL_DB_MAX];
} sasl_watch_t;

/* The watch can no longer tell what the server thinks of the connection
 * (a SASL command sent with moreToCome, a reply it cannot read): it
 * forgets the user and records none from now on (SASL_WATCH_LOST). */
void sasl_watch_lose (sasl_watch_t *w);

/* Is `cmd` (a command name, or NULL) one the watch reads: saslStart,
 * saslContinue, authenticate, logout?  Cheap: a first-letter test first. */
bool sasl_watch_wants (const char *cmd);

/* Client command `cmd` (sasl_watch_wants) with `body` is relayed; `db` is
 * its $db.  Returns whether its reply must be shown to
 * sasl_watch_reply (false for logout, which forgets the user at once, and
 * in SASL_WATCH_LOST). */
bool sasl_watch_request (sasl_watch_t *w, const char *cmd, const bson_t *body, const char *db);

/* A hello with speculativeAuthenticate `spec` (its document) is relayed;
 * returns whether the hello's reply must be shown to
 * sasl_watch_hello_reply. */
bool sasl_watch_hello (sasl_watch_t *w, const bson_t *spec);

/* The server's reply to what sasl_watch_request said to show. */
void sasl_watch_reply (sasl_watch_t *w, const bson_t *reply);

/* The server's reply to a hello sasl_watch_hello said to show: with
 * speculativeAuthenticate the conversation goes on (or ends accepted when
 * it says done), without it the server declined and nothing changed. */
void sasl_watch_hello_reply (sasl_watch_t *w, const bson_t *reply);

#endif /* RELAYBUS_CODEC_SASL_H */
