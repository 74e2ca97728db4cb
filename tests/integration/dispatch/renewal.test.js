'use strict';
// Renewal never waits behind a slow claim: while a webhook request runs
// longer than lease_ms, the dispatcher's claims are made slow (every
// aggregate it sends waits 2.5 s, longer than the lease, through
// failCommand's blockConnection with appName "relaybus-proxy dispatch").
// The lease of the lane that runs the request must stay live the whole
// time: renewal runs beside the claims, not after them.

const test = require('node:test');
const assert = require('node:assert/strict');
const { uniqueDbName, sleep } = require('../lib/proxy');
const { startSink } = require('./sink');
const { upstreamWithFailPoints, startDispatchProxy, publish, laneId, laneDocId, waitFor } = require('./helpers');

const LEASE_MS = 1500;

test('renewal: a slow claim does not let a running delivery\'s lease lapse', { timeout: 120000 }, async (t) => {
  const fx = await upstreamWithFailPoints(t);
  if (!fx) return;
  const { up, admin, fp } = fx;
  const sink = await startSink({ delayMs: 6000 });
  t.after(() => sink.close());
  const db = uniqueDbName('dispatch_renewal');
  const handlers = [{ name: 'slow', events: '*', kind: 'webhook', url: sink.url('/slow'), timeout_ms: 20000 }];
  const p = await startDispatchProxy({
    upstream: up.uri,
    outbox: { database: db },
    dispatch: { poll_interval_ms: 100, lease_ms: LEASE_MS },
    handlers,
  });
  t.after(() => p.kill());
  await publish(admin, db, [{ id: 'slow-1', type: 'slow.v1', key: 'k', payload: {} }], ['slow']);
  await waitFor(async () => sink.stats().pendingNow === 1, 20000, 'the slow request to start');
  await fp('alwaysOn', {
    failCommands: ['aggregate'],
    appName: 'relaybus-proxy dispatch',
    blockConnection: true,
    blockTimeMS: 2500,
  });
  t.after(() => fp('off', {}).catch(() => {}));

  // While the request runs, the lane's lease never lapses.
  const lanes = admin.db(db).collection('relaybus_lanes');
  const lane = laneDocId('slow', laneId('k', 'slow-1')); // handler slow's lane of the key
  let lapsed = 0;
  let checks = 0;
  while (sink.stats().pendingNow === 1) {
    const doc = await lanes.findOne({ _id: lane });
    if (sink.stats().pendingNow !== 1) break;
    checks++;
    const expires = doc.leaseExpiresAt ? doc.leaseExpiresAt.getTime() : 0;
    if (expires < Date.now()) lapsed++;
    await sleep(100);
  }
  await fp('off', {});
  t.diagnostic(`${checks} checks of lane ${lane} while the request ran, ${lapsed} with the lease lapsed`);
  assert.ok(checks > 20, 'the request ran for a while under slow claims');
  assert.equal(lapsed, 0, 'the lease lapsed while its delivery was running');
  await waitFor(async () => (await admin.db(db).collection('relaybus_deliveries').countDocuments({})) === 0, 20000, 'the completion');
  assert.equal(sink.duplicates(), 0);
  assert.equal((await p.stop()).code, 0);
});

// A delivery never starts on a lease that may lapse before it ends. Every
// renewal is made to wait longer than the lease (failCommand's
// blockConnection on the finds of appName "relaybus-proxy renew", the
// renewal thread's own connection), so each lane's lease lapses one lease
// after the claim that took it, and the other proxy takes the lane over as
// soon as it does. A proxy that still started the next delivery of a key
// run then would run it beside the new holder's delivery of the same key.
// Each delivery must start with at least a third of its lease left, or be
// given back unstarted: the sink never sees two deliveries of the key at
// once, and sees them in order.
test('renewal: with renewals stalled, no delivery starts on a lease about to lapse; two proxies never run a key at once',
  { timeout: 180000 }, async (t) => {
    const fx = await upstreamWithFailPoints(t);
    if (!fx) return;
    const { up, admin, fp } = fx;
    const sink = await startSink({ delayMs: 300 });
    t.after(() => sink.close());
    const db = uniqueDbName('dispatch_lapse');
    const handlers = [{ name: 'h', events: '*', kind: 'webhook', url: sink.url('/h'), timeout_ms: 5000 }];
    const opts = {
      upstream: up.uri,
      outbox: { database: db },
      dispatch: { poll_interval_ms: 100, lease_ms: 1000 },
      handlers,
    };
    await fp('alwaysOn', { failCommands: ['find'], appName: 'relaybus-proxy renew', blockConnection: true, blockTimeMS: 3000 });
    t.after(() => fp('off', {}).catch(() => {}));
    const events = Array.from({ length: 24 }, (_, i) => ({ id: `lapse-${i}`, type: 'lapse.v1', key: 'k', payload: { i } }));
    await publish(admin, db, events, ['h']);
    const a = await startDispatchProxy(opts);
    const b = await startDispatchProxy(opts);
    t.after(() => Promise.all([a.kill(), b.kill()]));
    const deliveries = admin.db(db).collection('relaybus_deliveries');
    try {
      await waitFor(async () => (await deliveries.countDocuments({})) === 0, 120000, 'every delivery to complete');
    } catch (e) {
      t.diagnostic(`first proxy:\n${a.log().slice(-3000)}\nsecond proxy:\n${b.log().slice(-3000)}`);
      throw e;
    }
    const st = sink.stats();
    const givenBack = (a.log() + b.log()).split('\n').filter((l) => /not started: \d+ ms left of its lease/.test(l)).length;
    t.diagnostic(`${st.requests} requests for ${events.length} events, ${sink.duplicates()} duplicates, ${givenBack} deliveries given back unstarted`);
    for (const e of events) assert.ok(st.ok.has(e.id), `never acknowledged: ${e.id}`);
    assert.deepEqual(st.seqViolations.slice(0, 10), [], 'one delivery of the key at a time, in order');
    assert.ok(givenBack > 0, 'a key run reached the end of its lease, and its next delivery was given back');
    await fp('off', {});
    assert.deepEqual([(await a.stop()).code, (await b.stop()).code], [0, 0]);
  });
