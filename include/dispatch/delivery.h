/*
 * dispatch/delivery.h - how long every kind of handler waits between
 * attempts: the retry schedule with full jitter (the dispatcher's, for
 * every dispatched kind, and the pull consumers'), and the one generator
 * of the jitter's random numbers.
 *
 * Pure functions: no I/O, no store, no loop.  Not here: what a delivery
 * looks like (dispatch/format.h), how a kind sends it
 * (dispatch/webhook.h, dispatch/transport.h) and which failures are
 * retried (the kinds' results and the dispatcher).
 *
 * Thread: any.  A delivery_rng_t belongs to the thread that seeded it
 * (the dispatcher's, the consumer thread's).
 */
#ifndef RELAYBUS_DELIVERY_H
#define RELAYBUS_DELIVERY_H

#include <stddef.h>
#include <stdint.h>

#include "store/store.h"

/* The wait after failed attempt `attempt` (1 for the first): full jitter,
 * a value in [0, d] from rnd, where d is delays_ms[attempt - 1], or the
 * last of the n_delays (> 0) delays past them (a handler's retry_schedule);
 * 0 without delays. */
int64_t delivery_backoff_ms (const int64_t *delays_ms, size_t n_delays, int32_t attempt, uint64_t rnd);

/* The jitter's random numbers: xorshift64*, seeded from OpenSSL (the
 * clock if that fails).  Jitter only: spreading retries needs no secret,
 * and nothing else draws from it. */
typedef struct {
   uint64_t s; /* never 0 once seeded */
} delivery_rng_t;

void delivery_rng_seed (delivery_rng_t *rng);
uint64_t delivery_rng_next (delivery_rng_t *rng);

#endif /* RELAYBUS_DELIVERY_H */
