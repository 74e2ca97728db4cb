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

const { spawn } = require('child_process');
const path = require('path');
const fs = require('fs');

const DOUBLE = path.resolve(__dirname, '..', '..', 'mongod-double', 'mongod-double');
const TAIL_BYTES = 16384;

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
 * @param {number} [o.startTimeoutMS] how long to wait for the port line (default 20000)
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

  const child = spawn(DOUBLE, args, { stdio: ['ignore', 'pipe', 'pipe'] });
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
    try { child.kill('SIGTERM'); } catch (_) { /* gone */ }
    const t = setTimeout(() => { try { child.kill('SIGKILL'); } catch (_) { /* gone */ } }, 5000);
    const r = await exitPromise;
    clearTimeout(t);
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

module.exports = { startDouble, serverForTests, uniqueDbName, DOUBLE_PATH: DOUBLE };
