//! Tick-by-tick books in the service: tick-by-tick sources → the sharded engine
//! ([`crate::l3engine`]) → the [`BookRegistry`], which publishes them to clients.
//!
//! One **feed thread** per source converts the source's events into engine events and hands them
//! to the engine's dispatcher thread (a bounded channel: a slow engine pushes back on the feed,
//! never drops). It also runs the **recovery** after a sequence gap, which must not lose events
//! that arrive while it runs:
//! 1. the shard that finds the gap marks the book stale (never published as fresh) and tells the
//!    feed thread (through [`L3Output::on_gap`]);
//! 2. the feed thread starts **holding** the symbol's new events, then asks the source for a
//!    snapshot. Every event it passed on before holding was generated before the snapshot was
//!    taken, so the snapshot covers it; every later one is held;
//! 3. with the snapshot, it sends the engine a reset (in order with the data: the dispatcher
//!    drains control requests before each batch), then the held events newer than the snapshot.
//!
//! The same hold-then-snapshot start happens for every symbol whenever the stream (re)connects: a
//! stream starts wherever the source is, so a book is only right from a snapshot on.
//!
//! The simulator's books are always on: they need no subscription lease.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shared::l3::{L3Book, SeqGap, SeqPolicy, Venue};
use shared::protocol::{InstrumentId, Market};
use shared::Price;
use tokio::sync::mpsc;

use super::{BookHealth, BookPublisher, BookRegistry, BookStatus};
use crate::l3engine::{self, BookOutput, Engine, EngineConfig, EngineHandle, L3Snapshot, SymbolIdx, TickEvent};
use crate::tbt::feed::{FeedConfig, FeedItem, TbtFeed, TbtRest};
use crate::tbt::{FeedEvent, TbtSnapshot};

/// `[l3]`: the tick-by-tick books.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct L3Config {
    /// Rebuild the books of every `sim` source's tick-by-tick feed (`/tbt/ws`).
    pub sim_feeds: bool,
    /// The sharded engine: shards, publish interval, auto-balance and its thresholds.
    pub engine: EngineConfig,
    /// Event batches queued for the dispatcher before feeds wait.
    pub queue_batches: usize,
    /// Most events held for one symbol while its recovery runs; beyond it the oldest are dropped
    /// (and the recovery starts over).
    pub max_held_events: usize,
    /// Recorded tick-by-tick days replayed into the engine (`[[l3.replay]]`).
    pub replay: Vec<ReplaySourceConfig>,
}

/// `[[l3.replay]]`: Shanghai tick-by-tick files (逐笔委托 + 逐笔成交, CSV / .gz / .zip) replayed
/// into the engine as a live source; books are `{name}:stock:{SecurityID}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReplaySourceConfig {
    /// Source name in instrument ids.
    pub name: String,
    pub orders: PathBuf,
    pub trades: PathBuf,
    /// Price tick the float-printed prices are snapped to.
    pub tick: String,
    /// MDTime seconds per wall-clock second (1 = the original pace); 0 = as fast as possible.
    pub speed: f64,
}

impl Default for ReplaySourceConfig {
    fn default() -> Self {
        Self { name: "sse".into(), orders: PathBuf::new(), trades: PathBuf::new(), tick: "0.01".into(), speed: 1.0 }
    }
}

impl L3Config {
    /// Names the first bad value.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.engine.validate().map_err(|e| anyhow::anyhow!("configuration key `l3.engine`: {e}"))?;
        for (i, r) in self.replay.iter().enumerate() {
            let key = format!("l3.replay[{i}]");
            if r.name.is_empty() || r.name.contains([':', '@', ',', '/', ' ']) {
                anyhow::bail!("configuration key `{key}.name`: {:?} must be non-empty and free of `:@,/ `", r.name);
            }
            if !(r.speed.is_finite() && r.speed >= 0.0) {
                anyhow::bail!("configuration key `{key}.speed`: must be 0 (as fast as possible) or positive, got {}", r.speed);
            }
            if Price::parse(&r.tick).map_or(true, |t| t.raw() <= 0) {
                anyhow::bail!("configuration key `{key}.tick`: {:?} is not a positive decimal", r.tick);
            }
            for (k, p) in [("orders", &r.orders), ("trades", &r.trades)] {
                if !p.is_file() {
                    anyhow::bail!("configuration key `{key}.{k}`: {} is not a file", p.display());
                }
            }
        }
        Ok(())
    }
}

impl Default for L3Config {
    fn default() -> Self {
        Self {
            sim_feeds: true,
            engine: EngineConfig { auto_balance: true, ..EngineConfig::default() },
            queue_batches: 4096,
            max_held_events: 2_000_000,
            replay: Vec::new(),
        }
    }
}

/// Counters of one tick-by-tick source, for ops and metrics.
#[derive(Debug, Default)]
pub struct FeedCounters {
    pub events: AtomicU64,
    pub unknown_symbol: AtomicU64,
    /// Snapshots taken because the stream (re)connected.
    pub connect_snapshots: AtomicU64,
    /// Snapshots taken to recover from a sequence gap.
    pub recoveries: AtomicU64,
    pub recovery_failures: AtomicU64,
    pub held_dropped: AtomicU64,
    /// A replay source has sent everything.
    pub done: AtomicBool,
}

/// One tick-by-tick source.
pub struct L3Source {
    pub name: String,
    /// The simulator's REST client (snapshots, hot-spot control).
    pub rest: Option<TbtRest>,
    pub counters: Arc<FeedCounters>,
    feed: Option<TbtFeed>,
    /// Tells a feed thread to end (see [`L3Books::stop`]).
    control: Option<mpsc::UnboundedSender<Input>>,
    /// Tells a replay thread to end.
    stop: Arc<AtomicBool>,
}

/// The running tick-by-tick books.
pub struct L3Books {
    pub handle: EngineHandle,
    engine: Mutex<Option<Engine>>,
    pub sources: Vec<L3Source>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl L3Books {
    /// Starts the engine and one feed per `(source name, simulator base URL)`.
    pub fn start(config: &L3Config, registry: Arc<BookRegistry>, sims: &[(String, String)]) -> anyhow::Result<Arc<Self>> {
        let mut engine = Engine::start(config.engine.clone())?;
        let handle = engine.handle();
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<TickEvent>>(config.queue_batches.max(1));
        engine.spawn_dispatcher(rx)?;
        let mut sources = Vec::new();
        let mut threads = Vec::new();
        for (name, base) in sims {
            let (feed, feed_rx) = TbtFeed::start(FeedConfig::new(base.clone()));
            let counters = Arc::new(FeedCounters::default());
            let ctx = FeedThread {
                source: name.clone(),
                engine: handle.clone(),
                registry: registry.clone(),
                tx: tx.clone(),
                rest: feed.rest().clone(),
                counters: counters.clone(),
                max_held: config.max_held_events,
                runtime: tokio::runtime::Handle::current(),
            };
            let (thread, control) = ctx.spawn(feed_rx)?;
            threads.push(thread);
            sources.push(L3Source {
                name: name.clone(),
                rest: Some(feed.rest().clone()),
                counters,
                feed: Some(feed),
                control: Some(control),
                stop: Arc::default(),
            });
        }
        for r in &config.replay {
            let counters = Arc::new(FeedCounters::default());
            let stop = Arc::new(AtomicBool::new(false));
            let ctx = ReplayThread {
                config: r.clone(),
                engine: handle.clone(),
                registry: registry.clone(),
                tx: tx.clone(),
                counters: counters.clone(),
                stop: stop.clone(),
            };
            threads.push(std::thread::Builder::new().name(format!("l3-replay-{}", r.name)).spawn(move || ctx.run())?);
            sources.push(L3Source { name: r.name.clone(), rest: None, counters, feed: None, control: None, stop });
        }
        Ok(Arc::new(Self { handle, engine: Mutex::new(Some(engine)), sources, threads: Mutex::new(threads) }))
    }

    /// The simulator REST client serving `instrument`'s tick-by-tick feed.
    pub fn sim_rest(&self, instrument: &InstrumentId) -> Option<&TbtRest> {
        self.sources.iter().find(|s| s.name == instrument.exchange).and_then(|s| s.rest.as_ref())
    }

    /// Stops the feeds and their threads, then the engine (which owns the books' outputs, whose
    /// gap senders would otherwise keep the feed threads waiting).
    pub async fn stop(&self) {
        for s in &self.sources {
            if let Some(f) = &s.feed {
                f.stop().await;
            }
            if let Some(c) = &s.control {
                let _ = c.send(Input::Stop);
            }
            s.stop.store(true, Relaxed);
        }
        let threads: Vec<_> = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        let engine = self.engine.lock().unwrap_or_else(|e| e.into_inner()).take();
        tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
            if let Some(e) = engine {
                e.shutdown();
            }
        })
        .await
        .ok();
    }
}

/// What the feed thread reacts to, in arrival order.
enum Input {
    Feed(FeedItem),
    /// A shard found a gap in this symbol.
    Gap(SymbolIdx),
    /// The source's snapshot for a recovery.
    Snapshot(SymbolIdx, Result<TbtSnapshot, String>),
    /// End the thread.
    Stop,
}

struct FeedThread {
    source: String,
    engine: EngineHandle,
    registry: Arc<BookRegistry>,
    tx: SyncSender<Vec<TickEvent>>,
    rest: TbtRest,
    counters: Arc<FeedCounters>,
    max_held: usize,
    runtime: tokio::runtime::Handle,
}

/// A symbol of the feed, as registered with the engine.
struct Known {
    engine_idx: SymbolIdx,
    name: String,
}

impl FeedThread {
    fn spawn(
        self,
        mut feed_rx: mpsc::Receiver<FeedItem>,
    ) -> anyhow::Result<(std::thread::JoinHandle<()>, mpsc::UnboundedSender<Input>)> {
        let (input_tx, input_rx) = mpsc::unbounded_channel::<Input>();
        let pump_tx = input_tx.clone();
        self.runtime.spawn(async move {
            while let Some(item) = feed_rx.recv().await {
                if pump_tx.send(Input::Feed(item)).is_err() {
                    return;
                }
            }
        });
        let name = format!("l3-feed-{}", self.source);
        let control = input_tx.clone();
        Ok((std::thread::Builder::new().name(name).spawn(move || self.run(input_tx, input_rx))?, control))
    }

    fn run(self, input_tx: mpsc::UnboundedSender<Input>, mut input_rx: mpsc::UnboundedReceiver<Input>) {
        // feed symbol index -> engine symbol
        let mut known: Vec<Option<Known>> = Vec::new();
        let mut by_engine: HashMap<SymbolIdx, u32> = HashMap::new();
        let mut holding: HashMap<SymbolIdx, Vec<TickEvent>> = HashMap::new();
        let mut out: Vec<TickEvent> = Vec::new();
        while let Some(input) = input_rx.blocking_recv() {
            match input {
                Input::Stop => return,
                Input::Feed(FeedItem::Connected(symbols)) => {
                    for s in symbols {
                        let slot = s.idx as usize;
                        if known.len() <= slot {
                            known.resize_with(slot + 1, || None);
                        }
                        if known[slot].as_ref().is_some_and(|k| k.name == s.symbol) {
                            continue;
                        }
                        let instrument = InstrumentId::new(self.source.clone(), Market::Stock, s.symbol.clone());
                        let idx = match self.engine.symbol(&instrument) {
                            Some(idx) => idx,
                            None => {
                                let output = L3Output::new(&self.registry, &instrument, s.venue, Some(input_tx.clone()));
                                match self.engine.add_symbol(instrument.clone(), s.venue, SeqPolicy::Contiguous, Box::new(output)) {
                                    Ok(idx) => idx,
                                    Err(e) => {
                                        tracing::error!(%instrument, error = %e, "cannot register a tick-by-tick book");
                                        continue;
                                    }
                                }
                            }
                        };
                        self.registry.set_always_on(&instrument);
                        by_engine.insert(idx, s.idx);
                        known[slot] = Some(Known { engine_idx: idx, name: s.symbol });
                    }
                    // A (re)connected stream starts wherever the source is now: every book starts
                    // from a snapshot, with the stream's events held meanwhile (as in a recovery).
                    for k in known.iter().flatten() {
                        if !holding.contains_key(&k.engine_idx) {
                            holding.insert(k.engine_idx, Vec::new());
                            self.counters.connect_snapshots.fetch_add(1, Relaxed);
                            self.fetch_snapshot(k.engine_idx, k.name.clone(), Duration::ZERO, input_tx.clone());
                        }
                    }
                }
                Input::Feed(FeedItem::Events(events)) => {
                    self.counters.events.fetch_add(events.len() as u64, Relaxed);
                    out.clear();
                    for e in &events {
                        let Some(Some(k)) = known.get(e.symbol as usize) else {
                            self.counters.unknown_symbol.fetch_add(1, Relaxed);
                            continue;
                        };
                        let te = tick_event(k.engine_idx, e);
                        match holding.get_mut(&k.engine_idx) {
                            Some(held) => {
                                if held.len() >= self.max_held {
                                    // too far behind: drop the oldest; the reset will find a gap and recover again
                                    held.drain(..held.len() / 2);
                                    self.counters.held_dropped.fetch_add(1, Relaxed);
                                }
                                held.push(te);
                            }
                            None => out.push(te),
                        }
                    }
                    if !out.is_empty() && self.tx.send(std::mem::take(&mut out)).is_err() {
                        return; // the engine stopped
                    }
                }
                Input::Feed(FeedItem::Disconnected(why)) => {
                    tracing::info!(source = %self.source, %why, "tick-by-tick feed disconnected; gaps will be recovered");
                }
                Input::Gap(symbol) => {
                    if holding.contains_key(&symbol) {
                        continue; // a recovery is running
                    }
                    let Some(name) = by_engine.get(&symbol).and_then(|i| known[*i as usize].as_ref()).map(|k| k.name.clone())
                    else {
                        continue;
                    };
                    holding.insert(symbol, Vec::new());
                    self.counters.recoveries.fetch_add(1, Relaxed);
                    self.fetch_snapshot(symbol, name, Duration::ZERO, input_tx.clone());
                }
                Input::Snapshot(symbol, Err(e)) => {
                    self.counters.recovery_failures.fetch_add(1, Relaxed);
                    tracing::warn!(source = %self.source, symbol, error = %e, "tick-by-tick snapshot failed; retrying");
                    if let Some(name) = by_engine.get(&symbol).and_then(|i| known[*i as usize].as_ref()).map(|k| k.name.clone()) {
                        self.fetch_snapshot(symbol, name, Duration::from_millis(500), input_tx.clone());
                    }
                }
                Input::Snapshot(symbol, Ok(snap)) => {
                    let held = holding.remove(&symbol).unwrap_or_default();
                    let last: HashMap<u32, u64> = snap.channel_last_seq.iter().copied().collect();
                    let reset = L3Snapshot { orders: snap.orders, channel_last_seq: snap.channel_last_seq };
                    if self.engine.reset(symbol, reset).is_err() {
                        return;
                    }
                    let newer: Vec<TickEvent> =
                        held.into_iter().filter(|e| last.get(&e.channel).is_none_or(|&s| e.seq > s)).collect();
                    if !newer.is_empty() && self.tx.send(newer).is_err() {
                        return;
                    }
                }
            }
        }
    }

    fn fetch_snapshot(&self, symbol: SymbolIdx, name: String, delay: Duration, input_tx: mpsc::UnboundedSender<Input>) {
        let rest = self.rest.clone();
        self.runtime.spawn(async move {
            tokio::time::sleep(delay).await;
            let r = rest.snapshot(&name).await.map_err(|e| e.to_string());
            let _ = input_tx.send(Input::Snapshot(symbol, r));
        });
    }
}

fn tick_event(symbol: SymbolIdx, e: &FeedEvent) -> TickEvent {
    TickEvent { symbol, channel: e.channel, seq: e.seq, msg: e.msg }
}

/// Where a shard sends one tick-by-tick book: the registry's publisher, and gaps to the feed
/// thread. Moves with the book between shards.
struct L3Output {
    publisher: BookPublisher,
    status: BookStatus,
    /// The feed thread that recovers gaps (none for a replay: a file cannot be re-requested).
    gaps: Option<mpsc::UnboundedSender<Input>>,
}

impl L3Output {
    fn new(
        registry: &BookRegistry,
        instrument: &InstrumentId,
        venue: Venue,
        gaps: Option<mpsc::UnboundedSender<Input>>,
    ) -> Self {
        let source = match venue {
            Venue::Sse => "l3_sse",
            Venue::Szse => "l3_szse",
            Venue::Lobster => "l3_lobster",
        };
        Self { publisher: registry.publisher(instrument, source, crate::wall_clock_ms()), status: BookStatus::default(), gaps }
    }
}

impl BookOutput for L3Output {
    fn publish(&mut self, book: &L3Book, health: l3engine::BookHealth, now_ms: i64) {
        self.status.health = match health {
            l3engine::BookHealth::Live => BookHealth::Synced,
            l3engine::BookHealth::Stale => BookHealth::Stale,
        };
        self.publisher.publish(book.ladder(), self.status, now_ms);
    }

    fn on_gap(&mut self, symbol: SymbolIdx, gap: SeqGap) {
        self.status.gaps += 1;
        self.status.resyncs += 1;
        tracing::debug!(instrument = %self.publisher.instrument(), %gap, "tick-by-tick gap; recovering from a snapshot");
        if let Some(g) = &self.gaps {
            let _ = g.send(Input::Gap(symbol));
        }
    }

    fn on_applied(&mut self, _book: &L3Book, applied: u32, _latency: Duration) {
        self.status.events += applied as u64;
    }
}

/// Replays a recorded day into the engine (see [`ReplaySourceConfig`]).
struct ReplayThread {
    config: ReplaySourceConfig,
    engine: EngineHandle,
    registry: Arc<BookRegistry>,
    tx: SyncSender<Vec<TickEvent>>,
    counters: Arc<FeedCounters>,
    stop: Arc<AtomicBool>,
}

impl ReplayThread {
    fn run(self) {
        let c = &self.config;
        let tick = Price::parse(&c.tick).unwrap_or(Price::from_raw(1_000_000));
        let replay = match crate::tbt::replay::SseReplay::load(&c.orders, &c.trades, tick) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(source = %c.name, error = format!("{e:#}"), "cannot load the tick-by-tick replay");
                return;
            }
        };
        let mut idx = Vec::with_capacity(replay.symbols().len());
        for code in replay.symbols() {
            let instrument = InstrumentId::new(c.name.clone(), Market::Stock, code.clone());
            let output = L3Output::new(&self.registry, &instrument, Venue::Sse, None);
            match self.engine.add_symbol(instrument.clone(), Venue::Sse, SeqPolicy::Increasing, Box::new(output)) {
                Ok(i) => idx.push(i),
                Err(e) => {
                    tracing::error!(%instrument, error = %e, "cannot register a replayed book");
                    return;
                }
            }
            self.registry.set_always_on(&instrument);
        }
        tracing::info!(source = %c.name, symbols = idx.len(), events = replay.len(), speed = c.speed, "tick-by-tick replay started");
        let sent = replay.run(c.speed, &self.stop, |batch| {
            self.counters.events.fetch_add(batch.len() as u64, Relaxed);
            let events = batch.iter().map(|e| tick_event(idx[e.symbol as usize], e)).collect();
            self.tx.send(events).is_ok()
        });
        self.counters.done.store(sent == replay.len(), Relaxed);
        tracing::info!(source = %c.name, sent, "tick-by-tick replay ended");
    }
}
