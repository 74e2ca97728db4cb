'use strict';
// A Kafka cluster for the broker tests.  Kafka has no Debian package, so the
// cluster is librdkafka's mock cluster run by tests/tools/kafka-mock (built
// by `make check` when librdkafka is found): its brokers listen on real TCP
// ports of 127.0.0.1, so the proxy and kafkajs connect to it as to Kafka.
// Start, each command and stop are bounded in time.  down() and up() make
// every broker refuse connections and serve again (the outage tests).
//
// KAFKA_BROKERS names an existing cluster instead (host:port,...): nothing is
// started, topics are created with kafkajs's admin client, and down/up are
// refused (the outage test skips then).

const fs = require('node:fs');
const path = require('node:path');
const readline = require('node:readline');
const { spawn } = require('node:child_process');
const { Kafka, logLevel } = require('kafkajs');
const { proxyBin, sleep, within } = require('./proxy');

const READY_MS = 10000;
const COMMAND_MS = 5000;
const STOP_MS = 5000;

// Next to the proxy under test (its build directory), else in build/ (an
// ASan build's proxy with the plain build's helper).
function kafkaMockBin() {
  if (process.env.KAFKA_MOCK_BIN) return process.env.KAFKA_MOCK_BIN;
  const near = path.join(path.dirname(proxyBin()), 'tests', 'tools', 'kafka-mock');
  const top = path.join(__dirname, '..', '..', '..', 'build', 'tests', 'tools', 'kafka-mock');
  return fs.existsSync(near) || !fs.existsSync(top) ? near : top;
}

/** A reason to skip when there is neither KAFKA_BROKERS nor the mock, or null. */
function kafkaSkipReason() {
  if (process.env.KAFKA_BROKERS) return null;
  if (!fs.existsSync(kafkaMockBin()))
    return `no ${kafkaMockBin()}: build it with \`make check\` (it needs librdkafka, Debian librdkafka-dev), or set KAFKA_BROKERS`;
  return null;
}

/** A kafkajs client of the cluster (the tests' independent implementation). */
function kafkaClient(brokers) {
  return new Kafka({ clientId: 'relaybus-tests', brokers: brokers.split(','), logLevel: logLevel.NOTHING, retry: { retries: 10 } });
}

/**
 * Starts the mock cluster (or names KAFKA_BROKERS).
 * @param {object} [o] {brokers: number of mock brokers, 1 to 9 (default 1)}
 * @returns {Promise<{brokers, external, createTopic(name, partitions), refuseTopic(name), down(), up(), close(), log()}>}
 */
async function startKafka(o = {}) {
  if (process.env.KAFKA_BROKERS) {
    const brokers = process.env.KAFKA_BROKERS;
    return {
      brokers, external: true, log: () => '',
      async createTopic(name, partitions) {
        const admin = kafkaClient(brokers).admin();
        await admin.connect();
        try { await admin.createTopics({ topics: [{ topic: name, numPartitions: partitions }], waitForLeaders: true }); } finally { await admin.disconnect(); }
      },
      // A real cluster creates no topic for the proxy's producer in the
      // test, which sets allow.auto.create.topics = false.
      async refuseTopic() {},
      async down() { throw new Error('KAFKA_BROKERS names an external cluster: it cannot be stopped'); },
      async up() { throw new Error('KAFKA_BROKERS names an external cluster: it cannot be stopped'); },
      async close() {},
    };
  }
  const child = spawn(kafkaMockBin(), ['--brokers', String(o.brokers || 1)], { stdio: ['pipe', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d) => { stderr += d; });
  const exited = new Promise((resolve) => child.once('exit', resolve));
  const onExit = () => { try { child.kill('SIGKILL'); } catch { /* gone */ } };
  process.on('exit', onExit);
  exited.then(() => process.removeListener('exit', onExit));
  const lines = readline.createInterface({ input: child.stdout });
  const waiting = [];
  const queued = [];
  lines.on('line', (l) => (waiting.length ? waiting.shift()(l) : queued.push(l)));
  const nextLine = (ms, what) => new Promise((resolve, reject) => {
    if (queued.length) return resolve(queued.shift());
    const timer = setTimeout(() => reject(new Error(`kafka-mock: no answer to ${what} within ${ms} ms\n${stderr}`)), ms);
    waiting.push((l) => { clearTimeout(timer); resolve(l); });
  });
  let brokers;
  try {
    brokers = await Promise.race([nextLine(READY_MS, 'start'), exited.then((c) => { throw new Error(`kafka-mock exited (${c}):\n${stderr}`); })]);
  } catch (e) {
    child.kill('SIGKILL');
    throw e;
  }
  const command = async (cmd) => {
    child.stdin.write(`${cmd}\n`);
    const answer = await nextLine(COMMAND_MS, cmd);
    if (!answer.startsWith('ok')) throw new Error(`kafka-mock: ${cmd}: ${answer}`);
  };
  return {
    brokers, external: false, log: () => stderr,
    createTopic: (name, partitions) => command(`create ${name} ${partitions}`),
    /** The topic stays unknown: the mock would create it for any producer. */
    refuseTopic: (name) => command(`refuse ${name}`),
    down: () => command('down'),
    up: () => command('up'),
    async close() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.stdin.end('quit\n');
      const done = await within(exited.then(() => true), STOP_MS, false);
      if (!done) { child.kill('SIGKILL'); await exited; }
    },
  };
}

/** Messages in a topic: the sum of its partitions' high watermarks. */
async function topicCount(brokers, topic) {
  const admin = kafkaClient(brokers).admin();
  await admin.connect();
  try {
    return (await admin.fetchTopicOffsets(topic)).reduce((n, p) => n + Number(p.high) - Number(p.low), 0);
  } finally {
    await admin.disconnect();
  }
}

/**
 * Reads every message of a topic from the beginning (a consumer group of
 * its own), in partition order: [{partition, offset, key, headers, body}].
 */
async function readTopic(brokers, topic, ms = 60000) {
  const total = await topicCount(brokers, topic);
  const consumer = kafkaClient(brokers).consumer({ groupId: `relaybus-tests-${process.pid}-${Date.now()}`, sessionTimeout: 10000 });
  await consumer.connect();
  const out = [];
  try {
    await consumer.subscribe({ topic, fromBeginning: true });
    let resolveAll;
    const all = new Promise((resolve) => { resolveAll = resolve; });
    if (total === 0) resolveAll();
    await consumer.run({
      eachMessage: async ({ partition, message }) => {
        const headers = {};
        for (const [k, v] of Object.entries(message.headers || {})) headers[k] = Buffer.isBuffer(v) ? v.toString('utf8') : String(v);
        out.push({ partition, offset: Number(message.offset), key: message.key ? message.key.toString('utf8') : null, headers, body: JSON.parse(message.value.toString('utf8')) });
        if (out.length >= total) resolveAll();
      },
    });
    const timedOut = await within(all.then(() => false), ms, true);
    if (timedOut) throw new Error(`the topic ${topic} gave ${out.length} of ${total} messages within ${ms} ms`);
  } finally {
    await consumer.disconnect();
  }
  return out;
}

module.exports = { startKafka, kafkaSkipReason, kafkaClient, topicCount, readTopic, kafkaMockBin };
