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
 *
 * With attempt history the events' completion times were not written in
 * that transaction (a write on the event there would conflict with every
 * other handler's completion of it for as long as the transaction is
 * open): they are deferred here, as the dispatcher defers its own
 * completions' (store/complete.c), and written a second's worth at a time
 * by the caller (store_spaces_write_completion_times); the purge judges an
 * event whose time is not written yet by its records (store/ops.c).
 */
#include "store/store.h"
#include "store/store_private.h"

#include "base/assert.h"

void
store_settled_elsewhere (store_t *s, const bson_oid_t *ids, const char *const *events, size_t n, int64_t now)
{
   if (events && n > 0 && store_attempts_on (s))
      store_defer_events (s->times_to ? s->times_to : s, events, n, (now / 1000 + 1) * 1000, false);
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
