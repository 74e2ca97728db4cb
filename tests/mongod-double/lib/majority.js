'use strict';
// The majority commit point of the two-member set: the newest commit timestamp both members
// hold. The secondary applies the primary's writes after `--majority-lag-ms` (default 0: at
// once), or not at all while its `stopReplProducer` fail point is on, as mongod's replication
// producer stops with it. So in a two-member set the commit point is where the secondary is.
// What depends on it (lib/server.js, lib/changestreams.js, lib/storage.js):
//   - readConcern majority reads (and every read on the secondary) see the data as of it;
//   - a write acknowledged with w: "majority" (or the implicit default, which is majority on
//     7.0) waits until it covers the write, with wtimeout: 64 WriteConcernFailed, with a
//     step-down meanwhile: 189 PrimarySteppedDown, both as writeConcernError;
//   - change streams return only changes at or below it;
//   - a step-down of a primary whose writes the secondary lacks rolls those writes back
//     (Store.rollbackTo): the new primary never had them, as a replica set rolls back w: 1
//     writes at a failover.
// Without lag and without the fail point, `point` is null and the commit point is the clock
// itself: nothing waits, nothing is read in the past, and nothing changes for a client.

class CommitPoint {
  constructor(store, lagMs) {
    this.store = store;
    this.lagMs = lagMs > 0 ? lagMs : 0;
    this.point = null; // null: follows the clock; else the timestamp the secondary holds
    this.stopped = () => false; // set by the server: the secondary's stopReplProducer is on
    this.pending = []; // [ts, due ms] of writes the secondary has not applied yet, in order
    this.timer = null;
    this.waiters = new Set(); // {ts, resolve}
  }

  get ts() { return this.point === null ? this.store.clock : this.point; }

  lagging() { return this.point !== null && this.point < this.store.clock; }

  // A write (or commit) took timestamp ts on the primary.
  written(ts) {
    if (this.lagMs === 0 && !this.stopped() && this.point === null) return;
    if (this.point === null) this.point = ts - 1;
    this.pending.push([ts, Date.now() + this.lagMs]);
    this.arm();
  }

  arm() {
    if (this.timer || !this.pending.length || this.stopped()) return;
    const wait = Math.max(0, this.pending[0][1] - Date.now());
    this.timer = setTimeout(() => {
      this.timer = null;
      this.apply();
    }, wait);
    this.timer.unref();
  }

  // The secondary applies what is due.
  apply() {
    if (this.stopped()) return;
    const now = Date.now();
    let to = null;
    while (this.pending.length && this.pending[0][1] <= now) to = this.pending.shift()[0];
    if (to !== null) this.advance(to);
    this.arm();
  }

  advance(ts) {
    if (this.point === null || ts <= this.point) return;
    this.point = Math.min(ts, this.store.clock);
    if (this.point >= this.store.clock && this.lagMs === 0 && !this.stopped()) this.point = null;
    this.notify();
  }

  // The fail point changed: the secondary stops, or applies what it missed (after the lag).
  replicationChanged() {
    if (this.stopped()) {
      if (this.point === null) this.point = this.store.clock;
      if (this.timer) clearTimeout(this.timer);
      this.timer = null;
      return;
    }
    if (this.point === null) return;
    if (!this.pending.length && this.point < this.store.clock) this.pending.push([this.store.clock, Date.now() + this.lagMs]);
    const due = Date.now() + this.lagMs;
    for (const p of this.pending) if (p[1] > due) p[1] = due;
    if (!this.pending.length) this.advance(this.store.clock);
    this.arm();
  }

  notify() {
    const ts = this.ts;
    for (const w of [...this.waiters]) {
      if (w.ts <= ts) {
        this.waiters.delete(w);
        w.resolve('ok');
      }
    }
    this.store.changes.wakeAll();
    this.store.sweep();
  }

  // Resolves 'ok' once the commit point reaches ts, 'timeout' after ms (null: never), or with
  // the value `interrupt` resolves to.
  waitFor(ts, ms, interrupt) {
    if (this.ts >= ts) return Promise.resolve('ok');
    return new Promise((resolve) => {
      let timer = null;
      const w = {
        ts,
        resolve: (v) => {
          clearTimeout(timer);
          this.waiters.delete(w);
          resolve(v);
        },
      };
      this.waiters.add(w);
      if (ms !== null) timer = setTimeout(() => w.resolve('timeout'), Math.max(0, ms));
      if (interrupt) interrupt.then((v) => w.resolve(v || 'interrupted'));
    });
  }

  // The primary stepped down: the new primary has what the secondary held; everything above
  // the commit point is rolled back, and replication starts again from there.
  failover() {
    // mongod fails every waiter for write concern as the primary steps down (189).
    for (const w of [...this.waiters]) w.resolve('interrupted');
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    this.pending = [];
    let rolled = 0;
    if (this.lagging()) rolled = this.store.rollbackTo(this.point);
    this.point = null;
    if (this.lagMs > 0 || this.stopped()) this.point = this.store.clock;
    this.notify();
    return rolled;
  }
}

module.exports = { CommitPoint };
