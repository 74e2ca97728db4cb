/*
 * base/servercodes.c - the server's codeNames of the codes in
 * base/servercodes.h, which of them mean "not the primary", and which
 * that another client's open transaction held a write up.
 *
 * A table sorted by code, searched by bsearch: the names are only looked
 * up when an answer is built or an error is logged.
 */
#include "base/servercodes.h"

#include <stdlib.h>

typedef struct {
   int32_t code;
   const char *name;
} code_name_t;

/* Sorted by code (a unit test checks it). */
static const code_name_t names[] = {
   {SERVER_INTERNAL_ERROR, "InternalError"},
   {SERVER_BAD_VALUE, "BadValue"},
   {SERVER_UNKNOWN_ERROR, "UnknownError"},
   {SERVER_UNAUTHORIZED, "Unauthorized"},
   {SERVER_PROTOCOL_ERROR, "ProtocolError"},
   {SERVER_AUTHENTICATION_FAILED, "AuthenticationFailed"},
   {SERVER_LOCK_TIMEOUT, "LockTimeout"},
   {SERVER_NAMESPACE_EXISTS, "NamespaceExists"},
   {SERVER_MAX_TIME_MS_EXPIRED, "MaxTimeMSExpired"},
   {SERVER_COMMAND_NOT_FOUND, "CommandNotFound"},
   {SERVER_INVALID_OPTIONS, "InvalidOptions"},
   {SERVER_SHUTDOWN_IN_PROGRESS, "ShutdownInProgress"},
   {SERVER_WRITE_CONFLICT, "WriteConflict"},
   {SERVER_READ_CONCERN_MAJORITY_NOT_ENABLED, "ReadConcernMajorityNotEnabled"},
   {SERVER_PRIMARY_STEPPED_DOWN, "PrimarySteppedDown"},
   {SERVER_NO_SUCH_TRANSACTION, "NoSuchTransaction"},
   {SERVER_TOO_MANY_LOGICAL_SESSIONS, "TooManyLogicalSessions"},
   {SERVER_EXCEEDED_TIME_LIMIT, "ExceededTimeLimit"},
   {SERVER_OPERATION_NOT_SUPPORTED_IN_TRANSACTION, "OperationNotSupportedInTransaction"},
   {SERVER_CHANGE_STREAM_HISTORY_LOST, "ChangeStreamHistoryLost"},
   {SERVER_MECHANISM_UNAVAILABLE, "MechanismUnavailable"},
   {SERVER_UNSUPPORTED_OP_QUERY_COMMAND, "UnsupportedOpQueryCommand"},
   {SERVER_TEMPORARILY_UNAVAILABLE, "TemporarilyUnavailable"},
   {SERVER_NOT_WRITABLE_PRIMARY, "NotWritablePrimary"},
   {SERVER_BSON_OBJECT_TOO_LARGE, "BSONObjectTooLarge"},
   {SERVER_DUPLICATE_KEY, "DuplicateKey"},
   {SERVER_INTERRUPTED_AT_SHUTDOWN, "InterruptedAtShutdown"},
   {SERVER_INTERRUPTED_DUE_TO_REPL_STATE_CHANGE, "InterruptedDueToReplStateChange"},
   {SERVER_NOT_PRIMARY_NO_SECONDARY_OK, "NotPrimaryNoSecondaryOk"},
   {SERVER_NOT_PRIMARY_OR_SECONDARY, "NotPrimaryOrSecondary"},
   {SERVER_DOCUMENT_TOO_LARGE, "DocumentTooLarge"},
};

static int
by_code (const void *key, const void *elem)
{
   int32_t k = *(const int32_t *) key, c = ((const code_name_t *) elem)->code;

   return k < c ? -1 : k > c;
}

const char *
server_code_name (int32_t code)
{
   const code_name_t *e = bsearch (&code, names, sizeof names / sizeof names[0], sizeof names[0], by_code);

   return e ? e->name : NULL;
}

bool
server_code_is_not_primary (int32_t code)
{
   switch (code) {
   case SERVER_NOT_WRITABLE_PRIMARY:
   case SERVER_NOT_PRIMARY_NO_SECONDARY_OK:
   case SERVER_NOT_PRIMARY_OR_SECONDARY:
   case SERVER_INTERRUPTED_AT_SHUTDOWN:
   case SERVER_INTERRUPTED_DUE_TO_REPL_STATE_CHANGE:
   case SERVER_PRIMARY_STEPPED_DOWN:
   case SERVER_SHUTDOWN_IN_PROGRESS:
      return true;
   default:
      return false;
   }
}

bool
server_code_is_held (int32_t code)
{
   switch (code) {
   case SERVER_LOCK_TIMEOUT:
   case SERVER_MAX_TIME_MS_EXPIRED:
   case SERVER_WRITE_CONFLICT:
   case SERVER_EXCEEDED_TIME_LIMIT:
      return true;
   default:
      return false;
   }
}
