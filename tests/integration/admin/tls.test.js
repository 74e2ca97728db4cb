'use strict';
// The admin port over TLS: with [admin] tls_cert_file and tls_key_file set, it serves HTTPS
// only. A client trusting the CA gets /healthz and an authenticated /api call; the bearer
// token is never sent in clear, because a plain-HTTP request to the port fails its handshake
// and gets no answer; a client that does not trust the CA refuses the certificate. A key path
// that cannot be read, or one of the two keys alone, is refused by --check-config naming the
// key.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const https = require('node:https');
const path = require('node:path');
const { execFileSync, spawnSync } = require('node:child_process');
const { startUpstream, uniqueDbName, proxyBin, tmpDir } = require('../lib/proxy');
const { startAdminProxy, request, rawExchange } = require('./helpers');

const TOKEN = 'admin-tls-token';
let dir;
const files = {};

function openssl(args) {
  execFileSync('openssl', args, { cwd: dir, stdio: ['ignore', 'ignore', 'pipe'] });
}

// A CA, a server certificate for 127.0.0.1 and localhost signed by it, and an unrelated CA.
function makeCerts() {
  dir = tmpDir('relaybus-admin-tls-');
  const ext = path.join(dir, 'server.ext');
  fs.writeFileSync(ext, 'subjectAltName = IP:127.0.0.1, DNS:localhost\nbasicConstraints = CA:FALSE\nkeyUsage = digitalSignature, keyEncipherment\nextendedKeyUsage = serverAuth\n');
  for (const ca of ['ca', 'otherca'])
    openssl(['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '2', '-subj', `/CN=relaybus admin test ${ca}`, '-keyout', `${ca}.key`, '-out', `${ca}.pem`]);
  openssl(['req', '-newkey', 'rsa:2048', '-nodes', '-subj', '/CN=127.0.0.1', '-keyout', 'server.key', '-out', 'server.csr']);
  openssl(['x509', '-req', '-in', 'server.csr', '-CA', 'ca.pem', '-CAkey', 'ca.key', '-CAcreateserial', '-days', '2', '-extfile', ext, '-out', 'server.pem']);
  const j = (f) => path.join(dir, f);
  Object.assign(files, { ca: j('ca.pem'), otherCa: j('otherca.pem'), cert: j('server.pem'), key: j('server.key') });
}

/** One HTTPS request; resolves {status, json, text, protocol} or rejects on a TLS or socket error. */
function httpsRequest(port, urlPath, { ca, token, minVersion, maxVersion } = {}) {
  return new Promise((resolve, reject) => {
    const headers = token ? { authorization: `Bearer ${token}` } : {};
    const req = https.request({ host: '127.0.0.1', port, path: urlPath, ca: ca && fs.readFileSync(ca), headers, agent: false, minVersion, maxVersion },
      (res) => {
        const chunks = [];
        res.on('data', (c) => chunks.push(c));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          let json;
          try { json = JSON.parse(text); } catch { /* not JSON */ }
          resolve({ status: res.statusCode, text, json, protocol: res.socket.getProtocol && res.socket.getProtocol() });
        });
      });
    req.setTimeout(10000, () => req.destroy(new Error(`${urlPath}: no answer within 10 s`)));
    req.on('error', reject);
    req.end();
  });
}

function checkConfig(admin) {
  const ini = path.join(dir, `check-${Object.keys(admin).join('-')}.ini`);
  const lines = ['[proxy]', 'listen = 127.0.0.1:27018', 'upstream = mongodb://127.0.0.1:27017/?replicaSet=rs0', '', '[admin]'];
  for (const [k, v] of Object.entries(admin)) lines.push(`${k} = ${v}`);
  fs.writeFileSync(ini, lines.join('\n') + '\n');
  return spawnSync(proxyBin(), ['-c', ini, '--check-config'], { encoding: 'utf8', timeout: 10000 });
}

test.before(() => makeCerts());

test('with tls_cert_file and tls_key_file the admin port serves HTTPS only', { timeout: 60000 }, async (t) => {
  const up = await startUpstream();
  t.after(() => up.stop());
  const proxy = await startAdminProxy({
    upstream: up.uri,
    token: TOKEN,
    outbox: { database: uniqueDbName('admintls') },
    dispatch: false,
    admin: { tls_cert_file: files.cert, tls_key_file: files.key },
  });
  t.after(() => proxy.kill());
  assert.match(proxy.log(), /admin: listening on 127\.0\.0\.1:\d+ \(HTTPS only,/);

  const health = await httpsRequest(proxy.adminPort, '/healthz', { ca: files.ca });
  assert.equal(health.status, 200, health.text);
  assert.ok(['TLSv1.2', 'TLSv1.3'].includes(health.protocol), `protocol ${health.protocol}`);

  const cfg = await httpsRequest(proxy.adminPort, '/api/config', { ca: files.ca, token: TOKEN });
  assert.equal(cfg.status, 200, cfg.text);
  assert.ok(cfg.json, `/api/config is JSON: ${cfg.text.slice(0, 200)}`);
  assert.ok(!cfg.text.includes(TOKEN), '/api/config does not show the token');
  assert.equal((await httpsRequest(proxy.adminPort, '/api/config', { ca: files.ca, token: 'wrong' })).status, 401);

  // TLS 1.2 is the minimum: a client offering only TLS 1.1 gets no connection.
  await assert.rejects(httpsRequest(proxy.adminPort, '/healthz', { ca: files.ca, minVersion: 'TLSv1', maxVersion: 'TLSv1.1' }));
  // A client that does not trust the CA refuses the certificate.
  await assert.rejects(httpsRequest(proxy.adminPort, '/healthz', { ca: files.otherCa }), /certificate|self.signed|verify/i);

  // Plain HTTP to the port gets no HTTP answer: the handshake fails and the connection closes.
  await assert.rejects(request(`http://127.0.0.1:${proxy.adminPort}`, '/healthz', { timeoutMs: 5000 }));
  const raw = await rawExchange(proxy.adminPort, `GET /api/config HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${TOKEN}\r\n\r\n`, { timeoutMs: 5000 });
  assert.equal(raw.closedByPeer, true, 'the proxy closes a plain-HTTP connection');
  assert.ok(!/^HTTP\/1\.[01] /.test(raw.text), `plain HTTP got an HTTP answer: ${raw.text.slice(0, 200)}`);

  // Still serving after those failures.
  assert.equal((await httpsRequest(proxy.adminPort, '/healthz', { ca: files.ca })).status, 200);
  assert.equal((await proxy.stop()).code, 0);
});

test('--check-config refuses an unreadable admin key and a lone certificate, naming the key', () => {
  const missing = path.join(dir, 'no-such.key');
  const bad = checkConfig({ tls_cert_file: files.cert, tls_key_file: missing });
  assert.notEqual(bad.status, 0, `--check-config accepted a missing key file:\n${bad.stdout}`);
  assert.match(bad.stderr, /\[admin\] tls_key_file: cannot read '[^']*no-such\.key'/);

  const lone = checkConfig({ tls_cert_file: files.cert });
  assert.notEqual(lone.status, 0, `--check-config accepted tls_cert_file without tls_key_file:\n${lone.stdout}`);
  assert.match(lone.stderr, /\[admin\] tls_cert_file and tls_key_file go together \(tls_key_file is not set\)/);

  const good = checkConfig({ tls_cert_file: files.cert, tls_key_file: files.key });
  assert.equal(good.status, 0, good.stderr);
  assert.match(good.stdout, /tls_cert_file = .*server\.pem/);
});

test('a key that does not match the certificate fails start-up instead of serving plain HTTP', { timeout: 60000 }, async (t) => {
  const up = await startUpstream();
  t.after(() => up.stop());
  await assert.rejects(startAdminProxy({
    upstream: up.uri,
    outbox: { database: uniqueDbName('admintls') },
    dispatch: false,
    admin: { tls_cert_file: files.cert, tls_key_file: path.join(dir, 'otherca.key') },
  }), /exited at start-up[\s\S]*admin: \[admin\] tls_key_file [^\n]*otherca\.key/);
});
