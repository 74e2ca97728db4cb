'use strict';
// The process-wide memory bound ([proxy] max_buffered_bytes). 40 clients (the CI size; the full
// size, bench/membound-full, is 200: 8 GB) each send one 40 MB request at once (all written
// before any answer is awaited), with the bound set to 256 MiB, so 1.6 GB is in flight against
// 356 MB allowed:
//   - the proxy's peak RSS (VmHWM) stays under max_buffered_bytes + 100 MB (without the bound
//     it holds every message at once: 1.6 GB at the CI size);
//   - a ping on another connection keeps answering throughout: its slowest answer is at most
//     2 s slower than the slowest of the same pings sent straight to the server meanwhile (the
//     test process writing gigabytes stalls both alike);
//   - every client gets its answer: the request is an unknown command carrying a 40 MB document
//     sequence, which the server (double or real) answers with CommandNotFound once it has read
//     it all, so every byte travels through the proxy;
//   - the proxy logged the start and the end of the backpressure.
// Under a sanitizer build (shadow memory, freed-memory quarantine) RSS says nothing about the
// proxy's buffers: the test then runs 20 clients and checks everything but the RSS bound.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const H = require('../lib/proxy');

const MAX_BUFFERED = 256 * 1024 * 1024;
const RSS_SLACK = 100 * 1024 * 1024;
const MESSAGE_BYTES = 40 * 1000 * 1000;
const DOCS_PER_MESSAGE = 3; // each under mongod's 16 MiB document limit
function isSanitizerBuild(bin) {
  try {
    return /__asan_init|__tsan_init|__msan_init/.test(fs.readFileSync(bin, 'latin1'));
  } catch {
    return false; // no binary: startProxy says so
  }
}
const SANITIZED = isSanitizerBuild(H.proxyBin());
// RELAYBUS_MEMBOUND_CLIENTS sets the count (bench/membound-full: 200).
const CLIENTS = Number(process.env.RELAYBUS_MEMBOUND_CLIENTS || (SANITIZED ? 20 : 40));
const DB = H.uniqueDbName('membound');

let upstream;
let proxy;

test.before(async () => {
  upstream = await H.startUpstream();
  proxy = await H.startProxy({
    upstream: upstream.uri,
    // Four loops in every step: the bound is one budget shared by the loops, and only the
    // plain build (the proxy step, one loop otherwise) checks the RSS.
    settings: { max_buffered_bytes: MAX_BUFFERED, message_timeout_ms: 120000, threads: 4 },
  });
});

/** One OP_MSG of about MESSAGE_BYTES: {rbMemoryBoundProbe: 1} plus a "documents" sequence. */
function bigRequest() {
  const per = Math.floor((MESSAGE_BYTES - 200) / DOCS_PER_MESSAGE);
  const doc = Buffer.alloc(per);
  // {b: BinData(0, ...)} padded to `per` bytes: int32 len, 0x05 "b\0" int32 n, subtype, data, 0.
  const n = per - (4 + 1 + 2 + 4 + 1 + 1);
  doc.writeInt32LE(per, 0);
  doc[4] = 0x05;
  doc[5] = 0x62;
  doc[6] = 0;
  doc.writeInt32LE(n, 7);
  doc[11] = 0;
  doc[per - 1] = 0;
  return H.opMsg(null, {
    sections: [
      { kind: 0, doc: { rbMemoryBoundProbe: 1, $db: DB } },
      { kind: 1, identifier: 'documents', docs: Array.from({ length: DOCS_PER_MESSAGE }, () => doc) },
    ],
  });
}

function vm(pid, field) {
  const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) * 1024 : NaN;
}

test(`${CLIENTS} clients sending one 40 MB request each at once: RSS stays under max_buffered_bytes + 100 MB, pings keep answering, every request is answered`, { timeout: 240000, skip: H.rawDataSkipReason() }, async (t) => {
  const req = bigRequest();
  assert.ok(req.buf.length > MESSAGE_BYTES - 1000 && req.buf.length <= MESSAGE_BYTES, `request is ${req.buf.length} bytes`);
  const pinger = await H.WireConn.connect({ port: proxy.port });
  const conns = [];
  let direct = null;
  try {
    assert.equal((await pinger.command({ hello: 1, $db: 'admin' })).ok, 1);
    for (let i = 0; i < CLIENTS; i++) {
      const c = await H.WireConn.connect({ port: proxy.port, timeoutMs: 20000 });
      conns.push(c);
      assert.equal((await c.command({ hello: 1, $db: 'admin' }, { timeoutMs: 20000 })).ok, 1);
    }
    const baseRss = vm(proxy.pid, 'VmRSS');

    let done = false;
    let maxRss = 0;
    const sampler = setInterval(() => {
      try {
        maxRss = Math.max(maxRss, vm(proxy.pid, 'VmRSS'));
      } catch {
        /* exited: the assertions below say so */
      }
    }, 50);
    // The same pings straight to the server, side by side: what the test process itself (it
    // writes 8 GB) and the server make a ping wait is not the proxy's. Without a port of the
    // server's (a real upstream), none is made and the proxy's pings carry the whole bound.
    direct = upstream.port ? await H.WireConn.connect({ port: upstream.port }) : null;
    const pingLoop = (conn, out, what) => (async () => {
      while (!done) {
        const t0 = Date.now();
        const r = await conn.command({ ping: 1, $db: 'admin' }, { timeoutMs: 10000 });
        assert.equal(r.ok, 1, what);
        out.push(Date.now() - t0);
        await H.sleep(50);
      }
    })();
    const pings = [];
    const directPings = [];
    const pinging = Promise.all([
      pingLoop(pinger, pings, 'ping through the proxy during the flood'),
      direct ? pingLoop(direct, directPings, 'ping to the server during the flood') : null,
    ]);

    const started = Date.now();
    // Every request is written before any answer is awaited (socket.write queues the same buffer).
    const writes = conns.map((c) => c.write(req.buf));
    const answers = conns.map((c) => c.next({ timeoutMs: 200000 }));
    await Promise.all(writes);
    const replies = await Promise.all(answers);
    const elapsedMs = Date.now() - started;
    done = true;
    await pinging;
    clearInterval(sampler);
    const hwm = vm(proxy.pid, 'VmHWM');

    for (const [i, r] of replies.entries()) {
      assert.equal(r.responseTo, req.requestID, `client ${i}: the answer is to its request`);
      assert.equal(r.doc.ok, 0, `client ${i}: an unknown command is refused`);
      assert.equal(r.doc.code, 59, `client ${i}: CommandNotFound (${JSON.stringify(r.doc)})`);
    }
    assert.ok(pings.length >= 3, `pings answered during the flood: ${pings.length}`);
    const worstPing = Math.max(...pings);
    const worstDirect = directPings.length ? Math.max(...directPings) : 0;
    const detail = `${CLIENTS} x ${req.buf.length} bytes in ${elapsedMs} ms; RSS before ${(baseRss / 2 ** 20).toFixed(0)} MiB, sampled max ${(maxRss / 2 ** 20).toFixed(0)} MiB, VmHWM ${(hwm / 2 ** 20).toFixed(0)} MiB; ${pings.length} pings, slowest ${worstPing} ms (straight to the server: ${directPings.length}, slowest ${worstDirect} ms)`;
    t.diagnostic(detail);
    assert.ok(worstPing < worstDirect + 2000, `a ping through the proxy took ${worstPing} ms during the flood, ${worstDirect} ms at most straight to the server (${detail})`);
    if (SANITIZED) {
      t.diagnostic('sanitizer build: the RSS bound is not checked (shadow memory and quarantine)');
    } else {
      assert.ok(hwm < MAX_BUFFERED + RSS_SLACK, `peak RSS ${hwm} bytes exceeds max_buffered_bytes + 100 MB (${detail})`);
    }
    assert.ok(
      await proxy.waitForLog(/memory: .*max_buffered_bytes=/, { timeoutMs: 3000 }),
      'the start of backpressure is logged',
    );
    assert.ok(await proxy.waitForLog(/memory: reading from every client again/, { timeoutMs: 5000 }), 'its end is logged');
  } finally {
    pinger.destroy();
    if (direct) direct.destroy();
    for (const c of conns) c.destroy();
  }
});

H.registerFinalChecks(test, [() => upstream && upstream.stop()]);
