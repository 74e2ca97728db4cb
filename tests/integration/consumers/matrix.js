'use strict';
// Every pull consumer command through the proxy with the Node.js driver: the same cases as
// matrix.py and matrix.c, in the same order, with the same JSON line per case.
// Usage: node matrix.js PROXY_URI DIRECT_URI PLAN_JSON (see matrix.test.js)

const { MongoClient, Long } = require('mongodb');

const [uri, directUri, planJson] = process.argv.slice(2);
const plan = JSON.parse(planJson);
const H = plan.handler;
const { ids } = plan;

const nowMs = () => Date.now();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const out = (name, facts) => process.stdout.write(`${JSON.stringify({ ...facts, case: name })}\n`);

function typeName(v) {
  if (v === null || v === undefined) return 'null';
  if (typeof v === 'boolean') return 'bool';
  if (v instanceof Long) return 'int64';
  if (typeof v === 'number') return Number.isInteger(v) ? 'int32' : 'double';
  if (v && v._bsontype === 'Int32') return 'int32';
  if (v && v._bsontype === 'Double') return 'double';
  if (typeof v === 'string') return 'string';
  if (v instanceof Date) return 'date';
  if (Array.isArray(v)) return 'array';
  if (typeof v === 'object') return 'document';
  return typeof v;
}

function plain(v) {
  if (v instanceof Date) return v.getTime();
  if (v instanceof Long) return v.toNumber();
  if (v && (v._bsontype === 'Int32' || v._bsontype === 'Double')) return v.valueOf();
  if (Array.isArray(v)) return v.map(plain);
  if (v && typeof v === 'object') return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, plain(x)]));
  return v;
}

async function main() {
  // One connection each: a lease is settled on the connection that claimed it. BSON types are
  // kept as sent (promoteValues: false) so that the types can be reported.
  const raw = { promoteValues: false, promoteLongs: false };
  const a = await new MongoClient(uri, { maxPoolSize: 1, serverSelectionTimeoutMS: 10000 }).connect();
  const b = await new MongoClient(uri, { maxPoolSize: 1, serverSelectionTimeoutMS: 10000 }).connect();
  const direct = await new MongoClient(directUri, { serverSelectionTimeoutMS: 10000 }).connect();
  const outbox = direct.db(plan.outboxDb);
  const deliveries = outbox.collection(`${plan.prefix}deliveries`);
  const lanes = outbox.collection(`${plan.prefix}lanes`);
  const cmd = (client, doc, opts = {}) => client.db('admin').command(doc, { ...raw, ...opts });
  const errorOf = async (p) => {
    try {
      await p;
      return null;
    } catch (e) {
      return { code: e.code, codeName: e.codeName, errmsg: e.errmsg || e.message, labels: e.errorLabels || [] };
    }
  };
  const stored = async (eventId) => {
    const d = await deliveries.findOne({ eventId, handler: H });
    return d ? { status: d.status, attempts: d.attempts, lastError: d.lastError === undefined ? null : d.lastError } : null;
  };
  const claimUntil = async (client, wanted, extra = {}) => {
    const got = {};
    const until = Date.now() + 10000;
    while (wanted.some((w) => !got[w]) && Date.now() < until) {
      const r = await cmd(client, { relaybusClaim: H, limit: 100, ...extra });
      const others = [];
      for (const d of r.deliveries) (wanted.includes(d.eventId) ? (got[d.eventId] = d) : others.push(d.lease));
      if (others.length) await cmd(client, { relaybusRelease: H, leases: others });
      if (wanted.some((w) => !got[w])) await sleep(50);
    }
    if (wanted.some((w) => !got[w])) throw new Error(`never claimed: ${wanted.filter((w) => !got[w])}`);
    return got;
  };
  const snapshot = async () => JSON.stringify([await deliveries.find({}).sort({ _id: 1 }).toArray(), await lanes.find({}).sort({ _id: 1 }).toArray()].map((x) => JSON.stringify(x)));

  // claim
  const held = await claimUntil(a, Object.values(ids), { leaseMs: 30000, consumer: 'matrix-node' });
  const d = held[ids.claim];
  const fields = Object.fromEntries(Object.entries(d).filter(([k]) => k !== 'createdAt').map(([k, v]) => [k, plain(v)]));
  out('claim', { fields, types: Object.fromEntries(Object.entries(d).map(([k, v]) => [k, typeName(v)])),
    storedId: (await deliveries.findOne({ eventId: ids.claim, handler: H }))._id.toHexString() });

  // status
  const st = await cmd(a, { relaybusStatus: H });
  delete st.$clusterTime;
  delete st.operationTime;
  out('status', { reply: plain(st), types: Object.fromEntries(Object.entries(st).map(([k, v]) => [k, typeName(v)])), held: Object.keys(held).length });

  // bad input
  const { lease } = d;
  const forged = `${lease.split(':').slice(0, 3).join(':')}:${'0'.repeat(24)}`;
  const subst = (v) => {
    if (v === '$LEASE') return lease;
    if (v === '$FORGED') return forged;
    if (Array.isArray(v)) return v.map(subst);
    if (v && typeof v === 'object') return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, subst(x)]));
    return v;
  };
  const before = await snapshot();
  const results = [];
  for (const doc of plan.bad) results.push(await errorOf(cmd(a, subst(doc))));
  const foreign = [await errorOf(cmd(b, { relaybusComplete: H, leases: [lease] })), await errorOf(cmd(b, { relaybusRelease: H, leases: [lease] }))];
  const s1 = a.startSession();
  s1.startTransaction();
  const inTransaction = await errorOf(cmd(a, { relaybusRelease: H, leases: [lease] }, { session: s1 }));
  await s1.abortTransaction().catch(() => {});
  await s1.endSession();
  const after = await snapshot();
  const [d0, l0] = JSON.parse(before);
  const [d1, l1] = JSON.parse(after);
  out('bad', { results, foreign, inTransaction, deliveriesUnchanged: d0 === d1, lanesUnchanged: l0 === l1 });

  // complete outside a transaction
  let r = await cmd(a, { relaybusComplete: H, leases: [lease] });
  out('completeOutside', { lease, completed: r.completed, notCompleted: r.notCompleted, stored: await stored(ids.claim) });

  // complete inside the consumer's transaction
  let t = held[ids.txn];
  const s2 = a.startSession();
  try {
    s2.startTransaction();
    await a.db(plan.appDb).collection('projections').updateOne({ _id: t.eventId }, { $inc: { n: 1 } }, { upsert: true, session: s2 });
    r = await cmd(a, { relaybusComplete: H, leases: [t.lease] }, { session: s2 });
    await s2.commitTransaction();
  } finally {
    await s2.endSession();
  }
  out('completeInTransaction', { lease: t.lease, completed: r.completed, notCompleted: r.notCompleted,
    again: await errorOf(cmd(a, { relaybusComplete: H, leases: [t.lease] })), stored: await stored(t.eventId) });

  // retry with delayMs
  t = held[ids.retry];
  r = await cmd(a, { relaybusRetry: H, lease: t.lease, delayMs: 800, error: 'boom' });
  const retriedAt = nowMs();
  const afterRetry = await stored(t.eventId);
  const early = await cmd(a, { relaybusClaim: H, limit: 100 });
  if (early.deliveries.length) await cmd(a, { relaybusRelease: H, leases: early.deliveries.map((x) => x.lease) });
  let again = (await claimUntil(a, [t.eventId]))[t.eventId];
  const dueAfterMs = nowMs() - retriedAt;
  const oldLease = await errorOf(cmd(a, { relaybusComplete: H, leases: [t.lease] }));
  let done = await cmd(a, { relaybusComplete: H, leases: [again.lease] });
  out('retry', { applied: r.applied, status: r.status, dueAtType: typeName(r.dueAt), stored: afterRetry,
    earlyHadIt: early.deliveries.some((x) => x.eventId === t.eventId), dueAfterMs, attempt: plain(again.attempt),
    newLease: again.lease !== t.lease, oldLease, completed: done.completed.length === 1 && done.completed[0] === again.lease });

  // bury
  t = held[ids.bury];
  r = await cmd(a, { relaybusBury: H, lease: t.lease, error: 'poison: cannot parse' });
  out('bury', { applied: r.applied, status: r.status, stored: await stored(t.eventId) });

  // extend, then release
  t = held[ids.ext];
  r = await cmd(a, { relaybusExtend: H, leases: [t.lease], leaseMs: 120000 });
  // A pull handler's lane n is lane n of the handler's own lane space.
  const lane = await lanes.findOne({ _id: plan.laneBase + Number(t.lease.split(':')[0]) });
  out('extend', { extended: r.extended, notExtended: r.notExtended, leaseExpiresAtType: typeName(r.leaseExpiresAt),
    laneLeaseLeftMs: lane.leaseExpiresAt.getTime() - nowMs() });
  r = await cmd(a, { relaybusRelease: H, leases: [t.lease] });
  const afterRelease = await stored(t.eventId);
  again = (await claimUntil(b, [t.eventId]))[t.eventId];
  done = await cmd(b, { relaybusComplete: H, leases: [again.lease] });
  out('release', { released: r.released, notReleased: r.notReleased, stored: afterRelease, attempt: plain(again.attempt),
    completed: done.completed.length === 1 && done.completed[0] === again.lease });

  // the long poll
  const leftover = (await cmd(a, { relaybusClaim: H, limit: 1000 })).deliveries;
  if (leftover.length) await cmd(a, { relaybusRelease: H, leases: leftover.map((x) => x.lease) });
  const t0 = nowMs();
  r = await cmd(b, { relaybusClaim: H, limit: 5, maxAwaitTimeMS: 400 });
  out('longPollEmpty', { waitedMs: nowMs() - t0, deliveries: r.deliveries.length, leftover: leftover.length });
  out('longPollWaiting', { at: nowMs() });
  r = await cmd(b, { relaybusClaim: H, limit: 5, maxAwaitTimeMS: 10000 });
  const answeredAt = nowMs();
  if (r.deliveries.length) await cmd(b, { relaybusComplete: H, leases: r.deliveries.map((x) => x.lease) });
  out('longPoll', { answeredAt, eventIds: r.deliveries.map((x) => x.eventId) });

  await a.close();
  await b.close();
  await direct.close();
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
