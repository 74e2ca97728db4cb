'use strict';
// Webhook retries as receivers expect them from Svix: every answer that is not a 2xx is
// retried on retry_schedule, 4xx included, so a receiver that answers 401 while it deploys
// (its credentials not loaded yet) gets every delivery afterwards, none dead, each key in
// order.  retry_4xx = false keeps the former rule: a 4xx buries the delivery at once.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const { startUpstream, uniqueDbName } = require('../lib/proxy');
const { startSink } = require('./sink');
const { startDispatchProxy, publish, waitFor } = require('./helpers');

const SECRET = `whsec_${Buffer.from('relaybus-webhook-retry-secret').toString('base64')}`;

test('a receiver answering 401 for 3 s gets every delivery afterwards, none dead; retry_4xx = false buries at once', { timeout: 90000 }, async (t) => {
  const up = await startUpstream();
  t.after(() => up.stop());
  let deployUntil = null;
  const deploying = await startSink({ secret: SECRET, respond: () => {
    deployUntil ??= Date.now() + 3000;
    return Date.now() < deployUntil ? { status: 401, body: 'no credentials yet' } : undefined;
  } });
  const strict = await startSink({ secret: SECRET, respond: () => ({ status: 404, body: 'no such hook' }) });
  t.after(() => Promise.all([deploying.close(), strict.close()]));
  const db = uniqueDbName('dispatch_webhook_retry');
  const handlers = [
    { name: 'deploying', events: '*', kind: 'webhook', url: deploying.url('/hook'), secret: SECRET,
      retry_schedule: '300ms, 600ms, 1s, 1s, 1s, 1s, 1s, 1s, 1s, 1s' },
    { name: 'strict', events: '*', kind: 'webhook', url: strict.url('/hook'), secret: SECRET, retry_4xx: false },
  ];
  const p = await startDispatchProxy({ upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 100 }, handlers });
  t.after(() => p.kill());
  const client = await new MongoClient(up.uri).connect();
  t.after(() => client.close());
  const events = [];
  for (let i = 0; i < 30; i++) events.push({ id: `r-${i}`, type: 'retry.v1', key: `k${i % 5}`, payload: { i } });
  await publish(client, db, events, handlers.map((h) => h.name));

  const deliveries = client.db(db).collection('relaybus_deliveries');
  await waitFor(async () => (await deliveries.countDocuments({ status: 'pending' })) === 0, 60000, 'every delivery to finish');
  assert.equal(await deliveries.countDocuments({ handler: 'deploying', status: 'dead' }), 0, 'none dead');
  for (const e of events) assert.equal(deploying.stats().ok.get(e.id), 1, `${e.id} delivered after the deploy`);
  assert.deepEqual(deploying.stats().seqViolations, []);
  assert.ok(deploying.stats().custom.some((c) => c.status === 401), 'the receiver did answer 401 first');
  // retry_4xx = false: one attempt each, dead with the answer.
  const dead = await deliveries.find({ handler: 'strict' }).toArray();
  assert.equal(dead.length, events.length);
  for (const d of dead) {
    assert.equal(d.status, 'dead');
    assert.equal(d.attempts, 1);
    assert.match(d.lastError, /^HTTP 404: no such hook/);
  }
  assert.equal((await p.stop()).code, 0);
});
