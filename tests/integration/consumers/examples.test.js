'use strict';
// The consumer examples of docs/consumers.md, run as they stand: the Node.js driver's and
// pymongo's (Debian's python3-pymongo). Each block fenced as `consumer-example` is written to a
// file and run against the proxy with STOP_AFTER set; it must claim and complete exactly the
// deliveries published for `orders`, which are then gone from the outbox, each with its
// projection written once in the transaction that completed it.

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
  for (const m of doc.matchAll(/```(js|python) consumer-example\n([\s\S]*?)```/g)) out[m[1]] = m[2];
  return out;
}

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

/** Publishes n order events, runs the example, and checks it handled exactly those. */
async function runExample(argv, env, tag) {
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
  const stdout = await run(argv, { RELAYBUS_URI: s.proxy.uri(), STOP_AFTER: String(ids.length), ...env });
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
}

test.before(async () => {
  s = await C.startConsumers();
});

test('docs/consumers.md: the Node.js driver example claims and completes', async () => {
  const ex = examples();
  assert.ok(ex.js, 'docs/consumers.md has a js consumer-example');
  const dir = H.tmpDir('relaybus-consumer-ex-');
  const file = path.join(dir, 'consumer.js');
  fs.writeFileSync(file, ex.js);
  await runExample([process.execPath, file], { NODE_PATH: path.join(REPO, 'tests', 'node_modules') }, 'exjs');
  fs.rmSync(dir, { recursive: true, force: true });
});

test('docs/consumers.md: the pymongo example claims and completes', async (t) => {
  if (!havePymongo()) return t.skip('needs /usr/bin/python3 with pymongo (Debian python3-pymongo)');
  const ex = examples();
  assert.ok(ex.python, 'docs/consumers.md has a python consumer-example');
  const dir = H.tmpDir('relaybus-consumer-ex-');
  const file = path.join(dir, 'consumer.py');
  fs.writeFileSync(file, ex.python);
  await runExample([PYTHON, file], {}, 'expy');
  fs.rmSync(dir, { recursive: true, force: true });
});

H.registerFinalChecks(test, [() => s && s.upstream.stop()], { beforeStop: () => s.closeClients() });
