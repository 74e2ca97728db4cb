'use strict';
// The most common mistake, an annotated write outside a transaction, reaches the application
// with the proxy's own message and the documented code (72 InvalidOptions), through every client
// a user is likely to have: the Node.js driver with its default options (retryWrites=true, which
// rewrites any code-20 error of a write into "does not support retryable writes"), Mongoose,
// pymongo (Debian's python3-pymongo), mongo-c-driver and mongosh. Nothing of the refused write
// is stored.

const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const fs = require('node:fs');
const { execFileSync, execFile } = require('node:child_process');
const mongoose = require('mongoose');
const P = require('./lib');

const H = P.H;
const DB = H.uniqueDbName('pubout');
const CODE = 72;
const CODE_NAME = 'InvalidOptions';
const MESSAGE = /^relaybus: annotated writes must run inside a transaction/;
const ANNOTATION = { relaybus: { type: 'order.placed.v1', key: 'o-1', payload: { n: 1 } } };
let s;

test.before(async () => {
  s = await P.startStack({});
});

test.after(async () => {
  if (s) await s.stop();
});

function run(cmd, args, opts = {}) {
  return new Promise((resolve) => {
    execFile(cmd, args, { timeout: 60000, encoding: 'utf8', ...opts }, (err, stdout, stderr) =>
      resolve({ code: err ? (err.code ?? err.signal) : 0, stdout, stderr }),
    );
  });
}

async function nothingStored(ids) {
  const items = await s.direct.db(DB).collection('orders').countDocuments({ _id: { $in: ids } });
  assert.equal(items, 0, 'the refused write is not forwarded');
}

test('Node.js driver, default options: the error is the proxy\'s, code 72', async () => {
  // The stack's client has the driver's defaults: retryWrites and retryReads on.
  const orders = s.client.db(DB).collection('orders');
  const err = await orders.insertOne({ _id: 'node-out' }, { comment: ANNOTATION }).then(
    () => null,
    (e) => e,
  );
  assert.ok(err, 'the write is refused');
  assert.equal(err.code, CODE, `code: ${err.message}`);
  assert.equal(err.codeName, CODE_NAME);
  assert.match(err.message, MESSAGE);
  assert.equal(err.originalError, undefined, 'the driver passed the error on as it came');
  // A retryable update in a session without a transaction: the same.
  const session = s.client.startSession();
  try {
    const e2 = await orders.updateOne({ _id: 'node-out-2' }, { $set: { a: 1 } }, { session, upsert: true, comment: ANNOTATION }).then(
      () => null,
      (e) => e,
    );
    assert.ok(e2);
    assert.equal(e2.code, CODE);
    assert.match(e2.message, MESSAGE);
  } finally {
    await session.endSession();
  }
  await nothingStored(['node-out', 'node-out-2']);
});

test('Mongoose: the error reaches the model call unchanged', async () => {
  const conn = await mongoose.createConnection(s.proxy.uri(), { dbName: DB, serverSelectionTimeoutMS: 10000 }).asPromise();
  try {
    const Order = conn.model('Order', new mongoose.Schema({ _id: String, n: Number }), 'orders');
    const err = await Order.updateOne({ _id: 'mongoose-out' }, { $set: { n: 1 } }, { upsert: true })
      .comment(ANNOTATION)
      .then(
        () => null,
        (e) => e,
      );
    assert.ok(err, 'the write is refused');
    assert.equal(err.code, CODE, `code: ${err.message}`);
    assert.equal(err.codeName, CODE_NAME);
    assert.match(err.message, MESSAGE);
  } finally {
    await conn.close();
  }
  await nothingStored(['mongoose-out']);
});

const PYTHON = '/usr/bin/python3';

test('pymongo: OperationFailure with code 72 and the proxy\'s message', async (t) => {
  if (!fs.existsSync(PYTHON) || execFileSync(PYTHON, ['-c', 'import importlib.util,sys; sys.stdout.write(str(importlib.util.find_spec("pymongo") is not None))'], { encoding: 'utf8' }) !== 'True') {
    t.skip('Debian python3-pymongo is not installed (scripts/test installs it)');
    return;
  }
  // pymongo 3.11's insert_one has no comment option: the insert command carries it, as an
  // application using db.command would send it.
  const script = `
import json, sys
from bson.son import SON
from pymongo import MongoClient
from pymongo.errors import OperationFailure
c = MongoClient(sys.argv[1], serverSelectionTimeoutMS=10000)
db = c[sys.argv[2]]
try:
    db.command(SON([("insert", "orders"), ("documents", [{"_id": "py-out"}]), ("comment", json.loads(sys.argv[3]))]))
    print(json.dumps({"refused": False}))
except OperationFailure as e:
    print(json.dumps({"refused": True, "code": e.code, "codeName": (e.details or {}).get("codeName"), "errmsg": (e.details or {}).get("errmsg")}))
`;
  const r = await run(PYTHON, ['-c', script, s.proxy.uri(), DB, JSON.stringify(ANNOTATION)]);
  assert.equal(r.code, 0, `python failed:\n${r.stdout}\n${r.stderr}`);
  const out = JSON.parse(r.stdout.trim().split('\n').pop());
  assert.equal(out.refused, true);
  assert.equal(out.code, CODE);
  assert.equal(out.codeName, CODE_NAME);
  assert.match(out.errmsg, MESSAGE);
  await nothingStored(['py-out']);
});

test('mongo-c-driver: bson_error_t code 72 and the proxy\'s message', async () => {
  const src = path.join(__dirname, 'cdriver-publish.c');
  const bin = path.join(H.tmpDir('relaybus-cdriver-outside-'), 'cdriver-publish');
  const flags = execFileSync('pkg-config', ['--cflags', '--libs', 'libmongoc-1.0'], { encoding: 'utf8' }).trim().split(/\s+/);
  execFileSync(process.env.CC || 'cc', ['-std=c11', '-D_GNU_SOURCE', '-Wall', '-Wextra', '-Werror', '-O1', '-o', bin, src, ...flags], {
    stdio: ['ignore', 'inherit', 'inherit'],
  });
  const r = await run(bin, ['--outside-only', s.proxy.uri(), DB]);
  assert.equal(r.code, 0, `cdriver-publish failed:\n${r.stdout}\n${r.stderr}`);
  assert.match(r.stdout, /^ok outside a transaction is InvalidOptions$/m);
  assert.match(r.stdout, /^message relaybus: annotated writes must run inside a transaction/m);
  await nothingStored(['c-out']);
});

test('mongosh: the shell prints the proxy\'s error', async () => {
  const mongosh = path.join(__dirname, '..', '..', 'node_modules', '.bin', 'mongosh');
  assert.ok(fs.existsSync(mongosh), 'mongosh is among the test packages (npm ci in tests/)');
  const r = await run(mongosh, [
    '--quiet',
    '--nodb',
    '--eval',
    `const db = connect(${JSON.stringify(s.proxy.uri() + DB)});
     try {
       db.orders.insertOne({ _id: 'sh-out' }, { comment: ${JSON.stringify(ANNOTATION)} });
       print('not refused');
     } catch (e) {
       print(JSON.stringify({ code: e.code, codeName: e.codeName, message: e.message }));
     }`,
  ], { env: { ...process.env, MONGOSH_NO_TELEMETRY: '1', HOME: H.tmpDir('relaybus-mongosh-home-') } });
  assert.equal(r.code, 0, `mongosh failed:\n${r.stdout}\n${r.stderr}`);
  const line = r.stdout.trim().split('\n').pop();
  assert.notEqual(line, 'not refused');
  const out = JSON.parse(line);
  assert.equal(out.code, CODE, `code: ${out.message}`);
  assert.equal(out.codeName, CODE_NAME);
  assert.match(out.message, MESSAGE);
  await nothingStored(['sh-out']);
});
