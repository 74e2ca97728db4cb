'use strict';
// Storage: databases, collections, versioned records and unique indexes.
// Every record keeps a short chain of committed versions stamped with a commit timestamp, so a
// transaction reads the state at its snapshot without anything being copied. Uncommitted
// transactional writes live in the transaction's write set (sessions.js) and are published
// here by commitTxn. Unique indexes map a canonical key to the owning _id key for the latest
// committed state, plus "reservations" held by open transactions, which is how first-writer-wins
// and blocking of non-transactional writers are decided. Secondary indexes also have an ordered
// form (ordered.js, built when the index is created) that queries walk instead of scanning
// (planner.js): it holds an entry for every version the chains hold, and follows every version
// published here and every version a chain drops.

const { UUID } = require('bson');
const V = require('./values');
const { err } = require('./errors');
const { ChangeLog } = require('./changes');
const Ordered = require('./ordered');

// Thrown by a write that must wait for an open transaction to finish; the command layer waits
// on `txn.done` and retries the statement.
class WaitFor {
  constructor(txn) { this.txn = txn; }
}

function indexKeyValues(doc, field) {
  const out = [];
  for (const v of V.pathValues(doc, field)) {
    if (Array.isArray(v)) {
      if (v.length === 0) out.push(undefined);
      else for (const e of v) out.push(e);
    } else out.push(v);
  }
  return out.length ? out : [undefined];
}

// A partial filter of top-level fields, each equal to a string or a boolean or {$exists: true},
// as a plain function of the stored document (every document the index sees passes through
// it): true or false, or undefined when the value is one it does not decide (an array, a
// document, BSON undefined), which the compiled query then answers; null for any other filter.
function simplePartial(pf) {
  if (!pf || typeof pf !== 'object' || Array.isArray(pf)) return null;
  const has = (doc, k) => Object.prototype.hasOwnProperty.call(doc, k);
  const plain = (v) => v === null || typeof v === 'string' || typeof v === 'boolean' || typeof v === 'number' || v instanceof Date;
  const tests = [];
  for (const k of Object.keys(pf)) {
    const c = pf[k];
    if (k.startsWith('$') || k.includes('.')) return null;
    if (typeof c === 'string' || typeof c === 'boolean') {
      tests.push((doc) => (!has(doc, k) ? false : plain(doc[k]) ? doc[k] === c : undefined));
    } else if (c && typeof c === 'object' && !c._bsontype && Object.keys(c).length === 1 && c.$exists === true) {
      tests.push((doc) => (!has(doc, k) ? false : doc[k] === undefined ? undefined : true));
    } else return null;
  }
  return (doc) => {
    let r = true;
    for (const t of tests) {
      const x = t(doc);
      if (x === false) return false;
      if (x === undefined) r = undefined;
    }
    return r;
  };
}

class Index {
  constructor(spec) {
    this.spec = spec; // as listIndexes shows it
    this.name = spec.name;
    this.key = spec.key;
    this.fields = V.keys(spec.key);
    this.unique = !!spec.unique;
    this.sparse = !!spec.sparse;
    this.partialQuery = spec.partialFilterExpression ? require('./query').compileFilter(spec.partialFilterExpression) : null;
    this.partialFast = spec.partialFilterExpression ? simplePartial(spec.partialFilterExpression) : null;
    this.entries = this.unique ? new Map() : null; // canonical key -> idKey (latest committed)
    this.reserved = this.unique ? new Map() : null; // canonical key -> {txn, idKey}
  }

  // Whether the partial filter admits the document (true without one).
  covers(doc, view) {
    if (!this.partialQuery) return true;
    const fast = this.partialFast ? this.partialFast(doc) : undefined;
    if (fast !== undefined) return fast;
    return this.partialQuery.test(view || V.toView(doc), doc);
  }

  // Canonical keys of a document, [] when the index does not cover it.
  keysOf(doc, view) {
    if (!doc) return [];
    if (!this.covers(doc, view)) return [];
    const perField = this.fields.map((f) => indexKeyValues(doc, f));
    if (this.sparse && perField.every((vals) => vals.every((v) => v === undefined))) return [];
    let combos = [[]];
    for (const vals of perField) {
      const next = [];
      for (const c of combos) for (const v of vals) next.push(c.concat([v === undefined ? null : v]));
      combos = next;
    }
    const set = new Set();
    for (const c of combos) set.add(c.map(V.canonicalKey).join('|'));
    return [...set];
  }

  // Value of the first key for error messages: {a: 1}.
  keyValueOf(doc) {
    return V.fromEntries(this.fields.map((f) => {
      const v = indexKeyValues(doc, f)[0];
      return [f, v === undefined ? null : v];
    }));
  }
}

class Collection {
  constructor(store, db, name, options) {
    this.store = store;
    this.db = db;
    this.name = name;
    this.ns = `${db}.${name}`;
    this.options = options || {};
    this.uuid = new UUID();
    this.records = new Map(); // idKey -> newest version {ts, doc, view, deleted, prev, id, seq}
    this.seqNext = 0; // natural order: a record's seq is given when it enters `records`
    this.locks = new Map(); // idKey -> txn holding an uncommitted write
    this.liveCount = 0;
    this.indexes = new Map();
    this.indexes.set('_id_', new Index({ v: 2, key: { _id: 1 }, name: '_id_' }));
  }

  get idIndex() { return this.indexes.get('_id_'); }

  uniqueIndexes() {
    const out = [];
    for (const ix of this.indexes.values()) if (ix.unique && ix.name !== '_id_') out.push(ix);
    return out;
  }

  // Version visible at timestamp ts (Infinity = latest committed).
  static visible(head, ts) {
    let v = head;
    while (v && v.ts > ts) v = v.prev;
    return v && !v.deleted ? v : null;
  }

  getLatest(idKey) {
    return Collection.visible(this.records.get(idKey), Infinity);
  }

  dupKeyError(ix, doc) {
    const kv = ix.keyValueOf(doc);
    const shown = V.keys(kv).map((k) => `${k}: ${showValue(kv[k])}`).join(', ');
    return err(11000, `E11000 duplicate key error collection: ${this.ns} index: ${ix.name} dup key: { ${shown} }`, {
      keyPattern: ix.key, keyValue: kv,
    });
  }

  // Checks a committed write of newDoc under idKey against the unique indexes; throws
  // DuplicateKey or WaitFor. `txn` is the writing transaction or null.
  checkUnique(idKey, newDoc, newView, txn) {
    // An index with prepareUnique (collMod) refuses new duplicate keys and keeps the
    // duplicates it already has (they block the conversion to unique, see collMod).
    for (const ix of this.indexes.values()) {
      if (!ix.spec.prepareUnique || ix.unique) continue;
      const keys = ix.keysOf(newDoc, newView);
      if (!keys.length) continue;
      for (const other of this.records.keys()) {
        if (other === idKey) continue;
        const v = txn && txn.ownWrite(this, other) ? txn.ownWrite(this, other) : this.getLatest(other);
        if (v && v.doc && ix.keysOf(v.doc, v.view).some((k) => keys.includes(k))) throw this.dupKeyError(ix, newDoc);
      }
    }
    for (const ix of this.uniqueIndexes()) {
      for (const k of ix.keysOf(newDoc, newView)) {
        const r = ix.reserved.get(k);
        if (r && r.txn !== txn && r.idKey !== idKey) {
          if (txn) throw writeConflict();
          throw new WaitFor(r.txn);
        }
        if (r && r.txn === txn && r.idKey !== idKey) throw this.dupKeyError(ix, newDoc);
        const owner = ix.entries.get(k);
        if (owner !== undefined && owner !== idKey) {
          // Committed owner; a transaction may have moved it off this key already.
          if (txn) {
            const own = txn.ownWrite(this, owner);
            if (own && !ix.keysOf(own.doc, own.view).includes(k)) continue;
            // Committed after our snapshot: the storage engine reports a conflict, not a duplicate.
            const head = this.records.get(owner);
            if (!own && head && head.ts > txn.snapshotTs) throw writeConflict();
          }
          throw this.dupKeyError(ix, newDoc);
        }
      }
    }
  }

  // Publishes a committed version (used by non-transactional writes and by commit).
  publish(idKey, doc, view, ts) {
    const head = this.records.get(idKey);
    const old = Collection.visible(head, Infinity);
    for (const ix of this.uniqueIndexes()) {
      if (old) for (const k of ix.keysOf(old.doc, old.view)) if (ix.entries.get(k) === idKey) ix.entries.delete(k);
      if (doc) for (const k of ix.keysOf(doc, view)) ix.entries.set(k, idKey);
    }
    if (old && !doc) this.liveCount--;
    if (!old && doc) this.liveCount++;
    // A record keeps its place in `records` (and so its seq) until its key leaves the map.
    const seq = head ? head.seq : this.seqNext++;
    const version = { ts, doc, view, deleted: !doc, prev: head || null, id: idKey, seq };
    this.records.set(idKey, version);
    Ordered.addVersion(this, version);
    this.store.pruneChain(this, idKey, version);
  }
}

function showValue(v) {
  const t = V.bsonTag(v);
  if (t === 'string') return JSON.stringify(v);
  if (t === 'objectId') return `ObjectId('${v.toHexString()}')`;
  if (t === 'null') return 'null';
  if (t === 'date') return `new Date(${v.getTime()})`;
  if (t === 'object') return `{ ${V.keys(v).map((k) => `${k}: ${showValue(v[k])}`).join(', ')} }`;
  if (t === 'array') return `[ ${v.map(showValue).join(', ')} ]`;
  if (t === 'long' || t === 'int') return v.toString();
  if (t === 'double') {
    const n = V.toNumber(v);
    return Number.isInteger(n) ? `${n}.0` : String(n);
  }
  return String(v);
}

function writeConflict() {
  const e = err(112, 'Write conflict during plan execution and yielding is disabled. :: Please retry your operation or multi-document transaction.');
  e.errorLabels = ['TransientTransactionError'];
  return e;
}

class Store {
  constructor() {
    this.clock = 0; // last commit timestamp
    this.dbs = new Map(); // db -> Map(name -> Collection)
    this.activeTxns = new Set(); // transactions with a snapshot
    // Snapshot reads outside transactions (readConcern snapshot) keep the history at their
    // snapshot for a while, so a later read at that atClusterTime sees the same data:
    // snapshot ts -> expiry (ms), as mongod's minSnapshotHistoryWindowInSeconds (300 s).
    this.snapshotPins = new Map();
    this.pendingColls = new Map(); // ns -> txn that created it implicitly, not yet committed
    this.tombstones = [];
    this.changes = new ChangeLog(); // committed changes, for change streams
    this.commit = null; // the majority commit point (majority.js), when the set can lag
  }

  nextTs() {
    const ts = ++this.clock;
    if (this.commit) this.commit.written(ts);
    return ts;
  }

  // The newest timestamp a majority holds: the clock unless the secondary lags.
  majorityTs() { return this.commit ? this.commit.ts : this.clock; }

  getColl(db, name) {
    const d = this.dbs.get(db);
    return d ? d.get(name) || null : null;
  }

  createColl(db, name, options) {
    let d = this.dbs.get(db);
    if (!d) {
      d = new Map();
      this.dbs.set(db, d);
    }
    const c = new Collection(this, db, name, options);
    d.set(name, c);
    return c;
  }

  // A detached collection a transaction creates implicitly; attached at commit.
  newDetached(db, name) { return new Collection(this, db, name, {}); }

  attach(coll) {
    let d = this.dbs.get(coll.db);
    if (!d) {
      d = new Map();
      this.dbs.set(coll.db, d);
    }
    d.set(coll.name, coll);
  }

  dropColl(db, name) {
    const d = this.dbs.get(db);
    if (!d || !d.has(name)) return null;
    const c = d.get(name);
    d.delete(name);
    c.dropped = true;
    return c;
  }

  dropDb(db) { this.dbs.delete(db); }

  minActiveSnapshot() {
    let m = this.commit && this.commit.lagging() ? this.commit.point : Infinity;
    for (const t of this.activeTxns) if (t.snapshotTs < m) m = t.snapshotTs;
    for (const ts of this.snapshotPins.keys()) if (ts < m) m = ts;
    return m;
  }

  // Open transactions, pinned snapshot reads, and a commit point behind the clock (majority
  // reads and a rollback need the versions at it).
  holdsSnapshots() { return this.activeTxns.size > 0 || this.snapshotPins.size > 0 || !!(this.commit && this.commit.lagging()); }

  // A snapshot read at `ts` (null: now): keeps its history for the window and returns it. A
  // snapshot older than every kept one may have lost versions: 239 SnapshotTooOld.
  pinSnapshot(ts, windowMs = 300 * 1000) {
    const now = Date.now();
    let swept = false;
    for (const [t, until] of this.snapshotPins) if (until <= now) {
      this.snapshotPins.delete(t);
      swept = true;
    }
    if (swept) this.sweep();
    // Without atClusterTime, mongod reads a snapshot of majority-committed data.
    const at = ts === null ? this.majorityTs() : ts;
    if (ts !== null && at !== this.clock && !this.snapshotPins.has(at)) {
      let floor = Infinity;
      for (const t of this.snapshotPins.keys()) if (t < floor) floor = t;
      for (const t of this.activeTxns) if (t.snapshotTs < floor) floor = t.snapshotTs;
      if (!(at >= floor)) return null;
    }
    this.snapshotPins.set(at, now + windowMs);
    return at;
  }

  // Keeps only the versions some open snapshot may still need.
  pruneChain(coll, idKey, head) {
    const min = this.holdsSnapshots() ? this.minActiveSnapshot() : Infinity;
    let v = head;
    while (v && v.ts > min) v = v.prev;
    if (v) {
      // v is what the oldest snapshot sees; anything older is unreachable
      for (let old = v.prev; old; old = old.prev) Ordered.removeVersion(coll, old);
      v.prev = null;
    }
    if (head.deleted) {
      if (head.prev === null) coll.records.delete(idKey);
      else this.tombstones.push({ coll, idKey, ts: head.ts });
    }
  }

  // Called when a transaction ends: drop tombstones no snapshot can see past any more.
  sweep() {
    if (!this.tombstones.length) return;
    const min = this.holdsSnapshots() ? this.minActiveSnapshot() : Infinity;
    const keep = [];
    for (const t of this.tombstones) {
      const head = t.coll.records.get(t.idKey);
      if (!head || !head.deleted || head.ts !== t.ts) continue;
      if (head.ts <= min) {
        for (let old = head.prev; old; old = old.prev) Ordered.removeVersion(t.coll, old);
        t.coll.records.delete(t.idKey);
      } else keep.push(t);
    }
    this.tombstones = keep;
  }
}

// Rolls back every write above `ts` (a failover to a member that holds nothing newer): each
// record goes back to its version at ts (or away), with its index entries; the change log
// loses the entries above ts. Catalogue changes (collections and indexes created above ts)
// stay. Returns the number of versions rolled back.
Store.prototype.rollbackTo = function rollbackTo(ts) {
  let n = 0;
  for (const d of this.dbs.values()) {
    for (const coll of d.values()) {
      for (const [idKey, head] of [...coll.records]) {
        if (head.ts <= ts) continue;
        const now = Collection.visible(head, Infinity);
        let v = head;
        while (v && v.ts > ts) {
          Ordered.removeVersion(coll, v);
          v = v.prev;
          n++;
        }
        const back = v && !v.deleted ? v : null;
        for (const ix of coll.uniqueIndexes()) {
          if (now) for (const k of ix.keysOf(now.doc, now.view)) if (ix.entries.get(k) === idKey) ix.entries.delete(k);
          if (back) for (const k of ix.keysOf(back.doc, back.view)) ix.entries.set(k, idKey);
        }
        if (now && !back) coll.liveCount--;
        if (!now && back) coll.liveCount++;
        if (v) coll.records.set(idKey, v);
        else coll.records.delete(idKey);
      }
    }
  }
  this.tombstones = this.tombstones.filter((t) => t.ts <= ts);
  this.changes.truncateAfter(ts);
  return n;
};

module.exports = { Store, Collection, Index, WaitFor, writeConflict, showValue };
