'use strict';
// Transactions and the data-access layer every command goes through. An Access is either
// autocommit (each write publishes at once, waiting for transactions that hold the document)
// or bound to a Txn (reads from its snapshot plus its own writes, writes buffered and published
// at commit, first writer wins). The session state machine that decides *which* Txn a command
// runs in is in sessions.js.

const V = require('./values');
const { err } = require('./errors');
const { WaitFor, writeConflict, Collection } = require('./storage');
const { writeEntry, writeKind, recordDdl } = require('./changes');

class Txn {
  constructor(store, session, txnNumber) {
    this.store = store;
    this.session = session;
    this.txnNumber = txnNumber; // BigInt
    this.state = 'inProgress';
    this.snapshotTs = store.clock;
    this.startedAt = Date.now();
    this.writes = new Map(); // Collection -> Map(idKey -> {doc, view})
    this.newColls = new Map(); // ns -> detached Collection created inside the transaction
    this.reservations = []; // [index, key]
    this.lockedIn = new Set(); // collections whose locks map holds our ids
    this.abortReason = null;
    this.events = []; // change-log entries of the statements, in order; logged at commit
    this.done = new Promise((resolve) => { this._resolveDone = resolve; });
    store.activeTxns.add(this);
  }

  // Throws the error a statement still running gets when its transaction ended under it:
  // TransactionExceededLifetimeLimitSeconds 290 when the reaper aborted it,
  // InterruptedDueToReplStateChange 11602 when a step-down did, else Interrupted.
  checkAlive() {
    if (this.state !== 'aborted') return;
    if (this.abortReason === 'stepdown') throw err(11602, 'operation was interrupted');
    if (this.abortReason === 'expired') {
      throw err(290, `Aborting transaction with txnNumber ${this.txnNumber} on session ${this.session.key} because it has been running for longer than 'transactionLifetimeLimitSeconds'`);
    }
    throw err(11601, `operation was interrupted: transaction ${this.txnNumber} was aborted`);
  }

  ownWrite(coll, idKey) {
    const m = this.writes.get(coll);
    return m ? m.get(idKey) : undefined;
  }

  commit() {
    if (this.state !== 'inProgress') return;
    const ts = this.store.nextTs();
    const created = [];
    for (const coll of this.newColls.values()) {
      if (!this.store.getColl(coll.db, coll.name)) {
        this.store.attach(coll);
        created.push({ op: 'create', db: coll.db, coll: coll.name, uuid: coll.uuid, options: coll.options });
      }
    }
    for (const [coll, m] of this.writes) {
      if (coll.dropped) continue;
      for (const [idKey, w] of m) coll.publish(idKey, w.doc, w.view, ts);
    }
    // The transaction's changes appear together at its commit time, in statement order, with
    // the session and transaction number (mongod's applyOps entry).
    const lsid = this.session && this.session.lsid ? this.session.lsid : null;
    const txnNumber = V.Long.fromBigInt(BigInt(this.txnNumber));
    let opIndex = 0;
    for (const e of created.concat(this.events.filter((x) => !x.collRef.dropped))) {
      delete e.collRef;
      this.store.changes.append(Object.assign(e, { ts, lsid, txnNumber, opIndex: opIndex++ }));
    }
    this.state = 'committed';
    this.commitTs = ts;
    this.release();
  }

  abort(reason) {
    if (this.state !== 'inProgress') return;
    this.state = 'aborted';
    this.abortReason = reason || null;
    this.release();
  }

  release() {
    for (const coll of this.lockedIn) {
      for (const [k, t] of coll.locks) if (t === this) coll.locks.delete(k);
    }
    for (const [ix, k] of this.reservations) {
      const r = ix.reserved.get(k);
      if (r && r.txn === this) ix.reserved.delete(k);
    }
    for (const ns of this.newColls.keys()) {
      if (this.store.pendingColls.get(ns) === this) this.store.pendingColls.delete(ns);
    }
    this.writes = new Map();
    this.events = [];
    this.reservations = [];
    this.store.activeTxns.delete(this);
    this.store.sweep();
    this._resolveDone();
  }
}

// Query-style validators only ($jsonSchema is whatever mingo makes of it); the error carries
// errInfo like mongod 5.0+, with a coarse `details`.
function checkValidator(coll, doc, view) {
  const o = coll.options;
  if (o.validationLevel === 'off' || o.validationAction === 'warn') return;
  if (coll._validator === undefined || coll._validatorSrc !== o.validator) {
    coll._validator = require('./query').compileFilter(o.validator); // null: matches everything
    coll._validatorSrc = o.validator;
  }
  if (!coll._validator || coll._validator.test(view, doc)) return;
  throw err(121, 'Document failed validation', {
    errInfo: { failingDocumentId: doc._id, details: { operatorName: '$and', clausesNotSatisfied: [] } },
  });
}

class Access {
  constructor(store, txn) {
    this.store = store;
    this.txn = txn || null;
  }

  // The collection as this access sees it; with create, makes it (implicitly) if missing.
  // options: those of a collection the create command makes (its change event carries them).
  coll(db, name, create, options) {
    const ns = `${db}.${name}`;
    const txn = this.txn;
    if (txn && txn.newColls.has(ns)) return txn.newColls.get(ns);
    const c = this.store.getColl(db, name);
    if (c) return c;
    const pending = this.store.pendingColls.get(ns);
    if (!create) return null;
    if (pending && pending !== txn) {
      if (txn) throw writeConflict();
      throw new WaitFor(pending);
    }
    if (txn) {
      const d = this.store.newDetached(db, name);
      if (options) d.options = options;
      txn.newColls.set(ns, d);
      this.store.pendingColls.set(ns, txn);
      return d;
    }
    const made = this.store.createColl(db, name, options || {});
    recordDdl(this.store, 'create', { db, coll: name, uuid: made.uuid, options: made.options });
    return made;
  }

  get(coll, idKey) {
    if (this.txn) {
      const own = this.txn.ownWrite(coll, idKey);
      if (own) return own.doc ? own : null;
      return Collection.visible(coll.records.get(idKey), this.txn.snapshotTs);
    }
    return coll.getLatest(idKey);
  }

  // Yields {idKey, doc, view} in natural order.
  *scan(coll) {
    const ts = this.txn ? this.txn.snapshotTs : Infinity;
    const own = this.txn ? this.txn.writes.get(coll) : null;
    for (const [idKey, head] of coll.records) {
      if (own && own.has(idKey)) {
        const w = own.get(idKey);
        if (w.doc) yield { idKey, doc: w.doc, view: w.view || (w.view = V.toView(w.doc)) };
        continue;
      }
      const v = Collection.visible(head, ts);
      if (v) yield { idKey, doc: v.doc, view: v.view || (v.view = V.toView(v.doc)) };
    }
    if (own) {
      for (const [idKey, w] of own) {
        if (!coll.records.has(idKey) && w.doc) yield { idKey, doc: w.doc, view: w.view || (w.view = V.toView(w.doc)) };
      }
    }
  }

  count(coll) {
    if (!this.txn) return coll.liveCount;
    let n = 0;
    for (const _ of this.scan(coll)) n++; // eslint-disable-line no-unused-vars
    return n;
  }

  // Writes doc (null deletes) under idKey. Throws WaitFor, WriteConflict or DuplicateKey.
  // kind 'update' marks an update (operators or pipeline) for the change event, spec its
  // operator document; otherwise a write over an existing document is a replacement.
  put(coll, idKey, doc, kind, spec) {
    if (this.txn) this.txn.checkAlive();
    const view = doc ? V.toView(doc) : null;
    if (doc && coll.options && coll.options.validator) checkValidator(coll, doc, view);
    const txn = this.txn;
    const holder = coll.locks.get(idKey);
    if (!txn) {
      if (holder) throw new WaitFor(holder);
      if (doc) coll.checkUnique(idKey, doc, view, null);
      const before = coll.getLatest(idKey);
      const ts = this.store.nextTs();
      coll.publish(idKey, doc, view, ts);
      const op = writeKind(before, doc, kind);
      if (op) this.store.changes.append(Object.assign(writeEntry(coll, idKey, op, before && before.doc, doc, spec), { ts }));
      return;
    }
    if (holder && holder !== txn) throw writeConflict();
    if (!holder) {
      const head = coll.records.get(idKey);
      if (head && head.ts > txn.snapshotTs) throw writeConflict();
    }
    if (doc) coll.checkUnique(idKey, doc, view, txn);
    const before = this.get(coll, idKey);
    const op = writeKind(before, doc, kind);
    if (op) txn.events.push(Object.assign(writeEntry(coll, idKey, op, before && before.doc, doc, spec), { collRef: coll }));
    coll.locks.set(idKey, txn);
    txn.lockedIn.add(coll);
    let m = txn.writes.get(coll);
    if (!m) {
      m = new Map();
      txn.writes.set(coll, m);
    }
    m.set(idKey, { doc, view });
    if (doc) {
      for (const ix of coll.uniqueIndexes()) {
        for (const k of ix.keysOf(doc, view)) {
          if (!ix.reserved.has(k)) {
            ix.reserved.set(k, { txn, idKey });
            txn.reservations.push([ix, k]);
          }
        }
      }
    }
  }
}

module.exports = { Txn, Access };
