'use strict';
// The outbox on the double's two-shard cluster, through proxies in front of its two mongos.
//  - Set-up ([outbox] shard_collections = auto, the default) shards the collections that grow
//    with the traffic on the keys docs/outbox-schema.md gives, and config.collections lists
//    them; the lanes and the fleet's handlers stay unsharded; `off` shards none.
//  - Publishing and dispatch through two proxies (must-show): writers with random aborts and
//    write conflicts (two writers per key counter), the business collection sharded on a
//    hashed _id with both shards holding part of it, a shard's primary stepped down and one
//    mongos stopped in the middle of the run. Afterwards: every committed business document
//    has its event, no event of an aborted attempt exists, per-key sequences are the key
//    counter's values taken in the same transaction (commit order), a republished event id
//    adds nothing, and every event reached the webhook sink once per handler, each key in
//    sequence order; the writers' errors were all ones a driver retries.
// SHARDED_TXNS (default 240, the CI size) scales the publishing run; bench/sharded-full runs 2,000.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const H = require('../lib/proxy');
const { startDispatchProxy, waitFor, newSecret } = require('../dispatch/helpers');
const { startSink } = require('../dispatch/sink');

const skip = H.doubleOnlySkipReason('a sharded double whose routers and shard primaries can be stopped') || false;
const TXNS = Number(process.env.SHARDED_TXNS || 240);
const OUTBOX = 'relaybus';

async function startCluster() {
  return H.startDouble({ sharded: { shards: 2, mongos: 2 } });
}

async function shardedKeys(direct) {
  const rows = await direct.db('config').collection('collections').find({ _id: new RegExp(`^${OUTBOX}\\.`) }).toArray();
  return Object.fromEntries(rows.map((r) => [r._id.slice(OUTBOX.length + 1), r.key]));
}

test('set-up shards the outbox collections that grow with the traffic, each on its hashed key; shard_collections = off shards none', { skip }, async () => {
  const cluster = await startCluster();
  const direct = new MongoClient(cluster.uri, { serverSelectionTimeoutMS: 5000 });
  const sink = await startSink({});
  const started = [];
  const start = async (o) => {
    const p = await startDispatchProxy(o);
    started.push(p);
    return p;
  };
  try {
    const proxy = await start({
      upstream: cluster.uri,
      outbox: { completion_history: 'true' },
      handlers: [{ name: 'hook', kind: 'webhook', events: '*', url: sink.url('/h') }],
    });
    await waitFor(async () => /store: set up/.test(proxy.log()), 20000, 'the store set-up');
    const keys = await shardedKeys(direct);
    assert.deepEqual(keys, {
      relaybus_events: { _id: 'hashed' },
      relaybus_deliveries: { eventId: 'hashed' },
      relaybus_key_sequences: { _id: 'hashed' },
      relaybus_completed_deliveries: { eventId: 'hashed' },
      relaybus_attempts: { eventId: 'hashed' },
    });
    // Each sharded collection has chunks on both shards from the start.
    for (const ns of Object.keys(keys)) {
      const meta = await direct.db('config').collection('collections').findOne({ _id: `${OUTBOX}.${ns}` });
      const chunks = await direct.db('config').collection('chunks').find({}).toArray();
      const shards = new Set(chunks.filter((c) => c.uuid.equals(meta.uuid)).map((c) => c.shard));
      assert.equal(shards.size, 2, `${ns} has chunks on both shards`);
    }
    // A second set-up (a restart) changes nothing and says nothing is wrong.
    await proxy.stop();
    const again = await start({
      upstream: cluster.uri,
      outbox: { completion_history: 'true' },
      handlers: [{ name: 'hook', kind: 'webhook', events: '*', url: sink.url('/h') }],
    });
    await waitFor(async () => /store: set up/.test(again.log()), 20000, 'the second set-up');
    assert.doesNotMatch(again.log(), /stays unsharded/);
    assert.deepEqual(await shardedKeys(direct), keys);
    await again.stop();

    const off = await start({
      upstream: cluster.uri,
      outbox: { database: 'unsharded', shard_collections: 'off' },
      handlers: [{ name: 'hook', kind: 'webhook', events: '*', url: sink.url('/h') }],
    });
    await waitFor(async () => /store: set up/.test(off.log()), 20000, 'the set-up with shard_collections = off');
    const none = await direct.db('config').collection('collections').countDocuments({ _id: /^unsharded\./ });
    assert.equal(none, 0, 'nothing sharded with shard_collections = off');
    await off.stop();
  } finally {
    for (const p of started) await p.kill();
    await direct.close();
    await sink.close();
    await cluster.stop();
  }
});

// A retryable failure as a driver reads it: a network error, or a label it retries on.
function retryable(e) {
  return ['MongoNetworkError', 'MongoNetworkTimeoutError', 'MongoPoolClearedError', 'MongoServerSelectionError'].includes(e.name) ||
    (typeof e.hasErrorLabel === 'function' &&
      (e.hasErrorLabel('TransientTransactionError') || e.hasErrorLabel('UnknownTransactionCommitResult') || e.hasErrorLabel('RetryableWriteError')));
}

class Aborted extends Error {}

test(`publishing and dispatch through two proxies in front of two mongos: ${TXNS} transactions with aborts and conflicts, a shard step-down and a mongos stopped mid-run`, { skip }, async () => {
  const cluster = await startCluster();
  const direct = new MongoClient(cluster.uri, { serverSelectionTimeoutMS: 10000 });
  const secret = newSecret();
  const sink = await startSink({ secret });
  const proxies = [];
  const clients = [];
  try {
    await direct.db('admin').command({ enableSharding: 'shop' });
    await direct.db('admin').command({ shardCollection: 'shop.items', key: { _id: 'hashed' } });
    await direct.db('admin').command({ shardCollection: 'shop.counters', key: { _id: 'hashed' } });
    for (let i = 0; i < 2; i++) {
      proxies.push(await startDispatchProxy({
        upstream: cluster.uri,
        logLevel: process.env.SHARDED_DEBUG ? 'debug' : 'info',
        handlers: [{ name: 'hook', kind: 'webhook', events: 'order.*', url: sink.url('/hook'), secret }],
      }));
    }
    await waitFor(async () => proxies.every((p) => /store: set up/.test(p.log())), 20000, 'both set-ups');
    for (const p of proxies) {
      const c = new MongoClient(`mongodb://127.0.0.1:${p.port}/`, { serverSelectionTimeoutMS: 3000, maxPoolSize: 8 });
      if (process.env.SHARDED_DEBUG) {
        const i = clients.length;
        c.on('serverDescriptionChanged', (e) => console.error(Date.now() % 100000, `c${i} sdc`, e.newDescription.type, e.newDescription.error && e.newDescription.error.message));
        c.on('serverHeartbeatFailed', (e) => console.error(Date.now() % 100000, `c${i} hbfail`, e.failure && e.failure.message));
      }
      await c.connect();
      clients.push(c);
    }

    const KEYS = 6;
    const WRITERS = 12; // two writers per key counter: their transactions conflict
    const committed = new Map(); // event id -> {key, seq}
    const aborted = new Set();
    const errors = [];
    let started = 0;
    let stepDownDone = false;
    let mongosStopped = false;
    const faults = async () => {
      if (!stepDownDone && started >= TXNS / 3) {
        stepDownDone = true;
        const s = cluster.shards[0];
        const m = new MongoClient(`mongodb://127.0.0.1:${s.port}/?directConnection=true`, { serverSelectionTimeoutMS: 2000 });
        await m.db('admin').command({ replSetStepDown: 5, force: true }).catch(() => {});
        if (process.env.SHARDED_DEBUG) console.error(Date.now() % 100000, 'stepped down');
        await m.close();
      }
      if (!mongosStopped && started >= (2 * TXNS) / 3) {
        mongosStopped = true;
        const m = new MongoClient(`mongodb://127.0.0.1:${cluster.mongos[0]}/?directConnection=true`, { serverSelectionTimeoutMS: 2000 });
        await m.db('admin').command({ shutdown: 1 }).catch(() => {});
        if (process.env.SHARDED_DEBUG) console.error(Date.now() % 100000, 'mongos stopped');
        await m.close();
      }
    };
    const writer = async (w) => {
      // Each writer keeps its client across the faults, as an application does.
      const client = clients[w % 2];
      const items = client.db('shop').collection('items');
      const counters = client.db('shop').collection('counters');
      const key = `k${w % KEYS}`;
      while (started < TXNS) {
        const n = started++;
        if (process.env.SHARDED_DEBUG) console.error(Date.now() % 100000, `txn ${n} w${w}`);
        await faults();
        const ids = [`e${n}-a`, `e${n}-b`].slice(0, 1 + (n % 2));
        const abort = n % 7 === 3;
        let seqs = null;
        const session = client.startSession();
        try {
          await session.withTransaction(async () => {
            const r = await counters.findOneAndUpdate({ _id: key }, { $inc: { v: ids.length } }, { upsert: true, returnDocument: 'after', session });
            const last = Number((r && r.value !== undefined && r.value && typeof r.value === 'object' ? r.value : r).v);
            seqs = ids.map((_, i) => last - ids.length + 1 + i);
            for (let i = 0; i < ids.length; i++) {
              await items.insertOne({ _id: ids[i], key, seq: seqs[i] },
                { session, comment: { relaybus: { type: 'order.placed', id: ids[i], key, payload: { n } } } });
            }
            if (abort) throw new Aborted('the application aborts');
          });
          ids.forEach((id, i) => committed.set(id, { key, seq: seqs[i] }));
        } catch (e) {
          if (e instanceof Aborted) ids.forEach((id) => aborted.add(id));
          else {
            e.writer = w;
            errors.push(e);
            if (process.env.SHARDED_DEBUG) console.error('ERR', e.name, e.message);
          }
        } finally {
          await session.endSession().catch(() => {});
        }
      }
    };
    await Promise.all(Array.from({ length: WRITERS }, (_, w) => writer(w)));
    if (process.env.SHARDED_DEBUG) console.error('writers done', errors.length);
    assert.ok(stepDownDone && mongosStopped, 'both faults ran mid-run');
    // withTransaction retries what a driver retries; what it gave up on must be of that kind.
    for (const e of errors) assert.ok(retryable(e), `an error a driver retries: ${e.name} ${e.code} ${e.message}`);
    // An attempt that failed with a retryable error may or may not have committed (an unknown
    // commit result): its ids are checked against the business documents, not assumed.
    const items = await direct.db('shop').collection('items').find({}).toArray();
    const byId = new Map(items.map((d) => [d._id, d]));
    for (const id of committed.keys()) assert.ok(byId.has(id), `committed ${id} is stored`);
    for (const id of aborted) assert.ok(!byId.has(id), `aborted ${id} left no business document`);
    // Both shards hold part of the business collection.
    const perShard = [];
    for (const s of cluster.shards) {
      const m = new MongoClient(`mongodb://127.0.0.1:${s.secondaryPort}/?directConnection=true`, { serverSelectionTimeoutMS: 2000 });
      perShard.push(await m.db('shop').collection('items').countDocuments({}, { readPreference: 'secondaryPreferred' }).catch(() => -1));
      await m.close();
    }

    // The publish contract over what the business collection holds.
    const events = await direct.db(OUTBOX).collection('relaybus_events').find({}).toArray();
    const evById = new Map(events.map((e) => [e._id, e]));
    assert.equal(events.length, items.length, 'one event per committed business document, none of an aborted attempt');
    for (const d of items) {
      const e = evById.get(d._id);
      assert.ok(e, `event ${d._id} is stored with its business write`);
      assert.equal(e.key, d.key);
      assert.equal(Number(e.sequence), d.seq, `event ${d._id}: its key's sequence is the counter value of its transaction`);
    }
    const counters = await direct.db('shop').collection('counters').find({}).toArray();
    for (const c of counters) {
      const seqs = events.filter((e) => e.key === c._id).map((e) => Number(e.sequence)).sort((a, b) => a - b);
      assert.deepEqual(seqs, Array.from({ length: c.v }, (_, i) => i + 1), `key ${c._id}: sequences 1..${c.v}, no gap`);
    }

    // Idempotent by event id: publishing committed ids again adds nothing, through a writer's
    // client, which went on after the stop.
    const again = [...committed.keys()].slice(0, 5);
    const replayer = clients[0];
    const s2 = replayer.startSession();
    await s2.withTransaction(async () => {
      for (const id of again) {
        const c = committed.get(id);
        await replayer.db('shop').collection('replays').insertOne({ _id: id },
          { session: s2, comment: { relaybus: { type: 'order.placed', id, key: c.key, payload: {} } } });
      }
    });
    await s2.endSession();
    assert.equal(await direct.db(OUTBOX).collection('relaybus_events').countDocuments({}), events.length);

    // Every event reaches the sink, each key in sequence order.
    await waitFor(async () => events.every((e) => sink.stats().ok.has(e._id)), Math.max(60000, TXNS * 100), 'every event at the sink');
    assert.deepEqual(sink.stats().seqViolations, []);
    assert.equal(sink.stats().badSignatures, 0);
    assert.ok(perShard.every((n) => n > 0), `both shards hold business documents: ${perShard}`);
    for (const c of clients) await c.close();
    // Each proxy exits on SIGTERM and logged no sanitizer report (stop() checks both).
    for (const p of proxies) await p.stop();
  } finally {
    for (const c of clients) await c.close().catch(() => {});
    for (const p of proxies) await p.kill();
    await direct.close();
    await sink.close();
    await cluster.stop();
  }
});
