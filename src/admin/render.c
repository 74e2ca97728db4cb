/*
 * admin/render.c - the Prometheus text rendering (see admin/render.h): one
 * loop over the counter registry of base/counters.h, then what this scrape
 * read from the store.
 *
 * Names follow Prometheus conventions: relaybus_ prefix (process_ for the
 * standard process families), base units in the
 * name (_seconds, _bytes), _total on counters only.  Label values are
 * escaped; their sets are bounded by the registry (fixed lists, handlers
 * from the configuration, the first event types seen).  Histograms are kept
 * in milliseconds and rendered in seconds.
 */
#include "admin/render.h"

#include <inttypes.h>
#include <string.h>

#include "base/assert.h"
#include "base/counters.h"

static const char *const type_names[] = {
   [COUNTERS_TYPE_COUNTER] = "counter",
   [COUNTERS_TYPE_GAUGE] = "gauge",
   [COUNTERS_TYPE_HISTOGRAM] = "histogram",
   [COUNTERS_TYPE_LOOP_HISTOGRAM] = "histogram",
};

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

/* One histogram sample: cumulative buckets, sum and count, each with the
 * sample's label (if any) before le. */
static void
render_histogram2 (bson_string_t *out,
                   const char *name,
                   const char *label,
                   const char *value,
                   const char *label2,
                   const char *value2,
                   const counters_histogram_t *h)
{
   uint64_t cum = 0;
   char lv[700] = ""; /* label="value", (a name of at most 127 bytes, escaped), and the second pair */

   if (label) {
      bson_string_t *tmp = bson_string_new (NULL);
      bson_string_append_printf (tmp, "%s=\"", label);
      append_label_value (tmp, value);
      bson_string_append (tmp, "\",");
      if (label2) {
         bson_string_append_printf (tmp, "%s=\"", label2);
         append_label_value (tmp, value2);
         bson_string_append (tmp, "\",");
      }
      bson_snprintf (lv, sizeof lv, "%s", tmp->str);
      bson_string_free (tmp, true);
   }
   for (size_t b = 0; b <= COUNTERS_N_BUCKETS; b++) {
      cum += h->buckets[b];
      if (b < COUNTERS_N_BUCKETS)
         bson_string_append_printf (
            out, "%s_bucket{%sle=\"%g\"} %" PRIu64 "\n", name, lv, (double) counters_bucket_ms[b] / 1000.0, cum);
      else
         bson_string_append_printf (out, "%s_bucket{%sle=\"+Inf\"} %" PRIu64 "\n", name, lv, cum);
   }
   if (label) {
      lv[strlen (lv) - 1] = '\0'; /* no trailing comma */
      bson_string_append_printf (out, "%s_sum{%s} %.3f\n", name, lv, (double) h->sum_ms / 1000.0);
      bson_string_append_printf (out, "%s_count{%s} %" PRIu64 "\n", name, lv, cum);
   } else {
      bson_string_append_printf (out, "%s_sum %.3f\n", name, (double) h->sum_ms / 1000.0);
      bson_string_append_printf (out, "%s_count %" PRIu64 "\n", name, cum);
   }
}

static void
render_histogram (bson_string_t *out, const char *name, const char *label, const char *value, const counters_histogram_t *h)
{
   render_histogram2 (out, name, label, value, NULL, NULL, h);
}

/* A LOOP_HISTOGRAM: every loop's sample merged, without a label. */
static void
render_loop_histogram (bson_string_t *out, const char *name, counter_id_t id)
{
   counters_loop_histogram_t h;
   uint64_t cum = 0;

   counters_loop_histogram (id, &h);
   for (size_t b = 0; b < COUNTERS_N_BUCKETS_US; b++) {
      cum += h.buckets[b];
      bson_string_append_printf (out, "%s_bucket{le=\"%g\"} %" PRIu64 "\n", name, (double) counters_bucket_us[b] / 1e6, cum);
   }
   cum += h.buckets[COUNTERS_N_BUCKETS_US];
   bson_string_append_printf (out, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name, cum);
   bson_string_append_printf (out, "%s_sum %.6f\n", name, (double) h.sum_us / 1e6);
   bson_string_append_printf (out, "%s_count %" PRIu64 "\n", name, cum);
}

/* One metric of the registry: its family line and a sample per label
 * value to render now. */
static void
render_def (bson_string_t *out, const counters_def_t *d)
{
   const char *key = counters_label_key (d->label);
   const char *value;
   size_t slot;
   bool omit_if_zero;

   RELAYBUS_ASSERT ((unsigned) d->type < sizeof type_names / sizeof type_names[0]);
   family (out, d->name, type_names[d->type], d->help);
   if (d->type == COUNTERS_TYPE_LOOP_HISTOGRAM) {
      render_loop_histogram (out, d->name, d->id);
      return;
   }
   if (d->label == COUNTERS_LABEL_NONE) {
      if (d->type == COUNTERS_TYPE_HISTOGRAM) {
         counters_histogram_t h;

         counters_histogram (d->id, 0, &h);
         render_histogram (out, d->name, NULL, NULL, &h);
      } else {
         sample_u64 (out, d->name, NULL, NULL, counters_get (d->id));
      }
      return;
   }
   for (size_t i = 0; (value = counters_label_value (d->label, i, &slot, &omit_if_zero)); i++) {
      if (d->type == COUNTERS_TYPE_HISTOGRAM) {
         counters_histogram_t h;

         counters_histogram (d->id, slot, &h);
         if (!omit_if_zero || h.count > 0)
            render_histogram2 (out, d->name, key, value, counters_label_key2 (d->label), counters_label_value2 (d->label, i), &h);
      } else {
         uint64_t v = counters_get_at (d->id, slot);

         if (!omit_if_zero || v > 0)
            sample_u64 (out, d->name, key, value, v);
      }
   }
}

/* A per-handler gauge of the store view. */
typedef enum { VIEW_PENDING, VIEW_PARKED, VIEW_DEAD } view_field_t;

static void
render_view_handlers (bson_string_t *out, const render_view_t *v, const char *name, const char *help, view_field_t f)
{
   family (out, name, "gauge", help);
   for (size_t i = 0; i < v->n_handlers; i++) {
      const store_handler_stats_t *h = &v->handlers[i];
      int64_t n = f == VIEW_PENDING ? h->pending : f == VIEW_PARKED ? h->parked : h->dead;

      sample_u64 (out, name, "handler", h->name, (uint64_t) n);
   }
}

static void
render_store (bson_string_t *out, const render_view_t *v)
{
   scalar (out, "relaybus_store_up", "gauge", "1 when this scrape's outbox queries succeeded.", v->store_ok ? 1 : 0);
   if (!v->store_ok)
      return;
   render_view_handlers (out, v, "relaybus_outbox_backlog", "Pending deliveries (ready and parked), by handler.", VIEW_PENDING);
   render_view_handlers (
      out, v, "relaybus_outbox_parked", "Pending deliveries parked behind an unfinished predecessor, by handler.", VIEW_PARKED);
   render_view_handlers (
      out, v, "relaybus_outbox_dead_letters", "Dead deliveries stored (until requeued or purged), by handler.", VIEW_DEAD);
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

/* The standard process_* families, named and described as Prometheus'
 * client libraries name them: dashboards and alerts written for them
 * apply unchanged. */
static void
render_process (bson_string_t *out, const process_stats_t *p)
{
   family (out, "process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.");
   sample_f (out, "process_cpu_seconds_total", NULL, NULL, p->cpu_seconds);
   if (p->has_memory) {
      scalar (out, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", p->resident_bytes);
      scalar (out, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", p->virtual_bytes);
   }
   if (p->has_fds) {
      scalar (out, "process_open_fds", "gauge", "Number of open file descriptors.", p->open_fds);
      scalar (out, "process_max_fds", "gauge", "Maximum number of open file descriptors.", p->max_fds);
   }
   if (p->has_start) {
      family (out, "process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.");
      sample_f (out, "process_start_time_seconds", NULL, NULL, p->start_time_seconds);
   }
}

void
render_metrics (bson_string_t *out, const render_view_t *v)
{
   size_t n;
   const counters_def_t *defs = counters_defs (&n);

   for (size_t i = 0; i < n; i++)
      render_def (out, &defs[i]);
   render_store (out, v);
   render_process (out, &v->process);
}
