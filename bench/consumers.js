'use strict';
// Pull consumer benchmark: deliveries per second through relaybusClaim / relaybusComplete, and
// the upstream commands each delivery costs, for claims of limit 1, 10 and 100, completing
// outside a transaction and inside the consumer's own transaction.
//
//   RELAYBUS_PROXY_BIN=build/relaybus-proxy node bench/consumers.js [--deliveries N] [--consumers N]
//                                                                   [--limits 1,10,100]
//
// Each round starts its own server double (doubleStats counts its commands per connection
// appName) and proxy with a kind = pull handler `h` ([dispatch] enabled = false), writes N due,
// unkeyed deliveries straight into the outbox, resets the double's counts, and runs the consumers
// (MongoClients with maxPoolSize 1 and appName "bench-consumer-<i>") until all N are completed:
//
//  - outside: claim (limit L, no wait), then one relaybusComplete with every lease of the batch;
//  - inside: claim (limit L), then one transaction per batch with the handler's write (one
//    insertMany of a projection per delivery) and relaybusComplete of the batch's leases.
//
// Upstream commands are counted on the double from the reset to the last completion: the consumer
// thread's (appName "relaybus-proxy consumer") and everything sent on the consumers' upstream
// connections, which includes, inside a transaction, the completion's writes the proxy runs there.
// "proxy's" leaves out what the consumers themselves sent upstream (counted by the driver's
// command monitoring: the projection writes, commitTransaction; the relaybus* commands are
// answered by the proxy and never reach the double). Monitoring commands (hello, ping,
// endSessions) are left out. Deliveries per second run from the round's first claim to its last
// completion. "transactions run again" counts the abortTransaction commands the driver's
// withTransaction sent before running a batch's transaction again (a WriteConflict). Prints one
// JSON object per round, then a Markdown table.

const path = require('node:path');
const { createRequire } = require('node:module');

const REPO = path.resolve(__dirname, '..');
const H = require(path.join(REPO, 'tests', 'integration', 'lib', 'proxy.js'));
const P = require(path.join(REPO, 'tests', 'integration', 'publish', 'lib.js'));
const { MongoClient, ObjectId } = createRequire(path.join(REPO, 'tests', 'package.json'))('mongodb');

const MONITORING = new Set(['hello', 'isMaster', 'ismaster', 'ping', 'endSessions', 'doubleStats', 'buildInfo', 'buildinfo']);
const CONSUMER_APP = 'relaybus-proxy consumer';

function args() {
  const o = { deliveries: 2000, consumers: 4, limits: '1,10,100' };
  const a = process.argv.slice(2);
  for (let i = 0; i < a.length; i += 2) {
    const k = a[i].replace(/^--/, '');
    if (!(k in o) || i + 1 >= a.length) {
      process.stderr.write('usage: node bench/consumers.js [--deliveries N] [--consumers N] [--limits 1,10,100]\n');
      process.exit(2);
    }
    o[k] = k === 'limits' ? a[i + 1] : Number(a[i + 1]);
  }
  o.limits = o.limits.split(',').map(Number);
  return o;
}

/** Writes `n` due unkeyed deliveries of handler h (and their events), as committed. */
async function insertDue(direct, n, prefix) {
  const db = direct.db(P.OUTBOX_DB || 'relaybus');
  const now = new Date();
  for (let i = 0; i < n; i += 5000) {
    const evs = [];
    const dels = [];
    for (let j = i; j < Math.min(n, i + 5000); j++) {
      const id = `${prefix}-${j}`;
      evs.push({ _id: id, type: 'bench.v1', payload: { j }, handlers: ['h'], createdAt: now });
      dels.push({ _id: new ObjectId(), eventId: id, handler: 'h', eventType: 'bench.v1', laneId: P.laneId(undefined, id),
        lane: 'ready', status: 'pending', attempts: 0, claims: 0, dueAt: now, createdAt: now });
    }
    await db.collection('relaybus_events').insertMany(evs);
    await db.collection('relaybus_deliveries').insertMany(dels);
  }
}

/** The double's command counts per appName since the last reset, monitoring left out. */
async function counts(direct, reset) {
  const r = await direct.db('admin').command({ doubleStats: 1, reset: reset ? 1 : 0 });
  const byApp = {};
  for (const [app, cmds] of Object.entries(r.byApp || {})) {
    byApp[app] = {};
    for (const [k, v] of Object.entries(cmds)) if (!MONITORING.has(k)) byApp[app][k] = Number(v);
  }
  return byApp;
}

const sum = (o) => Object.values(o || {}).reduce((a, b) => a + b, 0);

/** One consumer's loop; resolves when the round has completed `target` deliveries. */
async function consume(c, limit, inside, round) {
  const admin = c.client.db('admin');
  const projections = c.client.db('benchapp').collection(`p_${round.name}`);
  while (round.done < round.target) {
    const { deliveries } = await admin.command({ relaybusClaim: 'h', limit });
    if (!round.firstClaim) round.firstClaim = Date.now();
    if (!deliveries.length) {
      await H.sleep(5);
      continue;
    }
    const leases = deliveries.map((d) => d.lease);
    if (inside) {
      const session = c.client.startSession();
      try {
        await session.withTransaction(async () => {
          await projections.insertMany(deliveries.map((d) => ({ _id: d.eventId, n: 1 })), { session });
          const r = await admin.command({ relaybusComplete: 'h', leases }, { session });
          if (r.completed.length !== leases.length) throw new Error(`not completed: ${JSON.stringify(r.notCompleted)}`);
        });
      } finally {
        await session.endSession();
      }
    } else {
      const r = await admin.command({ relaybusComplete: 'h', leases });
      if (r.completed.length !== leases.length) throw new Error(`not completed: ${JSON.stringify(r.notCompleted)}`);
    }
    round.done += leases.length;
    round.lastDone = Date.now();
  }
}

/** One round on a fresh double and proxy (the double scans its collections, so earlier rounds'
 * leftovers would slow later ones). */
async function runRound(o, limit, inside) {
  const name = `${inside ? 'in' : 'out'}${limit}`;
  const s = await P.startStack({ requireDouble: true, handlers: { h: 'bench.*' }, settings: { log_level: 'warn' } });
  const consumers = [];
  try {
    for (let i = 0; i < o.consumers; i++) {
      const app = `bench-consumer-${i}`;
      const client = new MongoClient(s.proxy.uri({ appName: app }), { maxPoolSize: 1, monitorCommands: true });
      const c = { app, client, sent: {} };
      client.on('commandStarted', (e) => {
        if (!e.commandName.startsWith('relaybus') && !MONITORING.has(e.commandName))
          c.sent[e.commandName] = (c.sent[e.commandName] || 0) + 1;
      });
      await client.connect();
      // The first pull command of a connection checks its rights: done here, outside the counts.
      await client.db('admin').command({ relaybusStatus: 'h' });
      consumers.push(c);
    }
    if (inside) await s.direct.db('benchapp').createCollection(`p_${name}`);
    await insertDue(s.direct, o.deliveries, name);
    await H.sleep(200);
    for (const c of consumers) c.sent = {};
    await counts(s.direct, true);
    const round = { name, target: o.deliveries, done: 0, firstClaim: 0, lastDone: 0 };
    await Promise.all(consumers.map((c) => consume(c, limit, inside, round)));
    const byApp = await counts(s.direct, false);
    const thread = sum(byApp[CONSUMER_APP]);
    const onConns = consumers.reduce((a, c) => a + sum(byApp[c.app]), 0);
    const sent = consumers.reduce((a, c) => a + sum(c.sent), 0);
    const byCommand = {};
    for (const app of [CONSUMER_APP, ...consumers.map((c) => c.app)])
      for (const [k, v] of Object.entries(byApp[app] || {})) byCommand[k] = (byCommand[k] || 0) + v;
    return {
      completing: inside ? 'inside a transaction' : 'outside',
      limit,
      consumers: o.consumers,
      deliveries: round.done,
      deliveriesPerSecond: Math.round((round.done * 1000) / Math.max(1, round.lastDone - round.firstClaim)),
      proxyCommandsPerDelivery: +((thread + onConns - sent) / round.done).toFixed(2),
      allCommandsPerDelivery: +((thread + onConns) / round.done).toFixed(2),
      transactionsRetried: consumers.reduce((a, c) => a + (c.sent.abortTransaction || 0), 0),
      consumerThreadCommands: thread,
      onConsumerConnections: onConns,
      sentByConsumers: sent,
      byCommand,
    };
  } finally {
    for (const c of consumers) await c.client.close().catch(() => {});
    await s.stop();
  }
}

async function main() {
  const o = args();
  const results = [];
  for (const inside of [false, true]) {
    for (const limit of o.limits) {
      const r = await runRound(o, limit, inside);
      results.push(r);
      console.log(JSON.stringify(r));
    }
  }
  console.log('\n| completing | limit | deliveries per second | proxy\'s upstream commands per delivery | all upstream commands per delivery | transactions run again |');
  console.log('|---|---:|---:|---:|---:|---:|');
  for (const r of results)
    console.log(`| ${r.completing} | ${r.limit} | ${r.deliveriesPerSecond} | ${r.proxyCommandsPerDelivery} | ${r.allCommandsPerDelivery} | ${r.completing === 'outside' ? '–' : r.transactionsRetried} |`);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
