'use strict';
// The change log: an oplog-like ring of committed changes (writes and DDL) in commit order,
// which change streams (changestreams.js) read. Each entry has a sequence number (its place in
// the log), the store timestamp of its commit and what a change event needs: the document key,
// the post-image for inserts and replacements, the update description of an update (computed
// here, at write time, from the versions before and after), and the pre- and post-images when
// the collection has changeStreamPreAndPostImages enabled, as mongod keeps them only then. The
// ring holds a fixed number of entries (--oplog-entries); what falls out of it is history a
// change stream can no longer resume from (286). It does not filter, transform or wait.

const V = require('./values');

const DEFAULT_CAPACITY = 100000;

function isDoc(v) {
  return V.bsonTag(v) === 'object' && !(v instanceof Map) && !(v && v._bsontype);
}

class ChangeLog {
  constructor(capacity) {
    this.capacity = capacity || DEFAULT_CAPACITY;
    this.buf = [];
    this.head = 0; // index in buf of the oldest retained entry
    this.firstSeq = 1; // its sequence number (nextSeq when the log is empty)
    this.nextSeq = 1;
    this.lastEvictedTs = null; // store timestamp of the newest entry that fell out of the ring
    this.waiters = [];
  }

  get lastSeq() { return this.nextSeq - 1; }

  append(entry) {
    entry.seq = this.nextSeq++;
    if (!entry.wall) entry.wall = new Date();
    this.buf.push(entry);
    if (this.buf.length - this.head > this.capacity) {
      this.lastEvictedTs = this.buf[this.head].ts;
      this.buf[this.head] = undefined;
      this.head++;
      this.firstSeq++;
      if (this.head > 4096 && this.head * 2 > this.buf.length) {
        this.buf = this.buf.slice(this.head);
        this.head = 0;
      }
    }
    if (this.waiters.length) {
      const w = this.waiters;
      this.waiters = [];
      for (const f of w) f();
    }
    return entry;
  }

  // The entry with sequence number seq, or null when it is not (or no longer) in the ring.
  at(seq) {
    if (seq < this.firstSeq || seq > this.lastSeq) return null;
    return this.buf[this.head + (seq - this.firstSeq)];
  }

  // Resolves at the next append or after ms, whichever comes first.
  wait(ms) {
    return new Promise((resolve) => {
      let timer = null;
      const wake = () => {
        clearTimeout(timer);
        resolve();
      };
      this.waiters.push(wake);
      timer = setTimeout(() => {
        this.waiters = this.waiters.filter((f) => f !== wake);
        resolve();
      }, Math.max(0, ms));
    });
  }
}

function imagesEnabled(coll) {
  const o = coll.options && coll.options.changeStreamPreAndPostImages;
  return !!(o && typeof o === 'object' && V.truthy(o.enabled));
}

// ---- update descriptions ----
// Like mongod's document diff ($v: 2 oplog entries): fields set or added in the new version
// (nested documents and array elements by path), fields removed, arrays cut short. Each path
// keeps its components so the ambiguous ones (numeric field names, array indexes) can be
// spelled out in disambiguatedPaths.

function sameValue(a, b) {
  if (V.bsonTag(a) !== V.bsonTag(b)) return false;
  if (isDoc(a) || Array.isArray(a)) {
    try {
      const { BSON } = require('bson');
      return BSON.serialize(V.forWire({ v: a })).equals(BSON.serialize(V.forWire({ v: b })));
    } catch (e) {
      return false;
    }
  }
  return V.compareValues(a, b) === 0;
}

function diffDocs(before, after) {
  const out = { updated: [], removed: [], truncated: [] };
  diffObject(before, after, [], out);
  return out;
}

function diffObject(a, b, comps, out) {
  const bk = V.keys(b);
  const has = (o, k) => Object.prototype.hasOwnProperty.call(o, k) && o[k] !== undefined;
  for (const k of V.keys(a)) if (!has(b, k)) out.removed.push(comps.concat([k]));
  for (const k of bk) {
    const p = comps.concat([k]);
    if (!has(a, k)) out.updated.push([p, b[k]]);
    else diffValue(a[k], b[k], p, out);
  }
}

function diffValue(x, y, p, out) {
  if (isDoc(x) && isDoc(y)) {
    if (!sameValue(x, y)) diffObject(x, y, p, out);
  } else if (Array.isArray(x) && Array.isArray(y)) {
    if (sameValue(x, y)) return;
    if (y.length < x.length) out.truncated.push([p, y.length]);
    for (let i = 0; i < y.length; i++) {
      const q = p.concat([i]);
      if (i >= x.length) out.updated.push([q, y[i]]);
      else if (isDoc(x[i]) && isDoc(y[i])) diffValue(x[i], y[i], q, out);
      else if (!sameValue(x[i], y[i])) out.updated.push([q, y[i]]);
    }
  } else if (!sameValue(x, y)) {
    out.updated.push([p, y]);
  }
}

const dotted = (comps) => comps.join('.');
const ambiguous = (comps) => comps.some((c) => typeof c === 'number' || /^\d+$/.test(c));

// The updateDescription of an event; disambiguatedPaths with showExpandedEvents (6.1+).
function updateDescription(diff, expanded) {
  const { Int32 } = require('bson');
  const updated = V.fromEntries(diff.updated.map(([p, v]) => [dotted(p), v]));
  const ud = {
    updatedFields: updated,
    removedFields: diff.removed.map(dotted),
    truncatedArrays: diff.truncated.map(([p, n]) => ({ field: dotted(p), newSize: new Int32(n) })),
  };
  if (expanded) {
    const paths = [...diff.updated.map(([p]) => p), ...diff.removed].filter(ambiguous);
    ud.disambiguatedPaths = V.fromEntries(paths.map((p) => [dotted(p), p.map((c) => (typeof c === 'number' ? new Int32(c) : c))]));
  }
  return ud;
}

// The entry for one document write: op is insert, update, replace or delete.
function writeEntry(coll, idKey, op, before, doc) {
  const images = imagesEnabled(coll);
  const src = doc || before;
  const e = { op, db: coll.db, coll: coll.name, uuid: coll.uuid, idKey, key: { _id: src._id } };
  if (op === 'insert' || op === 'replace') e.post = doc;
  if (op === 'update') {
    e.diff = diffDocs(before, doc);
    if (images) e.post = doc;
  }
  if (images && op !== 'insert') e.pre = before;
  return e;
}

// The kind of a document write when the caller does not say (inserts and deletes).
function writeKind(before, doc, kind) {
  if (!before) return doc ? 'insert' : null;
  if (!doc) return 'delete';
  return kind === 'update' ? 'update' : 'replace';
}

// Catalogue changes: drop, rename, dropDatabase, create, createIndexes, dropIndexes, modify.
function recordDdl(store, op, fields) {
  return store.changes.append(Object.assign({ op, ts: store.nextTs() }, fields));
}

module.exports = { ChangeLog, DEFAULT_CAPACITY, writeEntry, writeKind, recordDdl, updateDescription, imagesEnabled };
