#!/usr/bin/env bash
# bench/active-rss.sh - memory cost of busy client connections in relaybus-proxy.
#
#   bench/active-rss.sh [N] [BYTES]   # N connections, each inserting BYTES-byte documents, default 500 and 1024
#
# Like bench/idle-rss.sh: starts the server double and a proxy in front of it, reads the
# proxy's VmRSS, then has N client connections (each after its hello) insert one document of
# BYTES bytes after another, one request in flight per connection, for 5 s. It samples VmRSS
# every 100 ms while they run and prints the baseline, the peak, and the peak's excess over the
# baseline per busy connection (client + paired upstream connection, and the requests and
# replies in flight on them). A benchmark, not a test: it prints numbers and fails only if
# something does not work.
#
# RELAYBUS_PROXY_BIN names the proxy binary (default: <repo>/build/relaybus-proxy, as
# scripts/run and scripts/test build it, else <repo>/relaybus-proxy from an in-tree build).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
n="${1:-500}"
bytes="${2:-1024}"
case "$n$bytes" in ''|*[!0-9]*) echo "usage: $0 [N] [BYTES]" >&2; exit 2 ;; esac
if [ -z "${RELAYBUS_PROXY_BIN:-}" ]; then
	RELAYBUS_PROXY_BIN=$repo/build/relaybus-proxy
	[ -x "$RELAYBUS_PROXY_BIN" ] || RELAYBUS_PROXY_BIN=$repo/relaybus-proxy
fi
export RELAYBUS_PROXY_BIN
[ -x "$RELAYBUS_PROXY_BIN" ] || { echo "active-rss: no proxy binary at $RELAYBUS_PROXY_BIN" >&2; exit 2; }
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

cd "$repo/tests"
ACTIVE_N="$n" ACTIVE_BYTES="$bytes" exec node - <<'JS'
'use strict';
const fs = require('node:fs');
const H = require('./integration/lib/proxy');
const N = Number(process.env.ACTIVE_N);
const BYTES = Number(process.env.ACTIVE_BYTES);
const RUN_MS = 5000;

function rssKiB(pid) {
  const m = /VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(m[1]);
}

(async () => {
  const upstream = await H.startDouble({ ulimit: 65536 });
  const proxy = await H.startProxy({ upstream: upstream.uri, ulimit: 65536, settings: { max_clients: Math.max(N + 100, 1000) } });
  const conns = [];
  let code = 0;
  try {
    const w = await H.WireConn.connect({ port: proxy.port });
    await w.command({ hello: 1, $db: 'admin' });
    w.destroy();
    await H.sleep(500);
    const before = rssKiB(proxy.pid);
    for (let i = 0; i < N; i += 100) {
      await Promise.all(Array.from({ length: Math.min(100, N - i) }, async () => {
        const c = await H.WireConn.connect({ port: proxy.port, timeoutMs: 20000 });
        conns.push(c);
        await c.command({ hello: 1, $db: 'admin' }, { timeoutMs: 20000 });
      }));
    }
    const idle = rssKiB(proxy.pid);
    const pad = 'x'.repeat(Math.max(0, BYTES - 40));
    let done = 0;
    let peak = idle;
    const until = Date.now() + RUN_MS;
    const sampler = setInterval(() => { peak = Math.max(peak, rssKiB(proxy.pid)); }, 100);
    await Promise.all(conns.map(async (c, k) => {
      for (let j = 0; Date.now() < until; j++) {
        const r = await c.command({ insert: 'rss', documents: [{ _id: `${k}-${j}`, pad }], $db: 'activerss' }, { timeoutMs: 30000 });
        if (r.ok !== 1) throw new Error('insert failed: ' + JSON.stringify(r));
        done++;
      }
    }));
    clearInterval(sampler);
    peak = Math.max(peak, rssKiB(proxy.pid));
    const per = ((peak - before) * 1024) / N;
    console.log(`busy connections:      ${N}, each inserting ${BYTES}-byte documents, one at a time, for ${RUN_MS / 1000} s (${done} inserts)`);
    console.log(`proxy VmRSS before:    ${before} KiB`);
    console.log(`proxy VmRSS idle:      ${idle} KiB (the ${N} connections open, after hello)`);
    console.log(`proxy VmRSS peak:      ${peak} KiB (while busy)`);
    console.log(`RSS per busy client:   ${per.toFixed(0)} bytes (${(per / 1024).toFixed(1)} KiB, client + paired upstream connection)`);
  } catch (e) {
    console.error('active-rss: ' + e.message);
    code = 1;
  } finally {
    for (const c of conns) c.destroy();
    await proxy.stop().catch((e) => { console.error('active-rss: ' + e.message); code = 1; });
    await upstream.stop().catch(() => {});
  }
  process.exit(code);
})();
JS
