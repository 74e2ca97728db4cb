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
const { MongoClient, Long } = require('mongodb');
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
    // Either member answers (the secondary reads the committed data), also after a step-down.
    const r = await raw(s.port, { count: coll, $db: db, $readPreference: { mode: 'primaryPreferred' } });
    out[s.name] = num(r.n);
  }
  return out;
}

// How many times each shard's primary ran `name` (or each of the names given in an array) since
// the last call (doubleStats reset: one call reads every name it needs).
async function shardCounts(name) {
  const names = Array.isArray(name) ? name : [name];
  const out = {};
  for (const n of names) out[n] = {};
  for (const s of d.shards) {
    const r = await raw(s.port, { doubleStats: 1, reset: true, $db: 'admin' });
    for (const n of names) out[n][s.name] = num((r.commands && r.commands[n]) || 0);
  }
  return Array.isArray(name) ? out : out[name];
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

test('getParameter transactionLifetimeLimitSeconds: a shard member answers it, a mongos has no such option', async () => {
  const m = await raw(d.port, { getParameter: 1, transactionLifetimeLimitSeconds: 1, $db: 'admin' });
  assert.equal(num(m.ok), 0);
  assert.equal(num(m.code), 72);
  const s = await raw(d.shards[0].port, { getParameter: 1, transactionLifetimeLimitSeconds: 1, $db: 'admin' });
  assert.equal(num(s.transactionLifetimeLimitSeconds), 60);
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

// ---- the constraints a sharded collection adds (mongod 7.0's codes and messages) ----

async function keyed(db, key, extra = {}) {
  await client.db('admin').command({ enableSharding: db, primaryShard: 'shard01' });
  await client.db('admin').command({ shardCollection: `${db}.c`, key, ...extra });
  return client.db(db).collection('c');
}

test('unique indexes must start with the shard key: createIndexes 67, shardCollection over an existing one 72; _id and key-prefixed ones are fine', async () => {
  const c = await keyed('cu', { k: 1 });
  await assert.rejects(c.createIndex({ email: 1 }, { unique: true }), (e) => e.code === 67 && e.codeName === 'CannotCreateIndex' &&
    e.message === 'cannot create unique index over { email: 1 } with shard key pattern { k: 1 }');
  await c.createIndex({ k: 1, email: 1 }, { unique: true });
  await c.createIndex({ email: 1 }); // not unique: any key
  const names = (await c.indexes()).map((i) => i.name).sort();
  assert.deepEqual(names, ['_id_', 'email_1', 'k_1', 'k_1_email_1']);
  // A collection with a unique index on another field cannot be sharded on k.
  const other = client.db('cu').collection('other');
  await other.createIndex({ email: 1 }, { unique: true });
  await assert.rejects(client.db('admin').command({ shardCollection: 'cu.other', key: { k: 1 } }), (e) => e.code === 72 && e.codeName === 'InvalidOptions' &&
    e.message === "can't shard collection 'cu.other' with unique index on { email: 1 } and proposed shard key { k: 1 }. Uniqueness can't be maintained unless shard key is a prefix");
  // A hashed key cannot be declared unique.
  await assert.rejects(client.db('admin').command({ shardCollection: 'cu.h', key: { k: 'hashed' }, unique: true }), (e) => e.code === 72);
  // Bad key values: 2 BadValue.
  await assert.rejects(client.db('admin').command({ shardCollection: 'cu.bad', key: { k: -1 } }), (e) => e.code === 2);
});

test('upserts need an equality on the full shard key (61), or on _id as 7.0 accepts; the upserted document lands on the shard its key names', async () => {
  const c = await keyed('cp', { k: 1 });
  await client.db('admin').command({ split: 'cp.c', middle: { k: 100 } });
  await client.db('admin').command({ moveChunk: 'cp.c', find: { k: 100 }, to: 'shard02' });
  await assert.rejects(c.updateOne({ name: 'x' }, { $set: { k: 5 } }, { upsert: true }), (e) => e.code === 61 && e.codeName === 'ShardKeyNotFound' &&
    e.message === 'Failed to target upsert by query :: could not extract exact shard key');
  await assert.rejects(c.findOneAndUpdate({ name: 'x' }, { $set: { k: 5 } }, { upsert: true }), (e) => e.code === 61 &&
    e.message === 'Query for sharded findAndModify must contain the shard key');
  // Full shard key: targeted upsert.
  const r1 = await c.updateOne({ k: 150 }, { $set: { name: 'a' } }, { upsert: true });
  assert.equal(r1.upsertedCount, 1);
  // _id equality (7.0): matched on whichever shard holds it, else inserted where its key goes.
  const r2 = await c.updateOne({ _id: 'u1' }, { $set: { k: 7 } }, { upsert: true });
  assert.equal(r2.upsertedCount, 1);
  const r3 = await c.updateOne({ _id: 'u1' }, { $set: { name: 'b' } }, { upsert: true });
  assert.equal(r3.matchedCount, 1);
  assert.equal(r3.upsertedCount, 0);
  const f = await c.findOneAndUpdate({ _id: 'u2' }, { $set: { k: 300 } }, { upsert: true, returnDocument: 'after' });
  assert.deepEqual(f, { _id: 'u2', k: 300 });
  assert.deepEqual(await perShard('cp', 'c'), { shard01: 1, shard02: 2 });
  assert.equal(await c.countDocuments({ _id: 'u1' }), 1);
});

test('single-document updateOne, deleteOne and findAndModify need the shard key or (but findAndModify) an _id equality, as before 7.1: 72 and 61', async () => {
  const c = await keyed('cs', { k: 'hashed' });
  await c.insertMany(Array.from({ length: 20 }, (_, i) => ({ _id: i, k: i, g: i % 2 })));
  await assert.rejects(c.updateOne({ g: 1 }, { $set: { x: 1 } }), (e) => e.code === 72 && e.codeName === 'InvalidOptions' &&
    e.message.startsWith('A {multi:false} update on a sharded collection must contain an exact match on _id (and have the collection default collation) or target a single shard (and have the simple collation), but this update targeted 2 shards. Update request: { q: { g: 1 }, u: { $set: { x: 1 } }, multi: false, upsert: false }, shard key pattern: { k: "hashed" }'));
  await assert.rejects(c.deleteOne({ g: 1 }), (e) => e.code === 61 && e.codeName === 'ShardKeyNotFound' &&
    e.message === 'A single delete on a sharded collection must contain an exact match on _id (and have the collection default collation) or contain the shard key (and have the simple collation). Delete request: { q: { g: 1 }, limit: 1 }, shard key pattern: { k: "hashed" }');
  await assert.rejects(c.findOneAndUpdate({ g: 1 }, { $set: { x: 1 } }), (e) => e.code === 61 && e.message === 'Query for sharded findAndModify must contain the shard key');
  await assert.rejects(c.findOneAndDelete({ _id: 3 }), (e) => e.code === 61);
  // By shard key, or by _id for updateOne and deleteOne: allowed.
  assert.equal((await c.updateOne({ k: 3 }, { $set: { x: 1 } })).modifiedCount, 1);
  assert.equal((await c.updateOne({ _id: 4 }, { $set: { x: 1 } })).modifiedCount, 1);
  assert.equal((await c.deleteOne({ _id: 5 })).deletedCount, 1);
  assert.equal((await c.deleteOne({ k: 6 })).deletedCount, 1);
  assert.deepEqual(await c.findOneAndUpdate({ k: 7 }, { $set: { x: 2 } }, { returnDocument: 'after' }), { _id: 7, k: 7, g: 1, x: 2 });
  // Multi-document forms go everywhere.
  assert.equal((await c.updateMany({ g: 1 }, { $set: { y: 1 } })).modifiedCount, 9);
  assert.equal((await c.deleteMany({ g: 0 })).deletedCount, 9);
  // In an ordered batch the failing statement stops the batch at its index.
  const bulk = await c.bulkWrite([{ updateOne: { filter: { k: 9 }, update: { $set: { z: 1 } } } }, { deleteOne: { filter: { g: 1 } } },
    { updateOne: { filter: { k: 11 }, update: { $set: { z: 1 } } } }], { ordered: true }).catch((e) => e);
  assert.equal(bulk.writeErrors.length, 1);
  assert.equal(bulk.writeErrors[0].index, 1);
  assert.equal(bulk.writeErrors[0].code, 61);
  assert.equal(await c.countDocuments({ z: 1 }), 1);
});

test('a shard key value changes only in a transaction or as a retryable write (20 otherwise), with the full shard key in the query (31025); the document moves to its new shard', async () => {
  const c = await keyed('ck', { k: 1 });
  await client.db('admin').command({ split: 'ck.c', middle: { k: 100 } });
  await client.db('admin').command({ moveChunk: 'ck.c', find: { k: 100 }, to: 'shard02' });
  await c.insertMany([{ _id: 1, k: 1 }, { _id: 2, k: 2 }, { _id: 3, k: 3 }]);
  const plain = new MongoClient(d.uri('retryWrites=false'), { serverSelectionTimeoutMS: 5000 });
  try {
    const pc = plain.db('ck').collection('c');
    // The Node.js driver wraps every 20 of a write in its MMAPv1 hint; the server's error is the
    // original one.
    const is20 = (e) => {
      const o = e.originalError || e;
      return o.code === 20 && o.codeName === 'IllegalOperation' &&
        o.message === 'Must run update to shard key field in a multi-statement transaction or with retryWrites: true.';
    };
    await assert.rejects(pc.updateOne({ k: 1 }, { $set: { k: 150 } }), is20);
    await assert.rejects(pc.findOneAndUpdate({ k: 1 }, { $set: { k: 150 } }), is20);
    // Writing the same value is no change.
    assert.equal((await pc.updateOne({ k: 1 }, { $set: { k: 1, n: 1 } })).modifiedCount, 1);
  } finally {
    await plain.close();
  }
  // A retryable write (the driver's default): the document moves to shard02.
  assert.equal((await c.updateOne({ k: 1 }, { $set: { k: 150 } })).modifiedCount, 1);
  assert.deepEqual(await perShard('ck', 'c'), { shard01: 2, shard02: 1 });
  await assert.rejects(c.updateOne({ _id: 2 }, { $set: { k: 250 } }), (e) => e.code === 31025 &&
    e.message === 'Shard key update is not allowed without specifying the full shard key in the query');
  // In a transaction.
  const s = client.startSession();
  try {
    await s.withTransaction(async () => {
      await c.updateOne({ k: 2 }, { $set: { k: 200 } }, { session: s });
    });
  } finally {
    await s.endSession();
  }
  assert.deepEqual(await perShard('ck', 'c'), { shard01: 1, shard02: 2 });
  assert.deepEqual(await c.find({}).sort({ _id: 1 }).toArray(), [{ _id: 1, k: 150, n: 1 }, { _id: 2, k: 200 }, { _id: 3, k: 3 }]);
});

// ---- transactions across shards ----

const { lsid: newLsid, L } = require('./helpers');

// A two-shard collection `db.c` with _id 1 on shard01 and _id 1000 on shard02 (range on _id).
async function twoShardColl(db) {
  await client.db('admin').command({ enableSharding: db, primaryShard: 'shard01' });
  await client.db('admin').command({ shardCollection: `${db}.c`, key: { _id: 1 } });
  await client.db('admin').command({ split: `${db}.c`, middle: { _id: 500 } });
  await client.db('admin').command({ moveChunk: `${db}.c`, find: { _id: 500 }, to: 'shard02' });
  return client.db(db).collection('c');
}

test('a transaction starts on each shard it touches, commits in two phases over two shards (one phase on one), and every reply carries the recoveryToken', async () => {
  const c = await twoShardColl('tx');
  await shardCounts('commitTransaction');
  const m = await rawConnect(d.mongos[0]);
  try {
    const id = newLsid();
    const a = await m.command({ insert: 'c', documents: [{ _id: 1 }], lsid: id, txnNumber: L(1), startTransaction: true, autocommit: false, $db: 'tx' });
    assert.equal(num(a.ok), 1, JSON.stringify(a));
    assert.deepEqual(a.recoveryToken, { recoveryShardId: 'shard01' });
    const b = await m.command({ insert: 'c', documents: [{ _id: 1000 }], lsid: id, txnNumber: L(1), autocommit: false, $db: 'tx' });
    assert.deepEqual(b.recoveryToken, { recoveryShardId: 'shard01' });
    // Not visible before the commit, on either shard.
    assert.equal(await c.countDocuments(), 0);
    const r = await m.command({ commitTransaction: 1, lsid: id, txnNumber: L(1), autocommit: false, $db: 'admin' });
    assert.equal(num(r.ok), 1, JSON.stringify(r));
    assert.deepEqual(await perShard('tx', 'c'), { shard01: 1, shard02: 1 });
    assert.deepEqual(await shardCounts(['prepareTransaction', 'commitTransaction']), {
      prepareTransaction: { shard01: 1, shard02: 1 }, commitTransaction: { shard01: 1, shard02: 1 },
    });
    // One shard: no prepare.
    await m.command({ insert: 'c', documents: [{ _id: 2 }], lsid: id, txnNumber: L(2), startTransaction: true, autocommit: false, $db: 'tx' });
    await m.command({ commitTransaction: 1, lsid: id, txnNumber: L(2), autocommit: false, $db: 'admin' });
    assert.deepEqual(await shardCounts(['prepareTransaction', 'commitTransaction']), {
      prepareTransaction: { shard01: 0, shard02: 0 }, commitTransaction: { shard01: 1, shard02: 0 },
    });
    // Abort over both shards leaves nothing.
    await m.command({ insert: 'c', documents: [{ _id: 3 }, { _id: 1003 }], lsid: id, txnNumber: L(3), startTransaction: true, autocommit: false, $db: 'tx' });
    const ab = await m.command({ abortTransaction: 1, lsid: id, txnNumber: L(3), autocommit: false, $db: 'admin' });
    assert.equal(num(ab.ok), 1);
    assert.equal(await c.countDocuments(), 3);
  } finally {
    m.close();
  }
  // The driver's withTransaction across both shards.
  const s = client.startSession();
  try {
    await s.withTransaction(async () => {
      await c.insertOne({ _id: 10 }, { session: s });
      await c.insertOne({ _id: 1010 }, { session: s });
      await c.updateOne({ _id: 1 }, { $set: { t: 1 } }, { session: s });
    });
  } finally {
    await s.endSession();
  }
  assert.deepEqual(await perShard('tx', 'c'), { shard01: 3, shard02: 2 });
  assert.deepEqual(await c.findOne({ _id: 1 }), { _id: 1, t: 1 });
});

test('commitTransaction retried on another mongos with the recoveryToken gets the decision of the recovery shard; without the token that mongos knows no participants (251)', async () => {
  await twoShardColl('tr');
  const [m0, m1] = [await rawConnect(d.mongos[0]), await rawConnect(d.mongos[1])];
  try {
    const id = newLsid();
    const a = await m0.command({ insert: 'c', documents: [{ _id: 1 }, { _id: 1001 }], lsid: id, txnNumber: L(1), startTransaction: true, autocommit: false, $db: 'tr' });
    const token = a.recoveryToken;
    assert.deepEqual(token, { recoveryShardId: 'shard01' });
    const first = await m0.command({ commitTransaction: 1, lsid: id, txnNumber: L(1), autocommit: false, recoveryToken: token, $db: 'admin' });
    assert.equal(num(first.ok), 1, JSON.stringify(first));
    // The retry on the other mongos: without the token it knows no participants, with it the
    // recovery shard's decision answers.
    const no = await m1.command({ commitTransaction: 1, lsid: id, txnNumber: L(1), autocommit: false, $db: 'admin' });
    assert.equal(num(no.code), 251);
    const r = await m1.command({ commitTransaction: 1, lsid: id, txnNumber: L(1), autocommit: false, recoveryToken: token, $db: 'admin' });
    assert.equal(num(r.ok), 1, JSON.stringify(r));
    assert.deepEqual(await perShard('tr', 'c'), { shard01: 1, shard02: 1 });
    // A commit the first mongos never started: the recovery shard has no decision, so the
    // transaction is aborted and the retry gets 251 NoSuchTransaction, transient.
    const id2 = newLsid();
    const b = await m0.command({ insert: 'c', documents: [{ _id: 2 }, { _id: 1002 }], lsid: id2, txnNumber: L(1), startTransaction: true, autocommit: false, $db: 'tr' });
    const lost = await m1.command({ commitTransaction: 1, lsid: id2, txnNumber: L(1), autocommit: false, recoveryToken: b.recoveryToken, $db: 'admin' });
    assert.equal(num(lost.code), 251, JSON.stringify(lost));
    assert.deepEqual(lost.errorLabels, ['TransientTransactionError']);
    assert.deepEqual(await perShard('tr', 'c'), { shard01: 1, shard02: 1 });
  } finally {
    m0.close();
    m1.close();
  }
});

test("a shard primary's step-down aborts the transactions it took part in: mongos relays 251 with TransientTransactionError, and withTransaction retries to success", async () => {
  await twoShardColl('ts');
  const m = await rawConnect(d.mongos[0]);
  try {
    const id = newLsid();
    await m.command({ insert: 'c', documents: [{ _id: 1 }, { _id: 1001 }], lsid: id, txnNumber: L(1), startTransaction: true, autocommit: false, $db: 'ts' });
    const sd = await raw(d.shards[0].port, { replSetStepDown: 10, force: true, $db: 'admin' });
    assert.equal(num(sd.ok), 1, JSON.stringify(sd));
    const st = await m.command({ insert: 'c', documents: [{ _id: 2 }], lsid: id, txnNumber: L(1), autocommit: false, $db: 'ts' });
    assert.equal(num(st.code), 251, JSON.stringify(st));
    assert.deepEqual(st.errorLabels, ['TransientTransactionError']);
    const cm = await m.command({ commitTransaction: 1, lsid: id, txnNumber: L(1), autocommit: false, $db: 'admin' });
    assert.equal(num(cm.code), 251, JSON.stringify(cm));
    assert.ok((cm.errorLabels || []).includes('TransientTransactionError'), JSON.stringify(cm));
    assert.deepEqual(await perShard('ts', 'c'), { shard01: 0, shard02: 0 });
    // The shard's other member took over; a transaction whose first attempt the step-down
    // aborts is retried by the driver and commits.
    const c = client.db('ts').collection('c');
    const s = client.startSession();
    let attempts = 0;
    try {
      await s.withTransaction(async () => {
        attempts++;
        await c.insertOne({ _id: 5 }, { session: s });
        await c.insertOne({ _id: 1005 }, { session: s });
        if (attempts === 1) await raw(d.shards[1].port, { replSetStepDown: 10, force: true, $db: 'admin' });
        await c.insertOne({ _id: 1006 }, { session: s });
      });
    } finally {
      await s.endSession();
    }
    assert.equal(attempts, 2);
    assert.deepEqual(await perShard('ts', 'c'), { shard01: 1, shard02: 2 });
  } finally {
    m.close();
  }
});

test('sharding commands are refused in a transaction (263): no sharded collection is created in one', async () => {
  const m = await rawConnect(d.mongos[0]);
  try {
    const r = await m.command({ shardCollection: 'tn.c', key: { _id: 1 }, lsid: newLsid(), txnNumber: L(1), startTransaction: true, autocommit: false, $db: 'admin' });
    assert.equal(num(r.code), 263, JSON.stringify(r));
    assert.equal(await client.db('config').collection('collections').countDocuments({ _id: 'tn.c' }), 0);
  } finally {
    m.close();
  }
});

// ---- change streams through mongos ----

test('change streams through mongos merge every shard’s events in cluster-time order, and their resume tokens work on either mongos', async () => {
  const c = await twoShardColl('cs1');
  const stream = c.watch([], { maxAwaitTimeMS: 200 });
  const events = [];
  const got = new Promise((resolve, reject) => {
    stream.on('change', (e) => {
      events.push(e);
      if (events.length === 6) resolve();
    });
    stream.on('error', reject);
  });
  await new Promise((r) => { setTimeout(r, 300); }); // the stream's first getMore is waiting
  // Alternate the shards: 1 and 2 on shard01, 1001 and 1002 on shard02; one transaction over both.
  await c.insertOne({ _id: 1 });
  await c.insertOne({ _id: 1001 });
  await c.insertOne({ _id: 2 });
  const s = client.startSession();
  try {
    await s.withTransaction(async () => {
      await c.insertOne({ _id: 1002 }, { session: s });
      await c.updateOne({ _id: 1 }, { $set: { x: 1 } }, { session: s });
    });
  } finally {
    await s.endSession();
  }
  await c.deleteOne({ _id: 1001 });
  await got;
  await stream.close();
  assert.deepEqual(events.map((e) => [e.operationType, e.documentKey._id]),
    [['insert', 1], ['insert', 1001], ['insert', 2], ['insert', 1002], ['update', 1], ['delete', 1001]]);
  for (let i = 1; i < events.length; i++) {
    assert.ok(events[i].clusterTime.greaterThan(events[i - 1].clusterTime) || events[i].clusterTime.equals(events[i - 1].clusterTime), 'clusterTime order');
    assert.ok(events[i]._id._data > events[i - 1]._id._data, 'tokens sort in event order');
  }
  assert.equal(events[0].ns.coll, 'c');
  // Resume after the third event on each mongos: the same three events follow.
  for (const port of d.mongos) {
    const r = await raw(port, { aggregate: 'c', pipeline: [{ $changeStream: { resumeAfter: events[2]._id } }], cursor: {}, $db: 'cs1' });
    assert.deepEqual(r.cursor.firstBatch.map((e) => [e.operationType, num(e.documentKey._id)]), [['insert', 1002], ['update', 1], ['delete', 1001]]);
    assert.deepEqual(r.cursor.firstBatch.map((e) => e._id._data), events.slice(3).map((e) => e._id._data));
    // startAtOperationTime: from the fourth event's time on.
    const t = await raw(port, { aggregate: 'c', pipeline: [{ $changeStream: { startAtOperationTime: events[3].clusterTime } }], cursor: {}, $db: 'cs1' });
    assert.deepEqual(t.cursor.firstBatch.map((e) => num(e.documentKey._id)), [1002, 1, 1001]);
    await raw(port, { killCursors: 'c', cursors: [r.cursor.id, t.cursor.id], $db: 'cs1' });
  }
  // A database stream sees both shards too, and a drop through mongos invalidates a collection stream.
  const cs = c.watch([{ $match: { operationType: { $in: ['insert', 'invalidate', 'drop'] } } }], { startAfter: events[5]._id });
  await c.insertOne({ _id: 1500 });
  const ins = await cs.next();
  assert.equal(ins.documentKey._id, 1500);
  await c.drop();
  const drop = await cs.next();
  assert.equal(drop.operationType, 'drop');
  const inv = await cs.next();
  assert.equal(inv.operationType, 'invalidate');
  await cs.close();
});

// ---- snapshot reads outside transactions ----

// A snapshot session reads every statement at the cluster time of its first read, on the plain
// replica-set double and through mongos alike.
async function snapshotSession(cl, db) {
  const c = cl.db(db).collection('c');
  await c.insertMany([{ _id: 1, v: 'old', g: 1 }, { _id: 1001, v: 'old', g: 2 }]);
  const s = cl.startSession({ snapshot: true });
  try {
    assert.deepEqual(await c.find({}, { session: s }).sort({ _id: 1 }).toArray(), [{ _id: 1, v: 'old', g: 1 }, { _id: 1001, v: 'old', g: 2 }]);
    const at = s.snapshotTime;
    assert.ok(at, 'the first read names its atClusterTime');
    await c.updateMany({}, { $set: { v: 'new' } });
    await c.insertOne({ _id: 2, v: 'new', g: 3 });
    await c.deleteOne({ _id: 1001 });
    assert.deepEqual(await c.find({}, { session: s }).sort({ _id: 1 }).toArray(), [{ _id: 1, v: 'old', g: 1 }, { _id: 1001, v: 'old', g: 2 }]);
    assert.deepEqual((await c.distinct('v', {}, { session: s })).sort(), ['old']);
    assert.equal(await c.countDocuments({}, { session: s }), 2);
    assert.deepEqual(await c.aggregate([{ $group: { _id: null, g: { $sum: '$g' } } }], { session: s }).toArray(), [{ _id: null, g: 3 }]);
    assert.ok(s.snapshotTime.equals(at), 'the same time throughout');
  } finally {
    await s.endSession();
  }
  // Outside the session: the present.
  assert.deepEqual(await c.find({}).sort({ _id: 1 }).toArray(), [{ _id: 1, v: 'new', g: 1 }, { _id: 2, v: 'new', g: 3 }]);
}

test('snapshot reads (readConcern snapshot outside a transaction) answer from the data as of atClusterTime, on the plain double and through mongos; a time in the future is 72, one before the kept history 239', async () => {
  const { startDouble } = require('./helpers');
  const plain = await startDouble();
  const pc = new MongoClient(plain.uri(), { serverSelectionTimeoutMS: 5000 });
  try {
    await pc.connect();
    await snapshotSession(pc, 'snap');
    const now = (await raw(plain.port, { ping: 1, $db: 'admin' })).$clusterTime.clusterTime;
    const { Timestamp } = require('bson');
    const future = new Timestamp({ t: now.t, i: now.i + 100 });
    const r = await raw(plain.port, { find: 'c', readConcern: { level: 'snapshot', atClusterTime: future }, $db: 'snap' });
    assert.equal(num(r.code), 72, JSON.stringify(r));
    const old = new Timestamp({ t: now.t, i: 1 });
    const r2 = await raw(plain.port, { find: 'c', readConcern: { level: 'snapshot', atClusterTime: old }, $db: 'snap' });
    assert.equal(num(r2.code), 239, JSON.stringify(r2));
    // Without atClusterTime: the reply names the time it read at.
    const r3 = await raw(plain.port, { find: 'c', readConcern: { level: 'snapshot' }, $db: 'snap' });
    assert.ok(r3.cursor.atClusterTime, JSON.stringify(r3));
  } finally {
    await pc.close();
    assert.equal(await plain.stop(), 0);
  }
  await client.db('admin').command({ enableSharding: 'snap', primaryShard: 'shard01' });
  await client.db('admin').command({ shardCollection: 'snap.c', key: { _id: 1 } });
  await client.db('admin').command({ split: 'snap.c', middle: { _id: 500 } });
  await client.db('admin').command({ moveChunk: 'snap.c', find: { _id: 500 }, to: 'shard02' });
  await snapshotSession(client, 'snap');
});

// ---- time-series collections ----

test('a time-series collection keeps measurements with the same _id (it has no _id index); its time field must be a date (2)', async () => {
  const db = client.db('tsdb');
  await db.createCollection('m', { timeseries: { timeField: 't', metaField: 'host' } });
  const m = db.collection('m');
  await m.insertMany([{ _id: 1, t: new Date(1000), host: 'a', v: 1 }, { _id: 1, t: new Date(2000), host: 'a', v: 2 }]);
  await m.insertOne({ _id: 1, t: new Date(3000), host: 'b', v: 3 });
  assert.deepEqual((await m.find({ _id: 1 }).sort({ t: 1 }).toArray()).map((x) => x.v), [1, 2, 3]);
  assert.equal(await m.countDocuments({ _id: 1 }), 3);
  await assert.rejects(m.insertOne({ _id: 2, host: 'a' }), (e) => e.code === 2 && /'t' must be present and contain a valid BSON UTC datetime value/.test(e.message));
  const [info] = await db.listCollections({ name: 'm' }).toArray();
  assert.equal(info.type, 'timeseries');
  assert.equal(info.idIndex, undefined);
  // An ordinary collection still refuses the duplicate.
  await db.collection('plain').insertOne({ _id: 1 });
  await assert.rejects(db.collection('plain').insertOne({ _id: 1 }), (e) => e.code === 11000);
});

// ---- the Stable API's strict mode ----

test('apiStrict refuses aggregate stages outside API version 1 (323), so a database aggregate like $currentOp does not run under strict version 1', async () => {
  const { startDouble } = require('./helpers');
  const plain = await startDouble(['--single-member']);
  try {
    const strict = { apiVersion: '1', apiStrict: true };
    const r = await raw(plain.port, { aggregate: 1, pipeline: [{ $currentOp: {} }], cursor: {}, ...strict, $db: 'admin' });
    assert.equal(num(r.code), 323, JSON.stringify(r));
    assert.equal(r.codeName, 'APIStrictError');
    assert.equal(r.errmsg, "$currentOp is not allowed with 'apiStrict: true' in API Version 1");
    const r2 = await raw(plain.port, { aggregate: 1, pipeline: [{ $listLocalSessions: {} }], cursor: {}, ...strict, $db: 'admin' });
    assert.equal(num(r2.code), 323);
    const r3 = await raw(plain.port, { aggregate: 'c', pipeline: [{ $facet: { a: [{ $indexStats: {} }] } }], cursor: {}, ...strict, $db: 'x' });
    assert.equal(num(r3.code), 323);
    // Stages of version 1, and the same stages without apiStrict, run.
    const ok1 = await raw(plain.port, { aggregate: 'c', pipeline: [{ $match: {} }, { $group: { _id: null, n: { $sum: 1 } } }], cursor: {}, ...strict, $db: 'x' });
    assert.equal(num(ok1.ok), 1, JSON.stringify(ok1));
    const ok2 = await raw(plain.port, { aggregate: 1, pipeline: [{ $currentOp: {} }], cursor: {}, apiVersion: '1', $db: 'admin' });
    assert.equal(num(ok2.ok), 1, JSON.stringify(ok2));
  } finally {
    assert.equal(await plain.stop(), 0);
  }
});

// ---- what the spec tests check through mongos ----

test('through mongos: shard errors keep their fields, $out between unsharded collections runs on the primary shard, a change stream shows shardCollection (not the set-up on the shards), and failGetMoreAfterCursorCheckout is resumable', async () => {
  const db = client.db('spec');
  const c = db.collection('c');
  await c.createIndex({ x: 1 }, { unique: true });
  await c.insertOne({ _id: 1, x: 1 });
  await assert.rejects(c.insertOne({ _id: 2, x: 1 }), (e) => e.code === 11000 && e.keyPattern && e.keyPattern.x === 1);
  await assert.rejects(c.findOneAndUpdate({ _id: 1 }, { $set: { x: 1 } }, { upsert: true }).then(() => c.findOneAndUpdate({ _id: 3 }, { $set: { x: 1 } }, { upsert: true })),
    (e) => e.code === 11000 && !!e.errorResponse.keyPattern && !!e.errorResponse.keyValue);
  await c.aggregate([{ $match: {} }, { $out: 'copy' }]).toArray();
  assert.equal(await db.collection('copy').countDocuments(), 1);
  await db.createCollection('sh');
  const stream = db.collection('sh').watch([], { showExpandedEvents: true });
  await stream.tryNext();
  await client.db('admin').command({ shardCollection: 'spec.sh', key: { _id: 1 } });
  const ev = await stream.next();
  assert.equal(ev.operationType, 'shardCollection');
  assert.deepEqual(ev.operationDescription.shardKey, { _id: 1 });
  await stream.close();
  const m = await rawConnect(d.port);
  try {
    const open = await m.command({ aggregate: 'sh', pipeline: [{ $changeStream: {} }], cursor: {}, $db: 'spec' });
    await m.command({ configureFailPoint: 'failGetMoreAfterCursorCheckout', mode: { times: 1 }, data: { errorCode: 7 }, $db: 'admin' });
    const gm = await m.command({ getMore: open.cursor.id, collection: 'sh', maxTimeMS: 10, $db: 'spec' });
    assert.equal(num(gm.code), 7);
    assert.deepEqual(gm.errorLabels, ['ResumableChangeStreamError']);
  } finally {
    m.close();
  }
});

test('a tailable find on an unsharded capped collection goes through the mongos: alive when exhausted, later inserts on getMore; checkMetadataConsistency finds nothing', async () => {
  // Cursors belong to the mongos that opened them: one mongos for every command here.
  const one = new MongoClient(`mongodb://127.0.0.1:${d.port}/`, { serverSelectionTimeoutMS: 5000 });
  try {
    const db = one.db('tailthrough');
    await db.createCollection('capped', { capped: true, size: 4096 });
    await db.collection('capped').insertMany([{ _id: 1 }, { _id: 2 }]);
    const first = await db.command({ find: 'capped', tailable: true, batchSize: 1 });
    assert.deepEqual(first.cursor.firstBatch, [{ _id: 1 }]);
    // The cursor id back as mongod wants it (type long), not as the driver promoted it.
    const id = Long.fromValue(first.cursor.id);
    const more = () => db.command({ getMore: id, collection: 'capped' });
    assert.deepEqual((await more()).cursor.nextBatch, [{ _id: 2 }]);
    const empty = await more();
    assert.deepEqual(empty.cursor.nextBatch, []);
    assert.notEqual(String(empty.cursor.id), '0');
    await db.collection('capped').insertOne({ _id: 3 });
    assert.deepEqual((await more()).cursor.nextBatch, [{ _id: 3 }]);
    const killed = await db.command({ killCursors: 'capped', cursors: [id] });
    assert.equal(killed.cursorsKilled.length, 1);
    const check = await db.command({ checkMetadataConsistency: 1 });
    assert.deepEqual(check.cursor.firstBatch, []);
    assert.equal(String(check.cursor.id), '0');
  } finally {
    await one.close();
  }
});

test('shutdown on one mongos stops that router alone (no reply, no new connections); the shards and the other mongos go on, and the driver on the seed list goes on through it', async () => {
  const own = await startSharded();
  const seed = new MongoClient(own.uri(), { serverSelectionTimeoutMS: 5000 });
  try {
    await seed.connect();
    await seed.db('sd').collection('c').insertOne({ _id: 1 });
    const m = await rawConnect(own.mongos[1]);
    assert.equal(num((await m.command({ shutdown: 1, $db: 'sd' })).code), 13);
    const { msg } = require('./helpers').opMsg({ shutdown: 1, $db: 'admin' });
    m.send(msg);
    assert.equal(await m.next(), null, 'the connection closes without a reply');
    await assert.rejects(rawConnect(own.mongos[1]), /ECONNREFUSED/);
    for (let i = 2; i <= 5; i++) await seed.db('sd').collection('c').insertOne({ _id: i });
    assert.equal(await seed.db('sd').collection('c').countDocuments(), 5);
    const r = await raw(own.mongos[0], { count: 'c', $db: 'sd' });
    assert.equal(num(r.n), 5);
  } finally {
    await seed.close();
    assert.equal(await own.stop(), 0);
  }
});
