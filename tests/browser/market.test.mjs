// The dashboard's market view against a real `millrace serve` in Debian's Chromium:
// - the chart loads stored candles equal to /api/v1/klines, its forming candle moves with the
//   kline@ stream, and the timeframe buttons switch series; after a disconnect across a minute
//   boundary every candle is there once, with its stored values;
// - charts opened from the picker subscribe, and closing one unsubscribes: the job's refcount in
//   the operations view follows;
// - with 10 books and a chart streaming, every widget crosses into JS at most once per animation
//   frame and nothing shifts layout (frame rate and first paint are printed; BENCHMARKS.md has the measured figures);
// - a stream the server refuses (on-demand capacity 1) shows the server's message on its own
//   chart, holds back no other widget (the pinned book syncs, the connection is live), and is
//   asked for again until it is served once capacity frees;
// - screenshots of the market view at 1280x800 and narrow, written to tests/browser/out/.
//
// Run alone: MILLRACE_BIN=target/debug/millrace node --test tests/browser/market.test.mjs
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { outDir, serverAndBrowser } from './harness.mjs';

const BTC_1M = 'sim:spot:BTC/USDT:1m';

/** The chart library's own bars for the panel showing `series`. */
function chartBars(page, series) {
  return page.evaluate((series) => {
    const el = document.querySelector(`.chart-panel[data-series="${series}"] .chart`);
    return el?.__chart?.candles ? el.__chart.candles.data().map((b) => ({ ...b })) : [];
  }, series);
}

async function waitChartLive(page, series, minBars) {
  await page.waitForFunction(([series, minBars]) => {
    const panel = document.querySelector(`.chart-panel[data-series="${series}"]`);
    const el = panel?.querySelector('.chart');
    return panel?.dataset.status === 'live' && el?.__chart?.candles?.data().length >= minBars;
  }, [series, minBars], { timeout: 30_000 });
}

test('the chart shows the stored candles, its forming candle moves, and timeframes switch', { timeout: 120_000 }, async (t) => {
  const { base, browser } = await serverAndBrowser(t);
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  await page.goto(`${base}/?charts=${encodeURIComponent(BTC_1M)}&books=`);
  await waitChartLive(page, BTC_1M, 100);

  // every closed bar equals the stored candle of the same open time
  const bars = await chartBars(page, BTC_1M);
  const rows = await (await fetch(`${base}/api/v1/klines?series=${encodeURIComponent(BTC_1M)}&limit=1000`)).json();
  const stored = new Map(rows.map((r) => [r[0] / 1000, r]));
  const closed = bars.slice(0, -1).filter((b) => stored.has(b.time));
  assert.ok(closed.length >= 100, `${closed.length} chart bars have a stored candle`);
  for (const b of closed) {
    const r = stored.get(b.time);
    assert.deepEqual([b.open, b.high, b.low, b.close], r.slice(1, 5).map(Number), `bar at ${b.time}`);
  }
  for (let i = 1; i < bars.length; i++) assert.equal(bars[i].time - bars[i - 1].time, 60, 'one bar per minute, no gap, no duplicate');

  // the forming candle moves: the last bar changes while the stream runs
  const first = bars.at(-1);
  let moved = null;
  for (let i = 0; i < 150 && !moved; i++) {
    await page.waitForTimeout(100);
    const last = (await chartBars(page, BTC_1M)).at(-1);
    if (JSON.stringify(last) !== JSON.stringify(first)) moved = last;
  }
  assert.ok(moved, 'the forming candle changed within 15 s');
  assert.ok(moved.time >= first.time, 'and never went back in time');

  // 5m: the panel switches series and loads its history
  const panel = page.locator('.chart-panel').first();
  await panel.locator('button.tf[data-tf="5m"]').click();
  const btc5m = 'sim:spot:BTC/USDT:5m';
  await waitChartLive(page, btc5m, 10);
  const five = await chartBars(page, btc5m);
  assert.ok(five.every((b) => b.time % 300 === 0), '5m bars open on 5-minute boundaries');
  assert.deepEqual(errors, [], 'no page errors');
});

test('after a disconnect across a minute boundary the chart has every candle once, equal to the stored ones', { timeout: 240_000 }, async (t) => {
  const { base, browser } = await serverAndBrowser(t);
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  // the proxy in front of the page's /ws: closes the socket, and refuses new ones while blocked
  const net = { blocked: false, sockets: [] };
  await page.routeWebSocket(/\/ws$/, (ws) => {
    if (net.blocked) {
      ws.close({ code: 1013, reason: 'test: blocked' });
      return;
    }
    ws.connectToServer();
    net.sockets.push(ws);
  });
  await page.goto(`${base}/?charts=${encodeURIComponent(BTC_1M)}&books=`);
  await waitChartLive(page, BTC_1M, 100);

  // wait for a minute to open, then cut the feed until that minute's closed candle was stored
  // (and so published, to nobody on this page): the page never sees that close
  const lastOf = async () => (await chartBars(page, BTC_1M)).at(-1).time;
  const before = await lastOf();
  await page.waitForFunction(([series, t]) => {
    const el = document.querySelector(`.chart-panel[data-series="${series}"] .chart`);
    return el.__chart.candles.data().at(-1).time > t;
  }, [BTC_1M, before], { timeout: 90_000, polling: 100 });
  const lastTime = await lastOf();
  net.blocked = true;
  await net.sockets.at(-1).close({ code: 1012, reason: 'test: disconnect' });
  await page.locator(`.chart-panel[data-series="${BTC_1M}"][data-status="disconnected"]`).waitFor({ timeout: 5_000 });
  const storedRows = async () => (await fetch(`${base}/api/v1/klines?series=${encodeURIComponent(BTC_1M)}&limit=5`)).json();
  for (let i = 0; i < 450 && !(await storedRows()).some((r) => r[0] / 1000 === lastTime); i++) await page.waitForTimeout(200);
  await page.waitForTimeout(1_000);
  net.blocked = false;
  await waitChartLive(page, BTC_1M, 100);
  // let the history refetch land, then compare
  await page.waitForFunction(([series, t]) => {
    const el = document.querySelector(`.chart-panel[data-series="${series}"] .chart`);
    return el.__chart.candles.data().at(-1).time > t;
  }, [BTC_1M, lastTime], { timeout: 30_000 });
  await page.waitForTimeout(1_500);

  const bars = await chartBars(page, BTC_1M);
  for (let i = 1; i < bars.length; i++) assert.equal(bars[i].time - bars[i - 1].time, 60, `one bar per minute at ${bars[i].time}`);
  const rows = await (await fetch(`${base}/api/v1/klines?series=${encodeURIComponent(BTC_1M)}&limit=1000`)).json();
  const stored = new Map(rows.map((r) => [r[0] / 1000, r]));
  const missed = bars.find((b) => b.time === lastTime);
  assert.ok(stored.has(lastTime), 'the minute that closed during the disconnect is stored');
  assert.deepEqual([missed.open, missed.high, missed.low, missed.close], stored.get(lastTime).slice(1, 5).map(Number),
    'the chart shows its final values, not the forming ones from before the disconnect');
  for (const b of bars.slice(0, -1).filter((b) => stored.has(b.time))) {
    assert.deepEqual([b.open, b.high, b.low, b.close], stored.get(b.time).slice(1, 5).map(Number), `bar at ${b.time}`);
  }
});

test('opening two charts and closing one changes the job refcount in the operations view', { timeout: 120_000 }, async (t) => {
  const { base, browser } = await serverAndBrowser(t);
  const market = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  await market.goto(`${base}/?charts=&books=`);
  const ops = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  await ops.goto(`${base}/#ops`);
  const sol = 'sim:spot:SOL/USDT';
  const refcount = ops.locator(`tr.job-row[data-instrument="${sol}"][data-kind="kline"] td.refcount`);
  const expectRefcount = (n) => refcount.filter({ hasText: new RegExp(`^\\s*${n}\\s*$`) }).waitFor({ timeout: 20_000 });

  // open SOL/USDT twice from the picker; switch the second chart to 5m (a second stream)
  const openFromPicker = async () => {
    await market.fill('#instrument-search', 'sol');
    await market.locator(`.picker-item[data-instrument="${sol}"] button.open-chart`).click();
  };
  await openFromPicker();
  await waitChartLive(market, `${sol}:1m`, 1);
  await expectRefcount(1);
  await openFromPicker();
  const second = market.locator('.chart-panel').nth(1);
  await second.locator('button.tf[data-tf="5m"]').click();
  await waitChartLive(market, `${sol}:5m`, 1);
  await expectRefcount(2);

  // close the 1m chart: its stream is unsubscribed, the refcount drops, the 5m chart stays live
  await market.locator(`.chart-panel[data-series="${sol}:1m"] button.close`).click();
  await expectRefcount(1);
  assert.equal(await market.locator('.chart-panel').count(), 1);
  await waitChartLive(market, `${sol}:5m`, 1);
  const jobs = await (await fetch(`${base}/api/v1/ops/jobs`)).json();
  const job = jobs.jobs.find((j) => j.instrument === sol && j.kind === 'kline');
  assert.equal(job.refcount, 1, 'the server agrees');
});

const TEN_BOOKS = ['BTC', 'ETH', 'SOL', 'BNB', 'XRP', 'ADA', 'DOGE', 'LTC'].map((s) => `sim:spot:${s}/USDT`)
  .concat(['sim:stock:600000', 'sim:stock:000001']);

test('10 books and a chart stream with at most one JS crossing per widget per frame; screenshots', { timeout: 150_000 }, async (t) => {
  const { base, browser } = await serverAndBrowser(t);
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  const url = `${base}/?charts=${encodeURIComponent(BTC_1M)}&books=${encodeURIComponent(TEN_BOOKS.join(','))}`;
  await page.goto(url);
  await waitChartLive(page, BTC_1M, 100);
  await page.waitForFunction((n) => document.querySelectorAll('.book-card[data-state="synced"]').length === n, TEN_BOOKS.length, { timeout: 60_000 });

  const m = await page.evaluate(() => window.__millrace.measure(5_000));
  console.log(`10 books + chart: ${m.fps.toFixed(1)} fps, frame p50 ${m.p50FrameMs.toFixed(1)} ms, p99 ${m.p99FrameMs.toFixed(1)} ms, ` +
    `${m.calls} crossings by ${m.widgets} widgets, at most ${m.maxCrossingsPerWidgetPerFrame} per widget per frame, ` +
    `layout shift ${m.layoutShift} (${m.layoutShifts} shifts)`);
  assert.equal(m.widgets, 11, 'every book and the chart drew');
  assert.equal(m.maxCrossingsPerWidgetPerFrame, 1, 'one crossing per widget per frame at most');
  assert.equal(m.layoutShifts, 0, 'no layout shift while data streams');
  assert.deepEqual(errors, [], 'no page errors');

  mkdirSync(outDir, { recursive: true });
  await page.screenshot({ path: join(outDir, 'market-1280x800.png') });
  await page.setViewportSize({ width: 420, height: 900 });
  await page.waitForTimeout(500);
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 0, `no horizontal scrolling in a narrow window (${overflow}px too wide)`);
  await page.screenshot({ path: join(outDir, 'market-narrow.png') });
});

test('a refused chart shows the server\'s reason and holds back no other widget, and is served once capacity frees', { timeout: 120_000 }, async (t) => {
  const { base, browser } = await serverAndBrowser(t, [], { MILLRACE_INGEST__ONDEMAND_MAX_JOBS: '1' });
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  const charts = ['sim:spot:SOL/USDT:1m', 'sim:spot:XRP/USDT:1m', 'sim:spot:ADA/USDT:1m'];
  await page.goto(`${base}/?charts=${charts.map(encodeURIComponent).join(',')}&books=${encodeURIComponent('sim:spot:BTC/USDT')}`);

  // the pinned book syncs and the connection is live, whatever happens to the charts
  await page.waitForFunction(() => document.querySelector('.book-card[data-instrument="sim:spot:BTC/USDT"]')?.dataset.state === 'synced', null, { timeout: 30_000 });
  await page.waitForFunction(() => document.querySelector('#conn-status')?.textContent === 'live', null, { timeout: 10_000 });

  // one chart holds the only on-demand job; the other two say why they are empty
  const statuses = () => page.evaluate((charts) => charts.map((s) => document.querySelector(`.chart-panel[data-series="${s}"]`)?.dataset.status ?? ''), charts);
  await page.waitForFunction((charts) => {
    const st = charts.map((s) => document.querySelector(`.chart-panel[data-series="${s}"]`)?.dataset.status ?? '');
    return st.filter((x) => x === 'live').length === 1 && st.filter((x) => x.startsWith('refused: capacity_exhausted: ')).length === 2;
  }, charts, { timeout: 30_000 });
  const seen = await statuses();
  const text = await page.locator(`.chart-panel[data-series="${charts[seen.findIndex((x) => x !== 'live')]}"] .chart-status`).textContent();
  assert.match(text, /^refused: capacity_exhausted: .+\(retrying in \d+ s\)$/, 'the panel shows the server\'s code and message');

  // closing the served chart leaves its job idle: a refused chart's retry takes it over
  const served = charts[seen.indexOf('live')];
  await page.locator(`.chart-panel[data-series="${served}"] button.close`).click();
  await page.waitForFunction((charts) => charts.some((s) => document.querySelector(`.chart-panel[data-series="${s}"]`)?.dataset.status === 'live'), charts.filter((s) => s !== served), { timeout: 90_000 });
  assert.equal(await page.locator('.book-card[data-instrument="sim:spot:BTC/USDT"]').getAttribute('data-state'), 'synced', 'the book stayed synced');
  assert.deepEqual(errors, [], 'no page errors');
});
