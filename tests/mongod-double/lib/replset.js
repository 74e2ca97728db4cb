'use strict';
// Elections of the set: which member is primary, the term (electionId), each member's
// topologyVersion and the awaitable hellos waiting for it to change, step-down (interrupting
// the old primary's writes in progress and aborting open transactions), freeze periods,
// step-up, the automatic election once a member is electable again, and the double-only
// election time. The commands themselves (replSetStepDown, replSetFreeze, replSetStepUp,
// doubleElectionTime) are in commands/admin.js.

const { ObjectId } = require('bson');
const { err } = require('./errors');

// mongod's electionId is OID::fromTerm(term): 7fffffff then the term, big-endian.
function electionIdOf(term) {
  return new ObjectId(`7fffffff${term.toString(16).padStart(16, '0')}`);
}

class ReplSet {
  constructor(log) {
    this.log = log;
    this.members = []; // in configuration order
    this.primary = null; // the member that is primary now, or null (election, step-down period)
    this.term = 1;
    this.electionMs = 0; // how long an election takes (doubleElectionTime)
    this.election = null; // {candidate, timer, result: Promise<boolean>, finish}
    this.autoTimer = null; // the next automatic election, when no member is electable now
  }

  add(member) {
    this.members.push(member);
    if (!this.primary) {
      this.primary = member;
      member.role = 'primary';
    } else member.role = 'secondary';
  }

  electionId() { return electionIdOf(this.term); }

  // Not primary, not running for election, and past its step-down or freeze period.
  electable(m, now = Date.now()) {
    return m.role === 'secondary' && now >= m.stepDownUntil && !(this.election && this.election.candidate === m);
  }

  // Every member's hello changes: each counter goes up and the awaitable hellos answer.
  changed() {
    for (const m of this.members) m.topologyChanged();
  }

  // The primary becomes a secondary, unelectable until `until` (ms). Writes and transaction
  // statements in progress on it fail with 11602, open transactions are aborted (mongod's
  // step-down kills them), and no member is primary until an election.
  stepDown(m, until, why) {
    if (this.primary !== m) return;
    this.primary = null;
    m.role = 'secondary';
    m.stepDownUntil = Math.max(m.stepDownUntil, until);
    m.log(`stepping down (${why}); not electable for ${Math.max(0, Math.round((m.stepDownUntil - Date.now()) / 1000))} s`);
    m.interruptInProgress();
    for (const t of [...m.store.activeTxns]) if (t.state === 'inProgress') t.abort('stepdown');
    // The writes the secondary lacks (majority.js) are rolled back: the next primary never
    // had them. Waiters for write concern get 189 first.
    const cp = m.store.commit;
    if (cp) {
      const at = cp.ts;
      const rolled = cp.failover();
      if (rolled) {
        m.sessions.rolledBack(at);
        m.log(`rolled back ${rolled} write(s) above the majority commit point ${at}`);
      }
    }
    this.changed();
  }

  // Runs an election for `candidate`: it takes electionMs, during which there is no primary;
  // it is won when the candidate is still electable at its end and nobody else won meanwhile.
  // Resolves true when the candidate became primary.
  runElection(candidate) {
    if (this.election) return this.election.result;
    this.cancelAuto();
    const now = Date.now();
    if (!this.electable(candidate, now) || this.primary) return Promise.resolve(false);
    let finish;
    const result = new Promise((r) => { finish = r; });
    const e = { candidate, result, finish, timer: null };
    const decide = () => {
      this.election = null;
      const won = !this.primary && candidate.role === 'secondary' && Date.now() >= candidate.stepDownUntil;
      if (won) {
        this.term += 1;
        this.primary = candidate;
        candidate.role = 'primary';
        candidate.log(`won the election for term ${this.term}; now primary`);
        this.changed();
      } else {
        candidate.log('lost the election');
        this.scheduleAuto();
      }
      finish(won);
    };
    if (this.electionMs <= 0) {
      decide();
      return result;
    }
    this.election = e;
    candidate.log(`running for election (takes ${this.electionMs} ms)`);
    e.timer = setTimeout(decide, this.electionMs);
    e.timer.unref();
    return result;
  }

  cancelAuto() {
    if (this.autoTimer) clearTimeout(this.autoTimer);
    this.autoTimer = null;
  }

  // With no primary and no election running, the member that is electable first (config
  // order on a tie) runs for election as soon as it is.
  scheduleAuto() {
    this.cancelAuto();
    if (this.primary || this.election) return;
    let best = null;
    for (const m of this.members) {
      if (m.role !== 'secondary') continue;
      if (!best || m.stepDownUntil < best.stepDownUntil) best = m;
    }
    if (!best) return;
    const wait = best.stepDownUntil - Date.now();
    if (wait <= 0) {
      this.runElection(best);
      return;
    }
    this.autoTimer = setTimeout(() => {
      this.autoTimer = null;
      this.scheduleAuto();
    }, wait);
    this.autoTimer.unref();
  }

  // replSetStepUp on `m`: a primary answers at once; otherwise the current primary (if any)
  // steps down as it learns the higher term, and `m` runs for election.
  async stepUp(m) {
    if (this.primary === m) return;
    if (this.election && this.election.candidate !== m) throw err(125, 'Election failed.');
    if (!this.election && !this.electable(m)) throw err(125, 'Election failed.');
    if (this.primary) this.stepDown(this.primary, Date.now(), `member ${m.address} stepped up`);
    if (!(await this.runElection(m))) throw err(125, 'Election failed.');
  }

  stop() {
    this.cancelAuto();
    if (this.election) {
      clearTimeout(this.election.timer);
      this.election.finish(false);
      this.election = null;
    }
  }
}

module.exports = { ReplSet, electionIdOf };
