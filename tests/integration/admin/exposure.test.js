'use strict';
// What the admin port and --check-config give away. Without a token, every request, GETs
// included, must name the port by address in Host: a DNS-rebinding page reads nothing. And no
// credential a URI can carry is shown: not the upstream password, tlsCertificateKeyFilePassword,
// an authMechanismProperties value or a webhook URL's query-string values, nor the admin token
// or a handler's secret, in /api/config, /api/handlers, --check-config or the log.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const { startUpstream, uniqueDbName, proxyBin, realUpstreamUri, tmpDir } = require('../lib/proxy');
const { startAdminProxy, request, logShows } = require('./helpers');

// Every secret starts with "pw-", so one search finds any that leaked.
const SECRET_RE = /pw-[a-z]+/;
const HOOK_URL = 'http://hookuser:pw-hookuser@127.0.0.1:9/in?api_key=pw-apikey&sig=pw-sig';
const HOOK_SECRET = 'whsec_cHctd2Vic2VjcmV0cHctd2Vic2VjcmV0'; // base64 of "pw-websecretpw-websecret"

/** `uri` with the secrets a MongoDB URI can carry in its options appended. */
function withSecretOptions(uri) {
  const sep = uri.includes('?') ? '&' : (uri.replace(/^mongodb(\+srv)?:\/\//, '').includes('/') ? '?' : '/?');
  return `${uri}${sep}tlsCertificateKeyFilePassword=pw-keyfile&authMechanismProperties=SERVICE_NAME:pw-props,CANONICALIZE_HOST_NAME:pw-canon`;
}

test('without a token, a GET naming another host is refused (DNS rebinding)', { timeout: 60000 }, async (t) => {
  const up = await startUpstream();
  t.after(() => up.stop());
  const proxy = await startAdminProxy({ upstream: up.uri, outbox: { database: uniqueDbName('adminexp') }, dispatch: false });
  t.after(() => proxy.kill());
  const paths = ['/api/config', '/api/deliveries', '/api/clients', '/api/handlers', '/api/stats', '/api/lanes', '/metrics', '/', '/healthz'];
  for (const p of paths) {
    for (const host of ['evil.example', `rebind.attacker.test:${proxy.adminPort}`]) {
      const r = await request(proxy.base, p, { headers: { host } });
      assert.equal(r.status, 403, `GET ${p} with Host ${host}: ${r.status} ${r.text.slice(0, 200)}`);
      assert.ok(!/"keys"|upstream/.test(r.text), `GET ${p} with Host ${host} leaked ${r.text.slice(0, 200)}`);
    }
  }
  assert.equal((await request(proxy.base, '/api/config', { method: 'HEAD', headers: { host: 'evil.example' } })).status, 403);
  // Addresses of the port are accepted.
  for (const host of [`127.0.0.1:${proxy.adminPort}`, `localhost:${proxy.adminPort}`, `[::1]:${proxy.adminPort}`]) {
    const r = await request(proxy.base, '/api/config', { headers: { host } });
    assert.equal(r.status, 200, `Host ${host}: ${r.status}`);
  }
  await logShows(proxy, /403 for GET \/api\/config: no token is set/);
  assert.equal((await proxy.stop()).code, 0);
});

test('/api/config, the other answers and the log show no credential from the URIs', { timeout: 60000 }, async (t) => {
  // The double checks the password; a real server is used with its own credentials.
  const up = await startUpstream({ auth: 'app:pw-upstream' });
  t.after(() => up.stop());
  const base = up.real ? realUpstreamUri() : up.uri.replace('mongodb://', 'mongodb://app:pw-upstream@') + '&authSource=admin';
  // tls=false: a tls* option alone turns TLS on in the driver, which the double does not speak.
  const upstream = withSecretOptions(up.real ? base : `${base}&tls=false`);
  const proxy = await startAdminProxy({
    upstream,
    token: 'pw-admintoken',
    outbox: { database: uniqueDbName('adminexp') },
    dispatch: false,
    handlers: [{ name: 'hook', events: 'x.v1', kind: 'webhook', url: HOOK_URL, secret: HOOK_SECRET }],
  });
  t.after(() => proxy.kill());
  const r = await request(proxy.base, '/api/config', { token: 'pw-admintoken' });
  assert.equal(r.status, 200, r.text);
  const value = (section, name) => r.json.keys.find((k) => k.section === section && k.name === name).value;
  assert.ok(!SECRET_RE.test(r.text), `/api/config shows ${r.text.match(SECRET_RE)}: ${r.text}`);
  const shown = value('proxy', 'upstream');
  assert.match(shown, /tlsCertificateKeyFilePassword=\*{8}/);
  assert.match(shown, /authMechanismProperties=SERVICE_NAME:\*{8},CANONICALIZE_HOST_NAME:\*{8}/);
  if (!up.real) assert.match(shown, /^mongodb:\/\/app:\*{8}@127\.0\.0\.1:/);
  assert.equal(value('handler', 'url'), 'http://hookuser:********@127.0.0.1:9/in?api_key=********&sig=********');
  assert.equal(value('handler', 'secret'), '********');
  assert.equal(value('admin', 'token'), '********');
  for (const p of ['/api/handlers', '/api/stats', '/readyz']) {
    const h = await request(proxy.base, p, { token: 'pw-admintoken' });
    assert.equal(h.status, 200, `${p}: ${h.text}`);
    assert.ok(!SECRET_RE.test(h.text), `${p} shows ${h.text.match(SECRET_RE)}`);
  }
  assert.equal((await proxy.stop()).code, 0);
  assert.ok(!SECRET_RE.test(proxy.log()), `the log shows ${proxy.log().match(SECRET_RE)}`);
});

test('--check-config refuses an admin port on 0.0.0.0 with an empty token, token_file or ${VAR}, naming the key', { timeout: 30000 }, () => {
  const dir = tmpDir('relaybus-admintoken-');
  const emptyFile = path.join(dir, 'token');
  fs.writeFileSync(emptyFile, '', { mode: 0o600 });
  const check = (adminLines, env = {}) => {
    const ini = path.join(dir, 'proxy.ini');
    fs.writeFileSync(ini, ['[proxy]', 'listen = 127.0.0.1:0', 'upstream = mongodb://127.0.0.1:9/?replicaSet=rs0', '', '[admin]', ...adminLines, ''].join('\n'));
    return spawnSync(proxyBin(), ['-c', ini, '--check-config'], { encoding: 'utf8', timeout: 20000, env: { ...process.env, ...env } });
  };
  for (const [lines, env, want] of [
    [['listen = 0.0.0.0:27118', 'token ='], {}, /\[admin\] token: empty, and the admin port listens on 0\.0\.0\.0:27118, beyond loopback/],
    [['listen = 0.0.0.0:27118'], {}, /\[admin\] token: empty/],
    [['listen = 0.0.0.0:27118', `token_file = ${emptyFile}`], {}, /\[admin\] token_file: .*token is empty, and the admin port listens on 0\.0\.0\.0:27118/],
    [['listen = 0.0.0.0:27118', 'token = ${RELAYBUS_ADMIN_TOKEN}'], { RELAYBUS_ADMIN_TOKEN: '' }, /\[admin\] token: empty/],
  ]) {
    const r = check(lines, env);
    assert.notEqual(r.status, 0, `${lines.join('; ')}: accepted\n${r.stdout}`);
    assert.match(r.stderr, want, lines.join('; '));
  }
  // On loopback an empty token is allowed (requests must name the port by address), and beyond
  // it a token is enough.
  assert.equal(check(['listen = 127.0.0.1:27118', 'token =']).status, 0);
  assert.equal(check(['listen = 0.0.0.0:27118', 'token = ${RELAYBUS_ADMIN_TOKEN}'], { RELAYBUS_ADMIN_TOKEN: 't0ken' }).status, 0);
});

test('--check-config shows no credential from the URIs', { timeout: 30000 }, () => {
  const dir = tmpDir('relaybus-exposure-');
  const ini = path.join(dir, 'proxy.ini');
  fs.writeFileSync(ini, [
    '[proxy]', 'listen = 127.0.0.1:0',
    `upstream = ${withSecretOptions('mongodb://app:pw-upstream@db1.example:27017,db2.example/admin?replicaSet=rs0')}`,
    '', '[admin]', 'token = pw-admintoken',
    '', '[handler hook]', 'events = x.v1', 'kind = webhook', `url = ${HOOK_URL}`, `secret = ${HOOK_SECRET}`, '',
  ].join('\n'));
  const r = spawnSync(proxyBin(), ['-c', ini, '--check-config'], { encoding: 'utf8', timeout: 20000 });
  assert.equal(r.status, 0, r.stderr);
  const out = r.stdout + r.stderr;
  assert.ok(!SECRET_RE.test(out), `--check-config shows ${out.match(SECRET_RE)}:\n${out}`);
  assert.match(r.stdout, /^upstream = mongodb:\/\/app:\*{8}@db1\.example:27017,db2\.example\/admin\?replicaSet=rs0&tlsCertificateKeyFilePassword=\*{8}&authMechanismProperties=SERVICE_NAME:\*{8},CANONICALIZE_HOST_NAME:\*{8}$/m);
  assert.match(r.stdout, /^url = http:\/\/hookuser:\*{8}@127\.0\.0\.1:9\/in\?api_key=\*{8}&sig=\*{8}$/m);
  assert.match(r.stdout, /^token = \*{8}$/m);
  assert.match(r.stdout, /^secret = \*{8}$/m);
});
