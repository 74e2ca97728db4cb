'use strict';
// Catalogue behaviour the specification suites check: clustered collections, collMod's
// prepareUnique / unique conversion and a TTL index's window, and the Atlas Search index commands
// on a 7.0 replica set without Atlas.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const { startDouble } = require('./helpers');

let d;
let client;
let db;

before(async () => {
  d = await startDouble();
  client = new MongoClient(d.uri('directConnection=true'), { serverSelectionTimeoutMS: 5000 });
  await client.connect();
  db = client.db('cat');
});
after(async () => {
  await client.close();
  assert.equal(await d.stop(), 0);
});

test('a clustered collection lists its clusteredIndex and shows it as its _id index', async () => {
  await db.createCollection('clu', { clusteredIndex: { key: { _id: 1 }, unique: true, name: 'by id' } });
  const [info] = await db.listCollections({ name: 'clu' }).toArray();
  assert.deepEqual(info.options.clusteredIndex, { v: 2, key: { _id: 1 }, name: 'by id', unique: true });
  assert.equal(info.idIndex, undefined);
  const ix = await db.collection('clu').listIndexes().toArray();
  assert.deepEqual(ix, [{ v: 2, key: { _id: 1 }, name: 'by id', unique: true, clustered: true }]);
  await db.collection('clu').insertOne({ _id: 1 });
  await assert.rejects(db.collection('clu').insertOne({ _id: 1 }), (e) => e.code === 11000);
  await assert.rejects(db.createCollection('clu2', { clusteredIndex: { key: { a: 1 }, unique: true } }), (e) => e.code === 5979701);
  await assert.rejects(db.createCollection('clu3', { clusteredIndex: { key: { _id: 1 }, unique: false } }), (e) => e.code === 5979700);
});

test('prepareUnique refuses new duplicates; unique conversion reports the existing ones', async () => {
  const c = db.collection('pu');
  await c.insertMany([{ _id: 1, x: 1 }, { _id: 2, x: 1 }, { _id: 3, x: 2 }]);
  await c.createIndex({ x: 1 });
  await assert.rejects(db.command({ collMod: 'pu', index: { keyPattern: { x: 1 }, unique: true } }), (e) => e.code === 72);
  const r = await db.command({ collMod: 'pu', index: { keyPattern: { x: 1 }, prepareUnique: true } });
  assert.equal(r.prepareUnique_new, true);
  await assert.rejects(c.insertOne({ _id: 4, x: 1 }), (e) => e.code === 11000);
  await assert.rejects(c.updateOne({ _id: 3 }, { $set: { x: 1 } }), (e) => e.code === 11000);
  await c.insertOne({ _id: 5, x: 3 });
  await assert.rejects(db.command({ collMod: 'pu', index: { keyPattern: { x: 1 }, unique: true } }), (e) => {
    assert.equal(e.code, 359);
    assert.equal(e.codeName, 'CannotConvertIndexToUnique');
    assert.deepEqual(e.errorResponse.violations, [{ ids: [1, 2] }]);
    return true;
  });
  await c.deleteOne({ _id: 2 });
  await db.command({ collMod: 'pu', index: { keyPattern: { x: 1 }, unique: true } });
  const spec = (await c.listIndexes().toArray()).find((i) => i.name === 'x_1');
  assert.equal(spec.unique, true);
  await assert.rejects(c.insertOne({ _id: 6, x: 3 }), (e) => e.code === 11000);
});

test('a TTL index keeps its window: createIndexes with another one conflicts, collMod changes it', async () => {
  const c = db.collection('ttl');
  await c.createIndex({ at: 1 }, { name: 'expires', expireAfterSeconds: 60 });
  await c.createIndex({ at: 1 }, { name: 'expires', expireAfterSeconds: 60 }); // the same: nothing to do
  await assert.rejects(c.createIndex({ at: 1 }, { name: 'expires', expireAfterSeconds: 90 }), (e) => e.code === 85);
  const r = await db.command({ collMod: 'ttl', index: { name: 'expires', expireAfterSeconds: 90 } });
  assert.equal(r.expireAfterSeconds_old, 60);
  assert.equal(r.expireAfterSeconds_new, 90);
  const spec = (await c.listIndexes().toArray()).find((i) => i.name === 'expires');
  assert.equal(spec.expireAfterSeconds, 90);
  const again = await db.command({ collMod: 'ttl', index: { name: 'expires', expireAfterSeconds: 90 } });
  assert.equal(again.expireAfterSeconds_new, undefined);
  await assert.rejects(db.command({ collMod: 'ttl', index: { name: 'expires', expireAfterSeconds: -1 } }), (e) => e.code === 2);
  await assert.rejects(db.command({ collMod: 'ttl', index: { name: 'nope', expireAfterSeconds: 5 } }), (e) => e.code === 27);
});

test('search index commands and $listSearchIndexes answer as a 7.0 mongod outside Atlas', async () => {
  await db.collection('s').insertOne({ _id: 1 });
  for (const cmd of [
    { createSearchIndexes: 's', indexes: [{ definition: { mappings: { dynamic: true } } }] },
    { dropSearchIndex: 's', name: 'x' },
    { updateSearchIndex: 's', name: 'x', definition: {} },
  ]) {
    await assert.rejects(db.command(cmd), (e) => {
      assert.equal(e.code, 115);
      assert.equal(e.message, 'Search index commands are only supported with Atlas.');
      return true;
    });
  }
  await assert.rejects(db.collection('s').listSearchIndexes().toArray(), (e) => e.code === 115 && /Atlas/.test(e.message));
});
