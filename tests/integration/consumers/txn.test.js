'use strict';
// relaybusComplete inside the consumer's own transaction (docs/consumers.md, "Completing inside
// your transaction"): the completion's writes (the fencing read, the delete of the delivery, the
// attempt's record and, with [outbox] completion_history, the history record) run in the
// consumer's transaction, so the handler's writes and the completion commit together or not at
// all; the event's completedAt follows the commit (the record holds the time until then). A commit makes the proxy forget the claim; an abort leaves it held. A lease that was taken
// over fails the completion with RelaybusLeaseLost (9011) and no TransientTransactionError label,
// so withTransaction gives up instead of retrying, and nothing of the transaction commits.
// pymongo (Debian's python3-pymongo) does the same with `with session.start_transaction()`.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { execFile, execFileSync } = require('node:child_process');
const { MongoClient } = require('mongodb');
const C = require('./lib');

const { H, P } = C;
const PYTHON = '/usr/bin/python3';
const APP_DB = H.dbName('rbtxnapp');
let s;
const consumers = [];

async function consumer() {
  const c = new MongoClient(s.proxy.uri(), { maxPoolSize: 1, serverSelectionTimeoutMS: 10000 });
  await c.connect();
  consumers.push(c);
  return c;
}

function projections(client) {
  return client.db(APP_DB).collection('projections');
}

/** Publishes one keyed order event and claims its delivery for `handler` on `client`. */
async function publishAndClaim(client, handler, tag, extra = {}) {
  const id = C.newId(tag);
  await C.publish(s.client, [{ type: 'order.placed.v1', id, key: `k-${id}`, payload: { n: 1 } }]);
  // Other tests' leftovers of the handler are released untouched; this event's delivery is kept.
  for (const until = Date.now() + 10000; Date.now() < until; ) {
    const r = await C.cmd(client, { relaybusClaim: handler, limit: 1000, ...extra });
    const mine = r.deliveries.find((d) => d.eventId === id);
    const others = r.deliveries.filter((d) => d.eventId !== id).map((d) => d.lease);
    if (others.length) await C.cmd(client, { relaybusRelease: handler, leases: others });
    if (mine) return mine;
    await H.sleep(50);
  }
  throw new Error(`the delivery of ${id} for ${handler} was never claimed`);
}

async function running(client, handler) {
  return (await C.cmd(client, { relaybusStatus: handler })).running;
}

test.before(async () => {
  s = await C.startConsumers({ extraIni: '[outbox]\ncompletion_history = true\n' });
  await s.direct.db(APP_DB).createCollection('projections').catch(() => {});
});

async function closeAll() {
  for (const c of consumers) await c.close().catch(() => {});
  if (s) await s.closeClients();
}

test('committed: the projection, the delivery deleted, completedAt and the history record, together', async () => {
  const a = await consumer();
  const d = await publishAndClaim(a, 'orders', 'txok');
  const runningBefore = await running(a, 'orders');
  assert.ok(runningBefore >= 1, 'the claim is held');
  const session = a.startSession();
  let calls = 0;
  try {
    await session.withTransaction(async () => {
      calls += 1;
      await projections(a).updateOne({ _id: d.eventId }, { $inc: { n: 1 } }, { upsert: true, session });
      const r = await a.db('admin').command({ relaybusComplete: 'orders', leases: [d.lease] }, { session });
      assert.equal(r.ok, 1);
      assert.deepEqual(r.completed, [d.lease]);
      assert.deepEqual(r.notCompleted, []);
      // Not committed yet: nobody outside the transaction sees the completion.
      assert.ok(await C.deliveryOf(s, d.eventId, 'orders'), 'the delivery is still there before the commit');
      assert.equal(await projections(s.direct).findOne({ _id: d.eventId }), null);
    });
  } finally {
    await session.endSession();
  }
  assert.equal(calls, 1);
  assert.deepEqual(await projections(s.direct).findOne({ _id: d.eventId }), { _id: d.eventId, n: 1 });
  assert.equal(await C.deliveryOf(s, d.eventId, 'orders'), null, 'the delivery is deleted');
  assert.ok((await C.completedAtOf(s, d.eventId)) instanceof Date, 'the event records completedAt (after the commit)');
  const hist = await s.outbox.db.collection(`${P.PREFIX}completed_deliveries`).findOne({ _id: new (require('bson').ObjectId)(d.deliveryId) });
  assert.ok(hist, 'the history record is written');
  assert.equal(hist.eventId, d.eventId);
  assert.equal(hist.handler, 'orders');
  assert.equal(hist.eventType, 'order.placed.v1');
  assert.equal(hist.attempts, 1);
  assert.ok(hist.completedAt instanceof Date);
  // The attempt on record, written in the transaction: from the claim to the completion.
  const recs = await s.outbox.db.collection(`${P.PREFIX}attempts`).find({ eventId: d.eventId, handler: 'orders' }).toArray();
  assert.equal(recs.length, 1);
  assert.equal(recs[0].outcome, 'succeeded');
  assert.equal(recs[0].attempt, 1);
  assert.equal(recs[0].deliveryId.toHexString(), d.deliveryId);
  assert.ok(recs[0].startedAt instanceof Date && recs[0].startedAt <= recs[0].endedAt);
  assert.match(recs[0].instance, /^[^/]+\/\d+\/[0-9a-f]{12}$/);
  // The delivery of the other handler of the event is untouched.
  assert.ok(await C.deliveryOf(s, d.eventId, 'audit'), 'audit still has its delivery');
  // The proxy forgot the claim after the commit: it is no longer running, and settling it again
  // is refused as a lease this connection does not hold.
  assert.equal(await running(a, 'orders'), runningBefore - 1, 'the claim is no longer held');
  await P.expectCode(C.cmd(a, { relaybusComplete: 'orders', leases: [d.lease] }), 9010, /not held by this connection/);
});

test('aborted: no projection, the delivery still claimed; it completes later outside the transaction', async () => {
  const a = await consumer();
  const d = await publishAndClaim(a, 'orders', 'txabort');
  const before = await C.deliveryOf(s, d.eventId, 'orders');
  const session = a.startSession();
  try {
    session.startTransaction();
    await projections(a).updateOne({ _id: d.eventId }, { $inc: { n: 1 } }, { upsert: true, session });
    const r = await a.db('admin').command({ relaybusComplete: 'orders', leases: [d.lease] }, { session });
    assert.deepEqual(r.completed, [d.lease]);
    await session.abortTransaction();
  } finally {
    await session.endSession();
  }
  assert.equal(await projections(s.direct).findOne({ _id: d.eventId }), null, 'no projection');
  assert.deepEqual(await C.deliveryOf(s, d.eventId, 'orders'), before, 'the delivery is unchanged');
  assert.equal((await s.outbox.events.findOne({ _id: d.eventId })).completedAt, undefined, 'no completedAt');
  assert.equal(await s.outbox.db.collection(`${P.PREFIX}completed_deliveries`).countDocuments({ eventId: d.eventId }), 0);
  assert.equal(await s.outbox.db.collection(`${P.PREFIX}attempts`).countDocuments({ eventId: d.eventId }), 0, 'no attempt record: it aborted');
  // The claim is still held by this connection: it completes outside a transaction.
  const r = await C.cmd(a, { relaybusComplete: 'orders', leases: [d.lease] });
  assert.deepEqual(r.completed, [d.lease]);
  assert.equal(await C.deliveryOf(s, d.eventId, 'orders'), null);
  assert.deepEqual((await s.outbox.db.collection(`${P.PREFIX}attempts`).find({ eventId: d.eventId }).toArray()).map((x) => x.outcome),
    ['succeeded'], 'one record: the completion that committed');
});

test('a lease taken over: RelaybusLeaseLost without TransientTransactionError, and nothing of the transaction commits', async () => {
  const a = await consumer();
  const b = await consumer();
  const d = await publishAndClaim(a, 'audit', 'txlost', { leaseMs: 1000 });
  const before = await C.deliveryOf(s, d.eventId, 'audit');
  await H.sleep(1300);
  // The lease ran out: another consumer's claim takes the delivery over, with a new claim
  // generation, so the old lease no longer holds.
  const taken = await claimExisting(b, 'audit', d.eventId);
  assert.notEqual(taken.lease, d.lease, 'a new claim, with a lease of its own');
  assert.ok(Number((await C.deliveryOf(s, d.eventId, 'audit')).claims) > Number(before.claims || 0), 'the claim generation moved on');
  const session = a.startSession();
  let calls = 0;
  let err = null;
  try {
    await session.withTransaction(async () => {
      calls += 1;
      await projections(a).updateOne({ _id: d.eventId }, { $inc: { n: 1 } }, { upsert: true, session });
      await a.db('admin').command({ relaybusComplete: 'audit', leases: [d.lease] }, { session });
    });
  } catch (e) {
    err = e;
  } finally {
    await session.endSession();
  }
  assert.ok(err, 'the transaction failed');
  assert.equal(err.code, 9011, err.message);
  assert.equal(err.codeName, 'RelaybusLeaseLost');
  assert.match(err.message, /no longer holds/);
  assert.equal(err.hasErrorLabel('TransientTransactionError'), false, 'no TransientTransactionError label');
  assert.equal(calls, 1, 'withTransaction did not run the callback again');
  assert.equal(await projections(s.direct).findOne({ _id: d.eventId }), null, 'the projection did not commit');
  const del = await C.deliveryOf(s, d.eventId, 'audit');
  assert.ok(del, 'the delivery is still there, held by the new claim');
  const r = await C.cmd(b, { relaybusComplete: 'audit', leases: [taken.lease] });
  assert.deepEqual(r.completed, [taken.lease]);
});

test('a takeover after the transaction began: the server\'s WriteConflict makes withTransaction retry, then RelaybusLeaseLost', async () => {
  const a = await consumer();
  const b = await consumer();
  const d = await publishAndClaim(a, 'audit', 'txconflict', { leaseMs: 1000 });
  const session = a.startSession();
  const errors = [];
  let calls = 0;
  let taken = null;
  let err = null;
  try {
    await session.withTransaction(async () => {
      calls += 1;
      // The transaction's snapshot is taken here, while the lease still holds.
      await projections(a).updateOne({ _id: d.eventId }, { $inc: { n: 1 } }, { upsert: true, session });
      if (calls === 1) {
        await H.sleep(1300);
        taken = await claimExisting(b, 'audit', d.eventId);
      }
      try {
        await a.db('admin').command({ relaybusComplete: 'audit', leases: [d.lease] }, { session });
      } catch (e) {
        errors.push(e);
        throw e;
      }
    });
  } catch (e) {
    err = e;
  } finally {
    await session.endSession();
  }
  assert.ok(taken, 'the delivery was taken over');
  assert.equal(errors.length, 2, 'two attempts failed');
  assert.equal(errors[0].code, 112, `the first attempt: the server's WriteConflict (${errors[0].message})`);
  assert.equal(errors[0].hasErrorLabel('TransientTransactionError'), true);
  assert.equal(calls, 2, 'withTransaction ran the callback again');
  assert.equal(err.code, 9011, 'the second attempt sees the lease lost');
  assert.equal(err.hasErrorLabel('TransientTransactionError'), false);
  assert.equal(await projections(s.direct).findOne({ _id: d.eventId }), null, 'the projection did not commit');
  const r = await C.cmd(b, { relaybusComplete: 'audit', leases: [taken.lease] });
  assert.deepEqual(r.completed, [taken.lease], 'the new claim completes');
});

/** Claims on `client` until the delivery of `eventId` for `handler` is handed out. */
async function claimExisting(client, handler, eventId) {
  for (const until = Date.now() + 10000; Date.now() < until; ) {
    const r = await C.cmd(client, { relaybusClaim: handler, limit: 1000 });
    const mine = r.deliveries.find((x) => x.eventId === eventId);
    const others = r.deliveries.filter((x) => x.eventId !== eventId).map((x) => x.lease);
    if (others.length) await C.cmd(client, { relaybusRelease: handler, leases: others });
    if (mine) return mine;
    await H.sleep(100);
  }
  throw new Error(`the delivery of ${eventId} for ${handler} was never claimed again`);
}

test('the other pull commands stay refused inside a transaction', async () => {
  const a = await consumer();
  const d = await publishAndClaim(a, 'orders', 'txrefuse');
  const session = a.startSession();
  try {
    session.startTransaction();
    await projections(a).updateOne({ _id: d.eventId }, { $inc: { n: 1 } }, { upsert: true, session });
    for (const doc of [
      { relaybusRetry: 'orders', lease: d.lease },
      { relaybusExtend: 'orders', leases: [d.lease], leaseMs: 60000 },
      { relaybusClaim: 'orders' },
    ]) {
      const e = await P.expectCode(a.db('admin').command(doc, { session }), 263, /only relaybusComplete runs in the consumer's transaction/);
      assert.equal(e.hasErrorLabel('TransientTransactionError'), false);
    }
    await session.abortTransaction().catch(() => {});
  } finally {
    await session.endSession();
  }
  assert.deepEqual((await C.cmd(a, { relaybusComplete: 'orders', leases: [d.lease] })).completed, [d.lease]);
});

function havePymongo() {
  if (!fs.existsSync(PYTHON)) return false;
  const r = execFileSync(PYTHON, ['-c', 'import importlib.util,sys; sys.stdout.write(str(importlib.util.find_spec("pymongo") is not None))'], { encoding: 'utf8' });
  return r === 'True';
}

const PY_CONSUMER = `
import json, os, sys
from bson.son import SON
from pymongo import MongoClient

client = MongoClient(os.environ["RELAYBUS_URI"], maxPoolSize=1)
admin = client.admin
event_id = os.environ["EVENT_ID"]
lease = None
for _ in range(200):
    reply = admin.command(SON([("relaybusClaim", "orders"), ("limit", 1000), ("maxAwaitTimeMS", 100)]))
    others = [d["lease"] for d in reply["deliveries"] if d["eventId"] != event_id]
    if others:
        admin.command(SON([("relaybusRelease", "orders"), ("leases", others)]))
    mine = [d for d in reply["deliveries"] if d["eventId"] == event_id]
    if mine:
        lease = mine[0]["lease"]
        break
assert lease, "claimed"
with client.start_session() as session:
    with session.start_transaction():
        client["${APP_DB}"].projections.update_one({"_id": event_id}, {"$inc": {"n": 1}}, upsert=True, session=session)
        reply = admin.command(SON([("relaybusComplete", "orders"), ("leases", [lease])]), session=session)
print(json.dumps({"completed": reply["completed"], "notCompleted": reply["notCompleted"], "lease": lease}))
client.close()
`;

test('pymongo: handler write and relaybusComplete in one start_transaction() commit together', async (t) => {
  if (!havePymongo()) {
    t.skip('no pymongo for /usr/bin/python3');
    return;
  }
  const id = C.newId('txpy');
  await C.publish(s.client, [{ type: 'order.placed.v1', id, key: `k-${id}` }]);
  const dir = H.tmpDir('relaybus-txn-py-');
  const file = path.join(dir, 'consumer.py');
  fs.writeFileSync(file, PY_CONSUMER);
  const stdout = await new Promise((resolve, reject) => {
    execFile(PYTHON, [file], { env: { ...process.env, RELAYBUS_URI: s.proxy.uri(), EVENT_ID: id }, timeout: 60000 }, (err, out, stderr) => {
      if (err) reject(new Error(`${err.message}\n${stderr}`));
      else resolve(out);
    });
  });
  fs.rmSync(dir, { recursive: true, force: true });
  const out = JSON.parse(stdout.trim());
  assert.deepEqual(out.completed, [out.lease]);
  assert.deepEqual(out.notCompleted, []);
  assert.deepEqual(await projections(s.direct).findOne({ _id: id }), { _id: id, n: 1 });
  assert.equal(await C.deliveryOf(s, id, 'orders'), null, 'the delivery is deleted');
  assert.ok((await C.completedAtOf(s, id)) instanceof Date);
});

test('pooled mode: the completion and its attempt record commit in the transaction the pool pinned', {
  // Against a deployment with credentials the pooled proxy's clients would need an auth file of
  // the proxy's own; the double of the suite has none.
  skip: C.H.doubleOnlySkipReason('a pooled proxy whose clients log in without credentials') || false,
}, async () => {
  // The same upstream and outbox, through a proxy that pools its upstream connections: the
  // completion's statements go on the pool's connection that holds the consumer's transaction.
  const pooled = await C.startConsumers({ upstream: s.upstream, settings: { pool_mode: 'pooled', pool_size: 4 } });
  const c = new MongoClient(pooled.proxy.uri(), { maxPoolSize: 1, serverSelectionTimeoutMS: 10000 });
  try {
    await c.connect();
    const id = C.newId('txpool');
    await C.publish(s.client, [{ type: 'order.placed.v1', id, key: `k-${id}` }]);
    let d = null;
    for (const until = Date.now() + 10000; !d && Date.now() < until; await H.sleep(50)) {
      const r = await C.cmd(c, { relaybusClaim: 'orders', limit: 1000 });
      d = r.deliveries.find((x) => x.eventId === id) || null;
      const others = r.deliveries.filter((x) => x.eventId !== id).map((x) => x.lease);
      if (others.length) await C.cmd(c, { relaybusRelease: 'orders', leases: others });
    }
    assert.ok(d, `the delivery of ${id} was claimed through the pooled proxy`);
    const session = c.startSession();
    try {
      await session.withTransaction(async () => {
        await projections(c).updateOne({ _id: id }, { $inc: { n: 1 } }, { upsert: true, session });
        const r = await c.db('admin').command({ relaybusComplete: 'orders', leases: [d.lease] }, { session });
        assert.deepEqual(r.completed, [d.lease]);
        assert.equal(await s.outbox.db.collection(`${P.PREFIX}attempts`).countDocuments({ eventId: id, handler: 'orders' }), 0,
          'the attempt record is not visible before the commit');
      });
    } finally {
      await session.endSession();
    }
    assert.deepEqual(await projections(s.direct).findOne({ _id: id }), { _id: id, n: 1 });
    assert.equal(await C.deliveryOf(s, id, 'orders'), null, 'the delivery is deleted');
    const recs = await s.outbox.db.collection(`${P.PREFIX}attempts`).find({ eventId: id, handler: 'orders' }).toArray();
    assert.deepEqual(recs.map((r) => r.outcome), ['succeeded'], 'one attempt on record, written with the commit');
  } finally {
    await c.close().catch(() => {});
    await pooled.closeClients();
    await pooled.proxy.stop();
  }
});

H.registerFinalChecks(test, [() => s && s.upstream.stop()], { beforeStop: closeAll });
