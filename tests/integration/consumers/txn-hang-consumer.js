'use strict';
// One consumer process of independence.test.js: claims one delivery of HANDLER, completes it with
// relaybusComplete inside its own transaction and then hangs there without committing, until the
// test SIGKILLs it (a consumer that crashes after its completion, before its commit). Writes
// "completed <eventId> <attempt>" once the completion inside the transaction was answered. With
// CLAIMS = n (default 1) it first holds n claims and completes only the first one; the others stay
// claimed, listed after the completion as "holding <eventId> <attempt>".
//
// Environment: RELAYBUS_URI, HANDLER, LEASE_MS, CLAIMS.

const { MongoClient } = require('mongodb');

async function main() {
  // One connection: a lease is settled on the connection that claimed it.
  const client = new MongoClient(process.env.RELAYBUS_URI, { maxPoolSize: 1, serverSelectionTimeoutMS: 20000 });
  const admin = client.db('admin');
  const handler = process.env.HANDLER;
  const want = Number(process.env.CLAIMS || 1);
  const held = [];
  while (held.length < want) {
    const { deliveries } = await admin.command({
      relaybusClaim: handler, limit: want - held.length, leaseMs: Number(process.env.LEASE_MS || 60000),
      maxAwaitTimeMS: 500,
    });
    held.push(...deliveries);
  }
  const d = held[0];
  const session = client.startSession();
  session.startTransaction();
  await client.db('rbindependence').collection('applied').updateOne({ _id: d.eventId }, { $inc: { n: 1 } },
    { upsert: true, session });
  await admin.command({ relaybusComplete: handler, leases: [d.lease] }, { session });
  for (const o of held.slice(1)) process.stdout.write(`holding ${o.eventId} ${o.attempt}\n`);
  process.stdout.write(`completed ${d.eventId} ${d.attempt}\n`);
  await new Promise(() => {}); // never commits
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
