'use strict';
// An event's type, key and id become message headers (ce-type, ce-subject, ce-id,
// relaybus-type, relaybus-key, relaybus-event-id, and the same in every broker binding).
// A line break in one of them would end its header and start one the publisher chose.
//
// At publish: an annotation or a relaybusPublish whose type, key or id holds a control
// character is refused with 2 BadValue naming the field, and nothing is written.
//
// At emission: events that hold one anyway (stored by an older version, or written into a
// shared outbox by another program; here written straight into the outbox collections of
// the server double, as tests/integration/dispatch/helpers.js's publish does) reach a
// webhook receiver in each of the four formats and a NATS JetStream consumer with each
// control character percent-encoded in its header, and no receiver sees a header the
// event injected.

const test = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const { MongoClient } = require('mongodb');
const { connect } = require('@nats-io/transport-node');
const { jetstreamManager, jetstream } = require('@nats-io/jetstream');
const { startUpstream, uniqueDbName, clientUri } = require('../lib/proxy');
const { startNats, natsSkipReason } = require('../lib/nats');
const { startDispatchProxy, publish, waitFor } = require('./helpers');

const TYPE = 'order.placed\r\nX-Injected-Type: yes';
const KEY = 'order-1\r\nX-Injected-Key: yes';
const ID = 'ord-1\nX-Injected-Id: yes';
const enc = (s) => s.replace(/[\x00-\x08\x0a-\x1f\x7f]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase().padStart(2, '0')}`);

// Keeps every request's headers as node's HTTP parser read them.  Answers 204.
async function startRecorder() {
  const requests = [];
  const server = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      requests.push({ path: req.url, headers: req.headers, raw: req.rawHeaders });
      res.writeHead(204).end();
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    requests,
    url: (p) => `http://127.0.0.1:${server.address().port}${p}`,
    close: () => new Promise((resolve) => { server.closeAllConnections?.(); server.close(() => resolve()); }),
  };
}

function injected(headerNames) {
  return headerNames.filter((n) => /injected/i.test(n));
}

test('a type, key or id with a control character is refused at publish with 2 BadValue naming the field', { timeout: 60000 }, async (t) => {
  const up = await startUpstream();
  t.after(() => up.stop());
  const db = uniqueDbName('dispatch_hdr_refused');
  const p = await startDispatchProxy({ upstream: up.uri, outbox: { database: db }, enabled: false, handlers: [{ name: 'h', events: '*', kind: 'pull' }] });
  t.after(() => p.kill());
  const client = await new MongoClient(clientUri({ host: '127.0.0.1', port: p.port })).connect();
  t.after(() => client.close());
  const items = client.db(db).collection('items');
  const cases = [
    ['type', { type: TYPE }],
    ['key', { type: 'order.placed', key: KEY }],
    ['id', { type: 'order.placed', id: ID }],
    ['type', { type: 'order.placed\u0007' }],
    ['key', { type: 'order.placed', key: 'a\rb' }],
  ];
  for (const [field, ev] of cases) {
    // The annotation on a statement.
    const session = client.startSession();
    try {
      await assert.rejects(session.withTransaction(() => items.insertOne({ x: 1 }, { session, comment: { relaybus: ev } })), (e) => {
        assert.equal(e.code, 2, e.message);
        assert.equal(e.codeName, 'BadValue');
        assert.match(e.message, new RegExp(`events\\[0\\]\\.${field} holds a control character`));
        return true;
      });
      // relaybusPublish.
      await assert.rejects(session.withTransaction(() => client.db(db).command({ relaybusPublish: 1, events: [ev] }, { session })), (e) => {
        assert.equal(e.code, 2, e.message);
        assert.match(e.message, new RegExp(`events\\[0\\]\\.${field} holds a control character`));
        return true;
      });
    } finally {
      await session.endSession();
    }
  }
  const direct = await new MongoClient(up.uri).connect();
  t.after(() => direct.close());
  assert.equal(await direct.db(db).collection('items').countDocuments({}), 0, 'a refused statement writes nothing');
  assert.equal(await direct.db(db).collection('relaybus_events').countDocuments({}), 0, 'no event is stored');
  assert.equal((await p.stop()).code, 0);
});

test('events already stored with line breaks: no webhook format injects a header, each value arrives encoded', { timeout: 60000 }, async (t) => {
  const up = await startUpstream();
  t.after(() => up.stop());
  const rec = await startRecorder();
  t.after(() => rec.close());
  const db = uniqueDbName('dispatch_hdr_webhook');
  const hook = (name, extra) => ({ name, events: 'order.*', kind: 'webhook', url: rec.url(`/${name}`), ...extra });
  const handlers = ['relaybus', 'ce', 'structured', 'payload'];
  const p = await startDispatchProxy({
    upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 100 },
    handlers: [hook('relaybus', {}), hook('ce', { format: 'cloudevents' }), hook('structured', { format: 'cloudevents-structured' }),
      hook('payload', { format: 'payload' })],
  });
  t.after(() => p.kill());
  const direct = await new MongoClient(up.uri).connect();
  t.after(() => direct.close());
  await publish(direct, db, [{ id: ID, type: TYPE, key: KEY, payload: { n: 1 } }], handlers);
  await waitFor(async () => rec.requests.length >= 4, 30000, 'one request per handler');
  const by = Object.fromEntries(rec.requests.map((r) => [r.path.slice(1), r]));
  for (const r of rec.requests) {
    const names = r.raw.filter((_, i) => i % 2 === 0);
    assert.deepEqual(injected(names), [], `${r.path}: no injected header (${names.join(', ')})`);
    for (const v of Object.values(r.headers)) assert.doesNotMatch(String(v), /[\r\n]/);
  }
  assert.equal(by.ce.headers['ce-type'], enc(TYPE));
  assert.equal(by.ce.headers['ce-subject'], enc(KEY));
  assert.equal(by.ce.headers['ce-id'], enc(ID));
  assert.equal(by.payload.headers['relaybus-type'], enc(TYPE));
  assert.equal(by.payload.headers['relaybus-key'], enc(KEY));
  assert.equal(by.payload.headers['relaybus-event-id'], enc(ID));
  await waitFor(async () => (await direct.db(db).collection('relaybus_deliveries').countDocuments({})) === 0, 10000, 'every delivery to complete');
  assert.equal((await p.stop()).code, 0);
});

test('events already stored with line breaks: a NATS consumer sees no injected header, each value encoded', { skip: natsSkipReason() || false, timeout: 60000 }, async (t) => {
  const up = await startUpstream();
  t.after(() => up.stop());
  const nats = await startNats();
  t.after(() => nats.close());
  const stream = `RBT_HDR_${process.pid}`;
  const prefix = `rbt${process.pid}.hdr`;
  const nc = await connect({ servers: nats.url });
  t.after(() => nc.close());
  await (await jetstreamManager(nc)).streams.add({ name: stream, subjects: [`${prefix}.>`] });
  const db = uniqueDbName('dispatch_hdr_nats');
  const p = await startDispatchProxy({
    upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 100 },
    handlers: [
      { name: 'bus', events: 'order.*', kind: 'nats', url: nats.url, subject: `${prefix}.bus` },
      { name: 'busce', events: 'order.*', kind: 'nats', url: nats.url, subject: `${prefix}.ce`, format: 'cloudevents' },
    ],
  });
  t.after(() => p.kill());
  const direct = await new MongoClient(up.uri).connect();
  t.after(() => direct.close());
  await publish(direct, db, [{ id: ID, type: TYPE, key: KEY, payload: { n: 1 } }], ['bus', 'busce']);
  await waitFor(async () => (await direct.db(db).collection('relaybus_deliveries').countDocuments({})) === 0, 30000, 'both deliveries');
  const c = await jetstream(nc).consumers.get(stream);
  const msgs = [];
  for await (const m of await c.fetch({ max_messages: 2, expires: 5000 })) {
    const h = {};
    for (const k of m.headers ? m.headers.keys() : []) h[k] = m.headers.get(k);
    msgs.push({ subject: m.subject, headers: h });
  }
  assert.equal(msgs.length, 2);
  for (const m of msgs) {
    assert.deepEqual(injected(Object.keys(m.headers)), [], `${m.subject}: no injected header`);
    for (const v of Object.values(m.headers)) assert.doesNotMatch(v, /[\r\n]/);
  }
  const bus = msgs.find((m) => m.subject.endsWith('.bus')).headers;
  assert.equal(bus['relaybus-type'], enc(TYPE));
  assert.equal(bus['relaybus-key'], enc(KEY));
  assert.equal(bus['relaybus-event-id'], enc(ID));
  const ce = msgs.find((m) => m.subject.endsWith('.ce')).headers;
  assert.equal(ce['ce-type'], enc(TYPE));
  assert.equal(ce['ce-subject'], enc(KEY));
  assert.equal(ce['ce-id'], enc(ID));
  assert.equal((await p.stop()).code, 0);
});
