'use strict';
// relaybus_buffered_bytes, the gauge that max_buffered_bytes bounds, counts what the proxy holds
// for its connections: a 12 MB reply that a client does not read stays in the proxy (the kernel's
// socket buffers take only part of it, and libevent writes the rest as the client reads), the
// gauge shows it, and once the client has read it all the gauge is back to 0. Then 2,000 small
// requests on 8 connections leave it at 0 as well: nothing is counted twice or forgotten.

const test = require('node:test');
const assert = require('node:assert/strict');
const net = require('node:net');
const { MongoClient } = require('mongodb');
const H = require('../lib/proxy');
const { startAdminProxy, request, waitFor } = require('./helpers');

const DOC_BYTES = 4 * 1000 * 1000;
const DOCS = 3;

async function gauge(proxy) {
  const r = await request(proxy.base, '/metrics');
  assert.equal(r.status, 200, r.text);
  const m = /^relaybus_buffered_bytes (\d+)$/m.exec(r.text);
  assert.ok(m, 'relaybus_buffered_bytes is served');
  return Number(m[1]);
}

/** Reads one whole wire message from a paused-then-resumed socket. */
function readMessage(sock) {
  return new Promise((resolve, reject) => {
    let buf = Buffer.alloc(0);
    const onData = (chunk) => {
      buf = Buffer.concat([buf, chunk]);
      if (buf.length >= 4 && buf.length >= buf.readInt32LE(0)) {
        sock.off('data', onData);
        resolve(H.parseMessage(buf));
      }
    };
    sock.on('data', onData);
    sock.once('error', reject);
  });
}

test('relaybus_buffered_bytes counts an unread 12 MB reply and is back to 0 once it is read', { timeout: 120000 }, async (t) => {
  const up = await H.startUpstream();
  t.after(() => up.stop());
  const proxy = await startAdminProxy({ upstream: up.uri });
  t.after(() => proxy.kill());
  const db = H.uniqueDbName('buffered');
  const client = new MongoClient(proxy.uri(), { maxPoolSize: 8 });
  t.after(() => client.close());
  const coll = client.db(db).collection('big');
  for (let i = 0; i < DOCS; i++) await coll.insertOne({ _id: i, pad: 'x'.repeat(DOC_BYTES) });
  await waitFor(async () => (await gauge(proxy)) === 0, 5000, 'the gauge at 0 after the inserts');

  const sock = net.connect(proxy.port, '127.0.0.1');
  await new Promise((resolve, reject) => sock.once('connect', resolve).once('error', reject));
  t.after(() => sock.destroy());
  sock.pause();
  sock.write(H.opMsg({ find: 'big', filter: {}, batchSize: DOCS + 1, $db: db }).buf);
  // The reply (about 12 MB) leaves the upstream at once; the client reads nothing, so what its
  // socket buffers do not take stays in the proxy's output for that client.
  let held = 0;
  await waitFor(async () => (held = await gauge(proxy)) >= 2 * 1000 * 1000, 10000,
    'the unread reply counted in relaybus_buffered_bytes');
  assert.ok(held <= DOCS * DOC_BYTES + 1000 * 1000, `the gauge shows ${held} bytes, more than the reply`);

  const reply = readMessage(sock);
  sock.resume();
  const msg = await reply;
  const body = msg.doc;
  assert.equal(body.ok, 1, JSON.stringify(body).slice(0, 300));
  assert.equal(body.cursor.firstBatch.length, DOCS);
  await waitFor(async () => (await gauge(proxy)) === 0, 5000, 'the gauge back to 0 once the reply was read');

  // Small requests, many at a time: the gauge ends at 0 again.
  const small = client.db(db).collection('small');
  for (let round = 0; round < 50; round++) {
    await Promise.all(Array.from({ length: 40 }, (_, i) => (i % 2 ? small.insertOne({ round, i }) : small.findOne({ round }))));
  }
  await waitFor(async () => (await gauge(proxy)) === 0, 5000, 'the gauge at 0 after 2,000 small requests');
  sock.destroy();
  await client.close();
  assert.equal((await proxy.stop()).code, 0);
});
