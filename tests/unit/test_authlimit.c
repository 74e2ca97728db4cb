/*
 * test_authlimit.c - the guess counts behind auth_failures_per_minute:
 * SipHash-2-4 against the paper's vectors, the limit per (user, address)
 * pair, refunds, the sliding minute, the user's delay, and the table's
 * bound (a flood of pairs reuses slots and never grows it).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "base/authlimit.h"
#include "base/keyhash.h"

static const uint8_t key[AUTHLIMIT_KEY_BYTES] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

/* An origin far from 0, as clock_mono_ms gives. */
#define T0 ((int64_t) 1000000000)

static void
test_siphash_vectors (void **state)
{
   /* SipHash-2-4 with key 00..0f over messages 00, 00 01, ... (the
    * reference implementation's vectors.h, as little-endian words). */
   static const struct {
      size_t len;
      uint64_t want;
   } cases[] = {
      {0, 0x726fdb47dd0e0e31ULL},
      {1, 0x74f839c593dc67fdULL},
      {7, 0xab0200f58b01d137ULL},
      {8, 0x93f5f5799a932462ULL},
      {15, 0xa129ca6149be45e5ULL},
      {63, 0x958a324ceb064572ULL},
   };
   uint8_t msg[64];

   (void) state;
   for (size_t i = 0; i < sizeof msg; i++)
      msg[i] = (uint8_t) i;
   for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
      assert_int_equal (keyhash_siphash24 (key, msg, cases[i].len), cases[i].want);
}

static bool
take (authlimit_t *al, const char *user, const char *addr, uint32_t limit, int64_t now, authlimit_ticket_t *t)
{
   uint32_t counted;
   bool first;

   return authlimit_take (al, user, addr, limit, now, t, &counted, &first);
}

/* Twelve conversations started at once: three are counted, nine refused;
 * the pair's limit touches neither the user elsewhere nor another user. */
static void
test_limit_per_pair (void **state)
{
   authlimit_t *al = authlimit_new (key);
   authlimit_ticket_t t[12], other;
   uint32_t counted;
   bool first, firsts = 0;
   int taken = 0;

   (void) state;
   for (int i = 0; i < 12; i++) {
      if (authlimit_take (al, "alice", "127.0.0.1", 3, T0, &t[i], &counted, &first)) {
         taken++;
         assert_true (t[i].held);
      } else {
         assert_false (t[i].held);
         assert_int_equal (counted, 3);
         firsts += first;
      }
   }
   assert_int_equal (taken, 3);
   assert_int_equal (firsts, 1); /* one warning per window */
   assert_true (take (al, "alice", "127.0.0.2", 3, T0, &other));
   authlimit_refund (al, &other, T0);
   assert_true (take (al, "bob", "127.0.0.1", 3, T0, &other));
   authlimit_refund (al, &other, T0);
   authlimit_destroy (al);
}

/* A right proof gives its guess back: a user who logs in right any number
 * of times is never refused; a wrong one stays counted. */
static void
test_refund_and_spend (void **state)
{
   authlimit_t *al = authlimit_new (key);
   authlimit_ticket_t t;

   (void) state;
   for (int i = 0; i < 50; i++) {
      assert_true (take (al, "alice", "10.0.0.1", 2, T0 + i, &t));
      authlimit_refund (al, &t, T0 + i);
      assert_false (t.held);
   }
   assert_true (take (al, "alice", "10.0.0.1", 2, T0, &t));
   authlimit_spend (al, &t, "alice", T0);
   assert_false (t.held);
   authlimit_refund (al, &t, T0); /* spent: nothing to give back */
   assert_true (take (al, "alice", "10.0.0.1", 2, T0, &t));
   authlimit_spend (al, &t, "alice", T0);
   assert_false (take (al, "alice", "10.0.0.1", 2, T0, &t));
   assert_int_equal (authlimit_user_failures (al, "alice", T0), 2);
   authlimit_destroy (al);
}

/* A guess counts for at least a minute and at most a bucket more: never
 * more than the limit in any 60 s. */
static void
test_sliding_minute (void **state)
{
   authlimit_t *al = authlimit_new (key);
   authlimit_ticket_t t;
   int64_t start = T0 - T0 % AUTHLIMIT_BUCKET_MS + AUTHLIMIT_BUCKET_MS - 1; /* the last ms of a bucket */

   (void) state;
   assert_true (take (al, "u", "a", 2, start, &t));
   authlimit_spend (al, &t, "u", start);
   assert_true (take (al, "u", "a", 2, start + 1, &t)); /* the next bucket */
   authlimit_spend (al, &t, "u", start + 1);
   for (int64_t dt = 0; dt < AUTHLIMIT_WINDOW_MS; dt += 997)
      assert_false (take (al, "u", "a", 2, start + 1 + dt, &t));
   /* 60 s after the first, the first may still count (its bucket is in
    * the ring); once its bucket left, one more is allowed, not two. */
   assert_true (take (al, "u", "a", 2, start + AUTHLIMIT_WINDOW_MS + AUTHLIMIT_BUCKET_MS, &t));
   assert_false (take (al, "u", "a", 2, start + AUTHLIMIT_WINDOW_MS + AUTHLIMIT_BUCKET_MS, &t));
   authlimit_destroy (al);
}

/* The user's delay: none below the threshold, then 100 ms doubling with
 * each failure, capped; failures from any address count. */
static void
test_user_delay (void **state)
{
   authlimit_t *al = authlimit_new (key);
   authlimit_ticket_t t;
   char addr[32];
   static const int64_t want[] = {0, 0, 0, 100, 200, 400, 800, 1600, 3200, 5000, 5000};

   (void) state;
   for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
      assert_int_equal (authlimit_delay_ms (al, "carol", 3, 5000, T0), want[i]);
      assert_int_equal (authlimit_delay_ms (al, "carol", 3, 0, T0), 0);
      snprintf (addr, sizeof addr, "10.0.0.%zu", i);
      assert_true (take (al, "carol", addr, 3, T0, &t));
      authlimit_spend (al, &t, "carol", T0);
   }
   assert_int_equal (authlimit_delay_ms (al, "dave", 3, 5000, T0), 0);
   /* A minute and a bucket later, carol's failures are forgotten. */
   assert_int_equal (authlimit_delay_ms (al, "carol", 3, 5000, T0 + AUTHLIMIT_WINDOW_MS + AUTHLIMIT_BUCKET_MS), 0);
   authlimit_destroy (al);
}

/* A flood of distinct pairs stays within the fixed table: it reuses the
 * least recently used slots and a refund for a slot since reused gives
 * nothing back to the newcomer. */
static void
test_bounded_table (void **state)
{
   authlimit_t *al = authlimit_new (key);
   authlimit_ticket_t first, t;
   char addr[32];
   int refused = 0;

   (void) state;
   assert_true (take (al, "alice", "192.0.2.1", 1, T0, &first));
   for (int i = 0; i < 20 * AUTHLIMIT_PAIRS; i++) {
      snprintf (addr, sizeof addr, "10.%d.%d.%d", i >> 16 & 255, i >> 8 & 255, i & 255);
      if (!take (al, "mallory", addr, 1, T0 + 1 + i, &t))
         refused++;
      else
         authlimit_spend (al, &t, "mallory", T0 + 1 + i);
   }
   assert_int_equal (refused, 0); /* distinct pairs: each its own count */
   /* alice's slot went to the flood: her refund changes no one's count,
    * and the pair starts afresh (what the user's delay, which the flood
    * cannot reset, is for). */
   authlimit_refund (al, &first, T0 + 20 * AUTHLIMIT_PAIRS + 1);
   assert_false (first.held);
   assert_true (take (al, "alice", "192.0.2.1", 1, T0 + 20 * AUTHLIMIT_PAIRS + 2, &t));
   assert_true (authlimit_user_failures (al, "mallory", T0 + 20 * AUTHLIMIT_PAIRS) > 0);
   authlimit_destroy (al);
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_siphash_vectors), cmocka_unit_test (test_limit_per_pair),
      cmocka_unit_test (test_refund_and_spend), cmocka_unit_test (test_sliding_minute),
      cmocka_unit_test (test_user_delay),      cmocka_unit_test (test_bounded_table),
   };

   return cmocka_run_group_tests (tests, NULL, NULL);
}
