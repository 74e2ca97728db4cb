'use strict';
// Server side of SCRAM-SHA-256 and SCRAM-SHA-1 (RFC 5802/7677 as MongoDB uses them) for the
// users given with --auth, who live in the `admin` database with root-like rights. Covers
// saslStart/saslContinue, skipEmptyExchange, speculativeAuthenticate and saslSupportedMechs.
// --auth may be given more than once: each user is another with the same rights.
// No roles, no x.509/LDAP/Kerberos, no SASLprep beyond NFKC normalisation.

const crypto = require('crypto');
const { Binary } = require('bson');
const { err } = require('./errors');

const MECHS = {
  'SCRAM-SHA-256': { hash: 'sha256', len: 32, iterations: 15000 },
  'SCRAM-SHA-1': { hash: 'sha1', len: 20, iterations: 10000 },
};

const hmac = (hash, key, data) => crypto.createHmac(hash, key).update(data).digest();
const H = (hash, data) => crypto.createHash(hash).update(data).digest();
const xor = (a, b) => Buffer.from(a.map((x, i) => x ^ b[i]));

function parseAttrs(s) {
  const out = {};
  for (const part of s.split(',')) {
    const i = part.indexOf('=');
    if (i > 0) out[part.slice(0, i)] = part.slice(i + 1);
  }
  return out;
}

function decodeName(n) { return n.replace(/=2C/g, ',').replace(/=3D/g, '='); }

class Auth {
  // users: [{ user, password }], one per --auth.
  constructor(users) {
    this.users = new Map();
    for (const { user, password } of users) this.users.set(user, Auth.keys(user, password));
  }

  static keys(user, password) {
    const creds = {};
    for (const [mech, p] of Object.entries(MECHS)) {
      const salt = crypto.randomBytes(mech === 'SCRAM-SHA-1' ? 16 : 28);
      const pw = mech === 'SCRAM-SHA-1'
        ? crypto.createHash('md5').update(`${user}:mongo:${password}`).digest('hex')
        : password.normalize('NFKC');
      const salted = crypto.pbkdf2Sync(pw, salt, p.iterations, p.len, p.hash);
      const clientKey = hmac(p.hash, salted, 'Client Key');
      creds[mech] = {
        salt, iterations: p.iterations, hash: p.hash,
        storedKey: H(p.hash, clientKey), serverKey: hmac(p.hash, salted, 'Server Key'),
      };
    }
    return creds;
  }

  supportedMechs(ns) {
    const [db, ...rest] = ns.split('.');
    if (db !== 'admin' || !this.users.has(rest.join('.'))) return null;
    return ['SCRAM-SHA-1', 'SCRAM-SHA-256'];
  }

  payloadString(p) {
    if (p && p._bsontype === 'Binary') return Buffer.from(p.buffer.subarray(0, p.position)).toString('utf8');
    if (typeof p === 'string') return p;
    return '';
  }

  failed() { return err(18, 'Authentication failed.'); }

  start(conn, cmd, db) {
    const mech = cmd.mechanism;
    if (!MECHS[mech]) {
      throw err(334, `Received authentication for mechanism ${mech} which is not enabled`);
    }
    const msg = this.payloadString(cmd.payload);
    const m = /^([ny]|p=[^,]*),([^,]*),(.*)$/.exec(msg);
    if (!m) throw err(17, 'Invalid SCRAM client-first message');
    const bare = m[3];
    const a = parseAttrs(bare);
    const user = decodeName(a.n || '');
    const conv = { mech, bare, clientNonce: a.r, user, db, step: 1,
      skipEmpty: !!(cmd.options && cmd.options.skipEmptyExchange) };
    // An unknown user gets a made-up salt, as mongod answers before it refuses the proof.
    const known = this.users.get(user);
    const c = known && db === 'admin' ? known[mech] : { salt: crypto.randomBytes(16), iterations: MECHS[mech].iterations };
    const nonce = a.r + crypto.randomBytes(24).toString('base64');
    conv.nonce = nonce;
    conv.serverFirst = `r=${nonce},s=${c.salt.toString('base64')},i=${c.iterations}`;
    conv.known = !!known && db === 'admin';
    conn.sasl = conv;
    return { conversationId: 1, done: false, payload: new Binary(Buffer.from(conv.serverFirst)), ok: 1 };
  }

  continue(conn, cmd) {
    const conv = conn.sasl;
    if (!conv) throw err(17, 'No SASL session state found');
    if (conv.step === 2) {
      // The empty final exchange of clients that did not ask to skip it.
      conn.sasl = null;
      this.finish(conn, conv);
      return { conversationId: 1, done: true, payload: new Binary(Buffer.alloc(0)), ok: 1 };
    }
    const msg = this.payloadString(cmd.payload);
    const pIdx = msg.lastIndexOf(',p=');
    if (pIdx < 0) {
      conn.sasl = null;
      throw this.failed();
    }
    const withoutProof = msg.slice(0, pIdx);
    const a = parseAttrs(msg);
    if (a.r !== conv.nonce || !conv.known) {
      conn.sasl = null;
      throw this.failed();
    }
    const c = this.users.get(conv.user)[conv.mech];
    const authMessage = `${conv.bare},${conv.serverFirst},${withoutProof}`;
    const clientSig = hmac(c.hash, c.storedKey, authMessage);
    const proof = Buffer.from(a.p, 'base64');
    if (proof.length !== clientSig.length || !H(c.hash, xor(proof, clientSig)).equals(c.storedKey)) {
      conn.sasl = null;
      throw this.failed();
    }
    const serverSig = hmac(c.hash, c.serverKey, authMessage).toString('base64');
    const payload = new Binary(Buffer.from(`v=${serverSig}`));
    if (conv.skipEmpty) {
      conn.sasl = null;
      this.finish(conn, conv);
      return { conversationId: 1, done: true, payload, ok: 1 };
    }
    conv.step = 2;
    return { conversationId: 1, done: false, payload, ok: 1 };
  }

  finish(conn, conv) {
    conn.user = conv.user;
    conn.userDb = conv.db;
  }

  // Answer to hello's speculativeAuthenticate (a saslStart document), or null to decline.
  speculative(conn, doc) {
    if (!doc || doc.saslStart === undefined) return null;
    try {
      const r = this.start(conn, doc, doc.db || 'admin');
      delete r.ok;
      return r;
    } catch (e) {
      return null;
    }
  }
}

module.exports = { Auth };
