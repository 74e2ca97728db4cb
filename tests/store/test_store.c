/*
 * test_store.c - the store against the server double (or MONGODB_URI), one
 * test per rule of the reference's "How it works", named after it.
 *
 * Each test starts its own double and database, writes events and
 * deliveries itself with mongoc (documents as docs/outbox-schema.md), and
 * drives one or two store instances with an explicit clock.
 */
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
#include "log.h"
#include "outbox.h"
#include "store.h"

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
} fx_t;

static int test_no;

static store_t *
new_store (fx_t *fx, const char *owner)
{
   store_opts_t o = {.database = fx->db, .prefix = "relaybus_", .completion_history = fx->history, .owner = owner};
   bson_error_t err;
   store_t *s = store_new (fx->pool, &o, &err);
   if (!s)
      fail_msg ("store_new: %s", err.message);
   return s;
}

static int
setup_with (void **state, bool history)
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
   fx->a = new_store (fx, "host/1/aaaa");
   fx->b = new_store (fx, "host/2/bbbb");
   if (!store_setup (fx->a, &err)) {
      fprintf (stderr, "store_setup: %s\n", err.message);
      return -1;
   }
   *state = fx;
   return 0;
}

static int
setup (void **state)
{
   return setup_with (state, false);
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
   store_ref_t r = {d->id, d->lease};
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
   assert_true (store_list_deliveries (fx->a, &f, &out, &err));
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
   assert_true (store_list_deliveries (fx->a, &f, &out, &err));
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

/* Untrusted input: listDeliveries filters are strings, never operators. */
static void
test_list_deliveries_coerces_filters_to_strings (void **state)
{
   fx_t *fx = *state;
   store_list_filter_t f = {.handler = "{\"$ne\": null}"};
   bson_t out = BSON_INITIALIZER;
   bson_error_t err;

   add (fx, "e1", "h", NULL, 0, T0 - 10);
   assert_true (store_list_deliveries (fx->a, &f, &out, &err));
   assert_int_equal (bson_count_keys (&out), 0);
   f.handler = "h";
   assert_true (store_list_deliveries (fx->a, &f, &out, &err));
   assert_int_equal (bson_count_keys (&out), 1);
   bson_destroy (&out);
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
   assert_int_equal (count (fx, OUTBOX_LANES_COLL, "{\"inFlight.0\": {\"$exists\": true}}"), 0);
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

/* completeMany costs four commands per batch, whatever its size and
 * however many lanes it spans, and writes no lane document. */
static void
test_complete_many_costs_four_commands (void **state)
{
   fx_t *fx = *state;
   store_batch_t b = {0};
   store_ref_t refs[12];
   bool done[12];
   bson_t by_name = BSON_INITIALIZER;
   bson_error_t err;
   char ev[32];
   bson_iter_t it;

   if (fx->dbl.pid == 0)
      skip (); /* MONGODB_URI: no doubleStats */
   for (int i = 0; i < 12; i++) {
      snprintf (ev, sizeof ev, "cm-%d", i);
      add (fx, ev, "h", i % 2 ? NULL : ev, 1, T0 - 100 + i);
   }
   claim (fx->a, "h", 12, T0, &b);
   assert_int_equal (b.n, 12);
   for (size_t i = 0; i < b.n; i++)
      refs[i] = ref (&b.items[i]);
   commands_since (fx, NULL);
   assert_true (store_complete_many (fx->a, refs, b.n, T0 + 1, done, &err));
   for (size_t i = 0; i < b.n; i++)
      assert_true (done[i]);
   assert_int_equal (commands_since (fx, &by_name), 4);
   assert_true (bson_iter_init_find (&it, &by_name, "find") && bson_iter_as_int64 (&it) == 2);
   assert_true (bson_iter_init_find (&it, &by_name, "delete") && bson_iter_as_int64 (&it) == 1);
   assert_true (bson_iter_init_find (&it, &by_name, "update") && bson_iter_as_int64 (&it) == 1);
   assert_false (bson_iter_init_find (&it, &by_name, "findAndModify"));
   assert_int_equal (count (fx, OUTBOX_DELIVERIES, "{}"), 0);
   bson_destroy (&by_name);
   store_batch_clear (&b);
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

   if (fx->dbl.pid == 0)
      skip ();
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

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown (test_claim_takes_the_oldest_due_deliveries_first, setup, teardown),
      cmocka_unit_test_setup_teardown (test_per_key_order, setup, teardown),
      cmocka_unit_test_setup_teardown (test_fencing_by_claim_generation, setup, teardown),
      cmocka_unit_test_setup_teardown (test_a_stale_lease_changes_nothing, setup, teardown),
      cmocka_unit_test_setup_teardown (test_a_takeover_charges_the_lost_attempt, setup, teardown),
      cmocka_unit_test_setup_teardown (test_a_poison_delivery_reaches_the_dead_letters, setup, teardown),
      cmocka_unit_test_setup_teardown (test_32_blocked_deliveries_are_parked_and_come_back, setup, teardown),
      cmocka_unit_test_setup_teardown (test_requeue_blocks_later_deliveries_of_its_key, setup, teardown),
      cmocka_unit_test_setup_teardown (test_purge_keeps_what_is_still_referenced, setup, teardown),
      cmocka_unit_test_setup_teardown (test_completion_history_off, setup, teardown),
      cmocka_unit_test_setup_teardown (test_completion_history_on, setup_history, teardown),
      cmocka_unit_test_setup_teardown (test_list_deliveries_coerces_filters_to_strings, setup, teardown),
      cmocka_unit_test_setup_teardown (test_relinquish_and_extend_lease, setup, teardown),
      cmocka_unit_test_setup_teardown (test_a_failed_claim_reconciles_the_lanes, setup, teardown),
      cmocka_unit_test_setup_teardown (test_complete_many_costs_four_commands, setup, teardown),
      cmocka_unit_test_setup_teardown (test_lane_exclusivity, setup, teardown),
      cmocka_unit_test_setup_teardown (test_a_lane_handed_back_parks_its_waiting_deliveries, setup, teardown),
      cmocka_unit_test_setup_teardown (test_claims_write_no_delivery_and_completions_no_lane, setup, teardown),
      cmocka_unit_test_setup_teardown (test_complete_many_with_history_is_one_transaction, setup_history, teardown),
   };
   int rc;

   if (!getenv ("RELAYBUS_STORE_TESTS") || strcmp (getenv ("RELAYBUS_STORE_TESTS"), "1") != 0) {
      printf ("store tests skipped: they start the server double; run with RELAYBUS_STORE_TESTS=1 "
              "(scripts/test store)\n");
      return 77;
   }
   log_set_level (getenv ("RELAYBUS_TEST_DEBUG") ? LOG_LEVEL_DEBUG : LOG_LEVEL_WARN);
   mongoc_init ();
   rc = cmocka_run_group_tests_name ("store", tests, NULL, NULL);
   mongoc_cleanup ();
   return rc;
}
