'use strict';
// The fleet's handler set never costs a handler a delivery (docs/handlers.md, "One handler set
// for the fleet"): a handler stays in the set for handler_retire_after after its declarer's last
// heartbeat, heartbeats are the server's clock, and a proxy reads the set before it publishes.
//
// 1. Three proxies: D is the only one that declares `sink` (a webhook), P and R publish. D is
//    stopped with SIGSTOP for STALL_MS (far longer than three heartbeats: D looks dead), R
//    restarts meanwhile, and P publishes throughout, also in transactions that stay open for
//    TXN_MS across the stall. After SIGCONT every committed event reaches `sink` exactly once,
//    each key in sequence order. Run twice: with every clock right, and with P's clock ahead of
//    the server's by SKEW (libfaketime through LD_PRELOAD; skipped without it), where P used to
//    judge D's heartbeats by its own clock.
// 2. A handler added while a transaction is open: the transaction's event, committed after the
//    old backfill window (three heartbeats, 0.9 s) and within transaction_lifetime, gets the new
//    handler's delivery, and the handler's deliveries wait for the backfill.
// 3. The same with the server's transaction lifetime (7 s) longer than transaction_lifetime (1 s):
//    the backfill covers the server's, so an event committed 3.5 s after the declaration, past
//    the key's window, still gets its delivery.
// 4. A proxy whose dispatcher has not read the fleet's set yet refuses publishes with a
//    transient error (they would miss the other proxies' handlers), and /readyz says why; once
//    the set is read, a publish gets the other proxy's handler's delivery.
//
// Durations (ms), from the environment; the defaults are CI's size, bench/fleet-gaps runs the
// full one (a 30 s stall and transactions open for 40 s):
//   RELAYBUS_FLEET_GAPS_STALL_MS (6000), RELAYBUS_FLEET_GAPS_TXN_MS (8000),
//   RELAYBUS_FLEET_GAPS_SKEW (faketime offset, "+5s").

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const { MongoClient } = require('mongodb');
const H = require('../lib/proxy');
const { startUpstream, startProxy, uniqueDbName, freePort, sleep, registerFinalChecks } = H;
const { startSink } = require('./sink');
const { startDispatchProxy, publishThroughProxy, waitFor, upstreamWithFailPoints } = require('./helpers');

const STALL_MS = Number(process.env.RELAYBUS_FLEET_GAPS_STALL_MS || 6000);
const TXN_MS = Number(process.env.RELAYBUS_FLEET_GAPS_TXN_MS || 8000);
const SKEW = process.env.RELAYBUS_FLEET_GAPS_SKEW || '+5s';
const FAKETIME_LIB = '/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1';
const HEARTBEAT = '500ms';
const cleanups = [];

async function getJson(port, path) {
  const res = await fetch(`http://127.0.0.1:${port}${path}`);
  return { status: res.status, body: await res.json() };
}

// A publishing proxy (dispatch off, no handler of its own) with an admin port. The two ports
// are drawn apart, so they may meet: then it starts again with others.
async function startPublisher(up, db, env, settings, outbox = { handler_heartbeat: HEARTBEAT }) {
  for (let attempt = 0; ; attempt++) {
    const adminPort = await freePort();
    try {
      const p = await startProxy({
        upstream: up.uri,
        env,
        settings,
        extraIni: ['[outbox]', ...Object.entries({ ...outbox, database: db }).map(([k, v]) => `${k} = ${v}`),
          '', '[admin]', `listen = 127.0.0.1:${adminPort}`, ''].join('\n'),
      });
      p.adminPort = adminPort;
      return p;
    } catch (e) {
      if (attempt >= 2 || !/Address already in use/.test(e.message)) throw e;
    }
  }
}

const connect = (p) => new MongoClient(p.uri({ directConnection: true }), { serverSelectionTimeoutMS: 10000 }).connect();

// What P's dispatcher last read: D's instance and the set.
async function fleetView(p) {
  const { body } = await getJson(p.adminPort, '/api/handlers');
  return body.fleet;
}

async function scenario(t, { skew }) {
  const up = await startUpstream();
  cleanups.push(up);
  // What `sink` received, in order: [eventId, key, sequence].
  const got = [];
  const sink = await startSink({ respond: (ev) => { got.push([ev.id, ev.key, Number(ev.sequence)]); return { status: 204 }; } });
  cleanups.push({ stop: () => sink.close() });
  const db = uniqueDbName('fleet_gaps');
  const d = await startDispatchProxy({
    upstream: up.uri, outbox: { database: db, handler_heartbeat: HEARTBEAT }, dispatch: { poll_interval_ms: 100 },
    handlers: [{ name: 'sink', kind: 'webhook', events: 'order.*', url: sink.url('/sink') }],
  });
  cleanups.push({ stop: () => d.kill() });
  const env = skew ? {
    LD_PRELOAD: FAKETIME_LIB, FAKETIME: skew, FAKETIME_DONT_FAKE_MONOTONIC: '1', FAKETIME_NO_CACHE: '1',
    ASAN_OPTIONS: 'abort_on_error=0:detect_leaks=1:verify_asan_link_order=0',
  } : undefined;
  const p = await startPublisher(up, db, env);
  let r = await startPublisher(up, db);
  const knowsSink = async (x) => (await fleetView(x)).instances.some((i) => i.handlers.some((h) => h.name === 'sink'));
  await waitFor(async () => (await knowsSink(p)) && (await knowsSink(r)), 20000, 'P and R to read D\'s handler');

  const viaP = await connect(p);
  cleanups.push({ stop: () => viaP.close() });
  const committed = [];
  let n = 0;
  const mk = (key) => ({ id: `e-${n++}`, type: 'order.placed', key, payload: { n } });
  // P publishes throughout, one event per transaction, keys k0..k3 in turn.
  let publishing = true;
  const loop = (async () => {
    while (publishing) {
      const e = mk(`k${n % 4}`);
      await publishThroughProxy(viaP, 'app', [e]);
      committed.push(e.id);
      await sleep(20);
    }
  })();
  // Transactions open across the stall: each key's events in one of them.
  const long = (async () => {
    await sleep(0); // after the SIGSTOP below: opened while D is stopped
    const out = [];
    await Promise.all(['long0', 'long1'].map(async (key) => {
      const session = viaP.startSession();
      const evs = [mk(key), mk(key), mk(key)];
      try {
        // Retried whole on a transient error (a write conflict with the other publishes).
        await session.withTransaction(async () => {
          for (const e of evs) {
            const relaybus = { type: e.type, id: e.id, key, payload: e.payload };
            await viaP.db('app').collection('items').insertOne({ _id: e.id }, { session, comment: { relaybus } });
          }
          await sleep(TXN_MS);
        });
        out.push(...evs.map((e) => e.id));
      } finally {
        await session.endSession();
      }
    }));
    return out;
  })();
  // Their failures are seen where they are awaited, after the stall.
  loop.catch(() => {});
  long.catch(() => {});

  // D stalls: after three heartbeats the others see it as not live, and keep its handler.
  process.kill(d.child.pid, 'SIGSTOP');
  const stalledAt = Date.now();
  try {
    await waitFor(async () => {
      const ds = (await fleetView(p)).instances.filter((i) => i.handlers.some((h) => h.name === 'sink'));
      return ds.length === 1 && !ds[0].live;
    }, 20000, 'P to see D as not live');
    // R restarts while D looks dead; its first publishes come before any heartbeat of D.
    await r.stop();
    r = await startPublisher(up, db);
    const viaR = await connect(r);
    for (let i = 0; i < 4; i++) {
      const e = mk(`k${i}`);
      // Through R while P publishes on the same keys: the order of the sequences is the outbox's.
      await publishThroughProxy(viaR, 'app', [e]);
      committed.push(e.id);
    }
    await viaR.close();
    const left = STALL_MS - (Date.now() - stalledAt);
    if (left > 0) await sleep(left); // the stall itself: D stays stopped this long
  } finally {
    process.kill(d.child.pid, 'SIGCONT');
  }
  committed.push(...await long);
  publishing = false;
  await loop;

  try {
    await waitFor(async () => { const ids = new Set(got.map((x) => x[0])); return committed.every((id) => ids.has(id)); },
      60000, 'every committed event at the sink');
  } catch (e) {
    const missing = committed.filter((id) => !got.some((x) => x[0] === id));
    e.message += `: ${missing.length} of ${committed.length} missing (${missing.slice(0, 10).join(', ')})`;
    throw e;
  }
  const ids = got.map((x) => x[0]);
  assert.equal(ids.length, new Set(ids).size, 'each event reached the sink once');
  assert.deepEqual(new Set(ids), new Set(committed), 'only committed events');
  for (const key of ['k0', 'k1', 'k2', 'k3', 'long0', 'long1']) {
    const seqs = got.filter((x) => x[1] === key).map((x) => x[2]);
    assert.deepEqual(seqs, [...seqs].sort((a, b) => a - b), `key ${key} in sequence order: ${seqs}`);
  }
  const direct = await new MongoClient(up.directUri || up.uri, { serverSelectionTimeoutMS: 10000 }).connect();
  try {
    const events = direct.db(db).collection('relaybus_events');
    assert.equal(await events.countDocuments({ handlers: { $ne: 'sink' } }), 0, 'every event lists sink');
  } finally {
    await direct.close();
  }
  t.diagnostic(`${committed.length} events, ${Date.now() - stalledAt} ms from the SIGSTOP to the last delivery`);
  await viaP.close();
  assert.equal((await d.stop()).code, 0);
}

test('a stalled declarer, a restart and long transactions lose no delivery', { timeout: 120000 + 2 * (STALL_MS + TXN_MS) },
  (t) => scenario(t, { skew: null }));

test('the same with the publishing proxy\'s clock ahead of the server\'s', { timeout: 120000 + 2 * (STALL_MS + TXN_MS) },
  async (t) => {
    if (!fs.existsSync(FAKETIME_LIB)) return t.skip(`no ${FAKETIME_LIB} (Debian's faketime package)`);
    await scenario(t, { skew: SKEW });
  });

// A handler `late` declared while a transaction is open, which commits `commitAfterMs` after
// the declaration: its event must reach `late` once. The server's transactions live
// `serverLifetime` seconds, [outbox] transaction_lifetime is `keyLifetime`. Returns `late`'s
// proxy (stopped) for its log; afterId, when given, is published once P has read `late`.
async function lateHandlerScenario(t, { serverLifetime, keyLifetime, commitAfterMs, id, dbPrefix, afterId }) {
  const up = await startUpstream({ requireDouble: true, args: ['--txn-lifetime', String(serverLifetime)] });
  t.after(() => up.stop());
  const got = { '/base': [], '/late': [] };
  const sink = await startSink({ respond: (ev, req) => { (got[req.url] || (got[req.url] = [])).push(ev.id); return { status: 204 }; } });
  t.after(() => sink.close());
  const db = uniqueDbName(dbPrefix);
  const outbox = { database: db, handler_heartbeat: '300ms', transaction_lifetime: keyLifetime };
  const dispatch = { poll_interval_ms: 100 };
  const d = await startDispatchProxy({ upstream: up.uri, outbox, dispatch,
    handlers: [{ name: 'base', kind: 'webhook', events: 'order.*', url: sink.url('/base') }] });
  t.after(() => d.kill());
  const p = await startPublisher(up, db, undefined, undefined, outbox);
  const viaP = await connect(p);
  t.after(() => viaP.close());
  const declares = (name) => async () => (await fleetView(p)).instances.some((i) => i.handlers.some((h) => h.name === name));
  await waitFor(declares('base'), 20000, 'P to read base');
  // One publish first: it creates `items`, which a transaction would hold until its commit.
  await publishThroughProxy(viaP, 'app', [{ id: 'before-0', type: 'order.placed', key: 'k-before', payload: {} }]);
  // Opened before `late` exists, committed commitAfterMs after its first declaration (the
  // proxy declares it before it listens), nothing between.
  const session = viaP.startSession();
  session.startTransaction();
  await viaP.db('app').collection('items').insertOne({ _id: id },
    { session, comment: { relaybus: { type: 'order.placed', id, key: 'k-long', payload: {} } } });
  const a = await startDispatchProxy({ upstream: up.uri, outbox, dispatch,
    handlers: [{ name: 'late', kind: 'webhook', events: 'order.placed', url: sink.url('/late') }] });
  t.after(() => a.kill());
  await sleep(commitAfterMs);
  await session.commitTransaction();
  await session.endSession();
  const want = [id];
  if (afterId) {
    await waitFor(declares('late'), 20000, 'P to read late');
    await publishThroughProxy(viaP, 'app', [{ id: afterId, type: 'order.placed', key: 'k-after', payload: {} }]);
    want.push(afterId);
  }
  await waitFor(async () => want.every((w) => got['/late'].includes(w)), 30000, `${want.join(' and ')} at late`);
  for (const w of want) assert.equal(got['/late'].filter((x) => x === w).length, 1, `${w} once`);
  await viaP.close();
  assert.equal((await a.stop()).code, 0);
  assert.equal((await d.stop()).code, 0);
  return a;
}

test('an event of a transaction open across a handler\'s first declaration gets its delivery', { timeout: 90000 },
  async (t) => {
    const skip = H.doubleOnlySkipReason('a server whose transactions live 4 s (the backfill window covers the server\'s limit)');
    if (skip) return t.skip(skip);
    // The server's limit is the key's (4 s); a liveness bound of 0.9 s was the old window.
    const a = await lateHandlerScenario(t, { serverLifetime: 4, keyLifetime: '4s', commitAfterMs: 2500,
      id: 'long-0', dbPrefix: 'fleet_late', afterId: 'after-0' });
    assert.match(a.log(), /handler late is new to the fleet/);
  });

test('the backfill window covers the server\'s transaction lifetime when it is longer than the key\'s', { timeout: 90000 },
  async (t) => {
    const skip = H.doubleOnlySkipReason('a server started with a transaction lifetime of 7 s');
    if (skip) return t.skip(skip);
    // The server aborts transactions after 7 s; [outbox] transaction_lifetime says 1 s, so the
    // key's window reaches 1.9 s (three 300 ms heartbeats and 1 s) past the declaration. The
    // commit comes 3.5 s after it: past the key's window, within the server's limit.
    const a = await lateHandlerScenario(t, { serverLifetime: 7, keyLifetime: '1s', commitAfterMs: 3500,
      id: 'long-1', dbPrefix: 'fleet_limit' });
    assert.match(a.log(), /the server's transactionLifetimeLimitSeconds is 7000 ms, \[outbox\] transaction_lifetime 1000 ms: using 7000 ms/);
  });

test('before its first read of the fleet\'s set a proxy refuses publishes, and /readyz says why', { timeout: 60000 },
  async (t) => {
    const fpu = await upstreamWithFailPoints(t);
    if (!fpu) return;
    const { up, fp } = fpu;
    const got = [];
    const sink = await startSink({ respond: (ev) => { got.push(ev.id); return { status: 204 }; } });
    t.after(() => sink.close());
    const db = uniqueDbName('fleet_start');
    const d = await startDispatchProxy({
      upstream: up.uri, outbox: { database: db, handler_heartbeat: HEARTBEAT }, dispatch: { poll_interval_ms: 100 },
      handlers: [{ name: 'sink', kind: 'webhook', events: 'order.*', url: sink.url('/sink') }],
    });
    t.after(() => d.kill());
    // The new proxy's dispatcher cannot read the fleet's documents (its finds fail).
    await fp('alwaysOn', { failCommands: ['find'], appName: 'relaybus-proxy dispatch', errorCode: 91 });
    const p = await startPublisher(up, db, undefined, { upstream_connect_timeout_ms: 1000 });
    const adminPort = p.adminPort;
    const ready = await getJson(adminPort, '/readyz');
    assert.equal(ready.status, 503);
    assert.equal(ready.body.fleet, false);
    assert.match(ready.body.reason, /fleet's handler set has not been read/);
    const viaP = await connect(p);
    t.after(() => viaP.close());
    const session = viaP.startSession();
    session.startTransaction();
    await assert.rejects(
      viaP.db('app').collection('items').insertOne({ _id: 'early' }, { session, comment: { relaybus: { type: 'order.placed', id: 'early', payload: {} } } }),
      (e) => e.code === 365 && e.hasErrorLabel('TransientTransactionError') && /fleet's handler set/.test(e.message),
    );
    await session.abortTransaction().catch(() => {});
    await session.endSession();
    // It waited for the set before it listened, as long as it waits for a primary.
    assert.match(p.log(), /the fleet's handler set is not read yet; listening anyway/);

    await fp('off', {});
    await waitFor(async () => (await getJson(adminPort, '/readyz')).status === 200, 20000, '/readyz to be ready');
    await publishThroughProxy(viaP, 'app', [{ id: 'after', type: 'order.placed', payload: {} }]);
    await waitFor(async () => got.includes('after'), 20000, 'the event at the other proxy\'s handler');
    await viaP.close();
    assert.equal((await d.stop()).code, 0);
  });

registerFinalChecks(test, cleanups);
