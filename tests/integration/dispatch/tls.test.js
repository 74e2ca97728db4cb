'use strict';
// Webhooks over https: the certificate is verified (against SSL_CERT_FILE
// here, the system store otherwise) together with the host name or IP
// address of the URL; an endpoint the proxy cannot verify gets no event, and
// the delivery becomes dead with the TLS error once its attempts run out.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { execFileSync } = require('node:child_process');
const { MongoClient } = require('mongodb');
const { startUpstream, uniqueDbName, tmpDir } = require('../lib/proxy');
const { startSink } = require('./sink');
const { startDispatchProxy, publish, waitFor } = require('./helpers');

const SECRET = `whsec_${Buffer.from('relaybus-tls-test-secret').toString('base64')}`;

/** A CA and a server certificate for 127.0.0.1 and localhost, signed by it. */
function makeCerts(dir, tag) {
  const f = (n) => path.join(dir, `${tag}-${n}`);
  const ossl = (...args) => execFileSync('openssl', args, { stdio: 'pipe' });
  ossl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', f('ca.key'), '-out', f('ca.pem'), '-days', '2',
    '-subj', `/CN=relaybus test CA ${tag}`);
  ossl('req', '-newkey', 'rsa:2048', '-nodes', '-keyout', f('server.key'), '-out', f('server.csr'), '-subj', '/CN=127.0.0.1');
  fs.writeFileSync(f('ext.cnf'), 'subjectAltName = IP:127.0.0.1, DNS:localhost\n');
  ossl('x509', '-req', '-in', f('server.csr'), '-CA', f('ca.pem'), '-CAkey', f('ca.key'), '-CAcreateserial',
    '-out', f('server.pem'), '-days', '2', '-extfile', f('ext.cnf'));
  return { ca: f('ca.pem'), key: fs.readFileSync(f('server.key')), cert: fs.readFileSync(f('server.pem')) };
}

test('https webhooks: a verified endpoint gets every event, an unverifiable one none (dead with the TLS error)', async (t) => {
  const dir = tmpDir('relaybus-tls-');
  const trusted = makeCerts(dir, 'trusted');
  const untrusted = makeCerts(dir, 'untrusted');
  const up = await startUpstream();
  t.after(() => up.stop());
  const good = await startSink({ secret: SECRET, tls: { key: trusted.key, cert: trusted.cert } });
  const bad = await startSink({ secret: SECRET, tls: { key: untrusted.key, cert: untrusted.cert } });
  t.after(() => Promise.all([good.close(), bad.close()]));
  const db = uniqueDbName('dispatch_tls');
  const handlers = [
    { name: 'by-ip', events: '*', kind: 'webhook', url: good.url('/ip'), secret: SECRET },
    { name: 'by-name', events: '*', kind: 'webhook', url: good.url('/name', 'localhost'), secret: SECRET },
    { name: 'untrusted', events: '*', kind: 'webhook', url: bad.url('/bad'), secret: SECRET, max_attempts: 2 },
  ];
  const p = await startDispatchProxy({
    upstream: up.uri,
    outbox: { database: db },
    dispatch: { poll_interval_ms: 100 },
    handlers,
    env: { SSL_CERT_FILE: trusted.ca },
  });
  t.after(() => p.kill());
  const client = await new MongoClient(up.uri).connect();
  t.after(() => client.close());
  const events = [];
  for (let i = 0; i < 20; i++) events.push({ id: `tls-${i}`, type: 't.v1', key: `k${i % 3}`, payload: { i } });
  await publish(client, db, events, handlers.map((h) => h.name), 10);

  const deliveries = client.db(db).collection('relaybus_deliveries');
  await waitFor(async () => (await deliveries.countDocuments({ status: 'pending' })) === 0, 120000, 'every delivery to finish');
  // By IP and by name, twice each event through the trusted sink.
  for (const e of events) assert.equal(good.stats().ok.get(e.id), 2, `${e.id} reached both https handlers once`);
  assert.equal(good.stats().badSignatures, 0);
  assert.equal(bad.stats().requests, 0, 'no request reached the unverifiable endpoint');
  const dead = await deliveries.find({ handler: 'untrusted' }).toArray();
  assert.equal(dead.length, events.length);
  for (const d of dead) {
    assert.equal(d.status, 'dead');
    assert.equal(d.attempts, 2);
    assert.match(d.lastError, /^TLS: .*certificate verify failed/);
  }
  assert.equal((await p.stop()).code, 0);
});
