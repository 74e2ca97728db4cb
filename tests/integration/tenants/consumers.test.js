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

// ---- fair shares: one consumer floods, another is still answered

const flood = {}; // a proxy of its own: upstream, proxy, publisher, flooder, victim, conns

/** Publishes `n` events of `type` through `client`, 100 a relaybusPublish, 10 of those a transaction. */
async function publishMany(client, type, n, tag) {
  for (let done = 0; done < n; ) {
    const session = client.startSession();
    try {
      await session.withTransaction(async () => {
        for (let k = 0; k < 10 && done < n; k++) {
          const events = [];
          for (; events.length < 100 && done < n; done++) events.push({ type, id: `${tag}-${done}` });
          await client.db('rbtenants').command({ relaybusPublish: 1, events }, { session });
        }
      });
    } finally {
      await session.endSession();
    }
  }
}

test('fair shares: one connection holds at most 2,500 claims (a quarter); another still claims', { skip }, async () => {
  flood.upstream = await H.startDouble({});
  flood.proxy = await H.startProxy({
    upstream: flood.upstream.uri,
    extraIni:
      '[handler bulk]\nevents = bulk.*\nkind = pull\n\n' +
      '[handler empty]\nevents = empty.*\nkind = pull\n\n' +
      '[handler quiet]\nevents = quiet.*\nkind = pull\n',
  });
  const direct = new MongoClient(flood.upstream.directUri);
  await direct.connect();
  await P.ensureOutbox(direct);
  await direct.close();
  const uri = `mongodb://127.0.0.1:${flood.proxy.port}/`;
  flood.publisher = new MongoClient(uri, { serverSelectionTimeoutMS: 10000 });
  flood.flooder = new MongoClient(uri, { maxPoolSize: 1, serverSelectionTimeoutMS: 10000 });
  flood.victim = new MongoClient(uri, { maxPoolSize: 1, serverSelectionTimeoutMS: 10000 });
  for (const c of [flood.publisher, flood.flooder, flood.victim]) await c.connect();
  const tag = C.newId('flood');
  await publishMany(flood.publisher, 'bulk.item', 2600, tag);

  // One connection takes what it may: 1,000 + 1,000 + 500, then it is refused at its share.
  const leases = (flood.leases = []);
  for (let i = 0; i < 3; i++) {
    const r = await C.cmd(flood.flooder, { relaybusClaim: 'bulk', limit: 1000, leaseMs: 60000 });
    leases.push(...r.deliveries.map((d) => d.lease));
  }
  assert.equal(leases.length, 2500, 'a connection holds at most a quarter of the 10,000 claims');
  const past = await run(flood.flooder, { relaybusClaim: 'bulk', limit: 10 });
  assert.equal(past.code, 365, JSON.stringify(past));
  assert.equal(past.codeName, 'TemporarilyUnavailable');
  assert.match(past.errmsg, /this connection holds 2500 claims already/);
  // Another connection still claims what is left of the handler.
  const rest = await C.claimN(flood.victim, 'bulk', 100);
  await C.cmd(flood.victim, { relaybusRelease: 'bulk', leases: rest.map((d) => d.lease) });
});

test('fair shares: long polls past a handler\'s 128 are refused at once, the others wait', { skip }, async () => {
  // The flood: 20 connections, 16 long polls each on a handler with nothing due.
  flood.conns = [];
  let sent = 0;
  for (let i = 0; i < 20; i++) {
    const conn = await H.WireConn.connect({ port: flood.proxy.port });
    flood.conns.push(conn);
    await conn.command({ hello: 1, $db: 'admin' });
    const bufs = [];
    for (let k = 0; k < 16; k++) bufs.push(H.opMsg({ relaybusClaim: 'empty', maxAwaitTimeMS: 20000, $db: 'admin' }).buf);
    await conn.write(Buffer.concat(bufs));
    sent += 16;
  }
  // The ones past the handler's half of the 256 are refused at once, the rest wait.
  let refused = 0;
  const until = Date.now() + 10000;
  while (refused < sent - 128 && Date.now() < until) {
    for (const conn of flood.conns) {
      while (conn.queue.length) {
        const m = await conn.next();
        assert.equal(m.doc.code, 365, JSON.stringify(m.doc));
        // Past the handler's share of the long polls, or of the consumer thread's queue.
        assert.match(m.doc.errmsg, /handler 'empty' wait already/);
        refused++;
      }
    }
    await H.sleep(20);
  }
  const status = await C.cmd(flood.victim, { relaybusStatus: 'empty' });
  assert.equal(status.waiting, 128, JSON.stringify(status));
  assert.equal(refused, sent - 128, 'a handler keeps at most half of the long polls waiting');
});

test('fair shares: while one consumer extends 2,500 leases, and long polls and status requests flood the thread, another\'s long poll is answered within 1 s of its commit', { skip }, async (t) => {
  // While the flooder extends its 2,500 leases (1,000 at a time), the victim long-polls its own
  // handler and is answered with its event within 1 s of the commit.
  const leases = flood.leases.slice(0, 2500);
  const extends_ = [0, 1000, 2000].map((at) =>
    C.cmd(flood.flooder, { relaybusExtend: 'bulk', leases: leases.slice(at, at + 1000), leaseMs: 120000 }),
  );
  // And 8 more connections queue 16 relaybusStatus each (a store aggregation each) of the long
  // polls' handler, its half of the consumer thread's queue: they take turns with the others.
  const statusConns = [];
  for (let i = 0; i < 8; i++) {
    const conn = await H.WireConn.connect({ port: flood.proxy.port });
    statusConns.push(conn);
    flood.conns.push(conn);
    await conn.command({ hello: 1, $db: 'admin' });
  }
  for (const conn of statusConns) {
    const bufs = [];
    for (let k = 0; k < 16; k++) bufs.push(H.opMsg({ relaybusStatus: 'empty', $db: 'admin' }).buf);
    await conn.write(Buffer.concat(bufs));
  }
  const t0 = Date.now();
  const claim = C.cmd(flood.victim, { relaybusClaim: 'quiet', limit: 1, maxAwaitTimeMS: 10000 });
  await H.sleep(100); // the claim is waiting (or queued behind the extends) before the event commits
  const id = C.newId('quiet');
  await C.publish(flood.publisher, [{ type: 'quiet.item', id }]);
  const committed = Date.now();
  const r = await claim;
  const answered = Date.now();
  assert.equal(r.ok, 1, JSON.stringify(r));
  assert.equal(r.deliveries.length, 1);
  assert.equal(r.deliveries[0].eventId, id);
  t.diagnostic(`the victim's long poll was answered ${answered - committed} ms after the commit (${answered - t0} ms after it was sent)`);
  assert.ok(answered - committed < 1000, `answered ${answered - committed} ms after the commit (${answered - t0} ms after the claim)`);
  const ext = await Promise.all(extends_);
  assert.equal(ext.reduce((n, x) => n + x.extended.length, 0), 2500);
  let statuses = 0;
  for (const conn of statusConns) {
    for (let k = 0; k < 16; k++) {
      const m = await conn.next({ timeoutMs: 30000 });
      // Answered, or refused past the handler's share of the queue.
      assert.ok(m.doc.ok === 1 || m.doc.code === 365, JSON.stringify(m.doc));
      statuses += m.doc.ok === 1;
    }
  }
  assert.ok(statuses > 0);
  await C.cmd(flood.victim, { relaybusComplete: 'quiet', leases: [r.deliveries[0].lease] });
});

test('fair shares: a consumer that closes holding 2,500 claims does not hold another up for 1 s', { skip }, async () => {
  // The flooder goes away holding 2,500 claims: they are charged 100 to a store transaction, a
  // slice a turn, so the victim's next claim is still answered within 1 s, and the deliveries are
  // due again.
  await flood.flooder.close();
  flood.flooder = null;
  const t1 = Date.now();
  const again = await C.cmd(flood.victim, { relaybusClaim: 'quiet', limit: 1 });
  assert.equal(again.ok, 1);
  assert.ok(Date.now() - t1 < 1000, `answered ${Date.now() - t1} ms after the flooder's close`);
  const direct2 = new MongoClient(flood.upstream.directUri);
  await direct2.connect();
  try {
    const dels = P.outboxOf(direct2).deliveries;
    const until2 = Date.now() + 10000;
    let charged = 0;
    while (Date.now() < until2 && (charged = await dels.countDocuments({ handler: 'bulk', attempts: 1 })) < 2500) await H.sleep(50);
    assert.equal(charged, 2500, 'every claim of the closed connection is charged one attempt');
  } finally {
    await direct2.close();
  }
});

H.registerFinalChecks(
  test,
  [() => session.upstream && session.upstream.stop(), () => pooled.upstream && pooled.upstream.stop(), () => flood.upstream && flood.upstream.stop()],
  {
    beforeStop: async () => {
      for (const s of [session, pooled])
        for (const c of [s.owner, s.other, s.direct]) if (c) await c.close().catch(() => {});
      for (const c of [flood.publisher, flood.flooder, flood.victim]) if (c) await c.close().catch(() => {});
      for (const c of flood.conns || []) c.destroy();
    },
  },
);
