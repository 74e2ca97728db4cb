#!/usr/bin/env node
'use strict';
// Benchmark of the MongoDB server double (not a timed test: it asserts
// nothing about speed, it prints figures).
//
//   node bench/double-bench.js [--docs 100000] [--txns 4000] [--sessions 16]
//
// 1. Memory: VmRSS of the double (summed over its process tree, from
//    /proc/PID/status) before and after inserting --docs small documents.
// 2. Throughput: --txns transactions spread over --sessions concurrent
//    sessions; each transaction inserts one document and updates one
//    (session-private) counter, then commits. Reports transactions/second and
//    latency percentiles.

const fs = require('fs');
const path = require('path');
const { createRequire } = require('module');

const repo = path.resolve(__dirname, '..');
const requireFromTests = createRequire(path.join(repo, 'tests', 'package.json'));
const { MongoClient } = requireFromTests('mongodb');
const { startDouble } = require(path.join(repo, 'tests', 'integration', 'lib', 'double.js'));

function args() {
  const o = { docs: 100000, txns: 4000, sessions: 16 };
  const a = process.argv.slice(2);
  for (let i = 0; i < a.length; i++) {
    const k = a[i].replace(/^--/, '');
    if (!(k in o) || i + 1 >= a.length) {
      process.stderr.write('usage: node bench/double-bench.js [--docs N] [--txns N] [--sessions N]\n');
      process.exit(2);
    }
    o[k] = parseInt(a[++i], 10);
  }
  return o;
}

function childrenOf(pid) {
  const out = [];
  try {
    for (const tid of fs.readdirSync(`/proc/${pid}/task`)) {
      const c = fs.readFileSync(`/proc/${pid}/task/${tid}/children`, 'utf8').trim();
      if (c) out.push(...c.split(/\s+/).map(Number));
    }
  } catch (_) { /* process gone */ }
  return out;
}

// VmRSS in KiB of pid and all its descendants (the launcher may be a script
// that runs node as a child).
function rssKiB(pid) {
  let total = 0;
  const procs = [];
  const stack = [pid];
  while (stack.length) {
    const p = stack.pop();
    try {
      const status = fs.readFileSync(`/proc/${p}/status`, 'utf8');
      const m = /^VmRSS:\s+(\d+)\s+kB/m.exec(status);
      const name = /^Name:\s+(.*)$/m.exec(status);
      if (m) {
        total += parseInt(m[1], 10);
        procs.push(`${name ? name[1] : '?'}(${p})`);
      }
    } catch (_) { /* gone */ }
    stack.push(...childrenOf(p));
  }
  return { kib: total, procs };
}

const mib = (kib) => (kib / 1024).toFixed(1);

function pct(sorted, p) {
  if (!sorted.length) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

async function main() {
  const o = args();
  const d = await startDouble();
  const client = new MongoClient(d.uri, { maxPoolSize: o.sessions + 4, serverSelectionTimeoutMS: 10000 });
  const rows = [];
  try {
    await client.connect();
    const db = client.db('bench');
    await db.dropDatabase();
    await db.command({ ping: 1 });
    await new Promise((r) => setTimeout(r, 500));

    // ---- memory -------------------------------------------------------------
    const before = rssKiB(d.pid);
    const coll = db.collection('small');
    const BATCH = 1000;
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < o.docs; i += BATCH) {
      const n = Math.min(BATCH, o.docs - i);
      await coll.insertMany(Array.from({ length: n }, (_, j) => ({ _id: i + j, n: i + j, s: `doc-${i + j}`, f: true })),
        { ordered: false });
    }
    const insertSecs = Number(process.hrtime.bigint() - t0) / 1e9;
    const count = await coll.countDocuments();
    if (count !== o.docs) throw new Error(`inserted ${o.docs}, collection holds ${count}`);
    await new Promise((r) => setTimeout(r, 500));
    const after = rssKiB(d.pid);
    rows.push(['processes measured', before.procs.join(' ')]);
    rows.push(['VmRSS before insert', `${mib(before.kib)} MiB`]);
    rows.push([`VmRSS after ${o.docs} docs`, `${mib(after.kib)} MiB`]);
    rows.push(['RSS growth', `${mib(after.kib - before.kib)} MiB (${(((after.kib - before.kib) * 1024) / o.docs).toFixed(0)} bytes/doc)`]);
    rows.push(['insert rate (insertMany x1000)', `${(o.docs / insertSecs).toFixed(0)} docs/s`]);

    // ---- transactions -----------------------------------------------------
    const tx = db.collection('tx');
    const counters = db.collection('counters');
    await counters.insertMany(Array.from({ length: o.sessions }, (_, i) => ({ _id: i, n: 0 })));
    await db.createCollection('tx');
    const lat = [];
    let next = 0;
    let attempts = 0;
    const t1 = process.hrtime.bigint();
    await Promise.all(Array.from({ length: o.sessions }, async (_, s) => {
      const session = client.startSession();
      try {
        for (;;) {
          const k = next++;
          if (k >= o.txns) break;
          const ts = process.hrtime.bigint();
          await session.withTransaction(async () => {
            attempts += 1;
            await tx.insertOne({ _id: k, s, at: Date.now() }, { session });
            await counters.updateOne({ _id: s }, { $inc: { n: 1 } }, { session });
          });
          lat.push(Number(process.hrtime.bigint() - ts) / 1e6);
        }
      } finally {
        await session.endSession();
      }
    }));
    const txSecs = Number(process.hrtime.bigint() - t1) / 1e9;
    const committed = await tx.countDocuments();
    const sum = (await counters.aggregate([{ $group: { _id: null, n: { $sum: '$n' } } }]).toArray())[0].n;
    if (committed !== o.txns || sum !== o.txns) throw new Error(`expected ${o.txns} committed, found ${committed} docs / counter sum ${sum}`);
    lat.sort((a, b) => a - b);
    rows.push([`transactions (${o.sessions} sessions)`, `${o.txns} committed, ${attempts - o.txns} retries`]);
    rows.push(['throughput', `${(o.txns / txSecs).toFixed(0)} txn/s (${txSecs.toFixed(2)} s)`]);
    rows.push(['latency p50 / p90 / p99', `${pct(lat, 50).toFixed(2)} / ${pct(lat, 90).toFixed(2)} / ${pct(lat, 99).toFixed(2)} ms`]);
    rows.push(['VmRSS at end', `${mib(rssKiB(d.pid).kib)} MiB`]);
  } finally {
    await client.close().catch(() => {});
    await d.stop();
  }
  const w = Math.max(...rows.map((r) => r[0].length));
  process.stdout.write(`mongod-double benchmark (node ${process.version}, ${new Date().toISOString()})\n`);
  for (const [k, v] of rows) process.stdout.write(`  ${k.padEnd(w)}  ${v}\n`);
}

main().catch((e) => {
  process.stderr.write(`double-bench: ${e && e.stack ? e.stack : e}\n`);
  process.exit(1);
});
