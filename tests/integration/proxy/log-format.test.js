'use strict';
// Structured logs and a log destination that stalls.
// 1. log_format = json: every line the proxy writes parses as one JSON object with time, level,
//    thread, subsystem and msg; a connection's line carries conn and peer; a command name with
//    CR, LF, ESC and a quote stays on one line, escaped.
// 2. log_file with SIGUSR1: after the file is moved away (as logrotate does), SIGUSR1 makes the
//    proxy write to a new file at the configured path.
// 3. A stalled log reader (stderr a pipe nobody reads) does not stop forwarding: the proxy keeps
//    answering while it logs far more than the pipe holds, drops what does not fit in its queue,
//    and says how many lines it dropped once the reader catches up.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { spawn } = require('node:child_process');
const { MongoClient } = require('mongodb');
const H = require('../lib/proxy');

test('log_format = json: each line is one JSON object, client strings escaped', { timeout: 60000 }, async (t) => {
  const up = await H.startUpstream();
  t.after(() => up.stop());
  const proxy = await H.startProxy({ upstream: up.uri, settings: { log_format: 'json' } });
  t.after(() => proxy.kill());

  const conn = await H.WireConn.connect({ port: proxy.port });
  t.after(() => conn.destroy());
  assert.equal((await conn.command({ hello: 1, $db: 'admin' })).ok, 1);
  const name = 'relaybusX\r\n{"level":"error","msg":"forged"}\x1b[2K"\n';
  await conn.write(H.opMsg({ [name]: 1, $db: 'admin' }, { flags: 2 }).buf);
  await conn.waitClosed(5000);
  const peer = `127.0.0.1:${conn.localPort}`;
  assert.ok(await proxy.waitForLog(/moreToCome/, { needle: peer, timeoutMs: 3000 }), H.tail(proxy.log()));
  await proxy.stop();

  const lines = proxy.log().split('\n').filter((l) => l.length > 0);
  assert.ok(lines.length >= 3, 'the proxy logged its start, the connection and its exit');
  const objs = lines.map((l, i) => {
    try {
      return JSON.parse(l);
    } catch (e) {
      assert.fail(`line ${i + 1} is not JSON (${e.message}): ${l}`);
    }
    return null;
  });
  for (const o of objs) {
    assert.match(o.time, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
    assert.ok(['error', 'warn', 'info', 'debug'].includes(o.level), o.level);
    assert.equal(typeof o.thread, 'string');
    assert.equal(typeof o.subsystem, 'string');
    assert.equal(typeof o.msg, 'string');
  }
  assert.ok(objs.some((o) => /listening on/.test(o.msg)), 'the start-up line');
  const mine = objs.filter((o) => o.peer === peer);
  assert.ok(mine.length >= 1, `a line with peer ${peer}`);
  const closed = mine.find((o) => /moreToCome/.test(o.msg));
  assert.equal(closed.subsystem, 'client');
  assert.equal(typeof closed.conn, 'number');
  // The name, escaped as the text format escapes it, then JSON-encoded: no forged object.
  assert.ok(closed.msg.includes('relaybusX\\r\\n{"level":"error","msg":"forged"}\\x1b[2K"\\n'), closed.msg);
  assert.equal(objs.filter((o) => o.msg === 'forged').length, 0, 'no forged line');
  assert.ok(!/[\r\x1b]/.test(proxy.log()), 'no raw CR or ESC reached the log');
});

test('log_file: lines go to the file, and SIGUSR1 reopens it after a rotation', { timeout: 60000 }, async (t) => {
  const up = await H.startUpstream();
  t.after(() => up.stop());
  const dir = H.tmpDir('relaybus-logfile-');
  const file = path.join(dir, 'proxy.log');
  const proxy = await H.startProxy({ upstream: up.uri, settings: { log_file: file } });
  t.after(() => proxy.kill());
  const client = new MongoClient(proxy.uri(), { serverSelectionTimeoutMS: 10000 });
  await client.connect();
  t.after(() => client.close());
  assert.equal((await client.db('admin').command({ ping: 1 })).ok, 1);
  const waitIn = async (p, re) => {
    for (let i = 0; i < 100; i++) {
      if (fs.existsSync(p) && re.test(fs.readFileSync(p, 'utf8'))) return true;
      await H.sleep(50);
    }
    return false;
  };
  assert.ok(await waitIn(file, /listening on/), 'the start-up line is in log_file');
  fs.renameSync(file, `${file}.1`);
  process.kill(proxy.pid, 'SIGUSR1');
  assert.ok(await waitIn(file, /SIGUSR1: log file reopened/), 'a new file at the same path after SIGUSR1');
  assert.equal((await client.db('admin').command({ ping: 1 })).ok, 1, 'still forwarding');
  await client.close();
  await proxy.stop();
  assert.ok(/exit 0/.test(fs.readFileSync(file, 'utf8')), 'the last line went to the new file');
  assert.ok(!/SIGUSR1/.test(fs.readFileSync(`${file}.1`, 'utf8')), 'the rotated file got nothing after the rotation');
});

test('a log_file that is a FIFO is refused within 1 s of start, and --check-config prints no header value', { timeout: 30000 }, async (t) => {
  const dir = H.tmpDir('relaybus-logfifo-');
  const fifo = path.join(dir, 'proxy.log');
  require('node:child_process').execFileSync('mkfifo', [fifo]);
  const ini = path.join(dir, 'proxy.ini');
  fs.writeFileSync(ini, `[proxy]\nlisten = 127.0.0.1:0\nupstream = mongodb://127.0.0.1:9/?replicaSet=rs0\nlog_file = ${fifo}\n\n` +
    '[dispatch]\nenabled = false\n\n[handler h]\nevents = x\nkind = webhook\nurl = http://127.0.0.1:9/\nheader.X-Tenant-Id = tenant-pw-value\n');
  // An open for writing of a FIFO without a reader waits for one: the proxy must not.
  const t0 = Date.now();
  const child = spawn(H.proxyBin(), ['-c', ini], { stdio: ['ignore', 'ignore', 'pipe'] });
  t.after(() => child.kill('SIGKILL'));
  let err = '';
  child.stderr.on('data', (d) => { err += d; });
  const code = await Promise.race([new Promise((resolve) => child.once('exit', resolve)), H.sleep(3000).then(() => 'still running')]);
  const ms = Date.now() - t0;
  assert.notEqual(code, 'still running', `the proxy still waits on the FIFO after ${ms} ms`);
  assert.equal(code, 1);
  assert.ok(ms < 1000, `refused after ${ms} ms`);
  assert.match(err, /log_file.*not a regular file/);
  // --check-config (which opens no log file) prints no header value.
  const ok = require('node:child_process').spawnSync(H.proxyBin(), ['-c', ini, '--check-config'], { encoding: 'utf8', timeout: 5000 });
  assert.equal(ok.status, 0, ok.stderr);
  assert.match(ok.stdout, /^header\.X-Tenant-Id = \*{8}$/m);
  assert.doesNotMatch(ok.stdout + ok.stderr, /tenant-pw-value/);
});

test('a stalled log reader does not stop forwarding; dropped lines are counted', { timeout: 120000 }, async (t) => {
  const up = await H.startUpstream();
  t.after(() => up.stop());
  const port = await H.freePort();
  const dir = H.tmpDir('relaybus-logstall-');
  const ini = path.join(dir, 'proxy.ini');
  fs.writeFileSync(ini, `[proxy]\nlisten = 127.0.0.1:${port}\nupstream = ${up.uri}\n\n[dispatch]\nenabled = false\n`);
  // stderr is a pipe this test does not read until the end: once the pipe (64 KiB) is full, a
  // proxy that wrote its log lines itself would block in write(2), and stop forwarding.
  const child = spawn(H.proxyBin(), ['-c', ini], { stdio: ['ignore', 'ignore', 'pipe'] });
  t.after(() => child.kill('SIGKILL'));
  child.stderr.pause();
  let ready = false;
  for (let i = 0; i < 200 && !ready; i++) {
    ready = await new Promise((resolve) => {
      const s = require('node:net').connect(port, '127.0.0.1', () => { s.destroy(); resolve(true); });
      s.on('error', () => resolve(false));
    });
    if (!ready) await H.sleep(50);
  }
  assert.ok(ready, 'the proxy listens');
  const client = new MongoClient(`mongodb://127.0.0.1:${port}/?directConnection=true`, { serverSelectionTimeoutMS: 10000, maxPoolSize: 1 });
  await client.connect();
  t.after(() => client.close());
  // Each connection below is closed for a relaybus command sent with moreToCome, and the log
  // line says so with the command's name (2,000 bytes): about 6 MB of lines while the reader is
  // stalled, against a 1 MiB queue and a 64 KiB pipe.
  const t0 = Date.now();
  const name = `relaybus${'x'.repeat(2000)}`;
  for (let i = 0; i < 3000; i++) {
    const c = await H.WireConn.connect({ port });
    await c.write(H.opMsg({ [name]: 1, $db: 'admin' }, { flags: 2 }).buf);
    await c.waitClosed(5000);
    c.destroy();
    if (i % 250 === 0) assert.equal((await client.db('admin').command({ ping: 1 }, { timeoutMS: 5000 })).ok, 1, `still forwarding after ${i} connections`);
  }
  assert.equal((await client.db('admin').command({ ping: 1 })).ok, 1);
  const elapsed = Date.now() - t0;
  // Now read: the writer catches up and reports what it dropped.
  let log = '';
  child.stderr.setEncoding('utf8');
  child.stderr.on('data', (d) => { log += d; });
  child.stderr.resume();
  for (let i = 0; i < 200 && !/lines dropped: the log destination did not keep up/.test(log); i++) await H.sleep(50);
  assert.match(log, /log: \d+ lines dropped: the log destination did not keep up/, `after ${elapsed} ms:\n${H.tail(log)}`);
  await client.close();
  child.kill('SIGTERM');
  const code = await new Promise((resolve) => child.on('exit', (c) => resolve(c)));
  assert.equal(code, 0);
});
