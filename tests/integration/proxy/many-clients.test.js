'use strict';
// Scale: 2,000 concurrent raw client connections through the proxy. Every one completes a
// hello; 1,800 then sit idle while 200 run pings and per-client finds in a loop for a few
// seconds (each find must return that client's own document: replies are never crossed). Then
// every idle connection answers a ping, all 2,000 close cleanly, and the proxy releases its file
// descriptors (client and paired upstream sockets) back to near its starting count.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const { MongoClient } = require('mongodb');
const H = require('../lib/proxy');

const TOTAL = 2000;
const ACTIVE = 200;
const ACTIVE_SECONDS = 4;
const CONNECT_BATCH = 100;
const DB = H.uniqueDbName('many');

let upstream;
let proxy;
const conns = [];

function fdCount(pid) {
  return fs.readdirSync(`/proc/${pid}/fd`).length;
}

async function inBatches(items, size, fn) {
  const out = [];
  for (let i = 0; i < items.length; i += size) {
    out.push(...(await Promise.all(items.slice(i, i + size).map(fn))));
  }
  return out;
}

test.before(async () => {
  if (H.rawDataSkipReason()) return;
  upstream = await H.startUpstream({ ulimit: 65536 });
  proxy = await H.startProxy({
    upstream: upstream.uri,
    ulimit: 65536,
    settings: { max_clients: 4096 },
  });
  const limits = fs.readFileSync(`/proc/${proxy.pid}/limits`, 'utf8');
  const m = /Max open files\s+(\d+)/.exec(limits);
  assert.ok(m && Number(m[1]) >= 4200, `the proxy's fd limit (${m && m[1]}) allows ~4,100 descriptors`);
  const seed = new MongoClient(proxy.uri(), { serverSelectionTimeoutMS: 10000 });
  await seed.db(DB).collection('mc').insertMany(Array.from({ length: ACTIVE }, (_, i) => ({ _id: i, owner: `client-${i}` })));
  await seed.close();
});

test(`${TOTAL} concurrent connections: all complete a hello, ${ACTIVE} run traffic, all close cleanly`, { timeout: 240000, skip: H.rawDataSkipReason() }, async (t) => {
  const baselineFds = fdCount(proxy.pid);

  // Connect and hello, in batches of CONNECT_BATCH; all stay open.
  const t0 = Date.now();
  await inBatches(Array.from({ length: TOTAL }, (_, i) => i), CONNECT_BATCH, async (i) => {
    const c = await H.WireConn.connect({ port: proxy.port, timeoutMs: 20000 });
    conns[i] = c;
    const hello = await c.command({ hello: 1, $db: 'admin', client: { application: { name: `many-${i}` } } }, { timeoutMs: 20000 });
    assert.equal(hello.ok, 1, `hello #${i}`);
    assert.equal(hello.msg, 'isdbgrid', `hello #${i} persona`);
    assert.ok(!('setName' in hello), `hello #${i} has no setName`);
  });
  const connectMs = Date.now() - t0;
  assert.equal(conns.filter((c) => c && !c.closed).length, TOTAL, 'all connections open after hello');
  const openFds = fdCount(proxy.pid);
  assert.ok(openFds >= baselineFds + TOTAL, `proxy holds at least one fd per client (${openFds} vs baseline ${baselineFds})`);

  // 200 active clients: ping and a find of their own document, in a loop.
  const end = Date.now() + ACTIVE_SECONDS * 1000;
  const counts = await Promise.all(
    conns.slice(0, ACTIVE).map(async (c, i) => {
      let n = 0;
      while (Date.now() < end) {
        const pong = await c.command({ ping: 1, $db: 'admin' }, { timeoutMs: 10000 });
        assert.equal(pong.ok, 1, `ping on active #${i}`);
        const f = await c.command({ find: 'mc', filter: { _id: i }, $db: DB }, { timeoutMs: 10000 });
        assert.equal(f.ok, 1, `find on active #${i}`);
        assert.deepEqual(f.cursor.firstBatch, [{ _id: i, owner: `client-${i}` }], `active #${i} got its own document`);
        n += 2;
      }
      return n;
    }),
  );
  const total = counts.reduce((a, b) => a + b, 0);
  assert.ok(counts.every((n) => n >= 2), 'every active client completed requests');

  // Every idle connection is still open and answers.
  const idle = conns.slice(ACTIVE);
  assert.equal(idle.filter((c) => c.closed).length, 0, 'no idle connection was closed');
  await inBatches(idle, 200, async (c) => {
    const pong = await c.command({ ping: 1, $db: 'admin' }, { timeoutMs: 20000 });
    assert.equal(pong.ok, 1);
  });

  // Close all, cleanly: the client ends, the proxy closes its side, no resets.
  await inBatches(conns, 500, async (c) => {
    c.end();
    const r = await c.waitClosed(20000);
    assert.equal(r.hadError, false, `connection ${c.peer} closed with an error: ${c.error && c.error.message}`);
  });
  const deadline = Date.now() + 20000;
  let fds = fdCount(proxy.pid);
  while (fds > baselineFds + 20 && Date.now() < deadline) {
    await H.sleep(200);
    fds = fdCount(proxy.pid);
  }
  assert.ok(fds <= baselineFds + 20, `proxy released its descriptors: ${fds} now, ${baselineFds} before`);
  assert.equal(proxy.exitInfo(), null, 'proxy still running');
  t.diagnostic(`connect+hello ${TOTAL} in ${connectMs} ms; ${total} requests by ${ACTIVE} active clients in ${ACTIVE_SECONDS} s`);
  // And it still serves new clients.
  const after = new MongoClient(proxy.uri(), { serverSelectionTimeoutMS: 10000 });
  try {
    assert.equal(await after.db(DB).collection('mc').countDocuments(), ACTIVE);
    await after.db(DB).dropDatabase();
  } finally {
    await after.close();
  }
});

H.registerFinalChecks(test, [
  () => conns.forEach((c) => c && c.destroy()),
  () => upstream && upstream.stop(),
]);
