/*
 * dispatch/purge.c - the dispatcher's scheduled purge (dispatch/purge.h):
 * each step one bounded batch of store_purge_step, the counters of what
 * it removed, and the log line of a run.
 */
#include "dispatch/purge.h"

#include <inttypes.h>

#include "base/clock.h"
#include "base/counters.h"
#include "base/log.h"

/* The one log line of a run that removed something, however it ended. */
static void
purge_report (dispatch_purge_t *p, const char *how)
{
   if (p->events + p->dead + p->history == 0)
      return;
   log_info ("dispatch: scheduled purge removed %" PRId64 " events, %" PRId64 " dead deliveries, %" PRId64
             " completion records in %" PRId64 " ms (%s; cutoffs: completed before %" PRId64 ", dead before %" PRId64 ")",
             p->events,
             p->dead,
             p->history,
             clock_now_ms () - p->started_ms,
             how,
             p->cutoff_completed,
             p->cutoff_dead);
   p->events = p->dead = p->history = 0;
}

int64_t
dispatch_purge_step (dispatch_purge_t *p, store_t *store, const config_t *cfg, int64_t now)
{
   store_purge_step_result_t r;
   bson_error_t err;

   if (!p->run.active) {
      p->run.active = true;
      p->run.completed_before = now - cfg->retain_completed_ms;
      p->run.dead_before = now - cfg->retain_dead_ms;
      p->started_ms = now;
      p->cutoff_completed = p->run.completed_before;
      p->cutoff_dead = p->run.dead_before;
      p->events = p->dead = p->history = 0;
   }
   if (!store_purge_step (store, &p->run, now, cfg->lease_ms, &r, &err)) {
      counters_add (COUNTER_PURGE_ERRORS, 1);
      purge_report (p, "then failed");
      log_warn ("dispatch: scheduled purge failed (next run in %" PRId64 " ms): %s", cfg->purge_interval_ms, err.message);
      return cfg->purge_interval_ms;
   }
   if (!r.leased) {
      purge_report (p, "then the purge lease went to another instance");
      log_debug ("dispatch: scheduled purge skipped: another instance holds the purge lease");
      return cfg->purge_interval_ms;
   }
   counters_add (COUNTER_PURGED_EVENTS, r.events > 0 ? (uint64_t) r.events : 0);
   counters_add (COUNTER_PURGED_DEAD, r.dead > 0 ? (uint64_t) r.dead : 0);
   counters_add (COUNTER_PURGED_HISTORY, r.completed > 0 ? (uint64_t) r.completed : 0);
   p->events += r.events;
   p->dead += r.dead;
   p->history += r.completed;
   if (!r.done)
      return DISPATCH_PURGE_STEP_PAUSE_MS;
   counters_add (COUNTER_PURGE_RUNS, 1);
   purge_report (p, "done");
   return cfg->purge_interval_ms;
}

bool
dispatch_purge_running (const dispatch_purge_t *p)
{
   return p->run.active;
}

void
dispatch_purge_clear (dispatch_purge_t *p)
{
   store_purge_run_clear (&p->run);
}
