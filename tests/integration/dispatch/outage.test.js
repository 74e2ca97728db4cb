'use strict';
// A receiver outage outlasted by the retry schedule: the receiver answers
// 503 (no Retry-After) for 4 s while keyed events are published; once it is
// back, every event arrives, each key's in order, and none is dead. The
// schedule is a shortened one (the default's unit test is in
// tests/unit/test_config.c); a control handler whose schedule is shorter
// than the outage dead-letters, so the test sees a dead letter when there is
// one.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const { startUpstream, uniqueDbName, sleep } = require('../lib/proxy');
const { startSink } = require('./sink');
const { startDispatchProxy, publish, waitFor } = require('./helpers');

const OUTAGE_MS = 4000;
// Full jitter draws each wait in [0, delay]: twelve delays make the chance
// that they all add up to less than the outage about 2 in a million.
const SCHEDULE = '200ms, 500ms, 1s, 2s, 4s, 4s, 4s, 4s, 4s, 4s, 4s, 4s';

test('outage: a receiver down for a while gets every event once back, in key order, none dead', { timeout: 120000 }, async (t) => {
  const up = await startUpstream();
  t.after(() => up.stop());
  let upAt = Infinity;
  const down = () => (Date.now() < upAt ? { status: 503, body: 'down' } : undefined);
  const sink = await startSink({ respond: down });
  t.after(() => sink.close());
  const control = await startSink({ respond: down });
  t.after(() => control.close());
  const db = uniqueDbName('dispatch_outage');
  const handlers = [
    { name: 'receiver', events: 'order.*', kind: 'webhook', url: sink.url('/hook'), retry_schedule: SCHEDULE },
    { name: 'short-schedule', events: 'order.*', kind: 'webhook', url: control.url('/hook'), retry_schedule: '200ms', max_attempts: 3 },
  ];
  const p = await startDispatchProxy({ upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 100 }, handlers });
  t.after(() => p.kill());
  const client = await new MongoClient(up.uri).connect();
  t.after(() => client.close());

  // The receivers go down; events are published meanwhile, in three rounds.
  upAt = Date.now() + OUTAGE_MS;
  const keys = ['k-a', 'k-b', 'k-c'];
  const events = [];
  for (let round = 0; round < 3; round++) {
    const batch = [];
    for (const key of keys) {
      for (let i = 0; i < 2; i++) {
        const n = round * 2 + i + 1;
        batch.push({ id: `${key}-${n}`, type: 'order.placed.v1', key, payload: { key, n } });
      }
    }
    await publish(client, db, batch, handlers.map((h) => h.name));
    events.push(...batch);
    await sleep(500);
  }
  assert.ok(Date.now() < upAt, 'the events were published during the outage');

  const deliveries = client.db(db).collection('relaybus_deliveries');
  await waitFor(async () => (await deliveries.countDocuments({ status: { $ne: 'dead' } })) === 0, 90000,
    'every delivery to complete or die');

  // The receiver was down when the events were first sent.
  const refused = sink.stats().custom.filter((x) => x.status === 503);
  assert.ok(refused.length >= keys.length, `the receiver answered 503 during the outage (${refused.length} times)`);
  // Once back: every event, each key in order, nothing dead.
  const st = sink.stats();
  for (const e of events) assert.ok(st.ok.has(e.id), `${e.id} arrived`);
  for (const e of events) assert.ok(st.firstAt.get(e.id) >= upAt, `${e.id} arrived after the outage`);
  assert.deepEqual(st.seqViolations, []);
  for (const key of keys) assert.equal(st.lastSeq.get(key), 6, `${key}: all six in order`);
  for (const key of keys) {
    const order = st.okOrder.filter((id) => id.startsWith(`${key}-`));
    assert.deepEqual(order, [1, 2, 3, 4, 5, 6].map((n) => `${key}-${n}`), `${key}: acknowledged in key order`);
  }
  assert.equal(await deliveries.countDocuments({ handler: 'receiver', status: 'dead' }), 0, 'no dead letter for the receiver');
  assert.ok(st.attempts.some((a) => a > 1), 'some events arrived on a retry');

  // The control: three attempts over at most 400 ms cannot outlast the outage.
  const dead = await deliveries.find({ handler: 'short-schedule', status: 'dead' }).toArray();
  assert.ok(dead.length >= 1, 'a schedule shorter than the outage dead-letters');
  for (const d of dead) {
    assert.equal(d.attempts, 3);
    assert.equal(d.lastError, 'HTTP 503: down');
  }
  assert.equal((await p.stop()).code, 0);
});
