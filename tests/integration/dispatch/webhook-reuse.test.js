'use strict';
// Webhook connections are reused: a handler keeps at most `concurrency` connections to its
// endpoint open from one delivery to the next (plain HTTP keep-alive; TLS with a private CA
// and a client certificate, tls_ca_file / tls_cert_file / tls_key_file), so hundreds of
// deliveries cost a handful of TCP connections and TLS handshakes, not one each.  The TLS
// files are checked when the configuration is read: a missing file or a key that does not
// match its certificate is a clear start-up error.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const http2 = require('node:http2');
const path = require('node:path');
const { execFileSync, spawnSync } = require('node:child_process');
const { MongoClient } = require('mongodb');
const { startUpstream, uniqueDbName, tmpDir, proxyBin } = require('../lib/proxy');
const { startSink } = require('./sink');
const { startDispatchProxy, publish, waitFor } = require('./helpers');

const SECRET = `whsec_${Buffer.from('relaybus-webhook-reuse-secret').toString('base64')}`;

/** A private CA, a server certificate for 127.0.0.1 and a client certificate, signed by it. */
function makePki(dir) {
  const f = (n) => path.join(dir, n);
  const ossl = (...args) => execFileSync('openssl', args, { stdio: 'pipe' });
  ossl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', f('ca.key'), '-out', f('ca.pem'), '-days', '2',
    '-subj', '/CN=relaybus private CA');
  fs.writeFileSync(f('server.cnf'), 'subjectAltName = IP:127.0.0.1, DNS:localhost\n');
  for (const who of ['server', 'client', 'other']) {
    ossl('req', '-newkey', 'rsa:2048', '-nodes', '-keyout', f(`${who}.key`), '-out', f(`${who}.csr`), '-subj', `/CN=relaybus ${who}`);
    const ext = who === 'server' ? ['-extfile', f('server.cnf')] : [];
    ossl('x509', '-req', '-in', f(`${who}.csr`), '-CA', f('ca.pem'), '-CAkey', f('ca.key'), '-CAcreateserial',
      '-out', f(`${who}.pem`), '-days', '2', ...ext);
  }
  return f;
}

function keyedEvents(prefix, n, keys) {
  const events = [];
  for (let i = 0; i < n; i++) events.push({ id: `${prefix}-${i}`, type: 'reuse.v1', key: `k${i % keys}`, payload: { i } });
  return events;
}

async function deliverAll(t, { sink, handler, n, keys, env, beforeStop }) {
  const up = await startUpstream();
  t.after(() => up.stop());
  const db = uniqueDbName('dispatch_webhook_reuse');
  const p = await startDispatchProxy({ upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 100 },
    handlers: [handler], env });
  t.after(() => p.kill());
  const client = await new MongoClient(up.uri).connect();
  t.after(() => client.close());
  const events = keyedEvents(handler.name, n, keys);
  await publish(client, db, events, [handler.name], 50);
  const deliveries = client.db(db).collection('relaybus_deliveries');
  await waitFor(async () => (await deliveries.countDocuments({ status: { $ne: 'completed' } })) === 0, 90000,
    'every delivery to complete');
  for (const e of events) assert.equal(sink.stats().ok.get(e.id), 1, `${e.id} delivered once`);
  assert.deepEqual(sink.stats().seqViolations, []);
  assert.equal(sink.stats().badSignatures, 0, 'each signature signs the body sent');
  if (beforeStop) await beforeStop(p);
  assert.equal((await p.stop()).code, 0);
}

test('400 deliveries at concurrency 8 to a plain HTTP receiver use at most 16 TCP connections', { timeout: 120000 }, async (t) => {
  const sink = await startSink({ secret: SECRET });
  t.after(() => sink.close());
  await deliverAll(t, { sink, n: 400, keys: 40,
    handler: { name: 'plain', events: '*', kind: 'webhook', url: sink.url('/plain'), secret: SECRET, concurrency: 8 } });
  const { connections } = sink.stats();
  assert.ok(connections >= 1 && connections <= 16, `${connections} TCP connections for 400 deliveries`);
});

test('100 deliveries over TLS to a private CA that requires client certificates use at most 16 handshakes', { timeout: 120000 }, async (t) => {
  const dir = tmpDir('relaybus-webhook-reuse-');
  const f = makePki(dir);
  const sink = await startSink({ secret: SECRET,
    tls: { key: fs.readFileSync(f('server.key')), cert: fs.readFileSync(f('server.pem')), ca: fs.readFileSync(f('ca.pem')) } });
  t.after(() => sink.close());
  // No SSL_CERT_FILE: the CA comes from tls_ca_file only.
  await deliverAll(t, { sink, n: 100, keys: 20, env: { SSL_CERT_FILE: '/nonexistent' },
    handler: { name: 'mtls', events: '*', kind: 'webhook', url: sink.url('/mtls'), secret: SECRET, concurrency: 8,
      tls_ca_file: f('ca.pem'), tls_cert_file: f('client.pem'), tls_key_file: f('client.key') },
    // A reload naming a key of another certificate is refused, and says why.
    beforeStop: async (p) => {
      fs.writeFileSync(p.ini, fs.readFileSync(p.ini, 'utf8').replace(f('client.key'), f('other.key')));
      p.child.kill('SIGHUP');
      await waitFor(() => /reload: keeping the current configuration: .*\[handler mtls\] tls_key_file: the key does not match the certificate/.test(p.log()),
        10000, 'the refused reload');
    } });
  const { handshakes, connections } = sink.stats();
  assert.ok(handshakes >= 1 && handshakes <= 16, `${handshakes} TLS handshakes for 100 deliveries`);
  assert.ok(connections <= 16, `${connections} TCP connections for 100 deliveries`);
});

test('a receiver that offers HTTP/2 gets the deliveries as streams of one or two connections', { timeout: 120000 }, async (t) => {
  const dir = tmpDir('relaybus-webhook-reuse-h2-');
  const f = makePki(dir);
  const seen = { sessions: 0, versions: new Set(), ids: new Set() };
  const server = http2.createSecureServer({ key: fs.readFileSync(f('server.key')), cert: fs.readFileSync(f('server.pem')) });
  server.on('session', () => { seen.sessions++; });
  server.on('stream', (stream, headers) => {
    const chunks = [];
    stream.on('data', (c) => chunks.push(c));
    stream.on('end', () => {
      seen.ids.add(JSON.parse(Buffer.concat(chunks).toString('utf8')).id);
      stream.respond({ ':status': 204 });
      stream.end();
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.after(() => new Promise((resolve) => server.close(() => resolve())));
  const up = await startUpstream();
  t.after(() => up.stop());
  const db = uniqueDbName('dispatch_webhook_h2');
  const p = await startDispatchProxy({ upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 100 },
    handlers: [{ name: 'h2', events: '*', kind: 'webhook', url: `https://127.0.0.1:${server.address().port}/h2`, concurrency: 8,
      tls_ca_file: f('ca.pem') }] });
  t.after(() => p.kill());
  const client = await new MongoClient(up.uri).connect();
  t.after(() => client.close());
  const events = keyedEvents('h2', 100, 20);
  await publish(client, db, events, ['h2'], 50);
  await waitFor(() => seen.ids.size === events.length, 90000, 'every event over HTTP/2');
  // Only HTTP/2 streams reach a createSecureServer without allowHTTP1.
  assert.ok(seen.sessions >= 1 && seen.sessions <= 2, `${seen.sessions} HTTP/2 connections for 100 deliveries`);
  assert.equal((await p.stop()).code, 0);
});

test('tls_* files that are missing or do not match are refused with a clear error', async () => {
  const dir = tmpDir('relaybus-webhook-reuse-bad-');
  const f = makePki(dir);
  const check = (keys) => {
    const ini = path.join(dir, 'bad.ini');
    const lines = ['[proxy]', 'listen = 127.0.0.1:1', 'upstream = mongodb://127.0.0.1:1/', '', '[handler h]', 'events = *',
      'kind = webhook', 'url = https://127.0.0.1:1/h'];
    for (const [k, v] of Object.entries(keys)) lines.push(`${k} = ${v}`);
    fs.writeFileSync(ini, lines.join('\n') + '\n');
    const r = spawnSync(proxyBin(), ['--check-config', '-c', ini], { encoding: 'utf8' });
    assert.notEqual(r.status, 0, `accepted: ${JSON.stringify(keys)}`);
    return r.stderr;
  };
  assert.match(check({ tls_ca_file: f('missing.pem') }), /\[handler h\] tls_ca_file: cannot read '.*missing\.pem'/);
  assert.match(check({ tls_cert_file: f('client.pem'), tls_key_file: f('other.key') }),
    /\[handler h\] tls_key_file: the key does not match the certificate of tls_cert_file/);
  assert.match(check({ tls_cert_file: f('client.pem') }), /tls_cert_file and tls_key_file go together/);
  assert.match(check({ tls_ca_file: f('client.key') }), /tls_ca_file: no PEM certificate can be read/);
});
