'use strict';
// Atomicity under faults (issue 4, must-show 2). At least 2,000 transactions through the proxy
// from 16 concurrent sessions, with
//   - random aborts (the callback throws after the annotated write, or a manual abort),
//   - write conflicts forced with configureFailPoint (errorCode 112 + TransientTransactionError),
//   - upstream connections cut in the middle of an injection (failCommand closeConnection on the
//     outbox writes: `update` is only ever an events upsert here, `findAndModify` is the key
//     counter or the business counter, `insert` the deliveries or the business document),
//   - commits cut (closeConnection on commitTransaction: the driver retries the commit),
//   - the proxy killed with SIGKILL and restarted on the same port mid-run,
//   - and the primary stepped down twice in the middle of transactions (replSetStepDown on the
//     double: its transactions in progress are aborted, its writes in progress fail with 11602,
//     the other member is elected, and the proxy's connections to the old one relay its
//     not-primary errors and close).
// Afterwards, over every document written:
//   - every committed business document has exactly its events, each with one delivery per
//     subscribed handler and a `handlers` list naming exactly those;
//   - no event exists for a rolled-back write, no delivery without its event;
//   - per-key sequences are gapless (1..n, n = the key's counter) and follow commit order: each
//     transaction increments a business counter of the key by its number of keyed events, in the
//     same transaction, and its events' sequences must be exactly the values it got.
//
// FAULT_TXNS (default 2400) and FAULT_SESSIONS (default 16) scale the run.
//
// Pooled mode (FAULT_POOL_SIZE, set to 16 by fault-pooled.test.js): the proxy runs with
// pool_mode = pooled and that pool_size, and FAULT_CLIENTS client connections (default 4,000)
// are open through it during the run: the driver's, plus a crowd of raw connections that each
// send a find every second or so, are checked to get an answer every time (a reply, or an
// error a driver retries a read on: ExceededTimeLimit when the pool was busy past
// pool_wait_timeout_ms, a step-down's not-primary error), and connect again after the SIGKILL. The fail points then name the pool's appName (relaybus-proxy pool): the
// server sees the clients' traffic on the pool's connections. Every invariant below is the same.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const P = require('./lib');

const H = P.H;
const DB = H.uniqueDbName('pubfault');
const APP = `rbit-fault-${process.pid}`;
const TXNS = Number(process.env.FAULT_TXNS || 2400);
const SESSIONS = Number(process.env.FAULT_SESSIONS || 16);
const KEYS = 24;
const HANDLERS = { orders: 'order.*', confirmations: 'order.placed.v1', users: 'user.*' };
const POOL = Number(process.env.FAULT_POOL_SIZE || 0);
const CLIENTS = POOL ? Number(process.env.FAULT_CLIENTS || 4000) : 0;
// In pooled mode the server sees the pool's connections, which say this appName.
const FAIL_APP = POOL ? 'relaybus-proxy pool' : APP;
const RETRYABLE_READ_CODES = new Set([262, 10107, 13435, 13436, 11600, 11602, 189, 91]);

let s;
let restarted = null; // the proxy process started after the SIGKILL
const faults = { conflicts: 0, cuts: 0, commitCuts: 0, kills: 0, stepDowns: 0, aborts: 0 };
const STEP_DOWN_AT = [0.25, 0.65]; // fractions of the transactions done
const STEP_DOWN_SECS = 3; // the old primary is electable again after this

test.before(async () => {
  // Transactions orphaned by a killed proxy are reaped after 10 s instead of 60.
  s = await P.startStack({
    handlers: HANDLERS,
    requireDouble: true,
    upstreamArgs: ['--txn-lifetime', '10'],
    appName: APP,
    settings: POOL ? { pool_mode: 'pooled', pool_size: POOL, max_clients: CLIENTS + 500 } : undefined,
    proxyUlimit: POOL ? 65536 : undefined,
    clientOptions: { maxPoolSize: SESSIONS * 2, serverSelectionTimeoutMS: 30000, heartbeatFrequencyMS: 500 },
  });
});

/** Starts the proxy binary again with the first one's INI file: same port, same handlers. */
async function restartProxy(first) {
  const logPath = path.join(first.dir, 'proxy-restarted.stderr');
  const errFd = fs.openSync(logPath, 'a');
  const child = H.spawnMaybeUlimit([H.proxyBin(), '-c', first.iniPath], { ulimit: POOL ? 65536 : undefined, stdio: ['ignore', 'ignore', errFd], env: process.env });
  fs.closeSync(errFd);
  const exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
  process.on('exit', () => child.kill('SIGKILL'));
  const deadline = Date.now() + 20000;
  for (;;) {
    try {
      const conn = await H.WireConn.connect({ port: first.port, timeoutMs: 1000 });
      try {
        if ((await conn.command({ hello: 1, $db: 'admin' })).ok === 1) break;
      } finally {
        conn.destroy();
      }
    } catch {
      /* not yet */
    }
    if (Date.now() > deadline) throw new Error(`restarted proxy not ready:\n${fs.readFileSync(logPath, 'utf8')}`);
    await H.sleep(50);
  }
  return { child, exited, logPath, log: () => fs.readFileSync(logPath, 'utf8') };
}

async function failPoint(mode, data) {
  const r = await s.direct.db('admin').command({ configureFailPoint: 'failCommand', mode, data: { appName: FAIL_APP, ...data } });
  return r.count || 0;
}

// The fault schedule: every few hundred milliseconds another fail point, the previous one's
// hits counted under its kind.
const SCHEDULE = [
  { kind: null, mode: 'off' },
  { kind: 'conflicts', mode: { activationProbability: 0.08 }, data: { failCommands: ['update', 'findAndModify', 'insert'], errorCode: 112, errorLabels: ['TransientTransactionError'] } },
  { kind: 'cuts', mode: { activationProbability: 0.06 }, data: { failCommands: ['update'], closeConnection: true } },
  { kind: 'cuts', mode: { activationProbability: 0.04 }, data: { failCommands: ['findAndModify', 'insert'], closeConnection: true } },
  { kind: 'commitCuts', mode: { activationProbability: 0.05 }, data: { failCommands: ['commitTransaction'], closeConnection: true } },
];

test('2,000+ transactions from 16 sessions under aborts, conflicts, cuts, step-downs and a SIGKILL keep the outbox exact', { timeout: 15 * 60 * 1000 }, async (t) => {
  const orders = s.client.db(DB).collection('orders');
  const counters = s.client.db(DB).collection('key_counters');
  const outcome = new Map(); // txn id -> 'committed' | 'aborted' | 'failed'
  let next = 0;
  let done = 0;
  let stop = false;
  // A proxy that dies by itself (not the SIGKILL below) ends the run at once, rather than
  // leaving every transaction to time out.
  let died = null;
  let killing = false;
  const watchdog = setInterval(() => {
    const first = s.proxy.exitInfo();
    if (!died && first && !killing) died = { which: 'first', info: first, log: s.proxy.log() };
    if (!died && restarted && restarted.child.exitCode !== null) died = { which: 'restarted', info: { code: restarted.child.exitCode }, log: restarted.log() };
    if (died) stop = true;
  }, 200);

  // Fault controller.
  let current = SCHEDULE[0];
  const controller = (async () => {
    let i = 0;
    while (!stop) {
      await H.sleep(150 + Math.floor(Math.random() * 200));
      const nextPoint = SCHEDULE[(i = (i + 1 + Math.floor(Math.random() * 2)) % SCHEDULE.length)];
      try {
        const hits = await failPoint(nextPoint.mode, nextPoint.data || {});
        if (current.kind) faults[current.kind] += hits;
        current = nextPoint;
      } catch {
        /* the double is fine; a failed configure just keeps the old point */
      }
    }
    const hits = await failPoint('off', {}).catch(() => 0);
    if (current.kind) faults[current.kind] += hits;
  })();

  // The SIGKILL, once, when about 40% of the transactions are done.
  const killer = (async () => {
    while (!stop && done < TXNS * 0.4) await H.sleep(20);
    if (stop) return;
    killing = true;
    await s.proxy.kill(); // SIGKILL
    faults.kills++;
    await H.sleep(300);
    restarted = await restartProxy(s.proxy);
  })();

  // The step-downs, with transactions open on the primary from every session.
  const primaries = [];
  const stepper = (async () => {
    let lastAt = 0;
    for (const at of STEP_DOWN_AT) {
      while (!stop && (done < TXNS * at || Date.now() - lastAt < (STEP_DOWN_SECS + 1) * 1000)) await H.sleep(20);
      if (stop) return;
      const before = (await s.direct.db('admin').command({ hello: 1 })).primary;
      await s.direct.db('admin').command({ replSetStepDown: STEP_DOWN_SECS, secondaryCatchUpPeriodSecs: 1 });
      lastAt = Date.now();
      faults.stepDowns++;
      primaries.push(before);
    }
    let now = null;
    for (let i = 0; i < 100 && !now; i++) {
      now = (await s.direct.db('admin').command({ hello: 1 })).primary;
      if (!now) await H.sleep(50);
    }
    primaries.push(now);
  })();

  const worker = async () => {
    const session = s.client.startSession();
    try {
      while (next < TXNS && !died) {
        const n = next++;
        const id = `t-${n}`;
        const r = Math.random();
        const key = r < 0.15 ? null : `k-${Math.floor(Math.random() * KEYS)}`;
        const two = key && Math.random() < 0.15; // two events of one key in one statement
        const explicitId = Math.random() < 0.3;
        const abortKind = Math.random() < 0.08 ? (Math.random() < 0.5 ? 'throw' : 'manual') : null;
        const type = Math.random() < 0.8 ? 'order.placed.v1' : 'user.signed_up.v1';
        const body = async () => {
          const m = key ? (two ? 2 : 1) : 0;
          let v = 0;
          if (key) {
            const c = await counters.findOneAndUpdate({ _id: key }, { $inc: { n: m } }, { session, upsert: true, returnDocument: 'after' });
            v = c.n;
          }
          const evs = [];
          for (let e = 0; e < Math.max(1, m); e++) {
            const ev = { type, payload: { orderId: id, n: key ? v - m + 1 + e : null, e } };
            if (key) ev.key = key;
            if (explicitId) ev.id = `ev-${id}-${e}`;
            evs.push(ev);
          }
          await orders.insertOne({ _id: id, key, events: evs.length }, { session, comment: { relaybus: evs.length === 1 ? evs[0] : evs, worker: 'fault' } });
        };
        try {
          if (abortKind === 'manual') {
            session.startTransaction();
            try {
              await body();
            } finally {
              await session.abortTransaction().catch(() => {});
            }
            outcome.set(id, 'aborted');
          } else {
            await session.withTransaction(async () => {
              await body();
              if (abortKind === 'throw') throw new Error('random abort');
            });
            outcome.set(id, 'committed');
          }
        } catch (e) {
          if (abortKind) outcome.set(id, 'aborted');
          else outcome.set(id, `failed: ${e.message}`);
        }
        done++;
      }
    } finally {
      await session.endSession().catch(() => {});
    }
  };
  // Pooled: the crowd of client connections beside the transactions.
  const crowdStats = { answered: 0, retryable: 0, reconnects: 0, maxServerConnections: 0 };
  const crowdMember = async (i) => {
    let conn = null;
    await H.sleep(Math.floor(Math.random() * 3000));
    while (!stop) {
      try {
        if (!conn) {
          conn = await H.WireConn.connect({ port: s.proxy.port, timeoutMs: 10000 });
          await conn.command({ hello: 1, $db: 'admin' }, { timeoutMs: 20000 });
        }
        const r = await conn.command({ find: 'orders', filter: { _id: `t-${i % TXNS}` }, $db: DB }, { timeoutMs: 30000 });
        if (r.ok === 1) crowdStats.answered++;
        // The pool was busy past pool_wait_timeout_ms, or a step-down's not-primary error
        // relayed from the old primary: errors a driver retries a read on.
        else if (RETRYABLE_READ_CODES.has(r.code)) crowdStats.retryable++;
        else throw new Error(`crowd find ${i}: ${JSON.stringify(r)}`);
      } catch (e) {
        if (/no reply within/.test(e.message) || /crowd find/.test(e.message)) throw e;
        // The SIGKILL (or a cut) closed it: connect again.
        if (conn) conn.destroy();
        conn = null;
        crowdStats.reconnects++;
        await H.sleep(200);
        continue;
      }
      await H.sleep(500 + Math.floor(Math.random() * 1000));
    }
    if (conn) conn.destroy();
  };
  const crowdSize = Math.max(0, CLIENTS - SESSIONS * 2);
  const crowd = Array.from({ length: crowdSize }, (_, i) => crowdMember(i));
  const sampler = (async () => {
    while (POOL && !stop) {
      const st = await s.direct.db('admin').command({ serverStatus: 1 }).catch(() => null);
      if (st) crowdStats.maxServerConnections = Math.max(crowdStats.maxServerConnections, st.connections.current);
      await H.sleep(250);
    }
  })();

  await Promise.all(Array.from({ length: SESSIONS }, worker));
  stop = true;
  clearInterval(watchdog);
  if (died) assert.fail(`the ${died.which} proxy exited by itself (${JSON.stringify(died.info)}); log tail:\n${H.tail(died.log)}`);
  await Promise.all(crowd);
  await sampler;
  if (POOL) {
    t.diagnostic(`pooled: ${crowdSize} crowd connections + the driver's ${SESSIONS * 2} over pool_size = ${POOL}: ` +
      `${crowdStats.answered} finds answered, ${crowdStats.retryable} answered with a retryable error, ` +
      `${crowdStats.reconnects} reconnects, at most ${crowdStats.maxServerConnections} server connections`);
    assert.ok(crowdStats.answered >= crowdSize, 'the crowd got its answers');
  }
  await killer;
  await stepper;
  await controller;
  faults.aborts = [...outcome.values()].filter((o) => o === 'aborted').length;

  // ---- invariants, read straight from the server ----
  const failed = [...outcome.entries()].filter(([, o]) => o.startsWith('failed'));
  const committedIds = [...outcome.entries()].filter(([, o]) => o === 'committed').map(([id]) => id);
  const abortedIds = new Set([...outcome.entries()].filter(([, o]) => o === 'aborted').map(([id]) => id));
  const direct = s.direct.db(DB);
  const bizDocs = await direct.collection('orders').find({}).toArray();
  const biz = new Map(bizDocs.map((d) => [d._id, d]));
  const events = await s.outbox.events.find({}).toArray();
  const deliveries = await s.outbox.deliveries.find({}).toArray();
  const keyCounters = await s.outbox.keys.find({}).toArray();
  const bizCounters = new Map((await direct.collection('key_counters').find({}).toArray()).map((d) => [d._id, d.n]));

  t.diagnostic(`transactions: ${outcome.size} (committed ${committedIds.length}, aborted ${abortedIds.size}, failed ${failed.length}); ` +
    `faults: ${JSON.stringify(faults)}; events ${events.length}, deliveries ${deliveries.length}`);

  const reasons = {};
  for (const [, o] of failed) {
    const r = o.replace(/connection \d+/g, 'connection N').replace(/127\.0\.0\.1:\d+/g, 'proxy');
    reasons[r] = (reasons[r] || 0) + 1;
  }
  if (failed.length) t.diagnostic(`failed transactions (outcome unknown to the client): ${JSON.stringify(reasons)}`);
  assert.ok(outcome.size >= Math.min(2000, TXNS), 'at least 2,000 transactions');
  assert.equal(faults.kills, 1, 'the proxy was killed once');
  assert.equal(faults.stepDowns, STEP_DOWN_AT.length, `the primary stepped down ${STEP_DOWN_AT.length} times`);
  for (let i = 1; i < primaries.length; i++) assert.notEqual(primaries[i], primaries[i - 1], `step-down ${i} elected the other member (${primaries.join(' -> ')})`);
  assert.ok(faults.conflicts > 0, 'write conflicts were forced');
  assert.ok(faults.cuts > 0, 'connections were cut during injections');
  // The client's view agrees with the server's.
  for (const id of committedIds) assert.ok(biz.has(id), `committed ${id} is stored`);
  for (const id of abortedIds) assert.ok(!biz.has(id), `aborted ${id} is not stored`);

  // Events grouped by business document.
  const byOrder = new Map();
  for (const ev of events) {
    const oid = ev.payload && ev.payload.orderId;
    assert.ok(biz.has(oid), `event ${ev._id} belongs to a committed business document (no event of a rolled-back write)`);
    if (!byOrder.has(oid)) byOrder.set(oid, []);
    byOrder.get(oid).push(ev);
  }
  const delsByEvent = new Map();
  for (const d of deliveries) {
    const k = `${d.eventId}\u0000${d.handler}`;
    assert.ok(!delsByEvent.has(k), `one delivery per (event, handler): ${k}`);
    delsByEvent.set(k, d);
  }
  const eventIds = new Set(events.map((e) => e._id));
  for (const d of deliveries) assert.ok(eventIds.has(d.eventId), `delivery ${d._id} has its event`);

  for (const [id, doc] of biz) {
    const evs = byOrder.get(id) || [];
    assert.equal(evs.length, doc.events, `business document ${id} has exactly its ${doc.events} event(s)`);
    for (const ev of evs) {
      const want = P.subscribed(HANDLERS, ev.type);
      assert.deepEqual([...ev.handlers].sort(), [...want].sort(), `handlers of ${ev._id}`);
      for (const h of want) {
        const d = delsByEvent.get(`${ev._id}\u0000${h}`);
        assert.ok(d, `event ${ev._id} has its delivery for ${h}`);
        assert.equal(d.laneId, P.laneId(ev.key, ev._id));
        if (ev.key) assert.equal(Number(d.sequence), Number(ev.sequence));
      }
      assert.equal(deliveries.filter((d) => d.eventId === ev._id).length, want.length, `no extra delivery for ${ev._id}`);
      if (doc.key) {
        assert.equal(ev.key, doc.key);
        assert.equal(Number(ev.sequence), ev.payload.n, `${ev._id}: its sequence is the business counter value of its transaction (commit order)`);
      } else {
        assert.equal(ev.key, undefined);
      }
    }
  }

  // Gapless per key, and equal to both counters.
  const byKey = new Map();
  for (const ev of events) {
    if (!ev.key) continue;
    if (!byKey.has(ev.key)) byKey.set(ev.key, []);
    byKey.get(ev.key).push(Number(ev.sequence));
  }
  for (const c of keyCounters) {
    const seqs = (byKey.get(c._id) || []).sort((a, b) => a - b);
    assert.deepEqual(seqs, Array.from({ length: seqs.length }, (_, i) => i + 1), `sequences of ${c._id} are 1..n without gaps`);
    assert.equal(Number(c.value), seqs.length, `the counter of ${c._id} equals its event count`);
    assert.equal(bizCounters.get(c._id), seqs.length, `the business counter of ${c._id} agrees`);
  }
  assert.equal(keyCounters.length, byKey.size);
});

test('the restarted proxy exits 0 on SIGTERM; no sanitizer report in either log', async () => {
  await s.closeClients();
  assert.ok(restarted, 'the proxy was restarted');
  restarted.child.kill('SIGTERM');
  const r = await H.within(restarted.exited, 10000, null);
  assert.ok(r, 'exited within 10 s');
  assert.equal(r.signal, null);
  assert.equal(r.code, 0);
  H.assertNoSanitizerReports(restarted.log(), 'restarted proxy');
  H.assertNoSanitizerReports(s.proxy.log(), 'first proxy');
  assert.ok(!/assertion|Assertion/.test(restarted.log() + s.proxy.log()), 'no assertion failure logged');
});

test.after(async () => {
  if (restarted && restarted.child.exitCode === null) restarted.child.kill('SIGKILL');
  if (s) {
    await s.closeClients();
    await s.proxy.kill().catch(() => {});
    await s.upstream.stop();
  }
});
