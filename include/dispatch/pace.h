/*
 * dispatch/pace.h - a dispatched handler's rate_limit: its token bucket
 * (dispatch/delivery.h) and the jobs that were claimed and wait for a
 * token, in the order they were to start, with the gauge that counts them
 * (relaybus_handler_rate_limited).
 *
 * The jobs are the dispatcher's (opaque here).  A job that waits is
 * neither charged nor parked: it stays claimed, its lease renewed by the
 * dispatcher, and its key's next deliveries wait behind it as its
 * followers, so each key keeps its order.  Time is the caller's monotonic
 * clock (ms).
 *
 * Thread: the dispatcher's.
 */
#ifndef RELAYBUS_PACE_H
#define RELAYBUS_PACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/config.h"
#include "dispatch/delivery.h"

typedef struct {
   delivery_rate_t rate;
   bool started; /* a delivery was admitted since start-up: the bucket runs */
   void **q;     /* a ring of the waiting jobs */
   size_t head, n, cap;
   size_t slot; /* the handler's counters slot (SIZE_MAX: none) */
} pace_t;

/* The pace of handler `hc`: its bucket is empty when its first delivery
 * comes, however long after start-up (or after a reload added it): no
 * burst on top of what a previous process sent; nothing waiting. */
void pace_init (pace_t *p, const config_handler_t *hc, int64_t now);
/* A reload kept the handler: its new rate_limit, keeping the tokens it
 * has up to the new limit, and the jobs that wait. */
void pace_update (pace_t *p, const config_handler_t *hc, int64_t now);
/* Frees the ring; nothing may wait any more (pace_pop them first). */
void pace_fini (pace_t *p);

/* Whether `job` may start now: the handler has no rate_limit, or nothing
 * waits and a token was taken.  Otherwise `job` now waits (false). */
bool pace_admit (pace_t *p, void *job, int64_t now);
/* The first job that waits, if its token is there (taken); NULL. */
void *pace_next (pace_t *p, int64_t now);
/* The first job that waits, token or not (a stop hands them back); NULL. */
void *pace_pop (pace_t *p);
/* How many jobs wait. */
size_t pace_waiting (const pace_t *p);
/* Milliseconds until the first waiting job's token (0: now); -1 when
 * nothing waits. */
int64_t pace_wait_ms (pace_t *p, int64_t now);
/* How many more deliveries a claim may take for the handler: the tokens
 * there and coming within `horizon_ms`, less the jobs waiting for them
 * (INT64_MAX without a rate_limit).  When that is 0 and nothing waits,
 * *wait_ms gets the time until the next token (otherwise -1). */
int64_t pace_claim_room (pace_t *p, int64_t now, int64_t horizon_ms, int64_t *wait_ms);

#endif /* RELAYBUS_PACE_H */
