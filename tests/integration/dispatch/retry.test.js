'use strict';
// The retry policy end to end: 429 and 503 honour Retry-After (seconds and
// HTTP date), 5xx back off until max_attempts and the delivery is dead with
// its last error, retry_4xx retries a 404, and a request that times out is
// retried.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const { startUpstream, uniqueDbName } = require('../lib/proxy');
const { startSink } = require('./sink');
const { startDispatchProxy, publish, waitFor } = require('./helpers');

test('retries: Retry-After, backoff to the dead letters, retry_4xx and timeouts', { timeout: 180000 }, async (t) => {
  const up = await upstreamFor(t);
  const seen = new Map(); // path + event id -> attempts answered
  const respond = (ev, req) => {
    const k = `${req.url} ${ev.id}`;
    const n = (seen.get(k) || 0) + 1;
    seen.set(k, n);
    switch (req.url) {
      case '/after-seconds':
        return n === 1 ? { status: 429, headers: { 'retry-after': '2' }, body: 'slow down' } : { status: 204 };
      case '/after-date':
        return n === 1
          ? { status: 503, headers: { 'retry-after': new Date(Date.now() + 2000).toUTCString() }, body: 'maintenance' }
          : { status: 204 };
      case '/always-500':
        return { status: 500, body: `boom ${n}` };
      case '/404-retried':
        return { status: 404, body: 'no such thing' };
      case '/hang-once':
        return n === 1 ? 'hang' : { status: 200 };
      default:
        return { status: 418 };
    }
  };
  const sink = await startSink({ respond });
  t.after(() => sink.close());
  const db = uniqueDbName('dispatch_retry');
  const handlers = [
    { name: 'after-seconds', url: sink.url('/after-seconds') },
    { name: 'after-date', url: sink.url('/after-date') },
    { name: 'always-500', url: sink.url('/always-500'), max_attempts: 3 },
    { name: '404-retried', url: sink.url('/404-retried'), max_attempts: 2, retry_4xx: 'true' },
    { name: 'hang-once', url: sink.url('/hang-once'), timeout_ms: 500 },
  ].map((h) => ({ events: '*', kind: 'webhook', ...h }));
  const p = await startDispatchProxy({ upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 100 }, handlers });
  t.after(() => p.kill());
  const client = await new MongoClient(up.uri).connect();
  t.after(() => client.close());
  await publish(client, db, [{ id: 'r-1', type: 'retry.v1', payload: { x: 1 } }], handlers.map((h) => h.name));

  const deliveries = client.db(db).collection('relaybus_deliveries');
  await waitFor(async () => (await deliveries.countDocuments({ status: 'pending' })) === 0, 120000, 'every delivery to finish');
  // Retry-After in seconds and as an HTTP date: the second attempt waited for it.
  for (const path of ['/after-seconds', '/after-date']) {
    const a = sink.stats().custom.filter((x) => x.path === path);
    assert.equal(a.length, 2, `${path}: two attempts`);
    const gap = a[1].at - a[0].at;
    assert.ok(gap >= 1000 && gap < 8000, `${path}: waited ${gap} ms for Retry-After`);
    assert.deepEqual(a.map((x) => x.attempt), [1, 2]);
  }
  // 5xx: three attempts with backoff, then dead with the last error.
  const five = sink.stats().custom.filter((x) => x.path === '/always-500');
  assert.deepEqual(five.map((x) => x.attempt), [1, 2, 3]);
  const dead500 = await deliveries.findOne({ handler: 'always-500' });
  assert.equal(dead500.status, 'dead');
  assert.equal(dead500.attempts, 3);
  assert.equal(dead500.lastError, 'HTTP 500: boom 3');
  // retry_4xx: the 404 was retried up to max_attempts.
  const dead404 = await deliveries.findOne({ handler: '404-retried' });
  assert.equal(dead404.status, 'dead');
  assert.equal(dead404.attempts, 2);
  assert.equal(dead404.lastError, 'HTTP 404: no such thing');
  // The timed-out request was retried and completed.
  assert.equal(seen.get('/hang-once r-1'), 2);
  assert.equal(await deliveries.countDocuments({ handler: 'hang-once' }), 0);
  assert.match(p.log(), /hang-once delivery \S+ attempt 1 failed \(timeout/);
  assert.equal((await p.stop()).code, 0);
});

async function upstreamFor(t) {
  const up = await startUpstream();
  t.after(() => up.stop());
  return up;
}
