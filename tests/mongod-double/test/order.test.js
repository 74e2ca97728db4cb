'use strict';
// Field order: documents keep the client's field order exactly, integer-like names ("1", "2")
// included (plain JavaScript objects would list those first). Requests are built from Maps and
// replies are read from the raw bytes, so neither side of the test reorders anything.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { BSON, Double } = require('bson');
const { startDouble, rawConnect } = require('./helpers');

let d;
let c;
before(async () => {
  d = await startDouble();
  c = await rawConnect(d.port);
});
after(async () => {
  c.close();
  assert.equal(await d.stop(), 0);
});

const M = (...pairs) => new Map(pairs);

// Sends a command and returns the reply's raw BSON body.
async function send(cmd) {
  const { opMsg } = require('./helpers');
  c.send(opMsg(cmd).msg);
  const r = await c.next();
  assert.ok(r && r !== 'timeout', 'reply');
  assert.equal(r.doc.ok.valueOf(), 1, JSON.stringify(r.doc));
  return r.raw.subarray(21);
}

// Field names of the document reached by `path` (names, or indexes in arrays) in raw BSON.
function keysAt(bytes, path) {
  let start = 0;
  for (const step of path) {
    const els = BSON.onDemand.parseToElements(bytes, start);
    const name = (e) => Buffer.from(bytes.buffer, bytes.byteOffset + e[1], e[2]).toString('utf8');
    const e = els.find((x) => name(x) === String(step));
    assert.ok(e, `no field ${step}`);
    start = e[3];
  }
  return BSON.onDemand.parseToElements(bytes, start).map((e) => Buffer.from(bytes.buffer, bytes.byteOffset + e[1], e[2]).toString('utf8'));
}

const first = ['cursor', 'firstBatch', 0];

test('insert/find round-trips integer-like field names in the client order, nested too', async () => {
  const doc = M(['_id', 1], ['b', 1], ['2', 1], ['a', 1], ['1', 1], ['sub', M(['z', 1], ['10', 1], ['y', 1], ['0', 1])], ['arr', [M(['k', 1], ['7', 1])]]);
  await send({ insert: 'o', documents: [doc], $db: 'ord' });
  const r = await send({ find: 'o', filter: { _id: 1 }, $db: 'ord' });
  assert.deepEqual(keysAt(r, first), ['_id', 'b', '2', 'a', '1', 'sub', 'arr']);
  assert.deepEqual(keysAt(r, [...first, 'sub']), ['z', '10', 'y', '0']);
  assert.deepEqual(keysAt(r, [...first, 'arr', 0]), ['k', '7']);
  // _id goes first even when the client put it later, the rest keeps its order.
  await send({ insert: 'o', documents: [M(['2', 1], ['x', 1], ['_id', 2], ['1', 1])], $db: 'ord' });
  const r2 = await send({ find: 'o', filter: { _id: 2 }, $db: 'ord' });
  assert.deepEqual(keysAt(r2, first), ['_id', '2', 'x', '1']);
  // A projection keeps the stored order.
  const p = await send({ find: 'o', filter: { _id: 1 }, projection: M(['1', 1], ['b', 1], ['2', 1]), $db: 'ord' });
  assert.deepEqual(keysAt(p, first), ['_id', 'b', '2', '1']);
});

test('updates: $set of a new integer-like field appends it; existing fields stay in place', async () => {
  await send({ insert: 'u', documents: [M(['_id', 1], ['b', 1], ['2', 1], ['a', 1], ['1', 1])], $db: 'ord' });
  await send({ update: 'u', updates: [{ q: { _id: 1 }, u: { $set: M(['3', 1]) } }], $db: 'ord' });
  let r = await send({ find: 'u', filter: {}, $db: 'ord' });
  assert.deepEqual(keysAt(r, first), ['_id', 'b', '2', 'a', '1', '3']);
  // Existing fields are updated in place; several new fields come in mongod's processing
  // order (numeric names numerically, others as strings).
  await send({ update: 'u', updates: [{ q: { _id: 1 }, u: { $set: M(['2', 5], ['zz', 1], ['10', 1], ['9', 1]), $inc: M(['b', 1]) } }], $db: 'ord' });
  r = await send({ find: 'u', filter: {}, $db: 'ord' });
  assert.deepEqual(keysAt(r, first), ['_id', 'b', '2', 'a', '1', '3', '9', '10', 'zz']);
  // $unset then a new field; nested $set in a subdocument.
  await send({ update: 'u', updates: [{ q: { _id: 1 }, u: { $unset: M(['a', '']), $set: M(['s.q', 1], ['s.4', 1]) } }], $db: 'ord' });
  r = await send({ find: 'u', filter: {}, $db: 'ord' });
  assert.deepEqual(keysAt(r, first), ['_id', 'b', '2', '1', '3', '9', '10', 'zz', 's']);
  assert.deepEqual(keysAt(r, [...first, 's']), ['4', 'q']);
  // A replacement keeps the replacement's order; findAndModify returns it as stored.
  const fam = await send({ findAndModify: 'u', query: { _id: 1 }, update: M(['x', 1], ['5', 1], ['w', 1]), new: true, $db: 'ord' });
  assert.deepEqual(keysAt(fam, ['value']), ['_id', 'x', '5', 'w']);
  // An upsert seeded from the query.
  await send({ update: 'u', updates: [{ q: M(['_id', 2], ['k', 1], ['6', 1]), u: { $set: M(['a', 1]) }, upsert: true }], $db: 'ord' });
  r = await send({ find: 'u', filter: { _id: 2 }, $db: 'ord' });
  assert.deepEqual(keysAt(r, first), ['_id', 'k', '6', 'a']);
});

test('aggregation keeps the stored order and appends computed fields', async () => {
  await send({ insert: 'g', documents: [M(['_id', 1], ['b', 1], ['2', 1], ['a', 1], ['1', 1])], $db: 'ord' });
  let r = await send({ aggregate: 'g', pipeline: [{ $match: { _id: 1 } }], cursor: {}, $db: 'ord' });
  assert.deepEqual(keysAt(r, first), ['_id', 'b', '2', 'a', '1']);
  r = await send({ aggregate: 'g', pipeline: [{ $addFields: M(['4', 1]) }, { $match: { a: 1 } }], cursor: {}, $db: 'ord' });
  assert.deepEqual(keysAt(r, first), ['_id', 'b', '2', 'a', '1', '4']);
  r = await send({ aggregate: 'g', pipeline: [{ $project: M(['1', 1], ['a', 1]) }], cursor: {}, $db: 'ord' });
  assert.deepEqual(keysAt(r, first), ['_id', 'a', '1']);
  // New fields come in the order the stage specification gives them.
  r = await send({ aggregate: 'g', pipeline: [{ $addFields: M(['z', 1], ['7', 1], ['y', 1], ['6', 1]) }], cursor: {}, $db: 'ord' });
  assert.deepEqual(keysAt(r, first), ['_id', 'b', '2', 'a', '1', 'z', '7', 'y', '6']);
  r = await send({ aggregate: 'g', pipeline: [{ $group: M(['_id', null], ['n', { $sum: 1 }], ['3', { $sum: 1 }]) }], cursor: {}, $db: 'ord' });
  assert.deepEqual(keysAt(r, first), ['_id', 'n', '3']);
  // $out / $merge copies keep the order too.
  await send({ aggregate: 'g', pipeline: [{ $match: {} }, { $out: 'g2' }], cursor: {}, $db: 'ord' });
  r = await send({ find: 'g2', filter: {}, $db: 'ord' });
  assert.deepEqual(keysAt(r, first), ['_id', 'b', '2', 'a', '1']);
});

test('an embedded document with integer-like names matches in its field order; sort and index key patterns keep theirs', async () => {
  await send({ insert: 'e', documents: [M(['_id', 1], ['s', M(['b', 1], ['1', 1])])], $db: 'ord' });
  const hit = await send({ find: 'e', filter: M(['s', M(['b', 1], ['1', 1])]), $db: 'ord' });
  assert.deepEqual(keysAt(hit, first), ['_id', 's']);
  // mongod compares embedded documents field by field in order: another order is no match.
  const n = async (filter) => {
    const { opMsg } = require('./helpers');
    c.send(opMsg({ find: 'e', filter, $db: 'ord' }).msg);
    return (await c.next()).doc.cursor.firstBatch.length;
  };
  assert.equal(await n(M(['s', M(['1', 1], ['b', 1])])), 0);
  assert.equal(await n({ s: { $eq: M(['1', 1], ['b', 1]) } }), 0);
  assert.equal(await n({ s: { $in: [M(['1', 1], ['b', 1]), 5] } }), 0);
  assert.equal(await n({ s: { $ne: M(['1', 1], ['b', 1]) } }), 1);
  assert.equal(await n({ $or: [{ s: M(['b', 1], ['1', new Double(1)]) }, { x: 1 }] }), 1, 'numbers inside compare by value');
  await send({ insert: 'e', documents: [{ _id: 2, t: { a: 1, b: 2 } }], $db: 'ord' });
  assert.equal(await n({ t: { a: 1, b: 2 } }), 1);
  assert.equal(await n({ t: M(['b', 2], ['a', 1]) }), 0, 'also for ordinary names');
  assert.equal(await n({ t: { a: 1 } }), 0, 'no partial match');
  // The sort on such a field and a compound index key pattern keep their order as well.
  await send({ createIndexes: 'e', indexes: [{ key: M(['z', 1], ['3', 1]), name: 'z3' }], $db: 'ord' });
  const li = await send({ listIndexes: 'e', $db: 'ord' });
  assert.deepEqual(keysAt(li, ['cursor', 'firstBatch', 1, 'key']), ['z', '3']);
});
