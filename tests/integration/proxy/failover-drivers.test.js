'use strict';
// Step-downs under Mongoose and mongo-c-driver applications writing and reading through the
// proxy, with the drivers' defaults (retryable writes and reads on). The primary is stepped down
// by a direct admin client while the application runs. What holds, and is asserted: NO error
// reaches the application, the application keeps making progress after the election, and every
// acknowledged insert is stored exactly once. The proxy relays the old primary's state-change
// error, which the driver retries; the connection it came on is not closed but paired again
// once everything in flight is answered, and no connection pairs with a member until its own
// hello says it is writable, so the retry (and every later request) waits for the election and
// reaches the new primary.
//
// A connection that authenticated (a real upstream's URI with credentials) cannot be paired again (the
// new upstream connection would not be logged in): the proxy closes it after the error instead,
// and an operation in flight at the step-down can then fail. With credentials the test holds
// what holds then: every operation begun 2 s after the step-down (libmongoc's single-threaded
// client: after its 5 s cooldown) succeeds, and whatever error does reach the application
// carries the server's own state-change code or is the connection the proxy closed.

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
const REAL = H.realUpstreamUri();
const AUTHENTICATED = !!(REAL && new URL(REAL.replace(/^mongodb(\+srv)?:/, 'http:')).username);

/** A fresh upstream and proxy for one test: each test steps a primary down once. */
async function startPair(t, upstreamOpts = {}) {
  const upstream = await H.startUpstream(upstreamOpts);
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
  if (!AUTHENTICATED)
    assert.deepEqual(errs.map((o) => `${o.op} +${o.at - stepAt} ms ${o.code} ${o.error}`), [], 'no error reached the application');
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

// The two ways a connection the error came on goes on, from the proxy's log: paired again
// (unauthenticated: the driver sees no close), or closed once answered (authenticated).
const PAIRED_AGAIN = /answered not primary: pairing this connection again/;
const CLOSED_AFTER = /answered after a not-primary error from/;

test('the connection a not-primary error came on is paired again, not closed', { timeout: 60000 }, async (t) => {
  if (AUTHENTICATED) return t.skip('the upstream URI has credentials: every connection authenticates and is closed instead (next test)');
  const { proxy, direct } = await startPair(t);
  const client = await new MongoClient(proxy.uri({ appName: 'rbit-fo-repair' }), { maxPoolSize: 1 }).connect();
  t.after(() => client.close());
  const coll = client.db(H.uniqueDbName('fo_repair')).collection('items');
  let closed = 0;
  client.on('connectionClosed', () => closed++);
  await coll.insertOne({ _id: 'before' });
  const { before } = await stepDown(direct);
  for (let i = 0; i < 20; i++) await coll.insertOne({ _id: i });
  assert.notEqual(await primaryOf(direct), before, 'the primary changed');
  await proxy.waitForLog(PAIRED_AGAIN, { timeoutMs: 5000 });
  assert.doesNotMatch(proxy.log(), CLOSED_AFTER);
  assert.equal(closed, 0, 'the driver saw none of its connections closed');
  assert.equal(await coll.countDocuments({}), 21);
});

test('an authenticated connection is closed after a not-primary error, not paired again (it would lose its login)', { timeout: 60000 }, async (t) => {
  if (REAL && !AUTHENTICATED) return t.skip('the upstream URI has no credentials: no connection authenticates');
  const { proxy, direct } = await startPair(t, { auth: 'app:pw-failover' });
  const uri = REAL ? proxy.uri({ appName: 'rbit-fo-auth' }) : `mongodb://app:pw-failover@127.0.0.1:${proxy.port}/?authSource=admin&appName=rbit-fo-auth`;
  const client = await new MongoClient(uri, { maxPoolSize: 1 }).connect();
  t.after(() => client.close());
  const coll = client.db(H.uniqueDbName('fo_auth')).collection('items');
  await coll.insertOne({ _id: 'before' });
  const { before, at } = await stepDown(direct);
  let n = 0;
  while (Date.now() < at + SETTLE_MS + 1000) {
    try { await coll.insertOne({ _id: n }); n++; } catch (e) { assert.ok(STATE_CHANGE_CODES.has(e.code) || isNetworkError(e), `${e.code} ${e.message}`); }
    await H.sleep(20);
  }
  for (let i = 0; i < 5; i++) await coll.insertOne({ _id: `late${i}` }); // logged in again on a new connection
  assert.notEqual(await primaryOf(direct), before, 'the primary changed');
  await proxy.waitForLog(CLOSED_AFTER, { timeoutMs: 5000 });
  assert.doesNotMatch(proxy.log(), PAIRED_AGAIN);
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

// A single-threaded client checks the server on the connection it uses. When the proxy closes
// that connection (an authenticated one, after the not-primary error), its check meets the
// closed connection and libmongoc then refuses to check that server again for its 5 s cooldown
// ("No servers yet eligible for rescan", 13053, a client error): then what holds is the recovery
// after the cooldown. A connection paired again is never closed, so without credentials no
// error at all reaches this client either.
const LIBMONGOC_COOLDOWN_MS = 5000;
test('mongo-c-driver, a single-threaded mongoc_client_t: inserts and finds in a loop across a step-down', { timeout: 120000 }, async (t) => {
  await runCdriver(t, 'single', AUTHENTICATED ? LIBMONGOC_COOLDOWN_MS + SETTLE_MS : SETTLE_MS, AUTHENTICATED ? ['client 13053'] : []);
});
