/*
 * test_fleet.c - the fleet's handler set (base/fleet.c): snapshots built from
 * instance documents (liveness, clean stops, the set over the instances
 * within the retention, disagreements), matching, the settings hash,
 * routing, and the deliveries an inject job writes for the fleet's
 * handlers.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <openssl/evp.h>

#include "codec/annotate.h"
#include "base/config.h"
#include "base/fleet.h"
#include "publish/inject.h"

#define NOW 1767225600000LL
#define LIVE_MS 15000
#define KEEP_MS 3600000

static bson_t *
json (const char *text)
{
   bson_error_t error;
   bson_t *b = bson_new_from_json ((const uint8_t *) text, -1, &error);

   if (!b)
      fail_msg ("bad test JSON (%s): %s", error.message, text);
   return b;
}

/* An instance document with heartbeat `age` ms before NOW. */
static bson_t *
instance (const char *id, int64_t age, bool stopped, const char *handlers_json)
{
   char text[2048];

   snprintf (text,
             sizeof text,
             "{\"_id\": \"%s\", \"startedAt\": {\"$date\": {\"$numberLong\": \"%lld\"}}, "
             "\"heartbeatAt\": {\"$date\": {\"$numberLong\": \"%lld\"}}%s, \"handlers\": %s}",
             id,
             (long long) (NOW - 60000),
             (long long) (NOW - age),
             stopped ? ", \"stoppedAt\": {\"$date\": {\"$numberLong\": \"1\"}}" : "",
             handlers_json);
   return json (text);
}

static fleet_set_t *
set_of (bson_t **docs, size_t n)
{
   fleet_set_t *fs = fleet_set_from_docs ((const bson_t *const *) docs, n, NOW, LIVE_MS, KEEP_MS);

   for (size_t i = 0; i < n; i++)
      bson_destroy (docs[i]);
   return fs;
}

static bool
set_has (const fleet_set_t *fs, const char *name)
{
   for (size_t i = 0; i < fs->n_set; i++)
      if (!strcmp (fs->set[i]->name, name))
         return true;
   return false;
}

/* Liveness, and the set: every handler an instance declared within the
 * retention, live, silent or stopped, stays in it; the publishers write its
 * deliveries, so a declarer that stalls or restarts loses none. */
static void
test_snapshot (void **state)
{
   bson_t *docs[] = {
      instance ("a", 1000, false,
                "[{\"name\": \"mail\", \"kind\": \"webhook\", \"events\": [\"order.*\"], \"hash\": \"sha256:1\"},"
                " {\"name\": \"new\", \"kind\": \"webhook\", \"events\": [\"order.placed\"], \"hash\": \"sha256:2\"}]"),
      instance ("b", 2000, false,
                "[{\"name\": \"mail\", \"kind\": \"webhook\", \"events\": [\"order.*\"], \"hash\": \"sha256:9\"},"
                " {\"kind\": \"webhook\", \"events\": [\"x\"]}, 5]"),
      /* Silent for longer than the bound, and stopped cleanly: not live,
       * but within the retention. */
      instance ("c", LIVE_MS + 1, false, "[{\"name\": \"old\", \"kind\": \"pull\", \"events\": [\"old.*\"], \"hash\": \"h\"}]"),
      instance ("d", 10, true, "[{\"name\": \"gone\", \"kind\": \"pull\", \"events\": [\"gone\"], \"hash\": \"h\"}]"),
      /* Silent for longer than the retention: its handler left the set. */
      instance ("e", KEEP_MS + 1, false, "[{\"name\": \"retired\", \"kind\": \"pull\", \"events\": [\"r\"], \"hash\": \"h\"}]"),
      json ("{\"_id\": 7}"), /* another shape: skipped */
   };
   fleet_set_t *fs = set_of (docs, 6);

   assert_int_equal (fs->n_instances, 5);
   assert_true (fs->instances[0].live);
   assert_true (fs->instances[1].live);
   assert_false (fs->instances[2].live);
   assert_false (fs->instances[3].live);
   assert_false (fs->instances[4].live);
   assert_true (fs->instances[2].kept);
   assert_true (fs->instances[3].kept);
   assert_false (fs->instances[4].kept);
   assert_true (fs->instances[3].stopped);
   assert_int_equal (fs->instances[1].n_handlers, 1); /* the nameless entry and the number are skipped */
   assert_int_equal (fs->n_set, 4);
   assert_true (set_has (fs, "mail"));
   assert_true (set_has (fs, "new"));
   assert_true (set_has (fs, "old"));
   assert_true (set_has (fs, "gone"));
   assert_false (set_has (fs, "retired"));
   assert_true (fleet_type_routed (NULL, fs, "old.thing"));
   assert_false (fleet_type_routed (NULL, fs, "r"));
   /* Same name, other hash on two live instances. */
   assert_int_equal (fs->n_disagreeing, 1);
   assert_string_equal (fs->disagreeing[0], "mail");
   assert_true (fleet_declared_elsewhere (fs, "b", "new"));
   assert_false (fleet_declared_elsewhere (fs, "a", "new"));
   assert_true (fleet_declared_elsewhere (fs, NULL, "gone"));
   assert_true (fleet_declared_elsewhere (fs, "a", "old"));
   assert_false (fleet_declared_elsewhere (fs, NULL, "retired"));
   /* The last heartbeat of any declaring instance, live or not. */
   assert_int_equal (fleet_last_declared (fs, "gone"), NOW - 10);
   assert_int_equal (fleet_last_declared (fs, "old"), NOW - LIVE_MS - 1);
   assert_int_equal (fleet_last_declared (fs, "mail"), NOW - 1000);
   assert_int_equal (fleet_last_declared (fs, "never"), 0);
   fleet_release (fs);
}

/* "Now" is the reader's own heartbeat as the server wrote it. */
static void
test_docs_heartbeat (void **state)
{
   bson_t *docs[] = {instance ("a", 1000, false, "[]"), instance ("b", 20, false, "[]"), json ("{\"_id\": \"c\"}")};

   assert_int_equal (fleet_docs_heartbeat ((const bson_t *const *) docs, 3, "b", 5), NOW - 20);
   assert_int_equal (fleet_docs_heartbeat ((const bson_t *const *) docs, 3, "c", 5), 5);
   assert_int_equal (fleet_docs_heartbeat ((const bson_t *const *) docs, 3, "z", 5), 5);
   for (size_t i = 0; i < 3; i++)
      bson_destroy (docs[i]);
}

/* A declarer records the end of its backfill; others read it. */
static void
test_backfill_until (void **state)
{
   bson_t *docs[] = {
      instance ("a", 0, false,
                "[{\"name\": \"n\", \"kind\": \"webhook\", \"events\": [\"x\"], \"hash\": \"h\","
                " \"backfillUntil\": {\"$date\": {\"$numberLong\": \"1767225603000\"}}}]"),
      instance ("b", LIVE_MS + 5, false,
                "[{\"name\": \"n\", \"kind\": \"webhook\", \"events\": [\"x\"], \"hash\": \"h\","
                " \"backfillUntil\": {\"$date\": {\"$numberLong\": \"1767225609000\"}}}]"),
   };
   fleet_set_t *fs = set_of (docs, 2);
   bson_error_t error;
   config_t *cfg = config_parse_string ("[handler n]\nevents = x\nkind = pull\n", "t.ini", &error);
   int64_t until[1] = {NOW + 42};
   bson_t doc = BSON_INITIALIZER;
   bson_iter_t it;

   int64_t since = -1;

   assert_int_equal (fleet_backfill_record (fs, "c", "n", false, &since), NOW + 9000); /* b is not live, but kept */
   assert_int_equal (fleet_backfill_record (fs, "b", "n", true, &since), NOW + 3000); /* its own does not count */
   assert_int_equal (fleet_backfill_record (fs, "c", "other", true, &since), 0);
   assert_int_equal (fleet_backfill_record (fs, "c", "other", false, &since), 0);
   assert_non_null (cfg);
   assert_true (fleet_append_handlers (cfg, NULL, until, &doc, "handlers"));
   assert_true (bson_iter_init (&it, &doc) && bson_iter_find_descendant (&it, "handlers.0.backfillUntil", &it));
   assert_int_equal (bson_iter_date_time (&it), NOW + 42);
   bson_destroy (&doc);
   config_release (cfg);
   fleet_release (fs);
}

/* The backfill records by liveness: a live declarer's is its own to
 * finish; a gone declarer's (not live) is carried on by another, from
 * the window it records (backfillSince).  A document without a version
 * is a proxy before 0.2.0. */
static void
test_backfill_records_and_versions (void **state)
{
   bson_t *docs[] = {
      instance ("live", 0, false,
                "[{\"name\": \"n\", \"kind\": \"webhook\", \"events\": [\"x\"], \"hash\": \"h\","
                " \"backfillSince\": {\"$date\": {\"$numberLong\": \"1767225590000\"}},"
                " \"backfillUntil\": {\"$date\": {\"$numberLong\": \"1767225603000\"}}}]"),
      instance ("gone", LIVE_MS + 5, false,
                "[{\"name\": \"m\", \"kind\": \"webhook\", \"events\": [\"x\"], \"hash\": \"h\","
                " \"backfillSince\": {\"$date\": {\"$numberLong\": \"1767225580000\"}},"
                " \"backfillUntil\": {\"$date\": {\"$numberLong\": \"1767225609000\"}}}]"),
      instance ("stopped", 0, true,
                "[{\"name\": \"k\", \"kind\": \"webhook\", \"events\": [\"x\"], \"hash\": \"h\","
                " \"backfillUntil\": {\"$date\": {\"$numberLong\": \"1767225601000\"}}}]"),
   };
   bson_t *v2[] = {json ("{\"_id\": \"new\", \"version\": \"0.2.0\", \"heartbeatAt\": {\"$date\": {\"$numberLong\": \"1767225600000\"}}, \"handlers\": []}"),
                   json ("{\"_id\": \"old\", \"version\": \"0.1.0\", \"heartbeatAt\": {\"$date\": {\"$numberLong\": \"1767225500000\"}}, \"handlers\": []}")};
   bson_t *v1[] = {json ("{\"_id\": \"old\", \"heartbeatAt\": {\"$date\": {\"$numberLong\": \"1767225600000\"}}, \"handlers\": []}")};
   fleet_set_t *fs = set_of (docs, 3), *f2 = set_of (v2, 2), *f1 = set_of (v1, 1);
   bson_error_t error;
   config_t *cfg = config_parse_string ("[handler n]\nevents = x\nkind = pull\n", "t.ini", &error);
   int64_t since[1] = {NOW - 7}, until[1] = {NOW + 42}, s = -1;
   bson_t doc = BSON_INITIALIZER;
   bson_iter_t it;

   assert_int_equal (fleet_backfill_record (fs, "self", "n", true, &s), NOW + 3000);
   assert_int_equal (s, NOW - 10000);
   assert_int_equal (fleet_backfill_record (fs, "self", "n", false, &s), 0);
   assert_int_equal (fleet_backfill_record (fs, "self", "m", false, &s), NOW + 9000);
   assert_int_equal (s, NOW - 20000);
   assert_int_equal (fleet_backfill_record (fs, "self", "m", true, &s), 0);
   /* A stopped declarer is gone; a record without its start says 0. */
   assert_int_equal (fleet_backfill_record (fs, "self", "k", false, &s), NOW + 1000);
   assert_int_equal (s, 0);
   assert_int_equal (fleet_backfill_record (fs, "gone", "m", false, &s), 0); /* its own does not count */
   /* Versions: a live 0.1.0 (or one without a version) holds the old lanes. */
   assert_false (fleet_old_version_live (f2)); /* the 0.1.0 one is not live */
   assert_true (fleet_old_version_live (f1));
   assert_string_equal (f2->instances[0].version, "0.2.0");
   assert_null (f1->instances[0].version);
   assert_non_null (cfg);
   assert_true (fleet_append_handlers (cfg, since, until, &doc, "handlers"));
   assert_true (bson_iter_init (&it, &doc) && bson_iter_find_descendant (&it, "handlers.0.backfillSince", &it));
   assert_int_equal (bson_iter_date_time (&it), NOW - 7);
   bson_destroy (&doc);
   config_release (cfg);
   fleet_release (fs);
   fleet_release (f2);
   fleet_release (f1);
}

static void
test_same_declarations_agree (void **state)
{
   const char *h = "[{\"name\": \"m\", \"kind\": \"webhook\", \"events\": [\"a\", \"b.*\"], \"hash\": \"sha256:1\"}]";
   bson_t *docs[] = {instance ("a", 0, false, h), instance ("b", 0, false, h),
                     instance ("c", 0, false, "[{\"name\": \"m\", \"kind\": \"pull\", \"events\": [\"a\", \"b.*\"], \"hash\": \"sha256:1\"}]")};
   fleet_set_t *fs = set_of (docs, 2);

   assert_int_equal (fs->n_disagreeing, 0);
   assert_int_equal (fs->n_set, 1);
   fleet_release (fs);
   bson_destroy (docs[2]);
   {
      bson_t *more[] = {instance ("a", 0, false, h),
                        instance ("c", 0, false, "[{\"name\": \"m\", \"kind\": \"pull\", \"events\": [\"a\", \"b.*\"], \"hash\": \"sha256:1\"}]"),
                        instance ("d", 0, false, "[{\"name\": \"m\", \"kind\": \"webhook\", \"events\": [\"a\"], \"hash\": \"sha256:1\"}]")};

      fs = set_of (more, 3);
      assert_int_equal (fs->n_disagreeing, 1); /* listed once, for kind and for patterns */
      fleet_release (fs);
   }
}

static void
test_matching_and_routing (void **state)
{
   bson_error_t error;
   config_t *cfg = config_parse_string ("[handler local]\nevents = user.*\nkind = pull\n", "t.ini", &error);
   bson_t *docs[] = {instance ("a", 0, false, "[{\"name\": \"r\", \"kind\": \"pull\", \"events\": [\"order.placed\", \"pay.*\"], \"hash\": \"h\"}]")};
   fleet_set_t *fs = set_of (docs, 1);

   assert_non_null (cfg);
   assert_true (config_patterns_match ((const char *[]){"order.*"}, 1, "order.placed"));
   assert_true (config_patterns_match ((const char *[]){"*"}, 1, "x"));
   assert_true (config_patterns_match ((const char *[]){"order.placed"}, 1, "order.placed"));
   assert_false (config_patterns_match ((const char *[]){"order.placed"}, 1, "order.placed.v1"));
   assert_false (config_patterns_match ((const char *[]){"order.*"}, 1, "orders"));
   assert_true (fleet_type_routed (cfg, fs, "user.created"));
   assert_true (fleet_type_routed (cfg, fs, "order.placed"));
   assert_true (fleet_type_routed (cfg, fs, "pay.done"));
   assert_false (fleet_type_routed (cfg, fs, "odrer.placed"));
   assert_false (fleet_type_routed (cfg, NULL, "order.placed"));
   fleet_release (fs);
   config_release (cfg);
}

static void
test_hash (void **state)
{
   bson_error_t error;
   const char *base = "[handler w]\nevents = a, b.*\nkind = webhook\nurl = http://127.0.0.1:1/x\n";
   char text[512];
   char h1[FLEET_HASH_LEN + 1], h2[FLEET_HASH_LEN + 1], h3[FLEET_HASH_LEN + 1];
   config_t *a = config_parse_string (base, "a.ini", &error);
   config_t *b, *c;
   bson_t doc = BSON_INITIALIZER;
   bson_iter_t it;

   snprintf (text, sizeof text, "%stimeout_ms = 7000\n", base);
   b = config_parse_string (text, "b.ini", &error);
   c = config_parse_string (base, "c.ini", &error);
   assert_non_null (a);
   assert_non_null (b);
   assert_non_null (c);
   fleet_handler_hash (&a->handlers[0], h1);
   fleet_handler_hash (&b->handlers[0], h2);
   fleet_handler_hash (&c->handlers[0], h3);
   assert_int_equal (strlen (h1), FLEET_HASH_LEN);
   assert_memory_equal (h1, "sha256:", 7);
   assert_string_not_equal (h1, h2);
   assert_string_equal (h1, h3);
   /* The instance document's handlers array. */
   assert_true (fleet_append_handlers (a, NULL, NULL, &doc, "handlers"));
   assert_true (bson_iter_init (&it, &doc) && bson_iter_find_descendant (&it, "handlers.0.name", &it));
   assert_string_equal (bson_iter_utf8 (&it, NULL), "w");
   assert_true (bson_iter_init (&it, &doc) && bson_iter_find_descendant (&it, "handlers.0.events.1", &it));
   assert_string_equal (bson_iter_utf8 (&it, NULL), "b.*");
   assert_true (bson_iter_init (&it, &doc) && bson_iter_find_descendant (&it, "handlers.0.hash", &it));
   assert_string_equal (bson_iter_utf8 (&it, NULL), h1);
   bson_destroy (&doc);
   config_release (a);
   config_release (b);
   config_release (c);
}

/* The settings hash as docs/handlers.md documents it, computed here
 * independently: SHA-256 over "name:length:value" fields, the url as given
 * (the caller passes it with its password masked, or as written), no
 * signing secret. */
static void
expected_hash (const config_handler_t *h, const char *url, char out[FLEET_HASH_LEN + 1])
{
   EVP_MD_CTX *md = EVP_MD_CTX_new ();
   unsigned char d[EVP_MAX_MD_SIZE];
   unsigned int dlen = 0;
   char buf[512];

#define FIELD(n, v)                                                  \
   do {                                                              \
      snprintf (buf, sizeof buf, "%s:%zu:%s", (n), strlen (v), (v)); \
      EVP_DigestUpdate (md, buf, strlen (buf));                      \
   } while (0)
   EVP_DigestInit_ex (md, EVP_sha256 (), NULL);
   FIELD ("kind", h->kind);
   for (size_t i = 0; i < h->n_event_patterns; i++)
      FIELD ("event", h->event_patterns[i]);
   FIELD ("url", url);
   for (size_t i = 0; i < h->n_retry_delays; i++) {
      char num[32];
      snprintf (num, sizeof num, "%lld", (long long) h->retry_delays_ms[i]);
      FIELD ("delay", num);
   }
   {
      char limits[128];
      snprintf (limits,
                sizeof limits,
                "%lld/%lld/%lld/%d",
                (long long) h->max_attempts,
                (long long) h->timeout_ms,
                (long long) h->concurrency,
                h->retry_4xx ? 1 : 0);
      FIELD ("limits", limits);
   }
#undef FIELD
   EVP_DigestFinal_ex (md, d, &dlen);
   EVP_MD_CTX_free (md);
   memcpy (out, "sha256:", 7);
   for (unsigned i = 0; i < 8; i++)
      snprintf (out + 7 + 2 * i, 3, "%02x", d[i]);
}

/* The hash stored in the outbox is no function of a secret, so a reader
 * of the outbox cannot check a guess of one: handlers that differ only in
 * their signing secret or their url's password hash alike, and the hash is
 * the documented construction over the masked url, not over the url as
 * written. */
static void
test_hash_keeps_no_secret (void **state)
{
   static const char *const texts[] = {
      "[handler w]\nevents = a\nkind = webhook\nurl = http://127.0.0.1:1/x\nsecret = whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n",
      "[handler w]\nevents = a\nkind = webhook\nurl = http://127.0.0.1:1/x\nsecret = whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYX\n",
      "[handler w]\nevents = a\nkind = webhook\nurl = http://user:pw-one@127.0.0.1:1/x\n",
      "[handler w]\nevents = a\nkind = webhook\nurl = http://user:pw-two@127.0.0.1:1/x\n",
      "[handler w]\nevents = a\nkind = webhook\nurl = http://other:pw-one@127.0.0.1:1/x\n",
   };
   char got[5][FLEET_HASH_LEN + 1], want[FLEET_HASH_LEN + 1], written[FLEET_HASH_LEN + 1];
   bson_error_t error;

   (void) state;
   for (int i = 0; i < 5; i++) {
      config_t *cfg = config_parse_string (texts[i], "s.ini", &error);
      char *masked;

      assert_non_null (cfg);
      fleet_handler_hash (&cfg->handlers[0], got[i]);
      masked = config_mask ("url", cfg->handlers[0].url);
      assert_null (strstr (masked, "pw-"));
      expected_hash (&cfg->handlers[0], masked, want);
      assert_string_equal (got[i], want);
      if (strstr (cfg->handlers[0].url, "pw-")) {
         expected_hash (&cfg->handlers[0], cfg->handlers[0].url, written);
         assert_string_not_equal (got[i], written);
      }
      bson_free (masked);
      config_release (cfg);
   }
   assert_string_equal (got[0], got[1]); /* the signing secret does not enter */
   assert_string_equal (got[2], got[3]); /* nor the url's password */
   assert_string_not_equal (got[2], got[4]); /* the user name does */
   assert_string_not_equal (got[0], got[2]);
}

/* An inject job with a fleet snapshot writes deliveries for the set's
 * handlers that take the type, once per name, local declarations first. */
static void
test_inject_with_fleet (void **state)
{
   bson_error_t error;
   config_t *cfg = config_parse_string ("[outbox]\ndatabase = rb\n[handler h1]\nevents = order.*\nkind = pull\n", "t.ini", &error);
   bson_t *docs[] = {instance ("a", 0, false,
                               "[{\"name\": \"h1\", \"kind\": \"pull\", \"events\": [\"nothing\"], \"hash\": \"h\"},"
                               " {\"name\": \"remote\", \"kind\": \"webhook\", \"events\": [\"order.placed\"], \"hash\": \"h\"},"
                               " {\"name\": \"other\", \"kind\": \"webhook\", \"events\": [\"user.*\"], \"hash\": \"h\"}]")};
   fleet_set_t *fs = set_of (docs, 1);
   bson_t *body = json ("{\"insert\": \"o\", \"comment\": {\"relaybus\": {\"type\": \"order.placed\"}}, \"$db\": \"s\", "
                        "\"lsid\": {\"id\": {\"$binary\": {\"base64\": \"AAAAAAAAAAAAAAAAAAAAAA==\", \"subType\": \"04\"}}}, "
                        "\"txnNumber\": {\"$numberLong\": \"7\"}, \"autocommit\": false}");
   annotate_t *ann = malloc (sizeof *ann);
   bson_t fwd;
   inject_job_t *job;
   const bson_t *ins;
   bson_iter_t it;

   assert_non_null (cfg);
   assert_int_equal (annotate_parse (body, ann, &fwd, &error), ANNOTATE_FOUND);
   job = inject_job_new (ann, body, false, cfg, NOW, &error);
   assert_non_null (job);
   inject_job_set_fleet (job, fs);
   fleet_release (fs); /* the job holds its own reference */
   assert_int_equal (inject_job_next_round (job), 2);
   ins = inject_job_command (job, 1);
   assert_true (bson_iter_init (&it, ins) && bson_iter_find_descendant (&it, "documents.0.handler", &it));
   assert_string_equal (bson_iter_utf8 (&it, NULL), "h1");
   assert_true (bson_iter_init (&it, ins) && bson_iter_find_descendant (&it, "documents.1.handler", &it));
   assert_string_equal (bson_iter_utf8 (&it, NULL), "remote");
   assert_false (bson_iter_init (&it, ins) && bson_iter_find_descendant (&it, "documents.2", &it));
   assert_true (bson_iter_init (&it, inject_job_command (job, 0)) &&
                bson_iter_find_descendant (&it, "updates.0.u.$addToSet.handlers.$each.1", &it));
   assert_string_equal (bson_iter_utf8 (&it, NULL), "remote");
   inject_job_destroy (job);
   free (ann);
   config_release (cfg);
   bson_destroy (&fwd);
   bson_destroy (body);
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_snapshot),
      cmocka_unit_test (test_docs_heartbeat),
      cmocka_unit_test (test_backfill_until),
      cmocka_unit_test (test_backfill_records_and_versions),
      cmocka_unit_test (test_same_declarations_agree),
      cmocka_unit_test (test_matching_and_routing),
      cmocka_unit_test (test_hash),
      cmocka_unit_test (test_hash_keeps_no_secret),
      cmocka_unit_test (test_inject_with_fleet),
   };

   return cmocka_run_group_tests (tests, NULL, NULL);
}
