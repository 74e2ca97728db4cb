'use strict';
// Dispatch benchmark (not a timed test):
//  - upstream commands per 1,000 deliveries at batch 100, keyed and unkeyed, counted by the
//    double per appName (doubleStats), so only the dispatching proxy's own commands count
//    (the dispatcher's, its lease renewal's and its change stream's):
//    the proxy starts on an empty outbox, its start-up is left out, and the count runs from
//    the first claim that finds the events to the last completion (idle polls and the fleet
//    heartbeat in between included); deliveries per second to a loopback sink (first to
//    last delivery) and the proxy's CPU milliseconds (utime + stime) per 1,000 deliveries;
//  - what a claim costs with 1,000 and with 100,000 due deliveries (commands and
//    milliseconds per claim, over the claims of the first 1,000 deliveries): the backlog is
//    written while every lane is held by a placeholder owner, then the lanes are handed back,
//    so the claims run over a backlog at rest, not beside the bench's own inserts
//    (BENCH_DUE and BENCH_KEYED_DUE: the backlogs measured, default 1000,100000 each, empty
//    for none);
//  - publish-to-webhook latency through the proxy, with the local wake-up, and through
//    another instance: woken by the change stream ([dispatch] watch) and by polling alone.
//
//   RELAYBUS_PROXY_BIN=build/relaybus-proxy node tests/integration/dispatch/bench.js [N]
//
// BENCH_HANDLERS=H: the throughput part with H webhook handlers (h, h2, ... hH) on every event,
// so N events make N × H deliveries, each handler claimed in its own lane space; the counts
// are per 1,000 deliveries as before (default 1).
//
// BENCH_ATTEMPT_HISTORY=D: the proxy's [outbox] attempt_history (default: the proxy's, 7d; 0: no
// attempt records), to measure what the records cost side by side.
//
// BENCH_SHARDED=1: the throughput part against the double's two-shard cluster (two mongos,
// the outbox sharded by the proxy's set-up), with the commands each shard's primary ran for
// the dispatcher, per 1,000 deliveries (doubleStats on each shard counts what the mongos sent
// it, by the client's appName), beside the commands the mongos routers received.
//
// BENCH_ONLY=idle: the idle cost: the dispatching proxy's upstream commands a second with nothing
// due, over BENCH_IDLE_SECONDS (default 20) after its start-up, with each handler count of
// BENCH_IDLE_HANDLERS (default 1,30; webhook handlers on every event, each in its own lane space).
//
// Prints one JSON object per measurement.

const fs = require('fs');
const net = require('net');
const { MongoClient, ObjectId } = require('mongodb');
const { startDouble } = require('../lib/double');
const { sleep } = require('../lib/proxy');
const { startSink } = require('./sink');

const N_HANDLERS = Math.max(1, Number(process.env.BENCH_HANDLERS || 1));
const HANDLER_NAMES = Array.from({ length: N_HANDLERS }, (_, i) => (i === 0 ? 'h' : `h${i + 1}`));
const { startDispatchProxy, publishThroughProxy, waitFor, laneId, laneDocId } = require('./helpers');

const N = Number(process.argv[2] || 1000);
// The dispatching proxy's connections: the dispatcher, its lease renewal and its change stream
// on the deliveries (the wake-up across proxies): all of them count.
const APPS = ['relaybus-proxy dispatch', 'relaybus-proxy renew', 'relaybus-proxy watch'];
const MONITORING = new Set(['hello', 'isMaster', 'ismaster', 'ping', 'endSessions', 'doubleStats', 'buildInfo', 'buildinfo']);

/** The dispatcher's commands since the last reset (monitoring left out): all of them, and
 * those of each connection (appName). */
async function dispatcherCommands(client, reset) {
  const r = await client.db('admin').command({ doubleStats: 1, reset: reset ? 1 : 0 });
  const out = {};
  const byApp = {};
  let total = 0;
  for (const app of APPS) {
    byApp[app] = {};
    for (const [k, v] of Object.entries((r.byApp || {})[app] || {})) {
      if (MONITORING.has(k)) continue;
      out[k] = (out[k] || 0) + Number(v);
      byApp[app][k] = Number(v);
      total += Number(v);
    }
  }
  return { total, byCommand: out, byApp };
}

const SHARDED = process.env.BENCH_SHARDED === '1';

/** The dispatcher's commands on each of `ports` (mongos or shard primaries) since the last
 * reset, monitoring left out: one total per port. */
async function commandsAt(ports, reset) {
  const out = [];
  for (const port of ports) {
    const c = await new MongoClient(`mongodb://127.0.0.1:${port}/?directConnection=true`).connect();
    try {
      out.push((await dispatcherCommands(c, reset)).total);
    } finally {
      await c.close();
    }
  }
  return out;
}

/** utime + stime of a process, in ms. */
function cpuMs(pid) {
  const f = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = f.slice(f.lastIndexOf(')') + 2).split(' ');
  return ((Number(fields[11]) + Number(fields[12])) * 1000) / 100; // USER_HZ
}

async function freePort() {
  return new Promise((resolve) => {
    const srv = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

async function metric(adminPort, name) {
  // A fresh connection each time (the admin port closes idle ones).
  const text = await new Promise((resolve, reject) => {
    require('http').get({ host: '127.0.0.1', port: adminPort, path: '/metrics', agent: false }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c) => { body += c; });
      res.on('end', () => resolve(body));
    }).on('error', reject);
  });
  const m = text.match(new RegExp(`^${name} ([0-9.e+-]+)$`, 'm'));
  return m ? Number(m[1]) : NaN;
}

/** Writes `n` due deliveries (and their events) straight into the outbox, as committed. */
async function insertDue(client, n, keyed, prefix) {
  const db = client.db('relaybus');
  const now = new Date();
  for (let i = 0; i < n; i += 5000) {
    const evs = [];
    const dels = [];
    for (let j = i; j < Math.min(n, i + 5000); j++) {
      const id = `${prefix}-${j}`;
      const key = keyed ? `k-${j % 50}` : undefined;
      const seq = keyed ? Math.floor(j / 50) + 1 : undefined;
      const ev = { _id: id, type: 'bench.v1', payload: { j }, handlers: HANDLER_NAMES, createdAt: now };
      if (keyed) { ev.key = key; ev.sequence = seq; }
      evs.push(ev);
      for (const handler of HANDLER_NAMES) {
        const d = { _id: new ObjectId(), eventId: id, handler, eventType: 'bench.v1', laneId: laneId(key, id),
          lane: 'ready', status: 'pending', attempts: 0, claims: 0, dueAt: now, createdAt: now };
        if (keyed) { d.key = key; d.sequence = seq; }
        dels.push(d);
      }
    }
    await db.collection('relaybus_events').insertMany(evs);
    await db.collection('relaybus_deliveries').insertMany(dels);
  }
  if (keyed) {
    await db.collection('relaybus_key_sequences').insertMany(
      Array.from({ length: 50 }, (_, k) => ({ _id: `k-${k}`, value: Math.ceil(n / 50) })));
  }
}

/** A dispatching proxy, started on an empty outbox and left to settle. */
async function idleDispatcher(d, sink, adminPort, logLevel, names = HANDLER_NAMES) {
  const p = await startDispatchProxy({
    upstream: d.uri,
    logLevel,
    dispatch: { batch_size: 100, poll_interval_ms: 1000 },
    outbox: process.env.BENCH_ATTEMPT_HISTORY !== undefined ? { attempt_history: process.env.BENCH_ATTEMPT_HISTORY } : {},
    adminListen: `127.0.0.1:${adminPort}`,
    handlers: names.map((name) => ({ name, events: '*', kind: 'webhook', url: sink.url(`/${name}`), concurrency: 100 })),
  });
  await sleep(1500); // set-up, the fleet registration and a first empty poll
  return p;
}

/** The idle cost: the dispatcher's commands a second over `seconds` with nothing due and
 * `handlers` handlers (poll_interval_ms 1000, as the other parts). */
async function idle(handlers, seconds) {
  const d = await startDouble();
  const sink = await startSink({});
  const client = await new MongoClient(d.uri).connect();
  const names = Array.from({ length: handlers }, (_, i) => (i === 0 ? 'h' : `h${i + 1}`));
  const p = await idleDispatcher(d, sink, await freePort(), undefined, names);
  try {
    await sleep(3000); // every handler's lanes made, the first polls over
    await dispatcherCommands(client, true);
    await sleep(seconds * 1000);
    const s = await dispatcherCommands(client, false);
    console.log(JSON.stringify({
      measure: `idle: nothing due, ${handlers} handler${handlers > 1 ? 's' : ''}, poll_interval_ms 1000, one proxy`,
      seconds,
      commandsPerSecond: Math.round((s.total * 10) / seconds) / 10,
      byCommandPerSecond: Object.fromEntries(Object.entries(s.byCommand).map(([k, v]) => [k, Math.round((v * 10) / seconds) / 10])),
      byApp: Object.fromEntries(Object.entries(s.byApp).map(([a, c]) => [a, Object.values(c).reduce((x, v) => x + v, 0)])),
    }));
    return s.total / seconds;
  } finally {
    await p.stop();
    await client.close();
    await sink.close();
    await d.stop();
  }
}

async function throughput(keyed) {
  const d = await startDouble(SHARDED ? { sharded: { shards: 2, mongos: 2 } } : {});
  const sink = await startSink({});
  const st = sink.stats();
  const client = await new MongoClient(d.uri).connect();
  const adminPort = await freePort();
  const p = await idleDispatcher(d, sink, adminPort);
  const shardPorts = SHARDED ? d.shards.map((x) => x.port) : [];
  try {
    await dispatcherCommands(client, true);
    if (SHARDED) {
      await commandsAt(d.mongos, true);
      await commandsAt(shardPorts, true);
    }
    const cpu0 = cpuMs(p.child.pid);
    await insertDue(client, N, keyed, 'b');
    await waitFor(() => st.ok.size === N, 600000, 'all deliveries');
    const deliveriesLeft = () => client.db('relaybus').collection('relaybus_deliveries').countDocuments({});
    if (N_HANDLERS > 1) await waitFor(async () => (await deliveriesLeft()) === 0, 600000, 'every handler\'s deliveries');
    const D = N * N_HANDLERS; // deliveries
    const cpu1 = cpuMs(p.child.pid);
    const s = await dispatcherCommands(client, false);
    if (SHARDED) {
      // Through mongos: what the routers received, and what each shard ran for them.
      const routers = await commandsAt(d.mongos, false);
      const shards = await commandsAt(shardPorts, false);
      s.total = routers.reduce((a, v) => a + v, 0);
      console.log(JSON.stringify({
        measure: `${keyed ? 'keyed (50 keys)' : 'unkeyed'} deliveries, batch 100, one proxy, two shards behind two mongos`,
        deliveries: D,
        mongosCommandsPer1000: Math.round((s.total * 1000) / D),
        shardCommandsPer1000: Object.fromEntries(d.shards.map((x, i) => [x.name, Math.round((shards[i] * 1000) / D)])),
      }));
    }
    const times = [...st.firstAt.values()].sort((a, b) => a - b);
    const ms = Math.max(1, times[times.length - 1] - times[0]);
    console.log(JSON.stringify({
      measure: `${keyed ? 'keyed (50 keys)' : 'unkeyed'} deliveries, batch 100, one proxy${N_HANDLERS > 1 ? `, ${N_HANDLERS} handlers` : ''}` +
        (process.env.BENCH_ATTEMPT_HISTORY !== undefined ? `, attempt_history = ${process.env.BENCH_ATTEMPT_HISTORY}` : ''),
      deliveries: D,
      commandsPer1000: Math.round((s.total * 1000) / D),
      byCommandPer1000: Object.fromEntries(Object.entries(s.byCommand).map(([k, v]) => [k, Math.round((v * 1000) / D)])),
      // of which the renewal thread's and the change stream's, which follow the clock
      backgroundPer1000: Math.round(((s.total - Object.values(s.byApp['relaybus-proxy dispatch']).reduce((a, v) => a + v, 0)) * 1000) / D),
      claims: (await metric(adminPort, 'relaybus_dispatch_claims_total')),
      deliveriesPerSecond: Math.round((D * 1000) / ms),
      proxyCpuMsPer1000: Math.round(((cpu1 - cpu0) * 1000) / D),
    }));
  } finally {
    await p.stop();
    await client.close();
    await sink.close();
    await d.stop();
  }
}

/** Commands and milliseconds per claim over the first 1,000 deliveries, with `due` due.
 * A claim's commands are the reads and lane takes on the dispatcher's own connection plus its
 * record (one bulkWrite): the renewal thread's transactions (one per lane every third of a
 * lease) and the change stream's getMores (every 500 ms) run on their own connections and
 * clocks, and are reported apart (backgroundPerClaim).
 * Claims and their durations come from the dispatcher's debug log ("claimed N of M in T ms"):
 * the admin port's /metrics counts the outbox on every scrape, slow on the double at 100,000.
 * While the backlog is written (100,000 deliveries take the double tens of seconds), every
 * lane is held by a placeholder owner, so the dispatcher finds nothing to claim; the count
 * starts when the lanes are handed back, and the claims then run over the whole backlog at
 * rest instead of waiting behind the inserts. */
async function claimCost(due, keyed) {
  const d = await startDouble();
  const sink = await startSink({});
  const st = sink.stats();
  const client = await new MongoClient(d.uri).connect();
  const adminPort = await freePort();
  const p = await idleDispatcher(d, sink, adminPort, 'debug');
  const claimLines = () => [...p.log().matchAll(/dispatch: claimed (\d+) of (\d+) in (\d+) ms/g)];
  const lanes = client.db('relaybus').collection('relaybus_lanes');
  // Handler h's lane space (its first claim made its 256 lane documents).
  const lanesOnly = { _id: { $gte: laneDocId('h', 0), $lt: laneDocId('h', 0) + 256 } };
  try {
    await waitFor(async () => (await lanes.countDocuments(lanesOnly)) === 256, 10000, 'the lanes of handler h');
    await lanes.updateMany(lanesOnly, { $set: { owner: 'bench-hold', leaseExpiresAt: new Date(Date.now() + 3600000) } });
    await insertDue(client, due, keyed, 'c');
    await sleep(1500); // the claims the inserts woke have seen nothing free
    await dispatcherCommands(client, true);
    const before = claimLines().length;
    await lanes.updateMany(lanesOnly, { $set: { owner: null, leaseExpiresAt: null } });
    await waitFor(() => st.ok.size >= 1000, 600000, '1,000 deliveries');
    const s = await dispatcherCommands(client, false);
    const lines = claimLines().slice(before);
    const claims = lines.length;
    const ms = lines.reduce((a, m) => a + Number(m[3]), 0);
    const own = s.byApp['relaybus-proxy dispatch'];
    const claimCmds = ['find', 'aggregate', 'getMore', 'killCursors', 'findAndModify']
      .reduce((a, k) => a + (own[k] || 0), 0) + claims; /* + the record (an update) */
    const perClaim = (o) => Object.fromEntries(Object.entries(o).map(([k, v]) => [k, Number((v / claims).toFixed(1))]));
    const background = Object.values(s.byApp).reduce((a, o) => a + Object.values(o).reduce((x, v) => x + v, 0), 0) -
      Object.values(own).reduce((x, v) => x + v, 0);
    console.log(JSON.stringify({
      measure: `claim cost, ${keyed ? 'keyed (50 keys)' : 'unkeyed'}, ${due} due deliveries`,
      due,
      claims,
      claimed: lines.reduce((a, m) => a + Number(m[1]), 0),
      commandsPerClaimWithCompletions: Number((s.total / claims).toFixed(1)),
      claimCommandsPerClaim: Number((claimCmds / claims).toFixed(1)),
      byCommandPerClaim: perClaim(own),
      backgroundPerClaim: Number((background / claims).toFixed(1)),
      msPerClaim: Number((ms / claims).toFixed(1)),
    }));
  } catch (e) {
    console.error(p.log().slice(-4000));
    throw e;
  } finally {
    await p.stop();
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
async function latency(mode, pollMs, samples, watch = true) {
  const d = await startDouble();
  const sink = await startSink({});
  const st = sink.stats();
  const handlers = [{ name: 'h', events: '*', kind: 'webhook', url: sink.url('/h'), concurrency: 16 }];
  const dispatch = { batch_size: 100, poll_interval_ms: pollMs };
  if (!watch) dispatch.watch = 'false';
  const dispatcher = await startDispatchProxy({ upstream: d.uri, dispatch, handlers });
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
        : `publish-to-webhook latency, published through another proxy (${watch ? 'change stream wake-up' : 'polling only, watch = false'}, poll_interval_ms ${pollMs})`,
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
  const only = process.env.BENCH_ONLY; // throughput, claim, latency or idle: one part only
  if (only === 'idle') {
    for (const h of (process.env.BENCH_IDLE_HANDLERS || '1,30').split(',').filter(Boolean).map(Number)) {
      await idle(h, Number(process.env.BENCH_IDLE_SECONDS || 20));
    }
    return;
  }
  if (!only || only === 'throughput') {
    await throughput(false);
    await throughput(true);
  }
  if (!only || only === 'claim') {
    // BENCH_DUE / BENCH_KEYED_DUE: the backlogs measured; empty: none.
    const dues = (v) => (v ?? '1000,100000').split(',').filter(Boolean).map(Number);
    for (const due of dues(process.env.BENCH_DUE)) await claimCost(due, false);
    for (const due of dues(process.env.BENCH_KEYED_DUE)) await claimCost(due, true);
  }
  if (!only || only === 'latency') {
    await latency('local', 1000, 50);
    await latency('remote', 1000, 50, true);
    await latency('remote', 1000, 50, false);
  }
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
