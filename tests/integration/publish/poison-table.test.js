'use strict';
// The table of poisoned transactions cannot be flushed. A client that sends an annotated statement
// and drops the connection before it completes poisons its own throwaway transaction; thousands of such connections used to
// push a real poisoned transaction out of the table (the oldest was evicted), after which its
// commit was forwarded and the business write committed without its events. Now a live record is
// never evicted: each annotated statement reserves its record before it runs, and while every
// record is taken new annotated work gets a transient error (code 365 TemporarilyUnavailable,
// TransientTransactionError, "relaybus: ...") until records expire, counted in /metrics.
//   - with [outbox] max_poisoned_transactions = 2: two poisonings fill the table, the next
//     annotated insert and relaybusPublish are refused with 365, plain writes still work, the
//     first poisoned transaction's commit is still refused (251), /metrics counts it all;
//   - with the default (4,096): the real poisoned transaction survives 4,096 throwaway poisonings,
//     and its commit is refused.

const test = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const http = require('node:http');
const { Binary, Long } = require('bson');
const P = require('./lib');

const H = P.H;
const DB = H.uniqueDbName('pubptab');
const FULL = /^relaybus: too many poisoned transactions are remembered \(max_poisoned_transactions = \d+\); annotated writes are refused until some expire/;
let upstream;
let direct;

test.before(async () => {
  upstream = await H.startUpstream();
  const { MongoClient } = require('mongodb');
  direct = new MongoClient(upstream.directUri, { serverSelectionTimeoutMS: 10000 });
  await direct.connect();
  await P.ensureOutbox(direct);
  // Created up front: a collection created implicitly inside one of the test's open transactions
  // would hold up every other writer until that transaction ends.
  await direct.db(DB).createCollection('orders');
});

test.after(async () => {
  if (direct) await direct.close().catch(() => {});
});

function newSession() {
  const bytes = crypto.randomBytes(16);
  return { lsid: { id: new Binary(bytes, 4) }, hex: bytes.toString('hex') };
}

/** An annotated insert in transaction 1 of `sess`; `starts`: its first statement. */
function annotatedInsert(sess, id, starts = true) {
  return {
    insert: 'orders',
    documents: [{ _id: id }],
    lsid: sess.lsid,
    txnNumber: Long.fromNumber(1),
    ...(starts ? { startTransaction: true } : {}),
    autocommit: false,
    comment: { relaybus: { type: 'order.placed.v1', id: `ev-${id}` } },
    $db: DB,
  };
}

async function helloConn(proxy) {
  const c = await H.WireConn.connect({ port: proxy.port });
  assert.equal((await c.command({ hello: 1, $db: 'admin' })).ok, 1);
  return c;
}

/**
 * Sends an annotated insert with a ping pipelined right behind it, in one write: the proxy closes
 * a connection that pipelines behind a publish in progress, so the publish is cut and its
 * transaction poisoned, every time. True when the proxy closed the connection (poisoned); false
 * when it answered (the publish was refused before it started).
 */
async function throwaway(proxy, sess, id, conn = null) {
  const c = conn || (await helloConn(proxy));
  try {
    await c.write(Buffer.concat([H.opMsg(annotatedInsert(sess, id, !conn)).buf, H.opMsg({ ping: 1, $db: 'admin' }).buf]));
    return await c.next({ timeoutMs: 10000 }).then(
      () => false,
      () => true,
    );
  } finally {
    c.destroy();
  }
}

async function metrics(proxy) {
  const m = /admin: listening on 127\.0\.0\.1:(\d+)/.exec(proxy.log());
  assert.ok(m, 'the admin port is logged');
  const body = await new Promise((resolve, reject) => {
    http
      .get({ host: '127.0.0.1', port: Number(m[1]), path: '/metrics' }, (res) => {
        let b = '';
        res.setEncoding('utf8');
        res.on('data', (d) => (b += d));
        res.on('end', () => resolve(b));
      })
      .on('error', reject);
  });
  return (name) => {
    const line = body.split('\n').find((l) => l.startsWith(`${name} `));
    return line ? Number(line.split(' ')[1]) : null;
  };
}

/**
 * A real transaction that the proxy poisons: a first statement the server runs (so a commit
 * would make it visible), then an annotated statement cut as in throwaway().
 */
async function poisonReal(proxy, sess, pre, id) {
  const c = await helloConn(proxy);
  const r = await c.command({
    insert: 'orders',
    documents: [{ _id: pre }],
    lsid: sess.lsid,
    txnNumber: Long.fromNumber(1),
    startTransaction: true,
    autocommit: false,
    $db: DB,
  });
  assert.equal(r.ok, 1, JSON.stringify(r));
  assert.equal(await throwaway(proxy, sess, id, c), true, 'the connection is closed');
  assert.ok(await proxy.waitForLog(new RegExp(`transaction 1 poisoned: .*\\(session ${sess.hex}\\)`), { timeoutMs: 5000 }), 'poisoned');
}

/** Waits until `name` in /metrics reaches `want`. */
async function waitMetric(proxy, name, want, timeoutMs = 20000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = (await metrics(proxy))(name);
    if (v !== null && v >= want) return v;
    if (Date.now() > deadline) assert.fail(`${name} is ${v}, expected at least ${want}`);
    await H.sleep(50);
  }
}

/** commitTransaction of `sess`'s transaction 1 on a new connection through `proxy`. */
async function commit(proxy, sess) {
  const c = await helloConn(proxy);
  try {
    return await c.command({ commitTransaction: 1, lsid: sess.lsid, txnNumber: Long.fromNumber(1), autocommit: false, $db: 'admin' });
  } finally {
    c.destroy();
  }
}

test('a full table keeps its records and refuses new annotated work with a transient error', { skip: H.rawDataSkipReason() }, async () => {
  const proxy = await H.startProxy({
    upstream: upstream.uri,
    extraIni: `${P.handlersIni(P.HANDLERS)}\n[outbox]\nmax_poisoned_transactions = 2\n\n[admin]\nlisten = 127.0.0.1:0\n`,
  });
  try {
    const real = newSession();
    await poisonReal(proxy, real, 'real-pre', 'real-1');
    assert.equal(await throwaway(proxy, newSession(), 'junk-1'), true);
    await waitMetric(proxy, 'relaybus_poisoned_transactions', 2);

    // Full: an annotated insert and a relaybusPublish are refused, transiently, and not forwarded.
    const c = await helloConn(proxy);
    try {
      const sess = newSession();
      const r = await c.command(annotatedInsert(sess, 'refused-1'));
      assert.equal(r.ok, 0);
      assert.equal(r.code, 365, JSON.stringify(r));
      assert.equal(r.codeName, 'TemporarilyUnavailable');
      assert.deepEqual(r.errorLabels, ['TransientTransactionError']);
      assert.match(r.errmsg, FULL);
      const pub = await c.command({
        relaybusPublish: 1,
        events: [{ type: 'user.created.v1', id: 'ev-refused-2' }],
        lsid: newSession().lsid,
        txnNumber: Long.fromNumber(1),
        startTransaction: true,
        autocommit: false,
        $db: DB,
      });
      assert.equal(pub.code, 365, JSON.stringify(pub));
      assert.deepEqual(pub.errorLabels, ['TransientTransactionError']);
      // Work without an annotation is not affected.
      const plain = await c.command({ insert: 'orders', documents: [{ _id: 'plain-1' }], $db: DB });
      assert.equal(plain.ok, 1);
      assert.equal(plain.n, 1);
    } finally {
      c.destroy();
    }
    assert.equal(await direct.db(DB).collection('orders').findOne({ _id: 'refused-1' }), null, 'the refused statement never ran');
    assert.equal(await direct.db(P.OUTBOX_DB).collection(`${P.PREFIX}events`).findOne({ _id: 'ev-refused-2' }), null);

    // The first poisoned transaction is still remembered: its commit is refused.
    const r = await commit(proxy, real);
    assert.equal(r.ok, 0, JSON.stringify(r));
    assert.equal(r.code, 251);
    assert.equal(await direct.db(DB).collection('orders').findOne({ _id: 'real-pre' }), null);
    assert.equal(await direct.db(DB).collection('orders').findOne({ _id: 'real-1' }), null);

    const v = await metrics(proxy);
    assert.equal(v('relaybus_poisoned_table_full_refusals_total'), 2);
    assert.equal(v('relaybus_poisoned_transactions'), 2);
    assert.equal(v('relaybus_poisoned_transactions_total'), 2);
    assert.ok(await proxy.waitForLog(/c\d+ .*: refused an annotated write: 2 poisoned transactions are remembered/));
  } finally {
    await proxy.stop();
  }
});

test('4,096 throwaway poisonings do not push out a real poisoned transaction: its commit is still refused', { skip: H.rawDataSkipReason() }, async () => {
  const N = 4096;
  const proxy = await H.startProxy({
    upstream: upstream.uri,
    extraIni: `${P.handlersIni(P.HANDLERS)}\n[admin]\nlisten = 127.0.0.1:0\n`,
  });
  try {
    const real = newSession();
    await poisonReal(proxy, real, 'flood-pre', 'flood-real');
    // The flood: 64 connections at a time, each an annotated insert closed at once.
    for (let i = 0; i < N; i += 64) {
      const batch = [];
      for (let j = i; j < Math.min(N, i + 64); j++) batch.push(throwaway(proxy, newSession(), `flood-${j}`));
      await Promise.all(batch);
    }
    await waitMetric(proxy, 'relaybus_annotated_statements_total', N + 1, 60000);
    // Every throwaway has been seen; let the last closes be processed.
    await waitMetric(proxy, 'relaybus_poisoned_transactions', N, 10000);
    await H.sleep(200);
    const r = await commit(proxy, real);
    assert.equal(r.ok, 0, `the real poisoned transaction's commit must be refused, got ${JSON.stringify(r)}`);
    assert.equal(r.code, 251);
    assert.equal(await direct.db(DB).collection('orders').findOne({ _id: 'flood-pre' }), null, 'the business write was not committed');
    assert.equal(await direct.db(DB).collection('orders').findOne({ _id: 'flood-real' }), null);
  } finally {
    await proxy.stop();
  }
});

H.registerFinalChecks(test, [() => upstream && upstream.stop()]);
