'use strict';
// Claims read majority-committed data only. A client may commit its transaction with w: 1: its
// commit reply (and the dispatcher's wake-up after it) comes before a majority holds the
// event. An event the primary has alone is rolled back when that primary loses its place, so
// it must never be delivered; once a majority holds it, it is.
//
// On the server double: the secondary's stopReplProducer fail point holds the majority commit
// point back (tests/mongod-double/README.md, "Majority commit point"), and an event is published
// through the proxy in a transaction committed with w: 1, into a lane the dispatcher holds (a
// delivery of the same lane hangs at the webhook). The dispatcher is woken and polls for a
// while; its claim's record (the w: majority write that follows the claim's reads) is held by
// a blockConnection fail point, as a record sent just before a failover would be. Then the
// primary is stepped down with force: the event is rolled back, and the held record is
// interrupted and retried by the driver on the new primary, where it succeeds (the lane
// documents there are majority-committed). Read at local, the claim had the event and hands it
// to the webhook; read at majority, it never saw it. An event published after that, with the
// default write concern (majority), arrives.
//
// Then, with a secondary that applies each write 300 ms late (--majority-lag-ms), an event
// committed with w: 1 is delivered no sooner than a majority holds it, and without waiting for
// the poll: the change stream on the deliveries returns majority-committed changes only, and
// wakes the dispatcher then (docs/handlers.md, "Majority reads").

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const H = require('../lib/proxy');
const { startUpstream, uniqueDbName, clientUri, sleep } = H;
const { startSink } = require('./sink');
const { startDispatchProxy, publishThroughProxy, waitFor, laneId } = require('./helpers');

const TIMEOUT_MS = 60000;

async function publishW1(client, db, e) {
  const session = client.startSession();
  try {
    await session.withTransaction(async () => {
      await client.db(db).collection('items').insertOne({ _id: e.id }, { session, comment: { relaybus: { type: e.type, id: e.id, payload: e.payload } } });
    }, { writeConcern: { w: 1 } });
  } finally {
    await session.endSession();
  }
}

test('an event committed with w: 1 and rolled back at a failover is never delivered; a majority-committed one is', {
  timeout: 180000, skip: H.doubleOnlySkipReason('the stopReplProducer and failCommand fail points and a forced step-down') || false,
}, async (t) => {
  const up = await startUpstream({ requireDouble: true });
  t.after(() => up.stop());
  // 'hold' is never answered: its delivery keeps its lane held by the dispatcher.
  const sink = await startSink({ respond: (ev) => (ev.id === 'hold' ? 'hang' : undefined) });
  t.after(() => sink.close());
  const st = sink.stats();
  const db = uniqueDbName('majority');
  const dispatcher = await startDispatchProxy({
    upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 200 },
    handlers: [{ name: 'h', events: '*', kind: 'webhook', url: sink.url('/h'), timeout_ms: 120000 }],
  });
  t.after(() => dispatcher.kill());
  const client = await new MongoClient(clientUri({ host: '127.0.0.1', port: dispatcher.port })).connect();
  t.after(() => client.close());
  const direct = await new MongoClient(up.uri).connect();
  t.after(() => direct.close());

  await publishThroughProxy(client, db, [{ id: 'hold', type: 'majority.v1', payload: {} }]);
  await waitFor(() => st.pendingNow >= 1, TIMEOUT_MS, 'the held delivery at the webhook');
  // An event id of the same lane (unkeyed events go by their id).
  let lost = null;
  for (let i = 0; lost === null; i++) if (laneId(undefined, `lost-${i}`) === laneId(undefined, 'hold')) lost = `lost-${i}`;

  const hello = await direct.db('admin').command({ hello: 1 });
  const primaryHost = hello.primary;
  const secondaryHost = hello.hosts.find((h) => h !== primaryHost);
  const secondary = await new MongoClient(`mongodb://${secondaryHost}/?directConnection=true`).connect();
  t.after(() => secondary.close());
  const primary = await new MongoClient(`mongodb://${primaryHost}/?directConnection=true`).connect();
  t.after(() => primary.close());
  // The secondary stops applying the primary's writes: the majority commit point stays here.
  await secondary.db('admin').command({ configureFailPoint: 'stopReplProducer', mode: 'alwaysOn' });
  // The dispatcher's updates (a claim's record among them) wait on this primary.
  await primary.db('admin').command({
    configureFailPoint: 'failCommand', mode: 'alwaysOn',
    data: { failCommands: ['update'], blockConnection: true, blockTimeMS: 120000, appName: 'relaybus-proxy dispatch' },
  });

  // Committed with w: 1 through the proxy: the commit reply comes at once and wakes the
  // dispatcher, which polls every 200 ms meanwhile.
  await publishW1(client, db, { id: lost, type: 'majority.v1', payload: { w: 1 } });
  const events = direct.db(db).collection('relaybus_events');
  assert.equal(await events.countDocuments({ _id: lost }), 1, 'the primary has the event (read at local)');
  assert.equal(await events.countDocuments({ _id: lost }, { readConcern: { level: 'majority' } }), 0, 'a majority does not');
  await sleep(3000);

  // The primary loses its place: the writes the secondary lacks are rolled back.
  const sd = await primary.db('admin').command({ replSetStepDown: 30, force: true });
  assert.equal(sd.ok, 1);
  await waitFor(async () => (await direct.db('admin').command({ hello: 1 })).primary === secondaryHost, TIMEOUT_MS, 'the other member to be primary');
  await waitFor(() => /rolled back \d+ write\(s\)/.test(up.log()), TIMEOUT_MS, 'the rollback in the double\'s log');
  assert.equal(await events.countDocuments({ _id: lost }), 0, 'the event was rolled back');
  await primary.db('admin').command({ configureFailPoint: 'failCommand', mode: 'off' });
  // The member that is primary now replicates to the old one: its writes are majority at once.
  await secondary.db('admin').command({ configureFailPoint: 'stopReplProducer', mode: 'off' });

  // After the failover, an event committed with the default write concern (majority) arrives.
  await publishThroughProxy(client, db, [{ id: 'kept', type: 'majority.v1', payload: {} }]);
  await waitFor(() => st.ok.has('kept'), TIMEOUT_MS, 'the majority-committed event at the sink');
  await sleep(2000);
  assert.equal(st.ok.has(lost), false, `the rolled-back event ${lost} was delivered`);
  assert.deepEqual(st.okOrder, ['kept']);
  assert.equal((await dispatcher.stop()).code, 0);
});

test('with a lagging secondary, an event committed with w: 1 is delivered once a majority holds it, woken by the change stream and not by the poll', {
  timeout: 120000, skip: H.doubleOnlySkipReason('the double\'s --majority-lag-ms') || false,
}, async (t) => {
  const LAG_MS = 300;
  const POLL_MS = 20000;
  const up = await startUpstream({ requireDouble: true, args: ['--majority-lag-ms', String(LAG_MS)] });
  t.after(() => up.stop());
  const sink = await startSink({});
  t.after(() => sink.close());
  const st = sink.stats();
  const db = uniqueDbName('majority_lag');
  const dispatcher = await startDispatchProxy({
    upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: POLL_MS },
    handlers: [{ name: 'h', events: '*', kind: 'webhook', url: sink.url('/h') }],
  });
  t.after(() => dispatcher.kill());
  const client = await new MongoClient(clientUri({ host: '127.0.0.1', port: dispatcher.port })).connect();
  t.after(() => client.close());
  await waitFor(() => /watching \S+ for new deliveries/.test(dispatcher.log()), TIMEOUT_MS, 'the change stream to open');
  await sleep(1000); // past the first poll
  const t0 = Date.now();
  await publishW1(client, db, { id: 'lagged', type: 'majority.v1', payload: {} });
  await waitFor(() => st.ok.has('lagged'), POLL_MS * 2, 'the event at the sink');
  const ms = st.firstAt.get('lagged') - t0;
  t.diagnostic(`commit (w: 1) to webhook: ${ms} ms with a ${LAG_MS} ms replication lag, poll_interval_ms ${POLL_MS}`);
  // Never before a majority holds it; woken when it does (the poll is 20 s away).
  assert.ok(ms >= LAG_MS, `delivered ${ms} ms after the commit, before the ${LAG_MS} ms lag`);
  assert.ok(ms < POLL_MS / 2, `delivered ${ms} ms after the commit: not woken by the change stream`);
  assert.equal((await dispatcher.stop()).code, 0);
});

// MongoDB 4.0 to 4.4 started with enableMajorityReadConcern=false (as primary-secondary-arbiter
// sets were advised to be) refuse a read at majority with 148, ReadConcernMajorityNotEnabled.
// The dispatcher then says so once and reads at local, rather than dispatch nothing. The
// double behaves as 7.0, where majority reads are always on: a failCommand fail point gives the
// dispatcher's next three reads that refusal.
test('a server that refuses read concern majority (148): one warning, then claims at local deliver', {
  timeout: 120000, skip: H.doubleOnlySkipReason('the failCommand fail point') || false,
}, async (t) => {
  const up = await startUpstream({ requireDouble: true });
  t.after(() => up.stop());
  const sink = await startSink({});
  t.after(() => sink.close());
  const db = uniqueDbName('majority_off');
  const dispatcher = await startDispatchProxy({
    upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 200 },
    handlers: [{ name: 'h', events: '*', kind: 'webhook', url: sink.url('/h') }],
  });
  t.after(() => dispatcher.kill());
  const client = await new MongoClient(clientUri({ host: '127.0.0.1', port: dispatcher.port })).connect();
  t.after(() => client.close());
  await waitFor(() => /watching \S+ for new deliveries/.test(dispatcher.log()), TIMEOUT_MS, 'the change stream to open');
  // The poll's probe and the claim's reads of the deliveries (finds, at majority) get it first:
  // the dispatcher polls every 200 ms, its fleet reads once a heartbeat.
  const direct = await new MongoClient(up.uri).connect();
  t.after(() => direct.close());
  await direct.db('admin').command({
    configureFailPoint: 'failCommand', mode: { times: 3 },
    data: { failCommands: ['find'], appName: 'relaybus-proxy dispatch', errorCode: 148 },
  });
  await publishThroughProxy(client, db, [{ id: 'mo-1', type: 'majority.v1', payload: {} }]);
  await waitFor(() => sink.stats().ok.has('mo-1'), TIMEOUT_MS, 'the event at the sink');
  const warned = dispatcher.log().split('\n').filter((l) => /refused read concern majority/.test(l));
  assert.equal(warned.length, 1, `one warning:\n${warned.join('\n')}`);
  assert.match(warned[0], /claims read at local from now on/);
  assert.equal((await dispatcher.stop()).code, 0);
});
