'use strict';
// The safe part of the suite is chosen file by file: every test file of tests/integration/ is
// either in the selection's SAFE list or in exactly one group of NOT_RUN, with its reason, and
// every name there is a file (or folder) that exists.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { SAFE, NOT_RUN } = require('../selection');

const INTEGRATION = path.join(__dirname, '..', '..', 'integration');

function testFiles() {
  const out = [];
  for (const dir of fs.readdirSync(INTEGRATION, { withFileTypes: true })) {
    if (!dir.isDirectory()) continue;
    for (const f of fs.readdirSync(path.join(INTEGRATION, dir.name))) {
      if (f.endsWith('.test.js')) out.push(`${dir.name}/${f}`);
    }
  }
  return out.sort();
}

test('every integration test file is either run or left out with a reason, once', () => {
  const safe = SAFE.map(([f]) => f);
  for (const file of testFiles()) {
    const groups = Object.entries(NOT_RUN)
      .filter(([, entries]) => entries.some((e) => (e.endsWith('/') ? file.startsWith(e) : file === e)))
      .map(([reason]) => reason);
    const places = groups.length + (safe.includes(file) ? 1 : 0);
    assert.equal(places, 1, `${file} is ${places ? `in ${places} places (${safe.includes(file) ? 'SAFE, ' : ''}${groups.join('; ')})` : 'neither run nor left out with a reason (tests/upstream/selection.js)'}`);
  }
});

test('every name of the selection exists, and each run file says what it shows', () => {
  for (const [file, what] of SAFE) {
    assert.ok(fs.existsSync(path.join(INTEGRATION, file)), `${file} exists`);
    assert.ok(what && what.length > 10, `${file} says what it shows`);
  }
  for (const [reason, entries] of Object.entries(NOT_RUN)) {
    assert.ok(reason.length > 10);
    for (const e of entries) assert.ok(fs.existsSync(path.join(INTEGRATION, e)), `${e} (left out: ${reason}) exists`);
  }
  assert.equal(new Set(SAFE.map(([f]) => f)).size, SAFE.length, 'no file twice in SAFE');
});
