/*
 * proxy/operator.h - the operator's commands to the forwarding loops: pause,
 * resume, close one client connection, reconnect the upstream connections.
 *
 * Thread: operator_pause, operator_resume, operator_close_client,
 * operator_reconnect and operator_kick: the admin thread (POST /api/...,
 * admin/operator.c); operator_paused and operator_generation: any thread,
 * read by the forwarding loops on their request path; operator_attach and
 * operator_detach: the main thread (proxy/loops.c), before a loop's thread
 * starts and after it stopped.
 *
 * The loops run their event bases without locks (base/loopwake.h), so the
 * admin thread never touches a connection.  A pause is one atomic flag the
 * loops read where a request would be routed (proxy/conn.c): what is in
 * flight goes on and is answered, the next request of each connection is
 * not read.  Everything else is carried by a post to each loop's loopwake:
 * one coalesced post per loop at a time, taking what waits in the loop's
 * slot (a resume, a reconnect, the ids of connections to close), exactly
 * like proxy/loops.c's notices.  A post that does not fit a loop's queue is
 * left pending; operator_kick posts again (the admin thread calls it from
 * a timer until it returns true), so no command blocks a loop or the admin
 * thread, and none is lost.
 *
 * A reconnect raises a generation: an upstream connection opened under an
 * older one is closed as it comes free (pooled mode: when its client gives
 * it back; session mode: when its client has nothing in flight), never
 * while a request of a client is on it.
 *
 * Not here: the HTTP side (admin/operator.c), the connections' own state
 * changes (proxy/conn.c, proxy/pool.c).
 */
#ifndef RELAYBUS_PROXY_OPERATOR_H
#define RELAYBUS_PROXY_OPERATOR_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <bson/bson.h>

#include "base/errors.h"
struct client_loop;
struct loopwake;

/* What a loop does with the operator's commands posted to it, on that loop
 * (proxy/conn.h's client_loop_operator, installed by proxy/loops.c): this
 * module sits below the connections, so it carries their commands without
 * calling into them. */
typedef void (*operator_apply_fn) (struct client_loop *loop, const uint64_t *ids, unsigned n_ids, bool reconnect, bool resume);

/* Errors of operator_close_client (OPERATOR_ERROR_DOMAIN). */
typedef enum {
   OPERATOR_ERR_NO_LOOP = 1, /* the connection's loop is not running */
   OPERATOR_ERR_BUSY,        /* OPERATOR_CLOSE_MAX closes wait for that loop already */
} operator_error_code_t;

/* Connection ids waiting, per loop, to be closed by its next post. */
#define OPERATOR_CLOSE_MAX 64

/* The flag and generation behind operator_paused and operator_generation;
 * read inline on the request path.  Written only by this module. */
extern atomic_bool operator_pause_flag;
extern atomic_uint_fast64_t operator_reconnect_gen;

/* Whether requests not read yet must wait (POST /api/pause). */
static inline bool
operator_paused (void)
{
   return atomic_load_explicit (&operator_pause_flag, memory_order_relaxed);
}

/* The reconnect generation: an upstream connection opened under a lower
 * one is closed as it comes free. */
static inline uint64_t
operator_generation (void)
{
   return atomic_load_explicit (&operator_reconnect_gen, memory_order_acquire);
}

/* Main thread: loop `index` (below CONFIG_THREADS_MAX) takes the
 * operator's posts through `wake` (borrowed) onto `loop` (borrowed), each
 * handed to `apply` there, until operator_detach. */
void operator_attach (unsigned index, struct client_loop *loop, struct loopwake *wake, operator_apply_fn apply);
/* Main thread, once the loop stopped turning: posts still queued to it
 * find nothing to do. */
void operator_detach (unsigned index);

/* Admin thread.  Each returns whether it changed anything (a pause of a
 * paused proxy does not). */
bool operator_pause (void);
bool operator_resume (void);
/* Asks loop `loop` to close connection `id` (as /api/clients lists them).
 * False: the loop is not running or too many closes wait for it. */
bool operator_close_client (uint64_t id, unsigned loop, bson_error_t *error) __attribute__ ((warn_unused_result));
/* Raises the generation and asks every loop to close what is older as it
 * comes free.  Returns the new generation. */
uint64_t operator_reconnect (void);
/* Posts to every loop whose slot has something its queue did not take
 * yet; false while some post still does not fit (call again later). */
bool operator_kick (void) __attribute__ ((warn_unused_result));

#endif /* RELAYBUS_PROXY_OPERATOR_H */
