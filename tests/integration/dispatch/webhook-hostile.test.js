'use strict';
// Bad input is refused when the configuration is read (start-up, --check-config, reload): a
// header name that is not an HTTP token (a colon in it), a header value with a line break, too
// many headers, a proxy that is not an http(s) URL.  Hostile receivers cannot stall the
// dispatcher: an endless redirect is not followed (a 3xx is a failed attempt), a huge header
// ends the exchange, a receiver that never answers is cut off after timeout_ms, and a
// well-behaved handler of the same proxy gets its deliveries meanwhile.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const http = require('node:http');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const { MongoClient } = require('mongodb');
const { startUpstream, uniqueDbName, tmpDir, proxyBin } = require('../lib/proxy');
const { startSink } = require('./sink');
const { startDispatchProxy, publish, waitFor } = require('./helpers');

function checkConfig(dir, keys, env = {}, extra = []) {
  const ini = path.join(dir, 'bad.ini');
  const lines = ['[proxy]', 'listen = 127.0.0.1:1', 'upstream = mongodb://127.0.0.1:1/', '', '[handler h]', 'events = *',
    'kind = webhook', 'url = http://127.0.0.1:1/h'];
  for (const [k, v] of keys) lines.push(`${k} = ${v}`);
  fs.writeFileSync(ini, lines.join('\n') + '\n');
  const r = spawnSync(proxyBin(), ['--check-config', ...extra, '-c', ini], { encoding: 'utf8', env: { ...process.env, ...env } });
  return { status: r.status, err: r.stderr, out: r.stdout };
}

test('bad header names and values, too many headers and a proxy that is not a URL are refused', () => {
  const dir = tmpDir('relaybus-webhook-hostile-');
  const refused = (keys, re, env) => {
    const r = checkConfig(dir, keys, env);
    assert.notEqual(r.status, 0, `accepted: ${JSON.stringify(keys)}`);
    assert.match(r.err, re);
  };
  refused([['header.X-A:B', '1']], /\[handler h\] header\.X-A:B: 'X-A:B' is not an HTTP header name/);
  refused([['header.X-Bad', '${RELAYBUS_TEST_CRLF}']], /\[handler h\] header\.X-Bad: the value has a line break or a control character/,
    { RELAYBUS_TEST_CRLF: 'a\r\nInjected: 1' });
  refused([['header.webhook-signature', 'x']], /\[handler h\] header\.webhook-signature: set by the proxy/);
  refused(Array.from({ length: 33 }, (_, i) => [`header.X-${i}`, 'v']), /at most 32 header\.\* keys per handler/);
  refused([['proxy', 'not a url']], /\[handler h\] proxy: 'not a url' is not an http:\/\/ or https:\/\/ URL/);
  refused([['proxy', 'socks5://127.0.0.1:1080']], /\[handler h\] proxy: .* is not an http:\/\/ or https:\/\/ URL/);
  // The accepted forms, and the proxy's password and every header value masked in what
  // --check-config prints, whatever the header's name.
  const ok = checkConfig(dir, [['header.X-Tenant', 't-pw-tenant'], ['header.X-Api', 'k-pw-api'], ['proxy', 'http://u:pw-9f3@127.0.0.1:3128']]);
  assert.equal(ok.status, 0, ok.err);
  assert.match(ok.out, /^header\.X-Tenant = \*{8}$/m);
  assert.match(ok.out, /^header\.X-Api = \*{8}$/m);
  assert.doesNotMatch(ok.out + ok.err, /pw-9f3|pw-tenant|pw-api/);
  // --quiet (the unit's ExecStartPre): nothing on standard output, the same exit.
  const quiet = checkConfig(dir, [['header.X-Tenant', 't-pw-tenant']], {}, ['--quiet']);
  assert.equal(quiet.status, 0, quiet.err);
  assert.equal(quiet.out, '');
});

test('hostile receivers (endless redirect, huge header, no answer) do not stall the dispatcher', { timeout: 90000 }, async (t) => {
  const up = await startUpstream();
  t.after(() => up.stop());
  const hits = { redirect: 0, huge: 0, hang: 0 };
  const held = new Set();
  const hostile = http.createServer((req, res) => {
    req.resume();
    const which = req.url.slice(1);
    hits[which]++;
    if (which === 'redirect') res.writeHead(302, { location: '/redirect' }).end();
    else if (which === 'huge') res.writeHead(200, { 'x-huge': 'x'.repeat(64 * 1024) }).end();
    else held.add(res); // hang: never answers
  });
  await new Promise((resolve) => hostile.listen(0, '127.0.0.1', resolve));
  t.after(() => new Promise((resolve) => { hostile.closeAllConnections(); hostile.close(() => resolve()); }));
  const good = await startSink({});
  t.after(() => good.close());
  const base = `http://127.0.0.1:${hostile.address().port}`;
  const db = uniqueDbName('dispatch_webhook_hostile');
  const slow = { events: '*', kind: 'webhook', timeout_ms: 1000, max_attempts: 2, retry_schedule: '200ms' };
  const handlers = [
    { name: 'redirect', url: `${base}/redirect`, ...slow },
    { name: 'huge', url: `${base}/huge`, ...slow },
    { name: 'hang', url: `${base}/hang`, ...slow },
    { name: 'good', events: '*', kind: 'webhook', url: good.url('/good') },
  ];
  const p = await startDispatchProxy({ upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 100 }, handlers });
  t.after(() => p.kill());
  const client = await new MongoClient(up.uri).connect();
  t.after(() => client.close());
  const events = [];
  for (let i = 0; i < 20; i++) events.push({ id: `h-${i}`, type: 'hostile.v1', payload: { i } });
  const t0 = Date.now();
  await publish(client, db, events, handlers.map((h) => h.name));
  await waitFor(async () => good.stats().ok.size === events.length, 20000, 'the good handler to get every event');
  const goodMs = Date.now() - t0;
  const deliveries = client.db(db).collection('relaybus_deliveries');
  await waitFor(async () => (await deliveries.countDocuments({ status: 'pending' })) === 0, 60000, 'every delivery to finish');
  const byHandler = async (h) => deliveries.find({ handler: h }).toArray();
  for (const d of await byHandler('redirect')) {
    assert.equal(d.status, 'dead');
    assert.equal(d.attempts, 2);
    assert.match(d.lastError, /^HTTP 302/);
  }
  // Not followed: one request per attempt.
  assert.equal(hits.redirect, 2 * events.length);
  for (const d of await byHandler('huge')) {
    assert.equal(d.status, 'dead');
    assert.match(d.lastError, /^answer too long: more than 16384 bytes of headers/);
  }
  for (const d of await byHandler('hang')) {
    assert.equal(d.status, 'dead');
    assert.match(d.lastError, /^timeout: no complete answer within 1000 ms/);
  }
  for (const r of held) r.destroy();
  t.diagnostic(`the good handler got its ${events.length} events ${goodMs} ms after the publish`);
  assert.equal((await p.stop()).code, 0);
});
