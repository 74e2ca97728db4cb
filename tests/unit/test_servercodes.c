/*
 * test_servercodes.c - src/base/servercodes.c: every code of the enum has
 * the server's codeName (the table is searched by bsearch, so a code out
 * of order would not be found), a code not listed has none, the
 * not-primary class is the SDAM spec's list, and the held class the codes
 * of a write another open transaction held up.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "base/servercodes.h"

static const struct {
   int32_t code;
   const char *name;
   bool not_primary;
} cases[] = {
   {SERVER_INTERNAL_ERROR, "InternalError", false},
   {SERVER_BAD_VALUE, "BadValue", false},
   {SERVER_UNKNOWN_ERROR, "UnknownError", false},
   {SERVER_UNAUTHORIZED, "Unauthorized", false},
   {SERVER_PROTOCOL_ERROR, "ProtocolError", false},
   {SERVER_AUTHENTICATION_FAILED, "AuthenticationFailed", false},
   {SERVER_LOCK_TIMEOUT, "LockTimeout", false},
   {SERVER_NAMESPACE_EXISTS, "NamespaceExists", false},
   {SERVER_MAX_TIME_MS_EXPIRED, "MaxTimeMSExpired", false},
   {SERVER_COMMAND_NOT_FOUND, "CommandNotFound", false},
   {SERVER_INVALID_OPTIONS, "InvalidOptions", false},
   {SERVER_SHUTDOWN_IN_PROGRESS, "ShutdownInProgress", true},
   {SERVER_WRITE_CONFLICT, "WriteConflict", false},
   {SERVER_READ_CONCERN_MAJORITY_NOT_ENABLED, "ReadConcernMajorityNotEnabled", false},
   {SERVER_PRIMARY_STEPPED_DOWN, "PrimarySteppedDown", true},
   {SERVER_NO_SUCH_TRANSACTION, "NoSuchTransaction", false},
   {SERVER_TOO_MANY_LOGICAL_SESSIONS, "TooManyLogicalSessions", false},
   {SERVER_EXCEEDED_TIME_LIMIT, "ExceededTimeLimit", false},
   {SERVER_OPERATION_NOT_SUPPORTED_IN_TRANSACTION, "OperationNotSupportedInTransaction", false},
   {SERVER_CHANGE_STREAM_HISTORY_LOST, "ChangeStreamHistoryLost", false},
   {SERVER_MECHANISM_UNAVAILABLE, "MechanismUnavailable", false},
   {SERVER_UNSUPPORTED_OP_QUERY_COMMAND, "UnsupportedOpQueryCommand", false},
   {SERVER_TEMPORARILY_UNAVAILABLE, "TemporarilyUnavailable", false},
   {SERVER_NOT_WRITABLE_PRIMARY, "NotWritablePrimary", true},
   {SERVER_BSON_OBJECT_TOO_LARGE, "BSONObjectTooLarge", false},
   {SERVER_DUPLICATE_KEY, "DuplicateKey", false},
   {SERVER_INTERRUPTED_AT_SHUTDOWN, "InterruptedAtShutdown", true},
   {SERVER_INTERRUPTED_DUE_TO_REPL_STATE_CHANGE, "InterruptedDueToReplStateChange", true},
   {SERVER_NOT_PRIMARY_NO_SECONDARY_OK, "NotPrimaryNoSecondaryOk", true},
   {SERVER_NOT_PRIMARY_OR_SECONDARY, "NotPrimaryOrSecondary", true},
   {SERVER_DOCUMENT_TOO_LARGE, "DocumentTooLarge", false},
};

static void
test_names (void **state)
{
   (void) state;
   for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      const char *got = server_code_name (cases[i].code);

      if (!got || strcmp (got, cases[i].name) != 0)
         fail_msg ("code %d: %s, want %s", (int) cases[i].code, got ? got : "(none)", cases[i].name);
      assert_int_equal (server_code_is_not_primary (cases[i].code), cases[i].not_primary);
   }
   assert_null (server_code_name (0));
   assert_null (server_code_name (9010)); /* the pull consumers' own, not the server's */
   assert_null (server_code_name (-1));
   assert_false (server_code_is_not_primary (0));
}

/* The codes of a write another client's open transaction held up. */
static void
test_held (void **state)
{
   static const int32_t held[] = {SERVER_LOCK_TIMEOUT, SERVER_MAX_TIME_MS_EXPIRED, SERVER_WRITE_CONFLICT,
                                  SERVER_EXCEEDED_TIME_LIMIT};

   (void) state;
   for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      bool want = false;
      for (size_t j = 0; j < sizeof held / sizeof held[0]; j++)
         want = want || held[j] == cases[i].code;
      assert_int_equal (server_code_is_held (cases[i].code), want);
   }
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_names),
      cmocka_unit_test (test_held),
   };

   return cmocka_run_group_tests (tests, NULL, NULL);
}
