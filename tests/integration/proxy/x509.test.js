'use strict';
// The proxy's X.509 client certificate is never lent to clients (docs/operations.md, Security
// model, "Upstream credentials and X.509"). The upstream URI names a tlsCertificateKeyFile (with
// an encrypted key and tlsCertificateKeyFilePassword); the double serves TLS, requests client
// certificates without requiring them (--tls-allow-connections-without-certificates, as mongod's
// net.tls.allowConnectionsWithoutCertificates), logs for each connection which certificate it
// presented, and runs MONGODB-X509 with the certificate's subject as the user, as mongod does.
// Shown here: a client's explicit MONGODB-X509 authenticate is refused by the proxy with
// {ok: 0, code: 18, errmsg: "relaybus: ..."}; a hello's MONGODB-X509 speculativeAuthenticate is
// removed (and logged), so a driver falls back to the explicit authenticate and gets that error;
// the upstream connection paired with a client presented no certificate, while the proxy's own
// mongoc connections (topology monitoring) still present it; SCRAM, speculative or not, still
// works. The refusal itself needs no double and also runs against a real upstream.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { execFileSync } = require('node:child_process');
const { MongoClient } = require('mongodb');
const H = require('../lib/proxy');

const USER = 'rbx509';
const PASS = 'scram-pw';
const KEY_PASS = 'proxy-key-pw';
const PROXY_SUBJECT = 'CN=relaybus proxy,O=relaybus test';
const onlyDouble = H.doubleOnlySkipReason('a TLS upstream with certificates made by the test') || false;
let dir;
const files = {};
let tlsDouble;
let proxy;

function makeCerts() {
  dir = H.tmpDir('relaybus-x509-');
  const ssl = (args) => execFileSync('openssl', args, { cwd: dir, stdio: ['ignore', 'ignore', 'pipe'] });
  const j = (f) => path.join(dir, f);
  fs.writeFileSync(j('server.ext'), 'subjectAltName = IP:127.0.0.1, DNS:localhost\nbasicConstraints = CA:FALSE\nextendedKeyUsage = serverAuth\n');
  fs.writeFileSync(j('client.ext'), 'basicConstraints = CA:FALSE\nextendedKeyUsage = clientAuth\n');
  ssl(['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '2', '-subj', '/CN=relaybus x509 test ca', '-keyout', 'ca.key', '-out', 'ca.pem']);
  ssl(['req', '-newkey', 'rsa:2048', '-nodes', '-subj', '/CN=127.0.0.1', '-keyout', 'server.key', '-out', 'server.csr']);
  ssl(['x509', '-req', '-in', 'server.csr', '-CA', 'ca.pem', '-CAkey', 'ca.key', '-CAcreateserial', '-days', '2', '-extfile', 'server.ext', '-out', 'server.pem']);
  // The proxy's certificate, its key encrypted: the URI's tlsCertificateKeyFilePassword opens it.
  ssl(['req', '-newkey', 'rsa:2048', '-passout', `pass:${KEY_PASS}`, '-subj', '/O=relaybus test/CN=relaybus proxy', '-keyout', 'proxy.key', '-out', 'proxy.csr']);
  ssl(['x509', '-req', '-in', 'proxy.csr', '-CA', 'ca.pem', '-CAkey', 'ca.key', '-CAcreateserial', '-days', '2', '-extfile', 'client.ext', '-out', 'proxy.crt']);
  fs.writeFileSync(j('proxy.pem'), fs.readFileSync(j('proxy.crt')) + fs.readFileSync(j('proxy.key')));
  fs.writeFileSync(j('server-combined.pem'), fs.readFileSync(j('server.pem')) + fs.readFileSync(j('server.key')));
  Object.assign(files, { ca: j('ca.pem'), server: j('server-combined.pem'), proxy: j('proxy.pem') });
}

test.before(async () => {
  if (onlyDouble) return;
  makeCerts();
  tlsDouble = await H.startDouble({
    auth: `${USER}:${PASS}`,
    args: ['--tls-cert-file', files.server, '--tls-ca-file', files.ca, '--tls-allow-connections-without-certificates'],
  });
  const q = new URLSearchParams({
    replicaSet: 'rs0',
    tls: 'true',
    tlsCAFile: files.ca,
    tlsCertificateKeyFile: files.proxy,
    tlsCertificateKeyFilePassword: KEY_PASS,
  });
  proxy = await H.startProxy({ upstream: `mongodb://127.0.0.1:${tlsDouble.port}/?${q}` });
});

async function connectedHello(port) {
  const c = await H.WireConn.connect({ port });
  assert.equal((await c.command({ hello: 1, $db: 'admin' })).ok, 1);
  return c;
}

function assertRefused(reply, what) {
  assert.equal(reply.ok, 0, `${what}: refused, not answered ${JSON.stringify(reply)}`);
  assert.equal(reply.code, 18, `${what}: code 18 AuthenticationFailed`);
  assert.equal(reply.codeName, 'AuthenticationFailed');
  assert.match(reply.errmsg, /^relaybus: .*MONGODB-X509/, `${what}: the proxy's own error`);
}

test('an explicit MONGODB-X509 authenticate is refused by the proxy (any upstream)', async () => {
  const upstream = onlyDouble ? await H.startUpstream() : null;
  const p = upstream ? await H.startProxy({ upstream: upstream.uri }) : proxy;
  const c = await connectedHello(p.port);
  try {
    const r = await c.command({ authenticate: 1, mechanism: 'MONGODB-X509', $db: '$external' });
    assert.notEqual(r.user, PROXY_SUBJECT, "the client logged in as the proxy's certificate");
    assertRefused(r, 'authenticate');
    // With a user name, and in another spelling: the same.
    assertRefused(await c.command({ authenticate: 1, mechanism: 'MONGODB-X509', user: PROXY_SUBJECT, $db: '$external' }), 'authenticate with user');
    assertRefused(await c.command({ authenticate: 1, mechanism: 'mongodb-x509', $db: '$external' }), 'lower-case mechanism');
    // The connection is still usable and not authenticated as anyone.
    const st = await c.command({ connectionStatus: 1, $db: 'admin' });
    assert.equal(st.ok, 1);
    assert.deepEqual(st.authInfo.authenticatedUsers.filter((u) => u.db === '$external'), []);
    assert.ok(await p.waitForLog(/MONGODB-X509 authenticate refused/, { needle: `127.0.0.1:${c.localPort}` }), 'the refusal is logged with the peer');
  } finally {
    c.destroy();
    if (upstream) {
      await p.stop();
      await upstream.stop();
    }
  }
});

test("the upstream connection paired with a client presents no certificate; the proxy's own connections still do", { skip: onlyDouble }, async () => {
  const c = await connectedHello(proxy.port);
  try {
    const me = await c.command({ whatsmyuri: 1, $db: 'admin' });
    assert.equal(me.ok, 1);
    const line = tlsDouble.log().split('\n').find((l) => l.includes(`TLS connection from ${me.you}:`));
    assert.ok(line, `the double logged the TLS connection from ${me.you}:\n${H.tail(tlsDouble.log())}`);
    assert.match(line, /no client certificate/, `the client-paired upstream connection ${me.you} presented no certificate: ${line}`);
    // The double does see certificates: mongoc's monitoring connections present the proxy's.
    assert.ok(
      tlsDouble.log().includes(`client certificate "${PROXY_SUBJECT}"`),
      `the proxy's own mongoc connections present its certificate:\n${H.tail(tlsDouble.log())}`,
    );
    // And the double would accept it for MONGODB-X509: nothing a client does through the proxy
    // gets it logged in as that subject.
    const r = await c.command({ authenticate: 1, mechanism: 'MONGODB-X509', $db: '$external' });
    assertRefused(r, 'authenticate');
  } finally {
    c.destroy();
  }
  assert.ok(proxy.logLines('client connections present no certificate').length > 0, 'the start-up log says the certificate is withheld');
});

test('a hello with a MONGODB-X509 speculativeAuthenticate: removed and logged; the driver falls back and is refused', { skip: onlyDouble }, async () => {
  const c = await H.WireConn.connect({ port: proxy.port });
  try {
    const h = await c.command({ hello: 1, speculativeAuthenticate: { authenticate: 1, mechanism: 'MONGODB-X509', db: '$external' }, $db: 'admin' });
    assert.equal(h.ok, 1);
    assert.equal(h.speculativeAuthenticate, undefined, `no speculative X.509 login: ${JSON.stringify(h.speculativeAuthenticate)}`);
    assert.ok(await proxy.waitForLog(/speculativeAuthenticate removed/, { needle: `127.0.0.1:${c.localPort}` }), 'the removal is logged');
    const st = await c.command({ connectionStatus: 1, $db: 'admin' });
    assert.deepEqual(st.authInfo.authenticatedUsers, [], 'not logged in as anyone');
  } finally {
    c.destroy();
  }
  const client = new MongoClient(`mongodb://${proxy.host}:${proxy.port}/?authMechanism=MONGODB-X509&authSource=%24external`, {
    serverSelectionTimeoutMS: 5000,
  });
  try {
    await assert.rejects(client.db('admin').command({ ping: 1 }), (e) => {
      assert.match(String(e.message), /relaybus: .*MONGODB-X509/, `the driver reports the proxy's refusal: ${e.message}`);
      return true;
    });
  } finally {
    await client.close();
  }
});

test('SCRAM through the same TLS upstream still works, speculative and explicit', { skip: onlyDouble }, async () => {
  for (const params of [{}, { authMechanism: 'SCRAM-SHA-256' }, { authMechanism: 'SCRAM-SHA-1' }]) {
    const q = new URLSearchParams({ authSource: 'admin', ...params });
    const client = new MongoClient(`mongodb://${USER}:${PASS}@${proxy.host}:${proxy.port}/?${q}`, { serverSelectionTimeoutMS: 5000 });
    try {
      const st = await client.db('admin').command({ connectionStatus: 1 });
      assert.deepEqual(st.authInfo.authenticatedUsers, [{ user: USER, db: 'admin' }], `SCRAM ${JSON.stringify(params)}`);
      const coll = client.db(H.uniqueDbName('x509')).collection('c');
      await coll.insertOne({ _id: 1 });
      assert.equal(await coll.countDocuments(), 1);
      await coll.drop();
    } finally {
      await client.close();
    }
  }
});

test('tlsCertificateKeyFile is still checked at start-up: a wrong password is a start-up error that names the file', { skip: onlyDouble }, async () => {
  const q = new URLSearchParams({ replicaSet: 'rs0', tls: 'true', tlsCAFile: files.ca, tlsCertificateKeyFile: files.proxy, tlsCertificateKeyFilePassword: 'not-the-key-pw' });
  const r = await H.runProxyExpectingExit({ upstream: `mongodb://127.0.0.1:${tlsDouble.port}/?${q}`, timeoutMs: 15000 });
  assert.equal(r.timedOut, false, `the proxy started with a key it cannot open; log:\n${H.tail(r.log)}`);
  assert.equal(r.code, 1, `exit code; log:\n${H.tail(r.log)}`);
  assert.match(r.log, /tlsCertificateKeyFile .*proxy\.pem/);
  assert.doesNotMatch(r.log, /not-the-key-pw/, 'the password is not logged');
});

H.registerFinalChecks(test, [
  () => tlsDouble && tlsDouble.stop(),
  () => dir && fs.rmSync(dir, { recursive: true, force: true }),
]);
