/*
 * test_delivery.c - dispatch/delivery.c: the retry schedule's full-jitter
 * bounds, the one generator of the jitter (never stuck at 0, spread
 * over a schedule's whole range, two seeds two sequences), and the token
 * bucket of rate_limit.
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

/* rate_limit's bucket: empty at start, a token every period / n, never
 * more than n (the burst after a quiet spell), exact over any number of
 * steps; a reload keeps the tokens up to the new n; n 0 limits nothing. */
static void
test_rate_limit_bucket (void **state)
{
   delivery_rate_t r;
   int64_t started = 0;

   (void) state;
   delivery_rate_init (&r, 20, 1000, 0);
   assert_false (delivery_rate_take (&r, 0));
   assert_int_equal (delivery_rate_wait_ms (&r, 0), 50);
   assert_int_equal (delivery_rate_wait_ms (&r, 30), 20);
   assert_false (delivery_rate_take (&r, 49));
   assert_true (delivery_rate_take (&r, 50));
   assert_false (delivery_rate_take (&r, 50));
   assert_int_equal (delivery_rate_room (&r, 50, 1000), 20);
   /* 100 starts as fast as the bucket allows, 1 ms steps: the last at 5 s. */
   delivery_rate_init (&r, 20, 1000, 0);
   for (int64_t t = 0; started < 100; t++)
      if (delivery_rate_take (&r, t) && ++started == 100)
         assert_int_equal (t, 5000);
   /* A quiet hour: a burst of 20, no more. */
   for (int i = 0; i < 20; i++)
      assert_true (delivery_rate_take (&r, 3600000));
   assert_false (delivery_rate_take (&r, 3600000));
   /* Per minute: a token every 6 s of 10/min. */
   delivery_rate_init (&r, 10, 60000, 0);
   assert_int_equal (delivery_rate_wait_ms (&r, 0), 6000);
   assert_int_equal (delivery_rate_room (&r, 0, 1000), 0);
   assert_int_equal (delivery_rate_room (&r, 5500, 1000), 1);
   assert_true (delivery_rate_take (&r, 6000));
   /* A reload to 2/min keeps at most 2 of the tokens it had. */
   delivery_rate_init (&r, 10, 60000, 0);
   delivery_rate_set (&r, 2, 60000, 3600000);
   assert_true (delivery_rate_take (&r, 3600000));
   assert_true (delivery_rate_take (&r, 3600000));
   assert_false (delivery_rate_take (&r, 3600000));
   /* A clock that goes back adds nothing. */
   assert_false (delivery_rate_take (&r, 0));
   /* No limit. */
   delivery_rate_init (&r, 0, 0, 0);
   for (int i = 0; i < 1000; i++)
      assert_true (delivery_rate_take (&r, 0));
   assert_int_equal (delivery_rate_wait_ms (&r, 0), 0);
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_backoff_full_jitter),
      cmocka_unit_test (test_rng),
      cmocka_unit_test (test_rate_limit_bucket),
   };
   return cmocka_run_group_tests (tests, NULL, NULL);
}
