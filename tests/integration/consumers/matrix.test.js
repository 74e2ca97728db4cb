'use strict';
// Every pull consumer command with the Node.js driver, pymongo (Debian's python3-pymongo) and
// mongo-c-driver, each held to the same expectations (those of consumers.test.js and
// txn.test.js): claim (every field, with its BSON type), relaybusStatus {handler}, every bad input
// (its code, codeName and an errmsg naming the field; a foreign lease; a command other than
// relaybusComplete inside a transaction) with nothing changed in the outbox, complete outside and
// inside the consumer's transaction, retry with delayMs (not due before it, due after it, one
// attempt charged), bury (dead, with the error), extend (the lane's lease too), release (no
// attempt charged), and the long poll: empty after maxAwaitTimeMS, and answered within 50 ms of a
// commit through the proxy.
//
// matrix.js, matrix.py and matrix.c run the same cases in that order against the proxy, each
// printing one JSON line per case; this test publishes their events (the long poll's while the
// program waits), then checks every line against one set of expectations and the outbox directly.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { spawn, execFileSync } = require('node:child_process');
const C = require('./lib');

const { H, P } = C;
const PYTHON = '/usr/bin/python3';
const HANDLER = 'users';
const APP_DB = 'rbmatrixapp';
let s;
let adminPort;

// The bad inputs every driver sends while it holds the lease $LEASE for `users`; $FORGED is that
// lease with a delivery id no one was handed. [command, code, codeName, errmsg].
const BAD = [
  [{ relaybusClaim: 'nope' }, 2, 'BadValue', /handler: no handler named 'nope'/],
  [{ relaybusClaim: 'hooks' }, 2, 'BadValue', /'hooks' is kind = webhook; only kind = pull/],
  [{ relaybusClaim: 5 }, 2, 'BadValue', /value must be the handler's name/],
  [{ relaybusClaim: HANDLER, limit: 0 }, 2, 'BadValue', /limit must be an integer from 1 to 1000/],
  [{ relaybusClaim: HANDLER, limit: -3 }, 2, 'BadValue', /limit must be an integer/],
  [{ relaybusClaim: HANDLER, limit: 1.5 }, 2, 'BadValue', /limit must be an integer/],
  [{ relaybusClaim: HANDLER, limit: '10' }, 2, 'BadValue', /limit must be an integer/],
  [{ relaybusClaim: HANDLER, limit: 1001 }, 2, 'BadValue', /limit must be an integer from 1 to 1000/],
  [{ relaybusClaim: HANDLER, leaseMs: 10 }, 2, 'BadValue', /leaseMs must be an integer from 1000 to 3600000/],
  [{ relaybusClaim: HANDLER, leaseMs: 4000000 }, 2, 'BadValue', /leaseMs must be/],
  [{ relaybusClaim: HANDLER, maxAwaitTimeMS: 70000 }, 2, 'BadValue', /maxAwaitTimeMS must be an integer from 0 to 60000/],
  [{ relaybusClaim: HANDLER, consumer: 7 }, 2, 'BadValue', /consumer must be a string/],
  [{ relaybusClaim: HANDLER, limti: 3 }, 2, 'BadValue', /unknown field 'limti'/],
  [{ relaybusComplete: HANDLER }, 2, 'BadValue', /leases is required/],
  [{ relaybusComplete: HANDLER, leases: '$LEASE' }, 2, 'BadValue', /leases must be an array/],
  [{ relaybusComplete: HANDLER, leases: [] }, 2, 'BadValue', /leases must hold from 1 to 1000/],
  [{ relaybusComplete: HANDLER, leases: ['garbage'] }, 2, 'BadValue', /leases.0 'garbage' is not a lease/],
  [{ relaybusComplete: HANDLER, leases: ['$LEASE', '$LEASE'] }, 2, 'BadValue', /repeats lease/],
  [{ relaybusComplete: HANDLER, leases: ['$LEASE', 'x:1:0:zz'] }, 2, 'BadValue', /leases.1/],
  [{ relaybusComplete: HANDLER, leases: ['$LEASE', '$FORGED'] }, 9010, 'RelaybusLeaseNotHeld', /not held by this connection/],
  [{ relaybusComplete: 'orders', leases: ['$LEASE'] }, 9010, 'RelaybusLeaseNotHeld', /for handler 'orders'/],
  [{ relaybusComplete: 'hooks', leases: ['$LEASE'] }, 2, 'BadValue', /kind = webhook/],
  [{ relaybusRetry: HANDLER, lease: '$LEASE', delayMs: -1 }, 2, 'BadValue', /delayMs must be an integer/],
  [{ relaybusRetry: HANDLER, lease: '$LEASE', error: 5 }, 2, 'BadValue', /error must be a string/],
  [{ relaybusRetry: HANDLER }, 2, 'BadValue', /lease is required/],
  [{ relaybusBury: HANDLER, lease: 42 }, 2, 'BadValue', /lease must be a lease string/],
  [{ relaybusBury: HANDLER, lease: 'garbage' }, 2, 'BadValue', /lease 'garbage' is not a lease/],
  [{ relaybusExtend: HANDLER, leases: ['$LEASE'] }, 2, 'BadValue', /leaseMs is required/],
  [{ relaybusExtend: HANDLER, leases: ['$LEASE'], leaseMs: 999 }, 2, 'BadValue', /leaseMs must be/],
  [{ relaybusRelease: HANDLER, leases: ['$LEASE'], extra: 1 }, 2, 'BadValue', /unknown field 'extra'/],
  [{ relaybusStatus: 'nope' }, 2, 'BadValue', /no handler named 'nope'/],
];

function assertError(e, code, codeName, re, what) {
  assert.ok(e, `${what}: refused`);
  assert.equal(e.code, code, `${what}: code (${e.errmsg})`);
  assert.equal(e.codeName, codeName, `${what}: codeName`);
  assert.match(e.errmsg, re, `${what}: errmsg`);
  assert.ok(!(e.labels || []).includes('TransientTransactionError'), `${what}: no TransientTransactionError label`);
}

/** The sample of a per-handler counter of /metrics. */
async function metric(name) {
  const text = await (await fetch(`http://127.0.0.1:${adminPort}/metrics`)).text();
  const m = text.match(new RegExp(`^${name}\\{handler="${HANDLER}"\\} (\\d+)$`, 'm'));
  assert.ok(m, `/metrics has ${name}{handler="${HANDLER}"}`);
  return Number(m[1]);
}

function havePymongo() {
  if (!fs.existsSync(PYTHON)) return false;
  const r = execFileSync(PYTHON, ['-c', 'import importlib.util,sys; sys.stdout.write(str(importlib.util.find_spec("pymongo") is not None))'], { encoding: 'utf8' });
  return r === 'True';
}

/**
 * Runs a driver's program: publishes its events first and the long poll's event once it waits.
 * Answers {lines: {case: line}, ids, pollId, committedAt}.
 */
async function runDriver(argv, tag) {
  const ids = Object.fromEntries(['claim', 'txn', 'retry', 'bury', 'ext'].map((k) => [k, C.newId(`${tag}-${k}`)]));
  const pollId = C.newId(`${tag}-poll`);
  const claimEvent = {
    type: 'user.created.v1', id: ids.claim, key: `k-${ids.claim}`, payload: { n: 1, s: 'x'.repeat(50) },
    headers: { tenant: 't1' }, correlationId: 'corr-1', causationId: 'cause-1',
  };
  await C.publish(s.client, [claimEvent, ...['txn', 'retry', 'bury', 'ext'].map((k) => ({ type: 'user.updated.v1', id: ids[k], key: `k-${ids[k]}` }))]);
  // laneBase: the lane document of the handler's lane 0 (its lane n is laneBase + n).
  const plan = { handler: HANDLER, ids, outboxDb: P.OUTBOX_DB, prefix: P.PREFIX, appDb: APP_DB, bad: BAD.map((b) => b[0]),
    laneBase: H.laneDocId(HANDLER, 0) };
  const child = spawn(argv[0], [...argv.slice(1), s.proxy.uri(), s.upstream.directUri, JSON.stringify(plan)], { stdio: ['ignore', 'pipe', 'pipe'] });
  const lines = {};
  let stderr = '';
  let buf = '';
  let committedAt = 0;
  let publishing = null;
  child.stderr.on('data', (b) => { stderr += b; });
  child.stdout.on('data', (b) => {
    buf += b;
    for (let i; (i = buf.indexOf('\n')) >= 0; buf = buf.slice(i + 1)) {
      const line = JSON.parse(buf.slice(0, i));
      lines[line.case] = line;
      if (line.case === 'longPollWaiting') {
        publishing = (async () => {
          await H.sleep(300); // the claim is waiting now
          await C.publish(s.client, [{ type: 'user.created.v1', id: pollId }]);
          committedAt = Date.now();
        })();
      }
    }
  });
  const killer = setTimeout(() => child.kill('SIGKILL'), 40000);
  const rc = await new Promise((resolve) => child.on('close', (code, sig) => resolve(sig || code)));
  clearTimeout(killer);
  if (publishing) await publishing;
  assert.equal(rc, 0, `${argv.join(' ')} exited ${rc}:\n${stderr}\ncases: ${Object.keys(lines).join(', ')}`);
  return { lines, ids, pollId, committedAt, claimEvent };
}

/** The expectations, the same for every driver. */
async function checkDriver(run, inTxnBefore) {
  const { lines, ids, claimEvent } = run;
  const want = ['claim', 'status', 'bad', 'completeOutside', 'completeInTransaction', 'retry', 'bury', 'extend', 'release', 'longPollEmpty', 'longPoll'];
  assert.deepEqual(want.filter((c) => !lines[c]), [], 'every case ran');

  const { fields, types, storedId } = lines.claim;
  assert.match(fields.lease, /^\d+:\d+:\d+:[0-9a-f]{24}$/);
  assert.equal(fields.lease.split(':')[0], String(P.laneId(claimEvent.key, claimEvent.id)), 'the lease names the lane of the key');
  assert.equal(fields.deliveryId, storedId);
  assert.equal(fields.eventId, claimEvent.id);
  assert.equal(fields.type, claimEvent.type);
  assert.equal(fields.key, claimEvent.key);
  assert.equal(fields.sequence, 1);
  assert.deepEqual(fields.payload, claimEvent.payload);
  assert.deepEqual(fields.headers, claimEvent.headers);
  assert.equal(fields.correlationId, 'corr-1');
  assert.equal(fields.causationId, 'cause-1');
  assert.equal(fields.attempt, 1);
  assert.deepEqual(types, {
    lease: 'string', deliveryId: 'string', eventId: 'string', type: 'string', key: 'string', sequence: 'int64',
    payload: 'document', headers: 'document', correlationId: 'string', causationId: 'string', attempt: 'int32', createdAt: 'date',
  });

  const st = lines.status;
  assert.equal(st.reply.ok, 1);
  assert.equal(st.reply.handler, HANDLER);
  assert.equal(st.reply.kind, 'pull');
  assert.equal(Number(st.reply.running), st.held);
  assert.equal(st.held, 5);
  assert.equal(Number(st.reply.consumers), 1);
  assert.ok(Number(st.reply.lanesHeld) >= 1);
  assert.equal(Number(st.reply.pending), st.held, 'pending counts the claimed ones');
  assert.equal(Number(st.reply.due), 0);
  assert.equal(st.types.oldestDueAt, 'date');
  for (const k of ['parked', 'dead', 'waiting']) assert.ok(Number.isInteger(Number(st.reply[k])), k);

  const bad = lines.bad;
  assert.equal(bad.results.length, BAD.length);
  BAD.forEach(([doc, code, codeName, re], i) => assertError(bad.results[i], code, codeName, re, JSON.stringify(doc)));
  for (const e of bad.foreign) assertError(e, 9010, 'RelaybusLeaseNotHeld', /not held by this connection/, 'a lease of another connection');
  assertError(bad.inTransaction, 263, 'OperationNotSupportedInTransaction', /inside a transaction/, 'relaybusRelease in a transaction');
  assert.equal(bad.deliveriesUnchanged, true, 'no delivery changed');
  assert.equal(bad.lanesUnchanged, true, 'no lane changed');

  const co = lines.completeOutside;
  assert.deepEqual(co.completed, [co.lease], 'the lease held through every bad input');
  assert.deepEqual(co.notCompleted, []);
  assert.equal(co.stored, null);

  const ct = lines.completeInTransaction;
  assert.deepEqual(ct.completed, [ct.lease]);
  assert.deepEqual(ct.notCompleted, []);
  assertError(ct.again, 9010, 'RelaybusLeaseNotHeld', /not held/, 'completing again after the commit');
  assert.equal(ct.stored, null);
  const proj = await s.direct.db(APP_DB).collection('projections').findOne({ _id: ids.txn });
  assert.equal(proj && proj.n, 1, 'the projection committed with the completion');
  for (const until = Date.now() + 5000; Date.now() < until; await H.sleep(50))
    if ((await metric('relaybus_consumer_completed_in_transaction_total')) >= inTxnBefore + 1) break;
  assert.equal(await metric('relaybus_consumer_completed_in_transaction_total'), inTxnBefore + 1, 'completed in the transaction');

  const re = lines.retry;
  assert.equal(re.applied, true);
  assert.equal(re.status, 'pending');
  assert.equal(re.dueAtType, 'date');
  assert.deepEqual(re.stored, { status: 'pending', attempts: 1, lastError: 'boom' });
  assert.equal(re.earlyHadIt, false, 'not due before delayMs');
  assert.ok(re.dueAfterMs >= 700, `claimed again ${re.dueAfterMs} ms after a retry with delayMs 800`);
  assert.equal(re.attempt, 2);
  assert.equal(re.newLease, true, 'a new claim has a new lease');
  assertError(re.oldLease, 9010, 'RelaybusLeaseNotHeld', /not held/, 'the retried lease');
  assert.equal(re.completed, true);
  assert.equal(await C.deliveryOf(s, ids.retry, HANDLER), null);

  const bu = lines.bury;
  assert.equal(bu.applied, true);
  assert.equal(bu.status, 'dead');
  assert.deepEqual(bu.stored, { status: 'dead', attempts: 1, lastError: 'poison: cannot parse' });

  const ex = lines.extend;
  assert.equal(ex.extended.length, 1);
  assert.deepEqual(ex.notExtended, []);
  assert.equal(ex.leaseExpiresAtType, 'date');
  assert.ok(ex.laneLeaseLeftMs >= 100000, `the lane's lease was extended (${ex.laneLeaseLeftMs} ms left)`);

  const rl = lines.release;
  assert.deepEqual(rl.released, ex.extended);
  assert.deepEqual(rl.notReleased, []);
  assert.equal(rl.stored.attempts, 0, 'release charges no attempt');
  assert.equal(rl.stored.status, 'pending');
  assert.equal(rl.attempt, 1);
  assert.equal(rl.completed, true);
  assert.equal(await C.deliveryOf(s, ids.ext, HANDLER), null);

  const le = lines.longPollEmpty;
  assert.equal(le.leftover, 0, 'nothing else due for the handler');
  assert.equal(le.deliveries, 0);
  assert.ok(le.waitedMs >= 380 && le.waitedMs < 2000, `waited ${le.waitedMs} ms for maxAwaitTimeMS 400`);
  const lp = lines.longPoll;
  assert.deepEqual(lp.eventIds, [run.pollId]);
  assert.ok(run.committedAt > 0);
  assert.ok(lp.answeredAt - run.committedAt < 50, `answered ${lp.answeredAt - run.committedAt} ms after the commit`);
  assert.equal(await C.deliveryOf(s, run.pollId, HANDLER), null);
}

test.before(async () => {
  adminPort = await H.freePort();
  s = await C.startConsumers({ extraIni: `\n[admin]\nlisten = 127.0.0.1:${adminPort}\n` });
  await s.direct.db(APP_DB).createCollection('projections').catch(() => {});
});

test('Node.js driver: every consumer command, every bad input, the long poll', async () => {
  const before = await metric('relaybus_consumer_completed_in_transaction_total');
  const run = await runDriver([process.execPath, path.join(__dirname, 'matrix.js')], 'mxjs');
  await checkDriver(run, before);
});

test('pymongo: every consumer command, every bad input, the long poll', async (t) => {
  if (!havePymongo()) return t.skip('needs /usr/bin/python3 with pymongo (Debian python3-pymongo)');
  const before = await metric('relaybus_consumer_completed_in_transaction_total');
  const run = await runDriver([PYTHON, path.join(__dirname, 'matrix.py')], 'mxpy');
  await checkDriver(run, before);
});

test('mongo-c-driver: every consumer command, every bad input, the long poll', async () => {
  const dir = H.tmpDir('relaybus-matrix-c-');
  try {
    // libmongoc is the proxy's own build dependency: always there.
    const build = `cc -Wall -Wextra -Werror -o matrix ${JSON.stringify(path.join(__dirname, 'matrix.c'))} $(pkg-config --cflags --libs libmongoc-1.0)`;
    try {
      execFileSync('sh', ['-c', build], { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'] });
    } catch (err) {
      throw new Error(`${build} failed:\n${err.stderr}`);
    }
    const before = await metric('relaybus_consumer_completed_in_transaction_total');
    const run = await runDriver([path.join(dir, 'matrix')], 'mxc');
    await checkDriver(run, before);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

H.registerFinalChecks(test, [() => s && s.upstream.stop()], { beforeStop: () => s.closeClients() });
