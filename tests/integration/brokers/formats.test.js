'use strict';
// [handler NAME] format on the broker kinds, end to end with real peers:
// nats-server (JetStream), rabbitmq-server and librdkafka's mock cluster.
// One keyed event published through the proxy reaches three handlers of
// each kind, one per format: CloudEvents binary mode (every attribute
// under the binding's header names: NATS ce-*, AMQP cloudEvents_*, Kafka
// ce_*, the payload as the body), CloudEvents structured mode (one
// application/cloudevents+json object) and the payload alone in plain
// JSON; the event's traceparent travels as a message header in each.
// Kafka's topic uses {type_prefix}.

const test = require('node:test');
const assert = require('node:assert/strict');
const amqp = require('amqplib');
const { MongoClient } = require('mongodb');
const { connect } = require('@nats-io/transport-node');
const { jetstreamManager, jetstream } = require('@nats-io/jetstream');
const { startUpstream, uniqueDbName, clientUri } = require('../lib/proxy');
const { startNats, natsSkipReason } = require('../lib/nats');
const { startRabbit, rabbitSkipReason } = require('../lib/rabbitmq');
const { startKafka, kafkaSkipReason, readTopic } = require('../lib/kafka');
const { startDispatchProxy, waitFor } = require('../dispatch/helpers');

const TRACEPARENT = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
const AT = new Date('2026-11-30T11:00:00Z');
const PAYLOAD_RELAXED = { orderId: 'order-1', at: { $date: '2026-11-30T11:00:00Z' } };
const PAYLOAD_PLAIN = { orderId: 'order-1', at: '2026-11-30T11:00:00.000Z' };

// The proxy, a client through it and a direct one; one event published.
async function publishOne(t, handlers) {
  const up = await startUpstream();
  t.after(() => up.stop());
  const db = uniqueDbName('brokers_formats');
  const p = await startDispatchProxy({ upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 100 }, handlers });
  t.after(() => p.kill());
  const client = await new MongoClient(clientUri({ host: '127.0.0.1', port: p.port })).connect();
  t.after(() => client.close());
  const direct = await new MongoClient(up.uri).connect();
  t.after(() => direct.close());
  const session = client.startSession();
  try {
    await session.withTransaction(async () => {
      await client.db(db).collection('items').insertOne({ _id: 1 }, {
        session,
        comment: { relaybus: { type: 'order.placed.v1', id: 'ord-1', key: 'order-1', payload: { orderId: 'order-1', at: AT }, headers: { tenant: 't1', traceparent: TRACEPARENT } } },
      });
    });
  } finally {
    await session.endSession();
  }
  const deliveries = direct.db(db).collection('relaybus_deliveries');
  await waitFor(async () => (await deliveries.countDocuments({ status: { $nin: ['dead', 'completed'] } })) === 0, 60000, 'every handler to complete');
  assert.equal(await deliveries.countDocuments({ status: 'dead' }), 0, 'no dead letter');
  return p;
}

// Every CloudEvents attribute of the event under `prefix`.
function checkBinary(h, prefix, source) {
  assert.equal(h[`${prefix}specversion`], '1.0');
  assert.equal(h[`${prefix}id`], 'ord-1');
  assert.equal(h[`${prefix}source`], source);
  assert.equal(h[`${prefix}type`], 'order.placed.v1');
  assert.match(h[`${prefix}time`], /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
  assert.ok(Math.abs(Date.parse(h[`${prefix}time`]) - Date.now()) < 120000, 'time is the event createdAt');
  assert.equal(h[`${prefix}subject`], 'order-1');
  assert.equal(String(h[`${prefix}sequence`]), '0000000000000000001');
  assert.equal(h.traceparent, TRACEPARENT);
  assert.equal(h.tenant, 't1');
}

function checkStructured(body, source) {
  assert.equal(body.specversion, '1.0');
  assert.equal(body.id, 'ord-1');
  assert.equal(body.source, source);
  assert.equal(body.type, 'order.placed.v1');
  assert.match(body.time, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
  assert.equal(body.subject, 'order-1');
  assert.equal(body.sequence, '0000000000000000001');
  assert.equal(body.datacontenttype, 'application/json');
  assert.equal(body.traceparent, TRACEPARENT);
  assert.deepEqual(body.data, PAYLOAD_RELAXED);
}

test('nats: each format as the NATS binding names it', { skip: natsSkipReason() || false, timeout: 120000 }, async (t) => {
  const nats = await startNats();
  t.after(() => nats.close());
  const stream = `RBT_FMT_${process.pid}`;
  const prefix = `rbt${process.pid}.fmt`;
  const nc = await connect({ servers: nats.url });
  await (await jetstreamManager(nc)).streams.add({ name: stream, subjects: [`${prefix}.>`] });
  const nh = (name, extra) => ({ name, events: 'order.*', kind: 'nats', url: nats.url, subject: `${prefix}.${name}.{type}`, ...extra });
  const p = await publishOne(t, [nh('ce', { format: 'cloudevents', source: '/orders' }), nh('st', { format: 'cloudevents-structured' }), nh('pl', { format: 'payload', json: 'plain' })]);
  const c = await jetstream(nc).consumers.get(stream);
  const by = {};
  for await (const m of await c.fetch({ max_messages: 3, expires: 5000 })) {
    const h = {};
    for (const k of m.headers ? m.headers.keys() : []) h[k] = m.headers.get(k);
    by[m.subject.split('.')[2]] = { headers: h, body: JSON.parse(m.string()) };
  }
  checkBinary(by.ce.headers, 'ce-', '/orders');
  assert.equal(by.ce.headers['content-type'], 'application/json');
  assert.deepEqual(by.ce.body, PAYLOAD_RELAXED);
  assert.equal(by.st.headers['content-type'], 'application/cloudevents+json');
  checkStructured(by.st.body, 'relaybus-proxy');
  assert.deepEqual(by.pl.body, PAYLOAD_PLAIN);
  assert.equal(by.pl.headers['relaybus-sequence'], '1');
  assert.equal(by.pl.headers.traceparent, TRACEPARENT);
  await nc.close(); // before the server stops, or the client reconnects for ever
  assert.equal((await p.stop()).code, 0);
});

test('rabbitmq: each format as the AMQP binding names it', { skip: rabbitSkipReason() || false, timeout: 120000 }, async (t) => {
  const rabbit = await startRabbit();
  t.after(() => rabbit.close());
  const exchange = `rbt.${process.pid}.fmt`;
  const queue = `${exchange}.q`;
  const conn = await amqp.connect(rabbit.url);
  conn.on('error', () => {}); // the broker's shutdown after the test
  const ch = await conn.createChannel();
  await ch.assertExchange(exchange, 'topic', { durable: true });
  await ch.assertQueue(queue, { durable: true });
  await ch.bindQueue(queue, exchange, '#');
  const rh = (name, extra) => ({ name, events: 'order.*', kind: 'rabbitmq', url: rabbit.url, exchange, routing_key: `${name}.{type}`, ...extra });
  const p = await publishOne(t, [rh('ce', { format: 'cloudevents', source: '/orders' }), rh('st', { format: 'cloudevents-structured' }), rh('pl', { format: 'payload', json: 'plain' })]);
  const by = {};
  for (let i = 0; i < 3; i++) {
    const m = await ch.get(queue, { noAck: true });
    assert.ok(m, `message ${i + 1} of 3 in the queue`);
    by[m.fields.routingKey.split('.')[0]] = { properties: m.properties, body: JSON.parse(m.content.toString('utf8')) };
  }
  checkBinary(by.ce.properties.headers, 'cloudEvents_', '/orders');
  assert.equal(by.ce.properties.contentType, 'application/json');
  assert.deepEqual(by.ce.body, PAYLOAD_RELAXED);
  assert.equal(by.st.properties.contentType, 'application/cloudevents+json');
  checkStructured(by.st.body, 'relaybus-proxy');
  assert.deepEqual(by.pl.body, PAYLOAD_PLAIN);
  assert.equal(Number(by.pl.properties.headers['relaybus-sequence']), 1);
  assert.equal(by.pl.properties.messageId, 'ord-1');
  await ch.close();
  await conn.close();
  assert.equal((await p.stop()).code, 0);
});

test('kafka: each format as the Kafka binding names it, on a {type_prefix} topic', { skip: kafkaSkipReason() || false, timeout: 120000 }, async (t) => {
  const kafka = await startKafka({ brokers: 1 });
  t.after(() => kafka.close());
  const base = `rbt${process.pid}-fmt`;
  for (const f of ['ce', 'st', 'pl']) await kafka.createTopic(`${base}-${f}-order`, 1);
  const kh = (name, extra) => ({ name, events: 'order.*', kind: 'kafka', brokers: kafka.brokers, topic: `${base}-${name}-{type_prefix}`, ...extra });
  const p = await publishOne(t, [kh('ce', { format: 'cloudevents', source: '/orders' }), kh('st', { format: 'cloudevents-structured' }), kh('pl', { format: 'payload', json: 'plain' })]);
  const by = {};
  for (const f of ['ce', 'st', 'pl']) {
    const msgs = await readTopic(kafka.brokers, `${base}-${f}-order`);
    assert.equal(msgs.length, 1, `one message on ${base}-${f}-order`);
    assert.equal(msgs[0].key, 'order-1', 'the message key stays the event key');
    by[f] = msgs[0];
  }
  checkBinary(by.ce.headers, 'ce_', '/orders');
  assert.equal(by.ce.headers['content-type'], 'application/json');
  assert.deepEqual(by.ce.body, PAYLOAD_RELAXED);
  assert.equal(by.st.headers['content-type'], 'application/cloudevents+json');
  checkStructured(by.st.body, 'relaybus-proxy');
  assert.deepEqual(by.pl.body, PAYLOAD_PLAIN);
  assert.equal(by.pl.headers['relaybus-sequence'], '1');
  assert.equal(by.pl.headers.traceparent, TRACEPARENT);
  assert.equal((await p.stop()).code, 0);
});
