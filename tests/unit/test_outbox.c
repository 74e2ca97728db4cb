/*
 * test_outbox.c - collection names, the lane hash (against FNV-1a's
 * published test vectors) and lease token parsing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "base/outbox.h"

static void
test_names (void **state)
{
   char name[OUTBOX_NAME_MAX];

   assert_true (outbox_collection_name ("relaybus_", OUTBOX_EVENTS, name, sizeof name));
   assert_string_equal (name, "relaybus_events");
   assert_true (outbox_collection_name ("", OUTBOX_COMPLETED, name, sizeof name));
   assert_string_equal (name, "completed_deliveries");
   assert_true (outbox_collection_name ("x.", OUTBOX_KEY_SEQUENCES, name, sizeof name));
   assert_string_equal (name, "x.key_sequences");
   assert_false (outbox_collection_name ("relaybus_", OUTBOX_DELIVERIES, name, 8));
   assert_null (outbox_collection_suffix (OUTBOX_N_COLLECTIONS));
}

static void
test_fnv1a (void **state)
{
   /* Published FNV-1a 32-bit vectors. */
   assert_int_equal (outbox_fnv1a ("", 0), 0x811c9dc5u);
   assert_int_equal (outbox_fnv1a ("a", 1), 0xe40c292cu);
   assert_int_equal (outbox_fnv1a ("foobar", 6), 0xbf9cf968u);
   /* The lane is the hash of the key, else of the event id, modulo 256. */
   assert_int_equal (outbox_lane_id ("foobar", "ignored"), 0x68);
   assert_int_equal (outbox_lane_id (NULL, "a"), 0x2c);
   /* UTF-8 bytes, not characters. */
   assert_int_equal (outbox_lane_id ("\xc3\xa9", "x"), outbox_fnv1a ("\xc3\xa9", 2) % 256);
}

static void
test_lease_tokens (void **state)
{
   outbox_lease_t l = {.lane_id = 17, .epoch = 42, .claims = 3}, back;
   char token[OUTBOX_LEASE_TOKEN_MAX];

   outbox_lease_format (&l, token);
   assert_string_equal (token, "17:42:3");
   assert_true (outbox_lease_parse (token, &back));
   assert_int_equal (back.lane_id, 17);
   assert_int_equal (back.epoch, 42);
   assert_int_equal (back.claims, 3);
   assert_true (outbox_lease_parse ("255:9223372036854775807:0", &back));
   assert_int_equal (back.epoch, INT64_MAX);

   static const char *const bad[] = {
      "", "1", "1:2", "256:1:0", "1:0:0", "-1:1:0", "1:1:-1", "01:1:0", "1:1:0:", "1:1:0 ",
      " 1:1:0", "1::0", "1:9223372036854775808:0", "1:1:2147483648", "a:b:c", "1:1:0x",
   };
   for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
      if (outbox_lease_parse (bad[i], &back))
         fail_msg ("token '%s' was accepted", bad[i]);
   }
   assert_false (outbox_lease_parse (NULL, &back));
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_names),
      cmocka_unit_test (test_fnv1a),
      cmocka_unit_test (test_lease_tokens),
   };

   return cmocka_run_group_tests (tests, NULL, NULL);
}
