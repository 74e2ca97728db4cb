/*
 * test_heartbeat.c - src/base/heartbeat.c: /healthz's view of the
 * forwarding loops.  A loop that leaves a ping unanswered for the stall
 * time is named, a loop 0 that stops ticking is named, an answer or a
 * stop makes the process healthy again, and a later ping never hides an
 * older one still unanswered.  Times are given, not waited for.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "base/heartbeat.h"

#define T0 1000000 /* a monotonic time, ms */

static void
test_answered_loops_are_healthy (void **unused)
{
   char why[160] = "";

   (void) unused;
   heartbeat_start (4, T0);
   for (int64_t t = T0; t < T0 + 20000; t += HEARTBEAT_PING_MS) {
      heartbeat_tick (t);
      for (unsigned i = 1; i < 4; i++) {
         heartbeat_asked (i, t);
         heartbeat_answered (i);
      }
      assert_true (heartbeat_check (t + HEARTBEAT_PING_MS - 1, HEARTBEAT_STALL_MS, why, sizeof why));
   }
   heartbeat_stop ();
}

static void
test_a_loop_that_does_not_answer_is_named (void **unused)
{
   char why[160] = "";
   int64_t t;

   (void) unused;
   heartbeat_start (4, T0);
   /* Loop 2 stops answering at T0; the others and loop 0 go on. */
   for (t = T0; t <= T0 + HEARTBEAT_STALL_MS; t += HEARTBEAT_PING_MS) {
      heartbeat_tick (t);
      for (unsigned i = 1; i < 4; i++) {
         heartbeat_asked (i, t);
         if (i != 2)
            heartbeat_answered (i);
      }
   }
   /* A later ping does not reset the time of the first one unanswered. */
   assert_true (heartbeat_check (T0 + HEARTBEAT_STALL_MS - 1, HEARTBEAT_STALL_MS, why, sizeof why));
   assert_false (heartbeat_check (T0 + HEARTBEAT_STALL_MS, HEARTBEAT_STALL_MS, why, sizeof why));
   assert_string_equal (why, "forwarding loop 2 has not answered its ping for 5.0 s");
   /* It answers: healthy again. */
   heartbeat_answered (2);
   assert_true (heartbeat_check (T0 + HEARTBEAT_STALL_MS, HEARTBEAT_STALL_MS, why, sizeof why));
   heartbeat_stop ();
}

static void
test_a_stalled_loop_0_is_named (void **unused)
{
   char why[160] = "";

   (void) unused;
   heartbeat_start (1, T0);
   heartbeat_tick (T0 + 1000);
   /* Its next tick was due at T0 + 2000: stalled 5 s after that. */
   assert_true (heartbeat_check (T0 + 1000 + HEARTBEAT_PING_MS + HEARTBEAT_STALL_MS - 1, HEARTBEAT_STALL_MS, why,
                                 sizeof why));
   assert_false (heartbeat_check (T0 + 1000 + HEARTBEAT_PING_MS + HEARTBEAT_STALL_MS, HEARTBEAT_STALL_MS, why,
                                  sizeof why));
   assert_string_equal (why, "forwarding loop 0 has not run for 6.0 s");
   heartbeat_stop ();
}

static void
test_stopped_loops_are_not_stalled (void **unused)
{
   char why[160] = "";

   (void) unused;
   heartbeat_start (2, T0);
   heartbeat_asked (1, T0);
   assert_false (heartbeat_check (T0 + 60000, HEARTBEAT_STALL_MS, why, sizeof why));
   heartbeat_stop ();
   assert_true (heartbeat_check (T0 + 60000, HEARTBEAT_STALL_MS, why, sizeof why));
   /* Out-of-range indexes are ignored, not written. */
   heartbeat_asked (HEARTBEAT_LOOPS_MAX, T0);
   heartbeat_answered (HEARTBEAT_LOOPS_MAX);
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_answered_loops_are_healthy),
      cmocka_unit_test (test_a_loop_that_does_not_answer_is_named),
      cmocka_unit_test (test_a_stalled_loop_0_is_named),
      cmocka_unit_test (test_stopped_loops_are_not_stalled),
   };

   return cmocka_run_group_tests (tests, NULL, NULL);
}
