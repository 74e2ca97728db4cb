/*
 * dispatch/purge.h - the dispatcher's scheduled purge (retain_completed,
 * retain_dead, purge_interval): a run in bounded steps under the store's
 * purge lease (store/ops.h, store_purge_step), a short pause between
 * steps so claims and flushes interleave, and one log line per run that
 * removed something.
 *
 * Thread: the dispatcher's.
 */
#ifndef RELAYBUS_DISPATCH_PURGE_H
#define RELAYBUS_DISPATCH_PURGE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/config.h"
#include "store/ops.h"

/* Pause between two steps of a purge run: claims, flushes and settling
 * that became due meanwhile run first. */
#define DISPATCH_PURGE_STEP_PAUSE_MS 20

/* The run in progress and what it removed so far. */
typedef struct {
   store_purge_run_t run;
   int64_t started_ms;
   int64_t cutoff_completed, cutoff_dead; /* of the run, ms since the epoch */
   int64_t events, dead, history;
} dispatch_purge_t;

/* One step at `now` with `store` (a run starts with the cutoffs of
 * `cfg`): returns when the next step is due, in ms (the pause within a
 * run, purge_interval after one ended, failed or found the lease
 * elsewhere). */
int64_t dispatch_purge_step (dispatch_purge_t *p, store_t *store, const config_t *cfg, int64_t now);
/* Whether a run is in progress (a reload leaves it its cutoffs). */
bool dispatch_purge_running (const dispatch_purge_t *p);
/* Frees the run's progress. */
void dispatch_purge_clear (dispatch_purge_t *p);

#endif /* RELAYBUS_DISPATCH_PURGE_H */
