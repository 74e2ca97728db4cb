'use strict';
// One handler's lanes never hold back another handler's deliveries of the same key
// (docs/handlers.md, docs/outbox-schema.md "lanes"). One proxy dispatches a slow webhook (3 s per
// request) and a fast one, and has pull handlers on the same keyed events: each handler claims in
// lanes of its own, so
// - a long poll gets the pull delivery of an event within 1 s of its commit while the slow webhook
//   holds the lane number of its key, and the webhook still gets the key's events one at a time,
//   in order;
// - a pull consumer holding a claim for an hour does not hold back the webhook's deliveries of the
//   same key;
// - two proxies whose dispatched handlers differ (a slow webhook on one, a fast one on the other):
//   each handler claims in lanes of its own, so the fast handler's deliveries of a key arrive
//   within 1 s of their commit while the slow one holds the key's lane number;
// - two proxies whose pull handlers differ: a consumer's claim held for an hour on one does not
//   keep the other's consumers from their own deliveries of the key.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const H = require('../lib/proxy');
const { startSink } = require('./sink');
const { publishThroughProxy, waitFor, startDispatchProxy } = require('./helpers');

const SLOW_MS = 3000;
const DB = 'rblanes';

let up;
let proxy;
let client;
let slow;
let fast;
const cleanups = [];

test.before(async () => {
  up = await H.startUpstream();
  cleanups.push(up);
  slow = await startSink({ delayMs: SLOW_MS });
  fast = await startSink({});
  cleanups.push(() => slow.close(), () => fast.close());
  proxy = await H.startProxy({
    upstream: up.uri,
    dispatch: true,
    extraIni: [
      '[handler slow]', 'events = lane.slow.*', 'kind = webhook', `url = ${slow.url('/slow')}`, '',
      '[handler fast]', 'events = lane.fast.*', 'kind = webhook', `url = ${fast.url('/fast')}`, '',
      // Two pull handlers, so that each test has its own: one on the slow webhook's events, one on
      // the fast webhook's and on events only it takes.
      '[handler pull]', 'events = lane.slow.*', 'kind = pull', '',
      '[handler held]', 'events = lane.held.*, lane.fast.*', 'kind = pull', '',
    ].join('\n'),
  });
  client = await new MongoClient(H.clientUri(proxy), { serverSelectionTimeoutMS: 10000 }).connect();
});

const claim = (handler, doc) => client.db('admin').command({ relaybusClaim: handler, limit: 1, ...doc });
const complete = (handler, lease) => client.db('admin').command({ relaybusComplete: handler, leases: [lease] });

test('a long poll gets a pull delivery within 1 s of its commit while a slow webhook runs its key', { timeout: 60000 }, async (t) => {
  const ids = ['s0', 's1', 's2'].map((t) => `${t}-${process.pid}`);
  await publishThroughProxy(client, DB, ids.map((id) => ({ id, type: 'lane.slow.v1', key: 'k-slow' })));
  const committed = Date.now();
  // The dispatcher took the key's lane number: the webhook has the first request.
  await waitFor(() => slow.stats().pendingNow > 0, 5000, 'the slow webhook to receive the first event');

  const pulled = [];
  for (const id of ids) {
    const r = await claim('pull', { maxAwaitTimeMS: 10000 });
    assert.equal(r.deliveries.length, 1, `a pull delivery of ${id}`);
    assert.equal(r.deliveries[0].eventId, id, 'the pull handler gets the key in order');
    pulled.push(Date.now());
    assert.deepEqual((await complete('pull', r.deliveries[0].lease)).completed, [r.deliveries[0].lease]);
  }
  const first = pulled[0] - committed;
  t.diagnostic(`pull deliveries after the commit, ms: ${pulled.map((x) => x - committed).join(' ')} (webhook ${SLOW_MS} ms a request)`);
  assert.ok(first < 1000, `the first pull delivery ${first} ms after the commit (the webhook takes ${SLOW_MS} ms)`);
  assert.ok(!slow.stats().ok.has(ids[1]), 'the pull handler had all three before the webhook acknowledged the second');

  // The webhook's per-key order holds: one at a time, in sequence.
  await waitFor(() => ids.every((id) => slow.stats().ok.has(id)), 6 * SLOW_MS, 'the slow webhook to acknowledge all three');
  const st = slow.stats();
  assert.deepEqual(st.okOrder, ids);
  assert.deepEqual(st.seqViolations, []);
  assert.equal(st.concurrentKeys, 0);
});

test('a pull claim held for an hour does not hold back the webhook deliveries of its key', { timeout: 60000 }, async (t) => {
  const held = `p0-${process.pid}`;
  const next = `f1-${process.pid}`;
  // Only the pull handler takes lane.held.*: the consumer takes the key's lane number first.
  await publishThroughProxy(client, DB, [{ id: held, type: 'lane.held.v1', key: 'k-held' }]);
  const r = await claim('held', { leaseMs: 3600000, maxAwaitTimeMS: 10000 });
  assert.equal(r.deliveries.length, 1);
  assert.equal(r.deliveries[0].eventId, held);

  await publishThroughProxy(client, DB, [{ id: next, type: 'lane.fast.v1', key: 'k-held' }]);
  const committed = Date.now();
  await waitFor(() => fast.stats().ok.has(next), 5000, 'the fast webhook to receive the event while the pull claim is held');
  const took = fast.stats().firstAt.get(next) - committed;
  t.diagnostic(`webhook delivery ${took} ms after the commit, a pull claim of its key held for an hour`);
  assert.ok(took < 1000, `the webhook had it ${took} ms after the commit`);

  // The pull handler's own order still holds: its delivery of the same key waits for the held one.
  const early = await claim('held', {});
  assert.equal(early.deliveries.length, 0, 'the pull handler waits for its own earlier delivery of the key');
  assert.deepEqual((await complete('held', r.deliveries[0].lease)).completed, [r.deliveries[0].lease]);
  const after = await claim('held', { maxAwaitTimeMS: 10000 });
  assert.equal(after.deliveries.length, 1);
  assert.equal(after.deliveries[0].eventId, next);
  await complete('held', after.deliveries[0].lease);
});

test('two proxies with different handlers: a slow handler on one does not hold back the other\'s deliveries of its key',
  { timeout: 90000 }, async (t) => {
    const skip = H.doubleOnlySkipReason('a server whose transactions live 2 s, so that the new handler\'s backfill is short');
    if (skip) return t.skip(skip);
    const up2 = await H.startUpstream({ requireDouble: true, args: ['--txn-lifetime', '2'] });
    t.after(() => up2.stop());
    const slow2 = await startSink({ delayMs: SLOW_MS });
    const fast2 = await startSink({});
    t.after(() => { slow2.close(); fast2.close(); });
    const outbox = { database: 'rblanes2', handler_heartbeat: '300ms', transaction_lifetime: '1s' };
    const dispatch = { poll_interval_ms: 100 };
    // A dispatches only the slow webhook, B only the fast one; both get every event of the type.
    const a = await startDispatchProxy({ upstream: up2.uri, outbox, dispatch,
      handlers: [{ name: 'slow2', kind: 'webhook', events: 'two.*', url: slow2.url('/slow2') }] });
    t.after(() => a.kill());
    const b = await startDispatchProxy({ upstream: up2.uri, outbox, dispatch,
      handlers: [{ name: 'fast2', kind: 'webhook', events: 'two.fast.*', url: fast2.url('/fast2') }] });
    t.after(() => b.kill());
    // B's handler is new to the fleet: its deliveries wait for its backfill (2.9 s here).
    await waitFor(() => /handler fast2: backfill done/.test(b.log()), 20000, 'B to finish the backfill of fast2');
    const viaA = await new MongoClient(`mongodb://127.0.0.1:${a.port}/?directConnection=true`,
      { serverSelectionTimeoutMS: 10000 }).connect();
    t.after(() => viaA.close());
    // A's handler alone takes the first event: A holds the key's lane number for 3 s.
    const pid = process.pid;
    await publishThroughProxy(viaA, 'app', [{ id: `two-0-${pid}`, type: 'two.slow.v1', key: 'k-two', payload: {} }]);
    await waitFor(() => slow2.stats().pendingNow > 0, 5000, 'the slow webhook to receive the first event');
    const ids = [1, 2].map((n) => `two-${n}-${pid}`);
    const took = [];
    for (const id of ids) {
      await publishThroughProxy(viaA, 'app', [{ id, type: 'two.fast.v1', key: 'k-two', payload: {} }]);
      const committed = Date.now();
      await waitFor(() => fast2.stats().ok.has(id), 10000, `the fast webhook to receive ${id}`);
      took.push(fast2.stats().firstAt.get(id) - committed);
    }
    t.diagnostic(`fast handler's deliveries after their commit, ms: ${took.join(' ')} (the slow one takes ${SLOW_MS} ms a request)`);
    for (const [i, ms] of took.entries()) assert.ok(ms < 1000, `the fast handler had ${ids[i]} ${ms} ms after its commit`);
    // Each handler's per-key order holds.
    await waitFor(() => [`two-0-${pid}`, ...ids].every((id) => slow2.stats().ok.has(id)), 6 * SLOW_MS,
      'the slow webhook to acknowledge all three');
    assert.deepEqual(slow2.stats().okOrder, [`two-0-${pid}`, ...ids]);
    assert.deepEqual(fast2.stats().okOrder, ids);
    assert.equal(slow2.stats().concurrentKeys, 0);
    await viaA.close();
    assert.equal((await a.stop()).code, 0);
    assert.equal((await b.stop()).code, 0);
  });

test('two proxies with different pull handlers: a claim held for an hour on one does not hold back the other\'s relaybusClaim of its key',
  { timeout: 90000 }, async (t) => {
    const skip = H.doubleOnlySkipReason('a server whose transactions live 2 s, so that the new handler\'s backfill is short');
    if (skip) return t.skip(skip);
    const up3 = await H.startUpstream({ requireDouble: true, args: ['--txn-lifetime', '2'] });
    t.after(() => up3.stop());
    const outbox = { database: 'rblanes3', handler_heartbeat: '300ms', transaction_lifetime: '1s' };
    const dispatch = { poll_interval_ms: 100 };
    // A declares only the pull handler pa, B only pb; both take every event of the type.
    const a = await startDispatchProxy({ upstream: up3.uri, outbox, dispatch, handlers: [{ name: 'pa', kind: 'pull', events: 'three.*' }] });
    t.after(() => a.kill());
    const b = await startDispatchProxy({ upstream: up3.uri, outbox, dispatch, handlers: [{ name: 'pb', kind: 'pull', events: 'three.*' }] });
    t.after(() => b.kill());
    await waitFor(() => /handler pb: backfill done/.test(b.log()), 20000, 'B to finish the backfill of pb');
    const uriOf = (p) => `mongodb://127.0.0.1:${p.port}/?directConnection=true`;
    const viaA = await new MongoClient(uriOf(a), { serverSelectionTimeoutMS: 10000 }).connect();
    t.after(() => viaA.close());
    const viaB = await new MongoClient(uriOf(b), { serverSelectionTimeoutMS: 10000 }).connect();
    t.after(() => viaB.close());
    const id = `three-0-${process.pid}`;
    await publishThroughProxy(viaA, 'app', [{ id, type: 'three.v1', key: 'k-three', payload: {} }]);
    // A's consumer holds pa's delivery of the key for an hour.
    const held = await viaA.db('admin').command({ relaybusClaim: 'pa', limit: 1, leaseMs: 3600000, maxAwaitTimeMS: 10000 });
    assert.equal(held.deliveries.length, 1);
    assert.equal(held.deliveries[0].eventId, id);
    // B's consumer gets pb's delivery of the same event and key at once.
    const asked = Date.now();
    const got = await viaB.db('admin').command({ relaybusClaim: 'pb', limit: 1, maxAwaitTimeMS: 10000 });
    const took = Date.now() - asked;
    t.diagnostic(`pb's claim answered in ${took} ms while pa's claim of the key is held for an hour on the other proxy`);
    assert.equal(got.deliveries.length, 1, 'pb gets its delivery');
    assert.equal(got.deliveries[0].eventId, id);
    assert.ok(took < 1000, `pb's claim took ${took} ms`);
    // Each handler's lanes are its own documents, recorded with the handler.
    const lanes = viaA.db('rblanes3').collection('relaybus_lanes');
    for (const [h, lease] of [['pa', held.deliveries[0].lease], ['pb', got.deliveries[0].lease]])
      assert.equal(await lanes.countDocuments({ handler: h, inFlight: { $size: 1 } }), 1, `${h}'s lane lists its claim (${lease})`);
    assert.deepEqual((await viaB.db('admin').command({ relaybusComplete: 'pb', leases: [got.deliveries[0].lease] })).completed,
      [got.deliveries[0].lease]);
    assert.deepEqual((await viaA.db('admin').command({ relaybusComplete: 'pa', leases: [held.deliveries[0].lease] })).completed,
      [held.deliveries[0].lease]);
    await viaA.close();
    await viaB.close();
    assert.equal((await a.stop()).code, 0);
    assert.equal((await b.stop()).code, 0);
  });

H.registerFinalChecks(test, cleanups, { beforeStop: () => client && client.close() });
