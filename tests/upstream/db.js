'use strict';
// The run's database against a real upstream (tests/upstream/run): emptied as a fresh server
// would be, at the start of each test file and each time a test starts its upstream
// (tests/integration/lib/proxy.js startUpstream), except the run's marker document, which
// says who made the database.

const MARKER = 'relaybus_test_run';

/** Drops every collection of `database` (a driver Db) but the marker and system.*. */
async function emptyDatabase(database) {
  const colls = await database.listCollections({}, { nameOnly: true, authorizedCollections: true }).toArray();
  for (const c of colls) {
    if (c.name === MARKER || c.name.startsWith('system.')) continue;
    await database.collection(c.name).drop().catch((e) => {
      if (e.code !== 26) throw e; // NamespaceNotFound: gone already
    });
  }
}

/** emptyDatabase of `dbName` on the deployment `uri`, on a connection of its own. */
async function emptyRunDb(uri, dbName) {
  const { MongoClient } = require('mongodb');
  const client = new MongoClient(uri, { appName: 'relaybus-test-upstream', serverSelectionTimeoutMS: 20000 });
  try {
    await client.connect();
    await emptyDatabase(client.db(dbName));
  } finally {
    await client.close();
  }
}

module.exports = { MARKER, emptyDatabase, emptyRunDb };
