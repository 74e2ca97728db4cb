'use strict';
// The admin port's endpoints as docs/admin.md documents them, against a dispatching proxy with
// two handlers: "mailer" (a webhook whose sink answers 400 to some events, which makes them dead
// at once) and "audit" (a pull handler: its deliveries wait, a backlog). With a token set,
// /metrics and /api/* answer 401 without it or with a wrong one.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const { startUpstream, uniqueDbName } = require('../lib/proxy');
const { startSink } = require('../dispatch/sink');
const { startAdminProxy, request, publish, waitFor, logShows } = require('./helpers');

const TOKEN = 'admin-token-0123456789';

test('admin API: every endpoint, token checks, actions logged', { timeout: 120000 }, async (t) => {
  const up = await startUpstream();
  t.after(() => up.stop());
  let reject = (ev) => ev.payload && ev.payload.bad === true;
  const sink = await startSink({ answer400: (ev) => reject(ev) });
  t.after(() => sink.close());
  const db = uniqueDbName('admin');
  const proxy = await startAdminProxy({
    upstream: up.uri,
    token: TOKEN,
    outbox: { database: db },
    handlers: [
      { name: 'mailer', events: 'order.*', kind: 'webhook', url: sink.url('/mail'), max_attempts: 3, retry_4xx: false },
      { name: 'audit', events: '*', kind: 'pull' },
      // Never dispatched (no event type matches); its URL carries credentials the API must mask.
      { name: 'creds', events: 'never.v1', kind: 'webhook', url: 'http://hookuser:hook-pass-123@127.0.0.1:9/x' },
    ],
  });
  t.after(() => proxy.kill());
  // Bounded: after hooks may stop the double before this client closes.
  const client = await new MongoClient(up.uri, { serverSelectionTimeoutMS: 3000 }).connect();
  t.after(() => client.close());
  const get = (p, token = TOKEN) => request(proxy.base, p, { token });
  const post = (p, json, token = TOKEN) => request(proxy.base, p, { method: 'POST', json, token });

  const events = [];
  for (let i = 0; i < 5; i++) events.push({ id: `ev-${i}`, type: 'order.placed.v1', key: `k-${i}`, payload: { i, bad: i >= 3 } });
  await publish(client, db, events, ['mailer', 'audit'], 5);

  await t.test('health and readiness need no token', async () => {
    const h = await request(proxy.base, '/healthz');
    assert.equal(h.status, 200);
    assert.equal(h.text, 'ok\n');
    const r = await request(proxy.base, '/readyz');
    assert.equal(r.status, 200, r.text);
    assert.deepEqual(r.json, { ready: true, upstream: 'primary', outbox: true, fleet: true });
  });

  await t.test('without the token, or with a wrong one, /api/* and /metrics answer 401', async () => {
    for (const p of ['/api/stats', '/api/handlers', '/api/deliveries', '/api/lanes', '/api/clients', '/api/config', '/metrics']) {
      for (const token of [undefined, 'wrong', TOKEN + 'x', TOKEN.slice(0, -1), '']) {
        const r = await request(proxy.base, p, { token });
        assert.equal(r.status, 401, `${p} with token ${JSON.stringify(token)}`);
        assert.match(r.headers['www-authenticate'] || '', /^Bearer /);
      }
    }
    for (const p of ['/api/deliveries/requeue', '/api/deliveries/bury', '/api/purge']) {
      const r = await request(proxy.base, p, { method: 'POST', json: { ids: ['0'.repeat(24)] }, token: 'nope' });
      assert.equal(r.status, 401, p);
    }
    // Basic instead of Bearer, and the token in another header, are refused too.
    const basic = await request(proxy.base, '/api/stats', { headers: { authorization: `Basic ${Buffer.from('x:' + TOKEN).toString('base64')}` } });
    assert.equal(basic.status, 401);
  });

  await t.test('the bad events become dead letters; /api/stats shows backlog and dead per handler', async () => {
    await waitFor(async () => {
      const s = await get('/api/stats');
      const m = s.json.handlers.find((h) => h.name === 'mailer');
      // The dispatcher counts a burial just after writing it, and the outbox
      // totals and the per-handler figures are two queries that a burial can
      // fall between: wait until all of them show it.
      return m && m.dead === 2 && m.pending === 0 && s.json.dispatch.dead === 2 &&
        s.json.outbox.dead === 2 && s.json.outbox.pending === 5 && sink.stats().ok.size === 3;
    }, 20000, 'mailer: 2 dead, 0 pending');
    const s = (await get('/api/stats')).json;
    assert.equal(s.upstream.state, 'primary');
    assert.equal(s.outboxReady, true);
    const audit = s.handlers.find((h) => h.name === 'audit');
    assert.equal(audit.pending, 5);
    assert.ok(audit.oldestDueAgeMs >= 0);
    assert.equal(s.outbox.dead, 2);
    assert.equal(s.outbox.pending, 5);
    assert.equal(s.dispatch.dead, 2);
    assert.equal(typeof s.proxy.connections, 'number');
    assert.equal(sink.stats().ok.size, 3);
  });

  await t.test('/api/handlers lists the configured handlers with their settings', async () => {
    const r = await get('/api/handlers');
    assert.equal(r.status, 200);
    const names = r.json.handlers.map((h) => h.name).sort();
    assert.deepEqual(names, ['audit', 'creds', 'mailer']);
    assert.equal(r.json.handlers.find((h) => h.name === 'creds').url, 'http://hookuser:********@127.0.0.1:9/x');
    assert.ok(!r.text.includes('hook-pass-123'));
    const m = r.json.handlers.find((h) => h.name === 'mailer');
    assert.equal(m.kind, 'webhook');
    assert.equal(m.url, sink.url('/mail'));
    assert.equal(m.maxAttempts, 3);
    assert.equal(m.signed, false);
    assert.equal(m.dead, 2);
  });

  let deadIds;
  await t.test('/api/deliveries filters by status, handler and event type, and pages', async () => {
    const dead = await get('/api/deliveries?status=dead&handler=mailer');
    assert.equal(dead.status, 200);
    assert.equal(dead.json.count, 2);
    assert.equal(dead.json.next, null);
    for (const d of dead.json.deliveries) {
      assert.match(d.id, /^[0-9a-f]{24}$/);
      assert.equal(d.status, 'dead');
      assert.equal(d.handler, 'mailer');
      assert.match(d.lastError, /400/);
      assert.match(d.createdAt, /^\d{4}-\d\d-\d\dT/);
    }
    deadIds = dead.json.deliveries.map((d) => d.id);
    const byType = await get('/api/deliveries?eventType=order.placed.v1');
    assert.equal(byType.json.count, 7); // 5 pending audit + 2 dead mailer
    const none = await get('/api/deliveries?eventType=other.type');
    assert.equal(none.json.count, 0);
    // Pages of 2 over the 5 audit deliveries.
    const seen = [];
    let next = null;
    let pages = 0;
    do {
      const r = await get(`/api/deliveries?handler=audit&limit=2${next ? `&after=${encodeURIComponent(next)}` : ''}`);
      assert.equal(r.status, 200, r.text);
      seen.push(...r.json.deliveries.map((d) => d.id));
      next = r.json.next;
      pages++;
    } while (next && pages < 10);
    assert.equal(pages, 3);
    assert.equal(new Set(seen).size, 5);
    const pendingAudit = await get('/api/deliveries?status=pending&handler=audit&limit=1000');
    assert.equal(pendingAudit.json.count, 5);
    assert.equal((await get('/api/deliveries?status=completed')).json.count, 0); // no completion history
  });

  await t.test('POST /api/deliveries/requeue makes a dead delivery pending; it is delivered', async () => {
    reject = () => false; // the sink now accepts everything
    const r = await post('/api/deliveries/requeue', { ids: [deadIds[0]] });
    assert.equal(r.status, 200, r.text);
    assert.deepEqual(r.json, { requested: 1, requeued: 1, ids: [deadIds[0]] });
    await waitFor(() => sink.stats().ok.size === 4, 20000, 'the requeued event delivered');
    await waitFor(async () => (await get('/api/deliveries?status=dead&handler=mailer')).json.count === 1, 10000, 'one dead left');
    // Requeueing it again changes nothing: it is no longer dead.
    const again = await post('/api/deliveries/requeue', { ids: [deadIds[0]] });
    assert.deepEqual(again.json, { requested: 1, requeued: 0, ids: [] });
    await logShows(proxy, `requeued 1 of 1 requested deliveries (pending and due now): ${deadIds[0]}\n`);
    await logShows(proxy, `requeued 0 of 1 requested deliveries (pending and due now): none; not dead, unchanged: ${deadIds[0]}`);
  });

  await t.test('POST /api/deliveries/bury buries a pending delivery with the reason', async () => {
    const list = await get('/api/deliveries?status=pending&handler=audit&limit=1');
    const id = list.json.deliveries[0].id;
    const r = await post('/api/deliveries/bury', { ids: [id], reason: 'poison payload' });
    assert.equal(r.status, 200, r.text);
    assert.deepEqual(r.json, { requested: 1, buried: 1, ids: [id] });
    const dead = await get('/api/deliveries?status=dead&handler=audit');
    assert.equal(dead.json.count, 1);
    assert.equal(dead.json.deliveries[0].id, id);
    assert.match(dead.json.deliveries[0].lastError, /poison payload/);
    await logShows(proxy, new RegExp(`admin: 127\\.0\\.0\\.1:\\d+ buried 1 of 1 requested deliveries .*poison payload.*: ${id}`));
  });

  await t.test('POST /api/purge deletes dead deliveries older than the cutoff', async () => {
    const past = await post('/api/purge', { deadBefore: '2000-01-01T00:00:00Z' });
    assert.equal(past.status, 200, past.text);
    assert.equal(past.json.dead, 0);
    const r = await post('/api/purge', { deadBefore: new Date(Date.now() + 60000).toISOString() });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.dead, 2); // one mailer, one audit
    assert.equal((await get('/api/deliveries?status=dead')).json.count, 0);
    await logShows(proxy, /admin: 127\.0\.0\.1:\d+ purged dead before .*: 2 dead deliveries/);
  });

  await t.test('/api/lanes lists lanes with owners; /api/clients the connected clients', async () => {
    const lanes = await get('/api/lanes');
    assert.equal(lanes.status, 200);
    assert.ok(Array.isArray(lanes.json.lanes));
    assert.ok(Array.isArray(lanes.json.owners));
    assert.equal(typeof lanes.json.leased, 'number');
    for (const l of lanes.json.lanes) {
      assert.equal(typeof l.owner, 'string');
      // A lane document of the dispatch space (0..255), the pull space (256..511) or a handler's
      // space (512 on, with the handler it was made for).
      assert.ok(l.id >= 0 && l.id < 2 ** 31);
      assert.equal(l.lane, l.id % 256);
      assert.equal(l.space, l.id < 256 ? 'dispatch' : l.id < 512 ? 'pull' : 'handler');
      if (l.space === 'handler') assert.equal(typeof l.handler, 'string');
    }
    // A client through the proxy shows up with its peer, state, pairing (session mode), what holds
    // its reading (nothing, idle) and bytes.
    const c = await new MongoClient(proxy.uri()).connect();
    try {
      await c.db('admin').command({ ping: 1 });
      const r = await get('/api/clients');
      assert.equal(r.status, 200);
      assert.ok(r.json.count >= 1, r.text);
      const ready = r.json.clients.filter((x) => x.state === 'ready');
      assert.ok(ready.length >= 1, r.text);
      for (const x of ready) {
        assert.match(x.peer, /^127\.0\.0\.1:\d+$/);
        assert.ok(x.since > 0 && x.stateSince >= x.since);
        assert.equal(x.pairing, 'paired', JSON.stringify(x));
        assert.equal(x.readHold, 'none', JSON.stringify(x));
        assert.ok(x.bytesIn > 0 && x.bytesOut > 0, JSON.stringify(x));
      }
    } finally {
      await c.close();
    }
    await waitFor(async () => (await get('/api/clients')).json.count === 0, 5000, 'clients gone after close');
  });

  await t.test('/api/config shows the key table with the token masked', async () => {
    const r = await get('/api/config');
    assert.equal(r.status, 200);
    const tok = r.json.keys.find((k) => k.section === 'admin' && k.name === 'token');
    assert.equal(tok.value, '********');
    assert.ok(!r.text.includes(TOKEN));
    assert.ok(!r.text.includes('hook-pass-123'), 'credentials in URLs are masked');
    const listen = r.json.keys.find((k) => k.section === 'proxy' && k.name === 'listen');
    assert.equal(listen.value, `127.0.0.1:${proxy.port}`);
  });

  await t.test('unknown paths 404, wrong methods 405, the dashboard is served', async () => {
    assert.equal((await get('/api/nope')).status, 404);
    assert.equal((await request(proxy.base, '/api/stats', { method: 'POST', json: {}, token: TOKEN })).status, 405);
    assert.equal((await get('/api/purge')).status, 405);
    for (const method of ['DELETE', 'PUT', 'PATCH', 'OPTIONS']) {
      const r = await request(proxy.base, '/api/stats', { method, token: TOKEN });
      assert.equal(r.status, 405, method);
      assert.equal(r.headers.allow, 'GET, HEAD');
    }
    assert.equal((await request(proxy.base, '/api/purge', { method: 'OPTIONS' })).headers.allow, 'POST');
    const head = await request(proxy.base, '/healthz', { method: 'HEAD' });
    assert.equal(head.status, 200);
    assert.equal(head.text, '');
    assert.equal(head.headers['content-length'], '3');
    const page = await request(proxy.base, '/');
    assert.equal(page.status, 200);
    assert.match(page.headers['content-type'], /text\/html/);
    assert.match(page.headers['content-security-policy'], /default-src 'none'/);
    assert.match(page.text, /relaybus/);
    assert.ok(!/https?:\/\//.test(page.text.replace(/http:\/\/www\.w3\.org\/2000\/svg/g, '')), 'the page references nothing outside');
  });

  await t.test('a new token takes effect on reload (SIGHUP)', async () => {
    const fs = require('node:fs');
    const NEW = 'rotated-token-9876543210';
    fs.writeFileSync(proxy.ini, fs.readFileSync(proxy.ini, 'utf8').replace(`token = ${TOKEN}`, `token = ${NEW}`));
    proxy.child.kill('SIGHUP');
    await waitFor(async () => (await get('/api/stats', NEW)).status === 200, 5000, 'the new token accepted');
    assert.equal((await get('/api/stats', TOKEN)).status, 401);
  });

  await t.test('the proxy stops cleanly', async () => {
    const r = await proxy.stop();
    assert.equal(r.code, 0, proxy.log().slice(-3000));
    assert.match(proxy.log(), /admin: stopped/);
  });
});
