//! The other venues' public market-data protocols, served from the same simulated markets:
//! OKX v5, Bybit v5 (spot and linear), Coinbase Advanced Trade and Kraken WebSocket v2.
//!
//! | path | what |
//! |------|------|
//! | `/okx/ws/v5/public`, `/okx/ws/v5/business` | OKX: `books`, `trades`, `tickers`; `candle1m` |
//! | `/bybit/v5/public/spot`, `/bybit/v5/public/linear` | Bybit: `orderbook.{1,50,200,1000}.SYM`, `publicTrade.SYM`, `kline.1.SYM`, `tickers.SYM` |
//! | `/coinbase/ws` | Coinbase: `level2`, `market_trades`, `candles` (5 m), `ticker`, `heartbeats` |
//! | `/kraken/v2` | Kraken: `book` (depth 10, 25, 100, 500, 1000), `trade`, `ohlc` (interval 1), `ticker`, `instrument`; heartbeats |
//! | `/okx/api/v5/…`, `/bybit/v5/market/…`, `/coinbase/api/v3/brokerage/market/…`, `/kraken/0/public/…` | each venue's instruments, candles and book ([`rest`]) |
//!
//! Every connection samples the markets every [`TICK`] and sends, per subscription, what the venue
//! would: a book snapshot, then updates with the venue's sequence fields and checksum (computed
//! over the strings the frames carry), trades since the last ones sent, the 1m candle (forming,
//! and closed once its minute ends), and the best bid and ask when they change. A venue's names
//! are its own: `BTC-USDT` (OKX, Coinbase), `BTCUSDT` (Bybit), `BTC/USDT` (Kraken).
//!
//! Faults ([`crate::faults`]) reach these streams by name, `{venue}:{channel}:{symbol}` (say
//! `okx:books:BTC-USDT`), by class (`depth`, `trade`, `kline`, `book_ticker`) or by the market's
//! Binance symbol (`BTCUSDT`): `skip` loses a book message (a sequence gap; on Kraken the next
//! checksum disagrees), `duplicate` sends it twice, `corrupt` sends a wrong checksum (OKX,
//! Kraken) or a phantom level (Bybit, Coinbase), `reset` sends the venue's reset, `malformed`
//! broken text, `stall` silence, `drop` closes the connection; `rest_fail` with a path under the
//! venue's prefix answers its REST calls with the venue's own error body.

mod bybit;
mod coinbase;
mod kraken;
mod okx;
pub(crate) mod rest;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use shared::book::{Level, OrderBook, Side};
use shared::candle::MINUTE_MS;
use shared::venue::{checksum, Dialect, NumberFormat};
use tokio::sync::Notify;

use crate::engine::Fill;
use crate::faults::{Count, Decision, MessageFault, StreamClass};
use crate::klines::SimCandle;
use crate::market::SimMarket;
use crate::state::Srv;
use crate::symbols::SymbolSpec;

/// How often a connection samples the markets.
pub const TICK: Duration = Duration::from_millis(100);
/// Subscriptions one connection may hold.
const MAX_SUBSCRIPTIONS: usize = 256;
/// The longest client frame read.
const MAX_CLIENT_FRAME: usize = 64 * 1024;
/// Ticks without a book change before a venue's heartbeat of that book (OKX).
const BOOK_HEARTBEAT_TICKS: u32 = 50;

/// What a client asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request {
    Subscribe { subs: Vec<Sub>, id: Option<serde_json::Value> },
    Unsubscribe { subs: Vec<Sub>, id: Option<serde_json::Value> },
    Ping { id: Option<serde_json::Value> },
}

/// One subscription: a channel of one instrument, by the venue's name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Sub {
    pub channel: Channel,
    /// The venue's instrument name (empty for connection-wide channels).
    pub symbol: String,
    /// Book depth, where the channel has one.
    pub depth: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Channel {
    Book,
    Trades,
    Candles,
    Ticker,
    /// Coinbase `heartbeats`, Kraken `instrument` and the like: handled by the dialect.
    Other(&'static str),
}

/// A book message before the venue's framing.
pub(crate) struct BookOut<'a> {
    pub symbol: &'a str,
    pub spec: &'a SymbolSpec,
    pub snapshot: bool,
    pub bids: &'a [Level],
    pub asks: &'a [Level],
    /// The venue's sequence of this message (OKX `seqId`, Bybit `u`).
    pub seq: u64,
    pub prev_seq: Option<u64>,
    /// The market's update id (Bybit's cross sequence).
    pub cross_seq: u64,
    pub checksum: Option<u32>,
    pub depth: usize,
    pub time_ms: i64,
}

/// One venue's wire format, the server side.
pub(crate) trait Venue: Send + Sync + 'static {
    fn dialect(&self) -> Dialect;
    /// The venue's name of a market.
    fn name(&self, spec: &SymbolSpec) -> String;
    /// The book depth a subscription without one gets, and the depths it may ask for.
    fn default_depth(&self) -> usize;
    /// How the venue prints a market's prices and quantities, for its checksum.
    fn formats(&self, spec: &SymbolSpec) -> (NumberFormat, NumberFormat);
    /// Reads a client frame.
    fn request(&self, text: &str) -> Result<Request, String>;
    /// The answer to a request (`Err`: why it was refused).
    fn answer(&self, req: &Request, outcome: Result<(), &str>, ctx: &mut Ctx) -> Option<String>;
    fn book(&self, b: &BookOut<'_>, ctx: &mut Ctx) -> String;
    /// A heartbeat of a quiet book (OKX's empty update), if the venue sends one.
    fn book_heartbeat(&self, b: &BookOut<'_>, ctx: &mut Ctx) -> Option<String>;
    fn trades(&self, symbol: &str, spec: &SymbolSpec, trades: &[Fill], ctx: &mut Ctx) -> String;
    /// A 1m candle (Coinbase: its 5 m candle), forming or closed.
    fn candle(
        &self,
        symbol: &str,
        spec: &SymbolSpec,
        c: &SimCandle,
        closed: bool,
        ctx: &mut Ctx,
    ) -> String;
    fn ticker(
        &self,
        symbol: &str,
        spec: &SymbolSpec,
        bid: Level,
        ask: Level,
        cross_seq: u64,
        ctx: &mut Ctx,
    ) -> String;
    /// What the connection sends every second whatever it holds (Kraken and Coinbase heartbeats).
    fn heartbeat(&self, subs: &[Sub], ctx: &mut Ctx) -> Option<String>;
    /// Frames a subscription to a connection-wide channel starts with (Kraken's instruments).
    fn on_other(&self, _sub: &Sub, _markets: &[&SimMarket], _ctx: &mut Ctx) -> Vec<String> {
        Vec::new()
    }
    /// Candles of this many minutes (Coinbase: 5).
    fn candle_minutes(&self) -> i64 {
        1
    }
}

/// What a connection's frames share: the clock, and Coinbase's connection-wide sequence.
pub(crate) struct Ctx {
    pub now_ms: i64,
    pub conn_seq: u64,
}

impl Ctx {
    /// The next connection-wide sequence number (Coinbase counts every message it sends).
    pub fn next_seq(&mut self) -> u64 {
        let s = self.conn_seq;
        self.conn_seq += 1;
        s
    }
}

/// A connection: what closes it, and the markets (Binance names) it holds subscriptions of.
type Conn = (Arc<Notify>, Vec<String>);

/// The connections of these venues, for the `drop` fault.
#[derive(Default)]
pub struct VenueConns {
    inner: Mutex<HashMap<u64, Conn>>,
    next: std::sync::atomic::AtomicU64,
}

impl VenueConns {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Conn>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn register(&self) -> (u64, Arc<Notify>) {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let kill = Arc::new(Notify::new());
        self.lock().insert(id, (kill.clone(), Vec::new()));
        (id, kill)
    }

    fn set_symbols(&self, id: u64, symbols: Vec<String>) {
        if let Some(c) = self.lock().get_mut(&id) {
            c.1 = symbols;
        }
    }

    fn unregister(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// Closes every connection, or those holding a subscription of `symbol` (the market's
    /// Binance name); how many.
    pub fn drop_connections(&self, symbol: Option<&str>) -> usize {
        let mut g = self.lock();
        let ids: Vec<u64> = g
            .iter()
            .filter(|(_, (_, syms))| {
                symbol.is_none_or(|s| syms.iter().any(|x| x.eq_ignore_ascii_case(s)))
            })
            .map(|(id, _)| *id)
            .collect();
        for id in &ids {
            if let Some((kill, _)) = g.remove(id) {
                kill.notify_one();
            }
        }
        ids.len()
    }

    pub fn connections(&self) -> usize {
        self.lock().len()
    }
}

/// The routes of every venue's WebSocket and REST API.
pub(crate) fn routes() -> Router<Arc<Srv>> {
    fn ws<V: Venue + Default>(path: &str, r: Router<Arc<Srv>>) -> Router<Arc<Srv>> {
        r.route(
            path,
            get(|State(srv): State<Arc<Srv>>, up: WebSocketUpgrade| async move {
                upgrade(up, srv, V::default())
            }),
        )
    }
    let mut r = Router::new();
    r = ws::<okx::Okx>("/okx/ws/v5/public", r);
    r = ws::<okx::Okx>("/okx/ws/v5/business", r);
    r = ws::<bybit::Bybit>("/bybit/v5/public/spot", r);
    r = ws::<bybit::Bybit>("/bybit/v5/public/linear", r);
    r = ws::<coinbase::Coinbase>("/coinbase/ws", r);
    r = ws::<kraken::Kraken>("/kraken/v2", r);
    r.merge(rest::routes())
}

fn upgrade<V: Venue>(up: WebSocketUpgrade, srv: Arc<Srv>, venue: V) -> Response {
    up.read_buffer_size(crate::ws::READ_BUFFER_BYTES)
        .max_message_size(MAX_CLIENT_FRAME)
        .max_frame_size(MAX_CLIENT_FRAME)
        .on_upgrade(move |socket| session(socket, srv, venue))
}

/// One subscription's state.
struct Feed {
    sub: Sub,
    market: usize,
    /// What the client was last sent of the book (book feeds).
    mirror: OrderBook,
    sent: bool,
    seq: u64,
    quiet: u32,
    /// Trades: the last id sent. Candles: the open time of the last closed candle sent.
    last_trade: Option<u64>,
    last_closed: Option<i64>,
    last_ticker: Option<(Level, Level)>,
}

impl Feed {
    fn new(sub: Sub, market: usize, seq: u64) -> Self {
        Feed {
            sub,
            market,
            mirror: OrderBook::new(),
            sent: false,
            seq,
            quiet: 0,
            last_trade: None,
            last_closed: None,
            last_ticker: None,
        }
    }
}

async fn session<V: Venue>(mut socket: WebSocket, srv: Arc<Srv>, venue: V) {
    let (id, kill) = srv.venue_conns.register();
    let mut feeds: Vec<Feed> = Vec::new();
    let mut others: Vec<Sub> = Vec::new();
    let mut ctx = Ctx { now_ms: srv.ex.clock.now_ms(), conn_seq: 0 };
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ticks: u64 = 0;
    // a venue's sequence numbers start somewhere arbitrary, as on the venue
    let seed_seq = 1_000 + id * 7_919;
    loop {
        let mut out: Vec<String> = Vec::new();
        tokio::select! {
            biased;
            _ = kill.notified() => break,
            () = srv.stop.cancelled() => {
                let frame = CloseFrame { code: 1001, reason: Utf8Bytes::from_static("server shutting down") };
                let _ = tokio::time::timeout(Duration::from_secs(1), socket.send(Message::Close(Some(frame)))).await;
                break;
            }
            _ = tick.tick() => {
                ticks += 1;
                ctx.now_ms = srv.ex.clock.now_ms();
                publish(&srv, &venue, &mut feeds, &mut ctx, &mut out);
                if ticks % 10 == 0 {
                    out.extend(venue.heartbeat(&others, &mut ctx));
                }
            }
            msg = socket.recv() => match msg {
                Some(Ok(Message::Text(t))) => {
                    ctx.now_ms = srv.ex.clock.now_ms();
                    let answer = on_request(&srv, &venue, t.as_str(), &mut feeds, &mut others, &mut ctx, seed_seq, &mut out);
                    out.extend(answer);
                    let symbols = feeds.iter().map(|f| srv.ex.markets[f.market].spec.symbol.clone()).collect();
                    srv.venue_conns.set_symbols(id, symbols);
                }
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Binary(_))) => {}
                Some(Ok(Message::Close(_)) | Err(_)) | None => break,
            }
        }
        let mut alive = true;
        for text in out {
            let sent = tokio::select! {
                r = socket.send(Message::Text(text.into())) => r.is_ok(),
                _ = kill.notified() => false,
            };
            if !sent {
                alive = false;
                break;
            }
        }
        if !alive {
            break;
        }
    }
    srv.venue_conns.unregister(id);
}

#[allow(clippy::too_many_arguments)]
fn on_request<V: Venue>(
    srv: &Srv,
    venue: &V,
    text: &str,
    feeds: &mut Vec<Feed>,
    others: &mut Vec<Sub>,
    ctx: &mut Ctx,
    seed_seq: u64,
    out: &mut Vec<String>,
) -> Option<String> {
    let req = match venue.request(text) {
        Ok(r) => r,
        Err(e) => {
            let ping = Request::Ping { id: None };
            return venue.answer(&ping, Err(&e), ctx);
        }
    };
    let find = |symbol: &str| srv.ex.markets.iter().position(|m| venue.name(&m.spec) == symbol);
    match &req {
        Request::Ping { .. } => venue.answer(&req, Ok(()), ctx),
        Request::Subscribe { subs, .. } => {
            if feeds.len() + others.len() + subs.len() > MAX_SUBSCRIPTIONS {
                return venue.answer(&req, Err("too many subscriptions on one connection"), ctx);
            }
            for s in subs {
                if let Channel::Other(_) = s.channel {
                    continue;
                }
                if find(&s.symbol).is_none() {
                    let why = format!(
                        "unknown instrument {:?}",
                        s.symbol.chars().take(40).collect::<String>()
                    );
                    return venue.answer(&req, Err(&why), ctx);
                }
            }
            let answer = venue.answer(&req, Ok(()), ctx);
            out.extend(answer);
            for s in subs {
                if let Channel::Other(_) = s.channel {
                    let markets: Vec<&SimMarket> = srv.ex.markets.iter().collect();
                    out.extend(venue.on_other(s, &markets, ctx));
                    if !others.contains(s) {
                        others.push(s.clone());
                    }
                    continue;
                }
                let market = find(&s.symbol).expect("checked above");
                // a subscription already held is started again (a fresh snapshot), as venues do
                feeds.retain(|f| f.sub != *s);
                let seq = seed_seq + (market as u64) * 1_000_003;
                feeds.push(Feed::new(s.clone(), market, seq));
            }
            None
        }
        Request::Unsubscribe { subs, .. } => {
            feeds.retain(|f| !subs.contains(&f.sub));
            others.retain(|o| !subs.contains(o));
            venue.answer(&req, Ok(()), ctx)
        }
    }
}

/// The levels of `new` (a side's best levels, best first) that differ from what the client was
/// sent of that side, removed ones with 0 (one merge of the two sorted lists).
fn changed(sent: &shared::book::Ladder, new: &[Level], depth: usize) -> Vec<Level> {
    let desc = sent.side() == Side::Bid;
    let sent: Vec<Level> = sent.iter().take(depth).collect();
    crate::market::diff_levels(&sent, new, desc)
}

/// The venue's checksum of `book` (what the client's book must give).
fn checksum_of<V: Venue>(venue: &V, spec: &SymbolSpec, book: &OrderBook) -> Option<u32> {
    let (price, qty) = venue.formats(spec);
    let mut scratch = String::new();
    match venue.dialect() {
        Dialect::Okx => checksum::okx(book, price, qty, &mut scratch).map(|c| c as u32),
        Dialect::Kraken => checksum::kraken(book, price, qty, &mut scratch),
        _ => None,
    }
}

fn decide(
    srv: &Srv,
    venue: Dialect,
    channel: &str,
    sub: &Sub,
    class: StreamClass,
    spec: &SymbolSpec,
) -> Decision {
    let name = format!("{}:{channel}:{}", venue.as_str(), sub.symbol);
    srv.faults.decide(&name, class, &spec.symbol)
}

/// One tick of every feed of a connection.
fn publish<V: Venue>(
    srv: &Srv,
    venue: &V,
    feeds: &mut [Feed],
    ctx: &mut Ctx,
    out: &mut Vec<String>,
) {
    let dialect = venue.dialect();
    for f in feeds.iter_mut() {
        let m = &srv.ex.markets[f.market];
        let spec = &m.spec;
        let symbol = f.sub.symbol.clone();
        match f.sub.channel {
            Channel::Book => book_tick(srv, venue, f, ctx, out),
            Channel::Trades => {
                let (trades, newest) = m.trades_after(f.last_trade, 1_000);
                if f.last_trade.is_none() {
                    // trades from the subscription on
                    f.last_trade = Some(newest.unwrap_or(0));
                    continue;
                }
                let Some(last) = trades.last() else { continue };
                f.last_trade = Some(last.id);
                match decide(srv, dialect, "trades", &f.sub, StreamClass::Trade, spec) {
                    Decision::Withhold => {}
                    // lost: on Coinbase the connection's sequence moved on
                    // lost on the way: written (a Coinbase frame takes its sequence number),
                    // never sent
                    Decision::Fault(MessageFault::Skip) => {
                        venue.trades(&symbol, spec, &trades, ctx);
                    }
                    Decision::Fault(MessageFault::Duplicate) => {
                        let t = venue.trades(&symbol, spec, &trades, ctx);
                        out.push(t.clone());
                        out.push(t);
                    }
                    Decision::Fault(MessageFault::Malformed) => {
                        let t = venue.trades(&symbol, spec, &trades, ctx);
                        out.push(srv.faults.malformed_text(&t));
                    }
                    _ => out.push(venue.trades(&symbol, spec, &trades, ctx)),
                }
            }
            Channel::Candles => candle_tick(srv, venue, f, ctx, out),
            Channel::Ticker => {
                let (view, _) = m.book_and_time(1);
                let (Some(&bid), Some(&ask)) = (view.bids.first(), view.asks.first()) else {
                    continue;
                };
                if f.last_ticker == Some((bid, ask)) {
                    continue;
                }
                f.last_ticker = Some((bid, ask));
                if let Decision::Send =
                    decide(srv, dialect, "ticker", &f.sub, StreamClass::BookTicker, spec)
                {
                    out.push(venue.ticker(&symbol, spec, bid, ask, view.last_update_id, ctx));
                }
            }
            Channel::Other(_) => {}
        }
    }
}

fn book_tick<V: Venue>(srv: &Srv, venue: &V, f: &mut Feed, ctx: &mut Ctx, out: &mut Vec<String>) {
    let m = &srv.ex.markets[f.market];
    let spec = &m.spec;
    let depth = f.sub.depth.unwrap_or_else(|| venue.default_depth());
    // a book message carries the time of the book it shows (as a venue's "generation time"),
    // the same the REST book of that moment says
    let (view, book_ms) = m.book_and_time(depth);
    let symbol = f.sub.symbol.clone();
    let now_ms = book_ms;
    let snapshot_out = |seq: u64, checksum: Option<u32>| BookOut {
        symbol: &symbol,
        spec,
        snapshot: true,
        bids: &view.bids,
        asks: &view.asks,
        seq,
        prev_seq: None,
        cross_seq: view.last_update_id,
        checksum,
        depth,
        time_ms: now_ms,
    };
    if !f.sent {
        f.mirror.replace(&view.bids, &view.asks);
        f.sent = true;
        let sum = checksum_of(venue, spec, &f.mirror);
        let b = snapshot_out(f.seq, sum);
        out.push(venue.book(&b, ctx));
        return;
    }
    let bids = changed(&f.mirror.bids, &view.bids, depth);
    let asks = changed(&f.mirror.asks, &view.asks, depth);
    let dialect = venue.dialect();
    if bids.is_empty() && asks.is_empty() {
        f.quiet += 1;
        if f.quiet >= BOOK_HEARTBEAT_TICKS {
            f.quiet = 0;
            let b = BookOut {
                symbol: &symbol,
                spec,
                snapshot: false,
                bids: &[],
                asks: &[],
                seq: f.seq,
                prev_seq: Some(f.seq),
                cross_seq: view.last_update_id,
                checksum: checksum_of(venue, spec, &f.mirror),
                depth,
                time_ms: book_ms,
            };
            out.extend(venue.book_heartbeat(&b, ctx));
        }
        return;
    }
    f.quiet = 0;
    let decision = decide(srv, dialect, "book", &f.sub, StreamClass::Depth, spec);
    if let Decision::Withhold = decision {
        return; // silence: the next message carries the changes
    }
    for l in &bids {
        f.mirror.apply(Side::Bid, l.price, l.qty);
    }
    for l in &asks {
        f.mirror.apply(Side::Ask, l.price, l.qty);
    }
    let prev = f.seq;
    f.seq += 1;
    if let Decision::Fault(MessageFault::Reset) = decision {
        srv.faults.count(Count::Reset, 1);
        match dialect {
            // seqId below prevSeqId after "maintenance": the client continues from it
            Dialect::Okx => f.seq = prev / 2,
            // a restarted service: the whole book again, with u = 1
            Dialect::Bybit => f.seq = 1,
            _ => {}
        }
        if dialect != Dialect::Okx {
            let sum = checksum_of(venue, spec, &f.mirror);
            let b = snapshot_out(f.seq, sum);
            out.push(venue.book(&b, ctx));
            return;
        }
    }
    let mut sum = checksum_of(venue, spec, &f.mirror);
    let mut extra_bids = bids.clone();
    if let Decision::Fault(MessageFault::Corrupt) = decision {
        srv.faults.count(Count::Corrupted, 1);
        match sum {
            Some(s) => sum = Some(s.wrapping_add(1)),
            None => {
                // no checksum to catch it: a phantom level half a tick below the best bid
                // (off the tick grid, so no later message names it, and far from the depth cut
                // that would drop it; only a REST book can show it)
                if let Some(best) = view.bids.first() {
                    extra_bids.push(Level::new(
                        shared::Price::from_raw(best.price.raw() - spec.tick.raw() / 2),
                        spec.lot,
                    ));
                }
            }
        }
    }
    let b = BookOut {
        symbol: &symbol,
        spec,
        snapshot: false,
        bids: &extra_bids,
        asks: &asks,
        seq: f.seq,
        prev_seq: Some(prev),
        cross_seq: view.last_update_id,
        checksum: sum,
        depth,
        time_ms: book_ms,
    };
    match decision {
        // lost on the way: written (the venue's sequences moved on), never sent
        Decision::Fault(MessageFault::Skip) => {
            venue.book(&b, ctx);
        }
        Decision::Fault(MessageFault::Duplicate) => {
            let text = venue.book(&b, ctx);
            out.push(text.clone());
            out.push(text);
        }
        Decision::Fault(MessageFault::Malformed) => {
            let text = venue.book(&b, ctx);
            out.push(srv.faults.malformed_text(&text));
        }
        _ => out.push(venue.book(&b, ctx)),
    }
}

fn candle_tick<V: Venue>(srv: &Srv, venue: &V, f: &mut Feed, ctx: &mut Ctx, out: &mut Vec<String>) {
    let m = &srv.ex.markets[f.market];
    let spec = &m.spec;
    let symbol = f.sub.symbol.clone();
    let minutes = venue.candle_minutes();
    let forming = m.forming();
    let bucket = |t: i64| t - t.rem_euclid(minutes * MINUTE_MS);
    let forming_open = bucket(forming.candle.open_time);
    let Some(last_closed) = f.last_closed else {
        f.last_closed = Some(forming_open - minutes * MINUTE_MS);
        return;
    };
    let mut frames = Vec::new();
    // candles whose bucket closed since the last tick
    let mut open = last_closed + minutes * MINUTE_MS;
    while open < forming_open {
        let ones = m.closed_klines(open, open + minutes * MINUTE_MS - 1);
        if let Some(c) = merged(&ones, minutes) {
            frames.push(venue.candle(&symbol, spec, &c, true, ctx));
        }
        f.last_closed = Some(open);
        open += minutes * MINUTE_MS;
    }
    // the forming one, about once a second
    if ctx.now_ms / 1_000 != f.seq as i64 {
        f.seq = (ctx.now_ms / 1_000) as u64;
        let mut ones = m.closed_klines(forming_open, forming.candle.open_time - 1);
        ones.push(forming);
        if let Some(c) = merged(&ones, minutes) {
            frames.push(venue.candle(&symbol, spec, &c, false, ctx));
        }
    }
    for text in frames {
        match decide(srv, venue.dialect(), "candles", &f.sub, StreamClass::Kline, spec) {
            // lost (a Coinbase frame took its sequence number when it was written)
            Decision::Withhold | Decision::Fault(MessageFault::Skip) => {}
            Decision::Fault(MessageFault::Duplicate) => {
                out.push(text.clone());
                out.push(text);
            }
            _ => out.push(text),
        }
    }
}

/// The candle of `minutes` made of its 1m candles (oldest first).
fn merged(ones: &[SimCandle], minutes: i64) -> Option<SimCandle> {
    if minutes == 1 {
        return ones.first().copied();
    }
    let tf = match minutes {
        5 => shared::candle::Timeframe::M5,
        _ => return None,
    };
    SimCandle::merge(tf, ones)
}

/// Decimal places of a tick or step (`0.01` → 2).
pub(crate) fn places(raw: i64) -> u8 {
    let mut d = 8u8;
    let mut r = raw;
    while d > 0 && r % 10 == 0 {
        r /= 10;
        d -= 1;
    }
    d
}

/// `ms` as an RFC 3339 UTC time, as Coinbase and Kraken print times.
pub(crate) fn time(ms: i64) -> String {
    let mut s = String::new();
    venues::write_rfc3339(&mut s, ms);
    s
}

/// `BASE{sep}QUOTE`.
pub(crate) fn pair(spec: &SymbolSpec, sep: &str) -> String {
    format!("{}{sep}{}", spec.base, spec.quote)
}

/// The book of `symbol`'s market under a venue's name.
pub(crate) fn market_by<'a>(
    srv: &'a Srv,
    symbol: &str,
    name: impl Fn(&SymbolSpec) -> String,
) -> Option<&'a SimMarket> {
    srv.ex.markets.iter().find(|m| name(&m.spec) == symbol)
}
