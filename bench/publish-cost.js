#!/usr/bin/env node
'use strict';
// bench/publish-cost.js - what publishing costs (issue 4, must-show 4).
//
// Starts the server double, a TCP tap in front of it that records the order in which messages
// cross (proxy -> server, server -> proxy), and relaybus-proxy whose upstream is the tap. Then,
// for each mode, runs N transactions of one insert + commit through the proxy with the Node.js
// driver, one at a time:
//
//   plain          no annotation (the baseline)
//   event          one event, generated id, no key
//   event+key      one event with a key
//   event+id       one event with an explicit id (read first, for dedup)
//   event+id+key   both
//   3 events+key   three events of one key in one annotation
//
// and reports per annotated statement, against the baseline:
//   - extra upstream commands, by name, counted by the double ({doubleStats: 1});
//   - extra round trips on the upstream connection, counted on the tap: a round trip is a run of
//     messages the proxy wrote back to back before the next reply reached it;
//   - the latency of the annotated statement, of the commit, and of the whole transaction
//     (p50 / p95, milliseconds), and their ratio to the baseline.
//
// Usage: node bench/publish-cost.js [--n 300] [--proxy PATH] [--json]
// The proxy binary defaults to RELAYBUS_PROXY_BIN, then build/relaybus-proxy, then ./relaybus-proxy.

const path = require('node:path');
const fs = require('node:fs');
const net = require('node:net');
const { performance } = require('node:perf_hooks');

const TOP = path.resolve(__dirname, '..');
const TESTS = path.join(TOP, 'tests');
const H = require(path.join(TESTS, 'integration', 'lib', 'proxy.js'));
const { MongoClient } = require(path.join(TESTS, 'node_modules', 'mongodb'));

function arg(name, def) {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : def;
}
const N = Number(arg('n', 300));
const JSON_OUT = process.argv.includes('--json');
const proxyPath = arg('proxy', null);
if (proxyPath) process.env.RELAYBUS_PROXY_BIN = path.resolve(proxyPath);
if (!process.env.RELAYBUS_PROXY_BIN) {
  for (const p of [path.join(TOP, 'build', 'relaybus-proxy'), path.join(TOP, 'relaybus-proxy')]) {
    if (fs.existsSync(p)) {
      process.env.RELAYBUS_PROXY_BIN = p;
      break;
    }
  }
}

/** A tap recording, per connection, the arrival order of whole messages in each direction. */
async function startOrderTap(targetPort) {
  const conns = [];
  const server = net.createServer((client) => {
    const rec = { seq: [] }; // {dir: 'C'|'S', name}
    conns.push(rec);
    const upstream = net.connect({ host: '127.0.0.1', port: targetPort });
    // Without TCP_NODELAY the tap itself would add Nagle/delayed-ACK stalls to pipelined replies.
    client.setNoDelay(true);
    upstream.setNoDelay(true);
    const fc = new H.Framer();
    const fs2 = new H.Framer();
    const name = (raw) => {
      try {
        const d = H.parseMessage(raw).doc;
        return d ? Object.keys(d)[0] : '?';
      } catch {
        return '?';
      }
    };
    client.on('data', (chunk) => {
      for (const m of fc.push(chunk)) rec.seq.push({ dir: 'C', name: name(m) });
      upstream.write(chunk);
    });
    upstream.on('data', (chunk) => {
      for (const m of fs2.push(chunk)) rec.seq.push({ dir: 'S' });
      client.write(chunk);
    });
    const close = () => {
      client.destroy();
      upstream.destroy();
    };
    client.on('close', close);
    upstream.on('close', close);
    client.on('error', () => {});
    upstream.on('error', () => {});
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return { port: server.address().port, conns, stop: () => new Promise((r) => server.close(r)) };
}

/** Round trips and commands on the connections that carried the workload's inserts. */
function countTap(conns) {
  let rounds = 0;
  const commands = {};
  for (const c of conns) {
    if (!c.seq.some((e) => e.dir === 'C' && e.name === 'insert')) continue;
    let inRun = false;
    for (const e of c.seq) {
      if (e.dir === 'C') {
        commands[e.name] = (commands[e.name] || 0) + 1;
        if (!inRun) rounds++;
        inRun = true;
      } else {
        inRun = false;
      }
    }
  }
  return { rounds, commands };
}

function pct(arr, p) {
  const a = [...arr].sort((x, y) => x - y);
  return a[Math.min(a.length - 1, Math.floor((p / 100) * a.length))];
}

const MODES = [
  { name: 'plain', events: () => null },
  { name: 'event', events: (i) => ({ type: 'order.placed.v1', payload: { i } }) },
  { name: 'event+key', events: (i) => ({ type: 'order.placed.v1', key: `k-${i % 16}`, payload: { i } }) },
  { name: 'event+id', events: (i, run) => ({ type: 'order.placed.v1', id: `${run}-${i}`, payload: { i } }) },
  { name: 'event+id+key', events: (i, run) => ({ type: 'order.placed.v1', id: `${run}-${i}`, key: `k-${i % 16}`, payload: { i } }) },
  {
    name: '3 events+key',
    events: (i) => [0, 1, 2].map((e) => ({ type: 'order.placed.v1', key: `k-${i % 16}`, payload: { i, e } })),
  },
];

async function main() {
  const double = await H.startDouble({});
  const tap = await startOrderTap(double.port);
  // directConnection: the proxy's raw connections go to the seed (the tap), not to the `me`
  // address the double's hello names.
  const proxy = await H.startProxy({
    upstream: `mongodb://127.0.0.1:${tap.port}/?directConnection=true`,
    extraIni: '[handler orders]\nevents = order.*\nkind = pull\n\n[handler confirmations]\nevents = order.placed.v1\nkind = pull\n',
  });
  const direct = new MongoClient(double.directUri);
  await direct.connect();
  for (const c of ['relaybus_events', 'relaybus_deliveries', 'relaybus_key_sequences']) {
    await direct.db('relaybus').createCollection(c).catch(() => {});
  }
  const client = new MongoClient(proxy.uri(), { maxPoolSize: 1, minPoolSize: 1 });
  await client.connect();
  const coll = client.db('bench').collection('orders');

  let run = 0;
  const once = async (mode, i, tag) => {
    const s = client.startSession();
    const t0 = performance.now();
    s.startTransaction();
    const ev = mode.events(i, tag);
    await coll.insertOne({ i, mode: mode.name }, { session: s, comment: ev ? { relaybus: ev } : undefined });
    const t1 = performance.now();
    await s.commitTransaction();
    const t2 = performance.now();
    await s.endSession();
    return [t1 - t0, t2 - t1, t2 - t0];
  };
  // Warm the double (a JIT-compiled Node.js process) and the proxy on every mode first.
  for (const mode of MODES) for (let i = 0; i < 50; i++) await once(mode, i, `warm-${mode.name}`);

  // Two passes, in opposite orders, so that no mode always runs first; N/2 each.
  const acc = new Map(MODES.map((m) => [m.name, { mode: m.name, stats: {}, rounds: 0, stmt: [], commit: [], total: [] }]));
  for (const order of [MODES, [...MODES].reverse()]) {
    for (const mode of order) {
      run++;
      await client.close();
      await direct.db('admin').command({ doubleStats: 1, reset: true });
      tap.conns.length = 0;
      await client.connect(); // a fresh, recorded upstream connection
      const a = acc.get(mode.name);
      for (let i = 0; i < N / 2; i++) {
        const [st, cm, tt] = await once(mode, i, `r${run}`);
        a.stmt.push(st);
        a.commit.push(cm);
        a.total.push(tt);
      }
      const stats = (await direct.db('admin').command({ doubleStats: 1, reset: true })).commands;
      for (const [k, v] of Object.entries(stats)) a.stats[k] = (a.stats[k] || 0) + Number(v);
      a.rounds += countTap(tap.conns).rounds;
    }
  }
  const results = MODES.map((m) => {
    const a = acc.get(m.name);
    return { mode: a.mode, stats: a.stats, tap: { rounds: a.rounds }, stmt: a.stmt, commit: a.commit, total: a.total };
  });

  const base = results[0];
  const per = (x) => x / N;
  const rows = results.map((r) => {
    const extra = {};
    for (const k of new Set([...Object.keys(r.stats), ...Object.keys(base.stats)])) {
      if (['endSessions', 'hello', 'isMaster', 'ismaster', 'ping', 'doubleStats', 'buildInfo'].includes(k)) continue;
      const d = per((r.stats[k] || 0) - (base.stats[k] || 0));
      if (Math.abs(d) >= 0.005) extra[k] = Number(d.toFixed(2));
    }
    return {
      mode: r.mode,
      extraCommands: extra,
      extraCommandsTotal: Number(Object.values(extra).reduce((a, b) => a + b, 0).toFixed(2)),
      extraRoundTrips: Number(per(r.tap.rounds - base.tap.rounds).toFixed(2)),
      roundTripsPerTxn: Number(per(r.tap.rounds).toFixed(2)),
      stmtP50: pct(r.stmt, 50),
      stmtP95: pct(r.stmt, 95),
      commitP50: pct(r.commit, 50),
      commitP95: pct(r.commit, 95),
      txnP50: pct(r.total, 50),
      txnP95: pct(r.total, 95),
    };
  });
  const b = rows[0];
  if (JSON_OUT) {
    console.log(JSON.stringify({ n: N, rows }, null, 2));
  } else {
    const f = (x) => x.toFixed(2);
    console.log(`publish cost: ${N} transactions per mode (insert + commit, one session), through relaybus-proxy to the server double`);
    console.log('');
    console.log('| mode | extra upstream commands per statement | extra round trips | statement p50 / p95 ms | commit p50 / p95 ms | transaction p50 / p95 ms | commit p50 vs plain | transaction p50 vs plain |');
    console.log('|---|---|---|---|---|---|---|---|');
    for (const r of rows) {
      const cmds = Object.entries(r.extraCommands).map(([k, v]) => `${k} ${v}`).join(', ') || '-';
      console.log(`| ${r.mode} | ${cmds} | ${f(r.extraRoundTrips)} | ${f(r.stmtP50)} / ${f(r.stmtP95)} | ${f(r.commitP50)} / ${f(r.commitP95)} | ${f(r.txnP50)} / ${f(r.txnP95)} | ${f(r.commitP50 / b.commitP50)}x | ${f(r.txnP50 / b.txnP50)}x |`);
    }
  }
  await client.close();
  await direct.close();
  await proxy.stop();
  await tap.stop();
  await double.stop();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
