//! Deterministic helpers for tests and benchmarks on every target (including wasm32, where
//! OS randomness and threads are not available). Not used by production code paths.

/// A small, fast, seedable PRNG (xorshift64*), so randomised tests replay exactly by seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        // splitmix64 of the seed, never zero
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Self((z ^ (z >> 31)) | 1)
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (n > 0).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() >> 32) * n) >> 32
    }

    /// True with probability `num / den`.
    #[inline]
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }

    /// A distance from the top of book, skewed towards 0 the way real update streams are:
    /// roughly half of all updates land in the top 5 levels, with a long tail out to `max`.
    #[inline]
    pub fn top_skewed(&mut self, max: u64) -> u64 {
        let r = self.below(1000);
        let d = match r {
            0..=499 => self.below(5),
            500..=799 => 5 + self.below(20),
            800..=949 => 25 + self.below(100),
            _ => self.below(max.max(1)),
        };
        d.min(max.saturating_sub(1))
    }
}

/// A random change (0 to 5 level updates, a third of them deletions) to a book whose bids stay
/// below 1000 and asks above it, so it never crosses.
pub fn mutate_book(book: &mut crate::book::OrderBook, rng: &mut Rng) {
    use crate::book::Side;
    use crate::fixed::{Price, Qty};
    for _ in 0..rng.below(6) {
        let side = if rng.below(2) == 0 { Side::Bid } else { Side::Ask };
        let offset = 1 + rng.below(40) as i64;
        let price = match side {
            Side::Bid => 1000 - offset,
            Side::Ask => 1000 + offset,
        };
        let qty = if rng.below(3) == 0 { 0 } else { 1 + rng.below(50) as i64 };
        book.apply(side, Price::from_units(price), Qty::from_units(qty));
    }
}

/// The L2 benchmark workload, shared by the native criterion bench and the wasm bench: a book of
/// `levels` levels per side around a fixed mid and `updates` level updates that land mostly near
/// the top (see [`Rng::top_skewed`]). Existing levels are modified (70%) or deleted (30%), missing
/// ones inserted, so the book keeps its size the way a real one does.
pub fn l2_workload(
    seed: u64,
    levels: i64,
    updates: usize,
) -> (crate::book::OrderBook, Vec<crate::book::LevelUpdate>) {
    use crate::book::{LevelUpdate, OrderBook, Side};
    use crate::fixed::{Price, Qty};
    const MID: i64 = 5_000_000; // in ticks
    const TICK: i64 = 1_000_000; // 0.01
    let mut rng = Rng::new(seed);
    let mut book = OrderBook::new();
    let price = |side: Side, d: i64| match side {
        Side::Bid => Price::from_raw((MID - d) * TICK),
        Side::Ask => Price::from_raw((MID + 1 + d) * TICK),
    };
    for d in 0..levels {
        for side in [Side::Bid, Side::Ask] {
            book.apply(side, price(side, d), Qty::from_raw(1 + rng.below(1_000_000) as i64));
        }
    }
    let mut model = book.clone();
    let mut out = Vec::with_capacity(updates);
    while out.len() < updates {
        let side = if rng.chance(1, 2) { Side::Bid } else { Side::Ask };
        let d = rng.top_skewed(levels as u64 + 200) as i64;
        let p = price(side, d);
        let exists = !model.side(side).get(p).is_zero();
        let qty = if exists && rng.chance(3, 10) {
            Qty::ZERO
        } else {
            Qty::from_raw(1 + rng.below(1_000_000) as i64)
        };
        model.apply(side, p, qty);
        out.push(LevelUpdate { side, price: p, qty });
    }
    (book, out)
}

/// Distance from the top of book (in ticks) of a new order, calibrated on the real SSE sample
/// (`testdata/sse-tick-by-tick`, 2023-07-11, five stocks): replaying it, 84.4% of all level
/// changes land in the top 5 levels of their side, 91.0% in the top 15, 95.0% in the top 35,
/// 99.5% in the top 200; the books hold 36-403 levels per side and 560-4,900 live orders.
fn l3_depth(rng: &mut Rng) -> i64 {
    (match rng.below(1000) {
        0..=843 => rng.below(5),
        844..=909 => 5 + rng.below(10),
        910..=949 => 15 + rng.below(20),
        950..=989 => 35 + rng.below(65),
        _ => 100 + rng.below(200),
    }) as i64
}
const L3_TICK: i64 = 1_000_000; // 0.01

/// The L3 benchmark workload, shared by the native criterion bench and the wasm bench:
/// `n` valid SSE-style messages. The generator keeps its own naive model.
pub fn l3_workload(n: usize, seed: u64) -> Vec<crate::l3::Msg> {
    use crate::book::Side;
    use crate::fixed::{Price, Qty};
    use crate::l3::{Msg, TradeKind};
    use std::collections::{BTreeMap, HashMap, VecDeque};
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
            let d = l3_depth(&mut rng);
            let price = match side {
                Side::Bid => {
                    best_ask.unwrap_or(mid + L3_TICK).min(mid + L3_TICK) - (1 + d) * L3_TICK
                }
                Side::Ask => {
                    best_bid.unwrap_or(mid - L3_TICK).max(mid - L3_TICK) + (1 + d) * L3_TICK
                }
            };
            let qty = (1 + rng.below(30) as i64) * 100;
            let id = next_id;
            next_id += 1;
            orders.insert(id, (side, price, qty));
            pos.insert(id, live.len());
            live.push(id);
            levels[side as usize].entry(price).or_default().push_back(id);
            out.push(Msg::Add {
                id,
                side,
                price: Price::from_raw(price),
                qty: Qty::from_units(qty),
            });
        } else if r < 88 {
            // cancels favour the top of the book: half pick an order of a level at a calibrated
            // depth
            let id = if rng.chance(1, 2) {
                live[rng.below(live.len() as u64) as usize]
            } else {
                let side = if rng.chance(1, 2) { 0 } else { 1 };
                let d = l3_depth(&mut rng) as usize;
                let q = if side == 0 {
                    levels[0].values().rev().nth(d)
                } else {
                    levels[1].values().nth(d)
                };
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
            out.push(Msg::Cancel {
                id,
                side,
                price: Price::from_raw(price),
                qty: Qty::from_units(qty),
            });
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
