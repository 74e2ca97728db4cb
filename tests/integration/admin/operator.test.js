'use strict';
// The operator's commands of the admin port (docs/admin.md, "Operator commands"): POST
// /api/pause holds new requests while what is in flight completes, POST /api/resume answers
// what was held, POST /api/clients/ID/close closes one connection, POST /api/reconnect replaces
// the upstream connections as they come free. In session (direct) and pooled modes, with the
// forwarding loops RELAYBUS_PROXY_THREADS gives (scripts/test runs the file with 1 and 4).

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const H = require('../lib/proxy');
const { request, waitFor } = require('./helpers');

const TOKEN = 'operator-token-0123456789';
const CHROMIUM = process.env.RELAYBUS_CHROMIUM || '/usr/bin/chromium';
// A request held upstream this long is "in flight" when the pause comes.
const BLOCK_MS = 1500;

let upstream = null;
test.before(async () => {
  upstream = await H.startDouble();
});

async function startOps(mode) {
  const adminPort = await H.freePort();
  const settings = mode === 'pooled' ? { pool_mode: 'pooled', pool_size: 4 } : {};
  const proxy = await H.startProxy({
    upstream: upstream.uri,
    settings,
    extraIni: `[admin]\nlisten = 127.0.0.1:${adminPort}\ntoken = ${TOKEN}\n`,
  });
  const base = `http://127.0.0.1:${adminPort}`;
  const ops = {
    proxy,
    base,
    post: (p, opts = {}) => request(base, p, { method: 'POST', json: {}, token: TOKEN, ...opts }),
    get: (p) => request(base, p, { token: TOKEN }),
    /** The value of one sample of /metrics (0 when absent). */
    async metric(sample) {
      const r = await request(base, '/metrics', { token: TOKEN });
      assert.equal(r.status, 200);
      const line = r.text.split('\n').find((l) => l.startsWith(sample + ' '));
      return line ? Number(line.slice(sample.length + 1)) : 0;
    },
    /** A raw connection through the proxy that said hello. */
    async conn() {
      const c = await H.WireConn.connect({ port: proxy.port });
      assert.equal((await c.command({ hello: 1, $db: 'admin' })).ok, 1);
      return c;
    },
  };
  return ops;
}

// Blocks the next ping upstream for BLOCK_MS, sends one on `c` and waits until the proxy has
// routed it (relaybus_commands_total{command="ping"} counts it): the ping is then in flight.
async function pingInFlight(ops, c, db) {
  const fp = await c.command({
    configureFailPoint: 'failCommand',
    mode: { times: 1 },
    data: { failCommands: ['ping'], blockConnection: true, blockTimeMS: BLOCK_MS },
    $db: 'admin',
  });
  assert.equal(fp.ok, 1, JSON.stringify(fp));
  const sample = 'relaybus_commands_total{command="ping"}';
  const before = await ops.metric(sample);
  const ping = H.opMsg({ ping: 1, $db: db });
  await c.write(ping.buf);
  await waitFor(async () => (await ops.metric(sample)) > before, 5000, 'the ping routed upstream');
  return ping;
}

for (const mode of ['session', 'pooled']) {
  test(`${mode} mode: pause holds a find until resume; a request in flight completes`, { timeout: 60000 }, async () => {
    const ops = await startOps(mode);
    const db = H.uniqueDbName(`ops_pause_${mode}`);
    const a = await ops.conn();
    const b = await ops.conn();
    try {
      assert.equal((await b.command({ insert: 'c', documents: [{ _id: 1 }], $db: db })).ok, 1);
      const ping = await pingInFlight(ops, a, db);

      const paused = await ops.post('/api/pause');
      assert.equal(paused.status, 200, paused.text);
      assert.deepEqual(paused.json, { changed: true, paused: true });
      const tPause = Date.now();
      assert.deepEqual((await ops.post('/api/pause')).json, { changed: false, paused: true }, 'a second pause changes nothing');

      const find = H.opMsg({ find: 'c', filter: {}, $db: db });
      await b.write(find.buf);
      let answeredAt = null;
      const findReply = b.next({ timeoutMs: 20000 }).then((r) => {
        answeredAt = Date.now();
        return r;
      });

      // What was in flight when the pause came is answered normally, during the pause.
      const pong = await a.next({ timeoutMs: BLOCK_MS + 5000 });
      assert.equal(pong.responseTo, ping.requestID);
      assert.equal(pong.doc.ok, 1, JSON.stringify(pong.doc));

      // /api/clients says why b is not read: the pause.
      const entryOf = async (c) =>
        (await ops.get('/api/clients')).json.clients.find((e) => e.peer === `127.0.0.1:${c.localPort}`);
      await waitFor(async () => (await entryOf(b)).readHold === 'paused', 5000, 'b held by the pause in /api/clients');
      assert.equal((await entryOf(b)).pairing, mode === 'session' ? 'paired' : undefined);

      // The find is held for as long as the pause lasts: here more than a second.
      const left = tPause + 1200 - Date.now();
      if (left > 0) await H.sleep(left);
      assert.equal(answeredAt, null, 'the find was answered during the pause');
      assert.equal(await ops.metric('relaybus_paused'), 1);
      assert.equal((await ops.get('/api/stats')).json.proxy.paused, true);

      const tResume = Date.now();
      const resumed = await ops.post('/api/resume');
      assert.equal(resumed.status, 200, resumed.text);
      assert.deepEqual(resumed.json, { changed: true, paused: false });
      const r = await findReply;
      assert.equal(r.responseTo, find.requestID);
      assert.equal(r.doc.ok, 1, JSON.stringify(r.doc));
      assert.deepEqual(r.doc.cursor.firstBatch, [{ _id: 1 }]);
      assert.ok(answeredAt >= tResume, 'answered after the resume');
      assert.equal((await entryOf(b)).readHold, 'none', 'b is read again');
      assert.ok(answeredAt - tPause > 1000, `held ${answeredAt - tPause} ms`);
      assert.equal(await ops.metric('relaybus_paused'), 0);
      assert.equal(await ops.metric('relaybus_operator_pauses_total'), 1);
      assert.equal(await ops.metric('relaybus_operator_resumes_total'), 1);
      assert.deepEqual((await ops.post('/api/resume')).json, { changed: false, paused: false });

      // Both connections go on as before.
      assert.equal((await a.command({ ping: 1, $db: db })).ok, 1);
      assert.equal((await b.command({ ping: 1, $db: db })).ok, 1);
      assert.ok(await ops.proxy.waitForLog(/admin: \S+: pause: new client requests wait/), 'the pause is logged');
      assert.ok(await ops.proxy.waitForLog(/admin: \S+: resume: the requests held are read again/), 'the resume is logged');
    } finally {
      a.destroy();
      b.destroy();
    }
  });

  test(`${mode} mode: POST /api/clients/ID/close closes that connection only`, { timeout: 60000 }, async () => {
    const ops = await startOps(mode);
    const victim = await ops.conn();
    const other = await ops.conn();
    try {
      const list = await ops.get('/api/clients');
      const entry = list.json.clients.find((c) => c.peer === `127.0.0.1:${victim.localPort}`);
      assert.ok(entry, `the victim is listed: ${list.text}`);

      // The token and a JSON content type are required, as for every POST of the port.
      assert.equal((await ops.post(`/api/clients/${entry.id}/close`, { token: 'wrong' })).status, 401);
      assert.equal((await ops.post(`/api/clients/${entry.id}/close`, { json: undefined, body: '' })).status, 415);
      assert.equal((await ops.post('/api/clients/abc/close')).status, 400);
      assert.equal((await ops.post('/api/clients/99999999/close')).status, 404);
      assert.equal((await ops.get(`/api/clients/${entry.id}/close`)).status, 405);

      const r = await ops.post(`/api/clients/${entry.id}/close`);
      assert.equal(r.status, 200, r.text);
      assert.deepEqual(r.json, { id: entry.id, loop: entry.loop, closing: true });
      await victim.waitClosed(5000);
      assert.ok(await ops.proxy.waitForLog(new RegExp(`c${entry.id} .*closing \\(operator\\)`)), 'the close is logged with its reason');
      assert.equal((await other.command({ ping: 1, $db: 'admin' })).ok, 1, 'the other connection is untouched');
      assert.equal(await ops.metric('relaybus_client_connections_closed_total{reason="operator"}'), 1);
      assert.equal(await ops.metric('relaybus_operator_client_closes_total'), 1);
    } finally {
      victim.destroy();
      other.destroy();
    }
  });

  test(`${mode} mode: POST /api/reconnect replaces upstream connections as they come free`, { timeout: 60000 }, async () => {
    const ops = await startOps(mode);
    const db = H.uniqueDbName(`ops_reconnect_${mode}`);
    const a = await ops.conn();
    const b = await ops.conn();
    try {
      const youBefore = (await b.command({ whatsmyuri: 1, $db: 'admin' })).you;
      const connectsSample = mode === 'pooled' ? 'relaybus_pool_connects_total' : 'relaybus_upstream_connects_total';
      const connectsBefore = await ops.metric(connectsSample);
      const ping = await pingInFlight(ops, a, db);
      // Session mode: a's and b's own; pooled: what the pool has open (lent or idle).
      const old = mode === 'pooled' ? await ops.metric('relaybus_pool_connections') : 2;

      const r = await ops.post('/api/reconnect');
      assert.equal(r.status, 200, r.text);
      assert.equal(r.json.generation, 1);

      // The request in flight on an old connection is not cut.
      const pong = await a.next({ timeoutMs: BLOCK_MS + 5000 });
      assert.equal(pong.responseTo, ping.requestID);
      assert.equal(pong.doc.ok, 1, JSON.stringify(pong.doc));
      // Then every connection opened before the command is replaced: requests go on, on new ones.
      await waitFor(async () => (await ops.metric('relaybus_operator_reconnected_upstreams_total')) >= old, 10000,
        `the ${old} old connections replaced`);
      assert.equal((await a.command({ ping: 1, $db: db })).ok, 1);
      const youAfter = (await b.command({ whatsmyuri: 1, $db: 'admin' })).you;
      assert.ok((await ops.metric(connectsSample)) > connectsBefore, 'new upstream connections were opened');
      if (mode === 'session') assert.notEqual(youAfter, youBefore, 'b talks to the upstream on a new connection');
      assert.equal(await ops.metric('relaybus_operator_reconnects_total'), 1);
      assert.equal(await ops.metric('relaybus_client_connections_closed_total{reason="reconnect"}'), 0,
        'connections that never logged in upstream are paired again, not closed');
      assert.ok(await ops.proxy.waitForLog(/admin: \S+: reconnect \(generation 1\)/), 'the command is logged');
      // The ping spent BLOCK_MS upstream: none of it is the proxy's added latency.
      const added = await ops.metric('relaybus_proxy_added_latency_seconds_sum');
      assert.ok(added < 0.5, `relaybus_proxy_added_latency_seconds_sum ${added}`);
    } finally {
      a.destroy();
      b.destroy();
    }
  });
}

test('/healthz stays 200 while every forwarding loop answers its pings, past the 5 s stall time', { timeout: 60000 }, async () => {
  const adminPort = await H.freePort();
  const proxy = await H.startProxy({
    upstream: upstream.uri,
    settings: { threads: 4 },
    extraIni: `[admin]\nlisten = 127.0.0.1:${adminPort}\n`,
  });
  const base = `http://127.0.0.1:${adminPort}`;
  const t0 = Date.now();
  assert.equal((await request(base, '/healthz')).status, 200);
  // Loop 0 pings the three others every second; a ping left unanswered for 5 s would make it 503.
  // Only time passing can show that none is: look again once the stall time has passed twice.
  await H.sleep(Math.max(0, t0 + 6500 - Date.now()));
  const h = await request(base, '/healthz');
  assert.equal(h.status, 200, h.text);
  assert.equal(h.text, 'ok\n');
});

test('dashboard: the Pause, Resume and Close buttons', { timeout: 60000 }, async (t) => {
  if (!fs.existsSync(CHROMIUM)) {
    t.skip(`no Chromium at ${CHROMIUM} (Debian package chromium; scripts/test installs it)`);
    return;
  }
  const { chromium } = require('playwright-core');
  const ops = await startOps('session');
  const base = ops.base;
  const victim = await ops.conn();
  const profile = H.tmpDir('relaybus-chromium-');
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  t.after(() => context.close());
  try {
    const page = context.pages()[0] || (await context.newPage());
    const asked = [];
    page.on('dialog', (d) => {
      asked.push(d.message());
      d.accept();
    });
    const errors = [];
    page.on('pageerror', (e) => errors.push(String(e)));
    await page.goto(base + '/');
    await page.fill('#token-input', TOKEN);
    await page.click('#token-save');
    await page.waitForFunction(() => /forwarding/.test(document.querySelector('#pill-forwarding').textContent), null, { timeout: 10000 });

    await page.click('#op-pause');
    await page.waitForFunction(() => /paused/.test(document.querySelector('#pill-forwarding').textContent), null, { timeout: 10000 });
    assert.equal(await ops.metric('relaybus_paused'), 1);
    assert.match(asked[0], /Pause forwarding\?/);
    await page.click('#op-resume');
    await page.waitForFunction(() => /forwarding/.test(document.querySelector('#pill-forwarding').textContent), null, { timeout: 10000 });
    assert.equal(await ops.metric('relaybus_paused'), 0);

    const list = await ops.get('/api/clients');
    const entry = list.json.clients.find((c) => c.peer === `127.0.0.1:${victim.localPort}`);
    assert.ok(entry, list.text);
    await page.click(`#clients tr[data-id="${entry.id}"] button.close-client`, { timeout: 10000 });
    await victim.waitClosed(5000);
    assert.match(asked[2], new RegExp(`Close client connection c${entry.id}`));
    assert.deepEqual(errors, []);
  } finally {
    victim.destroy();
  }
});

H.registerFinalChecks(test, [() => upstream && upstream.stop()]);
