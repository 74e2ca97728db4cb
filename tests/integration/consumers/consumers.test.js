'use strict';
// Pull consumers with the Node.js driver: relaybusClaim hands out deliveries of kind = pull
// handlers with every field docs/consumers.md lists; relaybusComplete, relaybusRetry,
// relaybusBury, relaybusExtend and relaybusRelease settle them as the store's calls do;
// relaybusStatus {handler} reports the handler while relaybusStatus: 1 keeps its old answer;
// every bad input is refused with an error that names the field and changes nothing; the long
// poll answers within 50 ms of a commit through the same proxy; and a consumer's connection that
// closes with claims gives them back at once with one attempt charged.
//
// Each consumer is a MongoClient with maxPoolSize 1: a lease is settled on the connection that
// claimed it.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const C = require('./lib');

const { H, P } = C;
let s;
let adminPort;
const consumers = [];

async function consumer() {
  const c = new MongoClient(s.proxy.uri(), { maxPoolSize: 1, serverSelectionTimeoutMS: 10000 });
  await c.connect();
  consumers.push(c);
  return c;
}

test.before(async () => {
  adminPort = await H.freePort();
  s = await C.startConsumers({ extraIni: `\n[admin]\nlisten = 127.0.0.1:${adminPort}\n` });
});

/** The sample of a per-handler metric of /metrics (handler `users` unless told). */
async function metric(name, handler = 'users') {
  const text = await (await fetch(`http://127.0.0.1:${adminPort}/metrics`)).text();
  const m = text.match(new RegExp(`^${name}\\{handler="${handler}"\\} (\\d+)$`, 'm'));
  assert.ok(m, `/metrics has ${name}{handler="${handler}"}`);
  return Number(m[1]);
}

test('relaybusClaim hands out deliveries with their event; relaybusComplete completes them', async () => {
  const a = await consumer();
  const id1 = C.newId('cc');
  const id2 = C.newId('cc');
  await C.publish(s.client, [
    { type: 'order.placed.v1', id: id1, key: `k-${id1}`, payload: { n: 1, big: 'x'.repeat(100) }, headers: { tenant: 't1' }, correlationId: 'corr-1', causationId: 'cause-1' },
    { type: 'order.paid.v1', id: id2, payload: [1, 2, 3] },
  ]);
  const got = await C.claimN(a, 'orders', 2, { leaseMs: 30000, consumer: 'node-1' });
  const byId = Object.fromEntries(got.map((d) => [d.eventId, d]));
  const d1 = byId[id1];
  const d2 = byId[id2];
  assert.ok(d1 && d2, 'both events claimed');
  const stored1 = await C.deliveryOf(s, id1, 'orders');
  assert.equal(d1.deliveryId, stored1._id.toHexString());
  assert.match(d1.lease, /^\d+:\d+:\d+:[0-9a-f]{24}$/);
  assert.equal(d1.lease.split(':')[0], String(P.laneId(`k-${id1}`, id1)), 'the lease names the lane of the key');
  assert.equal(d1.type, 'order.placed.v1');
  assert.equal(d1.key, `k-${id1}`);
  assert.equal(Number(d1.sequence), 1);
  assert.deepEqual(d1.payload, { n: 1, big: 'x'.repeat(100) });
  assert.deepEqual(d1.headers, { tenant: 't1' });
  assert.equal(d1.correlationId, 'corr-1');
  assert.equal(d1.causationId, 'cause-1');
  assert.equal(d1.attempt, 1);
  assert.ok(d1.createdAt instanceof Date);
  assert.equal(d2.key, null);
  assert.equal(d2.sequence, null);
  assert.deepEqual(d2.payload, [1, 2, 3]);
  assert.deepEqual(d2.headers, {});
  assert.equal(d2.correlationId, null);

  const r = await C.cmd(a, { relaybusComplete: 'orders', leases: [d1.lease, d2.lease] });
  assert.equal(r.ok, 1);
  assert.deepEqual([...r.completed].sort(), [d1.lease, d2.lease].sort());
  assert.deepEqual(r.notCompleted, []);
  assert.equal(await C.deliveryOf(s, id1, 'orders'), null, 'completed: the delivery is gone');
  assert.equal(await C.deliveryOf(s, id2, 'orders'), null);
  assert.ok(await C.deliveryOf(s, id1, 'audit'), "the other handler's delivery stays");
  assert.ok((await C.completedAtOf(s, id1)) instanceof Date, 'the event records its completion');

  // A lease completed once is no longer held: completing it again is refused.
  await P.expectCode(C.cmd(a, { relaybusComplete: 'orders', leases: [d1.lease] }), 9010, /not held by this connection/);
});

test('relaybusRetry: one attempt more, due again after delayMs, with the error', async () => {
  const a = await consumer();
  const id = C.newId('retry');
  await C.publish(s.client, [{ type: 'user.created.v1', id }]);
  const [d] = await C.claimN(a, 'users', 1);
  const r = await C.cmd(a, { relaybusRetry: 'users', lease: d.lease, delayMs: 600, error: 'boom' });
  assert.equal(r.ok, 1);
  assert.equal(r.applied, true);
  assert.equal(r.status, 'pending');
  assert.ok(r.dueAt instanceof Date);
  const stored = await C.deliveryOf(s, id, 'users');
  assert.equal(stored.attempts, 1);
  assert.equal(stored.lastError, 'boom');
  assert.equal(stored.status, 'pending');
  const early = await C.cmd(a, { relaybusClaim: 'users', limit: 10 });
  assert.equal(early.deliveries.filter((x) => x.eventId === id).length, 0, 'not due before delayMs');
  await H.sleep(700);
  const [again] = await C.claimN(a, 'users', 1);
  assert.equal(again.eventId, id);
  assert.equal(again.attempt, 2);
  assert.notEqual(again.lease, d.lease, 'a new claim has a new lease');
  // The old lease is over.
  await P.expectCode(C.cmd(a, { relaybusComplete: 'users', leases: [d.lease] }), 9010);
  const done = await C.cmd(a, { relaybusComplete: 'users', leases: [again.lease] });
  assert.deepEqual(done.completed, [again.lease]);
});

test('relaybusBury: the delivery is dead with the error', async () => {
  const a = await consumer();
  const id = C.newId('bury');
  await C.publish(s.client, [{ type: 'user.deleted.v1', id }]);
  const [d] = await C.claimN(a, 'users', 1);
  const r = await C.cmd(a, { relaybusBury: 'users', lease: d.lease, error: 'poison: cannot parse' });
  assert.equal(r.ok, 1);
  assert.equal(r.applied, true);
  assert.equal(r.status, 'dead');
  const stored = await C.deliveryOf(s, id, 'users');
  assert.equal(stored.status, 'dead');
  assert.equal(stored.lastError, 'poison: cannot parse');
  assert.equal(stored.attempts, 1);
});

test('relaybusExtend: the lease outlives leaseMs; relaybusRelease gives a delivery back with no attempt charged', async () => {
  const a = await consumer();
  const id = C.newId('ext');
  await C.publish(s.client, [{ type: 'user.renamed.v1', id, key: `k-${id}` }]);
  const [d] = await C.claimN(a, 'users', 1, { leaseMs: 1000 });
  const lane = Number(d.lease.split(':')[0]);
  const r = await C.cmd(a, { relaybusExtend: 'users', leases: [d.lease], leaseMs: 8000 });
  assert.equal(r.ok, 1);
  assert.deepEqual(r.extended, [d.lease]);
  assert.deepEqual(r.notExtended, []);
  // A pull handler's lane n is lane n of the handler's own lane space.
  const laneDoc = await s.outbox.db.collection(`${P.PREFIX}lanes`).findOne({ _id: H.laneDocId('users', lane) });
  assert.ok(laneDoc.leaseExpiresAt.getTime() >= Date.now() + 6000, 'the lane lease was extended');
  // Past the original leaseMs the claim still holds: nothing else gets the delivery.
  await H.sleep(1300);
  const b = await consumer();
  const other = await C.cmd(b, { relaybusClaim: 'users', limit: 10 });
  assert.equal(other.deliveries.filter((x) => x.eventId === id).length, 0, 'still claimed after the first leaseMs');

  const rel = await C.cmd(a, { relaybusRelease: 'users', leases: [d.lease] });
  assert.equal(rel.ok, 1);
  assert.deepEqual(rel.released, [d.lease]);
  const stored = await C.deliveryOf(s, id, 'users');
  assert.equal(stored.attempts, 0, 'release charges no attempt');
  const [again] = await C.claimN(b, 'users', 1);
  assert.equal(again.eventId, id);
  assert.equal(again.attempt, 1);
  await C.cmd(b, { relaybusComplete: 'users', leases: [again.lease] });
});

test('relaybusStatus {handler} reports the handler; relaybusStatus: 1 keeps its answer', async () => {
  const a = await consumer();
  const id = C.newId('st');
  await C.publish(s.client, [{ type: 'order.placed.v1', id }]);
  // Drain orders but for one claimed delivery.
  const held = await C.cmd(a, { relaybusClaim: 'orders', limit: 1000 });
  const mine = held.deliveries.find((d) => d.eventId === id);
  assert.ok(mine);
  const st = await C.cmd(a, { relaybusStatus: 'orders' });
  assert.equal(st.ok, 1);
  assert.equal(st.handler, 'orders');
  assert.equal(st.kind, 'pull');
  assert.equal(Number(st.running), held.deliveries.length);
  assert.equal(Number(st.consumers), 1);
  assert.ok(Number(st.lanesHeld) >= 1);
  assert.equal(Number(st.pending), held.deliveries.length, 'pending counts the claimed ones');
  assert.equal(Number(st.due), 0);
  for (const k of ['parked', 'dead', 'waiting']) assert.equal(typeof Number(st[k]), 'number', k);
  assert.ok(st.oldestDueAt instanceof Date);
  const old = await C.cmd(a, { relaybusStatus: 1 });
  assert.equal(old.proxy, 'relaybus-proxy');
  assert.equal(old.handlers, 4);
  assert.equal('handler' in old, false);
  await C.cmd(a, { relaybusComplete: 'orders', leases: held.deliveries.map((d) => d.lease) });
  const after = await C.cmd(a, { relaybusStatus: 'orders' });
  assert.equal(Number(after.running), 0);
});

test('bad input: a clear error naming the field, and nothing changed', async () => {
  const a = await consumer();
  const b = await consumer();
  const id = C.newId('bad');
  await C.publish(s.client, [{ type: 'order.placed.v1', id }]);
  const held = await C.cmd(a, { relaybusClaim: 'audit', limit: 1000 });
  const d = held.deliveries.find((x) => x.eventId === id);
  assert.ok(d);
  const before = await s.outbox.deliveries.find({}).sort({ _id: 1 }).toArray();
  const lanesBefore = await s.outbox.db.collection(`${P.PREFIX}lanes`).find({}).sort({ _id: 1 }).toArray();
  const forged = `${d.lease.split(':').slice(0, 3).join(':')}:${'0'.repeat(24)}`;
  const cases = [
    [{ relaybusClaim: 'nope' }, 2, /handler: no handler named 'nope'/],
    [{ relaybusClaim: 'hooks' }, 2, /'hooks' is kind = webhook; only kind = pull/],
    [{ relaybusClaim: 5 }, 2, /value must be the handler's name/],
    [{ relaybusClaim: 'audit', limit: 0 }, 2, /limit must be an integer from 1 to 1000/],
    [{ relaybusClaim: 'audit', limit: -3 }, 2, /limit must be an integer/],
    [{ relaybusClaim: 'audit', limit: 1.5 }, 2, /limit must be an integer/],
    [{ relaybusClaim: 'audit', limit: '10' }, 2, /limit must be an integer/],
    [{ relaybusClaim: 'audit', limit: 1001 }, 2, /limit must be an integer from 1 to 1000/],
    [{ relaybusClaim: 'audit', leaseMs: 10 }, 2, /leaseMs must be an integer from 1000 to 3600000/],
    [{ relaybusClaim: 'audit', leaseMs: 4000000 }, 2, /leaseMs must be/],
    [{ relaybusClaim: 'audit', maxAwaitTimeMS: 70000 }, 2, /maxAwaitTimeMS must be an integer from 0 to 60000/],
    [{ relaybusClaim: 'audit', consumer: 7 }, 2, /consumer must be a string/],
    [{ relaybusClaim: 'audit', limti: 3 }, 2, /unknown field 'limti'/],
    [{ relaybusComplete: 'audit' }, 2, /leases is required/],
    [{ relaybusComplete: 'audit', leases: d.lease }, 2, /leases must be an array/],
    [{ relaybusComplete: 'audit', leases: [] }, 2, /leases must hold from 1 to 1000/],
    [{ relaybusComplete: 'audit', leases: ['garbage'] }, 2, /leases.0 'garbage' is not a lease/],
    [{ relaybusComplete: 'audit', leases: [d.lease, d.lease] }, 2, /repeats lease/],
    [{ relaybusComplete: 'audit', leases: [d.lease, 'x:1:0:zz'] }, 2, /leases.1/],
    [{ relaybusComplete: 'audit', leases: [d.lease, forged] }, 9010, /not held by this connection/],
    [{ relaybusComplete: 'orders', leases: [d.lease] }, 9010, /for handler 'orders'/],
    [{ relaybusComplete: 'hooks', leases: [d.lease] }, 2, /kind = webhook/],
    [{ relaybusRetry: 'audit', lease: d.lease, delayMs: -1 }, 2, /delayMs must be an integer/],
    [{ relaybusRetry: 'audit', lease: d.lease, error: 5 }, 2, /error must be a string/],
    [{ relaybusRetry: 'audit' }, 2, /lease is required/],
    [{ relaybusBury: 'audit', lease: 42 }, 2, /lease must be a lease string/],
    [{ relaybusExtend: 'audit', leases: [d.lease] }, 2, /leaseMs is required/],
    [{ relaybusExtend: 'audit', leases: [d.lease], leaseMs: 999 }, 2, /leaseMs must be/],
    [{ relaybusRelease: 'audit', leases: [d.lease], extra: 1 }, 2, /unknown field 'extra'/],
    [{ relaybusStatus: 'nope' }, 2, /no handler named 'nope'/],
  ];
  for (const [doc, code, re] of cases) {
    const e = await P.expectCode(C.cmd(a, doc), code, re);
    assert.ok(e.codeName, `${JSON.stringify(doc)}: a codeName`);
  }
  // A lease another connection holds is foreign to this one.
  await P.expectCode(C.cmd(b, { relaybusComplete: 'audit', leases: [d.lease] }), 9010, /not held by this connection/);
  await P.expectCode(C.cmd(b, { relaybusRelease: 'audit', leases: [d.lease] }), 9010);
  // Inside a transaction only relaybusComplete runs (txn.test.js); the others are refused.
  const session = a.startSession();
  try {
    session.startTransaction();
    await P.expectCode(a.db(H.dbName('rbconsumers')).command({ relaybusRelease: 'audit', leases: [d.lease] }, { session }), 263, /inside a transaction/);
    await session.abortTransaction().catch(() => {});
  } finally {
    await session.endSession();
  }

  assert.deepEqual(await s.outbox.deliveries.find({}).sort({ _id: 1 }).toArray(), before, 'no delivery changed');
  assert.deepEqual(await s.outbox.db.collection(`${P.PREFIX}lanes`).find({}).sort({ _id: 1 }).toArray(), lanesBefore, 'no lane changed');
  // The lease still holds after all that.
  const r = await C.cmd(a, { relaybusComplete: 'audit', leases: held.deliveries.map((x) => x.lease) });
  assert.equal(r.completed.length, held.deliveries.length);
});

test('long poll: a claim waits for maxAwaitTimeMS, and a commit through the proxy answers it within 50 ms', async () => {
  const a = await consumer();
  // Nothing due for users now.
  const drained = await C.cmd(a, { relaybusClaim: 'users', limit: 1000 });
  if (drained.deliveries.length) await C.cmd(a, { relaybusRelease: 'users', leases: drained.deliveries.map((d) => d.lease) });
  const b = await consumer();
  const t0 = Date.now();
  const empty = await C.cmd(b, { relaybusClaim: 'users', limit: 5, maxAwaitTimeMS: 400 });
  const waited = Date.now() - t0;
  assert.deepEqual(empty.deliveries, []);
  assert.ok(waited >= 380, `waited ${waited} ms for maxAwaitTimeMS 400`);
  assert.ok(waited < 2000, `answered soon after maxAwaitTimeMS (${waited} ms)`);
  if (drained.deliveries.length) {
    // Give the released ones back to the pool of due work by completing them.
    const again = await C.cmd(a, { relaybusClaim: 'users', limit: 1000 });
    await C.cmd(a, { relaybusComplete: 'users', leases: again.deliveries.map((d) => d.lease) });
  }

  for (let round = 0; round < 3; round++) {
    const id = C.newId('poll');
    let answeredAt = 0;
    const pending = C.cmd(b, { relaybusClaim: 'users', limit: 5, maxAwaitTimeMS: 10000 }).then((r) => {
      answeredAt = Date.now();
      return r;
    });
    await H.sleep(300); // the claim is waiting now
    assert.equal(answeredAt, 0, 'the claim waits');
    await C.publish(s.client, [{ type: 'user.created.v1', id }]);
    const committedAt = Date.now();
    const r = await pending;
    assert.deepEqual(r.deliveries.map((d) => d.eventId), [id]);
    assert.ok(answeredAt - committedAt < 50, `round ${round}: answered ${answeredAt - committedAt} ms after the commit`);
    await C.cmd(b, { relaybusComplete: 'users', leases: r.deliveries.map((d) => d.lease) });
  }
});

test('long polls of several consumers: each commit answers one, the others keep waiting', async () => {
  const waiters = [await consumer(), await consumer()];
  const answers = [];
  const pending = waiters.map((w, i) =>
    C.cmd(w, { relaybusClaim: 'users', limit: 1, maxAwaitTimeMS: 10000 }).then((r) => {
      answers.push({ i, r, at: Date.now() });
      return r;
    }),
  );
  await H.sleep(300);
  const ids = [C.newId('multi'), C.newId('multi')];
  await C.publish(s.client, [{ type: 'user.created.v1', id: ids[0] }]);
  await H.sleep(300);
  assert.equal(answers.length, 1, 'one commit, one delivery: one waiter answered');
  assert.deepEqual(answers[0].r.deliveries.map((d) => d.eventId), [ids[0]]);
  await C.publish(s.client, [{ type: 'user.created.v1', id: ids[1] }]);
  const committedAt = Date.now();
  await Promise.all(pending);
  assert.equal(answers.length, 2);
  assert.notEqual(answers[1].i, answers[0].i);
  assert.deepEqual(answers[1].r.deliveries.map((d) => d.eventId), [ids[1]]);
  assert.ok(answers[1].at - committedAt < 50, `the second waiter answered ${answers[1].at - committedAt} ms after its commit`);
  for (const a of answers) await C.cmd(waiters[a.i], { relaybusComplete: 'users', leases: a.r.deliveries.map((d) => d.lease) });
});

test('a consumer connection closed with claims: its deliveries are runnable again at once, one attempt charged', async () => {
  const a = await consumer();
  const ids = [C.newId('gone'), C.newId('gone')];
  await C.publish(s.client, ids.map((id) => ({ type: 'user.created.v1', id, key: `k-${id}` })));
  const got = await C.claimN(a, 'users', 2, { leaseMs: 600000 });
  assert.deepEqual(got.map((d) => d.eventId).sort(), [...ids].sort());
  // A long poll of the same connection is waiting too when it closes.
  const waiting = C.cmd(a, { relaybusClaim: 'users', limit: 5, maxAwaitTimeMS: 20000 }).catch((e) => e);
  await H.sleep(200);
  await a.close(true);
  await waiting;
  const b = await consumer();
  const t0 = Date.now();
  const again = await C.claimN(b, 'users', 2, {}, 3000);
  assert.ok(Date.now() - t0 < 3000, 'runnable long before the 600 s lease');
  for (const d of again) assert.equal(d.attempt, 2, `${d.eventId}: the closed claim was charged`);
  for (const id of ids) {
    const stored = await C.deliveryOf(s, id, 'users');
    assert.equal(stored.attempts, 1);
    assert.match(stored.lastError, /connection closed/);
  }
  // No other claim was held: the lanes were handed back too, not left to their 600 s lease (a
  // lane's lease never shrinks, so b's 30 s claim alone would have kept it).
  for (const d of got) {
    const lane = await s.outbox.db.collection(`${P.PREFIX}lanes`).findOne({ _id: H.laneDocId('users', Number(d.lease.split(':')[0])) });
    assert.ok(!lane.owner || lane.leaseExpiresAt.getTime() <= Date.now() + 60000, `lane ${lane._id} handed back`);
  }
  await C.cmd(b, { relaybusComplete: 'users', leases: again.map((d) => d.lease) });
});

// Every pull attempt on record (docs/outbox-schema.md, "attempts"): from relaybusClaim to what
// ended it, in order, with the consumer's error, by this proxy's consumer thread.
test('every pull attempt on record: retried, released, lost with its connection, completed', async () => {
  const id = C.newId('rec');
  await C.publish(s.client, [{ type: 'user.created.v1', id, key: `k-${id}` }]);
  const one = async (client, extra = {}) => {
    for (const until = Date.now() + 10000; Date.now() < until; await H.sleep(50)) {
      const r = await C.cmd(client, { relaybusClaim: 'users', limit: 100, ...extra });
      const mine = r.deliveries.find((d) => d.eventId === id);
      const others = r.deliveries.filter((d) => d.eventId !== id).map((d) => d.lease);
      if (others.length) await C.cmd(client, { relaybusRelease: 'users', leases: others });
      if (mine) return mine;
    }
    throw new Error(`the delivery of ${id} was never claimed`);
  };
  const a = await consumer();
  let d = await one(a);
  await H.sleep(20);
  await C.cmd(a, { relaybusRetry: 'users', lease: d.lease, error: 'projection failed: http://u:pw-secret-1@db/x', delayMs: 0 });
  d = await one(a);
  await C.cmd(a, { relaybusRelease: 'users', leases: [d.lease] });
  const b = await consumer();
  d = await one(b);
  await b.close(true);
  const c = await consumer();
  d = await one(c);
  const r = await C.cmd(c, { relaybusComplete: 'users', leases: [d.lease] });
  assert.deepEqual(r.completed, [d.lease]);
  const recs = await s.outbox.db.collection(`${P.PREFIX}attempts`).find({ eventId: id }).sort({ endedAt: 1, _id: 1 }).toArray();
  assert.deepEqual(recs.map((x) => [x.attempt, x.outcome]), [[1, 'failed'], [2, 'released'], [2, 'lease_lost'], [3, 'succeeded']]);
  for (const x of recs) {
    assert.equal(x.handler, 'users');
    assert.equal(x.deliveryId.toHexString(), d.deliveryId);
    assert.ok(x.startedAt instanceof Date && x.endedAt >= x.startedAt, 'from its claim to its end');
    assert.equal(Number(x.durationMs), x.endedAt - x.startedAt);
    assert.match(x.instance, /^[^/]+\/\d+\/[0-9a-f]{12}$/);
  }
  assert.ok(recs[0].durationMs >= 20, 'the retry came 20 ms after the claim');
  assert.equal(recs[0].error, 'projection failed: http://u:********@db/x', 'masked as lastError');
  assert.match(recs[2].error, /connection closed/);
});

test('/metrics counts the claims, completions, charged closes and waiting long polls of each handler', async () => {
  const a = await consumer();
  const claimed = await metric('relaybus_consumer_claimed_total');
  const completed = await metric('relaybus_consumer_completed_total');
  const charged = await metric('relaybus_consumer_closed_charged_total');
  assert.ok(claimed > 0 && completed > 0 && charged >= 2, `after the tests above: ${claimed} ${completed} ${charged}`);
  const id = C.newId('metrics');
  await C.publish(s.client, [{ type: 'user.created.v1', id }]);
  const got = await C.claimN(a, 'users', 1);
  await C.cmd(a, { relaybusComplete: 'users', leases: got.map((d) => d.lease) });
  assert.equal(await metric('relaybus_consumer_claimed_total'), claimed + 1);
  assert.equal(await metric('relaybus_consumer_completed_total'), completed + 1);
  const waiting = C.cmd(a, { relaybusClaim: 'users', maxAwaitTimeMS: 1500 });
  await H.sleep(300);
  assert.equal(await metric('relaybus_consumer_long_polls'), 1);
  await waiting;
  assert.equal(await metric('relaybus_consumer_long_polls'), 0);
});

H.registerFinalChecks(test, [() => s && s.upstream.stop()], {
  beforeStop: async () => {
    for (const c of consumers) await c.close().catch(() => {});
    await s.closeClients();
  },
});
