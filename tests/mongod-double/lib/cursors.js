'use strict';
// Server-side cursors. A cursor holds the complete, already computed result of its find or
// aggregate (so later batches are consistent with the first), and hands it out in batches
// capped by batchSize and by the 16 MiB reply limit. A tailable cursor (find on a capped
// collection) stays open when its documents run out; its owner (crud.getMore) appends the
// documents inserted since through `tail` before each getMore. It does not run queries.

const { Long, calculateObjectSize } = require('bson');
const { err } = require('./errors');

const BATCH_BYTES = 16 * 1024 * 1024 - 64 * 1024;

class Cursors {
  constructor() {
    this.cursors = new Map(); // id string -> cursor
    this.next = BigInt(Date.now()) * 1000n;
  }

  newId() {
    this.next += BigInt(1 + Math.floor(Math.random() * 1000));
    return this.next;
  }

  take(docs, pos, batchSize) {
    const end = batchSize > 0 ? Math.min(docs.length, pos + batchSize) : docs.length;
    let bytes = 0;
    let i = pos;
    for (; i < end; i++) {
      bytes += calculateObjectSize(docs[i]);
      if (bytes > BATCH_BYTES && i > pos) break;
    }
    return i;
  }

  // First batch reply for a freshly computed result.
  open(ns, docs, opts) {
    const batchSize = opts.batchSize === undefined ? 101 : opts.batchSize;
    const end = this.take(docs, 0, batchSize);
    const firstBatch = docs.slice(0, end);
    let id = 0n;
    // A tailable cursor whose query matched nothing is dead at once, as on mongod.
    const tail = opts.tail && docs.length ? opts.tail : null;
    if ((end < docs.length || tail) && !opts.singleBatch) {
      id = this.newId();
      this.cursors.set(id.toString(), { id, ns, docs, pos: end, session: opts.session || null, lastUse: Date.now(), tail });
    }
    return { cursor: { firstBatch, id: Long.fromBigInt(id), ns }, ok: 1 };
  }

  getMore(id, collName, db, batchSize) {
    const c = this.cursors.get(id.toString());
    if (!c) throw err(43, `cursor id ${id} not found`);
    const ns = `${db}.${collName}`;
    if (c.ns !== ns && !c.ns.startsWith(`${db}.$cmd`)) {
      throw err(13, `Requested getMore on namespace '${ns}', but cursor belongs to a different namespace ${c.ns}`);
    }
    c.lastUse = Date.now();
    const end = this.take(c.docs, c.pos, batchSize || 0);
    const nextBatch = c.docs.slice(c.pos, end);
    c.pos = end;
    let outId = c.id;
    if (c.pos >= c.docs.length && !c.tail) {
      this.cursors.delete(id.toString());
      outId = 0n;
    }
    return { cursor: { nextBatch, id: Long.fromBigInt(outId), ns: c.ns }, ok: 1 };
  }

  kill(ids) {
    const killed = [];
    const notFound = [];
    for (const id of ids) {
      const k = id.toString();
      if (this.cursors.delete(k)) killed.push(id);
      else notFound.push(id);
    }
    return { cursorsKilled: killed, cursorsNotFound: notFound, cursorsAlive: [], cursorsUnknown: [], ok: 1 };
  }

  // Idle cursors time out after 10 minutes, as with mongod's cursorTimeoutMillis default.
  reap(now) {
    for (const [k, c] of this.cursors) if (now - c.lastUse > 10 * 60 * 1000) this.cursors.delete(k);
  }

  killForSession(sessionKey) {
    for (const [k, c] of this.cursors) if (c.session === sessionKey) this.cursors.delete(k);
  }
}

module.exports = { Cursors };
