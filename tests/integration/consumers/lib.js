'use strict';
// Shared set-up of the pull consumer tests: a server double (or scripts/test --upstream's
// deployment), a proxy with pull
// handlers and one webhook handler (never dispatched: [dispatch] enabled = false), a client
// through the proxy, a direct client that reads the outbox as an operator would, and helpers to
// publish through the proxy and to run the consumer commands.

const assert = require('node:assert/strict');
const P = require('../publish/lib');

const H = P.H;

// Two pull handlers on the same types, so that a test's consumption of one never changes the
// other's deliveries; `hooks` is a webhook handler, which consumers must not claim.
const PULL_HANDLERS = { orders: 'order.*', audit: 'order.*', users: 'user.*' };
const WEBHOOK_INI = '[handler hooks]\nevents = order.*\nkind = webhook\nurl = http://127.0.0.1:9/never\n';

/** Starts the stack; `settings` are [proxy] keys, `extraIni` more sections. */
async function startConsumers(opts = {}) {
  return P.startStack({
    ...opts,
    handlers: PULL_HANDLERS,
    extraIni: WEBHOOK_INI + (opts.extraIni || ''),
  });
}

let seq = 0;
/** A fresh event id for this run. */
function newId(tag) {
  seq += 1;
  return `${tag}-${process.pid}-${Date.now()}-${seq}`;
}

/** Publishes events [{type, id, key?, payload?, headers?, correlationId?}] in one transaction through the proxy. */
async function publish(client, events) {
  const session = client.startSession();
  try {
    await session.withTransaction(async () => {
      await client.db(H.dbName('rbconsumers')).command({ relaybusPublish: 1, events }, { session });
    });
  } finally {
    await session.endSession();
  }
}

/** Runs a relaybus* command through `client` (the admin database, as an application would). */
function cmd(client, doc) {
  return client.db('admin').command(doc);
}

/** Claims until `n` deliveries of `handler` were handed out or `ms` passed. */
async function claimN(client, handler, n, extra = {}, ms = 10000) {
  const got = [];
  const until = Date.now() + ms;
  while (got.length < n && Date.now() < until) {
    const r = await cmd(client, { relaybusClaim: handler, limit: n - got.length, ...extra });
    assert.equal(r.ok, 1);
    got.push(...r.deliveries);
    if (got.length < n) await H.sleep(50);
  }
  assert.equal(got.length, n, `claimed ${n} deliveries of ${handler}`);
  return got;
}

/** The delivery of `eventId` for `handler`, read directly (null once completed). */
function deliveryOf(s, eventId, handler) {
  return s.outbox.deliveries.findOne({ eventId, handler });
}

/**
 * The event's completedAt once written, or undefined after `ms`: with [outbox] attempt_history
 * (the default) a pull completion's event gets it with the completions of its second, once that
 * second is over (docs/outbox-schema.md, "events"), not in the completion itself.
 */
async function completedAtOf(s, eventId, ms = 10000) {
  for (const until = Date.now() + ms; ; await H.sleep(100)) {
    const ev = await s.outbox.events.findOne({ _id: eventId });
    if ((ev && ev.completedAt) || Date.now() > until) return ev ? ev.completedAt : undefined;
  }
}

module.exports = { P, H, PULL_HANDLERS, startConsumers, newId, publish, cmd, claimN, deliveryOf, completedAtOf };
