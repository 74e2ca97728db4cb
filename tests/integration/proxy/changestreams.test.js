'use strict';
// Change streams through the proxy compared with the same streams opened directly, and resumed
// after the proxy itself drops the client's connection: the proxy is killed with SIGKILL in the
// middle of an awaitData getMore and started again on the same port, so every connection of the
// application ends at the proxy, not at the server. Writes made while the proxy is down (straight
// to the server) must all be seen once after the resume, in order, with the Node.js driver's
// automatic resume, with a stream reopened by hand from a saved resume token (`resumeAfter`), and
// with Mongoose's Model.watch(). (changestream.test.js covers the other cut: the server closing
// the proxy's upstream connection in a getMore.)

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { spawn } = require('node:child_process');
const { MongoClient } = require('mongodb');
const mongoose = require('mongoose');
const H = require('../lib/proxy');

let upstream;
let proxy;
const restarts = []; // proxy processes started again on the first one's port

test.before(async () => {
  upstream = await H.startUpstream();
  proxy = await H.startProxy({ upstream: upstream.uri });
});

test.after(async () => {
  for (const r of restarts) if (r.child.exitCode === null) r.child.kill('SIGKILL');
  if (proxy) await proxy.kill().catch(() => {});
  if (upstream) await upstream.stop();
});

/** Starts the proxy binary again with the first one's INI file, so on the same port. */
async function restartProxy() {
  const logPath = path.join(proxy.dir, `proxy-restart-${restarts.length + 1}.stderr`);
  const errFd = fs.openSync(logPath, 'a');
  const child = spawn(H.proxyBin(), ['-c', proxy.iniPath], { stdio: ['ignore', 'ignore', errFd] });
  fs.closeSync(errFd);
  const exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
  process.on('exit', () => child.kill('SIGKILL'));
  const r = { child, exited, log: () => fs.readFileSync(logPath, 'utf8') };
  restarts.push(r);
  const deadline = Date.now() + 20000;
  for (;;) {
    try {
      const conn = await H.WireConn.connect({ port: proxy.port, timeoutMs: 1000 });
      try {
        if ((await conn.command({ hello: 1, $db: 'admin' })).ok === 1) return r;
      } finally {
        conn.destroy();
      }
    } catch {
      /* not yet */
    }
    if (Date.now() > deadline) throw new Error(`restarted proxy not ready:\n${r.log()}`);
    await H.sleep(50);
  }
}

/** Kills whichever proxy process holds the port now (SIGKILL) and starts another on it. */
async function cutAtProxy() {
  const current = restarts.length ? restarts[restarts.length - 1] : null;
  if (current) {
    current.child.kill('SIGKILL');
    await current.exited;
  } else {
    await proxy.kill();
  }
  return restartProxy();
}

/** Next `n` change events of `stream`, waiting at most `ms` for each. */
async function take(stream, n, ms = 15000) {
  const out = [];
  while (out.length < n) {
    const ev = await H.within(stream.next(), ms, null);
    assert.ok(ev, `change event ${out.length + 1} of ${n} within ${ms} ms`);
    out.push(ev);
  }
  return out;
}

/** Asserts that `stream` yields nothing more within `ms` (no event repeated after a resume). */
async function assertQuiet(stream, ms = 1000) {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    const ev = await stream.tryNext();
    assert.equal(ev, null, `no further event: got ${ev && JSON.stringify(ev.documentKey)} ${ev && ev.operationType}`);
  }
}

const summary = (ev) => `${ev.operationType}:${ev.documentKey && ev.documentKey._id}`;

test('Node.js driver: the events seen through the proxy are the events seen directly, byte for byte', { timeout: 60000 }, async (t) => {
  const client = await new MongoClient(proxy.uri({ appName: 'rbit-cs-compare' }), { serverSelectionTimeoutMS: 30000 }).connect();
  t.after(() => client.close());
  const direct = await new MongoClient(upstream.directUri).connect();
  t.after(() => direct.close());
  const db = H.uniqueDbName('cs_compare');
  const viaProxy = client.db(db).collection('orders');
  await viaProxy.insertOne({ _id: 'seed', n: 0 });
  const opts = { maxAwaitTimeMS: 200, fullDocument: 'updateLookup' };
  const ps = viaProxy.watch([], opts);
  const ds = direct.db(db).collection('orders').watch([], opts);
  // tryNext runs the aggregate: both streams are open once it returns (no event yet).
  assert.equal(await ps.tryNext(), null);
  assert.equal(await ds.tryNext(), null);
  await viaProxy.insertOne({ _id: 'a', n: 1 });
  await viaProxy.updateOne({ _id: 'a' }, { $set: { n: 2 }, $unset: { gone: '' } });
  await viaProxy.replaceOne({ _id: 'a' }, { n: 3, replaced: true });
  await viaProxy.deleteOne({ _id: 'seed' });
  const got = await take(ps, 4);
  const want = await take(ds, 4);
  assert.deepEqual(got.map(summary), ['insert:a', 'update:a', 'replace:a', 'delete:seed']);
  assert.deepEqual(got, want, 'every field of every event, resume tokens and cluster times included');
  assert.deepEqual(got[1].updateDescription.updatedFields, { n: 2 });
  assert.deepEqual(ps.resumeToken, ds.resumeToken);
  await ps.close();
  await ds.close();
});

test('Node.js driver: watch() resumes after the proxy drops its connection; a saved token resumes a new stream; nothing lost or repeated', { timeout: 90000 }, async (t) => {
  const client = await new MongoClient(proxy.uri({ appName: 'rbit-cs-resume' }), { serverSelectionTimeoutMS: 30000 }).connect();
  t.after(() => client.close());
  const direct = await new MongoClient(upstream.directUri).connect();
  t.after(() => direct.close());
  const db = H.uniqueDbName('cs_resume');
  const coll = client.db(db).collection('orders');
  const straight = direct.db(db).collection('orders');
  await coll.insertOne({ _id: 'seed' });
  const stream = coll.watch([], { maxAwaitTimeMS: 200 });
  assert.equal(await stream.tryNext(), null);
  for (let i = 1; i <= 3; i++) await coll.insertOne({ _id: `b${i}` });
  const before = await take(stream, 3);
  const saved = stream.resumeToken; // after b3
  // A getMore is waiting at the proxy when it is killed.
  const pending = stream.next();
  await H.sleep(300);
  await cutAtProxy();
  // Written straight to the server while the client's stream is between connections.
  await straight.insertOne({ _id: 'b4' });
  await straight.updateOne({ _id: 'b4' }, { $set: { x: 1 } });
  await coll.insertOne({ _id: 'b5' }); // through the restarted proxy
  await coll.deleteOne({ _id: 'seed' });
  const after = [await pending, ...(await take(stream, 3))];
  assert.deepEqual([...before, ...after].map(summary), ['insert:b1', 'insert:b2', 'insert:b3', 'insert:b4', 'update:b4', 'insert:b5', 'delete:seed'],
    'every write once, in order, across the cut');
  await assertQuiet(stream);
  await stream.close();

  // A stream opened afterwards from the token saved before the cut sees the same four events.
  const again = coll.watch([], { resumeAfter: saved, maxAwaitTimeMS: 200 });
  const replay = await take(again, 4);
  assert.deepEqual(replay.map((e) => e._id), after.map((e) => e._id), 'the same events, with the same resume tokens');
  await assertQuiet(again);
  await again.close();
  assert.ok(restarts.length >= 1);
});

test('Mongoose: Model.watch() resumes after the proxy drops its connection; nothing lost or repeated', { timeout: 90000 }, async (t) => {
  const conn = await mongoose
    .createConnection(proxy.uri({ appName: 'rbit-cs-mongoose' }), { dbName: H.uniqueDbName('cs_mongoose'), serverSelectionTimeoutMS: 30000 })
    .asPromise();
  t.after(() => conn.close());
  const direct = await new MongoClient(upstream.directUri).connect();
  t.after(() => direct.close());
  const Order = conn.model('Order', new mongoose.Schema({ _id: String, n: Number }, { versionKey: false }), 'orders');
  await Order.createCollection();
  const stream = Order.watch([], { maxAwaitTimeMS: 200 });
  const seen = [];
  const errors = [];
  stream.on('change', (ev) => seen.push(ev));
  stream.on('error', (e) => errors.push(e));
  const waitSeen = async (n) => {
    for (let i = 0; i < 300 && seen.length < n; i++) await H.sleep(50);
    assert.ok(seen.length >= n, `${n} events seen (${seen.length}: ${seen.map(summary).join(', ')})`);
  };
  await H.sleep(500);
  await Order.create({ _id: 'm1', n: 1 });
  await Order.updateOne({ _id: 'm1' }, { $set: { n: 2 } });
  await waitSeen(2);
  await cutAtProxy();
  await direct.db(conn.name).collection('orders').insertOne({ _id: 'm2', n: 7 });
  await Order.create({ _id: 'm3', n: 3 });
  await Order.deleteOne({ _id: 'm1' });
  await waitSeen(5);
  await H.sleep(1000); // time for a repeated event to show
  assert.deepEqual(seen.map(summary), ['insert:m1', 'update:m1', 'insert:m2', 'insert:m3', 'delete:m1'], 'every write once, in order, across the cut');
  assert.equal(seen[2].fullDocument.n, 7);
  await stream.close();
  assert.deepEqual(errors.map((e) => e.message), [], 'the resume reached the application as no error');
});

test('the restarted proxy exits 0 on SIGTERM and logged no sanitizer report', async () => {
  assert.ok(restarts.length >= 2, 'the proxy was cut twice');
  const last = restarts[restarts.length - 1];
  last.child.kill('SIGTERM');
  const r = await H.within(last.exited, 10000, null);
  assert.ok(r, 'exited within 10 s');
  assert.equal(r.signal, null);
  assert.equal(r.code, 0);
  for (const x of restarts) H.assertNoSanitizerReports(x.log(), 'restarted proxy');
  H.assertNoSanitizerReports(proxy.log(), 'first proxy');
});
