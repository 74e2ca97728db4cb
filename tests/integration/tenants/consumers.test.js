'use strict';
// Hostile tenants of the pull consumers. A handler's `consumers` list names who may run the
// relaybus* commands on it: everyone else is refused with 13 Unauthorized and a message naming
// the handler, in pooled mode (the identity is the auth-file user the connection logged in as)
// and in session mode (the user the server accepted in the SASL conversation the proxy relays;
// the double is started with two users). A handler without a list keeps the old rule.

const test = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const fs = require('node:fs');
const path = require('node:path');
const { execFileSync } = require('node:child_process');
const { MongoClient } = require('mongodb');
const C = require('../consumers/lib');

const { H, P } = C;
const skip = H.doubleOnlySkipReason('two users on demand (--auth twice)') || false;

// `guarded` admits only its list; `open` has none. Both take the same events.
function handlersIni(consumers) {
  return (
    `[handler guarded]\nevents = ten.*\nkind = pull\nconsumers = ${consumers}\n\n` +
    '[handler open]\nevents = ten.*\nkind = pull\n'
  );
}

const session = {}; // session mode: upstream, proxy, direct, owner (pub), other (bob)
const pooled = {}; // pooled mode: the same, owner alice and other bob (auth-file users)

function clientOf(port, user, password) {
  return new MongoClient(
    `mongodb://${encodeURIComponent(user)}:${encodeURIComponent(password)}@127.0.0.1:${port}/?authSource=admin`,
    { maxPoolSize: 1, serverSelectionTimeoutMS: 10000 },
  );
}

function makeUser(name, password) {
  return execFileSync(H.proxyBin(), ['--make-user', name], { input: `${password}\n` }).toString();
}

test.before(async () => {
  if (skip) return;
  // Session mode: the double knows pub (the proxy's own user too) and bob.
  session.upstream = await H.startDouble({ auth: 'pub:secret', args: ['--auth', 'bob:b0b-pass'] });
  session.proxy = await H.startProxy({
    upstream: `mongodb://pub:secret@127.0.0.1:${session.upstream.port}/?replicaSet=rs0&authSource=admin`,
    extraIni: handlersIni('pub, nobody'),
  });
  // Pooled mode: the proxy logs in upstream as pub; its clients log in at the proxy.
  pooled.upstream = await H.startDouble({ auth: 'pub:secret' });
  const authFile = path.join(H.tmpDir('relaybus-tenants-'), 'users.auth');
  fs.writeFileSync(authFile, makeUser('alice', 'al1ce-pass') + makeUser('bob', 'b0b-pass'), { mode: 0o600 });
  pooled.proxy = await H.startProxy({
    upstream: `mongodb://pub:secret@127.0.0.1:${pooled.upstream.port}/?replicaSet=rs0&authSource=admin`,
    settings: { pool_mode: 'pooled', pool_size: 4, auth_file: authFile },
    extraIni: handlersIni('alice'),
  });
  for (const [s, owner, ownerPass] of [
    [session, 'pub', 'secret'],
    [pooled, 'alice', 'al1ce-pass'],
  ]) {
    s.direct = new MongoClient(s.upstream.directUri);
    await s.direct.connect();
    await P.ensureOutbox(s.direct);
    s.owner = clientOf(s.proxy.port, owner, ownerPass);
    s.other = clientOf(s.proxy.port, 'bob', 'b0b-pass');
    await s.owner.connect();
    await s.other.connect();
  }
});

/** Runs `doc` and returns the reply, or the error's fields when the command failed. */
async function run(client, doc) {
  try {
    return await C.cmd(client, doc);
  } catch (e) {
    return { ok: 0, code: e.code, codeName: e.codeName, errmsg: e.message };
  }
}

function assertRefused(r, what) {
  assert.equal(r.ok, 0, `${what}: ${JSON.stringify(r)}`);
  assert.equal(r.code, 13, `${what}: ${r.errmsg}`);
  assert.equal(r.codeName, 'Unauthorized');
  assert.match(r.errmsg, /handler 'guarded'/, `${what}: the message names the handler`);
}

/** The refusals of another user, then the same commands admitted for the listed one. */
async function listedAndOther(s, tag) {
  const ids = [C.newId(tag), C.newId(tag), C.newId(tag), C.newId(tag)];
  await C.publish(s.owner, ids.map((id) => ({ type: 'ten.created', id })));
  const mine = await C.claimN(s.owner, 'guarded', 4, { leaseMs: 60000 });
  const [a, b, c, d] = mine.map((x) => x.lease);

  for (const doc of [
    { relaybusClaim: 'guarded', limit: 10 },
    { relaybusComplete: 'guarded', leases: [a] },
    { relaybusBury: 'guarded', lease: a, error: 'not yours' },
    { relaybusRetry: 'guarded', lease: a, delayMs: 0 },
    { relaybusExtend: 'guarded', leases: [a], leaseMs: 60000 },
    { relaybusRelease: 'guarded', leases: [a] },
    { relaybusStatus: 'guarded' },
  ]) {
    assertRefused(await run(s.other, doc), `${Object.keys(doc)[0]} of bob`);
  }
  // Nothing of the guarded deliveries changed: still claimed, no attempt charged.
  for (const id of ids) {
    const stored = await P.outboxOf(s.direct).deliveries.findOne({ eventId: id, handler: 'guarded' });
    assert.equal(stored.attempts, 0, `${id}: no attempt charged`);
    assert.equal(stored.status, 'pending');
  }

  // The listed user runs every command.
  const ext = await C.cmd(s.owner, { relaybusExtend: 'guarded', leases: [a, b, c, d], leaseMs: 60000 });
  assert.equal(ext.extended.length, 4);
  assert.deepEqual((await C.cmd(s.owner, { relaybusComplete: 'guarded', leases: [a] })).completed, [a]);
  assert.equal((await C.cmd(s.owner, { relaybusRetry: 'guarded', lease: b, delayMs: 600000 })).applied, true);
  assert.equal((await C.cmd(s.owner, { relaybusBury: 'guarded', lease: c, error: 'x' })).status, 'dead');
  assert.deepEqual((await C.cmd(s.owner, { relaybusRelease: 'guarded', leases: [d] })).released, [d]);
  assert.equal((await C.cmd(s.owner, { relaybusStatus: 'guarded' })).handler, 'guarded');

  // Without a list, the old rule: any connection allowed to read the outbox consumes.
  const theirs = await C.claimN(s.other, 'open', 4);
  const done = await C.cmd(s.other, { relaybusComplete: 'open', leases: theirs.map((x) => x.lease) });
  assert.equal(done.completed.length, 4);
  // What d was released to is claimed again by its owner, and settled.
  const [again] = await C.claimN(s.owner, 'guarded', 1);
  assert.equal(again.eventId, ids[3]);
  await C.cmd(s.owner, { relaybusComplete: 'guarded', leases: [again.lease] });
}

test('pooled mode: another auth-file user is refused every command on a guarded handler; the listed one runs them', { skip }, async () => {
  await listedAndOther(pooled, 'pooled');
});

test('session mode: another user the server accepted is refused every command on a guarded handler; the listed one runs them', { skip }, async () => {
  await listedAndOther(session, 'session');
});

// ---- session mode on the wire: the conversation the proxy reads

function hmac(key, data) {
  return crypto.createHmac('sha256', key).update(data).digest();
}

/** One SCRAM-SHA-256 conversation by hand (saslStart, saslContinue); the last reply. */
async function scram(conn, user, password) {
  const nonce = crypto.randomBytes(18).toString('base64');
  const bare = `n=${user.replace(/=/g, '=3D').replace(/,/g, '=2C')},r=${nonce}`;
  const start = await conn.command({
    saslStart: 1,
    mechanism: 'SCRAM-SHA-256',
    payload: Buffer.from(`n,,${bare}`),
    options: { skipEmptyExchange: true },
    $db: 'admin',
  });
  if (start.ok !== 1) return start;
  const serverFirst = Buffer.from(start.payload.buffer).toString();
  const attrs = Object.fromEntries(serverFirst.split(',').map((kv) => [kv[0], kv.slice(2)]));
  const salted = crypto.pbkdf2Sync(password, Buffer.from(attrs.s, 'base64'), Number(attrs.i), 32, 'sha256');
  const clientKey = hmac(salted, 'Client Key');
  const storedKey = crypto.createHash('sha256').update(clientKey).digest();
  const withoutProof = `c=biws,r=${attrs.r}`;
  const sig = hmac(storedKey, `${bare},${serverFirst},${withoutProof}`);
  const proof = Buffer.from(clientKey.map((x, i) => x ^ sig[i])).toString('base64');
  return conn.command({
    saslContinue: 1,
    conversationId: start.conversationId,
    payload: Buffer.from(`${withoutProof},p=${proof}`),
    $db: 'admin',
  });
}

test('session mode: only a conversation the server accepted names the user; a refused one changes nothing', { skip }, async () => {
  const conn = await H.WireConn.connect({ port: session.proxy.port });
  const claim = { relaybusClaim: 'guarded', limit: 1, $db: 'admin' };
  try {
    await conn.command({ hello: 1, $db: 'admin' });
    // A refused conversation claiming to be pub records nothing.
    const refused = await scram(conn, 'pub', 'wrong');
    assert.equal(refused.ok, 0);
    assert.equal(refused.code, 18);
    assert.equal((await conn.command(claim)).code, 13);
    // bob is accepted, and is not on the list.
    assert.equal((await scram(conn, 'bob', 'b0b-pass')).ok, 1);
    const asBob = await conn.command(claim);
    assertRefused(asBob, 'claim of bob');
    assert.match(asBob.errmsg, /'bob'/);
    // pub with a wrong password: refused by the server, bob stays.
    assert.equal((await scram(conn, 'pub', 'secret!')).ok, 0);
    assertRefused(await conn.command(claim), 'claim of bob after a refused conversation');
    // pub accepted: the new conversation replaces bob.
    assert.equal((await scram(conn, 'pub', 'secret')).ok, 1);
    const asPub = await conn.command(claim);
    assert.equal(asPub.ok, 1, JSON.stringify(asPub));
    for (const d of asPub.deliveries) await conn.command({ relaybusRelease: 'guarded', leases: [d.lease], $db: 'admin' });
  } finally {
    conn.destroy();
  }
});

H.registerFinalChecks(test, [() => session.upstream && session.upstream.stop(), () => pooled.upstream && pooled.upstream.stop()], {
  beforeStop: async () => {
    for (const s of [session, pooled])
      for (const c of [s.owner, s.other, s.direct]) if (c) await c.close().catch(() => {});
  },
});
