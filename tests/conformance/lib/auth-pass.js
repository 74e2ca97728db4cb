'use strict';
// The auth pass of tests/conformance/check: the tests whose runOnRequirements need
// authentication (auth: true) skip against the credential-less double of the main run; check
// runs their files again against a double started with --auth, and their results replace
// those skips.
//
//   node lib/auth-pass.js --files DIR            files of DIR with an auth: true requirement
//   node lib/auth-pass.js --merge MAIN AUTH      MAIN's "needs authentication" skips take AUTH's
//                                                results (MAIN is rewritten); prints how many

const fs = require('fs');
const path = require('path');
const { BSON } = require('mongodb');

const NO_CREDENTIALS = /^needs authentication enabled/;

function needsAuth(reqs) {
  return Array.isArray(reqs) && reqs.some((r) => r && r.auth === true);
}

function authFiles(dir) {
  return fs.readdirSync(dir).filter((f) => f.endsWith('.json')).sort().filter((f) => {
    let doc;
    try { doc = BSON.EJSON.parse(fs.readFileSync(path.join(dir, f), 'utf8')); } catch (_) { return false; }
    return needsAuth(doc.runOnRequirements) || (doc.tests || []).some((t) => needsAuth(t.runOnRequirements));
  }).map((f) => path.join(dir, f));
}

function merge(mainFile, authFile) {
  const main = JSON.parse(fs.readFileSync(mainFile, 'utf8'));
  const auth = JSON.parse(fs.readFileSync(authFile, 'utf8'));
  const byKey = new Map(auth.results.map((r) => [`${r.file}\u0000${r.test}`, r]));
  let replaced = 0;
  main.results = main.results.map((r) => {
    if (r.status !== 'skip' || !NO_CREDENTIALS.test(r.reason || '')) return r;
    const a = byKey.get(`${r.file}\u0000${r.test}`);
    if (!a || a.status === 'skip') return r;
    replaced++;
    return Object.assign({}, a, { auth: true });
  });
  const n = (s) => main.results.filter((r) => r.status === s).length;
  main.summary = { passed: n('pass'), failed: n('fail'), skipped: n('skip') };
  fs.writeFileSync(mainFile, JSON.stringify(main, null, 2) + '\n');
  return replaced;
}

if (require.main === module) {
  const [mode, a, b] = process.argv.slice(2);
  if (mode === '--files' && a) {
    for (const f of authFiles(a)) process.stdout.write(`${f}\n`);
  } else if (mode === '--merge' && a && b) {
    process.stdout.write(`${merge(a, b)}\n`);
  } else {
    process.stderr.write('usage: auth-pass.js --files DIR | --merge MAIN.json AUTH.json\n');
    process.exit(2);
  }
}

module.exports = { authFiles, merge, needsAuth };
