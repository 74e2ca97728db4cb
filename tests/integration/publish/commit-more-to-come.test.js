'use strict';
// A fire-and-forget commit keeps its reply semantics. A commitTransaction sent with moreToCome
// (flag bit 1) asks for no reply. When it commits a transaction the proxy injected into, the proxy
// relays it itself, acknowledged, to learn the outcome and wake the dispatcher; the reply it gets
// must be swallowed. A client that then sends a ping (another requestId, same connection) must
// read the ping's answer first, not an answer to the commit it never asked for. The transaction
// is committed: its business write and its event are there, read straight from the server.

const test = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const { Binary, Long } = require('bson');
const P = require('./lib');

const H = P.H;
const DB = H.uniqueDbName('pubmtc');
let s;

test.before(async () => {
  s = await P.startStack({});
});

async function helloConn() {
  const c = await H.WireConn.connect({ port: s.proxy.port });
  assert.equal((await c.command({ hello: 1, $db: 'admin' })).ok, 1);
  return c;
}

test('commitTransaction with moreToCome of an injected transaction gets no reply: the next reply answers the ping', { skip: H.rawDataSkipReason() }, async () => {
  const id = `mtc-${crypto.randomUUID()}`;
  const lsid = { id: new Binary(crypto.randomBytes(16), 4) };
  const txnNumber = Long.fromNumber(1);
  const c = await helloConn();
  try {
    const ins = await c.command({
      insert: 'orders',
      documents: [{ _id: id }],
      lsid,
      txnNumber,
      startTransaction: true,
      autocommit: false,
      comment: { relaybus: { type: 'order.placed.v1', id: `ev-${id}` } },
      $db: DB,
    });
    assert.equal(ins.ok, 1, JSON.stringify(ins));
    assert.equal(ins.n, 1);

    const commit = H.opMsg(
      { commitTransaction: 1, lsid, txnNumber, autocommit: false, writeConcern: { w: 0 }, $db: 'admin' },
      { flags: 2 },
    );
    const ping = H.opMsg({ ping: 1, $db: 'admin' });
    assert.notEqual(commit.requestID, ping.requestID);
    await c.write(commit.buf);
    await c.write(ping.buf);
    const first = await c.next({ timeoutMs: 5000 });
    assert.equal(first.responseTo, ping.requestID, `the first reply answers the ping (id ${ping.requestID}), not the fire-and-forget commit (id ${commit.requestID}): ${JSON.stringify(first.doc)}`);
    assert.equal(first.doc.ok, 1);
    // Nothing else arrives: no late answer to the commit either.
    const pong = H.opMsg({ ping: 1, $db: 'admin' });
    await c.write(pong.buf);
    const second = await c.next({ timeoutMs: 5000 });
    assert.equal(second.responseTo, pong.requestID);
  } finally {
    c.destroy();
  }
  // The commit did happen: the business write and its event, read straight from the server.
  const deadline = Date.now() + 3000;
  let doc = null;
  while (!doc && Date.now() < deadline) {
    doc = await s.direct.db(DB).collection('orders').findOne({ _id: id });
    if (!doc) await H.sleep(50);
  }
  assert.ok(doc, 'the transaction committed');
  await P.checkEvent(s.outbox, `ev-${id}`, { type: 'order.placed.v1', handlers: P.subscribed(P.HANDLERS, 'order.placed.v1') });
});

test('an acknowledged commit of an injected transaction is still answered', { skip: H.rawDataSkipReason() }, async () => {
  const id = `ack-${crypto.randomUUID()}`;
  const lsid = { id: new Binary(crypto.randomBytes(16), 4) };
  const txnNumber = Long.fromNumber(1);
  const c = await helloConn();
  try {
    const ins = await c.command({
      insert: 'orders',
      documents: [{ _id: id }],
      lsid,
      txnNumber,
      startTransaction: true,
      autocommit: false,
      comment: { relaybus: { type: 'order.placed.v1', id: `ev-${id}` } },
      $db: DB,
    });
    assert.equal(ins.ok, 1, JSON.stringify(ins));
    const r = await c.command({ commitTransaction: 1, lsid, txnNumber, autocommit: false, $db: 'admin' });
    assert.equal(r.ok, 1, JSON.stringify(r));
  } finally {
    c.destroy();
  }
  assert.ok(await s.direct.db(DB).collection('orders').findOne({ _id: id }));
});

H.registerFinalChecks(test, [() => s && s.upstream.stop()], { beforeStop: () => s && s.closeClients() });
