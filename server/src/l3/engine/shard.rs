//! A shard: one OS thread, one FIFO queue of [`ShardMsg`]s (event batches and commands in one
//! order), and the symbols it owns in plain memory.
//!
//! The per-event path indexes a `Vec` by symbol, matches the symbol's mode and calls
//! [`L3Book::handle`]; per-symbol counters are kept in the slot and published to the atomics once
//! per batch, together with the clock read that drives publishing, rates and lag.

use std::mem;
use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, SyncSender, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shared::l3::{Handled, L3Book};

use super::stats::{Registry, ShardShared, SymbolShared};
use super::{BookOutput, FeedHealth, L3Snapshot, SymbolIdx, TickEvent};

/// Events of one dispatch for one shard, stamped when queued (the lag is measured from it).
pub(crate) struct Batch {
    pub events: Vec<TickEvent>,
    pub enqueued: Instant,
}

/// What travels in a shard's queue. Commands sit between batches, so their position relative to
/// the data is exact.
pub(crate) enum ShardMsg {
    Events(Batch),
    /// A new symbol, placed on this shard.
    Add {
        symbol: SymbolIdx,
        state: Box<SymbolState>,
    },
    /// Replace the book from a snapshot (recovery after a gap), in order with the data.
    Reset {
        symbol: SymbolIdx,
        snapshot: Box<L3Snapshot>,
    },
    /// Step 1 (target): buffer this symbol's events until its state arrives.
    MigrateStart {
        symbol: SymbolIdx,
    },
    /// Step 4 (source): the sentinel behind the symbol's backlog; hand state and legacy over.
    MigrateFlush {
        symbol: SymbolIdx,
        target: Sender<ShardMsg>,
        target_id: u32,
        started: Instant,
    },
    /// Source to target: the state and the packed backlog; replay legacy, then the buffer.
    MigrateComplete {
        symbol: SymbolIdx,
        state: Box<SymbolState>,
        legacy: Backlog,
        started: Instant,
        from: u32,
    },
    Stop,
}

/// A symbol's state: moves between shards as one piece.
pub(crate) struct SymbolState {
    pub book: L3Book,
    pub output: Box<dyn BookOutput>,
    pub shared: Arc<SymbolShared>,
    /// Health as last decided (a gap sets it; a reset or a filled gap clears it).
    pub stale: bool,
    /// `shared.processed` at the start of the current rate window.
    rate_base: u64,
    /// Handled-but-not-applied events not yet added to the shared counter.
    not_applied: u64,
}

impl SymbolState {
    pub fn new(book: L3Book, output: Box<dyn BookOutput>, shared: Arc<SymbolShared>) -> Self {
        Self { book, output, shared, stale: false, rate_base: 0, not_applied: 0 }
    }

    fn health(&self) -> FeedHealth {
        if self.stale || self.book.is_stale() {
            FeedHealth::Stale
        } else {
            FeedHealth::Live
        }
    }

    /// Sequences and applies one event. A gap marks the book stale once (counted, `on_gap`);
    /// while it is open, later numbers are rejected by the book's sequencer, never applied.
    #[inline(always)]
    fn apply(&mut self, ev: &TickEvent) {
        match self.book.handle(ev.channel, ev.seq, ev.msg) {
            Ok(Handled::Applied) => {
                if self.stale && !self.book.is_stale() {
                    // the missing numbers were retransmitted: the book is exact again
                    self.stale = false;
                    self.shared.stale.store(false, Relaxed);
                }
            }
            Ok(Handled::Duplicate) => self.not_applied += 1,
            Err(gap) => {
                self.not_applied += 1;
                if !self.stale {
                    self.stale = true;
                    self.shared.stale.store(true, Relaxed);
                    self.shared.gaps.fetch_add(1, Relaxed);
                    tracing::warn!(symbol = %self.shared.instrument, %gap, "l3 book stale: sequence gap");
                    self.output.on_gap(ev.symbol, gap);
                }
            }
        }
    }

    fn reset(&mut self, snapshot: L3Snapshot) {
        self.book.restore(snapshot.orders, &snapshot.channel_last_seq);
        self.stale = false;
        self.shared.stale.store(false, Relaxed);
        self.shared.resets.fetch_add(1, Relaxed);
        tracing::info!(symbol = %self.shared.instrument, "l3 book reset from snapshot");
    }
}

/// Events (and resets, at their position) held for a migrating symbol: the target's buffer, or
/// the source's packed legacy list. Kept as a list of chunks so that a queued batch holding only
/// this symbol's events is moved in whole (a pointer, not 1024 copies): packing a backlog costs
/// O(batches), which is what makes the source's drain fast.
#[derive(Default)]
pub(crate) struct Backlog {
    chunks: Vec<Vec<TickEvent>>,
    len: usize,
    /// `(number of events before it, snapshot)`.
    resets: Vec<(usize, L3Snapshot)>,
}

impl Backlog {
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    fn push(&mut self, ev: TickEvent) {
        match self.chunks.last_mut() {
            Some(c) if c.len() < c.capacity() => c.push(ev),
            _ => {
                let mut c = Vec::with_capacity(1024);
                c.push(ev);
                self.chunks.push(c);
            }
        }
        self.len += 1;
    }

    fn push_batch(&mut self, events: Vec<TickEvent>) {
        self.len += events.len();
        self.chunks.push(events);
    }

    fn push_reset(&mut self, snapshot: L3Snapshot) {
        self.resets.push((self.len, snapshot));
    }
}

/// What a shard holds for one symbol.
enum Mode {
    /// Normal processing.
    Live(SymbolState),
    /// Migrating in: the state has not arrived yet.
    Buffering(Backlog),
    /// Migrating out: the backlog is packed, not computed.
    PackingOut(SymbolState, Backlog),
}

struct Slot {
    mode: Mode,
    /// Events handled for this symbol in the current batch.
    batch_n: u32,
    /// Changed since the last publish.
    dirty: bool,
}

pub(crate) struct Shard {
    id: u32,
    rx: Receiver<ShardMsg>,
    /// Emptied batch vectors go back to the dispatcher, so steady state allocates nothing.
    recycle: SyncSender<Vec<TickEvent>>,
    shared: Arc<ShardShared>,
    reg: Arc<Registry>,
    slots: Vec<Option<Slot>>,
    /// Symbols handled in the current batch.
    touched: Vec<SymbolIdx>,
    /// Symbols to publish (may hold stale or repeated entries; `Slot::dirty` decides).
    dirty: Vec<SymbolIdx>,
    seen_out_gen: u64,
    /// Symbols in `Buffering` or `PackingOut` mode (the whole-batch move is tried only then).
    holding: usize,
    publish_every: Duration,
    next_publish: Instant,
    rate_at: Instant,
    rate_base: u64,
    processed: u64,
}

const RATE_WINDOW: Duration = Duration::from_millis(1000);

impl Shard {
    pub fn new(
        id: u32,
        rx: Receiver<ShardMsg>,
        recycle: SyncSender<Vec<TickEvent>>,
        shared: Arc<ShardShared>,
        reg: Arc<Registry>,
        publish_every: Duration,
    ) -> Self {
        let now = Instant::now();
        Self {
            id,
            rx,
            recycle,
            shared,
            reg,
            slots: Vec::new(),
            touched: Vec::new(),
            dirty: Vec::new(),
            seen_out_gen: 0,
            holding: 0,
            publish_every,
            next_publish: now + publish_every,
            rate_at: now,
            rate_base: 0,
            processed: 0,
        }
    }

    /// The thread body: until `Stop` or every sender is gone.
    pub fn run(mut self) {
        loop {
            let msg = match self.rx.try_recv() {
                Ok(m) => m,
                Err(TryRecvError::Disconnected) => break,
                Err(TryRecvError::Empty) => {
                    self.shared.cpu_ns.store(thread_cpu_ns(), Relaxed);
                    self.shared.busy_since_ns.store(0, Relaxed);
                    let now = Instant::now();
                    self.tick(now);
                    match self.rx.recv_timeout(self.next_publish.saturating_duration_since(now)) {
                        Ok(m) => m,
                        Err(RecvTimeoutError::Timeout) => continue,
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                }
            };
            match msg {
                ShardMsg::Events(batch) => self.process(batch),
                ShardMsg::Add { symbol, state } => {
                    self.install(symbol, Mode::Live(*state));
                    self.mark_dirty(symbol);
                }
                ShardMsg::Reset { symbol, snapshot } => self.reset(symbol, *snapshot),
                ShardMsg::MigrateStart { symbol } => {
                    self.holding += 1;
                    self.install(symbol, Mode::Buffering(Backlog::default()))
                }
                ShardMsg::MigrateFlush { symbol, target, target_id, started } => {
                    self.flush(symbol, target, target_id, started)
                }
                ShardMsg::MigrateComplete { symbol, state, legacy, started, from } => {
                    self.complete(symbol, *state, legacy, started, from)
                }
                ShardMsg::Stop => break,
            }
            self.tick(Instant::now());
        }
        // a last publish so outputs end on the final books
        self.publish(crate::clock::wall_clock_ms());
        self.shared.busy_since_ns.store(0, Relaxed);
    }

    fn slot_mut(&mut self, symbol: SymbolIdx) -> Option<&mut Slot> {
        self.slots.get_mut(symbol as usize).and_then(Option::as_mut)
    }

    fn install(&mut self, symbol: SymbolIdx, mode: Mode) {
        let i = symbol as usize;
        if self.slots.len() <= i {
            self.slots.resize_with(i + 1, || None);
        }
        if self.slots[i].is_some() {
            // the dispatcher never sends this; keep the existing state rather than lose it
            tracing::error!(shard = self.id, symbol, "l3 shard: symbol installed twice; ignored");
            return;
        }
        self.slots[i] = Some(Slot { mode, batch_n: 0, dirty: false });
        self.shared.symbols.fetch_add(1, Relaxed);
    }

    fn mark_dirty(&mut self, symbol: SymbolIdx) {
        if let Some(slot) = self.slots.get_mut(symbol as usize).and_then(Option::as_mut) {
            if !slot.dirty {
                slot.dirty = true;
                self.dirty.push(symbol);
            }
        }
    }

    /// Step 2 seen: symbols flagged `migrating_out` switch to packing.
    fn start_packing(&mut self) {
        for slot in self.slots.iter_mut().flatten() {
            if let Mode::Live(st) = &slot.mode {
                if st.shared.migrating_out.load(Acquire) {
                    let Mode::Live(st) =
                        mem::replace(&mut slot.mode, Mode::Buffering(Backlog::default()))
                    else {
                        unreachable!()
                    };
                    slot.mode = Mode::PackingOut(st, Backlog::default());
                    self.holding += 1;
                }
            }
        }
    }

    fn process(&mut self, batch: Batch) {
        let Batch { mut events, enqueued } = batch;
        self.shared.busy_since_ns.store(self.reg.stamp(enqueued), Relaxed);
        let gen = self.shared.out_gen.load(Acquire);
        if gen != self.seen_out_gen {
            self.seen_out_gen = gen;
            self.start_packing();
        }
        let (mut held, mut misrouted) = (0i64, 0u64);
        // a batch of one migrating symbol only (a hot symbol's backlog) moves in whole
        if self.holding > 0 {
            if let Some(first) = events.first().map(|e| e.symbol) {
                if events.iter().all(|e| e.symbol == first) {
                    if let Some(Some(Slot {
                        mode: Mode::Buffering(b) | Mode::PackingOut(_, b),
                        ..
                    })) = self.slots.get_mut(first as usize)
                    {
                        let n = events.len() as i64;
                        b.push_batch(events);
                        self.shared.buffered.fetch_add(n, Relaxed);
                        self.shared.queued.fetch_sub(n, Relaxed);
                        return;
                    }
                }
            }
        }
        for ev in &events {
            let Some(Some(slot)) = self.slots.get_mut(ev.symbol as usize) else {
                misrouted += 1;
                continue;
            };
            match &mut slot.mode {
                Mode::Live(st) => {
                    if slot.batch_n == 0 {
                        self.touched.push(ev.symbol);
                    }
                    slot.batch_n += 1;
                    st.apply(ev);
                }
                Mode::Buffering(b) | Mode::PackingOut(_, b) => {
                    b.push(*ev);
                    held += 1;
                }
            }
        }
        let n = events.len() as i64;
        events.clear();
        let _ = self.recycle.try_send(events);
        let now = Instant::now();
        let latency = now.saturating_duration_since(enqueued);
        let mut handled = 0u64;
        for i in 0..self.touched.len() {
            let symbol = self.touched[i];
            let Some(slot) = self.slots.get_mut(symbol as usize).and_then(Option::as_mut) else {
                continue;
            };
            let k = mem::take(&mut slot.batch_n);
            handled += k as u64;
            if let Mode::Live(st) | Mode::PackingOut(st, _) = &mut slot.mode {
                finish_run(st, k, latency);
            }
            if !slot.dirty {
                slot.dirty = true;
                self.dirty.push(symbol);
            }
        }
        self.touched.clear();
        self.processed += handled;
        self.shared.processed.fetch_add(handled, Relaxed);
        self.shared.queued.fetch_sub(n, Relaxed);
        if held != 0 {
            self.shared.buffered.fetch_add(held, Relaxed);
        }
        if misrouted != 0 {
            self.shared.misrouted.fetch_add(misrouted, Relaxed);
            tracing::error!(
                shard = self.id,
                misrouted,
                "l3 shard: events for symbols it does not hold"
            );
        }
    }

    fn reset(&mut self, symbol: SymbolIdx, snapshot: L3Snapshot) {
        let Some(slot) = self.slot_mut(symbol) else {
            tracing::error!(symbol, "l3 shard: reset for a symbol it does not hold");
            return;
        };
        match &mut slot.mode {
            Mode::Live(st) => {
                st.reset(snapshot);
                finish_run(st, 0, Duration::ZERO);
            }
            Mode::Buffering(b) | Mode::PackingOut(_, b) => b.push_reset(snapshot),
        }
        self.mark_dirty(symbol);
    }

    /// Step 4 at the source: everything before the sentinel is packed; hand over.
    fn flush(
        &mut self,
        symbol: SymbolIdx,
        target: Sender<ShardMsg>,
        target_id: u32,
        started: Instant,
    ) {
        let Some(slot) = self.slots.get_mut(symbol as usize).and_then(Option::take) else {
            tracing::error!(
                shard = self.id,
                symbol,
                "l3 migration: flush for a symbol the shard does not hold"
            );
            return;
        };
        let (state, legacy) = match slot.mode {
            Mode::Live(st) => (st, Backlog::default()),
            Mode::PackingOut(st, legacy) => {
                self.holding -= 1;
                (st, legacy)
            }
            Mode::Buffering(b) => {
                // chains are serialised by the dispatcher, so this cannot happen; keep the data
                tracing::error!(
                    shard = self.id,
                    symbol,
                    "l3 migration: flush while still migrating in"
                );
                self.slots[symbol as usize] =
                    Some(Slot { mode: Mode::Buffering(b), batch_n: 0, dirty: false });
                return;
            }
        };
        state.shared.migrating_out.store(false, Relaxed);
        self.shared.symbols.fetch_sub(1, Relaxed);
        self.shared.buffered.fetch_sub(legacy.len() as i64, Relaxed);
        let msg = ShardMsg::MigrateComplete {
            symbol,
            state: Box::new(state),
            legacy,
            started,
            from: self.id,
        };
        if target.send(msg).is_err() {
            tracing::error!(
                symbol,
                target = target_id,
                "l3 migration: target shard is gone; state lost"
            );
        }
    }

    /// The target's half of step 4: replay legacy, then the buffer, then resume.
    fn complete(
        &mut self,
        symbol: SymbolIdx,
        mut state: SymbolState,
        legacy: Backlog,
        started: Instant,
        from: u32,
    ) {
        let buffer = match self.slot_mut(symbol) {
            Some(slot) => match mem::replace(&mut slot.mode, Mode::Buffering(Backlog::default())) {
                Mode::Buffering(b) => b,
                other => {
                    slot.mode = other;
                    tracing::error!(
                        symbol,
                        "l3 migration: state arrived for a symbol not migrating in; dropped"
                    );
                    return;
                }
            },
            None => {
                tracing::error!(symbol, "l3 migration: state arrived without MigrateStart");
                self.install(symbol, Mode::Buffering(Backlog::default()));
                Backlog::default()
            }
        };
        self.holding = self.holding.saturating_sub(1);
        let (legacy_n, buffer_n) = (legacy.len(), buffer.len());
        let n = replay(&mut state, legacy, started, &self.recycle)
            + replay(&mut state, buffer, started, &self.recycle);
        let now = Instant::now();
        self.shared.buffered.fetch_sub(buffer_n as i64, Relaxed);
        self.shared.processed.fetch_add(n, Relaxed);
        self.processed += n;
        state.shared.migrations.fetch_add(1, Relaxed);
        state.shared.migrating.store(false, Relaxed);
        let took = now.saturating_duration_since(started).as_micros() as u64;
        let m = &self.reg.migrations;
        m.completed.fetch_add(1, Relaxed);
        m.last_us.store(took, Relaxed);
        m.max_us.fetch_max(took, Relaxed);
        m.last_legacy.store(legacy_n as u64, Relaxed);
        m.legacy_total.fetch_add(legacy_n as u64, Relaxed);
        tracing::info!(
            symbol = %state.shared.instrument,
            from,
            to = self.id,
            legacy = legacy_n,
            buffered = buffer_n,
            took_us = took,
            "l3 migration complete"
        );
        if let Some(slot) = self.slot_mut(symbol) {
            slot.mode = Mode::Live(state);
        }
        self.mark_dirty(symbol);
    }

    /// Publishing and rates, when due.
    fn tick(&mut self, now: Instant) {
        if now >= self.next_publish {
            self.next_publish = now + self.publish_every;
            self.publish(crate::clock::wall_clock_ms());
        }
        let since = now.saturating_duration_since(self.rate_at);
        if since >= RATE_WINDOW {
            let secs = since.as_secs_f64();
            self.shared
                .rate
                .store(((self.processed - self.rate_base) as f64 / secs) as u64, Relaxed);
            self.rate_base = self.processed;
            self.rate_at = now;
            self.shared.cpu_ns.store(thread_cpu_ns(), Relaxed);
            for slot in self.slots.iter_mut().flatten() {
                if let Mode::Live(st) | Mode::PackingOut(st, _) = &mut slot.mode {
                    let p = st.shared.processed.load(Relaxed);
                    st.shared
                        .rate
                        .store((p.saturating_sub(st.rate_base) as f64 / secs) as u64, Relaxed);
                    st.rate_base = p;
                }
            }
        }
    }

    fn publish(&mut self, now_ms: i64) {
        let dirty = mem::take(&mut self.dirty);
        for &symbol in &dirty {
            let Some(slot) = self.slots.get_mut(symbol as usize).and_then(Option::as_mut) else {
                continue;
            };
            if !mem::take(&mut slot.dirty) {
                continue;
            }
            if let Mode::Live(st) | Mode::PackingOut(st, _) = &mut slot.mode {
                let health = st.health();
                st.output.publish(&st.book, health, now_ms);
            }
        }
        self.dirty = dirty;
        self.dirty.clear();
    }
}

/// CPU time used by the calling thread, ns (a system call: read when going idle or once per
/// rate window, never per batch); 0 where the platform cannot tell.
fn thread_cpu_ns() -> u64 {
    cpu_time::ThreadTime::try_now()
        .map_or(0, |t| u64::try_from(t.as_duration().as_nanos()).unwrap_or(u64::MAX))
}

/// Per-batch bookkeeping for one symbol: counters, the output's `on_applied`, level updates
/// cleared.
fn finish_run(st: &mut SymbolState, handled: u32, latency: Duration) {
    let sh = &st.shared;
    if handled > 0 {
        sh.pending.fetch_sub(handled as i64, Relaxed);
        sh.processed.fetch_add(handled as u64, Relaxed);
        sh.lag_us.store(latency.as_micros() as u64, Relaxed);
    }
    if st.not_applied > 0 {
        sh.not_applied.fetch_add(mem::take(&mut st.not_applied), Relaxed);
    }
    st.output.on_applied(&st.book, handled, latency);
    st.book.clear_updates();
}

/// Applies a backlog in order (resets at their positions), with the per-batch bookkeeping every
/// `REPLAY_CHUNK` events so level updates do not pile up; returns the events handled.
fn replay(
    st: &mut SymbolState,
    backlog: Backlog,
    started: Instant,
    recycle: &SyncSender<Vec<TickEvent>>,
) -> u64 {
    const REPLAY_CHUNK: u32 = 4096;
    let Backlog { chunks, len, resets } = backlog;
    let mut resets = resets.into_iter().peekable();
    let (mut i, mut run) = (0usize, 0u32);
    for mut chunk in chunks {
        for ev in &chunk {
            while let Some((_, snap)) = resets.next_if(|(at, _)| *at == i) {
                st.reset(snap);
            }
            st.apply(ev);
            i += 1;
            run += 1;
            if run == REPLAY_CHUNK {
                finish_run(st, run, started.elapsed());
                run = 0;
            }
        }
        chunk.clear();
        let _ = recycle.try_send(chunk);
    }
    for (_, snap) in resets {
        st.reset(snap);
    }
    finish_run(st, run, started.elapsed());
    len as u64
}
