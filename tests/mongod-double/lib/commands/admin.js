'use strict';
// Handshake and administrative commands: hello/isMaster (replica-set primary, secondary or
// standalone identity, topologyVersion and awaitable hello, compression negotiation,
// saslSupportedMechs, speculativeAuthenticate), elections (replSetStepDown, replSetFreeze,
// replSetStepUp, replSetGetStatus, the double's doubleElectionTime), ping,
// buildInfo, getParameter, serverStatus, session housekeeping (endSessions, killSessions,
// killAllSessions, refreshSessions, startSession), transaction end (commitTransaction,
// abortTransaction), configureFailPoint and the double's own doubleStats. Anything a driver
// only uses for diagnostics answers with a plausible minimal shape.

const { Long, Int32, ObjectId, UUID, Timestamp } = require('bson');
const V = require('../values');
const { err } = require('../errors');
const { sessionKey } = require('../sessions');
const { x509Login } = require('./auth');

const VERSION = '7.0.0';

// Awaitable hello (mongod 4.4+): with the member's current topologyVersion and maxAwaitTimeMS
// the reply waits for the next topology change, at most maxAwaitTimeMS; an older counter or
// another processId is answered at once.
async function awaitTopology(ctx) {
  const { cmd, server, conn } = ctx;
  const hasTv = cmd.topologyVersion !== undefined;
  const hasWait = cmd.maxAwaitTimeMS !== undefined;
  if (!hasTv && !hasWait) return;
  if (!hasWait) throw err(31368, "A request with a 'topologyVersion' must include 'maxAwaitTimeMS'");
  if (!hasTv) throw err(31368, "A request with 'maxAwaitTimeMS' must include a 'topologyVersion'");
  // parse.js checked both (TopologyVersion, a number >= 0).
  const tv = cmd.topologyVersion;
  const ms = V.toNumber(cmd.maxAwaitTimeMS);
  if (!tv.processId.equals(server.processId)) return;
  const counter = V.toBigIntExact(tv.counter);
  if (counter !== null && counter > server.tvCounter) {
    throw err(31382, "Received a topology version with the same process ID and a higher counter than the server's topology version");
  }
  if (counter !== server.tvCounter) return;
  await server.awaitTopologyChange(conn, ms);
}

async function hello(ctx) {
  const { cmd, server, conn, name } = ctx;
  const opts = server.opts;
  await awaitTopology(ctx);
  const set = server.set;
  const r = {};
  if (cmd.helloOk !== undefined) r.helloOk = true;
  r.topologyVersion = server.topologyVersion();
  if (!conn.handshakeDone) {
    conn.handshakeDone = true;
    if (cmd.client && cmd.client.application && typeof cmd.client.application.name === 'string') {
      conn.appName = cmd.client.application.name;
    }
    if (Array.isArray(cmd.compression)) {
      const offered = cmd.compression.filter((c) => c === 'zlib');
      conn.compression = offered;
    }
  }
  const legacy = name !== 'hello';
  const me = server.address;
  const isPrimary = server.role === 'primary' || server.role === 'standalone';
  if (!opts.standalone) {
    r.hosts = server.hosts();
    r.setName = opts.setName || 'rs0';
    r.setVersion = 1;
  }
  r[legacy ? 'ismaster' : 'isWritablePrimary'] = isPrimary;
  // A mongos router: no set fields, and the msg drivers recognise a mongos by (SDAM spec).
  if (opts.isMongos) r.msg = 'isdbgrid';
  if (!opts.standalone) {
    r.secondary = !isPrimary;
    if (set.primary) r.primary = set.primary.address;
    r.me = me;
    if (isPrimary) r.electionId = set.electionId();
    const ot = server.clusterTime();
    const now = new Date();
    const t = Long.fromNumber(set.term);
    // The majority optime is the commit point (majority.js): the clock unless the secondary lags.
    const mt = new Timestamp({ t: server.bootSecs, i: server.store.majorityTs() + 1 });
    r.lastWrite = { opTime: { ts: ot, t }, lastWriteDate: now, majorityOpTime: { ts: mt, t }, majorityWriteDate: now };
  }
  r.maxBsonObjectSize = 16777216;
  r.maxMessageSizeBytes = 48000000;
  r.maxWriteBatchSize = 100000;
  r.localTime = new Date();
  r.logicalSessionTimeoutMinutes = 30;
  r.connectionId = conn.id;
  r.minWireVersion = 0;
  r.maxWireVersion = opts.maxWireVersion;
  r.readOnly = false;
  if (conn.compression && conn.compression.length && cmd.compression !== undefined) r.compression = conn.compression;
  if (typeof cmd.saslSupportedMechs === 'string' && server.auth) {
    const mechs = server.auth.supportedMechs(cmd.saslSupportedMechs);
    if (mechs) r.saslSupportedMechs = mechs;
  }
  if (cmd.speculativeAuthenticate && cmd.speculativeAuthenticate.mechanism === 'MONGODB-X509') {
    // As mongod: a failed speculative X.509 login is just left out of the reply.
    try {
      r.speculativeAuthenticate = x509Login(conn, cmd.speculativeAuthenticate, cmd.speculativeAuthenticate.db || '$external');
    } catch (e) { /* the driver authenticates explicitly */ }
  } else if (cmd.speculativeAuthenticate && server.auth) {
    const spec = server.auth.speculative(conn, cmd.speculativeAuthenticate);
    if (spec) r.speculativeAuthenticate = spec;
  }
  r.ok = 1;
  return r;
}

async function ping() { return { ok: 1 }; }
// A test command (enableTestCommands) of API version 2 only, as on mongod.
async function testVersion2() { return { ok: 1 }; }

async function buildInfo() {
  return {
    version: VERSION,
    gitVersion: '0000000000000000000000000000000000000000',
    modules: [],
    allocator: 'system',
    javascriptEngine: 'none',
    sysInfo: 'deprecated',
    versionArray: [new Int32(7), new Int32(0), new Int32(0), new Int32(0)],
    bits: 64,
    debug: false,
    maxBsonObjectSize: 16777216,
    storageEngines: ['wiredTiger'],
    ok: 1,
  };
}

async function getParameter(ctx) {
  const { cmd, server } = ctx;
  const all = {
    featureCompatibilityVersion: { version: '7.0' },
    // A mongod parameter only: a mongos answers "no option found to get" (each shard has its own).
    ...(server.opts.isMongos ? {} : { transactionLifetimeLimitSeconds: server.opts.txnLifetime }),
    maxTransactionLockRequestTimeoutMillis: 5,
    authenticationMechanisms: ['SCRAM-SHA-1', 'SCRAM-SHA-256'],
    requireApiVersion: false,
    enableTestCommands: true,
    // A test-only parameter (with enableTestCommands) that lets API version 2 be declared.
    acceptApiVersion2: false,
  };
  const r = {};
  if (cmd.getParameter === '*' || (cmd.getParameter && typeof cmd.getParameter === 'object' && cmd.getParameter.allParameters)) {
    Object.assign(r, all);
  } else {
    for (const k of Object.keys(cmd)) {
      if (k === 'getParameter' || k.startsWith('$') || k === 'lsid' || k === 'comment') continue;
      if (!(k in all)) throw err(72, `no option found to get`);
      r[k] = all[k];
    }
    if (!Object.keys(r).length) throw err(72, 'no option found to get');
  }
  r.ok = 1;
  return r;
}

async function serverStatus(ctx) {
  const { server } = ctx;
  return {
    host: server.address,
    version: VERSION,
    process: 'mongod',
    pid: Long.fromNumber(process.pid),
    uptime: (Date.now() - server.startedAt) / 1000,
    uptimeMillis: Long.fromNumber(Date.now() - server.startedAt),
    localTime: new Date(),
    connections: { current: server.conns.size, available: 838860, totalCreated: server.totalConns },
    transactions: {
      currentActive: Long.fromNumber(ctx.store.activeTxns.size),
      currentOpen: Long.fromNumber(ctx.store.activeTxns.size),
    },
    ok: 1,
  };
}

async function doubleStats(ctx) {
  const commands = Object.assign({}, ctx.server.stats);
  const byApp = JSON.parse(JSON.stringify(ctx.server.statsByApp || {}));
  const ex = ctx.store.examined || { keys: 0, docs: 0 };
  const examined = { keys: ex.keys, docs: ex.docs };
  const errors = JSON.parse(JSON.stringify(ctx.server.errorStats || { byCode: {}, byApp: {} }));
  if (ctx.cmd.reset !== undefined && V.truthy(ctx.cmd.reset)) {
    for (const k of Object.keys(ctx.server.stats)) delete ctx.server.stats[k];
    ctx.server.statsByApp = {};
    ctx.server.errorStats = null;
    ctx.store.examined = { keys: 0, docs: 0 };
  }
  return { commands, byApp, examined, errors, ok: 1 };
}

// The session catalogue is the primary's (transactions live there); a secondary's own state
// for a session is only its cursors, so there these commands end or kill just those.
async function endSessions(ctx) {
  const list = ctx.cmd[ctx.name];
  const primary = ctx.server.role !== 'secondary';
  if (Array.isArray(list)) {
    for (const lsid of list) {
      if (primary && ctx.name === 'endSessions') ctx.sessions.end(lsid);
      else if (primary) ctx.sessions.kill(lsid);
      const key = sessionKey(lsid);
      if (key) ctx.cursors.killForSession(key);
    }
  }
  return { ok: 1 };
}

async function killAllSessions(ctx) {
  if (ctx.server.role !== 'secondary') ctx.sessions.killAll();
  for (const [k, c] of ctx.cursors.cursors) if (c.session) ctx.cursors.cursors.delete(k);
  return { ok: 1 };
}

async function refreshSessions() { return { ok: 1 }; }

async function startSession(ctx) {
  const id = new UUID();
  ctx.sessions.get({ id }, true);
  return { id: { id }, timeoutMinutes: 30, ok: 1 };
}

async function commitTransaction(ctx) {
  const s = ctx.sctx;
  if (!s || !s.inTxn) throw err(251, 'no transaction in progress... commitTransaction requires a session and txnNumber with autocommit:false');
  if (s.commitAgain) return { ok: 1 };
  // Aborted meanwhile (e.g. by the reaper while a fail point held this commit).
  if (s.txn.state === 'aborted') throw err(251, `Transaction ${s.txn.txnNumber} has been aborted.`);
  s.txn.commit();
  return { ok: 1 };
}

async function abortTransaction(ctx) {
  const s = ctx.sctx;
  if (!s || !s.inTxn) throw err(251, 'no transaction in progress');
  s.txn.abort('aborted');
  return { ok: 1 };
}

async function configureFailPoint(ctx) {
  const r = ctx.server.failpoints.configure(ctx.cmd);
  if (ctx.cmd.configureFailPoint === 'stopReplProducer' && ctx.server.store.commit) ctx.server.store.commit.replicationChanged();
  return r;
}

async function whatsmyuri(ctx) { return { you: ctx.conn.remote, ok: 1 }; }

async function getCmdLineOpts() { return { argv: ['mongod', '--replSet', 'rs0'], parsed: { replication: { replSet: 'rs0' } }, ok: 1 }; }

async function hostInfo() {
  return { system: { currentTime: new Date(), hostname: 'localhost', cpuAddrSize: 64, numCores: 2 }, os: { type: 'Linux' }, extra: {}, ok: 1 };
}

async function connectionStatus(ctx) {
  const users = ctx.conn.user ? [{ user: ctx.conn.user, db: ctx.conn.userDb || 'admin' }] : [];
  const roles = ctx.conn.user ? [{ role: 'root', db: 'admin' }] : [];
  return { authInfo: { authenticatedUsers: users, authenticatedUserRoles: roles }, ok: 1 };
}

async function replSetGetStatus(ctx) {
  if (ctx.server.opts.standalone) throw err(76, 'not running with --replSet');
  const set = ctx.server.set;
  const state = (m) => (m.role === 'primary' ? 1 : 2);
  return {
    set: ctx.server.opts.setName || 'rs0', date: new Date(), myState: state(ctx.server), term: Long.fromNumber(set.term),
    members: ctx.server.members.map((m, i) => ({
      _id: i, name: m.address, health: 1, state: state(m), stateStr: m.role === 'primary' ? 'PRIMARY' : 'SECONDARY',
      ...(m.role === 'primary' ? { electionId: set.electionId() } : {}),
      ...(m === ctx.server ? { self: true } : {}),
    })),
    ok: 1,
  };
}

function replCommand(ctx) {
  if (ctx.server.opts.standalone) throw err(76, 'not running with --replSet');
  if (ctx.db !== 'admin') throw err(13, `${ctx.name} may only be run against the admin database.`);
  return ctx.server.set;
}

function sleep(ms) { return new Promise((r) => { setTimeout(r, ms); }); }

// replSetStepDown: <secs> (60 when 0 or not a number), secondaryCatchUpPeriodSecs (default 10,
// 0 with force), force. The other member is always caught up (no replication lag), so the
// step-down happens at once; a set without another member waits the catch-up period and then
// fails with 262 unless forced. The member is not electable for <secs>; the other member runs
// for election (see doubleElectionTime for how long that takes).
async function replSetStepDown(ctx) {
  const set = replCommand(ctx);
  const { cmd, server } = ctx;
  const force = V.truthy(cmd.force);
  let secs = V.isNumeric(cmd.replSetStepDown) ? Math.trunc(V.toNumber(cmd.replSetStepDown)) : 0;
  if (secs === 0) secs = 60;
  else if (secs < 0) throw err(2, 'stepdown period must be a positive integer');
  let catchUp = force ? 0 : 10;
  if (cmd.secondaryCatchUpPeriodSecs !== undefined) {
    const v = cmd.secondaryCatchUpPeriodSecs;
    if (!V.isNumeric(v)) {
      throw err(14, `Expected field "secondaryCatchUpPeriodSecs" to have numeric type, but found ${V.bsonTag(v) || typeof v}`);
    }
    catchUp = V.toNumber(v);
    if (!Number.isInteger(catchUp)) {
      throw err(2, `Expected field "secondaryCatchUpPeriodSecs" to have a value exactly representable as a 64-bit integer, but found secondaryCatchUpPeriodSecs: ${catchUp}`);
    }
  }
  if (catchUp < 0) throw err(2, 'secondaryCatchUpPeriodSecs period must be a positive or absent');
  if (secs < catchUp) throw err(2, 'stepdown period must be longer than secondaryCatchUpPeriodSecs');
  if (set.primary !== server) throw err(10107, "not primary so can't step down");
  if (server.steppingDown) throw err(117, 'This node is already in the process of stepping down');
  const others = set.members.filter((m) => m !== server);
  const cp = server.store.commit;
  if (others.length && cp && cp.ts < server.store.clock) {
    // The secondary lags (majority.js): wait up to the catch-up period for it to hold every
    // write; unless forced, a step-down without it fails. Forced, the writes it lacks are
    // rolled back when it takes over.
    server.steppingDown = true;
    let caught;
    try {
      caught = (await cp.waitFor(server.store.clock, catchUp * 1000, null)) === 'ok';
    } finally {
      server.steppingDown = false;
    }
    if (!caught && !force) {
      throw err(262, `No electable secondaries caught up as of ${new Date().toISOString()}. Please use the replSetStepDown command with the argument {force: true} to force node to step down.`);
    }
    if (set.primary !== server) throw err(10107, "not primary so can't step down");
  } else if (!others.length) {
    server.steppingDown = true;
    try {
      await sleep(catchUp * 1000);
    } finally {
      server.steppingDown = false;
    }
    if (!force) {
      throw err(262, `No electable secondaries caught up as of ${new Date().toISOString()}. Please use the replSetStepDown command with the argument {force: true} to force node to step down.`);
    }
    if (set.primary !== server) throw err(10107, "not primary so can't step down");
  }
  set.stepDown(server, Date.now() + secs * 1000, `replSetStepDown: ${secs}${force ? ', force' : ''}`);
  set.scheduleAuto();
  return { ok: 1 };
}

// replSetFreeze: <secs> keeps a secondary from running for election for <secs>; 0 ends a
// freeze or step-down period at once.
async function replSetFreeze(ctx) {
  const set = replCommand(ctx);
  const { cmd, server } = ctx;
  if (set.primary === server || (set.election && set.election.candidate === server)) {
    throw err(95, `cannot freeze node when primary or running for election. state: ${set.primary === server ? 'Primary' : 'Running-Election'}`);
  }
  const secs = V.isNumeric(cmd.replSetFreeze) ? Math.trunc(V.toNumber(cmd.replSetFreeze)) : 0;
  const r = {};
  if (secs === 0) {
    server.stepDownUntil = Date.now();
    r.info = 'unfreezing';
    server.log('unfreezing');
  } else {
    if (secs === 1) r.warning = 'you really want to freeze for only 1 second?';
    server.stepDownUntil = Math.max(server.stepDownUntil, Date.now() + secs * 1000);
    server.log(`freezing for ${secs} seconds`);
  }
  set.scheduleAuto();
  r.ok = 1;
  return r;
}

// replSetStepUp: a secondary runs for election now (the primary steps down as it learns the
// higher term); answered when the election is over. Fails with 125 when the member is frozen
// or in its step-down period, or loses.
async function replSetStepUp(ctx) {
  const set = replCommand(ctx);
  const { cmd } = ctx;
  if (cmd.skipDryRun !== undefined && typeof cmd.skipDryRun !== 'boolean') {
    throw err(14, `BSON field 'replSetStepUp.skipDryRun' is the wrong type '${typeof cmd.skipDryRun}', expected type 'bool'`);
  }
  await set.stepUp(ctx.server);
  return { ok: 1 };
}

// The double's own: {doubleElectionTime: <ms>} (admin, any member) sets how long every later
// election takes; meanwhile no member is primary. Answers the previous value.
async function doubleElectionTime(ctx) {
  const set = replCommand(ctx);
  const v = ctx.cmd.doubleElectionTime;
  if (!V.isNumeric(v) || !(V.toNumber(v) >= 0) || !Number.isFinite(V.toNumber(v))) {
    throw err(2, 'doubleElectionTime needs a number of milliseconds >= 0');
  }
  const previous = set.electionMs;
  set.electionMs = Math.trunc(V.toNumber(v));
  return { electionTimeMS: previous, ok: 1 };
}

// currentOp: with $all (or idleConnections), one entry per open client connection, idle ones
// included, with its connectionId, client address and the appName of its hello, as mongod
// lists them (the connection running the command is the one active entry). Without it, the
// command's own operation only.
async function currentOp(ctx) {
  const all = V.truthy(ctx.cmd.$all) || V.truthy(ctx.cmd.idleConnections);
  const entry = (c) => {
    const e = { type: 'op', host: ctx.server.address, desc: `conn${c.id}`, connectionId: c.id, client: c.remote,
      active: c === ctx.conn, currentOpTime: new Date().toISOString() };
    if (typeof c.appName === 'string') e.appName = c.appName;
    if (c === ctx.conn) { e.op = 'command'; e.command = { currentOp: 1 }; }
    return e;
  };
  const inprog = all ? [...ctx.server.conns].filter((c) => !c.closed).map(entry) : [entry(ctx.conn)];
  return { inprog, ok: 1 };
}
async function killOp() { return { info: 'attempting to kill op', ok: 1 }; }
async function getLog() { return { totalLinesWritten: 0, log: [], ok: 1 }; }
async function logout(ctx) {
  ctx.conn.user = null;
  return { ok: 1 };
}
async function getFreeMonitoringStatus() { return { state: 'disabled', ok: 1 }; }
async function listCommands(ctx) {
  const commands = {};
  for (const n of ctx.server.commandNames()) commands[n] = { help: '', requiresAuth: true, secondaryOk: true, adminOnly: false };
  return { commands, ok: 1 };
}
async function getDefaultRWConcern() {
  return { defaultReadConcern: { level: 'local' }, defaultWriteConcern: { w: 'majority', wtimeout: 0 }, defaultReadConcernSource: 'implicit', defaultWriteConcernSource: 'implicit', ok: 1 };
}
async function setFeatureCompatibilityVersion() { return { ok: 1 }; }
async function getnonce() { return { nonce: '0000000000000000', ok: 1 }; }
async function isSelf() { return { id: new ObjectId(), ok: 1 }; }
async function fsync() { return { numFiles: 1, ok: 1 }; }
async function appendOplogNote() { return { ok: 1 }; }
async function getClusterTime(ctx) { return { ok: 1, clusterTime: ctx.server.clusterTime() }; }

module.exports = {
  hello, isMaster: hello, ismaster: hello, ping, buildInfo, buildinfo: buildInfo, getParameter, serverStatus,
  doubleStats, endSessions, killSessions: endSessions, killAllSessions, killAllSessionsByPattern: killAllSessions,
  refreshSessions, startSession, commitTransaction, abortTransaction, configureFailPoint, whatsmyuri, getCmdLineOpts,
  hostInfo, connectionStatus, replSetGetStatus, currentOp, killOp, getLog, logout, getFreeMonitoringStatus,
  listCommands, getDefaultRWConcern, setFeatureCompatibilityVersion, getnonce, _isSelf: isSelf, fsync,
  appendOplogNote, getClusterTime, replSetStepDown, replSetFreeze, replSetStepUp, doubleElectionTime, testVersion2,
};
