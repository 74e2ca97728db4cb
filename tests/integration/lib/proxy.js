'use strict';
// Integration-test harness for relaybus-proxy: starts the MongoDB server double (or uses the
// deployment `scripts/test --upstream URI` names, RELAYBUS_TEST_UPSTREAM), starts the proxy in
// front of it on a free port with a
// temporary INI file, speaks the raw wire protocol for tests that need byte-level control, and
// offers a transparent TCP tap that records which opcodes and compressors crossed a connection.
//
// Everything here is a test helper: it asserts what a harness can check on its own (the proxy
// came up and answers a hello, exits 0 on SIGTERM within a deadline, logged no sanitizer report)
// and leaves the protocol checks to the tests.

const assert = require('node:assert/strict');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const zlib = require('node:zlib');
const { spawn } = require('node:child_process');
const { BSON } = require('bson');

const REPO = path.resolve(__dirname, '..', '..', '..');
const DOUBLE_BIN = path.join(REPO, 'tests', 'mongod-double', 'mongod-double');

const OP_REPLY = 1;
const OP_QUERY = 2004;
const OP_COMPRESSED = 2012;
const OP_MSG = 2013;
const COMPRESSOR_IDS = { noop: 0, snappy: 1, zlib: 2, zstd: 3 };

const SANITIZER_MARKERS = ['AddressSanitizer', 'runtime error:', 'LeakSanitizer'];

function proxyBin() {
  return process.env.RELAYBUS_PROXY_BIN || path.join(REPO, 'relaybus-proxy');
}

/**
 * The real deployment a run of `scripts/test --upstream URI` tests against (tests/upstream/run
 * sets RELAYBUS_TEST_UPSTREAM, and RELAYBUS_TEST_DB, the one database the run may work in), or
 * null: the tests start the server double. Never MONGODB_URI: that is scripts/run's upstream and
 * an application's, and an exported one must not turn a test run against a real server.
 */
function realUpstreamUri() {
  return process.env.RELAYBUS_TEST_UPSTREAM || null;
}

/** The run's database against a real upstream (tests/upstream/run creates and drops it), or null. */
function upstreamTestDb() {
  if (!realUpstreamUri()) return null;
  const db = process.env.RELAYBUS_TEST_DB || '';
  assert.match(db, /^relaybus_test_[A-Za-z0-9_]+$/,
    'RELAYBUS_TEST_UPSTREAM without RELAYBUS_TEST_DB: run the tests against a real deployment with scripts/test --upstream URI');
  return db;
}

/**
 * The database a test names `name`: that name against the double, the run's database against a
 * real upstream, where everything a test writes (its data and the outbox) lives in it.
 */
function dbName(name) {
  return upstreamTestDb() || name;
}

/**
 * [outbox] keys for a proxy: `keys`, with `database` the run's database against a real upstream
 * (the proxies' set-up creates the outbox collections there, not in the default `relaybus`).
 */
function outboxKeys(keys = {}) {
  const db = upstreamTestDb();
  if (!db) return keys;
  assert.equal(keys.database ?? db, db, 'against a real upstream the outbox lives in the run\'s database');
  return { ...keys, database: db };
}

/** INI text with `[outbox] database` set as outboxKeys() sets it (added to its [outbox] section, or as one). */
function withOutboxDb(ini = '') {
  const db = upstreamTestDb();
  if (!db) return ini;
  const lines = ini.split('\n');
  const at = lines.findIndex((l) => /^\s*\[outbox\]\s*$/.test(l));
  if (at < 0) return `${ini}\n[outbox]\ndatabase = ${db}\n`;
  let end = lines.findIndex((l, i) => i > at && /^\s*\[/.test(l));
  if (end < 0) end = lines.length;
  const set = lines.slice(at + 1, end).find((l) => /^\s*database\s*=/.test(l));
  if (set) {
    assert.equal(set.split('=')[1].trim(), db, 'against a real upstream the outbox lives in the run\'s database');
    return ini;
  }
  lines.splice(at + 1, 0, `database = ${db}`);
  return lines.join('\n');
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/**
 * `promise`, or `onTimeout` once `ms` passed first. The timer is cleared either way: a
 * pending one keeps the test process alive after its last test (node's runner waits for the
 * process of each file to exit), which is what a race against sleep(ms) did, up to ms.
 */
async function within(promise, ms, onTimeout = null) {
  let timer;
  const lapse = new Promise((resolve) => { timer = setTimeout(() => resolve(onTimeout), ms); });
  try {
    return await Promise.race([promise, lapse]);
  } finally {
    clearTimeout(timer);
  }
}

function tmpDir(prefix = 'relaybus-it-') {
  return fs.mkdtempSync(path.join(os.tmpdir(), prefix));
}

/**
 * A database name unique to this test run; against a real upstream, the run's one database (each
 * test file finds it empty: tests/upstream/run empties it between files).
 */
function uniqueDbName(tag) {
  const db = upstreamTestDb();
  if (db) return db;
  const rnd = Math.random().toString(36).slice(2, 8);
  return `rbit_${tag}_${process.pid}_${rnd}`.replace(/[^A-Za-z0-9_]/g, '_').slice(0, 60);
}

// Ports the tests listen on come from below the kernel's ephemeral range
// (ip_local_port_range, 32768-60999 by default), where no outgoing
// connection and no listen(0) can take them: a broker or a server that is
// stopped and started again on its port (the outage tests), or that binds
// seconds after the port was chosen (rabbitmq-server), finds it still free
// however many connections the other processes open meanwhile.
const PORT_LOW = 20000;
const PORT_HIGH = 32767;

function tryListen(port, host) {
  return new Promise((resolve) => {
    const srv = net.createServer();
    srv.unref();
    srv.once('error', () => resolve(null));
    srv.listen({ port, host, exclusive: true }, () => {
      const got = srv.address().port;
      srv.close(() => resolve(got));
    });
  });
}

/** A port free on `host` now, outside the ephemeral range when one is. */
async function freePort(host = '127.0.0.1') {
  for (let i = 0; i < 200; i++) {
    const port = await tryListen(PORT_LOW + Math.floor(Math.random() * (PORT_HIGH - PORT_LOW + 1)), host);
    if (port) return port;
  }
  const port = await tryListen(0, host);
  if (!port) throw new Error(`no free port on ${host}`);
  return port;
}

/** Spawns argv, optionally through `bash -c 'ulimit -n N; exec ...'`, stdout/stderr as given. */
function spawnMaybeUlimit(argv, { ulimit, stdio, env }) {
  if (ulimit) {
    // Root may raise the hard limit; anyone else falls back to the hard limit.
    const script = `ulimit -n ${ulimit} 2>/dev/null || ulimit -n "$(ulimit -Hn)"; exec "$@"`;
    return spawn('bash', ['-c', script, 'bash', ...argv], { stdio, env });
  }
  return spawn(argv[0], argv.slice(1), { stdio, env });
}

function waitExit(child, ms) {
  if (child.exitCode !== null || child.signalCode !== null) {
    return Promise.resolve({ code: child.exitCode, signal: child.signalCode, timedOut: false });
  }
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      child.removeListener('exit', onExit);
      resolve({ code: null, signal: null, timedOut: true });
    }, ms);
    function onExit(code, signal) {
      clearTimeout(timer);
      resolve({ code, signal, timedOut: false });
    }
    child.once('exit', onExit);
  });
}

// ---------------------------------------------------------------------------- the server double

/**
 * Starts tests/mongod-double/mongod-double on a free port, through the shared helper
 * tests/integration/lib/double.js; only when the fd limit must be raised (`ulimit`) it is
 * spawned here, through `bash -c 'ulimit -n N; exec ...'`.
 * opts: { args: [...extra flags], standalone, auth: 'USER:PASSWORD', ulimit,
 *         sharded: {shards, mongos} (a cluster: `mongos` and `shards` list its ports),
 *         allowProxyErrors: {appName: [codes]} (parse errors the test makes the proxy's own
 *         connections get on purpose; stop() fails on any other: double.js) }
 * Returns { port, uri (for the proxy's upstream, with replicaSet=rs0 unless standalone),
 *           directUri (straight to the double, with credentials), pid, log(), stop() }.
 */
async function startDouble(opts = {}) {
  const rs = opts.standalone || opts.sharded ? '' : '?replicaSet=rs0';
  if (!opts.ulimit) {
    const shared = require('./double.js');
    const d = await shared.startDouble({
      auth: opts.auth, standalone: opts.standalone, args: opts.args, sharded: opts.sharded, allowProxyErrors: opts.allowProxyErrors,
      record: opts.record,
    });
    // A cluster's URI is the seed list of its mongos routers (no replicaSet).
    const hosts = opts.sharded ? d.mongos.map((p) => `127.0.0.1:${p}`).join(',') : `127.0.0.1:${d.port}`;
    return {
      kind: 'double',
      real: false,
      port: d.port,
      pid: d.pid,
      mongos: d.mongos,
      shards: d.shards,
      uri: `mongodb://${hosts}/${rs}`,
      directUri: d.uri,
      log: () => d.stderr(),
      stop: () => d.stop(),
    };
  }
  const dir = tmpDir('relaybus-double-');
  const logPath = path.join(dir, 'double.stderr');
  const args = ['--port', '0'];
  if (opts.auth) args.push('--auth', opts.auth);
  if (opts.standalone) args.push('--standalone');
  if (opts.args) args.push(...opts.args);
  const errFd = fs.openSync(logPath, 'a');
  const child = spawnMaybeUlimit([DOUBLE_BIN, ...args], {
    ulimit: opts.ulimit,
    stdio: ['ignore', 'pipe', errFd],
    env: process.env,
  });
  fs.closeSync(errFd);
  process.on('exit', () => {
    try {
      child.kill('SIGKILL');
    } catch {
      /* gone */
    }
  });
  let stdout = '';
  const port = await new Promise((resolve, reject) => {
    let buf = '';
    let settled = false;
    const timer = setTimeout(() => finish(new Error('mongod-double printed no port within 20 s')), 20000);
    function finish(err, value) {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      if (err) reject(err);
      else resolve(value);
    }
    child.stdout.setEncoding('utf8');
    child.stdout.on('data', (chunk) => {
      stdout += chunk;
      if (settled) return;
      buf += chunk;
      const nl = buf.indexOf('\n');
      if (nl < 0) return;
      const m = /(\d{2,5})\s*$/.exec(buf.slice(0, nl).trim());
      const p = m ? Number(m[1]) : NaN;
      if (p > 0 && p < 65536) finish(null, p);
      else finish(new Error(`mongod-double's first line is not a port: ${JSON.stringify(buf.slice(0, nl))}`));
    });
    child.on('error', (e) => finish(e));
    child.on('exit', (code, signal) => {
      finish(new Error(`mongod-double exited (code ${code}, signal ${signal}) before printing its port; stderr:\n${tail(safeRead(logPath))}`));
    });
  });
  let cred = '';
  if (opts.auth) {
    const i = opts.auth.indexOf(':');
    cred = `${encodeURIComponent(opts.auth.slice(0, i))}:${encodeURIComponent(opts.auth.slice(i + 1))}@`;
  }
  return {
    kind: 'double',
    real: false,
    port,
    pid: child.pid,
    uri: `mongodb://127.0.0.1:${port}/${rs}`,
    directUri: `mongodb://${cred}127.0.0.1:${port}/${opts.auth ? '?authSource=admin' : ''}`,
    log: () => safeRead(logPath),
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      // As double.js's stop: the proxy's own commands that the double refused fail the test.
      const { checkProxyParseErrors, commandPorts } = require('./double.js');
      let refused = null;
      await checkProxyParseErrors({
        ports: commandPorts(stdout), auth: opts.auth, args: opts.args || [], allow: opts.allowProxyErrors, log: safeRead(logPath),
      }).catch((e) => { refused = e; });
      child.kill('SIGTERM');
      const r = await waitExit(child, 5000);
      if (r.timedOut) {
        child.kill('SIGKILL');
        await waitExit(child, 5000);
      }
      if (refused) throw refused;
    },
  };
}

/** An upstream that is a deployment the tests did not start (its URI), as startUpstream returns it. */
function externalUpstream(uri) {
  return { kind: 'real', real: true, uri, directUri: uri, port: null, async stop() {}, log: () => '' };
}

/**
 * The upstream for a test: the real deployment of `scripts/test --upstream` (RELAYBUS_TEST_UPSTREAM),
 * its run's database emptied, when set, else a fresh double. Tests that need a double-only feature pass { requireDouble: true }
 * and call skipUnlessDouble.
 */
async function startUpstream(opts = {}) {
  const real = realUpstreamUri();
  if (real && !opts.requireDouble) {
    // Fresh, as a double started now would be: the run's database emptied.
    await require('../../upstream/db').emptyRunDb(real, upstreamTestDb());
    return externalUpstream(real);
  }
  return startDouble(opts);
}

/**
 * For a test needing a double-only feature (a fail point, a step-down, a server parameter, a
 * double's own command): returns a skip message, or null when a double is used.
 */
function doubleOnlySkipReason(feature) {
  if (realUpstreamUri()) return `needs the server double (${feature}); scripts/test --upstream names a real deployment`;
  return null;
}

/**
 * Raw-socket tests speak the wire protocol without authenticating; against a real server whose
 * URI carries credentials their data commands would be refused. Returns a skip message
 * then, or false.
 */
function rawDataSkipReason() {
  const real = realUpstreamUri();
  if (real && /^mongodb(\+srv)?:\/\/[^/@]+@/.test(real)) {
    return 'raw-socket data commands do not authenticate; the upstream URI has credentials';
  }
  return false;
}

// ---------------------------------------------------------------------------- the proxy

function safeRead(p) {
  try {
    return fs.readFileSync(p, 'utf8');
  } catch {
    return '';
  }
}

const startedProxies = [];

/**
 * [proxy] threads for the proxies the tests start: RELAYBUS_PROXY_THREADS
 * (scripts/test runs the proxy folder with 1 and with 4), 1 when unset, so a
 * test sees the same loops on any machine.  A test's own settings.threads wins.
 */
function proxyThreads() {
  const v = process.env.RELAYBUS_PROXY_THREADS;
  if (v === undefined || v === '') return 1;
  assert.ok(/^[0-9]+$/.test(v), `RELAYBUS_PROXY_THREADS must be a number, got ${v}`);
  return Number(v);
}

/**
 * Starts relaybus-proxy against `upstream` (a URI string).
 * opts: {
 *   upstream,                 // required
 *   settings: {key: value},   // extra [proxy] keys (max_clients, message_timeout_ms, ...)
 *   ulimit,                   // raise RLIMIT_NOFILE for the proxy to this value
 *   readyTimeoutMs,           // default 20000
 *   tlsClient: {ca},          // when the proxy serves TLS: how the readiness probe connects
 *   extraIni,                 // text appended to the INI file ([outbox], [handler NAME] sections)
 *   env: {NAME: value},       // extra environment (LD_PRELOAD of a fake clock, ...)
 *   dispatch,                 // true: [dispatch] enabled = true (default false)
 * }
 */
async function startProxy(opts) {
  assert.ok(opts && opts.upstream, 'startProxy needs an upstream URI');
  const bin = proxyBin();
  assert.ok(fs.existsSync(bin), `proxy binary not found at ${bin} (set RELAYBUS_PROXY_BIN or build the tree)`);
  const dir = tmpDir('relaybus-proxy-');
  const socketPath = opts.unixSocket ? path.join(dir, 'proxy.sock') : null;
  const port = socketPath ? null : await freePort();
  const settings = { drain_timeout_ms: 2000, threads: proxyThreads(), ...(opts.settings || {}) };
  const listen = socketPath || `127.0.0.1:${port}`;
  const lines = ['[proxy]', `listen = ${listen}`, `upstream = ${opts.upstream}`];
  for (const [k, v] of Object.entries(settings)) {
    if (v === undefined || v === null) continue;
    lines.push(`${k} = ${v}`);
  }
  // The dispatcher is off unless asked for: most tests look at the outbox the publishing path writes.
  lines.push('', '[dispatch]', `enabled = ${opts.dispatch ? 'true' : 'false'}`, '');
  const extraIni = withOutboxDb(opts.extraIni || '');
  if (extraIni) lines.push(extraIni, '');
  const iniPath = path.join(dir, 'proxy.ini');
  fs.writeFileSync(iniPath, lines.join('\n'));
  const logPath = path.join(dir, 'proxy.stderr');
  const outPath = path.join(dir, 'proxy.stdout');
  const errFd = fs.openSync(logPath, 'a');
  const outFd = fs.openSync(outPath, 'a');
  const env = { ...process.env, ...(opts.env || {}) };
  // Make sanitizer builds write their reports to stderr and fail loudly on exit.
  if (!env.ASAN_OPTIONS) env.ASAN_OPTIONS = 'abort_on_error=0:detect_leaks=1';
  if (!env.UBSAN_OPTIONS) env.UBSAN_OPTIONS = 'print_stacktrace=1';
  const child = spawnMaybeUlimit([bin, '-c', iniPath], {
    ulimit: opts.ulimit,
    stdio: ['ignore', outFd, errFd],
    env,
  });
  fs.closeSync(errFd);
  fs.closeSync(outFd);
  let exitInfo = null;
  const exited = new Promise((resolve) => {
    child.once('exit', (code, signal) => {
      exitInfo = { code, signal };
      resolve(exitInfo);
    });
  });
  child.on('error', () => {});
  process.on('exit', () => {
    if (!exitInfo) {
      try {
        child.kill('SIGKILL');
      } catch {
        /* gone */
      }
    }
  });

  const proxy = {
    host: '127.0.0.1',
    port,
    socketPath,
    pid: child.pid,
    child,
    dir,
    iniPath,
    logPath,
    settings,
    upstream: opts.upstream,
    tls: opts.tlsClient || null,
    stopped: false,
    log: () => safeRead(logPath),
    exitInfo: () => exitInfo,
    /** Client connection string naming the proxy (no replicaSet=); creds copied from a real upstream's URI. */
    uri(params = {}, { db = '', credentials = true } = {}) {
      return clientUri(proxy, params, { db, credentials });
    },
    /** Lines of the log mentioning `needle` (a string). */
    logLines(needle) {
      return proxy.log().split('\n').filter((l) => l.includes(needle));
    },
    /** Waits until a log line matches `re` (and includes `needle` if given). */
    async waitForLog(re, { needle, timeoutMs = 3000 } = {}) {
      const deadline = Date.now() + timeoutMs;
      for (;;) {
        const found = proxy
          .log()
          .split('\n')
          .find((l) => (!needle || l.includes(needle)) && re.test(l));
        if (found) return found;
        if (Date.now() > deadline) return null;
        await sleep(50);
      }
    },
    /** SIGTERM; asserts exit code 0 within drain_timeout_ms + 5 s. Idempotent. */
    async stop() {
      if (proxy.stopped) return exitInfo;
      proxy.stopped = true;
      if (!exitInfo) proxy.terminate();
      const deadlineMs = Number(settings.drain_timeout_ms) + 5000;
      const r = await within(exited, deadlineMs, null);
      if (!r) {
        child.kill('SIGKILL');
        await exited;
        assert.fail(`proxy did not exit within ${deadlineMs} ms of SIGTERM; log tail:\n${tail(proxy.log())}`);
      }
      assert.equal(
        r.signal,
        null,
        `proxy died by signal ${r.signal} instead of exiting after SIGTERM; log tail:\n${tail(proxy.log())}`,
      );
      assert.equal(r.code, 0, `proxy exit code after SIGTERM; log tail:\n${tail(proxy.log())}`);
      return r;
    },
    /** Sends SIGTERM once (a test may start the drain itself, then call stop() to check it). */
    terminate() {
      if (!proxy.sigtermSent && !exitInfo) {
        proxy.sigtermSent = true;
        child.kill('SIGTERM');
      }
    },
    /** Kills without checks (cleanup after a failed test). */
    async kill() {
      proxy.stopped = true;
      if (!exitInfo) {
        child.kill('SIGKILL');
        await exited;
      }
    },
    /** Fails if the log has a sanitizer report. */
    assertNoSanitizerReports() {
      assertNoSanitizerReports(proxy.log(), `proxy ${iniPath}`);
    },
  };
  startedProxies.push(proxy);

  // Ready: accepts connections and a hello through it answers ok: 1.
  const deadline = Date.now() + (opts.readyTimeoutMs || 20000);
  let lastErr = null;
  for (;;) {
    if (exitInfo) {
      throw new Error(
        `proxy exited during start-up (code ${exitInfo.code}, signal ${exitInfo.signal}); log:\n${tail(proxy.log())}`,
      );
    }
    try {
      const conn = await WireConn.connect({ port, path: socketPath, tls: proxy.tls, timeoutMs: 2000 });
      try {
        const reply = await conn.command({ hello: 1, $db: 'admin' }, { timeoutMs: 3000 });
        if (reply.ok === 1) break;
        lastErr = new Error(`hello through the proxy answered ${JSON.stringify(reply)}`);
      } finally {
        conn.destroy();
      }
    } catch (e) {
      lastErr = e;
    }
    if (Date.now() > deadline) {
      await proxy.kill();
      throw new Error(`proxy not ready within the deadline: ${lastErr && lastErr.message}; log:\n${tail(proxy.log())}`);
    }
    await sleep(100);
  }
  return proxy;
}

/**
 * Starts the proxy on a config expected to make it exit by itself (e.g. a standalone upstream);
 * resolves {code, signal, log, timedOut} once it exits or after timeoutMs (then killed).
 */
async function runProxyExpectingExit({ upstream, settings = {}, timeoutMs = 20000 }) {
  const dir = tmpDir('relaybus-proxy-exit-');
  const port = await freePort();
  const lines = ['[proxy]', `listen = 127.0.0.1:${port}`, `upstream = ${upstream}`];
  for (const [k, v] of Object.entries({ threads: proxyThreads(), ...settings })) lines.push(`${k} = ${v}`);
  lines.push('', '[dispatch]', 'enabled = false', '', withOutboxDb());
  const iniPath = path.join(dir, 'proxy.ini');
  fs.writeFileSync(iniPath, lines.join('\n'));
  const logPath = path.join(dir, 'proxy.stderr');
  const errFd = fs.openSync(logPath, 'a');
  const child = spawn(proxyBin(), ['-c', iniPath], { stdio: ['ignore', errFd, errFd] });
  fs.closeSync(errFd);
  const r = await waitExit(child, timeoutMs);
  if (r.timedOut) {
    child.kill('SIGKILL');
    await waitExit(child, 5000);
  }
  return { ...r, port, log: safeRead(logPath), dir };
}

function tail(text, n = 4000) {
  return text.length > n ? '...' + text.slice(-n) : text;
}

function assertNoSanitizerReports(text, what) {
  for (const marker of SANITIZER_MARKERS) {
    const idx = text.indexOf(marker);
    if (idx >= 0) {
      assert.fail(`${what}: log contains "${marker}":\n${text.slice(Math.max(0, idx - 200), idx + 3000)}`);
    }
  }
}

/** Every proxy started by this test file: stops it (asserting exit 0) and scans its log. */
async function stopAllAndCheck() {
  const errors = [];
  for (const p of startedProxies) {
    const before = errors.length;
    try {
      await p.stop();
    } catch (e) {
      errors.push(e);
    }
    try {
      p.assertNoSanitizerReports();
    } catch (e) {
      errors.push(e);
    }
    // A clean proxy's temp dir (INI and log) goes; a failing one's stays for the post-mortem.
    if (errors.length === before && !process.env.RELAYBUS_KEEP_TEST_DIRS) {
      fs.rmSync(p.dir, { recursive: true, force: true });
    } else if (errors.length > before) {
      errors[errors.length - 1].message += `\n(proxy config and log kept in ${p.dir})`;
    }
  }
  if (errors.length) throw errors[0];
}

/**
 * Registers the closing test of a file: every proxy it started exits 0 on SIGTERM within the
 * deadline and none logged "AddressSanitizer", "runtime error:" or "LeakSanitizer".
 * Also registers an after() hook that kills anything still running. `beforeStop` runs first
 * (close driver clients there, so the stop measures the proxy, not a reconnecting client).
 */
function registerFinalChecks(testApi, cleanups = [], { beforeStop } = {}) {
  testApi.test('every proxy exits 0 on SIGTERM and logged no sanitizer report', async (t) => {
    if (!startedProxies.length) return t.skip('this file started no proxy');
    if (beforeStop) await beforeStop();
    await stopAllAndCheck();
  });
  testApi.after(async () => {
    for (const p of startedProxies) await p.kill().catch(() => {});
    // A double's stop fails when the proxy's own connections got a parse error from it
    // (double.js): that fails this hook, and so the file; other cleanup errors do not.
    let refused = null;
    for (const c of cleanups) {
      await Promise.resolve(typeof c === 'function' ? c() : c && c.stop()).catch((e) => {
        if (e && e.proxyRefused && !refused) refused = e;
      });
    }
    if (refused) throw refused;
  });
}

/** Connection string naming the proxy, without replicaSet=. */
function clientUri(proxy, params = {}, { db = '', credentials = true } = {}) {
  const q = new URLSearchParams();
  let userinfo = '';
  const real = realUpstreamUri();
  if (real && credentials) {
    // Authentication passes through the proxy, so the client needs the real server's credentials.
    const { default: ConnectionString } = require('mongodb-connection-string-url');
    const cs = new ConnectionString(real);
    if (cs.username) userinfo = `${cs.username}:${cs.password}@`;
    for (const k of ['authSource', 'authMechanism', 'authMechanismProperties']) {
      const v = cs.searchParams.get(k);
      if (v) q.set(k, v);
    }
  }
  if (proxy.tls) {
    q.set('tls', 'true');
    if (proxy.tls.ca) q.set('tlsCAFile', proxy.tls.ca);
  }
  for (const [k, v] of Object.entries(params)) {
    if (v === undefined || v === null) continue;
    q.set(k, String(v));
  }
  const qs = q.toString();
  const hostPart = proxy.socketPath ? encodeURIComponent(proxy.socketPath) : `${proxy.host}:${proxy.port}`;
  return `mongodb://${userinfo}${hostPart}/${db}${qs ? '?' + qs : ''}`;
}

// ---------------------------------------------------------------------------- raw wire protocol

let CRC_TABLE = null;
function crc32c(buf, end = buf.length) {
  if (!CRC_TABLE) {
    CRC_TABLE = new Int32Array(256);
    for (let i = 0; i < 256; i++) {
      let c = i;
      for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
      CRC_TABLE[i] = c;
    }
  }
  let crc = 0xffffffff;
  for (let i = 0; i < end; i++) crc = CRC_TABLE[(crc ^ buf[i]) & 0xff] ^ (crc >>> 8);
  return (crc ^ 0xffffffff) >>> 0;
}

let nextRequestId = 1000;
function newRequestId() {
  nextRequestId = (nextRequestId + 1) & 0x7fffffff;
  return nextRequestId;
}

function header(len, requestID, responseTo, opCode) {
  const h = Buffer.alloc(16);
  h.writeInt32LE(len, 0);
  h.writeInt32LE(requestID, 4);
  h.writeInt32LE(responseTo, 8);
  h.writeInt32LE(opCode, 12);
  return h;
}

/**
 * An OP_MSG. opts: { requestID, flags, checksum: true|'bad', sections: [{kind, ...}] }.
 * Without `sections`, one kind-0 section holding `doc`. A kind-1 section is
 * {kind: 1, identifier, docs: [...]}; {kind: N, raw: Buffer} writes an arbitrary section.
 */
function opMsg(doc, opts = {}) {
  const requestID = opts.requestID ?? newRequestId();
  let flags = opts.flags ?? 0;
  if (opts.checksum) flags |= 1;
  const parts = [];
  const sections = opts.sections || [{ kind: 0, doc }];
  for (const s of sections) {
    if (s.raw) {
      parts.push(Buffer.from([s.kind]), s.raw);
    } else if (s.kind === 0) {
      parts.push(Buffer.from([0]), Buffer.isBuffer(s.doc) ? s.doc : BSON.serialize(s.doc));
    } else if (s.kind === 1) {
      const id = Buffer.from(s.identifier + '\0', 'utf8');
      const docs = s.docs.map((d) => (Buffer.isBuffer(d) ? d : BSON.serialize(d)));
      const size = Buffer.alloc(4);
      size.writeInt32LE(4 + id.length + docs.reduce((a, d) => a + d.length, 0));
      parts.push(Buffer.from([1]), size, id, ...docs);
    }
  }
  const flagBuf = Buffer.alloc(4);
  flagBuf.writeUInt32LE(flags >>> 0);
  const body = Buffer.concat([flagBuf, ...parts]);
  const len = 16 + body.length + (opts.checksum ? 4 : 0);
  let msg = Buffer.concat([header(len, requestID, 0, OP_MSG), body]);
  if (opts.checksum) {
    const crc = Buffer.alloc(4);
    let v = crc32c(msg);
    if (opts.checksum === 'bad') v = (v ^ 0xdeadbeef) >>> 0;
    crc.writeUInt32LE(v);
    msg = Buffer.concat([msg, crc]);
  }
  return { requestID, buf: msg };
}

/** An OP_QUERY (the legacy hello): flags, "admin.$cmd", skip 0, return -1, the document. */
function opQuery(doc, opts = {}) {
  const requestID = opts.requestID ?? newRequestId();
  const flags = Buffer.alloc(4);
  flags.writeInt32LE(opts.flags ?? 0);
  const ns = Buffer.from((opts.ns || 'admin.$cmd') + '\0');
  const skipRet = Buffer.alloc(8);
  skipRet.writeInt32LE(0, 0);
  skipRet.writeInt32LE(-1, 4);
  const body = Buffer.concat([flags, ns, skipRet, BSON.serialize(doc)]);
  return { requestID, buf: Buffer.concat([header(16 + body.length, requestID, 0, OP_QUERY), body]) };
}

/** Wraps a complete message in OP_COMPRESSED with zlib (or `payload` verbatim when given). */
function opCompressed(inner, { compressorId = 2, payload, uncompressedSize } = {}) {
  const requestID = inner.readInt32LE(4);
  const originalOpcode = inner.readInt32LE(12);
  const rest = inner.subarray(16);
  const data = payload || (compressorId === 2 ? zlib.deflateSync(rest) : rest);
  const meta = Buffer.alloc(9);
  meta.writeInt32LE(originalOpcode, 0);
  meta.writeInt32LE(uncompressedSize ?? rest.length, 4);
  meta.writeUInt8(compressorId, 8);
  const len = 16 + 9 + data.length;
  return { requestID, buf: Buffer.concat([header(len, requestID, 0, OP_COMPRESSED), meta, data]) };
}

/** Parses one complete message (header included). Decompresses zlib/noop OP_COMPRESSED. */
function parseMessage(buf) {
  const len = buf.readInt32LE(0);
  const requestID = buf.readInt32LE(4);
  const responseTo = buf.readInt32LE(8);
  let opCode = buf.readInt32LE(12);
  let body = buf.subarray(16, len);
  let compressorId = null;
  if (opCode === OP_COMPRESSED) {
    opCode = body.readInt32LE(0);
    const size = body.readInt32LE(4);
    compressorId = body.readUInt8(8);
    const data = body.subarray(9);
    if (compressorId === 0) body = data;
    else if (compressorId === 2) body = zlib.inflateSync(data);
    else throw new Error(`test harness cannot decompress compressorId ${compressorId}`);
    if (body.length !== size) throw new Error(`OP_COMPRESSED uncompressedSize ${size} != ${body.length}`);
  }
  const msg = { length: len, requestID, responseTo, opCode, compressorId, docs: [], flags: 0 };
  if (opCode === OP_MSG) {
    msg.flags = body.readUInt32LE(0);
    let off = 4;
    const end = body.length - (msg.flags & 1 ? 4 : 0);
    while (off < end) {
      const kind = body[off++];
      if (kind === 0) {
        const size = body.readInt32LE(off);
        msg.docs.push(BSON.deserialize(body.subarray(off, off + size)));
        off += size;
      } else if (kind === 1) {
        const size = body.readInt32LE(off);
        off += size;
      } else {
        throw new Error(`reply has unknown section kind ${kind}`);
      }
    }
  } else if (opCode === OP_QUERY) {
    msg.queryFlags = body.readInt32LE(0);
    const nsEnd = body.indexOf(0, 4);
    msg.ns = body.toString('utf8', 4, nsEnd);
    let off = nsEnd + 1 + 8;
    const size = body.readInt32LE(off);
    msg.docs.push(BSON.deserialize(body.subarray(off, off + size)));
  } else if (opCode === OP_REPLY) {
    msg.responseFlags = body.readInt32LE(0);
    msg.cursorId = body.readBigInt64LE(4);
    msg.startingFrom = body.readInt32LE(12);
    msg.numberReturned = body.readInt32LE(16);
    let off = 20;
    while (off < body.length) {
      const size = body.readInt32LE(off);
      msg.docs.push(BSON.deserialize(body.subarray(off, off + size)));
      off += size;
    }
  }
  msg.doc = msg.docs[0];
  return msg;
}

/** Incremental framer: feed chunks, get complete messages (raw Buffers). */
class Framer {
  constructor() {
    this.buf = Buffer.alloc(0);
  }
  push(chunk) {
    this.buf = this.buf.length ? Buffer.concat([this.buf, chunk]) : chunk;
    const out = [];
    while (this.buf.length >= 4) {
      const len = this.buf.readInt32LE(0);
      if (len < 16 || this.buf.length < len) break;
      out.push(this.buf.subarray(0, len));
      this.buf = this.buf.subarray(len);
    }
    return out;
  }
}

/** A raw client connection speaking the wire protocol. */
class WireConn {
  /** localAddress: the client socket's own address (127.0.0.2: a second client host on loopback). */
  static connect({ host = '127.0.0.1', port, path: sockPath = null, tls = null, timeoutMs = 5000, localAddress }) {
    return new Promise((resolve, reject) => {
      let sock;
      const onErr = (e) => {
        clearTimeout(timer);
        sock.destroy();
        reject(e);
      };
      const timer = setTimeout(() => onErr(new Error(`connect to ${host}:${port} timed out`)), timeoutMs);
      const ready = () => {
        clearTimeout(timer);
        sock.removeListener('error', onErr);
        resolve(new WireConn(sock));
      };
      if (tls) {
        const o = { host, port, ca: fs.readFileSync(tls.ca), servername: 'localhost' };
        if (tls.cert) o.cert = o.key = fs.readFileSync(tls.cert); // combined PEM: certificate and key
        sock = require('node:tls').connect(o, ready);
      } else if (sockPath) {
        sock = net.connect({ path: sockPath }, ready);
      } else {
        sock = net.connect({ host, port, ...(localAddress ? { localAddress } : {}) }, ready);
      }
      sock.once('error', onErr);
    });
  }

  constructor(sock) {
    this.sock = sock;
    this.framer = new Framer();
    this.queue = [];
    this.waiters = [];
    this.error = null;
    this.closed = false;
    this.closedAt = null;
    this.localPort = sock.localPort;
    this.peer = sock.localPort ? `${sock.localAddress}:${sock.localPort}` : 'unix';
    this.closePromise = new Promise((resolve) => {
      sock.once('close', (hadError) => {
        this.closed = true;
        this.closedAt = Date.now();
        this._flushWaiters();
        resolve({ hadError });
      });
    });
    sock.on('error', (e) => {
      this.error = e;
    });
    sock.on('data', (chunk) => {
      for (const m of this.framer.push(chunk)) this.queue.push(m);
      this._flushWaiters();
    });
  }

  _flushWaiters() {
    while (this.waiters.length && (this.queue.length || this.closed)) {
      const w = this.waiters.shift();
      w();
    }
  }

  write(buf) {
    return new Promise((resolve, reject) => {
      this.sock.write(buf, (err) => (err ? reject(err) : resolve()));
    });
  }

  /** Next complete message (parsed), or rejects on close/timeout. */
  async next({ timeoutMs = 5000 } = {}) {
    const deadline = Date.now() + timeoutMs;
    while (!this.queue.length) {
      if (this.closed) throw new Error(`connection closed while waiting for a reply${this.error ? ': ' + this.error.message : ''}`);
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`no reply within ${timeoutMs} ms`);
      await new Promise((resolve) => {
        const t = setTimeout(() => {
          const i = this.waiters.indexOf(done);
          if (i >= 0) this.waiters.splice(i, 1);
          resolve();
        }, left);
        const done = () => {
          clearTimeout(t);
          resolve();
        };
        this.waiters.push(done);
      });
    }
    const raw = this.queue.shift();
    const msg = parseMessage(raw);
    msg.raw = raw;
    return msg;
  }

  /** Sends an OP_MSG command and returns the reply message (checks responseTo). */
  async request(doc, opts = {}) {
    const m = opts.legacy ? opQuery(doc, opts) : opMsg(doc, opts);
    const out = opts.compress ? opCompressed(m.buf, { compressorId: COMPRESSOR_IDS[opts.compress] }) : m;
    await this.write(out.buf);
    const reply = await this.next({ timeoutMs: opts.timeoutMs });
    assert.equal(reply.responseTo, m.requestID, 'reply.responseTo must equal the request id');
    return reply;
  }

  /** Sends an OP_MSG command and returns the reply's body document. */
  async command(doc, opts = {}) {
    return (await this.request(doc, opts)).doc;
  }

  /** Resolves when the peer closed the connection; rejects after timeoutMs. */
  async waitClosed(timeoutMs) {
    const r = await within(this.closePromise, timeoutMs, null);
    if (!r) throw new Error(`connection ${this.peer} not closed by the proxy within ${timeoutMs} ms`);
    return r;
  }

  end() {
    this.sock.end();
  }

  destroy() {
    this.sock.destroy();
  }
}

// ---------------------------------------------------------------------------- TCP tap

/**
 * A transparent TCP relay in front of `targetPort` that records, per connection and direction,
 * the messages that crossed it: {opCode, originalOpcode, compressorId, doc (uncompressed only)}.
 * It forwards every byte unchanged; it only reads headers (and bodies of uncompressed
 * OP_MSG/OP_REPLY/OP_QUERY, to find hello replies).
 */
async function startTap(targetPort, targetHost = '127.0.0.1') {
  const conns = [];
  const sockets = new Set();
  const server = net.createServer((client) => {
    const rec = { toServer: [], toClient: [] };
    conns.push(rec);
    const upstream = net.connect({ host: targetHost, port: targetPort });
    sockets.add(client);
    sockets.add(upstream);
    const fc = new Framer();
    const fu = new Framer();
    const record = (list, raw) => {
      const opCode = raw.readInt32LE(12);
      const entry = { opCode, length: raw.length, requestID: raw.readInt32LE(4), responseTo: raw.readInt32LE(8) };
      if (opCode === OP_COMPRESSED) {
        entry.originalOpcode = raw.readInt32LE(16);
        entry.compressorId = raw.readUInt8(24);
      }
      try {
        entry.doc = parseMessage(raw).doc; // zlib and noop only; snappy/zstd stay unread
      } catch {
        /* not ours to judge */
      }
      list.push(entry);
    };
    client.on('data', (chunk) => {
      for (const m of fc.push(chunk)) record(rec.toServer, m);
      upstream.write(chunk);
    });
    upstream.on('data', (chunk) => {
      for (const m of fu.push(chunk)) record(rec.toClient, m);
      client.write(chunk);
    });
    const closeBoth = () => {
      client.destroy();
      upstream.destroy();
      sockets.delete(client);
      sockets.delete(upstream);
    };
    client.on('close', closeBoth);
    upstream.on('close', closeBoth);
    client.on('error', () => {});
    upstream.on('error', () => {});
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: server.address().port,
    conns,
    async stop() {
      for (const s of sockets) s.destroy();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

// ---------------------------------------------------------------------------- the C client

/** Compiles a C test client (default tests/integration/cdriver/cdriver-client.c) against libmongoc into a temp dir. */
function buildCdriverClient(src = path.join(REPO, 'tests', 'integration', 'cdriver', 'cdriver-client.c')) {
  const { execFileSync } = require('node:child_process');
  const out = path.join(tmpDir('relaybus-cdriver-'), path.basename(src, '.c'));
  const flags = execFileSync('pkg-config', ['--cflags', '--libs', 'libmongoc-1.0'], { encoding: 'utf8' }).trim().split(/\s+/);
  execFileSync(process.env.CC || 'cc', ['-std=c11', '-D_GNU_SOURCE', '-Wall', '-Wextra', '-Werror', '-O1', '-g', '-o', out, src, ...flags], {
    stdio: ['ignore', 'inherit', 'inherit'],
  });
  return out;
}

/** Runs the C client with URI and database; resolves {code, stdout, stderr}. */
function runCdriverClient(bin, uri, db, timeoutMs = 90000) {
  const { execFile } = require('node:child_process');
  return new Promise((resolve) => {
    execFile(bin, [uri, db], { timeout: timeoutMs, encoding: 'utf8' }, (err, stdout, stderr) => {
      resolve({ code: err ? (err.code ?? err.signal ?? 'error') : 0, stdout, stderr });
    });
  });
}

/** hello command names, all spellings. */
/** FNV-1a 32 of a UTF-8 string: how base/outbox.c hashes keys into lanes and handler names into
 * lane spaces. */
function fnv1a(str) {
  let h = 0x811c9dc5;
  for (const b of Buffer.from(str, 'utf8')) {
    h ^= b;
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h >>> 0;
}

/** The _id of the lane document of lane number `lane` (0..255) of handler `handler`'s lane space
 * (base/outbox.h: the fixed spaces are 0 and 1, the handler spaces follow, 256 lanes each). */
function laneDocId(handler, lane) {
  const spaces = Math.floor(0x7fffffff / 256);
  return (2 + (fnv1a(handler) % (spaces - 2))) * 256 + lane;
}

function isHelloDoc(doc) {
  return !!doc && ('hello' in doc || 'isMaster' in doc || 'ismaster' in doc);
}

module.exports = {
  within,
  spawnMaybeUlimit,
  proxyThreads,
  REPO,
  DOUBLE_BIN,
  OP_REPLY,
  OP_QUERY,
  OP_COMPRESSED,
  OP_MSG,
  COMPRESSOR_IDS,
  proxyBin,
  realUpstreamUri,
  upstreamTestDb,
  dbName,
  outboxKeys,
  withOutboxDb,
  externalUpstream,
  doubleOnlySkipReason,
  rawDataSkipReason,
  sleep,
  tmpDir,
  uniqueDbName,
  freePort,
  startDouble,
  startUpstream,
  startProxy,
  runProxyExpectingExit,
  stopAllAndCheck,
  registerFinalChecks,
  assertNoSanitizerReports,
  clientUri,
  crc32c,
  header,
  opMsg,
  opQuery,
  opCompressed,
  parseMessage,
  Framer,
  WireConn,
  startTap,
  isHelloDoc,
  fnv1a,
  laneDocId,
  newRequestId,
  buildCdriverClient,
  runCdriverClient,
  tail,
};
