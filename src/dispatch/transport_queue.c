/*
 * dispatch/transport_queue.c - sends handed from the dispatcher's loop to
 * a broker kind's publishing threads and their results handed back (see
 * dispatch/transport_queue.h).  One mutex guards both lists; the results
 * reach the loop through one event, activated when the done list goes
 * from empty to not empty, so a burst of results costs one wake-up.
 * Bounded: at most `max` sends are in the queue or in a thread's hands.
 */
#include "dispatch/transport_queue.h"

#include <pthread.h>
#include <time.h>

struct tqueue {
   pthread_mutex_t mu;
   pthread_cond_t cv; /* the queue is not empty, or stop */
   tqueue_item_t *queue, **queue_tail;
   tqueue_item_t *done, **done_tail;
   size_t n, max; /* queued or busy */
   bool stop;
   struct event *done_ev;
   tqueue_free_fn_t free_fn;
};

/* On the dispatcher's base: the finished sends' callbacks, in order. */
static void
done_cb (evutil_socket_t fd, short what, void *arg)
{
   tqueue_t *q = arg;
   tqueue_item_t *list;

   (void) fd;
   (void) what;
   pthread_mutex_lock (&q->mu);
   list = q->done;
   q->done = NULL;
   q->done_tail = &q->done;
   pthread_mutex_unlock (&q->mu);
   while (list) {
      tqueue_item_t *it = list;
      list = it->next;
      it->cb (&it->res, it->arg);
      q->free_fn (it);
   }
}

tqueue_t *
tqueue_new (struct event_base *base, size_t max, tqueue_free_fn_t free_fn)
{
   tqueue_t *q = bson_malloc0 (sizeof *q);

   pthread_mutex_init (&q->mu, NULL);
   pthread_cond_init (&q->cv, NULL);
   q->queue_tail = &q->queue;
   q->done_tail = &q->done;
   q->max = max > 0 ? max : 1;
   q->free_fn = free_fn;
   q->done_ev = event_new (base, -1, 0, done_cb, q);
   if (!q->done_ev) {
      tqueue_destroy (q);
      return NULL;
   }
   return q;
}

bool
tqueue_push (tqueue_t *q, tqueue_item_t *it, bson_error_t *error)
{
   pthread_mutex_lock (&q->mu);
   if (q->n >= q->max) {
      size_t n = q->n;
      pthread_mutex_unlock (&q->mu);
      bson_set_error (error, TRANSPORT_ERROR_DOMAIN, TRANSPORT_ERROR_SEND, "%zu publishes waiting already", n);
      return false;
   }
   it->next = NULL;
   it->busy = it->cancelled = false;
   *q->queue_tail = it;
   q->queue_tail = &it->next;
   q->n++;
   pthread_cond_signal (&q->cv);
   pthread_mutex_unlock (&q->mu);
   return true;
}

tqueue_item_t *
tqueue_take (tqueue_t *q, int64_t wait_ms)
{
   tqueue_item_t *it = NULL;
   struct timespec until;

   if (wait_ms >= 0) {
      clock_gettime (CLOCK_REALTIME, &until);
      until.tv_sec += (time_t) (wait_ms / 1000);
      until.tv_nsec += (long) (wait_ms % 1000) * 1000000L;
      until.tv_sec += until.tv_nsec / 1000000000L;
      until.tv_nsec %= 1000000000L;
   }
   pthread_mutex_lock (&q->mu);
   while (!q->stop && !q->queue)
      if (wait_ms < 0)
         pthread_cond_wait (&q->cv, &q->mu);
      else if (pthread_cond_timedwait (&q->cv, &q->mu, &until) != 0)
         break;
   if (!q->stop && q->queue) {
      it = q->queue;
      q->queue = it->next;
      if (!q->queue)
         q->queue_tail = &q->queue;
      it->next = NULL;
      it->busy = true;
   }
   pthread_mutex_unlock (&q->mu);
   return it;
}

bool
tqueue_stopped (tqueue_t *q)
{
   bool stop;

   pthread_mutex_lock (&q->mu);
   stop = q->stop;
   pthread_mutex_unlock (&q->mu);
   return stop;
}

void
tqueue_done (tqueue_t *q, tqueue_item_t *it)
{
   bool was_empty;

   pthread_mutex_lock (&q->mu);
   it->busy = false;
   q->n--;
   if (it->cancelled) {
      pthread_mutex_unlock (&q->mu);
      q->free_fn (it);
      return;
   }
   was_empty = !q->done;
   *q->done_tail = it;
   q->done_tail = &it->next;
   if (was_empty)
      event_active (q->done_ev, EV_TIMEOUT, 0);
   pthread_mutex_unlock (&q->mu);
}

void
tqueue_cancel (tqueue_t *q, tqueue_item_t *it)
{
   tqueue_item_t **pp;

   pthread_mutex_lock (&q->mu);
   if (it->busy) {
      it->cancelled = true; /* its thread's tqueue_done frees it */
      pthread_mutex_unlock (&q->mu);
      return;
   }
   for (pp = &q->queue; *pp; pp = &(*pp)->next)
      if (*pp == it) {
         *pp = it->next;
         if (!*pp)
            q->queue_tail = pp;
         q->n--;
         goto found;
      }
   for (pp = &q->done; *pp; pp = &(*pp)->next)
      if (*pp == it) {
         *pp = it->next;
         if (!*pp)
            q->done_tail = pp;
         goto found;
      }
found:
   pthread_mutex_unlock (&q->mu);
   q->free_fn (it);
}

void
tqueue_stop (tqueue_t *q)
{
   pthread_mutex_lock (&q->mu);
   q->stop = true;
   pthread_cond_broadcast (&q->cv);
   pthread_mutex_unlock (&q->mu);
}

void
tqueue_destroy (tqueue_t *q)
{
   if (!q)
      return;
   while (q->queue) {
      tqueue_item_t *it = q->queue;
      q->queue = it->next;
      q->free_fn (it);
   }
   while (q->done) {
      tqueue_item_t *it = q->done;
      q->done = it->next;
      q->free_fn (it);
   }
   if (q->done_ev)
      event_free (q->done_ev);
   pthread_cond_destroy (&q->cv);
   pthread_mutex_destroy (&q->mu);
   bson_free (q);
}
