'use strict';
// A RabbitMQ broker for the broker tests: Debian's rabbitmq-server on
// loopback, with a private node name, data and log directory, AMQP and
// distribution ports that were free, and an epmd of its own
// (ERL_EPMD_ADDRESS=127.0.0.1 on a free port, started here and stopped with
// it), so it never meets another Erlang node on the machine. No plugins.
// Start, readiness and stop are bounded in time; start() after stop() starts
// it again on the same ports and data (the outage tests), so durable
// exchanges and queues, and persistent messages, survive.
//
// startRabbit({ tls }) adds a TLS listener on another free port
// (listeners.ssl.default, ssl_options.* from tls: cacertfile, certfile,
// keyfile, verify, fail_if_no_peer_cert); amqpsUrl names it by the host
// name localhost, the plain url stays on 127.0.0.1.
//
// startRabbit({ user, pass }) makes that the broker's only user (default_user,
// default_pass) in place of guest; url and amqpsUrl carry it.
//
// RABBITMQ_URL names an existing broker instead (nothing is started; stop
// and start are refused: the outage tests skip then).

const fs = require('node:fs');
const net = require('node:net');
const path = require('node:path');
const { spawn, spawnSync } = require('node:child_process');
const { tmpDir, freePort, sleep, within } = require('./proxy');

const SERVER = process.env.RABBITMQ_SERVER_BIN || '/usr/lib/rabbitmq/bin/rabbitmq-server';
const EPMD = process.env.EPMD_BIN || 'epmd';
const READY_MS = 60000;
const STOP_MS = 20000;

/** A reason to skip when there is no rabbitmq-server, or null. */
function rabbitSkipReason() {
  if (process.env.RABBITMQ_URL) return null;
  if (!fs.existsSync(SERVER)) return `no ${SERVER}: install Debian's rabbitmq-server`;
  const r = spawnSync(EPMD, ['-help'], { encoding: 'utf8' });
  if (r.error) return `no epmd (${EPMD}): install Debian's erlang-base`;
  return null;
}

function portOpen(port) {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    s.once('connect', () => { s.destroy(); resolve(true); });
    s.once('error', () => { s.destroy(); resolve(false); });
  });
}

async function waitFor(pred, ms, what) {
  const deadline = Date.now() + ms;
  for (;;) {
    if (await pred()) return;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(100);
  }
}

function exitOf(child) {
  return new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) resolve();
    else child.once('exit', resolve);
  });
}

async function stopChild(child, ms) {
  if (!child || child.exitCode !== null || child.signalCode !== null) return;
  child.kill('SIGTERM');
  const done = await within(exitOf(child).then(() => true), ms, false);
  if (!done) { child.kill('SIGKILL'); await exitOf(child); }
}

/**
 * Starts rabbitmq-server on 127.0.0.1.
 * @param {object} [o]
 * @param {object} [o.tls] ssl_options: {cacertfile, certfile, keyfile, verify, fail_if_no_peer_cert}
 * @param {string} [o.user] with o.pass: the broker's user in place of guest
 * @returns {Promise<{url, port, tlsPort, amqpsUrl, stop(), start(), close(), log()}>}
 */
async function startRabbit(o = {}) {
  if (process.env.RABBITMQ_URL) {
    if (o.tls) throw new Error('RABBITMQ_URL names an external broker: it cannot be given a TLS listener');
    const refuse = async () => { throw new Error('RABBITMQ_URL names an external broker: it cannot be restarted'); };
    return { url: process.env.RABBITMQ_URL, external: true, log: () => '', async stop() {}, async close() {}, start: refuse };
  }
  const dir = tmpDir('relaybus-rabbit-');
  const [port, distPort, epmdPort] = [await freePort(), await freePort(), await freePort()];
  const node = `relaybus${process.pid}${Math.random().toString(36).slice(2, 6)}@localhost`;
  const logPath = path.join(dir, 'rabbit.log');
  fs.writeFileSync(path.join(dir, 'enabled_plugins'), '[].\n');
  const tlsPort = o.tls ? await freePort() : null;
  const conf = ['loopback_users = none'];
  if (o.user) conf.push(`default_user = ${o.user}`, `default_pass = ${o.pass}`);
  const cred = o.user ? `${encodeURIComponent(o.user)}:${encodeURIComponent(o.pass)}` : 'guest:guest';
  if (o.tls) {
    conf.push(`listeners.ssl.default = 127.0.0.1:${tlsPort}`);
    for (const [k, v] of Object.entries(o.tls)) conf.push(`ssl_options.${k} = ${v}`);
  }
  fs.writeFileSync(path.join(dir, 'rabbitmq.conf'), conf.join('\n') + '\n');
  const env = {
    ...process.env,
    HOME: dir, // the Erlang cookie
    ERL_EPMD_ADDRESS: '127.0.0.1',
    ERL_EPMD_PORT: String(epmdPort),
    RABBITMQ_NODENAME: node,
    RABBITMQ_NODE_IP_ADDRESS: '127.0.0.1',
    RABBITMQ_NODE_PORT: String(port),
    RABBITMQ_DIST_PORT: String(distPort),
    RABBITMQ_MNESIA_BASE: path.join(dir, 'mnesia'),
    RABBITMQ_LOG_BASE: path.join(dir, 'log'),
    RABBITMQ_LOGS: '-',
    RABBITMQ_ENABLED_PLUGINS_FILE: path.join(dir, 'enabled_plugins'),
    RABBITMQ_PLUGINS_EXPAND_DIR: path.join(dir, 'plugins'),
    RABBITMQ_PID_FILE: path.join(dir, 'rabbit.pid'),
    RABBITMQ_CONFIG_FILE: path.join(dir, 'rabbitmq.conf'),
    RABBITMQ_ADVANCED_CONFIG_FILE: path.join(dir, 'advanced.config'),
    RABBITMQ_CONF_ENV_FILE: path.join(dir, 'rabbitmq-env.conf'),
    // The epmd started below, not one the node would start and leave behind.
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS: '-start_epmd false',
  };
  const log = () => { try { return fs.readFileSync(logPath, 'utf8'); } catch { return ''; } };
  let epmd = null;
  let child = null;
  const start = async () => {
    const fd = fs.openSync(logPath, 'a');
    epmd = spawn(EPMD, ['-address', '127.0.0.1', '-port', String(epmdPort)], { stdio: ['ignore', fd, fd], env });
    await waitFor(() => portOpen(epmdPort), 10000, 'epmd');
    child = spawn(SERVER, [], { stdio: ['ignore', fd, fd], env });
    fs.closeSync(fd);
    const c = child;
    const e = epmd;
    process.on('exit', () => { for (const x of [c, e]) try { x.kill('SIGKILL'); } catch { /* gone */ } });
    const before = log().length;
    try {
      await waitFor(async () => {
        if (c.exitCode !== null) throw new Error(`rabbitmq-server exited:\n${log().slice(-3000)}`);
        return log().slice(before).includes('Server startup complete') && await portOpen(port) && (!tlsPort || portOpen(tlsPort));
      }, READY_MS, `rabbitmq-server on ${port}`);
    } catch (err) {
      c.kill('SIGKILL');
      e.kill('SIGKILL');
      throw err;
    }
  };
  const stop = async () => {
    await stopChild(child, STOP_MS);
    // The Erlang VM, should the start script have left it behind.
    let pid = null;
    try { pid = Number(fs.readFileSync(env.RABBITMQ_PID_FILE, 'utf8').trim()); } catch { /* none */ }
    if (pid) {
      const alive = () => { try { process.kill(pid, 0); return true; } catch { return false; } };
      if (alive()) process.kill(pid, 'SIGTERM');
      const deadline = Date.now() + STOP_MS;
      while (alive() && Date.now() < deadline) await sleep(100);
      if (alive()) process.kill(pid, 'SIGKILL');
      fs.rmSync(env.RABBITMQ_PID_FILE, { force: true });
    }
    await stopChild(epmd, 5000);
  };
  await start();
  return {
    // No path: the vhost "/" (a trailing "/" would name the vhost "").
    url: `amqp://${cred}@127.0.0.1:${port}`, port, dir, log,
    tlsPort, amqpsUrl: tlsPort ? `amqps://${cred}@localhost:${tlsPort}` : null,
    stop,
    /** Starts it again (after stop) on the same ports and data. */
    start,
    async close() { await stop(); if (!process.env.RELAYBUS_KEEP_TEST_DIRS) fs.rmSync(dir, { recursive: true, force: true }); },
  };
}

module.exports = { startRabbit, rabbitSkipReason };
