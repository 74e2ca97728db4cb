/*
 * test_authlimit.c - the guess counts behind auth_failures_per_minute:
 * SipHash-2-4 against the paper's vectors, the limit per (user, address)
 * pair with proofs checked in parallel, right proofs never counted, the
 * sliding minute, the user's delay, IPv6 counted per /64, and the
 * table's bound (a flood of pairs reuses slots and never grows it).
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

/* The proof checks of a test: each returns the verdict it was given and
 * counts how often it ran. */
typedef struct {
   bool right;
   int runs;
} proof_t;

static bool
proof (void *arg)
{
   proof_t *p = arg;

   p->runs++;
   return p->right;
}

static authlimit_verdict_t
check (authlimit_t *al, const char *user, const char *addr, uint32_t limit, int64_t now, proof_t *p)
{
   uint32_t failures;
   bool first;

   return authlimit_check (al, user, addr, limit, now, proof, p, &failures, &first);
}

static bool
allowed (authlimit_t *al, const char *user, const char *addr, uint32_t limit, int64_t now)
{
   uint32_t failures;
   bool first;

   return authlimit_allowed (al, user, addr, limit, now, &failures, &first);
}

/* Twelve conversations, all started (allowed) before any proof is sent,
 * then twelve wrong proofs: three are checked, nine refused unchecked; the
 * pair's limit touches neither the user elsewhere nor another user. */
static void
test_limit_per_pair (void **state)
{
   authlimit_t *al = authlimit_new (key);
   proof_t wrong = {false, 0}, right = {true, 0};
   int failed = 0, refused = 0;
   uint32_t failures;
   bool first;
   int firsts = 0;

   (void) state;
   for (int i = 0; i < 12; i++)
      assert_true (allowed (al, "alice", "127.0.0.1", 3, T0));
   for (int i = 0; i < 12; i++) {
      authlimit_verdict_t v = authlimit_check (al, "alice", "127.0.0.1", 3, T0, proof, &wrong, &failures, &first);
      failed += v == AUTHLIMIT_FAILED;
      refused += v == AUTHLIMIT_REFUSED;
      firsts += first;
   }
   assert_int_equal (failed, 3);
   assert_int_equal (refused, 9);
   assert_int_equal (wrong.runs, 3); /* the refused were never checked */
   assert_int_equal (firsts, 1);     /* one log line */
   assert_false (allowed (al, "alice", "127.0.0.1", 3, T0));
   /* Even a right proof of the pair is refused unchecked now. */
   assert_int_equal (check (al, "alice", "127.0.0.1", 3, T0, &right), AUTHLIMIT_REFUSED);
   assert_int_equal (right.runs, 0);
   assert_int_equal (check (al, "alice", "127.0.0.2", 3, T0, &right), AUTHLIMIT_PASSED);
   assert_int_equal (check (al, "bob", "127.0.0.1", 3, T0, &right), AUTHLIMIT_PASSED);
   assert_int_equal (authlimit_user_failures (al, "alice", T0), 3);
   authlimit_destroy (al);
}

/* Right proofs are never counted, however many: 2,000 of one pair at a
 * limit of 3 all pass, and the pair's budget for wrong ones stays whole.
 * A failure without a proof (authlimit_fail) counts like a wrong one. */
static void
test_right_proofs_never_counted (void **state)
{
   authlimit_t *al = authlimit_new (key);
   proof_t right = {true, 0}, wrong = {false, 0};

   (void) state;
   for (int i = 0; i < 2000; i++) {
      assert_true (allowed (al, "pool", "10.0.0.1", 3, T0 + i));
      assert_int_equal (check (al, "pool", "10.0.0.1", 3, T0 + i, &right), AUTHLIMIT_PASSED);
   }
   assert_int_equal (authlimit_user_failures (al, "pool", T0 + 2000), 0);
   assert_int_equal (check (al, "pool", "10.0.0.1", 3, T0 + 2000, &wrong), AUTHLIMIT_FAILED);
   authlimit_fail (al, "pool", "10.0.0.1", T0 + 2000);
   assert_int_equal (check (al, "pool", "10.0.0.1", 3, T0 + 2000, &wrong), AUTHLIMIT_FAILED);
   assert_int_equal (check (al, "pool", "10.0.0.1", 3, T0 + 2000, &right), AUTHLIMIT_REFUSED);
   assert_int_equal (authlimit_user_failures (al, "pool", T0 + 2000), 3);
   authlimit_destroy (al);
}

/* A failure counts for at least a minute and at most a bucket more: never
 * more than the limit in any 60 s. */
static void
test_sliding_minute (void **state)
{
   authlimit_t *al = authlimit_new (key);
   proof_t wrong = {false, 0};
   int64_t start = T0 - T0 % AUTHLIMIT_BUCKET_MS + AUTHLIMIT_BUCKET_MS - 1; /* the last ms of a bucket */

   (void) state;
   assert_int_equal (check (al, "u", "a", 2, start, &wrong), AUTHLIMIT_FAILED);
   assert_int_equal (check (al, "u", "a", 2, start + 1, &wrong), AUTHLIMIT_FAILED); /* the next bucket */
   for (int64_t dt = 0; dt < AUTHLIMIT_WINDOW_MS; dt += 997)
      assert_int_equal (check (al, "u", "a", 2, start + 1 + dt, &wrong), AUTHLIMIT_REFUSED);
   /* 60 s after the first, the first may still count (its bucket is in
    * the ring); once its bucket left, one more is checked, not two. */
   assert_int_equal (check (al, "u", "a", 2, start + AUTHLIMIT_WINDOW_MS + AUTHLIMIT_BUCKET_MS, &wrong), AUTHLIMIT_FAILED);
   assert_int_equal (check (al, "u", "a", 2, start + AUTHLIMIT_WINDOW_MS + AUTHLIMIT_BUCKET_MS, &wrong), AUTHLIMIT_REFUSED);
   authlimit_destroy (al);
}

/* The user's delay: none below the threshold, then 100 ms doubling with
 * each failure, capped; failures from any address count. */
static void
test_user_delay (void **state)
{
   authlimit_t *al = authlimit_new (key);
   proof_t wrong = {false, 0};
   char addr[32];
   static const int64_t want[] = {0, 0, 0, 100, 200, 400, 800, 1600, 3200, 5000, 5000};

   (void) state;
   for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
      assert_int_equal (authlimit_delay_ms (al, "carol", 3, 5000, T0), want[i]);
      assert_int_equal (authlimit_delay_ms (al, "carol", 3, 0, T0), 0);
      snprintf (addr, sizeof addr, "10.0.0.%zu", i);
      assert_int_equal (check (al, "carol", addr, 3, T0, &wrong), AUTHLIMIT_FAILED);
   }
   assert_int_equal (authlimit_delay_ms (al, "dave", 3, 5000, T0), 0);
   /* A minute and a bucket later, carol's failures are forgotten. */
   assert_int_equal (authlimit_delay_ms (al, "carol", 3, 5000, T0 + AUTHLIMIT_WINDOW_MS + AUTHLIMIT_BUCKET_MS), 0);
   authlimit_destroy (al);
}

/* IPv6 addresses count per /64, so that a host's many addresses share one
 * budget; IPv4-mapped ones as their IPv4 address; the rest as they are. */
static void
test_addr_group (void **state)
{
   static const struct {
      const char *in, *want;
   } cases[] = {
      {"[2001:db8:1:2:aaaa:bbbb:cccc:dddd]", "[2001:db8:1:2::]/64"},
      {"[2001:db8:1:2::1]", "[2001:db8:1:2::]/64"},
      {"[2001:db8:1:3::1]", "[2001:db8:1:3::]/64"},
      {"[fe80::1%eth0]", "[fe80::]/64"},
      {"[::1]", "[::]/64"},
      {"[::ffff:192.0.2.7]", "192.0.2.7"},
      {"192.0.2.7", "192.0.2.7"},
      {"unix", "unix"},
      {"[not-an-address]", "[not-an-address]"},
   };
   authlimit_t *al = authlimit_new (key);
   proof_t wrong = {false, 0};
   char a[64], b[64];

   (void) state;
   for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      authlimit_addr_group (cases[i].in, a, sizeof a);
      assert_string_equal (a, cases[i].want);
   }
   /* Two addresses of one /64 share the pair's limit. */
   authlimit_addr_group ("[2001:db8::1]", a, sizeof a);
   authlimit_addr_group ("[2001:db8::ffff:2]", b, sizeof b);
   assert_int_equal (check (al, "eve", a, 2, T0, &wrong), AUTHLIMIT_FAILED);
   assert_int_equal (check (al, "eve", b, 2, T0, &wrong), AUTHLIMIT_FAILED);
   assert_int_equal (check (al, "eve", a, 2, T0, &wrong), AUTHLIMIT_REFUSED);
   assert_int_equal (check (al, "eve", b, 2, T0, &wrong), AUTHLIMIT_REFUSED);
   authlimit_destroy (al);
}

/* A flood of distinct pairs stays within the fixed table: it reuses the
 * least recently used slots. */
static void
test_bounded_table (void **state)
{
   authlimit_t *al = authlimit_new (key);
   proof_t wrong = {false, 0};
   char addr[32];
   int refused = 0;

   (void) state;
   assert_int_equal (check (al, "alice", "192.0.2.1", 1, T0, &wrong), AUTHLIMIT_FAILED);
   for (int i = 0; i < 20 * AUTHLIMIT_PAIRS; i++) {
      snprintf (addr, sizeof addr, "10.%d.%d.%d", i >> 16 & 255, i >> 8 & 255, i & 255);
      if (check (al, "mallory", addr, 1, T0 + 1 + i, &wrong) == AUTHLIMIT_REFUSED)
         refused++;
   }
   assert_int_equal (refused, 0); /* distinct pairs: each its own count */
   /* alice's slot went to the flood: the pair starts afresh (what the
    * user's delay, which the flood cannot reset, is for). */
   assert_int_equal (check (al, "alice", "192.0.2.1", 1, T0 + 20 * AUTHLIMIT_PAIRS + 2, &wrong), AUTHLIMIT_FAILED);
   assert_true (authlimit_user_failures (al, "mallory", T0 + 20 * AUTHLIMIT_PAIRS) > 0);
   authlimit_destroy (al);
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_siphash_vectors), cmocka_unit_test (test_limit_per_pair),
      cmocka_unit_test (test_right_proofs_never_counted), cmocka_unit_test (test_sliding_minute),
      cmocka_unit_test (test_user_delay),      cmocka_unit_test (test_addr_group),
      cmocka_unit_test (test_bounded_table),
   };

   return cmocka_run_group_tests (tests, NULL, NULL);
}
