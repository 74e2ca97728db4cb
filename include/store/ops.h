/*
 * store/ops.h - the operator's actions and views of the outbox.
 * Thread: admin thread, and the dispatcher thread for the scheduled purge.
 *
 * Requeue, an operator's bury, purge (at once or as scheduled retention
 * in bounded steps), statistics, per-handler backlog, lanes and their
 * owners, a paginated listing of deliveries, and whether setup has run.
 * Blocking mongoc calls, never on the forwarding loop.  Implemented by store/ops.c on the store instance of store/store.h.
 * Inputs that come from a request reach a query only as UTF-8 strings,
 * ObjectIds parsed from 24 hex characters, or integers, never as
 * documents, so they cannot become query operators.
 */
#ifndef RELAYBUS_STORE_OPS_H
#define RELAYBUS_STORE_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>

#include "store/store.h"

/* --------------------------------------------------------------- actions */

/* Makes dead deliveries pending and due at `now` again (attempts start
 * over).  Ids are strings (24 hex characters); anything else matches
 * nothing. */
bool store_requeue (store_t *store,
                    const char *const *ids,
                    size_t n,
                    int64_t now,
                    size_t *n_requeued,
                    bson_error_t *error) __attribute__ ((warn_unused_result));

/* An operator's bury: pending deliveries among `ids` (24 hex characters;
 * anything else matches nothing) that no lane lists in flight become dead
 * with `reason` as lastError; their claim generation moves on, so a lease
 * issued for them before can no longer settle them. */
bool store_bury_ids (store_t *store,
                     const char *const *ids,
                     size_t n,
                     int64_t now,
                     const char *reason,
                     size_t *n_buried,
                     bson_error_t *error) __attribute__ ((warn_unused_result));

/* A replay: every stored event created in [since, until) whose type one
 * of `patterns` matches (config_patterns_match) gets a new pending
 * delivery for `handler`, due at `now`, whatever its `handlers` list says
 * (completed handlers included).  An event that still has an unfinished
 * (pending or dead) delivery for the handler is skipped: requeue is the
 * action for those, and the outbox holds one delivery per event and
 * handler.  A keyed delivery takes new sequences of its key (after every
 * delivery the key has), in the order of the events' own sequences, in
 * the transaction that writes it, so it runs after the key's deliveries
 * already pending and the replayed ones run in their original order.
 * More than `max_events` matching events: nothing is written and the
 * error is STORE_ERROR_INVALID. */
typedef struct {
   const char *handler;
   const char *const *patterns;
   size_t n_patterns;
   int64_t since, until; /* ms since the epoch, until exclusive */
   int64_t now;
   size_t max_events;
} store_replay_opts_t;

typedef struct {
   size_t matched; /* events of the window the patterns match */
   size_t queued;  /* new deliveries written */
   size_t skipped; /* matched events that still had a delivery */
} store_replay_result_t;

bool store_replay (store_t *store,
                   const store_replay_opts_t *opts,
                   store_replay_result_t *result,
                   bson_error_t *error) __attribute__ ((warn_unused_result));

/* ----------------------------------------------------------------- purge */

typedef struct {
   int64_t dead_before;      /* 0: keep dead deliveries */
   int64_t completed_before; /* 0: keep completion history and completed events */
} store_purge_opts_t;

typedef struct {
   int64_t dead, completed, events;
} store_purge_result_t;

bool store_purge (store_t *store,
                  const store_purge_opts_t *opts,
                  store_purge_result_t *result,
                  bson_error_t *error) __attribute__ ((warn_unused_result));

/* Scheduled retention: a purge run in bounded steps.  The caller starts a
 * run by setting the cutoffs on a cleared run (active false), then calls
 * store_purge_step until it reports `done`, with as much time between
 * steps as it likes; each step is one batch (purge_batch_size documents,
 * one transaction) of, in turn, dead deliveries, completion history
 * records, then events, with the same rules as store_purge.  Each step
 * first takes or renews the purge lease (one document, for `lease_ms`):
 * while another instance holds it, the step does nothing and reports
 * leased false.  The run is cleared when it is done, on an error and
 * when the lease is elsewhere. */
typedef struct {
   bool active;
   int64_t dead_before;      /* 0: keep dead deliveries */
   int64_t completed_before; /* 0: keep completion history and completed events */
   /* progress, owned by the store */
   int phase;
   int64_t after_created;
   char *after_id;
} store_purge_run_t;

typedef struct {
   bool leased; /* false: the purge lease is held by another instance */
   bool done;   /* the run is over */
   int64_t dead, completed, events; /* removed by this step */
} store_purge_step_result_t;

bool store_purge_step (store_t *store,
                       store_purge_run_t *run,
                       int64_t now,
                       int64_t lease_ms,
                       store_purge_step_result_t *result,
                       bson_error_t *error) __attribute__ ((warn_unused_result));
/* Frees the run's progress and clears it; NULL accepted. */
void store_purge_run_clear (store_purge_run_t *run);

/* ----------------------------------------------------------------- views */

typedef struct {
   int64_t pending, dead, parked, completed, running;
   int64_t lanes_owned;    /* lanes under a live lease at `now` */
   int64_t oldest_due_at;  /* 0: nothing pending */
} store_stats_t;

bool store_statistics (store_t *store, int64_t now, store_stats_t *stats, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* Deliveries of one handler, by state. */
typedef struct {
   char name[128];
   int64_t pending; /* ready and parked */
   int64_t parked;
   int64_t dead;
   int64_t oldest_due_at; /* ms, of its pending deliveries; 0: none */
} store_handler_stats_t;

/* One group by (handler, status, lane) over the deliveries.  `*out` is
 * allocated (bson_free) with `*n` entries, sorted by name. */
bool store_handler_stats (store_t *store, store_handler_stats_t **out, size_t *n, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* Appends to `out` (an array) the lanes that have an owner:
 * {id, owner, leaseExpiresAt (ms), live, epoch, inFlight (count)}.
 * *leased counts lanes under a live lease at `now`; *held_local those of
 * them whose owner starts with `local_prefix` (may be NULL). */
bool store_list_lanes (store_t *store,
                       int64_t now,
                       const char *local_prefix,
                       bson_t *out,
                       int64_t *leased,
                       int64_t *held_local,
                       bson_error_t *error) __attribute__ ((warn_unused_result));

/* True when setup has run: the lane documents of every space exist. */
bool store_is_set_up (store_t *store, bool *ready, bson_error_t *error) __attribute__ ((warn_unused_result));

/* Filters of a listing (store_list_page): every field is a string (or
 * NULL) and reaches the query as a string, never as an operator. */
typedef struct {
   const char *status; /* pending | dead | completed; NULL: pending and dead */
   const char *handler;
   const char *event_type;
   const char *event_id;
   const char *key;
   int64_t limit; /* 1..1000; 0: 100 */
} store_list_filter_t;

/* A page of at most filter->limit deliveries in (createdAt, _id) order,
 * after the position (after_created, after_id) when after_id is non-NULL:
 * the next page starts after the createdAt and _id of the last document of
 * this one.  Filters as in store_list_filter_t (strings; status NULL:
 * pending and dead; "completed" reads the completion history, each record
 * with status "completed").  Appends the documents to `out` (an array, or
 * an empty bson_t treated as one); *more tells whether another page
 * follows.  An unknown status, or "completed" without completion history,
 * matches nothing: an empty page and true. */
bool store_list_page (store_t *store,
                      const store_list_filter_t *filter,
                      int64_t after_created,
                      const bson_oid_t *after_id,
                      bson_t *out,
                      bool *more,
                      bson_error_t *error) __attribute__ ((warn_unused_result));

#endif /* RELAYBUS_STORE_OPS_H */
