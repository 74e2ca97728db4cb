/*
 * base/worker.h - a worker: a thread with its own event base and its own
 * mongo-c-driver pool on the `upstream` URI, for the components that talk
 * to MongoDB through the driver (the dispatcher, the admin port, the
 * topology monitor).
 *
 * Thread: worker_new, worker_start, worker_stop and worker_destroy: the
 * main thread; the worker's event base and what its owner puts on it: the
 * worker's thread; the accessors: any thread.
 *
 * The dispatcher's lease-renewal thread is a worker with a one-connection pool of its own.
 *
 * One set-up path for all of them: the URI with the component's appName and
 * time limits, the pool (error API version 2, its size), the lease owner
 * name "<host>/<pid>/<12 random hex>" built once, with its process part
 * "<host>/<pid>/" kept beside it, the event base, the thread (its name in
 * the logs, its nice value) and a stop that runs the owner's stop callback
 * on the worker's thread and joins it.  A start that fails at any step
 * frees what the steps before it made.
 *
 * Each component has its own pool, not one shared by all: a pool has one
 * appName, and the server's logs, currentOp and the tests tell the
 * dispatcher's commands ("relaybus-proxy dispatch") from the admin port's
 * ("relaybus-proxy admin") and the topology monitor's ("relaybus-proxy") by
 * it; the components also need different limits (the admin port's requests
 * wait at most 2 s for a server and 10 s for an answer, the topology
 * monitor checks each member every second).  docs/architecture.md,
 * "Workers".
 *
 * Not here: the store (base depends on no other layer; store/store.h's
 * store_worker_new makes a worker with its store) and the component's
 * events.
 */
#ifndef RELAYBUS_BASE_WORKER_H
#define RELAYBUS_BASE_WORKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>
#include <mongoc/mongoc.h>

#include "base/errors.h"

struct event_base;

typedef enum {
   WORKER_ERROR_URI = 1, /* the upstream URI does not parse */
   WORKER_ERROR_POOL,    /* the driver refused to make a pool */
   WORKER_ERROR_BASE,    /* no event base (out of memory or descriptors) */
   WORKER_ERROR_THREAD,  /* pthread_create failed */
} worker_error_code_t;

/* "<host>/<pid>/<12 hex>" and its terminating NUL fit in this. */
#define WORKER_OWNER_MAX 160

/* How the pool is made.  A limit the URI sets itself is kept, unless the
 * option says otherwise. */
typedef struct {
   const char *appname;          /* the handshake's appName */
   bool keep_uri_appname;        /* an appName in the URI wins over `appname` */
   int32_t server_selection_ms;  /* serverSelectionTimeoutMS; 0: the driver's */
   bool force_server_selection;  /* ... even over the URI's */
   int32_t socket_timeout_ms;    /* socketTimeoutMS; 0: the driver's */
   int32_t heartbeat_ms;         /* heartbeatFrequencyMS; 0: the driver's */
   int32_t max_pool_size;        /* 0: the driver's */
} worker_pool_opts_t;

/* A new pool on `uri` made as `opts` says (the pool copies the URI), with
 * the error API version 2.  `what` prefixes the error messages
 * ("dispatch: upstream URI: ..."). */
mongoc_client_pool_t *worker_pool_new (const char *uri,
                                       const worker_pool_opts_t *opts,
                                       const char *what,
                                       bson_error_t *error) __attribute__ ((warn_unused_result));

typedef struct {
   const char *name; /* "dispatch", "admin": the thread's name, the prefix of its errors and logs */
   worker_pool_opts_t pool;
   int nice; /* the thread's nice value (Linux: per thread); 0: the process's */
   bool quiet; /* no "<name>: stopped" line (a helper thread of another worker) */
   /* Runs on the worker's thread when worker_stop asks it to stop; it ends
    * the loop itself (event_base_loopexit) once its work is done.  NULL:
    * the loop breaks at once. */
   void (*on_stop) (void *ctx);
   void *ctx;
} worker_opts_t;

typedef struct worker worker_t;

/* The pool (none when `uri` is NULL: a thread with an event base only),
 * the owner name and the event base, not running yet: the caller puts its
 * events on worker_base, then calls worker_start.  NULL with `error`
 * (WORKER_ERROR_DOMAIN) when a step fails; nothing is left. */
worker_t *worker_new (const char *uri, const worker_opts_t *opts, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* Starts the thread, which runs the event base until it is stopped and
 * logs "<name>: stopped" when it returns (unless quiet). */
bool worker_start (worker_t *w, bson_error_t *error) __attribute__ ((warn_unused_result));

/* Asks the thread to stop (opts.on_stop on the thread) and joins it.  A
 * no-op when it is not running; the base and the pool stay until
 * worker_destroy. */
void worker_stop (worker_t *w);

/* Stops the worker if it runs, then frees the event base and the pool:
 * the caller frees its own events and its store first.  NULL is accepted. */
void worker_destroy (worker_t *w);

struct event_base *worker_base (const worker_t *w);
mongoc_client_pool_t *worker_pool (const worker_t *w); /* NULL: made without a URI */
bool worker_running (const worker_t *w);
/* The lease owner name, "<host>/<pid>/<12 hex>", unique per worker. */
const char *worker_owner (const worker_t *w);
/* Its process part, "<host>/<pid>/": the owners of this process start
 * with it. */
const char *worker_owner_prefix (const worker_t *w);

#endif /* RELAYBUS_BASE_WORKER_H */
