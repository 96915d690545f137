// The other venues in the dashboard against a real `millrace serve` (its embedded simulator also
// speaks OKX, Bybit, Coinbase and Kraken) in Debian's Chromium:
// - the picker groups instruments by venue, each venue's instrument offering its chart, book, compare and trades;
// - the compare card of BTC/USDT shows every venue's book live (bid below ask, an exact mid, a
//   young age) with its upstream sync badge `synced`, and the venue books it started are synced
//   in the server (`/api/v1/ops/books`, checksums verified where the venue sends them);
// - a venue's book card syncs in the browser like any other;
// - the compare card shows each venue's last trade, and trades tapes (a venue's, Binance's) fill.
//
// Run alone: MILLRACE_BIN=target/debug/millrace node --test tests/browser/venues.test.mjs
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { outDir, serverAndBrowser } from './harness.mjs';

const VENUES = ['sim', 'sim-bybit', 'sim-coinbase', 'sim-kraken', 'sim-okx'];

test('the picker groups venues and the compare card shows every venue synced', { timeout: 120_000 }, async (t) => {
  const { base, browser } = await serverAndBrowser(t);
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  await page.goto(`${base}/?charts=&books=sim-kraken:spot:ETH/USDT&compare=BTC/USDT&tapes=sim-okx:spot:BTC/USDT,sim:spot:BTC/USDT`);

  // every venue's BTC/USDT row, live and synced upstream
  await page.waitForFunction((venues) => {
    const rows = [...document.querySelectorAll('.compare-card[data-symbol="BTC/USDT"] .compare-row')];
    return venues.every((v) => {
      const r = rows.find((r) => r.dataset.instrument === `${v}:spot:BTC/USDT`);
      return r && r.dataset.health === 'synced' && r.querySelector('.mid').textContent !== '—';
    });
  }, VENUES, { timeout: 60_000 });
  const rows = await page.$$eval('.compare-card .compare-row', (rs) => rs.map((r) => ({
    id: r.dataset.instrument,
    bid: r.querySelector('.bid').textContent,
    ask: r.querySelector('.ask').textContent,
    mid: r.querySelector('.mid').textContent,
    age: r.querySelector('.age').textContent,
  })));
  assert.deepEqual(rows.map((r) => r.id).sort(), VENUES.map((v) => `${v}:spot:BTC/USDT`).sort());
  for (const r of rows) {
    const bid = Number(r.bid.split(' × ')[0]);
    const ask = Number(r.ask.split(' × ')[0]);
    assert.ok(bid > 0 && ask > bid, `${r.id}: bid ${r.bid} below ask ${r.ask}`);
    assert.ok(Number(r.mid) > bid && Number(r.mid) < ask, `${r.id}: mid ${r.mid}`);
    assert.ok(parseFloat(r.age) < 5, `${r.id}: data ${r.age} old`);
  }
  // in the server: every venue book the card started is synced, the checksums verified
  const books = (await (await fetch(`${base}/api/v1/ops/books`)).json()).books;
  for (const v of ['sim-okx', 'sim-kraken']) {
    const b = books.find((b) => b.instrument === `${v}:spot:BTC/USDT`);
    assert.ok(b && b.health === 'synced' && b.verifications > 0 && b.drift === 0, `${v}: ${JSON.stringify(b)}`);
  }

  // the Kraken book card syncs in the browser
  await page.waitForSelector('.book-card[data-state="synced"]', { timeout: 30_000 });

  // every venue's last trade in the card, and the trades tapes fill (OKX's trades channel, Binance's aggTrade)
  await page.waitForFunction(() => [...document.querySelectorAll('.compare-card .compare-row .last')].every((c) => c.textContent !== '—'),
    null, { timeout: 30_000 });
  for (const id of ['sim-okx:spot:BTC/USDT', 'sim:spot:BTC/USDT']) {
    await page.waitForFunction((id) => document.querySelectorAll(`.tape-card[data-instrument="${id}"] .tape-row`).length >= 3, id, { timeout: 30_000 });
    const prices = await page.$$eval(`.tape-card[data-instrument="${id}"] .tape-row .price`, (ps) => ps.map((p) => Number(p.textContent)));
    assert.ok(prices.every((p) => p > 0), `${id}: tape prices ${prices}`);
  }
  const trades = await (await fetch(`${base}/api/v1/trades?instrument=${encodeURIComponent('sim-okx:spot:BTC/USDT')}&limit=3`)).json();
  assert.equal(trades.trades.length, 3, JSON.stringify(trades));

  // the picker: a heading per venue, and a venue's instrument has no chart
  await page.click('.picker-toggle');
  await page.fill('#instrument-search', 'btc/usdt');
  const groups = await page.$$eval('.picker-group', (gs) => gs.map((g) => g.dataset.venue));
  assert.deepEqual(groups, [...VENUES].sort());
  const okx = page.locator('.picker-item[data-instrument="sim-okx:spot:BTC/USDT"]');
  assert.equal(await okx.locator('button.open-chart').isDisabled(), false, 'a venue\'s candles are charted');
  assert.equal(await okx.locator('button.open-book').isDisabled(), false);
  await page.screenshot({ path: join(outDir, 'venues-compare.png') });
  assert.deepEqual(errors, [], 'no page errors');
});
