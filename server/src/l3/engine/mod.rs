//! # The sharded tick-by-tick book engine
//!
//! Rebuilds many instruments' order-by-order ([`L3Book`]) books in parallel, as
//! seeds/tick-by-tick-order-book-sharding-and-migration.md describes: shards with FIFO queues,
//! a routing table, per-shard and per-symbol backlog, and lock-free migration of a hot symbol to
//! another (or a new) shard, by hand or by an automatic policy.
//!
//! ## Shape
//! ```text
//!  producers ──Vec<TickEvent>──► Dispatcher (one thread: routing table symbol -> shard)
//!                                  │ groups each call's events per shard, ≤ max_batch per message
//!                                  ▼
//!        shard 0 FIFO ─► worker thread: L3Book + BookOutput of its symbols (plain memory)
//!        shard 1 FIFO ─► ...                       (publish on a timer, on_gap on a gap)
//!  EngineHandle (Clone, any thread) ──control channel──► Dispatcher (drained before each dispatch)
//!  balancer thread: looks at stats every interval, asks the handle to migrate
//! ```
//! * A shard (`shard.rs`) is an OS thread with one `std::sync::mpsc` queue carrying **batches** of
//!   events and control commands in the same FIFO, so a command's position relative to data is
//!   exact. It owns its symbols' state (book, output, sequencers) outright: nothing on the
//!   per-event path takes a lock or touches an atomic; counters are aggregated per batch.
//! * The [`Dispatcher`] owns the routing table and is used by exactly one thread
//!   ([`Engine::spawn_dispatcher`] runs it on its own thread behind a bounded channel). Control
//!   requests ([`EngineHandle::add_symbol`], [`EngineHandle::migrate`], [`EngineHandle::reset`])
//!   reach it through a channel it drains before each dispatch, so they are ordered with data.
//! * Output: each symbol's [`BookOutput`] is called on the owning shard's thread and moves with
//!   the book when the symbol migrates.
//!
//! ## Lifecycle
//! [`Engine::start`] starts the shards and the balancer thread; the [`Dispatcher`] is either
//! taken ([`Engine::take_dispatcher`]) and driven by one thread of the caller, or run on its own
//! thread ([`Engine::spawn_dispatcher`]). Stopping (dropping the dispatcher, or
//! [`Engine::shutdown`]) lets in-flight migrations finish, abandons queued ones, and stops each
//! shard after what was queued before the stop; shards publish their books one last time.
//!
//! ## Sequence continuity
//! Every event carries `(channel, seq)`; the book's per-channel [`shared::l3::Sequencer`] applies
//! the next number, drops duplicates and rejects a gap without applying it. On the first gap the
//! symbol becomes [`FeedHealth::Stale`], the gap is counted and [`BookOutput::on_gap`] asks the
//! feed
//! to recover; later events are not applied as if nothing happened (a retransmission of the
//! missing numbers closes the gap; otherwise [`EngineHandle::reset`] with an [`L3Snapshot`],
//! delivered in order through the same FIFOs, replaces the book and continues after the
//! snapshot's numbers). A stale book is never published as [`FeedHealth::Live`].
//!
//! ## Migration (the seed's four steps, [`dispatcher`])
//! 1. `MigrateStart` to the target: the target buffers the symbol's events from now on.
//! 2. The symbol's `migrating_out` flag is set out of band (an atomic the source checks once per
//!    batch): the source **packs** its remaining backlog of the symbol into a legacy list instead
//!    of computing it.
//! 3. The route switches: new events go to the target's queue.
//! 4. A `MigrateFlush` sentinel goes into the source's queue behind the backlog; when the source
//!    reaches it, it sends `MigrateComplete { state, legacy }` straight to the target, which replays
//!    legacy, then its buffer, then resumes normal processing.
//!
//! Backlogs are kept as lists of batches: a queued batch that holds only the migrating symbol's
//! events is moved into the legacy list whole, so the source drains a 1 M-event backlog in
//! milliseconds (docs/bench-l3engine.md). Resets that arrive during a move are held at their
//! position and replayed in order.
//!
//! The target may be an existing shard or a new one ([`Target::New`], the seed's -1). A second
//! migration of a symbol whose first is still in flight is queued by the dispatcher and started
//! when the first completes, so chains A -> B -> new stay in order. Migrating to the shard that
//! already owns the symbol is [`EngineError::SameShard`].
//!
//! ## Automatic policy ([`balance`])
//! When a shard's pending or lag stays above the high threshold for `looks` consecutive looks and
//! the shard has more than one symbol with load, its hottest symbol (by pending, then rate) moves
//! to the least loaded shard if that is below the low thresholds, else to a new shard (up to
//! `max_shards`). Per-symbol and per-shard cool-downs keep it from thrashing.
//!
//! ## Observability ([`EngineHandle::stats`])
//! Per shard: pending (queued + held in migration buffers), processed, processed/s, lag (age of
//! the batch being processed), symbols, top pending symbols, thread CPU time. Per symbol: pending,
//! processed,
//! processed/s, lag of its last processed batch, health, gaps, resets, migrations. Engine-wide:
//! migrations started / completed / queued / rejected / in flight, last migration time, balancer
//! decisions, events for unknown symbols.

pub mod balance;
mod control;
pub mod dispatcher;
mod shard;
pub mod stats;

use std::time::Duration;

use serde::{Deserialize, Serialize};
use shared::l3::{L3Book, Msg, Order, OrderId, SeqGap};

pub use crate::config::engine::{BalanceConfig, EngineConfig};
pub use balance::{Balancer, Decision};
pub use control::{Engine, EngineHandle};
pub use dispatcher::Dispatcher;
pub use shared::protocol::ops::FeedHealth;

/// A registered symbol's index, dense from 0 in registration order (the routing table is a
/// `Vec` indexed by it).
pub type SymbolIdx = u32;

/// One decoded tick-by-tick event for a registered symbol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TickEvent {
    pub symbol: SymbolIdx,
    /// The exchange channel the sequence number belongs to.
    pub channel: u32,
    pub seq: u64,
    pub msg: Msg,
}

/// Where a book goes: a shard reports its books through this, on the owning shard's thread.
/// The object moves with the book when the symbol migrates, so it needs no synchronisation of its
/// own for per-book state.
pub trait BookOutput: Send + 'static {
    /// At most every publish interval, when the book or its health changed since the last call.
    fn publish(&mut self, book: &L3Book, health: FeedHealth, now_ms: i64);

    /// A sequence gap was found; the book is now stale (not published as fresh). Must not block:
    /// ask the feed to recover (re-request or snapshot) and return.
    fn on_gap(&mut self, symbol: SymbolIdx, gap: SeqGap);

    /// After each batch that applied `applied` of this symbol's events: `book.pending_updates()`
    /// are the level changes since the previous call (the engine clears them afterwards, so an
    /// L2 consumer that wants every change takes them here), `latency` is how long the batch
    /// waited plus its processing time (dispatch to done). Called once per batch, not per event;
    /// default: nothing.
    fn on_applied(&mut self, book: &L3Book, applied: u32, latency: Duration) {
        let _ = (book, applied, latency);
    }
}

/// A book as the source has it at some sequence numbers: the recovery after a gap.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct L3Snapshot {
    pub orders: Vec<(OrderId, Order)>,
    /// For each channel, the last sequence number the snapshot contains.
    pub channel_last_seq: Vec<(u32, u64)>,
}

/// Where [`EngineHandle::migrate`] moves a symbol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Target {
    /// An existing shard by id.
    Shard(u32),
    /// A shard created for the purpose (the seed's -1), if `max_shards` allows.
    New,
}

impl Target {
    /// The admin API's form: `-1` is a new shard, `n >= 0` shard `n`.
    pub fn from_api(n: i64) -> Result<Self, EngineError> {
        match n {
            -1 => Ok(Target::New),
            n if (0..=u32::MAX as i64).contains(&n) => Ok(Target::Shard(n as u32)),
            n => Err(EngineError::UnknownShard(n)),
        }
    }
}

/// Why a request to the engine was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    #[error("unknown symbol index {0}")]
    UnknownSymbol(SymbolIdx),
    #[error("no shard {0} (use -1 for a new shard)")]
    UnknownShard(i64),
    #[error("symbol {symbol} is already on shard {shard}")]
    SameShard { symbol: SymbolIdx, shard: u32 },
    #[error("cannot add a shard: max_shards ({0}) reached")]
    MaxShards(usize),
    #[error("instrument {0} is already registered")]
    DuplicateSymbol(String),
    #[error("the engine is stopped")]
    Stopped,
    #[error("the dispatcher was already taken or spawned")]
    DispatcherTaken,
    #[error("invalid engine configuration: {0}")]
    Config(String),
}

/// Room for events a new batch vector starts with (it grows to `max_batch` as needed).
pub const FIRST_BATCH: usize = 64;
