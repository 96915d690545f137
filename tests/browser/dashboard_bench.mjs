// Dashboard load tool (not a test): first paint and frame rate of the market view against a real
// `millrace serve`, in Debian's headless Chromium. Figures go to BENCHMARKS.md.
//
//   MILLRACE_BIN=target/release/millrace MILLRACE_STATIC_DIR=dist node tests/browser/dashboard_bench.mjs [loads]
//
// Per page load (a fresh browser context, so no cache): first contentful paint (the shell), and
// "first meaningful paint": the first animation frame in which a synced book's ladder and the
// chart's candles are both on screen. Then 10 s of streaming with 10 books and a chart: frames
// per second, frame-time percentiles, and JS crossings per widget per frame.
import { freePort, launchBrowser, startServer, stopServer } from './harness.mjs';

const loads = Number(process.argv[2] ?? 5);
const books = ['BTC', 'ETH', 'SOL', 'BNB', 'XRP', 'ADA', 'DOGE', 'LTC'].map((s) => `sim:spot:${s}/USDT`)
  .concat(['sim:stock:600000', 'sim:stock:000001']);

const port = await freePort();
const base = `http://127.0.0.1:${port}`;
const server = await startServer(port);
const browser = await launchBrowser();
const url = (n) => `${base}/?charts=${encodeURIComponent('sim:spot:BTC/USDT:1m')}&books=${encodeURIComponent(books.slice(0, n).join(','))}`;

// Records, from the first script on, the first frame where the condition holds.
const watch = () => {
  window.__meaningful = null;
  const check = () => {
    const book = document.querySelector('.book-card[data-state="synced"] .bid-row:not(.empty)');
    const chart = document.querySelector('.chart-panel[data-status="live"] .chart');
    if (book && chart?.__chart?.candles?.data().length > 0) {
      window.__meaningful = performance.now();
      return;
    }
    requestAnimationFrame(check);
  };
  requestAnimationFrame(check);
};

try {
  // let the server's jobs and books start before timing page loads
  await new Promise((ok) => setTimeout(ok, 3_000));
  const first = [];
  for (let i = 0; i < loads; i++) {
    const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
    const page = await context.newPage();
    await page.addInitScript(watch);
    await page.goto(url(1));
    await page.waitForFunction(() => window.__meaningful !== null, null, { timeout: 30_000 });
    const r = await page.evaluate(() => ({
      fcp: performance.getEntriesByName('first-contentful-paint')[0]?.startTime ?? null,
      meaningful: window.__meaningful,
    }));
    first.push(r);
    console.log(`load ${i + 1}: first contentful paint ${r.fcp?.toFixed(0)} ms, first meaningful paint ${r.meaningful.toFixed(0)} ms`);
    await context.close();
  }
  const sorted = first.map((r) => r.meaningful).sort((a, b) => a - b);
  console.log(`first meaningful paint over ${loads} loads: median ${sorted[Math.floor(sorted.length / 2)].toFixed(0)} ms, worst ${sorted.at(-1).toFixed(0)} ms`);

  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  await page.goto(url(books.length));
  await page.waitForFunction((n) => document.querySelectorAll('.book-card[data-state="synced"]').length === n, books.length, { timeout: 60_000 });
  await page.waitForTimeout(2_000);
  const m = await page.evaluate(() => window.__millrace.measure(10_000));
  console.log(`10 books + chart, 10 s: ${m.fps.toFixed(1)} fps, frame p50 ${m.p50FrameMs.toFixed(1)} ms, p99 ${m.p99FrameMs.toFixed(1)} ms, ` +
    `max ${m.maxFrameMs.toFixed(1)} ms; ${m.calls} crossings by ${m.widgets} widgets, at most ${m.maxCrossingsPerWidgetPerFrame} per widget per frame; ` +
    `layout shift ${m.layoutShift} (${m.layoutShifts} shifts)`);
} finally {
  await browser.close();
  await stopServer(server);
}
