/*
 * store/setup.c - setup: the collections created explicitly, the indexes
 * created idempotently and the lane documents of every lane space seeded
 * (store_setup in store/store.h): an outbox set up with the first
 * version's 256 gains the pull space's 256 at the next start.
 *
 * Collections are created explicitly because collections created
 * implicitly inside concurrent transactions conflict with each other.  It
 * does not upgrade databases of the Node.js package's 0.1.0 layout: this
 * project never wrote one.
 */
#include "store/store.h"
#include "store/store_private.h"

#include <string.h>

#include "base/log.h"
#include "base/outbox.h"

static bool
create_collection (store_t *s, mongoc_database_t *db, const char *name, bson_error_t *error)
{
   mongoc_collection_t *coll;
   bson_error_t err;

   coll = mongoc_database_create_collection (db, name, NULL, &err);
   if (coll) {
      mongoc_collection_destroy (coll);
      return true;
   }
   if (err.code == STORE_SERVER_NAMESPACE_EXISTS || strstr (err.message, "already exists"))
      return true;
   store_set_error (error, STORE_ERROR_SERVER, "create %s.%s: %s", s->database, name, err.message);
   return false;
}

/* One index: name, keys, optional partial filter. */
typedef struct {
   outbox_collection_t coll;
   const char *name;
   bson_t *keys;
   bson_t *partial;
   bool unique;
} index_spec_t;

static bool
create_indexes (store_t *s, mongoc_database_t *db, outbox_collection_t which, index_spec_t *specs, size_t n, bson_error_t *error)
{
   bson_t cmd = BSON_INITIALIZER, arr, doc, reply;
   bson_error_t err;
   bool ok;
   int k = 0;

   BSON_APPEND_UTF8 (&cmd, "createIndexes", s->names[which]);
   BSON_APPEND_ARRAY_BEGIN (&cmd, "indexes", &arr);
   for (size_t i = 0; i < n; i++) {
      char idx[16];
      const char *key;
      if (specs[i].coll != which)
         continue;
      bson_uint32_to_string ((uint32_t) k++, &key, idx, sizeof idx);
      BSON_APPEND_DOCUMENT_BEGIN (&arr, key, &doc);
      BSON_APPEND_DOCUMENT (&doc, "key", specs[i].keys);
      BSON_APPEND_UTF8 (&doc, "name", specs[i].name);
      if (specs[i].unique)
         BSON_APPEND_BOOL (&doc, "unique", true);
      if (specs[i].partial)
         BSON_APPEND_DOCUMENT (&doc, "partialFilterExpression", specs[i].partial);
      bson_append_document_end (&arr, &doc);
   }
   bson_append_array_end (&cmd, &arr);
   {
      mongoc_write_concern_t *wc = mongoc_write_concern_new ();
      bson_t opts = BSON_INITIALIZER;
      mongoc_write_concern_set_w (wc, MONGOC_WRITE_CONCERN_W_MAJORITY);
      mongoc_write_concern_append (wc, &opts);
      ok = mongoc_database_write_command_with_opts (db, &cmd, &opts, &reply, &err);
      mongoc_write_concern_destroy (wc);
      bson_destroy (&opts);
   }
   if (!ok)
      store_set_error (error, STORE_ERROR_SERVER, "createIndexes on %s: %s", s->names[which], err.message);
   bson_destroy (&reply);
   bson_destroy (&cmd);
   return ok;
}

bool
store_setup (store_t *s, bson_error_t *error)
{
   mongoc_client_t *client = mongoc_client_pool_pop (s->pool);
   mongoc_database_t *db = mongoc_client_get_database (client, s->database);
   mongoc_collection_t *lanes = NULL;
   mongoc_bulk_operation_t *bulk = NULL;
   bson_t reply;
   bson_error_t err;
   bool ok = false;
   index_spec_t specs[] = {
      {OUTBOX_DELIVERIES, "event_handler", BCON_NEW (OUTBOX_F_EVENT_ID, BCON_INT32 (1), "handler", BCON_INT32 (1)), NULL, true},
      {OUTBOX_DELIVERIES,
       "claim",
       BCON_NEW (OUTBOX_F_LANE_ID, BCON_INT32 (1), OUTBOX_F_DUE_AT, BCON_INT32 (1), "_id", BCON_INT32 (1), "handler", BCON_INT32 (1)),
       BCON_NEW ("lane", BCON_UTF8 ("ready")),
       false},
      {OUTBOX_DELIVERIES,
       "ordering",
       BCON_NEW ("handler", BCON_INT32 (1), "key", BCON_INT32 (1), "sequence", BCON_INT32 (1)),
       BCON_NEW ("status", BCON_UTF8 ("pending"), "sequence", "{", "$exists", BCON_BOOL (true), "}"),
       false},
      {OUTBOX_DELIVERIES,
       "parked",
       BCON_NEW ("handler", BCON_INT32 (1), "key", BCON_INT32 (1), "sequence", BCON_INT32 (1), "lane", BCON_INT32 (1)),
       BCON_NEW ("lane", BCON_UTF8 ("parked")),
       false},
      {OUTBOX_DELIVERIES, "due", BCON_NEW (OUTBOX_F_DUE_AT, BCON_INT32 (1)), BCON_NEW ("status", BCON_UTF8 ("pending")), false},
      {OUTBOX_DELIVERIES, "status_created", BCON_NEW ("status", BCON_INT32 (1), OUTBOX_F_CREATED_AT, BCON_INT32 (1)), NULL, false},
      {OUTBOX_DELIVERIES, "status_updated", BCON_NEW ("status", BCON_INT32 (1), OUTBOX_F_UPDATED_AT, BCON_INT32 (1)), NULL, false},
      {OUTBOX_DELIVERIES, "handler_created", BCON_NEW ("handler", BCON_INT32 (1), OUTBOX_F_CREATED_AT, BCON_INT32 (1)), NULL, false},
      {OUTBOX_DELIVERIES, "type_created", BCON_NEW (OUTBOX_F_EVENT_TYPE, BCON_INT32 (1), OUTBOX_F_CREATED_AT, BCON_INT32 (1)), NULL, false},
      {OUTBOX_EVENTS, "created", BCON_NEW (OUTBOX_F_CREATED_AT, BCON_INT32 (1), "_id", BCON_INT32 (1)), NULL, false},
      {OUTBOX_COMPLETED, "completed", BCON_NEW (OUTBOX_F_COMPLETED_AT, BCON_INT32 (1), "_id", BCON_INT32 (1)), NULL, false},
      {OUTBOX_COMPLETED, "event", BCON_NEW (OUTBOX_F_EVENT_ID, BCON_INT32 (1)), NULL, false},
      {OUTBOX_COMPLETED, "created", BCON_NEW (OUTBOX_F_CREATED_AT, BCON_INT32 (1), "_id", BCON_INT32 (1)), NULL, false},
   };
   const size_t n_specs = sizeof specs / sizeof specs[0];

   for (int c = 0; c < OUTBOX_N_COLLECTIONS; c++) {
      if (c == OUTBOX_COMPLETED && !s->completion_history)
         continue;
      if (!create_collection (s, db, s->names[c], error))
         goto done;
   }
   if (!create_indexes (s, db, OUTBOX_DELIVERIES, specs, n_specs, error) ||
       !create_indexes (s, db, OUTBOX_EVENTS, specs, n_specs, error))
      goto done;
   if (s->completion_history && !create_indexes (s, db, OUTBOX_COMPLETED, specs, n_specs, error))
      goto done;

   /* The lanes of every space: upserts that only insert, so a second
    * setup (or a running fleet) changes nothing, and an outbox set up
    * before the pull space existed keeps its 256 lanes (the dispatch
    * space's) as they are and gains the pull space's. */
   lanes = store_coll (s, client, OUTBOX_LANES_COLL);
   bulk = mongoc_collection_create_bulk_operation_with_opts (lanes, NULL);
   for (int32_t i = 0; i < OUTBOX_LANE_DOCS; i++) {
      bson_t *sel = BCON_NEW ("_id", BCON_INT32 (i));
      bson_t *upd = BCON_NEW ("$setOnInsert", "{", "owner", BCON_NULL, OUTBOX_F_LEASE_EXPIRES_AT, BCON_NULL, OUTBOX_F_EPOCH,
                              BCON_INT64 (0), OUTBOX_F_IN_FLIGHT, "[", "]", "lost", "[", "]", "}");
      bson_t *opts = BCON_NEW ("upsert", BCON_BOOL (true));
      ok = mongoc_bulk_operation_update_one_with_opts (bulk, sel, upd, opts, &err);
      bson_destroy (sel);
      bson_destroy (upd);
      bson_destroy (opts);
      if (!ok) {
         store_set_error (error, STORE_ERROR_SERVER, "seeding lanes: %s", err.message);
         goto done;
      }
   }
   ok = mongoc_bulk_operation_execute (bulk, &reply, &err) != 0;
   bson_destroy (&reply);
   if (!ok) {
      store_set_error (error, STORE_ERROR_SERVER, "seeding lanes: %s", err.message);
      goto done;
   }
   log_info ("store: set up %s.%s, %s, %s, %s (completion history %s)",
             s->database,
             s->names[OUTBOX_EVENTS],
             s->names[OUTBOX_DELIVERIES],
             s->names[OUTBOX_KEY_SEQUENCES],
             s->names[OUTBOX_LANES_COLL],
             s->completion_history ? "on" : "off");

done:
   for (size_t i = 0; i < n_specs; i++) {
      bson_destroy (specs[i].keys);
      bson_destroy (specs[i].partial);
   }
   mongoc_bulk_operation_destroy (bulk);
   mongoc_collection_destroy (lanes);
   mongoc_database_destroy (db);
   mongoc_client_pool_push (s->pool, client);
   return ok;
}
