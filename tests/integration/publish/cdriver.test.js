'use strict';
// Publishing with mongo-c-driver through the proxy: builds cdriver-publish.c, runs it against
// the proxy (with_transaction, a manual transaction, relaybusPublish, BadValue, InvalidOptions outside a transaction,
// and a commit afterwards), then checks what it stored.

const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const { execFileSync, execFile } = require('node:child_process');
const P = require('./lib');

const H = P.H;
const DB = H.uniqueDbName('pubcdrv');
let s;
let bin;

function build() {
  const src = path.join(__dirname, 'cdriver-publish.c');
  const out = path.join(H.tmpDir('relaybus-cdriver-publish-'), 'cdriver-publish');
  const flags = execFileSync('pkg-config', ['--cflags', '--libs', 'libmongoc-1.0'], { encoding: 'utf8' }).trim().split(/\s+/);
  execFileSync(process.env.CC || 'cc', ['-std=c11', '-D_GNU_SOURCE', '-Wall', '-Wextra', '-Werror', '-O1', '-g', '-o', out, src, ...flags], {
    stdio: ['ignore', 'inherit', 'inherit'],
  });
  return out;
}

test.before(async () => {
  bin = build();
  s = await P.startStack({});
});

test('mongo-c-driver publishes through comments and relaybusPublish', async () => {
  const r = await new Promise((resolve) => {
    execFile(bin, [s.proxy.uri(), DB], { timeout: 60000, encoding: 'utf8' }, (err, stdout, stderr) =>
      resolve({ code: err ? (err.code ?? err.signal) : 0, stdout, stderr }),
    );
  });
  assert.equal(r.code, 0, `cdriver-publish failed:\n${r.stdout}\n${r.stderr}`);
  for (const step of ['with_transaction', 'manual transaction', 'relaybusPublish', 'bad annotation is BadValue', 'outside a transaction is InvalidOptions', 'the session commits afterwards']) {
    assert.match(r.stdout, new RegExp(`^ok ${step}$`, 'm'));
  }
  await P.checkEvent(s.outbox, 'c-1', { type: 'order.placed.v1', key: 'ck', sequence: 1, payload: { orderId: 'c-o1' }, handlers: ['orders', 'confirmations'] });
  await P.checkEvent(s.outbox, 'c-2', { type: 'order.paid.v1', key: 'ck', sequence: 2, handlers: ['orders'] });
  await P.checkEvent(s.outbox, 'c-3', { type: 'user.created.v1', handlers: ['users'] });
  await P.checkEvent(s.outbox, 'c-4', { type: 'order.placed.v1', key: 'ck', sequence: 3, handlers: ['orders', 'confirmations'] });
  await P.checkEvent(s.outbox, 'c-5', { type: 'user.deleted.v1', handlers: ['users'] });
  const ids = (await s.direct.db(DB).collection('orders').find({}).toArray()).map((d) => d._id).sort();
  assert.deepEqual(ids, ['c-after', 'c-o1', 'c-o2']);
});

H.registerFinalChecks(test, [() => s && s.upstream.stop()], { beforeStop: () => s && s.closeClients() });
