'use strict';
// [handler] rate_limit (docs/handlers.md, "Rate limits"): with rate_limit = 20/s, 100 deliveries
// on 5 keys take at least 4.5 s from the first to the last (the bucket is empty when the first
// comes and fills at 20 a second), each key in order and one at a time; the deliveries waiting
// for a token are neither charged (every one completes at attempt 1, no attempt on record but
// its success) nor parked, and relaybus_handler_rate_limited shows them while they wait. A
// handler without a limit beside it is not held back. After a quiet spell the bucket is full
// again: a burst of 20, no more, then 20 a second.

const test = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const { MongoClient } = require('mongodb');
const { startUpstream, uniqueDbName, freePort } = require('../lib/proxy');
const { startSink } = require('./sink');
const { startDispatchProxy, publish, waitFor } = require('./helpers');

function scrape(port) {
  return new Promise((resolve, reject) => {
    http.get({ host: '127.0.0.1', port, path: '/metrics', agent: false }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c) => { body += c; });
      res.on('end', () => resolve(body));
    }).on('error', reject);
  });
}

test('rate_limit = 20/s: 100 deliveries take at least 4.5 s, in order per key, none charged or parked', { timeout: 120000 }, async (t) => {
  const up = await startUpstream();
  t.after(() => up.stop());
  const limited = await startSink({});
  const free = await startSink({});
  t.after(() => Promise.all([limited.close(), free.close()]));
  const db = uniqueDbName('dispatch_rate_limit');
  const adminPort = await freePort();
  const handlers = [
    { name: 'limited', events: '*', kind: 'webhook', url: limited.url('/limited'), rate_limit: '20/s', concurrency: 64 },
    { name: 'free', events: '*', kind: 'webhook', url: free.url('/free'), concurrency: 64 },
  ];
  const p = await startDispatchProxy({ upstream: up.uri, outbox: { database: db }, adminListen: `127.0.0.1:${adminPort}`,
    dispatch: { poll_interval_ms: 200, batch_size: 100 }, handlers });
  t.after(() => p.kill());
  const client = await new MongoClient(up.uri).connect();
  t.after(() => client.close());
  const events = [];
  for (let i = 0; i < 100; i++) events.push({ id: `rl-${i}`, type: 'rate.v1', key: `k${i % 5}`, payload: { i } });
  const deliveries = client.db(db).collection('relaybus_deliveries');

  // While they run: the gauge shows deliveries waiting for a token, and no delivery of the
  // limited handler is ever parked.
  let sawWaiting = 0;
  let parked = 0;
  let watching = true;
  const watch = (async () => {
    while (watching) {
      const m = /^relaybus_handler_rate_limited\{handler="limited"\} (\d+)$/m.exec(await scrape(adminPort).catch(() => ''));
      if (m) sawWaiting = Math.max(sawWaiting, Number(m[1]));
      parked += await deliveries.countDocuments({ handler: 'limited', lane: 'parked' });
      await new Promise((r) => setTimeout(r, 100));
    }
  })();
  await publish(client, db, events, ['limited', 'free'], 100);
  await waitFor(() => free.stats().ok.size === 100, 30000, 'the handler without a limit');
  const freeDone = Date.now();
  await waitFor(() => limited.stats().ok.size === 100, 60000, 'the rate-limited handler');
  watching = false;
  await watch;

  const times = [...limited.stats().firstAt.values()].sort((a, b) => a - b);
  const spanMs = times[times.length - 1] - times[0];
  t.diagnostic(`100 rate-limited deliveries from the first to the last: ${spanMs} ms; most waiting at once: ${sawWaiting}`);
  assert.ok(spanMs >= 4500, `100 deliveries at 20/s took ${spanMs} ms, at least 4,500 expected`);
  assert.ok(spanMs < 15000, `and not much longer: ${spanMs} ms`);
  // No second in which more than 20 + 20 (a full bucket and its refill) started.
  for (let i = 0; i + 40 < times.length; i++) assert.ok(times[i + 40] - times[i] >= 1000, `41 deliveries within a second at ${i}`);
  const freeTimes = [...free.stats().firstAt.values()];
  assert.ok(Math.max(...freeTimes) < freeDone && Math.max(...freeTimes) - Math.min(...freeTimes) < spanMs,
    'the handler without a limit was not held back');
  assert.deepEqual(limited.stats().seqViolations, [], 'each key in order, one at a time');
  assert.equal(limited.stats().concurrentKeys, 0);
  assert.equal(limited.duplicates(), 0);
  // Not charged: every delivery completed at its first attempt, and the only attempts on record
  // are the 100 successes.
  assert.deepEqual([...new Set(limited.stats().attempts)], [1]);
  const attempts = client.db(db).collection('relaybus_attempts');
  await waitFor(async () => (await attempts.countDocuments({ handler: 'limited' })) === 100, 10000, 'the 100 records');
  assert.equal(await attempts.countDocuments({ handler: 'limited', outcome: 'succeeded', attempt: 1 }), 100);
  assert.equal(parked, 0, 'none parked');
  assert.ok(sawWaiting > 0, 'relaybus_handler_rate_limited showed deliveries waiting for a token');
  assert.equal(await deliveries.countDocuments({}), 0);

  // A quiet spell fills the bucket: 30 more start as a burst of 20, the other 10 at 20 a second.
  await new Promise((r) => setTimeout(r, 1500));
  const more = [];
  for (let i = 100; i < 130; i++) more.push({ id: `rl-${i}`, type: 'rate.v1', payload: { i } });
  await publish(client, db, more, ['limited'], 30);
  await waitFor(() => limited.stats().ok.size === 130, 30000, 'the 30 after the quiet spell');
  const burst = more.map((e) => limited.stats().firstAt.get(e.id)).sort((a, b) => a - b);
  t.diagnostic(`after 1.5 s quiet: the 20th of 30 after ${burst[19] - burst[0]} ms, the 30th after ${burst[29] - burst[0]} ms`);
  assert.ok(burst[19] - burst[0] < 450, `a burst: 20 within ${burst[19] - burst[0]} ms`);
  assert.ok(burst[29] - burst[0] >= 400, `then paced: the last 10 took ${burst[29] - burst[19]} ms more`);
  assert.equal((await p.stop()).code, 0);
});
