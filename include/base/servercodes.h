/*
 * base/servercodes.h - the MongoDB server's error codes the proxy reads
 * in replies or answers with itself, by name, in one place.
 *
 * Thread: any (constants, and a lookup in a constant table).
 *
 * The numbers and names are the server's (its error_codes.yml): an answer
 * the proxy makes carries the code and the codeName a mongod would send,
 * so that a driver's retry and error-label logic sees what it knows.
 * Modules name the codes they use through this enum; their own enums of
 * what they answer (inject.h, pull.h, ...) are made of these values.
 * The relaybus-only codes of the pull consumers' commands (9010, 9011) are
 * not the server's and stay in base/pull.h.
 */
#ifndef RELAYBUS_BASE_SERVERCODES_H
#define RELAYBUS_BASE_SERVERCODES_H

#include <stdbool.h>
#include <stdint.h>

typedef enum {
   SERVER_INTERNAL_ERROR = 1,
   SERVER_BAD_VALUE = 2,
   SERVER_UNKNOWN_ERROR = 8,
   SERVER_UNAUTHORIZED = 13,
   SERVER_PROTOCOL_ERROR = 17,
   SERVER_AUTHENTICATION_FAILED = 18,
   SERVER_LOCK_TIMEOUT = 24,
   SERVER_NAMESPACE_EXISTS = 48,
   SERVER_MAX_TIME_MS_EXPIRED = 50,
   SERVER_COMMAND_NOT_FOUND = 59,
   SERVER_INVALID_OPTIONS = 72,
   SERVER_SHUTDOWN_IN_PROGRESS = 91,
   SERVER_WRITE_CONFLICT = 112,
   SERVER_READ_CONCERN_MAJORITY_NOT_ENABLED = 148,
   SERVER_PRIMARY_STEPPED_DOWN = 189,
   SERVER_NO_SUCH_TRANSACTION = 251,
   SERVER_TOO_MANY_LOGICAL_SESSIONS = 261,
   SERVER_EXCEEDED_TIME_LIMIT = 262,
   SERVER_OPERATION_NOT_SUPPORTED_IN_TRANSACTION = 263,
   SERVER_CHANGE_STREAM_HISTORY_LOST = 286,
   SERVER_MECHANISM_UNAVAILABLE = 334,
   SERVER_UNSUPPORTED_OP_QUERY_COMMAND = 352,
   SERVER_TEMPORARILY_UNAVAILABLE = 365,
   SERVER_NOT_WRITABLE_PRIMARY = 10107,
   SERVER_BSON_OBJECT_TOO_LARGE = 10334,
   SERVER_DUPLICATE_KEY = 11000,
   SERVER_INTERRUPTED_AT_SHUTDOWN = 11600,
   SERVER_INTERRUPTED_DUE_TO_REPL_STATE_CHANGE = 11602,
   SERVER_NOT_PRIMARY_NO_SECONDARY_OK = 13435,
   SERVER_NOT_PRIMARY_OR_SECONDARY = 13436,
   SERVER_DOCUMENT_TOO_LARGE = 17419,
} server_code_t;

/* The server's codeName of `code` ("WriteConflict"); NULL for a code not
 * in the enum above. */
const char *server_code_name (int32_t code);

/* Whether `code` says the member is not (or no longer) the primary: the
 * errors after which a driver selects a server again (the SDAM spec's
 * "not writable primary" and "node is recovering" codes). */
bool server_code_is_not_primary (int32_t code);

/* Whether `code` says a write met a document another client's open
 * transaction holds: it waited past its maxTimeMS (MaxTimeMSExpired,
 * ExceededTimeLimit) or for a lock (LockTimeout), or it conflicted with
 * the transaction's write (WriteConflict).  The same write passes once
 * that transaction ends. */
bool server_code_is_held (int32_t code);

#endif /* RELAYBUS_BASE_SERVERCODES_H */
