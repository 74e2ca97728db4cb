'use strict';
// The proxy in front of a sharded cluster: `upstream` names two mongos routers of the double's
// two-shard cluster (--sharded). What the tests check:
//  - a client connection pairs with one mongos and a transaction's statements and its commit
//    all reach that one (each mongos counts what it was sent: doubleStats);
//  - when that mongos stops (shutdown), a connection with work in flight sees what a driver
//    sees of a mongos that went away (a network error: its connection closes; in a transaction
//    the driver labels it TransientTransactionError), an idle one is paired with the other
//    mongos and sees nothing (mongos-stop.test.js), retryable writes and withTransaction
//    succeed through the proxy, and new pairings go to the other mongos;
//  - a commit retried after UnknownTransactionCommitResult carries its recoveryToken through
//    the proxy: the retry reaches the other mongos, which answers from the recovery shard's
//    decision (without the token it would answer 251);
//  - pooled mode pins a transaction to one pooled connection of one mongos.
// Double-only: it stops routers and counts commands per router.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const H = require('../lib/proxy');
const { commandsPerMongos, countsOf, stopMongos } = require('./helpers');

let cluster;
const skip = H.doubleOnlySkipReason('a sharded double whose routers can be stopped') || false;



async function startCluster() {
  const d = await H.startDouble({ sharded: { shards: 2, mongos: 2 } });
  const c = new MongoClient(d.uri, { serverSelectionTimeoutMS: 5000 });
  try {
    await c.db('admin').command({ enableSharding: 'fw' });
    await c.db('admin').command({ shardCollection: 'fw.items', key: { _id: 'hashed' } });
  } finally {
    await c.close();
  }
  return d;
}


// Documents whose hashed _id lands on each shard, so a transaction writes both.
const BOTH_SHARDS = Array.from({ length: 8 }, (_, i) => ({ _id: `d${i}` }));

test.before(async () => {
  if (skip) return;
  cluster = await startCluster();
});

test('a connection pairs with one mongos: a transaction across both shards and its commit reach that mongos alone', { skip }, async () => {
  const proxy = await H.startProxy({ upstream: cluster.uri });
  const client = new MongoClient(proxy.uri(), { serverSelectionTimeoutMS: 10000, maxPoolSize: 1 });
  try {
    await client.connect();
    await commandsPerMongos(cluster.mongos, ['insert', 'commitTransaction']);
    const session = client.startSession();
    try {
      await session.withTransaction(async () => {
        await client.db('fw').collection('items').insertMany(BOTH_SHARDS.map((d) => ({ ...d, t: 1 })), { session });
      });
    } finally {
      await session.endSession();
    }
    const counts = await commandsPerMongos(cluster.mongos, ['insert', 'commitTransaction']);
    const used = counts.filter((n) => n.insert > 0 || n.commitTransaction > 0);
    assert.equal(used.length, 1, `one mongos saw the transaction: ${JSON.stringify(counts)}`);
    assert.equal(used[0].commitTransaction, 1);
    assert.equal(await client.db('fw').collection('items').countDocuments({ t: 1 }), BOTH_SHARDS.length);
  } finally {
    await client.close();
  }
});

test('the paired mongos stops: the client sees at most a network error, the next pairing goes to the other mongos at once, and retryable writes and withTransaction go through', { skip }, async () => {
  const own = await startCluster();
  const proxy = await H.startProxy({ upstream: own.uri });
  // Without retries the first operation after the stop shows what the driver was told.
  const plain = new MongoClient(proxy.uri({ retryWrites: false, retryReads: false }), { serverSelectionTimeoutMS: 15000, maxPoolSize: 1 });
  const client = new MongoClient(proxy.uri(), { serverSelectionTimeoutMS: 15000, maxPoolSize: 4 });
  const coll = client.db('fw').collection('items');
  const pcoll = plain.db('fw').collection('items');
  try {
    await pcoll.insertOne({ _id: 'before' });
    await coll.insertOne({ _id: 'before2' });
    const first = await countsOf(own.mongos, 'insert');
    const paired = first.findIndex((n) => n > 0);
    assert.ok(paired >= 0 && first[1 - paired] === 0, `one mongos counted the inserts: ${first}`);

    // withTransaction across the stop: whatever the stop cost the transaction, it is retried
    // and commits once.
    let attempts = 0;
    const session = client.startSession();
    try {
      await session.withTransaction(async () => {
        attempts++;
        await coll.insertOne({ _id: `t${attempts}-a` }, { session });
        if (attempts === 1) await stopMongos(own.mongos[paired]);
        await coll.insertMany(BOTH_SHARDS.map((d) => ({ _id: `${d._id}-txn` })), { session });
      });
    } finally {
      await session.endSession();
    }
    assert.equal(await coll.countDocuments({ _id: /-txn$/ }), BOTH_SHARDS.length, 'the transaction committed once');
    assert.equal(await coll.countDocuments({ _id: /^t[0-9]+-a$/ }), 1, 'no statement of an abandoned attempt stayed');

    // The connection paired with the stopped mongos: idle, it is paired with the other mongos
    // and the insert goes through; had it been closed, a network error, as from a mongos that
    // went away. Never a server error a driver would not retry.
    const e = await pcoll.insertOne({ _id: 'lost' }).then(() => null, (x) => x);
    if (e) assert.equal(e.name, 'MongoNetworkError', `${e.name}: ${e.message}`);
    // The next pairing is with the other mongos, without a failed attempt first.
    await pcoll.insertOne({ _id: 'after-plain' });
    for (let i = 0; i < 5; i++) await coll.insertOne({ _id: `after${i}` });
    const after = await countsOf(own.mongos, 'insert');
    assert.equal(after[paired], null, 'the stopped mongos is gone');
    assert.ok(after[1 - paired] >= 6, `the other mongos took the writes: ${after}`);
  } finally {
    await plain.close();
    await client.close();
    await H.stopAllAndCheck();
    await own.stop();
  }
});

test('a commit retried after UnknownTransactionCommitResult carries its recoveryToken through the proxy to the other mongos', { skip }, async () => {
  const own = await startCluster();
  const proxy = await H.startProxy({ upstream: own.uri });
  const client = new MongoClient(proxy.uri(), { serverSelectionTimeoutMS: 15000, maxPoolSize: 1 });
  const coll = client.db('fw').collection('items');
  try {
    await coll.insertOne({ _id: 'warm' });
    const counts = await countsOf(own.mongos, 'insert');
    const paired = counts.findIndex((n) => n > 0);
    assert.ok(paired >= 0);
    // The paired mongos commits, then answers with a write concern error: the driver cannot
    // know the outcome (UnknownTransactionCommitResult) and retries the commit.
    const direct = new MongoClient(`mongodb://127.0.0.1:${own.mongos[paired]}/?directConnection=true`);
    await direct.db('admin').command({
      configureFailPoint: 'failCommand',
      mode: { times: 1 },
      data: { failCommands: ['commitTransaction'], writeConcernError: { code: 64, codeName: 'WriteConcernFailed', errmsg: 'waiting for replication timed out', errInfo: { wtimeout: true } } },
    });
    await direct.close();
    const session = client.startSession();
    session.startTransaction();
    await coll.insertMany(BOTH_SHARDS.map((d) => ({ _id: `${d._id}-rt` })), { session });
    const e = await session.commitTransaction().then(() => null, (x) => x);
    assert.ok(e && e.hasErrorLabel('UnknownTransactionCommitResult'), `the first commit's outcome is unknown: ${e && e.message}`);
    // The retry cannot reach the mongos that ran the transaction: only the token lets the
    // other one find the decision.
    await stopMongos(own.mongos[paired]);
    await session.commitTransaction();
    await session.endSession();
    assert.equal(await coll.countDocuments({ _id: /-rt$/ }), BOTH_SHARDS.length);
  } finally {
    await client.close();
    await H.stopAllAndCheck();
    await own.stop();
  }
});

test('pooled mode: a transaction is pinned to one pooled connection of one mongos', { skip }, async () => {
  const proxy = await H.startProxy({ upstream: cluster.uri, settings: { pool_mode: 'pooled', pool_size: 2 } });
  const client = new MongoClient(proxy.uri({}, { credentials: false }), { serverSelectionTimeoutMS: 10000, maxPoolSize: 8 });
  const coll = client.db('fw').collection('pooled');
  try {
    await coll.insertOne({ _id: 'warm' });
    await commandsPerMongos(cluster.mongos, ['insert', 'commitTransaction']);
    // Other clients' reads run beside the transaction on the pool's other connection.
    const session = client.startSession();
    const reads = Array.from({ length: 20 }, (_, i) => coll.findOne({ _id: `r${i}` }));
    await session.withTransaction(async () => {
      for (const d of BOTH_SHARDS) await coll.insertOne({ _id: `${d._id}-p` }, { session });
    });
    await Promise.all(reads);
    await session.endSession();
    const counts = await commandsPerMongos(cluster.mongos, ['insert', 'commitTransaction']);
    const used = counts.filter((n) => n.insert > 0 || n.commitTransaction > 0);
    assert.equal(used.length, 1, `one mongos saw the transaction: ${JSON.stringify(counts)}`);
    assert.equal(used[0].insert, BOTH_SHARDS.length);
    assert.equal(used[0].commitTransaction, 1);
    assert.equal(await coll.countDocuments({ _id: /-p$/ }), BOTH_SHARDS.length);
  } finally {
    await client.close();
  }
});

H.registerFinalChecks(test, [() => cluster && cluster.stop()]);
