/*
 * base/heartbeat.h - whether every forwarding loop answers its pings, for
 * /healthz.
 *
 * Thread: heartbeat_start and heartbeat_stop: the main thread;
 * heartbeat_tick and heartbeat_asked: loop 0 (the main thread's loop, which
 * sends the pings); heartbeat_answered: the loop answering; heartbeat_check:
 * any thread (the admin thread).
 *
 * Loop 0 pings every other loop each HEARTBEAT_PING_MS through its notices
 * (proxy/loops.c) and ticks itself; each loop answers when it runs the
 * notice.  A loop that leaves a ping unanswered for HEARTBEAT_STALL_MS, or
 * a loop 0 that has not ticked for that long after its next tick was due,
 * is stalled: /healthz answers 503 naming it, as the service watchdog
 * withholds WATCHDOG=1 (the watchdog's own pings go through the same
 * notices).  The state is a few relaxed atomics: nothing here locks or
 * blocks a loop.  Times are clock_mono_ms, passed in so that the logic is
 * tested without waiting.
 *
 * Not here: sending the pings (proxy/loops.c), the HTTP answer
 * (admin/api.c).
 */
#ifndef RELAYBUS_BASE_HEARTBEAT_H
#define RELAYBUS_BASE_HEARTBEAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* How often loop 0 pings the loops, and how long a ping may stay
 * unanswered before the process is not healthy. */
#define HEARTBEAT_PING_MS 1000
#define HEARTBEAT_STALL_MS 5000
/* Loops tracked: at least CLIENT_LOOPS_MAX (checked in heartbeat.c). */
#define HEARTBEAT_LOOPS_MAX 64

/* `n` loops run from `now` on (loop 0 counts as ticked now). */
void heartbeat_start (unsigned n, int64_t now);
/* The loops stop: heartbeat_check reports healthy from now on (a stopping
 * process is not stalled; /healthz then still answers). */
void heartbeat_stop (void);
/* Loop 0 ran its ping timer at `now`. */
void heartbeat_tick (int64_t now);
/* Loop 0 sent loop `i` (>= 1) a ping at `now`: the oldest ping it has not
 * answered is the one that counts. */
void heartbeat_asked (unsigned i, int64_t now);
/* Loop `i` answered every ping sent so far. */
void heartbeat_answered (unsigned i);

/* True when every loop answered within `stall_ms`; else false, with
 * `reason` (`len` bytes) naming the first loop that did not and for how
 * long. */
bool heartbeat_check (int64_t now, int64_t stall_ms, char *reason, size_t len);

#endif /* RELAYBUS_BASE_HEARTBEAT_H */
