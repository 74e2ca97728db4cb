/*
 * admin/render.c - commands by name, per-handler delivery counters and latency
 * histograms, and the Prometheus text rendering (see admin/metrics.h).
 *
 * Names follow Prometheus conventions: relaybus_ prefix, base units in the
 * name (_seconds, _bytes), _total on counters only.  Label values are
 * escaped; their sets are bounded (command names are a fixed list, handler
 * names come from the configuration, close reasons from an enum).
 */
#include "admin/metrics.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "autoconf.h"
#include "dispatch/dispatch.h"
#include "base/fleet.h"
#include "base/counters.h"
#include "publish/publish.h"

/* ------------------------------------------------------------ commands */

/* Sorted (strcmp) for bsearch; "other" collects the rest. */
static const char *const command_names[] = {
   "abortTransaction", "aggregate",      "authenticate",     "buildInfo",        "collMod",
   "collStats",        "commitTransaction", "configureFailPoint", "connectionStatus", "count",
   "create",           "createIndexes",  "dbStats",          "delete",           "distinct",
   "drop",             "dropDatabase",   "dropIndexes",      "endSessions",      "explain",
   "find",             "findAndModify",  "getMore",          "getParameter",     "hostInfo",
   "insert",           "killCursors",    "killSessions",     "listCollections",  "listDatabases",
   "listIndexes",      "logout",         "ping",             "refreshSessions",  "relaybusClaim",
   "relaybusComplete", "relaybusPublish", "relaybusStatus", "renameCollection", "saslContinue",     "saslStart",
   "serverStatus",     "startSession",   "update",
};
#define N_COMMANDS (sizeof command_names / sizeof command_names[0])

static _Atomic uint64_t command_counts[N_COMMANDS + 1]; /* last: other */

static int
name_cmp (const void *key, const void *elem)
{
   return strcmp ((const char *) key, *(const char *const *) elem);
}

void
metrics_count_command (const char *cmd)
{
   const char *const *hit = cmd ? bsearch (cmd, command_names, N_COMMANDS, sizeof command_names[0], name_cmp) : NULL;
   size_t i = hit ? (size_t) (hit - command_names) : N_COMMANDS;

   atomic_fetch_add_explicit (&command_counts[i], 1, memory_order_relaxed);
}

typedef struct {
   client_request_hook_t next;
   void *next_ctx;
} chain_t;

/* One per process: the forwarding loop is a single loop today. */
static chain_t chain;

static client_route_t
metrics_hook (client_conn_t *c, const wire_msg_t *msg, const char *cmd, int compressor, void *ctx, bson_error_t *error)
{
   chain_t *ch = ctx;

   metrics_count_command (cmd);
   return ch->next ? ch->next (c, msg, cmd, compressor, ch->next_ctx, error) : CLIENT_ROUTE_FORWARD;
}

void
metrics_chain_request_hook (client_loop_t *loop, client_request_hook_t next, void *next_ctx)
{
   chain.next = next;
   chain.next_ctx = next_ctx;
   client_loop_set_request_hook (loop, metrics_hook, &chain);
}

/* ------------------------------------------------------------ handlers */

/* Upper bounds in ms of the latency buckets (and +Inf). */
static const int64_t bucket_ms[] = {1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000};
#define N_BUCKETS (sizeof bucket_ms / sizeof bucket_ms[0])

typedef struct {
   _Atomic uint64_t buckets[N_BUCKETS + 1]; /* not cumulative; last: +Inf */
   _Atomic uint64_t count;
   _Atomic uint64_t sum_ms;
} histogram_t;

typedef struct {
   char name[128];
   _Atomic uint64_t settled[METRICS_DELIVERY_OUTCOME_COUNT];
   histogram_t latency;
} handler_metrics_t;

static pthread_mutex_t handlers_mu = PTHREAD_MUTEX_INITIALIZER; /* adding only */
static handler_metrics_t handlers[METRICS_MAX_HANDLERS];
static _Atomic size_t n_handlers; /* entries below are complete (release/acquire) */
static histogram_t claim_latency;

static void
histogram_observe (histogram_t *h, int64_t ms)
{
   size_t b = 0;

   if (ms < 0)
      ms = 0;
   while (b < N_BUCKETS && ms > bucket_ms[b])
      b++;
   atomic_fetch_add_explicit (&h->buckets[b], 1, memory_order_relaxed);
   atomic_fetch_add_explicit (&h->count, 1, memory_order_relaxed);
   atomic_fetch_add_explicit (&h->sum_ms, (uint64_t) ms, memory_order_relaxed);
}

static handler_metrics_t *
handler_find (const char *name, bool add)
{
   size_t n = atomic_load_explicit (&n_handlers, memory_order_acquire);

   for (size_t i = 0; i < n; i++)
      if (!strcmp (handlers[i].name, name))
         return &handlers[i];
   if (!add)
      return NULL;
   pthread_mutex_lock (&handlers_mu);
   n = atomic_load_explicit (&n_handlers, memory_order_acquire);
   for (size_t i = 0; i < n; i++)
      if (!strcmp (handlers[i].name, name)) {
         pthread_mutex_unlock (&handlers_mu);
         return &handlers[i];
      }
   if (n == METRICS_MAX_HANDLERS || strlen (name) >= sizeof handlers[0].name) {
      pthread_mutex_unlock (&handlers_mu);
      return NULL;
   }
   bson_strncpy (handlers[n].name, name, sizeof handlers[n].name);
   atomic_store_explicit (&n_handlers, n + 1, memory_order_release);
   pthread_mutex_unlock (&handlers_mu);
   return &handlers[n];
}

void
metrics_set_handlers (const config_t *cfg)
{
   for (size_t i = 0; cfg && i < cfg->n_handlers; i++)
      (void) handler_find (cfg->handlers[i].name, true);
}

void
metrics_delivery_observe (const char *handler, metrics_outcome_t outcome, int64_t latency_ms)
{
   handler_metrics_t *h = handler ? handler_find (handler, true) : NULL;

   if (!h || outcome >= METRICS_DELIVERY_OUTCOME_COUNT)
      return;
   atomic_fetch_add_explicit (&h->settled[outcome], 1, memory_order_relaxed);
   histogram_observe (&h->latency, latency_ms);
}

void
metrics_claim_observe (int64_t latency_ms)
{
   histogram_observe (&claim_latency, latency_ms);
}

/* Scheduled retention (the dispatcher's purge runs). */
static struct {
   _Atomic uint64_t events, dead, history, runs, errors;
} purge_counts;

void
metrics_purge_observe (int64_t events, int64_t dead, int64_t history)
{
   atomic_fetch_add_explicit (&purge_counts.events, (uint64_t) (events > 0 ? events : 0), memory_order_relaxed);
   atomic_fetch_add_explicit (&purge_counts.dead, (uint64_t) (dead > 0 ? dead : 0), memory_order_relaxed);
   atomic_fetch_add_explicit (&purge_counts.history, (uint64_t) (history > 0 ? history : 0), memory_order_relaxed);
}

void
metrics_purge_run (bool ok)
{
   atomic_fetch_add_explicit (ok ? &purge_counts.runs : &purge_counts.errors, 1, memory_order_relaxed);
}

bool
metrics_handler_totals (const char *handler, metrics_handler_totals_t *out)
{
   handler_metrics_t *h = handler_find (handler, false);

   memset (out, 0, sizeof *out);
   if (!h)
      return false;
   for (int o = 0; o < METRICS_DELIVERY_OUTCOME_COUNT; o++)
      out->settled[o] = atomic_load_explicit (&h->settled[o], memory_order_relaxed);
   out->latency_count = atomic_load_explicit (&h->latency.count, memory_order_relaxed);
   out->latency_sum_seconds = (double) atomic_load_explicit (&h->latency.sum_ms, memory_order_relaxed) / 1000.0;
   return true;
}

/* ------------------------------------------------------------ unrouted */

/* Event types seen without any handler: the first METRICS_MAX_UNROUTED_TYPES
 * distinct types get their own series, the rest are counted under
 * METRICS_UNROUTED_OTHER.  Looked up without a lock (entries below the
 * published count are complete); only adding takes the mutex, at most
 * METRICS_MAX_UNROUTED_TYPES times per process. */
typedef struct {
   char type[128];
   _Atomic uint64_t n;
} unrouted_t;

static pthread_mutex_t unrouted_mu = PTHREAD_MUTEX_INITIALIZER;
static unrouted_t unrouted[METRICS_MAX_UNROUTED_TYPES];
static _Atomic size_t n_unrouted;
static _Atomic uint64_t unrouted_other;
static _Atomic uint64_t retired_deliveries;

void
metrics_unrouted_observe (const char *type)
{
   size_t n = atomic_load_explicit (&n_unrouted, memory_order_acquire);

   for (size_t i = 0; i < n; i++)
      if (!strcmp (unrouted[i].type, type)) {
         atomic_fetch_add_explicit (&unrouted[i].n, 1, memory_order_relaxed);
         return;
      }
   if (n == METRICS_MAX_UNROUTED_TYPES || strlen (type) >= sizeof unrouted[0].type ||
       !strcmp (type, METRICS_UNROUTED_OTHER)) {
      atomic_fetch_add_explicit (&unrouted_other, 1, memory_order_relaxed);
      return;
   }
   pthread_mutex_lock (&unrouted_mu);
   n = atomic_load_explicit (&n_unrouted, memory_order_acquire);
   for (size_t i = 0; i < n; i++)
      if (!strcmp (unrouted[i].type, type)) {
         pthread_mutex_unlock (&unrouted_mu);
         atomic_fetch_add_explicit (&unrouted[i].n, 1, memory_order_relaxed);
         return;
      }
   if (n == METRICS_MAX_UNROUTED_TYPES) {
      pthread_mutex_unlock (&unrouted_mu);
      atomic_fetch_add_explicit (&unrouted_other, 1, memory_order_relaxed);
      return;
   }
   bson_strncpy (unrouted[n].type, type, sizeof unrouted[n].type);
   atomic_store_explicit (&unrouted[n].n, 1, memory_order_relaxed);
   atomic_store_explicit (&n_unrouted, n + 1, memory_order_release);
   pthread_mutex_unlock (&unrouted_mu);
}

void
metrics_retired_observe (int64_t n)
{
   if (n > 0)
      atomic_fetch_add_explicit (&retired_deliveries, (uint64_t) n, memory_order_relaxed);
}

/* ----------------------------------------------------------- rendering */

/* Label values: backslash, double quote and newline are escaped. */
static void
append_label_value (bson_string_t *out, const char *v)
{
   for (; *v; v++) {
      if (*v == '\\')
         bson_string_append (out, "\\\\");
      else if (*v == '"')
         bson_string_append (out, "\\\"");
      else if (*v == '\n')
         bson_string_append (out, "\\n");
      else
         bson_string_append_c (out, *v);
   }
}

static void
family (bson_string_t *out, const char *name, const char *type, const char *help)
{
   bson_string_append_printf (out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A sample's name and its one optional label, `name{label="value"}`; the
 * caller appends the value. */
static void
sample_start (bson_string_t *out, const char *name, const char *label, const char *value)
{
   bson_string_append (out, name);
   if (label) {
      bson_string_append_printf (out, "{%s=\"", label);
      append_label_value (out, value);
      bson_string_append (out, "\"}");
   }
}

static void
sample_u64 (bson_string_t *out, const char *name, const char *label, const char *value, uint64_t v)
{
   sample_start (out, name, label, value);
   bson_string_append_printf (out, " %" PRIu64 "\n", v);
}

static void
sample_f (bson_string_t *out, const char *name, const char *label, const char *value, double v)
{
   sample_start (out, name, label, value);
   bson_string_append_printf (out, " %.3f\n", v);
}

static void
scalar (bson_string_t *out, const char *name, const char *type, const char *help, uint64_t v)
{
   family (out, name, type, help);
   sample_u64 (out, name, NULL, NULL, v);
}

#define STAT(field) stats_get (field)

static void
render_histogram (bson_string_t *out, const char *name, const char *label, const char *value, histogram_t *h)
{
   uint64_t cum = 0;
   char lv[600] = ""; /* label="value", (a name of at most 127 bytes, escaped) */

   if (label) {
      bson_string_t *tmp = bson_string_new (NULL);
      append_label_value (tmp, value);
      bson_snprintf (lv, sizeof lv, "%s=\"%s\",", label, tmp->str);
      bson_string_free (tmp, true);
   }
   for (size_t b = 0; b <= N_BUCKETS; b++) {
      cum += atomic_load_explicit (&h->buckets[b], memory_order_relaxed);
      if (b < N_BUCKETS)
         bson_string_append_printf (out, "%s_bucket{%sle=\"%g\"} %" PRIu64 "\n", name, lv, (double) bucket_ms[b] / 1000.0, cum);
      else
         bson_string_append_printf (out, "%s_bucket{%sle=\"+Inf\"} %" PRIu64 "\n", name, lv, cum);
   }
   if (label) {
      lv[strlen (lv) - 1] = '\0'; /* no trailing comma */
      bson_string_append_printf (out, "%s_sum{%s} %.3f\n", name, lv, (double) atomic_load (&h->sum_ms) / 1000.0);
      bson_string_append_printf (out, "%s_count{%s} %" PRIu64 "\n", name, lv, cum);
   } else {
      bson_string_append_printf (out, "%s_sum %.3f\n", name, (double) atomic_load (&h->sum_ms) / 1000.0);
      bson_string_append_printf (out, "%s_count %" PRIu64 "\n", name, cum);
   }
}

static void
render_forwarding (bson_string_t *out)
{
   scalar (out, "relaybus_client_connections", "gauge", "Client connections open.", STAT (connections_open));
   scalar (out,
           "relaybus_client_connections_accepted_total",
           "counter",
           "Client connections accepted, including those refused over max_clients.",
           STAT (connections_accepted));
   family (out, "relaybus_client_connections_closed_total", "counter", "Client connections closed, by reason.");
   for (int r = 0; r < STATS_CLOSE_REASON_COUNT; r++)
      sample_u64 (out,
                  "relaybus_client_connections_closed_total",
                  "reason",
                  stats_close_reason_name ((stats_close_reason_t) r),
                  atomic_load_explicit (&stats.connections_closed[r], memory_order_relaxed));
   scalar (out, "relaybus_upstream_connections", "gauge", "Upstream connections open.", STAT (upstreams_open));
   scalar (out, "relaybus_upstream_connects_total", "counter", "Upstream connections opened.", STAT (upstream_connects));
   scalar (out,
           "relaybus_upstream_connect_failures_total",
           "counter",
           "Upstream connection attempts that failed.",
           STAT (upstream_connect_failures));
   scalar (out, "relaybus_client_received_bytes_total", "counter", "Bytes of messages received from clients.", STAT (bytes_from_clients));
   scalar (out, "relaybus_client_sent_bytes_total", "counter", "Bytes of messages sent to clients.", STAT (bytes_to_clients));
   scalar (out,
           "relaybus_upstream_received_bytes_total",
           "counter",
           "Bytes of messages received from the upstream.",
           STAT (bytes_from_upstream));
   scalar (out, "relaybus_upstream_sent_bytes_total", "counter", "Bytes of messages sent to the upstream.", STAT (bytes_to_upstream));
   scalar (out, "relaybus_client_messages_total", "counter", "Messages received from clients.", STAT (messages_from_clients));
   scalar (out, "relaybus_upstream_messages_total", "counter", "Messages received from the upstream.", STAT (messages_from_upstream));
   family (out,
           "relaybus_commands_total",
           "counter",
           "Client commands by name (hellos are counted by relaybus_hellos_total; unlisted names as other).");
   for (size_t i = 0; i <= N_COMMANDS; i++)
      sample_u64 (out,
                  "relaybus_commands_total",
                  "command",
                  i < N_COMMANDS ? command_names[i] : "other",
                  atomic_load_explicit (&command_counts[i], memory_order_relaxed));
   scalar (out, "relaybus_hellos_total", "counter", "Handshake hellos answered (rewritten) by the proxy.", STAT (hellos_rewritten));
   scalar (out, "relaybus_not_primary_errors_total", "counter", "Not-primary class errors relayed.", STAT (not_primary_errors));
   scalar (out, "relaybus_primary_changes_total", "counter", "Times the primary changed.", STAT (primary_changes));
   scalar (out, "relaybus_internal_requests_total", "counter", "Requests the proxy sent upstream on its own.", STAT (internal_requests));
   scalar (out,
           "relaybus_accept_pauses_total",
           "counter",
           "Times the listener paused accepting on EMFILE or ENFILE.",
           STAT (accept_paused));
   scalar (out,
           "relaybus_buffered_bytes",
           "gauge",
           "Bytes all connections hold or have reserved (partial messages, decompression, queues); bounded by max_buffered_bytes.",
           STAT (buffered_bytes));
   scalar (out,
           "relaybus_memory_paused_connections",
           "gauge",
           "Connections not read now because max_buffered_bytes is reached.",
           STAT (connections_paused_memory));
   scalar (out,
           "relaybus_memory_pauses_total",
           "counter",
           "Times a connection stopped being read because max_buffered_bytes was reached.",
           STAT (memory_pauses));
   scalar (out,
           "relaybus_requests_offloaded_total",
           "counter",
           "Requests of 1 MiB or more decompressed and validated on the decoding thread.",
           STAT (requests_offloaded));
}

static void
render_publishing (bson_string_t *out)
{
   virtual_stats_t v;

   virtual_get_stats (&v);
   scalar (out, "relaybus_annotated_statements_total", "counter", "Annotated statements seen.", v.annotated);
   scalar (out, "relaybus_events_published_total", "counter", "Events written into the outbox.", v.events);
   scalar (out, "relaybus_deliveries_written_total", "counter", "Deliveries written into the outbox.", v.deliveries);
   family (out, "relaybus_publish_errors_total", "counter", "Publishing failures, by kind.");
   sample_u64 (out, "relaybus_publish_errors_total", "kind", "bad_annotation", v.bad_annotations);
   sample_u64 (out, "relaybus_publish_errors_total", "kind", "outside_transaction", v.outside_txn);
   sample_u64 (out, "relaybus_publish_errors_total", "kind", "outbox_write", v.inject_failed);
   sample_u64 (out, "relaybus_publish_errors_total", "kind", "connection_lost", v.aborted_lost);
   scalar (out,
           "relaybus_poisoned_transactions_total",
           "counter",
           "Transactions poisoned: a publish lost its connection or an outbox write failed, so their commit is refused.",
           v.poisoned);
   scalar (out,
           "relaybus_poisoned_commits_refused_total",
           "counter",
           "commitTransaction requests of poisoned transactions, aborted instead of forwarded.",
           v.poison_refused);
   scalar (out,
           "relaybus_poisoned_table_full_refusals_total",
           "counter",
           "Annotated statements and relaybusPublish calls refused (transient error) because max_poisoned_transactions were held.",
           v.poison_full_refused);
   scalar (out, "relaybus_poisoned_transactions", "gauge", "Poisoned transactions remembered now.", v.poison_entries);
   scalar (out,
           "relaybus_outbox_client_writes_refused_total",
           "counter",
           "Client commands refused (Unauthorized) because they write the outbox collections.",
           v.outbox_writes_refused);
   family (out,
           "relaybus_events_unrouted_total",
           "counter",
           "Annotated events no handler (local or of a live proxy) subscribes to, by type (the first 100 types; later ones as _other).");
   {
      size_t n = atomic_load_explicit (&n_unrouted, memory_order_acquire);

      for (size_t i = 0; i < n; i++)
         sample_u64 (out, "relaybus_events_unrouted_total", "type", unrouted[i].type, atomic_load (&unrouted[i].n));
      if (atomic_load (&unrouted_other) > 0)
         sample_u64 (out, "relaybus_events_unrouted_total", "type", METRICS_UNROUTED_OTHER, atomic_load (&unrouted_other));
   }
}

static void
render_dispatch (bson_string_t *out)
{
   static const struct {
      const char *name, *help;
   } settled[METRICS_DELIVERY_OUTCOME_COUNT] = {
      [METRICS_DELIVERY_COMPLETED] = {"relaybus_deliveries_completed_total", "Deliveries completed, by handler."},
      [METRICS_DELIVERY_RETRIED] = {"relaybus_deliveries_retried_total", "Delivery attempts that failed and were rescheduled, by handler."},
      [METRICS_DELIVERY_DEAD] = {"relaybus_deliveries_dead_total", "Deliveries that became dead letters, by handler."},
   };
   size_t n = atomic_load_explicit (&n_handlers, memory_order_acquire);
   dispatch_stats_t d;

   dispatch_get_stats (&d);
   scalar (out, "relaybus_dispatch_claims_total", "counter", "Claim calls made by this process's dispatcher.", d.claims);
   scalar (out, "relaybus_dispatch_claimed_total", "counter", "Deliveries claimed by this process's dispatcher.", d.claimed);
   scalar (out, "relaybus_dispatch_completed_total", "counter", "Deliveries this process completed (all handlers).", d.completed);
   scalar (out, "relaybus_dispatch_retried_total", "counter", "Delivery attempts this process rescheduled (all handlers).", d.rescheduled);
   scalar (out, "relaybus_dispatch_dead_total", "counter", "Deliveries this process buried (all handlers).", d.dead);
   scalar (out,
           "relaybus_dispatch_lost_completions_total",
           "counter",
           "Completions not proven because a lane changed hands (they may run again).",
           d.lost_completions);
   scalar (out, "relaybus_dispatch_http_requests_total", "counter", "Webhook requests started.", d.http_requests);
   for (int o = 0; o < METRICS_DELIVERY_OUTCOME_COUNT; o++) {
      family (out, settled[o].name, "counter", settled[o].help);
      for (size_t i = 0; i < n; i++)
         sample_u64 (out, settled[o].name, "handler", handlers[i].name, atomic_load (&handlers[i].settled[o]));
   }
   family (out, "relaybus_handler_latency_seconds", "histogram", "Time from a webhook request's start to its answer, by handler.");
   for (size_t i = 0; i < n; i++)
      render_histogram (out, "relaybus_handler_latency_seconds", "handler", handlers[i].name, &handlers[i].latency);
   family (out, "relaybus_claim_latency_seconds", "histogram", "Duration of one claim call.");
   render_histogram (out, "relaybus_claim_latency_seconds", NULL, NULL, &claim_latency);
   {
      fleet_set_t *fs = fleet_acquire ();
      size_t live = 0;

      for (size_t i = 0; fs && i < fs->n_instances; i++)
         live += fs->instances[i].live;
      scalar (out, "relaybus_fleet_instances", "gauge", "Live proxy instances in the fleet's handler set as this process last read it.", live);
      scalar (out,
              "relaybus_handler_sets_disagreeing",
              "gauge",
              "Handler names live proxies declare differently (kind, events or settings hash).",
              fs ? fs->n_disagreeing : 0);
      fleet_release (fs);
   }
   scalar (out,
           "relaybus_handler_retired_deliveries_total",
           "counter",
           "Pending deliveries this process moved to the dead letters because no live proxy declared their handler.",
           atomic_load (&retired_deliveries));
   scalar (out, "relaybus_purge_runs_total", "counter", "Scheduled purge runs this process completed.", atomic_load (&purge_counts.runs));
   scalar (out, "relaybus_purge_errors_total", "counter", "Scheduled purge runs this process ended on an error.", atomic_load (&purge_counts.errors));
   scalar (out, "relaybus_purged_events_total", "counter", "Events (deduplication records) removed by scheduled purges of this process.", atomic_load (&purge_counts.events));
   scalar (out, "relaybus_purged_dead_letters_total", "counter", "Dead deliveries removed by scheduled purges of this process.", atomic_load (&purge_counts.dead));
   scalar (out, "relaybus_purged_history_total", "counter", "Completion history records removed by scheduled purges of this process.", atomic_load (&purge_counts.history));
}

static void
render_store (bson_string_t *out, const metrics_view_t *v)
{
   scalar (out, "relaybus_store_up", "gauge", "1 when this scrape's outbox queries succeeded.", v->store_ok ? 1 : 0);
   if (!v->store_ok)
      return;
   family (out, "relaybus_outbox_backlog", "gauge", "Pending deliveries (ready and parked), by handler.");
   for (size_t i = 0; i < v->n_handlers; i++)
      sample_u64 (out, "relaybus_outbox_backlog", "handler", v->handlers[i].name, (uint64_t) v->handlers[i].pending);
   family (out, "relaybus_outbox_parked", "gauge", "Pending deliveries parked behind an unfinished predecessor, by handler.");
   for (size_t i = 0; i < v->n_handlers; i++)
      sample_u64 (out, "relaybus_outbox_parked", "handler", v->handlers[i].name, (uint64_t) v->handlers[i].parked);
   family (out, "relaybus_outbox_dead_letters", "gauge", "Dead deliveries stored (until requeued or purged), by handler.");
   for (size_t i = 0; i < v->n_handlers; i++)
      sample_u64 (out, "relaybus_outbox_dead_letters", "handler", v->handlers[i].name, (uint64_t) v->handlers[i].dead);
   family (out,
           "relaybus_outbox_oldest_due_age_seconds",
           "gauge",
           "Age of the oldest due pending delivery (0 when none is due), by handler.");
   for (size_t i = 0; i < v->n_handlers; i++) {
      int64_t due = v->handlers[i].oldest_due_at;
      double age = due > 0 && v->now_ms > due ? (double) (v->now_ms - due) / 1000.0 : 0.0;
      sample_f (out, "relaybus_outbox_oldest_due_age_seconds", "handler", v->handlers[i].name, age);
   }
   scalar (out, "relaybus_outbox_running", "gauge", "Deliveries listed in flight by lanes under a live lease.", (uint64_t) v->totals.running);
   scalar (out,
           "relaybus_outbox_completed_records",
           "gauge",
           "Completion history records stored (0 without completion_history).",
           (uint64_t) v->totals.completed);
   scalar (out, "relaybus_lanes_leased", "gauge", "Lanes under a live lease, by any owner.", (uint64_t) v->lanes_leased);
   scalar (out, "relaybus_lanes_held", "gauge", "Lanes under a live lease held by this process.", (uint64_t) v->lanes_held);
}

void
metrics_render (bson_string_t *out, const metrics_view_t *v)
{
   family (out, "relaybus_build_info", "gauge", "Always 1; the version is a label.");
   sample_u64 (out, "relaybus_build_info", "version", PACKAGE_VERSION, 1);
   scalar (out,
           "relaybus_start_time_seconds",
           "gauge",
           "When the process started, in seconds since the Unix epoch.",
           (uint64_t) (v->start_ms / 1000));
   scalar (out, "relaybus_upstream_up", "gauge", "1 while a writable upstream (primary or mongos) is known.", v->upstream == TOPOLOGY_STATE_PRIMARY);
   scalar (out, "relaybus_outbox_ready", "gauge", "1 once the outbox collections, indexes and lanes are set up.", v->outbox_ready);
   scalar (out, "relaybus_admin_requests_total", "counter", "Admin HTTP requests served.", v->admin_requests);
   scalar (out,
           "relaybus_admin_rejected_total",
           "counter",
           "Admin HTTP requests refused (401, 400, 404, 405, 413, 415, 503).",
           v->admin_rejected);
   render_forwarding (out);
   render_publishing (out);
   render_dispatch (out);
   render_store (out, v);
}
