'use strict';
// Compares one folder's results (run --json) direct vs through relaybus-proxy,
// for tests/conformance/check-proxy.
//
//   node compare-proxy.js FOLDER DIRECT.json AS_RS.json AS_MONGOS.json DIFFERENCES.json
//
// DIRECT: the double directly. AS_RS: through the proxy with --topology
// replicaset (the same tests as DIRECT). AS_MONGOS: through the proxy as the
// driver sees it (a mongos; --no-baseline), so replica-set-only tests skip and
// sharded-only tests run. Prints the folder's table and every difference, and
// last a line "counts P F" for the shell: P = tests that passed directly and
// through the proxy plus newly run ones that pass; F = the proxy's failures:
// tests that passed directly but not through the proxy (either run), plus
// tests newly run through the proxy that fail without an explanation in
// DIFFERENCES.

const fs = require('fs');

const [folder, directPath, rsPath, mongosPath, diffPath] = process.argv.slice(2);
const load = (p) => JSON.parse(fs.readFileSync(p, 'utf8'));
const direct = load(directPath);
const asRs = load(rsPath);
const asMongos = load(mongosPath);
const differences = load(diffPath).differences;

const key = (r) => `${r.file}: ${r.test}`;
const byKey = (run) => new Map(run.results.map((r) => [key(r), r]));
const d = byKey(direct);
const rs = byKey(asRs);
const mg = byKey(asMongos);
const count = (run, s) => run.results.filter((r) => r.status === s).length;
const figures = (run) => `${count(run, 'pass')}/${count(run, 'fail')}/${count(run, 'skip')}`;

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
const skippedAsMongos = [];
const newly = { pass: [], explained: [], fault: [] };

for (const [k, r] of d) {
  if (r.status !== 'pass') continue;
  const a = rs.get(k);
  const b = mg.get(k);
  let ok = true;
  if (!a || a.status !== 'pass') { ok = false; lostRs.push([k, a]); }
  if (b && b.status === 'skip') skippedAsMongos.push([k, b]);
  else if (!b || b.status !== 'pass') {
    const e = b && explain(b);
    if (e) newly.explained.push([k, b, e]);
    else { ok = false; lostMongos.push([k, b]); }
  }
  if (ok) passed++; else failed++;
}
for (const [k, b] of mg) {
  const x = d.get(k);
  if (x && x.status !== 'skip') continue; // ran directly: handled above (or failed directly too)
  if (b.status === 'pass') { newly.pass.push([k, b]); passed++; }
  else if (b.status === 'fail') {
    const e = explain(b);
    if (e) newly.explained.push([k, b, e]);
    else { newly.fault.push([k, b]); failed++; }
  }
}

const row = (label, v) => lines.push(`  ${label.padEnd(64)} ${v}`);
lines.push(`${folder}: pass/fail/skip`);
row('direct (the double, a replica set)', figures(direct));
row('through the proxy, requirements as for its replica set', figures(asRs));
row('through the proxy as the driver sees it (a mongos)', figures(asMongos));
row('passed direct, not through the proxy (as replica set)', lostRs.length);
row('passed direct, not through the proxy (as mongos)', lostMongos.length);
row('passed direct, skipped as mongos (replica-set only; ran above)', skippedAsMongos.length);
row('newly run as mongos (sharded only): passed', newly.pass.length);
row('newly run as mongos: failed, explained (proxy-differences.json)', newly.explained.length);
row('newly run as mongos: failed, the proxy\'s fault', newly.fault.length);
const show = (tag, list) => {
  for (const [k, r, e] of list) {
    lines.push(`  ${tag} ${k}: ${r ? `${r.status}${r.reason ? ` (${r.reason})` : ''}` : 'missing'}` +
      (e ? `\n      explained [${e.id}]: ${e.explanation}` : ''));
  }
};
show('FAIL (as replica set)', lostRs);
show('FAIL (as mongos)', lostMongos);
show('FAIL (sharded only)', newly.fault);
show('DIFF', newly.explained);
for (const [k, r] of skippedAsMongos) lines.push(`  SKIP as mongos ${k}: ${r.reason}`);
console.log(lines.join('\n'));
console.log(`counts ${passed} ${failed}`);
