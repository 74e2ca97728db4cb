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
