/*
 * store/probe.c - the poll's probe for due work across lane spaces
 * (store_probe_due, store.h).
 *
 * A claim in a handler's lane space reads its lane documents, its held
 * lanes and a probe of its free ones: a few commands, even when nothing
 * is due.  With one space per handler, a poll of a dispatcher with 30
 * idle handlers cost about 50 commands.  So before the claims, one find
 * on the deliveries asks which handlers of the spaces that hold nothing
 * have any pending delivery due now (the `due` index: dueAt, partial on
 * status pending; at most PROBE_LIMIT documents, the handler only), and
 * only the spaces with due work claim.
 *
 * Conservative: a space claims as before when this instance holds lanes
 * or claims in it (completions, renewals and hand-backs need its claims),
 * when its lane documents are not made yet (the first claim makes them),
 * when the probe came back full (handlers not seen are not known to be
 * idle), or when the probe failed.  Pending deliveries of any lane count,
 * parked ones included (a claim unparks them), and so do those a dead
 * owner's lanes list (a claim takes them over).  A retry due later is
 * found by the first poll after its dueAt.
 *
 * A space found idle stays idle without a probe for half of `reuse_ms`
 * (the claims that follow completions between two polls); 0, after a
 * commit's wake-up, probes again.
 */
#include "store/store.h"
#include "store/store_private.h"

#include <string.h>

#include "base/log.h"

/* The probe's documents at most: past it, the handlers it did not see
 * claim as before. */
#define PROBE_LIMIT 64

/* Whether `s` must claim whatever the probe says: it holds a lane or a
 * claim, or its lane documents are not made yet. */
static bool
space_busy (store_t *s)
{
   bool busy;

   pthread_mutex_lock (&s->claim_mu);
   busy = s->space_handler && !s->space_ready;
   pthread_mutex_unlock (&s->claim_mu);
   pthread_mutex_lock (&s->mu);
   busy = busy || s->n_issued > 0;
   for (size_t i = 0; i < OUTBOX_LANES && !busy; i++)
      busy = s->lanes[i].held;
   pthread_mutex_unlock (&s->mu);
   return busy;
}

void
store_probe_due (store_spaces_t *sp, store_claim_handler_t *hs, size_t n, int64_t now, int64_t reuse_ms)
{
   store_t **of = bson_malloc0 ((n ? n : 1) * sizeof *of);
   bool *ask = bson_malloc0 ((n ? n : 1) * sizeof *ask), *seen = bson_malloc0 ((n ? n : 1) * sizeof *seen);
   bson_t q = BSON_INITIALIZER, sub, arr;
   bson_t *opts;
   size_t n_ask = 0, n_read = 0;
   mongoc_client_t *client;
   mongoc_collection_t *coll;
   mongoc_cursor_t *cur;
   const bson_t *doc;
   bson_error_t err;

   for (size_t i = 0; i < n; i++) {
      if (hs[i].limit == 0)
         continue;
      of[i] = store_spaces_of (sp, hs[i].handler);
      if (space_busy (of[i]))
         continue;
      if (reuse_ms > 0 && of[i]->probe_idle_at > 0 && now >= of[i]->probe_idle_at && now - of[i]->probe_idle_at < reuse_ms / 2) {
         hs[i].limit = 0; /* found idle a moment ago */
         continue;
      }
      ask[i] = true;
      n_ask++;
   }
   if (n_ask == 0)
      goto done;
   BSON_APPEND_UTF8 (&q, "status", "pending");
   BSON_APPEND_DOCUMENT_BEGIN (&q, OUTBOX_F_DUE_AT, &sub);
   BSON_APPEND_DATE_TIME (&sub, "$lte", now);
   bson_append_document_end (&q, &sub);
   BSON_APPEND_DOCUMENT_BEGIN (&q, "handler", &sub);
   BSON_APPEND_ARRAY_BEGIN (&sub, "$in", &arr);
   for (size_t i = 0, k = 0; i < n; i++)
      if (ask[i]) {
         char buf[16];
         const char *key;
         bson_uint32_to_string ((uint32_t) k++, &key, buf, sizeof buf);
         BSON_APPEND_UTF8 (&arr, key, hs[i].handler);
      }
   bson_append_array_end (&sub, &arr);
   bson_append_document_end (&q, &sub);
   opts = BCON_NEW ("limit", BCON_INT64 (PROBE_LIMIT), "batchSize", BCON_INT32 (PROBE_LIMIT), "projection", "{", "_id",
                    BCON_INT32 (0), "handler", BCON_INT32 (1), "}");
   client = mongoc_client_pool_pop (sp->base->pool);
   coll = store_coll (sp->base, client, OUTBOX_DELIVERIES);
   /* As the claims read (claim_begin): work a failover could roll back is
    * not due yet; its commit point's change event wakes the poll. */
   store_coll_read_majority (coll);
   cur = mongoc_collection_find_with_opts (coll, &q, opts, NULL);
   while (mongoc_cursor_next (cur, &doc)) {
      const char *h = store_iter_utf8 (doc, "handler");
      n_read++;
      for (size_t i = 0; h && i < n; i++)
         seen[i] = seen[i] || (ask[i] && !strcmp (hs[i].handler, h));
   }
   if (!store_cursor_end (cur, &err, "probing for due deliveries")) {
      log_info ("store: %s (every space claims)", err.message);
   } else if (n_read < PROBE_LIMIT) {
      /* Complete: the handlers it did not see have nothing due. */
      for (size_t i = 0; i < n; i++)
         if (ask[i] && !seen[i]) {
            hs[i].limit = 0;
            of[i]->probe_idle_at = now;
         }
   }
   mongoc_collection_destroy (coll);
   mongoc_client_pool_push (sp->base->pool, client);
   bson_destroy (opts);

done:
   for (size_t i = 0; i < n; i++)
      if (of[i] && hs[i].limit > 0)
         of[i]->probe_idle_at = 0;
   bson_destroy (&q);
   bson_free (of);
   bson_free (ask);
   bson_free (seen);
}
