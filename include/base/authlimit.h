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
 * A proof is checked (authlimit_check) only while its (user, address)
 * pair has fewer than `limit` failures within AUTHLIMIT_WINDOW_MS, and a
 * wrong one is counted before the table's mutex is let go: the check and
 * the count are one step, so proofs checked in parallel can never take a
 * pair past `limit` failures, and a right proof costs nothing, however
 * many run at once.  Counts are kept in buckets of AUTHLIMIT_BUCKET_MS and
 * one bucket more than the window is summed, so a failure stops counting
 * 60 to 70 s after it was made, never sooner.  An IPv6 address counts for
 * its /64 (authlimit_addr_group): a host is usually given a whole /64.
 *
 * The user's failures (from any address) make the
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

typedef enum {
   AUTHLIMIT_REFUSED, /* the pair has `limit` failures: not checked */
   AUTHLIMIT_PASSED,  /* checked, right */
   AUTHLIMIT_FAILED,  /* checked, wrong: counted */
} authlimit_verdict_t;

/* A table keyed by `key` (AUTHLIMIT_KEY_BYTES random bytes).  The caller
 * owns it; free with authlimit_destroy (NULL ok). */
authlimit_t *authlimit_new (const uint8_t key[AUTHLIMIT_KEY_BYTES]);
void authlimit_destroy (authlimit_t *al);

/* Whether a proof of `user` from `addr` would be checked now (the pair has
 * fewer than `limit` failures); nothing is counted.  *failures is the
 * pair's count; *first is true for the first refusal of the pair in a
 * window (one log line). */
bool authlimit_allowed (
   authlimit_t *al, const char *user, const char *addr, uint32_t limit, int64_t now_ms, uint32_t *failures, bool *first);

/* Calls check(arg), the proof's check, under the table's mutex if the
 * pair has fewer than `limit` failures, and counts a failure of the pair
 * and of the user when it returns false; REFUSED without calling it
 * otherwise.  `check` must be quick (a SCRAM proof's HMACs) and must not
 * call into the table.  *failures and *first as authlimit_allowed's,
 * before this check. */
authlimit_verdict_t authlimit_check (authlimit_t *al,
                                     const char *user,
                                     const char *addr,
                                     uint32_t limit,
                                     int64_t now_ms,
                                     bool (*check) (void *arg),
                                     void *arg,
                                     uint32_t *failures,
                                     bool *first);

/* A failure of `user` from `addr` that no proof check made (a malformed
 * step of a started conversation): counted like a wrong proof. */
void authlimit_fail (authlimit_t *al, const char *user, const char *addr, int64_t now_ms);

/* The name a peer address counts under: an IPv6 address ("[2001:db8::1]",
 * as proxy peers are written) its /64 ("[2001:db8::]/64"), an IPv4-mapped
 * one its IPv4 address, anything else itself. */
void authlimit_addr_group (const char *addr, char *out, size_t out_len);

/* The user's failures within the window (any address). */
uint32_t authlimit_user_failures (authlimit_t *al, const char *user, int64_t now_ms);

/* How long to wait before checking a proof of `user`: 0 below `threshold`
 * failures, then min(cap_ms, AUTHLIMIT_DELAY_BASE_MS * 2^(failures -
 * threshold)); 0 when cap_ms is 0. */
int64_t authlimit_delay_ms (authlimit_t *al, const char *user, uint32_t threshold, int64_t cap_ms, int64_t now_ms);

#endif /* RELAYBUS_BASE_AUTHLIMIT_H */
