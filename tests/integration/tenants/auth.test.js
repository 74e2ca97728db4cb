'use strict';
// Hostile tenants at the proxy's login (pooled mode): password guessing. With
// auth_failures_per_minute = 3, a guess counts when its conversation starts, so twelve
// conversations opened at once for one user from one address get three proofs checked, not
// twelve; the others are refused at saslStart with 18 and a message naming the limit. The limit
// belongs to the (user, address) pair: the same user from 127.0.0.2 and another user from
// 127.0.0.1 still log in, and a right password gives its guess back. Conversations are driven
// over raw sockets (H.WireConn, bound to a chosen local address); the right logins use the
// Node.js driver's own SCRAM provider on such a socket, so its proof and its check of the
// proxy's signature are the driver's. Proofs checked are read from relaybus_logins_total.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const http = require('node:http');
const path = require('node:path');
const crypto = require('node:crypto');
const { execFileSync } = require('node:child_process');
const { Binary } = require('mongodb');
const { ScramSHA256 } = require('mongodb/lib/cmap/auth/scram');
const { MongoCredentials } = require('mongodb/lib/cmap/auth/mongo_credentials');
const { AuthContext } = require('mongodb/lib/cmap/auth/auth_provider');
const H = require('../lib/proxy');

const BIN = H.proxyBin();
const LIMIT = 3;
let upstream;
let proxy;
let adminPort;
let authFile;
const open = [];

function makeUser(name, password) {
  return execFileSync(BIN, ['--make-user', name], { input: `${password}\n` }).toString();
}

function metrics() {
  return new Promise((resolve, reject) => {
    http
      .get({ host: '127.0.0.1', port: adminPort, path: '/metrics' }, (res) => {
        let body = '';
        res.on('data', (c) => (body += c));
        res.on('end', () => resolve(body));
      })
      .on('error', reject);
  });
}

// relaybus_logins_total{result="..."} as numbers.
async function logins() {
  const out = { success: 0, failure: 0, throttled: 0 };
  for (const m of (await metrics()).matchAll(/^relaybus_logins_total\{result="(\w+)"\} (\d+)$/gm)) out[m[1]] = Number(m[2]);
  return out;
}

async function connectFrom(localAddress) {
  const c = await H.WireConn.connect({ port: proxy.port, localAddress });
  open.push(c);
  return c;
}

function saslStart(c, user) {
  const nonce = crypto.randomBytes(18).toString('base64');
  return c.command({
    saslStart: 1,
    mechanism: 'SCRAM-SHA-256',
    payload: new Binary(Buffer.from(`n,,n=${user},r=${nonce}`)),
    options: { skipEmptyExchange: true },
    $db: 'admin',
  });
}

// A client-final with the server's nonce and a proof that is not the password's.
function wrongProof(c, started) {
  const r = /r=([^,]+)/.exec(Buffer.from(started.payload.buffer).toString())[1];
  const proof = crypto.randomBytes(32).toString('base64');
  return c.command({ saslContinue: 1, conversationId: 1, payload: new Binary(Buffer.from(`c=biws,r=${r},p=${proof}`)), $db: 'admin' });
}

// Logs in as user on socket c with the driver's SCRAM-SHA-256 provider; throws the proxy's
// error ({code, errmsg}) on a refusal.
async function driverLogin(c, user, password) {
  const credentials = new MongoCredentials({ username: user, password, source: 'admin', mechanism: 'SCRAM-SHA-256', mechanismProperties: {} });
  const provider = new ScramSHA256();
  const connection = {
    async command(ns, cmd) {
      const r = await c.command({ ...cmd, $db: 'admin' });
      if (r.ok !== 1) throw Object.assign(new Error(r.errmsg), { code: r.code });
      return r;
    },
  };
  const ctx = new AuthContext(connection, credentials, {});
  await provider.prepare({ hello: 1 }, ctx);
  await provider.auth(ctx);
  const status = await c.command({ connectionStatus: 1, $db: 'admin' });
  assert.deepEqual(status.authInfo.authenticatedUsers, [{ user, db: 'admin' }]);
}

test.before(async () => {
  upstream = await H.startUpstream();
  authFile = path.join(H.tmpDir('relaybus-tenants-auth-'), 'users.auth');
  fs.writeFileSync(authFile, makeUser('alice', 'wonder land') + makeUser('bob', 'b0b pass'), { mode: 0o600 });
  adminPort = await H.freePort();
  proxy = await H.startProxy({
    upstream: upstream.uri,
    // Four loops: the twelve connections are spread over them, and the limit must hold across.
    settings: { pool_mode: 'pooled', pool_size: 2, threads: 4, auth_file: authFile, auth_failures_per_minute: LIMIT },
    extraIni: `[admin]\nlisten = 127.0.0.1:${adminPort}\n`,
  });
});

test('12 parallel guesses for one user from one address: 3 proofs checked, 9 refused at saslStart naming the limit', async () => {
  const before = await logins();
  const conns = await Promise.all(Array.from({ length: 12 }, () => connectFrom('127.0.0.1')));
  // Every conversation is started before any proof is sent.
  const starts = await Promise.all(conns.map((c) => saslStart(c, 'alice')));
  // Then every conversation that started sends its (wrong) proof, at once.
  const proofs = await Promise.all(starts.map((r, i) => (r.ok === 1 ? wrongProof(conns[i], r) : null)).filter(Boolean));
  for (const p of proofs) assert.equal(p.code, 18, JSON.stringify(p));
  const after = await logins();
  assert.equal(after.failure - before.failure, LIMIT, 'proofs checked (each wrong)');
  assert.equal(after.throttled - before.throttled, 12 - LIMIT, 'refused unchecked');
  assert.equal(after.success - before.success, 0);
  const refused = starts.filter((r) => r.ok !== 1);
  assert.equal(refused.length, 12 - LIMIT);
  for (const r of refused) {
    assert.equal(r.code, 18);
    assert.equal(r.codeName, 'AuthenticationFailed');
    assert.match(r.errmsg, /too many failed logins/);
    assert.match(r.errmsg, new RegExp(`auth_failures_per_minute = ${LIMIT}\\b`));
  }
  // Later guesses from the same address for the same user, even a right one, are refused unchecked.
  const again = await connectFrom('127.0.0.1');
  await assert.rejects(driverLogin(again, 'alice', 'wonder land'), (e) => e.code === 18 && /auth_failures_per_minute/.test(e.message));
  assert.ok(await proxy.waitForLog(/user alice from 127\.0\.0\.1 has 3 guesses within a minute/));
});

test('in the same minute, alice logs in from 127.0.0.2 and bob from 127.0.0.1', async () => {
  const before = await logins();
  assert.equal((await saslStart(await connectFrom('127.0.0.1'), 'alice')).code, 18, 'alice is still refused from 127.0.0.1');
  await driverLogin(await connectFrom('127.0.0.2'), 'alice', 'wonder land');
  await driverLogin(await connectFrom('127.0.0.1'), 'bob', 'b0b pass');
  const after = await logins();
  assert.equal(after.success - before.success, 2);
  assert.equal(after.throttled - before.throttled, 1);
});

test('a right password gives its guess back: more right logins than the limit from one address all succeed', async () => {
  for (let i = 0; i < LIMIT + 3; i++) await driverLogin(await connectFrom('127.0.0.3'), 'bob', 'b0b pass');
  // ... and bob's budget there is still whole: the limit's worth of wrong guesses are checked.
  for (let i = 0; i < LIMIT; i++) {
    const c = await connectFrom('127.0.0.3');
    const r = await saslStart(c, 'bob');
    assert.equal(r.ok, 1, `guess ${i + 1}: ${r.errmsg}`);
    assert.equal((await wrongProof(c, r)).code, 18);
  }
  const r = await saslStart(await connectFrom('127.0.0.3'), 'bob');
  assert.equal(r.code, 18);
  assert.match(r.errmsg, /auth_failures_per_minute/);
});

H.registerFinalChecks(test, [() => upstream && upstream.stop()], {
  beforeStop: () => {
    for (const c of open) c.destroy();
  },
});
