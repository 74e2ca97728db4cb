/*
 * store/store.c - the store core: the instance and its memory of lanes held
 * and claims handed out, the errors, and the helpers the other store
 * modules share (store/store_private.h): collections, transactions, BSON
 * readers and builders.  The collections, indexes and lanes are
 * store/setup.c's; the operations are store/claim.c (with its parts
 * claim_held.c, claim_scan.c, claim_lanes.c and claim_unpark.c),
 * store/complete.c, store/ops.c and store/fleet.c.
 */
#include "store/store.h"
#include "store/store_private.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/rand.h>

#include "base/assert.h"
#include "base/counters.h"
#include "base/log.h"
#include "base/outbox.h"

/* Transaction options: snapshot read concern, majority, primary. */
static mongoc_transaction_opt_t *store_txn_opts (void);

/* Appends `$or: [a, b]`. */
static void store_append_or2 (bson_t *query, const bson_t *a, const bson_t *b);

void
store_set_error (bson_error_t *error, store_error_code_t code, const char *fmt, ...)
{
   va_list ap;

   if (!error)
      return;
   error->domain = STORE_ERROR_DOMAIN;
   error->code = (uint32_t) code;
   va_start (ap, fmt);
   vsnprintf (error->message, sizeof error->message, fmt, ap);
   va_end (ap);
}

/* Set once the server refused a read at majority (ReadConcernMajorityNotEnabled,
 * 148: MongoDB 4.0 to 4.4 started with enableMajorityReadConcern=false, as
 * primary-secondary-arbiter sets were advised to): the claims read at local
 * from then on, as before 0.2.0, rather than dispatch nothing. */
static atomic_bool majority_refused;

static void
note_read_error (const bson_error_t *err)
{
   if (err->code == SERVER_READ_CONCERN_MAJORITY_NOT_ENABLED && !atomic_exchange (&majority_refused, true))
      log_warn ("store: the server refused read concern majority (%s): claims read at local from now on, so an "
                "event committed with w: 1 that a failover rolls back may be delivered; enable majority read "
                "concern (always on from MongoDB 5.0)",
                err->message);
}

bool
store_cursor_end (mongoc_cursor_t *cur, bson_error_t *error, const char *fmt, ...)
{
   bson_error_t err;
   bool ok = !mongoc_cursor_error (cur, &err);

   if (!ok)
      note_read_error (&err);

   if (!ok && error) {
      char what[256];
      va_list ap;

      va_start (ap, fmt);
      vsnprintf (what, sizeof what, fmt, ap);
      va_end (ap);
      store_set_error (error, STORE_ERROR_SERVER, "%s: %s", what, err.message);
   }
   mongoc_cursor_destroy (cur);
   return ok;
}

worker_t *
store_worker_new (const config_t *cfg, const worker_opts_t *opts, store_t **store, bson_error_t *error)
{
   worker_t *w = worker_new (cfg->upstream, opts, error);
   store_opts_t so = {
      .database = cfg->outbox_database,
      .prefix = cfg->collection_prefix,
      .completion_history = cfg->completion_history,
      .shard = cfg->shard_mode,
      .attempt_history_ms = cfg->attempt_history_ms,
   };

   if (!w)
      return NULL;
   so.owner = worker_owner (w);
   *store = store_new (worker_pool (w), &so, error);
   if (!*store) {
      worker_destroy (w);
      return NULL;
   }
   return w;
}

store_t *
store_new (mongoc_client_pool_t *pool, const store_opts_t *opts, bson_error_t *error)
{
   store_t *s;

   if (!pool || !opts || !opts->database || !opts->prefix || !opts->owner || !*opts->owner) {
      store_set_error (error, STORE_ERROR_INVALID, "store_new: pool, database, prefix and owner are required");
      return NULL;
   }
   s = bson_malloc0 (sizeof *s);
   s->pool = pool;
   s->database = bson_strdup (opts->database);
   s->owner = bson_strdup (opts->owner);
   s->completion_history = opts->completion_history;
   /* Whole seconds, rounded up: a TTL index counts seconds. */
   s->attempt_history_s = opts->attempt_history_ms > 0 ? (opts->attempt_history_ms + 999) / 1000 : 0;
   s->shard = opts->shard;
   s->purge_batch = opts->purge_batch_size > 0 ? opts->purge_batch_size : 500;
   for (int c = 0; c < OUTBOX_N_COLLECTIONS; c++) {
      if (!outbox_collection_name (opts->prefix, (outbox_collection_t) c, s->names[c], sizeof s->names[c])) {
         store_set_error (error, STORE_ERROR_INVALID, "collection prefix \"%s\" is too long", opts->prefix);
         bson_free (s->database);
         bson_free (s->owner);
         bson_free (s);
         return NULL;
      }
   }
   pthread_mutex_init (&s->mu, NULL);
   pthread_mutex_init (&s->claim_mu, NULL);
   return s;
}

/* Another instance of `base`'s owner claiming in `space`. */
static store_t *
store_new_in_space (store_t *base, uint32_t space)
{
   store_t *s = bson_malloc0 (sizeof *s);

   RELAYBUS_ASSERT (space < OUTBOX_LANE_SPACE_MAX);
   s->pool = base->pool;
   s->database = bson_strdup (base->database);
   s->owner = bson_strdup (base->owner);
   memcpy (s->names, base->names, sizeof s->names);
   s->completion_history = base->completion_history;
   s->attempt_history_s = base->attempt_history_s;
   s->times_by_second = base->times_by_second;
   /* A second's completions of every space write their events' times
    * together: they wait on the base's list. */
   s->times_to = base->times_by_second ? base : NULL;
   s->shard = base->shard;
   s->purge_batch = base->purge_batch;
   s->max_time_ms = base->max_time_ms;
   s->lane_space = space;
   pthread_mutex_init (&s->mu, NULL);
   pthread_mutex_init (&s->claim_mu, NULL);
   return s;
}

store_t *
store_spaces_of (store_spaces_t *sp, const char *handler)
{
   uint32_t space = outbox_lane_space_of (handler);
   store_t *s;

   for (size_t i = 0; i < sp->n; i++)
      if (sp->v[i]->lane_space == space)
         return sp->v[i];
   s = store_new_in_space (sp->base, space);
   s->space_handler = bson_strdup (handler);
   sp->v = bson_realloc (sp->v, (sp->n + 1) * sizeof *sp->v);
   sp->v[sp->n++] = s;
   return s;
}

void
store_spaces_clear (store_spaces_t *sp)
{
   for (size_t i = 0; i < sp->n; i++)
      store_destroy (sp->v[i]);
   bson_free (sp->v);
   sp->v = NULL;
   sp->n = 0;
}

const char *
store_space_handler (const store_t *s)
{
   return s->space_handler ? s->space_handler : "";
}

bool
store_holds_lanes (store_t *s)
{
   bool any = false;

   pthread_mutex_lock (&s->mu);
   for (uint32_t i = 0; i < OUTBOX_LANES && !any; i++)
      any = s->lanes[i].held;
   pthread_mutex_unlock (&s->mu);
   return any;
}

void
store_set_lane_space (store_t *s, uint32_t space)
{
   RELAYBUS_ASSERT (space < OUTBOX_LANE_SPACE_MAX);
   s->lane_space = space;
}

void
store_destroy (store_t *s)
{
   if (!s)
      return;
   pthread_mutex_destroy (&s->mu);
   pthread_mutex_destroy (&s->claim_mu);
   bson_free (s->space_handler);
   for (size_t i = 0; i < s->n_issued; i++) {
      bson_free (s->issued[i].handler);
      bson_free (s->issued[i].key);
   }
   bson_free (s->issued);
   store_oids_free (&s->settled);
   for (size_t i = 0; i < s->n_deferred; i++)
      bson_free (s->deferred[i].event_id);
   for (size_t i = 0; i < s->n_unpark; i++) {
      bson_free (s->unpark[i].handler);
      bson_free (s->unpark[i].key);
   }
   bson_free (s->database);
   bson_free (s->owner);
   bson_free (s);
}

void
store_set_max_time_ms (store_t *s, int32_t ms)
{
   s->max_time_ms = ms > 0 ? ms : 0;
}

void
store_append_max_time (const store_t *s, bson_t *opts, int32_t cap)
{
   int32_t ms = s->max_time_ms;

   if (cap > 0 && (ms == 0 || ms > cap))
      ms = cap;
   if (ms > 0)
      BSON_APPEND_INT32 (opts, "maxTimeMS", ms);
}

bool
store_bounded_write (store_t *s,
                     mongoc_collection_t *coll,
                     store_write_kind_t kind,
                     const bson_t *q,
                     const bson_t *u,
                     int32_t cap,
                     int64_t *n,
                     bson_error_t *error)
{
   bson_t cmd = BSON_INITIALIZER, arr, one, reply;
   bool ok;

   /* The command is built here: mongoc's update_many and delete_many put
    * an unknown option such as maxTimeMS into the statement, where mongod
    * refuses it, and the whole command with it (40415, "BSON field
    * 'update.updates.maxTimeMS' is an unknown field."). */
   if (kind == STORE_WRITE_DELETE_MANY) {
      BSON_APPEND_UTF8 (&cmd, "delete", mongoc_collection_get_name (coll));
      BSON_APPEND_ARRAY_BEGIN (&cmd, "deletes", &arr);
      BSON_APPEND_DOCUMENT_BEGIN (&arr, "0", &one);
      BSON_APPEND_DOCUMENT (&one, "q", q);
      BSON_APPEND_INT32 (&one, "limit", 0);
   } else {
      BSON_APPEND_UTF8 (&cmd, "update", mongoc_collection_get_name (coll));
      BSON_APPEND_ARRAY_BEGIN (&cmd, "updates", &arr);
      BSON_APPEND_DOCUMENT_BEGIN (&arr, "0", &one);
      BSON_APPEND_DOCUMENT (&one, "q", q);
      BSON_APPEND_DOCUMENT (&one, "u", u);
      BSON_APPEND_BOOL (&one, "multi", kind == STORE_WRITE_UPDATE_MANY);
   }
   bson_append_document_end (&arr, &one);
   bson_append_array_end (&cmd, &arr);
   store_append_max_time (s, &cmd, cap);
   ok = mongoc_collection_write_command_with_opts (coll, &cmd, NULL, &reply, error);
   if (ok) {
      bson_iter_t it, e;
      /* A write error (a statement that failed) comes with ok: 1. */
      if (bson_iter_init_find (&it, &reply, "writeErrors") && BSON_ITER_HOLDS_ARRAY (&it) &&
          bson_iter_recurse (&it, &e) && bson_iter_next (&e) && BSON_ITER_HOLDS_DOCUMENT (&e)) {
         bson_t doc;
         uint32_t len;
         const uint8_t *data;
         bson_iter_document (&e, &len, &data);
         if (bson_init_static (&doc, data, len)) {
            bson_set_error (error, MONGOC_ERROR_SERVER, (uint32_t) store_iter_int64 (&doc, "code"), "%s",
                            store_iter_utf8 (&doc, "errmsg") ? store_iter_utf8 (&doc, "errmsg") : "write error");
         }
         ok = false;
      } else if (n) {
         *n = store_iter_int64 (&reply, kind == STORE_WRITE_DELETE_MANY ? "n" : "nModified");
      }
   }
   bson_destroy (&reply);
   bson_destroy (&cmd);
   return ok;
}

void
store_defer_events (store_t *s, const char *const *ids, size_t n, int64_t at, bool held)
{
   size_t dropped = 0;

   pthread_mutex_lock (&s->mu);
   for (size_t i = 0; i < n; i++) {
      if (s->n_deferred == STORE_DEFERRED_MAX) {
         /* Bounded: the oldest goes.  Its event keeps no completion time
          * (the delivery is completed all the same; only retention by
          * completion time misses it). */
         bson_free (s->deferred[0].event_id);
         memmove (&s->deferred[0], &s->deferred[1], (STORE_DEFERRED_MAX - 1) * sizeof s->deferred[0]);
         s->n_deferred--;
         dropped++;
      }
      s->deferred[s->n_deferred++] = (store_deferred_t) {.event_id = bson_strdup (ids[i]), .at = at};
   }
   pthread_mutex_unlock (&s->mu);
   if (held)
      counters_add (COUNTER_STORE_DEFERRED, n);
   if (dropped > 0) {
      counters_add (COUNTER_STORE_DEFERRED_DROPPED, dropped);
      log_warn ("store: %zu deferred completion time(s) dropped (the list holds %d)", dropped, STORE_DEFERRED_MAX);
   }
}

void
store_set_completion_times_by_second (store_t *s, bool on)
{
   s->times_by_second = on;
}

bool
store_completion_times_due (store_t *s, int64_t now)
{
   bool due;

   pthread_mutex_lock (&s->mu);
   due = s->n_deferred > 0 && (s->deferred[0].at <= now || s->n_deferred >= STORE_DEFERRED_MAX / 2);
   pthread_mutex_unlock (&s->mu);
   return due;
}

void
store_spaces_write_completion_times (store_spaces_t *sp, int64_t now, bool all)
{
   for (size_t i = 0; i <= sp->n; i++) {
      store_t *s = i < sp->n ? sp->v[i] : sp->base; /* the base holds every space's (times_to) */
      bson_error_t err;
      if (s && (all ? store_deferred_count (s) > 0 : store_completion_times_due (s, now)) && !store_retry_deferred (s, NULL, &err))
         log_info ("store: %s (tried again later)", err.message);
   }
}

size_t
store_deferred_count (store_t *s)
{
   size_t n;

   pthread_mutex_lock (&s->mu);
   n = s->n_deferred;
   pthread_mutex_unlock (&s->mu);
   return n;
}

/* The list is taken off while written (the thread that completes may
 * defer more meanwhile): one updateMany per completion time (a completion
 * defers its events under one time, so a handful), each bounded as every
 * write of the instance.  What was not written is put back in front,
 * older than what was deferred meanwhile ($max makes writing one twice
 * harmless). */
bool
store_retry_deferred (store_t *s, size_t *left, bson_error_t *error)
{
   store_deferred_t *v;
   size_t n, done_upto = 0;
   mongoc_client_t *client;
   mongoc_collection_t *events;
   bson_error_t err;
   bool ok = true;

   pthread_mutex_lock (&s->mu);
   n = s->n_deferred;
   v = bson_malloc0 ((n ? n : 1) * sizeof *v);
   memcpy (v, s->deferred, n * sizeof *v);
   s->n_deferred = 0;
   pthread_mutex_unlock (&s->mu);
   if (n == 0)
      goto done;
   client = mongoc_client_pool_pop (s->pool);
   events = store_coll (s, client, OUTBOX_EVENTS);
   while (ok && done_upto < n) {
      int64_t at = v[done_upto].at;
      size_t end = done_upto;
      bson_t q = BSON_INITIALIZER, in, arr;
      bson_t *u = BCON_NEW ("$max", "{", OUTBOX_F_COMPLETED_AT, BCON_DATE_TIME (at), "}");
      uint32_t k = 0;

      BSON_APPEND_DOCUMENT_BEGIN (&q, "_id", &in);
      BSON_APPEND_ARRAY_BEGIN (&in, "$in", &arr);
      for (; end < n && v[end].at == at; end++) {
         char buf[16];
         const char *key;
         bson_uint32_to_string (k++, &key, buf, sizeof buf);
         BSON_APPEND_UTF8 (&arr, key, v[end].event_id);
      }
      bson_append_array_end (&in, &arr);
      bson_append_document_end (&q, &in);
      ok = store_bounded_write (s, events, STORE_WRITE_UPDATE_MANY, &q, u, 0, NULL, &err);
      if (ok)
         done_upto = end;
      bson_destroy (u);
      bson_destroy (&q);
   }
   mongoc_collection_destroy (events);
   mongoc_client_pool_push (s->pool, client);
   for (size_t i = 0; i < done_upto; i++)
      bson_free (v[i].event_id);
   if (!ok) {
      size_t rest = n - done_upto, drop = 0;
      store_set_error (error, STORE_ERROR_SERVER, "writing %zu deferred completion time(s): %s", rest, err.message);
      pthread_mutex_lock (&s->mu);
      if (s->n_deferred + rest > STORE_DEFERRED_MAX)
         drop = s->n_deferred + rest - STORE_DEFERRED_MAX;
      for (size_t i = 0; i < drop; i++)
         bson_free (v[done_upto + i].event_id);
      memmove (&s->deferred[rest - drop], &s->deferred[0], s->n_deferred * sizeof s->deferred[0]);
      memcpy (&s->deferred[0], &v[done_upto + drop], (rest - drop) * sizeof *v);
      s->n_deferred += rest - drop;
      RELAYBUS_ASSERT (s->n_deferred <= STORE_DEFERRED_MAX);
      pthread_mutex_unlock (&s->mu);
      if (drop > 0)
         counters_add (COUNTER_STORE_DEFERRED_DROPPED, drop);
   }
done:
   bson_free (v);
   if (left)
      *left = store_deferred_count (s);
   return ok;
}

mongoc_collection_t *
store_coll (store_t *s, mongoc_client_t *client, outbox_collection_t which)
{
   mongoc_collection_t *coll = mongoc_client_get_collection (client, s->database, s->names[which]);
   mongoc_write_concern_t *wc = mongoc_write_concern_new ();
   mongoc_read_prefs_t *rp = mongoc_read_prefs_new (MONGOC_READ_PRIMARY);

   mongoc_write_concern_set_w (wc, MONGOC_WRITE_CONCERN_W_MAJORITY);
   mongoc_collection_set_write_concern (coll, wc);
   mongoc_collection_set_read_prefs (coll, rp);
   mongoc_write_concern_destroy (wc);
   mongoc_read_prefs_destroy (rp);
   return coll;
}

void
store_coll_read_majority (mongoc_collection_t *coll)
{
   mongoc_read_concern_t *rc;

   if (atomic_load (&majority_refused))
      return; /* the server's default, local (note_read_error) */
   rc = mongoc_read_concern_new ();
   mongoc_read_concern_set_level (rc, MONGOC_READ_CONCERN_LEVEL_MAJORITY);
   mongoc_collection_set_read_concern (coll, rc);
   mongoc_read_concern_destroy (rc);
}

bool
store_write (store_t *s,
             outbox_collection_t which,
             store_write_kind_t kind,
             const bson_t *q,
             const bson_t *u,
             const bson_t *opts,
             int64_t *n,
             const char *what,
             bson_error_t *error)
{
   mongoc_client_t *client = mongoc_client_pool_pop (s->pool);
   mongoc_collection_t *coll = store_coll (s, client, which);
   bson_t reply;
   bson_error_t err;
   bool ok;

   if (kind == STORE_WRITE_DELETE_MANY)
      ok = mongoc_collection_delete_many (coll, q, opts, &reply, &err);
   else if (kind == STORE_WRITE_UPDATE_MANY)
      ok = mongoc_collection_update_many (coll, q, u, opts, &reply, &err);
   else
      ok = mongoc_collection_update_one (coll, q, u, opts, &reply, &err);
   if (!ok)
      store_set_error (error, STORE_ERROR_SERVER, "%s: %s", what, err.message);
   else if (n)
      *n = store_iter_int64 (&reply, kind == STORE_WRITE_DELETE_MANY ? "deletedCount" : "modifiedCount");
   bson_destroy (&reply);
   mongoc_collection_destroy (coll);
   mongoc_client_pool_push (s->pool, client);
   return ok;
}

static mongoc_transaction_opt_t *
store_txn_opts (void)
{
   mongoc_transaction_opt_t *t = mongoc_transaction_opts_new ();
   mongoc_write_concern_t *wc = mongoc_write_concern_new ();
   mongoc_read_concern_t *rc = mongoc_read_concern_new ();
   mongoc_read_prefs_t *rp = mongoc_read_prefs_new (MONGOC_READ_PRIMARY);

   mongoc_write_concern_set_w (wc, MONGOC_WRITE_CONCERN_W_MAJORITY);
   mongoc_read_concern_set_level (rc, MONGOC_READ_CONCERN_LEVEL_SNAPSHOT);
   mongoc_transaction_opts_set_write_concern (t, wc);
   mongoc_transaction_opts_set_read_concern (t, rc);
   mongoc_transaction_opts_set_read_prefs (t, rp);
   mongoc_write_concern_destroy (wc);
   mongoc_read_concern_destroy (rc);
   mongoc_read_prefs_destroy (rp);
   return t;
}

void
store_append_claims_match (bson_t *query, int32_t claims)
{
   if (claims == 0) {
      /* Documents written before claim generations existed have none. */
      bson_t c, in;
      BSON_APPEND_DOCUMENT_BEGIN (query, OUTBOX_F_CLAIMS, &c);
      BSON_APPEND_ARRAY_BEGIN (&c, "$in", &in);
      BSON_APPEND_INT32 (&in, "0", 0);
      BSON_APPEND_NULL (&in, "1");
      bson_append_array_end (&c, &in);
      bson_append_document_end (query, &c);
   } else {
      BSON_APPEND_INT32 (query, OUTBOX_F_CLAIMS, claims);
   }
}

int64_t
store_iter_int64 (const bson_t *doc, const char *field)
{
   bson_iter_t it;

   if (doc && bson_iter_init_find (&it, doc, field) && BSON_ITER_HOLDS_NUMBER (&it))
      return bson_iter_as_int64 (&it);
   return 0;
}

int64_t
store_iter_date (const bson_t *doc, const char *field)
{
   bson_iter_t it;

   if (!doc || !bson_iter_init_find (&it, doc, field))
      return 0;
   if (BSON_ITER_HOLDS_DATE_TIME (&it))
      return bson_iter_date_time (&it);
   if (BSON_ITER_HOLDS_NUMBER (&it))
      return bson_iter_as_int64 (&it);
   return 0;
}

const char *
store_iter_utf8 (const bson_t *doc, const char *field)
{
   bson_iter_t it;

   if (doc && bson_iter_init_find (&it, doc, field) && BSON_ITER_HOLDS_UTF8 (&it))
      return bson_iter_utf8 (&it, NULL);
   return NULL;
}

bool
store_array_has_oid (const bson_t *doc, const char *field, const bson_oid_t *oid)
{
   bson_iter_t it, child;

   if (!bson_iter_init_find (&it, doc, field) || !BSON_ITER_HOLDS_ARRAY (&it) || !bson_iter_recurse (&it, &child))
      return false;
   while (bson_iter_next (&child))
      if (BSON_ITER_HOLDS_OID (&child) && bson_oid_equal (bson_iter_oid (&child), oid))
         return true;
   return false;
}

void
store_issued_add (store_t *s,
                  const bson_oid_t *id,
                  uint32_t lane,
                  int64_t epoch,
                  int32_t claims,
                  int64_t expires,
                  const char *handler,
                  const char *key)
{
   store_issued_t *it = NULL;

   for (size_t i = 0; i < s->n_issued; i++)
      if (bson_oid_equal (&s->issued[i].id, id)) {
         it = &s->issued[i];
         bson_free (it->handler);
         bson_free (it->key);
         break;
      }
   if (!it) {
      if (s->n_issued == s->cap_issued) {
         s->cap_issued = s->cap_issued ? s->cap_issued * 2 : 64;
         s->issued = bson_realloc (s->issued, s->cap_issued * sizeof *s->issued);
      }
      it = &s->issued[s->n_issued++];
   }
   it->handler = handler ? bson_strdup (handler) : NULL;
   it->key = key ? bson_strdup (key) : NULL;
   bson_oid_copy (id, &it->id);
   it->lane = lane;
   it->epoch = epoch;
   it->claims = claims;
   it->expires = expires;
}

void
store_issued_renew (store_t *s, const bson_oid_t *id, uint32_t lane, int64_t epoch, int32_t claims, int64_t expires)
{
   for (size_t i = 0; i < s->n_issued; i++)
      if (bson_oid_equal (&s->issued[i].id, id)) {
         store_issued_t *it = &s->issued[i];
         if (it->lane == lane && it->epoch == epoch && it->claims == claims && it->expires < expires)
            it->expires = expires;
         return;
      }
}

int64_t
store_lease_expires (store_t *s, const store_ref_t *ref)
{
   const store_issued_t *it;
   outbox_lease_t lease;
   int64_t expires = 0;

   if (!ref->lease || !outbox_lease_parse (ref->lease, &lease))
      return 0;
   pthread_mutex_lock (&s->mu);
   it = store_issued_find (s, &ref->id);
   if (it && it->lane == lease.lane_id && it->epoch == lease.epoch && it->claims == lease.claims)
      expires = it->expires;
   pthread_mutex_unlock (&s->mu);
   return expires;
}

const store_issued_t *
store_issued_find (store_t *s, const bson_oid_t *id)
{
   for (size_t i = 0; i < s->n_issued; i++)
      if (bson_oid_equal (&s->issued[i].id, id))
         return &s->issued[i];
   return NULL;
}

void
store_issued_remove (store_t *s, const bson_oid_t *id)
{
   for (size_t i = 0; i < s->n_issued; i++)
      if (bson_oid_equal (&s->issued[i].id, id)) {
         bson_free (s->issued[i].handler);
         bson_free (s->issued[i].key);
         s->issued[i] = s->issued[--s->n_issued];
         return;
      }
}

void
store_issued_remove_lane (store_t *s, uint32_t lane)
{
   for (size_t i = 0; i < s->n_issued;) {
      if (s->issued[i].lane == lane) {
         bson_free (s->issued[i].handler);
         bson_free (s->issued[i].key);
         s->issued[i] = s->issued[--s->n_issued];
      } else
         i++;
   }
}

bool
store_doc_lease (store_t *s, mongoc_client_t *client, int32_t id, const char *owner_field, const char *expires_field,
                 const char *what, int64_t now, int64_t lease_ms, bool *leased, bson_error_t *error)
{
   mongoc_collection_t *lanes = store_coll (s, client, OUTBOX_LANES_COLL);
   bson_t *mine = BCON_NEW (owner_field, BCON_UTF8 (s->owner));
   bson_t *expired = BCON_NEW (expires_field, "{", "$lte", BCON_DATE_TIME (now), "}");
   bson_t q = BSON_INITIALIZER, u = BSON_INITIALIZER, sub, reply;
   mongoc_find_and_modify_opts_t *fam = mongoc_find_and_modify_opts_new ();
   bson_error_t err;
   bool ok = true;

   *leased = false;
   BSON_APPEND_INT32 (&q, "_id", id);
   store_append_or2 (&q, mine, expired);
   BSON_APPEND_DOCUMENT_BEGIN (&u, "$set", &sub);
   BSON_APPEND_UTF8 (&sub, owner_field, s->owner);
   BSON_APPEND_DATE_TIME (&sub, expires_field, now + lease_ms);
   bson_append_document_end (&u, &sub);
   mongoc_find_and_modify_opts_set_update (fam, &u);
   mongoc_find_and_modify_opts_set_flags (fam, MONGOC_FIND_AND_MODIFY_UPSERT | MONGOC_FIND_AND_MODIFY_RETURN_NEW);
   if (mongoc_collection_find_and_modify_with_opts (lanes, &q, fam, &reply, &err)) {
      *leased = true;
   } else if (err.code != STORE_SERVER_DUPLICATE_KEY) { /* a live lease of another instance */
      store_set_error (error, STORE_ERROR_SERVER, "%s lease: %s", what, err.message);
      ok = false;
   }
   bson_destroy (&reply);
   mongoc_find_and_modify_opts_destroy (fam);
   bson_destroy (&u);
   bson_destroy (&q);
   bson_destroy (expired);
   bson_destroy (mine);
   mongoc_collection_destroy (lanes);
   return ok;
}

bool
store_ref_lease (const store_ref_t *ref, outbox_lease_t *lease, bson_error_t *error)
{
   if (!ref || !ref->lease || !outbox_lease_parse (ref->lease, lease)) {
      store_set_error (error, STORE_ERROR_INVALID, "lease token \"%s\" cannot have been issued by this store",
                       ref && ref->lease ? ref->lease : "(null)");
      return false;
   }
   return true;
}

size_t
store_lanes_held (store_t *s, int64_t now)
{
   size_t n = 0;

   pthread_mutex_lock (&s->mu);
   for (int i = 0; i < OUTBOX_LANES; i++)
      if (s->lanes[i].held && s->lanes[i].expires > now)
         n++;
   pthread_mutex_unlock (&s->mu);
   return n;
}

/* --------------------------------------------------------------- helpers */

void
store_oids_push (store_oids_t *o, const bson_oid_t *id)
{
   if (o->n == o->cap) {
      o->cap = o->cap ? o->cap * 2 : 16;
      o->v = bson_realloc (o->v, o->cap * sizeof *o->v);
   }
   bson_oid_copy (id, &o->v[o->n++]);
}

bool
store_oids_has (const store_oids_t *o, const bson_oid_t *id)
{
   for (size_t i = 0; i < o->n; i++)
      if (bson_oid_equal (&o->v[i], id))
         return true;
   return false;
}

void
store_oids_free (store_oids_t *o)
{
   bson_free (o->v);
   o->v = NULL;
   o->n = o->cap = 0;
}

void
store_oids_from_array (store_oids_t *o, const bson_t *doc, const char *field)
{
   bson_iter_t it, child;

   if (!doc || !bson_iter_init_find (&it, doc, field) || !BSON_ITER_HOLDS_ARRAY (&it) ||
       !bson_iter_recurse (&it, &child))
      return;
   while (bson_iter_next (&child))
      if (BSON_ITER_HOLDS_OID (&child))
         store_oids_push (o, bson_iter_oid (&child));
}

void
store_oids_from_strings (store_oids_t *o, const char *const *ids, size_t n)
{
   bson_oid_t oid;

   for (size_t i = 0; i < n; i++) {
      /* Coerced to a string: only 24 hex characters can name a document. */
      if (ids[i] && strlen (ids[i]) == 24 && bson_oid_is_valid (ids[i], 24)) {
         bson_oid_init_from_string (&oid, ids[i]);
         store_oids_push (o, &oid);
      }
   }
}

void
store_append_oids_array (bson_t *doc, const char *field, const bson_oid_t *ids, size_t n)
{
   bson_t arr;
   char buf[16];
   const char *key;

   BSON_APPEND_ARRAY_BEGIN (doc, field, &arr);
   for (size_t i = 0; i < n; i++) {
      bson_uint32_to_string ((uint32_t) i, &key, buf, sizeof buf);
      BSON_APPEND_OID (&arr, key, &ids[i]);
   }
   bson_append_array_end (doc, &arr);
}

void
store_append_strs_in (bson_t *query, const char *field, const char *const *v, size_t n)
{
   bson_t sub, arr;
   char buf[16];
   const char *key;

   BSON_APPEND_DOCUMENT_BEGIN (query, field, &sub);
   BSON_APPEND_ARRAY_BEGIN (&sub, "$in", &arr);
   for (size_t i = 0; i < n; i++) {
      bson_uint32_to_string ((uint32_t) i, &key, buf, sizeof buf);
      BSON_APPEND_UTF8 (&arr, key, v[i]);
   }
   bson_append_array_end (&sub, &arr);
   bson_append_document_end (query, &sub);
}

void
store_append_oids_op (bson_t *query, const char *field, const char *op, const bson_oid_t *ids, size_t n)
{
   bson_t sub;

   BSON_APPEND_DOCUMENT_BEGIN (query, field, &sub);
   store_append_oids_array (&sub, op, ids, n);
   bson_append_document_end (query, &sub);
}

uint32_t
store_append_lanes_in (bson_t *query, const char *field, const bool lanes[OUTBOX_LANES])
{
   bson_t sub, arr;
   uint32_t k = 0;

   BSON_APPEND_DOCUMENT_BEGIN (query, field, &sub);
   BSON_APPEND_ARRAY_BEGIN (&sub, "$in", &arr);
   for (int i = 0; i < OUTBOX_LANES; i++)
      if (lanes[i]) {
         char buf[16];
         const char *key;
         bson_uint32_to_string (k++, &key, buf, sizeof buf);
         BSON_APPEND_INT32 (&arr, key, i);
      }
   bson_append_array_end (&sub, &arr);
   bson_append_document_end (query, &sub);
   return k;
}

int32_t
store_lane_doc (const store_t *s, uint32_t lane)
{
   return outbox_lane_doc_id (s->lane_space, lane);
}

bool
store_lane_of_doc (const store_t *s, const bson_t *doc, uint32_t *lane)
{
   int64_t id = store_iter_int64 (doc, "_id");
   int64_t base = outbox_lane_doc_id (s->lane_space, 0);

   if (id < base || id >= base + OUTBOX_LANES)
      return false;
   *lane = (uint32_t) (id - base);
   return true;
}

uint32_t
store_append_lane_docs_in (const store_t *s, bson_t *query, const bool lanes[OUTBOX_LANES])
{
   bson_t sub, arr;
   uint32_t k = 0;

   BSON_APPEND_DOCUMENT_BEGIN (query, "_id", &sub);
   BSON_APPEND_ARRAY_BEGIN (&sub, "$in", &arr);
   for (uint32_t i = 0; i < OUTBOX_LANES; i++)
      if (lanes[i]) {
         char buf[16];
         const char *key;
         bson_uint32_to_string (k++, &key, buf, sizeof buf);
         BSON_APPEND_INT32 (&arr, key, outbox_lane_doc_id (s->lane_space, i));
      }
   bson_append_array_end (&sub, &arr);
   bson_append_document_end (query, &sub);
   return k;
}

static void
store_append_or2 (bson_t *query, const bson_t *a, const bson_t *b)
{
   bson_t or;

   BSON_APPEND_ARRAY_BEGIN (query, "$or", &or);
   BSON_APPEND_DOCUMENT (&or, "0", a);
   BSON_APPEND_DOCUMENT (&or, "1", b);
   bson_append_array_end (query, &or);
}

void
store_append_after_key (bson_t *query, const char *field, int64_t at, const bson_value_t *id)
{
   bson_t *a = BCON_NEW (field, "{", "$gt", BCON_DATE_TIME (at), "}");
   bson_t b = BSON_INITIALIZER, sub;

   BSON_APPEND_DATE_TIME (&b, field, at);
   BSON_APPEND_DOCUMENT_BEGIN (&b, "_id", &sub);
   BSON_APPEND_VALUE (&sub, "$gt", id);
   bson_append_document_end (&b, &sub);
   store_append_or2 (query, a, &b);
   bson_destroy (&b);
   bson_destroy (a);
}

void
store_session_opts (mongoc_client_session_t *session, bson_t *opts)
{
   bson_error_t err;

   if (session && !mongoc_client_session_append (session, opts, &err))
      log_warn ("store: cannot attach a session: %s", err.message);
}

/* How often a transaction runs again after a write conflict. */
#define STORE_TXN_CONFLICT_RETRIES 8

typedef struct {
   store_txn_cb_t cb;
   void *ctx;
   store_txn_t *txn;
} txn_call_t;

static bool
txn_trampoline (mongoc_client_session_t *session, void *ctx, bson_t **reply, bson_error_t *error)
{
   txn_call_t *call = ctx;

   (void) reply;
   RELAYBUS_ASSERT (session == call->txn->session);
   return call->cb (call->txn, call->ctx, error);
}

bool
store_with_txn (store_t *s, mongoc_client_t *client, store_txn_cb_t cb, void *ctx, bson_error_t *error)
{
   mongoc_session_opt_t *sopts = mongoc_session_opts_new ();
   mongoc_transaction_opt_t *topts = store_txn_opts ();
   mongoc_client_session_t *session;
   store_txn_t txn = {.opts = BSON_INITIALIZER};
   txn_call_t call = {cb, ctx, &txn};
   bson_t reply;
   bson_error_t err = {0};
   bool ok = false;

   mongoc_session_opts_set_causal_consistency (sopts, false);
   session = mongoc_client_start_session (client, sopts, &err);
   if (!session) {
      store_set_error (error, STORE_ERROR_SERVER, "start session: %s", err.message);
      goto done;
   }
   txn.session = session;
   store_session_opts (session, &txn.opts);
   for (int c = 0; c < OUTBOX_N_COLLECTIONS; c++)
      txn.coll[c] = store_coll (s, client, (outbox_collection_t) c);
   /* The callbacks hand no reply back to mongoc, so it cannot see the
    * TransientTransactionError label of a write conflict: a conflict
    * (another writer committed one of our documents after our snapshot)
    * runs the whole callback again here, against the new state. */
   for (int attempt = 0;; attempt++) {
      memset (&err, 0, sizeof err);
      ok = mongoc_client_session_with_transaction (session, txn_trampoline, topts, &call, &reply, &err);
      bson_destroy (&reply);
      if (ok || err.code != STORE_SERVER_WRITE_CONFLICT || attempt >= STORE_TXN_CONFLICT_RETRIES)
         break;
      log_debug ("store: write conflict in a transaction; running it again");
   }
   if (!ok) {
      if (err.domain == STORE_ERROR_DOMAIN && error)
         *error = err;
      else
         store_set_error (error, STORE_ERROR_SERVER, "transaction: %s", err.message);
   }

done:
   for (int c = 0; c < OUTBOX_N_COLLECTIONS; c++)
      mongoc_collection_destroy (txn.coll[c]);
   bson_destroy (&txn.opts);
   mongoc_client_session_destroy (session);
   mongoc_transaction_opts_destroy (topts);
   mongoc_session_opts_destroy (sopts);
   return ok;
}
