'use strict';
// relaybusDebugInternal sends a client's command upstream as the proxy's own request, past the
// publishing hook, so only a build configured with --enable-test-commands has it, and `make
// install` refuses such a build. Every other build answers CommandNotFound and sends nothing
// upstream. That includes the --enable-debug build that scripts/test runs. A test build is
// recognised by its --version, and there the command must work and the start-up log must warn.

const test = require('node:test');
const assert = require('node:assert/strict');
const { execFileSync } = require('node:child_process');
const H = require('../lib/proxy');

const DB = H.uniqueDbName('testcmds');
const testBuild = /--enable-test-commands/.test(execFileSync(H.proxyBin(), ['--version'], { encoding: 'utf8' }));
let upstream;
let proxy;

test.before(async () => {
  upstream = await H.startUpstream();
  proxy = await H.startProxy({ upstream: upstream.uri });
});

async function count(c, coll) {
  const r = await c.command({ count: coll, query: {}, $db: DB });
  assert.equal(r.ok, 1, JSON.stringify(r));
  return r.n;
}

test(
  testBuild ? 'a test build: relaybusDebugInternal runs its command upstream and the start-up log warns' : 'an ordinary build answers CommandNotFound to relaybusDebugInternal and sends nothing upstream',
  async (t) => {
    const skip = H.rawDataSkipReason();
    if (skip) return t.skip(skip);
    const c = await H.WireConn.connect({ port: proxy.port });
    try {
      assert.equal((await c.command({ hello: 1, $db: 'admin' })).ok, 1);
      const r = await c.command({
        relaybusDebugInternal: { insert: 'bypass', documents: [{ _id: 1 }], $db: DB },
        times: 1,
        $db: 'admin',
      });
      if (testBuild) {
        assert.equal(r.ok, 1, JSON.stringify(r));
        assert.equal(await count(c, 'bypass'), 1);
        assert.ok(proxy.logLines('test build (--enable-test-commands)').length > 0, 'the start-up log warns about the test build');
        return;
      }
      assert.equal(r.ok, 0, `relaybusDebugInternal was served: ${JSON.stringify(r)}`);
      assert.equal(r.code, 59);
      assert.equal(r.codeName, 'CommandNotFound');
      assert.equal(await count(c, 'bypass'), 0, 'the inner insert never reached the server');
      assert.equal(proxy.logLines('--enable-test-commands').length, 0, 'no test-build warning');
    } finally {
      await c.command({ dropDatabase: 1, $db: DB }).catch(() => {});
      c.destroy();
    }
  },
);

H.registerFinalChecks(test, [() => upstream && upstream.stop()]);
