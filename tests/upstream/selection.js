'use strict';
// The part of the integration suite that `scripts/test --upstream URI` (tests/upstream/run) runs
// against a real replica set or sharded cluster, and why every other file stays out.
//
// A file is safe when, against a deployment that is not the server double, it works only in the
// run's database (RELAYBUS_TEST_DB: the tests' own collections and the outbox of every proxy it
// starts), steps no primary down, sets no fail point, changes no server parameter and sends none
// of the double's own commands. Inside a safe file, a test that needs any of these skips itself
// with its reason (H.doubleOnlySkipReason, upstream.real), and the run lists it.
//
// Every file of tests/integration/ is in SAFE or in exactly one group of NOT_RUN
// (tests/upstream/test/selection.test.js checks it), so a new file is placed deliberately.

// [file under tests/integration/, what it shows on a real deployment], in the order they run.
const SAFE = [
  ['proxy/node-driver.test.js', 'forwarding with the Node.js driver: CRUD, cursors over getMore batches, killCursors, transactions and a real write conflict, w:0, 15 MiB documents, an insertMany split by the driver'],
  ['proxy/mongoose.test.js', 'forwarding with Mongoose: models, a query cursor, a w:0 write'],
  ['proxy/cdriver.test.js', 'forwarding with mongo-c-driver, plain and with zlib, zstd and snappy: CRUD, a cursor, with_transaction'],
  ['proxy/changestream.test.js', 'change streams through the proxy with the Node.js driver and Mongoose'],
  ['proxy/pooled.test.js', 'pooled mode: client connections over a pool that logs in with the upstream URI\'s user, cursors continued on other connections, a transaction\'s pin, pool_wait_timeout_ms'],
  ['publish/node-driver.test.js', 'publishing in transactions with the Node.js driver: annotations, relaybusPublish, the stored layout, visibility at commit, rollbacks, per-key sequences under write conflicts'],
  ['publish/pymongo.test.js', 'publishing in transactions with pymongo'],
  ['publish/cdriver.test.js', 'publishing in transactions with mongo-c-driver'],
  ['dispatch/dispatch.test.js', 'dispatch to webhooks: lanes taken over after a proxy\'s SIGKILL, the wake-up after a commit, a reload, lease renewal while two proxies dispatch'],
  ['dispatch/wake.test.js', 'the cross-proxy wake-up through a change stream on the deliveries'],
  ['consumers/consumers.test.js', 'pull consumers: claim, complete, retry, bury, extend, release, status, bad input, long polls'],
  ['consumers/txn.test.js', 'relaybusComplete inside the consumer\'s own transaction: commit, abort, a lease lost, the server\'s write conflict'],
  ['admin/api.test.js', 'the admin API against a dispatching proxy: every endpoint, the token, requeue, bury, purge'],
  ['admin/attempts.test.js', 'every attempt on record: a delivery\'s and an event\'s attempts through the admin API, the latest failures, the TTL index of the attempt records and its window changed with collMod'],
];

// reason -> files (or folders, ending in '/') under tests/integration/ that the run leaves out.
const NOT_RUN = {
  'steps a primary down (replSetStepDown)': [
    'proxy/failover.test.js', 'proxy/failover-drivers.test.js', 'publish/fault.test.js', 'publish/fault-pooled.test.js',
  ],
  'holds the majority commit point back (the double\'s stopReplProducer fail point), blocks the dispatcher\'s writes (failCommand) and steps the primary down with force so that w: 1 writes are rolled back': [
    'dispatch/majority.test.js',
  ],
  'sets fail points (configureFailPoint) on the upstream': [
    'admin/operator.test.js', 'consumers/examples.test.js', 'dispatch/faults.test.js', 'dispatch/fleet-gaps.test.js',
    'dispatch/renewal.test.js', 'proxy/limits.test.js', 'proxy/signals.test.js', 'publish/injection-faults.test.js',
    'publish/poisoned-commit.test.js', 'consumers/lanes.test.js', 'dispatch/take-read-back.test.js',
  ],
  'starts servers of its own (doubles with --auth users, TLS or X.509, stopped and restarted) or needs the double\'s clock and counters': [
    'consumers/auth.test.js', 'consumers/independence.test.js', 'dispatch/backfill.test.js', 'dispatch/fleet.test.js', 'dispatch/lanes.test.js',
    'dispatch/idle.test.js',
    'proxy/auth.test.js', 'proxy/handshake.test.js', 'proxy/pooled-auth.test.js', 'proxy/strict-parse.test.js',
    'proxy/tls.test.js', 'proxy/x509.test.js',
    'publish/auth.test.js', 'admin/exposure.test.js', 'tenants/', 'sharded/', 'lb/',
  ],
  'checks the server double itself, not the proxy': ['double/'],
  'broker handlers: needs brokers of its own (nats-server, rabbitmq-server, a Kafka mock); dispatch to a webhook stands for them': ['brokers/'],
  'load: thousands of connections, gigabytes in flight or a fault run of minutes, not for a shared deployment': [
    'proxy/many-clients.test.js', 'proxy/memory-bound.test.js', 'proxy/pooled-scale.test.js', 'dispatch/scale.test.js',
    'consumers/faults.test.js', 'publish/poison-table.test.js',
  ],
  'the proxy\'s own behaviour, the same whatever the server (configuration, TLS, signals, logs, hostile input, webhook receivers, the admin port\'s pages): runs on the double': [
    'admin/buffered.test.js', 'admin/dashboard.test.js', 'admin/dead-letters-utf8.test.js', 'admin/hostile.test.js',
    'admin/metrics.test.js', 'admin/monitoring-files.test.js', 'admin/tls.test.js', 'proxy/load-balanced.test.js',
    'dispatch/header-injection.test.js',
    'consumers/drain.test.js', 'consumers/no-pull-handler.test.js',
    'dispatch/deadline.test.js', 'dispatch/formats.test.js', 'dispatch/outage.test.js', 'dispatch/rate-limit.test.js', 'dispatch/reload.test.js',
    'dispatch/retry.test.js', 'dispatch/rotation.test.js', 'dispatch/secrets.test.js', 'dispatch/tls.test.js',
    'dispatch/tracing.test.js', 'dispatch/webhook-disable.test.js', 'dispatch/webhook-egress.test.js',
    'dispatch/webhook-hostile.test.js', 'dispatch/webhook-retry.test.js', 'dispatch/webhook-reuse.test.js',
    'proxy/bad-input.test.js', 'proxy/compression.test.js', 'proxy/hostile-parse.test.js', 'proxy/log-format.test.js',
    'proxy/log-injection.test.js', 'proxy/scram-server.test.js', 'proxy/test-commands.test.js', 'proxy/unix-socket.test.js',
    'proxy/wire.test.js', 'proxy/pooled-wire.test.js',
    'publish/commit-more-to-come.test.js', 'publish/errors.test.js', 'publish/loops.test.js', 'publish/outside-txn.test.js',
    'publish/tamper.test.js', 'publish/unrouted.test.js',
  ],
  'the same server paths as a file of the run, kept out for the run\'s time': [
    'admin/consumers.test.js', 'consumers/matrix.test.js', 'dispatch/replay.test.js', 'dispatch/retention.test.js',
    'proxy/changestreams.test.js', 'publish/mongoose.test.js', 'publish/mongosh.test.js',
  ],
};

/** The reason a file (path under tests/integration/) is not run, or null when it is in SAFE or in no group. */
function notRunReason(file) {
  for (const [reason, entries] of Object.entries(NOT_RUN)) {
    if (entries.some((e) => (e.endsWith('/') ? file.startsWith(e) : file === e))) return reason;
  }
  return null;
}

module.exports = { SAFE, NOT_RUN, notRunReason };
