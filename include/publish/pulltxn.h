/*
 * publish/pulltxn.h - relaybusComplete inside the consumer's transaction:
 * the completion's writes planned as commands for the client's own upstream
 * connection, in the client's transaction.
 *
 * Thread: any (pure; publish/pull.c runs it on the forwarding loop).
 *
 * The writes are those of the store's transactional completion
 * (store/complete.c with a session, the reference's complete(lease, now,
 * session)), in two rounds, each command carrying the statement's lsid,
 * txnNumber, autocommit: false and API parameters (and, when the
 * relaybusComplete opened the transaction, its startTransaction,
 * readConcern and $clusterTime on the first command):
 *
 *   FENCE  a find of the deliveries the leases name and a find of their
 *          lanes, read in the transaction's snapshot.  Every lease must
 *          still hold: its delivery pending in the lease's lane with the
 *          lease's claim generation, and the lane at the lease's epoch
 *          listing the delivery.  One that does not fails the whole
 *          completion with RelaybusLeaseLost (9011), no label: a retry of
 *          the transaction could never make it hold again;
 *   WRITE  the delete of the deliveries (matched by id, claim generation,
 *          lane and pending status), $max completedAt on their events, and
 *          with [outbox] completion_history one history record per
 *          delivery.
 *
 * A takeover that commits after the transaction's snapshot was taken
 * writes the same delivery documents (it charges the lost claims), so the
 * delete meets the server's own WriteConflict with TransientTransactionError
 * and the driver runs the transaction again, to find the lease lost; a
 * takeover after the delete conflicts itself and waits, then finds the
 * delivery gone.  A completion and a takeover never both succeed.
 *
 * Pure: commands are built as bson_t and replies read as bson_t; the caller
 * does the I/O.
 */
#ifndef RELAYBUS_PUBLISH_PULLTXN_H
#define RELAYBUS_PUBLISH_PULLTXN_H

#include <stdbool.h>
#include <stdint.h>

#include <bson/bson.h>

#include "base/config.h"
#include "base/pull.h"
#include "base/errors.h"

typedef enum {
   PULLTXN_ERROR_NOT_TXN = 1,     /* the command has no transaction fields */
   PULLTXN_ERROR_PREFIX_TOO_LONG, /* collection_prefix leaves no room for a name */
   PULLTXN_ERROR_BAD_LEASE,       /* a lease the store cannot have issued */
} pulltxn_error_t;

/* The most commands of one round (WRITE: delete, events, history,
 * attempt records). */
#define PULLTXN_MAX_ROUND_COMMANDS 4

typedef enum {
   PULLTXN_PHASE_FENCE = 0,
   PULLTXN_PHASE_WRITE,
   PULLTXN_PHASE_DONE,
} pulltxn_phase_t;

typedef struct pulltxn pulltxn_t;

/* A completion of the leases of `r` (a relaybusComplete; copied) for the
 * transaction statement `cmd` (its transaction fields are copied; with
 * startTransaction, the first command opens the transaction).  Retains
 * `cfg` for the outbox names and completion_history.  `now_ms`: the
 * proxy clock's time for completedAt.  NULL with `error` when `cmd` is not
 * a transaction statement or a lease does not parse. */
pulltxn_t *pulltxn_new (const pull_req_t *r, const bson_t *cmd, config_t *cfg, int64_t now_ms, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* What the consumer thread answered when it checked the leases (its
 * `claimedAt`, one date per lease, and `instance`): the attempts'
 * records the WRITE round inserts, with [outbox] attempt_history, start
 * when each lease was handed out and name that instance.  Without it (or
 * with fewer dates) a record has no start.  Call before the WRITE round. */
void pulltxn_set_claims (pulltxn_t *t, const bson_t *checked);

/* Plans the next round; returns its number of commands (0: finished or
 * failed).  Call only after every reply of the round before was given. */
uint32_t pulltxn_next_round (pulltxn_t *t);
pulltxn_phase_t pulltxn_phase (const pulltxn_t *t);
const bson_t *pulltxn_command (const pulltxn_t *t, uint32_t i);

/* Gives the reply to command `i` of the current round; every reply must be
 * given.  After the first failure the others are ignored. */
void pulltxn_reply (pulltxn_t *t, uint32_t i, const bson_t *reply);

/* True once the completion failed.  `client_reply` is what the client gets:
 * the server's own failing reply (code and labels kept: a WriteConflict
 * stays TransientTransactionError), an error made from a write error, or
 * RelaybusLeaseLost when a lease no longer holds.  Valid until destroy. */
bool pulltxn_failed (const pulltxn_t *t, const bson_t **client_reply);

/* After success: {ok: 1, completed: [every lease], notCompleted: []} and
 * the cluster time of the last reply.  `out` is initialised. */
void pulltxn_answer (const pulltxn_t *t, bson_t *out);

/* abortTransaction for the completion's transaction.  `out` is initialised. */
void pulltxn_abort_command (const pulltxn_t *t, bson_t *out);

/* Was anything sent yet that opened or joined the transaction on the
 * server?  (A completion that opens the transaction and fails before its
 * first command leaves nothing to abort.) */
bool pulltxn_opened (const pulltxn_t *t);

void pulltxn_destroy (pulltxn_t *t);

#endif /* RELAYBUS_PUBLISH_PULLTXN_H */
