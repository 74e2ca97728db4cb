'use strict';
// Helpers of the dispatch end-to-end tests: start a dispatching proxy with
// handlers (the shared harness starts proxies with dispatch off), and publish
// events the way the publishing path does: the event, one delivery per
// handler and the key's sequence, in one transaction (docs/outbox-schema.md).

const crypto = require('node:crypto');
const fs = require('node:fs');
const http = require('node:http');
const path = require('node:path');
const { spawn } = require('node:child_process');
const { ObjectId, MongoClient } = require('mongodb');
const { Webhook } = require('standardwebhooks');
const { tmpDir, freePort, sleep, within, proxyBin, startUpstream } = require('../lib/proxy');
const H = require('../lib/proxy');

const { fnv1a, laneDocId } = H;
const laneId = (key, eventId) => fnv1a(key !== undefined && key !== null ? key : eventId) % 256;

// Handlers of the suites retry fast: the delays double from 0.5 s (nine of
// them, so ten attempts) unless a test gives its own retry_schedule; the
// proxy's default schedule spans more than a day.
const TEST_RETRY_SCHEDULE = '500ms, 1s, 2s, 4s, 8s, 16s, 32s, 64s, 128s';

/**
 * Starts relaybus-proxy with [dispatch] enabled and the given handlers.
 * @param {object} o
 * @param {string} o.upstream
 * @param {object} [o.dispatch]  extra [dispatch] keys (poll_interval_ms, batch_size, lease_ms)
 * @param {object} [o.outbox]    extra [outbox] keys
 * @param {boolean} [o.enabled]  false: a publishing-only proxy (handlers listed, no dispatch)
 * @param {object} [o.env]       extra environment (SSL_CERT_FILE...)
 * @param {string} [o.adminListen] [admin] listen (default: empty, no admin port)
 * @param {number} [o.threads] [proxy] threads (default: RELAYBUS_PROXY_THREADS, else 1)
 * @param {object} [o.proxy]   extra [proxy] keys (pool_mode, pool_size, ...)
 * @param {Array<object>} o.handlers  {name, events, kind, url, secret, retry_schedule, max_attempts, timeout_ms, concurrency, retry_4xx}
 *        (retry_schedule: TEST_RETRY_SCHEDULE unless given; undefined leaves the proxy's default)
 */
async function startDispatchProxy(o) {
  const dir = tmpDir('relaybus-dispatch-');
  const port = await freePort();
  const lines = ['[proxy]', `listen = 127.0.0.1:${port}`, `upstream = ${o.upstream}`, 'drain_timeout_ms = 2000',
    `threads = ${o.threads ?? H.proxyThreads()}`,
    `log_level = ${o.logLevel || 'info'}`];
  for (const [k, v] of Object.entries(o.proxy || {})) lines.push(`${k} = ${v}`);
  lines.push('', '[outbox]');
  for (const [k, v] of Object.entries(H.outboxKeys(o.outbox))) lines.push(`${k} = ${v}`);
  lines.push('', '[dispatch]', `enabled = ${o.enabled === false ? 'false' : 'true'}`);
  for (const [k, v] of Object.entries(o.dispatch || {})) lines.push(`${k} = ${v}`);
  // The admin port: off unless asked for (several proxies run at once).
  lines.push('', '[admin]', `listen = ${o.adminListen || ''}`);
  for (const h of o.handlers) {
    lines.push('', `[handler ${h.name}]`);
    for (const [k, v] of Object.entries({ retry_schedule: TEST_RETRY_SCHEDULE, ...h }))
      if (k !== 'name' && v !== undefined) lines.push(`${k} = ${v}`);
  }
  const ini = path.join(dir, 'proxy.ini');
  fs.writeFileSync(ini, lines.join('\n') + '\n');
  const logPath = path.join(dir, 'proxy.stderr');
  const errFd = fs.openSync(logPath, 'a');
  const env = { ...process.env, ...(o.env || {}) };
  if (!env.ASAN_OPTIONS) env.ASAN_OPTIONS = 'abort_on_error=0:detect_leaks=1';
  const child = spawn(proxyBin(), ['-c', ini], { stdio: ['ignore', 'ignore', errFd], env });
  fs.closeSync(errFd);
  let exitInfo = null;
  const exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve((exitInfo = { code, signal }))));
  process.on('exit', () => { if (!exitInfo) try { child.kill('SIGKILL'); } catch { /* gone */ } });
  const log = () => { try { return fs.readFileSync(logPath, 'utf8'); } catch { return ''; } };
  const deadline = Date.now() + 20000;
  while (!/listening on/.test(log())) {
    if (exitInfo) throw new Error(`proxy exited at start-up: ${JSON.stringify(exitInfo)}\n${log()}`);
    if (Date.now() > deadline) throw new Error(`proxy not listening in time:\n${log()}`);
    await sleep(50);
  }
  return {
    port, child, ini, log, exited,
    exitInfo: () => exitInfo,
    async stop() {
      if (!exitInfo) child.kill('SIGTERM');
      const r = await within(exited, 15000, null);
      if (!r) { child.kill('SIGKILL'); await exited; throw new Error(`proxy did not stop after SIGTERM:\n${log().slice(-3000)}`); }
      // A sanitizer build reports leaks and errors on stderr at exit.
      const bad = log().split('\n').find((l) => /AddressSanitizer|LeakSanitizer|runtime error:/.test(l));
      if (bad) throw new Error(`sanitizer report in the proxy log: ${bad}\n${log().slice(-6000)}`);
      return r;
    },
    async kill() { if (!exitInfo) { child.kill('SIGKILL'); await exited; } },
  };
}

/**
 * Publishes events in transactions, as the proxy's publishing path would.
 * @param {import('mongodb').MongoClient} client
 * @param {string} dbName
 * @param {Array<{id, type, key?, payload}>} events
 * @param {string[]} handlers  handler names subscribed to every event
 * @param {number} [perTxn]
 */
async function publish(client, dbName, events, handlers, perTxn = 20) {
  const db = client.db(dbName);
  const ev = db.collection('relaybus_events');
  const del = db.collection('relaybus_deliveries');
  const seqs = db.collection('relaybus_key_sequences');
  for (let i = 0; i < events.length; i += perTxn) {
    const chunk = events.slice(i, i + perTxn);
    const session = client.startSession();
    try {
      await session.withTransaction(async () => {
        const now = new Date();
        const evDocs = [];
        const delDocs = [];
        for (const e of chunk) {
          let sequence;
          if (e.key !== undefined) {
            const r = await seqs.findOneAndUpdate({ _id: e.key }, { $inc: { value: 1 } },
              { upsert: true, returnDocument: 'after', session });
            sequence = Number((r && r.value !== undefined && r.value !== null && typeof r.value === 'object' && 'value' in r.value) ? r.value.value : r.value);
          }
          e.sequence = sequence;
          const doc = { _id: e.id, type: e.type, payload: e.payload ?? null, handlers, createdAt: now };
          if (e.key !== undefined) { doc.key = e.key; doc.sequence = sequence; }
          evDocs.push(doc);
          for (const h of handlers) {
            const d = { _id: new ObjectId(), eventId: e.id, handler: h, eventType: e.type, laneId: laneId(e.key, e.id),
              lane: 'ready', status: 'pending', attempts: 0, claims: 0, dueAt: now, createdAt: now };
            if (e.key !== undefined) { d.key = e.key; d.sequence = sequence; }
            delDocs.push(d);
          }
        }
        await ev.insertMany(evDocs, { session });
        await del.insertMany(delDocs, { session });
      });
    } finally {
      await session.endSession();
    }
  }
}

/**
 * Publishes through a proxy: each event annotates an insert into `items`
 * inside a transaction (the publishing path writes the outbox).
 * @param {import('mongodb').MongoClient} client  connected to the proxy
 */
async function publishThroughProxy(client, dbName, events, perTxn = 10) {
  const items = client.db(dbName).collection('items');
  for (let i = 0; i < events.length; i += perTxn) {
    const chunk = events.slice(i, i + perTxn);
    const session = client.startSession();
    try {
      await session.withTransaction(async () => {
        for (const e of chunk) {
          const relaybus = { type: e.type, id: e.id, payload: e.payload };
          if (e.key !== undefined) relaybus.key = e.key;
          await items.insertOne({ _id: e.id }, { session, comment: { relaybus } });
        }
      });
    } finally {
      await session.endSession();
    }
  }
}

async function waitFor(pred, timeoutMs, what) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await pred()) return;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

const newSecret = () => `whsec_${crypto.randomBytes(32).toString('base64')}`;

// A receiver that keeps what the verifier needs: the raw body bytes and
// the three Standard Webhooks headers of each request.  It answers 204.
async function startReceiver() {
  const requests = [];
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks).toString('utf8');
      requests.push({
        path: req.url,
        id: JSON.parse(body).id,
        body,
        headers: {
          'webhook-id': req.headers['webhook-id'],
          'webhook-timestamp': req.headers['webhook-timestamp'],
          'webhook-signature': req.headers['webhook-signature'],
        },
      });
      res.writeHead(204).end();
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    requests,
    url: (p) => `http://127.0.0.1:${server.address().port}${p}`,
    close: () => new Promise((resolve) => { server.closeAllConnections?.(); server.close(() => resolve()); }),
  };
}

const verifies = (secret, body, headers) => {
  try {
    new Webhook(secret).verify(body, headers);
    return true;
  } catch {
    return false;
  }
};

/**
 * An upstream (the double, or scripts/test --upstream's deployment) and a failCommand switch on it:
 * `fp(mode, data)` configures the fail point.  Null when the upstream has no
 * fail points (a real server without enableTestCommands): the test is
 * skipped with the reason.  Everything is stopped after the test.
 */
async function upstreamWithFailPoints(t) {
  const up = await startUpstream();
  t.after(() => up.stop());
  const admin = await new MongoClient(up.uri).connect();
  t.after(() => admin.close());
  const fp = (mode, data) => admin.db('admin').command({ configureFailPoint: 'failCommand', mode, data });
  try {
    await fp('off', {});
  } catch (e) {
    t.skip(`the upstream has no failCommand fail point (${e.message}); a real server needs enableTestCommands`);
    return null;
  }
  return { up, admin, fp };
}

module.exports = { upstreamWithFailPoints, fnv1a, laneId, laneDocId, startDispatchProxy, publish, publishThroughProxy, waitFor, TEST_RETRY_SCHEDULE, newSecret, startReceiver, verifies };
