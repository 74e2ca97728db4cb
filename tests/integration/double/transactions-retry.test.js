'use strict';
// withTransaction is retried on a TransientTransactionError - a forced one
// (failCommand, WriteConflict 112) and a genuine write conflict with a second
// session - and the data commits exactly once although the callback ran twice.
// Official Node.js driver and Mongoose.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient, MongoServerError } = require('mongodb');
const mongoose = require('mongoose');
const { serverForTests, uniqueDbName } = require('../lib/double');

let server;
let client;
const APP = `retry-${process.pid}`;

test.before(async () => {
  server = await serverForTests();
  client = new MongoClient(server.uri, { appName: APP, serverSelectionTimeoutMS: 10000 });
  await client.connect();
});

test.after(async () => {
  if (client) await client.close();
  if (server) await server.stop();
});

async function failNextInsertWithWriteConflict(c) {
  // Scoped by appName so a shared server's other clients are not affected.
  await c.db('admin').command({
    configureFailPoint: 'failCommand',
    mode: { times: 1 },
    data: { failCommands: ['insert'], errorCode: 112, errorLabels: ['TransientTransactionError'], appName: APP },
  });
}

async function failPointOff(c) {
  await c.db('admin').command({ configureFailPoint: 'failCommand', mode: 'off' });
}

test('driver: forced WriteConflict (failCommand 112) makes withTransaction retry, data committed once', { timeout: 60000 }, async () => {
  const db = client.db(uniqueDbName('retry_fp'));
  const coll = db.collection('items');
  await db.createCollection('items');
  const session = client.startSession();
  let calls = 0;
  const errorsSeen = [];
  try {
    await failNextInsertWithWriteConflict(client);
    await session.withTransaction(async () => {
      calls += 1;
      try {
        await coll.insertOne({ _id: 'a', v: 1 }, { session });
      } catch (e) {
        errorsSeen.push(e);
        throw e;
      }
    });
  } finally {
    await failPointOff(client);
    await session.endSession();
  }
  assert.equal(calls, 2, 'callback should run twice (first attempt fails with WriteConflict)');
  assert.equal(errorsSeen.length, 1);
  assert.ok(errorsSeen[0] instanceof MongoServerError, `got ${errorsSeen[0]}`);
  assert.equal(errorsSeen[0].code, 112);
  assert.ok(errorsSeen[0].hasErrorLabel('TransientTransactionError'), 'first failure carries TransientTransactionError');
  assert.deepEqual(await coll.find().toArray(), [{ _id: 'a', v: 1 }]);
  await db.dropDatabase();
});

test('driver: genuine write conflict with a second session makes withTransaction retry, committed once', { timeout: 60000 }, async () => {
  const db = client.db(uniqueDbName('retry_wc'));
  const accounts = db.collection('counters');
  const ledger = db.collection('ledger');
  await accounts.insertOne({ _id: 1, n: 0 });
  await db.createCollection('ledger');
  const a = client.startSession();
  const b = client.startSession();
  let calls = 0;
  const codes = [];
  try {
    await a.withTransaction(async () => {
      calls += 1;
      // Read first: the transaction's snapshot is taken here.
      const before = await accounts.findOne({ _id: 1 }, { session: a });
      if (calls === 1) {
        // Another session commits a write to the same document after A's snapshot.
        b.startTransaction();
        await accounts.updateOne({ _id: 1 }, { $inc: { n: 10 } }, { session: b });
        await b.commitTransaction();
      }
      try {
        await accounts.updateOne({ _id: 1 }, { $inc: { n: 1 } }, { session: a });
      } catch (e) {
        codes.push(e.code);
        throw e;
      }
      await ledger.insertOne({ _id: 'txn-a', sawN: before.n }, { session: a });
    });
  } finally {
    await a.endSession();
    await b.endSession();
  }
  assert.equal(calls, 2, 'callback ran twice');
  assert.deepEqual(codes, [112], 'first attempt hit WriteConflict');
  assert.deepEqual(await accounts.find().toArray(), [{ _id: 1, n: 11 }]);
  // The retry saw the other session's committed write, and only it committed.
  assert.deepEqual(await ledger.find().toArray(), [{ _id: 'txn-a', sawN: 10 }]);
  await db.dropDatabase();
});

test('mongoose: forced and genuine write conflicts are retried by withTransaction, committed once', { timeout: 60000 }, async () => {
  const dbName = uniqueDbName('retry_mg');
  const conn = await mongoose.createConnection(server.uri, { dbName, appName: APP, serverSelectionTimeoutMS: 10000 }).asPromise();
  try {
    const Item = conn.model('Item', new mongoose.Schema({ _id: String, v: Number }, { versionKey: false }));
    const Counter = conn.model('Counter', new mongoose.Schema({ _id: Number, n: Number }, { versionKey: false }));
    await Item.createCollection();
    await Counter.create({ _id: 1, n: 0 });

    // Forced conflict.
    let calls = 0;
    const session = await conn.startSession();
    try {
      await failNextInsertWithWriteConflict(client);
      await session.withTransaction(async () => {
        calls += 1;
        await Item.create([{ _id: 'a', v: 1 }], { session });
      });
    } finally {
      await failPointOff(client);
      await session.endSession();
    }
    assert.equal(calls, 2, 'mongoose callback ran twice');
    assert.deepEqual(await Item.find().lean(), [{ _id: 'a', v: 1 }]);

    // Genuine conflict from a second session.
    const a = await conn.startSession();
    const b = await conn.startSession();
    let callsA = 0;
    try {
      await a.withTransaction(async () => {
        callsA += 1;
        await Counter.findById(1).session(a);
        if (callsA === 1) {
          b.startTransaction();
          await Counter.updateOne({ _id: 1 }, { $inc: { n: 10 } }).session(b);
          await b.commitTransaction();
        }
        await Counter.updateOne({ _id: 1 }, { $inc: { n: 1 } }).session(a);
      });
    } finally {
      await a.endSession();
      await b.endSession();
    }
    assert.equal(callsA, 2, 'mongoose callback ran twice on a genuine conflict');
    assert.deepEqual(await Counter.find().lean(), [{ _id: 1, n: 11 }]);
    await conn.dropDatabase();
  } finally {
    await conn.close();
  }
});
