/*
 * store/store.h - the outbox store: the instance, setup, claims, settling.
 * Thread: dispatcher thread and admin thread (never the forwarding loop).
 *
 * The semantics are the @relaybus/mongodb package's (lanes, claims,
 * fencing, attempts, parking); the documents, the indexes and where this
 * store departs from the package are docs/outbox-schema.md.  Every call is
 * a blocking mongoc call: run it on the dispatcher's or the admin's
 * thread, never on the forwarding loop.  Time is always passed in (`now`,
 * milliseconds since the Unix epoch); the server clock is never read.
 *
 * The modules: store/store.c (the instance, shared helpers, errors),
 * store/setup.c (collections, indexes, lanes), store/claim.c (claim,
 * parking, reconciliation; its parts share store/claim_private.h:
 * claim_held.c, the held lanes and lost-claim charging; claim_scan.c, the
 * scan and the pick; claim_lanes.c, free lanes and takeover;
 * claim_unpark.c, unparking), store/complete.c (complete,
 * completeMany, reschedule, release, bury, extendLease, relinquish),
 * store/ops.c (the operator's actions and views: store/ops.h) and
 * store/fleet.c (the fleet's handler sets: store/fleet.h).
 *
 * A store_t is one "store instance": it claims in one lane space (a
 * handler's, base/outbox.h; store_spaces_t keeps one per handler of a
 * claimer), remembers the lanes of that space it holds and
 * the claims it handed out, so a process restarted with the same owner name
 * never adopts its predecessor's lanes.  It is thread-safe; claims of one
 * instance run one after the other.
 */
#ifndef RELAYBUS_STORE_H
#define RELAYBUS_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>
#include <mongoc/mongoc.h>

#include "base/config.h"
#include "base/outbox.h"
#include "base/worker.h"
#include "base/errors.h"

/* The codes of STORE_ERROR_DOMAIN.  An error a command or a transaction
 * of the server returned is wrapped as STORE_ERROR_SERVER with the
 * server's message. */
typedef enum {
   STORE_ERROR_INVALID = 1, /* a bad argument: nothing was sent */
   STORE_ERROR_SERVER,      /* a command, a cursor or a transaction failed */
   STORE_ERROR_LOST,        /* a claim's record did not reach every lane */
   STORE_ERROR_HELD,        /* a write met a document another client's open transaction holds
                             * (server_code_is_held): it passes once that transaction ends */
} store_error_code_t;

/* Deliveries waiting behind one unfinished predecessor that get parked. */
#define STORE_PARK_THRESHOLD 32
/* A claim query over many lanes asks for at most this many at once. */
#define STORE_MAX_LANES_PER_QUERY 128
/* Deliveries of one key one claim may take at most (store_claim_opts_t). */
#define STORE_KEY_RUN_MAX 8

typedef struct store store_t;

typedef struct {
   const char *database;    /* [outbox] database */
   const char *prefix;      /* [outbox] collection_prefix */
   bool completion_history; /* [outbox] completion_history */
   const char *owner;       /* lease owner, unique per process instance */
   int32_t purge_batch_size; /* 0: 500 */
   config_shard_t shard;      /* [outbox] shard_collections: store_setup on a mongos */
   /* [outbox] attempt_history (ms): the settling calls write a record of
    * each attempt they end into <prefix>attempts, which store_setup makes
    * with a TTL index of this window; 0: no records. */
   int64_t attempt_history_ms;
} store_opts_t;

/* A new store instance on `pool` (borrowed: the caller keeps it alive
 * until store_destroy).  Copies the strings of `opts`. */
store_t *store_new (mongoc_client_pool_t *pool, const store_opts_t *opts, bson_error_t *error)
   __attribute__ ((warn_unused_result));
/* Frees the instance; does not hand lanes back (see store_relinquish).
 * NULL is accepted. */
void store_destroy (store_t *store);
/* The set-up of the dispatcher and the admin port: a worker (base/worker.h,
 * not started) and a store on its pool, with its owner name and the
 * [outbox] keys of `cfg` (database, collection_prefix,
 * completion_history, shard_collections).  Both or neither: NULL on failure.  The caller
 * destroys the store before the worker, whose pool it uses. */
worker_t *store_worker_new (const config_t *cfg, const worker_opts_t *opts, store_t **store, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* Bounds every write of this instance outside a transaction that another
 * client's open transaction can hold up (maxTimeMS `ms`; 0, the default:
 * unbounded).  MongoDB holds such a write until that transaction ends, for
 * up to its lifetime; the pull consumers' thread answers every consumer of
 * the proxy, so it sets a short bound and never waits on a consumer's
 * transaction.  A completion whose deliveries were deleted but whose
 * events' completion times hit the bound is a completion all the same:
 * the times go on a deferred list (store_retry_deferred).  Call before the
 * instance is shared. */
void store_set_max_time_ms (store_t *store, int32_t ms);
/* Writes the deferred events' completion times again (one bulk write,
 * bounded as above); what fails again stays listed.  *left gets how many
 * are still listed.  False when the write failed. */
bool store_retry_deferred (store_t *store, size_t *left, bson_error_t *error) __attribute__ ((warn_unused_result));
/* How many events' completion times are deferred now. */
size_t store_deferred_count (store_t *store);
/* With attempt history, and once this is set (the dispatcher's
 * instances; instances made by store_spaces_of follow their base), a
 * completion outside a transaction whose every delivery gets its attempt
 * record does not write its events' completion times at once: each
 * record holds its time, so the events of the completions of one second
 * are written together, with $max and the second's end, once that second
 * is over (one update instead of one per completion; the purge reads the
 * records for an event whose time a crash left unwritten).  They wait on
 * the deferred list; the caller writes what is due (store_completion_
 * times_due, store_retry_deferred) at its next completion or poll, and
 * all of them before it stops.  Set before the instance is
 * shared. */
void store_set_completion_times_by_second (store_t *store, bool on);
/* Whether completion times wait that are due at `now` (of a second that
 * has ended, or the list half full). */
bool store_completion_times_due (store_t *store, int64_t now);

/* The lane space the instance claims in (base/outbox.h): the dispatch
 * space unless set.  The claimers keep an instance per handler space
 * (store_spaces_t); a fixed space is set this way (the store tests claim
 * in the two of them).  Set it before the first claim; it never
 * changes. */
void store_set_lane_space (store_t *store, uint32_t space);

/* The store instances one claimer keeps, one per handler lane space
 * (base/outbox.h), made from `base` on first use: the dispatcher's for
 * its dispatched handlers, the consumer thread's for the pull handlers.
 * Each is another instance on `base`'s pool with its options and owner
 * name, claiming in the handler's space: lane documents of different
 * spaces are disjoint, so instances of one owner never hold one lane.
 * At most one per handler name asked for; kept until store_spaces_clear
 * (a caller may hold the pointers until then), before `base`'s pool
 * goes. */
typedef struct {
   store_t *base; /* borrowed */
   store_t **v;
   size_t n;
} store_spaces_t;

/* The instance of `handler`'s lane space, made now if there is none. */
store_t *store_spaces_of (store_spaces_t *spaces, const char *handler);
/* Destroys every instance (not `base`). */
void store_spaces_clear (store_spaces_t *spaces);
/* store_retry_deferred for every instance of `spaces`, and its base, that
 * has completion times due at `now` (store_completion_times_due; all of
 * them when `all`: a stop); failures are logged. */
void store_spaces_write_completion_times (store_spaces_t *spaces, int64_t now, bool all);
/* The handler a handler space's instance was made for (the name in its
 * lane documents and in log lines); "" for any other instance. */
const char *store_space_handler (const store_t *store);
/* Whether the instance holds a lane now (as it remembers). */
bool store_holds_lanes (store_t *store);

/* Creates the collections, the indexes (idempotently) and the lane
 * documents of every space (OUTBOX_LANE_DOCS). */
bool store_setup (store_t *store, bson_error_t *error) __attribute__ ((warn_unused_result));
/* Creates the lane documents of a handler space's instance
 * (store_spaces_of), once: upserts that only insert, one bulk write, each
 * recording the handler for the operator's views.  Nothing for a fixed
 * space, which store_setup creates, nor after the first success.  Call
 * before each claim of the instance. */
bool store_setup_space (store_t *store, bson_error_t *error) __attribute__ ((warn_unused_result));

/* ------------------------------------------------------------------ claim */

typedef struct {
   const char *handler;
   size_t limit; /* at most this many of this handler in one claim */
} store_claim_handler_t;

typedef struct {
   const store_claim_handler_t *handlers;
   size_t n_handlers;
   size_t limit;     /* at most this many in all */
   int64_t now;      /* ms */
   int64_t lease_ms; /* lease of the lanes taken or used */
   /* The free lanes an earlier claim's probe found and did not take may
    * be taken without probing again while the probe is younger than this
    * (ms; 0: always probe).  The dispatcher passes its poll interval, and
    * 0 when a commit woke it (the new work may be in any lane). */
   int64_t probe_reuse_ms;
   /* At most this many deliveries of one key per claim (0 or 1: one, as
    * the reference claims; at most STORE_KEY_RUN_MAX): the lowest pending
    * ones, proven consecutive, returned in sequence order after the heads
    * of the batch.  The caller runs them one after the other, each only
    * after the one before it completed.  Unparking brings back as many of
    * a key's parked deliveries together. */
   size_t key_run;
} store_claim_opts_t;

/* The poll's probe for due work across the lane spaces of `spaces`
 * (store/probe.c): one find on the deliveries for the handlers of
 * hs[0..n) with room (limit > 0) whose space instance holds no lane and
 * no claim, and the limit of each that has no pending delivery due at
 * `now` becomes 0, so that only the spaces with due work claim.  A space
 * found idle stays so without a probe for reuse_ms / 2 (0: probe).  When
 * the probe fails or comes back full, the limits stay (logged). */
void store_probe_due (store_spaces_t *spaces, store_claim_handler_t *hs, size_t n, int64_t now, int64_t reuse_ms);

/* One claimed delivery.  Everything is owned by the batch. */
typedef struct {
   bson_oid_t id;
   char *event_id;
   char *handler;
   char *event_type;
   char *key; /* NULL without a key */
   int64_t sequence;
   int32_t attempt; /* attempts that ended + 1: this is attempt N */
   int64_t due_at, created_at;
   char lease[OUTBOX_LEASE_TOKEN_MAX];
   bson_t *event; /* the event document, NULL if it was missing */
} store_delivery_t;

typedef struct {
   store_delivery_t *items;
   size_t n, cap;
} store_batch_t;

/* Claims up to opts->limit due deliveries of the given handlers: the lane
 * documents read once, held lanes first, then the free lanes the batch
 * needs, oldest due work first, taken with one updateMany; per-key rules
 * (runs with opts->key_run); one bulkWrite (docs/outbox-schema.md, "Where
 * this store departs from the reference").  `out` must be empty
 * ({0}); the caller clears it with store_batch_clear.  A claim that fails
 * reconciles this instance's lanes before it returns false.  A listed
 * delivery whose claim this instance did not hand out, or handed out and
 * neither settled nor renewed for opts->lease_ms, is taken back (its claim
 * generation moves on) and may be handed out again at once. */
bool store_claim (store_t *store, const store_claim_opts_t *opts, store_batch_t *out, bson_error_t *error)
   __attribute__ ((warn_unused_result));
void store_batch_clear (store_batch_t *batch);

/* Lanes this instance holds under a live lease at `now` (for renewal and
 * metrics). */
size_t store_lanes_held (store_t *store, int64_t now);

/* ----------------------------------------------------- settling a claim */

/* The attempt a settling call ends, for its record in <prefix>attempts
 * (docs/outbox-schema.md, "attempts"): written in the same command batch
 * as the settling (in its transaction when it has one), only by an
 * instance with attempt history, and only for a lease that still holds
 * (a completion outside a transaction: for each delivery it was asked to
 * complete, see store_complete_many).  Strings are borrowed. */
typedef struct {
   /* The record's _id: one per attempt, so a settling call tried again
    * (a completion that failed, kept and retried) writes it once. */
   bson_oid_t id;
   const char *handler;
   outbox_attempt_outcome_t outcome;
   int32_t attempt;      /* its number: attempts that ended before it + 1 */
   int64_t started_at;   /* ms since the epoch; 0: unknown */
   int64_t duration_ms;  /* < 0: unknown */
   int32_t status;       /* a webhook's HTTP status; 0: none */
   const char *error;    /* the failure (NULL: none); masked as lastError when written */
   const char *response; /* a webhook's answer, UTF-8, at most OUTBOX_ATTEMPT_RESPONSE_MAX bytes (NULL: none); masked */
} store_attempt_t;

/* A claimed delivery as the settling calls see it: its id and lease, and
 * optionally the id of its event (as claimed), which lets a completion
 * skip reading the delivery, and the attempt the call ends (NULL: no
 * record). */
typedef struct {
   bson_oid_t id;
   const char *lease;
   const char *event_id;
   const store_attempt_t *attempt;
   /* The instance that handed the claim out when it is not the one called
    * (NULL: that one): store_complete_many completes the refs of several
    * lane spaces of one owner together, in one delete (and one insert of
    * their attempts' records) when it reads no lane, and tells each
    * instance what it settled. */
   store_t *space;
} store_ref_t;

/* Completes the deliveries; done[i] tells whether ref i is proven
 * completed.  Without completion history: two commands when every ref
 * names its event (the delete, fenced by the claim generation, and the
 * events' completion time), four otherwise; one transaction with history.
 * Refs of other spaces (store_ref_t.space) go in the same two commands;
 * on the other paths each space's make a call of their own.
 * When fewer deliveries were deleted than leases were fenced, no lease is
 * reported completed. */
bool store_complete_many (store_t *store,
                          const store_ref_t *refs,
                          size_t n,
                          int64_t now,
                          bool *done,
                          bson_error_t *error) __attribute__ ((warn_unused_result));
/* The claims of these deliveries, which this instance handed out, were
 * completed elsewhere (a consumer's own transaction committed their
 * completion): forgets them as store_complete_many does when it completed
 * them itself.  With attempt history that transaction wrote the attempts'
 * records and not the events (publish/pulltxn.c), so that completions of
 * one event by other handlers never conflict with it: the events of
 * events[0..n) (NULL: none) wait, as the dispatcher's own completions'
 * do, to be written with the completions of their second once it is over
 * (store_set_completion_times_by_second, store_completion_times_due; at
 * `now`'s second's end).  No database call (store/settled.c). */
void store_settled_elsewhere (store_t *store, const bson_oid_t *ids, const char *const *events, size_t n, int64_t now);
bool store_complete (store_t *store, const store_ref_t *ref, int64_t now, bool *done, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* The claim ended in failure: one attempt more, due again at `due_at`.
 * *applied is false when the lease was stale (nothing changed). */
bool store_reschedule (store_t *store,
                       const store_ref_t *ref,
                       int64_t now,
                       int64_t due_at,
                       const char *last_error,
                       bool *applied,
                       bson_error_t *error) __attribute__ ((warn_unused_result));
/* The claim ends without an attempt charged (graceful shutdown). */
bool store_release (store_t *store, const store_ref_t *ref, int64_t now, bool *applied, bson_error_t *error)
   __attribute__ ((warn_unused_result));
/* The delivery is dead with `last_error` (one attempt more). */
bool store_bury (store_t *store,
                 const store_ref_t *ref,
                 int64_t now,
                 const char *last_error,
                 bool *applied,
                 bson_error_t *error) __attribute__ ((warn_unused_result));
/* Extends the lease of the delivery's lane to now + lease_ms (never
 * shrinks it), in one transaction that checks the claim generation. */
bool store_extend_lease (store_t *store,
                         const store_ref_t *ref,
                         int64_t now,
                         int64_t lease_ms,
                         bool *applied,
                         bson_error_t *error) __attribute__ ((warn_unused_result));
/* Renews every ref: the refs are grouped by lane and epoch, one
 * transaction per lane checks the claim generation of each of its refs and
 * extends the lane to now + lease_ms (never shrinks it) when at least one
 * still holds.  applied[i] tells whether ref i holds; each applied ref's
 * own claim is renewed too (see store_claim: a claim this instance stops
 * renewing for a lease is taken back as abandoned).  False when a lane
 * could not be renewed (the others are renewed anyway).  The calls take a
 * client from `pool` (NULL: the store's own), so a renewal thread with a
 * pool of its own never waits for a client behind a slow claim. */
bool store_extend_leases (store_t *store,
                          mongoc_client_pool_t *pool,
                          const store_ref_t *refs,
                          size_t n,
                          int64_t now,
                          int64_t lease_ms,
                          bool *applied,
                          bson_error_t *error) __attribute__ ((warn_unused_result));
/* What store_settle_many does to every ref that holds. */
typedef enum {
   STORE_MANY_RESCHEDULE = 0, /* store_reschedule's: one attempt more, due at due_at */
   STORE_MANY_RELEASE,        /* store_release's: no attempt charged */
   STORE_MANY_BURY,           /* store_bury's: one attempt more, dead */
   STORE_MANY_EXTEND,         /* store_extend_many (not for store_settle_many) */
} store_many_kind_t;

/* Settles every ref as store_reschedule, store_release or store_bury
 * settles one (the same fence, the same writes, the same `last_error`), in
 * one transaction of at most four commands however many refs and lanes:
 * a find of their lanes and one of their deliveries, by _id (the fence,
 * each lane at the lease's epoch listing the delivery, each delivery
 * pending in it at the lease's claim generation, is compared here, in the
 * transaction's snapshot), one update of the deliveries that held and one
 * of their lanes.  applied[i] tells whether ref i held.  False when the
 * transaction failed: nothing changed. */
bool store_settle_many (store_t *store,
                        store_many_kind_t kind,
                        const store_ref_t *refs,
                        size_t n,
                        int64_t now,
                        int64_t due_at,
                        const char *last_error,
                        bool *applied,
                        bson_error_t *error) __attribute__ ((warn_unused_result));
/* Extends every ref's lane to now + lease_ms (never shrinks it) in one
 * transaction of at most three commands, however many refs and lanes: the
 * two fencing reads of store_settle_many, and one update of the lanes
 * with a lease that holds.  applied[i] tells
 * whether ref i held (and its own claim was renewed, as
 * store_extend_leases does).  False when the transaction failed: nothing
 * was extended.  What a pull consumer's relaybusExtend of up to 1,000
 * leases costs the consumer thread: one transaction, not one each. */
bool store_extend_many (store_t *store,
                        const store_ref_t *refs,
                        size_t n,
                        int64_t now,
                        int64_t lease_ms,
                        bool *applied,
                        bson_error_t *error) __attribute__ ((warn_unused_result));
/* When the lease of a claim this instance handed out ends, as far as this
 * instance knows (ms; the expiry the claim or its latest applied renewal
 * wrote), or 0 when the claim is not one of its own (settled, taken back,
 * or the lease is malformed).  No call: the store's own record.  A worker
 * starts a delivery only while enough of this is left, so a delivery never
 * starts on a lane whose lease may lapse before the request ends. */
int64_t store_lease_expires (store_t *store, const store_ref_t *ref);
/* Hands back every lane this instance holds; what is still listed in flight
 * is released (claim generation moves on, no attempt charged).  Three
 * commands, however many lanes: a failure leaves every lane held (their
 * leases run out). */
bool store_relinquish (store_t *store, int64_t now, bson_error_t *error) __attribute__ ((warn_unused_result));
/* As store_relinquish, but the lanes with keep[lane] (OUTBOX_LANES
 * entries) stay held as they are: what they list is not released, and
 * whoever takes them over after their lease charges it (a stop that still
 * owes charges it could not write, dispatch/consumer.c). */
bool store_relinquish_except (store_t *store, int64_t now, const bool *keep, bson_error_t *error)
   __attribute__ ((warn_unused_result));

#endif /* RELAYBUS_STORE_H */
