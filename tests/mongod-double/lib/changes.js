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
    this.visibleTs = null; // () => the newest timestamp change streams may return (majority)
  }

  get lastSeq() { return this.nextSeq - 1; }

  // The last entry a change stream may return: at or below the majority commit point.
  get visibleSeq() {
    let s = this.lastSeq;
    if (!this.visibleTs) return s;
    const ts = this.visibleTs();
    while (s >= this.firstSeq && this.at(s).ts > ts) s--;
    return s;
  }

  // Wakes the streams waiting for entries (the commit point moved).
  wakeAll() {
    if (!this.waiters.length) return;
    const w = this.waiters;
    this.waiters = [];
    for (const f of w) f();
  }

  // Drops the entries above ts (a rollback); their sequence numbers are given again.
  truncateAfter(ts) {
    while (this.lastSeq >= this.firstSeq && this.at(this.lastSeq).ts > ts) {
      this.buf.pop();
      this.nextSeq--;
    }
  }

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

// What an update with operators logs ($v: 2, as mongod's update nodes do): each path an
// operator names, with the whole value it has afterwards; a new path from its first new
// component; values appended to an array ($push, $addToSet) as their indexes; $unset (and
// the source of $rename) as removed fields. Paths with positional parts ($, $[], $[id]) are
// diffed below their fixed prefix.
const APPENDING = new Set(['$push', '$addToSet']);

function lookupPath(doc, comps) {
  let cur = doc;
  const typed = [];
  for (let i = 0; i < comps.length; i++) {
    const c = comps[i];
    if (Array.isArray(cur) && /^\d+$/.test(c)) {
      typed.push(Number(c));
      cur = cur[Number(c)];
    } else if (isDoc(cur) && Object.prototype.hasOwnProperty.call(cur, c) && cur[c] !== undefined) {
      typed.push(c);
      cur = cur[c];
    } else {
      return { found: false, depth: i, typed };
    }
    if (cur === undefined) return { found: false, depth: i, typed: typed.slice(0, -1) };
  }
  return { found: true, value: cur, typed };
}

function operatorDiff(before, after, spec) {
  const out = { updated: [], removed: [], truncated: [] };
  const seen = new Set();
  const fallback = (comps) => {
    const key = comps.join('.');
    if (seen.has(`~${key}`)) return;
    seen.add(`~${key}`);
    const a = comps.length ? lookupPath(before, comps) : { found: true, value: before, typed: [] };
    const b = comps.length ? lookupPath(after, comps) : { found: true, value: after, typed: [] };
    if (!b.found) return;
    if (!a.found) out.updated.push([b.typed, b.value]);
    else diffValue(a.value, b.value, b.typed, out);
  };
  for (const op of V.keys(spec)) {
    const fields = spec[op];
    if (!isDoc(fields) || op === '$setOnInsert') continue;
    for (const path of V.keys(fields)) {
      const targets = op === '$rename' ? [path, String(fields[path])] : [path];
      for (const t of targets) {
        const comps = t.split('.');
        const pos = comps.findIndex((c) => c === '$' || c.startsWith('$['));
        if (pos >= 0) {
          fallback(comps.slice(0, pos));
          continue;
        }
        if (seen.has(t)) continue;
        seen.add(t);
        const a = lookupPath(before, comps);
        const b = lookupPath(after, comps);
        if (!b.found) {
          if (a.found) out.removed.push(a.typed);
          continue;
        }
        if (!a.found) {
          const created = lookupPath(after, comps.slice(0, a.depth + 1));
          out.updated.push([created.typed, created.value]);
          continue;
        }
        if (sameValue(a.value, b.value)) continue;
        const appended = APPENDING.has(op) && Array.isArray(a.value) && Array.isArray(b.value) &&
          b.value.length > a.value.length && a.value.every((x, i) => sameValue(x, b.value[i]));
        if (appended) {
          for (let i = a.value.length; i < b.value.length; i++) out.updated.push([b.typed.concat([i]), b.value[i]]);
        } else {
          out.updated.push([b.typed, b.value]);
        }
      }
    }
  }
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

// The entry for one document write: op is insert, update, replace or delete; spec is the
// update's operator document, if it had one (else the versions are diffed, as for pipelines).
function writeEntry(coll, idKey, op, before, doc, spec) {
  const images = imagesEnabled(coll);
  const src = doc || before;
  const e = { op, db: coll.db, coll: coll.name, uuid: coll.uuid, idKey, key: { _id: src._id } };
  if (op === 'insert' || op === 'replace') e.post = doc;
  if (op === 'update') {
    e.diff = isDoc(spec) ? operatorDiff(before, doc, spec) : diffDocs(before, doc);
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
