/*
 * store/settled.c - claims this instance handed out that were settled
 * outside the store: a pull consumer's completion committed in the
 * consumer's own transaction (publish/pulltxn.h wrote it on the client's
 * connection).
 *
 * Only the instance's memory changes, as after its own completion: the
 * claim is no longer "issued", and it counts as settled, so that a claim
 * that reconciles its lanes after a failure takes it out of their
 * in-flight lists instead of keeping it listed.
 */
#include "store/store.h"
#include "store/store_private.h"

#include "base/assert.h"

void
store_settled_elsewhere (store_t *s, const bson_oid_t *ids, size_t n)
{
   pthread_mutex_lock (&s->mu);
   for (size_t i = 0; i < n; i++) {
      store_issued_remove (s, &ids[i]);
      if (s->settled.n >= STORE_SETTLED_MAX)
         s->settled.n = 0; /* forgotten: the next claim reads what its lanes list */
      store_oids_push (&s->settled, &ids[i]);
      RELAYBUS_ASSERT (s->settled.n <= STORE_SETTLED_MAX);
   }
   pthread_mutex_unlock (&s->mu);
}
