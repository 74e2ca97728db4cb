/*
 * publish/inject.h - the outbox writes added to a client's transaction.
 *
 * Thread: any (pure; publish/publish.c runs it on the forwarding loop).
 *
 * Given the events of one annotated statement (or of a relaybusPublish) and
 * the statement's transaction fields, an inject_job_t plans the commands the
 * proxy runs on the client's own upstream connection, in the same
 * transaction (same lsid, txnNumber, autocommit: false; never
 * startTransaction, readConcern or writeConcern, except that a
 * relaybusPublish opening the transaction hands its own to the first
 * command), round by round:
 *
 *   READ   find the events whose id the annotation gave (dedup), only when
 *          some id was given: generated ids are fresh;
 *   SEQ    one findAndModify {$inc: {value: n}} upsert per distinct key of
 *          the new keyed events: n consecutive sequences per key;
 *   WRITE  one update of the events (upsert, $setOnInsert + $addToSet of
 *          handlers: a race on one id is a write conflict, never a duplicate
 *          key) and one insert of the deliveries (one per handler subscribed
 *          to the event's type that the event does not list yet).
 *
 * Commands of one round are independent and are sent back to back; a round
 * needs the replies of the one before.  Without keys and given ids: one
 * round trip; with keys: two; with given ids: one more.
 *
 * The job is pure: it builds bson_t commands and reads bson_t replies; the
 * caller (publish/publish.c) does the I/O.  Documents follow docs/outbox-schema.md.
 */
#ifndef RELAYBUS_INJECT_H
#define RELAYBUS_INJECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>

#include "codec/annotate.h"
#include "base/config.h"
#include "base/fleet.h"
#include "base/errors.h"
#include "base/servercodes.h"

/* Errors of inject_job_new (bson_error_t codes of INJECT_ERROR_DOMAIN). */
typedef enum {
   INJECT_ERROR_NOT_TXN = 1,     /* the command has no transaction fields */
   INJECT_ERROR_PREFIX_TOO_LONG, /* collection_prefix leaves no room for a collection name */
} inject_error_t;

/* The MongoDB error codes the publishing path reads in replies or answers
 * with itself (base/servercodes.h; server_code_name gives the codeName). */
typedef enum {
   INJECT_CODE_INTERNAL_ERROR = SERVER_INTERNAL_ERROR, /* a reply not understood, no config */
   INJECT_CODE_BAD_VALUE = SERVER_BAD_VALUE,           /* a malformed annotation, an unrouted type */
   INJECT_CODE_UNKNOWN_ERROR = SERVER_UNKNOWN_ERROR,   /* a write error without a code */
   INJECT_CODE_UNAUTHORIZED = SERVER_UNAUTHORIZED,     /* a client write to the outbox */
   INJECT_CODE_COMMAND_NOT_FOUND = SERVER_COMMAND_NOT_FOUND, /* an unknown relaybus* command */
   INJECT_CODE_INVALID_OPTIONS = SERVER_INVALID_OPTIONS, /* publishing outside a transaction (no driver
                                                          * rewrites 72; the Node.js driver replaces any
                                                          * 20 of a write) */
   INJECT_CODE_WRITE_CONFLICT = SERVER_WRITE_CONFLICT, /* retry the transaction */
   INJECT_CODE_NO_SUCH_TRANSACTION = SERVER_NO_SUCH_TRANSACTION, /* aborted (a refused commit) */
   INJECT_CODE_TEMPORARILY_UNAVAILABLE = SERVER_TEMPORARILY_UNAVAILABLE, /* the poisoned table is full */
   INJECT_CODE_BSON_OBJECT_TOO_LARGE = SERVER_BSON_OBJECT_TOO_LARGE,
   INJECT_CODE_DUPLICATE_KEY = SERVER_DUPLICATE_KEY,
   INJECT_CODE_DOCUMENT_TOO_LARGE = SERVER_DOCUMENT_TOO_LARGE,
} inject_code_t;

/* Most handlers one event gets deliveries for: the local ones and as many
 * more of the fleet's live set. */
#define INJECT_MAX_HANDLERS (CONFIG_MAX_HANDLERS + FLEET_MAX_HANDLERS)

/* Most commands in one round: one findAndModify per distinct key. */
#define INJECT_MAX_ROUND_COMMANDS ANNOTATE_MAX_EVENTS

typedef enum {
   INJECT_PHASE_READ = 0,
   INJECT_PHASE_SEQ,
   INJECT_PHASE_WRITE,
   INJECT_PHASE_DONE,
   INJECT_PHASE_COUNT_
} inject_phase_t;

/* "read", "seq", "write", "done". */
const char *inject_phase_name (inject_phase_t phase);

typedef enum {
   INJECT_TXN_YES = 0,       /* lsid, txnNumber and autocommit: false */
   INJECT_TXN_NO,            /* not a transaction statement */
   INJECT_TXN_STARTS,        /* yes, and it carries startTransaction: true */
} inject_txn_t;

/* Does the command run inside a multi-document transaction? */
inject_txn_t inject_txn_of (const bson_t *cmd);

/* True for a reply that reports failure: `ok` not 1, or `writeErrors`. */
bool inject_reply_failed (const bson_t *reply);

/* Appends the cluster time fields of a reply ($clusterTime, operationTime)
 * to out, so an answer the proxy makes up still lets the driver advance its
 * cluster time. */
void inject_copy_times (const bson_t *reply, bson_t *out);

/* Appends the fields `names[0..n)` that `src` has to `out`, in the order
 * of `names` (not of `src`). */
void inject_copy_fields (const bson_t *src, const char *const *names, size_t n, bson_t *out);

/* The code and errmsg of a reply or write error document (0 and "" when
 * absent; `errmsg` points into `reply`). */
int32_t inject_reply_error (const bson_t *reply, const char **errmsg);

/* Appends {ok: 0, errmsg, code, codeName} to `out`, and errorLabels:
 * [TransientTransactionError] with `transient` (a retry of the whole
 * transaction is the right answer, as for the server's own). */
void inject_error_reply (bson_t *out, int32_t code, const char *code_name, const char *errmsg, bool transient);

/* An abortTransaction for the transaction of statement `cmd`: its lsid,
 * txnNumber, autocommit: false and API parameters, which must match the
 * transaction's.  `out` is initialised. */
void inject_abort_command (const bson_t *cmd, bson_t *out);

typedef struct inject_job inject_job_t;

/* Creates a job for the events in `ann` (moved into the job: `ann` is left
 * empty, and the job cleans the events up) of the
 * transaction statement `cmd` (lsid, txnNumber and API parameters are
 * copied).  With `opens_txn` (a relaybusPublish that starts the
 * transaction), the first command also carries the statement's
 * startTransaction, readConcern and $clusterTime.  Retains `cfg` for the
 * outbox names and the handlers.  `now_ms` is the proxy clock's time for
 * createdAt and dueAt.  NULL with `error` when the command has no
 * transaction fields. */
inject_job_t *inject_job_new (annotate_t *ann,
                              const bson_t *cmd,
                              bool opens_txn,
                              config_t *cfg,
                              int64_t now_ms,
                              bson_error_t *error) __attribute__ ((warn_unused_result));

/* Deliveries are also written for the handlers of `fleet` (the fleet's
 * live set, retained by the job; NULL: local handlers only) that subscribe
 * to an event's type and that the local config does not have.  Call before
 * the first round. */
void inject_job_set_fleet (inject_job_t *job, fleet_set_t *fleet);

/* Plans the next round; returns how many commands it has (0: the job is
 * finished or failed).  Call only after every reply of the previous round
 * was given. */
uint32_t inject_job_next_round (inject_job_t *job);
inject_phase_t inject_job_phase (const inject_job_t *job);
const bson_t *inject_job_command (const inject_job_t *job, uint32_t i);

/* Gives the reply to command `i` of the current round.  Every reply must be
 * given, failures included; after the first failure the others are ignored. */
void inject_job_reply (inject_job_t *job, uint32_t i, const bson_t *reply);

/* True once a reply failed (or had an unexpected shape).  `client_reply`
 * is what the client gets instead of its statement's reply: the failing
 * reply itself for `ok: 0` (code and labels kept, e.g. WriteConflict with
 * TransientTransactionError), or an {ok: 0, code, codeName, errmsg} made
 * from a write error or a malformed reply.  Valid until destroy. */
bool inject_job_failed (const inject_job_t *job, const bson_t **client_reply);

/* inject_abort_command for the job's transaction: after a failure the proxy sends it
 * so that no later commit can keep the business write without its events.
 * `out` is initialised. */
void inject_job_abort_command (const inject_job_t *job, bson_t *out);

/* Appends the events' ids, in order, as an array named `key`. */
bool inject_job_append_ids (const inject_job_t *job, bson_t *doc, const char *key)
   __attribute__ ((warn_unused_result));

/* Counters for logs, metrics and the benchmark. */
uint32_t inject_job_rounds (const inject_job_t *job);
uint32_t inject_job_commands (const inject_job_t *job);
uint32_t inject_job_deliveries (const inject_job_t *job);
uint32_t inject_job_n_events (const inject_job_t *job);

/* Frees the job, its events and its reference on the config.  NULL ok. */
void inject_job_destroy (inject_job_t *job);

#endif /* RELAYBUS_INJECT_H */
