'use strict';
// The proxy's own SCRAM server (codec/scram.c, what pooled mode will authenticate clients
// with) against the Node.js driver's SCRAM client: the driver's ScramSHA256 and ScramSHA1
// providers run their conversations, plain (saslStart, saslContinue) and speculative (the
// hello's speculativeAuthenticate), through tests/tools/scram-server, one process per
// conversation. The driver checks the server's signature itself, so a login that succeeds
// means both sides derived the same keys. Users come from `relaybus-proxy --make-user` and
// from RFC 7677. Nothing here talks to MongoDB, so the test is the same with MONGODB_URI.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { execFileSync, spawn } = require('node:child_process');
const readline = require('node:readline');
const { Binary } = require('mongodb');
const { ScramSHA1, ScramSHA256 } = require('mongodb/lib/cmap/auth/scram');
const { MongoCredentials } = require('mongodb/lib/cmap/auth/mongo_credentials');
const { AuthContext } = require('mongodb/lib/cmap/auth/auth_provider');
const H = require('../lib/proxy');

const BIN = H.proxyBin();
const SERVER = path.join(path.dirname(BIN), 'tests', 'tools', 'scram-server');
// RFC 7677's user (keys computed with Python's hashlib from "pencil").
const RFC7677 =
  'user:SCRAM-SHA-256:4096:W22ZaJ0SNY7soEsUEjb6gQ==:WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:' +
  'wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=\n';
let authFile;

// One scram-server process: each exchange writes a message and reads its answer.
function harness(mechanism) {
  const child = spawn(SERVER, [authFile, mechanism], { stdio: ['pipe', 'pipe', 'inherit'] });
  const lines = readline.createInterface({ input: child.stdout })[Symbol.asyncIterator]();
  return {
    async exchange(bytes) {
      child.stdin.write(Buffer.from(bytes).toString('base64') + '\n');
      const { value, done } = await lines.next();
      assert.ok(!done, 'scram-server ended without an answer');
      const [kind, ...rest] = value.split(' ');
      if (kind !== 'ok') {
        // mongod answers every refused login with 18 AuthenticationFailed.
        const e = new Error(`Authentication failed: ${rest.slice(1).join(' ')}`);
        e.code = 18;
        throw e;
      }
      // As a reply's payload arrives: BinData.
      return new Binary(Buffer.from(rest[0], 'base64'));
    },
    close() {
      child.stdin.end();
      child.kill();
    },
  };
}

const bytesOf = (bin) => Buffer.from(bin.buffer.subarray(0, bin.position));

// Logs in as `user` with the driver's provider for `mechanism`; returns the SASL commands it sent.
async function login(mechanism, user, password, speculative) {
  const Provider = mechanism === 'SCRAM-SHA-1' ? ScramSHA1 : ScramSHA256;
  const provider = new Provider();
  const credentials = new MongoCredentials({ username: user, password, source: 'admin', mechanism, mechanismProperties: {} });
  const h = harness(mechanism);
  const sent = [];
  const connection = {
    async command(ns, cmd) {
      sent.push(Object.keys(cmd)[0]);
      if (cmd.saslStart) {
        assert.equal(cmd.mechanism, mechanism);
        return { ok: 1, conversationId: 1, done: false, payload: await h.exchange(bytesOf(cmd.payload)) };
      }
      assert.equal(cmd.conversationId, 1);
      // skipEmptyExchange: the answer to client-final is the last one.
      return { ok: 1, conversationId: 1, done: true, payload: await h.exchange(bytesOf(cmd.payload)) };
    },
  };
  const ctx = new AuthContext(connection, credentials, {});
  try {
    const hello = await provider.prepare({ hello: 1 }, ctx);
    if (speculative) {
      const spec = hello.speculativeAuthenticate;
      assert.equal(spec.db, 'admin');
      ctx.response = { speculativeAuthenticate: { conversationId: 1, done: false, payload: await h.exchange(bytesOf(spec.payload)) } };
    }
    await provider.auth(ctx);
    return sent;
  } finally {
    h.close();
  }
}

test.before(() => {
  if (!fs.existsSync(SERVER)) {
    // Built by `make check`; a plain `make` leaves it out.
    execFileSync('make', ['-C', path.dirname(BIN), 'tests/tools/scram-server'], { stdio: 'ignore' });
  }
  const dir = H.tmpDir('relaybus-scram-');
  authFile = path.join(dir, 'users.auth');
  const made = execFileSync(BIN, ['--make-user', 'app'], { input: 'n0de-driver secret\n' }).toString();
  assert.match(made, /^app:SCRAM-SHA-256:15000:[^:]+:[^:]+:[^:]+\napp:SCRAM-SHA-1:10000:[^:]+:[^:]+:[^:]+\n$/);
  assert.ok(!made.includes('secret'));
  fs.writeFileSync(authFile, RFC7677 + made, { mode: 0o600 });
});

for (const mechanism of ['SCRAM-SHA-256', 'SCRAM-SHA-1']) {
  test(`${mechanism}: the driver logs in with a --make-user entry, and the server's signature verifies`, async () => {
    assert.deepEqual(await login(mechanism, 'app', 'n0de-driver secret', false), ['saslStart', 'saslContinue']);
  });

  test(`${mechanism}: speculative authentication in the hello, then one saslContinue`, async () => {
    assert.deepEqual(await login(mechanism, 'app', 'n0de-driver secret', true), ['saslContinue']);
  });

  test(`${mechanism}: a wrong password is refused with code 18`, async () => {
    for (const speculative of [false, true]) {
      await assert.rejects(login(mechanism, 'app', 'n0de-driver secreT', speculative), (e) => e.code === 18 && /wrong proof/.test(e.message));
    }
  });

  test(`${mechanism}: an unknown user is refused with code 18`, async () => {
    await assert.rejects(login(mechanism, 'nobody', 'x', false), (e) => e.code === 18 && /unknown user/.test(e.message));
  });
}

test("SCRAM-SHA-256: RFC 7677's user with the driver, and no SCRAM-SHA-1 entry for it", async () => {
  await login('SCRAM-SHA-256', 'user', 'pencil', false);
  await assert.rejects(login('SCRAM-SHA-1', 'user', 'pencil', false), (e) => e.code === 18 && /no entry for this mechanism/.test(e.message));
});
