/*
 * store/claim_unpark.c - unparking, a step of every claim: the lowest
 * parked delivery of each parked key whose predecessors all finished goes
 * back to `ready`, with the parked ones that follow it up to the claim's
 * key run; and the lowest pending sequence per key, which the scan asks
 * too (claim_pending_heads).
 *
 * Level-triggered and best effort: it looks at a window of parked keys
 * per claim and logs a failure.  It does not park (claim.c does, after
 * the record), and it reads no lane.
 */
#include "store/claim_private.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"

/* Parked keys looked at per claim. */
#define UNPARK_KEYS_MAX 1000
/* With no parked key seen, unparking looks again after this long (parked
 * deliveries come only from parking, which the claims of another instance
 * may do): one aggregation per handler per second instead of per claim. */
#define STORE_UNPARK_IDLE_MS 1000

void
claim_heads_free (claim_head_t *v, size_t n)
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
              claim_head_t **out,
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
bool
claim_pending_heads (claim_t *c, char *const *handlers, char *const *keys, size_t n, claim_head_t **out, size_t *n_out, bson_error_t *error)
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
   const claim_head_t *x = a, *y = b;
   int r;
   if (x->due != y->due)
      return x->due < y->due ? -1 : 1;
   if ((r = strcmp (x->handler, y->handler)) != 0)
      return r;
   return strcmp (x->key, y->key);
}

/* The unparking cursor of `handler`, made when missing (NULL when the
 * table is full: that handler's window starts from the start). */
static store_unpark_cursor_t *
cursor_of (store_t *s, const char *handler)
{
   for (size_t i = 0; i < s->n_unpark; i++)
      if (strcmp (s->unpark[i].handler, handler) == 0)
         return &s->unpark[i];
   if (s->n_unpark == STORE_UNPARK_CURSORS_MAX)
      return NULL;
   s->unpark[s->n_unpark] = (store_unpark_cursor_t) {.handler = bson_strdup (handler)};
   return &s->unpark[s->n_unpark++];
}

/* Moves a cursor to after (due, key), or back to the start (key NULL). */
static void
cursor_set (store_unpark_cursor_t *cur, int64_t due, const char *key)
{
   if (!cur)
      return;
   bson_free (cur->key);
   cur->key = key ? bson_strdup (key) : NULL;
   cur->due = due;
}

/* The tail of the parked-keys aggregation of one handler: oldest head
 * first, after its cursor (the previous claim's last key of this
 * handler), UNPARK_KEYS_MAX at most. */
static bson_t *
unpark_tail (const store_unpark_cursor_t *cur)
{
   bson_t *tail = bson_new (), st, sub, cond;
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
   if (cur && cur->key) {
      bson_value_t last = {.value_type = BSON_TYPE_UTF8};
      last.value.v_utf8.str = cur->key;
      last.value.v_utf8.len = (uint32_t) strlen (cur->key);
      bson_uint32_to_string (k++, &key, buf, sizeof buf);
      BSON_APPEND_DOCUMENT_BEGIN (tail, key, &st);
      BSON_APPEND_DOCUMENT_BEGIN (&st, "$match", &cond);
      store_append_after_key (&cond, "due", cur->due, &last);
      bson_append_document_end (&st, &cond);
      bson_append_document_end (tail, &st);
   }
   bson_uint32_to_string (k++, &key, buf, sizeof buf);
   BSON_APPEND_DOCUMENT_BEGIN (tail, key, &st);
   BSON_APPEND_INT32 (&st, "$limit", UNPARK_KEYS_MAX);
   bson_append_document_end (tail, &st);
   return tail;
}

/* Step 1 of unparking: the parked keys, a window per handler (after that
 * handler's cursor), then the UNPARK_KEYS_MAX oldest of them all.  Each
 * handler's cursor moves on to its last key looked at while its window
 * came back full or lost keys to the cut, and back to the start once its
 * window reached its end; a handler none of whose keys survived the cut
 * keeps its cursor (the older keys of the others go first).  False on a
 * failure (logged); *parked (claim_heads_free) holds what was read either
 * way. */
static bool
parked_keys (claim_t *c, claim_head_t **parked, size_t *n_parked)
{
   store_t *s = c->s;
   size_t cap = 0, nh = c->o->n_handlers;
   bool *more = bson_malloc0 ((nh ? nh : 1) * sizeof *more);
   bool ok = true;
   bson_error_t err;

   for (size_t i = 0; i < nh; i++) {
      bson_t m = BSON_INITIALIZER;
      bson_t *tail = unpark_tail (cursor_of (s, c->o->handlers[i].handler));
      size_t before = *n_parked;
      BSON_APPEND_UTF8 (&m, "lane", "parked");
      ok = heads_by_key (c, c->o->handlers[i].handler, &m, tail, parked, n_parked, &cap, &err);
      bson_destroy (tail);
      bson_destroy (&m);
      if (!ok) {
         log_warn ("store: unparking: %s", err.message);
         goto done;
      }
      more[i] = *n_parked - before >= UNPARK_KEYS_MAX;
   }
   if (*n_parked > 1)
      qsort (*parked, *n_parked, sizeof **parked, hk_cmp);
   if (*n_parked > UNPARK_KEYS_MAX) {
      for (size_t i = UNPARK_KEYS_MAX; i < *n_parked; i++) {
         for (size_t h = 0; h < nh; h++)
            if (strcmp ((*parked)[i].handler, c->o->handlers[h].handler) == 0)
               more[h] = true;
         bson_free ((*parked)[i].handler);
         bson_free ((*parked)[i].key);
      }
      *n_parked = UNPARK_KEYS_MAX;
   }
   for (size_t h = 0; h < nh; h++) {
      const claim_head_t *last = NULL;
      for (size_t i = *n_parked; i-- > 0 && !last;)
         if (strcmp ((*parked)[i].handler, c->o->handlers[h].handler) == 0)
            last = &(*parked)[i];
      if (!more[h])
         cursor_set (cursor_of (s, c->o->handlers[h].handler), 0, NULL);
      else if (last)
         cursor_set (cursor_of (s, c->o->handlers[h].handler), last->due, last->key);
   }
done:
   bson_free (more);
   return ok;
}

/* Step 3 of unparking: one update of the heads with no unfinished
 * predecessor, each with the parked deliveries that follow it up to a run
 * (sequences head to head + run - 1: a key's sequences are dense, so at
 * most a run of them), which the claim can then take together; its
 * per-key check decides their order as for any ready delivery. */
static void
unpark_heads (claim_t *c, const claim_head_t *parked, size_t n_parked, const claim_head_t *pending, size_t n_pending)
{
   bson_t upd_q = BSON_INITIALIZER, or_arr;
   uint32_t n_or = 0;
   size_t run = claim_key_run (c);
   bson_error_t err;

   BSON_APPEND_ARRAY_BEGIN (&upd_q, "$or", &or_arr);
   for (size_t i = 0; i < n_parked; i++) {
      bool blocked = false;
      char buf[16];
      const char *k;
      bson_t one, rng;
      for (size_t j = 0; j < n_pending; j++)
         if (!strcmp (pending[j].handler, parked[i].handler) && !strcmp (pending[j].key, parked[i].key))
            blocked = pending[j].seq < parked[i].seq; /* an unfinished predecessor */
      if (blocked)
         continue;
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
   bson_destroy (&upd_q);
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
void
claim_unpark (claim_t *c)
{
   store_t *s = c->s;
   claim_head_t *parked = NULL, *pending = NULL;
   size_t n_parked = 0, n_pending = 0;
   char **hs = NULL, **ks = NULL;
   bson_error_t err;

   if (c->o->now < s->unpark_next && c->o->now >= s->unpark_next - STORE_UNPARK_IDLE_MS)
      return;
   s->unpark_next = c->o->now + STORE_UNPARK_IDLE_MS;

   /* 1. the parked keys */
   if (!parked_keys (c, &parked, &n_parked) || n_parked == 0)
      goto done;
   s->unpark_next = 0; /* parked keys exist: look again next claim */

   /* 2. their lowest pending sequences */
   hs = bson_malloc (n_parked * sizeof *hs);
   ks = bson_malloc (n_parked * sizeof *ks);
   for (size_t i = 0; i < n_parked; i++) {
      hs[i] = parked[i].handler;
      ks[i] = parked[i].key;
   }
   if (!claim_pending_heads (c, hs, ks, n_parked, &pending, &n_pending, &err)) {
      log_warn ("store: unparking: %s", err.message);
      goto done;
   }

   /* 3. one update */
   unpark_heads (c, parked, n_parked, pending, n_pending);

done:
   bson_free (hs);
   bson_free (ks);
   claim_heads_free (parked, n_parked);
   claim_heads_free (pending, n_pending);
}
