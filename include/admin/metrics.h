/*
 * admin/metrics.h - the counters the admin port exports that no other module
 * keeps, and the Prometheus text rendering of every metric.
 *
 * Counters here are relaxed atomics bumped by the thread that sees the
 * event: commands by name (the forwarding loop, through a request hook
 * chained in front of the publishing hook), deliveries settled and their
 * handler latency per handler, and claim latency (the dispatcher, when it
 * reports them).  Rendering reads them, the forwarding counters of base/counters.h,
 * the publishing and dispatch counters, and what the admin thread read from
 * the store for this scrape (metrics_view_t).  Nothing here allocates on
 * the forwarding loop or blocks.
 */
#ifndef RELAYBUS_METRICS_H
#define RELAYBUS_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>

#include "proxy/conn.h"
#include "base/config.h"
#include "store/store.h"
#include "store/ops.h"
#include "proxy/topology.h"

/* Handlers with their own series; more are folded into none. */
#define METRICS_MAX_HANDLERS CONFIG_MAX_HANDLERS

typedef enum {
   METRICS_DELIVERY_COMPLETED = 0,
   METRICS_DELIVERY_RETRIED,
   METRICS_DELIVERY_DEAD,
   METRICS_DELIVERY_OUTCOME_COUNT
} metrics_outcome_t;

/* ---------------------------------------------------------- counting */

/* Counts one command by name (a fixed set of names; others count as
 * "other").  Any thread; lock-free. */
void metrics_count_command (const char *cmd);

/* Installs, as `loop`'s request hook, one that counts the command and then
 * calls `next` (the publishing hook) with `next_ctx`.  Hellos never reach
 * request hooks; they are counted by stats.hellos_rewritten. */
void metrics_chain_request_hook (client_loop_t *loop, client_request_hook_t next, void *next_ctx);

/* Declares the handlers of `cfg` so each has series from the first scrape. */
void metrics_set_handlers (const config_t *cfg);

/* One delivery attempt of `handler` ended with `outcome` after
 * `latency_ms` in the handler (request start to answer).  Any thread. */
void metrics_delivery_observe (const char *handler, metrics_outcome_t outcome, int64_t latency_ms);

/* One claim took `latency_ms`.  Any thread. */
void metrics_claim_observe (int64_t latency_ms);

/* One step of a scheduled purge run: what it removed, or that it failed.
 * metrics_purge_run counts a run that ended (ok or not).  Any thread. */
void metrics_purge_observe (int64_t events, int64_t dead, int64_t history);
void metrics_purge_run (bool ok);

/* An annotated event of `type` that no handler subscribes to.  Any
 * thread; lock-free once the type has its series. */
#define METRICS_MAX_UNROUTED_TYPES 100
#define METRICS_UNROUTED_OTHER "_other"
void metrics_unrouted_observe (const char *type);

/* `n` pending deliveries of retired handlers were moved to the dead
 * letters.  Any thread. */
void metrics_retired_observe (int64_t n);

/* Sums of what was observed, for the JSON API (per handler, by name). */
typedef struct {
   uint64_t settled[METRICS_DELIVERY_OUTCOME_COUNT];
   uint64_t latency_count;
   double latency_sum_seconds;
} metrics_handler_totals_t;
bool metrics_handler_totals (const char *handler, metrics_handler_totals_t *out);

/* ---------------------------------------------------------- rendering */

/* What the admin thread learned for this scrape. */
typedef struct {
   int64_t now_ms;
   int64_t start_ms;
   topology_state_t upstream;
   bool outbox_ready;
   bool store_ok; /* the store queries below succeeded */
   store_stats_t totals;
   const store_handler_stats_t *handlers;
   size_t n_handlers;
   int64_t lanes_leased, lanes_held;
   uint64_t admin_requests, admin_rejected;
} metrics_view_t;

/* Appends the Prometheus text exposition (format 0.0.4) to `out`. */
void metrics_render (bson_string_t *out, const metrics_view_t *view);

#endif /* RELAYBUS_METRICS_H */
