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
 *
 * On a sharded cluster (the upstream is a mongos, [outbox]
 * shard_collections) it shards the collections that grow with the traffic,
 * on the keys of shard_keys below; the small ones stay on the database's
 * primary shard.  It does not move data: an outbox that already holds
 * documents unsharded stays so (a warning says how to shard it by hand).
 */
#include "store/store.h"
#include "store/store_private.h"

#include <inttypes.h>
#include <string.h>

#include "base/log.h"
#include "base/outbox.h"

/* The shard key of each collection that grows with the traffic: one hashed
 * field, the event's id, so that an event and its deliveries (and their
 * completion records) hash alike and a publish adds one outbox shard to
 * its transaction.  Every unique index starts with it (deliveries'
 * event_handler is {eventId, handler}), every upsert and findAndModify of
 * these collections names it by equality (events and key_sequences by
 * _id), and every updateOne of a delivery names its _id, which mongos
 * routes to the shard holding it.  The lanes, the fleet's handlers and the
 * disabled handlers stay unsharded: a few hundred documents that every
 * claim and heartbeat reads, which one shard keeps in one place.
 * docs/outbox-schema.md gives the cost of a claim per shard. */
static const struct {
   outbox_collection_t coll;
   const char *field;
} shard_keys[] = {
   {OUTBOX_EVENTS, "_id"},
   {OUTBOX_DELIVERIES, "eventId"},
   {OUTBOX_KEY_SEQUENCES, "_id"},
   {OUTBOX_COMPLETED, "eventId"},
   {OUTBOX_ATTEMPTS, "eventId"},
};

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

/* One index: name, keys, optional partial filter, TTL (expireAfterSeconds;
 * 0: none). */
typedef struct {
   outbox_collection_t coll;
   const char *name;
   bson_t *keys;
   bson_t *partial;
   bool unique;
   int64_t ttl_s;
} index_spec_t;

/* Creates the indexes of `which` among specs[0..n), but the one named
 * `skip` (NULL: none). */
static bool
create_indexes_but (store_t *s, mongoc_database_t *db, outbox_collection_t which, index_spec_t *specs, size_t n, const char *skip,
                    bson_error_t *error)
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
      if (specs[i].coll != which || (skip && strcmp (specs[i].name, skip) == 0))
         continue;
      bson_uint32_to_string ((uint32_t) k++, &key, idx, sizeof idx);
      BSON_APPEND_DOCUMENT_BEGIN (&arr, key, &doc);
      BSON_APPEND_DOCUMENT (&doc, "key", specs[i].keys);
      BSON_APPEND_UTF8 (&doc, "name", specs[i].name);
      if (specs[i].unique)
         BSON_APPEND_BOOL (&doc, "unique", true);
      if (specs[i].partial)
         BSON_APPEND_DOCUMENT (&doc, "partialFilterExpression", specs[i].partial);
      if (specs[i].ttl_s > 0)
         BSON_APPEND_INT64 (&doc, "expireAfterSeconds", specs[i].ttl_s);
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

static bool
create_indexes (store_t *s, mongoc_database_t *db, outbox_collection_t which, index_spec_t *specs, size_t n, bson_error_t *error)
{
   return create_indexes_but (s, db, which, specs, n, NULL, error);
}

/* The attempt records' indexes, and the window of their TTL index
 * ([outbox] attempt_history): created when it is missing; a window that
 * differs (another value at this start, or another proxy's) is changed
 * with collMod, which keeps the index (createIndexes would refuse an
 * index of the same name with another expireAfterSeconds, 85
 * IndexOptionsConflict).  The proxy started last sets the window. */
static bool
setup_attempts (store_t *s, mongoc_database_t *db, index_spec_t *specs, size_t n, bson_error_t *error)
{
   mongoc_collection_t *coll = mongoc_database_get_collection (db, s->names[OUTBOX_ATTEMPTS]);
   mongoc_cursor_t *cur = mongoc_collection_find_indexes_with_opts (coll, NULL);
   const bson_t *doc;
   const char *ttl_name = NULL;
   int64_t want = 0, have = -1;
   bson_error_t err;
   bool ok;

   for (size_t i = 0; i < n; i++)
      if (specs[i].coll == OUTBOX_ATTEMPTS && specs[i].ttl_s > 0) {
         ttl_name = specs[i].name;
         want = specs[i].ttl_s;
      }
   while (mongoc_cursor_next (cur, &doc)) {
      const char *name = store_iter_utf8 (doc, "name");
      bson_iter_t it;
      if (name && ttl_name && strcmp (name, ttl_name) == 0)
         have = bson_iter_init_find (&it, doc, "expireAfterSeconds") && BSON_ITER_HOLDS_NUMBER (&it) ? bson_iter_as_int64 (&it) : 0;
   }
   ok = store_cursor_end (cur, error, "listIndexes on %s", s->names[OUTBOX_ATTEMPTS]);
   mongoc_collection_destroy (coll);
   if (!ok)
      return false;
   if (!create_indexes_but (s, db, OUTBOX_ATTEMPTS, specs, n, have >= 0 ? ttl_name : NULL, error))
      return false;
   if (have >= 0 && have != want) {
      bson_t *cmd = BCON_NEW ("collMod", BCON_UTF8 (s->names[OUTBOX_ATTEMPTS]), "index", "{", "name", BCON_UTF8 (ttl_name),
                              "expireAfterSeconds", BCON_INT64 (want), "}");
      bson_t reply;

      ok = mongoc_database_command_simple (db, cmd, NULL, &reply, &err);
      bson_destroy (&reply);
      bson_destroy (cmd);
      if (!ok) {
         store_set_error (error, STORE_ERROR_SERVER, "collMod on %s (the TTL of attempt records): %s", s->names[OUTBOX_ATTEMPTS],
                          err.message);
         return false;
      }
      log_info ("store: attempt records are now kept %" PRId64 " s ([outbox] attempt_history), not %" PRId64 " s", want, have);
   }
   return true;
}

/* Whether the upstream is a mongos: its hello says "isdbgrid". */
static bool
setup_is_mongos (mongoc_client_t *client, bool *mongos, bson_error_t *error)
{
   bson_t *cmd = BCON_NEW ("hello", BCON_INT32 (1));
   bson_t reply;
   bson_error_t err;
   bson_iter_t it;
   bool ok;

   *mongos = false;
   ok = mongoc_client_command_simple (client, "admin", cmd, NULL, &reply, &err);
   if (ok)
      *mongos = bson_iter_init_find (&it, &reply, "msg") && BSON_ITER_HOLDS_UTF8 (&it) &&
                strcmp (bson_iter_utf8 (&it, NULL), "isdbgrid") == 0;
   else
      store_set_error (error, STORE_ERROR_SERVER, "hello: %s", err.message);
   bson_destroy (&reply);
   bson_destroy (cmd);
   return ok;
}

/* One admin command whose failure is reported, not returned: sharding is
 * an optimisation, and an outbox left unsharded still works. */
static bool
setup_admin_command (mongoc_client_t *client, bson_t *cmd, bson_error_t *err)
{
   bson_t reply;
   bool ok = mongoc_client_command_simple (client, "admin", cmd, NULL, &reply, err);

   bson_destroy (&reply);
   bson_destroy (cmd);
   return ok;
}

/* Shards the collections of shard_keys when the upstream is a mongos
 * (and [outbox] shard_collections allows it).  Fails only when the
 * upstream cannot say what it is. */
static bool
setup_shard (store_t *s, mongoc_client_t *client, bson_error_t *error)
{
   bson_error_t err;
   bool mongos;

   if (s->shard == CONFIG_SHARD_OFF)
      return true;
   if (!setup_is_mongos (client, &mongos, error))
      return false;
   if (!mongos) {
      if (s->shard == CONFIG_SHARD_ON)
         log_warn ("store: [outbox] shard_collections = on, but the upstream is not a mongos: nothing to shard");
      return true;
   }
   if (!setup_admin_command (client, BCON_NEW ("enableSharding", BCON_UTF8 (s->database)), &err)) {
      log_warn ("store: enableSharding %s: %s; the outbox collections stay unsharded", s->database, err.message);
      return true;
   }
   for (size_t i = 0; i < sizeof shard_keys / sizeof shard_keys[0]; i++) {
      char ns[OUTBOX_NAME_MAX + 128];

      if ((shard_keys[i].coll == OUTBOX_COMPLETED && !s->completion_history) ||
          (shard_keys[i].coll == OUTBOX_ATTEMPTS && !store_attempts_on (s)))
         continue;
      bson_snprintf (ns, sizeof ns, "%s.%s", s->database, s->names[shard_keys[i].coll]);
      /* Sharding a collection again on the same key is a no-op; on another
       * key, or one that has documents but no index on the key, it fails. */
      if (setup_admin_command (client,
                               BCON_NEW ("shardCollection", BCON_UTF8 (ns), "key", "{", shard_keys[i].field,
                                         BCON_UTF8 ("hashed"), "}"),
                               &err))
         log_info ("store: %s is sharded on {%s: \"hashed\"}", ns, shard_keys[i].field);
      else
         log_warn ("store: %s stays unsharded: shardCollection on {%s: \"hashed\"}: %s (docs/outbox-schema.md: "
                   "sharding an outbox that has documents)",
                   ns,
                   shard_keys[i].field,
                   err.message);
   }
   return true;
}

/* Upserts that only insert the lane documents _id first .. first + n - 1
 * (a free lane at epoch 0; `handler`, when not NULL, names the handler
 * whose space they are, for the operator's views).  One bulk write. */
static bool
seed_lanes (store_t *s, mongoc_client_t *client, int32_t first, int32_t n, const char *handler, bson_error_t *error)
{
   mongoc_collection_t *lanes = store_coll (s, client, OUTBOX_LANES_COLL);
   mongoc_bulk_operation_t *bulk = mongoc_collection_create_bulk_operation_with_opts (lanes, NULL);
   bson_t *opts = BCON_NEW ("upsert", BCON_BOOL (true));
   bson_t reply;
   bson_error_t err;
   bool ok = true;

   for (int32_t i = first; ok && i < first + n; i++) {
      bson_t *sel = BCON_NEW ("_id", BCON_INT32 (i));
      bson_t *upd = bson_new (), set, empty = BSON_INITIALIZER;
      BSON_APPEND_DOCUMENT_BEGIN (upd, "$setOnInsert", &set);
      BSON_APPEND_NULL (&set, "owner");
      BSON_APPEND_NULL (&set, OUTBOX_F_LEASE_EXPIRES_AT);
      BSON_APPEND_INT64 (&set, OUTBOX_F_EPOCH, 0);
      BSON_APPEND_ARRAY (&set, OUTBOX_F_IN_FLIGHT, &empty);
      BSON_APPEND_ARRAY (&set, "lost", &empty);
      if (handler)
         BSON_APPEND_UTF8 (&set, "handler", handler);
      bson_append_document_end (upd, &set);
      ok = mongoc_bulk_operation_update_one_with_opts (bulk, sel, upd, opts, &err);
      bson_destroy (sel);
      bson_destroy (upd);
   }
   if (ok) {
      ok = mongoc_bulk_operation_execute (bulk, &reply, &err) != 0;
      bson_destroy (&reply);
   }
   if (!ok)
      store_set_error (error, STORE_ERROR_SERVER, "seeding lanes: %s", err.message);
   bson_destroy (opts);
   mongoc_bulk_operation_destroy (bulk);
   mongoc_collection_destroy (lanes);
   return ok;
}

bool
store_setup_space (store_t *s, bson_error_t *error)
{
   mongoc_client_t *client;
   bool ok = true;

   pthread_mutex_lock (&s->claim_mu);
   if (!s->space_ready && s->space_handler) {
      client = mongoc_client_pool_pop (s->pool);
      ok = seed_lanes (s, client, outbox_lane_doc_id (s->lane_space, 0), OUTBOX_LANES, s->space_handler, error);
      mongoc_client_pool_push (s->pool, client);
      s->space_ready = ok;
   }
   pthread_mutex_unlock (&s->claim_mu);
   return ok;
}

bool
store_setup (store_t *s, bson_error_t *error)
{
   mongoc_client_t *client = mongoc_client_pool_pop (s->pool);
   mongoc_database_t *db = mongoc_client_get_database (client, s->database);
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
      /* The attempt records: the TTL index (also the latest attempts of
       * every handler), a delivery's in order, an event's, a handler's
       * latest. */
      {OUTBOX_ATTEMPTS, "expires", BCON_NEW (OUTBOX_F_ENDED_AT, BCON_INT32 (1)), NULL, false, s->attempt_history_s},
      {OUTBOX_ATTEMPTS, "delivery", BCON_NEW (OUTBOX_F_DELIVERY_ID, BCON_INT32 (1), OUTBOX_F_ENDED_AT, BCON_INT32 (1)), NULL, false},
      {OUTBOX_ATTEMPTS, "event", BCON_NEW (OUTBOX_F_EVENT_ID, BCON_INT32 (1)), NULL, false},
      {OUTBOX_ATTEMPTS, "handler", BCON_NEW ("handler", BCON_INT32 (1), OUTBOX_F_ENDED_AT, BCON_INT32 (1)), NULL, false},
   };
   const size_t n_specs = sizeof specs / sizeof specs[0];

   for (int c = 0; c < OUTBOX_N_COLLECTIONS; c++) {
      if ((c == OUTBOX_COMPLETED && !s->completion_history) || (c == OUTBOX_ATTEMPTS && !store_attempts_on (s)))
         continue;
      if (!create_collection (s, db, s->names[c], error))
         goto done;
   }
   if (!create_indexes (s, db, OUTBOX_DELIVERIES, specs, n_specs, error) ||
       !create_indexes (s, db, OUTBOX_EVENTS, specs, n_specs, error))
      goto done;
   if (s->completion_history && !create_indexes (s, db, OUTBOX_COMPLETED, specs, n_specs, error))
      goto done;
   if (store_attempts_on (s) && !setup_attempts (s, db, specs, n_specs, error))
      goto done;
   if (!setup_shard (s, client, error))
      goto done;

   /* The lanes of the fixed spaces: upserts that only insert, so a second
    * setup (or a running fleet) changes nothing, and an outbox set up
    * before the pull space existed keeps its 256 lanes (the dispatch
    * space's) as they are and gains the pull space's. */
   if (!seed_lanes (s, client, 0, OUTBOX_LANE_DOCS, NULL, error))
      goto done;
   ok = true;
   log_info ("store: set up %s.%s, %s, %s, %s (completion history %s, attempt history %s)",
             s->database,
             s->names[OUTBOX_EVENTS],
             s->names[OUTBOX_DELIVERIES],
             s->names[OUTBOX_KEY_SEQUENCES],
             s->names[OUTBOX_LANES_COLL],
             s->completion_history ? "on" : "off",
             store_attempts_on (s) ? "on" : "off");

done:
   for (size_t i = 0; i < n_specs; i++) {
      bson_destroy (specs[i].keys);
      bson_destroy (specs[i].partial);
   }
   mongoc_database_destroy (db);
   mongoc_client_pool_push (s->pool, client);
   return ok;
}
