//! Tick-by-tick books in the service: tick-by-tick sources → the sharded engine
//! ([`crate::l3::engine`]) → the [`BookRegistry`], which publishes them to clients.
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

pub mod control;
pub mod engine;
mod feed;
pub mod remote;
pub mod replay;

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shared::protocol::InstrumentId;
use tbt::feed::{FeedConfig, TbtFeed, TbtRest};
use tracing::Instrument as _;

use crate::books::BookRegistry;
use crate::config::L3Config;
use crate::lock::lock;
use crate::shutdown::Shutdown;
use crate::sources::Sources;
use engine::{Engine, EngineHandle, TickEvent};
use feed::FeedThread;
use replay::ReplayThread;

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
    /// Times the feed went silent for `l3.feed_stale_after_ms` (its books reported stale).
    pub silences: AtomicU64,
    /// A replay source has sent everything.
    pub done: AtomicBool,
}

/// One tick-by-tick source.
pub struct L3Source {
    pub name: String,
    /// The simulator's REST client (snapshots, hot-spot control); `None` for a replay.
    pub rest: Option<TbtRest>,
    pub counters: Arc<FeedCounters>,
}

/// Why the tick-by-tick books could not start.
#[derive(Debug, thiserror::Error)]
pub enum L3Error {
    #[error("the engine refused its configuration")]
    Engine(#[from] engine::EngineError),
    #[error("cannot start a tick-by-tick thread")]
    Thread(#[from] std::io::Error),
}

/// The running tick-by-tick books.
pub struct L3Books {
    pub handle: EngineHandle,
    /// Taken by [`L3Books::stop`], which joins its threads.
    engine: Mutex<Option<Engine>>,
    pub sources: Vec<L3Source>,
    /// Where the engine's books are published (and their REST snapshots kept).
    registry: Arc<BookRegistry>,
    /// The books' part of the shutdown: feeds, feed threads, replays and the engine's threads.
    shutdown: Shutdown,
}

impl L3Books {
    /// Starts the engine, one feed per `(source name, simulator base URL)` and one replay per
    /// `[[l3.replay]]`, all as parts of `shutdown`. `control_token` goes with control requests
    /// to the simulators (hot spots).
    pub fn start(
        config: &L3Config,
        registry: Arc<BookRegistry>,
        sims: &[(String, String)],
        control_token: Option<String>,
        shutdown: &Shutdown,
    ) -> Result<Arc<Self>, L3Error> {
        let mut engine = Engine::start(config.engine.clone(), shutdown)?;
        let handle = engine.handle();
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<TickEvent>>(config.queue_batches.max(1));
        engine.spawn_dispatcher(rx)?;
        let mut sources = Vec::new();
        for (name, base) in sims {
            let feed_config = FeedConfig {
                control_token: control_token.clone(),
                ..FeedConfig::new(base.clone())
            };
            let (feed, feed_rx, task) = TbtFeed::new(feed_config);
            shutdown.spawn_until_stopped(
                task.instrument(tracing::info_span!("tbt_feed", source = %name)),
            );
            let counters = Arc::new(FeedCounters::default());
            let thread = FeedThread {
                source: name.clone(),
                engine: handle.clone(),
                registry: registry.clone(),
                tx: tx.clone(),
                rest: feed.rest().clone(),
                counters: counters.clone(),
                max_held: config.max_held_events,
                stale_after: Duration::from_millis(config.feed_stale_after_ms),
                shutdown: shutdown.clone(),
            };
            thread.spawn(feed_rx)?;
            sources.push(L3Source {
                name: name.clone(),
                rest: Some(feed.rest().clone()),
                counters,
            });
        }
        for r in &config.replay {
            let counters = Arc::new(FeedCounters::default());
            let thread = ReplayThread {
                config: r.clone(),
                engine: handle.clone(),
                registry: registry.clone(),
                tx: tx.clone(),
                counters: counters.clone(),
            };
            let span = tracing::info_span!("l3_replay", source = %r.name);
            shutdown.spawn_thread(format!("l3-replay-{}", r.name), move |stop| {
                let _span = span.enter();
                thread.run(&stop);
            })?;
            sources.push(L3Source { name: r.name.clone(), rest: None, counters });
        }
        Ok(Arc::new(Self {
            handle,
            engine: Mutex::new(Some(engine)),
            sources,
            registry,
            shutdown: shutdown.clone(),
        }))
    }

    /// The simulator REST client serving `instrument`'s tick-by-tick feed.
    pub fn sim_rest(&self, instrument: &InstrumentId) -> Option<&TbtRest> {
        self.sources.iter().find(|s| s.name == instrument.exchange).and_then(|s| s.rest.as_ref())
    }

    /// Stops the feeds, their threads and the engine (which publishes its books one last time),
    /// and waits for all of them.
    pub async fn stop(&self) -> bool {
        self.shutdown.stop();
        let engine = lock(&self.engine).take();
        // Joining the engine's threads blocks.
        let _ = tokio::task::spawn_blocking(move || drop(engine)).await;
        self.shutdown.stopped(Duration::from_secs(5)).await
    }
}

/// `(source name, simulator base URL)` of every simulator whose tick-by-tick feed the books
/// follow (`[l3] sim_feeds`): each `sim` source once per simulator (a spot and a futures source
/// may share one).
pub fn sim_feeds(config: &crate::config::Config, sources: &Sources) -> Vec<(String, String)> {
    if !config.l3.sim_feeds {
        return Vec::new();
    }
    let mut seen = std::collections::HashSet::new();
    sources
        .all()
        .iter()
        .filter(|s| s.config.kind == crate::config::SourceKind::Sim)
        .filter(|s| seen.insert(s.endpoint.rest_base.clone()))
        .map(|s| (s.config.name.clone(), s.endpoint.rest_base.clone()))
        .collect()
}
