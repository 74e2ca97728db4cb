'use strict';
// The monitoring files that ship in etc/: the Prometheus rules pass `promtool check rules` and
// their unit tests (`promtool test rules`), the Grafana dashboard's queries parse as PromQL, and
// every relaybus_* metric name the rules, their tests and the dashboard use is one the proxy
// serves on GET /metrics (a misspelt or removed metric would leave an alert or panel silently
// empty).

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const { startUpstream, uniqueDbName, tmpDir } = require('../lib/proxy');
const { startAdminProxy, request, waitFor } = require('./helpers');

const ROOT = path.resolve(__dirname, '../../..');
const RULES = path.join(ROOT, 'etc/prometheus/relaybus-rules.yml');
const RULES_TEST = path.join(ROOT, 'etc/prometheus/relaybus-rules.test.yml');
const DASHBOARD = path.join(ROOT, 'etc/grafana/relaybus-dashboard.json');
const TOKEN = 'monitoring-token';
const HISTOGRAM_SUFFIXES = ['_bucket', '_sum', '_count'];

const havePromtool = () => spawnSync('promtool', ['--version'], { encoding: 'utf8' }).status === 0;
const SKIP = havePromtool() ? false : 'promtool not found (Debian package prometheus; scripts/test installs it)';

function promtool(args, cwd) {
  const r = spawnSync('promtool', args, { encoding: 'utf8', cwd });
  assert.equal(r.status, 0, `promtool ${args.join(' ')} failed:\n${r.stdout}\n${r.stderr}`);
  return r.stdout;
}

/** The PromQL expressions of the dashboard: panel targets (rows included) and query variables. */
function dashboardQueries(d) {
  const out = [];
  const walk = (panels) => {
    for (const p of panels || []) {
      for (const t of p.targets || []) if (t.expr) out.push({ where: `panel "${p.title}"`, expr: t.expr });
      walk(p.panels);
    }
  };
  walk(d.panels);
  for (const v of d.templating.list)
    if (v.type === 'query') out.push({ where: `variable ${v.name}`, expr: typeof v.query === 'string' ? v.query : v.query.query });
  return out;
}

/** relaybus_* names in a text (PromQL, YAML); names are lower case, alert names are not. */
const metricNames = (text) => new Set(text.match(/\brelaybus_[a-z0-9_]*[a-z0-9]\b/g) || []);

/** Names of `names` the exposition does not serve (a histogram family's _bucket/_sum/_count count as served). */
function unknownNames(names, exposition) {
  const families = new Map();
  const samples = new Set();
  for (const line of exposition.split('\n')) {
    let m;
    if ((m = /^# TYPE (\S+) (\S+)$/.exec(line))) families.set(m[1], m[2]);
    else if ((m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]/.exec(line))) samples.add(m[1]);
  }
  const served = (n) => families.has(n) || samples.has(n) ||
    HISTOGRAM_SUFFIXES.some((s) => n.endsWith(s) && families.get(n.slice(0, -s.length)) === 'histogram');
  return [...names].filter((n) => !served(n)).sort();
}

test('the alerting rules pass promtool check rules and their unit tests', { skip: SKIP }, () => {
  assert.match(promtool(['check', 'rules', RULES]), /SUCCESS: \d+ rules found/);
  assert.match(promtool(['test', 'rules', path.basename(RULES_TEST)], path.dirname(RULES_TEST)), /SUCCESS/);
  const rules = fs.readFileSync(RULES, 'utf8');
  for (const alert of ['RelaybusUpstreamDown', 'RelaybusBacklogOld', 'RelaybusDeadLettersGrowing',
    'RelaybusHandlerFailing', 'RelaybusPoisonedTransactions', 'RelaybusClientsNearMax']) {
    assert.match(rules, new RegExp(`alert: ${alert}\\n`), `${alert} in the rules`);
    assert.match(fs.readFileSync(RULES_TEST, 'utf8'), new RegExp(`alertname: ${alert}\\n`), `${alert} unit-tested`);
  }
});

test('the dashboard is a Grafana dashboard whose queries parse as PromQL', { skip: SKIP }, () => {
  const d = JSON.parse(fs.readFileSync(DASHBOARD, 'utf8'));
  assert.ok(d.schemaVersion >= 36, `schemaVersion ${d.schemaVersion}`);
  const dsVar = d.templating.list.find((v) => v.type === 'datasource');
  assert.ok(dsVar && dsVar.query === 'prometheus', 'a Prometheus datasource variable');
  const ids = new Set();
  const walk = (panels) => {
    for (const p of panels || []) {
      assert.ok(!ids.has(p.id), `panel id ${p.id} unique`);
      ids.add(p.id);
      if (p.type !== 'row') assert.equal(p.datasource.uid, `\${${dsVar.name}}`, `panel "${p.title}" uses the datasource variable`);
      walk(p.panels);
    }
  };
  walk(d.panels);
  const queries = dashboardQueries(d);
  assert.ok(queries.length >= 20, `${queries.length} queries`);
  // promtool parses each expression as a recording rule, Grafana's variables replaced by values.
  const dir = tmpDir('relaybus-monitoring-');
  const lines = ['groups:', '  - name: dashboard', '    rules:'];
  queries.forEach((q, i) => {
    const expr = q.expr.replace(/\$__rate_interval/g, '5m').replace(/\$instance/g, '.*');
    const promql = /^label_values\(([^,)]+)/.exec(expr);
    lines.push(`      - record: dashboard_query_${i}`, `        expr: ${JSON.stringify(promql ? promql[1].trim() : expr)}`);
  });
  fs.writeFileSync(path.join(dir, 'dashboard-queries.yml'), lines.join('\n') + '\n');
  assert.match(promtool(['check', 'rules', path.join(dir, 'dashboard-queries.yml')]), new RegExp(`SUCCESS: ${queries.length} rules found`));
});

test('every metric the rules and the dashboard use is served by the proxy', { timeout: 60000 }, async (t) => {
  const up = await startUpstream();
  t.after(() => up.stop());
  // One webhook handler, so that the per-handler families have samples too.
  const proxy = await startAdminProxy({
    upstream: up.uri, token: TOKEN, outbox: { database: uniqueDbName('monfiles') },
    handlers: [{ name: 'hook', events: '*', kind: 'webhook', url: 'http://127.0.0.1:9/h' }],
  });
  t.after(() => proxy.kill());
  let text = '';
  await waitFor(async () => {
    const r = await request(proxy.base, '/metrics', { token: TOKEN });
    text = r.text;
    return r.status === 200 && /^relaybus_store_up 1$/m.test(text) && /^# TYPE relaybus_outbox_backlog gauge$/m.test(text);
  }, 20000, 'the outbox gauges on /metrics');

  const sources = {
    [path.relative(ROOT, RULES)]: fs.readFileSync(RULES, 'utf8'),
    [path.relative(ROOT, RULES_TEST)]: fs.readFileSync(RULES_TEST, 'utf8'),
    [path.relative(ROOT, DASHBOARD)]: dashboardQueries(JSON.parse(fs.readFileSync(DASHBOARD, 'utf8'))).map((q) => q.expr).join('\n'),
  };
  for (const [file, src] of Object.entries(sources)) {
    const names = metricNames(src);
    assert.ok(names.size > 0, `${file} names metrics`);
    assert.deepEqual(unknownNames(names, text), [], `${file} uses metrics the proxy does not serve`);
  }
  // The check itself: a misspelt name, a histogram suffix on a gauge, and a suffix on a histogram.
  assert.deepEqual(unknownNames(metricNames('rate(relaybus_deliveries_complete_total[5m]) + relaybus_upstream_up'), text),
    ['relaybus_deliveries_complete_total']);
  assert.deepEqual(unknownNames(new Set(['relaybus_client_connections_bucket', 'relaybus_claim_latency_seconds_bucket']), text),
    ['relaybus_client_connections_bucket']);
  const r = await proxy.stop();
  assert.equal(r.code, 0);
});
