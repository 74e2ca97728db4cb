#!/usr/bin/env bash
# bench/idle-rss.sh - memory cost of idle client connections in relaybus-proxy.
#
#   bench/idle-rss.sh [N] [--pooled [SIZE]]   # N idle connections, default 2000
#
# Starts the server double and a proxy in front of it (both with a raised fd limit), reads the
# proxy's VmRSS from /proc/PID/status, opens N client connections that each complete a hello
# and then sit idle, reads VmRSS again, and prints before, after and the difference per idle
# connection (each idle client also holds its paired upstream connection). A benchmark, not a
# test: it prints numbers and fails only if something does not work.
#
# --pooled runs the proxy with pool_mode = pooled and pool_size = SIZE (default 16), threads = 1:
# a client connection then holds no upstream connection, only its own socket (bench/run's
# relaybus-pooled target measures the same next to session mode and HAProxy).
#
# RELAYBUS_PROXY_BIN names the proxy binary (default: <repo>/build/relaybus-proxy, as
# scripts/run and scripts/test build it, else <repo>/relaybus-proxy from an in-tree build).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
n=2000
pool_size=
while [ $# -gt 0 ]; do
	case "$1" in
	--pooled)
		pool_size=16
		case "${2:-}" in ''|*[!0-9]*) ;; *) pool_size=$2; shift ;; esac ;;
	*[!0-9]*|'') echo "usage: $0 [N] [--pooled [SIZE]]" >&2; exit 2 ;;
	*) n=$1 ;;
	esac
	shift
done
if [ -z "${RELAYBUS_PROXY_BIN:-}" ]; then
	RELAYBUS_PROXY_BIN=$repo/build/relaybus-proxy
	[ -x "$RELAYBUS_PROXY_BIN" ] || RELAYBUS_PROXY_BIN=$repo/relaybus-proxy
fi
export RELAYBUS_PROXY_BIN
[ -x "$RELAYBUS_PROXY_BIN" ] || { echo "idle-rss: no proxy binary at $RELAYBUS_PROXY_BIN" >&2; exit 2; }
# The client side of the benchmark needs N descriptors too.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

cd "$repo/tests"
IDLE_N="$n" IDLE_POOL_SIZE="$pool_size" exec node - <<'JS'
'use strict';
const fs = require('node:fs');
const H = require('./integration/lib/proxy');
const N = Number(process.env.IDLE_N);
const POOL_SIZE = process.env.IDLE_POOL_SIZE ? Number(process.env.IDLE_POOL_SIZE) : 0;

function rssKiB(pid) {
  const m = /VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(m[1]);
}

(async () => {
  const upstream = await H.startDouble({ ulimit: 65536 });
  const settings = { max_clients: Math.max(N + 100, 1000) };
  if (POOL_SIZE) Object.assign(settings, { pool_mode: 'pooled', pool_size: POOL_SIZE, threads: 1 });
  const proxy = await H.startProxy({ upstream: upstream.uri, ulimit: 65536, settings });
  const conns = [];
  let code = 0;
  try {
    // Warm up: one connection through the whole path, then let the allocator settle.
    const w = await H.WireConn.connect({ port: proxy.port });
    await w.command({ hello: 1, $db: 'admin' });
    w.destroy();
    await H.sleep(500);
    const before = rssKiB(proxy.pid);
    const t0 = Date.now();
    for (let i = 0; i < N; i += 100) {
      await Promise.all(
        Array.from({ length: Math.min(100, N - i) }, async () => {
          const c = await H.WireConn.connect({ port: proxy.port, timeoutMs: 20000 });
          conns.push(c);
          const r = await c.command({ hello: 1, $db: 'admin' }, { timeoutMs: 20000 });
          if (r.ok !== 1) throw new Error('hello failed: ' + JSON.stringify(r));
        }),
      );
    }
    const openMs = Date.now() - t0;
    await H.sleep(1000);
    const after = rssKiB(proxy.pid);
    const open = conns.filter((c) => !c.closed).length;
    if (open !== N) throw new Error(`${N - open} connections were closed while idle`);
    const per = ((after - before) * 1024) / N;
    console.log(`idle connections:      ${N} (opened with hello in ${openMs} ms)`);
    console.log(`proxy VmRSS before:    ${before} KiB`);
    console.log(`proxy VmRSS after:     ${after} KiB`);
    const what = POOL_SIZE ? `pooled, pool_size ${POOL_SIZE}: the client socket only` : 'client + paired upstream connection';
    console.log(`RSS per idle client:   ${per.toFixed(0)} bytes (${(per / 1024).toFixed(1)} KiB, ${what})`);
  } catch (e) {
    console.error('idle-rss: ' + e.message);
    code = 1;
  } finally {
    for (const c of conns) c.destroy();
    await proxy.stop().catch((e) => {
      console.error('idle-rss: ' + e.message);
      code = 1;
    });
    await upstream.stop();
  }
  process.exit(code);
})();
JS
