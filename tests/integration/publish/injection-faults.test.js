'use strict';
// One fault at a time, deterministically, in each round of an injection (fault.test.js mixes
// them at random): what the client sees, and that the retried transaction stores the event
// exactly once.
//   - a write conflict on an outbox write reaches the client as WriteConflict 112 with
//     TransientTransactionError, in place of the statement's reply; withTransaction retries;
//   - a duplicate-key write error on the deliveries insert becomes a top-level error naming the
//     outbox write; the proxy aborts the transaction so a manual commit cannot keep the
//     business write;
//   - the upstream connection cut during an outbox write closes the client connection;
//     withTransaction retries on a new connection.

const test = require('node:test');
const assert = require('node:assert/strict');
const P = require('./lib');

const H = P.H;
const DB = H.uniqueDbName('pubinj');
const APP = `rbit-pubinj-${process.pid}`;
let s;
const events = [];

test.before(async () => {
  s = await P.startStack({ requireDouble: true, appName: APP, clientOptions: { monitorCommands: true } });
  for (const ev of ['commandStarted', 'commandSucceeded', 'commandFailed']) {
    s.client.on(ev, (e) => events.push({ ev, name: e.commandName, failure: e.failure }));
  }
});

async function failPoint(mode, data) {
  await s.direct.db('admin').command({ configureFailPoint: 'failCommand', mode, data: { appName: APP, ...data } });
}
async function failPointOff() {
  await s.direct.db('admin').command({ configureFailPoint: 'failCommand', mode: 'off' });
}

/** One transaction whose business write (an insert, or with `byUpdate` an upsert) publishes. */
async function publishOnce(id, key, { byUpdate = false } = {}) {
  const session = s.client.startSession();
  let attempts = 0;
  try {
    await session.withTransaction(async () => {
      attempts++;
      const comment = { relaybus: { type: 'order.placed.v1', id: `ev-${id}`, key } };
      const orders = s.client.db(DB).collection('orders');
      if (byUpdate) await orders.updateOne({ _id: id }, { $set: { attempt: attempts } }, { session, upsert: true, comment });
      else await orders.insertOne({ _id: id, attempt: attempts }, { session, comment });
    });
  } finally {
    await session.endSession();
  }
  return attempts;
}

for (const [round, cmd, key] of [
  ['the sequence round', 'findAndModify', 'fk-1'],
  ['the write round (events)', 'update', undefined],
  ['the read round', 'find', undefined],
]) {
  test(`a write conflict in ${round} reaches the client with its label; the retry stores one event`, async () => {
    const since = events.length;
    await failPoint({ times: 1 }, { failCommands: [cmd], errorCode: 112, errorLabels: ['TransientTransactionError'] });
    try {
      const attempts = await publishOnce(`wc-${cmd}`, key);
      assert.equal(attempts, 2, 'withTransaction ran the callback again');
    } finally {
      await failPointOff();
    }
    const failed = events.slice(since).filter((e) => e.ev === 'commandFailed' && e.name === 'insert');
    assert.equal(failed.length, 1, 'the annotated insert failed once, in place of its reply');
    assert.equal(failed[0].failure.code, 112);
    assert.ok(failed[0].failure.errorLabels.includes('TransientTransactionError'));
    const ev = await P.checkEvent(s.outbox, `ev-wc-${cmd}`, { type: 'order.placed.v1', key, sequence: key ? 1 : undefined, handlers: ['orders', 'confirmations'] });
    assert.equal((await s.direct.db(DB).collection('orders').findOne({ _id: `wc-${cmd}` })).attempt, 2);
    assert.ok(ev);
  });
}

test('a write error on the deliveries insert: named error, the transaction is aborted', async () => {
  // Plant the delivery the proxy is about to insert: (eventId, handler) is unique.
  await s.outbox.deliveries.insertOne({ eventId: 'ev-dk', handler: 'orders', planted: true });
  const session = s.client.startSession();
  try {
    session.startTransaction();
    const err = await P.expectCode(
      s.client.db(DB).collection('orders').insertOne({ _id: 'dk' }, { session, comment: { relaybus: { type: 'order.placed.v1', id: 'ev-dk' } } }),
      11000,
      /^relaybus: insert on relaybus_deliveries failed: /,
    );
    assert.equal(err.codeName, 'DuplicateKey');
    // Even a client that ignores the error cannot commit the order without its event.
    await assert.rejects(session.commitTransaction(), (e) => e.code === 251);
  } finally {
    await session.endSession();
  }
  assert.equal(await s.direct.db(DB).collection('orders').findOne({ _id: 'dk' }), null);
  assert.equal(await s.outbox.events.findOne({ _id: 'ev-dk' }), null);
  await s.outbox.deliveries.deleteOne({ planted: true });
});

for (const cmd of ['findAndModify', 'update', 'insert']) {
  test(`the upstream cut during an outbox ${cmd}: the client connection closes, the retry stores one event`, async () => {
    // The first command of that name after the business write must be the outbox write: the
    // business write is an insert, except when the cut targets `insert` (the deliveries), where
    // it is an upsert.
    await failPoint({ times: 1 }, { failCommands: [cmd], closeConnection: true });
    try {
      const attempts = await publishOnce(`cut-${cmd}`, 'cut-key', { byUpdate: cmd === 'insert' });
      assert.ok(attempts >= 2, 'withTransaction retried after the network error');
    } finally {
      await failPointOff();
    }
    assert.ok(await s.proxy.waitForLog(/closing \(upstream_eof\)|connection lost in the middle of an outbox write/));
    await P.checkEvent(s.outbox, `ev-cut-${cmd}`, { type: 'order.placed.v1', key: 'cut-key', handlers: ['orders', 'confirmations'] });
  });
}

test("a member's not-primary error on a publishing statement or an injected commit reaches the client without its topologyVersion", async () => {
  // The proxy answers these from the server's reply (the statement's, the commit's), not by
  // relaying the bytes; like a relayed error they must not show the member's topologyVersion,
  // which a driver would take as the proxy's: it would ask the proxy for a streaming hello the
  // mongos persona does not serve, and its monitor would fail ("Server ended moreToCome
  // unexpectedly") and clear its pool.
  const failures = (since, name) => events.slice(since).filter((e) => e.ev === 'commandFailed' && e.name === name).map((e) => e.failure);
  const orders = s.client.db(DB).collection('orders');

  // The statement: the annotated insert itself fails.
  await failPoint({ times: 1 }, { failCommands: ['insert'], errorCode: 10107 });
  const session = s.client.startSession();
  try {
    session.startTransaction();
    const err = await orders.insertOne({ _id: 'np-stmt' }, { session, comment: { relaybus: { type: 'order.placed.v1', id: 'ev-np-stmt' } } }).then(() => null, (e) => e);
    assert.ok(err, 'the statement failed');
    assert.equal(err.code, 10107);
    assert.equal(err.errorResponse.topologyVersion, undefined, 'no topologyVersion through the proxy');
    await session.abortTransaction();
  } finally {
    await failPointOff();
    await session.endSession();
  }
  assert.equal(await s.outbox.events.findOne({ _id: 'ev-np-stmt' }), null);

  // The commit of a transaction the proxy injected into: the driver retries it once (the
  // failure is in its command events), and the retry commits the event.
  const since = events.length;
  await failPoint({ times: 1 }, { failCommands: ['commitTransaction'], errorCode: 10107 });
  try {
    await publishOnce('np-commit', undefined);
  } finally {
    await failPointOff();
  }
  const commits = failures(since, 'commitTransaction');
  assert.equal(commits.length, 1, 'the first commit failed');
  assert.equal(commits[0].code, 10107);
  assert.equal(commits[0].errorResponse.topologyVersion, undefined, 'no topologyVersion through the proxy');
  await P.checkEvent(s.outbox, 'ev-np-commit', { type: 'order.placed.v1', handlers: ['orders', 'confirmations'] });
  // The client goes on through the proxy at once.
  await orders.insertOne({ _id: 'np-after' });
});

test('sequences of the cut and retried transactions are gapless', async () => {
  const seqs = (await s.outbox.events.find({ key: 'cut-key' }).toArray()).map((e) => Number(e.sequence)).sort((a, b) => a - b);
  assert.deepEqual(seqs, [1, 2, 3]);
  assert.equal(Number((await s.outbox.keys.findOne({ _id: 'cut-key' })).value), 3);
});

H.registerFinalChecks(test, [() => s && s.upstream.stop()], { beforeStop: () => s && s.closeClients() });
