'use strict';
// Outbox tampering through the proxy. A publishing application must be allowed to write the outbox
// collections on the server (the proxy's injected writes run in its transactions, as its user), so
// the proxy itself refuses client commands that write them: every such command gets
// {ok: 0, code: 13, codeName: "Unauthorized", errmsg: "relaybus: ..."} and is never forwarded.
//   - each kind of write (CRUD, findAndModify, bulkWrite with nsInfo in the body or as a document
//     sequence, aggregate $out/$merge in their string and document forms, mapReduce out, drop,
//     dropDatabase, create, createIndexes, dropIndexes, collMod, renameCollection from and to,
//     applyOps) is refused, and the outbox read straight from the server is exactly as before;
//   - an unacknowledged (moreToCome) outbox insert closes the connection and writes nothing;
//   - reads of the outbox (find, aggregate, count, distinct, listIndexes) work, and publishing
//     (the proxy's own injected writes) still works;
//   - with [outbox] allow_client_writes = true the same commands go through.

const test = require('node:test');
const assert = require('node:assert/strict');
const P = require('./lib');

const H = P.H;
const DB = H.uniqueDbName('pubtamper');
const ODB = P.OUTBOX_DB;
const EV = `${P.PREFIX}events`;
const DEL = `${P.PREFIX}deliveries`;
const KEYS = `${P.PREFIX}key_sequences`;
const TAG = `tamper-${process.pid}-${Date.now()}`;
const UNAUTHORIZED = /^relaybus: .+ is refused: only the proxy writes the outbox collections/;
let s;

test.before(async () => {
  s = await P.startStack({ extraIni: '[admin]\nlisten = 127.0.0.1:0\n' });
  // Something to tamper with, written straight to the server.
  await s.outbox.events.insertOne({ _id: `${TAG}-ev`, type: 'order.placed.v1', payload: { n: 1 }, handlers: ['orders'] });
  await s.outbox.deliveries.insertOne({ eventId: `${TAG}-ev`, handler: 'orders', status: 'pending', tag: TAG });
  await s.direct.db(DB).collection('orders').insertOne({ _id: 'src-1', total: 5 });
});

/** What the server holds of the outbox: documents of this test and every collection's indexes. */
async function outboxState() {
  const db = s.direct.db(ODB);
  const names = (await db.listCollections({}, { nameOnly: true }).toArray()).map((c) => c.name).sort();
  const indexes = {};
  for (const n of names.filter((x) => x.startsWith(P.PREFIX))) {
    indexes[n] = (await db.collection(n).listIndexes().toArray()).map((i) => i.name).sort();
  }
  return {
    names,
    indexes,
    events: await s.outbox.events.find({ _id: { $regex: `^${TAG}` } }).sort({ _id: 1 }).toArray(),
    deliveries: await s.outbox.deliveries.find({ tag: TAG }, { projection: { _id: 0 } }).toArray(),
    eventCount: await s.outbox.events.countDocuments({}),
  };
}

/** The commands that write the outbox; each through the proxy (Node driver, $db from `db`). */
const WRITES = [
  ['insert', ODB, { insert: EV, documents: [{ _id: `${TAG}-forged`, type: 'order.placed.v1' }] }],
  ['insert (deliveries)', ODB, { insert: DEL, documents: [{ eventId: `${TAG}-ev`, handler: 'x', tag: TAG }] }],
  ['update', ODB, { update: EV, updates: [{ q: { _id: `${TAG}-ev` }, u: { $set: { payload: 'forged' } } }] }],
  ['update (upsert key_sequences)', ODB, { update: KEYS, updates: [{ q: { _id: TAG }, u: { $inc: { seq: 1 } }, upsert: true }] }],
  ['delete', ODB, { delete: DEL, deletes: [{ q: { tag: TAG }, limit: 0 }] }],
  ['findAndModify', ODB, { findAndModify: EV, query: { _id: `${TAG}-ev` }, remove: true }],
  ['findandmodify', ODB, { findandmodify: DEL, query: { tag: TAG }, update: { $set: { status: 'completed' } } }],
  ['bulkWrite', 'admin', { bulkWrite: 1, ops: [{ delete: 0, filter: {}, multi: true }], nsInfo: [{ ns: `${ODB}.${DEL}` }] }],
  ['aggregate $out', ODB, { aggregate: DEL, pipeline: [{ $out: EV }], cursor: {} }],
  ['aggregate $out {db, coll}', DB, { aggregate: 'orders', pipeline: [{ $match: {} }, { $out: { db: ODB, coll: EV } }], cursor: {} }],
  ['aggregate $merge', DB, { aggregate: 'orders', pipeline: [{ $merge: { into: { db: ODB, coll: DEL } } }], cursor: {} }],
  ['aggregate $merge string', ODB, { aggregate: EV, pipeline: [{ $merge: DEL }], cursor: {} }],
  ['mapReduce out', DB, { mapReduce: 'orders', map: 'function () {}', reduce: 'function () {}', out: { replace: EV, db: ODB } }],
  ['drop', ODB, { drop: DEL }],
  ['dropDatabase', ODB, { dropDatabase: 1 }],
  ['create', ODB, { create: `${P.PREFIX}lanes` }],
  ['createIndexes', ODB, { createIndexes: EV, indexes: [{ key: { forged: 1 }, name: 'forged_1' }] }],
  ['dropIndexes', ODB, { dropIndexes: DEL, index: 'event_handler' }],
  ['collMod', ODB, { collMod: EV, validator: { forged: { $exists: true } } }],
  ['renameCollection from', 'admin', { renameCollection: `${ODB}.${DEL}`, to: `${ODB}.stolen_${process.pid}` }],
  ['renameCollection to', 'admin', { renameCollection: `${DB}.orders`, to: `${ODB}.${EV}`, dropTarget: true }],
  ['applyOps', 'admin', { applyOps: [{ op: 'd', ns: `${ODB}.${DEL}`, o: { tag: TAG } }] }],
];

test('every command that writes the outbox is refused with Unauthorized (13) and the outbox stays as it was', async () => {
  const before = await outboxState();
  for (const [what, db, cmd] of WRITES) {
    const err = await P.expectCode(s.client.db(db).command(cmd), 13, UNAUTHORIZED).catch((e) => {
      throw new Error(`${what}: ${e.message}`);
    });
    assert.equal(err.codeName, 'Unauthorized', what);
  }
  // The driver's own helpers send the same commands.
  const ev = s.client.db(ODB).collection(EV);
  await P.expectCode(ev.insertOne({ _id: `${TAG}-helper` }), 13, UNAUTHORIZED);
  await P.expectCode(ev.updateMany({}, { $set: { forged: true } }), 13, UNAUTHORIZED);
  await P.expectCode(ev.deleteMany({}), 13, UNAUTHORIZED);
  await P.expectCode(ev.findOneAndDelete({ _id: `${TAG}-ev` }), 13, UNAUTHORIZED);
  await P.expectCode(ev.bulkWrite([{ deleteMany: { filter: {} } }]), 13, UNAUTHORIZED);
  await P.expectCode(ev.drop(), 13, UNAUTHORIZED);
  await P.expectCode(s.client.db(ODB).dropDatabase(), 13, UNAUTHORIZED);
  await P.expectCode(s.client.db(DB).collection('orders').aggregate([{ $out: { db: ODB, coll: EV } }]).toArray(), 13, UNAUTHORIZED);
  // A transaction's write into the outbox is refused the same way (and nothing of it commits).
  const session = s.client.startSession();
  try {
    session.startTransaction();
    await P.expectCode(ev.insertOne({ _id: `${TAG}-txn` }, { session }), 13, UNAUTHORIZED);
    await session.abortTransaction();
  } finally {
    await session.endSession();
  }
  assert.deepEqual(await outboxState(), before, 'the outbox read straight from the server is unchanged');
  assert.ok(await s.proxy.waitForLog(/c\d+ .*: refused a client write to the outbox: insert on relaybus\.relaybus_events/));
});

test('bulkWrite with nsInfo as a document sequence is refused too', { skip: H.rawDataSkipReason() }, async () => {
  const before = await outboxState();
  const c = await H.WireConn.connect({ port: s.proxy.port });
  try {
    assert.equal((await c.command({ hello: 1, $db: 'admin' })).ok, 1);
    const r = await c.command(null, {
      sections: [
        { kind: 0, doc: { bulkWrite: 1, errorsOnly: true, $db: 'admin' } },
        { kind: 1, identifier: 'ops', docs: [{ delete: 1, filter: { tag: TAG }, multi: true }] },
        { kind: 1, identifier: 'nsInfo', docs: [{ ns: `${DB}.orders` }, { ns: `${ODB}.${DEL}` }] },
      ],
    });
    assert.equal(r.ok, 0);
    assert.equal(r.code, 13);
    assert.equal(r.codeName, 'Unauthorized');
    assert.match(r.errmsg, /^relaybus: bulkWrite on relaybus\.relaybus_deliveries is refused/);
    // The connection goes on.
    assert.equal((await c.command({ ping: 1, $db: 'admin' })).ok, 1);
  } finally {
    c.destroy();
  }
  assert.deepEqual(await outboxState(), before);
});

test('an unacknowledged (moreToCome) insert into the outbox closes the connection and writes nothing', { skip: H.rawDataSkipReason() }, async () => {
  const c = await H.WireConn.connect({ port: s.proxy.port });
  try {
    assert.equal((await c.command({ hello: 1, $db: 'admin' })).ok, 1);
    await c.write(
      H.opMsg({ insert: EV, documents: [{ _id: `${TAG}-w0` }], writeConcern: { w: 0 }, $db: ODB }, { flags: 2 }).buf,
    );
    await c.waitClosed(3000);
  } finally {
    c.destroy();
  }
  assert.equal(await s.outbox.events.findOne({ _id: `${TAG}-w0` }), null);
  assert.ok(await s.proxy.waitForLog(/refused an unacknowledged insert on relaybus\.relaybus_events/));
});

test('reads of the outbox work through the proxy, and publishing (the proxy\'s own writes) still works', async () => {
  const ev = s.client.db(ODB).collection(EV);
  assert.equal((await ev.findOne({ _id: `${TAG}-ev` })).type, 'order.placed.v1');
  assert.equal((await ev.aggregate([{ $match: { _id: `${TAG}-ev` } }, { $project: { type: 1 } }]).toArray()).length, 1);
  assert.ok((await ev.countDocuments({ _id: `${TAG}-ev` })) === 1);
  assert.deepEqual(await s.client.db(ODB).collection(DEL).distinct('handler', { tag: TAG }), ['orders']);
  const idx = await s.client.db(ODB).collection(DEL).listIndexes().toArray();
  assert.ok(idx.some((i) => i.name === '_id_'));

  const session = s.client.startSession();
  try {
    await session.withTransaction(async () => {
      await s.client
        .db(DB)
        .collection('orders')
        .insertOne({ _id: 'o-pub' }, { session, comment: { relaybus: { type: 'order.placed.v1', id: `${TAG}-pub`, key: TAG } } });
    });
  } finally {
    await session.endSession();
  }
  await P.checkEvent(s.outbox, `${TAG}-pub`, { type: 'order.placed.v1', key: TAG, handlers: P.subscribed(P.HANDLERS, 'order.placed.v1') });
});

test('/metrics counts the refused client writes', async () => {
  const m = /admin: listening on 127\.0\.0\.1:(\d+)/.exec(s.proxy.log());
  assert.ok(m, 'the admin port is logged');
  const res = await fetch(`http://127.0.0.1:${m[1]}/metrics`);
  const body = await res.text();
  const line = body.split('\n').find((l) => l.startsWith('relaybus_outbox_client_writes_refused_total '));
  assert.ok(line, 'rendered');
  assert.ok(Number(line.split(' ')[1]) >= WRITES.length + 10, line);
});

test('with allow_client_writes = true the same writes go through', async () => {
  const proxy = await H.startProxy({
    upstream: s.upstream.uri,
    extraIni: `${P.handlersIni(P.HANDLERS)}\n[outbox]\nallow_client_writes = true\n`,
  });
  const { MongoClient } = require('mongodb');
  const client = new MongoClient(proxy.uri(), { serverSelectionTimeoutMS: 10000 });
  try {
    await client.connect();
    const ev = client.db(ODB).collection(EV);
    await ev.insertOne({ _id: `${TAG}-allowed`, type: 'x' });
    assert.ok(await s.outbox.events.findOne({ _id: `${TAG}-allowed` }), 'inserted, read straight from the server');
    const up = await client.db(ODB).command({ update: EV, updates: [{ q: { _id: `${TAG}-allowed` }, u: { $set: { n: 2 } } }] });
    assert.equal(up.nModified, 1);
    await client.db(ODB).collection(DEL).createIndex({ tag: 1 }, { name: `tag_${process.pid}` });
    await client.db(ODB).collection(DEL).dropIndex(`tag_${process.pid}`);
    const del = await ev.deleteOne({ _id: `${TAG}-allowed` });
    assert.equal(del.deletedCount, 1);
    assert.equal(await s.outbox.events.findOne({ _id: `${TAG}-allowed` }), null);
  } finally {
    await client.close();
    await proxy.stop();
  }
});

test.after(async () => {
  if (!s) return;
  await s.outbox.events.deleteMany({ _id: { $regex: `^${TAG}` } }).catch(() => {});
  await s.outbox.deliveries.deleteMany({ $or: [{ tag: TAG }, { eventId: { $regex: `^${TAG}` } }] }).catch(() => {});
  await s.outbox.keys.deleteMany({ _id: TAG }).catch(() => {});
});

H.registerFinalChecks(test, [() => s && s.upstream.stop()], { beforeStop: () => s && s.closeClients() });
