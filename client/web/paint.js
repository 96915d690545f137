// The dashboard's drawing glue. The wasm side decides what to show (all market logic is Rust);
// these functions put it on screen. Each streaming widget calls into this module at most once per
// animation frame (client/src/paint.rs schedules the calls), so a busy page costs one JS crossing
// per widget per frame. `window.__millrace.measure(ms)` reports frames and crossings for tests.

const stats = { frame: 0, measuring: false, counts: new Map(), maxPerFrame: 0, calls: 0 };

function crossing(key) {
  if (!stats.measuring) return;
  stats.calls += 1;
  const k = key + '@' + stats.frame;
  const n = (stats.counts.get(k) ?? 0) + 1;
  stats.counts.set(k, n);
  if (n > stats.maxPerFrame) stats.maxPerFrame = n;
}

/** Frames, frame times and crossings over `ms` milliseconds of the live page. */
function measure(ms) {
  return new Promise((resolve) => {
    stats.counts.clear();
    stats.maxPerFrame = 0;
    stats.calls = 0;
    stats.measuring = true;
    // layout shifts while measuring (content moving under the reader, without user input)
    let shift = 0;
    let shifts = 0;
    let observer = null;
    if (PerformanceObserver.supportedEntryTypes?.includes('layout-shift')) {
      observer = new PerformanceObserver((list) => {
        for (const e of list.getEntries()) {
          if (!e.hadRecentInput) {
            shift += e.value;
            shifts += 1;
          }
        }
      });
      observer.observe({ type: 'layout-shift' });
    }
    const times = [];
    const start = performance.now();
    const tick = (t) => {
      stats.frame += 1;
      times.push(t);
      if (t - start < ms) {
        requestAnimationFrame(tick);
        return;
      }
      stats.measuring = false;
      if (observer) {
        for (const e of observer.takeRecords()) if (!e.hadRecentInput) { shift += e.value; shifts += 1; }
        observer.disconnect();
      }
      const gaps = times.slice(1).map((x, i) => x - times[i]).sort((a, b) => a - b);
      const widgets = new Set([...stats.counts.keys()].map((k) => k.split('@')[0]));
      resolve({
        frames: times.length,
        fps: (times.length - 1) * 1000 / (times[times.length - 1] - times[0]),
        p50FrameMs: gaps[Math.floor(gaps.length * 0.5)],
        p99FrameMs: gaps[Math.floor(gaps.length * 0.99)],
        maxFrameMs: gaps[gaps.length - 1],
        calls: stats.calls,
        widgets: widgets.size,
        maxCrossingsPerWidgetPerFrame: stats.maxPerFrame,
        layoutShift: observer ? shift : null,
        layoutShifts: observer ? shifts : null,
      });
    };
    requestAnimationFrame(tick);
  });
}

globalThis.__millrace = Object.assign(globalThis.__millrace ?? {}, { measure });

// --- order book card --------------------------------------------------------------------------

const LADDER_HEAD = '<div class="row head muted"><span class="price">price</span><span class="qty">qty</span><span class="cum">total</span></div>';

function ladderRow(cls) {
  const row = document.createElement('div');
  row.className = 'row ' + cls;
  row.innerHTML = '<span class="bar"></span><span class="price mono"></span><span class="qty mono"></span><span class="cum mono"></span>';
  return row;
}

function buildBook(el, levels) {
  el.innerHTML =
    '<div class="badge-line"><span class="pill badge"></span> <span class="stale-flag"></span>' +
    '<span class="muted detail">gaps <span class="gaps mono"></span> · resyncs <span class="resyncs mono"></span>' +
    ' · checksum mismatches <span class="mismatches mono"></span></span></div>' +
    '<div class="ladder">' + LADDER_HEAD + '</div>';
  const ladder = el.querySelector('.ladder');
  const asks = [];
  const bids = [];
  for (let i = 0; i < levels; i++) asks.push(ladder.appendChild(ladderRow('ask-row')));
  const middle = document.createElement('div');
  middle.className = 'row middle';
  middle.innerHTML = '<span class="muted">spread </span><span class="spread mono"></span><span class="muted"> mid </span><span class="mid mono"></span>';
  ladder.appendChild(middle);
  for (let i = 0; i < levels; i++) bids.push(ladder.appendChild(ladderRow('bid-row')));
  asks.reverse(); // asks[0] is the best ask, right above the middle row
  el.__book = {
    levels, asks, bids, card: el.closest('[data-widget]') ?? el,
    badge: el.querySelector('.badge'), stale: el.querySelector('.stale-flag'),
    gaps: el.querySelector('.gaps'), resyncs: el.querySelector('.resyncs'), mismatches: el.querySelector('.mismatches'),
    spread: middle.querySelector('.spread'), mid: middle.querySelector('.mid'),
  };
  return el.__book;
}

function fillRow(row, f, at) {
  // f: price, qty, cumulative, bar scale; an absent level keeps its row's height (no layout jump)
  const cells = row.children;
  if (at === undefined) {
    row.classList.add('empty');
    cells[1].textContent = cells[2].textContent = cells[3].textContent = '';
    cells[0].style.transform = 'scaleX(0)';
    return;
  }
  row.classList.remove('empty');
  cells[1].textContent = f[at];
  cells[2].textContent = f[at + 1];
  cells[3].textContent = f[at + 2];
  cells[0].style.transform = 'scaleX(' + f[at + 3] + ')';
}

/**
 * Draws a book card body in `el`, inside the card (`[data-widget]`) whose `data-update-id` and
 * `data-state` it sets. `text` is tab-separated:
 * state, css state, update id, gaps, resyncs, mismatches, stale label, spread, mid, asks count,
 * bids count, then 4 fields per ask (best first) and per bid (best first): price, qty,
 * cumulative, bar scale (0…1).
 */
export function paint_book(el, levels, text) {
  const b = el.__book && el.__book.levels === levels ? el.__book : buildBook(el, levels);
  const card = b.card;
  crossing(card.dataset.widget);
  const f = text.split('\t');
  b.badge.textContent = f[0];
  b.badge.className = 'pill badge ' + f[1];
  card.dataset.updateId = f[2];
  card.dataset.state = f[1];
  b.gaps.textContent = f[3];
  b.resyncs.textContent = f[4];
  b.mismatches.textContent = f[5];
  b.stale.textContent = f[6];
  b.stale.className = f[6] ? 'stale-flag pill stale' : 'stale-flag';
  card.classList.toggle('stale', f[6] !== '');
  b.spread.textContent = f[7];
  b.mid.textContent = f[8];
  const nAsks = Number(f[9]);
  const nBids = Number(f[10]);
  let at = 11;
  for (let i = 0; i < levels; i++) fillRow(b.asks[i], f, i < nAsks ? at + 4 * i : undefined);
  at += 4 * nAsks;
  for (let i = 0; i < levels; i++) fillRow(b.bids[i], f, i < nBids ? at + 4 * i : undefined);
}

// --- candlestick chart --------------------------------------------------------------------------

let library;
function loadLibrary() {
  // Loaded on first use, so the first paint never waits for the chart library.
  library ??= import(new URL('./lightweight-charts.mjs', document.baseURI).href);
  return library;
}

const UP = '#3fb950';
const DOWN = '#f85149';

function barsOf(data, from) {
  const candles = [];
  const volumes = [];
  for (let i = from; i < data.length; i += 6) {
    const [time, open, high, low, close, value] = data.subarray(i, i + 6);
    candles.push({ time, open, high, low, close });
    volumes.push({ time, value, color: close >= open ? UP + '66' : DOWN + '66' });
  }
  return { candles, volumes };
}

function createChart(lib, el, state) {
  const chart = lib.createChart(el, {
    autoSize: true,
    layout: { background: { type: 'solid', color: '#161b22' }, textColor: '#8b949e', fontSize: 11 },
    grid: { vertLines: { color: '#21262d' }, horzLines: { color: '#21262d' } },
    rightPriceScale: { borderColor: '#30363d' },
    timeScale: { borderColor: '#30363d', timeVisible: true, secondsVisible: false },
    crosshair: { mode: lib.CrosshairMode.Normal },
  });
  const candles = chart.addSeries(lib.CandlestickSeries, {
    upColor: UP, downColor: DOWN, borderVisible: false, wickUpColor: UP, wickDownColor: DOWN,
  });
  const volumes = chart.addSeries(lib.HistogramSeries, { priceFormat: { type: 'volume' }, priceScaleId: '' });
  volumes.priceScale().applyOptions({ scaleMargins: { top: 0.8, bottom: 0 } });
  candles.priceScale().applyOptions({ scaleMargins: { top: 0.08, bottom: 0.25 } });
  state.chart = chart;
  state.candles = candles;
  state.volumes = volumes;
  el.__chart = state; // tests read the series through this
}

function applyBars(state, reset, data) {
  const { candles, volumes } = barsOf(data, 0);
  if (reset) {
    state.candles.setData(candles);
    state.volumes.setData(volumes);
    if (!state.fitted && candles.length) {
      state.chart.timeScale().fitContent();
      state.fitted = true;
    }
  } else {
    for (let i = 0; i < candles.length; i++) {
      state.candles.update(candles[i]);
      state.volumes.update(volumes[i]);
    }
  }
}

/**
 * Draws candles on the chart in `el` (created on first call), inside the panel (`[data-widget]`)
 * whose data attributes it sets. `data` holds 6 numbers per candle,
 * oldest first: open time (s), open, high, low, close, volume. `reset`: `data` is the whole
 * series; otherwise the candles from the first one in `data` on changed. `decimals` sets the
 * price axis precision; `count` is the series' length and `status` its state (`live`, `loading`,
 * `stale`), both shown on the panel as `data-bars` and `data-status`.
 */
export function paint_chart(el, reset, data, decimals, count, status) {
  const state = el.__chart ?? (el.__chart = { queue: [], fitted: false, panel: el.closest('[data-widget]') ?? el });
  const panel = state.panel;
  crossing(panel.dataset.widget);
  const last = data.length >= 6 ? data.subarray(data.length - 6) : null;
  if (last) {
    panel.dataset.lastTime = String(last[0]);
    panel.dataset.lastClose = String(last[4]);
  }
  panel.dataset.status = status;
  state.statusEl ??= panel.querySelector('.chart-status');
  if (state.statusEl) state.statusEl.textContent = status;
  panel.classList.toggle('stale', status === 'stale');
  panel.dataset.bars = String(count);
  if (!state.chart) {
    // the library is still loading: keep what to draw, in order
    if (reset) state.queue = [];
    state.queue.push([reset, data.slice(), decimals]);
    if (!state.loading) {
      state.loading = loadLibrary().then((lib) => {
        if (!el.isConnected) return;
        createChart(lib, el, state);
        for (const [r, d, dec] of state.queue) draw(state, r, d, dec);
        state.queue = [];
      }, (e) => { panel.dataset.status = 'chart library failed: ' + e; });
    }
    return;
  }
  draw(state, reset, data, decimals);
}

function draw(state, reset, data, decimals) {
  if (state.decimals !== decimals) {
    state.decimals = decimals;
    const minMove = Math.pow(10, -decimals);
    state.candles.applyOptions({ priceFormat: { type: 'price', precision: decimals, minMove } });
  }
  applyBars(state, reset, data);
}

/** Removes the chart in `el` (the panel is being closed). */
export function drop_chart(el) {
  if (el.__chart?.chart) el.__chart.chart.remove();
  el.__chart = undefined;
}
