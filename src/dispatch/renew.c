/*
 * dispatch/renew.c - the running claims the dispatcher's renewal thread
 * renews (see dispatch/renew.h).  The dispatcher thread adds and removes
 * entries under the set's lock; the renewal thread copies the set under
 * it and renews the copy without it, one store_extend_leases per store
 * instance, so a slow claim on the dispatcher thread never delays a
 * renewal and a renewal never holds the dispatcher up.
 */
#include "dispatch/renew.h"

#include <string.h>

#include "base/clock.h"
#include "base/log.h"

void
renew_set_init (renew_set_t *rs)
{
   memset (rs, 0, sizeof *rs);
   pthread_mutex_init (&rs->mu, NULL);
}

void
renew_set_destroy (renew_set_t *rs)
{
   bson_free (rs->ids);
   bson_free (rs->leases);
   bson_free (rs->stores);
   pthread_mutex_destroy (&rs->mu);
}

void
renew_set_add (renew_set_t *rs, const bson_oid_t *id, const char *lease, store_t *store)
{
   pthread_mutex_lock (&rs->mu);
   if (rs->n == rs->cap) {
      rs->cap = rs->cap ? rs->cap * 2 : 64;
      rs->ids = bson_realloc (rs->ids, rs->cap * sizeof *rs->ids);
      rs->leases = bson_realloc (rs->leases, rs->cap * sizeof *rs->leases);
      rs->stores = bson_realloc (rs->stores, rs->cap * sizeof *rs->stores);
   }
   rs->ids[rs->n] = *id;
   bson_strncpy (rs->leases[rs->n], lease, sizeof rs->leases[rs->n]);
   rs->stores[rs->n] = store;
   rs->n++;
   pthread_mutex_unlock (&rs->mu);
}

void
renew_set_remove (renew_set_t *rs, const bson_oid_t *id, const char *lease)
{
   pthread_mutex_lock (&rs->mu);
   for (size_t i = 0; i < rs->n; i++)
      if (bson_oid_equal (&rs->ids[i], id) && !strcmp (rs->leases[i], lease)) {
         rs->n--;
         rs->ids[i] = rs->ids[rs->n];
         memcpy (rs->leases[i], rs->leases[rs->n], sizeof rs->leases[i]);
         rs->stores[i] = rs->stores[rs->n];
         break;
      }
   pthread_mutex_unlock (&rs->mu);
}

/* Whether the claim is still in the set (its request still runs). */
static bool
renew_set_has (renew_set_t *rs, const bson_oid_t *id, const char *lease)
{
   bool has = false;

   pthread_mutex_lock (&rs->mu);
   for (size_t k = 0; k < rs->n && !has; k++)
      has = bson_oid_equal (&rs->ids[k], id) && !strcmp (rs->leases[k], lease);
   pthread_mutex_unlock (&rs->mu);
   return has;
}

/* Renews refs[0..n), the claims of one store instance. */
static void
renew_of_store (renew_set_t *rs, store_t *store, mongoc_client_pool_t *pool, int64_t lease_ms, store_ref_t *refs, size_t n)
{
   bool *applied = bson_malloc0 (n * sizeof *applied);
   bool lost[OUTBOX_LANES] = {0};
   bson_error_t err;

   if (!store_extend_leases (store, pool, refs, n, clock_now_ms (), lease_ms, applied, &err))
      log_warn ("dispatch: renewing leases: %s", err.message);
   else
      for (size_t i = 0; i < n; i++) {
         outbox_lease_t lease;
         if (applied[i] || !outbox_lease_parse (refs[i].lease, &lease) || lost[lease.lane_id])
            continue;
         /* A request that finished meanwhile was settled, not lost. */
         if (renew_set_has (rs, &refs[i].id, refs[i].lease)) {
            lost[lease.lane_id] = true;
            log_warn ("dispatch: a claim of lane %u was lost before its renewal; its delivery may run twice", lease.lane_id);
         }
      }
   bson_free (applied);
}

void
renew_set_renew (renew_set_t *rs, mongoc_client_pool_t *pool, int64_t lease_ms)
{
   store_ref_t *refs = NULL;
   store_t **stores = NULL;
   char (*leases)[OUTBOX_LEASE_TOKEN_MAX] = NULL;
   size_t n;

   pthread_mutex_lock (&rs->mu);
   n = rs->n;
   if (n > 0) {
      refs = bson_malloc0 (n * sizeof *refs);
      stores = bson_malloc (n * sizeof *stores);
      leases = bson_malloc (n * sizeof *leases);
      memcpy (leases, rs->leases, n * sizeof *leases);
      memcpy (stores, rs->stores, n * sizeof *stores);
      for (size_t i = 0; i < n; i++) {
         refs[i].id = rs->ids[i];
         refs[i].lease = leases[i];
      }
   }
   pthread_mutex_unlock (&rs->mu);
   /* The claims of one instance to the front, renewed, then the next. */
   for (size_t at = 0, k; at < n; at += k) {
      k = 1;
      for (size_t i = at + 1; i < n; i++)
         if (stores[i] == stores[at]) {
            store_ref_t t = refs[at + k];
            refs[at + k] = refs[i];
            refs[i] = t;
            stores[i] = stores[at + k];
            stores[at + k] = stores[at];
            k++;
         }
      renew_of_store (rs, stores[at], pool, lease_ms, refs + at, k);
   }
   bson_free (refs);
   bson_free (stores);
   bson_free (leases);
}
