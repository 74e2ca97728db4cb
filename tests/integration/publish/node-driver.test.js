'use strict';
// Publishing with the official Node.js driver through the proxy: annotations in withTransaction
// and in manual transactions, the document, array and string forms, relaybusPublish, the stored
// layout of events and deliveries (docs/outbox-schema.md), visibility at commit only, rollbacks,
// per-key sequences in commit order under contention, and explicit-id retries that add
// deliveries only for handlers an event does not list yet.

const test = require('node:test');
const assert = require('node:assert/strict');
const { EJSON, Long } = require('bson');
const P = require('./lib');

const H = P.H;
const DB = H.uniqueDbName('pubnode');
let s;

test.before(async () => {
  s = await P.startStack({ appName: `rbit-pub-${process.pid}` });
});

function orders() {
  return s.client.db(DB).collection('orders');
}

async function eventsWhere(filter) {
  return s.outbox.events.find(filter).toArray();
}

test('withTransaction: one event with a key, stored with one delivery per subscribed handler', async () => {
  const session = s.client.startSession();
  try {
    await session.withTransaction(async () => {
      await orders().insertOne(
        { _id: 'o-1', total: 10 },
        {
          session,
          comment: {
            relaybus: { type: 'order.placed.v1', key: 'o-1', payload: { orderId: 'o-1', total: 10 } },
            trace: 'kept',
          },
        },
      );
    });
  } finally {
    await session.endSession();
  }
  const [ev] = await eventsWhere({ 'payload.orderId': 'o-1' });
  assert.ok(ev, 'the event exists after commit');
  assert.match(ev._id, /^[0-9a-f]{24}$/, 'a generated id is 24 hex digits');
  await P.checkEvent(s.outbox, ev._id, {
    type: 'order.placed.v1',
    key: 'o-1',
    sequence: 1,
    payload: { orderId: 'o-1', total: 10 },
    handlers: ['orders', 'confirmations'],
  });
  assert.deepEqual(await s.direct.db(DB).collection('orders').findOne({ _id: 'o-1' }), { _id: 'o-1', total: 10 });
  const counter = await s.outbox.keys.findOne({ _id: 'o-1' }, { promoteLongs: false });
  assert.equal(counter.value._bsontype, 'Long');
  assert.equal(Number(counter.value), 1);
});

test('manual transaction: several events in one annotation, consecutive sequences per key', async () => {
  const session = s.client.startSession();
  try {
    session.startTransaction();
    await orders().updateOne(
      { _id: 'o-2' },
      { $set: { status: 'paid' } },
      {
        session,
        upsert: true,
        comment: {
          relaybus: [
            { type: 'order.paid.v1', key: 'o-2', payload: { n: 1 }, headers: { traceparent: '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01' } },
            { type: 'user.notified.v1', payload: { n: 2 }, correlationId: 'corr-1', causationId: 'cause-1' },
            { type: 'order.paid.v1', key: 'o-2', payload: { n: 3 }, notBefore: new Date('2030-01-01T00:00:00Z') },
          ],
        },
      },
    );
    await session.commitTransaction();
  } finally {
    await session.endSession();
  }
  const evs = await s.outbox.events.find({ 'payload.n': { $in: [1, 2, 3] } }).sort({ 'payload.n': 1 }).toArray();
  assert.equal(evs.length, 3);
  await P.checkEvent(s.outbox, evs[0]._id, { type: 'order.paid.v1', key: 'o-2', sequence: 1, handlers: ['orders'] });
  await P.checkEvent(s.outbox, evs[1]._id, { type: 'user.notified.v1', handlers: ['users'] });
  await P.checkEvent(s.outbox, evs[2]._id, { type: 'order.paid.v1', key: 'o-2', sequence: 2, handlers: ['orders'] });
  assert.deepEqual(evs[0].headers, { traceparent: '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01' });
  assert.equal(evs[1].correlationId, 'corr-1');
  assert.equal(evs[1].causationId, 'cause-1');
  assert.equal('headers' in evs[1], false);
  assert.deepEqual(evs[2].notBefore, new Date('2030-01-01T00:00:00Z'));
  const d = await s.outbox.deliveries.findOne({ eventId: evs[2]._id });
  assert.deepEqual(d.dueAt, new Date('2030-01-01T00:00:00Z'), 'dueAt is notBefore');
});

test('the string form (relaybus: + Extended JSON) keeps BSON types', async () => {
  const session = s.client.startSession();
  try {
    await session.withTransaction(async () => {
      const value = { type: 'order.string.v1', id: 'str-1', payload: { big: Long.fromString('9007199254740993'), d: new Date(0) } };
      await orders().insertOne({ _id: 'o-3' }, { session, comment: 'relaybus:' + EJSON.stringify(value, { relaxed: false }) });
    });
  } finally {
    await session.endSession();
  }
  const ev = await s.outbox.events.findOne({ _id: 'str-1' }, { promoteLongs: false });
  assert.equal(ev.type, 'order.string.v1');
  assert.equal(ev.payload.big.toString(), '9007199254740993');
  assert.deepEqual(ev.payload.d, new Date(0));
  await P.checkEvent(s.outbox, 'str-1', { type: 'order.string.v1', handlers: ['orders'] });
});

test('the business write and its event become visible together, at commit', async () => {
  const session = s.client.startSession();
  try {
    session.startTransaction();
    await orders().insertOne(
      { _id: 'o-vis' },
      { session, comment: { relaybus: { type: 'order.placed.v1', id: 'vis-1', payload: 'x' } } },
    );
    // Another client, outside the transaction, sees neither.
    assert.equal(await s.direct.db(DB).collection('orders').findOne({ _id: 'o-vis' }), null);
    assert.equal(await s.outbox.events.findOne({ _id: 'vis-1' }), null);
    assert.equal(await s.outbox.deliveries.countDocuments({ eventId: 'vis-1' }), 0);
    // Through the proxy too, from another session.
    assert.equal(await s.client.db(P.OUTBOX_DB).collection('relaybus_events').findOne({ _id: 'vis-1' }), null);
    await session.commitTransaction();
  } finally {
    await session.endSession();
  }
  assert.ok(await s.direct.db(DB).collection('orders').findOne({ _id: 'o-vis' }));
  await P.checkEvent(s.outbox, 'vis-1', { type: 'order.placed.v1', handlers: ['orders', 'confirmations'] });
});

test('a rolled-back transaction leaves no event, no delivery, no counter increment', async () => {
  const before = await s.outbox.keys.findOne({ _id: 'rb-key' });
  const session = s.client.startSession();
  try {
    session.startTransaction();
    await orders().insertOne(
      { _id: 'o-rb' },
      { session, comment: { relaybus: { type: 'order.placed.v1', id: 'rb-1', key: 'rb-key' } } },
    );
    await session.abortTransaction();
  } finally {
    await session.endSession();
  }
  // withTransaction whose callback throws after the annotated write.
  const s2 = s.client.startSession();
  try {
    await assert.rejects(
      s2.withTransaction(async () => {
        await orders().insertOne({ _id: 'o-rb2' }, { session: s2, comment: { relaybus: { type: 'order.x', id: 'rb-2' } } });
        throw new Error('application gave up');
      }),
      /application gave up/,
    );
  } finally {
    await s2.endSession();
  }
  assert.equal(await s.direct.db(DB).collection('orders').countDocuments({ _id: { $in: ['o-rb', 'o-rb2'] } }), 0);
  assert.equal(await s.outbox.events.countDocuments({ _id: { $in: ['rb-1', 'rb-2'] } }), 0);
  assert.equal(await s.outbox.deliveries.countDocuments({ eventId: { $in: ['rb-1', 'rb-2'] } }), 0);
  assert.deepEqual(await s.outbox.keys.findOne({ _id: 'rb-key' }), before);
});

test('relaybusPublish publishes without a business write and answers the event ids', async () => {
  const session = s.client.startSession();
  let reply;
  try {
    await session.withTransaction(async () => {
      reply = await s.client.db(DB).command(
        { relaybusPublish: 1, events: [{ type: 'user.created.v1', id: 'vp-1', payload: { u: 1 } }, { type: 'order.placed.v1', key: 'vp-k' }] },
        { session },
      );
    });
  } finally {
    await session.endSession();
  }
  assert.equal(reply.ok, 1);
  assert.equal(reply.eventIds.length, 2);
  assert.equal(reply.eventIds[0], 'vp-1');
  await P.checkEvent(s.outbox, 'vp-1', { type: 'user.created.v1', payload: { u: 1 }, handlers: ['users'] });
  await P.checkEvent(s.outbox, reply.eventIds[1], { type: 'order.placed.v1', key: 'vp-k', sequence: 1, handlers: ['orders', 'confirmations'] });

  // As the first statement of a manual transaction (it starts the transaction itself).
  const s3 = s.client.startSession();
  try {
    s3.startTransaction({ readConcern: { level: 'snapshot' } });
    const r = await s.client.db(DB).command({ relaybusPublish: 1, events: { type: 'user.first.v1', id: 'vp-first' } }, { session: s3 });
    assert.deepEqual(r.eventIds, ['vp-first']);
    await orders().insertOne({ _id: 'o-after-publish' }, { session: s3 });
    await s3.commitTransaction();
  } finally {
    await s3.endSession();
  }
  await P.checkEvent(s.outbox, 'vp-first', { type: 'user.first.v1', handlers: ['users'] });
  assert.ok(await s.direct.db(DB).collection('orders').findOne({ _id: 'o-after-publish' }));

  // Never forwarded: an unknown relaybus* command is the proxy's CommandNotFound.
  await P.expectCode(s.client.db(DB).command({ relaybusNoSuchThing: 1 }), 59, /relaybusNoSuchThing/);
});

test('per-key sequences are gapless and follow commit order under contention', async () => {
  // Each transaction increments a business counter and publishes an event with the same key,
  // both in one transaction: both serialise through write conflicts, so the counter value each
  // transaction wrote must equal the sequence its event got.
  const KEY = 'hot-key';
  const N = 40;
  const CONC = 8;
  const coll = orders();
  await s.direct.db(DB).collection('orders').insertOne({ _id: 'hot-counter', n: 0 });
  let next = 0;
  const worker = async () => {
    const session = s.client.startSession();
    try {
      while (next < N) {
        const mine = next++;
        await session.withTransaction(async () => {
          const r = await coll.findOneAndUpdate({ _id: 'hot-counter' }, { $inc: { n: 1 } }, { session, returnDocument: 'after' });
          await coll.updateOne(
            { _id: 'hot-counter' },
            { $set: { last: mine } },
            { session, comment: { relaybus: { type: 'order.seq.v1', key: KEY, payload: { n: r.n, worker: mine } } } },
          );
        });
      }
    } finally {
      await session.endSession();
    }
  };
  await Promise.all(Array.from({ length: CONC }, worker));
  const evs = await s.outbox.events.find({ key: KEY }).sort({ sequence: 1 }).toArray();
  assert.equal(evs.length, N);
  evs.forEach((ev, i) => {
    assert.equal(Number(ev.sequence), i + 1, 'gapless from 1');
    assert.equal(ev.payload.n, Number(ev.sequence), 'sequence equals the commit order of the counter');
  });
  assert.equal(Number((await s.outbox.keys.findOne({ _id: KEY })).value), N);
  assert.equal(await s.outbox.deliveries.countDocuments({ key: KEY }), N);
});

test('statements without an annotation pass through untouched', async () => {
  const session = s.client.startSession();
  const before = await s.outbox.events.countDocuments({});
  try {
    await session.withTransaction(async () => {
      await orders().insertOne({ _id: 'plain-1' }, { session, comment: { trace: 'only' } });
      await orders().insertOne({ _id: 'plain-2' }, { session, comment: 'relay:not-an-annotation' });
    });
  } finally {
    await session.endSession();
  }
  assert.equal(await s.outbox.events.countDocuments({}), before);
  assert.equal(await s.direct.db(DB).collection('orders').countDocuments({ _id: /^plain-/ }), 2);
});

test('a zlib-compressing client reads the answers the proxy makes (statement, relaybusPublish, errors)', async () => {
  const { MongoClient } = require('mongodb');
  const zc = new MongoClient(s.proxy.uri(), { compressors: ['zlib'], zlibCompressionLevel: 6 });
  await zc.connect();
  const session = zc.startSession();
  try {
    await session.withTransaction(async () => {
      await zc.db(DB).collection('orders').insertOne({ _id: 'z-1', big: 'x'.repeat(20000) }, { session, comment: { relaybus: { type: 'order.placed.v1', id: 'z-ev-1', payload: 'y'.repeat(20000) } } });
      const r = await zc.db(DB).command({ relaybusPublish: 1, events: [{ type: 'user.z.v1', id: 'z-ev-2' }] }, { session });
      assert.deepEqual(r.eventIds, ['z-ev-2']);
    });
    await P.expectCode(zc.db(DB).collection('orders').insertOne({ _id: 'z-2' }, { session, comment: { relaybus: { type: 'order.after' } } }), 72);
  } finally {
    await session.endSession();
    await zc.close();
  }
  await P.checkEvent(s.outbox, 'z-ev-1', { type: 'order.placed.v1', payload: 'y'.repeat(20000), handlers: ['orders', 'confirmations'] });
  await P.checkEvent(s.outbox, 'z-ev-2', { type: 'user.z.v1', handlers: ['users'] });
});

test('with the Stable API (apiVersion 1, strict) the outbox writes carry the same API parameters', async () => {
  const { MongoClient } = require('mongodb');
  const api = new MongoClient(s.proxy.uri(), { serverApi: { version: '1', strict: true } });
  await api.connect();
  const session = api.startSession();
  try {
    await session.withTransaction(async () => {
      await api.db(DB).collection('orders').insertOne({ _id: 'api-1' }, { session, comment: { relaybus: { type: 'order.placed.v1', id: 'api-ev-1', key: 'api-k' } } });
      await api.db(DB).command({ relaybusPublish: 1, events: [{ type: 'user.api.v1', id: 'api-ev-2' }] }, { session });
    });
  } finally {
    await session.endSession();
    await api.close();
  }
  await P.checkEvent(s.outbox, 'api-ev-1', { type: 'order.placed.v1', key: 'api-k', sequence: 1, handlers: ['orders', 'confirmations'] });
  await P.checkEvent(s.outbox, 'api-ev-2', { type: 'user.api.v1', handlers: ['users'] });
});

test('an annotated find publishes once, although the driver repeats the comment on getMore', async () => {
  await s.direct.db(DB).collection('reads').insertMany([1, 2, 3, 4, 5].map((i) => ({ _id: i })));
  const session = s.client.startSession();
  try {
    await session.withTransaction(async () => {
      const docs = await s.client
        .db(DB)
        .collection('reads')
        .find({}, { session, batchSize: 2, comment: { relaybus: { type: 'order.read.v1', id: 'read-1' }, trace: 't' } })
        .toArray();
      assert.equal(docs.length, 5, 'every batch arrived through the stripped getMores');
    });
  } finally {
    await session.endSession();
  }
  assert.equal(await s.outbox.events.countDocuments({ type: 'order.read.v1' }), 1);
  await P.checkEvent(s.outbox, 'read-1', { type: 'order.read.v1', handlers: ['orders'] });
});

test('bulkWrite sends one command per kind of write, each with the comment: an explicit id publishes once', async () => {
  const session = s.client.startSession();
  try {
    await session.withTransaction(async () => {
      await s.client
        .db(DB)
        .collection('bulk')
        .bulkWrite(
          [{ insertOne: { document: { _id: 'b-1' } } }, { updateOne: { filter: { _id: 'b-1' }, update: { $set: { x: 1 } } } }, { deleteOne: { filter: { _id: 'nope' } } }],
          { session, comment: { relaybus: { type: 'order.bulk.v1', id: 'bulk-1', key: 'bulk-k' } } },
        );
    });
  } finally {
    await session.endSession();
  }
  // Three commands carried the annotation; the id made the second and third find the event.
  await P.checkEvent(s.outbox, 'bulk-1', { type: 'order.bulk.v1', key: 'bulk-k', sequence: 1, handlers: ['orders'] });
  assert.equal(Number((await s.outbox.keys.findOne({ _id: 'bulk-k' })).value), 1);
});

// Last in the file: the second proxy declares one more handler ('audit') to the fleet, and a
// stopped proxy's declarations stand for the fleet's retention, so the first proxy publishes
// for 'audit' too from its next fleet read (handler_heartbeat) on; tests after this one would
// see it or not by timing.
test('an explicit id published again adds nothing; a new handler gets only its own delivery', async () => {
  const publish = async (client, id) => {
    const session = client.startSession();
    try {
      await session.withTransaction(async () => {
        await client
          .db(DB)
          .collection('orders')
          .updateOne({ _id: 'o-dup' }, { $inc: { n: 1 } }, { session, upsert: true, comment: { relaybus: { type: 'order.placed.v1', id, key: 'dup-k' } } });
      });
    } finally {
      await session.endSession();
    }
  };
  await publish(s.client, 'dup-1');
  await publish(s.client, 'dup-1');
  await P.checkEvent(s.outbox, 'dup-1', { type: 'order.placed.v1', key: 'dup-k', sequence: 1, handlers: ['orders', 'confirmations'] });
  assert.equal(Number((await s.outbox.keys.findOne({ _id: 'dup-k' })).value), 1, 'a retry takes no new sequence');

  // A completed delivery is deleted, but the event still lists its handler: never redelivered.
  await s.outbox.deliveries.deleteOne({ eventId: 'dup-1', handler: 'orders' });

  // A second proxy with one more handler subscribed to the type.
  const more = { ...P.HANDLERS, audit: 'order.*' };
  const s2 = await P.startStack({ upstream: s.upstream, handlers: more });
  try {
    await publish(s2.client, 'dup-1');
  } finally {
    await s2.stop({ keepUpstream: true });
  }
  const ev = await s.outbox.events.findOne({ _id: 'dup-1' });
  assert.deepEqual([...ev.handlers].sort(), ['audit', 'confirmations', 'orders']);
  const dels = await s.outbox.deliveries.find({ eventId: 'dup-1' }).toArray();
  assert.deepEqual(dels.map((d) => d.handler).sort(), ['audit', 'confirmations'], 'only the new handler got a delivery');
  const audit = dels.find((d) => d.handler === 'audit');
  assert.equal(audit.key, 'dup-k');
  assert.equal(Number(audit.sequence), 1, 'the new delivery copies the stored sequence');
  assert.equal(Number((await s.outbox.keys.findOne({ _id: 'dup-k' })).value), 1);
  assert.equal((await s.direct.db(DB).collection('orders').findOne({ _id: 'o-dup' })).n, 3);
});

H.registerFinalChecks(test, [() => s && s.upstream.stop()], { beforeStop: () => s && s.closeClients() });
