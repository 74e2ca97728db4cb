'use strict';
// The persona of a mongos behind a load balancer (the drivers' load-balancer specification):
// a connection whose first hello says loadBalanced: true is answered with a serviceId, the
// proxy process's own ObjectId, the same on every connection of the process and different
// from another process's; later hellos of that connection, and every hello that does not ask,
// get exactly the answer they got before (no serviceId), as mongos answers. Session mode and
// pooled mode (where the proxy answers every hello itself) alike; OP_MSG and the legacy
// OP_QUERY isMaster. Then the Node.js driver with loadBalanced=true straight at one proxy: it
// connects, names the proxy's serviceId in its command events, and runs a cursor and a
// transaction on its pinned connections. Through HAProxy and several proxies:
// tests/integration/lb/ and the conformance steps (tests/conformance/check-proxy).

const test = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const { MongoClient } = require('mongodb');
const H = require('../lib/proxy');

const DB = H.uniqueDbName('lbpersona');
let upstream;
let a; // session mode, with an admin port
let b; // session mode
let pooled; // pooled mode

function apiStats(port) {
  return new Promise((resolve, reject) => {
    http.get({ host: '127.0.0.1', port, path: '/api/stats' }, (res) => {
      let body = '';
      res.on('data', (c) => (body += c));
      res.on('end', () => resolve(JSON.parse(body)));
    }).on('error', reject);
  });
}

async function withConn(proxy, fn) {
  const c = await H.WireConn.connect({ port: proxy.port });
  try {
    return await fn(c);
  } finally {
    c.destroy();
  }
}

const hex = (oid) => (oid && oid.toHexString ? oid.toHexString() : null);
// What may differ between two hellos of the same process: the clock, the connection.
const VOLATILE = new Set(['localTime', 'connectionId', '$clusterTime', 'operationTime']);
const stable = (doc) => Object.keys(doc).filter((k) => !VOLATILE.has(k));

test.before(async () => {
  upstream = await H.startUpstream();
  const adminPort = await H.freePort();
  a = await H.startProxy({ upstream: upstream.uri, extraIni: `[admin]\nlisten = 127.0.0.1:${adminPort}\n` });
  a.adminPort = adminPort;
  b = await H.startProxy({ upstream: upstream.uri });
  pooled = await H.startProxy({ upstream: upstream.uri, settings: { pool_mode: 'pooled', pool_size: 2 } });
});

for (const mode of ['session', 'pooled']) {
  test(`${mode} mode: a first hello with loadBalanced: true gets the process's serviceId; other hellos get today's answer`, async () => {
    const p = mode === 'session' ? a : pooled;
    const asked = await withConn(p, async (c) => {
      const first = (await c.request({ hello: 1, helloOk: true, loadBalanced: true, $db: 'admin' })).doc;
      const later = (await c.request({ hello: 1, helloOk: true, loadBalanced: true, $db: 'admin' })).doc;
      const plainLater = (await c.request({ isMaster: 1, $db: 'admin' })).doc;
      return { first, later, plainLater };
    });
    const plain = await withConn(p, async (c) => (await c.request({ hello: 1, helloOk: true, $db: 'admin' })).doc);
    const refused = await withConn(p, async (c) => (await c.request({ hello: 1, helloOk: true, loadBalanced: false, $db: 'admin' })).doc);
    const again = await withConn(p, async (c) => (await c.request({ hello: 1, loadBalanced: true, $db: 'admin' })).doc);

    assert.equal(asked.first.ok, 1);
    assert.equal(asked.first.msg, 'isdbgrid', 'still a mongos');
    assert.equal(asked.first.serviceId && asked.first.serviceId._bsontype, 'ObjectId', 'serviceId is an ObjectId');
    assert.equal(hex(again.serviceId), hex(asked.first.serviceId), 'the same serviceId on another connection of the process');
    assert.ok(!('setName' in asked.first) && !('hosts' in asked.first), 'no replica-set persona');
    // As mongos: only the connection's first hello names the service.
    assert.ok(!('serviceId' in asked.later), 'a later hello of the connection has no serviceId');
    assert.ok(!('serviceId' in asked.plainLater), 'nor a later isMaster');
    assert.ok(!('serviceId' in plain), 'a hello that does not ask gets no serviceId');
    assert.ok(!('serviceId' in refused), 'nor one with loadBalanced: false');
    // Nothing else differs: the answer a driver that does not ask gets is the one it got before.
    assert.deepEqual(stable(asked.first).filter((k) => k !== 'serviceId'), stable(plain));
    assert.deepEqual(stable(refused), stable(plain));
    assert.deepEqual(stable(asked.later), stable(plain));
  });

  test(`${mode} mode: the legacy OP_QUERY isMaster with loadBalanced: true gets the serviceId too`, async () => {
    const p = mode === 'session' ? a : pooled;
    const r = await withConn(p, (c) => c.request({ isMaster: 1, loadBalanced: true }, { legacy: true }));
    const ref = await withConn(p, async (c) => (await c.request({ hello: 1, loadBalanced: true, $db: 'admin' })).doc);
    assert.equal(r.opCode, H.OP_REPLY, 'answered with OP_REPLY');
    assert.equal(r.doc.ok, 1);
    assert.equal(r.doc.serviceId && r.doc.serviceId._bsontype, 'ObjectId', 'serviceId is an ObjectId');
    assert.equal(hex(r.doc.serviceId), hex(ref.serviceId));
  });
}

test('each proxy process is its own service; /api/stats and the start-up line name it', async () => {
  const id = async (p) => hex((await withConn(p, (c) => c.request({ hello: 1, loadBalanced: true, $db: 'admin' }))).doc.serviceId);
  const [ia, ib, ip] = [await id(a), await id(b), await id(pooled)];
  assert.ok(ia && ib && ip);
  assert.equal(new Set([ia, ib, ip]).size, 3, `three processes, three serviceIds: ${ia} ${ib} ${ip}`);
  assert.equal((await apiStats(a.adminPort)).serviceId, ia, '/api/stats serviceId');
  assert.ok(a.logLines(`serviceId ${ia}`).some((l) => /listening on/.test(l)), 'the start-up line names it');
  assert.ok(b.logLines(`serviceId ${ib}`).some((l) => /listening on/.test(l)));
});

for (const mode of ['session', 'pooled']) {
  test(`${mode} mode: the Node.js driver with loadBalanced=true connects, pins a cursor and a transaction, and names the proxy's serviceId`, async () => {
    const p = mode === 'session' ? a : pooled;
    const want = hex((await withConn(p, (c) => c.request({ hello: 1, loadBalanced: true, $db: 'admin' }))).doc.serviceId);
    const client = new MongoClient(p.uri({ loadBalanced: 'true' }), { monitorCommands: true, serverSelectionTimeoutMS: 10000, maxPoolSize: 5 });
    const started = [];
    client.on('commandStarted', (e) => started.push(e));
    let topologyType = null;
    client.on('topologyDescriptionChanged', (e) => { topologyType = e.newDescription.type; });
    try {
      const coll = client.db(DB).collection(`lb_${mode}`);
      await coll.deleteMany({});
      await coll.insertMany(Array.from({ length: 9 }, (_, i) => ({ _id: i })));
      assert.equal(topologyType, 'LoadBalanced', 'the driver runs in load-balanced mode');
      // A cursor: find and its getMores on one pinned connection.
      const seen = await coll.find({}, { batchSize: 2, sort: { _id: 1 } }).toArray();
      assert.deepEqual(seen.map((d) => d._id), [0, 1, 2, 3, 4, 5, 6, 7, 8]);
      const cursorCmds = started.filter((e) => e.commandName === 'find' || e.commandName === 'getMore');
      assert.equal(cursorCmds.length, 5, 'a find and four getMores');
      assert.equal(new Set(cursorCmds.map((e) => String(e.connectionId))).size, 1, 'all on one connection');
      // A transaction on its pinned connection.
      const session = client.startSession();
      try {
        await session.withTransaction(async () => {
          await coll.insertOne({ _id: 100 }, { session });
          await coll.updateOne({ _id: 100 }, { $set: { x: 1 } }, { session });
        });
      } finally {
        await session.endSession();
      }
      const txnCmds = started.filter((e) => e.command && e.command.txnNumber !== undefined && e.command.autocommit === false);
      assert.ok(txnCmds.length >= 3, 'insert, update, commit');
      assert.equal(new Set(txnCmds.map((e) => String(e.connectionId))).size, 1, 'the transaction on one connection');
      assert.deepEqual(await coll.findOne({ _id: 100 }), { _id: 100, x: 1 });
      // Every command names the proxy's service.
      assert.ok(started.length > 0);
      for (const e of started) assert.equal(hex(e.serviceId), want, `${e.commandName} names the serviceId`);
    } finally {
      await client.close();
    }
  });
}

test('a driver without loadBalanced still sees one mongos (Sharded), as before', async () => {
  let type = null;
  const client = new MongoClient(a.uri(), { serverSelectionTimeoutMS: 10000 });
  client.on('topologyDescriptionChanged', (e) => { type = e.newDescription.type; });
  try {
    await client.db('admin').command({ ping: 1 });
    assert.equal(type, 'Sharded');
  } finally {
    await client.close();
  }
});

test.after(async () => {
  for (const p of [a, b, pooled]) if (p) await p.stop();
  if (upstream) await upstream.stop();
});
