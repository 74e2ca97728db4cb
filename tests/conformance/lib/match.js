'use strict';
// Value matching for the unified test format ("Evaluating Matches"):
// root-level documents may carry extra fields, nested ones may not, arrays must
// have the same length, numbers compare flexibly (int/long/double), and the
// $$-prefixed special operators are honoured.

const { BSON } = require('mongodb');
const { EJSON } = BSON;

class MatchError extends Error {
  constructor(path, message) {
    super(`${path || '(root)'}: ${message}`);
    this.name = 'MatchError';
  }
}

function isPlainDocument(v) {
  if (v === null || typeof v !== 'object') return false;
  if (Array.isArray(v) || v instanceof Date || v instanceof RegExp) return false;
  if (Buffer.isBuffer(v) || ArrayBuffer.isView(v)) return false;
  if (v._bsontype) return false;
  if (v instanceof Map) return false;
  return true;
}

function isSpecialOperator(v) {
  if (!isPlainDocument(v)) return false;
  const keys = Object.keys(v);
  return keys.length === 1 && keys[0].startsWith('$$');
}

function isNumberLike(v) {
  if (typeof v === 'number' || typeof v === 'bigint') return true;
  return v != null && typeof v === 'object' && ['Int32', 'Double', 'Long'].includes(v._bsontype);
}

function toNumber(v) {
  if (typeof v === 'number') return v;
  if (typeof v === 'bigint') return Number(v);
  if (v._bsontype === 'Long') return v.toNumber();
  return Number(v.valueOf());
}

function show(v) {
  try {
    const s = EJSON.stringify(v, { relaxed: true });
    return s === undefined ? 'undefined' : s.length > 300 ? s.slice(0, 300) + '...' : s;
  } catch (_) {
    return String(v);
  }
}

function bsonTypeNames(v) {
  // Returns the set of $type alias names the value can be considered to have.
  // The driver promotes int32/int64/double to JS numbers, so an integral JS
  // number may have been any of the three; a fractional one is a double.
  if (v === undefined) return ['undefined'];
  if (v === null) return ['null'];
  if (typeof v === 'number') {
    return Number.isInteger(v) ? ['int', 'long', 'double', 'number'] : ['double', 'number'];
  }
  if (typeof v === 'bigint') return ['long', 'number'];
  if (typeof v === 'string') return ['string'];
  if (typeof v === 'boolean') return ['bool'];
  if (Array.isArray(v)) return ['array'];
  if (v instanceof Date) return ['date'];
  if (v instanceof RegExp) return ['regex'];
  if (Buffer.isBuffer(v) || ArrayBuffer.isView(v)) return ['binData'];
  switch (v._bsontype) {
    case 'Int32': return ['int', 'number'];
    case 'Long': return ['long', 'number'];
    case 'Double': return ['double', 'number'];
    case 'Decimal128': return ['decimal', 'number'];
    case 'ObjectId': return ['objectId'];
    case 'Binary': return ['binData'];
    case 'Timestamp': return ['timestamp'];
    case 'BSONRegExp': return ['regex'];
    case 'Code': return v.scope ? ['javascriptWithScope'] : ['javascript'];
    case 'BSONSymbol': return ['symbol'];
    case 'MinKey': return ['minKey'];
    case 'MaxKey': return ['maxKey'];
    case 'DBRef': return ['object'];
    default: break;
  }
  if (isPlainDocument(v)) return ['object'];
  return ['unknown'];
}

function scalarEqual(expected, actual) {
  if (isNumberLike(expected) && isNumberLike(actual)) {
    if (expected && expected._bsontype === 'Long' && actual && actual._bsontype === 'Long') {
      return expected.equals(actual);
    }
    return toNumber(expected) === toNumber(actual);
  }
  if (expected === null || actual === null || expected === undefined || actual === undefined) {
    return expected === actual;
  }
  if (typeof expected !== 'object' || typeof actual !== 'object') {
    return typeof expected === typeof actual && expected === actual;
  }
  // Both BSON values of some kind: compare canonical extended JSON.
  try {
    return EJSON.stringify(expected, { relaxed: false }) === EJSON.stringify(actual, { relaxed: false });
  } catch (_) {
    return false;
  }
}

// ctx: { entities: EntityMap | null }
function match(expected, actual, ctx, path = '', isRoot = false) {
  if (isSpecialOperator(expected)) {
    matchOperator(expected, actual, ctx, path, isRoot);
    return;
  }
  if (isPlainDocument(expected)) {
    if (actual instanceof Map) actual = Object.fromEntries(actual);
    if (!isPlainDocument(actual)) {
      throw new MatchError(path, `expected a document ${show(expected)}, got ${show(actual)}`);
    }
    for (const [key, value] of Object.entries(expected)) {
      const sub = path ? `${path}.${key}` : key;
      const present = Object.prototype.hasOwnProperty.call(actual, key) && actual[key] !== undefined;
      if (isSpecialOperator(value)) {
        const op = Object.keys(value)[0];
        if (op === '$$exists') {
          if (value.$$exists && !present) throw new MatchError(sub, 'expected field to exist');
          if (!value.$$exists && present) {
            throw new MatchError(sub, `expected field to be absent, got ${show(actual[key])}`);
          }
          continue;
        }
        if (op === '$$unsetOrMatches') {
          if (!present) continue;
          match(value.$$unsetOrMatches, actual[key], ctx, sub, false);
          continue;
        }
        if (!present && op !== '$$type') {
          throw new MatchError(sub, `expected field to exist (${show(value)})`);
        }
        matchOperator(value, actual[key], ctx, sub, false);
        continue;
      }
      if (!present) throw new MatchError(sub, `missing field, expected ${show(value)}`);
      match(value, actual[key], ctx, sub, false);
    }
    if (!isRoot) {
      for (const key of Object.keys(actual)) {
        if (actual[key] === undefined) continue;
        if (!Object.prototype.hasOwnProperty.call(expected, key)) {
          throw new MatchError(path, `unexpected extra field '${key}' in nested document ${show(actual)}`);
        }
      }
    }
    return;
  }
  if (Array.isArray(expected)) {
    if (!Array.isArray(actual)) {
      throw new MatchError(path, `expected an array ${show(expected)}, got ${show(actual)}`);
    }
    if (actual.length !== expected.length) {
      throw new MatchError(path,
        `expected ${expected.length} elements, got ${actual.length}: expected ${show(expected)}, got ${show(actual)}`);
    }
    expected.forEach((v, i) => match(v, actual[i], ctx, `${path}[${i}]`, false));
    return;
  }
  if (!scalarEqual(expected, actual)) {
    throw new MatchError(path, `expected ${show(expected)}, got ${show(actual)}`);
  }
}

function matchOperator(expected, actual, ctx, path, isRoot) {
  const op = Object.keys(expected)[0];
  const arg = expected[op];
  switch (op) {
    case '$$exists':
      // Only meaningful at key level; at value level it asserts presence.
      if (arg && actual === undefined) throw new MatchError(path, 'expected value to exist');
      if (!arg && actual !== undefined) throw new MatchError(path, `expected no value, got ${show(actual)}`);
      return;
    case '$$unsetOrMatches':
      if (actual === undefined) return;
      match(arg, actual, ctx, path, isRoot);
      return;
    case '$$type': {
      const wanted = Array.isArray(arg) ? arg : [arg];
      if (actual === undefined) throw new MatchError(path, `expected a value of type ${wanted.join('|')}, got nothing`);
      const have = bsonTypeNames(actual);
      if (!wanted.some((t) => have.includes(t))) {
        throw new MatchError(path, `expected type ${wanted.join('|')}, got ${have[0]} (${show(actual)})`);
      }
      return;
    }
    case '$$matchesEntity': {
      const ent = ctx.entities.get(arg);
      match(ent, actual, ctx, path, isRoot);
      return;
    }
    case '$$matchesHexBytes': {
      const want = Buffer.from(arg, 'hex');
      let got = actual;
      if (actual && actual._bsontype === 'Binary') got = Buffer.from(actual.buffer);
      if (!Buffer.isBuffer(got) && !(got instanceof Uint8Array)) {
        throw new MatchError(path, `expected bytes, got ${show(actual)}`);
      }
      if (!Buffer.from(got).equals(want)) throw new MatchError(path, `expected bytes ${arg}, got ${Buffer.from(got).toString('hex')}`);
      return;
    }
    case '$$sessionLsid': {
      const lsid = ctx.entities.getSessionLsid(arg);
      if (!scalarEqualDoc(lsid, actual)) {
        throw new MatchError(path, `expected lsid of ${arg} ${show(lsid)}, got ${show(actual)}`);
      }
      return;
    }
    case '$$lte':
      if (!isNumberLike(actual) || !(toNumber(actual) <= toNumber(arg))) {
        throw new MatchError(path, `expected a number <= ${show(arg)}, got ${show(actual)}`);
      }
      return;
    case '$$matchAsDocument': {
      if (typeof actual !== 'string') throw new MatchError(path, `expected an extended JSON string, got ${show(actual)}`);
      let doc;
      try { doc = EJSON.parse(actual, { relaxed: true }); } catch (e) {
        throw new MatchError(path, `cannot parse as extended JSON: ${e.message}`);
      }
      match(arg, doc, ctx, path, false);
      return;
    }
    case '$$matchAsRoot':
      match(arg, actual, ctx, path, true);
      return;
    default:
      throw new Error(`unsupported special operator ${op} at ${path || '(root)'}`);
  }
}

function scalarEqualDoc(a, b) {
  if (!a || !b) return false;
  try {
    return EJSON.stringify(a, { relaxed: false }) === EJSON.stringify(b, { relaxed: false });
  } catch (_) {
    return false;
  }
}

// Exact comparison used for test.outcome: same keys (any order), same values,
// flexible numerics, no special operators, no extra fields anywhere.
function exactMatch(expected, actual, path = '') {
  if (isPlainDocument(expected)) {
    if (!isPlainDocument(actual)) throw new MatchError(path, `expected document ${show(expected)}, got ${show(actual)}`);
    const ek = Object.keys(expected).filter((k) => expected[k] !== undefined).sort();
    const ak = Object.keys(actual).filter((k) => actual[k] !== undefined).sort();
    if (ek.join('\u0000') !== ak.join('\u0000')) {
      throw new MatchError(path, `field sets differ: expected ${show(expected)}, got ${show(actual)}`);
    }
    for (const k of ek) exactMatch(expected[k], actual[k], path ? `${path}.${k}` : k);
    return;
  }
  if (Array.isArray(expected)) {
    if (!Array.isArray(actual) || actual.length !== expected.length) {
      throw new MatchError(path, `expected ${show(expected)}, got ${show(actual)}`);
    }
    expected.forEach((v, i) => exactMatch(v, actual[i], `${path}[${i}]`));
    return;
  }
  if (!scalarEqual(expected, actual)) throw new MatchError(path, `expected ${show(expected)}, got ${show(actual)}`);
}

module.exports = { match, exactMatch, MatchError, isPlainDocument, show, BSON };
