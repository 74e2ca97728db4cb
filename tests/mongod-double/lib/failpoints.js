'use strict';
// Fail points: `failCommand` (errorCode, errorLabels, closeConnection, writeConcernError,
// blockConnection/blockTimeMS, appName, failCommands; modes alwaysOn, off, {times}, {skip})
// `failGetMoreAfterCursorCheckout` (errorCode, for a getMore whose cursor exists), and
// `onPrimaryTransactionalWrite` (per write statement of a retryable write: closes the
// connection after the write, or fails it with failBeforeCommitExceptionCode before it is
// applied), and `stopReplProducer` (set on the secondary: it stops applying the primary's
// writes, so the majority commit point stops; majority.js). This file only keeps state and decides whether a point fires; the server applies
// the effect. Other fail point names are accepted and ignored, with a log line.

const V = require('./values');
const { err } = require('./errors');

class FailPoint {
  constructor(mode, data) {
    this.data = data || {};
    this.mode = 'off';
    this.times = 0;
    this.skip = 0;
    if (mode === 'alwaysOn') this.mode = 'alwaysOn';
    else if (mode === 'off') this.mode = 'off';
    else if (mode && typeof mode === 'object' && mode.times !== undefined) {
      this.mode = 'times';
      this.times = V.toNumber(mode.times);
      if (this.times <= 0) this.mode = 'off';
    } else if (mode && typeof mode === 'object' && mode.skip !== undefined) {
      this.mode = 'skip';
      this.skip = V.toNumber(mode.skip);
    } else if (mode && typeof mode === 'object' && mode.activationProbability !== undefined) {
      this.mode = 'random';
      this.p = V.toNumber(mode.activationProbability);
    } else throw err(9, 'invalid mode object');
  }

  // Consumes one evaluation; true when the point fires.
  fire() {
    switch (this.mode) {
      case 'alwaysOn': return true;
      case 'times':
        if (this.times <= 0) return false;
        this.times--;
        if (this.times === 0) this.mode = 'off';
        return true;
      case 'skip':
        if (this.skip > 0) {
          this.skip--;
          return false;
        }
        return true;
      case 'random': return Math.random() < this.p;
      default: return false;
    }
  }
}

class FailPoints {
  constructor(log) {
    this.points = new Map();
    this.log = log;
    this.hits = new Map();
  }

  configure(cmd) {
    const name = cmd.configureFailPoint;
    if (typeof name !== 'string') throw err(9, 'configureFailPoint requires a fail point name');
    if (name !== 'failCommand' && name !== 'onPrimaryTransactionalWrite' && name !== 'failGetMoreAfterCursorCheckout' &&
        name !== 'stopReplProducer') {
      this.log(`configureFailPoint: fail point '${name}' is not implemented; ignored`);
    }
    const fp = new FailPoint(cmd.mode, cmd.data);
    const count = this.hits.get(name) || 0;
    if (fp.mode === 'off') this.points.delete(name);
    else this.points.set(name, fp);
    this.hits.set(name, 0);
    return { count, ok: 1 };
  }

  // The failCommand data to apply to this command, or null.
  failCommand(name, appName) {
    const fp = this.points.get('failCommand');
    if (!fp) return null;
    const d = fp.data;
    const list = Array.isArray(d.failCommands) ? d.failCommands : [];
    if (!list.includes(name)) return null;
    if (typeof d.appName === 'string' && d.appName !== appName) return null;
    if (!fp.fire()) return null;
    this.hits.set('failCommand', (this.hits.get('failCommand') || 0) + 1);
    if (fp.mode === 'off') this.points.delete('failCommand');
    return d;
  }

  // Data of onPrimaryTransactionalWrite when it fires for one write statement, or null.
  transactionalWrite() {
    const fp = this.points.get('onPrimaryTransactionalWrite');
    if (!fp) return null;
    if (!fp.fire()) return null;
    this.hits.set('onPrimaryTransactionalWrite', (this.hits.get('onPrimaryTransactionalWrite') || 0) + 1);
    if (fp.mode === 'off') this.points.delete('onPrimaryTransactionalWrite');
    return fp.data;
  }

  // Data of failGetMoreAfterCursorCheckout when it fires for a getMore whose cursor was found.
  afterCursorCheckout() {
    const name = 'failGetMoreAfterCursorCheckout';
    const fp = this.points.get(name);
    if (!fp || !fp.fire()) return null;
    this.hits.set(name, (this.hits.get(name) || 0) + 1);
    if (fp.mode === 'off') this.points.delete(name);
    return fp.data;
  }

  clear() { this.points.clear(); }
}

module.exports = { FailPoints };
