'use strict';
// Scheduled retention end to end: with retain_completed = 2s, retain_dead = 3s and
// purge_interval = 1s, an event whose deliveries all completed is removed by the first purge
// after its last completion is 2 s old (never before), an event still referenced by a delivery
// (a handler whose endpoint keeps failing) stays, a dead letter goes after 3 s with its event,
// and /metrics counts what the scheduled purges removed.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const { startUpstream, uniqueDbName, freePort, sleep } = require('../lib/proxy');
const { startSink } = require('./sink');
const { startDispatchProxy, publish, waitFor } = require('./helpers');

const RETAIN_COMPLETED_MS = 2000;
const RETAIN_DEAD_MS = 3000;

test('scheduled purge: completed events go after retain_completed, referenced ones stay, metrics count them',
  { timeout: 90000 }, async (t) => {
    const up = await startUpstream();
    t.after(() => up.stop());
    const respond = (ev, req) => {
      if (req.url === '/fail') return { status: 500, body: 'down' };
      if (req.url === '/bad') return { status: 400, body: 'refused' };
      return { status: 204 };
    };
    const sink = await startSink({ respond });
    t.after(() => sink.close());
    const db = uniqueDbName('dispatch_retention');
    const handlers = [
      { name: 'ok', url: sink.url('/ok') },
      { name: 'fail', url: sink.url('/fail'), max_attempts: 1000 },
      // retry_4xx = false: a 400 buries at once (the default retries it).
      { name: 'bad', url: sink.url('/bad'), retry_4xx: false },
    ].map((h) => ({ events: '*', kind: 'webhook', ...h }));
    const adminPort = await freePort();
    const p = await startDispatchProxy({
      upstream: up.uri,
      outbox: { database: db, retain_completed: '2s', retain_dead: '3s', purge_interval: '1s' },
      dispatch: { poll_interval_ms: 100 },
      adminListen: `127.0.0.1:${adminPort}`,
      handlers,
    });
    t.after(() => p.kill());
    const client = await new MongoClient(up.uri, { serverSelectionTimeoutMS: 5000 }).connect();
    t.after(() => client.close());
    const events = client.db(db).collection('relaybus_events');
    const deliveries = client.db(db).collection('relaybus_deliveries');

    const done = [0, 1, 2, 3, 4].map((i) => ({ id: `done-${i}`, type: 'order.placed.v1', key: `k${i % 2}`, payload: { i } }));
    const referenced = [0, 1, 2].map((i) => ({ id: `ref-${i}`, type: 'order.placed.v1', payload: { i } }));
    const dead = [0, 1].map((i) => ({ id: `dead-${i}`, type: 'order.placed.v1', payload: { i } }));
    await publish(client, db, done, ['ok']);
    await publish(client, db, referenced, ['ok', 'fail']);
    await publish(client, db, dead, ['bad']);

    // Every 'ok' delivery completes; the 'bad' ones are dead at once; 'fail' keeps retrying.
    const ids = (list) => list.map((e) => e.id);
    await waitFor(async () => (await deliveries.countDocuments({ handler: 'ok' })) === 0, 20000, 'the ok deliveries to complete');
    await waitFor(async () => (await deliveries.countDocuments({ handler: 'bad', status: 'dead' })) === 2, 20000,
      'the bad deliveries to be dead');
    // With attempt records (the default) the dispatcher writes a second's completion times together
    // once that second is over (docs/outbox-schema.md, "events"): within about a second.
    await waitFor(async () => (await events.countDocuments({ _id: { $in: ids(done) }, completedAt: { $exists: true } })) === done.length,
      5000, 'the completion times');
    const completedAt = new Map();
    for (const e of await events.find({ _id: { $in: ids(done) } }).toArray()) {
      assert.ok(e.completedAt instanceof Date, `${e._id} records its completion`);
      completedAt.set(e._id, e.completedAt.getTime());
    }
    assert.equal(completedAt.size, done.length, 'no completed event is purged before its retention');

    // Each completed event disappears, but never before its last completion is 2 s old.
    const goneAt = new Map();
    await waitFor(async () => {
      const left = new Set((await events.find({ _id: { $in: ids(done) } }, { projection: { _id: 1 } }).toArray()).map((e) => e._id));
      const now = Date.now();
      for (const e of done) if (!left.has(e.id) && !goneAt.has(e.id)) goneAt.set(e.id, now);
      return left.size === 0;
    }, RETAIN_COMPLETED_MS + 15000, 'the completed events to be purged');
    for (const e of done) {
      const age = goneAt.get(e.id) - completedAt.get(e.id);
      // 100 ms of slack for the clocks of the proxy and this process.
      assert.ok(age >= RETAIN_COMPLETED_MS - 100, `${e.id} was purged ${age} ms after its completion, before retain_completed`);
    }
    // Dead letters go after retain_dead, with their events (nothing else references them).
    await waitFor(async () => (await deliveries.countDocuments({ status: 'dead' })) === 0, RETAIN_DEAD_MS + 15000,
      'the dead letters to be purged');
    await waitFor(async () => (await events.countDocuments({ _id: { $in: ids(dead) } })) === 0, 5000,
      'the events of the dead letters to be purged');

    // Events still referenced by a delivery stay, however many purges ran meanwhile.
    await sleep(1500);
    assert.equal(await events.countDocuments({ _id: { $in: ids(referenced) } }), referenced.length);
    assert.equal(await deliveries.countDocuments({ handler: 'fail', status: 'pending' }), referenced.length);
    const kept = await events.find({ _id: { $in: ids(referenced) } }).toArray();
    for (const e of kept) assert.ok(e.completedAt instanceof Date, `${e._id}: its 'ok' delivery completed too`);

    // The metrics count what the scheduled purges removed, and the log says so.
    const metrics = await (await fetch(`http://127.0.0.1:${adminPort}/metrics`)).text();
    const value = (name) => {
      const m = metrics.match(new RegExp(`^${name} (\\d+)$`, 'm'));
      assert.ok(m, `${name} in /metrics`);
      return Number(m[1]);
    };
    assert.equal(value('relaybus_purged_events_total'), done.length + dead.length);
    assert.equal(value('relaybus_purged_dead_letters_total'), dead.length);
    assert.equal(value('relaybus_purged_history_total'), 0);
    assert.ok(value('relaybus_purge_runs_total') >= 2, 'several runs, one per purge_interval');
    assert.equal(value('relaybus_purge_errors_total'), 0);
    assert.match(p.log(), /scheduled purge removed [1-9]\d* events/);
    assert.equal((await p.stop()).code, 0);
  });
