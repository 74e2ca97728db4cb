'use strict';
// Hostile tenants of one pooled proxy: two users of the auth file, alice and bob, share its pool,
// and bob tries to reach what is alice's by naming its ids, as he could on the pool's one server
// login. What the tests check:
//  - every command that names alice's cursor, session, transaction or an operation is refused with
//    mongod's 13 Unauthorized, and alice's own cursor and transaction carry on intact;
//  - the listings that would show bob alice's ids ($currentOp, $listLocalSessions) are refused;
//  - before a login nothing but hello, the login and ping reaches the pool: a request the pool's
//    peek cannot read (over 64 KiB, compressed, body not first) is refused without a connection,
//    and a client that never logs in is closed after login_timeout_ms;
//  - one user's open transactions pin at most pool_max_pins_per_user connections, and a
//    transaction whose commit is answered pins none: on any loop, the next start is not refused.
// The clients speak the wire protocol themselves (with a SCRAM-SHA-256 login), so that bob can
// send exactly what a driver of his would never send.

const test = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const fs = require('node:fs');
const path = require('node:path');
const { execFileSync } = require('node:child_process');
const { Binary, Long } = require('mongodb');
const H = require('../lib/proxy');

const BIN = H.proxyBin();
const DB = H.uniqueDbName('owners');
const UP_USER = 'poolroot';
const UP_PASS = 'up-pass';
const USERS = { alice: 'wonder land', bob: 'b0b pass' };
const skip = H.doubleOnlySkipReason('--auth on demand') || false;
let upstream;
let authFile;

async function metrics(port) {
  return (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
}

/** The value of one series of /metrics (`name` with its labels, as printed), 0 when absent. */
async function metric(proxy, series) {
  const line = (await metrics(proxy.adminPort)).split('\n').find((l) => l.startsWith(series + ' '));
  return line ? Number(line.split(' ').pop()) : 0;
}

async function startPooled(settings) {
  const adminPort = await H.freePort();
  const proxy = await H.startProxy({
    upstream: `mongodb://${UP_USER}:${UP_PASS}@127.0.0.1:${upstream.port}/?replicaSet=rs0&authSource=admin`,
    settings: { pool_mode: 'pooled', auth_file: authFile, auth_failures_per_minute: 1000, ...settings },
    extraIni: `[admin]\nlisten = 127.0.0.1:${adminPort}\n`,
  });
  proxy.adminPort = adminPort;
  return proxy;
}

/** A raw connection to `proxy`, said hello to (offering `compression`) and, with `user`, logged
 * in with SCRAM-SHA-256 (RFC 7677) as a driver does it. */
async function connect(proxy, user, { compression } = {}) {
  const c = await H.WireConn.connect({ port: proxy.port });
  const hello = await c.command({ hello: 1, $db: 'admin', ...(compression ? { compression } : {}) });
  assert.equal(hello.ok, 1);
  if (!user) return c;
  const nonce = crypto.randomBytes(18).toString('base64');
  const bare = `n=${user},r=${nonce}`;
  const first = await c.command({
    saslStart: 1, mechanism: 'SCRAM-SHA-256', payload: new Binary(Buffer.from(`n,,${bare}`)),
    options: { skipEmptyExchange: true }, $db: 'admin',
  });
  assert.equal(first.ok, 1, JSON.stringify(first));
  const serverFirst = Buffer.from(first.payload.buffer).toString();
  const attrs = Object.fromEntries(serverFirst.split(',').map((kv) => [kv[0], kv.slice(2)]));
  const salted = crypto.pbkdf2Sync(USERS[user], Buffer.from(attrs.s, 'base64'), Number(attrs.i), 32, 'sha256');
  const hmac = (key, text) => crypto.createHmac('sha256', key).update(text).digest();
  const clientKey = hmac(salted, 'Client Key');
  const withoutProof = `c=biws,r=${attrs.r}`;
  const signature = hmac(crypto.createHash('sha256').update(clientKey).digest(), `${bare},${serverFirst},${withoutProof}`);
  const proof = Buffer.from(clientKey.map((b, i) => b ^ signature[i])).toString('base64');
  const final = await c.command({
    saslContinue: 1, conversationId: first.conversationId,
    payload: new Binary(Buffer.from(`${withoutProof},p=${proof}`)), $db: 'admin',
  });
  assert.equal(final.ok, 1, JSON.stringify(final));
  assert.equal(final.done, true);
  return c;
}

function newLsid() {
  return { id: new Binary(crypto.randomBytes(16), 4) };
}

function assertUnauthorized(reply, errmsg) {
  assert.equal(reply.ok, 0, JSON.stringify(reply));
  assert.equal(reply.code, 13, JSON.stringify(reply));
  assert.equal(reply.codeName, 'Unauthorized');
  if (errmsg) assert.match(reply.errmsg, errmsg);
}

test.before(async () => {
  if (skip) return;
  upstream = await H.startDouble({ auth: `${UP_USER}:${UP_PASS}` });
  authFile = path.join(H.tmpDir('relaybus-owners-'), 'users.auth');
  const make = (name) => execFileSync(BIN, ['--make-user', name], { input: `${USERS[name]}\n` }).toString();
  fs.writeFileSync(authFile, make('alice') + make('bob'), { mode: 0o600 });
});

test("bob cannot use alice's cursor, session, transaction or operations; alice's own carry on", { skip }, async () => {
  const proxy = await startPooled({ pool_size: 4 });
  const alice = await connect(proxy, 'alice');
  const aliceTxn = await connect(proxy, 'alice'); // a driver runs a transaction on a connection of its pool
  const bob = await connect(proxy, 'bob');
  try {
    const coll = 'secrets';
    assert.equal((await alice.command({ insert: coll, documents: Array.from({ length: 6 }, (_, i) => ({ _id: i })), $db: DB })).ok, 1);
    const found = await alice.command({ find: coll, sort: { _id: 1 }, batchSize: 2, $db: DB });
    assert.deepEqual(found.cursor.firstBatch, [{ _id: 0 }, { _id: 1 }]);
    // Sent back as a long, as mongod wants a cursor id (the reply's was promoted to a number).
    const cursor = Long.fromValue(found.cursor.id);
    assert.notEqual(cursor.toString(), '0', 'the find left a cursor open');

    // Alice's transaction: one write, not committed, her connection pinned to it.
    const lsid = newLsid();
    const txnNumber = Long.fromNumber(1);
    const txn = { lsid, txnNumber, autocommit: false };
    assert.equal((await aliceTxn.command({ insert: coll, documents: [{ _id: 'uncommitted' }], ...txn, startTransaction: true, $db: DB })).ok, 1);

    // Her cursor.
    assertUnauthorized(await bob.command({ getMore: cursor, collection: coll, batchSize: 2, $db: DB }),
      new RegExp(`^cursor id ${cursor} was not created by the authenticated user$`));
    assertUnauthorized(await bob.command({ killCursors: coll, cursors: [cursor], $db: DB }),
      new RegExp(`^not authorized to kill cursor on ${DB}\\.${coll}$`));
    // Her session and its transaction: statements with or without txnNumber, commit, abort.
    assertUnauthorized(await bob.command({ find: coll, filter: { _id: 'uncommitted' }, ...txn, $db: DB }), /^not authorized on /);
    assertUnauthorized(await bob.command({ insert: coll, documents: [{ _id: 'bob' }], ...txn, $db: DB }));
    assertUnauthorized(await bob.command({ find: coll, filter: { _id: 'uncommitted' }, lsid, $db: DB }));
    assertUnauthorized(await bob.command({ insert: coll, documents: [{ _id: 'bob2' }], lsid, txnNumber: Long.fromNumber(7), $db: DB }));
    assertUnauthorized(await bob.command({ abortTransaction: 1, ...txn, $db: 'admin' }));
    assertUnauthorized(await bob.command({ commitTransaction: 1, ...txn, $db: 'admin' }));
    assertUnauthorized(await bob.command({ killSessions: [lsid], $db: 'admin' }));
    assertUnauthorized(await bob.command({ endSessions: [lsid], $db: 'admin' }));
    for (const cmd of [{ killAllSessions: [] }, { killAllSessionsByPattern: [] }, { killSessions: [] }]) {
      assertUnauthorized(await bob.command({ ...cmd, $db: 'admin' }));
    }
    // Operations: none is any proxy user's, and the listings that would show alice's are refused.
    assertUnauthorized(await bob.command({ killOp: 1, op: 1, $db: 'admin' }), /^Unauthorized$/);
    assertUnauthorized(await bob.command({ aggregate: 1, pipeline: [{ $currentOp: { allUsers: true } }], cursor: {}, $db: 'admin' }));
    assertUnauthorized(await bob.command({ aggregate: 1, pipeline: [{ $currentOp: {} }], cursor: {}, $db: 'admin' }));
    assertUnauthorized(await bob.command({ aggregate: 1, pipeline: [{ $listLocalSessions: { allUsers: true } }], cursor: {}, $db: 'admin' }));
    assertUnauthorized(await bob.command({ currentOp: 1, $db: 'admin' }));
    assertUnauthorized(await bob.command({ find: 'system.sessions', $db: 'config' }));
    assertUnauthorized(await bob.command({ aggregate: 'x', pipeline: [{ $unionWith: 'transactions' }], cursor: {}, $db: 'config' }));
    assertUnauthorized(await bob.command({ refreshSessions: [lsid], $db: 'admin' }));

    // Bob's own session works, and stays his: alice may not use it either.
    const bobs = newLsid();
    assert.equal((await bob.command({ find: coll, filter: { _id: 0 }, lsid: bobs, $db: DB })).ok, 1);
    assertUnauthorized(await alice.command({ find: coll, lsid: bobs, $db: DB }));

    // Alice's cursor is intact (bob's getMore read nothing of it), and her transaction commits.
    const more = await alice.command({ getMore: cursor, collection: coll, batchSize: 2, $db: DB });
    assert.equal(more.ok, 1, JSON.stringify(more));
    assert.deepEqual(more.cursor.nextBatch, [{ _id: 2 }, { _id: 3 }]);
    const commit = await aliceTxn.command({ commitTransaction: 1, ...txn, $db: 'admin' });
    assert.equal(commit.ok, 1, JSON.stringify(commit));
    const after = await alice.command({ find: coll, filter: { _id: { $in: ['uncommitted', 'bob', 'bob2'] } }, $db: DB });
    assert.deepEqual(after.cursor.firstBatch, [{ _id: 'uncommitted' }]);
    // Her own kills are hers to make.
    assert.equal((await alice.command({ killCursors: coll, cursors: [cursor], $db: DB })).ok, 1);
    assert.equal((await alice.command({ endSessions: [lsid], $db: 'admin' })).ok, 1);
    assert.ok(proxy.logLines('getMore refused: cursor id').length >= 1, 'a refusal is logged');
  } finally {
    for (const c of [alice, aliceTxn, bob]) c.destroy();
  }
});

test('before a login, a request the pool cannot peek at is refused without a pooled connection', { skip }, async () => {
  // One pooled connection, pinned by alice's open transaction: a request that took the pool
  // would wait for it (pool_wait_timeout_ms) instead of being answered at once.
  const proxy = await startPooled({ pool_size: 1, threads: 1, pool_wait_timeout_ms: 20000 });
  const alice = await connect(proxy, 'alice');
  const txn = { lsid: newLsid(), txnNumber: Long.fromNumber(1), autocommit: false };
  try {
    assert.equal((await alice.command({ insert: 'pin', documents: [{ _id: 1 }], ...txn, startTransaction: true, $db: DB })).ok, 1);
    const waits = await metric(proxy, 'relaybus_pool_waits_total');
    const stranger = await connect(proxy, null, { compression: ['zlib'] });
    try {
      // Over the peek's 64 KiB.
      const big = { find: 'x', filter: { pad: 'p'.repeat(70 * 1024) }, $db: DB };
      assertUnauthorized(await stranger.command(big, { timeoutMs: 3000 }), /requires authentication/);
      // Compressed (zlib, negotiated in the hello).
      assertUnauthorized(await stranger.command({ find: 'x', $db: DB }, { compress: 'zlib', timeoutMs: 3000 }), /requires authentication/);
      // The body after a document sequence.
      const seqFirst = H.opMsg(null, {
        sections: [{ kind: 1, identifier: 'documents', docs: [{ _id: 1 }] }, { kind: 0, doc: { insert: 'x', $db: DB } }],
      });
      await stranger.write(seqFirst.buf);
      const reply = await stranger.next({ timeoutMs: 3000 });
      assert.equal(reply.responseTo, seqFirst.requestID);
      assertUnauthorized(reply.doc, /requires authentication/);
      assert.equal(await metric(proxy, 'relaybus_pool_waits_total'), waits, 'no request before the login waited for the pool');
    } finally {
      stranger.destroy();
    }
    assert.equal((await alice.command({ commitTransaction: 1, ...txn, $db: 'admin' })).ok, 1);
  } finally {
    alice.destroy();
  }
});

test('a client that says hello and never logs in is closed after login_timeout_ms, counted', { skip }, async () => {
  const proxy = await startPooled({ pool_size: 2, login_timeout_ms: 300 });
  const series = 'relaybus_client_connections_closed_total{reason="login_timeout"}';
  const alice = await connect(proxy, 'alice');
  try {
    const idle = await connect(proxy, null);
    await idle.waitClosed(5000);
    assert.equal(await metric(proxy, series), 1);
    assert.equal(proxy.logLines('closing (login_timeout)').length, 1, proxy.log());
    // Alice, connected before it and logged in, is not closed.
    assert.equal((await alice.command({ ping: 1, $db: 'admin' })).ok, 1);
  } finally {
    alice.destroy();
  }
});

test("one user's open transactions pin at most pool_max_pins_per_user connections", { skip }, async () => {
  const proxy = await startPooled({ pool_size: 4, pool_max_pins_per_user: 2 });
  // A transaction pins the connection of the client connection that runs it: bob runs his on
  // three client connections, as a driver's pool would.
  const bob = [await connect(proxy, 'bob'), await connect(proxy, 'bob'), await connect(proxy, 'bob')];
  const alice = await connect(proxy, 'alice');
  // Each in a collection of its own: the double's write conflicts are per collection.
  let n = 0;
  const start = (conn, txn) =>
    conn.command({ insert: `pins${++n}`, documents: [{ _id: n }], ...txn, startTransaction: true, $db: DB });
  const commit = (conn, txn) => conn.command({ commitTransaction: 1, ...txn, $db: 'admin' });
  const txnOf = () => ({ lsid: newLsid(), txnNumber: Long.fromNumber(1), autocommit: false });
  try {
    const bobs = [txnOf(), txnOf(), txnOf()];
    assert.equal((await start(bob[0], bobs[0])).ok, 1);
    const second = await start(bob[1], bobs[1]);
    assert.equal(second.ok, 1, JSON.stringify(second));
    const third = await start(bob[2], bobs[2]);
    assert.equal(third.ok, 0, JSON.stringify(third));
    assert.equal(third.code, 262);
    assert.equal(third.codeName, 'ExceededTimeLimit');
    assert.deepEqual(third.errorLabels, ['TransientTransactionError']);
    assert.match(third.errmsg, /pool_max_pins_per_user/);
    // Only a start is refused: a statement of one of bob's open transactions, sent on his third
    // connection (a driver picks any of its pool's), goes on.
    const statement = await bob[2].command({ find: 'pins1', ...bobs[0], $db: DB });
    assert.equal(statement.ok, 1, JSON.stringify(statement));
    // Alice is not held back by bob's pins.
    const hers = txnOf();
    assert.equal((await start(alice, hers)).ok, 1);
    assert.equal((await commit(alice, hers)).ok, 1);
    // Once one of bob's ends, his third may start.
    assert.equal((await commit(bob[0], bobs[0])).ok, 1);
    const again = { ...bobs[2], txnNumber: Long.fromNumber(2) };
    assert.equal((await start(bob[2], again)).ok, 1);
    assert.equal((await commit(bob[1], bobs[1])).ok, 1);
    assert.equal((await commit(bob[2], again)).ok, 1);
  } finally {
    for (const c of [...bob, alice]) c.destroy();
  }
});

test('a transaction whose commit is answered pins nothing: the next start, on any loop, is never refused for it', { skip, timeout: 120000 }, async () => {
  // Four loops, and bob's connections on three of them (the loops take accepted connections in
  // turn).  With one pin allowed, each round's start may only succeed once the transaction
  // before it has let go of every pin it held: the one of the loop that relayed its commit, and
  // that of another loop that ran one of its statements.
  const proxy = await startPooled({ pool_size: 4, threads: 4, pool_max_pins_per_user: 1 });
  const bob = [await connect(proxy, 'bob'), await connect(proxy, 'bob'), await connect(proxy, 'bob')];
  let n = 0;
  let round = 0;
  const txnOf = () => ({ lsid: newLsid(), txnNumber: Long.fromNumber(1), autocommit: false });
  const ok = (what, reply) => assert.equal(reply.ok, 1, `round ${round}: ${what}: ${JSON.stringify(reply)}`);
  const start = (conn, txn) => conn.command({ insert: 'pinrace', documents: [{ _id: ++n }], ...txn, startTransaction: true, $db: DB });
  const commit = (conn, txn) => conn.command({ commitTransaction: 1, ...txn, $db: 'admin' });
  try {
    for (; round < 150; round++) {
      // Commit on one loop, start on the next.
      const a = txnOf(), b = txnOf();
      ok('start', await start(bob[0], a));
      ok('commit', await commit(bob[0], a));
      ok('start after a commit on another loop', await start(bob[1], b));
      ok('commit', await commit(bob[1], b));
      // A transaction pinned on two loops (a statement of it on the second), committed on the
      // first: a start on the third.
      const c = txnOf(), d = txnOf();
      ok('start', await start(bob[0], c));
      ok('statement on another loop', await bob[1].command({ find: 'pinrace', filter: { _id: n }, ...c, $db: DB }));
      ok('commit', await commit(bob[0], c));
      ok('start after a commit of a transaction two loops pinned', await start(bob[2], d));
      ok('commit', await commit(bob[2], d));
    }
  } finally {
    for (const c of bob) c.destroy();
  }
});

test('statements shaped like a transaction pin no more than pool_max_pins_per_user, whatever the command: bob is answered at once', { skip }, async () => {
  const proxy = await startPooled({ pool_size: 4, pool_max_pins_per_user: 1, pool_wait_timeout_ms: 10000 });
  // Four connections of alice, each sending a statement with lsid + txnNumber + autocommit: false
  // and no startTransaction: the server answers NoSuchTransaction, but each would pin the
  // connection it ran on for 60 s.  Only the first may; the others are refused without one.
  const alice = await Promise.all([1, 2, 3, 4].map(() => connect(proxy, 'alice')));
  const bob = await connect(proxy, 'bob');
  try {
    const shaped = (cmd) => ({ ...cmd, lsid: newLsid(), txnNumber: Long.fromNumber(7), autocommit: false, $db: DB });
    const replies = await Promise.all([
      alice[0].command(shaped({ find: 'pinme', filter: {} })),
      alice[1].command(shaped({ count: 'pinme' })),
      alice[2].command(shaped({ insert: 'pinme', documents: [{ x: 1 }] })),
      alice[3].command(shaped({ aggregate: 'pinme', pipeline: [], cursor: {} })),
    ]);
    const refused = replies.filter((r) => r.code === 262);
    assert.equal(refused.length, 3, JSON.stringify(replies));
    for (const r of refused) {
      assert.equal(r.codeName, 'ExceededTimeLimit');
      assert.match(r.errmsg, /pool_max_pins_per_user/);
      assert.deepEqual(r.errorLabels, ['TransientTransactionError']);
    }
    // Every connection alice does not pin is free for bob.
    const t0 = Date.now();
    const found = await bob.command({ find: 'pinme', filter: {}, $db: DB });
    const ms = Date.now() - t0;
    assert.equal(found.ok, 1, JSON.stringify(found));
    assert.ok(ms < 1000, `bob's find answered in ${ms} ms`);
    // Alice's refused statements, sent again, are refused again; the one that pins holds.
    const again = await alice[1].command(shaped({ distinct: 'pinme', key: 'x' }));
    assert.equal(again.code, 262, JSON.stringify(again));
    assert.equal(await metric(proxy, 'relaybus_pool_pinned_connections{reason="transaction"}'), 1);
  } finally {
    for (const c of [...alice, bob]) c.destroy();
  }
});

test("one user's fresh sessions stop at pool_max_sessions_per_user: the table keeps room for the others", { skip }, async () => {
  const proxy = await startPooled({ pool_size: 2, pool_max_sessions_per_user: 20 });
  const alice = await connect(proxy, 'alice');
  const bob = await connect(proxy, 'bob');
  try {
    const ping = (c, lsid) => c.command({ ping: 1, lsid, $db: 'admin' });
    const hers = [];
    for (let i = 0; i < 20; i++) {
      hers.push(newLsid());
      assert.equal((await ping(alice, hers[i])).ok, 1, `session ${i + 1}`);
    }
    const over = await ping(alice, newLsid());
    assert.equal(over.ok, 0, JSON.stringify(over));
    assert.equal(over.code, 261);
    assert.equal(over.codeName, 'TooManyLogicalSessions');
    assert.match(over.errmsg, /pool_max_sessions_per_user = 20/);
    // Her sessions in use go on; bob's new session is taken.
    assert.equal((await ping(alice, hers[0])).ok, 1);
    assert.equal((await ping(bob, newLsid())).ok, 1);
    // An ended session makes room for a new one.
    assert.equal((await alice.command({ endSessions: [hers[1]], $db: 'admin' })).ok, 1);
    assert.equal((await ping(alice, newLsid())).ok, 1);
  } finally {
    alice.destroy();
    bob.destroy();
  }
});

H.registerFinalChecks(test, [() => upstream && upstream.stop()]);
