'use strict';
// kind = kafka end to end: events published through the proxy reach a topic
// of a Kafka cluster (librdkafka's mock cluster run by tests/tools/kafka-mock,
// or KAFKA_BROKERS); an independent consumer (kafkajs, not the librdkafka
// the proxy uses) reads the topic and sees every event at least once, each
// key in one partition and in sequence order, with the documented key,
// headers and body; duplicates are counted and reported.
// Faults: every broker down for 10 s mid-run and up again (nothing lost,
// order per key holds, the backlog drains), the proxy SIGKILLed mid-run and
// started again (nothing lost), a topic that does not exist (a dead letter
// with librdkafka's error after max_attempts), bad configuration (clear
// errors from --check-config and at start-up).
//
// Scale: RELAYBUS_BROKER_EVENTS (default 1000) events on
// RELAYBUS_BROKER_KEYS (default 20) keys; the full run is
// RELAYBUS_BROKER_EVENTS=5000 RELAYBUS_BROKER_KEYS=50.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const { MongoClient } = require('mongodb');
const { startUpstream, uniqueDbName, sleep, tmpDir, proxyBin, clientUri, freePort } = require('../lib/proxy');
const { startKafka, kafkaSkipReason, topicCount, readTopic } = require('../lib/kafka');
const { startDispatchProxy, publish, waitFor } = require('../dispatch/helpers');

const N_EVENTS = Number(process.env.RELAYBUS_BROKER_EVENTS || 1000);
const N_KEYS = Number(process.env.RELAYBUS_BROKER_KEYS || 20);
const OUTAGE_MS = 10000;
// Full jitter draws each wait in [0, delay]: thirty attempts, most of them
// up to 4 s apart, outlast the outage with a wide margin for every delivery.
const OUTAGE_SCHEDULE = ['200ms', '500ms', '1s', '2s', ...Array(26).fill('4s')].join(', ');
const skip = kafkaSkipReason() || false;
const PARTITIONS = 4;

function makeEvents(n, keys, tag) {
  const events = [];
  for (let i = 0; i < n; i++) {
    const e = { id: `${tag}-${i}`, type: 'order.placed.v1', payload: { i, note: 'é✓' }, headers: { tenant: 'acme', 'x-trace': `t-${i}`, 'relaybus-type': 'forged' } };
    // Every 10th event has no key.
    if (i % 10 !== 9) e.key = `key-${i % keys}`;
    events.push(e);
  }
  return events;
}

// Publishes through the proxy: each event annotates an insert inside a
// transaction, so the publishing path writes the outbox.
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

// What the consumer saw: every event at least once, each key in one
// partition and in sequence order there, the message key, the headers and
// the body as docs/handlers.md describes them.
function check(t, events, msgs) {
  const byId = new Map(events.map((e) => [e.id, e]));
  const seen = new Map();
  const lastSeq = new Map();
  const partitionOf = new Map();
  let duplicates = 0;
  msgs = [...msgs].sort((a, b) => a.partition - b.partition || a.offset - b.offset);
  for (const m of msgs) {
    const e = byId.get(m.body.id);
    assert.ok(e, `an event the test published: ${m.body.id}`);
    assert.equal(m.key, e.key !== undefined ? e.key : e.id, 'the message key is the event key, its id without one');
    if (partitionOf.has(m.key)) assert.equal(m.partition, partitionOf.get(m.key), `${m.key}: one partition`);
    partitionOf.set(m.key, m.partition);
    assert.match(m.headers['relaybus-delivery-id'], /^[0-9a-f]{24}$/);
    assert.equal(m.headers['relaybus-event-id'], e.id);
    assert.equal(m.headers['relaybus-type'], e.type, 'an event header cannot forge relaybus-type');
    if (e.headers) {
      assert.equal(m.headers.tenant, 'acme', "the event's own headers");
      assert.equal(m.headers['x-trace'], e.headers['x-trace']);
    }
    assert.equal(m.body.type, e.type);
    assert.equal(m.body.id, e.id);
    assert.deepEqual(m.body.payload, e.payload);
    assert.deepEqual(m.body.headers, e.headers);
    assert.match(m.body.createdAt, /^\d{4}-\d\d-\d\dT/);
    if (e.key !== undefined) {
      assert.equal(m.body.key, e.key);
      assert.equal(m.headers['relaybus-key'], e.key);
      assert.equal(m.headers['relaybus-sequence'], String(m.body.sequence));
      const last = lastSeq.get(e.key) || 0;
      assert.ok(m.body.sequence >= last, `${e.key}: sequence ${m.body.sequence} after ${last}`);
      if (m.body.sequence === last) duplicates++;
      else assert.equal(m.body.sequence, last + 1, `${e.key}: no sequence skipped before ${m.body.sequence}`);
      lastSeq.set(e.key, m.body.sequence);
    } else {
      assert.equal(m.body.key, undefined);
      assert.equal(m.headers['relaybus-sequence'], undefined);
      if (seen.has(e.id)) duplicates++;
    }
    seen.set(e.id, (seen.get(e.id) || 0) + 1);
  }
  for (const e of events) assert.ok(seen.has(e.id), `${e.id} reached the topic`);
  const keyed = new Map();
  for (const e of events) if (e.key !== undefined) keyed.set(e.key, (keyed.get(e.key) || 0) + 1);
  for (const [k, n] of keyed) assert.equal(lastSeq.get(k), n, `${k}: all ${n} events, in order`);
  t.diagnostic(`${events.length} events, ${msgs.length} messages in the topic over ${new Set(msgs.map((m) => m.partition)).size} partitions, ${duplicates} duplicate(s)`);
  return duplicates;
}

async function readyz(adminPort) {
  const r = await fetch(`http://127.0.0.1:${adminPort}/readyz`);
  return r.json();
}

async function undelivered(client, db) {
  return client.db(db).collection('relaybus_deliveries').countDocuments({ status: { $nin: ['dead', 'completed'] } });
}

test(`${N_EVENTS} events on ${N_KEYS} keys through the proxy reach the topic, each key in order in its partition`, { skip, timeout: 300000 }, async (t) => {
  const up = await startUpstream();
  t.after(() => up.stop());
  const kafka = await startKafka({ brokers: 3 });
  t.after(() => kafka.close());
  const topic = `rbt${process.pid}.e2e.order.placed.v1`;
  await kafka.createTopic(topic, PARTITIONS);
  const db = uniqueDbName('brokers_kafka');
  const adminPort = await freePort();
  const p = await startDispatchProxy({
    upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 100 }, adminListen: `127.0.0.1:${adminPort}`,
    handlers: [{ name: 'bus', events: 'order.*', kind: 'kafka', brokers: kafka.brokers, topic: `rbt${process.pid}.e2e.{type}`, concurrency: 16 }],
  });
  t.after(() => p.kill());
  const client = await new MongoClient(clientUri({ host: '127.0.0.1', port: p.port })).connect();
  t.after(() => client.close());
  const direct = await new MongoClient(up.uri).connect();
  t.after(() => direct.close());

  const events = makeEvents(N_EVENTS, N_KEYS, 'e2e');
  const started = Date.now();
  await publishThroughProxy(client, db, events);
  await waitFor(async () => (await undelivered(direct, db)) === 0, 240000, 'every delivery to complete');
  t.diagnostic(`published and delivered in ${Date.now() - started} ms`);
  assert.equal(await direct.db(db).collection('relaybus_deliveries').countDocuments({ status: 'dead' }), 0, 'no dead letter');
  const msgs = await readTopic(kafka.brokers, topic);
  check(t, events, msgs);
  assert.ok(new Set(msgs.map((m) => m.partition)).size > 1, 'the keys spread over the partitions');
  assert.match(p.log(), /handler bus: Kafka producer for .* \(idempotent, acks=all/);
  await waitFor(async () => ((await readyz(adminPort)).brokers || [])[0]?.state === 'connected', 10000, 'readyz: connected');
  assert.deepEqual((await readyz(adminPort)).brokers, [{ name: 'bus', kind: 'kafka', state: 'connected' }]);
  assert.equal((await p.stop()).code, 0);
});

test('every Kafka broker down for 10 s mid-run: nothing lost, order per key holds, the backlog drains', { skip, timeout: 300000 }, async (t) => {
  if (process.env.KAFKA_BROKERS) return t.skip('KAFKA_BROKERS names an external cluster, which the test cannot stop');
  const up = await startUpstream();
  t.after(() => up.stop());
  const kafka = await startKafka({ brokers: 1 });
  t.after(() => kafka.close());
  const topic = `rbt${process.pid}.out.order.placed.v1`;
  await kafka.createTopic(topic, PARTITIONS);
  const db = uniqueDbName('brokers_kafka_out');
  const adminPort = await freePort();
  const p = await startDispatchProxy({
    upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 100 }, adminListen: `127.0.0.1:${adminPort}`,
    handlers: [{ name: 'bus', events: 'order.*', kind: 'kafka', brokers: kafka.brokers, topic: `rbt${process.pid}.out.{type}`, timeout_ms: 2000,
      retry_schedule: OUTAGE_SCHEDULE }],
  });
  t.after(() => p.kill());
  const client = await new MongoClient(clientUri({ host: '127.0.0.1', port: p.port })).connect();
  t.after(() => client.close());
  const direct = await new MongoClient(up.uri).connect();
  t.after(() => direct.close());

  const n = Math.max(200, Math.floor(N_EVENTS / 2));
  const events = makeEvents(n, Math.min(N_KEYS, 20), 'out');
  const half = Math.floor(n / 2);
  await waitFor(async () => ((await readyz(adminPort)).brokers || [])[0]?.state === 'connected', 10000, 'readyz: connected');
  await publishThroughProxy(client, db, events.slice(0, half));
  await kafka.down();
  const downAt = Date.now();
  await publishThroughProxy(client, db, events.slice(half));
  await waitFor(() => /no Kafka broker reachable/.test(p.log()), 15000, 'the proxy to see the brokers go');
  {
    const r = await readyz(adminPort);
    assert.equal(r.ready, true, 'a broker outage does not make the proxy unready');
    assert.deepEqual(r.brokers.map((b) => [b.name, b.kind, b.state]), [['bus', 'kafka', 'disconnected']]);
    assert.equal(typeof r.brokers[0].detail, 'string');
  }
  await sleep(Math.max(0, OUTAGE_MS - (Date.now() - downAt)));
  const backlog = await undelivered(direct, db);
  assert.ok(backlog > 0, `deliveries waited during the outage (${backlog})`);
  // Sends during the outage end with a report (message.timeout.ms =
  // timeout_ms) and wait for a retry, rather than hanging in librdkafka.
  assert.match(p.log(), /attempt \d+ failed \(kafka: produce to 'rbt\d+\.out\.order\.placed\.v1': Local: Message timed out/);
  await kafka.up();
  const upAt = Date.now();
  await waitFor(async () => (await undelivered(direct, db)) === 0, 120000, 'the backlog to drain');
  t.diagnostic(`outage ${upAt - downAt} ms, backlog of ${backlog} drained in ${Date.now() - upAt} ms`);
  assert.equal(await direct.db(db).collection('relaybus_deliveries').countDocuments({ status: 'dead' }), 0, 'no dead letter');
  check(t, events, await readTopic(kafka.brokers, topic));
  await waitFor(async () => ((await readyz(adminPort)).brokers || [])[0]?.state === 'connected', 10000, 'readyz: connected again');
  assert.equal((await p.stop()).code, 0);
});

test('a proxy SIGKILLed mid-run and started again loses nothing', { skip, timeout: 300000 }, async (t) => {
  const up = await startUpstream();
  t.after(() => up.stop());
  const kafka = await startKafka({ brokers: 1 });
  t.after(() => kafka.close());
  const topic = `rbt${process.pid}.kill.order.placed.v1`;
  await kafka.createTopic(topic, PARTITIONS);
  const db = uniqueDbName('brokers_kafka_kill');
  const o = {
    upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 100, lease_ms: 2000 },
    handlers: [{ name: 'bus', events: 'order.*', kind: 'kafka', brokers: kafka.brokers, topic: `rbt${process.pid}.kill.{type}`, timeout_ms: 2000, concurrency: 4 }],
  };
  const direct = await new MongoClient(up.uri).connect();
  t.after(() => direct.close());
  const n = Math.max(300, Math.floor(N_EVENTS / 2));
  // Written straight into the outbox (faster than through the proxy, so
  // the kill lands mid-dispatch), without event headers.
  const events = makeEvents(n, Math.min(N_KEYS, 20), 'kill');
  for (const e of events) delete e.headers;
  await publish(direct, db, events, ['bus']);
  const first = await startDispatchProxy(o);
  t.after(() => first.kill());
  await waitFor(async () => (await topicCount(kafka.brokers, topic)) >= n / 4, 60000, 'a quarter of the events in the topic');
  await first.kill();
  const atKill = await topicCount(kafka.brokers, topic);
  assert.ok(atKill < n, `killed mid-run (${atKill} of ${n} in the topic)`);
  const second = await startDispatchProxy(o);
  t.after(() => second.kill());
  await waitFor(async () => (await undelivered(direct, db)) === 0, 120000, 'the second proxy to deliver the rest');
  assert.equal(await direct.db(db).collection('relaybus_deliveries').countDocuments({ status: 'dead' }), 0, 'no dead letter');
  t.diagnostic(`killed with ${atKill} of ${n} in the topic`);
  check(t, events, await readTopic(kafka.brokers, topic));
  assert.equal((await second.stop()).code, 0);
});

test("a topic that does not exist: a dead letter with librdkafka's error after max_attempts", { skip, timeout: 120000 }, async (t) => {
  const up = await startUpstream();
  t.after(() => up.stop());
  const kafka = await startKafka({ brokers: 1 });
  t.after(() => kafka.close());
  const db = uniqueDbName('brokers_kafka_dead');
  const topic = `rbt${process.pid}.notopic.{type}`;
  await kafka.refuseTopic(`rbt${process.pid}.notopic.order.placed.v1`);
  const p = await startDispatchProxy({
    upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 100 },
    handlers: [{ name: 'lost', events: 'order.*', kind: 'kafka', brokers: kafka.brokers, topic, timeout_ms: 2000,
      'kafka.allow.auto.create.topics': 'false', retry_schedule: '100ms', max_attempts: 3 }],
  });
  t.after(() => p.kill());
  const client = await new MongoClient(clientUri({ host: '127.0.0.1', port: p.port })).connect();
  t.after(() => client.close());
  const direct = await new MongoClient(up.uri).connect();
  t.after(() => direct.close());
  await publishThroughProxy(client, db, [{ id: 'nt-1', type: 'order.placed.v1', key: 'k', payload: {} }, { id: 'nt-2', type: 'order.placed.v1', payload: {} }]);
  const deliveries = direct.db(db).collection('relaybus_deliveries');
  await waitFor(async () => (await deliveries.countDocuments({ status: 'dead' })) === 2, 60000, 'two dead letters');
  for (const d of await deliveries.find({ status: 'dead' }).toArray()) {
    assert.equal(d.attempts, 3);
    assert.match(d.lastError, new RegExp(`^kafka: produce to 'rbt${process.pid}\\.notopic\\.order\\.placed\\.v1': (Local: Unknown topic \\(_UNKNOWN_TOPIC\\)|Broker: Unknown topic or partition \\(UNKNOWN_TOPIC_OR_PART\\)): the topic does not exist on the brokers$`));
    // Every attempt on record: the topic refused, or librdkafka's timeout waiting for it.
    const recs = await direct.db(db).collection('relaybus_attempts').find({ deliveryId: d._id }).sort({ endedAt: 1 }).toArray();
    assert.deepEqual(recs.map((r) => r.attempt), [1, 2, 3]);
    for (const r of recs) assert.ok(['refused', 'timed_out'].includes(r.outcome), `${r.outcome}: ${r.error}`);
    assert.equal(recs[2].error, d.lastError);
  }
  assert.equal((await p.stop()).code, 0);
});

test('bad kafka handler configuration: clear errors from --check-config and at start-up', { timeout: 60000 }, async () => {
  const dir = tmpDir('relaybus-kafka-conf-');
  const cases = [
    [{ kind: 'kafka', brokers: '127.0.0.1:9092' }, '[handler h] kind = kafka needs topic (a template, e.g. {type})'],
    [{ kind: 'kafka', topic: '{type}' }, '[handler h] kind = kafka needs brokers = host:port (comma-separated for several)'],
    [{ kind: 'kafka', brokers: '127.0.0.1:9092', topic: 'a.{id}' }, "[handler h] topic: 'a.{id}': only {type}, {type_prefix} and {key} may be replaced"],
    [{ kind: 'kafka', brokers: '127.0.0.1:9092', topic: '{type}', 'kafka.no.such.property': '1' },
      '[handler h] kafka.no.such.property: librdkafka: No such configuration property: "no.such.property"'],
    [{ kind: 'kafka', brokers: '127.0.0.1:9092', topic: '{type}', 'kafka.message.max.bytes': 'lots' },
      '[handler h] kafka.message.max.bytes: librdkafka: Invalid value for configuration property "message.max.bytes"'],
    [{ kind: 'webhook', url: 'http://127.0.0.1:1/', 'kafka.linger.ms': '5' }, '[handler h] kafka.linger.ms: kafka.* properties are for kind = kafka'],
    [{ kind: 'mqtt', url: 'mqtt://127.0.0.1' }, "[handler h] kind: 'mqtt' is not webhook, pull, nats, rabbitmq or kafka"],
  ];
  for (const [keys, want] of cases) {
    const lines = ['[proxy]', 'listen = 127.0.0.1:0', 'upstream = mongodb://127.0.0.1:1/?replicaSet=rs0', '', '[handler h]', 'events = order.*'];
    for (const [k, v] of Object.entries(keys)) lines.push(`${k} = ${v}`);
    const ini = path.join(dir, 'bad.ini');
    fs.writeFileSync(ini, lines.join('\n') + '\n');
    const check = spawnSync(proxyBin(), ['-c', ini, '--check-config'], { encoding: 'utf8', timeout: 10000 });
    assert.notEqual(check.status, 0, `--check-config refuses ${JSON.stringify(keys)}`);
    assert.ok(check.stderr.includes(want), `--check-config names the problem: ${want}\n${check.stderr}`);
    const run = spawnSync(proxyBin(), ['-c', ini], { encoding: 'utf8', timeout: 10000 });
    assert.notEqual(run.status, 0, `the proxy does not start with ${JSON.stringify(keys)}`);
    assert.ok(run.stderr.includes(want), `the start-up error names the problem: ${want}\n${run.stderr}`);
  }
  fs.rmSync(dir, { recursive: true, force: true });
});

test('an unreachable Kafka cluster at start: the proxy starts, says so, and retries', { skip, timeout: 60000 }, async (t) => {
  const up = await startUpstream();
  t.after(() => up.stop());
  const db = uniqueDbName('brokers_kafka_unreach');
  const port = await freePort(); // nothing listens on it
  const p = await startDispatchProxy({
    upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 100 },
    handlers: [{ name: 'away', events: 'order.*', kind: 'kafka', brokers: `127.0.0.1:${port}`, topic: '{type}' }],
  });
  t.after(() => p.kill());
  await waitFor(() => /handler away: no Kafka broker reachable at 127\.0\.0\.1:\d+ \(1\/1 brokers are down\); sends are retried meanwhile/.test(p.log()), 15000, 'the warning');
  assert.equal((await p.stop()).code, 0);
});
