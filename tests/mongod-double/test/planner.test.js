'use strict';
// Queries answered from ordered indexes (lib/ordered.js, lib/planner.js) give what a scan gives:
// the same documents in the same order, also inside transactions (their own writes merged in)
// and at old snapshots (every committed version indexed until no snapshot needs it). Each
// comparison runs one query on a collection with the store's indexes and on a twin without
// secondary indexes that holds the same documents; the plans themselves are checked with
// explain and with the entries looked at (doubleStats `examined`).
//
// RELAYBUS_PLANNER_SEED=N reruns the randomized test with one seed (it prints the seed it
// used on failure); RELAYBUS_PLANNER_ROUNDS scales it.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient, ObjectId, Int32, Double, Long } = require('mongodb');
const { startDouble } = require('./helpers');

let d;
let client;
let db;

before(async () => {
  d = await startDouble();
  client = new MongoClient(d.uri(), { serverSelectionTimeoutMS: 5000 });
  await client.connect();
  db = client.db('plans');
});
after(async () => {
  await client.close();
  assert.equal(await d.stop(), 0);
});

// The store's deliveries indexes (src/store/setup.c), and a few shapes more.
const INDEXES = [
  { key: { laneId: 1, dueAt: 1, _id: 1, handler: 1 }, name: 'claim', partialFilterExpression: { lane: 'ready' } },
  { key: { handler: 1, key: 1, sequence: 1 }, name: 'ordering', partialFilterExpression: { status: 'pending', sequence: { $exists: true } } },
  { key: { handler: 1, key: 1, sequence: 1, lane: 1 }, name: 'parked', partialFilterExpression: { lane: 'parked' } },
  { key: { dueAt: 1 }, name: 'due', partialFilterExpression: { status: 'pending' } },
  { key: { status: 1, createdAt: 1 }, name: 'status_created' },
  { key: { key: -1, n: 1 }, name: 'key_desc' },
  { key: { 'meta.p': 1, n: -1 }, name: 'nested' },
];

async function twins(name) {
  const ix = db.collection(`${name}_ix`);
  const plain = db.collection(`${name}_plain`);
  await db.createCollection(ix.collectionName);
  await db.createCollection(plain.collectionName);
  await ix.createIndexes(INDEXES);
  return { ix, plain };
}

async function examined() {
  const r = await client.db('admin').command({ doubleStats: 1 });
  return { keys: Number(r.examined.keys), docs: Number(r.examined.docs) };
}

async function winningIndex(coll, filter, opts = {}) {
  const e = await coll.find(filter, opts).explain('executionStats');
  const w = e.queryPlanner.winningPlan;
  return { index: w.inputStage ? (w.inputStage.indexName || w.inputStage.inputStages.map((s) => s.indexName).join(',')) : w.stage, stats: e.executionStats };
}

// ---- randomized comparison ----

function prng(seed) {
  let x = seed >>> 0 || 1;
  return () => {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    return x / 4294967296;
  };
}

const KEYS = ['k0', 'k1', 'k2', 'k3', 'ké', '\u{1F600}x', '\uFB01', undefined];
const DUES = [0, 1, 2, 3, 4].map((i) => new Date(Date.UTC(2026, 0, 1, 0, 0, i)));

function makeGen(rnd) {
  const pick = (a) => a[Math.floor(rnd() * a.length)];
  const int = (n) => Math.floor(rnd() * n);
  const num = (v) => pick([() => new Int32(v), () => new Double(v), () => Long.fromNumber(v)])();
  const g = {
    pick,
    int,
    doc(grp) {
      const doc = { _id: new ObjectId(), grp, laneId: new Int32(int(8)), dueAt: pick(DUES), handler: pick(['a', 'b', 'c']) };
      const lane = pick(['ready', 'ready', 'parked', undefined]);
      if (lane) doc.lane = lane;
      doc.status = pick(['pending', 'pending', 'pending', 'dead']);
      const key = pick(KEYS);
      if (key !== undefined) doc.key = key;
      if (rnd() < 0.85) doc.sequence = num(1 + int(30));
      doc.n = rnd() < 0.1 ? null : num(int(20) - 5);
      doc.createdAt = pick(DUES);
      if (rnd() < 0.7) doc.meta = { p: pick(['x', 'y', 'z']) };
      return doc;
    },
    // Conditions of a filter, some of which the indexes bound and some they do not.
    filter() {
      const f = {};
      const r = rnd();
      if (r < 0.4) f.laneId = rnd() < 0.5 ? new Int32(int(8)) : { $in: [int(8), int(8), int(8)].map((x) => new Int32(x)) };
      if (rnd() < 0.5) f.lane = pick(['ready', 'parked']);
      if (rnd() < 0.5) f.dueAt = { [pick(['$lte', '$lt', '$gte', '$gt'])]: pick(DUES) };
      if (rnd() < 0.6) f.handler = rnd() < 0.5 ? pick(['a', 'b', 'c']) : { $in: ['a', pick(['b', 'c'])] };
      if (rnd() < 0.4) {
        f.status = 'pending';
        f.sequence = { $exists: true };
        if (rnd() < 0.5) f.sequence.$lte = num(int(30));
      }
      if (rnd() < 0.3) f.key = rnd() < 0.5 ? pick(KEYS.filter(Boolean)) : { $in: [pick(KEYS.filter(Boolean)), pick(KEYS.filter(Boolean))] };
      if (rnd() < 0.2) f.n = { [pick(['$lt', '$gte'])]: num(int(20) - 5) };
      if (rnd() < 0.15) f['meta.p'] = pick(['x', 'y']);
      if (rnd() < 0.15) {
        f.$or = [];
        for (let i = 0; i < 1 + int(3); i++) f.$or.push({ key: pick(KEYS.filter(Boolean)), sequence: { $lte: num(int(30)) } });
      }
      if (rnd() < 0.1) f.status = pick(['pending', 'dead']);
      return f;
    },
    sort() {
      return pick([
        null, { dueAt: 1, _id: 1 }, { dueAt: 1 }, { handler: 1, key: 1, sequence: 1 }, { key: -1, n: 1 }, { key: -1 },
        { createdAt: 1 }, { 'meta.p': 1, n: -1 }, { n: 1, _id: -1 },
      ]);
    },
    change() {
      const s = {};
      if (rnd() < 0.4) s.lane = pick(['ready', 'parked']);
      if (rnd() < 0.3) s.dueAt = pick(DUES);
      if (rnd() < 0.3) s.sequence = num(1 + int(30));
      if (rnd() < 0.3) s.key = pick(KEYS.filter(Boolean));
      if (rnd() < 0.2) s.status = pick(['pending', 'dead']);
      if (rnd() < 0.2) s.n = num(int(20) - 5);
      if (!Object.keys(s).length) s.laneId = new Int32(int(8));
      const u = { $set: s };
      if (rnd() < 0.15) u.$unset = { [pick(['lane', 'sequence', 'key', 'meta'])]: '' };
      for (const k of Object.keys(u.$unset || {})) delete s[k];
      return u;
    },
  };
  return g;
}

// Runs one random query on both collections and compares; what may differ (the documents an
// unsorted query with a limit returns) is compared as far as it is defined.
async function compareQuery(g, { ix, plain }, session, what) {
  const filter = g.filter();
  const opts = session ? { session } : {};
  const kind = g.int(6);
  const ctx = () => `${what}: ${JSON.stringify(filter)}`;
  if (kind <= 1) {
    const sort = g.sort();
    const limit = g.pick([0, 0, 1, 5, 40]);
    const o = Object.assign({}, opts);
    if (sort) o.sort = sort;
    if (limit) o.limit = limit;
    const a = await ix.find(filter, o).toArray();
    const b = await plain.find(filter, o).toArray();
    if (sort || !limit) assert.deepEqual(a, b, `${ctx()} sort ${JSON.stringify(sort)} limit ${limit}`);
    else {
      const all = new Set((await plain.find(filter, opts).toArray()).map((x) => x._id.toHexString()));
      assert.equal(a.length, b.length, ctx());
      for (const x of a) assert.ok(all.has(x._id.toHexString()), ctx());
    }
  } else if (kind === 2) {
    const f = Object.assign({}, filter, { status: 'pending', sequence: { $exists: true } });
    delete f.$or;
    const pipeline = [{ $match: f }, { $sort: { handler: 1, key: 1, sequence: 1 } },
      { $group: { _id: '$key', seq: { $first: '$sequence' }, due: { $first: '$dueAt' }, id: { $first: '$_id' } } }];
    assert.deepEqual(await ix.aggregate(pipeline, opts).toArray(), await plain.aggregate(pipeline, opts).toArray(), `group ${ctx()}`);
    const parked = [{ $match: { handler: g.pick(['a', 'b']), lane: 'parked' } }, { $sort: { handler: 1, key: 1, sequence: 1 } },
      { $group: { _id: '$key', seq: { $first: '$sequence' } } }, { $sort: { seq: 1, _id: 1 } }];
    assert.deepEqual(await ix.aggregate(parked, opts).toArray(), await plain.aggregate(parked, opts).toArray(), 'parked heads');
    // A sort on a prefix of an index: the first of a group is the first of its ties in
    // natural order, not in the index's order of the fields after the sort.
    const prefix = [{ $match: { n: { $gte: g.int(10) - 6 } } }, { $sort: { key: -1 } }, { $group: { _id: '$key', id: { $first: '$_id' } } }];
    assert.deepEqual(await ix.aggregate(prefix, opts).toArray(), await plain.aggregate(prefix, opts).toArray(), 'first of ties');
  } else if (kind === 3) {
    const pipeline = [{ $match: filter }, { $limit: 100000 }, { $group: { _id: '$key', seq: { $min: '$sequence' }, n: { $sum: 1 } } }, { $sort: { _id: 1 } }];
    assert.deepEqual(await ix.aggregate(pipeline, opts).toArray(), await plain.aggregate(pipeline, opts).toArray(), `runs ${ctx()}`);
    const small = [{ $match: filter }, { $limit: 3 }, { $count: 'n' }];
    const [x, y] = [await ix.aggregate(small, opts).toArray(), await plain.aggregate(small, opts).toArray()];
    assert.deepEqual(x, y, `limited ${ctx()}`);
  } else if (kind === 4) {
    assert.equal(await ix.countDocuments(filter, opts), await plain.countDocuments(filter, opts), `count ${ctx()}`);
    assert.deepEqual(await ix.distinct('key', filter, opts), await plain.distinct('key', filter, opts), `distinct ${ctx()}`);
  } else {
    const sort = g.pick([{ dueAt: 1, _id: 1 }, { handler: 1, key: 1, sequence: 1 }, { createdAt: 1 }]);
    const a = await ix.find(filter, Object.assign({ sort, limit: 3, projection: { _id: 1 } }, opts)).toArray();
    const b = await plain.find(filter, Object.assign({ sort, limit: 3, projection: { _id: 1 } }, opts)).toArray();
    assert.deepEqual(a, b, `projected ${ctx()}`);
  }
}

// A random write applied to both collections: only writes whose effect does not depend on
// which of several matching documents comes first.
async function randomWrite(g, { ix, plain }, grp, session) {
  const opts = session ? { session } : {};
  const k = g.int(5);
  if (k === 0) {
    const doc = g.doc(grp);
    await ix.insertOne(Object.assign({}, doc), opts);
    await plain.insertOne(Object.assign({}, doc), opts);
  } else if (k <= 2) {
    const f = Object.assign(g.filter(), { grp });
    const u = g.change();
    const a = await ix.updateMany(f, u, opts);
    const b = await plain.updateMany(f, u, opts);
    assert.deepEqual([a.matchedCount, a.modifiedCount], [b.matchedCount, b.modifiedCount], `updateMany ${JSON.stringify(f)}`);
  } else if (k === 3) {
    const f = Object.assign(g.filter(), { grp });
    const a = await ix.deleteMany(f, opts);
    const b = await plain.deleteMany(f, opts);
    assert.equal(a.deletedCount, b.deletedCount, `deleteMany ${JSON.stringify(f)}`);
  } else {
    // findOneAndUpdate with a sort: the same document on both sides.
    const f = Object.assign(g.filter(), { grp });
    const u = g.change();
    const sort = g.pick([{ dueAt: 1, _id: 1 }, { createdAt: 1 }, { handler: 1, key: 1, sequence: 1 }]);
    const a = await ix.findOneAndUpdate(f, u, Object.assign({ sort }, opts));
    const b = await plain.findOneAndUpdate(f, u, Object.assign({ sort }, opts));
    assert.deepEqual(a, b, `findOneAndUpdate ${JSON.stringify(f)} ${JSON.stringify(sort)}`);
  }
}

async function sameContent({ ix, plain }, what) {
  const a = await ix.find({}).toArray();
  const b = await plain.find({}).toArray();
  assert.deepEqual(a, b, what);
}

test('index plans give what the scan gives: random documents and writes, open transactions with their own writes, old snapshots', async () => {
  const seed = Number(process.env.RELAYBUS_PLANNER_SEED || Date.now() % 1000000);
  const rounds = Number(process.env.RELAYBUS_PLANNER_ROUNDS || 30);
  const rnd = prng(seed);
  const g = makeGen(rnd);
  const c = await twins('rand');
  try {
    const docs = [];
    for (let i = 0; i < 600; i++) docs.push(g.doc(g.pick(['T', 'O'])));
    await c.ix.insertMany(docs.map((x) => Object.assign({}, x)));
    await c.plain.insertMany(docs.map((x) => Object.assign({}, x)));
    for (let r = 0; r < rounds; r++) {
      for (let i = 0; i < 6; i++) await randomWrite(g, c, g.pick(['T', 'O']), null);
      for (let i = 0; i < 8; i++) await compareQuery(g, c, null, `round ${r}`);
      // An old snapshot: a reader's transaction sees what was committed when it began,
      // through the indexes as through the scan, while autocommit writes go on.
      const reader = client.startSession();
      reader.startTransaction({ readConcern: { level: 'snapshot' } });
      const seen = await c.ix.find({ lane: 'ready', dueAt: { $lte: DUES[3] } }, { session: reader, sort: { dueAt: 1, _id: 1 } }).toArray();
      // A writer's transaction: its own writes (on the T documents) merge into its reads,
      // while autocommit writes change the O documents beside it.
      const writer = client.startSession();
      writer.startTransaction();
      for (let i = 0; i < 4; i++) {
        await randomWrite(g, c, 'T', writer);
        await randomWrite(g, c, 'O', null);
        await compareQuery(g, c, writer, `round ${r} in a transaction`);
        await compareQuery(g, c, reader, `round ${r} at an old snapshot`);
      }
      assert.deepEqual(await c.ix.find({ lane: 'ready', dueAt: { $lte: DUES[3] } }, { session: reader, sort: { dueAt: 1, _id: 1 } }).toArray(), seen, 'the old snapshot did not move');
      if (g.int(3)) await writer.commitTransaction();
      else await writer.abortTransaction();
      await writer.endSession();
      await reader.commitTransaction();
      await reader.endSession();
      for (let i = 0; i < 4; i++) await compareQuery(g, c, null, `round ${r} after the transactions`);
      await sameContent(c, `round ${r}`);
    }
  } catch (e) {
    e.message = `seed ${seed}: ${e.message}`;
    throw e;
  } finally {
    await c.ix.drop();
    await c.plain.drop();
  }
});

// ---- the plans ----

test('the claim, the per-key probes and the parked heads are answered from their indexes, looking at a bounded number of entries', async () => {
  const c = await twins('bounded');
  const now = new Date(Date.UTC(2026, 0, 2));
  const docs = [];
  for (let i = 0; i < 20000; i++) {
    docs.push({
      _id: new ObjectId(), laneId: i % 256, lane: i % 10 ? 'ready' : 'parked', status: 'pending', handler: 'h',
      key: `k-${i % 50}`, sequence: Math.floor(i / 50) + 1, dueAt: new Date(now.getTime() - (i % 7) * 1000), createdAt: now,
    });
  }
  await c.ix.insertMany(docs);
  const claimQuery = { laneId: { $in: [3, 4, 5, 6] }, lane: 'ready', dueAt: { $lte: now }, handler: { $in: ['h'] } };
  const w = await winningIndex(c.ix, claimQuery, { sort: { dueAt: 1, _id: 1 }, limit: 100 });
  assert.equal(w.index, 'claim');
  assert.equal(w.stats.nReturned, 100);
  assert.ok(w.stats.totalKeysExamined <= 110, `keys examined: ${w.stats.totalKeysExamined}`);
  // The per-key probe ($or per key with a sequence bound) and a distinct scan per key.
  const before = await examined();
  const runs = await c.ix.aggregate([{ $match: { handler: 'h', status: 'pending', sequence: { $exists: true },
    $or: [{ key: 'k-1', sequence: { $lte: 4 } }, { key: 'k-2', sequence: { $lte: 4 } }] } }, { $limit: 20 },
  { $group: { _id: '$key', seq: { $min: '$sequence' }, n: { $sum: 1 } } }, { $sort: { _id: 1 } }]).toArray();
  assert.deepEqual(runs.map((x) => [x._id, x.seq, x.n]), [['k-1', 1, 4], ['k-2', 1, 4]]);
  const heads = await c.ix.aggregate([{ $match: { handler: 'h', lane: 'parked' } }, { $sort: { handler: 1, key: 1, sequence: 1 } },
    { $group: { _id: '$key', seq: { $first: '$sequence' } } }]).toArray();
  assert.deepEqual(heads.map((x) => x._id).sort(), ['k-0', 'k-10', 'k-20', 'k-30', 'k-40']); // every tenth delivery is parked
  const after = await examined();
  assert.ok(after.keys - before.keys <= 60, `entries looked at: ${after.keys - before.keys}`);
  // A query without a bound on an index prefix scans, and says so.
  assert.equal((await winningIndex(c.ix, { sequence: 5 })).index, 'COLLSCAN');
  // A partial index whose filter the query does not imply is not used.
  assert.notEqual((await winningIndex(c.ix, { dueAt: { $lte: now } })).index, 'due');
  assert.equal((await winningIndex(c.ix, { status: 'pending', dueAt: { $lte: now } }, { sort: { dueAt: 1 }, limit: 1 })).index, 'due');
  await c.ix.drop();
  await c.plain.drop();
});

test('an index whose documents hold arrays is left to the scan, with the same results', async () => {
  const c = await twins('multikey');
  const docs = [];
  for (let i = 0; i < 200; i++) docs.push({ _id: i, handler: 'h', key: i % 7 === 0 ? [`k${i % 3}`, 'kz'] : `k${i % 3}`, sequence: i % 13, status: 'pending' });
  await c.ix.insertMany(docs);
  await c.plain.insertMany(docs);
  const f = { handler: 'h', key: 'k1', status: 'pending', sequence: { $exists: true } };
  assert.deepEqual(await c.ix.find(f, { sort: { sequence: 1, _id: 1 } }).toArray(), await c.plain.find(f, { sort: { sequence: 1, _id: 1 } }).toArray());
  assert.equal((await winningIndex(c.ix, { key: 'k1' }, { sort: { key: -1, n: 1 } })).index, 'COLLSCAN');
  // Still a plan on the indexes without arrays.
  assert.equal((await winningIndex(c.ix, { status: 'pending' }, { sort: { createdAt: 1 }, limit: 2 })).index, 'status_created');
  // A partial filter's field holding an array: covered when an element matches, as the
  // filter says ({lane: 'ready'} matches ['ready', 'x']).
  const lanes = [{ _id: 'a1', laneId: 1, lane: ['x', 'ready'], dueAt: DUES[0], handler: 'h' }, { _id: 'a2', laneId: 1, lane: ['x'], dueAt: DUES[0], handler: 'h' },
    { _id: 'a3', laneId: 1, lane: 'ready', dueAt: DUES[1], handler: 'h' }];
  await c.ix.insertMany(lanes);
  await c.plain.insertMany(lanes);
  const lq = { laneId: 1, lane: 'ready', dueAt: { $lte: DUES[4] } };
  assert.deepEqual((await c.ix.find(lq, { sort: { dueAt: 1, _id: 1 } }).toArray()).map((x) => x._id), ['a1', 'a3']);
  assert.deepEqual(await c.ix.find(lq, { sort: { dueAt: 1, _id: 1 } }).toArray(), await c.plain.find(lq, { sort: { dueAt: 1, _id: 1 } }).toArray());
  assert.equal((await winningIndex(c.ix, lq, { sort: { dueAt: 1, _id: 1 } })).index, 'claim');
  await c.ix.drop();
  await c.plain.drop();
});

test('a transaction that began before an update reads the old version through the index, its own writes in their place', async () => {
  const c = await twins('snap');
  const coll = c.ix;
  await coll.insertMany([
    { _id: 1, laneId: 1, lane: 'ready', dueAt: DUES[1], handler: 'h' },
    { _id: 2, laneId: 1, lane: 'ready', dueAt: DUES[2], handler: 'h' },
    { _id: 3, laneId: 1, lane: 'parked', dueAt: DUES[0], handler: 'h' },
  ]);
  const q = { laneId: 1, lane: 'ready', dueAt: { $lte: DUES[4] }, handler: 'h' };
  const ids = async (session) => (await coll.find(q, { sort: { dueAt: 1, _id: 1 }, session }).toArray()).map((x) => x._id);
  const s = client.startSession();
  s.startTransaction();
  assert.deepEqual(await ids(s), [1, 2]);
  // Committed after the snapshot: 1 leaves the index range, 3 enters it, 4 is new.
  await coll.updateOne({ _id: 1 }, { $set: { lane: 'parked' } });
  await coll.updateOne({ _id: 3 }, { $set: { lane: 'ready' } });
  await coll.insertOne({ _id: 4, laneId: 1, lane: 'ready', dueAt: DUES[0], handler: 'h' });
  assert.deepEqual(await ids(null), [3, 4, 2]);
  assert.deepEqual(await ids(s), [1, 2]);
  // Own writes: 2 moves before 1, 5 is inserted, both only inside.
  await coll.updateOne({ _id: 2 }, { $set: { dueAt: DUES[0] } }, { session: s });
  await coll.insertOne({ _id: 5, laneId: 1, lane: 'ready', dueAt: DUES[1], handler: 'h' }, { session: s });
  assert.deepEqual(await ids(s), [2, 1, 5]);
  assert.deepEqual(await ids(null), [3, 4, 2]);
  await s.abortTransaction();
  await s.endSession();
  assert.deepEqual(await ids(null), [3, 4, 2]);
  await c.ix.drop();
  await c.plain.drop();
});
