'use strict';
// Unit tests for lib/compare-proxy.js, the verdict of check-proxy (no server needed):
//   node --test tests/conformance/test/
const test = require('node:test');
const assert = require('node:assert');
const fs = require('fs');
const os = require('os');
const path = require('path');
const { execFileSync } = require('child_process');

const SCRIPT = path.join(__dirname, '..', 'lib', 'compare-proxy.js');
const DIFFS = {
  differences: [{ id: 'token', files: ['t/a.json'], reason: 'recoveryToken', explanation: 'mongos only' }],
};

const POOLED = {
  differences: [{ id: 'app', files: ['t/a.json'], test: 'p', reason: '^fail point never fired$', explanation: 'appName' }],
};

function compare(direct, asRs, asMongos, directAsMongos, pooled) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'compare-proxy-'));
  const w = (name, results) => {
    const p = path.join(dir, name);
    fs.writeFileSync(p, JSON.stringify(name === 'd.json' ? DIFFS : name === 'p.json' ? pooled : { results }));
    return p;
  };
  const args = [SCRIPT, 't', w('1.json', direct), w('2.json', asRs), w('3.json', asMongos), w('d.json')];
  if (directAsMongos) args.push(w('4.json', directAsMongos));
  if (pooled) args.push('--pooled', w('p.json'));
  const out = execFileSync(process.execPath, args, { encoding: 'utf8' });
  const [, p, f] = out.trim().split('\n').pop().split(' ').map(Number);
  return { out, passed: p, failed: f };
}
const r = (test, status, reason, file = 't/a.json') => ({ file, test, status, ...(reason ? { reason } : {}) });

test('a test passing both ways passes; one that fails through the proxy fails', () => {
  const c = compare([r('x', 'pass'), r('y', 'pass')], [r('x', 'pass'), r('y', 'fail', 'boom')],
    [r('x', 'pass'), r('y', 'fail', 'boom')]);
  assert.deepStrictEqual([c.passed, c.failed], [1, 1]);
  assert.match(c.out, /FAIL \(as replica set\) t\/a\.json: y: fail \(boom\)/);
});

test('a replica-set-only test skipped as mongos still counts from the replica-set run', () => {
  const c = compare([r('x', 'pass')], [r('x', 'pass')], [r('x', 'skip', 'needs topology replicaset')]);
  assert.deepStrictEqual([c.passed, c.failed], [1, 0]);
  assert.match(c.out, /SKIP as mongos t\/a\.json: x/);
  const lost = compare([r('x', 'pass')], [r('x', 'fail', 'boom')], [r('x', 'skip', 'needs topology replicaset')]);
  assert.deepStrictEqual([lost.passed, lost.failed], [0, 1]);
});

test('a test passing directly must pass as mongos too when it runs there', () => {
  const c = compare([r('x', 'pass')], [r('x', 'pass')], [r('x', 'fail', 'pinned?')]);
  assert.deepStrictEqual([c.passed, c.failed], [0, 1]);
  // proxy-differences.json is for sharded-only tests, never for one that passed directly.
  const e = compare([r('x', 'pass')], [r('x', 'pass')], [r('x', 'fail', 'recoveryToken')]);
  assert.deepStrictEqual([e.passed, e.failed], [0, 1]);
});

test('sharded-only tests: passes count, failures need an explanation and a direct failure', () => {
  const direct = [r('s1', 'skip', 'sharded'), r('s2', 'skip', 'sharded'), r('s3', 'skip', 'sharded')];
  const asMongos = [r('s1', 'pass'), r('s2', 'fail', 'command.recoveryToken missing'), r('s3', 'fail', 'other')];
  const c = compare(direct, direct, asMongos);
  assert.deepStrictEqual([c.passed, c.failed], [1, 1]);
  assert.match(c.out, /DIFF t\/a\.json: s2/);
  assert.match(c.out, /FAIL \(sharded only\) t\/a\.json: s3/);
  // Explained, but the upstream passes it directly: the proxy's fault.
  const c2 = compare(direct, direct, asMongos, [r('s2', 'pass'), r('s3', 'fail', 'other')]);
  assert.deepStrictEqual([c2.passed, c2.failed], [1, 2]);
  // Explained and failing directly (ports and connection numbers aside): explained.
  const c3 = compare(direct, direct, [r('s2', 'fail', 'recoveryToken; connection 2 to 127.0.0.1:1 closed')],
    [r('s2', 'fail', 'recoveryToken; connection 7 to 127.0.0.1:2 closed')]);
  assert.deepStrictEqual([c3.passed, c3.failed], [0, 0]);
  assert.match(c3.out, /fails the same way directly/);
});

test('--newly-failed lists the files of sharded-only tests that failed through the proxy', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'compare-proxy-'));
  const d = path.join(dir, 'd.json');
  const m = path.join(dir, 'm.json');
  fs.writeFileSync(d, JSON.stringify({ results: [r('s', 'skip', 'x', 't/b.json'), r('x', 'fail', 'y', 't/c.json')] }));
  fs.writeFileSync(m, JSON.stringify({ results: [r('s', 'fail', 'z', 't/b.json'), r('x', 'fail', 'y', 't/c.json')] }));
  const out = execFileSync(process.execPath, [SCRIPT, '--newly-failed', d, m], { encoding: 'utf8' });
  assert.strictEqual(out, 't/b.json\n');
});

test('--pooled: a test that passed directly is explained only by a pooled entry matching file, test and reason', () => {
  const direct = [r('p', 'pass'), r('q', 'pass'), r('x', 'pass', undefined, 't/b.json')];
  const through = [r('p', 'fail', 'fail point never fired'), r('q', 'fail', 'fail point never fired'),
    r('x', 'fail', 'fail point never fired', 't/b.json')];
  // Without --pooled nothing explains them.
  const c0 = compare(direct, through, through);
  assert.deepStrictEqual([c0.passed, c0.failed], [0, 3]);
  const c = compare(direct, through, through, null, POOLED);
  // p: explained (neither passed nor failed); q: another test; x: another file.
  assert.deepStrictEqual([c.passed, c.failed], [0, 2]);
  assert.match(c.out, /POOLED \(as replica set\) t\/a\.json: p: fail \(fail point never fired\)\n\s+explained \[app\]/);
  assert.match(c.out, /FAIL \(as replica set\) t\/a\.json: q/);
  assert.match(c.out, /FAIL \(as replica set\) t\/b\.json: x/);
  // Another reason: not explained.
  const c2 = compare([r('p', 'pass')], [r('p', 'fail', 'fail point never fired (really)')], [r('p', 'pass')], null, POOLED);
  assert.deepStrictEqual([c2.passed, c2.failed], [0, 1]);
  // proxy-differences.json still never explains a test that passed directly.
  const c3 = compare([r('p', 'pass')], [r('p', 'pass')], [r('p', 'fail', 'recoveryToken')], null, POOLED);
  assert.deepStrictEqual([c3.passed, c3.failed], [0, 1]);
});

test('--pooled: a sharded-only test may be explained by a pooled entry, and must fail directly too', () => {
  const direct = [r('p', 'skip', 'sharded')];
  const asMongos = [r('p', 'fail', 'fail point never fired')];
  const c = compare(direct, direct, asMongos, [r('p', 'fail', 'network error')], POOLED);
  assert.deepStrictEqual([c.passed, c.failed], [0, 0]);
  assert.match(c.out, /DIFF t\/a\.json: p:.*\n\s+explained \[app\]/);
  const c2 = compare(direct, direct, asMongos, [r('p', 'pass')], POOLED);
  assert.deepStrictEqual([c2.passed, c2.failed], [0, 1]);
});

test('--pooled: an entry without its test or reason is refused', () => {
  const bad = { differences: [{ id: 'loose', files: ['t/a.json'], reason: '.', explanation: 'any test' }] };
  assert.throws(() => compare([r('p', 'pass')], [r('p', 'pass')], [r('p', 'pass')], null, bad), /must have id, files, test, reason/);
});

// --load-balanced: one run behind the load balancers, nothing to compare it with.
function compareLb(results, diffs, pooled) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'compare-lb-'));
  const w = (name, doc) => { const p = path.join(dir, name); fs.writeFileSync(p, JSON.stringify(doc)); return p; };
  const args = [SCRIPT, '--load-balanced', 'load-balancers', w('lb.json', { results }), w('d.json', diffs)];
  if (pooled) args.push('--pooled', w('p.json', pooled));
  const out = execFileSync(process.execPath, args, { encoding: 'utf8' });
  const [, p, f] = out.trim().split('\n').pop().split(' ').map(Number);
  return { out, passed: p, failed: f };
}

test('behind load balancers: a failure counts unless an entry names its file, test and reason', () => {
  const lbDiffs = { differences: [
    { id: 'double', files: ['t/a.json'], test: 'h', reason: '^no error$', explanation: 'the double' },
    // An entry without a test never explains a failure here.
    { id: 'broad', files: ['t/a.json'], reason: 'anything', explanation: 'too broad' },
  ] };
  const c = compareLb([r('x', 'pass'), r('h', 'fail', 'no error'), r('y', 'fail', 'anything'), r('z', 'skip', 'auth')], lbDiffs);
  assert.deepStrictEqual([c.passed, c.failed], [1, 1]);
  assert.match(c.out, /1\/2\/1/);
  assert.match(c.out, /DIFF t\/a\.json: h: no error\n\s+explained \[double\]/);
  assert.match(c.out, /FAIL t\/a\.json: y: anything/);
  // A reason that does not match is the proxy's failure.
  const d = compareLb([r('h', 'fail', 'no error, but later')], lbDiffs);
  assert.deepStrictEqual([d.passed, d.failed], [0, 1]);
});

test('behind load balancers in pooled mode: the pooled entry explains first', () => {
  const lbDiffs = { differences: [{ id: 'double', files: ['t/a.json'], test: 'h', reason: 'no error', explanation: 'the double' }] };
  const pooled = { differences: [{ id: 'app', files: ['t/a.json'], test: 'h', reason: 'no error', explanation: 'appName' }] };
  const c = compareLb([r('h', 'fail', 'no error')], lbDiffs, pooled);
  assert.deepStrictEqual([c.passed, c.failed], [0, 0]);
  assert.match(c.out, /explained \[app\]/);
});
