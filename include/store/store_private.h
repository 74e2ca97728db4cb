/*
 * store/store_private.h - what the store/ modules share and nobody else uses.
 * Thread: the caller's (dispatcher or admin thread); `mu` guards what is shared.
 *
 * The instance structure, the per-instance memory of lanes held and claims
 * handed out, and small helpers around mongo-c-driver.
 */
#ifndef RELAYBUS_STORE_PRIVATE_H
#define RELAYBUS_STORE_PRIVATE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>
#include <mongoc/mongoc.h>

#include "base/outbox.h"
#include "base/servercodes.h"
#include "store/store.h"

/* The server's error codes the store acts on (MongoDB's, in the domain of
 * mongoc's server errors); every other server error is wrapped as
 * STORE_ERROR_SERVER. */
typedef enum {
   STORE_SERVER_NAMESPACE_EXISTS = SERVER_NAMESPACE_EXISTS, /* create: the collection exists (setup) */
   STORE_SERVER_WRITE_CONFLICT = SERVER_WRITE_CONFLICT,     /* another writer committed one of the documents */
   STORE_SERVER_DUPLICATE_KEY = SERVER_DUPLICATE_KEY,       /* an upsert lost against another instance's document */
} store_server_code_t;

/* A growable list of ObjectIds. */
typedef struct {
   bson_oid_t *v;
   size_t n, cap;
} store_oids_t;

#define STORE_SETTLED_MAX 4096
/* Events whose completion time waits on the deferred list (store_defer_
 * events); past it the oldest is dropped and counted. */
#define STORE_DEFERRED_MAX 1024

/* Where unparking resumes for one handler (store_t.unpark). */
typedef struct {
   char *handler; /* owned */
   char *key;     /* owned; NULL: from the start */
   int64_t due;   /* the head dueAt of `key` */
} store_unpark_cursor_t;

/* Handlers with an unparking cursor of their own; more (handlers renamed
 * by reloads) start their window from the start at every claim. */
#define STORE_UNPARK_CURSORS_MAX 256

/* An event completion time a completion could not write within the
 * instance's bound (store_set_max_time_ms). */
typedef struct {
   char *event_id; /* owned */
   int64_t at;     /* the completion time (ms) */
} store_deferred_t;

/* A lane this instance took, with the epoch of that take. */
typedef struct {
   bool held;
   int64_t epoch;
   int64_t expires; /* ms; the latest expiry this instance wrote */
} store_lane_state_t;

/* A lane whose lost or abandoned claims could not be charged: another
 * client's open transaction holds one of its deliveries (a consumer
 * killed after its completion inside it).  Claims leave it alone until
 * `until` (claim time, ms), then try again, `backoff_ms` (from
 * STORE_HELD_BACKOFF_MS) doubling up to STORE_HELD_BACKOFF_MAX_MS while it
 * stays held; `logged` is when that was last logged (once every
 * STORE_HELD_LOG_MS).  All zero: not held. */
#define STORE_HELD_BACKOFF_MS 1000
#define STORE_HELD_BACKOFF_MAX_MS 16000
#define STORE_HELD_LOG_MS 60000
typedef struct {
   int64_t until;
   int64_t backoff_ms;
   int64_t logged;
} store_lane_held_t;

/* A claim this instance handed out and has not seen settled.  `expires`
 * is the claim's own lease (ms): set when it is handed out, moved on by
 * every renewal of it.  A claim of this instance that finds the delivery
 * still listed after `expires` takes it as abandoned (its worker could not
 * settle it and stopped renewing it) and reconciles it. */
typedef struct {
   bson_oid_t id;
   uint32_t lane;
   int64_t epoch;
   int32_t claims;
   int64_t expires;
   char *handler, *key; /* owned; key NULL when unkeyed */
} store_issued_t;

/* The store instance.  `pool` is borrowed; strings are owned.  `mu`
 * guards lanes[] and issued; `claim_mu` makes this instance's claims run
 * one after the other (it is taken before `mu`, never after). */
struct store {
   mongoc_client_pool_t *pool;
   char *database;
   char *owner;
   char names[OUTBOX_N_COLLECTIONS][OUTBOX_NAME_MAX];
   bool completion_history;
   /* [outbox] attempt_history, in whole seconds (the TTL index's
    * expireAfterSeconds); 0: the settling calls write no attempt records. */
   int64_t attempt_history_s;
   /* store_set_completion_times_by_second: a second's completions write
    * their events' completion times together, on this instance's
    * deferred list, or on its base's (`times_to`, borrowed: a space's
    * instance of store_spaces_of), so the completions of every handler
    * space of a second make one update. */
   bool times_by_second;
   store_t *times_to;
   config_shard_t shard; /* [outbox] shard_collections */
   int32_t purge_batch;
   /* maxTimeMS of every write this instance makes outside a transaction
    * that another client's open transaction can hold up (0: none);
    * store_set_max_time_ms.  Set before the instance is shared. */
   int32_t max_time_ms;

   /* The space of the lanes this instance claims in; lanes[n] is lane n
    * of it (document store_lane_doc (s, n)).  Set before the first claim. */
   uint32_t lane_space;
   /* A handler space's instance (store_spaces_of): the handler it was
    * made for (owned; NULL otherwise), and whether its lane documents were
    * made (store_setup_space; guarded by claim_mu). */
   char *space_handler;
   bool space_ready;

   pthread_mutex_t mu;
   pthread_mutex_t claim_mu;
   store_lane_state_t lanes[OUTBOX_LANES];
   store_issued_t *issued;
   size_t n_issued, cap_issued;
   /* Deliveries this instance completed (proven) that its lanes may still
    * list: the next claim takes them out of inFlight without reading
    * them.  Bounded by STORE_SETTLED_MAX (then forgotten: the claim reads
    * the listed documents instead).  Guarded by mu. */
   store_oids_t settled;
   /* Events' completion times that waited past max_time_ms (a consumer's
    * open transaction holds the event), oldest first, written again by
    * store_retry_deferred.  At most STORE_DEFERRED_MAX.  Guarded by mu. */
   store_deferred_t deferred[STORE_DEFERRED_MAX];
   size_t n_deferred;

   /* Unparking walks each handler's parked keys in (head dueAt, key)
    * order, a window per claim, and resumes after the last key of that
    * handler it looked at: every parked key of a handler is looked at
    * within a bounded number of claims of that handler, whatever the
    * claims of other handlers (the consumer thread claims for one handler
    * at a time).  Guarded by claim_mu. */
   store_unpark_cursor_t unpark[STORE_UNPARK_CURSORS_MAX];
   size_t n_unpark;
   /* When the next unparking runs (claim time, ms): at once while parked
    * keys were found or this instance parked some, otherwise after
    * STORE_UNPARK_IDLE_MS.  Guarded by claim_mu. */
   int64_t unpark_next;
   /* The free lanes the last probe found that no claim has taken yet,
    * oldest due work first, with what each could give, and when that
    * probe ran (claim time, ms).  Guarded by claim_mu. */
   uint32_t probe_lane[OUTBOX_LANES];
   size_t probe_worth[OUTBOX_LANES];
   size_t n_probe;
   int64_t probe_at;
   bool probe_more;
   /* Lanes held up by another client's open transaction (claim_held.c).
    * Guarded by claim_mu. */
   store_lane_held_t held_up[OUTBOX_LANES];
   /* When store_probe_due last found nothing due for this space's
    * handlers (ms; 0: not since it claimed).  The dispatcher's thread
    * only. */
   int64_t probe_idle_at;
};

/* A collection of the outbox on `client`, with write concern majority and
 * primary reads.  The caller destroys it. */
mongoc_collection_t *store_coll (store_t *store, mongoc_client_t *client, outbox_collection_t which);
/* Makes the reads through `coll` (find, aggregate, count; not inside a
 * transaction, whose read concern goes on its first command) read concern
 * "majority": what they see cannot be rolled back at a failover. */
void store_coll_read_majority (mongoc_collection_t *coll);

/* The writes store_write runs. */
typedef enum {
   STORE_WRITE_UPDATE_ONE,
   STORE_WRITE_UPDATE_MANY,
   STORE_WRITE_DELETE_MANY,
} store_write_kind_t;

/* One write outside a transaction on a client of the pool: q, and u for an
 * update; opts may be NULL.  *n (may be NULL) gets how many documents it
 * changed (modifiedCount, deletedCount).  False with a STORE_ERROR_SERVER
 * "<what>: <the server's message>". */
bool store_write (store_t *store,
                  outbox_collection_t which,
                  store_write_kind_t kind,
                  const bson_t *q,
                  const bson_t *u,
                  const bson_t *opts,
                  int64_t *n,
                  const char *what,
                  bson_error_t *error);

/* Appends maxTimeMS: the instance's bound (max_time_ms), or `cap` when
 * that is 0 or larger (cap 0: no cap).  Nothing when both are 0. */
void store_append_max_time (const store_t *store, bson_t *opts, int32_t cap);
/* One update (UPDATE_ONE, UPDATE_MANY: q and u) or delete (DELETE_MANY:
 * q) outside a transaction on `coll`, bounded by maxTimeMS as
 * store_append_max_time says (cap 0: the instance's bound only).  *n (may
 * be NULL) gets how many documents it changed (nModified, n).  False with
 * the server's error (MaxTimeMSExpired when it waited past the bound). */
bool store_bounded_write (store_t *store,
                          mongoc_collection_t *coll,
                          store_write_kind_t kind,
                          const bson_t *q,
                          const bson_t *u,
                          int32_t cap,
                          int64_t *n,
                          bson_error_t *error) __attribute__ ((warn_unused_result));
/* Puts the events of ids[0..n) on the deferred list with completion time
 * `at` (see store_retry_deferred); `held`: because an open transaction
 * held them (counted in relaybus_store_deferred_completion_times_total),
 * not a second's completions written together (store_completion_times_due). */
void store_defer_events (store_t *store, const char *const *ids, size_t n, int64_t at, bool held);

/* Sets a STORE_ERROR with a message. */
void store_set_error (bson_error_t *error, store_error_code_t code, const char *fmt, ...)
   __attribute__ ((format (printf, 3, 4)));

/* Ends a cursor: destroys it and returns true, or, when it failed, sets
 * a STORE_ERROR_SERVER "<what>: <the server's message>" and returns false.
 * `what` is a printf format. */
bool store_cursor_end (mongoc_cursor_t *cur, bson_error_t *error, const char *fmt, ...) __attribute__ ((format (printf, 3, 4)));

/* Appends {"claims": C} to a query, where a missing field counts as 0. */
void store_append_claims_match (bson_t *query, int32_t claims);

/* Int32/Int64/double field as int64 (0 when absent). */
int64_t store_iter_int64 (const bson_t *doc, const char *field);
/* Date (or number) field in ms (0 when absent). */
int64_t store_iter_date (const bson_t *doc, const char *field);
/* UTF-8 field or NULL. */
const char *store_iter_utf8 (const bson_t *doc, const char *field);
/* True if the array field of doc contains the ObjectId. */
bool store_array_has_oid (const bson_t *doc, const char *field, const bson_oid_t *oid);

/* Memory of claims handed out (callers hold store->mu). */
void store_issued_add (store_t *store,
                       const bson_oid_t *id,
                       uint32_t lane,
                       int64_t epoch,
                       int32_t claims,
                       int64_t expires,
                       const char *handler,
                       const char *key);
/* Moves the claim's own lease on to `expires` if it is the claim of
 * (lane, epoch, claims) and the new expiry is later. */
void store_issued_renew (store_t *store, const bson_oid_t *id, uint32_t lane, int64_t epoch, int32_t claims, int64_t expires);
const store_issued_t *store_issued_find (store_t *store, const bson_oid_t *id);
void store_issued_remove (store_t *store, const bson_oid_t *id);
void store_issued_remove_lane (store_t *store, uint32_t lane);

/* A lease kept in one document of the lanes collection with a negative
 * _id (the lanes are 0..OUTBOX_LANE_DOCS-1, and every lane query names
 * lane ids or skips others), in its own owner and expiry fields so that no query on owner
 * and leaseExpiresAt sees it.  Taken, or renewed by its holder, with one
 * findOneAndUpdate; the upsert creates the document the first time, and an
 * upsert that loses against another instance's live lease fails with a
 * duplicate key: *leased is then false and the call succeeds.  `what`
 * names the lease in an error. */
bool store_doc_lease (store_t *store,
                      mongoc_client_t *client,
                      int32_t id,
                      const char *owner_field,
                      const char *expires_field,
                      const char *what,
                      int64_t now,
                      int64_t lease_ms,
                      bool *leased,
                      bson_error_t *error);

/* Parses and checks a reference's lease; false: refused without a call. */
bool store_ref_lease (const store_ref_t *ref, outbox_lease_t *lease, bson_error_t *error);

void store_oids_push (store_oids_t *o, const bson_oid_t *id);
bool store_oids_has (const store_oids_t *o, const bson_oid_t *id);
void store_oids_free (store_oids_t *o);
/* Reads an array of ObjectIds (other values are skipped). */
void store_oids_from_array (store_oids_t *o, const bson_t *doc, const char *field);
/* Parses untrusted id strings (an admin request's); only 24 hex characters
 * name a document, anything else (NULL included) is skipped. */
void store_oids_from_strings (store_oids_t *o, const char *const *ids, size_t n);
/* Appends `field: {op: [ids]}` (op "$in", "$nin"...). */
void store_append_oids_op (bson_t *query, const char *field, const char *op, const bson_oid_t *ids, size_t n);
/* Appends `field: {$in: [strings]}`. */
void store_append_strs_in (bson_t *query, const char *field, const char *const *v, size_t n);
/* Appends `field: [ids]`. */
void store_append_oids_array (bson_t *doc, const char *field, const bson_oid_t *ids, size_t n);
/* Appends `field: {$in: [lane numbers]}` for the lanes set in `lanes`;
 * returns how many it listed (0: the query matches nothing). */
uint32_t store_append_lanes_in (bson_t *query, const char *field, const bool lanes[OUTBOX_LANES]);
/* The _id of lane `lane` (< 256) of the instance's space. */
int32_t store_lane_doc (const store_t *store, uint32_t lane);
/* The lane number of a lane document of the instance's space; false for
 * a lane of another space and for the leases' documents (negative _id). */
bool store_lane_of_doc (const store_t *store, const bson_t *doc, uint32_t *lane) __attribute__ ((warn_unused_result));
/* Appends `_id: {$in: [lane documents]}` for the lanes set in `lanes`, in
 * the instance's space; returns how many it listed. */
uint32_t store_append_lane_docs_in (const store_t *store, bson_t *query, const bool lanes[OUTBOX_LANES]);
/* Keyset pagination in (field, _id) order, field a date: appends the $or
 * that keeps the documents after (at, id); id is an ObjectId or a
 * string. */
void store_append_after_key (bson_t *query, const char *field, int64_t at, const bson_value_t *id);

/* What a transaction's callback works with: its session, the options
 * every command of it must carry ({"session": ...}), and the outbox
 * collections on the transaction's client (store_coll's).  Owned by
 * store_with_txn. */
typedef struct {
   mongoc_client_session_t *session;
   bson_t opts;
   mongoc_collection_t *coll[OUTBOX_N_COLLECTIONS];
} store_txn_t;

/* Runs cb in a transaction (mongoc_client_session_with_transaction, which
 * retries transient errors; a write conflict runs cb again).  Every
 * command in cb must carry txn->opts. */
typedef bool (*store_txn_cb_t) (store_txn_t *txn, void *ctx, bson_error_t *error);
bool store_with_txn (store_t *store, mongoc_client_t *client, store_txn_cb_t cb, void *ctx, bson_error_t *error);
/* Options {"session": ...} for a command in a transaction (or empty). */
void store_session_opts (mongoc_client_session_t *session, bson_t *opts);

/* ------------------------------------------------- attempt records */

/* Whether this instance writes attempt records ([outbox] attempt_history). */
bool store_attempts_on (const store_t *store);

/* The records of attempts to write with one settling call (store/
 * attempts.c): each a new document, inserted with one command. */
typedef struct {
   bson_t **v;
   size_t n, cap;
} store_attempt_docs_t;

/* Adds the record of attempt `a` of delivery `delivery` (of event
 * `event_id`; NULL: unknown) ending at `now`, by this instance: its error
 * and response masked (config_mask) and made UTF-8. */
void store_attempt_docs_add (store_t *store,
                             store_attempt_docs_t *docs,
                             const bson_oid_t *delivery,
                             const char *event_id,
                             const store_attempt_t *a,
                             int64_t now);
void store_attempt_docs_free (store_attempt_docs_t *docs);
/* Inserts the records with one insert on `coll` (<prefix>attempts) with
 * `opts` (a transaction's {"session"}; NULL outside one).  Outside a
 * transaction the insert is unordered and a record that is there already
 * (the same _id: a settling call tried again) is not an error.  Nothing is
 * sent for none. */
bool store_attempt_docs_insert (store_t *store,
                                mongoc_collection_t *coll,
                                const store_attempt_docs_t *docs,
                                const bson_t *opts,
                                bson_error_t *error);

#endif /* RELAYBUS_STORE_PRIVATE_H */
