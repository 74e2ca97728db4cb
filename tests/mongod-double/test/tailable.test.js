'use strict';
// Tailable cursors (find with tailable: true), as mongod 7.0 serves them: only on a capped
// collection and in natural order; the cursor stays open when its documents run out, an
// empty getMore keeps it, later inserts come with the next getMore; a query that matched
// nothing gives a dead cursor.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient, Long } = require('mongodb');
const { startDouble } = require('./helpers');

let d;
let client;
let db;

before(async () => {
  d = await startDouble();
  client = new MongoClient(d.uri(), { serverSelectionTimeoutMS: 5000 });
  await client.connect();
  db = client.db('tailable');
  await db.createCollection('capped', { capped: true, size: 4096, max: 3 });
  await db.createCollection('plain');
});
after(async () => {
  await client.close();
  assert.equal(await d.stop(), 0);
});

const idOf = (r) => Long.fromValue(r.cursor.id).toString();
// A cursor id as mongod wants it back (type long), whatever the driver promoted it to.
const cursorId = (r) => Long.fromValue(r.cursor.id);

test('a tailable cursor survives an empty getMore and returns the documents inserted since', async () => {
  const capped = db.collection('capped');
  await capped.insertMany([{ _id: 1 }, { _id: 2 }]);
  const first = await db.command({ find: 'capped', tailable: true });
  assert.deepEqual(first.cursor.firstBatch, [{ _id: 1 }, { _id: 2 }]);
  assert.notEqual(idOf(first), '0');
  const more = (batchSize) => db.command({ getMore: cursorId(first), collection: 'capped', ...(batchSize ? { batchSize } : {}) });
  const empty = await more();
  assert.deepEqual(empty.cursor.nextBatch, []);
  assert.equal(idOf(empty), idOf(first));
  await capped.insertMany([{ _id: 3 }, { _id: 4, skip: true }]);
  const next = await more(1);
  assert.deepEqual(next.cursor.nextBatch, [{ _id: 3 }]);
  assert.deepEqual((await more()).cursor.nextBatch, [{ _id: 4, skip: true }]);
  await db.command({ killCursors: 'capped', cursors: [cursorId(first)] });
});

test('refused on a collection that is not capped, and with a sort other than natural order', async () => {
  await assert.rejects(db.command({ find: 'plain', tailable: true }), (e) => e.code === 2 && /non capped collection/.test(e.message));
  await assert.rejects(db.command({ find: 'capped', tailable: true, sort: { _id: 1 } }), (e) => e.code === 2);
  const natural = await db.command({ find: 'capped', tailable: true, sort: { $natural: 1 } });
  await db.command({ killCursors: 'capped', cursors: [cursorId(natural)] });
});

test('a tailable query that matches nothing gives a dead cursor', async () => {
  const r = await db.command({ find: 'capped', tailable: true, filter: { _id: 'none' } });
  assert.deepEqual(r.cursor.firstBatch, []);
  assert.equal(idOf(r), '0');
});
