'use strict';
// Disabled webhook handlers, as Svix disables endpoints.
//
// 1. A receiver answering 410 Gone disables its handler in the outbox, so every proxy of the
//    fleet stops sending: nothing is buried, no attempt is charged, the deliveries wait as
//    pending and GET /api/handlers on both proxies says why.  POST /api/handlers/NAME/enable
//    on one proxy sends what waited, every key in order.
// 2. A receiver failing every request for disable_after disables its handler too
//    ("failing since ..."); the operator's POST .../disable and .../enable change it, and so
//    does the dashboard's Enable button.

const fs = require('node:fs');
const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const { startUpstream, uniqueDbName, freePort, sleep, tmpDir, registerFinalChecks } = require('../lib/proxy');
const { startSink } = require('./sink');
const { startDispatchProxy, publish, waitFor } = require('./helpers');

const cleanups = [];
const CHROMIUM = process.env.RELAYBUS_CHROMIUM || '/usr/bin/chromium';
const HEARTBEAT = '500ms';

async function getJson(port, path) {
  const res = await fetch(`http://127.0.0.1:${port}${path}`);
  assert.equal(res.status, 200, `${path}: ${res.status}`);
  return res.json();
}

async function post(port, path) {
  const res = await fetch(`http://127.0.0.1:${port}${path}`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}',
  });
  assert.equal(res.status, 200, `${path}: ${res.status} ${await res.clone().text()}`);
  return res.json();
}

async function handlerRow(port, name) {
  return (await getJson(port, '/api/handlers')).handlers.find((h) => h.name === name);
}

async function metric(port, series) {
  const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line ? Number(line.slice(series.length + 1)) : 0;
}

test('410 Gone disables the handler on every proxy; enabling it delivers what waited, in key order',
  { timeout: 45000 }, async (t) => {
    const up = await startUpstream();
    cleanups.push(up);
    let gone = true;
    const sink = await startSink({ respond: () => (gone ? { status: 410, body: 'endpoint removed' } : undefined) });
    cleanups.push(() => sink.close());
    const db = uniqueDbName('dispatch_webhook_disable');
    const outbox = { database: db, handler_heartbeat: HEARTBEAT };
    const dispatch = { poll_interval_ms: 100 };
    const handlers = [{ name: 'hook', events: '*', kind: 'webhook', url: sink.url('/hook'), concurrency: 2 }];
    const adminA = await freePort();
    const adminB = await freePort();
    const a = await startDispatchProxy({ upstream: up.uri, outbox, dispatch, adminListen: `127.0.0.1:${adminA}`, handlers });
    cleanups.push(() => a.kill());
    const b = await startDispatchProxy({ upstream: up.uri, outbox, dispatch, adminListen: `127.0.0.1:${adminB}`, handlers });
    cleanups.push(() => b.kill());
    const client = await new MongoClient(up.uri).connect();
    cleanups.push(() => client.close());

    const events = [];
    for (let i = 0; i < 24; i++) events.push({ id: `g-${i}`, type: 'gone.v1', key: `k${i % 4}`, payload: { i } });
    await publish(client, db, events, ['hook']);

    // Both proxies see it disabled, because of the 410, within a heartbeat.
    for (const port of [adminA, adminB])
      await waitFor(async () => (await handlerRow(port, 'hook')).state === 'disabled', 15000, `disabled on :${port}`);
    for (const port of [adminA, adminB]) {
      const row = await handlerRow(port, 'hook');
      assert.equal(row.disabledReason, '410');
      assert.match(row.disabledAt, /^\d{4}-\d\d-\d\dT/);
    }
    assert.ok(sink.stats().custom.some((c) => c.status === 410), 'the receiver answered 410');

    // While disabled: nothing is claimed, so after the requests in flight at the 410 (at most
    // a concurrency's worth per proxy) the receiver hears nothing more.
    const deliveries = client.db(db).collection('relaybus_deliveries');
    for (const p of [a, b])
      await waitFor(async () => /handler hook (is )?disabled/.test(p.log()), 5000, 'each dispatcher to know');
    await waitFor(async () => sink.stats().pendingNow === 0, 5000, 'the requests in flight answered');
    const heard = sink.stats().requests;
    await sleep(1500); // three heartbeats: long enough for a proxy that still sent to show it
    assert.equal(sink.stats().requests, heard, 'no request while disabled');
    const docs = await deliveries.find({ handler: 'hook' }).toArray();
    assert.equal(docs.length, events.length);
    for (const d of docs) {
      assert.equal(d.status, 'pending', `${d.eventId} waits as pending`);
      assert.equal(d.attempts, 0, `${d.eventId}: the 410 charged no attempt`);
    }
    assert.equal(await metric(adminA, 'relaybus_disabled_handlers'), 1);
    assert.equal(await metric(adminB, 'relaybus_disabled_handlers'), 1);
    assert.equal(await metric(adminA, 'relaybus_handler_state_changes_total{reason="410"}') +
      await metric(adminB, 'relaybus_handler_state_changes_total{reason="410"}'), 1, 'one change, counted once');

    // Enabled through one proxy: both send again, every event once acknowledged, in key order.
    gone = false;
    const r = await post(adminA, '/api/handlers/hook/enable');
    assert.deepEqual([r.changed, r.state], [true, 'enabled']);
    await waitFor(async () => (await deliveries.countDocuments({ handler: 'hook', status: 'pending' })) === 0, 20000,
      'every waiting delivery sent');
    for (const e of events) assert.ok(sink.stats().ok.get(e.id) >= 1, `${e.id} delivered`);
    assert.deepEqual(sink.stats().seqViolations, []);
    assert.equal(await deliveries.countDocuments({ handler: 'hook', status: 'dead' }), 0);
    await waitFor(async () => (await handlerRow(adminB, 'hook')).state === 'enabled', 5000, 'enabled on B');
    assert.equal(await metric(adminA, 'relaybus_handler_state_changes_total{reason="enabled"}'), 1);
    assert.match(a.log() + b.log(), /handler hook disabled \(410\)/);
    assert.equal((await a.stop()).code, 0);
    assert.equal((await b.stop()).code, 0);
  });

test('disable_after: a receiver failing every request disables its handler; the operator enables and disables it',
  { timeout: 30000 }, async (t) => {
    const up = await startUpstream();
    cleanups.push(up);
    const sink = await startSink({ respond: () => ({ status: 500, body: 'down' }) });
    cleanups.push(() => sink.close());
    const db = uniqueDbName('dispatch_webhook_failing');
    const admin = await freePort();
    const p = await startDispatchProxy({
      upstream: up.uri, outbox: { database: db, handler_heartbeat: HEARTBEAT }, dispatch: { poll_interval_ms: 100 },
      adminListen: `127.0.0.1:${admin}`,
      handlers: [{ name: 'flaky', events: '*', kind: 'webhook', url: sink.url('/hook'), disable_after: '2s',
        retry_schedule: '200ms', max_attempts: 1000 }],
    });
    cleanups.push(() => p.kill());
    const client = await new MongoClient(up.uri).connect();
    cleanups.push(() => client.close());
    await publish(client, db, [{ id: 'f-1', type: 'flaky.v1', key: 'k', payload: {} }], ['flaky']);

    const started = Date.now();
    await waitFor(async () => (await handlerRow(admin, 'flaky')).state === 'disabled', 15000, 'disabled after 2 s of failures');
    assert.ok(Date.now() - started >= 1500, 'not before disable_after');
    const row = await handlerRow(admin, 'flaky');
    assert.match(row.disabledReason, /^failing since \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    assert.equal(await client.db(db).collection('relaybus_deliveries').countDocuments({ status: 'dead' }), 0);
    assert.equal(await metric(admin, 'relaybus_handler_state_changes_total{reason="failing"}'), 1);

    assert.equal((await post(admin, '/api/handlers/flaky/enable')).changed, true);
    assert.equal((await handlerRow(admin, 'flaky')).state, 'enabled');
    assert.equal((await post(admin, '/api/handlers/flaky/disable')).changed, true);
    const op = await handlerRow(admin, 'flaky');
    assert.deepEqual([op.state, op.disabledReason], ['disabled', 'operator']);
    assert.equal((await post(admin, '/api/handlers/flaky/disable')).changed, false, 'disabled already');
    const missing = await fetch(`http://127.0.0.1:${admin}/api/handlers/nosuch/disable`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}',
    });
    assert.equal(missing.status, 404);

    // The dashboard shows the state and enables the handler with its button.
    if (!fs.existsSync(CHROMIUM)) {
      t.diagnostic(`dashboard part skipped: no Chromium at ${CHROMIUM}`);
    } else {
      const { chromium } = require('playwright-core');
      const context = await chromium.launchPersistentContext(tmpDir('relaybus-chromium-'), {
        executablePath: CHROMIUM, headless: true,
        args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking'],
      });
      try {
        const page = context.pages()[0] || (await context.newPage());
        const asked = [];
        page.on('dialog', (d) => { asked.push(d.message()); d.accept(); });
        await page.goto(`http://127.0.0.1:${admin}/`);
        const button = 'tr[data-handler="flaky"] button.handler-enable';
        await page.waitForSelector(button, { timeout: 10000 });
        assert.match(await page.textContent('tr[data-handler="flaky"]'), /disabled \(operator\)/);
        await page.click(button);
        await page.waitForSelector('tr[data-handler="flaky"] button.handler-disable', { timeout: 10000 });
        assert.match(asked[0], /^Enable flaky\?/);
        assert.equal((await handlerRow(admin, 'flaky')).state, 'enabled');
      } finally {
        await context.close();
      }
    }
    assert.equal((await p.stop()).code, 0);
  });

registerFinalChecks(test, cleanups);
