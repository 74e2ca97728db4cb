/*
 * store/claim.c - claims: store_claim and its steps, one after the other:
 * unparking (claim_unpark.c); the lane documents read once and the lanes
 * held first (claim_held.c), scanned (claim_scan.c); then the free lanes
 * with due work that the batch needs, oldest due first, taken together
 * and scanned (claim_lanes.c); the events of the batch; one bulkWrite
 * that records it; what the instance remembers of it; parking; the picks
 * a requeued dead letter overtook given back; reconciliation after a
 * failed claim.
 *
 * A claim writes no delivery document on the normal path: what runs is
 * what the lanes' inFlight lists name.  Parking and unparking (the slow
 * path of blocked keys) and takeover charging are the exceptions.  This
 * file keeps the claim's state (claim_t, claim_private.h) and the steps
 * that end it; it reads no due delivery itself.
 */
#include "store/store.h"
#include "store/store_private.h"
#include "store/claim_private.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/assert.h"
#include "base/log.h"

/* After a failed claim: the owner's lanes on this instance keep only the
 * claims this instance handed out and has not seen settled (one
 * transaction). */
static bool store_reconcile (store_t *s, mongoc_client_t *client, bson_error_t *error);

/* Frees what a claimed delivery owns (not the delivery itself). */
static void
delivery_free (store_delivery_t *d)
{
   char *owned[] = {d->event_id, d->handler, d->event_type, d->key};

   for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++)
      bson_free (owned[i]);
   bson_destroy (d->event);
}

void
store_batch_clear (store_batch_t *b)
{
   if (!b)
      return;
   for (size_t i = 0; i < b->n; i++)
      delivery_free (&b->items[i]);
   bson_free (b->items);
   memset (b, 0, sizeof *b);
}

claim_key_t *
claim_key_get (claim_t *c, const char *handler, const char *key)
{
   uint32_t h = outbox_fnv1a (handler, strlen (handler)) ^ outbox_fnv1a (key, strlen (key));
   claim_key_t **b = &c->keys[h % KEY_BUCKETS], *k;

   for (k = *b; k; k = k->next)
      if (!strcmp (k->handler, handler) && !strcmp (k->key, key))
         return k;
   k = bson_malloc0 (sizeof *k);
   k->handler = bson_strdup (handler);
   k->key = bson_strdup (key);
   k->next = *b;
   *b = k;
   return k;
}

static void
claim_free (claim_t *c)
{
   for (int i = 0; i < KEY_BUCKETS; i++) {
      claim_key_t *k = c->keys[i], *next;
      for (; k; k = next) {
         next = k->next;
         bson_free (k->handler);
         bson_free (k->key);
         store_oids_free (&k->blocked);
         bson_free (k);
      }
   }
   for (size_t i = 0; i < c->n_lanes; i++) {
      store_oids_free (&c->lanes[i].inflight);
      store_oids_free (&c->lanes[i].known);
      store_oids_free (&c->lanes[i].gone);
      store_oids_free (&c->lanes[i].picks);
      store_oids_free (&c->lanes[i].blocked);
   }
   for (int i = 0; i < OUTBOX_LANES; i++)
      bson_destroy (c->lane_docs[i]);
   bson_free (c->handler_taken);
   bson_free (c->out_lane);
   mongoc_collection_destroy (c->deliveries);
   mongoc_collection_destroy (c->events);
   mongoc_collection_destroy (c->lanes_coll);
}

void
claim_append_handlers_in (claim_t *c, bson_t *q, bool only_with_room)
{
   bson_t sub, arr;
   char buf[16];
   const char *key;
   uint32_t k = 0;

   BSON_APPEND_DOCUMENT_BEGIN (q, "handler", &sub);
   BSON_APPEND_ARRAY_BEGIN (&sub, "$in", &arr);
   for (size_t i = 0; i < c->o->n_handlers; i++) {
      if (only_with_room && c->handler_taken[i] >= c->o->handlers[i].limit)
         continue;
      bson_uint32_to_string (k++, &key, buf, sizeof buf);
      BSON_APPEND_UTF8 (&arr, key, c->o->handlers[i].handler);
   }
   bson_append_array_end (&sub, &arr);
   bson_append_document_end (q, &sub);
}

bool
claim_handlers_have_room (claim_t *c)
{
   for (size_t i = 0; i < c->o->n_handlers; i++)
      if (c->handler_taken[i] < c->o->handlers[i].limit)
         return true;
   return false;
}

int
claim_handler_index (claim_t *c, const char *name)
{
   for (size_t i = 0; i < c->o->n_handlers; i++)
      if (!strcmp (c->o->handlers[i].handler, name))
         return (int) i;
   return -1;
}

size_t
claim_key_run (const claim_t *c)
{
   size_t run = c->o->key_run < 1 ? 1 : c->o->key_run;

   return run > STORE_KEY_RUN_MAX ? STORE_KEY_RUN_MAX : run;
}

/* ---------------------------------------------------------- the events */

static bool
attach_events (claim_t *c, bson_error_t *error)
{
   bson_t q = BSON_INITIALIZER, sub, arr;
   mongoc_cursor_t *cur;
   const bson_t *doc;
   bool ok = true;

   if (c->out->n == 0)
      return true;
   BSON_APPEND_DOCUMENT_BEGIN (&q, "_id", &sub);
   BSON_APPEND_ARRAY_BEGIN (&sub, "$in", &arr);
   for (size_t i = 0; i < c->out->n; i++) {
      char buf[16];
      const char *key;
      bson_uint32_to_string ((uint32_t) i, &key, buf, sizeof buf);
      BSON_APPEND_UTF8 (&arr, key, c->out->items[i].event_id ? c->out->items[i].event_id : "");
   }
   bson_append_array_end (&sub, &arr);
   bson_append_document_end (&q, &sub);
   cur = mongoc_collection_find_with_opts (c->events, &q, NULL, NULL);
   while (mongoc_cursor_next (cur, &doc)) {
      const char *id = store_iter_utf8 (doc, "_id");
      for (size_t i = 0; id && i < c->out->n; i++)
         if (!c->out->items[i].event && c->out->items[i].event_id && !strcmp (c->out->items[i].event_id, id))
            c->out->items[i].event = bson_copy (doc);
   }
   if (!store_cursor_end (cur, error, "reading events"))
      ok = false;
   bson_destroy (&q);
   return ok;
}

/* --------------------------------------------------------------- record */

static bool
lane_sel (claim_t *c, claim_lane_t *l, bson_t *sel)
{
   bson_init (sel);
   BSON_APPEND_INT32 (sel, "_id", store_lane_doc (c->s, l->lane));
   BSON_APPEND_INT64 (sel, OUTBOX_F_EPOCH, l->epoch);
   BSON_APPEND_UTF8 (sel, "owner", c->s->owner);
   return true;
}

/* One bulkWrite: per lane, inFlight gains the picks (the lease never
 * shrinks), loses the gone ids, or the lane is handed back when it yielded
 * nothing and runs nothing.  Every write is conditional on the epoch. */
static bool
record (claim_t *c, bool *hand_back, bson_error_t *error)
{
   mongoc_bulk_operation_t *bulk = mongoc_collection_create_bulk_operation_with_opts (c->lanes_coll, NULL);
   bson_t reply;
   bson_error_t err;
   int64_t expected = 0;
   bool ok = true;

   for (size_t i = 0; ok && i < c->n_lanes; i++) {
      claim_lane_t *l = &c->lanes[i];
      bson_t sel, upd = BSON_INITIALIZER, sub, each;

      hand_back[i] = false;
      if (l->skip)
         continue;
      lane_sel (c, l, &sel);
      if (l->picks.n > 0) {
         BSON_APPEND_DOCUMENT_BEGIN (&upd, "$addToSet", &sub);
         BSON_APPEND_DOCUMENT_BEGIN (&sub, OUTBOX_F_IN_FLIGHT, &each);
         store_append_oids_array (&each, "$each", l->picks.v, l->picks.n);
         bson_append_document_end (&sub, &each);
         bson_append_document_end (&upd, &sub);
         BSON_APPEND_DOCUMENT_BEGIN (&upd, "$max", &sub);
         BSON_APPEND_DATE_TIME (&sub, OUTBOX_F_LEASE_EXPIRES_AT, c->lease_from + c->o->lease_ms);
         bson_append_document_end (&upd, &sub);
         ok = mongoc_bulk_operation_update_one_with_opts (bulk, &sel, &upd, NULL, &err);
         expected++;
      } else if (l->inflight.n == 0) {
         hand_back[i] = true;
         BSON_APPEND_DOCUMENT_BEGIN (&upd, "$set", &sub);
         BSON_APPEND_NULL (&sub, "owner");
         BSON_APPEND_NULL (&sub, OUTBOX_F_LEASE_EXPIRES_AT);
         store_append_oids_array (&sub, OUTBOX_F_IN_FLIGHT, NULL, 0);
         bson_append_document_end (&upd, &sub);
         ok = mongoc_bulk_operation_update_one_with_opts (bulk, &sel, &upd, NULL, &err);
         expected++;
      }
      if (ok && l->gone.n > 0 && !hand_back[i]) {
         /* An abandoned claim picked again in this claim stays listed. */
         store_oids_t pull_ids = {0};
         for (size_t j = 0; j < l->gone.n; j++)
            if (!store_oids_has (&l->picks, &l->gone.v[j]))
               store_oids_push (&pull_ids, &l->gone.v[j]);
         if (pull_ids.n > 0) {
            bson_t pull = BSON_INITIALIZER;
            BSON_APPEND_DOCUMENT_BEGIN (&pull, "$pullAll", &sub);
            store_append_oids_array (&sub, OUTBOX_F_IN_FLIGHT, pull_ids.v, pull_ids.n);
            bson_append_document_end (&pull, &sub);
            ok = mongoc_bulk_operation_update_one_with_opts (bulk, &sel, &pull, NULL, &err);
            bson_destroy (&pull);
            expected++;
         }
         store_oids_free (&pull_ids);
      }
      bson_destroy (&sel);
      bson_destroy (&upd);
   }
   if (!ok) {
      store_set_error (error, STORE_ERROR_SERVER, "building the claim record: %s", err.message);
      mongoc_bulk_operation_destroy (bulk);
      return false;
   }
   /* At most two writes a lane: its picks or its hand-back, and its pull. */
   RELAYBUS_ASSERT (expected <= 2 * (int64_t) c->n_lanes);
   if (expected == 0) {
      mongoc_bulk_operation_destroy (bulk);
      return true;
   }
   if (!mongoc_bulk_operation_execute (bulk, &reply, &err)) {
      store_set_error (error, STORE_ERROR_SERVER, "recording the claim: %s", err.message);
      ok = false;
   } else if (store_iter_int64 (&reply, "nMatched") != expected) {
      store_set_error (error,
                       STORE_ERROR_LOST,
                       "recording the claim matched %" PRId64 " of %" PRId64 " lanes: a lane changed hands",
                       store_iter_int64 (&reply, "nMatched"),
                       expected);
      ok = false;
   }
   bson_destroy (&reply);
   mongoc_bulk_operation_destroy (bulk);
   return ok;
}

/* Parks the waiting deliveries: keys with STORE_PARK_THRESHOLD or more,
 * every waiting delivery of a lane handed back, and every waiting delivery
 * a scan stopped by SCAN_CAP found.  Best effort. */
static void
park (claim_t *c, const bool *hand_back)
{
   store_oids_t ids = {0};
   bson_t q = BSON_INITIALIZER;
   bson_t *upd;
   bson_error_t err;

   for (int i = 0; i < KEY_BUCKETS; i++)
      for (claim_key_t *k = c->keys[i]; k; k = k->next)
         if (k->blocked.n >= STORE_PARK_THRESHOLD)
            for (size_t j = 0; j < k->blocked.n; j++)
               store_oids_push (&ids, &k->blocked.v[j]);
   for (size_t i = 0; i < c->n_lanes; i++)
      if (hand_back[i] || c->lanes[i].capped)
         for (size_t j = 0; j < c->lanes[i].blocked.n; j++)
            if (!store_oids_has (&ids, &c->lanes[i].blocked.v[j]))
               store_oids_push (&ids, &c->lanes[i].blocked.v[j]);
   if (ids.n == 0) {
      bson_destroy (&q);
      return;
   }
   store_append_oids_op (&q, "_id", "$in", ids.v, ids.n);
   BSON_APPEND_UTF8 (&q, "lane", "ready");
   BSON_APPEND_UTF8 (&q, "status", "pending");
   upd = BCON_NEW ("$set", "{", "lane", BCON_UTF8 ("parked"), "}");
   c->s->unpark_next = 0; /* unparking looks at them from the next claim on */
   if (!mongoc_collection_update_many (c->deliveries, &q, upd, NULL, NULL, &err))
      log_warn ("store: parking %zu waiting deliveries: %s", ids.n, err.message);
   else
      log_debug ("store: parked %zu waiting deliveries", ids.n);
   bson_destroy (upd);
   bson_destroy (&q);
   store_oids_free (&ids);
}

/* A dead letter requeued while this claim ran may now precede a pick of
 * its key: such picks are given back right after recording (a release: no
 * attempt charged), one aggregation for all the keys of the batch. */
static void
give_back_overtaken (claim_t *c)
{
   claim_key_t **ks = bson_malloc0 ((c->out->n + 1) * sizeof *ks);
   size_t n_ks = 0;
   bson_error_t err;

   for (size_t i = 0; i < c->out->n; i++) {
      store_delivery_t *d = &c->out->items[i];
      claim_key_t *k;
      bool listed = false;
      if (!d->key)
         continue;
      k = claim_key_get (c, d->handler, d->key);
      for (size_t j = 0; j < n_ks && !listed; j++)
         listed = ks[j] == k;
      if (listed)
         continue;
      k->min_known = false;
      ks[n_ks++] = k;
   }
   if (n_ks == 0 || !claim_keys_min_seq (c, ks, n_ks, &err)) {
      if (n_ks > 0)
         log_warn ("store: re-checking the order of a claimed batch: %s", err.message);
      bson_free (ks);
      return;
   }
   for (size_t i = 0; i < c->out->n;) {
      store_delivery_t *d = &c->out->items[i];
      claim_key_t *k = d->key ? claim_key_get (c, d->handler, d->key) : NULL;
      store_ref_t r = {d->id, d->lease};
      bool applied = false;
      /* The key's first pick (and with it its run) still comes first. */
      if (!k || !k->min_known || k->min_seq >= k->seq0) {
         i++;
         continue;
      }
      log_info ("store: %s/%s sequence %" PRId64 " is preceded by a requeued delivery; given back",
                d->handler,
                d->key,
                d->sequence);
      if (!store_release (c->s, &r, c->o->now, &applied, &err))
         log_warn ("store: giving back an overtaken pick: %s", err.message);
      delivery_free (d);
      memmove (d, d + 1, (c->out->n - i - 1) * sizeof *d);
      c->out->n--;
   }
   bson_free (ks);
}

/* ---------------------------------------------------------------- claim */

/* A claim's state, with the instance's claim lock taken and a client of
 * the pool popped; claim_end gives both back. */
static claim_t *
claim_begin (store_t *s, const store_claim_opts_t *o, store_batch_t *out)
{
   claim_t *c = bson_malloc0 (sizeof *c);

   c->s = s;
   c->o = o;
   c->out = out;
   c->started_us = bson_get_monotonic_time ();
   c->lease_from = o->now;
   c->handler_taken = bson_malloc0 (o->n_handlers * sizeof *c->handler_taken);
   pthread_mutex_lock (&s->claim_mu);
   c->client = mongoc_client_pool_pop (s->pool);
   c->deliveries = store_coll (s, c->client, OUTBOX_DELIVERIES);
   c->events = store_coll (s, c->client, OUTBOX_EVENTS);
   c->lanes_coll = store_coll (s, c->client, OUTBOX_LANES_COLL);
   /* What a claim hands out, unparks or attaches (deliveries, events) is
    * majority-committed: a client's commit may carry w: 1, and its wake-up
    * comes before a majority has it, so a local read could deliver an event
    * a failover then rolls back (the record's w: majority write is no
    * barrier when it lands on the new primary).  Lane documents stay local:
    * every lane write is majority and conditional on its epoch, and a
    * read-back after a failed take must see that take's own write. */
   store_coll_read_majority (c->deliveries);
   store_coll_read_majority (c->events);
   return c;
}

/* The picks' lease runs from the record, not from the claim's start: a
 * claim that took long on a slow database (most of it before the record)
 * would otherwise hand out deliveries with little of their lease left,
 * which the worker gives back unstarted.  The record is conditional on
 * each lane's epoch, so a lane whose lease lapsed meanwhile and was taken
 * over is not extended.  A claim that took under a tenth of the lease
 * keeps o->now: the lease is exact for the caller's clock, and such a
 * delay leaves the worker enough. */
static void
lease_from_record (claim_t *c)
{
   int64_t took = (bson_get_monotonic_time () - c->started_us) / 1000;

   if (took >= c->o->lease_ms / 10)
      c->lease_from = c->o->now + took;
}

/* What the instance remembers of a recorded claim (callers hold s->mu):
 * the lanes it holds now and until when, and no settled id the record
 * took out of inFlight. */
static void
remember_lanes (claim_t *c, const bool *hand_back)
{
   store_t *s = c->s;

   for (size_t i = 0; i < c->n_lanes; i++) {
      claim_lane_t *l = &c->lanes[i];
      store_lane_state_t *st = &s->lanes[l->lane];
      /* What the record took out of inFlight needs no memory any more. */
      for (size_t j = 0; j < l->gone.n && s->settled.n > 0; j++)
         for (size_t k = 0; k < s->settled.n; k++)
            if (bson_oid_equal (&s->settled.v[k], &l->gone.v[j])) {
               s->settled.v[k] = s->settled.v[--s->settled.n];
               break;
            }
      if (hand_back[i]) {
         /* Only a lane that yielded nothing and runs nothing goes back. */
         RELAYBUS_ASSERT (l->picks.n == 0 && l->inflight.n == 0);
         st->held = false;
         store_issued_remove_lane (s, l->lane);
         continue;
      }
      /* A lane's epoch only grows: what this instance remembers is one it
       * read or took, never later than the one it holds now. */
      RELAYBUS_ASSERT (l->epoch >= st->epoch);
      st->held = true;
      st->epoch = l->epoch;
      if (l->picks.n > 0 && st->expires < c->lease_from + c->o->lease_ms)
         st->expires = c->lease_from + c->o->lease_ms;
   }
}

/* Every pick of the batch, remembered as handed out with its own lease
 * (callers hold s->mu). */
static void
remember_picks (claim_t *c)
{
   for (size_t i = 0; i < c->out->n; i++) {
      const store_delivery_t *d = &c->out->items[i];
      outbox_lease_t lease;
      if (outbox_lease_parse (d->lease, &lease))
         store_issued_add (c->s,
                           &d->id,
                           lease.lane_id,
                           lease.epoch,
                           lease.claims,
                           c->lease_from + c->o->lease_ms,
                           d->handler,
                           d->key);
   }
}

/* Ends a claim: after a failure the batch is emptied and the held lanes
 * reconciled; the client goes back to the pool and the claim lock is
 * released. */
static void
claim_end (claim_t *c, bool ok)
{
   store_t *s = c->s;

   if (!ok) {
      bson_error_t rerr;
      store_batch_clear (c->out);
      if (!store_reconcile (s, c->client, &rerr))
         log_warn ("store: reconciliation after a failed claim: %s", rerr.message);
   }
   mongoc_client_pool_push (s->pool, c->client);
   c->client = NULL;
   claim_free (c);
   bson_free (c);
   pthread_mutex_unlock (&s->claim_mu);
}

bool
store_claim (store_t *s, const store_claim_opts_t *o, store_batch_t *out, bson_error_t *error)
{
   claim_t *c;
   bool hand_back[OUTBOX_LANES];
   bool ok = false;

   if (!s || !o || !out || o->n_handlers == 0 || o->lease_ms <= 0) {
      store_set_error (error, STORE_ERROR_INVALID, "store_claim: handlers and a lease are required");
      return false;
   }
   memset (out, 0, sizeof *out);
   if (o->limit == 0)
      return true;
   c = claim_begin (s, o, out);

   claim_unpark (c);
   /* 1. the lanes this instance holds (checked against the database) */
   if (!claim_read_lanes (c, error) || !claim_load_held (c, error) || !claim_scan (c, 0, error))
      goto done;
   log_debug ("store: claim: %zu from %zu held lane(s)", out->n, c->n_lanes);
   /* 2. free lanes with due work */
   if (!claim_free_lanes (c, error))
      goto done;
   /* A claim never hands out more than its limit. */
   RELAYBUS_ASSERT (out->n <= o->limit);
   /* 3. the events of the batch, read before it is recorded */
   if (!attach_events (c, error))
      goto done;
   /* 4. one bulkWrite, the picks' lease from its time */
   lease_from_record (c);
   if (!record (c, hand_back, error))
      goto done;
   ok = true;

   pthread_mutex_lock (&s->mu);
   remember_lanes (c, hand_back);
   remember_picks (c);
   pthread_mutex_unlock (&s->mu);
   park (c, hand_back);
   give_back_overtaken (c);

done:
   claim_end (c, ok);
   return ok;
}

/* --------------------------------------------------------- reconciliation */

typedef struct {
   store_t *s;
   uint32_t lanes[OUTBOX_LANES];
   int64_t epochs[OUTBOX_LANES];
   size_t n;
   bool drop[OUTBOX_LANES];
   store_oids_t removed;
} reconcile_t;

static bool
reconcile_cb (store_txn_t *txn, void *ctx, bson_error_t *error)
{
   reconcile_t *r = ctx;
   store_t *s = r->s;
   bool ok = true;

   store_oids_free (&r->removed);
   memset (r->drop, 0, sizeof r->drop);
   for (size_t i = 0; ok && i < r->n; i++) {
      bson_t *q = BCON_NEW ("_id", BCON_INT32 (store_lane_doc (s, r->lanes[i])));
      mongoc_cursor_t *cur = mongoc_collection_find_with_opts (txn->coll[OUTBOX_LANES_COLL], q, &txn->opts, NULL);
      const bson_t *doc;
      store_oids_t inflight = {0}, bad = {0};
      bson_error_t err;

      if (!mongoc_cursor_next (cur, &doc)) {
         if (mongoc_cursor_error (cur, &err)) {
            *error = err;
            ok = false;
         }
         r->drop[i] = true;
      } else if (store_iter_int64 (doc, OUTBOX_F_EPOCH) != r->epochs[i] || !store_iter_utf8 (doc, "owner") ||
                 strcmp (store_iter_utf8 (doc, "owner"), s->owner) != 0) {
         r->drop[i] = true; /* taken over meanwhile: its claims are not ours */
      } else {
         store_oids_from_array (&inflight, doc, OUTBOX_F_IN_FLIGHT);
      }
      mongoc_cursor_destroy (cur);
      bson_destroy (q);
      for (size_t j = 0; ok && j < inflight.n; j++) {
         const store_issued_t *is;
         bool keep = false;
         int32_t claims = 0;
         bson_t *dq = BCON_NEW ("_id", BCON_OID (&inflight.v[j]));
         mongoc_cursor_t *dc = mongoc_collection_find_with_opts (txn->coll[OUTBOX_DELIVERIES], dq, &txn->opts, NULL);
         const bson_t *ddoc;
         bool exists = mongoc_cursor_next (dc, &ddoc);
         if (exists)
            claims = (int32_t) store_iter_int64 (ddoc, OUTBOX_F_CLAIMS);
         if (mongoc_cursor_error (dc, &err)) {
            *error = err;
            ok = false;
         }
         mongoc_cursor_destroy (dc);
         pthread_mutex_lock (&s->mu);
         is = store_issued_find (s, &inflight.v[j]);
         keep = exists && is && is->lane == r->lanes[i] && is->epoch == r->epochs[i] && is->claims == claims;
         pthread_mutex_unlock (&s->mu);
         if (ok && !keep) {
            store_oids_push (&bad, &inflight.v[j]);
            if (exists) {
               bson_t *u = BCON_NEW ("$inc", "{", OUTBOX_F_CLAIMS, BCON_INT32 (1), "}");
               if (!mongoc_collection_update_one (txn->coll[OUTBOX_DELIVERIES], dq, u, &txn->opts, NULL, error))
                  ok = false;
               bson_destroy (u);
            }
         }
         bson_destroy (dq);
      }
      if (ok && bad.n > 0) {
         bson_t *lq = BCON_NEW ("_id", BCON_INT32 (store_lane_doc (s, r->lanes[i])), OUTBOX_F_EPOCH, BCON_INT64 (r->epochs[i]));
         bson_t lu = BSON_INITIALIZER, sub;
         BSON_APPEND_DOCUMENT_BEGIN (&lu, "$pullAll", &sub);
         store_append_oids_array (&sub, OUTBOX_F_IN_FLIGHT, bad.v, bad.n);
         bson_append_document_end (&lu, &sub);
         if (!mongoc_collection_update_one (txn->coll[OUTBOX_LANES_COLL], lq, &lu, &txn->opts, NULL, error))
            ok = false;
         bson_destroy (lq);
         bson_destroy (&lu);
         for (size_t j = 0; j < bad.n; j++)
            store_oids_push (&r->removed, &bad.v[j]);
      }
      store_oids_free (&inflight);
      store_oids_free (&bad);
   }
   return ok;
}

static bool
store_reconcile (store_t *s, mongoc_client_t *client, bson_error_t *error)
{
   reconcile_t *r = bson_malloc0 (sizeof *r);
   bool ok;

   r->s = s;
   pthread_mutex_lock (&s->mu);
   for (int i = 0; i < OUTBOX_LANES; i++)
      if (s->lanes[i].held) {
         r->lanes[r->n] = (uint32_t) i;
         r->epochs[r->n++] = s->lanes[i].epoch;
      }
   pthread_mutex_unlock (&s->mu);
   if (r->n == 0) {
      bson_free (r);
      return true;
   }
   ok = store_with_txn (s, client, reconcile_cb, r, error);
   if (ok) {
      pthread_mutex_lock (&s->mu);
      for (size_t i = 0; i < r->n; i++)
         if (r->drop[i] && s->lanes[r->lanes[i]].epoch == r->epochs[i]) {
            s->lanes[r->lanes[i]].held = false;
            store_issued_remove_lane (s, r->lanes[i]);
         }
      for (size_t j = 0; j < r->removed.n; j++)
         store_issued_remove (s, &r->removed.v[j]);
      pthread_mutex_unlock (&s->mu);
   }
   store_oids_free (&r->removed);
   bson_free (r);
   return ok;
}

