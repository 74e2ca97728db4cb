'use strict';
// A commit the proxy must refuse. When the upstream connection is lost after an annotated
// statement (or a relaybusPublish) was sent but before all its outbox writes were acknowledged,
// the server's transaction may hold the business write without its events. The client connection
// is closed; an application that catches that network error and commits anyway sends
// commitTransaction on another pooled connection, through the same proxy process. The proxy
// remembers the transaction as poisoned and answers that commit with NoSuchTransaction 251 and
// TransientTransactionError after aborting the transaction itself:
//   - a manual transaction (startTransaction/commitTransaction): the commit fails with 251, the
//     server's transaction is aborted (a direct commit of the same lsid/txnNumber is refused),
//     nothing of it exists, no event;
//   - the same with relaybusPublish;
//   - an outbox write that fails while the proxy's own abortTransaction fails too (failCommand
//     errors leave the server's transaction open, as a real primary's do): the commit is refused;
//   - withTransaction whose callback swallows the network error: the refused commit makes it run
//     the callback again, and the retry commits once with exactly one event;
//   - /metrics counts the poisonings and refusals.

const test = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const { Long } = require('bson');
const P = require('./lib');

const H = P.H;
const DB = H.uniqueDbName('pubpoison');
const APP = `rbit-pubpoison-${process.pid}`;
const REFUSED = /^relaybus: transaction \d+ was aborted because the proxy could not write its events \(.+\)$/;
let s;

test.before(async () => {
  s = await P.startStack({
    requireDouble: true,
    appName: APP,
    extraIni: '[admin]\nlisten = 127.0.0.1:0\n',
  });
});

async function failPoint(mode, data) {
  await s.direct.db('admin').command({ configureFailPoint: 'failCommand', mode, data: { appName: APP, ...data } });
}
async function failPointOff() {
  await s.direct.db('admin').command({ configureFailPoint: 'failCommand', mode: 'off' });
}

function orders() {
  return s.client.db(DB).collection('orders');
}

/** The first `update` after the statement is the events upsert of the write round: cut there. */
async function cutEventsWrite() {
  await failPoint({ times: 1 }, { failCommands: ['update'], closeConnection: true });
}

/** Expects a network error (the proxy closed the client connection). */
async function expectNetworkError(promise) {
  let err = null;
  try {
    await promise;
  } catch (e) {
    err = e;
  }
  assert.ok(err, 'the statement failed');
  assert.match(err.name, /MongoNetworkError|MongoNetworkTimeoutError/, `a network error, not: ${err.stack}`);
}

async function expectRefusedCommit(session) {
  const err = await P.expectCode(session.commitTransaction(), 251, REFUSED);
  assert.equal(err.codeName, 'NoSuchTransaction');
  assert.ok(err.hasErrorLabel('TransientTransactionError'), `labels: ${JSON.stringify(err.errorLabels)}`);
  return err;
}

/** Sends commitTransaction for the session's last transaction straight to the server. */
async function directCommit(session) {
  const conn = await H.WireConn.connect({ port: s.upstream.port, timeoutMs: 3000 });
  try {
    return await conn.command({
      commitTransaction: 1,
      lsid: session.id,
      txnNumber: Long.fromNumber(session.serverSession.txnNumber),
      autocommit: false,
      $db: 'admin',
    });
  } finally {
    conn.destroy();
  }
}

async function nothingOf(ids, eventIds) {
  for (const id of ids) assert.equal(await s.direct.db(DB).collection('orders').findOne({ _id: id }), null, `no ${id}`);
  for (const ev of eventIds) {
    assert.equal(await s.outbox.events.findOne({ _id: ev }), null, `no event ${ev}`);
    assert.equal(await s.outbox.deliveries.countDocuments({ eventId: ev }), 0, `no delivery of ${ev}`);
  }
}

test('manual transaction: the upstream is cut during the outbox writes, a commit anyway fails with 251 and commits nothing', async () => {
  const session = s.client.startSession();
  try {
    session.startTransaction();
    await orders().insertOne({ _id: 'man-pre', note: 'an earlier statement of the transaction' }, { session });
    await cutEventsWrite();
    try {
      await expectNetworkError(
        orders().insertOne({ _id: 'man-1' }, { session, comment: { relaybus: { type: 'order.placed.v1', id: 'ev-man-1' } } }),
      );
    } finally {
      await failPointOff();
    }
    // The application ignores the error and commits: the driver sends the commit on another
    // connection through the same proxy.
    await expectRefusedCommit(session);
    // The proxy aborted the server's transaction: it cannot be committed by anyone now.
    const direct = await directCommit(session);
    assert.equal(direct.ok, 0, `a direct commit after the refusal: ${JSON.stringify(direct)}`);
    assert.equal(direct.code, 251);
  } finally {
    await session.endSession();
  }
  await nothingOf(['man-pre', 'man-1'], ['ev-man-1']);
  const poisoned = await s.proxy.waitForLog(/^.*c\d+ .*: transaction \d+ poisoned: .*connection/);
  assert.ok(poisoned, 'the poisoning is logged with the connection id');
  const refused = await s.proxy.waitForLog(/c\d+ .*: refused commitTransaction of poisoned transaction \d+/);
  assert.ok(refused, 'the refused commit is logged with the connection id');
});

test('manual transaction: the same for relaybusPublish', async () => {
  const session = s.client.startSession();
  try {
    session.startTransaction();
    await orders().insertOne({ _id: 'pub-pre' }, { session });
    await cutEventsWrite();
    try {
      await expectNetworkError(
        s.client.db(DB).command({ relaybusPublish: 1, events: [{ type: 'user.created.v1', id: 'ev-pub-1' }] }, { session }),
      );
    } finally {
      await failPointOff();
    }
    await expectRefusedCommit(session);
  } finally {
    await session.endSession();
  }
  await nothingOf(['pub-pre'], ['ev-pub-1']);
});

test('an outbox write fails and so does the abort the proxy sends after it: the commit is still refused', async () => {
  const session = s.client.startSession();
  try {
    session.startTransaction();
    await orders().insertOne({ _id: 'ab-pre' }, { session });
    // The events upsert fails, then the proxy's abortTransaction: the server's transaction stays
    // open with both inserts, and only the proxy knows it must not commit.
    // (times: 2 switches itself off after those two.)
    await failPoint({ times: 2 }, { failCommands: ['update', 'abortTransaction'], errorCode: 8 });
    try {
      await P.expectCode(
        orders().insertOne({ _id: 'ab-1' }, { session, comment: { relaybus: { type: 'order.placed.v1', id: 'ev-ab-1' } } }),
        8,
      );
      const err = await expectRefusedCommit(session);
      assert.match(err.message, /an outbox write failed in the write round/);
    } finally {
      await failPointOff();
    }
    assert.ok(await s.proxy.waitForLog(/abortTransaction after a failed outbox write failed \(8\).*stays poisoned/));
    const direct = await directCommit(session);
    assert.equal(direct.code, 251, `a direct commit after the refusal: ${JSON.stringify(direct)}`);
  } finally {
    await session.endSession();
  }
  await nothingOf(['ab-pre', 'ab-1'], ['ev-ab-1']);
});

test('withTransaction whose callback swallows the network error: the refused commit retries it, one event', async () => {
  const session = s.client.startSession();
  const seen = [];
  let attempts = 0;
  try {
    await cutEventsWrite();
    try {
      await session.withTransaction(async () => {
        attempts++;
        try {
          await orders().insertOne(
            { _id: 'wt-1', attempt: attempts },
            { session, comment: { relaybus: { type: 'order.placed.v1', key: 'wt-key', payload: { orderId: 'wt-1' } } } },
          );
        } catch (e) {
          // What the contract must survive: code that catches and carries on to the commit.
          seen.push(e.name);
        }
      });
    } finally {
      await failPointOff();
    }
  } finally {
    await session.endSession();
  }
  assert.equal(seen.length, 1, 'the first attempt saw the network error');
  assert.equal(attempts, 2, 'the refused commit (TransientTransactionError) made withTransaction run the callback again');
  assert.equal((await s.direct.db(DB).collection('orders').findOne({ _id: 'wt-1' })).attempt, 2);
  const evs = await s.outbox.events.find({ 'payload.orderId': 'wt-1' }).toArray();
  assert.equal(evs.length, 1, 'exactly one event');
  await P.checkEvent(s.outbox, evs[0]._id, { type: 'order.placed.v1', key: 'wt-key', sequence: 1, handlers: ['orders', 'confirmations'] });
});

function get(port, path) {
  return new Promise((resolve, reject) => {
    http
      .get({ host: '127.0.0.1', port, path }, (res) => {
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (d) => (body += d));
        res.on('end', () => resolve({ status: res.statusCode, body }));
      })
      .on('error', reject);
  });
}

test('/metrics counts the poisoned transactions and the refused commits', async () => {
  const m = /admin: listening on 127\.0\.0\.1:(\d+)/.exec(s.proxy.log());
  assert.ok(m, 'the admin port is logged');
  const r = await get(Number(m[1]), '/metrics');
  assert.equal(r.status, 200);
  const value = (name) => {
    const line = r.body.split('\n').find((l) => l.startsWith(`${name} `));
    assert.ok(line, `${name} is rendered`);
    return Number(line.split(' ')[1]);
  };
  assert.equal(value('relaybus_poisoned_transactions_total'), 4);
  assert.equal(value('relaybus_poisoned_commits_refused_total'), 4);
  assert.equal(value('relaybus_poisoned_table_full_refusals_total'), 0);
  assert.ok(value('relaybus_poisoned_transactions') >= 0);
});

H.registerFinalChecks(test, [() => s && s.upstream.stop()], { beforeStop: () => s && s.closeClients() });
