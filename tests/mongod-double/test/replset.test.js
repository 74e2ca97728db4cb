'use strict';
// The two-member replica set: a secondary on a second port of the same process, sharing the
// primary's committed data. Its hello, reads with a secondary read preference (raw and through
// the Node.js driver), mongod's refusals on a secondary (10107 for writes and transactions,
// 13435 for reads without a secondary read preference), per-member cursors, fail points and
// counts, auth on both ports, --single-member, write concern w:2, and the transactions spec
// test that needs a secondary, through the conformance runner.

const { test } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('fs');
const path = require('path');
const { spawnSync } = require('child_process');
const { MongoClient } = require('mongodb');
const { startDouble, rawConnect, lsid, L } = require('./helpers');

const REPO = path.resolve(__dirname, '..', '..', '..');
const SPEC = path.resolve(process.env.CONFORMANCE_DATA || path.join(REPO, '..', 'shared', 'conformance'), 'transactions', 'transaction-options.json');
const num = (v) => (v === undefined || v === null ? v : Number(v.valueOf()));

test('the double prints the primary port then the secondary port; the secondary answers hello as a secondary', async () => {
  const d = await startDouble();
  try {
    assert.ok(d.secondaryPort > 0 && d.secondaryPort !== d.port, `second stdout line is the secondary's port (${d.secondaryPort})`);
    const p = `127.0.0.1:${d.port}`;
    const s = `127.0.0.1:${d.secondaryPort}`;
    const raw = await rawConnect(d.secondaryPort);
    const h = await raw.command({ hello: 1, helloOk: true, $db: 'admin' });
    assert.deepEqual(Object.keys(h).slice(0, 10), ['helloOk', 'topologyVersion', 'hosts', 'setName', 'setVersion', 'isWritablePrimary', 'secondary', 'primary', 'me', 'lastWrite']);
    assert.deepEqual(h.hosts, [p, s]);
    assert.equal(h.setName, 'rs0');
    assert.equal(h.isWritablePrimary, false);
    assert.equal(h.secondary, true);
    assert.equal(h.primary, p);
    assert.equal(h.me, s);
    assert.equal(h.electionId, undefined, 'only the primary has an electionId');
    assert.equal(h.readOnly, false);
    assert.ok(h.$clusterTime && h.operationTime);
    const legacy = await raw.command({ isMaster: 1, $db: 'admin' });
    assert.equal(legacy.ismaster, false);
    assert.equal(legacy.secondary, true);
    const st = await raw.command({ replSetGetStatus: 1, $db: 'admin' });
    assert.equal(num(st.myState), 2);
    assert.deepEqual(st.members.map((m) => [m.name, m.stateStr, !!m.self]), [[p, 'PRIMARY', false], [s, 'SECONDARY', true]]);
    raw.close();
    const rp = await rawConnect(d.port);
    const ph = await rp.command({ hello: 1, $db: 'admin' });
    assert.deepEqual(ph.hosts, [p, s]);
    assert.equal(ph.me, p);
    assert.equal(ph.isWritablePrimary, true);
    assert.equal(ph.secondary, false);
    assert.ok(ph.electionId);
    rp.close();
  } finally {
    assert.equal(await d.stop(), 0);
  }
});

test('a secondary refuses writes and DDL with 10107, reads without a secondary read preference with 13435, transactions with 10107', async () => {
  const d = await startDouble();
  try {
    const raw = await rawConnect(d.secondaryPort);
    const notPrimary = (r, what) => {
      assert.equal(num(r.ok), 0, what);
      assert.equal(num(r.code), 10107, what);
      assert.equal(r.codeName, 'NotWritablePrimary', what);
      assert.equal(r.errmsg, 'not primary', what);
    };
    const rs = { $readPreference: { mode: 'secondary' } };
    notPrimary(await raw.command({ insert: 'c', documents: [{ _id: 1 }], $db: 'x' }), 'insert');
    notPrimary(await raw.command({ insert: 'c', documents: [{ _id: 1 }], $db: 'x', ...rs }), 'insert with $readPreference');
    notPrimary(await raw.command({ update: 'c', updates: [{ q: {}, u: { $set: { a: 1 } } }], $db: 'x' }), 'update');
    notPrimary(await raw.command({ delete: 'c', deletes: [{ q: {}, limit: 0 }], $db: 'x' }), 'delete');
    notPrimary(await raw.command({ findAndModify: 'c', query: {}, remove: true, $db: 'x', ...rs }), 'findAndModify');
    notPrimary(await raw.command({ create: 'c2', $db: 'x' }), 'create');
    notPrimary(await raw.command({ drop: 'c', $db: 'x' }), 'drop');
    notPrimary(await raw.command({ createIndexes: 'c', indexes: [{ key: { a: 1 }, name: 'a_1' }], $db: 'x' }), 'createIndexes');
    // A retryable write gets the RetryableWriteError label, as from a primary that stepped down.
    const rw = await raw.command({ insert: 'c', documents: [{ _id: 1 }], lsid: lsid(), txnNumber: L(1), $db: 'x' });
    notPrimary(rw, 'retryable insert');
    assert.deepEqual(rw.errorLabels, ['RetryableWriteError']);
    // Reads: the read preference decides (OP_MSG without $readPreference means primary).
    for (const pref of [undefined, { mode: 'primary' }]) {
      const r = await raw.command({ find: 'c', $db: 'x', ...(pref ? { $readPreference: pref } : {}) });
      assert.equal(num(r.code), 13435);
      assert.equal(r.codeName, 'NotPrimaryNoSecondaryOk');
      assert.equal(r.errmsg, 'not primary and secondaryOk=false');
    }
    for (const mode of ['secondary', 'secondaryPreferred', 'primaryPreferred', 'nearest']) {
      const r = await raw.command({ find: 'c', $db: 'x', $readPreference: { mode } });
      assert.equal(num(r.ok), 1, mode);
    }
    // Transactions run on the primary only: every statement, commit and abort get 10107.
    const id = lsid();
    const t1 = await raw.command({ find: 'c', $db: 'x', lsid: id, txnNumber: L(1), startTransaction: true, autocommit: false, ...rs });
    notPrimary(t1, 'find in a transaction');
    assert.deepEqual(t1.errorLabels, ['TransientTransactionError']);
    const t2 = await raw.command({ insert: 'c', documents: [{}], $db: 'x', lsid: id, txnNumber: L(2), startTransaction: true, autocommit: false });
    notPrimary(t2, 'insert in a transaction');
    const c = await raw.command({ commitTransaction: 1, $db: 'admin', lsid: id, txnNumber: L(2), autocommit: false });
    notPrimary(c, 'commitTransaction');
    assert.deepEqual(c.errorLabels, ['RetryableWriteError']);
    notPrimary(await raw.command({ abortTransaction: 1, $db: 'admin', lsid: id, txnNumber: L(2), autocommit: false }), 'abortTransaction');
    // Commands any member runs.
    for (const cmd of [{ ping: 1 }, { buildInfo: 1 }, { serverStatus: 1 }, { endSessions: [id] }]) {
      assert.equal(num((await raw.command({ ...cmd, $db: 'admin' })).ok), 1, Object.keys(cmd)[0]);
    }
    const ss = await raw.command({ serverStatus: 1, $db: 'admin' });
    assert.equal(ss.host, `127.0.0.1:${d.secondaryPort}`);
    raw.close();
    // Nothing reached the data.
    const rp = await rawConnect(d.port);
    const f = await rp.command({ find: 'c', $db: 'x' });
    assert.deepEqual(f.cursor.firstBatch, []);
    rp.close();
  } finally {
    assert.equal(await d.stop(), 0);
  }
});

test('a secondary serves the committed data to reads: find/getMore, aggregate, count, distinct, listCollections, listIndexes', async () => {
  const d = await startDouble();
  try {
    const p = await rawConnect(d.port);
    const docs = Array.from({ length: 5 }, (_, i) => ({ _id: i, k: i % 2 }));
    assert.equal(num((await p.command({ insert: 'c', documents: docs, $db: 'x' })).n), 5);
    await p.command({ createIndexes: 'c', indexes: [{ key: { k: 1 }, name: 'k_1' }], $db: 'x' });
    // An uncommitted transaction's write is not visible on the secondary.
    const id = lsid();
    const t = await p.command({ insert: 'c', documents: [{ _id: 99 }], $db: 'x', lsid: id, txnNumber: L(1), startTransaction: true, autocommit: false });
    assert.equal(num(t.ok), 1);
    const s = await rawConnect(d.secondaryPort);
    const rs = { $readPreference: { mode: 'secondary' } };
    const f = await s.command({ find: 'c', sort: { _id: 1 }, batchSize: 2, $db: 'x', ...rs });
    assert.deepEqual(f.cursor.firstBatch.map((x) => num(x._id)), [0, 1]);
    const g = await s.command({ getMore: f.cursor.id, collection: 'c', $db: 'x' });
    assert.deepEqual(g.cursor.nextBatch.map((x) => num(x._id)), [2, 3, 4]);
    // Cursors belong to the member that opened them.
    const f2 = await s.command({ find: 'c', batchSize: 1, $db: 'x', ...rs });
    const onPrimary = await p.command({ getMore: f2.cursor.id, collection: 'c', $db: 'x' });
    assert.equal(num(onPrimary.code), 43);
    assert.equal(num((await s.command({ killCursors: 'c', cursors: [f2.cursor.id], $db: 'x' })).ok), 1);
    const a = await s.command({ aggregate: 'c', pipeline: [{ $group: { _id: '$k', n: { $sum: 1 } } }, { $sort: { _id: 1 } }], cursor: {}, $db: 'x', ...rs });
    assert.deepEqual(a.cursor.firstBatch.map((x) => [num(x._id), num(x.n)]), [[0, 3], [1, 2]]);
    assert.equal(num((await s.command({ count: 'c', query: { k: 1 }, $db: 'x', ...rs })).n), 2);
    assert.deepEqual((await s.command({ distinct: 'c', key: 'k', $db: 'x', ...rs })).values.map(num).sort(), [0, 1]);
    const lc = await s.command({ listCollections: 1, $db: 'x', ...rs });
    assert.deepEqual(lc.cursor.firstBatch.map((x) => x.name), ['c']);
    const li = await s.command({ listIndexes: 'c', $db: 'x', ...rs });
    assert.deepEqual(li.cursor.firstBatch.map((x) => x.name).sort(), ['_id_', 'k_1']);
    // Committed on the primary: visible on the secondary at once (no replication lag).
    assert.equal(num((await p.command({ commitTransaction: 1, $db: 'admin', lsid: id, txnNumber: L(1), autocommit: false })).ok), 1);
    const after = await s.command({ find: 'c', filter: { _id: 99 }, $db: 'x', ...rs });
    assert.equal(after.cursor.firstBatch.length, 1);
    // Counts are per member.
    const st = await s.command({ doubleStats: 1, $db: 'admin' });
    assert.equal(st.commands.insert, undefined);
    assert.ok(num(st.commands.find) >= 3);
    s.close();
    p.close();
  } finally {
    assert.equal(await d.stop(), 0);
  }
});

test('fail points are per member', async () => {
  const d = await startDouble();
  try {
    const p = await rawConnect(d.port);
    const s = await rawConnect(d.secondaryPort);
    const rs = { $readPreference: { mode: 'secondary' } };
    await s.command({ configureFailPoint: 'failCommand', mode: { times: 1 }, data: { failCommands: ['find'], errorCode: 91 }, $db: 'admin' });
    assert.equal(num((await p.command({ find: 'c', $db: 'x' })).ok), 1, 'the primary is not affected');
    assert.equal(num((await s.command({ find: 'c', $db: 'x', ...rs })).code), 91);
    assert.equal(num((await s.command({ find: 'c', $db: 'x', ...rs })).ok), 1);
    s.close();
    p.close();
  } finally {
    await d.stop();
  }
});

test('Node.js driver: readPreference=secondary reads from the secondary, writes go to the primary; direct writes to the secondary fail with 10107', async () => {
  const d = await startDouble();
  try {
    const started = [];
    const c = new MongoClient(`mongodb://127.0.0.1:${d.port}/?replicaSet=rs0&readPreference=secondary`, { serverSelectionTimeoutMS: 5000, monitorCommands: true });
    c.on('commandStarted', (e) => started.push([e.commandName, e.address]));
    await c.connect();
    const coll = c.db('x').collection('c');
    await coll.insertMany([{ _id: 1, a: 'x' }, { _id: 2, a: 'y' }, { _id: 3, a: 'y' }]);
    assert.deepEqual(await coll.find({}, { batchSize: 1, sort: { _id: 1 } }).toArray(), [{ _id: 1, a: 'x' }, { _id: 2, a: 'y' }, { _id: 3, a: 'y' }]);
    assert.equal(await coll.countDocuments({ a: 'y' }), 2);
    assert.deepEqual((await coll.distinct('a')).sort(), ['x', 'y']);
    assert.deepEqual((await c.db('x').listCollections().toArray()).map((x) => x.name), ['c']);
    const sec = `127.0.0.1:${d.secondaryPort}`;
    const pri = `127.0.0.1:${d.port}`;
    for (const [name, addr] of started) {
      if (name === 'insert') assert.equal(addr, pri, 'writes go to the primary');
      if (['find', 'getMore', 'aggregate', 'distinct', 'listCollections'].includes(name)) assert.equal(addr, sec, `${name} goes to the secondary`);
    }
    assert.ok(started.some(([n]) => n === 'getMore'));
    // Inside a transaction the driver refuses a secondary read preference itself.
    const s = c.startSession();
    s.startTransaction();
    await assert.rejects(coll.findOne({ _id: 1 }, { session: s }), /read preference in a transaction must be primary/i);
    await s.abortTransaction();
    await s.endSession();
    await c.close();
    // A direct connection to the secondary: reads work (the driver sends primaryPreferred),
    // writes get NotWritablePrimary.
    const direct = new MongoClient(`mongodb://${sec}/?directConnection=true`, { serverSelectionTimeoutMS: 5000 });
    assert.equal(await direct.db('x').collection('c').countDocuments(), 3);
    await assert.rejects(direct.db('x').collection('c').insertOne({ _id: 4 }), (e) => e.code === 10107 && /not primary/.test(e.message));
    await direct.close();
  } finally {
    assert.equal(await d.stop(), 0);
  }
});

test('--auth applies to both members; write concern w:2 is satisfied by two members, w:3 is not', async () => {
  const d = await startDouble(['--auth', 'root:s3cret']);
  try {
    const raw = await rawConnect(d.secondaryPort);
    const f = await raw.command({ find: 'c', $db: 'a', $readPreference: { mode: 'secondary' } });
    assert.equal(num(f.code), 13);
    raw.close();
    const c = new MongoClient(`mongodb://root:s3cret@127.0.0.1:${d.port}/?replicaSet=rs0&readPreference=secondary`, { serverSelectionTimeoutMS: 5000 });
    const coll = c.db('a').collection('c');
    const r2 = await coll.insertOne({ _id: 1 }, { writeConcern: { w: 2 } });
    assert.equal(r2.acknowledged, true);
    await assert.rejects(coll.insertOne({ _id: 2 }, { writeConcern: { w: 3 } }), (e) => e.code === 100 && /Not enough data-bearing nodes/.test(e.message));
    assert.equal(await coll.countDocuments(), 2);
    await c.close();
  } finally {
    await d.stop();
  }
});

test('--single-member runs a one-member set: one stdout line, hosts = [me], w:2 unsatisfiable', async () => {
  const d = await startDouble(['--single-member']);
  try {
    assert.equal(d.secondaryPort, null);
    const raw = await rawConnect(d.port);
    const h = await raw.command({ hello: 1, $db: 'admin' });
    assert.deepEqual(h.hosts, [`127.0.0.1:${d.port}`]);
    const r = await raw.command({ insert: 'c', documents: [{}], writeConcern: { w: 2 }, $db: 'x' });
    assert.equal(num(r.writeConcernError.code), 100);
    raw.close();
  } finally {
    await d.stop();
  }
  const s = await startDouble(['--standalone']);
  try {
    assert.equal(s.secondaryPort, null);
  } finally {
    await s.stop();
  }
  await assert.rejects(startDouble(['--standalone', '--secondary-port', '0']), /does not go with/);
});

test('transactions spec test "readPreference inherited from client" passes through the conformance runner', { skip: !fs.existsSync(SPEC) && `spec data not found at ${SPEC}` }, async () => {
  const d = await startDouble();
  try {
    const run = path.join(REPO, 'tests', 'conformance', 'run');
    const r = spawnSync(process.execPath, [run, '--uri', `mongodb://127.0.0.1:${d.port}/`, '--filter', 'readPreference inherited from client', SPEC], { encoding: 'utf8', timeout: 60000 });
    assert.equal(r.status, 0, `runner output:\n${r.stdout}\n${r.stderr}`);
    assert.match(r.stdout, /1 passed, 0 failed/);
  } finally {
    await d.stop();
  }
});

test('killSessions and killAllSessions on the secondary leave the primary\'s transaction alone', async () => {
  const d = await startDouble();
  try {
    const p = await rawConnect(d.port);
    const s = await rawConnect(d.secondaryPort);
    const id = lsid();
    assert.equal(num((await p.command({ insert: 'c', documents: [{ _id: 1 }], $db: 'x', lsid: id, txnNumber: L(1), startTransaction: true, autocommit: false })).ok), 1);
    assert.equal(num((await s.command({ killSessions: [id], $db: 'admin' })).ok), 1);
    assert.equal(num((await s.command({ killAllSessions: [], $db: 'admin' })).ok), 1);
    assert.equal(num((await p.command({ commitTransaction: 1, $db: 'admin', lsid: id, txnNumber: L(1), autocommit: false })).ok), 1);
    assert.equal((await p.command({ find: 'c', $db: 'x' })).cursor.firstBatch.length, 1);
    s.close();
    p.close();
  } finally {
    await d.stop();
  }
});
