/*
 * base/fleet.h - the fleet's handler set: what the fleet's proxies declare.
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
 * younger than FLEET_LIVE_HEARTBEATS heartbeats) and whether it is kept
 * (heartbeat younger than [outbox] handler_retire_after), the fleet's
 * handler set, and the names live instances declare differently (kind,
 * patterns or settings hash).
 *
 * The fleet's handler set is the union of the kept instances' handlers
 * (one entry per name): a handler stays in it, and publishers write its
 * deliveries, until no instance has declared it for handler_retire_after,
 * which is when the dispatcher retires it.  An instance that looks dead
 * (stalled, stopped, or restarting) therefore never takes its handlers'
 * deliveries with it.  Heartbeats are written and compared on the
 * server's clock (the instance's own heartbeatAt, read back, is "now"),
 * so no proxy's clock skew moves them.
 */
#ifndef RELAYBUS_FLEET_H
#define RELAYBUS_FLEET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>

#include "base/config.h"

/* Instances read in full per refresh (the newest heartbeats first), and
 * distinct handler names taken from the fleet beyond the local config.
 * Older documents are read only for a name the newer ones lack, so at
 * most FLEET_MAX_DOCS documents make a snapshot, however many instances
 * a crash-looping fleet left behind. */
#define FLEET_MAX_INSTANCES 256
#define FLEET_MAX_HANDLERS CONFIG_MAX_HANDLERS
#define FLEET_MAX_DOCS (FLEET_MAX_INSTANCES + FLEET_MAX_HANDLERS)
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
   int64_t backfill_since; /* with backfill_until: the window's start (0 when the document has none) */
} fleet_handler_t;

typedef struct {
   char *instance;
   int64_t heartbeat_at, started_at;
   bool live;
   bool kept;    /* its declarations are in the fleet's set (heartbeat within the retention) */
   bool stopped; /* it recorded a clean stop */
   char *version; /* the version it runs (NULL: its document has none, a version before 0.2.0) */
   fleet_handler_t *handlers;
   size_t n_handlers;
} fleet_instance_t;

/* Immutable once published; freed when its last reference goes. */
typedef struct fleet_set {
   _Atomic int refcount;
   int64_t read_at; /* when the documents were read (the server's clock, ms since the epoch) */
   fleet_instance_t *instances;
   size_t n_instances;
   /* The fleet's handler set: one per name over the kept instances, the
    * newest heartbeat's declaration (pointing into instances[]). */
   const fleet_handler_t **set;
   size_t n_set;
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
 * records them: {name, kind, events: [...], hash, backfillSince?,
 * backfillUntil?}.  `backfill_until` (NULL, or one per handler of cfg; 0
 * for none) dates the end of a backfill in progress, `backfill_since`
 * (NULL, or one per handler) the start of its window. */
bool fleet_append_handlers (const config_t *cfg,
                            const int64_t *backfill_since,
                            const int64_t *backfill_until,
                            bson_t *doc,
                            const char *key) __attribute__ ((warn_unused_result));

/* A snapshot from instance documents ({_id, heartbeatAt, startedAt,
 * handlers}), newest heartbeat first; `now` on the server's clock;
 * `live_ms`: an instance whose heartbeat is older than now - live_ms is
 * not live; `keep_ms`: one older than now - keep_ms is not kept (its
 * handlers leave the set).  Documents of another shape are skipped.
 * Refcount 1. */
fleet_set_t *fleet_set_from_docs (const bson_t *const *docs, size_t n, int64_t now, int64_t live_ms, int64_t keep_ms);

/* The heartbeatAt of instance `self`'s document among docs (the server's
 * clock when it was written), or `fallback` when there is none. */
int64_t fleet_docs_heartbeat (const bson_t *const *docs, size_t n, const char *self, int64_t fallback);

fleet_set_t *fleet_retain (fleet_set_t *fs);
void fleet_release (fleet_set_t *fs); /* NULL ok */

/* The process-wide current snapshot: fleet_publish takes over the caller's
 * reference; fleet_acquire returns a new reference (NULL before the first
 * refresh) the caller releases.  Neither blocks for longer than a pointer
 * copy. */
void fleet_publish (fleet_set_t *fs);
fleet_set_t *fleet_acquire (void);

/* Waits up to `timeout_ms` for the first snapshot; true once there is one.
 * For the start-up, before the proxy listens (it blocks).  It returns
 * false at once after fleet_note_failed: an attempt to read the set
 * failed (the outbox's set-up or the read itself; the upstream refuses
 * the credentials, say), and waiting longer only delays the proxy's
 * answer, while publishes are refused until the set is read anyway. */
bool fleet_wait_first (int64_t timeout_ms);
/* The dispatcher's attempt to set up the outbox or read the set failed. */
void fleet_note_failed (void);

/* True if a handler of `cfg`, or a handler of the set of `fs` (NULL:
 * none), subscribes to `type`. */
bool fleet_type_routed (const config_t *cfg, const fleet_set_t *fs, const char *type);

/* Does a kept instance other than `self` declare `name` (is it in the
 * set without `self`)? */
bool fleet_declared_elsewhere (const fleet_set_t *fs, const char *self, const char *name);

/* The latest heartbeat of any instance, live or not, that declares `name`;
 * 0 when none does. */
int64_t fleet_last_declared (const fleet_set_t *fs, const char *name);

/* The latest backfillUntil recorded for `name` by a kept instance other
 * than `self` that is live (`live`) or that is not (stopped or silent:
 * its backfill is nobody's until another declarer carries it on); 0:
 * none.  *since: that record's backfillSince (0 when it has none). */
int64_t fleet_backfill_record (const fleet_set_t *fs, const char *self, const char *name, bool live, int64_t *since);

/* Whether a live instance runs a version before 0.2.0 (its document has
 * no `version`, or one starting "0.1."): such a proxy claims in the
 * fixed lane spaces. */
bool fleet_old_version_live (const fleet_set_t *fs);

#endif /* RELAYBUS_FLEET_H */
