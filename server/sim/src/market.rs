//! The live markets: per symbol an [`MatchingEngine`], its 1m klines and the depth feeds, advanced
//! by
//! one driver task on a real-time tick and published through the [`Hub`].
//!
//! ## The driver
//! Every [`TICK`] (50 ms real) the driver reads the simulated clock and, for each symbol, under
//! that symbol's lock: creates the depth feeds that gained subscribers (*before* advancing, so a
//! snapshot taken since the last tick bridges the feed's first event), runs every participant
//! action up to now, closes the minutes that ended (each closed 1m kline is recorded and
//! published once, `x:true`, in the tick right after its minute ends), and takes what is due:
//! depth diffs of the 100/250/500/1000 ms feeds, partial books, forming klines (every 250 ms),
//! trades, aggregate trades and book tickers. Serialising and fan-out happen after the lock is
//! released, and only for streams with subscribers.
//!
//! ## Depth update ids and diffs
//! The engine's update id grows by one per book-changing action. A depth feed remembers the book
//! it last published and its id `u'`; at its cadence it publishes `U = u' + 1`, `u = ` the
//! current id, and every level that changed in between (absolute quantities, 0 = removed; also a
//! level that changed and changed back, which a snapshot taken inside the window may hold, as
//! Binance does), plus `pu = u'` on futures. Events of a feed are contiguous, so Binance's spot rule (`U <= id + 1 <= u`, then
//! `U == last + 1`) and futures rule (`pu == last`) both hold, and a REST snapshot (the book and
//! id read together under the lock) is always bridged by the next event.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::extract::ws::Utf8Bytes;
use serde::Serialize;
use shared::candle::{Candle, Timeframe, MINUTE_MS, TIME_LIMIT_MS};
use shared::sync::DepthDelta;
use shared::{Level, Side};
use tokio_util::sync::CancellationToken;

use binance::wire::{
    Combined, DepthBody, StreamKind, StreamName, WsAggTrade, WsBookTicker, WsDepthUpdate,
    WsKlineEvent, WsTrade,
};

use crate::clock::SimClock;
use crate::engine::{Fill, MatchingEngine};
use crate::faults::{Count, Decision, Faults, MessageFault, StreamClass};
use crate::history::History;
use crate::hub::{Flavour, Frame, Hub, StreamKey};
use crate::klines::{LiveKlines, SimCandle};
use crate::symbols::SymbolSpec;

/// The driver's real-time tick.
pub const TICK: Duration = Duration::from_millis(50);
/// Forming kline updates every this many ticks (250 ms).
const KLINE_EVERY: u64 = 5;

/// The update cadence (ms) of a depth or partial-depth stream, `None` if the venue has no such
/// speed. Spot: `@100ms`, default / `@1000ms` 1000 ms. Futures: `@100ms`, `@500ms`, default /
/// `@250ms` 250 ms.
pub fn cadence(flavour: Flavour, update_ms: Option<u16>) -> Option<u32> {
    match (flavour, update_ms) {
        (_, Some(100)) => Some(100),
        (Flavour::Spot, None | Some(1000)) => Some(1000),
        (Flavour::Futures, None | Some(250)) => Some(250),
        (Flavour::Futures, Some(500)) => Some(500),
        _ => None,
    }
}

/// Whether the simulator produces `kind` for `flavour`.
pub fn supported(flavour: Flavour, kind: &StreamKind) -> bool {
    match *kind {
        StreamKind::Depth { update_ms } => cadence(flavour, update_ms).is_some(),
        StreamKind::PartialDepth { update_ms, .. } => cadence(flavour, update_ms).is_some(),
        StreamKind::Kline(_)
        | StreamKind::Trade
        | StreamKind::AggTrade
        | StreamKind::BookTicker => true,
    }
}

/// The fault-injection class of a stream kind.
pub fn class_of(kind: &StreamKind) -> StreamClass {
    match kind {
        StreamKind::Kline(_) => StreamClass::Kline,
        StreamKind::Depth { .. } => StreamClass::Depth,
        StreamKind::PartialDepth { .. } => StreamClass::PartialDepth,
        StreamKind::Trade => StreamClass::Trade,
        StreamKind::AggTrade => StreamClass::AggTrade,
        StreamKind::BookTicker => StreamClass::BookTicker,
    }
}

/// A depth diff feed of one cadence: the book as last published, and the levels changed since.
#[derive(Debug)]
struct DepthFeed {
    cadence_ms: u32,
    last_u: u64,
    bids: Vec<Level>,
    asks: Vec<Level>,
    /// Every level an action changed since `last_u` (duplicates possible).
    touched: Vec<(Side, shared::Price)>,
}

/// The levels a diff carries: every level that differs between the last published book and now,
/// and every level changed in between even if it changed back (absolute quantities, 0 = none).
/// A client's REST snapshot may come from inside the window; a level it holds that was added and
/// removed again within the window must be removed by the diff that bridges it, as on Binance.
fn window_levels(
    engine: &MatchingEngine,
    side: Side,
    old: &[Level],
    new: &[Level],
    touched: &[(Side, shared::Price)],
) -> Vec<Level> {
    let mut out: std::collections::BTreeMap<shared::Price, shared::Qty> =
        diff_levels(old, new, side == Side::Bid).into_iter().map(|l| (l.price, l.qty)).collect();
    for &(_, price) in touched.iter().filter(|(s, _)| *s == side) {
        out.entry(price).or_insert_with(|| engine.qty_at(side, price));
    }
    let levels = out.into_iter().map(|(price, qty)| Level::new(price, qty));
    match side {
        Side::Bid => levels.rev().collect(),
        Side::Ask => levels.collect(),
    }
}

/// The levels of `new` that differ from `old` (removed ones with quantity 0); both best first,
/// `desc` for bids.
pub(crate) fn diff_levels(old: &[Level], new: &[Level], desc: bool) -> Vec<Level> {
    let before = |a: &Level, b: &Level| if desc { a.price > b.price } else { a.price < b.price };
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::new();
    while i < old.len() || j < new.len() {
        match (old.get(i), new.get(j)) {
            (Some(o), Some(n)) if o.price == n.price => {
                if o.qty != n.qty {
                    out.push(*n);
                }
                i += 1;
                j += 1;
            }
            (Some(o), Some(n)) if before(o, n) => {
                out.push(Level::new(o.price, shared::Qty::ZERO));
                i += 1;
            }
            (Some(o), None) => {
                out.push(Level::new(o.price, shared::Qty::ZERO));
                i += 1;
            }
            (_, Some(n)) => {
                out.push(*n);
                j += 1;
            }
            (None, None) => break,
        }
    }
    out
}

/// The mutable part of a market.
struct State {
    engine: MatchingEngine,
    klines: LiveKlines,
    /// Simulated time the engine has run to.
    now_ms: i64,
    feeds: Vec<DepthFeed>,
    next_agg_id: u64,
    /// Best bid and ask last published on `bookTicker`.
    last_ticker: Option<(Option<Level>, Option<Level>)>,
    /// Scratch buffer for the trades of one tick.
    trades: Vec<Fill>,
    /// Scratch buffer for the levels one tick changed.
    touched: Vec<(Side, shared::Price)>,
    /// The newest trades, oldest first, at most [`RECENT_TRADES`]: what the other venues'
    /// sessions and REST answers read.
    recent: std::collections::VecDeque<Fill>,
    /// The aggregate trades published on `<sym>@aggTrade`, oldest first, at most
    /// [`RECENT_TRADES`]: what `GET /api/v3/aggTrades` answers (ids are given as they are
    /// published, so only published ones exist).
    aggs: std::collections::VecDeque<WsAggTrade>,
}

/// Trades each market keeps for the other venues' dialects ([`SimMarket::trades_after`]).
pub const RECENT_TRADES: usize = 20_000;

impl State {
    /// Runs the engine to `until`, closing minutes on the way; the levels changed go to every
    /// depth feed.
    fn advance(&mut self, until: i64, closed: &mut Vec<SimCandle>) {
        while self.engine.next_action_ms() <= until {
            self.klines.close_until(self.engine.next_action_ms(), closed);
            let n = self.trades.len();
            self.engine.step(&mut self.trades);
            for t in &self.trades[n..] {
                self.klines.add(t);
                if self.recent.len() == RECENT_TRADES {
                    self.recent.pop_front();
                }
                self.recent.push_back(*t);
            }
        }
        if self.feeds.is_empty() {
            self.engine.clear_touched();
        } else {
            self.touched.clear();
            self.engine.take_touched(&mut self.touched);
            for f in &mut self.feeds {
                f.touched.extend_from_slice(&self.touched);
            }
        }
        self.klines.close_until(until, closed);
        self.now_ms = self.now_ms.max(until);
    }
}

/// One symbol of the simulated exchange.
pub struct SimMarket {
    pub spec: SymbolSpec,
    /// The symbol in lower case, as stream names spell it.
    pub lower: String,
    /// Klines before the engine started.
    pub history: History,
    /// The engine, klines and feeds; a lock because the driver advances them while REST
    /// handlers and the handle read them (each access is short).
    state: Mutex<State>,
}

/// A book read together with its update id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BookView {
    pub last_update_id: u64,
    /// Best first.
    pub bids: Vec<Level>,
    /// Best first.
    pub asks: Vec<Level>,
}

impl SimMarket {
    /// A market whose engine starts at the minute of `start_ms` and is fast-forwarded to it.
    fn new(spec: SymbolSpec, seed: u64, start_ms: i64) -> SimMarket {
        let first_minute = start_ms - start_ms.rem_euclid(MINUTE_MS);
        let history = History::new(&spec, seed, start_ms);
        let start_price = history.start_price();
        let engine = MatchingEngine::new(&spec, seed, first_minute, start_price);
        let mut state = State {
            engine,
            klines: LiveKlines::new(first_minute, start_price),
            now_ms: first_minute,
            feeds: Vec::new(),
            next_agg_id: 10_000_000,
            last_ticker: None,
            trades: Vec::new(),
            touched: Vec::new(),
            recent: std::collections::VecDeque::new(),
            aggs: std::collections::VecDeque::new(),
        };
        state.advance(start_ms, &mut Vec::new());
        state.trades.clear();
        SimMarket {
            lower: spec.symbol.to_ascii_lowercase(),
            history,
            spec,
            state: Mutex::new(state),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The book (the best `limit` levels per side) with its update id.
    pub fn book(&self, limit: usize) -> BookView {
        let s = self.lock();
        BookView {
            last_update_id: s.engine.update_id(),
            bids: s.engine.levels(Side::Bid, limit),
            asks: s.engine.levels(Side::Ask, limit),
        }
    }

    /// Closed 1m klines (history and live) with open time in `[start_ms, end_ms]`.
    pub fn closed_klines(&self, start_ms: i64, end_ms: i64) -> Vec<SimCandle> {
        let live_first = self.history.end_minute_ms();
        let mut out = self.history.candles(start_ms, end_ms.min(live_first - 1));
        out.extend(self.lock().klines.closed_between(start_ms.max(live_first), end_ms));
        out
    }

    /// REST klines of `tf`, with Binance's selection rules: with `start` the oldest `limit`
    /// buckets whose open time is at or after it (and at or before `end`); with only `end` the
    /// newest `limit` at or before it; with neither the newest `limit`. The current forming
    /// bucket is included like Binance does.
    pub fn klines(
        &self,
        tf: Timeframe,
        start: Option<i64>,
        end: Option<i64>,
        limit: usize,
    ) -> Vec<SimCandle> {
        let clamp = |t: i64| t.clamp(-TIME_LIMIT_MS, TIME_LIMIT_MS);
        let d = tf.duration_ms();
        // the forming minute and the closed ones under one lock, so a minute closing meanwhile
        // is neither lost nor counted twice
        let s = self.lock();
        let (forming, live_first) = (*s.klines.forming(), s.klines.first_minute());
        let current = tf.bucket_open(forming.candle.open_time);
        let first = tf.bucket_open(self.history.first_minute_ms().min(live_first));
        let limit = limit.max(1) as i64;
        let (lo, hi) = match start.map(clamp) {
            Some(s) => {
                let lo = if tf.bucket_open(s) == s { s } else { tf.bucket_open(s) + d }.max(first);
                let hi = end.map(clamp).map_or(current, |e| tf.bucket_open(e).min(current));
                (lo, hi.min(lo + (limit - 1) * d))
            }
            None => {
                let hi = end.map(clamp).map_or(current, |e| tf.bucket_open(e).min(current));
                ((hi - (limit - 1) * d).max(first), hi)
            }
        };
        if lo > hi {
            return Vec::new();
        }
        let last_minute = hi + d - MINUTE_MS;
        let live: Vec<SimCandle> =
            s.klines.closed_between(lo.max(live_first), last_minute).collect();
        drop(s);
        let mut out = Vec::new();
        let mut bucket: Vec<SimCandle> = Vec::new();
        let mut push = |c: &SimCandle| {
            if bucket.first().is_some_and(|b| {
                tf.bucket_open(b.candle.open_time) != tf.bucket_open(c.candle.open_time)
            }) {
                out.extend(SimCandle::merge(tf, &bucket));
                bucket.clear();
            }
            bucket.push(*c);
        };
        self.history.visit(lo, last_minute.min(live_first - 1), &mut push);
        live.iter().for_each(&mut push);
        if forming.candle.open_time >= lo && forming.candle.open_time <= last_minute {
            push(&forming);
        }
        out.extend(SimCandle::merge(tf, &bucket));
        out
    }

    /// Up to `max` trades with an id above `after` (the oldest kept when `after` is `None`),
    /// oldest first, and the id of the newest trade there is.
    pub fn trades_after(&self, after: Option<u64>, max: usize) -> (Vec<Fill>, Option<u64>) {
        let s = self.lock();
        let newest = s.recent.back().map(|t| t.id);
        let start = match after {
            None => s.recent.len().saturating_sub(max),
            Some(id) => s.recent.partition_point(|t| t.id <= id),
        };
        (s.recent.range(start..).take(max).copied().collect(), newest)
    }

    /// Up to `limit` published aggregate trades from id `from_id` on, oldest first.
    pub fn agg_trades(&self, from_id: u64, limit: usize) -> Vec<WsAggTrade> {
        let s = self.lock();
        let start = s.aggs.partition_point(|a| a.agg_trade_id < from_id);
        s.aggs.range(start..).take(limit).cloned().collect()
    }

    /// The forming 1m candle.
    pub fn forming(&self) -> SimCandle {
        *self.lock().klines.forming()
    }

    /// The book (the best `limit` levels per side) with its update id, the forming candle and
    /// the newest trade id, read at one instant.
    pub fn book_and_time(&self, limit: usize) -> (BookView, i64) {
        let s = self.lock();
        let view = BookView {
            last_update_id: s.engine.update_id(),
            bids: s.engine.levels(Side::Bid, limit),
            asks: s.engine.levels(Side::Ask, limit),
        };
        (view, s.now_ms)
    }

    /// The simulated time the engine has run to.
    pub fn now_ms(&self) -> i64 {
        self.lock().now_ms
    }
}

/// All markets and the clock.
pub struct Exchange {
    pub clock: SimClock,
    pub markets: Vec<SimMarket>,
    index: HashMap<String, usize>,
}

impl Exchange {
    /// Starts every market at the clock's start time.
    pub fn new(specs: Vec<SymbolSpec>, seed: u64, clock: SimClock) -> Exchange {
        let markets: Vec<SimMarket> =
            specs.into_iter().map(|s| SimMarket::new(s, seed, clock.start_ms())).collect();
        let index = markets.iter().enumerate().map(|(i, m)| (m.spec.symbol.clone(), i)).collect();
        Exchange { clock, markets, index }
    }

    /// The market of `symbol` (exact, upper case).
    pub fn market(&self, symbol: &str) -> Option<&SimMarket> {
        self.index.get(symbol).map(|&i| &self.markets[i])
    }
}

/// A stream message before serialisation.
#[derive(Serialize)]
#[serde(untagged)]
enum Payload {
    Kline(WsKlineEvent),
    Depth(WsDepthUpdate),
    Partial(DepthBody),
    Trade(WsTrade),
    Agg(WsAggTrade),
    Ticker(WsBookTicker),
}

/// One wanted stream of a symbol this tick.
struct Want {
    key: StreamKey,
    name: StreamName,
    raw: bool,
    combined: bool,
}

/// Runs the driver until `stop` is cancelled.
pub(crate) async fn run_driver(
    ex: Arc<Exchange>,
    hub: Arc<Hub>,
    faults: Arc<Faults>,
    stop: CancellationToken,
) {
    let mut interval = tokio::time::interval(TICK);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut tick: u64 = 0;
    let mut held: HashMap<StreamKey, Frame> = HashMap::new();
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            () = stop.cancelled() => break,
        }
        tick += 1;
        let mut wants: HashMap<String, Vec<Want>> = HashMap::new();
        for (key, raw, combined) in hub.active() {
            if let Ok(name) = key.1.parse::<StreamName>() {
                wants.entry(name.symbol.clone()).or_default().push(Want {
                    key,
                    name,
                    raw,
                    combined,
                });
            }
        }
        held.retain(|k, _| wants.values().flatten().any(|w| &w.key == k));
        let now = ex.clock.now_ms();
        for m in &ex.markets {
            let w = wants.remove(&m.spec.symbol).unwrap_or_default();
            let out = produce(m, now, tick, &w);
            for (i, payload) in out {
                publish(&hub, &faults, &mut held, &w[i], &m.spec.symbol, &payload);
            }
        }
    }
}

/// Serialises and fans out one message, applying the fault plan.
fn publish(
    hub: &Hub,
    faults: &Faults,
    held: &mut HashMap<StreamKey, Frame>,
    w: &Want,
    symbol: &str,
    payload: &Payload,
) {
    let name = &w.key.1;
    let decision = faults.decide(name, class_of(&w.name.kind), symbol);
    if matches!(decision, Decision::Withhold | Decision::Fault(MessageFault::Skip)) {
        return;
    }
    let text = |combined: bool| -> Option<String> {
        if combined {
            serde_json::to_string(&Combined { stream: name.clone(), data: payload }).ok()
        } else {
            serde_json::to_string(payload).ok()
        }
    };
    let make = |malformed: bool| Frame {
        raw: w
            .raw
            .then(|| text(false))
            .flatten()
            .map(|t| if malformed { faults.malformed_text(&t) } else { t })
            .map(Into::into),
        combined: w
            .combined
            .then(|| text(true))
            .flatten()
            .map(|t| if malformed { faults.malformed_text(&t) } else { t })
            .map(Into::into),
    };
    match decision {
        Decision::Fault(MessageFault::Duplicate) => {
            let f = make(false);
            hub.publish(&w.key, &f);
            hub.publish(&w.key, &f);
        }
        Decision::Fault(MessageFault::Malformed) => {
            hub.publish(&w.key, &make(true));
        }
        Decision::Fault(MessageFault::Corrupt) => {
            let corrupted = match payload {
                Payload::Depth(ev) if matches!(w.name.kind, StreamKind::Depth { .. }) => {
                    corrupt(ev)
                }
                _ => None,
            };
            match corrupted {
                Some(ev) => {
                    let p = Payload::Depth(ev);
                    let text = |combined: bool| -> Option<Utf8Bytes> {
                        let t = if combined {
                            serde_json::to_string(&Combined { stream: name.clone(), data: &p })
                        } else {
                            serde_json::to_string(&p)
                        };
                        t.ok().map(Into::into)
                    };
                    let f = Frame {
                        raw: w.raw.then(|| text(false)).flatten(),
                        combined: w.combined.then(|| text(true)).flatten(),
                    };
                    hub.publish(&w.key, &f);
                    faults.count(Count::Corrupted, 1);
                }
                None => {
                    hub.publish(&w.key, &make(false));
                }
            }
        }
        Decision::Fault(MessageFault::Reorder) => {
            let f = make(false);
            match held.remove(&w.key) {
                Some(h) => {
                    hub.publish(&w.key, &f);
                    hub.publish(&w.key, &h);
                    faults.count(Count::Reordered, 1);
                }
                None => {
                    held.insert(w.key.clone(), f);
                }
            }
        }
        _ => {
            hub.publish(&w.key, &make(false));
            if let Some(h) = held.remove(&w.key) {
                hub.publish(&w.key, &h);
                faults.count(Count::Reordered, 1);
            }
        }
    }
}

/// A depth diff with a phantom level: one price unit (10^-8, off every tick grid, so the
/// exchange never has it and never sends it again) beyond the deepest changed bid, else ask.
/// Update ids are untouched: only a comparison with a snapshot can find the damage.
fn corrupt(ev: &WsDepthUpdate) -> Option<WsDepthUpdate> {
    let mut ev = ev.clone();
    let qty = shared::Qty::from_units(1);
    if let Some(deepest) = ev.bids.last().copied() {
        ev.bids.push(Level::new(shared::Price::from_raw(deepest.price.raw() - 1), qty));
    } else if let Some(deepest) = ev.asks.last().copied() {
        ev.asks.push(Level::new(shared::Price::from_raw(deepest.price.raw() + 1), qty));
    } else {
        return None;
    }
    Some(ev)
}

/// Advances one market to `now` and builds the messages due for its wanted streams, as
/// (index into `wants`, payload), in publishing order.
fn produce(m: &SimMarket, now: i64, tick: u64, wants: &[Want]) -> Vec<(usize, Payload)> {
    let due = |cadence_ms: u32| tick % (cadence_ms as u64 / TICK.as_millis() as u64).max(1) == 0;
    let mut s = m.lock();
    // 1. feeds: create the missing ones before advancing, drop the unused ones
    let mut cadences: Vec<u32> = wants
        .iter()
        .filter_map(|w| match w.name.kind {
            StreamKind::Depth { update_ms } => cadence(w.key.0, update_ms),
            _ => None,
        })
        .collect();
    cadences.sort_unstable();
    cadences.dedup();
    s.feeds.retain(|f| cadences.contains(&f.cadence_ms));
    for c in &cadences {
        if !s.feeds.iter().any(|f| f.cadence_ms == *c) {
            let feed = DepthFeed {
                cadence_ms: *c,
                last_u: s.engine.update_id(),
                bids: s.engine.levels(Side::Bid, usize::MAX),
                asks: s.engine.levels(Side::Ask, usize::MAX),
                touched: Vec::new(),
            };
            s.feeds.push(feed);
        }
    }
    // 2. run the engine
    let mut closed = Vec::new();
    s.trades.clear();
    s.advance(now, &mut closed);
    let st = &mut *s;
    // 3. due diffs, by cadence
    let mut deltas: Vec<(u32, DepthDelta)> = Vec::new();
    if st.feeds.iter().any(|f| due(f.cadence_ms) && f.last_u != st.engine.update_id()) {
        let bids = st.engine.levels(Side::Bid, usize::MAX);
        let asks = st.engine.levels(Side::Ask, usize::MAX);
        let u = st.engine.update_id();
        for f in st.feeds.iter_mut().filter(|f| due(f.cadence_ms) && f.last_u != u) {
            let delta = DepthDelta {
                first_id: f.last_u + 1,
                last_id: u,
                prev_last_id: Some(f.last_u),
                bids: window_levels(&st.engine, Side::Bid, &f.bids, &bids, &f.touched),
                asks: window_levels(&st.engine, Side::Ask, &f.asks, &asks, &f.touched),
                checksum: None,
            };
            f.last_u = u;
            f.bids.clone_from(&bids);
            f.asks.clone_from(&asks);
            f.touched.clear();
            deltas.push((f.cadence_ms, delta));
        }
    }
    let symbol = m.spec.symbol.as_str();
    let mut out = Vec::new();
    for (i, w) in wants.iter().enumerate() {
        let futures = w.key.0 == Flavour::Futures;
        match w.name.kind {
            StreamKind::Kline(tf) => {
                for c in &closed {
                    if tf == Timeframe::M1 {
                        out.push((i, Payload::Kline(c.ws_event(symbol, tf, true, now))));
                    } else if (c.candle.open_time + MINUTE_MS).rem_euclid(tf.duration_ms()) == 0 {
                        let b = tf.bucket_open(c.candle.open_time);
                        let mut minutes = m
                            .history
                            .candles(b, c.candle.open_time.min(m.history.end_minute_ms() - 1));
                        minutes.extend(
                            st.klines.closed_between(
                                b.max(st.klines.first_minute()),
                                c.candle.open_time,
                            ),
                        );
                        if let Some(k) = SimCandle::merge(tf, &minutes) {
                            out.push((i, Payload::Kline(k.ws_event(symbol, tf, true, now))));
                        }
                    }
                }
                if tick % KLINE_EVERY == 0 {
                    let f = *st.klines.forming();
                    let k =
                        if tf == Timeframe::M1 {
                            Some(f)
                        } else {
                            let b = tf.bucket_open(f.candle.open_time);
                            let mut minutes = m
                                .history
                                .candles(b, f.candle.open_time.min(m.history.end_minute_ms()) - 1);
                            minutes.extend(st.klines.closed_between(
                                b.max(st.klines.first_minute()),
                                f.candle.open_time,
                            ));
                            minutes.push(f);
                            SimCandle::merge(tf, &minutes)
                        };
                    if let Some(k) = k {
                        out.push((i, Payload::Kline(k.ws_event(symbol, tf, false, now))));
                    }
                }
            }
            StreamKind::Depth { update_ms } => {
                let Some(c) = cadence(w.key.0, update_ms) else { continue };
                if let Some((_, d)) = deltas.iter().find(|(dc, _)| *dc == c) {
                    let mut ev = WsDepthUpdate::from_delta(symbol, now, futures.then_some(now), d);
                    if !futures {
                        ev.prev_final_update_id = None;
                    }
                    out.push((i, Payload::Depth(ev)));
                }
            }
            StreamKind::PartialDepth { levels, update_ms } => {
                let Some(c) = cadence(w.key.0, update_ms) else { continue };
                if !due(c) {
                    continue;
                }
                let u = st.engine.update_id();
                let bids = st.engine.levels(Side::Bid, levels as usize);
                let asks = st.engine.levels(Side::Ask, levels as usize);
                if futures {
                    let d = DepthDelta {
                        first_id: u,
                        last_id: u,
                        prev_last_id: Some(u),
                        bids,
                        asks,
                        checksum: None,
                    };
                    out.push((
                        i,
                        Payload::Depth(WsDepthUpdate::from_delta(symbol, now, Some(now), &d)),
                    ));
                } else {
                    out.push((
                        i,
                        Payload::Partial(DepthBody {
                            last_update_id: u,
                            event_time: None,
                            transaction_time: None,
                            bids,
                            asks,
                        }),
                    ));
                }
            }
            StreamKind::Trade => {
                for t in &st.trades {
                    out.push((
                        i,
                        Payload::Trade(WsTrade {
                            event_type: "trade".into(),
                            event_time: t.time_ms,
                            symbol: symbol.into(),
                            trade_id: t.id,
                            price: t.price,
                            qty: t.qty,
                            trade_time: t.time_ms,
                            buyer_is_maker: t.buyer_is_maker,
                            ignore: !futures,
                        }),
                    ));
                }
            }
            StreamKind::AggTrade => {
                let mut k = 0;
                while k < st.trades.len() {
                    let first = st.trades[k];
                    let mut qty = first.qty.raw();
                    let mut last = first;
                    k += 1;
                    while let Some(t) = st.trades.get(k) {
                        if t.time_ms != first.time_ms
                            || t.price != first.price
                            || t.buyer_is_maker != first.buyer_is_maker
                        {
                            break;
                        }
                        qty += t.qty.raw();
                        last = *t;
                        k += 1;
                    }
                    st.next_agg_id += 1;
                    let agg = WsAggTrade {
                        event_type: "aggTrade".into(),
                        event_time: first.time_ms,
                        symbol: symbol.into(),
                        agg_trade_id: st.next_agg_id,
                        price: first.price,
                        qty: shared::Qty::from_raw(qty),
                        first_trade_id: first.id,
                        last_trade_id: last.id,
                        trade_time: first.time_ms,
                        buyer_is_maker: first.buyer_is_maker,
                    };
                    if st.aggs.len() == RECENT_TRADES {
                        st.aggs.pop_front();
                    }
                    st.aggs.push_back(agg.clone());
                    out.push((i, Payload::Agg(agg)));
                }
            }
            StreamKind::BookTicker => {
                let best = (
                    st.engine.levels(Side::Bid, 1).first().copied(),
                    st.engine.levels(Side::Ask, 1).first().copied(),
                );
                if st.last_ticker == Some(best) {
                    continue;
                }
                st.last_ticker = Some(best);
                let (Some(b), Some(a)) = best else { continue };
                out.push((
                    i,
                    Payload::Ticker(WsBookTicker {
                        event_type: futures.then(|| "bookTicker".to_string()),
                        update_id: st.engine.update_id(),
                        symbol: symbol.into(),
                        bid_price: b.price,
                        bid_qty: b.qty,
                        ask_price: a.price,
                        ask_qty: a.qty,
                        transaction_time: futures.then_some(now),
                        event_time: futures.then_some(now),
                    }),
                ));
            }
        }
    }
    out
}

/// The closed 1m klines as plain candles (the oracle).
pub fn plain(candles: &[SimCandle]) -> Vec<Candle> {
    candles.iter().map(|c| c.candle).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::{Price, Qty};

    fn lv(p: i64, q: i64) -> Level {
        Level::new(Price::from_units(p), Qty::from_units(q))
    }

    #[test]
    fn diffs_list_changed_added_and_removed_levels() {
        let old = [lv(10, 1), lv(9, 1), lv(7, 2)];
        let new = [lv(11, 1), lv(10, 1), lv(8, 3), lv(7, 5)];
        assert_eq!(diff_levels(&old, &new, true), vec![lv(11, 1), lv(9, 0), lv(8, 3), lv(7, 5)]);
        let old = [lv(1, 1), lv(3, 1)];
        let new = [lv(2, 1), lv(3, 2)];
        assert_eq!(diff_levels(&old, &new, false), vec![lv(1, 0), lv(2, 1), lv(3, 2)]);
        assert!(diff_levels(&new, &new, false).is_empty());
    }

    #[test]
    fn rest_klines_selection() {
        let start = 1_750_000_000_000 + 30_000;
        let ex = Exchange::new(
            vec![SymbolSpec::by_name("BTCUSDT").unwrap()],
            5,
            SimClock::new(start, 0.0),
        );
        let m = ex.market("BTCUSDT").unwrap();
        let live_first = start - start % MINUTE_MS;
        // neither: newest `limit`, the last one forming (the live start minute)
        let k = m.klines(Timeframe::M1, None, None, 5);
        assert_eq!(k.len(), 5);
        assert_eq!(k.last().unwrap().candle.open_time, live_first);
        // start: oldest first from it (inclusive when on a boundary)
        let k = m.klines(Timeframe::M1, Some(live_first - 10 * MINUTE_MS), None, 3);
        assert_eq!(
            k.iter().map(|c| c.candle.open_time).collect::<Vec<_>>(),
            (0..3).map(|i| live_first - (10 - i) * MINUTE_MS).collect::<Vec<_>>()
        );
        // start mid-minute: the next minute
        let k = m.klines(Timeframe::M1, Some(live_first - 10 * MINUTE_MS + 1), None, 1);
        assert_eq!(k[0].candle.open_time, live_first - 9 * MINUTE_MS);
        // end only: newest up to it
        let k = m.klines(Timeframe::M5, None, Some(live_first - 1), 2);
        assert_eq!(k.len(), 2);
        assert!(
            k[1].candle.open_time < live_first
                && k[1].candle.open_time + 5 * MINUTE_MS > live_first - 1
        );
        assert_eq!(k[1].candle.open_time - k[0].candle.open_time, 5 * MINUTE_MS);
        // derived = merge of the 1m
        let ones = m.klines(
            Timeframe::M1,
            Some(k[0].candle.open_time),
            Some(k[0].candle.open_time + 4 * MINUTE_MS),
            1000,
        );
        assert_eq!(ones.len(), 5);
        assert_eq!(Some(k[0]), SimCandle::merge(Timeframe::M5, &ones));
        // before the listing, nothing; start after end, nothing
        assert!(m.klines(Timeframe::M1, Some(0), Some(1_000), 10).is_empty());
        assert_eq!(m.klines(Timeframe::M1, Some(0), None, 1)[0].candle.open_time, m.spec.listed_ms);
        assert!(m.klines(Timeframe::M1, Some(live_first + MINUTE_MS), None, 10).is_empty());
        // 1d over a long range stays cheap enough and aligned
        let d = m.klines(Timeframe::D1, None, None, 30);
        assert_eq!(d.len(), 30);
        assert!(d.iter().all(|c| c.candle.open_time % 86_400_000 == 0));
        assert_eq!(
            d.last().unwrap().candle.close,
            m.klines(Timeframe::M1, None, None, 1)[0].candle.close
        );
    }
}
