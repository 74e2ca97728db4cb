'use strict';
// Shared set-up of the publishing tests: a server double (or scripts/test --upstream's
// deployment), a proxy in front of it
// with handlers, a client through the proxy and a direct client that reads the outbox as an
// operator would (never through the proxy, so reads cannot be confused with what is tested).
//
//   const P = require('./lib');
//   const s = await P.startStack({ handlers: P.HANDLERS });
//   ... s.client (through the proxy), s.direct (straight to the server), s.outbox.events ...
//   await s.stop();

const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const H = require('../lib/proxy');

// The proxy's default outbox database (the run's database against a real upstream).
const OUTBOX_DB = H.dbName('relaybus');
const PREFIX = 'relaybus_';

// The handlers most tests use: which one takes which type is what the tests check.
const HANDLERS = {
  orders: 'order.*',
  confirmations: 'order.placed.v1',
  users: 'user.*',
};

function handlersIni(handlers) {
  return Object.entries(handlers)
    .map(([name, events]) => `[handler ${name}]\nevents = ${events}\nkind = pull\n`)
    .join('\n');
}

/** The handler names subscribed to `type`, in config order (as the proxy lists them). */
function subscribed(handlers, type) {
  return Object.entries(handlers)
    .filter(([, pats]) =>
      pats.split(',').some((p) => {
        p = p.trim();
        return p.endsWith('*') ? type.startsWith(p.slice(0, -1)) : type === p;
      }),
    )
    .map(([name]) => name);
}

/** The lane of a delivery: FNV-1a 32 of the UTF-8 key (else of the event id), mod 256. */
function laneId(key, eventId) {
  return H.fnv1a(key ?? eventId) % 256;
}

function outboxOf(direct) {
  const db = direct.db(OUTBOX_DB);
  return {
    db,
    events: db.collection(`${PREFIX}events`),
    deliveries: db.collection(`${PREFIX}deliveries`),
    keys: db.collection(`${PREFIX}key_sequences`),
  };
}

/** Creates the outbox collections and the backstop index if the proxy's set-up has not. */
async function ensureOutbox(direct) {
  const db = direct.db(OUTBOX_DB);
  const have = new Set((await db.listCollections({}, { nameOnly: true }).toArray()).map((c) => c.name));
  for (const name of ['events', 'deliveries', 'key_sequences']) {
    if (!have.has(PREFIX + name)) await db.createCollection(PREFIX + name).catch(() => {});
  }
  await db
    .collection(`${PREFIX}deliveries`)
    .createIndex({ eventId: 1, handler: 1 }, { unique: true, name: 'event_handler' })
    .catch(() => {});
}

/**
 * Starts (or reuses) an upstream and a proxy with `handlers`.
 * opts: { handlers, upstream (reuse), requireDouble, upstreamArgs (double's command line),
 *         settings ([proxy] keys), extraIni (more INI sections), appName, clientOptions }
 */
async function startStack(opts = {}) {
  const handlers = opts.handlers || HANDLERS;
  const upstream = opts.upstream || (await H.startUpstream({ requireDouble: opts.requireDouble, args: opts.upstreamArgs }));
  const proxy = await H.startProxy({
    upstream: upstream.uri,
    settings: opts.settings,
    ulimit: opts.proxyUlimit,
    extraIni: handlersIni(handlers) + (opts.extraIni ? `\n${opts.extraIni}\n` : ''),
  });
  const direct = new MongoClient(upstream.directUri, { serverSelectionTimeoutMS: 10000 });
  await direct.connect();
  await ensureOutbox(direct);
  const client = new MongoClient(proxy.uri(), {
    appName: opts.appName,
    serverSelectionTimeoutMS: 10000,
    ...(opts.clientOptions || {}),
  });
  await client.connect();
  const stack = {
    upstream,
    proxy,
    direct,
    client,
    handlers,
    outbox: outboxOf(direct),
    async closeClients() {
      await client.close().catch(() => {});
      await direct.close().catch(() => {});
    },
    /** Closes the clients, stops the proxy (checking a clean exit) and, unless kept, the upstream. */
    async stop({ keepUpstream = false } = {}) {
      await stack.closeClients();
      await proxy.stop();
      if (!keepUpstream) await upstream.stop();
    },
  };
  return stack;
}

/**
 * Checks one stored event and its deliveries against docs/outbox-schema.md.
 * want: { type, key?, sequence?, payload?, handlers (names expected to have deliveries) }
 */
async function checkEvent(outbox, eventId, want) {
  const ev = await outbox.events.findOne({ _id: eventId }, { promoteLongs: false });
  assert.ok(ev, `event ${eventId} is stored`);
  assert.equal(ev.type, want.type);
  if ('payload' in want) assert.deepEqual(ev.payload, want.payload);
  if (want.key !== undefined) {
    assert.equal(ev.key, want.key);
    assert.equal(ev.sequence._bsontype, 'Long', 'sequence is an Int64');
    if (want.sequence !== undefined) assert.equal(Number(ev.sequence), want.sequence);
  } else {
    assert.equal('key' in ev, false, 'no key field without a key');
    assert.equal('sequence' in ev, false, 'no sequence field without a key');
  }
  assert.ok(ev.createdAt instanceof Date, 'createdAt is a date');
  assert.deepEqual([...ev.handlers].sort(), [...want.handlers].sort(), 'handlers lists every delivery');
  const dels = await outbox.deliveries.find({ eventId }, { promoteLongs: false, promoteValues: false }).toArray();
  assert.deepEqual(dels.map((d) => d.handler).sort(), [...want.handlers].sort(), 'one delivery per subscribed handler');
  for (const d of dels) {
    assert.equal(d._id._bsontype, 'ObjectId');
    assert.equal(d.eventType, ev.type);
    assert.equal(d.laneId._bsontype, 'Int32');
    assert.equal(d.laneId.value, laneId(ev.key, eventId));
    assert.equal(d.lane, 'ready');
    assert.equal(d.status, 'pending');
    assert.equal(d.attempts.value, 0);
    assert.ok(d.dueAt instanceof Date && d.createdAt instanceof Date);
    if (ev.key !== undefined) {
      assert.equal(d.key, ev.key);
      assert.equal(String(d.sequence), String(ev.sequence));
    } else {
      assert.equal('key' in d, false);
    }
  }
  return { event: ev, deliveries: dels };
}

/** Runs `fn` expecting a MongoServerError with `code`; returns the error. */
async function expectCode(promise, code, msgRe) {
  let err = null;
  try {
    await promise;
  } catch (e) {
    err = e;
  }
  assert.ok(err, `expected an error with code ${code}`);
  assert.equal(err.code, code, `code of: ${err.message}`);
  if (msgRe) assert.match(err.message, msgRe);
  return err;
}

module.exports = {
  H,
  OUTBOX_DB,
  PREFIX,
  HANDLERS,
  handlersIni,
  subscribed,
  laneId,
  outboxOf,
  ensureOutbox,
  startStack,
  checkEvent,
  expectCode,
};
