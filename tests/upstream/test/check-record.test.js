'use strict';
// tests/upstream/check-record on records written here in the double's format: a run's record
// (its database's commands, the state reads, sessions, logins) passes; a fail point, a
// step-down, a server parameter, a double's own command, a write to another database or a
// shardCollection of another database's collection each fail it, named; an empty record or one
// of another run fails too.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { execFileSync } = require('node:child_process');

const CHECK = path.join(__dirname, '..', 'check-record');
const DB = 'relaybus_test_0123456789ab';

function rec(app, db, command, coll = null) {
  return { app, db, command, coll, fields: [command, '$db'], stmt: null, stages: null, code: null };
}

const GOOD = [
  rec('relaybus-test-upstream', 'admin', 'hello'),
  rec('relaybus-test-upstream', 'admin', 'buildInfo'),
  rec('relaybus-test-upstream', 'admin', 'listDatabases'),
  rec('relaybus-test-upstream', DB, 'create', 'relaybus_test_run'),
  rec('relaybus-proxy', null, 'isMaster'),
  rec('relaybus-proxy dispatch', 'admin', 'getParameter'),
  rec('relaybus-proxy dispatch', DB, 'update', 'relaybus_lanes'),
  rec('relaybus-proxy pool', 'admin', 'saslStart'),
  rec('relaybus-proxy pool', 'admin', 'saslContinue'),
  rec('rbit-pub', DB, 'insert', 'orders'),
  rec('rbit-pub', 'admin', 'commitTransaction'),
  rec('rbit-pub', 'admin', 'abortTransaction'),
  rec(null, 'admin', 'endSessions'),
  rec(null, 'admin', 'currentOp'),
  rec('relaybus-proxy', 'admin', 'shardCollection', `${DB}.relaybus_deliveries`),
  rec('relaybus-test-upstream', DB, 'dropDatabase'),
];

function check(entries, db = DB) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'relaybus-record-'));
  try {
    if (entries) fs.writeFileSync(path.join(dir, 'record-4242.jsonl'), entries.map((e) => JSON.stringify(e)).join('\n') + '\n');
    try {
      return { code: 0, out: execFileSync(process.execPath, [CHECK, dir, db], { encoding: 'utf8' }) };
    } catch (e) {
      return { code: e.status, out: e.stdout };
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

test('a run\'s record passes: its database, state reads, sessions and logins', () => {
  const r = check(GOOD);
  assert.equal(r.code, 0, r.out);
  assert.match(r.out, /^ok: 4 command shape\(s\) in relaybus_test_0123456789ab/m);
  assert.match(r.out, /^ok: no command outside relaybus_test_0123456789ab but reads of the server's state \(buildInfo, currentOp, getParameter, hello, isMaster, listDatabases\)/m);
});

for (const [what, bad] of [
  ['a fail point', rec('rbit-node', 'admin', 'configureFailPoint', null)],
  ['a step-down', rec('rbit-failover', 'admin', 'replSetStepDown')],
  ['a server parameter', rec('rbit-x', 'admin', 'setParameter')],
  ['a double\'s own command', rec('rbit-x', 'admin', 'doubleStats')],
  ['a write to another database', rec('rbit-x', 'relaybus', 'insert', 'relaybus_events')],
  ['a shardCollection of another database', rec('relaybus-proxy', 'admin', 'shardCollection', 'relaybus.relaybus_deliveries')],
  ['a transaction command sent to another database', rec('rbit-x', 'shop', 'commitTransaction')],
]) {
  test(`${what} fails the check, named`, () => {
    const r = check([...GOOD, bad]);
    assert.equal(r.code, 1, r.out);
    assert.match(r.out, /^FAIL: 1 command shape\(s\) outside relaybus_test_0123456789ab/m);
    assert.ok(r.out.includes(JSON.stringify(bad)), r.out);
  });
}

test('an empty record, or the record of another run, fails', () => {
  const none = check(null);
  assert.equal(none.code, 1);
  assert.match(none.out, /the double wrote no record/);
  const other = check(GOOD, 'relaybus_test_ffffffffffff');
  assert.equal(other.code, 1);
  assert.match(other.out, /holds no command in relaybus_test_ffffffffffff/);
});
