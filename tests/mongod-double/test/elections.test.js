'use strict';
// Elections in the two-member set: replSetStepDown swaps the roles (hello, topologyVersion,
// electionId, replSetGetStatus), its argument errors, the old primary's writes in progress and
// open transactions (11602, 10107, labels, connections kept open, fire-and-forget writes close
// theirs), awaitable and streaming hello, replSetFreeze, replSetStepUp, the double-only
// doubleElectionTime, and the Node.js driver living through step-downs: retryable inserts and
// withTransaction with no error reaching the application.

const { test } = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const { startDouble, rawConnect, opMsg, lsid, L } = require('./helpers');

const num = (v) => (v === undefined || v === null ? v : Number(v.valueOf()));
const sleep = (ms) => new Promise((r) => { setTimeout(r, ms); });
const EXHAUST = 1 << 16;

async function hellos(d) {
  const out = [];
  for (const port of [d.port, d.secondaryPort]) {
    const c = await rawConnect(port);
    out.push(await c.command({ hello: 1, $db: 'admin' }));
    c.close();
  }
  return out;
}

// Polls both members until `pred(hellos)` holds (elections here are not instantaneous when
// doubleElectionTime is set), at most `ms`.
async function until(d, pred, ms = 5000) {
  const end = Date.now() + ms;
  for (;;) {
    const h = await hellos(d);
    if (pred(h)) return h;
    if (Date.now() > end) throw new Error(`condition not reached in ${ms} ms: ${JSON.stringify(h.map((x) => [x.me, x.isWritablePrimary, x.primary]))}`);
    await sleep(50);
  }
}

test('replSetStepDown swaps the roles: hello, electionId, topologyVersion and replSetGetStatus on both members follow', async () => {
  const d = await startDouble();
  try {
    const p = `127.0.0.1:${d.port}`;
    const s = `127.0.0.1:${d.secondaryPort}`;
    const [hp, hs] = await hellos(d);
    assert.equal(hp.isWritablePrimary, true);
    assert.equal(hs.isWritablePrimary, false);
    assert.ok(hp.topologyVersion && hs.topologyVersion, 'both members send topologyVersion');
    assert.ok(!hp.topologyVersion.processId.equals(hs.topologyVersion.processId), 'a processId per member');
    const c = await rawConnect(d.port);
    const r = await c.command({ replSetStepDown: 30, $db: 'admin' });
    assert.equal(num(r.ok), 1, JSON.stringify(r));
    const st = await c.command({ replSetGetStatus: 1, $db: 'admin' });
    c.close();
    const [ap, as] = await hellos(d);
    // The former primary answers as a secondary, the former secondary as the primary.
    assert.equal(ap.isWritablePrimary, false);
    assert.equal(ap.secondary, true);
    assert.equal(ap.electionId, undefined);
    assert.equal(as.isWritablePrimary, true);
    assert.equal(as.secondary, false);
    for (const h of [ap, as]) {
      assert.equal(h.primary, s, 'both name the new primary');
      assert.deepEqual(h.hosts, [p, s], 'configuration order unchanged');
      assert.equal(num(h.setVersion), num(hp.setVersion), 'setVersion unchanged');
    }
    assert.ok(as.electionId.toHexString() > hp.electionId.toHexString(), `a higher electionId (${hp.electionId} -> ${as.electionId})`);
    assert.equal(ap.topologyVersion.processId.toHexString(), hp.topologyVersion.processId.toHexString(), 'same process');
    assert.ok(BigInt(ap.topologyVersion.counter) > BigInt(hp.topologyVersion.counter), 'old primary: counter went up');
    assert.ok(BigInt(as.topologyVersion.counter) > BigInt(hs.topologyVersion.counter), 'new primary: counter went up');
    assert.equal(num(st.myState), 2);
    assert.deepEqual(st.members.map((m) => [m.name, m.stateStr, num(m.state)]), [[p, 'SECONDARY', 2], [s, 'PRIMARY', 1]]);
    assert.ok(num(st.term) >= 2);
    // The new primary takes writes; the old one refuses them with 10107 and its topologyVersion.
    const np = await rawConnect(d.secondaryPort);
    assert.equal(num((await np.command({ insert: 'c', documents: [{ _id: 1 }], $db: 'x' })).n), 1);
    np.close();
    const op = await rawConnect(d.port);
    const w = await op.command({ insert: 'c', documents: [{ _id: 2 }], lsid: lsid(), txnNumber: L(1), $db: 'x' });
    assert.equal(num(w.code), 10107);
    assert.equal(w.codeName, 'NotWritablePrimary');
    assert.deepEqual(w.errorLabels, ['RetryableWriteError']);
    assert.equal(BigInt(w.topologyVersion.counter), BigInt(ap.topologyVersion.counter));
    const rd = await op.command({ find: 'c', $db: 'x' });
    assert.equal(num(rd.code), 13435, 'a read without secondaryOk');
    assert.ok(rd.topologyVersion);
    const rs = await op.command({ find: 'c', $db: 'x', $readPreference: { mode: 'secondary' } });
    assert.deepEqual(rs.cursor.firstBatch.map((x) => num(x._id)), [1], 'the old primary reads the shared data');
    op.close();
  } finally {
    assert.equal(await d.stop(), 0);
  }
});

test('replSetStepDown errors: secondary, not admin, bad arguments, standalone; a lone member waits the catch-up period, then 262 or (force) steps down', async () => {
  const d = await startDouble();
  try {
    const sc = await rawConnect(d.secondaryPort);
    const ns = await sc.command({ replSetStepDown: 60, $db: 'admin' });
    assert.deepEqual([num(ns.code), ns.codeName, ns.errmsg], [10107, 'NotWritablePrimary', "not primary so can't step down"]);
    sc.close();
    const c = await rawConnect(d.port);
    const bad = async (cmd, code, msg) => {
      const r = await c.command({ ...cmd, $db: 'admin' });
      assert.equal(num(r.ok), 0, JSON.stringify(cmd));
      assert.equal(num(r.code), code, JSON.stringify(r));
      if (msg) assert.equal(r.errmsg, msg);
    };
    const nadm = await c.command({ replSetStepDown: 60, $db: 'x' });
    assert.deepEqual([num(nadm.code), nadm.errmsg], [13, 'replSetStepDown may only be run against the admin database.']);
    await bad({ replSetStepDown: -1 }, 2, 'stepdown period must be a positive integer');
    await bad({ replSetStepDown: 5 }, 2, 'stepdown period must be longer than secondaryCatchUpPeriodSecs');
    await bad({ replSetStepDown: 60, secondaryCatchUpPeriodSecs: -1 }, 2, 'secondaryCatchUpPeriodSecs period must be a positive or absent');
    await bad({ replSetStepDown: 60, secondaryCatchUpPeriodSecs: 'x' }, 14);
    const fr = await c.command({ replSetFreeze: 10, $db: 'admin' });
    assert.equal(num(fr.code), 95, 'a primary cannot be frozen');
    assert.equal(fr.codeName, 'NotSecondary');
    const [h] = await hellos(d);
    assert.equal(h.isWritablePrimary, true, 'still primary after the failed attempts');
    c.close();
  } finally {
    assert.equal(await d.stop(), 0);
  }
  const one = await startDouble(['--single-member']);
  try {
    const c = await rawConnect(one.port);
    const h0 = await c.command({ hello: 1, $db: 'admin' });
    const t0 = Date.now();
    const r = await c.command({ replSetStepDown: 60, secondaryCatchUpPeriodSecs: 1, $db: 'admin' });
    assert.ok(Date.now() - t0 >= 900, 'waited for a secondary to catch up');
    assert.equal(num(r.code), 262);
    assert.equal(r.codeName, 'ExceededTimeLimit');
    assert.match(r.errmsg, /^No electable secondaries caught up as of .*force: true/);
    assert.equal((await c.command({ hello: 1, $db: 'admin' })).isWritablePrimary, true);
    const f = await c.command({ replSetStepDown: 2, force: true, $db: 'admin' });
    assert.equal(num(f.ok), 1);
    const h = await c.command({ hello: 1, $db: 'admin' });
    assert.equal(h.isWritablePrimary, false);
    assert.equal(h.primary, undefined, 'no primary during the step-down period');
    const w = await c.command({ insert: 'c', documents: [{}], $db: 'x' });
    assert.equal(num(w.code), 10107);
    // After its step-down period (and not before) the lone member elects itself again.
    let h2;
    for (const end = Date.now() + 6000; Date.now() < end; await sleep(50)) {
      h2 = await c.command({ hello: 1, $db: 'admin' });
      if (h2.isWritablePrimary) break;
    }
    assert.equal(h2.isWritablePrimary, true);
    assert.ok(Date.now() - t0 >= 2900, 'not before the 2 s step-down period ended');
    assert.ok(h2.electionId.toHexString() > h0.electionId.toHexString(), 'a new election, a higher electionId');
    c.close();
  } finally {
    assert.equal(await one.stop(), 0);
  }
  const sa = await startDouble(['--standalone']);
  try {
    const c = await rawConnect(sa.port);
    for (const cmd of ['replSetStepDown', 'replSetFreeze', 'replSetStepUp']) {
      const r = await c.command({ [cmd]: 60, $db: 'admin' });
      assert.equal(num(r.code), 76, cmd);
    }
    c.close();
  } finally {
    assert.equal(await sa.stop(), 0);
  }
});

test('step-down: writes in progress get 11602 with the labels mongod adds, open transactions are aborted, connections stay open, later writes get 10107; a fire-and-forget write to the old primary closes its connection', async () => {
  const d = await startDouble();
  try {
    const adm = await rawConnect(d.port);
    // Hold every insert in progress for 3 s.
    await adm.command({ configureFailPoint: 'failCommand', mode: 'alwaysOn', data: { failCommands: ['insert'], blockConnection: true, blockTimeMS: 3000 }, $db: 'admin' });
    // An open transaction that is idle at the step-down, started with a find.
    const tx = await rawConnect(d.port);
    const idle = lsid();
    assert.equal(num((await tx.command({ find: 'c', $db: 'x', lsid: idle, txnNumber: L(1), startTransaction: true, autocommit: false })).ok), 1);
    const conns = await Promise.all([0, 1, 2].map(() => rawConnect(d.port)));
    const [retryable, plain, inTxn] = conns;
    const started = Date.now();
    const pending = [
      retryable.command({ insert: 'c', documents: [{ _id: 'r' }], lsid: lsid(), txnNumber: L(1), $db: 'x' }),
      plain.command({ insert: 'c', documents: [{ _id: 'p' }], $db: 'x' }),
      inTxn.command({ insert: 'c', documents: [{ _id: 't' }], lsid: lsid(), txnNumber: L(1), startTransaction: true, autocommit: false, $db: 'x' }),
    ];
    await sleep(300);
    assert.equal(num((await adm.command({ replSetStepDown: 60, $db: 'admin' })).ok), 1);
    const [r1, r2, r3] = await Promise.all(pending);
    assert.ok(Date.now() - started < 2500, 'interrupted, not left to finish');
    for (const r of [r1, r2, r3]) {
      assert.deepEqual([num(r.ok), num(r.code), r.codeName, r.errmsg], [0, 11602, 'InterruptedDueToReplStateChange', 'operation was interrupted']);
      assert.ok(r.topologyVersion, 'with the topologyVersion');
    }
    assert.deepEqual(r1.errorLabels, ['RetryableWriteError'], 'retryable write');
    assert.equal(r2.errorLabels, undefined, 'plain write: no label');
    assert.deepEqual(r3.errorLabels, ['TransientTransactionError'], 'transaction statement');
    // Connections stay open (mongod 4.2+); writes sent now get 10107.
    for (const c of conns) assert.equal(num((await c.command({ ping: 1, $db: 'admin' })).ok), 1);
    const later = await plain.command({ insert: 'c', documents: [{ _id: 'q' }], $db: 'x' });
    assert.deepEqual([num(later.code), later.errmsg], [10107, 'not primary']);
    // The idle transaction: its next statement on the old primary gets 10107, its commit on the
    // new primary 251, both with TransientTransactionError.
    const st = await tx.command({ find: 'c', $db: 'x', lsid: idle, txnNumber: L(1), autocommit: false });
    assert.equal(num(st.code), 10107);
    assert.deepEqual(st.errorLabels, ['TransientTransactionError']);
    const np = await rawConnect(d.secondaryPort);
    const cm = await np.command({ commitTransaction: 1, $db: 'admin', lsid: idle, txnNumber: L(1), autocommit: false });
    assert.equal(num(cm.code), 251);
    assert.deepEqual(cm.errorLabels, ['TransientTransactionError']);
    // Nothing of the interrupted writes was applied.
    const f = await np.command({ find: 'c', $db: 'x' });
    assert.deepEqual(f.cursor.firstBatch, []);
    np.close();
    // moreToCome insert on the old primary: no reply can carry the error, so the connection closes.
    const ff = conns[0];
    ff.send(opMsg({ insert: 'c', documents: [{ _id: 'ff' }], writeConcern: { w: 0 }, $db: 'x' }, { flags: 2 }).msg);
    const closed = await Promise.race([ff.closed, sleep(2000).then(() => false)]);
    assert.equal(closed, true, 'the fire-and-forget write closed the connection');
    for (const c of [adm, tx, plain, inTxn]) c.close();
  } finally {
    assert.equal(await d.stop(), 0);
  }
});

test('awaitable hello: waits for maxAwaitTimeMS or answers a topology change at once; exhaust streams it; argument errors', async () => {
  const d = await startDouble();
  try {
    const c = await rawConnect(d.port);
    const h = await c.command({ hello: 1, $db: 'admin' });
    const tv = h.topologyVersion;
    let t0 = Date.now();
    const same = await c.command({ hello: 1, topologyVersion: tv, maxAwaitTimeMS: L(400), $db: 'admin' });
    assert.ok(Date.now() - t0 >= 350, 'waited for maxAwaitTimeMS');
    assert.equal(BigInt(same.topologyVersion.counter), BigInt(tv.counter));
    // An older counter is answered at once.
    t0 = Date.now();
    const old = await c.command({ hello: 1, topologyVersion: { processId: tv.processId, counter: L(-1) }, maxAwaitTimeMS: L(5000), $db: 'admin' });
    assert.ok(Date.now() - t0 < 1000);
    assert.equal(num(old.ok), 1);
    const bad = async (cmd, code) => assert.equal(num((await c.command({ hello: 1, $db: 'admin', ...cmd })).code), code, JSON.stringify(cmd));
    await bad({ topologyVersion: tv }, 31368);
    await bad({ maxAwaitTimeMS: L(10) }, 31368);
    // hello.idl's validator {gte: 0} refuses a negative wait before the command runs (mongod's
    // own 31373 check behind it is never reached).
    await bad({ topologyVersion: tv, maxAwaitTimeMS: L(-1) }, 51024);
    await bad({ topologyVersion: { processId: tv.processId, counter: L(Number(tv.counter) + 5) }, maxAwaitTimeMS: L(10) }, 31382);
    // Streaming: exhaustAllowed hello on the secondary; a step-down answers the waiting hello
    // long before its maxAwaitTimeMS, with moreToCome, each reply answering the previous one.
    const s = await rawConnect(d.secondaryPort);
    const sh = await s.command({ hello: 1, $db: 'admin' });
    const { id, msg } = opMsg({ hello: 1, topologyVersion: sh.topologyVersion, maxAwaitTimeMS: L(10000), $db: 'admin' }, { flags: EXHAUST });
    s.send(msg);
    assert.equal(await s.next(300), 'timeout', 'nothing while the topology is unchanged');
    t0 = Date.now();
    assert.equal(num((await c.command({ replSetStepDown: 60, $db: 'admin' })).ok), 1);
    const seen = [];
    let responseTo = id;
    while (seen.length < 1 || !seen[seen.length - 1].isWritablePrimary) {
      const r = await s.next(3000);
      assert.ok(r && r !== 'timeout', 'the change is streamed');
      assert.equal(r.responseTo, responseTo);
      assert.ok(r.raw.readUInt32LE(16) & 2, 'moreToCome');
      responseTo = r.raw.readInt32LE(4);
      seen.push(r.doc);
    }
    assert.ok(Date.now() - t0 < 2000, 'answered at the change, not after maxAwaitTimeMS');
    const counters = seen.map((x) => BigInt(x.topologyVersion.counter));
    assert.ok(counters.every((x, i) => x > (i ? counters[i - 1] : BigInt(sh.topologyVersion.counter))), 'counter increases');
    assert.equal(seen[seen.length - 1].primary, `127.0.0.1:${d.secondaryPort}`);
    s.close();
    c.close();
  } finally {
    assert.equal(await d.stop(), 0);
  }
});

test('replSetFreeze keeps a secondary from being elected, 0 unfreezes; replSetStepUp elects a secondary, fails on a frozen one', async () => {
  const d = await startDouble();
  try {
    const p = await rawConnect(d.port);
    const s = await rawConnect(d.secondaryPort);
    const f1 = await s.command({ replSetFreeze: 1, $db: 'admin' });
    assert.equal(f1.warning, 'you really want to freeze for only 1 second?');
    const fr = await s.command({ replSetFreeze: 30, $db: 'admin' });
    assert.equal(num(fr.ok), 1);
    // The primary does not know of the freeze: its step-down succeeds, and nobody is primary.
    assert.equal(num((await p.command({ replSetStepDown: 60, secondaryCatchUpPeriodSecs: 1, $db: 'admin' })).ok), 1);
    await sleep(300);
    let [hp, hs] = await hellos(d);
    assert.deepEqual([hp.isWritablePrimary, hs.isWritablePrimary, hp.primary, hs.primary], [false, false, undefined, undefined]);
    const su = await s.command({ replSetStepUp: 1, $db: 'admin' });
    assert.deepEqual([num(su.code), su.codeName, su.errmsg], [125, 'CommandFailed', 'Election failed.'], 'a frozen member cannot step up');
    const uf = await s.command({ replSetFreeze: 0, $db: 'admin' });
    assert.equal(uf.info, 'unfreezing');
    [hp, hs] = await until(d, (h) => h[1].isWritablePrimary);
    assert.equal(hp.primary, `127.0.0.1:${d.secondaryPort}`, 'unfrozen, the secondary is elected');
    // The old primary is in its step-down period: stepUp fails until it is unfrozen.
    assert.equal(num((await p.command({ replSetStepUp: 1, $db: 'admin' })).code), 125);
    assert.equal(num((await p.command({ replSetFreeze: 0, $db: 'admin' })).ok), 1);
    const up = await p.command({ replSetStepUp: 1, $db: 'admin' });
    assert.equal(num(up.ok), 1, JSON.stringify(up));
    [hp, hs] = await hellos(d);
    assert.deepEqual([hp.isWritablePrimary, hs.isWritablePrimary, hs.primary], [true, false, `127.0.0.1:${d.port}`]);
    assert.equal(num((await p.command({ replSetStepUp: 1, $db: 'admin' })).ok), 1, 'stepUp on the primary: nothing to do');
    assert.equal(num((await s.command({ insert: 'c', documents: [{}], $db: 'x' })).code), 10107, 'the stepped-up-over member refuses writes');
    p.close();
    s.close();
  } finally {
    assert.equal(await d.stop(), 0);
  }
});

test('doubleElectionTime makes elections take a given time, during which no member is primary and writes fail with 10107', async () => {
  const d = await startDouble();
  try {
    const p = await rawConnect(d.port);
    const s = await rawConnect(d.secondaryPort);
    assert.equal(num((await p.command({ doubleElectionTime: -5, $db: 'admin' })).code), 2);
    const set = await s.command({ doubleElectionTime: 1500, $db: 'admin' });
    assert.deepEqual([num(set.ok), num(set.electionTimeMS)], [1, 0], 'answers the previous value');
    const t0 = Date.now();
    assert.equal(num((await p.command({ replSetStepDown: 60, $db: 'admin' })).ok), 1);
    const [hp, hs] = await hellos(d);
    assert.deepEqual([hp.isWritablePrimary, hs.isWritablePrimary, hp.primary, hs.primary], [false, false, undefined, undefined]);
    for (const c of [p, s]) {
      const w = await c.command({ insert: 'c', documents: [{}], lsid: lsid(), txnNumber: L(1), $db: 'x' });
      assert.equal(num(w.code), 10107);
      assert.deepEqual(w.errorLabels, ['RetryableWriteError']);
    }
    const st = await s.command({ replSetGetStatus: 1, $db: 'admin' });
    assert.deepEqual(st.members.map((m) => m.stateStr), ['SECONDARY', 'SECONDARY']);
    await until(d, (h) => h[1].isWritablePrimary, 5000);
    const took = Date.now() - t0;
    assert.ok(took >= 1400, `the election took ${took} ms`);
    // replSetStepUp answers when its election is over.
    assert.equal(num((await p.command({ replSetFreeze: 0, $db: 'admin' })).ok), 1);
    const t1 = Date.now();
    assert.equal(num((await p.command({ replSetStepUp: 1, $db: 'admin' })).ok), 1);
    assert.ok(Date.now() - t1 >= 1400, 'stepUp waited for its election');
    assert.equal((await p.command({ hello: 1, $db: 'admin' })).isWritablePrimary, true);
    p.close();
    s.close();
  } finally {
    assert.equal(await d.stop(), 0);
  }
});

test('Node.js driver with replicaSet=rs0: retryable inserts go on across two step-downs with no error reaching the application', async () => {
  const d = await startDouble();
  const client = new MongoClient(d.uri(), { serverSelectionTimeoutMS: 10000 });
  try {
    const failed = [];
    const c = new MongoClient(d.uri(), { serverSelectionTimeoutMS: 10000, monitorCommands: true });
    c.on('commandFailed', (e) => failed.push(e.failure && e.failure.code));
    await c.connect();
    await client.connect();
    const coll = c.db('x').collection('c');
    // One insert is held in progress on the primary when it steps down: it gets 11602 and the
    // driver retries it on the new primary.
    const a = await rawConnect(d.port);
    await a.command({ configureFailPoint: 'failCommand', mode: { times: 1 }, data: { failCommands: ['insert'], blockConnection: true, blockTimeMS: 2000 }, $db: 'admin' });
    a.close();
    let n = 0;
    let stop = false;
    const loop = (async () => {
      while (!stop) {
        await coll.insertOne({ _id: n });
        n++;
      }
    })();
    await sleep(300);
    assert.equal(num((await client.db('admin').command({ replSetStepDown: 30 })).ok), 1);
    await sleep(500);
    // Back: the old primary is made electable again and the new one steps down.
    const o = await rawConnect(d.port);
    assert.equal(num((await o.command({ replSetFreeze: 0, $db: 'admin' })).ok), 1);
    o.close();
    const np = await rawConnect(d.secondaryPort);
    assert.equal(num((await np.command({ replSetStepDown: 30, $db: 'admin' })).ok), 1);
    np.close();
    await sleep(500);
    stop = true;
    await loop; // rejects if an error reached the application
    assert.ok(failed.includes(11602), `the held insert was interrupted and retried (failures seen: ${failed})`);
    assert.ok(n > 5, `kept inserting (${n})`);
    const ids = (await coll.find().sort({ _id: 1 }).toArray()).map((x) => x._id);
    assert.deepEqual(ids, Array.from({ length: n }, (_, i) => i), 'every insert exactly once');
    const [hp] = await hellos(d);
    assert.equal(hp.isWritablePrimary, true, 'the first member is primary again');
    await c.close();
  } finally {
    await client.close();
    assert.equal(await d.stop(), 0);
  }
});

test('Node.js driver: a transaction open across a step-down fails with TransientTransactionError and withTransaction retries it to success', async () => {
  const d = await startDouble();
  const client = new MongoClient(d.uri(), { serverSelectionTimeoutMS: 10000, monitorCommands: true });
  try {
    const failures = [];
    client.on('commandFailed', (e) => failures.push({ name: e.commandName, code: e.failure && e.failure.code, labels: e.failure && e.failure.errorLabels }));
    await client.connect();
    const coll = client.db('x').collection('t');
    await coll.insertOne({ _id: 'seed' });
    const admin = new MongoClient(d.uri('directConnection=true'));
    await admin.connect();
    const session = client.startSession();
    let attempts = 0;
    try {
      await session.withTransaction(async () => {
        attempts++;
        await coll.insertOne({ _id: 'a' }, { session });
        if (attempts === 1) assert.equal(num((await admin.db('admin').command({ replSetStepDown: 30 })).ok), 1);
        await coll.insertOne({ _id: 'b' }, { session });
      });
    } finally {
      await session.endSession();
      await admin.close();
    }
    assert.equal(attempts, 2, 'the callback ran again');
    const failed = failures.find((f) => f.name === 'insert');
    assert.ok(failed, `a statement failed (${JSON.stringify(failures)})`);
    assert.ok([10107, 251].includes(failed.code), `with ${failed.code}`);
    assert.ok(failed.labels.includes('TransientTransactionError'), `labels ${failed.labels}`);
    const ids = (await coll.find().sort({ _id: 1 }).toArray()).map((x) => x._id);
    assert.deepEqual(ids, ['a', 'b', 'seed'], 'the retried transaction committed once');
  } finally {
    await client.close();
    assert.equal(await d.stop(), 0);
  }
});
