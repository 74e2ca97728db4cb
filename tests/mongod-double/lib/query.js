'use strict';
// Query execution over one collection as an Access sees it: filter (mingo on views, with
// direct lookups for _id and unique-index equality, and index plans: planner.js), sort (BSON
// order on the stored values),
// skip/limit, projection (mingo on views, mapped back to typed values) and aggregation.
// Cursor bookkeeping is in cursors.js.

const { Query, Aggregator } = require('mingo');
const V = require('./values');
const { err } = require('./errors');
const { isPlainObject } = require('./update');
const planner = require('./planner');

// Simple collations (strength 1 or 2) compare strings case-insensitively; strength 1 also
// ignores diacritics. mingo has no collation support, so both sides are folded beforehand.
function collationFolder(collation) {
  if (!collation || typeof collation !== 'object') return null;
  const strength = collation.strength === undefined ? 3 : V.toNumber(collation.strength);
  if (strength >= 3) return null;
  const fold = (s) => (strength === 1 ? s.normalize('NFD').replace(/[\u0300-\u036f]/g, '') : s).toLowerCase();
  const walk = (v) => {
    if (typeof v === 'string') return fold(v);
    if (Array.isArray(v)) return v.map(walk);
    if (v && typeof v === 'object' && v.constructor === Object) {
      const o = {};
      for (const k of Object.keys(v)) o[k] = walk(v[k]);
      return o;
    }
    return v;
  };
  return walk;
}

const TYPE_ALIASES = {
  1: 'double', 2: 'string', 3: 'object', 4: 'array', 5: 'binData', 6: 'undefined', 7: 'objectId', 8: 'bool',
  9: 'date', 10: 'null', 11: 'regex', 13: 'javascript', 14: 'symbol', 16: 'int', 17: 'timestamp', 18: 'long',
  19: 'decimal', '-1': 'minKey', 127: 'maxKey',
};

// mingo sees every number as a JS number, so `$type` on a top-level field is taken out of the
// filter and checked here against the stored, typed values.
function typeChecks(filter) {
  const checks = [];
  let rest = filter;
  for (const k of Object.keys(filter)) {
    const c = filter[k];
    if (k.startsWith('$') || !isPlainObject(c) || !Object.prototype.hasOwnProperty.call(c, '$type')) continue;
    const typeTest = typeCheck(k, c.$type);
    if (rest === filter) rest = Object.assign({}, filter);
    const others = Object.assign({}, c);
    delete others.$type;
    if (Object.keys(others).length) rest[k] = others;
    else delete rest[k];
    checks.push(typeTest);
  }
  return { checks, rest };
}

// `{path: {$type: spec}}` checked on the stored values: doc => boolean.
function typeCheck(path, spec) {
  const wanted = (Array.isArray(spec) ? spec : [spec]).map((t) => {
    const name = typeof t === 'string' ? t : TYPE_ALIASES[String(V.toNumber(t))];
    if (!name || !(name in V.TYPE_ORDER || name === 'number')) throw err(2, `Unknown type name alias: ${t}`);
    return name;
  });
  return (doc) => V.pathValues(doc, path).some((v) => {
    if (v === undefined) return false;
    const cands = Array.isArray(v) ? [v, ...v] : [v];
    return cands.some((x) => {
      const t = V.bsonTag(x);
      return wanted.includes(t) || (wanted.includes('number') && V.isNumeric(x));
    });
  });
}

// ---- exact comparisons ----
// mingo compares JS numbers, which cannot hold every Int64 (beyond 2^53) or any Decimal128
// exactly, compares embedded documents without regard to field order, and sees no BSON number
// types. When the filter or the document holds an inexact number, or the filter compares with
// an embedded document or asks for a $type below $and/$or/$nor, the filter is evaluated as a
// tree: $and/$or/$nor are combined here, field conditions comparing with a number or a document
// ($eq, $ne, $gt, $gte, $lt, $lte, $in, $nin, implicit equality) and $type are checked here on
// the stored values, exactly and in field order, and everything else is still asked of mingo.
const NUM_OPS = new Set(['$eq', '$ne', '$gt', '$gte', '$lt', '$lte']);
const EQ_OPS = new Set(['$eq', '$ne']);
const isDocLiteral = (c) => isPlainObject(c) && (!Object.keys(c).length || !V.keys(c)[0].startsWith('$'));

// Whether mingo alone would get this filter wrong for documents with exact-only numbers too.
function needsTree(filter, nested) {
  for (const k of Object.keys(filter)) {
    const c = filter[k];
    if (k === '$and' || k === '$or' || k === '$nor') {
      if (Array.isArray(c) && c.some((f) => isPlainObject(f) && needsTree(f, true))) return true;
      continue;
    }
    if (k.startsWith('$')) continue;
    if (isDocLiteral(c)) return true;
    if (!isPlainObject(c)) continue;
    for (const op of Object.keys(c)) {
      if (op === '$type' && nested) return true;
      if (EQ_OPS.has(op) && isDocLiteral(c[op])) return true;
      if ((op === '$in' || op === '$nin') && Array.isArray(c[op]) && c[op].some(isDocLiteral)) return true;
    }
  }
  return false;
}

// Stored values a path reaches, array elements included (as query matching sees them).
function candidatesAt(doc, path) {
  const out = [];
  for (const v of V.pathValues(doc, path)) {
    if (v === undefined) continue;
    if (Array.isArray(v)) out.push(...v);
    out.push(v);
  }
  return out;
}

function numTest(op, n) {
  const isNaNArg = Number.isNaN(V.toNumber(n));
  return (x) => {
    if (!V.isNumeric(x)) return false;
    if (isNaNArg || Number.isNaN(V.toNumber(x))) {
      const both = isNaNArg && Number.isNaN(V.toNumber(x));
      return (op === '$eq' || op === '$gte' || op === '$lte') && both;
    }
    const c = V.compareNumbers(x, n);
    switch (op) {
      case '$eq': return c === 0;
      case '$gt': return c > 0;
      case '$gte': return c >= 0;
      case '$lt': return c < 0;
      default: return c <= 0; // $lte
    }
  };
}

function exactTree(filter, leaf) {
  const parts = [];
  for (const k of Object.keys(filter)) {
    const c = filter[k];
    if ((k === '$and' || k === '$or' || k === '$nor') && Array.isArray(c) && c.every(isPlainObject)) {
      const subs = c.map((f) => exactTree(f, leaf));
      if (k === '$and') parts.push((v, d) => subs.every((t) => t(v, d)));
      else if (k === '$or') parts.push((v, d) => subs.some((t) => t(v, d)));
      else parts.push((v, d) => !subs.some((t) => t(v, d)));
    } else if (k.startsWith('$')) {
      const q = leaf({ [k]: c });
      parts.push((v) => q(v));
    } else parts.push(exactField(k, c, leaf));
  }
  return (v, d) => parts.every((t) => t(v, d));
}

// Equality with a document literal: same fields in the same order, values equal.
function docTest(lit) {
  return (x) => isPlainObject(x) && V.valuesEqual(x, lit);
}

function exactField(path, c, leaf) {
  if (V.isNumeric(c)) {
    const eq = numTest('$eq', c);
    return (v, d) => candidatesAt(d, path).some(eq);
  }
  if (isDocLiteral(c)) {
    const eq = docTest(c);
    return (v, d) => candidatesAt(d, path).some(eq);
  }
  if (!isPlainObject(c) || !Object.keys(c).length || !Object.keys(c).every((k) => k.startsWith('$'))) {
    const q = leaf({ [path]: c });
    return (v) => q(v);
  }
  const tests = [];
  const rest = {};
  for (const op of Object.keys(c)) {
    const a = c[op];
    if ((NUM_OPS.has(op) && V.isNumeric(a)) || (EQ_OPS.has(op) && isDocLiteral(a))) {
      const t = isDocLiteral(a) ? docTest(a) : numTest(op === '$ne' ? '$eq' : op, a);
      if (op === '$ne') tests.push((v, d) => !candidatesAt(d, path).some(t));
      else tests.push((v, d) => candidatesAt(d, path).some(t));
    } else if (op === '$type') {
      const t = typeCheck(path, a);
      tests.push((v, d) => t(d));
    } else if (op === '$not' && isPlainObject(a) && Object.keys(a).length && Object.keys(a).every((k) => k.startsWith('$'))) {
      const t = exactField(path, a, leaf);
      tests.push((v, d) => !t(v, d));
    } else if (op === '$elemMatch' && isPlainObject(a) && Object.keys(a).length) {
      tests.push(elemMatchTest(path, a, leaf));
    } else if ((op === '$in' || op === '$nin') && Array.isArray(a) && a.some((x) => V.isNumeric(x) || isDocLiteral(x))) {
      const mine = (x) => V.isNumeric(x) || isDocLiteral(x);
      const nums = a.filter(mine).map((n) => (isDocLiteral(n) ? docTest(n) : numTest('$eq', n)));
      const others = a.filter((x) => !mine(x));
      const q = others.length ? leaf({ [path]: { $in: others } }) : null;
      const inTest = (v, d) => candidatesAt(d, path).some((x) => nums.some((t) => t(x))) || (q ? q(v) : false);
      tests.push(op === '$in' ? inTest : (v, d) => !inTest(v, d));
    } else rest[op] = a;
  }
  if (Object.keys(rest).length) {
    const q = leaf({ [path]: rest });
    tests.push((v) => q(v));
  }
  return (v, d) => tests.every((t) => t(v, d));
}

// $elemMatch on the stored array elements: a query on each document element, or (operator
// form) conditions on each element itself.
function elemMatchTest(path, spec, leaf) {
  const opForm = Object.keys(spec).every((k) => k.startsWith('$') && k !== '$and' && k !== '$or' && k !== '$nor' && k !== '$expr' && k !== '$where');
  let test;
  if (opForm) {
    // The element stands at a one-field wrapper; leaves see the wrapper's view.
    const t = exactField('e', spec, (f) => leaf(f));
    test = (e) => t({ e: V.toView(e) }, { e });
  } else {
    const t = exactTree(spec, leaf);
    test = (e) => isPlainObject(e) && t(V.toView(e), e);
  }
  return (v, d) => V.pathValues(d, path).some((arr) => Array.isArray(arr) && arr.some((e) => e !== undefined && test(e)));
}

function compileFilter(filter, opts = {}) {
  if (filter === undefined || filter === null) return null;
  if (!isPlainObject(filter)) throw err(14, "BSON field 'filter' is the wrong type, expected type 'object'");
  if (!Object.keys(filter).length) return null;
  const byIds = idSetFilter(filter, opts);
  if (byIds) return byIds;
  return compileFilterTree(filter, opts);
}

// `_id: {$in: [...]}` or `{$nin: [...]}` of plain values (what direct() looks up by _id):
// tested with a set of the ids' canonical keys, as the _id index answers it, instead of a
// linear $in per document (an update of 4,000 ids would compare 16 million pairs). The rest
// of the filter is compiled as usual; without the stored document the whole filter is used.
function idSetFilter(filter, opts) {
  if (opts.collation || !Object.prototype.hasOwnProperty.call(filter, '_id')) return null;
  const c = filter._id;
  if (!isPlainObject(c)) return null;
  const keys = Object.keys(c);
  if (keys.length !== 1 || (keys[0] !== '$in' && keys[0] !== '$nin')) return null;
  const list = c[keys[0]];
  if (!Array.isArray(list) || list.length < 16 || !list.every((x) => equalityValue(x) !== undefined)) return null;
  const ids = new Set(list.map((x) => V.canonicalKey(x)));
  const negate = keys[0] === '$nin';
  const rest = Object.assign({}, filter);
  delete rest._id;
  const restQ = Object.keys(rest).length ? compileFilterTree(rest, opts) : null;
  let whole = null;
  return {
    test: (view, doc) => {
      if (!doc || doc._id === undefined) {
        if (!whole) whole = compileFilterTree(filter, opts);
        return whole.test(view, doc);
      }
      if (ids.has(V.canonicalKey(doc._id)) === negate) return false;
      return !restQ || restQ.test(view, doc);
    },
  };
}

function compileFilterTree(filter, opts) {
  const fold = collationFolder(opts.collation);
  const { checks, rest } = typeChecks(filter);
  const mingoOpts = opts.variables ? { variables: opts.variables } : undefined;
  const leaf = (f) => {
    let q;
    try {
      const view = V.toView(f);
      q = new Query(fold ? fold(view) : view, mingoOpts);
    } catch (e) {
      throw err(2, e.message);
    }
    return (view) => q.test(fold ? fold(view) : view);
  };
  let q = null;
  let treeAlways = false;
  if (Object.keys(rest).length) {
    try {
      const view = V.toView(rest);
      treeAlways = !!(view && view[V.INEXACT]) || needsTree(rest, false);
      q = new Query(fold ? fold(view) : view, mingoOpts);
    } catch (e) {
      throw err(2, e.message);
    }
  }
  if (!fold && !checks.length && !treeAlways && !q) return null;
  let exact = null; // built when a filter or document first needs it
  const viaMingo = (view) => !q || q.test(fold ? fold(view) : view);
  return {
    test: (view, doc) => {
      let ok;
      if (q && doc && (treeAlways || (view && view[V.INEXACT]))) {
        if (!exact) exact = exactTree(rest, leaf);
        ok = exact(view, doc);
      } else ok = viaMingo(view);
      return ok && checks.every((c) => c(doc));
    },
  };
}

// Values of a `let` document: each is an expression evaluated once per command.
function evalLet(letDoc) {
  if (!letDoc || !isPlainObject(letDoc) || !Object.keys(letDoc).length) return undefined;
  try {
    return new Aggregator([{ $set: V.toView(letDoc) }]).run([{}])[0];
  } catch (e) {
    throw err(2, e.message);
  }
}

// A scalar equality value the _id lookup may use, or undefined.
function equalityValue(cond) {
  if (cond === undefined) return undefined;
  if (isPlainObject(cond)) {
    const keys = Object.keys(cond);
    if (keys.length === 1 && keys[0] === '$eq' && !isPlainObject(cond.$eq) && !Array.isArray(cond.$eq)) return cond.$eq;
    return undefined;
  }
  if (Array.isArray(cond)) return undefined;
  const t = V.bsonTag(cond);
  if (t === 'regex' || t === 'null' || t === 'undefined') return undefined;
  return cond;
}

// Candidate records of a direct lookup, when the filter pins _id (or every field of a unique
// index, outside transactions); null when it does not.
function direct(access, coll, filter) {
  // A time-series collection's records are not keyed by _id (its _ids may repeat): scan.
  if (coll.options && coll.options.timeseries) return null;
  if (filter && Object.prototype.hasOwnProperty.call(filter, '_id')) {
    const c = filter._id;
    const eq = equalityValue(c);
    if (eq !== undefined) {
      const idKey = V.canonicalKey(eq);
      const v = access.get(coll, idKey);
      return v ? [{ idKey, doc: v.doc, view: v.view || (v.view = V.toView(v.doc)) }] : [];
    }
    if (isPlainObject(c) && Object.keys(c).length === 1 && Array.isArray(c.$in) &&
        c.$in.every((x) => equalityValue(x) !== undefined)) {
      const seen = new Set();
      const found = [];
      for (const x of c.$in) {
        const idKey = V.canonicalKey(x);
        if (seen.has(idKey)) continue;
        seen.add(idKey);
        const v = access.get(coll, idKey);
        if (v) found.push({ idKey, doc: v.doc, view: v.view || (v.view = V.toView(v.doc)) });
      }
      // Natural order, not $in order: a record's seq is its place in the scan; a transaction's
      // own inserts come last, in the order it wrote them.
      const own = access.txn ? access.txn.writes.get(coll) : null;
      let ownOrder = null;
      const seqOf = (idKey) => {
        const head = coll.records.get(idKey);
        if (head) return head.seq;
        if (!ownOrder) ownOrder = new Map([...(own ? own.keys() : [])].filter((k) => !coll.records.has(k)).map((k, n) => [k, n]));
        return 2 ** 52 + (ownOrder.get(idKey) || 0);
      };
      for (const r of found) r.seq = seqOf(r.idKey);
      found.sort((a, b) => a.seq - b.seq);
      return found;
    }
  }
  if (filter && !access.txn) {
    // Equality on every field of a unique index (latest committed state only).
    for (const ix of coll.uniqueIndexes()) {
      if (ix.partialQuery || ix.sparse) continue;
      const vals = ix.fields.map((f) => equalityValue(filter[f]));
      if (vals.some((v) => v === undefined)) continue;
      const key = vals.map(V.canonicalKey).join('|');
      const idKey = ix.entries.get(key);
      if (idKey === undefined) return [];
      const v = access.get(coll, idKey);
      return v ? [{ idKey, doc: v.doc, view: v.view || (v.view = V.toView(v.doc)) }] : [];
    }
  }
  return null;
}

// Matching records as [{idKey, doc, view}], honouring sort/skip/limit: from a direct lookup,
// an index plan (planner.js) or a scan. A view (viewOn) is materialised through its pipeline
// first. opts.stats, when given, learns how the query was answered (explain).
function select(access, coll, opts) {
  if (!coll) return [];
  const q = compileFilter(opts.filter, opts);
  const sortCmp = V.makeSortComparator(opts.sort);
  const skip = opts.skip || 0;
  const limit = opts.limit || 0;
  const stats = opts.stats || {};
  let source = null;
  if (coll.options && typeof coll.options.viewOn === 'string') {
    const base = access.coll(coll.db, coll.options.viewOn, false);
    const docs = aggregate(select(access, base, {}).map((r) => r.doc), coll.options.pipeline || [], {});
    source = docs.map((doc) => ({ idKey: null, doc, view: V.toView(doc) }));
    stats.stage = 'COLLSCAN';
  } else {
    source = direct(access, coll, opts.collation ? null : opts.filter);
    if (source) stats.stage = 'IDHACK';
    else {
      const planned = planner.plan(access, coll, opts, q ? (view, doc) => q.test(view, doc) : null);
      if (planned) {
        const out = fromPlan(planned, sortCmp, skip, limit);
        Object.assign(stats, { stage: 'IXSCAN', indexes: planned.indexes, keys: planned.reader.keys, docs: planned.reader.docs });
        examined(access, stats);
        return out;
      }
      stats.stage = 'COLLSCAN';
      source = access.scan(coll);
    }
  }
  const out = [];
  const stopAt = !sortCmp && limit ? skip + limit : Infinity;
  let docs = 0;
  for (const r of source) {
    docs++;
    if (q && !q.test(r.view, r.doc)) continue;
    out.push(r);
    if (out.length >= stopAt) break;
  }
  stats.docs = docs;
  stats.keys = stats.stage === 'IDHACK' ? docs : 0;
  examined(access, stats);
  if (sortCmp) out.sort((a, b) => sortCmp(a.doc, b.doc));
  if (skip || limit) return out.slice(skip, limit ? skip + limit : undefined);
  return out;
}

// What queries looked at, for doubleStats: index entries and documents.
function examined(access, stats) {
  const ex = access.store.examined || (access.store.examined = { keys: 0, docs: 0 });
  ex.keys += stats.keys || 0;
  ex.docs += stats.docs || 0;
}

// The rows of an index plan in the order the scan would give them (see planner.js).
function fromPlan(planned, sortCmp, skip, limit) {
  const out = [];
  if (planned.sorted || (!sortCmp && limit)) {
    const stopAt = limit ? skip + limit : Infinity;
    for (const r of planned.rows) {
      out.push(r);
      if (out.length >= stopAt) break;
    }
  } else {
    for (const r of planned.rows) out.push(r);
    out.sort((a, b) => a.seq - b.seq);
    if (sortCmp) out.sort((a, b) => sortCmp(a.doc, b.doc));
  }
  if (skip || limit) return out.slice(skip, limit ? skip + limit : undefined);
  return out;
}

// The input of an aggregation on a collection: its leading $match (without $expr) is answered
// by select(), with a $sort and a $limit that follow it (both stay in the pipeline), and
// $match + $sort + $group whose accumulators are all $first by the first document of each
// group alone (planner.firstPerGroup: a distinct scan; the $sort then orders those, so the
// groups come out as before). Returns {inputs, stages}: the documents and the stages still to
// run on them.
function pipelineInput(access, coll, pipeline, vars, collation) {
  let stages = pipeline.slice();
  let filter;
  if (stages.length && stages[0].$match && isPlainObject(stages[0].$match) && !JSON.stringify(V.toView(stages[0].$match)).includes('"$expr"')) {
    filter = stages[0].$match;
    stages = stages.slice(1);
  }
  const opts = { filter, variables: vars, collation };
  const only = (st, name) => (st && isPlainObject(st) && V.keys(st).length === 1 ? st[name] : undefined);
  const sortStage = isPlainObject(only(stages[0], '$sort')) ? stages[0].$sort : null;
  if (filter && sortStage && coll && !collation) {
    const field = firstOnlyGroup(only(stages[1], '$group'));
    if (field) {
      const q = compileFilter(filter, opts);
      const r = planner.firstPerGroup(access, coll, { filter, sort: sortStage }, q ? (view, doc) => q.test(view, doc) : null, field);
      if (r) {
        examined(access, { keys: r.reader.keys, docs: r.reader.docs });
        return { inputs: r.rows.map((x) => x.doc), stages };
      }
    }
  }
  const lim = only(stages[sortStage ? 1 : 0], '$limit');
  if (sortStage) opts.sort = sortStage;
  if (lim !== undefined && V.isNumeric(lim) && Number.isInteger(V.toNumber(lim)) && V.toNumber(lim) > 0) opts.limit = V.toNumber(lim);
  return { inputs: select(access, coll, opts).map((r) => r.doc), stages };
}

// The grouped field of {_id: '$field', name: {$first: ...}, ...}, or null.
function firstOnlyGroup(group) {
  if (!isPlainObject(group) || typeof group._id !== 'string' || !/^\$[^$][^$]*$/.test(group._id)) return null;
  for (const k of V.keys(group)) {
    if (k === '_id') continue;
    const acc = group[k];
    if (!isPlainObject(acc) || V.keys(acc).length !== 1 || acc.$first === undefined) return null;
  }
  return group._id.slice(1);
}

function hasKeys(o) { return o && isPlainObject(o) && Object.keys(o).length > 0; }

// Applies a find-style projection to typed documents.
// The filter is needed again for positional (`a.$`) projections.
function project(records, projection, filter) {
  if (!hasKeys(projection)) return records.map((r) => r.doc);
  let results;
  try {
    const views = records.map((r) => r.view);
    const positional = Object.keys(projection).some((k) => k.endsWith('.$'));
    // CLONE_INPUT: mingo's exclusion projection edits nested input objects, and these views
    // are the cached ones every later query matches against.
    const q = new Query(positional && filter ? V.toView(filter) : {}, { processingMode: 1 });
    results = q.find(views, V.toView(projection)).all();
  } catch (e) {
    throw err(2, e.message);
  }
  return results.map((r, i) => inDocOrder(V.fromView(r, records[i].doc), records[i].doc));
}

// mongod keeps the stored field order in projected documents; mingo lists _id last.
function inDocOrder(out, orig) {
  if (!isPlainObject(out) || !isPlainObject(orig)) return out;
  const entries = [];
  const seen = new Set();
  for (const k of V.keys(orig)) {
    if (Object.prototype.hasOwnProperty.call(out, k)) {
      entries.push([k, inDocOrder(out[k], orig[k])]);
      seen.add(k);
    }
  }
  for (const k of V.keys(out)) if (!seen.has(k)) entries.push([k, out[k]]);
  return V.fromEntries(entries);
}

// Runs an aggregation pipeline over typed input documents; output typed via the views.
function aggregate(inputDocs, pipeline, opts) {
  const byId = new Map();
  const views = inputDocs.map((d) => {
    const v = V.toView(d);
    if (d && d._id !== undefined) byId.set(V.canonicalKey(d._id), d);
    return v;
  });
  let out;
  try {
    out = new Aggregator(pipeline.map((s) => V.toView(s)), {
      processingMode: 1,
      collectionResolver: opts.resolver,
      variables: opts.variables,
    }).run(views);
  } catch (e) {
    if (e && e.code) throw e;
    throw err(opts.errCode || 2, e.message);
  }
  const order = specOrder(pipeline);
  return out.map((d) => {
    const hint = d && d._id !== undefined ? byId.get(V.canonicalKey(V.fromView(d._id))) : undefined;
    return V.fromView(d, hint, order);
  });
}

// Field names in the order the stages that make fields list them ($addFields/$set, $project,
// $group, literal $replaceRoot/$replaceWith): mingo's output objects put integer-like new
// fields first, mongod puts them where the specification has them.
function specOrder(pipeline) {
  const names = [];
  for (const stage of pipeline) {
    if (!isPlainObject(stage)) continue;
    const op = V.keys(stage)[0];
    let spec = stage[op];
    if (op === '$replaceRoot' && isPlainObject(spec)) spec = spec.newRoot;
    if (!['$addFields', '$set', '$project', '$group', '$replaceRoot', '$replaceWith'].includes(op) || !isPlainObject(spec)) continue;
    for (const k of V.keys(spec)) if (!names.includes(k)) names.push(k);
  }
  return names.length ? names : undefined;
}

module.exports = { compileFilter, select, pipelineInput, project, aggregate, equalityValue, evalLet, collationFolder };
