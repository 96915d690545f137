// The dashboard's cluster card on a gateway of a real cluster, in Debian's Chromium: `millrace
// sim`, one supervisor, three workers and the gateway (`serve` with `[cluster] enabled`), on the
// machine's NATS (JetStream) and PostgreSQL (scripts/services starts them; MILLRACE_TEST_NATS /
// MILLRACE_TEST_PG point elsewhere), under a subject prefix and a database of the test's own.
// The card shows the leader and the three workers with the tasks they hold; after `kill -9` of
// one worker its row turns inactive and its tasks move to the others. Screenshot written to
// tests/browser/out/cluster-1280x800.png.
//
// Run alone: MILLRACE_BIN=target/debug/millrace node --test tests/browser/cluster.test.mjs
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { bin, freePort, launchBrowser, outDir, root, startServer, stopServer } from './harness.mjs';

const pgAdmin = process.env.MILLRACE_TEST_PG ?? 'postgres://postgres:postgres@127.0.0.1:5432/postgres';
const nats = process.env.MILLRACE_TEST_NATS ?? 'nats://127.0.0.1:4222';

function psql(sql) {
  execFileSync('psql', [pgAdmin, '-v', 'ON_ERROR_STOP=1', '-qc', sql], { stdio: ['ignore', 'ignore', 'inherit'] });
}

function child(t, args) {
  const p = spawn(bin, args, { cwd: root, stdio: ['ignore', 'ignore', 'inherit'], env: { ...process.env, RUST_LOG: 'warn' } });
  t.after(() => { if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL'); });
  return p;
}

async function cluster(base) {
  const res = await fetch(`${base}/api/v1/ops/cluster`);
  return res.ok ? res.json() : null;
}

test('the cluster card shows the workers, then a killed worker inactive and its tasks moved', { timeout: 120_000 }, async (t) => {
  const db = `millrace_browser_${process.pid}`;
  psql(`DROP DATABASE IF EXISTS ${db} WITH (FORCE)`);
  psql(`CREATE DATABASE ${db}`);
  t.after(() => psql(`DROP DATABASE IF EXISTS ${db} WITH (FORCE)`));
  const dir = mkdtempSync(join(tmpdir(), 'millrace-cluster-browser-'));
  const simPort = await freePort();
  child(t, ['sim', '--addr', `127.0.0.1:${simPort}`, '--speed', '60']);
  const config = join(dir, 'cluster.toml');
  writeFileSync(config, `
[bus]
kind = "nats"
url = "${nats}"
prefix = "tb${process.pid}"

[store]
kind = "postgres"
url = "${pgAdmin.replace(/\/[^/]*$/, `/${db}`)}"

[cluster]
enabled = true
warmup_s = 1
tick_ms = 200
status_interval_ms = 200
worker_timeout_s = 2
redundancy = 2
instruments = ["sim:spot:BTC/USDT", "sim:spot:ETH/USDT"]
kinds = ["kline"]

[ingest]
pinned = []

[depth]
pinned = []

[[sources]]
name = "sim"
kind = "sim"
rest_base = "http://127.0.0.1:${simPort}"
ws_base = "ws://127.0.0.1:${simPort}"
`);
  // the simulator answers before the roles start
  for (let i = 0; i < 100; i++) {
    try { if ((await fetch(`http://127.0.0.1:${simPort}/api/v3/time`)).ok) break; } catch { /* starting */ }
    await new Promise((ok) => setTimeout(ok, 100));
  }
  child(t, ['supervisor', '--config', config, '--id', 'sup1']);
  const workers = {};
  for (const id of ['w1', 'w2', 'w3']) workers[id] = child(t, ['worker', '--config', config, '--id', id, '--max-load', '10']);
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  const server = await startServer(port, ['--config', config]);
  t.after(() => stopServer(server));
  const browser = await launchBrowser();
  t.after(() => browser.close());
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  await page.goto(`${base}/#ops`);

  // the three workers, active; every task on two of them
  const card = page.locator('#cluster-card');
  await card.waitFor({ state: 'visible', timeout: 30_000 });
  for (const id of Object.keys(workers)) {
    await card.locator(`tr.worker-row[data-worker="${id}"] td.state`).filter({ hasText: /^\s*active\s*$/ }).waitFor({ timeout: 30_000 });
  }
  const tasks = ['kline:sim:spot:BTC/USDT', 'kline:sim:spot:ETH/USDT'];
  const holders = async (task) => (await card.locator(`tr.task-row[data-task="${task}"] td.holders`).textContent()).split(',').map((s) => s.trim()).filter(Boolean);
  for (const task of tasks) {
    await card.locator(`tr.task-row[data-task="${task}"] td.holders`).filter({ hasText: /,/ }).waitFor({ timeout: 30_000 });
  }
  assert.match(await card.locator('p.supervisor').textContent(), /leader sup1 · running/);

  // kill -9 a worker that holds BTC: inactive, and its tasks on the two others
  const victim = (await holders(tasks[0]))[0];
  workers[victim].kill('SIGKILL');
  await card.locator(`tr.worker-row[data-worker="${victim}"] td.state`).filter({ hasText: /^\s*inactive\s*$/ }).waitFor({ timeout: 20_000 });
  for (const task of tasks) {
    await page.waitForFunction(([sel, gone]) => {
      const text = document.querySelector(sel)?.textContent ?? '';
      const ids = text.split(',').map((s) => s.trim()).filter(Boolean);
      return ids.length === 2 && !ids.includes(gone);
    }, [`#cluster-card tr.task-row[data-task="${task}"] td.holders`, victim], { timeout: 20_000 });
  }
  const report = await cluster(base);
  assert.ok(report.workers.some((w) => w.id === victim && !w.active), 'the API agrees: inactive');
  assert.ok(report.tasks.every((task) => !task.workers.includes(victim)), 'the API agrees: moved');
  assert.ok((await card.locator('li.event').count()) > 0, 'assignment events are listed');
  assert.match(await card.locator('li.event').first().textContent(), /timed out/);

  mkdirSync(outDir, { recursive: true });
  await page.screenshot({ path: join(outDir, 'cluster-1280x800.png'), fullPage: true });
  assert.deepEqual(errors, [], 'no page errors');
});
