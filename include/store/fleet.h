/*
 * store/fleet.h - the fleet's handler sets in the outbox.
 * Thread: dispatcher thread.
 *
 * The `handlers` collection: each proxy instance's declaration and
 * heartbeat, the backfill of a newly declared handler, and the retirement
 * of handlers no live proxy declares.  Blocking mongoc calls.  The
 * documents are docs/outbox-schema.md's.
 */
#ifndef RELAYBUS_STORE_FLEET_H
#define RELAYBUS_STORE_FLEET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>

#include "store/store.h"

/* Upserts this instance's document {_id: owner}: `fields` ($set as they
 * are: the handlers, startedAt), and heartbeatAt = the server's clock. */
bool store_fleet_announce (store_t *store, const bson_t *fields, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* Reads the instance documents (string _id) into docs[] (copies the caller destroys),
 * newest heartbeat first: the first `max_full`, then only those that
 * declare a handler name none before them does, at most `max` in all
 * (and at most `max` distinct names); *n how many. */
bool store_fleet_read (store_t *store, bson_t **docs, size_t max_full, size_t max, size_t *n, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* Records that a proxy of this fleet declared each of names[] (one
 * document per name, {_id: {handler: NAME}, handler, declaredAt}, in the
 * same collection; upserts in one bulk write).  These records outlive
 * the instance documents: retirement buries only what they name. */
bool store_fleet_record_declared (store_t *store, const char *const *names, size_t n, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* declared[i]: whether a proxy of this fleet ever declared names[i] (a
 * record of store_fleet_record_declared exists).  One find. */
bool store_fleet_declared (store_t *store, char *const *names, size_t n, bool *declared, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* Removes the documents of other instances whose heartbeat is before
 * `before`. */
bool store_fleet_forget (store_t *store, int64_t before, bson_error_t *error) __attribute__ ((warn_unused_result));

/* Takes or renews the retirement lease (the lanes collection's document
 * _id -2, retireOwner / retireLeaseExpiresAt, as the purge lease). */
bool store_fleet_lease (store_t *store, int64_t now, int64_t lease_ms, bool *leased, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* Hands the retirement lease back if this instance holds it (at a clean
 * stop, so the next instance need not wait for it to expire). */
bool store_fleet_lease_release (store_t *store, int64_t now, bson_error_t *error) __attribute__ ((warn_unused_result));

/* The server's transactionLifetimeLimitSeconds, in ms (getParameter on
 * the admin database; one command).  False when it cannot be read: a
 * mongos has no such parameter (each shard has its own), a user without
 * the getParameter privilege is refused. */
bool store_fleet_server_txn_lifetime (store_t *store, int64_t *ms, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* The distinct handler names of the deliveries, pending or dead (at most
 * `max`; the caller frees each name and the array). */
bool store_fleet_pending_handlers (store_t *store, char ***names, size_t *n, size_t max, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* One batch of a retirement: up to `batch` pending deliveries of `handler`
 * become dead with `reason` (as an operator bury: not those a lane lists
 * in flight).  *n_buried how many; *more whether the batch came back
 * full. */
bool store_fleet_retire (store_t *store,
                         const char *handler,
                         const char *reason,
                         int64_t now,
                         size_t batch,
                         size_t *n_buried,
                         bool *more,
                         bson_error_t *error) __attribute__ ((warn_unused_result));

/* The progress of one handler's backfill over its window (createdAt in
 * [since, until]): a cursor over the window kept between calls, so each
 * call goes on where the last one stopped.  `reach`: how long before it
 * becomes visible an event can have been created (the window's liveness
 * bound plus transaction lifetime). */
typedef struct {
   int64_t since, until, reach;
   bool in_sweep;              /* a sweep is under way: from its cursor on */
   int64_t from;               /* the lower bound of the current sweep */
   int64_t sweep_started;      /* when it started (the caller's now) */
   int64_t last_sweep_started; /* when the last complete sweep started */
   size_t sweeps;              /* complete sweeps */
   bool have_after;
   int64_t after_created; /* the cursor: the last event read */
   bson_value_t after_id;
   size_t read;   /* candidates read in all */
   bool done;     /* a sweep that started at or after `until` is complete */
} store_backfill_t;

void store_backfill_init (store_backfill_t *b, int64_t since, int64_t until, int64_t reach);
/* Frees the cursor (the state stays usable: the sweep starts again). */
void store_backfill_clear (store_backfill_t *b);

/* Backfill of a newly declared handler: every event created in the
 * window whose type matches one of `patterns` (exact, or a prefix ending
 * in '*'; the query reads only those) and whose `handlers` list lacks
 * `handler` gets the handler added and a pending delivery (copying key,
 * sequence, notBefore), in transactions of at most 500 events.  Reads at
 * most 200 pages of 500 per call, from the cursor of `b` on; `b->done`
 * once complete.  *n_added how many. */
bool store_fleet_backfill (store_t *store,
                           const char *handler,
                           const char *const *patterns,
                           size_t n_patterns,
                           store_backfill_t *b,
                           int64_t now,
                           size_t *n_added,
                           bson_error_t *error) __attribute__ ((warn_unused_result));

/* The lane documents of the fixed spaces (_id 0 to 511) that a proxy of a
 * version before 0.2.0 left listing deliveries (killed with claims in
 * flight, or between a takeover and its charge): nobody of this version
 * takes them over, so the deliveries they list counted as running for
 * ever and could not be buried.  Call only once no such proxy is live
 * (fleet_old_version_live).  Each lane whose lease expired is released
 * in one transaction: its listed deliveries that are pending and that no
 * lane of their handler's space runs are charged the lost attempt (a
 * lost list's once for its epoch, by lostAt), the lane is emptied, its
 * owner cleared and its epoch incremented.  *n_lanes released,
 * *n_charged attempts charged. */
bool store_fleet_release_old_lanes (store_t *store, int64_t now, size_t *n_lanes, size_t *n_charged, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* A disabled handler as the outbox records it (handler_states): nothing
 * is claimed for it anywhere in the fleet until it is enabled again. */
typedef struct {
   char *name;   /* owned */
   char *reason; /* owned: "410", "failing since <time>" or "operator" */
   int64_t at;   /* when it was disabled (the server's clock) */
} store_handler_state_t;

void store_handler_states_free (store_handler_state_t *states, size_t n);

/* Records `handler` disabled for `reason`.  An already disabled handler
 * keeps its first reason and time: *changed says whether this call
 * disabled it. */
bool store_fleet_disable (store_t *store, const char *handler, const char *reason, bool *changed, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* Enables `handler` again; *changed says whether it was disabled. */
bool store_fleet_enable (store_t *store, const char *handler, bool *changed, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* Every disabled handler, at most `max` (sorted by name); the caller frees
 * *states with store_handler_states_free. */
bool store_fleet_disabled (store_t *store, store_handler_state_t **states, size_t *n, size_t max, bson_error_t *error)
   __attribute__ ((warn_unused_result));

#endif /* RELAYBUS_STORE_FLEET_H */
