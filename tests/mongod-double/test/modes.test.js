'use strict';
// Server modes: --standalone identity and its refusal of transaction numbers, --auth with
// SCRAM-SHA-256 / SCRAM-SHA-1, --max-wire-version, clean SIGTERM.

const { test } = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const { startDouble, rawConnect, lsid, L } = require('./helpers');

test('--standalone answers as a standalone and rejects txnNumber with 20', async () => {
  const d = await startDouble(['--standalone']);
  try {
    const raw = await rawConnect(d.port);
    const h = await raw.command({ hello: 1, $db: 'admin' });
    assert.equal(h.setName, undefined);
    assert.equal(h.isWritablePrimary, true);
    assert.equal(h.logicalSessionTimeoutMinutes.valueOf(), 30);
    assert.equal(h.$clusterTime, undefined);
    const r = await raw.command({ insert: 'c', documents: [{}], lsid: lsid(), txnNumber: L(1), $db: 'x' });
    assert.equal(r.code.valueOf(), 20);
    assert.equal(r.errmsg, 'Transaction numbers are only allowed on a replica set member or mongos');
    raw.close();
    const c = new MongoClient(`mongodb://127.0.0.1:${d.port}/`, { serverSelectionTimeoutMS: 5000 });
    await c.connect();
    await c.db('x').collection('c').insertOne({ a: 1 }); // driver must not try retryable writes
    assert.equal(await c.db('x').collection('c').countDocuments(), 1);
    await c.close();
  } finally {
    assert.equal(await d.stop(), 0);
  }
});

test('replica-set hello identity and --max-wire-version', async () => {
  const d = await startDouble(['--max-wire-version', '17']);
  try {
    const raw = await rawConnect(d.port);
    const h = await raw.command({ hello: 1, helloOk: true, $db: 'admin' });
    const keys = Object.keys(h);
    assert.deepEqual(keys.slice(0, 5), ['helloOk', 'topologyVersion', 'hosts', 'setName', 'setVersion']);
    assert.equal(h.setName, 'rs0');
    assert.deepEqual(h.hosts, [`127.0.0.1:${d.port}`, `127.0.0.1:${d.secondaryPort}`]);
    assert.equal(h.primary, `127.0.0.1:${d.port}`);
    assert.equal(h.me, `127.0.0.1:${d.port}`);
    assert.equal(h.maxWireVersion.valueOf(), 17);
    assert.equal(h.$clusterTime.signature.hash.buffer.length, 20);
    assert.ok(keys.indexOf('ok') < keys.indexOf('$clusterTime'));
    const legacy = await raw.command({ isMaster: 1, $db: 'admin' });
    assert.equal(legacy.ismaster, true);
    const bi = await raw.command({ buildInfo: 1, $db: 'admin' });
    assert.equal(bi.version, '7.0.0');
    raw.close();
  } finally {
    await d.stop();
  }
});

test('--auth: SCRAM-SHA-256 and SCRAM-SHA-1 succeed, bad password fails, unauthenticated commands get 13', async () => {
  const d = await startDouble(['--auth', 'root:s3cret']);
  try {
    for (const mech of ['SCRAM-SHA-256', 'SCRAM-SHA-1']) {
      const c = new MongoClient(`mongodb://root:s3cret@127.0.0.1:${d.port}/?replicaSet=rs0&authMechanism=${mech}`, { serverSelectionTimeoutMS: 5000 });
      await c.connect();
      await c.db('a').collection('c').insertOne({ mech });
      await c.close();
    }
    const c = new MongoClient(`mongodb://root:s3cret@127.0.0.1:${d.port}/?replicaSet=rs0`, { serverSelectionTimeoutMS: 5000 });
    await c.connect();
    assert.equal(await c.db('a').collection('c').countDocuments(), 2);
    await c.close();
    const bad = new MongoClient(`mongodb://root:wrong@127.0.0.1:${d.port}/?replicaSet=rs0`, { serverSelectionTimeoutMS: 3000 });
    await assert.rejects(bad.connect(), (e) => /Authentication failed/.test(e.message));
    await bad.close();
    const raw = await rawConnect(d.port);
    const h = await raw.command({ hello: 1, saslSupportedMechs: 'admin.root', $db: 'admin' });
    assert.deepEqual(h.saslSupportedMechs, ['SCRAM-SHA-1', 'SCRAM-SHA-256']);
    assert.equal((await raw.command({ ping: 1, $db: 'admin' })).ok.valueOf(), 1);
    const f = await raw.command({ find: 'c', $db: 'a' });
    assert.equal(f.code.valueOf(), 13);
    assert.equal(f.errmsg, 'command find requires authentication');
    raw.close();
  } finally {
    await d.stop();
  }
});
