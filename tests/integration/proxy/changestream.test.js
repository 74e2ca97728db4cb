'use strict';
// Change streams through the proxy, as applications use them: the Node.js driver's and
// Mongoose's watch() see the writes made through the proxy, in order, and resume with their
// resume token after the proxy closes their connection (here: the server closes the proxy's
// upstream connection in the middle of a getMore, so the proxy closes the client's), without
// losing or repeating an event.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const mongoose = require('mongoose');
const H = require('../lib/proxy');

let upstream;
let proxy;

test.before(async () => {
  upstream = await H.startUpstream();
  proxy = await H.startProxy({ upstream: upstream.uri });
});

test.after(async () => {
  if (proxy) await proxy.stop();
  if (upstream) await upstream.stop();
});

/** Next `n` change events of `stream`, waiting at most `ms` for each. */
async function take(stream, n, ms = 10000) {
  const out = [];
  while (out.length < n) {
    const ev = await H.within(stream.next(), ms, null);
    assert.ok(ev, `change event ${out.length + 1} of ${n} within ${ms} ms`);
    out.push(ev);
  }
  return out;
}

/** Makes the server close the connection of the next getMore of `appName` (the proxy's upstream). */
async function closeNextGetMore(direct, appName) {
  await direct.db('admin').command({
    configureFailPoint: 'failCommand',
    mode: { times: 1 },
    data: { failCommands: ['getMore'], closeConnection: true, appName },
  });
}

test('Node.js driver: watch() through the proxy sees the writes and resumes after its connection is closed', { timeout: 60000 }, async (t) => {
  const app = `rbit-watch-${process.pid}`;
  const client = await new MongoClient(proxy.uri(), { appName: app, serverSelectionTimeoutMS: 10000 }).connect();
  t.after(() => client.close());
  const direct = await new MongoClient(upstream.directUri).connect();
  t.after(() => direct.close());
  const db = H.uniqueDbName('watch_node');
  const coll = client.db(db).collection('orders');
  await coll.insertOne({ _id: 'seed' });
  const stream = coll.watch([], { maxAwaitTimeMS: 200 });
  // The stream is open once its first getMore has gone out.
  const first = stream.next();
  await H.sleep(300);
  await coll.insertOne({ _id: 'a1', n: 1 });
  await coll.updateOne({ _id: 'a1' }, { $set: { n: 2 } });
  const [e1] = [await first];
  const [e2] = await take(stream, 1);
  assert.equal(e1.operationType, 'insert');
  assert.equal(e1.documentKey._id, 'a1');
  assert.equal(e2.operationType, 'update');
  assert.deepEqual(e2.updateDescription.updatedFields, { n: 2 });

  await t.test('it resumes after the proxy closes its connection, none lost or repeated', async (st) => {
    const skip = H.doubleOnlySkipReason('failCommand with appName on getMore');
    if (skip) return st.skip(skip);
    // The next getMore through the proxy loses its upstream connection: the proxy closes the
    // client's, and the driver resumes after e2 on a new connection.
    await closeNextGetMore(direct, app);
    const next = stream.next();
    await H.sleep(500);
    await coll.insertOne({ _id: 'a2' });
    await coll.deleteOne({ _id: 'seed' });
    const e3 = await next;
    const [e4] = await take(stream, 1);
    assert.equal(e3.operationType, 'insert', 'the first event after the resume, none lost');
    assert.equal(e3.documentKey._id, 'a2');
    assert.equal(e4.operationType, 'delete');
    assert.equal(e4.documentKey._id, 'seed');
    assert.ok(proxy.logLines('closing').some((l) => /upstream_(eof|error)/.test(l)), 'the proxy closed a client connection with its upstream');
  });
  await stream.close();
});

test('Mongoose: Model.watch() through the proxy sees the writes, in order', { timeout: 60000 }, async (t) => {
  const conn = await mongoose.createConnection(proxy.uri(), { dbName: H.uniqueDbName('watch_mongoose'), serverSelectionTimeoutMS: 10000 }).asPromise();
  t.after(() => conn.close());
  const Order = conn.model('Order', new mongoose.Schema({ _id: String, n: Number }, { versionKey: false }), 'orders');
  await Order.createCollection();
  const stream = Order.watch([], { maxAwaitTimeMS: 200 });
  const seen = [];
  const errors = [];
  stream.on('change', (ev) => seen.push(ev));
  stream.on('error', (e) => errors.push(e));
  await H.sleep(500);
  await Order.create({ _id: 'm1', n: 1 });
  await Order.updateOne({ _id: 'm1' }, { $set: { n: 5 } });
  await Order.deleteOne({ _id: 'm1' });
  for (let i = 0; i < 100 && seen.length < 3; i++) await H.sleep(100);
  assert.deepEqual(seen.map((e) => e.operationType), ['insert', 'update', 'delete']);
  assert.equal(seen[0].fullDocument.n, 1);
  assert.deepEqual(seen[1].updateDescription.updatedFields, { n: 5 });
  await stream.close();
  assert.deepEqual(errors, [], 'the stream ran without an error');
});
