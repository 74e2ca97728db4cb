'use strict';
// Handlers reload on SIGHUP, without a restart: a running proxy gains a webhook handler, loses
// one and changes a secret. A client connection opened before the reload keeps working; the
// events published after it get deliveries for the new set only, the changed handler's requests
// are signed with the new secret (checked with the npm `standardwebhooks` verifier), and the
// removed handler gets nothing new. A configuration with an invalid handler is refused whole:
// the next events still follow the set in force. A removed handler's lanes (its own lane space)
// are handed back when its last request ends, not left to their lease.

const fs = require('node:fs');
const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const H = require('../lib/proxy');
const { startDispatchProxy, publishThroughProxy, waitFor, newSecret, startReceiver, verifies } = require('./helpers');
const { startSink } = require('./sink');

const ids = (sink) => new Set(sink.requests.map((q) => q.id));
const signedBy = (secret, q) => verifies(secret, q.body, q.headers);

/** The proxy's file with its [handler ...] sections replaced by `handlers`. */
function withHandlers(ini, handlers) {
  const head = ini.slice(0, ini.indexOf('\n[handler ') + 1);
  const parts = handlers.map((h) => [`[handler ${h.name}]`, ...Object.entries(h).filter(([k]) => k !== 'name').map(([k, v]) => `${k} = ${v}`)].join('\n'));
  return `${head}${parts.join('\n\n')}\n`;
}

const events = (tag, n) => Array.from({ length: n }, (_, i) => ({ id: `${tag}-${i}`, type: 'order.placed.v1', key: `k${i % 2}`, payload: { i } }));

test('SIGHUP: handlers are added, removed and re-keyed without a restart', { timeout: 180000 }, async (t) => {
  const up = await H.startUpstream();
  t.after(() => up.stop());
  const [a, b, c] = [await startReceiver(), await startReceiver(), await startReceiver()];
  t.after(() => Promise.all([a.close(), b.close(), c.close()]));
  const s1 = newSecret();
  const s2 = newSecret();
  const db = H.uniqueDbName('dispatch_reload_handlers');
  const common = { events: 'order.*', kind: 'webhook', retry_schedule: '100ms' };
  const p = await startDispatchProxy({
    upstream: up.uri,
    outbox: { database: db, handler_heartbeat: '1s' },
    dispatch: { poll_interval_ms: 100 },
    handlers: [
      { name: 'alpha', url: a.url('/hook'), secret: s1, ...common },
      { name: 'beta', url: b.url('/hook'), secret: newSecret(), ...common },
    ],
  });
  t.after(() => p.kill());
  const client = await new MongoClient(`mongodb://127.0.0.1:${p.port}/?directConnection=true`, { serverSelectionTimeoutMS: 10000 }).connect();
  t.after(() => client.close());
  const direct = await new MongoClient(up.directUri || up.uri).connect();
  t.after(() => direct.close());
  // A connection opened before the reload; it must survive it.
  const wire = await H.WireConn.connect({ port: p.port });
  t.after(() => wire.destroy());
  assert.equal((await wire.command({ hello: 1, $db: 'admin' })).ok, 1);

  const before = events('before', 6);
  await publishThroughProxy(client, db, before);
  await waitFor(() => before.every((e) => ids(a).has(e.id) && ids(b).has(e.id)), 30000, 'alpha and beta get the first events');
  assert.ok(a.requests.every((r) => signedBy(s1, r)), 'alpha signs with its first secret');

  // beta removed, gamma added, alpha's secret changed.
  const ini = fs.readFileSync(p.ini, 'utf8');
  fs.writeFileSync(p.ini, withHandlers(ini, [
    { name: 'alpha', url: a.url('/hook'), secret: s2, ...common },
    { name: 'gamma', url: c.url('/hook'), secret: newSecret(), ...common },
  ]));
  p.child.kill('SIGHUP');
  await waitFor(() => /dispatch: handlers: 2 \(1 added, 1 changed, 1 removed\)/.test(p.log()), 10000, `the dispatcher's new handler set:\n${p.log().slice(-3000)}`);
  assert.match(p.log(), /reloaded .*\(existing connections keep their settings\)/);
  // This instance records the new set in the fleet's handlers collection (the set injection
  // everywhere follows); then the events published through it get deliveries for it.
  const fleetDocs = direct.db(db).collection('relaybus_handlers');
  await waitFor(async () => {
    const docs = await fleetDocs.find({ _id: { $type: 'string' } }).toArray(); // the instance documents
    return docs.length === 1 && docs[0].handlers.map((h) => h.name).sort().join() === 'alpha,gamma';
  }, 10000, 'the fleet record shows alpha and gamma');
  await H.sleep(500);

  const after = events('after', 6);
  await publishThroughProxy(client, db, after);
  await waitFor(() => after.every((e) => ids(a).has(e.id) && ids(c).has(e.id)), 30000, 'alpha and gamma get the events after the reload');
  const dels = await direct.db(db).collection('relaybus_events').find({ _id: { $in: after.map((e) => e.id) } }).toArray();
  for (const ev of dels) assert.deepEqual([...ev.handlers].sort(), ['alpha', 'gamma'], `the deliveries of ${ev._id}`);
  await H.sleep(500);
  assert.ok(after.every((e) => !ids(b).has(e.id)), 'the removed handler gets nothing new');
  const alphaAfter = a.requests.filter((r) => r.id.startsWith('after-'));
  assert.ok(alphaAfter.length >= after.length);
  assert.ok(alphaAfter.every((r) => signedBy(s2, r) && !signedBy(s1, r)), 'alpha signs with its new secret only');
  assert.equal((await wire.command({ ping: 1, $db: 'admin' })).ok, 1, 'the connection opened before the reload still works');

  // An invalid handler: refused whole, nothing changes.
  fs.writeFileSync(p.ini, withHandlers(ini, [
    { name: 'alpha', url: a.url('/hook'), secret: s1, ...common },
    { name: 'delta', url: c.url('/hook'), secret: 'not-a-secret', ...common },
  ]));
  p.child.kill('SIGHUP');
  await waitFor(() => /reload: keeping the current configuration: .*delta/.test(p.log()), 10000, `the refused reload:\n${p.log().slice(-2000)}`);
  const third = events('third', 4);
  await publishThroughProxy(client, db, third);
  await waitFor(() => third.every((e) => ids(a).has(e.id) && ids(c).has(e.id)), 30000, 'the set in force still gets the events');
  assert.ok(a.requests.filter((r) => r.id.startsWith('third-')).every((r) => signedBy(s2, r)), 'still the new secret');
  assert.ok(third.every((e) => !ids(b).has(e.id)));
  assert.equal((await wire.command({ ping: 1, $db: 'admin' })).ok, 1);
  const r = await p.stop();
  assert.equal(r.code, 0);
});

test('SIGHUP: a removed handler\'s lanes are handed back when its last request ends, not left to their lease',
  { timeout: 90000 }, async (t) => {
    const up = await H.startUpstream();
    t.after(() => up.stop());
    const slow = await startSink({ delayMs: 3000 });
    const fast = await startSink({});
    t.after(() => { slow.close(); fast.close(); });
    const db = H.uniqueDbName('dispatch_reload_lanes');
    const common = { events: 'order.*', kind: 'webhook' };
    const p = await startDispatchProxy({
      upstream: up.uri,
      outbox: { database: db, handler_heartbeat: '1s' },
      dispatch: { poll_interval_ms: 100, lease_ms: 30000 },
      handlers: [
        { name: 'fast', url: fast.url('/fast'), ...common },
        { name: 'slow', url: slow.url('/slow'), timeout_ms: 10000, ...common },
      ],
    });
    t.after(() => p.kill());
    const client = await new MongoClient(`mongodb://127.0.0.1:${p.port}/?directConnection=true`, { serverSelectionTimeoutMS: 10000 }).connect();
    t.after(() => client.close());
    const direct = await new MongoClient(up.directUri || up.uri).connect();
    t.after(() => direct.close());
    // slow's own lanes (documents that name it), held under a live lease.
    const lanes = direct.db(db).collection('relaybus_lanes');
    const slowHeld = () => lanes.countDocuments({ handler: 'slow', owner: { $type: 'string' }, leaseExpiresAt: { $gt: new Date() } });

    const id = `lanes-0-${process.pid}`;
    await publishThroughProxy(client, db, [{ id, type: 'order.placed.v1', key: 'k', payload: {} }]);
    await waitFor(() => slow.stats().pendingNow > 0, 10000, 'the slow handler\'s request to start');
    assert.ok((await slowHeld()) > 0, 'the slow handler holds its lane while its request runs');

    // slow removed while its request runs: the request finishes, then its lanes go back at once.
    fs.writeFileSync(p.ini, withHandlers(fs.readFileSync(p.ini, 'utf8'), [{ name: 'fast', url: fast.url('/fast'), ...common }]));
    p.child.kill('SIGHUP');
    await waitFor(() => /dispatch: handlers: 1 \(0 added, 0 changed, 1 removed\)/.test(p.log()), 10000, `the new handler set:\n${p.log().slice(-2000)}`);
    await waitFor(() => slow.stats().ok.has(id), 10000, 'the slow request to finish');
    const finished = Date.now();
    await waitFor(async () => (await slowHeld()) === 0, 10000, 'the removed handler\'s lanes to be handed back');
    t.diagnostic(`the removed handler's lanes were handed back ${Date.now() - finished} ms after its last request (lease 30 s)`);
    assert.match(p.log(), /handed back the lanes of removed handler slow/);
    assert.equal((await p.stop()).code, 0);
  });
