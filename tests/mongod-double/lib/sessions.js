'use strict';
// Logical sessions: validation of lsid/txnNumber/autocommit/startTransaction, the transaction
// state machine (codes per the reference table), retryable-write result memory, and the
// lifetime reaper. It decides which Txn a command runs in; reading and writing data is in
// transactions.js.

const V = require('./values');
const { err } = require('./errors');
const { Txn } = require('./transactions');

const RETRYABLE_WRITE_COMMANDS = new Set(['insert', 'update', 'delete', 'findAndModify', 'findandmodify', 'bulkWrite']);
// What may run inside a multi-document transaction.
const TXN_COMMANDS = new Set([
  'find', 'getMore', 'killCursors', 'insert', 'update', 'delete', 'findAndModify', 'findandmodify', 'aggregate',
  'distinct', 'commitTransaction', 'abortTransaction', 'create', 'createIndexes', 'bulkWrite', 'prepareTransaction',
  'geoSearch', 'doubleStats', 'configureFailPoint',
]);

const SESSION_TIMEOUT_MS = 30 * 60 * 1000;

function sessionKey(lsid) {
  const id = lsid && lsid.id;
  if (!id || id._bsontype !== 'Binary') return null;
  return Buffer.from(id.buffer.subarray(0, id.position)).toString('hex');
}

function toBig(v) {
  if (v === undefined || v === null) return null;
  if (typeof v === 'bigint') return v;
  const b = V.toBigIntExact(v);
  return b === null ? BigInt(Math.trunc(V.toNumber(v))) : b;
}

class Session {
  constructor(key, lsid) {
    this.key = key;
    this.lsid = lsid;
    this.lastUse = Date.now();
    this.txnNumber = -1n; // highest number seen
    this.kind = null; // 'txn' | 'retryable' for txnNumber
    this.txn = null; // Txn for txnNumber when kind === 'txn'
    this.retryReply = null; // stored reply of the retryable write at txnNumber
    this.retryStmts = new Map(); // statement index -> its result, for partially failed batches
  }
}

class Sessions {
  constructor(store, opts) {
    this.store = store;
    this.sessions = new Map();
    this.standalone = !!opts.standalone;
    this.lifetimeMs = (opts.txnLifetime || 60) * 1000;
    this.reaper = setInterval(() => this.reap(), Math.min(1000, this.lifetimeMs / 2));
    this.reaper.unref();
  }

  stop() { clearInterval(this.reaper); }

  // The writes above ts were rolled back: a retryable write or a commit made there is
  // forgotten, as its session record went with it (a retry runs the write again; a retried
  // commit finds no transaction).
  rolledBack(ts) {
    for (const s of this.sessions.values()) {
      if (s.retryTs !== undefined && s.retryTs > ts) {
        s.retryReply = null;
        s.retryStmts = new Map();
        s.retryTs = undefined;
      }
      if (s.txn && s.txn.state === 'committed' && s.txn.commitTs > ts) {
        s.txn.state = 'aborted';
        s.txn.abortReason = 'rollback';
      }
    }
  }

  get(lsid, create) {
    const key = sessionKey(lsid);
    if (!key) return null;
    let s = this.sessions.get(key);
    if (!s && create) {
      s = new Session(key, lsid);
      this.sessions.set(key, s);
    }
    if (s) s.lastUse = Date.now();
    return s;
  }

  reap() {
    const now = Date.now();
    for (const [k, s] of this.sessions) {
      if (s.txn && s.txn.state === 'inProgress' && now - s.txn.startedAt > this.lifetimeMs) s.txn.abort('expired');
      // logicalSessionTimeoutMinutes: idle sessions are forgotten like mongod's session reaper does.
      if (now - s.lastUse > SESSION_TIMEOUT_MS && (!s.txn || s.txn.state !== 'inProgress')) this.sessions.delete(k);
    }
    if (this.onReap) this.onReap(now);
  }

  end(lsid) {
    const s = this.get(lsid, false);
    if (!s) return;
    if (s.txn) s.txn.abort('killed');
    this.sessions.delete(s.key);
  }

  kill(lsid) {
    const s = this.get(lsid, false);
    if (s && s.txn) s.txn.abort('killed');
  }

  killAll() {
    for (const s of this.sessions.values()) if (s.txn) s.txn.abort('killed');
  }

  // Decides the session context of a command. Returns {session, txn, retryable, replay,
  // inTxn, txnNumber} or throws the error mongod would answer with.
  begin(cmd, name, db) {
    const has = (f) => Object.prototype.hasOwnProperty.call(cmd, f);
    const ctx = { session: null, txn: null, retryable: false, replay: null, inTxn: false, txnNumber: null, commitAgain: false };
    // A null lsid is no lsid, as mongod's parser reads it (parse.js checked the rest).
    if (!has('lsid') || cmd.lsid === null) {
      if (has('txnNumber')) {
        if (this.standalone) throw err(20, 'Transaction numbers are only allowed on a replica set member or mongos');
        throw err(72, 'Transaction number requires a session ID to also be specified');
      }
      if (has('autocommit')) throw err(72, "'autocommit' field requires a transaction number to also be specified");
      if (has('startTransaction')) throw err(72, "'startTransaction' field requires 'autocommit' field to also be specified");
      return ctx;
    }
    const session = this.get(cmd.lsid, true);
    ctx.session = session;
    if (!has('txnNumber')) {
      if (has('autocommit')) throw err(72, "'autocommit' field requires a transaction number to also be specified");
      if (has('startTransaction')) throw err(72, "'startTransaction' field requires 'autocommit' field to also be specified");
      return ctx;
    }
    if (this.standalone) throw err(20, 'Transaction numbers are only allowed on a replica set member or mongos');
    const n = toBig(cmd.txnNumber);
    ctx.txnNumber = n;
    if (!has('autocommit')) {
      if (has('startTransaction')) throw err(72, "'startTransaction' field requires 'autocommit' field to also be specified");
      if (!RETRYABLE_WRITE_COMMANDS.has(name)) {
        throw err(50768, `txnNumber may only be provided for multi-document transactions and retryable write commands. autocommit:false was not provided, and ${name} is not a retryable write command.`);
      }
      if (n < session.txnNumber) throw tooOld(n, session);
      if (n === session.txnNumber) {
        if (session.kind === 'txn') {
          throw err(217, `Incomplete history detected for transaction ${n} on session ${session.key}`);
        }
        // A router's part (stmtIds) replays statement by statement: the stored reply is of
        // another part of the batch.
        if (!Array.isArray(cmd.stmtIds)) ctx.replay = session.retryReply;
      } else {
        if (session.txn) session.txn.abort('superseded');
        session.txnNumber = n;
        session.kind = 'retryable';
        session.txn = null;
        session.retryReply = null;
        session.retryStmts = new Map();
      }
      ctx.retryable = true;
      return ctx;
    }
    // Multi-document transaction statements.
    if (V.truthy(cmd.autocommit)) throw err(72, 'Specifying autocommit=true is not allowed.');
    ctx.inTxn = true;
    if (has('startTransaction') && !V.truthy(cmd.startTransaction)) throw err(72, 'Specifying startTransaction=false is not allowed.');
    const isEnd = name === 'commitTransaction' || name === 'abortTransaction';
    if (!TXN_COMMANDS.has(name)) throw err(263, `Cannot run '${name}' in a multi-document transaction.`);
    if (!isEnd && (db === 'admin' || db === 'local' || db === 'config')) {
      throw err(263, `Cannot run command against the '${db}' database in a transaction.`);
    }
    if (n < session.txnNumber) throw tooOld(n, session);
    if (has('startTransaction')) {
      if (isEnd || name === 'killCursors') throw err(263, `Cannot start a transaction with a ${name} command`);
      // mongod's isReadConcernLevelAllowedInTransaction: local, majority and snapshot only.
      const rcl = cmd.readConcern && typeof cmd.readConcern === 'object' ? cmd.readConcern.level : undefined;
      if (rcl !== undefined && rcl !== 'local' && rcl !== 'majority' && rcl !== 'snapshot') {
        throw err(72, "The readConcern level must be either 'local' (default), 'majority' or 'snapshot' in order to run in a transaction");
      }
      if (n === session.txnNumber) {
        throw err(117, `Cannot start transaction ${n} on session ${session.key} because a transaction with the same number is in progress.`);
      }
      if (session.txn) session.txn.abort('superseded');
      session.txnNumber = n;
      session.kind = 'txn';
      session.retryReply = null;
      session.txn = new Txn(this.store, session, n);
      ctx.txn = session.txn;
      return ctx;
    }
    if (n > session.txnNumber || session.kind !== 'txn' || !session.txn) {
      if (name === 'abortTransaction' || n > session.txnNumber || session.kind !== 'txn') {
        throw err(251, `Given transaction number ${n} does not match any in-progress transactions. The active transaction number is ${session.txnNumber}`);
      }
    }
    const txn = session.txn;
    if (txn.state === 'aborted') {
      if (txn.abortReason === 'expired' && !isEnd) {
        throw err(251, `Transaction ${n} has been aborted because it exceeded the lifetime limit.`);
      }
      throw err(251, `Transaction ${n} has been aborted.`);
    }
    if (txn.state === 'committed') {
      if (name === 'commitTransaction') {
        ctx.txn = txn;
        ctx.commitAgain = true;
        return ctx;
      }
      throw err(256, `Transaction ${n} has been committed.`);
    }
    if (has('readConcern')) throw err(72, 'Only the first command in a transaction may specify a readConcern');
    ctx.txn = txn;
    return ctx;
  }
}

function tooOld(n, session) {
  return err(225, `Cannot start transaction ${n} on session ${session.key} because a newer transaction ${session.txnNumber} has already started.`);
}

module.exports = { Sessions, sessionKey, RETRYABLE_WRITE_COMMANDS };
