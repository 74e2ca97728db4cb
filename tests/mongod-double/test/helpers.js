'use strict';
// Test helpers: start/stop a double as a child process (exactly as other suites use it) and a
// minimal raw OP_MSG client built directly on `bson`, independent of lib/wire.js, so the wire
// tests check the double against our reading of the protocol rather than against itself.

const { spawn } = require('child_process');
const net = require('net');
const path = require('path');
const { BSON, UUID, Long } = require('bson');

const BIN = path.join(__dirname, '..', 'mongod-double');

function startDouble(args = []) {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [BIN, '--port', '0', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    const oneLine = args.includes('--standalone') || args.includes('--single-member');
    let out = '';
    let errText = '';
    child.stderr.on('data', (d) => { errText += d; });
    child.stdout.on('data', (d) => {
      out += d;
      // Line 1: the primary's (or standalone's) port; line 2: the secondary's, unless the
      // double runs as a standalone or a single member.
      const lines = out.split('\n').slice(0, -1);
      if (lines.length >= (oneLine ? 1 : 2) && !child.port) {
        child.port = Number(lines[0]);
        resolve({
          port: child.port,
          secondaryPort: oneLine ? null : Number(lines[1]),
          child,
          stderr: () => errText,
          uri: (extra = 'replicaSet=rs0') => `mongodb://127.0.0.1:${child.port}/?${extra}`,
          stop: () => new Promise((r) => {
            if (child.exitCode !== null) return r(child.exitCode);
            child.once('exit', (code) => r(code));
            child.kill('SIGTERM');
          }),
        });
      }
    });
    child.once('exit', (code) => { if (!child.port) reject(new Error(`double exited ${code}: ${errText}`)); });
  });
}

// A sharded double (--sharded): resolves once every mongos line and every `shardNN P S` line
// is out, with the mongos ports, the shards' member ports and a seed-list URI of the mongos.
function startSharded(args = []) {
  const at = (f, d) => (args.includes(f) ? Number(args[args.indexOf(f) + 1]) : d);
  const nMongos = at('--mongos', 2);
  const nShards = at('--shards', 2);
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [BIN, '--port', '0', '--sharded', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let errText = '';
    let done = false;
    child.stderr.on('data', (d) => { errText += d; });
    child.stdout.on('data', (d) => {
      out += d;
      const lines = out.split('\n').slice(0, -1);
      if (done || lines.length < nMongos + nShards) return;
      done = true;
      const mongos = lines.slice(0, nMongos).map(Number);
      const shards = lines.slice(nMongos, nMongos + nShards).map((l) => {
        const [name, p, s] = l.split(' ');
        return { name, port: Number(p), secondaryPort: Number(s) };
      });
      resolve({
        port: mongos[0], mongos, shards, child,
        stderr: () => errText,
        uri: (extra = '') => `mongodb://${mongos.map((p) => `127.0.0.1:${p}`).join(',')}/${extra ? `?${extra}` : ''}`,
        stop: () => new Promise((r) => {
          if (child.exitCode !== null) return r(child.exitCode);
          child.once('exit', (code) => r(code));
          child.kill('SIGTERM');
        }),
      });
    });
    child.once('exit', (code) => { if (!done) reject(new Error(`double exited ${code}: ${errText}`)); });
  });
}

let reqId = 100;

function opMsg(doc, { flags = 0, checksum = false, sequences = [] } = {}) {
  const parts = [];
  const fl = Buffer.alloc(4);
  fl.writeUInt32LE(flags | (checksum ? 1 : 0));
  parts.push(fl, Buffer.from([0]), BSON.serialize(doc));
  for (const s of sequences) {
    const docs = Buffer.concat(s.docs.map((d) => BSON.serialize(d)));
    const id = Buffer.from(s.id + '\0');
    const size = Buffer.alloc(4);
    size.writeInt32LE(4 + id.length + docs.length);
    parts.push(Buffer.from([1]), size, id, docs);
  }
  let body = Buffer.concat(parts);
  const total = 16 + body.length + (checksum ? 4 : 0);
  const h = Buffer.alloc(16);
  const id = ++reqId;
  h.writeInt32LE(total, 0);
  h.writeInt32LE(id, 4);
  h.writeInt32LE(0, 8);
  h.writeInt32LE(2013, 12);
  let msg = Buffer.concat([h, body]);
  if (checksum) {
    const c = Buffer.alloc(4);
    c.writeUInt32LE(crc32c(msg));
    msg = Buffer.concat([msg, c]);
  }
  return { id, msg };
}

function crc32c(buf) {
  let crc = 0xffffffff;
  for (const b of buf) {
    crc ^= b;
    for (let k = 0; k < 8; k++) crc = crc & 1 ? (crc >>> 1) ^ 0x82f63b78 : crc >>> 1;
  }
  return (crc ^ 0xffffffff) >>> 0;
}

// A raw connection collecting whole replies; `closed` resolves when the server hangs up.
function rawConnect(port) {
  return new Promise((resolve, reject) => {
    const sock = net.connect(port, '127.0.0.1');
    let buf = Buffer.alloc(0);
    const replies = [];
    const waiters = [];
    let closedResolve;
    const closed = new Promise((r) => { closedResolve = r; });
    sock.on('data', (d) => {
      buf = Buffer.concat([buf, d]);
      while (buf.length >= 4 && buf.length >= buf.readInt32LE(0)) {
        const len = buf.readInt32LE(0);
        const m = buf.subarray(0, len);
        buf = buf.subarray(len);
        const opCode = m.readInt32LE(12);
        const r = { responseTo: m.readInt32LE(8), opCode, raw: m };
        if (opCode === 2013) r.doc = BSON.deserialize(m.subarray(21), { promoteValues: false });
        else if (opCode === 1) r.doc = BSON.deserialize(m.subarray(36), { promoteValues: false });
        if (waiters.length) waiters.shift()(r);
        else replies.push(r);
      }
    });
    sock.on('close', () => {
      closedResolve(true);
      while (waiters.length) waiters.shift()(null);
    });
    sock.on('error', () => {});
    sock.on('connect', () => resolve({
      sock,
      closed,
      send(buf) { sock.write(buf); },
      next(timeoutMs = 3000) {
        if (replies.length) return Promise.resolve(replies.shift());
        return new Promise((r) => {
          const w = (x) => { clearTimeout(t); r(x); };
          // A timed-out waiter must not swallow a later reply.
          const t = setTimeout(() => { waiters.splice(waiters.indexOf(w), 1); r('timeout'); }, timeoutMs);
          waiters.push(w);
        });
      },
      async command(doc, opts) {
        const { msg } = opMsg(doc, opts);
        sock.write(msg);
        const r = await this.next();
        return r && r.doc;
      },
      close() { sock.destroy(); },
    }));
    sock.on('error', reject);
  });
}

const lsid = () => ({ id: new UUID() });
const L = (n) => Long.fromNumber(n);

module.exports = { startDouble, startSharded, rawConnect, opMsg, crc32c, lsid, L };
