/*
 * store/claim_private.h - what the parts of one claim share: the claim's
 * state (claim_t, its lanes and keys) and the steps the parts call in each
 * other.
 * Thread: the claiming thread's (dispatcher or consumer), inside
 * store_claim with s->claim_mu held; functions that touch the instance's
 * memory (s->lanes, issued, settled) take s->mu themselves, or say that
 * their caller holds it.
 *
 * Included only by the files of store_claim: store/claim.c (store_claim
 * and its steps, the record, parking and reconciliation),
 * store/claim_held.c (the lane documents, the held lanes and the charging
 * of lost claims), store/claim_scan.c (the scan of due deliveries and the
 * pick), store/claim_lanes.c (free lanes: the probe and the takeover) and
 * store/claim_unpark.c (unparking, and the lowest pending sequence per
 * key).  A claim_t lives for one store_claim call; nothing here outlives
 * it but what the instance remembers in store_t.
 */
#ifndef RELAYBUS_STORE_CLAIM_PRIVATE_H
#define RELAYBUS_STORE_CLAIM_PRIVATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>
#include <mongoc/mongoc.h>

#include "base/outbox.h"
#include "store/store.h"
#include "store/store_private.h"

/* A scan over lanes reads at most this many due deliveries, so a claim
 * stays bounded even before parking has shrunk a backlog. */
#define SCAN_CAP 4096
/* How long a takeover waits for a document another (dead) worker's open
 * transaction holds before it leaves the lane for a later claim. */
#define STORE_TAKE_MAX_TIME_MS 1000
#define KEY_BUCKETS 256

/* What one claim knows about one (handler, key). */
typedef struct claim_key {
   struct claim_key *next;
   char *handler, *key;
   bool running;   /* a delivery of it is in one of our lanes' inFlight */
   bool taken;     /* this claim took one */
   bool probed;    /* a free-lane probe counted it */
   bool min_known; /* min_seq is the lowest pending sequence */
   int64_t min_seq;
   /* A run: the n_run lowest pending sequences, proven consecutive (no
    * other pending delivery of the key between them), run[0] == min_seq;
    * this claim may take them all, in this order (n_taken so far). */
   int64_t run[STORE_KEY_RUN_MAX];
   size_t n_run, n_taken;
   int64_t seq0; /* the sequence of the first one taken */
   store_oids_t blocked; /* due deliveries found waiting */
} claim_key_t;

/* A lane this claim works with, under `epoch`. */
typedef struct {
   uint32_t lane;
   int64_t epoch;
   store_oids_t inflight; /* as read, still running */
   store_oids_t known;    /* listed and running here: not read (claim_load_held) */
   store_oids_t gone;     /* listed, but the document is gone */
   store_oids_t picks;
   store_oids_t blocked;
   bool taken_now;
   bool skip; /* its lost claims could not be charged yet: not read from */
   bool capped; /* a scan of it stopped at SCAN_CAP: park all it found blocked */
} claim_lane_t;

/* One claim.  Owns its collections, lanes, keys and lane documents
 * (claim_free); `client` is popped from and pushed back to s->pool by
 * store_claim; `o` and `out` are the caller's. */
typedef struct {
   store_t *s;
   mongoc_client_t *client;
   mongoc_collection_t *deliveries, *events, *lanes_coll;
   const store_claim_opts_t *o;
   size_t *handler_taken; /* per handler */
   store_batch_t *out;
   size_t *out_lane; /* index into lanes[] of each picked item */
   claim_lane_t lanes[OUTBOX_LANES];
   size_t n_lanes;
   claim_key_t *keys[KEY_BUCKETS];
   /* Every lane document, read once at the start of the claim: the held
    * lanes are checked against it and the free ones found in it. */
   bson_t *lane_docs[OUTBOX_LANES];
   int64_t started_us; /* monotonic clock at o->now */
   int64_t lease_from; /* o->now plus the claim's own duration, at the record */
} claim_t;

/* -- claim.c: the claim's own helpers -- */

/* The state of (handler, key) in this claim, made on first use. */
claim_key_t *claim_key_get (claim_t *c, const char *handler, const char *key);
/* Appends `handler: {$in: [...]}`: every handler of the claim, or those
 * with room left. */
void claim_append_handlers_in (claim_t *c, bson_t *q, bool only_with_room);
/* True while some handler can still take a delivery. */
bool claim_handlers_have_room (claim_t *c);
/* The index of the handler in o->handlers, -1 when it is not one. */
int claim_handler_index (claim_t *c, const char *name);
/* How many deliveries of one key a claim may take together: o->key_run
 * within 1..STORE_KEY_RUN_MAX. */
size_t claim_key_run (const claim_t *c);

/* -- claim_held.c: the lane documents, the held lanes, lost claims -- */

/* A lane's `lost` list with, for each id, the lane epoch of the claim that
 * was lost (`lostEpochs`, parallel to `lost`).  A lane written before
 * lostEpochs existed has none: its lost claims count as lost under the
 * epoch before the current one, as they were charged then. */
typedef struct {
   store_oids_t ids;
   int64_t *epochs;
   size_t cap;
} claim_lost_t;

void claim_lost_push (claim_lost_t *l, const bson_oid_t *id, int64_t epoch);
void claim_lost_free (claim_lost_t *l);
/* Reads `lost` and `lostEpochs` of a lane document. */
void claim_lost_from_lane (claim_lost_t *l, const bson_t *doc, int64_t legacy_epoch);
/* Appends `lost: [...]` and `lostEpochs: [...]` to doc. */
void claim_lost_append (bson_t *doc, const claim_lost_t *l);
/* Charges the lost claims of a lane this claim holds under `epoch`, then
 * clears its list (see claim_held.c). */
bool claim_charge_lost (claim_t *c, uint32_t lane, int64_t epoch, const claim_lost_t *lost, bson_error_t *error)
   __attribute__ ((warn_unused_result));
/* After the charge of a lane this claim works with failed (`error`): a
 * charge another client's open transaction held up (STORE_ERROR_HELD)
 * makes the lane wait (`skip` in this claim, and a backoff for the next
 * ones: store_lane_held_t), logged once per lane a minute; true.  False
 * for any other error. */
bool claim_lane_hold (claim_t *c, claim_lane_t *l, const bson_error_t *error);
/* The lane's charges landed (held_up cleared): claims take from it at once. */
void claim_lane_released (claim_t *c, uint32_t lane);
/* The next of c->lanes, for a lane this claim works with under `epoch`. */
claim_lane_t *claim_add_lane (claim_t *c, uint32_t lane, int64_t epoch);
/* Reads the 256 lane documents of the instance's space into c->lane_docs
 * (one command). */
bool claim_read_lanes (claim_t *c, bson_error_t *error) __attribute__ ((warn_unused_result));
/* The lanes this instance holds, checked, charged and reconciled (see
 * claim_held.c). */
bool claim_load_held (claim_t *c, bson_error_t *error) __attribute__ ((warn_unused_result));

/* -- claim_scan.c: due deliveries of the claim's lanes, and the pick -- */

/* Reads the due, ready deliveries of lanes[from..n_lanes) in (dueAt, _id)
 * order and takes what the per-key rules allow, up to the limits. */
bool claim_scan (claim_t *c, size_t from, bson_error_t *error) __attribute__ ((warn_unused_result));
/* The lowest pending sequence of each key of ks[0..n) (min_seq, min_known). */
bool claim_keys_min_seq (claim_t *c, claim_key_t **ks, size_t n, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* -- claim_lanes.c: free lanes -- */

/* Finds free lanes with due work, takes as many as the batch needs and
 * scans them, until the batch or the handlers are full (see
 * claim_lanes.c); remembers what it did not take for the next claim. */
bool claim_free_lanes (claim_t *c, bson_error_t *error) __attribute__ ((warn_unused_result));

/* -- claim_unpark.c: unparking and the lowest pending sequences -- */

/* One (handler, key) pair, a sequence and the dueAt of that delivery. */
typedef struct {
   char *handler, *key;
   int64_t seq, due;
} claim_head_t;

void claim_heads_free (claim_head_t *v, size_t n);
/* The lowest pending sequence of each pair (handlers[i], keys[i]), one
 * aggregation per handler; *out (claim_heads_free) gets what exists. */
bool claim_pending_heads (claim_t *c,
                          char *const *handlers,
                          char *const *keys,
                          size_t n,
                          claim_head_t **out,
                          size_t *n_out,
                          bson_error_t *error) __attribute__ ((warn_unused_result));
/* Level-triggered unparking, a window of parked keys per claim; best
 * effort (a failure is logged). */
void claim_unpark (claim_t *c);

#endif /* RELAYBUS_STORE_CLAIM_PRIVATE_H */
