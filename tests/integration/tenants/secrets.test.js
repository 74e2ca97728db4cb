'use strict';
// Hostile tenants: no broker's password leaks through an error text.
// One proxy delivers to four handlers whose settings carry credentials: NATS
// (nats-server with a user and password, the URL carries them), RabbitMQ
// (rabbitmq-server with a user and password in the URL), Kafka (librdkafka's
// mock cluster, SASL settings with a password) and a webhook (user
// information in its URL, and a signing secret).  Every broker is taken down
// and the webhook's endpoint answers 503 echoing the request's Authorization
// header (the Basic credential, base64 of user:password) and quoting the URL
// it was called by, as a gateway's error page does; every delivery fails and
// is buried.  Then the
// passwords and the secret are searched for in every document of the outbox
// (read from the upstream directly), in every answer of the admin port
// (/api/*, /readyz, /metrics, the dashboard page) and in every log line:
// they appear nowhere, and the errors are still there, their credentials
// masked ("********").

const test = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const http = require('node:http');
const { MongoClient } = require('mongodb');
const { startUpstream, uniqueDbName, clientUri, freePort, assertNoSanitizerReports } = require('../lib/proxy');
const { startNats, natsSkipReason } = require('../lib/nats');
const { startRabbit, rabbitSkipReason } = require('../lib/rabbitmq');
const { startKafka, kafkaSkipReason } = require('../lib/kafka');
const { startDispatchProxy, publishThroughProxy, waitFor, newSecret } = require('../dispatch/helpers');

const skip = natsSkipReason() || rabbitSkipReason() || kafkaSkipReason() || false;
const cleanups = [];

const tag = crypto.randomBytes(6).toString('hex');
const PASSWORDS = {
  nats: `natsPw-${tag}`,
  rabbitmq: `rabbitPw-${tag}`,
  kafka: `kafkaPw-${tag}`,
  webhook: `hookPw-${tag}`,
};
const HANDLERS = Object.keys(PASSWORDS);

// Every place a secret must not be: the message names what leaked, where.
function assertNoSecret(text, where, secrets) {
  for (const [name, s] of Object.entries(secrets))
    assert.ok(!text.includes(s), `the ${name} secret appears in ${where}: ...${text.slice(Math.max(0, text.indexOf(s) - 200), text.indexOf(s) + 60)}...`);
}

// An endpoint that fails every request with an error page echoing the request's Authorization
// header (the Basic credential curl made of the URL's user and password) and quoting the URL
// it was called by, credentials included (a gateway's "upstream refused").
async function startQuotingEndpoint() {
  const server = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => res.writeHead(503, { 'content-type': 'text/plain' })
      .end(`authorization: ${req.headers.authorization}; upstream ${server.quotedUrl} refused the request`));
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  server.quotedUrl = `http://hook:${PASSWORDS.webhook}@127.0.0.1:${server.address().port}/in`;
  return server;
}

test('a failing delivery keeps no password or secret in the outbox, the admin port or the log', { skip, timeout: 120000 }, async (t) => {
  const up = await startUpstream();
  cleanups.push(up);
  const [nats, rabbit, kafka, endpoint] = await Promise.all([
    startNats({ user: 'relay', pass: PASSWORDS.nats }),
    startRabbit({ user: 'relay', pass: PASSWORDS.rabbitmq }),
    startKafka(),
    startQuotingEndpoint(),
  ]);
  cleanups.push(() => nats.close(), () => rabbit.close(), () => kafka.close(), () => new Promise((r) => endpoint.close(r)));
  const secret = newSecret();
  const secrets = {
    ...PASSWORDS, 'webhook signing': secret, 'webhook signing key': secret.slice('whsec_'.length),
    'webhook Basic credential': Buffer.from(`hook:${PASSWORDS.webhook}`).toString('base64'),
  };

  const db = uniqueDbName('tenants_secrets');
  const adminPort = await freePort();
  const common = { events: 'order.*', max_attempts: 2, retry_schedule: '100ms', timeout_ms: 1000 };
  const p = await startDispatchProxy({
    upstream: up.uri, outbox: { database: db }, dispatch: { poll_interval_ms: 100 }, adminListen: `127.0.0.1:${adminPort}`,
    handlers: [
      { name: 'nats', kind: 'nats', url: nats.url, subject: 'rbt.{type}', ...common },
      { name: 'rabbitmq', kind: 'rabbitmq', url: rabbit.url, exchange: `rbt.${tag}`, ...common },
      {
        name: 'kafka', kind: 'kafka', brokers: kafka.brokers, topic: `rbt.${tag}`, ...common,
        'kafka.security.protocol': 'sasl_plaintext', 'kafka.sasl.mechanism': 'PLAIN',
        'kafka.sasl.username': 'relay', 'kafka.sasl.password': PASSWORDS.kafka,
      },
      { name: 'webhook', kind: 'webhook', url: endpoint.quotedUrl, secret, ...common },
    ],
  });
  t.after(() => p.kill());
  // The credentials were in use: both brokers accepted the proxy's login.
  await waitFor(() => /handler nats: connected to NATS/.test(p.log()) && /handler rabbitmq: connected to RabbitMQ/.test(p.log()),
    20000, 'the proxy to log in to NATS and RabbitMQ');
  await Promise.all([nats.stop(), rabbit.stop(), kafka.down()]);
  await waitFor(() => /lost RabbitMQ/.test(p.log()), 20000, 'the proxy to see RabbitMQ go');

  const client = await new MongoClient(clientUri({ host: '127.0.0.1', port: p.port })).connect();
  t.after(() => client.close());
  const direct = await new MongoClient(up.uri).connect();
  t.after(() => direct.close());
  await publishThroughProxy(client, db, [{ id: `e1-${tag}`, type: 'order.placed.v1', key: 'k1', payload: { n: 1 } },
    { id: `e2-${tag}`, type: 'order.placed.v1', payload: { n: 2 } }]);
  const deliveries = direct.db(db).collection('relaybus_deliveries');
  await waitFor(async () => (await deliveries.countDocuments({ status: 'dead' })) === 2 * HANDLERS.length, 60000,
    'every delivery to be buried after its two attempts');

  // The failures are recorded, their credentials masked.
  for (const d of await deliveries.find().toArray()) {
    assert.ok(d.lastError, `${d.handler}: a lastError`);
    if (d.handler === 'nats') assert.match(d.lastError, /nats:\/\/relay:\*{8}@127\.0\.0\.1/, 'the NATS URL, masked');
    if (d.handler === 'webhook') {
      assert.match(d.lastError, /authorization: Basic \*{8}; /, 'the echoed Basic credential, masked');
      assert.match(d.lastError, /http:\/\/hook:\*{8}@127\.0\.0\.1/, "the endpoint's quoted URL, masked");
    }
  }

  // Every document of every outbox collection.
  for (const c of await direct.db(db).listCollections().toArray()) {
    const docs = await direct.db(db).collection(c.name).find().toArray();
    assertNoSecret(JSON.stringify(docs), `the outbox collection ${c.name}`, secrets);
  }

  // Every answer of the admin port, the dashboard page included.
  const paths = ['/', '/readyz', '/metrics', '/api/stats', '/api/handlers', '/api/lanes', '/api/clients', '/api/config',
    '/api/deliveries?status=dead&limit=1000', '/api/deliveries?status=pending&limit=1000'];
  for (const path of paths) {
    const r = await fetch(`http://127.0.0.1:${adminPort}${path}`);
    const body = await r.text();
    assert.ok(r.status === 200 || (path === '/readyz' && r.status === 503), `${path}: ${r.status} ${body.slice(0, 200)}`);
    assertNoSecret(body, `the admin answer to ${path}`, secrets);
  }
  const dead = await (await fetch(`http://127.0.0.1:${adminPort}/api/deliveries?status=dead&limit=1000`)).json();
  assert.equal(JSON.stringify(dead).match(/\*{8}/g)?.length >= 2, true, 'the dead letters show their errors, masked');

  // Every log line, up to the proxy's exit.
  assert.equal((await p.stop()).code, 0);
  assertNoSanitizerReports(p.log(), 'the proxy');
  assert.match(p.log(), /nats/i, 'the log speaks of the NATS failures');
  assertNoSecret(p.log(), 'the log', secrets);
});

// Its proxy is the dispatch tests' (stopped and checked above): only the
// brokers and the upstream are left to stop.
test.after(async () => {
  for (const c of cleanups) await Promise.resolve(typeof c === 'function' ? c() : c && c.stop()).catch(() => {});
});
