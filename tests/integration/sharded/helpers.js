'use strict';
// What the sharded tests ask of the double's routers directly: the commands each mongos was
// sent (doubleStats with reset), and a mongos stopped alone ({shutdown: 1}).
const { MongoClient } = require('mongodb');

// For each port, what that mongos was sent since the last call, by command name: an object
// of the names asked for, or null for a mongos that no longer answers (stopped).
async function commandsPerMongos(ports, names) {
  const out = [];
  for (const port of ports) {
    const c = new MongoClient(`mongodb://127.0.0.1:${port}/?directConnection=true`, { serverSelectionTimeoutMS: 1000 });
    try {
      const r = await c.db('admin').command({ doubleStats: 1, reset: true });
      const n = {};
      for (const k of names) n[k] = Number((r.commands && r.commands[k]) || 0);
      out.push(n);
    } catch {
      out.push(null);
    } finally {
      await c.close();
    }
  }
  return out;
}

// One command's count per mongos (null: stopped) since the last call.
async function countsOf(ports, name) {
  return (await commandsPerMongos(ports, [name])).map((n) => n && n[name]);
}

// Stops one mongos: it drops the asking connection without a reply, so the error is ignored.
async function stopMongos(port) {
  const c = new MongoClient(`mongodb://127.0.0.1:${port}/?directConnection=true`, { serverSelectionTimeoutMS: 2000 });
  try {
    await c.db('admin').command({ shutdown: 1 }).catch(() => {});
  } finally {
    await c.close();
  }
}

module.exports = { commandsPerMongos, countsOf, stopMongos };
