'use strict';
// /metrics: the Prometheus text exposition passes `promtool check metrics` (Debian's prometheus
// package; scripts/test installs it) and carries the documented families with the values the
// test caused: commands by name, bytes, backlog, dead letters and oldest due age by handler.

const test = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const { MongoClient } = require('mongodb');
const { startUpstream, uniqueDbName } = require('../lib/proxy');
const { startSink } = require('../dispatch/sink');
const { startAdminProxy, request, publish, waitFor } = require('./helpers');

const TOKEN = 'metrics-token';

function promtool() {
  const r = spawnSync('promtool', ['--version'], { encoding: 'utf8' });
  return r.status === 0;
}

/** Parses the exposition into {families: Map(name -> {help, type}), samples: [{name, labels, value}]}. */
function parse(text) {
  const families = new Map();
  const samples = [];
  for (const line of text.split('\n')) {
    let m;
    if ((m = /^# HELP (\S+) (.*)$/.exec(line))) families.set(m[1], { ...(families.get(m[1]) || {}), help: m[2] });
    else if ((m = /^# TYPE (\S+) (\S+)$/.exec(line))) families.set(m[1], { ...(families.get(m[1]) || {}), type: m[2] });
    else if ((m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line))) {
      const labels = {};
      for (const lm of (m[2] || '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[lm[1]] = lm[2];
      samples.push({ name: m[1], labels, value: Number(m[3]) });
    } else if (line !== '') assert.fail(`unparsable line: ${line}`);
  }
  return { families, samples };
}

const value = (p, name, labels = {}) => {
  const s = p.samples.find((x) => x.name === name && Object.entries(labels).every(([k, v]) => x.labels[k] === v));
  return s ? s.value : undefined;
};

test('/metrics passes promtool and shows what happened', { timeout: 120000 }, async (t) => {
  if (!promtool()) {
    t.skip('promtool not found (Debian package prometheus; scripts/test installs it)');
    return;
  }
  const up = await startUpstream();
  t.after(() => up.stop());
  const sink = await startSink({ answer400: (ev) => ev.payload.i === 0 });
  t.after(() => sink.close());
  const db = uniqueDbName('adminmetrics');
  const proxy = await startAdminProxy({
    upstream: up.uri, token: TOKEN, outbox: { database: db },
    handlers: [
      { name: 'hook', events: '*', kind: 'webhook', url: sink.url('/h'), retry_4xx: false }, // a 400 buries at once
      { name: 'audit.v2', events: '*', kind: 'pull' },
    ],
  });
  t.after(() => proxy.kill());
  // Bounded: after hooks may stop the double before this client closes.
  const client = await new MongoClient(up.uri, { serverSelectionTimeoutMS: 3000 }).connect();
  t.after(() => client.close());
  await publish(client, db, [0, 1, 2, 3].map((i) => ({ id: `m-${i}`, type: 't.v1', payload: { i } })), ['hook', 'audit.v2'], 4);
  // A delivery of a handler another process declared, with a name that needs escaping.
  await publish(client, db, [{ id: 'm-x', type: 't.v1', payload: { i: 9 } }], ['legacy "q"\\x'], 1);
  await waitFor(() => sink.stats().ok.size === 3, 20000, 'three delivered');

  // Traffic through the proxy: a few commands by name.
  const c = await new MongoClient(proxy.uri()).connect();
  await c.db(db).collection('things').insertOne({ a: 1 });
  await c.db(db).collection('things').find({}).toArray();
  await c.db('admin').command({ ping: 1 });
  await c.close();

  // Completions are counted when their batch is flushed, a burial just after its write: wait.
  await waitFor(async () => {
    const text = (await request(proxy.base, '/metrics', { token: TOKEN })).text;
    return /relaybus_outbox_dead_letters\{handler="hook"\} 1\n/.test(text) && /\nrelaybus_dispatch_completed_total 3\n/.test(text) &&
      /\nrelaybus_dispatch_dead_total 1\n/.test(text);
  }, 10000, 'one dead letter and three completions of hook in /metrics');
  const r = await request(proxy.base, '/metrics', { token: TOKEN });
  assert.equal(r.status, 200);
  assert.match(r.headers['content-type'], /^text\/plain; version=0\.0\.4/);

  const check = spawnSync('promtool', ['check', 'metrics'], { input: r.text, encoding: 'utf8' });
  t.diagnostic(`promtool: exit ${check.status} ${check.stdout}${check.stderr}`.trim());
  assert.equal(check.status, 0, `promtool check metrics failed:\n${check.stdout}\n${check.stderr}`);
  assert.equal(check.stdout.trim() + check.stderr.trim(), '', 'promtool reports no lint problem');

  const p = parse(r.text);
  for (const [name, f] of p.families) {
    assert.match(name, /^(relaybus|process)_/);
    assert.ok(f.help && f.type, `${name} has HELP and TYPE`);
    if (f.type === 'counter') assert.match(name, /_total$/, `${name}: counters end in _total`);
  }
  for (const s of p.samples) assert.ok(Number.isFinite(s.value), `${s.name} is a number`);
  for (const name of ['relaybus_client_connections', 'relaybus_commands_total', 'relaybus_client_received_bytes_total',
    'relaybus_annotated_statements_total', 'relaybus_events_published_total', 'relaybus_deliveries_completed_total',
    'relaybus_deliveries_retried_total', 'relaybus_deliveries_dead_total', 'relaybus_outbox_backlog',
    'relaybus_outbox_oldest_due_age_seconds', 'relaybus_handler_latency_seconds', 'relaybus_claim_latency_seconds',
    'relaybus_lanes_held', 'relaybus_outbox_dead_letters']) {
    assert.ok(p.families.has(name), `family ${name}`);
  }
  assert.ok(value(p, 'relaybus_commands_total', { command: 'insert' }) >= 1);
  assert.ok(value(p, 'relaybus_commands_total', { command: 'find' }) >= 1);
  assert.ok(value(p, 'relaybus_commands_total', { command: 'ping' }) >= 1);
  assert.ok(value(p, 'relaybus_client_received_bytes_total') > 0);
  assert.ok(value(p, 'relaybus_hellos_total') >= 1);
  // The latency the proxy added: the requests above were answered, each counted once.
  const answered = value(p, 'relaybus_proxy_added_latency_seconds_count');
  assert.ok(answered >= 3, `relaybus_proxy_added_latency_seconds_count ${answered}`);
  assert.equal(value(p, 'relaybus_proxy_added_latency_seconds_bucket', { le: '+Inf' }), answered);
  assert.ok(value(p, 'relaybus_proxy_added_latency_seconds_sum') >= 0);
  assert.equal(value(p, 'relaybus_outbox_backlog', { handler: 'hook' }), 0);
  assert.equal(value(p, 'relaybus_outbox_backlog', { handler: 'audit.v2' }), 4);
  assert.ok(value(p, 'relaybus_outbox_oldest_due_age_seconds', { handler: 'audit.v2' }) >= 0);
  assert.equal(value(p, 'relaybus_outbox_backlog', { handler: 'legacy \\"q\\"\\\\x' }), 1, 'label values are escaped');
  assert.equal(value(p, 'relaybus_outbox_dead_letters', { handler: 'hook' }), 1);
  assert.equal(value(p, 'relaybus_dispatch_completed_total'), 3);
  assert.equal(value(p, 'relaybus_dispatch_dead_total'), 1);
  assert.equal(value(p, 'relaybus_upstream_up'), 1);
  assert.equal(value(p, 'relaybus_outbox_ready'), 1);
  assert.equal(value(p, 'relaybus_store_up'), 1);
  // The process families, as Prometheus' client libraries name them.
  assert.ok(value(p, 'process_cpu_seconds_total') > 0);
  assert.ok(value(p, 'process_resident_memory_bytes') > 1024 * 1024);
  assert.ok(value(p, 'process_virtual_memory_bytes') >= value(p, 'process_resident_memory_bytes'));
  assert.ok(value(p, 'process_open_fds') >= 5);
  assert.ok(value(p, 'process_max_fds') >= value(p, 'process_open_fds'));
  const started = value(p, 'process_start_time_seconds');
  assert.ok(started <= Date.now() / 1000 && started > Date.now() / 1000 - 120, `process_start_time_seconds ${started}`);
  assert.equal(p.families.get('process_cpu_seconds_total').type, 'counter');

  // Without the token: 401, and no metric in the answer.
  const anon = await request(proxy.base, '/metrics');
  assert.equal(anon.status, 401);
  assert.ok(!/relaybus_/.test(anon.text));
  const stop = await proxy.stop();
  assert.equal(stop.code, 0);
});
