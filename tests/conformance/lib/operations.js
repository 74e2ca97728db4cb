'use strict';
// Entity operations and special testRunner operations for the unified test format.

const { MongoServerError, MongoWriteConcernError, MongoBulkWriteError, MongoClientBulkWriteError, Binary } = require('mongodb');
const { match, MatchError, show } = require('./match');
const { readPreferenceFrom, rwOptions } = require('./entities');

// Operations whose result is an iterable of documents: each element is matched
// as a root-level document.
const CURSOR_OPS = new Set(['find', 'aggregate', 'listCollections', 'listDatabases', 'listIndexes',
  'runCursorCommand', 'listSearchIndexes', 'mapReduce']);

class UnsupportedError extends Error {}

function splitArgs(args, positional) {
  const opts = {};
  const pos = {};
  for (const [k, v] of Object.entries(args || {})) {
    if (positional.includes(k)) pos[k] = v;
    else opts[k] = v;
  }
  return { pos, opts };
}

function driverOptions(opts, entities) {
  const out = {};
  for (const [k, v] of Object.entries(opts)) {
    if (k === 'session') out.session = entities.get(v, 'session');
    else if (k === 'returnDocument') out.returnDocument = String(v).toLowerCase();
    else if (k === 'readPreference') out.readPreference = readPreferenceFrom(v);
    else if (k === 'cursorType') {
      // The format's cursorType: tailable or tailableAwait (Node.js: tailable / awaitData).
      if (v === 'tailable' || v === 'tailableAwait') out.tailable = true;
      if (v === 'tailableAwait') out.awaitData = true;
      if (v !== 'tailable' && v !== 'tailableAwait' && v !== 'nonTailable') throw new UnsupportedError(`unknown cursorType ${v}`);
    }
    else out[k] = v;
  }
  return out;
}

function plainBulkResult(r) {
  if (!r) return r;
  const out = {
    insertedCount: r.insertedCount,
    matchedCount: r.matchedCount,
    modifiedCount: r.modifiedCount,
    deletedCount: r.deletedCount,
    upsertedCount: r.upsertedCount,
    upsertedIds: { ...(r.upsertedIds || {}) },
    insertedIds: { ...(r.insertedIds || {}) },
  };
  return out;
}

function mapToObject(m) {
  if (!m) return m;
  if (m instanceof Map) {
    const o = {};
    for (const [k, v] of m) o[String(k)] = v;
    return o;
  }
  return m;
}

function plainClientBulkResult(r) {
  if (!r) return r;
  const out = {
    insertedCount: r.insertedCount,
    upsertedCount: r.upsertedCount,
    matchedCount: r.matchedCount,
    modifiedCount: r.modifiedCount,
    deletedCount: r.deletedCount,
  };
  if (r.insertResults) out.insertResults = mapToObject(r.insertResults);
  if (r.updateResults) out.updateResults = mapToObject(r.updateResults);
  if (r.deleteResults) out.deleteResults = mapToObject(r.deleteResults);
  return out;
}

function clientBulkModels(models) {
  return models.map((m) => {
    const [name, spec] = Object.entries(m)[0];
    return { name, ...spec };
  });
}

// The Node.js driver replaces an explicit `_id: null` with a new ObjectId
// before sending (it tests `_id == null`), so the null never reaches the
// server.  forceServerObjectId makes it send the document as written, which
// is what a test that inserts a null _id is about.  Only set for those
// documents: elsewhere the driver's own ids are what tests expect.
function keepNullIds(docs, options) {
  if (docs.some((d) => d && Object.prototype.hasOwnProperty.call(d, '_id') && d._id === null)) {
    options.forceServerObjectId = true;
  }
  return options;
}

// ---- collection operations -------------------------------------------------

const collectionOps = {
  async insertOne(coll, args, ents) {
    const { pos, opts } = splitArgs(args, ['document']);
    return coll.insertOne(pos.document, keepNullIds([pos.document], driverOptions(opts, ents)));
  },
  async insertMany(coll, args, ents) {
    const { pos, opts } = splitArgs(args, ['documents']);
    return coll.insertMany(pos.documents, keepNullIds(pos.documents, driverOptions(opts, ents)));
  },
  async updateOne(coll, args, ents) {
    const { pos, opts } = splitArgs(args, ['filter', 'update']);
    return coll.updateOne(pos.filter, pos.update, driverOptions(opts, ents));
  },
  async updateMany(coll, args, ents) {
    const { pos, opts } = splitArgs(args, ['filter', 'update']);
    return coll.updateMany(pos.filter, pos.update, driverOptions(opts, ents));
  },
  async replaceOne(coll, args, ents) {
    const { pos, opts } = splitArgs(args, ['filter', 'replacement']);
    return coll.replaceOne(pos.filter, pos.replacement, driverOptions(opts, ents));
  },
  async deleteOne(coll, args, ents) {
    const { pos, opts } = splitArgs(args, ['filter']);
    return coll.deleteOne(pos.filter, driverOptions(opts, ents));
  },
  async deleteMany(coll, args, ents) {
    const { pos, opts } = splitArgs(args, ['filter']);
    return coll.deleteMany(pos.filter, driverOptions(opts, ents));
  },
  async bulkWrite(coll, args, ents) {
    const { pos, opts } = splitArgs(args, ['requests']);
    const inserted = pos.requests.filter((r) => r.insertOne).map((r) => r.insertOne.document);
    return plainBulkResult(await coll.bulkWrite(pos.requests, keepNullIds(inserted, driverOptions(opts, ents))));
  },
  async find(coll, args, ents) {
    const { pos, opts } = splitArgs(args, ['filter']);
    return coll.find(pos.filter || {}, driverOptions(opts, ents)).toArray();
  },
  async findOne(coll, args, ents) {
    const { pos, opts } = splitArgs(args, ['filter']);
    return coll.findOne(pos.filter || {}, driverOptions(opts, ents));
  },
  async findOneAndDelete(coll, args, ents) {
    const { pos, opts } = splitArgs(args, ['filter']);
    return coll.findOneAndDelete(pos.filter, driverOptions(opts, ents));
  },
  async findOneAndReplace(coll, args, ents) {
    const { pos, opts } = splitArgs(args, ['filter', 'replacement']);
    return coll.findOneAndReplace(pos.filter, pos.replacement, driverOptions(opts, ents));
  },
  async findOneAndUpdate(coll, args, ents) {
    const { pos, opts } = splitArgs(args, ['filter', 'update']);
    return coll.findOneAndUpdate(pos.filter, pos.update, driverOptions(opts, ents));
  },
  async aggregate(coll, args, ents) {
    const { pos, opts } = splitArgs(args, ['pipeline']);
    return coll.aggregate(pos.pipeline, driverOptions(opts, ents)).toArray();
  },
  async countDocuments(coll, args, ents) {
    const { pos, opts } = splitArgs(args, ['filter']);
    return coll.countDocuments(pos.filter, driverOptions(opts, ents));
  },
  async estimatedDocumentCount(coll, args, ents) {
    return coll.estimatedDocumentCount(driverOptions(args || {}, ents));
  },
  async count(coll, args, ents) {
    const { pos, opts } = splitArgs(args, ['filter']);
    return coll.count(pos.filter, driverOptions(opts, ents));
  },
  async distinct(coll, args, ents) {
    const { pos, opts } = splitArgs(args, ['fieldName', 'filter']);
    return coll.distinct(pos.fieldName, pos.filter || {}, driverOptions(opts, ents));
  },
  async createIndex(coll, args, ents) {
    const { pos, opts } = splitArgs(args, ['keys']);
    return coll.createIndex(pos.keys, driverOptions(opts, ents));
  },
  async dropIndex(coll, args, ents) {
    const { pos, opts } = splitArgs(args, ['name']);
    return coll.dropIndex(pos.name, driverOptions(opts, ents));
  },
  async dropIndexes(coll, args, ents) {
    return coll.dropIndexes(driverOptions(args || {}, ents));
  },
  async listIndexes(coll, args, ents) {
    return coll.listIndexes(driverOptions(args || {}, ents)).toArray();
  },
  async listIndexNames(coll, args, ents) {
    const list = await coll.listIndexes(driverOptions(args || {}, ents)).toArray();
    return list.map((i) => i.name);
  },
  // Atlas Search index management: on a 7.0 replica set (no Atlas) the server answers each
  // of these with an error, which is what the spec tests expect.
  async createSearchIndex(coll, args) {
    return coll.createSearchIndex(args.model);
  },
  async createSearchIndexes(coll, args) {
    return coll.createSearchIndexes(args.models);
  },
  async dropSearchIndex(coll, args) {
    return coll.dropSearchIndex(args.name);
  },
  async updateSearchIndex(coll, args) {
    return coll.updateSearchIndex(args.name, args.definition);
  },
  async listSearchIndexes(coll, args, ents) {
    const a = args || {};
    const opts = driverOptions(a.aggregationOptions || {}, ents);
    const cursor = a.name !== undefined ? coll.listSearchIndexes(a.name, opts) : coll.listSearchIndexes(opts);
    return cursor.toArray();
  },
  // A find cursor entity: the find is sent now (as the drivers' runners do), later
  // iterations send getMores.
  async createFindCursor(coll, args, ents) {
    const { pos, opts } = splitArgs(args, ['filter']);
    const cursor = coll.find(pos.filter || {}, driverOptions(opts, ents));
    try {
      await cursor.cursorInit();
    } catch (e) {
      await cursor.close().catch(() => {});
      throw e;
    }
    return cursor;
  },
  async drop(coll, args, ents) {
    return coll.drop(driverOptions(args || {}, ents));
  },
  async rename(coll, args, ents) {
    const { pos, opts } = splitArgs(args, ['to']);
    return coll.rename(pos.to, driverOptions(opts, ents));
  },
  // The Node.js driver has no mapReduce helper (removed in 6.0), so the runner sends the
  // command as the spec's tests expect it: {mapReduce, map, reduce, out, ...options}, through
  // the collection's database without its write concern (the tests check that none is sent)
  // and, like the removed helper, without retrying it (mapReduce is not a retryable read). The
  // result: the documents of an inline output, otherwise the server's reply.
  async mapReduce(coll, args, ents) {
    const { pos, opts } = splitArgs(args, ['map', 'reduce', 'out', 'session', 'readPreference']);
    const cmd = { mapReduce: coll.collectionName, map: pos.map, reduce: pos.reduce, out: pos.out, ...opts };
    const given = {};
    if (pos.session !== undefined) given.session = pos.session;
    if (pos.readPreference !== undefined) given.readPreference = pos.readPreference;
    const options = driverOptions(given, ents);
    const reply = await coll.client.db(coll.dbName).command(cmd, options);
    return pos.out && pos.out.inline !== undefined ? reply.results : reply;
  },
  createChangeStream: createChangeStream,
};

// ---- change streams --------------------------------------------------------

// watch() on a client, database or collection; like the drivers' own runners, the aggregate
// is sent now (the Node.js driver would send it on the first iteration), so its errors
// belong to this operation and its events come first.
async function createChangeStream(watchable, args, ents) {
  const { pos, opts } = splitArgs(args, ['pipeline']);
  const cs = watchable.watch(pos.pipeline || [], driverOptions(opts, ents));
  try {
    await cs.cursor.cursorInit();
  } catch (e) {
    await cs.close().catch(() => {});
    throw e;
  }
  return cs;
}

// Iteration of find and command cursor entities (createFindCursor, createCommandCursor): the
// same operations as on change streams.
const cursorOps = {
  async iterateUntilDocumentOrError(c) {
    const doc = await c.next();
    if (doc === null) throw new MatchError('iterateUntilDocumentOrError', 'the cursor is exhausted');
    return doc;
  },
  async iterateOnce(c) {
    const doc = await c.tryNext();
    return doc === null ? undefined : doc;
  },
  // The format: errors of close (a failed killCursors) are suppressed; tests check them through
  // the command events.
  async close(c) {
    await c.close().catch(() => {});
    return undefined;
  },
};

const changeStreamOps = {
  // Waits (with getMores) for the next event or error.
  async iterateUntilDocumentOrError(cs) {
    return cs.next();
  },
  // One getMore at most: the next event, or nothing.
  async iterateOnce(cs) {
    const doc = await cs.tryNext();
    return doc === null ? undefined : doc;
  },
  async close(cs) {
    await cs.close();
    return undefined;
  },
};

// ---- database operations ---------------------------------------------------

// db.runCursorCommand with the format's arguments: the command as given, and batchSize,
// maxTimeMS and comment for the getMores (the driver's setBatchSize, setMaxTimeMS and
// setComment; the command's own fields stay in the command). cursorType and timeoutMode are
// cursor options.
function commandCursor(db, args, ents) {
  const { pos, opts } = splitArgs(args, ['command', 'commandName', 'batchSize', 'maxTimeMS', 'comment']);
  const cursor = db.runCursorCommand(pos.command, driverOptions(opts, ents));
  if (pos.batchSize !== undefined) cursor.setBatchSize(pos.batchSize);
  if (pos.maxTimeMS !== undefined) cursor.setMaxTimeMS(pos.maxTimeMS);
  if (pos.comment !== undefined) cursor.setComment(pos.comment);
  return cursor;
}

const databaseOps = {
  async runCommand(db, args, ents) {
    const { pos, opts } = splitArgs(args, ['command', 'commandName']);
    return db.command(pos.command, driverOptions(opts, ents));
  },
  // Fully iterated, as the format requires (drivers that create the cursor lazily and those
  // that do it eagerly then send the same commands).
  async runCursorCommand(db, args, ents) {
    return commandCursor(db, args, ents).toArray();
  },
  // A command cursor entity: the command is sent now, iterations send getMores.
  async createCommandCursor(db, args, ents) {
    const cursor = commandCursor(db, args, ents);
    try {
      await cursor.cursorInit();
    } catch (e) {
      await cursor.close().catch(() => {});
      throw e;
    }
    return cursor;
  },
  // The result is the new collection, which a test may save as a collection entity.
  async createCollection(db, args, ents) {
    const { pos, opts } = splitArgs(args, ['collection']);
    return db.createCollection(pos.collection, driverOptions(opts, ents));
  },
  async dropCollection(db, args, ents) {
    const { pos, opts } = splitArgs(args, ['collection']);
    return db.dropCollection(pos.collection, driverOptions(opts, ents));
  },
  async listCollections(db, args, ents) {
    const { pos, opts } = splitArgs(args, ['filter']);
    return db.listCollections(pos.filter || {}, driverOptions(opts, ents)).toArray();
  },
  // The full documents: what the Node.js driver's listCollections returns.
  async listCollectionObjects(db, args, ents) {
    const { pos, opts } = splitArgs(args, ['filter']);
    return db.listCollections(pos.filter || {}, driverOptions(opts, ents)).toArray();
  },
  async listCollectionNames(db, args, ents) {
    const { pos, opts } = splitArgs(args, ['filter']);
    const list = await db.listCollections(pos.filter || {}, { ...driverOptions(opts, ents), nameOnly: true }).toArray();
    return list.map((c) => c.name);
  },
  async aggregate(db, args, ents) {
    const { pos, opts } = splitArgs(args, ['pipeline']);
    return db.aggregate(pos.pipeline, driverOptions(opts, ents)).toArray();
  },
  createChangeStream: createChangeStream,
  async modifyCollection(db, args, ents) {
    const { pos, opts } = splitArgs(args, ['collection', 'session']);
    const cmdOpts = pos.session ? { session: ents.get(pos.session, 'session') } : {};
    return db.command({ collMod: pos.collection, ...opts }, cmdOpts);
  },
};

// ---- client operations -----------------------------------------------------

const clientOps = {
  createChangeStream: createChangeStream,
  async listDatabases(client, args, ents) {
    const r = await client.db('admin').admin().listDatabases(driverOptions(args || {}, ents));
    return r.databases;
  },
  async listDatabaseObjects(client, args, ents) {
    const r = await client.db('admin').admin().listDatabases(driverOptions(args || {}, ents));
    return r.databases;
  },
  async dropDatabase(client, args, ents) {
    const { pos, opts } = splitArgs(args, ['database']);
    return client.db(pos.database).dropDatabase(driverOptions(opts, ents));
  },
  async listDatabaseNames(client, args, ents) {
    const r = await client.db('admin').admin().listDatabases({ ...driverOptions(args || {}, ents), nameOnly: true });
    return r.databases.map((d) => d.name);
  },
  async clientBulkWrite(client, args, ents) {
    const { pos, opts } = splitArgs(args, ['models']);
    return plainClientBulkResult(await client.bulkWrite(clientBulkModels(pos.models), driverOptions(opts, ents)));
  },
};

// ---- GridFS bucket operations ---------------------------------------------

function hexBytes(v) {
  if (v && typeof v === 'object' && typeof v.$$hexBytes === 'string') return Buffer.from(v.$$hexBytes, 'hex');
  if (v && v._bsontype === 'Binary') return Buffer.from(v.buffer);
  if (Buffer.isBuffer(v)) return v;
  throw new UnsupportedError(`upload: unsupported source ${show(v)}`);
}

function readAll(stream) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    stream.on('data', (c) => chunks.push(c));
    stream.on('error', reject);
    stream.on('end', () => resolve(new Binary(Buffer.concat(chunks))));
  });
}

const bucketOps = {
  async delete(bucket, args, ents) {
    const { pos, opts } = splitArgs(args, ['id']);
    await bucket.delete(pos.id, driverOptions(opts, ents));
    return undefined;
  },
  async download(bucket, args, ents) {
    const { pos, opts } = splitArgs(args, ['id']);
    return readAll(bucket.openDownloadStream(pos.id, driverOptions(opts, ents)));
  },
  async downloadByName(bucket, args, ents) {
    const { pos, opts } = splitArgs(args, ['filename']);
    return readAll(bucket.openDownloadStreamByName(pos.filename, driverOptions(opts, ents)));
  },
  async rename(bucket, args, ents) {
    const { pos, opts } = splitArgs(args, ['id', 'newFilename']);
    await bucket.rename(pos.id, pos.newFilename, driverOptions(opts, ents));
    return undefined;
  },
  async drop(bucket, args, ents) {
    await bucket.drop(driverOptions(args || {}, ents));
    return undefined;
  },
  async find(bucket, args, ents) {
    const { pos, opts } = splitArgs(args, ['filter']);
    return bucket.find(pos.filter || {}, driverOptions(opts, ents)).toArray();
  },
  async upload(bucket, args, ents) {
    const { pos, opts } = splitArgs(args, ['filename', 'source']);
    const data = hexBytes(pos.source);
    const stream = bucket.openUploadStream(pos.filename, driverOptions(opts, ents));
    await new Promise((resolve, reject) => {
      stream.once('error', reject);
      stream.once('finish', resolve);
      stream.end(data);
    });
    return stream.id;
  },
};

// ---- session operations ----------------------------------------------------

function txnOptions(args) {
  if (!args) return undefined;
  const o = { ...args };
  delete o.callback;
  return rwOptions(o);
}

function makeSessionOps(runner) {
  return {
    async startTransaction(session, args) {
      runner.current.startedTransaction = true;
      session.startTransaction(txnOptions(args));
    },
    async commitTransaction(session) {
      return session.commitTransaction();
    },
    async abortTransaction(session) {
      return session.abortTransaction();
    },
    async endSession(session) {
      return session.endSession();
    },
    // The Node.js driver keeps a snapshot session's time (the atClusterTime of its first read)
    // in session.snapshotTime, which its public typings leave out; there is no getter.
    async getSnapshotTime(session) {
      if (!session.snapshotEnabled) throw new UnsupportedError('getSnapshotTime: the session is not a snapshot session');
      return session.snapshotTime;
    },
    async withTransaction(session, args, ents) {
      runner.current.startedTransaction = true;
      const ops = args.callback || [];
      const result = await session.withTransaction(async () => {
        for (const op of ops) await runner.executeOperation(op, ents, { inCallback: true });
      }, txnOptions(args));
      return result;
    },
  };
}

// ---- error checking --------------------------------------------------------

function isServerError(err) {
  return err instanceof MongoServerError || err instanceof MongoWriteConcernError;
}

function errorLabels(err) {
  const labels = new Set();
  if (err && typeof err.hasErrorLabel === 'function' && err.errorLabels) {
    for (const l of err.errorLabels) labels.add(l);
  } else if (err && Array.isArray(err.errorLabels)) {
    for (const l of err.errorLabels) labels.add(l);
  }
  return labels;
}

function checkError(expected, err, ents) {
  const ctx = { entities: ents };
  const desc = `${err && err.name}: ${err && err.message}`;
  if (expected.isClientError === true && isServerError(err)) {
    throw new MatchError('expectError.isClientError', `expected a client-side error, got server error ${desc}`);
  }
  if (expected.isClientError === false && !isServerError(err)) {
    throw new MatchError('expectError.isClientError', `expected a server error, got client error ${desc}`);
  }
  if (expected.isTimeoutError !== undefined) {
    const isTimeout = err && err.name === 'MongoOperationTimeoutError';
    if (expected.isTimeoutError !== isTimeout) {
      throw new MatchError('expectError.isTimeoutError', `expected isTimeoutError=${expected.isTimeoutError}, got ${desc}`);
    }
  }
  if (expected.errorContains !== undefined) {
    const msg = String((err && err.message) || '').toLowerCase();
    if (!msg.includes(String(expected.errorContains).toLowerCase())) {
      throw new MatchError('expectError.errorContains', `expected message containing '${expected.errorContains}', got ${desc}`);
    }
  }
  if (expected.errorCode !== undefined) {
    if (!isServerError(err) || err.code !== expected.errorCode) {
      throw new MatchError('expectError.errorCode', `expected server error code ${expected.errorCode}, got code ${err && err.code} (${desc})`);
    }
  }
  if (expected.errorCodeName !== undefined) {
    const name = err && (err.codeName || (err.errorResponse && err.errorResponse.codeName));
    if (!isServerError(err) || name !== expected.errorCodeName) {
      throw new MatchError('expectError.errorCodeName', `expected codeName ${expected.errorCodeName}, got ${name} (${desc})`);
    }
  }
  const labels = errorLabels(err);
  for (const l of expected.errorLabelsContain || []) {
    if (!labels.has(l)) {
      throw new MatchError('expectError.errorLabelsContain', `expected label ${l}, got [${[...labels].join(', ')}] (${desc})`);
    }
  }
  for (const l of expected.errorLabelsOmit || []) {
    if (labels.has(l)) {
      throw new MatchError('expectError.errorLabelsOmit', `label ${l} must be absent, got [${[...labels].join(', ')}] (${desc})`);
    }
  }
  if (expected.errorResponse !== undefined) {
    const resp = (err && err.errorResponse) || err;
    match(expected.errorResponse, resp, ctx, 'expectError.errorResponse', true);
  }
  if (expected.writeErrors !== undefined) {
    const we = {};
    if (err instanceof MongoClientBulkWriteError) {
      for (const [k, v] of err.writeErrors) we[String(k)] = v;
    }
    match(expected.writeErrors, we, ctx, 'expectError.writeErrors', false);
  }
  if (expected.writeConcernErrors !== undefined) {
    const wce = (err && err.writeConcernErrors) || [];
    if (wce.length !== expected.writeConcernErrors.length) {
      throw new MatchError('expectError.writeConcernErrors', `expected ${expected.writeConcernErrors.length}, got ${wce.length}`);
    }
    expected.writeConcernErrors.forEach((e, i) => match(e, wce[i], ctx, `expectError.writeConcernErrors[${i}]`, true));
  }
  if (expected.expectResult !== undefined) {
    let partial;
    if (err instanceof MongoBulkWriteError) {
      partial = plainBulkResult(err.result);
      // On a failed bulk write the Node driver reports insertedIds for every
      // document it attempted (computed client-side from the request, not from
      // the server's reply), inserted or not. The CRUD spec makes insertedIds
      // optional, so it is left unset here; insertedCount still comes from the
      // server and is checked.
      delete partial.insertedIds;
    }
    else if (err instanceof MongoClientBulkWriteError) partial = plainClientBulkResult(err.partialResult);
    match(expected.expectResult, partial, ctx, 'expectError.expectResult', true);
  }
}

module.exports = {
  collectionOps, databaseOps, clientOps, changeStreamOps, cursorOps, bucketOps, makeSessionOps, checkError, CURSOR_OPS, UnsupportedError, show,
};
