'use strict';
// [proxy] threads = 4: the listener hands connections to the loops in turn, and what a
// transaction needs across connections works across loops. A driver may run a transaction's
// statements and its commit on different connections of its pool (the proxy is a mongos to it:
// transactions pin to the server, not to a connection), and consecutive connections are on
// different loops here. The commit on another loop's connection must still wake the
// dispatcher at once: it polls every 10 s and has no change stream here, so only the commit's
// wake-up brings the event within the bound. (A poisoned transaction's commit on another
// connection is refused whichever loop has it: poisoned-commit.test.js, which scripts/test runs
// with threads = 4.)

const test = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const http = require('node:http');
const { Binary, Long } = require('mongodb');
const H = require('../lib/proxy');
const { startSink } = require('../dispatch/sink');
const { startDispatchProxy, waitFor } = require('../dispatch/helpers');

const POLL_MS = 10000;
const THREADS = 4;

function getJson(port, path) {
  return new Promise((resolve, reject) => {
    http.get({ host: '127.0.0.1', port, path }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c) => (body += c));
      res.on('end', () => {
        try {
          resolve(JSON.parse(body));
        } catch (e) {
          reject(new Error(`${path}: ${res.statusCode} ${body.slice(0, 200)}`));
        }
      });
    }).on('error', reject);
  });
}

async function hello(port) {
  const c = await H.WireConn.connect({ port });
  const r = await c.command({ hello: 1, $db: 'admin' });
  assert.equal(r.ok, 1, JSON.stringify(r));
  return c;
}

async function stack(t) {
  const up = await H.startUpstream();
  t.after(() => up.stop());
  const sink = await startSink({});
  t.after(() => sink.close());
  const db = `rbit_loops_${process.pid}_${crypto.randomBytes(3).toString('hex')}`;
  const adminPort = await H.freePort();
  const proxy = await startDispatchProxy({
    upstream: up.uri,
    threads: THREADS,
    adminListen: `127.0.0.1:${adminPort}`,
    outbox: { database: db },
    dispatch: { poll_interval_ms: POLL_MS, watch: 'false' },
    handlers: [{ name: 'h', events: '*', kind: 'webhook', url: sink.url('/h') }],
  });
  t.after(() => proxy.kill());
  // The first poll runs at start-up; what follows comes after it.
  await H.sleep(1500);
  return { proxy, sink, db, adminPort };
}

const txn = (lsid, n) => ({ lsid: { id: lsid }, txnNumber: Long.fromNumber(n), autocommit: false });

test('threads = 4: connections go to the loops in turn, and /api/clients says which loop has each', { timeout: 60000 }, async (t) => {
  const { proxy, adminPort } = await stack(t);
  const conns = [];
  for (let i = 0; i < 2 * THREADS; i++) conns.push(await hello(proxy.port));
  t.after(() => conns.forEach((c) => c.destroy()));
  const ports = new Set(conns.map((c) => `127.0.0.1:${c.localPort}`));
  const { clients } = await getJson(adminPort, '/api/clients');
  const ours = clients.filter((c) => ports.has(c.peer));
  assert.equal(ours.length, 2 * THREADS, JSON.stringify(clients));
  const perLoop = new Map();
  for (const c of ours) perLoop.set(c.loop, (perLoop.get(c.loop) || 0) + 1);
  assert.deepEqual([...perLoop.keys()].sort(), [0, 1, 2, 3], `loops used: ${JSON.stringify([...perLoop])}`);
  for (const [loop, n] of perLoop) assert.equal(n, 2, `loop ${loop} has ${n} of the ${2 * THREADS} connections`);
  // Ids are one process-wide sequence: no two connections share one.
  assert.equal(new Set(ours.map((c) => c.id)).size, ours.length);
  assert.match(proxy.log(), /4 forwarding loops \(threads = 4\)/);
  const metrics = await new Promise((resolve, reject) => {
    http.get({ host: '127.0.0.1', port: adminPort, path: '/metrics' }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c) => (body += c));
      res.on('end', () => resolve(body));
    }).on('error', reject);
  });
  assert.match(metrics, /^relaybus_forwarding_loops 4$/m);
  assert.equal((await proxy.stop()).code, 0);
});

test('a commit sent on another loop\'s connection wakes the dispatcher at once', { timeout: 60000 }, async (t) => {
  const { proxy, sink, db, adminPort } = await stack(t);
  const st = sink.stats();
  const a = await hello(proxy.port);
  const b = await hello(proxy.port);
  t.after(() => { a.destroy(); b.destroy(); });
  const { clients } = await getJson(adminPort, '/api/clients');
  const loopOf = (c) => clients.find((x) => x.peer === `127.0.0.1:${c.localPort}`).loop;
  assert.notEqual(loopOf(a), loopOf(b), 'consecutive connections are on different loops');

  const lat = [];
  for (let i = 0; i < 3; i++) {
    const lsid = new Binary(crypto.randomBytes(16), 4);
    const id = `loops-wake-${i}`;
    const ins = await a.command({
      insert: 'items', documents: [{ _id: id }], $db: db, startTransaction: true, ...txn(lsid, 1),
      comment: { relaybus: { type: 'loops.v1', id, payload: { i } } },
    });
    assert.equal(ins.ok, 1, JSON.stringify(ins));
    const t0 = Date.now();
    const commit = await b.command({ commitTransaction: 1, $db: 'admin', ...txn(lsid, 1) });
    assert.equal(commit.ok, 1, JSON.stringify(commit));
    await waitFor(() => st.ok.has(id), POLL_MS * 3, `event ${id} at the sink`);
    lat.push(st.firstAt.get(id) - t0);
  }
  t.diagnostic(`commit-to-webhook, commit on another loop, ms: ${lat.join(' ')} (poll_interval_ms ${POLL_MS})`);
  for (const ms of lat) assert.ok(ms < 2000, `woken by the commit, not found by the poll: ${lat.join(' ')}`);
  assert.equal((await proxy.stop()).code, 0);
});
