'use strict';
// SCRAM authentication passes through the proxy untouched: a double started with --auth, the
// proxy in front, and the Node.js driver and Mongoose authenticating through it. The right
// password works (negotiated mechanism via saslSupportedMechs, speculative authentication in the
// hello, and each SCRAM mechanism named explicitly); a wrong one fails with AuthenticationFailed.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const mongoose = require('mongoose');
const H = require('../lib/proxy');

const USER = 'rbuser';
const PASS = 'p@ss:w0rd/%';
const skip = H.doubleOnlySkipReason('--auth on demand') || false;
let upstream;
let proxy;
const DB = H.uniqueDbName('auth');

function authUri(user, pass, params = {}) {
  const q = new URLSearchParams({ authSource: 'admin', ...params });
  return `mongodb://${encodeURIComponent(user)}:${encodeURIComponent(pass)}@${proxy.host}:${proxy.port}/?${q}`;
}

test.before(async () => {
  if (skip) return;
  upstream = await H.startUpstream({ requireDouble: true, auth: `${USER}:${PASS}` });
  proxy = await H.startProxy({ upstream: upstream.uri });
});

test('the double requires authentication (an unauthenticated insert is refused)', { skip }, async () => {
  const client = new MongoClient(proxy.uri(), { serverSelectionTimeoutMS: 10000 });
  try {
    await assert.rejects(client.db(DB).collection('c').insertOne({ x: 1 }), (e) => e.code === 13 || /auth/i.test(e.message));
  } finally {
    await client.close();
  }
});

for (const mech of [null, 'SCRAM-SHA-256', 'SCRAM-SHA-1']) {
  test(`Node.js driver: right password works (${mech || 'negotiated'})`, { skip }, async () => {
    const events = [];
    const client = new MongoClient(authUri(USER, PASS, mech ? { authMechanism: mech } : {}), {
      serverSelectionTimeoutMS: 10000,
      monitorCommands: true,
    });
    client.on('commandStarted', (e) => events.push(e.commandName));
    try {
      const coll = client.db(DB).collection(`ok_${mech || 'neg'}`);
      await coll.insertOne({ _id: 1, mech });
      assert.deepEqual(await coll.findOne({ _id: 1 }), { _id: 1, mech });
      const status = await client.db('admin').command({ connectionStatus: 1 }).catch(() => null);
      if (status && status.authInfo) {
        const users = status.authInfo.authenticatedUsers.map((u) => u.user);
        assert.ok(users.includes(USER), `connectionStatus names ${USER}: ${JSON.stringify(users)}`);
      }
    } finally {
      await client.close();
    }
  });
}

test('Node.js driver: a wrong password fails with AuthenticationFailed', { skip }, async () => {
  const client = new MongoClient(authUri(USER, 'not-the-password'), { serverSelectionTimeoutMS: 5000 });
  try {
    await assert.rejects(client.connect(), (e) => {
      assert.match(`${e.name} ${e.message} ${e.code}`, /Authentication failed|AuthenticationFailed|\b18\b/);
      return true;
    });
  } finally {
    await client.close();
  }
});

test('Node.js driver: an unknown user fails', { skip }, async () => {
  const client = new MongoClient(authUri('nobody', PASS), { serverSelectionTimeoutMS: 5000 });
  try {
    await assert.rejects(client.connect(), /Authentication failed|AuthenticationFailed/);
  } finally {
    await client.close();
  }
});

test('Mongoose: right password works, wrong one fails', { skip }, async () => {
  const good = mongoose.createConnection(authUri(USER, PASS), { dbName: DB, serverSelectionTimeoutMS: 10000 });
  try {
    await good.asPromise();
    const M = good.model('A', new mongoose.Schema({ _id: Number, v: String }, { versionKey: false }), 'mg');
    await M.create({ _id: 1, v: 'ok' });
    assert.deepEqual(await M.findById(1).lean(), { _id: 1, v: 'ok' });
  } finally {
    await good.close();
  }
  const bad = mongoose.createConnection(authUri(USER, 'wrong'), { dbName: DB, serverSelectionTimeoutMS: 5000 });
  try {
    await assert.rejects(bad.asPromise(), /Authentication failed|AuthenticationFailed/);
  } finally {
    await bad.close().catch(() => {});
  }
});

test('a failed authentication does not disturb an authenticated client', { skip }, async () => {
  const client = new MongoClient(authUri(USER, PASS), { serverSelectionTimeoutMS: 10000 });
  try {
    await client.db('admin').command({ ping: 1 });
    const bad = new MongoClient(authUri(USER, 'wrong'), { serverSelectionTimeoutMS: 3000 });
    await assert.rejects(bad.connect());
    await bad.close();
    const coll = client.db(DB).collection('still');
    await coll.insertOne({ _id: 'x' });
    assert.equal(await coll.countDocuments(), 1);
    await client.db(DB).dropDatabase();
  } finally {
    await client.close();
  }
});

test('hello through the proxy answers saslSupportedMechs from the upstream', { skip }, async () => {
  const c = await H.WireConn.connect({ port: proxy.port });
  try {
    const r = await c.command({ hello: 1, saslSupportedMechs: `admin.${USER}`, $db: 'admin' });
    assert.equal(r.msg, 'isdbgrid');
    assert.ok(Array.isArray(r.saslSupportedMechs), `saslSupportedMechs in the reply: ${JSON.stringify(r.saslSupportedMechs)}`);
    assert.ok(r.saslSupportedMechs.includes('SCRAM-SHA-256'), 'SCRAM-SHA-256 offered');
  } finally {
    c.destroy();
  }
});

test('speculative authentication completes inside the hello through the proxy (no saslStart)', { skip }, async () => {
  const tap = await H.startTap(proxy.port);
  const client = new MongoClient(`mongodb://${encodeURIComponent(USER)}:${encodeURIComponent(PASS)}@127.0.0.1:${tap.port}/?authSource=admin&authMechanism=SCRAM-SHA-256`, {
    serverSelectionTimeoutMS: 10000,
    maxPoolSize: 1,
  });
  try {
    await client.db(DB).collection('spec').insertOne({ _id: 1 });
  } finally {
    await client.close();
    await tap.stop();
  }
  // The pool connection (the one that sent insert) authenticated.
  const rec = tap.conns.find((r) => r.toServer.some((m) => m.doc && 'insert' in m.doc));
  assert.ok(rec, 'found the application connection');
  const hello = rec.toServer[0];
  assert.ok(hello.doc.speculativeAuthenticate, 'the driver sent speculativeAuthenticate in its hello');
  const reply = rec.toClient.find((m) => m.responseTo === hello.requestID);
  assert.ok(reply && reply.doc, 'hello answered');
  assert.equal(reply.doc.msg, 'isdbgrid');
  assert.ok(reply.doc.speculativeAuthenticate, 'the hello reply through the proxy carries speculativeAuthenticate');
  const cmds = rec.toServer.map((m) => (m.doc ? Object.keys(m.doc)[0] : `op${m.opCode}`));
  assert.ok(!cmds.includes('saslStart'), `no separate saslStart was needed: ${cmds.join(',')}`);
  assert.ok(cmds.includes('saslContinue'), 'the conversation continued with saslContinue');
});

H.registerFinalChecks(test, [() => upstream && upstream.stop()]);
