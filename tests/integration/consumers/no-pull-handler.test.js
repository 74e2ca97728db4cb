'use strict';
// A proxy started without a kind = pull handler runs no consumer thread: relaybusClaim of a
// webhook handler is refused as such, and the per-handler relaybusStatus answers that no
// consumer thread runs (InternalError, with the way out), never a transient error a client
// would retry for ever.

const test = require('node:test');
const assert = require('node:assert/strict');
const C = require('./lib');

const { H, P } = C;
let s;

test('without a pull handler: the consumer commands say why they cannot run', async () => {
  s = await P.startStack({
    handlers: {},
    extraIni: '[handler hooks]\nevents = order.*\nkind = webhook\nurl = http://127.0.0.1:9/never\n',
  });
  await P.expectCode(C.cmd(s.client, { relaybusClaim: 'hooks' }), 2, /kind = webhook/);
  const e = await P.expectCode(C.cmd(s.client, { relaybusStatus: 'hooks' }), 1, /no consumer thread runs .*kind = pull/);
  assert.equal(e.codeName, 'InternalError');
  const old = await C.cmd(s.client, { relaybusStatus: 1 });
  assert.equal(old.proxy, 'relaybus-proxy');
});

H.registerFinalChecks(test, [() => s && s.upstream.stop()], { beforeStop: () => s && s.closeClients() });
