'use strict';
// Change streams with the Node.js driver's watch(): events in order with their update
// descriptions, resume after a dropped connection with the resume token, a transaction's
// writes only at its commit, pre- and post-images, invalidation, awaitData getMores that hold
// no one else up, and a resume point that fell out of a small change log (286).

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const { startDouble } = require('./helpers');

let d;
let client;
let db;
const started = [];

before(async () => {
  d = await startDouble();
  client = new MongoClient(d.uri(), { serverSelectionTimeoutMS: 5000, monitorCommands: true });
  client.on('commandStarted', (e) => started.push(e));
  await client.connect();
  db = client.db('cs');
});
after(async () => {
  await client.close();
  assert.equal(await d.stop(), 0);
});

async function opened(cs) {
  await cs.cursor.cursorInit(); // send the aggregate now: later writes are then seen
  return cs;
}

test('watch() sees insert, update, replace and delete in order, with update descriptions', async () => {
  const coll = db.collection('order');
  await coll.insertOne({ _id: 0 });
  const cs = await opened(coll.watch([], { maxAwaitTimeMS: 200 }));
  await coll.insertOne({ _id: 1, a: 1, b: { c: 1, d: 2 }, arr: [1, 2, 3], gone: true });
  await coll.updateOne({ _id: 1 }, { $set: { a: 2, 'b.c': 5, 'n.m': 1 }, $unset: { gone: '' }, $pop: { arr: 1 } });
  await coll.updateOne({ _id: 1 }, { $push: { arr: { $each: [7, 8] } }, $set: { b: { c: 5, d: 2 } } });
  await coll.updateOne({ _id: 1 }, [{ $set: { arr: [1], b: { c: 6, d: 2 } } }]);
  await coll.replaceOne({ _id: 1 }, { x: 'new' });
  await coll.deleteOne({ _id: 1 });
  const ins = await cs.next();
  assert.equal(ins.operationType, 'insert');
  assert.deepEqual(ins.ns, { db: 'cs', coll: 'order' });
  assert.deepEqual(ins.documentKey, { _id: 1 });
  assert.deepEqual(ins.fullDocument, { _id: 1, a: 1, b: { c: 1, d: 2 }, arr: [1, 2, 3], gone: true });
  assert.ok(ins.wallTime instanceof Date);
  const upd = await cs.next();
  assert.equal(upd.operationType, 'update');
  assert.equal(upd.fullDocument, undefined);
  // Operators log each path they name with its new value (a new path from its first new
  // component), the whole array after $pop, appended elements by index.
  assert.deepEqual(upd.updateDescription, {
    updatedFields: { a: 2, 'b.c': 5, n: { m: 1 }, arr: [1, 2] }, removedFields: ['gone'], truncatedArrays: [],
  });
  const push = await cs.next();
  assert.deepEqual(push.updateDescription.updatedFields, { 'arr.2': 7, 'arr.3': 8 }, 'the unchanged $set of b is not logged');
  // A pipeline update is a diff of the versions: a cut array is truncatedArrays.
  const pipe = await cs.next();
  assert.deepEqual(pipe.updateDescription, {
    updatedFields: { 'b.c': 6 }, removedFields: [], truncatedArrays: [{ field: 'arr', newSize: 1 }],
  });
  const rep = await cs.next();
  assert.equal(rep.operationType, 'replace');
  assert.deepEqual(rep.fullDocument, { _id: 1, x: 'new' });
  const del = await cs.next();
  assert.equal(del.operationType, 'delete');
  assert.deepEqual(del.documentKey, { _id: 1 });
  // Resume tokens sort in event order; cluster times do not go backwards.
  const toks = [ins, upd, push, pipe, rep, del].map((e) => e._id._data);
  assert.deepEqual([...toks].sort(), toks);
  assert.ok(del.clusterTime.greaterThan(ins.clusterTime));
  await cs.close();
});

test('a dropped connection is resumed with the last resume token, nothing lost or repeated', async () => {
  const coll = db.collection('resume');
  await coll.drop().catch(() => {});
  const cs = await opened(coll.watch([], { maxAwaitTimeMS: 200 }));
  await coll.insertOne({ _id: 'a' });
  const a = await cs.next();
  assert.equal(a.documentKey._id, 'a');
  await client.db('admin').command({
    configureFailPoint: 'failCommand', mode: { times: 1 }, data: { failCommands: ['getMore'], closeConnection: true },
  });
  await coll.insertMany([{ _id: 'b' }, { _id: 'c' }]);
  const from = started.length;
  assert.equal((await cs.next()).documentKey._id, 'b');
  assert.equal((await cs.next()).documentKey._id, 'c');
  const again = started.slice(from).filter((e) => e.commandName === 'aggregate');
  assert.equal(again.length, 1, 'one new aggregate after the network error');
  // The token of the batch that returned 'a' (its postBatchResumeToken): at or after 'a', before 'b'.
  const spec = again[0].command.pipeline[0].$changeStream;
  assert.ok(spec.resumeAfter._data >= a._id._data, `${spec.resumeAfter._data} >= ${a._id._data}`);
  // Another client resumes from the same token and sees the same events.
  const other = new MongoClient(d.uri(), { serverSelectionTimeoutMS: 5000 });
  const cs2 = other.db('cs').collection('resume').watch([], { resumeAfter: a._id });
  assert.equal((await cs2.next()).documentKey._id, 'b');
  assert.equal((await cs2.next()).documentKey._id, 'c');
  await cs2.close();
  await other.close();
  await cs.close();
});

test("a transaction's writes appear only at its commit, in order, with lsid and txnNumber", async () => {
  const coll = db.collection('txn');
  await coll.insertOne({ _id: 'y', n: 0 });
  const cs = await opened(coll.watch([], { maxAwaitTimeMS: 300 }));
  const s = client.startSession();
  s.startTransaction();
  await coll.insertOne({ _id: 'x' }, { session: s });
  await coll.updateOne({ _id: 'y' }, { $inc: { n: 1 } }, { session: s });
  assert.equal(await cs.tryNext(), null, 'nothing before the commit');
  await s.commitTransaction();
  const e1 = await cs.next();
  const e2 = await cs.next();
  assert.deepEqual([e1.operationType, e2.operationType], ['insert', 'update']);
  assert.deepEqual(e2.updateDescription.updatedFields, { n: 1 });
  for (const e of [e1, e2]) {
    assert.equal(Buffer.from(e.lsid.id.buffer).toString('hex'), Buffer.from(s.id.id.buffer).toString('hex'), 'lsid of the session');
    assert.equal(e.lsid.uid.buffer.length, 32);
    assert.equal(Number(e.txnNumber), 1);
  }
  assert.ok(e1.clusterTime.equals(e2.clusterTime), 'one commit time');
  assert.ok(e1._id._data < e2._id._data);
  // An aborted transaction leaves nothing.
  s.startTransaction();
  await coll.insertOne({ _id: 'z' }, { session: s });
  await s.abortTransaction();
  await coll.insertOne({ _id: 'after' });
  assert.equal((await cs.next()).documentKey._id, 'after');
  await s.endSession();
  await cs.close();
});

test('fullDocument and fullDocumentBeforeChange follow changeStreamPreAndPostImages', async () => {
  await db.collection('img').drop().catch(() => {});
  await db.createCollection('img', { changeStreamPreAndPostImages: { enabled: true } });
  const img = db.collection('img');
  await img.insertOne({ _id: 1, v: 1 });
  const cs = await opened(img.watch([], { fullDocument: 'required', fullDocumentBeforeChange: 'required' }));
  await img.updateOne({ _id: 1 }, { $set: { v: 2 } });
  await img.deleteOne({ _id: 1 });
  const u = await cs.next();
  assert.deepEqual(u.fullDocument, { _id: 1, v: 2 });
  assert.deepEqual(u.fullDocumentBeforeChange, { _id: 1, v: 1 });
  const del = await cs.next();
  assert.deepEqual(del.fullDocumentBeforeChange, { _id: 1, v: 2 });
  await cs.close();

  const plain = db.collection('noimg');
  await plain.insertOne({ _id: 1, v: 1 });
  const look = await opened(plain.watch([], { fullDocument: 'updateLookup', fullDocumentBeforeChange: 'whenAvailable' }));
  await plain.updateOne({ _id: 1 }, { $set: { v: 2 } });
  await plain.updateOne({ _id: 1 }, { $set: { v: 3 } });
  const l1 = await look.next();
  assert.deepEqual(l1.fullDocument, { _id: 1, v: 3 }, 'updateLookup reads the current document');
  assert.equal(l1.fullDocumentBeforeChange, null);
  await look.close();
  const req = await opened(plain.watch([], { fullDocumentBeforeChange: 'required' }));
  await plain.deleteOne({ _id: 1 });
  await assert.rejects(req.next(), (e) => e.code === 47);
  await req.close();
  // collMod turns pre-images on for later writes.
  await db.command({ collMod: 'noimg', changeStreamPreAndPostImages: { enabled: true } });
  const now = await opened(plain.watch([], { fullDocumentBeforeChange: 'required' }));
  await plain.insertOne({ _id: 2, v: 'x' });
  await plain.deleteOne({ _id: 2 });
  await now.next();
  assert.deepEqual((await now.next()).fullDocumentBeforeChange, { _id: 2, v: 'x' });
  await now.close();
});

test("an event's clusterTime is its write's operationTime; startAtOperationTime starts there", async () => {
  const coll = db.collection('optime');
  const s = client.startSession();
  await coll.insertOne({ _id: 'before' });
  await coll.insertOne({ _id: 'at' }, { session: s });
  const at = s.operationTime;
  assert.ok(at, 'the session saw the reply\'s operationTime');
  await coll.insertOne({ _id: 'later' });
  const cs = coll.watch([], { startAtOperationTime: at });
  const first = await cs.next();
  assert.equal(first.documentKey._id, 'at');
  assert.ok(first.clusterTime.equals(at), `${first.clusterTime} = ${at}`);
  assert.equal((await cs.next()).documentKey._id, 'later');
  await cs.close();
  await s.endSession();
});

test('later stages filter and reshape; changing _id fails the stream with 280', async () => {
  const coll = db.collection('stages');
  const cs = await opened(coll.watch([{ $match: { 'fullDocument.keep': true } }, { $project: { fullDocument: 1 } }]));
  await coll.insertMany([{ _id: 1, keep: false }, { _id: 2, keep: true }]);
  const e = await cs.next();
  assert.deepEqual(Object.keys(e).sort(), ['_id', 'fullDocument']);
  assert.equal(e.fullDocument._id, 2);
  await cs.close();
  const bad = await opened(coll.watch([{ $project: { _id: 0 } }]));
  await coll.insertOne({ _id: 3 });
  await assert.rejects(bad.next(), (x) => x.code === 280 && x.hasErrorLabel('NonResumableChangeStreamError'));
  await bad.close().catch(() => {});
});

test('drop invalidates a collection stream; a database stream sees both collections', async () => {
  const dbs = db.watch([], { maxAwaitTimeMS: 200 });
  await dbs.cursor.cursorInit();
  const coll = db.collection('gone');
  await coll.insertOne({ _id: 1 });
  const cs = await opened(coll.watch());
  await db.collection('other').insertOne({ _id: 1 });
  await coll.drop();
  const drop = await cs.next();
  assert.equal(drop.operationType, 'drop');
  const inv = await cs.next();
  assert.equal(inv.operationType, 'invalidate');
  assert.equal(cs.closed || (await cs.tryNext().then(() => false, () => true)), true);
  const seen = [];
  for (let i = 0; i < 3; i++) seen.push(await dbs.next());
  assert.deepEqual(seen.map((e) => `${e.operationType} ${e.ns.coll}`), ['insert gone', 'insert other', 'drop gone']);
  // startAfter the invalidate: a new stream on the same name, after the drop.
  const next = await opened(coll.watch([], { startAfter: inv._id }));
  await coll.insertOne({ _id: 'new' });
  assert.equal((await next.next()).documentKey._id, 'new');
  await next.close();
  await dbs.close();
});

test('an empty getMore waits up to maxAwaitTimeMS and holds no other client up', async () => {
  const coll = db.collection('await');
  const cs = await opened(coll.watch([], { maxAwaitTimeMS: 1500 }));
  const other = new MongoClient(d.uri(), { serverSelectionTimeoutMS: 5000 });
  await other.connect();
  const t0 = Date.now();
  const waiting = cs.next();
  await new Promise((r) => setTimeout(r, 200));
  const p0 = Date.now();
  await other.db('cs').command({ ping: 1 });
  assert.ok(Date.now() - p0 < 500, 'ping answered while the getMore waits');
  await other.db('cs').collection('await').insertOne({ _id: 1 });
  const e = await waiting;
  assert.equal(e.documentKey._id, 1);
  assert.ok(Date.now() - t0 < 1400, `the waiting getMore returned at the insert (${Date.now() - t0} ms)`);
  // Nothing to see: the getMore answers an empty batch after maxTimeMS.
  const t1 = Date.now();
  assert.equal(await cs.tryNext(), null);
  const waited = Date.now() - t1;
  assert.ok(waited >= 1300 && waited < 3000, `waited ${waited} ms`);
  await other.close();
  await cs.close();
});

test('a resume token older than the change log gives ChangeStreamHistoryLost (286)', async () => {
  const small = await startDouble(['--oplog-entries', '5']);
  const c = new MongoClient(small.uri(), { serverSelectionTimeoutMS: 5000 });
  try {
    const coll = c.db('cs').collection('ring');
    const cs = await opened(coll.watch());
    await coll.insertOne({ _id: 0 });
    const first = await cs.next();
    await cs.close();
    for (let i = 1; i <= 10; i++) await coll.insertOne({ _id: i });
    const late = coll.watch([], { resumeAfter: first._id });
    await assert.rejects(late.next(), (e) => e.code === 286 && e.hasErrorLabel('NonResumableChangeStreamError'));
    await late.close().catch(() => {});
    // A recent token still works.
    const cs2 = await opened(coll.watch());
    await coll.insertOne({ _id: 11 });
    const tok = (await cs2.next())._id;
    await cs2.close();
    await coll.insertOne({ _id: 12 });
    const again = coll.watch([], { resumeAfter: tok });
    assert.equal((await again.next()).documentKey._id, 12);
    await again.close();
  } finally {
    await c.close();
    assert.equal(await small.stop(), 0);
  }
});
