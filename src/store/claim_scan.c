/*
 * store/claim_scan.c - the scan of a claim: the due, ready deliveries of
 * the claim's lanes read in (dueAt, _id) order, a page at a time, with
 * bounded finds (SCAN_CAP rows in all); the per-key rules (none while a
 * key runs, its lowest pending sequences only, a proven run in order) and
 * the pick of what they allow, up to the claim's and each handler's
 * limit; what waits behind a predecessor noted for parking.
 *
 * It writes nothing: the picks are recorded by claim.c in one bulkWrite.
 * It takes no lane (claim_lanes.c) and parks nothing (claim.c).
 */
#include "store/claim_private.h"

#include <stdlib.h>
#include <string.h>

#include "base/assert.h"
#include "base/log.h"

/* Due deliveries read before their keys are looked up together. */
#define SCAN_PAGE 256
/* The first read of a scan asks for twice what the batch still needs, at
 * least SCAN_FIRST_MIN, or SCAN_BATCH while keys of its lanes run (what
 * waits behind them comes first in the same order); each further read four
 * times the one before, up to SCAN_CAP in all. */
#define SCAN_FIRST_MIN 64
#define SCAN_BATCH 512

/* The lowest pending sequence of each (handler, key) of `ks`, from the
 * ordering index, with one aggregation per handler (one probe per key). */
bool
claim_keys_min_seq (claim_t *c, claim_key_t **ks, size_t n, bson_error_t *error)
{
   claim_head_t *found = NULL;
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
   ok = claim_pending_heads (c, hs, keys, n, &found, &n_found, error);
   for (size_t i = 0; ok && i < n; i++) {
      ks[i]->min_known = true;
      ks[i]->min_seq = INT64_MAX;
      for (size_t j = 0; j < n_found; j++)
         if (!strcmp (found[j].handler, ks[i]->handler) && !strcmp (found[j].key, ks[i]->key))
            ks[i]->min_seq = found[j].seq;
   }
   claim_heads_free (found, n_found);
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
 * lowest sequences alone (claim_keys_min_seq). */
static bool
keys_runs (claim_t *c, claim_key_t **ks, size_t n, bson_error_t *error)
{
   bool *done = NULL;
   bool ok = true, fallback = false;

   if (n == 0)
      return true;
   if (c->o->key_run <= 1) {
      ok = claim_keys_min_seq (c, ks, n, error);
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
               claim_key_t *x = ks[j];
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
      ok = claim_keys_min_seq (c, ks, n, error);
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
   /* Each pick belongs to one of the claim's lanes, the one it is listed in. */
   RELAYBUS_ASSERT (lane_index < c->n_lanes && l == &c->lanes[lane_index]);
   c->out_lane[b->n] = lane_index;
   d = &b->items[b->n++];
   memset (d, 0, sizeof *d);
   bson_oid_copy (id, &d->id);
   d->event_id = bson_strdup (store_iter_utf8 (doc, OUTBOX_F_EVENT_ID));
   d->handler = bson_strdup (c->o->handlers[h].handler);
   d->event_type = bson_strdup (store_iter_utf8 (doc, OUTBOX_F_EVENT_TYPE));
   d->key = store_iter_utf8 (doc, "key") ? bson_strdup (store_iter_utf8 (doc, "key")) : NULL;
   d->sequence = store_iter_int64 (doc, "sequence");
   d->attempt = (int32_t) store_iter_int64 (doc, OUTBOX_F_ATTEMPTS) + 1;
   d->due_at = store_iter_date (doc, OUTBOX_F_DUE_AT);
   d->created_at = store_iter_date (doc, OUTBOX_F_CREATED_AT);
   lease.lane_id = l->lane;
   lease.epoch = l->epoch;
   lease.claims = (int32_t) store_iter_int64 (doc, OUTBOX_F_CLAIMS);
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

   BSON_APPEND_DOCUMENT_BEGIN (q, OUTBOX_F_LANE_ID, &sub);
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
   BSON_APPEND_DOCUMENT_BEGIN (q, OUTBOX_F_DUE_AT, &sub);
   if (src->read > 0)
      BSON_APPEND_DATE_TIME (&sub, "$gte", src->last_due); /* the index bound; the $or below is exact */
   BSON_APPEND_DATE_TIME (&sub, "$lte", c->o->now);
   bson_append_document_end (q, &sub);
   claim_append_handlers_in (c, q, true);
   if (src->running->n > 0)
      store_append_oids_op (q, "_id", "$nin", src->running->v, src->running->n);
   if (src->read > 0) {
      bson_value_t last = {.value_type = BSON_TYPE_OID};
      bson_oid_copy (&src->last_id, &last.value.v_oid);
      store_append_after_key (q, OUTBOX_F_DUE_AT, src->last_due, &last);
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
            src->last_due = store_iter_date (*doc, OUTBOX_F_DUE_AT);
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
         opts = BCON_NEW ("sort", "{", OUTBOX_F_DUE_AT, BCON_INT32 (1), "_id", BCON_INT32 (1), "}", "limit",
                          BCON_INT64 (src->asked), "batchSize", BCON_INT32 ((int32_t) src->asked), "singleBatch",
                          BCON_BOOL (true));
         src->cur = mongoc_collection_find_with_opts (c->deliveries, &q, opts, NULL);
         bson_destroy (opts);
         bson_destroy (&q);
      }
   }
}

/* A page of a scan: up to SCAN_PAGE due deliveries as read (owned), which
 * of them this claim picked, and the keys whose lowest pending sequence
 * is still to be looked up. */
typedef struct {
   bson_t *doc[SCAN_PAGE];
   bool picked[SCAN_PAGE];
   claim_key_t *unknown[SCAN_PAGE];
   size_t n, n_unknown;
} scan_page_t;

/* What a scan leaves out and how it reads: the ids its lanes list run,
 * and whether a key of its lanes runs (see scan_next). */
static void
scan_start (claim_t *c, scan_src_t *src, store_oids_t *running)
{
   for (size_t i = src->from; i < c->n_lanes; i++)
      if (!c->lanes[i].skip)
         for (size_t j = 0; j < c->lanes[i].inflight.n; j++)
            store_oids_push (running, &c->lanes[i].inflight.v[j]);
   src->running = running;
   for (int i = 0; i < KEY_BUCKETS && !src->keys_run; i++)
      for (claim_key_t *k = c->keys[i]; k && !src->keys_run; k = k->next)
         src->keys_run = k->running || k->n_taken > 0;
}

/* A due sequence of the key seen in this page: the key_run lowest are the
 * candidates of its run, kept sorted. */
static void
note_candidate (claim_key_t *ks, int64_t seq, size_t key_run)
{
   if (ks->n_run < key_run)
      ks->run[ks->n_run++] = seq;
   else if (seq < ks->run[key_run - 1])
      ks->run[key_run - 1] = seq;
   qsort (ks->run, ks->n_run, sizeof ks->run[0], seq_cmp);
}

/* Reads the next page; the keys of it whose lowest pending sequence is
 * not known yet go to p->unknown, each with the candidates of its run. */
static void
page_read (claim_t *c, scan_src_t *src, scan_page_t *p, size_t key_run, bson_error_t *error)
{
   const bson_t *doc;

   while (p->n < SCAN_PAGE && scan_next (src, &doc, p->n == 0, error)) {
      const char *handler = store_iter_utf8 (doc, "handler"), *key = store_iter_utf8 (doc, "key");
      claim_key_t *ks;
      bool listed = false;

      p->picked[p->n] = false;
      p->doc[p->n++] = bson_copy (doc);
      if (!handler || !key)
         continue;
      ks = claim_key_get (c, handler, key);
      if (ks->running || ks->n_taken > 0 || ks->min_known)
         continue;
      for (size_t u = 0; u < p->n_unknown; u++)
         listed = listed || p->unknown[u] == ks;
      if (!listed) {
         p->unknown[p->n_unknown++] = ks;
         ks->n_run = 0;
      }
      note_candidate (ks, store_iter_int64 (doc, "sequence"), key_run);
   }
}

/* Whether the key lets this claim take its delivery of `seq` in pass
 * `pass`, and if so counts it taken: none while one of the key runs, and
 * the lowest pending sequences only, in order: the head in pass 0, the
 * proven followers after it. */
static bool
key_take (claim_t *c, const char *handler, const char *key, int64_t seq, size_t pass)
{
   claim_key_t *ks = claim_key_get (c, handler, key);

   if (ks->running || !ks->min_known || ks->n_taken != pass || pass >= ks->n_run || seq != ks->run[pass] ||
       (pass == 0 && seq != ks->min_seq))
      return false;
   if (pass == 0)
      ks->seq0 = seq;
   ks->n_taken++;
   ks->taken = true;
   /* A key gives at most its proven run, in order. */
   RELAYBUS_ASSERT (ks->n_taken <= ks->n_run && ks->n_run <= STORE_KEY_RUN_MAX);
   return true;
}

/* Takes the delivery pd of a page in pass `pass` when its handler has
 * room, its lane is read by this scan, it was not picked before and its
 * key allows it; true when it was picked. */
static bool
take_one (claim_t *c, size_t from, const bson_t *pd, size_t pass)
{
   bson_iter_t it;
   const bson_oid_t *id;
   const char *handler = store_iter_utf8 (pd, "handler"), *key = store_iter_utf8 (pd, "key");
   uint32_t lane = (uint32_t) store_iter_int64 (pd, OUTBOX_F_LANE_ID);
   size_t li;
   int h;

   if (!handler || (pass > 0 && !key) || !bson_iter_init_find (&it, pd, "_id") || !BSON_ITER_HOLDS_OID (&it))
      return false;
   id = bson_iter_oid (&it);
   h = claim_handler_index (c, handler);
   if (h < 0 || c->handler_taken[h] >= c->o->handlers[h].limit)
      return false;
   if ((li = lane_index (c, from, lane)) == c->n_lanes)
      return false;
   /* Reads follow each other strictly after the last (dueAt, _id) read; a
    * delivery whose due time moved past it meanwhile is still taken
    * once. */
   if (store_oids_has (&c->lanes[li].picks, id))
      return false;
   if (key && !key_take (c, handler, key, store_iter_int64 (pd, "sequence"), pass))
      return false;
   pick (c, &c->lanes[li], li, h, pd, id);
   return true;
}

/* Takes what the page allows: pass 0 the unkeyed deliveries and the head
 * of each key, in (dueAt, _id) order; pass k the k-th follower of each
 * key whose run has one (heads of other keys first, then followers).
 * Returns how many deliveries were looked at before the batch was full. */
static size_t
page_take (claim_t *c, size_t from, scan_page_t *p, size_t key_run)
{
   size_t examined = p->n;

   for (size_t pass = 0; pass < key_run; pass++)
      for (size_t pi = 0; pi < p->n; pi++) {
         if (pass == 0 && examined == p->n && c->out->n >= c->o->limit)
            examined = pi;
         if (p->picked[pi] || c->out->n >= c->o->limit)
            continue;
         p->picked[pi] = take_one (c, from, p->doc[pi], pass);
      }
   return examined;
}

/* What waits behind an unfinished predecessor among the first `examined`
 * of the page, noted on its key and its lane (parking counts it). */
static void
page_note_blocked (claim_t *c, size_t from, const scan_page_t *p, size_t examined)
{
   for (size_t pi = 0; pi < examined; pi++) {
      bson_iter_t it;
      const bson_t *pd = p->doc[pi];
      const char *handler = store_iter_utf8 (pd, "handler"), *key = store_iter_utf8 (pd, "key");
      uint32_t lane = (uint32_t) store_iter_int64 (pd, OUTBOX_F_LANE_ID);
      claim_key_t *ks;
      size_t li;
      bool waits;

      if (p->picked[pi] || !handler || !key || !bson_iter_init_find (&it, pd, "_id") || !BSON_ITER_HOLDS_OID (&it))
         continue;
      if (claim_handler_index (c, handler) < 0)
         continue;
      if ((li = lane_index (c, from, lane)) == c->n_lanes)
         continue;
      ks = claim_key_get (c, handler, key);
      waits = ks->running || !ks->min_known || store_iter_int64 (pd, "sequence") != ks->min_seq || ks->n_taken > 0;
      if (!waits)
         continue; /* the head itself, left for a handler limit or the batch size */
      store_oids_push (&ks->blocked, bson_iter_oid (&it));
      store_oids_push (&c->lanes[li].blocked, bson_iter_oid (&it));
   }
}

/* Reads the due, ready deliveries of lanes[from..n_lanes) in (dueAt, _id)
 * order and takes what the per-key rules allow, up to the limits.  Page
 * by page: the keys of a page whose lowest pending sequence is not known
 * yet are looked up with one aggregation, then the page is taken in
 * (dueAt, _id) order. */
bool
claim_scan (claim_t *c, size_t from, bson_error_t *error)
{
   scan_src_t src = {.c = c, .from = from};
   store_oids_t running = {0};
   size_t scanned = 0, key_run = claim_key_run (c);
   bool ok = true;

   if (from >= c->n_lanes || c->out->n >= c->o->limit || !claim_handlers_have_room (c))
      return true;
   scan_start (c, &src, &running);
   while (ok && c->out->n < c->o->limit) {
      scan_page_t p;

      p.n = p.n_unknown = 0;
      page_read (c, &src, &p, key_run, error);
      if (p.n == 0)
         break;
      ok = keys_runs (c, p.unknown, p.n_unknown, error);
      scanned += p.n;
      if (ok)
         page_note_blocked (c, from, &p, page_take (c, from, &p, key_run));
      for (size_t pi = 0; pi < p.n; pi++)
         bson_destroy (p.doc[pi]);
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
