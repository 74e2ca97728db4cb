/*
 * test_delivery.c - dispatch/delivery.c: the retry schedule's full-jitter
 * bounds, and the one generator of the jitter (never stuck at 0, spread
 * over a schedule's whole range, two seeds two sequences).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "dispatch/delivery.h"

static void
test_backoff_full_jitter (void **state)
{
   /* Failed attempt n waits delays[n - 1], the last delay past the list;
    * the value is anywhere in [0, delay]. */
   static const int64_t delays[] = {500, 4000, 60000};

   (void) state;
   assert_int_equal (delivery_backoff_ms (delays, 3, 1, 0), 0);
   assert_int_equal (delivery_backoff_ms (delays, 3, 1, 500), 500);
   assert_int_equal (delivery_backoff_ms (delays, 3, 1, 501), 0);
   assert_int_equal (delivery_backoff_ms (delays, 3, 2, 4000), 4000);
   assert_int_equal (delivery_backoff_ms (delays, 3, 3, 60000), 60000);
   assert_int_equal (delivery_backoff_ms (delays, 3, 50, 60000), 60000);
   assert_int_equal (delivery_backoff_ms (delays, 3, 0, 500), 500);
   for (uint64_t r = 1; r < 1000000; r = r * 7 + 3)
      for (int32_t a = 1; a < 30; a++) {
         int64_t d = delivery_backoff_ms (delays, 3, a, r);
         assert_true (d >= 0 && d <= delays[a < 3 ? a - 1 : 2]);
      }
}

/* The generator the dispatcher and the consumers draw their jitter from:
 * seeded, it never sticks at 0, and its values fall all over a delay's
 * range (every tenth of [0, 1000] is hit in 1000 draws), so retries
 * spread. */
static void
test_rng (void **state)
{
   static const int64_t delays[] = {1000};
   delivery_rng_t a, b, zero = {0};
   bool tenth[11] = {false};
   bool differ = false;

   (void) state;
   delivery_rng_seed (&a);
   delivery_rng_seed (&b);
   assert_true (a.s != 0 && b.s != 0);
   for (int i = 0; i < 1000; i++) {
      int64_t d = delivery_backoff_ms (delays, 1, 1, delivery_rng_next (&a));
      assert_true (d >= 0 && d <= 1000);
      tenth[d / 100] = true;
      differ = differ || delivery_rng_next (&b) != delivery_rng_next (&a);
   }
   for (int i = 0; i < 10; i++)
      assert_true (tenth[i]);
   assert_true (differ);
   assert_true (a.s != 0);
   /* A seed of 0 would stay 0: seeding replaces it. */
   delivery_rng_seed (&zero);
   assert_true (zero.s != 0);
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_backoff_full_jitter),
      cmocka_unit_test (test_rng),
   };
   return cmocka_run_group_tests (tests, NULL, NULL);
}
