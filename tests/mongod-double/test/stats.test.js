'use strict';
// doubleStats' error counts: every error reply by code, in total and by the appName of the
// connection's hello, zeroed by reset: true (the integration harness reads them to fail a test
// file in which the proxy's own connections got a parse error).

const test = require('node:test');
const assert = require('node:assert/strict');
const { Int32 } = require('bson');
const { startDouble, startSharded, rawConnect } = require('./helpers');

const num = (v) => Number(v);

async function connect(port, appName) {
  const c = await rawConnect(port);
  const h = await c.command({ hello: 1, client: { application: { name: appName } }, $db: 'admin' });
  assert.equal(num(h.ok), 1);
  return c;
}

test('error replies are counted by code and by appName; reset zeroes them', async () => {
  const d = await startDouble();
  const a = await connect(d.port, 'relaybus-proxy dispatch');
  const b = await connect(d.port, 'someone else');
  const admin = await rawConnect(d.port);
  try {
    const bad = { update: 'c', updates: [{ q: {}, u: { $set: { a: 1 } }, maxTimeMS: new Int32(1000) }], $db: 'x' };
    assert.equal(num((await a.command(bad)).code), 40415);
    assert.equal(num((await a.command(bad)).code), 40415);
    assert.equal(num((await a.command({ nosuchcommand: 1, $db: 'x' })).code), 59);
    assert.equal(num((await b.command({ find: 'c', filter: 'x', $db: 'x' })).code), 14);
    assert.equal(num((await b.command({ ping: 1, $db: 'x' })).ok), 1);
    const s = await admin.command({ doubleStats: 1, $db: 'admin' });
    assert.deepEqual(JSON.parse(JSON.stringify(s.errors)), {
      byCode: { 40415: 2, 59: 1, 14: 1 },
      byApp: { 'relaybus-proxy dispatch': { 40415: 2, 59: 1 }, 'someone else': { 14: 1 } },
    });
    const r = await admin.command({ doubleStats: 1, reset: true, $db: 'admin' });
    assert.equal(num(r.errors.byCode['40415']), 2, 'reset returns the counts it zeroes');
    const z = await admin.command({ doubleStats: 1, $db: 'admin' });
    assert.deepEqual(JSON.parse(JSON.stringify(z.errors)), { byCode: {}, byApp: {} });
  } finally {
    for (const c of [a, b, admin]) c.close();
    assert.equal(await d.stop(), 0);
  }
});

test('through a mongos: the mongos counts what it answered, the shard what the mongos sent it', async () => {
  const s = await startSharded();
  const m = await connect(s.port, 'relaybus-proxy');
  const stats = async (port) => {
    const c = await rawConnect(port);
    try {
      return JSON.parse(JSON.stringify((await c.command({ doubleStats: 1, $db: 'admin' })).errors));
    } finally {
      c.close();
    }
  };
  try {
    assert.equal(num((await m.command({ delete: 'c', deletes: [{ q: {} }], $db: 'x' })).code), 40414);
    assert.deepEqual((await stats(s.port)).byApp, { 'relaybus-proxy': { 40414: 1 } });
    // A duplicate key on a shard comes back through the mongos: both count it.
    assert.equal(num((await m.command({ insert: 'c', documents: [{ _id: 1 }], $db: 'x' })).ok), 1);
    const dup = await m.command({ insert: 'c', documents: [{ _id: 1 }], $db: 'x' });
    assert.equal(num(dup.ok), 1, 'a duplicate key is a write error, not an error reply');
    assert.equal(num((await m.command({ find: 'c', filter: {}, sort: 'x', $db: 'x' })).code), 14);
    assert.deepEqual((await stats(s.port)).byApp, { 'relaybus-proxy': { 40414: 1, 14: 1 } });
    // An error of a shard (an index name taken by another key) is counted on the shard
    // member, under the client's appName, and again by the mongos that relays it.
    const ix = (key) => m.command({ createIndexes: 'c', indexes: [{ key, name: 'k' }], $db: 'x' });
    assert.equal(num((await ix({ a: new Int32(1) })).ok), 1);
    assert.equal(num((await ix({ b: new Int32(1) })).code), 86);
    let onShards = 0;
    for (const sh of s.shards) {
      const e = await stats(sh.port);
      onShards += e.byApp['relaybus-proxy'] ? num(e.byApp['relaybus-proxy']['86'] || 0) : 0;
    }
    assert.equal(onShards, 1);
    assert.deepEqual((await stats(s.port)).byApp, { 'relaybus-proxy': { 40414: 1, 14: 1, 86: 1 } });
  } finally {
    m.close();
    assert.equal(await s.stop(), 0);
  }
});
