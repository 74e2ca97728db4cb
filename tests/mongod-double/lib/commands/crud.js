'use strict';
// CRUD commands: insert, update, delete, findAndModify, find, getMore, killCursors, aggregate
// ($out/$merge included), count, distinct. They read and write only through ctx.access, so
// the same code serves transactions and autocommit; waiting for a transaction that holds a
// document is done by ctx.retryOnWait.

const { BSON, calculateObjectSize } = require('bson');
const V = require('../values');
const { err, MongoError } = require('../errors');
const { select, pipelineInput, project, aggregate, compileFilter, evalLet } = require('../query');
const { WaitFor } = require('../storage');
const { applyUpdate, upsertSeed, withIdFirst, kindOfUpdate, isPlainObject } = require('../update');
const changeStreams = require('../changestreams');
const Ordered = require('../ordered');

function collName(cmd, name) {
  const c = cmd[name];
  if (typeof c !== 'string' || !c.length) {
    throw err(73, `collection name has invalid type ${V.bsonTag(c)}`);
  }
  return c;
}

function writeErrorOf(e, index) {
  const we = { index, code: e.code };
  if (e.extra) Object.assign(we, e.extra);
  we.errmsg = e.errmsg;
  return we;
}

// Also the size check of an updated document, since it serialises it anyway.
function sameDoc(a, b) {
  const nb = BSON.serialize(V.forWire(b));
  if (nb.length > MAX_DOC) throw err(17419, `Resulting document after update is larger than ${MAX_DOC}`);
  return BSON.serialize(V.forWire(a)).equals(nb);
}

// {_id, ...doc} keeping doc's field order.
function withId(id, doc) {
  return V.fromEntries([['_id', id], ...V.keys(doc).filter((k) => k !== '_id').map((k) => [k, doc[k]])]);
}

const MAX_DOC = 16 * 1024 * 1024;

function validateNewDoc(doc) {
  if (!isPlainObject(doc)) throw err(2, 'document to insert must be an object');
  const size = calculateObjectSize(doc);
  if (size > MAX_DOC) throw err(10334, `object to insert too large. size in bytes: ${size}, max size: ${MAX_DOC}`);
  if (Array.isArray(doc._id)) throw err(53, "can't use an array for _id");
  if (isPlainObject(doc._id)) {
    for (const k of Object.keys(doc._id)) {
      if (k.startsWith('$')) throw err(52, `_id fields may not contain '$'-prefixed fields: ${k} is not valid for storage.`);
    }
  }
  if (doc._id && V.bsonTag(doc._id) === 'regex') throw err(2, "can't use a regex for _id");
}

function notAView(coll) {
  if (coll && coll.options && coll.options.viewOn !== undefined) {
    throw err(166, `Namespace ${coll.ns} is a view, not a collection`);
  }
  return coll;
}

function insertOne(ctx, coll, doc) {
  if (coll.options && coll.options.timeseries) {
    // A time-series collection (mongod 5.0+) has no _id index: _ids may repeat, so each
    // measurement is its own record. Its time field must be a date.
    const tf = coll.options.timeseries.timeField;
    if (typeof tf === 'string' && !(V.getPath(doc, tf) instanceof Date)) {
      throw err(2, `'${tf}' must be present and contain a valid BSON UTC datetime value`);
    }
    coll.tsSeq = (coll.tsSeq || 0) + 1;
    ctx.access.put(coll, `${V.canonicalKey(doc._id)}\u0000ts${coll.tsSeq}`, doc);
    return;
  }
  const idKey = V.canonicalKey(doc._id);
  if (ctx.access.get(coll, idKey)) throw coll.dupKeyError(coll.idIndex, doc);
  ctx.access.put(coll, idKey, doc);
}

// Statement-level errors end a transaction: the next statement gets NoSuchTransaction.
function statementFailed(ctx, e) {
  if (!(e instanceof MongoError)) throw e;
  // Whole-command errors; interruptions (a step-down: 11602) fail the whole batch, as on mongod.
  if (e.code === 112 || e.code === 50 || e.code === 290 || e.code === 11602) throw e;
  if (ctx.access.txn) ctx.abortTxnAfterReply = true;
  return e;
}

async function insert(ctx) {
  const { cmd, db } = ctx;
  const name = collName(cmd, 'insert');
  const docs = present(cmd.documents);
  const ordered = cmd.ordered === undefined ? true : V.truthy(cmd.ordered);
  const coll = notAView(await ctx.retryOnWait(() => ctx.access.coll(db, name, true)));
  let n = 0;
  const writeErrors = [];
  for (let i = 0; i < docs.length; i++) {
    // A retried statement that already succeeded is not executed again.
    if (ctx.retryStmts && ctx.retryStmts.has(ctx.stmtId(i))) {
      n += ctx.retryStmts.get(ctx.stmtId(i)).n;
      continue;
    }
    try {
      ctx.txnWriteFailpoint();
      validateNewDoc(docs[i]);
      const doc = withIdFirst(V.cloneValue(docs[i]));
      await ctx.retryOnWait(() => insertOne(ctx, coll, doc));
      n++;
      if (ctx.retryStmts) ctx.retryStmts.set(ctx.stmtId(i), { n: 1 });
    } catch (e) {
      writeErrors.push(writeErrorOf(statementFailed(ctx, e), i));
      if (ordered || ctx.access.txn) break;
    }
  }
  const r = { n };
  if (writeErrors.length) r.writeErrors = writeErrors;
  r.ok = 1;
  return r;
}

// Applies one update statement; returns {n, nModified, upsertedId}.
async function updateStatement(ctx, collIn, st, db, name) {
  let coll = collIn;
  const q = st.q || {};
  const u = st.u;
  const multi = V.truthy(st.multi);
  const upsert = V.truthy(st.upsert);
  const kind = kindOfUpdate(u);
  if (multi && kind === 'replacement') throw err(9, 'multi update is not supported for replacement-style update');
  const queryView = V.toView(q);
  const opts = { queryView, arrayFilters: st.arrayFilters, variables: ctx.vars };
  const sel = { filter: q, limit: multi ? 0 : 1, variables: ctx.vars, collation: st.collation };
  if (kind === 'operator') for (const f of st.arrayFilters || []) if (!isPlainObject(f)) throw err(9, 'arrayFilters must be objects');
  // An upsert that finds nothing and then collides (a transaction holds the key, or another
  // writer inserted it meanwhile) starts over, as mongod retries upserts on DuplicateKey.
  for (let attempt = 0; ; attempt++) {
    if (!coll) coll = ctx.access.coll(db, name, false);
    let n = 0;
    let nModified = 0;
    if (coll) {
      const q1 = compileFilter(q, sel);
      const matches = select(ctx.access, coll, sel);
      for (const m of matches) {
        const done = await ctx.retryOnWait(() => {
          const cur = ctx.access.get(coll, m.idKey);
          if (!cur) return false;
          if (q1 && !q1.test(cur.view || (cur.view = V.toView(cur.doc)), cur.doc)) return false;
          const next = applyUpdate(cur.doc, u, opts);
          if (sameDoc(cur.doc, next)) return 'same';
          ctx.txnWriteFailpoint();
          ctx.access.put(coll, m.idKey, next, kind === 'replacement' ? 'replace' : 'update', u);
          return 'modified';
        });
        if (done) n++;
        if (done === 'modified') nModified++;
      }
    }
    if (n > 0 || !upsert) return { n, nModified };
    const target = coll || (await ctx.retryOnWait(() => ctx.access.coll(db, name, true)));
    const seed = upsertSeed(q);
    let d;
    if (kind === 'replacement') {
      d = V.cloneValue(u);
      if (d._id === undefined && seed._id !== undefined) d = withId(seed._id, d);
    } else d = applyUpdate(seed, u, Object.assign({}, opts, { isInsert: true }));
    d = withIdFirst(d);
    validateNewDoc(d);
    try {
      ctx.txnWriteFailpoint();
      insertOne(ctx, target, d);
      return { n: 1, nModified: 0, upsertedId: d._id };
    } catch (e) {
      if (e instanceof WaitFor) {
        await ctx.waitTxn(e.txn);
        continue;
      }
      if (e.code === 11000 && !ctx.access.txn && attempt < 3) continue;
      throw e;
    }
  }
}

async function update(ctx) {
  const { cmd, db } = ctx;
  const name = collName(cmd, 'update');
  const updates = present(cmd.updates);
  const ordered = cmd.ordered === undefined ? true : V.truthy(cmd.ordered);
  ctx.vars = evalLet(cmd.let);
  let coll = notAView(ctx.access.coll(db, name, false));
  let n = 0;
  let nModified = 0;
  const upserted = [];
  const writeErrors = [];
  for (let i = 0; i < updates.length; i++) {
    try {
      const r = ctx.retryStmts && ctx.retryStmts.has(ctx.stmtId(i))
        ? ctx.retryStmts.get(ctx.stmtId(i))
        : await updateStatement(ctx, coll, updates[i], db, name);
      if (ctx.retryStmts) ctx.retryStmts.set(ctx.stmtId(i), r);
      if (!coll) coll = ctx.access.coll(db, name, false);
      n += r.n;
      nModified += r.nModified;
      if (r.upsertedId !== undefined) upserted.push({ index: i, _id: r.upsertedId });
    } catch (e) {
      writeErrors.push(writeErrorOf(statementFailed(ctx, e), i));
      if (ordered || ctx.access.txn) break;
    }
  }
  const r = { n, nModified };
  if (upserted.length) r.upserted = upserted;
  if (writeErrors.length) r.writeErrors = writeErrors;
  r.ok = 1;
  return r;
}

async function del(ctx) {
  const { cmd, db } = ctx;
  const name = collName(cmd, 'delete');
  const deletes = present(cmd.deletes);
  const ordered = cmd.ordered === undefined ? true : V.truthy(cmd.ordered);
  const coll = notAView(ctx.access.coll(db, name, false));
  const vars = evalLet(cmd.let);
  let n = 0;
  const writeErrors = [];
  for (let i = 0; i < deletes.length; i++) {
    const st = deletes[i];
    if (ctx.retryStmts && ctx.retryStmts.has(ctx.stmtId(i))) {
      n += ctx.retryStmts.get(ctx.stmtId(i)).n;
      continue;
    }
    const nBefore = n;
    try {
      // 0 or 1 (parse.js); any other type reads as 0, as mongod reads it.
      const limit = V.isNumeric(st.limit) ? V.toNumber(st.limit) : 0;
      if (!coll) continue;
      const sel = { filter: st.q, limit, variables: vars, collation: st.collation };
      const q1 = compileFilter(st.q, sel);
      const matches = select(ctx.access, coll, sel);
      for (const m of matches) {
        const ok = await ctx.retryOnWait(() => {
          const cur = ctx.access.get(coll, m.idKey);
          if (!cur || (q1 && !q1.test(cur.view || (cur.view = V.toView(cur.doc)), cur.doc))) return false;
          ctx.txnWriteFailpoint();
          ctx.access.put(coll, m.idKey, null);
          return true;
        });
        if (ok) n++;
      }
      if (ctx.retryStmts) ctx.retryStmts.set(ctx.stmtId(i), { n: n - nBefore });
    } catch (e) {
      writeErrors.push(writeErrorOf(statementFailed(ctx, e), i));
      if (ordered || ctx.access.txn) break;
    }
  }
  const r = { n };
  if (writeErrors.length) r.writeErrors = writeErrors;
  r.ok = 1;
  return r;
}

function projectOne(doc, fields) {
  if (!doc) return null;
  if (!fields || !Object.keys(fields).length) return doc;
  return project([{ doc, view: V.toView(doc) }], fields)[0];
}

async function findAndModify(ctx, attempt) {
  const { cmd, db } = ctx;
  const name = collName(cmd, ctx.name);
  const remove = V.truthy(cmd.remove);
  const upsert = V.truthy(cmd.upsert);
  const returnNew = V.truthy(cmd.new);
  const u = cmd.update;
  if (remove && u !== undefined) throw err(9, 'Cannot specify both an update and remove=true');
  if (!remove && u === undefined) throw err(9, 'Either an update or remove=true must be specified');
  if (remove && upsert) throw err(9, 'Cannot specify both upsert=true and remove=true');
  if (remove && returnNew) throw err(9, 'Cannot specify both new=true and remove=true; \'remove\' always returns the deleted document');
  const q = cmd.query || {};
  const vars = evalLet(cmd.let);
  const sel = { filter: q, sort: cmd.sort, limit: 1, variables: vars, collation: cmd.collation };
  const q1 = compileFilter(q, sel);
  const coll = notAView(ctx.access.coll(db, name, false));
  const kind = remove ? null : kindOfUpdate(u);
  const opts = { queryView: V.toView(q), arrayFilters: cmd.arrayFilters, variables: vars };
  const match = coll ? select(ctx.access, coll, sel)[0] : null;
  if (match) {
    const res = await ctx.retryOnWait(() => {
      const cur = ctx.access.get(coll, match.idKey);
      if (!cur || (q1 && !q1.test(cur.view || (cur.view = V.toView(cur.doc)), cur.doc))) return null;
      ctx.txnWriteFailpoint();
      if (remove) {
        ctx.access.put(coll, match.idKey, null);
        return { old: cur.doc, next: null };
      }
      const next = applyUpdate(cur.doc, u, opts);
      if (!sameDoc(cur.doc, next)) ctx.access.put(coll, match.idKey, next, kind === 'replacement' ? 'replace' : 'update', u);
      return { old: cur.doc, next };
    });
    if (res) {
      const leo = remove ? { n: 1 } : { n: 1, updatedExisting: true };
      return { lastErrorObject: leo, value: projectOne(remove || !returnNew ? res.old : res.next, cmd.fields), ok: 1 };
    }
  }
  if (upsert) {
    const target = coll || (await ctx.retryOnWait(() => ctx.access.coll(db, name, true)));
    const seed = upsertSeed(q);
    let d;
    if (kind === 'replacement') {
      d = V.cloneValue(u);
      if (d._id === undefined && seed._id !== undefined) d = withId(seed._id, d);
    } else d = applyUpdate(seed, u, Object.assign({}, opts, { isInsert: true }));
    d = withIdFirst(d);
    validateNewDoc(d);
    try {
      ctx.txnWriteFailpoint();
      insertOne(ctx, target, d);
    } catch (e) {
      // Someone else got there first: start over so the upsert becomes an update.
      if (e instanceof WaitFor) {
        await ctx.waitTxn(e.txn);
        return findAndModify(ctx, (attempt || 0) + 1);
      }
      if (e.code === 11000 && !ctx.access.txn && (attempt || 0) < 3) return findAndModify(ctx, (attempt || 0) + 1);
      throw e;
    }
    return {
      lastErrorObject: { n: 1, updatedExisting: false, upserted: d._id },
      value: returnNew ? projectOne(d, cmd.fields) : null,
      ok: 1,
    };
  }
  const leo = remove ? { n: 0 } : { n: 0, updatedExisting: false };
  return { lastErrorObject: leo, value: null, ok: 1 };
}

function isNull(v) { return v === undefined || v === null; }
// The statements of a write command: mongod's parser leaves out null elements of the array.
function present(list) { return list.some(isNull) ? list.filter((x) => !isNull(x)) : list; }
function num(v, def) { return isNull(v) ? def : V.toNumber(v); }

async function find(ctx) {
  const { cmd, db } = ctx;
  const name = collName(cmd, 'find');
  const coll = ctx.access.coll(db, name, false);
  // skip, limit and batchSize are >= 0 and filter an object (parse.js).
  const limit = num(cmd.limit, 0);
  const singleBatch = V.truthy(cmd.singleBatch);
  const skip = num(cmd.skip, 0);
  const batchSize = isNull(cmd.batchSize) ? undefined : num(cmd.batchSize, 101);
  const tailable = V.truthy(cmd.tailable);
  if (tailable) checkTailable(cmd, db, name, coll);
  const records = select(ctx.access, coll, { filter: cmd.filter, sort: cmd.sort, skip, limit, variables: evalLet(cmd.let), collation: cmd.collation });
  const docs = project(records, cmd.projection, cmd.filter);
  // A tailable cursor remembers what it returned, to hand out only later inserts (tailMore).
  const tail = tailable ? { filter: cmd.filter, projection: cmd.projection, seen: new Set(records.map((r) => r.idKey)) } : null;
  return ctx.cursors.open(`${db}.${name}`, docs, { batchSize, singleBatch, session: ctx.sessionKey, tail });
}

// mongod's planner refuses a tailable find on a collection that is not capped, and with a sort
// other than natural order (a capped collection's order is its insertion order).
function checkTailable(cmd, db, name, coll) {
  if (!coll || !coll.options || !V.truthy(coll.options.capped)) {
    throw err(2, `error processing query: ns=${db}.${name} planner returned error :: caused by :: tailable cursor requested on non capped collection`);
  }
  const sortKeys = cmd.sort ? V.keys(cmd.sort) : [];
  if (sortKeys.length && !(sortKeys.length === 1 && sortKeys[0] === '$natural' && V.toNumber(cmd.sort.$natural) === 1)) {
    throw err(2, `error processing query: ns=${db}.${name} planner returned error :: caused by :: cannot use tailable option with a sort other than {$natural: 1}`);
  }
}

// Before a getMore of an exhausted tailable cursor: the documents matching its filter that were
// inserted since, in insertion order. A tailableAwait cursor does not wait for them here.
function tailMore(ctx, c, db, collName) {
  if (!c.tail || c.pos < c.docs.length) return;
  const coll = ctx.access.coll(db, collName, false);
  const fresh = select(ctx.access, coll, { filter: c.tail.filter }).filter((r) => !c.tail.seen.has(r.idKey));
  for (const r of fresh) c.tail.seen.add(r.idKey);
  c.docs = c.docs.slice(c.pos).concat(project(fresh, c.tail.projection, c.tail.filter));
  c.pos = 0;
}

async function getMore(ctx) {
  const { cmd, db } = ctx;
  const id = V.toBigIntExact(cmd.getMore);
  const c = ctx.cursors.cursors.get(id.toString());
  if (c) {
    if (c.ns !== `${db}.${cmd.collection}` && !c.ns.startsWith(`${db}.$cmd`)) {
      throw err(13, `Requested getMore on namespace '${db}.${cmd.collection}', but cursor belongs to a different namespace ${c.ns}`);
    }
    // The cursor is checked out: what fails from here on knows it is a change stream's
    // (ResumableChangeStreamError), and the failed cursor is gone, as on mongod.
    ctx.changeStream = !!c.stream;
    const fp = ctx.server.failpoints.afterCursorCheckout();
    if (fp && fp.errorCode !== undefined) {
      ctx.cursors.cursors.delete(id.toString());
      throw err(V.toNumber(fp.errorCode), "Hit the 'failGetMoreAfterCursorCheckout' failpoint");
    }
    if (c.stream) return changeStreams.getMore(ctx, c, num(cmd.batchSize, 0));
    tailMore(ctx, c, db, cmd.collection);
  }
  return ctx.cursors.getMore(id, cmd.collection, db, num(cmd.batchSize, 0));
}

async function killCursors(ctx) {
  const ids = (ctx.cmd.cursors || []).map((c) => c);
  const r = ctx.cursors.kill(ids.map((c) => V.toBigIntExact(c)));
  const toLong = (x) => V.Long.fromBigInt(x);
  return {
    cursorsKilled: r.cursorsKilled.map(toLong), cursorsNotFound: r.cursorsNotFound.map(toLong),
    cursorsAlive: [], cursorsUnknown: [], ok: 1,
  };
}

async function count(ctx) {
  const { cmd, db } = ctx;
  const name = collName(cmd, 'count');
  const coll = ctx.access.coll(db, name, false);
  if (!coll) return { n: 0, ok: 1 };
  const skip = num(cmd.skip, 0);
  let limit = Math.abs(num(cmd.limit, 0));
  if ((!cmd.query || !Object.keys(cmd.query).length) && !(coll.options && coll.options.viewOn !== undefined)) {
    let n = ctx.access.count(coll) - skip;
    if (n < 0) n = 0;
    if (limit && n > limit) n = limit;
    return { n, ok: 1 };
  }
  const n = select(ctx.access, coll, { filter: cmd.query, skip, limit, collation: cmd.collation }).length;
  return { n, ok: 1 };
}

async function distinct(ctx) {
  const { cmd, db } = ctx;
  const name = collName(cmd, 'distinct');
  const coll = ctx.access.coll(db, name, false);
  const values = [];
  const seen = new Set();
  for (const r of select(ctx.access, coll, { filter: cmd.query, collation: cmd.collation })) {
    for (const v of V.pathValues(r.doc, cmd.key)) {
      const list = Array.isArray(v) ? v : [v];
      for (const x of list) {
        if (x === undefined) continue;
        const k = V.canonicalKey(x);
        if (seen.has(k)) continue;
        seen.add(k);
        values.push(x);
      }
    }
  }
  values.sort(V.compareValues);
  return { values, ok: 1 };
}

// ---- aggregate ----

async function writeStage(ctx, stage, docs, db) {
  const spec = stage.$out !== undefined ? stage.$out : stage.$merge;
  let targetDb = db;
  let targetName;
  if (typeof spec === 'string') targetName = spec;
  else if (stage.$out !== undefined) {
    targetDb = spec.db || db;
    targetName = spec.coll;
  } else if (typeof spec.into === 'string') targetName = spec.into;
  else {
    targetDb = spec.into.db || db;
    targetName = spec.into.coll;
  }
  const access = ctx.access;
  if (stage.$out !== undefined) {
    // $out replaces the target atomically.
    const seen = new Set();
    for (const d of docs) {
      const doc = withIdFirst(d);
      const k = V.canonicalKey(doc._id);
      if (seen.has(k)) throw err(11000, `E11000 duplicate key error collection: ${targetDb}.${targetName} index: _id_ dup key: { _id: ${V.canonicalKey(doc._id)} }`);
      seen.add(k);
    }
    const old = ctx.store.getColl(targetDb, targetName);
    const fresh = ctx.store.createColl(targetDb, targetName, old ? old.options : {});
    if (old) {
      for (const [n, ix] of old.indexes) {
        if (n === '_id_') continue;
        fresh.indexes.set(n, new (ix.constructor)(ix.spec));
        Ordered.ordered(fresh, fresh.indexes.get(n));
      }
    }
    for (const d of docs) {
      const doc = withIdFirst(d);
      fresh.checkUnique(V.canonicalKey(doc._id), doc, V.toView(doc), null);
      fresh.publish(V.canonicalKey(doc._id), doc, V.toView(doc), ctx.store.nextTs());
    }
    if (old) old.dropped = true;
    return;
  }
  const coll = await ctx.retryOnWait(() => access.coll(targetDb, targetName, true));
  const on = spec.on ? (Array.isArray(spec.on) ? spec.on : [spec.on]) : ['_id'];
  const whenMatched = spec.whenMatched || 'merge';
  const whenNotMatched = spec.whenNotMatched || 'insert';
  for (const d of docs) {
    let doc = d;
    const filter = {};
    for (const f of on) filter[f] = V.getPath(doc, f) === undefined ? null : V.getPath(doc, f);
    const existing = select(access, coll, { filter, limit: 1 })[0];
    await ctx.retryOnWait(() => {
      if (existing) {
        if (whenMatched === 'keepExisting') return;
        if (whenMatched === 'fail') throw coll.dupKeyError(coll.idIndex, existing.doc);
        let next;
        if (whenMatched === 'replace') next = withId(existing.doc._id, doc);
        else if (whenMatched === 'merge') {
          next = V.cloneValue(existing.doc);
          for (const k of V.keys(doc)) V.setKey(next, k, doc[k]);
        }
        else if (Array.isArray(whenMatched)) {
          next = applyUpdate(existing.doc, whenMatched, { variables: Object.assign({}, ctx.vars, { new: V.toView(doc) }) });
        } else throw err(51191, `Unsupported whenMatched mode`);
        next = withId(existing.doc._id, next);
        // whenMatched merge is an update that sets the new document's fields.
        access.put(coll, existing.idKey, next, whenMatched === 'replace' ? 'replace' : 'update',
          whenMatched === 'merge' ? { $set: doc } : undefined);
        return;
      }
      if (whenNotMatched === 'discard') return;
      if (whenNotMatched === 'fail') throw err(13113, "Found no matching document in the target collection for $merge with whenNotMatched: 'fail'");
      doc = withIdFirst(V.cloneValue(doc));
      insertOne(ctx, coll, doc);
    });
  }
}

async function aggregateCmd(ctx) {
  const { cmd, db } = ctx;
  const pipeline = cmd.pipeline;
  if (changeStreams.isChangeStreamPipeline(pipeline)) {
    ctx.vars = evalLet(cmd.let);
    return changeStreams.open(ctx);
  }
  // A 7.0 mongod without Atlas (no search index management host) refuses the stage.
  if (pipeline.length && isPlainObject(pipeline[0]) && pipeline[0].$listSearchIndexes !== undefined) {
    throw err(115, '$listSearchIndexes stage is only allowed on MongoDB Atlas');
  }
  const explain = V.truthy(cmd.explain);
  if (!explain && !isPlainObject(cmd.cursor)) {
    throw err(9, "The 'cursor' option is required, except for aggregate with the explain argument");
  }
  const last = pipeline[pipeline.length - 1];
  const writes = last && (last.$out !== undefined || last.$merge !== undefined);
  if (writes && ctx.access.txn) {
    throw err(263, `${last.$out !== undefined ? '$out' : '$merge'} cannot be used in a transaction`);
  }
  let stages = writes ? pipeline.slice(0, -1) : pipeline.slice();
  ctx.vars = evalLet(cmd.let);
  if (writes && cmd.readConcern && cmd.readConcern.level === 'linearizable') {
    throw err(2, `cannot use readConcern level 'linearizable' with ${last.$out !== undefined ? '$out' : '$merge'}`);
  }
  let inputs;
  let nsName;
  if (typeof cmd.aggregate === 'string') {
    nsName = cmd.aggregate;
    const coll = ctx.access.coll(db, nsName, false);
    // The leading $match (and what follows it) uses the _id/unique lookups and the indexes
    // instead of handing mingo everything.
    ({ inputs, stages } = pipelineInput(ctx.access, coll, stages, ctx.vars, cmd.collation));
  } else {
    nsName = '$cmd.aggregate';
    inputs = [];
    const first = stages[0];
    if (!first || !(first.$documents || first.$currentOp || first.$listLocalSessions)) {
      throw err(73, "{aggregate: 1} is not valid for '$match'; a collection is required.");
    }
    if (first.$currentOp || first.$listLocalSessions) {
      stages = stages.slice(1);
    }
  }
  const resolver = (name) => {
    const c = ctx.access.coll(db, name, false);
    // Fresh views: joined documents flow into later stages, which may edit them.
    return c ? select(ctx.access, c, {}).map((r) => V.toView(r.doc)) : [];
  };
  const out = stages.length ? aggregate(inputs, stages, { resolver, variables: ctx.vars }) : inputs;
  if (explain) return { explainVersion: '1', stages: [], serverInfo: { version: '7.0.0' }, ok: 1 };
  if (writes) {
    await writeStage(ctx, last, out, db);
    return ctx.cursors.open(`${db}.${nsName}`, [], {});
  }
  const batchSize = cmd.cursor.batchSize === undefined ? undefined : V.toNumber(cmd.cursor.batchSize);
  return ctx.cursors.open(`${db}.${nsName}`, out, { batchSize, session: ctx.sessionKey });
}

// explain reports how a find is answered (COLLSCAN, IDHACK, or IXSCAN with the index names)
// and, with executionStats, the real number of returned documents and of index entries and
// documents looked at.
async function explain(ctx) {
  const inner = ctx.cmd.explain;
  if (!isPlainObject(inner)) throw err(9, 'explain command requires a nested object');
  const name = Object.keys(inner)[0];
  const collName = typeof inner[name] === 'string' ? inner[name] : '';
  const filter = inner.filter || inner.query || (inner.q) || {};
  const ns = `${ctx.db}.${collName}`;
  const idHack = isPlainObject(filter) && Object.keys(filter).length === 1 && filter._id !== undefined && !isPlainObject(filter._id);
  let winningPlan = { stage: idHack ? 'IDHACK' : 'COLLSCAN' };
  let executionStats;
  if (name === 'find') {
    const coll = ctx.access.coll(ctx.db, collName, false);
    const stats = {};
    const n = select(ctx.access, coll, { filter, sort: inner.sort, skip: inner.skip ? V.toNumber(inner.skip) : 0, limit: inner.limit ? Math.abs(V.toNumber(inner.limit)) : 0, collation: inner.collation, stats }).length;
    if (stats.stage === 'IXSCAN') {
      const scans = stats.indexes.map((indexName) => ({ stage: 'IXSCAN', indexName }));
      winningPlan = { stage: 'FETCH', inputStage: scans.length === 1 ? scans[0] : { stage: 'OR', inputStages: scans } };
    }
    executionStats = { executionSuccess: true, nReturned: n, executionTimeMillis: 0, totalKeysExamined: stats.keys || 0, totalDocsExamined: stats.docs || 0 };
  }
  const r = {
    explainVersion: '1',
    queryPlanner: { namespace: ns, indexFilterSet: false, parsedQuery: filter, winningPlan, rejectedPlans: [] },
  };
  if (ctx.cmd.verbosity !== 'queryPlanner' && executionStats) r.executionStats = executionStats;
  r.command = inner;
  r.serverInfo = { host: 'localhost', port: ctx.server.port, version: '7.0.0', gitVersion: '0000000000000000000000000000000000000000' };
  r.ok = 1;
  return r;
}

module.exports = {
  explain,
  insert, update, delete: del, findAndModify, findandmodify: findAndModify, find, getMore, killCursors,
  aggregate: aggregateCmd, count, distinct,
  // For mapReduce's output (commands/mapreduce.js); a leading _ keeps it out of the command table.
  _writeStage: writeStage,
};
