'use strict';
// A unique index rejects duplicates with E11000 (code 11000) and reports
// keyPattern/keyValue, through the official driver and through Mongoose.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient, MongoServerError, MongoBulkWriteError } = require('mongodb');
const mongoose = require('mongoose');
const { serverForTests, uniqueDbName } = require('../lib/double');

let server;
let client;

test.before(async () => {
  server = await serverForTests();
  client = new MongoClient(server.uri, { serverSelectionTimeoutMS: 10000 });
  await client.connect();
});

test.after(async () => {
  if (client) await client.close();
  if (server) await server.stop();
});

test('driver: duplicate key on a unique index', { timeout: 60000 }, async () => {
  const db = client.db(uniqueDbName('uniq'));
  const users = db.collection('users');
  const name = await users.createIndex({ email: 1 }, { unique: true });
  assert.equal(name, 'email_1');
  const indexes = await users.listIndexes().toArray();
  assert.ok(indexes.some((i) => i.name === 'email_1' && i.unique === true), `indexes: ${JSON.stringify(indexes)}`);

  await users.insertOne({ _id: 1, email: 'a@example.com' });
  await assert.rejects(users.insertOne({ _id: 2, email: 'a@example.com' }), (e) => {
    assert.ok(e instanceof MongoServerError, `not a server error: ${e}`);
    assert.equal(e.code, 11000);
    assert.match(e.message, /E11000 duplicate key error/);
    assert.deepEqual(e.keyPattern, { email: 1 });
    assert.deepEqual(e.keyValue, { email: 'a@example.com' });
    return true;
  });

  // An update that would create a duplicate is rejected too.
  await users.insertOne({ _id: 3, email: 'b@example.com' });
  await assert.rejects(users.updateOne({ _id: 3 }, { $set: { email: 'a@example.com' } }), (e) => {
    assert.equal(e.code, 11000);
    assert.deepEqual(e.keyValue, { email: 'a@example.com' });
    return true;
  });

  // Ordered insertMany stops at the duplicate and reports its index.
  await assert.rejects(users.insertMany([{ _id: 4, email: 'c@example.com' }, { _id: 5, email: 'b@example.com' },
    { _id: 6, email: 'd@example.com' }]), (e) => {
    assert.ok(e instanceof MongoBulkWriteError, `got ${e}`);
    assert.equal(e.writeErrors.length, 1);
    assert.equal(e.writeErrors[0].index, 1);
    assert.equal(e.writeErrors[0].code, 11000);
    assert.equal(e.result.insertedCount, 1);
    return true;
  });
  assert.deepEqual((await users.find({}, { sort: { _id: 1 } }).toArray()).map((d) => d._id), [1, 3, 4]);

  // Duplicate _id is the same error class.
  await assert.rejects(users.insertOne({ _id: 1, email: 'z@example.com' }), (e) => {
    assert.equal(e.code, 11000);
    assert.deepEqual(e.keyPattern, { _id: 1 });
    assert.deepEqual(e.keyValue, { _id: 1 });
    return true;
  });
  await db.dropDatabase();
});

test('mongoose: unique schema path raises E11000 with keyPattern/keyValue', { timeout: 60000 }, async () => {
  const dbName = uniqueDbName('uniq_mg');
  const conn = await mongoose.createConnection(server.uri, { dbName, serverSelectionTimeoutMS: 10000 }).asPromise();
  try {
    const User = conn.model('User', new mongoose.Schema({ email: { type: String, unique: true }, name: String }));
    await User.init(); // builds the unique index
    const idx = await User.collection.indexes();
    assert.ok(idx.some((i) => i.key && i.key.email === 1 && i.unique), `indexes: ${JSON.stringify(idx)}`);
    await User.create({ email: 'x@example.com', name: 'first' });
    await assert.rejects(User.create({ email: 'x@example.com', name: 'second' }), (e) => {
      assert.equal(e.code, 11000);
      assert.deepEqual({ ...e.keyPattern }, { email: 1 });
      assert.deepEqual({ ...e.keyValue }, { email: 'x@example.com' });
      return true;
    });
    assert.equal(await User.countDocuments(), 1);
    await conn.dropDatabase();
  } finally {
    await conn.close();
  }
});
