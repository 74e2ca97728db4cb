'use strict';
// End to end at scale: events published into the outbox in transactions are
// dispatched by two proxy instances to three webhook handlers served by Node
// sinks (one fails 20% of its requests, one is slow, one answers 400 to some
// events), and one proxy is killed with SIGKILL mid-run. The events are
// written the way the publishing path writes them (helpers.js,
// docs/outbox-schema.md), directly with the Node driver inside transactions,
// which is much faster on the double.
//
// Scale: RELAYBUS_DISPATCH_EVENTS (default 600) events on
// RELAYBUS_DISPATCH_KEYS (default 30) keys; scripts/test runs 3,000 on 50 on
// build/ (and the default on the ASan build), bench/dispatch-full the full
// 10,000 on 50.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const { uniqueDbName } = require('../lib/proxy');
const { startSink } = require('./sink');
const { startDispatchProxy, publish, waitFor } = require('./helpers');
const { N_EVENTS, N_KEYS, TIMEOUT_MS, SECRET, lcg, makeEvents, report, upstreamFor } = require('./events');

test('two proxies deliver every event to three webhook handlers in key order, one of them SIGKILLed mid-run', { timeout: TIMEOUT_MS + 60000 }, async (t) => {
  const up = await upstreamFor(t);
  const db = uniqueDbName('dispatch');
  const failing = await startSink({ secret: SECRET, fail: 0.2, rand: lcg(42) });
  const slow = await startSink({ secret: SECRET, delayMs: 15 });
  const picky = await startSink({ secret: SECRET, answer400: (ev) => ev.payload.i % 37 === 5 });
  t.after(() => Promise.all([failing.close(), slow.close(), picky.close()]));
  const handlers = [
    { name: 'failing', events: '*', kind: 'webhook', url: failing.url('/f'), secret: SECRET, max_attempts: 25, concurrency: 16 },
    { name: 'slow', events: '*', kind: 'webhook', url: slow.url('/s'), secret: SECRET, concurrency: 16 },
    // retry_4xx = false: its 400s are dead letters at once (the default retries them).
    { name: 'picky', events: '*', kind: 'webhook', url: picky.url('/p'), secret: SECRET, concurrency: 16, retry_4xx: false },
  ];
  const opts = {
    upstream: up.uri,
    outbox: { database: db },
    dispatch: { poll_interval_ms: 100, batch_size: 100, lease_ms: 3000 },
    handlers,
  };
  const p1 = await startDispatchProxy(opts);
  const p2 = await startDispatchProxy(opts);
  let p3 = null;
  t.after(() => Promise.all([p1.kill(), p2.kill(), p3 && p3.kill()]));
  const client = await new MongoClient(up.uri).connect();
  t.after(() => client.close());

  const events = makeEvents(N_EVENTS, N_KEYS, 'ev');
  const t0 = Date.now();
  // Mid-run, the second proxy is killed with SIGKILL and a third one takes
  // its place: its lanes come back after the lease, nothing is lost, and
  // what it had in flight shows up as duplicates (counted below).
  const killer = (async () => {
    await waitFor(() => slow.stats().ok.size >= events.length / 3, TIMEOUT_MS, 'a third of the run');
    await p2.kill();
    t.diagnostic(`SIGKILLed the second proxy after ${slow.stats().ok.size} events reached the slow handler`);
    p3 = await startDispatchProxy(opts);
  })();
  await publish(client, db, events, handlers.map((h) => h.name), 25);
  t.diagnostic(`published ${events.length} events in ${Date.now() - t0} ms`);
  const expect400 = events.filter((e) => e.payload.i % 37 === 5);
  const deliveries = client.db(db).collection('relaybus_deliveries');
  await waitFor(async () => (await deliveries.countDocuments({ status: 'pending' })) === 0 && p3, TIMEOUT_MS,
    'every delivery to finish');
  await killer;
  t.diagnostic(`all delivered in ${Date.now() - t0} ms`);
  for (const [name, p] of [['first proxy', p1], ['replacement', p3]]) {
    t.diagnostic(`${name}: ${(p.log().match(/ not started: /g) || []).length} deliveries given back unstarted (lease short)`);
  }

  for (const [name, sink] of [['failing', failing], ['slow', slow], ['picky', picky]]) report(t, name, sink);
  // Every event reached every healthy handler.
  for (const e of events) {
    assert.ok(failing.stats().ok.has(e.id), `failing sink never acknowledged ${e.id}`);
    assert.ok(slow.stats().ok.has(e.id), `slow sink never acknowledged ${e.id}`);
  }
  for (const e of events) {
    if (e.payload.i % 37 === 5) assert.ok(!picky.stats().ok.has(e.id));
    else assert.ok(picky.stats().ok.has(e.id), `picky sink never acknowledged ${e.id}`);
  }
  // One at a time and in sequence, per key, at every handler.
  for (const [name, sink] of [['failing', failing], ['slow', slow], ['picky', picky]]) {
    assert.deepEqual(sink.stats().seqViolations.slice(0, 10), [], `${name}: per-key order`);
    assert.equal(sink.stats().badSignatures, 0, `${name}: signatures`);
  }
  // The 400s are dead with their error; nothing else is left.
  const dead = await deliveries.find({ status: 'dead' }).toArray();
  assert.equal(dead.length, expect400.length);
  for (const d of dead) {
    assert.equal(d.handler, 'picky');
    assert.match(d.lastError, /^HTTP 400: rejected /);
    // 1, or 2 when the killed proxy had it in flight (the lost attempt counts)
    assert.ok(d.attempts === 1 || d.attempts === 2, `attempts ${d.attempts}`);
  }
  assert.equal(await deliveries.countDocuments({}), expect400.length);
  const r1 = await p1.stop();
  const r3 = await p3.stop();
  assert.deepEqual([r1.code, r3.code], [0, 0]);
  // The two proxies stopped with SIGTERM hand their lanes back. The SIGKILLed
  // one cannot: a lane of it that nobody needed after its lease ran out keeps
  // its name (expired), so only the stopped proxies' lanes are counted.
  // Owners are "<host>/<pid>/<random>".
  for (const p of [p1, p3]) {
    assert.equal(await client.db(db).collection('relaybus_lanes').countDocuments({
      owner: { $regex: `/${p.pid}/` } }), 0, `lanes of pid ${p.pid} handed back at SIGTERM`);
  }
});

