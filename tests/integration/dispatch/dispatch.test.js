'use strict';
// End to end: events published into the outbox in transactions (directly with
// the Node driver, as the publishing path writes them, or through the proxy's
// annotations) are dispatched by proxies to webhook sinks: a SIGKILLed proxy's
// lanes taken over, a local commit waking the dispatcher, a reload, lease
// renewal. The run at scale is scale.test.js.
//
// RELAYBUS_DISPATCH_KILL_EVENTS sizes the SIGKILL run (default 400).

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const { uniqueDbName, dbName, clientUri, sleep, freePort } = require('../lib/proxy');
const { startSink } = require('./sink');
const { startDispatchProxy, publish, publishThroughProxy, waitFor } = require('./helpers');
const { N_EVENTS, N_KEYS, TIMEOUT_MS, SECRET, makeEvents, report, upstreamFor } = require('./events');
test('a proxy killed with SIGKILL: its lanes are taken over after the lease, lost attempts charged, nothing lost',
  { timeout: TIMEOUT_MS + 60000 }, async (t) => {
    const up = await upstreamFor(t);
    const db = uniqueDbName('dispatch_kill');
    // Slow enough that the victim has requests in flight when it dies.
    const sink = await startSink({ secret: SECRET, delayMs: 300 });
    t.after(() => sink.close());
    const handlers = [{ name: 'h', events: '*', kind: 'webhook', url: sink.url('/h'), secret: SECRET, concurrency: 16 }];
    const opts = {
      upstream: up.uri,
      outbox: { database: db, completion_history: 'true' },
      dispatch: { poll_interval_ms: 100, batch_size: 50, lease_ms: 2000 },
      handlers,
    };
    const victim = await startDispatchProxy(opts);
    const client = await new MongoClient(up.uri).connect();
    t.after(() => client.close());
    const n = Number(process.env.RELAYBUS_DISPATCH_KILL_EVENTS || Math.min(N_EVENTS, 400));
    const events = makeEvents(n, Math.min(N_KEYS, 20), 'kill');
    await publish(client, db, events, ['h'], 25);
    // Let the victim take lanes and start requests, then kill it mid-run.
    await waitFor(() => sink.stats().ok.size >= 20, 60000, 'the victim to deliver something');
    await waitFor(() => sink.stats().pendingNow > 0, 60000, 'the victim to have requests in flight');
    const lanes = client.db(db).collection('relaybus_lanes');
    const owner = (victim.log().match(/owner (\S+),/) || [])[1];
    assert.ok(owner, 'the victim logs its owner');
    await victim.kill();
    // What the victim lost: listed in flight on its lanes and not completed
    // (a completion deletes the delivery but leaves the lane's list alone).
    const held = await lanes.find({ owner }).toArray();
    const listed = held.flatMap((l) => l.inFlight || []);
    const deliveriesColl = client.db(db).collection('relaybus_deliveries');
    const lost = await deliveriesColl.find({ _id: { $in: listed } }).toArray();
    const inFlight = lost.length;
    t.diagnostic(`killed the victim holding ${held.length} lane(s) with ${inFlight} delivery(ies) in flight`);
    const killedAt = Date.now();
    const survivorAdmin = await freePort();
    const survivor = await startDispatchProxy({ ...opts, adminListen: `127.0.0.1:${survivorAdmin}` });
    t.after(() => survivor.kill());

    const deliveries = client.db(db).collection('relaybus_deliveries');
    await waitFor(async () => (await deliveries.countDocuments({})) === 0, TIMEOUT_MS, 'every delivery to complete');
    report(t, 'sink', sink);
    for (const e of events) assert.ok(sink.stats().ok.has(e.id), `never acknowledged ${e.id}`);
    assert.deepEqual(sink.stats().seqViolations.slice(0, 10), []);
    assert.equal(sink.stats().badSignatures, 0);
    // The victim's lanes went to the survivor, and not before the lease ran out.
    assert.equal(await lanes.countDocuments({ owner }), 0);
    if (inFlight > 0) {
      assert.ok(survivor.log().split('\n').find((l) => /charged \d+ lost attempt/.test(l)), 'the survivor logs the charge');
      // Every lost attempt is charged: its completion record counts the
      // lost attempt although the sink never failed.
      const hist = client.db(db).collection('relaybus_completed_deliveries');
      const recs = await hist.find({ _id: { $in: lost.map((d) => d._id) } }).toArray();
      assert.equal(recs.length, lost.length);
      for (const r of recs) assert.ok(r.attempts >= 2, `delivery ${r._id} was charged its lost attempt`);
      assert.ok(sink.stats().attempts.some((a) => a >= 2), 'a redelivery reported attempt >= 2');
    } else {
      t.diagnostic('the victim had nothing in flight when it died: no charge to check');
    }
    t.diagnostic(`everything delivered ${Date.now() - killedAt} ms after the kill`);
    assert.equal(await client.db(db).collection('relaybus_completed_deliveries').countDocuments({}), n);
    // The admin API lists them from the completion history, oldest first, a page at a time.
    const page = await (await fetch(`http://127.0.0.1:${survivorAdmin}/api/deliveries?status=completed&handler=h&limit=10`)).json();
    assert.equal(page.count, Math.min(n, 10));
    assert.ok(page.deliveries.every((d) => d.handler === 'h' && d.status === 'completed'), JSON.stringify(page.deliveries[0]));
    assert.equal(page.next === null, n <= 10, 'a next cursor while more follow');
    assert.equal((await survivor.stop()).code, 0);
    await sleep(0);
  });

test('events published through the proxy: every handler gets them in key order, and a local commit wakes the dispatcher',
  { timeout: TIMEOUT_MS + 60000 }, async (t) => {
    const up = await upstreamFor(t);
    const sink = await startSink({ secret: SECRET });
    t.after(() => sink.close());
    const handlers = [
      { name: 'a', events: 'order.*', kind: 'webhook', url: sink.url('/a'), secret: SECRET, concurrency: 8 },
      { name: 'p', events: 'order.*', kind: 'pull' },
    ];
    // A long poll interval: only the wake-up after a commit explains a fast delivery.
    const adminPort = await freePort();
    const p = await startDispatchProxy({ upstream: up.uri, dispatch: { poll_interval_ms: 20000 }, handlers,
      adminListen: `127.0.0.1:${adminPort}` });
    t.after(() => p.kill());
    const client = await new MongoClient(clientUri({ host: '127.0.0.1', port: p.port })).connect();
    t.after(() => client.close());
    await sleep(1000); // the start-up claim is over; the next poll is 20 s away

    const lat = [];
    for (let i = 0; i < 5; i++) {
      const id = `wake-${i}`;
      const t0 = Date.now();
      await publishThroughProxy(client, dbName('shop'), [{ id, type: 'order.placed.v1', key: 'w', payload: { i } }]);
      await waitFor(() => sink.stats().ok.has(id), 10000, `${id} through the wake-up`);
      lat.push(sink.stats().firstAt.get(id) - t0);
    }
    t.diagnostic(`publish-to-webhook with the local wake-up: ${lat.join(', ')} ms`);
    assert.ok(Math.max(...lat) < 5000, 'delivered well before the next poll');

    const n = Math.min(N_EVENTS, 200);
    const events = makeEvents(n, 10, 'px').map((e) => ({ ...e, payload: { i: e.payload.i } }));
    await publishThroughProxy(client, dbName('shop'), events, 10);
    await waitFor(() => events.every((e) => sink.stats().ok.has(e.id)), TIMEOUT_MS, 'every event through the proxy');
    report(t, 'a', sink);
    assert.deepEqual(sink.stats().seqViolations.slice(0, 10), []);
    assert.equal(sink.stats().badSignatures, 0);
    // The pull handler's deliveries were created and are not dispatched.
    const direct = await new MongoClient(up.uri).connect();
    t.after(() => direct.close());
    const dels = direct.db(dbName('relaybus')).collection('relaybus_deliveries');
    assert.equal(await dels.countDocuments({ handler: 'p', status: 'pending' }), n + 5);
    assert.equal(await dels.countDocuments({ handler: 'a' }), 0);
    // The dispatcher reports what it settled to the admin port's metrics.
    const metrics = await (await fetch(`http://127.0.0.1:${adminPort}/metrics`)).text();
    const value = (re) => Number((metrics.match(re) || [])[1]);
    assert.equal(value(/^relaybus_deliveries_completed_total\{handler="a"\} (\d+)/m), n + 5);
    assert.equal(value(/^relaybus_handler_latency_seconds_count\{handler="a"\} (\d+)/m), n + 5);
    assert.ok(value(/^relaybus_dispatch_claims_total (\d+)/m) >= 1);
    assert.equal((await p.stop()).code, 0);
  });

test('SIGHUP: a reloaded poll_interval_ms applies to the running dispatcher', { timeout: 120000 }, async (t) => {
  const up = await upstreamFor(t);
  const db = uniqueDbName('dispatch_reload');
  const sink = await startSink({});
  t.after(() => sink.close());
  const handlers = [{ name: 'h', events: '*', kind: 'webhook', url: sink.url('/h') }];
  const p = await startDispatchProxy({ upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 60000 }, handlers });
  t.after(() => p.kill());
  const client = await new MongoClient(up.uri).connect();
  t.after(() => client.close());
  await sleep(1000); // the start-up claim found nothing; the next poll is a minute away
  const fs = require('node:fs');
  fs.writeFileSync(p.ini, fs.readFileSync(p.ini, 'utf8').replace('poll_interval_ms = 60000', 'poll_interval_ms = 100'));
  p.child.kill('SIGHUP');
  await waitFor(() => /dispatch: reloaded \(batch 100, lease 30000 ms, poll 100 ms, purge every \d+ ms\)/.test(p.log()), 10000, 'the reload');
  // Written directly (no wake-up): only a poll at the new interval finds it.
  await publish(client, db, [{ id: 'reload-1', type: 'r.v1', payload: {} }], ['h']);
  const t0 = Date.now();
  await waitFor(() => sink.stats().ok.has('reload-1'), 10000, 'the event at the new poll interval');
  t.diagnostic(`delivered ${Date.now() - t0} ms after the write`);
  assert.equal((await p.stop()).code, 0);
});

test('leases are renewed while handlers run: a handler slower than the lease runs once', { timeout: 120000 }, async (t) => {
  const up = await upstreamFor(t);
  const db = uniqueDbName('dispatch_renew');
  const sink = await startSink({ delayMs: 2500 });
  t.after(() => sink.close());
  const handlers = [{ name: 'h', events: '*', kind: 'webhook', url: sink.url('/h'), timeout_ms: 10000, concurrency: 32 }];
  const opts = { upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 100, lease_ms: 1000 }, handlers };
  const p1 = await startDispatchProxy(opts);
  const p2 = await startDispatchProxy(opts);
  t.after(() => Promise.all([p1.kill(), p2.kill()]));
  const client = await new MongoClient(up.uri).connect();
  t.after(() => client.close());
  const events = makeEvents(20, 5, 'renew');
  await publish(client, db, events, ['h']);
  await waitFor(() => events.every((e) => sink.stats().ok.has(e.id)), 90000, 'every event');
  report(t, 'h', sink);
  // Without renewal the 1 s leases would expire mid-request and the other
  // proxy would take the lanes over and run the deliveries again.
  assert.equal(sink.duplicates(), 0);
  assert.equal(sink.stats().requests, events.length);
  for (const p of [p1, p2]) assert.doesNotMatch(p.log(), /charged \d+ lost attempt/);
  await Promise.all([p1.stop(), p2.stop()]);
});
