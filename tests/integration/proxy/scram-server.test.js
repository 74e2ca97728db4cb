'use strict';
// The proxy's own SCRAM server (codec/scram.c, what pooled mode will authenticate clients
// with) against real clients. First the Node.js driver's ScramSHA256 and ScramSHA1 providers,
// driven directly, run their conversations, plain (saslStart, saslContinue) and speculative
// (the hello's speculativeAuthenticate), through tests/tools/scram-server, one process per
// conversation. Then whole clients (the Node.js driver's MongoClient, pymongo's and
// mongo-c-driver's) log in through a minimal wire endpoint that hands each conversation to the
// same tool. The drivers check the server's signature themselves, so a login that succeeds
// means both sides derived the same keys. Users come from `relaybus-proxy --make-user` and
// from RFC 7677. Nothing here talks to MongoDB, so the test is the same against any upstream.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { execFile, execFileSync, spawn } = require('node:child_process');
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

// The same server behind a minimal wire endpoint, the way mongod frames the SASL commands, so
// that a whole MongoClient authenticates through it: mechanism negotiation with
// saslSupportedMechs, speculative authentication in the handshake, and saslStart/saslContinue.
// Each connection runs its conversations through
// scram-server; the endpoint itself only frames messages (it stands in for the pool's command
// layer, which is not built yet).
const net = require('node:net');
const { MongoClient } = require('mongodb');
const { BSON } = require('bson');

function reply(req, doc) {
  let buf;
  if (req.opCode === H.OP_QUERY) {
    const body = BSON.serialize(doc);
    const fixed = Buffer.alloc(20);
    fixed.writeInt32LE(1, 16); // numberReturned
    buf = Buffer.concat([H.header(16 + 20 + body.length, H.newRequestId(), req.requestID, H.OP_REPLY), fixed, body]);
  } else {
    buf = H.opMsg(doc).buf;
    buf.writeInt32LE(req.requestID, 8);
  }
  return buf;
}

const mechsOf = (user) =>
  fs.readFileSync(authFile, 'utf8').split('\n').filter((l) => l.startsWith(`${user}:`)).map((l) => l.slice(user.length + 1).split(':')[0]);
const AUTH_FAILED = { ok: 0, code: 18, codeName: 'AuthenticationFailed', errmsg: 'Authentication failed.' };

// speculative: false answers hellos as a server without speculative authentication would.
function startEndpoint({ speculative = true } = {}) {
  const seen = [];
  const mechanisms = [];
  const server = net.createServer((sock) => {
    const framer = new H.Framer();
    let h = null;
    let authenticated = false;
    const start = async (mechanism, payload) => {
      mechanisms.push(mechanism);
      if (h) h.close();
      h = harness(mechanism);
      return h.exchange(payload);
    };
    let chain = Promise.resolve();
    sock.on('data', (chunk) => {
      for (const raw of framer.push(chunk)) {
        chain = chain.then(async () => {
          const req = H.parseMessage(raw);
          const cmd = req.docs[0].$query || req.docs[0];
          const name = Object.keys(cmd)[0];
          seen.push(name);
          let doc;
          try {
            if (H.isHelloDoc(cmd)) {
              doc = { ismaster: true, helloOk: true, msg: 'isdbgrid', maxBsonObjectSize: 16777216, maxMessageSizeBytes: 48000000,
                maxWriteBatchSize: 100000, localTime: new Date(), logicalSessionTimeoutMinutes: 30, connectionId: 1,
                minWireVersion: 0, maxWireVersion: 21, readOnly: false, ok: 1 };
              if (cmd.saslSupportedMechs) doc.saslSupportedMechs = mechsOf(cmd.saslSupportedMechs.split('.').slice(1).join('.'));
              const spec = cmd.speculativeAuthenticate;
              if (spec && speculative) {
                // mongod leaves the field out when the first step fails.
                try {
                  doc.speculativeAuthenticate = { conversationId: 1, done: false, payload: await start(spec.mechanism, bytesOf(spec.payload)), ok: 1 };
                } catch {}
              }
            } else if (name === 'saslStart') {
              doc = { conversationId: 1, done: false, payload: await start(cmd.mechanism, bytesOf(cmd.payload)), ok: 1 };
            } else if (name === 'saslContinue') {
              doc = { conversationId: 1, done: true, payload: await h.exchange(bytesOf(cmd.payload)), ok: 1 };
              authenticated = true;
            } else if (name === 'ping' || name === 'endSessions') {
              doc = { ok: 1 };
            } else if (!authenticated) {
              doc = { ok: 0, code: 13, codeName: 'Unauthorized', errmsg: `command ${name} requires authentication` };
            } else {
              doc = { ok: 1, databases: [], totalSize: 0 };
            }
          } catch (e) {
            doc = AUTH_FAILED;
          }
          if (!sock.destroyed) sock.write(reply(req, doc));
        });
      }
    });
    sock.on('close', () => h && h.close());
    sock.on('error', () => {});
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve({ server, port: server.address().port, seen, mechanisms })));
}

async function listDatabasesAs(ep, user, password, params = '') {
  const uri = `mongodb://${encodeURIComponent(user)}:${encodeURIComponent(password)}@127.0.0.1:${ep.port}/?authSource=admin&directConnection=true&serverSelectionTimeoutMS=5000${params}`;
  const client = new MongoClient(uri, { monitorCommands: false });
  try {
    return await client.db('admin').command({ listDatabases: 1 });
  } finally {
    await client.close();
  }
}

for (const [label, params, mech] of [
  ['negotiated (saslSupportedMechs)', '', 'SCRAM-SHA-256'],
  ['SCRAM-SHA-256 named', '&authMechanism=SCRAM-SHA-256', 'SCRAM-SHA-256'],
  ['SCRAM-SHA-1 named', '&authMechanism=SCRAM-SHA-1', 'SCRAM-SHA-1'],
]) {
  test(`a MongoClient authenticates, ${label}, speculatively in its handshake`, async () => {
    const ep = await startEndpoint();
    try {
      const res = await listDatabasesAs(ep, 'app', 'n0de-driver secret', params);
      assert.equal(res.ok, 1);
      // Speculative authentication: no saslStart on the connection that ran the command.
      assert.ok(!ep.seen.includes('saslStart'), `saslStart sent: ${ep.seen}`);
      assert.ok(ep.seen.includes('saslContinue'));
      assert.deepEqual([...new Set(ep.mechanisms)], [mech]);
    } finally {
      ep.server.close();
    }
  });
}

test('a MongoClient with a wrong password gets 18 AuthenticationFailed', async () => {
  const ep = await startEndpoint();
  try {
    await assert.rejects(listDatabasesAs(ep, 'app', 'wrong'), (e) => e.code === 18);
  } finally {
    ep.server.close();
  }
});

test("a MongoClient authenticates with saslStart when the hello answers no speculativeAuthenticate (RFC 7677's user)", async () => {
  const ep = await startEndpoint({ speculative: false });
  try {
    const res = await listDatabasesAs(ep, 'user', 'pencil', '&authMechanism=SCRAM-SHA-256');
    assert.equal(res.ok, 1);
    assert.ok(ep.seen.includes('saslStart'), `no saslStart: ${ep.seen}`);
    assert.deepEqual([...new Set(ep.mechanisms)], ['SCRAM-SHA-256']);
  } finally {
    ep.server.close();
  }
});

// pymongo (Debian's, 3.11) as a second whole client: its handshake speculates too.
const PYMONGO = `
import sys
from pymongo import MongoClient
from pymongo.errors import OperationFailure
c = MongoClient(sys.argv[1], serverSelectionTimeoutMS=5000)
try:
    print(c.admin.command("listDatabases")["ok"])
except OperationFailure as e:
    print("code", e.code)
`;
const havePymongo = (() => {
  try {
    execFileSync('/usr/bin/python3', ['-c', 'import pymongo'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
})();

for (const [params, mech] of [['', 'SCRAM-SHA-256'], ['&authMechanism=SCRAM-SHA-1', 'SCRAM-SHA-1']]) {
  test(`pymongo's MongoClient authenticates with ${mech}, and a wrong password gets 18`, { skip: !havePymongo && 'pymongo is not installed (Debian python3-pymongo)' }, async () => {
    const ep = await startEndpoint();
    try {
      const run = (password) => {
        const uri = `mongodb://app:${encodeURIComponent(password)}@127.0.0.1:${ep.port}/?authSource=admin&directConnection=true${params}`;
        return new Promise((resolve, reject) => {
          execFile('/usr/bin/python3', ['-c', PYMONGO, uri], { timeout: 30000 }, (err, stdout, stderr) =>
            err ? reject(new Error(`${err.message}: ${stderr}`)) : resolve(stdout.trim()));
        });
      };
      assert.match(await run('n0de-driver secret'), /^1(\.0)?$/);
      assert.deepEqual([...new Set(ep.mechanisms)], [mech]);
      assert.equal(await run('n0de-driver secreT'), 'code 18');
    } finally {
      ep.server.close();
    }
  });
}

// mongo-c-driver as the third whole client (tests/tools/scram-cdriver.c, built here).
let cdriver = null;
function cdriverClient() {
  if (!cdriver) cdriver = H.buildCdriverClient(path.join(H.REPO, 'tests', 'tools', 'scram-cdriver.c'));
  return cdriver;
}

for (const [params, mech] of [['', 'SCRAM-SHA-256'], ['&authMechanism=SCRAM-SHA-1', 'SCRAM-SHA-1']]) {
  test(`mongo-c-driver authenticates with ${mech}, and a wrong password gets 18`, async () => {
    const bin = cdriverClient();
    const ep = await startEndpoint();
    try {
      const run = (password) => {
        const uri = `mongodb://app:${encodeURIComponent(password)}@127.0.0.1:${ep.port}/?authSource=admin&directConnection=true&serverSelectionTimeoutMS=5000${params}`;
        return new Promise((resolve) => {
          execFile(bin, [uri], { timeout: 30000 }, (err, stdout) => resolve(stdout.trim()));
        });
      };
      assert.equal(await run('n0de-driver secret'), 'ok');
      assert.deepEqual([...new Set(ep.mechanisms)], [mech]);
      // libmongoc reports the server's 18 as its own MONGOC_ERROR_CLIENT_AUTHENTICATE.
      assert.match(await run('n0de-driver secreT'), /^error 1 11 Authentication failed/);
    } finally {
      ep.server.close();
    }
  });
}
