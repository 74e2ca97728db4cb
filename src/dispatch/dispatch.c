/*
 * dispatch/dispatch.c - the dispatcher thread: claims, sends (webhook requests,
 * broker publishes, through dispatch/transport.h), batched
 * completions, retries, dead letters, lease renewal and graceful hand-back.
 *
 * One worker thread (base/worker.h: its event base, its mongoc pool with
 * appName "relaybus-proxy dispatch" and its lease owner name,
 * "<host>/<pid>/<random>", unique per process instance) owns a DNS base,
 * the TLS context, a store instance for the outbox's set-up, the fleet
 * and the purge, and one store instance per lane space its handlers claim
 * in: each dispatched handler has lanes of its own (base/outbox.h), so a
 * handler that holds a lane, on this proxy or another, never keeps
 * another handler's deliveries of that lane waiting.  Store calls block this thread
 * for a round trip or a few; HTTP I/O of the handlers waits meanwhile, the
 * forwarding loop never does.
 *
 * The loop, driven by timers on the dispatcher's base:
 *   tick    claims up to batch_size deliveries for the dispatched handlers
 *           with free slots (each handler's limit is its free concurrency)
 *           and starts their requests; it runs again at once when a batch
 *           came back full, after completions are flushed (a key's next
 *           delivery may now be claimable), on dispatch_wake, and otherwise
 *           every poll_interval_ms.
 *   flush   completes the deliveries that finished since the last flush
 *           with one completeMany (the "completion batching").
 *   renew   every lease_ms / 3, on a thread of its own (a slow claim never
 *           delays it), renews every running delivery: one transaction per
 *           lane checks each of its claims and extends the lane.
 *   settle  retries, with backoff, the completions, burials and
 *           reschedules that failed (a failover, a lost connection): the
 *           job is kept until it is settled, its lease turns out stale, or
 *           one lease has passed (then the store takes the claim back as
 *           abandoned, and the delivery runs again).
 *   purge   every purge_interval, a scheduled purge run (retain_completed,
 *           retain_dead): one bounded batch per step under the store's
 *           purge lease, a short pause between steps so claims and
 *           flushes interleave, one log line per run that removed
 *           something.  It runs whenever [dispatch] enabled is true, also
 *           without dispatched handlers (the thread then only purges).
 *   fleet   every [outbox] handler_heartbeat, records this instance's
 *           handlers and heartbeat (the server's clock) in the outbox and
 *           reads the fleet's (base/fleet.h publishes the snapshot
 *           injection uses; the proxy listens once the first is read); a
 *           handler this instance declares that is not in the fleet's set
 *           yet is backfilled (events created from transaction_lifetime
 *           plus a liveness bound before its first declaration whose
 *           handler list lacks it) until as long after, and not claimed
 *           before that ends, so each key is still delivered in order;
 *           handlers no instance declared for handler_retire_after leave
 *           the set and are retired under a lease (dispatch/fleet.c).  It
 *           runs in every process, dispatching or not.
 *   rate    a handler with a rate_limit starts a job only with a token
 *           (dispatch/pace.h); the others wait, claimed and renewed, and
 *           start as the tokens come.  Claims take for it only what its
 *           bucket starts within DISPATCH_RATE_HORIZON_MS.
 *   stop    stops claiming, waits for requests in flight (bounded), fences
 *           the transports (transport_fence: a Kafka producer flushes),
 *           releases what still runs, flushes, relinquishes the lanes,
 *           exits.
 *
 * Every started job is in exactly one place: the running list (request
 * in flight), the done list (waiting for the flush) or the unsettled list
 * (a settling call failed; retried); it is freed when it leaves all
 * three.  Before it starts a job waits as a follower of its key's
 * previous one or for a token.  Unsettled and waiting jobs count against
 * their handler's concurrency, so every list is bounded.  The settling
 * call that ends an attempt records it (job_attempt_end).
 */
#include "dispatch/dispatch.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>

#include <event2/event.h>

#include "base/assert.h"
#include "base/clock.h"
#include "base/fleet.h"
#include "base/log.h"
#include "base/counters.h"
#include "base/trace.h"
#include "dispatch/fleet.h"
#include "store/ops.h"
#include "store/store.h"
#include "store/watch.h"
#include "dispatch/consumer.h"
#include "dispatch/transport.h"
#include "dispatch/delivery.h"
#include "dispatch/pace.h"
#include "dispatch/purge.h"
#include "dispatch/renew.h"
#include "dispatch/span.h"
#include "dispatch/webhook.h"
#include "base/worker.h"

/* Deliveries of one key one claim may take (store_claim_opts_t.key_run):
 * they run one after the other, each once the one before it is completed,
 * so a claim gives a batch even with fewer keys than its size. */
#define DISPATCH_KEY_RUN 4
/* How long a stop waits for requests in flight at most. */
#define DISPATCH_STOP_WAIT_MAX_MS 10000
/* Setup retry interval while the upstream is unreachable. */
#define DISPATCH_SETUP_RETRY_MS 2000
/* Backoff of a settling call that failed: doubles from the first to the
 * last. */
#define DISPATCH_SETTLE_RETRY_MIN_MS 100
#define DISPATCH_SETTLE_RETRY_MAX_MS 5000
/* Completion batching: finished deliveries are completed together (one
 * completeMany) once none has finished for DISPATCH_FLUSH_DELAY_MS, and at
 * the latest DISPATCH_FLUSH_MAX_MS after the first of them; at once when
 * every space's batch could be in it, or nothing else runs.  A batch whose sends finish
 * spread over tens of milliseconds (a loaded sink, a busy host) is then
 * one completion and one claim, not several. */
#define DISPATCH_FLUSH_DELAY_MS 20
#define DISPATCH_FLUSH_MAX_MS 100
/* A rate-limited handler is claimed for what its bucket can start within
 * this long (at most a third of the lease): its deliveries wait in the
 * outbox, not in claims held for minutes. */
#define DISPATCH_RATE_HORIZON_MS 1000

typedef struct handler_rt {
   const config_handler_t *cfg; /* in `snap` */
   store_t *store;              /* its lane space's instance (the dispatcher's spaces) */
   config_t *snap;              /* our reference to the snapshot cfg points into */
   transport_t *t;    /* its kind's client (dispatch/transport.h) */
   int64_t jobs;      /* jobs that point here (a retired handler is freed at 0) */
   bool retired;      /* removed or replaced by a reload: claims no more */
   int64_t running;   /* requests in flight */
   int64_t unsettled; /* jobs of the unsettled list */
   int64_t waiting;   /* claimed, waiting for the one before them of their key */
   int64_t freed;     /* jobs that left for good since the last claim */
   int64_t failing_since_ms; /* webhook: the first failure since the last success; 0: none */
   pace_t pace;       /* rate_limit: its bucket and the jobs waiting for a token */
} handler_rt_t;

/* How a finished job is to be settled. */
typedef enum {
   JOB_SETTLE_COMPLETE,
   JOB_SETTLE_BURY,
   JOB_SETTLE_RESCHEDULE,
} job_settle_t;

typedef struct job {
   struct job *prev, *next;
   /* The next delivery of its key claimed with it (a run), waiting until
    * this one is completed, then started; given back if it is not. */
   struct job *follower;
   void *disp; /* the dispatcher_t */
   handler_rt_t *h;
   store_delivery_t d; /* owned: moved out of the claim's batch */
   transport_req_t *req;
   int64_t started_ms; /* when its request started, for the latency metric */
   /* Its attempt's record (store_attempt_t), made when the attempt ended
    * (job_attempt_end): the settling call that ends it writes it, its
    * _id fixed so that a settling call tried again writes it once.  The
    * texts are owned here. */
   store_attempt_t attempt;
   bool attempted;
   char *attempt_error, *attempt_response;
   /* Settling, once its request ended. */
   job_settle_t settle;
   char *why;        /* owned: last error of a bury or reschedule */
   int64_t due_at;   /* reschedule: due again at */
   int64_t retry_at; /* unsettled: next try */
   int64_t retry_ms; /* unsettled: current backoff */
   int64_t give_up;  /* unsettled: after this the store takes the claim back */
   dispatch_span_t span; /* this attempt's send span (dispatch/span.h) */
} job_t;


/* The dispatcher.  Created by dispatch_start on the main thread, then used
 * only by its worker's thread until dispatch_stop joins it and frees it. */
typedef struct {
   config_t *cfg; /* our reference */
   worker_t *w;   /* ours: the thread, its event base and pool, the owner name */
   struct event_base *base; /* the worker's */
   store_t *store;          /* set-up, fleet, purge: it claims nothing */
   store_spaces_t spaces; /* an instance per handler lane space (store.h) */
   size_t claim_first;    /* the space a tick claims in first (turns round) */

   handler_rt_t **handlers; /* the current dispatched handlers (webhook, nats), in config order */
   store_claim_handler_t *claim_handlers;
   size_t n_handlers;
   /* Handlers a reload removed or replaced, kept until their last job
    * ends (its request, completion or release), then freed. */
   handler_rt_t **retired;
   size_t n_retired;
   bool enabled;     /* [dispatch] enabled */
   bool dispatching; /* enabled with at least one dispatched handler */
   bool purging;     /* enabled: runs the scheduled purge */

   struct event *setup_ev, *tick_ev, *wake_ev, *flush_ev, *deadline_ev, *reload_ev;
   struct event *rate_ev; /* the next token of a rate-limited handler with jobs waiting (rate_cb) */
   int64_t flush_first_ms; /* when the first delivery waiting in `done` finished (mono) */
   struct event *watch_ev; /* the watch saw new deliveries (watch_cb) */
   config_t *pending_cfg; /* a reload waiting for the thread; guarded by g_mu */
   job_t *running;
   size_t n_running;
   job_t **done;
   size_t n_done, cap_done;
   job_t **unsettled;
   size_t n_unsettled, cap_unsettled;
   struct event *settle_ev;

   /* The scheduled purge: the run in progress and what it removed. */
   struct event *purge_ev;
   dispatch_purge_t purge;

   /* The fleet's handler set (see "fleet" above). */
   struct event *fleet_ev;
   dispatch_fleet_t *fleet;

   /* The renewal thread: a worker with a one-connection pool of its own
    * (its own event base) and its timer. */
   worker_t *renew;
   struct event *renew_tick_ev;
   /* The deliveries change stream ([dispatch] watch): a commit through any
    * proxy wakes the claims and the consumers' long polls at once. */
   store_watch_t *watch;
   renew_set_t renew_set;
   atomic_int_fast64_t renew_lease_ms;
   bool setup_done, stopping, finished;
   atomic_bool wake_pending;
   atomic_bool watch_pending;
   bool woken; /* a commit woke the dispatcher since the last claim */
   bool probe_stale; /* a wake-up came while busy: the next probe asks every space again */
   bool rate_drained; /* a rate-limited handler started the last job it had waiting: claim for it */
   int64_t last_claim_ms;
   delivery_rng_t rng; /* the retries' jitter */
} dispatcher_t;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static dispatcher_t *g_d;
/* The dispatcher whose handler list dispatch_handler_states reads, and
 * the lock that guards that list (d->handlers, d->n_handlers) against
 * the dispatcher's changes and frees.  Not g_mu: a reader holding it
 * would make dispatch_wake's trylock skip wake-ups. */
static pthread_mutex_t g_states_mu = PTHREAD_MUTEX_INITIALIZER;
static dispatcher_t *g_states_d;

static void handlers_collect (dispatcher_t *d);


static void
schedule (struct event *ev, int64_t ms)
{
   struct timeval tv = clock_timeval_ms (ms);
   evtimer_add (ev, &tv);
}

static void
job_free (job_t *j)
{
   RELAYBUS_ASSERT (j->h->jobs > 0);
   j->h->jobs--;
   bson_free (j->why);
   bson_free (j->attempt_error);
   bson_free (j->attempt_response);
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
   renew_set_remove (&d->renew_set, &j->d.id, j->d.lease);
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
   store_ref_t r = {j->d.id, j->d.lease, j->d.event_id, j->attempted ? &j->attempt : NULL, j->h->store};
   return r;
}

/* The attempt of j ended as `outcome` (its send's result `res`, NULL when
 * it had none): its record for the settling call that ends it, and its
 * duration in relaybus_attempt_duration_seconds.  Once per job. */
static void
job_attempt_end (job_t *j, outbox_attempt_outcome_t outcome, const transport_result_t *res, const char *error)
{
   int64_t now = clock_now_ms ();

   if (j->attempted)
      return;
   j->attempted = true;
   bson_oid_init (&j->attempt.id, NULL);
   j->attempt.handler = j->h->cfg->name;
   j->attempt.outcome = outcome;
   j->attempt.attempt = j->d.attempt;
   j->attempt.started_at = j->started_ms;
   j->attempt.duration_ms = j->started_ms > 0 ? now - j->started_ms : -1;
   j->attempt.status = res ? res->http_status : 0;
   if (error && *error)
      j->attempt_error = bson_strdup (error);
   if (res && res->response[0])
      j->attempt_response = bson_strdup (res->response);
   j->attempt.error = j->attempt_error;
   j->attempt.response = j->attempt_response;
   if (j->started_ms > 0)
      counters_attempt (j->h->cfg->name, outcome, now - j->started_ms);
}


static void finish (dispatcher_t *d);
static void job_start (dispatcher_t *d, job_t *j);
static void watch_update (dispatcher_t *d, const config_t *cfg);

/* Gives back the waiting followers of a run (release: no attempt
 * charged), or with `call` false only forgets them (a stop hands the
 * lanes back, which releases what they list). */
static void
followers_release (dispatcher_t *d, job_t *f, bool call)
{
   while (f) {
      job_t *next = f->follower;
      store_ref_t r = job_ref (f);
      bson_error_t err;
      bool applied;
      renew_set_remove (&d->renew_set, &f->d.id, f->d.lease);
      f->h->waiting--;
      f->h->freed++;
      if (call && !store_release (f->h->store, &r, clock_now_ms (), &applied, &err))
         log_warn ("dispatch: giving back a delivery whose key's previous one did not complete: %s (it runs again "
                   "after its lease)",
                   err.message);
      job_free (f);
      f = next;
   }
}

/* A job leaves for good: its waiting followers are given back. */
static void
job_drop (dispatcher_t *d, job_t *j, bool call)
{
   followers_release (d, j->follower, call);
   j->follower = NULL;
   job_free (j);
}

/* --------------------------------------------------------------- settle */

/* Buries or reschedules j; false when the call failed (j is then to be
 * kept and tried again). */
static bool
settle_one (dispatcher_t *d, job_t *j)
{
   store_ref_t r = job_ref (j);
   bson_error_t err;
   bool applied = false, ok;
   char hex[25];

   bson_oid_to_string (&j->d.id, hex);
   /* The lines below are about this attempt: JSON lines carry its trace. */
   dispatch_span_log (&j->span);
   if (j->settle == JOB_SETTLE_BURY)
      ok = store_bury (j->h->store, &r, clock_now_ms (), j->why, &applied, &err);
   else
      ok = store_reschedule (j->h->store, &r, clock_now_ms (), j->due_at, j->why, &applied, &err);
   if (!ok) {
      log_warn ("dispatch: %s delivery %s: %s failed (tried again): %s",
                j->h->cfg->name,
                hex,
                j->settle == JOB_SETTLE_BURY ? "bury" : "reschedule",
                err.message);
      log_set_trace (NULL, NULL);
      return false;
   }
   if (!applied)
      log_info ("dispatch: %s delivery %s: its lease is stale; left to its current claim", j->h->cfg->name, hex);
   else if (j->settle == JOB_SETTLE_BURY) {
      counters_add (COUNTER_DISPATCH_DEAD, 1);
      log_warn ("dispatch: %s delivery %s (event %s) is dead after attempt %d: %s",
                j->h->cfg->name,
                hex,
                j->d.event_id,
                j->d.attempt,
                j->why ? j->why : "");
   } else {
      counters_add (COUNTER_DISPATCH_RETRIED, 1);
      log_info ("dispatch: %s delivery %s attempt %d failed (%s); due again in %" PRId64 " ms",
                j->h->cfg->name,
                hex,
                j->d.attempt,
                j->why ? j->why : "",
                j->due_at - clock_now_ms ());
   }
   log_set_trace (NULL, NULL);
   return true;
}

/* Keeps a job whose settling call failed, to try again with backoff. */
static void
keep_unsettled (dispatcher_t *d, job_t *j)
{
   int64_t now = clock_now_ms ();

   if (j->retry_ms == 0) {
      j->retry_ms = DISPATCH_SETTLE_RETRY_MIN_MS;
      j->give_up = now + d->cfg->lease_ms;
   } else if (j->retry_ms < DISPATCH_SETTLE_RETRY_MAX_MS) {
      j->retry_ms *= 2;
      if (j->retry_ms > DISPATCH_SETTLE_RETRY_MAX_MS)
         j->retry_ms = DISPATCH_SETTLE_RETRY_MAX_MS;
   }
   j->retry_at = now + j->retry_ms;
   if (d->n_unsettled == d->cap_unsettled) {
      d->cap_unsettled = d->cap_unsettled ? d->cap_unsettled * 2 : 16;
      d->unsettled = bson_realloc (d->unsettled, d->cap_unsettled * sizeof *d->unsettled);
   }
   d->unsettled[d->n_unsettled++] = j;
   j->h->unsettled++;
   /* A pending retry may be later than this one: fire at the earliest
    * (settle_retry only tries what is due and re-arms for the rest). */
   schedule (d->settle_ev, evtimer_pending (d->settle_ev, NULL) ? DISPATCH_SETTLE_RETRY_MIN_MS : j->retry_ms);
}

/* Settles j now, or keeps it to try again. */
static void
settle_or_keep (dispatcher_t *d, job_t *j)
{
   if (settle_one (d, j))
      job_drop (d, j, true);
   else
      keep_unsettled (d, j);
}

static void
bury (dispatcher_t *d, job_t *j, const char *why)
{
   j->settle = JOB_SETTLE_BURY;
   bson_free (j->why);
   j->why = bson_strdup (why ? why : "");
   settle_or_keep (d, j);
}

static void
reschedule (dispatcher_t *d, job_t *j, int64_t delay_ms, const char *why)
{
   j->settle = JOB_SETTLE_RESCHEDULE;
   bson_free (j->why);
   j->why = bson_strdup (why ? why : "");
   j->due_at = clock_now_ms () + delay_ms;
   settle_or_keep (d, j);
}

/* Completes the jobs, all claimed by one store instance, with one
 * completeMany; true when the call succeeded (each job is then freed),
 * false when it failed (the jobs are untouched, to be tried again). */
static bool
complete_jobs (dispatcher_t *d, job_t **jobs, size_t n, size_t *freed)
{
   store_ref_t *refs;
   bool *ok;
   bson_error_t err;
   size_t proven = 0;

   if (n == 0)
      return true;
   refs = bson_malloc (n * sizeof *refs);
   ok = bson_malloc0 (n * sizeof *ok);
   for (size_t i = 0; i < n; i++)
      refs[i] = job_ref (jobs[i]); /* of any spaces: store_complete_many */
   if (!store_complete_many (jobs[0]->h->store, refs, n, clock_now_ms (), ok, &err)) {
      log_warn ("dispatch: completing %zu deliveries failed (tried again): %s", n, err.message);
      bson_free (refs);
      bson_free (ok);
      return false;
   }
   {
      /* Each completed job's follower starts now; the followers of the
       * others are given back.  Started after every job is freed: a
       * follower's request may end (and flush) before this returns. */
      job_t **starts = bson_malloc0 (n * sizeof *starts);
      size_t n_starts = 0;
      for (size_t i = 0; i < n; i++) {
         proven += ok[i];
         if (jobs[i]->follower && ok[i] && !d->stopping) {
            starts[n_starts++] = jobs[i]->follower;
            jobs[i]->follower = NULL;
         } else {
            jobs[i]->h->freed++; /* a slot, and maybe a key, free for the next claim */
            if (freed)
               (*freed)++;
         }
         job_drop (d, jobs[i], !d->stopping);
      }
      for (size_t i = 0; i < n_starts; i++) {
         starts[i]->h->waiting--;
         renew_set_remove (&d->renew_set, &starts[i]->d.id, starts[i]->d.lease);
         job_start (d, starts[i]);
      }
      bson_free (starts);
   }
   counters_add (COUNTER_DISPATCH_COMPLETED, proven);
   if (proven < n) {
      counters_add (COUNTER_DISPATCH_LOST_COMPLETIONS, n - proven);
      log_warn ("dispatch: %zu of %zu completions not proven (a lane changed hands): they may run again", n - proven, n);
   }
   bson_free (refs);
   bson_free (ok);
   return true;
}

/* Moves the jobs of jobs[0]'s store instance to the front of jobs[0..n)
 * and returns how many there are: the completions one completeMany
 * takes. */
static size_t
jobs_of_one_store (job_t **jobs, size_t n)
{
   size_t k = 1;

   for (size_t i = 1; i < n; i++)
      if (jobs[i]->h->store == jobs[0]->h->store) {
         job_t *t = jobs[k];
         jobs[k++] = jobs[i];
         jobs[i] = t;
      }
   return k;
}

/* Completes everything in the done list, one completeMany for every lane
 * space (store_ref_t.space); what could not be completed is kept and
 * tried again. */
static size_t
flush (dispatcher_t *d)
{
   size_t n = d->n_done, freed = 0;
   job_t **jobs;

   evtimer_del (d->flush_ev);
   if (n == 0)
      return 0;
   /* A copy: a follower started by a completion may finish at once and
    * be added to the done list. */
   jobs = bson_malloc (n * sizeof *jobs);
   memcpy (jobs, d->done, n * sizeof *jobs);
   d->n_done = 0;
   if (!complete_jobs (d, jobs, n, &freed))
      for (size_t i = 0; i < n; i++) {
         jobs[i]->settle = JOB_SETTLE_COMPLETE;
         keep_unsettled (d, jobs[i]);
      }
   bson_free (jobs);
   return freed;
}

/* Tries the unsettled jobs that are due: the completions together, the
 * others one by one.  A job that failed for a lease is dropped: its claim
 * is stale or about to be, and the store takes it back as abandoned. */
static void
settle_retry (dispatcher_t *d, bool all)
{
   int64_t now = clock_now_ms ();
   job_t **due = NULL, **complete = NULL;
   size_t n_due = 0, n_complete = 0;
   int64_t next = 0;

   if (d->n_unsettled == 0)
      return;
   due = bson_malloc (d->n_unsettled * sizeof *due);
   complete = bson_malloc (d->n_unsettled * sizeof *complete);
   for (size_t i = 0; i < d->n_unsettled;) {
      job_t *j = d->unsettled[i];
      if (all || j->retry_at <= now) {
         d->unsettled[i] = d->unsettled[--d->n_unsettled];
         j->h->unsettled--;
         due[n_due++] = j;
      } else
         i++;
   }
   for (size_t i = 0; i < n_due; i++) {
      job_t *j = due[i];
      if (now >= j->give_up && !all) {
         char hex[25];
         bson_oid_to_string (&j->d.id, hex);
         log_warn ("dispatch: %s delivery %s could not be settled for a lease; it runs again", j->h->cfg->name, hex);
         job_drop (d, j, true);
      } else if (j->settle == JOB_SETTLE_COMPLETE)
         complete[n_complete++] = j;
      else if (settle_one (d, j))
         job_drop (d, j, true);
      else if (all)
         job_drop (d, j, false); /* stopping: the store takes it back after its lease */
      else
         keep_unsettled (d, j);
   }
   for (size_t at = 0, k; at < n_complete; at += k) {
      k = jobs_of_one_store (complete + at, n_complete - at);
      if (!complete_jobs (d, complete + at, k, NULL))
         for (size_t i = at; i < at + k; i++) {
            if (all)
               job_drop (d, complete[i], false);
            else
               keep_unsettled (d, complete[i]);
         }
   }
   for (size_t i = 0; i < d->n_unsettled; i++)
      if (next == 0 || d->unsettled[i]->retry_at < next)
         next = d->unsettled[i]->retry_at;
   if (d->n_unsettled > 0 && !all)
      schedule (d->settle_ev, next > now ? next - now : 0);
   bson_free (due);
   bson_free (complete);
}

static void
settle_cb (evutil_socket_t fd, short what, void *arg)
{
   dispatcher_t *d = arg;

   (void) fd;
   (void) what;
   if (d->finished)
      return;
   settle_retry (d, false);
   if (!d->stopping)
      schedule (d->tick_ev, 0); /* freed slots, and a key may be claimable */
}

static void
flush_cb (evutil_socket_t fd, short what, void *arg)
{
   dispatcher_t *d = arg;

   (void) fd;
   (void) what;
   /* A claim only when a job ended for good: one whose follower started
    * frees neither a slot nor its key. */
   if (flush (d) > 0 && !d->stopping)
      schedule (d->tick_ev, 0); /* a key's next delivery may be claimable */
}

/* disable_after: a webhook handler none of whose deliveries succeeded
 * since its first failure, disable_after ago, is disabled (Svix's rule).
 * This proxy's answers only: a proxy that saw a success restarts its
 * count, so a receiver that works for some proxies stays enabled. */
static void
handler_track_failing (dispatcher_t *d, handler_rt_t *h, bool ok)
{
   int64_t now = clock_now_ms ();
   char reason[64] = "failing since ?";
   time_t t;
   struct tm tm;

   if (h->cfg->kind_id != HANDLER_KIND_WEBHOOK || ok) {
      h->failing_since_ms = 0;
      return;
   }
   if (h->failing_since_ms == 0) {
      h->failing_since_ms = now;
      return;
   }
   if (now - h->failing_since_ms < h->cfg->disable_after_ms)
      return;
   t = (time_t) (h->failing_since_ms / 1000);
   if (gmtime_r (&t, &tm))
      strftime (reason, sizeof reason, "failing since %Y-%m-%dT%H:%M:%SZ", &tm);
   (void) dispatch_fleet_disable (d->fleet, h->cfg->name, COUNTERS_STATE_FAILING, reason, now);
}

/* The endpoint answered 410 Gone: the handler is disabled in the outbox
 * (every proxy stops claiming it within a heartbeat) and the delivery is
 * given back as it was, its attempt not charged, to wait as pending with
 * its key's followers until an operator enables the handler again. */
static void
job_gone (dispatcher_t *d, job_t *j, const char *why)
{
   handler_rt_t *h = j->h;
   store_ref_t r = job_ref (j);
   bson_error_t err;
   bool applied = false;
   char hex[25];

   bson_oid_to_string (&j->d.id, hex);
   dispatch_span_log (&j->span);
   log_info ("dispatch: %s delivery %s: the endpoint is gone (%s): given back, attempt not charged", h->cfg->name, hex, why);
   log_set_trace (NULL, NULL);
   (void) dispatch_fleet_disable (d->fleet, h->cfg->name, COUNTERS_STATE_GONE, "410", clock_now_ms ());
   h->freed++;
   if (!store_release (j->h->store, &r, clock_now_ms (), &applied, &err))
      log_warn ("dispatch: giving back delivery %s: %s (it runs again after its lease)", hex, err.message);
   job_drop (d, j, true);
   if (d->stopping && d->n_running == 0)
      finish (d);
}

static void
job_done_cb (const transport_result_t *res, void *arg)
{
   job_t *j = arg;
   handler_rt_t *h = j->h;
   dispatcher_t *d = j->disp;

   j->req = NULL;
   running_remove (d, j);
   dispatch_span_end (&j->span, j->h->cfg, &j->d, res);
   job_attempt_end (j, transport_attempt_outcome (res), res, res->outcome == TRANSPORT_OUTCOME_OK ? NULL : res->error);
   if (res->outcome == TRANSPORT_OUTCOME_GONE) {
      job_gone (d, j, res->error);
      return;
   }
   handler_track_failing (d, h, res->outcome == TRANSPORT_OUTCOME_OK);
   {
      counter_id_t mo = COUNTER_DELIVERIES_RETRIED;
      if (res->outcome == TRANSPORT_OUTCOME_OK)
         mo = COUNTER_DELIVERIES_COMPLETED;
      else if (res->outcome == TRANSPORT_OUTCOME_DEAD || j->d.attempt >= h->cfg->max_attempts)
         mo = COUNTER_DELIVERIES_DEAD;
      counters_delivery (h->cfg->name, mo, clock_now_ms () - j->started_ms);
   }
   if (res->outcome == TRANSPORT_OUTCOME_OK) {
      if (d->n_done == d->cap_done) {
         d->cap_done = d->cap_done ? d->cap_done * 2 : 64;
         d->done = bson_realloc (d->done, d->cap_done * sizeof *d->done);
      }
      d->done[d->n_done++] = j;
      /* Every space's batch is full (one flush), or nothing else will finish: now.
       * Otherwise the others of the batch, finishing within a few
       * milliseconds, join it (a claim follows each flush, so this also
       * keeps claims from taking one delivery at a time). */
      if ((int64_t) d->n_done >= d->cfg->batch_size * (int64_t) (d->spaces.n ? d->spaces.n : 1) || d->n_running == 0) {
         if (flush (d) > 0 && !d->stopping)
            schedule (d->tick_ev, 0);
      } else {
         int64_t now = clock_mono_ms (), due;
         if (d->n_done == 1)
            d->flush_first_ms = now;
         due = now + DISPATCH_FLUSH_DELAY_MS;
         if (due > d->flush_first_ms + DISPATCH_FLUSH_MAX_MS)
            due = d->flush_first_ms + DISPATCH_FLUSH_MAX_MS;
         schedule (d->flush_ev, due > now ? due - now : 0);
      }
   } else {
      /* The key's next deliveries must not run before this one: given
       * back, they are claimed again after it. */
      h->freed++;
      followers_release (d, j->follower, true);
      j->follower = NULL;
      if (res->outcome == TRANSPORT_OUTCOME_DEAD)
         bury (d, j, res->error);
      else if (j->d.attempt >= h->cfg->max_attempts)
         bury (d, j, res->error);
      else
         reschedule (d,
                     j,
                     res->retry_after_ms >= 0
                        ? res->retry_after_ms
                        : delivery_backoff_ms (h->cfg->retry_delays_ms, h->cfg->n_retry_delays,
                                               j->d.attempt, delivery_rng_next (&d->rng)),
                     res->error);
      if (!d->stopping)
         schedule (d->tick_ev, 0);
   }
   if (d->stopping && d->n_running == 0)
      finish (d);
}

/* ---------------------------------------------------------------- claim */

static job_t *
job_new (dispatcher_t *d, handler_rt_t *h, store_delivery_t *item)
{
   job_t *j = bson_malloc0 (sizeof *j);

   /* Move the delivery out of the batch. */
   j->d = *item;
   memset (item, 0, sizeof *item);
   j->h = h;
   h->jobs++;
   j->disp = d;
   return j;
}

/* ----------------------------------------------------------- rate_limit */

static void job_send (dispatcher_t *d, job_t *j);
static bool job_give_back_if_disabled (dispatcher_t *d, job_t *j);

/* rate_ev for the next token a waiting job needs (dispatch/pace.h). */
static void
rate_arm (dispatcher_t *d)
{
   int64_t now = clock_mono_ms (), next = -1;

   for (size_t k = 0; k < d->n_handlers + d->n_retired; k++) {
      int64_t w = pace_wait_ms (&(k < d->n_handlers ? d->handlers[k] : d->retired[k - d->n_handlers])->pace, now);
      if (w >= 0 && (next < 0 || w < next))
         next = w;
   }
   if (next >= 0)
      schedule (d->rate_ev, next);
   else
      evtimer_del (d->rate_ev);
}

/* Whether j may start now; otherwise it waits, renewed, for rate_cb. */
static bool
rate_admit (dispatcher_t *d, job_t *j)
{
   if (pace_admit (&j->h->pace, j, clock_mono_ms ()))
      return true;
   renew_set_add (&d->renew_set, &j->d.id, j->d.lease, j->h->store);
   rate_arm (d);
   return false;
}

/* Tokens came: the waiting jobs start, in order, one per token. */
static void
rate_cb (evutil_socket_t fd, short what, void *arg)
{
   dispatcher_t *d = arg;
   int64_t now = clock_mono_ms ();
   job_t **go = NULL;
   size_t n = 0, cap = 0;

   (void) fd;
   (void) what;
   if (d->stopping)
      return;
   /* Collected first: a start may end at once and change the lists. */
   for (size_t k = 0; k < d->n_handlers + d->n_retired; k++) {
      handler_rt_t *h = k < d->n_handlers ? d->handlers[k] : d->retired[k - d->n_handlers];
      bool had = pace_waiting (&h->pace) > 0;
      job_t *j;
      while ((j = pace_next (&h->pace, now))) {
         if (n == cap) {
            cap = cap ? cap * 2 : 16;
            go = bson_realloc (go, cap * sizeof *go);
         }
         renew_set_remove (&d->renew_set, &j->d.id, j->d.lease);
         go[n++] = j;
      }
      d->rate_drained = d->rate_drained || (had && pace_waiting (&h->pace) == 0 && !h->retired); /* claim for it */
   }
   for (size_t i = 0; i < n; i++)
      if (!job_give_back_if_disabled (d, go[i]))
         job_send (d, go[i]);
   bson_free (go);
   rate_arm (d);
   if (d->rate_drained && d->setup_done)
      schedule (d->tick_ev, 0);
}

/* Forgets h's jobs waiting for a token (a stop: the lanes are handed
 * back, which releases what they list). */
static void
rate_drop_all (dispatcher_t *d, handler_rt_t *h)
{
   job_t *j;

   while ((j = pace_pop (&h->pace))) {
      renew_set_remove (&d->renew_set, &j->d.id, j->d.lease);
      job_drop (d, j, false);
   }
}

/* A job of a handler disabled since it was claimed (a follower, a claim
 * that raced the 410, a wait for a token) is given back uncharged. */
static bool
job_give_back_if_disabled (dispatcher_t *d, job_t *j)
{
   bool applied = false;
   store_ref_t r;
   bson_error_t err;
   char hex[25];

   if (!dispatch_fleet_disabled (d->fleet, j->h->cfg->name))
      return false;
   bson_oid_to_string (&j->d.id, hex);
   r = job_ref (j);
   j->h->freed++;
   if (!store_release (j->h->store, &r, clock_now_ms (), &applied, &err))
      log_warn ("dispatch: giving back delivery %s: %s (it runs again after its lease)", hex, err.message);
   job_drop (d, j, true);
   return true;
}

static void
job_start (dispatcher_t *d, job_t *j)
{
   handler_rt_t *h = j->h;

   if (job_give_back_if_disabled (d, j))
      return;
   if (j->d.attempt > h->cfg->max_attempts) {
      /* Its workers kept losing their leases (crashing): the charged
       * attempts ran out before this one started. */
      counters_delivery (h->cfg->name, COUNTER_DELIVERIES_DEAD, 0);
      followers_release (d, j->follower, true);
      j->follower = NULL;
      bury (d, j, "attempts exhausted: lost its lease on every attempt");
      return;
   }
   if (!rate_admit (d, j))
      return; /* waits for a token: rate_cb starts it */
   job_send (d, j);
}

/* Starts j's send, if enough of its lease is left. */
static void
job_send (dispatcher_t *d, job_t *j)
{
   handler_rt_t *h = j->h;
   bson_error_t err;
   char hex[25];

   bson_oid_to_string (&j->d.id, hex);
   {
      /* A request starts only while a third of the lease is left (one
       * renewal period): when renewals fall behind (the database answers
       * slowly), the lane may be taken over once the lease lapses, and a
       * request still running then would overlap the new holder's
       * delivery of the same key.  Given back instead (no attempt
       * charged), with its followers; the next claim takes it again. */
      store_ref_t r = job_ref (j);
      int64_t left = store_lease_expires (j->h->store, &r) - clock_now_ms ();
      if (left < d->cfg->lease_ms / 3) {
         bool applied = false;
         counters_add (COUNTER_DISPATCH_LEASE_SHORT, 1);
         log_warn ("dispatch: %s delivery %s not started: %" PRId64 " ms left of its lease of %" PRId64
                   " ms (renewals are late: the database answers slowly, or lease_ms is short for it); given back",
                   h->cfg->name,
                   hex,
                   left > 0 ? left : 0,
                   d->cfg->lease_ms);
         h->freed++;
         if (!store_release (j->h->store, &r, clock_now_ms (), &applied, &err))
            log_warn ("dispatch: giving back delivery %s: %s (it runs again after its lease)", hex, err.message);
         job_drop (d, j, true);
         /* Claimed again at once: a claim on a lane still held extends
          * its lease. */
         if (!d->stopping)
            schedule (d->tick_ev, 0);
         return;
      }
   }
   j->next = d->running;
   if (d->running)
      d->running->prev = j;
   d->running = j;
   d->n_running++;
   h->running++;
   renew_set_add (&d->renew_set, &j->d.id, j->d.lease, j->h->store);
   if (h->cfg->kind_id == HANDLER_KIND_WEBHOOK)
      counters_add (COUNTER_DISPATCH_HTTP_REQUESTS, 1);
   j->started_ms = clock_now_ms ();
   {
      /* Rendered here, from the handler's settings of this snapshot, for
       * every kind alike; the kind copies what it keeps. */
      format_opts_t fo;
      format_msg_t msg;

      format_opts_from_handler (&fo, h->cfg);
      j->req = format_render (&fo, format_binding_of (h->cfg->kind_id), &j->d, &msg, &err)
                  ? (dispatch_span_begin (&j->span, &msg), transport_send (h->t, &j->d, &msg, job_done_cb, j, &err))
                  : NULL;
      format_msg_fini (&msg);
   }
   if (!j->req) {
      transport_result_t res = {.outcome = TRANSPORT_OUTCOME_RETRY, .retry_after_ms = -1};
      bson_strncpy (res.error, err.message, sizeof res.error);
      job_done_cb (&res, j);
   }
}

/* Whether a claim is worth its round trips: a commit woke us, a poll
 * interval passed, nothing runs or waits, or some handler had at least half
 * of what one claim could give it (its concurrency, at most a batch) end
 * for good since the last claim (a job whose follower started frees
 * neither its slot nor its key).  A claim for the one slot that just freed
 * up costs as much as one for a full batch, so slots are refilled in
 * halves while requests are in flight. */
static bool
wants_claim (dispatcher_t *d)
{
   size_t waiting = 0;

   for (size_t i = 0; i < d->n_handlers; i++)
      waiting += (size_t) d->handlers[i]->waiting;
   if (d->woken || d->rate_drained || (d->n_running == 0 && waiting == 0) ||
       clock_now_ms () - d->last_claim_ms >= d->cfg->poll_interval_ms)
      return true;
   for (size_t i = 0; i < d->n_handlers; i++) {
      const handler_rt_t *h = d->handlers[i];
      int64_t room;
      if (!h->t)
         continue;
      room = h->cfg->concurrency < d->cfg->batch_size ? h->cfg->concurrency : d->cfg->batch_size;
      if (h->freed > 0 && h->freed * 2 >= room)
         return true;
   }
   return false;
}

/* Claims with `o` in the lane space of instance `store` (its lane
 * documents made first) and starts what it got; *got how many.  False
 * when the claim failed (logged). */
static bool
claim_space (dispatcher_t *d, store_t *store, const store_claim_opts_t *o, size_t *got)
{
   store_batch_t b = {0};
   bson_error_t err;
   bool ok;

   *got = 0;
   if (!store_setup_space (store, &err)) {
      log_warn ("dispatch: making the lanes of handler %s failed (retry in %" PRId64 " ms): %s",
                store_space_handler (store),
                d->cfg->poll_interval_ms,
                err.message);
      return false;
   }
   counters_add (COUNTER_DISPATCH_CLAIMS, 1);
   ok = store_claim (store, o, &b, &err);
   counters_observe (COUNTER_CLAIM_LATENCY, 0, clock_now_ms () - o->now);
   if (!ok) {
      log_warn ("dispatch: claim failed (retry in %" PRId64 " ms): %s", d->cfg->poll_interval_ms, err.message);
      return false;
   }
   counters_add (COUNTER_DISPATCH_CLAIMED, b.n);
   log_debug ("dispatch: claimed %zu of %zu in %" PRId64 " ms", b.n, o->limit, clock_now_ms () - o->now);
   {
      /* The deliveries of one key form a chain in sequence order: the
       * first starts, each next one waits for the one before it to be
       * completed (its lease renewed meanwhile). */
      job_t **js = bson_malloc0 ((b.n + 1) * sizeof *js);
      size_t n_js = 0;
      for (size_t i = 0; i < b.n; i++) {
         job_t *j = NULL;
         for (size_t k = 0; k < d->n_handlers; k++)
            if (d->handlers[k]->store == store && !strcmp (d->handlers[k]->cfg->name, b.items[i].handler)) {
               j = job_new (d, d->handlers[k], &b.items[i]);
               break;
            }
         if (!j)
            continue;
         if (j->d.key) {
            size_t c;
            for (c = 0; c < n_js; c++)
               if (js[c]->d.key && js[c]->h == j->h && !strcmp (js[c]->d.key, j->d.key))
                  break;
            if (c < n_js) {
               job_t **at = &js[c];
               while (*at && (*at)->d.sequence < j->d.sequence)
                  at = &(*at)->follower;
               j->follower = *at;
               *at = j;
               continue;
            }
         }
         js[n_js++] = j;
      }
      for (size_t c = 0; c < n_js; c++) {
         for (job_t *f = js[c]->follower; f; f = f->follower) {
            f->h->waiting++;
            renew_set_add (&d->renew_set, &f->d.id, f->d.lease, f->h->store);
         }
         job_start (d, js[c]);
      }
      bson_free (js);
   }
   *got = b.n;
   store_batch_clear (&b);
   return true;
}

static void
tick_cb (evutil_socket_t fd, short what, void *arg)
{
   dispatcher_t *d = arg;
   store_claim_opts_t o = {0};
   store_claim_handler_t *space_claim;
   size_t total = 0, limit, claimed = 0;
   bool full = false, failed = false;
   int64_t rate_wait = -1; /* a rate-limited handler's next token, when its bucket alone held it back */

   (void) fd;
   (void) what;
   handlers_collect (d);
   if (d->stopping || !d->setup_done || !d->dispatching)
      return;
   flush (d);
   store_spaces_write_completion_times (&d->spaces, clock_now_ms (), false); /* a second's completions' events */
   for (size_t i = 0; i < d->n_handlers; i++) {
      handler_rt_t *h = d->handlers[i];
      bool held = dispatch_fleet_holds (d->fleet, h->cfg->name); /* backfilling or disabled: not now */
      if (dispatch_fleet_disabled (d->fleet, h->cfg->name))
         h->failing_since_ms = 0; /* enabled again, it gets disable_after anew */
      int64_t free_slots = h->t && !held ? h->cfg->concurrency - h->running - h->unsettled - h->waiting -
                                              (int64_t) pace_waiting (&h->pace)
                                         : 0;
      if (free_slots > 0) {
         /* No more than its rate_limit starts soon. */
         int64_t w, room = pace_claim_room (&h->pace, clock_mono_ms (),
                                            d->cfg->lease_ms / 3 < DISPATCH_RATE_HORIZON_MS ? d->cfg->lease_ms / 3 : DISPATCH_RATE_HORIZON_MS, &w);
         free_slots = room < free_slots ? room : free_slots;
         rate_wait = w >= 0 && (rate_wait < 0 || w < rate_wait) ? w : rate_wait;
      }
      d->claim_handlers[i].limit = free_slots > 0 ? (size_t) free_slots : 0;
      total += d->claim_handlers[i].limit;
   }
   limit = total; /* each space's claim takes at most batch_size: one claim each */
   if (limit == 0) {
      /* Every slot busy (a finishing request ticks again), or a bucket
       * empty: a tick when its next token comes. */
      if (rate_wait >= 0)
         schedule (d->tick_ev, rate_wait > 0 ? rate_wait : 1);
      return;
   }
   if (!wants_claim (d))
      return; /* a handler's next finishing requests tick again */
   space_claim = bson_malloc0 ((d->n_handlers + 1) * sizeof *space_claim);
   o.limit = limit;
   o.now = clock_now_ms ();
   o.lease_ms = d->cfg->lease_ms;
   /* Free lanes an earlier probe found are reused, not after a wake-up. */
   o.probe_reuse_ms = d->woken || d->probe_stale ? 0 : d->cfg->poll_interval_ms;
   d->probe_stale = false;
   store_probe_due (&d->spaces, d->claim_handlers, d->n_handlers, o.now, o.probe_reuse_ms); /* only spaces with due work claim */
   o.key_run = DISPATCH_KEY_RUN;
   d->last_claim_ms = o.now;
   for (size_t i = 0; i < d->n_handlers; i++)
      d->handlers[i]->freed = 0;
   d->woken = false;
   d->rate_drained = false;
   /* One claim per lane space with free slots and due work, each of at
    * most batch_size, so that the spaces' batches run and complete
    * together (one completeMany); the space that goes first turns round. */
   for (size_t n = 0; n < d->spaces.n && claimed < limit; n++) {
      size_t i = (d->claim_first + n) % d->spaces.n, space_limit = 0, got;
      o.n_handlers = 0;
      for (size_t k = 0; k < d->n_handlers; k++)
         if (d->handlers[k]->store == d->spaces.v[i] && d->claim_handlers[k].limit > 0) {
            space_claim[o.n_handlers++] = d->claim_handlers[k];
            space_limit += d->claim_handlers[k].limit;
         }
      if (o.n_handlers == 0)
         continue;
      o.handlers = space_claim;
      o.limit = space_limit < (size_t) d->cfg->batch_size ? space_limit : (size_t) d->cfg->batch_size;
      o.now = clock_now_ms ();
      if (!claim_space (d, d->spaces.v[i], &o, &got)) {
         failed = true;
         continue;
      }
      claimed += got;
      full = full || (got == o.limit && o.limit < space_limit);
   }
   bson_free (space_claim);
   if (d->spaces.n > 0)
      d->claim_first = (d->claim_first + 1) % d->spaces.n;
   /* A full batch below the free slots: more may be waiting. */
   schedule (d->tick_ev, (!failed && (full || (claimed == limit && limit < total))) ? 0 : d->cfg->poll_interval_ms);
}

static void
wake_cb (evutil_socket_t fd, short what, void *arg)
{
   dispatcher_t *d = arg;

   (void) fd;
   (void) what;
   atomic_store (&d->wake_pending, false);
   d->woken = true;
   if (!d->stopping && d->setup_done)
      schedule (d->tick_ev, 0);
}

/* ---------------------------------------------------------------- renew */

static void
renew_arm (dispatcher_t *d)
{
   int64_t ms = atomic_load (&d->renew_lease_ms) / 3;
   schedule (d->renew_tick_ev, ms > 0 ? ms : 1);
}

/* On the renewal thread: renews every running delivery's lease
 * (dispatch/renew.h). */
static void
renew_cb (evutil_socket_t fd, short what, void *arg)
{
   dispatcher_t *d = arg;

   (void) fd;
   (void) what;
   renew_set_renew (&d->renew_set, worker_pool (d->renew), atomic_load (&d->renew_lease_ms));
   renew_arm (d);
}

/* ---------------------------------------------------------------- purge */

/* A step of the scheduled purge run (dispatch/purge.h). */
static void
purge_cb (evutil_socket_t fd, short what, void *arg)
{
   dispatcher_t *d = arg;

   (void) fd;
   (void) what;
   if (d->stopping || !d->setup_done)
      return;
   schedule (d->purge_ev, dispatch_purge_step (&d->purge, d->store, d->cfg, clock_now_ms ()));
}

/* ---------------------------------------------------------------- fleet */

static void
fleet_cb (evutil_socket_t fd, short what, void *arg)
{
   dispatcher_t *d = arg;
   bool released = false, again;

   (void) fd;
   (void) what;
   handlers_collect (d);
   if (d->stopping || !d->setup_done)
      return;
   again = dispatch_fleet_beat (d->fleet, d->cfg, clock_now_ms (), &released);
   if (released && d->dispatching)
      schedule (d->tick_ev, 0); /* a held handler may be claimed now */
   schedule (d->fleet_ev, again ? 0 : d->cfg->handler_heartbeat_ms);
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
      fleet_note_failed ();
      schedule (d->setup_ev, DISPATCH_SETUP_RETRY_MS);
      return;
   }
   d->setup_done = true;
   schedule (d->fleet_ev, 0);
   if (d->purging)
      schedule (d->purge_ev, d->cfg->purge_interval_ms);
   if (d->dispatching)
      schedule (d->tick_ev, 0);
}

/* ----------------------------------------------------------------- stop */

static void
finish (dispatcher_t *d)
{
   bson_error_t err;
   int64_t now = clock_now_ms ();

   bool reachable = d->setup_done;

   if (d->finished)
      return;
   d->finished = true;
   evtimer_del (d->deadline_ev);
   /* Nothing a transport holds may reach a receiver after the lanes are
    * handed back: the proxy that takes a lane over would send a key's
    * next delivery first (a Kafka producer flushed at its destroy did). */
   for (size_t i = 0; i < d->n_handlers; i++)
      transport_fence (d->handlers[i]->t);
   for (size_t i = 0; i < d->n_retired; i++)
      transport_fence (d->retired[i]->t);
   /* What waits for a token never started: handed back with the lanes. */
   evtimer_del (d->rate_ev);
   for (size_t i = 0; i < d->n_handlers; i++)
      rate_drop_all (d, d->handlers[i]);
   for (size_t i = 0; i < d->n_retired; i++)
      rate_drop_all (d, d->retired[i]);
   /* After the first failed store call (the upstream is gone), skip the
    * rest: every call would wait for server selection, and the leases run
    * out on their own. */
   while (d->running) {
      job_t *j = d->running;
      store_ref_t r = job_ref (j);
      bool applied;
      transport_cancel (j->h->t, j->req);
      j->req = NULL;
      running_remove (d, j);
      job_attempt_end (j, OUTBOX_ATTEMPT_RELEASED, NULL, "the proxy stopped with the request in flight: cancelled, given back");
      r = job_ref (j);
      if (reachable && !store_release (j->h->store, &r, now, &applied, &err)) {
         log_warn ("dispatch: releasing a delivery at stop: %s", err.message);
         reachable = false;
      }
      job_drop (d, j, false); /* its followers: the lanes are handed back */
   }
   if (reachable) {
      flush (d);
      settle_retry (d, true); /* one more try for what is unsettled */
   }
   for (size_t i = 0; i < d->n_unsettled; i++) {
      d->unsettled[i]->h->unsettled--;
      job_drop (d, d->unsettled[i], false);
   }
   d->n_unsettled = 0;
   if (reachable)
      store_spaces_write_completion_times (&d->spaces, now, true);
   for (size_t i = 0; reachable && i < d->spaces.n; i++)
      if (!store_relinquish (d->spaces.v[i], now, &err))
         log_warn ("dispatch: handing lanes back (handler %s): %s", store_space_handler (d->spaces.v[i]), err.message);
   if (reachable)
      dispatch_fleet_stop (d->fleet, now);
   if (!reachable)
      log_warn ("dispatch: stopped without handing lanes back (the upstream is unreachable): they free up after lease_ms");
   for (size_t i = 0; i < d->n_done; i++)
      job_drop (d, d->done[i], false);
   d->n_done = 0;
   /* Every job has left the running, done and unsettled lists. */
   RELAYBUS_ASSERT (!d->running && d->n_running == 0 && d->n_unsettled == 0);
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

/* The worker's stop (worker_stop), on this thread. */
static void
stop_cb (void *arg)
{
   dispatcher_t *d = arg;
   int64_t wait = 0;

   d->stopping = true;
   evtimer_del (d->tick_ev);
   evtimer_del (d->setup_ev);
   evtimer_del (d->purge_ev);
   evtimer_del (d->fleet_ev);
   if (d->n_running == 0) {
      finish (d);
      return;
   }
   for (size_t i = 0; i < d->n_handlers; i++)
      if (d->handlers[i]->cfg->timeout_ms > wait)
         wait = d->handlers[i]->cfg->timeout_ms;
   for (size_t i = 0; i < d->n_retired; i++)
      if (d->retired[i]->cfg->timeout_ms > wait)
         wait = d->retired[i]->cfg->timeout_ms;
   wait += 500;
   if (wait > DISPATCH_STOP_WAIT_MAX_MS)
      wait = DISPATCH_STOP_WAIT_MAX_MS;
   log_info ("dispatch: stopping; waiting up to %" PRId64 " ms for %zu request(s)", wait, d->n_running);
   schedule (d->deadline_ev, wait);
}

/* --------------------------------------------------------------- reload */

/* The renewal thread picks the new lease up at its next tick. */
static void
renew_schedule (dispatcher_t *d)
{
   atomic_store (&d->renew_lease_ms, d->cfg->lease_ms);
}

/* A reload removed every handler of a lane space and their last jobs
 * ended: its lanes are handed back at once, not left to their leases. */
static void
lane_spaces_hand_back (dispatcher_t *d)
{
   for (size_t i = 0; i < d->spaces.n; i++) {
      store_t *st = d->spaces.v[i];
      bool used = false;
      bson_error_t err;
      for (size_t k = 0; k < d->n_handlers && !used; k++)
         used = d->handlers[k]->store == st;
      for (size_t k = 0; k < d->n_retired && !used; k++)
         used = d->retired[k]->store == st;
      if (used || !store_holds_lanes (st))
         continue;
      if (!store_relinquish (st, clock_now_ms (), &err))
         log_warn ("dispatch: handing back the lanes of removed handler %s: %s (they free up after lease_ms)",
                   store_space_handler (st), err.message);
      else
         log_info ("dispatch: handed back the lanes of removed handler %s", store_space_handler (st));
   }
}

/* A handler's run-time state for `hc`, an entry of `snap` (retained);
 * NULL when its transport cannot be made (error says why). */
static handler_rt_t *
handler_new (dispatcher_t *d, config_t *snap, const config_handler_t *hc, bson_error_t *error)
{
   handler_rt_t *h;
   transport_env_t env;

   env.base = d->base;
   h = bson_malloc0 (sizeof *h);
   h->cfg = hc;
   h->store = store_spaces_of (&d->spaces, hc->name);
   h->t = transport_new (&env, hc, error);
   if (!h->t) {
      bson_free (h);
      return NULL;
   }
   h->snap = config_retain (snap);
   pace_init (&h->pace, hc, clock_mono_ms ());
   if (hc->timeout_ms > snap->lease_ms / 3)
      log_warn ("dispatch: handler %s: timeout_ms %" PRId64 " is longer than lease_ms / 3 (%" PRId64
                " ms): when lease renewals fall behind, a request may outlive its lease and run beside "
                "another proxy's delivery of the same key",
                hc->name,
                (int64_t) hc->timeout_ms,
                (int64_t) (snap->lease_ms / 3));
   return h;
}

static void
handler_free (handler_rt_t *h)
{
   if (!h)
      return;
   RELAYBUS_ASSERT (h->jobs == 0);
   pace_fini (&h->pace);
   transport_destroy (h->t);
   config_release (h->snap);
   bson_free (h);
}

/* Frees the retired handlers whose last job has ended.  Never called from
 * a transport's callback: the send that called back still uses its client. */
static void
handlers_collect (dispatcher_t *d)
{
   size_t kept = 0;

   pthread_mutex_lock (&g_states_mu);
   for (size_t i = 0; i < d->n_retired; i++) {
      if (d->retired[i]->jobs == 0)
         handler_free (d->retired[i]);
      else
         d->retired[kept++] = d->retired[i];
   }
   d->n_retired = kept;
   pthread_mutex_unlock (&g_states_mu);
   if (d->setup_done && !d->stopping)
      lane_spaces_hand_back (d);
}

static bool
handler_named_in (handler_rt_t *const *list, size_t n, const char *name)
{
   for (size_t i = 0; i < n; i++)
      if (!strcmp (list[i]->cfg->name, name))
         return true;
   return false;
}

static handler_rt_t *
handler_named (dispatcher_t *d, const char *name)
{
   for (size_t i = 0; i < d->n_handlers; i++)
      if (!strcmp (d->handlers[i]->cfg->name, name))
         return d->handlers[i];
   return NULL;
}

/* Makes the handler set of `next` current.  A handler whose client
 * settings are unchanged keeps its state and follows its new entry
 * (events, concurrency, retries apply from the next claim); a new or
 * changed one gets a new client; a removed or replaced one claims no more,
 * and its requests in flight finish with the settings they started with
 * (their completion, retry or dead letter as usual), then it is freed.
 * All or nothing: if a client cannot be made, nothing changes (false). */
static bool
handlers_apply (dispatcher_t *d, config_t *next)
{
   handler_rt_t **list = bson_malloc0 ((next->n_handlers + 1) * sizeof *list);
   bool *made = bson_malloc0 ((next->n_handlers + 1) * sizeof *made);
   store_claim_handler_t *claim;
   size_t n = 0, added = 0, changed = 0, removed = 0;
   bson_error_t err;

   for (size_t i = 0; i < next->n_handlers; i++) {
      const config_handler_t *hc = &next->handlers[i];
      handler_rt_t *cur;

      if (!transport_kind_dispatched (hc->kind_id))
         continue;
      cur = handler_named (d, hc->name);
      if (cur && transport_settings_equal (cur->cfg, hc)) {
         list[n++] = cur;
         continue;
      }
      list[n] = handler_new (d, next, hc, &err);
      if (!list[n]) {
         log_error ("dispatch: reload: %s; keeping the previous handlers", err.message);
         for (size_t k = 0; k < n; k++)
            if (made[k])
               handler_free (list[k]);
         bson_free (list);
         bson_free (made);
         return false;
      }
      made[n++] = true;
   }
   /* From here on nothing fails. */
   for (size_t i = 0; i < n; i++) {
      handler_rt_t *cur = made[i] ? handler_named (d, list[i]->cfg->name) : NULL;

      if (!made[i]) {
         /* Kept: follows its entry in the new snapshot. */
         for (size_t k = 0; k < next->n_handlers; k++)
            if (!strcmp (next->handlers[k].name, list[i]->cfg->name))
               list[i]->cfg = &next->handlers[k];
         pace_update (&list[i]->pace, list[i]->cfg, clock_mono_ms ());
         config_release (list[i]->snap);
         list[i]->snap = config_retain (next);
      } else if (cur) {
         changed++;
         log_info ("dispatch: reload: handler %s changed (kind, url, subject, secret, timeout_ms or retry_4xx): %" PRId64
                   " request(s) in flight finish with the previous settings",
                   list[i]->cfg->name,
                   cur->running);
      } else {
         added++;
         log_info ("dispatch: reload: handler %s added", list[i]->cfg->name);
      }
   }
   for (size_t i = 0; i < d->n_handlers; i++) {
      handler_rt_t *h = d->handlers[i];
      bool kept = false;

      for (size_t k = 0; k < n && !kept; k++)
         kept = list[k] == h;
      if (kept)
         continue;
      if (!handler_named_in (list, n, h->cfg->name)) {
         removed++;
         log_info ("dispatch: reload: handler %s removed: it claims no more; %" PRId64
                   " request(s) in flight finish; its pending deliveries wait for a proxy that declares it, or "
                   "for handler_retire_after",
                   h->cfg->name,
                   h->running);
      }
      h->retired = true;
      d->retired = bson_realloc (d->retired, (d->n_retired + 1) * sizeof *d->retired);
      d->retired[d->n_retired++] = h;
   }
   claim = bson_malloc0 ((n + 1) * sizeof *claim);
   for (size_t i = 0; i < n; i++)
      claim[i].handler = list[i]->cfg->name;
   pthread_mutex_lock (&g_states_mu);
   bson_free (d->handlers);
   bson_free (d->claim_handlers);
   d->handlers = list;
   d->claim_handlers = claim;
   d->n_handlers = n;
   pthread_mutex_unlock (&g_states_mu);
   bson_free (made);
   handlers_collect (d);
   if (added || changed || removed)
      log_info ("dispatch: handlers: %zu (%zu added, %zu changed, %zu removed)", n, added, changed, removed);
   return true;
}

/* Takes a reloaded snapshot: the handler set (handlers_apply), and
 * poll_interval_ms, batch_size and lease_ms from the next claim. */
static void
reload_cb (evutil_socket_t fd, short what, void *arg)
{
   dispatcher_t *d = arg;
   config_t *next, *old;
   bool was = d->dispatching;

   (void) fd;
   (void) what;
   pthread_mutex_lock (&g_mu);
   next = d->pending_cfg;
   d->pending_cfg = NULL;
   pthread_mutex_unlock (&g_mu);
   if (!next)
      return;
   if (d->enabled && !handlers_apply (d, next)) {
      config_release (next);
      return;
   }
   old = d->cfg;
   d->cfg = next;
   config_release (old);
   watch_update (d, d->cfg);
   d->dispatching = d->enabled && d->n_handlers > 0;
   if (was && !d->dispatching)
      log_info ("dispatch: no dispatched handler left: not dispatching");
   if (d->dispatching) {
      renew_schedule (d);
      if (d->setup_done && !d->stopping)
         schedule (d->tick_ev, 0); /* the next poll follows the new interval */
   }
   /* The fleet learns this instance's new handler set at once: injection
    * everywhere follows it from its next read. */
   if (d->setup_done && !d->stopping)
      schedule (d->fleet_ev, 0);
   /* Between runs the next one follows the new interval; a run in
    * progress keeps its cutoffs, the next run takes the new retention. */
   if (d->purging && d->setup_done && !d->stopping && !dispatch_purge_running (&d->purge))
      schedule (d->purge_ev, d->cfg->purge_interval_ms);
   log_info ("dispatch: reloaded (batch %" PRId64 ", lease %" PRId64 " ms, poll %" PRId64 " ms, purge every %" PRId64
             " ms)",
             d->cfg->batch_size,
             d->cfg->lease_ms,
             d->cfg->poll_interval_ms,
             d->cfg->purge_interval_ms);
}

/* ---------------------------------------------------------------- watch */

/* On the watch thread: deliveries for our handlers were inserted. */
static void
watch_cb (void *ctx)
{
   dispatcher_t *d = ctx;

   if (!atomic_exchange (&d->watch_pending, true))
      event_active (d->watch_ev, EV_TIMEOUT, 0);
   consumer_wake ();
}

/* On the dispatcher: the watch's news claims at once when nothing runs or
 * waits here.  While requests are in flight their completions claim
 * again anyway (and the poll backs them up); a claim per insert seen
 * would multiply the claims on the database while it is busiest, since
 * every dispatching proxy sees every insert. */
static void
watch_wake_cb (evutil_socket_t fd, short what, void *arg)
{
   dispatcher_t *d = arg;
   size_t waiting = 0;

   (void) fd;
   (void) what;
   atomic_store (&d->watch_pending, false);
   for (size_t i = 0; i < d->n_handlers; i++)
      waiting += (size_t) d->handlers[i]->waiting;
   d->probe_stale = !d->stopping; /* handled now, or by the claim after the busy spell */
   if (d->stopping || !d->setup_done || d->n_running > 0 || waiting > 0 || d->n_unsettled > 0)
      return;
   d->woken = true;
   schedule (d->tick_ev, 0);
}

/* Starts the watch, or points it at cfg's handlers (webhook and pull). */
static void
watch_update (dispatcher_t *d, const config_t *cfg)
{
   const char **names = bson_malloc0 ((cfg->n_handlers + 1) * sizeof *names);
   bson_error_t err;

   for (size_t i = 0; i < cfg->n_handlers; i++)
      names[i] = cfg->handlers[i].name;
   if (d->watch)
      store_watch_set_handlers (d->watch, names, cfg->n_handlers);
   else if (d->enabled && cfg->dispatch_watch && cfg->n_handlers > 0 &&
            !(d->watch = store_watch_new (cfg, names, cfg->n_handlers, watch_cb, d, &err)))
      log_warn ("dispatch: cannot watch new deliveries (%s): commits through other proxies are picked up by polling",
                err.message);
   bson_free (names);
}

/* --------------------------------------------------------------- public */

static void
dispatcher_free (dispatcher_t *d)
{
   if (!d)
      return;
   store_watch_destroy (d->watch); /* its callback uses watch_ev */
   d->watch = NULL;
   for (size_t i = 0; i < d->n_done; i++)
      job_drop (d, d->done[i], false);
   for (size_t i = 0; i < d->n_unsettled; i++)
      job_drop (d, d->unsettled[i], false);
   while (d->running) {
      job_t *j = d->running;
      running_remove (d, j);
      job_drop (d, j, false);
   }
   for (size_t i = 0; i < d->n_handlers; i++)
      rate_drop_all (d, d->handlers[i]);
   for (size_t i = 0; i < d->n_retired; i++)
      rate_drop_all (d, d->retired[i]);
   bson_free (d->done);
   bson_free (d->unsettled);
   /* Both threads were joined (dispatch_stop) or never started. */
   RELAYBUS_ASSERT (!worker_running (d->w) && !worker_running (d->renew));
   if (d->renew_tick_ev)
      event_free (d->renew_tick_ev);
   worker_destroy (d->renew);
   renew_set_destroy (&d->renew_set);
   for (size_t i = 0; i < d->n_handlers; i++)
      handler_free (d->handlers[i]);
   for (size_t i = 0; i < d->n_retired; i++)
      handler_free (d->retired[i]);
   bson_free (d->retired);
   bson_free (d->handlers);
   bson_free (d->claim_handlers);
   config_release (d->pending_cfg);
   dispatch_purge_clear (&d->purge);
   dispatch_fleet_destroy (d->fleet);
   struct event *evs[] = {d->setup_ev,
                          d->tick_ev,
                          d->wake_ev,
                          d->watch_ev,
                          d->flush_ev,
                          d->settle_ev,
                          d->deadline_ev,
                          d->reload_ev,
                          d->purge_ev,
                          d->fleet_ev,
                          d->rate_ev};
   for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++)
      if (evs[i])
         event_free (evs[i]);
   store_spaces_clear (&d->spaces);
   store_destroy (d->store);
   worker_destroy (d->w); /* after everything on its base and pool */
   config_release (d->cfg);
   bson_free (d);
}

bool
dispatch_start (config_t *cfg, bson_error_t *error)
{
   dispatcher_t *d = bson_malloc0 (sizeof *d);
   worker_opts_t wo = {
      .name = "dispatch",
      .pool = {.appname = "relaybus-proxy dispatch",
               .server_selection_ms = cfg->upstream_connect_timeout_ms < 2000 ? (int32_t) cfg->upstream_connect_timeout_ms : 2000},
      .on_stop = stop_cb,
      .ctx = d,
   };
   bson_error_t err;
   size_t n_sent = 0;

   renew_set_init (&d->renew_set);
   d->cfg = config_retain (cfg);
   d->w = store_worker_new (cfg, &wo, &d->store, error);
   if (!d->w)
      goto fail;
   d->base = worker_base (d->w);
   store_set_completion_times_by_second (d->store, true); /* its spaces' completions: store.h */
   d->spaces.base = d->store;
   d->fleet = dispatch_fleet_new (d->store, worker_owner (d->w));

   for (size_t i = 0; i < cfg->n_handlers; i++)
      if (transport_kind_dispatched (cfg->handlers[i].kind_id))
         n_sent++;
   /* Enabled, the dispatcher is ready for handlers even with none: a
    * reload may add one (reload_cb). */
   d->enabled = cfg->dispatch_enabled;
   d->dispatching = d->enabled && n_sent > 0;
   d->purging = cfg->dispatch_enabled;
   if (d->enabled) {
      d->handlers = bson_malloc0 ((n_sent + 1) * sizeof *d->handlers);
      d->claim_handlers = bson_malloc0 ((n_sent + 1) * sizeof *d->claim_handlers);
      for (size_t i = 0; i < cfg->n_handlers; i++) {
         handler_rt_t *h;
         if (!transport_kind_dispatched (cfg->handlers[i].kind_id))
            continue;
         h = handler_new (d, cfg, &cfg->handlers[i], error);
         if (!h)
            goto fail;
         d->handlers[d->n_handlers] = h;
         d->claim_handlers[d->n_handlers].handler = h->cfg->name;
         d->n_handlers++;
      }
      RELAYBUS_ASSERT (d->n_handlers == n_sent);
   }
   delivery_rng_seed (&d->rng);
   d->setup_ev = evtimer_new (d->base, setup_cb, d);
   d->tick_ev = evtimer_new (d->base, tick_cb, d);
   d->wake_ev = event_new (d->base, -1, 0, wake_cb, d);
   d->watch_ev = event_new (d->base, -1, 0, watch_wake_cb, d);
   d->flush_ev = event_new (d->base, -1, 0, flush_cb, d);
   d->settle_ev = evtimer_new (d->base, settle_cb, d);
   d->deadline_ev = evtimer_new (d->base, deadline_cb, d);
   d->reload_ev = event_new (d->base, -1, 0, reload_cb, d);
   d->purge_ev = evtimer_new (d->base, purge_cb, d);
   d->fleet_ev = evtimer_new (d->base, fleet_cb, d);
   d->rate_ev = evtimer_new (d->base, rate_cb, d);
   atomic_store (&d->renew_lease_ms, cfg->lease_ms);
   if (d->enabled) {
      /* Its own pool (one connection, appName "relaybus-proxy renew"):
       * a renewal never waits for a client behind a slow claim, and an
       * operator tells renewals from claims in currentOp. */
      const worker_opts_t ro = {
         .name = "renew",
         .quiet = true,
         .pool = {.appname = "relaybus-proxy renew", .server_selection_ms = wo.pool.server_selection_ms, .max_pool_size = 1},
      };

      d->renew = worker_new (cfg->upstream, &ro, &err);
      if (!d->renew) {
         bson_set_error (error, DISPATCH_ERROR_DOMAIN, DISPATCH_ERROR_RENEWAL, "dispatch: lease renewal: %s", err.message);
         goto fail;
      }
      d->renew_tick_ev = evtimer_new (worker_base (d->renew), renew_cb, d);
   }

   /* Setup now, so the publishing path finds the collections; if the
    * upstream is not there yet, the thread retries. */
   if (store_setup (d->store, &err)) {
      d->setup_done = true;
   } else {
      log_warn ("dispatch: outbox setup failed (the dispatcher retries): %s", err.message);
      fleet_note_failed ();
      schedule (d->setup_ev, DISPATCH_SETUP_RETRY_MS);
   }
   if (!d->dispatching)
      log_info ("dispatch: not dispatching (%s)%s",
                cfg->dispatch_enabled ? "no webhook or broker handler" : "[dispatch] enabled = false",
                d->purging ? "; the scheduled purge runs" : "");
   /* The thread runs in every process: it records and reads the fleet's
    * handler set that injection uses. */
   if (d->setup_done)
      schedule (d->fleet_ev, 0);
   if (d->setup_done && d->dispatching)
      schedule (d->tick_ev, 0);
   if (d->setup_done && d->purging)
      schedule (d->purge_ev, cfg->purge_interval_ms);
   if (!worker_start (d->w, error))
      goto fail;
   /* Published once the thread runs: dispatch_wake and dispatch_reload
    * then find a dispatcher that takes their events. */
   pthread_mutex_lock (&g_mu);
   g_d = d;
   pthread_mutex_unlock (&g_mu);
   pthread_mutex_lock (&g_states_mu);
   g_states_d = d;
   pthread_mutex_unlock (&g_states_mu);
   watch_update (d, cfg);
   if (d->renew) {
      renew_arm (d);
      if (!worker_start (d->renew, &err))
         log_warn ("dispatch: cannot start the renewal thread; leases are not renewed while requests run");
   }
   if (d->dispatching)
      log_info ("dispatch: %zu handler(s), owner %s, batch %" PRId64 ", lease %" PRId64 " ms, poll %" PRId64 " ms",
                d->n_handlers,
                worker_owner (d->w),
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
   /* First: its wake-ups would only find a dispatcher on its way out. */
   store_watch_destroy (d->watch);
   d->watch = NULL;
   worker_stop (d->w);
   /* After the dispatcher: its stop waits for requests whose leases are
    * still renewed meanwhile. */
   worker_stop (d->renew);
   pthread_mutex_lock (&g_mu);
   g_d = NULL;
   pthread_mutex_unlock (&g_mu);
   pthread_mutex_lock (&g_states_mu);
   g_states_d = NULL;
   pthread_mutex_unlock (&g_states_mu);
   dispatcher_free (d);
}

void
dispatch_reload (config_t *cfg)
{
   dispatcher_t *d;

   pthread_mutex_lock (&g_mu);
   d = g_d;
   if (d) {
      config_release (d->pending_cfg);
      d->pending_cfg = config_retain (cfg);
      event_active (d->reload_ev, EV_TIMEOUT, 0);
   }
   pthread_mutex_unlock (&g_mu);
}

/* Under g_states_mu: appends h's connection as document `key` of `out`
 * (with its name and kind when `named`); false for a handler without a
 * lasting connection (a webhook). */
static bool
append_connection (handler_rt_t *h, bson_t *out, const char *key, bool named)
{
   char detail[TRANSPORT_DETAIL_MAX];
   transport_state_t s;
   bson_t doc;

   if (!h->t)
      return false;
   s = transport_state (h->t, detail, sizeof detail);
   if (s == TRANSPORT_STATE_NONE)
      return false; /* a connection per request: nothing to report */
   bson_append_document_begin (out, key, -1, &doc);
   if (named) {
      BSON_APPEND_UTF8 (&doc, "name", h->cfg->name);
      BSON_APPEND_UTF8 (&doc, "kind", transport_kind (h->t));
   }
   BSON_APPEND_UTF8 (&doc, "state", transport_state_name (s));
   if (s != TRANSPORT_STATE_CONNECTED && detail[0] && bson_utf8_validate (detail, strlen (detail), false))
      BSON_APPEND_UTF8 (&doc, "detail", detail);
   bson_append_document_end (out, &doc);
   return true;
}

void
dispatch_handler_states (bson_t *out)
{
   dispatcher_t *d;

   pthread_mutex_lock (&g_states_mu);
   d = g_states_d;
   for (size_t i = 0; d && i < d->n_handlers; i++) {
      char key[16];
      bson_snprintf (key, sizeof key, "%u", bson_count_keys (out));
      append_connection (d->handlers[i], out, key, true);
   }
   pthread_mutex_unlock (&g_states_mu);
}

void
dispatch_handler_connection (const char *name, bson_t *doc, const char *field)
{
   dispatcher_t *d;

   pthread_mutex_lock (&g_states_mu);
   d = g_states_d;
   for (size_t i = 0; d && i < d->n_handlers; i++)
      if (!strcmp (d->handlers[i]->cfg->name, name)) {
         append_connection (d->handlers[i], doc, field, false);
         break;
      }
   pthread_mutex_unlock (&g_states_mu);
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
