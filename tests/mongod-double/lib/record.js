'use strict';
// DOUBLE_RECORD=DIR: a record of the command shapes the double received, for a list of what a
// client (the proxy) sends upstream and for checking it against a real deployment. Each process
// appends to DIR/record-<pid>.jsonl one JSON line per distinct shape, the first time it sees it:
//   {"app": appName or null, "db": $db, "command": name, "coll": the command's string argument
//    or null, "fields": sorted top-level field names, "stmt": sorted union of the field names of
//    an update's or a delete's statements (else null), "stages": an aggregate's stage names in
//    order (else null), "code": the reply's error code or 0}
// Commands of client connections only (replica set members and mongos routers), not a mongos's
// own calls to its shards. Cheap: a Set of the shapes seen, a write only for a new one.

const fs = require('fs');
const path = require('path');
const V = require('./values');

const DIR = process.env.DOUBLE_RECORD || '';
const seen = new Set();
let file = null;
let broken = false;

const STATEMENTS = { update: 'updates', delete: 'deletes' };

function shapeOf(appName, db, name, body, reply) {
  const isObj = (v) => v !== null && typeof v === 'object' && !Array.isArray(v) && !v._bsontype;
  let stmt = null;
  const list = STATEMENTS[name] && body[STATEMENTS[name]];
  if (Array.isArray(list)) {
    const names = new Set();
    for (const st of list) if (isObj(st)) for (const k of V.keys(st)) names.add(k);
    stmt = [...names].sort();
  }
  let stages = null;
  if (name === 'aggregate' && Array.isArray(body.pipeline)) {
    stages = body.pipeline.map((st) => (isObj(st) ? V.keys(st)[0] || null : null));
  }
  const failed = reply && typeof reply === 'object' && !V.truthy(reply.ok) && reply.code !== undefined;
  return {
    app: typeof appName === 'string' ? appName : null,
    db: typeof db === 'string' ? db : null,
    command: name,
    coll: typeof body[name] === 'string' ? body[name] : null,
    fields: V.keys(body).slice().sort(),
    stmt,
    stages,
    code: failed ? V.toNumber(reply.code) : 0,
  };
}

// Notes one command and its reply; a no-op without DOUBLE_RECORD.
function record(appName, db, name, body, reply, log) {
  if (!DIR || broken || typeof name !== 'string' || !body) return;
  const line = JSON.stringify(shapeOf(appName, db, name, body, reply));
  if (seen.has(line)) return;
  seen.add(line);
  try {
    if (!file) {
      fs.mkdirSync(DIR, { recursive: true });
      file = path.join(DIR, `record-${process.pid}.jsonl`);
    }
    fs.appendFileSync(file, `${line}\n`);
  } catch (e) {
    broken = true;
    if (log) log(`DOUBLE_RECORD: cannot write the record in ${DIR}: ${e.message}; recording stops`);
  }
}

module.exports = { record, shapeOf };
