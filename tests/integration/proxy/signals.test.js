'use strict';
// Signals in every state of the proxy's life (docs/operations.md, Signals). SIGHUP while running
// reloads. Once stopping (after SIGTERM or SIGINT), a SIGHUP is logged and ignored: the drain
// goes on, the request in flight gets its reply and the proxy exits 0. A second stop signal
// closes everything at once and a third changes nothing. Signals during start-up (the proxy
// waiting for an unreachable upstream) do not kill it: SIGHUP is dropped, SIGTERM stops it as
// soon as it is up. A blockConnection fail point keeps one request in flight upstream, so the
// proxy is still draining when the later signals arrive.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { spawn } = require('node:child_process');
const H = require('../lib/proxy');

const BLOCK_MS = 2500;
let upstream;

test.before(async () => {
  upstream = await H.startUpstream();
});

/** Resolves { code, signal } once the process has exited, or fails after `ms`. */
async function exitOf(child, ms, log) {
  const deadline = Date.now() + ms;
  while (child.exitCode === null && child.signalCode === null) {
    if (Date.now() > deadline) assert.fail(`the proxy did not exit within ${ms} ms; log tail:\n${H.tail(log())}`);
    await H.sleep(50);
  }
  return { code: child.exitCode, signal: child.signalCode };
}

function assertCleanExit(r, log) {
  assert.equal(r.signal, null, `the proxy died by signal ${r.signal}; log tail:\n${H.tail(log())}`);
  assert.equal(r.code, 0, `exit code; log tail:\n${H.tail(log())}`);
}

/**
 * A proxy with one ping blocked upstream for BLOCK_MS (so a drain has something to wait for).
 * Returns { proxy, conn, ping } or a skip message.
 */
async function busyProxy() {
  const raw = H.rawDataSkipReason();
  if (raw) return { skip: raw };
  const proxy = await H.startProxy({ upstream: upstream.uri, settings: { drain_timeout_ms: 8000 } });
  const app = `rbit-signals-${process.pid}-${Math.random().toString(36).slice(2, 8)}`;
  const conn = await H.WireConn.connect({ port: proxy.port });
  assert.equal((await conn.command({ hello: 1, $db: 'admin', client: { application: { name: app } } })).ok, 1);
  const admin = await H.WireConn.connect({ port: proxy.port });
  await admin.command({ hello: 1, $db: 'admin' });
  const fp = await admin.command({
    configureFailPoint: 'failCommand',
    mode: { times: 1 },
    data: { failCommands: ['ping'], blockConnection: true, blockTimeMS: BLOCK_MS, appName: app },
    $db: 'admin',
  });
  admin.destroy();
  if (fp.ok !== 1) {
    conn.destroy();
    await proxy.stop();
    return { skip: `the upstream refused the failCommand fail point (${fp.errmsg}); needs test commands enabled` };
  }
  const ping = H.opMsg({ ping: 1, $db: 'admin' });
  await conn.write(ping.buf);
  await H.sleep(300); // the ping is now blocked upstream
  return { proxy, conn, ping };
}

async function waitLog(proxy, re, what) {
  const line = await proxy.waitForLog(re, { timeoutMs: 4000 });
  assert.ok(line, `${what}: no log line matching ${re}; log tail:\n${H.tail(proxy.log())}`);
  return line;
}

test('SIGHUP while running reloads, and the proxy keeps serving', async () => {
  const proxy = await H.startProxy({ upstream: upstream.uri });
  proxy.child.kill('SIGHUP');
  await waitLog(proxy, /reloaded /, 'reload');
  const c = await H.WireConn.connect({ port: proxy.port });
  assert.equal((await c.command({ hello: 1, $db: 'admin' })).ok, 1);
  assert.equal((await c.command({ ping: 1, $db: 'admin' })).ok, 1);
  c.destroy();
  await proxy.stop();
});

for (const stopSignal of ['SIGTERM', 'SIGINT']) {
  test(`${stopSignal}, then SIGHUP while draining: the reload is logged and ignored, the request in flight completes, exit 0`, async (t) => {
    const b = await busyProxy();
    if (b.skip) return t.skip(b.skip);
    const { proxy, conn, ping } = b;
    proxy.child.kill(stopSignal);
    await waitLog(proxy, new RegExp(`${stopSignal}: draining`), 'drain');
    proxy.child.kill('SIGHUP');
    await waitLog(proxy, /SIGHUP while stopping: reload ignored/, 'ignored reload');
    assert.equal(proxy.exitInfo(), null, 'still draining after the SIGHUP');
    const reply = await conn.next({ timeoutMs: BLOCK_MS + 3000 });
    assert.equal(reply.responseTo, ping.requestID);
    assert.equal(reply.doc.ok, 1, 'the request in flight got its reply');
    await conn.waitClosed(5000);
    assertCleanExit(await exitOf(proxy.child, 10000, proxy.log), proxy.log);
    assert.doesNotMatch(proxy.log(), /reloaded /, 'no reload happened while stopping');
    await proxy.stop(); // already exited: checks code 0 again and marks it stopped
  });
}

test('SIGTERM, SIGHUP, SIGTERM, SIGTERM: the second stop closes everything at once, the third changes nothing, exit 0', async (t) => {
  const b = await busyProxy();
  if (b.skip) return t.skip(b.skip);
  const { proxy, conn } = b;
  proxy.child.kill('SIGTERM');
  await waitLog(proxy, /SIGTERM: draining/, 'drain');
  proxy.child.kill('SIGHUP');
  await waitLog(proxy, /SIGHUP while stopping: reload ignored/, 'ignored reload');
  const t0 = Date.now();
  proxy.child.kill('SIGTERM');
  await H.sleep(20);
  if (proxy.exitInfo() === null) proxy.child.kill('SIGTERM');
  await conn.waitClosed(3000);
  assertCleanExit(await exitOf(proxy.child, 5000, proxy.log), proxy.log);
  assert.ok(Date.now() - t0 < BLOCK_MS, 'the second SIGTERM did not wait for the blocked request');
  await waitLog(proxy, /SIGTERM again: closing everything now/, 'forced close');
  await proxy.stop();
});

test('signals during start-up: SIGHUP is dropped, SIGTERM stops the proxy once it is up, exit 0', async () => {
  // An upstream port nobody listens on: start-up waits upstream_connect_timeout_ms + 1 s for it.
  const dead = await H.freePort();
  const port = await H.freePort();
  const dir = H.tmpDir('relaybus-signals-');
  const ini = path.join(dir, 'proxy.ini');
  fs.writeFileSync(
    ini,
    ['[proxy]', `listen = 127.0.0.1:${port}`, `upstream = mongodb://127.0.0.1:${dead}/?replicaSet=rs0`, 'upstream_connect_timeout_ms = 1500', '', '[dispatch]', 'enabled = false', ''].join('\n'),
  );
  const logPath = path.join(dir, 'proxy.stderr');
  const errFd = fs.openSync(logPath, 'a');
  const child = spawn(H.proxyBin(), ['-c', ini], { stdio: ['ignore', errFd, errFd] });
  fs.closeSync(errFd);
  const log = () => fs.readFileSync(logPath, 'utf8');
  try {
    await H.sleep(400); // past argument parsing, waiting for the upstream
    assert.equal(child.exitCode, null, `the proxy is still starting; log:\n${log()}`);
    child.kill('SIGHUP');
    await H.sleep(200);
    assert.equal(child.signalCode, null, `SIGHUP during start-up killed the proxy; log:\n${log()}`);
    child.kill('SIGTERM');
    assertCleanExit(await exitOf(child, 10000, log), log);
    assert.match(log(), /SIGTERM during start-up: draining/);
    H.assertNoSanitizerReports(log(), 'proxy stopped during start-up');
    fs.rmSync(dir, { recursive: true, force: true });
  } finally {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  }
});

test('SIGTERM with the upstream gone: a dispatching proxy exits 0 within 2 s', async (t) => {
  const skip = H.doubleOnlySkipReason('stopping the upstream');
  if (skip) return t.skip(skip);
  // Its own double, stopped under the proxy (the README's `kill %3 %2 %1` order).
  const double = await H.startDouble();
  const D = require('../dispatch/helpers');
  const p = await D.startDispatchProxy({
    upstream: double.uri,
    outbox: { database: `rbit_signals_${process.pid}` },
    dispatch: { poll_interval_ms: 100 },
    handlers: [{ name: 'gone', kind: 'webhook', events: 'x.*', url: 'http://127.0.0.1:9/hooks', secret: D.newSecret() }],
  });
  try {
    // Running: its change stream on the deliveries is open (it starts after the first claim).
    await D.waitFor(() => /dispatch: watching \S+ for new deliveries/.test(p.log()), 10000, 'the dispatcher');
    await double.stop();
    const t0 = Date.now();
    p.child.kill('SIGTERM');
    const r = await H.within(p.exited, 10000, null);
    const took = Date.now() - t0;
    assert.ok(r, `the proxy did not exit within 10 s of SIGTERM; log tail:\n${H.tail(p.log())}`);
    assert.deepEqual(r, { code: 0, signal: null }, `exit; log tail:\n${H.tail(p.log())}`);
    assert.ok(took < 2000, `the proxy took ${took} ms to exit; log tail:\n${H.tail(p.log())}`);
    H.assertNoSanitizerReports(p.log(), 'proxy stopped with its upstream gone');
  } finally {
    await p.kill();
    await double.stop();
  }
});

H.registerFinalChecks(test, [() => upstream && upstream.stop()]);
