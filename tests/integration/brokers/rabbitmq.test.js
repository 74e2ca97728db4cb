'use strict';
// kind = rabbitmq end to end: events published through the proxy reach a
// durable queue bound to a topic exchange of Debian's rabbitmq-server; an
// independent consumer (amqplib, not the rabbitmq-c the proxy uses) sees
// every event at least once, each key in sequence order, with the
// documented properties, headers and body; duplicates are counted and
// reported. Faults: the broker stopped for 10 s mid-run and started again
// (nothing lost, order per key holds, the backlog drains), a routing key no
// queue is bound to and an exchange that does not exist (dead letters with
// the broker's error after max_attempts), bad configuration.
//
// Scale: RELAYBUS_BROKER_EVENTS (default 1000) events on
// RELAYBUS_BROKER_KEYS (default 20) keys.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const amqp = require('amqplib');
const { MongoClient } = require('mongodb');
const { startUpstream, uniqueDbName, sleep, tmpDir, proxyBin, clientUri, freePort } = require('../lib/proxy');
const { startRabbit, rabbitSkipReason } = require('../lib/rabbitmq');
const { startDispatchProxy, publish, waitFor } = require('../dispatch/helpers');

const N_EVENTS = Number(process.env.RELAYBUS_BROKER_EVENTS || 1000);
const N_KEYS = Number(process.env.RELAYBUS_BROKER_KEYS || 20);
const OUTAGE_MS = 10000;
// Full jitter draws each wait in [0, delay]: thirty attempts, most of them
// up to 4 s apart (about a minute on average), outlast the outage, a
// broker's stop and start included, with a wide margin for every delivery.
const OUTAGE_SCHEDULE = ['200ms', '500ms', '1s', '2s', ...Array(26).fill('4s')].join(', ');
const skip = rabbitSkipReason() || false;

function makeEvents(n, keys, tag) {
  const events = [];
  for (let i = 0; i < n; i++) {
    const e = { id: `${tag}-${i}`, type: 'order.placed.v1', payload: { i, note: 'é✓' }, headers: { tenant: 'acme', 'relaybus-type': 'forged' } };
    if (i % 10 !== 9) e.key = `key-${i % keys}`;
    events.push(e);
  }
  return events;
}

async function publishThroughProxy(client, dbName, events, perTxn = 10) {
  const items = client.db(dbName).collection('items');
  for (let i = 0; i < events.length; i += perTxn) {
    const chunk = events.slice(i, i + perTxn);
    const session = client.startSession();
    try {
      await session.withTransaction(async () => {
        for (const e of chunk) {
          const relaybus = { type: e.type, id: e.id, payload: e.payload, headers: e.headers };
          if (e.key !== undefined) relaybus.key = e.key;
          await items.insertOne({ _id: e.id }, { session, comment: { relaybus } });
        }
      });
    } finally {
      await session.endSession();
    }
  }
}

// A durable topic exchange and a durable queue bound to it for `pattern`.
async function declare(url, exchange, queue, pattern) {
  const conn = await amqp.connect(url);
  try {
    const ch = await conn.createChannel();
    await ch.assertExchange(exchange, 'topic', { durable: true });
    await ch.assertQueue(queue, { durable: true });
    await ch.bindQueue(queue, exchange, pattern);
    await ch.close();
  } finally {
    await conn.close();
  }
}

async function queueDepth(url, queue) {
  const conn = await amqp.connect(url);
  try {
    const ch = await conn.createChannel();
    const { messageCount } = await ch.checkQueue(queue);
    await ch.close();
    return messageCount;
  } finally {
    await conn.close();
  }
}

// Consumes the whole queue, in order (one consumer, acked one by one).
async function readQueue(url, queue, total) {
  const conn = await amqp.connect(url);
  try {
    const ch = await conn.createChannel();
    await ch.prefetch(100);
    const out = [];
    await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`the queue gave ${out.length} of ${total} messages`)), 60000);
      ch.consume(queue, (m) => {
        out.push({ routingKey: m.fields.routingKey, properties: m.properties, body: JSON.parse(m.content.toString('utf8')) });
        ch.ack(m);
        if (out.length >= total) { clearTimeout(timer); resolve(); }
      }).catch(reject);
    });
    await ch.close();
    return out;
  } finally {
    await conn.close();
  }
}

function check(t, events, msgs, routingKey) {
  const byId = new Map(events.map((e) => [e.id, e]));
  const seen = new Map();
  const lastSeq = new Map();
  let duplicates = 0;
  for (const m of msgs) {
    const e = byId.get(m.body.id);
    const h = m.properties.headers;
    assert.ok(e, `an event the test published: ${m.body.id}`);
    assert.equal(m.routingKey, routingKey);
    assert.equal(m.properties.messageId, e.id, 'message_id is the event id');
    assert.equal(m.properties.contentType, 'application/json');
    assert.equal(m.properties.deliveryMode, 2, 'persistent');
    assert.match(h['relaybus-delivery-id'], /^[0-9a-f]{24}$/);
    assert.equal(h['relaybus-event-id'], e.id);
    assert.equal(h['relaybus-type'], e.type, 'an event header cannot forge relaybus-type');
    if (e.headers) assert.equal(h.tenant, 'acme', "the event's own headers");
    assert.deepEqual(m.body.payload, e.payload);
    assert.deepEqual(m.body.headers, e.headers);
    if (e.key !== undefined) {
      assert.equal(h['relaybus-key'], e.key);
      assert.equal(Number(h['relaybus-sequence']), m.body.sequence);
      const last = lastSeq.get(e.key) || 0;
      assert.ok(m.body.sequence >= last, `${e.key}: sequence ${m.body.sequence} after ${last}`);
      if (m.body.sequence === last) duplicates++;
      else assert.equal(m.body.sequence, last + 1, `${e.key}: no sequence skipped before ${m.body.sequence}`);
      lastSeq.set(e.key, m.body.sequence);
    } else {
      assert.equal(h['relaybus-sequence'], undefined);
      if (seen.has(e.id)) duplicates++;
    }
    seen.set(e.id, true);
  }
  for (const e of events) assert.ok(seen.has(e.id), `${e.id} reached the queue`);
  t.diagnostic(`${events.length} events, ${msgs.length} messages in the queue, ${duplicates} duplicate(s)`);
  return duplicates;
}

async function undelivered(client, db) {
  return client.db(db).collection('relaybus_deliveries').countDocuments({ status: { $nin: ['dead', 'completed'] } });
}

async function setup(t, tag, handler, extra = {}) {
  const up = await startUpstream();
  t.after(() => up.stop());
  const rabbit = await startRabbit();
  t.after(() => rabbit.close());
  const exchange = `rbt.${process.pid}.${tag}`;
  const queue = `rbt.${process.pid}.${tag}.q`;
  await declare(rabbit.url, exchange, queue, 'order.#');
  const db = uniqueDbName(`brokers_rabbit_${tag}`);
  const p = await startDispatchProxy({
    upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 100 }, ...extra,
    handlers: [{ name: 'bus', events: 'order.*', kind: 'rabbitmq', url: rabbit.url, exchange, routing_key: '{type}', ...handler }],
  });
  t.after(() => p.kill());
  const client = await new MongoClient(clientUri({ host: '127.0.0.1', port: p.port })).connect();
  t.after(() => client.close());
  const direct = await new MongoClient(up.uri).connect();
  t.after(() => direct.close());
  return { rabbit, exchange, queue, db, p, client, direct };
}

test(`${N_EVENTS} events on ${N_KEYS} keys through the proxy reach the queue, each key in order`, { skip, timeout: 300000 }, async (t) => {
  const s = await setup(t, 'e2e', {});
  const events = makeEvents(N_EVENTS, N_KEYS, 'e2e');
  const started = Date.now();
  await publishThroughProxy(s.client, s.db, events);
  await waitFor(async () => (await undelivered(s.direct, s.db)) === 0, 240000, 'every delivery to complete');
  t.diagnostic(`published and delivered in ${Date.now() - started} ms`);
  assert.equal(await s.direct.db(s.db).collection('relaybus_deliveries').countDocuments({ status: 'dead' }), 0, 'no dead letter');
  const depth = await queueDepth(s.rabbit.url, s.queue);
  check(t, events, await readQueue(s.rabbit.url, s.queue, depth), 'order.placed.v1');
  assert.match(s.p.log(), /handler bus: connected to RabbitMQ/);
  assert.equal((await s.p.stop()).code, 0);
});

test('rabbitmq-server stopped for 10 s mid-run: nothing lost, order per key holds, the backlog drains', { skip, timeout: 300000 }, async (t) => {
  if (process.env.RABBITMQ_URL) return t.skip('RABBITMQ_URL names an external broker, which the test cannot stop');
  const adminPort = await freePort();
  const s = await setup(t, 'out', { timeout_ms: 2000, retry_schedule: OUTAGE_SCHEDULE }, { adminListen: `127.0.0.1:${adminPort}` });
  const n = Math.max(200, Math.floor(N_EVENTS / 2));
  const events = makeEvents(n, Math.min(N_KEYS, 20), 'out');
  const half = Math.floor(n / 2);
  await publishThroughProxy(s.client, s.db, events.slice(0, half));
  await s.rabbit.stop();
  const downAt = Date.now();
  await publishThroughProxy(s.client, s.db, events.slice(half));
  await waitFor(() => /lost RabbitMQ/.test(s.p.log()), 20000, 'the proxy to see the connection go');
  const r = await (await fetch(`http://127.0.0.1:${adminPort}/readyz`)).json();
  assert.equal(r.ready, true);
  assert.deepEqual(r.brokers.map((b) => [b.name, b.kind, b.state]), [['bus', 'rabbitmq', 'disconnected']]);
  await sleep(Math.max(0, OUTAGE_MS - (Date.now() - downAt)));
  const backlog = await undelivered(s.direct, s.db);
  assert.ok(backlog > 0, `deliveries waited during the outage (${backlog})`);
  await s.rabbit.start();
  const upAt = Date.now();
  await waitFor(async () => (await undelivered(s.direct, s.db)) === 0, 120000, 'the backlog to drain');
  t.diagnostic(`outage ${upAt - downAt} ms, backlog of ${backlog} drained in ${Date.now() - upAt} ms`);
  assert.equal(await s.direct.db(s.db).collection('relaybus_deliveries').countDocuments({ status: 'dead' }), 0, 'no dead letter');
  const depth = await queueDepth(s.rabbit.url, s.queue);
  check(t, events, await readQueue(s.rabbit.url, s.queue, depth), 'order.placed.v1');
  assert.ok((s.p.log().match(/connected to RabbitMQ/g) || []).length >= 2, 'connected again after the outage');
  assert.deepEqual((await (await fetch(`http://127.0.0.1:${adminPort}/readyz`)).json()).brokers, [{ name: 'bus', kind: 'rabbitmq', state: 'connected' }]);
  assert.equal((await s.p.stop()).code, 0);
});

test('a proxy SIGKILLed mid-run and started again loses nothing, each key still in order', { skip, timeout: 300000 }, async (t) => {
  const up = await startUpstream();
  t.after(() => up.stop());
  const rabbit = await startRabbit();
  t.after(() => rabbit.close());
  const exchange = `rbt.${process.pid}.kill`;
  const queue = `${exchange}.q`;
  await declare(rabbit.url, exchange, queue, 'order.#');
  const db = uniqueDbName('brokers_rabbit_kill');
  const o = {
    upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 100, lease_ms: 2000 },
    handlers: [{ name: 'bus', events: 'order.*', kind: 'rabbitmq', url: rabbit.url, exchange, timeout_ms: 600 }],
  };
  const direct = await new MongoClient(up.uri).connect();
  t.after(() => direct.close());
  const n = Math.max(300, Math.floor(N_EVENTS / 2));
  // Written straight into the outbox (faster than through the proxy, so
  // the kill lands mid-dispatch), without event headers.
  const events = makeEvents(n, Math.min(N_KEYS, 20), 'kill');
  for (const e of events) e.headers = undefined;
  await publish(direct, db, events, ['bus']);
  const first = await startDispatchProxy(o);
  t.after(() => first.kill());
  await waitFor(async () => (await queueDepth(rabbit.url, queue)) >= n / 4, 60000, 'a quarter of the events in the queue');
  await first.kill();
  const atKill = await queueDepth(rabbit.url, queue);
  assert.ok(atKill < n, `killed mid-run (${atKill} of ${n} in the queue)`);
  const second = await startDispatchProxy(o);
  t.after(() => second.kill());
  await waitFor(async () => (await undelivered(direct, db)) === 0, 120000, 'the second proxy to deliver the rest');
  assert.equal(await direct.db(db).collection('relaybus_deliveries').countDocuments({ status: 'dead' }), 0, 'no dead letter');
  t.diagnostic(`killed with ${atKill} of ${n} in the queue`);
  // RabbitMQ keeps a resend: duplicates are counted and reported, not refused.
  check(t, events, await readQueue(rabbit.url, queue, await queueDepth(rabbit.url, queue)), 'order.placed.v1');
  assert.equal((await second.stop()).code, 0);
});

test("an unroutable message and a missing exchange: dead letters with the broker's error after max_attempts", { skip, timeout: 120000 }, async (t) => {
  const up = await startUpstream();
  t.after(() => up.stop());
  const rabbit = await startRabbit();
  t.after(() => rabbit.close());
  const exchange = `rbt.${process.pid}.dead`;
  await declare(rabbit.url, exchange, `${exchange}.q`, 'order.#');
  const db = uniqueDbName('brokers_rabbit_dead');
  const p = await startDispatchProxy({
    upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 100 },
    handlers: [
      { name: 'unroutable', events: 'order.*', kind: 'rabbitmq', url: rabbit.url, exchange, routing_key: 'nowhere.{type}', retry_schedule: '100ms', max_attempts: 3 },
      { name: 'noexchange', events: 'order.*', kind: 'rabbitmq', url: rabbit.url, exchange: `${exchange}.missing`, retry_schedule: '100ms', max_attempts: 3 },
    ],
  });
  t.after(() => p.kill());
  const client = await new MongoClient(clientUri({ host: '127.0.0.1', port: p.port })).connect();
  t.after(() => client.close());
  const direct = await new MongoClient(up.uri).connect();
  t.after(() => direct.close());
  await publishThroughProxy(client, db, [{ id: 'u-1', type: 'order.placed.v1', key: 'k', payload: {} }]);
  const deliveries = direct.db(db).collection('relaybus_deliveries');
  await waitFor(async () => (await deliveries.countDocuments({ status: 'dead' })) === 2, 60000, 'two dead letters');
  const u = await deliveries.findOne({ handler: 'unroutable' });
  assert.equal(u.attempts, 3);
  assert.equal(u.lastError, `rabbitmq: unroutable: exchange '${exchange}' routed 'nowhere.order.placed.v1' nowhere (312 NO_ROUTE)`);
  const x = await deliveries.findOne({ handler: 'noexchange' });
  assert.equal(x.attempts, 3);
  assert.equal(x.lastError, `rabbitmq: channel closed by the broker: 404 NOT_FOUND - no exchange '${exchange}.missing' in vhost '/'`);
  // Every attempt on record, each refused by the broker.
  const attempts = direct.db(db).collection('relaybus_attempts');
  for (const d of [u, x]) {
    const recs = await attempts.find({ deliveryId: d._id }).sort({ endedAt: 1 }).toArray();
    assert.deepEqual(recs.map((r) => [r.attempt, r.outcome, r.error]), [1, 2, 3].map((n) => [n, 'refused', d.lastError]));
  }
  assert.equal((await p.stop()).code, 0);
});

test('bad rabbitmq handler configuration: clear errors from --check-config and at start-up', { timeout: 60000 }, async () => {
  const dir = tmpDir('relaybus-rabbit-conf-');
  const cases = [
    [{ kind: 'rabbitmq', url: 'amqp://127.0.0.1:5672/' }, '[handler h] kind = rabbitmq needs exchange (the name of an existing exchange)'],
    [{ kind: 'rabbitmq', exchange: 'x' }, '[handler h] kind = rabbitmq needs url = amqp://host:5672/vhost (the user and password before the host, as user:password@)'],
    [{ kind: 'rabbitmq', url: 'nats://127.0.0.1:5672', exchange: 'x' }, "[handler h] kind = rabbitmq: url: 'nats://127.0.0.1:5672' is not amqp:// or amqps://"],
    [{ kind: 'rabbitmq', url: 'amqp://127.0.0.1:5672', exchange: 'x', routing_key: 'a.{id}' }, "[handler h] routing_key: 'a.{id}': only {type} and {key} may be replaced"],
  ];
  for (const [keys, want] of cases) {
    const lines = ['[proxy]', 'listen = 127.0.0.1:0', 'upstream = mongodb://127.0.0.1:1/?replicaSet=rs0', '', '[handler h]', 'events = order.*'];
    for (const [k, v] of Object.entries(keys)) lines.push(`${k} = ${v}`);
    const ini = path.join(dir, 'bad.ini');
    fs.writeFileSync(ini, lines.join('\n') + '\n');
    const chk = spawnSync(proxyBin(), ['-c', ini, '--check-config'], { encoding: 'utf8', timeout: 10000 });
    assert.notEqual(chk.status, 0, `--check-config refuses ${JSON.stringify(keys)}`);
    assert.ok(chk.stderr.includes(want), `--check-config names the problem: ${want}\n${chk.stderr}`);
    const run = spawnSync(proxyBin(), ['-c', ini], { encoding: 'utf8', timeout: 10000 });
    assert.notEqual(run.status, 0);
    assert.ok(run.stderr.includes(want), `the start-up error names the problem: ${want}\n${run.stderr}`);
  }
  fs.rmSync(dir, { recursive: true, force: true });
});
