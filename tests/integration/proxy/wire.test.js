'use strict';
// Valid but unusual wire traffic passes through the proxy intact: checksummed hello (the rewritten
// reply must carry no checksum or a correct one), kind-1 sections before the body, a message of
// exactly maxMessageSizeBytes, exhaust getMore streams (several replies to one request),
// fire-and-forget (moreToCome) requests, deep pipelining, a slow reader of a large reply
// (backpressure), and OP_QUERY used for anything but the legacy hello (refused, never forwarded
// as if valid).

const test = require('node:test');
const assert = require('node:assert/strict');
const { BSON } = require('bson');
const H = require('../lib/proxy');

const DB = H.uniqueDbName('wire');
let upstream;
let proxy;

test.before(async () => {
  upstream = await H.startUpstream();
  proxy = await H.startProxy({ upstream: upstream.uri });
});

// Cursor ids come back as numbers (promoted) or Long; send them back as int64 always.
const asLong = (id) => (typeof id === 'number' ? BSON.Long.fromNumber(id) : id);
const isZero = (id) => BigInt(id.toString()) === 0n;

async function helloConn() {
  const c = await H.WireConn.connect({ port: proxy.port });
  const hello = await c.command({ hello: 1, $db: 'admin' });
  assert.equal(hello.ok, 1);
  return c;
}

function assertChecksumIfPresent(msg, what) {
  if (msg.flags & 1) {
    const raw = msg.raw;
    assert.equal(raw.readUInt32LE(raw.length - 4), H.crc32c(raw, raw.length - 4), `${what}: reply checksum must be correct`);
  }
}

test('a hello with checksumPresent is answered in the persona, with no checksum or a correct one', async () => {
  const c = await H.WireConn.connect({ port: proxy.port });
  try {
    const r = await c.request({ hello: 1, $db: 'admin' }, { checksum: true });
    assert.equal(r.doc.ok, 1);
    assert.equal(r.doc.msg, 'isdbgrid');
    assert.ok(!('setName' in r.doc));
    assertChecksumIfPresent(r, 'hello');
    const p = await c.request({ ping: 1, $db: 'admin' }, { checksum: true });
    assert.equal(p.doc.ok, 1);
    assertChecksumIfPresent(p, 'ping');
  } finally {
    c.destroy();
  }
});

test('kind-1 sections before the body, and several kinds in one message, are forwarded intact', { skip: H.rawDataSkipReason() }, async () => {
  const c = await helloConn();
  try {
    const ins = await c.command(null, {
      sections: [
        { kind: 1, identifier: 'documents', docs: [{ _id: 1, a: 1 }, { _id: 2, a: 2 }, { _id: 3, a: 3 }] },
        { kind: 0, doc: { insert: 'k1', ordered: true, $db: DB } },
      ],
    });
    assert.equal(ins.ok, 1, JSON.stringify(ins));
    assert.equal(ins.n, 3);
    const upd = await c.command(null, {
      sections: [
        { kind: 0, doc: { update: 'k1', $db: DB } },
        { kind: 1, identifier: 'updates', docs: [{ q: { _id: 1 }, u: { $set: { a: 10 } } }, { q: { _id: 2 }, u: { $set: { a: 20 } } }] },
      ],
    });
    assert.equal(upd.nModified, 2);
    const del = await c.command(null, {
      sections: [
        { kind: 0, doc: { delete: 'k1', $db: DB } },
        { kind: 1, identifier: 'deletes', docs: [{ q: { _id: 3 }, limit: 1 }] },
      ],
    });
    assert.equal(del.n, 1);
    const f = await c.command({ find: 'k1', filter: {}, sort: { _id: 1 }, $db: DB });
    assert.deepEqual(f.cursor.firstBatch, [{ _id: 1, a: 10 }, { _id: 2, a: 20 }]);
  } finally {
    c.destroy();
  }
});

test('a message of exactly maxMessageSizeBytes (48,000,000) is accepted and forwarded', { skip: H.rawDataSkipReason(), timeout: 120000 }, async () => {
  const c = await helloConn();
  try {
    const body = { insert: 'max', $db: DB };
    const mk = (i, len) => ({ _id: i, s: 'm'.repeat(len) });
    const docLen = 15_900_000;
    const docs = [mk(0, docLen), mk(1, docLen), mk(2, docLen)];
    const size = (ds) => H.opMsg(null, { sections: [{ kind: 0, doc: body }, { kind: 1, identifier: 'documents', docs: ds }] }).buf.length;
    const base = size(docs);
    docs[2] = mk(2, docLen + (48_000_000 - base));
    const m = H.opMsg(null, { sections: [{ kind: 0, doc: body }, { kind: 1, identifier: 'documents', docs }] });
    assert.equal(m.buf.length, 48_000_000, 'the test built a message of exactly the limit');
    await c.write(m.buf);
    const r = await c.next({ timeoutMs: 60000 });
    assert.equal(r.responseTo, m.requestID);
    assert.equal(r.doc.ok, 1, JSON.stringify(r.doc).slice(0, 500));
    assert.equal(r.doc.n, 3);
    const f = await c.command({ find: 'max', filter: {}, projection: { _id: 1 }, $db: DB }, { timeoutMs: 30000 });
    assert.deepEqual(f.cursor.firstBatch, [{ _id: 0 }, { _id: 1 }, { _id: 2 }]);
    await c.command({ drop: 'max', $db: DB }, { timeoutMs: 30000 });
  } finally {
    c.destroy();
  }
});

/** Reads a cursor with exhaustAllowed getMores; returns {ids, replies, streamed}. */
async function exhaustRead(c, coll) {
  const docs = Array.from({ length: 20 }, (_, i) => ({ _id: i }));
  assert.equal((await c.command({ insert: coll, documents: docs, $db: DB })).n, 20);
  const f = await c.command({ find: coll, filter: {}, sort: { _id: 1 }, batchSize: 2, $db: DB });
  const ids = f.cursor.firstBatch.map((d) => d._id);
  let id = f.cursor.id;
  let replies = 0;
  let streamed = 0;
  while (!isZero(id)) {
    const gm = H.opMsg({ getMore: asLong(id), collection: coll, batchSize: 3, $db: DB }, { flags: 1 << 16 });
    await c.write(gm.buf);
    for (;;) {
      const r = await c.next();
      replies += 1;
      assert.equal(r.doc.ok, 1, JSON.stringify(r.doc));
      ids.push(...r.doc.cursor.nextBatch.map((d) => d._id));
      id = r.doc.cursor.id;
      if (!(r.flags & 2)) break; // moreToCome clear: the stream (or single reply) ends
      streamed += 1;
    }
  }
  assert.deepEqual(ids, docs.map((d) => d._id), 'every document exactly once, in order');
  return { replies, streamed };
}

test('(double fidelity) the upstream streams exhaust getMore replies with moreToCome', { skip: H.rawDataSkipReason() }, async (t) => {
  if (!upstream.port) return t.skip('real upstream: not probed directly');
  const c = await H.WireConn.connect({ port: upstream.port });
  try {
    const { streamed } = await exhaustRead(c, 'ex_direct');
    assert.ok(streamed >= 1, 'mongod honours exhaustAllowed on getMore (mongod-behaviour.md): replies with moreToCome expected');
  } finally {
    c.destroy();
  }
});

test('an exhaust getMore stream (several replies to one request) is relayed whole', { skip: H.rawDataSkipReason() }, async () => {
  const c = await helloConn();
  try {
    const { replies, streamed } = await exhaustRead(c, 'ex');
    assert.ok(replies >= 6, `at least six getMore replies (${replies})`);
    assert.ok(streamed >= 1, 'the exhaust stream reached the client as several replies to one request');
    const p = await c.command({ ping: 1, $db: 'admin' });
    assert.equal(p.ok, 1, 'the connection is in step after the stream');
  } finally {
    c.destroy();
  }
});

test('moreToCome requests get no reply and do not shift later replies', { skip: H.rawDataSkipReason() }, async () => {
  const c = await helloConn();
  try {
    const w0 = H.opMsg({ insert: 'mtc', documents: [{ _id: 1 }], writeConcern: { w: 0 }, $db: DB }, { flags: 2 });
    const w1 = H.opMsg({ insert: 'mtc', documents: [{ _id: 2 }], writeConcern: { w: 0 }, $db: DB }, { flags: 2 });
    const ping = H.opMsg({ ping: 1, $db: 'admin' });
    await c.write(Buffer.concat([w0.buf, w1.buf, ping.buf]));
    const r = await c.next();
    assert.equal(r.responseTo, ping.requestID, 'the first reply answers the ping');
    const deadline = Date.now() + 5000;
    let n = 0;
    while (Date.now() < deadline) {
      n = (await c.command({ count: 'mtc', $db: DB })).n;
      if (n === 2) break;
      await H.sleep(50);
    }
    assert.equal(n, 2, 'both fire-and-forget inserts landed');
    await H.sleep(200);
    assert.equal(c.queue.length, 0, 'no stray reply arrived');
  } finally {
    c.destroy();
  }
});

test('200 requests written back to back get 200 replies in order', { skip: H.rawDataSkipReason() }, async () => {
  const c = await helloConn();
  try {
    const reqs = Array.from({ length: 200 }, (_, i) => H.opMsg(i % 2 ? { ping: 1, $db: 'admin' } : { count: 'none', query: { i }, $db: DB }));
    await c.write(Buffer.concat(reqs.map((r) => r.buf)));
    for (const req of reqs) {
      const r = await c.next({ timeoutMs: 10000 });
      assert.equal(r.responseTo, req.requestID, 'replies come in request order');
      assert.equal(r.doc.ok, 1);
    }
  } finally {
    c.destroy();
  }
});

test('a slow reader of a large reply gets every byte intact (backpressure, no loss)', { skip: H.rawDataSkipReason(), timeout: 60000 }, async () => {
  const c = await helloConn();
  try {
    const chunk = 'q'.repeat(1_000_000);
    const docs = Array.from({ length: 12 }, (_, i) => ({ _id: i, s: chunk }));
    for (const d of docs) await c.command({ insert: 'bp', documents: [d], $db: DB });
    c.sock.pause();
    const f = H.opMsg({ find: 'bp', filter: {}, sort: { _id: 1 }, $db: DB });
    await c.write(f.buf);
    await H.sleep(1500); // ~12 MB reply waits in socket buffers and the proxy's queue
    assert.equal(proxy.exitInfo(), null);
    c.sock.resume();
    const r = await c.next({ timeoutMs: 20000 });
    assert.equal(r.responseTo, f.requestID);
    let ids = r.doc.cursor.firstBatch.map((d) => d._id);
    for (const d of r.doc.cursor.firstBatch) assert.equal(d.s, chunk);
    let id = r.doc.cursor.id;
    while (!isZero(id)) {
      const g = await c.command({ getMore: asLong(id), collection: 'bp', $db: DB }, { timeoutMs: 20000 });
      for (const d of g.cursor.nextBatch) assert.equal(d.s, chunk);
      ids = ids.concat(g.cursor.nextBatch.map((d) => d._id));
      id = g.cursor.id;
    }
    assert.deepEqual(ids, docs.map((d) => d._id));
  } finally {
    c.destroy();
  }
});

test('OP_QUERY for anything but hello is refused: closed, or an OP_REPLY error; never executed', { skip: H.rawDataSkipReason() }, async () => {
  const c = await helloConn();
  try {
    const q = H.opQuery({ insert: 'legacy', documents: [{ _id: 'via-op-query' }] }, { ns: `${DB}.$cmd` });
    await c.write(q.buf);
    let reply = null;
    try {
      reply = await c.next({ timeoutMs: 5000 });
    } catch (e) {
      assert.ok(c.closed, `neither a reply nor a close: ${e.message}`);
    }
    if (reply) {
      assert.equal(reply.responseTo, q.requestID);
      assert.equal(reply.opCode, H.OP_REPLY, 'a reply to OP_QUERY is an OP_REPLY');
      assert.ok(reply.doc.ok === 0 || '$err' in reply.doc, `an error reply: ${JSON.stringify(reply.doc)}`);
    }
  } finally {
    c.destroy();
  }
  const d = await helloConn();
  try {
    const f = await d.command({ find: 'legacy', filter: {}, $db: DB });
    assert.deepEqual(f.cursor.firstBatch, [], 'the OP_QUERY insert was not executed');
  } finally {
    d.destroy();
  }
});

async function dropDb() {
  if (H.rawDataSkipReason()) return;
  const c = await helloConn();
  try {
    await c.command({ dropDatabase: 1, $db: DB }, { timeoutMs: 30000 });
  } finally {
    c.destroy();
  }
}

H.registerFinalChecks(test, [() => upstream && upstream.stop()], { beforeStop: dropDb });
