'use strict';
// Soak benchmark: a fixed, moderate mixed load through one proxy for a long time, to find what
// grows without bound (memory, descriptors, the outbox backlog, latency). Not a throughput test.
//
//   bench/soak [DURATION]          DURATION: 60m (default), 5m, 90s, 2h
//   node bench/soak.js --self-test checks the growth rules on made-up series
//
// Starts the server double (replica set; MONGODB_URI names a real one instead), a webhook sink
// (tests/integration/dispatch/sink.js, signatures verified) and the proxy (RELAYBUS_PROXY_BIN,
// else build-rel/relaybus-proxy) with its admin port, one webhook handler `soak` for `soak.*`
// and a short retention ([outbox] retain_completed = 1m, purge_interval = 15s), so that the
// outbox stays bounded at a fixed rate. The traffic, all at fixed rates:
//
//  - CRUD: 4 workers over one long-lived MongoClient (maxPoolSize 8), 25 requests/s each:
//    insert, find, update, delete of one document in turn (the collection stays small);
//  - transactions: 2/s, each inserting an order annotated with a `relaybus` comment (a keyed
//    event, 16 keys) and updating a counter; 3 in 4 commit, 1 in 4 abort;
//  - webhook dispatch of those events to the sink;
//  - admin scrapes: GET /metrics and GET /api/stats every 5 s;
//  - short-lived connections: 4 MongoClients a second, one after the other, each connecting,
//    sending 3 commands (insert, find, delete) and closing.
//
// Every 10 s it samples the proxy's VmRSS (/proc/PID/status), its open descriptors
// (/proc/PID/fd), the outbox backlog (pending + running deliveries, from /api/stats) and the
// events stored in the outbox; every minute it prints one line with the latest sample, the p99 of
// that minute's CRUD requests, the requests, events and connections of the minute and the CPU
// used by the proxy and by this load generator. At the end the load stops, the backlog must drain,
// every committed event must have reached the sink (and no aborted one), and the series are
// judged by the rules below; results go to tests/out/soak/soak-<stamp>.{json,csv,md}.
// Exit 0 when every rule holds, 1 otherwise (naming each broken rule), 2 on a usage error.
//
// The rules compare the run after a warm-up (10% of it, at least 1 minute) in thirds: the
// maximum of the last third against the maximum of the first third.
//  - RSS: last <= first * 1.10 + 4 MiB;
//  - descriptors: last <= first + 20;
//  - stored events: last <= first * 1.25 + 100 (retention keeps the outbox bounded);
//  - backlog: last <= first * 2 + 100 during the load, and 0 within 60 s after it stops;
//  - CRUD p99 (per minute): last <= max(first * 3, first + 5 ms);
//  - no failed request, no dead delivery, no bad signature, no key out of order.

const fs = require('node:fs');
const http = require('node:http');
const path = require('node:path');
const { createRequire } = require('node:module');

const REPO = path.resolve(__dirname, '..');
const SAMPLE_MS = 10000;
const RETAIN = '1m';
const PURGE_INTERVAL = '15s';
const MiB = 1024 * 1024;

// ------------------------------------------------------------------ the rules

/** Warm-up and thirds of `n` samples: indices [a, b) of the first third, [c, n) of the last. */
function thirds(n, warm) {
  const rest = n - warm;
  if (rest < 3) return null;
  const third = Math.max(1, Math.floor(rest / 3));
  return { first: [warm, warm + third], last: [n - third, n] };
}

const maxOf = (xs, [a, b]) => Math.max(...xs.slice(a, b));

/**
 * Judges the series. samples: [{rssKiB, fds, backlog, events}] every SAMPLE_MS; minutes:
 * [{p99Ms}]; warmSamples/warmMinutes: the warm-up lengths. Returns [{series, ok, detail}].
 */
function judge(samples, minutes, warmSamples, warmMinutes, end) {
  const out = [];
  const grow = (series, xs, warm, limitOf, unit, fmt = (v) => v) => {
    const t = thirds(xs.length, warm);
    if (!t) {
      out.push({ series, ok: false, detail: `too few samples after the warm-up (${xs.length - warm})` });
      return;
    }
    const first = maxOf(xs, t.first);
    const last = maxOf(xs, t.last);
    const limit = limitOf(first);
    out.push({ series, ok: last <= limit,
      detail: `max of the first third ${fmt(first)}${unit}, of the last third ${fmt(last)}${unit}, limit ${fmt(limit)}${unit}` });
  };
  const mib = (v) => (v / 1024).toFixed(1);
  grow('RSS', samples.map((s) => s.rssKiB), warmSamples, (f) => f * 1.10 + 4096, ' MiB', mib);
  grow('descriptors', samples.map((s) => s.fds), warmSamples, (f) => f + 20, '');
  grow('stored events', samples.map((s) => s.events), warmSamples, (f) => Math.floor(f * 1.25 + 100), '');
  grow('backlog', samples.map((s) => s.backlog), warmSamples, (f) => f * 2 + 100, '');
  grow('CRUD p99', minutes.map((m) => m.p99Ms), warmMinutes, (f) => Math.max(f * 3, f + 5), ' ms', (v) => v.toFixed(2));
  if (end) {
    out.push({ series: 'backlog drained', ok: end.backlogAfter === 0,
      detail: `${end.backlogAfter} pending or running ${end.drainMs} ms after the load stopped` });
    out.push({ series: 'deliveries', ok: end.missing === 0 && end.abortedDelivered === 0 && end.dead === 0,
      detail: `${end.committed} committed events, ${end.missing} not delivered; ${end.aborted} aborted, ` +
        `${end.abortedDelivered} delivered; ${end.dead} dead deliveries` });
    out.push({ series: 'sink checks', ok: end.badSignatures === 0 && end.seqViolations === 0,
      detail: `${end.badSignatures} bad signatures, ${end.seqViolations} key order violations, ${end.duplicates} duplicates (allowed)` });
    out.push({ series: 'errors', ok: end.errors === 0,
      detail: `${end.errors} failed requests${end.firstErrors.length ? ': ' + end.firstErrors.join('; ') : ''}` });
  }
  return out;
}

function selfTest() {
  const n = 360;
  const flat = Array.from({ length: n }, (_, i) => ({ rssKiB: 20000 + (i % 7) * 50, fds: 40 + (i % 5), backlog: i % 9, events: 300 + (i % 11) }));
  const mins = Array.from({ length: 60 }, (_, i) => ({ p99Ms: 2 + (i % 3) * 0.3 }));
  const cases = [
    ['flat', flat, mins, []],
    // 1 KiB kept per connection at 8 connections a second: 80 KiB per 10 s sample.
    ['RSS leak of 1 KiB per connection', flat.map((s, i) => ({ ...s, rssKiB: s.rssKiB + i * 80 })), mins, ['RSS']],
    ['one descriptor lost a minute', flat.map((s, i) => ({ ...s, fds: s.fds + Math.floor(i / 6) })), mins, ['descriptors']],
    ['stuck dispatcher', flat.map((s, i) => ({ ...s, backlog: i > 180 ? (i - 180) * 15 : s.backlog })), mins, ['backlog']],
    ['retention off', flat.map((s, i) => ({ ...s, events: s.events + i * 15 })), mins, ['stored events']],
    ['p99 growing with the square of the time', flat, mins.map((m, i) => ({ p99Ms: m.p99Ms + (i / 10) ** 2 })), ['CRUD p99']],
  ];
  let bad = 0;
  for (const [name, s, m, want] of cases) {
    const failed = judge(s, m, 36, 6, null).filter((r) => !r.ok).map((r) => r.series);
    const ok = JSON.stringify(failed) === JSON.stringify(want);
    if (!ok) bad++;
    console.log(`${ok ? 'ok' : 'NOT OK'} - ${name}: broken rules ${JSON.stringify(failed)}, expected ${JSON.stringify(want)}`);
  }
  process.exit(bad ? 1 : 0);
}

// ------------------------------------------------------------------ helpers

function parseDuration(s) {
  const m = /^(\d+(?:\.\d+)?)(s|m|h)?$/.exec(s || '');
  if (!m) return null;
  const v = Number(m[1]) * { s: 1000, m: 60000, h: 3600000 }[m[2] || 'm'];
  return v >= 60000 ? v : null;
}

function procStatus(pid) {
  const st = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const rss = Number(/VmRSS:\s+(\d+)/.exec(st)[1]);
  const fds = fs.readdirSync(`/proc/${pid}/fd`).length;
  const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  const ticks = Number(f[11]) + Number(f[12]); // utime + stime, in clock ticks (100 Hz)
  return { rssKiB: rss, fds, cpuMs: ticks * 10 };
}

function getJson(base, p) {
  return new Promise((resolve, reject) => {
    const req = http.get(`${base}${p}`, { agent: false }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        if (res.statusCode !== 200) return reject(new Error(`GET ${p}: ${res.statusCode} ${text.slice(0, 200)}`));
        resolve(/json/.test(res.headers['content-type'] || '') ? JSON.parse(text) : text);
      });
    });
    req.setTimeout(15000, () => req.destroy(new Error(`GET ${p}: no answer within 15 s`)));
    req.on('error', reject);
  });
}

const pct = (xs, p) => {
  if (!xs.length) return 0;
  const s = Float64Array.from(xs).sort();
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};

// ------------------------------------------------------------------ the run

async function main() {
  const arg = process.argv[2];
  if (arg === '--self-test') return selfTest();
  const durationMs = parseDuration(arg === undefined ? '60m' : arg);
  if (!durationMs || process.argv.length > 3) {
    process.stderr.write('usage: bench/soak [DURATION]   (e.g. 60m, 5m, 2h; at least 1m; default 60m)\n       bench/soak --self-test\n');
    process.exit(2);
  }
  if (!process.env.RELAYBUS_PROXY_BIN) process.env.RELAYBUS_PROXY_BIN = path.join(REPO, 'build-rel', 'relaybus-proxy');
  const bin = process.env.RELAYBUS_PROXY_BIN;
  if (!fs.existsSync(bin)) {
    process.stderr.write(`soak: no proxy binary at ${bin} (set RELAYBUS_PROXY_BIN)\n`);
    process.exit(2);
  }

  const H = require(path.join(REPO, 'tests', 'integration', 'lib', 'proxy.js'));
  const { startAdminProxy } = require(path.join(REPO, 'tests', 'integration', 'admin', 'helpers.js'));
  const { startSink } = require(path.join(REPO, 'tests', 'integration', 'dispatch', 'sink.js'));
  const { newSecret } = require(path.join(REPO, 'tests', 'integration', 'dispatch', 'helpers.js'));
  const { MongoClient } = createRequire(path.join(REPO, 'tests', 'package.json'))('mongodb');

  const started = { up: null, sink: null, proxy: null, clients: new Set() };
  let stopping = false;
  const stopAll = async () => {
    for (const c of started.clients) await c.close(true).catch(() => {});
    if (started.proxy) await started.proxy.stop().catch((e) => console.error(`soak: ${e.message.split('\n')[0]}`));
    if (started.sink) await started.sink.close().catch(() => {});
    if (started.up) await started.up.stop().catch(() => {});
  };
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
    process.on(sig, () => {
      if (stopping) return;
      stopping = true;
      console.error(`\nsoak: ${sig}, stopping everything it started`);
      if (started.proxy) started.proxy.kill().catch(() => {});
      stopAll().finally(() => process.exit(130));
      setTimeout(() => process.exit(130), 10000).unref();
    });
  }

  const stamp = new Date().toISOString().replace(/[:.]/g, '-');
  const outDir = path.join(REPO, 'tests', 'out', 'soak');
  fs.mkdirSync(outDir, { recursive: true });

  // A bench run by hand, like scripts/run: MONGODB_URI names its deployment (the test suite's
  // harness reads only scripts/test --upstream's variable).
  const up = (started.up = process.env.MONGODB_URI ? H.externalUpstream(process.env.MONGODB_URI) : await H.startDouble());
  const outboxDb = up.real ? H.uniqueDbName('soak_outbox') : 'relaybus';
  const appDb = up.real ? H.uniqueDbName('soak_app') : 'soak';
  const secret = newSecret();
  const sink = (started.sink = await startSink({ secret }));
  const proxy = (started.proxy = await startAdminProxy({
    upstream: up.uri,
    outbox: { database: outboxDb, retain_completed: RETAIN, purge_interval: PURGE_INTERVAL },
    dispatchKeys: { poll_interval_ms: 1000 },
    handlers: [{ name: 'soak', events: 'soak.*', kind: 'webhook', url: sink.url('/soak'), secret, concurrency: 8 }],
  }));
  const uri = (params) => H.clientUri({ host: '127.0.0.1', port: proxy.port, tls: null }, { directConnection: 'true', ...params });
  const direct = new MongoClient(up.directUri);
  started.clients.add(direct);
  await direct.connect();
  const outboxEvents = direct.db(outboxDb).collection('relaybus_events');
  const pool = new MongoClient(uri({ appName: 'soak-crud', maxPoolSize: 8 }));
  started.clients.add(pool);
  await pool.connect();
  const txnClient = new MongoClient(uri({ appName: 'soak-txn', maxPoolSize: 4 }));
  started.clients.add(txnClient);
  await txnClient.connect();

  console.log(`soak: ${(durationMs / 60000).toFixed(1)} min, proxy ${bin} (pid ${proxy.child.pid}), ` +
    `upstream ${up.real ? 'MONGODB_URI' : `server double (pid ${up.pid})`}, sink ${sink.url('/soak')}, admin ${proxy.base}`);

  // ---- counters of the current minute
  const cur = { lat: [], requests: 0, txCommitted: 0, txAborted: 0, shortConns: 0, scrapes: 0 };
  const errors = { n: 0, first: [] };
  const fail = (what, e) => {
    errors.n++;
    if (errors.first.length < 5) errors.first.push(`${what}: ${e && e.message ? e.message.split('\n')[0] : e}`);
  };
  const committed = new Set();
  const aborted = new Set();
  let running = true;
  const t0 = Date.now();
  const until = t0 + durationMs;

  /** Runs fn every `ms`, one at a time, for as long as the load runs. */
  const paced = async (ms, fn) => {
    let next = Date.now();
    while (running && Date.now() < until) {
      await fn();
      next += ms;
      const wait = next - Date.now();
      if (wait > 0) await H.sleep(wait);
      else next = Date.now(); // behind: do not burst to catch up
    }
  };
  const timed = async (p) => {
    const s = process.hrtime.bigint();
    await p;
    cur.lat.push(Number(process.hrtime.bigint() - s) / 1e6);
    cur.requests++;
  };

  const crudWorker = async (w) => {
    const coll = pool.db(appDb).collection(`items_${w}`);
    let i = 0;
    let step = 0;
    await paced(40, async () => {
      const id = `w${w}-${i}`;
      try {
        if (step === 0) await timed(coll.insertOne({ _id: id, n: i, pad: 'x'.repeat(200) }));
        else if (step === 1) await timed(coll.findOne({ _id: id }));
        else if (step === 2) await timed(coll.updateOne({ _id: id }, { $inc: { n: 1 }, $set: { at: new Date() } }));
        else await timed(coll.deleteOne({ _id: id }));
      } catch (e) {
        fail(`crud ${step}`, e);
      }
      step = (step + 1) % 4;
      if (step === 0) i++;
    });
  };

  let txn = 0;
  const txnLoop = async () => {
    const orders = txnClient.db(appDb).collection('orders');
    const counters = txnClient.db(appDb).collection('counters');
    await paced(500, async () => {
      const n = txn++;
      const id = `soak-${stamp}-${n}`;
      const abort = n % 4 === 3;
      const session = txnClient.startSession();
      try {
        session.startTransaction();
        await orders.insertOne({ _id: id, at: new Date() },
          { session, comment: { relaybus: { type: 'soak.order.v1', id, key: `k${n % 16}`, payload: { n } } } });
        await counters.updateOne({ _id: 'orders' }, { $inc: { n: 1 } }, { session, upsert: true });
        if (abort) {
          await session.abortTransaction();
          aborted.add(id);
          cur.txAborted++;
        } else {
          await session.commitTransaction();
          committed.add(id);
          cur.txCommitted++;
        }
      } catch (e) {
        if (session.inTransaction()) await session.abortTransaction().catch(() => {});
        fail('transaction', e);
      } finally {
        await session.endSession().catch(() => {});
      }
      // The orders themselves are not the point: keep the collection small.
      if (n % 60 === 59) await orders.deleteMany({ at: { $lt: new Date(Date.now() - 60000) } }).catch((e) => fail('orders cleanup', e));
    });
  };

  let shortN = 0;
  const shortLoop = async () => {
    await paced(250, async () => {
      const c = new MongoClient(uri({ appName: 'soak-short', maxPoolSize: 1, serverSelectionTimeoutMS: 10000 }));
      started.clients.add(c);
      const coll = c.db(appDb).collection('short');
      const id = `s-${shortN++}`;
      try {
        await c.connect();
        await coll.insertOne({ _id: id });
        await coll.findOne({ _id: id });
        await coll.deleteOne({ _id: id });
        cur.shortConns++;
      } catch (e) {
        fail('short-lived client', e);
      } finally {
        await c.close().catch(() => {});
        started.clients.delete(c);
      }
    });
  };

  let lastStats = null;
  const scrapeLoop = async () => {
    await paced(5000, async () => {
      try {
        await getJson(proxy.base, '/metrics');
        lastStats = await getJson(proxy.base, '/api/stats');
        cur.scrapes++;
      } catch (e) {
        fail('admin scrape', e);
      }
    });
  };

  // ---- sampling
  const samples = [];
  const minutes = [];
  const backlogOf = (st) => (st && st.outbox ? Number(st.outbox.pending) + Number(st.outbox.running) : NaN);
  const sample = async () => {
    const p = procStatus(proxy.child.pid);
    let st = null;
    try {
      st = await getJson(proxy.base, '/api/stats');
    } catch (e) {
      fail('stats sample', e);
    }
    const events = await outboxEvents.estimatedDocumentCount().catch(() => NaN);
    const s = { t: Date.now() - t0, ...p, backlog: backlogOf(st), dead: st && st.outbox ? Number(st.outbox.dead) : NaN, events,
      connections: st ? st.proxy.connections : NaN, published: st ? st.publishing.eventsPublished : NaN };
    samples.push(s);
    return s;
  };
  const doubleCpuMs = () => (up.real ? 0 : procStatus(up.pid).cpuMs);
  let prev = { cpuMs: procStatus(proxy.child.pid).cpuMs, dbl: doubleCpuMs(), self: process.cpuUsage(), t: Date.now(), connsAccepted: 0 };
  const minuteLine = (s) => {
    const now = Date.now();
    const self = process.cpuUsage(prev.self);
    const accepted = lastStats ? lastStats.proxy.connectionsAccepted : 0;
    const m = {
      minute: minutes.length + 1,
      rssMiB: +(s.rssKiB / 1024).toFixed(2),
      fds: s.fds,
      backlog: s.backlog,
      storedEvents: s.events,
      p50Ms: +pct(cur.lat, 50).toFixed(2),
      p99Ms: +pct(cur.lat, 99).toFixed(2),
      requests: cur.requests,
      events: cur.txCommitted,
      aborted: cur.txAborted,
      shortClients: cur.shortConns,
      connectionsAccepted: accepted - prev.connsAccepted,
      proxyCpuPct: +((100 * (s.cpuMs - prev.cpuMs)) / (now - prev.t)).toFixed(1),
      loadCpuPct: +((100 * (self.user + self.system) / 1000) / (now - prev.t)).toFixed(1),
      doubleCpuPct: up.real ? null : +((100 * (doubleCpuMs() - prev.dbl)) / (now - prev.t)).toFixed(1),
      loadavg1: +require('node:os').loadavg()[0].toFixed(2),
      errors: errors.n,
    };
    prev = { cpuMs: s.cpuMs, dbl: doubleCpuMs(), self: process.cpuUsage(), t: now, connsAccepted: accepted };
    Object.assign(cur, { lat: [], requests: 0, txCommitted: 0, txAborted: 0, shortConns: 0, scrapes: 0 });
    minutes.push(m);
    console.log(`min ${String(m.minute).padStart(3)}  rss ${m.rssMiB.toFixed(1)} MiB  fds ${m.fds}  backlog ${m.backlog}  ` +
      `stored ${m.storedEvents}  p99 ${m.p99Ms} ms  req ${m.requests}  events ${m.events}/${m.aborted} aborted  ` +
      `conns ${m.connectionsAccepted}  cpu proxy ${m.proxyCpuPct}% load ${m.loadCpuPct}%` +
      `${up.real ? '' : ` double ${m.doubleCpuPct}%`}  loadavg ${m.loadavg1}  errors ${m.errors}`);
  };

  const loads = [0, 1, 2, 3].map((w) => crudWorker(w));
  loads.push(txnLoop(), shortLoop(), scrapeLoop());
  const sampler = (async () => {
    let k = 0;
    while (Date.now() < until && running) {
      await H.sleep(Math.max(0, t0 + (k + 1) * SAMPLE_MS - Date.now()));
      if (proxy.exitInfo()) throw new Error(`the proxy exited: ${JSON.stringify(proxy.exitInfo())}\n${proxy.log().slice(-3000)}`);
      k++;
      const s = await sample();
      if (k % (60000 / SAMPLE_MS) === 0) minuteLine(s);
    }
  })();
  try {
    await sampler;
  } finally {
    running = false;
    await Promise.all(loads);
  }

  // ---- the end: the backlog drains, every committed event reached the sink, none aborted
  const drainStart = Date.now();
  let backlogAfter = NaN;
  let dead = NaN;
  while (Date.now() - drainStart < 60000) {
    const st = await getJson(proxy.base, '/api/stats').catch(() => null);
    backlogAfter = backlogOf(st);
    dead = st && st.outbox ? Number(st.outbox.dead) : NaN;
    const st2 = sink.stats();
    if (backlogAfter === 0 && [...committed].every((id) => st2.ok.has(id))) break;
    await H.sleep(500);
  }
  const drainMs = Date.now() - drainStart;
  const st = sink.stats();
  const end = {
    backlogAfter, drainMs, dead,
    committed: committed.size,
    missing: [...committed].filter((id) => !st.ok.has(id)).length,
    aborted: aborted.size,
    abortedDelivered: [...aborted].filter((id) => st.ok.has(id)).length,
    badSignatures: st.badSignatures,
    seqViolations: st.seqViolations.length,
    duplicates: sink.duplicates(),
    errors: errors.n,
    firstErrors: errors.first,
  };
  const warmSamples = Math.max(Math.ceil((0.1 * durationMs) / SAMPLE_MS), 60000 / SAMPLE_MS);
  const warmMinutes = Math.max(Math.ceil(0.1 * minutes.length), 1);
  const verdict = judge(samples, minutes, warmSamples, warmMinutes, end);

  // ---- report
  const base = path.join(outDir, `soak-${stamp}`);
  const head = await (async () => {
    try {
      return require('node:child_process').execFileSync('git', ['-C', REPO, 'rev-parse', '--short', 'HEAD'], { encoding: 'utf8' }).trim();
    } catch {
      return '?';
    }
  })();
  const meta = { date: new Date(t0).toISOString(), durationMs, commit: head, bin, upstream: up.real ? 'MONGODB_URI' : 'server double',
    loadavgAtEnd: require('node:os').loadavg(), rules: verdict, end };
  fs.writeFileSync(`${base}.json`, JSON.stringify({ meta, minutes, samples }, null, 1));
  const cols = Object.keys(minutes[0] || {});
  fs.writeFileSync(`${base}.csv`, [cols.join(','), ...minutes.map((m) => cols.map((c) => m[c]).join(','))].join('\n') + '\n');
  const md = [
    `Soak of ${(durationMs / 60000).toFixed(0)} min on ${meta.date.slice(0, 16).replace('T', ' ')} UTC, commit ${head}, ${meta.upstream}.`,
    '',
    '| minute | RSS (MiB) | fds | backlog | stored events | CRUD p99 (ms) | requests | events | connections | proxy CPU |',
    '|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|',
    ...minutes.map((m) => `| ${m.minute} | ${m.rssMiB.toFixed(1)} | ${m.fds} | ${m.backlog} | ${m.storedEvents} | ${m.p99Ms.toFixed(2)} | ` +
      `${m.requests} | ${m.events} | ${m.connectionsAccepted} | ${m.proxyCpuPct}% |`),
    '',
    '| rule | result | detail |',
    '|---|---|---|',
    ...verdict.map((r) => `| ${r.series} | ${r.ok ? 'pass' : '**FAIL**'} | ${r.detail} |`),
    '',
  ].join('\n');
  fs.writeFileSync(`${base}.md`, md);
  console.log(`\n${md}`);
  console.log(`soak: results in ${base}.{json,csv,md}`);

  await stopAll();
  if (up.real) {
    const c = await new MongoClient(up.directUri).connect();
    await c.db(outboxDb).dropDatabase().catch(() => {});
    await c.db(appDb).dropDatabase().catch(() => {});
    await c.close();
  }
  const broken = verdict.filter((r) => !r.ok);
  if (broken.length) {
    for (const r of broken) console.log(`soak: FAIL ${r.series}: ${r.detail}`);
    process.exit(1);
  }
  console.log('soak: pass');
  process.exit(0);
}

main().catch((e) => {
  console.error(`soak: ${e.stack || e}`);
  process.exitCode = 1;
  // The exit hooks of the helpers kill the double and the proxy.
  setTimeout(() => process.exit(1), 100);
});
