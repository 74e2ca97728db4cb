'use strict';
// One consumer process of faults.test.js: the effectively-once pattern of docs/consumers.md,
// with the per-key order checked in the same transaction. For each claimed delivery, one
// withTransaction reads the key's document (the last sequence applied), records a violation
// unless this delivery's sequence is the next one, moves the key on, increments the event's
// projection {_id: eventId, n} (noting which process applied it, `by`, and the delivery's
// `attempt`) and completes the delivery. Everything of the transaction commits
// with the completion or not at all, so at the end every projection must have n = 1 and no
// violation may exist, however often this process is killed, cut off or stalled.
//
// Environment: RELAYBUS_URI, APP_DB, HANDLER, LEASE_MS, CLAIM_LIMIT (deliveries claimed at once),
// and STALL_EVERY (every so many deliveries, wait past the lease inside the transaction before
// completing).
// Writes one line per step to stdout: "txn <eventId>" inside a transaction, "done <eventId>"
// after its commit, "failed <eventId> <code>" when the transaction gave up, "stall <eventId>"
// before a stall.

const { MongoClient } = require('mongodb');

const uri = process.env.RELAYBUS_URI;
const appDb = process.env.APP_DB;
const handler = process.env.HANDLER;
const leaseMs = Number(process.env.LEASE_MS || 3000);
const stallEvery = Number(process.env.STALL_EVERY || 0);
const claimLimit = Number(process.env.CLAIM_LIMIT || 5);

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

async function main() {
  // One connection: a lease is settled on the connection that claimed it.
  const client = new MongoClient(uri, { maxPoolSize: 1, serverSelectionTimeoutMS: 60000, heartbeatFrequencyMS: 500 });
  const admin = client.db('admin');
  const app = client.db(appDb);
  let seen = 0;
  for (;;) {
    let deliveries;
    try {
      ({ deliveries } = await admin.command({ relaybusClaim: handler, limit: claimLimit, leaseMs, maxAwaitTimeMS: 500 }));
    } catch {
      await sleep(100);
      continue;
    }
    for (const d of deliveries) {
      const session = client.startSession();
      seen += 1;
      const stall = stallEvery > 0 && seen % stallEvery === 0;
      try {
        await session.withTransaction(async () => {
          process.stdout.write(`txn ${d.eventId}\n`);
          const k = await app.collection('keys').findOne({ _id: d.key }, { session });
          const expected = (k ? k.last : 0) + 1;
          if (Number(d.sequence) !== expected) {
            await app.collection('violations').insertOne({ key: d.key, expected, got: Number(d.sequence), eventId: d.eventId }, { session });
          }
          await app.collection('keys').updateOne({ _id: d.key }, { $set: { last: Number(d.sequence) } }, { upsert: true, session });
          await app.collection('projections').updateOne({ _id: d.eventId },
            { $inc: { n: 1 }, $set: { by: process.pid, attempt: d.attempt } }, { upsert: true, session });
          if (stall) {
            process.stdout.write(`stall ${d.eventId}\n`);
            await sleep(leaseMs + 1500);
          }
          await admin.command({ relaybusComplete: handler, leases: [d.lease] }, { session });
        });
        process.stdout.write(`done ${d.eventId}\n`);
      } catch (err) {
        process.stdout.write(`failed ${d.eventId} ${err.code}\n`);
      } finally {
        await session.endSession().catch(() => {});
      }
    }
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
