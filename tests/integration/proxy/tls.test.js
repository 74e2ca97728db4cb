'use strict';
// TLS through the proxy. Certificates are made with openssl in a temp dir: a CA, a server
// certificate for CN/SAN 127.0.0.1 and localhost, a client certificate, and a second, unrelated
// CA. Client side: the proxy serves TLS (tls_cert_file/tls_key_file); the Node.js driver and the
// mongo-c-driver client run their core checks with tls=true&tlsCAFile=...; a plaintext client,
// a client trusting another CA, and (with tls_ca_file) a client without a certificate are
// refused. Upstream side: needs the double to serve TLS (--tls-cert-file/--tls-key-file); the
// test skips with a message when the double rejects those options. (A socat TLS terminator on
// another port is not a faithful stand-in: the double's hello names its own port as `me`/hosts,
// and the proxy learns the primary from that through mongo-c-driver's topology monitoring.)

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const tls = require('node:tls');
const { execFileSync } = require('node:child_process');
const { MongoClient } = require('mongodb');
const H = require('../lib/proxy');

const DB = H.uniqueDbName('tls');
let dir;
let upstream;
let proxy; // TLS to clients, no client certificates required
let mproxy; // TLS to clients, client certificates required (tls_ca_file)
let cbin;
const files = {};

function openssl(args) {
  execFileSync('openssl', args, { cwd: dir, stdio: ['ignore', 'ignore', 'pipe'] });
}

function makeCerts() {
  dir = H.tmpDir('relaybus-tls-');
  const ext = path.join(dir, 'server.ext');
  fs.writeFileSync(ext, 'subjectAltName = IP:127.0.0.1, DNS:localhost\nbasicConstraints = CA:FALSE\nkeyUsage = digitalSignature, keyEncipherment\nextendedKeyUsage = serverAuth\n');
  const cext = path.join(dir, 'client.ext');
  fs.writeFileSync(cext, 'basicConstraints = CA:FALSE\nkeyUsage = digitalSignature, keyEncipherment\nextendedKeyUsage = clientAuth\n');
  for (const ca of ['ca', 'otherca']) {
    openssl(['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '2', '-subj', `/CN=relaybus test ${ca}`, '-keyout', `${ca}.key`, '-out', `${ca}.pem`]);
  }
  openssl(['req', '-newkey', 'rsa:2048', '-nodes', '-subj', '/CN=127.0.0.1', '-keyout', 'server.key', '-out', 'server.csr']);
  openssl(['x509', '-req', '-in', 'server.csr', '-CA', 'ca.pem', '-CAkey', 'ca.key', '-CAcreateserial', '-days', '2', '-extfile', ext, '-out', 'server.pem']);
  openssl(['req', '-newkey', 'rsa:2048', '-nodes', '-subj', '/CN=relaybus test client', '-keyout', 'client.key', '-out', 'client.csr']);
  openssl(['x509', '-req', '-in', 'client.csr', '-CA', 'ca.pem', '-CAkey', 'ca.key', '-CAcreateserial', '-days', '2', '-extfile', cext, '-out', 'client.crt']);
  const j = (f) => path.join(dir, f);
  fs.writeFileSync(j('client.pem'), fs.readFileSync(j('client.crt')) + fs.readFileSync(j('client.key')));
  fs.writeFileSync(j('server-combined.pem'), fs.readFileSync(j('server.pem')) + fs.readFileSync(j('server.key')));
  Object.assign(files, {
    ca: j('ca.pem'),
    otherCa: j('otherca.pem'),
    serverCert: j('server.pem'),
    serverKey: j('server.key'),
    serverCombined: j('server-combined.pem'),
    client: j('client.pem'),
  });
}

test.before(async () => {
  makeCerts();
  cbin = H.buildCdriverClient();
  upstream = await H.startUpstream();
  proxy = await H.startProxy({
    upstream: upstream.uri,
    settings: { tls_cert_file: files.serverCert, tls_key_file: files.serverKey, compressors: 'zlib,zstd,snappy' },
    tlsClient: { ca: files.ca },
  });
});

/** The core driver checks: CRUD, a multi-batch cursor, a transaction. */
async function nodeCoreChecks(uri, tag) {
  const events = [];
  const client = new MongoClient(uri, { serverSelectionTimeoutMS: 10000, monitorCommands: true });
  client.on('commandStarted', (e) => events.push(e.commandName));
  try {
    const hello = await client.db('admin').command({ hello: 1 });
    assert.equal(hello.msg, 'isdbgrid');
    const coll = client.db(DB).collection(`core_${tag}`);
    await coll.insertMany(Array.from({ length: 30 }, (_, i) => ({ _id: i, v: `v${i}` })));
    await coll.updateOne({ _id: 3 }, { $set: { v: 'three' } });
    assert.deepEqual(await coll.findOne({ _id: 3 }), { _id: 3, v: 'three' });
    await coll.deleteOne({ _id: 4 });
    const all = await coll.find({}, { batchSize: 4, sort: { _id: 1 } }).toArray();
    assert.equal(all.length, 29);
    assert.ok(events.filter((e) => e === 'getMore').length >= 6, 'cursor used several getMores');
    const s = client.startSession();
    try {
      await s.withTransaction(async () => {
        await coll.insertOne({ _id: 'tx' }, { session: s });
        await coll.updateOne({ _id: 0 }, { $set: { v: 'tx' } }, { session: s });
      });
    } finally {
      await s.endSession();
    }
    assert.equal(await coll.countDocuments({ $or: [{ _id: 'tx' }, { v: 'tx' }] }), 2);
  } finally {
    await client.close();
  }
}

test('client TLS: the Node.js driver (tls=true&tlsCAFile) does CRUD, cursors and a transaction', async () => {
  await nodeCoreChecks(proxy.uri({ tls: 'true', tlsCAFile: files.ca }), 'node127');
});

test('client TLS: host name verification against the SAN "localhost" also passes', async () => {
  const uri = proxy.uri({ tls: 'true', tlsCAFile: files.ca }).replace('127.0.0.1', 'localhost');
  await nodeCoreChecks(uri, 'nodelocalhost');
});

test('client TLS with compressors=zlib: data round-trips', async () => {
  await nodeCoreChecks(proxy.uri({ tls: 'true', tlsCAFile: files.ca, compressors: 'zlib' }), 'nodezlib');
});

for (const compressor of [null, 'zlib', 'zstd']) {
  test(`client TLS: mongo-c-driver ${compressor ? 'compressors=' + compressor : 'plain'}`, async () => {
    const params = { tls: 'true', tlsCAFile: files.ca };
    if (compressor) params.compressors = compressor;
    const r = await H.runCdriverClient(cbin, proxy.uri(params), H.uniqueDbName(`tlsc_${compressor || 'plain'}`));
    assert.equal(r.code, 0, `cdriver-client failed:\n${r.stdout}\n${r.stderr}`);
    assert.match(r.stdout, /^ok all/m);
  });
}

test('client TLS: 300 concurrent TLS connections each complete a hello and a ping, then close cleanly', { timeout: 120000 }, async () => {
  const conns = [];
  try {
    for (let i = 0; i < 300; i += 50) {
      await Promise.all(
        Array.from({ length: 50 }, async () => {
          const c = await H.WireConn.connect({ port: proxy.port, tls: { ca: files.ca }, timeoutMs: 20000 });
          conns.push(c);
          const h = await c.command({ hello: 1, $db: 'admin' }, { timeoutMs: 20000 });
          assert.equal(h.msg, 'isdbgrid');
        }),
      );
    }
    await Promise.all(conns.map(async (c) => assert.equal((await c.command({ ping: 1, $db: 'admin' }, { timeoutMs: 20000 })).ok, 1)));
    await Promise.all(
      conns.map(async (c) => {
        c.end();
        const r = await c.waitClosed(20000);
        assert.equal(r.hadError, false, `TLS connection ${c.peer} closed with an error: ${c.error && c.error.message}`);
      }),
    );
  } finally {
    for (const c of conns) c.destroy();
  }
});

test('client TLS: a plaintext client is refused and the proxy logs why', async () => {
  const client = new MongoClient(proxy.uri({ tls: 'false' }), { serverSelectionTimeoutMS: 2000 });
  try {
    await assert.rejects(client.db('admin').command({ ping: 1 }));
  } finally {
    await client.close();
  }
  // Raw plaintext hello: no well-formed reply, the connection is closed.
  const c = await H.WireConn.connect({ port: proxy.port });
  try {
    await c.write(H.opMsg({ hello: 1, $db: 'admin' }).buf);
    await c.waitClosed(5000);
    assert.equal(c.queue.length, 0, 'no wire-protocol reply to a plaintext request on a TLS port');
    const line = await proxy.waitForLog(/tls|ssl|handshake/i, { needle: `127.0.0.1:${c.localPort}` });
    assert.ok(line, `proxy log names the TLS failure for 127.0.0.1:${c.localPort}:\n${proxy.log().split('\n').slice(-10).join('\n')}`);
  } finally {
    c.destroy();
  }
});

test('client TLS: a client trusting another CA refuses the proxy certificate', async () => {
  const client = new MongoClient(proxy.uri({ tls: 'true', tlsCAFile: files.otherCa }), { serverSelectionTimeoutMS: 2000 });
  try {
    await assert.rejects(client.db('admin').command({ ping: 1 }), /certificate|self.signed|verify/i);
  } finally {
    await client.close();
  }
  const r = await H.runCdriverClient(cbin, proxy.uri({ tls: 'true', tlsCAFile: files.otherCa, serverSelectionTimeoutMS: 2000 }), DB, 30000);
  assert.notEqual(r.code, 0, 'mongo-c-driver refuses a certificate from an untrusted CA');
});

test('mutual TLS (tls_ca_file): a client certificate from the CA is required', async () => {
  mproxy = await H.startProxy({
    upstream: upstream.uri,
    settings: { tls_cert_file: files.serverCert, tls_key_file: files.serverKey, tls_ca_file: files.ca },
    tlsClient: { ca: files.ca, cert: files.client },
  });
  await nodeCoreChecks(mproxy.uri({ tls: 'true', tlsCAFile: files.ca, tlsCertificateKeyFile: files.client }), 'mtls');
  const r = await H.runCdriverClient(cbin, mproxy.uri({ tls: 'true', tlsCAFile: files.ca, tlsCertificateKeyFile: files.client }), H.uniqueDbName('mtlsc'));
  assert.equal(r.code, 0, `cdriver-client with a client certificate failed:\n${r.stdout}\n${r.stderr}`);
  const nocert = new MongoClient(mproxy.uri({ tls: 'true', tlsCAFile: files.ca }), { serverSelectionTimeoutMS: 2000 });
  try {
    await assert.rejects(nocert.db('admin').command({ ping: 1 }));
  } finally {
    await nocert.close();
  }
  // A raw TLS connection without a certificate does not get a reply.
  const sock = tls.connect({ host: '127.0.0.1', port: mproxy.port, ca: fs.readFileSync(files.ca), servername: 'localhost' });
  const outcome = await new Promise((resolve) => {
    let data = false;
    sock.on('secureConnect', () => sock.write(H.opMsg({ hello: 1, $db: 'admin' }).buf));
    sock.on('data', () => {
      data = true;
    });
    sock.on('error', () => {});
    sock.on('close', () => resolve({ data }));
    setTimeout(() => resolve({ data, timeout: true }), 5000);
  });
  sock.destroy();
  assert.equal(outcome.timeout, undefined, 'the proxy closed the connection');
  assert.equal(outcome.data, false, 'no reply without a client certificate');
});

test('upstream TLS: the proxy talks TLS to a double that serves it', async (t) => {
  let tlsUpstream;
  try {
    tlsUpstream = await H.startDouble({ args: ['--tls-cert-file', files.serverCombined, '--tls-key-file', files.serverKey] });
  } catch (e) {
    t.skip(`the server double does not serve TLS (${String(e.message).split('\n')[0]}); upstream TLS untested`);
    return;
  }
  try {
    const uri = `mongodb://127.0.0.1:${tlsUpstream.port}/?replicaSet=rs0&tls=true&tlsCAFile=${encodeURIComponent(files.ca)}`;
    const p = await H.startProxy({ upstream: uri, settings: { tls_cert_file: files.serverCert, tls_key_file: files.serverKey }, tlsClient: { ca: files.ca } });
    assert.doesNotMatch(p.log(), /upstream without TLS/i, 'the proxy must not say it runs the upstream without TLS');
    await nodeCoreChecks(p.uri({ tls: 'true', tlsCAFile: files.ca }, { credentials: false }), 'uptls');
    const r = await H.runCdriverClient(cbin, p.uri({ tls: 'true', tlsCAFile: files.ca, compressors: 'zlib' }, { credentials: false }), H.uniqueDbName('uptlsc'));
    assert.equal(r.code, 0, `cdriver-client through TLS both sides failed:\n${r.stdout}\n${r.stderr}`);
    await p.stop();
    // Pooled mode: the pool's connections talk TLS to the upstream too, and clients TLS to the proxy.
    const pooled = await H.startProxy({ upstream: uri, settings: { pool_mode: 'pooled', pool_size: 2, tls_cert_file: files.serverCert, tls_key_file: files.serverKey }, tlsClient: { ca: files.ca } });
    await nodeCoreChecks(pooled.uri({ tls: 'true', tlsCAFile: files.ca }, { credentials: false }), 'uptlspool');
    await pooled.stop();
    // The proxy must refuse an upstream certificate it cannot verify.
    const bad = `mongodb://127.0.0.1:${tlsUpstream.port}/?replicaSet=rs0&tls=true&tlsCAFile=${encodeURIComponent(files.otherCa)}`;
    const p2 = await H.startProxy({ upstream: bad, readyTimeoutMs: 4000 }).catch((e) => e);
    if (!(p2 instanceof Error)) {
      await p2.stop();
      assert.fail('a proxy whose upstream certificate does not verify still answered a hello');
    }
    const p3 = await H.startProxy({ upstream: bad, settings: { pool_mode: 'pooled', pool_size: 1 }, readyTimeoutMs: 4000 }).catch((e) => e);
    if (!(p3 instanceof Error)) {
      await p3.stop();
      assert.fail('a pooled proxy whose upstream certificate does not verify still answered a hello');
    }
  } finally {
    await tlsUpstream.stop();
  }
});

async function cleanupDb() {
  const c = new MongoClient(proxy.uri({ tls: 'true', tlsCAFile: files.ca }), { serverSelectionTimeoutMS: 5000 });
  await c.db(DB).dropDatabase().catch(() => {});
  await c.close();
}

H.registerFinalChecks(test, [() => upstream && upstream.stop()], { beforeStop: cleanupDb });
