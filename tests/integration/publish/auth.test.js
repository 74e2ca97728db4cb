'use strict';
// Publishing on a deployment with authentication: the outbox writes run on the client's own
// authenticated connection, so an authenticated client publishes, and relaybusPublish on a
// connection that has not authenticated is refused by the server (Unauthorized 13), with nothing
// written.

const test = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const { MongoClient } = require('mongodb');
const { Binary, Long } = require('bson');
const P = require('./lib');

const H = P.H;
let upstream;
let proxy;
let direct;

test.before(async () => {
  upstream = await H.startUpstream({ auth: 'pub:secret', requireDouble: true });
  proxy = await H.startProxy({
    upstream: `mongodb://pub:secret@127.0.0.1:${upstream.port}/?replicaSet=rs0&authSource=admin`,
    extraIni: P.handlersIni(P.HANDLERS),
  });
  direct = new MongoClient(upstream.directUri);
  await direct.connect();
  await P.ensureOutbox(direct);
});

test('an authenticated client publishes through its own connection', async () => {
  const c = new MongoClient(`mongodb://pub:secret@127.0.0.1:${proxy.port}/?authSource=admin`);
  await c.connect();
  const session = c.startSession();
  try {
    await session.withTransaction(async () => {
      await c.db('authshop').collection('orders').insertOne({ _id: 'a-1' }, { session, comment: { relaybus: { type: 'order.placed.v1', id: 'auth-1' } } });
    });
  } finally {
    await session.endSession();
    await c.close();
  }
  await P.checkEvent(P.outboxOf(direct), 'auth-1', { type: 'order.placed.v1', handlers: ['orders', 'confirmations'] });
});

test('relaybusPublish without authentication: Unauthorized from the server, nothing written', async () => {
  const conn = await H.WireConn.connect({ port: proxy.port });
  try {
    await conn.command({ hello: 1, $db: 'admin' });
    const r = await conn.command({
      relaybusPublish: 1,
      events: [{ type: 'order.placed.v1', id: 'unauth-1' }],
      $db: 'authshop',
      lsid: { id: new Binary(crypto.randomBytes(16), 4) },
      txnNumber: Long.fromNumber(1),
      autocommit: false,
      startTransaction: true,
    });
    assert.equal(r.ok, 0);
    assert.equal(r.code, 13);
  } finally {
    conn.destroy();
  }
  assert.equal(await P.outboxOf(direct).events.findOne({ _id: 'unauth-1' }), null);
});

H.registerFinalChecks(test, [() => upstream && upstream.stop()], { beforeStop: () => direct && direct.close() });
