/*
 * base/clock.h - the clocks and the time conversions every module uses.
 *
 * Thread: any.  Header only: each is a system call or plain arithmetic,
 * inlined so that the forwarding loop pays no call for them.
 *
 * clock_now_ms is wall-clock time (what is stored and shown: due times,
 * leases, log stamps); clock_mono_ms never jumps (what measures an
 * interval the process itself waits out: expiry of in-memory entries,
 * budgets).  A timeval or timespec is made from milliseconds here and
 * nowhere else.
 */
#ifndef RELAYBUS_BASE_CLOCK_H
#define RELAYBUS_BASE_CLOCK_H

#include <errno.h>
#include <stdint.h>
#include <sys/time.h>
#include <time.h>

/* Milliseconds since the epoch. */
static inline int64_t
clock_now_ms (void)
{
   struct timespec ts;

   clock_gettime (CLOCK_REALTIME, &ts);
   return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Milliseconds of a clock that only moves forward (its origin is arbitrary). */
static inline int64_t
clock_mono_ms (void)
{
   struct timespec ts;

   clock_gettime (CLOCK_MONOTONIC, &ts);
   return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Microseconds of the same clock as clock_mono_ms: short intervals the
 * loop measures (the latency it adds to a request). */
static inline int64_t
clock_mono_us (void)
{
   struct timespec ts;

   clock_gettime (CLOCK_MONOTONIC, &ts);
   return (int64_t) ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* A relative timeval of `ms` milliseconds (libevent timers); `ms` >= 0. */
static inline struct timeval
clock_timeval_ms (int64_t ms)
{
   struct timeval tv = {(time_t) (ms / 1000), (suseconds_t) ((ms % 1000) * 1000)};
   return tv;
}

/* The absolute CLOCK_REALTIME time `ms` from now (pthread_cond_timedwait). */
static inline struct timespec
clock_deadline_ms (int64_t ms)
{
   struct timespec ts;

   clock_gettime (CLOCK_REALTIME, &ts);
   ts.tv_sec += (time_t) (ms / 1000);
   ts.tv_nsec += (long) (ms % 1000) * 1000000L;
   if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
   }
   return ts;
}

/* Sleeps `ms` milliseconds (>= 0), resumed after a signal.  Only for a
 * thread of its own that has nothing else to do meanwhile (a worker at
 * stop), never a forwarding loop. */
static inline void
clock_sleep_ms (int64_t ms)
{
   struct timespec ts = {(time_t) (ms / 1000), (long) (ms % 1000) * 1000000L};

   while (nanosleep (&ts, &ts) != 0 && errno == EINTR)
      ;
}

#endif /* RELAYBUS_BASE_CLOCK_H */
