'use strict';
// timeout_ms bounds the whole request, not each read: an endpoint that answers 200 and then
// trickles its body one byte every 100 ms (so no single read ever waits long) must not hold
// the delivery and its lane for ever. Each attempt is cancelled after about timeout_ms, fails
// with a timeout error through the ordinary retry path, and after max_attempts the delivery is
// dead with that error.

const test = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const { MongoClient } = require('mongodb');
const { startUpstream, uniqueDbName } = require('../lib/proxy');
const { startDispatchProxy, publish, waitFor } = require('./helpers');

const TIMEOUT_MS = 1000;

test('a trickling endpoint is cut off after timeout_ms and the delivery retried', { timeout: 60000 }, async (t) => {
  const up = await startUpstream();
  t.after(() => up.stop());
  const attempts = []; // {at, closedAt}
  const timers = new Set();
  const server = http.createServer((req, res) => {
    const a = { at: Date.now(), closedAt: null };
    attempts.push(a);
    req.resume();
    res.writeHead(200, { 'content-type': 'text/plain', 'content-length': '10000' });
    const timer = setInterval(() => res.write('x'), 100);
    timers.add(timer);
    res.on('close', () => { clearInterval(timer); timers.delete(timer); a.closedAt = Date.now(); });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.after(() => new Promise((resolve) => {
    for (const x of timers) clearInterval(x);
    server.closeAllConnections();
    server.close(() => resolve());
  }));
  const db = uniqueDbName('dispatch_deadline');
  const handlers = [{ name: 'trickle', events: '*', kind: 'webhook', url: `http://127.0.0.1:${server.address().port}/slow`,
    timeout_ms: TIMEOUT_MS, max_attempts: 2 }];
  const p = await startDispatchProxy({ upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 100 }, handlers });
  t.after(() => p.kill());
  const client = await new MongoClient(up.uri, { serverSelectionTimeoutMS: 3000 }).connect();
  t.after(() => client.close());
  await publish(client, db, [{ id: 'trickle-1', type: 'slow.v1', payload: {} }], ['trickle']);

  const deliveries = client.db(db).collection('relaybus_deliveries');
  // Two attempts of about a second each, plus the backoff between them (at most 500 ms).
  await waitFor(async () => (await deliveries.countDocuments({ status: 'dead' })) === 1, 15000,
    'the delivery to be dead after two cut-off attempts');
  const d = await deliveries.findOne({ handler: 'trickle' });
  assert.equal(d.attempts, 2);
  assert.match(d.lastError, /^timeout: no complete answer within 1000 ms/);
  assert.equal(attempts.length, 2);
  await waitFor(async () => attempts.every((a) => a.closedAt), 5000, 'both connections closed by the proxy');
  for (const a of attempts) {
    const ms = a.closedAt - a.at;
    assert.ok(ms >= TIMEOUT_MS - 100 && ms < TIMEOUT_MS + 1500, `an attempt was cut off after ${ms} ms, not about ${TIMEOUT_MS}`);
  }
  assert.match(p.log(), /trickle delivery \S+ attempt 1 failed \(timeout/);
  assert.equal((await p.stop()).code, 0);
});
