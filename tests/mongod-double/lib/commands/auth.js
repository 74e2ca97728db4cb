'use strict';
// SASL conversation commands; the SCRAM mathematics is in ../auth.js. Without --auth the
// double behaves like a mongod without users: authentication attempts fail.

const { err } = require('../errors');

async function saslStart(ctx) {
  if (!ctx.server.auth) throw err(18, 'Authentication failed.');
  return ctx.server.auth.start(ctx.conn, ctx.cmd, ctx.db);
}

async function saslContinue(ctx) {
  if (!ctx.server.auth) throw err(18, 'Authentication failed.');
  return ctx.server.auth.continue(ctx.conn, ctx.cmd);
}

// MONGODB-X509 (the only mechanism mongod still runs through `authenticate`): the user is the
// verified TLS client certificate's subject, in $external; any verified subject is a user.
function x509Login(conn, doc, db) {
  if (db !== '$external') throw err(18, 'X.509 authentication must always use the $external database.');
  if (!conn.peerSubject) throw err(18, 'No verified subject name available from client');
  if (doc.user !== undefined && doc.user !== conn.peerSubject) throw err(18, 'There is no x.509 client certificate matching the user.');
  conn.user = conn.peerSubject;
  conn.userDb = '$external';
  return { dbname: '$external', user: conn.peerSubject };
}

async function authenticate(ctx) {
  if (ctx.cmd.mechanism === 'MONGODB-X509') return { ...x509Login(ctx.conn, ctx.cmd, ctx.db), ok: 1 };
  throw err(18, 'Authentication failed.');
}

module.exports = { saslStart, saslContinue, authenticate, x509Login };
