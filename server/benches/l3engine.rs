//! The sharded tick-by-tick engine, end to end: dispatch -> shard queue -> L3Book (sequenced
//! `handle`, level updates produced and cleared, per-batch counters and output hook).
//!
//! * `l3engine/one_shard/1_symbol`: the exact stream of `cargo bench -p shared --bench l3`
//!   (`shared::testkit::l3_workload(1_000_000, 42)`), so the two figures compare directly.
//! * `l3engine/{one,two}_shard(s)/8_symbols`: eight books (`l3_workload(250_000, 42 + i)`),
//!   interleaved in bursts the way a multi-symbol feed arrives.
//!
//! One engine per group runs for the whole measurement (warm threads and allocator, as in a
//! service); each iteration registers fresh symbols (books built from empty, as in the shared
//! bench), then times handing the whole stream to the dispatcher in 64k-event slices (as a feed
//! thread would) until every event is handled. The dispatcher runs on the bench thread, the
//! shards on their own threads.
//!
//! `migration` (not a criterion loop): a hot symbol with a ~1 M event backlog on a shard shared
//! with eight cold symbols moves to a new shard; prints the move time and the cold symbols'
//! p50/p99 processing latency (dispatch to done) for events dispatched before, during and after
//! the move (the feed keeps running throughout: hot at ~10 M/s, each cold symbol ~5 k/s).
//!
//! Run: `cargo bench -p server --bench l3engine -- --warm-up-time 1 --measurement-time 5`
//! (`-- migration` for the migration run).

use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use server::l3::engine::{
    BookOutput, Engine, EngineConfig, FeedHealth, SymbolIdx, Target, TickEvent,
};
use server::shutdown::Shutdown;
use shared::book::Side;
use shared::fixed::{Price, Qty};
use shared::l3::{L3Book, Msg, SeqGap, SeqPolicy, Venue};
use shared::protocol::{InstrumentId, Market};
use shared::testkit::{l3_workload, Rng};

/// An output that does what a live consumer minimally does: looks at the top of book when
/// publishing. Counts nothing per event.
struct TopOfBook(u64);

impl BookOutput for TopOfBook {
    fn publish(&mut self, book: &L3Book, _health: FeedHealth, _now_ms: i64) {
        self.0 += book.best_bid().map_or(0, |l| l.qty.raw() as u64);
    }
    fn on_gap(&mut self, _symbol: SymbolIdx, gap: SeqGap) {
        panic!("bench stream has a gap: {gap}");
    }
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    cpu_time::ThreadTime::now().as_duration()
}

fn instrument(i: usize) -> InstrumentId {
    InstrumentId::new("bench", Market::Spot, format!("{:06}", 600_000 + i))
}

/// Interleaves per-symbol streams in random bursts of 1..64 events, keeping each one's order.
fn interleave(streams: &[Vec<Msg>], seed: u64) -> Vec<TickEvent> {
    let mut rng = Rng::new(seed);
    let mut next = vec![0usize; streams.len()];
    let total: usize = streams.iter().map(Vec::len).sum();
    let mut out = Vec::with_capacity(total);
    while out.len() < total {
        let s = rng.below(streams.len() as u64) as usize;
        for _ in 0..1 + rng.below(64) {
            if next[s] == streams[s].len() {
                break;
            }
            out.push(TickEvent {
                symbol: s as u32,
                channel: 1,
                seq: next[s] as u64 + 1,
                msg: streams[s][next[s]],
            });
            next[s] += 1;
        }
    }
    out
}

/// A long-running engine: each timed run registers fresh symbols (so every run rebuilds its books
/// from empty, like the shared bench) on warm threads and allocator, the steady state of a
/// service.
struct Rig {
    /// A symbol whose output blocks its shard until released: lets a pass be queued in full
    /// before the shard starts, to time the shard alone (no concurrent dispatcher).
    gate: SymbolIdx,
    gate_seq: u64,
    entered: mpsc::Receiver<()>,
    release: mpsc::Sender<()>,
    engine: Option<Engine>,
    d: Option<server::l3::engine::Dispatcher>,
    h: server::l3::engine::EngineHandle,
    next: usize,
}

impl Rig {
    fn new(shards: usize) -> Self {
        let mut e = Engine::start(
            EngineConfig { shards, max_shards: shards, ..EngineConfig::default() },
            &Shutdown::new(),
        )
        .unwrap();
        let h = e.handle();
        let mut d = e.take_dispatcher().unwrap();
        let (entered_tx, entered) = mpsc::channel();
        let (release, release_rx) = mpsc::channel();
        let gate = Gate { entered: entered_tx, release: release_rx };
        let gate = h
            .add_symbol(instrument(999_999), Venue::Sse, SeqPolicy::Contiguous, Box::new(gate))
            .unwrap();
        d.poll_control();
        Self { gate, gate_seq: 0, entered, release, engine: Some(e), d: Some(d), h, next: 1 }
    }

    /// Shard CPU time for a pass queued in full before the shard starts on it (one shard).
    fn run_queued_first(&mut self, nsym: usize, events: &[TickEvent]) -> Duration {
        let base = self.register(nsym);
        let events: Vec<TickEvent> =
            events.iter().map(|e| TickEvent { symbol: e.symbol + base, ..*e }).collect();
        assert!(self.h.wait_idle(Duration::from_secs(30)));
        let cpu0 = self.shard_cpu();
        self.gate_seq += 1;
        let msg = Msg::Add {
            id: self.gate_seq,
            side: Side::Bid,
            price: Price::from_units(1),
            qty: Qty::from_units(1),
        };
        let d = self.d.as_mut().unwrap();
        d.dispatch(&[TickEvent { symbol: self.gate, channel: 1, seq: self.gate_seq, msg }]);
        self.entered.recv().unwrap();
        for slice in events.chunks(64 * 1024) {
            d.dispatch(slice);
        }
        self.release.send(()).unwrap();
        while self.h.pending_total() > 0 {
            std::thread::sleep(Duration::from_micros(20));
        }
        Duration::from_nanos(self.shard_cpu()[0] - cpu0[0])
    }

    fn register(&mut self, nsym: usize) -> SymbolIdx {
        let base = (0..nsym)
            .map(|_| {
                self.next += 1;
                let out = Box::new(TopOfBook(0));
                self.h
                    .add_symbol(instrument(self.next), Venue::Sse, SeqPolicy::Contiguous, out)
                    .unwrap()
            })
            .min()
            .unwrap();
        self.d.as_mut().unwrap().poll_control();
        base
    }

    /// Shards' CPU time once every shard is idle.
    fn shard_cpu(&self) -> Vec<u64> {
        loop {
            let st = self.h.stats();
            if st.shards.iter().all(|s| s.lag_us == 0) {
                return st.shards.iter().map(|s| s.cpu_ns).collect();
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    /// One pass of `events` (symbols `0..nsym`) over `nsym` new symbols: the wall time, and the
    /// CPU time of the busiest shard thread (what the shard needs, whatever else the shared
    /// machine runs).
    fn run(&mut self, nsym: usize, events: &[TickEvent]) -> (Duration, Duration) {
        let base = self.register(nsym);
        let events: Vec<TickEvent> =
            events.iter().map(|e| TickEvent { symbol: e.symbol + base, ..*e }).collect();
        assert!(self.h.wait_idle(Duration::from_secs(30)));
        let before: u64 = self.h.stats().shards.iter().map(|s| s.processed).sum();
        let cpu0 = self.shard_cpu();
        let d = self.d.as_mut().unwrap();
        let t = Instant::now();
        for slice in events.chunks(64 * 1024) {
            d.dispatch(slice);
        }
        while self.h.pending_total() > 0 {
            std::thread::sleep(Duration::from_micros(20));
        }
        let took = t.elapsed();
        let cpu1 = self.shard_cpu();
        let cpu = cpu1.iter().zip(&cpu0).map(|(a, b)| a - b).max().unwrap_or(0);
        let st = self.h.stats();
        assert_eq!(
            st.shards.iter().map(|s| s.processed).sum::<u64>() - before,
            events.len() as u64
        );
        assert!(st.symbols.iter().all(|s| s.not_applied == 0 && s.gaps == 0));
        (took, Duration::from_nanos(cpu))
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        drop(self.d.take());
        if let Some(e) = self.engine.take() {
            e.shutdown();
        }
    }
}

fn throughput(c: &mut Criterion) {
    let one: Vec<TickEvent> = l3_workload(1_000_000, 42)
        .into_iter()
        .enumerate()
        .map(|(i, msg)| TickEvent { symbol: 0, channel: 1, seq: i as u64 + 1, msg })
        .collect();
    let streams: Vec<Vec<Msg>> = (0..8).map(|i| l3_workload(250_000, 42 + i)).collect();
    let eight = interleave(&streams, 7);

    let mut g = c.benchmark_group("l3engine");
    g.sample_size(10);
    // the floor: the same streams applied directly to L3Books on this thread, no engine
    let direct = |events: &[TickEvent], nsym: usize| {
        let mut books: Vec<L3Book> =
            (0..nsym).map(|_| L3Book::with_capacity(Venue::Sse, 1024)).collect();
        let (t, c) = (Instant::now(), thread_cpu());
        for e in events {
            let b = &mut books[e.symbol as usize];
            let _ = b.handle(e.channel, e.seq, e.msg);
            if b.pending_updates().len() >= 256 {
                b.clear_updates();
            }
        }
        let took = (t.elapsed(), thread_cpu() - c);
        std::hint::black_box(&books);
        took
    };
    g.throughput(Throughput::Elements(one.len() as u64));
    g.bench_function("direct_l3book/1_symbol/wall", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| direct(&one, 1).0).sum())
    });
    g.bench_function("direct_l3book/1_symbol/thread_cpu", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| direct(&one, 1).1).sum())
    });
    g.throughput(Throughput::Elements(eight.len() as u64));
    g.bench_function("direct_l3book/8_symbols/wall", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| direct(&eight, 8).0).sum())
    });
    g.bench_function("direct_l3book/8_symbols/thread_cpu", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| direct(&eight, 8).1).sum())
    });
    g.throughput(Throughput::Elements(one.len() as u64));
    // wall: dispatch of the first event to the last event handled; shard_cpu: the busiest shard
    // thread's CPU time for the same pass (the machine is shared: this is what a core sustains)
    let mut rig = Rig::new(1);
    g.throughput(Throughput::Elements(one.len() as u64));
    g.bench_function("one_shard/1_symbol/wall", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| rig.run(1, &one).0).sum())
    });
    g.bench_function("one_shard/1_symbol/shard_cpu", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| rig.run(1, &one).1).sum())
    });
    g.bench_function("one_shard/1_symbol/shard_cpu_queued_first", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| rig.run_queued_first(1, &one)).sum())
    });
    g.throughput(Throughput::Elements(eight.len() as u64));
    g.bench_function("one_shard/8_symbols/wall", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| rig.run(8, &eight).0).sum())
    });
    g.bench_function("one_shard/8_symbols/shard_cpu", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| rig.run(8, &eight).1).sum())
    });
    g.bench_function("one_shard/8_symbols/shard_cpu_queued_first", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| rig.run_queued_first(8, &eight)).sum())
    });
    drop(rig);
    let mut rig = Rig::new(2);
    g.bench_function("two_shards/8_symbols/wall", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| rig.run(8, &eight).0).sum())
    });
    g.bench_function("two_shards/8_symbols/shard_cpu", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| rig.run(8, &eight).1).sum())
    });
    g.finish();
}

/// Blocks its shard in `on_applied` until released.
struct Gate {
    entered: mpsc::Sender<()>,
    release: mpsc::Receiver<()>,
}

impl BookOutput for Gate {
    fn publish(&mut self, _: &L3Book, _: FeedHealth, _: i64) {}
    fn on_gap(&mut self, _: SymbolIdx, _: SeqGap) {}
    fn on_applied(&mut self, _: &L3Book, applied: u32, _: Duration) {
        if applied > 0 {
            let _ = self.entered.send(());
            let _ = self.release.recv();
        }
    }
}

/// Cold symbols' event latencies (dispatch to done) with their completion time, so each is
/// classed by when it was dispatched.
struct ColdProbe {
    samples: Arc<Mutex<Vec<(Instant, Duration, u32)>>>,
}

impl BookOutput for ColdProbe {
    fn publish(&mut self, _: &L3Book, _: FeedHealth, _: i64) {}
    fn on_gap(&mut self, _: SymbolIdx, gap: SeqGap) {
        panic!("bench stream has a gap: {gap}");
    }
    fn on_applied(&mut self, _: &L3Book, applied: u32, latency: Duration) {
        if applied > 0 {
            self.samples.lock().unwrap().push((Instant::now(), latency, applied));
        }
    }
}

fn percentile(v: &mut [u32], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_unstable();
    v[((v.len() as f64 * q) as usize).min(v.len() - 1)] as f64 / 1000.0
}

/// One migration of a hot symbol with a ~1 M event backlog; returns a printable line.
fn migration_once(hot_stream: &[Msg], cold_streams: &[Vec<Msg>]) -> String {
    let mut e = Engine::start(
        EngineConfig { shards: 1, max_shards: 2, ..EngineConfig::default() },
        &Shutdown::new(),
    )
    .unwrap();
    let h = e.handle();
    let mut d = e.take_dispatcher().unwrap();
    let samples = Arc::new(Mutex::new(Vec::with_capacity(1 << 20)));
    let hot = h
        .add_symbol(instrument(0), Venue::Sse, SeqPolicy::Contiguous, Box::new(TopOfBook(0)))
        .unwrap();
    let cold: Vec<SymbolIdx> = (0..cold_streams.len())
        .map(|i| {
            let probe = ColdProbe { samples: samples.clone() };
            h.add_symbol(instrument(i + 1), Venue::Sse, SeqPolicy::Contiguous, Box::new(probe))
                .unwrap()
        })
        .collect();
    d.poll_control();
    let mut hot_next = 0usize;
    let mut cold_next = vec![0usize; cold.len()];
    let mut tick_cold = |d: &mut server::l3::engine::Dispatcher| {
        let evs: Vec<TickEvent> = (0..cold.len())
            .filter(|&k| cold_next[k] < cold_streams[k].len())
            .map(|k| {
                let i = cold_next[k];
                TickEvent {
                    symbol: cold[k],
                    channel: 1,
                    seq: i as u64 + 1,
                    msg: cold_streams[k][i],
                }
            })
            .collect();
        for ev in &evs {
            cold_next[(ev.symbol - 1) as usize] += 1;
        }
        d.dispatch(&evs);
    };
    let mut send_hot = |d: &mut server::l3::engine::Dispatcher, n: usize| {
        let end = (hot_next + n).min(hot_stream.len());
        let evs: Vec<TickEvent> = (hot_next..end)
            .map(|i| TickEvent { symbol: hot, channel: 1, seq: i as u64 + 1, msg: hot_stream[i] })
            .collect();
        hot_next = end;
        d.dispatch(&evs);
    };
    // before: the hot symbol floods the shared shard until its backlog is ~1 M events
    let t0 = Instant::now();
    while h.stats().symbol(hot).unwrap().pending < 1_000_000
        && t0.elapsed() < Duration::from_secs(20)
    {
        send_hot(&mut d, 100_000);
        tick_cold(&mut d);
        std::thread::sleep(Duration::from_micros(200));
    }
    let backlog = h.stats().symbol(hot).unwrap().pending;
    // during: the move, while the feed goes on (hot at a moderate rate)
    let t_move = Instant::now();
    h.migrate(hot, Target::New).unwrap();
    let mut source_drained = None;
    loop {
        send_hot(&mut d, 2_000);
        tick_cold(&mut d);
        let st = h.stats();
        // drained: only the cold symbols' trickle is left on the source
        if source_drained.is_none() && st.shard(0).unwrap().pending <= cold.len() as u64 {
            source_drained = Some(t_move.elapsed());
        }
        if st.migrations.completed == 1 {
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let observed = t_move.elapsed();
    let t_done = Instant::now();
    // after: the same feed for 300 ms
    let t_after = Instant::now();
    while t_after.elapsed() < Duration::from_millis(300) {
        send_hot(&mut d, 2_000);
        tick_cold(&mut d);
        std::thread::sleep(Duration::from_micros(200));
    }
    h.wait_idle(Duration::from_secs(30));
    let st = h.stats();
    drop(d);
    e.shutdown();
    let s = samples.lock().unwrap();
    let mut by_phase: [Vec<u32>; 3] = Default::default();
    for &(done, latency, n) in s.iter() {
        let sent = done - latency;
        let p = if sent < t_move {
            0
        } else if sent < t_done {
            1
        } else {
            2
        };
        by_phase[p].extend(std::iter::repeat_n(
            latency.as_micros().min(u32::MAX as u128) as u32,
            n as usize,
        ));
    }
    let [mut b, mut du, mut a] = by_phase;
    format!(
        "backlog {backlog} events, legacy packed {}, move {:.1} ms (engine: step 1 -> resumed {:.1} ms), source shard drained after {:.1} ms | cold latency ms p50/p99: before {:.2}/{:.2} ({} ev), during {:.2}/{:.2} ({} ev), after {:.2}/{:.2} ({} ev)",
        st.migrations.last_legacy_events,
        observed.as_secs_f64() * 1e3,
        st.migrations.last_us as f64 / 1e3,
        source_drained.map_or(f64::NAN, |d| d.as_secs_f64() * 1e3),
        percentile(&mut b, 0.5),
        percentile(&mut b, 0.99),
        b.len(),
        percentile(&mut du, 0.5),
        percentile(&mut du, 0.99),
        du.len(),
        percentile(&mut a, 0.5),
        percentile(&mut a, 0.99),
        a.len(),
    )
}

fn migration() {
    let hot_stream = l3_workload(4_000_000, 42);
    let cold_streams: Vec<Vec<Msg>> = (0..8).map(|i| l3_workload(60_000, 100 + i)).collect();
    for run in 0..5 {
        println!("migration run {run}: {}", migration_once(&hot_stream, &cold_streams));
    }
}

criterion::criterion_group!(benches, throughput);

fn main() {
    // `-- migration` runs the migration scenario instead of the criterion groups
    if std::env::args().any(|a| a == "migration") {
        migration();
    } else {
        benches();
        Criterion::default().configure_from_args().final_summary();
    }
}
