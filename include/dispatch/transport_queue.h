/*
 * dispatch/transport_queue.h - the hand-over between the dispatcher's
 * loop and a broker kind's publishing threads (dispatch/kafka.c,
 * dispatch/nats.c, dispatch/rabbitmq.c, each through the queue of its
 * transport_base_t): a bounded queue of sends, taken by the threads,
 * and a list of finished sends whose callbacks run on the dispatcher's
 * base, woken by one event when the list becomes non-empty.
 *
 * A send is the kind's own struct with a tqueue_item_t as its first
 * member.  It belongs to the queue from tqueue_push until its callback
 * ran (then the queue frees it with the kind's free function) or it was
 * cancelled: a cancelled send that a thread is publishing is freed when
 * that thread hands it back, so a thread never touches freed memory.
 *
 * Thread: tqueue_new, tqueue_push, tqueue_cancel, tqueue_destroy: the
 * dispatcher's (or, before it runs, the main) thread; tqueue_take and
 * tqueue_done: the kind's publishing threads; tqueue_stop: any.
 */
#ifndef RELAYBUS_TRANSPORT_QUEUE_H
#define RELAYBUS_TRANSPORT_QUEUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>
#include <event2/event.h>

#include "dispatch/transport_result.h"

typedef struct tqueue_item {
   struct tqueue_item *next;
   transport_done_cb_t cb;
   void *arg;
   bool busy;      /* a thread is publishing it */
   bool cancelled; /* cancelled while busy: freed when handed back */
   transport_result_t res; /* filled by the thread before tqueue_done */
} tqueue_item_t;

typedef void (*tqueue_free_fn_t) (tqueue_item_t *item);

typedef struct tqueue tqueue_t;

/* At most `max` sends queued or being published at once; `free_fn` frees
 * a kind's send.  The base is borrowed. */
tqueue_t *tqueue_new (struct event_base *base, size_t max, tqueue_free_fn_t free_fn);

/* Queues `it` (cb and arg set by the caller) and wakes a thread; false,
 * with `error` set and nothing queued, when `max` sends are in already. */
bool tqueue_push (tqueue_t *q, tqueue_item_t *it, bson_error_t *error) __attribute__ ((warn_unused_result));

/* A publishing thread's next send: waits for one up to `wait_ms` (-1:
 * until there is one).  NULL on a timeout or once tqueue_stop was
 * called (tqueue_stopped then says so). */
tqueue_item_t *tqueue_take (tqueue_t *q, int64_t wait_ms);
bool tqueue_stopped (tqueue_t *q);

/* A publishing thread hands a send back with its result in it->res. */
void tqueue_done (tqueue_t *q, tqueue_item_t *it);

/* Abandons a send: its callback will not run. */
void tqueue_cancel (tqueue_t *q, tqueue_item_t *it);

/* Wakes every thread waiting in tqueue_take, which returns NULL from now on. */
void tqueue_stop (tqueue_t *q);

/* Frees what is left; the threads are joined.  NULL ok. */
void tqueue_destroy (tqueue_t *q);

#endif /* RELAYBUS_TRANSPORT_QUEUE_H */
