/*
 * dispatch/delivery.h - how long every kind of handler waits between
 * attempts: the retry schedule with full jitter (the dispatcher's, for
 * every dispatched kind, and the pull consumers'), the one generator
 * of the jitter's random numbers, and the token bucket that paces a
 * handler's starts ([handler] rate_limit).
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

#include <stdbool.h>
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

/* A handler's rate_limit: a token bucket of `n` tokens refilled evenly,
 * n per `period_ms`, so at most n starts a period on average and a burst
 * of at most n after a quiet spell.  Kept in token-milliseconds (a token
 * is period_ms of them), so the refill is exact integer arithmetic.  Time
 * is the caller's monotonic clock (ms).  n 0: no limit (every start
 * allowed). */
typedef struct {
   int64_t n, period_ms;
   int64_t level; /* token-ms: level / period_ms tokens */
   int64_t at;    /* when level was last brought up to date */
} delivery_rate_t;

/* An empty bucket (a proxy that starts, or a handler a reload added,
 * sends nothing in a burst). */
void delivery_rate_init (delivery_rate_t *r, int64_t n, int64_t period_ms, int64_t now);
/* A reload's new rate for a kept handler: the tokens it has stay, up to
 * the new n. */
void delivery_rate_set (delivery_rate_t *r, int64_t n, int64_t period_ms, int64_t now);
/* Takes a token if one is there: true, the start may go. */
bool delivery_rate_take (delivery_rate_t *r, int64_t now);
/* Milliseconds until a token is there (0: now). */
int64_t delivery_rate_wait_ms (delivery_rate_t *r, int64_t now);
/* Whole tokens there now and coming within `horizon_ms`. */
int64_t delivery_rate_room (delivery_rate_t *r, int64_t now, int64_t horizon_ms);

#endif /* RELAYBUS_DELIVERY_H */
