/*
 * test_counters.c - src/base/counters.c and its rendering (src/admin/render.c):
 * every command name counts under its own label (the name table is sorted
 * for bsearch), others and NULL as "other"; close reasons out of range
 * count as internal; histogram buckets are cumulative in the text with the
 * sum in seconds; handler series are bounded and looked up by name; event
 * types past the first COUNTERS_MAX_EVENT_TYPES, and "_other" itself,
 * count as "_other", which is rendered only once it is non-zero; label
 * values are escaped; each metric has one HELP and one TYPE line.
 *
 * The registry is process-wide: the tests run in this order and each reads
 * what it added.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "autoconf.h"
#include "admin/render.h"
#include "base/counters.h"

/* The text of one scrape with an empty store view. */
static char *
scrape (void)
{
   bson_string_t *out = bson_string_new (NULL);
   render_view_t v = {0};

   render_metrics (out, &v);
   return bson_string_free (out, false);
}

/* Whether `text` has the line `line` (without its newline). */
static bool
has_line (const char *text, const char *line)
{
   size_t len = strlen (line);

   for (const char *p = text; (p = strstr (p, line)); p += len)
      if ((p == text || p[-1] == '\n') && p[len] == '\n')
         return true;
   return false;
}

static void
test_commands_by_name (void **state)
{
   const char *name;
   size_t slot, n = 0;
   bool omit;

   (void) state;
   for (size_t i = 0; (name = counters_label_value (COUNTERS_LABEL_COMMAND, i, &slot, &omit)); i++) {
      assert_int_equal (slot, i);
      if (strcmp (name, "other") != 0)
         counters_count_command (name);
      n++;
   }
   assert_int_equal (n, COUNTERS_N_COMMANDS + 1);
   /* Found by bsearch, each in its own slot: the table is sorted. */
   for (size_t i = 0; i < COUNTERS_N_COMMANDS; i++)
      assert_int_equal (counters_get_at (COUNTER_COMMANDS, i), 1);
   counters_count_command ("noSuchCommand");
   counters_count_command ("hello");
   counters_count_command (NULL);
   assert_int_equal (counters_get_at (COUNTER_COMMANDS, COUNTERS_N_COMMANDS), 3);
   {
      char *text = scrape ();

      assert_true (has_line (text, "relaybus_commands_total{command=\"ping\"} 1"));
      assert_true (has_line (text, "relaybus_commands_total{command=\"other\"} 3"));
      bson_free (text);
   }
   /* The last name found is remembered: repeats, alternations and a name
    * that only starts like it still land in their own slots. */
   counters_count_command ("ping");
   counters_count_command ("ping");
   counters_count_command ("find");
   counters_count_command ("ping");
   counters_count_command ("pin");
   counters_count_command ("pingpong");
   {
      char *text = scrape ();

      assert_true (has_line (text, "relaybus_commands_total{command=\"ping\"} 4"));
      assert_true (has_line (text, "relaybus_commands_total{command=\"find\"} 2"));
      assert_true (has_line (text, "relaybus_commands_total{command=\"other\"} 5"));
      bson_free (text);
   }
}

static void
test_close_reasons (void **state)
{
   char *text;

   (void) state;
   counters_count_close (COUNTERS_CLOSE_CLIENT_EOF);
   counters_count_close (COUNTERS_CLOSE_REASON_COUNT);
   counters_count_close ((counters_close_reason_t) -1);
   assert_string_equal (counters_close_reason_name (COUNTERS_CLOSE_MAX_CLIENTS), "max_clients");
   assert_string_equal (counters_close_reason_name (COUNTERS_CLOSE_REASON_COUNT), "unknown");
   text = scrape ();
   assert_true (has_line (text, "relaybus_client_connections_closed_total{reason=\"client_eof\"} 1"));
   assert_true (has_line (text, "relaybus_client_connections_closed_total{reason=\"internal\"} 2"));
   assert_true (has_line (text, "relaybus_client_connections_closed_total{reason=\"shutdown\"} 0"));
   bson_free (text);
}

static void
test_histogram (void **state)
{
   counters_histogram_t h;
   char *text;

   (void) state;
   counters_observe (COUNTER_CLAIM_LATENCY, 0, -5);  /* as 0: first bucket */
   counters_observe (COUNTER_CLAIM_LATENCY, 0, 1);   /* le 0.001 */
   counters_observe (COUNTER_CLAIM_LATENCY, 0, 7);   /* le 0.01 */
   counters_observe (COUNTER_CLAIM_LATENCY, 0, 90000); /* +Inf */
   counters_histogram (COUNTER_CLAIM_LATENCY, 0, &h);
   assert_int_equal (h.count, 4);
   assert_int_equal (h.sum_ms, 90008);
   text = scrape ();
   assert_true (has_line (text, "# TYPE relaybus_claim_latency_seconds histogram"));
   assert_true (has_line (text, "relaybus_claim_latency_seconds_bucket{le=\"0.001\"} 2"));
   assert_true (has_line (text, "relaybus_claim_latency_seconds_bucket{le=\"0.005\"} 2"));
   assert_true (has_line (text, "relaybus_claim_latency_seconds_bucket{le=\"0.01\"} 3"));
   assert_true (has_line (text, "relaybus_claim_latency_seconds_bucket{le=\"60\"} 3"));
   assert_true (has_line (text, "relaybus_claim_latency_seconds_bucket{le=\"+Inf\"} 4"));
   assert_true (has_line (text, "relaybus_claim_latency_seconds_sum 90.008"));
   assert_true (has_line (text, "relaybus_claim_latency_seconds_count 4"));
   bson_free (text);
}

static void
test_handlers (void **state)
{
   char name[160], *text;
   size_t hook;

   (void) state;
   assert_int_equal (counters_handler_slot ("hook", false), SIZE_MAX);
   hook = counters_handler_slot ("hook", true);
   assert_int_equal (hook, 0);
   assert_int_equal (counters_handler_slot ("hook", true), hook);
   counters_delivery ("hook", COUNTER_DELIVERIES_COMPLETED, 20);
   counters_delivery ("hook", COUNTER_DELIVERIES_DEAD, 0);
   counters_delivery ("a \"q\"\\x", COUNTER_DELIVERIES_RETRIED, 3000);
   assert_int_equal (counters_get_at (COUNTER_DELIVERIES_COMPLETED, hook), 1);
   assert_int_equal (counters_get_at (COUNTER_DELIVERIES_DEAD, hook), 1);
   text = scrape ();
   assert_true (has_line (text, "relaybus_deliveries_completed_total{handler=\"hook\"} 1"));
   assert_true (has_line (text, "relaybus_deliveries_retried_total{handler=\"hook\"} 0"));
   assert_true (has_line (text, "relaybus_deliveries_retried_total{handler=\"a \\\"q\\\"\\\\x\"} 1"));
   assert_true (has_line (text, "relaybus_handler_latency_seconds_bucket{handler=\"hook\",le=\"0.025\"} 2"));
   assert_true (has_line (text, "relaybus_handler_latency_seconds_sum{handler=\"hook\"} 0.020"));
   assert_true (has_line (text, "relaybus_handler_latency_seconds_count{handler=\"hook\"} 2"));
   bson_free (text);
   /* Too long for a series, then the table full. */
   memset (name, 'n', sizeof name - 1);
   name[sizeof name - 1] = '\0';
   assert_int_equal (counters_handler_slot (name, true), SIZE_MAX);
   for (size_t i = 2; i < COUNTERS_MAX_HANDLERS; i++) {
      snprintf (name, sizeof name, "h%zu", i);
      assert_int_equal (counters_handler_slot (name, true), i);
   }
   assert_int_equal (counters_handler_slot ("one-too-many", true), SIZE_MAX);
   counters_delivery ("one-too-many", COUNTER_DELIVERIES_COMPLETED, 1);
   assert_int_equal (counters_handler_slot ("hook", false), hook);
}

static void
test_unrouted (void **state)
{
   char type[32], *text;

   (void) state;
   counters_unrouted ("first.v1");
   counters_unrouted ("first.v1");
   text = scrape ();
   assert_true (has_line (text, "relaybus_events_unrouted_total{type=\"first.v1\"} 2"));
   assert_null (strstr (text, "type=\"_other\""));
   bson_free (text);
   counters_unrouted (COUNTERS_EVENT_TYPE_OTHER);
   for (int i = 1; i < COUNTERS_MAX_EVENT_TYPES; i++) {
      snprintf (type, sizeof type, "t%d", i);
      counters_unrouted (type);
   }
   counters_unrouted ("late.v1");
   counters_unrouted ("t1");
   text = scrape ();
   assert_true (has_line (text, "relaybus_events_unrouted_total{type=\"t1\"} 2"));
   assert_true (has_line (text, "relaybus_events_unrouted_total{type=\"t99\"} 1"));
   assert_true (has_line (text, "relaybus_events_unrouted_total{type=\"_other\"} 2"));
   assert_null (strstr (text, "late.v1"));
   bson_free (text);
}

/* The proxy's added latency: each loop observes into its own sample, and
 * /metrics shows them merged as one histogram in seconds, without a loop
 * label. */
static void
test_loop_histogram (void **state)
{
   char *text;

   (void) state;
   counters_observe_loop_us (COUNTER_ADDED_LATENCY, 0, 20);      /* <= 25 µs */
   counters_observe_loop_us (COUNTER_ADDED_LATENCY, 3, 80);      /* <= 100 µs */
   counters_observe_loop_us (COUNTER_ADDED_LATENCY, 63, 700);    /* <= 1 ms */
   counters_observe_loop_us (COUNTER_ADDED_LATENCY, 3, 2000000); /* +Inf */
   counters_observe_loop_us (COUNTER_ADDED_LATENCY, 0, -5);      /* clock skew: 0 */
   text = scrape ();
   assert_true (has_line (text, "# TYPE relaybus_proxy_added_latency_seconds histogram"));
   assert_true (has_line (text, "relaybus_proxy_added_latency_seconds_bucket{le=\"2.5e-05\"} 2"));
   assert_true (has_line (text, "relaybus_proxy_added_latency_seconds_bucket{le=\"5e-05\"} 2"));
   assert_true (has_line (text, "relaybus_proxy_added_latency_seconds_bucket{le=\"0.0001\"} 3"));
   assert_true (has_line (text, "relaybus_proxy_added_latency_seconds_bucket{le=\"0.001\"} 4"));
   assert_true (has_line (text, "relaybus_proxy_added_latency_seconds_bucket{le=\"1\"} 4"));
   assert_true (has_line (text, "relaybus_proxy_added_latency_seconds_bucket{le=\"+Inf\"} 5"));
   assert_true (has_line (text, "relaybus_proxy_added_latency_seconds_sum 2.000800"));
   assert_true (has_line (text, "relaybus_proxy_added_latency_seconds_count 5"));
   assert_null (strstr (text, "relaybus_proxy_added_latency_seconds_bucket{loop"));
   bson_free (text);
}

/* How often `needle` occurs in `text`. */
static size_t
occurrences (const char *text, const char *needle)
{
   size_t n = 0;

   for (const char *p = text; (p = strstr (p, needle)); p += strlen (needle))
      n++;
   return n;
}

/* Each metric has one HELP and one TYPE line, of its type; counters end in
 * _total; the store's families follow (only relaybus_store_up when the
 * store did not answer). */
static void
test_families (void **state)
{
   static const char *const types[] = {"counter", "gauge", "histogram", "histogram"};
   size_t n;
   const counters_def_t *defs = counters_defs (&n);
   char *text = scrape ();
   char line[512];

   (void) state;
   assert_true (has_line (text, "relaybus_build_info{version=\"" PACKAGE_VERSION "\"} 1"));
   for (size_t i = 0; i < n; i++) {
      size_t len = strlen (defs[i].name);

      snprintf (line, sizeof line, "# TYPE %s %s\n", defs[i].name, types[defs[i].type]);
      assert_int_equal (occurrences (text, line), 1);
      snprintf (line, sizeof line, "# HELP %s %s\n", defs[i].name, defs[i].help);
      assert_int_equal (occurrences (text, line), 1);
      if (defs[i].type == COUNTERS_TYPE_COUNTER)
         assert_string_equal (defs[i].name + len - 6, "_total");
   }
   assert_true (has_line (text, "relaybus_store_up 0"));
   assert_null (strstr (text, "relaybus_outbox_backlog"));
   bson_free (text);
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_commands_by_name),
      cmocka_unit_test (test_close_reasons),
      cmocka_unit_test (test_histogram),
      cmocka_unit_test (test_loop_histogram),
      cmocka_unit_test (test_handlers),
      cmocka_unit_test (test_unrouted),
      cmocka_unit_test (test_families),
   };

   return cmocka_run_group_tests (tests, NULL, NULL);
}
