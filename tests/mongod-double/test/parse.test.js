'use strict';
// Command parsing (lib/parse.js): the double refuses what mongod 7.0's parsers refuse, with
// mongod's code and message, before anything of the command runs, and accepts the generic
// arguments on every command. The commands go out as raw OP_MSG (helpers.js), so their BSON
// types are exactly the ones written here, and a duplicate field can be put on the wire.

const test = require('node:test');
const assert = require('node:assert/strict');
const { BSON, Int32, Double, Timestamp, Binary } = require('bson');
const { startDouble, startSharded, rawConnect, lsid, L } = require('./helpers');
const { COMMANDS } = require('../lib/parse');

let d;
let c;
const DB = 'parse';
const num = (v) => (v === undefined || v === null ? v : Number(v));

test.before(async () => {
  d = await startDouble();
  c = await rawConnect(d.port);
});

test.after(async () => {
  c.close();
  assert.equal(await d.stop(), 0);
});

async function run(cmd, conn = c) {
  return conn.command(Object.assign({}, cmd, { $db: cmd.$db || DB }));
}

async function refused(cmd, code, errmsg, conn = c) {
  const r = await run(cmd, conn);
  assert.equal(num(r.ok), 0, `${JSON.stringify(cmd)} was accepted`);
  assert.equal(num(r.code), code, `${JSON.stringify(cmd)}: ${r.errmsg}`);
  if (errmsg !== undefined) assert.equal(r.errmsg, errmsg);
  return r;
}

async function accepted(cmd, conn = c) {
  const r = await run(cmd, conn);
  assert.equal(num(r.ok), 1, `${JSON.stringify(cmd)} refused: ${r.code} ${r.errmsg}`);
  return r;
}

async function docs(coll) {
  const r = await accepted({ find: coll, filter: {}, sort: { _id: 1 } });
  return r.cursor.firstBatch;
}

// The malformed commands of the tests below, each with mongod's answer.
const UPDATE = { q: { _id: 1 }, u: { $set: { a: 2 } } };
const MALFORMED = [
  // The lane take as it went to mongod before af344bd: maxTimeMS inside the statement.
  [{ update: 'c', updates: [{ q: {}, u: { $set: { a: 2 } }, maxTimeMS: new Int32(1000), multi: true }] },
    40415, "BSON field 'update.updates.maxTimeMS' is an unknown field."],
  [{ delete: 'c', deletes: [{ q: {}, limit: new Int32(0), maxTimeMS: new Int32(1000) }] },
    40415, "BSON field 'delete.deletes.maxTimeMS' is an unknown field."],
  [{ find: 'c', filter: {}, maxScan: new Int32(5) }, 40415, "BSON field 'FindCommandRequest.maxScan' is an unknown field."],
  [{ aggregate: 'c', pipeline: [], cursor: {}, batchSize: new Int32(5) }, 40415, "BSON field 'aggregate.batchSize' is an unknown field."],
  [{ findAndModify: 'c', query: {}, update: { $set: { a: 2 } }, multi: true }, 40415, "BSON field 'findAndModify.multi' is an unknown field."],
  [{ insert: 'c', documents: [{ _id: 9 }], upsert: true }, 40415, "BSON field 'insert.upsert' is an unknown field."],
  [{ insert: 'c', documents: { _id: 9 } }, 14, "BSON field 'insert.documents' is the wrong type 'object', expected type 'array'"],
  [{ insert: 'c', documents: [{ _id: 9 }, new Int32(3)] }, 14, "BSON field 'insert.documents.1' is the wrong type 'int', expected type 'object'"],
  [{ find: 'c', filter: '{_id: 1}' }, 14, 'Expected field filterto be of type object'],
  [{ update: 'c', updates: [{ q: { _id: 1 } }] }, 40414, "BSON field 'update.updates.u' is missing but a required field"],
  [{ delete: 'c', deletes: [{ q: { _id: 1 } }] }, 40414, "BSON field 'delete.deletes.limit' is missing but a required field"],
  [{ update: 'c', updates: [Object.assign({ multi: new Int32(1) }, UPDATE)] }, 14,
    "BSON field 'update.updates.multi' is the wrong type 'int', expected type 'bool'"],
  [{ insert: 'c', documents: [{ _id: 9 }], ordered: 'yes' }, 14, "BSON field 'insert.ordered' is the wrong type 'string', expected type 'bool'"],
  [{ dropIndexes: 'c', index: new Int32(5) }, 14, "BSON field 'dropIndexes.index' is the wrong type 'int', expected types '[string, object']"],
  [{ insert: 'c', documents: [{ _id: 9 }], writeConcern: { w: 'majority', wtimeoutMS: new Int32(10) } }, 40415,
    "BSON field 'WriteConcernOptions.wtimeoutMS' is an unknown field."],
  [{ find: 'c', readConcern: { level: 'local', afterClusterTime: new Int32(1) } }, 14,
    '"afterClusterTime" had the wrong type. Expected timestamp, found int'],
  [{ find: 'c', lsid: { id: new Binary(Buffer.alloc(16), 0) } }, 14,
    "BSON field 'OperationSessionInfo.lsid.id' is the wrong binData type 'general', expected type 'UUID'"],
  [{ find: 'c', lsid: {} }, 40414, "BSON field 'OperationSessionInfo.lsid.id' is missing but a required field"],
  [{ find: 'c', limit: L(-1) }, 51024, "BSON field 'limit' value must be >= 0, actual value '-1'"],
  [{ createIndexes: 'c', indexes: [{ key: { a: new Int32(1) }, name: 'a_1', unqiue: true }] }, 197,
    'Error in specification { key: { a: 1 }, name: "a_1", unqiue: true } :: caused by :: ' +
    'The field \'unqiue\' is not valid for an index specification. Specification: { key: { a: 1 }, name: "a_1", unqiue: true }'],
  [{ createIndexes: 'c', indexes: [{ key: { a: new Int32(1) } }] }, 9,
    "Error in specification { key: { a: 1 } } :: caused by :: The 'name' field is a required property of an index specification"],
];

test('the malformed commands get mongod\'s code and message, and have no effect', async () => {
  await accepted({ insert: 'c', documents: [{ _id: 1, a: new Int32(1) }, { _id: 2, a: new Int32(1) }] });
  await accepted({ createIndexes: 'c', indexes: [{ key: { a: new Int32(1) }, name: 'a_1' }] });
  const before = await docs('c');
  for (const [cmd, code, errmsg] of MALFORMED) await refused(cmd, code, errmsg);
  assert.deepEqual(await docs('c'), before, 'a refused command changed the collection');
  const indexes = await accepted({ listIndexes: 'c' });
  assert.deepEqual(indexes.cursor.firstBatch.map((i) => i.name), ['_id_', 'a_1']);
});

test('parsing comes first: a getMore with an unknown field is 40415 even for a cursor that does not exist', async () => {
  await refused({ getMore: L(424242), collection: 'c', maxAwaitTimeMS: new Int32(10) }, 40415,
    "BSON field 'getMore.maxAwaitTimeMS' is an unknown field.");
  // The same getMore, well formed: the cursor is looked up, and is not there.
  await refused({ getMore: L(424242), collection: 'c' }, 43);
  // Its collection is required, its cursor id a long.
  await refused({ getMore: L(424242) }, 40414, "BSON field 'getMore.collection' is missing but a required field");
  await refused({ getMore: new Int32(5), collection: 'c' }, 14, "BSON field 'getMore.getMore' is the wrong type 'int', expected type 'long'");
});

test('null counts as absent: an optional field is taken as not given, a required one as missing', async () => {
  await accepted({ find: 'c', batchSize: null, skip: null, comment: null });
  await accepted({ update: 'c', updates: [Object.assign({ multi: null, upsert: null, collation: null }, UPDATE)], ordered: null });
  await accepted({ delete: 'c', deletes: [{ q: { _id: 'none' }, limit: new Int32(1), collation: null }] });
  await refused({ update: 'c', updates: [{ q: null, u: { $set: { a: 2 } } }] }, 40414,
    "BSON field 'update.updates.q' is missing but a required field");
  // Types with a deserializer of their own see the null: find's filter, update's u.
  await refused({ find: 'c', filter: null }, 14, 'Expected field filterto be of type object');
  await refused({ update: 'c', updates: [{ q: {}, u: null }] }, 9, 'Update argument must be either an object or an array');
});

// The BSON of `doc` in which the document at `path` (names and indexes) gives its last name
// twice, the second time with `value`: as no driver writes it, but the wire allows.
function withDuplicate(doc, path, value) {
  const element = (name, v) => {
    const b = BSON.serialize({ [name]: v });
    return b.subarray(4, b.length - 1);
  };
  const documentOf = (elements) => {
    const out = Buffer.concat([Buffer.alloc(4), ...elements, Buffer.from([0])]);
    out.writeInt32LE(out.length, 0);
    return out;
  };
  const build = (v, rest) => {
    const names = Array.isArray(v) ? v.map((_, i) => String(i)) : Object.keys(v);
    const elements = names.map((n) => {
      if (rest.length > 1 && n === String(rest[0])) {
        const child = v[rest[0]];
        return Buffer.concat([Buffer.from([Array.isArray(child) ? 4 : 3]), Buffer.from(`${n}\0`), build(child, rest.slice(1))]);
      }
      return element(n, v[n]);
    });
    if (rest.length === 1) elements.push(element(rest[0], value));
    return documentOf(elements);
  };
  return build(doc, path);
}

// An OP_MSG of a body and document sequences ([{id, docs: [Buffer]}]) written as given.
async function rawCommand(body, sequences = []) {
  const h = Buffer.alloc(16);
  const parts = sequences.map((s) => {
    const id = Buffer.from(`${s.id}\0`);
    const size = Buffer.alloc(4);
    size.writeInt32LE(4 + id.length + s.docs.reduce((n, d) => n + d.length, 0));
    return Buffer.concat([Buffer.from([1]), size, id, ...s.docs]);
  });
  const msg = Buffer.concat([h, Buffer.alloc(4), Buffer.from([0]), body, ...parts]);
  msg.writeInt32LE(msg.length, 0);
  msg.writeInt32LE(777, 4);
  msg.writeInt32LE(2013, 12);
  c.send(msg);
  return (await c.next()).doc;
}

test('a field given twice is 40413, in the command and in a statement', async () => {
  let r = await rawCommand(withDuplicate({ insert: 'c', documents: [{ _id: 5 }], ordered: true, $db: DB }, ['ordered'], false));
  assert.equal(num(r.code), 40413, r.errmsg);
  assert.equal(r.errmsg, "BSON field 'insert.ordered' is a duplicate field");
  r = await rawCommand(withDuplicate({ update: 'c', $db: DB, updates: [{ q: { _id: 1 }, u: { $set: { a: 3 } } }] }, ['updates', 0, 'q'], { _id: 2 }));
  assert.equal(num(r.code), 40413, r.errmsg);
  assert.equal(r.errmsg, "BSON field 'update.updates.q' is a duplicate field");
  // A statement sent as a document sequence (how drivers send them) is read as received too.
  const st = withDuplicate({ q: { _id: 1 }, u: { $set: { a: 3 } } }, ['u'], { $set: { a: 4 } });
  r = await rawCommand(BSON.serialize({ update: 'c', $db: DB }), [{ id: 'updates', docs: [BSON.serialize({ q: { _id: 2 }, u: { $set: { a: 3 } } }), st] }]);
  assert.equal(num(r.code), 40413, r.errmsg);
  assert.equal(r.errmsg, "BSON field 'update.updates.u' is a duplicate field");
  // And an option of the $changeStream stage, parsed with the pipeline.
  r = await rawCommand(withDuplicate({ aggregate: 'c', $db: DB, pipeline: [{ $changeStream: { fullDocument: 'default' } }], cursor: {} },
    ['pipeline', 0, '$changeStream', 'fullDocument'], 'updateLookup'));
  assert.equal(num(r.code), 40413, r.errmsg);
  assert.equal(r.errmsg, "BSON field '$changeStream.fullDocument' is a duplicate field");
  assert.deepEqual((await docs('c')).filter((x) => x._id === 5 || num(x.a) === 3 || num(x.a) === 4), [], 'a refused command wrote');
});

// The generic arguments of generic_argument.idl that a client sends (the session fields, the
// read and write concerns, maxTimeMS, comment, the API parameters, $readPreference).
const session = lsid();
let txn = 0;
const generic = (extra = {}) => Object.assign({
  lsid: session, maxTimeMS: new Int32(5000), comment: 'generic', apiVersion: '1', apiDeprecationErrors: false,
  $readPreference: { mode: 'primary' },
}, extra);

test('the same commands, well formed, with the generic arguments', async () => {
  const wc = { writeConcern: { w: 'majority', j: true, wtimeout: new Int32(1000) } };
  const rc = { readConcern: { level: 'majority' } };
  const retryable = () => ({ txnNumber: L(++txn) });
  await accepted(Object.assign({ insert: 'g', documents: [{ _id: 1, a: new Int32(1) }, { _id: 2, a: new Int32(1) }], ordered: true }, generic(wc), retryable()));
  await accepted(Object.assign({ update: 'g', updates: [{ q: {}, u: { $set: { b: 1 } }, multi: true, upsert: false }] }, generic(wc)));
  await accepted(Object.assign({ update: 'g', updates: [{ q: { _id: 1 }, u: { $set: { c: 1 } } }] }, generic(wc), retryable()));
  await accepted(Object.assign({ findAndModify: 'g', query: { _id: 1 }, update: { $set: { d: 1 } }, new: true }, generic(wc), retryable()));
  const f = await accepted(Object.assign({ find: 'g', filter: {}, sort: { _id: 1 }, batchSize: new Int32(1) }, generic(rc)));
  await accepted(Object.assign({ getMore: f.cursor.id, collection: 'g', batchSize: new Int32(1) }, { lsid: session, comment: 'generic' }));
  await accepted(Object.assign({ aggregate: 'g', pipeline: [{ $match: {} }], cursor: { batchSize: new Int32(10) } }, generic(rc)));
  await accepted(Object.assign({ count: 'g', query: {} }, generic(rc)));
  await accepted(Object.assign({ distinct: 'g', key: 'a' }, generic(rc)));
  await accepted(Object.assign({ delete: 'g', deletes: [{ q: { _id: 2 }, limit: new Int32(1) }] }, generic(wc), retryable()));
  await accepted(Object.assign({ delete: 'g', deletes: [{ q: {}, limit: new Int32(0) }] }, generic(wc)));
  const h = await accepted({ hello: 1, helloOk: true, client: { application: { name: 'parse' } }, compression: [], $db: 'admin' });
  assert.equal(h.isWritablePrimary, true);
});

test('a transaction\'s statements carry autocommit and startTransaction', async () => {
  const n = L(++txn);
  const t = { lsid: session, txnNumber: n, autocommit: false };
  await accepted(Object.assign({ insert: 't', documents: [{ _id: 1 }], startTransaction: true, readConcern: { level: 'snapshot' } }, t));
  await accepted(Object.assign({ find: 't', filter: {} }, t));
  await accepted(Object.assign({ commitTransaction: 1, $db: 'admin', writeConcern: { w: 'majority' } }, t));
  await refused({ insert: 't', documents: [{ _id: 2 }], lsid: session, txnNumber: L(++txn), autocommit: 0, startTransaction: true }, 14,
    "BSON field 'OperationSessionInfo.autocommit' is the wrong type 'int', expected type 'bool'");
  await refused({ insert: 't', documents: [{ _id: 2 }], lsid: session, txnNumber: new Int32(++txn) }, 14,
    "BSON field 'OperationSessionInfo.txnNumber' is the wrong type 'int', expected type 'long'");
});

test('commands without an IDL struct stay accepting, the double\'s own ones keep their fields', async () => {
  await accepted({ ping: 1, anything: true });
  await accepted({ buildInfo: 1, anything: true });
  await accepted({ serverStatus: 1, repl: new Int32(0), $db: 'admin' });
  const s = await accepted({ doubleStats: 1, reset: false, $db: 'admin' });
  assert.ok(s.commands);
  await accepted({ configureFailPoint: 'failCommand', mode: 'off', data: { failCommands: ['ping'] }, $db: 'admin' });
  // hello is the one version 1 command that is not strict: the Node.js driver's handshake
  // sends `backpressure`.
  await accepted({ hello: 1, backpressure: '2', $db: 'admin' });
});

test('every command of the schema is one the double implements', () => {
  const { Server } = require('../lib/server');
  const names = new Set(new Server({ port: 0 }).commandNames());
  for (const name of Object.keys(COMMANDS)) assert.ok(names.has(name), `${name} has a schema but no implementation`);
});

test('a mongos parses the same way before it routes anything', async () => {
  const s = await startSharded();
  const m = await rawConnect(s.port);
  try {
    await accepted({ insert: 'c', documents: [{ _id: 1 }] }, m);
    await refused({ update: 'c', updates: [{ q: {}, u: { $set: { a: 2 } }, maxTimeMS: new Int32(1000), multi: true }] }, 40415,
      "BSON field 'update.updates.maxTimeMS' is an unknown field.", m);
    await refused({ getMore: L(424242), collection: 'c', foo: true }, 40415, "BSON field 'getMore.foo' is an unknown field.", m);
    await refused({ find: 'c', filter: 'x' }, 14, 'Expected field filterto be of type object', m);
    // A retryable write split over the shards: mongos's own statement numbers (stmtIds) are
    // int32 as on a real mongos.
    await accepted({ insert: 'c', documents: [{ _id: 2 }, { _id: 3 }], lsid: lsid(), txnNumber: L(1) }, m);
    const f = await accepted({ find: 'c', filter: {} }, m);
    assert.equal(f.cursor.firstBatch.length, 3);
  } finally {
    m.close();
    assert.equal(await s.stop(), 0);
  }
});

// Types the wire keeps apart: a double 1 is not an int (stmtId is an int), a Timestamp is what
// atClusterTime wants (then the read runs, here too early for the kept history: 239).
test('numbers and timestamps keep their BSON types through the parser', async () => {
  await refused({ insert: 'c', documents: [{ _id: 6 }], stmtId: new Double(1), lsid: session, txnNumber: L(++txn) }, 14,
    "BSON field 'insert.stmtId' is the wrong type 'double', expected type 'int'");
  await refused({ find: 'c', readConcern: { level: 'snapshot', atClusterTime: new Timestamp({ t: 1, i: 1 }) } }, 239);
  await refused({ find: 'c', readConcern: { level: 'snapshot', atClusterTime: L(1) } }, 14,
    '"atClusterTime" had the wrong type. Expected timestamp, found long');
});
