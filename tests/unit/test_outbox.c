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

#include <stdio.h>
#include <stdlib.h>

#include "base/outbox.h"

/* `s` with every `from` replaced by `to`; caller frees. */
static char *
replace_all (const char *s, const char *from, const char *to)
{
   size_t n = 0, fl = strlen (from), tl = strlen (to);
   char *out, *o;

   for (const char *p = strstr (s, from); p; p = strstr (p + fl, from))
      n++;
   out = o = malloc (strlen (s) + n * tl + 1);
   while (*s) {
      if (strncmp (s, from, fl) == 0) {
         memcpy (o, to, tl);
         o += tl;
         s += fl;
      } else {
         *o++ = *s++;
      }
   }
   *o = '\0';
   return out;
}

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

/* The completion fence on one delivery and its lane document, as the
 * store and a pull consumer's transaction both read them: each row a
 * delivery and a lane document (JSON; "" for none) and whether the lease
 * 7:3:2 of delivery 5f..01 for handler "h" holds. */
static void
test_lease_holds (void **state)
{
   static const struct {
      const char *delivery, *lane;
      bool holds;
   } rows[] = {
      {"{\"laneId\": 7, \"claims\": 2, \"status\": \"pending\", \"handler\": \"h\"}", "{\"epoch\": 3, \"inFlight\": [ID]}", true},
      /* numbers of any BSON type: the store writes int32 or int64 */
      {"{\"laneId\": {\"$numberLong\": \"7\"}, \"claims\": {\"$numberLong\": \"2\"}, \"status\": \"pending\", \"handler\": \"h\"}",
       "{\"epoch\": {\"$numberLong\": \"3\"}, \"inFlight\": [OTHER, ID]}", true},
      {"{\"laneId\": 7, \"claims\": 3, \"status\": \"pending\", \"handler\": \"h\"}", "{\"epoch\": 3, \"inFlight\": [ID]}", false},
      {"{\"laneId\": 7, \"status\": \"pending\", \"handler\": \"h\"}", "{\"epoch\": 3, \"inFlight\": [ID]}", false},
      {"{\"laneId\": 8, \"claims\": 2, \"status\": \"pending\", \"handler\": \"h\"}", "{\"epoch\": 3, \"inFlight\": [ID]}", false},
      {"{\"claims\": 2, \"status\": \"pending\", \"handler\": \"h\"}", "{\"epoch\": 3, \"inFlight\": [ID]}", false},
      {"{\"laneId\": 7, \"claims\": 2, \"status\": \"dead\", \"handler\": \"h\"}", "{\"epoch\": 3, \"inFlight\": [ID]}", false},
      {"{\"laneId\": 7, \"claims\": 2, \"status\": \"pending\", \"handler\": \"g\"}", "{\"epoch\": 3, \"inFlight\": [ID]}", false},
      {"{\"laneId\": 7, \"claims\": 2, \"status\": \"pending\", \"handler\": \"h\"}", "{\"epoch\": 4, \"inFlight\": [ID]}", false},
      {"{\"laneId\": 7, \"claims\": 2, \"status\": \"pending\", \"handler\": \"h\"}", "{\"inFlight\": [ID]}", false},
      {"{\"laneId\": 7, \"claims\": 2, \"status\": \"pending\", \"handler\": \"h\"}", "{\"epoch\": 3, \"inFlight\": [OTHER]}", false},
      {"{\"laneId\": 7, \"claims\": 2, \"status\": \"pending\", \"handler\": \"h\"}", "{\"epoch\": 3}", false},
      {"{\"laneId\": 7, \"claims\": 2, \"status\": \"pending\", \"handler\": \"h\"}", "", false},
      {"", "{\"epoch\": 3, \"inFlight\": [ID]}", false},
   };
   const outbox_lease_t lease = {.lane_id = 7, .epoch = 3, .claims = 2};
   bson_oid_t id;

   (void) state;
   bson_oid_init_from_string (&id, "5f0000000000000000000001");
   for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
      bson_t *d = NULL, *l = NULL;
      char json[512];
      bson_error_t error;

      if (*rows[i].delivery) {
         d = bson_new_from_json ((const uint8_t *) rows[i].delivery, -1, &error);
         assert_non_null (d);
      }
      if (*rows[i].lane) {
         /* ID and OTHER stand for the delivery's _id and another one. */
         char *a = replace_all (rows[i].lane, "ID", "{\"$oid\": \"5f0000000000000000000001\"}");
         char *b = replace_all (a, "OTHER", "{\"$oid\": \"5f0000000000000000000002\"}");
         snprintf (json, sizeof json, "%s", b);
         free (a);
         free (b);
         l = bson_new_from_json ((const uint8_t *) json, -1, &error);
         assert_non_null (l);
      }
      if (outbox_lease_holds (&lease, &id, "h", d, l) != rows[i].holds)
         fail_msg ("row %zu: %s / %s: expected %s", i, rows[i].delivery, rows[i].lane, rows[i].holds ? "holds" : "does not hold");
      /* Without a handler to compare, only the handler row changes. */
      if (outbox_lease_holds (&lease, &id, NULL, d, l) != (rows[i].holds || i == 7))
         fail_msg ("row %zu without a handler", i);
      bson_destroy (d);
      bson_destroy (l);
   }
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_names),
      cmocka_unit_test (test_fnv1a),
      cmocka_unit_test (test_lease_tokens),
      cmocka_unit_test (test_lease_holds),
   };

   return cmocka_run_group_tests (tests, NULL, NULL);
}
