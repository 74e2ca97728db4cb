/*
 * store/claim_lanes.c - the free lanes of a claim: lanes nobody holds (no
 * owner, or an expired lease) with due work, found with bounded probes of
 * the claim index (or the last probe's, reused), oldest due work first;
 * taken as many at a time as the batch needs, together with one updateMany
 * when nobody runs anything in them, or one by one with a conditional
 * findOneAndUpdate that moves a previous owner's inFlight to `lost`, whose
 * claims are then charged before the lane is read; then scanned.
 *
 * A lane another claimer took or changed first is skipped, never waited
 * for.  This file does not read deliveries beyond the probe (claim_scan.c
 * does) and records nothing (claim.c).
 */
#include "store/claim_private.h"

#include <stdlib.h>
#include <string.h>

#include "base/assert.h"
#include "base/log.h"

/* Due deliveries one free-lane probe reads (laneId only), and probes per
 * claim at most. */
#define FREE_PROBE 512
#define FREE_PROBES_MAX 3

typedef struct {
   uint32_t lane;
   int64_t epoch;
   bson_t *doc; /* the lane as read: inFlight and lost are compared on take */
   size_t worth; /* what the probe saw it could give: unkeyed deliveries and keys */
} free_lane_t;

/* What the probes of one claim learn: the lane documents of the free
 * lanes that are not the claim's yet (copies, owned), and for each lane
 * with due work found, its oldest due delivery and what it could give. */
typedef struct {
   bson_t *doc[OUTBOX_LANES];
   int64_t oldest[OUTBOX_LANES];
   bool candidate[OUTBOX_LANES];
   size_t worth[OUTBOX_LANES];
} probe_t;

/* The lanes a probe may find: free (no owner, or an expired lease) in the
 * lane documents as read, neither the claim's nor in out[0..n_out). */
static void
probe_lanes (claim_t *c, const free_lane_t *out, size_t n_out, probe_t *p)
{
   for (int lane = 0; lane < OUTBOX_LANES; lane++) {
      const bson_t *ld = c->lane_docs[lane];
      bool mine = false;

      if (!ld)
         continue;
      for (size_t i = 0; i < c->n_lanes && !mine; i++)
         mine = c->lanes[i].lane == (uint32_t) lane;
      for (size_t i = 0; i < n_out && !mine; i++)
         mine = out[i].lane == (uint32_t) lane;
      if (mine)
         continue;
      if (store_iter_utf8 (ld, "owner") && store_iter_date (ld, OUTBOX_F_LEASE_EXPIRES_AT) > c->o->now)
         continue;
      p->doc[lane] = bson_copy (ld);
      p->oldest[lane] = INT64_MAX;
   }
}

/* One probe of the lanes of `want`: their FREE_PROBE oldest due, ready
 * deliveries of the handlers with room (laneId, dueAt and key only); each
 * lane seen becomes a candidate with its oldest due delivery, and is
 * worth its unkeyed deliveries and keys.  *full when the probe came back
 * full. */
static bool
probe_group (claim_t *c, const bool want[OUTBOX_LANES], probe_t *p, bool *full, bson_error_t *error)
{
   bson_t q = BSON_INITIALIZER, sub;
   bson_t *opts;
   mongoc_cursor_t *cur;
   const bson_t *doc;
   int64_t n_read = 0;
   bool ok = true;

   store_append_lanes_in (&q, OUTBOX_F_LANE_ID, want);
   BSON_APPEND_UTF8 (&q, "lane", "ready");
   BSON_APPEND_DOCUMENT_BEGIN (&q, OUTBOX_F_DUE_AT, &sub);
   BSON_APPEND_DATE_TIME (&sub, "$lte", c->o->now);
   bson_append_document_end (&q, &sub);
   claim_append_handlers_in (c, &q, true);
   opts = BCON_NEW ("sort", "{", OUTBOX_F_DUE_AT, BCON_INT32 (1), "_id", BCON_INT32 (1), "}", "limit", BCON_INT64 (FREE_PROBE),
                    "batchSize", BCON_INT32 (FREE_PROBE), "projection", "{", OUTBOX_F_LANE_ID, BCON_INT32 (1), OUTBOX_F_DUE_AT,
                    BCON_INT32 (1), "handler", BCON_INT32 (1), "key", BCON_INT32 (1), "}");
   cur = mongoc_collection_find_with_opts (c->deliveries, &q, opts, NULL);
   while (mongoc_cursor_next (cur, &doc)) {
      int64_t lane = store_iter_int64 (doc, OUTBOX_F_LANE_ID);
      const char *h = store_iter_utf8 (doc, "handler"), *key = store_iter_utf8 (doc, "key");
      n_read++;
      if (lane < 0 || lane >= OUTBOX_LANES || !p->doc[lane])
         continue;
      if (!p->candidate[lane]) {
         p->candidate[lane] = true;
         p->oldest[lane] = store_iter_date (doc, OUTBOX_F_DUE_AT);
      }
      /* A key gives one delivery per claim, however many it has due. */
      if (h && key) {
         claim_key_t *ks = claim_key_get (c, h, key);
         if (ks->probed)
            continue;
         ks->probed = true;
      }
      p->worth[lane]++;
   }
   if (!store_cursor_end (cur, error, "finding lanes with due deliveries"))
      ok = false;
   bson_destroy (opts);
   bson_destroy (&q);
   if (n_read >= FREE_PROBE)
      *full = true;
   return ok;
}

/* The lanes found, oldest due delivery first (ties by lane id), appended
 * to out; their documents move from the probe to out. */
static void
probe_order (probe_t *p, free_lane_t *out, size_t *n_out)
{
   for (;;) {
      int best = -1;
      for (int i = 0; i < OUTBOX_LANES; i++)
         if (p->candidate[i] && (best < 0 || p->oldest[i] < p->oldest[best]))
            best = i;
      if (best < 0)
         break;
      p->candidate[best] = false;
      out[*n_out].lane = (uint32_t) best;
      out[*n_out].epoch = store_iter_int64 (p->doc[best], OUTBOX_F_EPOCH);
      out[*n_out].doc = p->doc[best];
      out[*n_out].worth = p->worth[best];
      p->doc[best] = NULL;
      (*n_out)++;
      /* Each lane at most once: out has room for every lane. */
      RELAYBUS_ASSERT (*n_out <= OUTBOX_LANES);
   }
}

/* Free lanes (no owner, or an expired lease) with due deliveries of the
 * handlers, the lane with the oldest due delivery first, appended to
 * out[*n_out...] (lanes already there are left out).  The lanes are found
 * with bounded probes of the claim index: per group of at most
 * STORE_MAX_LANES_PER_QUERY candidate lanes, the FREE_PROBE oldest due
 * deliveries in (dueAt, _id) order (a merge of one index scan per lane),
 * of which only laneId is read.  The lanes appear in the order of their
 * oldest due delivery, and the cost is the same with a thousand or a
 * million due deliveries.  *more: a probe came back full, so lanes with
 * younger due work may be left (the caller probes again if it needs
 * them). */
static bool
find_free_lanes (claim_t *c, free_lane_t *out, size_t *n_out, bool *more, bson_error_t *error)
{
   probe_t p = {0};
   bool ok = true;
   size_t first = *n_out;
   int next = 0;

   *more = false;
   probe_lanes (c, out, *n_out, &p);
   while (ok && next < OUTBOX_LANES) {
      bool want[OUTBOX_LANES] = {0};
      uint32_t k = 0;

      for (; next < OUTBOX_LANES && k < STORE_MAX_LANES_PER_QUERY; next++)
         if (p.doc[next]) {
            want[next] = true;
            k++;
         }
      if (k == 0)
         break;
      ok = probe_group (c, want, &p, more, error);
   }
   if (ok)
      probe_order (&p, out, n_out);
   if (*n_out == first)
      *more = false;
   for (int i = 0; i < OUTBOX_LANES; i++)
      bson_destroy (p.doc[i]);
   return ok;
}

/* Appends the condition of a lane nobody holds: no owner, or an expired
 * lease: `$or: [{owner: null}, {leaseExpiresAt: {$lte: now}}]`. */
static void
append_lane_free (bson_t *q, int64_t now)
{
   bson_t or_arr, a, b, sub;

   BSON_APPEND_ARRAY_BEGIN (q, "$or", &or_arr);
   BSON_APPEND_DOCUMENT_BEGIN (&or_arr, "0", &a);
   BSON_APPEND_NULL (&a, "owner");
   bson_append_document_end (&or_arr, &a);
   BSON_APPEND_DOCUMENT_BEGIN (&or_arr, "1", &b);
   BSON_APPEND_DOCUMENT_BEGIN (&b, OUTBOX_F_LEASE_EXPIRES_AT, &sub);
   BSON_APPEND_DATE_TIME (&sub, "$lte", now);
   bson_append_document_end (&b, &sub);
   bson_append_document_end (&or_arr, &b);
   bson_append_array_end (q, &or_arr);
}

/* The free lanes of the last probe that are still free in the lane
 * documents as read, appended to out (see store_claim_opts_t). */
static void
free_lanes_cached (claim_t *c, free_lane_t *out, size_t *n_out)
{
   store_t *s = c->s;

   for (size_t i = 0; i < s->n_probe; i++) {
      uint32_t lane = s->probe_lane[i];
      const bson_t *ld = lane < OUTBOX_LANES ? c->lane_docs[lane] : NULL;
      bool mine = false;
      if (!ld || (store_iter_utf8 (ld, "owner") && store_iter_date (ld, OUTBOX_F_LEASE_EXPIRES_AT) > c->o->now))
         continue;
      for (size_t j = 0; j < c->n_lanes && !mine; j++)
         mine = c->lanes[j].lane == lane;
      if (mine)
         continue;
      out[*n_out].lane = lane;
      out[*n_out].epoch = store_iter_int64 (ld, OUTBOX_F_EPOCH);
      out[*n_out].doc = bson_copy (ld);
      out[*n_out].worth = s->probe_worth[i];
      (*n_out)++;
   }
}

/* The update of a take: the epoch moves on, this instance owns the lane
 * for a lease; with `lost` (take_lane), inFlight empties and the lost
 * claims are recorded with their epochs. */
static void
append_take (claim_t *c, bson_t *upd, const claim_lost_t *lost)
{
   bson_t sub;

   BSON_APPEND_DOCUMENT_BEGIN (upd, "$inc", &sub);
   BSON_APPEND_INT64 (&sub, OUTBOX_F_EPOCH, 1);
   bson_append_document_end (upd, &sub);
   BSON_APPEND_DOCUMENT_BEGIN (upd, "$set", &sub);
   BSON_APPEND_UTF8 (&sub, "owner", c->s->owner);
   BSON_APPEND_DATE_TIME (&sub, OUTBOX_F_LEASE_EXPIRES_AT, c->o->now + c->o->lease_ms);
   if (lost) {
      store_append_oids_array (&sub, OUTBOX_F_IN_FLIGHT, NULL, 0);
      claim_lost_append (&sub, lost);
   }
   bson_append_document_end (upd, &sub);
}

/* A lane this claim took under `epoch` (callers hold s->mu): it works
 * with it, and the instance holds it for a lease, with no claim of an
 * earlier epoch remembered. */
static claim_lane_t *
lane_taken (claim_t *c, uint32_t lane, int64_t epoch)
{
   claim_lane_t *l;

   /* A lane this instance held is the claim's already (claim_load_held)
    * or was dropped there: a free lane is never one held here. */
   RELAYBUS_ASSERT (!c->s->lanes[lane].held);
   l = claim_add_lane (c, lane, epoch);
   l->taken_now = true;
   store_issued_remove_lane (c->s, lane);
   c->s->lanes[lane].held = true;
   c->s->lanes[lane].epoch = epoch;
   c->s->lanes[lane].expires = c->o->now + c->o->lease_ms;
   return l;
}

/* After a take of lane f that failed (its reply lost, or a write concern
 * error after the write): *reply is {value: the lane} when the server
 * applied it (this owner, the epoch read plus one), {} when not.  The
 * lane document is the instance's space's, as the take's. */
static bool
take_read_back_one (claim_t *c, const free_lane_t *f, bson_t *reply, bson_error_t *error)
{
   bson_t *q = BCON_NEW ("_id", BCON_INT32 (store_lane_doc (c->s, f->lane)), "owner", BCON_UTF8 (c->s->owner), OUTBOX_F_EPOCH,
                         BCON_INT64 (f->epoch + 1));
   /* By _id: one document at most, no limit needed (the shape of the
    * claim's other reads of lanes, docs/upstream-commands.md). */
   mongoc_cursor_t *cur = mongoc_collection_find_with_opts (c->lanes_coll, q, NULL, NULL);
   const bson_t *doc;
   bool ok;

   bson_init (reply);
   if (mongoc_cursor_next (cur, &doc))
      BSON_APPEND_DOCUMENT (reply, "value", doc);
   ok = store_cursor_end (cur, error, "reading back lane %u", f->lane);
   bson_destroy (q);
   return ok;
}

/* Takes a free lane with one conditional findOneAndUpdate: the epoch moves
 * on and the previous owner's inFlight moves to `lost`.  The condition
 * repeats the lane as read (epoch, inFlight, lost), so a lane another
 * claimer took or changed first is skipped, never waited for.  Then the
 * lost claims are charged before anything is read from the lane. */
static bool
take_lane (claim_t *c, free_lane_t *f, bool *taken, bson_error_t *error)
{
   store_oids_t inflight = {0}, lost = {0};
   claim_lost_t all_lost = {0};
   bson_t q = BSON_INITIALIZER, upd = BSON_INITIALIZER, reply;
   mongoc_find_and_modify_opts_t *fam = mongoc_find_and_modify_opts_new ();
   bson_error_t err;
   bson_iter_t it, val;
   bool ok;

   *taken = false;
   store_oids_from_array (&inflight, f->doc, OUTBOX_F_IN_FLIGHT);
   store_oids_from_array (&lost, f->doc, "lost");
   /* The lost list keeps the epoch of each lost claim: what a previous
    * taker left uncleared keeps its own epoch (it may have been charged
    * already), the previous owner's in-flight claims were made under the
    * lane's current epoch. */
   claim_lost_from_lane (&all_lost, f->doc, f->epoch - 1);
   for (size_t i = 0; i < inflight.n; i++)
      claim_lost_push (&all_lost, &inflight.v[i], f->epoch);

   BSON_APPEND_INT32 (&q, "_id", store_lane_doc (c->s, f->lane));
   BSON_APPEND_INT64 (&q, OUTBOX_F_EPOCH, f->epoch);
   store_append_oids_array (&q, OUTBOX_F_IN_FLIGHT, inflight.v, inflight.n);
   store_append_oids_array (&q, "lost", lost.v, lost.n);
   append_lane_free (&q, c->o->now);

   append_take (c, &upd, &all_lost);

   mongoc_find_and_modify_opts_set_update (fam, &upd);
   mongoc_find_and_modify_opts_set_flags (fam, MONGOC_FIND_AND_MODIFY_RETURN_NEW);
   {
      /* A dead worker's open transaction may hold the lane document: skip
       * the lane rather than wait for that transaction to expire. */
      bson_t *extra = BCON_NEW ("maxTimeMS", BCON_INT32 (STORE_TAKE_MAX_TIME_MS));
      mongoc_find_and_modify_opts_append (fam, extra);
      bson_destroy (extra);
   }
   ok = mongoc_collection_find_and_modify_with_opts (c->lanes_coll, &q, fam, &reply, &err);
   if (!ok) {
      /* The server may have applied the take and lost its reply: read the
       * lane back (as take_lanes does), so that a lane taken is used now,
       * not left idle for a lease; skipped if that fails too. */
      log_warn ("store: taking lane %u: %s; reading it back", f->lane, err.message);
      bson_destroy (&reply);
      if (!take_read_back_one (c, f, &reply, &err))
         log_warn ("store: %s; skipped", err.message);
      ok = true;
   }
   if (bson_iter_init_find (&it, &reply, "value") && BSON_ITER_HOLDS_DOCUMENT (&it) &&
              bson_iter_recurse (&it, &val) && bson_iter_find (&val, OUTBOX_F_EPOCH)) {
      int64_t epoch = bson_iter_as_int64 (&val);
      /* The take matched the epoch as read and moved it on by one. */
      RELAYBUS_ASSERT (epoch == f->epoch + 1);
      claim_lane_t *l;
      pthread_mutex_lock (&c->s->mu);
      l = lane_taken (c, f->lane, epoch);
      pthread_mutex_unlock (&c->s->mu);
      *taken = true;
      if (inflight.n > 0)
         log_info ("store: took lane %u over (epoch %" PRId64 "); the previous owner listed %zu delivery(ies) in flight",
                   f->lane,
                   epoch,
                   inflight.n);
      if (claim_charge_lost (c, f->lane, epoch, &all_lost, &err)) {
         claim_lane_released (c, f->lane);
      } else if (!claim_lane_hold (c, l, &err)) {
         log_warn ("store: %s; the lane waits for a later claim", err.message);
         l->skip = true;
      }
   }
   bson_destroy (&reply);
   mongoc_find_and_modify_opts_destroy (fam);
   bson_destroy (&q);
   bson_destroy (&upd);
   store_oids_free (&inflight);
   store_oids_free (&lost);
   claim_lost_free (&all_lost);
   return ok;
}

/* True when a free lane as read runs nothing: empty inFlight and lost. */
static bool
lane_runs_nothing (const bson_t *doc)
{
   static const char *const lists[] = {OUTBOX_F_IN_FLIGHT, "lost"};
   bson_iter_t it, arr;

   for (size_t j = 0; j < 2; j++)
      if (bson_iter_init_find (&it, doc, lists[j]) && BSON_ITER_HOLDS_ARRAY (&it) && bson_iter_recurse (&it, &arr) &&
          bson_iter_next (&arr))
         return false;
   return true;
}

/* Appends to the $or of a take the condition of one lane that runs
 * nothing: as read (epoch), still free, inFlight still empty. */
static void
append_clean (claim_t *c, bson_t *or_arr, uint32_t *n_clean, const free_lane_t *f)
{
   char buf[16];
   const char *key;
   bson_t one;

   bson_uint32_to_string ((*n_clean)++, &key, buf, sizeof buf);
   BSON_APPEND_DOCUMENT_BEGIN (or_arr, key, &one);
   BSON_APPEND_INT32 (&one, "_id", store_lane_doc (c->s, f->lane));
   BSON_APPEND_INT64 (&one, OUTBOX_F_EPOCH, f->epoch);
   store_append_oids_array (&one, OUTBOX_F_IN_FLIGHT, NULL, 0);
   append_lane_free (&one, c->o->now);
   bson_append_document_end (or_arr, &one);
}

/* After a take that matched fewer lanes than it asked for (some lane
 * changed first): which of the `clean` lanes are ours now, under the
 * epoch read plus one (got[], epoch_of[] moved on). */
static bool
taken_read_back (claim_t *c, const bool *clean, bool *got, int64_t *epoch_of, bson_error_t *error)
{
   bson_t rq = BSON_INITIALIZER;
   bson_t *ropts = BCON_NEW ("batchSize", BCON_INT32 (OUTBOX_LANES + 1));
   mongoc_cursor_t *cur;
   const bson_t *doc;
   bool ok = true;

   store_append_lane_docs_in (c->s, &rq, clean);
   BSON_APPEND_UTF8 (&rq, "owner", c->s->owner);
   cur = mongoc_collection_find_with_opts (c->lanes_coll, &rq, ropts, NULL);
   while (mongoc_cursor_next (cur, &doc)) {
      uint32_t l;
      if (store_lane_of_doc (c->s, doc, &l) && clean[l] && store_iter_int64 (doc, OUTBOX_F_EPOCH) == epoch_of[l] + 1) {
         got[l] = true;
         epoch_of[l]++;
      }
   }
   if (!store_cursor_end (cur, error, "reading back the lanes taken"))
      ok = false;
   bson_destroy (ropts);
   bson_destroy (&rq);
   return ok;
}

/* Takes the free lanes f[0..n) that nobody runs anything in (empty
 * inFlight and lost, as read) with one updateMany: each lane's condition
 * repeats it as read (epoch, owner free or expired, empty lists), so a
 * lane another claimer took or changed first is not matched.  When every
 * lane matched, each has the epoch read plus one; otherwise the lanes are
 * read back to learn which this claim got.  Lanes with a previous owner's
 * claims listed go through take_lane, which charges them. */
static bool
take_lanes (claim_t *c, free_lane_t *f, size_t n, bson_error_t *error)
{
   bson_t q = BSON_INITIALIZER, or_arr, upd = BSON_INITIALIZER, sub;
   bool clean[OUTBOX_LANES] = {0}, got[OUTBOX_LANES] = {0};
   int64_t epoch_of[OUTBOX_LANES] = {0}, n_modified = 0;
   uint32_t n_clean = 0;
   bson_error_t err;
   bool ok = true;

   BSON_APPEND_ARRAY_BEGIN (&q, "$or", &or_arr);
   for (size_t i = 0; i < n; i++) {
      bool taken;
      if (!lane_runs_nothing (f[i].doc)) {
         if (!take_lane (c, &f[i], &taken, error)) {
            ok = false;
            goto done;
         }
         continue;
      }
      append_clean (c, &or_arr, &n_clean, &f[i]);
      clean[f[i].lane] = true;
      epoch_of[f[i].lane] = f[i].epoch;
   }
   bson_append_array_end (&q, &or_arr);
   if (n_clean == 0)
      goto done;
   /* A lane whose lost list is not empty was left out above; one that
    * gained a lost list since is not matched (lost: [] below). */
   BSON_APPEND_ARRAY_BEGIN (&q, "lost", &sub);
   bson_append_array_end (&q, &sub);

   append_take (c, &upd, NULL);
   /* Bounded, as every take: a dead worker's open transaction may hold a
    * lane document.  store_bounded_write builds the command itself, with
    * maxTimeMS at its top level: mongoc_collection_update_many would put it
    * into the update statement, which mongod refuses whole (40415). */
   ok = store_bounded_write (c->s, c->lanes_coll, STORE_WRITE_UPDATE_MANY, &q, &upd, STORE_TAKE_MAX_TIME_MS,
                             &n_modified, &err);
   if (!ok) {
      /* Unknown which lanes were taken: the server may have applied the
       * take and lost its reply (a network error, a write concern error).
       * Read them back, as after a partial take, so that a lane taken is
       * used now and not left idle for a lease; if that fails too, the
       * lanes are skipped (taken over by anyone after their lease). */
      log_warn ("store: taking %u lane(s): %s; reading them back", n_clean, err.message);
      ok = true;
      if (!taken_read_back (c, clean, got, epoch_of, &err)) {
         log_warn ("store: %s; skipped", err.message);
         memset (got, 0, sizeof got);
      }
   } else if (n_modified == n_clean) {
      for (int l = 0; l < OUTBOX_LANES; l++) {
         got[l] = clean[l];
         if (got[l])
            epoch_of[l]++;
      }
   } else {
      ok = taken_read_back (c, clean, got, epoch_of, error);
   }
   pthread_mutex_lock (&c->s->mu);
   for (int l = 0; l < OUTBOX_LANES; l++)
      if (got[l])
         lane_taken (c, (uint32_t) l, epoch_of[l]);
   pthread_mutex_unlock (&c->s->mu);

done:
   bson_destroy (&q);
   bson_destroy (&upd);
   return ok;
}


/* ------------------------------------------------------ the free-lane step */

/* The free lanes a claim found, oldest due work first: v[0..next) taken
 * (or tried), v[next..n) left; `more`: the last probe came back full. */
typedef struct {
   free_lane_t *v;
   size_t n, next;
   bool more;
   int probes;
} free_set_t;

static bool
batch_has_room (claim_t *c)
{
   return c->out->n < c->o->limit && claim_handlers_have_room (c);
}

/* The first free lanes of the claim: the last probe's, when it is recent
 * (also when it found nothing free: probing again finds more only if that
 * probe came back full, or a commit woke us), or a probe's. */
static bool
probe_first (claim_t *c, free_set_t *f, bson_error_t *error)
{
   store_t *s = c->s;
   const store_claim_opts_t *o = c->o;

   if (o->probe_reuse_ms > 0 && o->now >= s->probe_at && o->now - s->probe_at < o->probe_reuse_ms) {
      free_lanes_cached (c, f->v, &f->n);
      f->more = s->probe_more;
      return true;
   }
   f->probes++;
   if (!find_free_lanes (c, f->v, &f->n, &f->more, error))
      return false;
   s->probe_at = o->now;
   return true;
}

/* The lanes found are used up and a probe came back full (or they came
 * from an earlier probe): look again, past the lanes already found. */
static bool
probe_again (claim_t *c, free_set_t *f, bson_error_t *error)
{
   f->probes++;
   if (!find_free_lanes (c, f->v, &f->n, &f->more, error))
      return false;
   c->s->probe_at = c->o->now;
   return true;
}

/* As many of the lanes left, oldest due work first, as the probe says the
 * batch needs, taken together (one updateMany), then read together (one
 * scan). */
static bool
take_and_scan (claim_t *c, free_set_t *f, bson_error_t *error)
{
   size_t first = c->n_lanes, end = f->next, worth = 0, need = c->o->limit - c->out->n;

   while (end < f->n && end - f->next < STORE_MAX_LANES_PER_QUERY && worth < need) {
      worth += f->v[end].worth ? f->v[end].worth : 1;
      end++;
   }
   if (!take_lanes (c, f->v + f->next, end - f->next, error))
      return false;
   f->next = end;
   return claim_scan (c, first, error);
}

/* What this claim did not take, for the next one. */
static void
keep_for_next (claim_t *c, const free_set_t *f)
{
   store_t *s = c->s;

   s->n_probe = 0;
   for (size_t i = f->next; i < f->n; i++) {
      s->probe_lane[s->n_probe] = f->v[i].lane;
      s->probe_worth[s->n_probe++] = f->v[i].worth;
   }
   s->probe_more = f->more;
}

bool
claim_free_lanes (claim_t *c, bson_error_t *error)
{
   free_set_t f = {0};
   bool ok = false;

   if (!batch_has_room (c))
      return true;
   f.v = bson_malloc0 (OUTBOX_LANES * sizeof *f.v);
   if (!probe_first (c, &f, error))
      goto done;
   for (;;) {
      if (f.next == f.n && f.more && f.probes < FREE_PROBES_MAX && batch_has_room (c) && !probe_again (c, &f, error))
         goto done;
      if (!(batch_has_room (c) && f.next < f.n))
         break;
      if (!take_and_scan (c, &f, error))
         goto done;
   }
   /* The lanes found are each a different lane, at most all of them. */
   RELAYBUS_ASSERT (f.next <= f.n && f.n <= OUTBOX_LANES);
   keep_for_next (c, &f);
   ok = true;

done:
   for (size_t i = 0; i < f.n; i++)
      bson_destroy (f.v[i].doc);
   bson_free (f.v);
   return ok;
}
