'use strict';
// The server double parses commands as mongod does (tests/mongod-double/lib/parse.js), and the
// proxy forwards a client's command unchanged: a malformed command sent through the proxy comes
// back with mongod's code and message, the same reply the double gives it directly, and the
// same commands well formed, with the generic arguments, pass. Then the harness's own check
// (tests/integration/lib/double.js): a double whose connections named like the proxy's own got
// a parse error fails its stop(), unless the test allows that code for that appName.

const test = require('node:test');
const assert = require('node:assert/strict');
const { Int32, Long, UUID } = require('bson');
const { MongoClient } = require('mongodb');
const H = require('../lib/proxy');

const DB = H.uniqueDbName('strict');
let upstream;
let proxy;
let viaProxy;
let direct;
let client;

test.before(async () => {
  upstream = await H.startDouble();
  proxy = await H.startProxy({ upstream: upstream.uri });
  viaProxy = await H.WireConn.connect({ port: proxy.port });
  direct = await H.WireConn.connect({ port: upstream.port });
  client = new MongoClient(proxy.uri(), { serverSelectionTimeoutMS: 10000 });
  await client.connect();
});

test.after(async () => {
  if (client) await client.close();
  for (const c of [viaProxy, direct]) if (c) c.destroy();
});

// Each malformed command with the reply mongod gives it.
const MALFORMED = [
  ['an unknown field in an update statement',
    { update: 'c', updates: [{ q: {}, u: { $set: { a: 2 } }, maxTimeMS: new Int32(1000), multi: true }] },
    40415, "BSON field 'update.updates.maxTimeMS' is an unknown field."],
  ['an unknown field in a delete statement',
    { delete: 'c', deletes: [{ q: {}, limit: new Int32(0), maxTimeMS: new Int32(1000) }] },
    40415, "BSON field 'delete.deletes.maxTimeMS' is an unknown field."],
  ['an unknown field in find', { find: 'c', filter: {}, maxScan: new Int32(5) },
    40415, "BSON field 'FindCommandRequest.maxScan' is an unknown field."],
  ['an unknown field in aggregate', { aggregate: 'c', pipeline: [], cursor: {}, batchSize: new Int32(5) },
    40415, "BSON field 'aggregate.batchSize' is an unknown field."],
  ['an unknown field in findAndModify', { findAndModify: 'c', query: {}, update: { $set: { a: 2 } }, multi: true },
    40415, "BSON field 'findAndModify.multi' is an unknown field."],
  ['an unknown field in insert', { insert: 'c', documents: [{ _id: 9 }], upsert: true },
    40415, "BSON field 'insert.upsert' is an unknown field."],
  ['an unknown field in a getMore of a cursor that does not exist',
    { getMore: Long.fromNumber(424242), collection: 'c', maxAwaitTimeMS: new Int32(10) },
    40415, "BSON field 'getMore.maxAwaitTimeMS' is an unknown field."],
  ['documents that are not an array', { insert: 'c', documents: { _id: 9 } },
    14, "BSON field 'insert.documents' is the wrong type 'object', expected type 'array'"],
  ['a filter that is a string', { find: 'c', filter: '{_id: 1}' }, 14, 'Expected field filterto be of type object'],
  ['an update statement without u', { update: 'c', updates: [{ q: { _id: 1 } }] },
    40414, "BSON field 'update.updates.u' is missing but a required field"],
  ['a delete statement without limit', { delete: 'c', deletes: [{ q: { _id: 1 } }] },
    40414, "BSON field 'delete.deletes.limit' is missing but a required field"],
];

test('through the proxy, each malformed command gets mongod\'s code and message, as from the double directly', async () => {
  assert.equal((await viaProxy.command({ insert: 'c', documents: [{ _id: 1, a: 1 }], $db: DB })).ok, 1);
  for (const [what, cmd, code, errmsg] of MALFORMED) {
    const r = await viaProxy.command(Object.assign({}, cmd, { $db: DB }));
    assert.equal(r.ok, 0, `${what}: accepted through the proxy`);
    assert.equal(r.code, code, `${what}: ${r.errmsg}`);
    assert.equal(r.errmsg, errmsg, what);
    const d = await direct.command(Object.assign({}, cmd, { $db: DB }));
    assert.deepEqual([d.code, d.codeName, d.errmsg], [r.code, r.codeName, r.errmsg], `${what}: direct and through the proxy differ`);
  }
  const r = await viaProxy.command({ find: 'c', filter: {}, $db: DB });
  assert.deepEqual(r.cursor.firstBatch, [{ _id: 1, a: 1 }], 'a refused command changed the collection');
});

test('through the proxy with the Node.js driver\'s db.command: the same errors', async () => {
  const db = client.db(DB);
  for (const [what, cmd, code, errmsg] of MALFORMED) {
    await assert.rejects(db.command(cmd), (e) => {
      assert.equal(e.code, code, `${what}: ${e.message}`);
      assert.equal(e.message, errmsg, what);
      return true;
    }, what);
  }
});

test('the same commands, well formed, with the generic arguments, pass through the proxy', async () => {
  const lsid = { id: new UUID() };
  // The command first, then the generic arguments.
  const g = (cmd) => Object.assign(cmd, {
    lsid, maxTimeMS: new Int32(5000), comment: 'strict', apiVersion: '1', $readPreference: { mode: 'primary' }, $db: DB,
  });
  const wc = { writeConcern: { w: 'majority', wtimeout: new Int32(1000) } };
  const rc = { readConcern: { level: 'local' } };
  const ok = async (cmd) => {
    const r = await viaProxy.command(cmd);
    assert.equal(r.ok, 1, `${JSON.stringify(cmd)}: ${r.code} ${r.errmsg}`);
    return r;
  };
  await ok(g(Object.assign({ insert: 'g', documents: [{ _id: 1 }, { _id: 2 }, { _id: 3 }] }, wc, { txnNumber: Long.fromNumber(1) })));
  await ok(g(Object.assign({ update: 'g', updates: [{ q: {}, u: { $set: { a: 2 } }, multi: true }] }, wc)));
  await ok(g(Object.assign({ delete: 'g', deletes: [{ q: { _id: 3 }, limit: new Int32(1) }] }, wc)));
  await ok(g(Object.assign({ findAndModify: 'g', query: { _id: 1 }, update: { $set: { b: 1 } }, new: true }, wc)));
  const f = await ok(g(Object.assign({ find: 'g', filter: {}, batchSize: new Int32(1) }, rc)));
  await ok({ getMore: Long.fromValue(f.cursor.id), collection: 'g', lsid, comment: 'strict', $db: DB });
  await ok(g(Object.assign({ aggregate: 'g', pipeline: [{ $match: {} }], cursor: {} }, rc)));
});

test('the harness fails a double whose connection named like the proxy\'s own got a parse error', async () => {
  // Commands the proxy never sends, under its appName: kept out of the suite's record
  // (docs/upstream-commands.md lists what the proxy sends).
  const own = await H.startDouble({ record: false });
  const pretend = async (port, appName) => {
    const c = await H.WireConn.connect({ port });
    try {
      assert.equal((await c.command({ hello: 1, client: { application: { name: appName } }, $db: 'admin' })).ok, 1);
      const r = await c.command({ update: 'c', updates: [{ q: {}, u: { $set: { a: 1 } }, maxTimeMS: new Int32(1000) }], $db: DB });
      assert.equal(r.code, 40415);
    } finally {
      c.destroy();
    }
  };
  await pretend(own.port, 'relaybus-proxy dispatch');
  await pretend(own.port, 'relaybus-proxy dispatch');
  // A client's command through a pooled proxy's upstream connection is the client's, not the proxy's.
  await pretend(own.port, 'relaybus-proxy pool');
  await assert.rejects(own.stop(), (e) => {
    assert.ok(e.proxyRefused, e.message);
    assert.match(e.message, /appName "relaybus-proxy dispatch" got 40415 2 time\(s\)/);
    assert.doesNotMatch(e.message, /relaybus-proxy pool/);
    assert.match(e.message, /refused update: 40415 BSON field 'update\.updates\.maxTimeMS' is an unknown field\./, 'the double\'s log line');
    return true;
  });
  // A test that makes the proxy's own connection get such a code on purpose says so.
  const allowed = await H.startDouble({ record: false, allowProxyErrors: { 'relaybus-proxy dispatch': [40415] } });
  await pretend(allowed.port, 'relaybus-proxy dispatch');
  await allowed.stop();
});

H.registerFinalChecks(test, [() => upstream && upstream.stop()], { beforeStop: () => client && client.close() });
