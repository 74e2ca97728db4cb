/*
 * base/fleet.h - the fleet's handler set: what every live proxy declares.
 *
 * Thread: the dispatcher thread publishes snapshots; the forwarding loop and the admin thread read them (any thread may read).
 *
 * Every proxy records its handlers (name, kind, event patterns, a hash of
 * the handler's settings) in the outbox's `handlers` collection, one
 * document per process instance with a heartbeat (store/fleet.h, run by
 * the dispatcher thread).  That thread reads the documents back every
 * heartbeat and publishes an immutable snapshot here; the forwarding loop
 * only takes a reference on the current snapshot (a mutex held for a
 * pointer copy), so injection never waits for the store.
 *
 * A snapshot lists every instance found, whether it is live (heartbeat
 * younger than FLEET_LIVE_HEARTBEATS heartbeats), the union of the live
 * instances' handlers (one entry per name), and the names live instances
 * declare differently (kind, patterns or settings hash).
 */
#ifndef RELAYBUS_FLEET_H
#define RELAYBUS_FLEET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>

#include "base/config.h"

/* Instances read per refresh, and distinct handler names taken from the
 * fleet beyond the local config: both bound the snapshot. */
#define FLEET_MAX_INSTANCES 256
#define FLEET_MAX_HANDLERS CONFIG_MAX_HANDLERS
/* An instance is live while its heartbeat is younger than this many
 * heartbeat intervals. */
#define FLEET_LIVE_HEARTBEATS 3
/* "sha256:" + 16 hex digits. */
#define FLEET_HASH_LEN 23

typedef struct {
   char *name;
   char *kind;
   char **patterns;
   size_t n_patterns;
   char *hash;
   int64_t backfill_until; /* 0, or: its declarer backfills it and holds its deliveries until then */
} fleet_handler_t;

typedef struct {
   char *instance;
   int64_t heartbeat_at, started_at;
   bool live;
   bool stopped; /* it recorded a clean stop */
   fleet_handler_t *handlers;
   size_t n_handlers;
} fleet_instance_t;

/* Immutable once published; freed when its last reference goes. */
typedef struct fleet_set {
   _Atomic int refcount;
   int64_t read_at; /* when the documents were read (ms since the epoch) */
   fleet_instance_t *instances;
   size_t n_instances;
   /* One per name over the live instances (pointing into instances[]). */
   const fleet_handler_t **live;
   size_t n_live;
   /* Names live instances declare with different kind, patterns or hash. */
   char **disagreeing;
   size_t n_disagreeing;
} fleet_set_t;

/* config_patterns_match over the handler's patterns as the fleet recorded
 * them. */
bool fleet_handler_matches (const fleet_handler_t *h, const char *type);

/* The settings hash of a handler: SHA-256 over its kind, events, url
 * (its password masked, as config_mask shows it), retry schedule,
 * max_attempts, timeout, concurrency and retry_4xx, each field as
 * "name:length:value", cut to 16 hex digits ("sha256:...").  No secret
 * enters it: the hash is stored in the outbox, which more people may read
 * than the configuration, and any function of a secret stored there
 * (plain or keyed by the secret itself) lets a reader check guesses of it
 * offline.  So two proxies whose signing secrets or url passwords differ
 * show the same hash (docs/handlers.md says what a difference can and
 * cannot tell). */
void fleet_handler_hash (const config_handler_t *h, char out[FLEET_HASH_LEN + 1]);

/* Appends, as array `key`, the handlers of `cfg` as the instance document
 * records them: {name, kind, events: [...], hash, backfillUntil?}.
 * `backfill_until` (NULL, or one per handler of cfg; 0 for none) dates the
 * end of a backfill in progress. */
bool fleet_append_handlers (const config_t *cfg, const int64_t *backfill_until, bson_t *doc, const char *key)
   __attribute__ ((warn_unused_result));

/* A snapshot from instance documents ({_id, heartbeatAt, startedAt,
 * handlers}); `live_ms`: an instance whose heartbeat is older than
 * now - live_ms is not live.  Documents of another shape are skipped.
 * Refcount 1. */
fleet_set_t *fleet_set_from_docs (const bson_t *const *docs, size_t n, int64_t now, int64_t live_ms);

fleet_set_t *fleet_retain (fleet_set_t *fs);
void fleet_release (fleet_set_t *fs); /* NULL ok */

/* The process-wide current snapshot: fleet_publish takes over the caller's
 * reference; fleet_acquire returns a new reference (NULL before the first
 * refresh) the caller releases.  Neither blocks for longer than a pointer
 * copy. */
void fleet_publish (fleet_set_t *fs);
fleet_set_t *fleet_acquire (void);

/* True if a handler of `cfg`, or a live handler of `fs` (NULL: none),
 * subscribes to `type`. */
bool fleet_type_routed (const config_t *cfg, const fleet_set_t *fs, const char *type);

/* Does a live instance other than `self` declare `name`? */
bool fleet_declared_elsewhere (const fleet_set_t *fs, const char *self, const char *name);

/* The latest heartbeat of any instance, live or not, that declares `name`;
 * 0 when none does. */
int64_t fleet_last_declared (const fleet_set_t *fs, const char *name);

/* The latest backfillUntil a live instance other than `self` records for
 * `name` (0: none). */
int64_t fleet_backfill_until (const fleet_set_t *fs, const char *self, const char *name);

#endif /* RELAYBUS_FLEET_H */
