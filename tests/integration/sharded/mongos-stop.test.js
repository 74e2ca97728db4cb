'use strict';
// A driver client of the proxy goes on when the mongos its connections are paired with stops.
// The proxy sits in front of the two mongos of the double's sharded cluster; one client runs a
// steady stream of writes and reads, with its server monitor at the driver's default heartbeat,
// the paired mongos stops, and the same client's operations must go through the proxy again
// within a few seconds (errors a driver retries are allowed meanwhile). The monitor's idle
// connection must not be closed under it: the Node.js driver checks the server at once when an
// operation fails, on that connection, and one closed at that instant left the monitor waiting
// out connectTimeoutMS with the client's pool paused (in about half the stops). Five rounds, a
// cluster each, so that shows. MONGOS_STOP_ROUNDS changes the count; MONGOS_STOP_DEBUG=1 logs
// each round's recovery time and runs the proxy at the debug level.
// Double-only: it stops one router of the cluster.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const H = require('../lib/proxy');
const { countsOf, stopMongos } = require('./helpers');

const skip = H.doubleOnlySkipReason('a sharded double whose routers can be stopped') || false;
const ROUNDS = Number(process.env.MONGOS_STOP_ROUNDS || 5);
// How long after the stop the client must be writing again through the proxy.
const RECOVER_MS = 5000;

async function startCluster(mongos) {
  const d = await H.startDouble({ sharded: { shards: 2, mongos } });
  const c = new MongoClient(d.uri, { serverSelectionTimeoutMS: 5000 });
  try {
    await c.db('admin').command({ enableSharding: 'ms' });
    await c.db('admin').command({ shardCollection: 'ms.items', key: { _id: 'hashed' } });
  } finally {
    await c.close();
  }
  return d;
}



// One round on a cluster of its own: a client with a steady stream of operations, the mongos
// it is paired with stops, and the time from the stop to the client's first operation that
// went through afterwards is below RECOVER_MS.
async function round(n, mode) {
  const cluster = await startCluster(2);
  const proxy = await H.startProxy({ upstream: cluster.uri, settings: { log_level: process.env.MONGOS_STOP_DEBUG ? 'debug' : 'info' } });
  // The driver's default heartbeat (10 s): the monitor's connection is idle at the stop, as it
  // nearly always is; serverSelectionTimeoutMS above RECOVER_MS so a stall shows as a late
  // success or a selection error, not as a quick give-up.
  const client = new MongoClient(proxy.uri(), { serverSelectionTimeoutMS: 10000, maxPoolSize: 4, serverMonitoringMode: mode });
  const events = [];
  const t0 = Date.now();
  for (const ev of ['serverHeartbeatStarted', 'serverHeartbeatFailed', 'serverHeartbeatSucceeded', 'serverDescriptionChanged']) {
    client.on(ev, (e) => events.push(`${Date.now() - t0} ${ev} ${(e.failure && e.failure.message) || (e.newDescription && e.newDescription.type) || ''}`));
  }
  const coll = client.db('ms').collection('items');
  let stopAt = null;
  let firstAfter = null;
  const errors = [];
  let running = true;
  const worker = async (w) => {
    for (let i = 0; running; i++) {
      const started = Date.now();
      try {
        await coll.insertOne({ _id: `w${w}-${i}` });
        await coll.findOne({ _id: `w${w}-${i}` });
        if (stopAt !== null && started > stopAt && firstAfter === null) firstAfter = Date.now();
      } catch (e) {
        // What the stop may cost an operation: errors a driver retries on another attempt.
        errors.push(`${Date.now() - t0} ${e.name}: ${e.message}`);
        if (!['MongoNetworkError', 'MongoPoolClearedError', 'MongoServerSelectionError', 'MongoNetworkTimeoutError'].includes(e.name)) throw e;
      }
    }
  };
  let workers = [];
  try {
    await client.connect();
    await countsOf(cluster.mongos, 'insert');
    await coll.insertOne({ _id: 'warm' });
    const counts = await countsOf(cluster.mongos, 'insert');
    const paired = counts.findIndex((c) => c > 0);
    assert.ok(paired >= 0 && counts[1 - paired] === 0, `one mongos counted the warm-up insert: ${counts}`);
    workers = Array.from({ length: 3 }, (_, w) => worker(w));
    // A few operations, and the monitor's first hellos done, before the stop.
    await H.sleep(800);
    events.push(`${Date.now() - t0} stop mongos ${paired}`);
    await stopMongos(cluster.mongos[paired]);
    // From here on, an operation that starts cannot reach the stopped mongos.
    stopAt = Date.now();
    while (firstAfter === null && Date.now() < stopAt + RECOVER_MS) await H.sleep(20);
    assert.ok(firstAfter !== null, `round ${n} (${mode}): no operation went through within ${RECOVER_MS} ms of the stop\n` +
      `errors:\n${errors.join('\n')}\nevents:\n${events.join('\n')}\nproxy log:\n${proxy.log().slice(-3000)}`);
    if (process.env.MONGOS_STOP_DEBUG) console.error(`round ${n} (${mode}): an operation went through ${firstAfter - stopAt} ms after the stop`);
    running = false;
    await Promise.all(workers);
  } finally {
    running = false;
    await Promise.allSettled(workers);
    await client.close();
    await H.stopAllAndCheck();
    await cluster.stop();
  }
}

// The proxy's hello has no topologyVersion, so `auto` polls as `poll` does; both are run.
test(`the paired mongos stops, in ${ROUNDS} rounds: each time the same client's operations go through the proxy within ${RECOVER_MS} ms`, { skip }, async () => {
  for (let n = 0; n < ROUNDS; n++) await round(n, n % 2 ? 'poll' : 'auto');
});

H.registerFinalChecks(test);
