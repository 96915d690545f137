// The dashboard's operations view against a real `millrace serve` (admin token set) in Debian's
// Chromium: jobs, shards and backfill show live; migrating a symbol from the view moves it to the
// chosen shard (checked in the page and through the REST API); the admin token is asked once, a
// wrong one is refused with the server's message and asked again; the hot-spot toggle speeds the
// simulator's symbol up; the auto-balance switch follows the server. Screenshot written to
// tests/browser/out/ops-1280x800.png.
//
// Run alone: MILLRACE_BIN=target/debug/millrace node --test tests/browser/ops.test.mjs
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { outDir, serverAndBrowser } from './harness.mjs';

const TOKEN = 'browser-test-admin-token';

async function shardOf(base, symbol) {
  const { engine } = await (await fetch(`${base}/api/v1/ops/shards`)).json();
  return { symbol: engine.symbols.find((s) => s.instrument === symbol), shards: engine.shards.map((s) => s.id) };
}

test('migrating a symbol from the operations view moves it to the chosen shard; the token is asked once', { timeout: 120_000 }, async (t) => {
  const { base, browser } = await serverAndBrowser(t, [], { MILLRACE_ADMIN_TOKEN: TOKEN });
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  await page.goto(`${base}/#ops`);

  // live data: jobs (the pinned candle jobs), shard bars, symbol rows, backfill
  await page.locator('tr.job-row[data-instrument="sim:spot:BTC/USDT"][data-kind="kline"]').waitFor({ timeout: 20_000 });
  await page.locator('.shard-bar[data-shard="0"]').waitFor({ timeout: 20_000 });
  await page.locator('.backfill-row').first().waitFor({ timeout: 20_000 });
  const symbol = 'sim:stock:600000';
  const row = page.locator(`tr.symbol-row[data-symbol="${symbol}"]`);
  await row.waitFor({ timeout: 20_000 });

  const before = await shardOf(base, symbol);
  const target = before.shards.find((s) => s !== before.symbol.shard);
  assert.notEqual(target, undefined, `a second shard exists (${before.shards})`);
  assert.equal((await row.locator('td.shard').textContent()).trim(), String(before.symbol.shard));

  // first action: the token is asked for; a wrong one is refused with the server's message
  await row.locator('select.migrate-target').selectOption(String(target));
  await row.locator('button.migrate').click();
  await page.locator('#token-form').waitFor({ state: 'visible' });
  await page.fill('#admin-token', 'not-the-token');
  await page.locator('#token-form button[type="submit"]').click();
  await page.locator('#ops-status').filter({ hasText: 'token refused' }).waitFor({ timeout: 10_000 });
  assert.match(await page.locator('#ops-status').textContent(), /Bearer|token/i, 'the server\'s message is shown');
  await page.locator('#token-form').waitFor({ state: 'visible' });
  assert.equal((await shardOf(base, symbol)).symbol.shard, before.symbol.shard, 'nothing moved with a wrong token');

  // the right token: the migration runs; the page and the API agree on the new shard
  await page.fill('#admin-token', TOKEN);
  await page.locator('#token-form button[type="submit"]').click();
  await row.locator('td.shard').filter({ hasText: new RegExp(`^\\s*${target}\\s*$`) }).waitFor({ timeout: 20_000 });
  assert.equal((await shardOf(base, symbol)).symbol.shard, target, 'the server moved it');
  await page.locator('#token-form').waitFor({ state: 'hidden' });

  // the token is not asked again: migrate back at once
  await row.locator('select.migrate-target').selectOption(String(before.symbol.shard));
  await row.locator('button.migrate').click();
  await row.locator('td.shard').filter({ hasText: new RegExp(`^\\s*${before.symbol.shard}\\s*$`) }).waitFor({ timeout: 20_000 });
  assert.ok(await page.locator('#token-form').isHidden(), 'no second prompt');
  assert.equal((await shardOf(base, symbol)).symbol.shard, before.symbol.shard);

  // auto-balance follows the server
  const auto = page.locator('#auto-balance');
  const wasOn = await auto.isChecked();
  await auto.click();
  await page.waitForFunction(async ([base, want]) => {
    const { engine } = await (await fetch(`${base}/api/v1/ops/shards`)).json();
    return engine.auto_balance === want;
  }, [base, !wasOn], { timeout: 10_000 });

  // a hot spot from the view: the simulator sends that symbol's orders much faster
  const hotSymbol = 'sim:stock:000001';
  const rate = async () => (await shardOf(base, hotSymbol)).symbol.processed_per_s;
  const calm = await rate();
  const hotRow = page.locator(`tr.symbol-row[data-symbol="${hotSymbol}"]`);
  await hotRow.locator('button.hotspot').click();
  await page.locator('#ops-status').filter({ hasText: `hot spot on ${hotSymbol}: ok` }).waitFor({ timeout: 10_000 });
  await page.waitForFunction(async ([base, sym, calm]) => {
    const { engine } = await (await fetch(`${base}/api/v1/ops/shards`)).json();
    return engine.symbols.find((s) => s.instrument === sym).processed_per_s > 10 * Math.max(calm, 1);
  }, [base, hotSymbol, calm], { timeout: 15_000, polling: 500 });
  // the toggle shows the simulator's state, as the server reports it
  await hotRow.locator('button.hotspot.active').filter({ hasText: '✓' }).waitFor({ timeout: 10_000 });
  // and the page shows it live
  await page.waitForFunction(([sel, calm]) => Number(document.querySelector(sel)?.textContent) > 10 * Math.max(calm, 1),
    [`tr.symbol-row[data-symbol="${hotSymbol}"] td.rate`, calm], { timeout: 10_000 });
  mkdirSync(outDir, { recursive: true });
  await page.screenshot({ path: join(outDir, 'ops-1280x800.png') });
  await hotRow.locator('button.hotspot').click();
  await page.locator('#ops-status').filter({ hasText: `hot spot off ${hotSymbol}: ok` }).waitFor({ timeout: 10_000 });
  await hotRow.locator('button.hotspot:not(.active)').waitFor({ timeout: 10_000 });
  assert.equal(await page.locator('button.hotspot.active').count(), 0, 'no hot spot left');
  assert.deepEqual(errors, [], 'no page errors');
});
