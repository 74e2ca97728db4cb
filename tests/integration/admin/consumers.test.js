'use strict';
// The admin port shows a pull handler's consumers on this proxy: /api/handlers and /api/stats give
// each kind = pull handler a `consumers` object (connections holding claims or waiting in a long
// poll, claims held, long polls waiting, and the claimed, completed outside and inside
// transactions and charged-on-close totals), /metrics has the same by handler, and the dashboard
// (headless Chromium, as dashboard.test.js) lists them in its "Pull consumers" table. Each number
// is checked as a consumer claims, waits, completes outside and inside its transaction and closes
// with a claim.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const { MongoClient } = require('mongodb');
const { startUpstream, uniqueDbName, tmpDir } = require('../lib/proxy');
const { startAdminProxy, request, waitFor } = require('./helpers');

const CHROMIUM = process.env.RELAYBUS_CHROMIUM || '/usr/bin/chromium';
const HANDLERS = [
  { name: 'audit', events: 'order.*', kind: 'pull' },
  { name: 'hooks', events: 'order.*', kind: 'webhook', url: 'http://127.0.0.1:9/never' },
];

let up;
let proxy;
let app;
let db;
const clients = [];

test.before(async () => {
  up = await startUpstream();
  db = uniqueDbName('adminconsumers');
  // [dispatch] enabled = false: the webhook handler is configured but never sent to.
  proxy = await startAdminProxy({ upstream: up.uri, handlers: HANDLERS, dispatch: false, outbox: { database: db } });
  app = await connect();
  await app.db(db).createCollection('projections').catch(() => {});
});

test.after(async () => {
  for (const c of clients) await c.close().catch(() => {});
  if (proxy) {
    const r = await proxy.stop();
    assert.equal(r.code, 0, 'the proxy exits 0');
  }
  if (up) await up.stop();
});

/** A client through the proxy with one connection (a lease is settled on the connection that claimed it). */
async function connect() {
  const c = await new MongoClient(proxy.uri(), { maxPoolSize: 1, serverSelectionTimeoutMS: 10000 }).connect();
  clients.push(c);
  return c;
}

function cmd(client, doc, opts) {
  return client.db('admin').command(doc, opts);
}

/** Publishes `n` unkeyed events through the proxy in one transaction (the outbox is `db`). */
async function publish(tag, n) {
  const events = Array.from({ length: n }, (_, i) => ({ type: 'order.placed.v1', id: `${tag}-${process.pid}-${i}`, payload: { i } }));
  const session = app.startSession();
  try {
    await session.withTransaction(async () => {
      await app.db(db).command({ relaybusPublish: 1, events }, { session });
    });
  } finally {
    await session.endSession();
  }
  return events.map((e) => e.id);
}

async function handler(name, path = '/api/handlers') {
  const r = await request(proxy.base, path);
  assert.equal(r.status, 200, r.text);
  const h = r.json.handlers.find((x) => x.name === name);
  assert.ok(h, `${path} lists ${name}`);
  return h;
}

async function consumersOf(name) {
  return (await handler(name)).consumers;
}

/** The sample of a per-handler metric. */
async function metric(name, h) {
  const text = (await request(proxy.base, '/metrics')).text;
  const m = text.match(new RegExp(`^${name}\\{handler="${h}"\\} (\\d+)$`, 'm'));
  assert.ok(m, `/metrics has ${name}{handler="${h}"}`);
  return Number(m[1]);
}

async function claimAll(client, n) {
  const got = [];
  for (const until = Date.now() + 10000; got.length < n && Date.now() < until; ) {
    const r = await cmd(client, { relaybusClaim: 'audit', limit: n - got.length });
    got.push(...r.deliveries);
    if (got.length < n) await new Promise((res) => setTimeout(res, 50));
  }
  assert.equal(got.length, n, `claimed ${n} deliveries`);
  return got;
}

test('/api/handlers and /metrics: connections, claims, long polls and completions of a pull handler', async () => {
  const zero = { connections: 0, claims: 0, longPolls: 0, claimedTotal: 0, completedTotal: 0, completedInTransactionTotal: 0, closedChargedTotal: 0 };
  assert.deepEqual(await consumersOf('audit'), zero, 'nothing yet');
  assert.equal((await handler('hooks')).consumers, undefined, 'a webhook handler has no consumers object');
  assert.equal((await handler('audit', '/api/stats')).consumers.claims, 0, '/api/stats has it too');

  await publish('adm', 3);
  const a = await connect();
  const got = await claimAll(a, 3);
  // A second consumer waits: nothing else is due.
  const b = await connect();
  const waiting = cmd(b, { relaybusClaim: 'audit', maxAwaitTimeMS: 2000 });
  await waitFor(async () => (await consumersOf('audit')).longPolls === 1, 5000, 'the long poll is counted');
  assert.deepEqual(await consumersOf('audit'), { ...zero, connections: 2, claims: 3, longPolls: 1, claimedTotal: 3 });
  assert.equal(await metric('relaybus_consumer_connections', 'audit'), 2);
  assert.equal(await metric('relaybus_consumer_claims', 'audit'), 3);
  assert.equal(await metric('relaybus_consumer_long_polls', 'audit'), 1);
  assert.equal(await metric('relaybus_consumer_claimed_total', 'audit'), 3);
  assert.equal(await metric('relaybus_consumer_claims', 'hooks'), 0, 'every handler has its series');

  assert.deepEqual((await waiting).deliveries, [], 'the long poll ends empty');
  await waitFor(async () => (await consumersOf('audit')).longPolls === 0, 5000, 'the long poll is over');
  assert.equal((await consumersOf('audit')).connections, 1, 'b holds nothing and waits no more');

  // Outside a transaction.
  await cmd(a, { relaybusComplete: 'audit', leases: [got[0].lease] });
  assert.deepEqual(await consumersOf('audit'), { ...zero, connections: 1, claims: 2, claimedTotal: 3, completedTotal: 1 });
  // Inside a's transaction: counted at the commit.
  const session = a.startSession();
  try {
    await session.withTransaction(async () => {
      await a.db(db).collection('projections').updateOne({ _id: got[1].eventId }, { $inc: { n: 1 } }, { upsert: true, session });
      await cmd(a, { relaybusComplete: 'audit', leases: [got[1].lease] }, { session });
    });
  } finally {
    await session.endSession();
  }
  await waitFor(async () => (await consumersOf('audit')).completedInTransactionTotal === 1, 5000, 'the commit is counted');
  assert.deepEqual(await consumersOf('audit'), { ...zero, connections: 1, claims: 1, claimedTotal: 3, completedTotal: 1, completedInTransactionTotal: 1 });
  assert.equal(await metric('relaybus_consumer_completed_total', 'audit'), 1);
  assert.equal(await metric('relaybus_consumer_completed_in_transaction_total', 'audit'), 1);

  // a closes with its third claim: charged one attempt, and a holds nothing any more.
  await a.close();
  await waitFor(async () => (await consumersOf('audit')).closedChargedTotal === 1, 5000, 'the close is charged');
  assert.deepEqual(await consumersOf('audit'),
    { ...zero, claimedTotal: 3, completedTotal: 1, completedInTransactionTotal: 1, closedChargedTotal: 1 });
  assert.equal(await metric('relaybus_consumer_closed_charged_total', 'audit'), 1);
  assert.equal(await metric('relaybus_consumer_connections', 'audit'), 0);

  // The charged delivery is due again: b takes and completes it.
  const again = await claimAll(b, 1);
  assert.equal(again[0].eventId, got[2].eventId);
  assert.equal(again[0].attempt, 2);
  await cmd(b, { relaybusComplete: 'audit', leases: [again[0].lease] });
  assert.equal((await consumersOf('audit')).claims, 0);
});

test('dashboard: the Pull consumers table shows a consumer holding claims and another waiting', { timeout: 120000 }, async (t) => {
  if (!fs.existsSync(CHROMIUM)) {
    t.skip(`no Chromium at ${CHROMIUM} (Debian package chromium; scripts/test installs it)`);
    return;
  }
  const { chromium } = require('playwright-core');
  await publish('dash', 2);
  const c = await connect();
  const got = await claimAll(c, 2);
  const w = await connect();
  const waiting = cmd(w, { relaybusClaim: 'audit', maxAwaitTimeMS: 30000 });
  await waitFor(async () => (await consumersOf('audit')).longPolls === 1, 5000, 'the long poll is counted');

  const profile = tmpDir('relaybus-chromium-');
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    viewport: { width: 1440, height: 1000 },
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
  });
  t.after(() => context.close());
  const page = context.pages()[0] || (await context.newPage());
  const consoleErrors = [];
  page.on('pageerror', (e) => consoleErrors.push(String(e)));
  page.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text()); });
  await page.goto(proxy.base + '/');
  const cell = (cls) => page.textContent(`#consumers tr[data-handler="audit"] td.${cls}`).then((s) => s.trim());
  await page.waitForFunction(() => {
    const td = document.querySelector('#consumers tr[data-handler="audit"] td.claims');
    return td && td.textContent.trim() === '2';
  }, null, { timeout: 15000 });
  assert.equal(await cell('connections'), '2');
  assert.equal(await cell('polls'), '1');
  assert.ok(Number(await cell('claimed')) >= 2);
  assert.equal(await page.$('#consumers tr[data-handler="hooks"]'), null, 'only pull handlers are listed');
  assert.equal(await page.isVisible('#consumers-card'), true);

  // Completed: the page follows.
  await cmd(c, { relaybusComplete: 'audit', leases: got.map((d) => d.lease) });
  await page.waitForFunction(() => {
    const td = document.querySelector('#consumers tr[data-handler="audit"] td.claims');
    return td && td.textContent.trim() === '0';
  }, null, { timeout: 15000 });
  assert.equal(await cell('connections'), '1', 'the waiting consumer is still counted');
  assert.deepEqual(consoleErrors, [], 'no script error in the page');
  await context.close();
  // A commit through the proxy ends the long poll with its delivery.
  await publish('dash-wake', 1);
  const woke = (await waiting).deliveries;
  assert.equal(woke.length, 1);
  await cmd(w, { relaybusComplete: 'audit', leases: [woke[0].lease] });
});
