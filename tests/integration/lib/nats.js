'use strict';
// A NATS server with JetStream for the broker tests: Debian's nats-server on
// loopback, on a port that was free, with its store in a temporary directory.
// Start, readiness and stop are bounded in time; restart() starts it again on
// the same port and store (the outage tests), so the streams survive.
//
// NATS_URL names an existing server instead (nothing is started, stop and
// restart are refused: the outage tests skip then).

const fs = require('node:fs');
const net = require('node:net');
const path = require('node:path');
const { spawn, spawnSync } = require('node:child_process');
const { tmpDir, freePort, sleep, within } = require('./proxy');

const READY_MS = 10000;
const STOP_MS = 5000;

function natsServerBin() {
  return process.env.NATS_SERVER_BIN || 'nats-server';
}

/** A reason to skip when there is no nats-server binary, or null. */
function natsSkipReason() {
  if (process.env.NATS_URL) return null;
  const r = spawnSync(natsServerBin(), ['--version'], { encoding: 'utf8' });
  if (r.error || r.status !== 0) return `no nats-server (${natsServerBin()}): install Debian's nats-server`;
  return null;
}

function tcpReady(port, ms) {
  const deadline = Date.now() + ms;
  return new Promise((resolve, reject) => {
    const attempt = () => {
      const s = net.connect(port, '127.0.0.1');
      s.once('data', (d) => { s.destroy(); if (/^INFO /.test(d.toString())) resolve(); else retry(); });
      s.once('error', () => { s.destroy(); retry(); });
    };
    const retry = () => (Date.now() > deadline ? reject(new Error(`nats-server not ready on ${port} within ${ms} ms`)) : setTimeout(attempt, 50));
    attempt();
  });
}

/**
 * Starts nats-server -js on 127.0.0.1.
 * @param {object} [o] {user, pass}: clients must log in as user with pass
 *        (url then carries them: nats://user:pass@127.0.0.1:port)
 * @returns {Promise<{url, port, stop(), start(), restart(), close(), log()}>}
 */
async function startNats(o = {}) {
  if (process.env.NATS_URL) {
    return {
      url: process.env.NATS_URL, external: true, log: () => '',
      async stop() {}, async close() {},
      async start() { throw new Error('NATS_URL names an external server: it cannot be restarted'); },
      async restart() { throw new Error('NATS_URL names an external server: it cannot be restarted'); },
    };
  }
  const dir = tmpDir('relaybus-nats-');
  const port = await freePort();
  const logPath = path.join(dir, 'nats.log');
  let child = null;
  let exited = null;
  const log = () => { try { return fs.readFileSync(logPath, 'utf8'); } catch { return ''; } };
  const start = async () => {
    const fd = fs.openSync(logPath, 'a');
    const auth = o.user ? ['--user', o.user, '--pass', o.pass] : [];
    child = spawn(natsServerBin(), ['-js', '-a', '127.0.0.1', '-p', String(port), '-sd', path.join(dir, 'store'), ...auth],
      { stdio: ['ignore', fd, fd] });
    fs.closeSync(fd);
    const c = child;
    exited = new Promise((resolve) => c.once('exit', resolve));
    process.on('exit', () => { try { c.kill('SIGKILL'); } catch { /* gone */ } });
    try {
      await Promise.race([tcpReady(port, READY_MS), exited.then(() => { throw new Error(`nats-server exited:\n${log()}`); })]);
    } catch (e) {
      c.kill('SIGKILL');
      throw e;
    }
  };
  const stop = async () => {
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    child.kill('SIGTERM');
    const done = await within(exited.then(() => true), STOP_MS, false);
    if (!done) { child.kill('SIGKILL'); await exited; }
  };
  await start();
  return {
    url: o.user ? `nats://${encodeURIComponent(o.user)}:${encodeURIComponent(o.pass)}@127.0.0.1:${port}` : `nats://127.0.0.1:${port}`,
    port, dir, log,
    stop,
    /** Starts it again (after stop) on the same port and store. */
    start,
    async restart() { await stop(); await start(); },
    async close() { await stop(); if (!process.env.RELAYBUS_KEEP_TEST_DIRS) fs.rmSync(dir, { recursive: true, force: true }); },
  };
}

module.exports = { startNats, natsSkipReason };
