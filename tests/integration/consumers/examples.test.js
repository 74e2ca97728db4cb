'use strict';
// The consumer examples of docs/consumers.md, run as they stand: the Node.js driver's,
// pymongo's (Debian's python3-pymongo), mongo-c-driver's (compiled with the command the page
// gives, plus -Werror) and mongosh's (tests/node_modules/.bin/mongosh, run with the command the
// page gives). Each block fenced as `consumer-example` (`mongosh-consumer-example` for the
// mongosh script) is written to a file and run against the proxy with STOP_AFTER set; it must
// claim and complete exactly the deliveries published for `orders`, which are then gone from the
// outbox, each with its projection written once in the transaction that completed it.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { execFile, execFileSync } = require('node:child_process');
const C = require('./lib');

const { H } = C;
const REPO = path.resolve(__dirname, '..', '..', '..');
const PYTHON = '/usr/bin/python3';
let s;

function examples() {
  const doc = fs.readFileSync(path.join(REPO, 'docs', 'consumers.md'), 'utf8');
  const out = {};
  for (const m of doc.matchAll(/```(js|python|c) (consumer-example|mongosh-consumer-example)\n([\s\S]*?)```/g))
    out[m[2] === 'consumer-example' ? m[1] : 'mongosh'] = m[3];
  return out;
}

/** The one line of a ```sh block of docs/consumers.md that starts with `prefix`. */
function docCommand(prefix) {
  const doc = fs.readFileSync(path.join(REPO, 'docs', 'consumers.md'), 'utf8');
  const lines = [...doc.matchAll(/```sh\n([\s\S]*?)```/g)].flatMap((m) => m[1].split('\n')).filter((l) => l.startsWith(prefix));
  assert.equal(lines.length, 1, `docs/consumers.md gives one command starting with ${prefix}`);
  return lines[0];
}

const MONGOSH = path.join(REPO, 'tests', 'node_modules', '.bin', 'mongosh');

function havePymongo() {
  if (!fs.existsSync(PYTHON)) return false;
  const r = execFileSync(PYTHON, ['-c', 'import importlib.util,sys; sys.stdout.write(str(importlib.util.find_spec("pymongo") is not None))'], { encoding: 'utf8' });
  return r === 'True';
}

function run(argv, env) {
  return new Promise((resolve, reject) => {
    execFile(argv[0], argv.slice(1), { env: { ...process.env, ...env }, timeout: 60000 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`${argv.join(' ')}: ${err.message}\n${stderr}`));
      else resolve(stdout);
    });
  });
}

/** The sample of orders in a per-handler counter of /metrics. */
async function metric(name) {
  const text = await (await fetch(`http://127.0.0.1:${adminPort}/metrics`)).text();
  const m = text.match(new RegExp(`^${name}\\{handler="orders"\\} (\\d+)$`, 'm'));
  assert.ok(m, `/metrics has ${name}{handler="orders"}`);
  return Number(m[1]);
}

/**
 * The next `update` of connections named `appName` fails once with WriteConflict and the
 * TransientTransactionError label, so the example's transaction must run again. False when the
 * server has no fail points (a real server without enableTestCommands).
 */
async function failFirstUpdate(appName) {
  try {
    await s.direct.db('admin').command({
      configureFailPoint: 'failCommand', mode: { times: 1 },
      data: { appName, failCommands: ['update'], errorCode: 112, errorLabels: ['TransientTransactionError'] },
    });
    return true;
  } catch {
    return false;
  }
}

/**
 * Publishes n order events, runs the example, and checks it handled exactly those, each
 * completed inside its transaction (relaybus_consumer_completed_in_transaction_total), the
 * first after one TransientTransactionError retry.
 */
async function runExample(argv, env, tag, t) {
  // Nothing else due for orders: what the example sees is what this test published.
  const a = await new (require('mongodb').MongoClient)(s.proxy.uri(), { maxPoolSize: 1 }).connect();
  try {
    for (;;) {
      const r = await C.cmd(a, { relaybusClaim: 'orders', limit: 1000 });
      if (!r.deliveries.length) break;
      await C.cmd(a, { relaybusComplete: 'orders', leases: r.deliveries.map((d) => d.lease) });
    }
  } finally {
    await a.close();
  }
  const ids = [1, 2, 3, 4, 5].map(() => C.newId(tag));
  await C.publish(s.client, ids.map((id, i) => ({ type: 'order.placed.v1', id, key: `${tag}-${i % 2}` })));
  const inTxn = await metric('relaybus_consumer_completed_in_transaction_total');
  const outside = await metric('relaybus_consumer_completed_total');
  const appName = `rbex-${tag}-${process.pid}`;
  const failing = await failFirstUpdate(appName);
  if (!failing) t.diagnostic('no fail points on this server: the TransientTransactionError retry is not exercised');
  const stdout = await run(argv, { RELAYBUS_URI: s.proxy.uri({ appName }), STOP_AFTER: String(ids.length), ...env });
  if (failing) {
    const r = await s.direct.db('admin').command({ configureFailPoint: 'failCommand', mode: 'off' });
    if (r.count !== undefined) assert.equal(r.count, 1, 'the first transaction met the WriteConflict');
  }
  const seen = stdout.trim().split('\n').map((l) => JSON.parse(l));
  assert.deepEqual(seen.map((x) => x.eventId).sort(), [...ids].sort());
  for (const x of seen) {
    assert.equal(x.type, 'order.placed.v1');
    assert.equal(x.attempt, 1);
  }
  for (const id of ids) assert.equal(await C.deliveryOf(s, id, 'orders'), null, `${id} completed`);
  // Effectively once: each handled event's projection was written once, in the transaction
  // that completed it.
  for (const id of ids) {
    const p = await s.direct.db('shop').collection('order_projections').findOne({ _id: id });
    assert.equal(p && p.n, 1, `${id}: the projection committed with the completion`);
  }
  // The completions ran in the example's transactions, counted at their commits.
  for (const until = Date.now() + 5000; Date.now() < until; await H.sleep(50))
    if ((await metric('relaybus_consumer_completed_in_transaction_total')) >= inTxn + ids.length) break;
  assert.equal(await metric('relaybus_consumer_completed_in_transaction_total'), inTxn + ids.length,
    'every completion ran in a transaction, counted at its commit');
  assert.equal(await metric('relaybus_consumer_completed_total'), outside, 'none completed outside a transaction');
}

let adminPort;
test.before(async () => {
  adminPort = await H.freePort();
  s = await C.startConsumers({ extraIni: `\n[admin]\nlisten = 127.0.0.1:${adminPort}\n` });
});

test('docs/consumers.md: the Node.js driver example claims and completes', async (t) => {
  const ex = examples();
  assert.ok(ex.js, 'docs/consumers.md has a js consumer-example');
  const dir = H.tmpDir('relaybus-consumer-ex-');
  const file = path.join(dir, 'consumer.js');
  fs.writeFileSync(file, ex.js);
  await runExample([process.execPath, file], { NODE_PATH: path.join(REPO, 'tests', 'node_modules') }, 'exjs', t);
  fs.rmSync(dir, { recursive: true, force: true });
});

test('docs/consumers.md: the pymongo example claims and completes', async (t) => {
  if (!havePymongo()) return t.skip('needs /usr/bin/python3 with pymongo (Debian python3-pymongo)');
  const ex = examples();
  assert.ok(ex.python, 'docs/consumers.md has a python consumer-example');
  const dir = H.tmpDir('relaybus-consumer-ex-');
  const file = path.join(dir, 'consumer.py');
  fs.writeFileSync(file, ex.python);
  await runExample([PYTHON, file], {}, 'expy', t);
  fs.rmSync(dir, { recursive: true, force: true });
});

test('docs/consumers.md: the mongo-c-driver example builds with the command shown, claims and completes', async (t) => {
  const ex = examples();
  assert.ok(ex.c, 'docs/consumers.md has a c consumer-example');
  const dir = H.tmpDir('relaybus-consumer-ex-');
  fs.writeFileSync(path.join(dir, 'consumer.c'), ex.c);
  const build = docCommand('cc ');
  assert.match(build, /pkg-config --cflags --libs libmongoc-1\.0/);
  // libmongoc is the proxy's own build dependency: always there.
  try {
    execFileSync('sh', ['-c', `${build} -Werror`], { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'] });
  } catch (err) {
    throw new Error(`${build} -Werror failed:\n${err.stderr}`);
  }
  await runExample([path.join(dir, 'consumer')], {}, 'exc', t);
  fs.rmSync(dir, { recursive: true, force: true });
});

test('docs/consumers.md: the mongosh example runs with the command shown, claims and completes', async (t) => {
  const ex = examples();
  assert.ok(ex.mongosh, 'docs/consumers.md has a js mongosh-consumer-example');
  assert.ok(fs.existsSync(MONGOSH), 'mongosh is among the test packages (npm ci in tests/)');
  const dir = H.tmpDir('relaybus-consumer-ex-');
  fs.writeFileSync(path.join(dir, 'consumer.mongosh.js'), ex.mongosh);
  const shown = docCommand('mongosh ');
  assert.equal(shown, 'mongosh --nodb --quiet --file consumer.mongosh.js');
  await runExample([MONGOSH, ...shown.split(' ').slice(1).map((a) => (a === 'consumer.mongosh.js' ? path.join(dir, a) : a))],
    { MONGOSH_NO_TELEMETRY: '1', HOME: H.tmpDir('relaybus-mongosh-home-') }, 'exsh', t);
  fs.rmSync(dir, { recursive: true, force: true });
});

H.registerFinalChecks(test, [() => s && s.upstream.stop()], { beforeStop: () => s.closeClients() });
