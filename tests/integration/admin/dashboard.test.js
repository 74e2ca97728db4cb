'use strict';
// The dashboard in headless Chromium (Debian's /usr/bin/chromium driven by playwright-core): it
// loads from the proxy itself, takes the token once, shows a handler's backlog and a dead letter
// with its last error; its Requeue button makes the dead delivery pending and the dispatcher then
// delivers it to the webhook sink. Its event search then shows what happened to that event (per
// handler: state and attempts, the failed one and the one after the requeue) and to that
// delivery by its id, and the last hour's failed attempts link to their event. Screenshots go to
// tests/out/. No request leaves the admin port.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { MongoClient } = require('mongodb');
const { REPO, startUpstream, uniqueDbName, tmpDir } = require('../lib/proxy');
const { startSink } = require('../dispatch/sink');
const { startAdminProxy, request, publish, waitFor, logShows } = require('./helpers');

const CHROMIUM = process.env.RELAYBUS_CHROMIUM || '/usr/bin/chromium';
const TOKEN = 'dashboard-token-42';
const OUT = path.join(REPO, 'tests', 'out');

test('dashboard: backlog, dead letters, requeue to delivery', { timeout: 180000 }, async (t) => {
  if (!fs.existsSync(CHROMIUM)) {
    t.skip(`no Chromium at ${CHROMIUM} (Debian package chromium; scripts/test installs it)`);
    return;
  }
  const { chromium } = require('playwright-core');
  const t0 = Date.now();
  const mark = (what) => t.diagnostic(`${((Date.now() - t0) / 1000).toFixed(1)} s: ${what}`);
  const up = await startUpstream();
  t.after(() => up.stop());
  let failing = true;
  const sink = await startSink({ answer400: (ev) => failing && ev.payload.fail === true });
  t.after(() => sink.close());
  // A slow handler keeps deliveries in flight, so lanes are held while the page is looked at.
  const slowSink = await startSink({ delayMs: 9000 });
  t.after(() => slowSink.close());
  const db = uniqueDbName('admindash');
  const proxy = await startAdminProxy({
    upstream: up.uri, token: TOKEN, outbox: { database: db },
    handlers: [
      { name: 'orders-webhook', events: 'order.*', kind: 'webhook', url: sink.url('/orders'), max_attempts: 5, retry_4xx: false },
      { name: 'audit', events: '*', kind: 'pull' },
      { name: 'slow-hook', events: 'order.placed.*', kind: 'webhook', url: slowSink.url('/slow'), timeout_ms: 30000 },
    ],
  });
  t.after(() => proxy.kill());
  // Bounded: after hooks may stop the double before this client closes.
  const client = await new MongoClient(up.uri, { serverSelectionTimeoutMS: 3000 }).connect();
  t.after(() => client.close());
  const events = [
    { id: 'order-1001', type: 'order.placed.v1', key: 'customer-7', payload: { total: 42 } },
    { id: 'order-1002', type: 'order.placed.v1', key: 'customer-8', payload: { total: 17 } },
    { id: 'order-1003', type: 'order.shipped.v1', key: 'customer-7', payload: { carrier: 'post' } },
    { id: 'order-1004', type: 'order.placed.v1', key: 'customer-9', payload: { total: -1, fail: true } },
  ];
  await publish(client, db, events, ['orders-webhook', 'audit'], 4);
  await publish(client, db, events.filter((e) => e.type === 'order.placed.v1').map((e) => ({ ...e, id: e.id + '-slow' })), ['slow-hook'], 3);
  await waitFor(async () => {
    const s = (await request(proxy.base, '/api/stats', { token: TOKEN })).json;
    const h = s && s.handlers.find((x) => x.name === 'orders-webhook');
    return h && h.dead === 1 && h.pending === 0;
  }, 20000, 'one dead letter of orders-webhook');
  mark('one dead letter');
  // A client connected through the proxy, for the clients table.
  const appClient = await new MongoClient(proxy.uri(), { appName: 'shop' }).connect();
  t.after(() => appClient.close());
  await appClient.db(db).collection('orders').insertOne({ _id: 'o-1' });

  const profile = tmpDir('relaybus-chromium-');
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    viewport: { width: 1440, height: 1000 },
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync', `--user-data-dir=${profile}`].filter((a) => !a.startsWith('--user-data-dir')),
  });
  t.after(() => context.close());
  const page = context.pages()[0] || (await context.newPage());
  mark('chromium started');
  const requests = [];
  page.on('request', (r) => requests.push(r.url()));
  const consoleErrors = [];
  // The search's expected 404s (an id that is no event) are checked by their URL below.
  const notFound = [];
  page.on('response', (r) => { if (r.status() === 404) notFound.push(r.url()); });
  page.on('console', (m) => { if (m.type() === 'error' && !/401|404/.test(m.text())) consoleErrors.push(m.text()); });
  page.on('pageerror', (e) => consoleErrors.push(String(e)));

  await page.goto(proxy.base + '/');
  // Without the token the page says what it needs.
  await page.waitForSelector('#banner.show', { timeout: 10000 });
  assert.match(await page.textContent('#banner'), /token/);
  await page.fill('#token-input', TOKEN);
  await page.click('#token-save');

  // The backlog of the pull handler, and the dead letter with its last error.
  await page.waitForFunction(() => {
    const c = document.querySelector('#handlers tr[data-handler="audit"] td.backlog');
    return c && c.textContent.trim() === '4';
  }, null, { timeout: 15000 });
  const deadRow = await page.waitForSelector('#dead tr[data-handler="orders-webhook"]', { timeout: 15000 });
  const deadId = await deadRow.getAttribute('data-id');
  assert.match(deadId, /^[0-9a-f]{24}$/);
  assert.match(await deadRow.textContent(), /order-1004/);
  assert.match(await page.textContent(`#dead tr[data-id="${deadId}"] td.err`), /400/);
  assert.equal((await page.textContent('#handlers tr[data-handler="orders-webhook"] td.dead')).trim(), '1');
  await page.waitForFunction(() => document.querySelectorAll('#clients tbody tr .tag.ready').length >= 1, null, { timeout: 10000 });
  // Lanes held by this proxy while the slow handler runs: coloured in the grid, listed as owner.
  await page.waitForFunction(() => document.querySelector('#owners .tag.here'), null, { timeout: 10000 });
  const held = await page.$$eval('#lane-grid div', (cells) => cells.filter((c) => c.style.background).length);
  assert.ok(held >= 1, 'lanes coloured in the grid');
  // Let the charts gather a few samples, then the screenshot.
  mark('dashboard shows backlog, dead letter and clients');
  await page.waitForTimeout(3000);
  fs.mkdirSync(OUT, { recursive: true });
  await page.screenshot({ path: path.join(OUT, 'admin-dashboard.png'), fullPage: true });

  // Requeue from the page: pending again, then delivered (the sink accepts it now).
  failing = false;
  await page.click(`#dead tr[data-id="${deadId}"] button.requeue`);
  await waitFor(() => sink.stats().ok.has('order-1004'), 20000, 'the requeued delivery reached the sink');
  mark('requeued delivery delivered');
  await page.waitForFunction(() => !document.querySelector('#dead tr[data-handler="orders-webhook"]'), null, { timeout: 15000 });
  const after = (await request(proxy.base, '/api/stats', { token: TOKEN })).json;
  assert.equal(after.handlers.find((h) => h.name === 'orders-webhook').dead, 0);
  await logShows(proxy, new RegExp(`admin: 127\\.0\\.0\\.1:\\d+ requeued 1 of 1 requested deliveries.*${deadId}`));
  await page.waitForTimeout(2500);
  await page.screenshot({ path: path.join(OUT, 'admin-dashboard-after-requeue.png'), fullPage: true });

  // Where is order-1004? The search shows each handler of the event with its attempts: the
  // webhook's 400 (dead at once) and, after the requeue, its 204; the pull handler's delivery
  // pending without an attempt; the slow handler, subscribed to the type, without a delivery.
  const failureRow = await page.waitForSelector('#failures tr[data-handler="orders-webhook"]', { timeout: 15000 });
  assert.match(await failureRow.textContent(), /order-1004.*400/s);
  await waitFor(async () => {
    const r = await request(proxy.base, '/api/events/order-1004', { token: TOKEN });
    return r.json && r.json.handlers.find((h) => h.handler === 'orders-webhook').state === 'completed';
  }, 15000, 'the requeued delivery on record as completed');
  await failureRow.$eval('button.event-link', (b) => b.click()); // the failure links to its event
  await page.waitForSelector('#search-result .hist[data-handler="orders-webhook"]', { timeout: 10000 });
  assert.equal(await page.inputValue('#search-input'), 'order-1004');
  assert.match(await page.textContent('#search-event'), /order\.placed\.v1 · key customer-9/);
  const hook = '#search-result .hist[data-handler="orders-webhook"]';
  assert.equal(await page.getAttribute(hook, 'data-state'), 'completed');
  assert.deepEqual(await page.$$eval(`${hook} tr.attempt`, (rows) => rows.map((r) => [r.dataset.outcome, r.querySelector('.status').textContent])),
    [['failed', '400'], ['succeeded', '204']]);
  assert.match(await page.textContent(`${hook} tr.attempt[data-outcome="failed"] td.err`), /HTTP 400: rejected order-1004/);
  assert.match(await page.textContent(`${hook} tr.attempt[data-outcome="failed"] td.took`), /^\d+ ms$/);
  assert.equal(await page.getAttribute('#search-result .hist[data-handler="audit"]', 'data-state'), 'pending');
  assert.equal(await page.getAttribute('#search-result .hist[data-handler="slow-hook"]', 'data-state'), 'none');
  await page.screenshot({ path: path.join(OUT, 'admin-dashboard-event-search.png'), fullPage: true });
  // By the delivery id a receiver saw (its webhook-id), typed in.
  await page.fill('#search-input', deadId);
  await page.click('#search-go');
  await page.waitForSelector(`#search-result .hist[data-delivery="${deadId}"]`, { timeout: 10000 });
  assert.equal(await page.getAttribute(`#search-result .hist[data-delivery="${deadId}"]`, 'data-state'), 'completed');
  assert.equal(await page.$$eval('#search-result tr.attempt', (rows) => rows.length), 2);
  // An id nothing is known of.
  await page.fill('#search-input', 'no-such-order');
  await page.click('#search-go');
  await page.waitForSelector('#search-missing', { timeout: 10000 });
  assert.match(await page.textContent('#search-missing'), /no event no-such-order/);
  assert.deepEqual(notFound, [`${proxy.base}/api/events/${deadId}`, `${proxy.base}/api/events/no-such-order`],
    'the only 404s: a delivery id tried as an event id first, and the unknown id');

  const foreign = requests.filter((u) => !u.startsWith(proxy.base + '/'));
  assert.deepEqual(foreign, [], 'the page fetches nothing from elsewhere');
  assert.deepEqual(consoleErrors, [], 'no script error in the page');
  await context.close();
  await appClient.close(); // before the proxy goes: a driver closing later waits for it
  const r = await proxy.stop();
  assert.equal(r.code, 0);
  mark('proxy stopped');
});
