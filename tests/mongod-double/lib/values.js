'use strict';
// Values bridge between stored BSON and mingo. Documents are stored exactly as deserialized
// (Int32/Long/Double/Decimal128 wrappers kept) so they round-trip unchanged; mingo cannot compare
// those wrappers, so it is handed a "view" where every number is a JS number. This file builds
// views, maps mingo output back to typed values, compares values in BSON order, and derives the
// canonical keys used by the _id map and unique indexes (1, 1.0 and Long 1 share a key).
// It does not evaluate queries itself; that is mingo's job.

const bson = require('bson');
const { Int32, Long, Double, Decimal128, ObjectId, Binary, Timestamp, BSONRegExp, MinKey, MaxKey, Code, BSONSymbol, DBRef } = bson;

const INT32_MIN = -2147483648;
const INT32_MAX = 2147483647;

function bsonTag(v) {
  if (v === undefined) return 'undefined';
  if (v === null) return 'null';
  switch (typeof v) {
    case 'number': return 'double';
    case 'string': return 'string';
    case 'boolean': return 'bool';
    case 'bigint': return 'long';
    default: break;
  }
  if (Array.isArray(v)) return 'array';
  if (v instanceof Date) return 'date';
  if (v instanceof RegExp) return 'regex';
  const t = v._bsontype;
  switch (t) {
    case 'Int32': return 'int';
    case 'Long': return 'long';
    case 'Double': return 'double';
    case 'Decimal128': return 'decimal';
    case 'ObjectId': return 'objectId';
    case 'Binary': return 'binData';
    case 'Timestamp': return 'timestamp';
    case 'BSONRegExp': return 'regex';
    case 'MinKey': return 'minKey';
    case 'MaxKey': return 'maxKey';
    case 'Code': return 'javascript';
    case 'BSONSymbol': return 'symbol';
    case 'DBRef': return 'object';
    case 'UUID': return 'binData';
    default: break;
  }
  if (Buffer.isBuffer(v) || v instanceof Uint8Array) return 'binData';
  return 'object';
}

// ---- field order ----
// JavaScript objects list integer-like property names ("0", "1", ... up to 2^32-2) first, in
// numeric order, whatever order they were added in. BSON documents keep any order, and mongod
// keeps the client's. An object whose real order differs from Object.keys carries it under
// ORDER; keys() reads it (tolerating keys added or deleted behind its back: new ones are
// appended, deleted ones dropped), setKey() appends, forWire() hands bson a Map where needed.
const ORDER = Symbol('fieldOrder');
// The BSON a document was received as ({bytes, off}, wire.js), for the parser to see a name
// given twice (bson keeps one of them) in the parts of a command it walks (parse.js).
const RAW = Symbol('receivedBson');
const INDEX_LIKE = /^(?:0|[1-9]\d{0,9})$/;
const isIndexLike = (k) => INDEX_LIKE.test(k) && Number(k) < 4294967295;

function keys(o) {
  const ord = o[ORDER];
  const own = Object.keys(o);
  if (!ord) return own;
  if (ord.length === own.length && ord.every((k) => Object.prototype.hasOwnProperty.call(o, k))) return ord;
  const present = new Set(own);
  const out = ord.filter((k) => present.has(k));
  const seen = new Set(out);
  for (const k of own) if (!seen.has(k)) out.push(k);
  o[ORDER] = out;
  return out;
}

// Gives o the order `list` (its own keys in the wanted order) when JS would show another.
function setOrder(o, list) {
  const own = Object.keys(o);
  let same = own.length === list.length;
  for (let i = 0; same && i < own.length; i++) same = own[i] === list[i];
  if (same) delete o[ORDER];
  else o[ORDER] = list.slice();
  return o;
}

// Sets o[k]; a new key goes to the end, as in a BSON document.
function setKey(o, k, v) {
  if (Object.prototype.hasOwnProperty.call(o, k)) {
    o[k] = v;
    return;
  }
  if (!o[ORDER] && !isIndexLike(k)) {
    o[k] = v;
    return;
  }
  const ord = keys(o).slice();
  o[k] = v;
  ord.push(k);
  setOrder(o, ord);
}

function deleteKey(o, k) {
  delete o[k];
  if (o[ORDER]) keys(o);
}

// A plain object from [key, value] pairs in that order.
function fromEntries(entries) {
  const o = {};
  const list = [];
  for (const [k, v] of entries) {
    if (!Object.prototype.hasOwnProperty.call(o, k)) list.push(k);
    o[k] = v;
  }
  return setOrder(o, list);
}

function isPlainDoc(v) {
  return v !== null && typeof v === 'object' && !Array.isArray(v) && !v._bsontype && !(v instanceof Date) &&
    !(v instanceof RegExp) && !(v instanceof Map) && !ArrayBuffer.isView(v);
}

// What to give BSON.serialize so every document is written in its real order: objects with an
// ORDER become Maps (bson writes Map entries in insertion order); untouched subtrees are shared.
function forWire(v) {
  if (v === null || typeof v !== 'object') return v;
  if (Array.isArray(v)) {
    let out = null;
    for (let i = 0; i < v.length; i++) {
      const x = forWire(v[i]);
      if (x !== v[i]) {
        if (!out) out = v.slice();
        out[i] = x;
      }
    }
    return out || v;
  }
  if (!isPlainDoc(v)) return v;
  if (v[ORDER]) return new Map(keys(v).map((k) => [k, forWire(v[k])]));
  let out = null;
  for (const k of Object.keys(v)) {
    const x = forWire(v[k]);
    if (x !== v[k]) {
      if (!out) out = Object.assign({}, v);
      out[k] = x;
    }
  }
  return out || v;
}

// Records the BSON field order of a freshly deserialized document (bytes[start..] is its BSON)
// on every object whose JS key order differs from it.
function annotateOrder(obj, bytes, start) {
  const els = bson.BSON.onDemand.parseToElements(bytes, start);
  const isArr = Array.isArray(obj);
  let names = null;
  let needsOrder = false;
  for (let i = 0; i < els.length; i++) {
    const e = els[i];
    let name = null;
    if (!isArr) {
      // Only a name starting with a digit can be reordered by JavaScript.
      const c = bytes[e[1]];
      name = c >= 0x30 && c <= 0x39 || e[0] === 3 || e[0] === 4 ? Buffer.from(bytes.buffer, bytes.byteOffset + e[1], e[2]).toString('utf8') : null;
      if (name !== null && isIndexLike(name)) needsOrder = true;
    }
    if (e[0] === 3 || e[0] === 4) {
      const child = isArr ? obj[i] : obj[name];
      if (child !== null && typeof child === 'object' && (e[0] === 4 ? Array.isArray(child) : isPlainDoc(child))) {
        annotateOrder(child, bytes, e[3]);
      }
    }
  }
  if (!isArr && needsOrder) {
    // A repeated name keeps its first place (the value is the last one, as bson decodes it).
    names = [...new Set(els.map((e) => Buffer.from(bytes.buffer, bytes.byteOffset + e[1], e[2]).toString('utf8')))];
    setOrder(obj, names);
  }
}

// MongoDB's cross-type sort order.
const TYPE_ORDER = {
  minKey: 1, undefined: 2, null: 2, int: 3, long: 3, double: 3, decimal: 3, symbol: 4, string: 4,
  object: 5, array: 6, binData: 7, objectId: 8, bool: 9, date: 10, timestamp: 11, regex: 12,
  javascript: 13, maxKey: 100,
};

const isNumericTag = (t) => t === 'int' || t === 'long' || t === 'double' || t === 'decimal';
function isNumeric(v) { return isNumericTag(bsonTag(v)); }

function toNumber(v) {
  if (typeof v === 'number') return v;
  if (typeof v === 'bigint') return Number(v);
  switch (v && v._bsontype) {
    case 'Int32': case 'Double': return v.value;
    case 'Long': return v.toNumber();
    case 'Decimal128': return parseFloat(v.toString());
    default: return NaN;
  }
}

// Exact integer view of a numeric value when it is integral, else null.
function toBigIntExact(v) {
  if (v && v._bsontype === 'Long') return v.toBigInt();
  if (typeof v === 'bigint') return v;
  if (v && v._bsontype === 'Decimal128') {
    const s = v.toString();
    if (/^-?\d+$/.test(s)) return BigInt(s);
    const n = parseFloat(s);
    return Number.isInteger(n) ? BigInt(n) : null;
  }
  const n = toNumber(v);
  return Number.isInteger(n) ? BigInt(n) : null;
}

// A JS number holding exactly the value of a numeric BSON value, or null when there is none
// (Int64 beyond 2^53, every Decimal128).
function exactJsNumber(v) {
  if (typeof v === 'number') return v;
  switch (v && v._bsontype) {
    case 'Int32': case 'Double': return v.value;
    case 'Long': {
      const n = v.toNumber();
      return Number.isSafeInteger(n) ? n : null;
    }
    default: return null;
  }
}

// Exact value of a number as {nan} | {inf: ±1} | {coeff: BigInt, exp: int} (coeff * 10^exp).
const F64 = new DataView(new ArrayBuffer(8));
function exactOf(v) {
  if (typeof v === 'bigint') return { coeff: v, exp: 0 };
  const t = v && v._bsontype;
  if (t === 'Long') return { coeff: v.toBigInt(), exp: 0 };
  if (t === 'Int32') return { coeff: BigInt(v.value), exp: 0 };
  if (t === 'Decimal128') {
    const s = v.toString();
    if (s === 'NaN' || s === '-NaN') return { nan: true };
    if (s === 'Infinity' || s === '-Infinity') return { inf: s[0] === '-' ? -1 : 1 };
    const m = /^(-?)(\d+)(?:\.(\d+))?(?:E([+-]?\d+))?$/i.exec(s);
    if (!m) return { nan: true };
    const frac = m[3] || '';
    const coeff = BigInt(m[2] + frac);
    return { coeff: m[1] ? -coeff : coeff, exp: (m[4] ? parseInt(m[4], 10) : 0) - frac.length };
  }
  const n = typeof v === 'number' ? v : toNumber(v);
  if (Number.isNaN(n)) return { nan: true };
  if (!Number.isFinite(n)) return { inf: n < 0 ? -1 : 1 };
  if (Number.isSafeInteger(n)) return { coeff: BigInt(n), exp: 0 };
  // m * 2^e exactly, written as (m * 5^-e) * 10^e when e < 0.
  F64.setFloat64(0, n);
  const hi = F64.getUint32(0);
  const lo = F64.getUint32(4);
  const bexp = (hi >>> 20) & 0x7ff;
  let mant = (BigInt(hi & 0xfffff) << 32n) | BigInt(lo);
  let e;
  if (bexp === 0) e = -1074;
  else {
    mant |= 1n << 52n;
    e = bexp - 1075;
  }
  if (n < 0) mant = -mant;
  if (e >= 0) return { coeff: mant << BigInt(e), exp: 0 };
  return { coeff: mant * 5n ** BigInt(-e), exp: e };
}

function compareExact(x, y) {
  // NaN sorts below every other number in MongoDB.
  if (x.nan || y.nan) return x.nan && y.nan ? 0 : x.nan ? -1 : 1;
  if (x.inf || y.inf) {
    const a = x.inf || 0;
    const b = y.inf || 0;
    if (a !== b) return a < b ? -1 : 1;
    if (a) return 0;
  }
  let a = x.coeff;
  let b = y.coeff;
  if (x.exp > y.exp) a *= 10n ** BigInt(x.exp - y.exp);
  else if (y.exp > x.exp) b *= 10n ** BigInt(y.exp - x.exp);
  return a < b ? -1 : a > b ? 1 : 0;
}

// Numbers compare by exact value across Int32, Int64, Double and Decimal128, as in MongoDB.
function compareNumbers(a, b) {
  const x = exactJsNumber(a);
  const y = exactJsNumber(b);
  if (x !== null && y !== null) {
    if (Number.isNaN(x)) return Number.isNaN(y) ? 0 : -1;
    if (Number.isNaN(y)) return 1;
    return x < y ? -1 : x > y ? 1 : 0;
  }
  return compareExact(exactOf(a), exactOf(b));
}

// True when mingo's JS-number view of v is not exact (Int64 beyond 2^53, Decimal128).
function viewIsInexact(v) {
  const t = v && v._bsontype;
  if (t === 'Decimal128') return true;
  if (t === 'Long') return !Number.isSafeInteger(v.toNumber());
  return false;
}

function bytesOf(v) {
  if (v._bsontype === 'Binary' || v._bsontype === 'UUID') return Buffer.from(v.buffer.buffer ? v.buffer : v.buffer, 0);
  return Buffer.from(v);
}

function binSubtype(v) { return v.sub_type !== undefined ? v.sub_type : 0; }

function compareValues(a, b) {
  const ta = bsonTag(a);
  const tb = bsonTag(b);
  const oa = TYPE_ORDER[ta] || 50;
  const ob = TYPE_ORDER[tb] || 50;
  if (oa !== ob) return oa < ob ? -1 : 1;
  switch (ta) {
    case 'minKey': case 'maxKey': case 'null': case 'undefined': return 0;
    case 'int': case 'long': case 'double': case 'decimal': return compareNumbers(a, b);
    case 'string': case 'symbol': {
      const x = ta === 'symbol' ? a.value : a;
      const y = tb === 'symbol' ? b.value : b;
      return Buffer.compare(Buffer.from(x, 'utf8'), Buffer.from(y, 'utf8'));
    }
    case 'object': return compareDocs(a, b);
    case 'array': {
      const n = Math.min(a.length, b.length);
      for (let i = 0; i < n; i++) {
        const c = compareValues(a[i], b[i]);
        if (c) return c;
      }
      return a.length < b.length ? -1 : a.length > b.length ? 1 : 0;
    }
    case 'binData': {
      const x = bytesOf(a);
      const y = bytesOf(b);
      if (x.length !== y.length) return x.length < y.length ? -1 : 1;
      const sa = binSubtype(a);
      const sb = binSubtype(b);
      if (sa !== sb) return sa < sb ? -1 : 1;
      return Buffer.compare(x, y);
    }
    case 'objectId': return Buffer.compare(Buffer.from(a.id), Buffer.from(b.id));
    case 'bool': return a === b ? 0 : a ? 1 : -1;
    case 'date': return Math.sign(a.getTime() - b.getTime()) || 0;
    case 'timestamp': {
      const x = a.toBigInt ? BigInt.asUintN(64, a.toBigInt()) : 0n;
      const y = b.toBigInt ? BigInt.asUintN(64, b.toBigInt()) : 0n;
      return x < y ? -1 : x > y ? 1 : 0;
    }
    case 'regex': {
      const sa = a.source !== undefined ? a.source : a.pattern;
      const sb = b.source !== undefined ? b.source : b.pattern;
      if (sa !== sb) return sa < sb ? -1 : 1;
      const fa = a.flags !== undefined ? a.flags : a.options;
      const fb = b.flags !== undefined ? b.flags : b.options;
      return fa < fb ? -1 : fa > fb ? 1 : 0;
    }
    case 'javascript': return String(a.code) < String(b.code) ? -1 : String(a.code) > String(b.code) ? 1 : 0;
    default: return 0;
  }
}

function compareDocs(a, b) {
  const ka = keys(a);
  const kb = keys(b);
  const n = Math.min(ka.length, kb.length);
  for (let i = 0; i < n; i++) {
    const va = a[ka[i]];
    const vb = b[kb[i]];
    const oa = TYPE_ORDER[bsonTag(va)] || 50;
    const ob = TYPE_ORDER[bsonTag(vb)] || 50;
    if (oa !== ob) return oa < ob ? -1 : 1;
    if (ka[i] !== kb[i]) return ka[i] < kb[i] ? -1 : 1;
    const c = compareValues(va, vb);
    if (c) return c;
  }
  return ka.length < kb.length ? -1 : ka.length > kb.length ? 1 : 0;
}

function valuesEqual(a, b) { return compareValues(a, b) === 0; }

// Canonical string for equality classes: used as map keys for _id and unique index entries.
function canonicalKey(v) {
  const t = bsonTag(v);
  switch (t) {
    case 'undefined': case 'null': return 'z';
    case 'minKey': return '-';
    case 'maxKey': return '+';
    case 'int': case 'long': case 'double': case 'decimal': {
      // The exact value: Decimal128 0.1 and the double 0.1 are different keys, 1, 1.0,
      // Long 1 and Decimal128 1.00 the same.
      const n = exactJsNumber(v);
      if (n !== null && Number.isSafeInteger(n)) return 'n' + (n === 0 ? 0 : n);
      const x = exactOf(v);
      if (x.nan) return 'nNaN';
      if (x.inf) return x.inf > 0 ? 'n+inf' : 'n-inf';
      let { coeff, exp } = x;
      if (coeff === 0n) return 'n0';
      while (exp < 0 && coeff % 10n === 0n) {
        coeff /= 10n;
        exp++;
      }
      if (exp >= 0) return 'n' + (coeff * 10n ** BigInt(exp)).toString();
      return 'n' + coeff.toString() + 'e' + exp;
    }
    case 'string': return 's' + JSON.stringify(v);
    case 'symbol': return 's' + JSON.stringify(v.value);
    case 'bool': return v ? 'T' : 'F';
    case 'date': return 'd' + v.getTime();
    case 'objectId': return 'o' + v.toHexString();
    case 'binData': return 'x' + binSubtype(v) + ':' + bytesOf(v).toString('base64');
    case 'timestamp': return 't' + v.toString();
    case 'regex': return 'r' + JSON.stringify([a_src(v), a_flags(v)]);
    case 'javascript': return 'j' + JSON.stringify(String(v.code));
    case 'array': return '[' + v.map(canonicalKey).join(',') + ']';
    default: {
      let s = '{';
      for (const k of keys(v)) s += JSON.stringify(k) + ':' + canonicalKey(v[k]) + ',';
      return s + '}';
    }
  }
}
function a_src(v) { return v.source !== undefined ? v.source : v.pattern; }
function a_flags(v) { return v.flags !== undefined ? v.flags : v.options; }

// The view handed to mingo: numbers become JS numbers, BSONRegExp a RegExp, everything else is
// kept (same object identity for ObjectId, Binary, Date, so fromView can find them again).
// A view holding a number mingo cannot compare right (Int64 beyond 2^53 and Decimal128 are
// not exact as JS numbers; NaN compares like a number to mingo) is marked INEXACT on its top
// level, so filters know to compare such values themselves.
const INEXACT = Symbol('inexactView');
let sawInexact = false;
function toView(v) {
  sawInexact = false;
  const out = viewOf(v);
  if (sawInexact && out !== null && typeof out === 'object') out[INEXACT] = true;
  return out;
}

function viewOf(v) {
  if (v === null || typeof v !== 'object') return v;
  if (Array.isArray(v)) {
    const out = new Array(v.length);
    for (let i = 0; i < v.length; i++) out[i] = viewOf(v[i]);
    return out;
  }
  if (v instanceof Date || v instanceof RegExp) return v;
  const t = v._bsontype;
  if (t) {
    switch (t) {
      case 'Int32': return v.value;
      case 'Double':
        if (Number.isNaN(v.value)) sawInexact = true; // mingo: NaN >= 1; mongod: NaN only equals NaN
        return v.value;
      case 'Long': {
        const n = v.toNumber();
        if (!Number.isSafeInteger(n)) sawInexact = true;
        return n;
      }
      case 'Decimal128':
        sawInexact = true;
        return parseFloat(v.toString());
      case 'BSONRegExp': {
        try {
          return new RegExp(v.pattern, v.options.replace(/[^gimsuy]/g, ''));
        } catch (e) {
          return v;
        }
      }
      default: return v;
    }
  }
  const out = {};
  for (const k of Object.keys(v)) out[k] = viewOf(v[k]);
  return out;
}

// Typed value for a number mingo computed, guided by the original value at the same place.
function numberFromView(n, hint) {
  if (hint !== undefined && isNumeric(hint)) {
    if (toNumber(hint) === n || (Number.isNaN(n) && Number.isNaN(toNumber(hint)))) return hint;
    const t = bsonTag(hint);
    if (t === 'double') return new Double(n);
    if (t === 'decimal') return Decimal128.fromString(String(n));
    if (Number.isInteger(n)) {
      if (t === 'int' && n >= INT32_MIN && n <= INT32_MAX) return new Int32(n);
      if (Number.isSafeInteger(n)) return Long.fromNumber(n);
    }
    return new Double(n);
  }
  if (Number.isInteger(n) && !Object.is(n, -0)) {
    if (n >= INT32_MIN && n <= INT32_MAX) return new Int32(n);
    if (Number.isSafeInteger(n)) return Long.fromNumber(n);
  }
  return new Double(n);
}

// `order` (top level only): names in the order the pipeline's stage specifications give them,
// for fields the hint does not have.
function fromView(v, hint, order) {
  if (typeof v === 'number') return numberFromView(v, hint);
  if (v === null || typeof v !== 'object') return v;
  if (v instanceof RegExp) {
    if (hint && hint._bsontype === 'BSONRegExp' && a_src(hint) === v.source) return hint;
    return new BSONRegExp(v.source, v.flags.split('').sort().join(''));
  }
  if (v instanceof Date || v._bsontype) return v;
  if (Array.isArray(v)) {
    const h = Array.isArray(hint) ? hint : undefined;
    return v.map((x, i) => fromView(x, h ? h[i] : undefined));
  }
  const h = hint && typeof hint === 'object' && !Array.isArray(hint) && !hint._bsontype ? hint : undefined;
  const out = {};
  // Fields the hint (the stored original) has keep its order; new ones follow.
  const list = [];
  if (h) for (const k of keys(h)) if (Object.prototype.hasOwnProperty.call(v, k) && v[k] !== undefined) list.push(k);
  const seen = new Set(list);
  if (order) {
    for (const k of order) {
      if (!seen.has(k) && Object.prototype.hasOwnProperty.call(v, k) && v[k] !== undefined) {
        list.push(k);
        seen.add(k);
      }
    }
  }
  for (const k of Object.keys(v)) if (!seen.has(k) && v[k] !== undefined) list.push(k);
  for (const k of list) out[k] = fromView(v[k], h ? h[k] : undefined);
  return setOrder(out, list);
}

// Typed deep copy, so stored records never share mutable containers with a request or reply.
function cloneValue(v) {
  if (v === null || typeof v !== 'object') return v;
  if (Array.isArray(v)) return v.map(cloneValue);
  if (v._bsontype || v instanceof Date || v instanceof RegExp) return v; // immutable in practice
  const out = {};
  const list = keys(v);
  for (const k of list) out[k] = cloneValue(v[k]);
  if (v[ORDER]) out[ORDER] = list.slice();
  return out;
}

// Values at a dotted path, descending into arrays the way index keys and sorts do.
function pathValues(doc, path) {
  const parts = path.split('.');
  const out = [];
  (function walk(v, i) {
    if (i === parts.length) {
      out.push(v);
      return;
    }
    if (v === null || typeof v !== 'object' || v._bsontype || v instanceof Date) {
      out.push(undefined);
      return;
    }
    if (Array.isArray(v)) {
      const p = parts[i];
      if (/^\d+$/.test(p) && +p < v.length) {
        walk(v[+p], i + 1);
        return;
      }
      if (v.length === 0) {
        out.push(undefined);
        return;
      }
      for (const e of v) {
        if (e !== null && typeof e === 'object' && !Array.isArray(e) && !e._bsontype) walk(e, i);
        else out.push(undefined);
      }
      return;
    }
    walk(Object.prototype.hasOwnProperty.call(v, parts[i]) ? v[parts[i]] : undefined, i + 1);
  })(doc, 0);
  return out;
}

function getPath(doc, path) {
  let v = doc;
  for (const p of path.split('.')) {
    if (v === null || typeof v !== 'object') return undefined;
    if (Array.isArray(v)) {
      if (!/^\d+$/.test(p)) return undefined;
      v = v[+p];
    } else v = Object.prototype.hasOwnProperty.call(v, p) ? v[p] : undefined;
  }
  return v;
}

// Sort key of a field for a sort direction: arrays sort by their smallest (ascending) or largest
// (descending) element, missing sorts as null.
function sortKey(doc, path, dir) {
  const vals = [];
  for (const v of pathValues(doc, path)) {
    if (Array.isArray(v)) {
      if (v.length === 0) vals.push(undefined);
      else for (const e of v) vals.push(e);
    } else vals.push(v);
  }
  let best = vals[0] === undefined ? null : vals[0];
  for (let i = 1; i < vals.length; i++) {
    const v = vals[i] === undefined ? null : vals[i];
    const c = compareValues(v, best);
    if ((dir > 0 && c < 0) || (dir < 0 && c > 0)) best = v;
  }
  return best;
}

function makeSortComparator(sortSpec) {
  const fields = keys(sortSpec || {}).filter((k) => {
    const d = sortSpec[k];
    return !(d && typeof d === 'object' && !d._bsontype); // {$meta: ...} ignored
  });
  if (!fields.length) return null;
  const dirs = fields.map((k) => (toNumber(sortSpec[k]) < 0 ? -1 : 1));
  return (a, b) => {
    for (let i = 0; i < fields.length; i++) {
      const c = compareValues(sortKey(a, fields[i], dirs[i]), sortKey(b, fields[i], dirs[i]));
      if (c) return c * dirs[i];
    }
    return 0;
  };
}

// BSONObj::toString as the server prints shard keys and requests in its messages.
function showBson(v) {
  if (v === null) return 'null';
  if (v === undefined) return 'undefined';
  if (typeof v === 'string') return JSON.stringify(v);
  if (typeof v === 'number') return String(v);
  if (typeof v === 'boolean') return String(v);
  if (v instanceof Double) return Number.isInteger(v.value) ? `${v.value}.0` : String(v.value);
  if (Array.isArray(v)) return `[ ${v.map(showBson).join(', ')} ]`;
  if (isPlainDoc(v)) {
    const ks = keys(v);
    return ks.length ? `{ ${ks.map((k) => `${k}: ${showBson(v[k])}`).join(', ')} }` : '{}';
  }
  if (v instanceof ObjectId) return `ObjectId('${v.toHexString()}')`;
  if (v instanceof Long) return `${v.toString()}`;
  return String(v);
}

function truthy(v) {
  if (v === undefined || v === null || v === false) return false;
  if (isNumeric(v)) return toNumber(v) !== 0;
  return true;
}

module.exports = {
  ORDER, RAW, INEXACT, keys, setKey, deleteKey, setOrder, fromEntries, forWire, annotateOrder, isIndexLike,
  compareNumbers, viewIsInexact,
  bsonTag, isNumeric, toNumber, toBigIntExact, compareValues, valuesEqual, canonicalKey, toView,
  fromView, cloneValue, pathValues, getPath, sortKey, makeSortComparator, truthy, showBson, TYPE_ORDER,
  INT32_MIN, INT32_MAX, Int32, Long, Double, Decimal128, ObjectId, Binary, Timestamp, MinKey, MaxKey, Code, BSONSymbol, DBRef,
};
