'use strict';
// Webhook replay (docs/admin.md "POST /api/replay"): an operator sends a handler's events of a
// time window again. Keyed events are published through the proxy in three windows and all
// complete; a replay of the middle window queues exactly its events of the handler's types, the
// sink receives each of them once more, in key order per key (after the key's earlier
// deliveries), with the original event id in the body and a new webhook-id; events outside the
// window, or of types the handler does not take, are not sent again. A replayed event does not
// overtake its key's delivery pending behind retries: it follows it. A window over 100,000 of the
// handler's events is refused. Bad input answers 400 and
// writes nothing; without the token the answer is 401.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const H = require('../lib/proxy');
const { startSink } = require('./sink');
const { publishThroughProxy, waitFor } = require('./helpers');
const { request } = require('../admin/helpers');

const DB = 'rbreplay';
const TOKEN = 'replay-test-token';

let up;
let proxy;
let client;
let direct;
let sink;
let otherSink;
let heldSink;
let holdHead = null; // the event id heldSink answers 500 for
let admin;
const cleanups = [];

test.before(async () => {
  up = await H.startUpstream();
  cleanups.push(up);
  sink = await startSink({});
  otherSink = await startSink({});
  heldSink = await startSink({ respond: (ev) => (ev.id === holdHead ? { status: 500, body: 'held' } : undefined) });
  cleanups.push(() => sink.close(), () => otherSink.close(), () => heldSink.close());
  const adminPort = await H.freePort();
  admin = `http://127.0.0.1:${adminPort}`;
  proxy = await H.startProxy({
    upstream: up.uri,
    dispatch: true,
    extraIni: [
      '[outbox]', `database = ${DB}`, '',
      '[admin]', `listen = 127.0.0.1:${adminPort}`, `token = ${TOKEN}`, '',
      '[handler hook]', 'events = replay.order.*, replay.note.v1', 'kind = webhook', `url = ${sink.url('/hook')}`, '',
      // Takes a type the replayed handler does not: its events are never replayed to hook.
      // Its key's head is retried while the replay is written.
      '[handler held]', 'events = replay.held.v1', 'kind = webhook', `url = ${heldSink.url('/held')}`,
      'retry_schedule = 300ms, 300ms, 300ms', 'max_attempts = 100', '',
      '[handler other]', 'events = replay.other.v1', 'kind = webhook', `url = ${otherSink.url('/other')}`, '',
    ].join('\n'),
  });
  client = await new MongoClient(H.clientUri(proxy), { serverSelectionTimeoutMS: 10000 }).connect();
  direct = await new MongoClient(up.uri, { serverSelectionTimeoutMS: 10000 }).connect();
});

const replay = (json, token = TOKEN) => request(admin, '/api/replay', { method: 'POST', token, json });
const delivered = (ids) => ids.every((id) => [sink, otherSink, heldSink].some((k) => k.stats().ok.get(id) >= 1));
const tag = (s) => `${s}-${process.pid}`;

// Publishes and waits until the sink acknowledged every event and no delivery is left.
async function publishAndComplete(events) {
  await publishThroughProxy(client, DB, events);
  await waitFor(() => delivered(events.map((e) => e.id)), 15000, 'the sink to acknowledge every event');
  const deliveries = direct.db(DB).collection('relaybus_deliveries');
  await waitFor(async () => (await deliveries.countDocuments({})) === 0, 10000, 'every delivery to complete');
}

test('a replay sends the window\'s events of the handler again, in key order, with the original ids', { timeout: 30000 }, async () => {
  const ev = (name, type, key) => ({ id: tag(name), type, key, payload: { name } });
  const before = [ev('a1', 'replay.order.v1', 'k1'), ev('a2', 'replay.order.v1', 'k2'), ev('a3', 'replay.order.v1', 'k1')];
  const inside = [
    ev('b1', 'replay.order.v1', 'k1'), ev('b2', 'replay.order.v2', 'k2'), ev('b3', 'replay.order.v1', 'k1'),
    ev('b4', 'replay.note.v1', undefined), ev('b5', 'replay.order.v1', 'k2'), ev('b6', 'replay.order.v1', 'k1'),
    ev('b7', 'replay.other.v1', 'k3'), // hook does not take this type
  ];
  const after = [ev('c1', 'replay.order.v1', 'k1'), ev('c2', 'replay.order.v1', 'k2')];

  await publishAndComplete(before);
  const since = new Date();
  await publishAndComplete(inside);
  const until = new Date();
  await publishAndComplete(after);
  const hookInside = inside.filter((e) => e.type !== 'replay.other.v1');
  const st = sink.stats();
  const okBefore = st.okOrder.length;
  const requestsBefore = st.requests;
  const deliveryIdsBefore = st.deliveryIds.size;

  const r = await replay({ handler: 'hook', since: since.toISOString(), until: until.toISOString() });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.queued, hookInside.length, 'one delivery per event of the window the handler takes');

  await waitFor(() => st.okOrder.length >= okBefore + hookInside.length, 15000, 'the replayed deliveries');
  await waitFor(async () => (await direct.db(DB).collection('relaybus_deliveries').countDocuments({})) === 0, 10000,
    'the replayed deliveries to complete');
  const replayed = st.okOrder.slice(okBefore);
  assert.deepEqual([...replayed].sort(), hookInside.map((e) => e.id).sort(),
    'exactly the window\'s events of the handler, by their original ids, once each');
  assert.equal(st.requests, requestsBefore + hookInside.length, 'nothing else was sent');
  for (const e of [...before, ...after])
    assert.equal(st.ok.get(e.id), 1, `${e.id} is outside the replay: sent once`);
  assert.equal(otherSink.stats().requests, 1, 'the other handler\'s event was not sent again');
  // Per key, the replayed events come in their original order, after the key's earlier deliveries
  // (the sink checks each key's sequences follow on one at a time).
  for (const key of ['k1', 'k2']) {
    const want = hookInside.filter((e) => e.key === key).map((e) => e.id);
    assert.deepEqual(replayed.filter((id) => want.includes(id)), want, `key ${key} in order`);
  }
  assert.deepEqual(st.seqViolations, []);
  assert.equal(st.deliveryIds.size, deliveryIdsBefore + hookInside.length, 'each replay has a webhook-id of its own');
  assert.equal(st.badSignatures, 0);

  const metrics = (await request(admin, '/metrics', { token: TOKEN })).text;
  assert.match(metrics, /^relaybus_replays_total 1$/m);
  assert.match(metrics, new RegExp(`^relaybus_replayed_deliveries_total ${hookInside.length}$`, 'm'));
  assert.match(proxy.log(), new RegExp(`replayed handler hook from .* ${hookInside.length} deliveries queued`));
});

test('a replayed event runs after the pending deliveries of its key, which it does not overtake', { timeout: 30000 }, async () => {
  const ev = (name) => ({ id: tag(name), type: 'replay.held.v1', key: 'kh', payload: { name } });
  const done = [ev('h1'), ev('h2'), ev('h3')];
  const since = new Date();
  await publishAndComplete(done);
  const until = new Date();
  // The key's next event is pending behind retries (the receiver answers 500) while the replay
  // is written: its lower sequence keeps it first, the replayed events follow in their order.
  const head = ev('h4');
  holdHead = head.id;
  await publishThroughProxy(client, DB, [head]);
  await waitFor(() => heldSink.stats().custom.some((c) => c.id === head.id), 10000, 'the head to be refused once');
  const r = await replay({ handler: 'held', since: since.toISOString(), until: until.toISOString() });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.queued, done.length);
  // Replaying again while those wait queues nothing: one delivery per event and handler.
  const again = await replay({ handler: 'held', since: since.toISOString(), until: until.toISOString() });
  assert.equal(again.status, 200, again.text);
  assert.deepEqual(again.json, { queued: 0, skipped: done.length });
  holdHead = null;
  const st = heldSink.stats();
  const okBefore = done.length;
  await waitFor(() => st.okOrder.length >= okBefore + 1 + done.length, 15000, 'the head and the replayed deliveries');
  assert.deepEqual(st.okOrder.slice(okBefore), [head.id, ...done.map((e) => e.id)]);
  assert.deepEqual(st.seqViolations, []);
});

test('a replay with bad input answers 400 and queues nothing; without the token 401', { timeout: 20000 }, async () => {
  const now = Date.now();
  const iso = (ms) => new Date(ms).toISOString();
  const bad = [
    [{ handler: 'nope', since: iso(now - 60000) }, /handler/],
    [{ since: iso(now - 60000) }, /handler/],
    [{ handler: 'hook' }, /"since" is required/],
    [{ handler: 'hook', since: 'yesterday' }, /"since" must be an ISO-8601/],
    [{ handler: 'hook', since: iso(now - 60000), until: '2026-13-01T00:00:00Z' }, /"until" must be an ISO-8601/],
    [{ handler: 'hook', since: iso(now), until: iso(now - 60000) }, /"since" must be before "until"/],
    [{ handler: 'hook', since: iso(now + 3600000) }, /"since" must be before/],
    [{ handler: 'hook', since: iso(now - 60000), extra: 1 }, /extra/],
  ];
  const requests = sink.stats().requests;
  for (const [body, msg] of bad) {
    const r = await replay(body);
    assert.equal(r.status, 400, `${JSON.stringify(body)}: ${r.text}`);
    assert.match(r.json.error, msg, JSON.stringify(body));
  }
  const unauth = await replay({ handler: 'hook', since: iso(now - 60000) }, '');
  assert.equal(unauth.status, 401);
  assert.equal(await direct.db(DB).collection('relaybus_deliveries').countDocuments({}), 0, 'nothing queued');
  assert.equal(sink.stats().requests, requests);
});

test('a window over 100,000 events of the handler is refused with a 400 naming the limit', { timeout: 30000 }, async () => {
  // Stored directly in a window of their own, long past: the limit counts the handler's events.
  const events = direct.db(DB).collection('relaybus_events');
  const at = Date.parse('2020-01-01T00:00:00Z');
  const docs = Array.from({ length: 100001 }, (_, i) => ({
    _id: tag(`bulk-${i}`), type: 'replay.order.v1', payload: null, handlers: ['hook'], createdAt: new Date(at + (i % 1000)),
  }));
  for (let i = 0; i < docs.length; i += 20000) await events.insertMany(docs.slice(i, i + 20000), { ordered: false });
  const window = { handler: 'hook', since: '2020-01-01T00:00:00Z', until: '2020-01-01T00:00:01Z' };
  const r = await replay(window);
  assert.equal(r.status, 400, r.text);
  assert.match(r.json.error, /more than 100000 events of handler hook/);
  assert.equal(await direct.db(DB).collection('relaybus_deliveries').countDocuments({}), 0, 'nothing queued');
  // The limit counts the handler's events: a handler that takes none of them replays the window.
  const ok = await replay({ ...window, handler: 'other' });
  assert.equal(ok.status, 200, ok.text);
  assert.equal(ok.json.queued, 0, 'other takes none of them');
});

H.registerFinalChecks(test, cleanups, { beforeStop: async () => { await client?.close(); await direct?.close(); } });
