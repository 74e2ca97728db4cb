'use strict';
// Every attempt on record (docs/outbox-schema.md, "attempts"; docs/admin.md): a webhook's
// attempts read back through GET /api/deliveries/ID/attempts after the delivery completed, an
// event with two handlers (one completing, one dead) through GET /api/events/ID, the latest
// failures through GET /api/attempts, the answers to unknown and malformed ids and to
// out-of-bounds parameters, masking, and the TTL index that follows [outbox] attempt_history.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const { startUpstream, uniqueDbName } = require('../lib/proxy');
const { startSink } = require('../dispatch/sink');
const { startAdminProxy, request, publish, waitFor } = require('./helpers');

const TOKEN = 'attempts-token-0123456789';
const HOOK_PASSWORD = 'hook-pass-8a7b6c';
// Ids and handler names of this run: with scripts/test --upstream every file shares one
// database, so nothing here counts what another file wrote.
const RUN = `${process.pid}${Date.now().toString(36)}`;
const EV1 = `att-${RUN}-1`;
const EV2 = `att-${RUN}-2`;
const MAILER = `mailer-${RUN}`;
const LEDGER = `ledger-${RUN}`;

test('every attempt on record: a delivery, an event, the latest failures, through the admin API', { timeout: 120000 }, async (t) => {
  const up = await startUpstream();
  t.after(() => up.stop());
  // The receiver of "mailer": ev-1 gets 500, then 503, then 204; the others 204 at once.
  // Each answer takes 30 ms, so every attempt has a duration.
  const seen = new Map();
  const mailer = await startSink({
    delayMs: 30,
    respond: (ev) => {
      const n = (seen.get(ev.id) || 0) + 1;
      seen.set(ev.id, n);
      if (ev.id !== EV1 || n > 2) return { status: 204 };
      // The second answer quotes the handler's URL, password and all: it is masked.
      return n === 1 ? { status: 500, body: 'database is down' }
        : { status: 503, body: `overloaded, see http://hookuser:${HOOK_PASSWORD}@127.0.0.1/status ${'x'.repeat(700)}` };
    },
  });
  // "ledger" fails every time: dead after max_attempts = 2.
  const ledger = await startSink({ respond: () => ({ status: 500, body: 'ledger is broken' }) });
  t.after(() => Promise.all([mailer.close(), ledger.close()]));
  const db = uniqueDbName('admin_attempts');
  const proxy = await startAdminProxy({
    upstream: up.uri,
    token: TOKEN,
    outbox: { database: db },
    handlers: [
      { name: MAILER, events: 'order.*', kind: 'webhook', url: mailer.url('/mail').replace('http://', `http://hookuser:${HOOK_PASSWORD}@`),
        retry_schedule: '200ms, 200ms, 200ms' },
      { name: LEDGER, events: 'order.*', kind: 'webhook', url: ledger.url('/ledger'), retry_schedule: '200ms', max_attempts: 2 },
    ],
  });
  t.after(() => proxy.kill());
  const client = await new MongoClient(up.uri, { serverSelectionTimeoutMS: 3000 }).connect();
  t.after(() => client.close());
  const get = (p, token = TOKEN) => request(proxy.base, p, { token });
  const dels = client.db(db).collection('relaybus_deliveries');
  const attempts = client.db(db).collection('relaybus_attempts');

  await publish(client, db, [{ id: EV1, type: 'order.placed.v1', key: `c-${RUN}-1`, payload: { n: 1 } },
    { id: EV2, type: 'order.placed.v1', key: `c-${RUN}-2`, payload: { n: 2 } }], [MAILER, LEDGER]);
  const mailerDelivery = (await dels.findOne({ eventId: EV1, handler: MAILER }))._id.toHexString();
  await waitFor(async () => (await dels.countDocuments({ handler: MAILER })) === 0, 30000, "mailer's deliveries to complete");
  await waitFor(async () => (await dels.countDocuments({ handler: LEDGER, status: 'dead' })) === 2, 30000, "ledger's to die");
  // The completions' records go in the batch of the completion: wait for the last flush.
  await waitFor(async () => (await attempts.countDocuments({ handler: MAILER })) === 4, 10000, "mailer's 4 records");

  await t.test('500, then 503, then 204: three attempts in order, after the delivery completed', async () => {
    const r = await get(`/api/deliveries/${mailerDelivery}/attempts`);
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.id, mailerDelivery);
    assert.equal(r.json.state, 'completed');
    assert.equal(r.json.delivery, null, 'completed without completion history: the delivery is gone');
    assert.equal(r.json.count, 3);
    assert.equal(r.json.more, false);
    const [a1, a2, a3] = r.json.attempts;
    assert.deepEqual(r.json.attempts.map((a) => a.status), [500, 503, 204]);
    assert.deepEqual(r.json.attempts.map((a) => a.outcome), ['failed', 'failed', 'succeeded']);
    assert.deepEqual(r.json.attempts.map((a) => a.attempt), [1, 2, 3]);
    for (const a of r.json.attempts) {
      assert.equal(a.deliveryId, mailerDelivery);
      assert.equal(a.eventId, EV1);
      assert.equal(a.handler, MAILER);
      assert.match(a.instance, /^[^/]+\/\d+\/[0-9a-f]{12}$/);
      assert.ok(a.durationMs >= 25 && a.durationMs < 10000, `duration ${a.durationMs} ms of a 30 ms answer`);
      assert.equal(Date.parse(a.endedAt) - Date.parse(a.startedAt), a.durationMs);
    }
    assert.ok(Date.parse(a1.endedAt) <= Date.parse(a2.startedAt) && Date.parse(a2.endedAt) <= Date.parse(a3.startedAt), 'in order');
    assert.equal(a1.response, 'database is down');
    assert.match(a1.error, /^HTTP 500: database is down/);
    // The start of the answer, at most 512 bytes, the password masked.
    assert.ok(Buffer.byteLength(a2.response) <= 512, `${Buffer.byteLength(a2.response)} bytes`);
    assert.match(a2.response, /^overloaded, see http:\/\/hookuser:\*\*\*\*\*\*\*\*@127\.0\.0\.1\/status x+$/);
    assert.doesNotMatch(r.text, new RegExp(HOOK_PASSWORD));
    assert.equal(a3.error, undefined);
    // limit bounds the page.
    const one = await get(`/api/deliveries/${mailerDelivery}/attempts?limit=1`);
    assert.equal(one.json.count, 1);
    assert.equal(one.json.more, true);
    assert.equal(one.json.attempts[0].status, 500);
  });

  await t.test('one event, two handlers: one completed, one dead after max_attempts, both with their attempts', async () => {
    const r = await get(`/api/events/${EV1}`);
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.event.id, EV1);
    assert.equal(r.json.event.type, 'order.placed.v1');
    assert.deepEqual(r.json.event.payload, { n: 1 });
    const by = Object.fromEntries(r.json.handlers.map((h) => [h.handler, h]));
    assert.deepEqual(Object.keys(by).sort(), [LEDGER, MAILER]);
    assert.equal(by[MAILER].state, 'completed');
    assert.equal(by[MAILER].subscribed, true);
    assert.deepEqual(by[MAILER].attempts.map((a) => a.status), [500, 503, 204]);
    assert.equal(by[LEDGER].state, 'dead');
    assert.equal(by[LEDGER].delivery.status, 'dead');
    assert.equal(by[LEDGER].delivery.attempts, 2);
    assert.match(by[LEDGER].lastError, /^HTTP 500: ledger is broken/);
    assert.deepEqual(by[LEDGER].attempts.map((a) => [a.attempt, a.outcome, a.status]), [[1, 'failed', 500], [2, 'failed', 500]]);
    assert.equal(r.json.more, false);
  });

  await t.test('the latest failures of a handler, filtered and bounded', async () => {
    const r = await get(`/api/attempts?handler=${LEDGER}&outcome=failed&since=1h&limit=3`);
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.count, 3);
    assert.ok(r.json.next, 'a cursor: a fourth record follows');
    const ends = r.json.attempts.map((a) => Date.parse(a.endedAt));
    assert.deepEqual([...ends].sort((x, y) => y - x), ends, 'latest first');
    const rest = await get(`/api/attempts?handler=${LEDGER}&outcome=failed&limit=3&before=${r.json.next}`);
    assert.equal(rest.json.count, 1);
    assert.equal(rest.json.next, null);
    const ids = new Set([...r.json.attempts, ...rest.json.attempts].map((a) => a.id));
    assert.equal(ids.size, 4);
    assert.equal((await get(`/api/attempts?handler=${MAILER}&outcome=succeeded`)).json.count, 2);
    assert.equal((await get(`/api/attempts?since=${new Date(Date.now() + 60000).toISOString()}`)).json.count, 0);
    // A filter is a string, never an operator.
    assert.equal((await get('/api/attempts?handler=%7B%22%24ne%22%3Anull%7D')).json.count, 0);
  });

  await t.test('unknown ids answer 404, malformed ones and bad parameters 400', async () => {
    assert.equal((await get('/api/deliveries/0123456789abcdef01234567/attempts')).status, 404);
    assert.equal((await get('/api/events/no-such-event')).status, 404);
    for (const p of ['/api/deliveries/xyz/attempts', '/api/deliveries/0123456789abcdef0123456/attempts',
      '/api/deliveries//attempts', `/api/events/${'e'.repeat(257)}`, '/api/events/a%00b', '/api/events/a%0Ab', '/api/events/%FF',
      '/api/attempts?limit=0', '/api/attempts?limit=1001', '/api/attempts?outcome=lost', '/api/attempts?since=yesterday',
      '/api/attempts?before=x', '/api/attempts?handler=a&handler=b', '/api/attempts?status=dead',
      `/api/deliveries/${mailerDelivery}/attempts?limit=0`, `/api/events/${EV1}?x=1`]) {
      const r = await get(p);
      assert.equal(r.status, 400, `${p}: ${r.text}`);
      assert.ok(r.json.error, p);
    }
    // The token guards them as every /api path.
    assert.equal((await get(`/api/events/${EV1}`, 'wrong')).status, 401);
    assert.equal((await get('/api/attempts', '')).status, 401);
    // An event id with a slash, percent-encoded.
    await publish(client, db, [{ id: `order/${RUN}`, type: 'order.placed.v1', payload: {} }], [MAILER]);
    await waitFor(async () => (await get(`/api/events/order%2F${RUN}`)).json?.handlers?.[0]?.state === 'completed', 20000, 'order/RUN');
  });
  assert.equal((await proxy.stop()).code, 0);
});

test('the TTL index of the attempt records follows [outbox] attempt_history; 0 writes none', { timeout: 60000 }, async (t) => {
  const up = await startUpstream();
  t.after(() => up.stop());
  const sink = await startSink({});
  t.after(() => sink.close());
  const db = uniqueDbName('admin_attempts_ttl');
  const client = await new MongoClient(up.uri, { serverSelectionTimeoutMS: 3000 }).connect();
  t.after(() => client.close());
  const handlers = [{ name: `ttl-${RUN}`, events: `ttl-${RUN}.*`, kind: 'webhook', url: sink.url('/h') }];
  const ttl = async () => (await client.db(db).collection('relaybus_attempts').listIndexes().toArray()).find((i) => i.name === 'expires');

  const two = await startAdminProxy({ upstream: up.uri, outbox: { database: db, attempt_history: '2h' }, handlers });
  assert.equal((await ttl()).expireAfterSeconds, 7200);
  assert.deepEqual((await ttl()).key, { endedAt: 1 });
  assert.equal((await two.stop()).code, 0);
  // Another window at the next start: changed in place (collMod), logged.
  const one = await startAdminProxy({ upstream: up.uri, outbox: { database: db, attempt_history: '90m' }, handlers });
  assert.equal((await ttl()).expireAfterSeconds, 5400);
  assert.match(one.log(), /attempt records are now kept 5400 s \(\[outbox\] attempt_history\), not 7200 s/);
  assert.equal((await one.stop()).code, 0);
  // 0: the collection and its window stay; nothing is written.
  const off = await startAdminProxy({ upstream: up.uri, outbox: { database: db, attempt_history: '0' }, handlers });
  await publish(client, db, [{ id: `off-${RUN}`, type: `ttl-${RUN}.v1`, payload: {} }], [`ttl-${RUN}`]);
  await waitFor(() => sink.stats().ok.has(`off-${RUN}`), 20000, 'the delivery');
  await new Promise((r) => setTimeout(r, 500));
  assert.equal(await client.db(db).collection('relaybus_attempts').countDocuments({ eventId: `off-${RUN}` }), 0);
  assert.equal((await ttl()).expireAfterSeconds, 5400);
  assert.equal((await off.stop()).code, 0);
});
