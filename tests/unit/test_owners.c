/*
 * test_owners.c - src/proxy/owners.c: the one check of a pooled request
 * against the table of owners, driven by a table of requests.
 *
 * The rows run in order against the process-wide table, as one story:
 * alice's requests name a session first, so it becomes hers; bob's
 * requests naming it, her transaction on it, or cursors none of his
 * replies opened are refused with mongod's code and wording; what lists or
 * ends every user's sessions or operations is refused to everyone; a
 * client that is not checked (user 0) is never refused.  Cursors enter the
 * table from replies (owners_note_reply, which needs a connection): the
 * integration test tests/integration/tenants/owners.test.js covers them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <bson/bson.h>

#include "proxy/owners.h"

#define ALICE 1
#define BOB 2
#define NOBODY 0 /* not checked: no auth file, or not pooled */

#define S1 "{\"id\": {\"$binary\": {\"base64\": \"AAECAwQFBgcICQoLDA0ODw==\", \"subType\": \"04\"}}}"
#define S2 "{\"id\": {\"$binary\": {\"base64\": \"EBESExQVFhcYGRobHB0eHw==\", \"subType\": \"04\"}}}"
#define TXN "\"lsid\": " S1 ", \"txnNumber\": {\"$numberLong\": \"1\"}, \"autocommit\": false"

typedef struct {
   uint64_t user;
   const char *json;
   int32_t code;       /* 0: allowed */
   const char *errmsg; /* the refusal's errmsg, whole */
} row_t;

static const row_t rows[] = {
   /* alice's session becomes hers; her transaction runs on it. */
   {ALICE, "{\"insert\": \"x\", \"documents\": [{}], " TXN ", \"startTransaction\": true, \"$db\": \"test\"}", 0, NULL},
   {ALICE, "{\"find\": \"x\", " TXN ", \"$db\": \"test\"}", 0, NULL},
   /* bob may not use it: with txnNumber, without, or to end it. */
   {BOB, "{\"find\": \"x\", " TXN ", \"$db\": \"test\"}", 13, "not authorized on test to execute command { find: ... }"},
   {BOB, "{\"find\": \"x\", \"lsid\": " S1 ", \"$db\": \"test\"}", 13, NULL},
   {BOB, "{\"insert\": \"x\", \"documents\": [{}], \"lsid\": " S1 ", \"txnNumber\": {\"$numberLong\": \"9\"}, \"$db\": \"t\"}",
    13, NULL},
   {BOB, "{\"abortTransaction\": 1, " TXN ", \"$db\": \"admin\"}", 13,
    "not authorized on admin to execute command { abortTransaction: ... }"},
   {BOB, "{\"commitTransaction\": 1, " TXN ", \"$db\": \"admin\"}", 13, NULL},
   {BOB, "{\"killSessions\": [" S1 "], \"$db\": \"admin\"}", 13, NULL},
   {BOB, "{\"endSessions\": [" S2 ", " S1 "], \"$db\": \"admin\"}", 13, NULL},
   {BOB, "{\"refreshSessions\": [" S1 "], \"$db\": \"admin\"}", 13, NULL},
   {BOB, "{\"killSessions\": [], \"$db\": \"admin\"}", 13, NULL},
   /* bob's own session is his, and alice's request naming it is refused. */
   {BOB, "{\"find\": \"x\", \"lsid\": " S2 ", \"$db\": \"test\"}", 0, NULL},
   {ALICE, "{\"count\": \"x\", \"lsid\": " S2 ", \"$db\": \"test\"}", 13, NULL},
   {BOB, "{\"endSessions\": [" S2 "], \"$db\": \"admin\"}", 0, NULL},
   /* Cursors nobody's reply opened for bob. */
   {BOB, "{\"getMore\": {\"$numberLong\": \"1234567\"}, \"collection\": \"x\", \"$db\": \"test\"}", 13,
    "cursor id 1234567 was not created by the authenticated user"},
   {BOB, "{\"getMore\": 1e300, \"collection\": \"x\", \"$db\": \"test\"}", 13,
    "cursor id 9223372036854775807 was not created by the authenticated user"},
   {BOB, "{\"killCursors\": \"x\", \"cursors\": [{\"$numberLong\": \"0\"}, {\"$numberLong\": \"1234567\"}], \"$db\": \"t\"}",
    13, "not authorized to kill cursor on t.x"},
   {BOB, "{\"getMore\": {\"$numberLong\": \"0\"}, \"collection\": \"x\", \"$db\": \"test\"}", 0, NULL},
   /* Every user's operations and sessions. */
   {ALICE, "{\"killOp\": 1, \"op\": 12, \"$db\": \"admin\"}", 13, "Unauthorized"},
   {ALICE, "{\"currentOp\": 1, \"$db\": \"admin\"}", 13, NULL},
   {ALICE, "{\"aggregate\": 1, \"pipeline\": [{\"$currentOp\": {}}], \"cursor\": {}, \"$db\": \"admin\"}", 13,
    "not authorized on admin to execute command { aggregate: ... }"},
   {ALICE, "{\"aggregate\": 1, \"pipeline\": [{\"$listLocalSessions\": {}}], \"cursor\": {}, \"$db\": \"admin\"}", 13, NULL},
   {ALICE, "{\"aggregate\": \"system.sessions\", \"pipeline\": [{\"$listSessions\": {}}], \"cursor\": {}, \"$db\": \"config\"}",
    13, NULL},
   {ALICE, "{\"find\": \"image_collection\", \"$db\": \"config\"}", 13, NULL},
   {ALICE, "{\"killAllSessions\": [], \"$db\": \"admin\"}", 13, NULL},
   {ALICE, "{\"killAllSessionsByPattern\": [], \"$db\": \"admin\"}", 13, NULL},
   {ALICE, "{\"aggregate\": \"x\", \"pipeline\": [{\"$match\": {}}], \"cursor\": {}, \"$db\": \"test\"}", 0, NULL},
   {ALICE, "{\"ping\": 1, \"$db\": \"admin\"}", 0, NULL},
   /* alice's own: her commit, then her kill. */
   {ALICE, "{\"commitTransaction\": 1, " TXN ", \"$db\": \"admin\"}", 0, NULL},
   {ALICE, "{\"killSessions\": [" S1 "], \"$db\": \"admin\"}", 0, NULL},
   /* A client that is not checked. */
   {NOBODY, "{\"find\": \"x\", \"lsid\": " S1 ", \"$db\": \"test\"}", 0, NULL},
   {NOBODY, "{\"killOp\": 1, \"op\": 12, \"$db\": \"admin\"}", 0, NULL},
};

static void
test_rows (void **state)
{
   (void) state;
   for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
      const row_t *row = &rows[i];
      bson_error_t error;
      bson_t *body = bson_new_from_json ((const uint8_t *) row->json, -1, &error);
      bson_iter_t it;
      owners_refusal_t r;
      owners_verdict_t v;

      if (!body)
         fail_msg ("row %zu: %s: %s", i, row->json, error.message);
      assert_true (bson_iter_init (&it, body) && bson_iter_next (&it));
      v = owners_check_user (row->user, 0, body, bson_iter_key (&it), &r);
      if (v != (row->code ? OWNERS_REFUSE : OWNERS_ALLOW))
         fail_msg ("row %zu: %s: verdict %d", i, row->json, (int) v);
      if (row->code) {
         assert_int_equal (r.code, row->code);
         assert_string_equal (r.code_name, "Unauthorized");
         if (row->errmsg)
            assert_string_equal (r.why, row->errmsg);
      }
      bson_destroy (body);
   }
}

/* A ping in the session whose 16-byte id is `raw`. */
static bson_t *
ping_in (const char *raw)
{
   bson_t *b = bson_new ();
   bson_t lsid;

   BSON_APPEND_INT32 (b, "ping", 1);
   BSON_APPEND_DOCUMENT_BEGIN (b, "lsid", &lsid);
   BSON_APPEND_BINARY (&lsid, "id", BSON_SUBTYPE_UUID, (const uint8_t *) raw, 16);
   bson_append_document_end (b, &lsid);
   BSON_APPEND_UTF8 (b, "$db", "admin");
   return b;
}

/* A user's sessions count against pool_max_sessions_per_user: past it a
 * new session is refused with TooManyLogicalSessions naming the key,
 * while the user's own sessions go on and another user's new ones are
 * entered. */
static void
test_sessions_quota (void **state)
{
   owners_refusal_t r;
   char raw[17];

   (void) state;
   for (int i = 0; i < 7; i++) {
      bson_t *body;

      snprintf (raw, sizeof raw, "quota-session-%02d", i);
      body = ping_in (raw);
      if (i < 5) {
         assert_int_equal (owners_check_user (3, 5, body, "ping", &r), OWNERS_ALLOW);
      } else {
         assert_int_equal (owners_check_user (3, 5, body, "ping", &r), OWNERS_REFUSE);
         assert_int_equal (r.code, 261);
         assert_string_equal (r.code_name, "TooManyLogicalSessions");
         assert_non_null (strstr (r.why, "pool_max_sessions_per_user = 5"));
      }
      bson_destroy (body);
   }
   /* The user's own sessions go on at the quota. */
   {
      bson_t *body = ping_in ("quota-session-00");
      assert_int_equal (owners_check_user (3, 5, body, "ping", &r), OWNERS_ALLOW);
      bson_destroy (body);
   }
   /* Another user's new session is entered; without a quota, the first
    * user's too. */
   {
      bson_t *other = ping_in ("other-user-sess1");
      bson_t *more = ping_in ("quota-session-99");
      assert_int_equal (owners_check_user (4, 5, other, "ping", &r), OWNERS_ALLOW);
      assert_int_equal (owners_check_user (3, 0, more, "ping", &r), OWNERS_ALLOW);
      bson_destroy (other);
      bson_destroy (more);
   }
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_rows),
      cmocka_unit_test (test_sessions_quota),
   };

   return cmocka_run_group_tests (tests, NULL, NULL);
}
