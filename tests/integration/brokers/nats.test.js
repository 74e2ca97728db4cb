'use strict';
// kind = nats end to end: events published through the proxy reach a
// JetStream stream of Debian's nats-server; an independent consumer (the
// @nats-io JavaScript client, not the libnats the proxy uses) reads the
// stream and sees every event at least once, each key in sequence order,
// with the documented headers and body; duplicates are counted and reported.
// Faults: nats-server stopped for 10 s mid-run and started again (nothing
// lost, order per key holds, the backlog drains), no stream for the subject
// (a dead letter with the server's error after max_attempts), bad
// configuration (clear errors from --check-config and at start-up).
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
const { connect } = require('@nats-io/transport-node');
const { jetstreamManager, jetstream } = require('@nats-io/jetstream');
const { startUpstream, uniqueDbName, sleep, tmpDir, proxyBin, clientUri, freePort } = require('../lib/proxy');
const { startNats, natsSkipReason } = require('../lib/nats');
const { startDispatchProxy, publish, waitFor } = require('../dispatch/helpers');

const N_EVENTS = Number(process.env.RELAYBUS_BROKER_EVENTS || 1000);
const N_KEYS = Number(process.env.RELAYBUS_BROKER_KEYS || 20);
const OUTAGE_MS = 10000;
// Full jitter draws each wait in [0, delay]: thirty attempts, most of them
// up to 4 s apart (about a minute on average), outlast the outage, a
// broker's stop and start included, with a wide margin for every delivery.
const OUTAGE_SCHEDULE = ['200ms', '500ms', '1s', '2s', ...Array(26).fill('4s')].join(', ');
const skip = natsSkipReason() || false;

function makeEvents(n, keys, tag) {
  const events = [];
  for (let i = 0; i < n; i++) {
    const e = { id: `${tag}-${i}`, type: 'order.placed.v1', payload: { i, note: 'é✓' }, headers: { tenant: 'acme', 'x-trace': `t-${i}`, 'relaybus-type': 'forged', 'Nats-Msg-Id': 'forged' } };
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

async function addStream(url, name, subjects) {
  const nc = await connect({ servers: url });
  try {
    const jsm = await jetstreamManager(nc);
    await jsm.streams.add({ name, subjects, duplicate_window: 120 * 1e9 });
  } finally {
    await nc.close();
  }
}

// Reads the whole stream in order with an ordered consumer.
async function readStream(url, name) {
  const nc = await connect({ servers: url });
  try {
    const jsm = await jetstreamManager(nc);
    const total = (await jsm.streams.info(name)).state.messages;
    const js = jetstream(nc);
    const c = await js.consumers.get(name);
    const out = [];
    while (out.length < total) {
      const batch = await c.fetch({ max_messages: Math.min(500, total - out.length), expires: 5000 });
      let got = 0;
      for await (const m of batch) {
        const h = {};
        for (const k of m.headers ? m.headers.keys() : []) h[k] = m.headers.get(k);
        out.push({ subject: m.subject, seq: m.seq, headers: h, body: JSON.parse(m.string()) });
        got++;
      }
      if (got === 0) throw new Error(`the stream ${name} gave ${out.length} of ${total} messages`);
    }
    return out;
  } finally {
    await nc.close();
  }
}

// What the consumer saw: every event at least once, each key in sequence
// order, the headers and the body as docs/handlers.md describes them.
function check(t, events, msgs, subject) {
  const byId = new Map(events.map((e) => [e.id, e]));
  const seen = new Map();
  const lastSeq = new Map();
  let duplicates = 0;
  for (const m of msgs) {
    const e = byId.get(m.body.id);
    assert.ok(e, `an event the test published: ${m.body.id}`);
    assert.equal(m.subject, subject);
    assert.match(m.headers['Nats-Msg-Id'], /^[0-9a-f]{24}$/, 'Nats-Msg-Id is the delivery id');
    assert.equal(m.headers['relaybus-delivery-id'], m.headers['Nats-Msg-Id']);
    assert.equal(m.headers['relaybus-event-id'], e.id);
    assert.equal(m.headers['relaybus-type'], e.type, 'an event header cannot forge relaybus-type');
    if (e.headers) {
      assert.equal(m.headers.tenant, 'acme', "the event's own headers");
      assert.equal(m.headers['x-trace'], e.headers['x-trace']);
    }
    assert.equal(m.body.type, e.type);
    assert.deepEqual(m.body.payload, e.payload);
    assert.deepEqual(m.body.headers, e.headers);
    assert.match(m.body.createdAt, /^\d{4}-\d\d-\d\dT/);
    if (e.key !== undefined) {
      assert.equal(m.body.key, e.key);
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
  for (const e of events) assert.ok(seen.has(e.id), `${e.id} reached the stream`);
  const keyed = new Map();
  for (const e of events) if (e.key !== undefined) keyed.set(e.key, (keyed.get(e.key) || 0) + 1);
  for (const [k, n] of keyed) assert.equal(lastSeq.get(k), n, `${k}: all ${n} events, in order`);
  t.diagnostic(`${events.length} events, ${msgs.length} messages in the stream, ${duplicates} duplicate(s)`);
  return duplicates;
}

async function streamCount(url, name) {
  const nc = await connect({ servers: url });
  try {
    return (await (await jetstreamManager(nc)).streams.info(name)).state.messages;
  } finally {
    await nc.close();
  }
}

async function readyz(adminPort) {
  const r = await fetch(`http://127.0.0.1:${adminPort}/readyz`);
  return r.json();
}

async function undelivered(client, db) {
  return client.db(db).collection('relaybus_deliveries').countDocuments({ status: { $nin: ['dead', 'completed'] } });
}

test(`${N_EVENTS} events on ${N_KEYS} keys through the proxy reach the stream, each key in order`, { skip, timeout: 300000 }, async (t) => {
  const up = await startUpstream();
  t.after(() => up.stop());
  const nats = await startNats();
  t.after(() => nats.close());
  const stream = `RBT_E2E_${process.pid}`;
  const prefix = `rbt${process.pid}.e2e`;
  await addStream(nats.url, stream, [`${prefix}.>`]);
  const db = uniqueDbName('brokers_nats');
  const p = await startDispatchProxy({
    upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 100 },
    handlers: [{ name: 'bus', events: 'order.*', kind: 'nats', url: nats.url, subject: `${prefix}.{type}`, concurrency: 16 }],
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
  check(t, events, await readStream(nats.url, stream), `${prefix}.order.placed.v1`);
  assert.match(p.log(), /handler bus: connected to NATS/);
  // Every attempt on record, each with the PubAck it waited for.
  await waitFor(async () => (await direct.db(db).collection('relaybus_attempts').countDocuments({ handler: 'bus', outcome: 'succeeded' })) === events.length,
    10000, 'a succeeded attempt per delivery');
  assert.equal((await p.stop()).code, 0);
});

test('nats-server stopped for 10 s mid-run: nothing lost, order per key holds, the backlog drains', { skip, timeout: 300000 }, async (t) => {
  if (process.env.NATS_URL) return t.skip('NATS_URL names an external server, which the test cannot stop');
  const up = await startUpstream();
  t.after(() => up.stop());
  const nats = await startNats();
  t.after(() => nats.close());
  const stream = `RBT_OUT_${process.pid}`;
  const prefix = `rbt${process.pid}.out`;
  await addStream(nats.url, stream, [`${prefix}.>`]);
  const db = uniqueDbName('brokers_nats_out');
  const adminPort = await freePort();
  const p = await startDispatchProxy({
    upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 100 }, adminListen: `127.0.0.1:${adminPort}`,
    handlers: [{ name: 'bus', events: 'order.*', kind: 'nats', url: nats.url, subject: `${prefix}.{type}`, timeout_ms: 2000,
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
  await nats.stop();
  const downAt = Date.now();
  await publishThroughProxy(client, db, events.slice(half));
  await waitFor(() => /disconnected from NATS/.test(p.log()), 10000, 'the proxy to see the connection go');
  {
    const r = await readyz(adminPort);
    assert.equal(r.ready, true, 'a broker outage does not make the proxy unready');
    assert.deepEqual(r.brokers.map((b) => [b.name, b.kind, b.state]), [['bus', 'nats', 'disconnected']]);
    assert.equal(typeof r.brokers[0].detail, 'string');
    const st = await (await fetch(`http://127.0.0.1:${adminPort}/api/stats`)).json();
    assert.equal(st.handlers.find((h) => h.name === 'bus').connection.state, 'disconnected', '/api/stats shows it too');
  }
  await sleep(Math.max(0, OUTAGE_MS - (Date.now() - downAt)));
  const backlog = await undelivered(direct, db);
  assert.ok(backlog > 0, `deliveries waited during the outage (${backlog})`);
  await nats.start();
  const upAt = Date.now();
  await waitFor(async () => (await undelivered(direct, db)) === 0, 120000, 'the backlog to drain');
  t.diagnostic(`outage ${upAt - downAt} ms, backlog of ${backlog} drained in ${Date.now() - upAt} ms`);
  assert.equal(await direct.db(db).collection('relaybus_deliveries').countDocuments({ status: 'dead' }), 0, 'no dead letter');
  check(t, events, await readStream(nats.url, stream), `${prefix}.order.placed.v1`);
  assert.match(p.log(), /reconnected to NATS/);
  assert.deepEqual((await readyz(adminPort)).brokers, [{ name: 'bus', kind: 'nats', state: 'connected' }]);
  assert.match(p.log(), /nats: not connected to/, 'sends during the outage were retried');
  assert.equal((await p.stop()).code, 0);
});

test('a proxy SIGKILLed mid-run and started again loses nothing; the duplicate window drops its resends', { skip, timeout: 300000 }, async (t) => {
  const up = await startUpstream();
  t.after(() => up.stop());
  const nats = await startNats();
  t.after(() => nats.close());
  const stream = `RBT_KILL_${process.pid}`;
  const prefix = `rbt${process.pid}.kill`;
  await addStream(nats.url, stream, [`${prefix}.>`]);
  const db = uniqueDbName('brokers_nats_kill');
  const o = {
    upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 100, lease_ms: 2000 },
    handlers: [{ name: 'bus', events: 'order.*', kind: 'nats', url: nats.url, subject: `${prefix}.{type}`, timeout_ms: 600 }],
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
  await waitFor(async () => (await streamCount(nats.url, stream)) >= n / 4, 60000, 'a quarter of the events in the stream');
  await first.kill();
  const atKill = await streamCount(nats.url, stream);
  assert.ok(atKill < n, `killed mid-run (${atKill} of ${n} in the stream)`);
  const second = await startDispatchProxy(o);
  t.after(() => second.kill());
  await waitFor(async () => (await undelivered(direct, db)) === 0, 120000, 'the second proxy to deliver the rest');
  assert.equal(await direct.db(db).collection('relaybus_deliveries').countDocuments({ status: 'dead' }), 0, 'no dead letter');
  t.diagnostic(`killed with ${atKill} of ${n} in the stream`);
  const dups = check(t, events, await readStream(nats.url, stream), `${prefix}.order.placed.v1`);
  assert.equal(dups, 0, 'a resend of a delivery the killed proxy had published carries its Nats-Msg-Id, which the stream drops');
  assert.equal((await second.stop()).code, 0);
});

test("no stream captures the subject: a dead letter with the server's error after max_attempts", { skip, timeout: 120000 }, async (t) => {
  const up = await startUpstream();
  t.after(() => up.stop());
  const nats = await startNats();
  t.after(() => nats.close());
  const db = uniqueDbName('brokers_nats_dead');
  const subject = `rbt${process.pid}.nostream.{type}`;
  const p = await startDispatchProxy({
    upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 100 },
    handlers: [{ name: 'lost', events: 'order.*', kind: 'nats', url: nats.url, subject, retry_schedule: '100ms', max_attempts: 3 }],
  });
  t.after(() => p.kill());
  const client = await new MongoClient(clientUri({ host: '127.0.0.1', port: p.port })).connect();
  t.after(() => client.close());
  const direct = await new MongoClient(up.uri).connect();
  t.after(() => direct.close());
  await publishThroughProxy(client, db, [{ id: 'ns-1', type: 'order.placed.v1', key: 'k', payload: {} }, { id: 'ns-2', type: 'order.placed.v1', payload: {} }]);
  const deliveries = direct.db(db).collection('relaybus_deliveries');
  await waitFor(async () => (await deliveries.countDocuments({ status: 'dead' })) === 2, 60000, 'two dead letters');
  for (const d of await deliveries.find({ status: 'dead' }).toArray()) {
    assert.equal(d.attempts, 3);
    assert.equal(d.lastError, `nats: publish to 'rbt${process.pid}.nostream.order.placed.v1': no stream captures the subject (No responders available for request)`);
    // Every attempt on record, each refused by the server, in order.
    const recs = await direct.db(db).collection('relaybus_attempts').find({ deliveryId: d._id }).sort({ endedAt: 1 }).toArray();
    assert.deepEqual(recs.map((r) => [r.attempt, r.outcome, r.handler, r.eventId]), [1, 2, 3].map((n) => [n, 'refused', 'lost', d.eventId]));
    for (const r of recs) assert.equal(r.error, d.lastError);
  }
  assert.equal((await p.stop()).code, 0);
});

test('bad nats handler configuration: clear errors from --check-config and at start-up', { timeout: 60000 }, async () => {
  const dir = tmpDir('relaybus-nats-conf-');
  const cases = [
    [{ kind: 'nats', url: 'nats://127.0.0.1:4222' }, "[handler h] kind = nats needs subject (a template, e.g. events.{type})"],
    [{ kind: 'nats', subject: 'a.{type}' }, '[handler h] kind = nats needs url = nats://host:port (comma-separated for several)'],
    [{ kind: 'nats', url: 'http://127.0.0.1:4222', subject: 'a.{type}' }, "[handler h] kind = nats: url: 'http://127.0.0.1:4222' is not nats://host:port or tls://host:port"],
    [{ kind: 'nats', url: 'nats://127.0.0.1:4222', subject: 'a.*' }, "[handler h] subject: 'a.*': a subject to publish to holds no white space, '*' or '>'"],
    [{ kind: 'nats', url: 'nats://127.0.0.1:4222', subject: 'a..{type}' }, "[handler h] subject: 'a..{type}' has an empty token"],
    [{ kind: 'nats', url: 'nats://127.0.0.1:4222', subject: 'a.{id}' }, "[handler h] subject: 'a.{id}': only {type} and {key} may be replaced"],
    [{ kind: 'mqtt', url: 'nats://127.0.0.1:4222' }, "[handler h] kind: 'mqtt' is not webhook, pull, nats, rabbitmq or kafka"],
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

test('an unreachable nats-server at start: the proxy starts, says so, and retries', { skip, timeout: 60000 }, async (t) => {
  const up = await startUpstream();
  t.after(() => up.stop());
  const db = uniqueDbName('brokers_nats_unreach');
  // A port nothing listens on.
  const nats = await startNats();
  const url = nats.url;
  await nats.close();
  const p = await startDispatchProxy({
    upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 100 },
    handlers: [{ name: 'away', events: 'order.*', kind: 'nats', url, subject: 'a.{type}' }],
  });
  t.after(() => p.kill());
  await waitFor(() => /handler away: cannot connect to NATS at nats:\/\/127\.0\.0\.1:\d+ yet/.test(p.log()), 10000, 'the warning');
  assert.equal((await p.stop()).code, 0);
});
