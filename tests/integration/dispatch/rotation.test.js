'use strict';
// Secret rotation end to end: a webhook handler with two secrets signs each
// request once per secret, so that a receiver that knows only the old
// secret and one that knows only the new secret both verify every request.
// The check uses the independent Standard Webhooks verifier (the npm
// `standardwebhooks` package), not the project's own code.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const { startUpstream, uniqueDbName } = require('../lib/proxy');
const { startDispatchProxy, publish, waitFor, newSecret, startReceiver, verifies } = require('./helpers');


test('rotation: with two secrets, receivers knowing either one verify every request', { timeout: 120000 }, async (t) => {
  const up = await startUpstream();
  t.after(() => up.stop());
  const secretNew = newSecret();
  const secretOld = newSecret();
  const secretOther = newSecret();
  const sink = await startReceiver();
  t.after(() => sink.close());
  const db = uniqueDbName('dispatch_rotation');
  // The new secret first, as docs/handlers.md tells to add it; the proxy's
  // own retry schedule (nothing here fails).
  const handlers = [{ name: 'rotating', events: '*', kind: 'webhook', url: sink.url('/hook'), secret: `${secretNew} ${secretOld}`, retry_schedule: undefined }];
  const p = await startDispatchProxy({ upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 100 }, handlers });
  t.after(() => p.kill());
  const client = await new MongoClient(up.uri).connect();
  t.after(() => client.close());
  const events = Array.from({ length: 20 }, (_, i) => ({ id: `rot-${i}`, type: 'rotation.v1', key: `k${i % 3}`, payload: { i, text: 'é "quoted" \u2603' } }));
  await publish(client, db, events, ['rotating']);

  const deliveries = client.db(db).collection('relaybus_deliveries');
  await waitFor(async () => (await deliveries.countDocuments({ status: 'pending' })) === 0, 60000, 'every delivery to complete');
  assert.equal(await deliveries.countDocuments({}), 0, 'no dead or pending delivery');
  assert.deepEqual([...new Set(sink.requests.map((r) => r.id))].sort(), events.map((e) => e.id).sort(), 'every event arrived');
  for (const r of sink.requests) {
    const sig = r.headers['webhook-signature'] || '';
    assert.ok(verifies(secretOld, r.body, r.headers), `${r.id}: a receiver with only the old secret verifies it (${sig})`);
    assert.ok(verifies(secretNew, r.body, r.headers), `${r.id}: a receiver with only the new secret verifies it (${sig})`);
    assert.ok(!verifies(secretOther, r.body, r.headers), `${r.id}: a receiver with another secret does not`);
    // One v1 signature per secret, space-separated, the first secret's first.
    const parts = sig.split(' ');
    assert.equal(parts.length, 2, sig);
    for (const part of parts) assert.match(part, /^v1,[A-Za-z0-9+/]{43}=$/);
    const onlyFirst = { ...r.headers, 'webhook-signature': parts[0] };
    assert.ok(verifies(secretNew, r.body, onlyFirst), `${r.id}: the first signature is the first secret's`);
  }
  assert.equal((await p.stop()).code, 0);
});

test('rotation: once the old secret is removed, only the new one verifies; no secret, no signature header', { timeout: 120000 }, async (t) => {
  const up = await startUpstream();
  t.after(() => up.stop());
  const secretNew = newSecret();
  const secretOld = newSecret();
  const sink = await startReceiver();
  t.after(() => sink.close());
  const db = uniqueDbName('dispatch_rotation_done');
  const handlers = [
    { name: 'rotated', events: '*', kind: 'webhook', url: sink.url('/rotated'), secret: secretNew },
    { name: 'unsigned', events: '*', kind: 'webhook', url: sink.url('/unsigned') },
  ].map((h) => ({ ...h, retry_schedule: undefined })); // the proxy's own schedule: nothing here fails
  const p = await startDispatchProxy({ upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 100 }, handlers });
  t.after(() => p.kill());
  const client = await new MongoClient(up.uri).connect();
  t.after(() => client.close());
  await publish(client, db, [{ id: 'done-1', type: 'rotation.v1', payload: { x: 1 } }], handlers.map((h) => h.name));
  const deliveries = client.db(db).collection('relaybus_deliveries');
  await waitFor(async () => (await deliveries.countDocuments({ status: 'pending' })) === 0, 60000, 'every delivery to complete');
  const rotated = sink.requests.filter((r) => r.path === '/rotated');
  assert.equal(rotated.length, 1);
  assert.ok(verifies(secretNew, rotated[0].body, rotated[0].headers), 'the remaining secret verifies');
  assert.ok(!verifies(secretOld, rotated[0].body, rotated[0].headers), 'the removed secret does not');
  assert.match(rotated[0].headers['webhook-signature'], /^v1,[A-Za-z0-9+/]{43}=$/);
  const unsigned = sink.requests.filter((r) => r.path === '/unsigned');
  assert.equal(unsigned.length, 1);
  assert.equal(unsigned[0].headers['webhook-signature'], undefined);
  assert.equal((await p.stop()).code, 0);
});
