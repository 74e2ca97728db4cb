'use strict';
// A proxy that drains (SIGTERM) while consumers long-poll: each waiting relaybusClaim is
// answered at once (an empty batch), so the connections close and the proxy exits long before
// maxAwaitTimeMS or drain_timeout_ms, with exit code 0; a claim sent during the drain does not
// wait either.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const C = require('./lib');

const { H } = C;
let s;

test('SIGTERM answers the waiting long polls at once and the proxy exits', async () => {
  s = await C.startConsumers({ settings: { drain_timeout_ms: 20000 } });
  const clients = [];
  for (let i = 0; i < 2; i++) {
    const c = new MongoClient(s.proxy.uri(), { maxPoolSize: 1, serverSelectionTimeoutMS: 10000 });
    await c.connect();
    clients.push(c);
  }
  const t0 = Date.now();
  const polls = clients.map((c) => C.cmd(c, { relaybusClaim: 'users', limit: 5, maxAwaitTimeMS: 30000 }));
  await H.sleep(300);
  s.proxy.terminate();
  const replies = await Promise.all(polls);
  const answeredIn = Date.now() - t0;
  for (const r of replies) assert.deepEqual(r.deliveries, []);
  assert.ok(answeredIn < 3000, `long polls answered ${answeredIn} ms after they started (maxAwaitTimeMS 30000)`);
  for (const c of clients) await c.close();
  await s.closeClients();
  const stopStart = Date.now();
  await s.proxy.stop(); // asserts exit 0
  assert.ok(Date.now() - stopStart < 5000, 'the drain did not wait for drain_timeout_ms');
});

H.registerFinalChecks(test, [() => s && s.upstream.stop()]);
