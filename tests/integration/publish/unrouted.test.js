'use strict';
// No silent drops: an annotated event no handler subscribes to (a mistyped type) is counted in
// relaybus_events_unrouted_total{type}; with [outbox] unrouted = warn it is stored and a line
// names its type; with unrouted = refuse the statement is answered BadValue with a clear error,
// and the transaction writes nothing. A type only another live proxy's handler takes (a
// document in the outbox's handlers collection) is routed: it is accepted and gets that
// handler's delivery. relaybusStatus answers through the proxy, and is CommandNotFound without it.

const test = require('node:test');
const assert = require('node:assert/strict');
const P = require('./lib');

const H = P.H;
const DB = H.uniqueDbName('unrouted');

async function metricsText(port) {
  const res = await fetch(`http://127.0.0.1:${port}/metrics`);
  assert.equal(res.status, 200);
  return res.text();
}

function unroutedCount(text, type) {
  const m = text.match(new RegExp(`^relaybus_events_unrouted_total\\{type="${type.replace(/\./g, '\\.')}"\\} (\\d+)$`, 'm'));
  return m ? Number(m[1]) : 0;
}

async function stack(mode) {
  const adminPort = await H.freePort();
  const s = await P.startStack({
    extraIni: `[outbox]\nunrouted = ${mode}\nhandler_heartbeat = 200ms\n\n[admin]\nlisten = 127.0.0.1:${adminPort}\n`,
  });
  return { s, adminPort };
}

async function inTxn(client, fn) {
  const session = client.startSession();
  try {
    await session.withTransaction(() => fn(session));
  } finally {
    await session.endSession();
  }
}

test('unrouted = warn: the event is stored without deliveries, counted by type and logged', async (t) => {
  const { s, adminPort } = await stack('warn');
  t.after(() => s.stop());
  const items = s.client.db(DB).collection('items');
  await inTxn(s.client, async (session) => {
    await items.insertOne({ _id: 'w1' }, { session, comment: { relaybus: { type: 'odrer.placed.v1', id: 'typo-1', payload: {} } } });
    await items.insertOne({ _id: 'w2' }, { session, comment: { relaybus: { type: 'order.placed.v1', id: 'ok-1', payload: {} } } });
  });
  const typo = await s.outbox.events.findOne({ _id: 'typo-1' });
  assert.ok(typo, 'the unrouted event is stored');
  assert.deepEqual(typo.handlers, []);
  assert.equal(await s.outbox.deliveries.countDocuments({ eventId: 'typo-1' }), 0);
  assert.equal(await s.outbox.deliveries.countDocuments({ eventId: 'ok-1' }), 2);
  const text = await metricsText(adminPort);
  assert.equal(unroutedCount(text, 'odrer.placed.v1'), 1);
  assert.equal(unroutedCount(text, 'order.placed.v1'), 0, 'a routed type is not counted');
  assert.match(s.proxy.log(), /no handler subscribes to event type "odrer\.placed\.v1"/);
});

test('unrouted = refuse: the statement is refused with BadValue and the transaction writes nothing', async (t) => {
  const { s, adminPort } = await stack('refuse');
  t.after(() => s.stop());
  const items = s.client.db(DB).collection('items');
  let err = null;
  try {
    await inTxn(s.client, async (session) => {
      await items.insertOne({ _id: 'r1' }, { session, comment: { relaybus: { type: 'order.placed.v1', id: 'r-ok', payload: {} } } });
      await items.insertOne({ _id: 'r2' }, { session, comment: { relaybus: { type: 'odrer.placed.v1', id: 'r-typo', payload: {} } } });
    });
  } catch (e) {
    err = e;
  }
  assert.ok(err, 'the transaction fails');
  assert.equal(err.code, 2);
  assert.equal(err.codeName, 'BadValue');
  assert.match(err.message, /^relaybus: no handler subscribes to event type "odrer\.placed\.v1" \(\[outbox\] unrouted = refuse\)/);
  assert.equal(await s.direct.db(DB).collection('items').countDocuments({}), 0, 'no business write');
  assert.equal(await s.outbox.events.countDocuments({}), 0, 'no event');
  assert.equal(await s.outbox.deliveries.countDocuments({}), 0, 'no delivery');
  // relaybusPublish is refused the same way.
  await assert.rejects(
    inTxn(s.client, (session) =>
      s.client.db(DB).command({ relaybusPublish: 1, events: [{ type: 'nobody.listens', payload: {} }] }, { session })),
    (e) => e.code === 2 && /event type "nobody\.listens"/.test(e.message));
  const text = await metricsText(adminPort);
  assert.equal(unroutedCount(text, 'odrer.placed.v1'), 1);
  assert.equal(unroutedCount(text, 'nobody.listens'), 1);
  // The session goes on with routed work.
  await inTxn(s.client, (session) =>
    items.insertOne({ _id: 'r3' }, { session, comment: { relaybus: { type: 'user.created', id: 'r-user', payload: {} } } }));
  assert.equal(await s.outbox.deliveries.countDocuments({ eventId: 'r-user' }), 1);
});

test('a type only another live proxy subscribes to is routed: accepted, with that handler\'s delivery', async (t) => {
  const { s } = await stack('refuse');
  t.after(() => s.stop());
  const handlers = s.direct.db(P.OUTBOX_DB).collection(`${P.PREFIX}handlers`);
  const other = { _id: 'elsewhere/1/abc', startedAt: new Date(), heartbeatAt: new Date(),
    handlers: [{ name: 'remote', kind: 'webhook', events: ['fleet.*'], hash: 'sha256:0123456789abcdef' }] };
  await handlers.insertOne(other);
  // Kept live by its heartbeat while the proxy reads the fleet every 200 ms.
  const beat = setInterval(() => handlers.updateOne({ _id: other._id }, { $set: { heartbeatAt: new Date() } }).catch(() => {}), 100);
  t.after(() => clearInterval(beat));
  const items = s.client.db(DB).collection('items');
  const publishRemote = (id) => inTxn(s.client, (session) =>
    items.insertOne({ _id: id }, { session, comment: { relaybus: { type: 'fleet.thing', id, payload: {} } } }));
  const deadline = Date.now() + 10000;
  for (;;) {
    try {
      await publishRemote('f1');
      break;
    } catch (e) {
      if (e.code !== 2 || Date.now() > deadline) throw e; // refused until the proxy read the document
      await H.sleep(100);
    }
  }
  const dels = await s.outbox.deliveries.find({ eventId: 'f1' }).toArray();
  assert.deepEqual(dels.map((d) => d.handler), ['remote']);
  assert.deepEqual((await s.outbox.events.findOne({ _id: 'f1' })).handlers, ['remote']);
});

test('relaybusStatus tells an application it talks to the proxy', async (t) => {
  const { s } = await stack('accept');
  t.after(() => s.stop());
  const st = await s.client.db('admin').command({ relaybusStatus: 1 });
  assert.equal(st.ok, 1);
  assert.equal(st.proxy, 'relaybus-proxy');
  assert.match(st.version, /^\d+\.\d+\.\d+/);
  assert.equal(st.handlers, Object.keys(P.HANDLERS).length);
  assert.equal(st.unrouted, 'accept');
  assert.equal(typeof st.fleetHandlers, 'number');
  assert.equal(typeof st.fleetInstances, 'number');
  assert.equal(Object.values(st).some((v) => typeof v === 'string' && /orders|confirmations/.test(v)), false,
    'no handler names: the proxy cannot tell whether the connection authenticated');
  // Straight to MongoDB the command does not exist.
  await assert.rejects(s.direct.db('admin').command({ relaybusStatus: 1 }), (e) => e.code === 59);
});
