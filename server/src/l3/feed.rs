//! The feed thread of a simulator's tick-by-tick source: its events into the engine, and the
//! recovery of a book from a snapshot after a gap or a (re)connect (see [`super`]).

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::SyncSender;
use std::sync::Arc;
use std::time::Duration;

use shared::backoff::Backoff;
use shared::l3::{L3Book, SeqGap, SeqPolicy, Venue};
use shared::protocol::{BookHealth, BookStatus, InstrumentId, Market};
use tbt::feed::{FeedError, FeedItem, TbtRest};
use tbt::{FeedEvent, TbtSnapshot};
use tokio::sync::mpsc;
use tracing::Instrument as _;

use super::engine::{BookOutput, EngineHandle, FeedHealth, L3Snapshot, SymbolIdx, TickEvent};
use super::FeedCounters;
use crate::books::{BookPublisher, BookRegistry};
use crate::jitter::Jitter;
use crate::shutdown::Shutdown;

/// First retry delay of a failed snapshot request (doubling, with jitter).
const SNAPSHOT_RETRY: Duration = Duration::from_millis(500);
/// Largest retry delay of a failed snapshot request.
const SNAPSHOT_RETRY_CAP: Duration = Duration::from_secs(30);

/// What the feed thread reacts to, in arrival order.
pub(super) enum Input {
    Feed(FeedItem),
    /// A shard found a gap in this symbol.
    Gap(SymbolIdx),
    /// The source's snapshot for a recovery.
    Snapshot(SymbolIdx, Result<TbtSnapshot, FeedError>),
    /// Time to check that the feed still delivers (see [`FeedThread::stale_after`]).
    Tick,
    /// End the thread.
    Stop,
}

pub(super) struct FeedThread {
    pub source: String,
    pub engine: EngineHandle,
    pub registry: Arc<BookRegistry>,
    pub tx: SyncSender<Vec<TickEvent>>,
    pub rest: TbtRest,
    pub counters: Arc<FeedCounters>,
    pub max_held: usize,
    /// No event for this long: the feed is silent (paused upstream, stuck) and its books are
    /// reported stale until events arrive again; otherwise they would keep saying `synced`,
    /// since a book without events is never published again.
    pub stale_after: Duration,
    /// The tick-by-tick books' part of the shutdown (the thread, its pump and its snapshot
    /// requests run in it).
    pub shutdown: Shutdown,
}

/// A symbol of the feed, as registered with the engine.
struct Known {
    engine_idx: SymbolIdx,
    name: String,
}

impl FeedThread {
    /// Runs the thread on `feed_rx`'s items until the books' shutdown stops it.
    pub(super) fn spawn(self, mut feed_rx: mpsc::Receiver<FeedItem>) -> std::io::Result<()> {
        let (input_tx, input_rx) = mpsc::unbounded_channel::<Input>();
        let pump_tx = input_tx.clone();
        let span = tracing::info_span!("l3_feed", source = %self.source);
        self.shutdown.spawn_until_stopped(
            async move {
                while let Some(item) = feed_rx.recv().await {
                    if pump_tx.send(Input::Feed(item)).is_err() {
                        return;
                    }
                }
            }
            .instrument(span.clone()),
        );
        // The thread blocks on its input: a stop arrives as an input too.
        let stop_tx = input_tx.clone();
        let shutdown = self.shutdown.clone();
        self.shutdown.spawn(async move {
            shutdown.stopping().await;
            let _ = stop_tx.send(Input::Stop);
        });
        let tick_tx = input_tx.clone();
        let every = (self.stale_after / 4).max(Duration::from_millis(25));
        self.shutdown.spawn_until_stopped(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if tick_tx.send(Input::Tick).is_err() {
                    return;
                }
            }
        });
        let runtime = tokio::runtime::Handle::current();
        let name = format!("l3-feed-{}", self.source);
        let threads = self.shutdown.clone();
        threads.spawn_thread(name, move |_| {
            let _runtime = runtime.enter();
            let _span = span.enter();
            self.run(input_tx, input_rx);
        })?;
        Ok(())
    }

    fn run(
        self,
        input_tx: mpsc::UnboundedSender<Input>,
        mut input_rx: mpsc::UnboundedReceiver<Input>,
    ) {
        // feed symbol index -> engine symbol
        let mut known: Vec<Option<Known>> = Vec::new();
        let mut by_engine: HashMap<SymbolIdx, u32> = HashMap::new();
        let mut holding: HashMap<SymbolIdx, Vec<TickEvent>> = HashMap::new();
        // Failed snapshot requests per symbol: retried after a back-off that doubles from
        // `SNAPSHOT_RETRY` to `SNAPSHOT_RETRY_CAP`, reset by a snapshot that arrives.
        let mut retries: HashMap<SymbolIdx, Backoff> = HashMap::new();
        let mut jitter = Jitter::new(&self.source);
        let mut out: Vec<TickEvent> = Vec::new();
        let mut last_event = std::time::Instant::now();
        let mut silent = false;
        while let Some(input) = input_rx.blocking_recv() {
            match input {
                Input::Stop => return,
                Input::Tick => {
                    let quiet = last_event.elapsed();
                    if quiet < self.stale_after {
                        continue;
                    }
                    if !silent {
                        silent = true;
                        self.counters.silences.fetch_add(1, Relaxed);
                        tracing::warn!(quiet_ms = quiet.as_millis() as u64, "no tick-by-tick events: the feed's books are reported stale until events arrive");
                    }
                    // again on every check while silent: a batch the engine still published
                    // after the last event must not leave a book `synced`
                    for k in known.iter().flatten() {
                        let instrument =
                            InstrumentId::new(self.source.clone(), Market::Stock, k.name.clone());
                        self.registry.mark_stale(&instrument);
                    }
                }
                Input::Feed(FeedItem::Connected(symbols)) => {
                    for s in symbols {
                        let slot = s.idx as usize;
                        if known.len() <= slot {
                            known.resize_with(slot + 1, || None);
                        }
                        if known[slot].as_ref().is_some_and(|k| k.name == s.symbol) {
                            continue;
                        }
                        let instrument =
                            InstrumentId::new(self.source.clone(), Market::Stock, s.symbol.clone());
                        let idx = match self.engine.symbol(&instrument) {
                            Some(idx) => idx,
                            None => {
                                let output = L3Output::new(
                                    &self.registry,
                                    &instrument,
                                    s.venue,
                                    Some(input_tx.clone()),
                                );
                                match self.engine.add_symbol(
                                    instrument.clone(),
                                    s.venue,
                                    SeqPolicy::Contiguous,
                                    Box::new(output),
                                ) {
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
                        if let std::collections::hash_map::Entry::Vacant(e) =
                            holding.entry(k.engine_idx)
                        {
                            e.insert(Vec::new());
                            self.counters.connect_snapshots.fetch_add(1, Relaxed);
                            self.fetch_snapshot(
                                k.engine_idx,
                                k.name.clone(),
                                Duration::ZERO,
                                input_tx.clone(),
                            );
                        }
                    }
                }
                Input::Feed(FeedItem::Events(events)) => {
                    self.counters.events.fetch_add(events.len() as u64, Relaxed);
                    last_event = std::time::Instant::now();
                    if std::mem::take(&mut silent) {
                        tracing::info!(
                            "tick-by-tick events again: the books report their own health"
                        );
                    }
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
                                    // too far behind: drop the oldest; the reset will find a gap
                                    // and recover again
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
                    tracing::info!(%why, "tick-by-tick feed disconnected; gaps will be recovered");
                }
                Input::Gap(symbol) => {
                    if holding.contains_key(&symbol) {
                        continue; // a recovery is running
                    }
                    let Some(name) = by_engine
                        .get(&symbol)
                        .and_then(|i| known[*i as usize].as_ref())
                        .map(|k| k.name.clone())
                    else {
                        continue;
                    };
                    holding.insert(symbol, Vec::new());
                    self.counters.recoveries.fetch_add(1, Relaxed);
                    self.fetch_snapshot(symbol, name, Duration::ZERO, input_tx.clone());
                }
                Input::Snapshot(symbol, Err(e)) => {
                    self.counters.recovery_failures.fetch_add(1, Relaxed);
                    tracing::warn!(symbol, error = %e, "tick-by-tick snapshot failed; retrying");
                    if let Some(name) = by_engine
                        .get(&symbol)
                        .and_then(|i| known[*i as usize].as_ref())
                        .map(|k| k.name.clone())
                    {
                        let delay = retries
                            .entry(symbol)
                            .or_insert_with(|| Backoff::new(SNAPSHOT_RETRY, SNAPSHOT_RETRY_CAP))
                            .next_delay(jitter.draw());
                        self.fetch_snapshot(symbol, name, delay, input_tx.clone());
                    }
                }
                Input::Snapshot(symbol, Ok(snap)) => {
                    retries.remove(&symbol);
                    let held = holding.remove(&symbol).unwrap_or_default();
                    let last: HashMap<u32, u64> = snap.channel_last_seq.iter().copied().collect();
                    let reset =
                        L3Snapshot { orders: snap.orders, channel_last_seq: snap.channel_last_seq };
                    if self.engine.reset(symbol, reset).is_err() {
                        return;
                    }
                    let newer: Vec<TickEvent> = held
                        .into_iter()
                        .filter(|e| last.get(&e.channel).is_none_or(|&s| e.seq > s))
                        .collect();
                    if !newer.is_empty() && self.tx.send(newer).is_err() {
                        return;
                    }
                }
            }
        }
    }

    fn fetch_snapshot(
        &self,
        symbol: SymbolIdx,
        name: String,
        delay: Duration,
        input_tx: mpsc::UnboundedSender<Input>,
    ) {
        let rest = self.rest.clone();
        self.shutdown.spawn_until_stopped(
            async move {
                tokio::time::sleep(delay).await;
                let r = rest.snapshot(&name).await;
                let _ = input_tx.send(Input::Snapshot(symbol, r));
            }
            .in_current_span(),
        );
    }
}

pub(super) fn tick_event(symbol: SymbolIdx, e: &FeedEvent) -> TickEvent {
    TickEvent { symbol, channel: e.channel, seq: e.seq, msg: e.msg }
}

/// Where a shard sends one tick-by-tick book: the registry's publisher, and gaps to the feed
/// thread. Moves with the book between shards.
pub(super) struct L3Output {
    publisher: BookPublisher,
    status: BookStatus,
    /// The feed thread that recovers gaps (none for a replay: a file cannot be re-requested).
    gaps: Option<mpsc::UnboundedSender<Input>>,
}

impl L3Output {
    pub(super) fn new(
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
        Self {
            publisher: registry.publisher(instrument, source, crate::clock::wall_clock_ms()),
            status: BookStatus::default(),
            gaps,
        }
    }
}

impl BookOutput for L3Output {
    fn publish(&mut self, book: &L3Book, health: FeedHealth, now_ms: i64) {
        self.status.health = match health {
            FeedHealth::Live => BookHealth::Synced,
            FeedHealth::Stale => BookHealth::Stale,
        };
        self.publisher.publish(book.ladder(), self.status, now_ms);
    }

    fn on_gap(&mut self, symbol: SymbolIdx, gap: SeqGap) {
        self.status.gaps += 1;
        self.status.resyncs += 1;
        tracing::debug!(instrument = %BookPublisher::instrument(&self.publisher), %gap, "tick-by-tick gap; recovering from a snapshot");
        if let Some(g) = &self.gaps {
            let _ = g.send(Input::Gap(symbol));
        }
    }

    fn on_applied(&mut self, _book: &L3Book, applied: u32, _latency: Duration) {
        self.status.events += applied as u64;
    }
}
