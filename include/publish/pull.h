/*
 * publish/pull.h - the pull consumers' commands on the forwarding loop:
 * relaybusClaim, relaybusComplete, relaybusRetry, relaybusBury,
 * relaybusExtend, relaybusRelease and relaybusStatus {handler}.
 *
 * Thread: forwarding loop (pull_set_consumer: the main thread, before the
 * loop runs or after it stopped).
 *
 * publish/publish.c routes these commands here (pull_is_command of
 * base/pull.h).  Each is held in the client's order (client_hold_request)
 * and:
 *
 *  1. inside a transaction, refused (OperationNotSupportedInTransaction,
 *     263), except relaybusComplete: that one runs in the consumer's
 *     transaction (steps 2 to 5, then publish/pulltxn.h's writes on the
 *     client's own upstream connection, in the transaction; below);
 *  2. checked against the handler's `consumers` list, when it has one:
 *     a connection whose user (proxy/conn.h, client_user) the list does
 *     not name is refused with Unauthorized (13) naming the handler;
 *  3. on the connection's first pull command, checked against the
 *     deployment's authorization: a find on the outbox's lanes collection
 *     runs on the client's own upstream connection, and an Unauthorized
 *     (or unauthenticated) answer refuses the command with Unauthorized
 *     (13) before anything about the handlers is said.  Allowed once, the
 *     connection is not asked again;
 *  4. parsed and validated (base/pull.h: BadValue naming the field);
 *  5. handed to the consumer thread (the submit hook) and answered when
 *     its answer comes back (pull_answer), or at once with
 *     TemporarilyUnavailable when the consumer's queue is full.
 *
 * Nothing here blocks or calls the store.  A connection that submitted a
 * request tells the consumer when it closes (the closed hook), so its
 * claims end with an attempt charged; an answer for a connection that has
 * closed is dropped.  Per-connection state rides in the connection's data
 * slot (client_set_data).
 *
 * A relaybusComplete in a transaction is answered {ok: 1, completed,
 * notCompleted: []} once its writes succeeded in the transaction; the
 * consumer still counts its leases as this connection's claims.  The
 * commitTransaction of such a transaction is relayed by publish/publish.c,
 * which reports its reply here (pull_txn_outcome): a commit that succeeded
 * hands the leases to the consumer as settled (the settled hook), a
 * definite failure or an abortTransaction (pull_txn_aborted) forgets
 * them, and they stay held.  While a completion's writes run, the
 * connection is busy (pull_conn_busy): a request pipelined behind them
 * could commit the transaction first.
 */
#ifndef RELAYBUS_PUBLISH_PULL_H
#define RELAYBUS_PUBLISH_PULL_H

#include <stdbool.h>
#include <stdint.h>

#include <bson/bson.h>

#include "base/pull.h"
#include "codec/wire.h"
#include "proxy/conn.h"

/* The consumer thread's entry points (dispatch/consumer.h), installed by
 * main.c: publish does not depend on dispatch.  submit takes the request
 * on success, and on failure fills an error of PULL_ERROR_DOMAIN whose
 * code the client is answered with; closed is told of each connection
 * that submitted any. */
typedef bool (*pull_submit_fn) (pull_req_t *r, bson_error_t *error);
typedef void (*pull_closed_fn) (uint64_t conn);
/* Takes `r`: the leases of r->conn for r->handler that a committed
 * transaction completed. */
typedef void (*pull_settled_fn) (pull_req_t *r);

/* NULL, NULL, NULL: none (pull commands answer that no consumer runs). */
void pull_set_consumer (pull_submit_fn submit, pull_closed_fn closed, pull_settled_fn settled);

/* Takes over the pull command `cmd` of `msg` (pull_is_command).  False
 * when the request cannot even be held (`error` says why): the caller
 * closes the connection. */
bool pull_route (client_conn_t *c, const wire_msg_t *msg, const char *cmd, int compressor, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* The consumer's answer to request `seq` of connection `conn` (on the
 * loop: dispatch/consumer.h's answer callback). */
void pull_answer (uint64_t conn, uint64_t seq, const bson_t *reply);

/* Does a completion of this loop wait for the commit of the transaction of
 * `cmd` (its lsid and txnNumber)?  Costs one load while none waits. */
bool pull_txn_pending (const bson_t *cmd);

/* The reply to the commitTransaction of `cmd` (NULL: none came): success
 * settles the completions that waited for it; a failure labelled
 * UnknownTransactionCommitResult keeps them for the commit's retry; any
 * other failure forgets them (the transaction is aborted). */
void pull_txn_outcome (const bson_t *cmd, const bson_t *reply);

/* abortTransaction of `cmd`: its completions are forgotten, their leases
 * stay held. */
void pull_txn_aborted (const bson_t *cmd);

/* Do the writes of a completion in a transaction run on the connection? */
bool pull_conn_busy (uint64_t conn_id);

#endif /* RELAYBUS_PUBLISH_PULL_H */
