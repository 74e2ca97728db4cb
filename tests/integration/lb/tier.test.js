'use strict';
// A tier of three proxies behind HAProxy (mode tcp, round robin, each proxy checked on its
// admin port's /readyz), the Node.js driver with loadBalanced=true in front, a webhook handler
// dispatched by the tier (docs/deployment.md, "Behind a load balancer"):
//   - 200 annotated transactions, 10 at a time: each transaction's statements and commit on
//     one connection, so one proxy (one serviceId), the tier's three proxies all used, and
//     every event delivered to the webhook once, signed, in key order;
//   - 20 cursors at once, each reading its documents in batches of 2: every getMore on the
//     connection (and proxy) of its find;
//   - a change stream through the balancer sees an insert made through it;
//   - one proxy SIGKILLed during a write load of annotated transactions, retryable writes and
//     retryable reads: the driver sees network errors, every transaction commits (withTransaction
//     retries it through the others), every retryable write and read succeeds, and afterwards
//     the outbox has 0 violations of DESIGN.md section 1: each committed document has exactly
//     its event, with one delivery per handler, no event without its committed document, every
//     event delivered (the killed proxy's lanes taken over after lease_ms).
//
// LB_UPSTREAM=sharded puts the double's two-shard cluster (two mongos) behind the tier instead
// of a replica set; LB_POOL_MODE=pooled runs the proxies in pooled mode. scripts/test runs the
// replica set in session mode and the sharded cluster in pooled mode; every combination runs
// by hand. LB_TXNS and LB_LOAD_TXNS scale the two transaction runs.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const H = require('../lib/proxy');
const { startHaproxy, haproxySkipReason } = require('../lib/haproxy');
const { startSink } = require('../dispatch/sink');
const D = require('../dispatch/helpers');

const SHARDED = process.env.LB_UPSTREAM === 'sharded';
const POOLED = process.env.LB_POOL_MODE === 'pooled';
const TXNS = Number(process.env.LB_TXNS || 200);
const LOAD_TXNS = Number(process.env.LB_LOAD_TXNS || 240);
const DB = H.uniqueDbName('lbtier');
const HANDLER = 'hook';
const skip = haproxySkipReason() || H.doubleOnlySkipReason('a SIGKILLed proxy and the double\'s --sharded') || false;
const mode = `${SHARDED ? 'sharded cluster' : 'replica set'}, ${POOLED ? 'pooled' : 'session'} mode`;

let upstream;
let sink;
let secret;
const proxies = [];
let lb;
let client;
let direct;
const started = []; // commandStarted events of `client`
const succeeded = [];

const hex = (x) => (x && x.toHexString ? x.toHexString() : String(x));
const outbox = () => direct.db('relaybus');

test.before(async () => {
  if (skip) return;
  upstream = SHARDED
    ? await H.startDouble({ sharded: { shards: 2, mongos: 2 } })
    : await H.startUpstream({ requireDouble: true, args: ['--txn-lifetime', '10'] });
  secret = D.newSecret();
  sink = await startSink({ secret });
  const checks = {};
  for (let i = 0; i < 3; i++) {
    const admin = await H.freePort();
    const p = await D.startDispatchProxy({
      upstream: upstream.uri,
      adminListen: `127.0.0.1:${admin}`,
      proxy: POOLED ? { pool_mode: 'pooled', pool_size: 8 } : {},
      // A killed dispatcher's lanes go to the others after lease_ms.
      dispatch: { lease_ms: 2000, poll_interval_ms: 200 },
      outbox: { handler_heartbeat: '1s' },
      handlers: [{ name: HANDLER, events: 'order.*', kind: 'webhook', url: sink.url('/hook'), secret }],
    });
    p.adminPort = admin;
    checks[p.port] = admin;
    proxies.push(p);
  }
  lb = await startHaproxy({ frontends: { tier: proxies.map((p) => p.port) }, checks });
  direct = new MongoClient(upstream.directUri, { serverSelectionTimeoutMS: 10000 });
  client = new MongoClient(lb.uri('tier'), { monitorCommands: true, maxPoolSize: 40, serverSelectionTimeoutMS: 15000 });
  client.on('commandStarted', (e) => started.push(e));
  client.on('commandSucceeded', (e) => succeeded.push(e));
  await client.connect();
});

test.after(async () => {
  if (client) await client.close().catch(() => {});
  if (direct) await direct.close().catch(() => {});
  if (lb) await lb.stop();
  for (const p of proxies) await p.stop().catch(() => {});
  if (sink) await sink.close();
  if (upstream) await upstream.stop();
});

/** An annotated transaction: one order and its event, through `session`. */
async function orderTxn(session, id, n) {
  const orders = client.db(DB).collection('orders');
  await session.withTransaction(async () => {
    await orders.insertOne({ _id: id, n }, {
      session,
      comment: { relaybus: { type: 'order.placed.v1', id: `ev-${id}`, key: `k-${n % 16}`, payload: { orderId: id } } },
    });
  });
}

const txnKey = (e) => (e.command && e.command.txnNumber !== undefined && e.command.lsid
  ? `${hex(e.command.lsid.id)}:${e.command.txnNumber}` : null);

test(`${mode}: 200 annotated transactions, 10 at a time, each on one proxy, every event delivered`, { skip, timeout: 180000 }, async (t) => {
  const from = started.length;
  let next = 0;
  const worker = async () => {
    const session = client.startSession();
    try {
      while (next < TXNS) {
        const n = next++;
        await orderTxn(session, `a-${n}`, n);
      }
    } finally {
      await session.endSession();
    }
  };
  await Promise.all(Array.from({ length: 10 }, worker));
  // Each transaction's statements and commit on one connection, so one proxy. (After a
  // transient error the driver unpins: its abortTransaction, like a retried commit, may use
  // another connection, as the specification allows.)
  const perTxn = new Map();
  const commits = new Set();
  for (const e of started.slice(from)) {
    const k = txnKey(e);
    if (!k || e.commandName === 'abortTransaction') continue;
    if (e.commandName === 'commitTransaction') {
      if (commits.has(k)) continue;
      commits.add(k);
    }
    if (!perTxn.has(k)) perTxn.set(k, new Set());
    perTxn.get(k).add(`${hex(e.serviceId)}/${e.connectionId}`);
  }
  // A transaction that withTransaction retried (a write conflict on a key's counter) has a
  // new txnNumber: at least one each.
  assert.ok(perTxn.size >= TXNS, `${perTxn.size} transactions for ${TXNS} documents`);
  for (const [k, s] of perTxn) assert.equal(s.size, 1, `transaction ${k} ran on one connection: ${[...s]}`);
  const services = new Set([...perTxn.values()].map((s) => [...s][0].split('/')[0]));
  assert.equal(services.size, 3, `the balancer spread the connections over the three proxies: ${[...services]}`);
  // Every event in the outbox, and delivered.
  const ids = Array.from({ length: TXNS }, (_, n) => `ev-a-${n}`);
  assert.equal(await outbox().collection('relaybus_events').countDocuments({ _id: { $in: ids } }), TXNS);
  await D.waitFor(() => ids.every((id) => sink.stats().ok.has(id)), 90000, `${TXNS} deliveries at the webhook`);
  const st = sink.stats();
  assert.equal(st.badSignatures, 0, 'every delivery signed');
  assert.deepEqual(st.seqViolations, [], 'each key in sequence order, one at a time');
  t.diagnostic(`${TXNS} transactions over ${services.size} proxies; ${sink.duplicates()} duplicate deliveries`);
});

test(`${mode}: 20 cursors at once, each reading its documents in batches of 2 on its own connection`, { skip, timeout: 120000 }, async () => {
  const coll = client.db(DB).collection('cursors');
  const docs = [];
  for (let g = 0; g < 20; g++) for (let i = 0; i < 9; i++) docs.push({ _id: g * 100 + i, g });
  await coll.insertMany(docs);
  const from = started.length;
  const fromOk = succeeded.length;
  const read = await Promise.all(Array.from({ length: 20 }, (_, g) => coll.find({ g }, { batchSize: 2, sort: { _id: 1 } }).toArray()));
  read.forEach((got, g) => assert.deepEqual(got.map((d) => d._id), Array.from({ length: 9 }, (_, i) => g * 100 + i), `cursor ${g}`));
  // Where each cursor was opened: its find's reply names the cursor id.
  const finds = new Map(started.slice(from).filter((e) => e.commandName === 'find').map((e) => [e.requestId, e]));
  const home = new Map();
  for (const e of succeeded.slice(fromOk)) {
    if (e.commandName !== 'find' || !finds.has(e.requestId)) continue;
    home.set(String(e.reply.cursor.id), `${hex(e.serviceId)}/${e.connectionId}`);
  }
  assert.equal(home.size, 20, 'twenty cursors opened');
  const getMores = started.slice(from).filter((e) => e.commandName === 'getMore');
  assert.equal(getMores.length, 20 * 4, 'four getMores each (9 documents, 2 a batch)');
  for (const e of getMores) {
    assert.equal(`${hex(e.serviceId)}/${e.connectionId}`, home.get(String(e.command.getMore)), 'a getMore on the connection of its find');
  }
  assert.ok(new Set([...home.values()].map((v) => v.split('/')[0])).size >= 2, 'the cursors spread over the proxies');
});

test(`${mode}: a change stream through the balancer sees an insert`, { skip, timeout: 60000 }, async () => {
  const coll = client.db(DB).collection('watched');
  await coll.insertOne({ _id: 'before' });
  const cs = coll.watch();
  try {
    assert.equal(await cs.tryNext(), null, 'the stream is open (its aggregate answered)');
    await coll.insertOne({ _id: 'seen', v: 1 });
    const ev = await H.within(cs.next(), 20000, null);
    assert.ok(ev, 'an event within 20 s');
    assert.equal(ev.operationType, 'insert');
    assert.deepEqual(ev.documentKey._id, 'seen');
    assert.deepEqual(ev.fullDocument, { _id: 'seen', v: 1 });
  } finally {
    await cs.close();
  }
});

test(`${mode}: one proxy SIGKILLed during a write load: retryable work succeeds through the others, 0 violations after`, { skip, timeout: 300000 }, async (t) => {
  const orders = client.db(DB).collection('orders');
  const plain = client.db(DB).collection('plain');
  const outcome = new Map();
  const networkErrors = [];
  const failLog = [];
  const onFail = (e) => { failLog.push(`${e.commandName} ${hex(e.serviceId)}/${e.connectionId} ${e.failure && e.failure.message}`); if (/network|closed|ECONNRESET|EPIPE/i.test(String(e.failure && (e.failure.name + e.failure.message)))) networkErrors.push(e.commandName); };
  client.on('commandFailed', onFail);
  // The pool clears of each service: the Node.js driver (7.x) returns the network error of a
  // connection whose service's pool was cleared before (a stale one) without the labels that
  // make it retry (lib/sdam/server.js, decorateCommandError: connectionIsStale returns the
  // error as it is), so an operation in flight on a second connection to the killed proxy
  // reaches the application. Such an error is the driver's; any other is the tier's.
  const cleared = new Set();
  const onCleared = (e) => cleared.add(hex(e.serviceId));
  client.on('connectionPoolCleared', onCleared);
  const serviceOf = (err) => {
    const m = /connection (\d+) to /.exec(err.message || '');
    const ev = m && started.find((x) => String(x.connectionId) === m[1]);
    return ev ? hex(ev.serviceId) : null;
  };
  const driverStale = (err) => err && err.name === 'MongoNetworkError' && [...(err.errorLabels || [])].length === 0 &&
    serviceOf(err) === victimService && cleared.has(victimService);
  const stale = [];
  let next = 0;
  let done = 0;
  let stop = false;
  const plainErrors = [];
  let plainOps = 0;
  const worker = async () => {
    const session = client.startSession();
    try {
      while (next < LOAD_TXNS) {
        const n = next++;
        const id = `b-${n}`;
        try {
          await orderTxn(session, id, n);
          outcome.set(id, 'committed');
        } catch (e) {
          if (driverStale(e)) { stale.push(`transaction ${id}: ${e.message}`); outcome.set(id, 'stale'); } else {
            outcome.set(id, `failed: ${e.name}: ${e.message} [${[...(e.errorLabels || [])].join(', ')}]`);
          }
        }
        done++;
      }
    } finally {
      await session.endSession();
    }
  };
  const plainWorker = async (w) => {
    let i = 0;
    while (!stop) {
      try {
        await plain.insertOne({ _id: `p-${w}-${i}` });
        const got = await plain.findOne({ _id: `p-${w}-${i}` });
        assert.ok(got, `p-${w}-${i} read back`);
        plainOps++;
      } catch (e) {
        if (driverStale(e)) stale.push(`plain p-${w}-${i}: ${e.message}`);
        else plainErrors.push(e.message);
      }
      i++;
    }
  };
  const victim = proxies[1];
  const victimService = hex((await (async () => {
    const c = await H.WireConn.connect({ port: victim.port });
    try { return (await c.request({ hello: 1, loadBalanced: true, $db: 'admin' })).doc.serviceId; } finally { c.destroy(); }
  })()));
  const killer = (async () => {
    while (done < LOAD_TXNS * 0.3) await H.sleep(10);
    await victim.kill();
  })();
  const plainRun = Promise.all([0, 1, 2].map(plainWorker));
  await Promise.all(Array.from({ length: 10 }, worker));
  stop = true;
  await plainRun;
  await killer;
  client.off('commandFailed', onFail);
  client.off('connectionPoolCleared', onCleared);
  assert.ok(victim.exitInfo() && victim.exitInfo().signal === 'SIGKILL', 'the proxy was killed');
  t.diagnostic(`${LOAD_TXNS} transactions and ${plainOps} retryable insert+find pairs; the driver saw ${networkErrors.length} network errors (${[...new Set(networkErrors)].join(', ')})`);
  assert.ok(networkErrors.length > 0, 'the driver saw the killed proxy\'s connections fail');
  t.diagnostic(`network errors the driver returned unretried (a connection of the killed proxy's cleared pool): ${stale.length}${stale.length ? `: ${stale.join('; ')}` : ''}`);
  const failed = [...outcome].filter(([, o]) => o !== 'committed' && o !== 'stale');
  assert.deepEqual(failed, [], `every transaction committed (retried through the other proxies); failed commands: ${failLog.join('; ')}`);
  assert.deepEqual(plainErrors, [], 'every retryable write and read succeeded');

  // ---- the invariants, read straight from the server ----
  const violations = [];
  const biz = new Map((await direct.db(DB).collection('orders').find({ _id: /^b-/ }).toArray()).map((d) => [d._id, d]));
  const events = await outbox().collection('relaybus_events').find({ _id: /^ev-b-/ }).toArray();
  const dels = await outbox().collection('relaybus_deliveries').find({ eventId: /^ev-b-/ }).toArray();
  const completed = await outbox().collection('relaybus_completed_deliveries').find({ eventId: /^ev-b-/ }).toArray().catch(() => []);
  for (const [id, o] of outcome) if (o === 'committed' && !biz.has(id)) violations.push(`committed ${id} is not stored`);
  // A transaction returned with such an error has an unknown outcome (the error may be its
  // commit's, which the server may have run): stored whole or not at all, as the checks below
  // require of every document.
  const evById = new Map(events.map((e) => [e._id, e]));
  for (const id of biz.keys()) {
    const ev = evById.get(`ev-${id}`);
    if (!ev) violations.push(`stored ${id} has no event`);
    else if (JSON.stringify(ev.handlers) !== JSON.stringify([HANDLER])) violations.push(`event of ${id} lists handlers ${JSON.stringify(ev.handlers)}`);
  }
  for (const e of events) if (!biz.has(e.payload.orderId)) violations.push(`event ${e._id} of a document that was not committed`);
  const perEvent = new Map();
  for (const d of [...dels, ...completed]) perEvent.set(d.eventId, (perEvent.get(d.eventId) || 0) + 1);
  for (const e of events) if ((perEvent.get(e._id) || 0) > 1) violations.push(`event ${e._id} has ${perEvent.get(e._id)} deliveries`);
  for (const d of dels) if (!evById.has(d.eventId)) violations.push(`delivery ${d._id} without its event`);
  // Every event delivered, the killed dispatcher's lanes taken over.
  try {
    await D.waitFor(() => events.every((e) => sink.stats().ok.has(e._id)), 120000, 'every event of the load at the webhook');
  } catch {
    violations.push(`${events.filter((e) => !sink.stats().ok.has(e._id)).length} event(s) never delivered`);
  }
  violations.push(...sink.stats().seqViolations);
  t.diagnostic(`after the kill: ${biz.size} documents, ${events.length} events, ${sink.stats().ok.size} events delivered in all, ${violations.length} violations`);
  assert.deepEqual(violations, [], '0 violations');
});
