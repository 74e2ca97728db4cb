/*
 * base/assert.h - RELAYBUS_ASSERT, the invariants the code relies on,
 * checked in a debug build.
 *
 * Thread: any.  With configure --enable-debug (RELAYBUS_DEBUG) a false
 * condition writes "assertion failed: COND (FILE:LINE, FUNCTION)" to stderr
 * and aborts, so that a broken state transition, FIFO bound or lease record
 * stops the process where it happened, not later where it shows.  In a
 * release build the condition is not evaluated (it must have no side
 * effects) but is still compiled, so it cannot rot.
 */
#ifndef RELAYBUS_BASE_ASSERT_H
#define RELAYBUS_BASE_ASSERT_H

#ifdef RELAYBUS_DEBUG
void relaybus_assert_fail (const char *cond, const char *file, int line, const char *func)
   __attribute__ ((noreturn));
#define RELAYBUS_ASSERT(cond) \
   ((cond) ? (void) 0 : relaybus_assert_fail (#cond, __FILE__, __LINE__, __func__))
#else
#define RELAYBUS_ASSERT(cond) ((void) sizeof ((cond) ? 1 : 0))
#endif

#endif /* RELAYBUS_BASE_ASSERT_H */
