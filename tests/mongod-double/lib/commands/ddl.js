'use strict';
// Catalogue commands: create, drop, dropDatabase, createIndexes, listIndexes, dropIndexes,
// listCollections, listDatabases, renameCollection, collStats/dbStats (approximate). Views,
// capped collections and validators are accepted and recorded but not enforced.

const { calculateObjectSize } = require('bson');
const { Query } = require('mingo');
const V = require('../values');
const { err } = require('../errors');
const { Index } = require('../storage');
const Ordered = require('../ordered');
const { isPlainObject } = require('../update');
const { recordDdl } = require('../changes');
const { GENERIC } = require('../parse');

function nameOf(cmd, field) {
  const n = cmd[field];
  if (typeof n !== 'string' || !n.length) throw err(73, `Invalid namespace specified '${n}'`);
  return n;
}

async function create(ctx) {
  const { cmd, db } = ctx;
  const name = nameOf(cmd, 'create');
  if (ctx.access.coll(db, name, false)) throw err(48, `Collection ${db}.${name} already exists.`);
  // The collection's options: the command's own fields (parse.js refused any other).
  const options = {};
  for (const k of Object.keys(cmd)) {
    if (k === 'create' || GENERIC.has(k)) continue;
    options[k] = cmd[k];
  }
  if (options.clusteredIndex !== undefined) options.clusteredIndex = clusteredIndexSpec(options.clusteredIndex);
  if (options.clusteredIndex === undefined) delete options.clusteredIndex;
  const c = await ctx.retryOnWait(() => ctx.access.coll(db, name, true, options));
  c.options = options;
  // A clustered collection's _id index is the clustered index, under its name.
  if (options.clusteredIndex) c.idIndex.spec = Object.assign({}, options.clusteredIndex, { clustered: true });
  return { ok: 1 };
}

// create's clusteredIndex option as mongod 7.0 stores it: {v: 2, key: {_id: 1}, name, unique: true}
// (parse.js checked its fields; the legacy `clusteredIndex: true` clusters by _id).
function clusteredIndexSpec(ci) {
  if (!isPlainObject(ci)) return V.truthy(ci) ? { v: 2, key: { _id: 1 }, name: '_id_', unique: true } : undefined;
  if (!V.truthy(ci.unique)) throw err(5979700, "The 'clusteredIndex' option requires 'unique: true'");
  if (V.keys(ci.key).length !== 1 || V.keys(ci.key)[0] !== '_id' || V.toNumber(ci.key._id) !== 1) {
    throw err(5979701, "The clusteredIndex option is only supported for key: {_id: 1}");
  }
  return { v: 2, key: { _id: 1 }, name: ci.name !== undefined ? ci.name : '_id_', unique: true };
}

function abortTxnsTouching(store, coll) {
  for (const t of [...store.activeTxns]) {
    if (t.writes.has(coll)) t.abort('dropped');
  }
}

async function drop(ctx) {
  const { cmd, db } = ctx;
  const name = nameOf(cmd, 'drop');
  const c = ctx.store.getColl(db, name);
  if (!c) return { ok: 1 };
  abortTxnsTouching(ctx.store, c);
  ctx.store.dropColl(db, name);
  recordDdl(ctx.store, 'drop', { db, coll: name, uuid: c.uuid });
  return { nIndexesWas: c.indexes.size, ns: c.ns, ok: 1 };
}

async function dropDatabase(ctx) {
  const d = ctx.store.dbs.get(ctx.db);
  // As mongod: each collection's drop is logged, then the database's.
  if (d) for (const c of d.values()) {
    abortTxnsTouching(ctx.store, c);
    c.dropped = true;
    recordDdl(ctx.store, 'drop', { db: ctx.db, coll: c.name, uuid: c.uuid });
  }
  if (d) recordDdl(ctx.store, 'dropDatabase', { db: ctx.db });
  ctx.store.dropDb(ctx.db);
  return { ok: 1 };
}

function sameKey(a, b) { return V.canonicalKey(a) === V.canonicalKey(b); }

function defaultIndexName(key) {
  return V.keys(key).map((k) => `${k}_${V.isNumeric(key[k]) ? V.toNumber(key[k]) : key[k]}`).join('_');
}

async function createIndexes(ctx) {
  const { cmd, db } = ctx;
  const name = nameOf(cmd, 'createIndexes');
  const specs = cmd.indexes;
  if (!Array.isArray(specs) || !specs.length) throw err(2, 'Must specify at least one index.');
  let coll = ctx.access.coll(db, name, false);
  if (ctx.access.txn && coll && !ctx.access.txn.newColls.has(coll.ns)) {
    throw err(263, `Cannot create new indexes on existing collection ${db}.${name} in a multi-document transaction.`);
  }
  const created = !coll;
  if (!coll) coll = await ctx.retryOnWait(() => ctx.access.coll(db, name, true));
  const before = coll.indexes.size;
  const toAdd = [];
  for (const s of specs) {
    if (!isPlainObject(s) || !isPlainObject(s.key) || !Object.keys(s.key).length) {
      throw err(9, "Error in specification: the 'key' field is required and must be a non-empty object");
    }
    const spec = { v: 2, key: s.key, name: s.name || defaultIndexName(s.key) };
    for (const k of Object.keys(s)) if (k !== 'key' && k !== 'name' && k !== 'v' && k !== 'ns') spec[k] = s[k];
    if (spec.unique !== undefined && !V.truthy(spec.unique)) delete spec.unique;
    else if (spec.unique !== undefined) spec.unique = true;
    const byName = coll.indexes.get(spec.name);
    if (byName) {
      if (!sameKey(byName.key, spec.key)) {
        throw err(86, `An existing index has the same name as the requested index. When index names are not specified, they are auto generated and can cause conflicts. Please refer to our documentation. Requested index: ${JSON.stringify(V.toView(spec))}, existing index: ${JSON.stringify(V.toView(byName.spec))}`);
      }
      if (!!byName.unique !== !!spec.unique) {
        throw err(85, `An existing index has the same name as the requested index. Requested index: ${JSON.stringify(V.toView(spec))}, existing index: ${JSON.stringify(V.toView(byName.spec))}`);
      }
      // A TTL index's window is one of its options: another one is a conflict, which collMod resolves.
      const ttl = (x) => (x.expireAfterSeconds === undefined ? undefined : V.toNumber(x.expireAfterSeconds));
      if (ttl(byName.spec) !== ttl(spec)) {
        throw err(85, `An equivalent index already exists with the same name but different options. Requested index: ${JSON.stringify(V.toView(spec))}, existing index: ${JSON.stringify(V.toView(byName.spec))}`);
      }
      continue;
    }
    for (const ix of coll.indexes.values()) {
      if (sameKey(ix.key, spec.key) && !spec.partialFilterExpression && !ix.spec.partialFilterExpression) {
        throw err(85, `Index already exists with a different name: ${ix.name}`);
      }
    }
    if (spec.partialFilterExpression) {
      try {
        new Query(V.toView(spec.partialFilterExpression)); // eslint-disable-line no-new
      } catch (e) {
        throw err(67, `Error in specification ${spec.name} :: caused by :: ${e.message}`);
      }
    }
    toAdd.push(spec);
  }
  for (const spec of toAdd) {
    const ix = new Index(spec);
    if (ix.unique) {
      for (const [idKey] of coll.records) {
        const v = coll.getLatest(idKey);
        if (!v) continue;
        for (const k of ix.keysOf(v.doc, v.view || V.toView(v.doc))) {
          const owner = ix.entries.get(k);
          if (owner !== undefined && owner !== idKey) throw coll.dupKeyError(ix, v.doc);
          ix.entries.set(k, idKey);
        }
      }
    }
    coll.indexes.set(spec.name, ix);
    Ordered.ordered(coll, ix); // built now, as mongod builds an index, then kept up to date
  }
  if (toAdd.length) recordDdl(ctx.store, 'createIndexes', { db, coll: name, uuid: coll.uuid, desc: { indexes: toAdd } });
  const r = { createdCollectionAutomatically: created, numIndexesBefore: before, numIndexesAfter: coll.indexes.size };
  if (!toAdd.length) r.note = 'all indexes already exist';
  r.ok = 1;
  return r;
}

async function listIndexes(ctx) {
  const { cmd, db } = ctx;
  const name = nameOf(cmd, 'listIndexes');
  const coll = ctx.access.coll(db, name, false);
  if (!coll) throw err(26, `ns does not exist: ${db}.${name}`);
  const docs = [...coll.indexes.values()].map((ix) => ix.spec);
  const bs = cmd.cursor && cmd.cursor.batchSize !== undefined ? V.toNumber(cmd.cursor.batchSize) : undefined;
  return ctx.cursors.open(`${db}.${name}`, docs, { batchSize: bs });
}

async function dropIndexes(ctx) {
  const { cmd, db } = ctx;
  const name = nameOf(cmd, ctx.name);
  const coll = ctx.store.getColl(db, name);
  if (!coll) throw err(26, `ns not found ${db}.${name}`);
  const was = coll.indexes.size;
  const which = cmd.index;
  const names = [];
  if (which === '*') {
    for (const n of coll.indexes.keys()) if (n !== '_id_') names.push(n);
  } else if (typeof which === 'string') names.push(which);
  else if (Array.isArray(which)) names.push(...which);
  else if (isPlainObject(which)) {
    const ix = [...coll.indexes.values()].find((i) => sameKey(i.key, which));
    if (!ix) throw err(27, `can't find index with key: ${JSON.stringify(V.toView(which))}`);
    names.push(ix.name);
  }
  for (const n of names) {
    if (n === '_id_') throw err(72, 'cannot drop _id index');
    if (!coll.indexes.has(n)) throw err(27, `index not found with name [${n}]`);
  }
  const dropped = names.map((n) => coll.indexes.get(n).spec);
  for (const n of names) coll.indexes.delete(n);
  if (dropped.length) recordDdl(ctx.store, 'dropIndexes', { db, coll: name, uuid: coll.uuid, desc: { indexes: dropped } });
  return { nIndexesWas: was, ok: 1 };
}

function collectionEntry(c, nameOnly) {
  const isView = c.options && c.options.viewOn !== undefined;
  const type = isView ? 'view' : c.options && c.options.timeseries ? 'timeseries' : 'collection';
  if (nameOnly) return { name: c.name, type };
  return {
    name: c.name,
    type,
    options: c.options || {},
    info: { readOnly: false, uuid: c.uuid },
    // A clustered or time-series collection has no separate _id index.
    ...(c.options && (c.options.clusteredIndex || c.options.timeseries) ? {} : { idIndex: { v: 2, key: { _id: 1 }, name: '_id_' } }),
  };
}

async function listCollections(ctx) {
  const { cmd, db } = ctx;
  const nameOnly = V.truthy(cmd.nameOnly);
  const colls = [];
  const d = ctx.store.dbs.get(db);
  if (d) for (const c of d.values()) colls.push(c);
  if (ctx.access.txn) for (const c of ctx.access.txn.newColls.values()) if (c.db === db && !colls.includes(c)) colls.push(c);
  let entries = colls.map((c) => collectionEntry(c, false));
  if (cmd.filter && Object.keys(cmd.filter).length) {
    const q = new Query(V.toView(cmd.filter));
    entries = entries.filter((e) => q.test(V.toView(e)));
  }
  if (nameOnly) entries = entries.map((e) => ({ name: e.name, type: e.type }));
  const bs = cmd.cursor && cmd.cursor.batchSize !== undefined ? V.toNumber(cmd.cursor.batchSize) : undefined;
  return ctx.cursors.open(`${db}.$cmd.listCollections`, entries, { batchSize: bs });
}

function collSize(c) {
  let size = 0;
  for (const [idKey] of c.records) {
    const v = c.getLatest(idKey);
    if (v) size += calculateObjectSize(v.doc);
  }
  return size;
}

async function listDatabases(ctx) {
  const { cmd } = ctx;
  const nameOnly = V.truthy(cmd.nameOnly);
  const out = [];
  let total = 0;
  const names = new Set(['admin', 'config', 'local', ...ctx.store.dbs.keys()]);
  for (const name of [...names].sort()) {
    const d = ctx.store.dbs.get(name);
    if (!d || !d.size) {
      if (!['admin', 'config', 'local'].includes(name)) continue;
    }
    let size = 8192;
    if (d) for (const c of d.values()) size += c.liveCount ? 4096 + c.liveCount * 64 : 4096;
    total += size;
    out.push(nameOnly ? { name } : { name, sizeOnDisk: size, empty: false });
  }
  let dbs = out;
  if (cmd.filter && Object.keys(cmd.filter).length) {
    const q = new Query(V.toView(cmd.filter));
    dbs = out.filter((e) => q.test(V.toView(e)));
  }
  if (nameOnly) return { databases: dbs, ok: 1 };
  return { databases: dbs, totalSize: total, totalSizeMb: Math.floor(total / 1048576), ok: 1 };
}

async function renameCollection(ctx) {
  const { cmd } = ctx;
  const from = String(cmd.renameCollection);
  const to = String(cmd.to);
  const [fdb, ...frest] = from.split('.');
  const [tdb, ...trest] = to.split('.');
  const src = ctx.store.getColl(fdb, frest.join('.'));
  if (!src) throw err(26, 'source namespace does not exist');
  let dropTarget = null;
  const target = ctx.store.getColl(tdb, trest.join('.'));
  if (target) {
    if (!V.truthy(cmd.dropTarget)) throw err(48, 'target namespace exists');
    ctx.store.dropColl(tdb, trest.join('.'));
    dropTarget = target.uuid;
  }
  recordDdl(ctx.store, 'rename', {
    db: fdb, coll: frest.join('.'), uuid: src.uuid, to: { db: tdb, coll: trest.join('.') }, dropTarget,
  });
  ctx.store.dropColl(fdb, frest.join('.'));
  src.dropped = false;
  src.db = tdb;
  src.name = trest.join('.');
  src.ns = to;
  ctx.store.attach(src);
  return { ok: 1 };
}

async function collMod(ctx) {
  const { cmd, db } = ctx;
  const name = nameOf(cmd, 'collMod');
  const c = ctx.store.getColl(db, name);
  if (!c) throw err(26, `ns does not exist: ${db}.${name}`);
  const r = {};
  const before = c.options || {};
  const desc = {};
  for (const k of ['validator', 'validationLevel', 'validationAction', 'viewOn', 'pipeline', 'changeStreamPreAndPostImages', 'index']) {
    if (cmd[k] !== undefined) desc[k] = cmd[k];
  }
  for (const k of ['validator', 'validationLevel', 'validationAction', 'viewOn', 'pipeline', 'changeStreamPreAndPostImages']) {
    if (cmd[k] !== undefined) c.options = Object.assign({}, c.options, { [k]: cmd[k] });
  }
  if (cmd.index && isPlainObject(cmd.index)) {
    const ix = [...c.indexes.values()].find((i) => i.name === cmd.index.name || (cmd.index.keyPattern && sameKey(i.key, cmd.index.keyPattern)));
    if (!ix) throw err(27, 'cannot find index');
    Object.assign(r, modifyIndex(c, ix, cmd.index));
  }
  recordDdl(ctx.store, 'modify', { db, coll: name, uuid: c.uuid, desc, before: { collectionOptions: Object.assign({ uuid: c.uuid }, before) } });
  r.ok = 1;
  return r;
}

// collMod's index options expireAfterSeconds (a TTL index's window: the reply names the old and
// the new one when it changed), prepareUnique and unique (mongod 6.0+): prepareUnique makes the
// index refuse new duplicate keys; unique: true then converts it, unless documents already share a
// key (359 CannotConvertIndexToUnique, with the conflicting _ids in `violations`).
function modifyIndex(c, ix, opts) {
  const r = {};
  if (opts.expireAfterSeconds !== undefined) {
    const v = opts.expireAfterSeconds;
    if (!V.isNumeric(v)) throw err(14, "BSON field 'collMod.index.expireAfterSeconds' is the wrong type, expected a number");
    const n = V.toNumber(v);
    if (!Number.isInteger(n) || n < 0 || n > 2147483647) {
      throw err(2, `TTL index 'expireAfterSeconds' option must be within an acceptable range, try a lower number; found: ${n}`);
    }
    if (ix.spec.expireAfterSeconds === undefined && V.keys(ix.key).length !== 1) {
      throw err(72, 'TTL indexes are single-field indexes, compound indexes do not support TTL');
    }
    const was = ix.spec.expireAfterSeconds === undefined ? undefined : V.toNumber(ix.spec.expireAfterSeconds);
    if (was !== n) {
      replaceIndex(c, ix, Object.assign({}, ix.spec, { expireAfterSeconds: n }));
      if (was !== undefined) r.expireAfterSeconds_old = was;
      r.expireAfterSeconds_new = n;
    }
    ix = c.indexes.get(ix.name);
  }
  if (opts.prepareUnique !== undefined) {
    const was = !!ix.spec.prepareUnique;
    const now = V.truthy(opts.prepareUnique);
    if (ix.unique && now) throw err(72, `Cannot set 'prepareUnique' on a unique index: ${ix.name}`);
    if (was !== now) {
      const spec = Object.assign({}, ix.spec);
      if (now) spec.prepareUnique = true;
      else delete spec.prepareUnique;
      replaceIndex(c, ix, spec);
      r.prepareUnique_old = was;
      r.prepareUnique_new = now;
    }
    ix = c.indexes.get(ix.name);
  }
  if (opts.unique !== undefined) {
    if (!V.truthy(opts.unique)) throw err(72, "The field 'unique' can only be true");
    if (ix.unique) return r;
    if (!ix.spec.prepareUnique) throw err(72, "Cannot make index unique with 'prepareUnique' false or not set");
    const groups = new Map();
    for (const idKey of c.records.keys()) {
      const v = c.getLatest(idKey);
      if (!v) continue;
      for (const k of ix.keysOf(v.doc, v.view)) {
        if (!groups.has(k)) groups.set(k, []);
        groups.get(k).push(v.doc._id);
      }
    }
    const violations = [...groups.values()].filter((ids) => ids.length > 1).map((ids) => ({ ids }));
    if (violations.length) {
      throw err(359, 'Cannot convert the index to unique. Please resolve conflicting documents before running collMod again.', { violations });
    }
    const spec = Object.assign({}, ix.spec, { unique: true });
    delete spec.prepareUnique;
    const fresh = replaceIndex(c, ix, spec);
    for (const idKey of c.records.keys()) {
      const v = c.getLatest(idKey);
      if (v) for (const k of fresh.keysOf(v.doc, v.view)) fresh.entries.set(k, idKey);
    }
    r.unique_new = true;
  }
  return r;
}

function replaceIndex(c, ix, spec) {
  const fresh = new Index(spec);
  const order = [...c.indexes.entries()].map(([n, i]) => [n, i === ix ? fresh : i]);
  c.indexes.clear();
  for (const [n, i] of order) c.indexes.set(n, i);
  Ordered.ordered(c, fresh);
  return fresh;
}

// Atlas Search index management: a 7.0 mongod outside Atlas has the commands but no search
// index management host to forward them to.
async function searchIndexCommand(ctx) {
  nameOf(ctx.cmd, ctx.name);
  throw err(115, 'Search index commands are only supported with Atlas.');
}

async function collStats(ctx) {
  const name = nameOf(ctx.cmd, 'collStats');
  const c = ctx.store.getColl(ctx.db, name);
  if (!c) throw err(26, `Collection [${ctx.db}.${name}] not found.`);
  const size = collSize(c);
  return { ns: c.ns, size, count: c.liveCount, avgObjSize: c.liveCount ? Math.floor(size / c.liveCount) : 0, storageSize: size, nindexes: c.indexes.size, ok: 1 };
}

async function dbStats(ctx) {
  const d = ctx.store.dbs.get(ctx.db);
  let objects = 0;
  if (d) for (const c of d.values()) objects += c.liveCount;
  return { db: ctx.db, collections: d ? d.size : 0, views: 0, objects, ok: 1 };
}

module.exports = {
  create, drop, dropDatabase, createIndexes, listIndexes, dropIndexes, deleteIndexes: dropIndexes, listCollections,
  listDatabases, renameCollection, collStats, dbStats, collMod,
  createSearchIndexes: searchIndexCommand, dropSearchIndex: searchIndexCommand, updateSearchIndex: searchIndexCommand,
};
