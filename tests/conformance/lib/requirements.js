'use strict';
// runOnRequirements evaluation.
//
// Each requirement is evaluated twice: against what the server under test
// reports (buildInfo, hello, getParameter), and against a 7.0 replica set (the
// deployment the project targets). A test is skipped only when the
// requirement does not hold for a 7.0 replica set; if the server under test
// fails a requirement that a 7.0 replica set meets (it reports an older
// version, a standalone topology, a missing server parameter...), the test is
// reported as a failure instead of being silently skipped.

const BASELINE_VERSION = '7.0.0';

function parseVersion(v) {
  return String(v).split(/[.-]/).slice(0, 3).map((p) => parseInt(p, 10) || 0);
}

function cmpVersion(a, b) {
  const x = parseVersion(a);
  const y = parseVersion(b);
  for (let i = 0; i < 3; i++) {
    const d = (x[i] || 0) - (y[i] || 0);
    if (d) return d < 0 ? -1 : 1;
  }
  return 0;
}

async function describeServer(client, uri) {
  const admin = client.db('admin');
  const info = { version: null, topology: null, auth: false, serverless: false, params: {}, admin };
  const build = await admin.command({ buildInfo: 1 });
  info.version = build.version;
  const hello = await admin.command({ hello: 1 });
  info.hello = hello;
  if (hello.msg === 'isdbgrid') info.topology = 'sharded';
  else if (hello.serviceId) info.topology = 'load-balanced';
  else if (hello.setName) info.topology = 'replicaset';
  else info.topology = 'single';
  // Auth is "enabled" when the runner was given credentials.
  info.auth = /^mongodb(\+srv)?:\/\/[^/@]+@/.test(uri);
  return info;
}

async function serverParameter(info, name) {
  if (!(name in info.params)) {
    try {
      const r = await info.admin.command({ getParameter: 1, [name]: 1 });
      info.params[name] = { value: r[name] };
    } catch (e) {
      info.params[name] = { error: e.message };
    }
  }
  return info.params[name];
}

function valuesEqual(a, b) {
  if (typeof a === 'number' || typeof b === 'number') return Number(a) === Number(b);
  return JSON.stringify(a) === JSON.stringify(b);
}

// Returns null when satisfied, otherwise a string saying why not.
async function unmetReason(req, target) {
  if (req.minServerVersion && cmpVersion(target.version, req.minServerVersion) < 0) {
    return `needs server >= ${req.minServerVersion} (${target.label} is ${target.version})`;
  }
  if (req.maxServerVersion && cmpVersion(target.version, req.maxServerVersion) > 0) {
    return `needs server <= ${req.maxServerVersion} (${target.label} is ${target.version})`;
  }
  if (req.topologies) {
    const tops = req.topologies.map((t) => (t === 'sharded-replicaset' ? 'sharded' : t));
    if (!tops.includes(target.topology)) {
      return `needs topology ${req.topologies.join('|')} (${target.label} is ${target.topology})`;
    }
  }
  if (req.serverless === 'require' && !target.serverless) return `needs serverless (${target.label} is not)`;
  if (req.serverless === 'forbid' && target.serverless) return `forbids serverless (${target.label} is serverless)`;
  if (req.auth === true && !target.auth) return 'needs authentication enabled (runner has no credentials in --uri)';
  if (req.auth === false && target.auth) return 'needs authentication disabled (runner was given credentials)';
  if (req.authMechanism) return `needs authMechanism ${req.authMechanism} (not configured)`;
  if (req.csfle) return 'needs client-side field level encryption (no libmongocrypt/mongocryptd here)';
  if (req.serverParameters) {
    for (const [name, want] of Object.entries(req.serverParameters)) {
      const got = await target.param(name);
      if (got.error) return `needs server parameter ${name}=${JSON.stringify(want)} (getParameter failed: ${got.error})`;
      if (!valuesEqual(got.value, want)) {
        return `needs server parameter ${name}=${JSON.stringify(want)} (${target.label} has ${JSON.stringify(got.value)})`;
      }
    }
  }
  return null;
}

// Evaluates a runOnRequirements list. Returns
//   { run: true } or { run: false, kind: 'skip'|'fail', reason }.
async function evaluate(reqs, server, { baseline = true } = {}) {
  if (!reqs || reqs.length === 0) return { run: true };
  const actual = {
    label: 'server', version: server.version, topology: server.topology,
    serverless: server.serverless, auth: server.auth, param: (n) => serverParameter(server, n),
  };
  const base = {
    label: '7.0 replica set', version: BASELINE_VERSION, topology: 'replicaset',
    serverless: false, auth: server.auth,
    // A real 7.0 replica set has the parameters the server reports; there is
    // no independent source for them here.
    param: (n) => serverParameter(server, n),
  };
  const actualReasons = [];
  for (const r of reqs) {
    const why = await unmetReason(r, actual);
    if (!why) return { run: true };
    actualReasons.push(why);
  }
  if (baseline) {
    for (const r of reqs) {
      const why = await unmetReason(r, base);
      if (!why) {
        return {
          run: false, kind: 'fail',
          reason: `server does not satisfy runOnRequirements ${JSON.stringify(r)} that a 7.0 replica set ` +
            `satisfies (${actualReasons.join('; ')})`,
        };
      }
    }
  }
  return { run: false, kind: 'skip', reason: [...new Set(actualReasons)].join(' or ') };
}

module.exports = { evaluate, describeServer, cmpVersion };
