'use strict';
// Span export ([tracing] otlp_endpoint), end to end: an application
// publishes with the traceparent of its own span; the proxy exports a
// `publish` span, child of the application's span, and one `send` span per
// delivery attempt, child of the publish span, to an OTLP/HTTP collector
// (JSON encoding, POST /v1/traces); the webhook receiver's traceparent
// carries the same trace id and names the attempt's span as its parent.
// With the collector gone, the spans are dropped and counted and every
// delivery goes on as before.  With sample = always, a publish without a
// traceparent starts a trace of its own.  OpenTelemetry's environment
// (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES,
// OTEL_EXPORTER_OTLP_HEADERS) alone exports spans; bodies are gzip; a
// collector that answers 503 for 3 s loses no span (the batches are sent
// again with backoff).

const test = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const zlib = require('node:zlib');
const { MongoClient } = require('mongodb');
const H = require('../lib/proxy');
const { waitFor, newSecret } = require('./helpers');

const { startUpstream, startProxy, uniqueDbName, freePort, clientUri, registerFinalChecks } = H;
const cleanups = [];

const APP_TRACE = '4bf92f3577b34da6a3ce929d0e0e4736';
const APP_SPAN = '00f067aa0ba902b7';
const APP_TRACEPARENT = `00-${APP_TRACE}-${APP_SPAN}-01`;

// One HTTP server on loopback; `handle(req, body, res)` answers (a gzip
// body is given uncompressed).
async function startServer(handle) {
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      let body = Buffer.concat(chunks);
      if (req.headers['content-encoding'] === 'gzip') body = zlib.gunzipSync(body);
      handle(req, body.toString('utf8'), res);
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: (p) => `http://127.0.0.1:${server.address().port}${p}`,
    close: () => new Promise((resolve) => { server.closeAllConnections?.(); server.close(() => resolve()); }),
  };
}

// A fake OpenTelemetry collector: keeps every span of every POST to
// /v1/traces, with its resource's attributes.  `busyUntil` (a time in ms):
// before it, every POST is answered 503 and its spans are not kept.
async function startCollector(busyUntil = 0) {
  const spans = [];
  const posts = [];
  const refused = [];
  const s = await startServer((req, body, res) => {
    if (Date.now() < busyUntil) {
      refused.push(Date.now());
      res.writeHead(503).end('busy');
      return;
    }
    posts.push({ path: req.url, contentType: req.headers['content-type'], encoding: req.headers['content-encoding'],
      authorization: req.headers.authorization });
    const doc = JSON.parse(body);
    for (const rs of doc.resourceSpans) {
      const resource = attrs(rs.resource.attributes);
      for (const ss of rs.scopeSpans) for (const sp of ss.spans) spans.push({ ...sp, resource, attrs: attrs(sp.attributes) });
    }
    res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
  });
  return { ...s, spans, posts, refused };
}

// OTLP JSON attributes as a plain object (intValue is a string in OTLP JSON).
function attrs(list) {
  const o = {};
  for (const { key, value } of list || []) o[key] = 'intValue' in value ? Number(value.intValue) : value.stringValue;
  return o;
}

// A webhook receiver that answers 500 to the first attempt of events whose
// id starts with "retry-", 204 otherwise; keeps each request's headers.
async function startReceiver() {
  const requests = [];
  const s = await startServer((req, body, res) => {
    const id = JSON.parse(body).id;
    const first = !requests.some((r) => r.id === id);
    requests.push({ id, traceparent: req.headers.traceparent });
    res.writeHead(first && id.startsWith('retry-') ? 500 : 204).end();
  });
  return { ...s, requests };
}

// `endpoint` null: no [tracing] keys but sample, so that `env` (OTEL_*) decides.
async function startTracedProxy(up, db, receiver, endpoint, sample = 'never', env = {}) {
  const adminPort = await freePort();
  const tracing = endpoint === null ? [`sample = ${sample}`]
    : [`otlp_endpoint = ${endpoint}`, 'service_name = shop-relay', `sample = ${sample}`, 'resource_attributes = deployment.environment=test'];
  const p = await startProxy({
    upstream: up.uri,
    dispatch: true,
    env,
    extraIni: [
      '[outbox]', `database = ${db}`, '',
      '[admin]', `listen = 127.0.0.1:${adminPort}`, '',
      '[tracing]', ...tracing, '',
      '[handler hook]', 'events = order.*', 'kind = webhook', `url = ${receiver.url('/hook')}`,
      `secret = ${newSecret()}`, 'retry_schedule = 100ms', '',
    ].join('\n'),
    settings: {},
  });
  p.adminPort = adminPort;
  return p;
}

async function publishTraced(p, db, events, headers = { traceparent: APP_TRACEPARENT, tenant: 't1' }) {
  const client = await new MongoClient(clientUri(p)).connect();
  try {
    const session = client.startSession();
    try {
      await session.withTransaction(async () => {
        for (const e of events)
          await client.db(db).collection('orders').insertOne({ _id: e.id }, {
            session,
            comment: { relaybus: { type: 'order.placed.v1', id: e.id, payload: { id: e.id }, headers } },
          });
      });
    } finally {
      await session.endSession();
    }
  } finally {
    await client.close();
  }
}

async function metric(p, name) {
  const text = await (await fetch(`http://127.0.0.1:${p.adminPort}/metrics`)).text();
  const m = text.match(new RegExp(`^${name} (\\d+)`, 'm'));
  return m ? Number(m[1]) : NaN;
}

const parentOf = (traceparent) => traceparent.split('-')[2];

test('a publish span child of the application span, one send span per attempt child of it, the trace id carried to the receiver', { timeout: 45000 }, async () => {
  const up = await startUpstream();
  cleanups.push(up);
  const collector = await startCollector();
  const receiver = await startReceiver();
  cleanups.push(() => collector.close(), () => receiver.close());
  const db = uniqueDbName('dispatch_tracing');
  const p = await startTracedProxy(up, db, receiver, collector.url(''));

  await publishTraced(p, db, [{ id: 'ok-1' }, { id: 'retry-1' }]);
  await waitFor(async () => receiver.requests.length >= 3, 20000, 'ok-1 once, retry-1 twice');
  const sends = () => collector.spans.filter((s) => s.name === 'send hook');
  await waitFor(async () => sends().length >= 3 && collector.spans.length >= 5, 10000, 'two publish spans and three send spans');

  for (const post of collector.posts) {
    assert.equal(post.path, '/v1/traces');
    assert.match(post.contentType, /^application\/json/);
    assert.equal(post.encoding, 'gzip', 'OTLP/HTTP bodies are gzip-compressed');
  }
  const publishes = collector.spans.filter((s) => s.name === 'publish order.placed.v1');
  assert.equal(publishes.length, 2, 'one publish span per event');
  assert.equal(sends().length, 3, 'one send span per attempt');
  for (const s of collector.spans) {
    assert.equal(s.traceId, APP_TRACE, 'every span is in the application trace');
    assert.match(s.spanId, /^[0-9a-f]{16}$/);
    assert.match(s.startTimeUnixNano, /^\d+$/);
    assert.ok(BigInt(s.endTimeUnixNano) >= BigInt(s.startTimeUnixNano));
    assert.equal(s.resource['service.name'], 'shop-relay');
    assert.match(s.resource['service.version'], /^\d+\.\d+\.\d+$/);
    assert.equal(s.resource['deployment.environment'], 'test');
  }
  const pubOf = {};
  for (const s of publishes) {
    assert.equal(s.parentSpanId, APP_SPAN, 'the publish span is a child of the application span');
    assert.equal(s.kind, 4, 'PRODUCER');
    assert.equal(s.attrs['messaging.operation.name'], 'publish');
    pubOf[s.attrs['messaging.message.id']] = s;
  }
  assert.deepEqual(Object.keys(pubOf).sort(), ['ok-1', 'retry-1']);

  for (const id of ['ok-1', 'retry-1']) {
    const mine = sends().filter((s) => s.attrs['messaging.message.id'] === id).sort((a, b) => a.attrs['relaybus.attempt'] - b.attrs['relaybus.attempt']);
    const got = receiver.requests.filter((r) => r.id === id);
    assert.equal(mine.length, id === 'ok-1' ? 1 : 2, `${id}: one send span per attempt`);
    assert.equal(got.length, mine.length);
    mine.forEach((s, i) => {
      assert.equal(s.parentSpanId, pubOf[id].spanId, `${id}: the send span is a child of the publish span`);
      assert.equal(s.kind, 3, 'CLIENT: an HTTP request');
      assert.equal(s.attrs['relaybus.handler.kind'], 'webhook');
      assert.equal(s.attrs['messaging.destination.name'], 'hook');
      assert.equal(s.attrs['relaybus.attempt'], i + 1);
      // OpenTelemetry's HTTP client attributes.
      assert.equal(s.attrs['http.request.method'], 'POST');
      assert.equal(s.attrs['url.full'], receiver.url('/hook'));
      assert.equal(s.attrs['server.address'], '127.0.0.1');
      assert.equal(s.attrs['server.port'], Number(new URL(receiver.url('/hook')).port));
      const failed = id === 'retry-1' && i === 0;
      assert.equal(s.attrs['http.response.status_code'], failed ? 500 : 204);
      assert.equal(s.attrs['relaybus.outcome'], failed ? 'retry' : 'ok');
      if (failed) {
        assert.equal(s.status.code, 2, 'a failed attempt is an ERROR span');
        assert.match(s.attrs['error.type'], /500/);
      }
      // The receiver's parent is this attempt's span, in the same trace.
      assert.equal(got[i].traceparent.split('-')[1], APP_TRACE, 'the receiver gets the application trace id');
      assert.equal(parentOf(got[i].traceparent), s.spanId, 'the receiver\'s parent is the attempt span');
    });
  }
  assert.ok((await metric(p, 'relaybus_trace_spans_exported_total')) >= 5);
  assert.equal(await metric(p, 'relaybus_trace_spans_dropped_total'), 0);
});

test('the collector gone: spans dropped and counted, deliveries unaffected', { timeout: 45000 }, async () => {
  const up = await startUpstream();
  cleanups.push(up);
  const receiver = await startReceiver();
  cleanups.push(() => receiver.close());
  const gone = await freePort(); // nothing listens there
  const db = uniqueDbName('dispatch_tracing_gone');
  const p = await startTracedProxy(up, db, receiver, `http://127.0.0.1:${gone}`);

  await publishTraced(p, db, [{ id: 'ok-2' }, { id: 'ok-3' }]);
  await waitFor(async () => receiver.requests.length >= 2, 20000, 'both delivered');
  for (const r of receiver.requests) assert.equal(r.traceparent.split('-')[1], APP_TRACE, 'the trace context still reaches the receiver');
  // Two publish spans and two send spans, none exported.
  await waitFor(async () => (await metric(p, 'relaybus_trace_spans_dropped_total')) >= 4, 10000, 'the four spans counted as dropped');
  assert.equal(await metric(p, 'relaybus_trace_spans_exported_total'), 0);
  assert.ok((await metric(p, 'relaybus_trace_export_failures_total')) >= 1);
  const client = await new MongoClient(up.uri).connect();
  try {
    const deliveries = client.db(db).collection('relaybus_deliveries');
    await waitFor(async () => (await deliveries.countDocuments({ status: 'pending' })) === 0, 10000, 'both deliveries settled');
    assert.equal(await deliveries.countDocuments({ status: 'dead' }), 0, 'none dead');
  } finally {
    await client.close();
  }
});

test('sample = always: a publish without a traceparent starts a trace of its own, carried to the receiver', { timeout: 45000 }, async () => {
  const up = await startUpstream();
  cleanups.push(up);
  const collector = await startCollector();
  const receiver = await startReceiver();
  cleanups.push(() => collector.close(), () => receiver.close());
  const db = uniqueDbName('dispatch_tracing_sample');
  const p = await startTracedProxy(up, db, receiver, collector.url(''), 'always');

  await publishTraced(p, db, [{ id: 'ok-4' }], { tenant: 't1' });
  await waitFor(async () => receiver.requests.length >= 1, 20000, 'ok-4 delivered');
  await waitFor(async () => collector.spans.length >= 2, 10000, 'a publish span and a send span');
  const pub = collector.spans.find((s) => s.name === 'publish order.placed.v1');
  const send = collector.spans.find((s) => s.name === 'send hook');
  assert.ok(pub && send);
  assert.equal(pub.parentSpanId || '', '', 'the publish span is the root of a new trace');
  assert.notEqual(pub.traceId, APP_TRACE);
  assert.equal(send.traceId, pub.traceId);
  assert.equal(send.parentSpanId, pub.spanId);
  const [, traceId, parent, flags] = receiver.requests[0].traceparent.split('-');
  assert.equal(traceId, pub.traceId, 'the receiver gets the new trace id');
  assert.equal(parent, send.spanId);
  assert.equal(flags, '01', 'sampled');
});

test('OTEL_* variables alone: spans exported where they say, with their service name, attributes and headers', { timeout: 45000 }, async () => {
  const up = await startUpstream();
  cleanups.push(up);
  const collector = await startCollector();
  const receiver = await startReceiver();
  cleanups.push(() => collector.close(), () => receiver.close());
  const db = uniqueDbName('dispatch_tracing_env');
  const p = await startTracedProxy(up, db, receiver, null, 'never', {
    OTEL_EXPORTER_OTLP_ENDPOINT: collector.url('/'),
    OTEL_SERVICE_NAME: 'orders-relay',
    OTEL_RESOURCE_ATTRIBUTES: 'deployment.environment=staging,team=a%2Cb',
    OTEL_EXPORTER_OTLP_HEADERS: 'Authorization=Bearer%20collector-token',
  });

  await publishTraced(p, db, [{ id: 'ok-5' }]);
  await waitFor(async () => receiver.requests.length >= 1, 20000, 'ok-5 delivered');
  await waitFor(async () => collector.spans.length >= 2, 10000, 'a publish span and a send span');
  for (const post of collector.posts) {
    assert.equal(post.path, '/v1/traces', 'v1/traces appended to OTEL_EXPORTER_OTLP_ENDPOINT');
    assert.equal(post.authorization, 'Bearer collector-token', 'OTEL_EXPORTER_OTLP_HEADERS, decoded');
  }
  for (const s of collector.spans) {
    assert.equal(s.resource['service.name'], 'orders-relay');
    assert.equal(s.resource['deployment.environment'], 'staging');
    assert.equal(s.resource.team, 'a,b');
    assert.equal(s.traceId, APP_TRACE);
  }
  assert.ok(collector.spans.some((s) => s.name === 'send hook'));
  // The header's value is a credential: never in the log.
  assert.doesNotMatch(p.log(), /collector-token/);
});

test('a collector that answers 503 for 3 s loses no span', { timeout: 60000 }, async () => {
  const up = await startUpstream();
  cleanups.push(up);
  const receiver = await startReceiver();
  const collector = await startCollector(Date.now() + 3000);
  cleanups.push(() => collector.close(), () => receiver.close());
  const db = uniqueDbName('dispatch_tracing_busy');
  const p = await startTracedProxy(up, db, receiver, collector.url(''));

  // Events published through the outage, in four transactions 0.6 s apart.
  const ids = [];
  for (let t = 0; t < 4; t++) {
    const batch = [0, 1, 2].map((i) => ({ id: `ok-busy-${t}-${i}` }));
    ids.push(...batch.map((e) => e.id));
    await publishTraced(p, db, batch);
    await new Promise((r) => setTimeout(r, 600));
  }
  await waitFor(async () => receiver.requests.length >= ids.length, 20000, 'every event delivered');
  // One publish span and one send span per event, all of them, after the 503s.
  await waitFor(async () => collector.spans.length >= 2 * ids.length, 30000, `${2 * ids.length} spans at the collector`);
  assert.ok(collector.refused.length >= 1, 'the collector refused batches while it was busy');
  const published = new Set(collector.spans.filter((s) => s.name === 'publish order.placed.v1').map((s) => s.attrs['messaging.message.id']));
  const sent = new Set(collector.spans.filter((s) => s.name === 'send hook').map((s) => s.attrs['messaging.message.id']));
  assert.deepEqual([...published].sort(), [...ids].sort(), 'a publish span of every event');
  assert.deepEqual([...sent].sort(), [...ids].sort(), 'a send span of every event');
  assert.equal(await metric(p, 'relaybus_trace_spans_dropped_total'), 0, 'none dropped');
  assert.ok((await metric(p, 'relaybus_trace_export_failures_total')) >= 1, 'the refused sends are counted');
});

registerFinalChecks(test, cleanups);
