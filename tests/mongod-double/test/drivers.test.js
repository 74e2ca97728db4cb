'use strict';
// The double as other drivers see it: Mongoose, pymongo and mongo-c-driver. Each part is skipped
// (with the reason) when that client is not installed on the machine.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { execFileSync, spawnSync } = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');
const { startDouble } = require('./helpers');

let d;
before(async () => { d = await startDouble(); });
after(async () => { assert.equal(await d.stop(), 0); });

test('Mongoose: unique index, create, transaction, findOneAndUpdate', async () => {
  const mongoose = require('mongoose');
  const conn = await mongoose.createConnection(d.uri().replace('/?', '/mg?'), { serverSelectionTimeoutMS: 5000 }).asPromise();
  try {
    const User = conn.model('User', new mongoose.Schema({ name: { type: String, unique: true }, n: Number }));
    await User.init();
    await User.create({ name: 'a', n: 1 });
    await assert.rejects(User.create({ name: 'a' }), (e) => e.code === 11000);
    await conn.transaction(async (session) => {
      await User.updateOne({ name: 'a' }, { $inc: { n: 5 } }, { session });
      await User.create([{ name: 'b', n: 2 }], { session });
    });
    const a = await User.findOneAndUpdate({ name: 'a' }, { $inc: { n: 1 } }, { returnDocument: 'after' }).lean();
    assert.equal(a.n, 7);
    assert.equal(await User.countDocuments(), 2);
  } finally {
    await conn.close();
  }
});

const PY = '/usr/bin/python3';
const hasPymongo = fs.existsSync(PY) && spawnSync(PY, ['-c', 'import pymongo'], { stdio: 'ignore' }).status === 0;

test('pymongo: CRUD with Int64, transaction, duplicate key, reads from the secondary', { skip: !hasPymongo && 'pymongo not installed' }, () => {
  const script = `
import sys, pymongo
from bson.int64 import Int64
c = pymongo.MongoClient(sys.argv[1], serverSelectionTimeoutMS=5000)
db = c.py
db.c.insert_many([{"_id": 1, "a": Int64(5)}, {"_id": 2, "a": 3}])
assert isinstance(db.c.find_one({"_id": 1})["a"], Int64)
assert [d["_id"] for d in db.c.find({"a": {"$gt": 2}}).sort("a", -1)] == [1, 2]
with c.start_session() as s:
    with s.start_transaction():
        db.c.insert_one({"_id": 3}, session=s)
        assert db.c.count_documents({}) == 2
assert db.c.count_documents({}) == 3
try:
    db.c.insert_one({"_id": 3})
    sys.exit("duplicate accepted")
except pymongo.errors.DuplicateKeyError as e:
    assert e.details["keyValue"] == {"_id": 3}
# The set has a secondary: pymongo discovers it and reads from it.
sec = pymongo.MongoClient(sys.argv[1], serverSelectionTimeoutMS=5000, readPreference="secondary")
assert sec.py.c.count_documents({}) == 3
assert sec.py.c.find_one({"_id": 3}) == {"_id": 3}
assert len(sec.nodes) == 2 and sec.primary is not None and len(sec.secondaries) == 1, (sec.nodes, sec.primary, sec.secondaries)
direct = pymongo.MongoClient("mongodb://%s:%d/?directConnection=true" % list(sec.secondaries)[0], serverSelectionTimeoutMS=5000)
try:
    direct.py.c.insert_one({"_id": 4})
    sys.exit("write accepted by the secondary")
except getattr(pymongo.errors, "NotPrimaryError", None) or pymongo.errors.NotMasterError as e:  # pymongo 3: NotMasterError
    assert e.details["code"] == 10107, e.details
print("ok")
`;
  const out = execFileSync(PY, ['-c', script, d.uri()], { encoding: 'utf8', timeout: 30000 });
  assert.equal(out.trim(), 'ok');
});

const hasMongoc = spawnSync('pkg-config', ['--exists', 'libmongoc-1.0']).status === 0 &&
  spawnSync('cc', ['--version'], { stdio: 'ignore' }).status === 0;

test('mongo-c-driver: insert, find, transaction, secondary read, duplicate key', { skip: !hasMongoc && 'libmongoc-1.0 or cc missing' }, () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'mongoc-smoke-'));
  try {
    const bin = path.join(dir, 'smoke');
    const flags = execFileSync('pkg-config', ['--cflags', '--libs', 'libmongoc-1.0'], { encoding: 'utf8' }).trim().split(/\s+/);
    execFileSync('cc', ['-o', bin, path.join(__dirname, 'clients', 'mongoc-smoke.c'), ...flags], { stdio: 'pipe' });
    for (const uri of [d.uri('replicaSet=rs0&appname=smoke1'), d.uri('directConnection=true&compressors=zlib&appname=smoke2')]) {
      const db = uri.includes('smoke1') ? 'one' : 'two';
      const out = execFileSync(bin, [uri.replace('/?', `/${db}?`)], { encoding: 'utf8', timeout: 30000 });
      assert.match(out, /"x" : \{ "\$numberLong" : "42" \}/);
      assert.match(out, /count 2/);
      // With replicaSet=rs0 the secondary serves it; a direct connection reads from the primary.
      assert.match(out, new RegExp(`secondary read 2 from port ${db === 'one' ? d.secondaryPort : d.port}\\n`));
      assert.match(out, /dup code 11000: E11000 duplicate key error collection: cdb\.c index: _id_ dup key: \{ _id: 2 \}/);
      execFileSync(process.execPath, ['-e', `
        const { MongoClient } = require('mongodb');
        (async () => { const c = new MongoClient(${JSON.stringify(d.uri())}); await c.db('cdb').dropDatabase(); await c.close(); })();
      `], { cwd: path.join(__dirname, '..', '..'), stdio: 'pipe' });
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
