/*
 * test_pull.c - the pull consumers' commands as base/pull.c parses them: a
 * table of commands (as relaxed Extended JSON) that parse, with what they
 * ask for, and of commands refused, with the code and the words of the
 * message that name the field; and the lease strings.  Then
 * publish/pulltxn.c, relaybusComplete in a transaction: the fence from a
 * table of documents its reads return, the failures it hands the client,
 * and the history records.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "base/config.h"
#include "base/pull.h"
#include "base/outbox.h"
#include "publish/pulltxn.h"

static const char *const ini = "[proxy]\n"
                               "listen = 127.0.0.1:0\n"
                               "upstream = mongodb://127.0.0.1:1/?replicaSet=rs0\n"
                               "[handler orders]\n"
                               "events = order.*\n"
                               "kind = pull\n"
                               "[handler hooks]\n"
                               "events = order.*\n"
                               "kind = webhook\n"
                               "url = http://127.0.0.1:9/x\n";

#define LEASE "17:3:0:0123456789abcdef01234567"

static config_t *
cfg_new (void)
{
   bson_error_t error;
   config_t *cfg = config_parse_string (ini, "test.ini", &error);

   if (!cfg)
      fail_msg ("config: %s", error.message);
   return cfg;
}

static bson_t *
doc (const char *json)
{
   bson_error_t error;
   bson_t *b = bson_new_from_json ((const uint8_t *) json, -1, &error);

   if (!b)
      fail_msg ("bad JSON in the test: %s: %s", json, error.message);
   return b;
}

static const char *
first_key (const bson_t *b)
{
   bson_iter_t it;

   return bson_iter_init (&it, b) && bson_iter_next (&it) ? bson_iter_key (&it) : "";
}

static void
test_parses (void **state)
{
   config_t *cfg = cfg_new ();
   static const struct {
      const char *json;
      pull_op_t op;
      int64_t limit, lease_ms, await_ms, delay_ms;
      size_t n_leases;
   } ok[] = {
      {"{\"relaybusClaim\": \"orders\"}", PULL_CLAIM, 1, PULL_LEASE_MS_DEFAULT, 0, -1, 0},
      {"{\"relaybusClaim\": \"orders\", \"limit\": 1000, \"leaseMs\": {\"$numberLong\": \"1000\"}, "
       "\"maxAwaitTimeMS\": 60000.0, \"consumer\": \"c\", \"$db\": \"admin\", \"lsid\": {}}",
       PULL_CLAIM, 1000, 1000, 60000, -1, 0},
      {"{\"relaybusComplete\": \"orders\", \"leases\": [\"" LEASE "\", \"1:1:2:aaaaaaaaaaaaaaaaaaaaaaaa\"]}",
       PULL_COMPLETE, 1, PULL_LEASE_MS_DEFAULT, 0, -1, 2},
      {"{\"relaybusRetry\": \"orders\", \"lease\": \"" LEASE "\", \"delayMs\": 0, \"error\": \"x\"}", PULL_RETRY, 1,
       PULL_LEASE_MS_DEFAULT, 0, 0, 1},
      {"{\"relaybusBury\": \"orders\", \"lease\": \"" LEASE "\"}", PULL_BURY, 1, PULL_LEASE_MS_DEFAULT, 0, -1, 1},
      {"{\"relaybusExtend\": \"orders\", \"leases\": [\"" LEASE "\"], \"leaseMs\": 3600000}", PULL_EXTEND, 1,
       3600000, 0, -1, 1},
      {"{\"relaybusRelease\": \"orders\", \"leases\": [\"" LEASE "\"]}", PULL_RELEASE, 1, PULL_LEASE_MS_DEFAULT, 0,
       -1, 1},
      /* Any handler's status, a webhook's too. */
      {"{\"relaybusStatus\": \"hooks\"}", PULL_STATUS, 1, PULL_LEASE_MS_DEFAULT, 0, -1, 0},
   };

   (void) state;
   for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
      bson_t *b = doc (ok[i].json);
      pull_req_t *r = NULL;
      bson_error_t error;

      if (!pull_parse (first_key (b), b, cfg, &r, &error))
         fail_msg ("%s: refused: %s", ok[i].json, error.message);
      assert_int_equal (r->op, ok[i].op);
      assert_int_equal (r->limit, ok[i].limit);
      assert_int_equal (r->lease_ms, ok[i].lease_ms);
      assert_int_equal (r->await_ms, ok[i].await_ms);
      assert_int_equal (r->delay_ms, ok[i].delay_ms);
      assert_int_equal (r->n_leases, ok[i].n_leases);
      if (r->n_leases > 0) {
         assert_string_equal (r->leases[0].text, LEASE);
         assert_string_equal (r->leases[0].token, "17:3:0");
      }
      pull_req_destroy (r);
      bson_destroy (b);
   }
   config_release (cfg);
}

static void
test_refused (void **state)
{
   config_t *cfg = cfg_new ();
   static const struct {
      const char *json;
      const char *needle;
   } bad[] = {
      {"{\"relaybusClaim\": \"nope\"}", "handler: no handler named 'nope'"},
      {"{\"relaybusClaim\": \"hooks\"}", "'hooks' is kind = webhook"},
      {"{\"relaybusClaim\": 1}", "the handler's name"},
      {"{\"relaybusClaim\": \"\"}", "the handler's name"},
      {"{\"relaybusClaim\": \"orders\", \"limit\": 0}", "limit must be an integer from 1 to 1000"},
      {"{\"relaybusClaim\": \"orders\", \"limit\": 1001}", "limit must be"},
      {"{\"relaybusClaim\": \"orders\", \"limit\": 2.5}", "limit must be"},
      {"{\"relaybusClaim\": \"orders\", \"limit\": {\"$numberDouble\": \"NaN\"}}", "limit must be"},
      {"{\"relaybusClaim\": \"orders\", \"limit\": \"3\"}", "limit must be"},
      {"{\"relaybusClaim\": \"orders\", \"limit\": 1, \"limit\": 2}", "limit is given twice"},
      {"{\"relaybusClaim\": \"orders\", \"leaseMs\": 999}", "leaseMs must be an integer from 1000"},
      {"{\"relaybusClaim\": \"orders\", \"maxAwaitTimeMS\": -1}", "maxAwaitTimeMS must be"},
      {"{\"relaybusClaim\": \"orders\", \"consumer\": true}", "consumer must be a string"},
      {"{\"relaybusClaim\": \"orders\", \"leases\": []}", "unknown field 'leases'"},
      {"{\"relaybusComplete\": \"orders\"}", "leases is required"},
      {"{\"relaybusComplete\": \"orders\", \"leases\": []}", "leases must hold from 1 to 1000"},
      {"{\"relaybusComplete\": \"orders\", \"leases\": {}}", "leases must be an array"},
      {"{\"relaybusComplete\": \"orders\", \"leases\": [7]}", "leases.0 must be a lease string"},
      {"{\"relaybusComplete\": \"orders\", \"leases\": [\"" LEASE "\", \"" LEASE "\"]}", "leases.1 repeats lease"},
      /* Malformed leases: each part checked. */
      {"{\"relaybusComplete\": \"orders\", \"leases\": [\"17:3:0\"]}", "is not a lease"},
      {"{\"relaybusComplete\": \"orders\", \"leases\": [\"256:3:0:0123456789abcdef01234567\"]}", "is not a lease"},
      {"{\"relaybusComplete\": \"orders\", \"leases\": [\"17:0:0:0123456789abcdef01234567\"]}", "is not a lease"},
      {"{\"relaybusComplete\": \"orders\", \"leases\": [\"17:3:0:0123456789ABCDEF01234567\"]}", "is not a lease"},
      {"{\"relaybusComplete\": \"orders\", \"leases\": [\"17:3:0:0123456789abcdef0123456\"]}", "is not a lease"},
      {"{\"relaybusComplete\": \"orders\", \"leases\": [\"17:3:x:0123456789abcdef01234567\"]}", "is not a lease"},
      {"{\"relaybusComplete\": \"orders\", \"leases\": [\":0123456789abcdef01234567\"]}", "is not a lease"},
      {"{\"relaybusRetry\": \"orders\"}", "lease is required"},
      {"{\"relaybusRetry\": \"orders\", \"lease\": \"" LEASE "\", \"delayMs\": -5}", "delayMs must be"},
      {"{\"relaybusRetry\": \"orders\", \"lease\": \"" LEASE "\", \"error\": 5}", "error must be a string"},
      {"{\"relaybusBury\": \"orders\", \"lease\": \"" LEASE "\", \"delayMs\": 5}", "unknown field 'delayMs'"},
      {"{\"relaybusExtend\": \"orders\", \"leases\": [\"" LEASE "\"]}", "leaseMs is required"},
      {"{\"relaybusStatus\": \"nope\"}", "no handler named 'nope'"},
   };

   (void) state;
   for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
      bson_t *b = doc (bad[i].json);
      pull_req_t *r = (pull_req_t *) 1;
      bson_error_t error;

      if (pull_parse (first_key (b), b, cfg, &r, &error))
         fail_msg ("%s: parsed, expected a refusal", bad[i].json);
      assert_null (r);
      assert_int_equal (error.domain, PULL_ERROR_DOMAIN);
      assert_int_equal (error.code, PULL_CODE_BAD_VALUE);
      if (!strstr (error.message, bad[i].needle))
         fail_msg ("%s: message \"%s\" lacks \"%s\"", bad[i].json, error.message, bad[i].needle);
      bson_destroy (b);
   }
   config_release (cfg);
}

static void
test_error_text_cut (void **state)
{
   config_t *cfg = cfg_new ();
   char *big = bson_malloc (PULL_ERROR_TEXT_MAX + 64);
   char json[PULL_ERROR_TEXT_MAX + 256];
   bson_t *b;
   pull_req_t *r;
   bson_error_t error;

   (void) state;
   /* "é" is two bytes: the cut lands inside one at an odd length. */
   for (size_t i = 0; i + 2 <= PULL_ERROR_TEXT_MAX + 60; i += 2)
      memcpy (big + i, "\xc3\xa9", 2);
   big[PULL_ERROR_TEXT_MAX + 60] = '\0';
   snprintf (json, sizeof json, "{\"relaybusRetry\": \"orders\", \"lease\": \"" LEASE "\", \"error\": \"%s\"}", big);
   b = doc (json);
   assert_true (pull_parse ("relaybusRetry", b, cfg, &r, &error));
   assert_true (strlen (r->error_text) < PULL_ERROR_TEXT_MAX);
   assert_true (bson_utf8_validate (r->error_text, strlen (r->error_text), false));
   pull_req_destroy (r);
   bson_destroy (b);
   bson_free (big);
   config_release (cfg);
}

static void
test_is_command (void **state)
{
   bson_t *status1 = doc ("{\"relaybusStatus\": 1}");
   bson_t *status_h = doc ("{\"relaybusStatus\": \"orders\"}");
   bson_t *claim = doc ("{\"relaybusClaim\": \"orders\"}");

   (void) state;
   assert_false (pull_is_command ("relaybusStatus", status1)); /* publish's own answer */
   assert_true (pull_is_command ("relaybusStatus", status_h));
   assert_true (pull_is_command ("relaybusClaim", claim));
   assert_false (pull_is_command ("relaybusPublish", claim));
   assert_false (pull_is_command ("find", claim));
   bson_destroy (status1);
   bson_destroy (status_h);
   bson_destroy (claim);
}

static void
test_lease_roundtrip (void **state)
{
   bson_oid_t id;
   char text[PULL_LEASE_MAX];
   pull_lease_t l;

   (void) state;
   bson_oid_init_from_string (&id, "0123456789abcdef01234567");
   pull_lease_format ("255:12345678901:2147483647", &id, text);
   assert_string_equal (text, "255:12345678901:2147483647:0123456789abcdef01234567");
   assert_true (pull_lease_parse (text, &l));
   assert_string_equal (l.token, "255:12345678901:2147483647");
   assert_true (bson_oid_equal (&l.id, &id));
   assert_false (pull_lease_parse (NULL, &l));
   assert_false (pull_lease_parse ("", &l));
   assert_false (pull_lease_parse ("255:1:0:0123456789abcdef01234567x", &l));
}

/* --- relaybusComplete in a transaction (publish/pulltxn.c) ---------------- */

#define TXN_FIELDS "\"lsid\": {\"id\": {\"$binary\": {\"base64\": \"AAAAAAAAAAAAAAAAAAAAAA==\", \"subType\": \"04\"}}}, " \
                   "\"txnNumber\": {\"$numberLong\": \"7\"}, \"autocommit\": false"
#define TXN_LEASE "17:3:2:0123456789abcdef01234567"
#define TXN_OID "{\"$oid\": \"0123456789abcdef01234567\"}"
#define TXN_DELIVERY(claims, lane, status, handler)                                                           \
   "{\"ok\": 1, \"cursor\": {\"id\": 0, \"ns\": \"relaybus.relaybus_deliveries\", \"firstBatch\": [{\"_id\": " TXN_OID \
   ", \"eventId\": \"e1\", \"handler\": \"" handler "\", \"eventType\": \"order.placed.v1\", \"laneId\": " lane      \
   ", \"status\": \"" status "\", \"attempts\": 0, \"claims\": " claims "}]}}"
/* Lane 17 of handler "orders"'s lane space (test_txn_fence checks the
 * number against outbox_lane_doc_id). */
#define TXN_LANE_DOC 1587026449
#define TXN_LANE(epoch, inflight)                                                                             \
   "{\"ok\": 1, \"cursor\": {\"id\": 0, \"ns\": \"relaybus.relaybus_lanes\", \"firstBatch\": [{\"_id\": 1587026449, "      \
   "\"epoch\": " epoch ", \"inFlight\": [" inflight "]}]}}"
#define TXN_NONE "{\"ok\": 1, \"cursor\": {\"id\": 0, \"ns\": \"x.y\", \"firstBatch\": []}}"

/* The fence of one lease, from the documents its transaction read: holds
 * (the WRITE round follows) or RelaybusLeaseLost. */
static const struct {
   const char *what, *deliveries, *lanes;
   bool holds;
} fence_cases[] = {
   {"held", TXN_DELIVERY ("2", "17", "pending", "orders"), TXN_LANE ("3", TXN_OID), true},
   {"a newer claim generation", TXN_DELIVERY ("3", "17", "pending", "orders"), TXN_LANE ("3", TXN_OID), false},
   {"a newer lane epoch", TXN_DELIVERY ("2", "17", "pending", "orders"), TXN_LANE ("4", TXN_OID), false},
   {"the lane no longer lists it", TXN_DELIVERY ("2", "17", "pending", "orders"), TXN_LANE ("3", ""), false},
   {"the delivery is gone", TXN_NONE, TXN_LANE ("3", TXN_OID), false},
   {"the lane is missing", TXN_DELIVERY ("2", "17", "pending", "orders"), TXN_NONE, false},
   {"the delivery is dead", TXN_DELIVERY ("2", "17", "dead", "orders"), TXN_LANE ("3", TXN_OID), false},
   {"another lane", TXN_DELIVERY ("2", "18", "pending", "orders"), TXN_LANE ("3", TXN_OID), false},
   {"another handler's delivery", TXN_DELIVERY ("2", "17", "pending", "hooks"), TXN_LANE ("3", TXN_OID), false},
};

static pulltxn_t *
txn_new (config_t *cfg, const char *cmd_json)
{
   bson_t *cmd = doc ("{\"relaybusComplete\": \"orders\", \"leases\": [\"" TXN_LEASE "\"], " TXN_FIELDS "}");
   bson_t *stmt = doc (cmd_json);
   pull_req_t *r = NULL;
   pulltxn_t *t;
   bson_error_t error;

   if (!pull_parse ("relaybusComplete", cmd, cfg, &r, &error))
      fail_msg ("parse: %s", error.message);
   t = pulltxn_new (r, stmt, cfg, 1700000000000, &error);
   if (!t)
      fail_msg ("pulltxn_new: %s", error.message);
   pull_req_destroy (r);
   bson_destroy (cmd);
   bson_destroy (stmt);
   return t;
}

static void
reply_json (pulltxn_t *t, uint32_t i, const char *json)
{
   bson_t *b = doc (json);

   pulltxn_reply (t, i, b);
   bson_destroy (b);
}

static bool
has_path (const bson_t *b, const char *dotted)
{
   bson_iter_t it, f;

   return bson_iter_init (&it, b) && bson_iter_find_descendant (&it, dotted, &f);
}

static void
test_txn_fence (void **state)
{
   config_t *cfg = cfg_new ();

   (void) state;
   assert_int_equal (outbox_lane_doc_id (outbox_lane_space_of ("orders"), 17), TXN_LANE_DOC);
   for (size_t k = 0; k < sizeof fence_cases / sizeof fence_cases[0]; k++) {
      pulltxn_t *t = txn_new (cfg, "{\"relaybusComplete\": \"orders\", " TXN_FIELDS "}");
      const bson_t *fail = NULL;
      uint32_t n;
      bson_iter_t it;

      assert_int_equal (pulltxn_next_round (t), 2);
      assert_int_equal (pulltxn_phase (t), PULLTXN_PHASE_FENCE);
      /* Both reads run in the transaction and open nothing. */
      for (uint32_t i = 0; i < 2; i++) {
         assert_string_equal (first_key (pulltxn_command (t, i)), "find");
         assert_true (has_path (pulltxn_command (t, i), "lsid.id"));
         assert_true (has_path (pulltxn_command (t, i), "txnNumber"));
         assert_true (bson_iter_init_find (&it, pulltxn_command (t, i), "autocommit") && !bson_iter_bool (&it));
         assert_false (has_path (pulltxn_command (t, i), "startTransaction"));
         assert_false (has_path (pulltxn_command (t, i), "readConcern"));
      }
      /* The lease's lane in the handler's lane space. */
      assert_true (bson_iter_init (&it, pulltxn_command (t, 1)) && bson_iter_find_descendant (&it, "filter._id.$in.0", &it));
      assert_int_equal (bson_iter_as_int64 (&it), TXN_LANE_DOC);
      reply_json (t, 0, fence_cases[k].deliveries);
      reply_json (t, 1, fence_cases[k].lanes);
      n = pulltxn_next_round (t);
      if (!fence_cases[k].holds) {
         if (n != 0 || !pulltxn_failed (t, &fail))
            fail_msg ("%s: the fence passed", fence_cases[k].what);
         assert_true (bson_iter_init_find (&it, fail, "code"));
         assert_int_equal (bson_iter_int32 (&it), PULL_CODE_LEASE_LOST);
         assert_true (bson_iter_init_find (&it, fail, "codeName"));
         assert_string_equal (bson_iter_utf8 (&it, NULL), "RelaybusLeaseLost");
         assert_false (has_path (fail, "errorLabels"));
         pulltxn_destroy (t);
         continue;
      }
      /* With attempt history (the default) the event is not written in
       * the transaction (test_txn_attempt_records): the delete and the
       * attempt's record. */
      if (n != 2)
         fail_msg ("%s: %u commands in the write round", fence_cases[k].what, n);
      assert_string_equal (first_key (pulltxn_command (t, 0)), "delete");
      assert_true (has_path (pulltxn_command (t, 0), "deletes.0.q.$or.0.claims"));
      assert_true (has_path (pulltxn_command (t, 0), "deletes.0.q.$or.0.laneId"));
      assert_string_equal (first_key (pulltxn_command (t, 1)), "insert");
      reply_json (t, 0, "{\"ok\": 1, \"n\": 1}");
      reply_json (t, 1, "{\"ok\": 1, \"n\": 1}");
      assert_int_equal (pulltxn_next_round (t), 0);
      assert_false (pulltxn_failed (t, NULL));
      {
         bson_t ans;
         pulltxn_answer (t, &ans);
         assert_true (bson_iter_init (&it, &ans) && bson_iter_find_descendant (&it, "completed.0", &it));
         assert_string_equal (bson_iter_utf8 (&it, NULL), TXN_LEASE);
         assert_false (has_path (&ans, "notCompleted.0"));
         bson_destroy (&ans);
      }
      pulltxn_destroy (t);
   }
   config_release (cfg);
}

/* The server's own failure is what the client gets (a WriteConflict keeps
 * its TransientTransactionError); a delete that misses a fenced delivery is
 * a transient WriteConflict; a completion that opens the transaction hands
 * startTransaction and readConcern to its first command only. */
static void
test_txn_failures (void **state)
{
   config_t *cfg = cfg_new ();
   const bson_t *fail = NULL;
   pulltxn_t *t;
   bson_iter_t it;

   (void) state;
   t = txn_new (cfg, "{\"relaybusComplete\": \"orders\", " TXN_FIELDS "}");
   assert_int_equal (pulltxn_next_round (t), 2);
   reply_json (t, 0, TXN_DELIVERY ("2", "17", "pending", "orders"));
   reply_json (t, 1, TXN_LANE ("3", TXN_OID));
   assert_int_equal (pulltxn_next_round (t), 2);
   reply_json (t, 0, "{\"ok\": 0, \"code\": 112, \"codeName\": \"WriteConflict\", \"errmsg\": \"conflict\", "
                     "\"errorLabels\": [\"TransientTransactionError\"]}");
   reply_json (t, 1, "{\"ok\": 0, \"code\": 251, \"codeName\": \"NoSuchTransaction\", \"errmsg\": \"x\"}");
   assert_int_equal (pulltxn_next_round (t), 0);
   assert_true (pulltxn_failed (t, &fail));
   assert_true (bson_iter_init_find (&it, fail, "code"));
   assert_int_equal (bson_iter_int32 (&it), 112);
   assert_true (bson_iter_init (&it, fail) && bson_iter_find_descendant (&it, "errorLabels.0", &it));
   assert_string_equal (bson_iter_utf8 (&it, NULL), "TransientTransactionError");
   pulltxn_destroy (t);

   t = txn_new (cfg, "{\"relaybusComplete\": \"orders\", " TXN_FIELDS "}");
   assert_int_equal (pulltxn_next_round (t), 2);
   reply_json (t, 0, TXN_DELIVERY ("2", "17", "pending", "orders"));
   reply_json (t, 1, TXN_LANE ("3", TXN_OID));
   assert_int_equal (pulltxn_next_round (t), 2);
   reply_json (t, 0, "{\"ok\": 1, \"n\": 0}");
   reply_json (t, 1, "{\"ok\": 1, \"n\": 1}");
   assert_int_equal (pulltxn_next_round (t), 0);
   assert_true (pulltxn_failed (t, &fail));
   assert_true (bson_iter_init_find (&it, fail, "code"));
   assert_int_equal (bson_iter_int32 (&it), 112);
   assert_true (has_path (fail, "errorLabels"));
   pulltxn_destroy (t);

   t = txn_new (cfg, "{\"relaybusComplete\": \"orders\", " TXN_FIELDS ", \"startTransaction\": true, "
                     "\"readConcern\": {\"level\": \"snapshot\"}}");
   assert_false (pulltxn_opened (t));
   assert_int_equal (pulltxn_next_round (t), 2);
   assert_true (pulltxn_opened (t));
   assert_true (has_path (pulltxn_command (t, 0), "startTransaction"));
   assert_true (has_path (pulltxn_command (t, 0), "readConcern.level"));
   assert_false (has_path (pulltxn_command (t, 1), "startTransaction"));
   assert_false (has_path (pulltxn_command (t, 1), "readConcern"));
   pulltxn_destroy (t);

   {
      bson_t *stmt = doc ("{\"relaybusComplete\": \"orders\"}");
      pull_req_t r = {.op = PULL_COMPLETE};
      bson_error_t error;
      assert_null (pulltxn_new (&r, stmt, cfg, 0, &error));
      bson_destroy (stmt);
   }
   config_release (cfg);
}

/* With [outbox] completion_history the write round also records each
 * completion, with the delivery's fields and attempts + 1. */
static void
test_txn_history (void **state)
{
   bson_error_t error;
   char *text = bson_strdup_printf ("%s[outbox]\ncompletion_history = true\n", ini);
   config_t *cfg = config_parse_string (text, "test.ini", &error);
   pulltxn_t *t;
   bson_iter_t it;

   (void) state;
   if (!cfg)
      fail_msg ("config: %s", error.message);
   t = txn_new (cfg, "{\"relaybusComplete\": \"orders\", " TXN_FIELDS "}");
   assert_int_equal (pulltxn_next_round (t), 2);
   reply_json (t, 0, TXN_DELIVERY ("2", "17", "pending", "orders"));
   reply_json (t, 1, TXN_LANE ("3", TXN_OID));
   assert_int_equal (pulltxn_next_round (t), 3);
   assert_string_equal (first_key (pulltxn_command (t, 2)), "insert");
   assert_true (bson_iter_init (&it, pulltxn_command (t, 2)) &&
                bson_iter_find_descendant (&it, "documents.0.attempts", &it));
   assert_int_equal (bson_iter_int32 (&it), 1);
   assert_true (has_path (pulltxn_command (t, 2), "documents.0.eventId"));
   assert_true (has_path (pulltxn_command (t, 2), "documents.0.completedAt"));
   pulltxn_destroy (t);
   config_release (cfg);
   bson_free (text);
}

/* With [outbox] attempt_history (the default) the write round records
 * each delivery's attempt in <prefix>attempts, succeeded, in the
 * transaction: its event, handler, number (attempts + 1), and its start,
 * duration and instance as the consumer thread answered the lease check;
 * with attempt_history = 0 nothing. */
static void
test_txn_attempt_records (void **state)
{
   bson_error_t error;
   char *text = bson_strdup_printf ("%s[outbox]\nattempt_history = 0\n", ini);
   config_t *off = config_parse_string (text, "test.ini", &error), *cfg = cfg_new ();
   pulltxn_t *t;
   bson_iter_t it;
   bson_t *checked = doc ("{\"ok\": 1, \"claimedAt\": [{\"$date\": {\"$numberLong\": \"1699999999000\"}}], \"instance\": \"host/1/abc\"}");
   const bson_t *c;

   (void) state;
   if (!off)
      fail_msg ("config: %s", error.message);
   t = txn_new (cfg, "{\"relaybusComplete\": \"orders\", " TXN_FIELDS "}");
   pulltxn_set_claims (t, checked);
   assert_int_equal (pulltxn_next_round (t), 2);
   reply_json (t, 0, TXN_DELIVERY ("2", "17", "pending", "orders"));
   reply_json (t, 1, TXN_LANE ("3", TXN_OID));
   /* The delete and the record: not the event, whose time the record
    * holds until the commit (store_settled_elsewhere), so that no other
    * handler's completion of it conflicts with this transaction. */
   assert_int_equal (pulltxn_next_round (t), 2);
   for (uint32_t i = 0; i < 2; i++)
      assert_false (bson_iter_init_find (&it, pulltxn_command (t, i), "update"));
   c = pulltxn_command (t, 1);
   assert_string_equal (first_key (c), "insert");
   assert_true (bson_iter_init_find (&it, c, "insert"));
   assert_string_equal (bson_iter_utf8 (&it, NULL), "relaybus_attempts");
   assert_true (has_path (c, "txnNumber"));
   assert_true (bson_iter_init (&it, c) && bson_iter_find_descendant (&it, "documents.0.outcome", &it));
   assert_string_equal (bson_iter_utf8 (&it, NULL), "succeeded");
   assert_true (bson_iter_init (&it, c) && bson_iter_find_descendant (&it, "documents.0.attempt", &it));
   assert_int_equal (bson_iter_int32 (&it), 1);
   assert_true (bson_iter_init (&it, c) && bson_iter_find_descendant (&it, "documents.0.handler", &it));
   assert_string_equal (bson_iter_utf8 (&it, NULL), "orders");
   assert_true (bson_iter_init (&it, c) && bson_iter_find_descendant (&it, "documents.0.eventId", &it));
   assert_string_equal (bson_iter_utf8 (&it, NULL), "e1");
   assert_true (bson_iter_init (&it, c) && bson_iter_find_descendant (&it, "documents.0.instance", &it));
   assert_string_equal (bson_iter_utf8 (&it, NULL), "host/1/abc");
   assert_true (bson_iter_init (&it, c) && bson_iter_find_descendant (&it, "documents.0.startedAt", &it));
   assert_int_equal (bson_iter_date_time (&it), 1699999999000);
   assert_true (bson_iter_init (&it, c) && bson_iter_find_descendant (&it, "documents.0.durationMs", &it));
   assert_int_equal (bson_iter_int64 (&it), 1000); /* txn_new: now is 1700000000000 */
   assert_true (has_path (c, "documents.0.deliveryId"));
   assert_true (has_path (c, "documents.0.endedAt"));
   pulltxn_destroy (t);

   t = txn_new (off, "{\"relaybusComplete\": \"orders\", " TXN_FIELDS "}");
   assert_int_equal (pulltxn_next_round (t), 2);
   reply_json (t, 0, TXN_DELIVERY ("2", "17", "pending", "orders"));
   reply_json (t, 1, TXN_LANE ("3", TXN_OID));
   /* Without records the event's time is written in the transaction. */
   assert_int_equal (pulltxn_next_round (t), 2);
   assert_string_equal (first_key (pulltxn_command (t, 1)), "update");
   assert_true (bson_iter_init (&it, pulltxn_command (t, 1)) &&
                bson_iter_find_descendant (&it, "updates.0.q._id.$in.0", &it) && BSON_ITER_HOLDS_UTF8 (&it));
   assert_string_equal (bson_iter_utf8 (&it, NULL), "e1");
   assert_true (has_path (pulltxn_command (t, 1), "updates.0.u.$max.completedAt"));
   pulltxn_destroy (t);
   bson_destroy (checked);
   config_release (cfg);
   config_release (off);
   bson_free (text);
}

/* The `consumers` list: who it names in pooled mode (no database) and in
 * session mode (NAME in admin, DB.NAME elsewhere); without a list everyone,
 * with one nobody unknown; on another kind it is refused. */
static void
test_consumers_list (void **state)
{
   bson_error_t error;
   char *text = bson_strdup_printf ("%s[handler guarded]\nevents = x.*\nkind = pull\nconsumers = alice , shop.bob,a.b.c\n", ini);
   config_t *cfg = config_parse_string (text, "test.ini", &error);
   const config_handler_t *open, *guarded;
   bson_t *b;

   (void) state;
   if (!cfg)
      fail_msg ("config: %s", error.message);
   b = doc ("{\"relaybusClaim\": \"guarded\"}");
   guarded = pull_handler_named (b, cfg);
   bson_destroy (b);
   b = doc ("{\"relaybusClaim\": \"orders\"}");
   open = pull_handler_named (b, cfg);
   bson_destroy (b);
   assert_non_null (guarded);
   assert_non_null (open);
   assert_string_equal (guarded->consumers, "alice,shop.bob,a.b.c");
   b = doc ("{\"relaybusClaim\": \"nope\"}");
   assert_null (pull_handler_named (b, cfg));
   bson_destroy (b);
   b = doc ("{\"relaybusClaim\": 1}");
   assert_null (pull_handler_named (b, cfg));
   bson_destroy (b);

   assert_true (pull_consumer_admitted (open, NULL, NULL));
   assert_true (pull_consumer_admitted (open, "mallory", "test"));
   /* pooled mode: auth-file names */
   assert_true (pull_consumer_admitted (guarded, "alice", NULL));
   assert_true (pull_consumer_admitted (guarded, "shop.bob", NULL));
   assert_false (pull_consumer_admitted (guarded, "bob", NULL));
   assert_false (pull_consumer_admitted (guarded, "alic", NULL));
   assert_false (pull_consumer_admitted (guarded, "alicea", NULL));
   assert_false (pull_consumer_admitted (guarded, NULL, NULL));
   assert_false (pull_consumer_admitted (guarded, "", NULL));
   /* session mode: NAME is admin's, DB.NAME another database's */
   assert_true (pull_consumer_admitted (guarded, "alice", "admin"));
   assert_false (pull_consumer_admitted (guarded, "alice", "shop"));
   assert_true (pull_consumer_admitted (guarded, "bob", "shop"));
   assert_false (pull_consumer_admitted (guarded, "bob", "admin"));
   assert_false (pull_consumer_admitted (guarded, "bob", "shopx"));
   /* A database name holds no '.', so DB.NAME splits at the first one. */
   assert_true (pull_consumer_admitted (guarded, "b.c", "a"));
   assert_false (pull_consumer_admitted (guarded, "alice", "$external"));
   config_release (cfg);
   bson_free (text);

   text = bson_strdup_printf ("%s", "[handler hooks]\nevents = x\nkind = webhook\nurl = http://127.0.0.1:9/x\nconsumers = alice\n");
   cfg = config_parse_string (text, "test.ini", &error);
   assert_null (cfg);
   assert_non_null (strstr (error.message, "consumers: the list is for kind = pull"));
   bson_free (text);
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_consumers_list),
      cmocka_unit_test (test_parses),          cmocka_unit_test (test_refused),
      cmocka_unit_test (test_error_text_cut),  cmocka_unit_test (test_is_command),
      cmocka_unit_test (test_lease_roundtrip), cmocka_unit_test (test_txn_fence),
      cmocka_unit_test (test_txn_failures),    cmocka_unit_test (test_txn_history),
      cmocka_unit_test (test_txn_attempt_records),
   };

   return cmocka_run_group_tests (tests, NULL, NULL);
}
