/*
 * publish/publish.h - client commands the proxy handles itself: annotated
 * statements, virtual commands (relaybus*), and commits of transactions the
 * proxy injected into.
 *
 * proxy/conn.c calls virtual_request_hook for every parsed client OP_MSG before
 * forwarding it.  Most commands pass (forwarded as usual).  The ones taken
 * over are held (client_hold_request) and answered later
 * (client_answer), in the client's order, while the proxy's own requests
 * run on the client's upstream connection (client_send_internal):
 *
 *  - a statement whose comment carries a relaybus annotation, inside a
 *    transaction: forwarded without the annotation; if it succeeded, the
 *    outbox writes of publish/inject.h follow in the same transaction; the client
 *    gets the statement's reply, or the failing outbox write's error.
 *    Outside a transaction: IllegalOperation (20).  Malformed: BadValue (2),
 *    nothing forwarded.
 *  - relaybusPublish {events: [...]} inside a transaction: the same writes
 *    without a statement; replies {ok: 1, eventIds: [...]}.  Any other
 *    relaybus* command: CommandNotFound (59).  Never forwarded.
 *  - a client command that writes the outbox namespace (publish/guard.h):
 *    Unauthorized (13), not forwarded, unless [outbox] allow_client_writes;
 *    with moreToCome (no reply possible) the connection is closed instead.
 *  - commitTransaction of a transaction the proxy injected into: relayed,
 *    and on success the dispatcher is woken (dispatch_wake).  Sent with
 *    moreToCome, it is relayed acknowledged (the proxy needs the outcome)
 *    and the reply is swallowed: the client asked for none.
 *  - commitTransaction of a poisoned transaction (an annotated statement or
 *    relaybusPublish of it lost its connection, or an outbox write failed,
 *    on any connection of this process): not forwarded; the proxy sends
 *    abortTransaction instead and answers NoSuchTransaction (251) with
 *    TransientTransactionError.
 *  - getMore and killCursors carrying a copy of their cursor's annotation
 *    (drivers repeat the comment): relayed with the copy stripped, publishing
 *    nothing.
 *
 * Runs on the forwarding loop only; never blocks.  State: the operations in
 * progress (bounded by the connections' in-flight limits) and a bounded
 * table of transactions injected into, both owned by this module and kept
 * per loop thread (thread-local); and the table of poisoned transactions,
 * process-wide (a commit may come on any loop's connection), behind
 * publish/poison.h's short mutex.
 */
#ifndef RELAYBUS_VIRTUAL_H
#define RELAYBUS_VIRTUAL_H

#include <stdbool.h>
#include <stdint.h>

#include <bson/bson.h>

#include "proxy/conn.h"
#include "codec/wire.h"

/* Outbox commands of one operation in flight at once on a connection: with
 * the client's own (CLIENT_MAX_INFLIGHT) this stays well inside
 * CLIENT_MAX_UPSTREAM_INFLIGHT. */
#define VIRTUAL_WINDOW 16
/* Transactions remembered for the wake-up at commit (least recently
 * injected ones are forgotten first; a forgotten one is still delivered, at
 * the dispatcher's next poll). */
#define VIRTUAL_TXN_SLOTS 1024
/* How long a poisoned transaction is remembered: well past MongoDB's
 * default transactionLifetimeLimitSeconds (60 s), after which the server
 * has aborted the transaction itself.  How many are remembered is
 * `[outbox] max_poisoned_transactions`: a live entry is never forgotten,
 * and while every slot is live or reserved by a publish in progress, new
 * annotated statements and relaybusPublish calls are refused with
 * VIRTUAL_POISON_FULL_CODE and TransientTransactionError. */
#define VIRTUAL_POISON_TTL_MS (10 * 60 * 1000)
#define VIRTUAL_POISON_FULL_CODE 365 /* TemporarilyUnavailable */
/* An event type no handler subscribes to, with [outbox] unrouted = refuse:
 * the request is answered {ok: 0, code: 2, codeName: "BadValue"}. */
#define VIRTUAL_UNROUTED_CODE 2

/* The request hook (client_request_hook_t) that main.c installs with
 * client_loop_set_request_hook (loop, virtual_request_hook, NULL).  Looks at
 * one client OP_MSG (`msg` valid only during the call; everything needed
 * later is copied).  CLIENT_ROUTE_FORWARD: not ours.  CLIENT_ROUTE_HELD:
 * consumed, answered now or later.  CLIENT_ROUTE_ERROR: the connection was
 * closed here (with the reason logged and counted), or must be. */
client_route_t virtual_request_hook (client_conn_t *c,
                                     const wire_msg_t *msg,
                                     const char *cmd,
                                     int compressor,
                                     void *ctx,
                                     bson_error_t *error);

/* Counters for metrics and tests (relaxed atomic reads). */
typedef struct {
   uint64_t annotated;       /* annotated statements seen */
   uint64_t published;       /* statements and relaybusPublish calls whose outbox writes succeeded */
   uint64_t events;          /* events written */
   uint64_t deliveries;      /* deliveries written */
   uint64_t rounds;          /* outbox round trips */
   uint64_t commands;        /* outbox commands sent */
   uint64_t bad_annotations; /* BadValue answers */
   uint64_t outside_txn;     /* IllegalOperation answers */
   uint64_t statement_failed; /* the statement itself failed: relayed, nothing written */
   uint64_t inject_failed;   /* an outbox write failed: its error went to the client */
   uint64_t aborted_lost;    /* the connection closed in the middle of an operation */
   uint64_t wakes;           /* dispatcher wake-ups after commits */
   /* Added later; readers that predate them simply ignore them. */
   uint64_t poisoned;        /* transactions recorded as poisoned */
   uint64_t poison_refused;  /* commitTransaction refused (aborted instead) */
   uint64_t poison_entries;  /* poisoned entries held now (expired ones until dropped) */
   uint64_t poison_full_refused;   /* annotated work refused: the poisoned table was full */
   uint64_t outbox_writes_refused; /* client commands refused for writing the outbox (Unauthorized) */
} virtual_stats_t;

void virtual_get_stats (virtual_stats_t *out);

#endif /* RELAYBUS_VIRTUAL_H */
