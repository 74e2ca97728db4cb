'use strict';
// Other clients through HAProxy in front of two proxies (mode tcp, round robin):
//   - mongosh with loadBalanced=true: an annotated transaction (its event in the outbox) and a
//     cursor read in batches of 2;
//   - a pull consumer with the Node.js driver, loadBalanced=true and maxPoolSize=1: its claim and
//     its completion, inside its own transaction, on its one connection (docs/consumers.md);
//   - mongo-c-driver (libmongoc 1.23) with loadBalanced=true: tests/integration/cdriver/
//     cdriver-client.c (the balancer seen as a LoadBalancer server, CRUD, a cursor over several
//     getMores, a transaction with mongoc_client_session_with_transaction);
//   - pymongo: Debian 12's 3.11 has no load-balanced mode (its URI options do not list
//     loadBalanced: it warns "Unknown option" and ignores it; the mode came with 3.12), so it connects through the
//     balancer as to one mongos, with maxPoolSize=1: every operation on its one connection,
//     and so on one proxy (docs/deployment.md says so for drivers without the mode).

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { execFile, spawnSync } = require('node:child_process');
const { MongoClient } = require('mongodb');
const H = require('../lib/proxy');
const P = require('../publish/lib');
const { startHaproxy, haproxySkipReason } = require('../lib/haproxy');

const DB = H.uniqueDbName('lbdrivers');
const MONGOSH = path.join(__dirname, '..', '..', 'node_modules', '.bin', 'mongosh');
const skip = haproxySkipReason() || false;
let upstream;
const proxies = [];
let lb;
let direct;

test.before(async () => {
  if (skip) return;
  upstream = await H.startUpstream();
  const checks = {};
  for (let i = 0; i < 2; i++) {
    const admin = await H.freePort();
    const p = await H.startProxy({ upstream: upstream.uri, extraIni: `${P.handlersIni(P.HANDLERS)}\n[admin]\nlisten = 127.0.0.1:${admin}\n` });
    checks[p.port] = admin;
    proxies.push(p);
  }
  lb = await startHaproxy({ frontends: { tier: proxies.map((p) => p.port) }, checks });
  direct = new MongoClient(upstream.directUri, { serverSelectionTimeoutMS: 10000 });
  await P.ensureOutbox(direct);
});

test.after(async () => {
  if (direct) await direct.close().catch(() => {});
  if (lb) await lb.stop();
  for (const p of proxies) await p.stop();
  if (upstream) await upstream.stop();
});

function run(cmd, args, opts = {}) {
  return new Promise((resolve) => {
    execFile(cmd, args, { timeout: 90000, encoding: 'utf8', ...opts }, (err, stdout, stderr) =>
      resolve({ code: err ? (err.code ?? err.signal) : 0, stdout, stderr }));
  });
}

const lastJson = (out) => JSON.parse(out.trim().split('\n').pop());

test('mongosh with loadBalanced=true: an annotated transaction and a cursor in batches of 2', { skip }, async () => {
  assert.ok(fs.existsSync(MONGOSH), 'mongosh is among the test packages');
  const uri = lb.uri('tier').replace('/?', `/${DB}?`);
  const r = await run(MONGOSH, ['--quiet', uri, '--eval', `
    const session = db.getMongo().startSession();
    const orders = session.getDatabase(db.getName()).orders;
    session.startTransaction();
    orders.insertOne({ _id: 'sh-1' }, { comment: { relaybus: { type: 'order.placed.v1', id: 'lb-sh-ev-1', key: 'sh', payload: { n: 1 } } } });
    session.commitTransaction();
    db.items.insertMany(Array.from({ length: 9 }, (_, i) => ({ _id: i })));
    const got = db.items.find().sort({ _id: 1 }).batchSize(2).toArray().map((d) => d._id);
    let type = 'unknown';
    try { type = db.getMongo()._serviceProvider.mongoClient.topology.description.type; } catch (e) { /* internal */ }
    print(JSON.stringify({ got, type }));
  `], { env: { ...process.env, MONGOSH_NO_TELEMETRY: '1', HOME: H.tmpDir('relaybus-mongosh-home-') } });
  assert.equal(r.code, 0, `mongosh failed:\n${r.stdout}\n${r.stderr}`);
  const out = lastJson(r.stdout);
  assert.deepEqual(out.got, [0, 1, 2, 3, 4, 5, 6, 7, 8]);
  if (out.type !== 'unknown') assert.equal(out.type, 'LoadBalanced', 'mongosh\'s driver runs in load-balanced mode');
  await P.checkEvent(P.outboxOf(direct), 'lb-sh-ev-1', { type: 'order.placed.v1', key: 'sh', sequence: 1, payload: { n: 1 }, handlers: P.subscribed(P.HANDLERS, 'order.placed.v1') });
  assert.ok(await direct.db(DB).collection('orders').findOne({ _id: 'sh-1' }));
});

test('a pull consumer through the balancer (loadBalanced=true, maxPoolSize=1) claims and completes in its transaction', { skip }, async () => {
  // The event, published through the balancer by another client.
  const pub = new MongoClient(lb.uri('tier'), { serverSelectionTimeoutMS: 10000 });
  const consumer = new MongoClient(lb.uri('tier', { maxPoolSize: '1' }), { serverSelectionTimeoutMS: 10000 });
  try {
    const session = pub.startSession();
    await session.withTransaction(async () => {
      await pub.db(DB).collection('orders').insertOne({ _id: 'pull-1' }, {
        session, comment: { relaybus: { type: 'order.placed.v1', id: 'lb-pull-ev-1', key: 'pull', payload: { n: 3 } } },
      });
    });
    await session.endSession();
    // One connection: the lease is settled on the connection, and so the proxy, that claimed it.
    const admin = consumer.db('admin');
    let d = null;
    for (let i = 0; i < 20 && !d; i++) {
      const r = await admin.command({ relaybusClaim: 'orders', limit: 10, leaseMs: 30000, maxAwaitTimeMS: 1000 });
      d = r.deliveries.find((x) => x.eventId === 'lb-pull-ev-1') || null;
    }
    assert.ok(d, 'the delivery is claimed');
    const cs = consumer.startSession();
    try {
      await cs.withTransaction(async () => {
        await consumer.db(DB).collection('projections').insertOne({ _id: d.eventId }, { session: cs });
        await admin.command({ relaybusComplete: 'orders', leases: [d.lease] }, { session: cs });
      });
    } finally {
      await cs.endSession();
    }
    assert.ok(await direct.db(DB).collection('projections').findOne({ _id: 'lb-pull-ev-1' }));
    const left = await P.outboxOf(direct).deliveries.findOne({ eventId: 'lb-pull-ev-1', handler: 'orders' });
    assert.ok(!left || left.status === 'completed', `the delivery is completed (${JSON.stringify(left && left.status)})`);
  } finally {
    await pub.close();
    await consumer.close();
  }
});

test('mongo-c-driver with loadBalanced=true: CRUD, a cursor over getMores, a transaction', { skip, timeout: 180000 }, async () => {
  const bin = H.buildCdriverClient();
  const r = await H.runCdriverClient(bin, lb.uri('tier'), `${DB}_c`);
  assert.equal(r.code, 0, `cdriver-client failed:\n${r.stdout}\n${r.stderr}`);
  assert.match(r.stdout, /^ok mongos persona$/m, 'the balancer is a LoadBalancer server to the driver');
  assert.match(r.stdout, /^ok transaction/m);
  assert.match(r.stdout, /^ok all \(getMore started [1-9]/m, 'the cursor read over several getMores');
});

test('pymongo 3.11: no load-balanced mode (the option is ignored); through the balancer with maxPoolSize=1 it works', { skip }, async (t) => {
  const py = '/usr/bin/python3';
  const have = spawnSync(py, ['-c', 'import pymongo; print(pymongo.version)'], { encoding: 'utf8' });
  if (have.status !== 0) return t.skip('no python3-pymongo');
  const version = have.stdout.trim();
  const host = `127.0.0.1:${lb.port('tier')}`;
  const script = `
import json, sys, warnings
from pymongo import MongoClient, common
def warned(uri):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        MongoClient(uri, connect=False).close()
    return any('Unknown option' in str(x.message) for x in w)
# 3.11 warns "Unknown option" for this URI only, and its URI options do not list it.
ignored = warned('mongodb://${host}/?loadBalanced=true') and not warned('mongodb://${host}/') and \
    'loadbalanced' not in common.URI_OPTIONS_VALIDATOR_MAP
c = MongoClient('mongodb://${host}/?maxPoolSize=1&serverSelectionTimeoutMS=10000')
db = c['${DB}_py']
# pymongo 3.11's insert_one takes no comment: the insert command carries it.
with c.start_session() as s:
    s.start_transaction()
    db.command({'insert': 'orders', 'documents': [{'_id': 'py-1'}],
                'comment': {'relaybus': {'type': 'order.placed.v1', 'id': 'lb-py-ev-1', 'payload': {'n': 2}}}}, session=s)
    s.commit_transaction()
db.items.insert_many([{'_id': i} for i in range(9)])
got = [d['_id'] for d in db.items.find().sort('_id', 1).batch_size(2)]
print(json.dumps({'ignored': ignored, 'got': got}))
`;
  const r = await run(py, ['-c', script]);
  assert.equal(r.code, 0, `pymongo ${version} failed:\n${r.stdout}\n${r.stderr}`);
  const out = lastJson(r.stdout);
  if (/^3\.(\d|1[01])\./.test(version)) assert.equal(out.ignored, true, `pymongo ${version} warns that it does not know loadBalanced`);
  assert.deepEqual(out.got, [0, 1, 2, 3, 4, 5, 6, 7, 8]);
  await P.checkEvent(P.outboxOf(direct), 'lb-py-ev-1', { type: 'order.placed.v1', payload: { n: 2 }, handlers: P.subscribed(P.HANDLERS, 'order.placed.v1') });
  t.diagnostic(`pymongo ${version}: loadBalanced ignored = ${out.ignored}`);
});
