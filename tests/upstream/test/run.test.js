'use strict';
// tests/upstream/run leaves nothing behind on a deployment: after a failing file, and after a
// SIGINT in the middle of one (the file's processes stopped with it), its database is dropped
// and listDatabases no longer lists it. A standalone server is refused before anything is
// created, and so is a file outside the selection. The deployment is a server double here; the
// test files are the fixtures of tests/upstream/fixtures/.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawn } = require('node:child_process');
const { MongoClient } = require('mongodb');
const { startDouble } = require('../../integration/lib/double');

const RUN = path.join(__dirname, '..', 'run');
const FIXTURES = path.join(__dirname, '..', 'fixtures');

let double;
let uri;
let tmp;

test.before(async () => {
  double = await startDouble();
  uri = `mongodb://127.0.0.1:${double.port}/?replicaSet=rs0`;
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'relaybus-upstream-run-'));
});

test.after(async () => {
  if (double) await double.stop();
  if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
});

/** Starts the runner; resolves {code, signal, out} at its exit. `onOutput` sees its output as it comes. */
function runner(args, { env = {}, onStart } = {}) {
  const c = spawn(process.execPath, [RUN, ...args], {
    env: {
      ...process.env,
      RELAYBUS_PROXY_BIN: process.env.RELAYBUS_PROXY_BIN || process.execPath,
      RELAYBUS_TEST_LOGS: path.join(tmp, 'logs'),
      // Inherited, as from a developer's shell: the runner must not hand it on.
      MONGODB_URI: 'mongodb://127.0.0.1:1/?replicaSet=never',
      ...env,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  c.stdout.on('data', (d) => { out += d; });
  c.stderr.on('data', (d) => { out += d; });
  if (onStart) onStart(c);
  return new Promise((resolve) => c.on('exit', (code, signal) => resolve({ code, signal, out })));
}

async function runDatabases() {
  const c = await new MongoClient(uri).connect();
  try {
    const r = await c.db('admin').command({ listDatabases: 1, nameOnly: true });
    return r.databases.map((d) => d.name).filter((n) => n.startsWith('relaybus_test_'));
  } finally {
    await c.close();
  }
}

/** Whether `pid` still runs: a zombie (killed, not yet reaped by whoever adopted it) does not. */
function alive(pid) {
  try {
    return !/^\d+ \(.*\) Z/.test(fs.readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return false;
  }
}

test('a file that fails: the run fails, lists the skip with its reason, and drops its database', { timeout: 60000 }, async () => {
  const r = await runner([uri, path.join(FIXTURES, 'fails.js')]);
  assert.equal(r.code, 1, r.out);
  const db = (r.out.match(/^database: (relaybus_test_[0-9a-f]{12}) /m) || [])[1];
  assert.ok(db, r.out);
  assert.match(r.out, /^FAIL tests\/upstream\/fixtures\/fails\.js: 1 passed, 1 failed, 1 skipped/m);
  assert.match(r.out, /^ {2}tests\/upstream\/fixtures\/fails\.js: skips with its reason: the reason the fixture gives$/m);
  assert.ok(r.out.includes(`dropped ${db}: listDatabases no longer lists it`), r.out);
  assert.match(r.out, /^1 passed, 1 failed, 1 skipped$/m);
  assert.deepEqual(await runDatabases(), []);
});

test('--database NAME: refused while it exists (and left alone), used and dropped when it does not', { timeout: 60000 }, async () => {
  const c = await new MongoClient(uri).connect();
  try {
    await c.db('relaybus_test_taken').collection('keep').insertOne({ _id: 'mine' });
    const taken = await runner([uri, '--database', 'relaybus_test_taken', path.join(FIXTURES, 'fails.js')]);
    assert.equal(taken.code, 2, taken.out);
    assert.match(taken.out, /^database: relaybus_test_taken exists already: .*nothing was run or created$/m);
    assert.deepEqual(await c.db('relaybus_test_taken').collection('keep').find().toArray(), [{ _id: 'mine' }]);
    await c.db('relaybus_test_taken').dropDatabase();
    const named = await runner([uri, '--database', 'relaybus_test_named', path.join(FIXTURES, 'fails.js')]);
    assert.equal(named.code, 1, named.out);
    assert.match(named.out, /^database: relaybus_test_named \(created now, dropped at the end\)$/m);
    assert.ok(named.out.includes('dropped relaybus_test_named: listDatabases no longer lists it'), named.out);
    assert.deepEqual(await runDatabases(), []);
  } finally {
    await c.close();
  }
});

test('SIGINT in the middle of a file: the file and its children stopped, the database dropped, the runner dies of SIGINT', { timeout: 60000 }, async () => {
  const state = path.join(tmp, 'hangs.json');
  let child;
  const done = runner([uri, path.join(FIXTURES, 'hangs.js')], { env: { UPSTREAM_FIXTURE_STATE: state }, onStart: (c) => { child = c; } });
  const deadline = Date.now() + 30000;
  while (!fs.existsSync(state)) {
    assert.ok(Date.now() < deadline, 'the fixture started');
    await new Promise((r) => setTimeout(r, 50));
  }
  const pids = JSON.parse(fs.readFileSync(state, 'utf8'));
  assert.equal((await runDatabases()).length, 1, 'the run\'s database exists while the file runs');
  child.kill('SIGINT');
  const r = await done;
  assert.equal(r.signal, 'SIGINT', `the runner re-raises the signal after its clean-up:\n${r.out}`);
  const db = (r.out.match(/^database: (relaybus_test_[0-9a-f]{12}) /m) || [])[1];
  assert.ok(r.out.includes(`SIGINT: stopping the tests and dropping ${db}`), r.out);
  assert.ok(r.out.includes(`dropped ${db}: listDatabases no longer lists it`), r.out);
  assert.equal(alive(pids.pid), false, 'the test file\'s process is gone');
  assert.equal(alive(pids.child), false, 'the process it started is gone');
  assert.deepEqual(await runDatabases(), []);
});

test('a standalone server is refused before anything is created', { timeout: 60000 }, async () => {
  const alone = await startDouble({ standalone: true });
  try {
    const r = await runner([`mongodb://127.0.0.1:${alone.port}/`]);
    assert.equal(r.code, 2, r.out);
    assert.match(r.out, /is a standalone server .*: it has no transactions, and the proxy refuses it .*nothing was run or created/);
    const c = await new MongoClient(`mongodb://127.0.0.1:${alone.port}/`).connect();
    const dbs = (await c.db('admin').command({ listDatabases: 1, nameOnly: true })).databases.map((d) => d.name);
    await c.close();
    assert.deepEqual(dbs.filter((n) => n.startsWith('relaybus_test_')), []);
  } finally {
    await alone.stop();
  }
});

test('a file outside the selection is refused, and a URI with a database', async () => {
  const r = await runner([uri, 'proxy/failover.test.js']);
  assert.equal(r.code, 2);
  assert.match(r.out, /proxy\/failover\.test\.js is not in the safe part \(tests\/upstream\/selection\.js\)/);
  const d = await runner([`mongodb://127.0.0.1:${double.port}/production?replicaSet=rs0`]);
  assert.equal(d.code, 2);
  assert.match(d.out, /give the URI without a database/);
  assert.deepEqual(await runDatabases(), []);
});
