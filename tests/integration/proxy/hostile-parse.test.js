'use strict';
// Hostile parsing: one client must not be able to stall the proxy for the others.
//   - An OP_MSG whose body holds eight million tiny elements beside 64 one-document sequences,
//     zlib-compressed to a few KB, with its last body key equal to an identifier (so the proxy
//     must check every key, then refuses it): a ping on another connection keeps answering in
//     under 50 ms while the proxy decompresses and checks it, and the hostile connection is
//     closed with a logged reason. Checking keys against identifiers pairwise took seconds.
//   - OP_COMPRESSED with a compressor this connection did not negotiate in its hello (or that
//     the compressors setting does not offer, or no longer lists after a reload) is refused
//     before anything is inflated; noop and the negotiated compressor keep working.

const test = require('node:test');
const assert = require('node:assert/strict');
const zlib = require('node:zlib');
const H = require('../lib/proxy');

const PING_BOUND_MS = 50;
const ELEMENTS = 8000000; // 2 bytes each (type null, empty key): a 16 MB body, under mongod's 16 MiB + 16 KiB
const SEQUENCES = 64;

let upstream;
let proxy;

test.before(async () => {
  upstream = await H.startUpstream();
  proxy = await H.startProxy({ upstream: upstream.uri, settings: { compressors: 'snappy,zlib' } });
});

/** The hostile OP_MSG: body {"": null x ELEMENTS, "s63": null}, then sequences s00..s63. */
function hostileMessage() {
  const ids = Array.from({ length: SEQUENCES }, (_, i) => `s${String(i).padStart(2, '0')}`);
  const last = ids[SEQUENCES - 1];
  const bodyLen = 4 + 2 * ELEMENTS + (1 + last.length + 1) + 1;
  const body = Buffer.alloc(bodyLen); // zero-filled: the empty keys' NULs are already there
  body.writeInt32LE(bodyLen, 0);
  for (let i = 0; i < ELEMENTS; i++) body[4 + 2 * i] = 0x0a; // type null, key ""
  let off = 4 + 2 * ELEMENTS;
  body[off++] = 0x0a;
  off += body.write(last + '\0', off, 'latin1');
  assert.equal(off, bodyLen - 1);
  const emptyDoc = Buffer.from([5, 0, 0, 0, 0]);
  const sections = [{ kind: 0, doc: body }, ...ids.map((identifier) => ({ kind: 1, identifier, docs: [emptyDoc] }))];
  return H.opMsg(null, { sections });
}

test('a message of millions of tiny elements and 64 sequences does not hold up a ping on another connection', async () => {
  const inner = hostileMessage();
  const hostile = H.opCompressed(inner.buf, { compressorId: H.COMPRESSOR_IDS.zlib });
  assert.ok(hostile.buf.length < 100000, `compressed to ${hostile.buf.length} bytes`);

  const pinger = await H.WireConn.connect({ port: proxy.port });
  const attacker = await H.WireConn.connect({ port: proxy.port });
  try {
    assert.equal((await pinger.command({ hello: 1, $db: 'admin' })).ok, 1);
    const hello = await attacker.command({ hello: 1, compression: ['zlib'], $db: 'admin' });
    assert.deepEqual(hello.compression, ['zlib']);
    // Warm up: the first pings pay for connection set-up on both sides.
    for (let i = 0; i < 5; i++) assert.equal((await pinger.command({ ping: 1, $db: 'admin' })).ok, 1);

    const rtts = [];
    let stopAt = Infinity;
    const pinging = (async () => {
      while (Date.now() < stopAt) {
        const t0 = process.hrtime.bigint();
        const r = await pinger.command({ ping: 1, $db: 'admin' }, { timeoutMs: 30000 });
        rtts.push(Number(process.hrtime.bigint() - t0) / 1e6);
        assert.equal(r.ok, 1);
      }
    })();
    await H.sleep(20);
    const sentAt = Date.now();
    await attacker.write(hostile.buf);
    await attacker.waitClosed(10000);
    const closedAfterMs = attacker.closedAt - sentAt;
    // Keep pinging a little after the close: whatever the proxy still does with it is covered.
    stopAt = Date.now() + 200;
    await pinging;

    const peer = `127.0.0.1:${attacker.localPort}`;
    const line = await proxy.waitForLog(/also a field of the body/, { needle: peer, timeoutMs: 3000 });
    assert.ok(line, `the close of ${peer} is logged with its reason; lines:\n${proxy.logLines(peer).join('\n')}`);
    assert.ok(rtts.length >= 5, `pings answered while the message was handled: ${rtts.length}`);
    const worst = Math.max(...rtts);
    assert.ok(
      worst < PING_BOUND_MS,
      `slowest ping ${worst.toFixed(1)} ms (bound ${PING_BOUND_MS} ms; ${rtts.length} pings; hostile connection closed after ${closedAfterMs} ms)`,
    );
    assert.equal((await pinger.command({ ping: 1, $db: 'admin' })).ok, 1, 'the pinger still works');
  } finally {
    pinger.destroy();
    attacker.destroy();
  }
});

/** Opens a raw connection whose hello asks for `compression` (omitted when null). */
async function helloWith(compression) {
  const conn = await H.WireConn.connect({ port: proxy.port });
  const doc = { hello: 1, $db: 'admin' };
  if (compression) doc.compression = compression;
  const hello = await conn.command(doc);
  assert.equal(hello.ok, 1);
  return { conn, hello };
}

async function expectRefused(conn, compress, reason) {
  const m = H.opMsg({ ping: 1, $db: 'admin' });
  await conn.write(H.opCompressed(m.buf, { compressorId: H.COMPRESSOR_IDS[compress] }).buf);
  await conn.waitClosed(5000);
  const peer = `127.0.0.1:${conn.localPort}`;
  const line = await proxy.waitForLog(reason, { needle: peer, timeoutMs: 3000 });
  assert.ok(line, `close of ${peer} logged matching ${reason}; lines:\n${proxy.logLines(peer).join('\n')}`);
}

test('OP_COMPRESSED with a compressor the hello did not negotiate is refused; noop and the negotiated one work', async () => {
  const bystander = await H.WireConn.connect({ port: proxy.port });
  const opened = [bystander];
  try {
    assert.equal((await bystander.command({ hello: 1, $db: 'admin' })).ok, 1);

    // Negotiated snappy only: a zlib request is refused, though the proxy offers zlib too.
    const a = await helloWith(['snappy']);
    opened.push(a.conn);
    assert.deepEqual(a.hello.compression, ['snappy']);
    await expectRefused(a.conn, 'zlib', /zlib.*not negotiated/);

    // No compression asked for at all.
    const b = await helloWith(null);
    opened.push(b.conn);
    assert.equal(b.hello.compression, undefined);
    await expectRefused(b.conn, 'zlib', /zlib.*not negotiated/);

    // zstd asked for, but the compressors setting does not offer it: nothing negotiated.
    const c = await helloWith(['zstd']);
    opened.push(c.conn);
    assert.equal(c.hello.compression, undefined, 'zstd is not offered');
    await expectRefused(c.conn, 'zlib', /not negotiated/);

    // Positive controls: the negotiated compressor and noop are accepted on the same connection.
    const d = await helloWith(['zlib']);
    opened.push(d.conn);
    assert.deepEqual(d.hello.compression, ['zlib']);
    const z = await d.conn.request({ ping: 1, $db: 'admin' }, { compress: 'zlib' });
    assert.equal(z.doc.ok, 1, 'zlib, negotiated, is accepted');
    const n = await d.conn.request({ ping: 1, $db: 'admin' }, { compress: 'noop' });
    assert.equal(n.doc.ok, 1, 'noop is accepted');

    assert.equal(bystander.closed, false, 'the bystander is still open');
    assert.equal((await bystander.command({ ping: 1, $db: 'admin' })).ok, 1, 'bystander ping');
  } finally {
    for (const c of opened) c.destroy();
  }
});

test('a compressor the compressors setting no longer lists after a reload is refused on connections that negotiated it', async () => {
  const fs = require('node:fs');
  const own = await H.startProxy({ upstream: upstream.uri, settings: { compressors: 'snappy,zlib' } });
  const conn = await H.WireConn.connect({ port: own.port });
  try {
    const hello = await conn.command({ hello: 1, compression: ['zlib'], $db: 'admin' });
    assert.deepEqual(hello.compression, ['zlib']);
    assert.equal((await conn.request({ ping: 1, $db: 'admin' }, { compress: 'zlib' })).doc.ok, 1, 'zlib before the reload');
    const ini = fs.readFileSync(own.iniPath, 'utf8');
    assert.match(ini, /^compressors = snappy,zlib$/m);
    fs.writeFileSync(own.iniPath, ini.replace(/^compressors = .*$/m, 'compressors = snappy'));
    own.child.kill('SIGHUP');
    assert.ok(await own.waitForLog(/reloaded /, { timeoutMs: 5000 }), 'the reload is logged');
    const m = H.opMsg({ ping: 1, $db: 'admin' });
    await conn.write(H.opCompressed(m.buf, { compressorId: H.COMPRESSOR_IDS.zlib }).buf);
    await conn.waitClosed(5000);
    const peer = `127.0.0.1:${conn.localPort}`;
    const line = await own.waitForLog(/zlib.*not in the compressors setting/, { needle: peer, timeoutMs: 3000 });
    assert.ok(line, `close of ${peer} logged; lines:\n${own.logLines(peer).join('\n')}`);
  } finally {
    conn.destroy();
  }
});

H.registerFinalChecks(test, [() => upstream && upstream.stop()]);
