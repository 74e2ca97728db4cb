'use strict';
// Logins at the proxy in pooled mode: the proxy is the SCRAM server for its clients, with the
// users of an auth file made by `relaybus-proxy --make-user`, while its pool logs in upstream
// with the credentials of `upstream` (a double started with --auth here). Three whole clients
// log in (the Node.js driver, pymongo, mongo-c-driver): right and wrong passwords, SCRAM-SHA-256
// and SCRAM-SHA-1, named or negotiated (each driver speculates its first step in the hello,
// which the raw-wire test shows answered). Before a login only hello, ping and the
// SASL commands are answered; failed logins are limited per user and address; and one user may not kill
// another user's cursors or sessions.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { execFile, execFileSync } = require('node:child_process');
const { MongoClient, Long } = require('mongodb');
const H = require('../lib/proxy');

const BIN = H.proxyBin();
const DB = H.uniqueDbName('pooledauth');
const UP_USER = 'poolroot';
const UP_PASS = 'up:str3am/%';
const skip = H.doubleOnlySkipReason('--auth on demand') || false;
let upstream;
let proxy;
let authFile;
// A no-break space and ROMAN NUMERAL NINE: SASLprep makes them ' ' and 'IX' (RFC 4013).
const CHLOE_PASS = 'pässwörd\u00a0\u2168';

function makeUser(name, password) {
  return execFileSync(BIN, ['--make-user', name], { input: `${password}\n` }).toString();
}

function uri(user, password, params = {}) {
  const q = new URLSearchParams({ authSource: 'admin', serverSelectionTimeoutMS: '5000', ...params });
  const cred = user ? `${encodeURIComponent(user)}:${encodeURIComponent(password)}@` : '';
  return `mongodb://${cred}127.0.0.1:${proxy.port}/?${q}`;
}

test.before(async () => {
  if (skip) return;
  upstream = await H.startDouble({ auth: `${UP_USER}:${UP_PASS}` });
  const dir = H.tmpDir('relaybus-pooled-auth-');
  authFile = path.join(dir, 'users.auth');
  // alice may use both mechanisms; bob only SCRAM-SHA-256 (his SHA-1 line is left out).
  const bob = makeUser('bob', 'b0b pass').split('\n').filter((l) => l.includes(':SCRAM-SHA-256:')).join('\n');
  // chloé's password goes beyond ASCII: --make-user derives her entry from its SASLprep.
  fs.writeFileSync(authFile, makeUser('alice', 'wonder land') + bob + '\n' + makeUser('chloé', CHLOE_PASS), { mode: 0o600 });
  proxy = await H.startProxy({
    upstream: `mongodb://${encodeURIComponent(UP_USER)}:${encodeURIComponent(UP_PASS)}@127.0.0.1:${upstream.port}/?replicaSet=rs0&authSource=admin`,
    settings: { pool_mode: 'pooled', pool_size: 4, auth_file: authFile, auth_failures_per_minute: 1000 },
  });
});

test.after(async () => {
  await H.stopAllAndCheck();
  if (upstream) await upstream.stop();
});

for (const [label, params, sasl] of [
  ['negotiated (saslSupportedMechs names SCRAM-SHA-256)', {}, 'SCRAM-SHA-256'],
  ['SCRAM-SHA-256 named', { authMechanism: 'SCRAM-SHA-256' }, 'SCRAM-SHA-256'],
  ['SCRAM-SHA-1 named', { authMechanism: 'SCRAM-SHA-1' }, 'SCRAM-SHA-1'],
]) {
  test(`Node.js driver: alice logs in, ${label}`, { skip }, async () => {
    const client = new MongoClient(uri('alice', 'wonder land', params));
    try {
      const coll = client.db(DB).collection(`node_${sasl}_${Object.keys(params).length}`);
      await coll.insertOne({ _id: 1 });
      assert.deepEqual(await coll.findOne({ _id: 1 }), { _id: 1 });
      const status = await client.db('admin').command({ connectionStatus: 1 });
      assert.deepEqual(status.authInfo.authenticatedUsers, [{ user: 'alice', db: 'admin' }]);
    } finally {
      await client.close();
    }
  });
}

test('Node.js driver: a wrong password and an unknown user get 18 AuthenticationFailed', { skip }, async () => {
  for (const [user, password] of [['alice', 'wonder lanD'], ['mallory', 'wonder land']]) {
    const client = new MongoClient(uri(user, password));
    try {
      await assert.rejects(client.connect(), (e) => {
        assert.equal(e.code, 18, `${user}: ${e.message}`);
        return true;
      });
    } finally {
      await client.close();
    }
  }
});

test('Node.js driver: a SCRAM-SHA-256 password beyond ASCII logs in, SASLprepped on both sides', { skip }, async () => {
  // The driver SASLpreps a SCRAM-SHA-256 password itself, so the password as made and another
  // spelling with the same SASLprep both log in; a different password does not.
  for (const password of [CHLOE_PASS, 'pässwörd IX']) {
    const client = new MongoClient(uri('chloé', password, { authMechanism: 'SCRAM-SHA-256' }));
    try {
      await client.db(DB).collection('chloe').insertOne({ pw: password.length });
      const status = await client.db('admin').command({ connectionStatus: 1 });
      assert.deepEqual(status.authInfo.authenticatedUsers, [{ user: 'chloé', db: 'admin' }]);
    } finally {
      await client.close();
    }
  }
  const wrong = new MongoClient(uri('chloé', 'passwörd IX', { authMechanism: 'SCRAM-SHA-256' }));
  try {
    await assert.rejects(wrong.connect(), (e) => e.code === 18);
  } finally {
    await wrong.close();
  }
});

test('the pool logs in upstream with a SCRAM-SHA-256 password beyond ASCII', { skip }, async () => {
  const pass = 'gehëim wört';
  const own = await H.startDouble({ auth: `root:${pass}` });
  try {
    const p = await H.startProxy({
      upstream: `mongodb://root:${encodeURIComponent(pass)}@127.0.0.1:${own.port}/?replicaSet=rs0&authSource=admin&authMechanism=SCRAM-SHA-256`,
      settings: { pool_mode: 'pooled', pool_size: 2 },
    });
    const client = new MongoClient(p.uri({}, { credentials: false }), { serverSelectionTimeoutMS: 5000 });
    try {
      await client.db(DB).collection('upstream_utf8').insertOne({ _id: 1 });
      assert.deepEqual(await client.db(DB).collection('upstream_utf8').findOne({ _id: 1 }), { _id: 1 });
    } finally {
      await client.close();
    }
    assert.ok(!/cannot log in|SASLprep/.test(p.log()), p.log().slice(-2000));
    await p.stop();
  } finally {
    await own.stop();
  }
});

test('Node.js driver: bob has no SCRAM-SHA-1 entry, so SCRAM-SHA-1 is refused and SCRAM-SHA-256 works', { skip }, async () => {
  const sha1 = new MongoClient(uri('bob', 'b0b pass', { authMechanism: 'SCRAM-SHA-1' }));
  try {
    await assert.rejects(sha1.connect(), (e) => e.code === 18);
  } finally {
    await sha1.close();
  }
  const sha256 = new MongoClient(uri('bob', 'b0b pass'));
  try {
    assert.equal((await sha256.db(DB).command({ ping: 1 })).ok, 1);
    await sha256.db(DB).collection('bob').insertOne({ _id: 'b' });
  } finally {
    await sha256.close();
  }
});

test('before a login only hello, ping and the SASL commands are answered (raw wire)', { skip }, async () => {
  const c = await H.WireConn.connect({ port: proxy.port });
  try {
    const hello = await c.command({ hello: 1, saslSupportedMechs: 'admin.alice', $db: 'admin' });
    assert.equal(hello.ok, 1);
    assert.deepEqual(hello.saslSupportedMechs.sort(), ['SCRAM-SHA-1', 'SCRAM-SHA-256']);
    // Speculative authentication: the hello's first SCRAM step is answered in the hello.
    const spec = await c.command({
      hello: 1,
      speculativeAuthenticate: { saslStart: 1, mechanism: 'SCRAM-SHA-256', payload: Buffer.from('n,,n=alice,r=0123456789abcdef'), db: 'admin' },
      $db: 'admin',
    });
    assert.equal(spec.speculativeAuthenticate.conversationId, 1);
    assert.equal(spec.speculativeAuthenticate.done, false);
    assert.match(Buffer.from(spec.speculativeAuthenticate.payload.buffer).toString(), /^r=0123456789abcdef[^,]+,s=[^,]+,i=15000$/);
    const unknown = await c.command({ hello: 1, saslSupportedMechs: 'admin.mallory', $db: 'admin' });
    assert.equal(unknown.saslSupportedMechs, undefined, 'an unknown user gets no mechanisms, as from mongod');
    assert.equal((await c.command({ ping: 1, $db: 'admin' })).ok, 1);
    for (const cmd of [{ find: 'x', $db: DB }, { insert: 'x', documents: [{}], $db: DB }, { listDatabases: 1, $db: 'admin' }, { endSessions: [], $db: 'admin' }]) {
      const r = await c.command(cmd);
      assert.equal(r.ok, 0);
      assert.equal(r.code, 13, JSON.stringify(r));
      assert.equal(r.codeName, 'Unauthorized');
      assert.match(r.errmsg, /requires authentication/);
    }
    const x509 = await c.command({ authenticate: 1, mechanism: 'MONGODB-X509', $db: '$external' });
    assert.equal(x509.code, 18);
    const plain = await c.command({ saslStart: 1, mechanism: 'PLAIN', payload: Buffer.from('x'), $db: '$external' });
    assert.equal(plain.code, 334);
  } finally {
    c.destroy();
  }
});

const havePymongo = (() => {
  try {
    execFileSync('/usr/bin/python3', ['-c', 'import pymongo'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
})();
const PYMONGO = `
import sys
from pymongo import MongoClient
from pymongo.errors import OperationFailure
c = MongoClient(sys.argv[1], serverSelectionTimeoutMS=5000)
try:
    c[sys.argv[2]].py.insert_one({"n": 1})
    print(c.admin.command("connectionStatus")["authInfo"]["authenticatedUsers"][0]["user"])
except OperationFailure as e:
    print("code", e.code)
`;

for (const mech of ['SCRAM-SHA-256', 'SCRAM-SHA-1']) {
  test(`pymongo logs in with ${mech}; a wrong password gets 18`, { skip: skip || (!havePymongo && 'pymongo is not installed (Debian python3-pymongo)') }, async () => {
    const run = (password) =>
      new Promise((resolve, reject) => {
        execFile('/usr/bin/python3', ['-c', PYMONGO, uri('alice', password, { authMechanism: mech }), DB], { timeout: 30000 }, (err, stdout, stderr) =>
          err ? reject(new Error(`${err.message}: ${stderr}`)) : resolve(stdout.trim()));
      });
    assert.equal(await run('wonder land'), 'alice');
    assert.equal(await run('wonder'), 'code 18');
  });
}

let cdriver = null;
function cdriverClient() {
  if (!cdriver) cdriver = H.buildCdriverClient(path.join(H.REPO, 'tests', 'tools', 'scram-cdriver.c'));
  return cdriver;
}

for (const mech of ['SCRAM-SHA-256', 'SCRAM-SHA-1']) {
  test(`mongo-c-driver logs in with ${mech}; a wrong password is refused`, { skip }, async () => {
    const bin = cdriverClient();
    const run = (password) =>
      new Promise((resolve) => {
        execFile(bin, [uri('alice', password, { authMechanism: mech })], { timeout: 30000 }, (err, stdout) => resolve(stdout.trim()));
      });
    assert.equal(await run('wonder land'), 'ok');
    assert.match(await run('not it'), /^error \d+ (11|18) /);
  });
}

test("one user may not kill another user's cursors or sessions; its own it may", { skip }, async () => {
  const alice = new MongoClient(uri('alice', 'wonder land'));
  const bob = new MongoClient(uri('bob', 'b0b pass'));
  try {
    const coll = alice.db(DB).collection('cursors');
    await coll.insertMany(Array.from({ length: 20 }, (_, i) => ({ _id: i })));
    const first = await alice.db(DB).command({ find: 'cursors', batchSize: 2 });
    // Handed back as a long, as mongod wants a cursor id, whatever the driver promoted it to.
    const id = Long.fromValue(first.cursor.id);
    assert.ok(id.toString() !== '0', 'the find left a cursor open');
    await assert.rejects(bob.db(DB).command({ killCursors: 'cursors', cursors: [id] }), (e) => {
      assert.equal(e.code, 13);
      assert.match(e.message, /^not authorized to kill cursor on /);
      return true;
    });
    // Still alive for alice: a getMore works, then she kills it herself.
    const more = await alice.db(DB).command({ getMore: id, collection: 'cursors', batchSize: 2 });
    assert.equal(more.cursor.nextBatch.length, 2);
    const killed = await alice.db(DB).command({ killCursors: 'cursors', cursors: [id] });
    assert.equal(killed.ok, 1);
    // Sessions: every client's sessions at once, or no ids at all, are refused.
    for (const cmd of [{ killAllSessions: [] }, { killAllSessionsByPattern: [] }, { killSessions: [] }]) {
      await assert.rejects(bob.db('admin').command(cmd), (e) => e.code === 13);
    }
    // A session alice used cannot be killed by bob.
    const s = alice.startSession();
    await alice.db(DB).collection('cursors').findOne({}, { session: s });
    await assert.rejects(bob.db('admin').command({ killSessions: [s.id] }), (e) => e.code === 13 && /^not authorized on admin to execute command/.test(e.message));
    assert.equal((await alice.db('admin').command({ killSessions: [s.id] })).ok, 1);
    await s.endSession();
  } finally {
    await alice.close();
    await bob.close();
  }
});

test('failed logins are limited per user and address (auth_failures_per_minute)', { skip }, async () => {
  const limited = await H.startProxy({
    upstream: `mongodb://${encodeURIComponent(UP_USER)}:${encodeURIComponent(UP_PASS)}@127.0.0.1:${upstream.port}/?replicaSet=rs0&authSource=admin`,
    settings: { pool_mode: 'pooled', pool_size: 1, auth_file: authFile, auth_failures_per_minute: 3 },
  });
  const at = (user, password) =>
    `mongodb://${encodeURIComponent(user)}:${encodeURIComponent(password)}@127.0.0.1:${limited.port}/?authSource=admin&serverSelectionTimeoutMS=3000`;
  try {
    for (let i = 0; i < 3; i++) {
      const c = new MongoClient(at('alice', `wrong ${i}`));
      await assert.rejects(c.connect(), (e) => e.code === 18);
      await c.close();
    }
    // The fourth attempt, with the right password, is refused unchecked.
    const c = new MongoClient(at('alice', 'wonder land'));
    await assert.rejects(c.connect(), (e) => e.code === 18 && /too many failed logins/.test(e.message));
    await c.close();
    assert.ok(await limited.waitForLog(/user alice from 127\.0\.0\.1 has 3 failed logins within a minute/));
  } finally {
    await limited.stop();
  }
});

test('a pool that cannot log in upstream: clients are closed after upstream_connect_timeout_ms, and the log says why', { skip }, async () => {
  const bad = await H.startProxy({
    upstream: `mongodb://${encodeURIComponent(UP_USER)}:wrong@127.0.0.1:${upstream.port}/?replicaSet=rs0&authSource=admin`,
    settings: { pool_mode: 'pooled', pool_size: 1, upstream_connect_timeout_ms: 1500 },
    readyTimeoutMs: 3000,
  }).catch((e) => e);
  // Never ready: no hello can be learned without a logged-in connection.
  assert.ok(bad instanceof Error, 'the proxy must not answer a hello before its pool logged in');
  assert.match(bad.message, /login as poolroot refused|cannot open a connection/);
});

test('SIGHUP re-reads the auth file: a user added can log in; a file others may read is refused and the old users stay', { skip }, async () => {
  const before = fs.readFileSync(authFile, 'utf8');
  const carolUri = uri('carol', 'c4rol');
  try {
    fs.writeFileSync(authFile, before + makeUser('carol', 'c4rol'), { mode: 0o600 });
    proxy.child.kill('SIGHUP');
    assert.ok(await proxy.waitForLog(/reloaded /, { timeoutMs: 5000 }), 'the reload was logged');
    const carol = new MongoClient(carolUri);
    try {
      assert.equal((await carol.db(DB).command({ ping: 1 })).ok, 1);
      await carol.db(DB).collection('carol').insertOne({ _id: 1 });
    } finally {
      await carol.close();
    }
    // A file others may read: the reload fails, and the users loaded before stay.
    fs.chmodSync(authFile, 0o644);
    const reloads = proxy.logLines('reload').length;
    proxy.child.kill('SIGHUP');
    const deadline = Date.now() + 5000;
    while (proxy.logLines('reload').length === reloads && Date.now() < deadline) await H.sleep(50);
    assert.match(proxy.logLines('reload').slice(reloads).join('\n'), /auth_file/);
    const again = new MongoClient(carolUri);
    try {
      assert.equal((await again.db(DB).command({ ping: 1 })).ok, 1, 'carol still logs in with the users loaded before');
    } finally {
      await again.close();
    }
  } finally {
    fs.writeFileSync(authFile, before);
    fs.chmodSync(authFile, 0o600);
  }
});
