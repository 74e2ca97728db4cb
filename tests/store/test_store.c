/*
 * test_store.c - the store against the server double, one
 * test per rule of the store (docs/outbox-schema.md, and the semantics of
 * the @relaybus/mongodb package it follows), named after it.
 *
 * Each test starts its own double and database, writes events and
 * deliveries itself with mongoc (documents as docs/outbox-schema.md), and
 * drives one or two store instances with an explicit clock.
 */
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <mongoc/mongoc.h>

#include "double.h"
#include "base/log.h"
#include "base/outbox.h"
#include "base/fleet.h"
#include "store/store.h"
#include "store/fleet.h"
#include "store/ops.h"
#include "store/attempts.h"

#ifndef RELAYBUS_TOP_SRCDIR
#define RELAYBUS_TOP_SRCDIR "."
#endif

#define T0 1700000000000LL
#define LEASE 30000

typedef struct {
   test_double_t dbl;
   mongoc_uri_t *uri;
   mongoc_client_pool_t *pool;
   mongoc_client_t *client;
   char db[64];
   store_t *a, *b;
   bool history;
   int64_t attempts_ms; /* [outbox] attempt_history of the instances; 0: none */
} fx_t;

static int test_no;

static store_t *
new_store (fx_t *fx, const char *owner)
{
   store_opts_t o = {.database = fx->db,
                     .prefix = "relaybus_",
                     .completion_history = fx->history,
                     .owner = owner,
                     .attempt_history_ms = fx->attempts_ms};
   bson_error_t err;
   store_t *s = store_new (fx->pool, &o, &err);
   if (!s)
      fail_msg ("store_new: %s", err.message);
   return s;
}

static int
setup_with_attempts (void **state, bool history, int64_t attempts_ms)
{
   fx_t *fx = calloc (1, sizeof *fx);
   bson_error_t err;

   if (!double_start (&fx->dbl, RELAYBUS_TOP_SRCDIR)) {
      free (fx);
      return -1;
   }
   fx->uri = mongoc_uri_new_with_error (fx->dbl.uri, &err);
   if (!fx->uri) {
      fprintf (stderr, "uri %s: %s\n", fx->dbl.uri, err.message);
      return -1;
   }
   fx->pool = mongoc_client_pool_new (fx->uri);
   mongoc_client_pool_set_error_api (fx->pool, MONGOC_ERROR_API_VERSION_2);
   fx->client = mongoc_client_new_from_uri (fx->uri);
   mongoc_client_set_error_api (fx->client, MONGOC_ERROR_API_VERSION_2);
   snprintf (fx->db, sizeof fx->db, "store_test_%d_%d", (int) getpid (), ++test_no);
   fx->history = history;
   fx->attempts_ms = attempts_ms;
   fx->a = new_store (fx, "host/1/aaaa");
   fx->b = new_store (fx, "host/2/bbbb");
   /* As the dispatcher's instances: a second's completions write their
    * events' completion times together (with attempt history). */
   store_set_completion_times_by_second (fx->a, true);
   store_set_completion_times_by_second (fx->b, true);
   if (!store_setup (fx->a, &err)) {
      fprintf (stderr, "store_setup: %s\n", err.message);
      return -1;
   }
   *state = fx;
   return 0;
}

static int
setup_with (void **state, bool history)
{
   return setup_with_attempts (state, history, 0);
}

static int
setup (void **state)
{
   return setup_with (state, false);
}

/* Attempt history on, for an hour. */
static int
setup_attempts (void **state)
{
   return setup_with_attempts (state, false, 3600000);
}

static int
setup_attempts_history (void **state)
{
   return setup_with_attempts (state, true, 3600000);
}

static int
setup_history (void **state)
{
   return setup_with (state, true);
}

static int
teardown (void **state)
{
   fx_t *fx = *state;
   if (!fx)
      return 0;
   store_destroy (fx->a);
   store_destroy (fx->b);
   mongoc_client_destroy (fx->client);
   mongoc_client_pool_destroy (fx->pool);
   mongoc_uri_destroy (fx->uri);
   double_stop (&fx->dbl);
   free (fx);
   return 0;
}

static mongoc_collection_t *
coll (fx_t *fx, outbox_collection_t c)
{
   char name[OUTBOX_NAME_MAX];
   assert_true (outbox_collection_name ("relaybus_", c, name, sizeof name));
   return mongoc_client_get_collection (fx->client, fx->db, name);
}

/* Writes an event (once) and its delivery for `handler`, as the publisher
 * would; returns the delivery id. */
static bson_oid_t
add (fx_t *fx, const char *event_id, const char *handler, const char *key, int64_t seq, int64_t due)
{
   mongoc_collection_t *ev = coll (fx, OUTBOX_EVENTS), *del = coll (fx, OUTBOX_DELIVERIES);
   bson_t *sel = BCON_NEW ("_id", BCON_UTF8 (event_id));
   bson_t upd = BSON_INITIALIZER, set, d = BSON_INITIALIZER;
   bson_t *opts = BCON_NEW ("upsert", BCON_BOOL (true));
   bson_error_t err;
   bson_oid_t id;

   BSON_APPEND_DOCUMENT_BEGIN (&upd, "$setOnInsert", &set);
   BSON_APPEND_UTF8 (&set, "type", "order.placed.v1");
   BSON_APPEND_DOCUMENT (&set, "payload", &(bson_t) BSON_INITIALIZER);
   if (key) {
      BSON_APPEND_UTF8 (&set, "key", key);
      BSON_APPEND_INT64 (&set, "sequence", seq);
   }
   BSON_APPEND_DATE_TIME (&set, "createdAt", due);
   bson_append_document_end (&upd, &set);
   BSON_APPEND_DOCUMENT_BEGIN (&upd, "$addToSet", &set);
   BSON_APPEND_UTF8 (&set, "handlers", handler);
   bson_append_document_end (&upd, &set);
   if (!mongoc_collection_update_one (ev, sel, &upd, opts, NULL, &err))
      fail_msg ("event: %s", err.message);

   bson_oid_init (&id, NULL);
   BSON_APPEND_OID (&d, "_id", &id);
   BSON_APPEND_UTF8 (&d, "eventId", event_id);
   BSON_APPEND_UTF8 (&d, "handler", handler);
   BSON_APPEND_UTF8 (&d, "eventType", "order.placed.v1");
   if (key) {
      BSON_APPEND_UTF8 (&d, "key", key);
      BSON_APPEND_INT64 (&d, "sequence", seq);
   }
   BSON_APPEND_INT32 (&d, "laneId", (int32_t) outbox_lane_id (key, event_id));
   BSON_APPEND_UTF8 (&d, "lane", "ready");
   BSON_APPEND_UTF8 (&d, "status", "pending");
   BSON_APPEND_INT32 (&d, "attempts", 0);
   BSON_APPEND_INT32 (&d, "claims", 0);
   BSON_APPEND_DATE_TIME (&d, "dueAt", due);
   BSON_APPEND_DATE_TIME (&d, "createdAt", due);
   if (!mongoc_collection_insert_one (del, &d, NULL, NULL, &err))
      fail_msg ("delivery: %s", err.message);
   bson_destroy (sel);
   bson_destroy (opts);
   bson_destroy (&upd);
   bson_destroy (&d);
   mongoc_collection_destroy (ev);
   mongoc_collection_destroy (del);
   return id;
}

static void
claim (store_t *s, const char *handler, size_t limit, int64_t now, store_batch_t *b)
{
   store_claim_handler_t h = {handler, limit};
   store_claim_opts_t o = {&h, 1, limit, now, LEASE};
   bson_error_t err;

   if (!store_claim (s, &o, b, &err))
      fail_msg ("claim: %s", err.message);
}

/* The delivery document, or NULL if it is gone.  Caller destroys it. */
static bson_t *
get (fx_t *fx, const bson_oid_t *id)
{
   mongoc_collection_t *del = coll (fx, OUTBOX_DELIVERIES);
   bson_t *q = BCON_NEW ("_id", BCON_OID (id));
   mongoc_cursor_t *cur = mongoc_collection_find_with_opts (del, q, NULL, NULL);
   const bson_t *doc;
   bson_t *out = NULL;

   if (mongoc_cursor_next (cur, &doc))
      out = bson_copy (doc);
   mongoc_cursor_destroy (cur);
   bson_destroy (q);
   mongoc_collection_destroy (del);
   return out;
}

static int64_t
field (const bson_t *doc, const char *name)
{
   bson_iter_t it;
   if (doc && bson_iter_init_find (&it, doc, name)) {
      if (BSON_ITER_HOLDS_DATE_TIME (&it))
         return bson_iter_date_time (&it);
      if (BSON_ITER_HOLDS_NUMBER (&it))
         return bson_iter_as_int64 (&it);
   }
   return -1;
}

static const char *
sfield (const bson_t *doc, const char *name)
{
   bson_iter_t it;
   if (doc && bson_iter_init_find (&it, doc, name) && BSON_ITER_HOLDS_UTF8 (&it))
      return bson_iter_utf8 (&it, NULL);
   return NULL;
}

static int64_t
count (fx_t *fx, outbox_collection_t c, const char *json)
{
   mongoc_collection_t *cl = coll (fx, c);
   bson_error_t err;
   bson_t *q = bson_new_from_json ((const uint8_t *) json, -1, &err);
   int64_t n;

   assert_non_null (q);
   n = mongoc_collection_count_documents (cl, q, NULL, NULL, NULL, &err);
   if (n < 0)
      fail_msg ("count: %s", err.message);
   bson_destroy (q);
   mongoc_collection_destroy (cl);
   return n;
}

static store_ref_t
ref (const store_delivery_t *d)
{
   store_ref_t r = {d->id, d->lease, d->event_id};
   return r;
}

static bool
complete1 (store_t *s, const store_delivery_t *d, int64_t now)
{
   store_ref_t r = ref (d);
   bool done = false;
   bson_error_t err;
   if (!store_complete (s, &r, now, &done, &err))
      fail_msg ("complete: %s", err.message);
   return done;
}

static const store_delivery_t *
find_seq (const store_batch_t *b, const char *key, int64_t seq)
{
   for (size_t i = 0; i < b->n; i++)
      if (b->items[i].key && !strcmp (b->items[i].key, key) && b->items[i].sequence == seq)
         return &b->items[i];
   return NULL;
}

static const store_delivery_t *
find_event (const store_batch_t *b, const char *event_id)
{
   for (size_t i = 0; i < b->n; i++)
      if (!strcmp (b->items[i].event_id, event_id))
         return &b->items[i];
   fail_msg ("no delivery of %s in the batch", event_id);
   return NULL;
}

/* The first page of a listing (store_list_page from the start). */
static bool
list_first (store_t *s, const store_list_filter_t *f, bson_t *out, bson_error_t *err)
{
   bool more;
   return store_list_page (s, f, 0, NULL, out, &more, err);
}

/* The _id of the i-th document of a listing's array, and its createdAt. */
static bson_oid_t
page_id (const bson_t *page, uint32_t i, int64_t *created)
{
   char key[16];
   bson_iter_t it, doc;
   bson_oid_t id;

   snprintf (key, sizeof key, "%u", i);
   if (!bson_iter_init_find (&it, page, key) || !BSON_ITER_HOLDS_DOCUMENT (&it) || !bson_iter_recurse (&it, &doc))
      fail_msg ("listing has no document %u", i);
   memset (&id, 0, sizeof id);
   if (created)
      *created = -1;
   while (bson_iter_next (&doc)) {
      if (!strcmp (bson_iter_key (&doc), "_id") && BSON_ITER_HOLDS_OID (&doc))
         bson_oid_copy (bson_iter_oid (&doc), &id);
      if (created && !strcmp (bson_iter_key (&doc), "createdAt") && BSON_ITER_HOLDS_DATE_TIME (&doc))
         *created = bson_iter_date_time (&doc);
   }
   return id;
}

/* A string field of the i-th document of a listing's array. */
static const char *
page_str (const bson_t *page, uint32_t i, const char *name)
{
   char key[16];
   bson_iter_t it, doc;

   snprintf (key, sizeof key, "%u", i);
   if (bson_iter_init_find (&it, page, key) && BSON_ITER_HOLDS_DOCUMENT (&it) && bson_iter_recurse (&it, &doc) &&
       bson_iter_find (&doc, name) && BSON_ITER_HOLDS_UTF8 (&doc))
      return bson_iter_utf8 (&doc, NULL);
   return NULL;
}

/* ------------------------------------------------------------- the tests */

/* Claim order: the oldest due first, (dueAt, _id); nothing not yet due; a
 * claim holds only as many lanes as its batch needs. */
static void
test_claim_takes_the_oldest_due_deliveries_first (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0};
   bson_oid_t ids[6];
   char ev[32];

   for (int i = 0; i < 6; i++) {
      snprintf (ev, sizeof ev, "ev-%d", i);
      ids[i] = add (fx, ev, "h", NULL, 0, T0 - 1000 * (6 - i) + (i == 5 ? 11000 : 0));
   }
   claim (fx->a, "h", 3, T0, &b);
   assert_int_equal (b.n, 3);
   for (int i = 0; i < 3; i++) {
      assert_true (bson_oid_equal (&b.items[i].id, &ids[i]));
      assert_int_equal (b.items[i].attempt, 1);
      assert_non_null (b.items[i].event);
      assert_string_equal (sfield (b.items[i].event, "type"), "order.placed.v1");
   }
   /* Three unkeyed events are in (at most) three lanes; the rest went back. */
   assert_true (store_lanes_held (fx->a, T0) <= 3);
   store_batch_clear (&b);

   /* The next claim takes the remaining due ones, not the one due later. */
   claim (fx->a, "h", 10, T0, &b);
   assert_int_equal (b.n, 2);
   assert_true (bson_oid_equal (&b.items[0].id, &ids[3]));
   assert_true (bson_oid_equal (&b.items[1].id, &ids[4]));
   store_batch_clear (&b);

   /* A second worker sees nothing of the lanes the first holds. */
   claim (fx->b, "h", 10, T0 + 10000, &b);
   assert_int_equal (b.n, 1);
   assert_true (bson_oid_equal (&b.items[0].id, &ids[5]));
   store_batch_clear (&b);
}

/* Per-key order: only the lowest pending sequence, one at a time. */
static void
test_per_key_order (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0};
   char ev[32];

   for (int i = 1; i <= 3; i++) {
      snprintf (ev, sizeof ev, "k-%d", i);
      add (fx, ev, "h", "order-1", i, T0 - 5000 + i);
   }
   add (fx, "other", "h", "order-2", 1, T0 - 1000);
   claim (fx->a, "h", 10, T0, &b);
   assert_int_equal (b.n, 2);
   assert_non_null (find_seq (&b, "order-1", 1));
   assert_non_null (find_seq (&b, "order-2", 1));
   {
      store_batch_t again = {0};
      /* seq 1 runs: nothing more of order-1 */
      claim (fx->a, "h", 10, T0 + 1, &again);
      assert_int_equal (again.n, 0);
      store_batch_clear (&again);
   }
   assert_true (complete1 (fx->a, find_seq (&b, "order-1", 1), T0 + 2));
   store_batch_clear (&b);
   claim (fx->a, "h", 10, T0 + 3, &b);
   assert_int_equal (b.n, 1);
   assert_non_null (find_seq (&b, "order-1", 2));
   store_batch_clear (&b);
}

static void
claim_runs (store_t *s, const char *handler, size_t limit, size_t key_run, int64_t now, store_batch_t *b)
{
   store_claim_handler_t h = {handler, limit};
   store_claim_opts_t o = {&h, 1, limit, now, LEASE};
   bson_error_t err;

   o.key_run = key_run;
   if (!store_claim (s, &o, b, &err))
      fail_msg ("claim: %s", err.message);
}

/* With runs allowed, a claim takes the lowest pending deliveries of a key
 * together, in sequence order after the heads, only while they are proven
 * consecutive: a pending delivery that is not due (a retry) between them
 * ends the run, a lower pending one blocks the key, and the key gives
 * nothing more while its run is in flight. */
static void
test_key_runs_take_consecutive_sequences_only (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0};
   char ev[32];
   bool applied;
   bson_error_t err;

   for (int i = 1; i <= 6; i++) {
      snprintf (ev, sizeof ev, "r-%d", i);
      /* due in reverse order: the scan meets the followers first */
      add (fx, ev, "h", "order-1", i, T0 - 100 * i);
   }
   add (fx, "r-other", "h", "order-2", 1, T0 - 50);
   claim_runs (fx->a, "h", 10, 4, T0, &b);
   assert_int_equal (b.n, 5);
   /* the heads first, then the followers of order-1 in sequence order */
   {
      int64_t expect = 2;
      size_t heads = 0;
      for (size_t i = 0; i < b.n; i++)
         if (b.items[i].sequence == 1)
            heads++;
         else
            assert_int_equal (b.items[i].sequence, expect++);
      assert_int_equal (heads, 2);
      assert_int_equal (expect, 5);
      assert_int_equal (b.items[0].sequence, 1);
      assert_int_equal (b.items[1].sequence, 1);
   }
   /* nothing more of order-1 while its run is in flight */
   {
      store_batch_t again = {0};
      claim_runs (fx->a, "h", 10, 4, T0 + 1, &again);
      assert_int_equal (again.n, 0);
      store_batch_clear (&again);
   }
   /* 1 completes, 2 retries later, 3 and 4 are given back */
   for (size_t i = 0; i < b.n; i++) {
      store_ref_t r = ref (&b.items[i]);
      if (b.items[i].sequence == 1)
         assert_true (complete1 (fx->a, &b.items[i], T0 + 2));
      else if (b.items[i].sequence == 2)
         assert_true (store_reschedule (fx->a, &r, T0 + 2, T0 + 60000, "retry", &applied, &err) && applied);
      else
         assert_true (store_release (fx->a, &r, T0 + 2, &applied, &err) && applied);
   }
   store_batch_clear (&b);
   /* once 2 is due again: 2 with its proven followers 3, 4, 5 */
   claim_runs (fx->a, "h", 10, 4, T0 + 60001, &b);
   assert_int_equal (b.n, 4);
   for (size_t i = 0; i < b.n; i++)
      assert_int_equal (b.items[i].sequence, (int64_t) i + 2);
   store_batch_clear (&b);
}

/* A pending delivery that is not due between the candidates of a run ends
 * it at the head. */
static void
test_key_runs_stop_at_a_gap (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0};
   char ev[32];

   for (int i = 1; i <= 4; i++) {
      snprintf (ev, sizeof ev, "g-%d", i);
      add (fx, ev, "h", "order-1", i, i == 3 ? T0 + 60000 : T0 - 100 + i);
   }
   claim_runs (fx->a, "h", 10, 4, T0, &b);
   assert_int_equal (b.n, 1);
   assert_int_equal (b.items[0].sequence, 1);
   store_batch_clear (&b);
}

static int64_t commands_since (fx_t *fx, bson_t *by_name);

/* Event ids whose unkeyed deliveries all fall in one lane. */
static void
ids_in_lane (uint32_t lane, const char *prefix, int n, char (*out)[32])
{
   int found = 0;

   for (int i = 0; found < n; i++) {
      snprintf (out[found], sizeof out[found], "%s-%d", prefix, i);
      if (outbox_lane_id (NULL, out[found]) == lane)
         found++;
   }
}

/* A claim reads the due deliveries it needs in replies the server closes
 * itself: with hundreds due in its lane, a batch of 10 costs no getMore and
 * no killCursors, and the batch is the oldest due, in order. */
static void
test_claim_reads_what_its_batch_needs (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0};
   bson_t by_name = BSON_INITIALIZER;
   bson_iter_t it;
   char (*ids)[32] = bson_malloc (600 * sizeof *ids);

   ids_in_lane (7, "rb", 600, ids);
   for (int i = 0; i < 600; i++)
      add (fx, ids[i], "h", NULL, 0, T0 - 1000 + i);
   for (int round = 0; round < 2; round++) {
      commands_since (fx, NULL);
      claim (fx->a, "h", 10, T0 + round, &b);
      assert_int_equal (b.n, 10);
      for (size_t i = 0; i < b.n; i++)
         assert_string_equal (b.items[i].event_id, ids[round * 10 + (int) i]);
      commands_since (fx, &by_name);
      assert_false (bson_iter_init_find (&it, &by_name, "killCursors"));
      assert_false (bson_iter_init_find (&it, &by_name, "getMore"));
      bson_destroy (&by_name);
      bson_init (&by_name);
      store_batch_clear (&b);
   }
   bson_destroy (&by_name);
   bson_free (ids);
}

/* A claim whose first read is all blocked reads on, strictly after the
 * last (dueAt, _id) it read, also when every delivery is due at the same
 * time: 80 keys of one lane run, 640 next deliveries of theirs wait (more
 * than a first read), and the five unkeyed deliveries due with them
 * (inserted after them) are still found, once each. */
static void
test_claim_reads_on_past_what_waits (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0};
   char keys[80][32], ids[5][32], ev[64];
   const uint32_t lane = 11;
   int found = 0;

   for (int i = 0; found < 80; i++) {
      snprintf (keys[found], sizeof keys[found], "rk-%d", i);
      if (outbox_lane_id (keys[found], "x") == lane)
         found++;
   }
   ids_in_lane (lane, "ru", 5, ids);
   for (int k = 0; k < 80; k++) {
      snprintf (ev, sizeof ev, "%.31s-1", keys[k]);
      add (fx, ev, "h", keys[k], 1, T0 - 1000);
   }
   claim (fx->a, "h", 80, T0, &b);
   assert_int_equal (b.n, 80); /* every key runs its first delivery */
   store_batch_clear (&b);
   for (int seq = 2; seq <= 9; seq++)
      for (int k = 0; k < 80; k++) {
         snprintf (ev, sizeof ev, "%.31s-%d", keys[k], seq);
         add (fx, ev, "h", keys[k], seq, T0 - 500);
      }
   for (int i = 0; i < 5; i++)
      add (fx, ids[i], "h", NULL, 0, T0 - 500);
   commands_since (fx, NULL);
   claim (fx->a, "h", 5, T0 + 1, &b);
   assert_int_equal (b.n, 5);
   for (size_t i = 0; i < b.n; i++)
      assert_string_equal (b.items[i].event_id, ids[i]);
   store_batch_clear (&b);
   /* The lanes, two reads of the scan, the events. */
   bson_t by_name = BSON_INITIALIZER;
   bson_iter_t it;
   commands_since (fx, &by_name);
   assert_true (bson_iter_init_find (&it, &by_name, "find") && bson_iter_as_int64 (&it) == 4);
   assert_false (bson_iter_init_find (&it, &by_name, "getMore"));
   bson_destroy (&by_name);
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{\"lane\": \"parked\"}"), 0); /* one waits per key */
}

/* Unparking brings a key back as a run: once its predecessor finished, the
 * lowest parked delivery returns with the parked ones that follow it, up
 * to the claim's key run, and the claim takes them together, in order.
 * While the key's head waits for a retry nothing of it returns, and a lane
 * handed back meanwhile parks what it found waiting, as before; the head
 * then runs alone, and its followers come back as a run after it. */
static void
test_unparking_brings_back_a_run (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0};
   bson_error_t err;
   bool applied;
   char ev[32];
   const int n = 40;

   for (int i = 1; i <= n; i++) {
      snprintf (ev, sizeof ev, "ur-%d", i);
      add (fx, ev, "h", "run", i, T0 - 100000 + i);
   }
   claim_runs (fx->a, "h", 10, 4, T0, &b);
   assert_int_equal (b.n, 4);
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{\"lane\": \"parked\"}"), n - 4);
   for (size_t i = 0; i < b.n; i++)
      assert_true (complete1 (fx->a, &b.items[i], T0 + 1));
   store_batch_clear (&b);

   /* Seq 5 to 8 come back and run together. */
   claim_runs (fx->a, "h", 10, 4, T0 + 10, &b);
   assert_int_equal (b.n, 4);
   for (size_t i = 0; i < b.n; i++)
      assert_int_equal (b.items[i].sequence, 5 + (int64_t) i);
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{\"lane\": \"parked\"}"), n - 8);
   for (size_t i = 0; i < b.n; i++)
      assert_true (complete1 (fx->a, &b.items[i], T0 + 11));
   store_batch_clear (&b);

   /* Seq 9 to 12: 9 fails and waits for a retry, the rest are given back. */
   claim_runs (fx->a, "h", 10, 4, T0 + 20, &b);
   assert_int_equal (b.n, 4);
   assert_int_equal (b.items[0].sequence, 9);
   {
      store_ref_t r = ref (&b.items[0]);
      assert_true (store_reschedule (fx->a, &r, T0 + 21, T0 + 5000, "HTTP 503", &applied, &err));
      assert_true (applied);
      for (size_t i = 1; i < b.n; i++) {
         r = ref (&b.items[i]);
         assert_true (store_release (fx->a, &r, T0 + 21, &applied, &err));
         assert_true (applied);
      }
   }
   store_batch_clear (&b);
   /* Nothing of the key while 9 waits: 13.. stay parked, 10 to 12 wait in
    * a lane that gives nothing and is handed back, parking them. */
   claim_runs (fx->a, "h", 10, 4, T0 + 30, &b);
   assert_int_equal (b.n, 0);
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{\"lane\": \"parked\"}"), n - 9);
   claim_runs (fx->a, "h", 10, 4, T0 + 1500, &b);
   assert_int_equal (b.n, 0);
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{\"lane\": \"parked\"}"), n - 9);
   /* The retry of 9 runs alone; then 10 to 13 come back together. */
   claim_runs (fx->a, "h", 10, 4, T0 + 5000, &b);
   assert_int_equal (b.n, 1);
   assert_int_equal (b.items[0].sequence, 9);
   assert_true (complete1 (fx->a, &b.items[0], T0 + 5001));
   store_batch_clear (&b);
   claim_runs (fx->a, "h", 10, 4, T0 + 6000, &b);
   assert_int_equal (b.n, 4);
   for (size_t i = 0; i < b.n; i++)
      assert_int_equal (b.items[i].sequence, 10 + (int64_t) i);
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{\"lane\": \"parked\"}"), n - 13);
   store_batch_clear (&b);
}

/* Fencing by claim generation: the lease of an earlier claim never matches
 * a later claim of the same delivery, even by the same owner and epoch. */
static void
test_fencing_by_claim_generation (void **state)
{
   fx_t *fx = *state;
   store_batch_t b1 = {0}, b2 = {0};
   bson_error_t err;
   bool applied, done;
   store_ref_t r1, r2;
   bson_t *doc;

   add (fx, "e1", "h", NULL, 0, T0 - 10);
   claim (fx->a, "h", 1, T0, &b1);
   assert_int_equal (b1.n, 1);
   r1 = ref (&b1.items[0]);
   assert_true (store_reschedule (fx->a, &r1, T0 + 1, T0 + 1, "boom", &applied, &err));
   assert_true (applied);
   claim (fx->a, "h", 1, T0 + 2, &b2);
   assert_int_equal (b2.n, 1);
   assert_int_equal (b2.items[0].attempt, 2);
   assert_string_not_equal (b1.items[0].lease, b2.items[0].lease);
   r2 = ref (&b2.items[0]);
   /* the old lease changes nothing */
   assert_true (store_complete (fx->a, &r1, T0 + 3, &done, &err));
   assert_false (done);
   doc = get (fx, &b2.items[0].id);
   assert_non_null (doc);
   bson_destroy (doc);
   assert_true (store_bury (fx->a, &r1, T0 + 3, "stale", &applied, &err));
   assert_false (applied);
   /* the current one completes */
   assert_true (store_complete (fx->a, &r2, T0 + 4, &done, &err));
   assert_true (done);
   assert_null (get (fx, &b2.items[0].id));
   /* a token this store cannot have issued: refused without a call */
   {
      store_ref_t bad = {b2.items[0].id, "3:0:x"};
      assert_false (store_release (fx->a, &bad, T0, &applied, &err));
   }
   store_batch_clear (&b1);
   store_batch_clear (&b2);
}

/* A stale lease changes nothing: after a takeover, the old owner's
 * complete, reschedule, bury, release and extendLease are no-ops. */
static void
test_a_stale_lease_changes_nothing (void **state)
{
   fx_t *fx = *state;
   store_batch_t ba = {0}, bb = {0};
   bson_error_t err;
   bool applied, done;
   store_ref_t ra;
   bson_t *doc;
   int64_t later = T0 + LEASE + 1;

   add (fx, "e1", "h", NULL, 0, T0 - 10);
   claim (fx->a, "h", 1, T0, &ba);
   assert_int_equal (ba.n, 1);
   ra = ref (&ba.items[0]);
   claim (fx->b, "h", 1, later, &bb); /* A's lease expired: B takes over */
   assert_int_equal (bb.n, 1);
   doc = get (fx, &ba.items[0].id);
   assert_int_equal (field (doc, "attempts"), 1);
   bson_destroy (doc);

   assert_true (store_complete (fx->a, &ra, later, &done, &err));
   assert_false (done);
   assert_true (store_reschedule (fx->a, &ra, later, later + 5000, "x", &applied, &err));
   assert_false (applied);
   assert_true (store_bury (fx->a, &ra, later, "x", &applied, &err));
   assert_false (applied);
   assert_true (store_release (fx->a, &ra, later, &applied, &err));
   assert_false (applied);
   assert_true (store_extend_lease (fx->a, &ra, later, LEASE, &applied, &err));
   assert_false (applied);
   doc = get (fx, &ba.items[0].id);
   assert_non_null (doc);
   assert_string_equal (sfield (doc, "status"), "pending");
   assert_int_equal (field (doc, "attempts"), 1);
   assert_int_equal (field (doc, "claims"), 1);
   bson_destroy (doc);
   /* B's lease still works. */
   assert_true (complete1 (fx->b, &bb.items[0], later + 1));
   store_batch_clear (&ba);
   store_batch_clear (&bb);
}

/* A takeover charges the lost attempt (lost/lostAt on the lane and the
 * delivery), once. */
static void
test_a_takeover_charges_the_lost_attempt (void **state)
{
   fx_t *fx = *state;
   store_batch_t ba = {0}, bb = {0};
   bson_t *doc;
   int64_t later = T0 + LEASE + 1;

   add (fx, "e1", "h", NULL, 0, T0 - 10);
   claim (fx->a, "h", 1, T0, &ba);
   assert_int_equal (ba.n, 1);
   assert_int_equal (ba.items[0].attempt, 1);
   claim (fx->b, "h", 1, later, &bb);
   assert_int_equal (bb.n, 1);
   assert_int_equal (bb.items[0].attempt, 2);
   doc = get (fx, &ba.items[0].id);
   assert_int_equal (field (doc, "attempts"), 1);
   assert_int_equal (field (doc, "lostAt"), 1);
   bson_destroy (doc);
   /* the lane lists nothing lost any more, and B's claim */
   assert_int_equal (count (fx, OUTBOX_LANES_COLL, "{\"lost.0\": {\"$exists\": true}}"), 0);
   assert_int_equal (count (fx, OUTBOX_LANES_COLL, "{\"owner\": \"host/2/bbbb\", \"epoch\": 2}"), 1);
   store_batch_clear (&ba);
   store_batch_clear (&bb);
}

/* The same instance takes back a claim its worker stopped renewing
 * without settling it (a pull consumer killed in its transaction after
 * its lease ran out): that claim was an attempt, charged once, as a
 * takeover charges a lost one.  Within the lease nothing is charged. */
static void
test_an_abandoned_claim_is_charged_its_attempt (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0}, mid = {0}, again = {0}, third = {0};
   bson_t *doc;

   add (fx, "ab-0", "h", NULL, 0, T0 - 10);
   claim (fx->a, "h", 1, T0, &b);
   assert_int_equal (b.n, 1);
   assert_int_equal (b.items[0].attempt, 1);

   claim (fx->a, "h", 1, T0 + LEASE / 2, &mid);
   assert_int_equal (mid.n, 0);
   doc = get (fx, &b.items[0].id);
   assert_int_equal (field (doc, "attempts"), 0);
   bson_destroy (doc);

   claim (fx->a, "h", 1, T0 + LEASE, &again);
   assert_int_equal (again.n, 1);
   assert_true (bson_oid_equal (&again.items[0].id, &b.items[0].id));
   assert_int_equal (again.items[0].attempt, 2);
   doc = get (fx, &b.items[0].id);
   assert_int_equal (field (doc, "attempts"), 1);
   bson_destroy (doc);
   assert_false (complete1 (fx->a, &b.items[0], T0 + LEASE + 1));

   /* abandoned again: charged again, once */
   claim (fx->a, "h", 1, T0 + 2 * LEASE + 1, &third);
   assert_int_equal (third.n, 1);
   assert_int_equal (third.items[0].attempt, 3);
   assert_true (complete1 (fx->a, &third.items[0], T0 + 2 * LEASE + 2));
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{}"), 0);
   store_batch_clear (&b);
   store_batch_clear (&mid);
   store_batch_clear (&again);
   store_batch_clear (&third);
}

/* Sets fields of lane `lane` directly (what another instance's write
 * left there). */
static void
lane_set (fx_t *fx, int64_t lane, const char *json)
{
   mongoc_collection_t *lanes = coll (fx, OUTBOX_LANES_COLL);
   bson_error_t err;
   bson_t *q = BCON_NEW ("_id", BCON_INT32 ((int32_t) lane));
   bson_t *set = bson_new_from_json ((const uint8_t *) json, -1, &err);
   bson_t *u;

   assert_non_null (set);
   u = BCON_NEW ("$set", BCON_DOCUMENT (set));
   if (!mongoc_collection_update_one (lanes, q, u, NULL, NULL, &err))
      fail_msg ("lane: %s", err.message);
   bson_destroy (u);
   bson_destroy (set);
   bson_destroy (q);
   mongoc_collection_destroy (lanes);
}

/* One lost attempt, two paths that find it: this instance's own claim
 * takes its abandoned claim back (charged), and a takeover that read the
 * lane before that charge moved the same claim to the lane's `lost` list
 * under the epoch it was made in.  The takeover's charge finds it charged
 * (lostAt) and charges nothing: one attempt, counted once. */
static void
test_an_abandoned_and_a_lost_charge_count_once (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0}, other = {0}, taken = {0};
   bson_t *doc;
   char json[256], hex[25];
   int64_t lane, epoch;

   add (fx, "once-0", "h", NULL, 0, T0 - 10);
   claim (fx->a, "h", 1, T0, &b);
   assert_int_equal (b.n, 1);
   doc = get (fx, &b.items[0].id);
   lane = field (doc, "laneId");
   bson_destroy (doc);
   epoch = strtoll (b.items[0].lease + strcspn (b.items[0].lease, ":") + 1, NULL, 10);
   /* A's claim stopped being renewed: its next claim (of another
    * handler) takes it back, charged. */
   claim (fx->a, "other", 1, T0 + LEASE, &other);
   assert_int_equal (other.n, 0);
   doc = get (fx, &b.items[0].id);
   assert_int_equal (field (doc, "attempts"), 1);
   bson_destroy (doc);
   /* What a takeover that read the lane before that charge wrote: the
    * claim moved to `lost` under its epoch, the taker gone since. */
   bson_oid_to_string (&b.items[0].id, hex);
   snprintf (json, sizeof json,
             "{\"owner\": \"host/9/gone\", \"epoch\": %" PRId64 ", \"leaseExpiresAt\": {\"$date\": %" PRId64
             "}, \"inFlight\": [], \"lost\": [{\"$oid\": \"%s\"}], \"lostEpochs\": [%" PRId64 "]}",
             (int64_t) (epoch + 1), (int64_t) (T0 + LEASE + 1), hex, (int64_t) epoch);
   lane_set (fx, lane, json);
   claim (fx->b, "h", 1, T0 + 3 * LEASE, &taken);
   assert_int_equal (taken.n, 1);
   assert_int_equal (taken.items[0].attempt, 2);
   doc = get (fx, &b.items[0].id);
   assert_int_equal (field (doc, "attempts"), 1);
   assert_int_equal (field (doc, "lostAt"), epoch);
   bson_destroy (doc);
   store_batch_clear (&b);
   store_batch_clear (&other);
   store_batch_clear (&taken);
}

/* A listed delivery whose claim this instance never handed out (a record
 * that reached the lane without its reply reaching the instance) is taken
 * back without an attempt charged: its claim generation moves on, and
 * the claim this instance did hand out keeps running. */
static void
test_a_claim_never_handed_out_is_taken_back_uncharged (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0}, other = {0};
   bson_t *doc;
   char json[256], hex[25];
   int64_t lane;
   bson_oid_t stray = add (fx, "stray-2", "h", "k", 2, T0 - 10);

   add (fx, "stray-1", "h", "k", 1, T0 - 10);
   claim (fx->a, "h", 1, T0, &b);
   assert_int_equal (b.n, 1);
   assert_int_equal (b.items[0].sequence, 1);
   doc = get (fx, &b.items[0].id);
   lane = field (doc, "laneId");
   bson_destroy (doc);
   bson_oid_to_string (&stray, hex);
   {
      char id1[25];
      bson_oid_to_string (&b.items[0].id, id1);
      snprintf (json, sizeof json, "{\"inFlight\": [{\"$oid\": \"%s\"}, {\"$oid\": \"%s\"}]}", id1, hex);
   }
   lane_set (fx, lane, json);
   claim (fx->a, "other", 1, T0 + 1, &other);
   doc = get (fx, &stray);
   assert_int_equal (field (doc, "attempts"), 0);
   assert_int_equal (field (doc, "claims"), 1);
   bson_destroy (doc);
   doc = get (fx, &b.items[0].id);
   assert_int_equal (field (doc, "attempts"), 0);
   assert_int_equal (field (doc, "claims"), 0);
   bson_destroy (doc);
   assert_true (complete1 (fx->a, &b.items[0], T0 + 2));
   store_batch_clear (&b);
   store_batch_clear (&other);
}

/* Appends to `docs` a pending delivery of (handler, key, seq) in `lane`
 * ("ready" or "parked"), due at `due` (no event: unparking reads none). */
static void
raw_delivery (bson_t **docs, size_t *n, const char *handler, const char *key, int64_t seq, const char *lane, int64_t due)
{
   bson_oid_t id;
   char ev[64];
   bson_t *d = bson_new ();

   snprintf (ev, sizeof ev, "%s-%s-%" PRId64, handler, key, seq);
   bson_oid_init (&id, NULL);
   BSON_APPEND_OID (d, "_id", &id);
   BSON_APPEND_UTF8 (d, "eventId", ev);
   BSON_APPEND_UTF8 (d, "handler", handler);
   BSON_APPEND_UTF8 (d, "eventType", "order.placed.v1");
   BSON_APPEND_UTF8 (d, "key", key);
   BSON_APPEND_INT64 (d, "sequence", seq);
   BSON_APPEND_INT32 (d, "laneId", (int32_t) outbox_lane_id (key, ev));
   BSON_APPEND_UTF8 (d, "lane", lane);
   BSON_APPEND_UTF8 (d, "status", "pending");
   BSON_APPEND_INT32 (d, "attempts", 0);
   BSON_APPEND_INT32 (d, "claims", 0);
   BSON_APPEND_DATE_TIME (d, "dueAt", due);
   BSON_APPEND_DATE_TIME (d, "createdAt", due);
   docs[(*n)++] = d;
}

/* Each handler keeps its own place in the parked keys: a claim of
 * another handler between two claims of handler x neither moves x's
 * window nor sends it back to the start.  x has 1,000 parked keys that
 * wait behind a pending predecessor (they stay parked) and, after them,
 * one that can run; the second claim of x looks past the first 1,000 and
 * unparks it, although a claim of y came in between. */
static void
test_unparking_keeps_a_place_per_handler (void **state)
{
   fx_t *fx = *state;
   enum { WAITING = 1000 };
   mongoc_collection_t *del = coll (fx, OUTBOX_DELIVERIES);
   bson_t **docs = bson_malloc0 ((2 * WAITING + 2) * sizeof *docs);
   size_t n = 0;
   bson_error_t err;
   store_batch_t b1 = {0}, b2 = {0}, b3 = {0};

   for (int i = 0; i < WAITING; i++) {
      char key[16];
      snprintf (key, sizeof key, "w%04d", i);
      raw_delivery (docs, &n, "x", key, 1, "ready", T0 + 100 * LEASE); /* not due: unfinished */
      raw_delivery (docs, &n, "x", key, 2, "parked", T0 - 100000 + i);
   }
   raw_delivery (docs, &n, "x", "zlast", 2, "parked", T0 - 100000 + WAITING);
   raw_delivery (docs, &n, "y", "only", 1, "parked", T0 - 100000);
   if (!mongoc_collection_insert_many (del, (const bson_t **) docs, n, NULL, NULL, &err))
      fail_msg ("insert: %s", err.message);
   claim (fx->a, "x", 1, T0, &b1);
   claim (fx->a, "y", 1, T0 + 1, &b2);
   claim (fx->a, "x", 1, T0 + 2, &b3);
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{\"key\": \"zlast\", \"lane\": \"parked\"}"), 0);
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{\"key\": \"only\", \"lane\": \"parked\"}"), 0);
   for (size_t i = 0; i < n; i++)
      bson_destroy (docs[i]);
   bson_free (docs);
   mongoc_collection_destroy (del);
   store_batch_clear (&b1);
   store_batch_clear (&b2);
   store_batch_clear (&b3);
}

/* A poison delivery reaches the dead letters when its worker keeps
 * crashing: every crash is charged by the next taker, and the claim that
 * reports an attempt past the limit buries it. */
static void
test_a_poison_delivery_reaches_the_dead_letters (void **state)
{
   fx_t *fx = *state;
   const int max_attempts = 3;
   int64_t now = T0;
   bson_oid_t id = add (fx, "poison", "h", "k", 1, T0 - 10);
   bson_t *doc;
   int crashes = 0;

   for (int round = 0; round < 10; round++) {
      char owner[32];
      store_t *w;
      store_batch_t b = {0};
      snprintf (owner, sizeof owner, "host/%d/crash", 100 + round);
      w = new_store (fx, owner);
      claim (w, "h", 5, now, &b);
      if (b.n == 1 && b.items[0].attempt > max_attempts) {
         store_ref_t r = ref (&b.items[0]);
         bool applied;
         bson_error_t err;
         assert_true (store_bury (w, &r, now, "lost its worker on every attempt", &applied, &err));
         assert_true (applied);
         store_batch_clear (&b);
         store_destroy (w);
         break;
      }
      assert_int_equal (b.n, 1);
      assert_int_equal (b.items[0].attempt, round + 1);
      crashes++;
      store_batch_clear (&b);
      store_destroy (w); /* crash: no release, the lease runs out */
      now += LEASE + 1;
   }
   assert_int_equal (crashes, max_attempts);
   doc = get (fx, &id);
   assert_string_equal (sfield (doc, "status"), "dead");
   assert_string_equal (sfield (doc, "lastError"), "lost its worker on every attempt");
   assert_int_equal (field (doc, "attempts"), max_attempts + 1);
   bson_destroy (doc);
}

/* 32 blocked deliveries are parked and come back once their predecessor
 * completes, one at a time (level-triggered). */
static void
test_32_blocked_deliveries_are_parked_and_come_back (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0};
   char ev[32];
   const int n = 40;

   for (int i = 1; i <= n; i++) {
      snprintf (ev, sizeof ev, "p-%d", i);
      add (fx, ev, "h", "hot", i, T0 - 100000 + i);
   }
   claim (fx->a, "h", 10, T0, &b);
   assert_int_equal (b.n, 1);
   assert_int_equal (b.items[0].sequence, 1);
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{\"lane\": \"parked\"}"), n - 1);
   {
      store_stats_t st;
      bson_error_t err;
      assert_true (store_statistics (fx->a, T0, &st, &err));
      assert_int_equal (st.parked, n - 1);
      assert_int_equal (st.pending, n);
      assert_int_equal (st.running, 1);
      assert_int_equal (st.oldest_due_at, T0 - 100000 + 1);
   }
   /* While seq 1 runs, the parked ones stay parked. */
   {
      store_batch_t again = {0};
      claim (fx->a, "h", 10, T0 + 1, &again);
      assert_int_equal (again.n, 0);
      store_batch_clear (&again);
   }
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{\"lane\": \"parked\"}"), n - 1);
   assert_true (complete1 (fx->a, &b.items[0], T0 + 2));
   store_batch_clear (&b);
   for (int seq = 2; seq <= 4; seq++) {
      claim (fx->a, "h", 10, T0 + 10 * seq, &b);
      assert_int_equal (b.n, 1);
      assert_int_equal (b.items[0].sequence, seq);
      assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{\"lane\": \"parked\"}"), n - seq);
      assert_true (complete1 (fx->a, &b.items[0], T0 + 10 * seq + 1));
      store_batch_clear (&b);
   }
}

/* Requeue blocks later deliveries of its key, and cannot start while a
 * later delivery of the key runs. */
static void
test_requeue_blocks_later_deliveries_of_its_key (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0};
   bson_error_t err;
   bool applied;
   store_ref_t r;
   char hex[25];
   const char *ids[2];
   size_t n;
   bson_oid_t first;

   first = add (fx, "r-1", "h", "acct", 1, T0 - 30);
   add (fx, "r-2", "h", "acct", 2, T0 - 20);
   add (fx, "r-3", "h", "acct", 3, T0 - 10);

   claim (fx->a, "h", 10, T0, &b);
   assert_int_equal (b.n, 1);
   r = ref (&b.items[0]);
   assert_true (store_bury (fx->a, &r, T0 + 1, "HTTP 400", &applied, &err));
   assert_true (applied);
   store_batch_clear (&b);

   /* Dead letters do not block: seq 2 runs. */
   claim (fx->a, "h", 10, T0 + 2, &b);
   assert_int_equal (b.n, 1);
   assert_int_equal (b.items[0].sequence, 2);

   /* Requeued while seq 2 runs: neither seq 1 nor seq 3 starts. */
   bson_oid_to_string (&first, hex);
   ids[0] = hex;
   ids[1] = "{\"$ne\": null}"; /* not an id: matches nothing */
   assert_true (store_requeue (fx->a, ids, 2, T0 + 3, &n, &err));
   assert_int_equal (n, 1);
   {
      store_batch_t again = {0};
      claim (fx->a, "h", 10, T0 + 4, &again);
      assert_int_equal (again.n, 0);
      store_batch_clear (&again);
   }
   assert_true (complete1 (fx->a, &b.items[0], T0 + 5));
   store_batch_clear (&b);

   /* Now the requeued seq 1 runs before seq 3, then seq 3. */
   claim (fx->a, "h", 10, T0 + 6, &b);
   assert_int_equal (b.n, 1);
   assert_int_equal (b.items[0].sequence, 1);
   assert_int_equal (b.items[0].attempt, 1);
   assert_true (complete1 (fx->a, &b.items[0], T0 + 7));
   store_batch_clear (&b);
   claim (fx->a, "h", 10, T0 + 8, &b);
   assert_int_equal (b.n, 1);
   assert_int_equal (b.items[0].sequence, 3);
   store_batch_clear (&b);
}

/* Purge keeps what is still referenced: an event with a pending delivery,
 * and an event whose completion is younger than completed_before. */
static void
test_purge_keeps_what_is_still_referenced (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0};
   store_purge_opts_t po = {0};
   store_purge_result_t pr;
   bson_error_t err;
   bool applied;

   /* e-shared: dead for h1, pending for h2.  e-dead: only dead. */
   add (fx, "e-shared", "h1", NULL, 0, T0 - 100);
   add (fx, "e-shared", "h2", NULL, 0, T0 + 3600000);
   add (fx, "e-dead", "h1", NULL, 0, T0 - 90);
   /* e-done: completed at T0+50.  e-old: completed long ago. */
   add (fx, "e-done", "h3", NULL, 0, T0 - 80);
   add (fx, "e-old", "h4", NULL, 0, T0 - 70);

   claim (fx->a, "h1", 10, T0, &b);
   assert_int_equal (b.n, 2);
   for (size_t i = 0; i < b.n; i++) {
      store_ref_t r = ref (&b.items[i]);
      assert_true (store_bury (fx->a, &r, T0 + 10, "HTTP 400", &applied, &err));
      assert_true (applied);
   }
   store_batch_clear (&b);
   claim (fx->a, "h4", 10, T0, &b);
   assert_int_equal (b.n, 1);
   assert_true (complete1 (fx->a, &b.items[0], T0 + 20));
   store_batch_clear (&b);
   claim (fx->a, "h3", 10, T0, &b);
   assert_int_equal (b.n, 1);
   assert_true (complete1 (fx->a, &b.items[0], T0 + 50));
   store_batch_clear (&b);

   po.dead_before = T0 + 1000;
   po.completed_before = T0 + 30; /* after e-old's completion, before e-done's */
   assert_true (store_purge (fx->a, &po, &pr, &err));
   assert_int_equal (pr.dead, 2);
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{\"status\": \"dead\"}"), 0);
   assert_int_equal (count (fx, OUTBOX_EVENTS, "{\"_id\": \"e-shared\"}"), 1);
   assert_int_equal (count (fx, OUTBOX_EVENTS, "{\"_id\": \"e-done\"}"), 1);
   assert_int_equal (count (fx, OUTBOX_EVENTS, "{\"_id\": \"e-dead\"}"), 0);
   assert_int_equal (count (fx, OUTBOX_EVENTS, "{\"_id\": \"e-old\"}"), 0);
   assert_int_equal (pr.events, 2);
}

/* Completion history off: nothing recorded, listing "completed" is empty. */
static void
test_completion_history_off (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0};
   store_list_filter_t f = {.status = "completed"};
   store_stats_t st;
   bson_t out = BSON_INITIALIZER;
   bson_error_t err;

   add (fx, "e1", "h", NULL, 0, T0 - 10);
   add (fx, "e2", "h", NULL, 0, T0 - 10);
   claim (fx->a, "h", 10, T0, &b);
   assert_int_equal (b.n, 2);
   {
      store_ref_t refs[2] = {ref (&b.items[0]), ref (&b.items[1])};
      bool done[2];
      assert_true (store_complete_many (fx->a, refs, 2, T0 + 1, done, &err));
      assert_true (done[0] && done[1]);
   }
   store_batch_clear (&b);
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{}"), 0);
   assert_int_equal (count (fx, OUTBOX_EVENTS, "{\"completedAt\": {\"$exists\": true}}"), 2);
   assert_true (list_first (fx->a, &f, &out, &err));
   assert_int_equal (bson_count_keys (&out), 0);
   assert_true (store_statistics (fx->a, T0, &st, &err));
   assert_int_equal (st.completed, 0);
   bson_destroy (&out);
}

/* Completion history on: one record per completion, listed and counted. */
static void
test_completion_history_on (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0};
   store_list_filter_t f = {.status = "completed", .handler = "h"};
   store_stats_t st;
   bson_t out = BSON_INITIALIZER;
   bson_error_t err;

   add (fx, "e1", "h", "k", 1, T0 - 10);
   add (fx, "e2", "h", NULL, 0, T0 - 10);
   claim (fx->a, "h", 10, T0, &b);
   assert_int_equal (b.n, 2);
   {
      store_ref_t refs[2] = {ref (&b.items[0]), ref (&b.items[1])};
      bool done[2];
      assert_true (store_complete_many (fx->a, refs, 2, T0 + 1, done, &err));
      assert_true (done[0] && done[1]);
   }
   store_batch_clear (&b);
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{}"), 0);
   assert_int_equal (count (fx, OUTBOX_COMPLETED, "{\"attempts\": 1}"), 2);
   assert_true (list_first (fx->a, &f, &out, &err));
   assert_int_equal (bson_count_keys (&out), 2);
   assert_true (store_statistics (fx->a, T0, &st, &err));
   assert_int_equal (st.completed, 2);
   bson_destroy (&out);
   /* Purge removes the records once completed_before passes them. */
   {
      store_purge_opts_t po = {.completed_before = T0 + 2};
      store_purge_result_t pr;
      assert_true (store_purge (fx->a, &po, &pr, &err));
      assert_int_equal (pr.completed, 2);
      assert_int_equal (pr.events, 2);
   }
}

/* Untrusted input: listing filters are strings, never operators. */
static void
test_list_coerces_filters_to_strings (void **state)
{
   fx_t *fx = *state;
   store_list_filter_t f = {.handler = "{\"$ne\": null}"};
   bson_t out = BSON_INITIALIZER;
   bson_error_t err;

   add (fx, "e1", "h", NULL, 0, T0 - 10);
   assert_true (list_first (fx->a, &f, &out, &err));
   assert_int_equal (bson_count_keys (&out), 0);
   f.handler = "h";
   assert_true (list_first (fx->a, &f, &out, &err));
   assert_int_equal (bson_count_keys (&out), 1);
   bson_destroy (&out);
}

/* Walks a listing page by page from the start, each page after the last
 * document of the one before, appending every page to `all`; returns the
 * number of pages and checks that only the last one says no more follow. */
static int
walk_pages (store_t *s, const store_list_filter_t *f, bson_t *all)
{
   int64_t after_created = 0;
   bson_oid_t after_id;
   bool have_after = false, more = true;
   int pages = 0;
   bson_error_t err;

   while (more) {
      bson_t page = BSON_INITIALIZER;
      uint32_t n;
      if (!store_list_page (s, f, after_created, have_after ? &after_id : NULL, &page, &more, &err))
         fail_msg ("list page: %s", err.message);
      n = bson_count_keys (&page);
      pages++;
      assert_true (pages <= 100);
      if (more)
         assert_int_equal (n, f->limit);
      for (uint32_t i = 0; i < n; i++) {
         char from[16], to[16];
         bson_iter_t it;
         snprintf (from, sizeof from, "%u", i);
         snprintf (to, sizeof to, "%u", bson_count_keys (all));
         assert_true (bson_iter_init_find (&it, &page, from));
         bson_append_iter (all, to, -1, &it);
      }
      if (n > 0) {
         after_id = page_id (&page, n - 1, &after_created);
         have_after = true;
      }
      bson_destroy (&page);
   }
   return pages;
}

/* Pagination: (createdAt, _id) order, ties by _id also across a page
 * boundary, each page after the last document of the one before, `more`
 * false only on the last page, and a page appended after what `out` holds. */
static void
test_list_page_walks_every_delivery_once_in_order (void **state)
{
   fx_t *fx = *state;
   /* Inserted out of order; three share T0 - 40, two T0 - 20. */
   const char *ev[] = {"pa", "pb", "pc", "pd", "pe", "pf", "pg"};
   const int64_t created[] = {T0 - 20, T0 - 40, T0 - 50, T0 - 40, T0 - 30, T0 - 40, T0 - 20};
   const char *want[] = {"pc", "pb", "pd", "pf", "pe", "pa", "pg"};
   store_list_filter_t f = {.limit = 2};
   bson_t all = BSON_INITIALIZER, out = BSON_INITIALIZER;
   bson_oid_t last;
   int64_t last_created;
   bool more;
   bson_error_t err;

   for (size_t i = 0; i < 7; i++)
      add (fx, ev[i], "h", NULL, 0, created[i]);
   assert_int_equal (walk_pages (fx->a, &f, &all), 4);
   assert_int_equal (bson_count_keys (&all), 7);
   for (uint32_t i = 0; i < 7; i++)
      assert_string_equal (page_str (&all, i, "eventId"), want[i]);

   /* Exactly a page: no more; one short of it: more. */
   f.limit = 7;
   assert_true (store_list_page (fx->a, &f, 0, NULL, &out, &more, &err));
   assert_int_equal (bson_count_keys (&out), 7);
   assert_false (more);
   bson_reinit (&out);
   f.limit = 6;
   assert_true (store_list_page (fx->a, &f, 0, NULL, &out, &more, &err));
   assert_int_equal (bson_count_keys (&out), 6);
   assert_true (more);

   /* After the sixth: the seventh, appended as "6" after what out holds. */
   last = page_id (&out, 5, &last_created);
   assert_int_equal (last_created, T0 - 20);
   assert_true (store_list_page (fx->a, &f, last_created, &last, &out, &more, &err));
   assert_int_equal (bson_count_keys (&out), 7);
   assert_string_equal (page_str (&out, 6, "eventId"), "pg");
   assert_false (more);

   /* After the last: an empty page, no more. */
   bson_reinit (&out);
   last = page_id (&all, 6, &last_created);
   assert_true (store_list_page (fx->a, &f, last_created, &last, &out, &more, &err));
   assert_int_equal (bson_count_keys (&out), 0);
   assert_false (more);
   bson_destroy (&out);
   bson_destroy (&all);
}

/* Sets one field of a delivery to a string (what the publisher would have
 * written differently). */
static void
set_str (fx_t *fx, const bson_oid_t *id, const char *name, const char *value)
{
   mongoc_collection_t *del = coll (fx, OUTBOX_DELIVERIES);
   bson_t *q = BCON_NEW ("_id", BCON_OID (id));
   bson_t *u = BCON_NEW ("$set", "{", name, BCON_UTF8 (value), "}");
   bson_error_t err;

   if (!mongoc_collection_update_one (del, q, u, NULL, NULL, &err))
      fail_msg ("set %s: %s", name, err.message);
   bson_destroy (q);
   bson_destroy (u);
   mongoc_collection_destroy (del);
}

/* How many a filter lists, walked page by page (two a page). */
static uint32_t
list_count (fx_t *fx, store_list_filter_t f)
{
   bson_t all = BSON_INITIALIZER;
   uint32_t n;

   f.limit = 2;
   walk_pages (fx->a, &f, &all);
   n = bson_count_keys (&all);
   bson_destroy (&all);
   return n;
}

/* Filters: status (NULL is pending and dead), handler, event type, event
 * id and key, alone and together, over every page. */
static void
test_list_page_filters (void **state)
{
   fx_t *fx = *state;
   bson_oid_t dead;
   char dead_id[25];
   const char *ids[1] = {dead_id};
   size_t n;
   bson_error_t err;

   add (fx, "f1", "h1", "k1", 1, T0 - 50);
   add (fx, "f1", "h2", "k1", 1, T0 - 50);
   add (fx, "f2", "h1", "k1", 2, T0 - 40);
   add (fx, "f3", "h1", "k2", 1, T0 - 30);
   dead = add (fx, "f4", "h1", NULL, 0, T0 - 20);
   set_str (fx, &dead, "eventType", "order.cancelled.v1");
   bson_oid_to_string (&dead, dead_id);
   assert_true (store_bury_ids (fx->a, ids, 1, T0, "operator", &n, &err));
   assert_int_equal (n, 1);

   assert_int_equal (list_count (fx, (store_list_filter_t) {0}), 5);
   assert_int_equal (list_count (fx, (store_list_filter_t) {.status = "pending"}), 4);
   assert_int_equal (list_count (fx, (store_list_filter_t) {.status = "dead"}), 1);
   assert_int_equal (list_count (fx, (store_list_filter_t) {.handler = "h1"}), 4);
   assert_int_equal (list_count (fx, (store_list_filter_t) {.handler = "h2"}), 1);
   assert_int_equal (list_count (fx, (store_list_filter_t) {.event_type = "order.placed.v1"}), 4);
   assert_int_equal (list_count (fx, (store_list_filter_t) {.event_type = "order.cancelled.v1"}), 1);
   assert_int_equal (list_count (fx, (store_list_filter_t) {.event_id = "f1"}), 2);
   assert_int_equal (list_count (fx, (store_list_filter_t) {.key = "k1"}), 3);
   assert_int_equal (list_count (fx, (store_list_filter_t) {.handler = "h1", .key = "k1"}), 2);
   assert_int_equal (list_count (fx, (store_list_filter_t) {.handler = "h1", .key = "k1", .event_id = "f2"}), 1);
   assert_int_equal (list_count (fx, (store_list_filter_t) {.status = "dead", .handler = "h2"}), 0);
   {
      store_list_filter_t f = {.status = "dead", .limit = 10};
      bson_t out = BSON_INITIALIZER;
      bool more;
      assert_true (store_list_page (fx->a, &f, 0, NULL, &out, &more, &err));
      assert_int_equal (bson_count_keys (&out), 1);
      assert_string_equal (page_str (&out, 0, "eventId"), "f4");
      assert_string_equal (page_str (&out, 0, "status"), "dead");
      assert_string_equal (page_str (&out, 0, "lastError"), "operator");
      bson_destroy (&out);
   }
}

/* Bad input: a limit out of 1..1000 lists 100; an unknown status, an
 * operator given as a string and "completed" without completion history
 * match nothing (an empty page, no error). */
static void
test_list_page_bad_input_matches_nothing_or_defaults (void **state)
{
   fx_t *fx = *state;
   mongoc_collection_t *del = coll (fx, OUTBOX_DELIVERIES);
   mongoc_bulk_operation_t *bulk = mongoc_collection_create_bulk_operation_with_opts (del, NULL);
   const int64_t limits[] = {0, -1, 1001, INT64_MAX, INT64_MIN};
   const char *statuses[] = {"running", "", "{\"$ne\": null}", "completed", "Pending"};
   store_list_filter_t f = {0};
   bson_t out = BSON_INITIALIZER, reply;
   bool more;
   bson_error_t err;

   /* 101 pending deliveries, one insert. */
   for (int i = 0; i < 101; i++) {
      char ev[16];
      bson_t *d;
      snprintf (ev, sizeof ev, "b%d", i);
      d = BCON_NEW ("eventId", BCON_UTF8 (ev), "handler", BCON_UTF8 ("h"), "status", BCON_UTF8 ("pending"),
                            "lane", BCON_UTF8 ("ready"), "laneId", BCON_INT32 (i % 256), "dueAt", BCON_DATE_TIME (T0),
                            "createdAt", BCON_DATE_TIME (T0 + i));
      mongoc_bulk_operation_insert (bulk, d);
      bson_destroy (d);
   }
   if (!mongoc_bulk_operation_execute (bulk, &reply, &err))
      fail_msg ("insert: %s", err.message);
   bson_destroy (&reply);
   mongoc_bulk_operation_destroy (bulk);
   mongoc_collection_destroy (del);

   for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
      f.limit = limits[i];
      bson_reinit (&out);
      assert_true (store_list_page (fx->a, &f, 0, NULL, &out, &more, &err));
      assert_int_equal (bson_count_keys (&out), 100);
      assert_true (more);
   }
   f.limit = 1000;
   bson_reinit (&out);
   assert_true (store_list_page (fx->a, &f, 0, NULL, &out, &more, &err));
   assert_int_equal (bson_count_keys (&out), 101);
   assert_false (more);
   f.limit = 1;
   bson_reinit (&out);
   assert_true (store_list_page (fx->a, &f, 0, NULL, &out, &more, &err));
   assert_int_equal (bson_count_keys (&out), 1);
   assert_true (more);

   for (size_t i = 0; i < sizeof statuses / sizeof statuses[0]; i++) {
      f.status = statuses[i];
      bson_reinit (&out);
      more = true;
      assert_true (store_list_page (fx->a, &f, 0, NULL, &out, &more, &err));
      assert_int_equal (bson_count_keys (&out), 0);
      assert_false (more);
   }
   f.status = NULL;
   f.key = "{\"$exists\": false}";
   bson_reinit (&out);
   assert_true (store_list_page (fx->a, &f, 0, NULL, &out, &more, &err));
   assert_int_equal (bson_count_keys (&out), 0);
   assert_false (more);
   bson_destroy (&out);
}

/* With completion history, "completed" lists the history records, paged
 * the same way, each with status "completed". */
static void
test_list_page_completed_history (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0};
   store_list_filter_t f = {.status = "completed", .limit = 2};
   bson_t all = BSON_INITIALIZER;
   bson_error_t err;

   add (fx, "c1", "h", NULL, 0, T0 - 30);
   add (fx, "c2", "h", NULL, 0, T0 - 20);
   add (fx, "c3", "h", NULL, 0, T0 - 10);
   add (fx, "c4", "h", NULL, 0, T0 - 5);
   claim (fx->a, "h", 10, T0, &b);
   assert_int_equal (b.n, 4);
   for (size_t i = 0; i < 3; i++) {
      bool done = false;
      store_ref_t r = ref (find_event (&b, i == 0 ? "c1" : i == 1 ? "c2" : "c3"));
      assert_true (store_complete (fx->a, &r, T0 + 1, &done, &err));
      assert_true (done);
   }
   assert_int_equal (walk_pages (fx->a, &f, &all), 2);
   assert_int_equal (bson_count_keys (&all), 3);
   for (uint32_t i = 0; i < 3; i++) {
      char want[3] = {'c', (char) ('1' + i), '\0'};
      assert_string_equal (page_str (&all, i, "eventId"), want);
      assert_string_equal (page_str (&all, i, "status"), "completed");
   }
   f.status = NULL;
   assert_int_equal (list_count (fx, f), 1);
   assert_true (complete1 (fx->a, find_event (&b, "c4"), T0 + 2));
   store_batch_clear (&b);
   bson_destroy (&all);
}

/* A worker that stops gracefully hands its lanes back at once; a renewal
 * keeps a lane from being taken over. */
static void
test_relinquish_and_extend_lease (void **state)
{
   fx_t *fx = *state;
   store_batch_t ba = {0}, bb = {0};
   bson_error_t err;
   bool applied;
   store_ref_t r;

   add (fx, "e1", "h", NULL, 0, T0 - 10);
   add (fx, "e2", "h", NULL, 0, T0 - 10);
   claim (fx->a, "h", 1, T0, &ba);
   assert_int_equal (ba.n, 1);
   r = ref (&ba.items[0]);
   assert_true (store_extend_lease (fx->a, &r, T0 + LEASE - 1, LEASE, &applied, &err));
   assert_true (applied);
   /* Past the first lease, the renewed lane is still A's. */
   claim (fx->b, "h", 10, T0 + LEASE + 1, &bb);
   for (size_t i = 0; i < bb.n; i++)
      assert_false (bson_oid_equal (&bb.items[i].id, &ba.items[0].id));
   store_batch_clear (&bb);
   assert_true (store_release (fx->a, &r, T0 + LEASE + 2, &applied, &err));
   assert_true (applied);
   assert_true (store_relinquish (fx->a, T0 + LEASE + 2, &err));
   assert_int_equal (count (fx, OUTBOX_LANES_COLL, "{\"owner\": \"host/1/aaaa\"}"), 0);
   /* B takes it at once; release charged no attempt. */
   claim (fx->b, "h", 10, T0 + LEASE + 3, &bb);
   assert_int_equal (bb.n, 1);
   assert_true (bson_oid_equal (&bb.items[0].id, &ba.items[0].id));
   assert_int_equal (bb.items[0].attempt, 1);
   store_batch_clear (&ba);
   store_batch_clear (&bb);
}


/* A stop that still owes a charge keeps that lane (store_relinquish_except):
 * the other lanes go back at once, with their claims released uncharged;
 * the kept one stays the instance's until its lease ends, and whoever takes
 * it over then charges the claim it lists. */
static void
test_relinquish_except_keeps_lanes (void **state)
{
   fx_t *fx = *state;
   store_batch_t ba = {0}, bb = {0};
   bool keep[OUTBOX_LANES] = {false};
   bson_error_t err;
   uint32_t kept;
   char q[96];

   add (fx, "e1", "h", "k-one", 1, T0 - 10);
   add (fx, "e2", "h", "k-two", 1, T0 - 10);
   assert_int_not_equal (outbox_lane_id ("k-one", "e1"), outbox_lane_id ("k-two", "e2"));
   claim (fx->a, "h", 10, T0, &ba);
   assert_int_equal (ba.n, 2);
   kept = outbox_lane_id ("k-one", "e1");
   keep[kept] = true;
   assert_true (store_relinquish_except (fx->a, T0 + 1, keep, &err));
   bson_snprintf (q, sizeof q, "{\"owner\": \"host/1/aaaa\", \"_id\": %u}", kept);
   assert_int_equal (count (fx, OUTBOX_LANES_COLL, q), 1);
   assert_int_equal (count (fx, OUTBOX_LANES_COLL, "{\"owner\": \"host/1/aaaa\"}"), 1);
   /* B gets the handed-back one at once, uncharged; not the kept one. */
   claim (fx->b, "h", 10, T0 + 2, &bb);
   assert_int_equal (bb.n, 1);
   assert_string_equal (bb.items[0].event_id, "e2");
   assert_int_equal (bb.items[0].attempt, 1);
   store_batch_clear (&bb);
   /* After the lease, the takeover charges the claim the kept lane lists. */
   claim (fx->b, "h", 10, T0 + LEASE + 1, &bb);
   assert_int_equal (bb.n, 1);
   assert_string_equal (bb.items[0].event_id, "e1");
   assert_int_equal (bb.items[0].attempt, 2);
   store_batch_clear (&ba);
   store_batch_clear (&bb);
}

/* Many leases in one transaction (a pull consumer's relaybusExtend,
 * relaybusRelease and the charge of a closed connection): each lease is
 * fenced as the one-lease calls fence it, a stale one changes nothing and
 * does not keep the others from applying, and the writes are the one-lease
 * calls' writes. */
static void
test_settle_and_extend_many (void **state)
{
   fx_t *fx = *state;
   store_batch_t ba = {0}, bb = {0};
   store_ref_t r[5];
   bool applied[5];
   bson_error_t err;

   for (int i = 0; i < 5; i++) {
      char id[8];
      bson_snprintf (id, sizeof id, "m%d", i);
      add (fx, id, "h", NULL, 0, T0 - 10);
   }
   claim (fx->a, "h", 5, T0, &ba);
   assert_int_equal (ba.n, 5);
   for (int i = 0; i < 5; i++)
      r[i] = ref (&ba.items[i]);
   /* Lease 4 goes stale. */
   assert_true (store_release (fx->a, &r[4], T0 + 1, &applied[0], &err));
   assert_true (applied[0]);
   assert_true (store_extend_many (fx->a, r, 5, T0 + LEASE - 1, LEASE, applied, &err));
   for (int i = 0; i < 4; i++)
      assert_true (applied[i]);
   assert_false (applied[4]);
   /* Past the first lease, the extended lanes are still A's. */
   claim (fx->b, "h", 10, T0 + LEASE + 1, &bb);
   for (size_t j = 0; j < bb.n; j++)
      for (int i = 0; i < 4; i++)
         assert_false (bson_oid_equal (&bb.items[j].id, &ba.items[i].id));
   store_batch_clear (&bb);
   /* 0 and 1 due again with an attempt charged, 2 dead, 3 released. */
   assert_true (store_settle_many (fx->a, STORE_MANY_RESCHEDULE, r, 2, T0 + LEASE + 2, T0 + LEASE + 100, "boom", applied, &err));
   assert_true (applied[0] && applied[1]);
   assert_true (store_settle_many (fx->a, STORE_MANY_BURY, &r[2], 1, T0 + LEASE + 2, 0, "dead", applied, &err));
   assert_true (applied[0]);
   assert_true (store_settle_many (fx->a, STORE_MANY_RELEASE, &r[3], 2, T0 + LEASE + 2, 0, NULL, applied, &err));
   assert_true (applied[0]);
   assert_false (applied[1]); /* stale */
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{\"attempts\": 1, \"lastError\": \"boom\", \"status\": \"pending\"}"), 2);
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{\"status\": \"dead\", \"lastError\": \"dead\"}"), 1);
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{\"attempts\": 0, \"status\": \"pending\"}"), 2);
   /* A's lanes list none of them any more (B's lane lists m4, which B claimed). */
   assert_int_equal (count (fx, OUTBOX_LANES_COLL, "{\"owner\": \"host/1/aaaa\", \"inFlight.0\": {\"$exists\": true}}"), 0);
   /* Settled already: a second settle of the same leases changes nothing. */
   assert_true (store_settle_many (fx->a, STORE_MANY_RELEASE, r, 4, T0 + LEASE + 3, 0, NULL, applied, &err));
   for (int i = 0; i < 4; i++)
      assert_false (applied[i]);
   store_batch_clear (&ba);
}

/* A claim that fails reconciles the owner's lanes: a listed delivery stays
 * listed only if this instance handed out its current claim; anything else
 * (as if a claim's record had reached the database without its reply) is
 * taken out and its claim generation moves on. */
static void
test_a_failed_claim_reconciles_the_lanes (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0}, again = {0};
   char ev1[32], ev2[32];
   uint32_t lane = 0;
   bson_oid_t id2;
   bson_t *doc, reply;
   bson_error_t err;
   store_claim_handler_t h = {"h", 10};
   store_claim_opts_t o = {&h, 1, 10, T0 + 1, LEASE};

   /* two unkeyed events in one lane */
   snprintf (ev1, sizeof ev1, "rc-0");
   lane = outbox_lane_id (NULL, ev1);
   for (int i = 1; i < 100000; i++) {
      snprintf (ev2, sizeof ev2, "rc-%d", i);
      if (outbox_lane_id (NULL, ev2) == lane)
         break;
   }
   add (fx, ev1, "h", NULL, 0, T0 - 20);
   claim (fx->a, "h", 1, T0, &b);
   assert_int_equal (b.n, 1);
   id2 = add (fx, ev2, "h", NULL, 0, T0 + 100000); /* not due: the scan leaves it */
   {
      /* An unrecorded pick: listed on the lane, never handed out. */
      mongoc_collection_t *lanes = coll (fx, OUTBOX_LANES_COLL);
      bson_t *q = BCON_NEW ("_id", BCON_INT32 ((int32_t) lane));
      bson_t *u = BCON_NEW ("$addToSet", "{", "inFlight", BCON_OID (&id2), "}");
      assert_true (mongoc_collection_update_one (lanes, q, u, NULL, NULL, &err));
      bson_destroy (q);
      bson_destroy (u);
      mongoc_collection_destroy (lanes);
   }
   {
      bson_t *fp = BCON_NEW ("configureFailPoint",
                             BCON_UTF8 ("failCommand"),
                             "mode",
                             "{",
                             "times",
                             BCON_INT32 (1),
                             "}",
                             "data",
                             "{",
                             "failCommands",
                             "[",
                             BCON_UTF8 ("find"),
                             "]",
                             "errorCode",
                             BCON_INT32 (2),
                             "}");
      assert_true (mongoc_client_command_simple (fx->client, "admin", fp, NULL, &reply, &err));
      bson_destroy (&reply);
      bson_destroy (fp);
   }
   assert_false (store_claim (fx->a, &o, &again, &err));
   assert_int_equal (again.n, 0);
   assert_int_equal (count (fx, OUTBOX_LANES_COLL, "{\"inFlight.1\": {\"$exists\": true}}"), 0);
   doc = get (fx, &id2);
   assert_int_equal (field (doc, "claims"), 1);
   assert_int_equal (field (doc, "attempts"), 0);
   bson_destroy (doc);
   /* The claim this instance did hand out is still good. */
   assert_true (complete1 (fx->a, &b.items[0], T0 + 2));
   store_batch_clear (&b);
}

/* Lane exclusivity: while A holds a lane under a live lease, B sees none of
 * its pending deliveries, even idle ones; after the lease B takes it. */
static void
test_lane_exclusivity (void **state)
{
   fx_t *fx = *state;
   store_batch_t ba = {0}, bb = {0};

   add (fx, "x-1", "h", "k", 1, T0 - 10);
   add (fx, "x-2", "h2", "k", 1, T0 - 10); /* same key, other handler: same lane */
   claim (fx->a, "h", 10, T0, &ba);
   assert_int_equal (ba.n, 1);
   claim (fx->b, "h2", 10, T0 + 1, &bb);
   assert_int_equal (bb.n, 0); /* idle in A's lane, invisible to B */
   store_batch_clear (&bb);
   claim (fx->b, "h2", 10, T0 + LEASE + 1, &bb);
   assert_int_equal (bb.n, 1);
   assert_string_equal (bb.items[0].handler, "h2");
   store_batch_clear (&ba);
   store_batch_clear (&bb);
}

/* Two dispatchers with different handlers claim the same lane number at
 * once, each in its handler's lane space (an instance per space, as the
 * dispatcher makes them): A holds the lane for "slow", and B's claim of
 * "fast", a delivery of the same key, does not wait for it.  The lanes are
 * documents of their own, recorded with their handler, and an operator's
 * bury still sees a delivery such a lane lists as running. */
static void
test_handlers_claim_the_same_lane_at_once (void **state)
{
   fx_t *fx = *state;
   store_spaces_t sa = {.base = fx->a}, sb = {.base = fx->b}, sb2 = {.base = fx->a};
   store_t *a = store_spaces_of (&sa, "slow");
   store_t *b = store_spaces_of (&sb, "fast");
   store_batch_t ba = {0}, bb = {0};
   uint32_t lane = outbox_lane_id ("k", "y-1");
   char q[200], hex[25];
   const char *ids[1] = {hex};
   size_t n_buried = 9;
   bson_error_t err;

   assert_true (outbox_lane_space_of ("slow") != outbox_lane_space_of ("fast"));
   assert_true (outbox_lane_space_of ("slow") >= OUTBOX_LANE_SPACES);
   assert_ptr_equal (store_spaces_of (&sa, "slow"), a);
   assert_string_equal (store_space_handler (b), "fast");
   /* Set up twice, by two instances of the space: its documents once. */
   if (!store_setup_space (a, &err) || !store_setup_space (b, &err) || !store_setup_space (store_spaces_of (&sb2, "fast"), &err))
      fail_msg ("setup space: %s", err.message);
   snprintf (q, sizeof q, "{\"_id\": {\"$gte\": %d, \"$lt\": %d}, \"handler\": \"fast\", \"epoch\": 0}",
             outbox_lane_doc_id (outbox_lane_space_of ("fast"), 0), outbox_lane_doc_id (outbox_lane_space_of ("fast"), 0) + OUTBOX_LANES);
   assert_int_equal (count (fx, OUTBOX_LANES_COLL, q), OUTBOX_LANES); /* once, though set up twice */

   add (fx, "y-1", "slow", "k", 1, T0 - 10);
   add (fx, "y-1", "fast", "k", 1, T0 - 10);
   claim (a, "slow", 10, T0, &ba);
   assert_int_equal (ba.n, 1);
   assert_string_equal (ba.items[0].handler, "slow");
   claim (b, "fast", 10, T0 + 1, &bb);
   assert_int_equal (bb.n, 1);
   assert_string_equal (bb.items[0].handler, "fast");
   assert_int_equal (bb.items[0].sequence, 1);
   snprintf (q, sizeof q, "{\"_id\": %d, \"owner\": \"host/1/aaaa\"}", outbox_lane_doc_id (outbox_lane_space_of ("slow"), lane));
   assert_int_equal (count (fx, OUTBOX_LANES_COLL, q), 1);
   snprintf (q, sizeof q, "{\"_id\": %d, \"owner\": \"host/2/bbbb\"}", outbox_lane_doc_id (outbox_lane_space_of ("fast"), lane));
   assert_int_equal (count (fx, OUTBOX_LANES_COLL, q), 1);

   /* Running in B's handler lane: the operator's bury leaves it. */
   bson_oid_to_string (&bb.items[0].id, hex);
   if (!store_bury_ids (fx->a, ids, 1, T0 + 2, "operator", &n_buried, &err))
      fail_msg ("bury: %s", err.message);
   assert_int_equal (n_buried, 0);

   assert_true (complete1 (b, &bb.items[0], T0 + 2));
   assert_true (complete1 (a, &ba.items[0], T0 + 3));
   store_batch_clear (&ba);
   store_batch_clear (&bb);
   store_spaces_clear (&sa);
   store_spaces_clear (&sb);
   store_spaces_clear (&sb2);
}

/* Two owners with different handler sets, a dispatcher (dispatch lane
 * space) and a consumer thread (pull lane space), claim the same lane
 * number at once: each in a lane document of its own space, so neither
 * waits for the other, however long it holds its lane.  Each space keeps
 * its own fencing (settling, renewal) and its own takeover with the lost
 * attempt charged. */
static void
test_lane_spaces_claim_the_same_lane_at_once (void **state)
{
   fx_t *fx = *state;
   store_t *c = new_store (fx, "host/3/cccc"), *d = new_store (fx, "host/4/dddd");
   store_batch_t ba = {0}, bc = {0}, bc2 = {0}, ba2 = {0}, bd = {0};
   uint32_t lane = outbox_lane_id ("k", "x-1");
   char q[160];
   bool applied = false;
   bson_error_t err;

   store_set_lane_space (c, OUTBOX_LANE_SPACE_PULL);
   store_set_lane_space (d, OUTBOX_LANE_SPACE_PULL);
   add (fx, "x-1", "hook", "k", 1, T0 - 10);
   add (fx, "x-1", "pull", "k", 1, T0 - 10);
   add (fx, "x-2", "hook", "k", 2, T0 - 5);
   add (fx, "x-2", "pull", "k", 2, T0 - 5);

   claim (fx->a, "hook", 10, T0, &ba);
   assert_int_equal (ba.n, 1);
   assert_int_equal (ba.items[0].sequence, 1);
   /* The same lane number, held by A for "hook": the consumer's claim of
    * "pull" does not wait for it. */
   claim (c, "pull", 10, T0 + 1, &bc);
   assert_int_equal (bc.n, 1);
   assert_string_equal (bc.items[0].handler, "pull");
   assert_int_equal (bc.items[0].sequence, 1);
   snprintf (q, sizeof q, "{\"_id\": %d, \"owner\": \"host/1/aaaa\"}", outbox_lane_doc_id (OUTBOX_LANE_SPACE_DISPATCH, lane));
   assert_int_equal (count (fx, OUTBOX_LANES_COLL, q), 1);
   snprintf (q, sizeof q, "{\"_id\": %d, \"owner\": \"host/3/cccc\"}", outbox_lane_doc_id (OUTBOX_LANE_SPACE_PULL, lane));
   assert_int_equal (count (fx, OUTBOX_LANES_COLL, q), 1);

   /* The consumer settles in its space while A still runs "hook" #1: its
    * key's next delivery comes at once; A's key still waits for #1. */
   {
      store_ref_t r = ref (&bc.items[0]);
      if (!store_extend_many (c, &r, 1, T0 + 2, LEASE, &applied, &err))
         fail_msg ("extend: %s", err.message);
      assert_true (applied);
   }
   assert_true (complete1 (c, &bc.items[0], T0 + 3));
   claim (c, "pull", 10, T0 + 4, &bc2);
   assert_int_equal (bc2.n, 1);
   assert_int_equal (bc2.items[0].sequence, 2);
   claim (fx->a, "hook", 10, T0 + 5, &ba2);
   assert_int_equal (ba2.n, 0);
   store_batch_clear (&ba2);
   assert_true (complete1 (fx->a, &ba.items[0], T0 + 6));
   claim (fx->a, "hook", 10, T0 + 7, &ba2);
   assert_int_equal (ba2.n, 1);
   assert_int_equal (ba2.items[0].sequence, 2);

   /* The consumer's claim of #2 lapses (a lease from T0 + 4 and the
    * claim's own duration): another instance of the pull space takes the
    * lane over and charges it. */
   claim (d, "pull", 10, T0 + 4 + 2 * LEASE, &bd);
   assert_int_equal (bd.n, 1);
   assert_int_equal (bd.items[0].sequence, 2);
   assert_int_equal (bd.items[0].attempt, 2);
   snprintf (q, sizeof q, "{\"_id\": %d, \"owner\": \"host/4/dddd\"}", outbox_lane_doc_id (OUTBOX_LANE_SPACE_PULL, lane));
   assert_int_equal (count (fx, OUTBOX_LANES_COLL, q), 1);
   /* A's lane of the dispatch space was not touched by either. */
   snprintf (q, sizeof q, "{\"_id\": %d, \"owner\": \"host/1/aaaa\"}", outbox_lane_doc_id (OUTBOX_LANE_SPACE_DISPATCH, lane));
   assert_int_equal (count (fx, OUTBOX_LANES_COLL, q), 1);

   store_batch_clear (&ba);
   store_batch_clear (&ba2);
   store_batch_clear (&bc);
   store_batch_clear (&bc2);
   store_batch_clear (&bd);
   store_destroy (c);
   store_destroy (d);
}

/* A claim that hands a lane back parks the waiting deliveries it found
 * there, however few; they come back once their predecessor finishes. */
static void
test_a_lane_handed_back_parks_its_waiting_deliveries (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0};
   bson_error_t err;
   bool applied;
   store_ref_t r;

   add (fx, "hb-1", "h", "few", 1, T0 - 40);
   add (fx, "hb-2", "h", "few", 2, T0 - 30);
   add (fx, "hb-3", "h", "few", 3, T0 - 20);
   claim (fx->a, "h", 10, T0, &b);
   assert_int_equal (b.n, 1);
   r = ref (&b.items[0]);
   /* the head fails and is due again later */
   assert_true (store_reschedule (fx->a, &r, T0 + 1, T0 + 5000, "HTTP 500", &applied, &err));
   assert_true (applied);
   store_batch_clear (&b);
   /* nothing to run: the lane goes back, its two waiting deliveries park */
   claim (fx->a, "h", 10, T0 + 2, &b);
   assert_int_equal (b.n, 0);
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{\"lane\": \"parked\"}"), 2);
   assert_int_equal (count (fx, OUTBOX_LANES_COLL, "{\"owner\": {\"$ne\": null}}"), 0);
   store_batch_clear (&b);
   /* the head is due again and completes; then seq 2 and seq 3 follow */
   claim (fx->b, "h", 10, T0 + 5001, &b);
   assert_int_equal (b.n, 1);
   assert_int_equal (b.items[0].sequence, 1);
   assert_int_equal (b.items[0].attempt, 2);
   assert_true (complete1 (fx->b, &b.items[0], T0 + 5002));
   store_batch_clear (&b);
   for (int seq = 2; seq <= 3; seq++) {
      claim (fx->b, "h", 10, T0 + 5002 + seq, &b);
      assert_int_equal (b.n, 1);
      assert_int_equal (b.items[0].sequence, seq);
      assert_true (complete1 (fx->b, &b.items[0], T0 + 5003 + seq));
      store_batch_clear (&b);
   }
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{}"), 0);
}

/* A claim writes no delivery document, and a completion no lane document. */
static void
test_claims_write_no_delivery_and_completions_no_lane (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0};
   bson_t *doc;
   int64_t epoch_before;

   add (fx, "w-1", "h", NULL, 0, T0 - 10);
   claim (fx->a, "h", 1, T0, &b);
   assert_int_equal (b.n, 1);
   doc = get (fx, &b.items[0].id);
   assert_int_equal (field (doc, "updatedAt"), -1); /* never written */
   assert_int_equal (field (doc, "claims"), 0);
   bson_destroy (doc);
   epoch_before = count (fx, OUTBOX_LANES_COLL, "{\"inFlight.0\": {\"$exists\": true}}");
   assert_int_equal (epoch_before, 1);
   assert_true (complete1 (fx->a, &b.items[0], T0 + 1));
   /* the lane still lists it: the next claim of its owner cleans up */
   assert_int_equal (count (fx, OUTBOX_LANES_COLL, "{\"inFlight.0\": {\"$exists\": true}}"), 1);
   store_batch_clear (&b);
   claim (fx->a, "h", 1, T0 + 2, &b);
   assert_int_equal (b.n, 0);
   /* A's lanes list none of them any more (B's lane lists m4, which B claimed). */
   assert_int_equal (count (fx, OUTBOX_LANES_COLL, "{\"owner\": \"host/1/aaaa\", \"inFlight.0\": {\"$exists\": true}}"), 0);
   assert_int_equal (count (fx, OUTBOX_LANES_COLL, "{\"owner\": {\"$ne\": null}}"), 0);
   store_batch_clear (&b);
}

/* Commands the double counted since the last call (monitoring left out). */
static int64_t
commands_since (fx_t *fx, bson_t *by_name)
{
   bson_t *cmd = BCON_NEW ("doubleStats", BCON_INT32 (1), "reset", BCON_INT32 (1));
   bson_t reply;
   bson_error_t err;
   bson_iter_t it, child;
   int64_t total = 0;

   if (!mongoc_client_command_simple (fx->client, "admin", cmd, NULL, &reply, &err))
      fail_msg ("doubleStats: %s", err.message);
   if (bson_iter_init_find (&it, &reply, "commands") && BSON_ITER_HOLDS_DOCUMENT (&it) && bson_iter_recurse (&it, &child))
      while (bson_iter_next (&child)) {
         const char *name = bson_iter_key (&child);
         if (!strcmp (name, "hello") || !strcmp (name, "isMaster") || !strcmp (name, "ismaster") ||
             !strcmp (name, "ping") || !strcmp (name, "endSessions") || !strcmp (name, "doubleStats"))
            continue;
         total += bson_iter_as_int64 (&child);
         if (by_name)
            BSON_APPEND_INT64 (by_name, name, bson_iter_as_int64 (&child));
      }
   bson_destroy (&reply);
   bson_destroy (cmd);
   return total;
}

/* completeMany costs two commands per batch (the delete and the events'
 * completion time) when its refs name their events, as the dispatcher's
 * do, four when they do not (the deliveries and lanes are read first),
 * whatever its size and however many lanes it spans, and writes no lane
 * document. */
static void
test_complete_many_costs_two_commands (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0};
   store_ref_t refs[12];
   bool done[12];
   bson_t by_name = BSON_INITIALIZER;
   bson_error_t err;
   char ev[32];
   bson_iter_t it;

   for (int i = 0; i < 12; i++) {
      snprintf (ev, sizeof ev, "cm-%d", i);
      add (fx, ev, "h", i % 2 ? NULL : ev, 1, T0 - 100 + i);
   }
   claim (fx->a, "h", 12, T0, &b);
   assert_int_equal (b.n, 12);
   for (size_t i = 0; i < b.n; i++) {
      refs[i] = ref (&b.items[i]);
      if (i >= 6)
         refs[i].event_id = NULL; /* the second half: as a caller that does not know them */
   }
   commands_since (fx, NULL);
   assert_true (store_complete_many (fx->a, refs, 6, T0 + 1, done, &err));
   for (size_t i = 0; i < 6; i++)
      assert_true (done[i]);
   assert_int_equal (commands_since (fx, &by_name), 2);
   assert_true (bson_iter_init_find (&it, &by_name, "delete") && bson_iter_as_int64 (&it) == 1);
   assert_true (bson_iter_init_find (&it, &by_name, "update") && bson_iter_as_int64 (&it) == 1);
   assert_int_equal (count (fx, OUTBOX_EVENTS, "{\"completedAt\": {\"$exists\": true}}"), 6);
   bson_destroy (&by_name);
   bson_init (&by_name);
   commands_since (fx, NULL);
   assert_true (store_complete_many (fx->a, refs + 6, 6, T0 + 1, done + 6, &err));
   for (size_t i = 6; i < 12; i++)
      assert_true (done[i]);
   assert_int_equal (commands_since (fx, &by_name), 4);
   assert_true (bson_iter_init_find (&it, &by_name, "find") && bson_iter_as_int64 (&it) == 2);
   assert_true (bson_iter_init_find (&it, &by_name, "delete") && bson_iter_as_int64 (&it) == 1);
   assert_true (bson_iter_init_find (&it, &by_name, "update") && bson_iter_as_int64 (&it) == 1);
   assert_false (bson_iter_init_find (&it, &by_name, "findAndModify"));
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{}"), 0);
   assert_int_equal (count (fx, OUTBOX_EVENTS, "{\"completedAt\": {\"$exists\": true}}"), 12);
   bson_destroy (&by_name);
   store_batch_clear (&b);
}

/* One completeMany for the claims of two lane spaces of one owner
 * (store_ref_t.space, the dispatcher's flush of several handlers): the
 * same two commands as for one space, every delivery proven completed,
 * and each instance told what it settled: its next claim hands its lanes
 * back without reading the completed deliveries again. */
static void
test_complete_many_across_spaces_costs_two_commands (void **state)
{
   fx_t *fx = *state;
   store_spaces_t sp = {.base = fx->a};
   store_t *x = store_spaces_of (&sp, "sx"), *y = store_spaces_of (&sp, "sy");
   store_batch_t bx = {0}, by = {0}, again = {0};
   store_ref_t refs[8];
   bool done[8];
   bson_t by_name = BSON_INITIALIZER;
   bson_error_t err;
   char ev[32], q[200];
   size_t n = 0;

   assert_true (x != y);
   if (!store_setup_space (x, &err) || !store_setup_space (y, &err))
      fail_msg ("setup space: %s", err.message);
   for (int i = 0; i < 4; i++) {
      snprintf (ev, sizeof ev, "xs-%d", i);
      add (fx, ev, "sx", i % 2 ? NULL : ev, 1, T0 - 100 + i);
      add (fx, ev, "sy", i % 2 ? NULL : ev, 1, T0 - 100 + i);
   }
   claim (x, "sx", 4, T0, &bx);
   claim (y, "sy", 4, T0, &by);
   assert_int_equal (bx.n, 4);
   assert_int_equal (by.n, 4);
   for (size_t i = 0; i < 4; i++) {
      refs[n] = ref (&bx.items[i]);
      refs[n++].space = x;
      refs[n] = ref (&by.items[i]);
      refs[n++].space = y;
   }
   commands_since (fx, NULL);
   assert_true (store_complete_many (x, refs, n, T0 + 1, done, &err));
   for (size_t i = 0; i < n; i++)
      assert_true (done[i]);
   assert_int_equal (commands_since (fx, &by_name), 2);
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{\"handler\": {\"$in\": [\"sx\", \"sy\"]}}"), 0);
   /* Each space's next claim finds nothing and hands its lanes back: it
    * knew its claims settled. */
   claim (x, "sx", 4, T0 + 2, &again);
   assert_int_equal (again.n, 0);
   store_batch_clear (&again);
   claim (y, "sy", 4, T0 + 2, &again);
   assert_int_equal (again.n, 0);
   for (int k = 0; k < 2; k++) {
      uint32_t space = outbox_lane_space_of (k ? "sy" : "sx");
      snprintf (q, sizeof q, "{\"_id\": {\"$gte\": %d, \"$lt\": %d}, \"owner\": {\"$ne\": null}}", outbox_lane_doc_id (space, 0),
                outbox_lane_doc_id (space, 0) + OUTBOX_LANES);
      assert_int_equal (count (fx, OUTBOX_LANES_COLL, q), 0);
   }
   bson_destroy (&by_name);
   store_batch_clear (&again);
   store_batch_clear (&bx);
   store_batch_clear (&by);
   store_spaces_clear (&sp);
}

/* With completion history, a batch is one transaction: the same reads and
 * writes plus one insert of the records and the commit. */
static void
test_complete_many_with_history_is_one_transaction (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0};
   store_ref_t refs[8];
   bool done[8];
   bson_t by_name = BSON_INITIALIZER;
   bson_error_t err;
   char ev[32];
   bson_iter_t it;

   for (int i = 0; i < 8; i++) {
      snprintf (ev, sizeof ev, "ch-%d", i);
      add (fx, ev, "h", NULL, 0, T0 - 100 + i);
   }
   claim (fx->a, "h", 8, T0, &b);
   assert_int_equal (b.n, 8);
   for (size_t i = 0; i < b.n; i++)
      refs[i] = ref (&b.items[i]);
   commands_since (fx, NULL);
   assert_true (store_complete_many (fx->a, refs, b.n, T0 + 1, done, &err));
   assert_int_equal (commands_since (fx, &by_name), 6);
   assert_true (bson_iter_init_find (&it, &by_name, "insert") && bson_iter_as_int64 (&it) == 1);
   assert_true (bson_iter_init_find (&it, &by_name, "commitTransaction") && bson_iter_as_int64 (&it) == 1);
   assert_int_equal (count (fx, OUTBOX_COMPLETED, "{}"), 8);
   bson_destroy (&by_name);
   store_batch_clear (&b);
}


/* ------------------------------------------------- faults of the reference */

/* Configures failCommand from JSON (mode and data). */
static void
failpoint (fx_t *fx, const char *json)
{
   bson_error_t err;
   bson_t *cmd = bson_new_from_json ((const uint8_t *) json, -1, &err);
   bson_t reply;
   bool ok;

   if (!cmd)
      fail_msg ("fail point JSON: %s", err.message);
   ok = mongoc_client_command_simple (fx->client, "admin", cmd, NULL, &reply, &err);
   bson_destroy (&reply);
   bson_destroy (cmd);
   if (!ok)
      fail_msg ("configureFailPoint: %s", err.message);
}

static void
failpoint_off (fx_t *fx)
{
   failpoint (fx, "{\"configureFailPoint\": \"failCommand\", \"mode\": \"off\"}");
}

/* ------------------------------------------------------ attempt records */

/* The expireAfterSeconds of <prefix>attempts' index `name`: -1 when the
 * index has none, -2 when there is no such index. */
static int64_t
ttl_of (fx_t *fx, const char *name)
{
   mongoc_collection_t *c = coll (fx, OUTBOX_ATTEMPTS);
   mongoc_cursor_t *cur = mongoc_collection_find_indexes_with_opts (c, NULL);
   const bson_t *doc;
   int64_t ttl = -2;

   while (mongoc_cursor_next (cur, &doc))
      if (sfield (doc, "name") && !strcmp (sfield (doc, "name"), name))
         ttl = field (doc, "expireAfterSeconds");
   mongoc_cursor_destroy (cur);
   mongoc_collection_destroy (c);
   return ttl;
}

/* The records of delivery `id` in the order they ended. */
static bson_t *
records_of (fx_t *fx, const bson_oid_t *id, int64_t *n)
{
   mongoc_collection_t *c = coll (fx, OUTBOX_ATTEMPTS);
   bson_t *q = BCON_NEW ("deliveryId", BCON_OID (id));
   bson_t *opts = BCON_NEW ("sort", "{", "endedAt", BCON_INT32 (1), "_id", BCON_INT32 (1), "}");
   mongoc_cursor_t *cur = mongoc_collection_find_with_opts (c, q, opts, NULL);
   const bson_t *doc;
   bson_t *out = bson_new ();
   char key[16];

   *n = 0;
   while (mongoc_cursor_next (cur, &doc)) {
      snprintf (key, sizeof key, "%" PRId64, (*n)++);
      BSON_APPEND_DOCUMENT (out, key, doc);
   }
   mongoc_cursor_destroy (cur);
   bson_destroy (q);
   bson_destroy (opts);
   mongoc_collection_destroy (c);
   return out;
}

/* Record i of records_of's array into *out, borrowed from it (a static
 * bson_t points into itself: never copied by value). */
static void
record_at (const bson_t *recs, int i, bson_t *out)
{
   char key[16];
   bson_iter_t it;
   const uint8_t *data;
   uint32_t len;

   snprintf (key, sizeof key, "%d", i);
   if (!bson_iter_init_find (&it, recs, key) || !BSON_ITER_HOLDS_DOCUMENT (&it))
      fail_msg ("no record %d", i);
   bson_iter_document (&it, &len, &data);
   assert_true (bson_init_static (out, data, len));
}

static store_attempt_t
an_attempt (outbox_attempt_outcome_t outcome, int32_t n, int64_t started, int64_t ms, int32_t status, const char *error)
{
   store_attempt_t a = {.handler = "h",
                        .outcome = outcome,
                        .attempt = n,
                        .started_at = started,
                        .duration_ms = ms,
                        .status = status,
                        .error = error};
   bson_oid_init (&a.id, NULL);
   return a;
}

/* Set-up makes <prefix>attempts with its indexes and a TTL index of the
 * configured window ([outbox] attempt_history); a set-up with another
 * window changes it (collMod), without recreating the index; an instance
 * without attempt history leaves the collection as it is. */
static void
test_attempt_records_ttl_index_follows_the_window (void **state)
{
   fx_t *fx = *state;
   store_opts_t o = {.database = fx->db, .prefix = "relaybus_", .owner = "host/3/cccc", .attempt_history_ms = 90500};
   bson_error_t err;
   store_t *other;

   assert_int_equal (ttl_of (fx, "expires"), 3600);
   assert_int_equal (ttl_of (fx, "delivery"), -1);
   assert_int_equal (ttl_of (fx, "event"), -1);
   assert_int_equal (ttl_of (fx, "handler"), -1);
   /* Again with the same window: nothing changes. */
   assert_true (store_setup (fx->b, &err));
   assert_int_equal (ttl_of (fx, "expires"), 3600);
   /* Another window (rounded up to whole seconds). */
   other = store_new (fx->pool, &o, &err);
   assert_non_null (other);
   assert_true (store_setup (other, &err));
   assert_int_equal (ttl_of (fx, "expires"), 91);
   store_destroy (other);
   /* attempt_history = 0: the collection and its window stay. */
   o.attempt_history_ms = 0;
   other = store_new (fx->pool, &o, &err);
   assert_true (store_setup (other, &err));
   assert_int_equal (ttl_of (fx, "expires"), 91);
   store_destroy (other);
}

/* Without attempt history set-up makes no attempts collection. */
static void
test_no_attempt_records_without_attempt_history (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0};
   store_attempt_t a = an_attempt (OUTBOX_ATTEMPT_SUCCEEDED, 1, T0, 5, 204, NULL);
   store_ref_t r;
   bool done;
   bson_error_t err;
   mongoc_database_t *db = mongoc_client_get_database (fx->client, fx->db);
   char name[OUTBOX_NAME_MAX];

   add (fx, "e1", "h", NULL, 0, T0 - 10);
   claim (fx->a, "h", 1, T0, &b);
   r = ref (&b.items[0]);
   r.attempt = &a;
   assert_true (store_complete_many (fx->a, &r, 1, T0 + 1, &done, &err) && done);
   assert_true (outbox_collection_name ("relaybus_", OUTBOX_ATTEMPTS, name, sizeof name));
   assert_false (mongoc_database_has_collection (db, name, &err));
   mongoc_database_destroy (db);
   store_batch_clear (&b);
}

/* Every settling call records the attempt it ends, with the fields of
 * store_attempt_t: a completion (without a read), a retry with its HTTP
 * status and masked error, a release, a bury, a release of many; a stale
 * lease records nothing. */
static void
test_every_settling_call_records_its_attempt (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0};
   store_ref_t r;
   bool applied, done;
   bson_error_t err;
   bson_t *recs, rec;
   int64_t n;
   bson_oid_t id;
   store_attempt_t a;

   add (fx, "e1", "h", NULL, 0, T0 - 10);
   claim (fx->a, "h", 1, T0, &b);
   id = b.items[0].id;
   r = ref (&b.items[0]);
   a = an_attempt (OUTBOX_ATTEMPT_FAILED, 1, T0, 120, 503, "HTTP 503: see http://u:hunter2@example.com/x");
   a.response = "down for maintenance";
   r.attempt = &a;
   assert_true (store_reschedule (fx->a, &r, T0 + 200, T0 + 200, "HTTP 503", &applied, &err) && applied);
   /* The stale lease of that claim: nothing is recorded. */
   a = an_attempt (OUTBOX_ATTEMPT_FAILED, 1, T0, 1, 500, "late");
   assert_true (store_reschedule (fx->a, &r, T0 + 300, T0 + 300, "late", &applied, &err) && !applied);
   store_batch_clear (&b);

   claim (fx->a, "h", 1, T0 + 400, &b);
   r = ref (&b.items[0]);
   a = an_attempt (OUTBOX_ATTEMPT_RELEASED, 2, T0 + 400, 10, 410, "HTTP 410");
   r.attempt = &a;
   assert_true (store_release (fx->a, &r, T0 + 410, &applied, &err) && applied);
   store_batch_clear (&b);

   claim (fx->a, "h", 1, T0 + 500, &b);
   r = ref (&b.items[0]);
   a = an_attempt (OUTBOX_ATTEMPT_SUCCEEDED, 2, T0 + 500, 7, 204, NULL);
   a.response = "ok";
   r.attempt = &a;
   assert_true (store_complete_many (fx->a, &r, 1, T0 + 507, &done, &err) && done);
   store_batch_clear (&b);

   recs = records_of (fx, &id, &n);
   assert_int_equal (n, 3);
   record_at (recs, 0, &rec);
   assert_string_equal (sfield (&rec, "outcome"), "failed");
   assert_string_equal (sfield (&rec, "eventId"), "e1");
   assert_string_equal (sfield (&rec, "handler"), "h");
   assert_string_equal (sfield (&rec, "instance"), "host/1/aaaa");
   assert_int_equal (field (&rec, "attempt"), 1);
   assert_int_equal (field (&rec, "status"), 503);
   assert_int_equal (field (&rec, "startedAt"), T0);
   assert_int_equal (field (&rec, "endedAt"), T0 + 200);
   assert_int_equal (field (&rec, "durationMs"), 120);
   assert_non_null (strstr (sfield (&rec, "error"), "HTTP 503: see http://u:********@example.com/x"));
   assert_null (strstr (sfield (&rec, "error"), "hunter2"));
   assert_string_equal (sfield (&rec, "response"), "down for maintenance");
   record_at (recs, 1, &rec);
   assert_string_equal (sfield (&rec, "outcome"), "released");
   assert_int_equal (field (&rec, "attempt"), 2);
   assert_int_equal (field (&rec, "status"), 410);
   record_at (recs, 2, &rec);
   assert_string_equal (sfield (&rec, "outcome"), "succeeded");
   assert_int_equal (field (&rec, "status"), 204);
   assert_int_equal (field (&rec, "durationMs"), 7);
   assert_string_equal (sfield (&rec, "response"), "ok");
   bson_destroy (recs);

   /* A bury, and a release of many in one transaction. */
   add (fx, "e2", "h", NULL, 0, T0 - 10);
   add (fx, "e3", "h", NULL, 0, T0 - 10);
   claim (fx->a, "h", 2, T0 + 1000, &b);
   assert_int_equal (b.n, 2);
   {
      store_attempt_t a0 = an_attempt (OUTBOX_ATTEMPT_REFUSED, 1, T0 + 1000, 3, 0, "rabbitmq: the broker refused the message (basic.nack)");
      store_attempt_t a1 = an_attempt (OUTBOX_ATTEMPT_RELEASED, 1, T0 + 1000, 4, 0, NULL);
      store_ref_t rs[1];
      bool ap[1];

      r = ref (&b.items[0]);
      r.attempt = &a0;
      assert_true (store_bury (fx->a, &r, T0 + 1003, "nack", &applied, &err) && applied);
      rs[0] = ref (&b.items[1]);
      rs[0].attempt = &a1;
      assert_true (store_settle_many (fx->a, STORE_MANY_RELEASE, rs, 1, T0 + 1004, 0, NULL, ap, &err) && ap[0]);
      recs = records_of (fx, &b.items[0].id, &n);
      assert_int_equal (n, 1);
      record_at (recs, 0, &rec);
      assert_string_equal (sfield (&rec, "outcome"), "refused");
      assert_string_equal (sfield (&rec, "error"), "rabbitmq: the broker refused the message (basic.nack)");
      assert_int_equal (field (&rec, "status"), -1);
      bson_destroy (recs);
      recs = records_of (fx, &b.items[1].id, &n);
      assert_int_equal (n, 1);
      record_at (recs, 0, &rec);
      assert_string_equal (sfield (&rec, "outcome"), "released");
      bson_destroy (recs);
   }
   store_batch_clear (&b);
}

/* A completion records its batch's attempts with one insert beside its
 * delete, whatever the batch's size; the events' completion times of a
 * second's completions are written together once that second is over
 * (the records hold each one's time).  A completion tried again with the
 * same attempts (its first try failed after the insert) records each
 * once. */
static void
test_complete_many_records_with_one_insert (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0};
   store_ref_t refs[10];
   store_attempt_t at[10];
   bool done[10];
   bson_t by_name = BSON_INITIALIZER;
   bson_error_t err;
   bson_iter_t it;
   char ev[32];

   if (fx->dbl.pid == 0)
      skip (); /* doubleStats */
   for (int i = 0; i < 10; i++) {
      snprintf (ev, sizeof ev, "ca-%d", i);
      add (fx, ev, "h", NULL, 0, T0 - 100 + i);
   }
   claim (fx->a, "h", 10, T0, &b);
   assert_int_equal (b.n, 10);
   for (size_t i = 0; i < b.n; i++) {
      refs[i] = ref (&b.items[i]);
      at[i] = an_attempt (OUTBOX_ATTEMPT_SUCCEEDED, 1, T0, 3, 200, NULL);
      refs[i].attempt = &at[i];
   }
   /* The first try fails at the delete, after the insert. */
   failpoint (fx, "{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1}, \"data\": {\"failCommands\": [\"delete\"], "
                  "\"errorCode\": 91}}");
   assert_false (store_complete_many (fx->a, refs, b.n, T0 + 5, done, &err));
   failpoint_off (fx);
   assert_int_equal (count (fx, OUTBOX_ATTEMPTS, "{}"), 10);
   commands_since (fx, NULL);
   assert_true (store_complete_many (fx->a, refs, b.n, T0 + 6, done, &err));
   for (size_t i = 0; i < b.n; i++)
      assert_true (done[i]);
   assert_int_equal (commands_since (fx, &by_name), 2);
   assert_true (bson_iter_init_find (&it, &by_name, "insert") && bson_iter_as_int64 (&it) == 1);
   assert_true (bson_iter_init_find (&it, &by_name, "delete") && bson_iter_as_int64 (&it) == 1);
   assert_false (bson_iter_init_find (&it, &by_name, "update"));
   assert_int_equal (count (fx, OUTBOX_ATTEMPTS, "{}"), 10);
   /* The events' completion times wait for the end of their second. */
   assert_int_equal (count (fx, OUTBOX_EVENTS, "{\"completedAt\": {\"$exists\": true}}"), 0);
   assert_false (store_completion_times_due (fx->a, T0 + 999));
   assert_true (store_completion_times_due (fx->a, T0 + 1000));
   bson_reinit (&by_name);
   commands_since (fx, NULL);
   assert_true (store_retry_deferred (fx->a, NULL, &err));
   assert_int_equal (commands_since (fx, &by_name), 1);
   assert_true (bson_iter_init_find (&it, &by_name, "update") && bson_iter_as_int64 (&it) == 1);
   assert_int_equal (count (fx, OUTBOX_EVENTS, "{\"completedAt\": {\"$date\": 1700000001000}}"), 10);
   assert_int_equal (count (fx, OUTBOX_ATTEMPTS, "{\"outcome\": \"succeeded\", \"status\": 200}"), 10);
   bson_destroy (&by_name);
   store_batch_clear (&b);
}

/* In a transaction, a record goes with it: a settling transaction that
 * aborts (a transient error on its insert) and runs again writes its
 * record once; with completion history the completion's records are in
 * its one transaction. */
static void
test_a_record_in_an_aborted_transaction_is_written_once (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0};
   store_attempt_t a = an_attempt (OUTBOX_ATTEMPT_FAILED, 1, T0, 9, 500, "HTTP 500");
   store_attempt_t c = an_attempt (OUTBOX_ATTEMPT_SUCCEEDED, 1, T0, 9, 200, NULL);
   store_ref_t r;
   bool applied, done;
   bson_error_t err;
   int64_t n;
   bson_t *recs;

   add (fx, "e1", "h", NULL, 0, T0 - 10);
   add (fx, "e2", "h", NULL, 0, T0 - 10);
   claim (fx->a, "h", 2, T0, &b);
   assert_int_equal (b.n, 2);
   r = ref (&b.items[0]);
   r.attempt = &a;
   failpoint (fx, "{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1}, \"data\": {\"failCommands\": [\"insert\"], "
                  "\"errorCode\": 112, \"errorLabels\": [\"TransientTransactionError\"]}}");
   assert_true (store_reschedule (fx->a, &r, T0 + 20, T0 + 5000, "HTTP 500", &applied, &err) && applied);
   failpoint_off (fx);
   recs = records_of (fx, &b.items[0].id, &n);
   assert_int_equal (n, 1);
   bson_destroy (recs);
   r = ref (&b.items[1]);
   r.attempt = &c;
   failpoint (fx, "{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1}, \"data\": {\"failCommands\": [\"insert\"], "
                  "\"errorCode\": 112, \"errorLabels\": [\"TransientTransactionError\"]}}");
   assert_true (store_complete_many (fx->a, &r, 1, T0 + 30, &done, &err) && done);
   failpoint_off (fx);
   recs = records_of (fx, &b.items[1].id, &n);
   assert_int_equal (n, 1);
   bson_destroy (recs);
   assert_int_equal (count (fx, OUTBOX_COMPLETED, "{}"), 1);
   store_batch_clear (&b);
}

/* A takeover's charge of a lost claim records it as lease_lost, with its
 * event, handler and attempt number, in the charge's command batch; an
 * operator's bury records "buried" with its reason. */
static void
test_lost_and_operator_buried_attempts_are_recorded (void **state)
{
   fx_t *fx = *state;
   store_batch_t ba = {0}, bb = {0};
   int64_t later = T0 + LEASE + 1, n;
   bson_t *recs, rec;
   bson_error_t err;
   size_t buried;
   bson_oid_t e2;
   char hex[25];
   const char *ids[1];

   add (fx, "e1", "h", NULL, 0, T0 - 10);
   claim (fx->a, "h", 1, T0, &ba);
   claim (fx->b, "h", 1, later, &bb);
   assert_int_equal (bb.n, 1);
   recs = records_of (fx, &ba.items[0].id, &n);
   assert_int_equal (n, 1);
   record_at (recs, 0, &rec);
   assert_string_equal (sfield (&rec, "outcome"), "lease_lost");
   assert_string_equal (sfield (&rec, "eventId"), "e1");
   assert_string_equal (sfield (&rec, "handler"), "h");
   assert_string_equal (sfield (&rec, "instance"), "host/2/bbbb"); /* the taker */
   assert_int_equal (field (&rec, "attempt"), 1);
   assert_int_equal (field (&rec, "endedAt"), later);
   bson_destroy (recs);

   e2 = add (fx, "e2", "h", NULL, 0, T0 - 10);
   bson_oid_to_string (&e2, hex);
   ids[0] = hex;
   assert_true (store_bury_ids (fx->a, ids, 1, later + 5, "buried by an operator: broken payload", &buried, &err));
   assert_int_equal (buried, 1);
   recs = records_of (fx, &e2, &n);
   assert_int_equal (n, 1);
   record_at (recs, 0, &rec);
   assert_string_equal (sfield (&rec, "outcome"), "buried");
   assert_string_equal (sfield (&rec, "error"), "buried by an operator: broken payload");
   assert_int_equal (field (&rec, "attempt"), 1);
   bson_destroy (recs);
   store_batch_clear (&ba);
   store_batch_clear (&bb);
}

/* With attempt history the purge judges an event whose completion time is
 * not written yet (it waits for the end of its second, or a crash lost
 * it) by its records: a succeeded attempt keeps it until completed_before
 * passes that attempt's end. */
static void
test_purge_reads_the_records_for_a_completion_time_not_written (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0};
   store_attempt_t a = an_attempt (OUTBOX_ATTEMPT_SUCCEEDED, 1, T0 + 40, 5, 204, NULL);
   store_ref_t r;
   bool done;
   bson_error_t err;
   store_purge_opts_t po = {0};
   store_purge_result_t pr;

   add (fx, "old-1", "h", NULL, 0, T0 - 100000);
   claim (fx->a, "h", 1, T0 + 40, &b);
   r = ref (&b.items[0]);
   r.attempt = &a;
   assert_true (store_complete_many (fx->a, &r, 1, T0 + 45, &done, &err) && done);
   store_batch_clear (&b);
   assert_int_equal (count (fx, OUTBOX_EVENTS, "{\"_id\": \"old-1\", \"completedAt\": {\"$exists\": true}}"), 0);
   /* Created long before both cutoffs, its completion after them: kept. */
   po.dead_before = T0 + 10;
   po.completed_before = T0 + 10;
   assert_true (store_purge (fx->a, &po, &pr, &err));
   assert_int_equal (pr.events, 0);
   assert_int_equal (count (fx, OUTBOX_EVENTS, "{\"_id\": \"old-1\"}"), 1);
   /* Once completed_before passes the attempt's end: gone. */
   po.completed_before = T0 + 100;
   assert_true (store_purge (fx->a, &po, &pr, &err));
   assert_int_equal (pr.events, 1);
   assert_int_equal (count (fx, OUTBOX_EVENTS, "{\"_id\": \"old-1\"}"), 0);
}

/* The admin views' reads: a delivery's attempts in order and its state
 * (running while a lane lists it, completed once deleted with a record of
 * success), an event's deliveries with their states and attempts, the
 * latest attempts by handler and outcome, paged. */
static void
test_attempt_history_reads (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0};
   store_attempt_t a;
   store_ref_t r;
   bool applied, done, more;
   bson_error_t err;
   store_delivery_history_t h;
   store_event_history_t ev;
   bson_oid_t id, unknown;
   bson_t page = BSON_INITIALIZER;
   store_attempts_filter_t f = {0};

   id = add (fx, "e1", "h", NULL, 0, T0 - 10);
   add (fx, "e1", "g", NULL, 0, T0 - 10);
   claim (fx->a, "h", 1, T0, &b);
   assert_true (store_delivery_history (fx->a, &id, 100, &h, &err));
   assert_true (h.found);
   assert_string_equal (h.state, "running");
   assert_int_equal (bson_count_keys (&h.attempts), 0);
   store_delivery_history_clear (&h);
   r = ref (&b.items[0]);
   a = an_attempt (OUTBOX_ATTEMPT_FAILED, 1, T0, 10, 500, "HTTP 500");
   r.attempt = &a;
   assert_true (store_reschedule (fx->a, &r, T0 + 10, T0 + 11, "HTTP 500", &applied, &err) && applied);
   store_batch_clear (&b);
   assert_true (store_delivery_history (fx->a, &id, 100, &h, &err));
   assert_string_equal (h.state, "pending");
   assert_int_equal (bson_count_keys (&h.attempts), 1);
   store_delivery_history_clear (&h);
   claim (fx->a, "h", 1, T0 + 20, &b);
   r = ref (&b.items[0]);
   a = an_attempt (OUTBOX_ATTEMPT_SUCCEEDED, 2, T0 + 20, 4, 204, NULL);
   r.attempt = &a;
   assert_true (store_complete_many (fx->a, &r, 1, T0 + 24, &done, &err) && done);
   store_batch_clear (&b);
   assert_true (store_delivery_history (fx->a, &id, 100, &h, &err));
   assert_true (h.found);
   assert_string_equal (h.state, "completed");
   assert_int_equal (bson_count_keys (&h.attempts), 2);
   assert_false (h.more);
   store_delivery_history_clear (&h);
   assert_true (store_delivery_history (fx->a, &id, 1, &h, &err));
   assert_int_equal (bson_count_keys (&h.attempts), 1);
   assert_true (h.more);
   store_delivery_history_clear (&h);
   bson_oid_init (&unknown, NULL);
   assert_true (store_delivery_history (fx->a, &unknown, 100, &h, &err));
   assert_false (h.found);
   store_delivery_history_clear (&h);

   assert_true (store_event_history (fx->a, "e1", &ev, &err));
   assert_true (ev.found);
   assert_string_equal (sfield (&ev.event, "_id"), "e1");
   assert_int_equal (bson_count_keys (&ev.deliveries), 1); /* g's; h's completed without history */
   assert_string_equal (page_str (&ev.deliveries, 0, "handler"), "g");
   assert_string_equal (page_str (&ev.deliveries, 0, "state"), "pending");
   assert_int_equal (bson_count_keys (&ev.attempts), 2);
   store_event_history_clear (&ev);
   assert_true (store_event_history (fx->a, "no-such-event", &ev, &err));
   assert_false (ev.found);
   store_event_history_clear (&ev);

   f.handler = "h";
   f.outcome = "failed";
   assert_true (store_attempts_list (fx->a, &f, &page, &more, &err));
   assert_int_equal (bson_count_keys (&page), 1);
   assert_false (more);
   bson_reinit (&page);
   f.outcome = NULL;
   f.limit = 1;
   assert_true (store_attempts_list (fx->a, &f, &page, &more, &err));
   assert_int_equal (bson_count_keys (&page), 1);
   assert_true (more);
   assert_string_equal (page_str (&page, 0, "outcome"), "succeeded"); /* latest first */
   {
      int64_t ended;
      bson_oid_t last = page_id (&page, 0, NULL);
      bson_t rec;
      record_at (&page, 0, &rec);
      ended = field (&rec, "endedAt");
      bson_reinit (&page);
      f.before_ended = ended;
      f.before_id = &last;
      assert_true (store_attempts_list (fx->a, &f, &page, &more, &err));
      assert_int_equal (bson_count_keys (&page), 1);
      assert_string_equal (page_str (&page, 0, "outcome"), "failed");
      assert_false (more);
   }
   bson_reinit (&page);
   f.before_id = NULL;
   f.since = T0 + 24;
   f.limit = 100;
   assert_true (store_attempts_list (fx->a, &f, &page, &more, &err));
   assert_int_equal (bson_count_keys (&page), 1);
   bson_reinit (&page);
   f.handler = "{\"$ne\": null}";
   f.since = 0;
   assert_true (store_attempts_list (fx->a, &f, &page, &more, &err));
   assert_int_equal (bson_count_keys (&page), 0);
   bson_destroy (&page);
}


/* An event id of `prefix` whose unkeyed delivery falls in `lane`. */
static void
event_in_lane (const char *prefix, uint32_t lane, char *out, size_t len)
{
   for (int i = 0; i < 1000000; i++) {
      snprintf (out, len, "%s-%d", prefix, i);
      if (outbox_lane_id (NULL, out) == lane)
         return;
   }
   fail_msg ("no event id in lane %u", lane);
}

/* A delivery document as the publisher writes it (no event: the claim
 * attaches none), for bulk inserts. */
static bson_t *
delivery_doc (const char *event_id, const char *key, int64_t seq, const char *lane, int64_t due)
{
   bson_t *d = bson_new ();
   bson_oid_t id;

   bson_oid_init (&id, NULL);
   BSON_APPEND_OID (d, "_id", &id);
   BSON_APPEND_UTF8 (d, "eventId", event_id);
   BSON_APPEND_UTF8 (d, "handler", "h");
   BSON_APPEND_UTF8 (d, "eventType", "order.placed.v1");
   if (key) {
      BSON_APPEND_UTF8 (d, "key", key);
      BSON_APPEND_INT64 (d, "sequence", seq);
   }
   BSON_APPEND_INT32 (d, "laneId", (int32_t) outbox_lane_id (key, event_id));
   BSON_APPEND_UTF8 (d, "lane", lane);
   BSON_APPEND_UTF8 (d, "status", "pending");
   BSON_APPEND_INT32 (d, "attempts", 0);
   BSON_APPEND_INT32 (d, "claims", 0);
   BSON_APPEND_DATE_TIME (d, "dueAt", due);
   BSON_APPEND_DATE_TIME (d, "createdAt", due);
   return d;
}

static void
insert_docs (fx_t *fx, bson_t **docs, size_t n)
{
   mongoc_collection_t *del = coll (fx, OUTBOX_DELIVERIES);
   bson_error_t err;

   for (size_t i = 0; i < n; i += 1000) {
      size_t m = n - i < 1000 ? n - i : 1000;
      if (!mongoc_collection_insert_many (del, (const bson_t **) docs + i, m, NULL, NULL, &err))
         fail_msg ("insert: %s", err.message);
   }
   for (size_t i = 0; i < n; i++)
      bson_destroy (docs[i]);
   mongoc_collection_destroy (del);
}

static int32_t
lease_claims (const char *lease)
{
   outbox_lease_t l;
   assert_true (outbox_lease_parse (lease, &l));
   return l.claims;
}

/* H1: a completion flush that fails (a failover: the connection drops)
 * leaves the delivery listed in its lane's inFlight.  It stays fenced while
 * its claim's lease runs, and once this instance has neither settled nor
 * renewed it for a lease, its own next claim takes it back and hands it
 * out again: with a single proxy, nothing waits for a restart. */
static void
test_h1_failed_flush_runnable_within_lease (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0}, mid = {0}, again = {0};
   store_ref_t r;
   bool done = true;
   bson_error_t err;

   add (fx, "h1-0", "h", NULL, 0, T0 - 10);
   claim (fx->a, "h", 1, T0, &b);
   assert_int_equal (b.n, 1);
   r = ref (&b.items[0]);
   failpoint (fx,
              "{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1}, "
              "\"data\": {\"failCommands\": [\"delete\"], \"closeConnection\": true}}");
   assert_false (store_complete_many (fx->a, &r, 1, T0 + 1, &done, &err));
   assert_false (done);
   failpoint_off (fx);
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{}"), 1);

   /* Within the claim's lease it still counts as running. */
   claim (fx->a, "h", 1, T0 + LEASE / 2, &mid);
   assert_int_equal (mid.n, 0);
   /* One lease later it runs again, under a new claim generation. */
   claim (fx->a, "h", 1, T0 + LEASE, &again);
   assert_int_equal (again.n, 1);
   assert_true (bson_oid_equal (&again.items[0].id, &b.items[0].id));
   assert_true (lease_claims (again.items[0].lease) > lease_claims (b.items[0].lease));
   assert_false (complete1 (fx->a, &b.items[0], T0 + LEASE + 1)); /* the old lease is fenced off */
   assert_true (complete1 (fx->a, &again.items[0], T0 + LEASE + 2));
   store_batch_clear (&b);
   store_batch_clear (&mid);
   store_batch_clear (&again);
}

/* H1: the same for a reschedule whose transaction fails. */
static void
test_h1_failed_reschedule_runnable_within_lease (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0}, again = {0};
   store_ref_t r;
   bool applied = true;
   bson_error_t err;

   add (fx, "h1r-0", "h", "k", 1, T0 - 10);
   claim (fx->a, "h", 1, T0, &b);
   assert_int_equal (b.n, 1);
   r = ref (&b.items[0]);
   failpoint (fx,
              "{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1}, "
              "\"data\": {\"failCommands\": [\"update\"], \"errorCode\": 91, \"errorLabels\": []}}");
   assert_false (store_reschedule (fx->a, &r, T0 + 1, T0 + 2, "boom", &applied, &err));
   failpoint_off (fx);
   claim (fx->a, "h", 1, T0 + LEASE, &again);
   assert_int_equal (again.n, 1);
   assert_true (bson_oid_equal (&again.items[0].id, &b.items[0].id));
   assert_true (complete1 (fx->a, &again.items[0], T0 + LEASE + 1));
   store_batch_clear (&b);
   store_batch_clear (&again);
}

/* M1: relinquish moves the claim generations on before it empties the
 * lane.  A failure between the two writes leaves the lane held; no other
 * worker can claim a listed delivery under the generation of the claim
 * being released. */
static void
test_m1_relinquish_no_gap (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0}, bb = {0}, bb2 = {0};
   bson_error_t err;
   bool ok;

   add (fx, "m1-0", "h", NULL, 0, T0 - 10);
   claim (fx->a, "h", 1, T0, &b);
   assert_int_equal (b.n, 1);
   failpoint (fx,
              "{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1}, "
              "\"data\": {\"failCommands\": [\"update\"], \"errorCode\": 91, \"errorLabels\": []}}");
   ok = store_relinquish (fx->a, T0 + 1, &err);
   failpoint_off (fx);
   (void) ok;
   claim (fx->b, "h", 1, T0 + 2, &bb);
   /* Whatever B sees, it never sees the released claim's generation. */
   assert_true (bb.n == 0 || lease_claims (bb.items[0].lease) > lease_claims (b.items[0].lease));
   if (bb.n == 0) {
      assert_true (store_relinquish (fx->a, T0 + 3, &err));
      claim (fx->b, "h", 1, T0 + 4, &bb2);
      assert_int_equal (bb2.n, 1);
      assert_true (lease_claims (bb2.items[0].lease) > lease_claims (b.items[0].lease));
      assert_true (complete1 (fx->b, &bb2.items[0], T0 + 5));
   }
   assert_false (complete1 (fx->a, &b.items[0], T0 + 6));
   store_batch_clear (&b);
   store_batch_clear (&bb);
   store_batch_clear (&bb2);
}

/* M2: a taker that charged the lost list and died before clearing it
 * leaves the list on the lane; the next taker finds it with the epoch of
 * each lost claim and charges nothing twice. */
static void
test_m2_lost_charged_once (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0}, bb = {0}, c = {0};
   store_claim_handler_t h = {"h", 1};
   store_claim_opts_t o = {&h, 1, 1, T0 + LEASE + 1, LEASE};
   bson_oid_t id;
   bson_t *doc;
   bson_error_t err;
   store_t *third;

   id = add (fx, "m2-0", "h", NULL, 0, T0 - 10);
   claim (fx->a, "h", 1, T0, &b);
   assert_int_equal (b.n, 1);
   /* B takes the lane over after A's lease: the charge passes (the
    * update that fences what was charged already, then the charge),
    * clearing the lost list fails (B dies there). */
   failpoint (fx,
              "{\"configureFailPoint\": \"failCommand\", \"mode\": {\"skip\": 2}, "
              "\"data\": {\"failCommands\": [\"update\"], \"errorCode\": 91, \"errorLabels\": []}}");
   if (store_claim (fx->b, &o, &bb, &err))
      store_batch_clear (&bb);
   failpoint_off (fx);
   doc = get (fx, &id);
   assert_int_equal (field (doc, "attempts"), 1);
   bson_destroy (doc);
   assert_int_equal (count (fx, OUTBOX_LANES_COLL, "{\"lost.0\": {\"$exists\": true}}"), 1);
   /* A third worker takes it after B's lease: one lost claim, one charge. */
   third = new_store (fx, "host/3/cccc");
   claim (third, "h", 1, T0 + 2 * LEASE + 10, &c);
   assert_int_equal (c.n, 1);
   assert_int_equal (c.items[0].attempt, 2);
   doc = get (fx, &id);
   assert_int_equal (field (doc, "attempts"), 1);
   bson_destroy (doc);
   assert_int_equal (count (fx, OUTBOX_LANES_COLL, "{\"lost.0\": {\"$exists\": true}}"), 0);
   assert_true (complete1 (third, &c.items[0], T0 + 2 * LEASE + 11));
   store_batch_clear (&b);
   store_batch_clear (&c);
   store_destroy (third);
}

/* M3: with more than 1,000 parked keys, unparking looks at them oldest
 * first, a window per claim, and resumes after the window: every parked
 * key whose head may run comes back within ceil(keys / 1000) claims. */
static void
test_m3_parked_keys_oldest_first_beyond_1000 (void **state)
{
   fx_t *fx = *state;
   enum { N_BLOCKED = 1000, N_FREE = 3 };
   bson_t *docs[2 * N_BLOCKED + 2 * N_FREE];
   size_t n = 0;
   char key[32], ev[48];
   store_batch_t b1 = {0}, b2 = {0};

   /* 1,000 keys whose head waits behind a predecessor not due yet... */
   for (int i = 0; i < N_BLOCKED; i++) {
      snprintf (key, sizeof key, "blocked-%04d", i);
      snprintf (ev, sizeof ev, "%s-1", key);
      docs[n++] = delivery_doc (ev, key, 1, "ready", T0 + 100000000);
      snprintf (ev, sizeof ev, "%s-2", key);
      docs[n++] = delivery_doc (ev, key, 2, "parked", T0 - 50000 + i);
   }
   /* ...then, written last, three keys older than all of them and three
    * younger, whose parked heads have no predecessor left. */
   for (int i = 0; i < N_FREE; i++) {
      snprintf (key, sizeof key, "old-%d", i);
      snprintf (ev, sizeof ev, "%s-2", key);
      docs[n++] = delivery_doc (ev, key, 2, "parked", T0 - 90000 + i);
      snprintf (key, sizeof key, "young-%d", i);
      snprintf (ev, sizeof ev, "%s-2", key);
      docs[n++] = delivery_doc (ev, key, 2, "parked", T0 - 100 + i);
   }
   insert_docs (fx, docs, n);

   claim (fx->a, "h", 10, T0, &b1);
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{\"key\": {\"$regex\": \"^old-\"}, \"lane\": \"parked\"}"), 0);
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{\"key\": {\"$regex\": \"^young-\"}, \"lane\": \"parked\"}"), N_FREE);
   claim (fx->a, "h", 10, T0 + 1, &b2);
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{\"key\": {\"$regex\": \"^young-\"}, \"lane\": \"parked\"}"), 0);
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{\"lane\": \"parked\"}"), N_BLOCKED);
   store_batch_clear (&b1);
   store_batch_clear (&b2);
}

/* L1: a lane whose due work lies behind more than the 4,096 deliveries a
 * scan reads, all blocked and fewer than 32 per key (never parked by the
 * threshold), while the lane runs something (never handed back): the scan
 * parks what it found blocked, and the next claim reaches the work. */
static void
test_l1_scan_cap_blocked_keys (void **state)
{
   fx_t *fx = *state;
   enum { N_KEYS = 140, PER_KEY = 30 };
   bson_t **docs = calloc (N_KEYS * (PER_KEY + 1), sizeof *docs);
   size_t n = 0;
   char key[32], ev[48], u2[48];
   uint32_t lane = outbox_lane_id (NULL, "l1-u1");
   store_batch_t b = {0}, c1 = {0}, c2 = {0};
   bson_oid_t id2;
   int found = 0;

   add (fx, "l1-u1", "h", NULL, 0, T0 - 100000);
   claim (fx->a, "h", 1, T0, &b); /* runs: the lane stays held */
   assert_int_equal (b.n, 1);
   for (int i = 0; found < N_KEYS; i++) {
      snprintf (key, sizeof key, "l1-k%d", i);
      if (outbox_lane_id (key, NULL) != lane)
         continue;
      found++;
      snprintf (ev, sizeof ev, "%s-1", key);
      docs[n++] = delivery_doc (ev, key, 1, "ready", T0 + 100000000); /* not due: blocks the rest */
      for (int s = 2; s <= PER_KEY + 1; s++) {
         snprintf (ev, sizeof ev, "%s-%d", key, s);
         docs[n++] = delivery_doc (ev, key, s, "ready", T0 - 60000 + s);
      }
   }
   insert_docs (fx, docs, n);
   free (docs);
   event_in_lane ("l1-u2", lane, u2, sizeof u2);
   id2 = add (fx, u2, "h", NULL, 0, T0 - 1);

   claim (fx->a, "h", 10, T0 + 1, &c1);
   if (c1.n == 0)
      claim (fx->a, "h", 10, T0 + 2, &c2);
   assert_true ((c1.n == 1 && bson_oid_equal (&c1.items[0].id, &id2)) ||
                (c2.n == 1 && bson_oid_equal (&c2.items[0].id, &id2)));
   store_batch_clear (&b);
   store_batch_clear (&c1);
   store_batch_clear (&c2);
}

/* L2: an operator bury reads the lanes, then buries.  A claim recording
 * the delivery in between makes it running: the bury must leave it alone. */
typedef struct {
   store_t *s;
   char id[25];
   size_t n;
   bool ok;
} bury_thread_t;

static void *
bury_thread (void *arg)
{
   bury_thread_t *t = arg;
   const char *ids[1] = {t->id};
   bson_error_t err;
   t->ok = store_bury_ids (t->s, ids, 1, T0 + 1, "operator", &t->n, &err);
   if (!t->ok)
      fprintf (stderr, "bury: %s\n", err.message);
   return NULL;
}

static void
test_l2_bury_running_refused (void **state)
{
   fx_t *fx = *state;
   mongoc_uri_t *uri = mongoc_uri_copy (fx->uri);
   mongoc_client_pool_t *pool;
   store_opts_t so = {.database = fx->db, .prefix = "relaybus_", .owner = "host/9/oper"};
   bson_error_t err;
   store_t *op;
   store_batch_t b = {0};
   bury_thread_t t = {0};
   pthread_t th;
   bson_oid_t id;
   bson_t *doc;

   mongoc_uri_set_appname (uri, "relaybus-test-operator");
   pool = mongoc_client_pool_new (uri);
   mongoc_client_pool_set_error_api (pool, MONGOC_ERROR_API_VERSION_2);
   op = store_new (pool, &so, &err);
   assert_non_null (op);
   id = add (fx, "l2-0", "h", NULL, 0, T0 - 10);
   bson_oid_to_string (&id, t.id);
   t.s = op;
   /* The operator's first update waits 1.5 s: the claim lands meanwhile. */
   failpoint (fx,
              "{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1}, "
              "\"data\": {\"failCommands\": [\"update\"], \"blockConnection\": true, \"blockTimeMS\": 1500, "
              "\"appName\": \"relaybus-test-operator\"}}");
   assert_int_equal (pthread_create (&th, NULL, bury_thread, &t), 0);
   usleep (500 * 1000);
   claim (fx->a, "h", 1, T0 + 2, &b);
   pthread_join (th, NULL);
   failpoint_off (fx);
   assert_int_equal (b.n, 1);
   assert_true (t.ok);
   assert_int_equal (t.n, 0);
   doc = get (fx, &id);
   assert_string_equal (sfield (doc, "status"), "pending");
   bson_destroy (doc);
   assert_true (complete1 (fx->a, &b.items[0], T0 + 3));
   store_batch_clear (&b);
   store_destroy (op);
   mongoc_client_pool_destroy (pool);
   mongoc_uri_destroy (uri);
}

/* L3: renewal renews every running claim of a lane.  A stale first claim
 * does not keep the lane from being extended, and each renewed claim
 * counts as running for a lease from its renewal. */
static void
test_l3_renew_all_running_jobs (void **state)
{
   fx_t *fx = *state;
   char ev1[32] = "l3-0", ev2[48];
   uint32_t lane = outbox_lane_id (NULL, ev1);
   store_batch_t b = {0}, later = {0};
   store_ref_t refs[2];
   bool applied[2] = {true, false}, rel = false;
   bson_error_t err;
   const store_delivery_t *d1, *d2;
   bson_t *ldoc;
   mongoc_collection_t *lanes = coll (fx, OUTBOX_LANES_COLL);
   bson_t *q = BCON_NEW ("_id", BCON_INT32 ((int32_t) lane));
   mongoc_cursor_t *cur;
   const bson_t *doc;

   event_in_lane ("l3b", lane, ev2, sizeof ev2);
   add (fx, ev1, "h", NULL, 0, T0 - 20);
   add (fx, ev2, "h", NULL, 0, T0 - 10);
   claim (fx->a, "h", 2, T0, &b);
   assert_int_equal (b.n, 2);
   d1 = &b.items[0];
   d2 = &b.items[1];
   /* d1's claim ends (released): its lease is stale, d2's holds. */
   refs[0] = ref (d1);
   refs[1] = ref (d2);
   /* What a worker checks before it starts a delivery: the claim's own
    * lease, this instance's only. */
   assert_int_equal (store_lease_expires (fx->a, &refs[1]), T0 + LEASE);
   assert_int_equal (store_lease_expires (fx->b, &refs[1]), 0);
   assert_true (store_release (fx->a, &refs[0], T0 + 1, &rel, &err));
   assert_true (rel);
   assert_int_equal (store_lease_expires (fx->a, &refs[0]), 0);
   assert_true (store_extend_leases (fx->a, NULL, refs, 2, T0 + LEASE / 2, LEASE, applied, &err));
   assert_false (applied[0]);
   assert_true (applied[1]);
   assert_int_equal (store_lease_expires (fx->a, &refs[1]), T0 + LEASE / 2 + LEASE);
   cur = mongoc_collection_find_with_opts (lanes, q, NULL, NULL);
   assert_true (mongoc_cursor_next (cur, &doc));
   ldoc = bson_copy (doc);
   mongoc_cursor_destroy (cur);
   assert_int_equal (field (ldoc, "leaseExpiresAt"), T0 + LEASE / 2 + LEASE);
   bson_destroy (ldoc);
   /* Past the first lease, d2 still runs (renewed): not handed out again. */
   claim (fx->a, "h", 2, T0 + LEASE + 1, &later);
   for (size_t i = 0; i < later.n; i++)
      assert_false (bson_oid_equal (&later.items[i].id, &d2->id));
   assert_true (complete1 (fx->a, d2, T0 + LEASE + 2));
   assert_int_equal (store_lease_expires (fx->a, &refs[1]), 0);
   store_batch_clear (&later);
   store_batch_clear (&b);
   bson_destroy (q);
   mongoc_collection_destroy (lanes);
}

/* A claim's lease runs from its record, not from its start: a claim that
 * the database makes slow (here: its first read waits a second) hands out
 * deliveries with their whole lease left, in this instance's record and in
 * the lane, so the worker does not give them back unstarted. */
static void
test_claim_lease_runs_from_the_record (void **state)
{
   fx_t *fx = *state;
   store_claim_handler_t h = {"h", 1};
   store_claim_opts_t o = {&h, 1, 1, T0, 3000};
   store_batch_t b = {0};
   store_ref_t r;
   bson_error_t err;
   bson_t *ldoc;
   mongoc_collection_t *lanes = coll (fx, OUTBOX_LANES_COLL);
   mongoc_cursor_t *cur;
   const bson_t *doc;
   bson_t *q;
   int64_t expires;

   add (fx, "lr-0", "h", NULL, 0, T0 - 10);
   failpoint (fx,
              "{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1}, "
              "\"data\": {\"failCommands\": [\"find\"], \"blockConnection\": true, \"blockTimeMS\": 1000}}");
   if (!store_claim (fx->a, &o, &b, &err))
      fail_msg ("claim: %s", err.message);
   failpoint_off (fx);
   assert_int_equal (b.n, 1);
   r = ref (&b.items[0]);
   expires = store_lease_expires (fx->a, &r);
   assert_true (expires >= T0 + 1000 + 3000);
   assert_true (expires < T0 + 60000 + 3000);
   q = BCON_NEW ("_id", BCON_INT32 ((int32_t) outbox_lane_id (NULL, "lr-0")));
   cur = mongoc_collection_find_with_opts (lanes, q, NULL, NULL);
   assert_true (mongoc_cursor_next (cur, &doc));
   ldoc = bson_copy (doc);
   mongoc_cursor_destroy (cur);
   assert_int_equal (field (ldoc, "leaseExpiresAt"), expires);
   assert_true (complete1 (fx->a, &b.items[0], T0 + 1));
   bson_destroy (ldoc);
   bson_destroy (q);
   mongoc_collection_destroy (lanes);
   store_batch_clear (&b);
}

/* Runs scheduled purge steps of `s` until the run is done (bounded),
 * summing what they removed; false if a step found the lease elsewhere. */
static bool
purge_run (store_t *s, int64_t now, int64_t retain, store_purge_step_result_t *sum, int *steps)
{
   store_purge_run_t run = {.active = true, .completed_before = now - retain, .dead_before = now - retain};
   store_purge_step_result_t r;
   bson_error_t err;

   memset (sum, 0, sizeof *sum);
   *steps = 0;
   for (int i = 0; i < 50; i++) {
      if (!store_purge_step (s, &run, now, LEASE, &r, &err))
         fail_msg ("purge step: %s", err.message);
      (*steps)++;
      if (!r.leased) {
         store_purge_run_clear (&run);
         return false;
      }
      sum->dead += r.dead;
      sum->completed += r.completed;
      sum->events += r.events;
      if (r.done) {
         sum->done = true;
         store_purge_run_clear (&run);
         return true;
      }
   }
   store_purge_run_clear (&run);
   fail_msg ("the purge run did not end in 50 steps");
   return false;
}

/* Scheduled retention, with completion history and one document per
 * batch: an event whose deliveries all completed before the cutoff goes
 * with its history record; one still referenced by a pending delivery
 * stays (its history record goes); a dead letter past retain_dead goes
 * with its event; what completed after the cutoff stays. */
static void
test_retention_scheduled_purge_removes_exactly_the_right_ones (void **state)
{
   fx_t *fx = *state;
   store_opts_t o = {.database = fx->db, .prefix = "relaybus_", .completion_history = true, .owner = "host/3/cccc",
                     .purge_batch_size = 1};
   store_purge_step_result_t sum;
   store_batch_t b = {0};
   bson_error_t err;
   store_t *c;
   bool applied;
   int steps;

   c = store_new (fx->pool, &o, &err);
   if (!c)
      fail_msg ("store_new: %s", err.message);
   add (fx, "e-done", "h1", NULL, 0, T0 - 100);
   add (fx, "e-shared", "h1", NULL, 0, T0 - 90);
   add (fx, "e-shared", "h2", NULL, 0, T0 + 3600000);
   add (fx, "e-dead", "h1", NULL, 0, T0 - 80);
   add (fx, "e-recent", "h1", NULL, 0, T0 - 70);
   claim (fx->a, "h1", 10, T0, &b);
   assert_int_equal (b.n, 4);
   for (size_t i = 0; i < b.n; i++) {
      store_ref_t r = ref (&b.items[i]);
      const char *ev = b.items[i].event_id;
      if (!strcmp (ev, "e-dead")) {
         assert_true (store_bury (fx->a, &r, T0 + 10, "HTTP 400", &applied, &err));
         assert_true (applied);
      } else {
         assert_true (complete1 (fx->a, &b.items[i], !strcmp (ev, "e-recent") ? T0 + 2500 : T0 + 10));
      }
   }
   store_batch_clear (&b);
   assert_int_equal (count (fx, OUTBOX_COMPLETED, "{}"), 3);

   /* retain 2 s at T0 + 3 s: the cutoffs are T0 + 1 s. */
   assert_true (purge_run (c, T0 + 3000, 2000, &sum, &steps));
   assert_true (steps > 3); /* one batch of one document per step */
   assert_int_equal (sum.dead, 1);
   assert_int_equal (sum.completed, 2);
   assert_int_equal (sum.events, 2);
   assert_int_equal (count (fx, OUTBOX_EVENTS, "{\"_id\": \"e-done\"}"), 0);
   assert_int_equal (count (fx, OUTBOX_EVENTS, "{\"_id\": \"e-dead\"}"), 0);
   assert_int_equal (count (fx, OUTBOX_EVENTS, "{\"_id\": \"e-shared\"}"), 1);
   assert_int_equal (count (fx, OUTBOX_EVENTS, "{\"_id\": \"e-recent\"}"), 1);
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{\"status\": \"dead\"}"), 0);
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{\"eventId\": \"e-shared\", \"handler\": \"h2\"}"), 1);
   assert_int_equal (count (fx, OUTBOX_COMPLETED, "{}"), 1);
   assert_int_equal (count (fx, OUTBOX_COMPLETED, "{\"eventId\": \"e-recent\"}"), 1);
   /* The purge lease is one document beside the 256 lanes, and no lane
    * carries it. */
   assert_int_equal (count (fx, OUTBOX_LANES_COLL, "{\"purgeOwner\": {\"$exists\": true}}"), 1);
   assert_int_equal (count (fx, OUTBOX_LANES_COLL, "{\"_id\": {\"$gte\": 0}, \"purgeOwner\": {\"$exists\": true}}"), 0);
   assert_int_equal (count (fx, OUTBOX_LANES_COLL, "{\"purgeOwner\": \"host/3/cccc\"}"), 1);

   /* A second run at the same time finds nothing more. */
   assert_true (purge_run (c, T0 + 3000, 2000, &sum, &steps));
   assert_int_equal (sum.dead + sum.completed + sum.events, 0);
   store_destroy (c);
}

/* Scheduled retention: while another instance holds the purge lease, a
 * step does nothing; once the lease has expired, it takes the lease and
 * purges. */
static void
test_retention_scheduled_purge_lease_makes_others_skip (void **state)
{
   fx_t *fx = *state;
   store_purge_step_result_t sum;
   store_batch_t b = {0};
   bson_error_t err;
   bool applied;
   int steps;

   add (fx, "e-dead", "h1", NULL, 0, T0 - 80);
   claim (fx->a, "h1", 10, T0, &b);
   assert_int_equal (b.n, 1);
   {
      store_ref_t r = ref (&b.items[0]);
      assert_true (store_bury (fx->a, &r, T0 + 10, "HTTP 400", &applied, &err));
      assert_true (applied);
   }
   store_batch_clear (&b);

   /* b runs first, before the dead letter is old enough: it keeps the
    * lease for LEASE ms. */
   assert_true (purge_run (fx->b, T0 + 100, 2000, &sum, &steps));
   assert_int_equal (sum.dead, 0);
   assert_false (purge_run (fx->a, T0 + 3000, 2000, &sum, &steps));
   assert_int_equal (steps, 1);
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{\"status\": \"dead\"}"), 1);
   assert_int_equal (count (fx, OUTBOX_EVENTS, "{\"_id\": \"e-dead\"}"), 1);
   /* The holder renews its own lease. */
   assert_true (purge_run (fx->b, T0 + 200, 2000, &sum, &steps));
   assert_false (purge_run (fx->a, T0 + 100 + LEASE, 2000, &sum, &steps));
   /* Past the holder's last renewal plus the lease: a takes it. */
   assert_true (purge_run (fx->a, T0 + 200 + LEASE, 2000, &sum, &steps));
   assert_int_equal (sum.dead, 1);
   assert_int_equal (sum.events, 1);
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{}"), 0);
   assert_int_equal (count (fx, OUTBOX_EVENTS, "{}"), 0);
   assert_false (purge_run (fx->b, T0 + 300 + LEASE, 2000, &sum, &steps));
}

/* L7: a take the server applied without its reply reaching the claimer
 * (a write concern error here: the update is applied, the command fails)
 * is read back, as a partial take is: the claim works with the lane now,
 * instead of leaving it unused, owned by nobody in memory, for a lease. */
static void
test_l7_a_take_applied_without_its_reply_is_read_back (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0};

   add (fx, "l7-0", "h", NULL, 0, T0 - 20);
   failpoint (fx,
              "{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1}, \"data\": {\"failCommands\": [\"update\"], "
              "\"writeConcernError\": {\"code\": 64, \"errmsg\": \"waiting for replication timed out\"}}}");
   claim (fx->a, "h", 10, T0, &b);
   failpoint_off (fx);
   assert_int_equal (b.n, 1);
   assert_true (complete1 (fx->a, &b.items[0], T0 + 1));
   store_batch_clear (&b);
}

/* L7, a takeover: the same for the take of a lane whose previous owner's
 * lease ran out with a claim in flight (one findAndModify that also moves
 * the claim to `lost`): read back, the lost claim is charged and claimed
 * again at once. */
static void
test_l7_a_takeover_applied_without_its_reply_is_read_back (void **state)
{
   fx_t *fx = *state;
   store_batch_t ba = {0}, bb = {0};

   add (fx, "l7t-0", "h", NULL, 0, T0 - 10);
   claim (fx->a, "h", 1, T0, &ba);
   assert_int_equal (ba.n, 1);
   failpoint (fx,
              "{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1}, \"data\": {\"failCommands\": [\"findAndModify\"], "
              "\"writeConcernError\": {\"code\": 64, \"errmsg\": \"waiting for replication timed out\"}}}");
   claim (fx->b, "h", 1, T0 + LEASE + 1, &bb);
   failpoint_off (fx);
   assert_int_equal (bb.n, 1);
   assert_int_equal (bb.items[0].attempt, 2);
   assert_int_equal (count (fx, OUTBOX_LANES_COLL, "{\"owner\": \"host/2/bbbb\", \"epoch\": 2}"), 1);
   store_batch_clear (&ba);
   store_batch_clear (&bb);
}

/* L7 in a handler's lane space (every claimer's instances claim in one):
 * a takeover the server applied without its reply is read back from the
 * handler's own lane document, not from the lane of that number in the
 * dispatch space: the claim works with the lane at once, instead of
 * owning it unknowingly for a lease. */
static void
test_l7_a_takeover_in_a_handler_space_is_read_back (void **state)
{
   fx_t *fx = *state;
   store_spaces_t sa = {.base = fx->a}, sb = {.base = fx->b};
   store_t *a = store_spaces_of (&sa, "h"), *b = store_spaces_of (&sb, "h");
   store_batch_t ba = {0}, bb = {0};
   bson_error_t err;
   char q[160];

   if (!store_setup_space (a, &err))
      fail_msg ("setup space: %s", err.message);
   add (fx, "l7s-0", "h", NULL, 0, T0 - 10);
   claim (a, "h", 1, T0, &ba);
   assert_int_equal (ba.n, 1);
   failpoint (fx,
              "{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1}, \"data\": {\"failCommands\": [\"findAndModify\"], "
              "\"writeConcernError\": {\"code\": 64, \"errmsg\": \"waiting for replication timed out\"}}}");
   claim (b, "h", 1, T0 + LEASE + 1, &bb);
   failpoint_off (fx);
   snprintf (q, sizeof q, "{\"_id\": %d, \"owner\": \"host/2/bbbb\", \"epoch\": 2}",
             outbox_lane_doc_id (outbox_lane_space_of ("h"), outbox_lane_id (NULL, "l7s-0")));
   assert_int_equal (count (fx, OUTBOX_LANES_COLL, q), 1);
   assert_int_equal (bb.n, 1);
   assert_int_equal (bb.items[0].attempt, 2);
   assert_true (complete1 (b, &bb.items[0], T0 + LEASE + 2));
   store_batch_clear (&ba);
   store_batch_clear (&bb);
   store_spaces_clear (&sa);
   store_spaces_clear (&sb);
}

/* A stale completion after a takeover deletes nothing.  A's claim of a
 * delivery is abandoned (charged, its claim generation moved on) and
 * claimed again by A in the same lane epoch; then B takes the lane over.
 * The delivery's lost attempt of that epoch was charged already (lostAt),
 * so B charges nothing, but the takeover still moves the claim generation
 * on: A's second lease, completed late, matches nothing, and B's claim,
 * running, is completed by B. */
static void
test_a_stale_completion_after_a_takeover_deletes_nothing (void **state)
{
   fx_t *fx = *state;
   store_batch_t b1 = {0}, b2 = {0}, bb = {0};
   bson_t *doc;

   add (fx, "stale-0", "h", NULL, 0, T0 - 10);
   claim (fx->a, "h", 1, T0, &b1);
   assert_int_equal (b1.n, 1);
   /* abandoned: charged and claimed again, in the same epoch */
   claim (fx->a, "h", 1, T0 + LEASE, &b2);
   assert_int_equal (b2.n, 1);
   assert_int_equal (b2.items[0].attempt, 2);
   assert_true (bson_oid_equal (&b1.items[0].id, &b2.items[0].id));
   /* A goes quiet; B takes the lane over once its lease ran out */
   claim (fx->b, "h", 1, T0 + 2 * LEASE + 1, &bb);
   assert_int_equal (bb.n, 1);
   assert_true (bson_oid_equal (&bb.items[0].id, &b1.items[0].id));
   /* A's worker completes its second claim late: nothing is deleted */
   assert_false (complete1 (fx->a, &b2.items[0], T0 + 2 * LEASE + 2));
   doc = get (fx, &b1.items[0].id);
   assert_non_null (doc);
   assert_int_equal (field (doc, "attempts"), 1); /* the epoch's lost attempt, charged once */
   assert_true (field (doc, "claims") > 1);       /* but no lease of that epoch holds */
   bson_destroy (doc);
   assert_true (complete1 (fx->b, &bb.items[0], T0 + 2 * LEASE + 3));
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{}"), 0);
   store_batch_clear (&b1);
   store_batch_clear (&b2);
   store_batch_clear (&bb);
}

/* An event id whose unkeyed delivery lies in another lane than `lane`. */
static void
event_not_in_lane (uint32_t lane, const char *prefix, char *out, size_t size)
{
   for (int i = 0;; i++) {
      snprintf (out, size, "%s-%d", prefix, i);
      if (outbox_lane_id (NULL, out) != lane)
         return;
   }
}

/* A lane whose charge cannot land yet does not fail the claim.  A's
 * claim of D1 is abandoned while an open transaction (a consumer killed
 * after its completion inside it) holds D1: the charge of the abandoned
 * claim runs out of time.  The claim leaves that lane alone and claims D2
 * from another lane; the next claims leave the lane alone too, without
 * trying, until its backoff passed; once the transaction is gone, D1 is
 * charged its attempt and claimed again. */
static void
blocked_charge_run (fx_t *fx, store_t *s)
{
   store_batch_t b = {0}, mid = {0}, again = {0}, after = {0};
   mongoc_client_session_t *session;
   mongoc_collection_t *del = coll (fx, OUTBOX_DELIVERIES);
   bson_t opts = BSON_INITIALIZER;
   bson_t *q, *u;
   bson_error_t err;
   char ev2[32];
   bson_oid_t d1, d2;
   bson_t *doc;

   d1 = add (fx, "blk-1", "h", NULL, 0, T0 - 10);
   claim (s, "h", 1, T0, &b);
   assert_int_equal (b.n, 1);
   /* A transaction that wrote D1 and stays open. */
   session = mongoc_client_start_session (fx->client, NULL, &err);
   if (!session || !mongoc_client_session_start_transaction (session, NULL, &err) ||
       !mongoc_client_session_append (session, &opts, &err))
      fail_msg ("transaction: %s", err.message);
   q = BCON_NEW ("_id", BCON_OID (&d1));
   u = BCON_NEW ("$set", "{", "touched", BCON_BOOL (true), "}");
   if (!mongoc_collection_update_one (del, q, u, &opts, NULL, &err))
      fail_msg ("update in the transaction: %s", err.message);
   event_not_in_lane (outbox_lane_id (NULL, "blk-1"), "blk-2", ev2, sizeof ev2);
   d2 = add (fx, ev2, "h", NULL, 0, T0 - 5);

   /* D1's claim is abandoned: its charge waits for the transaction */
   claim (s, "h", 10, T0 + LEASE + 1, &mid);
   assert_int_equal (mid.n, 1);
   assert_true (bson_oid_equal (&mid.items[0].id, &d2));
   claim (s, "h", 10, T0 + LEASE + 2, &again);
   assert_int_equal (again.n, 0);
   doc = get (fx, &d1);
   assert_int_equal (field (doc, "attempts"), 0);
   bson_destroy (doc);

   if (!mongoc_client_session_abort_transaction (session, &err))
      fail_msg ("abort: %s", err.message);
   /* past the lane's backoff: charged, and claimed again */
   claim (s, "h", 10, T0 + LEASE + 20000, &after);
   assert_int_equal (after.n, 1);
   assert_true (bson_oid_equal (&after.items[0].id, &d1));
   assert_int_equal (after.items[0].attempt, 2);
   doc = get (fx, &d1);
   assert_int_equal (field (doc, "attempts"), 1);
   bson_destroy (doc);
   assert_true (complete1 (s, &after.items[0], T0 + LEASE + 20001));
   assert_true (complete1 (s, &mid.items[0], T0 + LEASE + 20002));
   bson_destroy (q);
   bson_destroy (u);
   bson_destroy (&opts);
   mongoc_client_session_destroy (session);
   mongoc_collection_destroy (del);
   store_batch_clear (&b);
   store_batch_clear (&mid);
   store_batch_clear (&again);
   store_batch_clear (&after);
}

/* The consumer thread's instance: its writes bounded at 200 ms. */
static void
test_a_blocked_charge_skips_its_lane (void **state)
{
   fx_t *fx = *state;

   store_set_max_time_ms (fx->a, 200);
   blocked_charge_run (fx, fx->a);
}

/* The dispatcher's: an instance of the handler's lane space, its charges
 * bounded by the take's own bound (1 s). */
static void
test_a_blocked_charge_skips_its_lane_when_dispatching (void **state)
{
   fx_t *fx = *state;
   store_spaces_t sp = {.base = fx->b};
   store_t *s = store_spaces_of (&sp, "h");
   bson_error_t err;

   if (!store_setup_space (s, &err))
      fail_msg ("setup space: %s", err.message);
   blocked_charge_run (fx, s);
   store_spaces_clear (&sp);
}

/* L8: the fleet's read takes the documents newest heartbeat first, and of
 * the ones past the first FLEET_MAX_INSTANCES only those that declare a name
 * the newer ones lack: 300 documents a crash-looping fleet left behind
 * (sorting before the live instance's _id) push out neither the live
 * instance nor the one old declaration of a handler nobody else declares. */
static void
test_l8_fleet_read_past_256_dead_instances (void **state)
{
   fx_t *fx = *state;
   mongoc_collection_t *h = coll (fx, OUTBOX_HANDLERS);
   bson_t **docs = calloc (FLEET_MAX_DOCS, sizeof *docs);
   bson_t *fields = BCON_NEW ("handlers", "[", "{", "name", BCON_UTF8 ("live"), "events", "[", BCON_UTF8 ("x"), "]", "}", "]");
   bool self = false, rare = false;
   size_t n = 0;
   bson_error_t err;

   for (int i = 0; i < 300; i++) {
      char id[32];
      bson_t *d;

      snprintf (id, sizeof id, "crash/%03d", i);
      d = BCON_NEW ("_id", BCON_UTF8 (id), "heartbeatAt", BCON_DATE_TIME (T0 - 1000 * i), "handlers", "[", "{", "name",
                    BCON_UTF8 (i == 299 ? "rare" : "crashing"), "events", "[", BCON_UTF8 ("x"), "]", "}", "]");
      if (!mongoc_collection_insert_one (h, d, NULL, NULL, &err))
         fail_msg ("insert: %s", err.message);
      bson_destroy (d);
   }
   if (!store_fleet_announce (fx->a, fields, &err))
      fail_msg ("announce: %s", err.message);
   if (!store_fleet_read (fx->a, docs, FLEET_MAX_INSTANCES, FLEET_MAX_DOCS, &n, &err))
      fail_msg ("read: %s", err.message);
   assert_int_equal (n, FLEET_MAX_INSTANCES + 1);
   for (size_t i = 0; i < n; i++) {
      bson_iter_t it;

      self = self || (bson_iter_init_find (&it, docs[i], "_id") && !strcmp (bson_iter_utf8 (&it, NULL), "host/1/aaaa"));
      rare = rare || (bson_iter_init_find (&it, docs[i], "_id") && !strcmp (bson_iter_utf8 (&it, NULL), "crash/299"));
      bson_destroy (docs[i]);
   }
   assert_true (self);
   assert_true (rare);
   free (docs);
   bson_destroy (fields);
   mongoc_collection_destroy (h);
}

/* Retirement buries only what this fleet declared: the declaration
 * records (store_fleet_record_declared) name the handlers proxies of the
 * fleet declared once, and outlive the instance documents; a handler
 * another program names in the same outbox has pending deliveries but
 * no record.  The fleet's read takes the instance documents only. */
static void
test_retirement_goes_by_the_declaration_records (void **state)
{
   fx_t *fx = *state;
   const char *ours[] = {"ours", "ours"};
   char *names[] = {"ours", "foreign", "never"};
   bool declared[3];
   bson_t **docs = calloc (FLEET_MAX_DOCS, sizeof *docs);
   bson_t *fields = BCON_NEW ("handlers", "[", "{", "name", BCON_UTF8 ("ours"), "events", "[", BCON_UTF8 ("x"), "]", "}", "]");
   char **pending = NULL;
   size_t n = 0;
   bson_error_t err;

   (void) add (fx, "rt-0", "ours", NULL, 0, T0);
   (void) add (fx, "rt-1", "foreign", NULL, 0, T0);
   if (!store_fleet_announce (fx->a, fields, &err) || !store_fleet_record_declared (fx->a, ours, 2, &err) ||
       !store_fleet_record_declared (fx->b, ours, 1, &err))
      fail_msg ("record: %s", err.message);
   /* One record per name, however often recorded. */
   assert_int_equal (count (fx, OUTBOX_HANDLERS, "{\"_id\": {\"$type\": \"object\"}}"), 1);
   if (!store_fleet_pending_handlers (fx->a, &pending, &n, 16, &err))
      fail_msg ("pending: %s", err.message);
   assert_int_equal (n, 2);
   for (size_t i = 0; i < n; i++)
      free (pending[i]);
   free (pending);
   if (!store_fleet_declared (fx->a, names, 3, declared, &err))
      fail_msg ("declared: %s", err.message);
   assert_true (declared[0]);
   assert_false (declared[1]);
   assert_false (declared[2]);
   /* The instance documents are forgotten; the record stays. */
   if (!store_fleet_forget (fx->b, T0 * 2, &err))
      fail_msg ("forget: %s", err.message);
   assert_int_equal (count (fx, OUTBOX_HANDLERS, "{\"_id\": {\"$type\": \"string\"}}"), 0);
   if (!store_fleet_declared (fx->a, names, 1, declared, &err))
      fail_msg ("declared: %s", err.message);
   assert_true (declared[0]);
   /* The fleet's read skips the records. */
   if (!store_fleet_announce (fx->a, fields, &err) || !store_fleet_read (fx->a, docs, FLEET_MAX_INSTANCES, FLEET_MAX_DOCS, &n, &err))
      fail_msg ("read: %s", err.message);
   assert_int_equal (n, 1);
   bson_destroy (docs[0]);
   free (docs);
   bson_destroy (fields);
}

/* Sets fields of a lane document by hand (a version before 0.2.0 left it). */
static void
old_lane_set (fx_t *fx, int32_t id, bson_t *set)
{
   mongoc_collection_t *c = coll (fx, OUTBOX_LANES_COLL);
   bson_t *q = BCON_NEW ("_id", BCON_INT32 (id));
   bson_t u = BSON_INITIALIZER;
   bson_error_t err;

   BSON_APPEND_DOCUMENT (&u, "$set", set);
   if (!mongoc_collection_update_one (c, q, &u, NULL, NULL, &err))
      fail_msg ("lane: %s", err.message);
   bson_destroy (&u);
   bson_destroy (q);
   bson_destroy (set);
   mongoc_collection_destroy (c);
}

static bson_t *
lane_get (fx_t *fx, int32_t id)
{
   mongoc_collection_t *c = coll (fx, OUTBOX_LANES_COLL);
   bson_t *q = BCON_NEW ("_id", BCON_INT32 (id));
   mongoc_cursor_t *cur = mongoc_collection_find_with_opts (c, q, NULL, NULL);
   const bson_t *doc;
   bson_t *out = NULL;

   if (mongoc_cursor_next (cur, &doc))
      out = bson_copy (doc);
   mongoc_cursor_destroy (cur);
   bson_destroy (q);
   mongoc_collection_destroy (c);
   return out;
}

static size_t
array_len (const bson_t *doc, const char *name)
{
   bson_iter_t it, child;
   size_t n = 0;

   if (doc && bson_iter_init_find (&it, doc, name) && BSON_ITER_HOLDS_ARRAY (&it) && bson_iter_recurse (&it, &child))
      while (bson_iter_next (&child))
         n++;
   return n;
}

/* The 0.1.0 leftovers: a proxy of the first version (one shared lane
 * space, _id 0..255) killed with claims in flight, and one killed
 * between a takeover and its charge, left lanes listing deliveries that
 * nobody of 0.2.0 takes over: they counted as running for ever and an
 * operator could not bury them.  Released once their lease expired:
 * every listed pending delivery is charged its lost attempt once (a lost
 * list's by lostAt), except one that a claimer of this version runs in
 * its handler's space; the lanes are emptied, and the deliveries can be
 * buried. */
static void
test_lanes_a_version_before_0_2_left_are_released (void **state)
{
   fx_t *fx = *state;
   store_t *base = new_store (fx, "host/3/cccc");
   store_spaces_t spaces = {.base = base};
   store_t *c = store_spaces_of (&spaces, "h3");
   store_batch_t b1 = {0}, b3 = {0}, bc = {0};
   bson_oid_t d1, d2, d3, d4;
   char hex[25];
   const char *ids[1] = {hex};
   int32_t lane1, lane_lost = -1;
   size_t lanes = 0, charged = 0, buried = 0;
   bson_error_t err;
   bson_t *doc;

   d1 = add (fx, "old-1", "h1", NULL, 0, T0 - 10);
   d3 = add (fx, "old-3", "h3", NULL, 0, T0 - 10);
   d2 = add (fx, "old-2", "h1", NULL, 0, T0 - 5);
   d4 = add (fx, "old-4", "h1", NULL, 0, T0 - 5);
   /* The old proxy (fx->a claims in the shared space, _id 0..255) takes d1
    * and d3, and dies. */
   claim (fx->a, "h1", 1, T0, &b1);
   claim (fx->a, "h3", 1, T0, &b3);
   assert_int_equal (b1.n, 1);
   assert_true (bson_oid_equal (&b1.items[0].id, &d1));
   assert_int_equal (b3.n, 1);
   lane1 = (int32_t) outbox_lane_id (NULL, "old-1");
   /* A proxy of this version runs d3 in h3's own space. */
   if (!store_setup_space (c, &err))
      fail_msg ("space: %s", err.message);
   claim (c, "h3", 1, T0 + 1, &bc);
   assert_int_equal (bc.n, 1);
   /* Another old lane holds a takeover's lost list: d2 not charged yet,
    * d4 charged already (lostAt at the list's epoch). */
   for (int32_t l = 0; l < OUTBOX_LANES && lane_lost < 0; l++)
      if (l != lane1 && l != (int32_t) outbox_lane_id (NULL, "old-3"))
         lane_lost = l;
   old_lane_set (fx, lane_lost, BCON_NEW ("owner", BCON_UTF8 ("old/2/dead"), "leaseExpiresAt", BCON_DATE_TIME (T0), "epoch",
                                      BCON_INT64 (5), "lost", "[", BCON_OID (&d2), BCON_OID (&d4), "]", "lostEpochs", "[",
                                      BCON_INT64 (4), BCON_INT64 (4), "]"));
   {
      mongoc_collection_t *del = coll (fx, OUTBOX_DELIVERIES);
      bson_t *q = BCON_NEW ("_id", BCON_OID (&d4));
      bson_t *u = BCON_NEW ("$set", "{", "lostAt", BCON_INT64 (4), "attempts", BCON_INT32 (1), "}");
      if (!mongoc_collection_update_one (del, q, u, NULL, NULL, &err))
         fail_msg ("d4: %s", err.message);
      bson_destroy (q);
      bson_destroy (u);
      mongoc_collection_destroy (del);
   }

   /* Before its lease ends, the old proxy's lane stays; the other goes. */
   if (!store_fleet_release_old_lanes (fx->b, T0 + 2, &lanes, &charged, &err))
      fail_msg ("release: %s", err.message);
   assert_int_equal (lanes, 1);
   assert_int_equal (charged, 1);
   doc = get (fx, &d2);
   assert_int_equal (field (doc, "attempts"), 1);
   bson_destroy (doc);
   doc = get (fx, &d4);
   assert_int_equal (field (doc, "attempts"), 1);
   bson_destroy (doc);
   doc = lane_get (fx, lane_lost);
   assert_int_equal (array_len (doc, "lost"), 0);
   assert_int_equal (field (doc, "epoch"), 6);
   bson_destroy (doc);

   /* d1 counts as running while the dead lane lists it: no bury. */
   bson_oid_to_string (&d1, hex);
   if (!store_bury_ids (fx->b, ids, 1, T0 + 3, "operator", &buried, &err))
      fail_msg ("bury: %s", err.message);
   assert_int_equal (buried, 0);

   /* Past the lease: released, d1 charged, d3 left to its runner. */
   if (!store_fleet_release_old_lanes (fx->b, T0 + LEASE + 1, &lanes, &charged, &err))
      fail_msg ("release: %s", err.message);
   assert_true (lanes >= 1);
   assert_int_equal (charged, 1);
   assert_int_equal (count (fx, OUTBOX_LANES_COLL, "{\"_id\": {\"$gte\": 0, \"$lt\": 512}, \"inFlight.0\": {\"$exists\": true}}"), 0);
   doc = get (fx, &d1);
   assert_int_equal (field (doc, "attempts"), 1);
   bson_destroy (doc);
   doc = get (fx, &d3);
   assert_int_equal (field (doc, "attempts"), 0);
   bson_destroy (doc);
   doc = lane_get (fx, lane1);
   assert_null (sfield (doc, "owner"));
   bson_destroy (doc);
   /* Nothing left to release: one read. */
   if (!store_fleet_release_old_lanes (fx->b, T0 + LEASE + 2, &lanes, &charged, &err))
      fail_msg ("release: %s", err.message);
   assert_int_equal (lanes, 0);
   /* d1 can be buried now; d3's runner completes it. */
   if (!store_bury_ids (fx->b, ids, 1, T0 + LEASE + 3, "operator", &buried, &err))
      fail_msg ("bury: %s", err.message);
   assert_int_equal (buried, 1);
   assert_true (complete1 (c, &bc.items[0], T0 + LEASE + 4));
   store_batch_clear (&b1);
   store_batch_clear (&b3);
   store_batch_clear (&bc);
   store_spaces_clear (&spaces);
   store_destroy (base);
}

/* An event as a publisher without `handler` writes it (no delivery). */
static void
bare_event (fx_t *fx, const char *id, const char *type, int64_t created)
{
   mongoc_collection_t *ev = coll (fx, OUTBOX_EVENTS);
   bson_t *d = BCON_NEW ("_id", BCON_UTF8 (id), "type", BCON_UTF8 (type), "payload", "{", "}", "handlers", "[", BCON_UTF8 ("other"),
                         "]", "createdAt", BCON_DATE_TIME (created));
   bson_error_t err;

   if (!mongoc_collection_insert_one (ev, d, NULL, NULL, &err))
      fail_msg ("event: %s", err.message);
   bson_destroy (d);
   mongoc_collection_destroy (ev);
}

/* The backfill reads its window only (createdAt bounded on both sides),
 * the handler's types only (exact, or a prefix whose '.' is a dot, not
 * any character), and its sweeps: an event that becomes visible behind
 * a sweep's cursor, created at most `reach` before, is found by the next
 * one; the backfill ends with a sweep that started at or after the end. */
static void
test_backfill_sweeps_its_window_and_types (void **state)
{
   fx_t *fx = *state;
   const char *patterns[] = {"order.*", "invoice.sent"};
   store_backfill_t bf;
   size_t added = 0;
   bson_error_t err;

   bare_event (fx, "in-order", "order.placed", T0);
   bare_event (fx, "in-invoice", "invoice.sent", T0 + 10);
   bare_event (fx, "in-lookalike", "orderXplaced", T0);
   bare_event (fx, "in-other", "stock.ticked", T0);
   bare_event (fx, "in-invoice-other", "invoice.sent.v2", T0);
   bare_event (fx, "before", "order.placed", T0 - 5000);
   bare_event (fx, "after", "order.placed", T0 + 5000);
   store_backfill_init (&bf, T0 - 1000, T0 + 1000, 500);
   if (!store_fleet_backfill (fx->a, "new", patterns, 2, &bf, T0, &added, &err))
      fail_msg ("backfill: %s", err.message);
   assert_int_equal (added, 2);
   assert_int_equal (bf.read, 2);
   assert_false (bf.done);
   /* Visible now, created behind the first sweep (within its reach). */
   bare_event (fx, "late", "order.paid", T0 - 300);
   if (!store_fleet_backfill (fx->a, "new", patterns, 2, &bf, T0 + 2000, &added, &err))
      fail_msg ("backfill: %s", err.message);
   assert_int_equal (added, 1);
   assert_true (bf.done);
   assert_int_equal (bf.sweeps, 2);
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{\"handler\": \"new\"}"), 3);
   assert_int_equal (count (fx, OUTBOX_EVENTS, "{\"handlers\": \"new\"}"), 3);
   assert_int_equal (count (fx, OUTBOX_EVENTS, "{\"_id\": {\"$in\": [\"in-order\", \"in-invoice\", \"late\"]}, \"handlers\": \"new\"}"), 3);
   /* Done: nothing more is read. */
   if (!store_fleet_backfill (fx->a, "new", patterns, 2, &bf, T0 + 3000, &added, &err))
      fail_msg ("backfill: %s", err.message);
   assert_int_equal (added, 0);
   store_backfill_clear (&bf);
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown (test_claim_takes_the_oldest_due_deliveries_first, setup, teardown),
      cmocka_unit_test_setup_teardown (test_per_key_order, setup, teardown),
      cmocka_unit_test_setup_teardown (test_fencing_by_claim_generation, setup, teardown),
      cmocka_unit_test_setup_teardown (test_a_stale_lease_changes_nothing, setup, teardown),
      cmocka_unit_test_setup_teardown (test_a_takeover_charges_the_lost_attempt, setup, teardown),
      cmocka_unit_test_setup_teardown (test_an_abandoned_claim_is_charged_its_attempt, setup, teardown),
      cmocka_unit_test_setup_teardown (test_an_abandoned_and_a_lost_charge_count_once, setup, teardown),
      cmocka_unit_test_setup_teardown (test_a_claim_never_handed_out_is_taken_back_uncharged, setup, teardown),
      cmocka_unit_test_setup_teardown (test_a_poison_delivery_reaches_the_dead_letters, setup, teardown),
      cmocka_unit_test_setup_teardown (test_32_blocked_deliveries_are_parked_and_come_back, setup, teardown),
      cmocka_unit_test_setup_teardown (test_requeue_blocks_later_deliveries_of_its_key, setup, teardown),
      cmocka_unit_test_setup_teardown (test_purge_keeps_what_is_still_referenced, setup, teardown),
      cmocka_unit_test_setup_teardown (test_completion_history_off, setup, teardown),
      cmocka_unit_test_setup_teardown (test_completion_history_on, setup_history, teardown),
      cmocka_unit_test_setup_teardown (test_list_coerces_filters_to_strings, setup, teardown),
      cmocka_unit_test_setup_teardown (test_list_page_walks_every_delivery_once_in_order, setup, teardown),
      cmocka_unit_test_setup_teardown (test_list_page_filters, setup, teardown),
      cmocka_unit_test_setup_teardown (test_list_page_bad_input_matches_nothing_or_defaults, setup, teardown),
      cmocka_unit_test_setup_teardown (test_list_page_completed_history, setup_history, teardown),
      cmocka_unit_test_setup_teardown (test_relinquish_and_extend_lease, setup, teardown),
      cmocka_unit_test_setup_teardown (test_relinquish_except_keeps_lanes, setup, teardown),
      cmocka_unit_test_setup_teardown (test_settle_and_extend_many, setup, teardown),
      cmocka_unit_test_setup_teardown (test_a_failed_claim_reconciles_the_lanes, setup, teardown),
      cmocka_unit_test_setup_teardown (test_complete_many_costs_two_commands, setup, teardown),
      cmocka_unit_test_setup_teardown (test_complete_many_across_spaces_costs_two_commands, setup, teardown),
      cmocka_unit_test_setup_teardown (test_key_runs_take_consecutive_sequences_only, setup, teardown),
      cmocka_unit_test_setup_teardown (test_key_runs_stop_at_a_gap, setup, teardown),
      cmocka_unit_test_setup_teardown (test_claim_reads_what_its_batch_needs, setup, teardown),
      cmocka_unit_test_setup_teardown (test_claim_reads_on_past_what_waits, setup, teardown),
      cmocka_unit_test_setup_teardown (test_unparking_brings_back_a_run, setup, teardown),
      cmocka_unit_test_setup_teardown (test_unparking_keeps_a_place_per_handler, setup, teardown),
      cmocka_unit_test_setup_teardown (test_lane_exclusivity, setup, teardown),
      cmocka_unit_test_setup_teardown (test_lane_spaces_claim_the_same_lane_at_once, setup, teardown),
      cmocka_unit_test_setup_teardown (test_handlers_claim_the_same_lane_at_once, setup, teardown),
      cmocka_unit_test_setup_teardown (test_a_lane_handed_back_parks_its_waiting_deliveries, setup, teardown),
      cmocka_unit_test_setup_teardown (test_claims_write_no_delivery_and_completions_no_lane, setup, teardown),
      cmocka_unit_test_setup_teardown (test_complete_many_with_history_is_one_transaction, setup_history, teardown),
      cmocka_unit_test_setup_teardown (test_attempt_records_ttl_index_follows_the_window, setup_attempts, teardown),
      cmocka_unit_test_setup_teardown (test_no_attempt_records_without_attempt_history, setup, teardown),
      cmocka_unit_test_setup_teardown (test_every_settling_call_records_its_attempt, setup_attempts, teardown),
      cmocka_unit_test_setup_teardown (test_complete_many_records_with_one_insert, setup_attempts, teardown),
      cmocka_unit_test_setup_teardown (test_a_record_in_an_aborted_transaction_is_written_once, setup_attempts_history, teardown),
      cmocka_unit_test_setup_teardown (test_lost_and_operator_buried_attempts_are_recorded, setup_attempts, teardown),
      cmocka_unit_test_setup_teardown (test_attempt_history_reads, setup_attempts, teardown),
      cmocka_unit_test_setup_teardown (test_purge_reads_the_records_for_a_completion_time_not_written, setup_attempts, teardown),
      cmocka_unit_test_setup_teardown (test_h1_failed_flush_runnable_within_lease, setup, teardown),
      cmocka_unit_test_setup_teardown (test_h1_failed_reschedule_runnable_within_lease, setup, teardown),
      cmocka_unit_test_setup_teardown (test_m1_relinquish_no_gap, setup, teardown),
      cmocka_unit_test_setup_teardown (test_m2_lost_charged_once, setup, teardown),
      cmocka_unit_test_setup_teardown (test_m3_parked_keys_oldest_first_beyond_1000, setup, teardown),
      cmocka_unit_test_setup_teardown (test_l1_scan_cap_blocked_keys, setup, teardown),
      cmocka_unit_test_setup_teardown (test_l2_bury_running_refused, setup, teardown),
      cmocka_unit_test_setup_teardown (test_l3_renew_all_running_jobs, setup, teardown),
      cmocka_unit_test_setup_teardown (test_claim_lease_runs_from_the_record, setup, teardown),
      cmocka_unit_test_setup_teardown (test_retention_scheduled_purge_removes_exactly_the_right_ones, setup_history, teardown),
      cmocka_unit_test_setup_teardown (test_retention_scheduled_purge_lease_makes_others_skip, setup, teardown),
      cmocka_unit_test_setup_teardown (test_l7_a_take_applied_without_its_reply_is_read_back, setup, teardown),
      cmocka_unit_test_setup_teardown (test_l7_a_takeover_applied_without_its_reply_is_read_back, setup, teardown),
      cmocka_unit_test_setup_teardown (test_l8_fleet_read_past_256_dead_instances, setup, teardown),
      cmocka_unit_test_setup_teardown (test_retirement_goes_by_the_declaration_records, setup, teardown),
      cmocka_unit_test_setup_teardown (test_lanes_a_version_before_0_2_left_are_released, setup, teardown),
      cmocka_unit_test_setup_teardown (test_backfill_sweeps_its_window_and_types, setup, teardown),
      cmocka_unit_test_setup_teardown (test_l7_a_takeover_in_a_handler_space_is_read_back, setup, teardown),
      cmocka_unit_test_setup_teardown (test_a_stale_completion_after_a_takeover_deletes_nothing, setup, teardown),
      cmocka_unit_test_setup_teardown (test_a_blocked_charge_skips_its_lane, setup, teardown),
      cmocka_unit_test_setup_teardown (test_a_blocked_charge_skips_its_lane_when_dispatching, setup, teardown),
   };
   int rc;

   if (!getenv ("RELAYBUS_STORE_TESTS") || strcmp (getenv ("RELAYBUS_STORE_TESTS"), "1") != 0) {
      printf ("store tests skipped: they start the server double; run with RELAYBUS_STORE_TESTS=1 "
              "(scripts/test store)\n");
      return 77;
   }
   log_set_level (getenv ("RELAYBUS_TEST_DEBUG") ? LOG_LEVEL_DEBUG : LOG_LEVEL_WARN);
   /* RELAYBUS_STORE_TEST_FILTER=test_h1* runs the matching tests only. */
   if (getenv ("RELAYBUS_STORE_TEST_FILTER"))
      cmocka_set_test_filter (getenv ("RELAYBUS_STORE_TEST_FILTER"));
   mongoc_init ();
   rc = cmocka_run_group_tests_name ("store", tests, NULL, NULL);
   mongoc_cleanup ();
   return rc;
}
