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

async function authenticate() {
  throw err(18, 'Authentication failed.');
}

module.exports = { saslStart, saslContinue, authenticate };
