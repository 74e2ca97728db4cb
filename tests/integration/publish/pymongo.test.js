'use strict';
// pymongo through the proxy (Debian's python3-pymongo, 3.11): CRUD, a cursor over several
// getMore batches, a transaction whose insert carries an annotation (pymongo 3.11's insert_one
// has no comment option, so the insert is sent as a command in the session, as such
// applications do), relaybusPublish in a transaction, and an abort that leaves no event. The
// outbox is then read directly: the committed events are there with their deliveries, the
// aborted one is not.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const { execFile, execFileSync } = require('node:child_process');
const P = require('./lib');

const H = P.H;
const DB = H.uniqueDbName('pubpy');
const PYTHON = '/usr/bin/python3';
let s;

function havePymongo() {
  if (!fs.existsSync(PYTHON)) return false;
  const out = execFileSync(PYTHON, ['-c', 'import importlib.util,sys; sys.stdout.write(str(importlib.util.find_spec("pymongo") is not None))'], { encoding: 'utf8' });
  return out === 'True';
}

const SCRIPT = String.raw`
import json, sys
from bson.son import SON
from pymongo import MongoClient, monitoring
from pymongo.errors import OperationFailure

counts = {}
class Listener(monitoring.CommandListener):
    def started(self, e): counts[e.command_name] = counts.get(e.command_name, 0) + 1
    def succeeded(self, e): pass
    def failed(self, e): pass

uri, dbname = sys.argv[1], sys.argv[2]
c = MongoClient(uri, serverSelectionTimeoutMS=10000, event_listeners=[Listener()])
db = c[dbname]
out = {}

# CRUD
items = db.items
items.insert_many([{"_id": i, "qty": i % 7} for i in range(250)])
items.update_one({"_id": 3}, {"$set": {"name": "three"}})
items.delete_one({"_id": 4})
out["crud"] = {
    "count": items.count_documents({}),
    "three": items.find_one({"_id": 3}, {"_id": 0, "name": 1}),
    "deleted": items.find_one({"_id": 4}),
}

# a cursor over several batches
before = counts.get("getMore", 0)
seen = [d["_id"] for d in items.find({}, sort=[("_id", 1)], batch_size=40)]
out["cursor"] = {"n": len(seen), "ordered": seen == sorted(seen), "getMores": counts.get("getMore", 0) - before}

# a transaction with an annotated insert, and relaybusPublish in another
with c.start_session() as session:
    with session.start_transaction():
        db.command(SON([("insert", "orders"), ("documents", [{"_id": "py-1", "total": 12}]),
                        ("comment", {"relaybus": {"type": "order.placed.v1", "id": "py-ev-1", "key": "py-k", "payload": {"total": 12}}})]),
                   session=session)
    with session.start_transaction():
        r = db.command(SON([("relaybusPublish", 1), ("events", [{"type": "user.created.v1", "id": "py-ev-2"}])]), session=session)
        out["publish"] = r.get("eventIds")
    # aborted: neither the write nor its event may appear
    session.start_transaction()
    db.command(SON([("insert", "orders"), ("documents", [{"_id": "py-2"}]),
                    ("comment", {"relaybus": {"type": "order.placed.v1", "id": "py-ev-3"}})]),
               session=session)
    session.abort_transaction()

print(json.dumps(out))
`;

test.before(async () => {
  s = await P.startStack({});
});

test.after(async () => {
  if (s) await s.stop();
});

test('pymongo: CRUD, a multi-batch cursor, annotated transactions and relaybusPublish', async (t) => {
  if (!havePymongo()) {
    t.skip('Debian python3-pymongo is not installed (scripts/test installs it)');
    return;
  }
  const r = await new Promise((resolve) => {
    execFile(PYTHON, ['-c', SCRIPT, s.proxy.uri(), DB], { timeout: 90000, encoding: 'utf8' }, (err, stdout, stderr) =>
      resolve({ code: err ? (err.code ?? err.signal) : 0, stdout, stderr }),
    );
  });
  assert.equal(r.code, 0, `pymongo script failed:\n${r.stdout}\n${r.stderr}`);
  const out = JSON.parse(r.stdout.trim().split('\n').pop());
  assert.deepEqual(out.crud, { count: 249, three: { name: 'three' }, deleted: null });
  assert.equal(out.cursor.n, 249);
  assert.equal(out.cursor.ordered, true);
  assert.ok(out.cursor.getMores >= 6, `the cursor took several batches (${out.cursor.getMores} getMore)`);
  assert.deepEqual(out.publish, ['py-ev-2']);

  await P.checkEvent(s.outbox, 'py-ev-1', { type: 'order.placed.v1', key: 'py-k', payload: { total: 12 }, handlers: P.subscribed(P.HANDLERS, 'order.placed.v1') });
  await P.checkEvent(s.outbox, 'py-ev-2', { type: 'user.created.v1', handlers: P.subscribed(P.HANDLERS, 'user.created.v1') });
  assert.equal(await s.outbox.events.countDocuments({ _id: 'py-ev-3' }), 0, 'the aborted transaction left no event');
  assert.equal(await s.outbox.deliveries.countDocuments({ eventId: 'py-ev-3' }), 0);
  const orders = s.direct.db(DB).collection('orders');
  assert.equal(await orders.countDocuments({ _id: 'py-1' }), 1);
  assert.equal(await orders.countDocuments({ _id: 'py-2' }), 0);
});
