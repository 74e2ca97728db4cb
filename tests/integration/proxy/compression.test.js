'use strict';
// Compressed traffic through the proxy with the Node.js driver and Mongoose (compressors=zlib).
// A transparent TCP tap between driver and proxy shows what crossed the wire: the handshake
// reply must say compression: ['zlib'], and from then on the driver must send OP_COMPRESSED with
// compressorId 2 (the driver compresses only when the handshake reply allowed it); replies, if
// compressed, must use a compressor the client offered. Data round-trips either way.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const mongoose = require('mongoose');
const H = require('../lib/proxy');

const NEVER_COMPRESSED = ['hello', 'ismaster', 'isMaster', 'saslStart', 'saslContinue', 'getnonce', 'authenticate', 'createUser', 'updateUser'];

let upstream;
let proxy;
const DB = H.uniqueDbName('compress');

test.before(async () => {
  upstream = await H.startUpstream();
  proxy = await H.startProxy({ upstream: upstream.uri, settings: { compressors: 'zlib,zstd,snappy' } });
});

/** Checks one tapped connection of a client that offered `offered` and expects `want`. */
function checkTappedConn(rec, want, what) {
  assert.ok(rec.toServer.length >= 1, `${what}: something was sent`);
  const first = rec.toServer[0];
  assert.ok(first.doc && H.isHelloDoc(first.doc), `${what}: first message is the handshake hello`);
  assert.deepEqual(first.doc.compression, [want], `${what}: the driver offered ${want}`);
  const helloReply = rec.toClient.find((m) => m.responseTo === first.requestID);
  assert.ok(helloReply, `${what}: the handshake was answered`);
  if (helloReply.opCode === H.OP_COMPRESSED) {
    assert.equal(helloReply.compressorId, H.COMPRESSOR_IDS[want], `${what}: a compressed handshake reply uses ${want}`);
  }
  assert.ok(helloReply.doc, `${what}: the handshake reply is readable`);
  assert.deepEqual(helloReply.doc.compression, [want], `${what}: the handshake reply says compression: ['${want}']`);
  assert.equal(helloReply.doc.msg, 'isdbgrid', `${what}: mongos persona`);
  let compressedRequests = 0;
  for (const m of rec.toServer.slice(1)) {
    const cmd = m.doc ? Object.keys(m.doc)[0] : null;
    if (m.opCode === H.OP_COMPRESSED) {
      assert.equal(m.compressorId, H.COMPRESSOR_IDS[want], `${what}: request compressed with ${want}`);
      compressedRequests += 1;
    } else {
      assert.ok(NEVER_COMPRESSED.includes(cmd), `${what}: uncompressed request ${cmd} should have been compressed`);
    }
  }
  for (const m of rec.toClient) {
    if (m.opCode === H.OP_COMPRESSED) {
      assert.equal(m.compressorId, H.COMPRESSOR_IDS[want], `${what}: reply compressed with a compressor the client did not offer`);
    }
  }
  return compressedRequests;
}

test('Node.js driver with compressors=zlib: negotiated through the proxy, traffic compressed, data round-trips', async () => {
  const tap = await H.startTap(proxy.port);
  const client = new MongoClient(`mongodb://127.0.0.1:${tap.port}/?compressors=zlib${credsQuery()}`, {
    serverSelectionTimeoutMS: 10000,
    maxPoolSize: 1,
    ...credsOpts(),
  });
  try {
    const coll = client.db(DB).collection('z');
    const docs = Array.from({ length: 200 }, (_, i) => ({ _id: i, text: `row ${i} `.repeat(50) }));
    await coll.insertMany(docs);
    const back = await coll.find({}, { batchSize: 50, sort: { _id: 1 } }).toArray();
    assert.deepEqual(back, docs);
    const big = 'compressible '.repeat(200000);
    await coll.insertOne({ _id: 'big', big });
    assert.equal((await coll.findOne({ _id: 'big' })).big, big);
    const s = client.startSession();
    try {
      await s.withTransaction(async () => {
        await coll.insertOne({ _id: 'txz' }, { session: s });
      });
    } finally {
      await s.endSession();
    }
    assert.equal(await coll.countDocuments({ _id: 'txz' }), 1);
  } finally {
    await client.close();
    await tap.stop();
  }
  // Application (pool) connections carry the compressed traffic; the monitor only sends hello.
  let total = 0;
  for (const rec of tap.conns) total += checkTappedConn(rec, 'zlib', 'node driver');
  assert.ok(total >= 5, `the driver sent compressed requests (got ${total})`);
});

test('Mongoose with compressors=zlib: negotiated through the proxy, traffic compressed, data round-trips', async () => {
  const tap = await H.startTap(proxy.port);
  const conn = mongoose.createConnection(`mongodb://127.0.0.1:${tap.port}/${DB}?compressors=zlib${credsQuery()}`, {
    serverSelectionTimeoutMS: 10000,
    ...credsOpts(),
  });
  try {
    await conn.asPromise();
    const M = conn.model('Z', new mongoose.Schema({ _id: Number, body: String }, { versionKey: false }), 'mz');
    const docs = Array.from({ length: 30 }, (_, i) => ({ _id: i, body: 'lorem ipsum '.repeat(100) + i }));
    await M.insertMany(docs);
    const back = await M.find().sort({ _id: 1 }).batchSize(7).lean();
    assert.deepEqual(back, docs);
  } finally {
    await conn.close();
    await tap.stop();
  }
  let total = 0;
  for (const rec of tap.conns) total += checkTappedConn(rec, 'zlib', 'mongoose');
  assert.ok(total >= 3, `mongoose sent compressed requests (got ${total})`);
});

test('the proxy accepts compressed requests on a raw connection and answers them', { skip: H.rawDataSkipReason() }, async () => {
  const c = await H.WireConn.connect({ port: proxy.port });
  try {
    const hello = await c.command({ hello: 1, compression: ['zlib'], $db: 'admin' });
    assert.deepEqual(hello.compression, ['zlib']);
    const r = await c.request({ ping: 1, $db: 'admin' }, { compress: 'zlib' });
    assert.equal(r.doc.ok, 1);
    if (r.compressorId !== null) assert.equal(r.compressorId, 2);
    const ins = await c.request({ insert: 'raw', documents: [{ _id: 1, s: 'a'.repeat(5000) }], $db: DB }, { compress: 'zlib' });
    assert.equal(ins.doc.ok, 1);
    assert.equal(ins.doc.n, 1);
    const f = await c.request({ find: 'raw', filter: { _id: 1 }, $db: DB }, { compress: 'zlib' });
    assert.equal(f.doc.cursor.firstBatch[0].s, 'a'.repeat(5000));
    // noop compressor (id 0) is valid on the wire too.
    const n = await c.request({ ping: 1, $db: 'admin' }, { compress: 'noop' });
    assert.equal(n.doc.ok, 1);
  } finally {
    c.destroy();
  }
});

// Against a real upstream (scripts/test --upstream), authentication passes through: copy credentials to the tapped URI.
function credsQuery() {
  const u = proxy.uri();
  const q = u.split('?')[1];
  return q ? `&${q}` : '';
}
function credsOpts() {
  const m = /^mongodb:\/\/([^:@/]+):([^@/]+)@/.exec(proxy.uri());
  return m ? { auth: { username: decodeURIComponent(m[1]), password: decodeURIComponent(m[2]) } } : {};
}

async function dropDb() {
  const c = new MongoClient(proxy.uri(), { serverSelectionTimeoutMS: 5000 });
  await c.db(DB).dropDatabase().catch(() => {});
  await c.close();
}

H.registerFinalChecks(test, [() => upstream && upstream.stop()], { beforeStop: dropDb });
