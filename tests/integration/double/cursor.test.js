'use strict';
// A cursor over many batches: a small batchSize forces at least five getMore
// round trips and every document comes back exactly once. Official driver
// (find and aggregate) and Mongoose (query cursor).

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const mongoose = require('mongoose');
const { serverForTests, uniqueDbName } = require('../lib/double');

const N = 103;
const BATCH = 10;

let server;
let client;
const started = [];

test.before(async () => {
  server = await serverForTests();
  client = new MongoClient(server.uri, { serverSelectionTimeoutMS: 10000, monitorCommands: true });
  client.on('commandStarted', (e) => started.push(e));
  await client.connect();
});

test.after(async () => {
  if (client) await client.close();
  if (server) await server.stop();
});

function getMoresFor(collName, since) {
  return started.slice(since).filter((e) => e.commandName === 'getMore' && e.command.collection === collName);
}

function assertEachOnce(ids) {
  assert.equal(ids.length, N, `got ${ids.length} documents, expected ${N}`);
  const seen = new Set(ids);
  assert.equal(seen.size, N, 'some document came back more than once');
  for (let i = 0; i < N; i++) assert.ok(seen.has(i), `document ${i} missing`);
}

async function seed(coll) {
  await coll.insertMany(Array.from({ length: N }, (_, i) => ({ _id: i, pad: 'x'.repeat(100), even: i % 2 === 0 })));
}

test('driver: find with batchSize iterates all batches with getMore, each document once', { timeout: 60000 }, async () => {
  const db = client.db(uniqueDbName('cursor'));
  const coll = db.collection('many');
  await seed(coll);
  const mark = started.length;
  const ids = [];
  const cursor = coll.find({}, { batchSize: BATCH });
  for await (const doc of cursor) ids.push(doc._id);
  assertEachOnce(ids);
  const getMores = getMoresFor('many', mark);
  assert.ok(getMores.length >= 5, `only ${getMores.length} getMore commands`);
  assert.equal(getMores.length, Math.ceil(N / BATCH) - 1, 'one getMore per remaining batch');
  // Every getMore continues the same server cursor.
  const ids64 = new Set(getMores.map((e) => String(e.command.getMore)));
  assert.equal(ids64.size, 1, `getMore used cursor ids ${[...ids64]}`);
  await db.dropDatabase();
});

test('driver: sorted, filtered find and aggregate cursors over several batches', { timeout: 60000 }, async () => {
  const db = client.db(uniqueDbName('cursor_agg'));
  const coll = db.collection('many');
  await seed(coll);

  let mark = started.length;
  const desc = await coll.find({}, { batchSize: 7, sort: { _id: -1 } }).toArray();
  assert.deepEqual(desc.map((d) => d._id), Array.from({ length: N }, (_, i) => N - 1 - i));
  assert.ok(getMoresFor('many', mark).length >= 5);

  mark = started.length;
  const evens = await coll.aggregate([{ $match: { even: true } }, { $project: { pad: 0 } }], { batchSize: 5 }).toArray();
  assert.deepEqual(evens.map((d) => d._id), Array.from({ length: Math.ceil(N / 2) }, (_, i) => i * 2));
  assert.ok(evens.every((d) => !('pad' in d)));
  assert.ok(getMoresFor('many', mark).length >= 5, 'aggregate cursor should need getMore');

  // A cursor closed early is killed on the server (no leaked cursor errors).
  const c = coll.find({}, { batchSize: 3 });
  await c.next();
  await c.close();
  await db.dropDatabase();
});

test('mongoose: query cursor with batchSize streams every document once', { timeout: 60000 }, async () => {
  const dbName = uniqueDbName('cursor_mg');
  const conn = await mongoose.createConnection(server.uri, { dbName, serverSelectionTimeoutMS: 10000, monitorCommands: true })
    .asPromise();
  const cmds = [];
  conn.getClient().on('commandStarted', (e) => cmds.push(e));
  try {
    const Row = conn.model('Row', new mongoose.Schema({ _id: Number, pad: String, even: Boolean }, { versionKey: false }));
    await Row.insertMany(Array.from({ length: N }, (_, i) => ({ _id: i, pad: 'y', even: i % 2 === 0 })));
    const ids = [];
    const cursor = Row.find().batchSize(BATCH).cursor();
    for (let doc = await cursor.next(); doc != null; doc = await cursor.next()) ids.push(doc._id);
    assertEachOnce(ids);
    const getMores = cmds.filter((e) => e.commandName === 'getMore');
    assert.ok(getMores.length >= 5, `only ${getMores.length} getMore commands`);
    await conn.dropDatabase();
  } finally {
    await conn.close();
  }
});
