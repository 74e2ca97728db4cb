'use strict';
// The proxy's own limits and lifecycle: a client that never says hello is closed after
// handshake_timeout_ms (and not before); a connection beyond max_clients is closed at accept
// with a log line while the others keep working; SIGTERM lets a request in flight finish
// within drain_timeout_ms and then exits 0; when the upstream goes away, client connections are
// closed (drivers see a network error) and the proxy keeps running.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const H = require('../lib/proxy');

const HANDSHAKE_TIMEOUT_MS = 800;
const MAX_CLIENTS = 6;

let upstream;
const DB = H.uniqueDbName('limits');

test.before(async () => {
  upstream = await H.startUpstream();
});

test('a client that sends nothing is closed after handshake_timeout_ms, not before', async () => {
  const proxy = await H.startProxy({ upstream: upstream.uri, settings: { handshake_timeout_ms: HANDSHAKE_TIMEOUT_MS } });
  const silent = await H.WireConn.connect({ port: proxy.port });
  const t0 = Date.now();
  const ready = await H.WireConn.connect({ port: proxy.port });
  assert.equal((await ready.command({ hello: 1, $db: 'admin' })).ok, 1);
  await silent.waitClosed(HANDSHAKE_TIMEOUT_MS + 4000);
  const after = silent.closedAt - t0;
  assert.ok(after >= HANDSHAKE_TIMEOUT_MS - 150, `closed after ${after} ms, before handshake_timeout_ms`);
  const line = await proxy.waitForLog(/handshake|hello|timeout|timed out/i, { needle: `127.0.0.1:${silent.localPort}` });
  assert.ok(line, 'the log names the handshake timeout');
  // The connection that completed its hello is not subject to the handshake timeout.
  await H.sleep(HANDSHAKE_TIMEOUT_MS + 500);
  assert.equal(ready.closed, false, 'a connection past its hello stays open');
  assert.equal((await ready.command({ ping: 1, $db: 'admin' })).ok, 1);
  ready.destroy();
  await proxy.stop();
});

test('beyond max_clients a new connection is closed at accept; the others are unaffected', async () => {
  const proxy = await H.startProxy({ upstream: upstream.uri, settings: { max_clients: MAX_CLIENTS } });
  const conns = [];
  try {
    for (let i = 0; i < MAX_CLIENTS; i++) {
      const c = await H.WireConn.connect({ port: proxy.port });
      assert.equal((await c.command({ hello: 1, $db: 'admin' })).ok, 1, `client ${i + 1} of ${MAX_CLIENTS}`);
      conns.push(c);
    }
    const extra = await H.WireConn.connect({ port: proxy.port });
    await extra.write(H.opMsg({ hello: 1, $db: 'admin' }).buf).catch(() => {});
    await extra.waitClosed(3000);
    assert.equal(extra.queue.length, 0, 'the extra connection got no reply');
    const line = await proxy.waitForLog(/refusing a connection .*max_clients/i);
    assert.ok(line, 'the proxy logs that max_clients was reached');
    assert.ok(line.includes(`127.0.0.1:${extra.localPort}`), `the refusal names the refused peer 127.0.0.1:${extra.localPort}: ${line}`);
    for (const c of conns) assert.equal((await c.command({ ping: 1, $db: 'admin' })).ok, 1, 'existing clients still work');
    // A slot frees up when a client leaves.
    conns.shift().end();
    await H.sleep(300);
    const again = await H.WireConn.connect({ port: proxy.port });
    assert.equal((await again.command({ hello: 1, $db: 'admin' })).ok, 1, 'a new client fits after one left');
    conns.push(again);
  } finally {
    for (const c of conns) c.destroy();
  }
  await proxy.stop();
});

test('SIGTERM: a request in flight completes, then the proxy exits 0 within drain_timeout_ms', async (t) => {
  const skip = H.doubleOnlySkipReason('blockConnection fail point timing');
  if (skip) return t.skip(skip);
  const proxy = await H.startProxy({ upstream: upstream.uri, settings: { drain_timeout_ms: 5000 } });
  const app = `rbit-drain-${process.pid}`;
  const c = await H.WireConn.connect({ port: proxy.port });
  assert.equal((await c.command({ hello: 1, $db: 'admin', client: { application: { name: app } } })).ok, 1);
  const admin = await H.WireConn.connect({ port: proxy.port });
  await admin.command({ hello: 1, $db: 'admin' });
  const fp = await admin.command({
    configureFailPoint: 'failCommand',
    mode: { times: 1 },
    data: { failCommands: ['ping'], blockConnection: true, blockTimeMS: 1500, appName: app },
    $db: 'admin',
  });
  assert.equal(fp.ok, 1);
  admin.destroy();
  const ping = H.opMsg({ ping: 1, $db: 'admin' });
  await c.write(ping.buf);
  await H.sleep(300); // the ping is now blocked upstream
  const t0 = Date.now();
  proxy.terminate();
  // New connections are refused while draining.
  await H.sleep(200);
  const late = await H.WireConn.connect({ port: proxy.port, timeoutMs: 1000 }).catch((e) => e);
  if (!(late instanceof Error)) {
    const r = await late.command({ hello: 1, $db: 'admin' }, { timeoutMs: 2000 }).catch((e) => e);
    late.destroy();
    assert.ok(r instanceof Error, 'a connection opened after SIGTERM is not served');
  }
  const reply = await c.next({ timeoutMs: 5000 });
  assert.equal(reply.responseTo, ping.requestID);
  assert.equal(reply.doc.ok, 1, 'the request in flight got its reply');
  await c.waitClosed(5000);
  const r = await proxy.stop();
  assert.equal(r.code, 0);
  assert.ok(Date.now() - t0 < 5000 + 2000, 'exited within drain_timeout_ms');
});

test('when the upstream goes away, clients are closed and the proxy stays up', async () => {
  const own = await H.startDouble();
  const proxy = await H.startProxy({ upstream: own.uri, settings: { upstream_connect_timeout_ms: 1000 } });
  const client = new MongoClient(proxy.uri({}, { credentials: false }), { serverSelectionTimeoutMS: 1500, retryWrites: false, retryReads: false });
  try {
    await client.db(DB).collection('x').insertOne({ _id: 1 });
    const raw = await H.WireConn.connect({ port: proxy.port });
    assert.equal((await raw.command({ hello: 1, $db: 'admin' })).ok, 1);
    await own.stop();
    await raw.waitClosed(5000);
    const line = await proxy.waitForLog(/upstream/i, { needle: `127.0.0.1:${raw.localPort}` });
    assert.ok(line, 'the close is logged with an upstream reason');
    await assert.rejects(client.db(DB).collection('x').insertOne({ _id: 2 }));
    assert.equal(proxy.exitInfo(), null, 'the proxy is still running');
    // A new client cannot be served, and is told so by a close (not left hanging forever).
    const c2 = await H.WireConn.connect({ port: proxy.port });
    const r = await c2.command({ hello: 1, $db: 'admin' }, { timeoutMs: 8000 }).catch((e) => e);
    if (!(r instanceof Error)) assert.equal(r.ok, 0, 'no successful hello without an upstream');
    c2.destroy();
  } finally {
    await client.close();
  }
  await proxy.stop();
});

test('a client that hangs up while its request is in flight upstream: no crash, no leak', async (t) => {
  const skip = H.doubleOnlySkipReason('blockConnection fail point timing');
  if (skip) return t.skip(skip);
  const fs = require('node:fs');
  const proxy = await H.startProxy({ upstream: upstream.uri });
  const app = `rbit-hangup-${process.pid}`;
  const fds = () => fs.readdirSync(`/proc/${proxy.pid}/fd`).length;
  const admin = await H.WireConn.connect({ port: proxy.port });
  await admin.command({ hello: 1, $db: 'admin' });
  const baseline = fds();
  await admin.command({
    configureFailPoint: 'failCommand',
    mode: { times: 5 },
    data: { failCommands: ['ping', 'find'], blockConnection: true, blockTimeMS: 700, appName: app },
    $db: 'admin',
  });
  const peers = [];
  for (let i = 0; i < 5; i++) {
    const c = await H.WireConn.connect({ port: proxy.port });
    await c.command({ hello: 1, $db: 'admin', client: { application: { name: app } } });
    await c.write(Buffer.concat([H.opMsg({ ping: 1, $db: 'admin' }).buf, H.opMsg({ find: 'nothing', filter: {}, $db: DB }).buf]));
    peers.push(`127.0.0.1:${c.localPort}`);
    if (i % 2) c.destroy(); // abrupt
    else c.end(); // orderly half-close with requests outstanding
  }
  await H.sleep(2500); // the blocked replies arrive for clients that are gone
  assert.equal(proxy.exitInfo(), null, 'the proxy is still running');
  for (const peer of peers) assert.ok(proxy.logLines(peer).some((l) => /clos/i.test(l)), `close of ${peer} logged`);
  const deadline = Date.now() + 5000;
  let n = fds();
  while (n > baseline && Date.now() < deadline) {
    await H.sleep(100);
    n = fds();
  }
  assert.ok(n <= baseline, `descriptors back to ${baseline} (now ${n}): client and upstream sockets released`);
  assert.equal((await admin.command({ ping: 1, $db: 'admin' })).ok, 1, 'other clients unaffected');
  await admin.command({ configureFailPoint: 'failCommand', mode: 'off', $db: 'admin' });
  admin.destroy();
  await proxy.stop();
});

test('a standalone upstream is refused at start-up with an error that says why', async (t) => {
  const skip = H.doubleOnlySkipReason('--standalone');
  if (skip) return t.skip(skip);
  const standalone = await H.startDouble({ standalone: true });
  try {
    const r = await H.runProxyExpectingExit({ upstream: `mongodb://127.0.0.1:${standalone.port}/`, timeoutMs: 30000 });
    assert.equal(r.timedOut, false, `the proxy kept running against a standalone; log:\n${H.tail(r.log)}`);
    assert.equal(r.signal, null, `the proxy died by a signal; log:\n${H.tail(r.log)}`);
    assert.notEqual(r.code, 0, 'non-zero exit status');
    assert.match(r.log, /standalone/i, 'the error names the standalone');
    assert.match(r.log, /transaction|replica set|mongos/i, 'and says why it is refused');
    H.assertNoSanitizerReports(r.log, 'proxy against a standalone');
  } finally {
    await standalone.stop();
  }
});

test('a "not primary" error is relayed, the driver retries, and the write lands once', async () => {
  const proxy = await H.startProxy({ upstream: upstream.uri });
  const app = `rbit-notprimary-${process.pid}`;
  const events = [];
  const client = new MongoClient(proxy.uri(), { appName: app, monitorCommands: true, serverSelectionTimeoutMS: 10000 });
  client.on('commandFailed', (e) => events.push({ name: e.commandName, code: e.failure && e.failure.code }));
  client.on('commandSucceeded', (e) => events.push({ name: e.commandName, ok: true }));
  try {
    const coll = client.db(DB).collection('np');
    await coll.insertOne({ _id: 'warm' });
    await client.db('admin').command({
      configureFailPoint: 'failCommand',
      mode: { times: 1 },
      data: { failCommands: ['insert'], errorCode: 10107, errorLabels: ['RetryableWriteError'], appName: app },
    });
    try {
      await coll.insertOne({ _id: 'np1' });
    } finally {
      await client.db('admin').command({ configureFailPoint: 'failCommand', mode: 'off' });
    }
    const inserts = events.filter((e) => e.name === 'insert');
    assert.deepEqual(inserts.slice(-2), [{ name: 'insert', code: 10107 }, { name: 'insert', ok: true }], 'NotWritablePrimary relayed, then the retry succeeded');
    assert.equal(await coll.countDocuments({ _id: 'np1' }), 1);
    // New pairings still reach the primary.
    const fresh = new MongoClient(proxy.uri(), { serverSelectionTimeoutMS: 10000 });
    try {
      await fresh.db(DB).collection('np').insertOne({ _id: 'np2' });
    } finally {
      await fresh.close();
    }
    assert.equal(await coll.countDocuments({}), 3);
  } finally {
    await client.close();
  }
  await proxy.stop();
});

test('a member\'s topologyVersion in a relayed error is not shown: the mongos persona has none', async () => {
  // A not-primary or shutdown error of a member carries its topologyVersion. A driver would take it
  // as the proxy's, ask the proxy for a streaming hello it does not serve, fail its monitor and clear
  // its pool; so the proxy relays the error without it (everything else unchanged).
  const proxy = await H.startProxy({ upstream: upstream.uri });
  const app = `rbit-tv-${process.pid}`;
  const viaProxy = new MongoClient(proxy.uri(), { appName: app, retryReads: false, serverSelectionTimeoutMS: 10000 });
  const direct = new MongoClient(upstream.directUri || upstream.uri, { appName: app, retryReads: false, serverSelectionTimeoutMS: 10000 });
  const fail = (c) => c.db('admin').command({
    configureFailPoint: 'failCommand', mode: { times: 1 },
    data: { failCommands: ['find'], errorCode: 91, appName: app },
  });
  const errorOf = async (c) => {
    try {
      await c.db(DB).collection('tv').findOne({});
    } catch (e) {
      return e;
    }
    return null;
  };
  try {
    await fail(direct);
    const de = await errorOf(direct);
    await fail(viaProxy);
    const pe = await errorOf(viaProxy);
    assert.ok(de && pe, 'both finds failed');
    assert.equal(pe.code, 91);
    assert.equal(pe.codeName, de.codeName);
    assert.deepEqual(pe.errorResponse.errorLabels, de.errorResponse.errorLabels, 'the server\'s labels unchanged');
    assert.ok(de.errorResponse.topologyVersion, 'the member itself sends its topologyVersion');
    assert.equal(pe.errorResponse.topologyVersion, undefined, 'no topologyVersion through the proxy');
    // The driver keeps working through the proxy at once (its monitor was not sent streaming).
    await viaProxy.db(DB).collection('tv').insertOne({ after: 1 });
  } finally {
    await viaProxy.db('admin').command({ configureFailPoint: 'failCommand', mode: 'off' }).catch(() => {});
    await viaProxy.close();
    await direct.close();
  }
  await proxy.stop();
});

H.registerFinalChecks(test, [() => upstream && upstream.stop()]);
