'use strict';
// One consumer process of independence.test.js: claims one delivery of HANDLER, completes it with
// relaybusComplete inside its own transaction and then hangs there without committing, until the
// test SIGKILLs it (a consumer that crashes after its completion, before its commit). Writes
// "completed <eventId> <attempt>" once the completion inside the transaction was answered.
//
// Environment: RELAYBUS_URI, HANDLER, LEASE_MS.

const { MongoClient } = require('mongodb');

async function main() {
  // One connection: a lease is settled on the connection that claimed it.
  const client = new MongoClient(process.env.RELAYBUS_URI, { maxPoolSize: 1, serverSelectionTimeoutMS: 20000 });
  const admin = client.db('admin');
  const handler = process.env.HANDLER;
  for (;;) {
    const { deliveries } = await admin.command({
      relaybusClaim: handler, limit: 1, leaseMs: Number(process.env.LEASE_MS || 60000), maxAwaitTimeMS: 500,
    });
    if (deliveries.length === 0) continue;
    const d = deliveries[0];
    const session = client.startSession();
    session.startTransaction();
    await client.db('rbindependence').collection('applied').updateOne({ _id: d.eventId }, { $inc: { n: 1 } },
      { upsert: true, session });
    await admin.command({ relaybusComplete: handler, leases: [d.lease] }, { session });
    process.stdout.write(`completed ${d.eventId} ${d.attempt}\n`);
    await new Promise(() => {}); // never commits
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
