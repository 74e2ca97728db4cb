'use strict';
// kind = rabbitmq over amqps://: a CA, a server certificate for localhost
// and 127.0.0.1 and a client certificate made with openssl; Debian's
// rabbitmq-server with a TLS listener that requires a client certificate
// (verify_peer, fail_if_no_peer_cert). A proxy whose tls_ca_file is another
// CA logs OpenSSL's verification failure, shows it in /readyz and delivers
// nothing, its deliveries waiting (none dead); so does one that names the
// broker by an address its certificate does not carry; the proxy restarted with
// the right CA delivers every event, read back with amqplib over plain amqp
// on the same broker. --check-config refuses an unreadable CA file and the
// TLS keys on an amqp:// URL or on another kind.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const amqp = require('amqplib');
const { MongoClient } = require('mongodb');
const { startUpstream, uniqueDbName, sleep, tmpDir, proxyBin, clientUri, freePort } = require('../lib/proxy');
const { startRabbit, rabbitSkipReason } = require('../lib/rabbitmq');
const { startDispatchProxy, waitFor } = require('../dispatch/helpers');

const N_EVENTS = 200;
const skip = rabbitSkipReason() || (process.env.RABBITMQ_URL ? 'RABBITMQ_URL names an external broker: the test needs its own with a TLS listener' : false);

function openssl(dir, args) {
  const r = spawnSync('openssl', args, { cwd: dir, encoding: 'utf8', timeout: 20000 });
  if (r.status !== 0) throw new Error(`openssl ${args.join(' ')}: ${r.stderr}`);
}

// A CA (ca.pem), a certificate it signs for `cn` with the given SANs
// (name.pem, name.key), in dir.
function makeCa(dir, name) {
  openssl(dir, ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '2', '-subj', `/CN=${name}`,
    '-keyout', `${name}.key`, '-out', `${name}.pem`]);
  return { cert: path.join(dir, `${name}.pem`), key: path.join(dir, `${name}.key`) };
}

function makeCert(dir, ca, name, cn, san) {
  fs.writeFileSync(path.join(dir, `${name}.ext`), `subjectAltName = ${san}\n`);
  openssl(dir, ['req', '-newkey', 'rsa:2048', '-nodes', '-subj', `/CN=${cn}`, '-keyout', `${name}.key`, '-out', `${name}.csr`]);
  openssl(dir, ['x509', '-req', '-in', `${name}.csr`, '-CA', ca.cert, '-CAkey', ca.key, '-CAcreateserial', '-days', '2',
    '-extfile', `${name}.ext`, '-out', `${name}.pem`]);
  return { cert: path.join(dir, `${name}.pem`), key: path.join(dir, `${name}.key`) };
}

async function declare(url, exchange, queue) {
  const conn = await amqp.connect(url);
  try {
    const ch = await conn.createChannel();
    await ch.assertExchange(exchange, 'topic', { durable: true });
    await ch.assertQueue(queue, { durable: true });
    await ch.bindQueue(queue, exchange, 'order.#');
    await ch.close();
  } finally {
    await conn.close();
  }
}

async function drain(url, queue) {
  const conn = await amqp.connect(url);
  try {
    const ch = await conn.createChannel();
    const out = [];
    for (;;) {
      const m = await ch.get(queue, { noAck: true });
      if (!m) break;
      out.push({ messageId: m.properties.messageId, body: JSON.parse(m.content.toString('utf8')) });
    }
    await ch.close();
    return out;
  } finally {
    await conn.close();
  }
}

async function publishThroughProxy(client, dbName, events) {
  const items = client.db(dbName).collection('items');
  for (let i = 0; i < events.length; i += 20) {
    const session = client.startSession();
    try {
      await session.withTransaction(async () => {
        for (const e of events.slice(i, i + 20))
          await items.insertOne({ _id: e.id }, { session, comment: { relaybus: { type: e.type, id: e.id, key: e.key, payload: e.payload } } });
      });
    } finally {
      await session.endSession();
    }
  }
}

test(`amqps: a wrong CA or host name is refused with the reason and delivers nothing; with the right ones all ${N_EVENTS} events arrive`, { skip, timeout: 120000 }, async (t) => {
  const certs = tmpDir('relaybus-rabbit-tls-');
  t.after(() => fs.rmSync(certs, { recursive: true, force: true }));
  const ca = makeCa(certs, 'ca');
  const other = makeCa(certs, 'other-ca');
  // Only the name localhost: 127.0.0.1 is a wrong host name for it.
  const server = makeCert(certs, ca, 'server', 'localhost', 'DNS:localhost');
  const client = makeCert(certs, ca, 'client', 'relaybus-proxy', 'DNS:relaybus-proxy');
  const up = await startUpstream();
  t.after(() => up.stop());
  const rabbit = await startRabbit({
    tls: { cacertfile: ca.cert, certfile: server.cert, keyfile: server.key, verify: 'verify_peer', fail_if_no_peer_cert: 'true' },
  });
  t.after(() => rabbit.close());
  const exchange = `rbt.${process.pid}.tls`;
  const queue = `${exchange}.q`;
  await declare(rabbit.url, exchange, queue);
  const db = uniqueDbName('brokers_rabbit_tls');
  const adminPort = await freePort();
  const handler = {
    name: 'bus', events: 'order.*', kind: 'rabbitmq', url: rabbit.amqpsUrl, exchange, timeout_ms: 2000,
    tls_ca_file: other.cert, tls_cert_file: client.cert, tls_key_file: client.key,
    // Enough attempts to outlast the wrong-CA phase with a wide margin.
    retry_schedule: ['200ms', '500ms', ...Array(40).fill('1s')].join(', '),
  };
  const o = { upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 100 }, adminListen: `127.0.0.1:${adminPort}`, handlers: [handler] };
  const bad = await startDispatchProxy(o);
  t.after(() => bad.kill());
  const mc = await new MongoClient(clientUri({ host: '127.0.0.1', port: bad.port })).connect();
  const events = [];
  for (let i = 0; i < N_EVENTS; i++) events.push({ id: `tls-${i}`, type: 'order.placed.v1', key: `key-${i % 10}`, payload: { i } });
  await publishThroughProxy(mc, db, events);
  await mc.close();
  await waitFor(() => /cannot connect to RabbitMQ yet \(TLS handshake with localhost:\d+: .*certificate/.test(bad.log()), 20000, 'the verification failure in the log');
  const line = bad.log().split('\n').find((l) => /TLS handshake/.test(l));
  t.diagnostic(line);
  assert.match(line, /unable to get local issuer certificate|self-signed certificate|certificate verify failed/, "OpenSSL's reason");
  const r = await (await fetch(`http://127.0.0.1:${adminPort}/readyz`)).json();
  assert.equal(r.brokers.length, 1);
  assert.equal(r.brokers[0].state, 'disconnected');
  assert.match(JSON.stringify(r.brokers[0]), /TLS handshake/, `/readyz shows the failure: ${JSON.stringify(r.brokers[0])}`);
  await sleep(2000);
  const direct = await new MongoClient(up.uri).connect();
  t.after(() => direct.close());
  const deliveries = direct.db(db).collection('relaybus_deliveries');
  assert.equal(await deliveries.countDocuments({ status: 'dead' }), 0, 'a TLS failure is retried, not dead');
  assert.equal(await deliveries.countDocuments({ status: 'completed' }), 0, 'nothing delivered with the wrong CA');
  assert.equal((await drain(rabbit.url, queue)).length, 0, 'nothing in the queue');
  assert.equal((await bad.stop()).code, 0);

  // The right CA, but a host name the certificate does not carry.
  const wrongHost = await startDispatchProxy({ ...o, handlers: [{ ...handler, tls_ca_file: ca.cert, url: rabbit.amqpsUrl.replace('@localhost:', '@127.0.0.1:') }] });
  t.after(() => wrongHost.kill());
  await waitFor(() => /cannot connect to RabbitMQ yet \(TLS handshake with 127\.0\.0\.1:\d+: .*host ?name/i.test(wrongHost.log()), 20000, 'the host name failure in the log')
    .catch((err) => { throw new Error(`${err.message}:\n${wrongHost.log()}`); });
  t.diagnostic(wrongHost.log().split('\n').find((l) => /TLS handshake/.test(l)));
  assert.equal(await deliveries.countDocuments({ status: 'completed' }), 0, 'nothing delivered to a wrong host name');
  assert.equal(await deliveries.countDocuments({ status: 'dead' }), 0, 'a TLS failure is retried, not dead');
  assert.equal((await wrongHost.stop()).code, 0);

  // The configuration fixed, the proxy started again.
  const good = await startDispatchProxy({ ...o, handlers: [{ ...handler, tls_ca_file: ca.cert }] });
  t.after(() => good.kill());
  await waitFor(async () => (await deliveries.countDocuments({ status: { $nin: ['dead', 'completed'] } })) === 0, 60000, 'every delivery to complete');
  assert.equal(await deliveries.countDocuments({ status: 'dead' }), 0, 'no dead letter');
  assert.match(good.log(), /handler bus: connected to RabbitMQ at localhost:\d+ \(amqps\)/);
  const msgs = await drain(rabbit.url, queue);
  const seen = new Set(msgs.map((m) => m.body.id));
  for (const e of events) assert.ok(seen.has(e.id), `${e.id} reached the queue`);
  t.diagnostic(`${N_EVENTS} events, ${msgs.length} messages over amqps`);
  assert.deepEqual((await (await fetch(`http://127.0.0.1:${adminPort}/readyz`)).json()).brokers, [{ name: 'bus', kind: 'rabbitmq', state: 'connected' }]);
  assert.equal((await good.stop()).code, 0);
});

test('amqps configuration: --check-config refuses an unreadable CA file and TLS keys where they do not apply', { timeout: 60000 }, async () => {
  const dir = tmpDir('relaybus-rabbit-tls-conf-');
  const pem = path.join(dir, 'ca.pem');
  fs.writeFileSync(pem, 'not read by --check-config\n');
  const missing = path.join(dir, 'missing.pem');
  const cases = [
    [{ kind: 'rabbitmq', url: 'amqps://127.0.0.1', exchange: 'x', tls_ca_file: missing }, `[handler h] tls_ca_file: cannot read '${missing}': No such file or directory`],
    [{ kind: 'rabbitmq', url: 'amqp://127.0.0.1', exchange: 'x', tls_ca_file: pem }, '[handler h] tls_ca_file, tls_cert_file and tls_key_file need an amqps:// url'],
    [{ kind: 'rabbitmq', url: 'amqps://127.0.0.1', exchange: 'x', tls_cert_file: pem }, '[handler h] tls_cert_file and tls_key_file go together (tls_key_file is not set)'],
    [{ kind: 'nats', url: 'nats://127.0.0.1', subject: 'x', tls_ca_file: pem }, '[handler h] tls_ca_file, tls_cert_file and tls_key_file are for kind = webhook with an https:// url or kind = rabbitmq with an amqps:// url'],
  ];
  for (const [keys, want] of cases) {
    const lines = ['[proxy]', 'listen = 127.0.0.1:0', 'upstream = mongodb://127.0.0.1:1/?replicaSet=rs0', '', '[handler h]', 'events = order.*'];
    for (const [k, v] of Object.entries(keys)) lines.push(`${k} = ${v}`);
    const ini = path.join(dir, 'bad.ini');
    fs.writeFileSync(ini, lines.join('\n') + '\n');
    const chk = spawnSync(proxyBin(), ['-c', ini, '--check-config'], { encoding: 'utf8', timeout: 10000 });
    assert.notEqual(chk.status, 0, `--check-config refuses ${JSON.stringify(keys)}`);
    assert.ok(chk.stderr.includes(want), `--check-config names the problem: ${want}\n${chk.stderr}`);
  }
  // A readable CA file on an amqps:// URL passes.
  const ok = path.join(dir, 'ok.ini');
  fs.writeFileSync(ok, ['[proxy]', 'listen = 127.0.0.1:0', 'upstream = mongodb://127.0.0.1:1/?replicaSet=rs0', '', '[handler h]',
    'events = order.*', 'kind = rabbitmq', 'url = amqps://guest:guest@localhost', 'exchange = x', `tls_ca_file = ${pem}`].join('\n') + '\n');
  const chk = spawnSync(proxyBin(), ['-c', ok, '--check-config'], { encoding: 'utf8', timeout: 10000 });
  assert.equal(chk.status, 0, chk.stderr);
  fs.rmSync(dir, { recursive: true, force: true });
});
