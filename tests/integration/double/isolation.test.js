'use strict';
// Snapshot isolation between sessions: a transaction's uncommitted writes are
// invisible to another session's transaction and to non-transactional reads,
// and visible to everyone after commit. Official Node.js driver and Mongoose.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const mongoose = require('mongoose');
const { serverForTests, uniqueDbName } = require('../lib/double');

let server;
let client;

test.before(async () => {
  server = await serverForTests();
  client = new MongoClient(server.uri, { serverSelectionTimeoutMS: 10000 });
  await client.connect();
});

test.after(async () => {
  if (client) await client.close();
  if (server) await server.stop();
});

test('driver: uncommitted insert and update are invisible outside the transaction until commit', { timeout: 60000 }, async () => {
  const db = client.db(uniqueDbName('iso'));
  const coll = db.collection('docs');
  await coll.insertOne({ _id: 'existing', v: 1 });
  const a = client.startSession();
  const b = client.startSession();
  try {
    a.startTransaction();
    await coll.insertOne({ _id: 'new', v: 1 }, { session: a });
    await coll.updateOne({ _id: 'existing' }, { $set: { v: 2 } }, { session: a });

    // The writer sees its own writes.
    assert.deepEqual(await coll.find({}, { session: a, sort: { _id: 1 } }).toArray(),
      [{ _id: 'existing', v: 2 }, { _id: 'new', v: 1 }]);

    // Non-transactional reads do not.
    assert.equal(await coll.findOne({ _id: 'new' }), null, 'uncommitted insert visible to a plain read');
    assert.deepEqual(await coll.findOne({ _id: 'existing' }), { _id: 'existing', v: 1 }, 'uncommitted update visible to a plain read');
    assert.equal(await coll.countDocuments({}), 1);

    // Nor does another session's transaction.
    b.startTransaction();
    assert.equal(await coll.findOne({ _id: 'new' }, { session: b }), null, 'uncommitted insert visible to session B');
    assert.deepEqual(await coll.findOne({ _id: 'existing' }, { session: b }), { _id: 'existing', v: 1 });
    await b.commitTransaction();

    await a.commitTransaction();

    // After commit: visible to plain reads and to a new transaction in B.
    assert.deepEqual(await coll.find({}, { sort: { _id: 1 } }).toArray(),
      [{ _id: 'existing', v: 2 }, { _id: 'new', v: 1 }]);
    b.startTransaction();
    assert.deepEqual(await coll.findOne({ _id: 'new' }, { session: b }), { _id: 'new', v: 1 });
    assert.deepEqual(await coll.findOne({ _id: 'existing' }, { session: b }), { _id: 'existing', v: 2 });
    await b.commitTransaction();
  } finally {
    await a.endSession();
    await b.endSession();
  }
  await db.dropDatabase();
});

test('driver: an aborted transaction leaves nothing behind', { timeout: 60000 }, async () => {
  const db = client.db(uniqueDbName('iso_abort'));
  const coll = db.collection('docs');
  await coll.insertOne({ _id: 1, v: 1 });
  const s = client.startSession();
  try {
    s.startTransaction();
    await coll.insertOne({ _id: 2 }, { session: s });
    await coll.deleteOne({ _id: 1 }, { session: s });
    assert.equal(await coll.countDocuments({}, { session: s }), 1);
    await s.abortTransaction();
  } finally {
    await s.endSession();
  }
  assert.deepEqual(await coll.find().toArray(), [{ _id: 1, v: 1 }]);
  await db.dropDatabase();
});

test('mongoose: uncommitted writes are isolated until commit', { timeout: 60000 }, async () => {
  const dbName = uniqueDbName('iso_mg');
  const conn = await mongoose.createConnection(server.uri, { dbName, serverSelectionTimeoutMS: 10000 }).asPromise();
  try {
    const Doc = conn.model('Doc', new mongoose.Schema({ _id: String, v: Number }, { versionKey: false }));
    await Doc.create({ _id: 'existing', v: 1 });
    const a = await conn.startSession();
    const b = await conn.startSession();
    try {
      a.startTransaction();
      await Doc.create([{ _id: 'new', v: 1 }], { session: a });
      await Doc.updateOne({ _id: 'existing' }, { $set: { v: 2 } }).session(a);
      assert.equal(await Doc.countDocuments().session(a), 2);

      assert.equal(await Doc.findById('new').lean(), null, 'uncommitted insert visible to a plain read');
      assert.equal((await Doc.findById('existing').lean()).v, 1, 'uncommitted update visible to a plain read');

      b.startTransaction();
      assert.equal(await Doc.findById('new').session(b).lean(), null, 'uncommitted insert visible to session B');
      await b.abortTransaction();

      await a.commitTransaction();
      assert.deepEqual(await Doc.find().sort({ _id: 1 }).lean(), [{ _id: 'existing', v: 2 }, { _id: 'new', v: 1 }]);
    } finally {
      await a.endSession();
      await b.endSession();
    }
    await conn.dropDatabase();
  } finally {
    await conn.close();
  }
});
