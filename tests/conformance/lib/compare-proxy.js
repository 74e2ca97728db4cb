'use strict';
// Compares one folder's results (run --json) direct vs through relaybus-proxy,
// for tests/conformance/check-proxy.
//
//   node compare-proxy.js FOLDER DIRECT.json AS_RS.json AS_MONGOS.json DIFFERENCES.json [DIRECT_AS_MONGOS.json]
//                         [--pooled POOLED_DIFFERENCES.json]
//   node compare-proxy.js --newly-failed DIRECT.json AS_MONGOS.json   (prints their files, one a line)
//   node compare-proxy.js --load-balanced FOLDER BEHIND_LB.json DIFFERENCES.json [--pooled POOLED_DIFFERENCES.json]
//
// DIRECT: the double directly. AS_RS: through the proxy with --topology
// replicaset (the same tests as DIRECT). AS_MONGOS: through the proxy as the
// driver sees it (a mongos; --no-baseline), so replica-set-only tests skip and
// sharded-only tests run. DIRECT_AS_MONGOS (optional): the files of the
// newly run tests that failed, run directly against the upstream with
// --topology sharded: the same test without the proxy. Prints the folder's table and every difference, and
// last a line "counts P F" for the shell: P = tests that passed directly and
// through the proxy plus newly run ones that pass; F = the proxy's failures:
// tests that passed directly but not through the proxy (either run), plus
// tests newly run through the proxy that fail without an explanation in
// DIFFERENCES, or (given DIRECT_AS_MONGOS) that pass directly against the
// upstream.
//
// --pooled: the proxy ran with pool_mode = pooled. A test that passed
// directly and not through the proxy is then explained (not counted as a
// failure) when an entry of POOLED_DIFFERENCES matches its file, test and
// reason, all three: a rule of the specifications that sharing upstream
// connections breaks by itself (tests/conformance/README.md, "Through the
// pool").  Every entry must name its files and its test.  A sharded-only
// test newly run through the proxy may be explained by either file, and
// must still fail directly against the upstream (DIRECT_AS_MONGOS).
//
// --load-balanced: one run behind load balancers (check-proxy's load-balancers stage), with
// nothing to compare it with (no server here is load-balanced without the proxy): a test
// that fails counts as the proxy's failure unless an entry of DIFFERENCES (or, with
// --pooled, of POOLED_DIFFERENCES) names its file, its test and its reason, all three.

const fs = require('fs');

const load = (p) => JSON.parse(fs.readFileSync(p, 'utf8'));
const key = (r) => `${r.file}: ${r.test}`;

if (process.argv[2] === '--newly-failed') {
  const skippedDirect = new Set(load(process.argv[3]).results.filter((r) => r.status === 'skip').map(key));
  const files = new Set(load(process.argv[4]).results
    .filter((r) => r.status === 'fail' && skippedDirect.has(key(r))).map((r) => r.file));
  for (const f of files) console.log(f);
  process.exit(0);
}

const argv = process.argv.slice(2);
let pooledPath = null;
{
  const i = argv.indexOf('--pooled');
  if (i >= 0) {
    pooledPath = argv[i + 1];
    argv.splice(i, 2);
  }
}

if (argv[0] === '--load-balanced') {
  const [, folder, runPath, diffPath] = argv;
  const run = load(runPath);
  // Through the pool its own rules come first: they say why a test fails there even when
  // DIFFERENCES has an entry for the same test in session mode.
  const entries = [...(pooledPath ? load(pooledPath).differences : []), ...load(diffPath).differences];
  // Every entry that may explain a failure here names its file, test and reason.
  const explainLb = (r) => entries.find((e) => Array.isArray(e.files) && e.files.includes(r.file) && e.test === r.test &&
    e.reason && new RegExp(e.reason).test(r.reason || '')) || null;
  const n = (st) => run.results.filter((r) => r.status === st).length;
  const out = [`${folder}: pass/fail/skip`];
  const row = (label, v) => out.push(`  ${label.padEnd(64)} ${v}`);
  const explained = [];
  const fault = [];
  for (const r of run.results) {
    if (r.status !== 'fail') continue;
    const e = explainLb(r);
    if (e) explained.push([r, e]); else fault.push(r);
  }
  row('behind HAProxy, two proxies, loadBalanced=true', `${n('pass')}/${n('fail')}/${n('skip')}`);
  row(pooledPath ? 'failed, explained (proxy- or pooled-differences)' : 'failed, explained (proxy-differences.json)', explained.length);
  row('failed, the proxy\'s fault', fault.length);
  for (const r of fault) out.push(`  FAIL ${r.file}: ${r.test}: ${r.reason || ''}`);
  for (const [r, e] of explained) out.push(`  DIFF ${r.file}: ${r.test}: ${r.reason || ''}\n      explained [${e.id}]: ${e.explanation}`);
  for (const r of run.results.filter((x) => x.status === 'skip')) out.push(`  SKIP ${r.file}: ${r.test}: ${r.reason}`);
  console.log(out.join('\n'));
  console.log(`counts ${n('pass')} ${fault.length}`);
  process.exit(0);
}
const [folder, directPath, rsPath, mongosPath, diffPath, directMongosPath] = argv;
const direct = load(directPath);
const asRs = load(rsPath);
const asMongos = load(mongosPath);
const differences = load(diffPath).differences;
const directAsMongos = directMongosPath ? load(directMongosPath) : null;
const byKey = (run) => new Map(run.results.map((r) => [key(r), r]));
const d = byKey(direct);
const rs = byKey(asRs);
const mg = byKey(asMongos);
const dm = directAsMongos ? byKey(directAsMongos) : null;
// Reasons compared without ports and connection numbers.
const norm = (s) => String(s || '').replace(/connection \d+ to [^ )]+/g, 'connection N to HOST');
const count = (run, s) => run.results.filter((r) => r.status === s).length;
const figures = (run) => `${count(run, 'pass')}/${count(run, 'fail')}/${count(run, 'skip')}`;

const pooledDifferences = pooledPath ? load(pooledPath).differences : [];
for (const e of pooledDifferences) {
  if (!e.id || !Array.isArray(e.files) || e.files.length === 0 || !e.test || !e.reason || !e.explanation) {
    console.error(`compare-proxy: ${pooledPath}: entry ${JSON.stringify(e.id)} must have id, files, test, reason and explanation`);
    process.exit(2);
  }
}

// A pooled difference matches only with its file, its test and its reason.
function explainPooled(r) {
  if (!r || r.status !== 'fail') return null;
  for (const e of pooledDifferences) {
    if (e.files.includes(r.file) && e.test === r.test && new RegExp(e.reason).test(r.reason || '')) return e;
  }
  return null;
}

function explain(r) {
  for (const e of differences) {
    if (e.files && !e.files.includes(r.file)) continue;
    if (e.test && e.test !== r.test) continue;
    if (e.reason && !new RegExp(e.reason).test(r.reason || '')) continue;
    return e;
  }
  return null;
}

const lines = [];
let passed = 0;
let failed = 0;
const lostRs = [];
const lostMongos = [];
const pooledRs = [];
const pooledMongos = [];
const skippedAsMongos = [];
const newly = { pass: [], explained: [], fault: [] };

for (const [k, r] of d) {
  if (r.status !== 'pass') continue;
  const a = rs.get(k);
  const b = mg.get(k);
  let ok = true;
  let explained = false;
  if (!a || a.status !== 'pass') {
    const e = explainPooled(a);
    if (e) { explained = true; pooledRs.push([k, a, e]); } else { ok = false; lostRs.push([k, a]); }
  }
  if (b && b.status === 'skip') skippedAsMongos.push([k, b]);
  else if (!b || b.status !== 'pass') {
    // proxy-differences.json does not apply here; only pooling's own rules do.
    const e = explainPooled(b);
    if (e) { explained = true; pooledMongos.push([k, b, e]); } else { ok = false; lostMongos.push([k, b]); }
  }
  if (ok && !explained) passed++; else if (!ok) failed++;
}
for (const [k, b] of mg) {
  const x = d.get(k);
  if (x && x.status !== 'skip') continue; // ran directly: handled above (or failed directly too)
  if (b.status === 'pass') { newly.pass.push([k, b]); passed++; }
  else if (b.status === 'fail') {
    // Through the pool, an entry of POOLED_DIFFERENCES may explain it instead
    // (pooling makes it fail earlier, or otherwise, than a mongos feature would).
    const e = explain(b) || explainPooled(b);
    const x2 = dm && dm.get(k);
    // The test must fail directly too (the upstream itself cannot pass it);
    // directly the driver sees a replica set, so it may fail earlier, e.g. on
    // assertSessionPinned (a driver pins sessions only to a mongos).
    const failsDirectly = !dm || (x2 && x2.status === 'fail');
    const note = !dm ? null : !failsDirectly ? null : norm(x2.reason) === norm(b.reason)
      ? 'fails the same way directly against the upstream'
      : `fails directly against the upstream too: ${x2.reason}`;
    if (e && failsDirectly) newly.explained.push([k, b, e, note]);
    else {
      newly.fault.push([k, b, null, dm ? `directly against the upstream: ${x2 ? `${x2.status} ${x2.reason || ''}` : 'not run'}` : null]);
      failed++;
    }
  }
}

const row = (label, v) => lines.push(`  ${label.padEnd(64)} ${v}`);
lines.push(`${folder}: pass/fail/skip`);
row('direct (the double, a replica set)', figures(direct));
row('through the proxy, requirements as for its replica set', figures(asRs));
row('through the proxy as the driver sees it (a mongos)', figures(asMongos));
row('passed direct, not through the proxy (as replica set)', lostRs.length);
row('passed direct, not through the proxy (as mongos)', lostMongos.length);
if (pooledPath) {
  row('passed direct, not through the pool, explained (as replica set)', pooledRs.length);
  row('passed direct, not through the pool, explained (as mongos)', pooledMongos.length);
}
row('passed direct, skipped as mongos (replica-set only; ran above)', skippedAsMongos.length);
row('newly run as mongos (sharded only): passed', newly.pass.length);
row(pooledPath ? 'newly run as mongos: failed, explained (proxy- or pooled-diff.)' : 'newly run as mongos: failed, explained (proxy-differences.json)',
  newly.explained.length);
row('newly run as mongos: failed, the proxy\'s fault', newly.fault.length);
const show = (tag, list) => {
  for (const [k, r, e, note] of list) {
    lines.push(`  ${tag} ${k}: ${r ? `${r.status}${r.reason ? ` (${r.reason})` : ''}` : 'missing'}` +
      (e ? `\n      explained [${e.id}]: ${e.explanation}` : '') + (note ? `\n      ${note}` : ''));
  }
};
show('FAIL (as replica set)', lostRs);
show('FAIL (as mongos)', lostMongos);
show('FAIL (sharded only)', newly.fault);
show('POOLED (as replica set)', pooledRs);
show('POOLED (as mongos)', pooledMongos);
show('DIFF', newly.explained);
for (const [k, r] of skippedAsMongos) lines.push(`  SKIP as mongos ${k}: ${r.reason}`);
console.log(lines.join('\n'));
console.log(`counts ${passed} ${failed}`);
