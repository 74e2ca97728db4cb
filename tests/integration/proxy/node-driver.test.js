'use strict';
// The official Node.js driver through the proxy (connection string names the proxy, no
// replicaSet=): CRUD, multi-batch cursors, withTransaction retried after a forced write conflict,
// a retryable write retried after the upstream connection is closed, and a w:0 write.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const H = require('../lib/proxy');

let upstream;
let proxy;
let client;
const events = [];
const APP = `rbit-node-${process.pid}`;
const DB = H.uniqueDbName('node');

test.before(async () => {
  upstream = await H.startUpstream();
  proxy = await H.startProxy({ upstream: upstream.uri });
  client = new MongoClient(proxy.uri(), { appName: APP, monitorCommands: true, serverSelectionTimeoutMS: 10000 });
  for (const ev of ['commandStarted', 'commandSucceeded', 'commandFailed']) {
    client.on(ev, (e) => events.push({ ev, name: e.commandName, requestId: e.requestId, failure: e.failure, reply: e.reply, command: e.command }));
  }
  await client.connect();
});

async function closeClient() {
  if (client) {
    await client.db(DB).dropDatabase().catch(() => {});
    await client.close();
    client = null;
  }
}
test.after(closeClient);

function started(name, since) {
  return events.slice(since).filter((e) => e.ev === 'commandStarted' && e.name === name);
}

async function failPoint(mode, data) {
  return client.db('admin').command({ configureFailPoint: 'failCommand', mode, data: { appName: APP, ...data } });
}

async function failPointOff() {
  await client.db('admin').command({ configureFailPoint: 'failCommand', mode: 'off' });
}

test('CRUD round-trips through the proxy', async () => {
  const coll = client.db(DB).collection('crud');
  const ins = await coll.insertMany([
    { _id: 1, name: 'a', n: 1 },
    { _id: 2, name: 'b', n: 2 },
    { _id: 3, name: 'c', n: 3 },
  ]);
  assert.equal(ins.insertedCount, 3);
  assert.deepEqual(await coll.findOne({ _id: 2 }), { _id: 2, name: 'b', n: 2 });
  const upd = await coll.updateOne({ _id: 2 }, { $set: { name: 'B' }, $inc: { n: 10 } });
  assert.equal(upd.matchedCount, 1);
  assert.equal(upd.modifiedCount, 1);
  assert.deepEqual(await coll.findOne({ _id: 2 }), { _id: 2, name: 'B', n: 12 });
  const ups = await coll.updateOne({ _id: 4 }, { $set: { name: 'd' } }, { upsert: true });
  assert.equal(ups.upsertedId, 4);
  const rep = await coll.replaceOne({ _id: 3 }, { name: 'C' });
  assert.equal(rep.modifiedCount, 1);
  const fam = await coll.findOneAndUpdate({ _id: 1 }, { $set: { name: 'A' } }, { returnDocument: 'after' });
  assert.deepEqual(fam, { _id: 1, name: 'A', n: 1 });
  const del = await coll.deleteOne({ _id: 4 });
  assert.equal(del.deletedCount, 1);
  assert.equal(await coll.countDocuments({}), 3);
  const agg = await coll.aggregate([{ $match: { n: { $gte: 1 } } }, { $sort: { _id: 1 } }, { $project: { _id: 1 } }]).toArray();
  assert.deepEqual(agg, [{ _id: 1 }, { _id: 2 }]);
  // Duplicate key is relayed as a write error, not a broken connection.
  await assert.rejects(coll.insertOne({ _id: 1 }), (e) => e.code === 11000);
  assert.equal(await coll.countDocuments({}), 3);
  const dm = await coll.deleteMany({});
  assert.equal(dm.deletedCount, 3);
});

test('a find cursor spans several getMore batches, in order, without loss', async () => {
  const coll = client.db(DB).collection('cursor');
  const docs = Array.from({ length: 50 }, (_, i) => ({ _id: i, pad: 'x'.repeat(100) }));
  await coll.insertMany(docs);
  const since = events.length;
  const got = await coll.find({}, { batchSize: 7, sort: { _id: 1 } }).toArray();
  assert.deepEqual(got.map((d) => d._id), docs.map((d) => d._id));
  const gm = started('getMore', since);
  assert.ok(gm.length >= 7, `expected at least 7 getMores for 50 docs in batches of 7, got ${gm.length}`);
  // Same with aggregate.
  const since2 = events.length;
  const agg = await coll.aggregate([{ $sort: { _id: -1 } }], { batchSize: 9 }).toArray();
  assert.equal(agg.length, 50);
  assert.equal(agg[0]._id, 49);
  assert.ok(started('getMore', since2).length >= 5, 'aggregate used getMore');
});

test('a cursor closed early sends killCursors and the proxy relays its reply', async () => {
  const coll = client.db(DB).collection('cursor');
  const since = events.length;
  const cur = coll.find({}, { batchSize: 5 });
  const first = await cur.next();
  assert.ok(first);
  await cur.close();
  const kc = events.slice(since).filter((e) => e.name === 'killCursors');
  assert.ok(kc.some((e) => e.ev === 'commandSucceeded'), 'killCursors succeeded');
});

test('withTransaction is retried after a forced write conflict; data committed once', async (t) => {
  const skip = H.doubleOnlySkipReason('failCommand');
  if (skip) return t.skip(skip);
  const coll = client.db(DB).collection('txn');
  await coll.insertOne({ _id: 'seed' }); // create the collection outside the transaction
  await failPoint({ times: 1 }, { failCommands: ['insert'], errorCode: 112, errorLabels: ['TransientTransactionError'] });
  const since = events.length;
  let calls = 0;
  const session = client.startSession();
  try {
    await session.withTransaction(async () => {
      calls += 1;
      await coll.insertOne({ _id: 'tx', attempt: calls }, { session });
      await coll.updateOne({ _id: 'seed' }, { $inc: { hits: 1 } }, { session });
    });
  } finally {
    await session.endSession();
    await failPointOff();
  }
  assert.equal(calls, 2, 'the callback ran twice');
  const failed = events.slice(since).filter((e) => e.ev === 'commandFailed' && e.name === 'insert');
  assert.equal(failed.length, 1, 'one insert failed');
  assert.equal(failed[0].failure.code, 112, 'with WriteConflict');
  assert.ok(failed[0].failure.errorLabels.includes('TransientTransactionError'), 'labelled TransientTransactionError');
  assert.equal(started('commitTransaction', since).length, 1, 'committed once');
  assert.deepEqual(await coll.find({ _id: 'tx' }).toArray(), [{ _id: 'tx', attempt: 2 }], 'exactly one document, from the second attempt');
  assert.deepEqual(await coll.findOne({ _id: 'seed' }), { _id: 'seed', hits: 1 });
});

test('a real write conflict between two transactions surfaces as TransientTransactionError', async () => {
  const coll = client.db(DB).collection('txn2');
  await coll.insertOne({ _id: 1, v: 0 });
  const s1 = client.startSession();
  const s2 = client.startSession();
  try {
    s1.startTransaction();
    s2.startTransaction();
    await coll.updateOne({ _id: 1 }, { $set: { v: 1 } }, { session: s1 });
    const err = await coll.updateOne({ _id: 1 }, { $set: { v: 2 } }, { session: s2 }).then(
      () => null,
      (e) => e,
    );
    assert.ok(err, 'second writer must fail');
    assert.equal(err.code, 112);
    assert.ok(err.hasErrorLabel('TransientTransactionError'));
    await s2.abortTransaction();
    await s1.commitTransaction();
  } finally {
    await s1.endSession();
    await s2.endSession();
  }
  assert.deepEqual(await coll.findOne({ _id: 1 }), { _id: 1, v: 1 });
});

test('a retryable write is retried after the upstream closes the connection; it lands once', async (t) => {
  const skip = H.doubleOnlySkipReason('failCommand');
  if (skip) return t.skip(skip);
  const coll = client.db(DB).collection('retry');
  await coll.insertOne({ _id: 'warm' });
  await failPoint({ times: 1 }, { failCommands: ['insert'], closeConnection: true });
  const since = events.length;
  try {
    const r = await coll.insertOne({ _id: 'rw', v: 1 });
    assert.equal(r.acknowledged, true);
  } finally {
    await failPointOff();
  }
  const ins = started('insert', since);
  assert.equal(ins.length, 2, 'the driver sent the insert twice (first attempt cut, then retried)');
  assert.equal(ins[0].command.txnNumber.toString(), ins[1].command.txnNumber.toString(), 'retry reuses the txnNumber');
  const failed = events.slice(since).filter((e) => e.ev === 'commandFailed' && e.name === 'insert');
  assert.equal(failed.length, 1, 'the first attempt failed');
  assert.match(String(failed[0].failure.name), /Network|PoolCleared/, `failure is a network error: ${failed[0].failure.name}`);
  assert.equal(await coll.countDocuments({ _id: 'rw' }), 1, 'the insert landed exactly once');
});

test('a w:0 write lands eventually and the connection stays in step', async () => {
  const c1 = new MongoClient(proxy.uri(), { maxPoolSize: 1, serverSelectionTimeoutMS: 10000 });
  try {
    const coll = c1.db(DB).collection('w0');
    const r = await coll.insertOne({ _id: 'w0', v: 1 }, { writeConcern: { w: 0 } });
    assert.equal(r.acknowledged, false);
    // Same (only) pooled connection: the next replies must still match their requests.
    for (let i = 0; i < 5; i++) {
      const pong = await c1.db('admin').command({ ping: 1 });
      assert.equal(pong.ok, 1);
      const n = await coll.estimatedDocumentCount().catch(() => null);
      assert.ok(n === null || typeof n === 'number');
    }
    const deadline = Date.now() + 5000;
    let doc = null;
    while (!doc && Date.now() < deadline) {
      doc = await coll.findOne({ _id: 'w0' });
      if (!doc) await H.sleep(100);
    }
    assert.deepEqual(doc, { _id: 'w0', v: 1 }, 'the w:0 insert landed');
    await coll.insertMany([{ _id: 'w0b' }, { _id: 'w0c' }], { writeConcern: { w: 0 } });
    await coll.deleteOne({ _id: 'w0' }, { writeConcern: { w: 0 } });
    const deadline2 = Date.now() + 5000;
    let ids = [];
    while (Date.now() < deadline2) {
      ids = (await coll.find({}).sort({ _id: 1 }).toArray()).map((d) => d._id);
      if (ids.join() === 'w0b,w0c') break;
      await H.sleep(100);
    }
    assert.deepEqual(ids, ['w0b', 'w0c']);
  } finally {
    await c1.close();
  }
});

test('many operations pipelined over a small pool keep replies matched to requests', async () => {
  const c2 = new MongoClient(proxy.uri(), { maxPoolSize: 2, serverSelectionTimeoutMS: 10000 });
  try {
    const coll = c2.db(DB).collection('pipelined');
    await coll.insertMany(Array.from({ length: 20 }, (_, i) => ({ _id: i, sq: i * i })));
    const res = await Promise.all(Array.from({ length: 100 }, (_, k) => coll.findOne({ _id: k % 20 })));
    res.forEach((d, k) => assert.deepEqual(d, { _id: k % 20, sq: (k % 20) * (k % 20) }));
  } finally {
    await c2.close();
  }
});

test('a large document (about 15 MiB) round-trips', async () => {
  const coll = client.db(DB).collection('large');
  const big = 'y'.repeat(15 * 1024 * 1024);
  await coll.insertOne({ _id: 'big', big });
  const d = await coll.findOne({ _id: 'big' });
  assert.equal(d.big.length, big.length);
  assert.ok(d.big === big);
  await coll.deleteOne({ _id: 'big' });
});

test('an insertMany larger than maxMessageSizeBytes is split by the driver and all of it lands', { timeout: 120000 }, async () => {
  const coll = client.db(DB).collection('split');
  const since = events.length;
  const s = 'z'.repeat(14 * 1024 * 1024);
  const docs = Array.from({ length: 4 }, (_, i) => ({ _id: i, s }));
  const r = await coll.insertMany(docs);
  assert.equal(r.insertedCount, 4);
  assert.ok(started('insert', since).length >= 2, 'the driver needed several insert messages');
  const back = await coll.find({}, { projection: { _id: 1 } }).sort({ _id: 1 }).toArray();
  assert.deepEqual(back, [{ _id: 0 }, { _id: 1 }, { _id: 2 }, { _id: 3 }]);
  const one = await coll.findOne({ _id: 3 });
  assert.ok(one.s === s, 'content intact');
  await coll.drop();
});

H.registerFinalChecks(test, [() => upstream && upstream.stop()], { beforeStop: closeClient });
