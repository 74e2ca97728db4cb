'use strict';
// Command parsing as mongod 7.0 does it before a command runs: the parsers its build generates
// from the IDL files (one struct per command, and the structs inside it: statements, cursor
// options, index specifications, ...), and the hand-written parsers of the generic arguments
// (writeConcern, readConcern, maxTimeMS, the session fields). Declarative: one table per IDL
// struct, field name -> IDL type / required / nested struct, and one walker (parseStruct)
// that applies it with mongod's rules, codes and messages (src/mongo/idl/idl_parser.cpp):
//
//   - fields are read in the order the client sent them, and the first one at fault decides
//     the error: an unknown field of a strict struct 40415, a field of the wrong type 14
//     (TypeMismatch, naming the actual type), a duplicate 40413 (a strict struct: a declared
//     field given twice; a non-strict one: any field); then a required field not given 40414;
//   - a declared field whose value is null or undefined counts as absent (not refused, and a
//     required one is then missing), except for the IDL types that hand the value to a
//     deserializer of their own (`any`: update's `u`, delete's `limit`, find's `filter`, ...);
//   - the path P of a message is the parser's context name (the command's name, or its
//     struct's for some: `FindCommandRequest`), then the field names, joined with dots; an
//     array element's struct is parsed under the array field's name (`update.updates.u`), an
//     array element of the wrong type is named by its index (`insert.documents.0`);
//   - every command accepts the generic arguments (src/mongo/idl/generic_argument.idl).
//
// parseCommand() is called once per command, after the authentication check and before
// anything else (server.js for a member's commands, sharding.js for a router's), so a refused
// command has no effect and looks nothing up (a getMore with an unknown field answers 40415
// even for a cursor that does not exist). Commands without a table here are not parsed by IDL
// in mongod either (ping, buildInfo, serverStatus, getParameter, ...: they read the fields
// they know and ignore the rest), or are not checked by this double yet (the README's table
// says which); the double's own test commands (doubleStats, doubleElectionTime) and
// configureFailPoint read their own fields.

const { BSON } = require('bson');
const V = require('./values');
const { err } = require('./errors');

// ---- types ----

// The BSON type names as mongod's typeName() prints them.
function typeName(v) {
  if (v !== null && typeof v === 'object' && v._bsontype === 'Code' && v.scope) return 'javascriptWithScope';
  if (v !== null && typeof v === 'object' && v._bsontype === 'DBRef') return 'object';
  return V.bsonTag(v);
}

const NUMBERS = ['long', 'int', 'decimal', 'double'];
// IDL types (src/mongo/idl/basic_types.idl): the BSON types each accepts, in the order its
// bson_serialization_type lists them, which is the order of an "expected types" message.
const TYPES = {
  string: ['string'], int: ['int'], long: ['long'], bool: ['bool'], object: ['object'], array: ['array'],
  timestamp: ['timestamp'], objectid: ['objectId'], date: ['date'],
  safeInt: NUMBERS, safeInt64: NUMBERS, safeDouble: NUMBERS, exactInt64: NUMBERS,
  safeBool: ['bool', ...NUMBERS],
  uuid: ['binData'], // subtype 4
  // mapReduce's map, reduce and finalize (map_reduce.idl): code (with or without scope) or text.
  mapReduceCode: ['string', 'javascript'],
  sha256Block: ['binData'],
};

const BINDATA_NAMES = { 0: 'general', 1: 'function', 2: 'binary(old)', 3: 'UUID(old)', 4: 'UUID', 5: 'MD5', 6: 'encrypt', 7: 'column', 8: 'sensitive', 128: 'user' };

function wrongType(path, v, types) {
  if (types.length === 1) {
    return err(14, `BSON field '${path}' is the wrong type '${typeName(v)}', expected type '${types[0]}'`);
  }
  // idl_parser.cpp's throwBadType, its closing quote inside the bracket included.
  return err(14, `BSON field '${path}' is the wrong type '${typeName(v)}', expected types '[${types.join(', ')}']`);
}

const isNull = (v) => v === null || v === undefined;
const isObject = (v) => typeName(v) === 'object';

// ---- deserializers of the IDL types that read the value themselves (bson type `any`) ----
// Each gets the value as sent, null included, and its field's path.

// optionalBool (basic_types.idl, OptionalBool::parseFromBSON): a bool, nothing else (not null).
function optionalBool(v, path, name) {
  if (typeof v !== 'boolean') throw err(14, `Field '${name}' should be a boolean value, but found: ${typeName(v)}`);
}

// find's object_owned_nonempty_serialize (parseOwnedBSON): an object, null refused; the
// message really has no space before "to".
function ownedObject(v, path, name) {
  if (!isObject(v)) throw err(14, `Expected field ${name}to be of type object`);
}

// find's oplogReplay (boolNoOpSerializer, parseBoolean), with parseOwnedBSON's message.
function parseBoolean(v, path, name) {
  if (typeof v !== 'boolean') throw err(14, `Expected field ${name}to be of type object`);
}

// indexHint (hint.idl): an index name or a key pattern.
function indexHint(v) {
  if (typeof v !== 'string' && !isObject(v)) throw err(9, 'Hint must be a string or an object');
}

// update_modification (write_ops.idl): a document (operators or a replacement) or a pipeline.
function updateModification(v) {
  if (Array.isArray(v)) {
    for (const st of v) if (!isObject(st)) throw err(14, "Each element of the 'pipeline' array must be an object");
    return;
  }
  if (!isObject(v)) throw err(9, 'Update argument must be either an object or an array');
}

// multi_delete_bool (readMultiDeleteProperty): the number 0 or 1; any other type reads as 0.
function multiDeleteBool(v) {
  const limit = V.isNumeric(v) ? V.toNumber(v) : 0;
  if (limit !== 0 && limit !== 1) throw err(9, `The limit field in delete objects must be 0 or 1. Got ${limit}`);
}

// aggregate's pipeline (parsePipelineFromBSON).
function pipeline(v) {
  if (!Array.isArray(v)) throw err(14, 'A pipeline must be an array of objects');
  for (const st of v) if (!isObject(st)) throw err(14, 'Each element of the \'pipeline\' array must be an object');
}

// aggregate's explain (parseExplainModeFromBSON).
function explainFlag(v) {
  if (typeof v !== 'boolean') throw err(14, 'explain must be a boolean');
}

// count's limit and skip (count_request.cpp).
function countLimit(v, path, name) {
  if (!V.isNumeric(v)) throw err(2, `${name} value is not a valid number`);
}
function countSkip(v, path, name) {
  if (!V.isNumeric(v)) throw err(2, `${name} value is not a valid number`);
  if (V.toNumber(v) < 0) throw err(2, `${name} value is negative in count query`);
}

// maxTimeMS (max_time_ms_parser.cpp, parseMaxTimeMS): find's and count's field, and the
// generic argument of every other command but getMore.
const INT_MAX = 2147483647;
function maxTimeMS(v, path, name) {
  if (!V.isNumeric(v)) throw err(2, `${name} must be a number`);
  const n = V.toNumber(v);
  const whole = Math.trunc(n);
  if (!(whole >= 0) || whole > INT_MAX) throw err(2, `${name} is out of range`);
  if (V.bsonTag(v) === 'double' && Math.floor(n) !== n) throw err(2, `${name} has non-integral value`);
}

// SaslPayload (sasl_payload.cpp): base64 text or binary data.
function saslPayload(v, path) {
  if (typeof v !== 'string' && V.bsonTag(v) !== 'binData') throw wrongType(path, v, ['string', 'binData']);
}

// CommitQuorum (commit_quorum.idl): a number of members or a mode name.
function commitQuorum(v) {
  if (!V.isNumeric(v) && typeof v !== 'string') throw err(9, 'commitQuorum has to be a number or a string');
}

// create's clusteredIndex: variant [safeBool, ClusteredIndexSpec].
function clusteredIndex(v, path, name, ctx, raw) {
  if (V.isNumeric(v) || typeof v === 'boolean') return;
  if (!isObject(v)) throw wrongType(path, v, ['bool', ...NUMBERS, 'object']);
  parseStruct(ClusteredIndexSpec, v, ctx.concat(name), {}, raw);
}

// dropIndexes' index: a name, names, or a key pattern.
function indexNames(v, path) {
  if (Array.isArray(v)) {
    v.forEach((x, i) => { if (typeof x !== 'string') throw wrongType(`${path}.${i}`, x, ['string']); });
    return;
  }
  if (typeof v !== 'string' && !isObject(v)) throw wrongType(path, v, ['string', 'object']);
}

// collMod's expireAfterSeconds: variant [string, safeInt64].
function stringOrNumber(v, path) {
  if (typeof v !== 'string' && !V.isNumeric(v)) throw wrongType(path, v, ['string', ...NUMBERS]);
}

// renameCollection's dropTarget: variant [bool, uuid].
function boolOrUuid(v, path) {
  if (typeof v !== 'boolean' && V.bsonTag(v) !== 'binData') throw wrongType(path, v, ['bool', 'binData']);
}

// hello's saslSupportedMechs: variant [string, object_owned].
function stringOrObject(v, path) {
  if (!isNull(v) && typeof v !== 'string' && !isObject(v)) throw wrongType(path, v, ['string', 'object']);
}

// A field mongod reads with a deserializer that accepts anything (or the command itself does).
function anything() {}

// ---- the walker ----

// A field spec: an IDL type name ('object', 'safeInt64', ...), or {t, req, struct, arrayOf,
// enum, min, custom, ignore}: `struct` a nested struct (type object), `arrayOf` an array whose
// elements are that struct or IDL type, `custom` a deserializer of an `any` type,
// `min` the validator {gte: N} (51024), `ignore` an IDL field marked ignore: true.
function spec(s) { return typeof s === 'string' ? { t: s } : s; }

function typesOf(s) {
  if (s.struct) return ['object'];
  if (s.arrayOf) return ['array'];
  return TYPES[s.t] || [s.t];
}

function checkType(v, types, path, t) {
  const tag = V.bsonTag(v);
  if (!types.includes(tag)) throw wrongType(path, v, types);
  if (t === 'uuid' && tag === 'binData') {
    const sub = v.sub_type !== undefined ? v.sub_type : 0;
    if (sub !== 4) {
      throw err(14, `BSON field '${path}' is the wrong binData type '${BINDATA_NAMES[sub] || sub}', expected type 'UUID'`);
    }
  }
}

// Checks one declared field (raw: its value's BSON, when known); returns true when it counts
// as given.
function checkField(s, v, ctx, name, raw) {
  const path = ctx.concat(name).join('.');
  if (s.ignore) return true;
  if (s.custom) {
    s.custom(v, path, name, ctx, raw);
    return true;
  }
  if (isNull(v)) return false;
  checkType(v, typesOf(s), path, s.t);
  if (s.struct) parseStruct(s.struct, v, ctx.concat(name), {}, raw);
  if (s.arrayOf) {
    const el = typeof s.arrayOf === 'string' ? { t: s.arrayOf } : null;
    const elements = el ? null : rawView(raw);
    v.forEach((x, i) => {
      if (isNull(x)) return;
      if (el) {
        checkType(x, typesOf(el), `${path}.${i}`, el.t);
      } else {
        checkType(x, ['object'], `${path}.${i}`);
        // An element from a document sequence (OP_MSG kind 1) was received on its own.
        parseStruct(s.arrayOf, x, ctx.concat(name), {}, x[V.RAW] || (elements && elements.child(i)));
      }
    });
  }
  if (s.enum && !s.enum.includes(v)) {
    throw err(2, `Enumeration value '${v}' for field '${path}' is not a valid value.`);
  }
  if (s.min !== undefined && V.toNumber(v) < s.min) {
    throw err(51024, `BSON field '${name}' value must be >= ${s.min}, actual value '${V.toNumber(v)}'`);
  }
  return true;
}

// The generic arguments (generic_argument.idl), accepted by every command.
const GENERIC = new Set(['apiVersion', 'apiStrict', 'apiDeprecationErrors', '$db', 'maxTimeMS', 'readConcern',
  'writeConcern', 'lsid', 'clientOperationKey', 'txnNumber', 'autocommit', 'startTransaction', 'stmtId', 'comment',
  '$readPreference', '$clusterTime', '$audit', '$client', '$configServerState', 'allowImplicitCollectionCreation',
  '$oplogQueryData', '$queryOptions', '$replData', 'databaseVersion', 'shardVersion', 'tracking_info', 'coordinator',
  'maxTimeMSOpOnly', '$configTime', '$topologyTime', 'txnRetryCounter', 'mayBypassWriteBlocking', '$tenant',
  'expectPrefix']);
// Fields meant for mongocryptd (isMongocryptdArgument): their own message.
const MONGOCRYPTD = new Set(['jsonSchema', 'isRemoteSchema']);

// The names of a received document as its BSON gives them (bson keeps one property of a name
// given twice): the repeated ones, and the BSON of a field's value, for the parts of a command
// the parser walks. Nothing is read for the documents it does not walk (a statement's filter,
// an inserted document).
function rawView(raw) {
  if (!raw) return null;
  const els = BSON.onDemand.parseToElements(raw.bytes, raw.off);
  const seen = new Set();
  const dups = [];
  const last = new Map();
  for (const e of els) {
    const n = raw.bytes.toString('utf8', e[1], e[1] + e[2]);
    if (seen.has(n) && !dups.includes(n)) dups.push(n);
    seen.add(n);
    last.set(n, e); // bson keeps the last value of a name given twice
  }
  return {
    dups,
    child(n) {
      const e = last.get(String(n));
      return e && (e[0] === 3 || e[0] === 4) ? { bytes: raw.bytes, off: e[3] } : null;
    },
  };
}

// The BSON of obj[path[0]][path[1]]..., when obj was received (a command body).
function rawAt(obj, path) {
  let raw = obj && obj[V.RAW];
  for (const k of path) {
    const view = rawView(raw);
    raw = view && view.child(k);
  }
  return raw || null;
}

// Applies struct S to object obj under context ctx (an array of names). opts.command: obj is
// a command (its first element is the command itself, generic arguments are accepted). raw:
// obj's BSON when it was received, to refuse a name given twice (40413).
function parseStruct(S, obj, ctx, opts = {}, raw = obj[V.RAW]) {
  const view = rawView(raw);
  const dups = view && view.dups.length ? view.dups : null;
  const given = new Set();
  const names = V.keys(obj);
  for (let i = 0; i < names.length; i++) {
    const name = names[i];
    if (opts.command && i === 0 && !S.firstIsField) continue;
    const path = ctx.concat(name).join('.');
    // A non-strict struct notices any name given twice; a strict one its own fields (below).
    if (!S.strict && dups && dups.includes(name)) throw err(40413, `BSON field '${path}' is a duplicate field`);
    const s = Object.prototype.hasOwnProperty.call(S.fields, name) ? spec(S.fields[name]) : null;
    if (s) {
      if (checkField(s, obj[name], ctx, name, view && view.child(name))) {
        if (S.strict && dups && dups.includes(name)) throw err(40413, `BSON field '${path}' is a duplicate field`);
        given.add(name);
      }
      continue;
    }
    if (opts.command && GENERIC.has(name)) continue;
    if (S.strict) {
      if (MONGOCRYPTD.has(name)) {
        throw err(4662500, `BSON field '${path}' is an unknown field. This command may be meant for a mongocryptd process.`);
      }
      throw err(40415, `BSON field '${path}' is an unknown field.`);
    }
  }
  for (const name of Object.keys(S.fields)) {
    if (spec(S.fields[name]).req && !given.has(name)) {
      throw err(40414, `BSON field '${ctx.concat(name).join('.')}' is missing but a required field`);
    }
  }
}

// ---- the structs ----

const struct = (name, strict, fields) => ({ name, strict, fields });
const req = (s) => Object.assign({}, spec(s), { req: true });

// basic_types.idl
const SimpleCursorOptions = struct('SimpleCursorOptions', true, { batchSize: { t: 'safeInt64', min: 0 } });

// logical_session_id.idl
const LogicalSessionFromClient = struct('LogicalSessionFromClient', true, { id: req('uuid'), uid: 'sha256Block' });
const OperationSessionInfoFromClient = struct('OperationSessionInfoFromClient', false, {
  lsid: { struct: LogicalSessionFromClient }, txnNumber: 'long', txnRetryCounter: 'int', autocommit: 'bool',
  startTransaction: 'bool', coordinator: 'bool',
});

// write_ops.idl
const WRITE_COMMAND_BASE = {
  bypassDocumentValidation: 'safeBool', ordered: 'bool', stmtId: 'int', stmtIds: { arrayOf: 'int' },
  isTimeseriesNamespace: { custom: optionalBool }, collectionUUID: 'uuid', encryptionInformation: 'object',
  $_originalQuery: 'object', $_originalCollation: 'object',
};
const UpdateOpEntry = struct('UpdateOpEntry', true, {
  q: req('object'), u: req({ custom: updateModification }), c: 'object', arrayFilters: { arrayOf: 'object' },
  hint: { custom: indexHint }, multi: 'bool', upsert: 'bool', upsertSupplied: { custom: optionalBool },
  collation: 'object', sampleId: 'uuid', $_allowShardKeyUpdatesWithoutFullShardKeyInQuery: { custom: optionalBool },
});
const DeleteOpEntry = struct('DeleteOpEntry', true, {
  q: req('object'), limit: req({ custom: multiDeleteBool }), hint: { custom: indexHint }, collation: 'object',
  sampleId: 'uuid',
});
const InsertCommandRequest = struct('InsertCommandRequest', true, Object.assign({
  documents: req({ arrayOf: 'object' }),
}, WRITE_COMMAND_BASE));
const UpdateCommandRequest = struct('UpdateCommandRequest', true, Object.assign({
  updates: req({ arrayOf: UpdateOpEntry }), let: 'object', runtimeConstants: 'object',
}, WRITE_COMMAND_BASE));
const DeleteCommandRequest = struct('DeleteCommandRequest', true, Object.assign({
  deletes: req({ arrayOf: DeleteOpEntry }), let: 'object', runtimeConstants: 'object',
}, WRITE_COMMAND_BASE));
const FindAndModifyCommandRequest = struct('FindAndModifyCommandRequest', true, {
  query: 'object', fields: 'object', sort: 'object', batchSize: 'int', singleBatch: 'bool', hint: { custom: indexHint },
  collation: 'object', arrayFilters: { arrayOf: 'object' }, remove: 'safeBool', update: { custom: updateModification },
  upsert: 'safeBool', new: 'safeBool', stmtId: 'int', bypassDocumentValidation: 'safeBool', let: 'object',
  runtimeConstants: 'object', encryptionInformation: 'object', sampleId: 'uuid', $_originalQuery: 'object',
  $_originalCollation: 'object', $_allowShardKeyUpdatesWithoutFullShardKeyInQuery: { custom: optionalBool },
});

// find_command.idl
const FindCommandRequest = struct('FindCommandRequest', true, {
  filter: { custom: ownedObject }, projection: { custom: ownedObject }, sort: { custom: ownedObject },
  hint: { custom: indexHint }, collation: { custom: ownedObject }, skip: { t: 'safeInt64', min: 0 },
  limit: { t: 'safeInt64', min: 0 }, batchSize: { t: 'safeInt64', min: 0 }, ntoreturn: { t: 'safeInt64', min: 0 },
  singleBatch: { custom: optionalBool }, allowDiskUse: { custom: optionalBool }, min: { custom: ownedObject },
  max: { custom: ownedObject }, returnKey: { custom: optionalBool }, showRecordId: { custom: optionalBool },
  $queryOptions: { custom: ownedObject }, tailable: { custom: optionalBool }, oplogReplay: { custom: parseBoolean },
  noCursorTimeout: { custom: optionalBool }, awaitData: { custom: optionalBool },
  allowPartialResults: { custom: optionalBool }, let: 'object', options: 'object', term: 'safeInt64',
  readOnce: { custom: optionalBool }, allowSpeculativeMajorityRead: { custom: optionalBool },
  $_requestResumeToken: { custom: optionalBool }, $_resumeAfter: { custom: ownedObject },
  maxTimeMS: { custom: maxTimeMS }, readConcern: 'object', runtimeConstants: 'object', collectionUUID: 'uuid',
});

// getmore_command.idl
const GetMoreCommandRequest = struct('GetMoreCommandRequest', true, {
  collection: req('string'), batchSize: 'safeInt64', maxTimeMS: 'safeInt64', term: 'long',
  lastKnownCommittedOpTime: 'object',
});

// aggregate_command.idl
function aggregateCursor(v, path, name, ctx, raw) {
  if (!isObject(v)) throw err(14, 'cursor field must be missing or an object');
  parseStruct(SimpleCursorOptions, v, [name], {}, raw);
}
const AggregateCommandRequest = struct('AggregateCommandRequest', true, {
  pipeline: req({ custom: pipeline }), explain: { custom: explainFlag }, allowDiskUse: { custom: optionalBool },
  cursor: { custom: aggregateCursor }, maxTimeMS: { t: 'safeInt64', min: 0 }, bypassDocumentValidation: 'safeBool',
  readConcern: 'object', collation: 'object', hint: { custom: indexHint }, writeConcern: 'object', let: 'object',
  needsMerge: { custom: optionalBool }, fromMongos: { custom: optionalBool }, $queryOptions: 'object',
  $_requestReshardingResumeToken: { custom: optionalBool }, exchange: 'object', runtimeConstants: 'object',
  isMapReduceCommand: { custom: optionalBool }, collectionUUID: 'uuid', $_passthroughToShard: 'object',
  encryptionInformation: 'object', $_externalDataSources: 'array', sampleId: 'uuid', stmtId: 'int',
  $_isClusterQueryWithoutShardKeyCmd: { custom: optionalBool },
});

// count_command.idl
const CountCommandRequest = struct('CountCommandRequest', true, {
  query: 'object', limit: { custom: countLimit }, skip: { custom: countSkip }, hint: { custom: indexHint },
  collation: 'object', fields: { ignore: true }, readConcern: 'object', maxTimeMS: { custom: maxTimeMS },
  $queryOptions: 'object', encryptionInformation: 'object',
});

// distinct_command.idl
const DistinctCommandRequest = struct('DistinctCommandRequest', true, {
  key: req('string'), query: 'object', collation: 'object', sampleId: 'uuid',
});

// kill_cursors.idl
const KillCursorsCommandRequest = struct('KillCursorsCommandRequest', true, { cursors: req({ arrayOf: 'long' }) });

// commands/create.idl and the structs it imports
const ClusteredIndexSpec = struct('ClusteredIndexSpec', true, {
  v: 'safeInt', key: req('object'), name: 'string', unique: req('safeBool'),
});
const TimeseriesOptions = struct('TimeseriesOptions', true, {
  timeField: req('string'), metaField: 'string', granularity: { t: 'string', enum: ['seconds', 'minutes', 'hours'] },
  bucketMaxSpanSeconds: 'safeInt', bucketRoundingSeconds: 'safeInt',
});
const ChangeStreamPreAndPostImagesOptions = struct('ChangeStreamPreAndPostImagesOptions', true, { enabled: req('bool') });
const VALIDATION_LEVEL = { t: 'string', enum: ['off', 'strict', 'moderate'] };
const VALIDATION_ACTION = { t: 'string', enum: ['warn', 'error'] };
const CreateCommand = struct('CreateCommand', true, {
  capped: 'safeBool', autoIndexId: 'safeBool', idIndex: 'object', size: 'safeInt64', max: 'safeInt64',
  storageEngine: 'object', validator: 'object', validationLevel: VALIDATION_LEVEL,
  validationAction: VALIDATION_ACTION, indexOptionDefaults: 'object', viewOn: 'string', pipeline: { arrayOf: 'object' },
  collation: 'object', recordPreImages: 'safeBool', changeStreamPreAndPostImages: { struct: ChangeStreamPreAndPostImagesOptions },
  timeseries: { struct: TimeseriesOptions }, clusteredIndex: { custom: clusteredIndex }, expireAfterSeconds: 'safeInt64',
  encryptedFields: 'object', temp: 'safeBool', flags: 'safeInt64',
});

// create_indexes.idl: the index specifications are array<object> there, checked afterwards by
// index_key_validate::validateIndexSpec against NewIndexSpec's fields (indexSpecs below).
const NEW_INDEX_SPEC_FIELDS = new Set(['v', 'key', 'name', 'ns', 'background', 'unique', 'hidden',
  'partialFilterExpression', 'sparse', 'expireAfterSeconds', 'storageEngine', 'weights', 'default_language',
  'language_override', 'textIndexVersion', '2dsphereIndexVersion', 'bits', 'min', 'max', 'bucketSize', 'collation',
  'wildcardProjection', 'columnstoreProjection', 'columnstoreCompressor', 'coarsestIndexedLevel', 'finestIndexedLevel',
  'dropDups', 'originalSpec', 'clustered', 'prepareUnique']);
const CreateIndexesCommand = struct('CreateIndexesCommand', true, {
  v: 'safeInt', indexes: req({ arrayOf: 'object' }), ignoreUnknownIndexOptions: 'safeBool',
  commitQuorum: { custom: commitQuorum }, returnOnStart: { custom: optionalBool }, isTimeseriesNamespace: 'bool',
  collectionUUID: 'uuid',
});

// The index specifications of a createIndexes (validateIndexSpec), each error prefixed with
// the specification as createIndexes reports it.
function indexSpecs(body) {
  const ignoreUnknown = V.truthy(body.ignoreUnknownIndexOptions);
  for (const s of body.indexes) {
    if (!isObject(s)) continue;
    const fail = (code, msg) => err(code, `Error in specification ${V.showBson(s)} :: caused by :: ${msg}`);
    for (const k of V.keys(s)) {
      if (!NEW_INDEX_SPEC_FIELDS.has(k) && !ignoreUnknown) {
        throw fail(197, `The field '${k}' is not valid for an index specification. Specification: ${V.showBson(s)}`);
      }
    }
    if (s.key === undefined) throw fail(9, "The 'key' field is a required property of an index specification");
    if (!isObject(s.key)) throw fail(14, `The field 'key' must be an object, but got ${typeName(s.key)}`);
    if (s.name === undefined) throw fail(9, "The 'name' field is a required property of an index specification");
    if (typeof s.name !== 'string') throw fail(14, `The field 'name' must be a string, but got ${typeName(s.name)}`);
  }
}

// list_indexes.idl, list_collections.idl, commands/list_databases.idl
const ListIndexes = struct('listIndexes', true, {
  cursor: { struct: SimpleCursorOptions }, includeBuildUUIDs: 'safeBool', includeIndexBuildInfo: 'safeBool',
  isTimeseriesNamespace: 'bool',
});
const ListCollections = struct('listCollections', true, {
  cursor: { struct: SimpleCursorOptions }, filter: 'object', nameOnly: 'bool', authorizedCollections: 'bool',
  includePendingDrops: 'safeBool',
});
const ListDatabasesCommand = struct('ListDatabasesCommand', true, {
  nameOnly: 'safeBool', authorizedDatabases: 'bool', filter: 'object',
});

// drop_indexes.idl, drop.idl, drop_database.idl
const DropIndexes = struct('DropIndexes', true, {
  index: req({ custom: indexNames }), collectionUUID: 'uuid', isTimeseriesNamespace: 'bool',
});
const Drop = struct('Drop', true, { collectionUUID: 'uuid' });
const DropDatabase = struct('DropDatabase', true, {});

// coll_mod.idl
const CollModIndex = struct('CollModIndex', true, {
  name: 'string', keyPattern: 'object', expireAfterSeconds: 'safeInt', hidden: 'safeBool', unique: 'safeBool',
  prepareUnique: 'safeBool', forceNonUnique: 'safeBool',
});
const CollModRequest = struct('CollModRequest', true, {
  index: { struct: CollModIndex }, validator: 'object', validationLevel: VALIDATION_LEVEL,
  validationAction: VALIDATION_ACTION, viewOn: 'string', pipeline: { arrayOf: 'object' }, recordPreImages: 'safeBool',
  changeStreamPreAndPostImages: { struct: ChangeStreamPreAndPostImagesOptions },
  expireAfterSeconds: { custom: stringOrNumber }, timeseries: 'object', isTimeseriesNamespace: 'bool',
  dryRun: 'safeBool', cappedSize: 'safeInt64', cappedMax: 'safeInt64', collectionUUID: 'uuid',
});

// commands/rename_collection.idl
const RenameCollectionCommand = struct('RenameCollectionCommand', true, {
  to: req('string'), dropTarget: { custom: boolOrUuid }, stayTemp: 'bool', collectionUUID: 'uuid',
  expectedSourceUUID: 'uuid', expectedTargetUUID: 'uuid',
});

// commands/txn_cmds.idl
const CommitTransaction = struct('CommitTransaction', true, { commitTimestamp: 'timestamp', recoveryToken: 'object' });
const AbortTransaction = struct('AbortTransaction', true, { recoveryToken: 'object' });

// commands/end_sessions.idl, sessions_commands.idl, kill_sessions.idl: the command's own
// field is the list of sessions.
const EndSessionsCmdFromClient = Object.assign(struct('EndSessionsCmdFromClient', false, {
  endSessions: req({ arrayOf: LogicalSessionFromClient }),
}), { firstIsField: true });
const RefreshSessionsCmdFromClient = Object.assign(struct('RefreshSessionsCmdFromClient', false, {
  refreshSessions: req({ arrayOf: LogicalSessionFromClient }),
}), { firstIsField: true });
const KillSessionsCmdFromClient = Object.assign(struct('KillSessionsCmdFromClient', false, {
  killSessions: req({ arrayOf: LogicalSessionFromClient }),
}), { firstIsField: true });

// repl/hello.idl, rpc/topology_version.idl
const TopologyVersion = struct('TopologyVersion', true, { processId: req('objectid'), counter: req('long') });
const HelloInternalClientField = struct('HelloInternalClientField', true, {
  minWireVersion: 'safeInt', maxWireVersion: req('safeInt'),
});
// hello is the one API version 1 command that is not strict (unknown fields are ignored):
// drivers add handshake fields (the Node.js driver's `backpressure`) that older servers
// must accept.
const HelloCommand = struct('HelloCommand', false, {
  forShell: 'safeBool', hostInfo: 'string', hangUpOnStepDown: 'safeBool',
  internalClient: { struct: HelloInternalClientField }, client: 'object', topologyVersion: { struct: TopologyVersion },
  maxAwaitTimeMS: { t: 'safeInt64', min: 0 }, helloOk: 'safeBool', compression: { arrayOf: 'string' },
  saslSupportedMechs: { custom: stringOrObject }, speculativeAuthenticate: 'object', loadBalanced: 'bool',
});

// auth/sasl_commands.idl, commands/authentication_commands.idl
const SaslStartCommand = struct('SaslStartCommand', true, {
  mechanism: req('string'), autoAuthorize: 'safeBool', options: 'object', payload: req({ custom: saslPayload }),
});
const SaslContinueCommand = struct('SaslContinueCommand', true, {
  conversationId: req('int'), payload: req({ custom: saslPayload }),
});
const AuthenticateCommand = struct('AuthenticateCommand', true, { mechanism: req('string'), user: 'string' });

// commands/query_cmd/explain.idl
const ExplainCommandRequest = struct('ExplainCommandRequest', true, {
  verbosity: { t: 'string', enum: ['queryPlanner', 'executionStats', 'allPlansExecution'] }, collectionUUID: 'uuid',
});

// commands/map_reduce.idl: out is `any` there (mapreduce.js reads it).
const MapReduceCommandRequest = struct('MapReduceCommandRequest', true, {
  map: req('mapReduceCode'), reduce: req('mapReduceCode'), out: req({ custom: anything }),
  query: 'object', sort: 'object', collation: 'object', limit: 'safeInt64', finalize: 'mapReduceCode',
  scope: 'object', jsMode: 'safeBool', verbose: 'safeBool', bypassDocumentValidation: 'safeBool',
  readConcern: 'object', $queryOptions: 'object',
});

// pipeline/document_source_change_stream.idl: the $changeStream stage's argument, parsed with
// the pipeline (changestreams.js calls parseStruct with it).
const DocumentSourceChangeStreamSpec = struct('DocumentSourceChangeStreamSpec', true, {
  resumeAfter: 'object', startAfter: 'object', startAtOperationTime: 'timestamp',
  fullDocument: { t: 'string', enum: ['default', 'updateLookup', 'whenAvailable', 'required'] },
  fullDocumentBeforeChange: { t: 'string', enum: ['off', 'whenAvailable', 'required'] },
  allChangesForCluster: 'bool', showMigrationEvents: 'bool', showSystemEvents: 'bool', allowToRunOnConfigDB: 'bool',
  allowToRunOnSystemNS: 'bool', showExpandedEvents: 'bool', showRawUpdateDescription: 'bool',
});

// ---- the commands ----

// name -> {ctx: the IDLParserContext name its parser uses, struct, first: check of the
// command's own value, then: checks of its parsed contents that mongod makes as it parses,
// idl: where the struct is (README)}.
const COMMANDS = {};
function command(names, ctx, S, idl, extra = {}) {
  for (const n of names) COMMANDS[n] = Object.assign({ ctx, struct: S, idl }, extra);
}
command(['insert'], 'insert', InsertCommandRequest, 'db/query/write_ops/write_ops.idl InsertCommandRequest');
command(['update'], 'update', UpdateCommandRequest, 'db/query/write_ops/write_ops.idl UpdateCommandRequest, UpdateOpEntry');
command(['delete'], 'delete', DeleteCommandRequest, 'db/query/write_ops/write_ops.idl DeleteCommandRequest, DeleteOpEntry');
command(['findAndModify', 'findandmodify'], 'findAndModify', FindAndModifyCommandRequest,
  'db/query/write_ops/write_ops.idl FindAndModifyCommandRequest');
command(['find'], 'FindCommandRequest', FindCommandRequest, 'db/query/find_command.idl FindCommandRequest');
command(['getMore'], 'getMore', GetMoreCommandRequest, 'db/query/getmore_command.idl GetMoreCommandRequest', {
  // namespace: type, type: long (checked after the fields, as the generated parser does).
  first: (v) => { if (!isNull(v)) checkType(v, ['long'], 'getMore.getMore'); },
});
command(['aggregate'], 'aggregate', AggregateCommandRequest, 'db/pipeline/aggregate_command.idl AggregateCommandRequest');
command(['count'], 'count', CountCommandRequest, 'db/query/count_command.idl CountCommandRequest');
command(['distinct'], 'distinct', DistinctCommandRequest, 'db/query/distinct_command.idl DistinctCommandRequest');
command(['killCursors'], 'killCursors', KillCursorsCommandRequest, 'db/query/kill_cursors.idl KillCursorsCommandRequest');
command(['create'], 'create', CreateCommand, 'db/commands/create.idl CreateCommand (timeseries.idl, clustered_collection_options.idl)');
command(['createIndexes'], 'createIndexes', CreateIndexesCommand, 'db/create_indexes.idl CreateIndexesCommand, NewIndexSpec', {
  then: indexSpecs,
});
command(['listIndexes'], 'listIndexes', ListIndexes, 'db/list_indexes.idl listIndexes');
command(['listCollections'], 'listCollections', ListCollections, 'db/list_collections.idl listCollections');
command(['listDatabases'], 'listDatabases', ListDatabasesCommand, 'db/commands/list_databases.idl ListDatabasesCommand');
command(['dropIndexes', 'deleteIndexes'], 'dropIndexes', DropIndexes, 'db/drop_indexes.idl DropIndexes');
command(['drop'], 'drop', Drop, 'db/drop.idl Drop');
command(['dropDatabase'], 'dropDatabase', DropDatabase, 'db/drop_database.idl DropDatabase');
command(['collMod'], 'collMod', CollModRequest, 'db/coll_mod.idl collMod, CollModRequest, CollModIndex');
command(['renameCollection'], 'renameCollection', RenameCollectionCommand, 'db/commands/rename_collection.idl RenameCollectionCommand');
command(['commitTransaction'], 'commitTransaction', CommitTransaction, 'db/commands/txn_cmds.idl commitTransaction');
command(['abortTransaction'], 'abortTransaction', AbortTransaction, 'db/commands/txn_cmds.idl abortTransaction');
command(['endSessions'], 'EndSessionsCmdFromClient', EndSessionsCmdFromClient,
  'db/commands/end_sessions.idl EndSessionsCmdFromClient, LogicalSessionFromClient');
command(['refreshSessions'], 'RefreshSessionsCmdFromClient', RefreshSessionsCmdFromClient,
  'db/commands/sessions_commands.idl RefreshSessionsCmdFromClient');
command(['killSessions'], 'KillSessionsCmdFromClient', KillSessionsCmdFromClient, 'db/kill_sessions.idl KillSessionsCmdFromClient');
command(['hello', 'isMaster', 'ismaster'], 'hello', HelloCommand, 'db/repl/hello.idl HelloCommand (TopologyVersion)');
command(['saslStart'], 'saslStart', SaslStartCommand, 'db/auth/sasl_commands.idl SaslStartCommand');
command(['saslContinue'], 'saslContinue', SaslContinueCommand, 'db/auth/sasl_commands.idl SaslContinueCommand');
command(['authenticate'], 'authenticate', AuthenticateCommand, 'db/commands/authentication_commands.idl AuthenticateCommand');
command(['explain'], 'explain', ExplainCommandRequest, 'db/commands/query_cmd/explain.idl ExplainCommandRequest');
command(['mapReduce', 'mapreduce'], 'MapReduceCommandRequest', MapReduceCommandRequest,
  'db/commands/map_reduce.idl MapReduceCommandRequest');

// ---- the generic arguments' own parsers ----

// WriteConcernOptions::extractWCFromCommand and the WriteConcernIdl struct
// (write_concern_options.idl).
function writeConcernW(v) {
  if (V.isNumeric(v)) {
    const n = V.toNumber(v);
    if (n < 0 || n > 50) throw err(9, `w has to be a non-negative number and not greater than 50; found: ${n}`);
    return;
  }
  if (typeof v === 'string' || isObject(v) || isNull(v)) return;
  throw err(9, 'w has to be a number, string, or object');
}
function wTimeout(v) {
  if (!isNull(v) && !V.isNumeric(v)) throw err(9, 'wtimeout must be a number');
}
const WriteConcernIdl = struct('WriteConcernIdl', true, {
  w: { custom: writeConcernW }, j: 'safeBool', wtimeout: { custom: wTimeout }, fsync: 'safeBool',
  wElectionId: { ignore: true }, wOpTime: { ignore: true }, getLastError: { ignore: true }, provenance: 'string',
});
function writeConcern(v) {
  if (!isObject(v)) throw err(9, 'writeConcern must be an object');
  if (!V.keys(v).length) return; // empty: the default write concern
  parseStruct(WriteConcernIdl, v, ['WriteConcernOptions']);
}

// ReadConcernArgs::initialize (repl/read_concern_args.cpp), a hand-written parser.
const READ_CONCERN_LEVELS = ['local', 'majority', 'linearizable', 'available', 'snapshot'];
function readConcern(v) {
  if (!isObject(v)) throw err(9, 'readConcern field should be an object');
  const typed = (name, want) => {
    const tag = V.bsonTag(v[name]);
    if (tag !== want) throw err(14, `"${name}" had the wrong type. Expected ${want}, found ${typeName(v[name])}`);
  };
  for (const name of V.keys(v)) {
    if (name === 'level') {
      typed(name, 'string');
      if (!READ_CONCERN_LEVELS.includes(v.level)) {
        throw err(9, "readConcern.level must be either 'local', 'majority', 'linearizable', 'available', or 'snapshot'");
      }
    } else if (name === 'afterClusterTime' || name === 'atClusterTime') typed(name, 'timestamp');
    else if (name === 'afterOpTime') typed(name, 'object');
    else if (name === 'allowTransactionTableSnapshot') typed(name, 'bool');
    else if (name !== 'provenance') throw err(72, `Unrecognized option in readConcern: ${name}`);
  }
  const level = v.level === undefined ? 'local' : v.level;
  if (v.afterClusterTime !== undefined && v.afterOpTime !== undefined) {
    throw err(72, 'Can not specify both afterClusterTime and afterOpTime');
  }
  if (v.afterClusterTime !== undefined && v.atClusterTime !== undefined) {
    throw err(72, 'Specifying a timestamp for readConcern snapshot in a causally consistent session is not allowed. ' +
      'See https://docs.mongodb.com/manual/core/read-isolation-consistency-recency/#causal-consistency');
  }
  if (v.afterClusterTime !== undefined && !['majority', 'local', 'snapshot'].includes(level)) {
    throw err(72, 'afterClusterTime field can be set only if level is equal to majority, local, or snapshot');
  }
  if (v.atClusterTime !== undefined && level !== 'snapshot') {
    throw err(72, 'atClusterTime field can be set only if level is equal to snapshot');
  }
}

// The session fields (initializeOperationSessionInfo: OperationSessionInfoFromClient, a
// non-strict struct, parsed from the whole command). Not for the handshake commands.
const NO_SESSION_PARSE = new Set(['hello', 'isMaster', 'ismaster', 'saslStart', 'saslContinue', 'authenticate']);

// Parses `body`, the command `name`, as mongod does before it runs anything of it; throws the
// MongoError mongod would answer with.
function parseCommand(body, name) {
  const c = COMMANDS[name];
  if (c) {
    parseStruct(c.struct, body, [c.ctx], { command: true });
    if (c.first) c.first(body[name]);
    if (c.then) c.then(body);
  }
  const has = (f) => Object.prototype.hasOwnProperty.call(body, f);
  // The generic arguments' own parsers (a struct that declares one of them only checked its
  // type). getMore's maxTimeMS is its own field, the wait of an awaitData cursor.
  if (has('maxTimeMS') && name !== 'getMore') maxTimeMS(body.maxTimeMS, 'maxTimeMS', 'maxTimeMS');
  if (has('writeConcern')) writeConcern(body.writeConcern);
  if (has('readConcern')) readConcern(body.readConcern);
  if (!NO_SESSION_PARSE.has(name)) parseStruct(OperationSessionInfoFromClient, body, ['OperationSessionInfo']);
}

module.exports = { parseCommand, parseStruct, rawAt, COMMANDS, GENERIC, DocumentSourceChangeStreamSpec, typeName };
