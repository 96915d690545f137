// Browser smoke test: a real `millrace serve` and Debian's Chromium driven by playwright-core.
//
// Builds nothing: scripts/test builds dist/ and the server first and passes the binary in
// MILLRACE_BIN. Run alone: MILLRACE_BIN=target/debug/millrace node --test tests/browser/smoke.test.mjs
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { freePort, launchBrowser, outDir, startServer, stopServer } from './harness.mjs';

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
