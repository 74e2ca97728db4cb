'use strict';
// Server error type and the code -> codeName table. Replies are built from these by the server;
// this file does not decide labels (see sessions.js and server.js).

const CODE_NAMES = {
  1: 'InternalError', 2: 'BadValue', 6: 'HostUnreachable', 7: 'HostNotFound', 8: 'UnknownError',
  9: 'FailedToParse', 11: 'UserNotFound', 13: 'Unauthorized', 14: 'TypeMismatch',
  17: 'ProtocolError', 18: 'AuthenticationFailed', 20: 'IllegalOperation', 24: 'LockTimeout', 26: 'NamespaceNotFound',
  27: 'IndexNotFound', 40: 'ConflictingUpdateOperators', 43: 'CursorNotFound', 48: 'NamespaceExists', 50: 'MaxTimeMSExpired',
  51: 'UnknownReplWriteConcern', 52: 'DollarPrefixedFieldName', 54: 'NotSingleValueField', 56: 'EmptyFieldName', 57: 'DottedFieldName',
  59: 'CommandNotFound', 61: 'ShardKeyNotFound', 64: 'WriteConcernFailed', 66: 'ImmutableField', 67: 'CannotCreateIndex',
  72: 'InvalidOptions', 73: 'InvalidNamespace', 79: 'UnknownReplWriteConcern', 85: 'IndexOptionsConflict',
  86: 'IndexKeySpecsConflict', 89: 'NetworkTimeout', 91: 'ShutdownInProgress', 96: 'OperationFailed',
  100: 'UnsatisfiableWriteConcern', 112: 'WriteConflict', 115: 'CommandNotSupported', 117: 'ConflictingOperationInProgress',
  121: 'DocumentValidationFailure', 125: 'CommandFailed', 133: 'FailedToSatisfyReadPreference',
  150: 'StaleEpoch', 166: 'CommandNotSupportedOnView', 189: 'PrimarySteppedDown', 197: 'InvalidIndexSpecificationOption',
  217: 'IncompleteTransactionHistory', 225: 'TransactionTooOld', 234: 'RetryChangeStream', 246: 'SnapshotUnavailable',
  251: 'NoSuchTransaction', 256: 'TransactionCommitted', 262: 'ExceededTimeLimit', 263: 'OperationNotSupportedInTransaction',
  267: 'PreparedTransactionInProgress', 290: 'TransactionExceededLifetimeLimitSeconds', 9001: 'SocketException',
  10107: 'NotWritablePrimary', 11000: 'DuplicateKey', 11600: 'InterruptedAtShutdown', 11601: 'Interrupted',
  11602: 'InterruptedDueToReplStateChange', 13297: 'DatabaseDifferCase', 13388: 'StaleConfig', 13435: 'NotPrimaryNoSecondaryOk',
  13436: 'NotPrimaryOrSecondary', 50768: 'NotARetryableWriteCommand', 91331: 'NotSupported',
  76: 'NoReplicationEnabled', 95: 'NotSecondary', 31368: 'Location31368', 31373: 'Location31373', 31382: 'Location31382',
  47: 'NoMatchingDocument', 216: 'ElectionInProgress', 237: 'CursorKilled', 260: 'InvalidResumeToken', 280: 'ChangeStreamFatalError',
  286: 'ChangeStreamHistoryLost', 40324: 'Location40324', 40415: 'Location40415', 40573: 'Location40573',
  40647: 'Location40647', 359: 'CannotConvertIndexToUnique', 40413: 'Location40413', 40414: 'Location40414', 51024: 'Location51024', 4662500: 'Location4662500', 5979700: 'Location5979700',
  5979701: 'Location5979701', 322: 'APIVersionError', 323: 'APIStrictError', 324: 'APIDeprecationError',
  4886600: 'Location4886600', 139: 'JSInterpreterFailure', 13606: 'Location13606', 15881: 'Location15881', 40674: 'Location40674', 50808: 'Location50808', 50865: 'Location50865',
};

// Codes a driver may retry; the server labels them RetryableWriteError on retryable writes and
// on commit/abort.
const RETRYABLE_CODES = new Set([6, 7, 89, 91, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436, 63, 150, 13388, 234, 133]);

class MongoError extends Error {
  constructor(code, errmsg, extra) {
    super(errmsg);
    this.code = code;
    this.codeName = CODE_NAMES[code] || 'UnknownError';
    this.errmsg = errmsg;
    this.extra = extra || null; // extra reply fields (e.g. keyPattern)
    this.errorLabels = null;
  }
  toReply() {
    const r = { ok: 0, errmsg: this.errmsg, code: this.code, codeName: this.codeName };
    if (this.extra) Object.assign(r, this.extra);
    if (this.errorLabels && this.errorLabels.length) r.errorLabels = this.errorLabels;
    return r;
  }
}

const err = (code, msg, extra) => new MongoError(code, msg, extra);

module.exports = { MongoError, CODE_NAMES, RETRYABLE_CODES, err };
