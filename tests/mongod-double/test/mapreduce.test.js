'use strict';
// mapReduce as mongod 7.0 serves it: JavaScript map/reduce/finalize over the query's
// documents, inline results in key order, output to a collection (replace, merge, reduce), its
// errors, and its refusal inside a transaction and in the Stable API's strict mode.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient, Code, Double } = require('mongodb');
const { startDouble } = require('./helpers');

let d;
let client;
let db;

before(async () => {
  d = await startDouble();
  client = new MongoClient(d.uri(), { serverSelectionTimeoutMS: 5000 });
  await client.connect();
  db = client.db('mapreduce');
  await db.collection('c').insertMany([{ _id: 1, x: 0, k: 'a' }, { _id: 2, x: 1, k: 'b' }, { _id: 3, x: 2, k: 'a' }]);
});
after(async () => {
  await client.close();
  assert.equal(await d.stop(), 0);
});

const byKey = 'function () { emit(this.k, this.x + 1) }';
const sum = 'function (key, values) { return values.reduce((a, b) => a + b, 0) }';

test('inline: one {_id, value} per emitted key, in key order, JS numbers as doubles', async () => {
  const r = await db.command({ mapReduce: 'c', map: new Code(byKey), reduce: new Code(sum), out: { inline: 1 } },
    { promoteValues: false });
  assert.deepEqual(r.results.map((x) => [x._id, x.value.valueOf()]), [['a', 4], ['b', 2]]);
  // mongod's JS engine has one number type: the values come back as doubles.
  assert.ok(r.results[0].value instanceof Double);
});

test('the spec test\'s own command: emit(0, this.x + 1) reduced to 6; query, sort, limit, scope and finalize apply', async () => {
  const r = await db.command({
    mapReduce: 'c', map: new Code('function inc() { return emit(0, this.x + 1) }'),
    reduce: new Code('function sum(key, values) { return values.reduce((acc, x) => acc + x); }'), out: { inline: 1 },
  });
  assert.deepEqual(r.results, [{ _id: 0, value: 6 }]);
  const q = await db.command({
    mapReduce: 'c', map: byKey, reduce: sum, out: { inline: 1 }, query: { x: { $gte: 1 } }, sort: { _id: 1 }, limit: 1,
    scope: { factor: 10 }, finalize: 'function (key, v) { return v * factor }',
  });
  assert.deepEqual(q.results, [{ _id: 'b', value: 20 }]);
});

test('a key emitted once is not reduced', async () => {
  const r = await db.command({ mapReduce: 'c', map: 'function () { emit(this._id, this.x) }', reduce: 'function () { throw new Error("reduced") }', out: { inline: 1 } });
  assert.deepEqual(r.results, [{ _id: 1, value: 0 }, { _id: 2, value: 1 }, { _id: 3, value: 2 }]);
});

test('output to a collection: replace, merge, reduce', async () => {
  const out = db.collection('out');
  let r = await db.command({ mapReduce: 'c', map: byKey, reduce: sum, out: 'out' });
  assert.deepEqual({ result: r.result, ok: r.ok }, { result: 'out', ok: 1 });
  assert.deepEqual(await out.find().sort({ _id: 1 }).toArray(), [{ _id: 'a', value: 4 }, { _id: 'b', value: 2 }]);
  await out.insertOne({ _id: 'z', value: 100 });
  r = await db.command({ mapReduce: 'c', map: byKey, reduce: sum, out: { reduce: 'out' } });
  assert.deepEqual(await out.find().sort({ _id: 1 }).toArray(), [{ _id: 'a', value: 8 }, { _id: 'b', value: 4 }, { _id: 'z', value: 100 }]);
  r = await db.command({ mapReduce: 'c', map: byKey, reduce: sum, out: { merge: 'out', db: 'mapreduce2' } });
  assert.deepEqual(r.result, { db: 'mapreduce2', collection: 'out' });
  assert.deepEqual(await client.db('mapreduce2').collection('out').countDocuments(), 2);
  await db.command({ mapReduce: 'c', map: byKey, reduce: sum, out: { replace: 'out' } });
  assert.equal(await out.countDocuments(), 2);
});

test('errors: missing fields, a bad out, a throwing function (139), inside a transaction (263), apiStrict (323)', async () => {
  const fails = (cmd, code) => assert.rejects(db.command(cmd), (e) => { assert.equal(e.code, code, e.message); return true; });
  await fails({ mapReduce: 'c', reduce: sum, out: { inline: 1 } }, 40414);
  await fails({ mapReduce: 'c', map: byKey, reduce: sum }, 40414);
  await fails({ mapReduce: 'c', map: byKey, reduce: sum, out: { inline: 2 } }, 13606);
  await assert.rejects(db.command({ mapReduce: 'c', map: 'function () { undefinedFn() }', reduce: sum, out: { inline: 1 } }),
    (e) => e.code === 139 && e.codeName === 'JSInterpreterFailure' && /ReferenceError/.test(e.message));
  await fails({ mapReduce: 'c', map: byKey, reduce: sum, out: { inline: 1 }, apiVersion: '1', apiStrict: true }, 323);
  const s = client.startSession();
  try {
    s.startTransaction();
    await assert.rejects(db.command({ mapReduce: 'c', map: byKey, reduce: sum, out: { inline: 1 } }, { session: s }),
      (e) => e.code === 263);
  } finally {
    await s.abortTransaction().catch(() => {});
    await s.endSession();
  }
});
