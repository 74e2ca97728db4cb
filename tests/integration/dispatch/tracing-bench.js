'use strict';
// Span export benchmark (not a timed test): what exporting spans costs the paths it must never
// slow down, with the collector up and with it gone.  Three runs, one after the other in one
// process, each with its own upstream (the server double), webhook receiver and proxy:
//
//   off    no [tracing] section: nothing is recorded
//   up     [tracing] otlp_endpoint of a collector on loopback that takes every batch
//   down   [tracing] otlp_endpoint of a port nothing listens on: every batch fails, the
//          spans are dropped and counted
//
// each with sample = always and every event carrying an application traceparent, so every
// publish and every delivery attempt makes a span.  Measured per run:
//   - publish latency: TXNS transactions of one annotated insert through the proxy, one at a
//     time, p50 and p95 in milliseconds;
//   - delivery throughput: N events published through the proxy in transactions of 50, then
//     deliveries per second at the receiver (first to last) and the proxy's CPU milliseconds
//     (utime + stime, /proc/PID/stat) per 1,000 deliveries over the whole run;
//   - the spans exported and dropped (relaybus_trace_spans_*_total).
//
//   node tests/integration/dispatch/tracing-bench.js [N] [TXNS]
//
// Prints one JSON object per run.  bench/tracing runs it; docs/benchmarks.md has the figures.

const fs = require('node:fs');
const http = require('node:http');
const { performance } = require('node:perf_hooks');
const { MongoClient } = require('mongodb');
const { startUpstream, startProxy, uniqueDbName, freePort, clientUri } = require('../lib/proxy');
const { startSink } = require('./sink');
const { waitFor } = require('./helpers');

const N = Number(process.argv[2] || 3000);
const TXNS = Number(process.argv[3] || 300);
const TRACEPARENT = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';

function cpuMs(pid) {
  const f = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = f.slice(f.lastIndexOf(')') + 2).split(' ');
  return ((Number(fields[11]) + Number(fields[12])) * 1000) / 100; // USER_HZ
}

function pct(sorted, p) {
  return sorted[Math.min(sorted.length - 1, Math.floor((sorted.length * p) / 100))];
}

// A collector that takes every batch and counts its spans.
async function startCollector() {
  let spans = 0;
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      try {
        for (const rs of JSON.parse(Buffer.concat(chunks).toString('utf8')).resourceSpans)
          for (const ss of rs.scopeSpans) spans += ss.spans.length;
      } catch { /* counted as nothing */ }
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    endpoint: `http://127.0.0.1:${server.address().port}`,
    spans: () => spans,
    close: () => new Promise((resolve) => { server.closeAllConnections?.(); server.close(() => resolve()); }),
  };
}

async function metric(adminPort, name) {
  const text = await (await fetch(`http://127.0.0.1:${adminPort}/metrics`)).text();
  const m = text.match(new RegExp(`^${name} (\\d+)`, 'm'));
  return m ? Number(m[1]) : 0;
}

async function insertAnnotated(client, db, ids) {
  const session = client.startSession();
  try {
    await session.withTransaction(async () => {
      for (const id of ids)
        await client.db(db).collection('orders').insertOne({ _id: id }, {
          session,
          comment: { relaybus: { type: 'order.placed.v1', id, payload: { id, pad: 'x'.repeat(200) },
            headers: { traceparent: TRACEPARENT } } },
        });
    });
  } finally {
    await session.endSession();
  }
}

async function runOne(mode) {
  const up = await startUpstream();
  const sink = await startSink();
  const collector = mode === 'up' ? await startCollector() : null;
  const endpoint = mode === 'up' ? collector.endpoint : `http://127.0.0.1:${await freePort()}`;
  const adminPort = await freePort();
  const db = uniqueDbName('tracing_bench');
  const p = await startProxy({
    upstream: up.uri,
    dispatch: true,
    extraIni: [
      '[outbox]', `database = ${db}`, '',
      '[admin]', `listen = 127.0.0.1:${adminPort}`, '',
      ...(mode === 'off' ? [] : ['[tracing]', `otlp_endpoint = ${endpoint}`, 'sample = always', '']),
      '[handler bench]', 'events = order.*', 'kind = webhook', `url = ${sink.url('/bench')}`, 'concurrency = 32', '',
    ].join('\n'),
  });
  const client = await new MongoClient(clientUri(p)).connect();
  try {
    const pid = p.child.pid;
    const cpu0 = cpuMs(pid);
    const lat = [];
    for (let i = 0; i < TXNS; i++) {
      const t0 = performance.now();
      await insertAnnotated(client, db, [`lat-${i}`]);
      lat.push(performance.now() - t0);
    }
    lat.sort((a, b) => a - b);
    for (let i = 0; i < N; i += 50) {
      const ids = [];
      for (let j = i; j < Math.min(N, i + 50); j++) ids.push(`bulk-${j}`);
      await insertAnnotated(client, db, ids);
    }
    await waitFor(() => sink.stats().ok.size >= N + TXNS, 1800000, 'every delivery');
    const cpu = cpuMs(pid) - cpu0;
    const at = [...sink.stats().okOrder].filter((id) => id.startsWith('bulk-')).map((id) => sink.stats().firstAt.get(id));
    const secs = (Math.max(...at) - Math.min(...at)) / 1000;
    // The last batch of spans goes out within the exporter's wait (200 ms).
    await new Promise((r) => setTimeout(r, 500));
    return {
      mode,
      publishP50Ms: Number(pct(lat, 50).toFixed(2)),
      publishP95Ms: Number(pct(lat, 95).toFixed(2)),
      deliveries: N,
      deliveriesPerSecond: Math.round(N / secs),
      cpuMsPer1000Deliveries: Math.round((cpu * 1000) / (N + TXNS)),
      spansExported: await metric(adminPort, 'relaybus_trace_spans_exported_total'),
      spansDropped: await metric(adminPort, 'relaybus_trace_spans_dropped_total'),
      collectorSpans: collector ? collector.spans() : 0,
    };
  } finally {
    await client.close();
    await p.stop();
    if (collector) await collector.close();
    await sink.close();
    await up.stop();
  }
}

(async () => {
  for (const mode of ['off', 'up', 'down']) console.log(JSON.stringify(await runOne(mode)));
})().catch((e) => { console.error(e); process.exit(1); });
