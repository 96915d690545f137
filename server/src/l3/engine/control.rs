//! [`Engine`] (the threads' owner) and [`EngineHandle`] (the cheap, cloneable control surface).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use shared::l3::{L3Book, SeqPolicy, Venue};
use shared::protocol::InstrumentId;
use tokio_util::sync::CancellationToken;

use crate::lock::lock;
use crate::shutdown::Shutdown;

use super::balance::Balancer;
use super::dispatcher::{Control, Dispatcher};
use super::shard::SymbolState;
use shared::protocol::ops::EngineStats;

use super::stats::{Registry, SymbolShared};
use super::{BookOutput, EngineConfig, EngineError, L3Snapshot, SymbolIdx, Target, TickEvent};

/// Most queued batches a stopping dispatcher thread still dispatches.
const MAX_DRAIN_BATCHES: usize = 100_000;

/// How often a dispatcher on its own thread drains control requests when no events arrive.
const IDLE_POLL: Duration = Duration::from_millis(5);

/// The running engine: shard threads, the balancer thread, and the dispatcher until it is taken
/// ([`Engine::take_dispatcher`]) or moved to its own thread ([`Engine::spawn_dispatcher`]).
/// Dropping it (or [`Engine::shutdown`]) stops everything.
pub struct Engine {
    handle: EngineHandle,
    dispatcher: Option<Dispatcher>,
    dispatcher_thread: Option<JoinHandle<()>>,
    balancer_thread: Option<JoinHandle<()>>,
    /// Shard threads, including those the dispatcher starts for migrations.
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
    /// The engine's part of the shutdown: its threads run in it and watch its token.
    shutdown: Shutdown,
}

impl Engine {
    /// Starts `cfg.shards` shard threads and the balancer thread (which acts only while
    /// auto-balance is on), as threads of `shutdown`: stopping it (or [`Engine::shutdown`])
    /// stops them.
    pub fn start(cfg: EngineConfig, shutdown: &Shutdown) -> Result<Self, EngineError> {
        cfg.validate().map_err(|e| EngineError::Config(e.0))?;
        let reg = Arc::new(Registry::new(cfg.max_shards, cfg.top_n, cfg.auto_balance));
        let (control, control_rx) = mpsc::channel();
        let threads = Arc::new(Mutex::new(Vec::new()));
        let dispatcher = Dispatcher::new(
            reg.clone(),
            control_rx,
            cfg.clone(),
            threads.clone(),
            shutdown.clone(),
        )?;
        let handle = EngineHandle { reg, control };
        let balancer_thread = {
            let handle = handle.clone();
            let balancer = Balancer::new(cfg.balance.clone());
            shutdown
                .spawn_thread("l3-balancer".into(), move |stop| {
                    run_balancer(balancer, handle, &stop)
                })
                .map_err(|e| {
                    EngineError::Config(format!("cannot start the balancer thread: {e}"))
                })?
        };
        Ok(Self {
            handle,
            dispatcher: Some(dispatcher),
            dispatcher_thread: None,
            balancer_thread: Some(balancer_thread),
            threads,
            shutdown: shutdown.clone(),
        })
    }

    pub fn handle(&self) -> EngineHandle {
        self.handle.clone()
    }

    /// The dispatcher, for a caller that feeds events from one thread of its own. Drop it (or
    /// call [`Engine::shutdown`], which cannot reach it) to stop the shards.
    pub fn take_dispatcher(&mut self) -> Result<Dispatcher, EngineError> {
        self.dispatcher.take().ok_or(EngineError::DispatcherTaken)
    }

    /// Runs the dispatcher on its own thread, fed by `rx` (a bounded channel of event batches
    /// from any number of producers: a full channel pushes back on them). Control requests are
    /// drained before each batch and every few ms when idle. The thread ends when every sender
    /// is dropped or on shutdown.
    pub fn spawn_dispatcher(&mut self, rx: Receiver<Vec<TickEvent>>) -> Result<(), EngineError> {
        let mut d = self.take_dispatcher()?;
        let t = self
            .shutdown
            .spawn_thread("l3-dispatcher".into(), move |stop| {
                loop {
                    match rx.recv_timeout(IDLE_POLL) {
                        Ok(events) => d.dispatch(&events),
                        Err(RecvTimeoutError::Timeout) => d.poll_control(),
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                    if d.is_stopped() || stop.is_cancelled() {
                        break;
                    }
                }
                // What producers queued before the stop is dispatched first (bounded, in case a
                // producer keeps sending), then the shards are told to stop behind it: a shutdown
                // loses nothing already accepted.
                for _ in 0..MAX_DRAIN_BATCHES {
                    let Ok(events) = rx.try_recv() else { break };
                    d.dispatch(&events);
                }
                d.poll_control();
                d.stop();
            })
            .map_err(|e| EngineError::Config(format!("cannot start the dispatcher thread: {e}")))?;
        self.dispatcher_thread = Some(t);
        Ok(())
    }

    /// Stops the balancer, then the shards after they have processed what was queued, and waits
    /// for every thread. A dispatcher taken with [`Engine::take_dispatcher`] must have been
    /// dropped first (it owns the shards' queues).
    pub fn shutdown(mut self) {
        self.stop_all();
    }

    fn stop_all(&mut self) {
        self.shutdown.stop();
        if let Some(t) = self.dispatcher_thread.take() {
            // the thread dispatches what is queued, then stops the shards
            let _ = t.join();
        } else {
            let _ = self.handle.control.send(Control::Shutdown);
            if let Some(mut d) = self.dispatcher.take() {
                d.poll_control();
            }
        }
        if let Some(t) = self.balancer_thread.take() {
            let _ = t.join();
        }
        let threads = std::mem::take(&mut *lock(&self.threads));
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop_all();
    }
}

fn run_balancer(mut balancer: Balancer, handle: EngineHandle, stop: &CancellationToken) {
    let every = Duration::from_millis(balancer.config().interval_ms);
    let mut next = Instant::now() + every;
    while !stop.is_cancelled() {
        let now = Instant::now();
        if now < next {
            std::thread::sleep((next - now).min(Duration::from_millis(20)));
            continue;
        }
        next = now + every;
        if !handle.auto_balance() {
            continue;
        }
        let stats = handle.stats();
        if let Some(d) = balancer.look(&stats, crate::clock::wall_clock_ms()) {
            handle.reg.balancer_decisions.fetch_add(1, Relaxed);
            tracing::info!(symbol = d.symbol, from = d.from, to = ?d.to, reason = %d.reason, "l3 auto-balance: migrating");
            if let Err(e) = handle.migrate(d.symbol, d.to) {
                tracing::warn!(symbol = d.symbol, error = %e, "l3 auto-balance: migration refused");
            }
        }
    }
}

/// The engine's control surface: cheap to clone, usable from any thread (`Send + Sync`).
/// Requests travel to the dispatcher through a channel, so they take effect in order with the
/// events it dispatches after receiving them.
#[derive(Clone)]
pub struct EngineHandle {
    pub(crate) reg: Arc<Registry>,
    control: Sender<Control>,
}

impl EngineHandle {
    /// Registers an instrument; the dispatcher places it on the least loaded shard. Events may
    /// be dispatched for the returned index as soon as this returns.
    pub fn add_symbol(
        &self,
        instrument: InstrumentId,
        venue: Venue,
        policy: SeqPolicy,
        output: Box<dyn BookOutput>,
    ) -> Result<SymbolIdx, EngineError> {
        let name = instrument.to_string();
        let shared = {
            let mut symbols = self.reg.symbols.write().unwrap_or_else(|e| e.into_inner());
            let mut by_name = self.reg.by_name.write().unwrap_or_else(|e| e.into_inner());
            if by_name.contains_key(&name) {
                return Err(EngineError::DuplicateSymbol(name));
            }
            let idx = symbols.len() as SymbolIdx;
            let shared = Arc::new(SymbolShared::new(idx, instrument, venue));
            symbols.push(shared.clone());
            by_name.insert(name, idx);
            shared
        };
        let book = L3Book::with_capacity(venue, 1024).with_seq_policy(policy);
        let state = Box::new(SymbolState::new(book, output, shared.clone()));
        let idx = shared.idx;
        self.control.send(Control::Add { shared, state }).map_err(|_| EngineError::Stopped)?;
        Ok(idx)
    }

    /// The index of a registered instrument.
    pub fn symbol(&self, instrument: &InstrumentId) -> Option<SymbolIdx> {
        self.reg
            .by_name
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&instrument.to_string())
            .copied()
    }

    /// Moves a symbol to another shard or a new one (the seed's four steps). Checked here:
    /// unknown symbol or shard, the shard limit, and the symbol's current shard (unless a
    /// migration of it is in flight: then the request is queued and checked when its turn
    /// comes, counted as rejected if it is no longer valid).
    pub fn migrate(&self, symbol: SymbolIdx, target: Target) -> Result<(), EngineError> {
        let sym = self.symbol_shared(symbol)?;
        let shards = self.reg.shards.read().unwrap_or_else(|e| e.into_inner()).len();
        match target {
            Target::Shard(t) if t as usize >= shards => {
                return Err(EngineError::UnknownShard(t as i64))
            }
            Target::Shard(t) if !sym.migrating.load(Relaxed) && sym.shard.load(Relaxed) == t => {
                return Err(EngineError::SameShard { symbol, shard: t });
            }
            Target::New if shards >= self.reg.max_shards => {
                return Err(EngineError::MaxShards(self.reg.max_shards))
            }
            _ => {}
        }
        self.reg.migrations.requested.fetch_add(1, Relaxed);
        self.control.send(Control::Migrate { symbol, target }).map_err(|_| {
            self.reg.migrations.rejected.fetch_add(1, Relaxed);
            EngineError::Stopped
        })
    }

    /// Replaces a symbol's book from the source's snapshot, in order with its events: the book
    /// continues after the snapshot's sequence numbers and is live again.
    pub fn reset(&self, symbol: SymbolIdx, snapshot: L3Snapshot) -> Result<(), EngineError> {
        self.symbol_shared(symbol)?;
        self.control
            .send(Control::Reset { symbol, snapshot: Box::new(snapshot) })
            .map_err(|_| EngineError::Stopped)
    }

    pub fn set_auto_balance(&self, on: bool) {
        self.reg.auto_balance.store(on, Relaxed);
        tracing::info!(on, "l3 auto-balance switched");
    }

    pub fn auto_balance(&self) -> bool {
        self.reg.auto_balance.load(Relaxed)
    }

    pub fn stats(&self) -> EngineStats {
        self.reg.snapshot()
    }

    /// Events accepted and not yet handled, over all symbols (cheap: no allocation beyond a
    /// read lock).
    pub fn pending_total(&self) -> u64 {
        let symbols = self.reg.symbols.read().unwrap_or_else(|e| e.into_inner());
        symbols.iter().map(|s| s.pending.load(Relaxed).max(0) as u64).sum()
    }

    /// Waits until every accepted event is handled and no migration is in flight or queued;
    /// false on timeout.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let idle = {
                let symbols = self.reg.symbols.read().unwrap_or_else(|e| e.into_inner());
                symbols.iter().all(|s| s.pending.load(Relaxed) <= 0 && !s.migrating.load(Relaxed))
            };
            let m = &self.reg.migrations;
            let settled =
                m.requested.load(Relaxed) == m.completed.load(Relaxed) + m.rejected.load(Relaxed);
            if idle && settled {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    fn symbol_shared(&self, symbol: SymbolIdx) -> Result<Arc<SymbolShared>, EngineError> {
        self.reg
            .symbols
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(symbol as usize)
            .cloned()
            .ok_or(EngineError::UnknownSymbol(symbol))
    }
}
