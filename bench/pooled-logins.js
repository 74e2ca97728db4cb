#!/usr/bin/env node
'use strict';
// Benchmark: pooled logins of one user from one address, as drivers filling their pools make
// them.  (Not a timed test: it prints figures, and exits 1 when the bar is missed.)
//
//   node bench/pooled-logins.js [--clients 20] [--min-pool 100] [--threads 4] [--limit 10] [--seconds 10]
//
// Starts the server double and the proxy (build/relaybus-proxy, or RELAYBUS_PROXY_BIN) in pooled
// mode with an auth file of one user and auth_failures_per_minute = --limit (the default, 10),
// then --clients Node.js driver clients, all as that user from 127.0.0.1, each with minPoolSize =
// maxPoolSize = --min-pool: the drivers open and log in that many connections each, in the
// background.  The Node.js driver (7.x) fills a pool to minPoolSize one connection at a time,
// waiting minPoolSizeCheckFrequencyMS (100 ms, not a client option) after each login before it
// opens the next, so the driver itself paces 20 x 100 connections to over 10 s (100 logins in
// a row per client); --clients 200 --min-pool 10 opens as many with ten times the conversations
// at once, and measures how fast the proxy logs them in.  Reads relaybus_logins_total from the admin port every 50 ms until
// every connection has logged in, or --seconds x 3 have passed.
//
// Prints: the connections that logged in and the time the last one took, pooled logins per
// second (logins / that time), throttled logins, failed logins and login_timeout closes.  The
// bar (docs/benchmarks.md): all clients x min-pool connections log in within --seconds, none
// throttled.

const path = require('node:path');
const fs = require('node:fs');
const { execFileSync } = require('node:child_process');

const REPO = path.resolve(__dirname, '..');
if (!process.env.RELAYBUS_PROXY_BIN) process.env.RELAYBUS_PROXY_BIN = path.join(REPO, 'build', 'relaybus-proxy');
const { MongoClient } = require(path.join(REPO, 'tests', 'node_modules', 'mongodb'));
const H = require(path.join(REPO, 'tests', 'integration', 'lib', 'proxy'));

function arg(name, def) {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : def;
}
const CLIENTS = arg('clients', 20);
const MIN_POOL = arg('min-pool', 100);
const THREADS = arg('threads', 4);
const LIMIT = arg('limit', 10);
const SECONDS = arg('seconds', 10);
const TOTAL = CLIENTS * MIN_POOL;
const USER = 'app';
const PASSWORD = 'pooled pass';

async function metrics(port) {
  const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
  const out = { success: 0, failure: 0, throttled: 0, loginTimeouts: 0 };
  for (const m of text.matchAll(/^relaybus_logins_total\{result="(\w+)"\} (\d+)$/gm)) out[m[1]] = Number(m[2]);
  const lt = /^relaybus_client_connections_closed_total\{reason="login_timeout"\} (\d+)$/m.exec(text);
  if (lt) out.loginTimeouts = Number(lt[1]);
  return out;
}

async function main() {
  const up = await H.startUpstream();
  const dir = H.tmpDir('relaybus-bench-logins-');
  const authFile = path.join(dir, 'users.auth');
  fs.writeFileSync(authFile, execFileSync(process.env.RELAYBUS_PROXY_BIN, ['--make-user', USER], { input: `${PASSWORD}\n` }), { mode: 0o600 });
  const adminPort = await H.freePort();
  const proxy = await H.startProxy({
    upstream: up.uri,
    settings: { pool_mode: 'pooled', pool_size: 16, threads: THREADS, auth_file: authFile, auth_failures_per_minute: LIMIT, max_clients: TOTAL + 1000 },
    extraIni: `[admin]\nlisten = 127.0.0.1:${adminPort}\n`,
  });
  const clients = [];
  let result;
  try {
    const before = await metrics(adminPort);
    const uri = `mongodb://${USER}:${encodeURIComponent(PASSWORD)}@127.0.0.1:${proxy.port}/?authSource=admin` +
      `&minPoolSize=${MIN_POOL}&maxPoolSize=${MIN_POOL}&serverSelectionTimeoutMS=30000`;
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < CLIENTS; i++) clients.push(new MongoClient(uri));
    // A connect refused (a throttled login, as drivers see it) is counted; its client's pool
    // stays empty.
    let connectErrors = 0;
    await Promise.all(clients.map((c) => c.connect().catch(() => { connectErrors++; })));
    let now = await metrics(adminPort);
    let ms = 0;
    while (now.success - before.success < TOTAL) {
      ms = Number(process.hrtime.bigint() - t0) / 1e6;
      if (ms > SECONDS * 3000) break;
      await new Promise((r) => setTimeout(r, 50));
      now = await metrics(adminPort);
    }
    ms = Number(process.hrtime.bigint() - t0) / 1e6;
    const logged = now.success - before.success;
    result = {
      connections: TOTAL, loggedIn: logged, seconds: +(ms / 1000).toFixed(2),
      loginsPerSecond: Math.round(logged / (ms / 1000)),
      throttled: now.throttled - before.throttled, failed: now.failure - before.failure,
      loginTimeoutCloses: now.loginTimeouts - before.loginTimeouts, connectErrors,
    };
  } finally {
    await Promise.all(clients.map((c) => c.close().catch(() => {})));
    await proxy.stop().catch(() => {});
    await up.stop();
  }
  console.log(`${CLIENTS} clients x minPoolSize ${MIN_POOL}, one user, one address, auth_failures_per_minute = ${LIMIT}, threads = ${THREADS}`);
  console.log(`  logged in: ${result.loggedIn} of ${result.connections} in ${result.seconds} s (${result.loginsPerSecond} logins/s)`);
  console.log(`  throttled: ${result.throttled}, failed: ${result.failed}, login_timeout closes: ${result.loginTimeoutCloses}, clients whose connect failed: ${result.connectErrors}`);
  console.log(JSON.stringify(result));
  const ok = result.loggedIn >= TOTAL && result.seconds <= SECONDS && result.throttled === 0;
  if (!ok) console.log(`MISSED: all ${TOTAL} within ${SECONDS} s with 0 throttled`);
  process.exit(ok ? 0 : 1);
}

main().catch((e) => { console.error(e); process.exit(2); });
