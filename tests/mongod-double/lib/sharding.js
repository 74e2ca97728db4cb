'use strict';
// A sharded cluster in one process (--sharded): N shards, each a two-member replica set made of
// the same Server pairs as the plain double (with elections), and M mongos routers. A mongos
// keeps no data: it routes each command to the shards by the cluster's metadata (databases and
// their primary shards, sharded collections, their keys and chunks), runs each shard's part
// in-process through that shard's current primary (as an internal, already authenticated
// connection), and merges the answers: sorts, skip and limit again, sums counts, unions
// distinct values, and hands the merged result out through its own cursors. Transactions start
// on each shard a statement touches and commit in two phases over several shards; the
// routing state of a transaction is the cluster's, so another mongos can commit it with the
// recoveryToken. Shards share one clock, so cluster times compare across shards. The metadata
// is in memory and never moves by itself (no balancer): chunks are placed when a collection is
// sharded. It does not implement the shards' commands: the shards are plain members.

const crypto = require('crypto');
const { Long, ObjectId, Timestamp, UUID, MinKey, MaxKey, Double, Binary, Int32 } = require('bson');
const V = require('./values');
const { MongoError, err } = require('./errors');
const { Server, NO_REPLY, labelsFor, checkApiParameters, changeStreamLabels } = require('./server');
const { sessionKey } = require('./sessions');
const { Cursors } = require('./cursors');
const { aggregate: runPipeline, equalityValue } = require('./query');
const { applyUpdate, kindOfUpdate, isPlainObject } = require('./update');
const changeStreams = require('./changestreams');
const { recordDdl } = require('./changes');

const ZERO_HASH = new Binary(Buffer.alloc(20), 0);
// What a mongos answers itself, through the Server's own command table (hello, auth, fail
// points, diagnostics): none of them touches data.
const LOCAL = new Set(['hello', 'isMaster', 'ismaster', 'ping', 'buildInfo', 'buildinfo', 'saslStart', 'saslContinue',
  'authenticate', 'getnonce', 'logout', 'whatsmyuri', 'connectionStatus', 'getParameter', 'getCmdLineOpts', 'hostInfo',
  'listCommands', 'getDefaultRWConcern', 'configureFailPoint', 'doubleStats', 'getLog', 'serverStatus', 'currentOp',
  'killOp', 'getFreeMonitoringStatus', 'getClusterTime', 'startSession', 'refreshSessions']);
// Commands mongos refuses outright (they name replica-set members, which a mongos is not).
const NOT_ON_MONGOS = new Set(['replSetGetStatus', 'replSetStepDown', 'replSetFreeze', 'replSetStepUp', 'doubleElectionTime']);
const NOT_IN_TXN = new Set(['shardCollection', 'enableSharding', 'split', 'moveChunk', 'listShards']);
const INT64_MIN = -(2n ** 63n);
const INT64_SPAN = 2n ** 64n;

// BSONObj::toString as the server prints shard keys and requests in its messages.
const { showBson } = V;

// The shard key pattern of a collection: its fields in order, and the hashed one (at most one).
class ShardKey {
  constructor(key) {
    this.key = key;
    this.fields = V.keys(key);
    this.hashed = this.fields.find((f) => key[f] === 'hashed') || null;
  }

  // A unique index is compatible when the shard key is a prefix of its key (ShardKeyPattern::
  // isUniqueIndexCompatible); _id's index always is.
  uniqueCompatible(ixKey) {
    const ik = V.keys(ixKey);
    if (ik.length === 1 && ik[0] === '_id') return true;
    return this.fields.every((f, i) => ik[i] === f);
  }

  // The key's values from a document, null for a missing field (mongod routes those as null).
  fromDoc(doc) {
    return this.fields.map((f) => {
      const v = V.getPath(doc, f);
      return v === undefined ? null : v;
    });
  }

  // The key's values from a query's equalities on every key field, or null.
  fromQuery(filter) {
    if (!filter || typeof filter !== 'object') return null;
    const eqs = equalities(filter);
    const out = [];
    for (const f of this.fields) {
      if (!eqs.has(f)) return null;
      out.push(eqs.get(f));
    }
    return out;
  }

  // The value chunks are ordered by: hashed fields hashed, the rest as they are.
  routingValue(values) {
    return values.map((v, i) => (this.fields[i] === this.hashed ? hashValue(v) : v));
  }
}

// Top-level (and $and) equalities of a filter: literals and $eq, field -> value.
function equalities(filter, out = new Map()) {
  for (const k of V.keys(filter)) {
    if (k === '$and' && Array.isArray(filter.$and)) {
      for (const sub of filter.$and) if (isPlainObject(sub)) equalities(sub, out);
      continue;
    }
    if (k.startsWith('$')) continue;
    const v = equalityValue(filter[k]);
    if (v !== undefined && !(isPlainObject(v) && V.keys(v).some((x) => x.startsWith('$')))) out.set(k, v);
  }
  return out;
}

// A 64-bit hash of a value (mongod's is md5 of the BSON element; any stable spread will do for
// routing, and the values shown in config.chunks are this double's own).
function hashValue(v) {
  const h = crypto.createHash('md5').update(V.canonicalKey(v)).digest();
  return Long.fromBigInt(h.readBigInt64LE(0));
}

function cmpBound(a, b) {
  for (let i = 0; i < a.length; i++) {
    const c = V.compareValues(a[i], b[i]);
    if (c) return c;
  }
  return 0;
}

function pad2(n) { return String(n).padStart(2, '0'); }
const sleep = (ms) => new Promise((r) => { setTimeout(r, ms); });

// One shard: a replica set named shardNN of two Server members sharing data.
class Shard {
  constructor(name, opts, cluster) {
    this.name = name;
    this.cluster = cluster;
    const o = Object.assign({}, opts, { setName: name, port: 0, secondaryPort: undefined });
    this.primaryMember = new Server(o);
    this.secondaryMember = new Server(o, this.primaryMember);
    this.members = [this.primaryMember, this.secondaryMember];
    // One clock for every shard: cluster times compare across shards, as mongos's do.
    Object.defineProperty(this.primaryMember.store, 'clock', {
      get: () => cluster.clock, set: (v) => { cluster.clock = v; }, configurable: true,
    });
    for (const m of this.members) m.bootSecs = cluster.bootSecs;
  }

  get set() { return this.primaryMember.set; }

  host() { return `${this.name}/${this.members.map((m) => m.address).join(',')}`; }

  // The member that is primary now; during an election mongos waits for one (at most 10 s, as
  // its replica set monitor would), then gives up with 133.
  async primary() {
    const end = Date.now() + 10000;
    for (;;) {
      if (this.set.primary) return this.set.primary;
      if (Date.now() > end) {
        throw err(133, `Could not find host matching read preference { mode: "primary" } for set ${this.name}`);
      }
      await sleep(20);
    }
  }
}

// The internal connection a mongos client connection uses towards one shard member: already
// authenticated (mongos authenticates its clients itself), the client's appName for counts.
function internalConn(client, member) {
  if (!client.shardConns) client.shardConns = new Map();
  let c = client.shardConns.get(member);
  if (!c) {
    c = {
      id: client.id, remote: client.remote, user: '__system', userDb: 'local', handshakeDone: true, peerSubject: null,
      get appName() { return client.appName; },
      get closed() { return client.closed; },
      close() { /* a shard's fail point closing "the connection" closes the client's */ client.close('shard connection closed'); },
    };
    client.shardConns.set(member, c);
  }
  return c;
}

class Cluster {
  constructor(opts) {
    this.opts = opts;
    this.clock = 0;
    this.bootSecs = Math.floor(Date.now() / 1000);
    this.log = (m) => process.stderr.write(`[mongod-double] ${new Date().toISOString()} (cluster) ${m}\n`);
    this.shards = [];
    for (let i = 1; i <= (opts.shards || 2); i++) this.shards.push(new Shard(`shard${pad2(i)}`, opts, this));
    this.mongos = [];
    for (let j = 0; j < (opts.mongos || 2); j++) this.mongos.push(new Mongos(this, opts, j));
    this.dbs = new Map(); // db -> {primary: shard name, uuid, timestamp}
    this.colls = new Map(); // ns -> {key: ShardKey, unique, uuid, epoch, timestamp, chunks: [{min, max, shard, id}]}
    this.txns = new Map(); // session key -> {txnNumber, participants: Map(shard -> readConcern), coordinator, state, routers}
    this.dbCount = 0;
    this.clusterId = new ObjectId();
  }

  async listen() {
    const ports = [];
    for (const m of this.mongos) ports.push(await m.listen());
    for (const s of this.shards) for (const m of s.members) await m.listen();
    return ports;
  }

  stop() { return Promise.all([...this.mongos, ...this.shards.flatMap((s) => s.members)].map((m) => m.stop())); }

  shard(name) { return this.shards.find((s) => s.name === name); }

  clusterTime() { return new Timestamp({ t: this.bootSecs, i: this.clock + 1 }); }

  // The database's entry, made on first use with the next shard in turn as its primary shard.
  database(db, create) {
    let d = this.dbs.get(db);
    if (!d && create) {
      d = { primary: this.shards[this.dbCount++ % this.shards.length].name, uuid: new UUID(), timestamp: this.clusterTime() };
      this.dbs.set(db, d);
    }
    return d || null;
  }

  // The shard a routing value lands on.
  chunkFor(meta, values) {
    const rv = meta.key.routingValue(values);
    for (const c of meta.chunks) if (cmpBound(c.min, rv) <= 0 && cmpBound(rv, c.max) < 0) return c;
    return meta.chunks[meta.chunks.length - 1];
  }

  shardsOf(meta) { return [...new Set(meta.chunks.map((c) => c.shard))].map((n) => this.shard(n)); }
}

// One mongos router. It is a Server (listener, framing, auth, fail points, hello) whose
// commands, but for the local ones, are routed instead of run.
class Mongos extends Server {
  constructor(cluster, opts, index) {
    super(Object.assign({}, opts, { port: 0, standalone: true, isMongos: true, setName: undefined }));
    this.cluster = cluster;
    this.index = index;
    this.mcursors = new Cursors();
    this.log = (m) => process.stderr.write(`[mongod-double] ${new Date().toISOString()} (mongos ${index}) ${m}\n`);
  }

  finishReply(reply) {
    if (reply.ok !== undefined && typeof reply.ok === 'number') reply.ok = new Double(reply.ok);
    const ct = this.cluster.clusterTime();
    reply.$clusterTime = { clusterTime: ct, signature: { hash: ZERO_HASH, keyId: Long.fromNumber(0) } };
    reply.operationTime = ct;
    return reply;
  }

  async runCommand(conn, body, db, name) {
    if (name === 'shutdown') return this.shutdown(conn, db);
    if (LOCAL.has(name)) return super.runCommand(conn, body, db, name);
    if (!this.commands.has(name) && !ROUTED[name]) return err(59, `no such command: '${name}'`).toReply();
    const has = (f) => Object.prototype.hasOwnProperty.call(body, f);
    const rctx = { mongos: this, cluster: this.cluster, conn, cmd: body, db, name, txn: null };
    let reply;
    try {
      if (this.auth && !conn.user) throw err(13, `command ${name} requires authentication`);
      this.parse(conn, body, name);
      checkApiParameters(body, name);
      if (NOT_ON_MONGOS.has(name)) throw err(59, `no such command: '${name}'`);
      const fp = this.failpoints.failCommand(name, conn.appName);
      if (fp) {
        if (V.truthy(fp.blockConnection)) await sleep(V.toNumber(fp.blockTimeMS) || 0);
        if (V.truthy(fp.closeConnection)) {
          conn.close();
          return NO_REPLY;
        }
        if (fp.errorCode !== undefined) {
          const e = err(V.toNumber(fp.errorCode), "Failing command via 'failCommand' failpoint");
          if (Array.isArray(fp.errorLabels)) e.fixedLabels = fp.errorLabels;
          throw e;
        }
        if (fp.writeConcernError) rctx.fpWce = { wce: fp.writeConcernError, labels: Array.isArray(fp.errorLabels) ? fp.errorLabels : null };
      }
      if (has('autocommit')) rctx.txn = this.txnState(rctx);
      const rc = body.readConcern;
      if (!rctx.txn && ['find', 'aggregate', 'distinct'].includes(name) && rc && typeof rc === 'object' && rc.level === 'snapshot') {
        // A snapshot read: every shard reads at the same cluster time, which the reply names.
        rctx.snapshotAt = rc.atClusterTime !== undefined ? rc.atClusterTime : this.cluster.clusterTime();
        rctx.cmd = Object.assign({}, body, { readConcern: Object.assign({}, rc, { atClusterTime: rctx.snapshotAt }) });
      }
      // What has no routing of its own goes to the database's primary shard.
      reply = await (ROUTED[name] || viaPrimary)(rctx);
      // A write concern error (a fail point's on this mongos, or a shard's) with the labels
      // mongos gives it.
      if (rctx.fpWce) {
        reply.writeConcernError = rctx.fpWce.wce;
        if (rctx.fpWce.labels) reply.errorLabels = rctx.fpWce.labels;
      }
      if (reply.writeConcernError && !reply.errorLabels) {
        const labels = labelsFor(null, body, name, reply.writeConcernError);
        if (labels.length) reply.errorLabels = labels;
      }
      if (rctx.snapshotAt && reply.cursor) reply.cursor.atClusterTime = rctx.snapshotAt;
      else if (rctx.snapshotAt) reply.atClusterTime = rctx.snapshotAt;
      if (rctx.txn && rctx.txn.coordinator) reply.recoveryToken = { recoveryShardId: rctx.txn.coordinator };
    } catch (e0) {
      let e = e0;
      if (!(e instanceof MongoError)) {
        this.log(`internal error in ${name}: ${e && e.stack}`);
        e = err(1, `internal error: ${e && e.message}`);
      }
      if (e.fixedLabels) e.errorLabels = e.fixedLabels;
      else if (!e.errorLabels || !e.errorLabels.length) e.errorLabels = labelsFor(e.code, body, name, null);
      // A statement that failed ends the transaction on every shard (mongos aborts it there).
      if (rctx.txn && name !== 'commitTransaction' && name !== 'abortTransaction' && rctx.txn.state === 'inProgress') {
        await abortParticipants(rctx, rctx.txn);
      }
      reply = e.toReply();
      if (rctx.txn && rctx.txn.coordinator) reply.recoveryToken = { recoveryShardId: rctx.txn.coordinator };
    }
    return reply;
  }

  // {shutdown: 1} on admin stops this router alone, as it stops a mongos process: it stops
  // listening and drops every connection, the asking one without a reply (the shell and the
  // drivers read that as success). The shards and the other routers go on, so a test can take
  // one mongos of a seed list away; the cluster's routing state of open transactions stays.
  shutdown(conn, db) {
    if (db !== 'admin') return err(13, 'shutdown may only be run against the admin database.').toReply();
    if (this.auth && !conn.user) return err(13, 'command shutdown requires authentication').toReply();
    this.log('shutdown: this mongos stops; the cluster goes on');
    setImmediate(() => this.stop());
    return NO_REPLY;
  }

  // The cluster's routing state of the session's transaction (mongos's TransactionRouter).
  txnState(rctx) {
    const { cmd, name } = rctx;
    if (!cmd.lsid) throw err(72, "'autocommit' field requires a transaction number to also be specified");
    const key = sessionKey(cmd.lsid);
    const n = V.toBigIntExact(cmd.txnNumber);
    // Sharding's own DDL never runs in a transaction: a sharded collection is not created in one.
    if (NOT_IN_TXN.has(name)) throw err(263, `Cannot run '${name}' in a multi-document transaction.`);
    let t = this.cluster.txns.get(key);
    if (Object.prototype.hasOwnProperty.call(cmd, 'startTransaction')) {
      if (t && t.txnNumber === n) {
        throw err(117, `Cannot start transaction ${n} on session ${key} because a transaction with the same number is in progress.`);
      }
      if (t && t.state === 'inProgress') abortParticipants(rctx, t).catch(() => {});
      t = { txnNumber: n, participants: new Map(), coordinator: null, state: 'inProgress', readConcern: cmd.readConcern, routers: new Set() };
      this.cluster.txns.set(key, t);
    } else if (!t || t.txnNumber !== n) {
      if (name === 'commitTransaction' && cmd.recoveryToken) {
        // A commit of a transaction this router never saw: the recovery shard knows its outcome.
        t = { txnNumber: n, participants: new Map(), coordinator: cmd.recoveryToken.recoveryShardId, state: 'unknown', routers: new Set() };
        return t;
      }
      throw err(251, `Given transaction number ${n} does not match any in-progress transactions.`);
    }
    if (!t.routers.has(this) && name === 'commitTransaction' && t.routers.size) {
      // Another mongos ran it: this one knows no participants without the token, and with it
      // asks the recovery shard for the decision (commitTransaction below, state 'unknown').
      if (!cmd.recoveryToken) throw err(251, 'Cannot commit without participants or a recoveryToken');
      return { txnNumber: n, participants: t.participants, coordinator: t.coordinator, state: 'unknown', routers: new Set(), shared: t };
    }
    t.routers.add(this);
    return t;
  }
}

// ---- sending to shards ----

// Runs `body` on the shard's primary, decorated for the session's transaction: the first
// statement on a shard starts the transaction there (with the transaction's read concern).
// Errors come back as MongoError with the shard's code and labels, which mongos relays.
async function send(rctx, shard, body, opts = {}) {
  const cmd = Object.assign({}, body);
  delete cmd.$readPreference;
  const t = rctx.txn;
  if (t && !opts.plain) {
    delete cmd.startTransaction;
    delete cmd.readConcern;
    if (!t.participants.has(shard.name)) {
      cmd.startTransaction = true;
      if (t.readConcern) cmd.readConcern = t.readConcern;
      t.participants.set(shard.name, true);
      if (!t.coordinator) t.coordinator = shard.name;
    }
  }
  const member = await shard.primary();
  const name = V.keys(cmd)[0];
  member.count(name, rctx.conn.appName, cmd);
  const reply = await member.runCommand(internalConn(rctx.conn, member), cmd, cmd.$db || rctx.db, name);
  member.countReply(rctx.conn.appName, reply);
  if (reply === NO_REPLY) throw err(6, `connection to ${shard.name} closed`);
  if (!V.truthy(reply.ok) && !opts.raw) {
    // The shard's error as it is: code, message, and its other fields (keyPattern, keyValue,
    // errInfo, violations...).
    const extra = {};
    for (const k of V.keys(reply)) {
      if (!['ok', 'errmsg', 'code', 'codeName', 'errorLabels', '$clusterTime', 'operationTime', 'topologyVersion'].includes(k)) extra[k] = reply[k];
    }
    const e = err(V.toNumber(reply.code), reply.errmsg, V.keys(extra).length ? extra : undefined);
    if (reply.errorLabels) e.errorLabels = reply.errorLabels;
    e.fixedLabels = reply.errorLabels || [];
    e.shard = shard.name;
    throw e;
  }
  return reply;
}

// All documents of a cursor reply (draining getMores on the same member).
async function drain(rctx, shard, reply, db) {
  const docs = reply.cursor.firstBatch.slice();
  let id = reply.cursor.id;
  const coll = reply.cursor.ns.slice(reply.cursor.ns.indexOf('.') + 1);
  while (id && V.toBigIntExact(id) !== 0n) {
    const r = await send(rctx, shard, { getMore: id, collection: coll, batchSize: 0, $db: db, ...sessionFields(rctx.cmd) }, { plain: true });
    docs.push(...r.cursor.nextBatch);
    id = r.cursor.id;
  }
  return docs;
}

function retryableWrite(cmd) { return cmd.txnNumber !== undefined && cmd.autocommit === undefined; }

function sessionFields(cmd) {
  const out = {};
  for (const f of ['lsid', 'txnNumber', 'autocommit']) if (cmd[f] !== undefined) out[f] = cmd[f];
  return out;
}

// The fields a routed command passes on to the shards (without those mongos handles itself).
function passOn(cmd) {
  const out = Object.assign({}, cmd);
  delete out.$clusterTime;
  delete out.$readPreference;
  return out;
}

async function abortParticipants(rctx, t) {
  t.state = 'aborted';
  for (const name of t.participants.keys()) {
    try {
      await send({ ...rctx, txn: null }, rctx.cluster.shard(name), {
        abortTransaction: 1, $db: 'admin', lsid: rctx.cmd.lsid, txnNumber: Long.fromBigInt(t.txnNumber), autocommit: false,
      }, { plain: true, raw: true });
    } catch (e) { /* already gone on that shard */ }
  }
}

// ---- targeting ----

function nsMeta(rctx, coll) { return rctx.cluster.colls.get(`${rctx.db}.${coll}`) || null; }

function primaryShard(rctx, create = true) {
  // admin, config and local are not in config.databases; their commands go to the first shard.
  if (rctx.db === 'admin' || rctx.db === 'config' || rctx.db === 'local') return rctx.cluster.shards[0];
  const d = rctx.cluster.database(rctx.db, create);
  return d ? rctx.cluster.shard(d.primary) : null;
}

// The shards a filter reaches: one for a full shard-key equality, else every shard with
// chunks; an unsharded collection's single shard is its database's primary.
function target(rctx, meta, filter) {
  if (!meta) return { shards: [primaryShard(rctx)], exact: true };
  const vals = meta.key.fromQuery(filter || {});
  if (vals) return { shards: [rctx.cluster.shard(rctx.cluster.chunkFor(meta, vals).shard)], exact: true, values: vals };
  return { shards: rctx.cluster.shardsOf(meta), exact: false };
}

function idEquality(filter) {
  return !!filter && isPlainObject(filter) && equalities(filter).has('_id');
}

// ---- the routed commands ----

async function cursorReply(rctx, ns, docs, batchSize, singleBatch) {
  const r = rctx.mongos.mcursors.open(ns, docs, { batchSize, singleBatch, session: rctx.cmd.lsid ? sessionKey(rctx.cmd.lsid) : null });
  return r;
}

function num(v, def) { return v === undefined || v === null ? def : V.toNumber(v); }

async function gatherFind(rctx, shards, body) {
  const out = [];
  for (const s of shards) {
    const r = await send(rctx, s, body);
    out.push(...await drain(rctx, s, r, rctx.db));
  }
  return out;
}

const ROUTED = {};

ROUTED.find = async (rctx) => {
  const { cmd, db } = rctx;
  if (db === 'config') return configFind(rctx);
  const meta = nsMeta(rctx, cmd.find);
  if (V.truthy(cmd.tailable)) return tailableFind(rctx, meta);
  const { shards } = target(rctx, meta, cmd.filter);
  let limit = num(cmd.limit, 0);
  let singleBatch = V.truthy(cmd.singleBatch);
  if (limit < 0) {
    limit = -limit;
    singleBatch = true;
  }
  const skip = num(cmd.skip, 0);
  const body = passOn(cmd);
  delete body.skip;
  delete body.limit;
  delete body.singleBatch;
  delete body.batchSize;
  if (limit) body.limit = limit + skip;
  body.batchSize = 0;
  let docs = await gatherFind(rctx, shards, body);
  // Merged: the sort, skip and limit apply again over every shard's part.
  if (shards.length > 1 && cmd.sort && V.keys(cmd.sort).length) docs.sort(V.makeSortComparator(cmd.sort));
  docs = docs.slice(skip, limit ? skip + limit : undefined);
  return cursorReply(rctx, `${db}.${cmd.find}`, docs, cmd.batchSize === undefined ? undefined : num(cmd.batchSize, 101), singleBatch);
};

// A tailable find never drains, so the mongos does not gather it: on an unsharded collection
// (capped collections cannot be sharded) its cursor forwards each getMore that finds it
// exhausted to the shard's cursor (tailGetMore). It is not merged over several shards.
async function tailableFind(rctx, meta) {
  const { cmd, db } = rctx;
  if (meta) throw err(115, 'tailable cursors on a sharded collection are not implemented by the sharded double');
  const shard = primaryShard(rctx);
  const body = passOn(cmd);
  delete body.batchSize;
  const r = await send(rctx, shard, body);
  const shardId = r.cursor.id && V.toBigIntExact(r.cursor.id) !== 0n ? r.cursor.id : null;
  const batchSize = cmd.batchSize === undefined ? undefined : num(cmd.batchSize, 101);
  return rctx.mongos.mcursors.open(`${db}.${cmd.find}`, r.cursor.firstBatch, {
    batchSize, session: cmd.lsid ? sessionKey(cmd.lsid) : null,
    tail: shardId ? { shard, id: shardId, coll: cmd.find } : null,
  });
}

async function tailGetMore(rctx, c) {
  if (!c || !c.tail || c.pos < c.docs.length) return;
  const r = await send(rctx, c.tail.shard, { getMore: c.tail.id, collection: c.tail.coll, $db: rctx.db, ...sessionFields(rctx.cmd) }, { plain: true });
  c.docs = c.docs.slice(c.pos).concat(r.cursor.nextBatch);
  c.pos = 0;
  // The shard's cursor died (its document was deleted...): so does the mongos's, once drained.
  if (!r.cursor.id || V.toBigIntExact(r.cursor.id) === 0n) c.tail = null;
}

ROUTED.getMore = async (rctx) => {
  const { cmd, db } = rctx;
  const c = rctx.mongos.mcursors.cursors.get(V.toBigIntExact(cmd.getMore).toString());
  if (c && c.stream) {
    if (c.ns !== `${db}.${cmd.collection}` && !c.ns.startsWith(`${db}.$cmd`)) {
      throw err(13, `Requested getMore on namespace '${db}.${cmd.collection}', but cursor belongs to a different namespace ${c.ns}`);
    }
    // The stream's cursor is checked out: a failure from here on is resumable (and the cursor
    // gone), as on a mongod.
    const fp = rctx.mongos.failpoints.afterCursorCheckout();
    if (fp && fp.errorCode !== undefined) {
      rctx.mongos.mcursors.cursors.delete(c.id.toString());
      const e = err(V.toNumber(fp.errorCode), "Hit the 'failGetMoreAfterCursorCheckout' failpoint");
      e.fixedLabels = changeStreamLabels(e.code, cmd, 'getMore', { changeStream: true });
      throw e;
    }
    return changeStreams.getMoreMerged({ cmd, conn: rctx.conn, cursors: rctx.mongos.mcursors }, c, num(cmd.batchSize, 0));
  }
  await tailGetMore(rctx, c);
  return rctx.mongos.mcursors.getMore(V.toBigIntExact(cmd.getMore), cmd.collection, db, num(cmd.batchSize, 0));
};

ROUTED.killCursors = async (rctx) => {
  // A tailable cursor's shard cursor goes with it.
  for (const id of rctx.cmd.cursors || []) {
    const c = rctx.mongos.mcursors.cursors.get(V.toBigIntExact(id).toString());
    if (c && c.tail && c.tail.shard) {
      await send(rctx, c.tail.shard, { killCursors: c.tail.coll, cursors: [c.tail.id], $db: rctx.db }, { plain: true }).catch(() => {});
    }
  }
  const r = rctx.mongos.mcursors.kill((rctx.cmd.cursors || []).map((c) => V.toBigIntExact(c)));
  const toLong = (x) => Long.fromBigInt(x);
  return { cursorsKilled: r.cursorsKilled.map(toLong), cursorsNotFound: r.cursorsNotFound.map(toLong), cursorsAlive: [], cursorsUnknown: [], ok: 1 };
};

ROUTED.aggregate = async (rctx) => {
  const { cmd, db } = rctx;
  const pipeline = cmd.pipeline;
  if (changeStreams.isChangeStreamPipeline(pipeline)) {
    // A change stream merges every shard's events in cluster-time order (changestreams.js).
    const sctx = {
      cmd, db, conn: rctx.conn, cursors: rctx.mongos.mcursors, sessionKey: cmd.lsid ? sessionKey(cmd.lsid) : null,
      vars: cmd.let, inTxn: !!rctx.txn,
    };
    return changeStreams.openMerged(sctx, rctx.cluster.shards.map((s) => s.primaryMember));
  }
  if (typeof cmd.aggregate !== 'string') {
    // {aggregate: 1} ($documents, $currentOp...): the database's primary shard answers.
    const s = primaryShard(rctx);
    const r = await send(rctx, s, passOn(cmd));
    return cursorReply(rctx, r.cursor.ns, await drain(rctx, s, r, db), cmd.cursor && cmd.cursor.batchSize !== undefined ? num(cmd.cursor.batchSize) : undefined);
  }
  const meta = nsMeta(rctx, cmd.aggregate);
  const first = pipeline[0];
  const filter = first && isPlainObject(first) && first.$match ? first.$match : {};
  const { shards } = target(rctx, meta, filter);
  const batchSize = cmd.cursor && cmd.cursor.batchSize !== undefined ? num(cmd.cursor.batchSize) : undefined;
  const last = pipeline[pipeline.length - 1];
  const writes = last && (last.$out !== undefined || last.$merge !== undefined);
  const outColl = writes ? (last.$out !== undefined ? last.$out : last.$merge.into || last.$merge) : null;
  const outName = typeof outColl === 'string' ? outColl : outColl && typeof outColl === 'object' ? outColl.coll : null;
  const outDb = outColl && typeof outColl === 'object' && typeof outColl.db === 'string' ? outColl.db : db;
  const outSharded = outName && rctx.cluster.colls.has(`${outDb}.${outName}`);
  if (shards.length === 1 && (!writes || (!meta && !outSharded && outDb === db))) {
    // Targeted: the one shard runs the whole pipeline ($out/$merge from an unsharded collection
    // into an unsharded one of the same database run on the primary shard too).
    const body = passOn(cmd);
    body.cursor = { batchSize: 0 };
    const r = await send(rctx, shards[0], body);
    if (V.truthy(cmd.explain)) return r;
    return cursorReply(rctx, r.cursor.ns, await drain(rctx, shards[0], r, db), batchSize);
  }
  if (writes) throw err(20, `${last.$out !== undefined ? '$out' : '$merge'} from or into a sharded collection through this mongos is not supported by the double`);
  // Scatter-gather: each shard runs the leading $match, mongos the rest over the merged input.
  const body = { find: cmd.aggregate, filter, batchSize: 0, $db: db, ...sessionFields(cmd) };
  if (cmd.collation) body.collation = cmd.collation;
  if (cmd.readConcern) body.readConcern = cmd.readConcern;
  const input = await gatherFind(rctx, shards, body);
  const rest = first && first.$match ? pipeline.slice(1) : pipeline;
  const resolver = (name) => lookupResolver(rctx, name);
  const out = rest.length ? runPipeline(input, rest, { resolver, variables: cmd.let }) : input;
  if (V.truthy(cmd.explain)) return { explainVersion: '1', splitPipeline: {}, shards: {}, ok: 1 };
  return cursorReply(rctx, `${db}.${cmd.aggregate}`, out, batchSize);
};

// $lookup/$unionWith from a scatter-gather pipeline read the other collection's committed
// documents on every shard (the double's mongos merges those in-process).
function lookupResolver(rctx, name) {
  const { Access } = require('./transactions');
  const { select } = require('./query');
  const out = [];
  for (const s of rctx.cluster.shards) {
    const c = s.primaryMember.store.getColl(rctx.db, name);
    if (c) for (const r of select(new Access(s.primaryMember.store, null), c, {})) out.push(V.toView(r.doc));
  }
  return out;
}

ROUTED.count = async (rctx) => {
  const { cmd } = rctx;
  const meta = nsMeta(rctx, cmd.count);
  const { shards } = target(rctx, meta, cmd.query);
  const skip = num(cmd.skip, 0);
  const limit = Math.abs(num(cmd.limit, 0));
  const body = passOn(cmd);
  delete body.skip;
  delete body.limit;
  if (limit) body.limit = limit + skip;
  let n = 0;
  for (const s of shards) n += V.toNumber((await send(rctx, s, body)).n);
  n = Math.max(0, n - skip);
  if (limit && n > limit) n = limit;
  return { n, ok: 1 };
};

ROUTED.distinct = async (rctx) => {
  const { cmd } = rctx;
  const meta = nsMeta(rctx, cmd.distinct);
  const { shards } = target(rctx, meta, cmd.query);
  const seen = new Set();
  const values = [];
  for (const s of shards) {
    for (const v of (await send(rctx, s, passOn(cmd))).values) {
      const k = V.canonicalKey(v);
      if (!seen.has(k)) {
        seen.add(k);
        values.push(v);
      }
    }
  }
  values.sort(V.compareValues);
  return { values, ok: 1 };
};

// ---- writes ----

function addWriteReply(total, r, indexOf) {
  total.n += V.toNumber(r.n || 0);
  if (r.nModified !== undefined) total.nModified = (total.nModified || 0) + V.toNumber(r.nModified);
  if (r.upserted) for (const u of r.upserted) (total.upserted = total.upserted || []).push(Object.assign({}, u, { index: indexOf(V.toNumber(u.index)) }));
  if (r.writeErrors) for (const w of r.writeErrors) (total.writeErrors = total.writeErrors || []).push(Object.assign({}, w, { index: indexOf(V.toNumber(w.index)) }));
  if (r.writeConcernError && !total.writeConcernError) total.writeConcernError = r.writeConcernError;
}

function finishWrite(total) {
  if (total.writeErrors) total.writeErrors.sort((a, b) => a.index - b.index);
  if (total.upserted) total.upserted.sort((a, b) => a.index - b.index);
  total.ok = 1;
  return total;
}

ROUTED.insert = async (rctx) => {
  const { cmd } = rctx;
  const meta = nsMeta(rctx, cmd.insert);
  const docs = (cmd.documents || []).map((d) => (d && d._id === undefined ? Object.assign({ _id: new ObjectId() }, d) : d));
  const ordered = cmd.ordered === undefined || V.truthy(cmd.ordered);
  const shardOf = (d) => (meta ? rctx.cluster.shard(rctx.cluster.chunkFor(meta, meta.key.fromDoc(d)).shard) : primaryShard(rctx));
  // Runs of consecutive documents for one shard, sent in order; an ordered insert stops at the
  // first run with an error.
  const runs = [];
  docs.forEach((d, i) => {
    const s = shardOf(d);
    const lastRun = runs[runs.length - 1];
    if (ordered && lastRun && lastRun.shard === s) lastRun.idx.push(i);
    else if (!ordered && runs.find((r) => r.shard === s)) runs.find((r) => r.shard === s).idx.push(i);
    else runs.push({ shard: s, idx: [i] });
  });
  const total = { n: 0 };
  for (const run of runs) {
    const body = passOn(cmd);
    body.documents = run.idx.map((i) => docs[i]);
    if (retryableWrite(cmd)) body.stmtIds = run.idx.map((i) => new Int32(i));
    const r = await send(rctx, run.shard, body);
    addWriteReply(total, r, (i) => run.idx[i]);
    if (ordered && r.writeErrors && r.writeErrors.length) break;
  }
  return finishWrite(total);
};

// The write error of one statement, as mongos reports a targeting failure.
function targetingError(index, e) { return { index, code: e.code, codeName: e.codeName, errmsg: e.message }; }

function updateShowsRequest(st) {
  const o = { q: st.q, u: st.u, multi: V.truthy(st.multi), upsert: V.truthy(st.upsert) };
  return showBson(o);
}

// Whether an update (operators or replacement) names a shard-key field.
function touchesKey(meta, u) {
  if (Array.isArray(u)) return true;
  const kind = kindOfUpdate(u);
  const paths = [];
  if (kind === 'replacement') paths.push(...V.keys(u));
  else for (const op of V.keys(u)) if (isPlainObject(u[op])) paths.push(...V.keys(u[op]));
  return meta.key.fields.some((f) => paths.some((p) => p === f || p.startsWith(`${f}.`) || f.startsWith(`${p}.`)));
}

ROUTED.update = async (rctx) => {
  const { cmd } = rctx;
  const meta = nsMeta(rctx, cmd.update);
  const ordered = cmd.ordered === undefined || V.truthy(cmd.ordered);
  const total = { n: 0, nModified: 0 };
  const sts = cmd.updates || [];
  const retryable = cmd.txnNumber !== undefined;
  for (let i = 0; i < sts.length; i++) {
    const st = sts[i];
    const body = passOn(cmd);
    body.updates = [st];
    if (retryableWrite(cmd)) body.stmtIds = [new Int32(i)];
    let r;
    try {
      r = await updateOne(rctx, meta, st, body, retryable);
    } catch (e) {
      if (!(e instanceof MongoError) || e.shard) throw e;
      r = { n: 0, nModified: 0, writeErrors: [targetingError(0, e)] };
    }
    addWriteReply(total, r, () => i);
    if (ordered && r.writeErrors && r.writeErrors.length) break;
  }
  return finishWrite(total);
};

async function updateOne(rctx, meta, st, body, retryable) {
  const multi = V.truthy(st.multi);
  const upsert = V.truthy(st.upsert);
  if (!meta) return send(rctx, primaryShard(rctx), body);
  const t = target(rctx, meta, st.q);
  if (upsert && !t.exact && !idEquality(st.q)) {
    throw err(61, 'Failed to target upsert by query :: could not extract exact shard key');
  }
  if (!multi && !t.exact && !idEquality(st.q)) {
    throw err(72, `A {multi:false} update on a sharded collection must contain an exact match on _id (and have the collection default collation) or target a single shard (and have the simple collation), but this update targeted ${t.shards.length} shards. Update request: ${updateShowsRequest(st)}, shard key pattern: ${showBson(meta.key.key)}`);
  }
  if (!multi && touchesKey(meta, st.u)) {
    const moved = await shardKeyChange(rctx, meta, st, t, retryable);
    if (moved) return moved;
  }
  if (t.exact) return send(rctx, t.shards[0], body);
  if (multi) {
    const total = { n: 0, nModified: 0 };
    for (const s of t.shards) addWriteReply(total, await send(rctx, s, body), (i) => i);
    return total;
  }
  // A single update by _id without the shard key: the shard that holds the document applies it;
  // an upsert that matched nowhere inserts on the shard the new document's key names. (Found
  // with a read first: each shard gets the statement once, so its stmtId means one thing.)
  const holder = await holderOf(rctx, t.shards, rctx.cmd.update, st.q);
  if (holder) return send(rctx, holder, body);
  if (!upsert) return { n: 0, nModified: 0 };
  const seedVals = meta.key.fromDoc(upsertPreview(st));
  return send(rctx, rctx.cluster.shard(rctx.cluster.chunkFor(meta, seedVals).shard), body);
}

// The first of `shards` holding a document that matches `filter`, or null.
async function holderOf(rctx, shards, coll, filter) {
  for (const s of shards) if (await peek(rctx, s, coll, filter)) return s;
  return null;
}

// The document an upsert would insert, as far as mongos needs its shard key.
function upsertPreview(st) {
  const { upsertSeed } = require('./update');
  try {
    const seed = upsertSeed(st.q || {});
    if (kindOfUpdate(st.u) === 'replacement') return Object.assign({}, seed, st.u);
    return applyUpdate(seed, st.u, { isInsert: true, arrayFilters: st.arrayFilters });
  } catch (e) {
    return st.q || {};
  }
}

// An update that may change a document's shard-key value (mongod's rules, 4.2+): allowed only
// in a transaction or as a retryable write, with the full shard key in the query; a document
// whose new key belongs to another shard moves there (delete, then insert).
async function shardKeyChange(rctx, meta, st, t, retryable) {
  let current = null;
  let holder = null;
  for (const s of t.shards) {
    current = await peek(rctx, s, rctx.cmd.update, st.q);
    if (current) {
      holder = s;
      break;
    }
  }
  if (!current) return null;
  const next = safeApply(current, st);
  if (!next) return null; // the shard reports the update's own error
  const before = meta.key.fromDoc(current);
  const after = meta.key.fromDoc(next);
  if (cmpBound(before, after) === 0) return null;
  if (!rctx.txn && !retryable) {
    throw err(20, 'Must run update to shard key field in a multi-statement transaction or with retryWrites: true.');
  }
  if (!t.exact) throw err(31025, 'Shard key update is not allowed without specifying the full shard key in the query');
  const dest = rctx.cluster.shard(rctx.cluster.chunkFor(meta, after).shard);
  if (dest === holder) return null;
  const sess = rctx.txn ? { lsid: rctx.cmd.lsid, txnNumber: rctx.cmd.txnNumber, autocommit: false } : {};
  await send(rctx, holder, { delete: rctx.cmd.update, deletes: [{ q: { _id: current._id }, limit: 1 }], $db: rctx.db, ...sess });
  await send(rctx, dest, { insert: rctx.cmd.update, documents: [next], $db: rctx.db, ...sess });
  return { n: 1, nModified: 1 };
}

ROUTED.delete = async (rctx) => {
  const { cmd } = rctx;
  const meta = nsMeta(rctx, cmd.delete);
  const ordered = cmd.ordered === undefined || V.truthy(cmd.ordered);
  const total = { n: 0 };
  const sts = cmd.deletes || [];
  for (let i = 0; i < sts.length; i++) {
    const st = sts[i];
    const body = passOn(cmd);
    body.deletes = [st];
    if (retryableWrite(cmd)) body.stmtIds = [new Int32(i)];
    let r;
    try {
      r = await deleteOne(rctx, meta, st, body);
    } catch (e) {
      if (!(e instanceof MongoError) || e.shard) throw e;
      r = { n: 0, writeErrors: [targetingError(0, e)] };
    }
    addWriteReply(total, r, () => i);
    if (ordered && r.writeErrors && r.writeErrors.length) break;
  }
  return finishWrite(total);
};

async function deleteOne(rctx, meta, st, body) {
  if (!meta) return send(rctx, primaryShard(rctx), body);
  const t = target(rctx, meta, st.q);
  const single = V.toNumber(st.limit) === 1;
  if (single && !t.exact && !idEquality(st.q)) {
    throw err(61, `A single delete on a sharded collection must contain an exact match on _id (and have the collection default collation) or contain the shard key (and have the simple collation). Delete request: ${showBson({ q: st.q, limit: st.limit })}, shard key pattern: ${showBson(meta.key.key)}`);
  }
  if (single && !t.exact) {
    // By _id: the shard that holds it.
    const holder = await holderOf(rctx, t.shards, rctx.cmd.delete, st.q);
    return holder ? send(rctx, holder, body) : { n: 0 };
  }
  const total = { n: 0 };
  for (const s of t.shards) addWriteReply(total, await send(rctx, s, body), (i) => i);
  return total;
}

ROUTED.findAndModify = async (rctx) => {
  const { cmd } = rctx;
  const meta = nsMeta(rctx, cmd.findAndModify);
  const body = passOn(cmd);
  if (!meta) return send(rctx, primaryShard(rctx), body);
  const t = target(rctx, meta, cmd.query);
  const upsert = V.truthy(cmd.upsert);
  if (!t.exact && !(upsert && idEquality(cmd.query))) throw err(61, 'Query for sharded findAndModify must contain the shard key');
  if (t.exact) {
    if (cmd.update !== undefined && touchesKey(meta, cmd.update)) {
      const st = { q: cmd.query, u: cmd.update, arrayFilters: cmd.arrayFilters };
      const current = await peek(rctx, t.shards[0], cmd.findAndModify, cmd.query);
      if (current) {
        const next = safeApply(current, st);
        if (next && cmpBound(meta.key.fromDoc(current), meta.key.fromDoc(next)) !== 0 && !rctx.txn && cmd.txnNumber === undefined) {
          throw err(20, 'Must run update to shard key field in a multi-statement transaction or with retryWrites: true.');
        }
      }
    }
    return send(rctx, t.shards[0], body);
  }
  // An upsert by _id: the shard holding the document, else the one its new key names.
  const holder = await holderOf(rctx, t.shards, cmd.findAndModify, cmd.query);
  if (holder) return send(rctx, holder, body);
  const seedVals = meta.key.fromDoc(upsertPreview({ q: cmd.query, u: cmd.update || {} }));
  return send(rctx, rctx.cluster.shard(rctx.cluster.chunkFor(meta, seedVals).shard), body);
};

async function peek(rctx, shard, coll, filter) {
  const b = { find: coll, filter, limit: 1, batchSize: 0, $db: rctx.db };
  if (rctx.txn) Object.assign(b, { lsid: rctx.cmd.lsid, txnNumber: rctx.cmd.txnNumber, autocommit: false });
  const r = await send(rctx, shard, b);
  return r.cursor.firstBatch[0] || null;
}

function safeApply(doc, st) {
  try {
    return applyUpdate(doc, st.u, { arrayFilters: st.arrayFilters });
  } catch (e) {
    return null;
  }
}

// ---- transactions ----

// A write concern no shard (two data-bearing members each) can satisfy, as a shard reports it.
function writeConcernProblemOf(wc) {
  if (!wc || typeof wc !== 'object' || wc.w === undefined) return null;
  if (V.isNumeric(wc.w) && V.toNumber(wc.w) > 2) return { code: 100, codeName: 'UnsatisfiableWriteConcern', errmsg: 'Not enough data-bearing nodes' };
  if (typeof wc.w === 'string' && wc.w !== 'majority') {
    return { code: 79, codeName: 'UnknownReplWriteConcern', errmsg: `No write concern mode named '${wc.w}' found in replica set configuration` };
  }
  return null;
}

ROUTED.commitTransaction = async (rctx) => {
  const t = rctx.txn;
  const parts = [...t.participants.keys()];
  const body = passOn(rctx.cmd);
  delete body.recoveryToken;
  if (t.state === 'unknown') {
    // Recovery through another router: the recovery shard knows the decision. Without one (the
    // first router never started the commit) it aborts the transaction: 251, transient.
    const d = rctx.cluster.decisions && rctx.cluster.decisions.get(`${sessionKey(rctx.cmd.lsid)}:${t.txnNumber}`);
    if (d === 'committed') return { ok: 1 };
    if (t.shared && t.shared.state === 'inProgress') await abortParticipants(rctx, t.shared);
    const e = err(251, `Transaction ${t.txnNumber} has been aborted.`);
    e.fixedLabels = ['TransientTransactionError'];
    throw e;
  }
  if (t.state === 'committed' && t.decided) {
    // A commit retried: each participant answers it again from its own record.
    let wce = null;
    for (const name of parts) {
      const r = await send(rctx, rctx.cluster.shard(name), body, { plain: true });
      if (r.writeConcernError && !wce) wce = r.writeConcernError;
    }
    return wce ? { ok: 1, writeConcernError: wce } : { ok: 1 };
  }
  if (parts.length === 0) {
    t.state = 'committed';
    const wcp = writeConcernProblemOf(body.writeConcern);
    return wcp ? { ok: 1, writeConcernError: wcp } : { ok: 1 };
  }
  if (parts.length > 1) {
    // Two-phase commit, coordinated by the first participant: every participant must still hold
    // its transaction (prepare) before any commits.
    for (const name of parts) {
      const s = rctx.cluster.shard(name);
      const member = s.set.primary;
      // Phase one: the coordinator asks each participant to prepare (counted as the
      // prepareTransaction it sends, so tests see the two phases per shard).
      if (member) member.count('prepareTransaction', rctx.conn.appName, null);
      const sess = member && member.sessions.get(rctx.cmd.lsid, false);
      if (!sess || !sess.txn || sess.txn.txnNumber !== t.txnNumber || sess.txn.state !== 'inProgress') {
        await abortParticipants(rctx, t);
        const e = err(251, `Transaction ${t.txnNumber} has been aborted.`);
        e.fixedLabels = ['TransientTransactionError'];
        throw e;
      }
    }
  }
  let wce = null;
  for (const name of parts) {
    const r = await send(rctx, rctx.cluster.shard(name), body, { plain: true });
    if (r.writeConcernError && !wce) wce = r.writeConcernError;
  }
  t.state = 'committed';
  t.decided = true;
  if (!rctx.cluster.decisions) rctx.cluster.decisions = new Map();
  rctx.cluster.decisions.set(`${sessionKey(rctx.cmd.lsid)}:${t.txnNumber}`, 'committed');
  return wce ? { ok: 1, writeConcernError: wce } : { ok: 1 };
};

ROUTED.abortTransaction = async (rctx) => {
  const t = rctx.txn;
  if (t.state === 'committed') throw err(256, `Transaction ${t.txnNumber} has been committed.`);
  const parts = [...t.participants.keys()];
  let firstErr = null;
  for (const name of parts) {
    try {
      await send(rctx, rctx.cluster.shard(name), passOn(rctx.cmd), { plain: true });
    } catch (e) {
      if (!firstErr && e.code !== 251) firstErr = e;
    }
  }
  t.state = 'aborted';
  if (parts.length === 0) throw err(251, `Given transaction number ${t.txnNumber} does not match any in-progress transactions.`);
  if (firstErr) throw firstErr;
  return { ok: 1 };
};

ROUTED.endSessions = async (rctx) => {
  for (const s of rctx.cluster.shards) await send({ ...rctx, txn: null }, s, passOn(rctx.cmd), { raw: true });
  return { ok: 1 };
};
ROUTED.killSessions = ROUTED.endSessions;
ROUTED.killAllSessions = ROUTED.endSessions;

// ---- DDL and catalogue ----

async function onShards(rctx, shards, body, ignore = []) {
  let last = null;
  for (const s of shards) {
    try {
      last = await send(rctx, s, body);
    } catch (e) {
      if (!ignore.includes(e.code)) throw e;
    }
  }
  return last || { ok: 1 };
}

function collShards(rctx, coll) {
  const meta = nsMeta(rctx, coll);
  return meta ? rctx.cluster.shardsOf(meta).concat(primaryShard(rctx)).filter((s, i, a) => a.indexOf(s) === i) : [primaryShard(rctx)];
}

ROUTED.create = async (rctx) => send(rctx, primaryShard(rctx), passOn(rctx.cmd));

ROUTED.drop = async (rctx) => {
  const { cmd } = rctx;
  const shards = collShards(rctx, cmd.drop);
  const r = await onShards(rctx, shards, passOn(cmd), [26]);
  rctx.cluster.colls.delete(`${rctx.db}.${cmd.drop}`);
  return Object.assign({ ok: 1 }, r.nIndexesWas !== undefined ? { nIndexesWas: r.nIndexesWas } : {}, { ns: `${rctx.db}.${cmd.drop}` });
};

ROUTED.dropDatabase = async (rctx) => {
  await onShards(rctx, rctx.cluster.shards, passOn(rctx.cmd));
  for (const ns of [...rctx.cluster.colls.keys()]) if (ns.startsWith(`${rctx.db}.`)) rctx.cluster.colls.delete(ns);
  rctx.cluster.dbs.delete(rctx.db);
  return { dropped: rctx.db, ok: 1 };
};

ROUTED.createIndexes = async (rctx) => {
  const { cmd } = rctx;
  const meta = nsMeta(rctx, cmd.createIndexes);
  if (meta) {
    for (const ix of cmd.indexes || []) {
      if (ix && V.truthy(ix.unique) && !meta.key.uniqueCompatible(ix.key)) {
        throw err(67, `cannot create unique index over ${showBson(ix.key)} with shard key pattern ${showBson(meta.key.key)}`);
      }
    }
  }
  const r = await onShards(rctx, collShards(rctx, cmd.createIndexes), passOn(cmd));
  return r;
};

ROUTED.dropIndexes = async (rctx) => onShards(rctx, collShards(rctx, rctx.cmd.dropIndexes), passOn(rctx.cmd));
ROUTED.collMod = async (rctx) => onShards(rctx, collShards(rctx, rctx.cmd.collMod), passOn(rctx.cmd));

async function viaPrimary(rctx) {
  const { cmd, db } = rctx;
  const s = primaryShard(rctx);
  const r = await send(rctx, s, passOn(cmd));
  if (r.cursor && typeof r.cursor.ns === 'string') {
    const batchSize = cmd.cursor && cmd.cursor.batchSize !== undefined ? num(cmd.cursor.batchSize) : undefined;
    return cursorReply(rctx, r.cursor.ns, await drain(rctx, s, r, db), batchSize);
  }
  return r;
}

ROUTED.listCollections = viaPrimary;
// checkMetadataConsistency (mongos 7.0): a cursor over the inconsistencies found between the
// config metadata and the shards. The double keeps one copy of the metadata, in memory, that
// nothing changes behind its back, so there are none: an empty cursor, for the cluster, a
// database or a collection.
ROUTED.checkMetadataConsistency = async (rctx) => {
  const { cmd, db } = rctx;
  const v = cmd.checkMetadataConsistency;
  if (typeof v !== 'string' && !(V.isNumeric(v) && V.toNumber(v) === 1)) {
    throw err(14, "BSON field 'checkMetadataConsistency' is the wrong type, expected 1 or a collection name");
  }
  const batchSize = cmd.cursor && cmd.cursor.batchSize !== undefined ? num(cmd.cursor.batchSize) : undefined;
  return cursorReply(rctx, `${db}.$cmd.aggregate`, [], batchSize);
};
// mapReduce of an unsharded collection runs on its database's primary shard, as on mongos; the
// double does not split a sharded collection's map over its shards and merge, so it refuses one
// rather than answer from one shard's part of the data.
ROUTED.mapReduce = async (rctx) => {
  const name = rctx.cmd.mapReduce !== undefined ? rctx.cmd.mapReduce : rctx.cmd.mapreduce;
  if (typeof name === 'string' && nsMeta(rctx, name)) {
    throw err(115, `mapReduce of the sharded collection ${rctx.db}.${name} is not implemented by the sharded double`);
  }
  return viaPrimary(rctx);
};
ROUTED.mapreduce = ROUTED.mapReduce;
ROUTED.listIndexes = viaPrimary;
ROUTED.renameCollection = async (rctx) => {
  const from = String(rctx.cmd.renameCollection);
  if (rctx.cluster.colls.has(from)) throw err(20, `Cannot rename sharded collection '${from}'`);
  const db = from.slice(0, from.indexOf('.'));
  return send(rctx, primaryShard({ ...rctx, db }), passOn(rctx.cmd));
};
ROUTED.collStats = viaPrimary;
ROUTED.dbStats = viaPrimary;
ROUTED.explain = async (rctx) => {
  const r = await send(rctx, primaryShard(rctx), passOn(rctx.cmd));
  return Object.assign({}, r);
};

ROUTED.listDatabases = async (rctx) => {
  const byName = new Map();
  for (const s of rctx.cluster.shards) {
    const r = await send(rctx, s, passOn(rctx.cmd));
    for (const d of r.databases) {
      const have = byName.get(d.name);
      if (!have) byName.set(d.name, Object.assign({}, d, { shards: { [s.name]: d.sizeOnDisk } }));
      else {
        have.sizeOnDisk = V.toNumber(have.sizeOnDisk) + V.toNumber(d.sizeOnDisk);
        have.shards[s.name] = d.sizeOnDisk;
        have.empty = have.empty && d.empty;
      }
    }
  }
  const databases = [...byName.values()].sort((a, b) => (a.name < b.name ? -1 : 1));
  if (V.truthy(rctx.cmd.nameOnly)) return { databases: databases.map((d) => ({ name: d.name })), ok: 1 };
  const totalSize = databases.reduce((a, d) => a + V.toNumber(d.sizeOnDisk), 0);
  return { databases, totalSize, totalSizeMb: Math.floor(totalSize / 1048576), ok: 1 };
};

// ---- sharding commands (admin) ----

function adminOnly(rctx) {
  if (rctx.db !== 'admin') throw err(13, `${rctx.name} may only be run against the admin database.`);
}

ROUTED.listShards = async (rctx) => {
  adminOnly(rctx);
  return { shards: shardDocs(rctx.cluster), ok: 1 };
};

function shardDocs(cluster) {
  return cluster.shards.map((s) => ({ _id: s.name, host: s.host(), state: 1, topologyTime: new Timestamp({ t: cluster.bootSecs, i: 1 }) }));
}

ROUTED.enableSharding = async (rctx) => {
  adminOnly(rctx);
  const db = rctx.cmd.enableSharding;
  if (typeof db !== 'string' || !db) throw err(73, `Invalid db name specified: ${db}`);
  if (db === 'admin' || db === 'local') throw err(73, `Cannot enable sharding on the ${db} database`);
  const d = rctx.cluster.database(db, false);
  if (rctx.cmd.primaryShard !== undefined) {
    const s = rctx.cluster.shard(rctx.cmd.primaryShard);
    if (!s) throw err(70, `Shard ${rctx.cmd.primaryShard} not found`);
    if (d && d.primary !== s.name) {
      throw err(117, `database ${db} could not be created :: caused by :: database already exists with a different primary shard ${d.primary}`);
    }
    if (!d) rctx.cluster.dbs.set(db, { primary: s.name, uuid: new UUID(), timestamp: rctx.cluster.clusterTime() });
  } else {
    rctx.cluster.database(db, true);
  }
  return { ok: 1 };
};

ROUTED.shardCollection = async (rctx) => {
  adminOnly(rctx);
  const { cmd, cluster } = rctx;
  const ns = cmd.shardCollection;
  if (typeof ns !== 'string' || ns.indexOf('.') <= 0) throw err(73, `Invalid namespace specified '${ns}'`);
  const db = ns.slice(0, ns.indexOf('.'));
  const coll = ns.slice(db.length + 1);
  if (db === 'admin' || db === 'local' || db === 'config') throw err(20, `can't shard ${db} database`);
  const key = cmd.key;
  if (!isPlainObject(key) || !V.keys(key).length) throw err(2, 'Shard key cannot be empty');
  let hashedCount = 0;
  for (const f of V.keys(key)) {
    const v = key[f];
    if (v === 'hashed') hashedCount++;
    else if (!(V.isNumeric(v) && V.toNumber(v) === 1)) {
      throw err(2, `Shard key ${showBson(key)} can contain either a single 'hashed' field or multiple numerical fields set to a value of 1. Failed to parse field ${f}: ${showBson(v)}`);
    }
  }
  if (hashedCount > 1) throw err(2, `Shard key ${showBson(key)} can contain either a single 'hashed' field or multiple numerical fields set to a value of 1`);
  const unique = V.truthy(cmd.unique);
  if (unique && hashedCount) throw err(72, 'hashed shard keys cannot be declared unique. It is possible to ensure uniqueness on the hashed field by declaring an additional (non-hashed) unique index on the field.');
  const sk = new ShardKey(key);
  const have = cluster.colls.get(ns);
  if (have) {
    if (V.canonicalKey(have.key.key) === V.canonicalKey(key)) return { collectionsharded: ns, ok: 1 };
    throw err(117, `sharding already enabled for collection ${ns} with options { key: ${showBson(have.key.key)}, unique: ${have.unique} }`);
  }
  const dbe = cluster.database(db, true);
  const home = cluster.shard(dbe.primary);
  const homeStore = home.primaryMember.store;
  const existing = homeStore.getColl(db, coll);
  if (existing && existing.options && existing.options.viewOn !== undefined) throw err(166, `Namespace ${ns} is a view, not a collection`);
  const sub = { ...rctx, db, txn: null };
  let nonEmpty = false;
  if (existing) {
    const ixs = (await viaPrimary({ ...sub, cmd: { listIndexes: coll, cursor: {}, $db: db } })).cursor.firstBatch;
    for (const ix of ixs) {
      if (V.truthy(ix.unique) && !sk.uniqueCompatible(ix.key)) {
        throw err(72, `can't shard collection '${ns}' with unique index on ${showBson(ix.key)} and proposed shard key ${showBson(key)}. Uniqueness can't be maintained unless shard key is a prefix`);
      }
    }
    const n = await send(sub, home, { count: coll, $db: db });
    nonEmpty = V.toNumber(n.n) > 0;
    const useful = ixs.some((ix) => V.keys(key).every((f, i) => V.keys(ix.key)[i] === f));
    if (nonEmpty && !useful) {
      throw err(72, 'Please create an index that starts with the proposed shard key before sharding the collection');
    }
  }
  // Every shard holds the collection and the shard key's index, as after a 7.0 shardCollection
  // and the first migrations.
  const ixName = V.keys(key).map((f) => `${f}_${key[f]}`).join('_');
  for (const s of cluster.shards) {
    const log = s.primaryMember.store.changes;
    const from = log.lastSeq;
    await send(sub, s, { createIndexes: coll, indexes: [{ key, name: ixName, ...(unique ? { unique: true } : {}) }], $db: db }, { raw: true });
    // Set-up of the cluster, not a user's DDL: change streams do not show it (as mongod marks
    // what migrations and sharding DDL do on shards: fromMigrate).
    for (let q = from + 1; q <= log.lastSeq; q++) {
      const e = log.at(q);
      if (e && e.db === db && e.coll === coll && (e.op === 'create' || e.op === 'createIndexes')) e.internal = true;
    }
  }
  const chunks = [];
  const min = sk.fields.map(() => new MinKey());
  const max = sk.fields.map(() => new MaxKey());
  if (sk.hashed && !nonEmpty) {
    // Empty collection, hashed key: chunks spread evenly from the start (numInitialChunks,
    // default two per shard), each shard taking a contiguous run of the hash range.
    const nShards = cluster.shards.length;
    const nChunks = Math.max(1, cmd.numInitialChunks !== undefined ? V.toNumber(cmd.numInitialChunks) : 2 * nShards);
    const hashedAt = sk.fields.indexOf(sk.hashed);
    const bound = (k) => sk.fields.map((f, i) => (i === hashedAt ? Long.fromBigInt(INT64_MIN + (INT64_SPAN * BigInt(k)) / BigInt(nChunks)) : new MinKey()));
    for (let k = 0; k < nChunks; k++) {
      chunks.push({ min: k === 0 ? min : bound(k), max: k === nChunks - 1 ? max : bound(k + 1), shard: cluster.shards[Math.floor((k * nShards) / nChunks)].name });
    }
  } else if (!nonEmpty && cluster.shards.length > 1 && isPlainObject(cmd.presplit)) {
    chunks.push({ min, max, shard: home.name });
  } else {
    // A range key (or a collection with data): one chunk on the primary shard, as 7.0 starts.
    chunks.push({ min, max, shard: home.name });
  }
  // The shardCollection event (showExpandedEvents) on the primary shard's log.
  const homeColl = homeStore.getColl(db, coll);
  recordDdl(homeStore, 'shardCollection', {
    db, coll, uuid: homeColl ? homeColl.uuid : new UUID(),
    desc: V.fromEntries([['shardKey', key], ['unique', unique], ['numInitialChunks', Long.fromNumber(0)], ['presplitHashedZones', false]]),
  });
  const ts = cluster.clusterTime();
  cluster.colls.set(ns, {
    key: sk, unique, uuid: existing ? existing.uuid || new UUID() : new UUID(), epoch: new ObjectId(), timestamp: ts, lastmod: new Date(),
    chunks: chunks.map((c, i) => Object.assign(c, { id: new ObjectId(), lastmod: new Timestamp({ t: 1, i: i + 1 }) })),
  });
  return { collectionsharded: ns, ok: 1 };
};

// {split: ns, middle: {...}}: splits the chunk holding `middle` there (range keys).
ROUTED.split = async (rctx) => {
  adminOnly(rctx);
  const meta = rctx.cluster.colls.get(rctx.cmd.split);
  if (!meta) throw err(118, `Collection ${rctx.cmd.split} is not sharded`);
  const mid = meta.key.fromDoc(rctx.cmd.middle || {});
  const at = mid.map((v, i) => (meta.key.fields[i] === meta.key.hashed ? v : v));
  const c = meta.chunks.find((x) => cmpBound(x.min, at) < 0 && cmpBound(at, x.max) < 0);
  if (!c) throw err(2, `cannot split on initial or final chunk's key ${showBson(rctx.cmd.middle)}`);
  const i = meta.chunks.indexOf(c);
  meta.chunks.splice(i, 1, Object.assign({}, c, { max: at, id: new ObjectId() }), Object.assign({}, c, { min: at, id: new ObjectId() }));
  return { ok: 1 };
};

// {moveChunk: ns, find: {...}, to: shard}: moves the chunk holding `find` and its documents.
ROUTED.moveChunk = async (rctx) => {
  adminOnly(rctx);
  const { cluster, cmd } = rctx;
  const ns = cmd.moveChunk;
  const meta = cluster.colls.get(ns);
  if (!meta) throw err(118, `Collection ${ns} is not sharded`);
  const to = cluster.shard(cmd.to);
  if (!to) throw err(70, `Could not find shard ${cmd.to}`);
  const c = cluster.chunkFor(meta, meta.key.fromDoc(cmd.find || {}));
  if (c.shard === to.name) return { millis: 0, ok: 1 };
  const from = cluster.shard(c.shard);
  const db = ns.slice(0, ns.indexOf('.'));
  const coll = ns.slice(db.length + 1);
  const sub = { ...rctx, db, txn: null, cmd: {} };
  const all = await gatherFind(sub, [from], { find: coll, filter: {}, batchSize: 0, $db: db });
  const moving = all.filter((d) => {
    const rv = meta.key.routingValue(meta.key.fromDoc(d));
    return cmpBound(c.min, rv) <= 0 && cmpBound(rv, c.max) < 0;
  });
  if (moving.length) {
    await send(sub, to, { insert: coll, documents: moving, $db: db });
    await send(sub, from, { delete: coll, deletes: moving.map((d) => ({ q: { _id: d._id }, limit: 1 })), $db: db });
  }
  c.shard = to.name;
  return { millis: 0, ok: 1 };
};

// ---- config database reads ----

function configDocs(cluster, coll) {
  if (coll === 'collections') {
    return [...cluster.colls.entries()].map(([ns, m]) => ({
      _id: ns, lastmodEpoch: m.epoch, lastmod: m.lastmod, timestamp: m.timestamp, uuid: m.uuid, key: m.key.key, unique: m.unique, noBalance: false,
    }));
  }
  if (coll === 'chunks') {
    const out = [];
    for (const m of cluster.colls.values()) {
      const doc = (b) => V.fromEntries(m.key.fields.map((f, i) => [f, b[i]]));
      for (const c of m.chunks) {
        out.push({ _id: c.id, uuid: m.uuid, min: doc(c.min), max: doc(c.max), shard: c.shard, lastmod: c.lastmod, onCurrentShardSince: m.timestamp, history: [{ validAfter: m.timestamp, shard: c.shard }] });
      }
    }
    return out;
  }
  if (coll === 'shards') return shardDocs(cluster);
  if (coll === 'version') return [{ _id: 1, clusterId: cluster.clusterId }];
  if (coll === 'databases') {
    return [...cluster.dbs.entries()].map(([name, d]) => ({ _id: name, primary: d.primary, partitioned: true, version: { uuid: d.uuid, timestamp: d.timestamp, lastMod: 1 } }));
  }
  if (coll === 'mongos') return cluster.mongos.map((m) => ({ _id: m.address, ping: new Date(), up: Long.fromNumber(Math.floor((Date.now() - m.startedAt) / 1000)), mongoVersion: '7.0.0' }));
  return [];
}

async function configFind(rctx) {
  const { cmd } = rctx;
  const stages = [];
  if (cmd.filter && V.keys(cmd.filter).length) stages.push({ $match: cmd.filter });
  if (cmd.sort && V.keys(cmd.sort).length) stages.push({ $sort: cmd.sort });
  if (cmd.skip) stages.push({ $skip: num(cmd.skip) });
  if (cmd.limit && num(cmd.limit) !== 0) stages.push({ $limit: Math.abs(num(cmd.limit)) });
  if (cmd.projection && V.keys(cmd.projection).length) stages.push({ $project: cmd.projection });
  const docs = configDocs(rctx.cluster, cmd.find);
  const out = stages.length ? runPipeline(docs, stages, {}) : docs;
  return cursorReply(rctx, `config.${cmd.find}`, out, cmd.batchSize === undefined ? undefined : num(cmd.batchSize), V.truthy(cmd.singleBatch));
}

// config's collections through aggregate and count too (drivers' and shells' helpers).
const routedAggregate = ROUTED.aggregate;
ROUTED.aggregate = async (rctx) => {
  if (rctx.db !== 'config' || typeof rctx.cmd.aggregate !== 'string') return routedAggregate(rctx);
  const out = runPipeline(configDocs(rctx.cluster, rctx.cmd.aggregate), rctx.cmd.pipeline || [], {});
  return cursorReply(rctx, `config.${rctx.cmd.aggregate}`, out, rctx.cmd.cursor && rctx.cmd.cursor.batchSize !== undefined ? num(rctx.cmd.cursor.batchSize) : undefined);
};
const routedCount = ROUTED.count;
ROUTED.count = async (rctx) => {
  if (rctx.db !== 'config') return routedCount(rctx);
  const docs = configDocs(rctx.cluster, rctx.cmd.count);
  const out = rctx.cmd.query && V.keys(rctx.cmd.query).length ? runPipeline(docs, [{ $match: rctx.cmd.query }], {}) : docs;
  return { n: out.length, ok: 1 };
};

module.exports = { Cluster, Mongos, ShardKey, hashValue, showBson };
