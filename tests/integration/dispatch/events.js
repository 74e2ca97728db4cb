'use strict';
// What the dispatch tests share: the events they publish, a deterministic
// random source for the failing sink, a report of a sink, the upstream, and
// the scale of the large runs.
//
// Scale: RELAYBUS_DISPATCH_EVENTS (default 600) events on
// RELAYBUS_DISPATCH_KEYS (default 30) keys; the full run is
// RELAYBUS_DISPATCH_EVENTS=10000 RELAYBUS_DISPATCH_KEYS=50 (bench/dispatch-full).

const { startUpstream } = require('../lib/proxy');

const N_EVENTS = Number(process.env.RELAYBUS_DISPATCH_EVENTS || 600);
const N_KEYS = Number(process.env.RELAYBUS_DISPATCH_KEYS || 30);
const TIMEOUT_MS = Number(process.env.RELAYBUS_DISPATCH_TIMEOUT_MS || 240000);
const SECRET = `whsec_${Buffer.from('relaybus-dispatch-test-secret-32b').toString('base64')}`;

// A deterministic random source for the failing sink, so a run can be repeated.
function lcg(seed) {
  let x = seed >>> 0;
  return () => {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
    return x / 2 ** 32;
  };
}

function makeEvents(n, keys, tag) {
  const events = [];
  for (let i = 0; i < n; i++) {
    const e = { id: `${tag}-${i}`, type: 'order.placed.v1', payload: { i, at: new Date(), note: 'é✓' } };
    // Every 10th event has no key: unkeyed events spread over all lanes.
    if (i % 10 !== 9) e.key = `key-${i % keys}`;
    events.push(e);
  }
  return events;
}

function report(t, name, sink) {
  const st = sink.stats();
  t.diagnostic(`${name}: ${st.requests} requests, ${st.ok.size} events acknowledged, ${sink.duplicates()} duplicate(s), ` +
    `${st.failed} failed on purpose, ${st.rejected400} answered 400, ${st.badSignatures} bad signature(s)`);
}

async function upstreamFor(t) {
  const up = await startUpstream();
  t.after(() => up.stop());
  return up;
}


module.exports = { N_EVENTS, N_KEYS, TIMEOUT_MS, SECRET, lcg, makeEvents, report, upstreamFor };
