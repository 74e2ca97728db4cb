/*
 * base/worker.c - the set-up, start and stop of a worker thread with its
 * event base and mongoc pool (base/worker.h).
 *
 * A worker is made on the main thread, runs its event base on its own
 * thread, and is stopped and freed on the main thread again.  The stop
 * goes through an event on the worker's base (libevent's locks are on for
 * these bases, main.c), so the owner's stop callback runs on the worker's
 * thread like every other callback of its base.
 */
#include "base/worker.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <event2/event.h>
#include <openssl/rand.h>

#include "base/assert.h"
#include "base/log.h"

struct worker {
   char name[32];
   void (*on_stop) (void *ctx);
   void *ctx;
   int nice;
   bool quiet;
   mongoc_client_pool_t *pool; /* NULL: made without a URI */
   struct event_base *base;
   struct event *stop_ev;
   pthread_t thread;
   bool running; /* the thread was started and is not joined yet */
   char owner[WORKER_OWNER_MAX];
   char owner_prefix[WORKER_OWNER_MAX];
};

mongoc_client_pool_t *
worker_pool_new (const char *uri_string, const worker_pool_opts_t *opts, const char *what, bson_error_t *error)
{
   mongoc_uri_t *uri;
   mongoc_client_pool_t *pool = NULL;
   bson_error_t err;

   uri = mongoc_uri_new_with_error (uri_string, &err);
   if (!uri) {
      bson_set_error (error, WORKER_ERROR_DOMAIN, WORKER_ERROR_URI, "%s: upstream URI: %s", what, err.message);
      return NULL;
   }
   if (opts->appname && !(opts->keep_uri_appname && mongoc_uri_get_appname (uri)))
      mongoc_uri_set_appname (uri, opts->appname);
   if (opts->server_selection_ms > 0 &&
       (opts->force_server_selection || !mongoc_uri_has_option (uri, MONGOC_URI_SERVERSELECTIONTIMEOUTMS)))
      mongoc_uri_set_option_as_int32 (uri, MONGOC_URI_SERVERSELECTIONTIMEOUTMS, opts->server_selection_ms);
   if (opts->socket_timeout_ms > 0 && !mongoc_uri_has_option (uri, MONGOC_URI_SOCKETTIMEOUTMS))
      mongoc_uri_set_option_as_int32 (uri, MONGOC_URI_SOCKETTIMEOUTMS, opts->socket_timeout_ms);
   if (opts->heartbeat_ms > 0 && !mongoc_uri_has_option (uri, MONGOC_URI_HEARTBEATFREQUENCYMS))
      mongoc_uri_set_option_as_int32 (uri, MONGOC_URI_HEARTBEATFREQUENCYMS, opts->heartbeat_ms);
   pool = mongoc_client_pool_new_with_error (uri, &err);
   if (!pool) {
      bson_set_error (error, WORKER_ERROR_DOMAIN, WORKER_ERROR_POOL, "%s: client pool: %s", what, err.message);
      goto done;
   }
   mongoc_client_pool_set_error_api (pool, MONGOC_ERROR_API_VERSION_2);
   if (opts->max_pool_size > 0)
      (void) mongoc_client_pool_max_size (pool, (uint32_t) opts->max_pool_size);
done:
   mongoc_uri_destroy (uri);
   return pool;
}

/* Builds an owner name and its process part (both of WORKER_OWNER_MAX
 * bytes). */
static void
make_owner (char owner[WORKER_OWNER_MAX], char prefix[WORKER_OWNER_MAX])
{
   char host[64] = "localhost";
   unsigned char rnd[6];
   char hex[2 * sizeof rnd + 1];

   if (gethostname (host, sizeof host - 1) != 0)
      strcpy (host, "localhost");
   host[sizeof host - 1] = '\0';
   if (RAND_bytes (rnd, sizeof rnd) != 1) {
      /* Unique enough as a fallback: pid and address entropy. */
      uint64_t x = (uint64_t) getpid () ^ (uint64_t) (uintptr_t) owner ^ (uint64_t) bson_get_monotonic_time ();
      memcpy (rnd, &x, sizeof rnd);
   }
   for (size_t i = 0; i < sizeof rnd; i++)
      snprintf (hex + 2 * i, 3, "%02x", rnd[i]);
   snprintf (prefix, WORKER_OWNER_MAX, "%s/%d/", host, (int) getpid ());
   snprintf (owner, WORKER_OWNER_MAX, "%s/%d/%s", host, (int) getpid (), hex);
}

static void
worker_stop_cb (evutil_socket_t fd, short what, void *arg)
{
   worker_t *w = arg;

   (void) fd;
   (void) what;
   if (w->on_stop)
      w->on_stop (w->ctx);
   else
      event_base_loopbreak (w->base);
}

worker_t *
worker_new (const char *uri, const worker_opts_t *opts, bson_error_t *error)
{
   worker_t *w = bson_malloc0 (sizeof *w);

   bson_strncpy (w->name, opts->name, sizeof w->name);
   w->on_stop = opts->on_stop;
   w->ctx = opts->ctx;
   w->nice = opts->nice;
   w->quiet = opts->quiet;
   if (uri && !(w->pool = worker_pool_new (uri, &opts->pool, w->name, error)))
      goto fail;
   make_owner (w->owner, w->owner_prefix);
   w->base = event_base_new ();
   w->stop_ev = w->base ? event_new (w->base, -1, 0, worker_stop_cb, w) : NULL;
   if (!w->stop_ev) {
      bson_set_error (error, WORKER_ERROR_DOMAIN, WORKER_ERROR_BASE, "%s: cannot create an event base", w->name);
      goto fail;
   }
   return w;

fail:
   worker_destroy (w);
   return NULL;
}

static void *
worker_thread (void *arg)
{
   worker_t *w = arg;

   log_set_thread_name (w->name);
#ifdef __linux__
   /* Background work: on a busy machine the scheduler should prefer the
    * forwarding loop.  On Linux a nice value is per thread. */
   if (w->nice && setpriority (PRIO_PROCESS, (id_t) syscall (SYS_gettid), w->nice) != 0)
      log_debug ("%s: cannot lower the thread's priority: %s", w->name, strerror (errno));
#endif
   event_base_dispatch (w->base);
   if (!w->quiet)
      log_info ("%s: stopped", w->name);
   return NULL;
}

bool
worker_start (worker_t *w, bson_error_t *error)
{
   RELAYBUS_ASSERT (!w->running);
   if (pthread_create (&w->thread, NULL, worker_thread, w) != 0) {
      bson_set_error (error, WORKER_ERROR_DOMAIN, WORKER_ERROR_THREAD, "%s: cannot start the thread", w->name);
      return false;
   }
   w->running = true;
   return true;
}

void
worker_stop (worker_t *w)
{
   if (!w || !w->running)
      return;
   event_active (w->stop_ev, EV_TIMEOUT, 0);
   pthread_join (w->thread, NULL);
   w->running = false;
}

void
worker_destroy (worker_t *w)
{
   if (!w)
      return;
   worker_stop (w);
   if (w->stop_ev)
      event_free (w->stop_ev);
   if (w->base)
      event_base_free (w->base);
   if (w->pool)
      mongoc_client_pool_destroy (w->pool);
   bson_free (w);
}

struct event_base *
worker_base (const worker_t *w)
{
   return w->base;
}

mongoc_client_pool_t *
worker_pool (const worker_t *w)
{
   return w->pool;
}

bool
worker_running (const worker_t *w)
{
   return w && w->running;
}

const char *
worker_owner (const worker_t *w)
{
   return w->owner;
}

const char *
worker_owner_prefix (const worker_t *w)
{
   return w->owner_prefix;
}
