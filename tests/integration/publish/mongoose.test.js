'use strict';
// Publishing with Mongoose through the proxy. Mongoose forwards `comment` on insertMany,
// updateOne/updateMany, findOneAndUpdate and bulkWrite (option or Query#comment), but not on
// Model.create or Document#save: there, relaybusPublish in the same session publishes instead.
// connection.transaction() and session.withTransaction() both work; a rollback leaves nothing.

const test = require('node:test');
const assert = require('node:assert/strict');
const mongoose = require('mongoose');
const P = require('./lib');

const H = P.H;
const DB = H.uniqueDbName('pubmongoose');
let s;
let conn;
let Order;

test.before(async () => {
  s = await P.startStack({});
  conn = mongoose.createConnection(s.proxy.uri({}, { db: DB }), { serverSelectionTimeoutMS: 10000, autoIndex: false });
  await conn.asPromise();
  Order = conn.model('Order', new mongoose.Schema({ _id: String, total: Number, status: String }, { versionKey: false }), 'orders');
});

async function closeAll() {
  if (conn) await conn.close().catch(() => {});
  conn = null;
  if (s) await s.closeClients();
}

test('connection.transaction() with insertMany({comment}) publishes with the insert', async () => {
  await conn.transaction(async (session) => {
    await Order.insertMany([{ _id: 'm-1', total: 10 }], {
      session,
      comment: { relaybus: { type: 'order.placed.v1', id: 'mg-1', key: 'm-1', payload: { orderId: 'm-1' } } },
    });
  });
  assert.ok(await s.direct.db(DB).collection('orders').findOne({ _id: 'm-1' }));
  await P.checkEvent(s.outbox, 'mg-1', { type: 'order.placed.v1', key: 'm-1', sequence: 1, payload: { orderId: 'm-1' }, handlers: ['orders', 'confirmations'] });
});

test('withTransaction with Query#comment in the string form, on updateOne and findOneAndUpdate', async () => {
  const session = await conn.startSession();
  try {
    await session.withTransaction(async () => {
      await Order.updateOne({ _id: 'm-1' }, { $set: { status: 'paid' } })
        .session(session)
        .comment('relaybus:' + JSON.stringify({ type: 'order.paid.v1', id: 'mg-2', key: 'm-1' }));
      await Order.findOneAndUpdate(
        { _id: 'm-1' },
        { $inc: { total: 1 } },
        { session, comment: { relaybus: [{ type: 'user.charged.v1', id: 'mg-3' }], trace: 'kept' } },
      );
    });
  } finally {
    await session.endSession();
  }
  await P.checkEvent(s.outbox, 'mg-2', { type: 'order.paid.v1', key: 'm-1', sequence: 2, handlers: ['orders'] });
  await P.checkEvent(s.outbox, 'mg-3', { type: 'user.charged.v1', handlers: ['users'] });
  const doc = await s.direct.db(DB).collection('orders').findOne({ _id: 'm-1' });
  assert.equal(doc.status, 'paid');
  assert.equal(doc.total, 11);
});

test('Model.create and save() do not pass comments: relaybusPublish in the same session does', async () => {
  await conn.transaction(async (session) => {
    await Order.create([{ _id: 'm-2', total: 5 }], { session });
    const r = await conn.db.command({ relaybusPublish: 1, events: [{ type: 'order.placed.v1', id: 'mg-4', payload: { orderId: 'm-2' } }] }, { session });
    assert.deepEqual(r.eventIds, ['mg-4']);
  });
  assert.ok(await s.direct.db(DB).collection('orders').findOne({ _id: 'm-2' }));
  await P.checkEvent(s.outbox, 'mg-4', { type: 'order.placed.v1', handlers: ['orders', 'confirmations'] });
});

test('a transaction that throws leaves neither the document nor the event', async () => {
  await assert.rejects(
    conn.transaction(async (session) => {
      await Order.insertMany([{ _id: 'm-rb' }], { session, comment: { relaybus: { type: 'order.placed.v1', id: 'mg-rb' } } });
      throw new Error('rollback');
    }),
    /rollback/,
  );
  assert.equal(await s.direct.db(DB).collection('orders').findOne({ _id: 'm-rb' }), null);
  assert.equal(await s.outbox.events.findOne({ _id: 'mg-rb' }), null);
  assert.equal(await s.outbox.deliveries.countDocuments({ eventId: 'mg-rb' }), 0);
});

test('a bad annotation through Mongoose: BadValue naming the field', async () => {
  await assert.rejects(
    conn.transaction(async (session) => {
      await Order.insertMany([{ _id: 'm-bad' }], { session, comment: { relaybus: { type: 'order.x', headers: { h: 1 } } } });
    }),
    (e) => e.code === 2 && e.message === 'relaybus: events[0].headers.h must be a non-empty string',
  );
  assert.equal(await s.direct.db(DB).collection('orders').findOne({ _id: 'm-bad' }), null);
});

H.registerFinalChecks(test, [() => s && s.upstream.stop()], { beforeStop: closeAll });
