'use strict';
// Unit tests for check's auth pass (no server needed):
//   node --test tests/conformance/test/
const test = require('node:test');
const assert = require('node:assert');
const fs = require('fs');
const os = require('os');
const path = require('path');
const { authFiles, merge } = require('../lib/auth-pass');

const tmp = () => fs.mkdtempSync(path.join(os.tmpdir(), 'authpass-'));

test('files with an auth: true requirement, at file or test level', () => {
  const d = tmp();
  fs.writeFileSync(path.join(d, 'a.json'), JSON.stringify({ runOnRequirements: [{ auth: true }], tests: [] }));
  fs.writeFileSync(path.join(d, 'b.json'), JSON.stringify({ tests: [{ description: 't', runOnRequirements: [{ minServerVersion: '4.0' }, { auth: true }] }] }));
  fs.writeFileSync(path.join(d, 'c.json'), JSON.stringify({ runOnRequirements: [{ auth: false }], tests: [] }));
  fs.writeFileSync(path.join(d, 'd.json'), JSON.stringify({ tests: [{ description: 't' }] }));
  assert.deepStrictEqual(authFiles(d).map((f) => path.basename(f)), ['a.json', 'b.json']);
});

test('only the main run\'s "needs authentication" skips take the auth run\'s results', () => {
  const d = tmp();
  const main = path.join(d, 'main.json');
  const auth = path.join(d, 'auth.json');
  fs.writeFileSync(main, JSON.stringify({ summary: {}, results: [
    { file: 'f/a.json', test: 'one', status: 'skip', reason: 'needs authentication enabled (runner has no credentials in --uri)' },
    { file: 'f/a.json', test: 'two', status: 'skip', reason: 'needs authentication enabled (runner has no credentials in --uri)' },
    { file: 'f/a.json', test: 'three', status: 'skip', reason: 'needs server >= 8.0 (server is 7.0.0)' },
    { file: 'f/b.json', test: 'x', status: 'pass' },
  ] }));
  fs.writeFileSync(auth, JSON.stringify({ summary: {}, results: [
    { file: 'f/a.json', test: 'one', status: 'pass' },
    { file: 'f/a.json', test: 'two', status: 'fail', reason: 'boom' },
    { file: 'f/a.json', test: 'three', status: 'pass' },
  ] }));
  assert.strictEqual(merge(main, auth), 2);
  const out = JSON.parse(fs.readFileSync(main, 'utf8'));
  assert.deepStrictEqual(out.results.map((r) => r.status), ['pass', 'fail', 'skip', 'pass']);
  assert.deepStrictEqual(out.summary, { passed: 2, failed: 1, skipped: 1 });
});
