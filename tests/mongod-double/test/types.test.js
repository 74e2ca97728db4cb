'use strict';
// BSON values survive storage unchanged; comparisons, sorts and $inc follow MongoDB's rules.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient, Int32, Long, Double, Decimal128, ObjectId, Binary, Timestamp, BSONRegExp, MinKey, MaxKey, UUID, Code, BSON } = require('mongodb');
const { startDouble } = require('./helpers');

let d;
let client;
let db;
const raw = { promoteValues: false, promoteLongs: false, bsonRegExp: true };

before(async () => {
  d = await startDouble();
  client = new MongoClient(d.uri(), { serverSelectionTimeoutMS: 5000 });
  await client.connect();
  db = client.db('types');
});
after(async () => {
  await client.close();
  assert.equal(await d.stop(), 0);
});

test('every BSON type round-trips byte for byte, field order kept', async () => {
  const doc = {
    _id: new ObjectId(),
    z: new Int32(5), y: Long.fromNumber(5), x: new Double(5), w: Decimal128.fromString('5.0'),
    s: 'str', b: true, n: null, date: new Date(1700000000123), bin: new Binary(Buffer.from([1, 2, 3]), 0),
    uuid: new UUID(), ts: new Timestamp({ t: 12, i: 34 }), re: new BSONRegExp('a.c', 'imx'),
    min: new MinKey(), max: new MaxKey(), code: new Code('function(){}'),
    nested: { b: 1, a: [new Int32(1), Long.fromNumber(2), new Double(3.5), { q: 'r' }] },
    big: Long.fromString('9007199254740993'),
  };
  const coll = db.collection('roundtrip');
  await coll.insertOne(doc);
  const back = await coll.findOne({ _id: doc._id }, raw);
  assert.ok(BSON.serialize(back).equals(BSON.serialize(doc)), 'serialized bytes differ');
  assert.deepEqual(Object.keys(back), Object.keys(doc));
  const viaAgg = (await coll.aggregate([{ $match: { _id: doc._id } }], raw).toArray())[0];
  assert.ok(BSON.serialize(viaAgg).equals(BSON.serialize(doc)), 'aggregate changed types');
});

test('numbers compare by value across types, and 1, 1.0, Long 1 are one _id', async () => {
  const coll = db.collection('nums');
  await coll.insertMany([{ _id: 1, v: new Int32(5) }, { _id: 2, v: Long.fromNumber(6) }, { _id: 3, v: new Double(4.5) }, { _id: 4, v: Decimal128.fromString('7') }]);
  const ids = (await coll.find({ v: { $gte: new Double(5) } }).sort({ v: 1 }).toArray()).map((x) => x._id);
  assert.deepEqual(ids, [1, 2, 4]);
  assert.equal((await coll.findOne({ v: Long.fromNumber(5) }))._id, 1);
  await assert.rejects(coll.insertOne({ _id: new Double(1) }), (e) => e.code === 11000);
  await assert.rejects(coll.insertOne({ _id: Long.fromNumber(1) }), (e) => e.code === 11000);
});

test('mixed types sort in BSON order', async () => {
  const coll = db.collection('mixed');
  await coll.insertMany([
    { _id: 1, v: 'a' }, { _id: 2, v: 3 }, { _id: 3, v: null }, { _id: 4, v: { a: 1 } }, { _id: 5, v: true },
    { _id: 6, v: new Date(0) }, { _id: 7, v: new ObjectId() }, { _id: 8, v: [0, 1] }, { _id: 9, v: new MinKey() }, { _id: 10, v: new MaxKey() },
  ]);
  const ids = (await coll.find({ _id: { $ne: 8 } }).sort({ v: 1 }).toArray()).map((x) => x._id);
  assert.deepEqual(ids, [9, 3, 2, 1, 4, 7, 5, 6, 10]);
  const desc = (await coll.find({ _id: { $in: [1, 2, 8] } }).sort({ v: -1 }).toArray()).map((x) => x._id);
  assert.deepEqual(desc, [1, 2, 8]); // an array sorts descending by its largest element (1)
});

test('$inc keeps types: Int32 overflow to Int64, Int64+Int32 stays Int64, Double stays Double', async () => {
  const coll = db.collection('inc');
  await coll.insertOne({ _id: 1, i: new Int32(2147483647), l: Long.fromNumber(1), d: new Double(1), k: new Int32(1) });
  await coll.updateOne({ _id: 1 }, { $inc: { i: new Int32(1), l: new Int32(1), d: new Int32(1), k: new Int32(1), m: Long.fromNumber(3) } });
  const r = await coll.findOne({ _id: 1 }, raw);
  assert.equal(r.i._bsontype, 'Long');
  assert.equal(r.i.toString(), '2147483648');
  assert.equal(r.l._bsontype, 'Long');
  assert.equal(r.d._bsontype, 'Double');
  assert.equal(r.k._bsontype, 'Int32');
  assert.equal(r.k.value, 2);
  assert.equal(r.m._bsontype, 'Long');
});

test('update operators, upsert with $setOnInsert, arrayFilters, pipeline update', async () => {
  const coll = db.collection('upd');
  const r1 = await coll.updateOne({ _id: 7, k: 'x' }, { $set: { a: 1 }, $setOnInsert: { created: true } }, { upsert: true });
  assert.equal(r1.upsertedId, 7);
  assert.deepEqual(await coll.findOne({ _id: 7 }), { _id: 7, k: 'x', a: 1, created: true });
  await coll.updateOne({ _id: 7 }, { $set: { a: 2 }, $setOnInsert: { created: false } }, { upsert: true });
  assert.equal((await coll.findOne({ _id: 7 })).created, true);
  await coll.insertOne({ _id: 8, arr: [{ q: 1 }, { q: 5 }, { q: 9 }] });
  await coll.updateOne({ _id: 8 }, { $set: { 'arr.$[e].big': true } }, { arrayFilters: [{ 'e.q': { $gt: 4 } }] });
  assert.deepEqual((await coll.findOne({ _id: 8 })).arr, [{ q: 1 }, { q: 5, big: true }, { q: 9, big: true }]);
  await coll.updateOne({ _id: 8, 'arr.q': 5 }, { $inc: { 'arr.$.q': 1 } });
  assert.equal((await coll.findOne({ _id: 8 })).arr[1].q, 6);
  await coll.updateOne({ _id: 7 }, [{ $set: { b: { $add: ['$a', 10] } } }]);
  assert.equal((await coll.findOne({ _id: 7 })).b, 12);
  const r2 = await coll.updateMany({}, { $set: { a: 2 } });
  assert.equal(r2.matchedCount, 2);
  assert.equal(r2.modifiedCount, 1);
  const fam = await coll.findOneAndUpdate({ _id: 9 }, { $set: { z: 1 } }, { upsert: true, returnDocument: 'after' });
  assert.deepEqual(fam, { _id: 9, z: 1 });
  await assert.rejects(coll.updateOne({ _id: 9 }, { $set: { _id: 10 } }), (e) => e.code === 66);
});

test('find options: projection, skip, limit, batchSize, getMore', async () => {
  const coll = db.collection('many');
  await coll.insertMany(Array.from({ length: 250 }, (_, i) => ({ _id: i, v: i % 7, s: `x${i}` })));
  const all = await coll.find({}, { batchSize: 10 }).toArray();
  assert.equal(all.length, 250);
  const page = await coll.find({ v: 3 }, { projection: { s: 1, _id: 0 } }).sort({ _id: -1 }).skip(2).limit(3).toArray();
  assert.deepEqual(page, [{ s: 'x234' }, { s: 'x227' }, { s: 'x220' }]);
  assert.equal(await coll.countDocuments({ v: 0 }), 36);
  assert.deepEqual((await coll.distinct('v')).length, 7);
  const agg = await coll.aggregate([{ $group: { _id: '$v', n: { $sum: 1 } } }, { $sort: { _id: 1 } }]).toArray();
  assert.equal(agg[0].n, 36);
});

test('projections: positional, $slice, $elemMatch, exclusion, stored field order', async () => {
  const coll = db.collection('proj');
  await coll.insertOne({ _id: 1, s: [{ x: 1 }, { x: 2, y: new Int32(0) }], t: [1, 2, 3], z: 'last' });
  const [p1] = await coll.find({ 's.x': 2 }, { projection: { 's.$': 1 }, ...raw }).toArray();
  assert.deepEqual(Object.keys(p1), ['_id', 's']);
  assert.equal(p1.s.length, 1);
  assert.equal(p1.s[0].y._bsontype, 'Int32');
  const [p2] = await coll.find({}, { projection: { t: { $slice: -2 }, s: { $elemMatch: { x: 1 } } } }).toArray();
  assert.deepEqual(p2, { _id: 1, s: [{ x: 1 }], t: [2, 3] });
  const [p3] = await coll.find({}, { projection: { s: 0, t: 0 } }).toArray();
  assert.deepEqual(p3, { _id: 1, z: 'last' });
  const [p4] = await coll.find({}, { projection: { z: 1, _id: 0 } }).toArray();
  assert.deepEqual(p4, { z: 'last' });
});

test('$type distinguishes int, long, double and decimal', async () => {
  const coll = db.collection('typeq');
  await coll.insertMany([
    { _id: 1, v: new Int32(1) }, { _id: 2, v: Long.fromNumber(1) }, { _id: 3, v: new Double(1) },
    { _id: 4, v: Decimal128.fromString('1') }, { _id: 5, v: 'one' }, { _id: 6, v: [new Int32(1), 'x'] },
  ]);
  const ids = async (t) => (await coll.find({ v: { $type: t } }).toArray()).map((x) => x._id);
  assert.deepEqual(await ids('int'), [1, 6]);
  assert.deepEqual(await ids('long'), [2]);
  assert.deepEqual(await ids(1), [3]);
  assert.deepEqual(await ids('decimal'), [4]);
  assert.deepEqual(await ids('number'), [1, 2, 3, 4, 6]);
  assert.deepEqual(await ids('array'), [6]);
  assert.deepEqual(await ids(['string', 'long']), [2, 5, 6]);
  assert.equal(await coll.countDocuments({ v: { $type: 'long', $gte: 1 } }), 1);
});

test('an exclusion projection of a nested field does not change what later queries see', async () => {
  const coll = db.collection('projmut');
  await coll.insertOne({ _id: 1, n: { a: 1, b: 2 } });
  assert.deepEqual(await coll.findOne({}, { projection: { 'n.b': 0 } }), { _id: 1, n: { a: 1 } });
  assert.equal(await coll.countDocuments({ 'n.b': 2 }), 1);
  assert.deepEqual(await coll.findOne({ 'n.b': 2 }), { _id: 1, n: { a: 1, b: 2 } });
});

test('filters compare Int64 beyond 2^53 and Decimal128 exactly (equality, ranges, $in/$nin/$ne, $or, arrays)', async () => {
  const coll = db.collection('exact');
  const big = (s) => Long.fromString(s);
  await coll.insertMany([
    { _id: 1, a: big('9007199254740993') },
    { _id: 2, a: big('9007199254740992') },
    { _id: 3, a: new Double(9007199254740992) },
    { _id: 4, a: Decimal128.fromString('9007199254740993') },
    { _id: 5, a: Decimal128.fromString('0.1') },
    { _id: 6, a: new Double(0.1) },
    { _id: 7, a: [big('9007199254740993'), new Int32(1)] },
    { _id: 8, a: big('-9223372036854775808') },
    { _id: 9, a: big('9223372036854775807') },
  ]);
  const ids = async (f) => (await coll.find(f).sort({ _id: 1 }).toArray()).map((x) => x._id);
  assert.deepEqual(await ids({ a: big('9007199254740993') }), [1, 4, 7]);
  assert.deepEqual(await ids({ a: big('9007199254740992') }), [2, 3]);
  assert.deepEqual(await ids({ a: 9007199254740992 }), [2, 3], 'a double operand is exact too');
  assert.deepEqual(await ids({ a: { $gt: 9007199254740992 } }), [1, 4, 7, 9]);
  assert.deepEqual(await ids({ a: { $gte: big('9007199254740993'), $lt: big('9223372036854775807') } }), [1, 4, 7]);
  assert.deepEqual(await ids({ a: { $lte: big('9007199254740992'), $gt: 1 } }), [2, 3, 7], 'array elements satisfy each condition separately');
  assert.deepEqual(await ids({ a: { $in: [big('9007199254740993'), 'x'] } }), [1, 4, 7]);
  assert.deepEqual(await ids({ a: { $nin: [big('9007199254740993'), big('9007199254740992')] } }), [5, 6, 8, 9]);
  assert.deepEqual(await ids({ a: { $ne: big('9007199254740992') } }), [1, 4, 5, 6, 7, 8, 9]);
  assert.deepEqual(await ids({ $or: [{ a: big('9223372036854775807') }, { _id: 5 }] }), [5, 9]);
  assert.deepEqual(await ids({ a: big('9223372036854775806') }), [], 'Long max - 1 is not Long max');
  assert.deepEqual(await ids({ a: { $lt: big('-9223372036854775807') } }), [8]);
  // Decimal128 0.1 is not the double nearest 0.1.
  assert.deepEqual(await ids({ a: Decimal128.fromString('0.1') }), [5]);
  assert.deepEqual(await ids({ a: 0.1 }), [6]);
  assert.deepEqual(await ids({ a: { $lt: new Double(0.1), $gt: 0 } }), [5], 'Decimal 0.1 is below the double 0.1 (0.1000000000000000055...)');
  // The same exactness in count, delete, update and a leading aggregation $match.
  assert.equal(await coll.countDocuments({ a: big('9007199254740993') }), 3);
  assert.deepEqual((await coll.aggregate([{ $match: { a: big('9007199254740992') } }]).toArray()).map((x) => x._id), [2, 3]);
  const u = await coll.updateMany({ a: big('9007199254740993') }, { $set: { hit: true } });
  assert.equal(u.matchedCount, 3);
  assert.equal((await coll.deleteMany({ a: { $gte: big('9223372036854775807') } })).deletedCount, 1);
  // Sorting is exact across the types.
  const sorted = (await coll.find({ _id: { $in: [1, 2, 3, 4, 5] } }).sort({ a: -1, _id: 1 }).toArray()).map((x) => x._id);
  assert.deepEqual(sorted, [1, 4, 2, 3, 5]);
  // NaN equals only NaN and is neither above nor below anything.
  await coll.insertOne({ _id: 10, a: new Double(NaN) });
  assert.deepEqual(await ids({ a: NaN }), [10]);
  assert.deepEqual(await ids({ a: { $gte: 1, $lte: big('9007199254740992') } }), [2, 3, 7]);
  assert.deepEqual(await ids({ a: { $lt: 1 } }), [5, 6, 8]);
  await coll.deleteOne({ _id: 10 });
  // $elemMatch and $not compare exactly as well.
  const arr = db.collection('exact_arr');
  await arr.insertMany([
    { _id: 1, items: [{ q: big('9007199254740993'), k: 'a' }, { q: new Int32(1), k: 'b' }], v: [big('9007199254740993')] },
    { _id: 2, items: [{ q: big('9007199254740992'), k: 'a' }], v: [big('9007199254740992'), new Int32(3)] },
  ]);
  const aids = async (f) => (await arr.find(f).sort({ _id: 1 }).toArray()).map((x) => x._id);
  assert.deepEqual(await aids({ items: { $elemMatch: { q: big('9007199254740993'), k: 'a' } } }), [1]);
  assert.deepEqual(await aids({ items: { $elemMatch: { q: { $gt: 9007199254740992 } } } }), [1]);
  assert.deepEqual(await aids({ v: { $elemMatch: { $gt: 9007199254740992, $lt: big('9007199254740994') } } }), [1]);
  assert.deepEqual(await aids({ v: { $not: { $gt: 9007199254740992 } } }), [2]);
  // Conditions inside updates, validators and partial indexes are exact as well.
  await arr.updateOne({ _id: 1 }, { $set: { 'items.$[e].hit': true } }, { arrayFilters: [{ 'e.q': big('9007199254740993') }] });
  assert.deepEqual((await arr.findOne({ _id: 1 })).items.map((x) => x.hit === true), [true, false]);
  await arr.updateOne({ _id: 2 }, { $pull: { v: big('9007199254740993'), items: { q: big('9007199254740993') } } });
  assert.equal((await arr.findOne({ _id: 2 })).v.length, 2, '$pull of ...993 leaves ...992');
  await arr.updateOne({ _id: 2 }, { $pull: { v: { $gt: 9007199254740991, $lt: big('9007199254740993') } } });
  assert.equal((await arr.findOne({ _id: 2 })).v.length, 1);
  await db.createCollection('exact_val', { validator: { n: { $gt: big('9007199254740992') } } });
  const val = db.collection('exact_val');
  await val.insertOne({ n: big('9007199254740993') });
  await assert.rejects(val.insertOne({ n: big('9007199254740992') }), (e) => e.code === 121);
  const pix = db.collection('exact_pix');
  await pix.createIndex({ k: 1 }, { unique: true, partialFilterExpression: { n: { $gt: big('9007199254740992') } } });
  await pix.insertMany([{ k: 1, n: big('9007199254740992') }, { k: 1, n: big('9007199254740992') }, { k: 2, n: big('9007199254740993') }]);
  await assert.rejects(pix.insertOne({ k: 2, n: big('9007199254740994') }), (e) => e.code === 11000);
  // $type below $or/$and/$nor sees the stored types too.
  assert.deepEqual(await ids({ $or: [{ a: { $type: 'decimal' } }, { _id: 2 }] }), [2, 4, 5]);
  assert.deepEqual(await ids({ $and: [{ a: { $type: 'long' } }, { a: { $gt: 0 } }] }), [1, 2, 7]);
  assert.deepEqual(await ids({ $nor: [{ a: { $type: ['long', 'decimal', 'array'] } }] }), [3, 6]);
  // _id and unique keys use the exact value as well.
  const ids2 = db.collection('exact_ids');
  await ids2.insertMany([{ _id: Decimal128.fromString('0.1'), t: 'dec' }, { _id: 0.1, t: 'dbl' }, { _id: big('9007199254740993'), t: 'big' }]);
  await ids2.insertOne({ _id: big('9007199254740992'), t: 'big-1' });
  await assert.rejects(ids2.insertOne({ _id: Decimal128.fromString('9007199254740993.0') }), (e) => e.code === 11000);
  assert.equal((await ids2.findOne({ _id: 0.1 })).t, 'dbl');
  assert.equal((await ids2.findOne({ _id: Decimal128.fromString('0.10') })).t, 'dec');
  assert.equal((await ids2.findOne({ _id: big('9007199254740992') })).t, 'big-1');
});
