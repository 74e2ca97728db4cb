'use strict';
// Pull consumers are independent of each other, and every attempt counts once.
//
// 1. A consumer's open transaction holds up nobody else: consumer A completes its delivery of an
//    event inside its own transaction and keeps that transaction open for 5 s. Meanwhile B's
//    relaybusComplete of its delivery of the same event (a second handler) and C's relaybusClaim
//    on a third handler are each answered within 1 s. (The completion time of the event, which A's
//    transaction wrote, is not waited for: it is written later or by A's commit.)
// 2. A consumer killed after relaybusComplete inside its transaction (the completion never
//    commits) is charged the attempt once the server has ended its transaction: with
//    max_attempts = 3, three such kills leave the delivery dead with 3 attempts, each claim
//    reporting the next attempt.
// 3. The killed consumer's other claims are charged at once, not after its dead transaction.
// 4. A proxy stopped while such a charge is owed charges it before it exits.
//
// Each part runs against its own server double: part 1 with the transaction lifetime long enough
// for A's 5 s, part 2 with a short one so that the server reaps each killed consumer's
// transaction within a few seconds (a real mongod does it at transactionLifetimeLimitSeconds).

const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const readline = require('node:readline');
const { spawn } = require('node:child_process');
const { MongoClient } = require('mongodb');
const C = require('./lib');

const { H } = C;
const HANG = path.join(__dirname, 'txn-hang-consumer.js');
const stacks = [];
const clients = [];
const children = new Set();

async function stack(upstreamArgs, extraIni) {
  const s = await C.startConsumers({ requireDouble: true, upstreamArgs, extraIni });
  stacks.push(s);
  return s;
}

async function consumer(s) {
  const c = new MongoClient(s.proxy.uri(), { maxPoolSize: 1, serverSelectionTimeoutMS: 10000 });
  await c.connect();
  clients.push(c);
  return c;
}

/** Claims `eventId`'s delivery of `handler` on `client` (what else it gets is released). */
async function claimOf(client, handler, eventId) {
  for (const until = Date.now() + 10000; Date.now() < until; ) {
    const r = await C.cmd(client, { relaybusClaim: handler, limit: 100, leaseMs: 60000 });
    const mine = r.deliveries.find((d) => d.eventId === eventId);
    const others = r.deliveries.filter((d) => d !== mine).map((d) => d.lease);
    if (others.length) await C.cmd(client, { relaybusRelease: handler, leases: others });
    if (mine) return mine;
    await H.sleep(50);
  }
  throw new Error(`the delivery of ${eventId} for ${handler} was never claimed`);
}

async function timed(promise) {
  const t0 = Date.now();
  const value = await promise;
  return { value, ms: Date.now() - t0 };
}

test('an open consumer transaction holds up neither another handler\'s completion nor a claim', async () => {
  const s = await stack(['--txn-lifetime', '30'], '[handler ledger]\nevents = order.*\nkind = pull\n');
  const [a, b, c] = [await consumer(s), await consumer(s), await consumer(s)];
  const id = C.newId('indep');
  await C.publish(s.client, [{ type: 'order.placed.v1', id, key: `k-${id}`, payload: { n: 1 } }]);
  const da = await claimOf(a, 'orders', id);
  const db = await claimOf(b, 'audit', id);

  const session = a.startSession();
  session.startTransaction();
  const r = await a.db('admin').command({ relaybusComplete: 'orders', leases: [da.lease] }, { session });
  assert.deepEqual(r.completed, [da.lease]);
  // A holds its transaction (its delivery deleted and its event written in it) for 5 s.
  const commitA = (async () => {
    await H.sleep(5000);
    await session.commitTransaction();
  })();
  try {
    const [rb, rc] = await Promise.all([
      timed(C.cmd(b, { relaybusComplete: 'audit', leases: [db.lease] })),
      timed(C.cmd(c, { relaybusClaim: 'ledger', limit: 10 })),
    ]);
    assert.ok(rb.ms < 1000, `B's relaybusComplete was answered in ${rb.ms} ms`);
    assert.ok(rc.ms < 1000, `C's relaybusClaim was answered in ${rc.ms} ms`);
    assert.deepEqual(rb.value.completed, [db.lease], 'B completed its delivery');
    assert.ok(rc.value.deliveries.some((d) => d.eventId === id), 'C claimed its delivery of the event');
  } finally {
    await commitA;
    await session.endSession();
  }
  assert.equal(await C.deliveryOf(s, id, 'orders'), null, 'A\'s completion committed');
  assert.equal(await C.deliveryOf(s, id, 'audit'), null, 'B\'s completion stands');
  assert.ok((await C.completedAtOf(s, id)) instanceof Date, 'the event has its completedAt');
});

test('completions of one event by two handlers, each inside its consumer\'s transaction, do not conflict', async () => {
  // A's transaction completes its delivery and stays open; B's completion of the same event for
  // another handler, inside B's own transaction, must not hit A's writes: a completion writes no
  // event in the consumer's transaction (with attempt_history, the default, the record holds the
  // time and the event's completedAt follows the commit). Before, both wrote $max completedAt on
  // the event and B's answer was a WriteConflict for as long as A's transaction lived.
  const s = await stack(['--txn-lifetime', '60']);
  const [a, b] = [await consumer(s), await consumer(s)];
  const id = C.newId('indep-txn');
  await C.publish(s.client, [{ type: 'order.placed.v1', id, key: `k-${id}`, payload: { n: 1 } }]);
  const da = await claimOf(a, 'orders', id);
  const db = await claimOf(b, 'audit', id);

  const sa = a.startSession();
  const sb = b.startSession();
  try {
    sa.startTransaction();
    const ra = await a.db('admin').command({ relaybusComplete: 'orders', leases: [da.lease] }, { session: sa });
    assert.deepEqual(ra.completed, [da.lease]);
    sb.startTransaction();
    const rb = await timed(b.db('admin').command({ relaybusComplete: 'audit', leases: [db.lease] }, { session: sb }));
    assert.deepEqual(rb.value.completed, [db.lease], 'B completed inside its transaction while A\'s is open');
    assert.ok(rb.ms < 10000, `B's relaybusComplete was answered in ${rb.ms} ms`);
    await sb.commitTransaction();
    assert.equal(await C.deliveryOf(s, id, 'audit'), null, 'B\'s completion committed while A\'s transaction is open');
    assert.ok(await C.deliveryOf(s, id, 'orders'), 'A\'s is not committed yet');
    // B's commit writes the event's time (a second's completions together), A's open transaction
    // notwithstanding.
    assert.ok((await C.completedAtOf(s, id)) instanceof Date, 'the event has its completedAt after B\'s commit');
    await sa.commitTransaction();
  } finally {
    await sa.endSession();
    await sb.endSession();
  }
  assert.equal(await C.deliveryOf(s, id, 'orders'), null, 'A\'s completion committed');
  const recs = await s.outbox.db.collection(`${C.P.PREFIX}attempts`).find({ eventId: id, outcome: 'succeeded' }).toArray();
  assert.deepEqual(recs.map((r) => r.handler).sort(), ['audit', 'orders'], 'each completion\'s attempt is on record');
});

/**
 * Runs one txn-hang-consumer.js holding `claims` claims; resolves with the attempt of the one it
 * completed inside its transaction once that was answered (and, with `claims` > 1, `holding`: the
 * event ids of the others).
 */
function hangingConsumer(s, handler, claims = 1) {
  const child = spawn(process.execPath, [HANG], {
    env: { ...process.env, RELAYBUS_URI: s.proxy.uri(), HANDLER: handler, LEASE_MS: '60000', CLAIMS: String(claims) },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  children.add(child);
  child.on('exit', () => children.delete(child));
  const holding = [];
  const completed = new Promise((resolve, reject) => {
    readline.createInterface({ input: child.stdout }).on('line', (line) => {
      const h = line.match(/^holding (\S+) (\d+)$/);
      if (h) holding.push(h[1]);
      const m = line.match(/^completed (\S+) (\d+)$/);
      if (m) resolve(claims > 1 ? { eventId: m[1], attempt: Number(m[2]), holding } : { eventId: m[1], attempt: Number(m[2]) });
    });
    child.on('exit', (code) => reject(new Error(`the consumer exited (${code}) before completing`)));
  });
  return { child, completed };
}

test('a consumer killed after relaybusComplete inside its transaction is charged each time, to the dead letters', async () => {
  const s = await stack(['--txn-lifetime', '2'], '[handler poison]\nevents = poison.*\nkind = pull\nmax_attempts = 3\n');
  const id = C.newId('poison');
  await C.publish(s.client, [{ type: 'poison.v1', id, payload: { n: 1 } }]);
  for (let attempt = 1; attempt <= 3; attempt++) {
    const { child, completed } = hangingConsumer(s, 'poison');
    const got = await H.within(completed, 30000);
    assert.ok(got, `attempt ${attempt} was claimed and completed inside the transaction`);
    assert.deepEqual(got, { eventId: id, attempt }, `claim ${attempt} reports attempt ${attempt}`);
    const exited = new Promise((resolve) => child.once('exit', resolve));
    child.kill('SIGKILL');
    await exited;
  }
  let d;
  for (const until = Date.now() + 30000; Date.now() < until; await H.sleep(100)) {
    d = await C.deliveryOf(s, id, 'poison');
    if (d && d.status === 'dead') break;
  }
  assert.ok(d, 'the delivery still exists');
  assert.equal(d.status, 'dead', 'the delivery is dead');
  assert.equal(d.attempts, 3, 'with 3 attempts');
});

/** Kills a hanging consumer and waits for its exit. */
async function kill(child) {
  const exited = new Promise((resolve) => child.once('exit', resolve));
  child.kill('SIGKILL');
  await exited;
}

/** Polls the delivery of `eventId` for `handler` until `pred` holds or `ms` passed; returns the last one read. */
async function deliveryUntil(s, eventId, handler, pred, ms) {
  let d;
  for (const until = Date.now() + ms; Date.now() < until; await H.sleep(50)) {
    d = await C.deliveryOf(s, eventId, handler);
    if (pred(d)) break;
  }
  return d;
}

test('a killed consumer\'s other claims are due again at once, not after its dead transaction ends', async () => {
  // The dead transaction lives 30 s: the claim it holds is owed until then, but the killed
  // consumer's other claim, charged in the same close, must not wait for it.
  const s = await stack(['--txn-lifetime', '30'], '[handler slice]\nevents = slice.*\nkind = pull\n');
  const ids = [C.newId('slice'), C.newId('slice')];
  await C.publish(s.client, ids.map((id) => ({ type: 'slice.v1', id, payload: { n: 1 } })));
  const { child, completed } = hangingConsumer(s, 'slice', 2);
  const got = await H.within(completed, 30000);
  assert.ok(got, 'both deliveries were claimed, one completed inside the transaction');
  assert.equal(got.holding.length, 1, 'the consumer holds the other claim');
  const t0 = Date.now();
  await kill(child);
  const other = await deliveryUntil(s, got.holding[0], 'slice', (d) => d && d.attempts === 1, 5000);
  assert.equal(other && other.attempts, 1, `the other claim was charged one attempt (after ${Date.now() - t0} ms)`);
  assert.ok(Date.now() - t0 < 5000, 'within 5 s of the kill');
  assert.equal(other.status, 'pending', 'and is due again');
  const held = await C.deliveryOf(s, got.eventId, 'slice');
  assert.equal(held.attempts, 0, 'the claim the dead transaction holds waits for it (owed)');
});

test('a proxy stopped while a killed consumer\'s charge is owed charges it before it exits', async () => {
  // The dead transaction is reaped 3 to 4 s after it began; the proxy is stopped at once, with the
  // charge owed, and retries it while it stops (for up to 5 s) instead of handing the lane back.
  const s = await stack(['--txn-lifetime', '3'], '[handler owed]\nevents = owed.*\nkind = pull\n');
  const id = C.newId('owed');
  await C.publish(s.client, [{ type: 'owed.v1', id, payload: { n: 1 } }]);
  const { child, completed } = hangingConsumer(s, 'owed');
  const got = await H.within(completed, 30000);
  assert.deepEqual(got, { eventId: id, attempt: 1 }, 'claimed and completed inside the transaction');
  await kill(child);
  const failed = await s.proxy.waitForLog(/closed: charging 1 claims failed \(retried later\)/, { timeoutMs: 5000 });
  assert.ok(failed, 'the charge on the close failed: the dead transaction holds the delivery');
  await s.client.close(); // the direct client stays: it reads the outbox after the stop
  await s.proxy.stop();
  const d = await C.deliveryOf(s, id, 'owed');
  assert.equal(d.attempts, 1, 'the stopped proxy charged the attempt');
  assert.equal(d.status, 'pending', 'the delivery is due again');
  assert.ok(s.proxy.logLines('stopping: owed charges landed').length > 0, 'the stop charged it');
});

H.registerFinalChecks(test, [() => Promise.all(stacks.map((s) => s.upstream.stop()))], {
  beforeStop: async () => {
    for (const child of children) child.kill('SIGKILL');
    for (const c of clients) await c.close().catch(() => {});
    for (const s of stacks) await s.closeClients();
  },
});
