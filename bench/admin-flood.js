#!/usr/bin/env node
'use strict';
// Benchmark: does the admin port slow forwarding?  (Not a timed test: it prints figures.)
//
//   node bench/admin-flood.js [--pings 3000] [--rounds 3] [--flooders 8] [--deliveries 2000] [--healthz 1]
//
// Starts the server double, fills the outbox with --deliveries pending deliveries of a pull
// handler, and starts the proxy (build/relaybus-proxy, or RELAYBUS_PROXY_BIN) with its admin port.
// Then, for --rounds rounds, measures the round-trip time of `ping` sent one at a time through
// the proxy on one connection (after its hello), first idle, then while --flooders concurrent
// HTTP clients, in a separate process, request /api/deliveries?limit=100 as fast as they are
// answered (with --healthz 1: /healthz, which sends no query, to tell the admin port's own cost
// from the double's).  Each phase alternates those pings with pings sent straight to the double
// (the control): the double serves the admin's queries too, and the machine's cores are shared
// by the flood, the double and the proxy, so part of any slowdown is theirs, not the proxy's.
// Reports medians and p99 per phase and the ratios flood/idle.
//
// The bar: ping through the proxy while flooded stays within 20% of idle.

const path = require('node:path');
const { fork } = require('node:child_process');
const http = require('node:http');

const REPO = path.resolve(__dirname, '..');
if (!process.env.RELAYBUS_PROXY_BIN) process.env.RELAYBUS_PROXY_BIN = path.join(REPO, 'build', 'relaybus-proxy');

// ------------------------------------------------------------------ flood child
if (process.argv[2] === '--flood-child') {
  const [base, n, target] = [process.argv[3], Number(process.argv[4]), process.argv[5]];
  const agent = new http.Agent({ keepAlive: true, maxSockets: n });
  let done = 0, errors = 0, stop = false;
  const one = () => new Promise((resolve) => {
    const req = http.get(`${base}${target}`, { agent }, (res) => {
      res.resume();
      res.on('end', () => { if (res.statusCode === 200) done++; else errors++; resolve(); });
    });
    req.on('error', () => { errors++; setTimeout(resolve, 10); });
  });
  const loop = async () => { while (!stop) await one(); };
  process.on('message', (m) => {
    if (m === 'stop') { stop = true; setTimeout(() => { process.send({ done, errors }); process.exit(0); }, 200); }
  });
  for (let i = 0; i < n; i++) loop();
  process.send('started');
  return;
}

const { startDouble, WireConn, sleep } = require(path.join(REPO, 'tests', 'integration', 'lib', 'proxy.js'));
const { startAdminProxy, publish } = require(path.join(REPO, 'tests', 'integration', 'admin', 'helpers.js'));
const { createRequire } = require('node:module');
const { MongoClient } = createRequire(path.join(REPO, 'tests', 'package.json'))('mongodb');

function args() {
  const o = { pings: 3000, rounds: 3, flooders: 8, deliveries: 2000, healthz: 0 };
  const a = process.argv.slice(2);
  for (let i = 0; i < a.length; i++) {
    const k = a[i].replace(/^--/, '');
    if (!(k in o) || i + 1 >= a.length) {
      process.stderr.write('usage: node bench/admin-flood.js [--pings N] [--rounds N] [--flooders N] [--deliveries N] [--healthz 0|1]\n');
      process.exit(2);
    }
    o[k] = parseInt(a[++i], 10);
  }
  return o;
}

const pct = (sorted, p) => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s[Math.floor(s.length / 2)]; };

/* Pings through the proxy and straight to the double alternately, so both series see the
 * same moments of the flood; returns p50 and p99 of each in microseconds. */
async function pingSeries(viaProxy, direct, n) {
  const rtt = [[], []];
  const conns = [viaProxy, direct];
  for (let i = 0; i < n; i++) {
    for (let k = 0; k < 2; k++) {
      const t0 = process.hrtime.bigint();
      const r = await conns[k].command({ ping: 1, $db: 'admin' });
      rtt[k].push(Number(process.hrtime.bigint() - t0) / 1000);
      if (r.ok !== 1) throw new Error(`ping answered ${JSON.stringify(r)}`);
    }
  }
  return rtt.map((xs) => {
    xs.sort((a, b) => a - b);
    return { p50: pct(xs, 50), p99: pct(xs, 99) };
  });
}

async function connect(port) {
  const c = await WireConn.connect({ port });
  const h = await c.command({ hello: 1, $db: 'admin' });
  if (h.ok !== 1) throw new Error('hello failed');
  return c;
}

function startFlood(base, n, target) {
  return new Promise((resolve) => {
    const child = fork(__filename, ['--flood-child', base, String(n), target], { stdio: 'inherit' });
    child.once('message', () => resolve({
      stop: () => new Promise((res) => { child.once('message', res); child.send('stop'); }),
    }));
  });
}

async function main() {
  const o = args();
  const double = await startDouble();
  const db = 'bench_admin_flood';
  const client = await new MongoClient(double.uri).connect();
  const events = [];
  for (let i = 0; i < o.deliveries; i++) events.push({ id: `f-${i}`, type: 'bench.v1', key: `k${i % 100}`, payload: { i, pad: 'x'.repeat(200) } });
  const proxy = await startAdminProxy({ upstream: double.uri, outbox: { database: db }, dispatch: false,
    handlers: [{ name: 'audit', events: '*', kind: 'pull' }] });
  await publish(client, db, events, ['audit'], 200);
  await client.close();

  const viaProxy = await connect(proxy.port);
  const direct = await connect(double.port);
  await pingSeries(viaProxy, direct, 300); // warm-up
  const target = o.healthz ? '/healthz' : '/api/deliveries?limit=100&handler=audit';
  const rows = [];
  for (let r = 0; r < o.rounds; r++) {
    const [idleP, idleD] = await pingSeries(viaProxy, direct, o.pings);
    const flood = await startFlood(proxy.base, o.flooders, target);
    await sleep(1000); // past the flood process's start-up
    const t0 = Date.now();
    const [floodP, floodD] = await pingSeries(viaProxy, direct, o.pings);
    const res = await flood.stop();
    const secs = (Date.now() - t0) / 1000;
    rows.push({ idleP, idleD, floodP, floodD, rps: res.done / secs, errors: res.errors });
    process.stdout.write(`round ${r + 1}: proxy ping p50 idle ${idleP.p50.toFixed(0)} us, flooded ${floodP.p50.toFixed(0)} us; ` +
      `direct p50 idle ${idleD.p50.toFixed(0)} us, flooded ${floodD.p50.toFixed(0)} us; ` +
      `${target.split('?')[0]} ${(res.done / secs).toFixed(0)} req/s (${res.errors} errors)\n`);
  }
  const m = (f) => median(rows.map(f));
  const proxyRatio = m((x) => x.floodP.p50) / m((x) => x.idleP.p50);
  const directRatio = m((x) => x.floodD.p50) / m((x) => x.idleD.p50);
  const overheadIdle = m((x) => x.idleP.p50 - x.idleD.p50);
  const overheadFlood = m((x) => x.floodP.p50 - x.floodD.p50);
  console.log('');
  console.log(`ping through the proxy, median of round medians: idle ${m((x) => x.idleP.p50).toFixed(0)} us, ` +
    `flooded ${m((x) => x.floodP.p50).toFixed(0)} us (p99 ${m((x) => x.idleP.p99).toFixed(0)} / ${m((x) => x.floodP.p99).toFixed(0)} us)`);
  console.log(`ping straight to the double (control):            idle ${m((x) => x.idleD.p50).toFixed(0)} us, ` +
    `flooded ${m((x) => x.floodD.p50).toFixed(0)} us (p99 ${m((x) => x.idleD.p99).toFixed(0)} / ${m((x) => x.floodD.p99).toFixed(0)} us)`);
  console.log(`the proxy's own share (proxy - direct):           idle ${overheadIdle.toFixed(0)} us, flooded ${overheadFlood.toFixed(0)} us`);
  console.log(`${target} served while flooded: ${m((x) => x.rps).toFixed(0)} requests/s`);
  console.log(`RATIO flooded/idle through the proxy: ${proxyRatio.toFixed(3)} (control, the double alone: ${directRatio.toFixed(3)})`);
  viaProxy.destroy();
  direct.destroy();
  await proxy.stop();
  await double.stop();
}

main().catch((e) => { console.error(e); process.exit(1); });
