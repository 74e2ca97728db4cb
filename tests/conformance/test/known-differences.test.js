'use strict';
// Unit tests for the known driver differences list (no server needed):
//   node --test tests/conformance/test/
const test = require('node:test');
const assert = require('node:assert');
const fs = require('fs');
const os = require('os');
const path = require('path');
const { loadKnownDifferences, knownDifference } = require('../lib/runner');

function writeTmp(doc) {
  const f = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'kdd-')), 'k.json');
  fs.writeFileSync(f, JSON.stringify(doc));
  return f;
}

test('a difference names a whole file or listed tests only', () => {
  const list = loadKnownDifferences(writeTmp({ differences: [
    { file: 'gridfs/a.json', tests: '*', reason: 'r1', evidence: 'e1' },
    { file: 'gridfs/b.json', tests: ['one'], reason: 'r2', evidence: 'e2' },
  ] }));
  assert.strictEqual(knownDifference(list, 'gridfs/a.json', 'anything').reason, 'r1');
  assert.strictEqual(knownDifference(list, 'gridfs/b.json', 'one').reason, 'r2');
  assert.strictEqual(knownDifference(list, 'gridfs/b.json', 'two'), null);
  assert.strictEqual(knownDifference(list, 'crud/a.json', 'anything'), null);
});

test('an entry without reason or evidence is refused', () => {
  assert.throws(() => loadKnownDifferences(writeTmp({ differences: [{ file: 'x/y.json', tests: '*', reason: 'r' }] })),
    /reason and evidence/);
  assert.throws(() => loadKnownDifferences(writeTmp({ differences: [{ file: 'x/y.json', tests: 'one', reason: 'r', evidence: 'e' }] })),
    /reason and evidence/);
});

test('the shipped list loads and every entry has evidence', () => {
  const list = loadKnownDifferences(path.join(__dirname, '..', 'known-driver-differences.json'));
  assert.ok(list.length > 0);
  for (const d of list) assert.ok(d.evidence.length > 20, d.file);
});
