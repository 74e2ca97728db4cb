'use strict';
// mapReduce, as mongod 7.0 still serves it (deprecated since 5.0): the command's JavaScript map,
// reduce and finalize functions run over the documents its query selects, in a node:vm context
// of their own per command (the command's `scope` as globals, `emit` to collect), and the
// results, one {_id: key, value} per key in key order, come back inline or go to a collection
// the way mongod 4.4+ writes them, through $out (out: replace) or $merge (merge, reduce). A
// value emitted once for its key is not reduced, as on mongod. JavaScript numbers come back as
// doubles, since mongod's JS engine has no other number type. It does not split the work over
// shards (the sharded double refuses a sharded collection) and does not run in a transaction
// (sessions.js refuses it there with 263, as mongod does). The vm context is no security
// boundary: the double runs test code from its own tests only.

const vm = require('vm');
const V = require('../values');
const { err, MongoError } = require('../errors');
const { select } = require('../query');
const { _writeStage: writeStage } = require('./crud');

// Without a maxTimeMS a runaway function still ends: mongod has no such bound, but a test
// double that hangs on `while (true)` would hang the test-suite with it.
const JS_TIME_LIMIT_MS = 10000;

// A stored value as mongod's JS engine shows it: numbers as JS numbers, documents and
// arrays copied (a function may change `this` without touching the stored document).
function toJs(v) {
  if (v === null || typeof v !== 'object') return v;
  if (Array.isArray(v)) return v.map(toJs);
  if (v instanceof Date || v instanceof RegExp) return v;
  switch (v._bsontype) {
    case 'Int32': case 'Double': return v.value;
    case 'Long': return v.toNumber();
    case undefined: break;
    default: return v;
  }
  const out = {};
  for (const k of V.keys(v)) out[k] = toJs(v[k]);
  return out;
}

// A value the functions returned, as a BSON value: JS numbers are doubles. Objects made in
// the vm context have that context's prototypes, so they are recognised by shape.
function fromJs(v) {
  if (typeof v === 'number') return new V.Double(v);
  if (v === null || typeof v !== 'object') return v;
  if (Array.isArray(v)) return v.map(fromJs);
  if (v._bsontype || Object.prototype.toString.call(v) === '[object Date]' || Object.prototype.toString.call(v) === '[object RegExp]') return v;
  const out = {};
  for (const k of Object.keys(v)) if (v[k] !== undefined && typeof v[k] !== 'function') out[k] = fromJs(v[k]);
  return out;
}

// The source of a function argument: Code (with or without scope) or a string, as mongod takes
// (parse.js checked the type, and that map and reduce are there).
function functionSource(cmd, field) {
  const v = cmd[field];
  if (v === undefined || v === null) return null;
  if (typeof v === 'string') return { code: v, scope: null };
  return { code: v.code, scope: v.scope || null };
}

// The out argument: {inline: 1}, a collection name (replace), or {replace|merge|reduce: name,
// db?}. Returns null for inline.
function outputOf(cmd, db) {
  const out = cmd.out;
  if (typeof out === 'string') return { mode: 'replace', db, coll: out, named: false };
  if (!out || typeof out !== 'object' || out._bsontype) throw err(13606, "'out' has to be a string or an object");
  if (out.inline !== undefined) {
    if (V.toNumber(out.inline) !== 1) throw err(13606, "if 'out' is inline, it must be {inline: 1}");
    return null;
  }
  const mode = ['replace', 'merge', 'reduce'].find((m) => out[m] !== undefined);
  if (!mode || typeof out[mode] !== 'string') throw err(13606, "'out' has to be a string or an object with replace, merge or reduce");
  return { mode, db: typeof out.db === 'string' ? out.db : db, coll: out[mode], named: typeof out.db === 'string' };
}

// Runs `source` (an expression) in the context within the time limit; a thrown JS error is
// mongod's JSInterpreterFailure (139), the time limit with a maxTimeMS its MaxTimeMSExpired.
function runJs(context, source, limitMs, withMaxTime) {
  try {
    return vm.runInContext(source, context, { timeout: limitMs });
  } catch (e) {
    if (e instanceof MongoError) throw e;
    if (e && e.code === 'ERR_SCRIPT_EXECUTION_TIMEOUT') {
      if (withMaxTime) throw err(50, 'operation exceeded time limit');
      throw err(139, `Error: JavaScript execution timed out after ${limitMs} ms`);
    }
    throw err(139, `${(e && e.name) || 'Error'}: ${(e && e.message) || String(e)}`);
  }
}

async function mapReduce(ctx) {
  const { cmd, db } = ctx;
  const name = cmd.mapReduce !== undefined ? cmd.mapReduce : cmd.mapreduce;
  if (typeof name !== 'string' || !name.length) throw err(73, `collection name has invalid type ${V.bsonTag(name)}`);
  const map = functionSource(cmd, 'map');
  const reduce = functionSource(cmd, 'reduce');
  const finalize = functionSource(cmd, 'finalize');
  const output = outputOf(cmd, db);
  const limit = cmd.limit === undefined ? 0 : V.toNumber(cmd.limit);
  if (limit < 0) throw err(15881, "'limit' must be a non-negative number");
  const withMaxTime = cmd.maxTimeMS !== undefined && V.toNumber(cmd.maxTimeMS) > 0;
  const limitMs = withMaxTime ? Math.min(V.toNumber(cmd.maxTimeMS), JS_TIME_LIMIT_MS) : JS_TIME_LIMIT_MS;

  const coll = ctx.access.coll(db, name, false);
  const records = coll ? select(ctx.access, coll, { filter: cmd.query, sort: cmd.sort, limit, collation: cmd.collation }) : [];

  // One context for the command: scope first (the command's, then each function's own).
  const emitted = new Map(); // canonical key -> { key (BSON), values (JS) }
  const globals = {};
  for (const s of [cmd.scope, map.scope, reduce.scope, finalize && finalize.scope]) {
    if (s && typeof s === 'object') for (const k of V.keys(s)) globals[k] = toJs(s[k]);
  }
  const context = vm.createContext(globals);
  context.emit = (key, value) => {
    const k = fromJs(key === undefined ? null : key);
    const ck = V.canonicalKey(k);
    if (!emitted.has(ck)) emitted.set(ck, { key: k, values: [] });
    emitted.get(ck).values.push(value);
  };
  context.__map = runJs(context, `(${map.code})`, limitMs, withMaxTime);
  context.__reduce = runJs(context, `(${reduce.code})`, limitMs, withMaxTime);
  context.__finalize = finalize ? runJs(context, `(${finalize.code})`, limitMs, withMaxTime) : null;
  if (typeof context.__map !== 'function' || typeof context.__reduce !== 'function') {
    throw err(139, 'SyntaxError: map and reduce must be functions');
  }

  context.__docs = records.map((r) => toJs(r.doc));
  runJs(context, '(function () { for (const d of __docs) __map.call(d); })()', limitMs, withMaxTime);

  const groups = [...emitted.values()].sort((a, b) => V.compareValues(a.key, b.key));
  context.__groups = groups.map((g) => ({ key: toJs(g.key), values: g.values }));
  const reduced = runJs(context, `(function () {
    return __groups.map((g) => {
      let v = g.values.length === 1 ? g.values[0] : __reduce(g.key, g.values);
      if (__finalize) v = __finalize(g.key, v);
      return v;
    });
  })()`, limitMs, withMaxTime);
  const results = groups.map((g, i) => ({ _id: g.key, value: fromJs(reduced[i]) }));

  if (!output) return { results, ok: 1 };
  let docs = results;
  if (output.mode === 'reduce') {
    // Each new result is reduced once more with the value already stored under its key.
    const target = ctx.access.coll(output.db, output.coll, false);
    const stored = target ? select(ctx.access, target, {}) : [];
    const byKey = new Map(stored.map((r) => [V.canonicalKey(r.doc._id), r.doc.value]));
    context.__pairs = results.map((r) => (byKey.has(V.canonicalKey(r._id))
      ? { key: toJs(r._id), values: [toJs(byKey.get(V.canonicalKey(r._id))), toJs(r.value)] } : null));
    const again = runJs(context, `(function () {
      return __pairs.map((p) => {
        if (!p) return undefined;
        let v = __reduce(p.key, p.values);
        if (__finalize) v = __finalize(p.key, v);
        return v;
      });
    })()`, limitMs, withMaxTime);
    docs = results.map((r, i) => (again[i] === undefined ? r : { _id: r._id, value: fromJs(again[i]) }));
  }
  const into = { db: output.db, coll: output.coll };
  const stage = output.mode === 'replace' ? { $out: into }
    : { $merge: { into, on: '_id', whenMatched: 'replace', whenNotMatched: 'insert' } };
  await writeStage(ctx, stage, docs, db);
  return { result: output.named ? { db: output.db, collection: output.coll } : output.coll, ok: 1 };
}

module.exports = { mapReduce, mapreduce: mapReduce };
