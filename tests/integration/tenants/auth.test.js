'use strict';
// Hostile tenants at the proxy's login (pooled mode): password guessing. With
// auth_failures_per_minute = 3, a proof is checked only while its (user, address) pair has fewer
// than 3 failures, and a wrong one counts before the next is checked, so twelve wrong proofs sent
// at once for one user from one address get three checked, not twelve; the others are refused
// unchecked with 18 and a message naming the limit, and so is every later conversation of the
// pair at its saslStart. Right proofs never count: twelve right logins started at once all log
// in. The limit belongs to the (user, address) pair: the same user from 127.0.0.2 and another
// user from 127.0.0.1 still log in. Conversations are driven
// over raw sockets (H.WireConn, bound to a chosen local address); the right logins use the
// Node.js driver's own SCRAM provider on such a socket, so its proof and its check of the
// proxy's signature are the driver's. Proofs checked are read from relaybus_logins_total.
// Guesses spread over many addresses are slowed down instead: once a user has LIMIT failures
// in a minute, each further proof of that user waits 100 ms, doubled by each failure, on a timer
// of the loop, which serves its other connections meanwhile.

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
  fs.writeFileSync(authFile, makeUser('alice', 'wonder land') + makeUser('bob', 'b0b pass') + makeUser('carol', 'c4rol'), {
    mode: 0o600,
  });
  adminPort = await H.freePort();
  proxy = await H.startProxy({
    upstream: upstream.uri,
    // Four loops: the twelve connections are spread over them, and the limit must hold across.
    settings: { pool_mode: 'pooled', pool_size: 2, threads: 4, auth_file: authFile, auth_failures_per_minute: LIMIT },
    extraIni: `[admin]\nlisten = 127.0.0.1:${adminPort}\n`,
  });
});

test('12 right logins of one user from one address, all started before any proof: all 12 log in, none throttled', async () => {
  const before = await logins();
  const conns = await Promise.all(Array.from({ length: 12 }, () => connectFrom('127.0.0.9')));
  await Promise.all(conns.map((c) => driverLogin(c, 'carol', 'c4rol')));
  const after = await logins();
  assert.equal(after.success - before.success, 12);
  assert.equal(after.throttled - before.throttled, 0);
  assert.equal(after.failure - before.failure, 0);
});

test('12 parallel guesses for one user from one address: 3 proofs checked, 9 refused unchecked naming the limit', async () => {
  const before = await logins();
  const conns = await Promise.all(Array.from({ length: 12 }, () => connectFrom('127.0.0.1')));
  // Every conversation is started before any proof is sent: no failure yet, so each starts.
  const starts = await Promise.all(conns.map((c) => saslStart(c, 'alice')));
  for (const r of starts) assert.equal(r.ok, 1, JSON.stringify(r));
  // Then every conversation sends its (wrong) proof, at once.
  const proofs = await Promise.all(starts.map((r, i) => wrongProof(conns[i], r)));
  for (const p of proofs) assert.equal(p.code, 18, JSON.stringify(p));
  const after = await logins();
  assert.equal(after.failure - before.failure, LIMIT, 'proofs checked (each wrong)');
  assert.equal(after.throttled - before.throttled, 12 - LIMIT, 'refused unchecked');
  assert.equal(after.success - before.success, 0);
  const refused = proofs.filter((r) => /too many failed logins/.test(r.errmsg));
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
  assert.ok(await proxy.waitForLog(/user alice from 127\.0\.0\.1 has 3 failed logins within a minute/));
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

test('right passwords never count: more right logins than the limit from one address all succeed', async () => {
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

test('guesses for one user from many addresses: past the limit each proof waits longer, the loops serve others meanwhile, and the right password still logs in', async () => {
  // LIMIT wrong guesses from as many addresses: each within its pair's budget, none delayed.
  for (let i = 0; i < LIMIT; i++) {
    const c = await connectFrom(`127.0.1.${i + 1}`);
    assert.equal((await wrongProof(c, await saslStart(c, 'carol'))).code, 18);
  }
  assert.deepEqual(proxy.logLines('proof of user carol delayed'), [], 'no delay below the limit');
  // Four connections, one on each loop, to ping while a proof waits.
  const others = await Promise.all([1, 2, 3, 4].map((k) => connectFrom(`127.0.3.${k}`)));
  // Now carol has LIMIT failures: each further proof waits 100 ms, doubled with each failure.
  for (const [i, delay] of [100, 200, 400].entries()) {
    const c = await connectFrom(`127.0.2.${i + 1}`);
    const r = await saslStart(c, 'carol');
    const t0 = Date.now();
    const proof = wrongProof(c, r);
    let answered = false;
    proof.then(() => (answered = true));
    if (delay === 400) {
      // Meanwhile every loop answers its other connections.
      for (const r of await Promise.all(others.map((o) => o.command({ ping: 1, $db: 'admin' })))) assert.equal(r.ok, 1);
      assert.equal(answered, false, 'the pings were answered while the proof waited');
    }
    assert.equal((await proof).code, 18);
    const took = Date.now() - t0;
    assert.ok(took >= delay - 5, `proof ${i + 1} past the limit answered after ${took} ms, wanted ${delay}`);
  }
  assert.ok(await proxy.waitForLog(/proof of user carol delayed 400 ms/));
  // Slowed down, not locked out: the right password from yet another address logs in (after 800 ms).
  const t0 = Date.now();
  await driverLogin(await connectFrom('127.0.2.9'), 'carol', 'c4rol');
  assert.ok(Date.now() - t0 >= 795);
});

test('while a proof waits, the connection cannot have it checked early or start over: those commands get 17 after it', async () => {
  const c = await connectFrom('127.0.2.20');
  const started = await saslStart(c, 'carol');
  const r = /r=([^,]+)/.exec(Buffer.from(started.payload.buffer).toString())[1];
  const cont = (p) => H.opMsg({ saslContinue: 1, conversationId: 1, payload: new Binary(Buffer.from(`c=biws,r=${r},p=${p}`)), $db: 'admin' });
  const first = cont(crypto.randomBytes(32).toString('base64'));
  const second = cont(crypto.randomBytes(32).toString('base64'));
  const restart = H.opMsg({ saslStart: 1, mechanism: 'SCRAM-SHA-256', payload: new Binary(Buffer.from('n,,n=carol,r=abc')), $db: 'admin' });
  const before = await logins();
  const t0 = Date.now();
  await c.write(Buffer.concat([first.buf, second.buf, restart.buf]));
  const answers = [await c.next(), await c.next(), await c.next()];
  assert.ok(Date.now() - t0 >= 795, 'carol has six failures: 800 ms');
  assert.deepEqual(answers.map((a) => a.responseTo), [first.requestID, second.requestID, restart.requestID]);
  assert.equal(answers[0].doc.code, 18);
  for (const a of answers.slice(1)) {
    assert.equal(a.doc.code, 17, JSON.stringify(a.doc));
    assert.match(a.doc.errmsg, /waits for its answer/);
  }
  const after = await logins();
  assert.equal(after.failure - before.failure, 1, 'one proof checked');
});

test('a connection closed while its proof waits has nothing checked, and the proxy carries on', async () => {
  const before = await logins();
  const gone = await connectFrom('127.0.2.21');
  const started = await saslStart(gone, 'carol');
  const r = /r=([^,]+)/.exec(Buffer.from(started.payload.buffer).toString())[1];
  await gone.write(H.opMsg({ saslContinue: 1, conversationId: 1, payload: new Binary(Buffer.from(`c=biws,r=${r},p=${crypto.randomBytes(32).toString('base64')}`)), $db: 'admin' }).buf);
  assert.ok(await proxy.waitForLog(/proof of user carol delayed 1600 ms/));
  gone.destroy();
  await gone.waitClosed(2000);
  // A later conversation's delay ends after the closed one's would have.
  const c = await connectFrom('127.0.2.22');
  assert.equal((await wrongProof(c, await saslStart(c, 'carol'))).code, 18);
  const after = await logins();
  assert.equal(after.failure - before.failure, 1, 'only the proof of the open connection was checked');
});

H.registerFinalChecks(test, [() => upstream && upstream.stop()], {
  beforeStop: () => {
    for (const c of open) c.destroy();
  },
});
