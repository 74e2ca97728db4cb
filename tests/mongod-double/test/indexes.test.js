'use strict';
// Unique indexes (plain, compound, partial, sparse), their error shape, and index catalogue
// commands.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient, Long, Double } = require('mongodb');
const { startDouble } = require('./helpers');

let d;
let client;
let db;

before(async () => {
  d = await startDouble();
  client = new MongoClient(d.uri('directConnection=true'), { serverSelectionTimeoutMS: 5000 });
  await client.connect();
  db = client.db('ix');
});
after(async () => {
  await client.close();
  assert.equal(await d.stop(), 0);
});

test('unique index violation has the real mongod shape, and 1 / 1.0 / Long 1 collide', async () => {
  const coll = db.collection('u');
  assert.equal(await coll.createIndex({ a: 1 }, { unique: true }), 'a_1');
  await coll.insertOne({ _id: 1, a: 1 });
  for (const v of [1, new Double(1), Long.fromNumber(1)]) {
    await assert.rejects(coll.insertOne({ _id: 2, a: v }), (e) => {
      assert.equal(e.code, 11000);
      assert.match(e.message, /^E11000 duplicate key error collection: ix\.u index: a_1 dup key: \{ a: 1(\.0)? \}$/);
      assert.deepEqual(e.errorResponse.keyPattern, { a: 1 });
      assert.deepEqual(Object.keys(e.errorResponse.keyValue), ['a']);
      return true;
    });
  }
  await coll.insertOne({ _id: 3, a: 2 });
  await assert.rejects(coll.updateOne({ _id: 3 }, { $set: { a: 1 } }), (e) => e.code === 11000);
  await coll.updateOne({ _id: 1 }, { $set: { a: 5 } }); // frees key 1
  await coll.insertOne({ _id: 4, a: 1 });
});

test('insertMany unordered reports every failing index and keeps going', async () => {
  const coll = db.collection('many');
  const r = await coll.insertMany([{ _id: 1 }, { _id: 1 }, { _id: 2 }, { _id: 2 }], { ordered: false }).catch((e) => e);
  assert.equal(r.code, 11000);
  assert.deepEqual(r.writeErrors.map((w) => w.index), [1, 3]);
  assert.equal(await coll.countDocuments(), 2);
  const o = await coll.insertMany([{ _id: 5 }, { _id: 1 }, { _id: 6 }]).catch((e) => e);
  assert.deepEqual(o.writeErrors.map((w) => w.index), [1]);
  assert.equal(await coll.countDocuments(), 3);
});

test('partial and sparse unique indexes only cover matching documents', async () => {
  const p = db.collection('partial');
  await p.createIndex({ email: 1 }, { unique: true, partialFilterExpression: { active: true } });
  await p.insertMany([{ email: 'a', active: false }, { email: 'a', active: false }, { email: 'a', active: true }]);
  await assert.rejects(p.insertOne({ email: 'a', active: true }), (e) => e.code === 11000);
  const s = db.collection('sparse');
  await s.createIndex({ tag: 1 }, { unique: true, sparse: true });
  await s.insertMany([{ x: 1 }, { x: 2 }, { tag: 't' }]);
  await assert.rejects(s.insertOne({ tag: 't' }), (e) => e.code === 11000);
  const n = db.collection('nonsparse');
  await n.createIndex({ tag: 1 }, { unique: true });
  await n.insertOne({ x: 1 });
  await assert.rejects(n.insertOne({ x: 2 }), (e) => e.code === 11000 && /dup key: \{ tag: null \}/.test(e.message));
});

test('createIndexes is idempotent, listIndexes and dropIndexes work', async () => {
  const coll = db.collection('cat');
  const r1 = await db.command({ createIndexes: 'cat', indexes: [{ key: { a: 1, b: -1 }, name: 'ab', unique: true }] });
  assert.equal(r1.createdCollectionAutomatically, true);
  assert.equal(r1.numIndexesBefore, 1);
  assert.equal(r1.numIndexesAfter, 2);
  const r2 = await db.command({ createIndexes: 'cat', indexes: [{ key: { a: 1, b: -1 }, name: 'ab', unique: true }] });
  assert.equal(r2.note, 'all indexes already exist');
  const list = await coll.listIndexes().toArray();
  assert.deepEqual(list.map((i) => i.name), ['_id_', 'ab']);
  assert.equal(list[1].unique, true);
  await coll.insertMany([{ a: 1, b: 1 }, { a: 1, b: 2 }]);
  await assert.rejects(coll.insertOne({ a: 1, b: 2 }), (e) => e.code === 11000 && /dup key: \{ a: 1, b: 2 \}/.test(e.message));
  await coll.dropIndex('ab');
  await coll.insertOne({ a: 1, b: 2 });
  await assert.rejects(db.command({ listIndexes: 'nope' }), (e) => e.code === 26);
  await assert.rejects(coll.dropIndex('nope'), (e) => e.code === 27);
  await coll.insertOne({ a: 9, b: 9 });
  await assert.rejects(coll.createIndex({ a: 1 }, { unique: true }), (e) => e.code === 11000);
});

test('a unique key held by an open transaction conflicts for another transaction', async () => {
  const coll = db.collection('txu');
  await coll.createIndex({ k: 1 }, { unique: true });
  const s1 = client.startSession();
  const s2 = client.startSession();
  s1.startTransaction();
  s2.startTransaction();
  await coll.insertOne({ k: 'x' }, { session: s1 });
  await assert.rejects(coll.insertOne({ k: 'x' }, { session: s2 }), (e) => e.code === 112);
  await s1.commitTransaction();
  await s2.abortTransaction();
  await assert.rejects(coll.insertOne({ k: 'x' }), (e) => e.code === 11000);
  await s1.endSession();
  await s2.endSession();
});

test('_id $in and $nin over many ids match as the _id index does (numeric types, strings, ObjectIds), with the rest of the filter', async () => {
  const { ObjectId } = require('mongodb');
  const coll = db.collection('idset');
  const oids = Array.from({ length: 20 }, () => new ObjectId());
  const docs = [
    ...oids.map((o, i) => ({ _id: o, k: i % 2 })),
    ...Array.from({ length: 20 }, (_, i) => ({ _id: `s${i}`, k: i % 2 })),
    ...Array.from({ length: 20 }, (_, i) => ({ _id: i, k: i % 2 })),
  ];
  await coll.insertMany(docs);
  const some = [...oids.slice(0, 10), 's1', 's2', 's3', new Double(4), Long.fromNumber(5), 6, 'nope', new ObjectId()];
  const got = await coll.find({ _id: { $in: some }, k: 0 }).toArray();
  const want = docs.filter((x) => x.k === 0 && (oids.slice(0, 10).some((o) => o.equals(x._id)) || ['s1', 's2', 's3'].includes(x._id) || [4, 5, 6].includes(x._id)));
  assert.deepEqual(got.map((x) => String(x._id)).sort(), want.map((x) => String(x._id)).sort());
  const notIn = await coll.countDocuments({ _id: { $nin: some } });
  assert.equal(notIn, docs.length - (10 + 3 + 3));
  const upd = await coll.updateMany({ _id: { $in: some }, k: 1 }, { $set: { hit: true } });
  assert.equal(upd.modifiedCount, docs.filter((x) => x.k === 1 && (oids.slice(0, 10).some((o) => o.equals(x._id)) || ['s1', 's2', 's3'].includes(x._id) || [4, 5, 6].includes(x._id))).length);
  const del = await coll.deleteMany({ _id: { $nin: some } });
  assert.equal(del.deletedCount, docs.length - 16);
});
