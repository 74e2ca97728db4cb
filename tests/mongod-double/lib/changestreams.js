'use strict';
// Change streams: the `$changeStream` aggregation stage on a collection, a database
// (`aggregate: 1`) or the cluster (`allChangesForCluster` on admin), and the getMore of its
// cursor. A stream is a position in the change log (changes.js) plus its options; each batch
// turns the log's entries after that position into change events (skipping what the stream
// does not watch), runs the stages after `$changeStream` on them, and answers them with a
// postBatchResumeToken. An empty getMore waits (awaitData) for new entries up to maxTimeMS
// (default 1 s) without holding anything else up. Invalidating events (drop or rename of the
// watched collection, dropDatabase of the watched database) end the stream.
//
// Resume tokens are {_data: hex}: the event's cluster time, its index in a transaction, a
// flag (event, invalidate, high-water mark) and its place in the log. Their hex strings sort
// in event order, as mongod's do; they are this double's own, not mongod's KeyString format.

const { Long, Int32, Binary, Timestamp, calculateObjectSize } = require('bson');
const crypto = require('crypto');
const V = require('./values');
const { err } = require('./errors');
const { aggregate } = require('./query');
const { updateDescription } = require('./changes');
const { parseStruct, rawAt, DocumentSourceChangeStreamSpec } = require('./parse');

const isNull = (v) => v === undefined || v === null;

// Stages allowed after $changeStream (mongod's change stream pipeline restrictions).
const ALLOWED_STAGES = new Set(['$match', '$project', '$addFields', '$set', '$unset', '$replaceRoot', '$replaceWith', '$redact']);
const KNOWN_STAGES = new Set(['$group', '$sort', '$limit', '$skip', '$lookup', '$unwind', '$count', '$facet', '$bucket',
  '$bucketAuto', '$sortByCount', '$out', '$merge', '$sample', '$graphLookup', '$geoNear', '$indexStats', '$collStats',
  '$densify', '$fill', '$setWindowFields', '$unionWith', '$documents', '$currentOp', '$listLocalSessions',
  '$listSessions', '$planCacheStats', '$search', '$searchMeta', '$changeStream', '$changeStreamSplitLargeEvent']);
const EXPANDED_ONLY = new Set(['create', 'createIndexes', 'dropIndexes', 'modify', 'shardCollection']);
const INTERNAL_DBS = new Set(['admin', 'config', 'local']);
const FLAG_EVENT = 0;
const FLAG_INVALIDATE = 1;
const FLAG_HWM = 2;
const BATCH_BYTES = 16 * 1024 * 1024 - 64 * 1024;
// mongod's uid of an unauthenticated session: SHA-256 of the empty user name.
const NO_USER_UID = new Binary(crypto.createHash('sha256').update('').digest(), 0);

const hex = (n, width) => n.toString(16).padStart(width, '0');

function encodeToken(secs, inc, opIndex, flag, seq) {
  return { _data: `${hex(secs >>> 0, 8)}${hex(inc >>> 0, 8)}${hex(opIndex >>> 0, 8)}${hex(flag, 2)}${hex(seq, 16)}` };
}

function decodeToken(tok, field) {
  if (!tok || typeof tok !== 'object' || typeof tok._data !== 'string') {
    throw err(40647, `Bad resume token: _data of missing or of wrong type. Expected string, got ${V.bsonTag(tok && tok._data)}`);
  }
  const m = /^([0-9a-f]{8})([0-9a-f]{8})([0-9a-f]{8})([0-9a-f]{2})([0-9a-f]{16})$/.exec(tok._data);
  if (!m) throw err(40647, `Bad resume token: _data is not a resume token of this server: ${tok._data} (${field})`);
  return { secs: parseInt(m[1], 16), inc: parseInt(m[2], 16), opIndex: parseInt(m[3], 16), flag: parseInt(m[4], 16), seq: parseInt(m[5], 16) };
}

function eventTime(server, entry) { return new Timestamp({ t: server.bootSecs, i: entry.ts + 1 }); }
function entryToken(server, entry, flag) {
  return encodeToken(server.bootSecs, entry.ts + 1, entry.opIndex || 0, flag || FLAG_EVENT, entry.seq);
}

function isChangeStreamPipeline(pipeline) {
  const first = Array.isArray(pipeline) ? pipeline[0] : null;
  return !!(first && typeof first === 'object' && Object.prototype.hasOwnProperty.call(first, '$changeStream'));
}

function historyLost() {
  return err(286, 'Resume of change stream was not possible, as the resume point may no longer be in the oplog.');
}

// The stream's starting position in the log: it reads the entries after `pos`.
function startPosition(server, spec) {
  const log = server.store.changes;
  const resume = !isNull(spec.resumeAfter) ? 'resumeAfter' : !isNull(spec.startAfter) ? 'startAfter' : null;
  if (resume) {
    const t = decodeToken(spec[resume], resume);
    if (t.flag === FLAG_INVALIDATE && resume === 'resumeAfter') {
      throw err(260, "Attempting to resume a change stream using 'resumeAfter' is not allowed from an invalidate notification.");
    }
    if (t.secs !== server.bootSecs || t.seq > log.lastSeq) {
      throw err(280, `cannot resume stream; the resume token was not found. ${JSON.stringify(spec[resume])}`);
    }
    if (t.seq < log.firstSeq - 1) throw historyLost();
    return t.seq;
  }
  if (!isNull(spec.startAtOperationTime)) {
    const ts = spec.startAtOperationTime;
    const at = (inc) => (server.bootSecs > ts.t || (server.bootSecs === ts.t && inc >= ts.i));
    if (log.lastEvictedTs !== null && at(log.lastEvictedTs + 1)) throw historyLost();
    let pos = log.firstSeq - 1;
    for (let s = log.firstSeq; s <= log.lastSeq; s++) {
      if (at(log.at(s).ts + 1)) break;
      pos = s;
    }
    return pos;
  }
  return log.visibleSeq;
}

// raw: the stage's BSON as received (parse.js's rawAt), to refuse an option given twice.
function checkSpec(spec, raw) {
  if (!spec || typeof spec !== 'object' || Array.isArray(spec)) {
    throw err(50808, '$changeStream stage expects a document as argument');
  }
  parseStruct(DocumentSourceChangeStreamSpec, spec, ['$changeStream'], {}, raw);
  const fd = isNull(spec.fullDocument) ? 'default' : spec.fullDocument;
  const fb = isNull(spec.fullDocumentBeforeChange) ? 'off' : spec.fullDocumentBeforeChange;
  const resumes = ['resumeAfter', 'startAfter', 'startAtOperationTime'].filter((k) => !isNull(spec[k]));
  if (!isNull(spec.resumeAfter) && !isNull(spec.startAfter)) {
    throw err(50865, "Do not specify both 'resumeAfter' and 'startAfter' in a $changeStream stage");
  }
  if (resumes.length > 1) throw err(40674, 'Only one type of resume option is allowed, but multiple were found.');
  return { fd, fb };
}

function scopeOf(ctx, spec) {
  const { cmd, db } = ctx;
  const cluster = V.truthy(spec.allChangesForCluster);
  if (typeof cmd.aggregate === 'string') {
    if (cluster) throw err(72, "A $changeStream with 'allChangesForCluster:true' may only be opened on the 'admin' database, and with no collection name");
    if (INTERNAL_DBS.has(db) && !(db === 'config' && V.truthy(spec.allowToRunOnConfigDB))) {
      throw err(73, `$changeStream may not be opened on the internal ${db} database`);
    }
    if (cmd.aggregate.startsWith('system.') && !V.truthy(spec.allowToRunOnSystemNS)) {
      throw err(73, `$changeStream may not be opened on the internal ${db}.${cmd.aggregate} collection`);
    }
    return { kind: 'collection', db, coll: cmd.aggregate };
  }
  if (cluster) {
    if (db !== 'admin') throw err(72, "A $changeStream with 'allChangesForCluster:true' may only be opened on the 'admin' database, and with no collection name");
    return { kind: 'cluster' };
  }
  if (INTERNAL_DBS.has(db)) throw err(73, `$changeStream may not be opened on the internal ${db} database`);
  return { kind: 'database', db };
}

function checkStages(stages) {
  for (const st of stages) {
    const name = st && typeof st === 'object' ? V.keys(st)[0] : undefined;
    if (ALLOWED_STAGES.has(name)) continue;
    if (KNOWN_STAGES.has(name)) throw err(20, `${name} is not permitted in a $changeStream pipeline`);
    throw err(40324, `Unrecognized pipeline stage name: '${name}'`);
  }
}

// Opens a change stream for an aggregate whose first stage is $changeStream.
async function open(ctx) {
  const { cmd, server } = ctx;
  if (server.opts.standalone) throw err(40573, 'The $changeStream stage is only supported on replica sets');
  if (ctx.access && ctx.access.txn) throw err(263, 'Operation not permitted in transaction :: caused by :: $changeStream is not allowed in a transaction');
  if (!cmd.cursor || typeof cmd.cursor !== 'object') {
    throw err(9, "The 'cursor' option is required, except for aggregate with the explain argument");
  }
  const spec = cmd.pipeline[0].$changeStream;
  const { fd, fb } = checkSpec(spec, rawAt(cmd, ['pipeline', 0, '$changeStream']));
  const scope = scopeOf(ctx, spec);
  const stages = cmd.pipeline.slice(1);
  checkStages(stages);
  const pos = startPosition(server, spec);
  const stream = {
    scope, stages, fullDocument: fd, beforeChange: fb, expanded: V.truthy(spec.showExpandedEvents),
    pos, done: false, vars: ctx.vars,
  };
  const ns = scope.kind === 'collection' ? `${scope.db}.${scope.coll}` : `${scope.kind === 'cluster' ? 'admin' : scope.db}.$cmd.aggregate`;
  const batchSize = cmd.cursor.batchSize === undefined ? 101 : V.toNumber(cmd.cursor.batchSize);
  const b = executing('PlanExecutor error during aggregation', () => collect(server, stream, batchSize));
  const id = ctx.cursors.newId();
  if (!stream.done) {
    ctx.cursors.cursors.set(id.toString(), { id, ns, docs: [], pos: 0, stream, session: ctx.sessionKey, lastUse: Date.now() });
  }
  return {
    cursor: { firstBatch: b.docs, postBatchResumeToken: b.token, id: Long.fromBigInt(stream.done ? 0n : id), ns },
    ok: 1,
  };
}

// getMore of a change stream cursor: waits (awaitData) up to maxTimeMS for events.
async function getMore(ctx, c, batchSize) {
  const { server, cmd } = ctx;
  const wait = cmd.maxTimeMS !== undefined ? V.toNumber(cmd.maxTimeMS) : 1000;
  const deadline = Date.now() + wait;
  const limit = batchSize > 0 ? batchSize : Infinity;
  // A failed getMore leaves no cursor behind, as on mongod.
  const next = () => executing('Executor error during getMore', () => collect(server, c.stream, limit),
    () => ctx.cursors.cursors.delete(c.id.toString()));
  let b = next();
  while (!b.docs.length && !c.stream.done && !ctx.conn.closed) {
    const left = deadline - Date.now();
    if (left <= 0) break;
    await server.store.changes.wait(left);
    // killCursors while the getMore waited: mongod interrupts the getMore.
    if (!ctx.cursors.cursors.has(c.id.toString())) throw err(237, `cursor id ${c.id} was killed`);
    b = next();
  }
  c.lastUse = Date.now();
  if (c.stream.done) ctx.cursors.cursors.delete(c.id.toString());
  return {
    cursor: { nextBatch: b.docs, postBatchResumeToken: b.token, id: Long.fromBigInt(c.stream.done ? 0n : c.id), ns: c.ns },
    ok: 1,
  };
}

// Errors of reading the stream carry mongod's prefix (the stream's plan executor failed).
function executing(what, fn, onError) {
  try {
    return fn();
  } catch (e) {
    if (onError) onError();
    if (e && e.errmsg !== undefined) {
      e.errmsg = `${what} :: caused by :: ${e.errmsg}`;
      e.message = e.errmsg;
    }
    throw e;
  }
}

function watches(scope, e) {
  if (e.internal) return false; // a sharded cluster's own set-up on a shard
  if (e.op === 'dropDatabase') return scope.kind === 'cluster' ? !INTERNAL_DBS.has(e.db) : scope.kind === 'database' && scope.db === e.db;
  if (typeof e.coll === 'string' && e.coll.startsWith('system.')) return false;
  switch (scope.kind) {
    case 'collection':
      return (e.db === scope.db && e.coll === scope.coll) ||
        (e.op === 'rename' && e.to.db === scope.db && e.to.coll === scope.coll);
    case 'database': return e.db === scope.db;
    default: return !INTERNAL_DBS.has(e.db);
  }
}

function invalidates(scope, e) {
  if (scope.kind === 'collection') return e.op === 'drop' || e.op === 'rename';
  if (scope.kind === 'database') return e.op === 'dropDatabase';
  return false;
}

function lookup(server, e) {
  const coll = server.store.getColl(e.db, e.coll);
  if (!coll || !coll.uuid.equals(e.uuid)) return null;
  const v = coll.getLatest(e.idKey);
  return v ? v.doc : null;
}

// The change event of a log entry as this stream shows it, or null when it shows none.
function eventOf(server, stream, e) {
  if (EXPANDED_ONLY.has(e.op) && !stream.expanded) return null;
  const f = [['_id', entryToken(server, e)], ['operationType', e.op], ['clusterTime', eventTime(server, e)], ['wallTime', e.wall]];
  if (stream.expanded && e.uuid && e.op !== 'dropDatabase') f.push(['collectionUUID', e.uuid]);
  const ns = e.op === 'dropDatabase' ? { db: e.db } : { db: e.db, coll: e.coll };
  const images = ['update', 'replace', 'delete'].includes(e.op);
  if (e.op === 'insert' || e.op === 'replace') f.push(['fullDocument', e.post]);
  if (e.op === 'update' && stream.fullDocument !== 'default') {
    let doc;
    if (stream.fullDocument === 'updateLookup') doc = lookup(server, e);
    else doc = e.post || null;
    if (!doc && stream.fullDocument === 'required') {
      throw err(47, `Change stream was configured to require a post-image for all update, delete and replace events, but the post-image was not found for event: ${e.db}.${e.coll}`);
    }
    f.push(['fullDocument', doc]);
  }
  f.push(['ns', ns]);
  if (['insert', 'update', 'replace', 'delete'].includes(e.op)) f.push(['documentKey', e.key]);
  if (e.op === 'update') f.push(['updateDescription', updateDescription(e.diff, stream.expanded)]);
  if (e.op === 'rename') {
    f.push(['to', e.to]);
    if (stream.expanded) {
      const d = [['to', e.to]];
      if (e.dropTarget) d.push(['dropTarget', e.dropTarget]);
      f.push(['operationDescription', V.fromEntries(d)]);
    }
  }
  if (e.op === 'create') {
    const o = e.options || {};
    f.push(['operationDescription', o.viewOn !== undefined ? { viewOn: o.viewOn, pipeline: o.pipeline || [] }
      : Object.assign({}, o, { idIndex: { v: new Int32(2), key: { _id: new Int32(1) }, name: '_id_' } })]);
  }
  if (e.op === 'createIndexes' || e.op === 'dropIndexes' || e.op === 'shardCollection') f.push(['operationDescription', e.desc]);
  if (e.op === 'modify') {
    f.push(['operationDescription', e.desc]);
    f.push(['stateBeforeChange', e.before]);
  }
  if (images && stream.beforeChange !== 'off') {
    const pre = e.pre || null;
    if (!pre && stream.beforeChange === 'required') {
      throw err(47, `Change stream was configured to require a pre-image for all update, delete and replace events, but the pre-image was not found for event: ${e.db}.${e.coll}`);
    }
    f.push(['fullDocumentBeforeChange', pre]);
  }
  if (e.lsid) {
    f.push(['lsid', { id: e.lsid.id, uid: NO_USER_UID }]);
    f.push(['txnNumber', e.txnNumber]);
  }
  return V.fromEntries(f);
}

function invalidateOf(server, e) {
  return V.fromEntries([['_id', entryToken(server, e, FLAG_INVALIDATE)], ['operationType', 'invalidate'],
    ['clusterTime', eventTime(server, e)], ['wallTime', e.wall]]);
}

// Events after the stream's position, at most limit, through the stream's later stages;
// advances the position. Returns {docs, token}.
function collect(server, stream, limit) {
  const log = server.store.changes;
  if (stream.pos < log.firstSeq - 1) throw historyLost();
  const docs = [];
  let bytes = 0;
  let lastToken = null;
  // Only majority-committed changes (all of them, unless the secondary lags: majority.js).
  const last = log.visibleSeq;
  while (docs.length < limit && !stream.done && stream.pos < last) {
    // A chunk of raw events (each with the sequence number it came from), then the pipeline.
    const raw = [];
    const seqOf = new Map();
    let endPos = stream.pos;
    let invalidated = false;
    while (raw.length < Math.max(16, limit - docs.length) && endPos < last) {
      const e = log.at(endPos + 1);
      endPos++;
      if (!watches(stream.scope, e)) continue;
      const ev = eventOf(server, stream, e);
      if (ev) {
        raw.push(ev);
        seqOf.set(ev._id._data, endPos);
      }
      if (invalidates(stream.scope, e)) {
        const inv = invalidateOf(server, e);
        raw.push(inv);
        seqOf.set(inv._id._data, endPos);
        invalidated = true;
        break;
      }
    }
    const out = stream.stages.length ? aggregate(raw, stream.stages, { variables: stream.vars }) : raw;
    let cut = false;
    for (const d of out) {
      const id = d && d._id;
      const seq = id && typeof id === 'object' && V.keys(id).length === 1 ? seqOf.get(id._data) : undefined;
      if (seq === undefined) {
        throw err(280, 'Encountered an event whose _id field, which contains the resume token, was modified by the pipeline. ' +
          'Modifying the _id field of an event makes it impossible to resume the stream from that point. Only ' +
          'transformations that retain the unmodified _id field are allowed.');
      }
      const size = calculateObjectSize(V.forWire(d));
      if (docs.length >= limit || (docs.length && bytes + size > BATCH_BYTES)) {
        cut = true;
        break;
      }
      docs.push(d);
      bytes += size;
      lastToken = id;
      stream.pos = seq;
      if (id._data.slice(24, 26) === hex(FLAG_INVALIDATE, 2)) stream.done = true;
    }
    if (cut) break;
    stream.pos = endPos;
    if (invalidated) {
      // Even when the pipeline filtered the invalidate out, the stream ends there.
      stream.done = true;
    }
  }
  // Cut short: resume after the last event returned; otherwise a high-water mark at the
  // present, after everything this stream has read.
  const token = docs.length && (docs.length >= limit || stream.done) && lastToken
    ? lastToken
    : encodeToken(server.bootSecs, server.store.majorityTs() + 1, 0xffffffff, FLAG_HWM, stream.pos);
  return { docs, token };
}

// ---- merged streams (a mongos's): one position per shard's log, events in cluster-time order ----
//
// Shards share one clock and every commit takes its own tick, so (cluster time, index in the
// transaction) names one event in the whole cluster. A merged stream's tokens carry just that
// (no log position), which is why they resume on any mongos: each shard's position is found
// again from the token. An invalidating event from any shard ends a collection or database
// stream (a drop through mongos drops on every shard; the first shard's drop ends it).

const MAX_OP = 0xffffffff;

function mergedToken(server, e, flag) { return encodeToken(server.bootSecs, e.ts + 1, e.opIndex || 0, flag || FLAG_EVENT, 0); }

// The last sequence number of `log` whose entry is at or before (inc, opIndex).
function positionAt(log, inc, opIndex) {
  let lo = log.firstSeq - 1;
  let hi = log.lastSeq;
  while (lo < hi) {
    const m = Math.floor((lo + hi + 1) / 2);
    const e = log.at(m);
    if (e.ts + 1 < inc || (e.ts + 1 === inc && (e.opIndex || 0) <= opIndex)) lo = m;
    else hi = m - 1;
  }
  return lo;
}

function mergedStart(sources, spec) {
  const boot = sources[0].server.bootSecs;
  const resume = !isNull(spec.resumeAfter) ? 'resumeAfter' : !isNull(spec.startAfter) ? 'startAfter' : null;
  let inc;
  let op;
  if (resume) {
    const t = decodeToken(spec[resume], resume);
    if (t.flag === FLAG_INVALIDATE && resume === 'resumeAfter') {
      throw err(260, "Attempting to resume a change stream using 'resumeAfter' is not allowed from an invalidate notification.");
    }
    if (t.secs !== boot) throw err(280, `cannot resume stream; the resume token was not found. ${JSON.stringify(spec[resume])}`);
    inc = t.inc;
    op = t.opIndex;
    for (const src of sources) {
      const log = src.server.store.changes;
      if (log.lastEvictedTs !== null && log.lastEvictedTs + 1 > inc) throw historyLost();
    }
  } else if (!isNull(spec.startAtOperationTime)) {
    const ts = spec.startAtOperationTime;
    if (ts.t < boot) throw historyLost();
    inc = ts.t > boot ? 0xffffffff : ts.i - 1;
    op = MAX_OP;
  } else {
    inc = sources[0].server.store.clock + 1;
    op = MAX_OP;
  }
  for (const src of sources) src.pos = positionAt(src.server.store.changes, inc, op);
}

// Opens a merged change stream over `servers` (one member of each shard; members share data).
function openMerged(ctx, servers) {
  const { cmd } = ctx;
  if (ctx.inTxn) throw err(263, 'Operation not permitted in transaction :: caused by :: $changeStream is not allowed in a transaction');
  if (!cmd.cursor || typeof cmd.cursor !== 'object') {
    throw err(9, "The 'cursor' option is required, except for aggregate with the explain argument");
  }
  const spec = cmd.pipeline[0].$changeStream;
  const { fd, fb } = checkSpec(spec, rawAt(cmd, ['pipeline', 0, '$changeStream']));
  const scope = scopeOf(ctx, spec);
  const stages = cmd.pipeline.slice(1);
  checkStages(stages);
  const sources = servers.map((server) => ({ server, pos: 0 }));
  mergedStart(sources, spec);
  const stream = {
    scope, stages, fullDocument: fd, beforeChange: fb, expanded: V.truthy(spec.showExpandedEvents),
    done: false, vars: ctx.vars, sources, merged: true,
  };
  const ns = scope.kind === 'collection' ? `${scope.db}.${scope.coll}` : `${scope.kind === 'cluster' ? 'admin' : scope.db}.$cmd.aggregate`;
  const batchSize = cmd.cursor.batchSize === undefined ? 101 : V.toNumber(cmd.cursor.batchSize);
  const b = executing('PlanExecutor error during aggregation', () => collectMerged(stream, batchSize));
  const id = ctx.cursors.newId();
  if (!stream.done) {
    ctx.cursors.cursors.set(id.toString(), { id, ns, docs: [], pos: 0, stream, session: ctx.sessionKey, lastUse: Date.now() });
  }
  return {
    cursor: { firstBatch: b.docs, postBatchResumeToken: b.token, id: Long.fromBigInt(stream.done ? 0n : id), ns },
    ok: 1,
  };
}

async function getMoreMerged(ctx, c, batchSize) {
  const { cmd } = ctx;
  const wait = cmd.maxTimeMS !== undefined ? V.toNumber(cmd.maxTimeMS) : 1000;
  const deadline = Date.now() + wait;
  const limit = batchSize > 0 ? batchSize : Infinity;
  const next = () => executing('Executor error during getMore', () => collectMerged(c.stream, limit),
    () => ctx.cursors.cursors.delete(c.id.toString()));
  let b = next();
  while (!b.docs.length && !c.stream.done && !ctx.conn.closed) {
    const left = deadline - Date.now();
    if (left <= 0) break;
    await Promise.race(c.stream.sources.map((src) => src.server.store.changes.wait(left)));
    if (!ctx.cursors.cursors.has(c.id.toString())) throw err(237, `cursor id ${c.id} was killed`);
    b = next();
  }
  c.lastUse = Date.now();
  if (c.stream.done) ctx.cursors.cursors.delete(c.id.toString());
  return {
    cursor: { nextBatch: b.docs, postBatchResumeToken: b.token, id: Long.fromBigInt(c.stream.done ? 0n : c.id), ns: c.ns },
    ok: 1,
  };
}

// Every shard's new entries the stream watches, merged by (cluster time, index in the
// transaction), through the later stages; each shard's position then moves to the last event
// returned (or to the end of what was read).
function collectMerged(stream, limit) {
  const raw = [];
  const known = new Set();
  const server0 = stream.sources[0].server;
  for (const src of stream.sources) {
    const log = src.server.store.changes;
    if (src.pos < log.firstSeq - 1) throw historyLost();
    for (let s = src.pos + 1; s <= log.lastSeq; s++) {
      const e = log.at(s);
      if (!watches(stream.scope, e)) continue;
      raw.push({ src, e });
    }
  }
  raw.sort((a, b) => (a.e.ts - b.e.ts) || ((a.e.opIndex || 0) - (b.e.opIndex || 0)));
  const events = [];
  for (const { src, e } of raw) {
    const ev = eventOf(src.server, stream, e);
    if (ev) {
      ev._id = mergedToken(src.server, e);
      events.push(ev);
      known.add(ev._id._data);
    }
    if (invalidates(stream.scope, e)) {
      const inv = V.fromEntries([['_id', mergedToken(src.server, e, FLAG_INVALIDATE)], ['operationType', 'invalidate'],
        ['clusterTime', eventTime(src.server, e)], ['wallTime', e.wall]]);
      events.push(inv);
      known.add(inv._id._data);
      break;
    }
  }
  const out = stream.stages.length ? aggregate(events, stream.stages, { variables: stream.vars }) : events;
  const docs = [];
  let bytes = 0;
  let lastToken = null;
  for (const d of out) {
    const id = d && d._id;
    if (!(id && typeof id === 'object' && V.keys(id).length === 1 && known.has(id._data))) {
      throw err(280, 'Encountered an event whose _id field, which contains the resume token, was modified by the pipeline. ' +
        'Modifying the _id field of an event makes it impossible to resume the stream from that point. Only ' +
        'transformations that retain the unmodified _id field are allowed.');
    }
    const size = calculateObjectSize(V.forWire(d));
    if (docs.length >= limit || (docs.length && bytes + size > BATCH_BYTES)) break;
    docs.push(d);
    bytes += size;
    lastToken = id;
    if (id._data.slice(24, 26) === hex(FLAG_INVALIDATE, 2)) {
      stream.done = true;
      break;
    }
  }
  const invalidatedRead = events.length && events[events.length - 1].operationType === 'invalidate';
  if (lastToken && (docs.length < out.length || stream.done)) {
    const t = decodeToken(lastToken, 'resume');
    for (const src of stream.sources) src.pos = positionAt(src.server.store.changes, t.inc, t.opIndex);
  } else {
    if (invalidatedRead) stream.done = true;
    const clock = server0.store.clock;
    for (const src of stream.sources) src.pos = positionAt(src.server.store.changes, clock + 1, MAX_OP);
  }
  const token = docs.length && (docs.length >= limit || stream.done) && lastToken
    ? lastToken
    : encodeToken(server0.bootSecs, server0.store.clock + 1, MAX_OP, FLAG_HWM, 0);
  return { docs, token };
}

module.exports = { open, getMore, isChangeStreamPipeline, openMerged, getMoreMerged };
