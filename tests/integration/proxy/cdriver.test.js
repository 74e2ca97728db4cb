'use strict';
// mongo-c-driver through the proxy: tests/integration/cdriver/cdriver-client.c (CRUD, a
// multi-batch cursor, with_transaction) compiled against libmongoc and run through the proxy
// plain and with compressors=zlib, zstd and snappy. A TCP tap between the C client and the proxy
// shows that the compressor was negotiated: libmongoc compresses its requests only with a
// compressor the handshake reply listed.

const test = require('node:test');
const assert = require('node:assert/strict');
const H = require('../lib/proxy');

const NEVER_COMPRESSED = ['hello', 'ismaster', 'isMaster', 'saslStart', 'saslContinue', 'getnonce', 'authenticate', 'createUser', 'updateUser'];

let upstream;
let proxy;
let bin;

test.before(async () => {
  bin = H.buildCdriverClient();
  upstream = await H.startUpstream();
  proxy = await H.startProxy({ upstream: upstream.uri, settings: { compressors: 'zlib,zstd,snappy' } });
});

for (const compressor of [null, 'zlib', 'zstd', 'snappy']) {
  test(`mongo-c-driver through the proxy: ${compressor ? 'compressors=' + compressor : 'plain'}`, async () => {
    const tap = await H.startTap(proxy.port);
    const db = H.uniqueDbName(`cdrv_${compressor || 'plain'}`);
    const params = compressor ? { compressors: compressor } : {};
    const uri = proxy.uri(params).replace(`:${proxy.port}/`, `:${tap.port}/`);
    let r;
    try {
      r = await H.runCdriverClient(bin, uri, db);
    } finally {
      await tap.stop();
    }
    assert.equal(r.code, 0, `cdriver-client failed:\n${r.stdout}\n${r.stderr}`);
    assert.match(r.stdout, /^ok all/m);
    assert.match(r.stdout, /^ok transaction/m);
    assert.match(r.stdout, /^ok cursor/m);

    // What crossed the wire.
    let compressedRequests = 0;
    let helloChecked = 0;
    for (const rec of tap.conns) {
      if (!rec.toServer.length) continue;
      const first = rec.toServer[0];
      assert.ok(first.doc && H.isHelloDoc(first.doc), 'the first message on each connection is a hello');
      const offered = first.doc.compression || [];
      assert.deepEqual(offered, compressor ? [compressor] : [], 'what libmongoc offered');
      const reply = rec.toClient.find((m) => m.responseTo === first.requestID);
      assert.ok(reply, 'the handshake was answered');
      if (reply.doc) {
        helloChecked += 1;
        assert.equal(reply.doc.msg, 'isdbgrid');
        assert.deepEqual(reply.doc.compression || [], compressor ? [compressor] : [], 'the handshake reply names the compressor');
      }
      for (const m of rec.toServer.slice(1)) {
        if (m.opCode === H.OP_COMPRESSED) {
          assert.ok(compressor, 'nothing is compressed without compressors=');
          assert.equal(m.compressorId, H.COMPRESSOR_IDS[compressor], `requests use ${compressor}`);
          compressedRequests += 1;
        } else if (compressor && m.doc) {
          const cmd = Object.keys(m.doc)[0];
          assert.ok(NEVER_COMPRESSED.includes(cmd), `request ${cmd} was not compressed although ${compressor} was negotiated`);
        }
      }
      for (const m of rec.toClient) {
        if (m.opCode === H.OP_COMPRESSED) {
          assert.ok(compressor, 'no compressed reply without compressors=');
          assert.equal(m.compressorId, H.COMPRESSOR_IDS[compressor], 'replies use the negotiated compressor');
        }
      }
    }
    assert.ok(helloChecked >= 1, 'at least one handshake reply was readable');
    if (compressor) assert.ok(compressedRequests >= 10, `libmongoc compressed its requests (${compressedRequests})`);
    else assert.equal(compressedRequests, 0);
  });
}

H.registerFinalChecks(test, [() => upstream && upstream.stop()]);
