'use strict';
// configureFailPoint: failCommand modes and effects, onPrimaryTransactionalWrite, doubleStats.

const { test, before, after, beforeEach } = require('node:test');
const assert = require('node:assert/strict');
const { startDouble, rawConnect, lsid, L } = require('./helpers');

let d;
let raw;

before(async () => {
  d = await startDouble();
  raw = await rawConnect(d.port);
});
after(async () => {
  raw.close();
  assert.equal(await d.stop(), 0);
});
beforeEach(async () => {
  await raw.command({ configureFailPoint: 'failCommand', mode: 'off', $db: 'admin' });
});

const fail = (mode, data) => raw.command({ configureFailPoint: 'failCommand', mode, data, $db: 'admin' });
const ping = () => raw.command({ find: 'c', $db: 'fp' });

test('{times: 2} fails twice then stops; errorLabels are returned as given', async () => {
  await fail({ times: 2 }, { failCommands: ['find'], errorCode: 91, errorLabels: ['Custom'] });
  const a = await ping();
  assert.equal(a.ok.valueOf(), 0);
  assert.equal(a.code.valueOf(), 91);
  assert.equal(a.codeName, 'ShutdownInProgress');
  assert.deepEqual(a.errorLabels, ['Custom']);
  assert.equal((await ping()).code.valueOf(), 91);
  assert.equal((await ping()).ok.valueOf(), 1);
});

test('{skip: 1} lets one through; alwaysOn keeps failing; off stops', async () => {
  await fail({ skip: 1 }, { failCommands: ['find'], errorCode: 2 });
  assert.equal((await ping()).ok.valueOf(), 1);
  assert.equal((await ping()).code.valueOf(), 2);
  assert.equal((await ping()).code.valueOf(), 2);
  await fail('alwaysOn', { failCommands: ['find'], errorCode: 8 });
  assert.equal((await ping()).code.valueOf(), 8);
  await fail('off');
  assert.equal((await ping()).ok.valueOf(), 1);
});

test('server labels: RetryableWriteError for retryable writes, empty errorLabels suppresses', async () => {
  await fail({ times: 1 }, { failCommands: ['insert'], errorCode: 189 });
  const r = await raw.command({ insert: 'c', documents: [{}], lsid: lsid(), txnNumber: L(1), $db: 'fp' });
  assert.deepEqual(r.errorLabels, ['RetryableWriteError']);
  await fail({ times: 1 }, { failCommands: ['insert'], errorCode: 189, errorLabels: [] });
  const r2 = await raw.command({ insert: 'c', documents: [{}], lsid: lsid(), txnNumber: L(1), $db: 'fp' });
  assert.equal(r2.errorLabels, undefined);
  await fail({ times: 1 }, { failCommands: ['insert'], errorCode: 10107 });
  const s = lsid();
  const r3 = await raw.command({ insert: 'c', documents: [{}], lsid: s, txnNumber: L(1), autocommit: false, startTransaction: true, $db: 'fp' });
  assert.deepEqual(r3.errorLabels, ['TransientTransactionError']);
});

test('closeConnection drops the connection without a reply', async () => {
  const c = await rawConnect(d.port);
  await c.command({ configureFailPoint: 'failCommand', mode: { times: 1 }, data: { failCommands: ['ping'], closeConnection: true }, $db: 'admin' });
  const r = await c.command({ ping: 1, $db: 'admin' });
  assert.equal(r, null);
  assert.equal(await c.closed, true);
});

test('writeConcernError is attached after the command ran', async () => {
  await fail({ times: 1 }, { failCommands: ['insert'], writeConcernError: { code: 91, errmsg: 'Replication is being shut down' } });
  const r = await raw.command({ insert: 'wce', documents: [{ _id: 1 }], $db: 'fp' });
  assert.equal(r.ok.valueOf(), 1);
  assert.equal(r.n.valueOf(), 1);
  assert.equal(r.writeConcernError.code.valueOf(), 91);
  const f = await raw.command({ find: 'wce', $db: 'fp' });
  assert.equal(f.cursor.firstBatch.length, 1);
});

test('blockConnection delays the reply; appName restricts to one client', async () => {
  await fail({ times: 1 }, { failCommands: ['find'], blockConnection: true, blockTimeMS: 300 });
  const t0 = Date.now();
  assert.equal((await ping()).ok.valueOf(), 1);
  assert.ok(Date.now() - t0 >= 280);
  await fail({ times: 1 }, { failCommands: ['find'], errorCode: 2, appName: 'someone-else' });
  assert.equal((await ping()).ok.valueOf(), 1);
});

test('a block longer than the command\'s maxTimeMS ends at the deadline with MaxTimeMSExpired', async () => {
  await fail({ times: 2 }, { failCommands: ['find', 'insert'], blockConnection: true, blockTimeMS: 600 });
  let t0 = Date.now();
  const r = await raw.command({ find: 'c', maxTimeMS: 150, $db: 'fp' });
  const took = Date.now() - t0;
  assert.equal(r.ok.valueOf(), 0);
  assert.equal(r.code.valueOf(), 50);
  assert.equal(r.codeName, 'MaxTimeMSExpired');
  assert.ok(took >= 140 && took < 500, `replied after ${took} ms`);
  t0 = Date.now();
  const w = await raw.command({ insert: 'mt', documents: [{ _id: 1 }], maxTimeMS: 100, $db: 'fp' });
  assert.equal(w.code.valueOf(), 50);
  assert.ok(Date.now() - t0 < 500);
  assert.equal((await raw.command({ find: 'mt', $db: 'fp' })).cursor.firstBatch.length, 0);
  // A deadline beyond the block: the command runs after it.
  await fail({ times: 1 }, { failCommands: ['find'], blockConnection: true, blockTimeMS: 100 });
  assert.equal((await raw.command({ find: 'c', maxTimeMS: 2000, $db: 'fp' })).ok.valueOf(), 1);
});

test('onPrimaryTransactionalWrite closes after the write; the retry returns the first result', async () => {
  const c = await rawConnect(d.port);
  await c.command({ configureFailPoint: 'onPrimaryTransactionalWrite', mode: { times: 1 }, $db: 'admin' });
  const s = lsid();
  const cmd = { insert: 'optw', documents: [{ _id: 1 }, { _id: 2 }], lsid: s, txnNumber: L(3), $db: 'fp' };
  assert.equal(await c.command(cmd), null);
  const r = await raw.command(cmd);
  assert.equal(r.n.valueOf(), 2);
  assert.equal((await raw.command({ find: 'optw', $db: 'fp' })).cursor.firstBatch.length, 2);
  await raw.command({ configureFailPoint: 'onPrimaryTransactionalWrite', mode: 'alwaysOn', data: { failBeforeCommitExceptionCode: 1 }, $db: 'admin' });
  const c2 = await rawConnect(d.port);
  assert.equal(await c2.command({ insert: 'optw', documents: [{ _id: 3 }], lsid: s, txnNumber: L(4), $db: 'fp' }), null);
  await raw.command({ configureFailPoint: 'onPrimaryTransactionalWrite', mode: 'off', $db: 'admin' });
  assert.equal((await raw.command({ find: 'optw', $db: 'fp' })).cursor.firstBatch.length, 2);
});

test('doubleStats counts commands by name and resets', async () => {
  await raw.command({ doubleStats: 1, reset: true, $db: 'admin' });
  await raw.command({ ping: 1, $db: 'admin' });
  await raw.command({ ping: 1, $db: 'admin' });
  await raw.command({ hello: 1, $db: 'admin' });
  const s = await raw.command({ doubleStats: 1, $db: 'admin' });
  assert.equal(s.commands.ping.valueOf(), 2);
  assert.equal(s.commands.hello.valueOf(), 1);
  assert.equal(s.commands.doubleStats.valueOf(), 1);
  assert.equal(s.commands.find, undefined);
});

test('a fail point filtered by appName fires on the first hello that names the application (as mongod 4.4.7+)', async () => {
  await fail({ times: 1 }, { failCommands: ['hello', 'isMaster'], appName: 'firstHelloApp', errorCode: 11600 });
  const c = await rawConnect(d.port);
  try {
    const r = await c.command({ hello: 1, client: { application: { name: 'firstHelloApp' } }, $db: 'admin' });
    assert.equal(r.ok.valueOf(), 0, 'the handshake hello itself fails');
    assert.equal(r.code.valueOf(), 11600);
    const again = await c.command({ hello: 1, $db: 'admin' });
    assert.equal(again.ok.valueOf(), 1, 'times: 1');
  } finally {
    c.close();
  }
  const other = await rawConnect(d.port);
  try {
    await fail({ times: 1 }, { failCommands: ['hello'], appName: 'firstHelloApp', errorCode: 11600 });
    const r = await other.command({ hello: 1, client: { application: { name: 'anotherApp' } }, $db: 'admin' });
    assert.equal(r.ok.valueOf(), 1, 'another application is not failed');
  } finally {
    other.close();
  }
});
