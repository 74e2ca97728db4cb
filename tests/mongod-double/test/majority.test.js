'use strict';
// The majority commit point of the two-member set (lib/majority.js): the secondary's
// stopReplProducer fail point and --majority-lag-ms hold it back; readConcern majority reads
// and the secondary's reads see the data as of it; w: "majority" (and the implicit default)
// waits for it, wtimeout gives 64, a step-down 189; change streams return only what it
// covers; a forced step-down rolls back the writes above it, as a replica set rolls back
// w: 1 writes at a failover. Without lag nothing waits and every read is current.

const { test } = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const { startDouble, rawConnect, lsid, L } = require('./helpers');

const num = (v) => (v === undefined || v === null ? v : Number(v.valueOf()));
const sleep = (ms) => new Promise((r) => { setTimeout(r, ms); });

const stopRepl = (c, on) => c.command({ configureFailPoint: 'stopReplProducer', mode: on ? 'alwaysOn' : 'off', $db: 'admin' });
const ids = (r) => r.cursor.firstBatch.map((d) => (d._id && typeof d._id === 'object' ? num(d._id) : d._id)).sort();

test('without lag the commit point is the clock: majority reads see every write, w: majority does not wait', async () => {
  const d = await startDouble();
  try {
    const c = await rawConnect(d.port);
    const t0 = Date.now();
    const w = await c.command({ insert: 'm', documents: [{ _id: 1 }], writeConcern: { w: 'majority' }, $db: 'db' });
    assert.equal(num(w.ok), 1);
    assert.equal(w.writeConcernError, undefined);
    assert.ok(Date.now() - t0 < 1000);
    const r = await c.command({ find: 'm', filter: {}, readConcern: { level: 'majority' }, $db: 'db' });
    assert.deepEqual(ids(r), [1]);
    const h = await c.command({ hello: 1, $db: 'admin' });
    assert.deepEqual(h.lastWrite.majorityOpTime.ts, h.lastWrite.opTime.ts);
    c.close();
  } finally {
    await d.stop();
  }
});

test('stopReplProducer on the secondary: w: 1 writes are read at local only; majority and secondary reads stay at the commit point; w: majority waits', async () => {
  const d = await startDouble();
  try {
    const p = await rawConnect(d.port);
    const s = await rawConnect(d.secondaryPort);
    await p.command({ insert: 'm', documents: [{ _id: 'before' }], $db: 'db' });
    assert.equal(num((await stopRepl(s, true)).ok), 1);
    await p.command({ insert: 'm', documents: [{ _id: 'w1' }], writeConcern: { w: 1 }, $db: 'db' });
    assert.deepEqual(ids(await p.command({ find: 'm', filter: {}, $db: 'db' })), ['before', 'w1']);
    assert.deepEqual(ids(await p.command({ find: 'm', filter: {}, readConcern: { level: 'majority' }, $db: 'db' })), ['before']);
    const agg = await p.command({ aggregate: 'm', pipeline: [{ $match: {} }], cursor: {}, readConcern: { level: 'majority' }, $db: 'db' });
    assert.deepEqual(ids(agg), ['before']);
    const cnt = await p.command({ count: 'm', readConcern: { level: 'majority' }, $db: 'db' });
    assert.equal(num(cnt.n), 1);
    const sec = await s.command({ find: 'm', filter: {}, $readPreference: { mode: 'secondary' }, $db: 'db' });
    assert.deepEqual(ids(sec), ['before']);
    const h = await p.command({ hello: 1, $db: 'admin' });
    assert.ok(h.lastWrite.majorityOpTime.ts.lt(h.lastWrite.opTime.ts), 'hello: majorityOpTime behind opTime');
    // wtimeout: the write is done, its acknowledgement says replication timed out.
    const t0 = Date.now();
    const wt = await p.command({ insert: 'm', documents: [{ _id: 'wt' }], writeConcern: { w: 'majority', wtimeout: 300 }, $db: 'db' });
    assert.ok(Date.now() - t0 >= 250);
    assert.equal(num(wt.ok), 1);
    assert.equal(num(wt.n), 1);
    assert.equal(num(wt.writeConcernError.code), 64);
    assert.equal(wt.writeConcernError.codeName, 'WriteConcernFailed');
    assert.deepEqual(wt.writeConcernError.errInfo, { wtimeout: true });
    // Without wtimeout it waits; the secondary applying again releases it.
    let done = null;
    const pending = p.command({ insert: 'm', documents: [{ _id: 'wm' }], writeConcern: { w: 'majority' }, $db: 'db' }).then((r) => { done = r; });
    await sleep(300);
    assert.equal(done, null, 'w: majority waits while the secondary is stopped');
    const s2 = await rawConnect(d.secondaryPort);
    await stopRepl(s2, false);
    await pending;
    assert.equal(num(done.ok), 1);
    assert.equal(done.writeConcernError, undefined);
    assert.deepEqual(ids(await p.command({ find: 'm', filter: {}, readConcern: { level: 'majority' }, $db: 'db' })), ['before', 'w1', 'wm', 'wt']);
    p.close();
    s.close();
    s2.close();
  } finally {
    await d.stop();
  }
});

test('a forced step-down rolls back the writes above the commit point; a waiting w: majority write gets 189; a retry runs again', async () => {
  const d = await startDouble();
  try {
    const p = await rawConnect(d.port);
    const s = await rawConnect(d.secondaryPort);
    await p.command({ insert: 'r', documents: [{ _id: 'kept', v: 1 }], $db: 'db' });
    await stopRepl(s, true);
    await p.command({ insert: 'r', documents: [{ _id: 'lost' }], writeConcern: { w: 1 }, $db: 'db' });
    await p.command({ update: 'r', updates: [{ q: { _id: 'kept' }, u: { $set: { v: 2 } } }], writeConcern: { w: 1 }, $db: 'db' });
    // A transaction committed with w: 1.
    const id = lsid();
    await p.command({ insert: 'r', documents: [{ _id: 'txn' }], lsid: id, txnNumber: L(1), startTransaction: true, autocommit: false, $db: 'db' });
    const cm = await p.command({ commitTransaction: 1, lsid: id, txnNumber: L(1), autocommit: false, writeConcern: { w: 1 }, $db: 'admin' });
    assert.equal(num(cm.ok), 1);
    // A retryable write waiting for w: majority.
    const rid = lsid();
    const p2 = await rawConnect(d.port);
    const waiting = p2.command({ insert: 'r', documents: [{ _id: 'retry' }], lsid: rid, txnNumber: L(1), writeConcern: { w: 'majority' }, $db: 'db' });
    await sleep(200);
    // Unforced: the secondary never catches up.
    const nf = await p.command({ replSetStepDown: 5, secondaryCatchUpPeriodSecs: 1, $db: 'admin' });
    assert.equal(num(nf.code), 262, JSON.stringify(nf));
    const sd = await p.command({ replSetStepDown: 5, force: true, $db: 'admin' });
    assert.equal(num(sd.ok), 1, JSON.stringify(sd));
    const wr = await waiting;
    assert.equal(num(wr.ok), 1);
    assert.equal(num(wr.writeConcernError.code), 189, JSON.stringify(wr));
    assert.equal(wr.writeConcernError.codeName, 'PrimarySteppedDown');
    assert.ok(wr.errorLabels.includes('RetryableWriteError'));
    // The other member is primary now, with the data at the commit point.
    const np = await rawConnect(d.secondaryPort);
    const h = await np.command({ hello: 1, $db: 'admin' });
    assert.equal(h.isWritablePrimary, true);
    const all = await np.command({ find: 'r', filter: {}, $db: 'db' });
    assert.deepEqual(all.cursor.firstBatch.map((x) => [x._id, num(x.v)]), [['kept', 1]]);
    // The commit of the rolled-back transaction is gone; the retryable write runs again.
    const cm2 = await np.command({ commitTransaction: 1, lsid: id, txnNumber: L(1), autocommit: false, $db: 'admin' });
    assert.equal(num(cm2.code), 251, JSON.stringify(cm2));
    const again = await np.command({ insert: 'r', documents: [{ _id: 'retry' }], lsid: rid, txnNumber: L(1), $db: 'db' });
    assert.equal(num(again.n), 1);
    assert.deepEqual(ids(await np.command({ find: 'r', filter: {}, readConcern: { level: 'majority' }, $db: 'db' })), ['kept', 'retry']);
    // Replication runs again: w: majority does not wait.
    const t0 = Date.now();
    const w = await np.command({ insert: 'r', documents: [{ _id: 'after' }], writeConcern: { w: 'majority', wtimeout: 5000 }, $db: 'db' });
    assert.equal(w.writeConcernError, undefined);
    assert.ok(Date.now() - t0 < 2000);
    for (const c of [p, p2, s, np]) c.close();
  } finally {
    await d.stop();
  }
});

test('--majority-lag-ms: the commit point follows each write after the lag; change streams see a change once it is majority-committed', async () => {
  const d = await startDouble(['--majority-lag-ms', '400']);
  const client = await new MongoClient(`mongodb://127.0.0.1:${d.port}/?directConnection=true`).connect();
  try {
    const coll = client.db('db').collection('lag');
    const stream = coll.watch();
    const first = stream.next();
    await sleep(200);
    const c = await rawConnect(d.port);
    const t0 = Date.now();
    await c.command({ insert: 'lag', documents: [{ _id: 1 }], writeConcern: { w: 1 }, $db: 'db' });
    assert.deepEqual(ids(await c.command({ find: 'lag', filter: {}, readConcern: { level: 'majority' }, $db: 'db' })), []);
    const ev = await first;
    assert.ok(Date.now() - t0 >= 300, `the change after the lag, not before (${Date.now() - t0} ms)`);
    assert.equal(num(ev.documentKey._id), 1);
    assert.deepEqual(ids(await c.command({ find: 'lag', filter: {}, readConcern: { level: 'majority' }, $db: 'db' })), [1]);
    // The implicit default write concern (majority on 7.0) waits for the lag.
    const t1 = Date.now();
    await c.command({ insert: 'lag', documents: [{ _id: 2 }], $db: 'db' });
    assert.ok(Date.now() - t1 >= 300, `waited ${Date.now() - t1} ms`);
    const t2 = Date.now();
    await c.command({ insert: 'lag', documents: [{ _id: 3 }], writeConcern: { w: 1 }, $db: 'db' });
    assert.ok(Date.now() - t2 < 300);
    // A lagging secondary catches up within the catch-up period: no rollback.
    const sd = await c.command({ replSetStepDown: 10, secondaryCatchUpPeriodSecs: 5, $db: 'admin' });
    assert.equal(num(sd.ok), 1, JSON.stringify(sd));
    const np = await rawConnect(d.secondaryPort);
    assert.deepEqual(ids(await np.command({ find: 'lag', filter: {}, $db: 'db' })), [1, 2, 3]);
    await stream.close();
    c.close();
    np.close();
  } finally {
    await client.close();
    await d.stop();
  }
});

test('a transaction takes readConcern local, majority or snapshot on its first statement only', async () => {
  const d = await startDouble();
  try {
    const c = await rawConnect(d.port);
    const id = lsid();
    let n = 0;
    for (const level of ['local', 'majority', 'snapshot']) {
      n++;
      const r = await c.command({ find: 't', filter: {}, readConcern: { level }, lsid: id, txnNumber: L(n), startTransaction: true, autocommit: false, $db: 'db' });
      assert.equal(num(r.ok), 1, `${level}: ${JSON.stringify(r)}`);
      const again = await c.command({ find: 't', filter: {}, readConcern: { level }, lsid: id, txnNumber: L(n), autocommit: false, $db: 'db' });
      assert.equal(num(again.code), 72, JSON.stringify(again));
      assert.match(again.errmsg, /Only the first command in a transaction may specify a readConcern/);
      await c.command({ abortTransaction: 1, lsid: id, txnNumber: L(n), autocommit: false, $db: 'admin' });
    }
    for (const level of ['linearizable', 'available']) {
      n++;
      const r = await c.command({ find: 't', filter: {}, readConcern: { level }, lsid: id, txnNumber: L(n), startTransaction: true, autocommit: false, $db: 'db' });
      assert.equal(num(r.code), 72, `${level}: ${JSON.stringify(r)}`);
      assert.match(r.errmsg, /must be either 'local' \(default\), 'majority' or 'snapshot' in order to run in a transaction/);
    }
    c.close();
  } finally {
    await d.stop();
  }
});

test('--majority-lag-ms goes with the two-member set only', async () => {
  const { spawnSync } = require('child_process');
  const path = require('path');
  const bin = path.join(__dirname, '..', 'mongod-double');
  for (const extra of [['--single-member'], ['--standalone'], ['--sharded'], []]) {
    const args = ['--port', '0', '--majority-lag-ms', extra.length ? '5' : 'x', ...extra];
    const r = spawnSync(process.execPath, [bin, ...args], { encoding: 'utf8', timeout: 10000 });
    assert.notEqual(r.status, 0, args.join(' '));
    assert.match(r.stderr, /--majority-lag-ms/);
  }
});
