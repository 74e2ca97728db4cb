/*
 * dispatch/renew.h - the running claims whose leases the dispatcher's
 * renewal thread renews: a set of (delivery id, lease, store instance)
 * that the dispatcher thread adds to when a delivery starts or waits
 * behind its key, and takes from when it leaves, and that the renewal
 * thread renews every lease_ms / 3 with one store_extend_leases per store
 * instance (one per handler lane space).
 *
 * Thread: add and remove on the dispatcher's thread, renew on the renewal
 * thread; the set's lock guards the entries, and no store call runs under
 * it.  The store instances are borrowed: they outlive the set's entries.
 * What this file does not do: decide what runs, settle, or schedule (the
 * dispatcher's timer calls renew_set_renew).
 */
#ifndef RELAYBUS_DISPATCH_RENEW_H
#define RELAYBUS_DISPATCH_RENEW_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <mongoc/mongoc.h>

#include "base/outbox.h"
#include "store/store.h"

typedef struct {
   pthread_mutex_t mu;
   bson_oid_t *ids;
   char (*leases)[OUTBOX_LEASE_TOKEN_MAX];
   store_t **stores; /* the instance that claimed each */
   size_t n, cap;
} renew_set_t;

void renew_set_init (renew_set_t *rs);
void renew_set_destroy (renew_set_t *rs);

/* Adds the claim of delivery `id` with `lease`, made by `store`. */
void renew_set_add (renew_set_t *rs, const bson_oid_t *id, const char *lease, store_t *store);
/* Removes that claim (nothing when it is not in the set). */
void renew_set_remove (renew_set_t *rs, const bson_oid_t *id, const char *lease);

/* On the renewal thread: extends every lease of the set to now +
 * `lease_ms` on `pool`, one call per store instance (a copy of the set
 * taken under its lock), and logs a claim lost before its renewal (once
 * per lane and instance) whose delivery still runs. */
void renew_set_renew (renew_set_t *rs, mongoc_client_pool_t *pool, int64_t lease_ms);

#endif /* RELAYBUS_DISPATCH_RENEW_H */
