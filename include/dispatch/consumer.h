/*
 * dispatch/consumer.h - the pull consumers' side of the store: one worker
 * thread (base/worker.h, appName "relaybus-proxy consumer") with its own
 * store instance, which runs the requests of relaybusClaim,
 * relaybusComplete, relaybusRetry, relaybusBury, relaybusExtend,
 * relaybusRelease and relaybusStatus {handler} (base/pull.h) and hands each
 * answer back to the forwarding loop.
 *
 * Thread: consumer_start and consumer_stop: the main thread;
 * consumer_submit, consumer_closed, consumer_settled, consumer_wake and
 * consumer_drain: any
 * thread (the
 * forwarding loop calls them); the answer callback: the forwarding loop
 * (through its loopwake); everything else: the consumer thread.
 *
 * The forwarding loop parses and validates a command (publish/pull.c) and
 * submits the request here; the store calls run on this thread only.  The
 * queue of submitted requests is bounded (CONSUMER_QUEUE_MAX; full:
 * consumer_submit fails at once and the client gets TemporarilyUnavailable),
 * and so are the claims held (CONSUMER_MAX_CLAIMS) and the long polls
 * waiting (CONSUMER_MAX_WAITING), each with a fair share per connection
 * and per handler (CONSUMER_CONN_MAX_*, CONSUMER_HANDLER_MAX_*).  The store
 * work of one request is bounded too: a relaybusExtend of many leases is
 * one transaction (store_extend_many), not one per lease, and the thread
 * takes the queued requests in turns, one per handler.  A claim with nothing due and
 * maxAwaitTimeMS waits in a list with a timer on this thread's base, never
 * holding the thread: consumer_wake (a commit through this proxy that
 * carried events) and the poll interval make the waiting claims look
 * again.
 *
 * The claims handed out are kept per client connection.  A lease is
 * settled only by the connection that claimed it; when the connection
 * closes (consumer_closed) its waiting claims are dropped and its
 * deliveries are charged one attempt (rescheduled due at once, or buried
 * once the handler's max_attempts is reached), so a consumer that crashes
 * on a poison event still runs it into the dead letters, and when no claim
 * is left at all the lanes are handed back (store_relinquish) instead of
 * waiting for their lease.  An answer for a connection that has closed is
 * dropped by the loop.
 *
 * What each handler's consumers hold and wait for (connections, claims,
 * long polls) and what they settled are kept by the consumer thread in the
 * counter registry's per-handler slots (base/counters.h,
 * relaybus_consumer_*), which the admin thread reads: nothing here is
 * called for them.
 *
 * A relaybusComplete sent in the consumer's transaction (pull_req_t
 * in_txn) is only checked here: the leases must be held by the
 * connection, and the answer {ok: 1} lets the loop write the completion in
 * the transaction (publish/pulltxn.h).  The claims stay held until the
 * loop reports the commit (consumer_settled); after an abort they stay
 * held and may be completed again.
 */
#ifndef RELAYBUS_DISPATCH_CONSUMER_H
#define RELAYBUS_DISPATCH_CONSUMER_H

#include <stdbool.h>
#include <stdint.h>

#include <bson/bson.h>

#include "base/config.h"
#include "base/pull.h"
#include "base/errors.h"

struct loopwake;

typedef enum {
   CONSUMER_ERROR_NOT_RUNNING = 1, /* consumer_start: its events could not be made */
} consumer_error_code_t;

/* Requests submitted and not yet taken by the thread. */
#define CONSUMER_QUEUE_MAX 256
/* Claims held by all consumers of this proxy at once. */
#define CONSUMER_MAX_CLAIMS 10000
/* Long polls waiting at once. */
#define CONSUMER_MAX_WAITING 256
/* The fair shares of those two bounds: one client connection holds at most
 * a quarter of them, the consumers of one handler at most half, so that
 * one consumer (or one team's handler) flooding the proxy leaves room for
 * the others.  Past a share a claim is refused as past the bound itself
 * (TemporarilyUnavailable, saying which share), or takes only what fits. */
#define CONSUMER_CONN_MAX_CLAIMS (CONSUMER_MAX_CLAIMS / 4)
#define CONSUMER_CONN_MAX_WAITING (CONSUMER_MAX_WAITING / 4)
#define CONSUMER_HANDLER_MAX_CLAIMS (CONSUMER_MAX_CLAIMS / 2)
#define CONSUMER_HANDLER_MAX_WAITING (CONSUMER_MAX_WAITING / 2)
/* Requests of one handler queued for the thread at once (half of
 * CONSUMER_QUEUE_MAX; a connection has at most CLIENT_MAX_INFLIGHT, 16, in
 * flight). */
#define CONSUMER_HANDLER_MAX_QUEUED (CONSUMER_QUEUE_MAX / 2)

/* Receives one answer on the forwarding loop: `conn` and `seq` as in the
 * request; `reply` is valid during the call only. */
typedef void (*consumer_answer_fn) (uint64_t conn, uint64_t seq, const bson_t *reply);

/* Starts the thread when `cfg` has a pull handler (else does nothing and
 * returns true).  `wakes` are the forwarding loops', by loop index
 * (borrowed: they outlive consumer_stop); `answer` runs on the loop of the
 * request's pull_req_t.loop, through wakes[loop]. */
bool consumer_start (config_t *cfg,
                     struct loopwake *const *wakes,
                     size_t n_wakes,
                     consumer_answer_fn answer,
                     bson_error_t *error) __attribute__ ((warn_unused_result));

/* Drops the waiting claims and the queue, retries for up to 5 s the
 * charges closed connections still owe, hands every lane back (what is
 * claimed is released without an attempt charged) except the lanes of the
 * charges still owed, which stay held for the takeover to charge, and
 * joins the thread.  Safe when nothing was started. */
void consumer_stop (void);

/* Queues a request (taken on success; the caller keeps it on failure).
 * False with an error of PULL_ERROR_DOMAIN whose code is the answer's:
 * PULL_CODE_INTERNAL when no consumer thread runs (no pull handler at
 * start-up), PULL_CODE_TEMPORARILY_UNAVAILABLE when CONSUMER_QUEUE_MAX
 * requests wait already. */
bool consumer_submit (pull_req_t *r, bson_error_t *error) __attribute__ ((warn_unused_result));

/* Connection `conn`, which submitted requests, closed: handled after its
 * requests already queued.  Never refused (one per connection). */
void consumer_closed (uint64_t conn);

/* Takes `r` (op PULL_COMPLETE, conn, handler, leases): a transaction that
 * completed these leases committed, so the connection holds them no more.
 * Never refused: the loop's table of completions waiting for their commit
 * bounds these notices. */
void consumer_settled (pull_req_t *r);

/* A commit carried events: the waiting claims look again now. */
void consumer_wake (void);

/* The proxy drains (SIGTERM): the waiting claims are answered now with
 * what is due (often nothing), and later claims do not wait, so a long
 * poll never holds a draining connection open. */
void consumer_drain (void);

#endif /* RELAYBUS_DISPATCH_CONSUMER_H */
