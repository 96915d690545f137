//! The engine's counters: atomics written by the dispatcher and the shards (aggregated per
//! batch, never per event) and read by [`super::EngineHandle::stats`], which turns them into the
//! API's [`EngineStats`] served at `GET /api/v1/ops/shards` and as Prometheus metrics.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use shared::l3::Venue;
use shared::protocol::ops::{
    EngineStats, FeedHealth, MigrationStats, PendingSymbol, ShardStats, SymbolStats,
};
use shared::protocol::InstrumentId;

use super::SymbolIdx;

/// One symbol's counters. Written by whoever owns the symbol at the time (one shard at a time,
/// the dispatcher for routing), read by stats.
#[derive(Debug)]
pub(crate) struct SymbolShared {
    pub idx: SymbolIdx,
    pub instrument: InstrumentId,
    pub venue: Venue,
    /// The shard new events are routed to (the dispatcher's table, mirrored for readers).
    pub shard: AtomicU32,
    /// Events accepted by the dispatcher and not yet handled by the book (queued, buffered or
    /// packed during a migration).
    pub pending: AtomicI64,
    /// Events handled by the book (applied, or dropped as duplicates / behind an open gap).
    pub processed: AtomicU64,
    /// Handled events not applied: duplicates, and events behind an open gap.
    pub not_applied: AtomicU64,
    /// processed/s over the owning shard's last rate window.
    pub rate: AtomicU64,
    /// Dispatch-to-done time of the symbol's last processed batch, µs.
    pub lag_us: AtomicU64,
    pub gaps: AtomicU64,
    pub resets: AtomicU64,
    /// Completed migrations of this symbol.
    pub migrations: AtomicU64,
    pub stale: AtomicBool,
    /// A migration is in flight: set by the dispatcher at step 1, cleared by the target when it
    /// has replayed legacy and buffer. A second migration waits for it (chains stay ordered).
    pub migrating: AtomicBool,
    /// Step 2's out-of-band flag: the source packs this symbol's backlog instead of computing it.
    pub migrating_out: AtomicBool,
}

impl SymbolShared {
    pub fn new(idx: SymbolIdx, instrument: InstrumentId, venue: Venue) -> Self {
        Self {
            idx,
            instrument,
            venue,
            shard: AtomicU32::new(u32::MAX),
            pending: AtomicI64::new(0),
            processed: AtomicU64::new(0),
            not_applied: AtomicU64::new(0),
            rate: AtomicU64::new(0),
            lag_us: AtomicU64::new(0),
            gaps: AtomicU64::new(0),
            resets: AtomicU64::new(0),
            migrations: AtomicU64::new(0),
            stale: AtomicBool::new(false),
            migrating: AtomicBool::new(false),
            migrating_out: AtomicBool::new(false),
        }
    }
}

/// One shard's counters.
#[derive(Debug)]
pub(crate) struct ShardShared {
    pub id: u32,
    /// Events in the shard's queue (added by the dispatcher per batch, removed per batch).
    pub queued: AtomicI64,
    /// Events held in migration buffers (incoming) and legacy lists (outgoing).
    pub buffered: AtomicI64,
    pub processed: AtomicU64,
    pub rate: AtomicU64,
    /// Dispatch time (ns since the engine's epoch, +1 so 0 means idle) of the batch being
    /// processed: the lag is its age.
    pub busy_since_ns: AtomicU64,
    pub symbols: AtomicU32,
    /// CPU time the shard thread has used, ns (updated when it goes idle and every rate window).
    pub cpu_ns: AtomicU64,
    /// Bumped by the dispatcher after setting a symbol's `migrating_out`: the shard checks this
    /// one number per batch and scans its symbols only when it changed.
    pub out_gen: AtomicU64,
    /// Events that reached this shard for a symbol it does not hold (a bug if ever non-zero).
    pub misrouted: AtomicU64,
}

impl ShardShared {
    pub fn new(id: u32) -> Self {
        Self {
            id,
            queued: AtomicI64::new(0),
            buffered: AtomicI64::new(0),
            processed: AtomicU64::new(0),
            rate: AtomicU64::new(0),
            busy_since_ns: AtomicU64::new(0),
            symbols: AtomicU32::new(0),
            cpu_ns: AtomicU64::new(0),
            out_gen: AtomicU64::new(0),
            misrouted: AtomicU64::new(0),
        }
    }
}

/// Engine-wide migration counters.
#[derive(Debug, Default)]
pub(crate) struct MigrationCounters {
    /// Requests accepted by the handle (each ends up completed or rejected).
    pub requested: AtomicU64,
    pub started: AtomicU64,
    pub completed: AtomicU64,
    pub queued: AtomicU64,
    pub rejected: AtomicU64,
    /// Start (step 1) to resumed processing at the target, µs.
    pub last_us: AtomicU64,
    pub max_us: AtomicU64,
    /// Legacy events handed over by the last completed migration, and by all of them.
    pub last_legacy: AtomicU64,
    pub legacy_total: AtomicU64,
}

/// Everything the handle, the dispatcher and the shards share. Locks here are taken only when a
/// symbol or shard is added and when stats are read, never per event.
#[derive(Debug)]
pub(crate) struct Registry {
    pub epoch: Instant,
    pub symbols: RwLock<Vec<Arc<SymbolShared>>>,
    pub by_name: RwLock<HashMap<String, SymbolIdx>>,
    pub shards: RwLock<Vec<Arc<ShardShared>>>,
    pub migrations: MigrationCounters,
    pub unknown_symbol: AtomicU64,
    pub auto_balance: AtomicBool,
    pub balancer_decisions: AtomicU64,
    pub max_shards: usize,
    pub top_n: usize,
}

impl Registry {
    pub fn new(max_shards: usize, top_n: usize, auto_balance: bool) -> Self {
        Self {
            epoch: Instant::now(),
            symbols: RwLock::new(Vec::new()),
            by_name: RwLock::new(HashMap::new()),
            shards: RwLock::new(Vec::new()),
            migrations: MigrationCounters::default(),
            unknown_symbol: AtomicU64::new(0),
            auto_balance: AtomicBool::new(auto_balance),
            balancer_decisions: AtomicU64::new(0),
            max_shards,
            top_n,
        }
    }

    /// ns since the epoch + 1 (so that 0 can mean "none").
    pub fn stamp(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_nanos() as u64 + 1
    }

    pub fn snapshot(&self) -> EngineStats {
        let now = Instant::now();
        let now_ns = self.stamp(now);
        let symbols = self.symbols.read().unwrap_or_else(|e| e.into_inner()).clone();
        let shards = self.shards.read().unwrap_or_else(|e| e.into_inner()).clone();
        let sym_stats: Vec<SymbolStats> = symbols
            .iter()
            .map(|s| {
                let lag_us = s.lag_us.load(Relaxed);
                SymbolStats {
                    symbol: s.idx,
                    instrument: s.instrument.clone(),
                    venue: s.venue,
                    shard: s.shard.load(Relaxed),
                    pending: s.pending.load(Relaxed).max(0) as u64,
                    processed: s.processed.load(Relaxed),
                    not_applied: s.not_applied.load(Relaxed),
                    processed_per_s: s.rate.load(Relaxed),
                    lag_us,
                    lag_ms: lag_us / 1000,
                    health: if s.stale.load(Relaxed) {
                        FeedHealth::Stale
                    } else {
                        FeedHealth::Live
                    },
                    gaps: s.gaps.load(Relaxed),
                    resets: s.resets.load(Relaxed),
                    migrations: s.migrations.load(Relaxed),
                    migrating: s.migrating.load(Relaxed),
                    hot: None,
                }
            })
            .collect();
        let shard_stats = shards
            .iter()
            .map(|sh| {
                let busy = sh.busy_since_ns.load(Relaxed);
                let lag_us = if busy == 0 { 0 } else { now_ns.saturating_sub(busy) / 1000 };
                let queued = sh.queued.load(Relaxed).max(0) as u64;
                let buffered = sh.buffered.load(Relaxed).max(0) as u64;
                let mut mine: Vec<&SymbolStats> =
                    sym_stats.iter().filter(|s| s.shard == sh.id && s.pending > 0).collect();
                let with_pending = mine.len() as u32;
                mine.sort_unstable_by(|a, b| {
                    b.pending.cmp(&a.pending).then(a.symbol.cmp(&b.symbol))
                });
                ShardStats {
                    id: sh.id,
                    pending: queued + buffered,
                    queued,
                    buffered,
                    processed: sh.processed.load(Relaxed),
                    processed_per_s: sh.rate.load(Relaxed),
                    lag_us,
                    lag_ms: lag_us / 1000,
                    symbols: sh.symbols.load(Relaxed),
                    symbols_with_pending: with_pending,
                    top_pending: mine
                        .into_iter()
                        .take(self.top_n)
                        .map(|s| PendingSymbol {
                            symbol: s.symbol,
                            instrument: s.instrument.clone(),
                            pending: s.pending,
                        })
                        .collect(),
                    misrouted: sh.misrouted.load(Relaxed),
                    cpu_ms: sh.cpu_ns.load(Relaxed) / 1_000_000,
                    cpu_ns: sh.cpu_ns.load(Relaxed),
                }
            })
            .collect();
        let m = &self.migrations;
        EngineStats {
            uptime_ms: now.duration_since(self.epoch).as_millis() as u64,
            auto_balance: self.auto_balance.load(Relaxed),
            max_shards: self.max_shards,
            shards: shard_stats,
            migrations: MigrationStats {
                requested: m.requested.load(Relaxed),
                started: m.started.load(Relaxed),
                completed: m.completed.load(Relaxed),
                queued: m.queued.load(Relaxed),
                rejected: m.rejected.load(Relaxed),
                in_flight: sym_stats.iter().filter(|s| s.migrating).map(|s| s.symbol).collect(),
                last_us: m.last_us.load(Relaxed),
                max_us: m.max_us.load(Relaxed),
                last_legacy_events: m.last_legacy.load(Relaxed),
                legacy_events_total: m.legacy_total.load(Relaxed),
            },
            symbols: sym_stats,
            balancer_decisions: self.balancer_decisions.load(Relaxed),
            unknown_symbol_events: self.unknown_symbol.load(Relaxed),
        }
    }
}
