'use strict';
// Snapshot isolation, first-writer-wins conflicts, blocking of non-transactional writers, the
// session state machine with its error codes and labels, retryable-write replay and the
// transaction lifetime reaper.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const { startDouble, rawConnect, lsid, L } = require('./helpers');

let d;
let client;
let db;
let raw;

before(async () => {
  d = await startDouble(['--txn-lifetime', '2']);
  client = new MongoClient(d.uri(), { serverSelectionTimeoutMS: 5000 });
  await client.connect();
  db = client.db('txn');
  raw = await rawConnect(d.port);
});
after(async () => {
  raw.close();
  await client.close();
  assert.equal(await d.stop(), 0);
});

const T = (s, n, extra = {}) => Object.assign({ lsid: s, txnNumber: L(n), autocommit: false }, extra);

test('reads see the snapshot plus own writes; nothing leaks before commit', async () => {
  const coll = db.collection('iso');
  await coll.insertOne({ _id: 1, v: 1 });
  const s = client.startSession();
  s.startTransaction();
  await coll.updateOne({ _id: 1 }, { $set: { v: 2 } }, { session: s });
  await coll.insertOne({ _id: 2 }, { session: s });
  assert.equal((await coll.findOne({ _id: 1 }, { session: s })).v, 2);
  assert.equal((await coll.findOne({ _id: 1 })).v, 1);
  assert.equal(await coll.countDocuments({}), 1);
  await coll.insertOne({ _id: 3 }); // committed after the snapshot: invisible inside
  assert.equal(await coll.countDocuments({}, { session: s }), 2);
  await s.commitTransaction();
  assert.equal(await coll.countDocuments({}), 3);
  assert.equal((await coll.findOne({ _id: 1 })).v, 2);
  await s.endSession();
});

test('first writer wins: two inserts of one _id conflict with WriteConflict', async () => {
  const coll = db.collection('fww');
  const s1 = client.startSession();
  const s2 = client.startSession();
  s1.startTransaction();
  s2.startTransaction();
  await coll.insertOne({ _id: 'k', by: 1 }, { session: s1 });
  await assert.rejects(coll.insertOne({ _id: 'k', by: 2 }, { session: s2 }), (e) => {
    assert.equal(e.code, 112);
    assert.ok(e.hasErrorLabel('TransientTransactionError'));
    return true;
  });
  await s2.abortTransaction();
  await s1.commitTransaction();
  assert.equal((await coll.findOne({ _id: 'k' })).by, 1);
  await s1.endSession();
  await s2.endSession();
});

test('writing a document committed by someone else after the snapshot conflicts', async () => {
  const coll = db.collection('snapconf');
  await coll.insertOne({ _id: 1, v: 0 });
  const s = client.startSession();
  s.startTransaction();
  await coll.findOne({ _id: 1 }, { session: s }); // snapshot taken
  await coll.updateOne({ _id: 1 }, { $set: { v: 'outside' } });
  await assert.rejects(coll.updateOne({ _id: 1 }, { $set: { v: 'inside' } }, { session: s }), (e) => e.code === 112);
  await s.abortTransaction().catch(() => {});
  await s.endSession();
});

test('a non-transactional write to a document held by a transaction waits for it', async () => {
  const coll = db.collection('wait');
  await coll.insertOne({ _id: 1, n: 0 });
  const s = client.startSession();
  s.startTransaction();
  await coll.updateOne({ _id: 1 }, { $inc: { n: 1 } }, { session: s });
  let done = false;
  const outside = coll.updateOne({ _id: 1 }, { $inc: { n: 10 } }).then((r) => { done = true; return r; });
  await new Promise((r) => setTimeout(r, 150));
  assert.equal(done, false, 'outside write did not wait');
  await assert.rejects(coll.updateOne({ _id: 1 }, { $inc: { n: 100 } }, { maxTimeMS: 100 }), (e) => {
    assert.equal(e.code, 50);
    assert.ok(!e.hasErrorLabel('TransientTransactionError'));
    return true;
  });
  await s.commitTransaction();
  await outside;
  assert.equal((await coll.findOne({ _id: 1 })).n, 11);
  await s.endSession();
});

test('an upsert waiting on a transaction that inserted the key becomes an update', async () => {
  const coll = db.collection('upsrace');
  const s = client.startSession();
  s.startTransaction();
  await coll.updateOne({ _id: 'seq' }, { $inc: { n: 1 } }, { session: s, upsert: true });
  const outside = coll.updateOne({ _id: 'seq' }, { $inc: { n: 1 } }, { upsert: true });
  await new Promise((r) => setTimeout(r, 100));
  await s.commitTransaction();
  const r = await outside;
  assert.equal(r.matchedCount, 1);
  assert.equal(r.upsertedCount, 0);
  assert.equal((await coll.findOne({ _id: 'seq' })).n, 2);
  const fam = await coll.findOneAndUpdate({ _id: 'seq' }, { $inc: { n: 1 } }, { upsert: true, returnDocument: 'after' });
  assert.equal(fam.n, 3);
  await s.endSession();
});

test('implicit collection creation in a transaction is invisible until commit', async () => {
  const s = client.startSession();
  s.startTransaction();
  await db.collection('implicit').insertOne({ _id: 1 }, { session: s });
  const names = async () => (await db.listCollections({}, { nameOnly: true }).toArray()).map((c) => c.name);
  assert.ok(!(await names()).includes('implicit'));
  await s.commitTransaction();
  assert.ok((await names()).includes('implicit'));
  await s.endSession();
});

test('duplicate key inside a transaction is a write error and aborts the transaction', async () => {
  await raw.command({ insert: 'dupk', documents: [{ _id: 1 }], $db: 'txn' });
  const s = lsid();
  const r1 = await raw.command(Object.assign({ insert: 'dupk', documents: [{ _id: 1 }], $db: 'txn', startTransaction: true }, T(s, 1)));
  assert.equal(r1.ok.valueOf(), 1);
  assert.equal(r1.writeErrors[0].code.valueOf(), 11000);
  assert.equal(r1.errorLabels, undefined);
  const r2 = await raw.command(Object.assign({ insert: 'dupk', documents: [{ _id: 2 }], $db: 'txn' }, T(s, 1)));
  assert.equal(r2.code.valueOf(), 251);
  assert.deepEqual(r2.errorLabels, ['TransientTransactionError']);
});

test('state machine codes: 225, 117, 251, 256, commit twice, 263, 50768, 72', async () => {
  const s = lsid();
  const cmd = (c, n, extra) => raw.command(Object.assign(c, { $db: 'txn' }, T(s, n, extra)));
  assert.equal((await cmd({ insert: 'sm', documents: [{ _id: 1 }] }, 5, { startTransaction: true })).ok.valueOf(), 1);
  assert.equal((await cmd({ insert: 'sm', documents: [{ _id: 2 }] }, 5, { startTransaction: true })).code.valueOf(), 117);
  assert.equal((await cmd({ find: 'sm' }, 4)).code.valueOf(), 225);
  assert.equal((await cmd({ find: 'sm' }, 5, { readConcern: { level: 'snapshot' } })).code.valueOf(), 72);
  assert.equal((await cmd({ count: 'sm' }, 5)).code.valueOf(), 263);
  assert.equal((await cmd({ insert: 'sm', documents: [{}], writeConcern: { w: 1 } }, 5)).code.valueOf(), 72);
  assert.equal((await raw.command(Object.assign({ commitTransaction: 1, $db: 'admin' }, T(s, 5)))).ok.valueOf(), 1);
  assert.equal((await raw.command(Object.assign({ commitTransaction: 1, $db: 'admin' }, T(s, 5)))).ok.valueOf(), 1);
  assert.equal((await raw.command(Object.assign({ abortTransaction: 1, $db: 'admin' }, T(s, 5)))).code.valueOf(), 256);
  assert.equal((await cmd({ find: 'sm' }, 5)).code.valueOf(), 256);
  assert.equal((await cmd({ find: 'sm' }, 6)).code.valueOf(), 251);
  // A higher number aborts the open transaction.
  await cmd({ insert: 'sm', documents: [{ _id: 10 }] }, 7, { startTransaction: true });
  await cmd({ find: 'sm' }, 8, { startTransaction: true });
  const r = await raw.command(Object.assign({ commitTransaction: 1, $db: 'admin' }, T(s, 7)));
  assert.equal(r.code.valueOf(), 225);
  assert.equal((await raw.command({ find: 'sm', filter: { _id: 10 }, $db: 'txn' })).cursor.firstBatch.length, 0);
  // Validation without a transaction.
  assert.equal((await raw.command({ find: 'sm', lsid: lsid(), txnNumber: L(1), $db: 'txn' })).code.valueOf(), 50768);
  assert.equal((await raw.command({ find: 'sm', txnNumber: L(1), $db: 'txn' })).code.valueOf(), 72);
  assert.equal((await raw.command({ find: 'sm', lsid: lsid(), autocommit: false, $db: 'txn' })).code.valueOf(), 72);
  assert.equal((await raw.command({ find: 'sm', lsid: lsid(), txnNumber: L(1), autocommit: true, $db: 'txn' })).code.valueOf(), 72);
  const ab = await raw.command({ abortTransaction: 1, lsid: lsid(), txnNumber: L(1), autocommit: false, $db: 'admin' });
  assert.equal(ab.code.valueOf(), 251);
  const unknown = await raw.command({ frobnicate: 1, $db: 'admin' });
  assert.equal(unknown.code.valueOf(), 59);
  assert.equal(unknown.errmsg, "no such command: 'frobnicate'");
});

test('retryable writes are answered from their first result without re-executing', async () => {
  const s = lsid();
  const w = (doc) => raw.command({ insert: 'retry', documents: [doc], lsid: s, txnNumber: L(1), $db: 'txn' });
  const a = await w({ _id: 1 });
  const b = await w({ _id: 2 });
  assert.equal(a.n.valueOf(), 1);
  assert.equal(b.n.valueOf(), 1);
  const found = await raw.command({ find: 'retry', $db: 'txn' });
  assert.equal(found.cursor.firstBatch.length, 1);
  const old = await raw.command({ insert: 'retry', documents: [{ _id: 3 }], lsid: s, txnNumber: L(0), $db: 'txn' });
  assert.equal(old.code.valueOf(), 225);
});

test('a retried batch skips the statements that succeeded and re-runs the failed one', async () => {
  await raw.command({ insert: 'partial', documents: [{ _id: 2 }], $db: 'txn' });
  const s = lsid();
  const cmd = { insert: 'partial', documents: [{ _id: 1 }, { _id: 2 }, { _id: 3 }], lsid: s, txnNumber: L(1), $db: 'txn' };
  const first = await raw.command(cmd);
  assert.equal(first.n.valueOf(), 1);
  assert.equal(first.writeErrors[0].index.valueOf(), 1);
  await raw.command({ delete: 'partial', deletes: [{ q: { _id: 2 }, limit: 1 }], $db: 'txn' });
  const retry = await raw.command(cmd);
  assert.equal(retry.n.valueOf(), 3);
  assert.equal(retry.writeErrors, undefined);
  const again = await raw.command(cmd);
  assert.equal(again.n.valueOf(), 3);
  assert.equal((await raw.command({ count: 'partial', $db: 'txn' })).n.valueOf(), 3);
});

test('the reaper aborts transactions older than --txn-lifetime', async () => {
  const s = lsid();
  await raw.command(Object.assign({ insert: 'reap', documents: [{ _id: 1 }], $db: 'txn', startTransaction: true }, T(s, 1)));
  await new Promise((r) => setTimeout(r, 3200));
  const r = await raw.command(Object.assign({ insert: 'reap', documents: [{ _id: 2 }], $db: 'txn' }, T(s, 1)));
  assert.equal(r.code.valueOf(), 251);
  const c = await raw.command(Object.assign({ commitTransaction: 1, $db: 'admin' }, T(s, 1)));
  assert.equal(c.code.valueOf(), 251);
});

test('withTransaction from 16 sessions moving money keeps the total', async () => {
  const coll = db.collection('bank');
  await coll.insertMany(Array.from({ length: 8 }, (_, i) => ({ _id: i, bal: 100 })));
  const workers = Array.from({ length: 16 }, async (_, w) => {
    const s = client.startSession();
    for (let k = 0; k < 10; k++) {
      const from = (w + k) % 8;
      const to = (w + k + 3) % 8;
      await s.withTransaction(async () => {
        await coll.updateOne({ _id: from }, { $inc: { bal: -1 } }, { session: s });
        await coll.updateOne({ _id: to }, { $inc: { bal: 1 } }, { session: s });
      });
    }
    await s.endSession();
  });
  await Promise.all(workers);
  const docs = await coll.find().toArray();
  assert.equal(docs.reduce((a, x) => a + x.bal, 0), 800);
});

test('a statement still running when the reaper aborts its transaction gets 290; commit afterwards 251', async () => {
  const d1 = await startDouble(['--txn-lifetime', '1']);
  const c = await rawConnect(d1.port);
  const c2 = await rawConnect(d1.port);
  try {
    const s = lsid();
    const start = await c.command(Object.assign({ insert: 'life', documents: [{ _id: 1 }], $db: 'txn', startTransaction: true }, T(s, 1)));
    assert.equal(start.ok.valueOf(), 1);
    const fp = await c2.command({
      configureFailPoint: 'failCommand', mode: { times: 1 },
      data: { failCommands: ['find'], blockConnection: true, blockTimeMS: 6000 }, $db: 'admin',
    });
    assert.equal(fp.ok.valueOf(), 1);
    const t0 = Date.now();
    const r = await c.command(Object.assign({ find: 'life', filter: {}, $db: 'txn' }, T(s, 1)), {});
    const took = Date.now() - t0;
    assert.equal(r.ok.valueOf(), 0, JSON.stringify(r));
    assert.equal(r.code.valueOf(), 290);
    assert.equal(r.codeName, 'TransactionExceededLifetimeLimitSeconds');
    assert.equal(r.errorLabels, undefined, '290 is not a transient error');
    assert.ok(took < 4000, `answered when the reaper struck, not when the block ended (${took} ms)`);
    const next = await c.command(Object.assign({ insert: 'life', documents: [{ _id: 2 }], $db: 'txn' }, T(s, 1)));
    assert.equal(next.code.valueOf(), 251);
    const commit = await c.command(Object.assign({ commitTransaction: 1, $db: 'admin' }, T(s, 1)));
    assert.equal(commit.code.valueOf(), 251);
    const cnt = await c.command({ count: 'life', $db: 'txn' });
    assert.equal(cnt.n.valueOf(), 0, 'nothing of the expired transaction is visible');
    // A commit held by a fail point while the transaction expires is not acknowledged.
    const s2 = lsid();
    await c.command(Object.assign({ insert: 'life', documents: [{ _id: 3 }], $db: 'txn', startTransaction: true }, T(s2, 1)));
    await c2.command({
      configureFailPoint: 'failCommand', mode: { times: 1 },
      data: { failCommands: ['commitTransaction'], blockConnection: true, blockTimeMS: 2500 }, $db: 'admin',
    });
    const late = await c.command(Object.assign({ commitTransaction: 1, $db: 'admin' }, T(s2, 1)));
    assert.equal(late.code.valueOf(), 251, JSON.stringify(late));
    assert.equal((await c.command({ count: 'life', $db: 'txn' })).n.valueOf(), 0);
  } finally {
    c.close();
    c2.close();
    assert.equal(await d1.stop(), 0);
  }
});
