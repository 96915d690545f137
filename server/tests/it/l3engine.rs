//! The sharded tick-by-tick engine through its public interface: order and book equality under
//! random migrations (chains included), the seed's packing hand-over, gap -> stale -> reset ->
//! live, typed refusals, and head-of-line blocking cured by the automatic policy.

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use server::config::engine::BadEngineConfig;
use server::l3::engine::{
    BalanceConfig, BookOutput, Engine, EngineConfig, EngineError, EngineHandle, FeedHealth,
    L3Snapshot, SymbolIdx, Target, TickEvent,
};
use server::shutdown::Shutdown;
use shared::book::Side;
use shared::fixed::{Price, Qty};
use shared::l3::{L3Book, Msg, Order, SeqGap, SeqPolicy, TradeKind, Venue};
use shared::protocol::{InstrumentId, Market};
use shared::testkit::Rng;

/// What a symbol's output saw.
#[derive(Default)]
struct Rec {
    book: Option<L3Book>,
    health: Option<FeedHealth>,
    publishes: u64,
    /// Publishes that called a stale book live (must stay 0).
    live_while_stale: u64,
    stale_publishes: u64,
    gaps: Vec<SeqGap>,
    applied: u64,
}

struct Recorder(Arc<Mutex<Rec>>);

impl BookOutput for Recorder {
    fn publish(&mut self, book: &L3Book, health: FeedHealth, _now_ms: i64) {
        let mut r = self.0.lock().unwrap();
        r.publishes += 1;
        if health == FeedHealth::Live && book.is_stale() {
            r.live_while_stale += 1;
        }
        if health == FeedHealth::Stale {
            r.stale_publishes += 1;
        }
        r.health = Some(health);
        r.book = Some(book.clone());
    }
    fn on_gap(&mut self, _symbol: SymbolIdx, gap: SeqGap) {
        self.0.lock().unwrap().gaps.push(gap);
    }
    fn on_applied(&mut self, _book: &L3Book, applied: u32, _latency: Duration) {
        self.0.lock().unwrap().applied += applied as u64;
    }
}

fn recorder() -> (Box<dyn BookOutput>, Arc<Mutex<Rec>>) {
    let rec = Arc::new(Mutex::new(Rec::default()));
    (Box::new(Recorder(rec.clone())), rec)
}

fn instrument(i: usize) -> InstrumentId {
    InstrumentId::new("test", Market::Spot, format!("{:06}", 600_000 + i))
}

fn config(shards: usize, max_shards: usize) -> EngineConfig {
    EngineConfig { shards, max_shards, publish_interval_ms: 5, ..EngineConfig::default() }
}

/// A valid SSE-style stream for one book: adds, full and partial cancels, trades against
/// resting orders with an unseen aggressor. Ids are unique per symbol.
fn stream(rng: &mut Rng, n: usize, id_base: u64) -> Vec<Msg> {
    let tick = 1_000_000i64;
    let mut live: Vec<(u64, Side, i64, i64)> = Vec::new();
    let mut next = id_base;
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let r = rng.below(100);
        if r < 50 || live.len() < 8 {
            let side = if rng.chance(1, 2) { Side::Bid } else { Side::Ask };
            let d = rng.top_skewed(60) as i64;
            let price = match side {
                Side::Bid => 10_000 * tick - d * tick,
                Side::Ask => 10_001 * tick + d * tick,
            };
            let qty = (1 + rng.below(20) as i64) * 100;
            next += 1;
            live.push((next, side, price, qty));
            out.push(Msg::Add {
                id: next,
                side,
                price: Price::from_raw(price),
                qty: Qty::from_units(qty),
            });
        } else {
            let i = rng.below(live.len() as u64) as usize;
            let (id, side, price, rest) = live[i];
            let qty = if rng.chance(1, 2) { rest } else { 1 + rng.below(rest as u64) as i64 };
            if qty == rest {
                live.swap_remove(i);
            } else {
                live[i].3 -= qty;
            }
            if r < 85 {
                out.push(Msg::Cancel {
                    id,
                    side,
                    price: Price::from_raw(price),
                    qty: Qty::from_units(qty),
                });
            } else {
                next += 1;
                let (buy_id, sell_id, kind) = match side {
                    Side::Ask => (next, id, TradeKind::BuyInitiated),
                    Side::Bid => (id, next, TradeKind::SellInitiated),
                };
                out.push(Msg::Trade {
                    buy_id,
                    sell_id,
                    price: Price::from_raw(price),
                    qty: Qty::from_units(qty),
                    kind,
                });
            }
        }
    }
    out
}

fn orders_of(book: &L3Book) -> BTreeMap<u64, Order> {
    book.orders().collect()
}

fn reference(msgs: &[Msg]) -> L3Book {
    let mut b = L3Book::new(Venue::Sse);
    for (i, &m) in msgs.iter().enumerate() {
        b.handle(7, i as u64 + 1, m).unwrap();
    }
    b
}

/// Checks the final published book of a symbol against single-threaded processing of `msgs`
/// with sequence numbers 1..=n on channel 7: same ladder, same orders, every message applied
/// once in order (the contiguous sequencer would have reported any reordering as a gap or a
/// duplicate).
fn assert_same_book(rec: &Rec, msgs: &[Msg], what: &str) {
    let book = rec.book.as_ref().unwrap_or_else(|| panic!("{what}: never published"));
    let want = reference(msgs);
    assert!(rec.gaps.is_empty(), "{what}: gaps {:?}", rec.gaps);
    assert_eq!(book.counters().seq_gaps, 0, "{what}");
    assert_eq!(book.counters().seq_duplicates, 0, "{what}");
    assert_eq!(
        book.sequencer(7).and_then(|s| s.last()),
        Some(msgs.len() as u64),
        "{what}: last seq"
    );
    assert_eq!(book.counters(), want.counters(), "{what}: counters");
    assert_eq!(book.ladder(), want.ladder(), "{what}: ladder");
    assert_eq!(orders_of(book), orders_of(&want), "{what}: orders");
    assert_eq!(rec.applied, msgs.len() as u64, "{what}: applied");
    assert_eq!(rec.live_while_stale, 0, "{what}");
}

fn add_symbols(h: &EngineHandle, n: usize) -> Vec<(SymbolIdx, Arc<Mutex<Rec>>)> {
    (0..n)
        .map(|i| {
            let (out, rec) = recorder();
            let idx = h.add_symbol(instrument(i), Venue::Sse, SeqPolicy::Contiguous, out).unwrap();
            (idx, rec)
        })
        .collect()
}

/// Random interleavings of many symbols' streams, dispatched in random chunks, with random
/// migrations between existing shards and to new ones, including chains requested while the
/// previous move is still in flight: every book equals single-threaded processing.
#[test]
fn random_migrations_keep_order_and_books() {
    let (mut legacy_seen, mut queued_seen) = (0u64, 0u64);
    for seed in 0..12u64 {
        let mut rng = Rng::new(seed);
        let mut engine = Engine::start(
            EngineConfig {
                max_batch: 1 + rng.below(300) as usize,
                // no pool, a pool smaller than the batches in flight, and the default
                recycle_batches: [0, 1, 8, 1024][seed as usize % 4],
                ..config(2, 6)
            },
            &Shutdown::new(),
        )
        .unwrap();
        let h = engine.handle();
        let mut d = engine.take_dispatcher().unwrap();
        let nsym = 3 + rng.below(8) as usize;
        let syms = add_symbols(&h, nsym);
        let streams: Vec<Vec<Msg>> = (0..nsym)
            .map(|i| {
                let n = 1_000 + rng.below(3_000) as usize;
                stream(&mut rng, n, i as u64 * 1_000_000)
            })
            .collect();
        // a random interleaving that keeps each symbol's own order
        let mut next = vec![0usize; nsym];
        let mut events = Vec::new();
        let total: usize = streams.iter().map(Vec::len).sum();
        while events.len() < total {
            let s = rng.below(nsym as u64) as usize;
            // bursts: a symbol often sends several in a row
            for _ in 0..1 + rng.below(20) {
                if next[s] < streams[s].len() {
                    events.push(TickEvent {
                        symbol: syms[s].0,
                        channel: 7,
                        seq: next[s] as u64 + 1,
                        msg: streams[s][next[s]],
                    });
                    next[s] += 1;
                }
            }
        }
        let (mut i, mut moves, mut refused) = (0usize, 0u32, 0u32);
        while i < events.len() {
            let n = (1 + rng.below(1_500) as usize).min(events.len() - i);
            d.dispatch(&events[i..i + n]);
            i += n;
            if rng.chance(1, 3) {
                // a chain: up to three moves of one symbol requested back to back
                let s = syms[rng.below(nsym as u64) as usize].0;
                for _ in 0..1 + rng.below(3) {
                    let shards = d.shard_count() as u64;
                    let target = if rng.chance(1, 4) {
                        Target::New
                    } else {
                        Target::Shard(rng.below(shards) as u32)
                    };
                    match h.migrate(s, target) {
                        Ok(()) => moves += 1,
                        Err(EngineError::SameShard { .. } | EngineError::MaxShards(_)) => {
                            refused += 1
                        }
                        Err(e) => panic!("seed {seed}: unexpected {e}"),
                    }
                }
            }
            if rng.chance(1, 10) {
                std::thread::sleep(Duration::from_micros(rng.below(2_000)));
            }
        }
        assert!(moves > 0, "seed {seed}");
        // queued moves start when their predecessor completes; the dispatcher polls them
        let deadline = Instant::now() + Duration::from_secs(60);
        while !h.wait_idle(Duration::from_millis(10)) {
            d.poll_control();
            assert!(
                Instant::now() < deadline,
                "seed {seed}: engine never went idle: {:?}",
                h.stats().migrations
            );
        }
        let stats = h.stats();
        let m = &stats.migrations;
        assert_eq!(m.requested, m.completed + m.rejected, "seed {seed}");
        assert!(stats.migrations.completed > 0, "seed {seed}");
        assert!(
            stats.shards.iter().all(|s| s.pending == 0 && s.misrouted == 0),
            "seed {seed}: {:?}",
            stats.shards
        );
        legacy_seen += stats.migrations.legacy_events_total;
        queued_seen += stats.migrations.queued;
        for (k, (idx, _)) in syms.iter().enumerate() {
            let s = stats.symbol(*idx).unwrap();
            assert_eq!(s.processed, streams[k].len() as u64, "seed {seed} symbol {k}");
            assert_eq!(s.pending, 0);
            assert_eq!(s.health, FeedHealth::Live);
        }
        drop(d);
        engine.shutdown();
        for (k, (_, rec)) in syms.iter().enumerate() {
            assert_same_book(
                &rec.lock().unwrap(),
                &streams[k],
                &format!("seed {seed} symbol {k} ({refused} refused)"),
            );
        }
    }
    eprintln!("legacy events handed over across seeds: {legacy_seen}, queued moves: {queued_seen}");
    assert!(queued_seen > 0, "no chain was requested while a move was in flight");
}

/// An output that blocks the shard inside `on_applied` until released: holds a source shard busy
/// so a backlog of another symbol is certainly queued behind it.
struct Gate {
    entered: mpsc::Sender<()>,
    release: Mutex<mpsc::Receiver<()>>,
    once: bool,
}

impl BookOutput for Gate {
    fn publish(&mut self, _: &L3Book, _: FeedHealth, _: i64) {}
    fn on_gap(&mut self, _: SymbolIdx, _: SeqGap) {}
    fn on_applied(&mut self, _: &L3Book, _: u32, _: Duration) {
        if self.once {
            self.once = false;
            let _ = self.entered.send(());
            let _ = self.release.lock().unwrap().recv();
        }
    }
}

/// The seed's step 2-4: with the source busy, the symbol's whole queued backlog is packed (not
/// computed) and handed over as legacy; the target replays legacy, then its buffer.
#[test]
fn source_packs_backlog_and_target_replays_in_order() {
    let mut engine = Engine::start(config(1, 2), &Shutdown::new()).unwrap();
    let h = engine.handle();
    let mut d = engine.take_dispatcher().unwrap();
    let (entered_tx, entered_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel();
    let gate = Gate { entered: entered_tx, release: Mutex::new(release_rx), once: true };
    let blocker =
        h.add_symbol(instrument(99), Venue::Sse, SeqPolicy::Contiguous, Box::new(gate)).unwrap();
    let (out, rec) = recorder();
    let s = h.add_symbol(instrument(1), Venue::Sse, SeqPolicy::Contiguous, out).unwrap();
    let msgs = stream(&mut Rng::new(5), 30_000, 0);
    let ev = |i: usize| TickEvent { symbol: s, channel: 7, seq: i as u64 + 1, msg: msgs[i] };
    let first: Vec<TickEvent> = (0..5_000).map(ev).collect();
    d.dispatch(&first);
    assert!(h.wait_idle(Duration::from_secs(30)));
    // the shard blocks on the blocker's batch; 10,000 events queue behind it
    let add =
        Msg::Add { id: 1, side: Side::Bid, price: Price::from_units(1), qty: Qty::from_units(1) };
    d.dispatch(&[TickEvent { symbol: blocker, channel: 1, seq: 1, msg: add }]);
    entered_rx.recv_timeout(Duration::from_secs(30)).unwrap();
    let backlog: Vec<TickEvent> = (5_000..15_000).map(ev).collect();
    d.dispatch(&backlog);
    assert_eq!(h.stats().symbol(s).unwrap().pending, 10_000);
    assert_eq!(h.migrate(s, Target::Shard(0)), Err(EngineError::SameShard { symbol: s, shard: 0 }));
    h.migrate(s, Target::New).unwrap();
    // newer events go to the new shard and wait in its buffer
    let newer: Vec<TickEvent> = (15_000..30_000).map(ev).collect();
    d.dispatch(&newer);
    let st = h.stats();
    assert_eq!(st.shards.len(), 2);
    assert_eq!(st.symbol(s).unwrap().shard, 1);
    assert!(st.symbol(s).unwrap().migrating);
    assert_eq!(st.migrations.in_flight, vec![s]);
    release_tx.send(()).unwrap();
    assert!(h.wait_idle(Duration::from_secs(60)));
    let st = h.stats();
    assert_eq!(st.migrations.completed, 1);
    assert_eq!(
        st.migrations.last_legacy_events, 10_000,
        "the whole backlog was packed, none computed at the source"
    );
    assert_eq!(st.symbol(s).unwrap().processed, 30_000);
    assert_eq!(st.symbol(s).unwrap().migrations, 1);
    assert_eq!(st.shard(1).unwrap().processed, 25_000);
    assert_eq!(st.shard(0).unwrap().buffered + st.shard(1).unwrap().buffered, 0);
    drop(d);
    engine.shutdown();
    assert_same_book(&rec.lock().unwrap(), &msgs, "migrated symbol");
}

/// Gap -> stale (counted, on_gap once, never published live) -> reset from the source's
/// snapshot in order with the data -> live, and the book equals the source's.
#[test]
fn gap_then_reset_from_snapshot() {
    let mut engine = Engine::start(config(2, 2), &Shutdown::new()).unwrap();
    let h = engine.handle();
    let mut d = engine.take_dispatcher().unwrap();
    let (out, rec) = recorder();
    let s = h.add_symbol(instrument(1), Venue::Sse, SeqPolicy::Contiguous, out).unwrap();
    let msgs = stream(&mut Rng::new(9), 3_000, 0);
    let ev = |i: usize| TickEvent { symbol: s, channel: 7, seq: i as u64 + 1, msg: msgs[i] };
    // 0..1000 fine, 1000 is lost, 1001..2000 arrive
    d.dispatch(&(0..1_000).map(ev).collect::<Vec<_>>());
    d.dispatch(&(1_001..2_000).map(ev).collect::<Vec<_>>());
    assert!(h.wait_idle(Duration::from_secs(30)));
    let deadline = Instant::now() + Duration::from_secs(10);
    while rec.lock().unwrap().health != Some(FeedHealth::Stale) {
        assert!(Instant::now() < deadline, "never published as stale");
        std::thread::sleep(Duration::from_millis(2));
    }
    {
        let r = rec.lock().unwrap();
        assert_eq!(r.gaps, vec![SeqGap { channel: 7, expected: 1_001, got: 1_002 }]);
        assert_eq!(r.book.as_ref().unwrap().sequencer(7).unwrap().last(), Some(1_000));
    }
    let st = h.stats().symbol(s).unwrap().clone();
    assert_eq!(
        (st.health, st.gaps, st.processed, st.not_applied),
        (FeedHealth::Stale, 1, 1_999, 999)
    );
    // the feed recovers: a snapshot at seq 1500, then the stream from 1400 (overlap = duplicates)
    let src = reference(&msgs[..1_500]);
    let snapshot =
        L3Snapshot { orders: src.orders().collect(), channel_last_seq: vec![(7, 1_500)] };
    h.reset(s, snapshot).unwrap();
    d.dispatch(&(1_399..3_000).map(ev).collect::<Vec<_>>());
    assert!(h.wait_idle(Duration::from_secs(30)));
    let st = h.stats().symbol(s).unwrap().clone();
    assert_eq!((st.health, st.gaps, st.resets), (FeedHealth::Live, 1, 1));
    drop(d);
    engine.shutdown();
    let r = rec.lock().unwrap();
    assert_eq!(r.live_while_stale, 0);
    assert!(r.stale_publishes >= 1);
    assert_eq!(r.health, Some(FeedHealth::Live));
    let book = r.book.as_ref().unwrap();
    let want = reference(&msgs);
    assert_eq!(book.ladder(), want.ladder());
    assert_eq!(orders_of(book), orders_of(&want));
    assert_eq!(book.sequencer(7).unwrap().last(), Some(3_000));
    assert_eq!(book.counters().seq_duplicates, 101);
}

/// A gap closed by a retransmission of the missing numbers makes the book live again.
#[test]
fn retransmission_closes_a_gap() {
    let mut engine = Engine::start(config(1, 1), &Shutdown::new()).unwrap();
    let h = engine.handle();
    let mut d = engine.take_dispatcher().unwrap();
    let (out, rec) = recorder();
    let s = h.add_symbol(instrument(1), Venue::Sse, SeqPolicy::Contiguous, out).unwrap();
    let msgs = stream(&mut Rng::new(3), 500, 0);
    let ev = |i: usize| TickEvent { symbol: s, channel: 7, seq: i as u64 + 1, msg: msgs[i] };
    d.dispatch(&(0..200).map(ev).chain((250..300).map(ev)).collect::<Vec<_>>());
    assert!(h.wait_idle(Duration::from_secs(30)));
    assert_eq!(h.stats().symbol(s).unwrap().health, FeedHealth::Stale);
    d.dispatch(&(200..500).map(ev).collect::<Vec<_>>());
    assert!(h.wait_idle(Duration::from_secs(30)));
    assert_eq!(h.stats().symbol(s).unwrap().health, FeedHealth::Live);
    drop(d);
    engine.shutdown();
    let r = rec.lock().unwrap();
    assert_eq!(r.gaps.len(), 1);
    assert_eq!(r.book.as_ref().unwrap().ladder(), reference(&msgs).ladder());
    assert_eq!(r.live_while_stale, 0);
}

/// Typed refusals: unknown symbol and shard, same shard, the shard limit, duplicate
/// registration; unknown symbols in the data are dropped and counted.
#[test]
fn refusals_are_typed() {
    let mut engine = Engine::start(config(1, 2), &Shutdown::new()).unwrap();
    let h = engine.handle();
    let mut d = engine.take_dispatcher().unwrap();
    let (out, _rec) = recorder();
    let s = h.add_symbol(instrument(1), Venue::Sse, SeqPolicy::Contiguous, out).unwrap();
    d.poll_control();
    let (out2, _) = recorder();
    assert!(matches!(
        h.add_symbol(instrument(1), Venue::Sse, SeqPolicy::Contiguous, out2),
        Err(EngineError::DuplicateSymbol(_))
    ));
    assert_eq!(h.symbol(&instrument(1)), Some(s));
    assert_eq!(h.migrate(7, Target::New), Err(EngineError::UnknownSymbol(7)));
    assert_eq!(h.migrate(s, Target::Shard(3)), Err(EngineError::UnknownShard(3)));
    assert_eq!(h.migrate(s, Target::Shard(0)), Err(EngineError::SameShard { symbol: s, shard: 0 }));
    assert_eq!(Target::from_api(-1), Ok(Target::New));
    assert_eq!(Target::from_api(-2), Err(EngineError::UnknownShard(-2)));
    h.migrate(s, Target::New).unwrap();
    d.poll_control();
    assert!(h.wait_idle(Duration::from_secs(10)));
    assert_eq!(h.migrate(s, Target::New), Err(EngineError::MaxShards(2)));
    let add =
        Msg::Add { id: 1, side: Side::Bid, price: Price::from_units(1), qty: Qty::from_units(1) };
    d.dispatch(&[TickEvent { symbol: 42, channel: 0, seq: 1, msg: add }]);
    assert_eq!(h.stats().unknown_symbol_events, 1);
    assert!(Engine::start(EngineConfig { shards: 0, ..EngineConfig::default() }, &Shutdown::new())
        .is_err());
    let huge_pool = EngineConfig { recycle_batches: (1 << 20) + 1, ..EngineConfig::default() };
    assert_eq!(
        huge_pool.validate(),
        Err(BadEngineConfig("recycle_batches must be at most 1048576".into()))
    );
    drop(d);
    engine.shutdown();
}

/// Head-of-line blocking (the seed's test harness): one symbol at ~2000x the rate of four cold
/// ones on the same shard. The cold symbols show the backlog in the stats; the automatic policy
/// moves the hot symbol to a new shard; the cold symbols' lag returns to normal while the hot
/// symbol keeps its exact order.
#[test]
fn auto_balance_cures_head_of_line_blocking() {
    let cfg = EngineConfig {
        shards: 1,
        max_shards: 2,
        publish_interval_ms: 20,
        auto_balance: true,
        balance: BalanceConfig {
            interval_ms: 50,
            high_pending: 50_000,
            high_lag_ms: 200,
            low_pending: 5_000,
            low_lag_ms: 50,
            looks: 3,
            symbol_cooldown_ms: 60_000,
            shard_cooldown_ms: 60_000,
        },
        ..EngineConfig::default()
    };
    let mut engine = Engine::start(cfg, &Shutdown::new()).unwrap();
    let h = engine.handle();
    let mut d = engine.take_dispatcher().unwrap();
    let syms = add_symbols(&h, 5);
    d.poll_control();
    let hot = syms[0].0;
    let cold: Vec<SymbolIdx> = syms[1..].iter().map(|s| s.0).collect();
    // the hot stream cycles add / cancel of 64 orders, so it never ends and the book stays small
    let mut rng = Rng::new(77);
    let template: Vec<Msg> = {
        let adds: Vec<Msg> = (1..=64u64)
            .map(|id| Msg::Add {
                id,
                side: if id % 2 == 0 { Side::Bid } else { Side::Ask },
                price: Price::from_raw(
                    if id % 2 == 0 { 99 } else { 101 } * 100_000_000
                        + rng.below(50) as i64 * 1_000_000,
                ),
                qty: Qty::from_units(100),
            })
            .collect();
        let cancels: Vec<Msg> = adds
            .iter()
            .map(|m| match *m {
                Msg::Add { id, side, price, qty } => Msg::Cancel { id, side, price, qty },
                _ => unreachable!(),
            })
            .collect();
        adds.into_iter().chain(cancels).collect()
    };
    let cold_streams: Vec<Vec<Msg>> =
        (0..4).map(|i| stream(&mut rng, 100_000, i * 1_000_000)).collect();
    let mut cold_next = [0usize; 4];
    let mut hot_seq = 0u64;
    let mut hot_buf = Vec::with_capacity(5_000);
    let (mut saw_shard_backlog, mut cold_listed, mut cold_max_lag) = (false, false, [0u64; 4]);
    let mut migrated_at: Option<Instant> = None;
    let mut cured = false;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut round = 0u64;
    while Instant::now() < deadline && !cured {
        round += 1;
        let st = h.stats();
        let hot_moved = st.symbol(hot).unwrap().migrations > 0;
        // throttle the flood so memory stays bounded: keep the hot symbol's backlog near 300k
        if st.symbol(hot).unwrap().pending < 300_000 {
            hot_buf.clear();
            for _ in 0..5_000 {
                hot_buf.push(TickEvent {
                    symbol: hot,
                    channel: 7,
                    seq: hot_seq + 1,
                    msg: template[(hot_seq % template.len() as u64) as usize],
                });
                hot_seq += 1;
            }
            d.dispatch(&hot_buf);
        }
        let mut cold_events = Vec::with_capacity(4);
        for k in 0..4 {
            if cold_next[k] < cold_streams[k].len() {
                cold_next[k] += 1;
                let (seq, msg) = (cold_next[k] as u64, cold_streams[k][cold_next[k] - 1]);
                cold_events.push(TickEvent { symbol: cold[k], channel: 7, seq, msg });
            }
        }
        d.dispatch(&cold_events);
        if !hot_moved {
            // before the move: the cold symbols on the hot shard wait behind the flood
            let sh = st.shard(0).unwrap();
            for (k, &c) in cold.iter().enumerate() {
                cold_max_lag[k] = cold_max_lag[k].max(st.symbol(c).unwrap().lag_ms);
            }
            if sh.pending > 50_000 && sh.symbols_with_pending >= 2 {
                saw_shard_backlog = true;
                cold_listed |= sh.top_pending.iter().any(|p| cold.contains(&p.symbol));
            }
        } else if migrated_at.is_none() {
            migrated_at = Some(Instant::now());
        }
        if let Some(t) = migrated_at {
            // after the move: cold lag back to normal once their recent batches ran on an
            // uncongested shard
            let sh0 = st.shard(0).unwrap();
            let cold_ok = cold
                .iter()
                .all(|&c| st.symbol(c).unwrap().lag_ms < 50 && st.symbol(c).unwrap().shard == 0);
            if t.elapsed() > Duration::from_millis(200) && cold_ok && sh0.pending < 1_000 {
                cured = true;
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let st = h.stats();
    assert!(
        saw_shard_backlog && cold_listed,
        "cold symbols never listed as pending on the hot shard ({round} rounds)"
    );
    assert!(
        cold_max_lag.iter().all(|&l| l >= 50),
        "cold symbols never lagged behind the flood: {cold_max_lag:?}"
    );
    assert!(migrated_at.is_some(), "the policy never moved the hot symbol: {:?}", st.shards);
    assert!(cured, "cold lag never returned to normal: {:?}", st.symbols);
    assert!(st.balancer_decisions >= 1);
    assert_eq!(st.symbol(hot).unwrap().shard, 1, "hot symbol moved to the new shard");
    assert!(st.symbol(hot).unwrap().migrations >= 1);
    // one decision only: hysteresis keeps everything else where it is
    assert_eq!(st.migrations.started, 1);
    assert!(cold.iter().all(|&c| st.symbol(c).unwrap().shard == 0));
    h.set_auto_balance(false);
    assert!(h.wait_idle(Duration::from_secs(120)));
    drop(d);
    engine.shutdown();
    let r = syms[0].1.lock().unwrap();
    assert!(r.gaps.is_empty());
    // its shards never idled during the flood, yet published on their timer
    assert!(r.publishes >= 3, "hot book published {} times", r.publishes);
    let book = r.book.as_ref().unwrap();
    assert_eq!(
        book.sequencer(7).unwrap().last(),
        Some(hot_seq),
        "every hot event applied once, in order"
    );
    assert_eq!(book.counters().seq_duplicates + book.counters().seq_gaps, 0);
    assert_eq!(r.applied, hot_seq);
    for k in 0..4 {
        let r = syms[k + 1].1.lock().unwrap();
        assert_same_book(&r, &cold_streams[k][..cold_next[k]], &format!("cold {k}"));
    }
}

/// The live-service shape: the dispatcher on its own thread behind a bounded channel fed by
/// several producer threads (each owning some symbols), control requests arriving while it
/// idles or works, auto-balance toggled at runtime; every book ends equal to single-threaded
/// processing, and `SeqPolicy::Increasing` accepts holes.
#[test]
fn spawned_dispatcher_with_concurrent_producers() {
    let mut engine = Engine::start(config(2, 4), &Shutdown::new()).unwrap();
    let h = engine.handle();
    let (tx, rx) = mpsc::sync_channel::<Vec<TickEvent>>(8);
    engine.spawn_dispatcher(rx).unwrap();
    assert_eq!(engine.take_dispatcher().err(), Some(EngineError::DispatcherTaken));
    let syms = add_symbols(&h, 6);
    // a Shanghai-replay-like symbol: one channel shared with other stocks, so its numbers jump
    let (out, holes_rec) = recorder();
    let holes = h.add_symbol(instrument(50), Venue::Sse, SeqPolicy::Increasing, out).unwrap();
    let streams: Vec<Vec<Msg>> =
        (0..6).map(|i| stream(&mut Rng::new(100 + i), 5_000, i * 1_000_000)).collect();
    let producers: Vec<_> = (0..3)
        .map(|p| {
            let tx = tx.clone();
            let mine: Vec<(SymbolIdx, Vec<Msg>)> =
                (0..6).filter(|k| k % 3 == p).map(|k| (syms[k].0, streams[k].clone())).collect();
            std::thread::spawn(move || {
                let mut rng = Rng::new(p as u64);
                let mut next = vec![0usize; mine.len()];
                while next.iter().zip(&mine).any(|(n, (_, m))| *n < m.len()) {
                    let mut batch = Vec::new();
                    for _ in 0..1 + rng.below(500) {
                        let j = rng.below(mine.len() as u64) as usize;
                        if next[j] < mine[j].1.len() {
                            batch.push(TickEvent {
                                symbol: mine[j].0,
                                channel: 7,
                                seq: next[j] as u64 + 1,
                                msg: mine[j].1[next[j]],
                            });
                            next[j] += 1;
                        }
                    }
                    tx.send(batch).unwrap();
                }
            })
        })
        .collect();
    // moves while the producers run
    h.set_auto_balance(true);
    for (k, (s, _)) in syms.iter().enumerate() {
        let _ = h.migrate(*s, if k % 2 == 0 { Target::New } else { Target::Shard(0) });
        std::thread::sleep(Duration::from_millis(2));
    }
    h.set_auto_balance(false);
    assert!(!h.auto_balance());
    let hole_msgs = stream(&mut Rng::new(9), 300, 0);
    let hole_events: Vec<TickEvent> = hole_msgs
        .iter()
        .enumerate()
        .map(|(i, &msg)| TickEvent { symbol: holes, channel: 3, seq: 10 * i as u64 + 5, msg })
        .collect();
    tx.send(hole_events).unwrap();
    for p in producers {
        p.join().unwrap();
    }
    // the dispatcher thread polls control while idle: queued moves start without new events
    assert!(h.wait_idle(Duration::from_secs(60)));
    drop(tx);
    let st = h.stats();
    assert!(st.migrations.completed >= 1);
    assert_eq!(st.symbol(holes).unwrap().health, FeedHealth::Live);
    engine.shutdown();
    for (k, (_, rec)) in syms.iter().enumerate() {
        assert_same_book(&rec.lock().unwrap(), &streams[k], &format!("symbol {k}"));
    }
    let r = holes_rec.lock().unwrap();
    let book = r.book.as_ref().unwrap();
    assert!(r.gaps.is_empty());
    assert_eq!(book.counters().seq_holes, 299);
    assert_eq!(book.ladder(), reference(&hole_msgs).ladder());
}
