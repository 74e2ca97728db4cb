'use strict';
// Failover through the proxy: the primary steps down while an application writes and reads
// through the proxy. A client that connects after the step-down is paired with the new primary
// within 2 s (the proxy re-learns the primary at once when it relays a not-primary error), and
// what the old primary answers the connections still paired with it reaches the application
// unchanged: the server's own codes (NotWritablePrimary 10107, NotPrimaryNoSecondaryOk 13435,
// InterruptedDueToReplStateChange 11602), which drivers act on. Every acknowledged insert is
// stored once.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const H = require('../lib/proxy');

const STATE_CHANGE_CODES = new Set([10107, 13435, 11602, 189, 91]);

let upstream;
let proxy;

test.before(async () => {
  upstream = await H.startUpstream();
  proxy = await H.startProxy({ upstream: upstream.uri });
});

test.after(async () => {
  if (proxy) await proxy.stop();
  if (upstream) await upstream.stop();
});

async function primaryOf(direct) {
  return (await direct.db('admin').command({ hello: 1 })).primary;
}

test('step-down: new clients pair with the new primary within 2 s; the old primary\'s errors are relayed unchanged', { timeout: 120000 }, async (t) => {
  const direct = await new MongoClient(upstream.uri).connect();
  t.after(() => direct.close());
  const db = H.uniqueDbName('failover');
  const client = await new MongoClient(H.clientUri(proxy, { appName: 'failover-app' })).connect();
  t.after(() => client.close());
  const coll = client.db(db).collection('items');
  let stop = false;
  let acked = 0;
  const errors = [];
  const writer = (async () => {
    for (let i = 0; !stop; i++) {
      try {
        await coll.insertOne({ _id: i });
        acked++;
      } catch (e) {
        errors.push(e);
      }
      await H.sleep(5);
    }
  })();
  while (acked < 50) await H.sleep(20);
  const before = await primaryOf(direct);
  const stepAt = Date.now();
  await direct.db('admin').command({ replSetStepDown: 30, secondaryCatchUpPeriodSecs: 10 });
  let pairedAt = null;
  while (!pairedAt && Date.now() - stepAt < 10000) {
    const fresh = new MongoClient(H.clientUri(proxy, { retryWrites: 'false', serverSelectionTimeoutMS: 2000 }));
    try {
      await fresh.connect();
      await fresh.db(db).collection('fresh').insertOne({ at: new Date() });
      pairedAt = Date.now();
    } catch (e) {
      t.diagnostic(`a new client at +${Date.now() - stepAt} ms: ${e.message}`);
      await H.sleep(100);
    } finally {
      await fresh.close();
    }
  }
  stop = true;
  await writer;
  const after = await primaryOf(direct);
  t.diagnostic(`primary ${before} -> ${after}; ${acked} inserts acknowledged; a new client wrote ${pairedAt - stepAt} ms after the step-down; ` +
    `${errors.length} error(s) reached the application: ${errors.map((e) => e.code).join(', ')}`);
  assert.notEqual(after, before, 'the primary changed');
  assert.ok(pairedAt && pairedAt - stepAt < 2000, `a new client wrote within 2 s of the step-down (${pairedAt && pairedAt - stepAt} ms)`);
  for (const e of errors) assert.ok(STATE_CHANGE_CODES.has(e.code), `relayed unchanged, with the server's code: ${e.code} ${e.message}`);
  assert.equal(await direct.db(db).collection('items').countDocuments({}), acked, 'every acknowledged insert is stored once');
  assert.equal(await direct.db(db).collection('fresh').countDocuments({}), 1);
});
