/*
 * base/heartbeat.c - the loops' answers to their pings (see
 * base/heartbeat.h).
 *
 * One slot per loop holds the time of the oldest ping it has not answered
 * (0: none outstanding); loop 0's slot holds its last tick instead.  Each
 * slot has one writer at a time in the order that matters (loop 0 sets an
 * outstanding ping only over 0, the loop clears it), so relaxed atomics
 * and one compare-and-swap suffice: a reader only needs a recent value.
 */
#include "base/heartbeat.h"

#include <stdatomic.h>
#include <stdio.h>

static atomic_int_fast64_t asked_ms[HEARTBEAT_LOOPS_MAX]; /* [0]: loop 0's last tick */
static atomic_uint n_loops;                               /* 0: stopped */

void
heartbeat_start (unsigned n, int64_t now)
{
   if (n > HEARTBEAT_LOOPS_MAX)
      n = HEARTBEAT_LOOPS_MAX;
   for (unsigned i = 0; i < HEARTBEAT_LOOPS_MAX; i++)
      atomic_store_explicit (&asked_ms[i], 0, memory_order_relaxed);
   atomic_store_explicit (&asked_ms[0], now, memory_order_relaxed);
   atomic_store (&n_loops, n);
}

void
heartbeat_stop (void)
{
   atomic_store (&n_loops, 0);
}

void
heartbeat_tick (int64_t now)
{
   atomic_store_explicit (&asked_ms[0], now, memory_order_relaxed);
}

void
heartbeat_asked (unsigned i, int64_t now)
{
   int_fast64_t none = 0;

   if (i == 0 || i >= HEARTBEAT_LOOPS_MAX)
      return;
   /* An older ping still unanswered keeps its time. */
   atomic_compare_exchange_strong_explicit (&asked_ms[i], &none, now, memory_order_relaxed, memory_order_relaxed);
}

void
heartbeat_answered (unsigned i)
{
   if (i == 0 || i >= HEARTBEAT_LOOPS_MAX)
      return;
   atomic_store_explicit (&asked_ms[i], 0, memory_order_relaxed);
}

bool
heartbeat_check (int64_t now, int64_t stall_ms, char *reason, size_t len)
{
   unsigned n = atomic_load (&n_loops);
   int64_t tick = atomic_load_explicit (&asked_ms[0], memory_order_relaxed);

   if (n == 0)
      return true;
   /* Loop 0 pings itself by ticking: its next tick was due
    * HEARTBEAT_PING_MS after the last. */
   if (now - tick - HEARTBEAT_PING_MS >= stall_ms) {
      snprintf (reason, len, "forwarding loop 0 has not run for %.1f s", (double) (now - tick) / 1000.0);
      return false;
   }
   for (unsigned i = 1; i < n; i++) {
      int64_t asked = atomic_load_explicit (&asked_ms[i], memory_order_relaxed);
      if (asked > 0 && now - asked >= stall_ms) {
         snprintf (reason, len, "forwarding loop %u has not answered its ping for %.1f s", i, (double) (now - asked) / 1000.0);
         return false;
      }
   }
   return true;
}
