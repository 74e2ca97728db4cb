'use strict';
// 20 sessions run conflicting transactions (transfers between a few accounts,
// each inside withTransaction) at the same time. Afterwards the state must be
// what some serial order of the committed transfers produces: the total is
// conserved, every transfer is in the ledger exactly once, and the per-account
// versions/balances each transfer read chain up into one acyclic order.
// Official Node.js driver and Mongoose.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const mongoose = require('mongoose');
const { serverForTests, uniqueDbName } = require('../lib/double');

const ACCOUNTS = ['A', 'B', 'C', 'D'];
const INITIAL = 1000;
const SESSIONS = 20;
const PER_SESSION = 5;

let server;
let client;

test.before(async () => {
  server = await serverForTests();
  client = new MongoClient(server.uri, { serverSelectionTimeoutMS: 10000, maxPoolSize: 40 });
  await client.connect();
});

test.after(async () => {
  if (client) await client.close();
  if (server) await server.stop();
});

// Deterministic plan so a failure can be reproduced.
function plan() {
  let seed = 12345;
  const rnd = () => {
    seed = (seed * 1103515245 + 12345) % 2147483648;
    return seed / 2147483648;
  };
  const out = [];
  for (let s = 0; s < SESSIONS; s++) {
    const list = [];
    for (let k = 0; k < PER_SESSION; k++) {
      const from = ACCOUNTS[Math.floor(rnd() * ACCOUNTS.length)];
      let to = ACCOUNTS[Math.floor(rnd() * ACCOUNTS.length)];
      if (to === from) to = ACCOUNTS[(ACCOUNTS.indexOf(from) + 1) % ACCOUNTS.length];
      list.push({ id: `s${s}-t${k}`, from, to, amount: 1 + Math.floor(rnd() * 400) });
    }
    out.push(list);
  }
  return out;
}

class LostUpdate extends Error {}

// One transfer, inside a transaction. io abstracts driver vs Mongoose.
async function transfer(io, session, t) {
  const from = await io.get(t.from, session);
  if (from.balance < t.amount) {
    // Rejected transfers still write (bump the version) so they take part in
    // conflict detection and in the serial-order check.
    const r = await io.bump(t.from, from.version, 0, session);
    if (r !== 1) throw new LostUpdate(`version filter on ${t.from} matched ${r}`);
    await io.record({ _id: t.id, status: 'rejected', from: t.from, to: t.to, amount: t.amount,
      read: { [t.from]: { version: from.version, balance: from.balance } } }, session);
    return;
  }
  const to = await io.get(t.to, session);
  const r1 = await io.bump(t.from, from.version, -t.amount, session);
  const r2 = await io.bump(t.to, to.version, t.amount, session);
  if (r1 !== 1 || r2 !== 1) throw new LostUpdate(`version filters matched ${r1}/${r2}`);
  await io.record({ _id: t.id, status: 'done', from: t.from, to: t.to, amount: t.amount,
    read: { [t.from]: { version: from.version, balance: from.balance }, [t.to]: { version: to.version, balance: to.balance } } },
  session);
}

function checkSerializable(accounts, ledger, transfers) {
  // Total conserved.
  const total = accounts.reduce((s, a) => s + a.balance, 0);
  assert.equal(total, INITIAL * ACCOUNTS.length, 'total balance not conserved');
  // Every transfer in the ledger exactly once.
  const ids = ledger.map((l) => l._id);
  assert.equal(new Set(ids).size, ids.length, 'duplicate ledger entries');
  assert.deepEqual([...ids].sort(), transfers.map((t) => t.id).sort(), 'ledger does not hold each transfer once');
  // Per account: the versions the committed transactions read are exactly
  // 0..k-1, and the balances they read chain up.
  const byAccount = new Map(ACCOUNTS.map((a) => [a, []]));
  for (const l of ledger) for (const acct of Object.keys(l.read)) byAccount.get(acct).push(l);
  const edges = new Map(ledger.map((l) => [l._id, new Set()]));
  const indeg = new Map(ledger.map((l) => [l._id, 0]));
  for (const acct of accounts) {
    const entries = byAccount.get(acct._id).sort((x, y) => x.read[acct._id].version - y.read[acct._id].version);
    let balance = INITIAL;
    entries.forEach((l, v) => {
      const r = l.read[acct._id];
      assert.equal(r.version, v, `account ${acct._id}: transfer ${l._id} read version ${r.version}, expected ${v} ` +
        '(two transactions read the same version, or one was lost)');
      assert.equal(r.balance, balance, `account ${acct._id}: transfer ${l._id} read balance ${r.balance}, serial order gives ${balance}`);
      if (l.status === 'done') {
        if (l.from === acct._id) {
          assert.ok(balance >= l.amount, `account ${acct._id} would go negative`);
          balance -= l.amount;
        } else {
          balance += l.amount;
        }
      }
      if (v > 0) {
        const prev = entries[v - 1]._id;
        if (!edges.get(prev).has(l._id)) {
          edges.get(prev).add(l._id);
          indeg.set(l._id, indeg.get(l._id) + 1);
        }
      }
    });
    assert.equal(acct.version, entries.length, `account ${acct._id}: version ${acct.version}, ${entries.length} transfers touched it`);
    assert.equal(acct.balance, balance, `account ${acct._id}: balance ${acct.balance}, replaying the ledger gives ${balance}`);
  }
  // The per-account orders must combine into one serial order (no cycle).
  const queue = [...indeg].filter(([, d]) => d === 0).map(([id]) => id);
  let ordered = 0;
  while (queue.length) {
    const id = queue.pop();
    ordered += 1;
    for (const next of edges.get(id)) {
      indeg.set(next, indeg.get(next) - 1);
      if (indeg.get(next) === 0) queue.push(next);
    }
  }
  assert.equal(ordered, ledger.length, 'the per-account orders contain a cycle: no serial order explains the result');
}

async function runAll(startSession, io) {
  const p = plan();
  let attempts = 0;
  await Promise.all(p.map(async (list) => {
    const session = await startSession();
    try {
      for (const t of list) {
        await session.withTransaction(async () => {
          attempts += 1;
          await transfer(io, session, t);
        });
      }
    } finally {
      await session.endSession();
    }
  }));
  return { transfers: p.flat(), attempts };
}

test('driver: 20 sessions of conflicting transfers end in a serializable state', { timeout: 180000 }, async (t) => {
  const db = client.db(uniqueDbName('xfer'));
  const accounts = db.collection('accounts');
  const ledger = db.collection('ledger');
  await accounts.insertMany(ACCOUNTS.map((a) => ({ _id: a, balance: INITIAL, version: 0 })));
  await db.createCollection('ledger');
  const io = {
    get: (id, session) => accounts.findOne({ _id: id }, { session }),
    bump: async (id, version, delta, session) => (await accounts.updateOne({ _id: id, version },
      { $inc: { balance: delta, version: 1 } }, { session })).matchedCount,
    record: (doc, session) => ledger.insertOne(doc, { session }),
  };
  const { transfers, attempts } = await runAll(() => client.startSession(), io);
  t.diagnostic(`${transfers.length} transactions, ${attempts} attempts (${attempts - transfers.length} retried after conflicts)`);
  checkSerializable(await accounts.find().sort({ _id: 1 }).toArray(), await ledger.find().toArray(), transfers);
  await db.dropDatabase();
});

test('mongoose: 20 sessions of conflicting transfers end in a serializable state', { timeout: 180000 }, async (t) => {
  const dbName = uniqueDbName('xfer_mg');
  const conn = await mongoose.createConnection(server.uri, { dbName, serverSelectionTimeoutMS: 10000, maxPoolSize: 40 })
    .asPromise();
  try {
    const Account = conn.model('Account', new mongoose.Schema({ _id: String, balance: Number, version: Number },
      { versionKey: false }));
    const Ledger = conn.model('Ledger', new mongoose.Schema({ _id: String, status: String, from: String, to: String,
      amount: Number, read: mongoose.Schema.Types.Mixed }, { versionKey: false }), 'ledger');
    await Account.insertMany(ACCOUNTS.map((a) => ({ _id: a, balance: INITIAL, version: 0 })));
    await Ledger.createCollection();
    const io = {
      get: (id, session) => Account.findById(id).session(session).lean(),
      bump: async (id, version, delta, session) => (await Account.updateOne({ _id: id, version },
        { $inc: { balance: delta, version: 1 } }).session(session)).matchedCount,
      record: (doc, session) => Ledger.create([doc], { session }),
    };
    const { transfers, attempts } = await runAll(() => conn.startSession(), io);
    t.diagnostic(`${transfers.length} transactions, ${attempts} attempts (${attempts - transfers.length} retried after conflicts)`);
    checkSerializable(await Account.find().sort({ _id: 1 }).lean(), await Ledger.find().lean(), transfers);
    await conn.dropDatabase();
  } finally {
    await conn.close();
  }
});
