'use strict';
// [handler NAME] format and json on webhooks, end to end: one event
// published through the proxy reaches four webhook handlers, one per
// format, and each receiver reads what docs/handlers.md#formats says: the
// relaybus envelope; CloudEvents binary mode (every attribute as a ce-*
// header, the payload as the body); CloudEvents structured mode (one
// application/cloudevents+json object); the payload alone in plain JSON
// with the metadata in relaybus-* headers.  Every request's Standard
// Webhooks signature verifies over the body actually sent, and the event's
// W3C trace context is an HTTP header in every format.

const test = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const { MongoClient } = require('mongodb');
const { startUpstream, uniqueDbName, clientUri } = require('../lib/proxy');
const { startDispatchProxy, waitFor, newSecret, verifies } = require('./helpers');

// The proxy's stop() checks its log for sanitizer reports (helpers.js).

const TRACEPARENT = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';

// Keeps every request whole: path, headers, raw body.  Answers 204.
async function startRecorder() {
  const requests = [];
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      requests.push({ path: req.url, headers: req.headers, body: Buffer.concat(chunks).toString('utf8') });
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

test('each format reaches a webhook as documented, signed over the body sent, with the trace context as a header', { timeout: 60000 }, async (t) => {
  const up = await startUpstream();
  t.after(() => up.stop());
  const rec = await startRecorder();
  t.after(() => rec.close());
  const secret = newSecret();
  const db = uniqueDbName('dispatch_formats');
  const hook = (name, extra) => ({ name, events: 'order.*', kind: 'webhook', url: rec.url(`/${name}`), secret, ...extra });
  const p = await startDispatchProxy({
    upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 100 },
    handlers: [
      hook('relaybus', {}),
      hook('ce', { format: 'cloudevents', source: '/orders' }),
      hook('structured', { format: 'cloudevents-structured' }),
      hook('payload', { format: 'payload', json: 'plain' }),
    ],
  });
  t.after(() => p.kill());
  const client = await new MongoClient(clientUri({ host: '127.0.0.1', port: p.port })).connect();
  t.after(() => client.close());

  const at = new Date('2026-11-30T11:00:00Z');
  const session = client.startSession();
  try {
    await session.withTransaction(async () => {
      await client.db(db).collection('items').insertOne({ _id: 1 }, {
        session,
        comment: { relaybus: { type: 'order.placed.v1', id: 'ord-1', key: 'order-1', payload: { orderId: 'order-1', at }, headers: { tenant: 't1', traceparent: TRACEPARENT, tracestate: 'v=1' } } },
      });
    });
  } finally {
    await session.endSession();
  }
  await waitFor(async () => rec.requests.length >= 4, 30000, 'one request per handler');
  const by = Object.fromEntries(rec.requests.map((r) => [r.path.slice(1), r]));

  for (const r of rec.requests) {
    assert.ok(verifies(secret, r.body, r.headers), `${r.path}: the signature verifies over the body sent`);
    assert.equal(r.headers.traceparent, TRACEPARENT, `${r.path}: traceparent is an HTTP header`);
    assert.equal(r.headers.tracestate, 'v=1', `${r.path}: tracestate is an HTTP header`);
  }

  // relaybus: the envelope, relaxed Extended JSON.
  const env = JSON.parse(by.relaybus.body);
  assert.equal(by.relaybus.headers['content-type'], 'application/json');
  assert.equal(env.id, 'ord-1');
  assert.deepEqual(env.payload.at, { $date: '2026-11-30T11:00:00Z' });
  assert.equal(by.relaybus.headers['ce-id'], undefined);

  // cloudevents: binary mode, every attribute a ce-* header.
  const ce = by.ce.headers;
  assert.equal(ce['content-type'], 'application/json');
  assert.equal(ce['ce-specversion'], '1.0');
  assert.equal(ce['ce-id'], 'ord-1');
  assert.equal(ce['ce-source'], '/orders');
  assert.equal(ce['ce-type'], 'order.placed.v1');
  assert.match(ce['ce-time'], /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
  assert.ok(Math.abs(Date.parse(ce['ce-time']) - Date.now()) < 60000, 'time is the event createdAt');
  assert.equal(ce['ce-subject'], 'order-1');
  assert.equal(ce['ce-sequence'], '0000000000000000001');
  assert.deepEqual(JSON.parse(by.ce.body), { orderId: 'order-1', at: { $date: '2026-11-30T11:00:00Z' } });

  // cloudevents-structured: one object, the default source.
  assert.equal(by.structured.headers['content-type'], 'application/cloudevents+json');
  const st = JSON.parse(by.structured.body);
  assert.equal(st.specversion, '1.0');
  assert.equal(st.id, 'ord-1');
  assert.equal(st.source, 'relaybus-proxy');
  assert.equal(st.type, 'order.placed.v1');
  assert.equal(st.time, ce['ce-time']);
  assert.equal(st.subject, 'order-1');
  assert.equal(st.sequence, '0000000000000000001');
  assert.equal(st.datacontenttype, 'application/json');
  assert.equal(st.traceparent, TRACEPARENT);
  assert.deepEqual(st.data, { orderId: 'order-1', at: { $date: '2026-11-30T11:00:00Z' } });

  // payload, json = plain: the payload alone, the date an RFC 3339 string,
  // the metadata in relaybus-* headers, the event's own headers too.
  assert.deepEqual(JSON.parse(by.payload.body), { orderId: 'order-1', at: '2026-11-30T11:00:00.000Z' });
  const ph = by.payload.headers;
  assert.equal(ph['relaybus-event-id'], 'ord-1');
  assert.equal(ph['relaybus-type'], 'order.placed.v1');
  assert.equal(ph['relaybus-key'], 'order-1');
  assert.equal(ph['relaybus-sequence'], '1');
  assert.equal(ph['relaybus-delivery-id'], ph['webhook-id']);
  assert.equal(ph.tenant, 't1');
  assert.equal((await p.stop()).code, 0);
});

test('pull: relaybusClaim hands out the rendered body, the CloudEvents attributes and the trace context; a malformed traceparent is refused at publish', { timeout: 60000 }, async (t) => {
  const up = await startUpstream();
  t.after(() => up.stop());
  const db = uniqueDbName('dispatch_formats_pull');
  const p = await startDispatchProxy({
    upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 100 },
    handlers: [{ name: 'pulled', events: 'order.*', kind: 'pull', format: 'cloudevents', json: 'plain', source: 'urn:shop:orders' }],
  });
  t.after(() => p.kill());
  const client = await new MongoClient(clientUri({ host: '127.0.0.1', port: p.port })).connect();
  t.after(() => client.close());
  const items = client.db(db).collection('items');
  // The annotation is published inside a transaction, as an application does.
  const insert = async (doc, comment) => {
    const session = client.startSession();
    try {
      await session.withTransaction(() => items.insertOne(doc, { session, comment }));
    } finally {
      await session.endSession();
    }
  };
  const annotate = (headers) => ({ relaybus: { type: 'order.placed.v1', id: `ord-${Math.random()}`, key: 'order-1', payload: { at: new Date('2026-11-30T11:00:00Z') }, headers } });

  // Refused with the annotation's 2 BadValue, the reason in the message,
  // and nothing written.
  for (const [tp, why] of [
    ['00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7', /traceparent is shorter than the 55 characters/],
    ['00-00000000000000000000000000000000-00f067aa0ba902b7-01', /traceparent has an all-zero trace-id/],
  ]) {
    await assert.rejects(insert({ _id: tp }, annotate({ traceparent: tp })), (e) => {
      assert.equal(e.code, 2);
      assert.equal(e.codeName, 'BadValue');
      assert.match(e.message, why);
      return true;
    });
  }
  assert.equal(await items.countDocuments({}), 0, 'a refused statement writes nothing');

  await insert({ _id: 1 }, annotate({ traceparent: TRACEPARENT, tracestate: 'v=1' }));
  let d;
  await waitFor(async () => {
    const r = await client.db('admin').command({ relaybusClaim: 'pulled', limit: 1 });
    d = r.deliveries[0];
    return d !== undefined;
  }, 10000, 'a delivery to claim');
  assert.equal(d.traceparent, TRACEPARENT);
  assert.equal(d.tracestate, 'v=1');
  assert.equal(d.contentType, 'application/json');
  assert.deepEqual(JSON.parse(d.body), { at: '2026-11-30T11:00:00.000Z' }, 'the body in the handler json mode (plain)');
  assert.deepEqual(Object.keys(d.attributes).sort(), ['id', 'sequence', 'source', 'specversion', 'subject', 'time', 'type']);
  assert.equal(d.attributes.source, 'urn:shop:orders');
  assert.equal(d.attributes.id, d.eventId);
  assert.equal(d.attributes.subject, 'order-1');
  assert.equal(d.attributes.sequence, '0000000000000000001');
  await client.db('admin').command({ relaybusComplete: 'pulled', leases: [d.lease] });
  assert.equal((await p.stop()).code, 0);
});
