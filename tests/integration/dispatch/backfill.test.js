'use strict';
// The backfill of a handler new to the fleet finishes (docs/outbox-schema.md, "The backfill
// window"; docs/handlers.md, "One handler set for the fleet").
//
// 1. A declarer killed inside its backfill window and started again (a new instance): the
//    events committed after the first declaration that became visible after the killed
//    instance's last pass still get the handler's deliveries. The new instance carries the
//    backfill on instead of only waiting for its predecessor's recorded end.
// 2. A window that holds many events of types the handler does not take (they lack it for
//    ever): every matching event of the window is backfilled. The backfill reads only the
//    handler's types, up to the window's end, and resumes where it stopped.
//    RELAYBUS_BACKFILL_NOISE sets how many other-type events (5,000 here; bench/backfill-full
//    runs 100,000), RELAYBUS_BACKFILL_TXN_S the server's transaction lifetime (the window's
//    reach: the other-type events are written inside it), RELAYBUS_BACKFILL_TIMEOUT_MS the wait.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const { startUpstream, uniqueDbName, doubleOnlySkipReason } = require('../lib/proxy');
const { startSink } = require('./sink');
const { startDispatchProxy, publish, waitFor } = require('./helpers');

const NOISE = Number(process.env.RELAYBUS_BACKFILL_NOISE || 5000);
const TXN_S = Number(process.env.RELAYBUS_BACKFILL_TXN_S || 20);
const TIMEOUT_MS = Number(process.env.RELAYBUS_BACKFILL_TIMEOUT_MS || 120000);

async function setUp(t, txnSeconds) {
  const up = await startUpstream({ requireDouble: true, args: ['--txn-lifetime', String(txnSeconds)] });
  t.after(() => up.stop());
  const got = new Map(); // path -> Set of event ids
  const sink = await startSink({
    respond: (ev, req) => {
      if (!got.has(req.url)) got.set(req.url, new Set());
      got.get(req.url).add(ev.id);
      return { status: 204 };
    },
  });
  t.after(() => sink.close());
  const direct = await new MongoClient(up.directUri || up.uri, { serverSelectionTimeoutMS: 10000 }).connect();
  t.after(() => direct.close());
  return { up, sink, got, direct, received: (p) => got.get(p) || new Set() };
}

test('a declarer restarted inside its backfill window: every event committed after the first declaration gets its delivery',
  { timeout: 180000 }, async (t) => {
    const skip = doubleOnlySkipReason('a server whose transactions live 5 s (the backfill window covers the server\'s limit)');
    if (skip) return t.skip(skip);
    const { up, sink, direct, received } = await setUp(t, 5);
    const db = uniqueDbName('dispatch_backfill_restart');
    // The window: 3 heartbeats plus the server's 5 s each side of the first declaration.
    const outbox = { database: db, handler_heartbeat: '1s', transaction_lifetime: '1s' };
    const dispatch = { poll_interval_ms: 100 };
    const base = { name: 'base', kind: 'webhook', events: 'order.*', url: sink.url('/base') };
    const extra = { name: 'extra', kind: 'webhook', events: 'order.placed', url: sink.url('/extra') };
    // B publishes with the old set (so A has somebody to backfill for).
    const b = await startDispatchProxy({ upstream: up.uri, outbox, dispatch, handlers: [base] });
    t.after(() => b.kill());
    const a = await startDispatchProxy({ upstream: up.uri, outbox, dispatch, handlers: [base, extra] });
    t.after(() => a.kill());
    await waitFor(async () => /handler extra is new to the fleet: backfilling/.test(a.log()), 20000, 'A to start the backfill');
    // Before A's kill: its own passes take these.
    const first = Array.from({ length: 3 }, (_, i) => ({ id: `first-${i}`, type: 'order.placed', key: `k${i % 2}`, payload: { i } }));
    await publish(direct, db, first, ['base']);
    await waitFor(async () => (await direct.db(db).collection('relaybus_events').countDocuments({ handlers: 'extra' })) >= first.length,
      20000, 'A to backfill the first events');
    // A dies inside its window; events written with the old set become visible after its last pass.
    await a.kill();
    const events = direct.db(db).collection('relaybus_events');
    const rec = await direct.db(db).collection('relaybus_handlers').findOne({ 'handlers.backfillUntil': { $exists: true } });
    assert.ok(rec, 'the killed declarer recorded its backfill\'s end');
    const after = Array.from({ length: 6 }, (_, i) => ({ id: `after-${i}`, type: 'order.placed', key: `k${i % 2}`, payload: { i } }));
    await publish(direct, db, after, ['base']);
    const other = [{ id: 'other-0', type: 'order.cancelled', payload: {} }];
    await publish(direct, db, other, ['base']);
    // A restarted: a new instance with the same handlers, inside the window.
    const a2 = await startDispatchProxy({ upstream: up.uri, outbox, dispatch, handlers: [base, extra] });
    t.after(() => a2.kill());
    const all = [...first, ...after];
    await waitFor(async () => all.every((e) => received('/extra').has(e.id)), 60000,
      `every order.placed event committed after the first declaration at /extra (got ${[...received('/extra')]})`);
    for (const e of await events.find({ _id: { $in: all.map((x) => x.id) } }).toArray())
      assert.ok(e.handlers.includes('extra'), `${e._id} lists extra: ${e.handlers}`);
    assert.equal(received('/extra').has('other-0'), false, 'order.cancelled is not extra\'s');
    assert.match(a2.log(), /handler extra: the backfill a proxy that is gone recorded \(until -?\d+ ms from now\) is carried on here/);
    assert.match(a2.log(), /handler extra: backfill done, \d+ deliveries added/);
    assert.equal((await a2.stop()).code, 0);
    assert.equal((await b.stop()).code, 0);
  });

test(`a window holding ${NOISE} events of other types: every matching event is backfilled`, { timeout: TIMEOUT_MS + 120000 }, async (t) => {
  const skip = doubleOnlySkipReason('a server whose transaction lifetime sets the backfill window');
  if (skip) return t.skip(skip);
  const { up, sink, direct, received } = await setUp(t, TXN_S);
  const db = uniqueDbName('dispatch_backfill_noise');
  const outbox = { database: db, handler_heartbeat: '1s', transaction_lifetime: '1s' };
  const dispatch = { poll_interval_ms: 100 };
  const base = { name: 'base', kind: 'webhook', events: 'order.*', url: sink.url('/base') };
  const extra = { name: 'extra', kind: 'webhook', events: 'order.placed', url: sink.url('/extra') };
  const b = await startDispatchProxy({ upstream: up.uri, outbox, dispatch, handlers: [base] });
  t.after(() => b.kill());
  const started = Date.now();
  const a = await startDispatchProxy({ upstream: up.uri, outbox, dispatch, handlers: [base, extra] });
  t.after(() => a.kill());
  await waitFor(async () => /handler extra is new to the fleet: backfilling/.test(a.log()), 20000, 'A to start the backfill');
  const declaredAt = new Date(started);
  // Inside the window, before the matching events: other types, lacking extra for ever
  // (written as a publisher without extra writes them; their deliveries do not matter here).
  const events = direct.db(db).collection('relaybus_events');
  const t0 = Date.now();
  for (let i = 0; i < NOISE; i += 1000) {
    const docs = [];
    for (let k = i; k < Math.min(NOISE, i + 1000); k++)
      docs.push({ _id: `noise-${String(k).padStart(7, '0')}`, type: 'stock.ticked', payload: { k }, handlers: ['other'], createdAt: declaredAt });
    await events.insertMany(docs, { ordered: false });
  }
  const noiseMs = Date.now() - t0;
  const matching = Array.from({ length: 20 }, (_, i) => ({ id: `match-${i}`, type: 'order.placed', key: `k${i % 4}`, payload: { i } }));
  await publish(direct, db, matching, ['base']);
  const writtenMs = Date.now() - started;
  assert.ok(writtenMs < (TXN_S + 3) * 1000, `the events were written inside the window (${writtenMs} ms after the declaration, reach ${(TXN_S + 3) * 1000} ms)`);
  await waitFor(async () => /handler extra: backfill done/.test(a.log()), TIMEOUT_MS, 'the backfill to end');
  const doneMs = Date.now() - started;
  await waitFor(async () => matching.every((e) => received('/extra').has(e.id)), 60000,
    `every matching event at /extra (got ${received('/extra').size} of ${matching.length})`);
  const m = a.log().match(/handler extra: backfill done, (\d+) deliveries added for events published without it \((\d+) sweeps, (\d+) events read\)/);
  assert.ok(m, 'the backfill logged its end');
  for (const e of await events.find({ _id: { $in: matching.map((x) => x.id) } }).toArray())
    assert.ok(e.handlers.includes('extra'), `${e._id} lists extra: ${e.handlers}`);
  assert.equal(await events.countDocuments({ type: 'stock.ticked', handlers: 'extra' }), 0, 'no other-type event got extra');
  // It read the matching candidates only, not the other types.
  assert.ok(Number(m[3]) < NOISE, `the backfill read ${m[3]} events, fewer than the ${NOISE} of other types`);
  t.diagnostic(`${NOISE} other-type events written in ${noiseMs} ms; backfill done ${doneMs} ms after the declaration ` +
    `(the window ends ${(TXN_S + 3) * 1000} ms after it): ${m[1]} deliveries added, ${m[2]} sweeps, ${m[3]} events read`);
  assert.equal((await a.stop()).code, 0);
  assert.equal((await b.stop()).code, 0);
});
