/*
 * base/snapshot.h - one published, reference-counted value that one thread
 * replaces and any thread takes a reference to: the configuration in force
 * (base/config.h) and the fleet's handler set (base/fleet.h).
 *
 * Thread: any.  The mutex is held for a pointer swap or a reference count
 * increment, never for the value's release: the replaced value is handed
 * back to the caller, who releases it outside the lock.
 */
#ifndef RELAYBUS_BASE_SNAPSHOT_H
#define RELAYBUS_BASE_SNAPSHOT_H

#include <pthread.h>
#include <stddef.h>

typedef struct {
   pthread_mutex_t mu;
   void *current;
} snapshot_t;

#define SNAPSHOT_INIT {PTHREAD_MUTEX_INITIALIZER, NULL}

/* Publishes `next` (the snapshot takes over the caller's reference) and
 * returns the value it replaces, whose reference the caller now owns. */
static inline void *
snapshot_swap (snapshot_t *s, void *next)
{
   void *old;

   pthread_mutex_lock (&s->mu);
   old = s->current;
   s->current = next;
   pthread_mutex_unlock (&s->mu);
   return old;
}

/* A new reference to the current value (retain adds one and returns its
 * argument), or NULL when nothing is published. */
static inline void *
snapshot_take (snapshot_t *s, void *(*retain) (void *))
{
   void *v;

   pthread_mutex_lock (&s->mu);
   v = s->current ? retain (s->current) : NULL;
   pthread_mutex_unlock (&s->mu);
   return v;
}

#endif /* RELAYBUS_BASE_SNAPSHOT_H */
