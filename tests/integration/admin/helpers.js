'use strict';
// Helpers of the admin-port tests: start a proxy with the admin port on port 0 (the real port is
// read back from the log line "admin: listening on HOST:PORT"), optionally dispatching to
// webhook handlers; speak HTTP to it; publish outbox events the way the publishing path writes
// them (reused from the dispatch tests).

const fs = require('node:fs');
const http = require('node:http');
const net = require('node:net');
const path = require('node:path');
const { spawn } = require('node:child_process');
const { tmpDir, freePort, sleep, proxyBin, assertNoSanitizerReports } = require('../lib/proxy');
const H = require('../lib/proxy');
const { publish, waitFor, laneId, TEST_RETRY_SCHEDULE } = require('../dispatch/helpers');

/**
 * Starts relaybus-proxy with [admin] listen = 127.0.0.1:0.
 * @param {object} o
 * @param {string} o.upstream
 * @param {string} [o.token]        [admin] token
 * @param {boolean} [o.dispatch]    [dispatch] enabled (default true when handlers are given)
 * @param {object} [o.dispatchKeys] extra [dispatch] keys
 * @param {object} [o.outbox]       [outbox] keys
 * @param {object} [o.admin]        extra [admin] keys (tls_cert_file, ...)
 * @param {Array<object>} [o.handlers] {name, events, kind, url, ...}
 */
async function startAdminProxy(o) {
  const dir = tmpDir('relaybus-admin-');
  const port = await freePort();
  const handlers = o.handlers || [];
  const lines = ['[proxy]', `listen = 127.0.0.1:${port}`, `upstream = ${o.upstream}`, 'drain_timeout_ms = 2000',
    `threads = ${H.proxyThreads()}`,
    `log_level = ${o.logLevel || 'info'}`, '', '[outbox]'];
  for (const [k, v] of Object.entries(H.outboxKeys(o.outbox))) lines.push(`${k} = ${v}`);
  lines.push('', '[dispatch]', `enabled = ${o.dispatch ?? handlers.length > 0}`);
  for (const [k, v] of Object.entries(o.dispatchKeys || { poll_interval_ms: 100 })) lines.push(`${k} = ${v}`);
  lines.push('', '[admin]', `listen = ${o.adminListen || '127.0.0.1:0'}`, `token = ${o.token || ''}`);
  for (const [k, v] of Object.entries(o.admin || {})) lines.push(`${k} = ${v}`);
  for (const h of handlers) {
    lines.push('', `[handler ${h.name}]`);
    for (const [k, v] of Object.entries({ retry_schedule: TEST_RETRY_SCHEDULE, ...h }))
      if (k !== 'name' && v !== undefined) lines.push(`${k} = ${v}`);
  }
  const ini = path.join(dir, 'proxy.ini');
  fs.writeFileSync(ini, lines.join('\n') + '\n');
  const logPath = path.join(dir, 'proxy.stderr');
  const errFd = fs.openSync(logPath, 'a');
  const env = { ...process.env };
  if (!env.ASAN_OPTIONS) env.ASAN_OPTIONS = 'abort_on_error=0:detect_leaks=1';
  if (!env.UBSAN_OPTIONS) env.UBSAN_OPTIONS = 'print_stacktrace=1';
  const child = spawn(proxyBin(), ['-c', ini], { stdio: ['ignore', 'ignore', errFd], env });
  fs.closeSync(errFd);
  let exitInfo = null;
  const exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve((exitInfo = { code, signal }))));
  process.on('exit', () => { if (!exitInfo) try { child.kill('SIGKILL'); } catch { /* gone */ } });
  const log = () => { try { return fs.readFileSync(logPath, 'utf8'); } catch { return ''; } };
  const deadline = Date.now() + 20000;
  let adminPort = null;
  while (!/relaybus-proxy \S+ listening on/.test(log()) || !adminPort) {
    const m = /admin: listening on 127\.0\.0\.1:(\d+)/.exec(log());
    if (m) adminPort = Number(m[1]);
    if (exitInfo) throw new Error(`proxy exited at start-up: ${JSON.stringify(exitInfo)}\n${log()}`);
    if (Date.now() > deadline) throw new Error(`proxy not listening in time:\n${log()}`);
    await sleep(50);
  }
  return {
    port, adminPort, child, ini, log, exited, dir,
    base: `http://127.0.0.1:${adminPort}`,
    exitInfo: () => exitInfo,
    uri: () => `mongodb://127.0.0.1:${port}/?directConnection=true`,
    /** SIGTERM; resolves {code, signal}; throws if it does not exit within 15 s. */
    async stop() {
      if (!exitInfo) child.kill('SIGTERM');
      const r = await H.within(exited, 15000, null);
      if (!r) { child.kill('SIGKILL'); await exited; throw new Error(`proxy did not stop after SIGTERM:\n${log().slice(-3000)}`); }
      assertNoSanitizerReports(log(), `proxy ${ini}`);
      return r;
    },
    async kill() { if (!exitInfo) { child.kill('SIGKILL'); await exited; } },
  };
}

/**
 * One HTTP request. opts: {method, token, json (object, sent as JSON), body (string/Buffer),
 * headers, timeoutMs}. Resolves {status, headers, text, json (parsed when JSON)}.
 */
function request(base, urlPath, opts = {}) {
  return new Promise((resolve, reject) => {
    const u = new URL(urlPath, base);
    const headers = { ...(opts.headers || {}) };
    let body = opts.body;
    if (opts.json !== undefined) {
      body = JSON.stringify(opts.json);
      headers['content-type'] = headers['content-type'] || 'application/json';
    }
    if (opts.token) headers.authorization = `Bearer ${opts.token}`;
    if (body !== undefined) headers['content-length'] = Buffer.byteLength(body);
    const req = http.request({ host: u.hostname, port: u.port, path: u.pathname + u.search, method: opts.method || 'GET', headers, agent: false },
      (res) => {
        const chunks = [];
        res.on('data', (c) => chunks.push(c));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          let json;
          if (/json/.test(res.headers['content-type'] || '')) {
            try { json = JSON.parse(text); } catch { /* left undefined */ }
          }
          resolve({ status: res.statusCode, headers: res.headers, text, json });
        });
      });
    req.setTimeout(opts.timeoutMs || 15000, () => req.destroy(new Error(`${urlPath}: no answer within ${opts.timeoutMs || 15000} ms`)));
    req.on('error', reject);
    if (body !== undefined) req.write(body);
    req.end();
  });
}

/** Sends raw bytes on a fresh TCP connection; resolves with everything read until the peer closes (or timeout). */
function rawExchange(port, bytes, { timeoutMs = 10000 } = {}) {
  return new Promise((resolve) => {
    const sock = net.connect({ host: '127.0.0.1', port });
    const chunks = [];
    const t0 = Date.now();
    const timer = setTimeout(() => { sock.destroy(); resolve({ closedByPeer: false, text: Buffer.concat(chunks).toString('latin1'), ms: Date.now() - t0 }); }, timeoutMs);
    sock.on('connect', () => { if (bytes) sock.write(bytes); });
    sock.on('data', (c) => chunks.push(c));
    sock.on('error', () => {});
    sock.on('close', () => { clearTimeout(timer); resolve({ closedByPeer: true, text: Buffer.concat(chunks).toString('latin1'), ms: Date.now() - t0 }); });
  });
}

// The proxy's log reaches the test through a pipe, which node may read
// after the HTTP answer that followed the line: wait for the line (a
// string or a RegExp), and fail with the log's tail if it never comes.
async function logShows(proxy, want, timeoutMs = 10000) {
  const has = () => (typeof want === 'string' ? proxy.log().includes(want) : want.test(proxy.log()));
  const deadline = Date.now() + timeoutMs;
  while (!has()) {
    if (Date.now() > deadline) throw new Error(`the proxy's log does not show ${want}:\n${proxy.log().slice(-3000)}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

module.exports = { startAdminProxy, request, rawExchange, publish, waitFor, laneId, logShows };
