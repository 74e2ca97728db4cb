/*
 * store/ops.c - the operator's actions and views (store/ops.h): requeue,
 * bury, replay, purge and scheduled retention, statistics, per-handler backlog,
 * lanes, the paginated listing and the setup check.
 *
 * Inputs from an admin request reach queries only as strings (or as
 * ObjectIds parsed from strings), never as documents, so they cannot become
 * query operators.  Purge deletes each batch of deliveries or history
 * records together with the events nothing references any more, in one
 * transaction, so a delivery never loses its event.  Nothing here changes
 * a lane's owner, lease or inFlight list: the bury only counts its write on
 * the lanes it read (see bury_ids_cb).
 */
#include "store/ops.h"
#include "store/store_private.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/assert.h"
#include "base/log.h"
#include "base/outbox.h"

/* --------------------------------------------------------------- requeue */

bool
store_requeue (store_t *s, const char *const *ids, size_t n, int64_t now, size_t *n_requeued, bson_error_t *error)
{
   store_oids_t oids = {0};
   bson_t q = BSON_INITIALIZER;
   bson_t *u;
   int64_t modified = 0;
   bool ok;

   *n_requeued = 0;
   store_oids_from_strings (&oids, ids, n);
   if (oids.n == 0)
      return true;
   store_append_oids_op (&q, "_id", "$in", oids.v, oids.n);
   BSON_APPEND_UTF8 (&q, "status", "dead");
   /* Attempts start over; the generation moves on so no earlier lease of it
    * can match.  Pending again with a lower sequence, it blocks the later
    * deliveries of its key that have not been claimed yet. */
   u = BCON_NEW ("$set", "{", "status", BCON_UTF8 ("pending"), "lane", BCON_UTF8 ("ready"), OUTBOX_F_DUE_AT,
                 BCON_DATE_TIME (now), OUTBOX_F_UPDATED_AT, BCON_DATE_TIME (now), OUTBOX_F_ATTEMPTS, BCON_INT32 (0), "}", "$inc",
                 "{", OUTBOX_F_CLAIMS, BCON_INT32 (1), "}");
   ok = store_write (s, OUTBOX_DELIVERIES, STORE_WRITE_UPDATE_MANY, &q, u, NULL, &modified, "requeue", error);
   *n_requeued = (size_t) modified;
   bson_destroy (u);
   bson_destroy (&q);
   store_oids_free (&oids);
   return ok;
}

/* ------------------------------------------------------------------ bury */

/* An operator bury in one transaction: read the deliveries and the lanes,
 * bury only what no lane lists, and write each lane it read.  The lane
 * write (a counter, `operatorWrites`) is what makes the bury conditional on
 * the state it read: a claim that records one of the deliveries on its lane
 * after the transaction's snapshot conflicts with it, the transaction
 * restarts and then sees the delivery running. */
typedef struct {
   store_t *s;
   mongoc_client_t *client;
   const store_oids_t *oids;
   int64_t now;
   const char *reason;
   size_t n_buried;
   store_attempt_docs_t recs; /* a record per pending delivery read (attempt history) */
} bury_ids_t;

static bool
bury_ids_cb (store_txn_t *txn, void *ctx, bson_error_t *error)
{
   bury_ids_t *t = ctx;
   store_oids_t pending = {0}, keep = {0};
   bson_t lane_ids = BSON_INITIALIZER;
   uint32_t n_lane_ids = 0;
   mongoc_cursor_t *cur;
   const bson_t *doc;
   bson_t dq = BSON_INITIALIZER, lq = BSON_INITIALIZER, q = BSON_INITIALIZER, reply;
   bson_t *fopts = NULL, *u = NULL, *lu = NULL;
   char *reason = NULL;
   bool ok = true;

   t->n_buried = 0;
   store_attempt_docs_free (&t->recs);
   store_append_oids_op (&dq, "_id", "$in", t->oids->v, t->oids->n);
   BSON_APPEND_UTF8 (&dq, "status", "pending");
   fopts = BCON_NEW ("projection", "{", OUTBOX_F_LANE_ID, BCON_INT32 (1), "handler", BCON_INT32 (1), OUTBOX_F_EVENT_ID, BCON_INT32 (1),
                     OUTBOX_F_ATTEMPTS, BCON_INT32 (1), "}");
   bson_concat (fopts, &txn->opts);
   cur = mongoc_collection_find_with_opts (txn->coll[OUTBOX_DELIVERIES], &dq, fopts, NULL);
   while (mongoc_cursor_next (cur, &doc)) {
      bson_iter_t it;
      int64_t lane = store_iter_int64 (doc, OUTBOX_F_LANE_ID);
      const char *handler = store_iter_utf8 (doc, "handler");
      if (!bson_iter_init_find (&it, doc, "_id") || !BSON_ITER_HOLDS_OID (&it))
         continue;
      store_oids_push (&pending, bson_iter_oid (&it));
      if (store_attempts_on (t->s)) {
         /* Its record, written if it is buried: the attempt it would have
          * had next, ended by the operator. */
         store_attempt_t a = {.handler = handler,
                              .outcome = OUTBOX_ATTEMPT_BURIED,
                              .attempt = (int32_t) store_iter_int64 (doc, OUTBOX_F_ATTEMPTS) + 1,
                              .duration_ms = -1,
                              .error = t->reason};
         bson_oid_init (&a.id, NULL);
         store_attempt_docs_add (t->s, &t->recs, bson_iter_oid (&it), store_iter_utf8 (doc, OUTBOX_F_EVENT_ID), &a, t->now);
      }
      if (lane >= 0 && lane < OUTBOX_LANES) {
         /* Its lane in the spaces that may run it: its handler's (a
          * dispatched handler), the pull space (a pull handler), and the
          * dispatch space (a proxy from before handler spaces). */
         uint32_t spaces[3] = {OUTBOX_LANE_SPACE_DISPATCH, OUTBOX_LANE_SPACE_PULL, 0};
         size_t n_spaces = 2;
         if (handler)
            spaces[n_spaces++] = outbox_lane_space_of (handler);
         for (size_t k = 0; k < n_spaces; k++) {
            char buf[16];
            const char *key;
            bson_uint32_to_string (n_lane_ids++, &key, buf, sizeof buf);
            BSON_APPEND_INT32 (&lane_ids, key, outbox_lane_doc_id (spaces[k], (uint32_t) lane));
         }
      }
   }
   if (mongoc_cursor_error (cur, error))
      ok = false;
   mongoc_cursor_destroy (cur);
   if (!ok || pending.n == 0)
      goto done;

   /* A delivery a lane lists in flight is running: its worker settles it.
    * Its lane in every space that may run it: which kind of claimer runs
    * a delivery is its handler's kind, which this instance need not know
    * (a handler of another proxy of the fleet). */
   {
      bson_t in;
      BSON_APPEND_DOCUMENT_BEGIN (&lq, "_id", &in);
      BSON_APPEND_ARRAY (&in, "$in", &lane_ids);
      bson_append_document_end (&lq, &in);
   }
   cur = mongoc_collection_find_with_opts (txn->coll[OUTBOX_LANES_COLL], &lq, &txn->opts, NULL);
   {
      store_oids_t running = {0};
      while (mongoc_cursor_next (cur, &doc))
         store_oids_from_array (&running, doc, OUTBOX_F_IN_FLIGHT);
      if (mongoc_cursor_error (cur, error))
         ok = false;
      for (size_t i = 0; ok && i < pending.n; i++)
         if (!store_oids_has (&running, &pending.v[i]))
            store_oids_push (&keep, &pending.v[i]);
      store_oids_free (&running);
   }
   mongoc_cursor_destroy (cur);
   if (!ok || keep.n == 0)
      goto done;

   lu = BCON_NEW ("$inc", "{", OUTBOX_F_OPERATOR_WRITES, BCON_INT64 (1), "}");
   if (!mongoc_collection_update_many (txn->coll[OUTBOX_LANES_COLL], &lq, lu, &txn->opts, NULL, error)) {
      ok = false;
      goto done;
   }
   store_append_oids_op (&q, "_id", "$in", keep.v, keep.n);
   BSON_APPEND_UTF8 (&q, "status", "pending");
   /* Masked as every lastError (store/complete.c): a reason may quote a
    * broker's error. */
   reason = config_mask (NULL, t->reason);
   u = BCON_NEW ("$set", "{", "status", BCON_UTF8 ("dead"), OUTBOX_F_UPDATED_AT, BCON_DATE_TIME (t->now), OUTBOX_F_LAST_ERROR,
                 BCON_UTF8 (reason), "}", "$unset", "{", "lane", BCON_UTF8 (""), "}", "$inc", "{", OUTBOX_F_CLAIMS,
                 BCON_INT32 (1), "}");
   if (!mongoc_collection_update_many (txn->coll[OUTBOX_DELIVERIES], &q, u, &txn->opts, &reply, error))
      ok = false;
   else
      t->n_buried = (size_t) store_iter_int64 (&reply, "modifiedCount");
   bson_destroy (&reply);
   if (ok && t->recs.n > 0) {
      /* The records of the ones buried (those no lane lists), in the
       * same transaction. */
      store_attempt_docs_t buried = {0};
      for (size_t i = 0; i < t->recs.n; i++) {
         bson_iter_t d;
         if (bson_iter_init_find (&d, t->recs.v[i], OUTBOX_F_DELIVERY_ID) && BSON_ITER_HOLDS_OID (&d) &&
             store_oids_has (&keep, bson_iter_oid (&d))) {
            if (buried.n == buried.cap) {
               buried.cap = buried.cap ? buried.cap * 2 : 8;
               buried.v = bson_realloc (buried.v, buried.cap * sizeof *buried.v);
            }
            buried.v[buried.n++] = t->recs.v[i];
         }
      }
      ok = store_attempt_docs_insert (t->s, txn->coll[OUTBOX_ATTEMPTS], &buried, &txn->opts, error);
      bson_free (buried.v); /* the documents are t->recs' */
   }

done:
   bson_free (reason);
   bson_destroy (u);
   bson_destroy (lu);
   bson_destroy (fopts);
   bson_destroy (&dq);
   bson_destroy (&lq);
   bson_destroy (&lane_ids);
   bson_destroy (&q);
   store_oids_free (&pending);
   store_oids_free (&keep);
   return ok;
}

bool
store_bury_ids (store_t *s,
                const char *const *ids,
                size_t n,
                int64_t now,
                const char *reason,
                size_t *n_buried,
                bson_error_t *error)
{
   store_oids_t oids = {0};
   bury_ids_t t = {0};
   bson_error_t err;
   bool ok;

   *n_buried = 0;
   store_oids_from_strings (&oids, ids, n);
   if (oids.n == 0)
      return true;
   t.s = s;
   t.client = mongoc_client_pool_pop (s->pool);
   t.oids = &oids;
   t.now = now;
   t.reason = reason ? reason : "";
   ok = store_with_txn (s, t.client, bury_ids_cb, &t, &err);
   store_attempt_docs_free (&t.recs);
   if (ok)
      *n_buried = t.n_buried;
   else
      store_set_error (error, STORE_ERROR_SERVER, "bury: %s", err.message);
   mongoc_client_pool_push (s->pool, t.client);
   store_oids_free (&oids);
   return ok;
}

/* ---------------------------------------------------------------- replay */

/* Events per transaction of a replay: each batch reads its deliveries,
 * moves its keys' counters and inserts, well inside a transaction's
 * limits. */
#define REPLAY_BATCH 500

/* One matched event of a replay, read from the events collection. */
typedef struct {
   char *id;
   char *type;
   char *key;        /* NULL: no key */
   int64_t sequence; /* the event's own, for the order within its key */
   size_t order;     /* position in (createdAt, _id) order: unkeyed ties */
   int64_t new_seq;  /* this attempt's sequence; 0 when skipped */
} replay_event_t;

typedef struct {
   store_t *s;
   const store_replay_opts_t *o;
   replay_event_t *v;
   size_t n;
   size_t from, to; /* the batch */
   size_t queued, skipped;
} replay_t;

/* Keyed events first, by key then the key's sequence; the unkeyed after,
 * in creation order. */
static int
replay_cmp (const void *a, const void *b)
{
   const replay_event_t *x = a, *y = b;
   int c;

   if (!x->key != !y->key)
      return x->key ? -1 : 1;
   if (x->key && (c = strcmp (x->key, y->key)) != 0)
      return c;
   if (x->key && x->sequence != y->sequence)
      return x->sequence < y->sequence ? -1 : 1;
   return x->order < y->order ? -1 : x->order > y->order;
}

static void
replay_free (replay_t *r)
{
   for (size_t i = 0; i < r->n; i++) {
      bson_free (r->v[i].id);
      bson_free (r->v[i].type);
      bson_free (r->v[i].key);
   }
   bson_free (r->v);
}

/* Reads the matching events of the window, at most max_events (one more
 * is an error, nothing written). */
static bool
replay_read (replay_t *r, mongoc_client_t *client, bson_error_t *error)
{
   mongoc_collection_t *coll = store_coll (r->s, client, OUTBOX_EVENTS);
   bson_t *q, *opts;
   mongoc_cursor_t *cur;
   const bson_t *doc;
   size_t cap = 0, seen = 0;
   bool ok = true;

   q = BCON_NEW (OUTBOX_F_CREATED_AT, "{", "$gte", BCON_DATE_TIME (r->o->since), "$lt", BCON_DATE_TIME (r->o->until), "}");
   opts = BCON_NEW ("projection", "{", "type", BCON_INT32 (1), "key", BCON_INT32 (1), "sequence", BCON_INT32 (1), "}",
                    "sort", "{", OUTBOX_F_CREATED_AT, BCON_INT32 (1), "_id", BCON_INT32 (1), "}");
   cur = mongoc_collection_find_with_opts (coll, q, opts, NULL);
   while (mongoc_cursor_next (cur, &doc)) {
      const char *id = store_iter_utf8 (doc, "_id"), *type = store_iter_utf8 (doc, "type");
      const char *key = store_iter_utf8 (doc, "key");
      replay_event_t *e;

      seen++;
      if (!id || !type || !config_patterns_match (r->o->patterns, r->o->n_patterns, type))
         continue;
      if (r->n == r->o->max_events) {
         store_set_error (error,
                          STORE_ERROR_INVALID,
                          "the window holds more than %zu events of handler %s: replay a shorter window",
                          r->o->max_events,
                          r->o->handler);
         ok = false;
         break;
      }
      if (r->n == cap) {
         cap = cap ? cap * 2 : 64;
         r->v = bson_realloc (r->v, cap * sizeof *r->v);
      }
      e = &r->v[r->n++];
      e->id = bson_strdup (id);
      e->type = bson_strdup (type);
      e->key = key ? bson_strdup (key) : NULL;
      e->sequence = key ? store_iter_int64 (doc, "sequence") : 0;
      e->order = seen;
      e->new_seq = 0;
   }
   if (ok && mongoc_cursor_error (cur, error))
      ok = false;
   mongoc_cursor_destroy (cur);
   bson_destroy (opts);
   bson_destroy (q);
   mongoc_collection_destroy (coll);
   return ok;
}

/* Marks (new_seq -1) the batch's events that still have a delivery for
 * the handler: the unique (eventId, handler) index holds one. */
static bool
replay_mark_existing (replay_t *r, store_txn_t *txn, bson_error_t *error)
{
   bson_t q = BSON_INITIALIZER, in;
   bson_t *opts;
   mongoc_cursor_t *cur;
   const bson_t *doc;
   char idx[16];
   const char *k;
   bool ok = true;

   BSON_APPEND_DOCUMENT_BEGIN (&q, OUTBOX_F_EVENT_ID, &in);
   {
      bson_t arr;
      bson_append_array_begin (&in, "$in", -1, &arr);
      for (size_t i = r->from; i < r->to; i++) {
         bson_uint32_to_string ((uint32_t) (i - r->from), &k, idx, sizeof idx);
         bson_append_utf8 (&arr, k, -1, r->v[i].id, -1);
      }
      bson_append_array_end (&in, &arr);
   }
   bson_append_document_end (&q, &in);
   BSON_APPEND_UTF8 (&q, "handler", r->o->handler);
   opts = BCON_NEW ("projection", "{", OUTBOX_F_EVENT_ID, BCON_INT32 (1), "}");
   bson_concat (opts, &txn->opts);
   cur = mongoc_collection_find_with_opts (txn->coll[OUTBOX_DELIVERIES], &q, opts, NULL);
   while (mongoc_cursor_next (cur, &doc)) {
      const char *id = store_iter_utf8 (doc, OUTBOX_F_EVENT_ID);
      for (size_t i = r->from; id && i < r->to; i++)
         if (strcmp (r->v[i].id, id) == 0)
            r->v[i].new_seq = -1;
   }
   if (mongoc_cursor_error (cur, error))
      ok = false;
   mongoc_cursor_destroy (cur);
   bson_destroy (opts);
   bson_destroy (&q);
   return ok;
}

/* Takes `count` sequences of `key` in the transaction: *last is the
 * highest.  The same counter publishing increments, so a publish of the
 * key conflicts with the replay until it commits, and the other way. */
static bool
replay_take_sequences (store_txn_t *txn, const char *key, int64_t count, int64_t *last, bson_error_t *error)
{
   bson_t *q = BCON_NEW ("_id", BCON_UTF8 (key));
   bson_t *u = BCON_NEW ("$inc", "{", "value", BCON_INT64 (count), "}");
   bson_t *opts = BCON_NEW ("upsert", BCON_BOOL (true));
   mongoc_cursor_t *cur = NULL;
   const bson_t *doc;
   bool ok;

   bson_concat (opts, &txn->opts);
   ok = mongoc_collection_update_one (txn->coll[OUTBOX_KEY_SEQUENCES], q, u, opts, NULL, error);
   if (!ok)
      goto done;
   cur = mongoc_collection_find_with_opts (txn->coll[OUTBOX_KEY_SEQUENCES], q, &txn->opts, NULL);
   ok = mongoc_cursor_next (cur, &doc);
   if (ok)
      *last = store_iter_int64 (doc, "value");
   else if (!mongoc_cursor_error (cur, error))
      store_set_error (error, STORE_ERROR_SERVER, "key_sequences lost key %s in its transaction", key);
done:
   mongoc_cursor_destroy (cur);
   bson_destroy (opts);
   bson_destroy (u);
   bson_destroy (q);
   return ok;
}

static void
replay_append_delivery (const replay_t *r, const replay_event_t *e, bson_t *docs, uint32_t n)
{
   bson_t d;
   bson_oid_t oid;
   char idx[16];
   const char *k;

   bson_uint32_to_string (n, &k, idx, sizeof idx);
   BSON_APPEND_DOCUMENT_BEGIN (docs, k, &d);
   bson_oid_init (&oid, NULL);
   BSON_APPEND_OID (&d, "_id", &oid);
   BSON_APPEND_UTF8 (&d, OUTBOX_F_EVENT_ID, e->id);
   BSON_APPEND_UTF8 (&d, "handler", r->o->handler);
   BSON_APPEND_UTF8 (&d, OUTBOX_F_EVENT_TYPE, e->type);
   if (e->key) {
      BSON_APPEND_UTF8 (&d, "key", e->key);
      BSON_APPEND_INT64 (&d, "sequence", e->new_seq);
   }
   BSON_APPEND_INT32 (&d, OUTBOX_F_LANE_ID, (int32_t) outbox_lane_id (e->key, e->id));
   BSON_APPEND_UTF8 (&d, "lane", "ready");
   BSON_APPEND_UTF8 (&d, "status", "pending");
   BSON_APPEND_INT32 (&d, OUTBOX_F_ATTEMPTS, 0);
   BSON_APPEND_INT32 (&d, OUTBOX_F_CLAIMS, 0);
   BSON_APPEND_DATE_TIME (&d, OUTBOX_F_DUE_AT, r->o->now);
   BSON_APPEND_DATE_TIME (&d, OUTBOX_F_CREATED_AT, r->o->now);
   bson_append_document_end (docs, &d);
}

/* One batch in a transaction.  Runs again from the start after a write
 * conflict, so everything it decides is decided anew. */
static bool
replay_cb (store_txn_t *txn, void *ctx, bson_error_t *error)
{
   replay_t *r = ctx;
   bson_t cmd = BSON_INITIALIZER, docs, reply;
   uint32_t n_docs = 0;
   bool ok;

   r->queued = r->skipped = 0;
   for (size_t i = r->from; i < r->to; i++)
      r->v[i].new_seq = 0;
   if (!replay_mark_existing (r, txn, error)) {
      ok = false;
      goto done;
   }
   /* The batch is sorted by key: each run of one key takes its sequences
    * at once, handed out in the events' own order. */
   for (size_t i = r->from; i < r->to;) {
      size_t j = i;
      int64_t count = 0, last = 0;

      if (!r->v[i].key) {
         i++;
         continue;
      }
      for (; j < r->to && r->v[j].key && strcmp (r->v[j].key, r->v[i].key) == 0; j++)
         if (r->v[j].new_seq == 0)
            count++;
      if (count > 0 && !replay_take_sequences (txn, r->v[i].key, count, &last, error)) {
         ok = false;
         goto done;
      }
      for (size_t m = i; m < j; m++)
         if (r->v[m].new_seq == 0)
            r->v[m].new_seq = last - --count;
      i = j;
   }
   BSON_APPEND_UTF8 (&cmd, "insert", mongoc_collection_get_name (txn->coll[OUTBOX_DELIVERIES]));
   BSON_APPEND_BOOL (&cmd, "ordered", true);
   BSON_APPEND_ARRAY_BEGIN (&cmd, "documents", &docs);
   for (size_t i = r->from; i < r->to; i++) {
      if (r->v[i].new_seq < 0) {
         r->skipped++;
         continue;
      }
      replay_append_delivery (r, &r->v[i], &docs, n_docs++);
   }
   bson_append_array_end (&cmd, &docs);
   ok = true;
   if (n_docs > 0) {
      ok = mongoc_collection_write_command_with_opts (txn->coll[OUTBOX_DELIVERIES], &cmd, &txn->opts, &reply, error);
      if (ok && store_iter_int64 (&reply, "n") != (int64_t) n_docs) {
         store_set_error (error, STORE_ERROR_SERVER, "replay inserted %" PRId64 " of %u deliveries", store_iter_int64 (&reply, "n"), n_docs);
         ok = false;
      }
      bson_destroy (&reply);
   }
   if (ok)
      r->queued = n_docs;
done:
   bson_destroy (&cmd);
   return ok;
}

bool
store_replay (store_t *s, const store_replay_opts_t *o, store_replay_result_t *res, bson_error_t *error)
{
   replay_t r = {0};
   mongoc_client_t *client;
   bson_error_t err;
   bool ok;

   memset (res, 0, sizeof *res);
   r.s = s;
   r.o = o;
   client = mongoc_client_pool_pop (s->pool);
   ok = replay_read (&r, client, error);
   if (!ok)
      goto done;
   res->matched = r.n;
   if (r.n > 0)
      qsort (r.v, r.n, sizeof *r.v, replay_cmp);
   /* Batch after batch in key order, so a key's later batch takes higher
    * sequences.  What a failed batch leaves is its predecessors' work,
    * counted in the result. */
   for (r.from = 0; ok && r.from < r.n; r.from = r.to) {
      r.to = r.from + REPLAY_BATCH < r.n ? r.from + REPLAY_BATCH : r.n;
      ok = store_with_txn (s, client, replay_cb, &r, &err);
      if (ok) {
         res->queued += r.queued;
         res->skipped += r.skipped;
      } else {
         store_set_error (error, STORE_ERROR_SERVER, "replay: %s (after %zu queued)", err.message, res->queued);
      }
   }
done:
   mongoc_client_pool_push (s->pool, client);
   replay_free (&r);
   return ok;
}

/* ----------------------------------------------------------------- purge */

/* A growable list of strings. */
typedef struct {
   char **v;
   size_t n, cap;
} strs_t;

static void
strs_push (strs_t *l, const char *str)
{
   for (size_t i = 0; i < l->n; i++)
      if (!strcmp (l->v[i], str))
         return;
   if (l->n == l->cap) {
      l->cap = l->cap ? l->cap * 2 : 64;
      l->v = bson_realloc (l->v, l->cap * sizeof *l->v);
   }
   l->v[l->n++] = bson_strdup (str);
}

static bool
strs_has (const strs_t *l, const char *str)
{
   for (size_t i = 0; i < l->n; i++)
      if (!strcmp (l->v[i], str))
         return true;
   return false;
}

static void
strs_free (strs_t *l)
{
   for (size_t i = 0; i < l->n; i++)
      bson_free (l->v[i]);
   bson_free (l->v);
   memset (l, 0, sizeof *l);
}

static void
append_strs_in (bson_t *q, const char *field, const strs_t *l)
{
   store_append_strs_in (q, field, (const char *const *) l->v, l->n);
}

typedef struct {
   store_t *s;
   mongoc_client_t *client;
   const store_purge_opts_t *o;
   int64_t min_cutoff;
   /* this batch */
   outbox_collection_t from; /* OUTBOX_DELIVERIES, OUTBOX_COMPLETED or OUTBOX_EVENTS */
   store_oids_t ids;
   strs_t event_ids;
   int64_t deleted, events_deleted;
} purge_t;

/* Collects into `into` the values of `field` of the documents matching
 * {field: {$in: events}} in `which`. */
static bool
referenced (purge_t *p,
            mongoc_collection_t *coll,
            const bson_t *opts_in,
            const char *field,
            strs_t *into,
            bson_error_t *error)
{
   bson_t q = BSON_INITIALIZER;
   bson_t *opts = bson_copy (opts_in);
   mongoc_cursor_t *cur;
   const bson_t *doc;
   bool ok = true;

   append_strs_in (&q, field, &p->event_ids);
   cur = mongoc_collection_find_with_opts (coll, &q, opts, NULL);
   while (mongoc_cursor_next (cur, &doc)) {
      const char *v = store_iter_utf8 (doc, field);
      if (v)
         strs_push (into, v);
   }
   if (mongoc_cursor_error (cur, error))
      ok = false;
   mongoc_cursor_destroy (cur);
   bson_destroy (&q);
   bson_destroy (opts);
   return ok;
}

/* With attempt history an event's completion time may still wait to be
 * written (a second's completions go together), or a crash lost it: the
 * events of `gone` that have a record of a succeeded attempt are judged by
 * its latest end instead, as if it were their completedAt, and stay
 * unless completed_before passed it. */
static bool
purge_keep_recorded (purge_t *p, store_txn_t *txn, strs_t *gone, bson_error_t *error)
{
   bson_t q = BSON_INITIALIZER;
   bson_t *opts = BCON_NEW ("projection", "{", OUTBOX_F_EVENT_ID, BCON_INT32 (1), OUTBOX_F_ENDED_AT, BCON_INT32 (1), "}");
   strs_t keep = {0};
   mongoc_cursor_t *cur;
   const bson_t *doc;
   size_t k = 0;
   bool ok = true;

   bson_concat (opts, &txn->opts);
   append_strs_in (&q, OUTBOX_F_EVENT_ID, gone);
   BSON_APPEND_UTF8 (&q, OUTBOX_F_OUTCOME, outbox_attempt_outcome_name (OUTBOX_ATTEMPT_SUCCEEDED));
   cur = mongoc_collection_find_with_opts (txn->coll[OUTBOX_ATTEMPTS], &q, opts, NULL);
   while (mongoc_cursor_next (cur, &doc)) {
      const char *id = store_iter_utf8 (doc, OUTBOX_F_EVENT_ID);
      if (id && !(p->o->completed_before > 0 && store_iter_date (doc, OUTBOX_F_ENDED_AT) < p->o->completed_before))
         strs_push (&keep, id);
   }
   if (mongoc_cursor_error (cur, error))
      ok = false;
   mongoc_cursor_destroy (cur);
   for (size_t i = 0; ok && i < gone->n; i++) {
      if (strs_has (&keep, gone->v[i]))
         bson_free (gone->v[i]);
      else
         gone->v[k++] = gone->v[i];
   }
   if (ok)
      gone->n = k;
   strs_free (&keep);
   bson_destroy (opts);
   bson_destroy (&q);
   return ok;
}

/* Deletes the batch (deliveries or history records), then the events of
 * p->event_ids that nothing references any more: an event that had a
 * completion is kept until completed_before passes its completedAt; one
 * that never had one goes once created before the earliest cutoff. */
static bool
purge_cb (store_txn_t *txn, void *ctx, bson_error_t *error)
{
   purge_t *p = ctx;
   mongoc_collection_t *hist = p->s->completion_history ? txn->coll[OUTBOX_COMPLETED] : NULL;
   bson_t q = BSON_INITIALIZER, eq = BSON_INITIALIZER, reply;
   strs_t refs = {0}, gone = {0};
   mongoc_cursor_t *cur;
   const bson_t *doc;
   bool ok = true;

   p->deleted = p->events_deleted = 0;
   if (p->from != OUTBOX_EVENTS && p->ids.n > 0) {
      store_append_oids_op (&q, "_id", "$in", p->ids.v, p->ids.n);
      if (p->from == OUTBOX_DELIVERIES)
         BSON_APPEND_UTF8 (&q, "status", "dead");
      ok = mongoc_collection_delete_many (txn->coll[p->from], &q, &txn->opts, &reply, error);
      if (ok)
         p->deleted = store_iter_int64 (&reply, "deletedCount");
      bson_destroy (&reply);
   }
   if (!ok || p->event_ids.n == 0)
      goto done;
   {
      bson_t *proj = BCON_NEW ("projection", "{", OUTBOX_F_EVENT_ID, BCON_INT32 (1), "}");
      bson_concat (proj, &txn->opts);
      ok = referenced (p, txn->coll[OUTBOX_DELIVERIES], proj, OUTBOX_F_EVENT_ID, &refs, error) &&
           (!hist || referenced (p, hist, proj, OUTBOX_F_EVENT_ID, &refs, error));
      bson_destroy (proj);
   }
   if (!ok)
      goto done;
   append_strs_in (&eq, "_id", &p->event_ids);
   cur = mongoc_collection_find_with_opts (txn->coll[OUTBOX_EVENTS], &eq, &txn->opts, NULL);
   while (mongoc_cursor_next (cur, &doc)) {
      const char *id = store_iter_utf8 (doc, "_id");
      int64_t completed = store_iter_date (doc, OUTBOX_F_COMPLETED_AT);
      bool del;
      if (!id || strs_has (&refs, id))
         continue;
      if (completed)
         del = p->o->completed_before > 0 && completed < p->o->completed_before;
      else
         del = store_iter_date (doc, OUTBOX_F_CREATED_AT) < p->min_cutoff;
      if (del)
         strs_push (&gone, id);
   }
   if (mongoc_cursor_error (cur, error))
      ok = false;
   mongoc_cursor_destroy (cur);
   if (ok && gone.n > 0 && store_attempts_on (p->s))
      ok = purge_keep_recorded (p, txn, &gone, error);
   if (ok && gone.n > 0) {
      bson_t dq = BSON_INITIALIZER;
      append_strs_in (&dq, "_id", &gone);
      ok = mongoc_collection_delete_many (txn->coll[OUTBOX_EVENTS], &dq, &txn->opts, &reply, error);
      if (ok)
         p->events_deleted = store_iter_int64 (&reply, "deletedCount");
      bson_destroy (&reply);
      bson_destroy (&dq);
   }

done:
   strs_free (&refs);
   strs_free (&gone);
   bson_destroy (&q);
   bson_destroy (&eq);
   return ok;
}

/* Reads the next batch of `coll` matching q into p (ids and event ids). */
static bool
next_batch (purge_t *p, mongoc_collection_t *coll, const bson_t *q, const char *event_field, bson_error_t *error)
{
   bson_t *opts = BCON_NEW ("limit", BCON_INT64 (p->s->purge_batch), "projection", "{", event_field, BCON_INT32 (1), "}");
   mongoc_cursor_t *cur = mongoc_collection_find_with_opts (coll, q, opts, NULL);
   const bson_t *doc;
   bool ok = true;

   store_oids_free (&p->ids);
   strs_free (&p->event_ids);
   while (mongoc_cursor_next (cur, &doc)) {
      bson_iter_t it;
      const char *ev = store_iter_utf8 (doc, event_field);
      if (bson_iter_init_find (&it, doc, "_id") && BSON_ITER_HOLDS_OID (&it))
         store_oids_push (&p->ids, bson_iter_oid (&it));
      if (ev)
         strs_push (&p->event_ids, ev);
   }
   if (!store_cursor_end (cur, error, "purge"))
      ok = false;
   bson_destroy (opts);
   return ok;
}

/* The phases of a purge, in this order. */
enum {
   PURGE_PHASE_DEAD,    /* dead deliveries updated before dead_before */
   PURGE_PHASE_HISTORY, /* completion history records completed before completed_before */
   PURGE_PHASE_EVENTS,  /* events nothing references any more */
};

/* The purge lease: the lanes collection's document _id -1, holding
 * purgeOwner and purgeLeaseExpiresAt (store_doc_lease). */
#define STORE_PURGE_LEASE_ID (-1)

/* One batch of the events phase: events created before `cutoff`, after
 * the keyset position (*after_created, *after_id) in (createdAt, _id)
 * order, which moves on to the last one read; purge_cb deletes those
 * nothing references whose retention has passed.  *full: the batch was
 * full, so more may follow. */
static bool
purge_events_batch (purge_t *p, int64_t cutoff, int64_t *after_created, char **after_id, bool *full, bson_error_t *error)
{
   mongoc_collection_t *coll = store_coll (p->s, p->client, OUTBOX_EVENTS);
   bson_t *opts = BCON_NEW ("sort", "{", OUTBOX_F_CREATED_AT, BCON_INT32 (1), "_id", BCON_INT32 (1), "}", "projection", "{",
                            "_id", BCON_INT32 (1), OUTBOX_F_CREATED_AT, BCON_INT32 (1), "}", "limit",
                            BCON_INT64 (p->s->purge_batch));
   bson_t q = BSON_INITIALIZER, sub;
   mongoc_cursor_t *cur;
   const bson_t *doc;
   bool ok;

   *full = false;
   p->events_deleted = 0;
   BSON_APPEND_DOCUMENT_BEGIN (&q, OUTBOX_F_CREATED_AT, &sub);
   BSON_APPEND_DATE_TIME (&sub, "$lt", cutoff);
   bson_append_document_end (&q, &sub);
   if (*after_id) {
      bson_value_t id = {.value_type = BSON_TYPE_UTF8};
      id.value.v_utf8.str = *after_id;
      id.value.v_utf8.len = (uint32_t) strlen (*after_id);
      store_append_after_key (&q, OUTBOX_F_CREATED_AT, *after_created, &id);
   }
   strs_free (&p->event_ids);
   store_oids_free (&p->ids);
   cur = mongoc_collection_find_with_opts (coll, &q, opts, NULL);
   while (mongoc_cursor_next (cur, &doc)) {
      const char *id = store_iter_utf8 (doc, "_id");
      if (!id)
         continue;
      strs_push (&p->event_ids, id);
      bson_free (*after_id);
      *after_id = bson_strdup (id);
      *after_created = store_iter_date (doc, "createdAt");
   }
   ok = store_cursor_end (cur, error, "purge");
   if (ok && p->event_ids.n > 0) {
      p->from = OUTBOX_EVENTS;
      ok = store_with_txn (p->s, p->client, purge_cb, p, error);
      *full = ok && p->event_ids.n >= (size_t) p->s->purge_batch;
   }
   bson_destroy (&q);
   bson_destroy (opts);
   mongoc_collection_destroy (coll);
   return ok;
}

/* One batch of dead deliveries or completion history records matching q,
 * with the events only they referenced.  *full: the batch was full and
 * removed something, so more may follow. */
static bool
purge_records_batch (purge_t *p, outbox_collection_t from, const bson_t *q, bool *full, bson_error_t *error)
{
   mongoc_collection_t *coll = store_coll (p->s, p->client, from);
   bool ok;

   *full = false;
   p->from = from;
   p->deleted = p->events_deleted = 0;
   ok = next_batch (p, coll, q, OUTBOX_F_EVENT_ID, error);
   if (ok && p->ids.n > 0) {
      ok = store_with_txn (p->s, p->client, purge_cb, p, error);
      *full = ok && p->deleted > 0 && p->ids.n >= (size_t) p->s->purge_batch;
   }
   mongoc_collection_destroy (coll);
   return ok;
}

/* One batch of `phase`, a transaction; what it removed is added to *r.
 * The events phase reads events created before `events_cutoff` from the
 * keyset position (*after_created, *after_id) on.  A phase with nothing
 * to do (its cutoff 0, or history without completion history) reports
 * *full false at once. */
static bool
purge_phase_batch (purge_t *p,
                   int phase,
                   int64_t events_cutoff,
                   int64_t *after_created,
                   char **after_id,
                   store_purge_step_result_t *r,
                   bool *full,
                   bson_error_t *error)
{
   const store_purge_opts_t *o = p->o;
   bson_t *q = NULL;
   bool ok = true;

   *full = false;
   if (phase == PURGE_PHASE_EVENTS) {
      ok = purge_events_batch (p, events_cutoff, after_created, after_id, full, error);
      r->events += p->events_deleted;
      return ok;
   }
   if (phase == PURGE_PHASE_DEAD && o->dead_before > 0)
      q = BCON_NEW ("status", BCON_UTF8 ("dead"), OUTBOX_F_UPDATED_AT, "{", "$lt", BCON_DATE_TIME (o->dead_before), "}");
   else if (phase == PURGE_PHASE_HISTORY && o->completed_before > 0 && p->s->completion_history)
      q = BCON_NEW (OUTBOX_F_COMPLETED_AT, "{", "$lt", BCON_DATE_TIME (o->completed_before), "}");
   if (!q)
      return true;
   ok = purge_records_batch (p, phase == PURGE_PHASE_DEAD ? OUTBOX_DELIVERIES : OUTBOX_COMPLETED, q, full, error);
   if (phase == PURGE_PHASE_DEAD)
      r->dead += p->deleted;
   else
      r->completed += p->deleted;
   r->events += p->events_deleted;
   bson_destroy (q);
   return ok;
}

/* A purge of `s` with the cutoffs of `o`: false when there is nothing to
 * purge (both cutoffs 0).  The earliest cutoff decides which events that
 * never had a completion go. */
static bool
purge_init (purge_t *p, store_t *s, const store_purge_opts_t *o)
{
   memset (p, 0, sizeof *p);
   p->s = s;
   p->o = o;
   p->min_cutoff = o->dead_before;
   if (o->completed_before > 0 && (p->min_cutoff == 0 || o->completed_before < p->min_cutoff))
      p->min_cutoff = o->completed_before;
   return p->min_cutoff != 0;
}

static void
purge_finish (purge_t *p)
{
   store_oids_free (&p->ids);
   strs_free (&p->event_ids);
   if (p->client)
      mongoc_client_pool_push (p->s->pool, p->client);
}

bool
store_purge (store_t *s, const store_purge_opts_t *o, store_purge_result_t *r, bson_error_t *error)
{
   purge_t p;
   int64_t after_created = 0;
   char *after_id = NULL;
   bool ok = true, full;

   memset (r, 0, sizeof *r);
   if (!purge_init (&p, s, o))
      return true;
   p.client = mongoc_client_pool_pop (s->pool);
   /* Each phase to its end, one batch per transaction.  The events are
    * those created before the earliest cutoff, in (createdAt, _id) order;
    * each batch starts after the last one read, so memory stays one
    * batch. */
   for (int phase = PURGE_PHASE_DEAD; ok && phase <= PURGE_PHASE_EVENTS; phase++)
      do {
         store_purge_step_result_t step = {0};
         ok = purge_phase_batch (&p, phase, p.min_cutoff, &after_created, &after_id, &step, &full, error);
         r->dead += step.dead;
         r->completed += step.completed;
         r->events += step.events;
      } while (ok && full);
   bson_free (after_id);
   purge_finish (&p);
   if (ok)
      log_info ("store: purged %" PRId64 " dead deliveries, %" PRId64 " completion records, %" PRId64 " events",
                r->dead,
                r->completed,
                r->events);
   return ok;
}

/* ----------------------------------------------------- scheduled purge */

bool
store_purge_step (store_t *s,
                  store_purge_run_t *run,
                  int64_t now,
                  int64_t lease_ms,
                  store_purge_step_result_t *r,
                  bson_error_t *error)
{
   store_purge_opts_t o = {.dead_before = run->dead_before, .completed_before = run->completed_before};
   /* The events phase reads events created before the later cutoff (an
    * event's completedAt is never before its createdAt). */
   int64_t events_cutoff = o.dead_before > o.completed_before ? o.dead_before : o.completed_before;
   purge_t p;
   bool ok, full = false;

   memset (r, 0, sizeof *r);
   if (!purge_init (&p, s, &o)) {
      r->leased = r->done = true;
      return true;
   }
   p.client = mongoc_client_pool_pop (s->pool);
   ok = store_doc_lease (s, p.client, STORE_PURGE_LEASE_ID, "purgeOwner", "purgeLeaseExpiresAt", "purge", now, lease_ms,
                         &r->leased, error);
   if (ok && r->leased) {
      RELAYBUS_ASSERT (run->phase >= PURGE_PHASE_DEAD && run->phase <= PURGE_PHASE_EVENTS);
      ok = purge_phase_batch (&p, run->phase, events_cutoff, &run->after_created, &run->after_id, r, &full, error);
      if (ok && !full) {
         if (run->phase == PURGE_PHASE_EVENTS)
            r->done = true;
         else
            run->phase++;
      }
   }
   purge_finish (&p);
   if (r->done || !r->leased || !ok)
      store_purge_run_clear (run);
   return ok;
}

void
store_purge_run_clear (store_purge_run_t *run)
{
   if (!run)
      return;
   bson_free (run->after_id);
   memset (run, 0, sizeof *run);
}

/* ------------------------------------------------------------ statistics */

bool
store_statistics (store_t *s, int64_t now, store_stats_t *st, bson_error_t *error)
{
   mongoc_client_t *client = mongoc_client_pool_pop (s->pool);
   mongoc_collection_t *dels = store_coll (s, client, OUTBOX_DELIVERIES);
   mongoc_collection_t *lanes = store_coll (s, client, OUTBOX_LANES_COLL);
   bson_t *pipeline = BCON_NEW ("pipeline", "[", "{", "$group", "{", "_id", "{", "s", BCON_UTF8 ("$status"), "l",
                                BCON_UTF8 ("$lane"), "}", "n", "{", "$sum", BCON_INT32 (1), "}", "}", "}", "]");
   bson_t *oq = BCON_NEW ("status", BCON_UTF8 ("pending"));
   bson_t *oopts = BCON_NEW ("sort", "{", OUTBOX_F_DUE_AT, BCON_INT32 (1), "}", "limit", BCON_INT64 (1));
   mongoc_cursor_t *cur;
   const bson_t *doc;
   bson_error_t err;
   bool ok = true;

   memset (st, 0, sizeof *st);
   cur = mongoc_collection_aggregate (dels, MONGOC_QUERY_NONE, pipeline, NULL, NULL);
   while (mongoc_cursor_next (cur, &doc)) {
      bson_iter_t it, id;
      const char *status = NULL, *lane = NULL;
      int64_t n = store_iter_int64 (doc, "n");
      if (bson_iter_init_find (&it, doc, "_id") && BSON_ITER_HOLDS_DOCUMENT (&it) && bson_iter_recurse (&it, &id))
         while (bson_iter_next (&id)) {
            if (!strcmp (bson_iter_key (&id), "s") && BSON_ITER_HOLDS_UTF8 (&id))
               status = bson_iter_utf8 (&id, NULL);
            if (!strcmp (bson_iter_key (&id), "l") && BSON_ITER_HOLDS_UTF8 (&id))
               lane = bson_iter_utf8 (&id, NULL);
         }
      if (status && !strcmp (status, "pending")) {
         st->pending += n;
         if (lane && !strcmp (lane, "parked"))
            st->parked += n;
      } else if (status && !strcmp (status, "dead")) {
         st->dead += n;
      } else if (status && !strcmp (status, "completed")) {
         st->completed += n;
      }
   }
   if (!store_cursor_end (cur, error, "statistics"))
      ok = false;

   cur = mongoc_collection_find_with_opts (dels, oq, oopts, NULL);
   if (ok && mongoc_cursor_next (cur, &doc))
      st->oldest_due_at = store_iter_date (doc, OUTBOX_F_DUE_AT);
   mongoc_cursor_destroy (cur);

   cur = mongoc_collection_find_with_opts (lanes, &(bson_t) BSON_INITIALIZER, NULL, NULL);
   while (ok && mongoc_cursor_next (cur, &doc)) {
      bson_iter_t it, child;
      if (!store_iter_utf8 (doc, "owner") || store_iter_date (doc, OUTBOX_F_LEASE_EXPIRES_AT) <= now)
         continue;
      st->lanes_owned++;
      if (bson_iter_init_find (&it, doc, OUTBOX_F_IN_FLIGHT) && BSON_ITER_HOLDS_ARRAY (&it) && bson_iter_recurse (&it, &child))
         while (bson_iter_next (&child))
            st->running++;
   }
   if (ok && mongoc_cursor_error (cur, &err)) {
      store_set_error (error, STORE_ERROR_SERVER, "statistics: %s", err.message);
      ok = false;
   }
   mongoc_cursor_destroy (cur);

   if (ok && s->completion_history) {
      mongoc_collection_t *hist = store_coll (s, client, OUTBOX_COMPLETED);
      int64_t n = mongoc_collection_count_documents (hist, &(bson_t) BSON_INITIALIZER, NULL, NULL, NULL, &err);
      if (n < 0) {
         store_set_error (error, STORE_ERROR_SERVER, "statistics: %s", err.message);
         ok = false;
      } else {
         st->completed += n;
      }
      mongoc_collection_destroy (hist);
   }
   bson_destroy (pipeline);
   bson_destroy (oq);
   bson_destroy (oopts);
   mongoc_collection_destroy (dels);
   mongoc_collection_destroy (lanes);
   mongoc_client_pool_push (s->pool, client);
   return ok;
}

/* ------------------------------------------------------ handler backlog */

static int
handler_cmp (const void *a, const void *b)
{
   return strcmp (((const store_handler_stats_t *) a)->name, ((const store_handler_stats_t *) b)->name);
}

static store_handler_stats_t *
handler_slot (store_handler_stats_t **v, size_t *n, size_t *cap, const char *name)
{
   for (size_t i = 0; i < *n; i++)
      if (!strcmp ((*v)[i].name, name))
         return &(*v)[i];
   if (*n == *cap) {
      *cap = *cap ? *cap * 2 : 8;
      *v = bson_realloc (*v, *cap * sizeof **v);
   }
   memset (&(*v)[*n], 0, sizeof **v);
   bson_strncpy ((*v)[*n].name, name, sizeof (*v)[*n].name);
   return &(*v)[(*n)++];
}

bool
store_handler_stats (store_t *s, store_handler_stats_t **out, size_t *n_out, bson_error_t *error)
{
   mongoc_client_t *client = mongoc_client_pool_pop (s->pool);
   mongoc_collection_t *dels = store_coll (s, client, OUTBOX_DELIVERIES);
   bson_t *pipeline = BCON_NEW ("pipeline", "[", "{", "$group", "{", "_id", "{", "h", BCON_UTF8 ("$handler"), "s",
                                BCON_UTF8 ("$status"), "l", BCON_UTF8 ("$lane"), "}", "n", "{", "$sum",
                                BCON_INT32 (1), "}", "oldest", "{", "$min", BCON_UTF8 ("$dueAt"), "}", "}", "}", "]");
   store_handler_stats_t *v = NULL;
   size_t n = 0, cap = 0;
   mongoc_cursor_t *cur;
   const bson_t *doc;
   bson_error_t err;
   bool ok = true;

   cur = mongoc_collection_aggregate (dels, MONGOC_QUERY_NONE, pipeline, NULL, NULL);
   while (mongoc_cursor_next (cur, &doc)) {
      bson_iter_t it, id;
      const char *h = NULL, *status = NULL, *lane = NULL;
      int64_t count = store_iter_int64 (doc, "n");
      int64_t oldest = store_iter_date (doc, "oldest");
      store_handler_stats_t *hs;

      if (bson_iter_init_find (&it, doc, "_id") && BSON_ITER_HOLDS_DOCUMENT (&it) && bson_iter_recurse (&it, &id))
         while (bson_iter_next (&id)) {
            const char *k = bson_iter_key (&id);
            const char *val = BSON_ITER_HOLDS_UTF8 (&id) ? bson_iter_utf8 (&id, NULL) : NULL;
            if (!strcmp (k, "h"))
               h = val;
            else if (!strcmp (k, "s"))
               status = val;
            else if (!strcmp (k, "l"))
               lane = val;
         }
      if (!h || !status)
         continue;
      hs = handler_slot (&v, &n, &cap, h);
      if (!strcmp (status, "pending")) {
         hs->pending += count;
         if (lane && !strcmp (lane, "parked"))
            hs->parked += count;
         if (oldest > 0 && (hs->oldest_due_at == 0 || oldest < hs->oldest_due_at))
            hs->oldest_due_at = oldest;
      } else if (!strcmp (status, "dead")) {
         hs->dead += count;
      }
   }
   if (mongoc_cursor_error (cur, &err)) {
      store_set_error (error, STORE_ERROR_SERVER, "handler statistics: %s", err.message);
      ok = false;
      bson_free (v);
      v = NULL;
      n = 0;
   }
   mongoc_cursor_destroy (cur);
   bson_destroy (pipeline);
   mongoc_collection_destroy (dels);
   mongoc_client_pool_push (s->pool, client);
   if (n > 1)
      qsort (v, n, sizeof *v, handler_cmp);
   *out = v;
   *n_out = n;
   return ok;
}

/* ----------------------------------------------------------------- lanes */

bool
store_list_lanes (store_t *s,
                  int64_t now,
                  const char *local_prefix,
                  bson_t *out,
                  int64_t *leased,
                  int64_t *held_local,
                  bson_error_t *error)
{
   mongoc_client_t *client = mongoc_client_pool_pop (s->pool);
   mongoc_collection_t *lanes = store_coll (s, client, OUTBOX_LANES_COLL);
   bson_t *q = BCON_NEW ("owner", "{", "$type", BCON_UTF8 ("string"), "}");
   bson_t *opts = BCON_NEW ("sort", "{", "_id", BCON_INT32 (1), "}");
   size_t prefix_len = local_prefix ? strlen (local_prefix) : 0;
   mongoc_cursor_t *cur;
   const bson_t *doc;
   uint32_t i = bson_count_keys (out);
   bool ok = true;

   *leased = *held_local = 0;
   cur = mongoc_collection_find_with_opts (lanes, q, opts, NULL);
   while (mongoc_cursor_next (cur, &doc)) {
      const char *owner = store_iter_utf8 (doc, "owner");
      int64_t expires = store_iter_date (doc, OUTBOX_F_LEASE_EXPIRES_AT);
      bool live = owner && expires > now;
      int64_t in_flight = 0;
      bson_iter_t it, child;
      char buf[16];
      const char *key;
      bson_t lane;

      if (!owner)
         continue;
      if (bson_iter_init_find (&it, doc, OUTBOX_F_IN_FLIGHT) && BSON_ITER_HOLDS_ARRAY (&it) && bson_iter_recurse (&it, &child))
         while (bson_iter_next (&child))
            in_flight++;
      if (live) {
         (*leased)++;
         if (prefix_len && !strncmp (owner, local_prefix, prefix_len))
            (*held_local)++;
      }
      bson_uint32_to_string (i++, &key, buf, sizeof buf);
      BSON_APPEND_DOCUMENT_BEGIN (out, key, &lane);
      BSON_APPEND_INT64 (&lane, "id", store_iter_int64 (doc, "_id"));
      /* The document's lane number and space (base/outbox.h), and the
       * handler whose space it is. */
      BSON_APPEND_INT64 (&lane, "lane", store_iter_int64 (doc, "_id") % OUTBOX_LANES);
      BSON_APPEND_UTF8 (&lane, "space", outbox_lane_space_name ((uint32_t) outbox_lane_space_of_doc (store_iter_int64 (doc, "_id"))));
      if (store_iter_utf8 (doc, "handler"))
         BSON_APPEND_UTF8 (&lane, "handler", store_iter_utf8 (doc, "handler"));
      BSON_APPEND_UTF8 (&lane, "owner", owner);
      BSON_APPEND_INT64 (&lane, OUTBOX_F_LEASE_EXPIRES_AT, expires);
      BSON_APPEND_BOOL (&lane, "live", live);
      BSON_APPEND_INT64 (&lane, OUTBOX_F_EPOCH, store_iter_int64 (doc, OUTBOX_F_EPOCH));
      BSON_APPEND_INT64 (&lane, OUTBOX_F_IN_FLIGHT, in_flight);
      bson_append_document_end (out, &lane);
   }
   if (!store_cursor_end (cur, error, "lanes"))
      ok = false;
   bson_destroy (q);
   bson_destroy (opts);
   mongoc_collection_destroy (lanes);
   mongoc_client_pool_push (s->pool, client);
   return ok;
}

bool
store_is_set_up (store_t *s, bool *ready, bson_error_t *error)
{
   mongoc_client_t *client = mongoc_client_pool_pop (s->pool);
   mongoc_collection_t *lanes = store_coll (s, client, OUTBOX_LANES_COLL);
   /* The lane documents of every space (the leases' have negative ids). */
   bson_t *q = BCON_NEW ("_id", "{", "$gte", BCON_INT32 (0), "}");
   bson_error_t err;
   int64_t n = mongoc_collection_count_documents (lanes, q, NULL, NULL, NULL, &err);
   bool ok = n >= 0;

   *ready = n >= OUTBOX_LANE_DOCS;
   if (!ok)
      store_set_error (error, STORE_ERROR_SERVER, "setup check: %s", err.message);
   bson_destroy (q);
   mongoc_collection_destroy (lanes);
   mongoc_client_pool_push (s->pool, client);
   return ok;
}

/* --------------------------------------------------------------- listing */

/* Builds the query of a listing from an admin filter (strings only) and
 * says whether it reads the completion history.  False: the filter can
 * match nothing (unknown status, or "completed" without completion
 * history); q is then left as it was. */
static bool
list_filter_query (const store_t *s, const store_list_filter_t *f, bool *completed, bson_t *q)
{
   *completed = f->status && !strcmp (f->status, "completed");
   if (f->status && !*completed && strcmp (f->status, "pending") != 0 && strcmp (f->status, "dead") != 0)
      return false; /* no such status */
   if (*completed && !s->completion_history)
      return false;
   {
      /* Each filter is appended as a UTF-8 string: never an operator. */
      const struct {
         const char *field, *value;
      } eq[] = {
         {"status", *completed ? NULL : f->status},
         {"handler", f->handler},
         {OUTBOX_F_EVENT_TYPE, f->event_type},
         {OUTBOX_F_EVENT_ID, f->event_id},
         {"key", f->key},
      };
      for (size_t i = 0; i < sizeof eq / sizeof eq[0]; i++)
         if (eq[i].value)
            BSON_APPEND_UTF8 (q, eq[i].field, eq[i].value);
   }
   return true;
}

bool
store_list_page (store_t *s,
                 const store_list_filter_t *f,
                 int64_t after_created,
                 const bson_oid_t *after_id,
                 bson_t *out,
                 bool *more,
                 bson_error_t *error)
{
   bool completed;
   int64_t limit = f->limit > 0 && f->limit <= 1000 ? f->limit : 100;
   uint32_t i = bson_count_keys (out);
   bson_t q = BSON_INITIALIZER;
   bson_t *opts;
   mongoc_client_t *client;
   mongoc_collection_t *coll;
   mongoc_cursor_t *cur;
   const bson_t *doc;
   int64_t seen = 0;
   bool ok = true;

   *more = false;
   if (!list_filter_query (s, f, &completed, &q)) {
      bson_destroy (&q);
      return true;
   }
   if (after_id) {
      bson_value_t id = {.value_type = BSON_TYPE_OID};
      bson_oid_copy (after_id, &id.value.v_oid);
      store_append_after_key (&q, OUTBOX_F_CREATED_AT, after_created, &id);
   }
   /* One more than asked: tells whether another page follows. */
   opts = BCON_NEW ("sort", "{", OUTBOX_F_CREATED_AT, BCON_INT32 (1), "_id", BCON_INT32 (1), "}", "limit", BCON_INT64 (limit + 1));
   client = mongoc_client_pool_pop (s->pool);
   coll = store_coll (s, client, completed ? OUTBOX_COMPLETED : OUTBOX_DELIVERIES);
   cur = mongoc_collection_find_with_opts (coll, &q, opts, NULL);
   while (mongoc_cursor_next (cur, &doc)) {
      char buf[16];
      const char *key;
      bson_t rec;

      if (++seen > limit) {
         *more = true;
         break;
      }
      bson_uint32_to_string (i++, &key, buf, sizeof buf);
      BSON_APPEND_DOCUMENT_BEGIN (out, key, &rec);
      bson_concat (&rec, doc);
      if (completed)
         BSON_APPEND_UTF8 (&rec, "status", "completed");
      bson_append_document_end (out, &rec);
   }
   if (!store_cursor_end (cur, error, "list deliveries"))
      ok = false;
   mongoc_collection_destroy (coll);
   mongoc_client_pool_push (s->pool, client);
   bson_destroy (opts);
   bson_destroy (&q);
   return ok;
}
