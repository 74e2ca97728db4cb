/*
 * store/claim_held.c - the start of a claim: the 256 lane documents read
 * once, the lanes this instance holds checked against them (owner and
 * epoch), their lost claims charged, and what their inFlight lists name
 * sorted out: settled here (gone), run here under a live claim (known,
 * not read), or read to learn which still exist, which run and which were
 * abandoned (charged an attempt and made runnable).
 *
 * The charging of lost claims (claim_charge_lost) serves a takeover too
 * (claim_lanes.c).  This file takes no free lane and scans no delivery.
 */
#include "store/claim_private.h"

#include <stdlib.h>
#include <string.h>

#include "base/assert.h"
#include "base/log.h"


void
claim_lost_push (claim_lost_t *l, const bson_oid_t *id, int64_t epoch)
{
   store_oids_push (&l->ids, id);
   if (l->ids.n > l->cap) {
      l->cap = l->ids.cap > l->ids.n ? l->ids.cap : l->ids.n;
      l->epochs = bson_realloc (l->epochs, l->cap * sizeof *l->epochs);
   }
   l->epochs[l->ids.n - 1] = epoch;
}

void
claim_lost_free (claim_lost_t *l)
{
   store_oids_free (&l->ids);
   bson_free (l->epochs);
   memset (l, 0, sizeof *l);
}

/* Reads `lost` and `lostEpochs` of a lane document. */
void
claim_lost_from_lane (claim_lost_t *l, const bson_t *doc, int64_t legacy_epoch)
{
   store_oids_t ids = {0};
   int64_t *epochs = NULL;
   size_t n_epochs = 0;
   bson_iter_t it, child;

   store_oids_from_array (&ids, doc, "lost");
   if (ids.n > 0 && bson_iter_init_find (&it, doc, "lostEpochs") && BSON_ITER_HOLDS_ARRAY (&it) &&
       bson_iter_recurse (&it, &child)) {
      epochs = bson_malloc0 (ids.n * sizeof *epochs);
      while (bson_iter_next (&child) && n_epochs < ids.n)
         if (BSON_ITER_HOLDS_NUMBER (&child))
            epochs[n_epochs++] = bson_iter_as_int64 (&child);
   }
   for (size_t i = 0; i < ids.n; i++)
      claim_lost_push (l, &ids.v[i], n_epochs == ids.n ? epochs[i] : legacy_epoch);
   bson_free (epochs);
   store_oids_free (&ids);
}

/* Appends `lost: [...]` and `lostEpochs: [...]` to doc. */
void
claim_lost_append (bson_t *doc, const claim_lost_t *l)
{
   bson_t arr;
   char buf[16];
   const char *key;

   store_append_oids_array (doc, "lost", l->ids.v, l->ids.n);
   BSON_APPEND_ARRAY_BEGIN (doc, "lostEpochs", &arr);
   for (size_t i = 0; i < l->ids.n; i++) {
      bson_uint32_to_string ((uint32_t) i, &key, buf, sizeof buf);
      BSON_APPEND_INT64 (&arr, key, l->epochs[i]);
   }
   bson_append_array_end (doc, &arr);
}

/* Charges one attempt to every delivery of `lost` for the claim of the
 * epoch recorded with it, moving its claim generation on.  A delivery is
 * charged for epoch E only while its `lostAt` is below E, and `lostAt`
 * becomes E: charging the same list again (the previous taker died before
 * clearing it), or a delayed charge of an older lost claim, charges
 * nothing twice.  The epochs are charged in ascending order, one update
 * each (a list holds one or two).  Then the list is cleared on the lane
 * (still under `epoch`, and only if it is still the list charged). */
bool
claim_charge_lost (claim_t *c, uint32_t lane, int64_t epoch, const claim_lost_t *lost, bson_error_t *error)
{
   bson_t *lq, *lu;
   bson_error_t err;
   int64_t done_upto = INT64_MIN;
   bool ok = true;

   if (lost->ids.n == 0)
      return true;
   for (;;) {
      int64_t e = INT64_MAX;
      bson_t q = BSON_INITIALIZER, reply, *never, *before;
      store_oids_t group = {0};
      bson_t *upd, *opts;

      for (size_t i = 0; i < lost->ids.n; i++)
         if (lost->epochs[i] > done_upto && lost->epochs[i] < e)
            e = lost->epochs[i];
      if (e == INT64_MAX)
         break;
      done_upto = e;
      for (size_t i = 0; i < lost->ids.n; i++)
         if (lost->epochs[i] == e && !store_oids_has (&group, &lost->ids.v[i]))
            store_oids_push (&group, &lost->ids.v[i]);
      store_append_oids_op (&q, "_id", "$in", group.v, group.n);
      BSON_APPEND_UTF8 (&q, "status", "pending");
      never = BCON_NEW ("lostAt", "{", "$exists", BCON_BOOL (false), "}");
      before = BCON_NEW ("lostAt", "{", "$lt", BCON_INT64 (e), "}");
      store_append_or2 (&q, never, before);
      bson_destroy (never);
      bson_destroy (before);
      upd = BCON_NEW ("$inc", "{", "attempts", BCON_INT32 (1), "claims", BCON_INT32 (1), "}", "$set", "{", "lostAt",
                      BCON_INT64 (e), "updatedAt", BCON_DATE_TIME (c->o->now), "}");
      opts = BCON_NEW ("maxTimeMS", BCON_INT32 (STORE_TAKE_MAX_TIME_MS));
      ok = mongoc_collection_update_many (c->deliveries, &q, upd, opts, &reply, &err);
      if (ok && store_iter_int64 (&reply, "modifiedCount") > 0)
         log_info ("store: lane %u: charged %" PRId64 " lost attempt(s) of epoch %" PRId64,
                   lane,
                   store_iter_int64 (&reply, "modifiedCount"),
                   e);
      bson_destroy (&reply);
      bson_destroy (opts);
      bson_destroy (upd);
      bson_destroy (&q);
      store_oids_free (&group);
      if (!ok) {
         store_set_error (error, STORE_ERROR_SERVER, "charging lost claims of lane %u: %s", lane, err.message);
         return false;
      }
   }
   lq = BCON_NEW ("_id", BCON_INT32 ((int32_t) lane), "epoch", BCON_INT64 (epoch));
   store_append_oids_array (lq, "lost", lost->ids.v, lost->ids.n);
   lu = BCON_NEW ("$set", "{", "lost", "[", "]", "lostEpochs", "[", "]", "}");
   ok = mongoc_collection_update_one (c->lanes_coll, lq, lu, NULL, NULL, &err);
   bson_destroy (lq);
   bson_destroy (lu);
   if (!ok)
      store_set_error (error, STORE_ERROR_SERVER, "clearing lost claims of lane %u: %s", lane, err.message);
   return ok;
}

/* --------------------------------------------------------------- lanes */

claim_lane_t *
claim_add_lane (claim_t *c, uint32_t lane, int64_t epoch)
{
   claim_lane_t *l;

   /* A claim works with each of the 256 lanes at most once. */
   RELAYBUS_ASSERT (c->n_lanes < OUTBOX_LANES && lane < OUTBOX_LANES);
   l = &c->lanes[c->n_lanes++];
   *l = (claim_lane_t) {.lane = lane, .epoch = epoch};
   return l;
}

/* Reads the 256 lane documents with one command (one batch). */
bool
claim_read_lanes (claim_t *c, bson_error_t *error)
{
   bson_t *opts = BCON_NEW ("batchSize", BCON_INT32 (OUTBOX_LANES + 1));
   mongoc_cursor_t *cur = mongoc_collection_find_with_opts (c->lanes_coll, &(bson_t) BSON_INITIALIZER, opts, NULL);
   const bson_t *doc;
   bool ok = true;

   while (mongoc_cursor_next (cur, &doc)) {
      int64_t lane = store_iter_int64 (doc, "_id");
      if (lane >= 0 && lane < OUTBOX_LANES && !c->lane_docs[lane])
         c->lane_docs[lane] = bson_copy (doc);
   }
   if (!store_cursor_end (cur, error, "reading lanes"))
      ok = false;
   bson_destroy (opts);
   return ok;
}/* The lanes this instance holds under a live lease: checked against the
 * lane documents as read (owner and epoch), their lost lists charged,
 * their inFlight documents loaded to learn which keys run and which ids
 * are gone. */
bool
claim_load_held (claim_t *c, bson_error_t *error)
{
   store_t *s = c->s;
   mongoc_cursor_t *cur;
   const bson_t *doc;
   bson_error_t err;
   store_lane_state_t held[OUTBOX_LANES];
   store_oids_t all = {0};
   bool ok = true;

   /* Lanes whose lease expired stay ours as long as nobody took them over
    * (the epoch check below): an expired lease nobody took over is still
    * honoured, and re-taking our own lane would charge the attempts we are
    * still running. */
   pthread_mutex_lock (&s->mu);
   memcpy (held, s->lanes, sizeof held);
   pthread_mutex_unlock (&s->mu);

   for (uint32_t lane = 0; lane < OUTBOX_LANES; lane++) {
      const bson_t *ld = c->lane_docs[lane];
      int64_t epoch;
      const char *owner;
      claim_lane_t *l;
      claim_lost_t lost = {0};

      if (!held[lane].held)
         continue;
      if (!ld) {
         pthread_mutex_lock (&s->mu);
         s->lanes[lane].held = false;
         store_issued_remove_lane (s, lane);
         pthread_mutex_unlock (&s->mu);
         continue;
      }
      epoch = store_iter_int64 (ld, "epoch");
      owner = store_iter_utf8 (ld, "owner");
      if (!owner || strcmp (owner, s->owner) != 0 || epoch != held[lane].epoch) {
         pthread_mutex_lock (&s->mu);
         s->lanes[lane].held = false;
         store_issued_remove_lane (s, lane);
         pthread_mutex_unlock (&s->mu);
         log_info ("store: lane %u was taken over (epoch %" PRId64 ")", lane, epoch);
         continue;
      }
      l = claim_add_lane (c, lane, epoch);
      store_oids_from_array (&l->inflight, ld, "inFlight");
      claim_lost_from_lane (&lost, ld, epoch - 1);
      if (lost.ids.n > 0 && !claim_charge_lost (c, lane, epoch, &lost, &err)) {
         /* Typically a dead worker's open transaction still locks one of
          * the deliveries: leave the lane alone until a later claim. */
         log_warn ("store: %s; the lane waits for a later claim", err.message);
         l->skip = true;
      }
      claim_lost_free (&lost);
      /* What this instance knows needs no read: what it completed is
       * gone, what it runs under a live claim of this lane epoch still
       * runs.  The rest (an abandoned or unknown claim) is read below. */
      {
         store_oids_t unknown = {0};
         pthread_mutex_lock (&s->mu);
         for (size_t i = 0; i < l->inflight.n; i++) {
            const bson_oid_t *id = &l->inflight.v[i];
            const store_issued_t *is = store_issued_find (s, id);
            if (store_oids_has (&s->settled, id)) {
               store_oids_push (&l->gone, id);
            } else if (!l->skip && is && is->lane == l->lane && is->epoch == l->epoch && is->expires > c->o->now) {
               store_oids_push (&l->known, id);
               if (is->handler && is->key)
                  claim_key_get (c, is->handler, is->key)->running = true;
            } else {
               store_oids_push (&unknown, id);
               store_oids_push (&all, id);
            }
         }
         pthread_mutex_unlock (&s->mu);
         store_oids_free (&l->inflight);
         l->inflight = unknown;
      }
   }
   if (!ok || all.n == 0)
      goto merge;

   /* Which of the listed deliveries still exist, which of them this
    * instance still runs (it handed out their current claim, and that
    * claim's own lease was handed out or renewed less than a lease ago),
    * and which keys run.  A listed delivery this instance no longer runs
    * (its worker could not settle it and stopped renewing it) is
    * abandoned: its claim generation moves on here, before the lane stops
    * listing it in the record, so the old lease never matches again and
    * the delivery is runnable at once, also with a single proxy.  The
    * abandoned claim was an attempt (its worker was handed the delivery,
    * and may have delivered it), so it is charged as a takeover charges a
    * lost claim: a worker that keeps dying on a delivery brings it to the
    * dead letters here too. */
   {
      bson_t fq = BSON_INITIALIZER;
      bson_t *opts = BCON_NEW ("projection", "{", "handler", BCON_INT32 (1), "key", BCON_INT32 (1), "laneId",
                               BCON_INT32 (1), "claims", BCON_INT32 (1), "}");
      store_oids_t found = {0}, abandoned = {0};
      int32_t *found_claims = NULL;
      char **found_h = NULL, **found_k = NULL;
      size_t cap_found = 0;
      bson_t aq = BSON_INITIALIZER, or_arr;
      uint32_t n_or = 0;

      store_append_oids_op (&fq, "_id", "$in", all.v, all.n);
      cur = mongoc_collection_find_with_opts (c->deliveries, &fq, opts, NULL);
      while (mongoc_cursor_next (cur, &doc)) {
         bson_iter_t it;
         const char *h = store_iter_utf8 (doc, "handler"), *key = store_iter_utf8 (doc, "key");
         if (!bson_iter_init_find (&it, doc, "_id") || !BSON_ITER_HOLDS_OID (&it))
            continue;
         store_oids_push (&found, bson_iter_oid (&it));
         if (found.n > cap_found) {
            cap_found = found.cap;
            found_claims = bson_realloc (found_claims, cap_found * sizeof *found_claims);
            found_h = bson_realloc (found_h, cap_found * sizeof *found_h);
            found_k = bson_realloc (found_k, cap_found * sizeof *found_k);
         }
         found_claims[found.n - 1] = (int32_t) store_iter_int64 (doc, "claims");
         found_h[found.n - 1] = h && key ? bson_strdup (h) : NULL;
         found_k[found.n - 1] = h && key ? bson_strdup (key) : NULL;
      }
      if (!store_cursor_end (cur, error, "reading in-flight deliveries"))
         ok = false;
      bson_destroy (&fq);
      bson_destroy (opts);
      BSON_APPEND_ARRAY_BEGIN (&aq, "$or", &or_arr);
      pthread_mutex_lock (&s->mu);
      for (size_t i = 0; ok && i < c->n_lanes; i++) {
         claim_lane_t *l = &c->lanes[i];
         store_oids_t still = {0};
         for (size_t j = 0; j < l->inflight.n; j++) {
            size_t f;
            const store_issued_t *is;
            for (f = 0; f < found.n; f++)
               if (bson_oid_equal (&found.v[f], &l->inflight.v[j]))
                  break;
            if (f == found.n) {
               store_oids_push (&l->gone, &l->inflight.v[j]);
               continue;
            }
            is = store_issued_find (s, &l->inflight.v[j]);
            /* A lane left alone this claim (its lost claims could not be
             * charged) is not written: what it lists waits too. */
            if (l->skip || (is && is->lane == l->lane && is->epoch == l->epoch && is->claims == found_claims[f] &&
                            is->expires > c->o->now)) {
               store_oids_push (&still, &l->inflight.v[j]);
               if (found_h[f])
                  claim_key_get (c, found_h[f], found_k[f])->running = true;
            } else {
               char buf[16];
               const char *ok_key;
               bson_t one;
               bson_uint32_to_string (n_or++, &ok_key, buf, sizeof buf);
               BSON_APPEND_DOCUMENT_BEGIN (&or_arr, ok_key, &one);
               BSON_APPEND_OID (&one, "_id", &l->inflight.v[j]);
               store_append_claims_match (&one, found_claims[f]);
               bson_append_document_end (&or_arr, &one);
               store_oids_push (&abandoned, &l->inflight.v[j]);
               store_oids_push (&l->gone, &l->inflight.v[j]);
            }
         }
         store_oids_free (&l->inflight);
         l->inflight = still;
      }
      pthread_mutex_unlock (&s->mu);
      bson_append_array_end (&aq, &or_arr);
      if (ok && abandoned.n > 0) {
         bson_t *au = BCON_NEW ("$inc", "{", "attempts", BCON_INT32 (1), "claims", BCON_INT32 (1), "}", "$set", "{",
                                "updatedAt", BCON_DATE_TIME (c->o->now), "}");
         if (!mongoc_collection_update_many (c->deliveries, &aq, au, NULL, NULL, &err)) {
            store_set_error (error, STORE_ERROR_SERVER, "reconciling abandoned claims: %s", err.message);
            ok = false;
         } else {
            log_warn ("store: %zu listed delivery(ies) no longer run here (not settled, not renewed for a lease): "
                      "charged an attempt each and made runnable again",
                      abandoned.n);
            pthread_mutex_lock (&s->mu);
            for (size_t j = 0; j < abandoned.n; j++)
               store_issued_remove (s, &abandoned.v[j]);
            pthread_mutex_unlock (&s->mu);
         }
         bson_destroy (au);
      }
      for (size_t f = 0; f < found.n; f++) {
         bson_free (found_h[f]);
         bson_free (found_k[f]);
      }
      bson_free (found_h);
      bson_free (found_k);
      bson_free (found_claims);
      bson_destroy (&aq);
      store_oids_free (&found);
      store_oids_free (&abandoned);
   }
merge:
   for (size_t i = 0; i < c->n_lanes; i++) {
      claim_lane_t *l = &c->lanes[i];
      for (size_t j = 0; j < l->known.n; j++)
         store_oids_push (&l->inflight, &l->known.v[j]);
   }
   store_oids_free (&all);
   return ok;
}
