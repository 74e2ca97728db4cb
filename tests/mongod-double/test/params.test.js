'use strict';
// Generic command parameters as mongod 7.0 checks them before a command runs: the Stable API
// parameters (apiVersion, apiStrict, apiDeprecationErrors) and snapshot reads outside
// transactions.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const { startDouble } = require('./helpers');

let d;
let client;
let db;

before(async () => {
  d = await startDouble();
  client = new MongoClient(d.uri('directConnection=true'), { serverSelectionTimeoutMS: 5000 });
  await client.connect();
  db = client.db('params');
});
after(async () => {
  await client.close();
  assert.equal(await d.stop(), 0);
});

const fails = (cmd, code, name) => assert.rejects(db.command(cmd), (e) => {
  assert.equal(e.code, code);
  if (name) assert.equal(e.codeName, name);
  return true;
});

test('API parameters: version "1" only, apiStrict needs apiVersion, strict mode limits the commands', async () => {
  assert.equal((await db.command({ ping: 1, apiVersion: '1' })).ok, 1);
  assert.equal((await db.command({ ping: 1, apiVersion: '1', apiStrict: true })).ok, 1);
  await fails({ ping: 1, apiVersion: '2' }, 322, 'APIVersionError');
  await fails({ ping: 1, apiVersion: 1 }, 14, 'TypeMismatch');
  await fails({ ping: 1, apiStrict: true }, 4886600);
  await fails({ ping: 1, apiDeprecationErrors: false }, 4886600);
  await fails({ ping: 1, apiVersion: '1', apiStrict: 'yes' }, 14);
  await assert.rejects(db.command({ testVersion2: 1, apiVersion: '1', apiStrict: true }), (e) => {
    assert.equal(e.codeName, 'APIStrictError');
    assert.match(e.message, /command testVersion2 is not in API Version 1/);
    return true;
  });
  await fails({ serverStatus: 1, apiVersion: '1', apiStrict: true }, 323, 'APIStrictError');
  assert.equal((await db.command({ testVersion2: 1, apiVersion: '1' })).ok, 1);
  await fails({ noSuchCommand: 1, apiVersion: '1', apiStrict: true }, 59);
});

test('acceptApiVersion2 is a parameter, false as on a mongod with test commands', async () => {
  const r = await client.db('admin').command({ getParameter: 1, acceptApiVersion2: 1 });
  assert.equal(r.acceptApiVersion2, false);
});

test('snapshot read concern outside a transaction: find, aggregate and distinct only', async () => {
  const c = db.collection('snap');
  await c.insertOne({ _id: 1 });
  const rc = { readConcern: { level: 'snapshot' } };
  assert.equal((await db.command({ find: 'snap', ...rc })).cursor.firstBatch.length, 1);
  assert.equal((await db.command({ aggregate: 'snap', pipeline: [], cursor: {}, ...rc })).cursor.firstBatch.length, 1);
  assert.deepEqual((await db.command({ distinct: 'snap', key: '_id', ...rc })).values, [1]);
  await fails({ insert: 'snap', documents: [{ _id: 2 }], ...rc }, 72, 'InvalidOptions');
  await fails({ listCollections: 1, ...rc }, 72);
  await fails({ count: 'snap', ...rc }, 72);
  assert.equal(await c.countDocuments(), 1);
});

test('currentOp with $all lists every open connection, idle ones included, with the appName of its hello', async () => {
  const other = new MongoClient(d.uri('directConnection=true'), { appName: 'params-other', maxPoolSize: 1 });
  await other.connect();
  try {
    await other.db('admin').command({ ping: 1 });
    const all = await client.db('admin').command({ currentOp: 1, $all: true });
    const mine = all.inprog.filter((op) => op.appName === 'params-other');
    assert.ok(mine.length >= 1, JSON.stringify(all.inprog));
    assert.ok(mine.every((op) => op.active === false && typeof op.connectionId === 'number' && /:\d+$/.test(op.client)));
    assert.equal(all.inprog.filter((op) => op.active).length, 1, 'the connection running currentOp is the one active');
    const own = await client.db('admin').command({ currentOp: 1 });
    assert.ok(own.inprog.every((op) => op.appName !== 'params-other'), 'without $all, idle connections are not listed');
  } finally {
    await other.close();
  }
  // The server sees the close when the socket's end reaches it: wait for that, not a time.
  for (let tries = 0; ; tries++) {
    const later = await client.db('admin').command({ currentOp: 1, $all: true });
    if (later.inprog.every((op) => op.appName !== 'params-other')) break;
    assert.ok(tries < 100, 'a closed connection leaves the list');
    await new Promise((r) => setTimeout(r, 20));
  }
});
