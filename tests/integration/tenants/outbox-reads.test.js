'use strict';
// Hostile tenants reading the outbox (pooled mode). Every pooled client reaches the server as the
// pool's one upstream user, so the server cannot keep one team's deliveries and payloads from
// another: the proxy does. With [outbox] readers = rita and a pull handler whose consumers list
// names alice, only rita and alice may read the outbox collections; bob, who is neither, gets 13
// Unauthorized for find, aggregate, getMore, count and distinct on them, for a $lookup,
// $unionWith or $graphLookup that reads them from another collection, for a change stream on
// one of them, on the outbox database or on the whole cluster, and for a view over them, and
// nothing is forwarded; his reads of his own collections go on. Without either list, the rule of
// before holds: every logged-in user reads what the pool's upstream user may.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { execFileSync } = require('node:child_process');
const { MongoClient } = require('mongodb');
const C = require('../consumers/lib');

const { H, P } = C;
const skip = H.doubleOnlySkipReason('a pooled upstream user on demand (--auth)') || false;
const OUTBOX = 'relaybus';
const APP = H.uniqueDbName('tenants_reads');
const USERS = { alice: 'al1ce-pass', rita: 'r1ta-pass', bob: 'b0b-pass' };
let upstream;
let direct;
let authFile;

function clientOf(proxy, user) {
  return new MongoClient(
    `mongodb://${encodeURIComponent(user)}:${encodeURIComponent(USERS[user])}@127.0.0.1:${proxy.port}/?authSource=admin`,
    { maxPoolSize: 1, serverSelectionTimeoutMS: 10000 },
  );
}

async function startPooled(extraIni) {
  return H.startProxy({
    upstream: `mongodb://pub:secret@127.0.0.1:${upstream.port}/?replicaSet=rs0&authSource=admin`,
    settings: { pool_mode: 'pooled', pool_size: 4, auth_file: authFile },
    extraIni,
  });
}

/** The reply of `doc` on database `db`, or the error's fields. */
async function run(client, db, doc) {
  try {
    return await client.db(db).command(doc);
  } catch (e) {
    return { ok: 0, code: e.code, codeName: e.codeName, errmsg: e.message };
  }
}

// Every way bob might read the outbox, each as the command a driver sends.
const READS = [
  ['find on deliveries', OUTBOX, { find: 'relaybus_deliveries', filter: {} }],
  ['find on events', OUTBOX, { find: 'relaybus_events', filter: {} }],
  ['aggregate on events', OUTBOX, { aggregate: 'relaybus_events', pipeline: [{ $match: {} }], cursor: {} }],
  ['count on deliveries', OUTBOX, { count: 'relaybus_deliveries' }],
  ['distinct on events', OUTBOX, { distinct: 'relaybus_events', key: 'type' }],
  ['change stream on deliveries', OUTBOX, { aggregate: 'relaybus_deliveries', pipeline: [{ $changeStream: {} }], cursor: {} }],
  ['change stream on the outbox database', OUTBOX, { aggregate: 1, pipeline: [{ $changeStream: {} }], cursor: {} }],
  ['change stream on the cluster', 'admin', { aggregate: 1, pipeline: [{ $changeStream: { allChangesForCluster: true } }], cursor: {} }],
  ['$lookup from events', OUTBOX, { aggregate: 'mine', pipeline: [{ $lookup: { from: 'relaybus_events', pipeline: [], as: 'e' } }], cursor: {} }],
  ['$unionWith deliveries', OUTBOX, { aggregate: 1, pipeline: [{ $documents: [{}] }, { $unionWith: 'relaybus_deliveries' }], cursor: {} }],
  ['$graphLookup from events', OUTBOX, { aggregate: 'mine', pipeline: [{ $graphLookup: { from: 'relaybus_events', startWith: '$x', connectFromField: 'x', connectToField: '_id', as: 'g' } }], cursor: {} }],
  ['a view on events', OUTBOX, { create: 'bobs_view', viewOn: 'relaybus_events', pipeline: [] }],
  ['explain of a find on events', OUTBOX, { explain: { find: 'relaybus_events', filter: {} }, verbosity: 'executionStats' }],
];

test.before(async () => {
  if (skip) return;
  upstream = await H.startDouble({ auth: 'pub:secret' });
  direct = new MongoClient(upstream.directUri);
  await direct.connect();
  await P.ensureOutbox(direct);
  authFile = path.join(H.tmpDir('relaybus-tenants-reads-'), 'users.auth');
  const make = (name) => execFileSync(H.proxyBin(), ['--make-user', name], { input: `${USERS[name]}\n` }).toString();
  fs.writeFileSync(authFile, make('alice') + make('rita') + make('bob'), { mode: 0o600 });
});

test.after(async () => {
  if (direct) await direct.close();
});

test('[outbox] readers and consumers: bob, neither, gets 13 for every read of the outbox; rita and alice read it', { skip }, async () => {
  const proxy = await startPooled(
    '[outbox]\nreaders = rita\n\n' +
    '[handler guarded]\nevents = team.*\nkind = pull\nconsumers = alice\n\n' +
    '[handler open]\nevents = team.*\nkind = pull\n',
  );
  const alice = clientOf(proxy, 'alice');
  const rita = clientOf(proxy, 'rita');
  const bob = clientOf(proxy, 'bob');
  try {
    for (const c of [alice, rita, bob]) await c.connect();
    const id = C.newId('reads');
    await C.publish(alice, [{ type: 'team.secret', id, payload: { salary: 100 } }]);
    await bob.db(APP).collection('mine').insertOne({ _id: 1, x: 1 });
    const before = await direct.db(OUTBOX).collection('relaybus_events').countDocuments({});

    // A getMore naming an outbox collection, on a cursor of bob's own (of his collection in the
    // outbox database, so that the owners' check passes and this one is the one that refuses).
    await bob.db(OUTBOX).collection('bobs_notes').insertMany([{ _id: 1 }, { _id: 2 }]);
    const mine = await run(bob, OUTBOX, { find: 'bobs_notes', filter: {}, batchSize: 1 });
    assert.equal(mine.ok, 1, JSON.stringify(mine));
    const reads = [...READS, ['getMore on events', OUTBOX, { getMore: mine.cursor.id, collection: 'relaybus_events' }]];
    for (const [what, db, doc] of reads) {
      const r = await run(bob, db, doc);
      assert.equal(r.ok, 0, `${what}: ${JSON.stringify(r)}`);
      assert.equal(r.code, 13, `${what}: ${r.errmsg}`);
      assert.equal(r.codeName, 'Unauthorized');
      assert.match(r.errmsg, /user bob is neither among \[outbox\] readers nor in a pull handler's consumers/, what);
    }
    assert.equal(await direct.db(OUTBOX).listCollections({ name: 'bobs_view' }).toArray().then((l) => l.length), 0, 'no view was created');
    assert.ok(await proxy.waitForLog(/refused a read of the outbox by user bob: find on relaybus\.relaybus_deliveries/));
    // Bob's own collections, and the relaybus* commands of a handler without a list, go on.
    assert.deepEqual(await bob.db(APP).collection('mine').find({}).toArray(), [{ _id: 1, x: 1 }]);
    assert.equal((await run(bob, APP, { aggregate: 'mine', pipeline: [{ $lookup: { from: 'mine', pipeline: [], as: 'm' } }], cursor: {} })).ok, 1);

    // The consumer and the reader read the deliveries, the events and a change stream.
    for (const [who, c] of [['alice', alice], ['rita', rita]]) {
      const dels = await c.db(OUTBOX).collection('relaybus_deliveries').find({ eventId: id }).toArray();
      assert.deepEqual(dels.map((d) => d.handler).sort(), ['guarded', 'open'], `${who} reads the deliveries`);
      const [ev] = await c.db(OUTBOX).collection('relaybus_events').aggregate([{ $match: { _id: id } }]).toArray();
      assert.deepEqual(ev.payload, { salary: 100 }, `${who} reads the events`);
      assert.equal(await c.db(OUTBOX).collection('relaybus_deliveries').countDocuments({ eventId: id }), 2);
      const cs = await run(c, OUTBOX, { aggregate: 'relaybus_deliveries', pipeline: [{ $changeStream: {} }], cursor: {} });
      assert.equal(cs.ok, 1, `${who}: change stream ${JSON.stringify(cs)}`);
      await run(c, OUTBOX, { killCursors: 'relaybus_deliveries', cursors: [cs.cursor.id] });
    }
    assert.equal(await direct.db(OUTBOX).collection('relaybus_events').countDocuments({}), before);
  } finally {
    for (const c of [alice, rita, bob]) await c.close();
    await proxy.stop();
  }
});

test('without [outbox] readers or a consumers list, every pooled user reads the outbox, as before', { skip }, async () => {
  const proxy = await startPooled('[handler open]\nevents = team.*\nkind = pull\n');
  const bob = clientOf(proxy, 'bob');
  try {
    await bob.connect();
    const id = C.newId('open');
    await C.publish(bob, [{ type: 'team.open', id }]);
    const dels = await bob.db(OUTBOX).collection('relaybus_deliveries').find({ eventId: id, handler: 'open' }).toArray();
    assert.equal(dels.length, 1);
    assert.equal((await run(bob, OUTBOX, { aggregate: 1, pipeline: [{ $changeStream: {} }], cursor: {} })).ok, 1);
  } finally {
    await bob.close();
    await proxy.stop();
  }
});

H.registerFinalChecks(test, [() => upstream && upstream.stop()]);
