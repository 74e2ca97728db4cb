'use strict';
// Faults end to end: one dispatching proxy delivers keyed events while the
// upstream fails 10% of the dispatcher's deletes, updates and aggregates at
// random (failCommand with appName "relaybus-proxy dispatch"), half of them
// by dropping the connection, half with ShutdownInProgress, as a failover
// does. A completion flush, a claim's record or a reconciliation that fails
// must never leave a delivery running for ever: once the faults stop, every
// event reaches the sink within 2 x lease_ms, in key order per key, none is
// lost, and the duplicates are counted and reported.
//
// RELAYBUS_FAULT_EVENTS and RELAYBUS_FAULT_KEYS scale it (default 400 on 20
// keys; the run is 2000 on 20).

const test = require('node:test');
const assert = require('node:assert/strict');
const { uniqueDbName, sleep } = require('../lib/proxy');
const { startSink } = require('./sink');
const { upstreamWithFailPoints, startDispatchProxy, publish, waitFor } = require('./helpers');

const LEASE_MS = 3000;

test('faults: 10% of the dispatcher\'s writes and aggregates fail; nothing is lost or stuck', { timeout: 300000 }, async (t) => {
  const N = Number(process.env.RELAYBUS_FAULT_EVENTS || 400);
  const KEYS = Number(process.env.RELAYBUS_FAULT_KEYS || 20);
  const fx = await upstreamWithFailPoints(t);
  if (!fx) return;
  const { up, admin, fp } = fx;
  const sink = await startSink({});
  t.after(() => sink.close());
  const db = uniqueDbName('dispatch_faults');
  const handlers = [{ name: 'faulty', events: '*', kind: 'webhook', url: sink.url('/faulty'), max_attempts: 1000, concurrency: 32 }];
  const p = await startDispatchProxy({
    upstream: up.uri,
    outbox: { database: db },
    dispatch: { poll_interval_ms: 100, lease_ms: LEASE_MS, batch_size: 50 },
    handlers,
  });
  t.after(() => p.kill());

  // Faults from the first claim on, alternating the way they fail.
  const data = (closeConnection) => ({
    failCommands: ['delete', 'update', 'aggregate'],
    appName: 'relaybus-proxy dispatch',
    ...(closeConnection ? { closeConnection: true } : { errorCode: 91, errorLabels: [] }),
  });
  let faulting = true;
  let flips = 0;
  const flipper = (async () => {
    while (faulting) {
      await fp({ activationProbability: 0.1 }, data(flips++ % 2 === 0));
      await sleep(250);
    }
  })();

  const events = [];
  for (let i = 0; i < N; i++) events.push({ id: `f-${i}`, type: 'fault.v1', key: `k-${i % KEYS}`, payload: { i } });
  await publish(admin, db, events, ['faulty']);
  // The faults last until every event reached the sink once (60 s at
  // most: a dispatcher that stalls under them gets no further).
  const faultUntil = Date.now() + 60000;
  while (sink.stats().ok.size < N && Date.now() < faultUntil) await sleep(50);
  faulting = false;
  await flipper;
  await fp('off', {});
  const stoppedAt = Date.now();

  // Then nothing may stay stuck: within 2 x lease_ms every event has
  // reached the sink and every delivery is completed (the outbox is empty).
  const bound = 2 * LEASE_MS;
  const deliveries = admin.db(db).collection('relaybus_deliveries');
  const deadline = stoppedAt + bound + 1000; // + one poll and the request itself
  let left = -1;
  while (Date.now() < deadline) {
    left = await deliveries.countDocuments({});
    if (left === 0 && sink.stats().ok.size === N) break;
    await sleep(100);
  }
  const drainedAfter = Date.now() - stoppedAt;
  if (process.env.RELAYBUS_FAULT_LOG) require('node:fs').writeFileSync(process.env.RELAYBUS_FAULT_LOG, p.log());
  const st = sink.stats();
  const missing = events.filter((e) => !st.ok.has(e.id)).map((e) => e.id);
  assert.deepEqual(missing.slice(0, 20), [], `${missing.length} event(s) never reached the sink (faults stopped after ${stoppedAt - faultUntil + 60000} ms)`);
  assert.equal(left, 0, `${left} delivery(ies) still in the outbox ${bound} ms (2 x lease_ms) after the faults stopped`);
  assert.deepEqual(st.seqViolations, [], 'per-key order');
  const dups = sink.duplicates();
  t.diagnostic(`${N} events on ${KEYS} keys, ${st.requests} requests, ${dups} duplicate(s), ` +
    `outbox drained ${drainedAfter} ms after the faults stopped`);
  // The faults hit completions: some completion flush failed while its
  // deliveries were listed in flight.
  assert.match(p.log(), /completing \d+ deliveries failed/, 'a completion flush failed under the faults');
  assert.equal((await p.stop()).code, 0);
});
