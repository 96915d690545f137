//! The dispatcher: the routing table (symbol -> shard), the grouping of events into per-shard
//! batches, and the control plane (add symbol, reset, migrate) executed in order with the data.
//!
//! It is a plain struct used by exactly one thread, so the routing table needs no lock: control
//! requests from other threads arrive through a channel it drains before each dispatch (and on a
//! short timer when it runs on its own thread, see [`super::Engine::spawn_dispatcher`]).

use crate::lock::lock;
use crate::shutdown::Shutdown;
use std::collections::VecDeque;
use std::sync::atomic::Ordering::{Relaxed, Release};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use super::shard::{Batch, Shard, ShardMsg, SymbolState};
use super::stats::{Registry, ShardShared, SymbolShared};
use super::{EngineConfig, EngineError, L3Snapshot, SymbolIdx, Target, TickEvent, FIRST_BATCH};

/// A control request, from [`super::EngineHandle`] to the dispatcher.
pub(crate) enum Control {
    Add { shared: Arc<SymbolShared>, state: Box<SymbolState> },
    Migrate { symbol: SymbolIdx, target: Target },
    Reset { symbol: SymbolIdx, snapshot: Box<L3Snapshot> },
    Shutdown,
}

/// The dispatcher's link to one shard.
struct ShardLink {
    tx: Sender<ShardMsg>,
    shared: Arc<ShardShared>,
}

const NO_ROUTE: u32 = u32::MAX;
/// Events counted per pass: the per-symbol pending counters are raised for a chunk before any of
/// its events is queued, so a shard never sees a symbol's pending go below zero.
const CHUNK: usize = 8192;

pub struct Dispatcher {
    reg: Arc<Registry>,
    control_rx: Receiver<Control>,
    shards: Vec<ShardLink>,
    /// The routing table, indexed by symbol.
    route: Vec<u32>,
    /// Each symbol's counters (the pending count is raised here).
    symbols: Vec<Option<Arc<SymbolShared>>>,
    /// Per-shard batch under construction.
    bufs: Vec<Vec<TickEvent>>,
    /// Per-symbol event count of the current chunk, and which symbols it touched.
    counts: Vec<u32>,
    touched: Vec<SymbolIdx>,
    /// Symbols routed to each shard (the placement rule reads this, not the shards' own counts,
    /// which lag behind a burst of registrations).
    placed: Vec<u32>,
    /// Migrations waiting for a previous migration of the same symbol to complete.
    queued: VecDeque<(SymbolIdx, Target)>,
    recycle_tx: SyncSender<Vec<TickEvent>>,
    recycle_rx: Receiver<Vec<TickEvent>>,
    cfg: EngineConfig,
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
    /// The engine's part of the shutdown: shard threads are started in it.
    shutdown: Shutdown,
    stopped: bool,
}

impl Dispatcher {
    pub(crate) fn new(
        reg: Arc<Registry>,
        control_rx: Receiver<Control>,
        cfg: EngineConfig,
        threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
        shutdown: Shutdown,
    ) -> Result<Self, EngineError> {
        let (recycle_tx, recycle_rx) = mpsc::sync_channel(cfg.recycle_batches);
        let mut d = Self {
            reg,
            control_rx,
            shards: Vec::new(),
            route: Vec::new(),
            symbols: Vec::new(),
            bufs: Vec::new(),
            placed: Vec::new(),
            counts: Vec::new(),
            touched: Vec::new(),
            queued: VecDeque::new(),
            recycle_tx,
            recycle_rx,
            cfg,
            threads,
            shutdown,
            stopped: false,
        };
        for _ in 0..d.cfg.shards {
            d.spawn_shard()?;
        }
        Ok(d)
    }

    /// Number of shards, including those created by migrations.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// The shard a symbol's events go to.
    pub fn route_of(&self, symbol: SymbolIdx) -> Option<u32> {
        self.route.get(symbol as usize).copied().filter(|&r| r != NO_ROUTE)
    }

    /// Routes `events` to their shards' queues, grouped per shard in batches of at most
    /// `max_batch`, in arrival order per shard (so per symbol). Control requests are executed
    /// first. Events of unregistered symbols are dropped and counted.
    pub fn dispatch(&mut self, events: &[TickEvent]) {
        self.poll_control();
        if self.stopped {
            return;
        }
        let mut unknown = 0u64;
        for chunk in events.chunks(CHUNK) {
            for ev in chunk {
                let s = ev.symbol as usize;
                if let Some(c) = self.counts.get_mut(s) {
                    if *c == 0 {
                        self.touched.push(ev.symbol);
                    }
                    *c += 1;
                }
            }
            for &s in &self.touched {
                let c = std::mem::take(&mut self.counts[s as usize]);
                if let Some(Some(sym)) = self.symbols.get(s as usize) {
                    sym.pending.fetch_add(c as i64, Relaxed);
                }
            }
            self.touched.clear();
            for ev in chunk {
                let r = self.route.get(ev.symbol as usize).copied().unwrap_or(NO_ROUTE);
                if r == NO_ROUTE {
                    unknown += 1;
                    continue;
                }
                let buf = &mut self.bufs[r as usize];
                buf.push(*ev);
                if buf.len() >= self.cfg.max_batch {
                    self.send_batch(r as usize);
                }
            }
        }
        for r in 0..self.bufs.len() {
            if !self.bufs[r].is_empty() {
                self.send_batch(r);
            }
        }
        if unknown > 0 {
            let before = self.reg.unknown_symbol.fetch_add(unknown, Relaxed);
            // logged when the total crosses a power of two, so a misconfigured feed cannot flood
            // the log; the counter has the exact number
            if (before + unknown).ilog2() != before.checked_ilog2().unwrap_or(u32::MAX) {
                tracing::warn!(
                    total = before + unknown,
                    "l3 dispatcher: events for unregistered symbols dropped"
                );
            }
        }
    }

    fn send_batch(&mut self, r: usize) {
        let fresh = self.recycle_rx.try_recv().unwrap_or_else(|_| self.new_batch());
        let events = std::mem::replace(&mut self.bufs[r], fresh);
        let link = &self.shards[r];
        link.shared.queued.fetch_add(events.len() as i64, Relaxed);
        let n = events.len() as i64;
        if link.tx.send(ShardMsg::Events(Batch { events, enqueued: Instant::now() })).is_err() {
            link.shared.queued.fetch_sub(n, Relaxed);
            tracing::error!(shard = r, "l3 dispatcher: shard thread is gone; batch dropped");
        }
    }

    /// Executes waiting control requests and starts queued migrations whose predecessor is done.
    /// [`Self::dispatch`] calls this first; call it on a timer when no events flow.
    pub fn poll_control(&mut self) {
        while let Ok(c) = self.control_rx.try_recv() {
            self.control(c);
        }
        self.start_queued();
    }

    /// Tells the shards to stop behind what is queued (as a `Shutdown` request does); idempotent.
    pub fn stop(&mut self) {
        if !self.stopped {
            self.stop_shards();
        }
    }

    /// Whether a `Shutdown` was received (the shards were told to stop).
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    fn control(&mut self, c: Control) {
        if self.stopped {
            return;
        }
        match c {
            Control::Add { shared, state } => self.add(shared, state),
            Control::Migrate { symbol, target } => {
                if let Err(e) = self.migrate(symbol, target) {
                    self.reg.migrations.rejected.fetch_add(1, Relaxed);
                    tracing::warn!(symbol, ?target, error = %e, "l3 migration refused");
                }
            }
            Control::Reset { symbol, snapshot } => match self.route_of(symbol) {
                Some(r) => {
                    let _ = self.shards[r as usize].tx.send(ShardMsg::Reset { symbol, snapshot });
                }
                None => tracing::warn!(symbol, "l3 reset for an unknown symbol ignored"),
            },
            Control::Shutdown => self.stop_shards(),
        }
    }

    /// Tells every shard to stop behind what is queued. Migrations in flight are let finish
    /// first (bounded wait): a target stopped before the source's hand-over arrives would drop
    /// the symbol's state. Queued ones are abandoned and counted as rejected.
    fn stop_shards(&mut self) {
        self.stopped = true;
        let abandoned = self.queued.len() as u64;
        self.queued.clear();
        if abandoned > 0 {
            self.reg.migrations.rejected.fetch_add(abandoned, Relaxed);
        }
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        while self.symbols.iter().flatten().any(|s| s.migrating.load(Relaxed))
            && Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        for s in &self.shards {
            let _ = s.tx.send(ShardMsg::Stop);
        }
    }

    /// Initial placement: the shard with the fewest symbols, then the least pending.
    fn add(&mut self, shared: Arc<SymbolShared>, state: Box<SymbolState>) {
        let symbol = shared.idx;
        let i = symbol as usize;
        if self.route.len() <= i {
            self.route.resize(i + 1, NO_ROUTE);
            self.symbols.resize(i + 1, None);
            self.counts.resize(i + 1, 0);
        }
        let r = (0..self.shards.len())
            .min_by_key(|&r| (self.placed[r], self.shards[r].shared.queued.load(Relaxed), r))
            .unwrap_or(0);
        self.placed[r] += 1;
        shared.shard.store(r as u32, Relaxed);
        self.route[i] = r as u32;
        self.symbols[i] = Some(shared);
        let _ = self.shards[r].tx.send(ShardMsg::Add { symbol, state });
    }

    /// The seed's four steps, or a place in the queue if a migration of the symbol is in flight.
    fn migrate(&mut self, symbol: SymbolIdx, target: Target) -> Result<(), EngineError> {
        let from = self.route_of(symbol).ok_or(EngineError::UnknownSymbol(symbol))?;
        let sym =
            self.symbols[symbol as usize].clone().ok_or(EngineError::UnknownSymbol(symbol))?;
        if sym.migrating.load(Relaxed) || self.queued.iter().any(|(s, _)| *s == symbol) {
            self.queued.push_back((symbol, target));
            self.reg.migrations.queued.fetch_add(1, Relaxed);
            tracing::info!(symbol, ?target, "l3 migration queued behind one in flight");
            return Ok(());
        }
        self.start_migration(symbol, &sym, from, target)
    }

    fn start_migration(
        &mut self,
        symbol: SymbolIdx,
        sym: &Arc<SymbolShared>,
        from: u32,
        target: Target,
    ) -> Result<(), EngineError> {
        let to = match target {
            Target::Shard(t) if (t as usize) < self.shards.len() => t,
            Target::Shard(t) => return Err(EngineError::UnknownShard(t as i64)),
            Target::New => {
                if self.shards.len() >= self.cfg.max_shards {
                    return Err(EngineError::MaxShards(self.cfg.max_shards));
                }
                self.spawn_shard()?
            }
        };
        if to == from {
            return Err(EngineError::SameShard { symbol, shard: to });
        }
        let started = Instant::now();
        // 1. the target buffers the symbol's events from now on
        sym.migrating.store(true, Relaxed);
        let _ = self.shards[to as usize].tx.send(ShardMsg::MigrateStart { symbol });
        // 2. out of band: the source packs the symbol's backlog instead of computing it
        sym.migrating_out.store(true, Release);
        self.shards[from as usize].shared.out_gen.fetch_add(1, Release);
        // 3. the route switches
        self.route[symbol as usize] = to;
        sym.shard.store(to, Relaxed);
        self.placed[from as usize] -= 1;
        self.placed[to as usize] += 1;
        // 4. the sentinel behind the backlog at the source
        let target_tx = self.shards[to as usize].tx.clone();
        let _ = self.shards[from as usize].tx.send(ShardMsg::MigrateFlush {
            symbol,
            target: target_tx,
            target_id: to,
            started,
        });
        self.reg.migrations.started.fetch_add(1, Relaxed);
        tracing::info!(symbol = %sym.instrument, from, to, pending = sym.pending.load(Relaxed), "l3 migration started");
        Ok(())
    }

    /// Starts, in request order, each queued migration whose symbol has none in flight.
    fn start_queued(&mut self) {
        if self.queued.is_empty() {
            return;
        }
        let mut waiting = VecDeque::new();
        let mut blocked: Vec<SymbolIdx> = Vec::new();
        while let Some((symbol, target)) = self.queued.pop_front() {
            let sym = self.symbols.get(symbol as usize).cloned().flatten();
            let busy = sym.as_ref().is_some_and(|s| s.migrating.load(Relaxed));
            if busy || blocked.contains(&symbol) {
                blocked.push(symbol);
                waiting.push_back((symbol, target));
                continue;
            }
            let result = match (sym, self.route_of(symbol)) {
                (Some(sym), Some(from)) => self.start_migration(symbol, &sym, from, target),
                _ => Err(EngineError::UnknownSymbol(symbol)),
            };
            if let Err(e) = result {
                self.reg.migrations.rejected.fetch_add(1, Relaxed);
                tracing::warn!(symbol, ?target, error = %e, "l3 queued migration refused");
            } else {
                // the one just started is in flight: later requests for it wait again
                blocked.push(symbol);
            }
        }
        self.queued = waiting;
    }

    /// An empty batch for when the pool has none: small, since most batches of a quiet feed
    /// carry a few events, and the pool keeps every vector at the size it grew to.
    fn new_batch(&self) -> Vec<TickEvent> {
        Vec::with_capacity(FIRST_BATCH.min(self.cfg.max_batch))
    }

    /// A new shard thread; returns its id.
    fn spawn_shard(&mut self) -> Result<u32, EngineError> {
        let id = self.shards.len() as u32;
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(ShardShared::new(id));
        let shard = Shard::new(
            id,
            rx,
            self.recycle_tx.clone(),
            shared.clone(),
            self.reg.clone(),
            self.cfg.publish_interval(),
        );
        let handle = self
            .shutdown
            .spawn_thread(format!("l3-shard-{id}"), move |_| shard.run())
            .map_err(|e| EngineError::Config(format!("cannot start a shard thread: {e}")))?;
        lock(&self.threads).push(handle);
        self.reg.shards.write().unwrap_or_else(|e| e.into_inner()).push(shared.clone());
        self.shards.push(ShardLink { tx, shared });
        let buf = self.new_batch();
        self.bufs.push(buf);
        self.placed.push(0);
        tracing::info!(shard = id, "l3 shard started");
        Ok(id)
    }
}

impl Drop for Dispatcher {
    /// The shards stop once they have processed what was queued before this point.
    fn drop(&mut self) {
        if !self.stopped {
            self.stop_shards();
        }
    }
}
