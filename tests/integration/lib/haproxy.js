'use strict';
// HAProxy in TCP mode in front of proxies, for the load-balanced layout
// (docs/deployment.md, "Behind a load balancer"): Debian's haproxy on
// loopback, on ports from the harness's allocator, its configuration and log
// in a temporary directory, started in the foreground and stopped by the test.
//
//   const { startHaproxy } = require('../lib/haproxy');
//   const lb = await startHaproxy({ frontends: { all: [p1, p2, p3], one: [p1] } });
//   lb.port('all')   // the port of frontend "all": round robin over p1, p2, p3
//   await lb.stop();
//
// Each frontend balances round robin over its servers, each connection to
// one server for its whole life (mode tcp), as a Kubernetes Service or a
// cloud TCP load balancer does.  With `checks` (a map of server port ->
// admin port), a server is taken out when its proxy's GET /readyz fails
// twice at 250 ms apart (as deployment.md recommends); without, a plain TCP
// connect check at the same pace.  A connection attempt to a server that
// refuses it is tried once more on another (option redispatch).

const fs = require('node:fs');
const net = require('node:net');
const path = require('node:path');
const { spawn, spawnSync } = require('node:child_process');
const { tmpDir, freePort, sleep, within } = require('./proxy');

const READY_MS = 10000;
const STOP_MS = 5000;

function haproxyBin() {
  return process.env.HAPROXY_BIN || (fs.existsSync('/usr/sbin/haproxy') ? '/usr/sbin/haproxy' : 'haproxy');
}

/** A reason to skip when there is no haproxy binary, or null. */
function haproxySkipReason() {
  const r = spawnSync(haproxyBin(), ['-v'], { encoding: 'utf8' });
  if (r.error || r.status !== 0) return `no haproxy (${haproxyBin()}): install Debian's haproxy`;
  return null;
}

/** The configuration text: one frontend and backend per entry of `frontends`. */
function haproxyConfig(frontends, ports, { checks = null, interMs = 250 } = {}) {
  const lines = [
    'global',
    '  maxconn 4096',
    '',
    'defaults',
    '  mode tcp',
    '  timeout connect 2s',
    // Long enough for idle pooled connections, change streams and long polls.
    '  timeout client 1h',
    '  timeout server 1h',
    '  retries 2',
    '  option redispatch',
    '',
  ];
  for (const [name, servers] of Object.entries(frontends)) {
    lines.push(`frontend fe_${name}`, `  bind 127.0.0.1:${ports[name]}`, `  default_backend be_${name}`, '');
    lines.push(`backend be_${name}`, '  balance roundrobin');
    // HTTP/1.1 with a Host the admin port accepts without a token (docs/admin.md).
    if (checks) lines.push('  option httpchk', '  http-check send meth GET uri /readyz ver HTTP/1.1 hdr Host 127.0.0.1', '  http-check expect status 200');
    servers.forEach((p, i) => {
      const check = checks ? ` check port ${checks[p]} inter ${interMs} fall 2 rise 2` : ` check inter ${interMs} fall 2 rise 2`;
      lines.push(`  server s${i} 127.0.0.1:${p}${check}`);
    });
    lines.push('');
  }
  return lines.join('\n');
}

function tcpReady(port, ms) {
  const deadline = Date.now() + ms;
  return new Promise((resolve, reject) => {
    const attempt = () => {
      const s = net.connect(port, '127.0.0.1');
      s.once('connect', () => { s.destroy(); resolve(); });
      s.once('error', () => { s.destroy(); retry(); });
    };
    const retry = () => (Date.now() > deadline ? reject(new Error(`haproxy not listening on ${port} within ${ms} ms`)) : setTimeout(attempt, 50));
    attempt();
  });
}

/**
 * Starts haproxy with one frontend per entry of `frontends` (name -> the proxies' ports).
 * opts.checks: server port -> admin port (health checks on /readyz); opts.interMs: check pace.
 * @returns {Promise<{port(name), uri(name, params), config, log(), stop()}>}
 */
async function startHaproxy(opts) {
  const dir = tmpDir('relaybus-haproxy-');
  const ports = {};
  for (const name of Object.keys(opts.frontends)) ports[name] = await freePort();
  const config = haproxyConfig(opts.frontends, ports, opts);
  const cfgPath = path.join(dir, 'haproxy.cfg');
  fs.writeFileSync(cfgPath, config);
  const check = spawnSync(haproxyBin(), ['-c', '-q', '-f', cfgPath], { encoding: 'utf8' });
  if (check.status !== 0) throw new Error(`haproxy refuses its configuration:\n${check.stdout}${check.stderr}\n${config}`);
  const logPath = path.join(dir, 'haproxy.log');
  const fd = fs.openSync(logPath, 'a');
  // -db: in the foreground, so it is this process's child and stops with it.
  const child = spawn(haproxyBin(), ['-db', '-f', cfgPath], { stdio: ['ignore', fd, fd] });
  fs.closeSync(fd);
  const exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
  child.on('error', () => {});
  process.on('exit', () => { try { child.kill('SIGKILL'); } catch { /* gone */ } });
  const log = () => { try { return fs.readFileSync(logPath, 'utf8'); } catch { return ''; } };
  try {
    for (const name of Object.keys(ports)) {
      await Promise.race([tcpReady(ports[name], READY_MS), exited.then((r) => { throw new Error(`haproxy exited (${JSON.stringify(r)}):\n${log()}`); })]);
    }
  } catch (e) {
    child.kill('SIGKILL');
    throw e;
  }
  let stopped = false;
  return {
    dir,
    config,
    pid: child.pid,
    log,
    port: (name) => ports[name],
    /** A driver's connection string for frontend `name`, in load-balanced mode. */
    uri(name, params = {}) {
      const q = new URLSearchParams({ loadBalanced: 'true', ...params }).toString();
      return `mongodb://127.0.0.1:${ports[name]}/?${q}`;
    },
    /** Waits until the checks have seen every server of `name` up (the first checks run at start). */
    async settle(ms = 3 * (opts.interMs || 250) + 500) { await sleep(ms); },
    async stop() {
      if (stopped) return;
      stopped = true;
      if (child.exitCode !== null || child.signalCode !== null) return;
      // SIGUSR1 is haproxy's soft stop (it waits for connections); SIGTERM stops at once.
      child.kill('SIGTERM');
      const r = await within(exited, STOP_MS, null);
      if (!r) { child.kill('SIGKILL'); await exited; }
      if (!process.env.RELAYBUS_KEEP_TEST_DIRS) fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

module.exports = { startHaproxy, haproxySkipReason, haproxyConfig, haproxyBin };
