'use strict';
// The handshake persona: through the proxy, hello (all spellings, OP_MSG and legacy OP_QUERY)
// answers as a mongos: msg "isdbgrid", no replica-set identity, limits from the upstream, the
// proxy's own compression choice. A real driver then sees a Sharded topology.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const H = require('../lib/proxy');

const RS_FIELDS = [
  'setName',
  'setVersion',
  'electionId',
  'hosts',
  'passives',
  'arbiters',
  'primary',
  'me',
  'secondary',
  'tags',
  'lastWrite',
  'topologyVersion',
];
const FROM_UPSTREAM = ['maxWireVersion', 'minWireVersion', 'maxBsonObjectSize', 'maxMessageSizeBytes', 'maxWriteBatchSize', 'logicalSessionTimeoutMinutes'];

let upstream;
let proxy;
let upstreamHello;

test.before(async () => {
  upstream = await H.startUpstream();
  proxy = await H.startProxy({ upstream: upstream.uri, settings: { compressors: 'zlib,zstd,snappy' } });
  // The upstream's own hello, for the fields the proxy must pass through.
  const direct = new MongoClient(upstream.directUri, { serverSelectionTimeoutMS: 10000 });
  try {
    upstreamHello = await direct.db('admin').command({ hello: 1 });
  } finally {
    await direct.close();
  }
});

function assertMongosPersona(doc, what) {
  assert.equal(doc.ok, 1, `${what}: ok`);
  assert.equal(doc.msg, 'isdbgrid', `${what}: msg must be "isdbgrid"`);
  for (const f of RS_FIELDS) {
    assert.ok(!(f in doc), `${what}: replica-set field ${f} must be removed, got ${JSON.stringify(doc[f])}`);
  }
  assert.ok(doc.$clusterTime && doc.$clusterTime.clusterTime, `${what}: $clusterTime passes through (drivers gossip it)`);
  assert.ok(doc.operationTime, `${what}: operationTime passes through`);
  for (const f of FROM_UPSTREAM) {
    assert.ok(f in doc, `${what}: ${f} must be present`);
    assert.equal(Number(doc[f]), Number(upstreamHello[f]), `${what}: ${f} must come from the upstream`);
  }
}

test('upstream itself reports a replica set (so the rewrite is observable)', () => {
  assert.ok(upstreamHello.setName, 'the upstream hello has setName');
  assert.ok(Array.isArray(upstreamHello.hosts) && upstreamHello.hosts.length > 0, 'the upstream hello has hosts');
});

test('OP_MSG hello through the proxy is a mongos hello', async () => {
  const c = await H.WireConn.connect({ port: proxy.port });
  try {
    const r = await c.request({ hello: 1, helloOk: true, $db: 'admin' });
    assert.equal(r.opCode, H.OP_MSG, 'an OP_MSG hello is answered with OP_MSG');
    assertMongosPersona(r.doc, 'hello');
    assert.equal(r.doc.isWritablePrimary, true, 'isWritablePrimary');
    assert.equal(r.doc.helloOk, true, 'helloOk echoed when asked');
    assert.ok(!('compression' in r.doc) || r.doc.compression.length === 0, 'no compression when the client offered none');
  } finally {
    c.destroy();
  }
});

test('legacy OP_QUERY isMaster is answered with OP_REPLY in the mongos persona', async () => {
  const c = await H.WireConn.connect({ port: proxy.port });
  try {
    const r = await c.request({ isMaster: 1, helloOk: true, client: { driver: { name: 'rb-it', version: '0' }, os: { type: 'linux' } } }, { legacy: true });
    assert.equal(r.opCode, H.OP_REPLY, 'OP_QUERY hello is answered with OP_REPLY');
    assert.equal(r.numberReturned, 1, 'numberReturned');
    assert.equal(r.cursorId, 0n, 'cursorID');
    assertMongosPersona(r.doc, 'isMaster');
    assert.equal(r.doc.ismaster, true, 'ismaster: true for the legacy name');
    // After the legacy handshake, OP_MSG works on the same connection.
    const ping = await c.command({ ping: 1, $db: 'admin' });
    assert.equal(ping.ok, 1, 'ping after legacy hello');
  } finally {
    c.destroy();
  }
});

test('every later hello on the connection (hello, isMaster, ismaster) is rewritten too', async () => {
  const c = await H.WireConn.connect({ port: proxy.port });
  try {
    for (const name of ['hello', 'isMaster', 'ismaster', 'hello']) {
      const doc = await c.command({ [name]: 1, $db: 'admin' });
      assertMongosPersona(doc, name);
    }
  } finally {
    c.destroy();
  }
});

test('compression: the reply lists the proxy choice among what the client offered', async () => {
  const cases = [
    { offer: ['zlib'], expect: ['zlib'] },
    { offer: ['zstd'], expect: ['zstd'] },
    { offer: ['snappy'], expect: ['snappy'] },
    { offer: ['bogus'], expect: [] },
  ];
  for (const { offer, expect } of cases) {
    const c = await H.WireConn.connect({ port: proxy.port });
    try {
      const doc = await c.command({ hello: 1, compression: offer, $db: 'admin' });
      assertMongosPersona(doc, `hello offering ${offer}`);
      assert.deepEqual(doc.compression || [], expect, `offer ${JSON.stringify(offer)}`);
    } finally {
      c.destroy();
    }
  }
  const c = await H.WireConn.connect({ port: proxy.port });
  try {
    const doc = await c.command({ hello: 1, compression: ['snappy', 'bogus', 'zlib'], $db: 'admin' });
    const got = doc.compression || [];
    assert.ok(got.length >= 1, 'some compressor is chosen when the client offers snappy and zlib');
    for (const x of got) assert.ok(['snappy', 'zlib'].includes(x), `${x} was offered by the client`);
  } finally {
    c.destroy();
  }
});

test('compressors = zlib in the config: the proxy offers nothing else', async () => {
  const p2 = await H.startProxy({ upstream: upstream.uri, settings: { compressors: 'zlib' } });
  const c = await H.WireConn.connect({ port: p2.port });
  try {
    const doc = await c.command({ hello: 1, compression: ['zstd', 'snappy', 'zlib'], $db: 'admin' });
    assert.deepEqual(doc.compression, ['zlib']);
  } finally {
    c.destroy();
  }
  await p2.stop();
});

test('compressors empty in the config: no compression is negotiated', async () => {
  const p3 = await H.startProxy({ upstream: upstream.uri, settings: { compressors: '' } });
  const c = await H.WireConn.connect({ port: p3.port });
  try {
    const doc = await c.command({ hello: 1, compression: ['zstd', 'snappy', 'zlib'], $db: 'admin' });
    assert.ok(!('compression' in doc) || doc.compression.length === 0, `no compressor offered: ${JSON.stringify(doc.compression)}`);
  } finally {
    c.destroy();
  }
  await p3.stop();
});

test('maxWireVersion comes from the upstream (a double advertising 17)', async (t) => {
  const skip = H.doubleOnlySkipReason('--max-wire-version');
  if (skip) return t.skip(skip);
  const d17 = await H.startDouble({ args: ['--max-wire-version', '17'] });
  try {
    const p4 = await H.startProxy({ upstream: d17.uri });
    const c = await H.WireConn.connect({ port: p4.port });
    try {
      const doc = await c.command({ hello: 1, $db: 'admin' });
      assert.equal(doc.maxWireVersion, 17);
      assert.equal(doc.msg, 'isdbgrid');
    } finally {
      c.destroy();
    }
    await p4.stop();
  } finally {
    await d17.stop();
  }
});

test('the Node.js driver sees a Sharded topology and a mongos server', async () => {
  const events = [];
  const client = new MongoClient(proxy.uri(), { serverSelectionTimeoutMS: 10000, heartbeatFrequencyMS: 500 });
  client.on('topologyDescriptionChanged', (e) => events.push(e.newDescription));
  const beats = [];
  client.on('serverHeartbeatSucceeded', (e) => beats.push(e.reply));
  try {
    await client.db('admin').command({ ping: 1 });
    const last = events[events.length - 1];
    assert.equal(last.type, 'Sharded', 'topology type');
    const servers = [...last.servers.values()];
    assert.equal(servers.length, 1, 'exactly the proxy');
    assert.equal(servers[0].type, 'Mongos', 'server type');
    // Wait for two monitoring polls: later hellos must also keep the persona.
    const deadline = Date.now() + 5000;
    while (beats.length < 2 && Date.now() < deadline) await H.sleep(100);
    assert.ok(beats.length >= 2, `at least two heartbeats, got ${beats.length}`);
    for (const b of beats) {
      assert.equal(b.msg, 'isdbgrid', 'heartbeat reply msg');
      assert.ok(!('setName' in b), 'heartbeat reply has no setName');
      assert.ok(!('topologyVersion' in b), 'no topologyVersion, so the driver polls');
    }
    const hello = await client.db('admin').command({ hello: 1 });
    assertMongosPersona(hello, 'hello via runCommand');
  } finally {
    await client.close();
  }
});

test('a replicaSet= connection string to the proxy finds no primary (documented consequence)', async () => {
  // Drivers drop a mongos from a replica-set topology: users must remove replicaSet=.
  const client = new MongoClient(proxy.uri({ replicaSet: 'rs0' }), { serverSelectionTimeoutMS: 1500 });
  try {
    await assert.rejects(client.db('admin').command({ ping: 1 }), /Server selection timed out|ServerSelection/i);
  } finally {
    await client.close();
  }
});

H.registerFinalChecks(test, [() => upstream && upstream.stop()]);
