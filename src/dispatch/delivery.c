/*
 * dispatch/delivery.c - the retry schedule with full jitter, and the one
 * generator of its random numbers (see dispatch/delivery.h).
 *
 * The dispatcher and the pull consumers wait by this schedule, each with
 * a generator of its own thread.  Nothing here does I/O.
 */
#include "dispatch/delivery.h"

#include <openssl/rand.h>

#include "base/clock.h"

/* ------------------------------------------------------------- retries */

int64_t
delivery_backoff_ms (const int64_t *delays_ms, size_t n_delays, int32_t attempt, uint64_t rnd)
{
   size_t i = attempt < 1 ? 0 : (size_t) attempt - 1;
   int64_t cap;

   if (n_delays == 0)
      return 0;
   cap = delays_ms[i < n_delays ? i : n_delays - 1];
   return cap <= 0 ? 0 : (int64_t) (rnd % ((uint64_t) cap + 1));
}

void
delivery_rng_seed (delivery_rng_t *rng)
{
   /* xorshift stays at 0 for ever: a zero seed is replaced. */
   if (RAND_bytes ((unsigned char *) &rng->s, sizeof rng->s) != 1 || rng->s == 0)
      rng->s = (uint64_t) clock_now_ms () | 1;
}

uint64_t
delivery_rng_next (delivery_rng_t *rng)
{
   /* xorshift64* (Vigna): jitter only. */
   rng->s ^= rng->s >> 12;
   rng->s ^= rng->s << 25;
   rng->s ^= rng->s >> 27;
   return rng->s * 2685821657736338717ULL;
}

/* ------------------------------------------------------ rate_limit */

/* Brings the level up to `now`: n token-ms per elapsed ms, up to n tokens
 * (n * period_ms).  A clock that went back adds nothing. */
static void
rate_fill (delivery_rate_t *r, int64_t now)
{
   int64_t cap = r->n * r->period_ms, dt = now - r->at;

   if (dt > 0) {
      /* Past a period the bucket is full whatever the gap: no overflow. */
      r->level = dt >= r->period_ms ? cap : r->level + dt * r->n;
      if (r->level > cap)
         r->level = cap;
      r->at = now;
   }
}

void
delivery_rate_init (delivery_rate_t *r, int64_t n, int64_t period_ms, int64_t now)
{
   r->n = n > 0 && period_ms > 0 ? n : 0;
   r->period_ms = period_ms > 0 ? period_ms : 1000;
   r->level = 0;
   r->at = now;
}

void
delivery_rate_set (delivery_rate_t *r, int64_t n, int64_t period_ms, int64_t now)
{
   int64_t tokens;

   if (r->n > 0)
      rate_fill (r, now);
   tokens = r->n > 0 ? r->level / r->period_ms : 0;
   delivery_rate_init (r, n, period_ms, now);
   if (r->n > 0)
      r->level = (tokens < r->n ? tokens : r->n) * r->period_ms;
}

bool
delivery_rate_take (delivery_rate_t *r, int64_t now)
{
   if (r->n == 0)
      return true;
   rate_fill (r, now);
   if (r->level < r->period_ms)
      return false;
   r->level -= r->period_ms;
   return true;
}

int64_t
delivery_rate_wait_ms (delivery_rate_t *r, int64_t now)
{
   if (r->n == 0)
      return 0;
   rate_fill (r, now);
   if (r->level >= r->period_ms)
      return 0;
   /* ceil ((period_ms - level) / n) */
   return (r->period_ms - r->level + r->n - 1) / r->n;
}

int64_t
delivery_rate_room (delivery_rate_t *r, int64_t now, int64_t horizon_ms)
{
   if (r->n == 0)
      return INT64_MAX;
   rate_fill (r, now);
   if (horizon_ms < 0)
      horizon_ms = 0;
   if (horizon_ms > r->period_ms)
      horizon_ms = r->period_ms;
   return (r->level + horizon_ms * r->n) / r->period_ms;
}
