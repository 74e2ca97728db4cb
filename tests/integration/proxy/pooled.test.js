'use strict';
// Pooled mode ([proxy] pool_mode = pooled): client connections share a few upstream
// connections, lent one request at a time. What the tests check:
//  - everything works through a pool much smaller than the clients (CRUD, a cursor continued on
//    other client connections, transactions), and the server sees only the pool's connections;
//  - a transaction holds its connection from its first statement to its commit: with a pool of
//    one, another client's request waits, and after pool_wait_timeout_ms gets ExceededTimeLimit
//    (262) with the label that makes a driver retry it; once the transaction commits, the pool
//    serves everyone again;
//  - hello and connectionStatus need no connection; ping goes to the server (a fail point on
//    ping fires, as directly: run-command/runCommand.json);
//  - a client that leaves with a request in flight does not leave its connection to anyone else
//    (it is closed in doubt), and the next client gets its own reply;
//  - the pool's metrics say what it does.
// Clients are not authenticated by the proxy here (no auth_file): pooled-auth.test.js covers
// logins. Against a real upstream (scripts/test --upstream) the proxy's pool logs in with the
// credentials of its URI.

const test = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const { MongoClient, Long } = require('mongodb');
const H = require('../lib/proxy');

const DB = H.uniqueDbName('pooled');
let upstream;

function metrics(port) {
  return new Promise((resolve, reject) => {
    http.get({ host: '127.0.0.1', port, path: '/metrics' }, (res) => {
      let body = '';
      res.on('data', (c) => (body += c));
      res.on('end', () => resolve(body));
    }).on('error', reject);
  });
}

function apiStats(port) {
  return new Promise((resolve, reject) => {
    http.get({ host: '127.0.0.1', port, path: '/api/stats' }, (res) => {
      let body = '';
      res.on('data', (c) => (body += c));
      res.on('end', () => resolve(JSON.parse(body)));
    }).on('error', reject);
  });
}

function metric(text, name) {
  const line = text.split('\n').find((l) => l.startsWith(name + ' ') || l.startsWith(name + '{') && l.split(' ')[0] === name);
  if (!line) return null;
  return Number(line.split(' ').pop());
}

async function startPooled(settings = {}) {
  const adminPort = await H.freePort();
  const proxy = await H.startProxy({
    upstream: upstream.uri,
    settings: { pool_mode: 'pooled', pool_size: 2, ...settings },
    extraIni: `[admin]\nlisten = 127.0.0.1:${adminPort}\n`,
  });
  proxy.adminPort = adminPort;
  proxy.metrics = async () => metrics(adminPort);
  return proxy;
}

function clientOf(proxy, opts = {}) {
  return new MongoClient(proxy.uri({}, { credentials: false }), { serverSelectionTimeoutMS: 10000, ...opts });
}

test.before(async () => {
  upstream = await H.startUpstream();
});

test.after(async () => {
  await H.stopAllAndCheck();
  if (upstream) await upstream.stop();
});

test('CRUD, 200 concurrent operations and a cursor continued on other connections, through a pool of 2', async () => {
  const proxy = await startPooled({ pool_size: 2 });
  const client = clientOf(proxy, { maxPoolSize: 50 });
  try {
    const coll = client.db(DB).collection('crud');
    await coll.insertMany(Array.from({ length: 100 }, (_, i) => ({ _id: i, v: i })));
    const got = await Promise.all(Array.from({ length: 200 }, (_, i) => coll.findOne({ _id: i % 100 })));
    got.forEach((d, i) => assert.equal(d.v, i % 100, 'each operation gets its own reply'));
    // A cursor whose getMores run beside 40 other operations: the driver takes whatever
    // connection is free for each, so they reach the pool on different client connections.
    const cursor = coll.find({}, { batchSize: 7 }).sort({ _id: 1 });
    const seen = [];
    for await (const d of cursor) {
      seen.push(d._id);
      if (d._id % 10 === 0) await Promise.all(Array.from({ length: 4 }, () => coll.countDocuments({})));
    }
    assert.deepEqual(seen, Array.from({ length: 100 }, (_, i) => i));
    const text = await proxy.metrics();
    assert.ok(metric(text, 'relaybus_pool_connections') <= 2, 'at most pool_size connections open');
    assert.equal(metric(text, 'relaybus_pool_size'), 2);
    // The same figures in /api/stats, which the dashboard's "Pool" figure shows.
    const stats = await apiStats(proxy.adminPort);
    assert.equal(stats.pool.size, 2);
    assert.ok(stats.pool.connections >= 1 && stats.pool.connections <= 2);
    assert.equal(stats.pool.waiters, 0);
    assert.ok(stats.pool.waits >= 1, 'with 50 driver connections over 2, some requests waited');
    assert.deepEqual(Object.keys(stats.pool.pinned).sort(), ['exhaust', 'moreToCome', 'transaction']);
  } finally {
    await client.close();
    await proxy.stop();
  }
});

test('the server sees the pool, not the clients: 300 client connections over pool_size = 4', async () => {
  const proxy = await startPooled({ pool_size: 4 });
  const direct = new MongoClient(upstream.directUri, { maxPoolSize: 1 });
  const conns = [];
  try {
    await direct.db('admin').command({ ping: 1 });
    for (let i = 0; i < 300; i++) {
      const c = await H.WireConn.connect({ port: proxy.port });
      conns.push(c);
      const hello = await c.command({ hello: 1, $db: 'admin' });
      assert.equal(hello.ok, 1);
      assert.equal(hello.msg, 'isdbgrid');
    }
    await Promise.all(
      conns.map(async (c, i) => {
        for (let k = 0; k < 3; k++) {
          const r = await c.command({ find: 'many', filter: { _id: i }, $db: DB }, { timeoutMs: 20000 });
          assert.equal(r.ok, 1, JSON.stringify(r));
        }
      }),
    );
    // The pool's connections, by the appName of their hello (currentOp with $all lists idle
    // connections too); the proxy's monitoring and store clients are not the pool's.
    const op = await direct.db('admin').command({ currentOp: 1, $all: true });
    const pool = op.inprog.filter((o) => o.appName === 'relaybus-proxy pool').length;
    assert.ok(pool >= 1 && pool <= 4, `the server has ${pool} connections of the pool for 300 clients (pool_size 4)`);
  } finally {
    for (const c of conns) c.destroy();
    await direct.close();
    await proxy.stop();
  }
});

test('a transaction keeps its connection until it commits; a request that waits too long gets a retryable error', async () => {
  const proxy = await startPooled({ pool_size: 1, pool_wait_timeout_ms: 400 });
  const a = clientOf(proxy, { maxPoolSize: 1 });
  const b = clientOf(proxy, { maxPoolSize: 1, retryReads: false, retryWrites: false });
  try {
    const coll = a.db(DB).collection('txn');
    await coll.insertOne({ _id: 'seed' });
    const session = a.startSession();
    session.startTransaction();
    await coll.insertOne({ _id: 'in-txn' }, { session });
    let text = await proxy.metrics();
    assert.equal(metric(text, 'relaybus_pool_pinned_connections{reason="transaction"}'), 1);
    // The only connection is the transaction's: b's find waits, then is refused, retryably.
    const t0 = Date.now();
    await assert.rejects(b.db(DB).collection('txn').findOne({ _id: 'seed' }), (e) => {
      assert.equal(e.code, 262, e.message);
      assert.match(e.message, /pool_wait_timeout_ms/);
      return true;
    });
    assert.ok(Date.now() - t0 >= 350, 'the find waited pool_wait_timeout_ms first');
    // A hello and connectionStatus need no connection.
    assert.equal((await b.db('admin').command({ hello: 1 })).ok, 1);
    assert.equal((await b.db('admin').command({ connectionStatus: 1 })).ok, 1);
    // A retryable write that waited too long carries RetryableWriteError (raw, to see the reply).
    const raw = await H.WireConn.connect({ port: proxy.port });
    await raw.command({ hello: 1, $db: 'admin' });
    const lsid = { id: new (require('bson').UUID)() };
    const w = await raw.command({ insert: 'txn', documents: [{ _id: 'rw' }], lsid, txnNumber: Long.fromNumber(1), $db: DB }, { timeoutMs: 5000 });
    assert.equal(w.ok, 0);
    assert.equal(w.code, 262);
    assert.deepEqual(w.errorLabels, ['RetryableWriteError']);
    raw.destroy();
    await session.commitTransaction();
    await session.endSession();
    text = await proxy.metrics();
    assert.equal(metric(text, 'relaybus_pool_pinned_connections{reason="transaction"}'), 0);
    assert.ok(metric(text, 'relaybus_pool_wait_timeouts_total') >= 2);
    // Committed, and the pool serves the other client again.
    assert.deepEqual(await b.db(DB).collection('txn').findOne({ _id: 'in-txn' }), { _id: 'in-txn' });
  } finally {
    await a.close();
    await b.close();
    await proxy.stop();
  }
});

test('loops share pool_size: a transaction pinning its loop\'s one connection of the share does not stall that loop\'s other clients (threads = 4, pool_size = 4)', async () => {
  // Each of the 4 loops keeps 1 of the 4 connections under contention. A transaction pins
  // its loop's; another client of that loop is served all the same, on a connection its loop
  // opens with budget an idle loop gives back (transactions/create-collection.json: a
  // listCollections outside a transaction while it is open). The process stays within 4.
  const proxy = await startPooled({ pool_size: 4, threads: 4, pool_wait_timeout_ms: 3000 });
  const conns = [];
  try {
    for (let i = 0; i < 8; i++) {
      const c = await H.WireConn.connect({ port: proxy.port });
      await c.command({ hello: 1, $db: 'admin' });
      conns.push(c);
    }
    const lsid = { id: new (require('bson').UUID)() };
    const txnNumber = Long.fromNumber(1);
    const ins = await conns[0].command({
      insert: 'shared', documents: [{ _id: 'in-txn' }], lsid, txnNumber, startTransaction: true, autocommit: false, $db: DB,
    });
    assert.equal(ins.ok, 1, JSON.stringify(ins));
    // The listener hands connections to the loops in turn: of 8, two per loop, so one of the
    // other seven shares conns[0]'s loop.
    const t0 = Date.now();
    await Promise.all(conns.slice(1).map(async (c) => {
      const r = await c.command({ find: 'shared', filter: {}, $db: DB }, { timeoutMs: 10000 });
      assert.equal(r.ok, 1, JSON.stringify(r));
      assert.deepEqual(r.cursor.firstBatch, [], 'the open transaction\'s insert is not visible outside it');
    }));
    assert.ok(Date.now() - t0 < 2500, `the finds took ${Date.now() - t0} ms (pool_wait_timeout_ms is 3000)`);
    const commit = await conns[0].command({ commitTransaction: 1, lsid, txnNumber, autocommit: false, $db: 'admin' });
    assert.equal(commit.ok, 1, JSON.stringify(commit));
    const r = await conns[4].command({ find: 'shared', filter: {}, $db: DB });
    assert.deepEqual(r.cursor.firstBatch, [{ _id: 'in-txn' }]);
    const text = await proxy.metrics();
    assert.ok(metric(text, 'relaybus_pool_connections') <= 4, 'at most pool_size connections open');
    assert.equal(metric(text, 'relaybus_pool_wait_timeouts_total'), 0);
  } finally {
    for (const c of conns) c.destroy();
    await proxy.stop();
  }
});

test('under contention each loop keeps its share: a loop above it gives a returning connection to a starving loop below it (threads = 2, pool_size = 2)', async () => {
  const proxy = await startPooled({ pool_size: 2, threads: 2, pool_wait_timeout_ms: 8000 });
  const conns = [];
  const { UUID } = require('bson');
  try {
    // In turn: conns 0, 2, 4 on one loop (A), conn 1 on the other (B).
    for (let i = 0; i < 5; i++) {
      const c = await H.WireConn.connect({ port: proxy.port });
      await c.command({ hello: 1, $db: 'admin' });
      conns.push(c);
    }
    const t1 = { lsid: { id: new UUID() }, txnNumber: Long.fromNumber(1) };
    const t2 = { lsid: { id: new UUID() }, txnNumber: Long.fromNumber(1) };
    const start = (c, t, id) => c.command({ insert: 'fair', documents: [{ _id: id }], ...t, startTransaction: true, autocommit: false, $db: DB });
    const commit = (c, t) => c.command({ commitTransaction: 1, ...t, autocommit: false, $db: 'admin' });
    // (Created first: two transactions creating it implicitly would conflict.)
    assert.equal((await conns[1].command({ create: 'fair', $db: DB })).ok, 1);
    // Two transactions pin both connections of the budget to loop A (the second borrowed B's).
    let r = await start(conns[0], t1, 't1');
    assert.equal(r.ok, 1, JSON.stringify(r));
    r = await start(conns[2], t2, 't2');
    assert.equal(r.ok, 1, JSON.stringify(r));
    // A's third client and B's client both wait.
    const state = { a: 'pending', b: 'pending' };
    const pa = conns[4].command({ find: 'fair', filter: {}, $db: DB }, { timeoutMs: 20000 }).then((r) => { state.a = r; return r; });
    const pb = conns[1].command({ find: 'fair', filter: {}, $db: DB }, { timeoutMs: 20000 }).then((r) => { state.b = r; return r; });
    await H.sleep(300);
    assert.equal(state.a, 'pending');
    assert.equal(state.b, 'pending');
    // t2's connection comes back to A, which holds 2 (its share is 1) while B holds none: it
    // goes to B, whose client is answered; A's waits for A's own connection.
    assert.equal((await commit(conns[2], t2)).ok, 1);
    const rb = await Promise.race([pb, H.sleep(3000).then(() => null)]);
    assert.ok(rb, 'loop B\'s client was answered once loop A was above its share with a connection to give back');
    assert.equal(rb.ok, 1, JSON.stringify(rb));
    assert.equal(state.a, 'pending', 'loop A\'s waiter waits for the connection of A\'s share');
    assert.equal((await commit(conns[0], t1)).ok, 1);
    const ra = await pa;
    assert.equal(ra.ok, 1, JSON.stringify(ra));
    const text = await proxy.metrics();
    assert.ok(metric(text, 'relaybus_pool_connections') <= 2, 'at most pool_size connections open');
  } finally {
    for (const c of conns) c.destroy();
    await proxy.stop();
  }
});

test('withTransaction through a pool of 1: concurrent transactions queue and all commit', async () => {
  const proxy = await startPooled({ pool_size: 1, pool_wait_timeout_ms: 5000 });
  const client = clientOf(proxy, { maxPoolSize: 10 });
  try {
    const coll = client.db(DB).collection('queued');
    await coll.deleteMany({});
    await Promise.all(
      Array.from({ length: 8 }, async (_, i) => {
        const s = client.startSession();
        try {
          await s.withTransaction(async () => {
            await coll.insertOne({ _id: `${i}-a` }, { session: s });
            await coll.insertOne({ _id: `${i}-b` }, { session: s });
          });
        } finally {
          await s.endSession();
        }
      }),
    );
    assert.equal(await coll.countDocuments({}), 16);
  } finally {
    await client.close();
    await proxy.stop();
  }
});

test('a client that leaves with a request in flight: its connection is closed, and the next client gets its own reply', async (t) => {
  if (upstream.real) {
    t.skip('needs failCommand with blockConnection on a server of its own (the double)');
    return;
  }
  const proxy = await startPooled({ pool_size: 1 });
  const direct = new MongoClient(upstream.directUri);
  try {
    await direct.db(DB).collection('doubt').insertOne({ _id: 1, who: 'doc' });
    // The pool's connections say appName "relaybus-proxy pool": block their next find for 1 s.
    await direct.db('admin').command({
      configureFailPoint: 'failCommand',
      mode: { times: 1 },
      data: { failCommands: ['find'], blockConnection: true, blockTimeMS: 1000, appName: 'relaybus-proxy pool' },
    });
    const leaver = await H.WireConn.connect({ port: proxy.port });
    await leaver.command({ hello: 1, $db: 'admin' });
    await leaver.write(H.opMsg({ find: 'doubt', filter: { _id: 1 }, $db: DB }).buf);
    await H.sleep(200);
    leaver.destroy();
    const next = await H.WireConn.connect({ port: proxy.port });
    await next.command({ hello: 1, $db: 'admin' });
    const r = await next.command({ count: 'doubt', $db: DB }, { timeoutMs: 5000 });
    assert.equal(r.ok, 1);
    assert.equal(r.n, 1, 'the reply to its own count, not the leaver\'s find');
    next.destroy();
    const text = await proxy.metrics();
    assert.equal(metric(text, 'relaybus_pool_closed_in_doubt_total'), 1);
    assert.ok(await proxy.waitForLog(/left 1 request\(s\) in flight/));
  } finally {
    await direct.db('admin').command({ configureFailPoint: 'failCommand', mode: 'off' }).catch(() => {});
    await direct.close();
    await proxy.stop();
  }
});

test('a ping goes to the server: a fail point on ping fires and the reply carries the server\'s $clusterTime', async (t) => {
  const proxy = await startPooled({ pool_size: 2 });
  const client = clientOf(proxy, { retryReads: false });
  const direct = upstream.real ? null : new MongoClient(upstream.directUri);
  try {
    const raw = await H.WireConn.connect({ port: proxy.port });
    await raw.command({ hello: 1, $db: 'admin' });
    const pong = await raw.command({ ping: 1, $db: 'admin' });
    assert.equal(pong.ok, 1);
    assert.ok(pong.$clusterTime, `the server's reply (with $clusterTime), not the proxy's: ${JSON.stringify(pong)}`);
    // An apiVersion the server refuses is the server's error, as directly
    // (versioned-api/runcommand-helper-no-api-version-declared.json).
    const api = await raw.command({ ping: 1, apiVersion: 'server_will_never_support_this_api_version', $db: 'admin' });
    assert.equal(api.ok, 0, JSON.stringify(api));
    raw.destroy();
    if (!direct) {
      t.diagnostic('the fail point half needs failCommand on a server of its own (the double)');
      return;
    }
    // run-command/runCommand.json "does not retry retryable errors on given command".
    await direct.db('admin').command({
      configureFailPoint: 'failCommand',
      mode: { times: 1 },
      data: { failCommands: ['ping'], closeConnection: true },
    });
    await assert.rejects(client.db(DB).command({ ping: 1 }), (e) => {
      assert.match(e.name, /MongoNetworkError/, e.message);
      return true;
    });
    assert.equal((await client.db(DB).command({ ping: 1 })).ok, 1, 'the fail point fired once');
  } finally {
    if (direct) {
      await direct.db('admin').command({ configureFailPoint: 'failCommand', mode: 'off' }).catch(() => {});
      await direct.close();
    }
    await client.close();
    await proxy.stop();
  }
});

test('pool_mode and pool_size are checked, and auth_file is refused in session mode', async () => {
  const bad = await H.runProxyExpectingExit({ upstream: upstream.uri, settings: { pool_mode: 'shared' } });
  assert.notEqual(bad.code, 0);
  assert.match(bad.log, /pool_mode: 'shared' is not session or pooled/);
  const session = await H.runProxyExpectingExit({ upstream: upstream.uri, settings: { auth_file: '/etc/hostname' } });
  assert.notEqual(session.code, 0);
  assert.match(session.log, /auth_file: is read in pooled mode only/);
});
