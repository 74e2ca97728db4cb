'use strict';
// Update application on typed documents: operator updates ($set, $inc, $push, ... with `$`,
// `$[]` and `$[id]` positional paths), replacements, pipeline updates, and the upsert seed
// document. Operators are implemented here rather than with mingo's updater because they must
// keep BSON number types ($inc: Int32+Int32 overflowing becomes Int64, Double stays Double) and
// mingo only sees plain JS numbers. Embedded conditions (arrayFilters, $pull) go through
// query.js's filter (mingo plus exact comparisons), positional `$` matching and pipeline
// updates through mingo. New fields are appended in mongod's order (see comparePaths).

const { Query, Aggregator } = require('mingo');
const V = require('./values');
const { err } = require('./errors');
const { Int32, Long, Double, Decimal128, Timestamp, ObjectId } = require('bson');

const OPERATORS = new Set(['$set', '$unset', '$inc', '$mul', '$min', '$max', '$rename', '$setOnInsert', '$push',
  '$addToSet', '$pop', '$pull', '$pullAll', '$currentDate', '$bit']);

function isPlainObject(v) {
  return v !== null && typeof v === 'object' && !Array.isArray(v) && !v._bsontype && !(v instanceof Date) && !(v instanceof RegExp);
}

function kindOfUpdate(u) {
  if (Array.isArray(u)) return 'pipeline';
  if (!isPlainObject(u)) throw err(9, 'Update argument must be either an object or an array');
  const keys = V.keys(u);
  if (keys.length && keys[0].startsWith('$')) return 'operator';
  return 'replacement';
}

function typeName(v) { return V.bsonTag(v); }

// ---- arithmetic that keeps BSON numeric types ----
function arith(a, b, op) {
  const ta = typeName(a);
  const tb = typeName(b);
  if (ta === 'decimal' || tb === 'decimal') {
    const x = V.toNumber(a);
    const y = V.toNumber(b);
    return Decimal128.fromString(String(op === 'add' ? x + y : x * y));
  }
  if (ta === 'double' || tb === 'double') {
    const x = V.toNumber(a);
    const y = V.toNumber(b);
    return new Double(op === 'add' ? x + y : x * y);
  }
  const x = V.toBigIntExact(a);
  const y = V.toBigIntExact(b);
  const r = op === 'add' ? x + y : x * y;
  if (ta === 'int' && tb === 'int' && r >= -2147483648n && r <= 2147483647n) return new Int32(Number(r));
  if (r >= -(2n ** 63n) && r < 2n ** 63n) return Long.fromBigInt(r);
  return new Double(Number(r));
}

// ---- path helpers ----
function splitPath(p) { return p.split('.'); }

function getChild(container, seg) {
  if (Array.isArray(container)) return /^\d+$/.test(seg) ? container[+seg] : undefined;
  if (isPlainObject(container)) return Object.prototype.hasOwnProperty.call(container, seg) ? container[seg] : undefined;
  return undefined;
}

function hasChild(container, seg) {
  if (Array.isArray(container)) return /^\d+$/.test(seg) && +seg < container.length;
  if (isPlainObject(container)) return Object.prototype.hasOwnProperty.call(container, seg);
  return false;
}

// Expands positional segments against the document into concrete paths.
function expandPath(doc, segs, ctx) {
  let paths = [[]];
  for (let i = 0; i < segs.length; i++) {
    const seg = segs[i];
    const next = [];
    for (const p of paths) {
      const container = resolve(doc, p);
      if (seg === '$') {
        if (ctx.isInsert) throw err(2, "The positional operator did not find the match needed from the query.");
        const idx = positionalIndex(ctx, p, container);
        next.push(p.concat(String(idx)));
      } else if (seg === '$[]' || /^\$\[[^\]]+\]$/.test(seg)) {
        if (!Array.isArray(container)) {
          if (container === undefined && ctx.isInsert) continue;
          throw err(2, `The path '${p.join('.') || segs.slice(0, i).join('.')}' must exist in the document in order to apply array updates.`);
        }
        const id = seg === '$[]' ? null : seg.slice(2, -1);
        const filter = id === null ? null : ctx.filters.get(id);
        if (id !== null && !filter) throw err(2, `No array filter found for identifier '${id}' in path '${segs.join('.')}'`);
        if (filter) filter.used = true;
        container.forEach((e, k) => {
          if (!filter || filterMatches(filter.query, { [id]: e })) next.push(p.concat(String(k)));
        });
      } else next.push(p.concat(seg));
    }
    paths = next;
  }
  return paths;
}

function resolve(doc, path) {
  let v = doc;
  for (const s of path) {
    v = getChild(v, s);
    if (v === undefined) return undefined;
  }
  return v;
}

// Index of the array element the query matched, for the `$` operator.
function positionalIndex(ctx, prefix, arr) {
  if (!Array.isArray(arr) || !ctx.queryView) throw err(2, 'The positional operator did not find the match needed from the query.');
  const name = prefix.join('.');
  const conds = {};
  collectConds(ctx.queryView, name, conds);
  if (!Object.keys(conds).length) throw err(2, 'The positional operator did not find the match needed from the query.');
  const q = new Query(conds);
  for (let i = 0; i < arr.length; i++) {
    const probe = {};
    setViewPath(probe, name, [V.toView(arr[i])]);
    if (q.test(probe)) return i;
  }
  throw err(2, 'The positional operator did not find the match needed from the query.');
}

function collectConds(q, name, out) {
  if (!isPlainObject(q)) return;
  for (const k of Object.keys(q)) {
    if (k === '$and') {
      for (const sub of q[k]) collectConds(sub, name, out);
    } else if (k === name || k.startsWith(name + '.')) out[k] = q[k];
  }
}

function setViewPath(obj, path, value) {
  const segs = path.split('.');
  let o = obj;
  for (let i = 0; i < segs.length - 1; i++) o = o[segs[i]] = {};
  o[segs[segs.length - 1]] = value;
}

// Parent container of a concrete path, creating missing objects when create is set.
function parentOf(doc, path, create, fullPath) {
  let v = doc;
  for (let i = 0; i < path.length - 1; i++) {
    const s = path[i];
    let c = getChild(v, s);
    if (c === undefined || c === null) {
      if (!create) return null;
      if (c === null && hasChild(v, s)) {
        throw err(28, `Cannot create field '${path[i + 1]}' in element {${s}: null}`);
      }
      c = {};
      setChild(v, s, c);
    } else if (!isPlainObject(c) && !Array.isArray(c)) {
      if (!create) return null;
      throw err(28, `Cannot create field '${path[i + 1]}' in element {${s}: ${showShort(c)}}`);
    }
    v = c;
  }
  return v;
}

function showShort(v) {
  const t = typeName(v);
  if (t === 'string') return JSON.stringify(v);
  return String(V.isNumeric(v) ? V.toNumber(v) : v);
}

function setChild(container, seg, value) {
  if (Array.isArray(container)) {
    if (!/^\d+$/.test(seg)) throw err(28, `Cannot create field '${seg}' in element {${seg}: [...]}`);
    const i = +seg;
    while (container.length < i) container.push(null);
    container[i] = value;
  } else V.setKey(container, seg, value); // a new field goes to the end, integer-like or not
}

function deleteChild(container, seg) {
  if (Array.isArray(container)) {
    if (/^\d+$/.test(seg) && +seg < container.length) container[+seg] = null;
  } else if (isPlainObject(container)) V.deleteKey(container, seg);
}

function checkConflicts(paths) {
  const sorted = paths.slice().sort();
  for (let i = 1; i < sorted.length; i++) {
    const a = sorted[i - 1];
    const b = sorted[i];
    if (a === b || b.startsWith(a + '.')) {
      throw err(40, `Updating the path '${b}' would create a conflict at '${a}'`);
    }
  }
}

function docIdText(doc) {
  return `{_id: ${showShort(doc._id)}}`;
}

// Applies an operator update in place on `doc` (a private deep copy).
function applyOperators(doc, update, ctx) {
  const touched = [];
  for (const op of Object.keys(update)) {
    if (!OPERATORS.has(op)) {
      throw err(9, `Unknown modifier: ${op}. Expected a valid update modifier or pipeline-style update specified as an array`);
    }
    const spec = update[op];
    if (!isPlainObject(spec)) throw err(9, `Modifiers operate on fields but we found type ${typeName(spec)} instead. For example: {$mod: {<field>: ...}} not {${op}: ${showShort(spec)}}`);
    for (const f of Object.keys(spec)) {
      if (f === '') throw err(56, "An empty update path is not valid.");
      touched.push(f.replace(/\.\$(\[[^\]]*\])?/g, '.$'));
      if (op === '$rename') touched.push(String(V.toView(spec[f])));
    }
  }
  checkConflicts(touched);
  // mongod 5.0+ processes the fields of all operators together, string names in lexicographic
  // order and numeric names in numeric order; new fields are appended in that order.
  const steps = [];
  for (const op of Object.keys(update)) {
    if (op === '$setOnInsert' && !ctx.isInsert) continue;
    for (const field of Object.keys(update[op])) steps.push({ op, field, arg: update[op][field] });
  }
  steps.sort((a, b) => comparePaths(a.field, b.field));
  for (const { op, field, arg } of steps) {
    if (op === '$rename') {
      applyRename(doc, field, arg);
      continue;
    }
    for (const path of expandPath(doc, splitPath(field), ctx)) {
      if (path[0] === '_id' && !ctx.isInsert && op !== '$setOnInsert') ctx.idTouched = true;
      applyOne(doc, op, path, arg, field, ctx);
    }
  }
  for (const [id, f] of ctx.filters) {
    if (!f.used) throw err(9, `The array filter for identifier '${id}' was not used in the update ${JSON.stringify(V.toView(update))}`);
  }
}

// Field path order of mongod's update tree: per segment, two numeric names compare as numbers,
// anything else as strings.
function comparePaths(a, b) {
  const x = a.split('.');
  const y = b.split('.');
  for (let i = 0; i < Math.min(x.length, y.length); i++) {
    if (x[i] === y[i]) continue;
    if (/^\d+$/.test(x[i]) && /^\d+$/.test(y[i])) {
      const p = BigInt(x[i]);
      const q = BigInt(y[i]);
      if (p !== q) return p < q ? -1 : 1;
    }
    return x[i] < y[i] ? -1 : 1;
  }
  return x.length - y.length;
}

function applyRename(doc, from, to) {
  if (typeof to !== 'string') throw err(2, `The 'to' field for $rename must be a string: ${from}: ${showShort(to)}`);
  if (from === to) throw err(2, `The source and target field for $rename must differ: ${from}: "${to}"`);
  const fp = splitPath(from);
  const parent = parentOf(doc, fp, false);
  if (!parent || Array.isArray(parent) || !hasChild(parent, fp[fp.length - 1])) return;
  const value = parent[fp[fp.length - 1]];
  V.deleteKey(parent, fp[fp.length - 1]);
  const tp = splitPath(to);
  const tparent = parentOf(doc, tp, true);
  setChild(tparent, tp[tp.length - 1], value);
}

function applyOne(doc, op, path, arg, field, ctx) {
  const last = path[path.length - 1];
  if (op === '$unset') {
    const parent = parentOf(doc, path, false);
    if (parent) deleteChild(parent, last);
    return;
  }
  const parent = parentOf(doc, path, true);
  const exists = hasChild(parent, last);
  const cur = exists ? getChild(parent, last) : undefined;
  switch (op) {
    case '$set':
    case '$setOnInsert':
      setChild(parent, last, V.cloneValue(arg));
      return;
    case '$inc':
    case '$mul': {
      if (!V.isNumeric(arg)) {
        throw err(14, `Cannot ${op === '$inc' ? 'increment' : 'multiply'} with non-numeric argument: {${field}: ${showShort(arg)}}`);
      }
      if (!exists) {
        setChild(parent, last, op === '$inc' ? V.cloneValue(arg) : arith(arg, new Int32(0), 'mul'));
        return;
      }
      if (!V.isNumeric(cur)) {
        throw err(14, `Cannot apply ${op} to a value of non-numeric type. ${docIdText(doc)} has the field '${last}' of non-numeric type ${typeName(cur)}`);
      }
      setChild(parent, last, arith(cur, arg, op === '$inc' ? 'add' : 'mul'));
      return;
    }
    case '$min':
    case '$max': {
      if (!exists) {
        setChild(parent, last, V.cloneValue(arg));
        return;
      }
      const c = V.compareValues(arg, cur);
      if ((op === '$min' && c < 0) || (op === '$max' && c > 0)) setChild(parent, last, V.cloneValue(arg));
      return;
    }
    case '$currentDate': {
      const isTs = isPlainObject(arg) && arg.$type === 'timestamp';
      setChild(parent, last, isTs ? ctx.now.ts : new Date(ctx.now.ms));
      return;
    }
    case '$bit': {
      if (exists && !V.isNumeric(cur)) throw err(14, `Cannot apply $bit to a value of non-integral type.${docIdText(doc)} has the field ${last} of non-integer type ${typeName(cur)}`);
      let v = exists ? cur : new Int32(0);
      for (const k of Object.keys(arg)) {
        const x = V.toBigIntExact(v);
        const y = V.toBigIntExact(arg[k]);
        const r = k === 'and' ? x & y : k === 'or' ? x | y : x ^ y;
        const wide = typeName(v) === 'long' || typeName(arg[k]) === 'long';
        v = wide ? Long.fromBigInt(BigInt.asIntN(64, r)) : new Int32(Number(BigInt.asIntN(32, r)));
      }
      setChild(parent, last, v);
      return;
    }
    default:
      break;
  }
  // Array operators.
  if (exists && !Array.isArray(cur)) {
    throw err(2, `The field '${last}' must be an array but is of type ${typeName(cur)} in document ${docIdText(doc)}`);
  }
  const arr = exists ? cur : null;
  switch (op) {
    case '$push': {
      const out = arr ? arr : [];
      let each;
      let position;
      let slice;
      let sort;
      if (isPlainObject(arg) && Object.prototype.hasOwnProperty.call(arg, '$each')) {
        each = arg.$each.map(V.cloneValue);
        if (arg.$position !== undefined) position = V.toNumber(arg.$position);
        if (arg.$slice !== undefined) slice = V.toNumber(arg.$slice);
        if (arg.$sort !== undefined) sort = arg.$sort;
      } else each = [V.cloneValue(arg)];
      if (position === undefined || position > out.length) out.push(...each);
      else {
        const at = position < 0 ? Math.max(0, out.length + position) : position;
        out.splice(at, 0, ...each);
      }
      if (sort !== undefined) {
        if (isPlainObject(sort)) {
          const cmp = V.makeSortComparator(sort);
          if (cmp) out.sort(cmp);
        } else {
          const d = V.toNumber(sort) < 0 ? -1 : 1;
          out.sort((a, b) => V.compareValues(a, b) * d);
        }
      }
      if (slice !== undefined) {
        const kept = slice >= 0 ? out.slice(0, slice) : out.slice(Math.max(0, out.length + slice));
        out.length = 0;
        out.push(...kept);
      }
      if (!arr) setChild(parent, last, out);
      return;
    }
    case '$addToSet': {
      const out = arr ? arr : [];
      const each = isPlainObject(arg) && Object.prototype.hasOwnProperty.call(arg, '$each') ? arg.$each : [arg];
      for (const e of each) if (!out.some((x) => V.valuesEqual(x, e))) out.push(V.cloneValue(e));
      if (!arr) setChild(parent, last, out);
      return;
    }
    case '$pop': {
      if (!arr || !arr.length) return;
      if (V.toNumber(arg) < 0) arr.shift();
      else arr.pop();
      return;
    }
    case '$pull': {
      if (!arr) return;
      const keep = arr.filter((e) => !pullMatches(e, arg));
      if (keep.length !== arr.length) setChild(parent, last, keep);
      return;
    }
    case '$pullAll': {
      if (!arr) return;
      if (!Array.isArray(arg)) throw err(2, `$pullAll requires an array argument but was given a ${typeName(arg)}`);
      const keep = arr.filter((e) => !arg.some((x) => V.valuesEqual(x, e)));
      if (keep.length !== arr.length) setChild(parent, last, keep);
      return;
    }
    default:
      throw err(9, `Unknown modifier: ${op}`);
  }
}

// Conditions inside updates (arrayFilters, $pull) go through the same filter as queries, so
// they compare Int64, Decimal128 and embedded documents exactly too. Required lazily: query.js
// requires this file.
function compiled(filter) {
  return require('./query').compileFilter(filter);
}

function filterMatches(q, doc) {
  return !q || q.test(V.toView(doc), doc);
}

function pullMatches(elem, cond) {
  if (isPlainObject(cond)) {
    const keys = Object.keys(cond);
    const isOps = keys.length && keys.every((k) => k.startsWith('$'));
    if (isOps) return filterMatches(compiled({ v: cond }), { v: elem });
    if (!isPlainObject(elem)) return false;
    return filterMatches(compiled(cond), elem);
  }
  return V.valuesEqual(elem, cond);
}

function checkStoredDoc(doc) {
  for (const k of Object.keys(doc)) {
    if (k === '_id' && Array.isArray(doc._id)) throw err(53, `The '_id' value cannot be of type array`);
  }
}

// Returns the updated copy of `oldDoc` (never mutates it).
function applyUpdate(oldDoc, update, opts) {
  const ctx = {
    isInsert: !!opts.isInsert,
    queryView: opts.queryView || null,
    filters: new Map(),
    now: opts.now || { ms: Date.now(), ts: new Timestamp({ t: Math.floor(Date.now() / 1000), i: 1 }) },
    idTouched: false,
  };
  for (const f of opts.arrayFilters || []) {
    const keys = Object.keys(f);
    if (!keys.length) throw err(9, 'Cannot use an expression without a top-level field name in arrayFilters');
    const id = keys[0].split('.')[0];
    if (ctx.filters.has(id)) {
      const prev = ctx.filters.get(id);
      prev.raw = Object.assign({}, prev.raw, f);
      prev.query = compiled(prev.raw);
    } else ctx.filters.set(id, { raw: f, query: compiled(f), used: false });
  }
  const kind = kindOfUpdate(update);
  let doc;
  if (kind === 'replacement') {
    const entries = [];
    if (oldDoc && oldDoc._id !== undefined) entries.push(['_id', oldDoc._id]);
    for (const k of V.keys(update)) {
      if (k === '_id' && oldDoc && oldDoc._id !== undefined) {
        if (!V.valuesEqual(update._id, oldDoc._id)) throw immutableId(oldDoc);
        continue;
      }
      entries.push([k, V.cloneValue(update[k])]);
    }
    doc = V.fromEntries(entries);
  } else if (kind === 'operator') {
    doc = V.cloneValue(oldDoc || {});
    applyOperators(doc, update, ctx);
    if (oldDoc && oldDoc._id !== undefined && !V.valuesEqual(doc._id, oldDoc._id)) throw immutableId(oldDoc);
  } else {
    const base = oldDoc || {};
    const stages = update.map((s) => V.toView(s));
    let out;
    try {
      out = new Aggregator(stages, { processingMode: 1, variables: opts.variables }).run([V.toView(base)]);
    } catch (e) {
      throw err(40324, e.message);
    }
    doc = V.fromView(out[0] || {}, base);
    if (oldDoc && oldDoc._id !== undefined) {
      if (doc._id === undefined) doc = V.fromEntries([['_id', oldDoc._id], ...V.keys(doc).map((k) => [k, doc[k]])]);
      else if (!V.valuesEqual(doc._id, oldDoc._id)) throw immutableId(oldDoc);
    }
  }
  checkStoredDoc(doc);
  return doc;
}

function immutableId(oldDoc) {
  return err(66, `After applying the update, the (immutable) field '_id' was found to have been altered to _id: ${showShort(oldDoc._id)}`);
}

// Seed document for an upsert: the equality conditions of the query.
function upsertSeed(query) {
  const doc = {};
  (function take(q) {
    if (!isPlainObject(q)) return;
    for (const k of V.keys(q)) {
      if (k === '$and') {
        for (const s of q[k]) take(s);
        continue;
      }
      if (k.startsWith('$')) continue;
      let v = q[k];
      if (isPlainObject(v)) {
        const keys = Object.keys(v);
        if (keys.length && keys[0].startsWith('$')) {
          if (keys.length === 1 && keys[0] === '$eq') v = v.$eq;
          else continue;
        }
      }
      const segs = k.split('.');
      const parent = parentOf(doc, segs, true);
      setChild(parent, segs[segs.length - 1], V.cloneValue(v));
    }
  })(query);
  return doc;
}

// _id first, as mongod stores it; generates an ObjectId when absent.
function withIdFirst(doc) {
  const list = V.keys(doc);
  if (doc._id !== undefined && list[0] === '_id') return doc;
  const entries = [['_id', doc._id === undefined ? new ObjectId() : doc._id]];
  for (const k of list) if (k !== '_id') entries.push([k, doc[k]]);
  return V.fromEntries(entries);
}

module.exports = { applyUpdate, upsertSeed, withIdFirst, kindOfUpdate, isPlainObject, showShort };
