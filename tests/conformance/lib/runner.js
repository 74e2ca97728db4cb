'use strict';
// Unified-format test runner: loads test files, evaluates runOnRequirements,
// sets up initialData, creates entities, executes operations, and checks
// expectResult / expectError / expectEvents / outcome.

const fs = require('fs');
const path = require('path');
const { MongoClient, BSON, ChangeStream, AbstractCursor, Collection } = require('mongodb');
const { EJSON } = BSON;
const { match, exactMatch, MatchError, show } = require('./match');
const { EntityMap } = require('./entities');
const ops = require('./operations');
const reqs = require('./requirements');

const SUPPORTED_SCHEMA = [1, 26];

class TestFailure extends Error {}

// known-driver-differences.json: tests that fail only because of the Node.js driver itself;
// they count as skipped, named with the reason.
const KNOWN_DIFFERENCES_FILE = path.join(__dirname, '..', 'known-driver-differences.json');

function loadKnownDifferences(file) {
  const doc = JSON.parse(fs.readFileSync(file, 'utf8'));
  const list = doc.differences;
  if (!Array.isArray(list)) throw new Error(`${file}: 'differences' must be an array`);
  for (const d of list) {
    if (typeof d.file !== 'string' || typeof d.reason !== 'string' || typeof d.evidence !== 'string' ||
        !(d.tests === '*' || (Array.isArray(d.tests) && d.tests.every((t) => typeof t === 'string')))) {
      throw new Error(`${file}: each difference needs file, tests ("*" or a list), reason and evidence`);
    }
  }
  return list;
}

function knownDifference(list, file, test) {
  return list.find((d) => d.file === file && (d.tests === '*' || d.tests.includes(test))) || null;
}

function schemaSupported(v) {
  const [maj, min] = String(v).split('.').map((x) => parseInt(x, 10) || 0);
  return maj === SUPPORTED_SCHEMA[0] && min <= SUPPORTED_SCHEMA[1];
}

function withTimeout(promise, ms, what) {
  let t;
  return Promise.race([
    promise,
    new Promise((_, rej) => { t = setTimeout(() => rej(new TestFailure(`${what} timed out after ${ms} ms`)), ms); }),
  ]).finally(() => clearTimeout(t));
}

class Runner {
  constructor(opts) {
    this.uri = opts.uri;
    this.verbose = !!opts.verbose;
    this.filter = opts.filter || null;
    this.baseline = opts.baseline !== false;
    this.testTimeoutMS = opts.testTimeoutMS || 60000;
    this.topology = opts.topology || null;
    // Behind load balancers (the load-balancer tests' set-up): `uri` is the one in front of a
    // single service (SINGLE_MONGOS_LB_URI), `multiUri` the one in front of two
    // (MULTI_MONGOS_LB_URI), for the client entities with useMultipleMongoses: true.
    this.multiUri = opts.multiUri || null;
    this.knownDifferences = opts.knownDifferences === false ? []
      : loadKnownDifferences(opts.knownDifferencesFile || KNOWN_DIFFERENCES_FILE);
    this.out = opts.out || ((s) => process.stdout.write(s + '\n'));
    this.results = [];
    this.clients = [];
    this.current = null;
  }

  log(s) {
    if (this.verbose) this.out(`    ${s}`);
  }

  registerClient(client, state) {
    this.clients.push({ client, state });
  }

  async init() {
    this.internal = new MongoClient(this.uri, { serverSelectionTimeoutMS: 15000 });
    await this.internal.connect();
    this.server = await reqs.describeServer(this.internal, this.uri);
    this.server.reportedTopology = this.server.topology;
    // --topology: evaluate runOnRequirements for that topology (the
    // connection, and so what the driver sees, is unchanged).
    if (this.topology) this.server.topology = this.topology;
    // Several mongos in the URI: a client entity talks to the first one unless it asks for
    // useMultipleMongoses (the unified format's rule), and fail points are set and cleared on
    // each mongos through a direct client of its own.
    this.mongosHosts = this.server.reportedTopology === 'sharded' ? uriHosts(this.uri) : [];
    this.perMongos = new Map();
    if (this.mongosHosts.length > 1) {
      for (const h of this.mongosHosts) {
        const c = new MongoClient(singleHostUri(this.uri, h), { serverSelectionTimeoutMS: 15000 });
        await c.connect();
        this.perMongos.set(h, c);
      }
    }
    await this.killAllSessions();
  }

  // The URI a client entity uses: the first mongos alone unless useMultipleMongoses; behind
  // load balancers, the multi-service one for useMultipleMongoses, else the single-service one.
  clientUri(spec) {
    if (this.multiUri) return spec.useMultipleMongoses === true ? this.multiUri : this.uri;
    if (this.mongosHosts.length > 1 && spec.useMultipleMongoses !== true) return singleHostUri(this.uri, this.mongosHosts[0]);
    return this.uri;
  }

  async close() {
    if (this.internal) await this.internal.close(true).catch(() => {});
    for (const c of (this.perMongos || new Map()).values()) await c.close(true).catch(() => {});
  }

  async killAllSessions() {
    try {
      await this.internal.db('admin').command({ killAllSessions: [] });
    } catch (e) {
      // Ignorable per the format: Interrupted(11601), Unauthorized(13), CommandNotFound(59).
      if (![11601, 13, 59].includes(e.code)) throw new Error(`killAllSessions failed: ${e.message}`);
    }
  }

  // ---- file / test iteration ---------------------------------------------

  async runFile(file, displayName) {
    let doc;
    try {
      doc = EJSON.parse(fs.readFileSync(file, 'utf8'), { relaxed: true });
    } catch (e) {
      this.record(displayName, '(file)', 'fail', `cannot parse: ${e.message}`);
      this.out(`FAIL ${displayName}: (file): cannot parse: ${e.message}`);
      return;
    }
    const tests = (doc.tests || []).filter((t) => !this.filter || t.description.includes(this.filter));
    if (tests.length === 0) return;
    const fileResults = [];
    const push = (test, status, reason) => {
      fileResults.push({ test: test.description, status, reason });
      this.record(displayName, test.description, status, reason);
    };

    if (!schemaSupported(doc.schemaVersion)) {
      for (const t of tests) push(t, 'fail', `unsupported schemaVersion ${doc.schemaVersion}`);
    } else {
      const fileReq = await reqs.evaluate(doc.runOnRequirements, this.server, { baseline: this.baseline });
      if (!fileReq.run) {
        for (const t of tests) push(t, fileReq.kind, fileReq.kind === 'skip' ? fileReq.reason : `(file) ${fileReq.reason}`);
      } else {
        for (const t of tests) {
          if (t.skipReason) { push(t, 'skip', `spec skipReason: ${t.skipReason}`); continue; }
          const tr = await reqs.evaluate(t.runOnRequirements, this.server, { baseline: this.baseline });
          if (!tr.run) { push(t, tr.kind, tr.reason); continue; }
          const known = knownDifference(this.knownDifferences, displayName, t.description);
          if (known) { push(t, 'skip', `known Node.js driver difference: ${known.reason}`); continue; }
          const started = Date.now();
          const failure = await this.runTest(doc, t);
          push(t, failure ? 'fail' : 'pass', failure || undefined);
          this.log(`${failure ? 'fail' : 'ok  '} ${t.description} (${Date.now() - started} ms)`);
        }
      }
    }
    this.report(displayName, fileResults);
  }

  record(file, test, status, reason) {
    this.results.push({ file, test, status, ...(reason ? { reason } : {}) });
  }

  report(name, results) {
    const passed = results.filter((r) => r.status === 'pass').length;
    const failed = results.filter((r) => r.status === 'fail');
    const skipped = results.filter((r) => r.status === 'skip');
    if (skipped.length === results.length) {
      const reasons = [...new Set(skipped.map((s) => s.reason))];
      if (reasons.length === 1) {
        this.out(`SKIP ${name} (${results.length} tests): ${reasons[0]}`);
        return;
      }
    }
    if (failed.length === 0 && passed > 0) {
      this.out(`PASS ${name} (${passed} tests${skipped.length ? `; ${skipped.length} more skipped` : ''})`);
    }
    for (const f of failed) this.out(`FAIL ${name}: ${f.test}: ${f.reason}`);
    if (failed.length && passed) this.out(`     ${name}: ${passed} of ${passed + failed.length} passed`);
    for (const s of skipped) this.out(`SKIP ${name}: ${s.test}: ${s.reason}`);
  }

  summary() {
    const n = (s) => this.results.filter((r) => r.status === s).length;
    return { passed: n('pass'), failed: n('fail'), skipped: n('skip') };
  }

  // ---- single test ---------------------------------------------------------

  async runTest(doc, test) {
    const ents = new EntityMap(this);
    this.clients = [];
    this.current = { failPoints: [], startedTransaction: false, ents };
    let failure = null;
    const fail = (e) => {
      if (!failure) failure = describeFailure(e);
    };
    try {
      await withTimeout((async () => {
        await this.killAllSessions();
        await this.dropUndeclared(doc.createEntities || [], doc.initialData || []);
        await this.setupInitialData(doc.initialData || []);
        await ents.create(doc.createEntities || []);
        for (const op of test.operations || []) await this.executeOperation(op, ents, {});
      })(), this.testTimeoutMS, 'test');
    } catch (e) {
      fail(e);
    }
    // Stop collecting events before any cleanup traffic.
    for (const c of this.clients) c.state.listening = false;
    // Fail points are disabled on the server (each mongos of a sharded cluster).
    const fpClients = this.perMongos.size ? [...this.perMongos.values()] : [this.internal];
    for (const fp of this.current.failPoints) {
      for (const c of fpClients) {
        try {
          await withTimeout(c.db('admin').command({ configureFailPoint: fp, mode: 'off' }), 10000, 'disabling fail point');
        } catch (e) {
          fail(new TestFailure(`could not disable fail point ${fp}: ${e.message}`));
        }
      }
    }
    if (!failure && test.expectEvents) {
      try { this.checkEvents(test.expectEvents, ents); } catch (e) { fail(e); }
    }
    if (!failure && test.outcome) {
      try { await withTimeout(this.checkOutcome(test.outcome), 15000, 'reading outcome'); } catch (e) { fail(e); }
    }
    for (const e of ents.map.values()) {
      if (e.kind !== 'changeStream' && e.kind !== 'cursor') continue;
      try { await withTimeout(e.value.close(), 5000, `${e.kind} close`); } catch (_) { /* ignore */ }
    }
    for (const s of ents.sessions()) {
      try { await withTimeout(s.endSession(), 5000, 'endSession'); } catch (_) { /* ignore */ }
    }
    for (const c of this.clients) {
      try { await withTimeout(c.client.close(true), 5000, 'client close'); } catch (_) { /* ignore */ }
    }
    this.clients = [];
    if (this.current.startedTransaction || failure) {
      try { await withTimeout(this.killAllSessions(), 10000, 'killAllSessions'); } catch (e) { fail(e); }
    }
    this.current = null;
    return failure;
  }

  // Collections a file uses without listing them in initialData would keep
  // whatever an earlier test or file left there; drop them so every test
  // starts from a clean state.
  async dropUndeclared(createEntities, initialData) {
    const dbs = new Map();
    for (const def of createEntities) if (def.database) dbs.set(def.database.id, def.database.databaseName);
    const covered = new Set(initialData.map((cd) => `${cd.databaseName}.${cd.collectionName}`));
    for (const def of createEntities) {
      if (!def.collection) continue;
      const dbName = dbs.get(def.collection.database);
      if (!dbName || covered.has(`${dbName}.${def.collection.collectionName}`)) continue;
      try {
        await this.internal.db(dbName).collection(def.collection.collectionName).drop({ writeConcern: { w: 'majority' } });
      } catch (e) {
        if (e.code !== 26 && !/ns not found/i.test(e.message)) throw new TestFailure(`dropping ${dbName}.${def.collection.collectionName}: ${e.message}`);
      }
    }
  }

  async setupInitialData(initialData) {
    const wc = { writeConcern: { w: 'majority' } };
    for (const cd of initialData) {
      const db = this.internal.db(cd.databaseName);
      try {
        await db.collection(cd.collectionName).drop(wc);
      } catch (e) {
        if (e.code !== 26 && !/ns not found/i.test(e.message)) throw new TestFailure(`initialData drop ${cd.collectionName}: ${e.message}`);
      }
      try {
        if (cd.createOptions) await db.createCollection(cd.collectionName, { ...cd.createOptions, ...wc });
        if (cd.documents && cd.documents.length) {
          await db.collection(cd.collectionName).insertMany(cd.documents, wc);
        } else if (!cd.createOptions) {
          await db.createCollection(cd.collectionName, wc);
        }
      } catch (e) {
        throw new TestFailure(`initialData for ${cd.databaseName}.${cd.collectionName}: ${e.message}`);
      }
    }
  }

  async checkOutcome(outcome) {
    for (const cd of outcome) {
      const docs = await this.internal.db(cd.databaseName).collection(cd.collectionName)
        .find({}, { sort: { _id: 1 }, readPreference: 'primary', readConcern: { level: 'local' } }).toArray();
      try {
        exactMatch(cd.documents, docs, `outcome ${cd.databaseName}.${cd.collectionName}`);
      } catch (e) {
        throw new TestFailure(`outcome ${cd.databaseName}.${cd.collectionName}: expected ${show(cd.documents)}, got ${show(docs)}`);
      }
    }
  }

  checkEvents(expectEvents, ents) {
    const ctx = { entities: ents };
    for (const exp of expectEvents) {
      const eventType = exp.eventType || 'command';
      const all = ents.eventLists.get(exp.client);
      if (!all) throw new TestFailure(`expectEvents: no client entity '${exp.client}'`);
      const actual = all.filter((e) => (eventType === 'command' ? /^command/.test(e.type) : !/^command/.test(e.type)));
      const expected = exp.events;
      const where = `expectEvents(${exp.client}, ${eventType})`;
      if (exp.ignoreExtraEvents ? actual.length < expected.length : actual.length !== expected.length) {
        throw new TestFailure(`${where}: expected ${expected.length} events, got ${actual.length}: ` +
          `[${actual.map(describeEvent).join(', ')}]`);
      }
      expected.forEach((e, i) => {
        const [type, spec] = Object.entries(e)[0];
        const a = actual[i];
        const at = `${where}[${i}]`;
        if (a.type !== type) throw new TestFailure(`${at}: expected ${type}, got ${describeEvent(a)}`);
        const ev = a.event;
        try {
          if (spec.commandName !== undefined && spec.commandName !== ev.commandName) {
            throw new MatchError('commandName', `expected ${spec.commandName}, got ${ev.commandName}`);
          }
          if (spec.databaseName !== undefined && spec.databaseName !== ev.databaseName) {
            throw new MatchError('databaseName', `expected ${spec.databaseName}, got ${ev.databaseName}`);
          }
          if (spec.command !== undefined) match(spec.command, tolerateDriverWtimeout(spec.command, ev), ctx, 'command', true);
          if (spec.reply !== undefined) match(spec.reply, ev.reply, ctx, 'reply', true);
          if (spec.hasServiceId !== undefined && spec.hasServiceId !== (ev.serviceId != null)) {
            throw new MatchError('hasServiceId', `expected ${spec.hasServiceId}`);
          }
          if (spec.hasServerConnectionId !== undefined && spec.hasServerConnectionId !== (ev.serverConnectionId != null)) {
            throw new MatchError('hasServerConnectionId', `expected ${spec.hasServerConnectionId}`);
          }
        } catch (err) {
          throw new TestFailure(`${at} (${describeEvent(a)}): ${err.message}`);
        }
      });
    }
  }

  // ---- operations ------------------------------------------------------------

  async executeOperation(op, ents, { inCallback = false } = {}) {
    let result;
    let error = null;
    try {
      if (op.object === 'testRunner') result = await this.runSpecial(op, ents);
      else result = await this.runEntityOp(op, ents);
    } catch (e) {
      if (e instanceof ops.UnsupportedError || e instanceof TestFailure || e instanceof MatchError) throw e;
      error = e;
    }
    const label = `${op.object}.${op.name}`;
    if (op.ignoreResultAndError) {
      // Errors inside a withTransaction callback always propagate to withTransaction.
      if (inCallback && error) throw error;
      return;
    }
    if (op.expectError) {
      if (!error) throw new TestFailure(`${label}: expected an error, got result ${show(result)}`);
      try {
        ops.checkError(op.expectError, error, ents);
      } catch (e) {
        throw new TestFailure(`${label}: ${e.message}`);
      }
      // The format: errors from callback operations propagate to withTransaction
      // even when expected, so they can be asserted at both levels.
      if (inCallback) throw error;
      return;
    }
    if (error) {
      if (inCallback) throw error; // let withTransaction see the driver error (labels, retry)
      throw new TestFailure(`${label}: unexpected error ${error.name}: ${error.message}` +
        (error.code !== undefined ? ` (code ${error.code}${error.codeName ? ' ' + error.codeName : ''})` : '') +
        (error.errorLabels && error.errorLabels.length ? ` labels [${[...error.errorLabels].join(', ')}]` : ''));
    }
    if (op.expectResult !== undefined) {
      try {
        this.matchResult(op, result, ents);
      } catch (e) {
        throw new TestFailure(`${label}: expectResult ${e.message}`);
      }
    }
    if (op.saveResultAsEntity) {
      const kind = result instanceof ChangeStream ? 'changeStream' : result instanceof AbstractCursor ? 'cursor'
        : result instanceof Collection ? 'collection' : 'result';
      ents.set(op.saveResultAsEntity, result, kind);
      // A collection created by an operation (createCollection) belongs to that entity's client.
      if (kind === 'collection') ents.clientOf.set(op.saveResultAsEntity, ents.clientOf.get(op.object));
    }
  }

  matchResult(op, result, ents) {
    const ctx = { entities: ents };
    if (ops.CURSOR_OPS.has(op.name) && Array.isArray(op.expectResult)) {
      if (!Array.isArray(result) || result.length !== op.expectResult.length) {
        throw new MatchError('', `expected ${show(op.expectResult)}, got ${show(result)}`);
      }
      op.expectResult.forEach((e, i) => match(e, result[i], ctx, `[${i}]`, true));
      return;
    }
    match(op.expectResult, result, ctx, '', true);
  }

  async runEntityOp(op, ents) {
    const entry = ents.entry(op.object);
    const args = op.arguments || {};
    let table;
    switch (entry.kind) {
      case 'collection': table = ops.collectionOps; break;
      case 'database': table = ops.databaseOps; break;
      case 'client': table = ops.clientOps; break;
      case 'session': table = ops.makeSessionOps(this); break;
      case 'changeStream': table = ops.changeStreamOps; break;
      case 'cursor': table = ops.cursorOps; break;
      case 'bucket': table = ops.bucketOps; break;
      default: throw new ops.UnsupportedError(`operations on ${entry.kind} entities are not supported`);
    }
    const fn = table[op.name];
    if (!fn) throw new ops.UnsupportedError(`unsupported operation ${op.name} on ${entry.kind}`);
    return fn(entry.value, args, ents);
  }

  async runSpecial(op, ents) {
    const a = op.arguments || {};
    const session = () => ents.get(a.session, 'session');
    switch (op.name) {
      case 'failPoint': {
        const client = ents.get(a.client, 'client');
        await client.db('admin').command(a.failPoint);
        this.current.failPoints.push(a.failPoint.configureFailPoint);
        return undefined;
      }
      case 'targetedFailPoint': {
        // On the mongos the session's transaction is pinned to; with one server, that one.
        const clientId = ents.clientOf.get(a.session);
        const client = ents.get(clientId, 'client');
        const txn = session().transaction;
        const pinned = txn && txn.server && txn.server.description ? txn.server.description.address : null;
        if (this.perMongos.size && !pinned) throw new TestFailure('targetedFailPoint: the session is not pinned to a mongos');
        if (pinned && this.perMongos.has(pinned)) await this.perMongos.get(pinned).db('admin').command(a.failPoint);
        else await client.db('admin').command(a.failPoint);
        this.current.failPoints.push(a.failPoint.configureFailPoint);
        return undefined;
      }
      case 'createEntities':
        await ents.create(a.entities || []);
        return undefined;
      case 'assertSessionTransactionState': {
        const state = session().transaction.state;
        const map = {
          none: ['NO_TRANSACTION'], starting: ['STARTING_TRANSACTION'], in_progress: ['TRANSACTION_IN_PROGRESS'],
          committed: ['TRANSACTION_COMMITTED', 'TRANSACTION_COMMITTED_EMPTY'], aborted: ['TRANSACTION_ABORTED'],
        };
        if (!(map[a.state] || []).includes(state)) throw new TestFailure(`assertSessionTransactionState: expected ${a.state}, got ${state}`);
        return undefined;
      }
      case 'assertSessionPinned':
        if (!session().isPinned) throw new TestFailure('assertSessionPinned: session is not pinned');
        return undefined;
      case 'assertSessionUnpinned':
        if (session().isPinned) throw new TestFailure('assertSessionUnpinned: session is pinned');
        return undefined;
      case 'assertSessionDirty':
        if (!(session().serverSession && session().serverSession.isDirty)) throw new TestFailure('assertSessionDirty: session is not dirty');
        return undefined;
      case 'assertSessionNotDirty':
        if (session().serverSession && session().serverSession.isDirty) throw new TestFailure('assertSessionNotDirty: session is dirty');
        return undefined;
      case 'assertSameLsidOnLastTwoCommands':
      case 'assertDifferentLsidOnLastTwoCommands': {
        const started = (ents.eventLists.get(a.client) || []).filter((e) => e.type === 'commandStartedEvent');
        if (started.length < 2) throw new TestFailure(`${op.name}: fewer than two commandStartedEvents observed`);
        const lsids = started.slice(-2).map((e) => e.event.command.lsid);
        if (lsids.some((l) => !l)) throw new TestFailure(`${op.name}: one of the last two commands has no lsid`);
        const [x, y] = lsids.map((l) => EJSON.stringify(l, { relaxed: false }));
        const same = x === y;
        if (op.name === 'assertSameLsidOnLastTwoCommands' ? !same : same) {
          throw new TestFailure(`${op.name}: lsids ${x} and ${y}`);
        }
        return undefined;
      }
      case 'assertCollectionExists':
      case 'assertCollectionNotExists': {
        const list = await this.internal.db(a.databaseName).listCollections({ name: a.collectionName }, { nameOnly: true }).toArray();
        const exists = list.length > 0;
        if (op.name === 'assertCollectionExists' ? !exists : exists) {
          throw new TestFailure(`${op.name}: ${a.databaseName}.${a.collectionName} ${exists ? 'exists' : 'does not exist'}`);
        }
        return undefined;
      }
      case 'assertIndexExists':
      case 'assertIndexNotExists': {
        let names = [];
        try {
          names = (await this.internal.db(a.databaseName).collection(a.collectionName).listIndexes().toArray()).map((i) => i.name);
        } catch (e) {
          if (e.code !== 26) throw e;
        }
        const exists = names.includes(a.indexName);
        if (op.name === 'assertIndexExists' ? !exists : exists) {
          throw new TestFailure(`${op.name}: index ${a.indexName} on ${a.databaseName}.${a.collectionName} ` +
            `${exists ? 'exists' : 'does not exist'} (indexes: ${names.join(', ')})`);
        }
        return undefined;
      }
      case 'runOnThread': {
        const thread = ents.get(a.thread, 'thread');
        thread.done = thread.done.then(() => this.executeOperation(a.operation, ents, {})).catch((e) => {
          if (!thread.error) thread.error = e;
        });
        return undefined;
      }
      case 'waitForThread': {
        const thread = ents.get(a.thread, 'thread');
        await thread.done;
        if (thread.error) throw new TestFailure(`thread ${a.thread}: ${describeFailure(thread.error)}`);
        return undefined;
      }
      case 'waitForEvent': {
        const [type, spec] = Object.entries(a.event)[0];
        const list = ents.eventLists.get(a.client);
        if (!list) throw new TestFailure(`waitForEvent: no client entity '${a.client}'`);
        const matches = (e) => e.type === type && (!spec || spec.commandName === undefined || e.event.commandName === spec.commandName);
        const deadline = Date.now() + 10000;
        while (list.filter(matches).length < a.count) {
          if (Date.now() > deadline) throw new TestFailure(`waitForEvent: fewer than ${a.count} ${type} events within 10 s`);
          await new Promise((r) => setTimeout(r, 5));
        }
        return undefined;
      }
      case 'assertNumberConnectionsCheckedOut': {
        const out = ents.checkedOut.get(a.client);
        if (!out) throw new TestFailure(`assertNumberConnectionsCheckedOut: no client entity '${a.client}'`);
        if (out.n !== a.connections) {
          throw new TestFailure(`assertNumberConnectionsCheckedOut: expected ${a.connections}, ${out.n} checked out`);
        }
        return undefined;
      }
      case 'wait':
        await new Promise((r) => setTimeout(r, a.ms));
        return undefined;
      default:
        throw new ops.UnsupportedError(`unsupported testRunner operation ${op.name}`);
    }
  }
}

// The Node.js driver (7.x) adds wtimeout: 10000 to the write concern of
// commitTransaction/abortTransaction whenever a write concern is set, where
// the transactions spec (and its tests) expect only the retry to carry it.
// That is the client's doing, independent of the server, so the field is
// dropped before matching when the test's expectation does not mention it.
const DRIVER_WTIMEOUT_NOTE = 'note: commandStartedEvent checks ignore the wtimeout:10000 the Node.js driver adds to ' +
  'commitTransaction/abortTransaction writeConcern';
function tolerateDriverWtimeout(expected, ev) {
  const cmd = ev.command;
  if (!cmd || !['commitTransaction', 'abortTransaction'].includes(ev.commandName)) return cmd;
  const wc = cmd.writeConcern;
  const ewc = expected.writeConcern;
  if (!wc || wc.wtimeout !== 10000 || !ewc || typeof ewc !== 'object' || 'wtimeout' in ewc) return cmd;
  if (Object.keys(ewc).some((k) => k.startsWith('$$'))) return cmd;
  const rest = { ...wc };
  delete rest.wtimeout;
  return { ...cmd, writeConcern: rest };
}

function describeEvent(e) {
  const ev = e.event;
  if (e.type.startsWith('command')) return `${e.type}(${ev.commandName})`;
  return e.type;
}

function describeFailure(e) {
  if (e instanceof TestFailure || e instanceof MatchError) return e.message;
  if (e instanceof ops.UnsupportedError) return `runner: ${e.message}`;
  return `${e && e.name}: ${e && e.message}` + (e && e.code !== undefined ? ` (code ${e.code})` : '');
}

function collectFiles(args) {
  const out = [];
  for (const a of args) {
    const abs = path.resolve(a);
    if (!fs.existsSync(abs)) throw new Error(`no such file or directory: ${a}`);
    if (fs.statSync(abs).isDirectory()) {
      const base = path.basename(abs);
      for (const f of fs.readdirSync(abs).filter((x) => x.endsWith('.json')).sort()) {
        out.push({ file: path.join(abs, f), name: `${base}/${f}` });
      }
    } else {
      out.push({ file: abs, name: `${path.basename(path.dirname(abs))}/${path.basename(abs)}` });
    }
  }
  return out;
}

// host:port of each host of a mongodb:// URI.
function uriHosts(uri) {
  const m = /^mongodb:\/\/(?:[^@/]*@)?([^/?]*)/.exec(uri);
  return m ? m[1].split(',').filter(Boolean) : [];
}

// The URI with one host in place of the list.
function singleHostUri(uri, host) {
  return uri.replace(/^(mongodb:\/\/(?:[^@/]*@)?)([^/?]*)/, (all, pre) => `${pre}${host}`);
}

module.exports = { Runner, collectFiles, DRIVER_WTIMEOUT_NOTE, loadKnownDifferences, knownDifference };
