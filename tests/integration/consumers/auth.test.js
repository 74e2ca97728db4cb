'use strict';
// Pull consumers on a deployment with authentication: the proxy's consumer thread reads the
// outbox with the proxy's own credentials, so each connection's first pull command is checked
// against the deployment on the client's own connection. An authenticated consumer claims and
// completes; one that has not authenticated is refused with Unauthorized (13) before anything
// about the handlers is said, and nothing is claimed.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const C = require('./lib');

const { H, P } = C;
let upstream;
let proxy;
let direct;
let client;

test.before(async () => {
  upstream = await H.startUpstream({ auth: 'pub:secret', requireDouble: true });
  proxy = await H.startProxy({
    upstream: `mongodb://pub:secret@127.0.0.1:${upstream.port}/?replicaSet=rs0&authSource=admin`,
    extraIni: P.handlersIni(C.PULL_HANDLERS),
  });
  direct = new MongoClient(upstream.directUri);
  await direct.connect();
  await P.ensureOutbox(direct);
  client = new MongoClient(`mongodb://pub:secret@127.0.0.1:${proxy.port}/?authSource=admin`, { maxPoolSize: 1 });
  await client.connect();
});

test('an authenticated consumer claims and completes', async () => {
  const id = C.newId('auth');
  await C.publish(client, [{ type: 'user.created.v1', id }]);
  const [d] = await C.claimN(client, 'users', 1);
  assert.equal(d.eventId, id);
  const r = await C.cmd(client, { relaybusComplete: 'users', leases: [d.lease] });
  assert.deepEqual(r.completed, [d.lease]);
});

test('pull commands without authentication: Unauthorized, nothing claimed, no handler named', async () => {
  const id = C.newId('unauth');
  await C.publish(client, [{ type: 'user.created.v1', id }]);
  const conn = await H.WireConn.connect({ port: proxy.port });
  try {
    await conn.command({ hello: 1, $db: 'admin' });
    for (const doc of [
      { relaybusClaim: 'users', limit: 10 },
      { relaybusClaim: 'nope' },
      { relaybusStatus: 'users' },
      { relaybusComplete: 'users', leases: ['1:1:0:000000000000000000000000'] },
    ]) {
      const r = await conn.command({ ...doc, $db: 'admin' });
      assert.equal(r.ok, 0, JSON.stringify(doc));
      assert.equal(r.code, 13, `${JSON.stringify(doc)}: ${r.errmsg}`);
      assert.equal(r.codeName, 'Unauthorized');
      assert.doesNotMatch(r.errmsg, /nope|kind/, 'nothing about the handlers');
    }
  } finally {
    conn.destroy();
  }
  const stored = await P.outboxOf(direct).deliveries.findOne({ eventId: id, handler: 'users' });
  assert.equal(stored.attempts, 0);
  const [d] = await C.claimN(client, 'users', 1);
  assert.equal(d.eventId, id, 'still there for an authenticated consumer');
  assert.equal(d.attempt, 1);
  await C.cmd(client, { relaybusComplete: 'users', leases: [d.lease] });
});

H.registerFinalChecks(test, [() => upstream && upstream.stop()], {
  beforeStop: async () => {
    await client.close().catch(() => {});
    await direct.close().catch(() => {});
  },
});
