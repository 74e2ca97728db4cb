/*
 * base/authlimit.h - how many password guesses a (user, address) pair may
 * have checked, and how long a user's next proof waits: the counting
 * behind [proxy] auth_failures_per_minute and auth_failure_delay_max_ms.
 *
 * Thread: any.  One table is shared by every forwarding loop (a client's
 * connections are spread over the loops, so a table per loop would
 * multiply the limit by the number of loops); each call takes the table's
 * mutex for a probe of at most AUTHLIMIT_PROBE slots, and only logins
 * call it, never forwarded traffic.
 *
 * A guess is counted when its conversation starts (authlimit_take), before
 * any proof is checked, so conversations run in parallel count as they
 * start; it is given back (authlimit_refund) when its proof was right or
 * it was never checked.  A pair may have at most `limit` counted within
 * any AUTHLIMIT_WINDOW_MS: counts are kept in buckets of
 * AUTHLIMIT_BUCKET_MS and one bucket more than the window is summed, so a
 * guess stops counting 60 to 70 s after it was made, never sooner.
 *
 * The user's failures (authlimit_user_failed, from any address) make the
 * delay of authlimit_delay_ms, which slows guesses spread over many
 * addresses without locking the user out.
 *
 * Both tables have a fixed size: a full neighbourhood gives its least
 * recently used slot to the newcomer.  Slots are found by SipHash-2-4
 * under a key the caller chooses at random per process, so a client
 * cannot choose names that crowd one neighbourhood; a slot keeps the
 * 64-bit hash, never the name or address.
 *
 * What it does not do: read the clock (callers pass now_ms from
 * clock_mono_ms), log, count metrics, or know about connections.
 */
#ifndef RELAYBUS_BASE_AUTHLIMIT_H
#define RELAYBUS_BASE_AUTHLIMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/keyhash.h"

#define AUTHLIMIT_WINDOW_MS 60000
#define AUTHLIMIT_BUCKET_MS 10000
/* One bucket more than the window: any guess of the last minute is in them. */
#define AUTHLIMIT_BUCKETS (AUTHLIMIT_WINDOW_MS / AUTHLIMIT_BUCKET_MS + 1)
#define AUTHLIMIT_PAIRS 4096 /* (user, address) slots */
#define AUTHLIMIT_USERS 1024 /* user slots (their failures, for the delay) */
#define AUTHLIMIT_PROBE 8    /* slots tried per lookup */
#define AUTHLIMIT_KEY_BYTES KEYHASH_KEY_LEN
/* The first delay; each further failure doubles it, up to the cap. */
#define AUTHLIMIT_DELAY_BASE_MS 100

typedef struct authlimit authlimit_t;

/* What authlimit_refund needs to give a counted guess back.  Plain data,
 * kept by the conversation; zero-initialised it holds nothing. */
typedef struct {
   bool held;      /* counted and not yet refunded or spent */
   uint64_t tag;   /* the pair's hash */
   int64_t bucket; /* the bucket it was counted in (now_ms / AUTHLIMIT_BUCKET_MS) */
} authlimit_ticket_t;

/* A table keyed by `key` (AUTHLIMIT_KEY_BYTES random bytes).  The caller
 * owns it; free with authlimit_destroy (NULL ok). */
authlimit_t *authlimit_new (const uint8_t key[AUTHLIMIT_KEY_BYTES]);
void authlimit_destroy (authlimit_t *al);

/* Counts a guess of `user` from `addr` if fewer than `limit` are counted
 * for the pair: true, *ticket held.  False: refused, nothing counted.
 * *counted is the pair's count (the refused guess not included); *first
 * is true for the first refusal of the pair in a window (one log line). */
bool authlimit_take (authlimit_t *al,
                     const char *user,
                     const char *addr,
                     uint32_t limit,
                     int64_t now_ms,
                     authlimit_ticket_t *ticket,
                     uint32_t *counted,
                     bool *first);

/* Gives a held guess back (its proof was right, or was never checked);
 * nothing if the pair's slot was reused or the bucket left the window.
 * The ticket holds nothing afterwards. */
void authlimit_refund (authlimit_t *al, authlimit_ticket_t *ticket, int64_t now_ms);

/* The guess's proof was wrong: it stays counted, and the ticket holds
 * nothing.  Counts a failure of `user` for the delay. */
void authlimit_spend (authlimit_t *al, authlimit_ticket_t *ticket, const char *user, int64_t now_ms);

/* The user's failures within the window (any address). */
uint32_t authlimit_user_failures (authlimit_t *al, const char *user, int64_t now_ms);

/* How long to wait before checking a proof of `user`: 0 below `threshold`
 * failures, then min(cap_ms, AUTHLIMIT_DELAY_BASE_MS * 2^(failures -
 * threshold)); 0 when cap_ms is 0. */
int64_t authlimit_delay_ms (authlimit_t *al, const char *user, uint32_t threshold, int64_t cap_ms, int64_t now_ms);

#endif /* RELAYBUS_BASE_AUTHLIMIT_H */
