'use strict';
// Bad annotations of every kind and annotations outside transactions get the documented errors
// (BadValue 2, InvalidOptions 72, CommandNotFound 59), nothing of the refused statement is
// written, and the session can go on and commit other work afterwards. At the wire level: an
// annotated unacknowledged write and a request pipelined behind a running publish close the
// connection instead of committing anything without its events.

const test = require('node:test');
const assert = require('node:assert/strict');
const { BSON, Binary, Long } = require('bson');
const crypto = require('node:crypto');
const P = require('./lib');

const H = P.H;
const DB = H.uniqueDbName('puberr');
let s;

test.before(async () => {
  s = await P.startStack({ appName: `rbit-puberr-${process.pid}` });
});

function coll() {
  return s.client.db(DB).collection('items');
}

async function countAll() {
  return {
    items: await s.direct.db(DB).collection('items').countDocuments({}),
    events: await s.outbox.events.countDocuments({}),
    deliveries: await s.outbox.deliveries.countDocuments({}),
  };
}

const OUTSIDE = /^relaybus: annotated writes must run inside a transaction/;

/**
 * The error must reach the application itself: the Node.js driver would replace a code-20 error
 * of a retryable write with its own "does not support retryable writes" message.
 */
async function expectOutside(promise) {
  let err = null;
  try {
    await promise;
  } catch (e) {
    err = e;
  }
  assert.ok(err, 'expected InvalidOptions');
  // The driver passes it on as it came (a code-20 error of a write it would have replaced).
  assert.equal(err.code, 72, `the proxy's error reaches the application: ${err.message}`);
  assert.equal(err.codeName, 'InvalidOptions');
  assert.match(err.errmsg, OUTSIDE);
}

test('annotations outside a transaction: InvalidOptions 72, nothing written', async () => {
  const before = await countAll();
  await expectOutside(coll().insertOne({ _id: 'out-1' }, { comment: { relaybus: { type: 'order.x' } } }));
  // A session without a transaction: the driver sends a retryable write (lsid + txnNumber).
  const session = s.client.startSession();
  try {
    await expectOutside(coll().updateOne({ _id: 'out-2' }, { $set: { a: 1 } }, { session, upsert: true, comment: 'relaybus:{"type":"order.x"}' }));
    // The same session then commits a transaction normally.
    await session.withTransaction(async () => {
      await coll().insertOne({ _id: 'out-ok' }, { session, comment: { relaybus: { type: 'order.ok' } } });
    });
  } finally {
    await session.endSession();
  }
  // Without retryable writes the driver rewrites it the same way (driver 7 does for any write).
  const noRetry = new (require('mongodb').MongoClient)(s.proxy.uri({ retryWrites: 'false' }));
  try {
    await expectOutside(noRetry.db(DB).collection('items').insertOne({ _id: 'out-3' }, { comment: { relaybus: { type: 'order.x' } } }));
  } finally {
    await noRetry.close();
  }
  await P.expectCode(s.client.db(DB).command({ relaybusPublish: 1, events: [{ type: 'a' }] }), 72, /relaybusPublish must run inside a transaction/);
  // On the wire: exactly {ok: 0, errmsg, code, codeName}.
  const conn = await H.WireConn.connect({ port: s.proxy.port });
  try {
    await conn.command({ hello: 1, $db: 'admin' });
    const r = await conn.command({ delete: 'items', deletes: [{ q: {}, limit: 0 }], comment: { relaybus: { type: 'a' } }, $db: DB });
    assert.deepEqual(Object.keys(r).sort(), ['code', 'codeName', 'errmsg', 'ok']);
    assert.equal(r.ok, 0);
    assert.equal(r.code, 72);
    assert.equal(r.codeName, 'InvalidOptions');
    assert.match(r.errmsg, OUTSIDE);
  } finally {
    conn.destroy();
  }
  const after = await countAll();
  assert.equal(await s.direct.db(DB).collection('items').countDocuments({ _id: { $in: ['out-1', 'out-2', 'out-3'] } }), 0);
  assert.equal(after.items, before.items + 1);
  assert.equal(after.events, before.events + 1);
});

// [annotation value, expected message]
const BAD = [
  [{ relaybus: 5 }, 'relaybus: comment.relaybus must be a document (one event) or an array of documents'],
  [{ relaybus: [] }, 'relaybus: the annotation has no events (an empty array)'],
  [{ relaybus: ['x'] }, 'relaybus: events[0] must be a document'],
  [{ relaybus: {} }, 'relaybus: events[0].type must be a non-empty string'],
  [{ relaybus: { type: '' } }, 'relaybus: events[0].type must be a non-empty string'],
  [{ relaybus: [{ type: 'a' }, { type: 7 }] }, 'relaybus: events[1].type must be a non-empty string'],
  [{ relaybus: { type: 'a', tpye: 'b' } }, 'relaybus: events[0].tpye is not an event field (type, payload, key, id, headers, correlationId, causationId, notBefore)'],
  [{ relaybus: { type: 'a', key: 12 } }, 'relaybus: events[0].key must be a non-empty string'],
  [{ relaybus: { type: 'a', id: '' } }, 'relaybus: events[0].id must be a non-empty string'],
  [{ relaybus: { type: 'a', headers: ['x'] } }, 'relaybus: events[0].headers must be a document of strings'],
  [{ relaybus: { type: 'a', headers: { n: 1 } } }, 'relaybus: events[0].headers.n must be a non-empty string'],
  [{ relaybus: { type: 'a', correlationId: 1 } }, 'relaybus: events[0].correlationId must be a non-empty string'],
  [{ relaybus: { type: 'a', causationId: {} } }, 'relaybus: events[0].causationId must be a non-empty string'],
  [{ relaybus: { type: 'a', notBefore: '2030-01-01' } }, 'relaybus: events[0].notBefore must be a date'],
  [{ relaybus: [{ type: 'a', id: 'same' }, { type: 'b', id: 'same' }] }, 'relaybus: events[1].id repeats events[0].id'],
  [{ relaybus: Array.from({ length: 101 }, () => ({ type: 'a' })) }, 'relaybus: at most 100 events per annotation'],
  [{ relaybus: { type: 'x'.repeat(257) } }, 'relaybus: events[0].type is 257 bytes long; at most 256'],
  [{ relaybus: { type: 'a', key: 'k'.repeat(1025) } }, 'relaybus: events[0].key is 1025 bytes long; at most 1024'],
  [{ relaybus: { type: 'a', payload: 'p'.repeat(1024 * 1024 + 1) } }, /^relaybus: the annotation is \d+ bytes; at most 1048576$/],
  ['relaybus:', 'relaybus: a string comment starting with "relaybus:" must continue with Extended JSON of an event document or an array of event documents'],
  ['relaybus:{"type": ', /^relaybus: the string annotation is not valid Extended JSON: /],
  ['relaybus:{"type": "a"} {"type": "b"}', 'relaybus: the string annotation has text after its JSON value'],
  ['relaybus:[{"type": "a"}, {"type": "b", "notBefore": "soon"}]', 'relaybus: events[1].notBefore must be a date'],
];

test('every kind of bad annotation: BadValue 2 naming the field, nothing forwarded', async () => {
  const before = await countAll();
  for (const [comment, message] of BAD) {
    const session = s.client.startSession();
    try {
      session.startTransaction();
      // An earlier statement, so the transaction exists on the server and can be continued.
      await coll().insertOne({ _id: `keep-${crypto.randomUUID()}`, tag: 'bad-annotations' }, { session });
      const err = await P.expectCode(coll().insertOne({ _id: 'refused' }, { session, comment }), 2);
      assert.equal(err.codeName, 'BadValue');
      if (message instanceof RegExp) assert.match(err.errmsg, message);
      else assert.equal(err.errmsg, message);
      assert.equal((err.errorLabels || []).length, 0, 'no TransientTransactionError: a retry would fail the same way');
      // The transaction goes on: other work commits, the refused statement never ran.
      await coll().insertOne({ _id: `after-${crypto.randomUUID()}`, tag: 'bad-annotations' }, { session });
      await session.commitTransaction();
    } finally {
      await session.endSession();
    }
  }
  const after = await countAll();
  assert.equal(after.items, before.items + 2 * BAD.length, 'both good statements of every transaction committed');
  assert.equal(await s.direct.db(DB).collection('items').countDocuments({ _id: 'refused' }), 0);
  assert.equal(after.events, before.events, 'no event from a refused annotation');
  assert.equal(after.deliveries, before.deliveries);
});

test('a bad annotation on the first statement: withTransaction fails, the session then commits', async () => {
  const session = s.client.startSession();
  try {
    await assert.rejects(
      session.withTransaction(async () => {
        await coll().insertOne({ _id: 'first-bad' }, { session, comment: { relaybus: { payload: 1 } } });
      }),
      (e) => e.code === 2 && /events\[0\]\.type/.test(e.message),
    );
    await session.withTransaction(async () => {
      await coll().insertOne({ _id: 'first-good' }, { session, comment: { relaybus: { type: 'order.good', id: 'first-good-ev' } } });
    });
  } finally {
    await session.endSession();
  }
  assert.equal(await s.direct.db(DB).collection('items').countDocuments({ _id: 'first-bad' }), 0);
  assert.ok(await s.direct.db(DB).collection('items').findOne({ _id: 'first-good' }));
  await P.checkEvent(s.outbox, 'first-good-ev', { type: 'order.good', handlers: ['orders'] });
});

test('relaybusPublish with bad events, and annotations on commit: BadValue', async () => {
  const session = s.client.startSession();
  try {
    session.startTransaction();
    await coll().insertOne({ _id: 'vp-keep' }, { session });
    await P.expectCode(s.client.db(DB).command({ relaybusPublish: 1 }, { session }), 2, /relaybusPublish needs events/);
    await P.expectCode(s.client.db(DB).command({ relaybusPublish: 1, events: [{ type: 'a', bogus: 1 }] }, { session }), 2, /events\[0\]\.bogus is not an event field/);
    await P.expectCode(s.client.db(DB).command({ relaybusPublish: 1, events: 'x' }, { session }), 2, /must be a document \(one event\) or an array/);
    // commitTransaction with an annotation is refused; the plain commit then works.
    await P.expectCode(
      s.client.db('admin').command({ commitTransaction: 1, comment: { relaybus: { type: 'a' } } }, { session }),
      2,
      /not commitTransaction/,
    );
    await session.commitTransaction();
  } finally {
    await session.endSession();
  }
  assert.ok(await s.direct.db(DB).collection('items').findOne({ _id: 'vp-keep' }));
});

test('wire level: an annotated moreToCome write closes the connection and writes nothing', async () => {
  const conn = await H.WireConn.connect({ port: s.proxy.port });
  try {
    const hello = await conn.command({ hello: 1, $db: 'admin' });
    assert.equal(hello.ok, 1);
    const lsid = { id: new Binary(crypto.randomBytes(16), 4) };
    const m = H.opMsg(
      { insert: 'items', documents: [{ _id: 'w0' }], ordered: true, writeConcern: { w: 0 }, comment: { relaybus: { type: 'order.w0' } }, $db: DB, lsid, txnNumber: Long.fromNumber(1), autocommit: false, startTransaction: true },
      { flags: 2 },
    );
    await conn.write(m.buf);
    await conn.waitClosed(5000);
  } finally {
    conn.destroy();
  }
  assert.equal(await s.direct.db(DB).collection('items').countDocuments({ _id: 'w0' }), 0);
  assert.ok(await s.proxy.waitForLog(/cannot be published/));
});

test('wire level: a request pipelined behind a running publish closes the connection', async () => {
  const conn = await H.WireConn.connect({ port: s.proxy.port });
  try {
    await conn.command({ hello: 1, $db: 'admin' });
    const lsid = { id: new Binary(crypto.randomBytes(16), 4) };
    const txn = { lsid, txnNumber: Long.fromNumber(1), autocommit: false };
    const stmt = H.opMsg({ insert: 'items', documents: [{ _id: 'pipe-1' }], comment: { relaybus: { type: 'order.pipe' } }, $db: DB, ...txn, startTransaction: true });
    const commit = H.opMsg({ commitTransaction: 1, $db: 'admin', ...txn });
    // Both at once: the commit must not overtake the outbox writes.
    await conn.write(Buffer.concat([stmt.buf, commit.buf]));
    await conn.waitClosed(5000);
  } finally {
    conn.destroy();
  }
  assert.ok(await s.proxy.waitForLog(/pipelined behind/));
  // Nothing committed: the transaction was never committed (the server reaps it later).
  assert.equal(await s.direct.db(DB).collection('items').countDocuments({ _id: 'pipe-1' }), 0);
  assert.equal(await s.outbox.events.countDocuments({ type: 'order.pipe' }), 0);
});

test('wire level: kind-1 document sequences of an annotated insert are forwarded intact', async () => {
  const conn = await H.WireConn.connect({ port: s.proxy.port });
  try {
    await conn.command({ hello: 1, $db: 'admin' });
    const lsid = { id: new Binary(crypto.randomBytes(16), 4) };
    const txn = { lsid, txnNumber: Long.fromNumber(1), autocommit: false };
    const body = { insert: 'items', ordered: true, comment: { relaybus: { type: 'order.k1', id: 'k1-ev' }, keep: 'me' }, $db: DB, ...txn, startTransaction: true };
    const m = H.opMsg(null, { sections: [{ kind: 0, doc: body }, { kind: 1, identifier: 'documents', docs: [{ _id: 'k1-a' }, { _id: 'k1-b' }] }] });
    await conn.write(m.buf);
    const reply = (await conn.next()).doc;
    assert.equal(reply.ok, 1);
    assert.equal(reply.n, 2);
    const c = await conn.command({ commitTransaction: 1, $db: 'admin', ...txn });
    assert.equal(c.ok, 1);
  } finally {
    conn.destroy();
  }
  assert.equal(await s.direct.db(DB).collection('items').countDocuments({ _id: { $in: ['k1-a', 'k1-b'] } }), 2);
  await P.checkEvent(s.outbox, 'k1-ev', { type: 'order.k1', handlers: ['orders'] });
});

H.registerFinalChecks(test, [() => s && s.upstream.stop()], { beforeStop: () => s && s.closeClients() });
