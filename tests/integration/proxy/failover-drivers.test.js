'use strict';
// Step-downs under Mongoose and mongo-c-driver applications writing and reading through the
// proxy, with the drivers' defaults (retryable writes and reads on). The primary is stepped down
// by a direct admin client while the application runs. What holds, and is asserted: every
// operation the application begins 2 s or more after the step-down succeeds (the proxy pairs
// new upstream connections with the new primary and the driver's retry lands there), the
// application keeps making progress after the election, every acknowledged insert is stored
// exactly once, and whatever error does reach the application carries the server's own
// state-change code (the proxy relays the old primary's answer unchanged). How many errors
// reached the application, and when, is printed as a diagnostic: an operation in flight at the
// step-down can still fail, because the driver, seeing one mongos, retries it on a connection
// the proxy still has paired with the old primary, or on that connection once the proxy closed
// it (the proxy closes a connection once it has relayed a not-primary error and answered what
// was in flight, so that the application's next request goes out on a new connection, paired
// with the new primary). A single-threaded mongoc_client_t recovers only after libmongoc's 5 s
// cooldown (below).

const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const { execFileSync, spawn } = require('node:child_process');
const readline = require('node:readline');
const { MongoClient } = require('mongodb');
const mongoose = require('mongoose');
const H = require('../lib/proxy');

// NotWritablePrimary, NotPrimaryNoSecondaryOk, InterruptedDueToReplStateChange,
// PrimarySteppedDown, ShutdownInProgress, NotPrimaryOrSecondary.
const STATE_CHANGE_CODES = new Set([10107, 13435, 11602, 189, 91, 13436]);
const SETTLE_MS = 2000;

/** A fresh upstream and proxy for one test: each test steps a primary down once. */
async function startPair(t) {
  const upstream = await H.startUpstream();
  const proxy = await H.startProxy({ upstream: upstream.uri });
  const direct = await new MongoClient(upstream.directUri).connect();
  t.after(async () => {
    await direct.close();
    await proxy.stop();
    proxy.assertNoSanitizerReports();
    await upstream.stop();
  });
  return { upstream, proxy, direct };
}

/**
 * The driver's error for a connection that ended (Mongoose passes the driver's errors on). A
 * write on a socket the peer has just closed reaches the application as Node's own EPIPE error,
 * not wrapped, and the driver does not retry it.
 */
function isNetworkError(e) {
  return e.name === 'MongoNetworkError' || e.name === 'MongoPoolClearedError' || e.code === 'EPIPE' || e.code === 'ECONNRESET';
}

async function primaryOf(direct) {
  return (await direct.db('admin').command({ hello: 1 })).primary;
}

async function stepDown(direct) {
  const before = await primaryOf(direct);
  const at = Date.now();
  await direct.db('admin').command({ replSetStepDown: 30, secondaryCatchUpPeriodSecs: 10 });
  return { before, at };
}

/** Splits the operations of a run into those begun before and after step-down + SETTLE_MS. */
function judge(t, what, ops, stepAt, settleMs = SETTLE_MS, alsoAllowed = []) {
  const settled = stepAt + settleMs;
  const errs = ops.filter((o) => o.error);
  const late = ops.filter((o) => o.at >= settled);
  const shown = errs.slice(0, 8).map((o) => `${o.op} at +${o.at - stepAt} ms code ${o.code}`);
  if (errs.length > shown.length) shown.push(`... the last at +${errs[errs.length - 1].at - stepAt} ms`);
  t.diagnostic(`${what}: ${ops.length} operations, ${errs.length} error(s) reached the application` +
    (errs.length ? `: ${shown.join('; ')}` : '') +
    `; ${late.length} operations begun ${settleMs} ms or more after the step-down`);
  for (const o of errs) {
    assert.ok(STATE_CHANGE_CODES.has(o.code) || o.network || alsoAllowed.includes(o.code),
      `${o.op} at +${o.at - stepAt} ms: the server's state-change code relayed unchanged, or the connection the proxy closed after it (${o.code} ${o.error})`);
  }
  assert.ok(late.filter((o) => o.op === 'insert').length >= 5, `inserts kept going after the election (${late.length} late operations)`);
  const lateErrs = late.filter((o) => o.error);
  assert.deepEqual(lateErrs.map((o) => `${o.op} +${o.at - stepAt} ms ${o.code} ${o.error}`), [], `no operation begun ${settleMs} ms after the step-down failed`);
}

test('Mongoose: Model.create and findById across a step-down', { timeout: 120000 }, async (t) => {
  const { proxy, direct } = await startPair(t);
  const dbName = H.uniqueDbName('fo_mongoose');
  const conn = await mongoose.createConnection(proxy.uri({ appName: 'rbit-fo-mongoose' }), { dbName, serverSelectionTimeoutMS: 10000 }).asPromise();
  t.after(() => conn.close());
  const Item = conn.model('Item', new mongoose.Schema({ _id: Number, at: Number }, { versionKey: false }), 'items');
  await Item.createCollection();
  const ops = [];
  const acked = new Set();
  let stop = false;
  const app = (async () => {
    for (let i = 0; !stop; i++) {
      let at = Date.now();
      try {
        await Item.create({ _id: i, at });
        acked.add(i);
        ops.push({ op: 'insert', at });
      } catch (e) {
        ops.push({ op: 'insert', at, code: e.code, network: isNetworkError(e), error: e.message });
      }
      at = Date.now();
      try {
        const doc = await Item.findById(i).lean();
        if (acked.has(i)) assert.ok(doc, `findById(${i}) finds the acknowledged document`);
        ops.push({ op: 'find', at });
      } catch (e) {
        if (e instanceof assert.AssertionError) throw e;
        ops.push({ op: 'find', at, code: e.code, network: isNetworkError(e), error: e.message });
      }
      await H.sleep(5);
    }
  })();
  while (acked.size < 50) await H.sleep(20);
  const { before, at } = await stepDown(direct);
  await H.sleep(SETTLE_MS + 1500);
  stop = true;
  await app;
  const after = await primaryOf(direct);
  assert.notEqual(after, before, 'the primary changed');
  judge(t, `Mongoose (primary ${before} -> ${after})`, ops, at);
  const stored = await direct.db(dbName).collection('items').find({}, { projection: { _id: 1 } }).toArray();
  const storedIds = new Set(stored.map((d) => d._id));
  assert.equal(storedIds.size, stored.length);
  for (const i of acked) assert.ok(storedIds.has(i), `acknowledged create ${i} is stored`);
  assert.ok(stored.length <= ops.filter((o) => o.op === 'insert').length, 'no document without its create');
});

async function runCdriver(t, mode, settleMs, alsoAllowed = []) {
  const { proxy, direct } = await startPair(t);
  const src = path.join(H.REPO, 'tests', 'integration', 'cdriver', 'failover-loop.c');
  const bin = path.join(H.tmpDir('relaybus-cdriver-'), 'failover-loop');
  const flags = execFileSync('pkg-config', ['--cflags', '--libs', 'libmongoc-1.0'], { encoding: 'utf8' }).trim().split(/\s+/);
  execFileSync(process.env.CC || 'cc', ['-std=c11', '-D_GNU_SOURCE', '-Wall', '-Wextra', '-Werror', '-O1', '-g', '-o', bin, src, ...flags], { stdio: ['ignore', 'inherit', 'inherit'] });
  const dbName = H.uniqueDbName(`fo_cdriver_${mode}`);
  const RUN_MS = 2000 + settleMs + 4000;
  const child = spawn(bin, [proxy.uri({ appName: 'rbit-fo-cdriver', serverSelectionTimeoutMS: 10000 }), dbName, String(RUN_MS), mode], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (b) => (stderr += b));
  const exited = new Promise((resolve) => child.once('exit', (code) => resolve(code)));
  const started = Date.now();
  const ops = [];
  let done = null;
  const lines = readline.createInterface({ input: child.stdout });
  lines.on('line', (line) => {
    const m = /^(\d+) (ack|ok|err) (insert|find) (\d+)(?: (\w+))?(?: (\d+) (.*))?$/.exec(line);
    if (m) {
      const o = { op: m[3], i: Number(m[4]), at: started + Number(m[1]) };
      if (m[2] === 'err') Object.assign(o, { network: m[5] === 'network', code: m[5] === 'server' ? Number(m[6]) : `${m[5]} ${m[6]}`, error: m[7] });
      if (m[2] === 'ok') o.found = m[5] === '1';
      ops.push(o);
    } else if (/^done /.test(line)) {
      done = line;
    }
  });
  const acks = () => ops.filter((o) => o.op === 'insert' && !o.error).length;
  while (acks() < 50 && child.exitCode === null) await H.sleep(20);
  assert.ok(acks() >= 50, `the C client wrote through the proxy before the step-down; stderr:\n${stderr}`);
  const { before, at } = await stepDown(direct);
  assert.equal(await exited, 0, `failover-loop exit status; stderr:\n${stderr}`);
  await new Promise((resolve) => (lines.closed ? resolve() : lines.once('close', resolve)));
  assert.ok(done, 'the C client finished its loop');
  assert.ok(ops.length && ops[ops.length - 1].at - at >= settleMs + 1000, 'the loop ran well past the step-down');
  const after = await primaryOf(direct);
  assert.notEqual(after, before, 'the primary changed');
  judge(t, `mongo-c-driver, ${mode} (primary ${before} -> ${after}; ${done})`, ops, at, settleMs, alsoAllowed);
  const ackedIds = new Set(ops.filter((o) => o.op === 'insert' && !o.error).map((o) => o.i));
  for (const o of ops) if (o.op === 'find' && !o.error && ackedIds.has(o.i)) assert.ok(o.found, `find ${o.i} found the acknowledged insert`);
  const stored = await direct.db(dbName).collection('items').find({}, { projection: { _id: 1 } }).toArray();
  const storedIds = new Set(stored.map((d) => Number(d._id)));
  for (const i of ackedIds) assert.ok(storedIds.has(i), `acknowledged insert ${i} is stored`);
  assert.ok(stored.length <= ops.filter((o) => o.op === 'insert').length, 'no document without its insert');
}

test('mongo-c-driver, a client from a mongoc_client_pool_t: inserts and finds in a loop across a step-down', { timeout: 120000 }, async (t) => {
  await runCdriver(t, 'pooled', SETTLE_MS);
});

// A single-threaded client checks the server on the connection it uses: after the not-primary
// error its check meets the connection the proxy closed, and libmongoc then refuses to check that
// server again for its 5 s cooldown ("No servers yet eligible for rescan", 13053, a client
// error). What holds is the recovery after the cooldown.
const LIBMONGOC_COOLDOWN_MS = 5000;
test('mongo-c-driver, a single-threaded mongoc_client_t: inserts and finds in a loop across a step-down', { timeout: 120000 }, async (t) => {
  await runCdriver(t, 'single', LIBMONGOC_COOLDOWN_MS + SETTLE_MS, ['client 13053']);
});
