'use strict';
// Secrets outside the configuration file (docs/configuration.md, Secrets): a proxy whose
// upstream is `${RB_UPSTREAM}` (an environment variable) and whose webhook handler reads its
// signing secret from `secret_file` forwards a client's writes and delivers signed events, and
// a SIGHUP re-reads the file (a rotated secret signs the next events). A proxy whose config
// names an unset variable refuses to start, naming it.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { MongoClient } = require('mongodb');
const H = require('../lib/proxy');
const { startDispatchProxy, publishThroughProxy, waitFor, newSecret, startReceiver, verifies } = require('./helpers');

test('upstream = ${RB_UPSTREAM} and secret_file: the proxy forwards and signs with the file\'s secret, re-read on SIGHUP', { timeout: 60000 }, async (t) => {
  const up = await H.startUpstream();
  t.after(() => up.stop());
  const sink = await startReceiver();
  t.after(() => sink.close());
  const dir = H.tmpDir('relaybus-secrets-');
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const secretFile = path.join(dir, 'webhook-secret');
  const first = newSecret();
  fs.writeFileSync(secretFile, `${first}\n`, { mode: 0o600 });
  const db = H.uniqueDbName('dispatch_secrets');
  const handlers = [{ name: 'signed', events: '*', kind: 'webhook', url: sink.url('/signed'), secret_file: secretFile, retry_schedule: undefined }];
  const p = await startDispatchProxy({
    upstream: '${RB_UPSTREAM}',
    env: { RB_UPSTREAM: up.uri },
    outbox: { database: db },
    dispatch: { poll_interval_ms: 100 },
    handlers,
  });
  t.after(() => p.kill());
  assert.doesNotMatch(fs.readFileSync(p.ini, 'utf8'), /whsec_|127\.0\.0\.1:\d+\/\?replicaSet/, 'no secret and no upstream in the config file');

  const client = await new MongoClient(`mongodb://127.0.0.1:${p.port}/`, { serverSelectionTimeoutMS: 10000 }).connect();
  t.after(() => client.close());
  await publishThroughProxy(client, db, [{ id: 'sec-1', type: 'secrets.v1', payload: { n: 1 } }]);
  assert.deepEqual(await client.db(db).collection('items').findOne({ _id: 'sec-1' }), { _id: 'sec-1' }, 'the write went through the proxy');
  await waitFor(() => sink.requests.some((r) => r.id === 'sec-1'), 30000, 'the first event at the receiver');
  const r1 = sink.requests.find((r) => r.id === 'sec-1');
  assert.ok(verifies(first, r1.body, r1.headers), `signed with the file's secret (${r1.headers['webhook-signature']})`);

  // Rotation by file: the new secret, then SIGHUP; the next event is signed with it.
  const second = newSecret();
  fs.writeFileSync(secretFile, `${second}\n`, { mode: 0o600 });
  const reloads = (p.log().match(/dispatch: reloaded/g) || []).length;
  p.child.kill('SIGHUP');
  await waitFor(() => (p.log().match(/dispatch: reloaded/g) || []).length > reloads, 10000, 'the dispatcher to reload');
  await publishThroughProxy(client, db, [{ id: 'sec-2', type: 'secrets.v1', payload: { n: 2 } }]);
  await waitFor(() => sink.requests.some((r) => r.id === 'sec-2'), 30000, 'the second event at the receiver');
  const r2 = sink.requests.find((r) => r.id === 'sec-2');
  assert.ok(verifies(second, r2.body, r2.headers), 'signed with the rotated secret');
  assert.ok(!verifies(first, r2.body, r2.headers), 'not with the old one');
  await client.close();
  assert.equal((await p.stop()).code, 0);
});

test('an unset ${VARIABLE} stops the start with a message that names it', async () => {
  const name = `RB_UNSET_${process.pid}`;
  assert.equal(process.env[name], undefined);
  const r = await H.runProxyExpectingExit({ upstream: `\${${name}}`, timeoutMs: 10000 });
  assert.equal(r.timedOut, false, `the proxy did not exit; log:\n${r.log}`);
  assert.equal(r.code, 1, `exit code; log:\n${r.log}`);
  assert.match(r.log, new RegExp(`upstream: the environment variable ${name} is not set`));
  H.assertNoSanitizerReports(r.log, 'proxy refusing an unset variable');
  fs.rmSync(r.dir, { recursive: true, force: true });
});
