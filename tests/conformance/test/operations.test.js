'use strict';
// The runner's operations for command cursors, snapshot times, mapReduce and result entities,
// run end to end (tests/conformance/run against a replica-set double) on a unified-format file
// of our own, so they stay tested whether or not the spec data holds the files that use them:
//   node --test tests/conformance/test/
const test = require('node:test');
const assert = require('node:assert');
const fs = require('fs');
const os = require('os');
const path = require('path');
const { execFile } = require('child_process');
const { startDouble } = require('../../mongod-double/test/helpers');

const RUN = path.join(__dirname, '..', 'run');
const started = (command) => ({ commandStartedEvent: { command } });
const docs = [{ _id: 1, x: 11 }, { _id: 2, x: 22 }, { _id: 3, x: 33 }];

const FILE = {
  description: 'runner operations',
  schemaVersion: '1.9',
  createEntities: [
    { client: { id: 'client0', observeEvents: ['commandStartedEvent'], ignoreCommandMonitoringEvents: ['insert', 'create', 'drop'] } },
    { database: { id: 'db0', client: 'client0', databaseName: 'runner-ops' } },
    { collection: { id: 'coll0', database: 'db0', collectionName: 'coll' } },
    { session: { id: 'snap0', client: 'client0', sessionOptions: { snapshot: true } } },
  ],
  initialData: [{ databaseName: 'runner-ops', collectionName: 'coll', documents: docs }],
  tests: [
    {
      description: 'runCursorCommand iterates the whole cursor; batchSize and comment go to the getMore',
      operations: [{
        object: 'db0', name: 'runCursorCommand',
        arguments: { commandName: 'find', command: { find: 'coll', batchSize: 1 }, batchSize: 2, comment: 'more' },
        expectResult: docs,
      }],
      expectEvents: [{ client: 'client0', events: [
        started({ find: 'coll', batchSize: 1 }),
        started({ getMore: { $$type: ['int', 'long'] }, collection: 'coll', batchSize: 2, comment: 'more' }),
      ] }],
    },
    {
      description: 'createCommandCursor sends the command at once and its entity iterates and closes',
      operations: [
        { object: 'db0', name: 'createCommandCursor', arguments: { commandName: 'find', command: { find: 'coll', batchSize: 2 } }, saveResultAsEntity: 'cursor0' },
        { object: 'cursor0', name: 'iterateUntilDocumentOrError', expectResult: docs[0] },
        { object: 'cursor0', name: 'iterateUntilDocumentOrError', expectResult: docs[1] },
        { object: 'cursor0', name: 'iterateUntilDocumentOrError', expectResult: docs[2] },
        { object: 'cursor0', name: 'close' },
      ],
      expectEvents: [{ client: 'client0', events: [
        started({ find: 'coll', batchSize: 2 }),
        started({ getMore: { $$type: ['int', 'long'] }, collection: 'coll' }),
      ] }],
    },
    {
      description: 'a created collection is an entity; a tailable command cursor outlives an empty batch',
      operations: [
        { object: 'db0', name: 'dropCollection', arguments: { collection: 'capped' } },
        { object: 'db0', name: 'createCollection', arguments: { collection: 'capped', capped: true, size: 4096 }, saveResultAsEntity: 'capped0' },
        { object: 'capped0', name: 'insertMany', arguments: { documents: docs.slice(0, 2) } },
        { object: 'db0', name: 'createCommandCursor', arguments: { commandName: 'find', command: { find: 'capped', tailable: true }, cursorType: 'tailable' }, saveResultAsEntity: 'tail0' },
        { object: 'tail0', name: 'iterateOnce' },
        { object: 'tail0', name: 'iterateOnce' },
        { object: 'tail0', name: 'iterateOnce' },
        { object: 'tail0', name: 'close' },
      ],
      expectEvents: [{ client: 'client0', events: [
        started({ find: 'capped', tailable: true }),
        started({ getMore: { $$type: ['int', 'long'] }, collection: 'capped' }),
        started({ killCursors: 'capped', cursors: { $$type: 'array' } }),
      ] }],
    },
    {
      description: 'getSnapshotTime saves the time; a session with that snapshotTime reads the data as of then',
      operations: [
        { object: 'coll0', name: 'find', arguments: { session: 'snap0', filter: {} }, expectResult: docs },
        { object: 'snap0', name: 'getSnapshotTime', saveResultAsEntity: 'time0' },
        { object: 'coll0', name: 'insertOne', arguments: { document: { _id: 4, x: 44 } } },
        { object: 'testRunner', name: 'createEntities', arguments: { entities: [{ session: { id: 'snap1', client: 'client0', sessionOptions: { snapshot: true, snapshotTime: 'time0' } } }] } },
        { object: 'coll0', name: 'find', arguments: { session: 'snap1', filter: {} }, expectResult: docs },
      ],
      expectEvents: [{ client: 'client0', events: [
        started({ find: 'coll', readConcern: { level: 'snapshot', atClusterTime: { $$exists: false } } }),
        started({ find: 'coll', readConcern: { level: 'snapshot', atClusterTime: { $$matchesEntity: 'time0' } } }),
      ] }],
    },
    {
      description: 'mapReduce is sent as the command and gives the inline results',
      operations: [{
        object: 'coll0', name: 'mapReduce',
        arguments: { map: { $code: 'function () { emit(0, this.x) }' }, reduce: { $code: 'function (k, v) { return v.reduce((a, b) => a + b) }' }, out: { inline: 1 } },
        expectResult: [{ _id: 0, value: 66 }],
      }],
      expectEvents: [{ client: 'client0', events: [
        started({ mapReduce: 'coll', map: { $code: 'function () { emit(0, this.x) }' }, out: { inline: 1 }, writeConcern: { $$exists: false } }),
      ] }],
    },
  ],
};

test('runCursorCommand, createCommandCursor, getSnapshotTime, mapReduce and result entities pass against the double', async () => {
  const d = await startDouble();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'runner-ops-'));
  try {
    const file = path.join(dir, 'runner-operations.json');
    fs.writeFileSync(file, JSON.stringify(FILE));
    const json = path.join(dir, 'out.json');
    const out = await new Promise((resolve) => {
      execFile(RUN, ['--uri', d.uri(), '--json', json, file], { timeout: 60000 }, (error, stdout, stderr) => resolve({ error, stdout, stderr }));
    });
    const results = JSON.parse(fs.readFileSync(json, 'utf8')).results;
    assert.deepStrictEqual(results.map((r) => [r.test, r.status]), FILE.tests.map((t) => [t.description, 'pass']), out.stdout + out.stderr);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
    assert.strictEqual(await d.stop(), 0);
  }
});
