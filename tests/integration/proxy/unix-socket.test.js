'use strict';
// `listen = /path` serves clients on a Unix socket: the Node.js driver, Mongoose and
// mongo-c-driver connect through mongodb://%2Fpath%2Fproxy.sock and do their core work.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const { MongoClient } = require('mongodb');
const mongoose = require('mongoose');
const H = require('../lib/proxy');

const DB = H.uniqueDbName('unix');
let upstream;
let proxy;

test.before(async () => {
  upstream = await H.startUpstream();
  proxy = await H.startProxy({ upstream: upstream.uri, unixSocket: true });
});

test('the proxy listens on the socket path', () => {
  assert.ok(fs.statSync(proxy.socketPath).isSocket(), `${proxy.socketPath} is a socket`);
});

test('Node.js driver over the Unix socket: hello persona, CRUD and a transaction', async () => {
  const client = new MongoClient(proxy.uri(), { serverSelectionTimeoutMS: 10000 });
  try {
    const hello = await client.db('admin').command({ hello: 1 });
    assert.equal(hello.msg, 'isdbgrid');
    const coll = client.db(DB).collection('u');
    await coll.insertMany(Array.from({ length: 25 }, (_, i) => ({ _id: i })));
    assert.equal((await coll.find({}, { batchSize: 4 }).toArray()).length, 25);
    const s = client.startSession();
    try {
      await s.withTransaction(async () => {
        await coll.deleteOne({ _id: 0 }, { session: s });
        await coll.insertOne({ _id: 'tx' }, { session: s });
      });
    } finally {
      await s.endSession();
    }
    assert.equal(await coll.countDocuments({}), 25);
    assert.equal(await coll.countDocuments({ _id: 'tx' }), 1);
  } finally {
    await client.close();
  }
});

test('Mongoose over the Unix socket', async () => {
  const conn = mongoose.createConnection(proxy.uri({}, { db: DB }), { serverSelectionTimeoutMS: 10000 });
  try {
    await conn.asPromise();
    const M = conn.model('U', new mongoose.Schema({ _id: Number, v: String }, { versionKey: false }), 'mu');
    await M.create({ _id: 1, v: 'sock' });
    assert.deepEqual(await M.findById(1).lean(), { _id: 1, v: 'sock' });
  } finally {
    await conn.close();
  }
});

test('mongo-c-driver over the Unix socket', async () => {
  const bin = H.buildCdriverClient();
  const r = await H.runCdriverClient(bin, proxy.uri({ compressors: 'zstd' }), H.uniqueDbName('unixc'));
  assert.equal(r.code, 0, `cdriver-client failed:\n${r.stdout}\n${r.stderr}`);
  assert.match(r.stdout, /^ok all/m);
});

async function dropDb() {
  const c = new MongoClient(proxy.uri(), { serverSelectionTimeoutMS: 5000 });
  await c.db(DB).dropDatabase().catch(() => {});
  await c.close();
}

H.registerFinalChecks(test, [() => upstream && upstream.stop()], { beforeStop: dropDb });
