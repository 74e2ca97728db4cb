'use strict';
// A webhook sink for the dispatch tests: an HTTP server that records every
// request, verifies its Standard Webhooks signature, checks that each key's
// deliveries arrive one at a time and in sequence, and answers per a policy.
//
//   const sink = await startSink({ secret, fail: 0.2, delayMs: 0, answer400: (body) => bool });
//   sink.url('/hook-a') ... sink.stats() ... await sink.close();

const crypto = require('node:crypto');
const http = require('node:http');
const https = require('node:https');

function verifySignature(secret, id, ts, body, header) {
  if (!secret) return header === undefined;
  if (!header) return false;
  const key = Buffer.from(secret.replace(/^whsec_/, ''), 'base64');
  const expected = crypto.createHmac('sha256', key).update(`${id}.${ts}.${body}`).digest('base64');
  return header.split(' ').some((part) => {
    const [v, sig] = part.split(',');
    return v === 'v1' && sig && sig.length === expected.length &&
      crypto.timingSafeEqual(Buffer.from(sig), Buffer.from(expected));
  });
}

/**
 * @param {object} o
 * @param {string} [o.secret]   whsec_ secret to verify with
 * @param {number} [o.fail]     fraction of requests answered 500 (before any processing)
 * @param {number} [o.delayMs]  delay before answering
 * @param {(ev: object) => boolean} [o.answer400] events answered 400
 * @param {() => number} [o.rand] random source (default Math.random)
 * @param {{key: string, cert: string, ca?: string}} [o.tls] serve https with this key and certificate;
 *        with `ca`, a client certificate signed by it is required
 * @param {(ev: object, req) => ({status, headers?, body?}|'hang'|undefined)} [o.respond]
 *        chooses the answer (undefined: the default policy; 'hang': never answer)
 */
async function startSink(o = {}) {
  const rand = o.rand || Math.random;
  const st = {
    requests: 0,
    failed: 0,
    rejected400: 0,
    badSignatures: 0,
    ok: new Map(), // event id -> count of 2xx answers
    okOrder: [], // event ids in the order they were acknowledged
    seqViolations: [], // strings describing out-of-order or concurrent keyed deliveries
    concurrentKeys: 0,
    lastSeq: new Map(), // key -> last acknowledged sequence
    inFlightKeys: new Map(), // key -> count in flight
    deliveryIds: new Set(),
    rejectedIds: new Set(),
    firstAt: new Map(), // event id -> time of its first 2xx answer
    pendingNow: 0, // requests received and not answered yet
    custom: [], // answers chosen by o.respond: {id, path, at, status, attempt}
    attempts: [], // delivery.attempt of each 2xx answer
    connections: 0, // TCP connections accepted
    handshakes: 0, // TLS handshakes completed (full or resumed)
  };
  const handler = (req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks).toString('utf8');
      st.requests++;
      st.pendingNow++;
      res.on('finish', () => st.pendingNow--);
      const id = req.headers['webhook-id'];
      const ts = req.headers['webhook-timestamp'];
      if (!verifySignature(o.secret, id, ts, body, req.headers['webhook-signature'])) st.badSignatures++;
      let ev;
      try {
        ev = JSON.parse(body);
      } catch {
        res.writeHead(400).end('not json');
        return;
      }
      const key = ev.key;
      if (key !== undefined) {
        const n = (st.inFlightKeys.get(key) || 0) + 1;
        st.inFlightKeys.set(key, n);
        if (n > 1) {
          st.concurrentKeys++;
          st.seqViolations.push(`key ${key}: ${n} deliveries at once (seq ${ev.sequence})`);
        }
      }
      // A final answer (2xx, or a 400 that makes it dead) must follow the
      // key's previous final answer: a redelivery of the last one (a
      // duplicate) is fine; a gap or a step back is not.
      const checkSeq = () => {
        if (key === undefined) return;
        const last = st.lastSeq.get(key) || 0;
        const seq = Number(ev.sequence);
        if (seq !== last + 1 && seq !== last) st.seqViolations.push(`key ${key}: seq ${seq} after ${last}`);
        if (seq > last) st.lastSeq.set(key, seq);
      };
      const finish = () => {
        if (key !== undefined) st.inFlightKeys.set(key, st.inFlightKeys.get(key) - 1);
        const custom = o.respond && o.respond(ev, req);
        if (custom === 'hang') return; // never answers (a timeout for the proxy)
        if (custom) {
          st.custom.push({ id: ev.id, path: req.url, at: Date.now(), status: custom.status, attempt: ev.delivery && ev.delivery.attempt });
          if (custom.status >= 200 && custom.status < 300) {
            checkSeq();
            if (!st.ok.has(ev.id)) st.firstAt.set(ev.id, Date.now());
            st.ok.set(ev.id, (st.ok.get(ev.id) || 0) + 1);
          }
          res.writeHead(custom.status, custom.headers || { 'content-type': 'text/plain' }).end(custom.body || '');
          return;
        }
        if (o.answer400 && o.answer400(ev)) {
          checkSeq();
          st.rejected400++;
          st.rejectedIds.add(ev.id);
          res.writeHead(400, { 'content-type': 'text/plain' }).end(`rejected ${ev.id}`);
          return;
        }
        if (o.fail && rand() < o.fail) {
          st.failed++;
          res.writeHead(500, { 'content-type': 'text/plain' }).end('sink failure');
          return;
        }
        checkSeq();
        st.attempts.push(Number(ev.delivery && ev.delivery.attempt));
        if (!st.ok.has(ev.id)) st.firstAt.set(ev.id, Date.now());
        st.ok.set(ev.id, (st.ok.get(ev.id) || 0) + 1);
        st.okOrder.push(ev.id);
        st.deliveryIds.add(id);
        res.writeHead(204).end();
      };
      if (o.delayMs) setTimeout(finish, o.delayMs);
      else finish();
    });
  };
  const tlsOpts = o.tls && { key: o.tls.key, cert: o.tls.cert };
  if (o.tls && o.tls.ca) Object.assign(tlsOpts, { ca: o.tls.ca, requestCert: true, rejectUnauthorized: true });
  const server = o.tls ? https.createServer(tlsOpts, handler) : http.createServer(handler);
  server.on('connection', () => { st.connections++; });
  server.on('secureConnection', () => { st.handshakes++; });
  server.on('tlsClientError', (e) => { st.tlsErrors = (st.tlsErrors || 0) + 1; st.lastTlsError = e.message; });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  return {
    port,
    url: (p = '/', host = '127.0.0.1') => `${o.tls ? 'https' : 'http'}://${host}:${port}${p}`,
    stats: () => st,
    duplicates: () => [...st.ok.values()].reduce((a, n) => a + (n > 1 ? n - 1 : 0), 0),
    close: () => new Promise((resolve) => { server.closeAllConnections?.(); server.close(() => resolve()); }),
  };
}

module.exports = { startSink, verifySignature };
