/*
 * store/watch.c - the deliveries change stream (see store/watch.h).
 *
 * One thread, one pooled client, one stream at a time.  The thread blocks
 * in mongoc_change_stream_next for at most WATCH_AWAIT_MS (an awaitData
 * getMore), so a stop or a new handler set is noticed within that.
 */
#include "store/watch.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>

#include <mongoc/mongoc.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/outbox.h"
#include "base/servercodes.h"
#include "base/worker.h"
#include "store/store.h"

/* How long one getMore waits for inserts (and so how long a stop waits). */
#define WATCH_AWAIT_MS 500
#define WATCH_RETRY_MIN_MS 250
#define WATCH_RETRY_MAX_MS 5000

struct store_watch {
   mongoc_client_pool_t *pool;
   char *database;
   char coll[OUTBOX_NAME_MAX];
   store_watch_cb_t cb;
   void *ctx;

   pthread_t thread;
   bool started;
   pthread_mutex_t mu;
   pthread_cond_t cond;
   bool stop;         /* under mu */
   bool changed;      /* under mu: the handler set changed */
   char **handlers;   /* under mu; owned */
   size_t n_handlers; /* under mu */
   bool active;       /* under mu: a stream is open */
};

static void
handlers_free (char **h, size_t n)
{
   for (size_t i = 0; i < n; i++)
      bson_free (h[i]);
   bson_free (h);
}

static char **
handlers_copy (const char *const *handlers, size_t n)
{
   char **h = bson_malloc0 ((n + 1) * sizeof *h);

   for (size_t i = 0; i < n; i++)
      h[i] = bson_strdup (handlers[i]);
   return h;
}

/* [{$match: {operationType: "insert", "fullDocument.handler": {$in: [...]}}},
 *  {$project: {_id: 1}}]: only the resume token comes back. */
static bson_t *
watch_pipeline (char **handlers, size_t n)
{
   bson_t *p = bson_new ();
   bson_t stages, st, match, in, arr, proj;
   char buf[16];
   const char *key;

   BSON_APPEND_ARRAY_BEGIN (p, "pipeline", &stages);
   BSON_APPEND_DOCUMENT_BEGIN (&stages, "0", &st);
   BSON_APPEND_DOCUMENT_BEGIN (&st, "$match", &match);
   BSON_APPEND_UTF8 (&match, "operationType", "insert");
   BSON_APPEND_DOCUMENT_BEGIN (&match, "fullDocument.handler", &in);
   BSON_APPEND_ARRAY_BEGIN (&in, "$in", &arr);
   for (size_t i = 0; i < n; i++) {
      bson_uint32_to_string ((uint32_t) i, &key, buf, sizeof buf);
      BSON_APPEND_UTF8 (&arr, key, handlers[i]);
   }
   bson_append_array_end (&in, &arr);
   bson_append_document_end (&match, &in);
   bson_append_document_end (&st, &match);
   bson_append_document_end (&stages, &st);
   BSON_APPEND_DOCUMENT_BEGIN (&stages, "1", &st);
   BSON_APPEND_DOCUMENT_BEGIN (&st, "$project", &proj);
   BSON_APPEND_INT32 (&proj, "_id", 1);
   bson_append_document_end (&st, &proj);
   bson_append_document_end (&stages, &st);
   bson_append_array_end (p, &stages);
   return p;
}

/* Errors after which change streams will not work here: polling only. */
static bool
watch_unsupported (const bson_error_t *e)
{
   if (e->domain != MONGOC_ERROR_SERVER && e->domain != MONGOC_ERROR_QUERY)
      return false;
   switch (e->code) {
   case 40573: /* the $changeStream stage is only supported on replica sets */
   case 40324: /* unrecognized pipeline stage */
   case 59:    /* CommandNotFound */
   case 115:   /* CommandNotSupported */
   case 20:    /* IllegalOperation */
      return true;
   default:
      return false;
   }
}

/* Waits `ms` or until stopped or the handlers change; false when stopped. */
static bool
watch_sleep (store_watch_t *w, int64_t ms)
{
   struct timespec ts = clock_deadline_ms (ms);
   bool go_on;

   pthread_mutex_lock (&w->mu);
   while (!w->stop && !w->changed)
      if (pthread_cond_timedwait (&w->cond, &w->mu, &ts) == ETIMEDOUT)
         break;
   go_on = !w->stop;
   pthread_mutex_unlock (&w->mu);
   return go_on;
}

static void *
watch_thread (void *arg)
{
   store_watch_t *w = arg;
   mongoc_client_t *client = mongoc_client_pool_pop (w->pool);
   mongoc_collection_t *coll = mongoc_client_get_collection (client, w->database, w->coll);
   bson_t *token = NULL;
   int64_t retry_ms = WATCH_RETRY_MIN_MS;
   bool logged_open = false;

   log_set_thread_name ("watch");
   for (;;) {
      mongoc_change_stream_t *cs;
      bson_t *pipeline, opts = BSON_INITIALIZER;
      const bson_t *doc, *err_doc = NULL;
      bson_error_t err = {0};
      char **handlers;
      size_t n;
      bool opened = false, failed = false;

      pthread_mutex_lock (&w->mu);
      if (w->stop) {
         pthread_mutex_unlock (&w->mu);
         break;
      }
      w->changed = false;
      n = w->n_handlers;
      handlers = handlers_copy ((const char *const *) w->handlers, n);
      pthread_mutex_unlock (&w->mu);
      if (n == 0) {
         handlers_free (handlers, n);
         bson_destroy (&opts);
         if (!watch_sleep (w, 60000))
            break;
         continue;
      }
      pipeline = watch_pipeline (handlers, n);
      handlers_free (handlers, n);
      BSON_APPEND_INT64 (&opts, "maxAwaitTimeMS", WATCH_AWAIT_MS);
      if (token)
         BSON_APPEND_DOCUMENT (&opts, "resumeAfter", token);
      cs = mongoc_collection_watch (coll, pipeline, &opts);
      bson_destroy (pipeline);
      bson_destroy (&opts);
      for (;;) {
         bool stop, changed;
         /* Each insert wakes at once (the callback coalesces): the next
          * call may wait for the next batch. */
         while (mongoc_change_stream_next (cs, &doc))
            w->cb (w->ctx);
         if (mongoc_change_stream_error_document (cs, &err, &err_doc)) {
            failed = true;
            break;
         }
         if (!opened) {
            opened = true;
            pthread_mutex_lock (&w->mu);
            w->active = true;
            pthread_mutex_unlock (&w->mu);
            if (!logged_open)
               log_info ("dispatch: watching %s.%s for new deliveries: a commit through any proxy wakes this one at once",
                         w->database,
                         w->coll);
            logged_open = true;
            retry_ms = WATCH_RETRY_MIN_MS;
         }
         {
            const bson_t *t = mongoc_change_stream_get_resume_token (cs);
            if (t) {
               bson_destroy (token);
               token = bson_copy (t);
            }
         }
         pthread_mutex_lock (&w->mu);
         stop = w->stop;
         changed = w->changed;
         pthread_mutex_unlock (&w->mu);
         if (stop || changed)
            break;
      }
      pthread_mutex_lock (&w->mu);
      w->active = false;
      pthread_mutex_unlock (&w->mu);
      if (failed) {
         if (watch_unsupported (&err)) {
            log_info ("dispatch: change streams are not available (%s): commits through other proxies are picked up "
                      "by polling, every poll_interval_ms",
                      err.message);
            mongoc_change_stream_destroy (cs);
            break;
         }
         if (err.domain == MONGOC_ERROR_SERVER && err.code == SERVER_CHANGE_STREAM_HISTORY_LOST && token) {
            /* ChangeStreamHistoryLost: start anew; what was missed is
             * found by the claim this wake-up makes. */
            bson_destroy (token);
            token = NULL;
            w->cb (w->ctx);
         }
         log_warn ("dispatch: watching new deliveries: %s (again in %" PRId64 " ms; polling meanwhile)", err.message, retry_ms);
         mongoc_change_stream_destroy (cs);
         if (!watch_sleep (w, retry_ms))
            break;
         retry_ms = retry_ms * 2 > WATCH_RETRY_MAX_MS ? WATCH_RETRY_MAX_MS : retry_ms * 2;
         w->cb (w->ctx); /* what came meanwhile */
         continue;
      }
      mongoc_change_stream_destroy (cs);
   }
   bson_destroy (token);
   mongoc_collection_destroy (coll);
   mongoc_client_pool_push (w->pool, client);
   return NULL;
}

store_watch_t *
store_watch_new (const config_t *cfg,
                 const char *const *handlers,
                 size_t n,
                 store_watch_cb_t cb,
                 void *ctx,
                 bson_error_t *error)
{
   store_watch_t *w = bson_malloc0 (sizeof *w);
   worker_pool_opts_t po = {
      .appname = "relaybus-proxy watch",
      .server_selection_ms = cfg->upstream_connect_timeout_ms < 2000 ? (int32_t) cfg->upstream_connect_timeout_ms : 2000,
      .max_pool_size = 1,
   };
   int rc;

   if (!outbox_collection_name (cfg->collection_prefix, OUTBOX_DELIVERIES, w->coll, sizeof w->coll)) {
      bson_set_error (error, STORE_ERROR_DOMAIN, STORE_ERROR_INVALID, "watch: collection prefix \"%s\" is too long", cfg->collection_prefix);
      bson_free (w);
      return NULL;
   }
   w->pool = worker_pool_new (cfg->upstream, &po, "watch", error);
   if (!w->pool) {
      bson_free (w);
      return NULL;
   }
   w->database = bson_strdup (cfg->outbox_database);
   w->cb = cb;
   w->ctx = ctx;
   w->handlers = handlers_copy (handlers, n);
   w->n_handlers = n;
   pthread_mutex_init (&w->mu, NULL);
   pthread_cond_init (&w->cond, NULL);
   rc = pthread_create (&w->thread, NULL, watch_thread, w);
   if (rc != 0) {
      bson_set_error (error, STORE_ERROR_DOMAIN, STORE_ERROR_INVALID, "watch: cannot start the thread: %s", strerror (rc));
      store_watch_destroy (w);
      return NULL;
   }
   w->started = true;
   return w;
}

void
store_watch_set_handlers (store_watch_t *w, const char *const *handlers, size_t n)
{
   char **old;
   size_t n_old;

   if (!w)
      return;
   pthread_mutex_lock (&w->mu);
   old = w->handlers;
   n_old = w->n_handlers;
   w->handlers = handlers_copy (handlers, n);
   w->n_handlers = n;
   w->changed = true;
   pthread_cond_broadcast (&w->cond);
   pthread_mutex_unlock (&w->mu);
   handlers_free (old, n_old);
}

void
store_watch_destroy (store_watch_t *w)
{
   if (!w)
      return;
   if (w->started) {
      pthread_mutex_lock (&w->mu);
      w->stop = true;
      pthread_cond_broadcast (&w->cond);
      pthread_mutex_unlock (&w->mu);
      pthread_join (w->thread, NULL);
   }
   pthread_mutex_destroy (&w->mu);
   pthread_cond_destroy (&w->cond);
   handlers_free (w->handlers, w->n_handlers);
   bson_free (w->database);
   mongoc_client_pool_destroy (w->pool);
   bson_free (w);
}
