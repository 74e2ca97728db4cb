/*
 * store/claim.c - claims: the lane documents read once, lanes held first,
 * then the free lanes with due work that the batch needs, oldest due first,
 * taken together (a probe finds them, a later claim may reuse it); takeover
 * charging; per-key rules and runs; parking and level-triggered unparking;
 * one bulkWrite that records the batch; reconciliation after a failed
 * claim.
 *
 * A claim writes no delivery document on the normal path: what runs is
 * what the lanes' inFlight lists name.  Parking and unparking (the slow
 * path of blocked keys) and takeover charging are the exceptions.
 */
#include "store/store.h"
#include "store/store_private.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/assert.h"
#include "base/log.h"

/* A scan over lanes reads at most this many due deliveries, so a claim
 * stays bounded even before parking has shrunk a backlog. */
#define SCAN_CAP 4096
/* Due deliveries read before their keys are looked up together. */
#define SCAN_PAGE 256
/* The first read of a scan asks for twice what the batch still needs, at
 * least SCAN_FIRST_MIN, or SCAN_BATCH while keys of its lanes run (what
 * waits behind them comes first in the same order); each further read four
 * times the one before, up to SCAN_CAP in all. */
#define SCAN_FIRST_MIN 64
#define SCAN_BATCH 512
/* How long a takeover waits for a document another (dead) worker's open
 * transaction holds before it leaves the lane for a later claim. */
#define STORE_TAKE_MAX_TIME_MS 1000
#define KEY_BUCKETS 256
/* Parked keys looked at per claim. */
#define UNPARK_KEYS_MAX 1000
/* With no parked key seen, unparking looks again after this long (parked
 * deliveries come only from parking, which the claims of another instance
 * may do): one aggregation per handler per second instead of per claim. */
#define STORE_UNPARK_IDLE_MS 1000
/* Due deliveries one free-lane probe reads (laneId only), and probes per
 * claim at most. */
#define FREE_PROBE 512
#define FREE_PROBES_MAX 3

/* What one claim knows about one (handler, key). */
typedef struct key_state {
   struct key_state *next;
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
} key_state_t;

/* A lane this claim works with, under `epoch`. */
typedef struct {
   uint32_t lane;
   int64_t epoch;
   store_oids_t inflight; /* as read, still running */
   store_oids_t known;    /* listed and running here: not read (load_held) */
   store_oids_t gone;     /* listed, but the document is gone */
   store_oids_t picks;
   store_oids_t blocked;
   bool taken_now;
   bool skip; /* its lost claims could not be charged yet: not read from */
   bool capped; /* a scan of it stopped at SCAN_CAP: park all it found blocked */
} claim_lane_t;

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
   key_state_t *keys[KEY_BUCKETS];
   /* Every lane document, read once at the start of the claim: the held
    * lanes are checked against it and the free ones found in it. */
   bson_t *lane_docs[OUTBOX_LANES];
   int64_t started_us; /* monotonic clock at o->now */
   int64_t lease_from; /* o->now plus the claim's own duration, at the record */
} claim_t;

/* Frees what a claimed delivery owns (not the delivery itself). */
static void
delivery_free (store_delivery_t *d)
{
   char *owned[] = {d->event_id, d->handler, d->event_type, d->key};

   for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++)
      bson_free (owned[i]);
   bson_destroy (d->event);
}

void
store_batch_clear (store_batch_t *b)
{
   if (!b)
      return;
   for (size_t i = 0; i < b->n; i++)
      delivery_free (&b->items[i]);
   bson_free (b->items);
   memset (b, 0, sizeof *b);
}

static key_state_t *
key_get (claim_t *c, const char *handler, const char *key)
{
   uint32_t h = outbox_fnv1a (handler, strlen (handler)) ^ outbox_fnv1a (key, strlen (key));
   key_state_t **b = &c->keys[h % KEY_BUCKETS], *k;

   for (k = *b; k; k = k->next)
      if (!strcmp (k->handler, handler) && !strcmp (k->key, key))
         return k;
   k = bson_malloc0 (sizeof *k);
   k->handler = bson_strdup (handler);
   k->key = bson_strdup (key);
   k->next = *b;
   *b = k;
   return k;
}

static void
claim_free (claim_t *c)
{
   for (int i = 0; i < KEY_BUCKETS; i++) {
      key_state_t *k = c->keys[i], *next;
      for (; k; k = next) {
         next = k->next;
         bson_free (k->handler);
         bson_free (k->key);
         store_oids_free (&k->blocked);
         bson_free (k);
      }
   }
   for (size_t i = 0; i < c->n_lanes; i++) {
      store_oids_free (&c->lanes[i].inflight);
      store_oids_free (&c->lanes[i].known);
      store_oids_free (&c->lanes[i].gone);
      store_oids_free (&c->lanes[i].picks);
      store_oids_free (&c->lanes[i].blocked);
   }
   for (int i = 0; i < OUTBOX_LANES; i++)
      bson_destroy (c->lane_docs[i]);
   bson_free (c->handler_taken);
   bson_free (c->out_lane);
   mongoc_collection_destroy (c->deliveries);
   mongoc_collection_destroy (c->events);
   mongoc_collection_destroy (c->lanes_coll);
}

static void
append_handlers_in (claim_t *c, bson_t *q, bool only_with_room)
{
   bson_t sub, arr;
   char buf[16];
   const char *key;
   uint32_t k = 0;

   BSON_APPEND_DOCUMENT_BEGIN (q, "handler", &sub);
   BSON_APPEND_ARRAY_BEGIN (&sub, "$in", &arr);
   for (size_t i = 0; i < c->o->n_handlers; i++) {
      if (only_with_room && c->handler_taken[i] >= c->o->handlers[i].limit)
         continue;
      bson_uint32_to_string (k++, &key, buf, sizeof buf);
      BSON_APPEND_UTF8 (&arr, key, c->o->handlers[i].handler);
   }
   bson_append_array_end (&sub, &arr);
   bson_append_document_end (q, &sub);
}

static bool
handlers_have_room (claim_t *c)
{
   for (size_t i = 0; i < c->o->n_handlers; i++)
      if (c->handler_taken[i] < c->o->handlers[i].limit)
         return true;
   return false;
}

static int
handler_index (claim_t *c, const char *name)
{
   for (size_t i = 0; i < c->o->n_handlers; i++)
      if (!strcmp (c->o->handlers[i].handler, name))
         return (int) i;
   return -1;
}

/* --------------------------------------------------------------- unpark */

/* One (handler, key) pair, a sequence and the dueAt of that delivery. */
typedef struct {
   char *handler, *key;
   int64_t seq, due;
} hk_seq_t;

static void
hk_free (hk_seq_t *v, size_t n)
{
   for (size_t i = 0; i < n; i++) {
      bson_free (v[i].handler);
      bson_free (v[i].key);
   }
   bson_free (v);
}

/* The lowest sequence of each key of one handler: runs [{$match: {handler,
 * ...match}}, {$sort: {handler, key, sequence}}, {$group: {_id: "$key",
 * seq: {$first: "$sequence"}, due: {$first: "$dueAt"}}}] followed by `tail`
 * (more stages, or NULL) and appends the groups to *out.  With the handler
 * fixed, the sort on the fields of the ordering and parked indexes and a
 * group on the single field `key` with $first only, this is the shape the
 * server can answer with a distinct scan: one index probe per key, however
 * many deliveries each key has. */
static bool
heads_by_key (claim_t *c,
              const char *handler,
              const bson_t *match,
              const bson_t *tail,
              hk_seq_t **out,
              size_t *n_out,
              size_t *cap,
              bson_error_t *error)
{
   bson_t m = BSON_INITIALIZER;
   bson_t *pipeline, *with_tail, arr;
   bson_iter_t it, st;
   uint32_t k = 0;
   char buf[16];
   const char *key;
   mongoc_cursor_t *cur;
   const bson_t *doc;
   bool ok = true;

   BSON_APPEND_UTF8 (&m, "handler", handler);
   bson_concat (&m, match);
   pipeline = BCON_NEW ("pipeline", "[", "{", "$match", BCON_DOCUMENT (&m), "}", "{", "$sort", "{", "handler",
                        BCON_INT32 (1), "key", BCON_INT32 (1), "sequence", BCON_INT32 (1), "}", "}", "{", "$group",
                        "{", "_id", BCON_UTF8 ("$key"), "seq", "{", "$first", BCON_UTF8 ("$sequence"), "}", "due",
                        "{", "$first", BCON_UTF8 ("$dueAt"), "}", "}", "}", "]");
   /* The stages of `tail` (an array-like document) after those. */
   with_tail = bson_new ();
   BSON_APPEND_ARRAY_BEGIN (with_tail, "pipeline", &arr);
   if (bson_iter_init_find (&it, pipeline, "pipeline") && bson_iter_recurse (&it, &st))
      while (bson_iter_next (&st)) {
         bson_uint32_to_string (k++, &key, buf, sizeof buf);
         bson_append_iter (&arr, key, -1, &st);
      }
   if (tail && bson_iter_init (&st, tail))
      while (bson_iter_next (&st)) {
         bson_uint32_to_string (k++, &key, buf, sizeof buf);
         bson_append_iter (&arr, key, -1, &st);
      }
   bson_append_array_end (with_tail, &arr);
   cur = mongoc_collection_aggregate (c->deliveries, MONGOC_QUERY_NONE, with_tail, NULL, NULL);
   while (mongoc_cursor_next (cur, &doc)) {
      const char *kv = store_iter_utf8 (doc, "_id");
      if (!kv)
         continue;
      if (*n_out == *cap) {
         *cap = *cap ? *cap * 2 : 32;
         *out = bson_realloc (*out, *cap * sizeof **out);
      }
      (*out)[*n_out].handler = bson_strdup (handler);
      (*out)[*n_out].key = bson_strdup (kv);
      (*out)[*n_out].seq = store_iter_int64 (doc, "seq");
      (*out)[*n_out].due = store_iter_date (doc, "due");
      (*n_out)++;
   }
   if (!store_cursor_end (cur, error, "lowest sequence per key"))
      ok = false;
   bson_destroy (with_tail);
   bson_destroy (pipeline);
   bson_destroy (&m);
   return ok;
}

/* The lowest pending sequence of each pair (handlers[i], keys[i]), one
 * aggregation per handler (heads_by_key over the ordering index). */
static bool
pending_heads (claim_t *c, char *const *handlers, char *const *keys, size_t n, hk_seq_t **out, size_t *n_out, bson_error_t *error)
{
   bool *done = bson_malloc0 ((n + 1) * sizeof *done);
   size_t cap = 0;
   bool ok = true;

   *out = NULL;
   *n_out = 0;
   for (size_t i = 0; ok && i < n; i++) {
      bson_t m = BSON_INITIALIZER, sub, arr;
      uint32_t k = 0;
      if (done[i])
         continue;
      BSON_APPEND_UTF8 (&m, "status", "pending");
      BSON_APPEND_DOCUMENT_BEGIN (&m, "sequence", &sub); /* the ordering index's partial filter */
      BSON_APPEND_BOOL (&sub, "$exists", true);
      bson_append_document_end (&m, &sub);
      BSON_APPEND_DOCUMENT_BEGIN (&m, "key", &sub);
      BSON_APPEND_ARRAY_BEGIN (&sub, "$in", &arr);
      for (size_t j = i; j < n; j++)
         if (!done[j] && !strcmp (handlers[j], handlers[i])) {
            char buf[16];
            const char *key;
            bson_uint32_to_string (k++, &key, buf, sizeof buf);
            BSON_APPEND_UTF8 (&arr, key, keys[j]);
            done[j] = true;
         }
      bson_append_array_end (&sub, &arr);
      bson_append_document_end (&m, &sub);
      ok = heads_by_key (c, handlers[i], &m, NULL, out, n_out, &cap, error);
      bson_destroy (&m);
   }
   bson_free (done);
   return ok;
}

static int
hk_cmp (const void *a, const void *b)
{
   const hk_seq_t *x = a, *y = b;
   int r;
   if (x->due != y->due)
      return x->due < y->due ? -1 : 1;
   if ((r = strcmp (x->handler, y->handler)) != 0)
      return r;
   return strcmp (x->key, y->key);
}

/* The tail of the parked-keys aggregation of `handler`: oldest head first,
 * after the cursor (due, h, k) of the previous claim, UNPARK_KEYS_MAX at
 * most. */
static bson_t *
unpark_tail (const store_t *s, const char *handler)
{
   bson_t *tail = bson_new (), st, sub, cond;
   int cmp = s->unpark_h ? strcmp (handler, s->unpark_h) : 0;
   uint32_t k = 0;
   char buf[16];
   const char *key;

   bson_uint32_to_string (k++, &key, buf, sizeof buf);
   BSON_APPEND_DOCUMENT_BEGIN (tail, key, &st);
   BSON_APPEND_DOCUMENT_BEGIN (&st, "$sort", &sub);
   BSON_APPEND_INT32 (&sub, "due", 1);
   BSON_APPEND_INT32 (&sub, "_id", 1);
   bson_append_document_end (&st, &sub);
   bson_append_document_end (tail, &st);
   if (s->unpark_h && s->unpark_k) {
      bson_uint32_to_string (k++, &key, buf, sizeof buf);
      BSON_APPEND_DOCUMENT_BEGIN (tail, key, &st);
      BSON_APPEND_DOCUMENT_BEGIN (&st, "$match", &cond);
      if (cmp != 0) {
         /* After (due, h, k): a later handler from `due` on, an earlier
          * one only after it. */
         BSON_APPEND_DOCUMENT_BEGIN (&cond, "due", &sub);
         BSON_APPEND_DATE_TIME (&sub, cmp > 0 ? "$gte" : "$gt", s->unpark_due);
         bson_append_document_end (&cond, &sub);
      } else {
         bson_value_t last = {.value_type = BSON_TYPE_UTF8};
         last.value.v_utf8.str = s->unpark_k;
         last.value.v_utf8.len = (uint32_t) strlen (s->unpark_k);
         store_append_after_key (&cond, "due", s->unpark_due, &last);
      }
      bson_append_document_end (&st, &cond);
      bson_append_document_end (tail, &st);
   }
   bson_uint32_to_string (k++, &key, buf, sizeof buf);
   BSON_APPEND_DOCUMENT_BEGIN (tail, key, &st);
   BSON_APPEND_INT32 (&st, "$limit", UNPARK_KEYS_MAX);
   bson_append_document_end (tail, &st);
   return tail;
}

/* Level-triggered: the lowest parked delivery of each key whose handler has
 * no pending delivery with a lower sequence goes back to `ready`, with the
 * parked ones that follow it up to the claim's key run.  The
 * parked keys are looked at in (dueAt of their lowest parked delivery,
 * handler, key) order, oldest first, UNPARK_KEYS_MAX per claim, resuming
 * after the last key the previous claim looked at and starting over at the
 * end: every parked key is looked at within ceil(parked keys /
 * UNPARK_KEYS_MAX) claims.  Per handler, one aggregation over the parked
 * index and one over the ordering index (a distinct scan each: one probe
 * per key), then one update.  Best effort: a failure is logged and the
 * claim goes on. */
static void
unpark (claim_t *c)
{
   store_t *s = c->s;
   bson_t upd_q = BSON_INITIALIZER, or_arr;
   hk_seq_t *parked = NULL, *pending = NULL;
   size_t n_parked = 0, cap_parked = 0, n_pending = 0;
   char **hs = NULL, **ks = NULL;
   uint32_t n_or = 0;
   bool more = false;
   bson_error_t err;
   size_t run = c->o->key_run < 1 ? 1 : c->o->key_run > STORE_KEY_RUN_MAX ? STORE_KEY_RUN_MAX : c->o->key_run;

   if (c->o->now < s->unpark_next && c->o->now >= s->unpark_next - STORE_UNPARK_IDLE_MS)
      return;
   s->unpark_next = c->o->now + STORE_UNPARK_IDLE_MS;

   /* 1. the parked keys: a window per handler, then the oldest overall */
   for (size_t i = 0; i < c->o->n_handlers; i++) {
      bson_t m = BSON_INITIALIZER;
      bson_t *tail = unpark_tail (s, c->o->handlers[i].handler);
      size_t before = n_parked;
      bool ok;
      BSON_APPEND_UTF8 (&m, "lane", "parked");
      ok = heads_by_key (c, c->o->handlers[i].handler, &m, tail, &parked, &n_parked, &cap_parked, &err);
      bson_destroy (tail);
      bson_destroy (&m);
      if (!ok) {
         log_warn ("store: unparking: %s", err.message);
         goto done;
      }
      if (n_parked - before >= UNPARK_KEYS_MAX)
         more = true;
   }
   if (n_parked > 1)
      qsort (parked, n_parked, sizeof *parked, hk_cmp);
   if (n_parked > UNPARK_KEYS_MAX) {
      more = true;
      for (size_t i = UNPARK_KEYS_MAX; i < n_parked; i++) {
         bson_free (parked[i].handler);
         bson_free (parked[i].key);
      }
      n_parked = UNPARK_KEYS_MAX;
   }
   /* Where the next claim goes on: after the last key looked at, or from
    * the start once every window reached its end. */
   bson_free (s->unpark_h);
   bson_free (s->unpark_k);
   s->unpark_h = s->unpark_k = NULL;
   if (more && n_parked > 0) {
      s->unpark_due = parked[n_parked - 1].due;
      s->unpark_h = bson_strdup (parked[n_parked - 1].handler);
      s->unpark_k = bson_strdup (parked[n_parked - 1].key);
   }
   if (n_parked == 0)
      goto done;
   s->unpark_next = 0; /* parked keys exist: look again next claim */

   /* 2. their lowest pending sequences */
   hs = bson_malloc (n_parked * sizeof *hs);
   ks = bson_malloc (n_parked * sizeof *ks);
   for (size_t i = 0; i < n_parked; i++) {
      hs[i] = parked[i].handler;
      ks[i] = parked[i].key;
   }
   if (!pending_heads (c, hs, ks, n_parked, &pending, &n_pending, &err)) {
      log_warn ("store: unparking: %s", err.message);
      goto done;
   }

   /* 3. one update: the heads with no unfinished predecessor, each with the
    * parked deliveries that follow it up to a run (sequences head to head +
    * run - 1: a key's sequences are dense, so at most a run of them), which
    * the claim can then take together; its per-key check decides their
    * order as for any ready delivery. */
   BSON_APPEND_ARRAY_BEGIN (&upd_q, "$or", &or_arr);
   for (size_t i = 0; i < n_parked; i++) {
      bool blocked = false;
      for (size_t j = 0; j < n_pending; j++)
         if (!strcmp (pending[j].handler, parked[i].handler) && !strcmp (pending[j].key, parked[i].key))
            blocked = pending[j].seq < parked[i].seq; /* an unfinished predecessor */
      if (!blocked) {
         char buf[16];
         const char *k;
         bson_t one, rng;
         bson_uint32_to_string (n_or++, &k, buf, sizeof buf);
         BSON_APPEND_DOCUMENT_BEGIN (&or_arr, k, &one);
         BSON_APPEND_UTF8 (&one, "handler", parked[i].handler);
         BSON_APPEND_UTF8 (&one, "key", parked[i].key);
         BSON_APPEND_DOCUMENT_BEGIN (&one, "sequence", &rng);
         BSON_APPEND_INT64 (&rng, "$gte", parked[i].seq);
         BSON_APPEND_INT64 (&rng, "$lt", parked[i].seq + (int64_t) run);
         bson_append_document_end (&one, &rng);
         BSON_APPEND_UTF8 (&one, "lane", "parked");
         bson_append_document_end (&or_arr, &one);
      }
   }
   bson_append_array_end (&upd_q, &or_arr);
   if (n_or > 0) {
      bson_t *upd = BCON_NEW ("$set", "{", "lane", BCON_UTF8 ("ready"), "}");
      bson_t reply;
      if (!mongoc_collection_update_many (c->deliveries, &upd_q, upd, NULL, &reply, &err))
         log_warn ("store: unparking: %s", err.message);
      else
         log_debug ("store: unparked %" PRId64 " delivery(ies), runs of up to %zu from the heads of %u key(s)",
                    store_iter_int64 (&reply, "modifiedCount"),
                    run,
                    n_or);
      bson_destroy (&reply);
      bson_destroy (upd);
   }

done:
   bson_free (hs);
   bson_free (ks);
   hk_free (parked, n_parked);
   hk_free (pending, n_pending);
   bson_destroy (&upd_q);
}

/* ------------------------------------------------------------- charging */

/* A lane's `lost` list with, for each id, the lane epoch of the claim that
 * was lost (`lostEpochs`, parallel to `lost`).  A lane written before
 * lostEpochs existed has none: its lost claims count as lost under the
 * epoch before the current one, as they were charged then. */
typedef struct {
   store_oids_t ids;
   int64_t *epochs;
   size_t cap;
} lost_list_t;

static void
lost_push (lost_list_t *l, const bson_oid_t *id, int64_t epoch)
{
   store_oids_push (&l->ids, id);
   if (l->ids.n > l->cap) {
      l->cap = l->ids.cap > l->ids.n ? l->ids.cap : l->ids.n;
      l->epochs = bson_realloc (l->epochs, l->cap * sizeof *l->epochs);
   }
   l->epochs[l->ids.n - 1] = epoch;
}

static void
lost_free (lost_list_t *l)
{
   store_oids_free (&l->ids);
   bson_free (l->epochs);
   memset (l, 0, sizeof *l);
}

/* Reads `lost` and `lostEpochs` of a lane document. */
static void
lost_from_lane (lost_list_t *l, const bson_t *doc, int64_t legacy_epoch)
{
   store_oids_t ids = {0};
   int64_t *epochs = NULL;
   size_t n_epochs = 0;
   bson_iter_t it, child;

   store_oids_from_array (&ids, doc, "lost");
   if (ids.n > 0 && bson_iter_init_find (&it, doc, "lostEpochs") && BSON_ITER_HOLDS_ARRAY (&it) &&
       bson_iter_recurse (&it, &child)) {
      epochs = bson_malloc0 (ids.n * sizeof *epochs);
      while (bson_iter_next (&child) && n_epochs < ids.n)
         if (BSON_ITER_HOLDS_NUMBER (&child))
            epochs[n_epochs++] = bson_iter_as_int64 (&child);
   }
   for (size_t i = 0; i < ids.n; i++)
      lost_push (l, &ids.v[i], n_epochs == ids.n ? epochs[i] : legacy_epoch);
   bson_free (epochs);
   store_oids_free (&ids);
}

/* Appends `lost: [...]` and `lostEpochs: [...]` to doc. */
static void
lost_append (bson_t *doc, const lost_list_t *l)
{
   bson_t arr;
   char buf[16];
   const char *key;

   store_append_oids_array (doc, "lost", l->ids.v, l->ids.n);
   BSON_APPEND_ARRAY_BEGIN (doc, "lostEpochs", &arr);
   for (size_t i = 0; i < l->ids.n; i++) {
      bson_uint32_to_string ((uint32_t) i, &key, buf, sizeof buf);
      BSON_APPEND_INT64 (&arr, key, l->epochs[i]);
   }
   bson_append_array_end (doc, &arr);
}

/* Charges one attempt to every delivery of `lost` for the claim of the
 * epoch recorded with it, moving its claim generation on.  A delivery is
 * charged for epoch E only while its `lostAt` is below E, and `lostAt`
 * becomes E: charging the same list again (the previous taker died before
 * clearing it), or a delayed charge of an older lost claim, charges
 * nothing twice.  The epochs are charged in ascending order, one update
 * each (a list holds one or two).  Then the list is cleared on the lane
 * (still under `epoch`, and only if it is still the list charged). */
static bool
charge_lost (claim_t *c, uint32_t lane, int64_t epoch, const lost_list_t *lost, bson_error_t *error)
{
   bson_t *lq, *lu;
   bson_error_t err;
   int64_t done_upto = INT64_MIN;
   bool ok = true;

   if (lost->ids.n == 0)
      return true;
   for (;;) {
      int64_t e = INT64_MAX;
      bson_t q = BSON_INITIALIZER, reply, *never, *before;
      store_oids_t group = {0};
      bson_t *upd, *opts;

      for (size_t i = 0; i < lost->ids.n; i++)
         if (lost->epochs[i] > done_upto && lost->epochs[i] < e)
            e = lost->epochs[i];
      if (e == INT64_MAX)
         break;
      done_upto = e;
      for (size_t i = 0; i < lost->ids.n; i++)
         if (lost->epochs[i] == e && !store_oids_has (&group, &lost->ids.v[i]))
            store_oids_push (&group, &lost->ids.v[i]);
      store_append_oids_op (&q, "_id", "$in", group.v, group.n);
      BSON_APPEND_UTF8 (&q, "status", "pending");
      never = BCON_NEW ("lostAt", "{", "$exists", BCON_BOOL (false), "}");
      before = BCON_NEW ("lostAt", "{", "$lt", BCON_INT64 (e), "}");
      store_append_or2 (&q, never, before);
      bson_destroy (never);
      bson_destroy (before);
      upd = BCON_NEW ("$inc", "{", "attempts", BCON_INT32 (1), "claims", BCON_INT32 (1), "}", "$set", "{", "lostAt",
                      BCON_INT64 (e), "updatedAt", BCON_DATE_TIME (c->o->now), "}");
      opts = BCON_NEW ("maxTimeMS", BCON_INT32 (STORE_TAKE_MAX_TIME_MS));
      ok = mongoc_collection_update_many (c->deliveries, &q, upd, opts, &reply, &err);
      if (ok && store_iter_int64 (&reply, "modifiedCount") > 0)
         log_info ("store: lane %u: charged %" PRId64 " lost attempt(s) of epoch %" PRId64,
                   lane,
                   store_iter_int64 (&reply, "modifiedCount"),
                   e);
      bson_destroy (&reply);
      bson_destroy (opts);
      bson_destroy (upd);
      bson_destroy (&q);
      store_oids_free (&group);
      if (!ok) {
         store_set_error (error, STORE_ERROR_SERVER, "charging lost claims of lane %u: %s", lane, err.message);
         return false;
      }
   }
   lq = BCON_NEW ("_id", BCON_INT32 ((int32_t) lane), "epoch", BCON_INT64 (epoch));
   store_append_oids_array (lq, "lost", lost->ids.v, lost->ids.n);
   lu = BCON_NEW ("$set", "{", "lost", "[", "]", "lostEpochs", "[", "]", "}");
   ok = mongoc_collection_update_one (c->lanes_coll, lq, lu, NULL, NULL, &err);
   bson_destroy (lq);
   bson_destroy (lu);
   if (!ok)
      store_set_error (error, STORE_ERROR_SERVER, "clearing lost claims of lane %u: %s", lane, err.message);
   return ok;
}

/* --------------------------------------------------------------- lanes */

static claim_lane_t *
add_lane (claim_t *c, uint32_t lane, int64_t epoch)
{
   claim_lane_t *l;

   /* A claim works with each of the 256 lanes at most once. */
   RELAYBUS_ASSERT (c->n_lanes < OUTBOX_LANES && lane < OUTBOX_LANES);
   l = &c->lanes[c->n_lanes++];
   *l = (claim_lane_t) {.lane = lane, .epoch = epoch};
   return l;
}

/* Reads the 256 lane documents with one command (one batch). */
static bool
read_lanes (claim_t *c, bson_error_t *error)
{
   bson_t *opts = BCON_NEW ("batchSize", BCON_INT32 (OUTBOX_LANES + 1));
   mongoc_cursor_t *cur = mongoc_collection_find_with_opts (c->lanes_coll, &(bson_t) BSON_INITIALIZER, opts, NULL);
   const bson_t *doc;
   bool ok = true;

   while (mongoc_cursor_next (cur, &doc)) {
      int64_t lane = store_iter_int64 (doc, "_id");
      if (lane >= 0 && lane < OUTBOX_LANES && !c->lane_docs[lane])
         c->lane_docs[lane] = bson_copy (doc);
   }
   if (!store_cursor_end (cur, error, "reading lanes"))
      ok = false;
   bson_destroy (opts);
   return ok;
}

/* The lanes this instance holds under a live lease: checked against the
 * lane documents as read (owner and epoch), their lost lists charged,
 * their inFlight documents loaded to learn which keys run and which ids
 * are gone. */
static bool
load_held (claim_t *c, bson_error_t *error)
{
   store_t *s = c->s;
   mongoc_cursor_t *cur;
   const bson_t *doc;
   bson_error_t err;
   store_lane_state_t held[OUTBOX_LANES];
   store_oids_t all = {0};
   bool ok = true;

   /* Lanes whose lease expired stay ours as long as nobody took them over
    * (the epoch check below): an expired lease nobody took over is still
    * honoured, and re-taking our own lane would charge the attempts we are
    * still running. */
   pthread_mutex_lock (&s->mu);
   memcpy (held, s->lanes, sizeof held);
   pthread_mutex_unlock (&s->mu);

   for (uint32_t lane = 0; lane < OUTBOX_LANES; lane++) {
      const bson_t *ld = c->lane_docs[lane];
      int64_t epoch;
      const char *owner;
      claim_lane_t *l;
      lost_list_t lost = {0};

      if (!held[lane].held)
         continue;
      if (!ld) {
         pthread_mutex_lock (&s->mu);
         s->lanes[lane].held = false;
         store_issued_remove_lane (s, lane);
         pthread_mutex_unlock (&s->mu);
         continue;
      }
      epoch = store_iter_int64 (ld, "epoch");
      owner = store_iter_utf8 (ld, "owner");
      if (!owner || strcmp (owner, s->owner) != 0 || epoch != held[lane].epoch) {
         pthread_mutex_lock (&s->mu);
         s->lanes[lane].held = false;
         store_issued_remove_lane (s, lane);
         pthread_mutex_unlock (&s->mu);
         log_info ("store: lane %u was taken over (epoch %" PRId64 ")", lane, epoch);
         continue;
      }
      l = add_lane (c, lane, epoch);
      store_oids_from_array (&l->inflight, ld, "inFlight");
      lost_from_lane (&lost, ld, epoch - 1);
      if (lost.ids.n > 0 && !charge_lost (c, lane, epoch, &lost, &err)) {
         /* Typically a dead worker's open transaction still locks one of
          * the deliveries: leave the lane alone until a later claim. */
         log_warn ("store: %s; the lane waits for a later claim", err.message);
         l->skip = true;
      }
      lost_free (&lost);
      /* What this instance knows needs no read: what it completed is
       * gone, what it runs under a live claim of this lane epoch still
       * runs.  The rest (an abandoned or unknown claim) is read below. */
      {
         store_oids_t unknown = {0};
         pthread_mutex_lock (&s->mu);
         for (size_t i = 0; i < l->inflight.n; i++) {
            const bson_oid_t *id = &l->inflight.v[i];
            const store_issued_t *is = store_issued_find (s, id);
            if (store_oids_has (&s->settled, id)) {
               store_oids_push (&l->gone, id);
            } else if (!l->skip && is && is->lane == l->lane && is->epoch == l->epoch && is->expires > c->o->now) {
               store_oids_push (&l->known, id);
               if (is->handler && is->key)
                  key_get (c, is->handler, is->key)->running = true;
            } else {
               store_oids_push (&unknown, id);
               store_oids_push (&all, id);
            }
         }
         pthread_mutex_unlock (&s->mu);
         store_oids_free (&l->inflight);
         l->inflight = unknown;
      }
   }
   if (!ok || all.n == 0)
      goto merge;

   /* Which of the listed deliveries still exist, which of them this
    * instance still runs (it handed out their current claim, and that
    * claim's own lease was handed out or renewed less than a lease ago),
    * and which keys run.  A listed delivery this instance no longer runs
    * (its worker could not settle it and stopped renewing it) is
    * abandoned: its claim generation moves on here, before the lane stops
    * listing it in the record, so the old lease never matches again and
    * the delivery is runnable at once, also with a single proxy.  The
    * abandoned claim was an attempt (its worker was handed the delivery,
    * and may have delivered it), so it is charged as a takeover charges a
    * lost claim: a worker that keeps dying on a delivery brings it to the
    * dead letters here too. */
   {
      bson_t fq = BSON_INITIALIZER;
      bson_t *opts = BCON_NEW ("projection", "{", "handler", BCON_INT32 (1), "key", BCON_INT32 (1), "laneId",
                               BCON_INT32 (1), "claims", BCON_INT32 (1), "}");
      store_oids_t found = {0}, abandoned = {0};
      int32_t *found_claims = NULL;
      char **found_h = NULL, **found_k = NULL;
      size_t cap_found = 0;
      bson_t aq = BSON_INITIALIZER, or_arr;
      uint32_t n_or = 0;

      store_append_oids_op (&fq, "_id", "$in", all.v, all.n);
      cur = mongoc_collection_find_with_opts (c->deliveries, &fq, opts, NULL);
      while (mongoc_cursor_next (cur, &doc)) {
         bson_iter_t it;
         const char *h = store_iter_utf8 (doc, "handler"), *key = store_iter_utf8 (doc, "key");
         if (!bson_iter_init_find (&it, doc, "_id") || !BSON_ITER_HOLDS_OID (&it))
            continue;
         store_oids_push (&found, bson_iter_oid (&it));
         if (found.n > cap_found) {
            cap_found = found.cap;
            found_claims = bson_realloc (found_claims, cap_found * sizeof *found_claims);
            found_h = bson_realloc (found_h, cap_found * sizeof *found_h);
            found_k = bson_realloc (found_k, cap_found * sizeof *found_k);
         }
         found_claims[found.n - 1] = (int32_t) store_iter_int64 (doc, "claims");
         found_h[found.n - 1] = h && key ? bson_strdup (h) : NULL;
         found_k[found.n - 1] = h && key ? bson_strdup (key) : NULL;
      }
      if (!store_cursor_end (cur, error, "reading in-flight deliveries"))
         ok = false;
      bson_destroy (&fq);
      bson_destroy (opts);
      BSON_APPEND_ARRAY_BEGIN (&aq, "$or", &or_arr);
      pthread_mutex_lock (&s->mu);
      for (size_t i = 0; ok && i < c->n_lanes; i++) {
         claim_lane_t *l = &c->lanes[i];
         store_oids_t still = {0};
         for (size_t j = 0; j < l->inflight.n; j++) {
            size_t f;
            const store_issued_t *is;
            for (f = 0; f < found.n; f++)
               if (bson_oid_equal (&found.v[f], &l->inflight.v[j]))
                  break;
            if (f == found.n) {
               store_oids_push (&l->gone, &l->inflight.v[j]);
               continue;
            }
            is = store_issued_find (s, &l->inflight.v[j]);
            /* A lane left alone this claim (its lost claims could not be
             * charged) is not written: what it lists waits too. */
            if (l->skip || (is && is->lane == l->lane && is->epoch == l->epoch && is->claims == found_claims[f] &&
                            is->expires > c->o->now)) {
               store_oids_push (&still, &l->inflight.v[j]);
               if (found_h[f])
                  key_get (c, found_h[f], found_k[f])->running = true;
            } else {
               char buf[16];
               const char *ok_key;
               bson_t one;
               bson_uint32_to_string (n_or++, &ok_key, buf, sizeof buf);
               BSON_APPEND_DOCUMENT_BEGIN (&or_arr, ok_key, &one);
               BSON_APPEND_OID (&one, "_id", &l->inflight.v[j]);
               store_append_claims_match (&one, found_claims[f]);
               bson_append_document_end (&or_arr, &one);
               store_oids_push (&abandoned, &l->inflight.v[j]);
               store_oids_push (&l->gone, &l->inflight.v[j]);
            }
         }
         store_oids_free (&l->inflight);
         l->inflight = still;
      }
      pthread_mutex_unlock (&s->mu);
      bson_append_array_end (&aq, &or_arr);
      if (ok && abandoned.n > 0) {
         bson_t *au = BCON_NEW ("$inc", "{", "attempts", BCON_INT32 (1), "claims", BCON_INT32 (1), "}", "$set", "{",
                                "updatedAt", BCON_DATE_TIME (c->o->now), "}");
         if (!mongoc_collection_update_many (c->deliveries, &aq, au, NULL, NULL, &err)) {
            store_set_error (error, STORE_ERROR_SERVER, "reconciling abandoned claims: %s", err.message);
            ok = false;
         } else {
            log_warn ("store: %zu listed delivery(ies) no longer run here (not settled, not renewed for a lease): "
                      "charged an attempt each and made runnable again",
                      abandoned.n);
            pthread_mutex_lock (&s->mu);
            for (size_t j = 0; j < abandoned.n; j++)
               store_issued_remove (s, &abandoned.v[j]);
            pthread_mutex_unlock (&s->mu);
         }
         bson_destroy (au);
      }
      for (size_t f = 0; f < found.n; f++) {
         bson_free (found_h[f]);
         bson_free (found_k[f]);
      }
      bson_free (found_h);
      bson_free (found_k);
      bson_free (found_claims);
      bson_destroy (&aq);
      store_oids_free (&found);
      store_oids_free (&abandoned);
   }
merge:
   for (size_t i = 0; i < c->n_lanes; i++) {
      claim_lane_t *l = &c->lanes[i];
      for (size_t j = 0; j < l->known.n; j++)
         store_oids_push (&l->inflight, &l->known.v[j]);
   }
   store_oids_free (&all);
   return ok;
}

/* ---------------------------------------------------------------- scan */

/* The lowest pending sequence of each (handler, key) of `ks`, from the
 * ordering index, with one aggregation per handler (one probe per key). */
static bool
keys_min_seq (claim_t *c, key_state_t **ks, size_t n, bson_error_t *error)
{
   hk_seq_t *found = NULL;
   size_t n_found = 0;
   char **hs, **keys;
   bool ok;

   if (n == 0)
      return true;
   hs = bson_malloc (n * sizeof *hs);
   keys = bson_malloc (n * sizeof *keys);
   for (size_t i = 0; i < n; i++) {
      hs[i] = ks[i]->handler;
      keys[i] = ks[i]->key;
   }
   ok = pending_heads (c, hs, keys, n, &found, &n_found, error);
   for (size_t i = 0; ok && i < n; i++) {
      ks[i]->min_known = true;
      ks[i]->min_seq = INT64_MAX;
      for (size_t j = 0; j < n_found; j++)
         if (!strcmp (found[j].handler, ks[i]->handler) && !strcmp (found[j].key, ks[i]->key))
            ks[i]->min_seq = found[j].seq;
   }
   hk_free (found, n_found);
   bson_free (hs);
   bson_free (keys);
   return ok;
}

static int
seq_cmp (const void *a, const void *b)
{
   int64_t x = *(const int64_t *) a, y = *(const int64_t *) b;
   return x < y ? -1 : x > y;
}

/* The lowest pending sequence of each key of ks and, with runs allowed
 * (key_run > 1), how many of the key's due deliveries seen in this page
 * (ks[i]->run, sorted, as candidates) are its lowest pending ones: per
 * handler one aggregation that counts the pending deliveries of each key
 * up to its highest candidate and takes their lowest sequence.  When both
 * say the candidates are exactly the lowest pending deliveries, all of them
 * form the run; when the lowest is the first candidate, the run is that
 * one; otherwise the key is blocked.  The count reads at most a few index
 * entries per key; when many pending deliveries lie between candidates (a
 * parked backlog), the $limit stops it and the keys fall back to the
 * lowest sequences alone (keys_min_seq). */
static bool
keys_runs (claim_t *c, key_state_t **ks, size_t n, bson_error_t *error)
{
   bool *done = NULL;
   bool ok = true, fallback = false;

   if (n == 0)
      return true;
   if (c->o->key_run <= 1) {
      ok = keys_min_seq (c, ks, n, error);
      for (size_t i = 0; ok && i < n; i++) {
         ks[i]->n_run = 1;
         ks[i]->run[0] = ks[i]->min_seq;
      }
      return ok;
   }
   done = bson_malloc0 (n * sizeof *done);
   for (size_t i = 0; ok && !fallback && i < n; i++) {
      bson_t m = BSON_INITIALIZER, sub, or_arr;
      bson_t *pipeline;
      mongoc_cursor_t *cur;
      const bson_t *doc;
      uint32_t k = 0;
      int64_t cap = 0, total = 0;

      if (done[i])
         continue;
      BSON_APPEND_UTF8 (&m, "handler", ks[i]->handler);
      BSON_APPEND_UTF8 (&m, "status", "pending");
      BSON_APPEND_DOCUMENT_BEGIN (&m, "sequence", &sub); /* the ordering index's partial filter */
      BSON_APPEND_BOOL (&sub, "$exists", true);
      bson_append_document_end (&m, &sub);
      BSON_APPEND_ARRAY_BEGIN (&m, "$or", &or_arr);
      for (size_t j = i; j < n; j++)
         if (!done[j] && !strcmp (ks[j]->handler, ks[i]->handler)) {
            char buf[16];
            const char *key;
            bson_t one, rng;
            bson_uint32_to_string (k++, &key, buf, sizeof buf);
            BSON_APPEND_DOCUMENT_BEGIN (&or_arr, key, &one);
            BSON_APPEND_UTF8 (&one, "key", ks[j]->key);
            BSON_APPEND_DOCUMENT_BEGIN (&one, "sequence", &rng);
            BSON_APPEND_INT64 (&rng, "$lte", ks[j]->run[ks[j]->n_run - 1]);
            bson_append_document_end (&one, &rng);
            bson_append_document_end (&or_arr, &one);
            cap += (int64_t) ks[j]->n_run + 4;
            done[j] = true;
            ks[j]->min_known = true;
            ks[j]->min_seq = INT64_MAX;
         }
      bson_append_array_end (&m, &or_arr);
      pipeline = BCON_NEW ("pipeline", "[", "{", "$match", BCON_DOCUMENT (&m), "}", "{", "$limit",
                           BCON_INT64 (cap + 1), "}", "{", "$group", "{", "_id", BCON_UTF8 ("$key"), "seq", "{",
                           "$min", BCON_UTF8 ("$sequence"), "}", "n", "{", "$sum", BCON_INT32 (1), "}", "}", "}", "]");
      cur = mongoc_collection_aggregate (c->deliveries, MONGOC_QUERY_NONE, pipeline, NULL, NULL);
      while (mongoc_cursor_next (cur, &doc)) {
         const char *kv = store_iter_utf8 (doc, "_id");
         int64_t seq = store_iter_int64 (doc, "seq"), cnt = store_iter_int64 (doc, "n");
         total += cnt;
         for (size_t j = 0; kv && j < n; j++)
            if (!strcmp (ks[j]->handler, ks[i]->handler) && !strcmp (ks[j]->key, kv)) {
               key_state_t *x = ks[j];
               x->min_seq = seq;
               if (seq == x->run[0] && cnt == (int64_t) x->n_run)
                  ; /* the candidates are exactly the lowest pending: all run */
               else if (seq == x->run[0])
                  x->n_run = 1;
               else
                  x->n_run = 0;
            }
      }
      if (!store_cursor_end (cur, error, "lowest sequences per key"))
         ok = false;
      bson_destroy (pipeline);
      bson_destroy (&m);
      if (ok && total > cap)
         fallback = true;
   }
   for (size_t i = 0; i < n; i++)
      if (ks[i]->min_seq == INT64_MAX || !ks[i]->min_known)
         ks[i]->n_run = 0;
   bson_free (done);
   if (ok && fallback) {
      ok = keys_min_seq (c, ks, n, error);
      for (size_t i = 0; ok && i < n; i++) {
         ks[i]->n_run = 1;
         ks[i]->run[0] = ks[i]->min_seq;
      }
   }
   return ok;
}

static void
pick (claim_t *c, claim_lane_t *l, size_t lane_index, int h, const bson_t *doc, const bson_oid_t *id)
{
   store_batch_t *b = c->out;
   store_delivery_t *d;
   outbox_lease_t lease;

   /* The caller checked the room: a claim never hands out more than its
    * limit, nor more of a handler than the handler's. */
   RELAYBUS_ASSERT (h >= 0 && (size_t) h < c->o->n_handlers);
   RELAYBUS_ASSERT (b->n < c->o->limit && c->handler_taken[h] < c->o->handlers[h].limit);
   if (b->n == b->cap) {
      b->cap = b->cap ? b->cap * 2 : 16;
      b->items = bson_realloc (b->items, b->cap * sizeof *b->items);
      c->out_lane = bson_realloc (c->out_lane, b->cap * sizeof *c->out_lane);
   }
   c->out_lane[b->n] = lane_index;
   d = &b->items[b->n++];
   memset (d, 0, sizeof *d);
   bson_oid_copy (id, &d->id);
   d->event_id = bson_strdup (store_iter_utf8 (doc, "eventId"));
   d->handler = bson_strdup (c->o->handlers[h].handler);
   d->event_type = bson_strdup (store_iter_utf8 (doc, "eventType"));
   d->key = store_iter_utf8 (doc, "key") ? bson_strdup (store_iter_utf8 (doc, "key")) : NULL;
   d->sequence = store_iter_int64 (doc, "sequence");
   d->attempt = (int32_t) store_iter_int64 (doc, "attempts") + 1;
   d->due_at = store_iter_date (doc, "dueAt");
   d->created_at = store_iter_date (doc, "createdAt");
   lease.lane_id = l->lane;
   lease.epoch = l->epoch;
   lease.claims = (int32_t) store_iter_int64 (doc, "claims");
   outbox_lease_format (&lease, d->lease);
   store_oids_push (&l->picks, id);
   c->handler_taken[h]++;
}

/* The index in lanes[from..n_lanes) of `lane` when this claim reads from
 * it (not skipped); n_lanes otherwise. */
static size_t
lane_index (const claim_t *c, size_t from, uint32_t lane)
{
   size_t li;

   for (li = from; li < c->n_lanes; li++)
      if (c->lanes[li].lane == lane && !c->lanes[li].skip)
         break;
   return li;
}

/* The due deliveries a scan reads, in (dueAt, _id) order: a few finds that
 * each come back in one reply (limit = batchSize, so the server closes the
 * cursor and a claim that has its batch sends no killCursors), each after
 * the last (dueAt, _id) the one before returned, SCAN_CAP rows in all. */
typedef struct {
   claim_t *c;
   size_t from;             /* lanes[from..n_lanes) */
   const store_oids_t *running; /* left out: they run */
   bool keys_run;           /* a key of the claim's lanes runs */
   mongoc_cursor_t *cur;
   int64_t read, asked, got; /* rows in all; asked of and got from this find */
   int64_t last_due;
   bson_oid_t last_id;
   bool done, failed;
} scan_src_t;

/* The query of a scan read: the due, ready deliveries of the lanes, of
 * the handlers with room, not running; after (last_due, last_id) unless
 * it is the first read. */
static void
scan_query (const scan_src_t *src, bson_t *q)
{
   claim_t *c = src->c;
   bson_t sub, arr;
   uint32_t k = 0;

   BSON_APPEND_DOCUMENT_BEGIN (q, "laneId", &sub);
   BSON_APPEND_ARRAY_BEGIN (&sub, "$in", &arr);
   for (size_t i = src->from; i < c->n_lanes; i++) {
      char buf[16];
      const char *key;
      if (c->lanes[i].skip)
         continue;
      bson_uint32_to_string (k++, &key, buf, sizeof buf);
      BSON_APPEND_INT32 (&arr, key, (int32_t) c->lanes[i].lane);
   }
   bson_append_array_end (&sub, &arr);
   bson_append_document_end (q, &sub);
   BSON_APPEND_UTF8 (q, "lane", "ready");
   BSON_APPEND_DOCUMENT_BEGIN (q, "dueAt", &sub);
   if (src->read > 0)
      BSON_APPEND_DATE_TIME (&sub, "$gte", src->last_due); /* the index bound; the $or below is exact */
   BSON_APPEND_DATE_TIME (&sub, "$lte", c->o->now);
   bson_append_document_end (q, &sub);
   append_handlers_in (c, q, true);
   if (src->running->n > 0)
      store_append_oids_op (q, "_id", "$nin", src->running->v, src->running->n);
   if (src->read > 0) {
      bson_value_t last = {.value_type = BSON_TYPE_OID};
      bson_oid_copy (&src->last_id, &last.value.v_oid);
      store_append_after_key (q, "dueAt", src->last_due, &last);
   }
}

/* The next due delivery of the scan: false at the end, on an error
 * (src->failed, *error set), or, without open_next, at the end of a reply
 * (the rows read so far are taken before another read is asked for). */
static bool
scan_next (scan_src_t *src, const bson_t **doc, bool open_next, bson_error_t *error)
{
   claim_t *c = src->c;

   for (;;) {
      if (src->cur) {
         if (mongoc_cursor_next (src->cur, doc)) {
            bson_iter_t it;
            src->read++;
            src->got++;
            src->last_due = store_iter_date (*doc, "dueAt");
            if (bson_iter_init_find (&it, *doc, "_id") && BSON_ITER_HOLDS_OID (&it))
               bson_oid_copy (bson_iter_oid (&it), &src->last_id);
            return true;
         }
         if (!store_cursor_end (src->cur, error, "reading due deliveries"))
            src->failed = src->done = true;
         src->cur = NULL;
         /* A short reply is the end of what is due; SCAN_CAP is the end of
          * what a claim reads. */
         if (src->got < src->asked || src->read >= SCAN_CAP)
            src->done = true;
      }
      if (src->done || !open_next)
         return false;
      {
         bson_t q = BSON_INITIALIZER;
         bson_t *opts;
         int64_t need = (int64_t) (c->o->limit - c->out->n);
         if (src->asked == 0 && src->keys_run)
            src->asked = SCAN_BATCH;
         else if (src->asked == 0)
            src->asked = need * 2 < SCAN_FIRST_MIN ? SCAN_FIRST_MIN : need * 2 > SCAN_BATCH ? SCAN_BATCH : need * 2;
         else
            src->asked *= 4;
         if (src->asked > SCAN_CAP - src->read)
            src->asked = SCAN_CAP - src->read;
         if (src->asked <= 0) {
            /* limit 0 would be no limit at all */
            src->done = true;
            bson_destroy (&q);
            return false;
         }
         src->got = 0;
         scan_query (src, &q);
         opts = BCON_NEW ("sort", "{", "dueAt", BCON_INT32 (1), "_id", BCON_INT32 (1), "}", "limit",
                          BCON_INT64 (src->asked), "batchSize", BCON_INT32 ((int32_t) src->asked), "singleBatch",
                          BCON_BOOL (true));
         src->cur = mongoc_collection_find_with_opts (c->deliveries, &q, opts, NULL);
         bson_destroy (opts);
         bson_destroy (&q);
      }
   }
}

/* Reads the due, ready deliveries of lanes[from..n_lanes) in (dueAt, _id)
 * order and takes what the per-key rules allow, up to the limits. */
static bool
scan (claim_t *c, size_t from, bson_error_t *error)
{
   scan_src_t src = {.c = c, .from = from};
   const bson_t *doc;
   store_oids_t running = {0};
   size_t scanned = 0;
   bool ok = true;

   if (from >= c->n_lanes || c->out->n >= c->o->limit || !handlers_have_room (c))
      return true;
   for (size_t i = from; i < c->n_lanes; i++)
      if (!c->lanes[i].skip)
         for (size_t j = 0; j < c->lanes[i].inflight.n; j++)
            store_oids_push (&running, &c->lanes[i].inflight.v[j]);
   src.running = &running;
   for (int i = 0; i < KEY_BUCKETS && !src.keys_run; i++)
      for (key_state_t *k = c->keys[i]; k && !src.keys_run; k = k->next)
         src.keys_run = k->running || k->n_taken > 0;
   /* Page by page: the keys of a page whose lowest pending sequence is not
    * known yet are looked up with one aggregation, then the page is taken
    * in (dueAt, _id) order. */
   while (ok && c->out->n < c->o->limit) {
      bson_t *page[SCAN_PAGE];
      bool picked[SCAN_PAGE];
      key_state_t *unknown[SCAN_PAGE];
      size_t n_page = 0, n_unknown = 0, key_run = c->o->key_run < 1 ? 1 : c->o->key_run, examined;

      if (key_run > STORE_KEY_RUN_MAX)
         key_run = STORE_KEY_RUN_MAX;
      while (n_page < SCAN_PAGE && scan_next (&src, &doc, n_page == 0, error)) {
         const char *handler = store_iter_utf8 (doc, "handler"), *key = store_iter_utf8 (doc, "key");
         picked[n_page] = false;
         page[n_page++] = bson_copy (doc);
         if (handler && key) {
            key_state_t *ks = key_get (c, handler, key);
            bool listed = false;
            if (ks->running || ks->n_taken > 0 || ks->min_known)
               continue;
            for (size_t u = 0; u < n_unknown; u++)
               listed = listed || unknown[u] == ks;
            if (!listed) {
               unknown[n_unknown++] = ks;
               ks->n_run = 0;
            }
            /* The key's lowest due sequences of this page: the candidates
             * of its run. */
            {
               int64_t seq = store_iter_int64 (doc, "sequence");
               if (ks->n_run < key_run)
                  ks->run[ks->n_run++] = seq;
               else if (seq < ks->run[key_run - 1])
                  ks->run[key_run - 1] = seq;
               qsort (ks->run, ks->n_run, sizeof ks->run[0], seq_cmp);
            }
         }
      }
      if (n_page == 0)
         break;
      if (!keys_runs (c, unknown, n_unknown, error))
         ok = false;
      examined = n_page; /* the deliveries looked at before the batch was full */
      /* Pass 0 takes the unkeyed deliveries and the head of each key, in
       * (dueAt, _id) order; pass k takes the k-th follower of each key
       * whose run has one (heads of other keys first, then followers). */
      for (size_t pass = 0; pass < key_run; pass++) {
         for (size_t pi = 0; pi < n_page; pi++) {
            bson_iter_t it;
            const bson_oid_t *id;
            const bson_t *pd = page[pi];
            const char *handler = store_iter_utf8 (pd, "handler"), *key = store_iter_utf8 (pd, "key");
            uint32_t lane = (uint32_t) store_iter_int64 (pd, "laneId");
            size_t li;
            int h;

            if (pass == 0)
               scanned++;
            if (pass == 0 && examined == n_page && c->out->n >= c->o->limit)
               examined = pi;
            if (picked[pi] || !ok || c->out->n >= c->o->limit)
               continue;
            if (!handler || (pass > 0 && !key) || !bson_iter_init_find (&it, pd, "_id") || !BSON_ITER_HOLDS_OID (&it))
               continue;
            id = bson_iter_oid (&it);
            h = handler_index (c, handler);
            if (h < 0 || c->handler_taken[h] >= c->o->handlers[h].limit)
               continue;
            if ((li = lane_index (c, from, lane)) == c->n_lanes)
               continue;
            /* Reads follow each other strictly after the last (dueAt, _id)
             * read; a delivery whose due time moved past it meanwhile is
             * still taken once. */
            if (store_oids_has (&c->lanes[li].picks, id))
               continue;
            if (key) {
               key_state_t *ks = key_get (c, handler, key);
               /* None while one of the key runs, and the lowest pending
                * sequences only, in order: the head in pass 0, the
                * proven followers after it. */
               int64_t seq = store_iter_int64 (pd, "sequence");
               if (ks->running || !ks->min_known || ks->n_taken != pass || pass >= ks->n_run || seq != ks->run[pass] ||
                   (pass == 0 && seq != ks->min_seq))
                  continue;
               if (pass == 0)
                  ks->seq0 = seq;
               ks->n_taken++;
               ks->taken = true;
               /* A key gives at most its proven run, in order. */
               RELAYBUS_ASSERT (ks->n_taken <= ks->n_run && ks->n_run <= STORE_KEY_RUN_MAX);
            }
            picked[pi] = true;
            pick (c, &c->lanes[li], li, h, pd, id);
         }
      }
      /* What waits behind an unfinished predecessor (parking counts it). */
      for (size_t pi = 0; pi < examined; pi++) {
         bson_iter_t it;
         const bson_t *pd = page[pi];
         const char *handler = store_iter_utf8 (pd, "handler"), *key = store_iter_utf8 (pd, "key");
         uint32_t lane = (uint32_t) store_iter_int64 (pd, "laneId");
         size_t li;
         if (picked[pi] || !ok || !handler || !key || !bson_iter_init_find (&it, pd, "_id") || !BSON_ITER_HOLDS_OID (&it))
            continue;
         if (handler_index (c, handler) < 0)
            continue;
         if ((li = lane_index (c, from, lane)) == c->n_lanes)
            continue;
         {
            key_state_t *ks = key_get (c, handler, key);
            bool waits = ks->running || !ks->min_known || store_iter_int64 (pd, "sequence") != ks->min_seq || ks->n_taken > 0;
            if (!waits)
               continue; /* the head itself, left for a handler limit or the batch size */
            store_oids_push (&ks->blocked, bson_iter_oid (&it));
            store_oids_push (&c->lanes[li].blocked, bson_iter_oid (&it));
         }
      }
      for (size_t pi = 0; pi < n_page; pi++)
         bson_destroy (page[pi]);
      if (src.done)
         break;
   }
   if (src.failed)
      ok = false;
   if (scanned >= SCAN_CAP) {
      /* Due work may wait behind what the cap read: the deliveries found
       * blocked (however few per key) are parked after recording, so the
       * next scan reads past them.  Unparking brings each key's head back
       * once its predecessor finished. */
      log_debug ("store: claim scan stopped at %d deliveries; parking what it found blocked", SCAN_CAP);
      for (size_t i = from; i < c->n_lanes; i++)
         c->lanes[i].capped = true;
   }
   /* A claim that has its batch leaves the current reply unread: no
    * command, the server closed the cursor with the reply. */
   mongoc_cursor_destroy (src.cur);
   store_oids_free (&running);
   return ok;
}

/* ---------------------------------------------------------- free lanes */

typedef struct {
   uint32_t lane;
   int64_t epoch;
   bson_t *doc; /* the lane as read: inFlight and lost are compared on take */
   size_t worth; /* what the probe saw it could give: unkeyed deliveries and keys */
} free_lane_t;

/* Free lanes (no owner, or an expired lease) with due deliveries of the
 * handlers, the lane with the oldest due delivery first, appended to
 * out[*n_out...] (lanes already there are left out).  The lanes are found
 * with bounded probes of the claim index: per group of at most
 * STORE_MAX_LANES_PER_QUERY candidate lanes, the FREE_PROBE oldest due
 * deliveries in (dueAt, _id) order (a merge of one index scan per lane),
 * of which only laneId is read.  The lanes appear in the order of their
 * oldest due delivery, and the cost is the same with a thousand or a
 * million due deliveries.  *more: a probe came back full, so lanes with
 * younger due work may be left (the caller probes again if it needs
 * them). */
static bool
find_free_lanes (claim_t *c, free_lane_t *out, size_t *n_out, bool *more, bson_error_t *error)
{
   mongoc_cursor_t *cur;
   const bson_t *doc;
   bson_t *lane_docs[OUTBOX_LANES] = {0};
   int64_t oldest[OUTBOX_LANES];
   bool candidate[OUTBOX_LANES] = {0};
   size_t worth[OUTBOX_LANES] = {0};
   bool ok = true;
   size_t first = *n_out;
   int next = 0;

   *more = false;
   for (int lane = 0; lane < OUTBOX_LANES; lane++) {
      const bson_t *ld = c->lane_docs[lane];
      bool mine = false;

      if (!ld)
         continue;
      for (size_t i = 0; i < c->n_lanes && !mine; i++)
         mine = c->lanes[i].lane == (uint32_t) lane;
      for (size_t i = 0; i < *n_out && !mine; i++)
         mine = out[i].lane == (uint32_t) lane;
      if (mine)
         continue;
      if (store_iter_utf8 (ld, "owner") && store_iter_date (ld, "leaseExpiresAt") > c->o->now)
         continue;
      lane_docs[lane] = bson_copy (ld);
      oldest[lane] = INT64_MAX;
   }

   while (ok && next < OUTBOX_LANES) {
      bson_t q = BSON_INITIALIZER, sub;
      bson_t *opts;
      bool want[OUTBOX_LANES] = {0};
      uint32_t k = 0;
      int64_t n_read = 0;

      for (; next < OUTBOX_LANES && k < STORE_MAX_LANES_PER_QUERY; next++)
         if (lane_docs[next]) {
            want[next] = true;
            k++;
         }
      if (k == 0) {
         bson_destroy (&q);
         break;
      }
      store_append_lanes_in (&q, "laneId", want);
      BSON_APPEND_UTF8 (&q, "lane", "ready");
      BSON_APPEND_DOCUMENT_BEGIN (&q, "dueAt", &sub);
      BSON_APPEND_DATE_TIME (&sub, "$lte", c->o->now);
      bson_append_document_end (&q, &sub);
      append_handlers_in (c, &q, true);
      opts = BCON_NEW ("sort", "{", "dueAt", BCON_INT32 (1), "_id", BCON_INT32 (1), "}", "limit",
                       BCON_INT64 (FREE_PROBE), "batchSize", BCON_INT32 (FREE_PROBE), "projection", "{", "laneId",
                       BCON_INT32 (1), "dueAt", BCON_INT32 (1), "handler", BCON_INT32 (1), "key", BCON_INT32 (1), "}");
      cur = mongoc_collection_find_with_opts (c->deliveries, &q, opts, NULL);
      while (mongoc_cursor_next (cur, &doc)) {
         int64_t lane = store_iter_int64 (doc, "laneId");
         const char *h = store_iter_utf8 (doc, "handler"), *key = store_iter_utf8 (doc, "key");
         n_read++;
         if (lane < 0 || lane >= OUTBOX_LANES || !lane_docs[lane])
            continue;
         if (!candidate[lane]) {
            candidate[lane] = true;
            oldest[lane] = store_iter_date (doc, "dueAt");
         }
         /* A key gives one delivery per claim, however many it has due. */
         if (h && key) {
            key_state_t *ks = key_get (c, h, key);
            if (ks->probed)
               continue;
            ks->probed = true;
         }
         worth[lane]++;
      }
      if (!store_cursor_end (cur, error, "finding lanes with due deliveries"))
         ok = false;
      bson_destroy (opts);
      bson_destroy (&q);
      if (n_read >= FREE_PROBE)
         *more = true;
   }
   /* The lanes found, oldest due delivery first (ties by lane id). */
   for (;;) {
      int best = -1;
      for (int i = 0; i < OUTBOX_LANES; i++)
         if (candidate[i] && (best < 0 || oldest[i] < oldest[best]))
            best = i;
      if (best < 0 || !ok)
         break;
      candidate[best] = false;
      out[*n_out].lane = (uint32_t) best;
      out[*n_out].epoch = store_iter_int64 (lane_docs[best], "epoch");
      out[*n_out].doc = lane_docs[best];
      out[*n_out].worth = worth[best];
      lane_docs[best] = NULL;
      (*n_out)++;
   }
   if (*n_out == first)
      *more = false;
   for (int i = 0; i < OUTBOX_LANES; i++)
      bson_destroy (lane_docs[i]);
   return ok;
}

/* Appends the condition of a lane nobody holds: no owner, or an expired
 * lease: `$or: [{owner: null}, {leaseExpiresAt: {$lte: now}}]`. */
static void
append_lane_free (bson_t *q, int64_t now)
{
   bson_t or_arr, a, b, sub;

   BSON_APPEND_ARRAY_BEGIN (q, "$or", &or_arr);
   BSON_APPEND_DOCUMENT_BEGIN (&or_arr, "0", &a);
   BSON_APPEND_NULL (&a, "owner");
   bson_append_document_end (&or_arr, &a);
   BSON_APPEND_DOCUMENT_BEGIN (&or_arr, "1", &b);
   BSON_APPEND_DOCUMENT_BEGIN (&b, "leaseExpiresAt", &sub);
   BSON_APPEND_DATE_TIME (&sub, "$lte", now);
   bson_append_document_end (&b, &sub);
   bson_append_document_end (&or_arr, &b);
   bson_append_array_end (q, &or_arr);
}

/* The free lanes of the last probe that are still free in the lane
 * documents as read, appended to out (see store_claim_opts_t). */
static void
free_lanes_cached (claim_t *c, free_lane_t *out, size_t *n_out)
{
   store_t *s = c->s;

   for (size_t i = 0; i < s->n_probe; i++) {
      uint32_t lane = s->probe_lane[i];
      const bson_t *ld = lane < OUTBOX_LANES ? c->lane_docs[lane] : NULL;
      bool mine = false;
      if (!ld || (store_iter_utf8 (ld, "owner") && store_iter_date (ld, "leaseExpiresAt") > c->o->now))
         continue;
      for (size_t j = 0; j < c->n_lanes && !mine; j++)
         mine = c->lanes[j].lane == lane;
      if (mine)
         continue;
      out[*n_out].lane = lane;
      out[*n_out].epoch = store_iter_int64 (ld, "epoch");
      out[*n_out].doc = bson_copy (ld);
      out[*n_out].worth = s->probe_worth[i];
      (*n_out)++;
   }
}

/* The update of a take: the epoch moves on, this instance owns the lane
 * for a lease; with `lost` (take_lane), inFlight empties and the lost
 * claims are recorded with their epochs. */
static void
append_take (claim_t *c, bson_t *upd, const lost_list_t *lost)
{
   bson_t sub;

   BSON_APPEND_DOCUMENT_BEGIN (upd, "$inc", &sub);
   BSON_APPEND_INT64 (&sub, "epoch", 1);
   bson_append_document_end (upd, &sub);
   BSON_APPEND_DOCUMENT_BEGIN (upd, "$set", &sub);
   BSON_APPEND_UTF8 (&sub, "owner", c->s->owner);
   BSON_APPEND_DATE_TIME (&sub, "leaseExpiresAt", c->o->now + c->o->lease_ms);
   if (lost) {
      store_append_oids_array (&sub, "inFlight", NULL, 0);
      lost_append (&sub, lost);
   }
   bson_append_document_end (upd, &sub);
}

/* A lane this claim took under `epoch` (callers hold s->mu): it works
 * with it, and the instance holds it for a lease, with no claim of an
 * earlier epoch remembered. */
static claim_lane_t *
lane_taken (claim_t *c, uint32_t lane, int64_t epoch)
{
   claim_lane_t *l = add_lane (c, lane, epoch);

   l->taken_now = true;
   store_issued_remove_lane (c->s, lane);
   c->s->lanes[lane].held = true;
   c->s->lanes[lane].epoch = epoch;
   c->s->lanes[lane].expires = c->o->now + c->o->lease_ms;
   return l;
}

/* Takes a free lane with one conditional findOneAndUpdate: the epoch moves
 * on and the previous owner's inFlight moves to `lost`.  The condition
 * repeats the lane as read (epoch, inFlight, lost), so a lane another
 * claimer took or changed first is skipped, never waited for.  Then the
 * lost claims are charged before anything is read from the lane. */
static bool
take_lane (claim_t *c, free_lane_t *f, bool *taken, bson_error_t *error)
{
   store_oids_t inflight = {0}, lost = {0};
   lost_list_t all_lost = {0};
   bson_t q = BSON_INITIALIZER, upd = BSON_INITIALIZER, reply;
   mongoc_find_and_modify_opts_t *fam = mongoc_find_and_modify_opts_new ();
   bson_error_t err;
   bson_iter_t it, val;
   bool ok;

   *taken = false;
   store_oids_from_array (&inflight, f->doc, "inFlight");
   store_oids_from_array (&lost, f->doc, "lost");
   /* The lost list keeps the epoch of each lost claim: what a previous
    * taker left uncleared keeps its own epoch (it may have been charged
    * already), the previous owner's in-flight claims were made under the
    * lane's current epoch. */
   lost_from_lane (&all_lost, f->doc, f->epoch - 1);
   for (size_t i = 0; i < inflight.n; i++)
      lost_push (&all_lost, &inflight.v[i], f->epoch);

   BSON_APPEND_INT32 (&q, "_id", (int32_t) f->lane);
   BSON_APPEND_INT64 (&q, "epoch", f->epoch);
   store_append_oids_array (&q, "inFlight", inflight.v, inflight.n);
   store_append_oids_array (&q, "lost", lost.v, lost.n);
   append_lane_free (&q, c->o->now);

   append_take (c, &upd, &all_lost);

   mongoc_find_and_modify_opts_set_update (fam, &upd);
   mongoc_find_and_modify_opts_set_flags (fam, MONGOC_FIND_AND_MODIFY_RETURN_NEW);
   {
      /* A dead worker's open transaction may hold the lane document: skip
       * the lane rather than wait for that transaction to expire. */
      bson_t *extra = BCON_NEW ("maxTimeMS", BCON_INT32 (STORE_TAKE_MAX_TIME_MS));
      mongoc_find_and_modify_opts_append (fam, extra);
      bson_destroy (extra);
   }
   ok = mongoc_collection_find_and_modify_with_opts (c->lanes_coll, &q, fam, &reply, &err);
   if (!ok) {
      log_warn ("store: taking lane %u: %s; skipped", f->lane, err.message);
      ok = true;
   } else if (bson_iter_init_find (&it, &reply, "value") && BSON_ITER_HOLDS_DOCUMENT (&it) &&
              bson_iter_recurse (&it, &val) && bson_iter_find (&val, "epoch")) {
      int64_t epoch = bson_iter_as_int64 (&val);
      /* The take matched the epoch as read and moved it on by one. */
      RELAYBUS_ASSERT (epoch == f->epoch + 1);
      claim_lane_t *l;
      pthread_mutex_lock (&c->s->mu);
      l = lane_taken (c, f->lane, epoch);
      pthread_mutex_unlock (&c->s->mu);
      *taken = true;
      if (inflight.n > 0)
         log_info ("store: took lane %u over (epoch %" PRId64 "); the previous owner listed %zu delivery(ies) in flight",
                   f->lane,
                   epoch,
                   inflight.n);
      if (!charge_lost (c, f->lane, epoch, &all_lost, &err)) {
         log_warn ("store: %s; the lane waits for a later claim", err.message);
         l->skip = true;
      }
   }
   bson_destroy (&reply);
   mongoc_find_and_modify_opts_destroy (fam);
   bson_destroy (&q);
   bson_destroy (&upd);
   store_oids_free (&inflight);
   store_oids_free (&lost);
   lost_free (&all_lost);
   return ok;
}

/* Takes the free lanes f[0..n) that nobody runs anything in (empty
 * inFlight and lost, as read) with one updateMany: each lane's condition
 * repeats it as read (epoch, owner free or expired, empty lists), so a
 * lane another claimer took or changed first is not matched.  When every
 * lane matched, each has the epoch read plus one; otherwise the lanes are
 * read back to learn which this claim got.  Lanes with a previous owner's
 * claims listed go through take_lane, which charges them. */
static bool
take_lanes (claim_t *c, free_lane_t *f, size_t n, bson_error_t *error)
{
   bson_t q = BSON_INITIALIZER, or_arr, upd = BSON_INITIALIZER, sub, reply;
   bool clean[OUTBOX_LANES] = {0}, got[OUTBOX_LANES] = {0};
   int64_t epoch_of[OUTBOX_LANES] = {0};
   uint32_t n_clean = 0;
   bson_error_t err;
   bool ok = true;

   BSON_APPEND_ARRAY_BEGIN (&q, "$or", &or_arr);
   for (size_t i = 0; i < n; i++) {
      bson_iter_t it, arr;
      bool empty = true;
      static const char *const lists[] = {"inFlight", "lost"};
      for (size_t j = 0; j < 2; j++)
         if (bson_iter_init_find (&it, f[i].doc, lists[j]) && BSON_ITER_HOLDS_ARRAY (&it) &&
             bson_iter_recurse (&it, &arr) && bson_iter_next (&arr))
            empty = false;
      if (!empty) {
         bool taken;
         if (!take_lane (c, &f[i], &taken, error)) {
            bson_destroy (&q);
            bson_destroy (&upd);
            return false;
         }
         continue;
      }
      {
         char buf[16];
         const char *key;
         bson_t one;
         bson_uint32_to_string (n_clean++, &key, buf, sizeof buf);
         BSON_APPEND_DOCUMENT_BEGIN (&or_arr, key, &one);
         BSON_APPEND_INT32 (&one, "_id", (int32_t) f[i].lane);
         BSON_APPEND_INT64 (&one, "epoch", f[i].epoch);
         store_append_oids_array (&one, "inFlight", NULL, 0);
         append_lane_free (&one, c->o->now);
         bson_append_document_end (&or_arr, &one);
         clean[f[i].lane] = true;
         epoch_of[f[i].lane] = f[i].epoch;
      }
   }
   bson_append_array_end (&q, &or_arr);
   if (n_clean == 0)
      goto done;
   /* A lane whose lost list is not empty was left out above; one that
    * gained a lost list since is not matched (lost: [] below). */
   BSON_APPEND_ARRAY_BEGIN (&q, "lost", &sub);
   bson_append_array_end (&q, &sub);

   append_take (c, &upd, NULL);
   {
      bson_t *opts = BCON_NEW ("maxTimeMS", BCON_INT32 (STORE_TAKE_MAX_TIME_MS));
      ok = mongoc_collection_update_many (c->lanes_coll, &q, &upd, opts, &reply, &err);
      bson_destroy (opts);
   }
   if (!ok) {
      /* Unknown which lanes were taken: a lane taken but not used is not
       * ours in memory, and is taken over by anyone after its lease. */
      log_warn ("store: taking %u lane(s): %s; skipped", n_clean, err.message);
      bson_destroy (&reply);
      ok = true;
      goto done;
   }
   if (store_iter_int64 (&reply, "modifiedCount") == n_clean) {
      for (int l = 0; l < OUTBOX_LANES; l++)
         got[l] = clean[l];
      for (int l = 0; l < OUTBOX_LANES; l++)
         if (got[l])
            epoch_of[l]++;
   } else {
      /* Some lane changed first: read back which are ours now. */
      bson_t rq = BSON_INITIALIZER;
      mongoc_cursor_t *cur;
      const bson_t *doc;
      bson_t *ropts = BCON_NEW ("batchSize", BCON_INT32 (OUTBOX_LANES + 1));
      store_append_lanes_in (&rq, "_id", clean);
      BSON_APPEND_UTF8 (&rq, "owner", c->s->owner);
      cur = mongoc_collection_find_with_opts (c->lanes_coll, &rq, ropts, NULL);
      while (mongoc_cursor_next (cur, &doc)) {
         int64_t l = store_iter_int64 (doc, "_id");
         if (l >= 0 && l < OUTBOX_LANES && clean[l] && store_iter_int64 (doc, "epoch") == epoch_of[l] + 1) {
            got[l] = true;
            epoch_of[l]++;
         }
      }
      if (!store_cursor_end (cur, error, "reading back the lanes taken"))
         ok = false;
      bson_destroy (ropts);
      bson_destroy (&rq);
   }
   bson_destroy (&reply);
   pthread_mutex_lock (&c->s->mu);
   for (int l = 0; l < OUTBOX_LANES; l++)
      if (got[l])
         lane_taken (c, (uint32_t) l, epoch_of[l]);
   pthread_mutex_unlock (&c->s->mu);

done:
   bson_destroy (&q);
   bson_destroy (&upd);
   return ok;
}

/* ---------------------------------------------------------- the events */

static bool
attach_events (claim_t *c, bson_error_t *error)
{
   bson_t q = BSON_INITIALIZER, sub, arr;
   mongoc_cursor_t *cur;
   const bson_t *doc;
   bool ok = true;

   if (c->out->n == 0)
      return true;
   BSON_APPEND_DOCUMENT_BEGIN (&q, "_id", &sub);
   BSON_APPEND_ARRAY_BEGIN (&sub, "$in", &arr);
   for (size_t i = 0; i < c->out->n; i++) {
      char buf[16];
      const char *key;
      bson_uint32_to_string ((uint32_t) i, &key, buf, sizeof buf);
      BSON_APPEND_UTF8 (&arr, key, c->out->items[i].event_id ? c->out->items[i].event_id : "");
   }
   bson_append_array_end (&sub, &arr);
   bson_append_document_end (&q, &sub);
   cur = mongoc_collection_find_with_opts (c->events, &q, NULL, NULL);
   while (mongoc_cursor_next (cur, &doc)) {
      const char *id = store_iter_utf8 (doc, "_id");
      for (size_t i = 0; id && i < c->out->n; i++)
         if (!c->out->items[i].event && c->out->items[i].event_id && !strcmp (c->out->items[i].event_id, id))
            c->out->items[i].event = bson_copy (doc);
   }
   if (!store_cursor_end (cur, error, "reading events"))
      ok = false;
   bson_destroy (&q);
   return ok;
}

/* --------------------------------------------------------------- record */

static bool
lane_sel (claim_t *c, claim_lane_t *l, bson_t *sel)
{
   bson_init (sel);
   BSON_APPEND_INT32 (sel, "_id", (int32_t) l->lane);
   BSON_APPEND_INT64 (sel, "epoch", l->epoch);
   BSON_APPEND_UTF8 (sel, "owner", c->s->owner);
   return true;
}

/* One bulkWrite: per lane, inFlight gains the picks (the lease never
 * shrinks), loses the gone ids, or the lane is handed back when it yielded
 * nothing and runs nothing.  Every write is conditional on the epoch. */
static bool
record (claim_t *c, bool *hand_back, bson_error_t *error)
{
   mongoc_bulk_operation_t *bulk = mongoc_collection_create_bulk_operation_with_opts (c->lanes_coll, NULL);
   bson_t reply;
   bson_error_t err;
   int64_t expected = 0;
   bool ok = true;

   for (size_t i = 0; ok && i < c->n_lanes; i++) {
      claim_lane_t *l = &c->lanes[i];
      bson_t sel, upd = BSON_INITIALIZER, sub, each;

      hand_back[i] = false;
      if (l->skip)
         continue;
      lane_sel (c, l, &sel);
      if (l->picks.n > 0) {
         BSON_APPEND_DOCUMENT_BEGIN (&upd, "$addToSet", &sub);
         BSON_APPEND_DOCUMENT_BEGIN (&sub, "inFlight", &each);
         store_append_oids_array (&each, "$each", l->picks.v, l->picks.n);
         bson_append_document_end (&sub, &each);
         bson_append_document_end (&upd, &sub);
         BSON_APPEND_DOCUMENT_BEGIN (&upd, "$max", &sub);
         BSON_APPEND_DATE_TIME (&sub, "leaseExpiresAt", c->lease_from + c->o->lease_ms);
         bson_append_document_end (&upd, &sub);
         ok = mongoc_bulk_operation_update_one_with_opts (bulk, &sel, &upd, NULL, &err);
         expected++;
      } else if (l->inflight.n == 0) {
         hand_back[i] = true;
         BSON_APPEND_DOCUMENT_BEGIN (&upd, "$set", &sub);
         BSON_APPEND_NULL (&sub, "owner");
         BSON_APPEND_NULL (&sub, "leaseExpiresAt");
         store_append_oids_array (&sub, "inFlight", NULL, 0);
         bson_append_document_end (&upd, &sub);
         ok = mongoc_bulk_operation_update_one_with_opts (bulk, &sel, &upd, NULL, &err);
         expected++;
      }
      if (ok && l->gone.n > 0 && !hand_back[i]) {
         /* An abandoned claim picked again in this claim stays listed. */
         store_oids_t pull_ids = {0};
         for (size_t j = 0; j < l->gone.n; j++)
            if (!store_oids_has (&l->picks, &l->gone.v[j]))
               store_oids_push (&pull_ids, &l->gone.v[j]);
         if (pull_ids.n > 0) {
            bson_t pull = BSON_INITIALIZER;
            BSON_APPEND_DOCUMENT_BEGIN (&pull, "$pullAll", &sub);
            store_append_oids_array (&sub, "inFlight", pull_ids.v, pull_ids.n);
            bson_append_document_end (&pull, &sub);
            ok = mongoc_bulk_operation_update_one_with_opts (bulk, &sel, &pull, NULL, &err);
            bson_destroy (&pull);
            expected++;
         }
         store_oids_free (&pull_ids);
      }
      bson_destroy (&sel);
      bson_destroy (&upd);
   }
   if (!ok) {
      store_set_error (error, STORE_ERROR_SERVER, "building the claim record: %s", err.message);
      mongoc_bulk_operation_destroy (bulk);
      return false;
   }
   if (expected == 0) {
      mongoc_bulk_operation_destroy (bulk);
      return true;
   }
   if (!mongoc_bulk_operation_execute (bulk, &reply, &err)) {
      store_set_error (error, STORE_ERROR_SERVER, "recording the claim: %s", err.message);
      ok = false;
   } else if (store_iter_int64 (&reply, "nMatched") != expected) {
      store_set_error (error,
                       STORE_ERROR_LOST,
                       "recording the claim matched %" PRId64 " of %" PRId64 " lanes: a lane changed hands",
                       store_iter_int64 (&reply, "nMatched"),
                       expected);
      ok = false;
   }
   bson_destroy (&reply);
   mongoc_bulk_operation_destroy (bulk);
   return ok;
}

/* Parks the waiting deliveries: keys with STORE_PARK_THRESHOLD or more,
 * every waiting delivery of a lane handed back, and every waiting delivery
 * a scan stopped by SCAN_CAP found.  Best effort. */
static void
park (claim_t *c, const bool *hand_back)
{
   store_oids_t ids = {0};
   bson_t q = BSON_INITIALIZER;
   bson_t *upd;
   bson_error_t err;

   for (int i = 0; i < KEY_BUCKETS; i++)
      for (key_state_t *k = c->keys[i]; k; k = k->next)
         if (k->blocked.n >= STORE_PARK_THRESHOLD)
            for (size_t j = 0; j < k->blocked.n; j++)
               store_oids_push (&ids, &k->blocked.v[j]);
   for (size_t i = 0; i < c->n_lanes; i++)
      if (hand_back[i] || c->lanes[i].capped)
         for (size_t j = 0; j < c->lanes[i].blocked.n; j++)
            if (!store_oids_has (&ids, &c->lanes[i].blocked.v[j]))
               store_oids_push (&ids, &c->lanes[i].blocked.v[j]);
   if (ids.n == 0) {
      bson_destroy (&q);
      return;
   }
   store_append_oids_op (&q, "_id", "$in", ids.v, ids.n);
   BSON_APPEND_UTF8 (&q, "lane", "ready");
   BSON_APPEND_UTF8 (&q, "status", "pending");
   upd = BCON_NEW ("$set", "{", "lane", BCON_UTF8 ("parked"), "}");
   c->s->unpark_next = 0; /* unparking looks at them from the next claim on */
   if (!mongoc_collection_update_many (c->deliveries, &q, upd, NULL, NULL, &err))
      log_warn ("store: parking %zu waiting deliveries: %s", ids.n, err.message);
   else
      log_debug ("store: parked %zu waiting deliveries", ids.n);
   bson_destroy (upd);
   bson_destroy (&q);
   store_oids_free (&ids);
}

/* A dead letter requeued while this claim ran may now precede a pick of
 * its key: such picks are given back right after recording (a release: no
 * attempt charged), one aggregation for all the keys of the batch. */
static void
give_back_overtaken (claim_t *c)
{
   key_state_t **ks = bson_malloc0 ((c->out->n + 1) * sizeof *ks);
   size_t n_ks = 0;
   bson_error_t err;

   for (size_t i = 0; i < c->out->n; i++) {
      store_delivery_t *d = &c->out->items[i];
      key_state_t *k;
      bool listed = false;
      if (!d->key)
         continue;
      k = key_get (c, d->handler, d->key);
      for (size_t j = 0; j < n_ks && !listed; j++)
         listed = ks[j] == k;
      if (listed)
         continue;
      k->min_known = false;
      ks[n_ks++] = k;
   }
   if (n_ks == 0 || !keys_min_seq (c, ks, n_ks, &err)) {
      if (n_ks > 0)
         log_warn ("store: re-checking the order of a claimed batch: %s", err.message);
      bson_free (ks);
      return;
   }
   for (size_t i = 0; i < c->out->n;) {
      store_delivery_t *d = &c->out->items[i];
      key_state_t *k = d->key ? key_get (c, d->handler, d->key) : NULL;
      store_ref_t r = {d->id, d->lease};
      bool applied = false;
      /* The key's first pick (and with it its run) still comes first. */
      if (!k || !k->min_known || k->min_seq >= k->seq0) {
         i++;
         continue;
      }
      log_info ("store: %s/%s sequence %" PRId64 " is preceded by a requeued delivery; given back",
                d->handler,
                d->key,
                d->sequence);
      if (!store_release (c->s, &r, c->o->now, &applied, &err))
         log_warn ("store: giving back an overtaken pick: %s", err.message);
      delivery_free (d);
      memmove (d, d + 1, (c->out->n - i - 1) * sizeof *d);
      c->out->n--;
   }
   bson_free (ks);
}

/* ---------------------------------------------------------------- claim */

bool
store_claim (store_t *s, const store_claim_opts_t *o, store_batch_t *out, bson_error_t *error)
{
   claim_t *c;
   free_lane_t *free_lanes = NULL;
   size_t n_free = 0, next_free = 0;
   bool hand_back[OUTBOX_LANES];
   bool ok = false;

   if (!s || !o || !out || o->n_handlers == 0 || o->lease_ms <= 0) {
      store_set_error (error, STORE_ERROR_INVALID, "store_claim: handlers and a lease are required");
      return false;
   }
   memset (out, 0, sizeof *out);
   if (o->limit == 0)
      return true;
   c = bson_malloc0 (sizeof *c);
   c->s = s;
   c->o = o;
   c->out = out;
   c->started_us = bson_get_monotonic_time ();
   c->lease_from = o->now;
   c->handler_taken = bson_malloc0 (o->n_handlers * sizeof *c->handler_taken);
   pthread_mutex_lock (&s->claim_mu);
   c->client = mongoc_client_pool_pop (s->pool);
   c->deliveries = store_coll (s, c->client, OUTBOX_DELIVERIES);
   c->events = store_coll (s, c->client, OUTBOX_EVENTS);
   c->lanes_coll = store_coll (s, c->client, OUTBOX_LANES_COLL);

   unpark (c);

   /* 1. the lanes this instance holds (checked against the database) */
   if (!read_lanes (c, error) || !load_held (c, error) || !scan (c, 0, error))
      goto done;

   log_debug ("store: claim: %zu from %zu held lane(s)", out->n, c->n_lanes);
   /* 2. free lanes with due work */
   if (out->n < o->limit && handlers_have_room (c)) {
      bool more = false, cached = false;
      int probes = 0;
      free_lanes = bson_malloc0 (OUTBOX_LANES * sizeof *free_lanes);
      if (o->probe_reuse_ms > 0 && o->now >= s->probe_at && o->now - s->probe_at < o->probe_reuse_ms) {
         /* Also when it found nothing free: probing again finds more only
          * if that probe came back full (more) or a commit woke us. */
         free_lanes_cached (c, free_lanes, &n_free);
         cached = true;
         more = s->probe_more;
      }
      if (!cached) {
         probes++;
         if (!find_free_lanes (c, free_lanes, &n_free, &more, error))
            goto done;
         s->probe_at = o->now;
      }
      for (;;) {
         if (next_free == n_free && more && probes < FREE_PROBES_MAX && out->n < o->limit && handlers_have_room (c)) {
            /* The lanes found are used up and a probe came back full (or
             * they came from an earlier probe): look again, past the
             * lanes already found. */
            probes++;
            cached = false;
            if (!find_free_lanes (c, free_lanes, &n_free, &more, error))
               goto done;
            s->probe_at = o->now;
         }
         if (!(out->n < o->limit && handlers_have_room (c) && next_free < n_free))
            break;
         size_t first = c->n_lanes, end = next_free, worth = 0, need = o->limit - out->n;
         /* As many lanes, oldest due work first, as the probe says the
          * batch needs, taken together (one updateMany), then read
          * together (one scan). */
         while (end < n_free && end - next_free < STORE_MAX_LANES_PER_QUERY && worth < need) {
            worth += free_lanes[end].worth ? free_lanes[end].worth : 1;
            end++;
         }
         if (!take_lanes (c, free_lanes + next_free, end - next_free, error))
            goto done;
         next_free = end;
         if (!scan (c, first, error))
            goto done;
      }
      /* What this claim did not take, for the next one. */
      s->n_probe = 0;
      for (size_t i = next_free; i < n_free; i++) {
         s->probe_lane[s->n_probe] = free_lanes[i].lane;
         s->probe_worth[s->n_probe++] = free_lanes[i].worth;
      }
      s->probe_more = more;
   }

   /* 3. the events of the batch, read before it is recorded */
   if (!attach_events (c, error))
      goto done;

   /* 4. one bulkWrite.  The picks' lease runs from here, not from the
    * claim's start: a claim that took long on a slow database (most of it
    * before this write) would otherwise hand out deliveries with little
    * of their lease left, which the worker gives back unstarted.  The
    * write is conditional on each lane's epoch, so a lane whose lease
    * lapsed meanwhile and was taken over is not extended.  A claim that
    * took under a tenth of the lease keeps o->now: the lease is exact for
    * the caller's clock, and such a delay leaves the worker enough. */
   {
      int64_t took = (bson_get_monotonic_time () - c->started_us) / 1000;
      if (took >= o->lease_ms / 10)
         c->lease_from = o->now + took;
   }
   if (!record (c, hand_back, error))
      goto done;
   ok = true;

   pthread_mutex_lock (&s->mu);
   for (size_t i = 0; i < c->n_lanes; i++) {
      claim_lane_t *l = &c->lanes[i];
      store_lane_state_t *st = &s->lanes[l->lane];
      /* What the record took out of inFlight needs no memory any more. */
      for (size_t j = 0; j < l->gone.n && s->settled.n > 0; j++)
         for (size_t k = 0; k < s->settled.n; k++)
            if (bson_oid_equal (&s->settled.v[k], &l->gone.v[j])) {
               s->settled.v[k] = s->settled.v[--s->settled.n];
               break;
            }
      if (hand_back[i]) {
         st->held = false;
         store_issued_remove_lane (s, l->lane);
         continue;
      }
      /* A lane's epoch only grows: what this instance remembers is one it
       * read or took, never later than the one it holds now. */
      RELAYBUS_ASSERT (l->epoch >= st->epoch);
      st->held = true;
      st->epoch = l->epoch;
      if (l->picks.n > 0 && st->expires < c->lease_from + o->lease_ms)
         st->expires = c->lease_from + o->lease_ms;
   }
   for (size_t i = 0; i < out->n; i++) {
      outbox_lease_t lease;
      if (outbox_lease_parse (out->items[i].lease, &lease))
         store_issued_add (s,
                           &out->items[i].id,
                           lease.lane_id,
                           lease.epoch,
                           lease.claims,
                           c->lease_from + o->lease_ms,
                           out->items[i].handler,
                           out->items[i].key);
   }
   pthread_mutex_unlock (&s->mu);
   park (c, hand_back);
   give_back_overtaken (c);

done:
   if (!ok) {
      bson_error_t rerr;
      store_batch_clear (out);
      if (!store_reconcile (s, c->client, &rerr))
         log_warn ("store: reconciliation after a failed claim: %s", rerr.message);
   }
   for (size_t i = 0; free_lanes && i < n_free; i++)
      bson_destroy (free_lanes[i].doc);
   bson_free (free_lanes);
   mongoc_client_pool_push (s->pool, c->client);
   c->client = NULL;
   claim_free (c);
   bson_free (c);
   pthread_mutex_unlock (&s->claim_mu);
   return ok;
}

/* --------------------------------------------------------- reconciliation */

typedef struct {
   store_t *s;
   uint32_t lanes[OUTBOX_LANES];
   int64_t epochs[OUTBOX_LANES];
   size_t n;
   bool drop[OUTBOX_LANES];
   store_oids_t removed;
} reconcile_t;

static bool
reconcile_cb (store_txn_t *txn, void *ctx, bson_error_t *error)
{
   reconcile_t *r = ctx;
   store_t *s = r->s;
   bool ok = true;

   store_oids_free (&r->removed);
   memset (r->drop, 0, sizeof r->drop);
   for (size_t i = 0; ok && i < r->n; i++) {
      bson_t *q = BCON_NEW ("_id", BCON_INT32 ((int32_t) r->lanes[i]));
      mongoc_cursor_t *cur = mongoc_collection_find_with_opts (txn->coll[OUTBOX_LANES_COLL], q, &txn->opts, NULL);
      const bson_t *doc;
      store_oids_t inflight = {0}, bad = {0};
      bson_error_t err;

      if (!mongoc_cursor_next (cur, &doc)) {
         if (mongoc_cursor_error (cur, &err)) {
            *error = err;
            ok = false;
         }
         r->drop[i] = true;
      } else if (store_iter_int64 (doc, "epoch") != r->epochs[i] || !store_iter_utf8 (doc, "owner") ||
                 strcmp (store_iter_utf8 (doc, "owner"), s->owner) != 0) {
         r->drop[i] = true; /* taken over meanwhile: its claims are not ours */
      } else {
         store_oids_from_array (&inflight, doc, "inFlight");
      }
      mongoc_cursor_destroy (cur);
      bson_destroy (q);
      for (size_t j = 0; ok && j < inflight.n; j++) {
         const store_issued_t *is;
         bool keep = false;
         int32_t claims = 0;
         bson_t *dq = BCON_NEW ("_id", BCON_OID (&inflight.v[j]));
         mongoc_cursor_t *dc = mongoc_collection_find_with_opts (txn->coll[OUTBOX_DELIVERIES], dq, &txn->opts, NULL);
         const bson_t *ddoc;
         bool exists = mongoc_cursor_next (dc, &ddoc);
         if (exists)
            claims = (int32_t) store_iter_int64 (ddoc, "claims");
         if (mongoc_cursor_error (dc, &err)) {
            *error = err;
            ok = false;
         }
         mongoc_cursor_destroy (dc);
         pthread_mutex_lock (&s->mu);
         is = store_issued_find (s, &inflight.v[j]);
         keep = exists && is && is->lane == r->lanes[i] && is->epoch == r->epochs[i] && is->claims == claims;
         pthread_mutex_unlock (&s->mu);
         if (ok && !keep) {
            store_oids_push (&bad, &inflight.v[j]);
            if (exists) {
               bson_t *u = BCON_NEW ("$inc", "{", "claims", BCON_INT32 (1), "}");
               if (!mongoc_collection_update_one (txn->coll[OUTBOX_DELIVERIES], dq, u, &txn->opts, NULL, error))
                  ok = false;
               bson_destroy (u);
            }
         }
         bson_destroy (dq);
      }
      if (ok && bad.n > 0) {
         bson_t *lq = BCON_NEW ("_id", BCON_INT32 ((int32_t) r->lanes[i]), "epoch", BCON_INT64 (r->epochs[i]));
         bson_t lu = BSON_INITIALIZER, sub;
         BSON_APPEND_DOCUMENT_BEGIN (&lu, "$pullAll", &sub);
         store_append_oids_array (&sub, "inFlight", bad.v, bad.n);
         bson_append_document_end (&lu, &sub);
         if (!mongoc_collection_update_one (txn->coll[OUTBOX_LANES_COLL], lq, &lu, &txn->opts, NULL, error))
            ok = false;
         bson_destroy (lq);
         bson_destroy (&lu);
         for (size_t j = 0; j < bad.n; j++)
            store_oids_push (&r->removed, &bad.v[j]);
      }
      store_oids_free (&inflight);
      store_oids_free (&bad);
   }
   return ok;
}

bool
store_reconcile (store_t *s, mongoc_client_t *client, bson_error_t *error)
{
   reconcile_t *r = bson_malloc0 (sizeof *r);
   bool ok;

   r->s = s;
   pthread_mutex_lock (&s->mu);
   for (int i = 0; i < OUTBOX_LANES; i++)
      if (s->lanes[i].held) {
         r->lanes[r->n] = (uint32_t) i;
         r->epochs[r->n++] = s->lanes[i].epoch;
      }
   pthread_mutex_unlock (&s->mu);
   if (r->n == 0) {
      bson_free (r);
      return true;
   }
   ok = store_with_txn (s, client, reconcile_cb, r, error);
   if (ok) {
      pthread_mutex_lock (&s->mu);
      for (size_t i = 0; i < r->n; i++)
         if (r->drop[i] && s->lanes[r->lanes[i]].epoch == r->epochs[i]) {
            s->lanes[r->lanes[i]].held = false;
            store_issued_remove_lane (s, r->lanes[i]);
         }
      for (size_t j = 0; j < r->removed.n; j++)
         store_issued_remove (s, &r->removed.v[j]);
      pthread_mutex_unlock (&s->mu);
   }
   store_oids_free (&r->removed);
   bson_free (r);
   return ok;
}
