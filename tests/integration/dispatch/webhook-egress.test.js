'use strict';
// What a webhook request carries besides the event, and the way it takes: `header.NAME =
// VALUE` keys add request headers, the url's user:password is sent as Basic auth (and masked
// in what the proxy shows), and `proxy =` sends the requests through a forward proxy: plain
// http as absolute-URI requests, https through a CONNECT tunnel (the receiver's certificate is
// still verified end to end).  The forward proxy here is a tiny one in Node, on loopback.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const http = require('node:http');
const net = require('node:net');
const path = require('node:path');
const { execFileSync } = require('node:child_process');
const { MongoClient } = require('mongodb');
const { startUpstream, uniqueDbName, tmpDir } = require('../lib/proxy');
const { startSink } = require('./sink');
const { startDispatchProxy, publish, waitFor } = require('./helpers');

const SECRET = `whsec_${Buffer.from('relaybus-webhook-egress-secret').toString('base64')}`;

/** A forward proxy: absolute-URI requests for http, CONNECT tunnels for https; it records both. */
async function startForwardProxy() {
  const seen = { plain: [], connect: [] };
  const server = http.createServer((req, res) => {
    seen.plain.push(req.url);
    const u = new URL(req.url);
    const out = http.request({ host: u.hostname, port: u.port, path: u.pathname + u.search, method: req.method,
      headers: req.headers }, (r) => { res.writeHead(r.statusCode, r.headers); r.pipe(res); });
    out.on('error', () => res.writeHead(502).end());
    req.pipe(out);
  });
  server.on('connect', (req, socket, head) => {
    seen.connect.push(req.url);
    const [host, port] = req.url.split(':');
    const up = net.connect(Number(port), host, () => {
      socket.write('HTTP/1.1 200 Connection established\r\n\r\n');
      if (head.length) up.write(head);
      up.pipe(socket);
      socket.pipe(up);
    });
    up.on('error', () => socket.destroy());
    socket.on('error', () => up.destroy());
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${server.address().port}`, seen,
    close: () => new Promise((resolve) => { server.closeAllConnections(); server.close(() => resolve()); }) };
}

function makeCerts(dir) {
  const f = (n) => path.join(dir, n);
  const ossl = (...args) => execFileSync('openssl', args, { stdio: 'pipe' });
  ossl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', f('ca.key'), '-out', f('ca.pem'), '-days', '2',
    '-subj', '/CN=relaybus egress CA');
  ossl('req', '-newkey', 'rsa:2048', '-nodes', '-keyout', f('server.key'), '-out', f('server.csr'), '-subj', '/CN=127.0.0.1');
  fs.writeFileSync(f('ext.cnf'), 'subjectAltName = IP:127.0.0.1\n');
  ossl('x509', '-req', '-in', f('server.csr'), '-CA', f('ca.pem'), '-CAkey', f('ca.key'), '-CAcreateserial',
    '-out', f('server.pem'), '-days', '2', '-extfile', f('ext.cnf'));
  return { ca: f('ca.pem'), key: fs.readFileSync(f('server.key')), cert: fs.readFileSync(f('server.pem')) };
}

test('header.*, Basic auth from the url and proxy = reach the receiver, plain and through CONNECT', { timeout: 90000 }, async (t) => {
  const certs = makeCerts(tmpDir('relaybus-webhook-egress-'));
  const up = await startUpstream();
  t.after(() => up.stop());
  const fwd = await startForwardProxy();
  t.after(() => fwd.close());
  const got = []; // {path, authorization, tenant, trace}
  const record = (ev, req) => {
    got.push({ path: req.url, id: ev.id, authorization: req.headers.authorization, tenant: req.headers['x-tenant'],
      trace: req.headers['x-trace-source'] });
    return undefined; // the default answer: 204
  };
  const plain = await startSink({ secret: SECRET, respond: record });
  const secure = await startSink({ secret: SECRET, respond: record, tls: { key: certs.key, cert: certs.cert } });
  t.after(() => Promise.all([plain.close(), secure.close()]));
  const db = uniqueDbName('dispatch_webhook_egress');
  const withAuth = (u) => u.replace('://', '://hook-user:s3cr%40t@');
  const handlers = [
    { name: 'plain', events: '*', kind: 'webhook', url: withAuth(plain.url('/plain')), secret: SECRET, proxy: fwd.url,
      'header.X-Tenant': 'tenant-7', 'header.X-Trace-Source': 'relaybus egress test' },
    { name: 'secure', events: '*', kind: 'webhook', url: withAuth(secure.url('/secure')), secret: SECRET, proxy: fwd.url,
      tls_ca_file: certs.ca, 'header.X-Tenant': 'tenant-8' },
  ];
  const p = await startDispatchProxy({ upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 100 }, handlers });
  t.after(() => p.kill());
  const client = await new MongoClient(up.uri).connect();
  t.after(() => client.close());
  const events = [];
  for (let i = 0; i < 10; i++) events.push({ id: `e-${i}`, type: 'egress.v1', key: `k${i % 2}`, payload: { i } });
  await publish(client, db, events, handlers.map((h) => h.name));
  const deliveries = client.db(db).collection('relaybus_deliveries');
  await waitFor(async () => plain.stats().ok.size + secure.stats().ok.size === 2 * events.length &&
    (await deliveries.countDocuments({ status: 'pending' })) === 0, 60000, 'every delivery to complete');
  assert.equal(await deliveries.countDocuments({ status: 'dead' }), 0);

  const basic = `Basic ${Buffer.from('hook-user:s3cr@t').toString('base64')}`;
  for (const g of got) assert.equal(g.authorization, basic, `${g.path}: Basic auth from the url`);
  assert.equal(got.filter((g) => g.path === '/plain').length, events.length);
  assert.equal(got.filter((g) => g.path === '/secure').length, events.length);
  for (const g of got.filter((x) => x.path === '/plain')) {
    assert.equal(g.tenant, 'tenant-7');
    assert.equal(g.trace, 'relaybus egress test');
  }
  for (const g of got.filter((x) => x.path === '/secure')) assert.equal(g.tenant, 'tenant-8');
  assert.equal(plain.stats().badSignatures + secure.stats().badSignatures, 0);
  // Through the forward proxy: absolute-URI requests for http, a CONNECT tunnel for https.
  assert.equal(fwd.seen.plain.length, events.length);
  for (const u of fwd.seen.plain) assert.match(u, new RegExp(`^http://127\\.0\\.0\\.1:${plain.port}/plain`));
  assert.ok(fwd.seen.connect.length >= 1 && fwd.seen.connect.length <= 8, `${fwd.seen.connect.length} CONNECT tunnels`);
  for (const u of fwd.seen.connect) assert.equal(u, `127.0.0.1:${secure.port}`);
  // The password is nowhere in the proxy's log.
  assert.doesNotMatch(p.log(), /s3cr/);
  assert.equal((await p.stop()).code, 0);
});
