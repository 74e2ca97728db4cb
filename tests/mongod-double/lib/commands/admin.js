'use strict';
// Handshake and administrative commands: hello/isMaster (replica-set primary, secondary or
// standalone identity, compression negotiation, saslSupportedMechs, speculativeAuthenticate), ping,
// buildInfo, getParameter, serverStatus, session housekeeping (endSessions, killSessions,
// killAllSessions, refreshSessions, startSession), transaction end (commitTransaction,
// abortTransaction), configureFailPoint and the double's own doubleStats. Anything a driver
// only uses for diagnostics answers with a plausible minimal shape.

const { Long, Int32, ObjectId, UUID } = require('bson');
const V = require('../values');
const { err } = require('../errors');
const { sessionKey } = require('../sessions');
const { x509Login } = require('./auth');

const VERSION = '7.0.0';

async function hello(ctx) {
  const { cmd, server, conn, name } = ctx;
  const opts = server.opts;
  const r = {};
  if (cmd.helloOk !== undefined) r.helloOk = true;
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
  const isPrimary = server.role !== 'secondary';
  if (!opts.standalone) {
    r.hosts = server.hosts();
    r.setName = 'rs0';
    r.setVersion = 1;
  }
  r[legacy ? 'ismaster' : 'isWritablePrimary'] = isPrimary;
  if (!opts.standalone) {
    r.secondary = !isPrimary;
    r.primary = server.primary.address;
    r.me = me;
    if (isPrimary) r.electionId = server.electionId;
    const ot = server.clusterTime();
    const now = new Date();
    r.lastWrite = { opTime: { ts: ot, t: Long.fromNumber(1) }, lastWriteDate: now, majorityOpTime: { ts: ot, t: Long.fromNumber(1) }, majorityWriteDate: now };
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
    transactionLifetimeLimitSeconds: server.opts.txnLifetime,
    maxTransactionLockRequestTimeoutMillis: 5,
    authenticationMechanisms: ['SCRAM-SHA-1', 'SCRAM-SHA-256'],
    requireApiVersion: false,
    enableTestCommands: true,
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
  if (ctx.cmd.reset !== undefined && V.truthy(ctx.cmd.reset)) {
    for (const k of Object.keys(ctx.server.stats)) delete ctx.server.stats[k];
    ctx.server.statsByApp = {};
  }
  return { commands, byApp, ok: 1 };
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
  return ctx.server.failpoints.configure(ctx.cmd);
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
  return {
    set: 'rs0', date: new Date(), myState: ctx.server.role === 'secondary' ? 2 : 1, term: Long.fromNumber(1),
    members: ctx.server.members.map((m, i) => ({
      _id: i, name: m.address, health: 1, state: m.role === 'secondary' ? 2 : 1,
      stateStr: m.role === 'secondary' ? 'SECONDARY' : 'PRIMARY', ...(m === ctx.server ? { self: true } : {}),
    })),
    ok: 1,
  };
}

async function currentOp() { return { inprog: [], ok: 1 }; }
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
  appendOplogNote, getClusterTime,
};
