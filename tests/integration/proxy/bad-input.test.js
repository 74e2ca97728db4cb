'use strict';
// Bad input closes only the offending connection. Each case opens a raw socket to the proxy,
// completes a hello, sends one kind of malformed input, and checks:
//   - the proxy closes that socket within a deadline,
//   - the proxy log has a line for that peer (`c<id> 127.0.0.1:<port>: ...`) naming the reason,
//   - a Node.js driver client connected before all cases keeps working (ping and insert before
//     and after each case) and never loses a connection, and an idle raw bystander stays open.

const test = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const { MongoClient } = require('mongodb');
const { BSON } = require('bson');
const H = require('../lib/proxy');

const MESSAGE_TIMEOUT_MS = 1500;
const CLOSE_DEADLINE_MS = 5000;
const DB = H.uniqueDbName('badinput');

let upstream;
let proxy;
let client;
let bystander;
const closedConnections = [];
const heartbeatFailures = [];
let inserted = 0;

test.before(async () => {
  upstream = await H.startUpstream();
  proxy = await H.startProxy({
    upstream: upstream.uri,
    settings: { message_timeout_ms: MESSAGE_TIMEOUT_MS, compressors: 'zlib,zstd,snappy' },
  });
  client = new MongoClient(proxy.uri(), { serverSelectionTimeoutMS: 10000, maxPoolSize: 2 });
  client.on('connectionClosed', (e) => closedConnections.push(e));
  client.on('serverHeartbeatFailed', (e) => heartbeatFailures.push(e));
  await client.connect();
  bystander = await H.WireConn.connect({ port: proxy.port });
  const hello = await bystander.command({ hello: 1, $db: 'admin' });
  assert.equal(hello.ok, 1);
});

async function closeClient() {
  if (bystander) bystander.destroy();
  if (client) {
    await client.db(DB).dropDatabase().catch(() => {});
    await client.close();
    client = null;
  }
}

async function driverWorks(when) {
  const pong = await client.db('admin').command({ ping: 1 });
  assert.equal(pong.ok, 1, `driver ping ${when}`);
  inserted += 1;
  await client.db(DB).collection('alive').insertOne({ _id: inserted, when });
  assert.equal(await client.db(DB).collection('alive').countDocuments(), inserted, `driver insert ${when}`);
}

/**
 * One bad-input case. `send(conn)` writes the bad bytes on a raw connection that has completed
 * a hello (unless `noHello`). `reason` must match the proxy's log line for that peer.
 */
function badInputCase(name, reason, send, { noHello = false, helloDoc, closeDeadlineMs = CLOSE_DEADLINE_MS, minOpenMs = 0 } = {}) {
  test(`bad input: ${name} closes only that connection`, async () => {
    await driverWorks(`before ${name}`);
    const conn = await H.WireConn.connect({ port: proxy.port });
    try {
      if (!noHello) {
        const hello = await conn.command(helloDoc || { hello: 1, $db: 'admin' });
        assert.equal(hello.ok, 1, 'hello before the bad input');
      }
      const sentAt = Date.now();
      await send(conn);
      await conn.waitClosed(closeDeadlineMs);
      const openMs = conn.closedAt - sentAt;
      if (minOpenMs) assert.ok(openMs >= minOpenMs, `closed after ${openMs} ms, before the ${minOpenMs} ms allowed`);
      const peer = `127.0.0.1:${conn.localPort}`;
      const line = await proxy.waitForLog(reason, { needle: peer, timeoutMs: 3000 });
      const peerLines = proxy.logLines(peer);
      assert.ok(
        line,
        `no proxy log line for ${peer} matching ${reason}; lines for that peer:\n${peerLines.join('\n') || '(none)'}`,
      );
      assert.match(line, new RegExp(`\\bc\\d+ ${peer.replace(/\./g, '\\.')}: `), 'log line has the c<id> <peer>: prefix');
    } finally {
      conn.destroy();
    }
    // Everyone else is unaffected.
    await driverWorks(`after ${name}`);
    assert.equal(bystander.closed, false, 'the idle raw bystander connection is still open');
    const pong = await bystander.command({ ping: 1, $db: 'admin' });
    assert.equal(pong.ok, 1, 'bystander ping');
    assert.deepEqual(
      closedConnections.map((e) => `${e.connectionId}:${e.reason}`),
      [],
      'the driver client lost no connection',
    );
    assert.equal(heartbeatFailures.length, 0, 'the driver monitor never failed');
    assert.equal(proxy.exitInfo(), null, 'the proxy is still running');
  });
}

function rawHeader(len, opCode, requestID = H.newRequestId()) {
  return H.header(len, requestID, 0, opCode);
}

// -- framing

badInputCase('a partial header followed by a half-close', /partial|incomplete|truncat|short|mid-?message|middle of|bytes buffered|unexpected (eof|end)/i, async (conn) => {
  await conn.write(Buffer.from([0x30, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00]));
  conn.end(); // half-close: the proxy sees EOF after 10 bytes of a header
});

badInputCase('a length field below 16', /length|size|short|small/i, async (conn) => {
  const h = rawHeader(8, H.OP_MSG);
  await conn.write(Buffer.concat([h, Buffer.alloc(16)]));
});

badInputCase('a length field of zero as the very first bytes (no hello)', /length|size|short|small/i, async (conn) => {
  await conn.write(rawHeader(0, H.OP_MSG));
}, { noHello: true });

badInputCase('a length over 48,000,000', /length|size|large|big|max|limit|48000000|48,000,000/i, async (conn) => {
  // Only the header: the proxy must decide on the header alone, not wait for 48 MB.
  await conn.write(rawHeader(48000001, H.OP_MSG));
});

badInputCase('a negative length', /length|size/i, async (conn) => {
  await conn.write(Buffer.concat([rawHeader(-100, H.OP_MSG), Buffer.alloc(8)]));
});

badInputCase('an unknown opcode', /op-?code|opCode|operation code/i, async (conn) => {
  const body = Buffer.alloc(8);
  await conn.write(Buffer.concat([rawHeader(24, 1234), body]));
});

badInputCase('an unknown opcode as the very first message', /op-?code|opCode|operation code/i, async (conn) => {
  await conn.write(Buffer.concat([rawHeader(20, 2005), Buffer.alloc(4)])); // legacy OP_GET_MORE-ish number
}, { noHello: true });

// -- OP_MSG content

badInputCase('an OP_MSG with an unknown section kind', /section|kind/i, async (conn) => {
  const m = H.opMsg(null, {
    sections: [
      { kind: 0, doc: { ping: 1, $db: 'admin' } },
      { kind: 7, raw: Buffer.from([0x09, 0x00, 0x00, 0x00, 0x78, 0x00, 0x00, 0x00, 0x00]) },
    ],
  });
  await conn.write(m.buf);
});

test('an OP_MSG with an unknown required flag bit is refused (closed, or a well-formed error reply)', async () => {
  await driverWorks('before flag bit');
  const conn = await H.WireConn.connect({ port: proxy.port });
  try {
    assert.equal((await conn.command({ hello: 1, $db: 'admin' })).ok, 1);
    const m = H.opMsg({ ping: 1, $db: 'admin' }, { flags: 1 << 5 });
    await conn.write(m.buf);
    let reply = null;
    try {
      reply = await conn.next({ timeoutMs: CLOSE_DEADLINE_MS });
    } catch (e) {
      assert.ok(conn.closed, `neither a reply nor a close: ${e.message}`);
    }
    if (reply) {
      assert.equal(reply.responseTo, m.requestID);
      assert.equal(reply.doc.ok, 0, 'a ping with an unknown required flag bit must not succeed');
      assert.equal(typeof reply.doc.code, 'number');
      assert.equal(typeof reply.doc.errmsg, 'string');
    } else {
      const line = await proxy.waitForLog(/flag/i, { needle: `127.0.0.1:${conn.localPort}` });
      assert.ok(line, 'closing log line names the flag');
    }
  } finally {
    conn.destroy();
  }
  await driverWorks('after flag bit');
  assert.equal(closedConnections.length, 0, 'the driver client lost no connection');
});

badInputCase('invalid BSON (an element of unknown type)', /bson|document|element|type/i, async (conn) => {
  const doc = Buffer.from(BSON.serialize({ ping: 1, $db: 'admin' }));
  // Second element ($db, type 0x02 string) gets type 0x2a, which BSON does not define.
  const off = 4 + 1 + 'ping'.length + 1 + 4; // size, type, "ping\0", int32
  assert.equal(doc[off], 0x02, 'found the $db element');
  doc[off] = 0x2a;
  await conn.write(H.opMsg(null, { sections: [{ kind: 0, doc }] }).buf);
});

badInputCase('invalid BSON (document size past its section)', /bson|document|size|length|bound|section/i, async (conn) => {
  const doc = Buffer.from(BSON.serialize({ ping: 1, $db: 'admin' }));
  doc.writeInt32LE(doc.length + 64, 0);
  await conn.write(H.opMsg(null, { sections: [{ kind: 0, doc }] }).buf);
});

badInputCase('invalid BSON (a string without its terminating NUL)', /bson|document|string|utf|element/i, async (conn) => {
  const doc = Buffer.from(BSON.serialize({ ping: 1, $db: 'admin', s: 'abc' }));
  // Last element "s": int32 len(4) "abc\0" then the document's 0. Make the string's NUL an 'x'.
  doc[doc.length - 2] = 0x78;
  await conn.write(H.opMsg(null, { sections: [{ kind: 0, doc }] }).buf);
});

badInputCase('a wrong CRC-32C checksum', /checksum|crc/i, async (conn) => {
  await conn.write(H.opMsg({ ping: 1, $db: 'admin' }, { checksum: 'bad' }).buf);
});

badInputCase('a corrupt zlib OP_COMPRESSED', /compress|zlib|inflate|deflate/i, async (conn) => {
  const inner = H.opMsg({ ping: 1, $db: 'admin' });
  const garbage = crypto.randomBytes(40);
  garbage[0] = 0x78; // a zlib header byte, then junk
  garbage[1] = 0x9c;
  await conn.write(H.opCompressed(inner.buf, { compressorId: 2, payload: garbage }).buf);
}, { helloDoc: { hello: 1, compression: ['zlib'], $db: 'admin' } });

badInputCase('an OP_COMPRESSED whose uncompressedSize lies', /compress|size|length|zlib/i, async (conn) => {
  const inner = H.opMsg({ ping: 1, $db: 'admin' });
  const rest = inner.buf.length - 16;
  await conn.write(H.opCompressed(inner.buf, { compressorId: 2, uncompressedSize: rest + 100 }).buf);
}, { helloDoc: { hello: 1, compression: ['zlib'], $db: 'admin' } });

badInputCase('an OP_COMPRESSED with an unknown compressor id', /compress/i, async (conn) => {
  const inner = H.opMsg({ ping: 1, $db: 'admin' });
  await conn.write(H.opCompressed(inner.buf, { compressorId: 9, payload: inner.buf.subarray(16) }).buf);
}, { helloDoc: { hello: 1, compression: ['zlib'], $db: 'admin' } });

// -- timing

badInputCase(
  'half a message, then a stall',
  /timeout|timed out|stall|slow|idle/i,
  async (conn) => {
    const m = H.opMsg({ ping: 1, $db: 'admin', pad: 'x'.repeat(100) });
    await conn.write(m.buf.subarray(0, Math.floor(m.buf.length / 2)));
  },
  { closeDeadlineMs: MESSAGE_TIMEOUT_MS + 4000, minOpenMs: MESSAGE_TIMEOUT_MS - 250 },
);

// -- positive controls: what is valid is not refused

test('positive controls: correct checksum, valid zlib OP_COMPRESSED, kind-1 sequence and pipelining are accepted', { skip: H.rawDataSkipReason() }, async () => {
  const conn = await H.WireConn.connect({ port: proxy.port });
  try {
    const hello = await conn.command({ hello: 1, compression: ['zlib'], $db: 'admin' });
    assert.deepEqual(hello.compression, ['zlib']);
    const c1 = await conn.command({ ping: 1, $db: 'admin' }, { checksum: true });
    assert.equal(c1.ok, 1, 'a message with a correct CRC-32C is accepted');
    const c2 = await conn.request({ ping: 1, $db: 'admin' }, { compress: 'zlib' });
    assert.equal(c2.doc.ok, 1, 'a valid zlib OP_COMPRESSED is accepted');
    const ins = await conn.command(null, {
      sections: [
        { kind: 0, doc: { insert: 'kind1', $db: DB } },
        { kind: 1, identifier: 'documents', docs: [{ _id: 1 }, { _id: 2 }, { _id: 3 }] },
      ],
    });
    assert.equal(ins.ok, 1);
    assert.equal(ins.n, 3, 'kind-1 document sequence forwarded intact');
    // Two requests written back to back get their replies in order.
    const a = H.opMsg({ find: 'kind1', filter: { _id: 1 }, $db: DB });
    const b = H.opMsg({ find: 'kind1', filter: { _id: 3 }, $db: DB });
    await conn.write(Buffer.concat([a.buf, b.buf]));
    const ra = await conn.next();
    const rb = await conn.next();
    assert.equal(ra.responseTo, a.requestID);
    assert.equal(rb.responseTo, b.requestID);
    assert.deepEqual(ra.doc.cursor.firstBatch, [{ _id: 1 }]);
    assert.deepEqual(rb.doc.cursor.firstBatch, [{ _id: 3 }]);
    // A message delivered one byte at a time (well within message_timeout_ms) is fine.
    const slow = H.opMsg({ ping: 1, $db: 'admin' });
    for (let i = 0; i < slow.buf.length; i += 8) {
      await conn.write(slow.buf.subarray(i, i + 8));
      await H.sleep(5);
    }
    const rs = await conn.next();
    assert.equal(rs.responseTo, slow.requestID);
    assert.equal(rs.doc.ok, 1);
  } finally {
    conn.destroy();
  }
});

H.registerFinalChecks(test, [() => upstream && upstream.stop()], { beforeStop: closeClient });
