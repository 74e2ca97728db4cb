/*
 * base/loopwake.h - waking the forwarding loop from another thread.
 *
 * Thread: loopwake_new, loopwake_destroy and the posted functions: the loop the
 * wake-up belongs to; loopwake_post: any thread.
 *
 * The forwarding loop's event base runs without libevent's locks
 * (EVENT_BASE_FLAG_NOLOCK): every event_add, event_del and event_active on
 * the request path would otherwise take the base's mutex, about 40 lock and
 * unlock pairs per request.  The price is that no other thread may touch
 * that base.  A thread with news for the loop (the topology monitor; later
 * the store or the admin thread) posts a function and its argument here
 * instead: the post goes into a small bounded queue under the module's own
 * mutex, and an eventfd (a pipe where there is none) makes the loop's
 * event fire.  The loop then runs the posted functions in posting order.
 *
 * The queue is bounded: a post fails, never blocks and never allocates,
 * when it is full.  Producers with something that can be coalesced (a
 * "look again" notice) keep their own pending flag and post once until the
 * loop ran it, so they never fill the queue.
 *
 * Not here: payloads.  A posted function reads whatever its producer left
 * behind (under the producer's own lock); the queue only carries the call.
 */
#ifndef RELAYBUS_LOOPWAKE_H
#define RELAYBUS_LOOPWAKE_H

#include <stdbool.h>
#include <stddef.h>

#include <bson/bson.h>

#include "base/errors.h"

struct event_base;

/* Error codes in LOOPWAKE_ERROR_DOMAIN. */
typedef enum {
   LOOPWAKE_ERR_PIPE = 1, /* the wake-up descriptor could not be created */
   LOOPWAKE_ERR_EVENT,    /* the loop could not watch it */
} loopwake_error_code_t;
/* Posts waiting to run, across all producers of one loop. */
#define LOOPWAKE_CAPACITY 64

typedef struct loopwake loopwake_t;

/* Runs on the loop's thread. */
typedef void (*loopwake_fn_t) (void *arg);

/* Created on the loop's thread, before any producer starts.  The base is
 * borrowed and must outlive the loopwake. */
loopwake_t *loopwake_new (struct event_base *base, bson_error_t *error) __attribute__ ((warn_unused_result));

/* Any thread: queues fn(arg) to run on the loop and wakes it.  Returns
 * false (nothing queued) when LOOPWAKE_CAPACITY posts are already waiting. */
bool loopwake_post (loopwake_t *w, loopwake_fn_t fn, void *arg) __attribute__ ((warn_unused_result));

/* On the loop's thread, after every producer stopped: drops what was not
 * run yet and frees everything.  NULL ok. */
void loopwake_destroy (loopwake_t *w);

#endif /* RELAYBUS_LOOPWAKE_H */
