'use strict';
// mongosh through the proxy, as the README tells users to connect: the shell connects, runs a
// transaction whose insert carries an annotation, relaybusPublish in a transaction, and
// relaybusStatus; the outbox is then read directly. And a watch(): a change stream through the
// proxy sees a write made through it.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { execFile } = require('node:child_process');
const P = require('./lib');

const H = P.H;
const DB = H.uniqueDbName('pubsh');
const MONGOSH = path.join(__dirname, '..', '..', 'node_modules', '.bin', 'mongosh');
let s;

test.before(async () => {
  s = await P.startStack({});
});

test.after(async () => {
  if (s) await s.stop();
});

/** Runs `script` in mongosh connected through the proxy; returns the last line it printed, parsed. */
function mongosh(script) {
  assert.ok(fs.existsSync(MONGOSH), 'mongosh is among the test packages (npm ci in tests/)');
  return new Promise((resolve, reject) => {
    execFile(
      MONGOSH,
      ['--quiet', s.proxy.uri() + DB, '--eval', script],
      { timeout: 90000, encoding: 'utf8', env: { ...process.env, MONGOSH_NO_TELEMETRY: '1', HOME: H.tmpDir('relaybus-mongosh-home-') } },
      (err, stdout, stderr) => {
        if (err) return reject(new Error(`mongosh failed (${err.code ?? err.signal}):\n${stdout}\n${stderr}`));
        try {
          resolve(JSON.parse(stdout.trim().split('\n').pop()));
        } catch (e) {
          reject(new Error(`mongosh printed no JSON line:\n${stdout}\n${stderr}`));
        }
      },
    );
  });
}

test('mongosh: connects, publishes from a transaction and with relaybusPublish, asks relaybusStatus', async () => {
  const out = await mongosh(`
    const session = db.getMongo().startSession();
    const orders = session.getDatabase(db.getName()).orders;
    session.startTransaction();
    orders.insertOne({ _id: 'sh-1', total: 3 }, { comment: { relaybus: { type: 'order.placed.v1', id: 'sh-ev-1', key: 'sh-k', payload: { total: 3 } } } });
    session.commitTransaction();
    session.startTransaction();
    const pub = session.getDatabase(db.getName()).runCommand({ relaybusPublish: 1, events: [{ type: 'user.created.v1', id: 'sh-ev-2' }] });
    session.commitTransaction();
    session.startTransaction();
    orders.insertOne({ _id: 'sh-2' }, { comment: { relaybus: { type: 'order.placed.v1', id: 'sh-ev-3' } } });
    session.abortTransaction();
    const status = db.adminCommand({ relaybusStatus: 1 });
    print(JSON.stringify({ pub: pub.eventIds, status, count: db.orders.countDocuments({}) }));
  `);
  assert.deepEqual(out.pub, ['sh-ev-2']);
  assert.equal(out.status.ok, 1, `relaybusStatus: ${JSON.stringify(out.status)}`);
  assert.equal(out.status.proxy, 'relaybus-proxy', 'the shell is talking to the proxy');
  assert.equal(out.status.handlers, Object.keys(P.HANDLERS).length);
  assert.equal(out.count, 1, 'the committed insert is there, the aborted one is not');
  await P.checkEvent(s.outbox, 'sh-ev-1', { type: 'order.placed.v1', key: 'sh-k', payload: { total: 3 }, handlers: P.subscribed(P.HANDLERS, 'order.placed.v1') });
  await P.checkEvent(s.outbox, 'sh-ev-2', { type: 'user.created.v1', handlers: P.subscribed(P.HANDLERS, 'user.created.v1') });
  assert.equal(await s.outbox.events.countDocuments({ _id: 'sh-ev-3' }), 0, 'the aborted transaction left no event');
});

test('mongosh: watch() through the proxy sees an insert', async () => {
  const out = await mongosh(`
    const cs = db.watched.watch([{ $match: { operationType: 'insert' } }]);
    db.watched.insertOne({ _id: 'sh-w1', n: 1 });
    let ev = null;
    for (let i = 0; i < 100 && !ev; i++) {
      ev = cs.tryNext();
      if (!ev) sleep(100);
    }
    cs.close();
    print(JSON.stringify({ type: ev && ev.operationType, id: ev && ev.documentKey._id, n: ev && ev.fullDocument.n, token: !!(ev && ev._id) }));
  `);
  assert.deepEqual(out, { type: 'insert', id: 'sh-w1', n: 1, token: true });
});
