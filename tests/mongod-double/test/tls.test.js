'use strict';
// --tls-cert-file / --tls-key-file / --tls-ca-file: the listener speaks TLS only; with a CA file
// client certificates are required and verified (or, with
// --tls-allow-connections-without-certificates, verified when presented), and MONGODB-X509 logs
// a connection in as its certificate's subject. Certificates are made with openssl in a temp
// dir (a CA, a server certificate with SAN IP:127.0.0.1, a client certificate, another CA).

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('fs');
const os = require('os');
const path = require('path');
const tls = require('tls');
const { execFileSync, spawnSync } = require('child_process');
const { MongoClient } = require('mongodb');
const { startDouble, rawConnect, opMsg } = require('./helpers');

const hasOpenssl = spawnSync('openssl', ['version'], { stdio: 'ignore' }).status === 0;
let dir;
const f = (n) => path.join(dir, n);

function makeCerts() {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'double-tls-'));
  const ssl = (args) => execFileSync('openssl', args, { cwd: dir, stdio: ['ignore', 'ignore', 'pipe'] });
  fs.writeFileSync(f('server.ext'), 'subjectAltName = IP:127.0.0.1, DNS:localhost\nbasicConstraints = CA:FALSE\nextendedKeyUsage = serverAuth\n');
  fs.writeFileSync(f('client.ext'), 'basicConstraints = CA:FALSE\nextendedKeyUsage = clientAuth\n');
  for (const ca of ['ca', 'otherca']) {
    ssl(['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '2', '-subj', `/CN=double test ${ca}`, '-keyout', `${ca}.key`, '-out', `${ca}.pem`]);
  }
  for (const who of ['server', 'client']) {
    ssl(['req', '-newkey', 'rsa:2048', '-nodes', '-subj', who === 'server' ? '/CN=127.0.0.1' : '/CN=double test client', '-keyout', `${who}.key`, '-out', `${who}.csr`]);
    ssl(['x509', '-req', '-in', `${who}.csr`, '-CA', 'ca.pem', '-CAkey', 'ca.key', '-CAcreateserial', '-days', '2', '-extfile', `${who}.ext`, '-out', `${who}.pem`]);
  }
  fs.writeFileSync(f('client-combined.pem'), fs.readFileSync(f('client.pem')) + fs.readFileSync(f('client.key')));
  fs.writeFileSync(f('server-combined.pem'), fs.readFileSync(f('server.pem')) + fs.readFileSync(f('server.key')));
}

before(() => { if (hasOpenssl) makeCerts(); });
after(() => { if (dir) fs.rmSync(dir, { recursive: true, force: true }); });

const skip = !hasOpenssl && 'openssl not installed';

async function crud(uri) {
  const c = new MongoClient(uri, { serverSelectionTimeoutMS: 5000 });
  try {
    const coll = c.db('tls').collection('t');
    await coll.insertMany([{ _id: 1, a: 'x' }, { _id: 2, a: 'y' }, { _id: 3, a: 'z' }]);
    assert.deepEqual(await coll.find({}, { batchSize: 1, sort: { _id: 1 } }).toArray(), [{ _id: 1, a: 'x' }, { _id: 2, a: 'y' }, { _id: 3, a: 'z' }]);
    const s = c.startSession();
    try {
      await s.withTransaction(async () => { await coll.insertOne({ _id: 4 }, { session: s }); });
    } finally {
      await s.endSession();
    }
    assert.equal(await coll.countDocuments(), 4);
    await coll.drop();
  } finally {
    await c.close();
  }
}

test('TLS listener: a driver verifying the certificate against 127.0.0.1 works (replicaSet discovery through hosts)', { skip }, async () => {
  const d = await startDouble(['--tls-cert-file', f('server.pem'), '--tls-key-file', f('server.key')]);
  try {
    await crud(`mongodb://127.0.0.1:${d.port}/?replicaSet=rs0&tls=true&tlsCAFile=${encodeURIComponent(f('ca.pem'))}`);
    // hello still names 127.0.0.1:PORT
    const sock = tls.connect({ host: '127.0.0.1', port: d.port, ca: fs.readFileSync(f('ca.pem')) });
    await new Promise((r, j) => { sock.once('secureConnect', r); sock.once('error', j); });
    assert.equal(sock.authorized, true);
    sock.destroy();
    // The secondary's port speaks TLS with the same certificate and serves secondary reads.
    const ssock = tls.connect({ host: '127.0.0.1', port: d.secondaryPort, ca: fs.readFileSync(f('ca.pem')) });
    await new Promise((r, j) => { ssock.once('secureConnect', r); ssock.once('error', j); });
    assert.equal(ssock.authorized, true);
    ssock.destroy();
    const sec = new MongoClient(`mongodb://127.0.0.1:${d.port}/?replicaSet=rs0&readPreference=secondary&tls=true&tlsCAFile=${encodeURIComponent(f('ca.pem'))}`, { serverSelectionTimeoutMS: 5000 });
    assert.deepEqual(await sec.db('admin').command({ ping: 1 }).then(() => sec.db('tls').listCollections().toArray()), []);
    await sec.close();
    // A plaintext client gets no wire-protocol reply.
    const raw = await rawConnect(d.port);
    raw.send(opMsg({ hello: 1, $db: 'admin' }).msg);
    const r = await raw.next(2000);
    assert.ok(r === null || r === 'timeout', 'no reply to plaintext on a TLS port');
    raw.close();
    // A client trusting another CA refuses the certificate.
    const bad = new MongoClient(`mongodb://127.0.0.1:${d.port}/?directConnection=true&tls=true&tlsCAFile=${encodeURIComponent(f('otherca.pem'))}`, { serverSelectionTimeoutMS: 1500 });
    await assert.rejects(bad.db('admin').command({ ping: 1 }));
    await bad.close();
    assert.match(d.stderr(), /TLS only/);
  } finally {
    assert.equal(await d.stop(), 0);
  }
});

test('TLS: certificate and key in one file (cert file passed as both, key file optional)', { skip }, async () => {
  const d = await startDouble(['--tls-cert-file', f('server-combined.pem')]);
  try {
    await crud(`mongodb://127.0.0.1:${d.port}/?replicaSet=rs0&tls=true&tlsCAFile=${encodeURIComponent(f('ca.pem'))}`);
  } finally {
    assert.equal(await d.stop(), 0);
  }
});

test('--tls-ca-file: client certificates are required and verified', { skip }, async () => {
  const d = await startDouble(['--tls-cert-file', f('server-combined.pem'), '--tls-key-file', f('server.key'), '--tls-ca-file', f('ca.pem')]);
  try {
    const ca = encodeURIComponent(f('ca.pem'));
    await crud(`mongodb://127.0.0.1:${d.port}/?replicaSet=rs0&tls=true&tlsCAFile=${ca}&tlsCertificateKeyFile=${encodeURIComponent(f('client-combined.pem'))}`);
    const nocert = new MongoClient(`mongodb://127.0.0.1:${d.port}/?directConnection=true&tls=true&tlsCAFile=${ca}`, { serverSelectionTimeoutMS: 1500 });
    await assert.rejects(nocert.db('admin').command({ ping: 1 }));
    await nocert.close();
    assert.match(d.stderr(), /TLS handshake with 127\.0\.0\.1:\d+ failed/);
  } finally {
    assert.equal(await d.stop(), 0);
  }
});

test('--tls-allow-connections-without-certificates: certificates optional, logged per connection; MONGODB-X509 logs in as the subject', { skip }, async () => {
  const d = await startDouble(['--tls-cert-file', f('server-combined.pem'), '--tls-ca-file', f('ca.pem'), '--tls-allow-connections-without-certificates']);
  const ca = encodeURIComponent(f('ca.pem'));
  const subject = 'CN=double test client';
  try {
    const x509 = new MongoClient(`mongodb://127.0.0.1:${d.port}/?directConnection=true&tls=true&tlsCAFile=${ca}&tlsCertificateKeyFile=${encodeURIComponent(f('client-combined.pem'))}&authMechanism=MONGODB-X509`, { serverSelectionTimeoutMS: 5000 });
    try {
      const st = await x509.db('admin').command({ connectionStatus: 1 });
      assert.deepEqual(st.authInfo.authenticatedUsers, [{ user: subject, db: '$external' }]);
    } finally {
      await x509.close();
    }
    assert.match(d.stderr(), new RegExp(`TLS connection from 127\\.0\\.0\\.1:\\d+: client certificate "${subject}"`));
    const nocert = new MongoClient(`mongodb://127.0.0.1:${d.port}/?directConnection=true&tls=true&tlsCAFile=${ca}`, { serverSelectionTimeoutMS: 5000 });
    try {
      const me = await nocert.db('admin').command({ whatsmyuri: 1 });
      assert.match(d.stderr(), new RegExp(`TLS connection from ${me.you.replace(/\./g, '\\.')}: no client certificate`));
      await assert.rejects(nocert.db('$external').command({ authenticate: 1, mechanism: 'MONGODB-X509' }), (e) => e.code === 18 && /No verified subject/.test(e.message));
    } finally {
      await nocert.close();
    }
  } finally {
    assert.equal(await d.stop(), 0);
  }
});

test('TLS options: a missing file is a usage error before any port is printed', async () => {
  await assert.rejects(startDouble(['--tls-cert-file', '/nonexistent/cert.pem']), /cannot read certificate/);
  await assert.rejects(startDouble(['--tls-ca-file', '/nonexistent/ca.pem']), /need --tls-cert-file/);
});
