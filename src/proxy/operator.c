/*
 * proxy/operator.c - the operator's commands, carried to the forwarding
 * loops (see proxy/operator.h).
 *
 * One slot per loop, static like proxy/pool.c's: a post still queued when
 * its loop goes finds the slot detached and does nothing.  The admin
 * thread fills a slot under its mutex and posts operator_loop_cb once
 * until the loop ran it; the loop takes everything under the mutex and
 * acts without it, through the `apply` its loop was attached with
 * (proxy/conn.c's client_loop_operator).
 */
#include "proxy/operator.h"

#include <pthread.h>

#include "base/config.h"
#include "base/counters.h"
#include "base/loopwake.h"

/* What waits in a slot. */
#define OPERATOR_RESUME 1u
#define OPERATOR_RECONNECT 2u

typedef struct {
   pthread_mutex_t mu;
   struct client_loop *loop; /* NULL: detached */
   operator_apply_fn apply;
   loopwake_t *wake;
   unsigned pending; /* OPERATOR_* bits */
   uint64_t close_ids[OPERATOR_CLOSE_MAX];
   unsigned n_close;
   bool posted; /* an operator_loop_cb is queued */
} operator_slot_t;

atomic_bool operator_pause_flag;
atomic_uint_fast64_t operator_reconnect_gen;

static operator_slot_t slots[CONFIG_THREADS_MAX];
static pthread_once_t slots_once = PTHREAD_ONCE_INIT;

static void
slots_init (void)
{
   for (unsigned i = 0; i < CONFIG_THREADS_MAX; i++)
      pthread_mutex_init (&slots[i].mu, NULL);
}

/* On the slot's loop. */
static void
operator_loop_cb (void *arg)
{
   operator_slot_t *slot = arg;
   uint64_t ids[OPERATOR_CLOSE_MAX];
   unsigned n, pending;
   struct client_loop *loop;
   operator_apply_fn apply;

   pthread_mutex_lock (&slot->mu);
   slot->posted = false;
   loop = slot->loop;
   apply = slot->apply;
   pending = slot->pending;
   n = slot->n_close;
   for (unsigned i = 0; i < n; i++)
      ids[i] = slot->close_ids[i];
   slot->pending = 0;
   slot->n_close = 0;
   pthread_mutex_unlock (&slot->mu);
   /* Detached: the loop is gone; its connections were closed with it. */
   if (!loop)
      return;
   apply (loop, ids, n, (pending & OPERATOR_RECONNECT) != 0, (pending & OPERATOR_RESUME) != 0);
}

/* With slot->mu held: makes sure an operator_loop_cb is queued; false
 * when the loop's queue is full (operator_kick tries again). */
static bool
slot_post_locked (operator_slot_t *slot)
{
   if (slot->posted || !slot->loop)
      return true;
   slot->posted = loopwake_post (slot->wake, operator_loop_cb, slot);
   return slot->posted;
}

/* Adds `bits` to every attached slot and posts. */
static void
notify_all (unsigned bits)
{
   pthread_once (&slots_once, slots_init);
   for (unsigned i = 0; i < CONFIG_THREADS_MAX; i++) {
      operator_slot_t *slot = &slots[i];
      pthread_mutex_lock (&slot->mu);
      if (slot->loop) {
         slot->pending |= bits;
         (void) slot_post_locked (slot); /* else left for operator_kick */
      }
      pthread_mutex_unlock (&slot->mu);
   }
}

void
operator_attach (unsigned index, struct client_loop *loop, loopwake_t *wake, operator_apply_fn apply)
{
   RELAYBUS_ASSERT (index < CONFIG_THREADS_MAX);
   pthread_once (&slots_once, slots_init);
   pthread_mutex_lock (&slots[index].mu);
   slots[index].loop = loop;
   slots[index].apply = apply;
   slots[index].wake = wake;
   slots[index].pending = 0;
   slots[index].n_close = 0;
   slots[index].posted = false;
   pthread_mutex_unlock (&slots[index].mu);
}

void
operator_detach (unsigned index)
{
   RELAYBUS_ASSERT (index < CONFIG_THREADS_MAX);
   pthread_once (&slots_once, slots_init);
   pthread_mutex_lock (&slots[index].mu);
   slots[index].loop = NULL;
   slots[index].wake = NULL;
   slots[index].pending = 0;
   slots[index].n_close = 0;
   pthread_mutex_unlock (&slots[index].mu);
}

bool
operator_pause (void)
{
   bool was = atomic_exchange (&operator_pause_flag, true);

   if (was)
      return false;
   /* Nothing to post: each loop reads the flag before it routes a
    * request, and a connection that is reading sees it at its next one. */
   counters_set (COUNTER_PAUSED, 1);
   counters_add (COUNTER_OPERATOR_PAUSES, 1);
   return true;
}

bool
operator_resume (void)
{
   bool was = atomic_exchange (&operator_pause_flag, false);

   if (!was)
      return false;
   counters_set (COUNTER_PAUSED, 0);
   counters_add (COUNTER_OPERATOR_RESUMES, 1);
   /* The held connections read nothing since: each loop pumps them. */
   notify_all (OPERATOR_RESUME);
   return true;
}

bool
operator_close_client (uint64_t id, unsigned loop, bson_error_t *error)
{
   operator_slot_t *slot;
   bool ok = false;

   pthread_once (&slots_once, slots_init);
   if (loop >= CONFIG_THREADS_MAX) {
      bson_set_error (error, OPERATOR_ERROR_DOMAIN, OPERATOR_ERR_NO_LOOP, "no forwarding loop %u", loop);
      return false;
   }
   slot = &slots[loop];
   pthread_mutex_lock (&slot->mu);
   if (!slot->loop) {
      bson_set_error (error, OPERATOR_ERROR_DOMAIN, OPERATOR_ERR_NO_LOOP, "forwarding loop %u is not running", loop);
      goto done;
   }
   for (unsigned i = 0; i < slot->n_close; i++)
      if (slot->close_ids[i] == id) {
         ok = true; /* asked already */
         goto done;
      }
   if (slot->n_close == OPERATOR_CLOSE_MAX) {
      bson_set_error (error,
                      OPERATOR_ERROR_DOMAIN,
                      OPERATOR_ERR_BUSY,
                      "%d closes wait for forwarding loop %u already",
                      OPERATOR_CLOSE_MAX,
                      loop);
      goto done;
   }
   slot->close_ids[slot->n_close++] = id;
   (void) slot_post_locked (slot); /* else left for operator_kick */
   counters_add (COUNTER_OPERATOR_CLIENT_CLOSES, 1);
   ok = true;
done:
   pthread_mutex_unlock (&slot->mu);
   return ok;
}

uint64_t
operator_reconnect (void)
{
   uint64_t gen = atomic_fetch_add_explicit (&operator_reconnect_gen, 1, memory_order_acq_rel) + 1;

   counters_add (COUNTER_OPERATOR_RECONNECTS, 1);
   notify_all (OPERATOR_RECONNECT);
   return gen;
}

bool
operator_kick (void)
{
   bool all = true;

   pthread_once (&slots_once, slots_init);
   for (unsigned i = 0; i < CONFIG_THREADS_MAX; i++) {
      operator_slot_t *slot = &slots[i];
      pthread_mutex_lock (&slot->mu);
      if (slot->loop && (slot->pending || slot->n_close > 0) && !slot_post_locked (slot))
         all = false;
      pthread_mutex_unlock (&slot->mu);
   }
   return all;
}
