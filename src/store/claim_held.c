/*
 * store/claim_held.c - the start of a claim: the 256 lane documents of the
 * instance's lane space read once, the lanes this instance holds checked
 * against them (owner and epoch), their lost claims charged, and what
 * their inFlight lists name sorted out: settled here (gone), run here
 * under a live claim (known, not read), or read to learn which still
 * exist, which run and which were abandoned (charged an attempt and made
 * runnable).
 *
 * The charging of lost claims (claim_charge_lost) serves a takeover too
 * (claim_lanes.c), and so does the rule for a charge another client's
 * open transaction holds up: the lane waits (claim_lane_hold), the claim
 * goes on.  This file takes no free lane and scans no delivery.
 */
#include "store/claim_private.h"

#include <stdlib.h>
#include <string.h>

#include "base/assert.h"
#include "base/log.h"
#include "base/servercodes.h"


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
   if (ids.n > 0 && bson_iter_init_find (&it, doc, OUTBOX_F_LOST_EPOCHS) && BSON_ITER_HOLDS_ARRAY (&it) &&
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
   BSON_APPEND_ARRAY_BEGIN (doc, OUTBOX_F_LOST_EPOCHS, &arr);
   for (size_t i = 0; i < l->ids.n; i++) {
      bson_uint32_to_string ((uint32_t) i, &key, buf, sizeof buf);
      BSON_APPEND_INT64 (&arr, key, l->epochs[i]);
   }
   bson_append_array_end (doc, &arr);
}

/* The one rule for charging a lost claim, whoever finds it lost (a
 * takeover's `lost` list, or this instance's own abandoned claim): each
 * pending delivery `q` selects whose claim was made under lane epoch
 * `epoch` is charged one attempt, its claim generation moves on, and its
 * `lostAt` (the epoch of the last lost claim charged) rises to `epoch`.
 * A `lost` list knows a claim only by its epoch: its charge also needs
 * `lostAt` below `epoch`, so charging a list again (its taker died before
 * clearing it), a delayed charge of an older claim, or the charge of a
 * claim this instance charged as abandoned before the takeover moved it
 * to `lost` (from a lane read before that charge) charges nothing twice.
 * An abandoned claim is known by its generation (`q` matches the claims
 * of each, with `by_generation`): that alone fences it, so two claims of
 * one epoch abandoned one after the other are charged once each.  Bounded
 * by STORE_TAKE_MAX_TIME_MS (or the instance's shorter bound): a delivery
 * a dead worker's open transaction holds fails the charge, which a later
 * claim makes again.  *charged (may be NULL) gets how many were. */
/* With attempt history: the deliveries a charge's filter `q` selects,
 * read before the charge (it reads nothing itself), as the records of
 * their lost attempts (their handler, event and attempt number). */
static bool
charge_read (claim_t *c, const bson_t *q, store_attempt_docs_t *recs, bson_error_t *error)
{
   bson_t *opts = BCON_NEW ("projection", "{", OUTBOX_F_EVENT_ID, BCON_INT32 (1), "handler", BCON_INT32 (1), OUTBOX_F_ATTEMPTS,
                            BCON_INT32 (1), "}");
   mongoc_cursor_t *cur;
   const bson_t *doc;

   store_append_max_time (c->s, opts, STORE_TAKE_MAX_TIME_MS);
   cur = mongoc_collection_find_with_opts (c->deliveries, q, opts, NULL);
   while (mongoc_cursor_next (cur, &doc)) {
      bson_iter_t it;
      store_attempt_t a = {.handler = store_iter_utf8 (doc, "handler"),
                           .outcome = OUTBOX_ATTEMPT_LEASE_LOST,
                           .attempt = (int32_t) store_iter_int64 (doc, OUTBOX_F_ATTEMPTS) + 1,
                           .duration_ms = -1,
                           .error = "the claim was lost: its worker stopped renewing its lease"};
      if (!bson_iter_init_find (&it, doc, "_id") || !BSON_ITER_HOLDS_OID (&it))
         continue;
      bson_oid_init (&a.id, NULL);
      store_attempt_docs_add (c->s, recs, bson_iter_oid (&it), store_iter_utf8 (doc, OUTBOX_F_EVENT_ID), &a, c->o->now);
   }
   bson_destroy (opts);
   return store_cursor_end (cur, error, "reading lost claims");
}

/* The records of a charge's lost attempts, when it charged exactly the
 * deliveries read before it (`n`); otherwise one of them changed in
 * between (completed, charged by another), and no record is written
 * rather than a wrong one.  A record that cannot be written is logged:
 * the charge stands. */
static void
charge_record (claim_t *c, uint32_t lane, const store_attempt_docs_t *recs, int64_t n)
{
   mongoc_collection_t *coll;
   bson_error_t err;

   if (recs->n == 0)
      return;
   if ((int64_t) recs->n != n) {
      log_info ("store: lane %u: %" PRId64 " of %zu lost claims read were charged: their attempts are not recorded", lane, n,
                recs->n);
      return;
   }
   coll = store_coll (c->s, c->client, OUTBOX_ATTEMPTS);
   if (!store_attempt_docs_insert (c->s, coll, recs, NULL, &err))
      log_warn ("store: lane %u: %s", lane, err.message);
   mongoc_collection_destroy (coll);
}

/* Sets *error to "<what> of lane <lane>: <server_err's message>", a
 * STORE_ERROR_HELD when the server's code says another client's open
 * transaction held the write up (server_code_is_held), a
 * STORE_ERROR_SERVER otherwise. */
static void
claim_charge_error (bson_error_t *error, uint32_t lane, const char *what, const bson_error_t *server_err)
{
   bool held = (server_err->domain == MONGOC_ERROR_SERVER || server_err->domain == MONGOC_ERROR_QUERY) &&
               server_code_is_held ((int32_t) server_err->code);

   store_set_error (error, held ? STORE_ERROR_HELD : STORE_ERROR_SERVER, "%s of lane %u: %s", what, lane,
                    server_err->message);
}

/* ------------------------------------------------------ lanes held up */

/* Whether lane `lane` waits out its backoff after its charge was held up
 * (store_lane_held_t): the claim leaves it alone without trying. */
static bool
claim_lane_held_up (claim_t *c, uint32_t lane)
{
   const store_lane_held_t *h = &c->s->held_up[lane];

   /* A clock set back by more than a backoff does not keep the lane. */
   return h->until > c->o->now && h->until - c->o->now <= h->backoff_ms;
}

bool
claim_lane_hold (claim_t *c, claim_lane_t *l, const bson_error_t *error)
{
   store_lane_held_t *h = &c->s->held_up[l->lane];
   const char *handler = store_space_handler (c->s);

   if (error->domain != STORE_ERROR_DOMAIN || error->code != STORE_ERROR_HELD)
      return false;
   l->skip = true;
   h->backoff_ms = h->backoff_ms == 0 ? STORE_HELD_BACKOFF_MS : h->backoff_ms * 2;
   if (h->backoff_ms > STORE_HELD_BACKOFF_MAX_MS)
      h->backoff_ms = STORE_HELD_BACKOFF_MAX_MS;
   h->until = c->o->now + h->backoff_ms;
   if (h->logged == 0 || c->o->now - h->logged >= STORE_HELD_LOG_MS || c->o->now < h->logged) {
      h->logged = c->o->now;
      log_warn ("store: %s; another client's open transaction holds a delivery of the lane%s%s: claims leave the "
                "lane alone and try it again (every %d s at most) until that transaction ends (logged once a minute)",
                error->message, *handler ? ", handler " : "", handler, STORE_HELD_BACKOFF_MAX_MS / 1000);
   } else {
      log_debug ("store: %s; the lane waits %" PRId64 " ms", error->message, h->backoff_ms);
   }
   return true;
}

/* The lane's charges landed: it waits no more. */
void
claim_lane_released (claim_t *c, uint32_t lane)
{
   store_lane_held_t *h = &c->s->held_up[lane];

   if (h->backoff_ms > 0)
      log_info ("store: lane %u: its charges landed; claims take from it again", lane);
   memset (h, 0, sizeof *h);
}

/* The deliveries of a `lost` list (`q`, with status pending) whose lost
 * attempt of `epoch` was charged already (lostAt at or above it: this
 * instance charged an abandoned claim of that epoch, or an earlier taker
 * charged the list) are charged nothing again, but their claim generation
 * moves on all the same: the lost claim may be a later one of the same
 * epoch (an abandoned claim charged, then claimed again before the
 * takeover), and its lease must not match the claim the new owner makes
 * (a stale completion would delete the delivery it runs).  Before the
 * charge, so that the two never write the same delivery. */
static bool
claim_fence_charged (claim_t *c, uint32_t lane, int64_t epoch, const bson_t *q, bson_error_t *error)
{
   bson_t fq, sub;
   bson_t *upd = BCON_NEW ("$inc", "{", OUTBOX_F_CLAIMS, BCON_INT32 (1), "}", "$set", "{", OUTBOX_F_UPDATED_AT,
                           BCON_DATE_TIME (c->o->now), "}");
   bson_error_t err;
   bool ok;

   bson_copy_to (q, &fq);
   BSON_APPEND_DOCUMENT_BEGIN (&fq, OUTBOX_F_LOST_AT, &sub);
   BSON_APPEND_INT64 (&sub, "$gte", epoch);
   bson_append_document_end (&fq, &sub);
   ok = store_bounded_write (c->s, c->deliveries, STORE_WRITE_UPDATE_MANY, &fq, upd, STORE_TAKE_MAX_TIME_MS, NULL, &err);
   if (!ok)
      claim_charge_error (error, lane, "fencing lost claims", &err);
   bson_destroy (&fq);
   bson_destroy (upd);
   return ok;
}

static bool
claim_charge_at (claim_t *c, uint32_t lane, int64_t epoch, bson_t *q, bool by_generation, int64_t *charged,
                 bson_error_t *error)
{
   bson_t lost_at, not;
   bson_t *upd;
   bson_error_t err;
   store_attempt_docs_t recs = {0};
   int64_t n = 0;
   bool ok;

   BSON_APPEND_UTF8 (q, "status", "pending");
   if (!by_generation && !claim_fence_charged (c, lane, epoch, q, error))
      return false;
   if (!by_generation) {
      /* lostAt missing or below epoch, as one condition ({$not: {$gte}}
       * matches a missing field). */
      BSON_APPEND_DOCUMENT_BEGIN (q, OUTBOX_F_LOST_AT, &lost_at);
      BSON_APPEND_DOCUMENT_BEGIN (&lost_at, "$not", &not);
      BSON_APPEND_INT64 (&not, "$gte", epoch);
      bson_append_document_end (&lost_at, &not);
      bson_append_document_end (q, &lost_at);
   }
   upd = BCON_NEW ("$inc", "{", OUTBOX_F_ATTEMPTS, BCON_INT32 (1), OUTBOX_F_CLAIMS, BCON_INT32 (1), "}", "$max", "{", OUTBOX_F_LOST_AT,
                   BCON_INT64 (epoch), "}", "$set", "{", OUTBOX_F_UPDATED_AT, BCON_DATE_TIME (c->o->now), "}");
   if (store_attempts_on (c->s) && !charge_read (c, q, &recs, &err)) {
      claim_charge_error (error, lane, "charging lost claims", &err);
      bson_destroy (upd);
      return false;
   }
   ok = store_bounded_write (c->s, c->deliveries, STORE_WRITE_UPDATE_MANY, q, upd, STORE_TAKE_MAX_TIME_MS, &n, &err);
   if (ok) {
      if (n > 0)
         log_info ("store: lane %u: charged %" PRId64 " lost attempt(s) of epoch %" PRId64, lane, n, epoch);
      if (charged)
         *charged = n;
      charge_record (c, lane, &recs, n);
   } else {
      claim_charge_error (error, lane, "charging lost claims", &err);
   }
   store_attempt_docs_free (&recs);
   bson_destroy (upd);
   return ok;
}

/* Charges the claims of `lost` (claim_charge_at), each for the epoch
 * recorded with it, the epochs in ascending order, one update each (a
 * list holds one or two).  Then the list is cleared on the lane (still
 * under `epoch`, and only if it is still the list charged). */
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
      bson_t q = BSON_INITIALIZER;
      store_oids_t group = {0};

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
      ok = claim_charge_at (c, lane, e, &q, false, NULL, error);
      bson_destroy (&q);
      store_oids_free (&group);
      if (!ok)
         return false;
   }
   lq = BCON_NEW ("_id", BCON_INT32 (store_lane_doc (c->s, lane)), OUTBOX_F_EPOCH, BCON_INT64 (epoch));
   store_append_oids_array (lq, "lost", lost->ids.v, lost->ids.n);
   lu = BCON_NEW ("$set", "{", "lost", "[", "]", OUTBOX_F_LOST_EPOCHS, "[", "]", "}");
   ok = store_bounded_write (c->s, c->lanes_coll, STORE_WRITE_UPDATE_ONE, lq, lu, STORE_TAKE_MAX_TIME_MS, NULL, &err);
   bson_destroy (lq);
   bson_destroy (lu);
   if (!ok)
      claim_charge_error (error, lane, "clearing lost claims", &err);
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

/* Reads the 256 lane documents of the instance's space with one command
 * (one batch, a range of _id): the other space's lanes are not this
 * instance's to take or to wait for. */
bool
claim_read_lanes (claim_t *c, bson_error_t *error)
{
   bson_t *opts = BCON_NEW ("batchSize", BCON_INT32 (OUTBOX_LANES + 1));
   bson_t *q = BCON_NEW ("_id", "{", "$gte", BCON_INT32 (store_lane_doc (c->s, 0)), "$lte",
                         BCON_INT32 (store_lane_doc (c->s, OUTBOX_LANES - 1)), "}");
   mongoc_cursor_t *cur = mongoc_collection_find_with_opts (c->lanes_coll, q, opts, NULL);
   const bson_t *doc;
   bool ok = true;

   while (mongoc_cursor_next (cur, &doc)) {
      uint32_t lane;
      if (store_lane_of_doc (c->s, doc, &lane) && !c->lane_docs[lane])
         c->lane_docs[lane] = bson_copy (doc);
   }
   if (!store_cursor_end (cur, error, "reading lanes"))
      ok = false;
   bson_destroy (q);
   bson_destroy (opts);
   return ok;
}
/* ------------------------------------------------------------ held lanes */

/* Forgets a lane this instance held: its document is gone, or somebody
 * took it over. */
static void
held_drop (store_t *s, uint32_t lane)
{
   memset (&s->held_up[lane], 0, sizeof s->held_up[lane]); /* a hold was this instance's (claim_mu) */
   pthread_mutex_lock (&s->mu);
   s->lanes[lane].held = false;
   store_issued_remove_lane (s, lane);
   pthread_mutex_unlock (&s->mu);
}

/* A lane this instance held under `held_epoch`, checked against its
 * document as read: still ours (owner and epoch), a lane of the claim
 * with its inFlight as read and its lost claims charged; or dropped
 * (NULL).  A lane whose lost claims could not be charged is `skip`. */
static claim_lane_t *
held_check (claim_t *c, uint32_t lane, int64_t held_epoch)
{
   store_t *s = c->s;
   const bson_t *ld = c->lane_docs[lane];
   claim_lost_t lost = {0};
   bson_error_t err;
   claim_lane_t *l;
   int64_t epoch;
   const char *owner;

   if (!ld) {
      held_drop (s, lane);
      return NULL;
   }
   epoch = store_iter_int64 (ld, OUTBOX_F_EPOCH);
   owner = store_iter_utf8 (ld, "owner");
   if (!owner || strcmp (owner, s->owner) != 0 || epoch != held_epoch) {
      held_drop (s, lane);
      log_info ("store: lane %u was taken over (epoch %" PRId64 ")", lane, epoch);
      return NULL;
   }
   l = claim_add_lane (c, lane, epoch);
   store_oids_from_array (&l->inflight, ld, OUTBOX_F_IN_FLIGHT);
   if (claim_lane_held_up (c, lane)) {
      /* Its charge was held up a moment ago: not tried again yet. */
      l->skip = true;
      return l;
   }
   claim_lost_from_lane (&lost, ld, epoch - 1);
   if (lost.ids.n > 0 && !claim_charge_lost (c, lane, epoch, &lost, &err) && !claim_lane_hold (c, l, &err)) {
      /* Leave the lane alone until a later claim. */
      log_warn ("store: %s; the lane waits for a later claim", err.message);
      l->skip = true;
   }
   claim_lost_free (&lost);
   return l;
}

/* What this instance knows needs no read: what it completed is gone,
 * what it runs under a live claim of this lane epoch still runs (known).
 * The rest (an abandoned or unknown claim) stays in l->inflight and is
 * added to `all`, to be read. */
static void
held_sort_listed (claim_t *c, claim_lane_t *l, store_oids_t *all)
{
   store_t *s = c->s;
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
         store_oids_push (all, id);
      }
   }
   pthread_mutex_unlock (&s->mu);
   /* Every listed id is sorted into exactly one of the three (the lane
    * is new to this claim: known and gone were empty). */
   RELAYBUS_ASSERT (unknown.n + l->known.n + l->gone.n == l->inflight.n);
   store_oids_free (&l->inflight);
   l->inflight = unknown;
}

/* Phase 1: the lanes this instance holds, checked and charged, their
 * listed ids sorted; `all` gets the ids to read.  Lanes whose lease
 * expired stay ours as long as nobody took them over (the epoch check):
 * an expired lease nobody took over is still honoured, and re-taking our
 * own lane would charge the attempts we are still running. */
static void
held_check_all (claim_t *c, store_oids_t *all)
{
   store_t *s = c->s;
   store_lane_state_t held[OUTBOX_LANES];

   pthread_mutex_lock (&s->mu);
   memcpy (held, s->lanes, sizeof held);
   pthread_mutex_unlock (&s->mu);
   for (uint32_t lane = 0; lane < OUTBOX_LANES; lane++) {
      claim_lane_t *l;
      if (!held[lane].held)
         continue;
      if ((l = held_check (c, lane, held[lane].epoch)) != NULL)
         held_sort_listed (c, l, all);
   }
}

/* A listed delivery as read: its claim generation and its key (handler
 * and key NULL when it has none). */
typedef struct {
   bson_oid_t id;
   int32_t claims;
   char *handler, *key; /* owned */
} listed_t;

/* The listed deliveries that exist, sorted by _id for listed_find. */
typedef struct {
   listed_t *v;
   size_t n, cap;
} listed_set_t;

static void
listed_free (listed_set_t *set)
{
   for (size_t i = 0; i < set->n; i++) {
      bson_free (set->v[i].handler);
      bson_free (set->v[i].key);
   }
   bson_free (set->v);
   memset (set, 0, sizeof *set);
}

static int
listed_cmp (const void *a, const void *b)
{
   return bson_oid_compare (&((const listed_t *) a)->id, &((const listed_t *) b)->id);
}

/* The listed delivery `id` as read, or NULL when it is gone (the ids are
 * _ids of one collection: no two are equal). */
static const listed_t *
listed_find (const listed_set_t *set, const bson_oid_t *id)
{
   listed_t probe;

   if (set->n == 0)
      return NULL;
   bson_oid_copy (id, &probe.id);
   return bsearch (&probe, set->v, set->n, sizeof *set->v, listed_cmp);
}

/* Phase 2: which of the ids of `all` still exist, with their claim
 * generation and key (one find). */
static bool
listed_read (claim_t *c, const store_oids_t *all, listed_set_t *set, bson_error_t *error)
{
   bson_t fq = BSON_INITIALIZER;
   bson_t *opts = BCON_NEW ("projection", "{", "handler", BCON_INT32 (1), "key", BCON_INT32 (1), OUTBOX_F_LANE_ID,
                            BCON_INT32 (1), OUTBOX_F_CLAIMS, BCON_INT32 (1), "}");
   mongoc_cursor_t *cur;
   const bson_t *doc;
   bool ok = true;

   store_append_oids_op (&fq, "_id", "$in", all->v, all->n);
   cur = mongoc_collection_find_with_opts (c->deliveries, &fq, opts, NULL);
   while (mongoc_cursor_next (cur, &doc)) {
      bson_iter_t it;
      const char *h = store_iter_utf8 (doc, "handler"), *key = store_iter_utf8 (doc, "key");
      listed_t *x;
      if (!bson_iter_init_find (&it, doc, "_id") || !BSON_ITER_HOLDS_OID (&it))
         continue;
      if (set->n == set->cap) {
         set->cap = set->cap ? set->cap * 2 : 16;
         set->v = bson_realloc (set->v, set->cap * sizeof *set->v);
      }
      x = &set->v[set->n++];
      bson_oid_copy (bson_iter_oid (&it), &x->id);
      x->claims = (int32_t) store_iter_int64 (doc, OUTBOX_F_CLAIMS);
      x->handler = h && key ? bson_strdup (h) : NULL;
      x->key = h && key ? bson_strdup (key) : NULL;
   }
   if (!store_cursor_end (cur, error, "reading in-flight deliveries"))
      ok = false;
   bson_destroy (&fq);
   bson_destroy (opts);
   if (set->n > 1)
      qsort (set->v, set->n, sizeof *set->v, listed_cmp);
   return ok;
}

/* Appends {_id, claims} to the $or array `arr` (its n-th entry). */
static void
or_append_claim (bson_t *arr, uint32_t *n, const bson_oid_t *id, int32_t claims)
{
   char buf[16];
   const char *key;
   bson_t one;

   bson_uint32_to_string ((*n)++, &key, buf, sizeof buf);
   BSON_APPEND_DOCUMENT_BEGIN (arr, key, &one);
   BSON_APPEND_OID (&one, "_id", id);
   store_append_claims_match (&one, claims);
   bson_append_document_end (arr, &one);
}

/* What one lane lists that this instance no longer runs: the claims it
 * handed out and stopped renewing (`lost`: charged), and the ones it
 * never handed out (`unknown`: taken back without a charge), each an $or
 * of {_id, claims}. */
typedef struct {
   bson_t lost, unknown;
   bson_t lost_arr, unknown_arr;
   uint32_t n_lost, n_unknown;
   store_oids_t ids; /* both, for the instance to forget */
} abandoned_t;

/* The ids one lane lists that were read: gone (not found), still running
 * here (this instance handed out their current claim, and that claim's
 * own lease was handed out or renewed less than a lease ago), or
 * abandoned: sorted into `a` (with their claim generation).  Callers hold
 * s->mu. */
static void
held_settle_lane (claim_t *c, claim_lane_t *l, const listed_set_t *set, abandoned_t *a)
{
   store_oids_t still = {0};

   for (size_t j = 0; j < l->inflight.n; j++) {
      const bson_oid_t *id = &l->inflight.v[j];
      const listed_t *f = listed_find (set, id);
      const store_issued_t *is;
      bool ours;
      if (!f) {
         store_oids_push (&l->gone, id);
         continue;
      }
      is = store_issued_find (c->s, id);
      ours = is && is->lane == l->lane && is->epoch == l->epoch && is->claims == f->claims;
      /* A lane left alone this claim (its lost claims could not be
       * charged) is not written: what it lists waits too. */
      if (l->skip || (ours && is->expires > c->o->now)) {
         store_oids_push (&still, id);
         if (f->handler)
            claim_key_get (c, f->handler, f->key)->running = true;
         continue;
      }
      if (ours)
         or_append_claim (&a->lost_arr, &a->n_lost, id, f->claims);
      else
         or_append_claim (&a->unknown_arr, &a->n_unknown, id, f->claims);
      store_oids_push (&a->ids, id);
      store_oids_push (&l->gone, id);
   }
   store_oids_free (&l->inflight);
   l->inflight = still;
}

/* Takes back what one lane lists and this instance no longer runs.  A
 * claim it handed out under this lane epoch and stopped renewing was an
 * attempt (its worker was handed the delivery, and may have delivered
 * it): charged as a lost claim of that epoch (claim_charge_at, the rule a
 * takeover's charge follows, so the two never charge it twice), and a
 * worker that keeps dying on a delivery brings it to the dead letters
 * with a single proxy too.  A claim it never handed out (a record that
 * reached the lane without its reply reaching this instance) is not
 * charged: its claim generation moves on, as the reference's
 * reconciliation does.  Both bounded (a delivery an open transaction
 * holds fails the write: the next claim tries again). */
static bool
take_back (claim_t *c, const claim_lane_t *l, abandoned_t *a, bson_error_t *error)
{
   store_t *s = c->s;
   int64_t charged = 0;
   bool ok = true;

   bson_append_array_end (&a->lost, &a->lost_arr);
   bson_append_array_end (&a->unknown, &a->unknown_arr);
   if (a->n_lost > 0)
      ok = claim_charge_at (c, l->lane, l->epoch, &a->lost, true, &charged, error);
   if (ok && a->n_unknown > 0) {
      bson_t *u = BCON_NEW ("$inc", "{", OUTBOX_F_CLAIMS, BCON_INT32 (1), "}", "$set", "{", OUTBOX_F_UPDATED_AT,
                            BCON_DATE_TIME (c->o->now), "}");
      bson_error_t err;
      BSON_APPEND_UTF8 (&a->unknown, "status", "pending");
      if (!store_bounded_write (s, c->deliveries, STORE_WRITE_UPDATE_MANY, &a->unknown, u, STORE_TAKE_MAX_TIME_MS,
                                NULL, &err)) {
         claim_charge_error (error, l->lane, "taking back claims", &err);
         ok = false;
      }
      bson_destroy (u);
   }
   if (ok) {
      log_warn ("store: lane %u: %u listed delivery(ies) no longer run here (not settled, not renewed for a "
                "lease): %" PRId64 " charged an attempt, %u never handed out here taken back without one; "
                "runnable again",
                l->lane, a->n_lost, charged, a->n_unknown);
      pthread_mutex_lock (&s->mu);
      for (size_t j = 0; j < a->ids.n; j++)
         store_issued_remove (s, &a->ids.v[j]);
      pthread_mutex_unlock (&s->mu);
   }
   return ok;
}

/* A lane whose take-back was held up (claim_lane_hold): what it was to
 * take back stays listed, as running, and the lane is not written. */
static void
held_keep_listed (claim_lane_t *l, const store_oids_t *ids)
{
   for (size_t j = 0; j < ids->n; j++) {
      for (size_t k = 0; k < l->gone.n; k++)
         if (bson_oid_equal (&l->gone.v[k], &ids->v[j])) {
            l->gone.v[k] = l->gone.v[--l->gone.n];
            break;
         }
      store_oids_push (&l->inflight, &ids->v[j]);
   }
}

/* Phase 3: the ids the lanes list, as read.  A listed delivery this
 * instance no longer runs (its worker could not settle it and stopped
 * renewing it, or it never handed out its claim) is taken back
 * (take_back): its claim generation moves on here, before the lane stops
 * listing it in the record, so the old lease never matches again and the
 * delivery is runnable at once, also with a single proxy.  One write or
 * two per lane that has any (rare: a consumer or worker gone quiet). */
static bool
held_settle_listed (claim_t *c, const listed_set_t *set, bson_error_t *error)
{
   bool ok = true;

   for (size_t i = 0; i < c->n_lanes; i++) {
      claim_lane_t *l = &c->lanes[i];
      abandoned_t a = {.lost = BSON_INITIALIZER, .unknown = BSON_INITIALIZER};

      BSON_APPEND_ARRAY_BEGIN (&a.lost, "$or", &a.lost_arr);
      BSON_APPEND_ARRAY_BEGIN (&a.unknown, "$or", &a.unknown_arr);
      pthread_mutex_lock (&c->s->mu);
      held_settle_lane (c, l, set, &a);
      pthread_mutex_unlock (&c->s->mu);
      RELAYBUS_ASSERT (a.n_lost + a.n_unknown == a.ids.n);
      if (a.ids.n > 0 && !take_back (c, l, &a, error)) {
         if (claim_lane_hold (c, l, error))
            held_keep_listed (l, &a.ids);
         else
            ok = false;
      } else if (a.ids.n == 0) {
         bson_append_array_end (&a.lost, &a.lost_arr);
         bson_append_array_end (&a.unknown, &a.unknown_arr);
      }
      bson_destroy (&a.lost);
      bson_destroy (&a.unknown);
      store_oids_free (&a.ids);
   }
   return ok;
}

/* The lanes this instance holds under a live lease: checked against the
 * lane documents as read (owner and epoch), their lost claims charged,
 * the deliveries they list sorted out (phase 1), those it does not know
 * read (phase 2) and settled (phase 3).  Each lane's inFlight ends as what
 * still runs: what was read and still runs here, then what was known. */
bool
claim_load_held (claim_t *c, bson_error_t *error)
{
   store_oids_t all = {0};
   listed_set_t listed = {0};
   bool ok = true;

   held_check_all (c, &all);
   if (all.n > 0)
      ok = listed_read (c, &all, &listed, error) && held_settle_listed (c, &listed, error);
   for (size_t i = 0; i < c->n_lanes; i++) {
      claim_lane_t *l = &c->lanes[i];
      for (size_t j = 0; j < l->known.n; j++)
         store_oids_push (&l->inflight, &l->known.v[j]);
      if (ok && !l->skip)
         claim_lane_released (c, l->lane);
   }
   listed_free (&listed);
   store_oids_free (&all);
   return ok;
}
