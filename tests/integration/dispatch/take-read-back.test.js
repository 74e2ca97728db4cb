'use strict';
// A dispatcher's take of a lane that the server applied without its reply (a writeConcernError on
// the take's findAndModify, the take of a lane whose dead owner listed a claim in flight) is read
// back from the handler's own lane document, and the lane is used at once: the delivery goes out
// well before lease_ms (20 s here), not one lease later (issue 44; on the code before the fix the
// read-back looked at the lane of that number in the dispatch space, found nothing, and the
// proxy owned the lane without knowing it until its lease ran out).

const test = require('node:test');
const assert = require('node:assert/strict');
const { ObjectId } = require('mongodb');
const { uniqueDbName, sleep } = require('../lib/proxy');
const { startSink } = require('./sink');
const { upstreamWithFailPoints, startDispatchProxy, publish, laneId, laneDocId, waitFor } = require('./helpers');

const LEASE_MS = 20000;

test('a take applied without its reply is read back from the handler\'s lane: the delivery goes out at once', { timeout: 90000 }, async (t) => {
  const fx = await upstreamWithFailPoints(t);
  if (!fx) return;
  const { up, admin, fp } = fx;
  const sink = await startSink();
  t.after(() => sink.close());
  const db = uniqueDbName('dispatch_take_read_back');
  const p = await startDispatchProxy({
    upstream: up.uri,
    outbox: { database: db },
    dispatch: { poll_interval_ms: 200, lease_ms: LEASE_MS },
    handlers: [{ name: 'rb', events: '*', kind: 'webhook', url: sink.url('/rb') }],
  });
  t.after(() => p.kill());

  // The handler's lane space, once the dispatcher set it up.
  const lanes = admin.db(db).collection('relaybus_lanes');
  const id = 'rb-1';
  const laneDoc = laneDocId('rb', laneId(undefined, id));
  await waitFor(async () => !!(await lanes.findOne({ _id: laneDoc })), 20000, `lane document ${laneDoc}`);
  // A dead owner's lane, its lease run out, a claim in flight: its take is the findAndModify.
  const r = await lanes.updateOne({ _id: laneDoc }, {
    $set: { owner: 'gone/1/dead', leaseExpiresAt: new Date(Date.now() - 1000), inFlight: [new ObjectId()] },
    $inc: { epoch: 1 },
  });
  assert.equal(r.matchedCount, 1);
  await fp({ times: 1 }, {
    failCommands: ['findAndModify'],
    appName: 'relaybus-proxy dispatch',
    writeConcernError: { code: 64, errmsg: 'waiting for replication timed out' },
  });
  t.after(() => fp('off', {}).catch(() => {}));

  const t0 = Date.now();
  await publish(admin, db, [{ id, type: 'rb.v1', payload: {} }], ['rb']);
  const sent = await waitFor(async () => sink.stats().ok.has(id), 12000, 'the delivery at the sink').then(() => true, () => false);
  const ms = Date.now() - t0;
  t.diagnostic(`the delivery reached the sink ${sent ? `after ${ms} ms` : 'not within 12 s'} (lease_ms ${LEASE_MS})`);
  assert.ok(sent, `the delivery went out within 12 s of its commit, well before lease_ms (${LEASE_MS} ms)`);
  const doc = await lanes.findOne({ _id: laneDoc });
  assert.notEqual(doc.owner, 'gone/1/dead', 'the lane was taken over');
  assert.match(p.log(), /taking lane \d+: .*reading it back/, 'the take failed and was read back');
  await sleep(200);
  assert.equal((await p.stop()).code, 0);
});
