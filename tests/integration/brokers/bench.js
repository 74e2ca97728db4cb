'use strict';
// Broker handler benchmark (not a timed test), webhook, NATS JetStream,
// RabbitMQ and Kafka side by side in one run, each with one handler of that kind
// (concurrency 16) on its own outbox, against the server double:
//  - deliveries per second: N due deliveries on 50 keys (and every 10th
//    without a key) written into the outbox, then the dispatching proxy
//    started; from the first arrival at the consumer to the last;
//  - publish-to-broker latency: M events published one transaction at a
//    time through the dispatching proxy (the local wake-up), from the start
//    of the transaction to the independent consumer's receipt (the sink's
//    request, the JetStream push consumer's message, amqplib's delivery,
//    the kafkajs consumer's message from librdkafka's mock cluster);
//    p50 and p99.
//
//   RELAYBUS_PROXY_BIN=build/relaybus-proxy node tests/integration/brokers/bench.js [N] [M]
//
// Prints one JSON object per kind (BENCH_KINDS=kafka,nats: only those).

const { MongoClient } = require('mongodb');
const amqp = require('amqplib');
const { connect } = require('@nats-io/transport-node');
const { jetstreamManager, jetstream } = require('@nats-io/jetstream');
const { startDouble } = require('../lib/double');
const { uniqueDbName, sleep } = require('../lib/proxy');
const { startNats } = require('../lib/nats');
const { startRabbit } = require('../lib/rabbitmq');
const { startKafka, kafkaClient } = require('../lib/kafka');
const { startSink } = require('../dispatch/sink');
const { startDispatchProxy, publish, publishThroughProxy, waitFor } = require('../dispatch/helpers');

const N = Number(process.argv[2] || 2000);
const M = Number(process.argv[3] || 100);

function events(n, tag) {
  const out = [];
  for (let i = 0; i < n; i++) {
    const e = { id: `${tag}-${i}`, type: 'order.placed.v1', payload: { i } };
    if (i % 10 !== 9) e.key = `key-${i % 50}`;
    out.push(e);
  }
  return out;
}

const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};

// A consumer per kind: `arrived` maps an event id to its first arrival time.
async function consumerFor(kind, tag) {
  const arrived = new Map();
  const note = (id) => { if (!arrived.has(id)) arrived.set(id, Date.now()); };
  if (kind === 'webhook') {
    const sink = await startSink({});
    const poll = setInterval(() => { for (const [id, at] of sink.stats().firstAt) if (!arrived.has(id)) arrived.set(id, at); }, 5);
    return { arrived, handler: { kind: 'webhook', url: sink.url('/hook') }, async close() { clearInterval(poll); await sink.close(); } };
  }
  if (kind === 'nats') {
    const nats = await startNats();
    const nc = await connect({ servers: nats.url });
    const jsm = await jetstreamManager(nc);
    const stream = `BENCH_${tag}`;
    await jsm.streams.add({ name: stream, subjects: [`bench.${tag}.>`] });
    const c = await jetstream(nc).consumers.get(stream); // ordered consumer
    const msgs = await c.consume();
    (async () => { for await (const m of msgs) note(JSON.parse(m.string()).id); })().catch(() => {});
    return {
      arrived, handler: { kind: 'nats', url: nats.url, subject: `bench.${tag}.{type}` },
      async close() { await msgs.close().catch(() => {}); await nc.close(); await nats.close(); },
    };
  }
  if (kind === 'kafka') {
    const kafka = await startKafka({ brokers: 1 });
    const topic = `bench.${tag}.order.placed.v1`;
    await kafka.createTopic(topic, 4);
    const consumer = kafkaClient(kafka.brokers).consumer({ groupId: `bench-${tag}`, maxWaitTimeInMs: 10 });
    await consumer.connect();
    await consumer.subscribe({ topic, fromBeginning: true });
    const joined = new Promise((resolve) => consumer.on(consumer.events.GROUP_JOIN, resolve));
    await consumer.run({ eachMessage: async ({ message }) => note(JSON.parse(message.value.toString()).id) });
    await joined;
    return {
      arrived, handler: { kind: 'kafka', brokers: kafka.brokers, topic: `bench.${tag}.{type}` },
      async close() { await consumer.disconnect(); await kafka.close(); },
    };
  }
  const rabbit = await startRabbit();
  const conn = await amqp.connect(rabbit.url);
  const ch = await conn.createChannel();
  const exchange = `bench.${tag}`;
  await ch.assertExchange(exchange, 'topic', { durable: true });
  await ch.assertQueue(`${exchange}.q`, { durable: true });
  await ch.bindQueue(`${exchange}.q`, exchange, '#');
  await ch.consume(`${exchange}.q`, (m) => { note(JSON.parse(m.content.toString()).id); ch.ack(m); });
  return {
    arrived, handler: { kind: 'rabbitmq', url: rabbit.url, exchange },
    async close() { await conn.close(); await rabbit.close(); },
  };
}

async function benchKind(up, kind) {
  const tag = `${kind}${process.pid}`;
  const consumer = await consumerFor(kind, tag);
  const db = uniqueDbName(`bench_${kind}`);
  const direct = await new MongoClient(up.uri).connect();
  const handler = { name: 'bench', events: 'order.*', concurrency: 16, ...consumer.handler };
  // Throughput: the backlog first, then the proxy.
  const backlog = events(N, `${kind}-t`);
  await publish(direct, db, backlog, ['bench'], 100);
  const p = await startDispatchProxy({ upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 100 }, handlers: [handler] });
  await waitFor(async () => backlog.every((e) => consumer.arrived.has(e.id)), 600000, `${kind}: every event`);
  const times = backlog.map((e) => consumer.arrived.get(e.id));
  const perSecond = Math.round((N / Math.max(1, Math.max(...times) - Math.min(...times))) * 1000);
  // Latency: one event per transaction through the proxy.
  const client = await new MongoClient(`mongodb://127.0.0.1:${p.port}/`).connect();
  const lat = [];
  for (const e of events(M, `${kind}-l`)) {
    const t0 = Date.now();
    await publishThroughProxy(client, db, [e], 1);
    await waitFor(async () => consumer.arrived.has(e.id), 30000, `${kind}: ${e.id}`);
    lat.push(consumer.arrived.get(e.id) - t0);
    await sleep(10);
  }
  await client.close();
  await p.stop();
  await direct.close();
  await consumer.close();
  return { kind, deliveries: N, perSecond, latencySamples: M, p50: pct(lat, 50), p99: pct(lat, 99) };
}

(async () => {
  const up = await startDouble();
  try {
    for (const kind of (process.env.BENCH_KINDS || 'webhook,nats,rabbitmq,kafka').split(',')) console.log(JSON.stringify(await benchKind(up, kind)));
  } finally {
    await up.stop();
  }
})().catch((e) => { console.error(e); process.exit(1); });
