//! L3 book throughput: add / cancel / trade with order lookup by id, on a generated stream shaped
//! like a real tick-by-tick feed (prices skewed to the top of book, most orders cancelled, trades
//! hitting the first order of the best level, SSE-style unseen aggressors).
//!
//! The stream is generated once, outside the timing loop; each iteration replays it into a fresh
//! book (pre-sized, built outside the timing) through the sequenced `handle` path and drains the
//! emitted level updates, so the figure covers everything a live consumer pays per event.
//!
//! Run: `cargo bench -p shared --bench l3 -- --warm-up-time 1 --measurement-time 3`

#[cfg(not(target_arch = "wasm32"))]
mod bench {
    use std::collections::{BTreeMap, HashMap, VecDeque};
    use std::hint::black_box;

    use criterion::{BatchSize, Criterion, Throughput};
    use shared::l3::{L3Book, Msg, TradeKind, Venue};
    use shared::testkit::Rng;
    use shared::{Price, Qty, Side};

    const EVENTS: usize = 1_000_000;

    /// Distance from the top of book (in ticks) of a new order, calibrated on the real SSE sample
    /// (`shared/data/sse-tick-by-tick`, 2023-07-11, five stocks): replaying it, 84.4% of all level
    /// changes land in the top 5 levels of their side, 91.0% in the top 15, 95.0% in the top 35,
    /// 99.5% in the top 200; the books hold 36-403 levels per side and 560-4,900 live orders.
    fn depth(rng: &mut Rng) -> i64 {
        (match rng.below(1000) {
            0..=843 => rng.below(5),
            844..=909 => 5 + rng.below(10),
            910..=949 => 15 + rng.below(20),
            950..=989 => 35 + rng.below(65),
            _ => 100 + rng.below(200),
        }) as i64
    }
    const TICK: i64 = 1_000_000; // 0.01

    /// Generates `n` valid SSE-style messages. The generator keeps its own naive model.
    pub fn generate(n: usize, seed: u64) -> Vec<Msg> {
        let mut rng = Rng::new(seed);
        let mut out = Vec::with_capacity(n);
        // live orders: id -> (side, price, qty); a dense list for uniform picks; FIFO per level
        let mut orders: HashMap<u64, (Side, i64, i64)> = HashMap::new();
        let mut live: Vec<u64> = Vec::new();
        let mut pos: HashMap<u64, usize> = HashMap::new();
        let mut levels: [BTreeMap<i64, VecDeque<u64>>; 2] = [BTreeMap::new(), BTreeMap::new()];
        let mut next_id = 1u64;
        let mut mid: i64 = 50 * 100_000_000; // 50.00
        fn remove(
            id: u64,
            orders: &mut HashMap<u64, (Side, i64, i64)>,
            live: &mut Vec<u64>,
            pos: &mut HashMap<u64, usize>,
            levels: &mut [BTreeMap<i64, VecDeque<u64>>; 2],
        ) {
            let (side, price, _) = orders.remove(&id).unwrap();
            let i = pos.remove(&id).unwrap();
            live.swap_remove(i);
            if i < live.len() {
                pos.insert(live[i], i);
            }
            let q = levels[side as usize].get_mut(&price).unwrap();
            q.retain(|&x| x != id);
            if q.is_empty() {
                levels[side as usize].remove(&price);
            }
        }
        while out.len() < n {
            let best_bid = levels[0].keys().next_back().copied();
            let best_ask = levels[1].keys().next().copied();
            let r = rng.below(100);
            // fill an empty book first, then keep the size roughly steady
            let r = if live.len() < 4_000 { 0 } else { r };
            if r < 45 {
                let side = if rng.chance(1, 2) { Side::Bid } else { Side::Ask };
                let d = depth(&mut rng);
                let price = match side {
                    Side::Bid => best_ask.unwrap_or(mid + TICK).min(mid + TICK) - (1 + d) * TICK,
                    Side::Ask => best_bid.unwrap_or(mid - TICK).max(mid - TICK) + (1 + d) * TICK,
                };
                let qty = (1 + rng.below(30) as i64) * 100;
                let id = next_id;
                next_id += 1;
                orders.insert(id, (side, price, qty));
                pos.insert(id, live.len());
                live.push(id);
                levels[side as usize].entry(price).or_default().push_back(id);
                out.push(Msg::Add { id, side, price: Price::from_raw(price), qty: Qty::from_units(qty) });
            } else if r < 88 {
                // cancels favour the top of the book: half pick an order of a level at a calibrated depth
                let id = if rng.chance(1, 2) {
                    live[rng.below(live.len() as u64) as usize]
                } else {
                    let side = if rng.chance(1, 2) { 0 } else { 1 };
                    let d = depth(&mut rng) as usize;
                    let q =
                        if side == 0 { levels[0].values().rev().nth(d) } else { levels[1].values().nth(d) };
                    match q {
                        Some(q) => q[rng.below(q.len() as u64) as usize],
                        None => live[rng.below(live.len() as u64) as usize],
                    }
                };
                let (side, price, rest) = orders[&id];
                let qty = if rng.chance(9, 10) { rest } else { 1 + rng.below(rest as u64) as i64 };
                if qty == rest {
                    remove(id, &mut orders, &mut live, &mut pos, &mut levels);
                } else {
                    orders.get_mut(&id).unwrap().2 -= qty;
                }
                out.push(Msg::Cancel { id, side, price: Price::from_raw(price), qty: Qty::from_units(qty) });
            } else {
                // an unseen aggressor trades with the first order at the best level
                let passive = if rng.chance(1, 2) { Side::Bid } else { Side::Ask };
                let level = match passive {
                    Side::Bid => levels[0].iter().next_back(),
                    Side::Ask => levels[1].iter().next(),
                };
                let Some((&price, q)) = level else { continue };
                let id = q[0];
                let rest = orders[&id].2;
                let qty = if rng.chance(1, 2) { rest } else { 1 + rng.below(rest as u64) as i64 };
                if qty == rest {
                    remove(id, &mut orders, &mut live, &mut pos, &mut levels);
                } else {
                    orders.get_mut(&id).unwrap().2 -= qty;
                }
                let aggressor = next_id;
                next_id += 1;
                let (buy_id, sell_id, kind) = match passive {
                    Side::Ask => (aggressor, id, TradeKind::BuyInitiated),
                    Side::Bid => (id, aggressor, TradeKind::SellInitiated),
                };
                mid = price;
                out.push(Msg::Trade {
                    buy_id,
                    sell_id,
                    price: Price::from_raw(price),
                    qty: Qty::from_units(qty),
                    kind,
                });
            }
        }
        out
    }

    pub fn l3(c: &mut Criterion) {
        let events = generate(EVENTS, 42);
        // sanity: the stream is valid, so the book reports no anomaly
        let mut check = L3Book::new(Venue::Sse);
        for (i, &m) in events.iter().enumerate() {
            check.handle(1, i as u64 + 1, m).unwrap();
            check.clear_updates();
        }
        let k = check.counters();
        assert_eq!(k.cancels_not_found + k.trades_not_found + k.negative_qty_clamped, 0);
        assert!(!check.is_crossed());
        eprintln!(
            "l3 bench stream: {} events ({} adds, {} cancels, {} trades), {} live orders, {}+{} levels at the end",
            events.len(),
            k.adds,
            k.cancels,
            k.trades,
            check.order_count(),
            check.ladder().bids.len(),
            check.ladder().asks.len()
        );

        let mut g = c.benchmark_group("l3");
        g.throughput(Throughput::Elements(events.len() as u64));
        g.sample_size(20);
        g.bench_function("add_cancel_trade_sse", |b| {
            b.iter_batched_ref(
                || L3Book::with_capacity(Venue::Sse, 8 * 1024),
                |book| {
                    let mut n = 0usize;
                    for (i, &m) in events.iter().enumerate() {
                        let _ = book.handle(1, i as u64 + 1, m);
                        if i & 255 == 255 {
                            n += book.drain_updates().len();
                        }
                    }
                    black_box(n);
                },
                BatchSize::PerIteration,
            )
        });
        g.finish();
    }
}

#[cfg(not(target_arch = "wasm32"))]
criterion::criterion_group!(benches, bench::l3);
#[cfg(not(target_arch = "wasm32"))]
criterion::criterion_main!(benches);

#[cfg(target_arch = "wasm32")]
fn main() {}
