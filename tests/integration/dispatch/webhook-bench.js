'use strict';
// Webhook delivery benchmark (not a timed test): N deliveries to an HTTPS receiver on
// loopback, for each binary given, one after the other in one run.  Each binary gets its own
// upstream (the server double) and the same backlog, published before its proxy starts: N
// unkeyed deliveries of one handler (concurrency 32, batch_size 100).  Measured: deliveries
// per second (first to last delivery seen by the receiver) and the proxy's CPU milliseconds
// (utime + stime from /proc/PID/stat) per 1,000 deliveries, from the proxy listening to the
// last completion.  The receiver's TCP connections and TLS handshakes are counted too.
//
//   node tests/integration/dispatch/webhook-bench.js N BIN [BIN...]
//
// Prints one JSON object per binary.  bench/webhook runs it against this tree's binary and a
// build of df437bc.

const fs = require('node:fs');
const path = require('node:path');
const { execFileSync } = require('node:child_process');
const { MongoClient } = require('mongodb');
const { startUpstream, uniqueDbName, tmpDir } = require('../lib/proxy');
const { startSink } = require('./sink');
const { startDispatchProxy, publish, waitFor } = require('./helpers');

const N = Number(process.argv[2] || 10000);
const BINS = process.argv.slice(3);

/** utime + stime of a process, in ms. */
function cpuMs(pid) {
  const f = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = f.slice(f.lastIndexOf(')') + 2).split(' ');
  return ((Number(fields[11]) + Number(fields[12])) * 1000) / 100; // USER_HZ
}

function makeCerts(dir) {
  const f = (n) => path.join(dir, n);
  const ossl = (...args) => execFileSync('openssl', args, { stdio: 'pipe' });
  ossl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', f('ca.key'), '-out', f('ca.pem'), '-days', '2',
    '-subj', '/CN=relaybus bench CA');
  ossl('req', '-newkey', 'rsa:2048', '-nodes', '-keyout', f('server.key'), '-out', f('server.csr'), '-subj', '/CN=127.0.0.1');
  fs.writeFileSync(f('ext.cnf'), 'subjectAltName = IP:127.0.0.1\n');
  ossl('x509', '-req', '-in', f('server.csr'), '-CA', f('ca.pem'), '-CAkey', f('ca.key'), '-CAcreateserial',
    '-out', f('server.pem'), '-days', '2', '-extfile', f('ext.cnf'));
  return { ca: f('ca.pem'), key: fs.readFileSync(f('server.key')), cert: fs.readFileSync(f('server.pem')) };
}

async function runOne(bin, certs) {
  const up = await startUpstream();
  const sink = await startSink({ tls: { key: certs.key, cert: certs.cert } });
  const client = await new MongoClient(up.uri).connect();
  const db = uniqueDbName('webhook_bench');
  try {
    const events = [];
    for (let i = 0; i < N; i++) events.push({ id: `b-${i}`, type: 'bench.v1', payload: { i, pad: 'x'.repeat(200) } });
    await publish(client, db, events, ['bench'], 500);
    process.env.RELAYBUS_PROXY_BIN = bin;
    // The old binary has no tls_ca_file: both trust the CA through SSL_CERT_FILE.
    const p = await startDispatchProxy({ upstream: up.uri, outbox: { database: db },
      dispatch: { poll_interval_ms: 100, batch_size: 100 }, env: { SSL_CERT_FILE: certs.ca },
      handlers: [{ name: 'bench', events: '*', kind: 'webhook', url: sink.url('/bench'), concurrency: 32 }] });
    const cpu0 = cpuMs(p.child.pid);
    const deliveries = client.db(db).collection('relaybus_deliveries');
    // Completed deliveries are removed (no completion history): none left pending is the end.
    await waitFor(async () => sink.stats().ok.size >= N &&
      (await deliveries.countDocuments({ status: 'pending' })) === 0, 1800000, 'every delivery to complete');
    const cpu = cpuMs(p.child.pid) - cpu0;
    const at = [...sink.stats().firstAt.values()];
    const secs = (Math.max(...at) - Math.min(...at)) / 1000;
    await p.stop();
    return { bin, deliveries: N, deliveriesPerSecond: Math.round(N / secs), cpuMsPer1000: Math.round((cpu * 1000) / N),
      connections: sink.stats().connections, handshakes: sink.stats().handshakes };
  } finally {
    await client.close();
    await sink.close();
    await up.stop();
  }
}

(async () => {
  const certs = makeCerts(tmpDir('relaybus-webhook-bench-'));
  for (const bin of BINS) console.log(JSON.stringify(await runOne(bin, certs)));
})().catch((e) => { console.error(e); process.exit(1); });
