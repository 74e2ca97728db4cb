/*
 * test_inject.c - the injected outbox writes: rounds for each combination
 * of keys and given ids, the exact commands (transaction fields, documents
 * as docs/outbox-schema.md lays them out), per-key sequences, dedup of
 * stored events, and every kind of failing reply.
 *
 * Replies are written as Extended JSON, as the server would send them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "codec/annotate.h"
#include "base/config.h"
#include "publish/inject.h"
#include "base/outbox.h"

#define NOW_MS 1767225600000LL

static const char *const ini =
   "[outbox]\n"
   "database = rb\n"
   "collection_prefix = p_\n"
   "[handler h1]\nevents = order.*\nkind = pull\n"
   "[handler h2]\nevents = user.*\nkind = pull\n"
   "[handler h3]\nevents = order.placed.v1\nkind = pull\n";

#define TXN "\"lsid\": {\"id\": {\"$binary\": {\"base64\": \"AAAAAAAAAAAAAAAAAAAAAA==\", \"subType\": \"04\"}}}, " \
            "\"txnNumber\": {\"$numberLong\": \"7\"}, \"autocommit\": false"

static bson_t *
json (const char *text)
{
   bson_error_t error;
   bson_t *b = bson_new_from_json ((const uint8_t *) text, -1, &error);

   if (!b)
      fail_msg ("bad test JSON (%s): %s", error.message, text);
   return b;
}

static config_t *
test_config (void)
{
   bson_error_t error;
   config_t *cfg = config_parse_string (ini, "test.ini", &error);

   if (!cfg)
      fail_msg ("config: %s", error.message);
   return cfg;
}

/* A job for the annotated statement `body_text`. */
static inject_job_t *
job_for (const char *body_text, bool opens_txn)
{
   bson_t *body = json (body_text);
   annotate_t *a = malloc (sizeof *a);
   bson_t fwd;
   bson_error_t error;
   config_t *cfg = test_config ();
   inject_job_t *job;

   if (annotate_parse (body, a, &fwd, &error) != ANNOTATE_FOUND)
      fail_msg ("annotation: %s", error.message);
   job = inject_job_new (a, body, opens_txn, cfg, NOW_MS, &error);
   if (!job)
      fail_msg ("job: %s", error.message);
   assert_null (a->storage); /* moved into the job */
   free (a);
   config_release (cfg); /* the job holds its own reference */
   bson_destroy (&fwd);
   bson_destroy (body);
   return job;
}

static void
reply (inject_job_t *job, uint32_t i, const char *text)
{
   bson_t *r = json (text);

   inject_job_reply (job, i, r);
   bson_destroy (r);
}

/* Looks up a dotted path in a command. */
static bool
get (const bson_t *doc, const char *path, bson_iter_t *out)
{
   bson_iter_t it;

   return bson_iter_init (&it, doc) && bson_iter_find_descendant (&it, path, out);
}

static const char *
get_str (const bson_t *doc, const char *path)
{
   bson_iter_t it;

   if (!get (doc, path, &it) || !BSON_ITER_HOLDS_UTF8 (&it)) {
      char *j = bson_as_relaxed_extended_json (doc, NULL);
      fail_msg ("no string at %s in %s", path, j);
   }
   return bson_iter_utf8 (&it, NULL);
}

static int64_t
get_int (const bson_t *doc, const char *path)
{
   bson_iter_t it;

   if (!get (doc, path, &it) || !BSON_ITER_HOLDS_NUMBER (&it)) {
      char *j = bson_as_relaxed_extended_json (doc, NULL);
      fail_msg ("no number at %s in %s", path, j);
   }
   return bson_iter_as_int64 (&it);
}

static bool
has (const bson_t *doc, const char *path)
{
   bson_iter_t it;

   return get (doc, path, &it);
}

static uint32_t
count (const bson_t *doc, const char *path)
{
   bson_iter_t it, sub;
   uint32_t n = 0;

   if (!get (doc, path, &it) || !bson_iter_recurse (&it, &sub))
      fail_msg ("no array at %s", path);
   while (bson_iter_next (&sub))
      n++;
   return n;
}

/* Every injected command: $db, the transaction fields, and nothing that
 * only the first statement of a transaction may carry. */
static void
check_txn_fields (const bson_t *c)
{
   bson_iter_t it;

   assert_string_equal (get_str (c, "$db"), "rb");
   assert_true (get (c, "lsid.id", &it));
   assert_true (get (c, "txnNumber", &it));
   assert_int_equal (bson_iter_type (&it), BSON_TYPE_INT64);
   assert_int_equal (bson_iter_int64 (&it), 7);
   assert_true (get (c, "autocommit", &it));
   assert_false (bson_iter_bool (&it));
   assert_false (has (c, "startTransaction"));
   assert_false (has (c, "readConcern"));
   assert_false (has (c, "writeConcern"));
}

static void
test_txn_of (void **state)
{
   static const struct {
      const char *body;
      inject_txn_t want;
   } cases[] = {
      {"{\"insert\": \"o\", " TXN "}", INJECT_TXN_YES},
      {"{\"insert\": \"o\", " TXN ", \"startTransaction\": true}", INJECT_TXN_STARTS},
      {"{\"insert\": \"o\"}", INJECT_TXN_NO},
      /* A retryable write: lsid and txnNumber without autocommit. */
      {"{\"insert\": \"o\", \"lsid\": {\"id\": 1}, \"txnNumber\": {\"$numberLong\": \"1\"}}", INJECT_TXN_NO},
      {"{\"insert\": \"o\", \"lsid\": {\"id\": 1}, \"txnNumber\": {\"$numberLong\": \"1\"}, \"autocommit\": true}",
       INJECT_TXN_NO},
      {"{\"insert\": \"o\", \"lsid\": {\"id\": 1}, \"autocommit\": false}", INJECT_TXN_NO},
      {"{\"insert\": \"o\", \"lsid\": 5, \"txnNumber\": 1, \"autocommit\": false}", INJECT_TXN_NO},
      {"{\"insert\": \"o\", \"lsid\": {\"id\": 1}, \"txnNumber\": 1, \"autocommit\": false}", INJECT_TXN_YES},
   };

   for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      bson_t *b = json (cases[i].body);

      if (inject_txn_of (b) != cases[i].want)
         fail_msg ("case %zu: %s", i, cases[i].body);
      bson_destroy (b);
   }

   /* No job outside a transaction. */
   {
      bson_t *body = json ("{\"insert\": \"o\", \"comment\": {\"relaybus\": {\"type\": \"t\"}}}");
      annotate_t *a = malloc (sizeof *a);
      bson_t fwd;
      bson_error_t error;
      config_t *cfg = test_config ();

      assert_int_equal (annotate_parse (body, a, &fwd, &error), ANNOTATE_FOUND);
      assert_null (inject_job_new (a, body, false, cfg, NOW_MS, &error));
      annotate_cleanup (a);
      free (a);
      config_release (cfg);
      bson_destroy (&fwd);
      bson_destroy (body);
   }
}

static void
test_reply_failed (void **state)
{
   static const struct {
      const char *reply;
      bool failed;
   } cases[] = {
      {"{\"ok\": 1}", false},
      {"{\"ok\": 1.0, \"n\": 1}", false},
      {"{\"ok\": true}", false},
      {"{\"ok\": 0, \"code\": 112}", true},
      {"{\"n\": 1}", true},
      {"{\"ok\": 1, \"writeErrors\": []}", false},
      {"{\"ok\": 1, \"writeErrors\": [{\"index\": 0, \"code\": 11000}]}", true},
   };

   for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      bson_t *b = json (cases[i].reply);

      if (inject_reply_failed (b) != cases[i].failed)
         fail_msg ("case %zu: %s", i, cases[i].reply);
      bson_destroy (b);
   }
}

/* Generated ids, no key: one round, one update and one insert. */
static void
test_unkeyed_one_round (void **state)
{
   inject_job_t *job = job_for (
      "{\"insert\": \"orders\", \"comment\": {\"relaybus\": {\"type\": \"order.placed.v1\", \"payload\": {\"o\": 1}, "
      "\"headers\": {\"h\": \"v\"}, \"correlationId\": \"c\"}}, \"$db\": \"shop\", " TXN ", \"apiVersion\": \"1\"}",
      false);
   const bson_t *upd, *ins;
   const char *id;

   assert_int_equal (inject_job_next_round (job), 2);
   assert_int_equal (inject_job_phase (job), INJECT_PHASE_WRITE);
   upd = inject_job_command (job, 0);
   ins = inject_job_command (job, 1);
   assert_null (inject_job_command (job, 2));
   check_txn_fields (upd);
   check_txn_fields (ins);
   assert_string_equal (get_str (upd, "apiVersion"), "1");
   assert_string_equal (get_str (upd, "update"), "p_events");
   assert_int_equal (count (upd, "updates"), 1);
   id = get_str (upd, "updates.0.q._id");
   assert_int_equal (strlen (id), 24);
   assert_string_equal (get_str (upd, "updates.0.u.$setOnInsert.type"), "order.placed.v1");
   assert_int_equal (get_int (upd, "updates.0.u.$setOnInsert.payload.o"), 1);
   assert_string_equal (get_str (upd, "updates.0.u.$setOnInsert.headers.h"), "v");
   assert_string_equal (get_str (upd, "updates.0.u.$setOnInsert.correlationId"), "c");
   assert_false (has (upd, "updates.0.u.$setOnInsert.key"));
   assert_false (has (upd, "updates.0.u.$setOnInsert.sequence"));
   assert_false (has (upd, "updates.0.u.$setOnInsert.causationId"));
   assert_false (has (upd, "updates.0.u.$setOnInsert.handlers"));
   assert_string_equal (get_str (upd, "updates.0.u.$addToSet.handlers.$each.0"), "h1");
   assert_string_equal (get_str (upd, "updates.0.u.$addToSet.handlers.$each.1"), "h3");
   assert_int_equal (count (upd, "updates.0.u.$addToSet.handlers.$each"), 2);
   {
      bson_iter_t it;

      assert_true (get (upd, "updates.0.upsert", &it));
      assert_true (bson_iter_bool (&it));
      assert_true (get (upd, "updates.0.u.$setOnInsert.createdAt", &it));
      assert_int_equal (bson_iter_date_time (&it), NOW_MS);
   }

   assert_string_equal (get_str (ins, "insert"), "p_deliveries");
   assert_int_equal (count (ins, "documents"), 2);
   for (int d = 0; d < 2; d++) {
      char path[64];
      bson_iter_t it;

      snprintf (path, sizeof path, "documents.%d", d);
      assert_true (get (ins, path, &it));
      {
         bson_t doc;
         const uint8_t *data;
         uint32_t len;

         bson_iter_document (&it, &len, &data);
         assert_true (bson_init_static (&doc, data, len));
         assert_true (get (&doc, "_id", &it) && BSON_ITER_HOLDS_OID (&it));
         assert_string_equal (get_str (&doc, "eventId"), id);
         assert_string_equal (get_str (&doc, "handler"), d == 0 ? "h1" : "h3");
         assert_string_equal (get_str (&doc, "eventType"), "order.placed.v1");
         assert_false (has (&doc, "key"));
         assert_false (has (&doc, "sequence"));
         assert_true (get (&doc, "laneId", &it) && BSON_ITER_HOLDS_INT32 (&it));
         assert_int_equal (bson_iter_int32 (&it), outbox_lane_id (NULL, id));
         assert_string_equal (get_str (&doc, "lane"), "ready");
         assert_string_equal (get_str (&doc, "status"), "pending");
         assert_true (get (&doc, "attempts", &it) && BSON_ITER_HOLDS_INT32 (&it) && bson_iter_int32 (&it) == 0);
         assert_true (get (&doc, "claims", &it) && BSON_ITER_HOLDS_INT32 (&it) && bson_iter_int32 (&it) == 0);
         assert_true (get (&doc, "dueAt", &it) && bson_iter_date_time (&it) == NOW_MS);
         assert_true (get (&doc, "createdAt", &it) && bson_iter_date_time (&it) == NOW_MS);
         assert_false (has (&doc, "updatedAt"));
      }
   }

   reply (job, 0, "{\"n\": 1, \"nModified\": 0, \"upserted\": [{\"index\": 0, \"_id\": \"x\"}], \"ok\": 1}");
   reply (job, 1, "{\"n\": 2, \"ok\": 1}");
   assert_false (inject_job_failed (job, NULL));
   assert_int_equal (inject_job_next_round (job), 0);
   assert_int_equal (inject_job_phase (job), INJECT_PHASE_DONE);
   assert_false (inject_job_failed (job, NULL));
   assert_int_equal (inject_job_rounds (job), 1);
   assert_int_equal (inject_job_commands (job), 2);
   assert_int_equal (inject_job_deliveries (job), 2);
   inject_job_destroy (job);
}

/* An event no handler takes: stored with an empty handlers list, no insert. */
static void
test_no_subscriber (void **state)
{
   inject_job_t *job = job_for (
      "{\"insert\": \"o\", \"comment\": {\"relaybus\": {\"type\": \"audit.x\"}}, \"$db\": \"s\", " TXN "}", false);
   const bson_t *upd;

   assert_int_equal (inject_job_next_round (job), 1);
   upd = inject_job_command (job, 0);
   assert_int_equal (count (upd, "updates.0.u.$setOnInsert.handlers"), 0);
   assert_false (has (upd, "updates.0.u.$addToSet"));
   assert_false (has (upd, "updates.0.u.$setOnInsert.payload.x"));
   {
      bson_iter_t it;

      assert_true (get (upd, "updates.0.u.$setOnInsert.payload", &it));
      assert_true (BSON_ITER_HOLDS_NULL (&it));
   }
   reply (job, 0, "{\"n\": 1, \"ok\": 1}");
   assert_int_equal (inject_job_next_round (job), 0);
   assert_false (inject_job_failed (job, NULL));
   inject_job_destroy (job);
}

/* Keys: one findAndModify per distinct key with $inc of its event count,
 * then consecutive sequences in annotation order. */
static void
test_keyed_two_rounds (void **state)
{
   inject_job_t *job = job_for (
      "{\"update\": \"o\", \"comment\": {\"relaybus\": [{\"type\": \"order.a\", \"key\": \"k\"}, {\"type\": "
      "\"user.b\", \"key\": \"j\"}, {\"type\": \"order.c\"}, {\"type\": \"order.d\", \"key\": \"k\", \"notBefore\": "
      "{\"$date\": \"2027-01-01T00:00:00Z\"}}]}, \"$db\": \"s\", " TXN "}",
      false);
   const bson_t *c, *upd, *ins;
   bson_iter_t it;

   assert_int_equal (inject_job_next_round (job), 2);
   assert_int_equal (inject_job_phase (job), INJECT_PHASE_SEQ);
   c = inject_job_command (job, 0);
   check_txn_fields (c);
   assert_string_equal (get_str (c, "findAndModify"), "p_key_sequences");
   assert_string_equal (get_str (c, "query._id"), "k");
   assert_true (get (c, "update.$inc.value", &it) && BSON_ITER_HOLDS_INT64 (&it));
   assert_int_equal (bson_iter_int64 (&it), 2);
   assert_true (get (c, "upsert", &it) && bson_iter_bool (&it));
   assert_true (get (c, "new", &it) && bson_iter_bool (&it));
   c = inject_job_command (job, 1);
   assert_string_equal (get_str (c, "query._id"), "j");
   assert_int_equal (get_int (c, "update.$inc.value"), 1);

   reply (job, 0, "{\"lastErrorObject\": {\"n\": 1, \"updatedExisting\": true}, \"value\": {\"_id\": \"k\", \"value\": "
                  "{\"$numberLong\": \"12\"}}, \"ok\": 1}");
   reply (job, 1, "{\"lastErrorObject\": {\"n\": 1, \"updatedExisting\": false, \"upserted\": \"j\"}, \"value\": "
                  "{\"_id\": \"j\", \"value\": {\"$numberLong\": \"1\"}}, \"ok\": 1}");
   assert_false (inject_job_failed (job, NULL));

   assert_int_equal (inject_job_next_round (job), 2);
   assert_int_equal (inject_job_phase (job), INJECT_PHASE_WRITE);
   upd = inject_job_command (job, 0);
   ins = inject_job_command (job, 1);
   assert_int_equal (count (upd, "updates"), 4);
   assert_true (get (upd, "updates.0.u.$setOnInsert.sequence", &it) && BSON_ITER_HOLDS_INT64 (&it));
   assert_int_equal (bson_iter_int64 (&it), 11);
   assert_string_equal (get_str (upd, "updates.0.u.$setOnInsert.key"), "k");
   assert_int_equal (get_int (upd, "updates.1.u.$setOnInsert.sequence"), 1);
   assert_false (has (upd, "updates.2.u.$setOnInsert.sequence"));
   assert_int_equal (get_int (upd, "updates.3.u.$setOnInsert.sequence"), 12);
   /* order.a -> h1; user.b -> h2; order.c -> h1; order.d -> h1 */
   assert_int_equal (count (ins, "documents"), 4);
   assert_string_equal (get_str (ins, "documents.0.key"), "k");
   assert_int_equal (get_int (ins, "documents.0.sequence"), 11);
   assert_int_equal (get_int (ins, "documents.0.laneId"), outbox_lane_id ("k", "ignored"));
   assert_string_equal (get_str (ins, "documents.1.handler"), "h2");
   assert_int_equal (get_int (ins, "documents.1.sequence"), 1);
   assert_false (has (ins, "documents.2.key"));
   assert_int_equal (get_int (ins, "documents.3.sequence"), 12);
   assert_true (get (ins, "documents.3.dueAt", &it));
   assert_int_equal (bson_iter_date_time (&it), 1798761600000LL);
   assert_true (get (upd, "updates.3.u.$setOnInsert.notBefore", &it));
   assert_int_equal (bson_iter_date_time (&it), 1798761600000LL);

   reply (job, 0, "{\"n\": 4, \"ok\": 1}");
   reply (job, 1, "{\"n\": 4, \"ok\": 1}");
   assert_int_equal (inject_job_next_round (job), 0);
   assert_false (inject_job_failed (job, NULL));
   assert_int_equal (inject_job_rounds (job), 2);
   inject_job_destroy (job);
}

/* Given ids: read first; a stored event gets deliveries only for handlers
 * it does not list, copies its stored key and sequence, takes no new
 * sequence, and is updated without upsert. */
static void
test_given_ids_dedup (void **state)
{
   inject_job_t *job = job_for (
      "{\"insert\": \"o\", \"comment\": {\"relaybus\": [{\"type\": \"order.placed.v1\", \"id\": \"x\", \"key\": "
      "\"k\"}, {\"type\": \"order.placed.v1\", \"id\": \"y\", \"key\": \"k\"}, {\"type\": \"order.z\"}]}, \"$db\": "
      "\"s\", " TXN "}",
      false);
   const bson_t *c, *upd, *ins;

   assert_int_equal (inject_job_next_round (job), 1);
   assert_int_equal (inject_job_phase (job), INJECT_PHASE_READ);
   c = inject_job_command (job, 0);
   check_txn_fields (c);
   assert_string_equal (get_str (c, "find"), "p_events");
   assert_string_equal (get_str (c, "filter._id.$in.0"), "x");
   assert_string_equal (get_str (c, "filter._id.$in.1"), "y");
   assert_int_equal (count (c, "filter._id.$in"), 2);
   reply (job, 0, "{\"cursor\": {\"id\": 0, \"ns\": \"rb.p_events\", \"firstBatch\": [{\"_id\": \"x\", \"type\": "
                  "\"order.placed.v1\", \"key\": \"k\", \"sequence\": {\"$numberLong\": \"3\"}, \"handlers\": "
                  "[\"h1\", \"gone\"]}]}, \"ok\": 1}");

   /* Only y is new and keyed. */
   assert_int_equal (inject_job_next_round (job), 1);
   assert_int_equal (inject_job_phase (job), INJECT_PHASE_SEQ);
   assert_int_equal (get_int (inject_job_command (job, 0), "update.$inc.value"), 1);
   reply (job, 0, "{\"value\": {\"_id\": \"k\", \"value\": 4}, \"ok\": 1}");

   assert_int_equal (inject_job_next_round (job), 2);
   upd = inject_job_command (job, 0);
   ins = inject_job_command (job, 1);
   assert_int_equal (count (upd, "updates"), 3);
   assert_string_equal (get_str (upd, "updates.0.q._id"), "x");
   assert_false (has (upd, "updates.0.u.$setOnInsert"));
   assert_string_equal (get_str (upd, "updates.0.u.$addToSet.handlers.$each.0"), "h3");
   assert_int_equal (count (upd, "updates.0.u.$addToSet.handlers.$each"), 1);
   {
      bson_iter_t it;

      assert_true (get (upd, "updates.0.upsert", &it));
      assert_false (bson_iter_bool (&it));
   }
   assert_string_equal (get_str (upd, "updates.1.q._id"), "y");
   assert_int_equal (get_int (upd, "updates.1.u.$setOnInsert.sequence"), 4);
   /* x: h3 only (key k, sequence 3 copied); y: h1, h3; z: h1 */
   assert_int_equal (count (ins, "documents"), 4);
   assert_string_equal (get_str (ins, "documents.0.eventId"), "x");
   assert_string_equal (get_str (ins, "documents.0.handler"), "h3");
   assert_int_equal (get_int (ins, "documents.0.sequence"), 3);
   assert_string_equal (get_str (ins, "documents.0.key"), "k");
   assert_string_equal (get_str (ins, "documents.1.eventId"), "y");
   assert_int_equal (get_int (ins, "documents.1.sequence"), 4);
   reply (job, 0, "{\"n\": 3, \"nModified\": 1, \"ok\": 1}");
   reply (job, 1, "{\"n\": 4, \"ok\": 1}");
   assert_int_equal (inject_job_next_round (job), 0);
   assert_false (inject_job_failed (job, NULL));
   assert_int_equal (inject_job_rounds (job), 3);
   {
      bson_t ids = BSON_INITIALIZER;

      assert_true (inject_job_append_ids (job, &ids, "eventIds"));
      assert_string_equal (get_str (&ids, "eventIds.0"), "x");
      assert_string_equal (get_str (&ids, "eventIds.1"), "y");
      assert_int_equal (strlen (get_str (&ids, "eventIds.2")), 24);
      bson_destroy (&ids);
   }
   inject_job_destroy (job);
}

/* A retry whose event lists every handler already writes nothing more. */
static void
test_given_id_nothing_new (void **state)
{
   inject_job_t *job = job_for (
      "{\"insert\": \"o\", \"comment\": {\"relaybus\": {\"type\": \"order.placed.v1\", \"id\": \"x\"}}, \"$db\": "
      "\"s\", " TXN "}",
      false);

   assert_int_equal (inject_job_next_round (job), 1);
   reply (job, 0, "{\"cursor\": {\"id\": 0, \"firstBatch\": [{\"handlers\": [\"h3\", \"h1\"], \"_id\": \"x\", "
                  "\"type\": \"order.placed.v1\"}]}, \"ok\": 1}");
   assert_int_equal (inject_job_next_round (job), 0);
   assert_false (inject_job_failed (job, NULL));
   assert_int_equal (inject_job_rounds (job), 1);
   assert_int_equal (inject_job_deliveries (job), 0);
   inject_job_destroy (job);
}

/* relaybusPublish opening the transaction: the first command carries
 * startTransaction and readConcern, later ones do not. */
static void
test_opens_txn (void **state)
{
   bson_t *cmd = json ("{\"relaybusPublish\": 1, \"events\": [{\"type\": \"order.a\", \"key\": \"k\"}], \"$db\": "
                       "\"shop\", " TXN ", \"startTransaction\": true, \"readConcern\": {\"level\": \"snapshot\"}}");
   annotate_t *a = malloc (sizeof *a);
   bson_iter_t it;
   bson_error_t error;
   config_t *cfg = test_config ();
   inject_job_t *job;
   const bson_t *c;

   assert_true (bson_iter_init_find (&it, cmd, "events"));
   assert_true (annotate_parse_events (&it, a, &error));
   job = inject_job_new (a, cmd, true, cfg, NOW_MS, &error);
   assert_non_null (job);
   assert_int_equal (inject_job_next_round (job), 1);
   c = inject_job_command (job, 0);
   assert_true (get (c, "startTransaction", &it) && bson_iter_bool (&it));
   assert_string_equal (get_str (c, "readConcern.level"), "snapshot");
   reply (job, 0, "{\"value\": {\"_id\": \"k\", \"value\": 1}, \"ok\": 1}");
   assert_int_equal (inject_job_next_round (job), 2);
   check_txn_fields (inject_job_command (job, 0));
   check_txn_fields (inject_job_command (job, 1));

   {
      bson_t abort;

      inject_job_abort_command (job, &abort);
      assert_int_equal (get_int (&abort, "abortTransaction"), 1);
      assert_string_equal (get_str (&abort, "$db"), "admin");
      assert_int_equal (get_int (&abort, "txnNumber"), 7);
      assert_true (get (&abort, "autocommit", &it) && !bson_iter_bool (&it));
      assert_false (has (&abort, "startTransaction"));
      bson_destroy (&abort);
   }
   inject_job_destroy (job);
   config_release (cfg);
   free (a);
   bson_destroy (cmd);
}

typedef struct {
   const char *reply;
   int32_t code;
   const char *code_name;
   bool transient; /* TransientTransactionError in the client's reply */
   const char *errmsg_prefix;
} failure_case_t;

static void
test_failures (void **state)
{
   static const failure_case_t write_cases[] = {
      /* The server's error is relayed as it is, labels kept. */
      {"{\"ok\": 0, \"errmsg\": \"Write conflict\", \"code\": 112, \"codeName\": \"WriteConflict\", \"errorLabels\": "
       "[\"TransientTransactionError\"]}",
       112, "WriteConflict", true, "Write conflict"},
      {"{\"ok\": 0, \"errmsg\": \"Transaction 7 has been aborted.\", \"code\": 251, \"codeName\": "
       "\"NoSuchTransaction\"}",
       251, "NoSuchTransaction", false, "Transaction 7"},
      /* A write error becomes a top-level error naming the outbox write. */
      {"{\"ok\": 1, \"n\": 0, \"writeErrors\": [{\"index\": 0, \"code\": 11000, \"errmsg\": \"E11000 dup\"}]}",
       11000, "DuplicateKey", false, "relaybus: update on p_events failed: E11000 dup"},
      {"{\"ok\": 1, \"n\": 0, \"writeErrors\": [{\"index\": 0, \"code\": 112, \"errmsg\": \"conflict\"}]}",
       112, "WriteConflict", true, "relaybus: update on p_events failed"},
      /* A stored event that vanished: retry the transaction. */
      {"{\"ok\": 1, \"n\": 0}", 112, "WriteConflict", true, "relaybus: update on p_events wrote 0 of 1"},
      {"{\"ok\": 1}", 112, "WriteConflict", true, "relaybus: update on p_events wrote -1 of 1"},
   };

   for (size_t i = 0; i < sizeof write_cases / sizeof write_cases[0]; i++) {
      const failure_case_t *fc = &write_cases[i];
      inject_job_t *job = job_for (
         "{\"insert\": \"o\", \"comment\": {\"relaybus\": {\"type\": \"order.x\"}}, \"$db\": \"s\", " TXN "}", false);
      const bson_t *out = NULL;
      bson_iter_t it;

      assert_int_equal (inject_job_next_round (job), 2);
      reply (job, 0, fc->reply);
      /* Later replies of the round are ignored once one failed. */
      reply (job, 1, "{\"n\": 1, \"ok\": 1}");
      assert_true (inject_job_failed (job, &out));
      assert_int_equal (get_int (out, "ok"), 0);
      assert_int_equal (get_int (out, "code"), fc->code);
      assert_string_equal (get_str (out, "codeName"), fc->code_name);
      if (strncmp (get_str (out, "errmsg"), fc->errmsg_prefix, strlen (fc->errmsg_prefix)) != 0)
         fail_msg ("case %zu: errmsg '%s'", i, get_str (out, "errmsg"));
      assert_int_equal (get (out, "errorLabels.0", &it), fc->transient);
      if (fc->transient)
         assert_string_equal (bson_iter_utf8 (&it, NULL), "TransientTransactionError");
      assert_int_equal (inject_job_next_round (job), 0);
      assert_int_equal (inject_job_phase (job), INJECT_PHASE_DONE);
      inject_job_destroy (job);
   }

   /* Malformed replies of each round. */
   {
      static const char *const bad_seq[] = {
         "{\"ok\": 1}",
         "{\"value\": null, \"ok\": 1}",
         "{\"value\": {\"_id\": \"k\"}, \"ok\": 1}",
         "{\"value\": {\"_id\": \"k\", \"value\": \"1\"}, \"ok\": 1}",
         "{\"value\": {\"_id\": \"k\", \"value\": 0}, \"ok\": 1}",
      };

      for (size_t i = 0; i < sizeof bad_seq / sizeof bad_seq[0]; i++) {
         inject_job_t *job = job_for (
            "{\"insert\": \"o\", \"comment\": {\"relaybus\": {\"type\": \"x\", \"key\": \"k\"}}, \"$db\": \"s\", " TXN
            "}",
            false);
         const bson_t *out;

         assert_int_equal (inject_job_next_round (job), 1);
         reply (job, 0, bad_seq[i]);
         assert_true (inject_job_failed (job, &out));
         assert_int_equal (get_int (out, "code"), 1);
         assert_string_equal (get_str (out, "errmsg"), "relaybus: unexpected reply to findAndModify on p_key_sequences");
         assert_int_equal (inject_job_next_round (job), 0);
         inject_job_destroy (job);
      }
   }
   {
      inject_job_t *job = job_for (
         "{\"insert\": \"o\", \"comment\": {\"relaybus\": {\"type\": \"x\", \"id\": \"i\"}}, \"$db\": \"s\", " TXN "}",
         false);
      const bson_t *out;

      assert_int_equal (inject_job_next_round (job), 1);
      reply (job, 0, "{\"cursor\": {\"id\": 0}, \"ok\": 1, \"$clusterTime\": {\"clusterTime\": {\"$timestamp\": "
                     "{\"t\": 1, \"i\": 1}}}, \"operationTime\": {\"$timestamp\": {\"t\": 1, \"i\": 1}}}");
      assert_true (inject_job_failed (job, &out));
      assert_int_equal (get_int (out, "code"), 1);
      assert_true (has (out, "$clusterTime.clusterTime"));
      assert_true (has (out, "operationTime"));
      inject_job_destroy (job);
   }
}

/* The biggest annotation: 100 keyed events of 100 distinct keys. */
static void
test_many_keys (void **state)
{
   bson_t *body = bson_new (), comment, arr, ev;
   annotate_t *a = malloc (sizeof *a);
   bson_t fwd;
   bson_error_t error;
   config_t *cfg = test_config ();
   inject_job_t *job;
   char k[16], key[16];

   BSON_APPEND_UTF8 (body, "insert", "o");
   BSON_APPEND_DOCUMENT_BEGIN (body, "comment", &comment);
   BSON_APPEND_ARRAY_BEGIN (&comment, "relaybus", &arr);
   for (int i = 0; i < ANNOTATE_MAX_EVENTS; i++) {
      snprintf (k, sizeof k, "%d", i);
      snprintf (key, sizeof key, "key-%d", i);
      BSON_APPEND_DOCUMENT_BEGIN (&arr, k, &ev);
      BSON_APPEND_UTF8 (&ev, "type", "order.x");
      BSON_APPEND_UTF8 (&ev, "key", key);
      bson_append_document_end (&arr, &ev);
   }
   bson_append_array_end (&comment, &arr);
   bson_append_document_end (body, &comment);
   {
      bson_t *txn = json ("{" TXN "}");

      bson_concat (body, txn);
      bson_destroy (txn);
   }
   assert_int_equal (annotate_parse (body, a, &fwd, &error), ANNOTATE_FOUND);
   job = inject_job_new (a, body, false, cfg, NOW_MS, &error);
   assert_int_equal (inject_job_next_round (job), ANNOTATE_MAX_EVENTS);
   for (uint32_t i = 0; i < ANNOTATE_MAX_EVENTS; i++)
      reply (job, i, "{\"value\": {\"value\": 1}, \"ok\": 1}");
   assert_int_equal (inject_job_next_round (job), 2);
   assert_int_equal (count (inject_job_command (job, 1), "documents"), ANNOTATE_MAX_EVENTS);
   inject_job_destroy (job);
   config_release (cfg);
   free (a);
   bson_destroy (&fwd);
   bson_destroy (body);
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_txn_of),
      cmocka_unit_test (test_reply_failed),
      cmocka_unit_test (test_unkeyed_one_round),
      cmocka_unit_test (test_no_subscriber),
      cmocka_unit_test (test_keyed_two_rounds),
      cmocka_unit_test (test_given_ids_dedup),
      cmocka_unit_test (test_given_id_nothing_new),
      cmocka_unit_test (test_opens_txn),
      cmocka_unit_test (test_failures),
      cmocka_unit_test (test_many_keys),
   };

   return cmocka_run_group_tests (tests, NULL, NULL);
}
