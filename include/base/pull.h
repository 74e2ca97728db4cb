/*
 * base/pull.h - the pull consumers' virtual commands as plain data: what
 * relaybusClaim, relaybusComplete, relaybusRetry, relaybusBury,
 * relaybusExtend, relaybusRelease and relaybusStatus {handler} ask for,
 * parsed and validated, and the consumer's lease strings.
 *
 * Thread: any (pure functions; the caller passes the configuration).
 *
 * Two layers meet here without depending on each other: publish/pull.c
 * parses and validates a command on the forwarding loop, and
 * dispatch/consumer.c runs the request on its own thread with the store.
 * A request (pull_req_t) is the only thing that crosses between them, so it
 * lives in base, which both may include.
 *
 * A consumer's lease names one claimed delivery: the store's lease token
 * "<laneId>:<epoch>:<claims>" (base/outbox.h), then ":" and the delivery's
 * id in 24 hex digits.  The token alone does not name a delivery: the
 * deliveries of one lane claimed together share the lane's epoch and may
 * share a claim generation.
 *
 * Not here: the store calls (dispatch/consumer.c) and the routing of the
 * commands on the loop (publish/pull.c).
 */
#ifndef RELAYBUS_BASE_PULL_H
#define RELAYBUS_BASE_PULL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>

#include "base/config.h"
#include "base/outbox.h"
#include "base/errors.h"
#include "base/servercodes.h"

/* The codes a refused pull command answers with (bson_error_t codes of
 * PULL_ERROR_DOMAIN are the server codes of the reply): the server's
 * (base/servercodes.h), and two of the proxy's own, 9010 and 9011, in a
 * range the server does not use. */
typedef enum {
   PULL_CODE_BAD_VALUE = SERVER_BAD_VALUE,       /* a field is missing or wrong */
   PULL_CODE_UNAUTHORIZED = SERVER_UNAUTHORIZED, /* the connection may not read the outbox */
   PULL_CODE_NO_SUCH_LEASE = 9010,               /* RelaybusLeaseNotHeld: a lease this connection does not hold */
   PULL_CODE_LEASE_LOST = 9011, /* RelaybusLeaseLost: in a transaction, the store no longer has the claim */
   PULL_CODE_IN_TRANSACTION = SERVER_OPERATION_NOT_SUPPORTED_IN_TRANSACTION,
   PULL_CODE_TEMPORARILY_UNAVAILABLE = SERVER_TEMPORARILY_UNAVAILABLE, /* a bounded queue is full */
   PULL_CODE_INTERNAL = SERVER_INTERNAL_ERROR,                         /* the store failed */
} pull_code_t;

const char *pull_code_name (pull_code_t code);

typedef enum {
   PULL_CLAIM = 0,
   PULL_COMPLETE,
   PULL_RETRY,
   PULL_BURY,
   PULL_EXTEND,
   PULL_RELEASE,
   PULL_STATUS, /* relaybusStatus: "<handler>" */
   PULL_OP_COUNT_
} pull_op_t;

/* The command name of each operation ("relaybusClaim", ...). */
const char *pull_op_name (pull_op_t op);
/* True when the command is one of the pull commands: relaybusClaim and the
 * settling ones, and relaybusStatus whose value is a string (the
 * per-handler form; relaybusStatus: 1 is publish's own answer). */
bool pull_is_command (const char *cmd, const bson_t *body);

/* Bounds of the fields. */
#define PULL_MAX_LIMIT 1000            /* relaybusClaim limit */
#define PULL_LEASE_MS_MIN 1000          /* leaseMs, as [dispatch] lease_ms */
#define PULL_LEASE_MS_MAX 3600000
#define PULL_LEASE_MS_DEFAULT 30000
#define PULL_MAX_AWAIT_MS 60000         /* maxAwaitTimeMS */
#define PULL_MAX_LEASES 1000            /* leases of one command */
#define PULL_CONSUMER_MAX 128           /* bytes of a consumer name */
#define PULL_ERROR_TEXT_MAX 1024        /* bytes of a retry's or burial's error kept */
/* "<laneId>:<epoch>:<claims>:<24 hex>" and its NUL. */
#define PULL_LEASE_MAX (OUTBOX_LEASE_TOKEN_MAX + 1 + 24)

typedef struct {
   char text[PULL_LEASE_MAX];          /* as the consumer sent it */
   char token[OUTBOX_LEASE_TOKEN_MAX]; /* the store's part */
   bson_oid_t id;                      /* the delivery */
} pull_lease_t;

/* One request, owned by whoever holds it: the loop until it is handed to
 * the consumer thread, then that thread, which frees it with
 * pull_req_destroy. */
typedef struct pull_req {
   pull_op_t op;
   uint64_t conn; /* the client connection's id */
   uint32_t loop; /* the index of the forwarding loop that owns it: answers go there */
   uint64_t seq;  /* its held request (client_hold_request) */
   char handler[128];
   int64_t limit;    /* claim */
   int64_t lease_ms; /* claim, extend */
   int64_t await_ms; /* claim: maxAwaitTimeMS, 0: answer at once */
   int64_t delay_ms; /* retry: -1: the handler's retry_schedule */
   char consumer[PULL_CONSUMER_MAX];
   char *error_text; /* retry, bury: may be NULL */
   bool in_txn;      /* complete: sent in the consumer's transaction; the consumer
                      * only checks that the leases are held (publish/pulltxn.h
                      * writes the completion in the transaction) */
   pull_lease_t *leases;
   size_t n_leases;
   struct pull_req *next; /* the consumer's queues */
} pull_req_t;

/* Parses and validates `body`, the command `cmd` (a pull command), against
 * the handlers of `cfg`.  The error message names the field; its code is
 * a pull_code_t.  *out is the new request (conn and seq zero). */
bool pull_parse (const char *cmd, const bson_t *body, const config_t *cfg, pull_req_t **out, bson_error_t *error)
   __attribute__ ((warn_unused_result));
void pull_req_destroy (pull_req_t *r);

/* A consumer's lease string for a delivery claimed under `token`. */
void pull_lease_format (const char *token, const bson_oid_t *id, char out[PULL_LEASE_MAX]);
/* Strict: the store's token (outbox_lease_parse) and 24 hex digits. */
bool pull_lease_parse (const char *text, pull_lease_t *out) __attribute__ ((warn_unused_result));

/* The configured handler the command's value names, or NULL (not a
 * string, or no such handler: pull_parse says which). */
const config_handler_t *pull_handler_named (const bson_t *body, const config_t *cfg);

/* Does handler `h`'s `consumers` list admit a connection whose user is
 * `user` (NULL: none known) with database `db` (NULL in pooled mode:
 * auth-file users have none)?  Without a list, every connection is
 * admitted.  An entry USER names an auth-file user in pooled mode and a
 * user of the admin database in session mode; an entry DB.USER a user of
 * database DB (session mode), as MongoDB names users in system.users. */
bool pull_consumer_admitted (const config_handler_t *h, const char *user, const char *db);

/* Whether `user` (of `db`, NULL: admin) may read the outbox collections
 * in pooled mode: named in [outbox] readers or in any handler's
 * `consumers`; with neither list set, everyone may. */
bool pull_outbox_reader (const config_t *cfg, const char *user, const char *db);

/* {ok: 0, errmsg, code, codeName} into `doc` (initialised). */
void pull_error_reply (bson_t *doc, pull_code_t code, const char *errmsg);
/* The same with the message formatted (cut at 511 bytes), for the
 * printf-like answers of the two sides of a pull request. */
void pull_error_replyv (bson_t *doc, pull_code_t code, const char *fmt, va_list ap) __attribute__ ((format (printf, 3, 0)));

#endif /* RELAYBUS_BASE_PULL_H */
