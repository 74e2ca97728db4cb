'use strict';
// Wire protocol: kind 1 sections, checksums, flag bits, OP_QUERY hello, OP_COMPRESSED zlib,
// moreToCome, pipelining order, malformed input and the size cap.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const zlib = require('zlib');
const { BSON } = require('bson');
const { startDouble, rawConnect, opMsg } = require('./helpers');

let d;
before(async () => { d = await startDouble(); });
after(async () => { assert.equal(await d.stop(), 0); });

test('kind 1 document sequences and CRC-32C checksums are accepted', async () => {
  const c = await rawConnect(d.port);
  const r = await c.command({ insert: 'seq', $db: 'w' }, { sequences: [{ id: 'documents', docs: [{ _id: 1 }, { _id: 2 }] }], checksum: true });
  assert.equal(r.n.valueOf(), 2);
  const { msg } = opMsg({ ping: 1, $db: 'admin' }, { checksum: true });
  msg[msg.length - 1] ^= 0xff; // corrupt the checksum
  c.send(msg);
  assert.equal(await c.next(), null);
  assert.equal(await c.closed, true);
});

test('an unknown required flag bit closes the connection; bit 16+ is ignored', async () => {
  const c = await rawConnect(d.port);
  const ok = await c.command({ ping: 1, $db: 'admin' }, { flags: 1 << 20 });
  assert.equal(ok.ok.valueOf(), 1);
  c.send(opMsg({ ping: 1, $db: 'admin' }, { flags: 1 << 5 }).msg);
  assert.equal(await c.next(), null);
});

test('legacy OP_QUERY hello gets an OP_REPLY; other OP_QUERY commands are refused', async () => {
  const c = await rawConnect(d.port);
  const q = (doc, ns = 'admin.$cmd') => {
    const body = Buffer.concat([Buffer.alloc(4), Buffer.from(ns + '\0'), Buffer.from([0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]), BSON.serialize(doc)]);
    const h = Buffer.alloc(16);
    h.writeInt32LE(16 + body.length, 0);
    h.writeInt32LE(77, 4);
    h.writeInt32LE(2004, 12);
    return Buffer.concat([h, body]);
  };
  c.send(q({ isMaster: 1, helloOk: true, compression: ['zlib', 'snappy'] }));
  const r = await c.next();
  assert.equal(r.opCode, 1);
  assert.equal(r.responseTo, 77);
  assert.equal(r.raw.readInt32LE(16), 8);
  assert.equal(r.doc.ismaster, true);
  assert.equal(r.doc.helloOk, true);
  assert.deepEqual(r.doc.compression, ['zlib']);
  c.send(q({ find: 'x' }, 'w.$cmd'));
  const r2 = await c.next();
  assert.equal(r2.doc.code.valueOf(), 352);
  c.close();
});

test('OP_COMPRESSED zlib requests get zlib replies', async () => {
  const c = await rawConnect(d.port);
  const { id, msg } = opMsg({ insert: 'z', documents: [{ _id: 1, s: 'x'.repeat(1000) }], $db: 'w' });
  const body = msg.subarray(16);
  const comp = zlib.deflateSync(body);
  const h = Buffer.alloc(25);
  h.writeInt32LE(25 + comp.length, 0);
  h.writeInt32LE(id, 4);
  h.writeInt32LE(2012, 12);
  h.writeInt32LE(2013, 16);
  h.writeInt32LE(body.length, 20);
  h[24] = 2;
  c.send(Buffer.concat([h, comp]));
  const r = await c.next();
  assert.equal(r.opCode, 2012);
  assert.equal(r.responseTo, id);
  assert.equal(r.raw[24], 2);
  const inner = zlib.inflateSync(r.raw.subarray(25));
  const doc = BSON.deserialize(inner.subarray(5));
  assert.equal(doc.n, 1);
  c.close();
});

test('pipelined requests are answered in order; moreToCome gets no reply', async () => {
  const c = await rawConnect(d.port);
  const msgs = [];
  const ids = [];
  for (let i = 0; i < 50; i++) {
    const m = i % 10 === 5
      ? opMsg({ insert: 'pipe', documents: [{ _id: `w0-${i}` }], writeConcern: { w: 0 }, $db: 'w' }, { flags: 2 })
      : opMsg({ insert: 'pipe', documents: [{ _id: i }], $db: 'w' });
    msgs.push(m.msg);
    if (i % 10 !== 5) ids.push(m.id);
  }
  c.send(Buffer.concat(msgs));
  for (const id of ids) {
    const r = await c.next();
    assert.equal(r.responseTo, id);
  }
  const f = await c.command({ count: 'pipe', $db: 'w' });
  assert.equal(f.n.valueOf(), 50);
  c.close();
});

test('malformed input and oversized messages close the connection; the server lives on', async () => {
  const c = await rawConnect(d.port);
  const junk = Buffer.alloc(40, 0x41);
  junk.writeInt32LE(40, 0);
  junk.writeInt32LE(2013, 12);
  c.send(junk);
  assert.equal(await c.closed, true);
  const c2 = await rawConnect(d.port);
  const big = Buffer.alloc(16);
  big.writeInt32LE(48000001, 0);
  c2.send(big);
  assert.equal(await c2.closed, true);
  const c3 = await rawConnect(d.port);
  assert.equal((await c3.command({ ping: 1, $db: 'admin' })).ok.valueOf(), 1);
  assert.match(d.stderr(), /closing/);
  c3.close();
});

test('exhaustAllowed getMore streams the rest of the cursor with moreToCome, each reply answering the previous one', async () => {
  const c = await rawConnect(d.port);
  const docs = Array.from({ length: 11 }, (_, i) => ({ _id: i }));
  await c.command({ insert: 'exh', documents: docs, $db: 'w' });
  const f = await c.command({ find: 'exh', filter: {}, sort: { _id: 1 }, batchSize: 2, $db: 'w' });
  const seen = f.cursor.firstBatch.map((x) => x._id.valueOf());
  const { id, msg } = opMsg({ getMore: f.cursor.id, collection: 'exh', batchSize: 3, $db: 'w' }, { flags: 1 << 16 });
  c.send(msg);
  let responseTo = id;
  const flags = [];
  for (;;) {
    const r = await c.next();
    assert.ok(r && r !== 'timeout', 'a reply arrives');
    assert.equal(r.responseTo, responseTo, 'each streamed reply answers the previous reply');
    responseTo = r.raw.readInt32LE(4);
    const fl = r.raw.readUInt32LE(16);
    flags.push(fl & 2 ? 'more' : 'last');
    seen.push(...r.doc.cursor.nextBatch.map((x) => x._id.valueOf()));
    if (!(fl & 2)) {
      assert.equal(BigInt(r.doc.cursor.id.toString()), 0n, 'the last reply closes the cursor');
      break;
    }
    assert.notEqual(BigInt(r.doc.cursor.id.toString()), 0n);
  }
  assert.deepEqual(flags, ['more', 'more', 'last']);
  assert.deepEqual(seen, docs.map((x) => x._id));
  // Without exhaustAllowed a getMore gets exactly one reply; the connection is in step.
  const f2 = await c.command({ find: 'exh', filter: {}, batchSize: 2, $db: 'w' });
  const g = opMsg({ getMore: f2.cursor.id, collection: 'exh', batchSize: 3, $db: 'w' });
  c.send(g.msg);
  const one = await c.next();
  assert.equal(one.responseTo, g.id);
  assert.equal(one.raw.readUInt32LE(16) & 2, 0);
  assert.equal(await c.next(300), 'timeout', 'no second reply');
  const p = await c.command({ ping: 1, $db: 'admin' });
  assert.equal(p.ok.valueOf(), 1);
  // An error ends an exhaust request at once, without moreToCome.
  c.send(opMsg({ getMore: f2.cursor.id, collection: 'other', $db: 'w' }, { flags: 1 << 16 }).msg);
  const e = await c.next();
  assert.equal(e.doc.ok.valueOf(), 0);
  assert.equal(e.raw.readUInt32LE(16) & 2, 0);
  // A cursor finished by the first exhaust reply: a single reply.
  const f3 = await c.command({ find: 'exh', filter: {}, batchSize: 9, $db: 'w' });
  const g3 = opMsg({ getMore: f3.cursor.id, collection: 'exh', $db: 'w' }, { flags: 1 << 16 });
  c.send(g3.msg);
  const last = await c.next();
  assert.equal(last.responseTo, g3.id);
  assert.equal(last.raw.readUInt32LE(16) & 2, 0);
  assert.equal(last.doc.cursor.nextBatch.length, 2);
  c.close();
});
