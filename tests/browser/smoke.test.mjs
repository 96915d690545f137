// Browser smoke test: a real `millrace serve` and Debian's Chromium driven by playwright-core.
//
// Builds nothing: scripts/test builds dist/ and the server first and passes the binary in
// MILLRACE_BIN. Run alone: MILLRACE_BIN=target/debug/millrace node --test tests/browser/smoke.test.mjs
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createServer } from 'node:net';
import { mkdirSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, '..', '..');
const outDir = join(here, 'out');
const bin = process.env.MILLRACE_BIN ? resolve(root, process.env.MILLRACE_BIN) : join(root, 'target', 'debug', 'millrace');
const staticDir = process.env.MILLRACE_STATIC_DIR ? resolve(root, process.env.MILLRACE_STATIC_DIR) : join(root, 'dist');
const chromiumPath = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';

/** A free TCP port on 127.0.0.1. */
function freePort() {
  return new Promise((ok, fail) => {
    const srv = createServer();
    srv.unref();
    srv.on('error', fail);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => ok(port));
    });
  });
}

/** Starts `millrace serve` and resolves once /healthz answers. */
async function startServer(port) {
  // A fresh data directory per server: the default (`data/` in the working directory) is for users.
  const dataDir = mkdtempSync(join(tmpdir(), 'millrace-smoke-'));
  const child = spawn(bin, ['serve', '--addr', `127.0.0.1:${port}`, '--static-dir', staticDir, '--data-dir', dataDir], {
    cwd: root,
    stdio: ['ignore', 'inherit', 'pipe'],
    env: { ...process.env, RUST_LOG: process.env.RUST_LOG ?? 'info' },
  });
  let log = '';
  child.stderr.on('data', (d) => { log += d; process.stderr.write(d); });
  const exited = new Promise((ok) => child.on('exit', (code) => ok(code)));
  const deadline = Date.now() + 15_000;
  for (;;) {
    const code = await Promise.race([exited, new Promise((ok) => setTimeout(() => ok('wait'), 100))]);
    if (code !== 'wait') throw new Error(`millrace exited with ${code} before serving:\n${log}`);
    try {
      const res = await fetch(`http://127.0.0.1:${port}/healthz`);
      if (res.ok) return { child, exited };
    } catch { /* not listening yet */ }
    if (Date.now() > deadline) {
      child.kill('SIGKILL');
      throw new Error(`millrace did not answer /healthz within 15 s:\n${log}`);
    }
  }
}

function launchBrowser() {
  return chromium.launch({
    executablePath: chromiumPath,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
}

/** Stops a server from startServer: SIGTERM, then SIGKILL after 5 s. */
async function stopServer(server) {
  if (server.child.exitCode !== null || server.child.signalCode !== null) return;
  server.child.kill('SIGTERM');
  const timer = setTimeout(() => server.child.kill('SIGKILL'), 5_000);
  await server.exited;
  clearTimeout(timer);
}

test('dashboard shows the server version and a live heartbeat', { timeout: 60_000 }, async (t) => {
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  const server = await startServer(port);
  t.after(() => stopServer(server));

  const { version } = await (await fetch(`${base}/api/v1/version`)).json();

  const browser = await launchBrowser();
  t.after(() => browser.close());
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });

  try {
    await page.goto(base + '/');
    await page.locator('#version').filter({ hasText: version }).waitFor({ timeout: 15_000 });
    assert.equal((await page.textContent('#version')).trim(), version);

    await page.locator('#conn-status').filter({ hasText: 'live' }).waitFor({ timeout: 15_000 });
    const seq = async () => Number((await page.textContent('#heartbeat-seq')).trim());
    await page.waitForFunction(() => /^\d+$/.test(document.querySelector('#heartbeat-seq')?.textContent.trim() ?? ''),
      null, { timeout: 15_000 });
    const first = await seq();
    await page.waitForTimeout(3_000);
    const later = await seq();
    assert.ok(later >= first + 2, `#heartbeat-seq went from ${first} to ${later} in 3 s`);
    assert.equal((await page.textContent('#conn-status')).trim(), 'live');
    assert.deepEqual(errors, [], 'no page errors');
  } finally {
    mkdirSync(outDir, { recursive: true });
    await page.screenshot({ path: join(outDir, 'dashboard.png') }).catch(() => {});
  }
});

test('dashboard reconnects after the server restarts', { timeout: 60_000 }, async (t) => {
  const port = await freePort();
  let server = await startServer(port);
  t.after(() => stopServer(server));
  const browser = await launchBrowser();
  t.after(() => browser.close());
  const page = await browser.newPage();
  await page.goto(`http://127.0.0.1:${port}/`);
  const status = page.locator('#conn-status');
  await status.filter({ hasText: 'live' }).waitFor({ timeout: 15_000 });

  await stopServer(server);
  await status.filter({ hasText: 'reconnecting' }).waitFor({ timeout: 10_000 });
  const lastBeforeRestart = await page.textContent('#heartbeat-time');

  server = await startServer(port);
  await status.filter({ hasText: 'live' }).waitFor({ timeout: 15_000 });
  // Heartbeats from the new server arrive.
  await page.waitForFunction((before) => document.querySelector('#heartbeat-time')?.textContent !== before,
    lastBeforeRestart, { timeout: 10_000 });
});
