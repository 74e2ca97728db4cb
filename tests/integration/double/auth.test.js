'use strict';
// SCRAM authentication: a double started with --auth USER:PASSWORD accepts the
// right password (SCRAM-SHA-256, SCRAM-SHA-1, and the driver's negotiated
// default) and rejects a wrong one with an authentication error; without
// credentials, commands are refused. Official driver and Mongoose.
//
// With RELAYBUS_TEST_UPSTREAM set (scripts/test --upstream), runs against that
// deployment only if its URI carries credentials (a wrong password is derived
// from them); otherwise skipped.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient, MongoServerError } = require('mongodb');
const mongoose = require('mongoose');
const { startDouble } = require('../lib/double');

const USER = 'relay_user';
const PASSWORD = 'pa55:w0rd%sp ace';

let server;
let good;
let bad;
let anon;
let skip = false;

function withPassword(uri, password) {
  return uri.replace(/^(mongodb(?:\+srv)?:\/\/)([^:@/]+):([^@/]*)@/, (_, p, u) => `${p}${u}:${encodeURIComponent(password)}@`);
}

test.before(async () => {
  if (process.env.RELAYBUS_TEST_UPSTREAM) {
    const uri = process.env.RELAYBUS_TEST_UPSTREAM;
    if (!/^mongodb(\+srv)?:\/\/[^/@]+:[^/@]*@/.test(uri)) {
      skip = 'the upstream URI has no credentials';
      return;
    }
    server = { uri, stop: async () => {} };
    good = uri;
    bad = withPassword(uri, 'definitely-not-the-password');
    anon = uri.replace(/\/\/[^@/]+@/, '//');
    return;
  }
  server = await startDouble({ auth: `${USER}:${PASSWORD}` });
  good = server.uri;
  bad = withPassword(server.uri, 'wrong-password');
  anon = server.baseUri;
});

test.after(async () => {
  if (server) await server.stop();
});

// By name rather than instanceof: Mongoose may bring its own copy of the driver.
function isAuthError(e) {
  return !!e && (e instanceof MongoServerError || e.name === 'MongoServerError') &&
    (e.code === 18 || e.codeName === 'AuthenticationFailed');
}

async function tryConnect(uri, extra = {}) {
  const c = new MongoClient(uri, { serverSelectionTimeoutMS: 5000, ...extra });
  try {
    await c.connect();
    return await c.db('admin').command({ ping: 1 });
  } finally {
    await c.close();
  }
}

for (const mech of [undefined, 'SCRAM-SHA-256', 'SCRAM-SHA-1']) {
  const label = mech || 'negotiated mechanism';
  test(`driver: right password authenticates (${label})`, { timeout: 30000 }, async (t) => {
    if (skip) return t.skip(skip);
    const c = new MongoClient(good, { serverSelectionTimeoutMS: 5000, ...(mech ? { authMechanism: mech } : {}) });
    try {
      await c.connect();
      assert.equal((await c.db('admin').command({ ping: 1 })).ok, 1);
      const status = await c.db('admin').command({ connectionStatus: 1 });
      const users = status.authInfo.authenticatedUsers.map((u) => u.user);
      assert.ok(users.length === 1, `authenticatedUsers: ${JSON.stringify(status.authInfo)}`);
      // Real work succeeds.
      const coll = c.db(`auth_${process.pid}`).collection('t');
      await coll.insertOne({ _id: 1 });
      assert.equal(await coll.countDocuments(), 1);
      await c.db(`auth_${process.pid}`).dropDatabase();
    } finally {
      await c.close();
    }
  });

  test(`driver: wrong password is rejected with an authentication error (${label})`, { timeout: 30000 }, async (t) => {
    if (skip) return t.skip(skip);
    await assert.rejects(tryConnect(bad, mech ? { authMechanism: mech } : {}), (e) => {
      assert.ok(isAuthError(e), `expected AuthenticationFailed (18), got ${e && e.name}: ${e && e.message} code ${e && e.code}`);
      return true;
    });
  });
}

test('driver: unknown user is rejected with an authentication error', { timeout: 30000 }, async (t) => {
  if (skip) return t.skip(skip);
  const uri = good.replace(/\/\/[^:@/]+:/, '//nosuchuser:');
  await assert.rejects(tryConnect(uri), (e) => {
    assert.ok(isAuthError(e), `expected AuthenticationFailed, got ${e && e.name}: ${e && e.message}`);
    return true;
  });
});

test('driver: without credentials, data commands are refused (Unauthorized)', { timeout: 30000 }, async (t) => {
  if (skip) return t.skip(skip);
  const c = new MongoClient(anon, { serverSelectionTimeoutMS: 5000 });
  try {
    await c.connect();
    await assert.rejects(c.db('x').collection('y').insertOne({ _id: 1 }), (e) => {
      assert.ok(e instanceof MongoServerError, `got ${e}`);
      assert.equal(e.code, 13, `expected Unauthorized (13), got ${e.code} ${e.message}`);
      return true;
    });
    await assert.rejects(c.db('x').collection('y').find().toArray(), (e) => e.code === 13);
  } finally {
    await c.close();
  }
});

test('mongoose: right password connects and works, wrong password fails with an auth error', { timeout: 30000 }, async (t) => {
  if (skip) return t.skip(skip);
  const conn = await mongoose.createConnection(good, { dbName: `auth_mg_${process.pid}`, serverSelectionTimeoutMS: 5000 })
    .asPromise();
  try {
    const M = conn.model('M', new mongoose.Schema({ n: Number }));
    await M.create({ n: 1 });
    assert.equal(await M.countDocuments(), 1);
    await conn.dropDatabase();
  } finally {
    await conn.close();
  }
  const badConn = mongoose.createConnection(bad, { serverSelectionTimeoutMS: 5000 });
  await assert.rejects(badConn.asPromise(), (e) => {
    assert.ok(isAuthError(e), `expected AuthenticationFailed, got ${e && e.name}: ${e && e.message}`);
    return true;
  });
  await badConn.close().catch(() => {});
});
