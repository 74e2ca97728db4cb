/*
 * store/fleet.c - the `handlers` collection (one document per proxy
 * instance), the backfill of a handler a proxy newly declares, and the
 * retirement of handlers no live proxy declares (see store/fleet.h).
 *
 * What this file does not do: decide what is live, due for retirement or
 * new; the dispatcher (dispatch/fleet.c, with base/fleet.c's snapshot)
 * decides and calls these.  Retirement buries through store_bury_ids
 * (store/ops.h), so it follows the operator bury's rules (a delivery a
 * lane lists in flight is left to its worker).
 */
#include "store/fleet.h"
#include "store/store_private.h"
#include "store/ops.h"

#include <string.h>

#include "base/log.h"
#include "base/outbox.h"

/* Events read per backfill page and written per transaction. */
#define FLEET_BACKFILL_PAGE 500
/* Pages one backfill call reads at most (the window is transaction_lifetime
 * plus a few heartbeats of events; this only bounds a pathological one:
 * the next heartbeat's pass goes on). */
#define FLEET_BACKFILL_MAX_PAGES 200
/* The retirement lease: one document in the lanes collection, _id -2 (the
 * purge lease is -1; lane queries name ids 0..255). */
#define STORE_RETIRE_LEASE_ID (-2)

bool
store_fleet_announce (store_t *s, const bson_t *fields, bson_error_t *error)
{
   bson_t q = BSON_INITIALIZER, u = BSON_INITIALIZER, set, cur;
   bson_t *opts = BCON_NEW ("upsert", BCON_BOOL (true));
   bool ok;

   BSON_APPEND_UTF8 (&q, "_id", s->owner);
   BSON_APPEND_DOCUMENT_BEGIN (&u, "$set", &set);
   bson_concat (&set, fields);
   bson_append_document_end (&u, &set);
   /* The server's clock: every instance's heartbeat is compared with the
    * reader's own, both written by the server, so no proxy's skew (or a
    * dispatcher thread that stalled between reading its clock and
    * writing) makes a live instance look dead. */
   BSON_APPEND_DOCUMENT_BEGIN (&u, "$currentDate", &cur);
   BSON_APPEND_BOOL (&cur, OUTBOX_F_HEARTBEAT_AT, true);
   bson_append_document_end (&u, &cur);
   ok = store_write (s, OUTBOX_HANDLERS, STORE_WRITE_UPDATE_ONE, &q, &u, opts, NULL, "announcing the handlers", error);
   bson_destroy (opts);
   bson_destroy (&u);
   bson_destroy (&q);
   return ok;
}

/* Whether `doc` declares a handler name not in names[] (and adds its new
 * names, up to `max`). */
static bool
fleet_doc_adds_names (const bson_t *doc, char **names, size_t *n_names, size_t max)
{
   bson_iter_t it, arr, h;
   bool adds = false;

   if (!bson_iter_init_find (&it, doc, "handlers") || !BSON_ITER_HOLDS_ARRAY (&it) || !bson_iter_recurse (&it, &arr))
      return false;
   while (bson_iter_next (&arr)) {
      const char *name;
      bool seen = false;

      if (!BSON_ITER_HOLDS_DOCUMENT (&arr) || !bson_iter_recurse (&arr, &h) || !bson_iter_find (&h, "name") ||
          !BSON_ITER_HOLDS_UTF8 (&h))
         continue;
      name = bson_iter_utf8 (&h, NULL);
      for (size_t i = 0; i < *n_names && !seen; i++)
         seen = !strcmp (names[i], name);
      if (seen || *n_names == max)
         continue;
      names[(*n_names)++] = bson_strdup (name);
      adds = true;
   }
   return adds;
}

bool
store_fleet_read (store_t *s, bson_t **docs, size_t max_full, size_t max, size_t *n, bson_error_t *error)
{
   mongoc_client_t *client = mongoc_client_pool_pop (s->pool);
   mongoc_collection_t *coll = store_coll (s, client, OUTBOX_HANDLERS);
   /* Instance documents only (a string _id): not the declaration records
    * (store_fleet_record_declared). */
   bson_t *q = BCON_NEW ("_id", "{", "$type", BCON_UTF8 ("string"), "}");
   /* Newest heartbeat first: however many documents dead instances left,
    * the live ones come before them. */
   bson_t *opts = BCON_NEW ("sort", "{", OUTBOX_F_HEARTBEAT_AT, BCON_INT32 (-1), "_id", BCON_INT32 (1), "}");
   mongoc_cursor_t *cur = mongoc_collection_find_with_opts (coll, q, opts, NULL);
   char **names = bson_malloc0 ((max ? max : 1) * sizeof *names);
   size_t n_names = 0;
   const bson_t *doc;
   bson_error_t err;
   bool ok = true;

   *n = 0;
   /* Every document is read (a bounded loop: the retirement's forget
    * removes those silent past the retention); past the first max_full,
    * one is kept only for a handler name the newer ones lack, so a
    * crash-looping fleet's documents cannot push a declaration out. */
   while (*n < max && mongoc_cursor_next (cur, &doc)) {
      bool adds = fleet_doc_adds_names (doc, names, &n_names, max);

      if (*n < max_full || adds)
         docs[(*n)++] = bson_copy (doc);
   }
   if (mongoc_cursor_error (cur, &err)) {
      store_set_error (error, STORE_ERROR_SERVER, "reading the fleet's handlers: %s", err.message);
      for (size_t i = 0; i < *n; i++)
         bson_destroy (docs[i]);
      *n = 0;
      ok = false;
   }
   for (size_t i = 0; i < n_names; i++)
      bson_free (names[i]);
   bson_free (names);
   mongoc_cursor_destroy (cur);
   bson_destroy (opts);
   bson_destroy (q);
   mongoc_collection_destroy (coll);
   mongoc_client_pool_push (s->pool, client);
   return ok;
}

/* The declaration record of `name`: {_id: {handler: name}} (a document
 * _id, which no instance document has). */
static void
declared_id (bson_t *doc, const char *key, const char *name)
{
   bson_t id;

   BSON_APPEND_DOCUMENT_BEGIN (doc, key, &id);
   BSON_APPEND_UTF8 (&id, "handler", name);
   bson_append_document_end (doc, &id);
}

bool
store_fleet_record_declared (store_t *s, const char *const *names, size_t n, bson_error_t *error)
{
   mongoc_client_t *client;
   mongoc_collection_t *coll;
   mongoc_bulk_operation_t *bulk;
   bson_t *opts = BCON_NEW ("upsert", BCON_BOOL (true));
   bson_t reply;
   bson_error_t err;
   bool ok = true;

   if (n == 0) {
      bson_destroy (opts);
      return true;
   }
   client = mongoc_client_pool_pop (s->pool);
   coll = store_coll (s, client, OUTBOX_HANDLERS);
   bulk = mongoc_collection_create_bulk_operation_with_opts (coll, NULL);
   for (size_t i = 0; ok && i < n; i++) {
      bson_t q = BSON_INITIALIZER;
      /* The name, and the server's time of the last record (a proxy
       * records each name once per process). */
      bson_t *u = BCON_NEW ("$set", "{", "handler", BCON_UTF8 (names[i]), "}", "$currentDate", "{", "declaredAt", BCON_BOOL (true), "}");

      declared_id (&q, "_id", names[i]);
      ok = mongoc_bulk_operation_update_one_with_opts (bulk, &q, u, opts, &err);
      bson_destroy (u);
      bson_destroy (&q);
   }
   if (ok) {
      ok = mongoc_bulk_operation_execute (bulk, &reply, &err) != 0;
      bson_destroy (&reply);
   }
   if (!ok)
      store_set_error (error, STORE_ERROR_SERVER, "recording the declared handlers: %s", err.message);
   mongoc_bulk_operation_destroy (bulk);
   bson_destroy (opts);
   mongoc_collection_destroy (coll);
   mongoc_client_pool_push (s->pool, client);
   return ok;
}

bool
store_fleet_declared (store_t *s, char *const *names, size_t n, bool *declared, bson_error_t *error)
{
   mongoc_client_t *client;
   mongoc_collection_t *coll;
   bson_t q = BSON_INITIALIZER, id, in;
   bson_t *opts = BCON_NEW ("projection", "{", "handler", BCON_INT32 (1), "}");
   mongoc_cursor_t *cur;
   const bson_t *doc;
   bool ok;

   for (size_t i = 0; i < n; i++)
      declared[i] = false;
   if (n == 0) {
      bson_destroy (opts);
      return true;
   }
   client = mongoc_client_pool_pop (s->pool);
   coll = store_coll (s, client, OUTBOX_HANDLERS);
   BSON_APPEND_DOCUMENT_BEGIN (&q, "_id", &id);
   BSON_APPEND_ARRAY_BEGIN (&id, "$in", &in);
   for (size_t i = 0; i < n; i++) {
      char buf[16];
      const char *k;

      bson_uint32_to_string ((uint32_t) i, &k, buf, sizeof buf);
      declared_id (&in, k, names[i]);
   }
   bson_append_array_end (&id, &in);
   bson_append_document_end (&q, &id);
   cur = mongoc_collection_find_with_opts (coll, &q, opts, NULL);
   while (mongoc_cursor_next (cur, &doc)) {
      const char *name = store_iter_utf8 (doc, "handler");

      for (size_t i = 0; name && i < n; i++)
         if (!strcmp (names[i], name))
            declared[i] = true;
   }
   ok = store_cursor_end (cur, error, "reading the declared handlers");
   bson_destroy (opts);
   bson_destroy (&q);
   mongoc_collection_destroy (coll);
   mongoc_client_pool_push (s->pool, client);
   return ok;
}

bool
store_fleet_forget (store_t *s, int64_t before, bson_error_t *error)
{
   bson_t *q = BCON_NEW (OUTBOX_F_HEARTBEAT_AT, "{", "$lt", BCON_DATE_TIME (before), "}",
                         "_id", "{", "$ne", BCON_UTF8 (s->owner), "}");
   bool ok = store_write (
      s, OUTBOX_HANDLERS, STORE_WRITE_DELETE_MANY, q, NULL, NULL, NULL, "forgetting silent instances", error);

   bson_destroy (q);
   return ok;
}

bool
store_fleet_lease (store_t *s, int64_t now, int64_t lease_ms, bool *leased, bson_error_t *error)
{
   mongoc_client_t *client = mongoc_client_pool_pop (s->pool);
   bool ok = store_doc_lease (
      s, client, STORE_RETIRE_LEASE_ID, "retireOwner", "retireLeaseExpiresAt", "retirement", now, lease_ms, leased, error);

   mongoc_client_pool_push (s->pool, client);
   return ok;
}

bool
store_fleet_lease_release (store_t *s, int64_t now, bson_error_t *error)
{
   bson_t *q = BCON_NEW ("_id", BCON_INT32 (STORE_RETIRE_LEASE_ID), "retireOwner", BCON_UTF8 (s->owner));
   bson_t *u = BCON_NEW ("$set", "{", "retireLeaseExpiresAt", BCON_DATE_TIME (now), "}");
   bool ok = store_write (
      s, OUTBOX_LANES_COLL, STORE_WRITE_UPDATE_ONE, q, u, NULL, NULL, "handing the retirement lease back", error);

   bson_destroy (u);
   bson_destroy (q);
   return ok;
}

bool
store_fleet_server_txn_lifetime (store_t *s, int64_t *ms, bson_error_t *error)
{
   mongoc_client_t *client = mongoc_client_pool_pop (s->pool);
   bson_t *cmd = BCON_NEW ("getParameter", BCON_INT32 (1), "transactionLifetimeLimitSeconds", BCON_INT32 (1));
   bson_t reply;
   bson_iter_t it;
   bson_error_t err;
   bool ok;

   *ms = 0;
   /* A primary's (the read preference of the pool's default): the limit
    * that aborts the transactions that write the outbox. */
   ok = mongoc_client_command_simple (client, "admin", cmd, NULL, &reply, &err);
   if (!ok) {
      store_set_error (error, STORE_ERROR_SERVER, "getParameter transactionLifetimeLimitSeconds: %s", err.message);
   } else if (!bson_iter_init_find (&it, &reply, "transactionLifetimeLimitSeconds") || !BSON_ITER_HOLDS_NUMBER (&it) ||
              bson_iter_as_int64 (&it) <= 0) {
      store_set_error (error, STORE_ERROR_SERVER, "getParameter answered no transactionLifetimeLimitSeconds");
      ok = false;
   } else {
      *ms = bson_iter_as_int64 (&it) * 1000;
   }
   bson_destroy (&reply);
   bson_destroy (cmd);
   mongoc_client_pool_push (s->pool, client);
   return ok;
}

bool
store_fleet_pending_handlers (store_t *s, char ***names, size_t *n, size_t max, bson_error_t *error)
{
   mongoc_client_t *client = mongoc_client_pool_pop (s->pool);
   mongoc_collection_t *coll = store_coll (s, client, OUTBOX_DELIVERIES);
   /* Without a query the server answers from the handler_created index
    * (one probe per name) instead of reading every pending delivery; a
    * name with only dead deliveries costs one empty retirement batch. */
   bson_t *cmd = BCON_NEW ("distinct", BCON_UTF8 (mongoc_collection_get_name (coll)), "key", BCON_UTF8 ("handler"));
   bson_t reply;
   bson_iter_t it, arr;
   bson_error_t err;
   bool ok;

   *names = NULL;
   *n = 0;
   ok = mongoc_collection_read_command_with_opts (coll, cmd, NULL, NULL, &reply, &err);
   if (!ok) {
      store_set_error (error, STORE_ERROR_SERVER, "handlers with pending deliveries: %s", err.message);
   } else if (bson_iter_init_find (&it, &reply, "values") && BSON_ITER_HOLDS_ARRAY (&it) && bson_iter_recurse (&it, &arr)) {
      size_t cap = 0;

      while (bson_iter_next (&arr) && *n < max) {
         if (!BSON_ITER_HOLDS_UTF8 (&arr))
            continue;
         if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            *names = bson_realloc (*names, cap * sizeof **names);
         }
         (*names)[(*n)++] = bson_strdup (bson_iter_utf8 (&arr, NULL));
      }
   }
   bson_destroy (&reply);
   bson_destroy (cmd);
   mongoc_collection_destroy (coll);
   mongoc_client_pool_push (s->pool, client);
   return ok;
}

bool
store_fleet_retire (store_t *s, const char *handler, const char *reason, int64_t now, size_t batch, size_t *n_buried,
                    bool *more, bson_error_t *error)
{
   mongoc_client_t *client = mongoc_client_pool_pop (s->pool);
   mongoc_collection_t *coll = store_coll (s, client, OUTBOX_DELIVERIES);
   bson_t *q = BCON_NEW ("handler", BCON_UTF8 (handler), "status", BCON_UTF8 ("pending"));
   bson_t *opts = BCON_NEW ("projection", "{", "_id", BCON_INT32 (1), "}", "limit", BCON_INT64 ((int64_t) batch));
   mongoc_cursor_t *cur = mongoc_collection_find_with_opts (coll, q, opts, NULL);
   char (*hex)[25] = bson_malloc0 ((batch ? batch : 1) * sizeof *hex);
   const char **ids = bson_malloc0 ((batch ? batch : 1) * sizeof *ids);
   const bson_t *doc;
   size_t n = 0;
   bool ok = true;

   *n_buried = 0;
   *more = false;
   while (n < batch && mongoc_cursor_next (cur, &doc)) {
      bson_iter_t it;

      if (bson_iter_init_find (&it, doc, "_id") && BSON_ITER_HOLDS_OID (&it)) {
         bson_oid_to_string (bson_iter_oid (&it), hex[n]);
         ids[n] = hex[n];
         n++;
      }
   }
   if (!store_cursor_end (cur, error, "retiring %s", handler))
      ok = false;
   mongoc_collection_destroy (coll);
   mongoc_client_pool_push (s->pool, client);
   if (ok && n > 0) {
      ok = store_bury_ids (s, ids, n, now, reason, n_buried, error);
      *more = ok && n == batch && *n_buried > 0;
   }
   bson_free (ids);
   bson_free (hex);
   bson_destroy (opts);
   bson_destroy (q);
   return ok;
}

/* ------------------------------------------------------------- backfill */

typedef struct {
   const char *handler;
   const char *const *ids;
   size_t n_ids;
   int64_t now;
   size_t added;
} backfill_t;

/* In one transaction: the candidates that still lack the handler get it
 * and a delivery.  A publish adding the handler meanwhile conflicts, and
 * the transaction runs again against what it wrote. */
static bool
backfill_cb (store_txn_t *txn, void *ctx, bson_error_t *error)
{
   backfill_t *b = ctx;
   bson_t q = BSON_INITIALIZER, in, ne, uq = BSON_INITIALIZER, uin;
   bson_t *fopts = NULL, *u = NULL;
   bson_t **docs = bson_malloc0 ((b->n_ids ? b->n_ids : 1) * sizeof *docs);
   size_t n_docs = 0;
   mongoc_cursor_t *cur;
   const bson_t *doc;
   bool ok = true;

   b->added = 0;
   store_append_strs_in (&q, "_id", b->ids, b->n_ids);
   BSON_APPEND_DOCUMENT_BEGIN (&q, "handlers", &ne);
   BSON_APPEND_UTF8 (&ne, "$ne", b->handler);
   bson_append_document_end (&q, &ne);
   fopts = BCON_NEW ("projection", "{", "type", BCON_INT32 (1), "key", BCON_INT32 (1), "sequence", BCON_INT32 (1), OUTBOX_F_NOT_BEFORE, BCON_INT32 (1), "}");
   bson_concat (fopts, &txn->opts);
   cur = mongoc_collection_find_with_opts (txn->coll[OUTBOX_EVENTS], &q, fopts, NULL);
   BSON_APPEND_DOCUMENT_BEGIN (&uq, "_id", &in);
   BSON_APPEND_ARRAY_BEGIN (&in, "$in", &uin);
   while (n_docs < b->n_ids && mongoc_cursor_next (cur, &doc)) {
      const char *id = store_iter_utf8 (doc, "_id");
      const char *type = store_iter_utf8 (doc, "type");
      const char *key = store_iter_utf8 (doc, "key");
      bson_iter_t it;
      bson_oid_t oid;
      bson_t *d;
      char idx[16];
      const char *k;

      if (!id || !type)
         continue;
      bson_uint32_to_string ((uint32_t) n_docs, &k, idx, sizeof idx);
      BSON_APPEND_UTF8 (&uin, k, id);
      d = bson_new ();
      bson_oid_init (&oid, NULL);
      BSON_APPEND_OID (d, "_id", &oid);
      BSON_APPEND_UTF8 (d, OUTBOX_F_EVENT_ID, id);
      BSON_APPEND_UTF8 (d, "handler", b->handler);
      BSON_APPEND_UTF8 (d, OUTBOX_F_EVENT_TYPE, type);
      if (key) {
         BSON_APPEND_UTF8 (d, "key", key);
         if (bson_iter_init_find (&it, doc, "sequence") && BSON_ITER_HOLDS_NUMBER (&it))
            BSON_APPEND_INT64 (d, "sequence", bson_iter_as_int64 (&it));
      }
      BSON_APPEND_INT32 (d, OUTBOX_F_LANE_ID, (int32_t) outbox_lane_id (key, id));
      BSON_APPEND_UTF8 (d, "lane", "ready");
      BSON_APPEND_UTF8 (d, "status", "pending");
      BSON_APPEND_INT32 (d, OUTBOX_F_ATTEMPTS, 0);
      BSON_APPEND_INT32 (d, OUTBOX_F_CLAIMS, 0);
      if (bson_iter_init_find (&it, doc, OUTBOX_F_NOT_BEFORE) && BSON_ITER_HOLDS_DATE_TIME (&it))
         BSON_APPEND_DATE_TIME (d, OUTBOX_F_DUE_AT, bson_iter_date_time (&it));
      else
         BSON_APPEND_DATE_TIME (d, OUTBOX_F_DUE_AT, b->now);
      BSON_APPEND_DATE_TIME (d, OUTBOX_F_CREATED_AT, b->now);
      docs[n_docs++] = d;
   }
   bson_append_array_end (&in, &uin);
   bson_append_document_end (&uq, &in);
   if (mongoc_cursor_error (cur, error))
      ok = false;
   mongoc_cursor_destroy (cur);
   if (!ok || n_docs == 0)
      goto done;
   u = BCON_NEW ("$addToSet", "{", "handlers", BCON_UTF8 (b->handler), "}");
   if (!mongoc_collection_update_many (txn->coll[OUTBOX_EVENTS], &uq, u, &txn->opts, NULL, error) ||
       !mongoc_collection_insert_many (
          txn->coll[OUTBOX_DELIVERIES], (const bson_t **) docs, n_docs, &txn->opts, NULL, error)) {
      ok = false;
      goto done;
   }
   b->added = n_docs;

done:
   for (size_t i = 0; i < n_docs; i++)
      bson_destroy (docs[i]);
   bson_free (docs);
   bson_destroy (u);
   bson_destroy (fopts);
   bson_destroy (&q);
   bson_destroy (&uq);
   return ok;
}

/* Appends the condition on `type` that matches `patterns` (exact, or a
 * prefix ending in '*': an anchored regular expression, its
 * metacharacters escaped); nothing when a pattern is "*" alone. */
static void
backfill_append_types (bson_t *and, const char *key, const char *const *patterns, size_t n)
{
   bson_t cond, or, in, alt, sub;
   uint32_t n_in = 0, n_or = 0;
   char buf[16];
   const char *k;

   for (size_t i = 0; i < n; i++)
      if (!strcmp (patterns[i], "*"))
         return;
   BSON_APPEND_DOCUMENT_BEGIN (and, key, &cond);
   BSON_APPEND_ARRAY_BEGIN (&cond, "$or", &or);
   bson_uint32_to_string (n_or++, &k, buf, sizeof buf);
   BSON_APPEND_DOCUMENT_BEGIN (&or, k, &alt);
   BSON_APPEND_DOCUMENT_BEGIN (&alt, "type", &sub);
   BSON_APPEND_ARRAY_BEGIN (&sub, "$in", &in);
   for (size_t i = 0; i < n; i++) {
      size_t len = strlen (patterns[i]);
      if (len > 0 && patterns[i][len - 1] == '*')
         continue;
      bson_uint32_to_string (n_in++, &k, buf, sizeof buf);
      BSON_APPEND_UTF8 (&in, k, patterns[i]);
   }
   bson_append_array_end (&sub, &in);
   bson_append_document_end (&alt, &sub);
   bson_append_document_end (&or, &alt);
   for (size_t i = 0; i < n; i++) {
      size_t len = strlen (patterns[i]);
      bson_string_t *re;

      if (len == 0 || patterns[i][len - 1] != '*')
         continue;
      re = bson_string_new ("^");
      for (size_t c = 0; c + 1 < len; c++) {
         if (strchr ("\\^$.|?*+()[]{}/-", patterns[i][c]))
            bson_string_append_c (re, '\\');
         bson_string_append_c (re, patterns[i][c]);
      }
      bson_uint32_to_string (n_or++, &k, buf, sizeof buf);
      BSON_APPEND_DOCUMENT_BEGIN (&or, k, &alt);
      BSON_APPEND_DOCUMENT_BEGIN (&alt, "type", &sub);
      BSON_APPEND_UTF8 (&sub, "$regex", re->str);
      bson_append_document_end (&alt, &sub);
      bson_append_document_end (&or, &alt);
      bson_string_free (re, true);
   }
   bson_append_array_end (&cond, &or);
   bson_append_document_end (and, &cond);
}

void
store_backfill_init (store_backfill_t *b, int64_t since, int64_t until, int64_t reach)
{
   memset (b, 0, sizeof *b);
   b->since = since;
   b->until = until;
   b->reach = reach;
}

void
store_backfill_clear (store_backfill_t *b)
{
   if (b && b->have_after)
      bson_value_destroy (&b->after_id);
   if (b)
      b->have_after = false;
}

/* A sweep reads the window's candidates in (createdAt, _id) order from
 * `from` up to `until`, its cursor kept between calls.  An event that
 * becomes visible while a sweep runs may lie behind its cursor, but it
 * was created at most `reach` before it became visible (the window's own
 * argument: docs/outbox-schema.md), so the next sweep starts `reach`
 * before the start of the one before it.  The backfill is done when a
 * sweep that started at or after `until` reached the end. */
bool
store_fleet_backfill (store_t *s,
                      const char *handler,
                      const char *const *patterns,
                      size_t n_patterns,
                      store_backfill_t *bf,
                      int64_t now,
                      size_t *n_added,
                      bson_error_t *error)
{
   mongoc_client_t *client;
   mongoc_collection_t *events;
   char *ids[FLEET_BACKFILL_PAGE];
   bool ok = true;

   *n_added = 0;
   if (bf->done)
      return true;
   if (!bf->in_sweep) {
      int64_t from = bf->sweeps > 0 ? bf->last_sweep_started - bf->reach : bf->since;

      bf->from = from > bf->since ? from : bf->since;
      bf->sweep_started = now;
      bf->in_sweep = true;
      store_backfill_clear (bf);
   }
   client = mongoc_client_pool_pop (s->pool);
   events = store_coll (s, client, OUTBOX_EVENTS);
   for (int page = 0; ok && page < FLEET_BACKFILL_MAX_PAGES; page++) {
      bson_t q = BSON_INITIALIZER, and, c;
      bson_t *opts = BCON_NEW ("projection", "{", "type", BCON_INT32 (1), OUTBOX_F_CREATED_AT, BCON_INT32 (1), "}", "sort",
                               "{", OUTBOX_F_CREATED_AT, BCON_INT32 (1), "_id", BCON_INT32 (1), "}", "limit",
                               BCON_INT64 (FLEET_BACKFILL_PAGE));
      mongoc_cursor_t *cur;
      const bson_t *doc;
      size_t seen = 0, n_ids = 0;
      bson_error_t err;

      /* Bounded on both sides, only the handler's types, past the cursor. */
      BSON_APPEND_ARRAY_BEGIN (&q, "$and", &and);
      BSON_APPEND_DOCUMENT_BEGIN (&and, "0", &c);
      {
         bson_t range;
         BSON_APPEND_DOCUMENT_BEGIN (&c, OUTBOX_F_CREATED_AT, &range);
         BSON_APPEND_DATE_TIME (&range, "$gte", bf->from);
         BSON_APPEND_DATE_TIME (&range, "$lte", bf->until);
         bson_append_document_end (&c, &range);
      }
      bson_append_document_end (&and, &c);
      BSON_APPEND_DOCUMENT_BEGIN (&and, "1", &c);
      {
         bson_t ne;
         BSON_APPEND_DOCUMENT_BEGIN (&c, "handlers", &ne);
         BSON_APPEND_UTF8 (&ne, "$ne", handler);
         bson_append_document_end (&c, &ne);
      }
      bson_append_document_end (&and, &c);
      if (bf->have_after) {
         BSON_APPEND_DOCUMENT_BEGIN (&and, "2", &c);
         store_append_after_key (&c, OUTBOX_F_CREATED_AT, bf->after_created, &bf->after_id);
         bson_append_document_end (&and, &c);
      }
      backfill_append_types (&and, bf->have_after ? "3" : "2", patterns, n_patterns);
      bson_append_array_end (&q, &and);
      cur = mongoc_collection_find_with_opts (events, &q, opts, NULL);
      while (mongoc_cursor_next (cur, &doc)) {
         const char *id = store_iter_utf8 (doc, "_id");
         const char *type = store_iter_utf8 (doc, "type");
         bson_iter_t it;

         seen++;
         if (bson_iter_init_find (&it, doc, "_id")) {
            store_backfill_clear (bf);
            bson_value_copy (bson_iter_value (&it), &bf->after_id);
            bf->after_created = store_iter_date (doc, OUTBOX_F_CREATED_AT);
            bf->have_after = true;
         }
         /* The query's type condition, checked again by the rule itself. */
         if (id && type && config_patterns_match (patterns, n_patterns, type))
            ids[n_ids++] = bson_strdup (id);
      }
      if (!store_cursor_end (cur, error, "backfilling %s", handler))
         ok = false;
      bson_destroy (opts);
      bson_destroy (&q);
      if (ok && n_ids > 0) {
         backfill_t b = {handler, (const char *const *) ids, n_ids, now, 0};

         if (store_with_txn (s, client, backfill_cb, &b, &err))
            *n_added += b.added;
         else {
            store_set_error (error, STORE_ERROR_SERVER, "backfilling %s: %s", handler, err.message);
            ok = false;
         }
      }
      for (size_t i = 0; i < n_ids; i++)
         bson_free (ids[i]);
      bf->read += seen;
      if (ok && seen < FLEET_BACKFILL_PAGE) {
         /* The end of the window: this sweep is complete. */
         bf->in_sweep = false;
         bf->sweeps++;
         bf->last_sweep_started = bf->sweep_started;
         store_backfill_clear (bf);
         bf->done = bf->sweep_started >= bf->until;
         break;
      }
   }
   /* A failed transaction leaves the cursor past events not written:
    * their sweep starts again (the next call), from where it started. */
   if (!ok) {
      bf->in_sweep = false;
      store_backfill_clear (bf);
   }
   mongoc_collection_destroy (events);
   mongoc_client_pool_push (s->pool, client);
   return ok;
}

/* ------------------------------------------------------ handler states */

void
store_handler_states_free (store_handler_state_t *states, size_t n)
{
   for (size_t i = 0; states && i < n; i++) {
      bson_free (states[i].name);
      bson_free (states[i].reason);
   }
   bson_free (states);
}

bool
store_fleet_disable (store_t *s, const char *handler, const char *reason, bool *changed, bson_error_t *error)
{
   mongoc_client_t *client = mongoc_client_pool_pop (s->pool);
   mongoc_collection_t *coll = store_coll (s, client, OUTBOX_HANDLER_STATES);
   bson_t *q = BCON_NEW ("_id", BCON_UTF8 (handler));
   /* $setOnInsert: a handler disabled twice (a 410 from every proxy, an
    * operator after a 410) keeps the first reason and time.  The time is
    * the server's, as every time of the fleet's documents. */
   bson_t *u = BCON_NEW ("$setOnInsert", "{", "state", BCON_UTF8 ("disabled"), "reason", BCON_UTF8 (reason),
                         "by", BCON_UTF8 (s->owner), "}",
                         "$currentDate", "{", OUTBOX_F_DISABLED_AT, BCON_BOOL (true), "}");
   bson_t *opts = BCON_NEW ("upsert", BCON_BOOL (true));
   bson_t reply;
   bson_error_t err;
   bool ok;

   *changed = false;
   ok = mongoc_collection_update_one (coll, q, u, opts, &reply, &err);
   if (ok)
      *changed = store_iter_int64 (&reply, "upsertedCount") > 0;
   else
      store_set_error (error, STORE_ERROR_SERVER, "disabling handler %s: %s", handler, err.message);
   bson_destroy (&reply);
   bson_destroy (opts);
   bson_destroy (u);
   bson_destroy (q);
   mongoc_collection_destroy (coll);
   mongoc_client_pool_push (s->pool, client);
   return ok;
}

bool
store_fleet_enable (store_t *s, const char *handler, bool *changed, bson_error_t *error)
{
   bson_t *q = BCON_NEW ("_id", BCON_UTF8 (handler));
   int64_t n = 0;
   bool ok = store_write (s, OUTBOX_HANDLER_STATES, STORE_WRITE_DELETE_MANY, q, NULL, NULL, &n, "enabling a handler", error);

   *changed = ok && n > 0;
   bson_destroy (q);
   return ok;
}

bool
store_fleet_disabled (store_t *s, store_handler_state_t **states, size_t *n, size_t max, bson_error_t *error)
{
   mongoc_client_t *client = mongoc_client_pool_pop (s->pool);
   mongoc_collection_t *coll = store_coll (s, client, OUTBOX_HANDLER_STATES);
   bson_t q = BSON_INITIALIZER;
   bson_t *opts = BCON_NEW ("sort", "{", "_id", BCON_INT32 (1), "}", "limit", BCON_INT64 ((int64_t) max));
   mongoc_cursor_t *cur = mongoc_collection_find_with_opts (coll, &q, opts, NULL);
   const bson_t *doc;
   bson_error_t err;
   bool ok = true;

   *states = bson_malloc0 ((max ? max : 1) * sizeof **states);
   *n = 0;
   while (*n < max && mongoc_cursor_next (cur, &doc)) {
      bson_iter_t it;
      store_handler_state_t *st = &(*states)[*n];

      if (!bson_iter_init_find (&it, doc, "_id") || !BSON_ITER_HOLDS_UTF8 (&it))
         continue; /* not one of ours */
      st->name = bson_strdup (bson_iter_utf8 (&it, NULL));
      st->reason = bson_strdup (bson_iter_init_find (&it, doc, "reason") && BSON_ITER_HOLDS_UTF8 (&it)
                                   ? bson_iter_utf8 (&it, NULL)
                                   : "operator");
      st->at = bson_iter_init_find (&it, doc, OUTBOX_F_DISABLED_AT) && BSON_ITER_HOLDS_DATE_TIME (&it) ? bson_iter_date_time (&it) : 0;
      (*n)++;
   }
   if (mongoc_cursor_error (cur, &err)) {
      store_set_error (error, STORE_ERROR_SERVER, "reading the disabled handlers: %s", err.message);
      store_handler_states_free (*states, *n);
      *states = NULL;
      *n = 0;
      ok = false;
   }
   mongoc_cursor_destroy (cur);
   bson_destroy (opts);
   bson_destroy (&q);
   mongoc_collection_destroy (coll);
   mongoc_client_pool_push (s->pool, client);
   return ok;
}

/* ------------------------------------------- lanes an old version left */

typedef struct {
   store_t *s;
   int32_t lane_doc;
   int64_t epoch, now;
   size_t charged;
   bool released;
   store_attempt_docs_t recs;
} old_lane_t;

/* In one transaction: the lane document still at the epoch read; its
 * listed deliveries (inFlight, and lost ones not charged for their epoch
 * yet) that are pending and that no lane of their handler's space lists
 * in flight (a claimer of this version runs those) are charged one
 * attempt and their claim generation moves on; the lane is emptied and
 * handed back with a new epoch.  The handler-space lanes read are
 * written (operatorWrites), so a claim recording one of the deliveries
 * meanwhile conflicts with the transaction, as with an operator bury. */
static bool
old_lane_cb (store_txn_t *txn, void *ctx, bson_error_t *error)
{
   old_lane_t *o = ctx;
   /* Its lease run out, read again in the transaction: an old proxy that
    * renewed it since (a renewal keeps the epoch) keeps it. */
   bson_t *lq = BCON_NEW ("_id", BCON_INT32 (o->lane_doc), OUTBOX_F_EPOCH, BCON_INT64 (o->epoch), "$or", "[", "{",
                          OUTBOX_F_LEASE_EXPIRES_AT, "{", "$lte", BCON_DATE_TIME (o->now), "}", "}", "{",
                          OUTBOX_F_LEASE_EXPIRES_AT, BCON_NULL, "}", "]");
   bson_t dq = BSON_INITIALIZER, hq = BSON_INITIALIZER, cq = BSON_INITIALIZER, hin, hid;
   bson_t *fopts = NULL, *u = NULL, *hu = NULL, *lu = NULL, reply;
   store_oids_t listed = {0}, lost = {0}, charge = {0}, running = {0};
   int64_t *lost_epochs = NULL;
   uint32_t n_h = 0;
   mongoc_cursor_t *cur;
   const bson_t *doc;
   bson_t *lane = NULL;
   bool ok = true;

   o->charged = 0;
   o->released = false;
   store_attempt_docs_free (&o->recs);
   cur = mongoc_collection_find_with_opts (txn->coll[OUTBOX_LANES_COLL], lq, &txn->opts, NULL);
   if (mongoc_cursor_next (cur, &doc))
      lane = bson_copy (doc);
   if (mongoc_cursor_error (cur, error))
      ok = false;
   mongoc_cursor_destroy (cur);
   if (!ok || !lane)
      goto done; /* taken or changed since: not ours to release */
   store_oids_from_array (&listed, lane, OUTBOX_F_IN_FLIGHT);
   store_oids_from_array (&lost, lane, "lost");
   if (lost.n > 0) {
      bson_iter_t it, child;
      size_t k = 0;

      lost_epochs = bson_malloc0 (lost.n * sizeof *lost_epochs);
      for (size_t i = 0; i < lost.n; i++)
         lost_epochs[i] = o->epoch - 1; /* a lane without lostEpochs: lost under the epoch before */
      if (bson_iter_init_find (&it, lane, OUTBOX_F_LOST_EPOCHS) && BSON_ITER_HOLDS_ARRAY (&it) && bson_iter_recurse (&it, &child))
         while (bson_iter_next (&child) && k < lost.n)
            if (BSON_ITER_HOLDS_NUMBER (&child))
               lost_epochs[k++] = bson_iter_as_int64 (&child);
   }
   {
      store_oids_t all = {0};
      for (size_t i = 0; i < listed.n; i++)
         store_oids_push (&all, &listed.v[i]);
      for (size_t i = 0; i < lost.n; i++)
         if (!store_oids_has (&all, &lost.v[i]))
            store_oids_push (&all, &lost.v[i]);
      store_append_oids_op (&dq, "_id", "$in", all.v, all.n);
      store_oids_free (&all);
   }
   BSON_APPEND_UTF8 (&dq, "status", "pending");
   fopts = BCON_NEW ("projection", "{", OUTBOX_F_LANE_ID, BCON_INT32 (1), "handler", BCON_INT32 (1), OUTBOX_F_EVENT_ID, BCON_INT32 (1),
                     OUTBOX_F_ATTEMPTS, BCON_INT32 (1), OUTBOX_F_LOST_AT, BCON_INT32 (1), "}");
   bson_concat (fopts, &txn->opts);
   BSON_APPEND_DOCUMENT_BEGIN (&hq, "_id", &hid);
   BSON_APPEND_ARRAY_BEGIN (&hid, "$in", &hin);
   cur = mongoc_collection_find_with_opts (txn->coll[OUTBOX_DELIVERIES], &dq, fopts, NULL);
   while (mongoc_cursor_next (cur, &doc)) {
      bson_iter_t it;
      const char *handler = store_iter_utf8 (doc, "handler");
      int64_t lane_id = store_iter_int64 (doc, OUTBOX_F_LANE_ID);
      bool take = false;

      if (!bson_iter_init_find (&it, doc, "_id") || !BSON_ITER_HOLDS_OID (&it))
         continue;
      if (store_oids_has (&listed, bson_iter_oid (&it)))
         take = true;
      for (size_t i = 0; !take && i < lost.n; i++)
         if (bson_oid_equal (&lost.v[i], bson_iter_oid (&it))) {
            bson_iter_t la;
            /* A lost claim is charged once for its epoch (lostAt). */
            take = !bson_iter_init_find (&la, doc, OUTBOX_F_LOST_AT) || !BSON_ITER_HOLDS_NUMBER (&la) ||
                   bson_iter_as_int64 (&la) < lost_epochs[i];
         }
      if (!take)
         continue;
      store_oids_push (&charge, bson_iter_oid (&it));
      if (handler && lane_id >= 0 && lane_id < OUTBOX_LANES) {
         char buf[16];
         const char *k;

         bson_uint32_to_string (n_h++, &k, buf, sizeof buf);
         BSON_APPEND_INT32 (&hin, k, outbox_lane_doc_id (outbox_lane_space_of (handler), (uint32_t) lane_id));
      }
      if (store_attempts_on (o->s)) {
         store_attempt_t a = {.handler = handler,
                              .outcome = OUTBOX_ATTEMPT_LEASE_LOST,
                              .attempt = (int32_t) store_iter_int64 (doc, OUTBOX_F_ATTEMPTS) + 1,
                              .duration_ms = -1,
                              .error = "the claim was lost: a proxy before 0.2.0 stopped renewing its lease"};
         bson_oid_init (&a.id, NULL);
         store_attempt_docs_add (o->s, &o->recs, bson_iter_oid (&it), store_iter_utf8 (doc, OUTBOX_F_EVENT_ID), &a, o->now);
      }
   }
   if (mongoc_cursor_error (cur, error))
      ok = false;
   mongoc_cursor_destroy (cur);
   bson_append_array_end (&hid, &hin);
   bson_append_document_end (&hq, &hid);
   if (!ok)
      goto done;
   if (n_h > 0) {
      /* What a claimer of this version runs now is its own. */
      cur = mongoc_collection_find_with_opts (txn->coll[OUTBOX_LANES_COLL], &hq, &txn->opts, NULL);
      while (mongoc_cursor_next (cur, &doc))
         store_oids_from_array (&running, doc, OUTBOX_F_IN_FLIGHT);
      if (mongoc_cursor_error (cur, error))
         ok = false;
      mongoc_cursor_destroy (cur);
      hu = BCON_NEW ("$inc", "{", OUTBOX_F_OPERATOR_WRITES, BCON_INT64 (1), "}");
      if (ok && !mongoc_collection_update_many (txn->coll[OUTBOX_LANES_COLL], &hq, hu, &txn->opts, NULL, error))
         ok = false;
      if (!ok)
         goto done;
   }
   {
      store_oids_t keep = {0};
      for (size_t i = 0; i < charge.n; i++)
         if (!store_oids_has (&running, &charge.v[i]))
            store_oids_push (&keep, &charge.v[i]);
      store_oids_free (&charge);
      charge = keep;
   }
   if (charge.n > 0) {
      store_append_oids_op (&cq, "_id", "$in", charge.v, charge.n);
      BSON_APPEND_UTF8 (&cq, "status", "pending");
      u = BCON_NEW ("$inc", "{", OUTBOX_F_ATTEMPTS, BCON_INT32 (1), OUTBOX_F_CLAIMS, BCON_INT32 (1), "}", "$set", "{",
                    OUTBOX_F_UPDATED_AT, BCON_DATE_TIME (o->now), "}");
      if (!mongoc_collection_update_many (txn->coll[OUTBOX_DELIVERIES], &cq, u, &txn->opts, &reply, error)) {
         bson_destroy (&reply); /* initialised on failure too */
         ok = false;
         goto done;
      }
      o->charged = (size_t) store_iter_int64 (&reply, "modifiedCount");
      bson_destroy (&reply);
   }
   if (o->recs.n > 0) {
      /* The records of those charged only. */
      store_attempt_docs_t mine = {0};
      for (size_t i = 0; i < o->recs.n; i++) {
         bson_iter_t d;
         if (bson_iter_init_find (&d, o->recs.v[i], OUTBOX_F_DELIVERY_ID) && BSON_ITER_HOLDS_OID (&d) &&
             store_oids_has (&charge, bson_iter_oid (&d))) {
            if (mine.n == mine.cap) {
               mine.cap = mine.cap ? mine.cap * 2 : 8;
               mine.v = bson_realloc (mine.v, mine.cap * sizeof *mine.v);
            }
            mine.v[mine.n++] = o->recs.v[i];
         }
      }
      ok = store_attempt_docs_insert (o->s, txn->coll[OUTBOX_ATTEMPTS], &mine, &txn->opts, error);
      bson_free (mine.v); /* the documents are o->recs' */
      if (!ok)
         goto done;
   }
   lu = BCON_NEW ("$set", "{", "owner", BCON_NULL, OUTBOX_F_LEASE_EXPIRES_AT, BCON_NULL, OUTBOX_F_IN_FLIGHT, "[", "]", "lost", "[", "]",
                  OUTBOX_F_LOST_EPOCHS, "[", "]", "}", "$inc", "{", OUTBOX_F_EPOCH, BCON_INT64 (1), "}");
   if (!mongoc_collection_update_one (txn->coll[OUTBOX_LANES_COLL], lq, lu, &txn->opts, NULL, error))
      ok = false;
   o->released = ok;

done:
   bson_free (lost_epochs);
   bson_destroy (lane);
   bson_destroy (lq);
   bson_destroy (fopts);
   bson_destroy (u);
   bson_destroy (hu);
   bson_destroy (lu);
   bson_destroy (&dq);
   bson_destroy (&hq);
   bson_destroy (&cq);
   store_oids_free (&listed);
   store_oids_free (&lost);
   store_oids_free (&charge);
   store_oids_free (&running);
   return ok;
}

bool
store_fleet_release_old_lanes (store_t *s, int64_t now, size_t *n_lanes, size_t *n_charged, bson_error_t *error)
{
   mongoc_client_t *client = mongoc_client_pool_pop (s->pool);
   mongoc_collection_t *coll = store_coll (s, client, OUTBOX_LANES_COLL);
   /* The fixed spaces' documents that list anything (no claimer of this
    * version writes them). */
   bson_t *q = BCON_NEW ("_id", "{", "$gte", BCON_INT32 (0), "$lt", BCON_INT32 (OUTBOX_LANE_DOCS), "}", "$or", "[", "{",
                         OUTBOX_F_IN_FLIGHT ".0", "{", "$exists", BCON_BOOL (true), "}", "}", "{", "lost.0", "{", "$exists",
                         BCON_BOOL (true), "}", "}", "]");
   bson_t *opts = BCON_NEW ("projection", "{", OUTBOX_F_EPOCH, BCON_INT32 (1), OUTBOX_F_LEASE_EXPIRES_AT, BCON_INT32 (1), "}");
   mongoc_cursor_t *cur = mongoc_collection_find_with_opts (coll, q, opts, NULL);
   int32_t ids[OUTBOX_LANE_DOCS];
   int64_t epochs[OUTBOX_LANE_DOCS];
   size_t n = 0;
   const bson_t *doc;
   bool ok;

   *n_lanes = 0;
   *n_charged = 0;
   while (n < OUTBOX_LANE_DOCS && mongoc_cursor_next (cur, &doc)) {
      bson_iter_t it;
      int64_t expires = store_iter_date (doc, OUTBOX_F_LEASE_EXPIRES_AT);

      /* A lease still running (on its owner's clock) is left to expire. */
      if (!bson_iter_init_find (&it, doc, "_id") || !BSON_ITER_HOLDS_NUMBER (&it) || expires > now)
         continue;
      ids[n] = (int32_t) bson_iter_as_int64 (&it);
      epochs[n++] = store_iter_int64 (doc, OUTBOX_F_EPOCH);
   }
   ok = store_cursor_end (cur, error, "reading the lanes of the fixed spaces");
   bson_destroy (opts);
   bson_destroy (q);
   mongoc_collection_destroy (coll);
   for (size_t i = 0; ok && i < n; i++) {
      old_lane_t o = {.s = s, .lane_doc = ids[i], .epoch = epochs[i], .now = now};
      bson_error_t err;

      ok = store_with_txn (s, client, old_lane_cb, &o, &err);
      store_attempt_docs_free (&o.recs);
      if (!ok) {
         store_set_error (error, STORE_ERROR_SERVER, "releasing lane document %d: %s", (int) ids[i], err.message);
         break;
      }
      *n_lanes += o.released;
      *n_charged += o.charged;
   }
   mongoc_client_pool_push (s->pool, client);
   return ok;
}
