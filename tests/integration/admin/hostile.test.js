'use strict';
// Hostile input on the admin port: filters sent as operators (status[$ne]=x), JSON bodies whose
// ids are objects, oversized and malformed bodies, a client that connects and sends nothing, a
// connection flood. None of it reaches a query as an operator (checked by effect: an operator
// would have matched deliveries, or changed them), each gets a 4xx or is dropped after the
// timeout, and the proxy keeps serving, the admin port and forwarding alike.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const { startUpstream, uniqueDbName, sleep } = require('../lib/proxy');
const { startAdminProxy, request, rawExchange, publish, waitFor, logShows } = require('./helpers');

const TOKEN = 'hostile-test-token';

test('hostile admin requests get 400s or timeouts and change nothing', { timeout: 180000 }, async (t) => {
  const up = await startUpstream();
  t.after(() => up.stop());
  const db = uniqueDbName('adminhostile');
  // A pull handler: its deliveries stay pending, so every count below is stable.
  const proxy = await startAdminProxy({
    upstream: up.uri, token: TOKEN, outbox: { database: db }, dispatch: false,
    handlers: [{ name: 'audit', events: '*', kind: 'pull' }],
  });
  t.after(() => proxy.kill());
  // Bounded: after hooks may stop the double before this client closes.
  const client = await new MongoClient(up.uri, { serverSelectionTimeoutMS: 3000 }).connect();
  t.after(() => client.close());
  const events = [];
  for (let i = 0; i < 6; i++) events.push({ id: `h-${i}`, type: 'thing.v1', key: `k${i}`, payload: { i } });
  await publish(client, db, events, ['audit'], 6);
  // Two of them dead, so requeue has something an operator-shaped id could hit.
  await client.db(db).collection('relaybus_deliveries').updateMany({ eventId: { $in: ['h-0', 'h-1'] } },
    { $set: { status: 'dead', lastError: 'test' }, $unset: { lane: '' } });
  const get = (p) => request(proxy.base, p, { token: TOKEN });
  const post = (p, body, headers = {}) => request(proxy.base, p, { method: 'POST', token: TOKEN, body, headers: { 'content-type': 'application/json', ...headers } });
  const counts = async () => {
    const s = (await get('/api/stats')).json;
    return { pending: s.outbox.pending, dead: s.outbox.dead };
  };
  assert.deepEqual(await counts(), { pending: 4, dead: 2 });

  await t.test('query filters shaped like operators are refused or stay strings', async () => {
    const refused = [
      '/api/deliveries?status[$ne]=x',
      '/api/deliveries?status%5B%24ne%5D=x',
      '/api/deliveries?handler[$ne]=x',
      '/api/deliveries?eventType[$regex]=.*',
      '/api/deliveries?key[$gt]=',
      '/api/deliveries?status=dead&status=pending',
      '/api/deliveries?status={"$ne":"x"}',
      '/api/deliveries?limit=100000',
      '/api/deliveries?limit=-1',
      '/api/deliveries?limit=1e3',
      '/api/deliveries?after={"$gt":0}',
      '/api/deliveries?after=1.zzzzzzzzzzzzzzzzzzzzzzzz',
      '/api/deliveries?$where=1',
      `/api/deliveries?handler=${'x'.repeat(300)}`,
      '/api/deliveries?handler=%ff%fe',
      '/api/clients?limit=abc',
      '/api/clients?nope=1',
    ];
    for (const p of refused) {
      const r = await get(p);
      assert.equal(r.status, 400, `${p}: ${r.status} ${r.text}`);
      assert.equal(typeof r.json.error, 'string');
    }
    // As strings they are harmless values: {"$ne":"x"} names no handler, so nothing matches,
    // where the operator would have matched all six.
    for (const v of ['{"$ne":"x"}', '{"$gt":""}', '.*', '$ne']) {
      for (const f of ['handler', 'eventType', 'eventId', 'key']) {
        const r = await get(`/api/deliveries?${f}=${encodeURIComponent(v)}`);
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json.count, 0, `${f}=${v} matched ${r.json.count}`);
      }
    }
    assert.equal((await get('/api/deliveries?handler=audit')).json.count, 6);
  });

  await t.test('requeue, bury and purge refuse ids and values that are not plain strings', async () => {
    const id = '0123456789abcdef01234567';
    const bodies = [
      ['{"ids":[{"$ne":null}]}', /ids\[0\] is not a string/],
      ['{"ids":{"$in":["0123456789abcdef01234567"]}}', /must be an array/],
      ['{"ids":[{"$oid":"0123456789abcdef01234567"}]}', /ids\[0\] is not a string/],
      ['{"ids":[{"$regex":".*"}]}', /.*/],
      ['{"ids":"0123456789abcdef01234567"}', /must be an array/],
      ['{"ids":[123]}', /not a string/],
      ['{"ids":[null]}', /not a string/],
      ['{"ids":["abc"]}', /not a delivery id/],
      ['{"ids":["0123456789abcdef0123456z"]}', /not a delivery id/],
      ['{"ids":[]}', /empty/],
      [`{"ids":["${id}"],"$where":"1"}`, /unknown field/],
      [`{"ids":["${id}"],"filter":{"status":"dead"}}`, /unknown field/],
      ['{"ids":', /malformed JSON/],
      ['not json at all', /must be a JSON object/],
      ['[1,2,3]', /must be a JSON object/],
      ['"ids"', /must be a JSON object/],
      ['', /empty body/],
      [`{"ids":[${Array(1001).fill(`"${id}"`).join(',')}]}`, /at most 1000/],
    ];
    for (const [body, re] of bodies) {
      for (const p of ['/api/deliveries/requeue', '/api/deliveries/bury']) {
        const r = await post(p, body);
        assert.equal(r.status, 400, `${p} ${body.slice(0, 60)}: ${r.status} ${r.text}`);
        assert.match(r.json.error, re, body.slice(0, 60));
      }
    }
    for (const body of ['{"deadBefore":{"$gt":0}}', '{"deadBefore":"yesterday"}', '{"deadBefore":-5}', '{}',
      '{"completedBefore":[1]}', '{"deadBefore":"2026-13-01T00:00:00Z"}', '{"olderThan":1}']) {
      const r = await post('/api/purge', body);
      assert.equal(r.status, 400, `purge ${body}: ${r.status} ${r.text}`);
    }
    const bury = await post('/api/deliveries/bury', `{"ids":["${id}"],"reason":{"$set":{"status":"x"}}}`);
    assert.equal(bury.status, 400);
    // Wrong content type: 415, whatever the body.
    const ct = await post('/api/deliveries/requeue', `{"ids":["${id}"]}`, { 'content-type': 'text/plain' });
    assert.equal(ct.status, 415);
    const form = await post('/api/purge', 'deadBefore=1', { 'content-type': 'application/x-www-form-urlencoded' });
    assert.equal(form.status, 415);
    // Nothing changed.
    assert.deepEqual(await counts(), { pending: 4, dead: 2 });
  });

  await t.test('oversized bodies and headers are refused', async () => {
    const big = `{"ids":["${'a'.repeat(200000)}"]}`;
    const r = await post('/api/deliveries/requeue', big).catch((e) => ({ status: 'error', text: e.message }));
    assert.ok(r.status === 413 || r.status === 400 || r.status === 'error', `oversized body: ${r.status}`);
    const h = await request(proxy.base, '/api/stats', { token: TOKEN, headers: { 'x-junk': 'j'.repeat(20000) } })
      .catch((e) => ({ status: 'error', text: e.message }));
    assert.ok(h.status === 400 || h.status === 413 || h.status === 431 || h.status === 'error', `oversized header: ${h.status}`);
    // Raw garbage on the socket.
    const g = await rawExchange(proxy.adminPort, Buffer.from('\x00\x01\x02 GARBAGE\r\n\r\n'), { timeoutMs: 8000 });
    assert.ok(g.closedByPeer, 'garbage: connection closed');
    assert.ok(/^HTTP\/1\.[01] 400/.test(g.text) || g.text === '', `garbage answered ${JSON.stringify(g.text.slice(0, 80))}`);
    assert.deepEqual(await counts(), { pending: 4, dead: 2 });
  });

  await t.test('a client that connects and sends nothing, or stalls mid-request, is dropped', async () => {
    const [silent, partial] = await Promise.all([
      rawExchange(proxy.adminPort, null, { timeoutMs: 15000 }),
      rawExchange(proxy.adminPort, Buffer.from('GET /api/stats HTTP/1.1\r\nHost: x\r\n'), { timeoutMs: 15000 }),
    ]);
    assert.ok(silent.closedByPeer, 'the silent client is closed by the proxy');
    assert.ok(silent.ms >= 3000 && silent.ms < 12000, `silent closed after ${silent.ms} ms`);
    assert.ok(partial.closedByPeer, 'the stalled request is closed by the proxy');
    assert.ok(partial.ms < 12000, `stalled closed after ${partial.ms} ms`);
  });

  await t.test('a flood of idle connections is bounded and the port recovers', async () => {
    const net = require('node:net');
    const socks = [];
    for (let i = 0; i < 90; i++) {
      socks.push(await new Promise((resolve) => {
        const s = net.connect({ host: '127.0.0.1', port: proxy.adminPort }, () => resolve(s));
        s.on('error', () => {});
        s.closedAt = null;
        s.on('close', () => { s.closedAt = Date.now(); });
      }));
    }
    await sleep(500);
    const closedEarly = socks.filter((s) => s.closedAt).length;
    assert.ok(closedEarly >= 90 - 64, `only ${closedEarly} of 90 idle connections were refused at once`);
    // Forwarding is not affected meanwhile.
    const c = await new MongoClient(proxy.uri(), { serverSelectionTimeoutMS: 5000 }).connect();
    assert.equal((await c.db('admin').command({ ping: 1 })).ok, 1);
    await c.close();
    for (const s of socks) s.destroy();
    await waitFor(async () => (await request(proxy.base, '/healthz').catch(() => ({}))).status === 200, 15000, 'healthz again');
  });

  await t.test('afterwards everything still works', async () => {
    assert.equal((await request(proxy.base, '/healthz')).status, 200);
    assert.equal((await request(proxy.base, '/readyz')).status, 200);
    assert.deepEqual(await counts(), { pending: 4, dead: 2 });
    const deadIds = (await get('/api/deliveries?status=dead')).json.deliveries.map((d) => d.id);
    const ok = await post('/api/deliveries/requeue', JSON.stringify({ ids: deadIds }));
    assert.equal(ok.status, 200, ok.text);
    assert.deepEqual(ok.json, { requested: 2, requeued: 2, ids: deadIds });
    assert.deepEqual(await counts(), { pending: 6, dead: 0 });
    const r = await proxy.stop();
    assert.equal(r.code, 0, proxy.log().slice(-3000));
  });
});

test('without a token, actions must name the port by address (DNS rebinding)', { timeout: 60000 }, async (t) => {
  const up = await startUpstream();
  t.after(() => up.stop());
  const proxy = await startAdminProxy({ upstream: up.uri, outbox: { database: uniqueDbName('adminhost') }, dispatch: false });
  t.after(() => proxy.kill());
  const body = JSON.stringify({ ids: ['0123456789abcdef01234567'] });
  const ct = { 'content-type': 'application/json' };
  // Reads need no token here.
  assert.equal((await request(proxy.base, '/api/stats')).status, 200);
  for (const host of ['evil.example', 'evil.example:80', `rebind.attacker.test:${proxy.adminPort}`]) {
    const r = await request(proxy.base, '/api/deliveries/requeue', { method: 'POST', body, headers: { ...ct, host } });
    assert.equal(r.status, 403, `Host ${JSON.stringify(host)}: ${r.status} ${r.text}`);
  }
  for (const host of [`127.0.0.1:${proxy.adminPort}`, `localhost:${proxy.adminPort}`, 'LOCALHOST', '[::1]:27118']) {
    const r = await request(proxy.base, '/api/deliveries/requeue', { method: 'POST', body, headers: { ...ct, host } });
    assert.equal(r.status, 200, `Host ${host}: ${r.status} ${r.text}`);
    assert.deepEqual(r.json, { requested: 1, requeued: 0, ids: [] });
  }
  await logShows(proxy, /403 for POST \/api\/deliveries\/requeue/);
  const r = await proxy.stop();
  assert.equal(r.code, 0);
});
