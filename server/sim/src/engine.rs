//! The matching engine of one simulated symbol: a price-time-priority limit order book driven by
//! simulated participants.
//!
//! ## Model
//! - Prices are integer **ticks** of the symbol's tick size, quantities integer raw units (10^-8)
//!   that are always multiples of the step size. Random `f64`s only drive *decisions* (which
//!   action, how far from the fair value, how many lots); every price and quantity is an integer.
//! - A hidden **fair value** (in ticks) random-walks with about 6 bp of volatility per simulated
//!   minute and a weak pull back towards the price it started at.
//! - Participants act as a Poisson process (about [`ACTIONS_PER_S`] actions per simulated
//!   second): **limit orders** placed around the fair value (half close to it, half deeper), which
//!   trade first when they cross the book (marketable limits); **cancels** of resting orders
//!   (uniformly, or near the top of the book); and **market orders** leaning towards the fair
//!   value, capped at the top five levels so a side never empties.
//! - Matching is price-time priority: a taker fills the best level first, and within a level the
//!   oldest order first; every fill is a [`Fill`] at the **resting** order's price.
//! - Every action that changes the book increments the **update id** once (one "book change
//!   event batch" in Binance's terms), whatever number of levels it touched.
//!
//! The engine is deterministic: the action times and contents are drawn from one `SmallRng`
//! seeded from (seed, symbol), in order, so stepping to a simulated time gives the same book and
//! trades however the steps are grouped.

use std::collections::{BTreeMap, HashMap, VecDeque};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use shared::{Level, Price, Qty, Side};

use crate::symbols::{derive_seed, SymbolSpec};

/// Mean participant actions per simulated second and symbol.
pub const ACTIONS_PER_S: f64 = 40.0;
/// Resting orders the cancel rate steers towards (both sides).
const TARGET_ORDERS: usize = 1_400;
/// Share of actions that are market orders.
const P_MARKET: f64 = 0.07;

/// One fill: a taker order against one resting order, at the resting order's price.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fill {
    /// Per-symbol trade id, increasing by one per fill.
    pub id: u64,
    pub price: Price,
    pub qty: Qty,
    /// Simulated time, ms.
    pub time_ms: i64,
    /// Binance's `m`: the buyer was the resting order (the taker sold).
    pub buyer_is_maker: bool,
}

/// A resting order.
#[derive(Debug, Clone, Copy)]
struct Resting {
    id: u64,
    /// Remaining quantity, raw units.
    qty: i64,
}

/// The orders at one price, oldest first, with their total.
#[derive(Debug, Clone, Default)]
struct Queue {
    orders: VecDeque<Resting>,
    total: i64,
}

/// Every resting order, for uniform random cancels: a dense list plus its index.
#[derive(Debug, Clone, Default)]
struct Live {
    ids: Vec<(u64, Side, i64)>,
    pos: HashMap<u64, usize>,
}

impl Live {
    fn insert(&mut self, id: u64, side: Side, price: i64) {
        self.pos.insert(id, self.ids.len());
        self.ids.push((id, side, price));
    }

    fn remove(&mut self, id: u64) {
        if let Some(i) = self.pos.remove(&id) {
            self.ids.swap_remove(i);
            if let Some(moved) = self.ids.get(i) {
                self.pos.insert(moved.0, i);
            }
        }
    }
}

/// A violated engine invariant (tests).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("engine invariant violated: {0}")]
pub struct InvariantError(pub String);

/// The book and participants of one symbol. See the module docs.
#[derive(Debug, Clone)]
pub struct MatchingEngine {
    /// Tick size, raw price units.
    tick: i64,
    /// Step size, raw quantity units.
    step: i64,
    /// One basis point of the start price, in ticks: the unit of every distance.
    bp: i64,
    /// Typical order size in steps.
    lot_steps: i64,
    /// Start price in ticks (the fair value is pulled towards it).
    start_ticks: i64,
    rng: SmallRng,
    /// Bids by price in ticks; the best is the last key.
    bids: BTreeMap<i64, Queue>,
    /// Asks by price in ticks; the best is the first key.
    asks: BTreeMap<i64, Queue>,
    live: Live,
    next_order_id: u64,
    /// The hidden fair value, ticks.
    fair: i64,
    /// Simulated time of the next participant action, ms.
    next_action_ms: i64,
    update_id: u64,
    next_trade_id: u64,
    /// Levels (side, price in ticks) changed since the last [`MatchingEngine::take_touched`]:
    /// a depth diff must carry every level that changed in its window, also one that changed
    /// and changed back (a client's snapshot may have been taken in between).
    touched: Vec<(Side, i64)>,
}

impl MatchingEngine {
    /// A new engine for `spec` at simulated time `start_ms`, its book seeded with resting orders
    /// around `start_price` (rounded to the tick; no trades).
    pub fn new(spec: &SymbolSpec, seed: u64, start_ms: i64, start_price: Price) -> MatchingEngine {
        let start_ticks =
            (start_price.raw() / spec.tick.raw()).max(spec.reference_ticks() / 10).max(10);
        let mut rng = SmallRng::seed_from_u64(derive_seed(seed, &spec.symbol, &[1]));
        let update_id = 1_000_000_000 + rng.random_range(0..1_000_000_000u64);
        let next_trade_id = 100_000_000 + rng.random_range(0..100_000_000u64);
        let mut e = MatchingEngine {
            tick: spec.tick.raw(),
            step: spec.step.raw(),
            bp: spec.bp_ticks(),
            lot_steps: spec.lot_steps(),
            start_ticks,
            rng,
            bids: BTreeMap::new(),
            asks: BTreeMap::new(),
            live: Live::default(),
            next_order_id: 1,
            fair: start_ticks,
            next_action_ms: start_ms,
            update_id,
            next_trade_id,
            touched: Vec::new(),
        };
        let mut none = Vec::new();
        for _ in 0..TARGET_ORDERS {
            e.place_limit(start_ms, &mut none);
        }
        debug_assert!(none.is_empty());
        e.touched.clear();
        e.next_action_ms = start_ms + e.gap_ms();
        e
    }

    /// Moves the levels changed since the last call into `out` (duplicates possible).
    pub fn take_touched(&mut self, out: &mut Vec<(Side, Price)>) {
        let tick = self.tick;
        out.extend(self.touched.drain(..).map(|(side, p)| (side, Price::from_raw(p * tick))));
    }

    /// Forgets the levels changed so far (nobody follows the diffs).
    pub fn clear_touched(&mut self) {
        self.touched.clear();
    }

    /// The quantity resting at `price` on `side` (zero when there is no such level).
    pub fn qty_at(&self, side: Side, price: Price) -> Qty {
        if price.raw() % self.tick != 0 {
            return Qty::ZERO;
        }
        let ticks = price.raw() / self.tick;
        let book = match side {
            Side::Bid => &self.bids,
            Side::Ask => &self.asks,
        };
        book.get(&ticks).map_or(Qty::ZERO, |q| Qty::from_raw(q.total))
    }

    /// Simulated time of the next action, ms.
    pub fn next_action_ms(&self) -> i64 {
        self.next_action_ms
    }

    /// The book's update id: increases by one per action that changed the book.
    pub fn update_id(&self) -> u64 {
        self.update_id
    }

    /// Performs the next action (at [`MatchingEngine::next_action_ms`]), appending its fills to
    /// `trades`. Returns whether the book changed.
    pub fn step(&mut self, trades: &mut Vec<Fill>) -> bool {
        let t = self.next_action_ms;
        self.move_fair();
        let r: f64 = self.rng.random();
        let p_cancel = (0.45 * self.live.ids.len() as f64 / TARGET_ORDERS as f64).min(0.85);
        let changed = if r < P_MARKET {
            self.market_order(t, trades)
        } else if r < P_MARKET + p_cancel {
            self.cancel_one()
        } else {
            self.place_limit(t, trades)
        };
        if changed {
            self.update_id += 1;
        }
        self.next_action_ms = t + self.gap_ms();
        changed
    }

    /// Runs every action up to and including `until_ms`.
    pub fn advance(&mut self, until_ms: i64, trades: &mut Vec<Fill>) {
        while self.next_action_ms <= until_ms {
            self.step(trades);
        }
    }

    /// The best `limit` levels of `side`, best first.
    pub fn levels(&self, side: Side, limit: usize) -> Vec<Level> {
        let lv = |(p, q): (&i64, &Queue)| {
            Level::new(Price::from_raw(p * self.tick), Qty::from_raw(q.total))
        };
        match side {
            Side::Bid => self.bids.iter().rev().take(limit).map(lv).collect(),
            Side::Ask => self.asks.iter().take(limit).map(lv).collect(),
        }
    }

    /// Number of price levels on `side`.
    pub fn depth(&self, side: Side) -> usize {
        match side {
            Side::Bid => self.bids.len(),
            Side::Ask => self.asks.len(),
        }
    }

    /// Best bid and ask prices.
    pub fn best(&self) -> (Option<Price>, Option<Price>) {
        let p = |t: &i64| Price::from_raw(t * self.tick);
        (self.bids.keys().next_back().map(p), self.asks.keys().next().map(p))
    }

    /// Checks the book: not crossed, level totals equal their orders, no empty level or order,
    /// quantities on the step, and the live-order index consistent.
    pub fn check_invariants(&self) -> Result<(), InvariantError> {
        let bad = |m: String| Err(InvariantError(m));
        if let (Some(b), Some(a)) = (self.bids.keys().next_back(), self.asks.keys().next()) {
            if b >= a {
                return bad(format!("crossed: bid {b} >= ask {a} ticks"));
            }
        }
        let mut n = 0;
        for (side, book) in [(Side::Bid, &self.bids), (Side::Ask, &self.asks)] {
            for (p, q) in book {
                if *p <= 0 {
                    return bad(format!("{side:?} level at {p} ticks"));
                }
                if q.orders.is_empty() || q.total <= 0 {
                    return bad(format!("{side:?} level {p} is empty"));
                }
                let sum: i64 = q.orders.iter().map(|o| o.qty).sum();
                if sum != q.total {
                    return bad(format!("{side:?} level {p}: total {} != orders {sum}", q.total));
                }
                for o in &q.orders {
                    if o.qty <= 0 || o.qty % self.step != 0 {
                        return bad(format!("order {} has qty {}", o.id, o.qty));
                    }
                    match self.live.pos.get(&o.id).map(|&i| self.live.ids[i]) {
                        Some((_, s, pr)) if s == side && pr == *p => {}
                        other => return bad(format!("order {} indexed as {other:?}", o.id)),
                    }
                    n += 1;
                }
            }
        }
        if n != self.live.ids.len() || n != self.live.pos.len() {
            return bad(format!("{n} resting orders but {} indexed", self.live.ids.len()));
        }
        Ok(())
    }

    // --- participants ------------------------------------------------------------------------

    /// Milliseconds to the next action: exponential with mean `1000 / ACTIONS_PER_S`.
    fn gap_ms(&mut self) -> i64 {
        (self.exp() * 1000.0 / ACTIONS_PER_S) as i64
    }

    /// A standard exponential sample.
    fn exp(&mut self) -> f64 {
        let u: f64 = self.rng.random();
        -(1.0 - u).ln()
    }

    /// An approximately standard normal sample (Irwin–Hall of four uniforms).
    fn gauss(&mut self) -> f64 {
        let s: f64 = (0..4).map(|_| self.rng.random::<f64>()).sum();
        (s - 2.0) * 3f64.sqrt()
    }

    /// `x` ticks rounded up or down at random, unbiased.
    fn round_ticks(&mut self, x: f64) -> i64 {
        let u: f64 = self.rng.random();
        (x + u).floor() as i64
    }

    /// One random-walk step of the fair value: ~6 bp per simulated minute, pulled weakly
    /// towards the start price.
    fn move_fair(&mut self) {
        let per_action = 6.0 / (60.0 * ACTIONS_PER_S).sqrt();
        let pull = (self.start_ticks - self.fair) as f64 * 2e-7;
        let x = self.gauss() * per_action * self.bp as f64 + pull;
        let d = self.round_ticks(x);
        self.fair = (self.fair + d).max(self.start_ticks / 10).max(10);
    }

    /// Mid price in ticks (or the fair value when a side is empty).
    fn mid(&self) -> i64 {
        match (self.bids.keys().next_back(), self.asks.keys().next()) {
            (Some(b), Some(a)) => (a + b) / 2,
            _ => self.fair,
        }
    }

    /// A quantity of about `scale` lots, in raw units, at least one step.
    fn lots(&mut self, base: f64, spread: f64) -> i64 {
        let k = base + self.exp() * spread;
        ((self.lot_steps as f64 * k).round() as i64).max(1) * self.step
    }

    fn place_limit(&mut self, t: i64, trades: &mut Vec<Fill>) -> bool {
        let side = if self.rng.random_bool(0.5) { Side::Bid } else { Side::Ask };
        let mean = if self.rng.random_bool(0.5) {
            0.6 * self.bp as f64
        } else {
            (25 * self.bp).max(120) as f64
        };
        let off = (self.exp() * mean) as i64;
        let half = (self.bp / 20).max(1);
        let price = match side {
            Side::Bid => self.fair - half - off,
            Side::Ask => self.fair + half + off,
        };
        if price <= 0 {
            return false;
        }
        let qty = self.lots(0.1, 1.2);
        let rest = self.take(side, Some(price), qty, t, trades);
        if rest > 0 {
            let id = self.next_order_id;
            self.next_order_id += 1;
            let book = match side {
                Side::Bid => &mut self.bids,
                Side::Ask => &mut self.asks,
            };
            let q = book.entry(price).or_default();
            q.orders.push_back(Resting { id, qty: rest });
            q.total += rest;
            self.live.insert(id, side, price);
            self.touched.push((side, price));
        }
        true
    }

    fn cancel_one(&mut self) -> bool {
        if self.live.ids.is_empty() {
            return false;
        }
        let (id, side, price) = if self.rng.random_bool(0.5) {
            let i = self.rng.random_range(0..self.live.ids.len());
            self.live.ids[i]
        } else {
            let side = if self.rng.random_bool(0.5) { Side::Bid } else { Side::Ask };
            let n = self.depth(side).min(10);
            if n == 0 {
                return false;
            }
            let k = self.rng.random_range(0..n);
            let (price, q) = match side {
                Side::Bid => self.bids.iter().rev().nth(k),
                Side::Ask => self.asks.iter().nth(k),
            }
            .expect("k < depth");
            let j = self.rng.random_range(0..q.orders.len());
            (q.orders[j].id, side, *price)
        };
        let book = match side {
            Side::Bid => &mut self.bids,
            Side::Ask => &mut self.asks,
        };
        if let Some(q) = book.get_mut(&price) {
            if let Some(j) = q.orders.iter().position(|o| o.id == id) {
                let o = q.orders.remove(j).expect("position found");
                q.total -= o.qty;
                if q.orders.is_empty() {
                    book.remove(&price);
                }
                self.touched.push((side, price));
            }
        }
        self.live.remove(id);
        true
    }

    fn market_order(&mut self, t: i64, trades: &mut Vec<Fill>) -> bool {
        let lean = ((self.fair - self.mid()) as f64 / (self.bp as f64 * 10.0)).clamp(-0.3, 0.3);
        let side = if self.rng.random_bool(0.5 + lean) { Side::Bid } else { Side::Ask };
        let cap: i64 = match side {
            Side::Bid => self.asks.values().take(5).map(|q| q.total).sum(),
            Side::Ask => self.bids.values().rev().take(5).map(|q| q.total).sum(),
        };
        let qty = self.lots(0.2, 1.5).min(cap);
        if qty <= 0 {
            return false;
        }
        self.take(side, None, qty, t, trades);
        true
    }

    /// Matches a taker order of `side` for `qty` (raw) against the opposite side, best price
    /// first and oldest order first, up to `limit` ticks. Returns the unfilled quantity.
    fn take(
        &mut self,
        side: Side,
        limit: Option<i64>,
        mut qty: i64,
        t: i64,
        trades: &mut Vec<Fill>,
    ) -> i64 {
        let tick = self.tick;
        while qty > 0 {
            let entry = match side {
                Side::Bid => self.asks.first_entry(),
                Side::Ask => self.bids.last_entry(),
            };
            let Some(mut entry) = entry else { break };
            let price = *entry.key();
            let crosses = match (side, limit) {
                (_, None) => true,
                (Side::Bid, Some(l)) => price <= l,
                (Side::Ask, Some(l)) => price >= l,
            };
            if !crosses {
                break;
            }
            self.touched.push((side.opposite(), price));
            let q = entry.get_mut();
            while qty > 0 {
                let Some(front) = q.orders.front_mut() else { break };
                let fill = front.qty.min(qty);
                front.qty -= fill;
                q.total -= fill;
                qty -= fill;
                trades.push(Fill {
                    id: self.next_trade_id,
                    price: Price::from_raw(price * tick),
                    qty: Qty::from_raw(fill),
                    time_ms: t,
                    buyer_is_maker: side == Side::Ask,
                });
                self.next_trade_id += 1;
                if front.qty == 0 {
                    let id = front.id;
                    q.orders.pop_front();
                    self.live.remove(id);
                }
            }
            if q.orders.is_empty() {
                entry.remove();
            }
        }
        qty
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_750_000_020_000;

    fn run(symbol: &str, seed: u64, secs: i64) -> (MatchingEngine, Vec<Fill>) {
        let spec = SymbolSpec::by_name(symbol).unwrap();
        let mut e = MatchingEngine::new(&spec, seed, T0, spec.reference_price);
        let mut trades = Vec::new();
        e.advance(T0 + secs * 1000, &mut trades);
        (e, trades)
    }

    #[test]
    fn never_crossed_and_consistent_after_every_action() {
        for sym in ["BTCUSDT", "DOGEUSDT", "XRPUSDT"] {
            let spec = SymbolSpec::by_name(sym).unwrap();
            let mut e = MatchingEngine::new(&spec, 7, T0, spec.reference_price);
            e.check_invariants().unwrap();
            let mut trades = Vec::new();
            let mut last_id = e.update_id();
            for _ in 0..4_000 {
                let before = e.clone();
                let n = trades.len();
                let changed = e.step(&mut trades);
                e.check_invariants().unwrap();
                assert_eq!(e.update_id(), last_id + changed as u64);
                last_id = e.update_id();
                // trades happen at resting prices of the book before the action, best first
                for (i, tr) in trades[n..].iter().enumerate() {
                    assert!(tr.qty.raw() > 0 && tr.qty.raw() % spec.step.raw() == 0);
                    assert_eq!(tr.price.raw() % spec.tick.raw(), 0);
                    let resting = if tr.buyer_is_maker {
                        before.levels(Side::Bid, usize::MAX)
                    } else {
                        before.levels(Side::Ask, usize::MAX)
                    };
                    assert!(
                        resting.iter().any(|l| l.price == tr.price),
                        "{sym}: trade {tr:?} not at a resting price"
                    );
                    if i > 0 {
                        let prev = trades[n + i - 1];
                        assert!(if tr.buyer_is_maker {
                            tr.price <= prev.price
                        } else {
                            tr.price >= prev.price
                        });
                        assert_eq!(tr.id, prev.id + 1);
                    }
                }
            }
        }
    }

    #[test]
    fn realistic_activity() {
        for spec in SymbolSpec::catalog() {
            let (e, trades) = run(&spec.symbol, 1, 600);
            let per_s = trades.len() as f64 / 600.0;
            eprintln!(
                "{}: {per_s:.1} trades/s, depth {} / {}, best {:?}",
                spec.symbol,
                e.depth(Side::Bid),
                e.depth(Side::Ask),
                e.best()
            );
            assert!(per_s >= 2.0, "{}: {per_s} trades/s", spec.symbol);
            assert!(
                e.depth(Side::Bid) >= 100 && e.depth(Side::Ask) >= 100,
                "{}: depth {} / {}",
                spec.symbol,
                e.depth(Side::Bid),
                e.depth(Side::Ask)
            );
            let (b, a) = e.best();
            let (b, a) = (b.unwrap().raw(), a.unwrap().raw());
            let start = spec.reference_price.raw();
            assert!((b - start).abs() < start / 20, "{}: bid {b} vs start {start}", spec.symbol);
            assert!(a > b);
        }
    }

    #[test]
    fn deterministic_per_seed_and_independent_of_stepping() {
        let (a, ta) = run("ETHUSDT", 42, 300);
        let spec = SymbolSpec::by_name("ETHUSDT").unwrap();
        let mut b = MatchingEngine::new(&spec, 42, T0, spec.reference_price);
        let mut tb = Vec::new();
        let mut t = T0;
        while t < T0 + 300_000 {
            t += 37;
            b.advance(t.min(T0 + 300_000), &mut tb);
        }
        assert_eq!(ta, tb);
        assert_eq!(a.update_id(), b.update_id());
        assert_eq!(a.levels(Side::Bid, 1000), b.levels(Side::Bid, 1000));
        let (_, tc) = run("ETHUSDT", 43, 300);
        assert_ne!(ta, tc);
    }
}
