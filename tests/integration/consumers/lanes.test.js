'use strict';
// A pull handler's claims and its lanes (issue 44):
//
// 1. A lane whose charge another client's open transaction holds up is left alone, not the whole
//    claim failed: a consumer is killed after relaybusComplete inside its transaction, and its
//    claim's lease runs out while that transaction lives (the server double keeps it for 60 s).
//    Twenty relaybusClaim commands on the handler, over about 3 s, all answer without an error;
//    the deliveries of other lanes published meanwhile are claimed by the first of them; the held
//    delivery is not handed out. The log says so once for the lane, and mongoc's "Error in
//    abortTransaction" warnings (the owed charge's retries meeting the dead transaction) are not
//    logged more than once a minute.
// 2. A takeover the server applied without its reply (a writeConcernError on the take's
//    findAndModify) is read back from the handler's own lane document: the claim hands the
//    delivery out at once, not one lease (20 s here) later.

const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const readline = require('node:readline');
const { spawn } = require('node:child_process');
const { MongoClient, ObjectId } = require('mongodb');
const C = require('./lib');

const { H, P } = C;
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

/** Event ids (n of them) whose unkeyed deliveries lie in other lanes than `lane`. */
function idsOutsideLane(tag, lane, n) {
  const ids = [];
  while (ids.length < n) {
    const id = C.newId(tag);
    if (P.laneId(undefined, id) !== lane) ids.push(id);
  }
  return ids;
}

test('a lane whose charge an open transaction holds up is left alone: every claim answers, other lanes at once', async (t) => {
  const s = await stack(['--txn-lifetime', '60'], '[handler held]\nevents = held.*\nkind = pull\n');
  const id = C.newId('held');
  const lane = P.laneId(undefined, id);
  await C.publish(s.client, [{ type: 'held.v1', id, payload: { n: 1 } }]);

  // A consumer claims it with a 1.5 s lease, completes it inside its transaction and is killed.
  const child = spawn(process.execPath, [HANG], {
    env: { ...process.env, RELAYBUS_URI: s.proxy.uri(), HANDLER: 'held', LEASE_MS: '1500', CLAIMS: '1' },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  children.add(child);
  child.on('exit', () => children.delete(child));
  const completed = new Promise((resolve, reject) => {
    readline.createInterface({ input: child.stdout }).on('line', (line) => {
      const m = line.match(/^completed (\S+) (\d+)$/);
      if (m) resolve(m[1]);
    });
    child.on('exit', (code) => reject(new Error(`the consumer exited (${code}) before completing`)));
  });
  assert.equal(await H.within(completed, 30000), id, 'claimed and completed inside the transaction');
  const exited = new Promise((resolve) => child.once('exit', resolve));
  child.kill('SIGKILL');
  await exited;
  // Past the claim's lease: the next claim finds it abandoned, and its charge meets the dead
  // transaction (for the rest of its 60 s).
  await H.sleep(2500);

  const others = idsOutsideLane('other', lane, 3);
  await C.publish(s.client, others.map((o) => ({ type: 'held.v1', id: o, payload: { n: 2 } })));
  const c = await consumer(s);
  const errors = [];
  const rounds = [];
  await s.direct.db('admin').command({ doubleStats: 1, reset: 1 });
  const t0 = Date.now();
  for (let i = 0; i < 20; i++) {
    try {
      const r = await C.cmd(c, { relaybusClaim: 'held', limit: 10, leaseMs: 60000 });
      rounds.push(r.deliveries.map((d) => d.eventId));
    } catch (err) {
      errors.push(`${err.codeName || err.code}: ${err.message}`);
      rounds.push([]);
    }
    await H.sleep(100);
  }
  const ms = Date.now() - t0;
  // The owed charge of the killed consumer's claim meets the dead transaction each time it is
  // tried: tried less and less often while nothing lands (250 ms doubling to 8 s), not four
  // times a second with its write-conflict retries (36 transactions a second before).
  const by = (await s.direct.db('admin').command({ doubleStats: 1 })).byApp['relaybus-proxy consumer'] || {};
  const txns = Number(by.commitTransaction || 0) + Number(by.abortTransaction || 0);
  t.diagnostic(`20 claims in ${ms} ms (100 ms apart), ${errors.length} failed; the first took ${rounds[0].length}; ` +
    `the consumer thread ended ${txns} transaction(s) meanwhile`);
  assert.ok(txns <= 30, `${txns} transactions in ${ms} ms against the dead one`);
  assert.deepEqual(errors, [], `20 claims in ${ms} ms, none failed`);
  assert.deepEqual([...rounds[0]].sort(), [...others].sort(), 'the first claim took the deliveries of the other lanes');
  assert.ok(!rounds.flat().includes(id), 'the delivery the dead transaction holds was not handed out');
  const d = await C.deliveryOf(s, id, 'held');
  assert.ok(d, 'the held delivery still exists (its deletion never committed)');
  assert.equal(d.attempts, 0, 'and is charged nothing while the transaction lives');

  const said = s.proxy.logLines(`of lane ${lane}: `).filter((l) => l.includes('open transaction holds a delivery of the lane'));
  assert.equal(said.length, 1, `the log said once that lane ${lane} waits:\n${said.join('\n')}`);
  const aborts = s.proxy.logLines('Error in abortTransaction');
  assert.ok(aborts.length <= 1, `mongoc's abort warnings logged at most once a minute (${aborts.length}):\n${aborts.slice(0, 5).join('\n')}`);
});

test('a takeover applied without its reply is read back from the handler\'s lane document: used at once', async (t) => {
  const s = await stack([], '[handler taken]\nevents = taken.*\nkind = pull\n');
  const c = await consumer(s);
  // The handler's lane space exists once the proxy set it up (first claim).
  await C.cmd(c, { relaybusClaim: 'taken', limit: 1 });
  const id = C.newId('taken');
  const lane = P.laneId(undefined, id);
  const lanes = s.direct.db(s.outbox.db.databaseName).collection('relaybus_lanes');
  const laneDoc = P.H.laneDocId('taken', lane);
  // A dead owner's lane, its lease run out, with a claim in flight: taking it is a findAndModify.
  const r = await lanes.updateOne({ _id: laneDoc }, {
    $set: { owner: 'gone/1/dead', leaseExpiresAt: new Date(Date.now() - 1000), inFlight: [new ObjectId()] },
    $inc: { epoch: 1 },
  });
  assert.equal(r.matchedCount, 1, `lane document ${laneDoc} exists`);
  await C.publish(s.client, [{ type: 'taken.v1', id, payload: { n: 1 } }]);
  await s.direct.db('admin').command({
    configureFailPoint: 'failCommand', mode: { times: 1 },
    data: { failCommands: ['findAndModify'], writeConcernError: { code: 64, errmsg: 'waiting for replication timed out' } },
  });
  let got = [];
  const t0 = Date.now();
  try {
    for (const until = Date.now() + 10000; got.length === 0 && Date.now() < until; await H.sleep(100)) {
      got = (await C.cmd(c, { relaybusClaim: 'taken', limit: 1, leaseMs: 20000 })).deliveries;
    }
  } finally {
    await s.direct.db('admin').command({ configureFailPoint: 'failCommand', mode: 'off' });
  }
  const ms = Date.now() - t0;
  t.diagnostic(`handed out after ${ms} ms (lease 20000 ms)`);
  assert.equal(got.length, 1, `the delivery was handed out within 10 s, well inside the 20 s lease (${ms} ms)`);
  assert.equal(got[0].eventId, id);
  assert.ok(s.proxy.logLines('reading it back').length >= 1, 'the take failed and was read back');
  const doc = await lanes.findOne({ _id: laneDoc });
  assert.notEqual(doc.owner, 'gone/1/dead', 'the lane was taken over');
  await C.cmd(c, { relaybusComplete: 'taken', leases: [got[0].lease] });
});

H.registerFinalChecks(test, [() => Promise.all(stacks.map((s) => s.upstream.stop()))], {
  beforeStop: async () => {
    for (const child of children) child.kill('SIGKILL');
    for (const c of clients) await c.close().catch(() => {});
    for (const s of stacks) await s.closeClients();
  },
});
