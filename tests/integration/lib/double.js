'use strict';
// Starts the project's MongoDB server double (tests/mongod-double/mongod-double)
// for a test suite, or hands back the real deployment of `scripts/test --upstream`
// (RELAYBUS_TEST_UPSTREAM; never MONGODB_URI).
//
//   const { startDouble, serverForTests } = require('../lib/double');
//   const d = await startDouble({ auth: 'user:pw' });   // always the double
//   const s = await serverForTests();                    // --upstream's deployment or a double
//   ... s.uri, s.port, s.external ...
//   await s.stop();
//
// startDouble waits for the port line on stdout (the double prints its bound
// port first), keeps draining stdout/stderr so the child never blocks on a
// full pipe, kills the child when this process exits, and puts the tail of
// the child's stderr into any error it reports (failed start, early exit).
//
// stop() first reads each member's (or mongos's) doubleStats and throws, after
// stopping the double, when a connection of the proxy's own (an appName
// starting with "relaybus-proxy", except "relaybus-proxy pool", whose
// connections carry the clients' commands) got one of the parse errors of
// mongod (checkProxyParseErrors): a command of the proxy that the double
// refuses is one a real mongod refuses. A test that makes the proxy's own
// connection get one on purpose says so with allowProxyErrors.

const { spawn } = require('child_process');
const path = require('path');
const fs = require('fs');

const DOUBLE = path.resolve(__dirname, '..', '..', 'mongod-double', 'mongod-double');
const TAIL_BYTES = 16384;

// mongod's parse errors (IDL: 40413 duplicate field, 40414 missing field, 40415 unknown field,
// 14 wrong type; 9 FailedToParse and 2 BadValue of the hand-written parsers).
const PARSE_CODES = ['40413', '40414', '40415', '14', '9', '2'];
const isProxyOwnApp = (app) => app.startsWith('relaybus-proxy') && app !== 'relaybus-proxy pool';

// The ports a double's stdout names that take client commands: the members of a replica set,
// or the mongos routers of a cluster (whose shard lines are `shardNN P S`).
function commandPorts(stdout) {
  return stdout.split('\n').map((l) => l.trim()).filter((l) => /^\d{2,5}$/.test(l)).map(Number);
}

// doubleStats' error counts of one member, through the Node.js driver (it authenticates and
// speaks TLS as the double asks); null when the member cannot be asked.
async function errorStats(port, { auth, args = [] }) {
  const { MongoClient } = require('mongodb');
  const opts = { directConnection: true, serverSelectionTimeoutMS: 5000, connectTimeoutMS: 5000, socketTimeoutMS: 10000 };
  if (auth) {
    const i = auth.indexOf(':');
    opts.auth = { username: auth.slice(0, i), password: auth.slice(i + 1) };
    opts.authSource = 'admin';
  }
  if (args.includes('--tls-cert-file')) {
    // A double that requires client certificates cannot be asked without one.
    if (args.includes('--tls-ca-file') && !args.includes('--tls-allow-connections-without-certificates')) return null;
    Object.assign(opts, { tls: true, tlsInsecure: true });
  }
  const client = new MongoClient(`mongodb://127.0.0.1:${port}/`, opts);
  try {
    const r = await client.db('admin').command({ doubleStats: 1 });
    return r.errors || { byCode: {}, byApp: {} };
  } catch (e) {
    process.stderr.write(`[harness] cannot read doubleStats of the double on port ${port}: ${e.message}\n`);
    return null;
  } finally {
    await client.close().catch(() => {});
  }
}

/**
 * Throws when a connection of the proxy's own got one of mongod's parse errors from the double
 * on one of `ports` (the codes of `allow[appName]` excepted), naming the appName, the code, the
 * count and the double's log lines of those refusals.
 * @param {{ports: number[], auth?: string, args?: string[], allow?: Object<string, number[]>, log?: string}} o
 */
async function checkProxyParseErrors({ ports, auth, args, allow = {}, log = '' }) {
  const found = [];
  const apps = new Set();
  for (const port of ports) {
    const stats = await errorStats(port, { auth, args });
    if (!stats) continue;
    for (const [app, codes] of Object.entries(stats.byApp || {})) {
      if (!isProxyOwnApp(app)) continue;
      const allowed = (allow[app] || []).map(String);
      for (const code of PARSE_CODES) {
        if (codes[code] && !allowed.includes(code)) {
          found.push(`appName "${app}" got ${code} ${codes[code]} time(s) from the double on port ${port}`);
          apps.add(app);
        }
      }
    }
  }
  if (!found.length) return;
  const lines = log.split('\n').filter((l) => l.includes(': refused ') && [...apps].some((a) => l.includes(`(${a}):`))).slice(-20);
  const e = new Error(`the double refused commands of the proxy's own connections as a real mongod refuses them: ${found.join('; ')}` +
    (lines.length ? `\n--- the double's log of them ---\n${lines.join('\n')}` : ''));
  e.proxyRefused = true;
  throw e;
}

const live = new Set();
let hooksInstalled = false;

function installExitHooks() {
  if (hooksInstalled) return;
  hooksInstalled = true;
  const killAll = (signal) => {
    for (const child of live) {
      try { child.kill(signal); } catch (_) { /* already gone */ }
    }
  };
  process.on('exit', () => killAll('SIGKILL'));
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
    process.once(sig, () => {
      killAll('SIGKILL');
      process.kill(process.pid, sig); // re-raise with the default handler
    });
  }
}

class Tail {
  constructor() { this.buf = ''; }
  push(chunk) {
    this.buf += chunk.toString('utf8');
    if (this.buf.length > TAIL_BYTES) this.buf = this.buf.slice(-TAIL_BYTES);
  }
  toString() { return this.buf; }
}

/**
 * Start a double.
 * @param {object} [o]
 * @param {string} [o.auth] "USER:PASSWORD" to require SCRAM authentication
 * @param {boolean} [o.standalone] run as a standalone (no replica set)
 * @param {number} [o.txnLifetime] --txn-lifetime seconds
 * @param {string[]} [o.args] extra command-line arguments
 * @param {{shards?:number, mongos?:number}} [o.sharded] run a sharded cluster (--sharded): the
 *   result's `mongos` lists the routers' ports, `shards` each shard's {name, port,
 *   secondaryPort}, and `uri` is the seed list of every mongos
 * @param {string} [o.host] host name for the URI (default 127.0.0.1)
 * @param {Object<string, number[]>} [o.allowProxyErrors] parse errors a test makes the proxy's
 *   own connections get on purpose, by appName: stop() does not fail on those
 * @param {number} [o.startTimeoutMS] how long to wait for the port line (default 20000)
 * @param {boolean} [o.record] false: this double leaves DOUBLE_RECORD's record alone (a test
 *   that sends commands under the proxy's appNames itself, which the proxy never sends)
 * @returns {Promise<{port:number, uri:string, pid:number, external:false, stop:Function, stderr:Function, stdout:Function}>}
 */
function startDouble(o = {}) {
  installExitHooks();
  if (!fs.existsSync(DOUBLE)) {
    return Promise.reject(new Error(`server double not found at ${DOUBLE}`));
  }
  const args = ['--port', '0'];
  if (o.auth) args.push('--auth', o.auth);
  if (o.standalone) args.push('--standalone');
  if (o.txnLifetime !== undefined) args.push('--txn-lifetime', String(o.txnLifetime));
  if (o.args) args.push(...o.args);
  const nMongos = o.sharded ? o.sharded.mongos || 2 : 1;
  const nShards = o.sharded ? o.sharded.shards || 2 : 0;
  if (o.sharded) args.push('--sharded', '--shards', String(nShards), '--mongos', String(nMongos));
  const host = o.host || '127.0.0.1';
  const startTimeoutMS = o.startTimeoutMS || 20000;

  const env = { ...process.env };
  if (o.record === false) delete env.DOUBLE_RECORD;
  const child = spawn(DOUBLE, args, { stdio: ['ignore', 'pipe', 'pipe'], env });
  live.add(child);
  const err = new Tail();
  const out = new Tail();
  child.stderr.on('data', (c) => err.push(c));

  let exited = null;
  const exitPromise = new Promise((resolve) => {
    child.on('exit', (code, signal) => {
      exited = { code, signal };
      live.delete(child);
      resolve(exited);
    });
  });

  const stop = async () => {
    if (exited) return exited;
    let refused = null;
    try {
      await checkProxyParseErrors({ ports: commandPorts(out.toString()), auth: o.auth, args, allow: o.allowProxyErrors, log: err.toString() });
    } catch (e) {
      refused = e;
    }
    try { child.kill('SIGTERM'); } catch (_) { /* gone */ }
    const t = setTimeout(() => { try { child.kill('SIGKILL'); } catch (_) { /* gone */ } }, 5000);
    const r = await exitPromise;
    clearTimeout(t);
    if (refused) throw refused;
    return r;
  };

  return new Promise((resolve, reject) => {
    let pending = '';
    let settled = false;
    const fail = (msg) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      try { child.kill('SIGKILL'); } catch (_) { /* gone */ }
      const e = new Error(`${msg}\n--- mongod-double ${args.join(' ')} stderr (tail) ---\n${err.toString() || '(empty)'}` +
        (out.toString() ? `\n--- stdout ---\n${out.toString()}` : ''));
      reject(e);
    };
    const timer = setTimeout(() => fail(`mongod-double did not print its port within ${startTimeoutMS} ms`), startTimeoutMS);
    child.on('error', (e) => fail(`cannot start mongod-double: ${e.message}`));
    child.on('exit', (code, signal) => fail(`mongod-double exited before printing its port (code ${code}, signal ${signal})`));
    child.stdout.on('data', (chunk) => {
      out.push(chunk);
      if (settled) return;
      pending += chunk.toString('utf8');
      const nl = pending.indexOf('\n');
      if (nl < 0) return;
      // A cluster prints a line per mongos, then one per shard: wait for all of them.
      const lines = pending.split('\n').slice(0, -1);
      if (lines.length < nMongos + nShards) return;
      const line = pending.slice(0, nl).trim();
      const m = /(\d{2,5})\s*$/.exec(line);
      const port = m ? parseInt(m[1], 10) : NaN;
      if (!(port > 0 && port < 65536)) {
        fail(`unexpected first stdout line from mongod-double: ${JSON.stringify(line)}`);
        return;
      }
      settled = true;
      clearTimeout(timer);
      let cred = '';
      let query = '';
      if (o.auth) {
        const i = o.auth.indexOf(':');
        cred = `${encodeURIComponent(o.auth.slice(0, i))}:${encodeURIComponent(o.auth.slice(i + 1))}@`;
        query = '?authSource=admin';
      }
      const mongos = lines.slice(0, nMongos).map((l) => Number(l.trim()));
      const shards = lines.slice(nMongos, nMongos + nShards).map((l) => {
        const [name, p, sp] = l.trim().split(' ');
        return { name, port: Number(p), secondaryPort: Number(sp) };
      });
      const hosts = mongos.map((p) => `${host}:${p}`).join(',');
      resolve({
        port,
        host,
        pid: child.pid,
        mongos,
        shards,
        uri: `mongodb://${cred}${hosts}/${query}`,
        baseUri: `mongodb://${host}:${port}/`,
        external: false,
        stop,
        exited: () => exited,
        stderr: () => err.toString(),
        stdout: () => out.toString(),
      });
    });
  });
}

/**
 * A deployment for driver-level tests: the one `scripts/test --upstream URI`
 * names (RELAYBUS_TEST_UPSTREAM) when that is set, otherwise a fresh double.
 */
async function serverForTests(o = {}) {
  if (process.env.RELAYBUS_TEST_UPSTREAM) {
    return {
      uri: process.env.RELAYBUS_TEST_UPSTREAM,
      port: null,
      external: true,
      stop: async () => {},
      stderr: () => '',
      stdout: () => '',
    };
  }
  return startDouble(o);
}

/** A database name unique to this run, so tests can share a server. */
function uniqueDbName(prefix) {
  const rnd = Math.random().toString(36).slice(2, 8);
  return `${prefix}_${process.pid}_${rnd}`.slice(0, 60);
}

module.exports = { startDouble, serverForTests, uniqueDbName, checkProxyParseErrors, commandPorts, DOUBLE_PATH: DOUBLE };
