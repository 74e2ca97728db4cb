'use strict';
// Ordered indexes: what lets the double answer a query from an index the way mongod does (a
// bounded walk of the entries in key order) instead of testing every document.
//
// Every secondary index that can be ordered (ascending/descending keys, not sparse, no
// collation) gets a sorted list of entries, built when the index is created (createIndexes,
// collMod, $out) from what the collection holds, then kept up to date. An entry is
// {k, v}: the index key of one committed version v of a record (k: one value per key field,
// missing as null) and the version itself. Entries sort by key (each field in its direction,
// BSON order), then by the record's natural position (v.seq, the order a scan yields records
// in, as a RecordId does on mongod), then by the version's commit time.
//
// Multi-version rule: every version a record's chain still holds (see storage.js) has its
// entries, and a version's entries go when the chain drops the version. A reader at snapshot ts
// takes an entry only when its version is the one it sees (Collection.visible(head, ts) ===
// entry.v), so an index read at any snapshot gives exactly what a scan at that snapshot would
// give, restricted to the key range. Transactions' own uncommitted writes are not in the list:
// the planner (planner.js) merges them in.
//
// An index whose documents give several keys (arrays: multikey) stops being ordered for good,
// and queries fall back to the scan. The list itself is a sorted list of chunks (at most
// 2 * CHUNK entries each, with each chunk's last entry kept aside for the binary search), so an
// insert or a removal costs a binary search and a splice of one chunk.

const V = require('./values');

const CHUNK = 256;

// ---- comparing key values ----
// V.compareValues is the reference; these fast paths give the same answers for the types index
// keys usually hold.

function isSurrogate(u) { return u >= 0xd800 && u <= 0xdfff; }

// Strings compare by their UTF-8 bytes (code point order). UTF-16 units compare the same way
// except that a surrogate (half of a code point above U+FFFF) sorts after every other unit.
function cmpStr(a, b) {
  if (a === b) return 0;
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    let x = a.charCodeAt(i);
    let y = b.charCodeAt(i);
    if (x !== y) {
      if (isSurrogate(x)) x += 0x10000;
      if (isSurrogate(y)) y += 0x10000;
      return x < y ? -1 : 1;
    }
  }
  return a.length < b.length ? -1 : a.length > b.length ? 1 : 0;
}

function cmpVal(a, b) {
  if (typeof a === 'string') {
    if (typeof b === 'string') return cmpStr(a, b);
  } else if (a instanceof Date) {
    if (b instanceof Date) {
      const x = a.getTime();
      const y = b.getTime();
      if (x === x && y === y) return x < y ? -1 : x > y ? 1 : 0; // eslint-disable-line no-self-compare
    }
  } else if (a && b && a._bsontype === 'ObjectId' && b._bsontype === 'ObjectId') {
    const x = a.id;
    const y = b.id;
    for (let i = 0; i < 12; i++) if (x[i] !== y[i]) return x[i] < y[i] ? -1 : 1;
    return 0;
  } else if (a && b && (a._bsontype === 'Int32' || a._bsontype === 'Double') && (b._bsontype === 'Int32' || b._bsontype === 'Double')) {
    const x = a.value;
    const y = b.value;
    if (x === x && y === y) return x < y ? -1 : x > y ? 1 : 0; // eslint-disable-line no-self-compare
  }
  return V.compareValues(a, b);
}

// ---- the sorted list ----

class SortedList {
  constructor(cmp) {
    this.cmp = cmp;
    this.chunks = [];
    this.lasts = []; // the last entry of each chunk
    this.size = 0;
  }

  // The first position whose entry `after` says is at or after a bound: `after` must be false
  // for a prefix of the list and true for the rest. {c, p}; the end is {c: chunks.length, p: 0}.
  seek(after) {
    let lo = 0;
    let hi = this.lasts.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (after(this.lasts[mid])) hi = mid;
      else lo = mid + 1;
    }
    if (lo === this.chunks.length) return { c: lo, p: 0 };
    const chunk = this.chunks[lo];
    let a = 0;
    let b = chunk.length - 1; // the last one is after
    while (a < b) {
      const mid = (a + b) >> 1;
      if (after(chunk[mid])) b = mid;
      else a = mid + 1;
    }
    return { c: lo, p: a };
  }

  // Replaces the content with entries already sorted.
  load(sorted) {
    this.chunks = [];
    this.lasts = [];
    for (let i = 0; i < sorted.length; i += CHUNK) {
      const chunk = sorted.slice(i, i + CHUNK);
      this.chunks.push(chunk);
      this.lasts.push(chunk[chunk.length - 1]);
    }
    this.size = sorted.length;
  }

  // The first position whose entry is not before e (seek with the list's comparator).
  seekEntry(e) {
    const cmp = this.cmp;
    const lasts = this.lasts;
    let lo = 0;
    let hi = lasts.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (cmp(lasts[mid], e) >= 0) hi = mid;
      else lo = mid + 1;
    }
    if (lo === this.chunks.length) return { c: lo, p: 0 };
    const chunk = this.chunks[lo];
    let a = 0;
    let b = chunk.length - 1;
    while (a < b) {
      const mid = (a + b) >> 1;
      if (cmp(chunk[mid], e) >= 0) b = mid;
      else a = mid + 1;
    }
    return { c: lo, p: a };
  }

  insert(e) {
    if (!this.chunks.length) {
      this.chunks.push([e]);
      this.lasts.push(e);
      this.size = 1;
      return;
    }
    let { c, p } = this.seekEntry(e);
    if (c === this.chunks.length) {
      c--;
      p = this.chunks[c].length;
    }
    const chunk = this.chunks[c];
    chunk.splice(p, 0, e);
    this.lasts[c] = chunk[chunk.length - 1];
    this.size++;
    if (chunk.length > 2 * CHUNK) {
      const right = chunk.splice(CHUNK);
      this.chunks.splice(c + 1, 0, right);
      this.lasts[c] = chunk[chunk.length - 1];
      this.lasts.splice(c + 1, 0, right[right.length - 1]);
    }
  }

  // Removes the entry e (the same object); false when it is not there.
  remove(e) {
    const { c, p } = this.seekEntry(e);
    if (c === this.chunks.length) return false;
    const chunk = this.chunks[c];
    if (chunk[p] !== e) return false;
    chunk.splice(p, 1);
    this.size--;
    if (!chunk.length) {
      this.chunks.splice(c, 1);
      this.lasts.splice(c, 1);
    } else this.lasts[c] = chunk[chunk.length - 1];
    return true;
  }

  at(pos) { return this.chunks[pos.c][pos.p]; }

  // Moves pos one entry on (in place).
  step(pos) {
    if (++pos.p >= this.chunks[pos.c].length) {
      pos.c++;
      pos.p = 0;
    }
  }

  before(a, b) { return a.c < b.c || (a.c === b.c && a.p < b.p); }

  // Entries from a up to (not including) b.
  count(a, b) {
    if (!this.before(a, b)) return 0;
    if (a.c === b.c) return b.p - a.p;
    let n = this.chunks[a.c].length - a.p;
    for (let c = a.c + 1; c < b.c; c++) n += this.chunks[c].length;
    return n + b.p;
  }
}

// ---- an index's ordered form ----

// Whether an index can be kept in order: plain ascending/descending keys, not sparse, no
// collation, not a wildcard.
function orderable(ix) {
  if (ix.sparse || ix.spec.collation || ix.name === '_id_') return false;
  for (const f of ix.fields) {
    const d = ix.key[f];
    if (!V.isNumeric(d) || V.toNumber(d) === 0 || f.includes('$**') || f === '$**') return false;
  }
  return true;
}

class OrderedIndex {
  constructor(ix) {
    this.ix = ix;
    this.fields = ix.fields;
    this.dirs = ix.fields.map((f) => (V.toNumber(ix.key[f]) < 0 ? -1 : 1));
    const dirs = this.dirs;
    const n = dirs.length;
    this.list = new SortedList((a, b) => {
      for (let i = 0; i < n; i++) {
        const c = cmpVal(a.k[i], b.k[i]);
        if (c) return c * dirs[i];
      }
      if (a.v.seq !== b.v.seq) return a.v.seq < b.v.seq ? -1 : 1;
      return a.v.ts < b.v.ts ? -1 : a.v.ts > b.v.ts ? 1 : 0;
    });
    this.multikey = false;
  }

  // The key of a document: an array of one value per field, null when the index does not
  // cover it (partial filter), or undefined when it would be multikey.
  keyOf(doc, view) {
    const ix = this.ix;
    if (ix.partialQuery && !ix.covers(doc, view)) return null;
    const k = new Array(this.fields.length);
    for (let i = 0; i < this.fields.length; i++) {
      const f = this.fields[i];
      let v;
      if (!f.includes('.')) v = Object.prototype.hasOwnProperty.call(doc, f) ? doc[f] : undefined;
      else {
        const vals = V.pathValues(doc, f);
        if (vals.length !== 1) return undefined;
        v = vals[0];
      }
      if (Array.isArray(v)) return undefined;
      k[i] = v === undefined ? null : v;
    }
    return k;
  }

  // The entry of a version: null when the index does not cover it; marks the index multikey.
  entryOf(ver) {
    const k = this.keyOf(ver.doc, ver.view);
    if (k === undefined) {
      this.multikey = true;
      return null;
    }
    return k ? { k, v: ver } : null;
  }

  add(ver) {
    const e = this.entryOf(ver);
    if (e) this.list.insert(e);
  }

  remove(ver) {
    const k = this.keyOf(ver.doc, ver.view);
    if (!k) return;
    const probe = { k, v: ver };
    const pos = this.list.seekEntry(probe);
    if (pos.c < this.list.chunks.length && this.list.at(pos).v === ver) this.list.remove(this.list.at(pos));
  }
}

// The ordered form of ix, built from every version the collection's chains hold; null when the
// index cannot be ordered or became multikey.
function ordered(coll, ix) {
  if (ix.ordered === undefined) {
    if (!orderable(ix)) ix.ordered = null;
    else {
      const o = new OrderedIndex(ix);
      const all = [];
      for (const head of coll.records.values()) {
        for (let v = head; v && !o.multikey; v = v.prev) {
          const e = v.deleted ? null : o.entryOf(v);
          if (e) all.push(e);
        }
        if (o.multikey) break;
      }
      if (!o.multikey) o.list.load(all.sort(o.list.cmp));
      ix.ordered = o.multikey ? null : o;
    }
  }
  return ix.ordered;
}

// A new committed version: into every ordered index already built.
function addVersion(coll, ver) {
  if (ver.deleted) return;
  for (const ix of coll.indexes.values()) {
    const o = ix.ordered;
    if (!o) continue;
    o.add(ver);
    if (o.multikey) ix.ordered = null; // for good: queries scan
  }
}

// A version the chain no longer holds: out of every ordered index.
function removeVersion(coll, ver) {
  if (ver.deleted) return;
  for (const ix of coll.indexes.values()) if (ix.ordered) ix.ordered.remove(ver);
}

module.exports = { cmpVal, cmpStr, SortedList, OrderedIndex, ordered, addVersion, removeVersion };
