'use strict';
// Cross-instance wake-up: an event published through one proxy reaches the webhook of another,
// dispatching proxy at once, not at its next poll. The dispatching proxy polls every 10 s here,
// so only its change stream on the deliveries ([dispatch] watch, on by default) can bring each
// event within the bound; with watch = false it waits for the poll.

const test = require('node:test');
const assert = require('node:assert/strict');
const { MongoClient } = require('mongodb');
const { startUpstream, uniqueDbName, clientUri, sleep } = require('../lib/proxy');
const { startSink } = require('./sink');
const { startDispatchProxy, publishThroughProxy, waitFor } = require('./helpers');

const POLL_MS = 10000;

async function run(t, watch, samples) {
  const up = await startUpstream();
  t.after(() => up.stop());
  const sink = await startSink({});
  t.after(() => sink.close());
  const st = sink.stats();
  const db = uniqueDbName(`wake_${watch}`);
  const handlers = [{ name: 'h', events: '*', kind: 'webhook', url: sink.url('/h') }];
  const dispatch = { poll_interval_ms: POLL_MS };
  if (!watch) dispatch.watch = 'false';
  const dispatcher = await startDispatchProxy({ upstream: up.uri, outbox: { database: db }, dispatch, handlers });
  const publisher = await startDispatchProxy({ upstream: up.uri, outbox: { database: db }, enabled: false, handlers });
  t.after(() => Promise.all([dispatcher.kill(), publisher.kill()]));
  const client = await new MongoClient(clientUri({ host: '127.0.0.1', port: publisher.port })).connect();
  t.after(() => client.close());
  if (watch) await waitFor(() => /watching \S+ for new deliveries/.test(dispatcher.log()), 20000, 'the change stream to open');
  else await sleep(1500);
  // The first poll runs at start-up; every event below comes after it.
  const lat = [];
  for (let i = 0; i < samples; i++) {
    const id = `wake-${watch}-${i}`;
    const t0 = Date.now();
    await publishThroughProxy(client, db, [{ id, type: 'wake.v1', payload: { i } }]);
    await waitFor(() => st.ok.has(id), POLL_MS * 3, `event ${id} at the sink`);
    lat.push(st.firstAt.get(id) - t0);
  }
  lat.sort((a, b) => a - b);
  return { lat, log: dispatcher.log(), stop: async () => [(await dispatcher.stop()).code, (await publisher.stop()).code] };
}

test('a commit through another proxy wakes the dispatching proxy at once (change stream on the deliveries)', { timeout: 120000 }, async (t) => {
  const { lat, stop } = await run(t, true, 10);
  t.diagnostic(`publish-to-webhook through another proxy, ms: ${lat.join(' ')} (poll_interval_ms ${POLL_MS})`);
  assert.ok(lat[lat.length - 1] < 2000, `every event well before the next poll: ${lat.join(' ')}`);
  assert.ok(lat[Math.floor(lat.length / 2)] < 500, `median ${lat[Math.floor(lat.length / 2)]} ms`);
  assert.deepEqual(await stop(), [0, 0]);
});

test('with [dispatch] watch = false, the dispatching proxy only polls', { timeout: 120000 }, async (t) => {
  const { lat, log, stop } = await run(t, false, 1);
  t.diagnostic(`publish-to-webhook through another proxy without the watch, ms: ${lat.join(' ')}`);
  assert.doesNotMatch(log, /watching \S+ for new deliveries/);
  assert.ok(lat[0] >= 2000, `picked up by the poll, not at once: ${lat.join(' ')}`);
  assert.deepEqual(await stop(), [0, 0]);
});
