/*
 * test_config.c - the key table, INI parsing, validation and reload rules,
 * and the check that the sample file and the docs mention every key.
 */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "autoconf.h"
#include "base/authfile.h"
#include "base/config.h"
#include "codec/compress.h"
#include "dispatch/delivery.h"
#include "dispatch/webhook.h"

#ifndef RELAYBUS_TOP_SRCDIR
#define RELAYBUS_TOP_SRCDIR "."
#endif

static char *read_file (const char *path);

static config_t *
parse_ok (const char *text)
{
   bson_error_t error;
   config_t *cfg = config_parse_string (text, "test.ini", &error);

   if (!cfg)
      fail_msg ("expected the config to parse, got: %s", error.message);
   return cfg;
}

/* Parses `text`, expects failure, and checks the message contains `needle`. */
static void
parse_fails (const char *text, const char *needle)
{
   bson_error_t error;
   config_t *cfg = config_parse_string (text, "test.ini", &error);

   if (cfg) {
      config_release (cfg);
      fail_msg ("expected an error containing '%s' for:\n%s", needle, text);
   }
   if (!strstr (error.message, needle))
      fail_msg ("error '%s' does not contain '%s'", error.message, needle);
}

static void
test_defaults (void **state)
{
   config_t *cfg = config_new_defaults ();

   assert_string_equal (cfg->listen, "127.0.0.1:27018");
   assert_string_equal (cfg->upstream, "mongodb://127.0.0.1:27017/?replicaSet=rs0");
   assert_string_equal (cfg->outbox_database, "relaybus");
   assert_string_equal (cfg->collection_prefix, "relaybus_");
   assert_true (cfg->dispatch_enabled);
   assert_string_equal (cfg->admin_listen, "127.0.0.1:27118");
   assert_string_equal (cfg->admin_token, "");
   assert_int_equal (cfg->max_clients, 10000);
   assert_string_equal (cfg->compressors, "snappy,zlib,zstd");
   assert_int_equal (cfg->n_handlers, 0);
   config_release (cfg);
}

/* [tracing]: its defaults (no export, never sample) and what it refuses. */
static void
test_tracing (void **state)
{
   config_t *cfg = config_new_defaults ();

   (void) state;
   assert_string_equal (cfg->tracing_otlp_endpoint, "");
   assert_string_equal (cfg->tracing_sample, "never");
   assert_string_equal (cfg->tracing_service_name, "");
   config_release (cfg);
   cfg = parse_ok ("[tracing]\notlp_endpoint = http://otel:4318\nsample = 0.25\nresource_attributes = a=1, b=2\n");
   assert_string_equal (cfg->tracing_otlp_endpoint, "http://otel:4318");
   assert_string_equal (cfg->tracing_resource_attributes, "a=1,b=2");
   config_release (cfg);
   parse_fails ("[tracing]\nsample = often\n", "[tracing] sample");
   parse_fails ("[tracing]\nsample = 2\n", "[tracing] sample");
   parse_fails ("[tracing]\notlp_endpoint = otel:4318\n", "[tracing] otlp_endpoint");
   parse_fails ("[tracing]\nresource_attributes = env\n", "[tracing] resource_attributes");
}

/* The example of DESIGN.md section 8, inline comments included. */
static void
test_design_example (void **state)
{
   config_t *cfg = parse_ok (
      "[proxy]\n"
      "listen = 127.0.0.1:27018          ; host:port, or a path for a Unix socket\n"
      "upstream = mongodb://127.0.0.1:27017/?replicaSet=rs0\n"
      "\n"
      "[outbox]\n"
      "database = relaybus\n"
      "collection_prefix = relaybus_\n"
      "\n"
      "[dispatch]\n"
      "enabled = true\n"
      "\n"
      "[admin]\n"
      "listen = 127.0.0.1:27118\n"
      "token =                           ; empty: no authentication (loopback only)\n"
      "\n"
      "[handler send-confirmation]\n"
      "events = order.placed.v1, order.*\n"
      "kind = webhook                    ; webhook | pull\n"
      "url = http://127.0.0.1:8080/hooks/confirmation\n"
      "secret = whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n"
      "max_attempts = 10\n");

   assert_string_equal (cfg->admin_token, "");
   assert_int_equal (cfg->n_handlers, 1);
   assert_string_equal (cfg->handlers[0].name, "send-confirmation");
   assert_int_equal (cfg->handlers[0].kind_id, HANDLER_KIND_WEBHOOK);
   assert_string_equal (cfg->handlers[0].events, "order.placed.v1,order.*");
   assert_int_equal (cfg->handlers[0].n_event_patterns, 2);
   assert_true (config_handler_matches (&cfg->handlers[0], "order.placed.v1"));
   assert_true (config_handler_matches (&cfg->handlers[0], "order.cancelled.v2"));
   assert_false (config_handler_matches (&cfg->handlers[0], "orders.placed"));
   assert_false (config_handler_matches (&cfg->handlers[0], "user.created"));
   assert_int_equal (cfg->handlers[0].max_attempts, 10);
   assert_int_equal (cfg->handlers[0].concurrency, 8);
   config_release (cfg);
}

static void
test_errors_name_line_and_key (void **state)
{
   parse_fails ("[proxy]\nlisten = 127.0.0.1:1\nmax_clientz = 5\n", "test.ini:3: unknown key 'max_clientz' in [proxy]");
   parse_fails ("[proxi]\n", "test.ini:1: unknown section [proxi]");
   parse_fails ("listen = x\n", "key outside of a section");
   parse_fails ("[proxy]\nmax_clients = 0\n", "max_clients: 0 is outside [1, 1000000]");
   parse_fails ("[proxy]\nmax_clients = 12abc\n", "'12abc' is not an integer");
   parse_fails ("[proxy]\nmax_clients = 5\nmax_clients = 6\n", "test.ini:3: key 'max_clients' set twice");
   parse_fails ("[dispatch]\nenabled = maybe\n", "'maybe' is not a boolean");
   parse_fails ("[proxy]\nlisten\n", "test.ini:2: expected 'key = value'");
   parse_fails ("[proxy\n", "malformed section header");
   parse_fails ("[proxy]\nlisten = nowhere\n", "[proxy] listen: expected host:port");
   parse_fails ("[proxy]\nlisten = 127.0.0.1:70000\n", "bad port");
   parse_fails ("[proxy]\nupstream = http://x\n", "[proxy] upstream:");
   parse_fails ("[proxy]\nlog_level = loud\n", "log_level: 'loud'");
   parse_fails ("[proxy]\ncompressors = zlib, lz4\n", "'lz4' is not one of snappy, zlib, zstd");
   parse_fails ("[proxy]\ncompressors = zlib,,zstd\n", "empty item in list");
   parse_fails ("[proxy]\ntls_cert_file = /etc/hostname\n", "tls_cert_file and tls_key_file go together");
   parse_fails ("[proxy]\ntls_cert_file = /nonexistent.pem\ntls_key_file = /nonexistent.pem\n",
                "cannot read '/nonexistent.pem'");
   parse_fails ("[outbox]\ndatabase = bad name\n", "[outbox] database");
   parse_fails ("[proxy]\n[proxy]\nmax_clients = 3\n[proxy]\n", "appears twice");
   /* Values checked once the whole file is read name their line too. */
   parse_fails ("[proxy]\nmax_clients = 5\npool_mode = both\n", "test.ini:3: [proxy] pool_mode: 'both' is not session or pooled");
   parse_fails ("[proxy]\nlog_level = loud\n", "test.ini:2: [proxy] log_level: 'loud'");
   parse_fails ("[proxy]\n\nlog_format = xml\n", "test.ini:3: [proxy] log_format: 'xml'");
   parse_fails ("[proxy]\nlog_file = relative.log\n", "test.ini:2: [proxy] log_file: 'relative.log' is not an absolute path");
   parse_fails ("[outbox]\nshard_collections = maybe\n", "test.ini:2: [outbox] shard_collections: 'maybe'");
   parse_fails ("[outbox]\nunrouted = drop\n", "test.ini:2: [outbox] unrouted: 'drop'");
   parse_fails ("[admin]\n[outbox]\ndatabase = bad name\n", "test.ini:3: [outbox] database: 1-63 characters");
   parse_fails ("[tracing]\nsample = often\n", "test.ini:2: [tracing] sample: 'often'");
   parse_fails ("[tracing]\nsample = never\notlp_endpoint = ftp://x\n", "test.ini:3: [tracing] otlp_endpoint: 'ftp://x'");
   parse_fails ("[tracing]\nresource_attributes = a\n", "test.ini:2: [tracing] resource_attributes: 'a' is not key=value");
   parse_fails ("[proxy]\ntls_cert_file = /etc/hostname\n", "test.ini:2: [proxy] tls_cert_file and tls_key_file go together");
}

static void
test_handlers (void **state)
{
   parse_fails ("[handler a]\nkind = pull\n", "[handler a] needs 'events'");
   parse_fails ("[handler a]\nevents = x\n", "[handler a] needs 'kind'");
   parse_fails ("[handler a]\nevents = x\nkind = smtp\n", "'smtp' is not webhook, pull, nats, rabbitmq or kafka");
   parse_fails ("[handler a]\nevents = x\nkind = pull\nformat = avro\n", "format: 'avro' is not relaybus, cloudevents");
   parse_fails ("[handler a]\nevents = x\nkind = pull\njson = strict\n", "json: 'strict' is not relaxed, canonical or plain");
   parse_fails ("[handler a]\nevents = x\nkind = pull\nsource = a b\n", "source: 'a b' holds white space");
#ifdef RELAYBUS_HAVE_KAFKA
   parse_fails ("[handler a]\nevents = x\nkind = kafka\ntopic = t\n", "[handler a] kind = kafka needs brokers = host:port");
   parse_fails ("[handler a]\nevents = x\nkind = kafka\nbrokers = h:9092\n", "[handler a] kind = kafka needs topic");
   parse_fails ("[handler a]\nevents = x\nkind = kafka\nbrokers = h:9092\ntopic = {id}\n", "only {type}, {type_prefix} and {key}");
   parse_fails ("[handler a]\nevents = x\nkind = kafka\nbrokers = h:9092\ntopic = t\nkafka.acks = 1\nkafka.acks = all\n",
                "test.ini:7: kafka.acks: set twice");
   parse_fails ("[handler a]\nevents = x\nkind = kafka\nbrokers = h:9092\ntopic = t\nkafka.a b = 1\n",
                "kafka.a b: 'a b' is not a librdkafka property name");
   {
      config_t *k = parse_ok ("[handler a]\nevents = x\nkind = kafka\nbrokers = h:9092\ntopic = t.{type}\n"
                              "kafka.linger.ms = 1\nkafka.sasl.password = hunter2\n");
      assert_int_equal (k->handlers[0].kind_id, HANDLER_KIND_KAFKA);
      assert_int_equal (k->handlers[0].n_kafka_props, 2);
      assert_string_equal (k->handlers[0].kafka_props[0], "linger.ms");
      assert_string_equal (k->handlers[0].kafka_props[1], "1");
      assert_string_equal (k->handlers[0].kafka_props[2], "sasl.password");
      config_release (k);
   }
#else
   parse_fails ("[handler a]\nevents = x\nkind = kafka\nbrokers = h:9092\ntopic = t\n", "this build has no Kafka support");
#endif
   parse_fails ("[handler a]\nevents = x\nkind = pull\nkafka.linger.ms = 1\n", "kafka.* properties are for kind = kafka");
   parse_fails ("[handler a]\nevents = x\nkind = webhook\n", "needs url = http://");
   parse_fails ("[handler a]\nevents = x\nkind = webhook\nurl = ftp://h/\n", "needs url = http://");
   parse_fails ("[handler a]\nevents = x\nkind = pull\nsecret = hunter2\n", "Standard Webhooks secret");
   parse_fails ("[handler a]\nevents = a*b\nkind = pull\n", "'*' may only end a pattern");
   parse_fails ("[handler a]\nevents =\nkind = pull\n", "at least one event type");
   parse_fails ("[handler a]\nevents = a,,b\nkind = pull\n", "empty item in list");
   parse_fails ("[handler a]\nevents = a,\nkind = pull\n", "empty item in list");
   parse_fails ("[handler a]\nevents = x\nkind = pull\n[handler a]\n", "[handler a] defined twice");
   parse_fails ("[handler bad/name]\n", "handler name 'bad/name'");
   parse_fails ("[handler a]\nevents = x\nkind = pull\nport = 3\n", "unknown key 'port' in [handler a]");

   config_t *cfg = parse_ok ("[handler a]\nevents = *\nkind = pull\n"
                             "[handler b]\nevents = x.y\nkind = pull\nmax_attempts = 3\n");
   assert_int_equal (cfg->n_handlers, 2);
   assert_int_equal (cfg->handlers[1].kind_id, HANDLER_KIND_PULL);
   assert_true (config_handler_matches (&cfg->handlers[0], "anything"));
   assert_false (config_handler_matches (&cfg->handlers[1], "x.y.z"));
   assert_int_equal (cfg->handlers[1].max_attempts, 3);
   assert_int_equal (cfg->handlers[0].max_attempts, 8); /* 1 + the default schedule */
   config_release (cfg);
}

/* retry_schedule: each item a duration; max_attempts follows from it
 * unless set. */
static void
test_retry_schedule (void **state)
{
   config_t *cfg;
   const config_handler_t *h;

   (void) state;
   parse_fails ("[handler a]\nevents = x\nkind = pull\nretry_schedule = 5s, 5\n",
                "[handler a] retry_schedule: '5' is not a duration");
   parse_fails ("[handler a]\nevents = x\nkind = pull\nretry_schedule = 5s, soon\n",
                "[handler a] retry_schedule: 'soon' is not a duration");
   parse_fails ("[handler a]\nevents = x\nkind = pull\nretry_schedule =\n",
                "[handler a] retry_schedule: at least one delay");
   parse_fails ("[handler a]\nevents = x\nkind = pull\nretry_schedule = 8d\n",
                "[handler a] retry_schedule: '8d' is longer than 7d");

   cfg = parse_ok ("[handler a]\nevents = x\nkind = pull\nretry_schedule = 200ms, 1s, 2m\n"
                   "[handler b]\nevents = x\nkind = pull\nretry_schedule = 1s\nmax_attempts = 5\n"
                   "[handler c]\nevents = x\nkind = pull\nmax_attempts = 10\n");
   h = &cfg->handlers[0];
   assert_int_equal (h->n_retry_delays, 3);
   assert_int_equal (h->retry_delays_ms[0], 200);
   assert_int_equal (h->retry_delays_ms[1], 1000);
   assert_int_equal (h->retry_delays_ms[2], 120000);
   assert_int_equal (h->max_attempts, 4);
   /* Set and longer than the schedule: the last delay repeats. */
   h = &cfg->handlers[1];
   assert_int_equal (h->max_attempts, 5);
   for (int32_t a = 1; a < 5; a++)
      assert_int_equal (delivery_backoff_ms (h->retry_delays_ms, h->n_retry_delays, a, 1000), 1000);
   assert_int_equal (cfg->handlers[2].max_attempts, 10);
   config_release (cfg);
}

/* The most a wait after failed attempt `a` can be, checked against the
 * code: the full jitter reaches it and nothing above it. */
static int64_t
max_wait (const config_handler_t *h, int32_t a)
{
   size_t i = (size_t) a - 1 < h->n_retry_delays ? (size_t) a - 1 : h->n_retry_delays - 1;
   int64_t d = h->retry_delays_ms[i];

   assert_int_equal (delivery_backoff_ms (h->retry_delays_ms, h->n_retry_delays, a, (uint64_t) d), d);
   assert_int_equal (delivery_backoff_ms (h->retry_delays_ms, h->n_retry_delays, a, (uint64_t) d + 1), 0);
   return d;
}

/* The default schedule outlasts a day, and a 30-minute outage. */
static void
test_default_retry_schedule (void **state)
{
   config_t *cfg = parse_ok ("[handler a]\nevents = x\nkind = webhook\nurl = http://h/\n");
   const config_handler_t *h = &cfg->handlers[0];
   static const int64_t svix[] = {5000, 300000, 1800000, 7200000, 18000000, 36000000, 36000000};
   int64_t at = 0, outage = 30 * 60000;
   int32_t first_after_outage = 0;
   double p_short = 1.0;

   (void) state;
   assert_int_equal (h->n_retry_delays, 7);
   assert_memory_equal (h->retry_delays_ms, svix, sizeof svix);
   assert_int_equal (h->max_attempts, 8);
   for (int32_t a = 1; a < h->max_attempts; a++) {
      int64_t d = max_wait (h, a);

      at += d;
      if (!first_after_outage && at >= outage)
         first_after_outage = a + 1;
      p_short *= d > outage ? (double) outage / (double) d : 1.0;
   }
   /* With the longest waits, the last attempt is 27 h 35 min 5 s after
    * the first. */
   assert_int_equal (at, ((27 * 60 + 35) * 60 + 5) * 1000);
   assert_true (at >= 24 * 3600000);
   /* A receiver down for 30 minutes from the first attempt on: attempt 4
    * (35 min 5 s) comes after it with four attempts still to go. */
   assert_int_equal (first_after_outage, 4);
   /* Each wait is drawn in [0, delay]: all seven waits adding up to less
    * than 30 minutes needs each to fall under 30 minutes, which has a
    * probability under 1 in 10,000. */
   assert_true (p_short < 1e-4);
   config_release (cfg);
}

/* docs/handlers.md's table of the default schedule is the code's. */
static void
test_docs_retry_table (void **state)
{
   char *doc = read_file (RELAYBUS_TOP_SRCDIR "/docs/handlers.md");
   static const char header[] = "| Attempt | Longest wait before it | Elapsed at the latest |\n|---|---|---|\n";
   config_t *cfg = parse_ok ("[handler a]\nevents = x\nkind = webhook\nurl = http://h/\n");
   const config_handler_t *h = &cfg->handlers[0];
   const char *p;
   int64_t at = 0;

   (void) state;
   assert_non_null (doc);
   p = strstr (doc, header);
   if (!p)
      fail_msg ("docs/handlers.md has no table starting with:\n%s", header);
   p += strlen (header);
   for (int32_t a = 1; a <= h->max_attempts; a++) {
      char row[128], wait[32], elapsed[64];
      const char *eol = strchr (p, '\n');
      size_t len = eol ? (size_t) (eol - p) : strlen (p);

      if (a == 1) {
         snprintf (wait, sizeof wait, "none");
      } else {
         int64_t d = max_wait (h, a - 1);

         at += d;
         if (d % 3600000 == 0)
            snprintf (wait, sizeof wait, "%" PRId64 " h", d / 3600000);
         else if (d % 60000 == 0)
            snprintf (wait, sizeof wait, "%" PRId64 " min", d / 60000);
         else
            snprintf (wait, sizeof wait, "%" PRId64 " s", d / 1000);
      }
      {
         int64_t s = at / 1000;
         size_t n = 0;

         elapsed[0] = '\0';
         if (s >= 3600)
            n += (size_t) snprintf (elapsed + n, sizeof elapsed - n, "%" PRId64 " h ", s / 3600);
         if (s % 3600 >= 60)
            n += (size_t) snprintf (elapsed + n, sizeof elapsed - n, "%" PRId64 " min ", s % 3600 / 60);
         if (s % 60 || s == 0)
            n += (size_t) snprintf (elapsed + n, sizeof elapsed - n, "%" PRId64 " s ", s % 60);
         elapsed[n - 1] = '\0';
      }
      snprintf (row, sizeof row, "| %d | %s | %s |", (int) a, wait, elapsed);
      if (len != strlen (row) || strncmp (p, row, len) != 0)
         fail_msg ("docs/handlers.md retry table, attempt %d: expected '%s', found '%.*s'", (int) a,
                   row, (int) len, p);
      p += len + (eol ? 1 : 0);
   }
   if (*p == '|')
      fail_msg ("docs/handlers.md retry table has more rows than max_attempts (%d)", (int) h->max_attempts);
   config_release (cfg);
   free (doc);
}

static void
test_reload_rules (void **state)
{
   bson_error_t error;
   config_t *cur = parse_ok ("[proxy]\nmax_clients = 10\n[handler h]\nevents = a\nkind = pull\n");
   config_t *same_keys = parse_ok ("[proxy]\nmax_clients = 20\nlog_level = debug\n"
                                   "[handler h]\nevents = a\nkind = pull\n");
   config_t *new_listen = parse_ok ("[proxy]\nlisten = 127.0.0.1:1\n[handler h]\nevents = a\nkind = pull\n");
   config_t *new_handler = parse_ok ("[handler h]\nevents = a,b\nkind = pull\n");
   config_t *no_handler = parse_ok ("[proxy]\n");

   assert_true (config_reload_allowed (cur, same_keys, &error));
   assert_false (config_reload_allowed (cur, new_listen, &error));
   assert_non_null (strstr (error.message, "[proxy] listen changed"));
   /* Handlers reload: changed, added or removed (the dispatcher applies
    * the new set); a key outside them that needs a restart still refuses. */
   assert_true (config_reload_allowed (cur, new_handler, &error));
   assert_true (config_reload_allowed (cur, no_handler, &error));

   /* Publishing swaps whole snapshots; acquire hands out references. */
   config_publish (config_retain (cur));
   config_t *got = config_acquire ();
   assert_ptr_equal (got, cur);
   config_publish (config_retain (same_keys));
   config_t *got2 = config_acquire ();
   assert_ptr_equal (got2, same_keys);
   assert_int_equal (got->max_clients, 10); /* the old reference stays valid */
   config_release (got);
   config_release (got2);
   config_publish (NULL);

   config_release (cur);
   config_release (same_keys);
   config_release (new_listen);
   config_release (new_handler);
   config_release (no_handler);
}

static void
test_parse_listen (void **state)
{
   char host[256];
   uint16_t port;
   bson_error_t error;

   assert_true (config_parse_listen ("127.0.0.1:27018", host, sizeof host, &port, &error));
   assert_string_equal (host, "127.0.0.1");
   assert_int_equal (port, 27018);
   assert_true (config_parse_listen ("[::1]:9", host, sizeof host, &port, &error));
   assert_string_equal (host, "::1");
   assert_int_equal (port, 9);
   assert_true (config_parse_listen ("/run/relaybus.sock", host, sizeof host, &port, &error));
   assert_string_equal (host, "/run/relaybus.sock");
   assert_int_equal (port, 0);
   assert_false (config_parse_listen ("", host, sizeof host, &port, &error));
   assert_false (config_parse_listen (":5", host, sizeof host, &port, &error));
   assert_false (config_parse_listen ("[::1]9", host, sizeof host, &port, &error));
   assert_false (config_parse_listen ("h:-1", host, sizeof host, &port, &error));
}

/* [outbox] attempt_history: 7d by default, a bare 0 turns it off, whole
 * seconds (the TTL index's); [handler] rate_limit: N/s or N/min, not for
 * pull handlers. */
static void
test_attempt_history_and_rate_limit (void **state)
{
   config_t *def = parse_ok ("[outbox]\n");
   config_t *off = parse_ok ("[outbox]\nattempt_history = 0\n");
   config_t *hour = parse_ok ("[outbox]\nattempt_history = 1h\n");
   config_t *rl = parse_ok ("[handler a]\nevents = *\nkind = webhook\nurl = http://127.0.0.1:1/\nrate_limit = 20/s\n"
                            "[handler b]\nevents = *\nkind = webhook\nurl = http://127.0.0.1:1/\nrate_limit = 600/min\n"
                            "[handler c]\nevents = *\nkind = webhook\nurl = http://127.0.0.1:1/\n");

   (void) state;
   assert_int_equal (def->attempt_history_ms, INT64_C (7) * 86400000);
   assert_int_equal (off->attempt_history_ms, 0);
   assert_int_equal (hour->attempt_history_ms, 3600000);
   assert_int_equal (rl->handlers[0].rate_limit_n, 20);
   assert_int_equal (rl->handlers[0].rate_limit_period_ms, 1000);
   assert_int_equal (rl->handlers[1].rate_limit_n, 600);
   assert_int_equal (rl->handlers[1].rate_limit_period_ms, 60000);
   assert_int_equal (rl->handlers[2].rate_limit_n, 0);
   assert_int_equal (rl->handlers[2].rate_limit_period_ms, 0);
   parse_fails ("[outbox]\nattempt_history = 500ms\n", "test.ini:2: [outbox] attempt_history: at least 1s, or 0");
   parse_fails ("[outbox]\nattempt_history = 00x\n", "attempt_history: '00x' is not a duration");
   parse_fails ("[handler a]\nevents = *\nkind = webhook\nurl = http://127.0.0.1:1/\nrate_limit = 20\n",
                "[handler a] rate_limit: '20' is not N/s or N/min");
   parse_fails ("[handler a]\nevents = *\nkind = webhook\nurl = http://127.0.0.1:1/\nrate_limit = 0/s\n",
                "[handler a] rate_limit: '0/s' is not N/s or N/min");
   parse_fails ("[handler a]\nevents = *\nkind = webhook\nurl = http://127.0.0.1:1/\nrate_limit = 99999999999/s\n",
                "[handler a] rate_limit: '99999999999/s'");
   parse_fails ("[handler a]\nevents = *\nkind = webhook\nurl = http://127.0.0.1:1/\nrate_limit = 5/h\n",
                "[handler a] rate_limit: '5/h'");
   parse_fails ("[handler p]\nevents = *\nkind = pull\nrate_limit = 5/s\n",
                "[handler p] rate_limit: for kind = webhook, kafka, rabbitmq or nats");
   config_release (def);
   config_release (off);
   config_release (hour);
   config_release (rl);
}

/* Durations: a number and a unit; defaults; a plain number, an unknown
 * unit or a value outside the limits is refused naming the key; written
 * back in the largest exact unit; reloadable. */
static void
test_durations (void **state)
{
   bson_error_t error;
   config_t *def = parse_ok ("[outbox]\n");
   config_t *cfg = parse_ok ("[outbox]\nretain_completed = 2s\nretain_dead = 1500ms\npurge_interval = 2h\n");
   char *buf = NULL;
   size_t len = 0;
   FILE *f;

   (void) state;
   assert_int_equal (def->retain_completed_ms, INT64_C (7) * 86400000);
   assert_int_equal (def->retain_dead_ms, INT64_C (30) * 86400000);
   assert_int_equal (def->purge_interval_ms, 600000);
   assert_int_equal (cfg->retain_completed_ms, 2000);
   assert_int_equal (cfg->retain_dead_ms, 1500);
   assert_int_equal (cfg->purge_interval_ms, 7200000);
   assert_true (config_reload_allowed (def, cfg, &error));

   f = open_memstream (&buf, &len);
   config_write (cfg, f);
   fclose (f);
   assert_non_null (strstr (buf, "retain_completed = 2s\n"));
   assert_non_null (strstr (buf, "retain_dead = 1500ms\n"));
   assert_non_null (strstr (buf, "purge_interval = 2h\n"));
   free (buf);
   buf = NULL;
   f = open_memstream (&buf, &len);
   config_write (def, f);
   fclose (f);
   assert_non_null (strstr (buf, "retain_completed = 7d\n"));
   assert_non_null (strstr (buf, "purge_interval = 10m\n"));
   free (buf);

   parse_fails ("[outbox]\nretain_dead = 30\n", "test.ini:2: retain_dead: '30' is not a duration");
   parse_fails ("[outbox]\nretain_dead = 30 d\n", "retain_dead: '30 d' is not a duration");
   parse_fails ("[outbox]\nretain_completed = 7w\n", "retain_completed: '7w' is not a duration");
   parse_fails ("[outbox]\nretain_completed = -1s\n", "retain_completed: '-1s' is not a duration");
   parse_fails ("[outbox]\npurge_interval = s\n", "purge_interval: 's' is not a duration");
   parse_fails ("[outbox]\npurge_interval = 99999999999999999999d\n", "purge_interval: '99999999999999999999d' is not a duration");
   parse_fails ("[outbox]\npurge_interval = 500ms\n", "purge_interval: '500ms' is outside");
   parse_fails ("[outbox]\npurge_interval = 8d\n", "purge_interval: '8d' is outside");
   config_release (def);
   config_release (cfg);
}

static void
test_write_masks_secrets (void **state)
{
   config_t *cfg = parse_ok ("[admin]\ntoken = s3cret-token\n"
                             "[handler h]\nevents = a\nkind = webhook\nurl = http://x/\n"
                             "secret = whsec_c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0\n");
   char *buf = NULL;
   size_t len = 0;
   FILE *f = open_memstream (&buf, &len);

   config_write (cfg, f);
   fclose (f);
   assert_null (strstr (buf, "s3cret-token"));
   assert_null (strstr (buf, "whsec_c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0"));
   assert_non_null (strstr (buf, "[handler h]\n"));
   assert_non_null (strstr (buf, "max_clients = 10000\n"));

   /* What --check-config prints parses back to the same effective values
    * (with the masked secrets removed). */
   free (buf);
   config_release (cfg);
}

/* config_mask: every credential a URI can carry, in every place it can
 * sit, is replaced; what identifies the target stays readable. */
static void
test_mask (void **state)
{
   static const struct {
      const char *key, *in, *out;
   } cases[] = {
      {"upstream", "mongodb://127.0.0.1:27017/?replicaSet=rs0", "mongodb://127.0.0.1:27017/?replicaSet=rs0"},
      {"upstream", "mongodb://app:s3cret@db1,db2/admin?replicaSet=rs0", "mongodb://app:********@db1,db2/admin?replicaSet=rs0"},
      {"upstream", "mongodb+srv://app:p%40ss@cluster.example/", "mongodb+srv://app:********@cluster.example/"},
      /* An unescaped '/' or '@' in the password still masks all of it. */
      {"upstream", "mongodb://app:pa/ss@w@db1/?tls=true", "mongodb://app:********@db1/?tls=true"},
      {"upstream", "mongodb://tok3n@db1/", "mongodb://********@db1/"},
      {"upstream",
       "mongodb://db1/?tls=true&tlsCertificateKeyFile=/etc/k.pem&tlsCertificateKeyFilePassword=kp4ss&replicaSet=rs0",
       "mongodb://db1/?tls=true&tlsCertificateKeyFile=/etc/k.pem&tlsCertificateKeyFilePassword=********&replicaSet=rs0"},
      {"upstream", "mongodb://db1/?TLSCERTIFICATEKEYFILEPASSWORD=kp4ss", "mongodb://db1/?TLSCERTIFICATEKEYFILEPASSWORD=********"},
      {"upstream", "mongodb://db1/?tlsCertificateKeyFile%50assword=kp4ss", "mongodb://db1/?tlsCertificateKeyFile%50assword=********"},
      {"upstream", "mongodb://db1/?sslClientCertificateKeyPassword=kp4ss;w=1", "mongodb://db1/?sslClientCertificateKeyPassword=********;w=1"},
      {"upstream",
       "mongodb://u@db1/?authMechanism=MONGODB-AWS&authMechanismProperties=AWS_SESSION_TOKEN:t0k,SERVICE_NAME:svc",
       "mongodb://********@db1/?authMechanism=MONGODB-AWS&authMechanismProperties=AWS_SESSION_TOKEN:********,SERVICE_NAME:********"},
      {"upstream", "mongodb://db1/?authmechanismproperties=opaque", "mongodb://db1/?authmechanismproperties=********"},
      /* Webhook URLs: user information, every query value, the fragment. */
      {"url", "https://hooks.example/in?token=abc&sig=def&x=", "https://hooks.example/in?token=********&sig=********&x="},
      {"url", "http://hookuser:pw@127.0.0.1:9/x?k=v#frag", "http://hookuser:********@127.0.0.1:9/x?k=********#********"},
      {"url", "http://127.0.0.1:9/@team/x", "http://127.0.0.1:9/@team/x"},
      {"url", "https://hooks.example/in?s3cr3tword", "https://hooks.example/in?********"},
      {"url", "http://127.0.0.1:9/x", "http://127.0.0.1:9/x"},
      /* Whole secrets. */
      {"token", "s3cret-token", "********"},
      {"secret", "whsec_c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0", "********"},
      {"token", "", ""},
      {"listen", "127.0.0.1:27118", "127.0.0.1:27118"},
      /* A key's value is one URL, spaces included; a message may hold
       * several, each ending at white space or a quote. */
      {"upstream", "mongodb://app:pa ss@db1/", "mongodb://app:********@db1/"},
      {NULL, "a http://u:p@h/?a=1 and 'mongodb://h/?authMechanismProperties=X:y' end",
       "a http://u:********@h/?a=******** and 'mongodb://h/?authMechanismProperties=X:********' end"},
      {NULL, "handler h: url \"http://x/?k=v\" is bad", "handler h: url \"http://x/?k=********\" is bad"},
   };

   (void) state;
   assert_null (config_mask ("upstream", NULL));
   for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      char *got = config_mask (cases[i].key, cases[i].in);

      if (strcmp (got, cases[i].out) != 0)
         fail_msg ("case %zu: %s\n got  %s\n want %s", i, cases[i].in, got, cases[i].out);
      bson_free (got);
   }
}

/* config_mask of free text (an error message, a log line): besides every
 * URL's user information, each secret of the snapshot in force that the
 * text quotes verbatim (a library's message may quote a password without
 * its URL), percent-decoded too; secrets too short to search stay. */
static void
test_mask_free_text_secrets (void **state)
{
   static const struct {
      const char *in, *out;
   } cases[] = {
      {"login as relay with pa@ss-w0rd refused", "login as relay with ******** refused"},
      {"the form pa%40ss-w0rd too", "the form ******** too"},
      {"token admin-t0ken-xyz, key MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "token ********, key ********"},
      {"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "********"},
      {"a short one: ab", "a short one: ab"},
      {"http://other:x@h/", "http://other:********@h/"},
      /* Cut to a length within a secret, also within a URL's password
       * (its '@' gone): what is left of the secret goes. */
      {"rabbitmq: login as relay with pa@ss-w", "rabbitmq: login as relay with ********"},
      {"nats: not connected to nats://relay:admin-t0k", "nats: not connected to nats://relay:********"},
      /* A URL without '@' keeps its "host:port", a help text's too. */
      {"url: 'http://x' is not nats://host:port or tls://host:port", "url: 'http://x' is not nats://host:port or tls://host:port"},
      {"nats: not connected to nats://127.0.0.1:4222", "nats: not connected to nats://127.0.0.1:4222"},
      {"at http://[::1]:8080", "at http://[::1]:8080"},
      /* The Basic credential curl sends for a url's user:password (base64 of
       * the decoded "relay:pa@ss-w0rd"), as an endpoint that echoes the
       * request quotes it in lastError; whole, and cut within it. */
      {"HTTP 400: {\"authorization\": \"Basic cmVsYXk6cGFAc3MtdzByZA==\"}", "HTTP 400: {\"authorization\": \"Basic ********\"}"},
      {"HTTP 400: echo Authorization: Basic cmVsYXk6cGFAc3Mt", "HTTP 400: echo Authorization: Basic ********"},
      {"Basic dTphYg==", "Basic ********"},
   };
   config_t *cfg = parse_ok ("[admin]\ntoken = admin-t0ken-xyz\n"
                             "[handler h]\nevents = a\nkind = webhook\nurl = http://relay:pa%40ss-w0rd@x/\n"
                             "secret = whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n"
                             "[handler g]\nevents = a\nkind = webhook\nurl = http://u:ab@x/\n");

   (void) state;
   config_publish (cfg);
   for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      char *got = config_mask (NULL, cases[i].in);

      if (strcmp (got, cases[i].out) != 0)
         fail_msg ("case %zu: %s\n got  %s\n want %s", i, cases[i].in, got, cases[i].out);
      bson_free (got);
   }
   {
      /* A key's value is not free text: only its own rules apply. */
      char *got = config_mask ("listen", "pa@ss-w0rd");
      assert_string_equal (got, "pa@ss-w0rd");
      bson_free (got);
   }
   config_publish (NULL);
}

/* --check-config shows none of the secrets a URI can carry. */
static void
test_write_masks_uri_secrets (void **state)
{
   config_t *cfg = parse_ok ("[proxy]\nupstream = mongodb://app:pw-upstream@127.0.0.1:27017/"
                             "?replicaSet=rs0&tls=true&tlsCertificateKeyFilePassword=pw-keyfile"
                             "&authMechanism=MONGODB-AWS&authMechanismProperties=AWS_SESSION_TOKEN:pw-session\n"
                             "[handler h]\nevents = a\nkind = webhook\nurl = http://u:pw-url@x/?api_key=pw-query\n");
   char *buf = NULL;
   size_t len = 0;
   FILE *f = open_memstream (&buf, &len);

   (void) state;
   config_write (cfg, f);
   fclose (f);
   assert_null (strstr (buf, "pw-"));
   assert_non_null (strstr (buf, "upstream = mongodb://app:********@127.0.0.1:27017/?replicaSet=rs0"));
   assert_non_null (strstr (buf, "url = http://u:********@x/?api_key=********\n"));
   free (buf);
   config_release (cfg);
}

static char *
read_file (const char *path)
{
   FILE *f = fopen (path, "rb");
   char *buf;
   long n;

   if (!f)
      return NULL;
   fseek (f, 0, SEEK_END);
   n = ftell (f);
   fseek (f, 0, SEEK_SET);
   buf = malloc ((size_t) n + 1);
   if (fread (buf, 1, (size_t) n, f) != (size_t) n)
      n = 0;
   buf[n] = '\0';
   fclose (f);
   return buf;
}

/* ${NAME}: the whole value or inside it, at every key; $${ is a literal
 * ${; an unset variable is an error that names it. */
static void
test_secrets_env (void **state)
{
   config_t *cfg;
   char *text;

   (void) state;
   setenv ("RB_TEST_UPSTREAM", "mongodb://app:pw@db1:27017/?replicaSet=rs0&w=majority", 1);
   setenv ("RB_TEST_PW", "p$w{rd}", 1);
   setenv ("RB_TEST_EMPTY", "", 1);
   unsetenv ("RB_TEST_UNSET");

   cfg = parse_ok ("[proxy]\nupstream = ${RB_TEST_UPSTREAM}\n[admin]\ntoken = ${RB_TEST_EMPTY}\n");
   assert_string_equal (cfg->upstream, "mongodb://app:pw@db1:27017/?replicaSet=rs0&w=majority");
   assert_string_equal (cfg->admin_token, "");
   assert_false (cfg->secret_inline); /* a reference is not a credential in the file */
   config_release (cfg);

   /* Inside a value, twice; the replaced text is not expanded again. */
   cfg = parse_ok ("[proxy]\nupstream = mongodb://app:${RB_TEST_PW}@db1/?replicaSet=rs0&appName=${RB_TEST_PW}\n");
   assert_string_equal (cfg->upstream, "mongodb://app:p$w{rd}@db1/?replicaSet=rs0&appName=p$w{rd}");
   config_release (cfg);

   /* $${ is a literal ${; a lone $ is itself. */
   cfg = parse_ok ("[proxy]\nupstream = mongodb://db1/?replicaSet=rs0&appName=a$${B}$c$$\n");
   assert_string_equal (cfg->upstream, "mongodb://db1/?replicaSet=rs0&appName=a${B}$c$$");
   config_release (cfg);

   /* Any key, not only secrets. */
   cfg = parse_ok ("[outbox]\ndatabase = ${RB_TEST_EMPTY}events\n");
   assert_string_equal (cfg->outbox_database, "events");
   config_release (cfg);

   parse_fails ("[proxy]\nupstream = ${RB_TEST_UNSET}\n",
                "test.ini:2: upstream: the environment variable RB_TEST_UNSET is not set");
   parse_fails ("[handler a]\nevents = x\nkind = webhook\nurl = http://h/\nsecret = ${RB_TEST_UNSET}\n",
                "secret: the environment variable RB_TEST_UNSET is not set");
   parse_fails ("[proxy]\nupstream = ${RB_TEST_PW\n", "upstream: '${' without its '}'");
   parse_fails ("[proxy]\nupstream = ${9X}\n", "'${9X}' is not a variable name");
   parse_fails ("[proxy]\nupstream = ${}\n", "is not a variable name");

   /* A written credential is noted for --check-config; a URI without one is not. */
   cfg = parse_ok ("[proxy]\nupstream = mongodb://app:pw@db1/?replicaSet=rs0\n");
   assert_true (cfg->secret_inline);
   config_release (cfg);
   cfg = parse_ok ("[proxy]\nupstream = mongodb://db1/?replicaSet=rs0\n");
   assert_false (cfg->secret_inline);
   config_release (cfg);

   /* A reload reads the environment again: the same text, another value. */
   text = "[proxy]\nupstream = ${RB_TEST_UPSTREAM}\n";
   setenv ("RB_TEST_UPSTREAM", "mongodb://db2/?replicaSet=rs1", 1);
   cfg = parse_ok (text);
   assert_string_equal (cfg->upstream, "mongodb://db2/?replicaSet=rs1");
   config_release (cfg);
   unsetenv ("RB_TEST_UPSTREAM");
   unsetenv ("RB_TEST_PW");
   unsetenv ("RB_TEST_EMPTY");
}

/* Writes `content` to DIR/NAME with `mode`; returns the path (freed by the caller). */
static char *
write_secret (const char *dir, const char *name, const char *content, mode_t mode)
{
   char *path = malloc (strlen (dir) + strlen (name) + 2);
   FILE *f;

   sprintf (path, "%s/%s", dir, name);
   f = fopen (path, "wb");
   assert_non_null (f);
   fputs (content, f);
   fclose (f);
   chmod (path, mode);
   return path;
}

/* NAME_file: the content, one trailing newline removed; both forms, an
 * unreadable file and a file of several lines are errors naming the key or
 * the file; a relative path is the config file's folder's. */
static void
test_secrets_file (void **state)
{
   char dir[] = "/tmp/relaybus-test-secrets.XXXXXX";
   char *up, *wh, *tok, *two, *kafka, *ini, *origin;
   char text[2048];
   bson_error_t error;
   config_t *cfg;

   (void) state;
   assert_non_null (mkdtemp (dir));
   up = write_secret (dir, "uri", "mongodb://app:pw@db1:27017/?replicaSet=rs0&w=majority\n", 0600);
   wh = write_secret (dir, "webhook-secret", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\r\n", 0644);
   tok = write_secret (dir, "token", "t0ken", 0600);
   two = write_secret (dir, "two-lines", "a\nb\n", 0600);
   kafka = write_secret (dir, "kafka-pw", "s3cret\n", 0600);

   snprintf (text, sizeof text,
             "[proxy]\nupstream_file = %s\n[admin]\ntoken_file = %s\n"
             "[handler a]\nevents = x\nkind = webhook\nurl = http://h/\nsecret_file = webhook-secret\n",
             up, tok);
   /* The webhook secret's path is relative: the folder of the config file. */
   origin = malloc (strlen (dir) + 32);
   sprintf (origin, "%s/relaybus-proxy.ini", dir);
   cfg = config_parse_string (text, origin, &error);
   if (!cfg)
      fail_msg ("%s", error.message);
   assert_string_equal (cfg->upstream, "mongodb://app:pw@db1:27017/?replicaSet=rs0&w=majority");
   assert_string_equal (cfg->upstream_file, up);
   assert_string_equal (cfg->admin_token, "t0ken");
   assert_string_equal (cfg->handlers[0].secret, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
   assert_string_equal (cfg->handlers[0].secret_file, "webhook-secret");
   assert_false (cfg->secret_inline);
   /* --check-config: the webhook secret's file (0644) is readable by all; the others are 0600,
    * and nothing is written in the configuration itself. */
   assert_int_equal (config_warn_exposed_secrets (cfg), 1);
   config_release (cfg);

   /* The file form goes through the key's own checks. */
   snprintf (text, sizeof text, "[handler a]\nevents = x\nkind = webhook\nurl = http://h/\nsecret_file = %s\n", tok);
   parse_fails (text, "secret");

   /* Both forms, in either order: the message names both. */
   snprintf (text, sizeof text, "[proxy]\nupstream = mongodb://db1/?replicaSet=rs0\nupstream_file = %s\n", up);
   parse_fails (text, "upstream_file: both upstream and upstream_file are set: keep one");
   snprintf (text, sizeof text, "[admin]\ntoken_file = %s\ntoken = x\n", tok);
   parse_fails (text, "both token and token_file are set: keep one");
   /* An empty file form is unused (the sample lists it so). */
   cfg = parse_ok ("[proxy]\nupstream = mongodb://db1/?replicaSet=rs0\nupstream_file =\n");
   config_release (cfg);

   /* A missing file, a file of two lines: errors naming the key and the file. */
   snprintf (text, sizeof text, "[proxy]\nupstream_file = %s/missing\n", dir);
   parse_fails (text, "upstream_file: ");
   parse_fails (text, "/missing: No such file or directory");
   snprintf (text, sizeof text, "[proxy]\nupstream_file = %s\n", two);
   parse_fails (text, "holds more than one line");

   /* ${} inside a _file path (systemd's $CREDENTIALS_DIRECTORY). */
   setenv ("RB_TEST_CREDENTIALS", dir, 1);
   cfg = parse_ok ("[handler a]\nevents = x\nkind = webhook\nurl = http://h/\n"
                   "secret_file = ${RB_TEST_CREDENTIALS}/webhook-secret\n");
   assert_string_equal (cfg->handlers[0].secret, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
   config_release (cfg);
   unsetenv ("RB_TEST_CREDENTIALS");

#ifdef RELAYBUS_HAVE_KAFKA
   snprintf (text, sizeof text,
             "[handler k]\nevents = x\nkind = kafka\nbrokers = h:9092\ntopic = t\nkafka.sasl.password_file = %s\n", kafka);
   cfg = parse_ok (text);
   assert_int_equal (cfg->handlers[0].n_kafka_props, 1);
   assert_string_equal (cfg->handlers[0].kafka_props[0], "sasl.password");
   assert_string_equal (cfg->handlers[0].kafka_props[1], "s3cret");
   config_release (cfg);
#endif

   /* A credential written in a file every user may read: warned about. */
   ini = write_secret (dir, "inline.ini", "[admin]\ntoken = written-here\n", 0644);
   cfg = config_load (ini, &error);
   if (!cfg)
      fail_msg ("%s", error.message);
   assert_true (cfg->secret_inline);
   assert_int_equal (config_warn_exposed_secrets (cfg), 1);
   config_release (cfg);
   chmod (ini, 0640);
   cfg = config_load (ini, &error);
   assert_non_null (cfg);
   assert_int_equal (config_warn_exposed_secrets (cfg), 0);
   config_release (cfg);

   for (char **p = (char *[]){up, wh, tok, two, kafka, ini, NULL}; *p; p++) {
      unlink (*p);
      free (*p);
   }
   free (origin);
   rmdir (dir);
}

/* The sample file is valid, and it and docs/configuration.md mention every
 * key of the table (PgBouncer checks the same in its build). */
static void
test_sample_and_docs_mention_every_key (void **state)
{
   char *ini = read_file (RELAYBUS_TOP_SRCDIR "/etc/relaybus-proxy.ini");
   char *doc = read_file (RELAYBUS_TOP_SRCDIR "/docs/configuration.md");
   size_t n;
   const config_key_t *keys = config_keys (&n);
   bson_error_t error;
   config_t *cfg;

   assert_non_null (ini);
   assert_non_null (doc);
   for (size_t i = 0; i < n; i++) {
      char needle[128];

      /* In the sample: as a (possibly commented-out) "key =" line. */
      snprintf (needle, sizeof needle, "%s =", keys[i].name);
      if (!strstr (ini, needle))
         fail_msg ("etc/relaybus-proxy.ini does not mention [%s] %s",
                   config_section_name (keys[i].section), keys[i].name);
      /* In the docs: as `key` in the table of its section. */
      snprintf (needle, sizeof needle, "`%s`", keys[i].name);
      if (!strstr (doc, needle))
         fail_msg ("docs/configuration.md does not mention [%s] %s",
                   config_section_name (keys[i].section), keys[i].name);
   }
   cfg = config_load (RELAYBUS_TOP_SRCDIR "/etc/relaybus-proxy.ini", &error);
   if (!cfg)
      fail_msg ("the sample config does not load: %s", error.message);
   config_release (cfg);
   free (ini);
   free (doc);
}

/* pool_mode and what pooled mode needs of the upstream login and the
 * auth file; the credentials read out of the URI. */
static void
test_pool_mode (void **state)
{
   config_t *cfg;
   char path[] = "/tmp/relaybus-test-authXXXXXX";
   char text[512];
   int fd;
   const char *line = "alice:SCRAM-SHA-256:15000:c2FsdHNhbHRzYWx0:"
                      "ZGlnZXN0ZGlnZXN0ZGlnZXN0ZGlnZXN0ZGlnZXN0ZGk=:ZGlnZXN0ZGlnZXN0ZGlnZXN0ZGlnZXN0ZGlnZXN0ZGk=\n";

   cfg = parse_ok ("[proxy]\n");
   assert_int_equal (cfg->pool_mode_id, CONFIG_POOL_SESSION);
   assert_int_equal (cfg->pool_size, 32);
   assert_null (cfg->users);
   config_release (cfg);

   cfg = parse_ok ("[proxy]\npool_mode = pooled\npool_size = 4\n"
                   "upstream = mongodb://u%3Ax:p%40ss@h1,h2/shop?replicaSet=rs0\n");
   assert_int_equal (cfg->pool_mode_id, CONFIG_POOL_POOLED);
   assert_int_equal (cfg->pool_size, 4);
   assert_string_equal (cfg->upstream_auth.user, "u:x");
   assert_string_equal (cfg->upstream_auth.password, "p@ss");
   assert_string_equal (cfg->upstream_auth.source, "shop"); /* the URI's database, as the driver reads it */
   assert_null (cfg->upstream_auth.mechanism);
   config_release (cfg);

   parse_fails ("[proxy]\npool_mode = shared\n", "pool_mode: 'shared' is not session or pooled");
   parse_fails ("[proxy]\npool_size = 0\n", "pool_size: 0 is outside [1, 100000]");
   parse_fails ("[proxy]\nauth_file = /nonexistent\n", "auth_file: is read in pooled mode only");
   parse_fails ("[proxy]\npool_mode = pooled\nupstream = mongodb://u:p@h/?authMechanism=PLAIN&replicaSet=rs0\n",
                "authMechanism=PLAIN is not supported in pooled mode");
   parse_fails ("[proxy]\npool_mode = pooled\nupstream = mongodb://h/?authMechanism=MONGODB-X509&tls=true&replicaSet=rs0\n",
                "MONGODB-X509 needs tlsCertificateKeyFile");
   parse_fails ("[proxy]\npool_mode = pooled\nauth_file = /nonexistent/users.auth\n", "[proxy] auth_file: ");

   /* An auth file is loaded into the snapshot; one others may read is refused. */
   fd = mkstemp (path);
   assert_true (fd >= 0);
   assert_int_equal (write (fd, line, strlen (line)), (ssize_t) strlen (line));
   close (fd);
   bson_snprintf (text, sizeof text, "[proxy]\npool_mode = pooled\nauth_file = %s\n", path);
   cfg = parse_ok (text);
   assert_non_null (cfg->users);
   assert_int_equal (authfile_count (cfg->users), 1);
   config_release (cfg);
   assert_int_equal (chmod (path, 0644), 0);
   parse_fails (text, "auth_file");
   unlink (path);
}

/* An admin port beyond loopback needs a non-empty token: an empty token,
 * an empty token_file and a ${VAR} set to nothing are refused naming the
 * key, where loopback (and a Unix socket) may go without one. */
static void
test_admin_token_beyond_loopback (void **state)
{
   char dir[] = "/tmp/relaybus-test-admintoken.XXXXXX";
   char text[512];
   char *empty, *crlf;
   config_t *cfg;

   (void) state;
   assert_non_null (mkdtemp (dir));
   empty = write_secret (dir, "empty", "", 0600);
   crlf = write_secret (dir, "newline", "\n", 0600);
   setenv ("RB_TEST_EMPTY_TOKEN", "", 1);
   parse_fails ("[admin]\nlisten = 0.0.0.0:27118\ntoken =\n", "[admin] token: empty, and the admin port listens on 0.0.0.0:27118, beyond loopback");
   parse_fails ("[admin]\nlisten = 0.0.0.0:27118\n", "[admin] token: empty");
   parse_fails ("[admin]\nlisten = [::]:27118\n", "[admin] token: empty");
   parse_fails ("[admin]\nlisten = 10.1.2.3:27118\n", "[admin] token: empty");
   parse_fails ("[admin]\nlisten = admin.example:27118\n", "[admin] token: empty");
   parse_fails ("[admin]\nlisten = 0.0.0.0:27118\ntoken = ${RB_TEST_EMPTY_TOKEN}\n", "[admin] token: empty");
   snprintf (text, sizeof text, "[admin]\nlisten = 0.0.0.0:27118\ntoken_file = %s\n", empty);
   parse_fails (text, "[admin] token_file: ");
   parse_fails (text, "is empty, and the admin port listens on 0.0.0.0:27118, beyond loopback");
   snprintf (text, sizeof text, "[admin]\nlisten = 0.0.0.0:27118\ntoken_file = %s\n", crlf);
   parse_fails (text, "[admin] token_file: ");
   /* Loopback, a Unix socket, or no admin port: no token needed. */
   for (const char *const *l = (const char *const[]){"127.0.0.1:27118", "127.8.9.1:27118", "[::1]:27118", "localhost:27118", "", NULL}; *l; l++) {
      snprintf (text, sizeof text, "[admin]\nlisten = %s\ntoken = ${RB_TEST_EMPTY_TOKEN}\n", *l);
      config_release (parse_ok (text));
   }
   /* Beyond loopback with a token. */
   cfg = parse_ok ("[admin]\nlisten = 0.0.0.0:27118\ntoken = t0ken\n");
   assert_string_equal (cfg->admin_token, "t0ken");
   config_release (cfg);
   unlink (empty);
   unlink (crlf);
   rmdir (dir);
   free (empty);
   free (crlf);
}

int
main (void)
{
   /* The checks main.c registers. */
   config_set_checks (&(config_checks_t){compress_offerable, webhook_secrets_valid});
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_defaults),
      cmocka_unit_test (test_tracing),
      cmocka_unit_test (test_design_example),
      cmocka_unit_test (test_errors_name_line_and_key),
      cmocka_unit_test (test_handlers),
      cmocka_unit_test (test_retry_schedule),
      cmocka_unit_test (test_default_retry_schedule),
      cmocka_unit_test (test_docs_retry_table),
      cmocka_unit_test (test_reload_rules),
      cmocka_unit_test (test_durations),
      cmocka_unit_test (test_attempt_history_and_rate_limit),
      cmocka_unit_test (test_parse_listen),
      cmocka_unit_test (test_write_masks_secrets),
      cmocka_unit_test (test_mask),
      cmocka_unit_test (test_mask_free_text_secrets),
      cmocka_unit_test (test_write_masks_uri_secrets),
      cmocka_unit_test (test_secrets_env),
      cmocka_unit_test (test_admin_token_beyond_loopback),
      cmocka_unit_test (test_secrets_file),
      cmocka_unit_test (test_sample_and_docs_mention_every_key),
      cmocka_unit_test (test_pool_mode),
   };

   return cmocka_run_group_tests (tests, NULL, NULL);
}
