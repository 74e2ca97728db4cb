/*
 * store/attempts.c - the record of every attempt of every delivery in
 * <prefix>attempts ([outbox] attempt_history; docs/outbox-schema.md,
 * "attempts"): the documents the settling calls write with the completion,
 * retry, release or bury that ends an attempt (store/complete.c), with an
 * operator's bury (store/ops.c) and with the charge of a lost claim
 * (store/claim_held.c), and the admin port's reads of them
 * (store/attempts.h).
 *
 * A record is written in the command batch that ends its attempt, never
 * in a round trip of its own: inside that call's transaction when it has
 * one (an abort takes the record with it, and the transaction's next run
 * writes it again), otherwise as one insert beside the completion's
 * writes, whose _id the caller chose once per attempt, so a completion
 * that is tried again does not record its attempt twice.  Every text an
 * endpoint or a library produced (the error, a webhook's answer) goes
 * through config_mask, as lastError does.
 */
#include "store/attempts.h"
#include "store/store_private.h"

#include <string.h>

#include "base/config.h"
#include "base/log.h"
#include "base/utf8.h"

bool
store_attempts_on (const store_t *s)
{
   return s->attempt_history_s > 0;
}

/* `text` masked, valid UTF-8 and at most `max` bytes (cut before a
 * character that would not fit); the caller frees it. */
static char *
masked_text (const char *text, size_t max)
{
   char *masked = config_mask (NULL, text);
   char *out = bson_malloc (max + 1);

   utf8_sanitize (masked, strlen (masked), out, max + 1, 0);
   bson_free (masked);
   return out;
}

void
store_attempt_docs_add (store_t *s,
                        store_attempt_docs_t *docs,
                        const bson_oid_t *delivery,
                        const char *event_id,
                        const store_attempt_t *a,
                        int64_t now)
{
   bson_t *d = bson_new ();

   BSON_APPEND_OID (d, "_id", &a->id);
   BSON_APPEND_OID (d, OUTBOX_F_DELIVERY_ID, delivery);
   if (event_id)
      BSON_APPEND_UTF8 (d, OUTBOX_F_EVENT_ID, event_id);
   if (a->handler)
      BSON_APPEND_UTF8 (d, "handler", a->handler);
   if (a->attempt > 0)
      BSON_APPEND_INT32 (d, OUTBOX_F_ATTEMPT, a->attempt);
   BSON_APPEND_UTF8 (d, OUTBOX_F_INSTANCE, s->owner);
   if (a->started_at > 0)
      BSON_APPEND_DATE_TIME (d, OUTBOX_F_STARTED_AT, a->started_at);
   /* The TTL index's field: always a date. */
   BSON_APPEND_DATE_TIME (d, OUTBOX_F_ENDED_AT, now);
   if (a->duration_ms >= 0)
      BSON_APPEND_INT64 (d, OUTBOX_F_DURATION_MS, a->duration_ms);
   BSON_APPEND_UTF8 (d, OUTBOX_F_OUTCOME, outbox_attempt_outcome_name (a->outcome) ? outbox_attempt_outcome_name (a->outcome) : "failed");
   if (a->status > 0)
      BSON_APPEND_INT32 (d, OUTBOX_F_STATUS_CODE, a->status);
   if (a->error && *a->error) {
      /* As long as a lastError may be (a transport's error text). */
      char *e = masked_text (a->error, 1024);
      BSON_APPEND_UTF8 (d, OUTBOX_F_ERROR, e);
      bson_free (e);
   }
   if (a->response && *a->response) {
      /* Masked before it is cut: a secret the answer quotes across the
       * cut is still found whole (the transport keeps twice the bytes). */
      char *r = masked_text (a->response, OUTBOX_ATTEMPT_RESPONSE_MAX);
      BSON_APPEND_UTF8 (d, OUTBOX_F_RESPONSE, r);
      bson_free (r);
   }
   if (docs->n == docs->cap) {
      docs->cap = docs->cap ? docs->cap * 2 : 8;
      docs->v = bson_realloc (docs->v, docs->cap * sizeof *docs->v);
   }
   docs->v[docs->n++] = d;
}

void
store_attempt_docs_free (store_attempt_docs_t *docs)
{
   for (size_t i = 0; i < docs->n; i++)
      bson_destroy (docs->v[i]);
   bson_free (docs->v);
   memset (docs, 0, sizeof *docs);
}

/* Whether every write error of an insert's reply is a duplicate key. */
static bool
only_duplicates (const bson_t *reply)
{
   bson_iter_t it, arr, f;
   bool any = false;

   if (!bson_iter_init_find (&it, reply, "writeErrors") || !BSON_ITER_HOLDS_ARRAY (&it) || !bson_iter_recurse (&it, &arr))
      return false;
   while (bson_iter_next (&arr)) {
      if (!BSON_ITER_HOLDS_DOCUMENT (&arr) || !bson_iter_recurse (&arr, &f) || !bson_iter_find (&f, "code") ||
          bson_iter_as_int64 (&f) != STORE_SERVER_DUPLICATE_KEY)
         return false;
      any = true;
   }
   return any;
}

bool
store_attempt_docs_insert (store_t *s, mongoc_collection_t *coll, const store_attempt_docs_t *docs, const bson_t *opts, bson_error_t *error)
{
   bson_t o = BSON_INITIALIZER, reply;
   bson_error_t err;
   bool ok;

   (void) s;
   if (docs->n == 0)
      return true;
   if (opts)
      bson_concat (&o, opts);
   else
      BSON_APPEND_BOOL (&o, "ordered", false);
   ok = mongoc_collection_insert_many (coll, (const bson_t **) docs->v, docs->n, &o, &reply, &err);
   if (!ok && !opts && only_duplicates (&reply))
      ok = true; /* written by an earlier try of the same call */
   if (!ok && opts && error)
      *error = err; /* the server's, as every statement of a transaction reports it (a write conflict runs it again) */
   else if (!ok)
      store_set_error (error, STORE_ERROR_SERVER, "recording %zu attempt(s): %s", docs->n, err.message);
   bson_destroy (&reply);
   bson_destroy (&o);
   return ok;
}

/* ------------------------------------------------------------ reads */

/* Appends doc to the array `arr` (its next index). */
static void
array_push (bson_t *arr, const bson_t *doc)
{
   char buf[16];
   const char *key;

   bson_uint32_to_string (bson_count_keys (arr), &key, buf, sizeof buf);
   BSON_APPEND_DOCUMENT (arr, key, doc);
}

/* Runs a find on `which` and appends what it returns to `arr`, at most
 * `limit` (more: *more set); opts may be NULL. */
static bool
find_into (store_t *s, mongoc_client_t *client, outbox_collection_t which, const bson_t *q, const bson_t *opts, int64_t limit,
           bson_t *arr, bool *more, bson_error_t *error)
{
   mongoc_collection_t *coll = store_coll (s, client, which);
   mongoc_cursor_t *cur = mongoc_collection_find_with_opts (coll, q, opts, NULL);
   const bson_t *doc;
   int64_t seen = 0;
   bool ok;

   while (mongoc_cursor_next (cur, &doc)) {
      if (limit > 0 && ++seen > limit) {
         if (more)
            *more = true;
         break;
      }
      array_push (arr, doc);
   }
   ok = store_cursor_end (cur, error, "reading %s", s->names[which]);
   mongoc_collection_destroy (coll);
   return ok;
}

/* The deliveries of `ids` (n of them, of `handlers`) that a lane lists in
 * flight: running[i].  Their lane in every space that may run them (their
 * handler's, the pull space and the dispatch space), one find. */
static bool
running_of (store_t *s, mongoc_client_t *client, const bson_oid_t *ids, const int32_t *lanes, const char *const *handlers, size_t n,
            bool *running, bson_error_t *error)
{
   bson_t q = BSON_INITIALIZER, id, in, fl;
   bson_t *opts;
   mongoc_collection_t *coll;
   mongoc_cursor_t *cur;
   const bson_t *doc;
   uint32_t k = 0;
   bool ok;

   for (size_t i = 0; i < n; i++)
      running[i] = false;
   BSON_APPEND_DOCUMENT_BEGIN (&q, "_id", &id);
   BSON_APPEND_ARRAY_BEGIN (&id, "$in", &in);
   for (size_t i = 0; i < n; i++) {
      uint32_t spaces[3] = {OUTBOX_LANE_SPACE_DISPATCH, OUTBOX_LANE_SPACE_PULL, 0};
      size_t n_spaces = 2;
      if (lanes[i] < 0 || lanes[i] >= OUTBOX_LANES)
         continue;
      if (handlers[i])
         spaces[n_spaces++] = outbox_lane_space_of (handlers[i]);
      for (size_t sp = 0; sp < n_spaces; sp++) {
         char buf[16];
         const char *key;
         bson_uint32_to_string (k++, &key, buf, sizeof buf);
         BSON_APPEND_INT32 (&in, key, outbox_lane_doc_id (spaces[sp], (uint32_t) lanes[i]));
      }
   }
   bson_append_array_end (&id, &in);
   bson_append_document_end (&q, &id);
   BSON_APPEND_DOCUMENT_BEGIN (&q, OUTBOX_F_IN_FLIGHT, &fl);
   store_append_oids_array (&fl, "$in", ids, n);
   bson_append_document_end (&q, &fl);
   if (k == 0) {
      bson_destroy (&q);
      return true;
   }
   opts = BCON_NEW ("projection", "{", OUTBOX_F_IN_FLIGHT, BCON_INT32 (1), "}");
   coll = store_coll (s, client, OUTBOX_LANES_COLL);
   cur = mongoc_collection_find_with_opts (coll, &q, opts, NULL);
   while (mongoc_cursor_next (cur, &doc))
      for (size_t i = 0; i < n; i++)
         running[i] = running[i] || store_array_has_oid (doc, OUTBOX_F_IN_FLIGHT, &ids[i]);
   ok = store_cursor_end (cur, error, "reading the lanes");
   mongoc_collection_destroy (coll);
   bson_destroy (opts);
   bson_destroy (&q);
   return ok;
}

/* Whether any record of `arr` (attempts) has outcome "succeeded" and,
 * when `delivery` is not NULL, that delivery id. */
static bool
any_succeeded (const bson_t *arr, const bson_oid_t *delivery)
{
   bson_iter_t it;

   if (!bson_iter_init (&it, arr))
      return false;
   while (bson_iter_next (&it)) {
      bson_t d;
      const uint8_t *data;
      uint32_t len;
      bson_iter_t f;
      const char *o;

      if (!BSON_ITER_HOLDS_DOCUMENT (&it))
         continue;
      bson_iter_document (&it, &len, &data);
      if (!bson_init_static (&d, data, len))
         continue;
      o = store_iter_utf8 (&d, OUTBOX_F_OUTCOME);
      if (!o || strcmp (o, "succeeded") != 0)
         continue;
      if (!delivery || (bson_iter_init_find (&f, &d, OUTBOX_F_DELIVERY_ID) && BSON_ITER_HOLDS_OID (&f) &&
                        bson_oid_equal (bson_iter_oid (&f), delivery)))
         return true;
   }
   return false;
}

/* The state of a delivery document (status pending or dead), or of a
 * completion record (`completed`). */
static const char *
state_of (const bson_t *doc, bool completed, bool running)
{
   const char *status = store_iter_utf8 (doc, "status");

   if (completed)
      return "completed";
   if (status && strcmp (status, "dead") == 0)
      return "dead";
   return running ? "running" : "pending";
}

bool
store_delivery_history (store_t *s, const bson_oid_t *id, int64_t limit, store_delivery_history_t *out, bson_error_t *error)
{
   mongoc_client_t *client = mongoc_client_pool_pop (s->pool);
   bson_t q = BSON_INITIALIZER, found = BSON_INITIALIZER;
   bson_t *opts = NULL;
   bool ok, completed = false;

   memset (out, 0, sizeof *out);
   bson_init (&out->delivery);
   bson_init (&out->attempts);
   out->state = "unknown";
   if (limit < 1 || limit > STORE_ATTEMPTS_LIMIT_MAX)
      limit = STORE_ATTEMPTS_LIMIT_MAX;
   BSON_APPEND_OID (&q, "_id", id);
   ok = find_into (s, client, OUTBOX_DELIVERIES, &q, NULL, 1, &found, NULL, error);
   if (ok && bson_empty (&found) && s->completion_history) {
      ok = find_into (s, client, OUTBOX_COMPLETED, &q, NULL, 1, &found, NULL, error);
      completed = !bson_empty (&found);
   }
   if (!ok)
      goto done;
   bson_reinit (&q);
   BSON_APPEND_OID (&q, OUTBOX_F_DELIVERY_ID, id);
   opts = BCON_NEW ("sort", "{", OUTBOX_F_ENDED_AT, BCON_INT32 (1), "_id", BCON_INT32 (1), "}", "limit", BCON_INT64 (limit + 1));
   ok = find_into (s, client, OUTBOX_ATTEMPTS, &q, opts, limit, &out->attempts, &out->more, error);
   if (!ok)
      goto done;
   if (!bson_empty (&found)) {
      bson_iter_t it;
      bson_t d;
      const uint8_t *data;
      uint32_t len;
      bool running = false;

      if (bson_iter_init_find (&it, &found, "0") && BSON_ITER_HOLDS_DOCUMENT (&it)) {
         bson_iter_document (&it, &len, &data);
         if (bson_init_static (&d, data, len)) {
            bson_copy_to_excluding_noinit (&d, &out->delivery, OUTBOX_F_IN_FLIGHT, NULL);
            if (!completed) {
               int32_t lane = (int32_t) store_iter_int64 (&d, OUTBOX_F_LANE_ID);
               const char *handler = store_iter_utf8 (&d, "handler");
               ok = running_of (s, client, id, &lane, &handler, 1, &running, error);
            }
            out->state = state_of (&d, completed, running);
         }
      }
      out->found = true;
   } else {
      out->found = !bson_empty (&out->attempts);
      /* A completion without history deletes the delivery: its record
       * of success is what is left. */
      if (any_succeeded (&out->attempts, id))
         out->state = "completed";
   }

done:
   bson_destroy (opts);
   bson_destroy (&q);
   bson_destroy (&found);
   mongoc_client_pool_push (s->pool, client);
   return ok;
}

void
store_delivery_history_clear (store_delivery_history_t *h)
{
   bson_destroy (&h->delivery);
   bson_destroy (&h->attempts);
}

/* Adds "state" to each delivery of `raw` (an array) and appends it to
 * `out`; the pending ones a lane lists are running. */
static bool
event_deliveries (store_t *s, mongoc_client_t *client, const bson_t *raw, bool completed, bson_t *out, bson_error_t *error)
{
   uint32_t n = bson_count_keys (raw), k = 0;
   bson_oid_t *ids = bson_malloc0 ((n ? n : 1) * sizeof *ids);
   int32_t *lanes = bson_malloc0 ((n ? n : 1) * sizeof *lanes);
   const char **handlers = bson_malloc0 ((n ? n : 1) * sizeof *handlers);
   bool *running = bson_malloc0 ((n ? n : 1) * sizeof *running);
   bson_t *docs = bson_malloc0 ((n ? n : 1) * sizeof *docs);
   bson_iter_t it;
   bool ok = true;

   if (bson_iter_init (&it, raw))
      while (bson_iter_next (&it) && k < n) {
         const uint8_t *data;
         uint32_t len;
         bson_iter_t id;

         if (!BSON_ITER_HOLDS_DOCUMENT (&it))
            continue;
         bson_iter_document (&it, &len, &data);
         if (!bson_init_static (&docs[k], data, len) || !bson_iter_init_find (&id, &docs[k], "_id") || !BSON_ITER_HOLDS_OID (&id))
            continue;
         bson_oid_copy (bson_iter_oid (&id), &ids[k]);
         lanes[k] = (int32_t) store_iter_int64 (&docs[k], OUTBOX_F_LANE_ID);
         handlers[k] = store_iter_utf8 (&docs[k], "handler");
         k++;
      }
   if (!completed && k > 0)
      ok = running_of (s, client, ids, lanes, handlers, k, running, error);
   for (uint32_t i = 0; ok && i < k; i++) {
      bson_t d = BSON_INITIALIZER;
      bson_copy_to_excluding_noinit (&docs[i], &d, OUTBOX_F_IN_FLIGHT, "state", NULL);
      BSON_APPEND_UTF8 (&d, "state", state_of (&docs[i], completed, running[i]));
      array_push (out, &d);
      bson_destroy (&d);
   }
   bson_free (ids);
   bson_free (lanes);
   bson_free (handlers);
   bson_free (running);
   bson_free (docs);
   return ok;
}

bool
store_event_history (store_t *s, const char *event_id, store_event_history_t *out, bson_error_t *error)
{
   mongoc_client_t *client = mongoc_client_pool_pop (s->pool);
   bson_t q = BSON_INITIALIZER, events = BSON_INITIALIZER, raw = BSON_INITIALIZER, done_raw = BSON_INITIALIZER;
   bson_t *opts = NULL, *dopts = NULL;
   store_oids_t ids = {0};
   bool ok;

   memset (out, 0, sizeof *out);
   bson_init (&out->event);
   bson_init (&out->deliveries);
   bson_init (&out->attempts);
   BSON_APPEND_UTF8 (&q, "_id", event_id);
   ok = find_into (s, client, OUTBOX_EVENTS, &q, NULL, 1, &events, NULL, error);
   if (!ok)
      goto done;
   {
      bson_iter_t it;
      if (bson_iter_init_find (&it, &events, "0") && BSON_ITER_HOLDS_DOCUMENT (&it)) {
         const uint8_t *data;
         uint32_t len;
         bson_t d;
         bson_iter_document (&it, &len, &data);
         if (bson_init_static (&d, data, len))
            bson_concat (&out->event, &d);
      }
   }
   /* Its deliveries: one per handler (the event_handler index), at most
    * as many as a fleet has handlers. */
   bson_reinit (&q);
   BSON_APPEND_UTF8 (&q, OUTBOX_F_EVENT_ID, event_id);
   dopts = BCON_NEW ("sort", "{", "handler", BCON_INT32 (1), "}", "limit", BCON_INT64 (CONFIG_MAX_HANDLERS * 4));
   ok = find_into (s, client, OUTBOX_DELIVERIES, &q, dopts, 0, &raw, NULL, error) &&
        (!s->completion_history || find_into (s, client, OUTBOX_COMPLETED, &q, dopts, 0, &done_raw, NULL, error)) &&
        event_deliveries (s, client, &raw, false, &out->deliveries, error) &&
        event_deliveries (s, client, &done_raw, true, &out->deliveries, error);
   if (!ok)
      goto done;
   {
      bson_iter_t it;
      if (bson_iter_init (&it, &out->deliveries))
         while (bson_iter_next (&it)) {
            bson_iter_t id;
            if (BSON_ITER_HOLDS_DOCUMENT (&it) && bson_iter_recurse (&it, &id) && bson_iter_find (&id, "_id") && BSON_ITER_HOLDS_OID (&id))
               store_oids_push (&ids, bson_iter_oid (&id));
         }
   }
   /* Its attempts: by event id, and by delivery id (a lost claim's
    * charge records the delivery and its event, but be lenient with
    * records written without an event id). */
   bson_reinit (&q);
   {
      bson_t arr, one;
      BSON_APPEND_ARRAY_BEGIN (&q, "$or", &arr);
      BSON_APPEND_DOCUMENT_BEGIN (&arr, "0", &one);
      BSON_APPEND_UTF8 (&one, OUTBOX_F_EVENT_ID, event_id);
      bson_append_document_end (&arr, &one);
      if (ids.n > 0) {
         BSON_APPEND_DOCUMENT_BEGIN (&arr, "1", &one);
         store_append_oids_op (&one, OUTBOX_F_DELIVERY_ID, "$in", ids.v, ids.n);
         bson_append_document_end (&arr, &one);
      }
      bson_append_array_end (&q, &arr);
   }
   opts = BCON_NEW ("sort", "{", OUTBOX_F_ENDED_AT, BCON_INT32 (1), "_id", BCON_INT32 (1), "}", "limit",
                    BCON_INT64 (STORE_ATTEMPTS_LIMIT_MAX + 1));
   ok = find_into (s, client, OUTBOX_ATTEMPTS, &q, opts, STORE_ATTEMPTS_LIMIT_MAX, &out->attempts, &out->more, error);
   out->found = !bson_empty (&out->event) || !bson_empty (&out->deliveries) || !bson_empty (&out->attempts);

done:
   store_oids_free (&ids);
   bson_destroy (opts);
   bson_destroy (dopts);
   bson_destroy (&q);
   bson_destroy (&events);
   bson_destroy (&raw);
   bson_destroy (&done_raw);
   mongoc_client_pool_push (s->pool, client);
   return ok;
}

void
store_event_history_clear (store_event_history_t *h)
{
   bson_destroy (&h->event);
   bson_destroy (&h->deliveries);
   bson_destroy (&h->attempts);
}

bool
store_attempts_list (store_t *s, const store_attempts_filter_t *f, bson_t *out, bool *more, bson_error_t *error)
{
   int64_t limit = f->limit > 0 && f->limit <= STORE_ATTEMPTS_LIMIT_MAX ? f->limit : 100;
   mongoc_client_t *client;
   bson_t q = BSON_INITIALIZER, sub;
   bson_t *opts;
   bool ok;

   *more = false;
   if (f->handler)
      BSON_APPEND_UTF8 (&q, "handler", f->handler);
   if (f->outcome)
      BSON_APPEND_UTF8 (&q, OUTBOX_F_OUTCOME, f->outcome);
   if (f->since > 0) {
      BSON_APPEND_DOCUMENT_BEGIN (&q, OUTBOX_F_ENDED_AT, &sub);
      BSON_APPEND_DATE_TIME (&sub, "$gte", f->since);
      bson_append_document_end (&q, &sub);
   }
   if (f->before_id) {
      /* Strictly before (endedAt, _id) of the last record of a page. */
      bson_t arr, one, lt;
      BSON_APPEND_ARRAY_BEGIN (&q, "$or", &arr);
      BSON_APPEND_DOCUMENT_BEGIN (&arr, "0", &one);
      BSON_APPEND_DOCUMENT_BEGIN (&one, OUTBOX_F_ENDED_AT, &lt);
      BSON_APPEND_DATE_TIME (&lt, "$lt", f->before_ended);
      bson_append_document_end (&one, &lt);
      bson_append_document_end (&arr, &one);
      BSON_APPEND_DOCUMENT_BEGIN (&arr, "1", &one);
      BSON_APPEND_DATE_TIME (&one, OUTBOX_F_ENDED_AT, f->before_ended);
      BSON_APPEND_DOCUMENT_BEGIN (&one, "_id", &lt);
      BSON_APPEND_OID (&lt, "$lt", f->before_id);
      bson_append_document_end (&one, &lt);
      bson_append_document_end (&arr, &one);
      bson_append_array_end (&q, &arr);
   }
   opts = BCON_NEW ("sort", "{", OUTBOX_F_ENDED_AT, BCON_INT32 (-1), "_id", BCON_INT32 (-1), "}", "limit", BCON_INT64 (limit + 1));
   client = mongoc_client_pool_pop (s->pool);
   ok = find_into (s, client, OUTBOX_ATTEMPTS, &q, opts, limit, out, more, error);
   mongoc_client_pool_push (s->pool, client);
   bson_destroy (opts);
   bson_destroy (&q);
   return ok;
}
