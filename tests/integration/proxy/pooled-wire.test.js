'use strict';
// Pooled mode and the wire traffic that must stay on one upstream connection: an exhaust
// getMore stream (several replies to one request) keeps its pooled connection until its last
// reply, and another client's request, waiting for the only connection meanwhile, gets its own
// reply after the stream, never a piece of it; unacknowledged (moreToCome) writes are written
// on the connection before it serves anything else, so a read sent after them sees them.

const test = require('node:test');
const assert = require('node:assert/strict');
const { BSON } = require('bson');
const H = require('../lib/proxy');

const DB = H.uniqueDbName('pooledwire');
let upstream;
let proxy;

const asLong = (id) => (typeof id === 'number' ? BSON.Long.fromNumber(id) : id);
const isZero = (id) => BigInt(id.toString()) === 0n;

test.before(async () => {
  upstream = await H.startUpstream();
  proxy = await H.startProxy({ upstream: upstream.uri, settings: { pool_mode: 'pooled', pool_size: 1, pool_wait_timeout_ms: 20000 } });
});

test.after(async () => {
  await H.stopAllAndCheck();
  if (upstream) await upstream.stop();
});

async function helloConn() {
  const c = await H.WireConn.connect({ port: proxy.port });
  assert.equal((await c.command({ hello: 1, $db: 'admin' })).ok, 1);
  return c;
}

test('an exhaust stream keeps the only pooled connection to its end; a waiting client gets its own reply after it', async () => {
  const a = await helloConn();
  const b = await helloConn();
  try {
    const docs = Array.from({ length: 40 }, (_, i) => ({ _id: i }));
    assert.equal((await a.command({ insert: 'ex', documents: docs, $db: DB })).n, 40);
    assert.equal((await b.command({ insert: 'other', documents: [{ _id: 'b-only' }], $db: DB })).n, 1);
    const f = await a.command({ find: 'ex', filter: {}, sort: { _id: 1 }, batchSize: 2, $db: DB });
    const ids = f.cursor.firstBatch.map((d) => d._id);
    let id = f.cursor.id;
    let streamed = 0;
    let bReply = null;
    while (!isZero(id)) {
      const gm = H.opMsg({ getMore: asLong(id), collection: 'ex', batchSize: 3, $db: DB }, { flags: 1 << 16 });
      await a.write(gm.buf);
      for (;;) {
        const r = await a.next();
        assert.equal(r.doc.ok, 1, JSON.stringify(r.doc));
        ids.push(...r.doc.cursor.nextBatch.map((d) => d._id));
        id = r.doc.cursor.id;
        if (!(r.flags & 2)) break;
        streamed += 1;
        // While the stream holds the connection, b asks for its own document.
        if (streamed === 1) bReply = b.command({ find: 'other', filter: {}, $db: DB }, { timeoutMs: 20000 });
      }
    }
    assert.ok(streamed >= 1, 'the upstream streamed (moreToCome replies)');
    assert.deepEqual(ids, docs.map((d) => d._id), 'every document of the stream exactly once, in order');
    const rb = await bReply;
    assert.deepEqual(rb.cursor.firstBatch, [{ _id: 'b-only' }], "b's reply is its own");
  } finally {
    a.destroy();
    b.destroy();
  }
});

test('moreToCome writes are written before the connection serves anything else', async () => {
  const c = await helloConn();
  const other = await helloConn();
  try {
    for (let i = 0; i < 50; i++) {
      const m = H.opMsg({ insert: 'mtc', documents: [{ _id: i }], writeConcern: { w: 0 }, $db: DB }, { flags: 2 });
      await c.write(m.buf);
    }
    const r = await c.command({ count: 'mtc', $db: DB }, { timeoutMs: 10000 });
    assert.equal(r.n, 50, 'a read after 50 unacknowledged inserts on the same client sees them all');
    const r2 = await other.command({ count: 'mtc', $db: DB }, { timeoutMs: 10000 });
    assert.equal(r2.n, 50);
  } finally {
    c.destroy();
    other.destroy();
  }
});
