// tests/install/manifests.test.js - the Kubernetes manifests of deploy/kubernetes/ against the
// code and the docs they rely on: the probes' paths are routes of the admin port, the container
// ports are the config table's default ports and the ConfigMap's listen ports, every key of the
// Secret is a file the pod mounts and a _file key of the configuration reads (a key of the
// config table), the preStop sleep fits before the drain in the grace period, and
// docs/deployment.md quotes each manifest verbatim.  Then the ConfigMap's configuration runs:
// the proxy reads it (its secret paths moved to a temporary folder with the Secret's values)
// against the server double, answers /healthz and /readyz to a probe that names the pod's
// address (as the kubelet does, with no token), and drains on SIGTERM with exit 0 and no
// sanitizer report (this file checks the proxy it starts itself: registerFinalChecks covers
// the proxies of startProxy, whose configuration is its own).
//
//   RELAYBUS_PROXY_BIN=$PWD/build/relaybus-proxy node --test tests/install/manifests.test.js
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { spawn } = require('node:child_process');
const yaml = require('js-yaml');
const {
  REPO, proxyBin, tmpDir, freePort, startDouble, within, sleep, assertNoSanitizerReports,
} = require('../integration/lib/proxy.js');

const DIR = path.join(REPO, 'deploy', 'kubernetes');
const files = fs.readdirSync(DIR).filter((f) => f.endsWith('.yaml')).sort();
const docs = Object.fromEntries(files.flatMap((f) =>
  yaml.loadAll(fs.readFileSync(path.join(DIR, f), 'utf8')).filter(Boolean).map((d) => [d.kind, d])));
const configC = fs.readFileSync(path.join(REPO, 'src', 'base', 'config.c'), 'utf8');

// parseIni TEXT: { section: { key: value } }, ';' comments dropped (the proxy's own syntax).
function parseIni(text) {
  const out = {};
  let cur = null;
  for (const raw of text.split('\n')) {
    const line = raw.replace(/(^|\s)[;#].*$/, '').trim();
    if (!line) continue;
    const m = /^\[([^\]]+)\]$/.exec(line);
    if (m) { cur = out[m[1]] = out[m[1]] || {}; continue; }
    const eq = line.indexOf('=');
    cur[line.slice(0, eq).trim()] = line.slice(eq + 1).trim();
  }
  return out;
}
// The default of a key of the config table: MACRO ("name", TYPE, "default", ...).
function tableDefault(macro, name) {
  const m = new RegExp(`\\b${macro} \\("${name}", \\w+, "([^"]*)"`).exec(configC);
  assert.ok(m, `${macro} ("${name}", ...) is in src/base/config.c's table`);
  return m[1];
}
const portOf = (hostPort) => Number(hostPort.slice(hostPort.lastIndexOf(':') + 1));

const deployment = docs.Deployment;
const pod = deployment.spec.template.spec;
const container = pod.containers[0];
const ini = docs.ConfigMap.data['relaybus-proxy.ini'];
const conf = parseIni(ini);
const containerPort = (name) => container.ports.find((p) => p.name === name).containerPort;
const probePort = (probe) => (typeof probe.httpGet.port === 'number' ? probe.httpGet.port : containerPort(probe.httpGet.port));

test('the manifests parse: a Deployment, a ConfigMap, a Secret, a PodDisruptionBudget and a Service', () => {
  for (const kind of ['Deployment', 'ConfigMap', 'Secret', 'PodDisruptionBudget', 'Service']) assert.ok(docs[kind], `${kind} in ${DIR}`);
  assert.equal(pod.securityContext.runAsNonRoot, true);
  assert.deepEqual(docs.PodDisruptionBudget.spec.selector.matchLabels, deployment.spec.selector.matchLabels);
  for (const [k, v] of Object.entries(deployment.spec.selector.matchLabels)) assert.equal(deployment.spec.template.metadata.labels[k], v);
});

test('the probes are /healthz and /readyz on the admin port, routes of src/admin/http.c and docs/admin.md', () => {
  const routes = fs.readFileSync(path.join(REPO, 'src', 'admin', 'http.c'), 'utf8');
  const admin = fs.readFileSync(path.join(REPO, 'docs', 'admin.md'), 'utf8');
  const adminPort = portOf(tableDefault('A', 'listen'));
  for (const [probe, p] of [[container.livenessProbe, '/healthz'], [container.readinessProbe, '/readyz']]) {
    assert.equal(probe.httpGet.path, p);
    assert.ok(routes.includes(`{"${p}", EVHTTP_REQ_GET, false,`), `${p} is a GET route without a token in src/admin/http.c`);
    assert.ok(admin.includes(`### \`GET ${p}\``), `docs/admin.md documents ${p}`);
    assert.equal(probePort(probe), adminPort, `${p} is probed on the admin port`);
  }
});

test('the container ports are the config table defaults and the ConfigMap listens on them', () => {
  const proxyPort = portOf(tableDefault('P', 'listen'));
  const adminPort = portOf(tableDefault('A', 'listen'));
  assert.equal(containerPort('mongodb'), proxyPort);
  assert.equal(containerPort('admin'), adminPort);
  assert.equal(conf.proxy.listen, `0.0.0.0:${proxyPort}`);
  assert.equal(conf.admin.listen, `0.0.0.0:${adminPort}`);
  // Off loopback, the admin port needs a token (docs/admin.md): from the Secret.
  assert.ok(conf.admin.token_file, '[admin] token_file is set');
});

test('the Service sends the tier\'s MongoDB port to the pods, and its connection string asks for load-balanced mode', () => {
  const svc = docs.Service;
  assert.deepEqual(svc.spec.selector, deployment.spec.selector.matchLabels, 'it selects the Deployment\'s pods');
  const port = svc.spec.ports.find((p) => p.name === 'mongodb');
  assert.equal(port.targetPort, 'mongodb', 'to the container\'s mongodb port, by name');
  assert.equal(port.port, containerPort('mongodb'));
  assert.equal(port.protocol, 'TCP');
  const text = fs.readFileSync(path.join(DIR, 'service.yaml'), 'utf8');
  const uri = `mongodb://${svc.metadata.name}.NAMESPACE.svc.cluster.local:${port.port}/shop?loadBalanced=true`;
  assert.ok(text.includes(uri), `service.yaml gives the connection string ${uri}`);
  assert.ok(fs.readFileSync(path.join(REPO, 'docs', 'deployment.md'), 'utf8').includes(uri), 'docs/deployment.md gives it too');
});

test("the Secret's keys are the files mounted and read by the configuration's _file keys", () => {
  const secretKeys = Object.keys(docs.Secret.stringData || docs.Secret.data).sort();
  const vol = pod.volumes.find((v) => v.secret && v.secret.secretName === docs.Secret.metadata.name);
  assert.ok(vol, 'the pod mounts the Secret');
  const mount = container.volumeMounts.find((m) => m.name === vol.name).mountPath;
  assert.deepEqual(vol.secret.items.map((i) => i.key).sort(), secretKeys);
  const mounted = vol.secret.items.map((i) => path.posix.join(mount, i.path)).sort();
  const fileKeys = [];
  for (const [section, keys] of Object.entries(conf)) {
    for (const [k, v] of Object.entries(keys)) {
      if (!k.endsWith('_file') || !v.startsWith(mount + '/')) continue;
      const macro = section === 'proxy' ? 'P_FILE' : section === 'admin' ? 'A_FILE' : 'H_FILE';
      assert.match(configC, new RegExp(`\\b${macro} \\("${k}",`), `[${section}] ${k} is a _file key of the config table`);
      fileKeys.push(v);
    }
  }
  assert.deepEqual(fileKeys.sort(), mounted);
  // The config folder holds the ConfigMap's file under the name the image runs.
  const cfgMount = container.volumeMounts.find((m) => m.name === pod.volumes.find((v) => v.configMap).name).mountPath;
  assert.deepEqual(container.args, ['-c', path.posix.join(cfgMount, 'relaybus-proxy.ini')]);
});

test('the preStop sleep is shorter than the drain timeout, and both fit in terminationGracePeriodSeconds', () => {
  const cmd = container.lifecycle.preStop.exec.command;
  assert.equal(cmd[0], 'sleep');
  const sleepS = Number(cmd[1]);
  const drainMs = Number(conf.proxy.drain_timeout_ms ?? tableDefault('P', 'drain_timeout_ms'));
  const grace = pod.terminationGracePeriodSeconds;
  assert.ok(sleepS > 0 && sleepS < grace, `preStop sleep ${sleepS} s < grace ${grace} s`);
  assert.ok(sleepS * 1000 < drainMs, `preStop sleep ${sleepS} s < drain_timeout_ms ${drainMs}`);
  assert.ok(sleepS + drainMs / 1000 < grace, `sleep + drain (${sleepS + drainMs / 1000} s) < grace ${grace} s`);
});

// Kubernetes quantities: "512Mi", "1Gi", "500M", "1073741824".
function bytesOf(q) {
  const m = /^(\d+)(Ki|Mi|Gi|K|M|G)?$/.exec(String(q));
  assert.ok(m, `a memory quantity: ${q}`);
  const unit = { Ki: 1024, Mi: 1024 ** 2, Gi: 1024 ** 3, K: 1e3, M: 1e6, G: 1e9 }[m[2]] || 1;
  return Number(m[1]) * unit;
}

test("the memory limit holds the proxy's bound: 12 MiB + 8.6 KiB x max_clients + max_buffered_bytes + 64 MiB", () => {
  const limit = bytesOf(container.resources.limits.memory);
  const maxClients = Number(conf.proxy.max_clients ?? tableDefault('P', 'max_clients'));
  const buffered = Number(conf.proxy.max_buffered_bytes ?? tableDefault('P', 'max_buffered_bytes'));
  const need = 12 * 1024 ** 2 + 8.6 * 1024 * maxClients + buffered + 64 * 1024 ** 2;
  assert.ok(need <= limit, `limits.memory ${container.resources.limits.memory} (${limit} bytes) < ${Math.ceil(need)} bytes: `
    + `the pod would be OOM-killed before max_buffered_bytes (${buffered}) starts the backpressure`);
  // The formula is in both manifests, where whoever changes one of the numbers reads it.
  assert.match(ini, /12 MiB \+ 8\.6 KiB x max_clients \+ max_buffered_bytes \+ 64 MiB/);
  assert.match(fs.readFileSync(path.join(DIR, 'deployment.yaml'), 'utf8'), /limits\.memory >= 12 MiB \+ 8\.6 KiB x max_clients/);
});

test('docs/deployment.md quotes every manifest verbatim', () => {
  const md = fs.readFileSync(path.join(REPO, 'docs', 'deployment.md'), 'utf8');
  for (const f of files) {
    assert.ok(md.includes('```yaml\n' + fs.readFileSync(path.join(DIR, f), 'utf8') + '```'), `deploy/kubernetes/${f} in docs/deployment.md`);
  }
});

test("the ConfigMap's configuration runs: probes answer the kubelet without a token, SIGTERM drains", async (t) => {
  const bin = proxyBin();
  if (!fs.existsSync(bin)) return t.skip(`no proxy binary at ${bin}`);
  const double = await startDouble();
  t.after(() => double.stop());
  const dir = tmpDir('relaybus-manifests-');
  const mount = '/run/secrets/relaybus-proxy';
  const secrets = { ...docs.Secret.stringData, upstream: double.uri };
  for (const [k, v] of Object.entries(secrets)) fs.writeFileSync(path.join(dir, k), v + '\n', { mode: 0o440 });
  const [pport, aport] = [await freePort(), await freePort()];
  const local = ini.split(mount).join(dir)
    .replace(/^listen = 0\.0\.0\.0:27018$/m, `listen = 127.0.0.1:${pport}`)
    .replace(/^listen = 0\.0\.0\.0:27118$/m, `listen = 127.0.0.1:${aport}`);
  fs.writeFileSync(path.join(dir, 'relaybus-proxy.ini'), local, { mode: 0o640 });
  const err = path.join(dir, 'proxy.stderr');
  const fd = fs.openSync(err, 'a');
  const child = spawn(bin, ['-c', path.join(dir, 'relaybus-proxy.ini')], { stdio: ['ignore', fd, fd] });
  fs.closeSync(fd);
  let exitInfo = null;
  const exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve((exitInfo = { code, signal }))));
  t.after(() => child.kill('SIGKILL'));
  // The kubelet names the pod's address and the port in Host, and sends no token.
  const probe = (p) => fetch(`http://127.0.0.1:${aport}${p}`, { headers: { Host: `10.244.1.7:${aport}` } })
    .then((r) => r.status).catch(() => 0);
  // Polled: the proxy announces neither state on a channel this test could wait on.
  const until = async (p, status, ms) => {
    for (const end = Date.now() + ms; Date.now() < end; await sleep(50)) {
      if ((await probe(p)) === status) return true;
      if (exitInfo) return false;
    }
    return false;
  };
  assert.ok(await until('/healthz', 200, 10000), `/healthz 200: ${fs.readFileSync(err, 'utf8')}`);
  assert.ok(await until('/readyz', 200, 15000), `/readyz 200: ${fs.readFileSync(err, 'utf8')}`);
  child.kill('SIGTERM');
  const st = await within(exited, 15000, null);
  assert.deepEqual(st, { code: 0, signal: null }, fs.readFileSync(err, 'utf8'));
  assertNoSanitizerReports(fs.readFileSync(err, 'utf8'));
});
