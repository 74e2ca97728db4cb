'use strict';
// Entity map and entity creation (clients, databases, collections, sessions)
// for the unified test format.

const { MongoClient, ReadPreference, GridFSBucket } = require('mongodb');

// observeEvents names -> driver event names
const EVENT_NAMES = {
  commandStartedEvent: 'commandStarted',
  commandSucceededEvent: 'commandSucceeded',
  commandFailedEvent: 'commandFailed',
  poolCreatedEvent: 'connectionPoolCreated',
  poolReadyEvent: 'connectionPoolReady',
  poolClearedEvent: 'connectionPoolCleared',
  poolClosedEvent: 'connectionPoolClosed',
  connectionCreatedEvent: 'connectionCreated',
  connectionReadyEvent: 'connectionReady',
  connectionClosedEvent: 'connectionClosed',
  connectionCheckOutStartedEvent: 'connectionCheckOutStarted',
  connectionCheckOutFailedEvent: 'connectionCheckOutFailed',
  connectionCheckedOutEvent: 'connectionCheckedOut',
  connectionCheckedInEvent: 'connectionCheckedIn',
};
const COMMAND_EVENTS = new Set(['commandStartedEvent', 'commandSucceededEvent', 'commandFailedEvent']);

// Commands whose monitoring events are not observed unless observeSensitiveCommands.
const SENSITIVE = new Set(['authenticate', 'saslstart', 'saslcontinue', 'getnonce', 'createuser', 'updateuser',
  'copydbgetnonce', 'copydbsaslstart', 'copydb']);
const HELLO = new Set(['hello', 'ismaster']);

function readPreferenceFrom(rp) {
  if (rp == null) return undefined;
  if (typeof rp === 'string' || rp instanceof ReadPreference) return rp;
  const mode = rp.mode ? rp.mode.charAt(0).toLowerCase() + rp.mode.slice(1) : 'primary';
  const opts = {};
  if (rp.maxStalenessSeconds != null) opts.maxStalenessSeconds = rp.maxStalenessSeconds;
  if (rp.hedge) opts.hedge = rp.hedge;
  return new ReadPreference(mode, rp.tagSets || rp.tags, opts);
}

// collectionOptions / databaseOptions / transaction options -> driver options
function rwOptions(o = {}) {
  const out = {};
  for (const [k, v] of Object.entries(o)) {
    if (k === 'readPreference') out.readPreference = readPreferenceFrom(v);
    else out[k] = v;
  }
  return out;
}

function addUriOptions(uri, uriOptions) {
  if (!uriOptions || Object.keys(uriOptions).length === 0) return uri;
  const parts = [];
  for (const [k, v] of Object.entries(uriOptions)) {
    if (v && typeof v === 'object') {
      // e.g. authMechanismProperties { K: V } -> "K:V,K2:V2"
      parts.push(`${encodeURIComponent(k)}=${encodeURIComponent(Object.entries(v).map(([a, b]) => `${a}:${b}`).join(','))}`);
    } else {
      parts.push(`${encodeURIComponent(k)}=${encodeURIComponent(String(v))}`);
    }
  }
  // Insert query after the host list / optional path.
  const m = /^(mongodb(?:\+srv)?:\/\/[^/?]*)(\/[^?]*)?(\?.*)?$/.exec(uri);
  if (!m) throw new Error(`cannot parse URI ${uri}`);
  const base = m[1] + (m[2] || '/');
  const q = m[3] ? `${m[3]}&` : '?';
  return `${base}${q}${parts.join('&')}`;
}

// Deep copy of plain documents/arrays; BSON values are kept as they are.
function snapshot(v) {
  if (Array.isArray(v)) return v.map(snapshot);
  if (v && typeof v === 'object' && !v._bsontype && !(v instanceof Date) && !(v instanceof RegExp) &&
      !Buffer.isBuffer(v) && !ArrayBuffer.isView(v)) {
    if (v instanceof Map) return new Map([...v].map(([k, x]) => [k, snapshot(x)]));
    const o = {};
    for (const k of Object.keys(v)) o[k] = snapshot(v[k]);
    return o;
  }
  return v;
}

// awaitMinPoolSizeMS: the client's pools are filled to minPoolSize before the test goes on
// (the connections are not made within the operations' time limits).
async function awaitMinPool(client, minPoolSize, ms) {
  const ready = new Map(); // server address -> connections ready
  const onReady = (ev) => ready.set(ev.address, (ready.get(ev.address) || 0) + 1);
  client.on('connectionReady', onReady);
  try {
    await client.connect();
    const deadline = Date.now() + ms;
    for (;;) {
      const servers = client.topology ? [...client.topology.s.servers.values()] : [];
      const data = servers.filter((sv) => sv.description && sv.description.isDataBearing);
      if (data.length && data.every((sv) => (ready.get(sv.description.address) || 0) >= minPoolSize)) return;
      if (Date.now() > deadline) {
        throw new Error(`awaitMinPoolSizeMS: the pools did not reach minPoolSize ${minPoolSize} within ${ms} ms`);
      }
      await new Promise((r) => setTimeout(r, 10));
    }
  } finally {
    client.off('connectionReady', onReady);
  }
}

class EntityMap {
  constructor(runner) {
    this.runner = runner;
    this.map = new Map();
    this.lsids = new Map();
    this.clientOf = new Map(); // session/db/collection id -> client id
    this.eventLists = new Map(); // client id -> array of {type, event}
    this.checkedOut = new Map(); // client id -> {n}: connections checked out of its pools now
  }

  set(id, value, kind) {
    if (this.map.has(id)) throw new Error(`entity '${id}' already exists`);
    this.map.set(id, { kind, value });
  }

  entry(id) {
    const e = this.map.get(id);
    if (!e) throw new Error(`no entity named '${id}'`);
    return e;
  }

  get(id, kind) {
    const e = this.entry(id);
    if (kind && e.kind !== kind) throw new Error(`entity '${id}' is a ${e.kind}, expected ${kind}`);
    return e.value;
  }

  has(id) {
    return this.map.has(id);
  }

  getSessionLsid(id) {
    if (!this.lsids.has(id)) throw new Error(`no session entity named '${id}'`);
    return this.lsids.get(id);
  }

  async create(defs) {
    for (const def of defs) {
      const [kind, spec] = Object.entries(def)[0];
      switch (kind) {
        case 'client': await this.createClient(spec); break;
        case 'database': {
          const client = this.get(spec.client, 'client');
          this.set(spec.id, client.db(spec.databaseName, rwOptions(spec.databaseOptions)), 'database');
          this.clientOf.set(spec.id, spec.client);
          break;
        }
        case 'collection': {
          const db = this.get(spec.database, 'database');
          this.set(spec.id, db.collection(spec.collectionName, rwOptions(spec.collectionOptions)), 'collection');
          this.clientOf.set(spec.id, this.clientOf.get(spec.database));
          break;
        }
        case 'bucket': {
          const db = this.get(spec.database, 'database');
          this.set(spec.id, new GridFSBucket(db, rwOptions(spec.bucketOptions)), 'bucket');
          this.clientOf.set(spec.id, this.clientOf.get(spec.database));
          break;
        }
        case 'thread':
          // Operations run on it in order (runOnThread), concurrently with the test's own.
          this.set(spec.id, { done: Promise.resolve(), error: null }, 'thread');
          break;
        case 'session': {
          const client = this.get(spec.client, 'client');
          const so = { ...(spec.sessionOptions || {}) };
          if (so.defaultTransactionOptions) so.defaultTransactionOptions = rwOptions(so.defaultTransactionOptions);
          // snapshotTime names an entity (a getSnapshotTime result). The Node.js driver takes no
          // such option; it reads the time from session.snapshotTime (kept out of its typings),
          // which it otherwise sets from the first snapshot read's atClusterTime.
          const snapshotTime = so.snapshotTime !== undefined ? this.get(so.snapshotTime) : undefined;
          delete so.snapshotTime;
          const session = client.startSession(so);
          if (snapshotTime !== undefined) session.snapshotTime = snapshotTime;
          this.set(spec.id, session, 'session');
          this.clientOf.set(spec.id, spec.client);
          // The lsid is fixed for the session's lifetime; record it now so
          // $$sessionLsid still works after endSession.
          this.lsids.set(spec.id, session.id);
          break;
        }
        default:
          throw new Error(`unsupported entity type '${kind}'`);
      }
    }
  }

  async createClient(spec) {
    const uri = addUriOptions(this.runner.clientUri ? this.runner.clientUri(spec) : this.runner.uri, spec.uriOptions);
    const observe = new Set(spec.observeEvents || []);
    const ignore = new Set((spec.ignoreCommandMonitoringEvents || []).map((c) => c.toLowerCase()));
    const options = { serverSelectionTimeoutMS: 10000 };
    if ([...observe].some((e) => COMMAND_EVENTS.has(e))) options.monitorCommands = true;
    if (spec.serverApi) options.serverApi = spec.serverApi;
    if (!spec.uriOptions || !('heartbeatFrequencyMS' in spec.uriOptions)) options.heartbeatFrequencyMS = 500;
    // The driver waits at least minHeartbeatFrequencyMS (500 ms by default) between two
    // checks of a server it marked Unknown. A state-change error through the proxy marks the
    // "mongos" Unknown (README.md, "Through the proxy"), so each retried error would wait that
    // long: a pacing of the driver's monitor, not an outcome any test checks. 50 ms keeps the
    // runs through the proxy within a few times the direct ones; every run uses it alike.
    if (!spec.uriOptions || !('minHeartbeatFrequencyMS' in spec.uriOptions)) options.minHeartbeatFrequencyMS = 50;
    const client = new MongoClient(uri, options);
    // For assertNumberConnectionsCheckedOut: the pool's own events, observed or not.
    const out = { n: 0 };
    this.checkedOut.set(spec.id, out);
    client.on('connectionCheckedOut', () => { out.n += 1; });
    client.on('connectionCheckedIn', () => { out.n -= 1; });
    const events = [];
    this.eventLists.set(spec.id, events);
    const state = { listening: true };
    for (const name of observe) {
      const driverName = EVENT_NAMES[name];
      if (!driverName) throw new Error(`unsupported observeEvents entry ${name}`);
      client.on(driverName, (ev) => {
        if (!state.listening) return;
        if (COMMAND_EVENTS.has(name)) {
          const cmd = String(ev.commandName || '').toLowerCase();
          if (ignore.has(cmd)) return;
          if (cmd === 'configurefailpoint') return;
          if (!spec.observeSensitiveCommands && (SENSITIVE.has(cmd) || HELLO.has(cmd))) return;
        }
        if (COMMAND_EVENTS.has(name)) {
          // Snapshot what was sent/received now: the driver may later mutate
          // objects the event still references (e.g. a shared readConcern).
          events.push({ type: name, event: { commandName: ev.commandName, databaseName: ev.databaseName,
            command: snapshot(ev.command), reply: snapshot(ev.reply), failure: ev.failure,
            serviceId: ev.serviceId, serverConnectionId: ev.serverConnectionId } });
        } else {
          events.push({ type: name, event: ev });
        }
      });
    }
    // No explicit connect(): the driver connects on first use, as
    // applications do (connect() would also wait for a server matching the
    // client's read preference, which a single-member replica set may lack).
    this.set(spec.id, client, 'client');
    this.clientOf.set(spec.id, spec.id);
    this.runner.registerClient(client, state);
    if (spec.awaitMinPoolSizeMS !== undefined && spec.uriOptions && spec.uriOptions.minPoolSize) {
      await awaitMinPool(client, spec.uriOptions.minPoolSize, spec.awaitMinPoolSizeMS);
    }
  }

  sessions() {
    return [...this.map.values()].filter((e) => e.kind === 'session').map((e) => e.value);
  }
}

module.exports = { EntityMap, readPreferenceFrom, rwOptions, addUriOptions };
