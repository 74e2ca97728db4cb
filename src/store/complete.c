/*
 * store/complete.c - settling claims: complete and completeMany,
 * reschedule, release, bury, extendLease and relinquish.
 *
 * Every call is fenced by the lease token <laneId>:<epoch>:<claims>: it
 * applies only while the lane still has that epoch and lists the delivery,
 * and the delivery still has that claim generation.  A completion without
 * completion history writes no lane document (two commands per batch when
 * every reference names its event, four otherwise); with history it is
 * one transaction.  reschedule, release, bury and
 * extendLease are transactions that read the lane and write it, so a
 * takeover committing first makes them conflict, retry and find the new
 * epoch.
 */
#include "store/store.h"
#include "store/store_private.h"

#include <stdio.h>
#include <string.h>

#include "base/assert.h"
#include "base/log.h"
#include "base/outbox.h"

/* ---------------------------------------------------------- completeMany */

typedef struct {
   store_t *s;
   mongoc_client_t *client;
   const store_ref_t *refs;
   size_t n;
   int64_t now;
   outbox_lease_t *leases;
   bool *parsed;
   bool *valid;  /* out: fenced and deleted (if all went well) */
   int64_t n_valid, n_deleted;
} complete_t;

/* Reads the deliveries and their lanes and marks which leases still hold;
 * with `full`, the delivery documents are kept for history records. */
static bool
complete_fence (complete_t *c, mongoc_client_session_t *session, bson_t **docs, bson_error_t *error)
{
   mongoc_collection_t *dels = store_coll (c->s, c->client, OUTBOX_DELIVERIES);
   mongoc_collection_t *lanes = store_coll (c->s, c->client, OUTBOX_LANES_COLL);
   bson_t q = BSON_INITIALIZER, opts = BSON_INITIALIZER, lq = BSON_INITIALIZER;
   store_oids_t ids = {0};
   bson_t *lane_docs[OUTBOX_LANES] = {0};
   bson_t **found = bson_malloc0 ((c->n ? c->n : 1) * sizeof *found);
   mongoc_cursor_t *cur;
   const bson_t *doc;
   bson_error_t err;
   bool want_lane[OUTBOX_LANES] = {0};
   bool ok = true;

   c->n_valid = 0;
   for (size_t i = 0; i < c->n; i++) {
      c->valid[i] = false;
      if (c->parsed[i]) {
         store_oids_push (&ids, &c->refs[i].id);
         want_lane[c->leases[i].lane_id] = true;
      }
   }
   if (ids.n == 0)
      goto done;
   store_session_opts (session, &opts);
   store_append_oids_op (&q, "_id", "$in", ids.v, ids.n);
   cur = mongoc_collection_find_with_opts (dels, &q, &opts, NULL);
   while (mongoc_cursor_next (cur, &doc)) {
      bson_iter_t it;
      if (!bson_iter_init_find (&it, doc, "_id") || !BSON_ITER_HOLDS_OID (&it))
         continue;
      for (size_t i = 0; i < c->n; i++)
         if (c->parsed[i] && !found[i] && bson_oid_equal (&c->refs[i].id, bson_iter_oid (&it)))
            found[i] = bson_copy (doc);
   }
   if (mongoc_cursor_error (cur, &err)) {
      *error = err;
      ok = false;
   }
   mongoc_cursor_destroy (cur);
   if (!ok)
      goto done;

   store_append_lane_docs_in (c->s, &lq, want_lane);
   cur = mongoc_collection_find_with_opts (lanes, &lq, &opts, NULL);
   while (mongoc_cursor_next (cur, &doc)) {
      uint32_t lane;
      if (store_lane_of_doc (c->s, doc, &lane) && !lane_docs[lane])
         lane_docs[lane] = bson_copy (doc);
   }
   if (mongoc_cursor_error (cur, &err)) {
      *error = err;
      ok = false;
   }
   mongoc_cursor_destroy (cur);
   /* The fence (base/outbox.h), the same rule a pull consumer's
    * transaction applies (publish/pulltxn). */
   for (size_t i = 0; ok && i < c->n; i++) {
      c->valid[i] = c->parsed[i] &&
                    outbox_lease_holds (&c->leases[i], &c->refs[i].id, NULL, found[i], lane_docs[c->leases[i].lane_id]);
      if (c->valid[i] && docs && !docs[i]) {
         docs[i] = found[i];
         found[i] = NULL;
      }
      c->n_valid += c->valid[i];
   }

done:
   for (size_t i = 0; i < c->n; i++)
      if (found[i])
         bson_destroy (found[i]);
   bson_free (found);
   for (int i = 0; i < OUTBOX_LANES; i++)
      bson_destroy (lane_docs[i]);
   store_oids_free (&ids);
   bson_destroy (&q);
   bson_destroy (&lq);
   bson_destroy (&opts);
   mongoc_collection_destroy (dels);
   mongoc_collection_destroy (lanes);
   return ok;
}

/* Records the completion time on the events of the valid deliveries, with
 * one updateMany: each event id from its ref, or else from the delivery
 * document read (docs may be NULL).  Outside a transaction (session NULL)
 * the write is bounded (store_set_max_time_ms), and one that fails is
 * deferred (store_retry_deferred): the deliveries are deleted already, so
 * the completion stands, and waiting here would wait for a consumer's
 * transaction that wrote one of the events (another handler's completion
 * of the same event), up to that transaction's lifetime. */
static bool
events_completed (complete_t *c, mongoc_collection_t *events, bson_t **docs, mongoc_client_session_t *session,
                  bson_error_t *error)
{
   bson_t eq = BSON_INITIALIZER, sub, arr, opts = BSON_INITIALIZER;
   const char **ids = bson_malloc0 ((c->n ? c->n : 1) * sizeof *ids);
   uint32_t k = 0;
   bool ok = true, recorded = store_attempts_on (c->s) && c->s->times_by_second;

   BSON_APPEND_DOCUMENT_BEGIN (&eq, "_id", &sub);
   BSON_APPEND_ARRAY_BEGIN (&sub, "$in", &arr);
   for (size_t i = 0; i < c->n; i++) {
      char buf[16];
      const char *key, *id = c->refs[i].event_id;
      if (!c->valid[i])
         continue;
      if (!id && docs && docs[i])
         id = store_iter_utf8 (docs[i], OUTBOX_F_EVENT_ID) ? store_iter_utf8 (docs[i], OUTBOX_F_EVENT_ID) : "";
      if (!id)
         continue;
      recorded = recorded && c->refs[i].attempt;
      ids[k] = id;
      bson_uint32_to_string (k++, &key, buf, sizeof buf);
      BSON_APPEND_UTF8 (&arr, key, id);
   }
   bson_append_array_end (&sub, &arr);
   bson_append_document_end (&eq, &sub);
   if (k > 0 && !session && recorded) {
      /* The attempts' records hold each completion's time: the events'
       * times of one second go together once it is over
       * (store_completion_times_due), with that second's end. */
      bson_error_t err;
      store_t *to = c->s->times_to ? c->s->times_to : c->s;
      store_defer_events (to, ids, k, (c->now / 1000 + 1) * 1000, false);
      if (store_completion_times_due (to, c->now) && !store_retry_deferred (to, NULL, &err))
         log_info ("store: %s (tried again later)", err.message);
      k = 0;
   }
   if (k > 0) {
      bson_t *eu = BCON_NEW ("$max", "{", OUTBOX_F_COMPLETED_AT, BCON_DATE_TIME (c->now), "}");
      bson_error_t err;
      if (session) {
         store_session_opts (session, &opts);
         ok = mongoc_collection_update_many (events, &eq, eu, &opts, NULL, &err);
      } else {
         ok = store_bounded_write (c->s, events, STORE_WRITE_UPDATE_MANY, &eq, eu, 0, NULL, &err);
      }
      if (!ok && !session && c->s->max_time_ms > 0) {
         log_info ("store: %u event completion time(s) deferred (%s)", k, err.message);
         store_defer_events (c->s, ids, k, c->now, true);
         ok = true;
      } else if (!ok && error) {
         *error = err;
      }
      bson_destroy (eu);
   }
   bson_destroy (&eq);
   bson_destroy (&opts);
   bson_free (ids);
   return ok;
}

/* The attempt records of the completion's valid refs (those that carry
 * one), each with its event id from its ref or else from the delivery
 * read (docs may be NULL): one insert, in the transaction when there is
 * one (`session`).  Outside one the insert goes before the delete, with
 * the _id each attempt was given, so a completion tried again after a
 * failure records its attempts once; an insert that fails there is
 * logged and the completion goes on (the record is lost, the delivery
 * is not held up).  Nothing without attempt history. */
static bool
complete_record (complete_t *c, bson_t **docs, mongoc_client_session_t *session, bson_error_t *error)
{
   store_attempt_docs_t recs = {0};
   mongoc_collection_t *coll;
   bson_t opts = BSON_INITIALIZER;
   bson_error_t err;
   bool ok = true;

   if (!store_attempts_on (c->s))
      return true;
   for (size_t i = 0; i < c->n; i++) {
      const char *ev = c->refs[i].event_id;
      if (!c->valid[i] || !c->refs[i].attempt)
         continue;
      if (!ev && docs && docs[i])
         ev = store_iter_utf8 (docs[i], OUTBOX_F_EVENT_ID);
      store_attempt_docs_add (c->s, &recs, &c->refs[i].id, ev, c->refs[i].attempt, c->now);
   }
   if (recs.n == 0)
      goto done;
   coll = store_coll (c->s, c->client, OUTBOX_ATTEMPTS);
   store_session_opts (session, &opts);
   ok = store_attempt_docs_insert (c->s, coll, &recs, session ? &opts : NULL, &err);
   mongoc_collection_destroy (coll);
   if (!ok && session) {
      if (error)
         *error = err;
   } else if (!ok) {
      log_warn ("store: %s; the completion goes on without them", err.message);
      ok = true;
   }
done:
   store_attempt_docs_free (&recs);
   bson_destroy (&opts);
   return ok;
}

/* Deletes the fenced deliveries that still have the lease's generation and
 * records the completion time on their events. */
static bool
complete_delete (complete_t *c, mongoc_client_session_t *session, bson_t **docs, bson_error_t *error)
{
   mongoc_collection_t *dels = store_coll (c->s, c->client, OUTBOX_DELIVERIES);
   mongoc_collection_t *events = store_coll (c->s, c->client, OUTBOX_EVENTS);
   mongoc_collection_t *hist = NULL;
   bson_t q = BSON_INITIALIZER, opts = BSON_INITIALIZER, reply, or_arr;
   uint32_t k = 0;
   bool ok = true;

   c->n_deleted = 0;
   if (c->n_valid == 0)
      goto done;
   store_session_opts (session, &opts);
   BSON_APPEND_ARRAY_BEGIN (&q, "$or", &or_arr);
   for (size_t i = 0; i < c->n; i++) {
      char buf[16];
      const char *key;
      bson_t one;
      if (!c->valid[i])
         continue;
      bson_uint32_to_string (k++, &key, buf, sizeof buf);
      BSON_APPEND_DOCUMENT_BEGIN (&or_arr, key, &one);
      BSON_APPEND_OID (&one, "_id", &c->refs[i].id);
      store_append_claims_match (&one, c->leases[i].claims);
      bson_append_document_end (&or_arr, &one);
   }
   bson_append_array_end (&q, &or_arr);
   if (!complete_record (c, docs, session, error)) {
      ok = false;
      goto done;
   }
   if (session) {
      ok = mongoc_collection_delete_many (dels, &q, &opts, &reply, error);
      c->n_deleted = ok ? store_iter_int64 (&reply, "deletedCount") : 0;
      bson_destroy (&reply);
   } else {
      ok = store_bounded_write (c->s, dels, STORE_WRITE_DELETE_MANY, &q, NULL, 0, &c->n_deleted, error);
   }
   if (!ok)
      goto done;

   if (docs && c->s->completion_history) {
      /* Completion history: one record per completed delivery. */
      const bson_t **recs = bson_malloc0 (c->n * sizeof *recs);
      size_t n_recs = 0;
      hist = store_coll (c->s, c->client, OUTBOX_COMPLETED);
      for (size_t i = 0; i < c->n; i++) {
         bson_t *rec;
         bson_iter_t it;
         static const char *const copy[] = {OUTBOX_F_EVENT_ID, "handler", OUTBOX_F_EVENT_TYPE, "key", "sequence", OUTBOX_F_CREATED_AT};
         if (!c->valid[i] || !docs[i])
            continue;
         rec = bson_new ();
         BSON_APPEND_OID (rec, "_id", &c->refs[i].id);
         for (size_t f = 0; f < sizeof copy / sizeof copy[0]; f++)
            if (bson_iter_init_find (&it, docs[i], copy[f]))
               bson_append_iter (rec, copy[f], -1, &it);
         BSON_APPEND_INT32 (rec, OUTBOX_F_ATTEMPTS, (int32_t) store_iter_int64 (docs[i], OUTBOX_F_ATTEMPTS) + 1);
         BSON_APPEND_DATE_TIME (rec, OUTBOX_F_COMPLETED_AT, c->now);
         recs[n_recs++] = rec;
      }
      /* One insert command for the batch's records. */
      if (n_recs > 0)
         ok = mongoc_collection_insert_many (hist, recs, n_recs, &opts, NULL, error);
      for (size_t i = 0; i < n_recs; i++)
         bson_destroy ((bson_t *) recs[i]);
      bson_free (recs);
   }

   if (ok)
      ok = events_completed (c, events, docs, session, error);

done:
   bson_destroy (&q);
   bson_destroy (&opts);
   mongoc_collection_destroy (dels);
   mongoc_collection_destroy (events);
   mongoc_collection_destroy (hist);
   return ok;
}

/* The completion without completion history when every ref names its
 * event: no read.  The delete matches a delivery only while it still has
 * the lease's claim generation, lane and pending status.  That is the
 * whole fence: every path that ends a claim or takes its lane moves the
 * generation on (retry, release, burial, reconciliation, relinquish, and a
 * takeover's charge of the lost claims) before the delivery can run again,
 * so a stale lease deletes nothing, and a delete that wins the race against
 * a takeover's charge leaves the new owner nothing to run (completed once).
 * Then the events' completion times. */
static bool
complete_unread (complete_t *c, bson_error_t *error)
{
   mongoc_collection_t *dels = store_coll (c->s, c->client, OUTBOX_DELIVERIES);
   mongoc_collection_t *events = store_coll (c->s, c->client, OUTBOX_EVENTS);
   bson_t q = BSON_INITIALIZER, or_arr;
   uint32_t k = 0;
   bool ok = true;

   c->n_valid = c->n_deleted = 0;
   BSON_APPEND_ARRAY_BEGIN (&q, "$or", &or_arr);
   for (size_t i = 0; i < c->n; i++) {
      char buf[16];
      const char *key;
      bson_t one;
      c->valid[i] = c->parsed[i];
      if (!c->valid[i])
         continue;
      c->n_valid++;
      bson_uint32_to_string (k++, &key, buf, sizeof buf);
      BSON_APPEND_DOCUMENT_BEGIN (&or_arr, key, &one);
      BSON_APPEND_OID (&one, "_id", &c->refs[i].id);
      store_append_claims_match (&one, c->leases[i].claims);
      BSON_APPEND_INT32 (&one, OUTBOX_F_LANE_ID, (int32_t) c->leases[i].lane_id);
      BSON_APPEND_UTF8 (&one, "status", "pending");
      bson_append_document_end (&or_arr, &one);
   }
   bson_append_array_end (&q, &or_arr);
   if (c->n_valid == 0)
      goto done;
   (void) complete_record (c, NULL, NULL, NULL); /* outside a transaction it does not fail */
   /* Bounded (store_set_max_time_ms), as the events' write after it. */
   if (!store_bounded_write (c->s, dels, STORE_WRITE_DELETE_MANY, &q, NULL, 0, &c->n_deleted, error)) {
      ok = false;
      goto done;
   }

   ok = events_completed (c, events, NULL, NULL, error);

done:
   bson_destroy (&q);
   mongoc_collection_destroy (dels);
   mongoc_collection_destroy (events);
   return ok;
}

typedef struct {
   complete_t *c;
   bson_t **docs;
} complete_txn_t;

static bool
complete_txn_cb (store_txn_t *txn, void *ctx, bson_error_t *error)
{
   complete_txn_t *t = ctx;

   for (size_t i = 0; i < t->c->n; i++)
      if (t->docs[i]) {
         bson_destroy (t->docs[i]);
         t->docs[i] = NULL;
      }
   return complete_fence (t->c, txn->session, t->docs, error) && complete_delete (t->c, txn->session, t->docs, error);
}

/* The instance that handed ref's claim out. */
static store_t *
ref_space (store_t *s, const store_ref_t *ref)
{
   return ref->space ? ref->space : s;
}

/* store_complete_many of refs of several spaces on a path that reads
 * their lanes (completion history, or a ref without its event): one call
 * per space, in the order of their first refs. */
static bool
complete_by_space (store_t *s, const store_ref_t *refs, size_t n, int64_t now, bool *done, bson_error_t *error)
{
   store_ref_t *group = bson_malloc0 (n * sizeof *group);
   size_t *at = bson_malloc0 (n * sizeof *at);
   bool *taken = bson_malloc0 (n * sizeof *taken), *got = bson_malloc0 (n * sizeof *got);
   bool ok = true;

   for (size_t i = 0; i < n; i++) {
      store_t *sp = ref_space (s, &refs[i]);
      size_t k = 0;
      if (taken[i])
         continue;
      for (size_t j = i; j < n; j++)
         if (!taken[j] && ref_space (s, &refs[j]) == sp) {
            taken[j] = true;
            at[k] = j;
            group[k] = refs[j];
            group[k++].space = NULL;
         }
      if (!store_complete_many (sp, group, k, now, got, error)) {
         ok = false;
         continue;
      }
      for (size_t j = 0; j < k; j++)
         done[at[j]] = got[j];
   }
   bson_free (group);
   bson_free (at);
   bson_free (taken);
   bson_free (got);
   return ok;
}

bool
store_complete_many (store_t *s, const store_ref_t *refs, size_t n, int64_t now, bool *done, bson_error_t *error)
{
   complete_t c = {0};
   bson_t **docs;
   bool ok, mixed = false, named = true;

   for (size_t i = 0; i < n; i++) {
      done[i] = false;
      mixed = mixed || ref_space (s, &refs[i]) != s;
      named = named && refs[i].event_id != NULL;
   }
   if (n == 0)
      return true;
   if (mixed && (s->completion_history || !named))
      return complete_by_space (s, refs, n, now, done, error);
   c.s = s;
   c.refs = refs;
   c.n = n;
   c.now = now;
   c.leases = bson_malloc0 (n * sizeof *c.leases);
   c.parsed = bson_malloc0 (n * sizeof *c.parsed);
   c.valid = bson_malloc0 (n * sizeof *c.valid);
   docs = bson_malloc0 (n * sizeof *docs);
   for (size_t i = 0; i < n; i++)
      c.parsed[i] = refs[i].lease && outbox_lease_parse (refs[i].lease, &c.leases[i]);
   c.client = mongoc_client_pool_pop (s->pool);
   if (s->completion_history) {
      complete_txn_t t = {&c, docs};
      ok = store_with_txn (s, c.client, complete_txn_cb, &t, error);
   } else {
      /* Without a read the refs of every space go in the same commands:
       * the delete's match is the whole fence, and the instances differ
       * only in their lanes, which it does not read (mixed). */
      if (named)
         ok = complete_unread (&c, error);
      else
         ok = complete_fence (&c, NULL, docs, error) && complete_delete (&c, NULL, docs, error);
      if (!ok && error && error->domain != STORE_ERROR_DOMAIN) {
         char msg[sizeof error->message];
         bson_strncpy (msg, error->message, sizeof msg);
         store_set_error (error, STORE_ERROR_SERVER, "completing: %s", msg);
      }
   }
   mongoc_client_pool_push (s->pool, c.client);
   if (ok && c.n_deleted == c.n_valid) {
      for (size_t i = 0; i < n; i++)
         done[i] = c.valid[i];
   } else if (ok) {
      /* A claim ended or changed hands meanwhile: a missing document
       * cannot be told from one the new claim completed, so success is
       * reported only when proven. */
      log_info ("store: completion deleted %" PRId64 " of %" PRId64 " fenced deliveries; none reported completed",
                c.n_deleted,
                c.n_valid);
   }
   for (size_t i = 0; ok && i < n; i++) {
      store_t *o = ref_space (s, &refs[i]); /* what the instance that handed it out remembers */
      const store_issued_t *is;
      pthread_mutex_lock (&o->mu);
      is = store_issued_find (o, &refs[i].id);
      /* A stale lease (an earlier claim's) does not end the claim this
       * instance handed out since: the next claim must still know that
       * one as its own (charged if it is abandoned, see claim_held.c). */
      if (is && (done[i] || (c.parsed[i] && is->lane == c.leases[i].lane_id && is->epoch == c.leases[i].epoch &&
                             is->claims == c.leases[i].claims)))
         store_issued_remove (o, &refs[i].id);
      if (done[i]) {
         if (o->settled.n >= STORE_SETTLED_MAX)
            o->settled.n = 0; /* forgotten: the next claim reads what its lanes list */
         store_oids_push (&o->settled, &refs[i].id);
         RELAYBUS_ASSERT (o->settled.n <= STORE_SETTLED_MAX);
      }
      pthread_mutex_unlock (&o->mu);
   }
   for (size_t i = 0; i < n; i++)
      bson_destroy (docs[i]);
   bson_free (docs);
   bson_free (c.leases);
   bson_free (c.parsed);
   bson_free (c.valid);
   return ok;
}

bool
store_complete (store_t *s, const store_ref_t *ref, int64_t now, bool *done, bson_error_t *error)
{
   return store_complete_many (s, ref, 1, now, done, error);
}

/* ------------------------------------------- reschedule, release, bury */

typedef enum {
   SETTLE_RESCHEDULE,
   SETTLE_RELEASE,
   SETTLE_BURY,
   SETTLE_EXTEND,
} settle_kind_t;

static const char *const settle_names[] = {
   [SETTLE_RESCHEDULE] = "reschedule",
   [SETTLE_RELEASE] = "release",
   [SETTLE_BURY] = "bury",
   [SETTLE_EXTEND] = "extendLease",
};

typedef struct {
   store_t *s;
   mongoc_client_t *client;
   settle_kind_t kind;
   const store_ref_t *ref;
   outbox_lease_t lease;
   int64_t now, due_at, lease_ms;
   const char *last_error;
   bool applied;
} settle_t;

/* Whether any document of coll matches q; false: the query failed. */
static bool
find_any (mongoc_collection_t *coll, const bson_t *q, const bson_t *opts, bool *found, bson_error_t *error)
{
   mongoc_cursor_t *cur = mongoc_collection_find_with_opts (coll, q, opts, NULL);
   const bson_t *doc;
   bool ok = true;

   *found = mongoc_cursor_next (cur, &doc);
   if (mongoc_cursor_error (cur, error))
      ok = false;
   mongoc_cursor_destroy (cur);
   return ok;
}

static bool
settle_cb (store_txn_t *txn, void *ctx, bson_error_t *error)
{
   settle_t *t = ctx;
   bson_t dq = BSON_INITIALIZER, du = BSON_INITIALIZER, sub, reply;
   bson_t *lq = BCON_NEW ("_id", BCON_INT32 (store_lane_doc (t->s, t->lease.lane_id)), OUTBOX_F_EPOCH, BCON_INT64 (t->lease.epoch),
                          OUTBOX_F_IN_FLIGHT, BCON_OID (&t->ref->id));
   bson_t *lu = NULL;
   bool ok = true, found;

   t->applied = false;
   ok = find_any (txn->coll[OUTBOX_LANES_COLL], lq, &txn->opts, &found, error);
   if (!ok || !found)
      goto done;

   BSON_APPEND_OID (&dq, "_id", &t->ref->id);
   BSON_APPEND_INT32 (&dq, OUTBOX_F_LANE_ID, (int32_t) t->lease.lane_id);
   BSON_APPEND_UTF8 (&dq, "status", "pending");
   store_append_claims_match (&dq, t->lease.claims);
   if (t->kind == SETTLE_EXTEND) {
      /* The generation check: a stale lease never extends the lane of a
       * newer claim of the same delivery. */
      ok = find_any (txn->coll[OUTBOX_DELIVERIES], &dq, &txn->opts, &found, error);
      if (!ok || !found)
         goto done;
      lu = BCON_NEW ("$max", "{", OUTBOX_F_LEASE_EXPIRES_AT, BCON_DATE_TIME (t->now + t->lease_ms), "}");
      ok = mongoc_collection_update_one (txn->coll[OUTBOX_LANES_COLL], lq, lu, &txn->opts, NULL, error);
      t->applied = ok;
      goto done;
   }

   BSON_APPEND_DOCUMENT_BEGIN (&du, "$inc", &sub);
   if (t->kind != SETTLE_RELEASE)
      BSON_APPEND_INT32 (&sub, OUTBOX_F_ATTEMPTS, 1);
   BSON_APPEND_INT32 (&sub, OUTBOX_F_CLAIMS, 1);
   bson_append_document_end (&du, &sub);
   BSON_APPEND_DOCUMENT_BEGIN (&du, "$set", &sub);
   BSON_APPEND_DATE_TIME (&sub, OUTBOX_F_UPDATED_AT, t->now);
   if (t->kind == SETTLE_RESCHEDULE)
      BSON_APPEND_DATE_TIME (&sub, OUTBOX_F_DUE_AT, t->due_at);
   if (t->kind == SETTLE_BURY)
      BSON_APPEND_UTF8 (&sub, "status", "dead");
   if (t->last_error && t->kind != SETTLE_RELEASE) {
      /* The one place a failure's text enters the outbox, where anyone
       * who may read it (the admin API, the dashboard, the database's
       * users) would see a broker's password that a library quoted. */
      char *masked = config_mask (NULL, t->last_error);
      BSON_APPEND_UTF8 (&sub, OUTBOX_F_LAST_ERROR, masked);
      bson_free (masked);
   }
   bson_append_document_end (&du, &sub);
   if (t->kind == SETTLE_BURY) {
      BSON_APPEND_DOCUMENT_BEGIN (&du, "$unset", &sub);
      BSON_APPEND_UTF8 (&sub, "lane", "");
      bson_append_document_end (&du, &sub);
   }
   if (!mongoc_collection_update_one (txn->coll[OUTBOX_DELIVERIES], &dq, &du, &txn->opts, &reply, error)) {
      bson_destroy (&reply);
      ok = false;
      goto done;
   }
   found = store_iter_int64 (&reply, "matchedCount") == 1;
   bson_destroy (&reply);
   if (!found)
      goto done;
   if (t->ref->attempt && store_attempts_on (t->s)) {
      /* The attempt's record, in the same transaction. */
      store_attempt_docs_t recs = {0};
      store_attempt_docs_add (t->s, &recs, &t->ref->id, t->ref->event_id, t->ref->attempt, t->now);
      ok = store_attempt_docs_insert (t->s, txn->coll[OUTBOX_ATTEMPTS], &recs, &txn->opts, error);
      store_attempt_docs_free (&recs);
      if (!ok)
         goto done;
   }
   lu = BCON_NEW ("$pull", "{", OUTBOX_F_IN_FLIGHT, BCON_OID (&t->ref->id), "}");
   ok = mongoc_collection_update_one (txn->coll[OUTBOX_LANES_COLL], lq, lu, &txn->opts, NULL, error);
   t->applied = ok;

done:
   bson_destroy (lu);
   bson_destroy (lq);
   bson_destroy (&dq);
   bson_destroy (&du);
   return ok;
}

/* After a renewal that applied (callers hold s->mu): the lane this
 * instance holds under the lease's epoch, and the claim itself, are leased
 * until `expires`; neither ever moves back. */
static void
renewed (store_t *s, const bson_oid_t *id, const outbox_lease_t *lease, int64_t expires)
{
   store_lane_state_t *st;

   RELAYBUS_ASSERT (lease->lane_id < OUTBOX_LANES); /* outbox_lease_parse's bound */
   st = &s->lanes[lease->lane_id];
   if (st->held && st->epoch == lease->epoch && st->expires < expires)
      st->expires = expires;
   store_issued_renew (s, id, lease->lane_id, lease->epoch, lease->claims, expires);
}

static bool
settle (store_t *s, settle_t *t, bool *applied, bson_error_t *error)
{
   bool ok;

   *applied = false;
   if (!store_ref_lease (t->ref, &t->lease, error))
      return false;
   t->s = s;
   t->client = mongoc_client_pool_pop (s->pool);
   ok = store_with_txn (s, t->client, settle_cb, t, error);
   mongoc_client_pool_push (s->pool, t->client);
   if (ok)
      *applied = t->applied;
   if (ok && !t->applied)
      log_debug ("store: %s with a stale lease %s changed nothing", settle_names[t->kind], t->ref->lease);
   pthread_mutex_lock (&s->mu);
   if (ok && t->kind == SETTLE_EXTEND && t->applied) {
      renewed (s, &t->ref->id, &t->lease, t->now + t->lease_ms);
   } else if (ok && t->kind != SETTLE_EXTEND) {
      store_issued_remove (s, &t->ref->id);
   }
   pthread_mutex_unlock (&s->mu);
   return ok;
}

bool
store_reschedule (store_t *s,
                  const store_ref_t *ref,
                  int64_t now,
                  int64_t due_at,
                  const char *last_error,
                  bool *applied,
                  bson_error_t *error)
{
   settle_t t = {.kind = SETTLE_RESCHEDULE, .ref = ref, .now = now, .due_at = due_at, .last_error = last_error};
   return settle (s, &t, applied, error);
}

bool
store_release (store_t *s, const store_ref_t *ref, int64_t now, bool *applied, bson_error_t *error)
{
   settle_t t = {.kind = SETTLE_RELEASE, .ref = ref, .now = now};
   return settle (s, &t, applied, error);
}

bool
store_bury (store_t *s, const store_ref_t *ref, int64_t now, const char *last_error, bool *applied, bson_error_t *error)
{
   settle_t t = {.kind = SETTLE_BURY, .ref = ref, .now = now, .last_error = last_error};
   return settle (s, &t, applied, error);
}

bool
store_extend_lease (store_t *s,
                    const store_ref_t *ref,
                    int64_t now,
                    int64_t lease_ms,
                    bool *applied,
                    bson_error_t *error)
{
   settle_t t = {.kind = SETTLE_EXTEND, .ref = ref, .now = now, .lease_ms = lease_ms};
   return settle (s, &t, applied, error);
}

/* -------------------------------------------------------- extendLeases */

/* The refs of one lane and epoch, renewed in one transaction. */
typedef struct {
   const store_t *s;
   uint32_t lane;
   int64_t epoch;
   const store_ref_t *refs;
   const outbox_lease_t *leases;
   const size_t *idx; /* indexes into refs of this group */
   size_t n;
   bool *applied; /* per ref (all refs) */
   int64_t now, lease_ms;
} renew_t;

static bool
renew_cb (store_txn_t *txn, void *ctx, bson_error_t *error)
{
   renew_t *r = ctx;
   bson_t dq = BSON_INITIALIZER, or_arr;
   bson_t *lq = BCON_NEW ("_id", BCON_INT32 (store_lane_doc (r->s, r->lane)), OUTBOX_F_EPOCH, BCON_INT64 (r->epoch));
   bson_t *lane_doc = NULL, *lu = NULL;
   mongoc_cursor_t *cur;
   const bson_t *doc;
   size_t n_applied = 0;
   bool ok = true;

   for (size_t i = 0; i < r->n; i++)
      r->applied[r->idx[i]] = false;
   cur = mongoc_collection_find_with_opts (txn->coll[OUTBOX_LANES_COLL], lq, &txn->opts, NULL);
   if (mongoc_cursor_next (cur, &doc))
      lane_doc = bson_copy (doc);
   if (mongoc_cursor_error (cur, error))
      ok = false;
   mongoc_cursor_destroy (cur);
   if (!ok || !lane_doc)
      goto done;
   /* The generation check of every ref: a stale lease never extends the
    * lane of a newer claim, and one stale ref does not keep the others of
    * the lane from being renewed. */
   BSON_APPEND_ARRAY_BEGIN (&dq, "$or", &or_arr);
   for (size_t i = 0; i < r->n; i++) {
      char buf[16];
      const char *key;
      bson_t one;
      bson_uint32_to_string ((uint32_t) i, &key, buf, sizeof buf);
      BSON_APPEND_DOCUMENT_BEGIN (&or_arr, key, &one);
      BSON_APPEND_OID (&one, "_id", &r->refs[r->idx[i]].id);
      BSON_APPEND_INT32 (&one, OUTBOX_F_LANE_ID, (int32_t) r->lane);
      BSON_APPEND_UTF8 (&one, "status", "pending");
      store_append_claims_match (&one, r->leases[r->idx[i]].claims);
      bson_append_document_end (&or_arr, &one);
   }
   bson_append_array_end (&dq, &or_arr);
   cur = mongoc_collection_find_with_opts (txn->coll[OUTBOX_DELIVERIES], &dq, &txn->opts, NULL);
   while (mongoc_cursor_next (cur, &doc)) {
      bson_iter_t it;
      if (!bson_iter_init_find (&it, doc, "_id") || !BSON_ITER_HOLDS_OID (&it))
         continue;
      for (size_t i = 0; i < r->n; i++)
         if (bson_oid_equal (bson_iter_oid (&it), &r->refs[r->idx[i]].id) &&
             store_iter_int64 (doc, OUTBOX_F_CLAIMS) == r->leases[r->idx[i]].claims &&
             store_array_has_oid (lane_doc, OUTBOX_F_IN_FLIGHT, &r->refs[r->idx[i]].id) && !r->applied[r->idx[i]]) {
            r->applied[r->idx[i]] = true;
            n_applied++;
         }
   }
   if (mongoc_cursor_error (cur, error))
      ok = false;
   mongoc_cursor_destroy (cur);
   if (ok && n_applied > 0) {
      lu = BCON_NEW ("$max", "{", OUTBOX_F_LEASE_EXPIRES_AT, BCON_DATE_TIME (r->now + r->lease_ms), "}");
      ok = mongoc_collection_update_one (txn->coll[OUTBOX_LANES_COLL], lq, lu, &txn->opts, NULL, error);
   }
   if (!ok)
      for (size_t i = 0; i < r->n; i++)
         r->applied[r->idx[i]] = false;

done:
   bson_destroy (lu);
   bson_destroy (lane_doc);
   bson_destroy (lq);
   bson_destroy (&dq);
   return ok;
}

bool
store_extend_leases (store_t *s,
                     mongoc_client_pool_t *pool,
                     const store_ref_t *refs,
                     size_t n,
                     int64_t now,
                     int64_t lease_ms,
                     bool *applied,
                     bson_error_t *error)
{
   outbox_lease_t *leases;
   bool *grouped;
   size_t *idx;
   mongoc_client_t *client;
   bool ok = true;

   for (size_t i = 0; i < n; i++)
      applied[i] = false;
   if (n == 0)
      return true;
   leases = bson_malloc0 (n * sizeof *leases);
   grouped = bson_malloc0 (n * sizeof *grouped);
   idx = bson_malloc0 (n * sizeof *idx);
   for (size_t i = 0; i < n; i++)
      grouped[i] = !(refs[i].lease && outbox_lease_parse (refs[i].lease, &leases[i])); /* refused without a call */
   if (!pool)
      pool = s->pool;
   client = mongoc_client_pool_pop (pool);
   for (size_t i = 0; i < n; i++) {
      renew_t r = {.s = s, .refs = refs, .leases = leases, .idx = idx, .applied = applied, .now = now, .lease_ms = lease_ms};
      bson_error_t err;
      if (grouped[i])
         continue;
      r.lane = leases[i].lane_id;
      r.epoch = leases[i].epoch;
      for (size_t j = i; j < n; j++)
         if (!grouped[j] && leases[j].lane_id == r.lane && leases[j].epoch == r.epoch) {
            grouped[j] = true;
            idx[r.n++] = j;
         }
      if (!store_with_txn (s, client, renew_cb, &r, &err)) {
         /* One lane failing does not keep the others from being renewed. */
         if (ok && error)
            *error = err;
         ok = false;
         for (size_t j = 0; j < r.n; j++)
            applied[idx[j]] = false;
         continue;
      }
      pthread_mutex_lock (&s->mu);
      for (size_t j = 0; j < r.n; j++)
         if (applied[idx[j]])
            renewed (s, &refs[idx[j]].id, &leases[idx[j]], now + lease_ms);
      pthread_mutex_unlock (&s->mu);
   }
   mongoc_client_pool_push (pool, client);
   bson_free (leases);
   bson_free (grouped);
   bson_free (idx);
   return ok;
}

/* ------------------------------------------------------------ many */

/* Many leases, of any lanes, settled or extended in one transaction of a
 * few commands (store_settle_many, store_extend_many). */
typedef struct {
   store_t *s;
   store_many_kind_t kind;
   const store_ref_t *refs;
   const outbox_lease_t *leases;
   const bool *valid; /* the lease parsed */
   size_t n;
   bool *applied;
   int64_t now, due_at, lease_ms;
   const char *last_error;
} many_t;

/* Appends {_id: {$in: [...]}} of the distinct lanes of the leases whose
 * `pick` is set to `q`; returns how many. */
static uint32_t
append_lane_ids (bson_t *q, const many_t *e, const bool *pick)
{
   bool seen[OUTBOX_LANES] = {false};
   bson_t in, arr;
   uint32_t k = 0;

   BSON_APPEND_DOCUMENT_BEGIN (q, "_id", &in);
   BSON_APPEND_ARRAY_BEGIN (&in, "$in", &arr);
   for (size_t i = 0; i < e->n; i++) {
      char buf[16];
      const char *key;

      if (!pick[i] || seen[e->leases[i].lane_id])
         continue;
      seen[e->leases[i].lane_id] = true;
      bson_uint32_to_string (k++, &key, buf, sizeof buf);
      BSON_APPEND_INT32 (&arr, key, store_lane_doc (e->s, e->leases[i].lane_id));
   }
   bson_append_array_end (&in, &arr);
   bson_append_document_end (q, &in);
   return k;
}

/* {_id: {$in: [the ids of the refs whose `pick` is set]}} into `q`. */
static void
append_ref_ids (bson_t *q, const many_t *e, const bool *pick)
{
   bson_t in, arr;
   uint32_t k = 0;

   BSON_APPEND_DOCUMENT_BEGIN (q, "_id", &in);
   BSON_APPEND_ARRAY_BEGIN (&in, "$in", &arr);
   for (size_t i = 0; i < e->n; i++)
      if (pick[i]) {
         char buf[16];
         const char *key;
         bson_uint32_to_string (k++, &key, buf, sizeof buf);
         BSON_APPEND_OID (&arr, key, &e->refs[i].id);
      }
   bson_append_array_end (&in, &arr);
   bson_append_document_end (q, &in);
}

/* The fence of every lease, in two reads by _id (cheap for any number of
 * leases): their lanes, each of which must be at the lease's epoch and
 * list the delivery, then their deliveries, each of which must be pending
 * in that lane at the lease's claim generation.  The fields are compared
 * here, in the transaction's snapshot, so the writes after it may match by
 * _id alone.  e->applied[i]: lease i holds.  A stale lease changes
 * nothing, and does not keep the others from being settled. */
static bool
many_fence (store_txn_t *txn, many_t *e, bson_error_t *error)
{
   bson_t *lanes[OUTBOX_LANES] = {0};
   bson_t lq = BSON_INITIALIZER, dq = BSON_INITIALIZER;
   bool *fenced = bson_malloc0 (e->n * sizeof *fenced);
   mongoc_cursor_t *cur;
   const bson_t *doc;
   size_t k = 0;
   bool ok = true;

   append_lane_ids (&lq, e, e->valid);
   cur = mongoc_collection_find_with_opts (txn->coll[OUTBOX_LANES_COLL], &lq, &txn->opts, NULL);
   while (mongoc_cursor_next (cur, &doc)) {
      uint32_t id;
      if (store_lane_of_doc (e->s, doc, &id) && !lanes[id])
         lanes[id] = bson_copy (doc);
   }
   if (mongoc_cursor_error (cur, error))
      ok = false;
   mongoc_cursor_destroy (cur);
   if (!ok)
      goto done;
   for (size_t i = 0; i < e->n; i++) {
      const bson_t *lane = e->valid[i] ? lanes[e->leases[i].lane_id] : NULL;
      fenced[i] = lane && store_iter_int64 (lane, OUTBOX_F_EPOCH) == e->leases[i].epoch &&
                  store_array_has_oid (lane, OUTBOX_F_IN_FLIGHT, &e->refs[i].id);
      k += fenced[i];
   }
   if (k == 0)
      goto done;
   append_ref_ids (&dq, e, fenced);
   cur = mongoc_collection_find_with_opts (txn->coll[OUTBOX_DELIVERIES], &dq, &txn->opts, NULL);
   while (mongoc_cursor_next (cur, &doc)) {
      bson_iter_t it;
      if (!bson_iter_init_find (&it, doc, "_id") || !BSON_ITER_HOLDS_OID (&it))
         continue;
      /* The whole fence (base/outbox.h) on the delivery and its lane. */
      for (size_t i = 0; i < e->n; i++)
         if (fenced[i] && !e->applied[i] && bson_oid_equal (bson_iter_oid (&it), &e->refs[i].id) &&
             outbox_lease_holds (&e->leases[i], &e->refs[i].id, NULL, doc, lanes[e->leases[i].lane_id]))
            e->applied[i] = true;
   }
   if (mongoc_cursor_error (cur, error))
      ok = false;
   mongoc_cursor_destroy (cur);
done:
   for (size_t i = 0; i < OUTBOX_LANES; i++)
      bson_destroy (lanes[i]);
   bson_destroy (&lq);
   bson_destroy (&dq);
   bson_free (fenced);
   return ok;
}

/* The settling writes of the deliveries that held, as settle_cb writes one:
 * the deliveries (one update: in the transaction, their fence was read in
 * its snapshot, so matching them by id is enough), then their lanes (one
 * update: each pulls the ids, which are only in their own lane). */
static bool
many_settle_writes (store_txn_t *txn, many_t *e, bson_error_t *error)
{
   bson_t dq = BSON_INITIALIZER, du = BSON_INITIALIZER, lq = BSON_INITIALIZER, lu = BSON_INITIALIZER, sub, pull;
   bool ok;

   append_ref_ids (&dq, e, e->applied);
   BSON_APPEND_DOCUMENT_BEGIN (&du, "$inc", &sub);
   if (e->kind != STORE_MANY_RELEASE)
      BSON_APPEND_INT32 (&sub, OUTBOX_F_ATTEMPTS, 1);
   BSON_APPEND_INT32 (&sub, OUTBOX_F_CLAIMS, 1);
   bson_append_document_end (&du, &sub);
   BSON_APPEND_DOCUMENT_BEGIN (&du, "$set", &sub);
   BSON_APPEND_DATE_TIME (&sub, OUTBOX_F_UPDATED_AT, e->now);
   if (e->kind == STORE_MANY_RESCHEDULE)
      BSON_APPEND_DATE_TIME (&sub, OUTBOX_F_DUE_AT, e->due_at);
   if (e->kind == STORE_MANY_BURY)
      BSON_APPEND_UTF8 (&sub, "status", "dead");
   if (e->last_error && e->kind != STORE_MANY_RELEASE)
      BSON_APPEND_UTF8 (&sub, OUTBOX_F_LAST_ERROR, e->last_error);
   bson_append_document_end (&du, &sub);
   if (e->kind == STORE_MANY_BURY) {
      BSON_APPEND_DOCUMENT_BEGIN (&du, "$unset", &sub);
      BSON_APPEND_UTF8 (&sub, "lane", "");
      bson_append_document_end (&du, &sub);
   }
   ok = mongoc_collection_update_many (txn->coll[OUTBOX_DELIVERIES], &dq, &du, &txn->opts, NULL, error);
   if (ok) {
      append_lane_ids (&lq, e, e->applied);
      BSON_APPEND_DOCUMENT_BEGIN (&lu, "$pull", &pull);
      BSON_APPEND_DOCUMENT_BEGIN (&pull, OUTBOX_F_IN_FLIGHT, &sub);
      {
         bson_t in;
         uint32_t k = 0;
         BSON_APPEND_ARRAY_BEGIN (&sub, "$in", &in);
         for (size_t i = 0; i < e->n; i++)
            if (e->applied[i]) {
               char buf[16];
               const char *key;
               bson_uint32_to_string (k++, &key, buf, sizeof buf);
               BSON_APPEND_OID (&in, key, &e->refs[i].id);
            }
         bson_append_array_end (&sub, &in);
      }
      bson_append_document_end (&pull, &sub);
      bson_append_document_end (&lu, &pull);
      ok = mongoc_collection_update_many (txn->coll[OUTBOX_LANES_COLL], &lq, &lu, &txn->opts, NULL, error);
   }
   if (ok && store_attempts_on (e->s)) {
      /* The records of the attempts these settle, in the same transaction. */
      store_attempt_docs_t recs = {0};
      for (size_t i = 0; i < e->n; i++)
         if (e->applied[i] && e->refs[i].attempt)
            store_attempt_docs_add (e->s, &recs, &e->refs[i].id, e->refs[i].event_id, e->refs[i].attempt, e->now);
      ok = store_attempt_docs_insert (e->s, txn->coll[OUTBOX_ATTEMPTS], &recs, &txn->opts, error);
      store_attempt_docs_free (&recs);
   }
   bson_destroy (&dq);
   bson_destroy (&du);
   bson_destroy (&lq);
   bson_destroy (&lu);
   return ok;
}

static bool
many_cb (store_txn_t *txn, void *ctx, bson_error_t *error)
{
   many_t *e = ctx;
   bool ok, any = false;

   for (size_t i = 0; i < e->n; i++)
      e->applied[i] = false;
   ok = many_fence (txn, e, error);
   for (size_t i = 0; ok && i < e->n; i++)
      any = any || e->applied[i];
   if (ok && any) {
      if (e->kind == STORE_MANY_EXTEND) {
         /* Every lane with a lease that holds, in one update. */
         bson_t uq = BSON_INITIALIZER;
         bson_t *lu = BCON_NEW ("$max", "{", OUTBOX_F_LEASE_EXPIRES_AT, BCON_DATE_TIME (e->now + e->lease_ms), "}");
         append_lane_ids (&uq, e, e->applied);
         ok = mongoc_collection_update_many (txn->coll[OUTBOX_LANES_COLL], &uq, lu, &txn->opts, NULL, error);
         bson_destroy (&uq);
         bson_destroy (lu);
      } else {
         ok = many_settle_writes (txn, e, error);
      }
   }
   if (!ok)
      for (size_t i = 0; i < e->n; i++)
         e->applied[i] = false;
   return ok;
}

static bool
many_run (store_t *s, many_t *e, bson_error_t *error)
{
   outbox_lease_t *leases;
   bool *valid, *applied = e->applied;
   mongoc_client_t *client;
   bool ok = true, any = false;

   e->s = s;
   for (size_t i = 0; i < e->n; i++)
      applied[i] = false;
   if (e->n == 0)
      return true;
   leases = bson_malloc0 (e->n * sizeof *leases);
   valid = bson_malloc0 (e->n * sizeof *valid);
   for (size_t i = 0; i < e->n; i++) {
      valid[i] = e->refs[i].lease && outbox_lease_parse (e->refs[i].lease, &leases[i]); /* refused without a call */
      any = any || valid[i];
   }
   e->leases = leases;
   e->valid = valid;
   if (any) {
      client = mongoc_client_pool_pop (s->pool);
      ok = store_with_txn (s, client, many_cb, e, error);
      mongoc_client_pool_push (s->pool, client);
   }
   if (ok) {
      pthread_mutex_lock (&s->mu);
      for (size_t i = 0; i < e->n; i++) {
         if (!applied[i])
            continue;
         if (e->kind == STORE_MANY_EXTEND)
            renewed (s, &e->refs[i].id, &leases[i], e->now + e->lease_ms);
         else
            store_issued_remove (s, &e->refs[i].id);
      }
      pthread_mutex_unlock (&s->mu);
   } else {
      for (size_t i = 0; i < e->n; i++)
         applied[i] = false;
   }
   bson_free (leases);
   bson_free (valid);
   return ok;
}

bool
store_extend_many (store_t *s, const store_ref_t *refs, size_t n, int64_t now, int64_t lease_ms, bool *applied,
                   bson_error_t *error)
{
   many_t e = {.kind = STORE_MANY_EXTEND, .refs = refs, .n = n, .applied = applied, .now = now, .lease_ms = lease_ms};

   return many_run (s, &e, error);
}

bool
store_settle_many (store_t *s,
                   store_many_kind_t kind,
                   const store_ref_t *refs,
                   size_t n,
                   int64_t now,
                   int64_t due_at,
                   const char *last_error,
                   bool *applied,
                   bson_error_t *error)
{
   many_t e = {.kind = kind, .refs = refs, .n = n, .applied = applied, .now = now, .due_at = due_at,
               .last_error = last_error};

   RELAYBUS_ASSERT (kind != STORE_MANY_EXTEND);
   return many_run (s, &e, error);
}

/* ------------------------------------------------------------ relinquish */

bool
store_relinquish (store_t *s, int64_t now, bson_error_t *error)
{
   return store_relinquish_except (s, now, NULL, error);
}

bool
store_relinquish_except (store_t *s, int64_t now, const bool *keep, bson_error_t *error)
{
   mongoc_client_t *client;
   mongoc_collection_t *lanes, *dels;
   store_lane_state_t held[OUTBOX_LANES];
   store_oids_t ids = {0};
   bson_t lq = BSON_INITIALIZER, arr, wopts = BSON_INITIALIZER;
   bson_t *u = NULL;
   mongoc_cursor_t *cur;
   const bson_t *doc;
   bson_error_t err;
   uint32_t k = 0;
   bool ok = true;
   size_t n = 0;

   (void) now;
   pthread_mutex_lock (&s->claim_mu);
   pthread_mutex_lock (&s->mu);
   memcpy (held, s->lanes, sizeof held);
   pthread_mutex_unlock (&s->mu);
   for (uint32_t i = 0; keep && i < OUTBOX_LANES; i++)
      if (keep[i])
         held[i].held = false; /* stays ours, untouched */
   /* Every lane held, in three commands whatever their number (one per
    * lane cost a consumer thread seconds for 256 lanes, while the other
    * consumers waited).  The writes are ordered so that no claim sees a
    * gap: first the claim generation of every delivery the lanes list
    * moves on (no attempt charged), while the lanes are still ours and
    * nobody else claims from them; only then are the lanes emptied and
    * handed back.  A claim of another worker after the hand-back
    * therefore always reads the new generation, and a failure between the
    * two leaves the lanes held, to be taken over (and charged) after their
    * lease.  Claims of this instance wait on claim_mu meanwhile. */
   BSON_APPEND_ARRAY_BEGIN (&lq, "$or", &arr);
   for (uint32_t i = 0; i < OUTBOX_LANES; i++) {
      char buf[16];
      const char *key;
      bson_t one;

      if (!held[i].held)
         continue;
      bson_uint32_to_string (k++, &key, buf, sizeof buf);
      BSON_APPEND_DOCUMENT_BEGIN (&arr, key, &one);
      BSON_APPEND_INT32 (&one, "_id", store_lane_doc (s, i));
      BSON_APPEND_INT64 (&one, OUTBOX_F_EPOCH, held[i].epoch);
      BSON_APPEND_UTF8 (&one, "owner", s->owner);
      bson_append_document_end (&arr, &one);
   }
   bson_append_array_end (&lq, &arr);
   if (k == 0) {
      bson_destroy (&lq);
      pthread_mutex_unlock (&s->claim_mu);
      log_debug ("store: handed back 0 lane(s)");
      return true;
   }
   /* Each command bounded (store_set_max_time_ms): a delivery a consumer's
    * open transaction wrote holds the $inc up until that transaction
    * ends; the lanes then stay held until their leases end. */
   store_append_max_time (s, &wopts, 0);
   client = mongoc_client_pool_pop (s->pool);
   lanes = store_coll (s, client, OUTBOX_LANES_COLL);
   dels = store_coll (s, client, OUTBOX_DELIVERIES);
   cur = mongoc_collection_find_with_opts (lanes, &lq, &wopts, NULL);
   while (mongoc_cursor_next (cur, &doc))
      store_oids_from_array (&ids, doc, OUTBOX_F_IN_FLIGHT);
   if (mongoc_cursor_error (cur, &err)) {
      store_set_error (error, STORE_ERROR_SERVER, "handing back the lanes: %s", err.message);
      ok = false;
   }
   mongoc_cursor_destroy (cur);
   if (ok && ids.n > 0) {
      bson_t dq = BSON_INITIALIZER;
      bson_t *du = BCON_NEW ("$inc", "{", OUTBOX_F_CLAIMS, BCON_INT32 (1), "}");
      store_append_oids_op (&dq, "_id", "$in", ids.v, ids.n);
      if (!store_bounded_write (s, dels, STORE_WRITE_UPDATE_MANY, &dq, du, 0, NULL, &err)) {
         store_set_error (error, STORE_ERROR_SERVER, "releasing the lanes' deliveries: %s", err.message);
         ok = false;
      }
      bson_destroy (&dq);
      bson_destroy (du);
   }
   if (ok) {
      u = BCON_NEW ("$set", "{", "owner", BCON_NULL, OUTBOX_F_LEASE_EXPIRES_AT, BCON_NULL, OUTBOX_F_IN_FLIGHT, "[", "]", "}");
      int64_t matched = 0;
      if (!store_bounded_write (s, lanes, STORE_WRITE_UPDATE_MANY, &lq, u, 0, &matched, &err)) {
         store_set_error (error, STORE_ERROR_SERVER, "handing back the lanes: %s", err.message);
         ok = false;
      } else {
         n = (size_t) matched;
      }
   }
   if (ok) {
      /* Handed back, or no longer ours (taken over after their lease). */
      pthread_mutex_lock (&s->mu);
      for (uint32_t i = 0; i < OUTBOX_LANES; i++)
         if (held[i].held && s->lanes[i].held && s->lanes[i].epoch == held[i].epoch) {
            s->lanes[i].held = false;
            store_issued_remove_lane (s, i);
         }
      pthread_mutex_unlock (&s->mu);
   }
   bson_destroy (u);
   store_oids_free (&ids);
   bson_destroy (&lq);
   bson_destroy (&wopts);
   mongoc_collection_destroy (lanes);
   mongoc_collection_destroy (dels);
   mongoc_client_pool_push (s->pool, client);
   pthread_mutex_unlock (&s->claim_mu);
   log_info ("store: handed back %zu lane(s)", n);
   return ok;
}
