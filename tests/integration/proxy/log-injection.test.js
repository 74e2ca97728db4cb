'use strict';
// Log injection: strings a client chooses reach the proxy's log (here a relaybus* command name
// in the error that closes its connection). A command name carrying CR, LF and an escape
// sequence must give one log line, with the characters escaped, never a forged second line.

const test = require('node:test');
const assert = require('node:assert/strict');
const H = require('../lib/proxy');

const FORGED = '2026-01-01T00:00:00.000Z error [main] c999 10.0.0.1:1: forged line';

test('a command name with CR and LF is logged as one line, escaped', { timeout: 60000 }, async (t) => {
  const up = await H.startUpstream();
  t.after(() => up.stop());
  const proxy = await H.startProxy({ upstream: up.uri });
  t.after(() => proxy.kill());

  const conn = await H.WireConn.connect({ port: proxy.port });
  t.after(() => conn.destroy());
  assert.equal((await conn.command({ hello: 1, $db: 'admin' })).ok, 1);
  // moreToCome on a relaybus command cannot be answered: the proxy closes the connection and
  // logs why, with the command's name.
  const name = `relaybusX\r\n${FORGED}\x1b[2K\n`;
  const m = H.opMsg({ [name]: 1, $db: 'admin' }, { flags: 2 });
  await conn.write(m.buf);
  await conn.waitClosed(5000);
  const peer = `127.0.0.1:${conn.localPort}`;
  const line = await proxy.waitForLog(/moreToCome/, { needle: peer, timeoutMs: 3000 });
  assert.ok(line, `no log line for ${peer}:\n${H.tail(proxy.log())}`);

  const log = proxy.log();
  const lines = log.split('\n').filter((l) => l.includes('forged line'));
  assert.equal(lines.length, 1, `the command name spans ${lines.length} lines:\n${H.tail(log)}`);
  assert.ok(lines[0].includes(peer), `the forged text is not on the line of ${peer}: ${lines[0]}`);
  assert.ok(lines[0].includes(`relaybusX\\r\\n${FORGED}\\x1b[2K\\n`), `not escaped as expected: ${lines[0]}`);
  assert.ok(!log.includes('\r') && !log.includes('\x1b'), 'a raw CR or ESC reached the log');
  assert.ok(!lines.some((l) => l.startsWith('2026-01-01T00:00:00.000Z')), 'a forged line starts a log line');

  await proxy.stop();
});
