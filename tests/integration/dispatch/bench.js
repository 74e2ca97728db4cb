'use strict';
// Dispatch benchmark (not a timed test): upstream commands per 1,000
// deliveries at batch 100, keyed and unkeyed, counted by the double
// (doubleStats); deliveries per second to a loopback sink; and
// publish-to-webhook latency through the proxy, with the local wake-up and
// through another instance's polling.
//
//   RELAYBUS_PROXY_BIN=build/relaybus-proxy node tests/integration/dispatch/bench.js [N]
//
// Prints one JSON object per measurement.  Monitoring commands (hello,
// isMaster, ping, endSessions) are left out of the counts.

const { MongoClient } = require('mongodb');
const { startDouble } = require('../lib/double');
const { sleep } = require('../lib/proxy');
const { startSink } = require('./sink');
const { startDispatchProxy, publish, publishThroughProxy, waitFor } = require('./helpers');

const N = Number(process.argv[2] || 1000);
const MONITORING = new Set(['hello', 'isMaster', 'ismaster', 'ping', 'endSessions', 'doubleStats', 'buildInfo', 'buildinfo']);

async function stats(client, reset) {
  const r = await client.db('admin').command({ doubleStats: 1, reset: reset ? 1 : 0 });
  const out = {};
  let total = 0;
  for (const [k, v] of Object.entries(r.commands || {})) {
    if (MONITORING.has(k)) continue;
    out[k] = Number(v);
    total += Number(v);
  }
  return { total, byCommand: out };
}

async function throughput(keyed) {
  const d = await startDouble();
  const sink = await startSink({});
  const client = await new MongoClient(d.uri).connect();
  try {
    const events = [];
    for (let i = 0; i < N; i++) {
      const e = { id: `b-${i}`, type: 'bench.v1', payload: { i } };
      if (keyed) e.key = `k-${i % 50}`;
      events.push(e);
    }
    // Set up the outbox with a proxy that does not dispatch, publish, then count.
    const setupProxy = await startDispatchProxy({ upstream: d.uri, handlers: [
      { name: 'h', events: '*', kind: 'pull' },
    ] });
    await setupProxy.stop();
    await publish(client, 'relaybus', events, ['h'], 100);
    await stats(client, true);
    const t0 = Date.now();
    const p = await startDispatchProxy({
      upstream: d.uri,
      dispatch: { batch_size: 100, poll_interval_ms: 1000 },
      handlers: [{ name: 'h', events: '*', kind: 'webhook', url: sink.url('/h'), concurrency: 100 }],
    });
    await waitFor(() => sink.stats().ok.size === N, 600000, 'all deliveries');
    const ms = Date.now() - t0;
    await sleep(300);
    const s = await stats(client, false);
    await p.stop();
    console.log(JSON.stringify({
      measure: `${keyed ? 'keyed (50 keys)' : 'unkeyed'} deliveries, batch 100, one proxy`,
      deliveries: N,
      commandsPer1000: Math.round((s.total * 1000) / N),
      byCommandPer1000: Object.fromEntries(Object.entries(s.byCommand).map(([k, v]) => [k, Math.round((v * 1000) / N)])),
      deliveriesPerSecond: Math.round((N * 1000) / ms),
      includesProxyStartMs: true,
    }));
  } finally {
    await client.close();
    await sink.close();
    await d.stop();
  }
}

/**
 * Publish-to-webhook latency through the proxy's annotations.
 * local: published through the dispatching proxy (its commit wakes it);
 * remote: published through a second, non-dispatching proxy, so only the
 * dispatcher's polling finds the event.
 */
async function latency(mode, pollMs, samples) {
  const d = await startDouble();
  const sink = await startSink({});
  const st = sink.stats();
  const handlers = [{ name: 'h', events: '*', kind: 'webhook', url: sink.url('/h'), concurrency: 16 }];
  const dispatcher = await startDispatchProxy({ upstream: d.uri, dispatch: { batch_size: 100, poll_interval_ms: pollMs }, handlers });
  const publisher = mode === 'local' ? dispatcher : await startDispatchProxy({ upstream: d.uri, enabled: false, handlers });
  const client = await new MongoClient(`mongodb://127.0.0.1:${publisher.port}/`).connect();
  try {
    await sleep(500);
    const lat = [];
    for (let i = 0; i < samples; i++) {
      const id = `lat-${mode}-${i}`;
      // Publish at a random phase of the poll cycle.
      await sleep(Math.floor(Math.random() * pollMs));
      const t0 = Date.now();
      await publishThroughProxy(client, 'shop', [{ id, type: 'bench.v1', payload: { i } }]);
      await waitFor(() => st.ok.has(id), 30000, 'the event');
      lat.push(st.firstAt.get(id) - t0);
    }
    lat.sort((a, b) => a - b);
    const q = (f) => lat[Math.min(lat.length - 1, Math.floor(f * lat.length))];
    console.log(JSON.stringify({
      measure: mode === 'local'
        ? 'publish-to-webhook latency, published through the dispatching proxy (local wake-up)'
        : `publish-to-webhook latency, published through another proxy (polling, poll_interval_ms ${pollMs})`,
      samples,
      p50: q(0.5),
      p99: q(0.99),
      note: 'from the start of the publishing transaction to the sink answering 2xx',
    }));
  } finally {
    await client.close();
    if (publisher !== dispatcher) await publisher.stop();
    await dispatcher.stop();
    await sink.close();
    await d.stop();
  }
}

(async () => {
  await throughput(false);
  await throughput(true);
  await latency('local', 1000, 50);
  await latency('remote', 1000, 50);
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
