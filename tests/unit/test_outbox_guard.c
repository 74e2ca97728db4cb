/*
 * test_outbox_guard.c - which client commands write the outbox namespace:
 * a table of commands (Extended JSON) with the verdict for each, the
 * document-sequence form of bulkWrite's nsInfo, nesting limits, and a large
 * command walked once.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "publish/guard.h"

static const outbox_guard_ns_t NS = {"relaybus", "relaybus_"};

typedef struct {
   const char *json;
   bool refused;
   const char *why; /* the verdict's description, when refused */
} guard_case_t;

static const guard_case_t cases[] = {
   /* The CRUD writes, on every outbox collection. */
   {"{'insert': 'relaybus_events', '$db': 'relaybus'}", true, "insert on relaybus.relaybus_events"},
   {"{'insert': 'relaybus_deliveries', 'documents': [{}], '$db': 'relaybus'}", true, "insert on relaybus.relaybus_deliveries"},
   {"{'update': 'relaybus_key_sequences', 'updates': [], '$db': 'relaybus'}", true, "update on relaybus.relaybus_key_sequences"},
   {"{'delete': 'relaybus_lanes', 'deletes': [], '$db': 'relaybus'}", true, "delete on relaybus.relaybus_lanes"},
   {"{'delete': 'relaybus_completed_deliveries', '$db': 'relaybus'}", true, NULL},
   {"{'findAndModify': 'relaybus_deliveries', 'remove': true, '$db': 'relaybus'}", true, NULL},
   {"{'findandmodify': 'relaybus_deliveries', 'update': {}, '$db': 'relaybus'}", true, NULL},
   /* The same names elsewhere, other collections of the outbox database,
    * names that only start or end like them. */
   {"{'insert': 'relaybus_events', '$db': 'app'}", false, NULL},
   {"{'insert': 'orders', '$db': 'relaybus'}", false, NULL},
   {"{'insert': 'relaybus_events2', '$db': 'relaybus'}", false, NULL},
   {"{'insert': 'relaybus_event', '$db': 'relaybus'}", false, NULL},
   {"{'insert': 'events', '$db': 'relaybus'}", false, NULL},
   {"{'insert': 'relaybus_events', '$db': 'relaybusx'}", false, NULL},
   {"{'insert': 'relaybus_events', '$db': 'relaybu'}", false, NULL},
   /* No $db, or a collection name that is not a string: the server refuses
    * those itself. */
   {"{'insert': 'relaybus_events'}", false, NULL},
   {"{'insert': 1, '$db': 'relaybus'}", false, NULL},
   /* Reads stay allowed. */
   {"{'find': 'relaybus_events', 'filter': {}, '$db': 'relaybus'}", false, NULL},
   {"{'count': 'relaybus_events', '$db': 'relaybus'}", false, NULL},
   {"{'distinct': 'relaybus_deliveries', 'key': 'handler', '$db': 'relaybus'}", false, NULL},
   {"{'listIndexes': 'relaybus_deliveries', '$db': 'relaybus'}", false, NULL},
   {"{'listCollections': 1, '$db': 'relaybus'}", false, NULL},
   {"{'aggregate': 'relaybus_events', 'pipeline': [{'$match': {}}, {'$group': {'_id': null}}], '$db': 'relaybus'}", false, NULL},
   {"{'getMore': {'$numberLong': '1'}, 'collection': 'relaybus_events', '$db': 'relaybus'}", false, NULL},
   {"{'explain': {'delete': 'relaybus_events', 'deletes': []}, '$db': 'relaybus'}", false, NULL},
   /* aggregate writing out: $out and $merge, string and document forms,
    * from any collection of any database. */
   {"{'aggregate': 'orders', 'pipeline': [{'$match': {}}, {'$out': 'relaybus_events'}], '$db': 'relaybus'}", true,
    "aggregate $out into relaybus.relaybus_events"},
   {"{'aggregate': 'orders', 'pipeline': [{'$out': {'db': 'relaybus', 'coll': 'relaybus_deliveries'}}], '$db': 'app'}", true,
    "aggregate $out into relaybus.relaybus_deliveries"},
   {"{'aggregate': 'orders', 'pipeline': [{'$out': {'coll': 'relaybus_deliveries'}}], '$db': 'relaybus'}", true, NULL},
   {"{'aggregate': 'orders', 'pipeline': [{'$out': {'db': 'app', 'coll': 'relaybus_deliveries'}}], '$db': 'relaybus'}", false, NULL},
   {"{'aggregate': 'orders', 'pipeline': [{'$out': 'relaybus_events'}], '$db': 'app'}", false, NULL},
   {"{'aggregate': 1, 'pipeline': [{'$documents': [{}]}, {'$merge': 'relaybus_lanes'}], '$db': 'relaybus'}", true,
    "aggregate $merge into relaybus.relaybus_lanes"},
   {"{'aggregate': 'orders', 'pipeline': [{'$merge': {'into': 'relaybus_events', 'on': '_id'}}], '$db': 'relaybus'}", true, NULL},
   {"{'aggregate': 'orders', 'pipeline': [{'$merge': {'into': {'db': 'relaybus', 'coll': 'relaybus_events'}}}], '$db': 'app'}", true,
    "aggregate $merge into relaybus.relaybus_events"},
   {"{'aggregate': 'orders', 'pipeline': [{'$merge': {'into': {'coll': 'relaybus_events'}}}], '$db': 'relaybus'}", true, NULL},
   {"{'aggregate': 'orders', 'pipeline': [{'$merge': {'into': 'orders2'}}], '$db': 'relaybus'}", false, NULL},
   {"{'aggregate': 'relaybus_events', 'pipeline': [{'$out': 'copy'}], '$db': 'relaybus'}", false, NULL},
   /* mapReduce's out. */
   {"{'mapReduce': 'orders', 'map': 'f', 'reduce': 'g', 'out': 'relaybus_events', '$db': 'relaybus'}", true,
    "mapReduce out into relaybus.relaybus_events"},
   {"{'mapreduce': 'orders', 'out': {'merge': 'relaybus_events', 'db': 'relaybus'}, '$db': 'app'}", true, NULL},
   {"{'mapReduce': 'orders', 'out': {'db': 'relaybus', 'reduce': 'relaybus_deliveries'}, '$db': 'app'}", true, NULL},
   {"{'mapReduce': 'orders', 'out': {'replace': 'relaybus_events'}, '$db': 'relaybus'}", true, NULL},
   {"{'mapReduce': 'orders', 'out': {'replace': 'relaybus_events'}, '$db': 'app'}", false, NULL},
   {"{'mapReduce': 'relaybus_events', 'out': {'inline': 1}, '$db': 'relaybus'}", false, NULL},
   /* Collection and database administration. */
   {"{'drop': 'relaybus_events', '$db': 'relaybus'}", true, "drop on relaybus.relaybus_events"},
   {"{'dropDatabase': 1, '$db': 'relaybus'}", true, "dropDatabase of relaybus"},
   {"{'dropDatabase': 1, '$db': 'app'}", false, NULL},
   {"{'create': 'relaybus_events', '$db': 'relaybus'}", true, NULL},
   {"{'create': 'relaybus_lanes', 'viewOn': 'orders', 'pipeline': [], '$db': 'relaybus'}", true, NULL},
   {"{'create': 'eventsView', 'viewOn': 'relaybus_events', 'pipeline': [], '$db': 'relaybus'}", false, NULL},
   {"{'createIndexes': 'relaybus_deliveries', 'indexes': [], '$db': 'relaybus'}", true, NULL},
   {"{'dropIndexes': 'relaybus_deliveries', 'index': '*', '$db': 'relaybus'}", true, NULL},
   {"{'deleteIndexes': 'relaybus_deliveries', 'index': '*', '$db': 'relaybus'}", true, NULL},
   {"{'collMod': 'relaybus_events', 'validator': {}, '$db': 'relaybus'}", true, "collMod on relaybus.relaybus_events"},
   {"{'convertToCapped': 'relaybus_events', 'size': 4096, '$db': 'relaybus'}", true, NULL},
   {"{'emptycapped': 'relaybus_events', '$db': 'relaybus'}", true, NULL},
   {"{'cloneCollectionAsCapped': 'orders', 'toCollection': 'relaybus_events', 'size': 1, '$db': 'relaybus'}", true, NULL},
   {"{'cloneCollectionAsCapped': 'relaybus_events', 'toCollection': 'copy', 'size': 1, '$db': 'relaybus'}", false, NULL},
   {"{'renameCollection': 'relaybus.relaybus_events', 'to': 'relaybus.old', '$db': 'admin'}", true,
    "renameCollection from relaybus.relaybus_events"},
   {"{'renameCollection': 'app.orders', 'to': 'relaybus.relaybus_deliveries', 'dropTarget': true, '$db': 'admin'}", true,
    "renameCollection to relaybus.relaybus_deliveries"},
   {"{'renameCollection': 'app.orders', 'to': 'app.orders2', '$db': 'admin'}", false, NULL},
   /* bulkWrite (8.0): any namespace of nsInfo. */
   {"{'bulkWrite': 1, 'ops': [{'insert': 1, 'document': {}}], 'nsInfo': [{'ns': 'app.orders'}, {'ns': 'relaybus.relaybus_events'}], "
    "'$db': 'admin'}",
    true, "bulkWrite on relaybus.relaybus_events"},
   {"{'bulkWrite': 1, 'ops': [], 'nsInfo': [{'ns': 'app.orders'}, {'ns': 'relaybus.other'}, {'ns': 'nodot'}], '$db': 'admin'}", false,
    NULL},
   /* applyOps: operations' namespaces, and the commands it carries. */
   {"{'applyOps': [{'op': 'i', 'ns': 'app.orders', 'o': {}}, {'op': 'i', 'ns': 'relaybus.relaybus_events', 'o': {}}], '$db': 'admin'}",
    true, "applyOps on relaybus.relaybus_events"},
   {"{'applyOps': [{'op': 'c', 'ns': 'relaybus.$cmd', 'o': {'drop': 'relaybus_deliveries'}}], '$db': 'admin'}", true,
    "drop on relaybus.relaybus_deliveries"},
   {"{'applyOps': [{'op': 'c', 'ns': 'app.$cmd', 'o': {'drop': 'relaybus_deliveries'}}], '$db': 'admin'}", false, NULL},
   {"{'applyOps': [{'op': 'c', 'ns': 'admin.$cmd', 'o': {'applyOps': [{'op': 'u', 'ns': 'relaybus.relaybus_lanes', 'o': {}}]}}], "
    "'$db': 'admin'}",
    true, NULL},
   {"{'applyOps': [{'op': 'i', 'ns': 'app.orders', 'o': {}}, {'op': 'c', 'ns': 'app.$cmd', 'o': {'create': 'x'}}], '$db': 'admin'}",
    false, NULL},
   /* Commands that write but not a named collection, and odd shapes. */
   {"{'ping': 1, '$db': 'relaybus'}", false, NULL},
   {"{'$db': 'relaybus'}", false, NULL},
   {"{}", false, NULL},
   {"{'aggregate': 'orders', 'pipeline': 'x', '$db': 'relaybus'}", false, NULL},
   {"{'aggregate': 'orders', 'pipeline': [1, {}, {'$out': 3}], '$db': 'relaybus'}", false, NULL},
};

static bson_t *
doc (const char *json)
{
   char buf[4096];
   bson_error_t error;
   bson_t *b;
   size_t i;

   /* Single quotes in the table read better; JSON wants double quotes. */
   for (i = 0; json[i] && i < sizeof buf - 1; i++)
      buf[i] = json[i] == '\'' ? '"' : json[i];
   buf[i] = '\0';
   b = bson_new_from_json ((const uint8_t *) buf, -1, &error);
   if (!b)
      fail_msg ("bad test JSON %s: %s", buf, error.message);
   return b;
}

static void
test_table (void **state)
{
   for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      bson_t *b = doc (cases[i].json);
      char why[OUTBOX_GUARD_WHY_MAX];
      bool refused = outbox_guard_writes (b, NULL, 0, &NS, why, sizeof why);

      if (refused != cases[i].refused)
         fail_msg ("case %zu %s: %s", i, cases[i].json, refused ? why : "not refused");
      if (refused && cases[i].why)
         assert_string_equal (why, cases[i].why);
      if (!refused)
         assert_string_equal (why, "");
      /* The verdict does not depend on wanting a description. */
      assert_true (outbox_guard_writes (b, NULL, 0, &NS, NULL, 0) == cases[i].refused);
      bson_destroy (b);
   }
}

/* Another database and prefix, and an empty prefix. */
static void
test_namespace (void **state)
{
   const outbox_guard_ns_t other = {"app", "ob."}, bare = {"app", ""};
   bson_t *b;

   b = doc ("{'insert': 'ob.events', '$db': 'app'}");
   assert_true (outbox_guard_writes (b, NULL, 0, &other, NULL, 0));
   assert_false (outbox_guard_writes (b, NULL, 0, &NS, NULL, 0));
   assert_false (outbox_guard_writes (b, NULL, 0, &bare, NULL, 0));
   bson_destroy (b);
   b = doc ("{'insert': 'events', '$db': 'app'}");
   assert_true (outbox_guard_writes (b, NULL, 0, &bare, NULL, 0));
   assert_false (outbox_guard_writes (b, NULL, 0, &other, NULL, 0));
   bson_destroy (b);
   b = doc ("{'renameCollection': 'app.ob.lanes', 'to': 'app.x', '$db': 'admin'}");
   assert_true (outbox_guard_writes (b, NULL, 0, &other, NULL, 0));
   bson_destroy (b);
   assert_true (outbox_guard_is_outbox (&NS, "relaybus", 8, "relaybus_events", 15));
   assert_false (outbox_guard_is_outbox (&NS, "relaybus", 8, "relaybus_events", 14));
   assert_false (outbox_guard_is_outbox (&NS, "relaybus", 7, "relaybus_events", 15));
}

/* Drivers send bulkWrite's nsInfo (and ops) as kind-1 document sequences. */
static void
test_bulkwrite_sequence (void **state)
{
   bson_t *body = doc ("{'bulkWrite': 1, 'errorsOnly': true, '$db': 'admin'}");
   bson_t *a = doc ("{'ns': 'app.orders'}"), *b = doc ("{'ns': 'relaybus.relaybus_deliveries'}");
   uint8_t buf[256];
   wire_sequence_t seq[2];
   char why[OUTBOX_GUARD_WHY_MAX];

   memcpy (buf, bson_get_data (a), a->len);
   memcpy (buf + a->len, bson_get_data (b), b->len);
   seq[0] = (wire_sequence_t){.identifier = "ops", .docs = bson_get_data (a), .docs_len = a->len, .ndocs = 1};
   seq[1] = (wire_sequence_t){.identifier = "nsInfo", .docs = buf, .docs_len = a->len + b->len, .ndocs = 2};
   assert_true (outbox_guard_writes (body, seq, 2, &NS, why, sizeof why));
   assert_string_equal (why, "bulkWrite on relaybus.relaybus_deliveries");
   /* Only the first namespace: not the outbox. */
   seq[1].docs_len = a->len;
   seq[1].ndocs = 1;
   assert_false (outbox_guard_writes (body, seq, 2, &NS, why, sizeof why));
   /* A truncated document is not read past its end. */
   seq[1].docs_len = a->len + 4;
   assert_false (outbox_guard_writes (body, seq, 2, &NS, why, sizeof why));
   /* The "ops" sequence is not mistaken for nsInfo. */
   seq[0].docs = bson_get_data (b);
   seq[0].docs_len = b->len;
   assert_false (outbox_guard_writes (body, seq, 1, &NS, why, sizeof why));
   bson_destroy (body);
   bson_destroy (a);
   bson_destroy (b);
}

/* applyOps nested deeper than the guard walks is refused, not walked. */
static void
test_nesting (void **state)
{
   bson_t *inner = doc ("{'applyOps': [{'op': 'i', 'ns': 'app.orders', 'o': {}}]}");

   for (int depth = 1; depth <= 6; depth++) {
      bson_t *outer = bson_new (), ops, op;

      BSON_APPEND_ARRAY_BEGIN (outer, "applyOps", &ops);
      BSON_APPEND_DOCUMENT_BEGIN (&ops, "0", &op);
      BSON_APPEND_UTF8 (&op, "op", "c");
      BSON_APPEND_UTF8 (&op, "ns", "admin.$cmd");
      BSON_APPEND_DOCUMENT (&op, "o", inner);
      bson_append_document_end (&ops, &op);
      bson_append_array_end (outer, &ops);
      BSON_APPEND_UTF8 (outer, "$db", "admin");
      /* depth+1 levels of applyOps in all: up to 4 are walked. */
      assert_true (outbox_guard_writes (outer, NULL, 0, &NS, NULL, 0) == (depth + 1 > 4));
      bson_destroy (inner);
      inner = outer;
      /* The next level nests this one, without its $db. */
      {
         bson_t *copy = bson_new ();
         bson_iter_t it;

         bson_iter_init (&it, inner);
         while (bson_iter_next (&it)) {
            if (strcmp (bson_iter_key (&it), "$db") != 0)
               bson_append_iter (copy, NULL, 0, &it);
         }
         bson_destroy (inner);
         inner = copy;
      }
   }
   bson_destroy (inner);
}

/* A large pipeline with $out at its end: found, in one pass. */
static void
test_large (void **state)
{
   enum { STAGES = 200000 };
   bson_t *b = bson_new (), arr, stage, match;
   char key[16];
   const char *k;

   BSON_APPEND_UTF8 (b, "aggregate", "orders");
   BSON_APPEND_ARRAY_BEGIN (b, "pipeline", &arr);
   for (uint32_t i = 0; i < STAGES; i++) {
      bson_uint32_to_string (i, &k, key, sizeof key);
      BSON_APPEND_DOCUMENT_BEGIN (&arr, k, &stage);
      BSON_APPEND_DOCUMENT_BEGIN (&stage, "$match", &match);
      bson_append_document_end (&stage, &match);
      bson_append_document_end (&arr, &stage);
   }
   bson_uint32_to_string (STAGES, &k, key, sizeof key);
   BSON_APPEND_DOCUMENT_BEGIN (&arr, k, &stage);
   BSON_APPEND_UTF8 (&stage, "$out", "relaybus_events");
   bson_append_document_end (&arr, &stage);
   bson_append_array_end (b, &arr);
   BSON_APPEND_UTF8 (b, "$db", "relaybus");
   assert_true (outbox_guard_writes (b, NULL, 0, &NS, NULL, 0));
   bson_destroy (b);
}

/* Which commands read an outbox collection's documents (outbox_guard_reads):
 * the collection commands, every stage that reads another collection, change
 * streams of the outbox database and of the cluster, views, explain. */
static const guard_case_t read_cases[] = {
   {"{'find': 'relaybus_deliveries', 'filter': {}, '$db': 'relaybus'}", true, "find on relaybus.relaybus_deliveries"},
   {"{'count': 'relaybus_events', '$db': 'relaybus'}", true, "count on relaybus.relaybus_events"},
   {"{'distinct': 'relaybus_events', 'key': 'type', '$db': 'relaybus'}", true, NULL},
   {"{'mapReduce': 'relaybus_events', 'map': 'f', 'reduce': 'g', 'out': {'inline': 1}, '$db': 'relaybus'}", true, NULL},
   {"{'aggregate': 'relaybus_events', 'pipeline': [], 'cursor': {}, '$db': 'relaybus'}", true, "aggregate on relaybus.relaybus_events"},
   {"{'aggregate': 'relaybus_deliveries', 'pipeline': [{'$changeStream': {}}], '$db': 'relaybus'}", true, NULL},
   {"{'getMore': {'$numberLong': '7'}, 'collection': 'relaybus_events', '$db': 'relaybus'}", true, "getMore on relaybus.relaybus_events"},
   /* Stages that read another collection, at any depth. */
   {"{'aggregate': 'orders', 'pipeline': [{'$lookup': {'from': 'relaybus_events', 'localField': 'a', 'foreignField': 'b', 'as': 'x'}}], '$db': 'relaybus'}", true,
    "$lookup from relaybus.relaybus_events"},
   {"{'aggregate': 'orders', 'pipeline': [{'$lookup': {'from': {'db': 'relaybus', 'coll': 'relaybus_events'}, 'pipeline': [], 'as': 'x'}}], '$db': 'app'}", true, NULL},
   {"{'aggregate': 'orders', 'pipeline': [{'$lookup': {'from': 'orders', 'pipeline': [{'$unionWith': 'relaybus_deliveries'}], 'as': 'x'}}], '$db': 'relaybus'}", true,
    "$unionWith relaybus.relaybus_deliveries"},
   {"{'aggregate': 'orders', 'pipeline': [{'$unionWith': {'coll': 'relaybus_events', 'pipeline': []}}], '$db': 'relaybus'}", true, NULL},
   {"{'aggregate': 'orders', 'pipeline': [{'$unionWith': {'coll': 'orders', 'pipeline': [{'$lookup': {'from': 'relaybus_lanes', 'as': 'l', 'pipeline': []}}]}}], '$db': 'relaybus'}", true, NULL},
   {"{'aggregate': 'orders', 'pipeline': [{'$graphLookup': {'from': 'relaybus_events', 'startWith': 1, 'connectFromField': 'a', 'connectToField': 'b', 'as': 'x'}}], '$db': 'relaybus'}", true,
    "$graphLookup from relaybus.relaybus_events"},
   {"{'aggregate': 'orders', 'pipeline': [{'$facet': {'a': [{'$match': {}}], 'b': [{'$unionWith': 'relaybus_events'}]}}], '$db': 'relaybus'}", true, NULL},
   {"{'aggregate': 1, 'pipeline': [{'$documents': [{}]}, {'$unionWith': 'relaybus_events'}], '$db': 'relaybus'}", true, NULL},
   /* Change streams over every collection of the outbox database, or of the cluster. */
   {"{'aggregate': 1, 'pipeline': [{'$changeStream': {}}], 'cursor': {}, '$db': 'relaybus'}", true, "a change stream on database relaybus"},
   {"{'aggregate': 1, 'pipeline': [{'$changeStream': {'allChangesForCluster': true}}], 'cursor': {}, '$db': 'admin'}", true, NULL},
   {"{'aggregate': 1, 'pipeline': [{'$changeStream': {}}], 'cursor': {}, '$db': 'app'}", false, NULL},
   {"{'aggregate': 'orders', 'pipeline': [{'$changeStream': {}}], '$db': 'relaybus'}", false, NULL},
   /* A view that reads the outbox, and explain of a read. */
   {"{'create': 'v', 'viewOn': 'relaybus_events', 'pipeline': [], '$db': 'relaybus'}", true, "a view on relaybus.relaybus_events"},
   {"{'create': 'v', 'viewOn': 'orders', 'pipeline': [{'$unionWith': 'relaybus_events'}], '$db': 'relaybus'}", true, NULL},
   {"{'collMod': 'v', 'viewOn': 'relaybus_deliveries', 'pipeline': [], '$db': 'relaybus'}", true, NULL},
   {"{'create': 'plain', '$db': 'relaybus'}", false, NULL},
   {"{'explain': {'find': 'relaybus_events', 'filter': {}}, 'verbosity': 'executionStats', '$db': 'relaybus'}", true, "find on relaybus.relaybus_events"},
   {"{'explain': {'aggregate': 'orders', 'pipeline': [{'$lookup': {'from': 'relaybus_events', 'as': 'x', 'pipeline': []}}]}, '$db': 'relaybus'}", true, NULL},
   /* Not the outbox: other collections and databases, and what reads no documents. */
   {"{'find': 'orders', 'filter': {}, '$db': 'relaybus'}", false, NULL},
   {"{'find': 'relaybus_events', 'filter': {}, '$db': 'app'}", false, NULL},
   {"{'find': 'relaybus_events2', '$db': 'relaybus'}", false, NULL},
   {"{'aggregate': 'orders', 'pipeline': [{'$lookup': {'from': 'items', 'as': 'x', 'localField': 'a', 'foreignField': 'b'}}], '$db': 'relaybus'}", false, NULL},
   {"{'getMore': {'$numberLong': '7'}, 'collection': 'orders', '$db': 'relaybus'}", false, NULL},
   {"{'listIndexes': 'relaybus_deliveries', '$db': 'relaybus'}", false, NULL},
   {"{'listCollections': 1, '$db': 'relaybus'}", false, NULL},
   {"{'insert': 'relaybus_events', '$db': 'relaybus'}", false, NULL},
   {"{'ping': 1, '$db': 'relaybus'}", false, NULL},
   {"{}", false, NULL},
};

static void
test_reads (void **state)
{
   (void) state;
   for (size_t i = 0; i < sizeof read_cases / sizeof read_cases[0]; i++) {
      bson_t *b = doc (read_cases[i].json);
      char why[OUTBOX_GUARD_WHY_MAX];
      bool reads = outbox_guard_reads (b, &NS, why, sizeof why);

      if (reads != read_cases[i].refused)
         fail_msg ("read case %zu %s: %s", i, read_cases[i].json, reads ? why : "not a read of the outbox");
      if (reads && read_cases[i].why)
         assert_string_equal (why, read_cases[i].why);
      assert_true (outbox_guard_reads (b, &NS, NULL, 0) == read_cases[i].refused);
      bson_destroy (b);
   }
}

/* Pipelines nested past the limit count as a read rather than being walked. */
static void
test_reads_nesting (void **state)
{
   char json[4096] = "{'aggregate': 'orders', 'pipeline': [";
   char why[OUTBOX_GUARD_WHY_MAX];
   bson_t *b;

   (void) state;
   for (int i = 0; i < 12; i++)
      strcat (json, "{'$facet': {'a': [");
   strcat (json, "{'$match': {}}");
   for (int i = 0; i < 12; i++)
      strcat (json, "]}}");
   strcat (json, "], '$db': 'app'}");
   b = doc (json);
   assert_true (outbox_guard_reads (b, &NS, why, sizeof why));
   assert_non_null (strstr (why, "nested more than"));
   bson_destroy (b);
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_table),
      cmocka_unit_test (test_namespace),
      cmocka_unit_test (test_bulkwrite_sequence),
      cmocka_unit_test (test_nesting),
      cmocka_unit_test (test_large),
      cmocka_unit_test (test_reads),
      cmocka_unit_test (test_reads_nesting),
   };

   return cmocka_run_group_tests (tests, NULL, NULL);
}
