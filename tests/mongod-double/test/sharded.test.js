'use strict';
// The sharded double (--sharded): the startup lines, a mongos's hello, enableSharding,
// shardCollection (range and hashed) and listShards, config.collections/config.chunks, chunks
// spread over the shards, unsharded collections on the database's primary shard, targeted and
// scatter-gather reads merged with sort, skip and limit, getMore through mongos cursors, and the
// Node.js driver and mongosh on a seed list of two mongos. One cluster serves the file; each
// test uses its own database.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { execFile } = require('child_process');
const os = require('os');
const fs = require('fs');
const path = require('path');
const { MongoClient } = require('mongodb');
const { startSharded, rawConnect } = require('./helpers');

const num = (v) => (v === undefined || v === null ? v : Number(v.valueOf()));

let d;
let client;
before(async () => {
  d = await startSharded();
  client = new MongoClient(d.uri(), { serverSelectionTimeoutMS: 5000 });
  await client.connect();
});
after(async () => {
  await client.close();
  assert.equal(await d.stop(), 0);
});

async function raw(port, cmd) {
  const c = await rawConnect(port);
  try {
    return await c.command(cmd);
  } finally {
    c.close();
  }
}

// Documents of `db.coll` on each shard, read from the shard's own primary.
async function perShard(db, coll) {
  const out = {};
  for (const s of d.shards) {
    const r = await raw(s.port, { count: coll, $db: db });
    out[s.name] = num(r.n);
  }
  return out;
}

// How many times each shard's primary ran `name` since the last call (doubleStats reset).
async function shardCounts(name) {
  const out = {};
  for (const s of d.shards) {
    const r = await raw(s.port, { doubleStats: 1, reset: true, $db: 'admin' });
    out[s.name] = num((r.commands && r.commands[name]) || 0);
  }
  return out;
}

test('startup: the mongos ports first, then one `shardNN PRIMARY SECONDARY` line per shard; --shards and --mongos size it', async () => {
  assert.equal(d.mongos.length, 2);
  assert.deepEqual(d.shards.map((s) => s.name), ['shard01', 'shard02']);
  const e = await startSharded(['--shards', '3', '--mongos', '1']);
  try {
    assert.equal(e.mongos.length, 1);
    assert.deepEqual(e.shards.map((s) => s.name), ['shard01', 'shard02', 'shard03']);
    const r = await raw(e.port, { listShards: 1, $db: 'admin' });
    assert.deepEqual(r.shards.map((s) => s.host), e.shards.map((s) => `${s.name}/127.0.0.1:${s.port},127.0.0.1:${s.secondaryPort}`));
  } finally {
    assert.equal(await e.stop(), 0);
  }
});

test('hello: a mongos says isdbgrid and names no set; each shard member is a replica set named after its shard', async () => {
  for (const port of d.mongos) {
    const h = await raw(port, { hello: 1, $db: 'admin' });
    assert.equal(h.msg, 'isdbgrid');
    assert.equal(h.isWritablePrimary, true);
    for (const f of ['setName', 'hosts', 'primary', 'me', 'secondary']) assert.equal(h[f], undefined, f);
    assert.equal(num(h.maxWireVersion), 21);
    assert.ok(h.$clusterTime && h.operationTime, 'a mongos gossips the cluster time');
  }
  for (const s of d.shards) {
    const hp = await raw(s.port, { hello: 1, $db: 'admin' });
    const hs = await raw(s.secondaryPort, { hello: 1, $db: 'admin' });
    assert.equal(hp.setName, s.name);
    assert.equal(hp.isWritablePrimary, true);
    assert.equal(hs.setName, s.name);
    assert.equal(hs.secondary, true);
    assert.deepEqual(hp.hosts, [`127.0.0.1:${s.port}`, `127.0.0.1:${s.secondaryPort}`]);
    assert.equal(hp.msg, undefined);
  }
  // Replica-set commands are not a mongos's.
  const r = await raw(d.port, { replSetGetStatus: 1, $db: 'admin' });
  assert.equal(num(r.code), 59);
});

test('shardCollection hashed: chunks spread evenly over the shards from the start, config.collections and config.chunks list them, documents land on both shards', async () => {
  const admin = client.db('admin');
  await admin.command({ enableSharding: 'hs' });
  const r = await admin.command({ shardCollection: 'hs.orders', key: { _id: 'hashed' } });
  assert.equal(r.collectionsharded, 'hs.orders');
  // Again with the same key: no change, ok.
  await admin.command({ shardCollection: 'hs.orders', key: { _id: 'hashed' } });
  const cfg = client.db('config');
  const coll = await cfg.collection('collections').findOne({ _id: 'hs.orders' });
  assert.deepEqual(coll.key, { _id: 'hashed' });
  assert.equal(coll.unique, false);
  const chunks = await cfg.collection('chunks').find({ uuid: coll.uuid }).sort({ min: 1 }).toArray();
  assert.equal(chunks.length, 4, 'two chunks per shard');
  const byShard = {};
  for (const c of chunks) byShard[c.shard] = (byShard[c.shard] || 0) + 1;
  assert.deepEqual(byShard, { shard01: 2, shard02: 2 });
  const orders = client.db('hs').collection('orders');
  await orders.insertMany(Array.from({ length: 200 }, (_, i) => ({ _id: i, v: i % 10 })));
  const counts = await perShard('hs', 'orders');
  assert.equal(counts.shard01 + counts.shard02, 200);
  assert.ok(counts.shard01 > 50 && counts.shard02 > 50, `both shards hold part: ${JSON.stringify(counts)}`);
  assert.equal(await orders.countDocuments({}), 200);
  assert.equal(await orders.estimatedDocumentCount(), 200);
  const dbs = await cfg.collection('databases').find({ _id: 'hs' }).toArray();
  assert.equal(dbs.length, 1);
  assert.ok(['shard01', 'shard02'].includes(dbs[0].primary));
});

test('shardCollection range: one chunk on the primary shard; split and moveChunk move documents; unsharded collections stay on the primary shard', async () => {
  const admin = client.db('admin');
  await admin.command({ enableSharding: 'rg', primaryShard: 'shard02' });
  await admin.command({ shardCollection: 'rg.items', key: { k: 1 } });
  const items = client.db('rg').collection('items');
  await items.insertMany(Array.from({ length: 20 }, (_, i) => ({ _id: i, k: i })));
  assert.deepEqual(await perShard('rg', 'items'), { shard01: 0, shard02: 20 });
  await admin.command({ split: 'rg.items', middle: { k: 10 } });
  await admin.command({ moveChunk: 'rg.items', find: { k: 15 }, to: 'shard01' });
  assert.deepEqual(await perShard('rg', 'items'), { shard01: 10, shard02: 10 });
  const uuid = (await client.db('config').collection('collections').findOne({ _id: 'rg.items' })).uuid;
  const chunks = await client.db('config').collection('chunks').find({ uuid }).toArray();
  assert.equal(chunks.length, 2);
  const low = chunks.find((c) => c.shard === 'shard02');
  const high = chunks.find((c) => c.shard === 'shard01');
  assert.equal(low.max.k, 10);
  assert.equal(high.min.k, 10);
  assert.equal(low.min.k._bsontype, 'MinKey');
  assert.equal(high.max.k._bsontype, 'MaxKey');
  // Inserts after the move follow the chunks.
  await items.insertOne({ _id: 100, k: 50 });
  assert.deepEqual(await perShard('rg', 'items'), { shard01: 11, shard02: 10 });
  // An unsharded collection of the database lives on its primary shard only.
  await client.db('rg').collection('plain').insertMany([{ a: 1 }, { a: 2 }]);
  assert.deepEqual(await perShard('rg', 'plain'), { shard01: 0, shard02: 2 });
  assert.equal(await client.db('rg').collection('plain').countDocuments(), 2);
  const shards = await admin.command({ listShards: 1 });
  assert.deepEqual(shards.shards.map((s) => s._id), ['shard01', 'shard02']);
  const notAdmin = await raw(d.port, { listShards: 1, $db: 'rg' });
  assert.equal(num(notAdmin.code), 13);
});

test('reads: a shard-key equality goes to one shard, other queries to every shard, merged with sort, skip and limit; getMore pages through the mongos cursor', async () => {
  const admin = client.db('admin');
  await admin.command({ enableSharding: 'rd' });
  await admin.command({ shardCollection: 'rd.c', key: { k: 'hashed' } });
  const c = client.db('rd').collection('c');
  const data = Array.from({ length: 300 }, (_, i) => ({ _id: i, k: i, g: i % 5, s: (i * 37) % 300 }));
  await c.insertMany(data);
  await shardCounts('find');
  // Targeted: one shard runs the find.
  assert.deepEqual(await c.find({ k: 42 }).toArray(), [{ _id: 42, k: 42, g: 2, s: (42 * 37) % 300 }]);
  const t = await shardCounts('find');
  assert.equal(t.shard01 + t.shard02, 1, `one shard: ${JSON.stringify(t)}`);
  // Scatter-gather with the sort, skip and limit applied over the merged result.
  const got = await c.find({ g: { $in: [1, 3] } }).sort({ s: -1 }).skip(7).limit(25).toArray();
  const want = data
    .filter((x) => x.g === 1 || x.g === 3).sort((a, b) => b.s - a.s).slice(7, 32);
  assert.deepEqual(got, want);
  const sc = await shardCounts('find');
  assert.deepEqual(sc, { shard01: 1, shard02: 1 });
  // getMore: small batches through the mongos's own cursor.
  const cursor = c.find({}, { batchSize: 7 }).sort({ _id: 1 });
  const all = await cursor.toArray();
  assert.equal(all.length, 300);
  assert.deepEqual(all.map((x) => x._id), Array.from({ length: 300 }, (_, i) => i));
  // count, distinct, aggregate merged.
  assert.equal(await c.countDocuments({ g: 4 }), 60);
  assert.equal(num((await client.db('rd').command({ count: 'c', query: { g: 0 }, skip: 10, limit: 100 })).n), 50);
  assert.deepEqual(await c.distinct('g'), [0, 1, 2, 3, 4]);
  const agg = await c.aggregate([{ $match: { g: { $gte: 3 } } }, { $group: { _id: '$g', n: { $sum: 1 }, top: { $max: '$s' } } }, { $sort: { _id: 1 } }]).toArray();
  const top = (g) => Math.max(...data.filter((x) => x.g === g).map((x) => x.s));
  assert.deepEqual(agg, [{ _id: 3, n: 60, top: top(3) }, { _id: 4, n: 60, top: top(4) }]);
  // A targeted aggregate runs whole on one shard.
  await shardCounts('aggregate');
  assert.deepEqual(await c.aggregate([{ $match: { k: 7 } }, { $project: { _id: 0, s: 1 } }]).toArray(), [{ s: 259 }]);
  const ta = await shardCounts('aggregate');
  assert.equal(ta.shard01 + ta.shard02, 1);
  // Updates and deletes by shard key, and multi updates over every shard.
  const u = await c.updateMany({ g: 2 }, { $set: { flag: true } });
  assert.equal(u.modifiedCount, 60);
  assert.equal(await c.countDocuments({ flag: true }), 60);
  assert.equal((await c.deleteOne({ k: 5 })).deletedCount, 1);
  assert.equal((await c.deleteMany({ g: 0 })).deletedCount, 59);
  assert.equal(await c.countDocuments(), 240);
});

test('the Node.js driver on a seed list of two mongos sees a sharded topology and works through either router', async () => {
  const desc = client.topology.description;
  assert.equal(desc.type, 'Sharded');
  const types = [...desc.servers.values()].map((s) => s.type);
  assert.deepEqual(types, ['Mongos', 'Mongos']);
  for (const port of d.mongos) {
    const one = new MongoClient(`mongodb://127.0.0.1:${port}/`, { serverSelectionTimeoutMS: 5000 });
    try {
      await one.connect();
      const c = one.db('dr').collection('c');
      await c.insertOne({ port });
      assert.equal(await c.countDocuments({ port }), 1);
    } finally {
      await one.close();
    }
  }
  assert.equal(await client.db('dr').collection('c').countDocuments(), 2);
});

const MONGOSH = path.join(__dirname, '..', '..', 'node_modules', '.bin', 'mongosh');

test('mongosh on the seed list: sh.enableSharding, sh.shardCollection, inserts and sh.status', { skip: !fs.existsSync(MONGOSH) && 'mongosh not installed' }, async () => {
  const home = fs.mkdtempSync(path.join(os.tmpdir(), 'double-mongosh-'));
  const script = `
    sh.enableSharding("ms");
    sh.shardCollection("ms.c", { k: "hashed" });
    db.getSiblingDB("ms").c.insertMany([{ k: 1 }, { k: 2 }, { k: 3 }, { k: 4 }]);
    const st = sh.status();
    print(JSON.stringify({ msg: db.hello().msg, n: db.getSiblingDB("ms").c.countDocuments({}), chunks: db.getSiblingDB("config").chunks.countDocuments({}) > 0 }));`;
  const out = await new Promise((resolve, reject) => {
    execFile(MONGOSH, [d.uri(), '--quiet', '--eval', script],
      { timeout: 60000, encoding: 'utf8', env: { ...process.env, MONGOSH_NO_TELEMETRY: '1', HOME: home } },
      (e, stdout, stderr) => (e ? reject(new Error(`mongosh failed: ${stdout}\n${stderr}`)) : resolve(stdout)));
  });
  fs.rmSync(home, { recursive: true, force: true });
  const last = out.trim().split('\n').pop();
  assert.deepEqual(JSON.parse(last), { msg: 'isdbgrid', n: 4, chunks: true });
});
