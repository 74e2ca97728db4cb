/*
 * dispatch/transport.h - the handler interface: what the dispatcher asks
 * of every kind of handler that it delivers to itself (webhook, nats,
 * rabbitmq).
 *
 * A transport is made per handler (transport_new), sends one delivery at a
 * time per call, asynchronously (transport_send), and reports each send's
 * result exactly once, on the dispatcher's event base: the delivery is
 * done (the broker or the endpoint confirmed it), to be retried (after a
 * given delay, or the handler's backoff), or dead (with the error that
 * becomes its lastError).  A kind whose library runs its own threads
 * posts the result back to the dispatcher's base; nothing a transport
 * does blocks that base for network I/O.  The dispatcher keeps the order
 * per key (one delivery per key in flight), the retries, the dead letters
 * and the leases; a transport only sends.
 *
 * Each kind is a file of its own (webhook.c, kafka.c, nats.c, rabbitmq.c)
 * with a table of transport_ops_t; this file's transport.c picks the
 * table by the handler's kind.  The broker kinds, whose libraries publish
 * on threads of their own, share one base (transport_base_t, at the end):
 * the bounded queue to their threads, the connection state and its last
 * error, cancel, the state op, and the stop that joins the threads; each
 * kind adds only its client.  Pull handlers have no transport: consumers
 * claim their deliveries (dispatch/consumer.h).
 *
 * Thread: everything here on the dispatcher's thread (transport_new also
 * on the main thread before the dispatcher's thread starts), except
 * transport_state, which may be called from any thread (the admin port's
 * /readyz), and what the base's comments say of its functions.
 */
#ifndef RELAYBUS_TRANSPORT_H
#define RELAYBUS_TRANSPORT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>
#include <event2/event.h>

#include "base/config.h"
#include "dispatch/format.h"
#include "dispatch/transport_result.h"
#include "store/store.h"
#include "base/errors.h"

/* A connection state's detail (its last error) is at most this long. */
#define TRANSPORT_DETAIL_MAX 256

/* The outcome's name, for logs and spans. */
const char *transport_outcome_name (transport_outcome_t o);

/* The outcome of the attempt whose send reported `res`, for its record:
 * succeeded, released (a 410: given back uncharged), timed_out, refused,
 * or failed. */
outbox_attempt_outcome_t transport_attempt_outcome (const transport_result_t *res);

/* A transport's connection to its broker, for /readyz.  A webhook's
 * connections come and go with its requests: NONE. */
typedef enum {
   TRANSPORT_STATE_NONE,
   TRANSPORT_STATE_CONNECTING,
   TRANSPORT_STATE_CONNECTED,
   TRANSPORT_STATE_DISCONNECTED, /* lost; reconnecting */
   TRANSPORT_STATE_CLOSED,
} transport_state_t;

const char *transport_state_name (transport_state_t s);

/* What the dispatcher lends every transport: its base (callbacks run
 * there).  Borrowed; it outlives the transports. */
typedef struct {
   struct event_base *base;
} transport_env_t;

typedef struct transport transport_t;
typedef struct transport_req transport_req_t;

/* A kind's implementation.  `impl` is the kind's own object, `req` its
 * own request object. */
typedef struct {
   const char *kind;
   void *(*start) (const transport_env_t *env, const config_handler_t *h, bson_error_t *error);
   /* Starts sending `d` as message `m` (its body, content type and
    * headers, rendered for the kind's binding by dispatch/format.h; the
    * kind copies what it keeps, both are the caller's); cb(result, arg)
    * runs once on env->base, never from within send, unless cancel comes
    * first.  NULL (error set) when nothing was started. */
   void *(*send) (void *impl, const store_delivery_t *d, const format_msg_t *m, transport_done_cb_t cb, void *arg, bson_error_t *error);
   /* Abandons a send: its cb will not run. */
   void (*cancel) (void *impl, void *req);
   /* Any thread.  `detail` (TRANSPORT_DETAIL_MAX) gets the last
    * connection error, or "". */
   transport_state_t (*state) (void *impl, char *detail, size_t detail_len);
   /* NULL, or: from its return on, nothing the transport was handed reaches
    * the receiver any more (what it holds is flushed within a bound, or
    * dropped; the sends it dropped call back as failed or are cancelled).
    * A stop calls it before it releases the deliveries in flight and hands
    * their lanes back.  Called at most once before destroy. */
   void (*fence) (void *impl);
   /* Frees it (never NULL: transport_destroy and a failed start pass
    * what start made); every send was cancelled or has called back. */
   void (*destroy) (void *impl);
   /* Whether the client made for `a` serves `b` as well (a reload keeps it). */
   bool (*settings_equal) (const config_handler_t *a, const config_handler_t *b);
} transport_ops_t;

extern const transport_ops_t transport_webhook_ops;
/* Only in a build with libnats (autoconf.h: RELAYBUS_HAVE_NATS). */
extern const transport_ops_t transport_nats_ops;
/* Only in a build with librabbitmq (RELAYBUS_HAVE_RABBITMQ). */
extern const transport_ops_t transport_rabbitmq_ops;
/* Only in a build with librdkafka (RELAYBUS_HAVE_KAFKA). */
extern const transport_ops_t transport_kafka_ops;

/* The ops of a handler's kind; NULL for pull, or a kind this build lacks. */
const transport_ops_t *transport_ops_for (const config_handler_t *h);

/* True for the kinds the dispatcher sends itself (not pull). */
bool transport_kind_dispatched (handler_kind_t kind);

/* A transport for handler `h` (its strings are copied).  NULL with
 * `error` when the kind has none in this build or its client cannot be
 * made (a bad URL); a broker that cannot be reached yet is not an error:
 * the transport keeps connecting, and its sends are retried meanwhile. */
transport_t *transport_new (const transport_env_t *env, const config_handler_t *h, bson_error_t *error)
   __attribute__ ((warn_unused_result));
/* NULL ok.  Every send was cancelled or has called back. */
void transport_destroy (transport_t *t);

const char *transport_kind (const transport_t *t);

/* See transport_ops_t.send.  The request is owned by the transport until
 * its callback ran or it is cancelled. */
transport_req_t *transport_send (transport_t *t,
                                 const store_delivery_t *d,
                                 const format_msg_t *m,
                                 transport_done_cb_t cb,
                                 void *arg,
                                 bson_error_t *error);
/* NULL ok. */
void transport_cancel (transport_t *t, transport_req_t *req);

/* See transport_ops_t.fence; NULL ok, and a kind without one has nothing
 * to flush (its sends end with their callback or their cancel). */
void transport_fence (transport_t *t);

/* Any thread. */
transport_state_t transport_state (transport_t *t, char *detail, size_t detail_len);

/* Whether a transport made for `a` serves `b` unchanged (same kind and
 * client settings). */
bool transport_settings_equal (const config_handler_t *a, const config_handler_t *b);

/* ------------------------------------------------------ broker helpers */

/* Expands a subject, topic or routing key template: "{type}" becomes the
 * event type, "{type_prefix}" the type up to its first '.' (the whole
 * type without one; Kafka's topics only, config.c checks), "{key}" its
 * key (the event id when it has none); other text is copied.  Characters of the substituted values that `bad` lists
 * become '_' (a NATS subject may not hold white space, '*' or '>').
 * Caller frees with bson_free. */
char *transport_expand (const char *tmpl, const store_delivery_t *d, const char *bad);

/* True when every "{...}" of `tmpl` is {type} or {key}; false with a
 * message in `why`. */
bool transport_template_valid (const char *tmpl, char *why, size_t why_len);

/* snprintf for texts that are cut where they must be (lastError and
 * detail lengths): a cut is expected, not a bug.  Any thread. */
void transport_text (char *out, size_t len, const char *fmt, ...) __attribute__ ((format (printf, 3, 4)));

/* ------------------------------------------------- the broker kinds' base */

/* Publishing threads a base joins, at most. */
#define TRANSPORT_THREADS_MAX 4

struct tqueue;
struct tqueue_item;

/* What every broker kind's client holds: the first member of the kind's
 * struct, so that the kind's object is a transport_base_t * to the ops
 * below (each kind asserts the offset).  Made by transport_base_init on
 * the dispatcher's (or the main) thread; its threads are the kind's
 * publishing threads, started by transport_base_start_threads and joined
 * by transport_base_stop; transport_base_fini frees the rest.  The kind
 * frees its own struct. */
typedef struct transport_base {
   char *name;          /* the handler's, for logs */
   char *url;           /* the broker's address: url, or Kafka's brokers */
   char *tmpl;          /* the subject, topic or routing key template */
   struct tqueue *q;    /* the sends, to the threads and back */
   atomic_int state;    /* transport_state_t */
   /* Guards last_error; a kind may guard its own fields with it too
    * (nats: its connection's progress, with a condition of its own). */
   pthread_mutex_t mu;
   char last_error[TRANSPORT_DETAIL_MAX];
   pthread_t threads[TRANSPORT_THREADS_MAX];
   size_t n_threads;
   void (*free_fn) (struct tqueue_item *); /* frees a kind's send */
} transport_base_t;

/* Sets up `b` for handler `h` (its name, `url` and `tmpl` copied):
 * CONNECTING, no error, and a queue on env->base bounded by twice the
 * handler's concurrency, whose sends `free_fn` frees.  False when the
 * queue cannot be made; `b` is then still fit for transport_base_stop and
 * transport_base_fini, as it is from the moment this returns. */
bool transport_base_init (transport_base_t *b,
                          const transport_env_t *env,
                          const config_handler_t *h,
                          const char *url,
                          const char *tmpl,
                          void (*free_fn) (struct tqueue_item *))
   __attribute__ ((warn_unused_result));

/* Starts up to `n` (at most TRANSPORT_THREADS_MAX) threads running
 * fn(arg), with b->mu held, so a thread that reads b->threads under the
 * lock sees them all.  False when none started. */
bool transport_base_start_threads (transport_base_t *b, size_t n, void *(*fn) (void *), void *arg)
   __attribute__ ((warn_unused_result));

/* Any thread: records `error` (NULL: keeps the last one) as the
 * connection's last error, then makes `state` the state; returns the
 * state it replaced, so that a caller logs a change once.  The error is
 * stored as it is: transport_state masks what it shows. */
transport_state_t transport_base_set (transport_base_t *b, transport_state_t state, const char *error);
/* Any thread: records `error` and leaves the state as it is. */
void transport_base_set_error (transport_base_t *b, const char *error);
/* Any thread. */
transport_state_t transport_base_get (transport_base_t *b);
/* Any thread: a copy of the last error ("" when none). */
void transport_base_last_error (transport_base_t *b, char *out, size_t out_len);

/* The end of every kind's send, on the dispatcher's thread: `it` is the
 * kind's request, its message built when `built` (otherwise `error` says
 * why it could not be).  Sets its callback and queues it for the
 * publishing threads, and returns it; or frees it with the kind's free
 * function and returns NULL with `error` set (not built, or the queue
 * full). */
void *transport_base_push (
   transport_base_t *b, struct tqueue_item *it, transport_done_cb_t cb, void *arg, bool built, bson_error_t *error);

/* transport_ops_t.cancel and .state for a kind whose object begins with
 * its transport_base_t (and whose requests with their tqueue_item_t). */
void transport_base_cancel (void *impl, void *req);
transport_state_t transport_base_state (void *impl, char *detail, size_t detail_len);

/* The ops table of a kind built on the base: its own <prefix>_start,
 * _send, _destroy and _settings_equal, its fence (NULL: none), and the
 * base's cancel and state. */
#define TRANSPORT_BASE_OPS(kind_, prefix_, fence_)                                                           \
   {                                                                                                         \
      .kind = (kind_), .start = prefix_##_start, .send = prefix_##_send, .cancel = transport_base_cancel,   \
      .state = transport_base_state, .fence = (fence_), .destroy = prefix_##_destroy,                        \
      .settings_equal = prefix_##_settings_equal,                                                            \
   }

/* Stops the queue (tqueue_take returns NULL in every thread) and joins
 * the threads; each finishes the send it is in first. */
void transport_base_stop (transport_base_t *b);
/* After transport_base_stop: frees the queue, with the sends left in it,
 * and the rest of `b` (not `b` itself). */
void transport_base_fini (transport_base_t *b);

#endif /* RELAYBUS_TRANSPORT_H */
