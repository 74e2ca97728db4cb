/*
 * store/watch.h - the deliveries change stream: a commit made through any
 * proxy wakes this one at once.
 *
 * Thread: store_watch_new, store_watch_set_handlers and
 * store_watch_destroy: the caller's (the dispatcher's thread); the
 * callback: the watch thread of its own.
 *
 * Without it a proxy learns of deliveries published through another proxy
 * only at its next poll (poll_interval_ms).  The watch thread keeps a
 * change stream open on the deliveries collection, filtered to inserts for
 * the handlers this proxy runs (only `_id` is sent back), on a one-connection
 * pool of its own (appName "relaybus-proxy watch"), and calls `cb` for each
 * insert it sees.  The callback only wakes: the claims that follow
 * find the work, so an event lost or repeated costs nothing but a claim or a
 * poll.
 *
 * It resumes after an error with the last resume token (a new stream, and
 * one wake, when the history is gone), with backoff from 250 ms to 5 s.
 * Where change streams are not available (a standalone, an old server, a
 * server that refuses the stage) it logs that polling stays the only way
 * and ends; the proxy works as before.
 */
#ifndef RELAYBUS_STORE_WATCH_H
#define RELAYBUS_STORE_WATCH_H

#include <stdbool.h>
#include <stddef.h>

#include <bson/bson.h>

#include "base/config.h"

typedef struct store_watch store_watch_t;

/* Called on the watch thread; must not block. */
typedef void (*store_watch_cb_t) (void *ctx);

/* Starts watching the outbox deliveries of `cfg` for inserts for the
 * `n` handlers named (copied).  NULL with `error` when the pool or the
 * thread cannot be made; a server without change streams is not an error
 * (the thread logs it and ends). */
store_watch_t *store_watch_new (const config_t *cfg,
                                const char *const *handlers,
                                size_t n,
                                store_watch_cb_t cb,
                                void *ctx,
                                bson_error_t *error) __attribute__ ((warn_unused_result));

/* The handlers changed (a reload): the stream is opened again, resuming
 * where it was, for the new set.  An empty set stops watching until the
 * next call. */
void store_watch_set_handlers (store_watch_t *w, const char *const *handlers, size_t n);

/* Stops the thread (within one await period, 500 ms) and frees everything.
 * NULL is accepted. */
void store_watch_destroy (store_watch_t *w);

#endif /* RELAYBUS_STORE_WATCH_H */
