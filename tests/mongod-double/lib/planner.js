'use strict';
// Query planning over the ordered indexes (ordered.js): which index answers a filter, and the
// walk of its entries that gives the candidate records, so a query costs what its index bounds
// hold instead of the whole collection.
//
// What a plan yields is exactly what the scan would give, restricted to the index bounds: each
// entry is taken only when its version is the one the reader's snapshot sees, a transaction's
// own writes replace the entries of the records they wrote and are merged in, and every
// candidate is tested against the whole filter. Bounds only ever widen what a filter matches
// (a condition the planner does not understand is left to the filter), so an index can only
// make a query cheaper, never change what matches.
//
// Order: a plan that provides the query's sort yields by (sort key, natural order), which is
// what the scan's stable sort gives; without a sort and without a limit the candidates are put
// in natural order; without a sort but with a limit they come in index order, as on mongod (the
// limit then stops the walk early).
//
// Not planned (the scan answers): collations, views, indexes that are sparse, multikey or not
// plain ascending/descending, partial indexes whose filter the query does not imply, filters
// without a bound on an index prefix unless the index provides the sort.

const V = require('./values');
const { Collection } = require('./storage');
const Ordered = require('./ordered');
const { cmpVal } = Ordered;

const MAX_SUBRANGES = 4096;
const NEW_SEQ = 2 ** 52; // own inserts of a transaction come after every record, in write order

function isPlainObject(v) {
  return v !== null && typeof v === 'object' && !Array.isArray(v) && !v._bsontype && !(v instanceof Date) &&
    !(v instanceof RegExp) && !Buffer.isBuffer(v) && !(v instanceof Uint8Array);
}

// Values an index bound may hold: the comparison of the index (BSON order) and of the filter
// agree on them. Strings in ranges must also stay below the surrogates (see rangeOk).
function scalarOk(v) {
  switch (typeof v) {
    case 'string': case 'boolean': return true;
    case 'number': return !Number.isNaN(v);
    case 'bigint': return v >= -(2n ** 53n) && v <= 2n ** 53n;
    default: break;
  }
  if (v instanceof Date) return !Number.isNaN(v.getTime());
  if (!v || typeof v !== 'object') return false;
  switch (v._bsontype) {
    case 'ObjectId': case 'Int32': return true;
    case 'Double': return !Number.isNaN(v.value);
    case 'Long': return Number.isSafeInteger(v.toNumber());
    default: return false;
  }
}

// A range bound: a string with a unit at or above U+D800 would compare differently in UTF-16
// (mingo) and in UTF-8 (the index).
function rangeOk(v) {
  if (!scalarOk(v)) return false;
  if (typeof v !== 'string') return true;
  for (let i = 0; i < v.length; i++) if (v.charCodeAt(i) >= 0xd800) return false;
  return true;
}

// ---- what a filter says about each field ----

function newCond() {
  return { points: null, lo: undefined, loIncl: false, hi: undefined, hiIncl: false, exists: false };
}

function setPoints(c, pts) {
  if (c.points === null || pts.length < c.points.length) c.points = pts;
}

function addCond(conds, field, c) {
  let e = conds.get(field);
  if (!e) {
    e = newCond();
    conds.set(field, e);
  }
  if (scalarOk(c)) {
    setPoints(e, [c]);
    return;
  }
  if (!isPlainObject(c)) return;
  const ops = Object.keys(c);
  if (!ops.length || !ops.every((o) => o.startsWith('$'))) return;
  for (const op of ops) {
    const a = c[op];
    if (op === '$eq' && scalarOk(a)) setPoints(e, [a]);
    else if (op === '$in' && Array.isArray(a) && a.every(scalarOk)) {
      const seen = new Set();
      const pts = [];
      for (const x of a) {
        const k = V.canonicalKey(x);
        if (!seen.has(k)) {
          seen.add(k);
          pts.push(x);
        }
      }
      setPoints(e, pts);
    } else if ((op === '$gt' || op === '$gte') && rangeOk(a)) {
      const d = e.lo === undefined ? 1 : cmpVal(a, e.lo);
      if (d > 0) {
        e.lo = a;
        e.loIncl = op === '$gte';
      } else if (d === 0) e.loIncl = e.loIncl && op === '$gte';
    } else if ((op === '$lt' || op === '$lte') && rangeOk(a)) {
      const d = e.hi === undefined ? -1 : cmpVal(a, e.hi);
      if (d < 0) {
        e.hi = a;
        e.hiIncl = op === '$lte';
      } else if (d === 0) e.hiIncl = e.hiIncl && op === '$lte';
    } else if (op === '$exists' && V.truthy(a)) e.exists = true;
  }
}

// The conditions every matching document meets (top-level fields and $and), and the first
// top-level $or (for a plan per branch).
function analyze(filter, out = { conds: new Map(), or: null }, top = true) {
  for (const k of Object.keys(filter)) {
    const c = filter[k];
    if (k === '$and') {
      if (Array.isArray(c)) for (const f of c) if (isPlainObject(f)) analyze(f, out, false);
    } else if (k === '$or') {
      if (top && !out.or && Array.isArray(c) && c.length && c.every(isPlainObject)) out.or = c;
    } else if (!k.startsWith('$')) addCond(out.conds, k, c);
  }
  return out;
}

function mergeConds(a, filter) {
  const out = { conds: new Map(), or: null };
  for (const [f, c] of a.conds) out.conds.set(f, Object.assign({}, c));
  analyze(filter, out, false);
  return out;
}

// Whether every document meeting conds meets a partial filter (equality and $exists: true on
// top-level fields, and $and of those, which is what partial filters here hold).
function implies(conds, pf) {
  for (const k of Object.keys(pf)) {
    const p = pf[k];
    if (k === '$and') {
      if (!Array.isArray(p) || !p.every((x) => isPlainObject(x) && implies(conds, x))) return false;
      continue;
    }
    if (k.startsWith('$')) return false;
    const q = conds.get(k);
    if (!q) return false;
    const eq = scalarOk(p) ? p : isPlainObject(p) && Object.keys(p).length === 1 && scalarOk(p.$eq) ? p.$eq : undefined;
    if (eq !== undefined) {
      if (!q.points || !q.points.length) return false;
      const want = V.canonicalKey(eq);
      if (!q.points.every((x) => V.canonicalKey(x) === want)) return false;
      continue;
    }
    if (isPlainObject(p) && Object.keys(p).length === 1 && Object.prototype.hasOwnProperty.call(p, '$exists') && V.truthy(p.$exists)) {
      if (!(q.exists || (q.points && q.points.length) || q.lo !== undefined || q.hi !== undefined)) return false;
      continue;
    }
    return false;
  }
  return true;
}

// ---- one index ----

function sortSpecOf(sort) {
  if (!sort || !isPlainObject(sort)) return null;
  const out = [];
  for (const k of V.keys(sort)) {
    const d = sort[k];
    if (d && typeof d === 'object' && !d._bsontype) return undefined; // $meta: not planned
    out.push({ field: k, dir: V.toNumber(d) < 0 ? -1 : 1 });
  }
  return out.length ? out : null;
}

// The bounds of `an` on index `o`: {o, subs, k, sorted, tieSort, sortPos} or null.
function planIndex(o, an, spec) {
  const fields = o.fields;
  const pointSets = [];
  for (const f of fields) {
    const c = an.conds.get(f);
    if (!c || c.points === null) break;
    const dir = o.dirs[pointSets.length];
    pointSets.push(c.points.slice().sort((a, b) => cmpVal(a, b) * dir));
  }
  const k = pointSets.length;
  const rc = k < fields.length ? an.conds.get(fields[k]) : undefined;
  const range = rc && (rc.lo !== undefined || rc.hi !== undefined) ? rc : null;
  // Sort: the fields constant in a subrange drop out; the rest must follow the index.
  let sorted = true;
  let tieSort = false;
  let sortPos = null;
  if (spec) {
    sortPos = [];
    let next = k;
    for (const s of spec) {
      const at = fields.indexOf(s.field);
      if (at < 0) {
        sorted = false;
        break;
      }
      sortPos.push(at);
      if (at < k) continue;
      if (at !== next || o.dirs[at] !== s.dir) {
        sorted = false;
        break;
      }
      next++;
    }
    // Ties of the sort come in natural order only when the sort reaches the last index field.
    if (sorted) tieSort = next < fields.length;
  }
  if (!k && !range && !(spec && sorted)) return null;
  let n = 1;
  for (const s of pointSets) n *= s.length;
  if (n > MAX_SUBRANGES) return null;
  const subs = [];
  (function product(i, acc) {
    if (i === k) {
      subs.push(acc);
      return;
    }
    for (const v of pointSets[i]) product(i + 1, acc.concat([v]));
  })(0, []);
  return { o, subs, k, range, sorted: !!spec && sorted, tieSort, sortPos, spec };
}

function cmpPrefix(o, e, vals, m) {
  for (let i = 0; i < m; i++) {
    const c = cmpVal(e.k[i], vals[i]);
    if (c) return c * o.dirs[i];
  }
  return 0;
}

// [start, end) positions of one subrange.
function subBounds(p, pts) {
  const { o, k, range } = p;
  const list = o.list;
  const dir = k < o.dirs.length ? o.dirs[k] : 1;
  let start;
  let end;
  const first = range ? (dir > 0 ? range.lo : range.hi) : undefined;
  const firstStrict = range ? (dir > 0 ? !range.loIncl : !range.hiIncl) : false;
  const second = range ? (dir > 0 ? range.hi : range.lo) : undefined;
  const secondIncl = range ? (dir > 0 ? range.hiIncl : range.loIncl) : false;
  if (first !== undefined) {
    const vals = pts.concat([first]);
    start = list.seek((e) => {
      const c = cmpPrefix(o, e, vals, k + 1);
      return firstStrict ? c > 0 : c >= 0;
    });
  } else start = k ? list.seek((e) => cmpPrefix(o, e, pts, k) >= 0) : { c: 0, p: 0 };
  if (second !== undefined) {
    const vals = pts.concat([second]);
    end = list.seek((e) => {
      const c = cmpPrefix(o, e, vals, k + 1);
      return secondIncl ? c > 0 : c >= 0;
    });
  } else end = k ? list.seek((e) => cmpPrefix(o, e, pts, k) > 0) : { c: list.chunks.length, p: 0 };
  return { start, end };
}

// ---- reading at a snapshot ----

class Reader {
  constructor(access, coll, test) {
    this.coll = coll;
    this.ts = access.txn ? access.txn.snapshotTs : Infinity;
    this.own = access.txn ? access.txn.writes.get(coll) || null : null;
    this.test = test;
    this.keys = 0; // entries looked at
    this.docs = 0; // documents tested
  }

  // The row of an entry when its version is the one this reader sees and it matches.
  row(e) {
    this.keys++;
    const ver = e.v;
    if (this.own && this.own.has(ver.id)) return null;
    if (Collection.visible(this.coll.records.get(ver.id), this.ts) !== ver) return null;
    const view = ver.view || (ver.view = V.toView(ver.doc));
    this.docs++;
    if (this.test && !this.test(view, ver.doc)) return null;
    return { idKey: ver.id, doc: ver.doc, view, seq: ver.seq, k: e.k };
  }

  // The transaction's own written documents that match, each with its natural position and
  // (given an ordered index) its key there; undefined when one is multikey in that index.
  extras(o) {
    const out = [];
    if (!this.own) return out;
    let n = 0;
    for (const [idKey, w] of this.own) {
      const head = this.coll.records.get(idKey);
      const seq = head ? head.seq : NEW_SEQ + n++;
      if (!w.doc) continue;
      const view = w.view || (w.view = V.toView(w.doc));
      let k = null;
      if (o) {
        k = o.keyOf(w.doc, view);
        if (k === undefined) return undefined;
        if (k === null) continue; // outside a partial index the filter implies: cannot match
      }
      this.docs++;
      if (this.test && !this.test(view, w.doc)) continue;
      out.push({ idKey, doc: w.doc, view, seq, k });
    }
    return out;
  }

  * walk(list, start, end) {
    const pos = { c: start.c, p: start.p };
    while (list.before(pos, end)) {
      const r = this.row(list.at(pos));
      list.step(pos);
      if (r) yield r;
    }
  }
}

// The rows of the records with these _id values (as the reader sees them), matching the filter.
function* idRows(access, reader, points) {
  let ownOrder = null;
  for (const x of points) {
    const idKey = V.canonicalKey(x);
    reader.keys++;
    const v = access.get(reader.coll, idKey);
    if (!v) continue;
    const view = v.view || (v.view = V.toView(v.doc));
    reader.docs++;
    if (reader.test && !reader.test(view, v.doc)) continue;
    const head = reader.coll.records.get(idKey);
    let seq;
    if (head) seq = head.seq;
    else {
      if (!ownOrder) ownOrder = new Map([...(reader.own ? reader.own.keys() : [])].filter((k) => !reader.coll.records.has(k)).map((k, i) => [k, i]));
      seq = NEW_SEQ + (ownOrder.get(idKey) || 0);
    }
    yield { idKey, doc: v.doc, view, seq, k: null };
  }
}

// Rows compared by the sort (from their index keys), then natural order.
function rowComparator(p) {
  const pos = p.sortPos;
  const dirs = p.spec.map((s) => s.dir);
  return (a, b) => {
    for (let i = 0; i < pos.length; i++) {
      const c = cmpVal(a.k[pos[i]], b.k[pos[i]]);
      if (c) return c * dirs[i];
    }
    return a.seq - b.seq;
  };
}

function* mergeStreams(streams, cmp) {
  const heap = [];
  const push = (it) => {
    const n = it.next();
    if (n.done) return;
    heap.push({ it, r: n.value });
    let i = heap.length - 1;
    while (i > 0) {
      const up = (i - 1) >> 1;
      if (cmp(heap[up].r, heap[i].r) <= 0) break;
      [heap[up], heap[i]] = [heap[i], heap[up]];
      i = up;
    }
  };
  for (const s of streams) push(s);
  while (heap.length) {
    const top = heap[0];
    yield top.r;
    const last = heap.pop();
    if (heap.length) {
      heap[0] = last;
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (l < heap.length && cmp(heap[l].r, heap[m].r) < 0) m = l;
        if (r < heap.length && cmp(heap[r].r, heap[m].r) < 0) m = r;
        if (m === i) break;
        [heap[m], heap[i]] = [heap[i], heap[m]];
        i = m;
      }
    }
    push(top.it);
  }
}

// Consecutive rows equal in the sort come out in natural order.
function* tiesInOrder(rows, p) {
  const pos = p.sortPos;
  const same = (a, b) => pos.every((i) => cmpVal(a.k[i], b.k[i]) === 0);
  let group = [];
  for (const r of rows) {
    if (group.length && !same(group[0], r)) {
      if (group.length > 1) group.sort((a, b) => a.seq - b.seq);
      yield* group;
      group = [];
    }
    group.push(r);
  }
  if (group.length > 1) group.sort((a, b) => a.seq - b.seq);
  yield* group;
}

function* iterate(reader, p, extras) {
  const list = p.o.list;
  const streams = p.subs.map((pts) => {
    const { start, end } = subBounds(p, pts);
    return reader.walk(list, start, end);
  });
  if (!p.sorted) {
    for (const s of streams) yield* s;
    yield* extras;
    return;
  }
  const cmp = rowComparator(p);
  if (extras.length) streams.push(extras.sort(cmp)[Symbol.iterator]());
  const merged = streams.length === 1 ? streams[0] : mergeStreams(streams, cmp);
  yield* p.tieSort ? tiesInOrder(merged, p) : merged;
}

function countOf(p) {
  let n = 0;
  for (const pts of p.subs) {
    const { start, end } = subBounds(p, pts);
    n += p.o.list.count(start, end);
  }
  return n;
}

// The usable index plans for an analysed filter, each with its cost (entries in its bounds).
function indexPlans(coll, an, spec, reader) {
  const plans = [];
  for (const ix of coll.indexes.values()) {
    if (ix.partialQuery && !implies(an.conds, ix.spec.partialFilterExpression)) continue;
    const o = Ordered.ordered(coll, ix);
    if (!o) continue;
    const p = planIndex(o, an, spec);
    if (!p) continue;
    const extras = reader.extras(o);
    if (extras === undefined) continue;
    p.extras = extras;
    p.count = countOf(p) + extras.length;
    p.name = ix.name;
    plans.push(p);
  }
  return plans;
}

function planCost(p, spec) {
  return spec && !p.sorted ? 2 * p.count : p.count;
}

// Candidate rows for select(): null when the scan should answer, else
// {sorted, rows, explain}. `test` is the compiled filter (rows returned match it).
function plan(access, coll, opts, test) {
  const filter = opts.filter;
  const spec = sortSpecOf(opts.sort);
  if (spec === undefined || opts.collation || !coll || (coll.options && coll.options.viewOn !== undefined)) return null;
  // A time-series collection's records are not keyed by _id (its _ids repeat): scanned.
  if (coll.options && coll.options.timeseries) return null;
  if ((!filter || !isPlainObject(filter) || !Object.keys(filter).length) && !spec) return null;
  const an = analyze(filter && isPlainObject(filter) ? filter : {});
  const reader = new Reader(access, coll, test);
  const scanCost = coll.records.size + (reader.own ? reader.own.size : 0);
  const scanTotal = spec ? 2 * scanCost : scanCost;
  let best = null;
  for (const p of indexPlans(coll, an, spec, reader)) {
    const cost = planCost(p, spec);
    if (cost < scanTotal && (!best || cost < best.cost || (cost === best.cost && p.sorted && !best.p.sorted))) best = { p, cost };
  }
  // _id values: looked up one by one (the _id index).
  const ids = an.conds.get('_id');
  if (ids && ids.points) {
    const cost = spec ? 2 * ids.points.length : ids.points.length;
    if (cost < scanTotal && (!best || cost < best.cost)) {
      const extras = reader.extras(null);
      return {
        sorted: false,
        rows: (function* byIds() {
          const seen = new Set();
          for (const r of idRows(access, reader, ids.points)) {
            seen.add(r.idKey);
            yield r;
          }
          for (const r of extras) if (!seen.has(r.idKey)) yield r;
        })(),
        reader,
        indexes: ['_id_'],
      };
    }
  }
  // A plan per $or branch, the union of their rows.
  if (an.or) {
    const branches = [];
    let total = 0;
    for (const b of an.or) {
      const bn = mergeConds(an, b);
      const bids = bn.conds.get('_id');
      if (bids && bids.points) {
        branches.push({ ids: bids.points, name: '_id_' });
        total += bids.points.length;
        continue;
      }
      let bb = null;
      for (const p of indexPlans(coll, bn, null, reader)) if (!bb || p.count < bb.count) bb = p;
      if (!bb) {
        total = Infinity;
        break;
      }
      branches.push(bb);
      total += bb.count;
    }
    if (spec) total *= 2;
    if (total < scanTotal && (!best || total < best.cost)) {
      const extras = reader.extras(null);
      return {
        sorted: false,
        rows: (function* union() {
          const seen = new Set();
          for (const p of branches) {
            for (const r of p.ids ? idRows(access, reader, p.ids) : iterate(reader, p, [])) {
              if (seen.has(r.idKey)) continue;
              seen.add(r.idKey);
              yield r;
            }
          }
          yield* extras;
        })(),
        reader,
        indexes: branches.map((p) => p.name),
      };
    }
  }
  if (!best) return null;
  return { sorted: best.p.sorted, rows: iterate(reader, best.p, best.p.extras), reader, indexes: [best.p.name] };
}

// The first row (in sort order) of each value of groupField among the rows matching filter,
// sorted; null when no index gives it with a distinct scan (one probe per value). What
// $sort + $group with $first only needs: the rest of a group never changes its result.
function firstPerGroup(access, coll, opts, test, groupField) {
  const spec = sortSpecOf(opts.sort);
  const filter = opts.filter;
  if (!spec || opts.collation || !coll || (coll.options && coll.options.viewOn !== undefined)) return null;
  if (!filter || !isPlainObject(filter) || !Object.keys(filter).length) return null;
  const an = analyze(filter);
  const reader = new Reader(access, coll, test);
  let best = null;
  for (const p of indexPlans(coll, an, spec, reader)) {
    if (!p.sorted) continue;
    const g = p.o.fields.indexOf(groupField);
    if (g < 0 || g > p.k) continue;
    if (!best || p.count < best.count) {
      best = p;
      best.g = g;
    }
  }
  if (!best) return null;
  const p = best;
  const { o, g, k } = p;
  const list = o.list;
  const firsts = [];
  for (const pts of p.subs) {
    const { start, end } = subBounds(p, pts);
    const pos = { c: start.c, p: start.p };
    while (list.before(pos, end)) {
      const e = list.at(pos);
      let r = reader.row(e);
      if (!r) {
        list.step(pos);
        continue;
      }
      if (p.tieSort) {
        // Entries equal in the sort follow in index order: the first in natural order wins.
        const q = { c: pos.c, p: pos.p };
        list.step(q);
        while (list.before(q, end)) {
          const e2 = list.at(q);
          if (!p.sortPos.every((i) => cmpVal(e2.k[i], e.k[i]) === 0)) break;
          const r2 = reader.row(e2);
          if (r2 && r2.seq < r.seq) r = r2;
          list.step(q);
        }
      }
      firsts.push(r);
      if (g < k) break; // the group is constant in this subrange
      const vals = pts.concat([e.k[k]]);
      const next = list.seek((x) => cmpPrefix(o, x, vals, k + 1) > 0);
      if (!list.before(pos, next)) list.step(pos);
      else {
        pos.c = next.c;
        pos.p = next.p;
      }
    }
  }
  const cmp = rowComparator(p);
  const byGroup = new Map();
  for (const r of firsts.concat(p.extras)) {
    const gk = V.canonicalKey(r.k[g]);
    const had = byGroup.get(gk);
    if (!had || cmp(r, had) < 0) byGroup.set(gk, r);
  }
  return { rows: [...byGroup.values()].sort(cmp), reader, indexes: [p.name] };
}

module.exports = { plan, firstPerGroup, analyze, implies };
