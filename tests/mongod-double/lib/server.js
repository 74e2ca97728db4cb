'use strict';
// TCP server and per-connection protocol handling: frames requests (size cap, malformed input
// closes the connection), processes each connection's requests strictly one at a time in
// arrival order, runs commands through auth, session validation and fail points, adds error
// labels, $clusterTime and operationTime, and writes (optionally compressed) replies. It does
// not implement any command itself: see commands/*.js.

const net = require('net');
const tls = require('tls');
const { Double, Long, Binary, Timestamp, ObjectId } = require('bson');
const W = require('./wire');
const V = require('./values');
const { MongoError, RETRYABLE_CODES, err } = require('./errors');
const { Store, WaitFor } = require('./storage');
const { Access } = require('./transactions');
const { Sessions, sessionKey, RETRYABLE_WRITE_COMMANDS } = require('./sessions');
const { Cursors } = require('./cursors');
const { FailPoints } = require('./failpoints');
const { Auth } = require('./auth');
const { isChangeStreamPipeline } = require('./changestreams');
const { ReplSet } = require('./replset');
const { CommitPoint } = require('./majority');
const { parseCommand } = require('./parse');
const { record } = require('./record');

const NO_COMPRESS = new Set(['hello', 'isMaster', 'ismaster', 'saslStart', 'saslContinue', 'authenticate', 'getnonce', 'createUser', 'updateUser']);
// As mongod (Command::requiresAuth() false): connectionStatus and whatsmyuri too.
const NO_AUTH_NEEDED = new Set(['hello', 'isMaster', 'ismaster', 'saslStart', 'saslContinue', 'authenticate', 'getnonce', 'ping', 'buildInfo', 'buildinfo', 'logout', 'endSessions',
  'connectionStatus', 'whatsmyuri']);
const HELLO_NAMES = new Set(['hello', 'isMaster', 'ismaster']);
// Commands that never take part in session/transaction validation.
const SESSIONLESS = new Set(['hello', 'isMaster', 'ismaster', 'saslStart', 'saslContinue', 'ping', 'buildInfo', 'buildinfo',
  'endSessions', 'killSessions', 'killAllSessions', 'killAllSessionsByPattern', 'refreshSessions', 'doubleStats']);
const NO_REPLY = Symbol('no reply');
// What a secondary runs (mongod's Command::secondaryAllowed): ALWAYS regardless of read
// preference, OPT_IN when the read preference allows a secondary (not inside a transaction),
// everything else (writes, DDL, commit/abort) never: 10107 "not primary".
const SECONDARY_ALWAYS = new Set(['hello', 'isMaster', 'ismaster', 'ping', 'buildInfo', 'buildinfo', 'getParameter',
  'serverStatus', 'saslStart', 'saslContinue', 'authenticate', 'getnonce', 'logout', 'endSessions', 'killSessions',
  'killAllSessions', 'killAllSessionsByPattern', 'refreshSessions', 'startSession', 'configureFailPoint', 'doubleStats',
  'whatsmyuri', 'getCmdLineOpts', 'hostInfo', 'connectionStatus', 'replSetGetStatus', 'currentOp', 'killOp', 'getLog',
  'getFreeMonitoringStatus', 'listCommands', 'getDefaultRWConcern', 'getMore', 'killCursors', 'fsync', 'getClusterTime',
  'replSetStepDown', 'replSetFreeze', 'replSetStepUp', 'doubleElectionTime']);
const SNAPSHOT_READS = new Set(['find', 'aggregate', 'distinct']);
// Reads served at the majority commit point with readConcern majority (or on a secondary).
const MAJORITY_READS = new Set(['find', 'aggregate', 'count', 'distinct']);
// Commands whose acknowledgement waits for their write concern (outside a transaction's
// statements): mongod waits for the client's last optime to be replicated as asked.
const WC_COMMANDS = new Set(['insert', 'update', 'delete', 'findAndModify', 'findandmodify', 'commitTransaction',
  'abortTransaction', 'create', 'drop', 'dropDatabase', 'createIndexes', 'dropIndexes', 'collMod', 'renameCollection']);
const SECONDARY_OPT_IN = new Set(['find', 'aggregate', 'count', 'distinct', 'listCollections', 'listIndexes',
  'listDatabases', 'dbStats', 'collStats', 'dataSize', 'explain']);
// WriteConflict, LockTimeout, PreparedTransactionInProgress, snapshot and stale-routing errors.
const TRANSIENT_CODES = new Set([112, 24, 267, 239, 246, 311, 317, 63, 13388, 249, 150]);
const ZERO_HASH = new Binary(Buffer.alloc(20), 0);
// mongod's NotPrimaryError and ShutdownError categories: their replies carry the member's
// topologyVersion, and a fire-and-forget (moreToCome) write failing with one closes the
// connection (the NotPrimaryError ones), so the client selects a server again.
const NOT_PRIMARY_CODES = new Set([10107, 13435, 13436, 11602, 189]);
const STATE_CHANGE_CODES = new Set([...NOT_PRIMARY_CODES, 91, 11600]);

// A certificate subject as mongod names the X.509 user: RFC 2253, most specific RDN first.
function rfc2253(subject) {
  const esc = (v) => String(v).replace(/([,+"\\<>;=])/g, '\\$1');
  return Object.entries(subject)
    .flatMap(([k, v]) => (Array.isArray(v) ? v.map((x) => [k, x]) : [[k, v]]))
    .reverse()
    .map(([k, v]) => `${k}=${esc(v)}`)
    .join(',');
}

class Connection {
  constructor(server, socket, id) {
    this.server = server;
    this.socket = socket;
    this.id = id;
    this.remote = `${socket.remoteAddress}:${socket.remotePort}`;
    this.chunks = [];
    this.buffered = 0;
    this.queue = [];
    this.busy = false;
    this.closed = false;
    this.appName = null;
    this.compression = null;
    this.handshakeDone = false;
    this.user = null;
    this.sasl = null;
    // The verified TLS client certificate's subject (RFC 2253 order), the MONGODB-X509 user.
    this.peerSubject = null;
    socket.setNoDelay(true);
    socket.on('data', (d) => this.onData(d));
    socket.on('error', (e) => this.server.log(`conn${id}: socket error: ${e.message}`));
    socket.on('close', () => {
      this.closed = true;
      this.server.conns.delete(this);
      this.server.endTopologyWaits(this);
    });
  }

  close(reason) {
    if (this.closed) return;
    if (reason) this.server.log(`conn${this.id}: closing: ${reason}`);
    this.closed = true;
    this.queue = [];
    this.socket.destroy();
  }

  onData(d) {
    if (this.closed) return;
    this.chunks.push(d);
    this.buffered += d.length;
    while (this.buffered >= 4) {
      const head = this.chunks[0].length >= 4 ? this.chunks[0] : Buffer.concat(this.chunks);
      const len = head.readInt32LE(0);
      if (len < 16 || len > W.MAX_MESSAGE_SIZE) {
        this.close(`invalid message length ${len}`);
        return;
      }
      if (this.buffered < len) break;
      const all = this.chunks.length === 1 ? this.chunks[0] : Buffer.concat(this.chunks);
      const msg = all.subarray(0, len);
      const rest = all.subarray(len);
      this.chunks = rest.length ? [rest] : [];
      this.buffered = rest.length;
      this.queue.push(Buffer.from(msg));
    }
    this.pump();
  }

  async pump() {
    if (this.busy) return;
    this.busy = true;
    try {
      while (this.queue.length && !this.closed) {
        const raw = this.queue.shift();
        await this.handle(raw);
      }
    } finally {
      this.busy = false;
    }
  }

  async handle(raw) {
    let msg;
    try {
      msg = W.parseMessage(raw);
    } catch (e) {
      this.close(`malformed message: ${e.message}`);
      return;
    }
    const server = this.server;
    let reply;
    let name;
    try {
      if (msg.opCode === W.OP_QUERY) {
        name = V.keys(msg.body)[0];
        server.count(name, this.appName, msg.body);
        if (!msg.ns.endsWith('.$cmd') || !HELLO_NAMES.has(name)) {
          reply = {
            ok: 0,
            errmsg: `Unsupported OP_QUERY command: ${name}. The client driver may require an upgrade. For more details see https://dochub.mongodb.org/core/legacy-opcode-removal`,
            code: 352, codeName: 'UnsupportedOpQueryCommand',
          };
        } else {
          reply = await server.runCommand(this, msg.body, msg.ns.slice(0, -5), name);
        }
        server.countReply(this.appName, reply);
        record(this.appName, msg.ns.split('.')[0], name, msg.body, reply, server.log);
        if (reply === NO_REPLY || this.closed) return;
        server.finishReply(reply);
        this.write(W.buildOpReply(reply, server.nextRequestId(), msg.requestID));
        return;
      }
      name = V.keys(msg.body)[0];
      server.count(name, this.appName, msg.body);
      const db = msg.body.$db;
      if (typeof db !== 'string') {
        reply = err(40571, 'OP_MSG requests require a $db argument').toReply();
      } else {
        reply = await server.runCommand(this, msg.body, db, name);
      }
    } catch (e) {
      server.log(`conn${this.id}: internal error in ${name}: ${e && e.stack}`);
      reply = err(1, `internal error: ${e && e.message}`).toReply();
    }
    server.countReply(this.appName, reply);
    record(this.appName, msg.body && msg.body.$db, name, msg.body, reply, server.log);
    if (reply === NO_REPLY || this.closed) return;
    if (msg.moreToCome) {
      // mongod (4.2+): a fire-and-forget write that failed because this member is not (or no
      // longer) primary closes the connection, the only way to tell its client.
      if (notPrimaryFailure(reply)) this.close(`not-primary error in fire-and-forget ${name}`);
      return;
    }
    // Exhaust (OP_MSG spec, mongod's service entry point): a getMore sent with exhaustAllowed
    // is answered with moreToCome while the cursor stays open; the server then runs the same
    // getMore again by itself and sends the next batch as a reply to its own previous reply,
    // until the cursor is exhausted or an error ends the stream (no moreToCome on that one).
    // An awaitable hello (topologyVersion and maxAwaitTimeMS) streams likewise: each next
    // hello waits on the topologyVersion the previous reply carried.
    let responseTo = msg.requestID;
    let body = msg.body;
    for (;;) {
      const more = msg.exhaustAllowed && (name === 'getMore' ? exhaustContinues(reply) : exhaustHello(name, body, reply));
      const requestId = server.nextRequestId();
      this.sendOpMsg(reply, requestId, responseTo, more ? W.FLAG_MORE_TO_COME : 0, name, msg.compressorId);
      if (!more || this.closed) return;
      responseTo = requestId;
      if (name !== 'getMore') body = Object.assign({}, body, { topologyVersion: reply.topologyVersion });
      try {
        reply = await server.runCommand(this, body, body.$db, name);
      } catch (e) {
        server.log(`conn${this.id}: internal error in exhaust ${name}: ${e && e.stack}`);
        reply = err(1, `internal error: ${e && e.message}`).toReply();
      }
      server.countReply(this.appName, reply);
      if (reply === NO_REPLY || this.closed) return;
    }
  }

  sendOpMsg(reply, requestId, responseTo, flags, name, compressorId) {
    const server = this.server;
    server.finishReply(reply);
    let out;
    try {
      out = W.buildOpMsg(reply, requestId, responseTo, flags);
    } catch (e) {
      server.log(`conn${this.id}: cannot encode reply to ${name}: ${e.message}`);
      out = W.buildOpMsg(server.finishReply(err(10334, `BSONObjectTooLarge: ${e.message}`).toReply()), requestId, responseTo);
    }
    if (compressorId !== undefined && !NO_COMPRESS.has(name)) out = W.compress(out, compressorId);
    this.write(out);
  }

  write(buf) {
    if (!this.closed) this.socket.write(buf);
  }
}

// An exhaust stream goes on after a successful reply whose cursor is still open.
function exhaustContinues(reply) {
  if (!reply || !V.truthy(reply.ok) || !reply.cursor || typeof reply.cursor.ns !== 'string' || !reply.cursor.ns) return false;
  const id = reply.cursor.id;
  return id !== undefined && id !== null && V.isNumeric(id) && V.toBigIntExact(id) !== 0n;
}

// A streaming (exhaust) hello goes on after each successful awaitable hello.
function exhaustHello(name, body, reply) {
  return HELLO_NAMES.has(name) && body.maxAwaitTimeMS !== undefined && !!reply && V.truthy(reply.ok) && !!reply.topologyVersion;
}

function notPrimaryFailure(reply) {
  if (!reply) return false;
  if (!V.truthy(reply.ok) && NOT_PRIMARY_CODES.has(V.toNumber(reply.code))) return true;
  return Array.isArray(reply.writeErrors) && reply.writeErrors.some((w) => NOT_PRIMARY_CODES.has(V.toNumber(w.code)));
}

function sleep(ms) { return new Promise((r) => setTimeout(r, ms)); }

function labelsFor(code, body, name, wce) {
  const has = (f) => Object.prototype.hasOwnProperty.call(body, f);
  const labels = [];
  const isEnd = name === 'commitTransaction' || name === 'abortTransaction';
  const inTxn = has('txnNumber') && has('autocommit');
  const retryableWrite = has('txnNumber') && !has('autocommit') && RETRYABLE_WRITE_COMMANDS.has(name);
  if (code !== undefined && code !== null) {
    if (inTxn) {
      if (TRANSIENT_CODES.has(code)) labels.push('TransientTransactionError');
      else if (code === 251 && !(isEnd && wce)) labels.push('TransientTransactionError');
      else if (RETRYABLE_CODES.has(code) && !isEnd) labels.push('TransientTransactionError');
    }
    if ((retryableWrite || isEnd) && RETRYABLE_CODES.has(code)) labels.push('RetryableWriteError');
  }
  if (wce && (retryableWrite || isEnd) && RETRYABLE_CODES.has(V.toNumber(wce.code)) && !labels.includes('RetryableWriteError')) {
    labels.push('RetryableWriteError');
  }
  return labels;
}

// mongod's change stream labels: a retryable error of an aggregate opening a change stream, or
// of the getMore of a change stream cursor once the cursor was checked out (a failCommand on
// getMore fires before that, so it gets none), is resumable; ChangeStreamFatalError and
// ChangeStreamHistoryLost are not.
function changeStreamLabels(code, body, name, ctx) {
  if (code === 280 || code === 286) return ['NonResumableChangeStreamError'];
  const stream = name === 'getMore' ? !!ctx.changeStream : name === 'aggregate' && isChangeStreamPipeline(body.pipeline);
  return stream && RETRYABLE_CODES.has(code) ? ['ResumableChangeStreamError'] : [];
}

// The set cannot satisfy a numeric w above its number of data-bearing members and knows no
// custom modes; like mongod it performs the write and reports the problem as a
// writeConcernError.
function writeConcernProblem(wc, members) {
  const w = wc.w;
  if (w === undefined) return null;
  if (V.isNumeric(w) && V.toNumber(w) > members) {
    return { code: 100, codeName: 'UnsatisfiableWriteConcern', errmsg: 'Not enough data-bearing nodes' };
  }
  if (typeof w === 'string' && w !== 'majority') {
    return { code: 79, codeName: 'UnknownReplWriteConcern', errmsg: `No write concern mode named '${w}' found in replica set configuration` };
  }
  return null;
}

// One member of the set (or the standalone). The second member is made with `new
// Server(opts, first)`: it shares the first one's data, sessions, user, clock and replica set
// state (zero replication lag) and has its own listener, connections, cursors, fail points,
// command counts and topologyVersion, as each mongod has. The first member starts as primary;
// `role` ('primary', 'secondary', 'standalone') changes with elections (replset.js).
class Server {
  constructor(opts, first = null) {
    this.opts = Object.assign({ host: '127.0.0.1', port: 0, standalone: false, maxWireVersion: 21, txnLifetime: 60 }, opts);
    this.role = this.opts.standalone ? 'standalone' : 'primary';
    this.log = (m) => process.stderr.write(`[mongod-double] ${new Date().toISOString()} ${first ? '(member 1) ' : ''}${m}\n`);
    this.cursors = new Cursors();
    // topologyVersion: a processId per member and a counter that goes up with every change of
    // what its hello says; awaitable hellos wait in topoWaiters for the next change.
    this.processId = new ObjectId();
    this.tvCounter = 0n;
    this.topoWaiters = new Set();
    this.stepDownUntil = 0; // not electable before (ms): step-down and freeze periods
    this.inflight = new Set(); // contexts of writes and transaction statements running here
    if (first) {
      this.owner = first;
      this.store = first.store;
      this.sessions = first.sessions;
      this.auth = first.auth;
      this.members = first.members;
      this.set = first.set;
      this.set.add(this);
    } else {
      this.owner = this;
      this.set = new ReplSet(this.log);
      this.members = this.set.members;
      if (!this.opts.standalone) this.set.add(this);
      else this.members.push(this);
      this.store = new Store();
      if (this.opts.oplogEntries) this.store.changes.capacity = this.opts.oplogEntries;
      if (!this.opts.standalone) {
        // The majority commit point (majority.js): where the secondary is.
        const cp = new CommitPoint(this.store, this.opts.majorityLagMs || 0);
        cp.stopped = () => this.members.some((m) => m.role === 'secondary' && m.failpoints.points.has('stopReplProducer'));
        this.store.commit = cp;
        this.store.changes.visibleTs = () => this.store.majorityTs();
      }
      this.sessions = new Sessions(this.store, this.opts);
      this.sessions.onReap = (now) => { for (const m of this.members) m.cursors.reap(now); };
      this.auth = this.opts.auth ? new Auth(this.opts.auth) : null;
    }
    this.failpoints = new FailPoints(this.log);
    this.stats = {};
    this.conns = new Set();
    this.totalConns = 0;
    this.requestId = 1;
    this.startedAt = Date.now();
    this.bootSecs = first ? first.bootSecs : Math.floor(Date.now() / 1000);
    this.commands = new Map();
    for (const mod of ['admin', 'crud', 'mapreduce', 'ddl', 'auth']) {
      const m = require(`./commands/${mod}`);
      for (const [k, fn] of Object.entries(m)) if (typeof fn === 'function' && !k.startsWith('_')) this.commands.set(k, fn);
    }
  }

  commandNames() { return [...this.commands.keys()]; }

  // The set's members' addresses in configuration order (the primary first).
  hosts() { return this.members.map((m) => m.address); }

  nextRequestId() {
    this.requestId = (this.requestId + 1) & 0x7fffffff;
    return this.requestId;
  }

  // Commands by name, and by the connection's appName (doubleStats), so a
  // benchmark can count one client's commands apart from the others'.
  count(name, appName, body) {
    if (typeof name !== 'string') return;
    this.stats[name] = (this.stats[name] || 0) + 1;
    if (typeof appName === 'string') {
      if (!this.statsByApp) this.statsByApp = {};
      const a = this.statsByApp[appName] || (this.statsByApp[appName] = {});
      a[name] = (a[name] || 0) + 1;
    }
    if (process.env.DOUBLE_TRACE && body) {
      // DOUBLE_TRACE=FILE: one line per command (diagnostics only).
      require('fs').appendFileSync(process.env.DOUBLE_TRACE,
        `${Date.now()} ${appName || '-'} ${name} ${typeof body[name] === 'string' ? body[name] : ''}\n`);
    }
  }

  // parseCommand, with a log line for each refusal (the integration harness shows those of
  // the proxy's own connections when it fails a test file for them).
  parse(conn, body, name) {
    try {
      parseCommand(body, name);
    } catch (e) {
      if (e instanceof MongoError) {
        this.log(`conn${conn.id}${typeof conn.appName === 'string' ? ` (${conn.appName})` : ''}: refused ${name}: ${e.code} ${e.errmsg}`);
      }
      throw e;
    }
  }

  // Error replies by code, in total and by the connection's appName (doubleStats), so a test
  // harness finds the commands of a client that the server refused.
  countReply(appName, reply) {
    if (!reply || reply === NO_REPLY || V.truthy(reply.ok) || reply.code === undefined) return;
    const code = String(V.toNumber(reply.code));
    const e = this.errorStats || (this.errorStats = { byCode: {}, byApp: {} });
    e.byCode[code] = (e.byCode[code] || 0) + 1;
    if (typeof appName === 'string') {
      const a = e.byApp[appName] || (e.byApp[appName] = {});
      a[code] = (a[code] || 0) + 1;
    }
  }

  clusterTime() { return new Timestamp({ t: this.bootSecs, i: this.store.clock + 1 }); }

  finishReply(reply) {
    if (reply.ok !== undefined && typeof reply.ok === 'number') reply.ok = new Double(reply.ok);
    if (!this.opts.standalone) {
      const ct = this.clusterTime();
      reply.$clusterTime = { clusterTime: ct, signature: { hash: ZERO_HASH, keyId: Long.fromNumber(0) } };
      reply.operationTime = ct;
    }
    return reply;
  }

  listen() {
    return new Promise((resolve, reject) => {
      const accept = (socket) => {
        const t = this.opts.tls;
        let subject = null;
        if (t && t.ca) {
          // As mongod: a certificate is requested; one that does not verify is refused even
          // when connections without one are allowed. Each connection logs what it presented.
          const cert = socket.getPeerCertificate();
          const presented = !!(cert && cert.subject);
          const where = `${socket.remoteAddress}:${socket.remotePort}`;
          if (presented && !socket.authorized) {
            this.log(`TLS connection from ${where} refused: client certificate does not verify: ${socket.authorizationError}`);
            socket.destroy();
            return;
          }
          if (presented) subject = rfc2253(cert.subject);
          this.log(`TLS connection from ${where}: ${presented ? `client certificate "${subject}"` : 'no client certificate'}`);
        }
        const c = new Connection(this, socket, ++this.totalConns);
        c.peerSubject = subject;
        this.conns.add(c);
      };
      if (this.opts.tls) {
        // TLS-only listener; with a CA file, client certificates are requested and verified, and
        // required unless --tls-allow-connections-without-certificates.
        const t = this.opts.tls;
        this.tcp = tls.createServer({
          cert: t.cert, key: t.key, ca: t.ca || undefined,
          requestCert: !!t.ca, rejectUnauthorized: !!t.ca && !t.allowNoCert,
        }, accept);
        this.tcp.on('tlsClientError', (e, socket) => {
          this.log(`TLS handshake with ${socket && socket.remoteAddress}:${socket && socket.remotePort} failed: ${e.message}`);
        });
      } else {
        this.tcp = net.createServer(accept);
      }
      this.tcp.on('error', reject);
      this.tcp.listen(this.opts.port, this.opts.host, () => {
        this.port = this.tcp.address().port;
        this.address = `${this.opts.host}:${this.port}`;
        resolve(this.port);
      });
    });
  }

  topologyVersion() { return { processId: this.processId, counter: Long.fromBigInt(this.tvCounter) }; }

  topologyChanged() {
    this.tvCounter += 1n;
    for (const w of [...this.topoWaiters]) w.done();
  }

  // An awaitable hello waits here for the next topology change, at most `ms`, or until its
  // connection closes.
  awaitTopologyChange(conn, ms) {
    return new Promise((resolve) => {
      const w = {
        conn,
        done: () => {
          clearTimeout(w.timer);
          this.topoWaiters.delete(w);
          resolve();
        },
      };
      w.timer = setTimeout(w.done, ms);
      this.topoWaiters.add(w);
    });
  }

  endTopologyWaits(conn) {
    for (const w of [...this.topoWaiters]) if (!conn || w.conn === conn) w.done();
  }

  // Step-down: what runs here and writes (or runs in a transaction) fails with 11602.
  interruptInProgress() {
    for (const ctx of this.inflight) {
      if (ctx.interrupted) continue;
      ctx.interrupted = err(11602, 'operation was interrupted');
      ctx.wakeInterrupted();
    }
  }

  stop() {
    this.endTopologyWaits(null);
    if (this.owner === this) {
      this.sessions.stop();
      this.set.stop();
    }
    // The listener first, as a stopping mongod: a client that sees its connection dropped and
    // connects again is refused, never accepted by a listener about to go.
    const closed = new Promise((resolve) => (this.tcp ? this.tcp.close(() => resolve()) : resolve()));
    for (const c of this.conns) c.socket.destroy();
    this.conns.clear();
    return closed;
  }

  async runCommand(conn, body, db, name) {
    const has = (f) => Object.prototype.hasOwnProperty.call(body, f);
    const ctx = {
      server: this, conn, cmd: body, name, db, store: this.store, sessions: this.sessions, cursors: this.cursors,
      access: null, sctx: null, sessionKey: has('lsid') ? sessionKey(body.lsid) : null,
      abortTxnAfterReply: false, closeAfter: false, interrupted: null, interruptWait: null, wakeInterrupted: () => {},
    };
    try {
      return await this.runCommandIn(ctx, conn, body, db, name);
    } finally {
      this.inflight.delete(ctx);
    }
  }

  async runCommandIn(ctx, conn, body, db, name) {
    const has = (f) => Object.prototype.hasOwnProperty.call(body, f);
    const handler = this.commands.get(name);
    const deadline = has('maxTimeMS') && V.toNumber(body.maxTimeMS) > 0 ? Date.now() + V.toNumber(body.maxTimeMS) : null;
    // Waits for a transaction holding what we want to write, within the command's maxTimeMS.
    // The wait also ends when our own transaction is aborted meanwhile (the reaper: 290).
    ctx.waitTxn = async (txn) => {
      const left = deadline === null ? null : deadline - Date.now();
      if (left !== null && left <= 0) throw err(50, 'operation exceeded time limit');
      const own = ctx.access && ctx.access.txn;
      let timer;
      const waits = [txn.done];
      if (left !== null) waits.push(new Promise((r) => { timer = setTimeout(() => r('timeout'), left); }));
      if (own) waits.push(own.done);
      if (ctx.interruptWait) waits.push(ctx.interruptWait);
      const res = await Promise.race(waits);
      clearTimeout(timer);
      if (own) own.checkAlive();
      if (ctx.interrupted) throw ctx.interrupted;
      if (res === 'timeout') throw err(50, 'operation exceeded time limit');
    };
    ctx.retryOnWait = async (fn) => {
      for (;;) {
        try {
          return fn();
        } catch (e) {
          if (!(e instanceof WaitFor)) throw e;
          await ctx.waitTxn(e.txn);
        }
      }
    };
    ctx.txnWriteFailpoint = () => {
      if (!ctx.sctx || !ctx.sctx.retryable) return;
      const d = this.failpoints.transactionalWrite();
      if (!d) return;
      if (d.closeConnection === undefined || V.truthy(d.closeConnection)) ctx.closeAfter = true;
      if (d.failBeforeCommitExceptionCode !== undefined) {
        throw err(V.toNumber(d.failBeforeCommitExceptionCode), 'Failing write via onPrimaryTransactionalWrite fail point');
      }
    };
    const isEnd = name === 'commitTransaction' || name === 'abortTransaction';
    let wce = null;
    let explicitLabels = null;
    let reply;
    try {
      if (!handler) throw err(59, `no such command: '${name}'`);
      if (this.auth && !conn.user && !NO_AUTH_NEEDED.has(name)) throw err(13, `command ${name} requires authentication`);
      // As mongod: parsed whole (IDL structs, generic arguments) before anything of it runs.
      this.parse(conn, body, name);
      checkApiParameters(body, name);
      if (this.role === 'secondary') this.checkSecondary(body, name);
      else if (this.role === 'primary' && (has('autocommit') || (!SECONDARY_ALWAYS.has(name) && !SECONDARY_OPT_IN.has(name)))) {
        // A write or transaction statement: a step-down while it runs interrupts it (11602).
        ctx.interruptWait = new Promise((r) => { ctx.wakeInterrupted = r; });
        this.inflight.add(ctx);
      }
      if (!SESSIONLESS.has(name)) {
        ctx.sctx = this.sessions.begin(body, name, db);
        if (ctx.sctx.inTxn && has('writeConcern') && name !== 'commitTransaction' && name !== 'abortTransaction') {
          throw err(72, 'writeConcern is not allowed within a multi-statement transaction');
        }
        // Snapshot reads outside a transaction (mongod 5.0+): find, aggregate and distinct only.
        if (!ctx.sctx.inTxn && body.readConcern && typeof body.readConcern === 'object' && body.readConcern.level === 'snapshot' &&
            !SNAPSHOT_READS.has(name)) {
          throw err(72, `Command ${name} does not support { readConcern: { level: "snapshot" } } :: caused by :: read concern not supported`);
        }
      }
      // Errors injected by failCommand leave an open transaction alone (a real 7.0 primary
      // evaluates the fail point before the command runs in the transaction).
      // mongod 4.4.7 and later (SERVER-49336) take a connection's client metadata from its first
      // hello before the failCommand fail point is evaluated: a fail point filtered by appName
      // fires on the very hello that names the application.
      if (HELLO_NAMES.has(name) && !conn.handshakeDone && conn.appName === null) {
        const app = body.client && body.client.application && body.client.application.name;
        if (typeof app === 'string') conn.appName = app;
      }
      const fp = name === 'configureFailPoint' ? null : this.failpoints.failCommand(name, conn.appName);
      if (fp) {
        if (V.truthy(fp.blockConnection)) {
          // A statement of a transaction the reaper aborts while it is blocked gets 290.
          const own = ctx.sctx && ctx.sctx.txn && ctx.sctx.txn.state === 'inProgress' && !isEnd ? ctx.sctx.txn : null;
          // As mongod's interruptible sleep: the command's maxTimeMS deadline (set before the
          // fail point is evaluated) ends the block with 50 MaxTimeMSExpired. On a getMore,
          // maxTimeMS is the await time of a tailable cursor, not a deadline.
          const ms = V.toNumber(fp.blockTimeMS) || 0;
          const waits = [sleep(ms)];
          let expired = false;
          let timer;
          if (deadline !== null && name !== 'getMore') {
            waits.push(new Promise((r) => { timer = setTimeout(() => { expired = true; r(); }, Math.max(0, deadline - Date.now())); }));
          }
          if (own) waits.push(own.done);
          if (ctx.interruptWait) waits.push(ctx.interruptWait);
          await Promise.race(waits);
          clearTimeout(timer);
          if (own) own.checkAlive();
          if (ctx.interrupted) throw ctx.interrupted;
          if (expired) throw err(50, 'operation exceeded time limit');
        }
        if (V.truthy(fp.closeConnection)) {
          conn.close();
          return NO_REPLY;
        }
        if (fp.errorCode !== undefined) {
          const e = err(V.toNumber(fp.errorCode), "Failing command via 'failCommand' failpoint");
          if (Array.isArray(fp.errorLabels)) explicitLabels = fp.errorLabels;
          throw e;
        }
        if (fp.writeConcernError) {
          wce = fp.writeConcernError;
          if (Array.isArray(fp.errorLabels)) explicitLabels = fp.errorLabels;
        }
      }
      const wc = has('writeConcern') && body.writeConcern && typeof body.writeConcern === 'object' ? body.writeConcern : null;
      if (wc && this.opts.standalone && wc.w !== undefined && V.isNumeric(wc.w) && V.toNumber(wc.w) > 1) {
        throw err(2, "cannot use 'w' > 1 with a standalone");
      }
      ctx.started = true; // errors from here on end an open transaction
      if (ctx.sctx && ctx.sctx.replay) {
        reply = Object.assign({}, ctx.sctx.replay);
      } else {
        const txn = ctx.sctx && ctx.sctx.txn && ctx.sctx.txn.state === 'inProgress' ? ctx.sctx.txn : null;
        ctx.retryStmts = ctx.sctx && ctx.sctx.retryable ? ctx.sctx.session.retryStmts : null;
        // A router's part of a client's batch names its statements by their place in that
        // batch (stmtIds, as mongos sends them), so a retried batch split again the same way
        // finds what already ran here.
        ctx.stmtId = (i) => (Array.isArray(body.stmtIds) && body.stmtIds[i] !== undefined ? V.toNumber(body.stmtIds[i]) : i);
        if (!txn) await this.majorityWaitAfter(body, ctx);
        ctx.access = new Access(this.store, txn || this.snapshotView(body, name, ctx) || this.majorityView(body, name));
        reply = await handler(ctx);
        if (ctx.atClusterTime && reply && V.truthy(reply.ok)) {
          // The driver's snapshot session reads its next statements at this time (find and
          // aggregate: in the cursor, distinct: at the top).
          if (reply.cursor) reply.cursor.atClusterTime = ctx.atClusterTime;
          else reply.atClusterTime = ctx.atClusterTime;
        }
        if (ctx.abortTxnAfterReply && txn) txn.abort('statement failed');
        // Only a fully successful result is remembered: failed statements run again on retry.
        if (ctx.sctx && ctx.sctx.retryable && ctx.sctx.session.txnNumber === ctx.sctx.txnNumber && !reply.writeErrors) {
          ctx.sctx.session.retryReply = Object.assign({}, reply);
          ctx.sctx.session.retryTs = this.store.clock; // a rollback below it forgets the reply
        }
      }
      if (!wce && wc && !this.opts.standalone && reply.ok) wce = writeConcernProblem(wc, this.members.length);
      if (!wce && reply.ok && WC_COMMANDS.has(name) && !(ctx.sctx && ctx.sctx.inTxn && !isEnd)) {
        wce = await this.awaitReplication(wc, ctx);
      }
      if (wce) {
        reply.writeConcernError = wce;
        const labels = explicitLabels || labelsFor(null, body, name, wce);
        if (labels.length) reply.errorLabels = labels;
        if (!this.opts.standalone && STATE_CHANGE_CODES.has(V.toNumber(wce.code))) reply.topologyVersion = this.topologyVersion();
      }
    } catch (e0) {
      let e = e0;
      if (e instanceof WaitFor) e = err(50, 'operation exceeded time limit');
      if (!(e instanceof MongoError)) {
        this.log(`internal error in ${name}: ${e && e.stack}`);
        e = err(1, `internal error: ${e && e.message}`);
      }
      const s = ctx.sctx;
      if (ctx.started && s && s.txn && s.txn.state === 'inProgress' && name !== 'commitTransaction' && name !== 'abortTransaction') {
        s.txn.abort('statement failed');
      }
      if (explicitLabels) e.errorLabels = explicitLabels;
      else e.errorLabels = labelsFor(e.code, body, name, null).concat(changeStreamLabels(e.code, body, name, ctx));
      reply = e.toReply();
      if (STATE_CHANGE_CODES.has(e.code)) reply.topologyVersion = this.topologyVersion();
    }
    if (ctx.closeAfter) {
      conn.close();
      return NO_REPLY;
    }
    return reply;
  }

  // A snapshot read outside a transaction (readConcern {level: "snapshot"}, find, aggregate
  // and distinct): a read-only view of the data as of `atClusterTime`, or of now without it.
  snapshotView(body, name, ctx) {
    const rc = body.readConcern;
    if (!rc || typeof rc !== 'object' || rc.level !== 'snapshot' || !SNAPSHOT_READS.has(name) || this.opts.standalone) return null;
    let want = null;
    if (rc.atClusterTime !== undefined) {
      const t = rc.atClusterTime;
      if (V.bsonTag(t) !== 'timestamp') throw err(14, "BSON field 'readConcern.atClusterTime' is the wrong type, expected type 'timestamp'");
      const now = this.clusterTime();
      if (t.t > now.t || (t.t === now.t && t.i > now.i)) {
        throw err(72, `readConcern atClusterTime value ${t.t}:${t.i} must not be greater than the current clusterTime ${now.t}:${now.i}`);
      }
      want = t.t < this.bootSecs ? -1 : t.i - 1;
    }
    const at = want === -1 ? null : this.store.pinSnapshot(want);
    if (at === null) {
      throw err(239, `Read timestamp ${rc.atClusterTime.t}:${rc.atClusterTime.i} is older than the oldest available timestamp.`);
    }
    ctx.atClusterTime = new Timestamp({ t: this.bootSecs, i: at + 1 });
    return {
      snapshotTs: at, writes: new Map(), newColls: new Map(), state: 'inProgress', readOnly: true,
      ownWrite: () => undefined, checkAlive: () => {},
    };
  }

  // A read at the majority commit point, while it is behind the clock (majority.js): with
  // readConcern majority, or any read on the secondary (which holds no more than that).
  // Otherwise null: the read sees the latest committed data.
  majorityView(body, name) {
    const cp = this.store.commit;
    if (!cp || !cp.lagging() || !MAJORITY_READS.has(name)) return null;
    const rc = body.readConcern;
    const majority = rc && typeof rc === 'object' && rc.level === 'majority';
    if (!majority && this.role !== 'secondary') return null;
    if (name === 'aggregate' && Array.isArray(body.pipeline) &&
        body.pipeline.some((st) => st && typeof st === 'object' && (st.$out !== undefined || st.$merge !== undefined))) return null;
    return {
      snapshotTs: cp.point, writes: new Map(), newColls: new Map(), state: 'inProgress', readOnly: true,
      ownWrite: () => undefined, checkAlive: () => {},
    };
  }

  // readConcern {level: "majority", afterClusterTime: T}: waits until the commit point
  // reaches T (mongod's waitForReadConcern), within maxTimeMS (50 MaxTimeMSExpired).
  async majorityWaitAfter(body, ctx) {
    const cp = this.store.commit;
    const rc = body.readConcern;
    if (!cp || !cp.lagging() || !rc || typeof rc !== 'object' || rc.level !== 'majority') return;
    const t = rc.afterClusterTime;
    if (!t || V.bsonTag(t) !== 'timestamp' || t.t !== this.bootSecs) return;
    const ms = V.toNumber(body.maxTimeMS) > 0 ? V.toNumber(body.maxTimeMS) : null;
    if ((await cp.waitFor(t.i - 1, ms, null)) === 'timeout') throw err(50, 'operation exceeded time limit');
  }

  // The wait of a write's acknowledgement for its write concern: w "majority" (also the
  // implicit default of 7.0, when the command names no w) or a number above 1 waits until the
  // commit point reaches the newest write; with wtimeout, 64 WriteConcernFailed when it does
  // not in time; a step-down meanwhile, 189 PrimarySteppedDown. Returns the writeConcernError
  // or null. Nothing waits while the commit point follows the clock.
  async awaitReplication(wc, ctx) {
    const cp = this.store.commit;
    if (!cp || cp.ts >= this.store.clock) return null;
    const w = wc ? wc.w : undefined;
    if (w !== undefined && w !== 'majority' && !(V.isNumeric(w) && V.toNumber(w) > 1)) return null;
    const wt = wc && V.isNumeric(wc.wtimeout) && V.toNumber(wc.wtimeout) > 0 ? V.toNumber(wc.wtimeout) : null;
    const r = await cp.waitFor(this.store.clock, wt, ctx.interruptWait || null);
    if (r === 'timeout') {
      return { code: 64, codeName: 'WriteConcernFailed', errmsg: 'waiting for replication timed out', errInfo: { wtimeout: true } };
    }
    if (r !== 'ok') return { code: 189, codeName: 'PrimarySteppedDown', errmsg: 'Primary stepped down while waiting for replication' };
    return null;
  }

  // mongod's dispatch check on a secondary (commandCanRunHere): transactions run on the
  // primary only; reads need a read preference other than primary ($readPreference; OP_MSG
  // without it means primary), else 13435; writes, DDL and everything else get 10107.
  checkSecondary(body, name) {
    const inTxn = Object.prototype.hasOwnProperty.call(body, 'autocommit');
    if (inTxn) throw err(10107, 'not primary');
    if (SECONDARY_ALWAYS.has(name)) return;
    if (SECONDARY_OPT_IN.has(name)) {
      if (readPrefAllowsSecondary(body.$readPreference)) return;
      throw err(13435, 'not primary and secondaryOk=false');
    }
    throw err(10107, 'not primary');
  }
}

// The Stable API's version 1 commands (mongod 7.0); with apiStrict: true any other command
// fails with 323 APIStrictError.
const API_V1 = new Set(['abortTransaction', 'aggregate', 'authenticate', 'collMod', 'commitTransaction', 'count', 'create',
  'createIndexes', 'delete', 'drop', 'dropDatabase', 'dropIndexes', 'endSessions', 'explain', 'find', 'findAndModify',
  'getMore', 'hello', 'insert', 'killCursors', 'listCollections', 'listDatabases', 'listIndexes', 'ping',
  'refreshSessions', 'saslContinue', 'saslStart', 'update']);

// mongod's checks of the API parameters (apiVersion, apiStrict, apiDeprecationErrors).
function checkApiParameters(body, name) {
  const has = (f) => Object.prototype.hasOwnProperty.call(body, f);
  if (!has('apiVersion')) {
    if (has('apiStrict') || has('apiDeprecationErrors')) {
      throw err(4886600, 'Provided apiStrict and/or apiDeprecationErrors without passing apiVersion');
    }
    return;
  }
  if (typeof body.apiVersion !== 'string') {
    throw err(14, `BSON field 'apiVersion' is the wrong type '${V.bsonTag(body.apiVersion)}', expected type 'string'`);
  }
  for (const f of ['apiStrict', 'apiDeprecationErrors']) {
    if (has(f) && typeof body[f] !== 'boolean') {
      throw err(14, `BSON field '${f}' is the wrong type '${V.bsonTag(body[f])}', expected type 'bool'`);
    }
  }
  if (body.apiVersion !== '1') throw err(322, 'API version must be "1"');
  if (body.apiStrict === true && !API_V1.has(name)) {
    throw err(323, `Provided apiStrict:true, but the command ${name} is not in API Version 1. Information on supported ` +
      'commands and migrations in API Version 1 can be found at https://dochub.mongodb.org/core/manual-versioned-api');
  }
  if (body.apiStrict === true && name === 'aggregate') checkStrictStages(body.pipeline);
}

// Aggregation stages outside API version 1 (mongod's AllowedWithApiStrict::kNeverInVersion1):
// with apiStrict they fail with 323, also inside $facet, $lookup and $unionWith pipelines. So a
// database aggregate ($currentOp, $listLocalSessions) is not run under strict API version 1.
const STAGES_NOT_IN_V1 = new Set(['$currentOp', '$listLocalSessions', '$listSessions', '$indexStats', '$planCacheStats',
  '$search', '$searchMeta', '$vectorSearch', '$listSearchIndexes', '$listCatalog', '$shardedDataDistribution']);

function checkStrictStages(pipeline) {
  if (!Array.isArray(pipeline)) return;
  for (const st of pipeline) {
    if (!st || typeof st !== 'object') continue;
    const stage = V.keys(st)[0];
    // $collStats is in version 1 for its count only.
    const collStatsBeyondCount = stage === '$collStats' && st.$collStats && typeof st.$collStats === 'object' &&
      V.keys(st.$collStats).some((k) => k !== 'count');
    if (STAGES_NOT_IN_V1.has(stage) || collStatsBeyondCount) {
      throw err(323, `${stage} is not allowed with 'apiStrict: true' in API Version 1`);
    }
    const inner = st[stage];
    if (stage === '$facet' && inner && typeof inner === 'object') for (const k of V.keys(inner)) checkStrictStages(inner[k]);
    if ((stage === '$lookup' || stage === '$unionWith') && inner && typeof inner === 'object') checkStrictStages(inner.pipeline);
  }
}

function readPrefAllowsSecondary(rp) {
  if (!rp || typeof rp !== 'object') return false;
  const mode = rp.mode;
  return typeof mode === 'string' && mode !== 'primary';
}

module.exports = { Server, NO_REPLY, labelsFor, checkApiParameters, changeStreamLabels };
