/*
 * dispatch/dispatch.h - the dispatch engine: one worker thread (base/worker.h:
 * its own event base and mongo-c-driver pool) that claims deliveries of the
 * configured webhook handlers, POSTs them, completes what succeeded in
 * batches, reschedules failures with backoff, buries dead letters, renews
 * the leases of lanes with work in flight, and hands its lanes back when it
 * stops.
 *
 * Thread: dispatch_start and dispatch_stop: the main thread; dispatch_reload
 * and dispatch_wake: any thread; everything else: the
 * dispatcher thread (and its lease-renewal thread).
 *
 * Nothing here runs on the forwarding loop: main.c calls dispatch_start
 * once and dispatch_stop at exit, and installs dispatch_wake as the
 * publishing path's wake hook (publish/hooks.h), which calls it
 * (thread-safe, never blocks on I/O) after a commit of a transaction it
 * injected into, so local events go out without waiting for the poll
 * interval.
 *
 * Pull handlers (kind = pull) get deliveries but are not dispatched here:
 * consumers claim them through virtual commands (dispatch/consumer.h).
 */
#ifndef RELAYBUS_DISPATCH_H
#define RELAYBUS_DISPATCH_H

#include <stdbool.h>
#include <stdint.h>

#include <bson/bson.h>

#include "base/config.h"
#include "base/errors.h"

/* Errors of dispatch_start beyond those of its worker (WORKER_ERROR_DOMAIN),
 * its store and its handlers. */
typedef enum {
   DISPATCH_ERROR_RENEWAL = 1, /* the lease-renewal thread's worker cannot be made */
} dispatch_error_code_t;

/* Runs the store's setup (collections, indexes, lanes) and, when
 * [dispatch] enabled = true and a webhook handler exists, starts the
 * dispatcher thread.  A setup that fails because the upstream is not
 * reachable yet is retried by the thread; false only for errors that a
 * retry cannot fix (bad URI, bad handler URL or secret, no thread): then
 * nothing is left running. */
bool dispatch_start (config_t *cfg, bson_error_t *error) __attribute__ ((warn_unused_result));

/* Stops claiming, lets requests in flight finish (bounded by the handlers'
 * timeouts, at most 10 s), releases what is still running, hands every lane
 * back and joins the thread.  Safe to call when nothing was started. */
void dispatch_stop (void);

/* Applies a reloaded snapshot (poll_interval_ms, batch_size, lease_ms; the
 * handlers cannot change on reload).  Takes its own reference; any
 * thread. */
void dispatch_reload (config_t *cfg);

/* Appends to `out` one document per broker handler (a kind with a lasting
 * connection, such as nats) this dispatcher runs, in config order:
 * {name, kind, state ("connecting", "connected", "disconnected", "closed"),
 * and detail, the last connection error, when not connected}.  Nothing
 * when the dispatcher is not running.  Any thread (the admin port's
 * /readyz); it never waits for the dispatcher's loop. */
void dispatch_handler_states (bson_t *out);

/* Appends {state, detail?} as `field` to `doc` when handler `name` is a
 * broker handler this dispatcher runs (as dispatch_handler_states gives
 * it); nothing otherwise.  Any thread. */
void dispatch_handler_connection (const char *name, bson_t *doc, const char *field);

/* Claims now instead of at the next poll.  Thread-safe; cheap; a no-op
 * when the dispatcher is not running. */
void dispatch_wake (void);

#endif /* RELAYBUS_DISPATCH_H */
