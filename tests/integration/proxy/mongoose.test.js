'use strict';
// Mongoose through the proxy (connection string names the proxy, no replicaSet=): CRUD through
// models, a query cursor over several getMore batches, connection.transaction() retried after a
// forced write conflict, a retryable write retried after the upstream closes the connection,
// and a w:0 save.

const test = require('node:test');
const assert = require('node:assert/strict');
const mongoose = require('mongoose');
const H = require('../lib/proxy');

let upstream;
let proxy;
let conn;
const events = [];
const APP = `rbit-mongoose-${process.pid}`;
const DB = H.uniqueDbName('mongoose');

const itemSchema = new mongoose.Schema({ _id: Number, name: String, qty: { type: Number, default: 0 }, tags: [String] }, { versionKey: false });
const orderSchema = new mongoose.Schema({ _id: String, attempt: Number, total: Number }, { versionKey: false });

let Item;
let Order;

test.before(async () => {
  upstream = await H.startUpstream();
  proxy = await H.startProxy({ upstream: upstream.uri });
  conn = mongoose.createConnection(proxy.uri({}, { db: DB }), {
    appName: APP,
    monitorCommands: true,
    serverSelectionTimeoutMS: 10000,
    autoIndex: false,
  });
  await conn.asPromise();
  const mc = conn.getClient();
  for (const ev of ['commandStarted', 'commandSucceeded', 'commandFailed']) {
    mc.on(ev, (e) => events.push({ ev, name: e.commandName, failure: e.failure, command: e.command }));
  }
  Item = conn.model('Item', itemSchema, 'items');
  Order = conn.model('Order', orderSchema, 'orders');
});

async function closeConn() {
  if (conn) {
    await conn.dropDatabase().catch(() => {});
    await conn.close();
    conn = null;
  }
}
test.after(closeConn);

function started(name, since) {
  return events.slice(since).filter((e) => e.ev === 'commandStarted' && e.name === name);
}
async function failPoint(mode, data) {
  return conn.getClient().db('admin').command({ configureFailPoint: 'failCommand', mode, data: { appName: APP, ...data } });
}
async function failPointOff() {
  await conn.getClient().db('admin').command({ configureFailPoint: 'failCommand', mode: 'off' });
}

test('Mongoose CRUD through models', async () => {
  await Item.create([
    { _id: 1, name: 'apple', qty: 5, tags: ['fruit'] },
    { _id: 2, name: 'bread', qty: 1 },
  ]);
  const apple = await Item.findById(1).lean();
  assert.deepEqual(apple, { _id: 1, name: 'apple', qty: 5, tags: ['fruit'] });
  const doc = await Item.findById(2);
  doc.qty += 4;
  doc.tags.push('bakery');
  await doc.save();
  assert.deepEqual(await Item.findById(2).lean(), { _id: 2, name: 'bread', qty: 5, tags: ['bakery'] });
  const r = await Item.updateMany({ qty: { $gte: 5 } }, { $inc: { qty: 1 } });
  assert.equal(r.modifiedCount, 2);
  const after = await Item.findOneAndUpdate({ _id: 1 }, { $set: { name: 'Apple' } }, { new: true }).lean();
  assert.equal(after.name, 'Apple');
  assert.equal(after.qty, 6);
  await assert.rejects(Item.create({ _id: 1, name: 'dup' }), (e) => e.code === 11000);
  assert.equal(await Item.countDocuments(), 2);
  const del = await Item.deleteOne({ _id: 2 });
  assert.equal(del.deletedCount, 1);
  assert.deepEqual((await Item.find().lean()).map((d) => d._id), [1]);
  await Item.deleteMany({});
});

test('a Mongoose query cursor spans several getMore batches', async () => {
  await Item.insertMany(Array.from({ length: 40 }, (_, i) => ({ _id: 100 + i, name: `n${i}`, qty: i })));
  const since = events.length;
  const seen = [];
  for await (const d of Item.find({ _id: { $gte: 100 } }).sort({ _id: 1 }).batchSize(6).cursor()) seen.push(d._id);
  assert.deepEqual(seen, Array.from({ length: 40 }, (_, i) => 100 + i));
  assert.ok(started('getMore', since).length >= 6, `expected >= 6 getMores, got ${started('getMore', since).length}`);
  const agg = await Item.aggregate([{ $match: { _id: { $gte: 100 } } }, { $group: { _id: null, total: { $sum: '$qty' } } }]);
  assert.equal(agg[0].total, (39 * 40) / 2);
});

test('connection.transaction() is retried after a forced write conflict; data committed once', async (t) => {
  const skip = H.doubleOnlySkipReason('failCommand');
  if (skip) return t.skip(skip);
  await Order.create({ _id: 'seed', attempt: 0, total: 0 });
  await failPoint({ times: 1 }, { failCommands: ['insert'], errorCode: 112, errorLabels: ['TransientTransactionError'] });
  const since = events.length;
  let calls = 0;
  try {
    await conn.transaction(async (session) => {
      calls += 1;
      await Order.create([{ _id: 'o1', attempt: calls, total: 42 }], { session });
      await Order.updateOne({ _id: 'seed' }, { $inc: { total: 1 } }, { session });
    });
  } finally {
    await failPointOff();
  }
  assert.equal(calls, 2, 'the callback ran twice');
  const failed = events.slice(since).filter((e) => e.ev === 'commandFailed' && e.name === 'insert');
  assert.equal(failed.length, 1);
  assert.equal(failed[0].failure.code, 112);
  assert.equal(started('commitTransaction', since).length, 1, 'one commit');
  assert.deepEqual(await Order.find({ _id: 'o1' }).lean(), [{ _id: 'o1', attempt: 2, total: 42 }]);
  assert.equal((await Order.findById('seed').lean()).total, 1);
});

test('a Mongoose save is retried after the upstream closes the connection; it lands once', async (t) => {
  const skip = H.doubleOnlySkipReason('failCommand');
  if (skip) return t.skip(skip);
  await Order.create({ _id: 'warm' });
  await failPoint({ times: 1 }, { failCommands: ['insert'], closeConnection: true });
  const since = events.length;
  try {
    await new Order({ _id: 'rw', total: 7 }).save();
  } finally {
    await failPointOff();
  }
  const ins = started('insert', since);
  assert.equal(ins.length, 2, 'insert sent twice (cut, then retried)');
  assert.equal(ins[0].command.txnNumber.toString(), ins[1].command.txnNumber.toString(), 'same txnNumber');
  assert.equal(await Order.countDocuments({ _id: 'rw' }), 1, 'landed exactly once');
});

test('a w:0 Mongoose write lands eventually', async () => {
  await Order.insertMany([{ _id: 'w0', total: 3 }], { writeConcern: { w: 0 } });
  const deadline = Date.now() + 5000;
  let doc = null;
  while (!doc && Date.now() < deadline) {
    doc = await Order.findById('w0').lean();
    if (!doc) await H.sleep(100);
  }
  assert.deepEqual(doc, { _id: 'w0', total: 3 });
});

H.registerFinalChecks(test, [() => upstream && upstream.stop()], { beforeStop: closeConn });
