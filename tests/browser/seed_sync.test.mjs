// The order-book sync example of seeds/local-order-book-snapshot-delta-sync.md, run UNCHANGED in
// Chromium against a real `millrace serve`: its `OrderBook` class subscribes `depth_update@…`,
// fetches `GET /fapi/v1/depth?symbol=…&with_id=true` and bridges. The only addition is the `ws`
// object the example assumes (`ws.subscribe(stream, callback)`), here a thin adapter over
// millrace's `/ws` protocol. After some seconds of live data, the example's book must equal the
// server's REST book at the same update id.
//
// Run alone: MILLRACE_BIN=target/debug/millrace node --test tests/browser/seed_sync.test.mjs
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { freePort, launchBrowser, startServer, stopServer } from './harness.mjs';

// Verbatim from the seed ("完整示例").
const SEED_EXAMPLE = `
class OrderBook {
  constructor(symbol) {
    this.symbol = symbol;
    this.bids = new Map();
    this.asks = new Map();
    this.lastUpdateId = 0;
    this.buffer = [];
    this.ready = false;
  }

  async init(ws) {
    this.ready = false;
    this.buffer = [];

    ws.subscribe(\`depth_update@\${this.symbol}\`, (data) => {
      if (!this.ready) { this.buffer.push(data); return; }
      this.applyUpdate(data);
    });

    const resp = await fetch(\`/fapi/v1/depth?symbol=\${this.symbol}&with_id=true\`);
    const snapshot = (await resp.json()).data;

    this.bids.clear(); this.asks.clear();
    for (const [p, q] of snapshot.bids) this.bids.set(p, q);
    for (const [p, q] of snapshot.asks) this.asks.set(p, q);
    this.lastUpdateId = snapshot.id;

    for (const event of this.buffer) {
      if (event.u <= this.lastUpdateId) continue;
      if (event.U > this.lastUpdateId + 1) return this.init(ws);
      this.applyUpdate(event);
    }
    this.buffer = [];
    this.ready = true;
  }

  applyUpdate(event) {
    if (event.u <= this.lastUpdateId) return;
    if (event.U > this.lastUpdateId + 1) {
      this.ready = false;
      return;
    }
    for (const [p, q] of event.b) {
      if (q === '0') this.bids.delete(p); else this.bids.set(p, q);
    }
    for (const [p, q] of event.a) {
      if (q === '0') this.asks.delete(p); else this.asks.set(p, q);
    }
    this.lastUpdateId = event.u;
  }
}
`;

// The \`ws\` the example assumes: subscribe(stream, callback) over millrace's /ws.
const WS_ADAPTER = `
class MillraceWs {
  constructor() {
    this.sock = new WebSocket(\`ws://\${location.host}/ws\`);
    this.handlers = new Map();
    this.nextId = 1;
    this.opened = new Promise((ok) => this.sock.addEventListener('open', ok));
    this.replies = new Map();
    this.pending = Promise.resolve();
    this.sock.addEventListener('message', (m) => {
      const frame = JSON.parse(m.data);
      if (frame.id !== undefined && this.replies.has(frame.id)) {
        this.replies.get(frame.id)();
        this.replies.delete(frame.id);
        return;
      }
      const handler = frame.stream && this.handlers.get(frame.stream);
      if (handler) handler(frame.data);
    });
  }
  subscribe(stream, callback) {
    this.handlers.set(stream, callback);
    const id = this.nextId++;
    const replied = new Promise((ok) => this.replies.set(id, ok));
    this.pending = Promise.all([this.pending, replied]);
    this.opened.then(() => this.sock.send(JSON.stringify({ method: 'SUBSCRIBE', params: [stream], id })));
  }
}
`;

/** Runs the example in the page for `ms`, then compares it with the REST book at its update id. */
async function runExample(page, symbol, ms) {
  return page.evaluate(async ({ symbol, ms, code }) => {
    // eslint-disable-next-line no-eval
    const { OrderBook, MillraceWs } = (0, eval)(`${code}; ({ OrderBook, MillraceWs })`);
    // The seed's step 1 (subscribe) comes before step 2 (snapshot); the example does not wait for
    // the subscription's reply, so the page's fetch does: the snapshot is never older than the
    // first delta the example receives.
    let current = null;
    const realFetch = window.fetch.bind(window);
    window.fetch = async (...args) => {
      if (current) await current.pending;
      return realFetch(...args);
    };
    // The example sends its subscription and fetches the snapshot without waiting in between;
    // it assumes the subscription is live first (the seed's step 1 before step 2). Give it an open
    // socket and a book that is already being published, so that holds.
    for (let i = 0; i < 100; i++) {
      const r = await (await fetch(`/fapi/v1/depth?symbol=${symbol}&with_id=true&limit=1`)).json();
      if (r.data && r.data.id > 0 && r.health === 'synced') break;
      await new Promise((ok) => setTimeout(ok, 100));
    }
    const ws = new MillraceWs();
    current = ws;
    await ws.opened;
    const book = new OrderBook(symbol);
    await book.init(ws);
    await new Promise((ok) => setTimeout(ok, ms));
    const updatesSeen = book.lastUpdateId;
    for (let attempt = 0; attempt < 200; attempt++) {
      const rest = (await (await fetch(`/fapi/v1/depth?symbol=${symbol}&with_id=true&limit=5000`)).json()).data;
      if (rest.id === book.lastUpdateId) {
        const same = (side, map) => side.length === map.size && side.every(([p, q]) => map.get(p) === q);
        return {
          ready: book.ready, id: rest.id, updatesSeen,
          bidsEqual: same(rest.bids, book.bids), asksEqual: same(rest.asks, book.asks),
          levels: rest.bids.length + rest.asks.length,
        };
      }
      await new Promise((ok) => setTimeout(ok, 7));
    }
    return { ready: book.ready, id: null, lastUpdateId: book.lastUpdateId };
  }, { symbol, ms, code: SEED_EXAMPLE + WS_ADAPTER });
}

for (const symbol of ['sim:stock:600000', 'sim:stock:000001', 'sim:spot:BTC/USDT']) {
  test(`the seed's JavaScript example syncs ${symbol} unchanged`, { timeout: 90_000 }, async (t) => {
    const port = await freePort();
    const server = await startServer(port);
    t.after(() => stopServer(server));
    const browser = await launchBrowser();
    t.after(() => browser.close());
    const page = await browser.newPage();
    await page.goto(`http://127.0.0.1:${port}/`);
    const r = await runExample(page, symbol, 6_000);
    assert.ok(r.ready, `the example is synced: ${JSON.stringify(r)}`);
    assert.notEqual(r.id, null, `REST reached the example's update id: ${JSON.stringify(r)}`);
    assert.ok(r.levels > 10, `a real book: ${JSON.stringify(r)}`);
    assert.ok(r.bidsEqual && r.asksEqual, `equal to the server's book at id ${r.id}: ${JSON.stringify(r)}`);
  });
}
