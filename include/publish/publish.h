/*
 * publish/publish.h - the publishing interceptor: what a client command becomes.
 *
 * Thread: forwarding loop.
 *
 * The client commands the proxy handles itself: annotated statements,
 * relaybus* commands, commits of transactions the proxy injected into, and
 * client writes to the outbox.
 *
 * proxy/pump.c calls publish_request_hook for every parsed client OP_MSG before
 * forwarding it.  Most commands pass (forwarded as usual).  The ones taken
 * over are held (client_hold_request) and answered later
 * (client_answer), in the client's order, while the proxy's own requests
 * run on the client's upstream connection (client_send_internal):
 *
 *  - a statement whose comment carries a relaybus annotation, inside a
 *    transaction: forwarded without the annotation; if it succeeded, the
 *    outbox writes of publish/inject.h follow in the same transaction; the client
 *    gets the statement's reply, or the failing outbox write's error.
 *    Outside a transaction: InvalidOptions (72).  Malformed: BadValue (2),
 *    nothing forwarded.
 *  - relaybusPublish {events: [...]} inside a transaction: the same writes
 *    without a statement; replies {ok: 1, eventIds: [...]}.  The pull
 *    consumers' commands go to publish/pull.h.  Any other relaybus*
 *    command: CommandNotFound (59).  Never forwarded.
 *  - a client command that writes the outbox namespace (publish/guard.h):
 *    Unauthorized (13), not forwarded, unless [outbox] allow_client_writes;
 *    with moreToCome (no reply possible) the connection is closed instead.
 *  - commitTransaction of a transaction the proxy injected into, or in
 *    which a relaybusComplete wrote its completion (publish/pull.h): relayed,
 *    and on success the dispatcher is woken (publish_wake) and the
 *    completion's claims are settled (pull_txn_outcome).  Sent with
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
 * Never blocks.  State: the operations in progress (bounded by the
 * connections' in-flight limits), owned by this module and kept per loop
 * thread (thread-local); the transactions injected into and the poisoned
 * ones are publish/txns.h's.
 */
#ifndef RELAYBUS_PUBLISH_H
#define RELAYBUS_PUBLISH_H

#include <stdbool.h>
#include <stdint.h>

#include <bson/bson.h>

#include "codec/wire.h"
#include "proxy/conn.h"
#include "publish/inject.h"
#include "base/errors.h"

/* Why publish_request_hook closed a connection (bson_error_t codes of
 * PUBLISH_ERROR_DOMAIN; the message says more). */
typedef enum {
   PUBLISH_ERROR_PIPELINED = 1,   /* a request behind an operation still running */
   PUBLISH_ERROR_UNACKNOWLEDGED,  /* an annotated statement or relaybus* command with moreToCome */
   PUBLISH_ERROR_STRIP,           /* a getMore/killCursors could not be rebuilt without its annotation */
   PUBLISH_ERROR_UNACKNOWLEDGED_OUTBOX_WRITE, /* a client write to the outbox with moreToCome */
} publish_error_t;

/* Outbox commands of one operation in flight at once on a connection: with
 * the client's own (CLIENT_MAX_INFLIGHT) this stays well inside
 * CLIENT_MAX_UPSTREAM_INFLIGHT. */
#define PUBLISH_WINDOW 16
/* How many poisoned transactions are remembered is `[outbox]
 * max_poisoned_transactions` (for how long: TXNS_POISON_TTL_MS): a live
 * entry is never forgotten, and while every slot is live or reserved by a
 * publish in progress, new annotated statements and relaybusPublish calls
 * are refused with this code and TransientTransactionError. */
#define PUBLISH_POISON_FULL_CODE INJECT_CODE_TEMPORARILY_UNAVAILABLE
/* An event type no handler subscribes to, with [outbox] unrouted = refuse:
 * the request is answered {ok: 0, code: 2, codeName: "BadValue"}. */
#define PUBLISH_UNROUTED_CODE INJECT_CODE_BAD_VALUE
/* Before the dispatcher's first read of the fleet's handler set (a start-up
 * with the upstream away): annotated statements and relaybusPublish are
 * refused with this code and TransientTransactionError. */
#define PUBLISH_NO_FLEET_CODE INJECT_CODE_TEMPORARILY_UNAVAILABLE

/* The request hook (client_request_hook_t) that main.c installs with
 * client_loop_set_request_hook (loop, publish_request_hook, NULL).  Looks at
 * one client OP_MSG (`msg` valid only during the call; everything needed
 * later is copied).  CLIENT_ROUTE_FORWARD: not ours.  CLIENT_ROUTE_HELD:
 * consumed, answered now or later.  CLIENT_ROUTE_ERROR: the connection was
 * closed here (with the reason logged and counted), or must be. */
client_route_t publish_request_hook (client_conn_t *c,
                                     const wire_msg_t *msg,
                                     const char *cmd,
                                     int compressor,
                                     void *ctx,
                                     bson_error_t *error);

#endif /* RELAYBUS_PUBLISH_H */
