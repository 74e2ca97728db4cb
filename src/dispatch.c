/*
 * dispatch.c - the dispatcher thread: claims, webhook requests, batched
 * completions, retries, dead letters, lease renewal and graceful hand-back.
 *
 * One thread owns an event base, a DNS base, the TLS context, a
 * mongoc_client_pool and one store instance (so its lease owner name,
 * "<host>/<pid>/<random>", is unique per process instance).  Store calls
 * block this thread for a round trip or a few; HTTP I/O of the handlers
 * waits meanwhile, the forwarding loop never does.
 *
 * The loop, driven by timers on the dispatcher's base:
 *   tick    claims up to batch_size deliveries for the webhook handlers
 *           with free slots (each handler's limit is its free concurrency)
 *           and starts their requests; it runs again at once when a batch
 *           came back full, after completions are flushed (a key's next
 *           delivery may now be claimable), on dispatch_wake, and otherwise
 *           every poll_interval_ms.
 *   flush   completes the deliveries that finished since the last flush
 *           with one completeMany (the "completion batching").
 *   renew   every lease_ms / 3, extends the lease of each lane with work in
 *           flight (one extendLease per lane).
 *   stop    stops claiming, waits for requests in flight (bounded), releases
 *           what still runs, flushes, relinquishes the lanes, exits.
 *
 * Every job is in exactly one place: the running list (request in flight)
 * or the done list (waiting for the flush); it is freed when it leaves
 * both.
 */
#include "dispatch.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include <event2/dns.h>
#include <event2/event.h>
#include <mongoc/mongoc.h>
#include <openssl/rand.h>

#include "log.h"
#include "metrics.h"
#include "store.h"
#include "webhook.h"
#include "publish_hooks.h"

/* How long a stop waits for requests in flight at most. */
#define DISPATCH_STOP_WAIT_MAX_MS 10000
/* Setup retry interval while the upstream is unreachable. */
#define DISPATCH_SETUP_RETRY_MS 2000

typedef struct handler_rt {
   const config_handler_t *cfg; /* in dispatcher_t.cfg, which we hold */
   webhook_t *wh;
   int64_t running;
} handler_rt_t;

typedef struct job {
   struct job *prev, *next;
   void *disp; /* the dispatcher_t */
   handler_rt_t *h;
   store_delivery_t d; /* owned: moved out of the claim's batch */
   webhook_req_t *req;
   int64_t started_ms; /* when its request started, for the latency metric */
} job_t;

/* The dispatcher.  Created by dispatch_start on the main thread, then used
 * only by its own thread until dispatch_stop joins it and frees it. */
typedef struct {
   config_t *cfg; /* our reference */
   pthread_t thread;
   bool thread_started;
   struct event_base *base;
   struct evdns_base *dns;
   SSL_CTX *ssl;
   mongoc_uri_t *uri;
   mongoc_client_pool_t *pool;
   store_t *store;
   char owner[160];

   handler_rt_t *handlers;
   store_claim_handler_t *claim_handlers;
   size_t n_handlers;
   bool dispatching; /* enabled with at least one webhook handler */

   struct event *setup_ev, *tick_ev, *wake_ev, *flush_ev, *renew_ev, *stop_ev, *deadline_ev, *reload_ev;
   config_t *pending_cfg; /* a reload waiting for the thread; guarded by g_mu */
   job_t *running;
   size_t n_running;
   job_t **done;
   size_t n_done, cap_done;
   bool setup_done, stopping, finished;
   atomic_bool wake_pending;
   uint64_t rnd;
} dispatcher_t;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static dispatcher_t *g_d;

static struct {
   atomic_uint_fast64_t claims, claimed, completed, rescheduled, dead, lost_completions, http_requests;
} g_stats;

static int64_t
now_ms (void)
{
   struct timeval tv;
   gettimeofday (&tv, NULL);
   return (int64_t) tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

static void
schedule (struct event *ev, int64_t ms)
{
   struct timeval tv = {(time_t) (ms / 1000), (suseconds_t) ((ms % 1000) * 1000)};
   evtimer_add (ev, &tv);
}

static uint64_t
next_rnd (dispatcher_t *d)
{
   /* xorshift64*: jitter only, seeded from OpenSSL. */
   d->rnd ^= d->rnd >> 12;
   d->rnd ^= d->rnd << 25;
   d->rnd ^= d->rnd >> 27;
   return d->rnd * 2685821657736338717ULL;
}

static void
job_free (job_t *j)
{
   bson_free (j->d.event_id);
   bson_free (j->d.handler);
   bson_free (j->d.event_type);
   bson_free (j->d.key);
   if (j->d.event)
      bson_destroy (j->d.event);
   bson_free (j);
}

static void
running_remove (dispatcher_t *d, job_t *j)
{
   if (j->prev)
      j->prev->next = j->next;
   else
      d->running = j->next;
   if (j->next)
      j->next->prev = j->prev;
   j->prev = j->next = NULL;
   d->n_running--;
   j->h->running--;
}

static store_ref_t
job_ref (const job_t *j)
{
   store_ref_t r = {j->d.id, j->d.lease};
   return r;
}

static void finish (dispatcher_t *d);

/* --------------------------------------------------------------- settle */

static void
bury (dispatcher_t *d, job_t *j, const char *why)
{
   store_ref_t r = job_ref (j);
   bson_error_t err;
   bool applied = false;
   char hex[25];

   bson_oid_to_string (&j->d.id, hex);
   if (!store_bury (d->store, &r, now_ms (), why, &applied, &err))
      log_warn ("dispatch: %s delivery %s: bury failed: %s", j->h->cfg->name, hex, err.message);
   else if (applied) {
      atomic_fetch_add (&g_stats.dead, 1);
      log_warn ("dispatch: %s delivery %s (event %s) is dead after attempt %d: %s",
                j->h->cfg->name,
                hex,
                j->d.event_id,
                j->d.attempt,
                why);
   }
}

static void
reschedule (dispatcher_t *d, job_t *j, int64_t delay_ms, const char *why)
{
   store_ref_t r = job_ref (j);
   bson_error_t err;
   bool applied = false;
   int64_t now = now_ms ();
   char hex[25];

   bson_oid_to_string (&j->d.id, hex);
   if (!store_reschedule (d->store, &r, now, now + delay_ms, why, &applied, &err))
      log_warn ("dispatch: %s delivery %s: reschedule failed: %s", j->h->cfg->name, hex, err.message);
   else if (applied) {
      atomic_fetch_add (&g_stats.rescheduled, 1);
      log_info ("dispatch: %s delivery %s attempt %d failed (%s); retry in %" PRId64 " ms",
                j->h->cfg->name,
                hex,
                j->d.attempt,
                why,
                delay_ms);
   }
}

/* Completes everything in the done list with one completeMany. */
static void
flush (dispatcher_t *d)
{
   store_ref_t *refs;
   bool *ok;
   bson_error_t err;
   size_t n = d->n_done, proven = 0;

   if (n == 0)
      return;
   refs = bson_malloc (n * sizeof *refs);
   ok = bson_malloc0 (n * sizeof *ok);
   for (size_t i = 0; i < n; i++)
      refs[i] = job_ref (d->done[i]);
   if (!store_complete_many (d->store, refs, n, now_ms (), ok, &err))
      log_warn ("dispatch: completing %zu deliveries failed (they run again after their lease): %s", n, err.message);
   for (size_t i = 0; i < n; i++) {
      proven += ok[i];
      job_free (d->done[i]);
   }
   atomic_fetch_add (&g_stats.completed, proven);
   if (proven < n) {
      atomic_fetch_add (&g_stats.lost_completions, n - proven);
      log_warn ("dispatch: %zu of %zu completions not proven (a lane changed hands): they may run again", n - proven, n);
   }
   d->n_done = 0;
   bson_free (refs);
   bson_free (ok);
}

static void
flush_cb (evutil_socket_t fd, short what, void *arg)
{
   dispatcher_t *d = arg;

   (void) fd;
   (void) what;
   flush (d);
   if (!d->stopping)
      schedule (d->tick_ev, 0); /* a key's next delivery may be claimable */
}

static void
job_done_cb (const webhook_result_t *res, void *arg)
{
   job_t *j = arg;
   handler_rt_t *h = j->h;
   dispatcher_t *d = j->disp;

   j->req = NULL;
   running_remove (d, j);
   {
      metrics_outcome_t mo = METRICS_DELIVERY_RETRIED;
      if (res->outcome == WEBHOOK_OUTCOME_COMPLETE)
         mo = METRICS_DELIVERY_COMPLETED;
      else if (res->outcome == WEBHOOK_OUTCOME_DEAD || j->d.attempt >= h->cfg->max_attempts)
         mo = METRICS_DELIVERY_DEAD;
      metrics_delivery_observe (h->cfg->name, mo, now_ms () - j->started_ms);
   }
   if (res->outcome == WEBHOOK_OUTCOME_COMPLETE) {
      if (d->n_done == d->cap_done) {
         d->cap_done = d->cap_done ? d->cap_done * 2 : 64;
         d->done = bson_realloc (d->done, d->cap_done * sizeof *d->done);
      }
      d->done[d->n_done++] = j;
      if ((int64_t) d->n_done >= d->cfg->batch_size)
         flush (d);
      else
         event_active (d->flush_ev, EV_TIMEOUT, 0);
   } else {
      if (res->outcome == WEBHOOK_OUTCOME_DEAD)
         bury (d, j, res->error);
      else if (j->d.attempt >= h->cfg->max_attempts)
         bury (d, j, res->error);
      else
         reschedule (d,
                     j,
                     res->outcome == WEBHOOK_OUTCOME_RETRY_AFTER && res->retry_after_ms >= 0
                        ? res->retry_after_ms
                        : webhook_backoff_ms (j->d.attempt, next_rnd (d)),
                     res->error);
      job_free (j);
      if (!d->stopping)
         schedule (d->tick_ev, 0);
   }
   if (d->stopping && d->n_running == 0)
      finish (d);
}

/* ---------------------------------------------------------------- claim */

static void
start_job (dispatcher_t *d, handler_rt_t *h, store_delivery_t *item)
{
   job_t *j = bson_malloc0 (sizeof *j);
   bson_error_t err;
   char hex[25];
   char *body;
   size_t len = 0;

   /* Move the delivery out of the batch. */
   j->d = *item;
   memset (item, 0, sizeof *item);
   j->h = h;
   j->disp = d;
   bson_oid_to_string (&j->d.id, hex);
   if (j->d.attempt > h->cfg->max_attempts) {
      /* Its workers kept losing their leases (crashing): the charged
       * attempts ran out before this one started. */
      bury (d, j, "attempts exhausted: lost its lease on every attempt");
      metrics_delivery_observe (h->cfg->name, METRICS_DELIVERY_DEAD, 0);
      job_free (j);
      return;
   }
   body = webhook_body (&j->d, &len);
   j->next = d->running;
   if (d->running)
      d->running->prev = j;
   d->running = j;
   d->n_running++;
   h->running++;
   atomic_fetch_add (&g_stats.http_requests, 1);
   j->started_ms = now_ms ();
   j->req = webhook_send (h->wh, hex, now_ms () / 1000, body, len, job_done_cb, j, &err);
   bson_free (body);
   if (!j->req) {
      webhook_result_t res = {.outcome = WEBHOOK_OUTCOME_RETRY, .retry_after_ms = -1};
      bson_strncpy (res.error, err.message, sizeof res.error);
      job_done_cb (&res, j);
   }
}

static void
tick_cb (evutil_socket_t fd, short what, void *arg)
{
   dispatcher_t *d = arg;
   store_claim_opts_t o;
   store_batch_t b = {0};
   bson_error_t err;
   size_t total = 0, limit;
   bool ok;

   (void) fd;
   (void) what;
   if (d->stopping || !d->setup_done || !d->dispatching)
      return;
   flush (d);
   for (size_t i = 0; i < d->n_handlers; i++) {
      handler_rt_t *h = &d->handlers[i];
      int64_t free_slots = h->wh ? h->cfg->concurrency - h->running : 0;
      d->claim_handlers[i].limit = free_slots > 0 ? (size_t) free_slots : 0;
      total += d->claim_handlers[i].limit;
   }
   limit = total < (size_t) d->cfg->batch_size ? total : (size_t) d->cfg->batch_size;
   if (limit == 0)
      return; /* every slot busy: a finishing request ticks again */
   o.handlers = d->claim_handlers;
   o.n_handlers = d->n_handlers;
   o.limit = limit;
   o.now = now_ms ();
   o.lease_ms = d->cfg->lease_ms;
   atomic_fetch_add (&g_stats.claims, 1);
   ok = store_claim (d->store, &o, &b, &err);
   metrics_claim_observe (now_ms () - o.now);
   if (!ok) {
      log_warn ("dispatch: claim failed (retry in %" PRId64 " ms): %s", d->cfg->poll_interval_ms, err.message);
      schedule (d->tick_ev, d->cfg->poll_interval_ms);
      return;
   }
   atomic_fetch_add (&g_stats.claimed, b.n);
   if (b.n > 0)
      log_debug ("dispatch: claimed %zu of %zu", b.n, limit);
   for (size_t i = 0; i < b.n; i++) {
      for (size_t k = 0; k < d->n_handlers; k++)
         if (!strcmp (d->handlers[k].cfg->name, b.items[i].handler)) {
            start_job (d, &d->handlers[k], &b.items[i]);
            break;
         }
   }
   store_batch_clear (&b);
   /* A full batch below the free slots: more may be waiting. */
   schedule (d->tick_ev, (b.n == limit && limit < total) ? 0 : d->cfg->poll_interval_ms);
}

static void
wake_cb (evutil_socket_t fd, short what, void *arg)
{
   dispatcher_t *d = arg;

   (void) fd;
   (void) what;
   atomic_store (&d->wake_pending, false);
   if (!d->stopping && d->setup_done)
      schedule (d->tick_ev, 0);
}

/* ---------------------------------------------------------------- renew */

static void
renew_cb (evutil_socket_t fd, short what, void *arg)
{
   dispatcher_t *d = arg;
   bool seen[OUTBOX_LANES] = {0};
   int64_t now = now_ms ();

   (void) fd;
   (void) what;
   for (job_t *j = d->running; j; j = j->next) {
      outbox_lease_t lease;
      store_ref_t r = job_ref (j);
      bson_error_t err;
      bool applied = false;
      if (!outbox_lease_parse (j->d.lease, &lease) || seen[lease.lane_id])
         continue;
      seen[lease.lane_id] = true;
      if (!store_extend_lease (d->store, &r, now, d->cfg->lease_ms, &applied, &err))
         log_warn ("dispatch: renewing lane %u: %s", lease.lane_id, err.message);
      else if (!applied)
         log_warn ("dispatch: lane %u was lost before its renewal; its deliveries may run twice", lease.lane_id);
   }
}

/* ---------------------------------------------------------------- setup */

static void
setup_cb (evutil_socket_t fd, short what, void *arg)
{
   dispatcher_t *d = arg;
   bson_error_t err;

   (void) fd;
   (void) what;
   if (d->stopping)
      return;
   if (!store_setup (d->store, &err)) {
      log_warn ("dispatch: outbox setup failed (retry in %d ms): %s", DISPATCH_SETUP_RETRY_MS, err.message);
      schedule (d->setup_ev, DISPATCH_SETUP_RETRY_MS);
      return;
   }
   d->setup_done = true;
   if (d->dispatching)
      schedule (d->tick_ev, 0);
   else
      event_base_loopexit (d->base, NULL); /* setup was all there was to do */
}

/* ----------------------------------------------------------------- stop */

static void
finish (dispatcher_t *d)
{
   bson_error_t err;
   int64_t now = now_ms ();

   bool reachable = d->setup_done;

   if (d->finished)
      return;
   d->finished = true;
   evtimer_del (d->deadline_ev);
   /* After the first failed store call (the upstream is gone), skip the
    * rest: every call would wait for server selection, and the leases run
    * out on their own. */
   while (d->running) {
      job_t *j = d->running;
      store_ref_t r = job_ref (j);
      bool applied;
      webhook_cancel (j->req);
      running_remove (d, j);
      if (reachable && !store_release (d->store, &r, now, &applied, &err)) {
         log_warn ("dispatch: releasing a delivery at stop: %s", err.message);
         reachable = false;
      }
      job_free (j);
   }
   if (reachable)
      flush (d);
   if (reachable && !store_relinquish (d->store, now, &err))
      log_warn ("dispatch: handing lanes back: %s", err.message);
   if (!reachable)
      log_warn ("dispatch: stopped without handing lanes back (the upstream is unreachable): they free up after lease_ms");
   for (size_t i = 0; i < d->n_done; i++)
      job_free (d->done[i]);
   d->n_done = 0;
   event_base_loopexit (d->base, NULL);
}

static void
deadline_cb (evutil_socket_t fd, short what, void *arg)
{
   dispatcher_t *d = arg;
   (void) fd;
   (void) what;
   log_warn ("dispatch: %zu request(s) still running at the stop deadline: released", d->n_running);
   finish (d);
}

static void
stop_cb (evutil_socket_t fd, short what, void *arg)
{
   dispatcher_t *d = arg;
   int64_t wait = 0;

   (void) fd;
   (void) what;
   d->stopping = true;
   evtimer_del (d->tick_ev);
   evtimer_del (d->setup_ev);
   if (d->n_running == 0) {
      finish (d);
      return;
   }
   for (size_t i = 0; i < d->n_handlers; i++)
      if (d->handlers[i].cfg->timeout_ms > wait)
         wait = d->handlers[i].cfg->timeout_ms;
   wait += 500;
   if (wait > DISPATCH_STOP_WAIT_MAX_MS)
      wait = DISPATCH_STOP_WAIT_MAX_MS;
   log_info ("dispatch: stopping; waiting up to %" PRId64 " ms for %zu request(s)", wait, d->n_running);
   schedule (d->deadline_ev, wait);
}

static void *
dispatch_thread (void *arg)
{
   dispatcher_t *d = arg;

   log_set_thread_name ("dispatch");
   event_base_dispatch (d->base);
   log_info ("dispatch: stopped");
   return NULL;
}

/* --------------------------------------------------------------- reload */

static void
renew_schedule (dispatcher_t *d)
{
   struct timeval tv = {(time_t) (d->cfg->lease_ms / 3000), (suseconds_t) ((d->cfg->lease_ms / 3 % 1000) * 1000)};
   event_add (d->renew_ev, &tv);
}

/* Takes a reloaded snapshot: poll_interval_ms, batch_size and lease_ms
 * apply from the next claim; handlers cannot change on reload (config.c
 * refuses it), so each handler is re-pointed at its entry in the new
 * snapshot. */
static void
reload_cb (evutil_socket_t fd, short what, void *arg)
{
   dispatcher_t *d = arg;
   config_t *next, *old;

   (void) fd;
   (void) what;
   pthread_mutex_lock (&g_mu);
   next = d->pending_cfg;
   d->pending_cfg = NULL;
   pthread_mutex_unlock (&g_mu);
   if (!next)
      return;
   for (size_t i = 0; i < d->n_handlers; i++) {
      const config_handler_t *found = NULL;
      for (size_t k = 0; k < next->n_handlers; k++)
         if (!strcmp (next->handlers[k].name, d->handlers[i].cfg->name))
            found = &next->handlers[k];
      if (!found) {
         log_error ("dispatch: reload without handler %s: keeping the previous settings", d->handlers[i].cfg->name);
         config_release (next);
         return;
      }
   }
   for (size_t i = 0; i < d->n_handlers; i++)
      for (size_t k = 0; k < next->n_handlers; k++)
         if (!strcmp (next->handlers[k].name, d->handlers[i].cfg->name)) {
            d->handlers[i].cfg = &next->handlers[k];
            d->claim_handlers[i].handler = next->handlers[k].name;
         }
   old = d->cfg;
   d->cfg = next;
   config_release (old);
   if (d->dispatching) {
      renew_schedule (d);
      if (d->setup_done && !d->stopping)
         schedule (d->tick_ev, 0); /* the next poll follows the new interval */
   }
   log_info ("dispatch: reloaded (batch %" PRId64 ", lease %" PRId64 " ms, poll %" PRId64 " ms)",
             d->cfg->batch_size,
             d->cfg->lease_ms,
             d->cfg->poll_interval_ms);
}

/* --------------------------------------------------------------- public */

static void
dispatcher_free (dispatcher_t *d)
{
   if (!d)
      return;
   for (size_t i = 0; i < d->n_done; i++)
      job_free (d->done[i]);
   while (d->running) {
      job_t *j = d->running;
      running_remove (d, j);
      job_free (j);
   }
   bson_free (d->done);
   for (size_t i = 0; i < d->n_handlers; i++)
      webhook_destroy (d->handlers[i].wh);
   bson_free (d->handlers);
   bson_free (d->claim_handlers);
   config_release (d->pending_cfg);
   struct event *evs[] = {d->setup_ev, d->tick_ev, d->wake_ev, d->flush_ev, d->renew_ev, d->stop_ev, d->deadline_ev, d->reload_ev};
   for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++)
      if (evs[i])
         event_free (evs[i]);
   if (d->dns)
      evdns_base_free (d->dns, 0);
   if (d->base)
      event_base_free (d->base);
   SSL_CTX_free (d->ssl);
   store_destroy (d->store);
   if (d->pool)
      mongoc_client_pool_destroy (d->pool);
   if (d->uri)
      mongoc_uri_destroy (d->uri);
   config_release (d->cfg);
   bson_free (d);
}

bool
dispatch_start (config_t *cfg, bson_error_t *error)
{
   dispatcher_t *d = bson_malloc0 (sizeof *d);
   store_opts_t so = {0};
   bson_error_t err;
   size_t n_webhooks = 0;
   bool need_tls = false;

   d->cfg = config_retain (cfg);
   d->uri = mongoc_uri_new_with_error (cfg->upstream, &err);
   if (!d->uri) {
      bson_set_error (error, WEBHOOK_ERROR_DOMAIN, 20, "dispatch: upstream URI: %s", err.message);
      goto fail;
   }
   mongoc_uri_set_appname (d->uri, "relaybus-proxy dispatch");
   if (!mongoc_uri_has_option (d->uri, MONGOC_URI_SERVERSELECTIONTIMEOUTMS))
      mongoc_uri_set_option_as_int32 (d->uri,
                                      MONGOC_URI_SERVERSELECTIONTIMEOUTMS,
                                      cfg->upstream_connect_timeout_ms < 2000 ? (int32_t) cfg->upstream_connect_timeout_ms : 2000);
   d->pool = mongoc_client_pool_new_with_error (d->uri, &err);
   if (!d->pool) {
      bson_set_error (error, WEBHOOK_ERROR_DOMAIN, 21, "dispatch: client pool: %s", err.message);
      goto fail;
   }
   mongoc_client_pool_set_error_api (d->pool, MONGOC_ERROR_API_VERSION_2);
   store_make_owner (d->owner, sizeof d->owner);
   so.database = cfg->outbox_database;
   so.prefix = cfg->collection_prefix;
   so.completion_history = cfg->completion_history;
   so.owner = d->owner;
   d->store = store_new (d->pool, &so, error);
   if (!d->store)
      goto fail;

   d->base = event_base_new ();
   if (!d->base) {
      bson_set_error (error, WEBHOOK_ERROR_DOMAIN, 22, "dispatch: cannot create an event base");
      goto fail;
   }
   for (size_t i = 0; i < cfg->n_handlers; i++)
      if (cfg->handlers[i].kind_id == HANDLER_KIND_WEBHOOK) {
         n_webhooks++;
         if (cfg->handlers[i].url && !strncasecmp (cfg->handlers[i].url, "https:", 6))
            need_tls = true;
      }
   d->dispatching = cfg->dispatch_enabled && n_webhooks > 0;
   if (d->dispatching) {
      d->dns = evdns_base_new (d->base, EVDNS_BASE_INITIALIZE_NAMESERVERS);
      if (need_tls && !(d->ssl = webhook_ssl_ctx_new (error)))
         goto fail;
      d->handlers = bson_malloc0 (n_webhooks * sizeof *d->handlers);
      d->claim_handlers = bson_malloc0 (n_webhooks * sizeof *d->claim_handlers);
      for (size_t i = 0; i < cfg->n_handlers; i++) {
         handler_rt_t *h;
         if (cfg->handlers[i].kind_id != HANDLER_KIND_WEBHOOK)
            continue;
         h = &d->handlers[d->n_handlers];
         h->cfg = &cfg->handlers[i];
         h->wh = webhook_new (d->base, d->dns, d->ssl, h->cfg, error);
         if (!h->wh)
            goto fail;
         d->claim_handlers[d->n_handlers].handler = h->cfg->name;
         d->n_handlers++;
      }
   }
   if (RAND_bytes ((unsigned char *) &d->rnd, sizeof d->rnd) != 1 || d->rnd == 0)
      d->rnd = (uint64_t) now_ms () | 1;
   d->setup_ev = evtimer_new (d->base, setup_cb, d);
   d->tick_ev = evtimer_new (d->base, tick_cb, d);
   d->wake_ev = event_new (d->base, -1, 0, wake_cb, d);
   d->flush_ev = event_new (d->base, -1, 0, flush_cb, d);
   d->renew_ev = event_new (d->base, -1, EV_PERSIST, renew_cb, d);
   d->stop_ev = event_new (d->base, -1, 0, stop_cb, d);
   d->deadline_ev = evtimer_new (d->base, deadline_cb, d);
   d->reload_ev = event_new (d->base, -1, 0, reload_cb, d);
   if (d->dispatching)
      renew_schedule (d);

   /* Setup now, so the publishing path finds the collections; if the
    * upstream is not there yet, the thread retries. */
   if (store_setup (d->store, &err)) {
      d->setup_done = true;
   } else {
      log_warn ("dispatch: outbox setup failed (the dispatcher retries): %s", err.message);
      schedule (d->setup_ev, DISPATCH_SETUP_RETRY_MS);
   }
   if (d->setup_done && !d->dispatching) {
      log_info ("dispatch: not dispatching (%s)", cfg->dispatch_enabled ? "no webhook handler" : "[dispatch] enabled = false");
      dispatcher_free (d);
      return true;
   }
   if (d->setup_done)
      schedule (d->tick_ev, 0);
   pthread_mutex_lock (&g_mu);
   g_d = d;
   pthread_mutex_unlock (&g_mu);
   if (pthread_create (&d->thread, NULL, dispatch_thread, d) != 0) {
      pthread_mutex_lock (&g_mu);
      g_d = NULL;
      pthread_mutex_unlock (&g_mu);
      bson_set_error (error, WEBHOOK_ERROR_DOMAIN, 23, "dispatch: cannot start the thread");
      goto fail;
   }
   d->thread_started = true;
   /* The publishing path wakes us after a commit it injected into. */
   publish_set_wake_hook (dispatch_wake);
   if (d->dispatching)
      log_info ("dispatch: %zu webhook handler(s), owner %s, batch %" PRId64 ", lease %" PRId64 " ms, poll %" PRId64 " ms",
                d->n_handlers,
                d->owner,
                cfg->batch_size,
                cfg->lease_ms,
                cfg->poll_interval_ms);
   return true;

fail:
   dispatcher_free (d);
   return false;
}

void
dispatch_stop (void)
{
   dispatcher_t *d;

   pthread_mutex_lock (&g_mu);
   d = g_d;
   pthread_mutex_unlock (&g_mu);
   if (!d)
      return;
   publish_set_wake_hook (NULL);
   if (d->thread_started) {
      event_active (d->stop_ev, EV_TIMEOUT, 0);
      pthread_join (d->thread, NULL);
   }
   pthread_mutex_lock (&g_mu);
   g_d = NULL;
   pthread_mutex_unlock (&g_mu);
   dispatcher_free (d);
}

void
dispatch_reload (config_t *cfg)
{
   dispatcher_t *d;

   pthread_mutex_lock (&g_mu);
   d = g_d;
   if (d && d->thread_started) {
      config_release (d->pending_cfg);
      d->pending_cfg = config_retain (cfg);
      event_active (d->reload_ev, EV_TIMEOUT, 0);
   }
   pthread_mutex_unlock (&g_mu);
}

void
dispatch_wake (void)
{
   dispatcher_t *d;

   /* Never waits: if the lock is busy (start or stop), skip; the poll
    * interval covers it. */
   if (pthread_mutex_trylock (&g_mu) != 0)
      return;
   d = g_d;
   if (d && !atomic_exchange (&d->wake_pending, true))
      event_active (d->wake_ev, EV_TIMEOUT, 0);
   pthread_mutex_unlock (&g_mu);
}

void
dispatch_get_stats (dispatch_stats_t *out)
{
   out->claims = atomic_load (&g_stats.claims);
   out->claimed = atomic_load (&g_stats.claimed);
   out->completed = atomic_load (&g_stats.completed);
   out->rescheduled = atomic_load (&g_stats.rescheduled);
   out->dead = atomic_load (&g_stats.dead);
   out->lost_completions = atomic_load (&g_stats.lost_completions);
   out->http_requests = atomic_load (&g_stats.http_requests);
}
