/*
 * dispatch/pace.c - a dispatched handler's rate_limit (dispatch/pace.h):
 * the token bucket of dispatch/delivery.c, and a ring of the jobs that
 * wait for a token, bounded by the handler's concurrency (the dispatcher
 * claims no more than its free slots).
 */
#include "dispatch/pace.h"

#include <string.h>

#include "base/counters.h"

static void
gauge (const pace_t *p)
{
   if (p->slot != SIZE_MAX)
      counters_set_at (COUNTER_RATE_LIMITED, p->slot, (uint64_t) p->n);
}

void
pace_init (pace_t *p, const config_handler_t *hc, int64_t now)
{
   memset (p, 0, sizeof *p);
   delivery_rate_init (&p->rate, hc->rate_limit_n, hc->rate_limit_period_ms, now);
   p->slot = counters_handler_slot (hc->name, true);
   gauge (p);
}

void
pace_update (pace_t *p, const config_handler_t *hc, int64_t now)
{
   if (p->rate.n != hc->rate_limit_n || (hc->rate_limit_n > 0 && p->rate.period_ms != hc->rate_limit_period_ms))
      delivery_rate_set (&p->rate, hc->rate_limit_n, hc->rate_limit_period_ms, now);
}

void
pace_fini (pace_t *p)
{
   bson_free (p->q);
   p->q = NULL;
   p->n = p->cap = p->head = 0;
   gauge (p);
}

bool
pace_admit (pace_t *p, void *job, int64_t now)
{
   if (p->rate.n > 0 && !p->started) {
      /* The first delivery since start-up (or since a reload added the
       * handler) finds the bucket empty, however long the proxy idled
       * before it: no burst on top of what a previous process sent. */
      delivery_rate_init (&p->rate, p->rate.n, p->rate.period_ms, now);
      p->started = true;
   }
   if (p->rate.n == 0 || (p->n == 0 && delivery_rate_take (&p->rate, now)))
      return true;
   if (p->n == p->cap) {
      /* Grown, the ring laid out from 0 again. */
      size_t cap = p->cap ? p->cap * 2 : 16;
      void **q = bson_malloc (cap * sizeof *q);
      for (size_t i = 0; i < p->n; i++)
         q[i] = p->q[(p->head + i) % p->cap];
      bson_free (p->q);
      p->q = q;
      p->cap = cap;
      p->head = 0;
   }
   p->q[(p->head + p->n) % p->cap] = job;
   p->n++;
   gauge (p);
   return false;
}

void *
pace_pop (pace_t *p)
{
   void *job;

   if (p->n == 0)
      return NULL;
   job = p->q[p->head];
   p->head = (p->head + 1) % p->cap;
   p->n--;
   gauge (p);
   return job;
}

void *
pace_next (pace_t *p, int64_t now)
{
   if (p->n == 0 || !delivery_rate_take (&p->rate, now))
      return NULL;
   return pace_pop (p);
}

size_t
pace_waiting (const pace_t *p)
{
   return p->n;
}

int64_t
pace_wait_ms (pace_t *p, int64_t now)
{
   return p->n == 0 ? -1 : delivery_rate_wait_ms (&p->rate, now);
}

int64_t
pace_claim_room (pace_t *p, int64_t now, int64_t horizon_ms, int64_t *wait_ms)
{
   int64_t room;

   *wait_ms = -1;
   if (p->rate.n == 0)
      return INT64_MAX;
   if (!p->started)
      return delivery_rate_room (&p->rate, p->rate.at, horizon_ms); /* from empty: what comes within the horizon */
   room = delivery_rate_room (&p->rate, now, horizon_ms) - (int64_t) p->n;
   if (room <= 0) {
      room = 0;
      if (p->n == 0)
         *wait_ms = delivery_rate_wait_ms (&p->rate, now);
   }
   return room;
}
