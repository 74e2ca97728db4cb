'use strict';
// Pooled mode at scale: 5,000 raw client connections through pool_size = 16. Every one
// completes a hello (answered by the proxy); 500 of them then run finds in a loop for a few
// seconds, each find checked to return that client's own document (replies are never
// crossed between the clients that share a pooled connection), while the other 4,500 sit
// idle. Meanwhile the server never has more than the 16 pool connections open (counted by
// their appName, "relaybus-proxy pool", in currentOp with $all, which lists idle connections
// too; the proxy's monitoring and store clients open theirs when they need them, so the
// server's total is no measure of the pool). Then every idle connection answers a ping and a
// find (each on a pooled connection lent for it), and all 5,000 close. RELAYBUS_POOL_CLIENTS
// and RELAYBUS_POOL_BUSY change the sizes.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const H = require('../lib/proxy');

const TOTAL = Number(process.env.RELAYBUS_POOL_CLIENTS || 5000);
const BUSY = Number(process.env.RELAYBUS_POOL_BUSY || 500);
const POOL = 16;
const BUSY_SECONDS = 4;
const BATCH = 250;
const DB = H.uniqueDbName('poolscale');
// No skip against a real upstream: the pool logs in with its credentials, so raw clients need none
// (no auth_file); the count assumes nothing else connects to that server meanwhile.
const skip = false;

// The server's open connections from the proxy's pool.
async function poolConnections(direct) {
  const r = await direct.db('admin').command({ currentOp: 1, $all: true });
  return r.inprog.filter((op) => op.appName === 'relaybus-proxy pool').length;
}

async function inBatches(items, size, fn) {
  const out = [];
  for (let i = 0; i < items.length; i += size) out.push(...(await Promise.all(items.slice(i, i + size).map(fn))));
  return out;
}

test(`${TOTAL} client connections, ${BUSY} busy, over pool_size = ${POOL}: every request answered, the server sees the pool only`, { skip, timeout: 300000 }, async () => {
  const upstream = await H.startUpstream({ ulimit: 65536 });
  const proxy = await H.startProxy({
    upstream: upstream.uri,
    ulimit: 65536,
    settings: { pool_mode: 'pooled', pool_size: POOL, max_clients: TOTAL + 100, pool_wait_timeout_ms: 30000 },
  });
  const direct = new MongoClient(upstream.directUri, { maxPoolSize: 1 });
  const conns = [];
  let errors = 0;
  let answered = 0;
  try {
    await direct.db(DB).collection('own').insertMany(Array.from({ length: TOTAL }, (_, i) => ({ _id: i, owner: `client-${i}` })));

    const ids = Array.from({ length: TOTAL }, (_, i) => i);
    await inBatches(ids, BATCH, async (i) => {
      const c = await H.WireConn.connect({ port: proxy.port, timeoutMs: 20000 });
      conns[i] = c;
      const hello = await c.command({ hello: 1, $db: 'admin' }, { timeoutMs: 20000 });
      assert.equal(hello.ok, 1);
    });

    let maxSeen = 0;
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        maxSeen = Math.max(maxSeen, await poolConnections(direct));
        await H.sleep(100);
      }
    })();
    const deadline = Date.now() + BUSY_SECONDS * 1000;
    await Promise.all(
      ids.slice(0, BUSY).map(async (i) => {
        while (Date.now() < deadline) {
          const r = await conns[i].command({ find: 'own', filter: { _id: i }, $db: DB }, { timeoutMs: 30000 });
          if (r.ok !== 1 || r.cursor.firstBatch.length !== 1 || r.cursor.firstBatch[0].owner !== `client-${i}`) errors++;
          else answered++;
        }
      }),
    );
    sampling = false;
    await sampler;
    assert.equal(errors, 0, 'every busy find returned its own client\'s document');
    assert.ok(answered >= BUSY, `${answered} finds answered`);
    assert.ok(maxSeen > 0 && maxSeen <= POOL, `the server saw ${maxSeen} connections of the pool at once (pool_size ${POOL})`);

    // The idle ones: a ping and a find each (the server answers both, on a lent connection).
    await inBatches(ids.slice(BUSY), BATCH, async (i) => {
      const ping = await conns[i].command({ ping: 1, $db: 'admin' }, { timeoutMs: 20000 });
      assert.equal(ping.ok, 1);
      const r = await conns[i].command({ find: 'own', filter: { _id: i }, $db: DB }, { timeoutMs: 30000 });
      assert.equal(r.cursor.firstBatch[0].owner, `client-${i}`);
    });
    const after = await poolConnections(direct);
    assert.ok(after <= POOL, `after every client ran: ${after} server connections of the pool`);
  } finally {
    for (const c of conns) if (c) c.destroy();
    await direct.close();
    await proxy.stop();
    proxy.assertNoSanitizerReports();
    await upstream.stop();
  }
});
