'use strict';
// DOUBLE_RECORD=DIR (lib/record.js): each double process appends to DIR/record-<pid>.jsonl one
// line per distinct command shape its clients sent, the first time it sees it; a mongos's own
// calls to its shards are not recorded.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('fs');
const os = require('os');
const path = require('path');
const { Int32 } = require('bson');
const { startDouble, startSharded, rawConnect } = require('./helpers');

function withRecord(start) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'double-record-'));
  const before = process.env.DOUBLE_RECORD;
  process.env.DOUBLE_RECORD = dir;
  try {
    return { dir, started: start() };
  } finally {
    if (before === undefined) delete process.env.DOUBLE_RECORD;
    else process.env.DOUBLE_RECORD = before;
  }
}

function lines(dir, pid) {
  const text = fs.readFileSync(path.join(dir, `record-${pid}.jsonl`), 'utf8');
  return text.trim().split('\n').map((l) => JSON.parse(l));
}

test('one line per distinct shape, the first time: app, db, command, coll, fields, statements, stages, code', async () => {
  const { dir, started } = withRecord(() => startDouble());
  const d = await started;
  const c = await rawConnect(d.port);
  const s = await rawConnect(d.secondaryPort);
  try {
    await c.command({ hello: 1, client: { application: { name: 'relaybus-proxy dispatch' } }, $db: 'admin' });
    for (let i = 0; i < 3; i++) {
      await c.command({ insert: 'c', documents: [{ _id: i, x: 1 }], ordered: true, $db: 'r' });
      await c.command({ update: 'c', updates: [{ q: { _id: i }, u: { $set: { y: 1 } } }, { q: {}, u: { $set: { z: 1 } }, multi: true }], $db: 'r' });
    }
    await c.command({ delete: 'c', deletes: [{ q: { _id: 0 }, limit: new Int32(1) }], $db: 'r' });
    await c.command({ aggregate: 'c', pipeline: [{ $match: {} }, { $group: { _id: null } }], cursor: {}, $db: 'r' });
    await c.command({ update: 'c', updates: [{ q: {}, u: { $set: { a: 1 } }, maxTimeMS: new Int32(1) }], $db: 'r' });
    await s.command({ ping: 1, $db: 'admin' });
    const got = lines(dir, d.child.pid);
    const shape = (cmd) => got.filter((l) => l.command === cmd);
    assert.equal(shape('insert').length, 1, 'the same shape three times is one line');
    assert.deepEqual(shape('insert')[0], {
      app: 'relaybus-proxy dispatch', db: 'r', command: 'insert', coll: 'c', fields: ['$db', 'documents', 'insert', 'ordered'],
      stmt: null, stages: null, code: 0,
    });
    assert.deepEqual(shape('update').map((l) => [l.stmt, l.code]), [
      [['multi', 'q', 'u'], 0],
      [['maxTimeMS', 'q', 'u'], 40415],
    ]);
    assert.deepEqual(shape('delete')[0].stmt, ['limit', 'q']);
    assert.deepEqual(shape('aggregate')[0].stages, ['$match', '$group']);
    assert.deepEqual(shape('ping')[0], {
      app: null, db: 'admin', command: 'ping', coll: null, fields: ['$db', 'ping'], stmt: null, stages: null, code: 0,
    }, 'the secondary member writes to the same process file');
    assert.equal(shape('hello')[0].app, 'relaybus-proxy dispatch', 'a hello is recorded with the appName it set');
  } finally {
    c.close();
    s.close();
    assert.equal(await d.stop(), 0);
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('through a mongos: the client\'s commands, not the mongos\'s calls to its shards', async () => {
  const { dir, started } = withRecord(() => startSharded());
  const d = await started;
  const m = await rawConnect(d.port);
  try {
    await m.command({ insert: 'c', documents: [{ _id: 1 }], $db: 'r' });
    await m.command({ find: 'c', filter: {}, $db: 'r' });
    const got = lines(dir, d.child.pid);
    assert.deepEqual(got.filter((l) => l.command !== 'hello').map((l) => l.command), ['insert', 'find']);
  } finally {
    m.close();
    assert.equal(await d.stop(), 0);
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
