// The dashboard's order books against a real `millrace serve` in Debian's Chromium: each book
// card syncs by itself (the shared sync machine compiled to wasm: REST snapshot + depth_update@
// deltas with checksums), says "synced", and its ladder's top 10 equal the server's REST book at
// the same update id, also after faults injected on the page's WebSocket (a dropped delta, a
// dropped connection) and after a server restart.
//
// Run alone: MILLRACE_BIN=target/debug/millrace node --test tests/browser/ladder.test.mjs
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { freePort, launchBrowser, outDir, serverAndBrowser, startServer, stopServer } from './harness.mjs';

const BOOKS = ['sim:spot:BTC/USDT', 'sim:stock:600000'];

/** Samples the page's ladders for `ms`: [{instrument, id, bids, asks}], top 10, best first. */
function samplePage(page, ms) {
  return page.evaluate(async (ms) => {
    const rows = (card, cls) => [...card.querySelectorAll(`.ladder .${cls}`)]
      .map((r) => [r.querySelector('.price').textContent, r.querySelector('.qty').textContent]);
    const out = [];
    const end = performance.now() + ms;
    while (performance.now() < end) {
      for (const card of document.querySelectorAll('.book-card')) {
        out.push({
          instrument: card.dataset.instrument,
          id: Number(card.dataset.updateId),
          badge: card.querySelector('.badge').textContent,
          bids: rows(card, 'bid-row:not(.empty)').slice(0, 10),
          asks: rows(card, 'ask-row:not(.empty)').reverse().slice(0, 10),
        });
      }
      await new Promise((ok) => setTimeout(ok, 5));
    }
    return out;
  }, ms);
}

/** Samples the server's REST books for `ms` alongside. */
async function sampleRest(base, ms) {
  const out = [];
  const end = Date.now() + ms;
  while (Date.now() < end) {
    for (const instrument of BOOKS) {
      const url = `${base}/fapi/v1/depth?symbol=${encodeURIComponent(instrument)}&with_id=true&limit=10`;
      const { data } = await (await fetch(url)).json();
      out.push({ instrument, id: data.id, bids: data.bids, asks: data.asks });
    }
  }
  return out;
}

/** Asserts that each book's ladder equals the REST book wherever both saw the same update id. */
async function assertLaddersEqualRest(page, base) {
  const [pageSamples, restSamples] = await Promise.all([samplePage(page, 4_000), sampleRest(base, 4_000)]);
  for (const instrument of BOOKS) {
    const shown = pageSamples.filter((s) => s.instrument === instrument);
    const rest = new Map(restSamples.filter((s) => s.instrument === instrument).map((s) => [s.id, s]));
    assert.ok(shown.every((s) => s.badge === 'synced'), `${instrument} stayed synced`);
    const ids = new Set(shown.map((s) => s.id));
    assert.ok(ids.size >= 5, `${instrument}: the page's book moved (${ids.size} update ids in 4 s)`);
    const common = shown.filter((s) => rest.has(s.id));
    assert.ok(common.length > 0, `${instrument}: no update id seen by both the page and REST`);
    for (const s of common) {
      const r = rest.get(s.id);
      assert.deepEqual(s.bids, r.bids, `${instrument} bids at ${s.id}`);
      assert.deepEqual(s.asks, r.asks, `${instrument} asks at ${s.id}`);
    }
    const checked = new Set(common.map((s) => s.id)).size;
    console.log(`${instrument}: ${ids.size} update ids shown, ${checked} compared with REST, all equal`);
  }
}

const card = (page, instrument) => page.locator(`.book-card[data-instrument="${instrument}"]`);

async function waitSynced(page) {
  for (const instrument of BOOKS) {
    await card(page, instrument).locator('.badge').filter({ hasText: /^synced$/ }).waitFor({ timeout: 30_000 });
    await card(page, instrument).locator('.ladder .bid-row:not(.empty)').first().waitFor({ timeout: 10_000 });
  }
}

test('book cards sync and their ladders equal the server book at the same update id', { timeout: 90_000 }, async (t) => {
  const { base, browser } = await serverAndBrowser(t);
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));

  try {
    await page.goto(`${base}/?books=${encodeURIComponent(BOOKS.join(','))}`);
    await waitSynced(page);
    await assertLaddersEqualRest(page, base);
    for (const instrument of BOOKS) {
      const mismatches = await card(page, instrument).locator('.mismatches').textContent();
      assert.equal(mismatches.trim(), '0', `${instrument}: no checksum mismatch`);
    }
    assert.deepEqual(errors, [], 'no page errors');
  } finally {
    mkdirSync(outDir, { recursive: true });
    await page.screenshot({ path: join(outDir, 'books.png') }).catch(() => {});
  }
});

test('after the server restarts, the books show the resync and sync again by themselves', { timeout: 90_000 }, async (t) => {
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  let server = await startServer(port);
  t.after(() => stopServer(server));
  const browser = await launchBrowser();
  t.after(() => browser.close());
  const page = await browser.newPage();
  await page.goto(`${base}/?books=${encodeURIComponent(BOOKS.join(','))}`);
  await waitSynced(page);

  await stopServer(server);
  for (const instrument of BOOKS) {
    await card(page, instrument).locator('.badge').filter({ hasText: 'resyncing' }).waitFor({ timeout: 10_000 });
  }
  server = await startServer(port);
  await waitSynced(page);
  for (const instrument of BOOKS) {
    const resyncs = Number((await card(page, instrument).locator('.resyncs').textContent()).trim());
    assert.ok(resyncs >= 1, `${instrument}: the badge counts the resync (${resyncs})`);
  }
  await assertLaddersEqualRest(page, base);
});

const counter = async (page, instrument, cls) => Number((await card(page, instrument).locator(`.${cls}`).textContent()).trim());

test('after faults on the socket (a lost delta, a dropped connection) the badge shows the resync and the ladders equal the server book again', { timeout: 120_000 }, async (t) => {
  const { base, browser } = await serverAndBrowser(t);
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });

  // Every /ws socket of the page goes through this proxy: the test can drop one server frame of
  // a stream (a gap for the page) or close the page's side (a disconnect).
  const faults = { dropNext: null, dropped: [], sockets: [] };
  await page.routeWebSocket(/\/ws$/, (ws) => {
    const upstream = ws.connectToServer();
    faults.sockets.push(ws);
    upstream.onMessage((m) => {
      if (faults.dropNext && typeof m === 'string' && m.includes(`"stream":"${faults.dropNext}"`)) {
        faults.dropped.push(JSON.parse(m).data.u);
        faults.dropNext = null;
        return;
      }
      ws.send(m);
    });
  });
  await page.goto(`${base}/?books=${encodeURIComponent(BOOKS.join(','))}`);
  await waitSynced(page);
  const [btc, stock] = BOOKS;

  // 1. a lost delta: the page sees U > last + 1
  const gapsBefore = await counter(page, btc, 'gaps');
  faults.dropNext = `depth_update@${btc}`;
  await page.waitForFunction(([sel, before]) => Number(document.querySelector(sel)?.textContent) > before,
    [`.book-card[data-instrument="${btc}"] .gaps`, gapsBefore], { timeout: 10_000 });
  assert.equal(faults.dropped.length, 1, 'one delta was dropped');
  await waitSynced(page);
  assert.ok(await counter(page, btc, 'resyncs') >= 1, 'the gap led to a resync, counted on the badge');
  await assertLaddersEqualRest(page, base);

  // 2. a dropped connection: every book resyncs on the new socket
  const resyncsBefore = await Promise.all(BOOKS.map((i) => counter(page, i, 'resyncs')));
  // every badge state drawn from now on (the resync may last only a few hundred milliseconds)
  await page.evaluate(() => {
    window.__badges = new Set();
    const note = () => document.querySelectorAll('.book-card').forEach((c) =>
      window.__badges.add(`${c.dataset.instrument}=${c.querySelector('.badge')?.textContent}`));
    new MutationObserver(note).observe(document.body, { subtree: true, childList: true, characterData: true, attributes: true });
  });
  const open = faults.sockets.length;
  await faults.sockets[open - 1].close({ code: 1012, reason: 'test: disconnect' });
  await page.waitForFunction((books) => books.every((i) => window.__badges.has(`${i}=resyncing`)), BOOKS, { timeout: 10_000 });
  await waitSynced(page);
  assert.ok(faults.sockets.length > open, 'the page reconnected by itself');
  const resyncsAfter = await Promise.all(BOOKS.map((i) => counter(page, i, 'resyncs')));
  BOOKS.forEach((i, k) => assert.ok(resyncsAfter[k] > resyncsBefore[k], `${i}: resync counted (${resyncsBefore[k]} -> ${resyncsAfter[k]})`));
  await assertLaddersEqualRest(page, base);
  assert.equal(await counter(page, stock, 'mismatches'), 0);
});

test('the snapshot-mode switch shows the depth@…,20 stream, and a silent feed is flagged stale', { timeout: 120_000 }, async (t) => {
  const { base, browser } = await serverAndBrowser(t);
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  const silence = { on: false };
  await page.routeWebSocket(/\/ws$/, (ws) => {
    const upstream = ws.connectToServer();
    upstream.onMessage((m) => { if (!silence.on) ws.send(m); });
  });
  const [btc] = BOOKS;
  await page.goto(`${base}/?books=${encodeURIComponent(btc)}`);
  await card(page, btc).locator('.badge').filter({ hasText: /^synced$/ }).waitFor({ timeout: 30_000 });
  // the feed's staleness is judged from heartbeats: wait for the first one
  await page.locator('#heartbeat-seq').filter({ hasText: /^\d+$/ }).waitFor({ timeout: 10_000 });

  // snapshot mode: the badge says so, and the book keeps moving from the snapshot stream
  await card(page, btc).locator('button.mode-switch').click();
  await card(page, btc).locator('.badge').filter({ hasText: 'snapshot mode' }).waitFor({ timeout: 10_000 });
  assert.equal(await card(page, btc).getAttribute('data-mode'), 'snapshot');
  const first = Number(await card(page, btc).getAttribute('data-update-id'));
  await page.waitForFunction(([sel, first]) => Number(document.querySelector(sel)?.dataset.updateId) > first,
    [`.book-card[data-instrument="${btc}"]`, first], { timeout: 10_000 });
  assert.equal(await card(page, btc).locator('.ladder .bid-row:not(.empty)').count(), 20, '20 bid levels from depth@…,20');
  const jobs = await (await fetch(`${base}/api/v1/ops/jobs`)).json();
  assert.ok(jobs.depth.jobs.some((j) => j.instrument === btc), 'the depth job serves the snapshot stream');

  // back to diffs: synced again
  await card(page, btc).locator('button.mode-switch').click();
  await card(page, btc).locator('.badge').filter({ hasText: /^synced$/ }).waitFor({ timeout: 30_000 });

  // the socket stays open but nothing arrives: the page says so instead of freezing silently
  silence.on = true;
  await page.locator('#feed-stale').filter({ hasText: /no data for \d+s/ }).waitFor({ timeout: 10_000 });
  await card(page, btc).locator('.stale-flag').filter({ hasText: /stale \d+s/ }).waitFor({ timeout: 10_000 });
  assert.ok(await card(page, btc).evaluate((el) => el.classList.contains('stale')));
  silence.on = false;
  await page.locator('#feed-stale').waitFor({ state: 'hidden', timeout: 10_000 });
  await card(page, btc).locator('.stale-flag').filter({ hasText: /^$/ }).waitFor({ state: 'attached', timeout: 10_000 });
});
