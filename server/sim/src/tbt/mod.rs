//! The simulator's tick-by-tick feed: 40 A-share-like stocks (the seed's MockDataFeed), each with
//! its own matching book ([`book::StockSim`]) and participants, published order by order on a
//! binary WebSocket with REST snapshot / oracle / replay / control ([`routes`]).
//!
//! ## Symbols, venues, channels
//! Symbol `i` (0..40) is `600` + `i` as three digits for even `i` (Shanghai, [`Venue::Sse`]) and
//! `000` + `i` for odd `i` (Shenzhen, [`Venue::Szse`]): `600000, 000001, 600002, …`. Each symbol
//! publishes on **its own channel `1000 + i`**, so the channel's sequence number is the symbol's:
//! contiguous from 1, one per message. A real exchange multiplexes many stocks per channel; one
//! channel per symbol keeps every per-symbol gap a real, detectable loss (no holes to excuse) and
//! lets a consumer resync one symbol from its snapshot without touching the others.
//!
//! ## Pace
//! A generator thread wakes every [`TbtConfig::tick`] and lets each symbol produce the messages
//! its rate allows for the elapsed time (`base_rate` messages/s, times `hot_factor` while the
//! symbol is a hot spot — the seed's `SetHotSpot`, x2000). The *content* of each symbol's stream is
//! deterministic for a seed (its own RNG, stepped once per action); the wall clock only decides
//! how far the stream has got. Paused, nothing is generated.
//!
//! ## Truth and consistency
//! All state sits behind one mutex taken once per tick: generation, the history ring, the wire
//! fan-out, and every snapshot / oracle read. So a snapshot or `/tbt/book` always reflects exactly
//! the events up to the seq it names, and every event up to that seq has already been queued to
//! every connected client.
//!
//! ## Slow clients, drops
//! Each client has a bounded queue of frames ([`TbtConfig::client_queue`]); when it is full the
//! generator unsubscribes the client and flags it lagging, and its session closes with 4000
//! `lagging` — the generator never waits for a client. A `drop` control skips the next N events
//! of a symbol *on the wire only* (history and truth keep them), so clients see a seq gap that
//! `/tbt/replay` or `/tbt/snapshot` can repair.

pub mod book;
pub mod routes;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use shared::l3::{Msg, Venue};
use shared::{Price, Side};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use book::{StockSim, TICK_RAW};
use tbt::{wire, FeedEvent, SymbolStatus, TbtSnapshot, TbtStatus, TbtSymbol, TrueBook};

use crate::symbols::derive_seed;

/// Configuration of the tick-by-tick feed.
#[derive(Debug, Clone)]
pub struct TbtConfig {
    /// Start the generator with the simulator.
    pub enabled: bool,
    /// Seed of every stock's participants and reference price.
    pub seed: u64,
    /// Number of stocks (the seed's mock feed: 40).
    pub symbols: usize,
    /// Messages per second and symbol.
    pub base_rate: f64,
    /// Rate multiplier of a hot spot (the seed: 2000).
    pub hot_factor: f64,
    /// Messages kept per symbol for `/tbt/replay`.
    pub history: usize,
    /// Frames a client may have queued before it is disconnected as lagging.
    pub client_queue: usize,
    /// Generator period.
    pub tick: Duration,
    /// Most events in one binary frame.
    pub max_frame_events: usize,
    /// A WebSocket send slower than this drops the client.
    pub send_timeout: Duration,
}

impl Default for TbtConfig {
    fn default() -> Self {
        TbtConfig {
            enabled: true,
            seed: 1,
            symbols: 40,
            base_rate: 20.0,
            hot_factor: 2000.0,
            history: 20_000,
            client_queue: 4_096,
            tick: Duration::from_millis(10),
            max_frame_events: 4_096,
            send_timeout: Duration::from_secs(5),
        }
    }
}

/// A bad request to the feed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TbtError {
    #[error("unknown tick-by-tick symbol {0:?}")]
    UnknownSymbol(String),
    #[error("events before seq {first} of {symbol} are no longer kept (asked from {from})")]
    Gone { symbol: String, from: u64, first: u64 },
    #[error("bad range: from {from} to {to}")]
    BadRange { from: u64, to: u64 },
}

/// The name of stock `i`: `600000, 000001, 600002, …`.
pub fn symbol_name(i: usize) -> String {
    format!("{}{:03}", if i % 2 == 0 { "600" } else { "000" }, i)
}

struct Stock {
    info: TbtSymbol,
    sim: StockSim,
    seq: u64,
    hot: bool,
    /// Messages owed by the rate but not produced yet (fractional).
    credit: f64,
    drop_left: u64,
    dropped: u64,
    /// The last `history` messages; the front one has seq `history_first`.
    history: VecDeque<Msg>,
    history_first: u64,
}

struct Sub {
    id: u64,
    /// Wanted symbol indices (`None`: all).
    want: Option<Vec<bool>>,
    tx: mpsc::Sender<Bytes>,
    lagged: Arc<AtomicBool>,
}

struct State {
    stocks: Vec<Stock>,
    paused: bool,
    last: Instant,
    subs: Vec<Sub>,
    next_sub: u64,
    lagging_drops: u64,
    scratch: Vec<Msg>,
    wire: Vec<FeedEvent>,
}

struct Shared {
    config: TbtConfig,
    state: Mutex<State>,
    /// Cancelled when the feed stops ([`TbtHandle::stop`], or the simulator's shutdown).
    stop: CancellationToken,
}

/// The running feed: a cheap handle (an `Arc`) for the routes, the simulator handle and tests.
#[derive(Clone)]
pub struct TbtHandle {
    shared: Arc<Shared>,
}

/// One client's stream of encoded frames. Dropping it unsubscribes.
pub struct TbtSubscription {
    pub symbols: Vec<TbtSymbol>,
    pub rx: mpsc::Receiver<Bytes>,
    /// Set when the generator gave up on this client (its queue was full).
    pub lagged: Arc<AtomicBool>,
    id: u64,
    handle: TbtHandle,
}

impl Drop for TbtSubscription {
    fn drop(&mut self) {
        self.handle.lock().subs.retain(|s| s.id != self.id);
    }
}

impl TbtHandle {
    /// Builds the stocks (each opens its book: its first messages, seq 1..) and, when enabled,
    /// starts the generator thread (tracked by `tasks`), which ends when `stop` is cancelled or
    /// [`Self::stop`] is called.
    pub fn start(
        config: TbtConfig,
        stop: CancellationToken,
        tasks: &TaskTracker,
    ) -> anyhow::Result<TbtHandle> {
        if !(config.base_rate.is_finite() && config.base_rate >= 0.0) {
            anyhow::bail!("tbt base_rate must be a non-negative number, got {}", config.base_rate);
        }
        if !(config.hot_factor.is_finite() && config.hot_factor >= 1.0) {
            anyhow::bail!("tbt hot_factor must be at least 1, got {}", config.hot_factor);
        }
        if config.symbols > 1000
            || config.history == 0
            || config.client_queue == 0
            || config.max_frame_events == 0
        {
            anyhow::bail!("tbt: symbols must be at most 1000, history, client_queue and max_frame_events positive");
        }
        let mut stocks = Vec::with_capacity(config.symbols);
        for i in 0..config.symbols {
            let name = symbol_name(i);
            let venue = if i % 2 == 0 { Venue::Sse } else { Venue::Szse };
            // reference price 3.00 .. 50.00, on the tick
            let reference = 300 + (derive_seed(config.seed, &name, &[70]) % 4_700) as i64;
            let mut sim = StockSim::new(
                venue,
                derive_seed(config.seed, &name, &[71]),
                Price::from_raw(reference * TICK_RAW),
            );
            let mut opening = Vec::new();
            sim.open(&mut opening);
            let info = TbtSymbol { idx: i as u32, symbol: name, venue, channel: 1000 + i as u32 };
            let mut s = Stock {
                info,
                sim,
                seq: 0,
                hot: false,
                credit: 0.0,
                drop_left: 0,
                dropped: 0,
                history: VecDeque::with_capacity(config.history),
                history_first: 1,
            };
            for m in opening {
                s.record(m, config.history);
            }
            stocks.push(s);
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                stocks,
                paused: false,
                last: Instant::now(),
                subs: Vec::new(),
                next_sub: 1,
                lagging_drops: 0,
                scratch: Vec::new(),
                wire: Vec::new(),
            }),
            stop,
            config,
        });
        let handle = TbtHandle { shared };
        if handle.shared.config.enabled {
            let h = handle.clone();
            let alive = tasks.token();
            std::thread::Builder::new()
                .name("sim-tbt".into())
                .spawn(move || {
                    let _alive = alive;
                    h.run();
                })
                .map_err(|e| {
                    anyhow::anyhow!("cannot start the tick-by-tick generator thread: {e}")
                })?;
        }
        Ok(handle)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn config(&self) -> &TbtConfig {
        &self.shared.config
    }

    fn run(self) {
        let tick = self.shared.config.tick;
        self.lock().last = Instant::now();
        loop {
            std::thread::sleep(tick);
            if self.shared.stop.is_cancelled() {
                self.lock().subs.clear(); // sessions see their queue close
                return;
            }
            self.tick(Instant::now());
        }
    }

    /// One generator period: produce what the rates allow up to `now`, then send it.
    fn tick(&self, now: Instant) {
        let cfg = &self.shared.config;
        let mut guard = self.lock();
        let st = &mut *guard;
        let dt = now.saturating_duration_since(st.last).as_secs_f64().min(1.0);
        st.last = now;
        if st.paused {
            return;
        }
        st.wire.clear();
        for s in &mut st.stocks {
            let rate = if s.hot { cfg.base_rate * cfg.hot_factor } else { cfg.base_rate };
            s.credit += rate * dt;
            while s.credit >= 1.0 {
                st.scratch.clear();
                s.sim.step(&mut st.scratch);
                // an action that published nothing still costs one, so the loop always ends
                s.credit -= st.scratch.len().max(1) as f64;
                for &m in &st.scratch {
                    let seq = s.record(m, cfg.history);
                    if s.drop_left > 0 {
                        s.drop_left -= 1;
                        s.dropped += 1;
                    } else {
                        st.wire.push(FeedEvent {
                            symbol: s.info.idx,
                            channel: s.info.channel,
                            seq,
                            msg: m,
                        });
                    }
                }
            }
        }
        if st.wire.is_empty() || st.subs.is_empty() {
            return;
        }
        let sent_us = tbt::wall_clock_us();
        let all: Vec<Bytes> = if st.subs.iter().any(|s| s.want.is_none()) {
            frames(st.wire.iter(), cfg.max_frame_events, sent_us)
        } else {
            Vec::new()
        };
        let mut lagged = 0;
        st.subs.retain(|sub| {
            let mine;
            let frames_for = match &sub.want {
                None => &all,
                Some(w) => {
                    mine = frames(
                        st.wire.iter().filter(|e| w[e.symbol as usize]),
                        cfg.max_frame_events,
                        sent_us,
                    );
                    &mine
                }
            };
            for f in frames_for {
                match sub.tx.try_send(f.clone()) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        sub.lagged.store(true, Ordering::Relaxed);
                        lagged += 1;
                        return false;
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => return false,
                }
            }
            true
        });
        if lagged > 0 {
            st.lagging_drops += lagged;
            tracing::info!(lagged, "tick-by-tick clients dropped for falling behind");
        }
    }

    /// Stops the generator thread (clients' queues close).
    pub fn stop(&self) {
        self.shared.stop.cancel();
    }

    /// The symbols, in index order.
    pub fn symbols(&self) -> Vec<TbtSymbol> {
        self.lock().stocks.iter().map(|s| s.info.clone()).collect()
    }

    fn find(st: &State, symbol: &str) -> Result<usize, TbtError> {
        st.stocks
            .iter()
            .position(|s| s.info.symbol == symbol)
            .ok_or_else(|| TbtError::UnknownSymbol(symbol.into()))
    }

    /// Subscribes to the frames of `symbols` (all when `None`). Unknown names are an error.
    pub fn subscribe(&self, symbols: Option<&[String]>) -> Result<TbtSubscription, TbtError> {
        let mut st = self.lock();
        let (want, infos) = match symbols {
            None => (None, st.stocks.iter().map(|s| s.info.clone()).collect()),
            Some(names) => {
                let mut want = vec![false; st.stocks.len()];
                let mut infos = Vec::new();
                for n in names {
                    let i = Self::find(&st, n)?;
                    if !want[i] {
                        want[i] = true;
                        infos.push(st.stocks[i].info.clone());
                    }
                }
                (Some(want), infos)
            }
        };
        let (tx, rx) = mpsc::channel(self.shared.config.client_queue);
        let lagged = Arc::new(AtomicBool::new(false));
        let id = st.next_sub;
        st.next_sub += 1;
        if !self.shared.stop.is_cancelled() {
            st.subs.push(Sub { id, want, tx, lagged: lagged.clone() });
        }
        Ok(TbtSubscription { symbols: infos, rx, lagged, id, handle: self.clone() })
    }

    /// Makes `symbol` a hot spot (its rate times `hot_factor`) or a normal stock again.
    pub fn set_hot(&self, symbol: &str, hot: bool) -> Result<(), TbtError> {
        let mut st = self.lock();
        let i = Self::find(&st, symbol)?;
        st.stocks[i].hot = hot;
        tracing::info!(symbol, hot, "tick-by-tick hot spot");
        Ok(())
    }

    /// Pauses or resumes generation. When this returns, every event generated so far is queued
    /// to every client and no further one will be until resumed.
    pub fn pause(&self, paused: bool) {
        let mut st = self.lock();
        st.paused = paused;
        st.last = Instant::now();
    }

    pub fn is_paused(&self) -> bool {
        self.lock().paused
    }

    /// Skips the next `count` events of `symbol` on the wire (history and truth keep them).
    pub fn drop_events(&self, symbol: &str, count: u64) -> Result<(), TbtError> {
        let mut st = self.lock();
        let i = Self::find(&st, symbol)?;
        st.stocks[i].drop_left += count;
        Ok(())
    }

    pub fn status(&self) -> TbtStatus {
        let cfg = &self.shared.config;
        let st = self.lock();
        TbtStatus {
            paused: st.paused,
            clients: st.subs.len(),
            lagging_drops: st.lagging_drops,
            history: cfg.history,
            symbols: st
                .stocks
                .iter()
                .map(|s| SymbolStatus {
                    idx: s.info.idx,
                    symbol: s.info.symbol.clone(),
                    venue: s.info.venue,
                    channel: s.info.channel,
                    rate: if s.hot { cfg.base_rate * cfg.hot_factor } else { cfg.base_rate },
                    hot: s.hot,
                    seq: s.seq,
                    dropping: s.drop_left,
                    dropped: s.dropped,
                })
                .collect(),
        }
    }

    /// Every resting order of `symbol` and the seq they reflect, taken atomically.
    pub fn snapshot(&self, symbol: &str) -> Result<TbtSnapshot, TbtError> {
        let st = self.lock();
        let s = &st.stocks[Self::find(&st, symbol)?];
        Ok(TbtSnapshot {
            symbol: s.info.symbol.clone(),
            idx: s.info.idx,
            venue: s.info.venue,
            channel_last_seq: vec![(s.info.channel, s.seq)],
            orders: s.sim.orders(),
        })
    }

    /// The true aggregated book (best `levels` per side) and the seq it reflects: the oracle.
    pub fn book(&self, symbol: &str, levels: usize) -> Result<TrueBook, TbtError> {
        let st = self.lock();
        let s = &st.stocks[Self::find(&st, symbol)?];
        Ok(TrueBook {
            symbol: s.info.symbol.clone(),
            seq: s.seq,
            bids: s.sim.levels(Side::Bid, levels),
            asks: s.sim.levels(Side::Ask, levels),
        })
    }

    /// The kept events of `symbol` with seq in `[from, to]` (`to` is capped at the last seq and
    /// at `from + max - 1`). Older than the ring: [`TbtError::Gone`].
    pub fn replay(
        &self,
        symbol: &str,
        from: u64,
        to: u64,
        max: usize,
    ) -> Result<Vec<FeedEvent>, TbtError> {
        if from == 0 || from > to {
            return Err(TbtError::BadRange { from, to });
        }
        let st = self.lock();
        let s = &st.stocks[Self::find(&st, symbol)?];
        if from < s.history_first {
            return Err(TbtError::Gone { symbol: symbol.into(), from, first: s.history_first });
        }
        let to = to.min(s.seq).min(from.saturating_add(max as u64).saturating_sub(1));
        if from > to {
            return Ok(Vec::new());
        }
        let skip = (from - s.history_first) as usize;
        let n = (to - from + 1) as usize;
        Ok(s.history
            .iter()
            .skip(skip)
            .take(n)
            .enumerate()
            .map(|(k, &msg)| FeedEvent {
                symbol: s.info.idx,
                channel: s.info.channel,
                seq: from + k as u64,
                msg,
            })
            .collect())
    }
}

impl Stock {
    /// Gives `m` the next seq and keeps it in the history ring; returns the seq.
    fn record(&mut self, m: Msg, cap: usize) -> u64 {
        self.seq += 1;
        if cap == 0 {
            self.history_first = self.seq + 1;
            return self.seq;
        }
        // make room first: the ring never holds more than `cap`, so its buffer (allocated for
        // exactly `cap`) never grows, and the memory it touches stops growing once it is full
        if self.history.len() >= cap {
            self.history.pop_front();
            self.history_first += 1;
        }
        self.history.push_back(m);
        self.seq
    }
}

/// Encodes `events` into frames of at most `max` events.
fn frames<'a>(events: impl Iterator<Item = &'a FeedEvent>, max: usize, sent_us: u64) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut buf = Vec::new();
    let mut n = 0u32;
    for e in events {
        if n == 0 {
            wire::begin(&mut buf, sent_us);
        }
        wire::push_event(&mut buf, e);
        n += 1;
        if n as usize == max {
            wire::finish(&mut buf, n);
            out.push(Bytes::from(std::mem::take(&mut buf)));
            n = 0;
        }
    }
    if n > 0 {
        wire::finish(&mut buf, n);
        out.push(Bytes::from(buf));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> TbtConfig {
        TbtConfig { enabled: false, ..TbtConfig::default() }
    }

    #[test]
    fn names_venues_channels() {
        let h = TbtHandle::start(cfg(), CancellationToken::new(), &TaskTracker::new()).unwrap();
        let s = h.symbols();
        assert_eq!(s.len(), 40);
        assert_eq!((s[0].symbol.as_str(), s[0].venue, s[0].channel), ("600000", Venue::Sse, 1000));
        assert_eq!((s[1].symbol.as_str(), s[1].venue, s[1].channel), ("000001", Venue::Szse, 1001));
        assert_eq!(s[38].symbol, "600038");
        assert_eq!(s[39].symbol, "000039");
        // every book opened with its first messages
        assert!(h.status().symbols.iter().all(|x| x.seq > 100));
    }

    /// Ticks driven by hand: seqs contiguous, rates as configured, hot spot x factor, drops only
    /// on the wire, replay returns the history, snapshot is consistent with the stream.
    #[test]
    fn generation_fanout_drop_replay() {
        let h = TbtHandle::start(
            TbtConfig { symbols: 4, history: 1_000_000, ..cfg() },
            CancellationToken::new(),
            &TaskTracker::new(),
        )
        .unwrap();
        let mut sub = h.subscribe(None).unwrap();
        let mut only1 = h.subscribe(Some(&["000001".to_string()])).unwrap();
        assert_eq!(only1.symbols.len(), 1);
        assert!(h.subscribe(Some(&["999999".to_string()])).is_err());
        let start: Vec<u64> = h.status().symbols.iter().map(|s| s.seq).collect();
        h.set_hot("600002", true).unwrap();
        h.drop_events("000001", 3).unwrap();
        let t0 = h.lock().last;
        for k in 1..=100 {
            h.tick(t0 + Duration::from_millis(10 * k));
        }
        let st = h.status();
        let produced: Vec<u64> = st.symbols.iter().zip(&start).map(|(s, a)| s.seq - a).collect();
        // 1 s at 20/s: 20 (+ at most one action's extra messages); hot: 40,000
        assert!((20..30).contains(&produced[0]), "{produced:?}");
        assert!((39_900..40_100).contains(&produced[2]), "{produced:?}");
        assert_eq!(st.symbols[1].dropped, 3);
        let mut got: Vec<FeedEvent> = Vec::new();
        while let Ok(f) = sub.rx.try_recv() {
            wire::decode(&f, &mut got).unwrap();
        }
        for i in 0..4u32 {
            let seqs: Vec<u64> = got.iter().filter(|e| e.symbol == i).map(|e| e.seq).collect();
            let want: Vec<u64> = if i == 1 {
                (start[1] + 4..=st.symbols[1].seq).collect() // the first 3 were dropped on the wire
            } else {
                (start[i as usize] + 1..=st.symbols[i as usize].seq).collect()
            };
            assert_eq!(seqs, want, "symbol {i}");
        }
        let mut one = Vec::new();
        while let Ok(f) = only1.rx.try_recv() {
            wire::decode(&f, &mut one).unwrap();
        }
        assert!(one.iter().all(|e| e.symbol == 1 && e.channel == 1001));
        // the dropped events are in the history
        let r = h.replay("000001", start[1] + 1, start[1] + 3, 100).unwrap();
        assert_eq!(
            r.iter().map(|e| e.seq).collect::<Vec<_>>(),
            vec![start[1] + 1, start[1] + 2, start[1] + 3]
        );
        let r2 = h.replay("000001", start[1] + 4, u64::MAX, 100_000).unwrap();
        assert_eq!(r2, one);
        // an L3 book fed replay-from-1 equals the snapshot's orders and the oracle
        let full = h.replay("600002", 1, u64::MAX, usize::MAX).unwrap();
        let mut book = shared::l3::L3Book::new(Venue::Sse);
        for e in &full {
            book.handle(e.channel, e.seq, e.msg).unwrap();
        }
        let snap = h.snapshot("600002").unwrap();
        assert_eq!(snap.channel_last_seq, vec![(1002, full.last().unwrap().seq)]);
        let mut mine: Vec<_> = book.orders().collect();
        mine.sort_unstable_by_key(|(id, _)| *id);
        assert_eq!(mine, snap.orders);
        let truth = h.book("600002", 10).unwrap();
        assert_eq!(book.top(10), (truth.bids, truth.asks));
        assert!(matches!(h.replay("600002", 0, 5, 10), Err(TbtError::BadRange { .. })));
        // pause: nothing more
        h.pause(true);
        let before = h.status().symbols[0].seq;
        h.tick(t0 + Duration::from_secs(5));
        assert_eq!(h.status().symbols[0].seq, before);
    }

    #[test]
    fn history_ring_forgets_old_events_and_lagging_clients_are_dropped() {
        let h = TbtHandle::start(
            TbtConfig { symbols: 1, history: 50, client_queue: 2, max_frame_events: 1, ..cfg() },
            CancellationToken::new(),
            &TaskTracker::new(),
        )
        .unwrap();
        let sub = h.subscribe(None).unwrap();
        let t0 = h.lock().last;
        h.tick(t0 + Duration::from_secs(1));
        let seq = h.status().symbols[0].seq;
        assert!(
            matches!(h.replay("600000", 1, 10, 10), Err(TbtError::Gone { first, .. }) if first == seq - 49)
        );
        assert_eq!(h.replay("600000", seq - 49, seq, 100).unwrap().len(), 50);
        assert!(sub.lagged.load(Ordering::Relaxed), "20 one-event frames into a queue of 2");
        assert_eq!(h.status().clients, 0);
        assert_eq!(h.status().lagging_drops, 1);
    }
}
