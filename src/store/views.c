/*
 * store/views.c - per-handler backlog, lanes, paginated listing, operator
 * bury and the setup check, for the admin port (see store/views.h).
 *
 * What this file does not do: change a lane, or anything a claim relies on
 * besides the claim generation of a buried delivery.  Every value that came
 * from a request is appended as a UTF-8 string, an ObjectId parsed from 24
 * hex characters, or an integer: never as a document.
 */
#include "store/views.h"
#include "store/store_private.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"

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
   bson_t *pipeline = BCON_NEW ("pipeline",
                                "[",
                                "{",
                                "$group",
                                "{",
                                "_id",
                                "{",
                                "h",
                                BCON_UTF8 ("$handler"),
                                "s",
                                BCON_UTF8 ("$status"),
                                "l",
                                BCON_UTF8 ("$lane"),
                                "}",
                                "n",
                                "{",
                                "$sum",
                                BCON_INT32 (1),
                                "}",
                                "oldest",
                                "{",
                                "$min",
                                BCON_UTF8 ("$dueAt"),
                                "}",
                                "}",
                                "}",
                                "]");
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
   bson_error_t err;
   uint32_t i = bson_count_keys (out);
   bool ok = true;

   *leased = *held_local = 0;
   cur = mongoc_collection_find_with_opts (lanes, q, opts, NULL);
   while (mongoc_cursor_next (cur, &doc)) {
      const char *owner = store_iter_utf8 (doc, "owner");
      int64_t expires = store_iter_date (doc, "leaseExpiresAt");
      bool live = owner && expires > now;
      int64_t in_flight = 0;
      bson_iter_t it, child;
      char buf[16];
      const char *key;
      bson_t lane;

      if (!owner)
         continue;
      if (bson_iter_init_find (&it, doc, "inFlight") && BSON_ITER_HOLDS_ARRAY (&it) && bson_iter_recurse (&it, &child))
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
      BSON_APPEND_UTF8 (&lane, "owner", owner);
      BSON_APPEND_INT64 (&lane, "leaseExpiresAt", expires);
      BSON_APPEND_BOOL (&lane, "live", live);
      BSON_APPEND_INT64 (&lane, "epoch", store_iter_int64 (doc, "epoch"));
      BSON_APPEND_INT64 (&lane, "inFlight", in_flight);
      bson_append_document_end (out, &lane);
   }
   if (mongoc_cursor_error (cur, &err)) {
      store_set_error (error, STORE_ERROR_SERVER, "lanes: %s", err.message);
      ok = false;
   }
   mongoc_cursor_destroy (cur);
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
   bson_t q = BSON_INITIALIZER;
   bson_error_t err;
   int64_t n = mongoc_collection_count_documents (lanes, &q, NULL, NULL, NULL, &err);
   bool ok = n >= 0;

   *ready = n >= OUTBOX_LANES;
   if (!ok)
      store_set_error (error, STORE_ERROR_SERVER, "setup check: %s", err.message);
   bson_destroy (&q);
   mongoc_collection_destroy (lanes);
   mongoc_client_pool_push (s->pool, client);
   return ok;
}

/* --------------------------------------------------------------- listing */

bool
store_list_filter_query (const store_t *s, const store_list_filter_t *f, bool *completed, bson_t *q)
{
   *completed = f->status && !strcmp (f->status, "completed");
   if (f->status && !*completed && strcmp (f->status, "pending") != 0 && strcmp (f->status, "dead") != 0)
      return false; /* no such status */
   if (*completed && !s->completion_history)
      return false;
   /* Each filter is appended as a UTF-8 string: never an operator. */
   if (f->status && !*completed)
      BSON_APPEND_UTF8 (q, "status", f->status);
   if (f->handler)
      BSON_APPEND_UTF8 (q, "handler", f->handler);
   if (f->event_type)
      BSON_APPEND_UTF8 (q, "eventType", f->event_type);
   if (f->event_id)
      BSON_APPEND_UTF8 (q, "eventId", f->event_id);
   if (f->key)
      BSON_APPEND_UTF8 (q, "key", f->key);
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
   bson_error_t err;
   int64_t seen = 0;
   bool ok = true;

   *more = false;
   if (!store_list_filter_query (s, f, &completed, &q)) {
      bson_destroy (&q);
      return true;
   }
   if (after_id) {
      bson_value_t id = {.value_type = BSON_TYPE_OID};
      bson_oid_copy (after_id, &id.value.v_oid);
      store_append_after_key (&q, after_created, &id);
   }
   /* One more than asked: tells whether another page follows. */
   opts = BCON_NEW ("sort", "{", "createdAt", BCON_INT32 (1), "_id", BCON_INT32 (1), "}", "limit", BCON_INT64 (limit + 1));
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
   if (mongoc_cursor_error (cur, &err)) {
      store_set_error (error, STORE_ERROR_SERVER, "list deliveries: %s", err.message);
      ok = false;
   }
   mongoc_cursor_destroy (cur);
   mongoc_collection_destroy (coll);
   mongoc_client_pool_push (s->pool, client);
   bson_destroy (opts);
   bson_destroy (&q);
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
} bury_ids_t;

static bool
bury_ids_cb (mongoc_client_session_t *session, void *ctx, bson_error_t *error)
{
   bury_ids_t *t = ctx;
   mongoc_collection_t *dels = store_coll (t->s, t->client, OUTBOX_DELIVERIES);
   mongoc_collection_t *lanes = store_coll (t->s, t->client, OUTBOX_LANES_COLL);
   store_oids_t pending = {0}, keep = {0};
   bool want[OUTBOX_LANES] = {0};
   mongoc_cursor_t *cur;
   const bson_t *doc;
   bson_t opts = BSON_INITIALIZER, dq = BSON_INITIALIZER, lq = BSON_INITIALIZER, q = BSON_INITIALIZER, reply;
   bson_t *fopts = NULL, *u = NULL, *lu = NULL;
   bool ok = true;

   t->n_buried = 0;
   store_session_opts (session, &opts);
   store_append_oids_op (&dq, "_id", "$in", t->oids->v, t->oids->n);
   BSON_APPEND_UTF8 (&dq, "status", "pending");
   fopts = BCON_NEW ("projection", "{", "laneId", BCON_INT32 (1), "}");
   bson_concat (fopts, &opts);
   cur = mongoc_collection_find_with_opts (dels, &dq, fopts, NULL);
   while (mongoc_cursor_next (cur, &doc)) {
      bson_iter_t it;
      int64_t lane = store_iter_int64 (doc, "laneId");
      if (!bson_iter_init_find (&it, doc, "_id") || !BSON_ITER_HOLDS_OID (&it))
         continue;
      store_oids_push (&pending, bson_iter_oid (&it));
      if (lane >= 0 && lane < OUTBOX_LANES)
         want[lane] = true;
   }
   if (mongoc_cursor_error (cur, error))
      ok = false;
   mongoc_cursor_destroy (cur);
   if (!ok || pending.n == 0)
      goto done;

   /* A delivery a lane lists in flight is running: its worker settles it. */
   store_append_lanes_in (&lq, "_id", want);
   cur = mongoc_collection_find_with_opts (lanes, &lq, &opts, NULL);
   {
      store_oids_t running = {0};
      while (mongoc_cursor_next (cur, &doc))
         store_oids_from_array (&running, doc, "inFlight");
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

   lu = BCON_NEW ("$inc", "{", "operatorWrites", BCON_INT64 (1), "}");
   if (!mongoc_collection_update_many (lanes, &lq, lu, &opts, NULL, error)) {
      ok = false;
      goto done;
   }
   store_append_oids_op (&q, "_id", "$in", keep.v, keep.n);
   BSON_APPEND_UTF8 (&q, "status", "pending");
   u = BCON_NEW ("$set",
                 "{",
                 "status",
                 BCON_UTF8 ("dead"),
                 "updatedAt",
                 BCON_DATE_TIME (t->now),
                 "lastError",
                 BCON_UTF8 (t->reason),
                 "}",
                 "$unset",
                 "{",
                 "lane",
                 BCON_UTF8 (""),
                 "}",
                 "$inc",
                 "{",
                 "claims",
                 BCON_INT32 (1),
                 "}");
   if (!mongoc_collection_update_many (dels, &q, u, &opts, &reply, error))
      ok = false;
   else
      t->n_buried = (size_t) store_iter_int64 (&reply, "modifiedCount");
   bson_destroy (&reply);

done:
   if (u)
      bson_destroy (u);
   if (lu)
      bson_destroy (lu);
   if (fopts)
      bson_destroy (fopts);
   bson_destroy (&opts);
   bson_destroy (&dq);
   bson_destroy (&lq);
   bson_destroy (&q);
   store_oids_free (&pending);
   store_oids_free (&keep);
   mongoc_collection_destroy (dels);
   mongoc_collection_destroy (lanes);
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
   if (ok)
      *n_buried = t.n_buried;
   else
      store_set_error (error, STORE_ERROR_SERVER, "bury: %s", err.message);
   mongoc_client_pool_push (s->pool, t.client);
   store_oids_free (&oids);
   return ok;
}
