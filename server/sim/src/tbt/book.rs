//! One simulated stock of the tick-by-tick feed: a price-time-priority book with simulated
//! participants, publishing every action as venue-correct order-by-order messages.
//!
//! ## Why a separate engine from [`crate::engine`]
//! The Binance engine never names orders in its output (trades carry no order ids, adds and
//! cancels are not events), and its sizes / ticks are crypto-like. A tick-by-tick feed must publish
//! every order by id, so this small engine keeps the same ideas (a fair value random walk,
//! limit orders around it, cancels, marketable orders) with A-share conventions: prices on a 0.01
//! tick, quantities in lots of 100 shares, a ±10 % band around the reference price.
//!
//! ## What it publishes ([`Venue`] semantics of `shared::l3`)
//! - **Shanghai** (SSE): an aggressive order is published only for the part that rests, *after*
//!   its trades (so trades name an aggressor id never seen; an IOC remainder publishes nothing);
//!   cancels are [`Msg::Cancel`] in the order stream.
//! - **Shenzhen** (SZSE): every order is published in full ([`Msg::Add`]) *before* its trades;
//!   cancels (including an IOC order's unfilled rest) are [`Msg::Trade`] records with
//!   [`TradeKind::Cancel`], price 0 and the cancelled id on its side.
//!
//! Every trade is at the resting order's price, buyer / seller ids as in the exchange record,
//! `kind` = who was the aggressor.
//!
//! ## The truth
//! The book here (`BTreeMap` of price → FIFO queue, plus an id index) is the simulator's own and
//! shares no code with `shared::l3::L3Book`, so comparing the two is a real check. After every
//! [`StockSim::step`] the book is not crossed (an SZSE aggressive order crosses the *published*
//! book only between its `Add` and its trades, never at an action boundary).
//!
//! Deterministic: every choice comes from one `SmallRng` in order, so the message sequence is a
//! pure function of the seed and the number of steps, whatever the pace.

use std::collections::{BTreeMap, HashMap, VecDeque};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use shared::l3::{Msg, Order, OrderId, TradeKind, Venue};
use shared::{Level, Price, Qty, Side};

/// Price tick, raw units (0.01).
pub const TICK_RAW: i64 = 1_000_000;
/// Shares per lot.
pub const LOT_SHARES: i64 = 100;
/// One lot, raw quantity units.
pub const LOT_RAW: i64 = LOT_SHARES * 100_000_000;
/// Resting orders the cancel rate steers towards.
const TARGET_ORDERS: usize = 300;
/// Share of actions that are marketable IOC orders.
const P_TAKE: f64 = 0.1;
/// Fair-value volatility per action, ticks.
const FAIR_STEP: f64 = 0.2;

/// A resting order's remaining lots.
#[derive(Debug, Clone, Copy)]
struct Resting {
    id: OrderId,
    lots: i64,
}

#[derive(Debug, Clone, Default)]
struct Queue {
    orders: VecDeque<Resting>,
    lots: i64,
}

/// Where a live order rests, and its slot in the dense id list (for uniform random cancels).
#[derive(Debug, Clone, Copy)]
struct Where {
    side: Side,
    ticks: i64,
    pos: usize,
}

/// One simulated stock (see the module docs).
#[derive(Debug, Clone)]
pub struct StockSim {
    venue: Venue,
    rng: SmallRng,
    /// Bids by price in ticks, best = last key.
    bids: BTreeMap<i64, Queue>,
    /// Asks by price in ticks, best = first key.
    asks: BTreeMap<i64, Queue>,
    index: HashMap<OrderId, Where>,
    live: Vec<OrderId>,
    /// Hidden fair value, ticks.
    fair: i64,
    /// Reference price (previous close), ticks: the ±10 % band is around it.
    reference: i64,
    next_id: OrderId,
}

fn price(ticks: i64) -> Price {
    Price::from_raw(ticks * TICK_RAW)
}

fn qty(lots: i64) -> Qty {
    Qty::from_raw(lots * LOT_RAW)
}

/// A broken invariant of a simulated book (a simulator bug; tests check for it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("simulated book invariant broken: {0}")]
pub struct InvariantBroken(pub String);

impl StockSim {
    /// A stock with an empty book at `reference` (rounded down to the tick, at least 1.00).
    pub fn new(venue: Venue, seed: u64, reference: Price) -> StockSim {
        let reference = (reference.raw() / TICK_RAW).max(100);
        StockSim {
            venue,
            rng: SmallRng::seed_from_u64(seed),
            bids: BTreeMap::new(),
            asks: BTreeMap::new(),
            index: HashMap::new(),
            live: Vec::new(),
            fair: reference,
            reference,
            next_id: 1,
        }
    }

    pub fn venue(&self) -> Venue {
        self.venue
    }

    /// Places the opening book: passive orders on both sides, one `Add` each.
    pub fn open(&mut self, out: &mut Vec<Msg>) {
        for _ in 0..TARGET_ORDERS / 2 {
            self.limit_order(out, true);
        }
    }

    /// One participant action; appends its messages to `out` (usually 1, more when it trades,
    /// occasionally 0: an SSE IOC order that found nothing publishes nothing).
    pub fn step(&mut self, out: &mut Vec<Msg>) {
        self.move_fair();
        let r: f64 = self.rng.random();
        let p_cancel = (0.5 * self.live.len() as f64 / TARGET_ORDERS as f64).min(0.85);
        if r < P_TAKE {
            self.marketable(out);
        } else if r < P_TAKE + p_cancel {
            self.cancel_one(out);
        } else {
            self.limit_order(out, false);
        }
    }

    /// Every resting order, by id.
    pub fn orders(&self) -> Vec<(OrderId, Order)> {
        let mut v: Vec<(OrderId, Order)> = Vec::with_capacity(self.live.len());
        for (side, book) in [(Side::Bid, &self.bids), (Side::Ask, &self.asks)] {
            for (&t, q) in book {
                v.extend(
                    q.orders
                        .iter()
                        .map(|o| (o.id, Order { side, price: price(t), qty: qty(o.lots) })),
                );
            }
        }
        v.sort_unstable_by_key(|(id, _)| *id);
        v
    }

    /// Number of resting orders.
    pub fn order_count(&self) -> usize {
        self.live.len()
    }

    /// The best `n` levels of `side`, best first.
    pub fn levels(&self, side: Side, n: usize) -> Vec<Level> {
        let lv = |(t, q): (&i64, &Queue)| Level::new(price(*t), qty(q.lots));
        match side {
            Side::Bid => self.bids.iter().rev().take(n).map(lv).collect(),
            Side::Ask => self.asks.iter().take(n).map(lv).collect(),
        }
    }

    /// Checks the book's own invariants: not crossed, level totals equal their orders, the index
    /// agrees with the queues.
    pub fn check(&self) -> Result<(), InvariantBroken> {
        if let (Some(b), Some(a)) = (self.bids.keys().next_back(), self.asks.keys().next()) {
            if b >= a {
                return Err(InvariantBroken(format!("crossed: bid {b} >= ask {a} ticks")));
            }
        }
        let mut n = 0;
        for (side, book) in [(Side::Bid, &self.bids), (Side::Ask, &self.asks)] {
            for (&t, q) in book {
                let sum: i64 = q.orders.iter().map(|o| o.lots).sum();
                if q.orders.is_empty() || sum != q.lots || q.orders.iter().any(|o| o.lots <= 0) {
                    return Err(InvariantBroken(format!(
                        "{side:?} level {t}: total {} vs orders {sum}",
                        q.lots
                    )));
                }
                for o in &q.orders {
                    match self.index.get(&o.id) {
                        Some(w)
                            if w.side == side
                                && w.ticks == t
                                && self.live.get(w.pos) == Some(&o.id) => {}
                        other => {
                            return Err(InvariantBroken(format!(
                                "order {} indexed as {other:?}",
                                o.id
                            )))
                        }
                    }
                    n += 1;
                }
            }
        }
        if n != self.live.len() || n != self.index.len() {
            return Err(InvariantBroken(format!(
                "{n} resting orders, {} live, {} indexed",
                self.live.len(),
                self.index.len()
            )));
        }
        Ok(())
    }

    // --- participants ---------------------------------------------------------------------------

    fn exp(&mut self) -> f64 {
        let u: f64 = self.rng.random();
        -(1.0 - u).ln()
    }

    /// Irwin–Hall approximation of a standard normal.
    fn gauss(&mut self) -> f64 {
        let s: f64 = (0..4).map(|_| self.rng.random::<f64>()).sum();
        (s - 2.0) * 3f64.sqrt()
    }

    /// Random walk with a weak pull to the reference, kept inside the ±10 % price band.
    fn move_fair(&mut self) {
        let pull = (self.reference - self.fair) as f64 * 1e-4;
        let x = self.gauss() * FAIR_STEP + pull;
        let u: f64 = self.rng.random();
        let d = (x + u).floor() as i64; // unbiased rounding
        let band = self.reference / 10;
        self.fair = (self.fair + d).clamp(self.reference - band + 5, self.reference + band - 5);
    }

    fn lots(&mut self, mean: f64) -> i64 {
        1 + (self.exp() * mean) as i64
    }

    fn best(&self, side: Side) -> Option<i64> {
        match side {
            Side::Bid => self.bids.keys().next_back().copied(),
            Side::Ask => self.asks.keys().next().copied(),
        }
    }

    fn limit_order(&mut self, out: &mut Vec<Msg>, passive_only: bool) {
        let side = if self.rng.random_bool(0.5) { Side::Bid } else { Side::Ask };
        let mean = if self.rng.random_bool(0.6) { 3.0 } else { 25.0 };
        let off = (self.exp() * mean) as i64;
        let mut ticks = match side {
            Side::Bid => self.fair - 1 - off,
            Side::Ask => self.fair + 1 + off,
        };
        if passive_only {
            // the opening book must not trade
            if let Some(b) = self.best(side.opposite()) {
                ticks = match side {
                    Side::Bid => ticks.min(b - 1),
                    Side::Ask => ticks.max(b + 1),
                };
            }
        }
        let band = self.reference / 10;
        let ticks = ticks.clamp(self.reference - band, self.reference + band);
        let lots = self.lots(4.0);
        self.submit(side, ticks, lots, false, out);
    }

    /// A marketable IOC order leaning towards the fair value, priced a few ticks through the
    /// opposite best; what it cannot fill is cancelled.
    fn marketable(&mut self, out: &mut Vec<Msg>) {
        let mid = match (self.best(Side::Bid), self.best(Side::Ask)) {
            (Some(b), Some(a)) => (a + b) / 2,
            _ => self.fair,
        };
        let lean = ((self.fair - mid) as f64 / 20.0).clamp(-0.3, 0.3);
        let side = if self.rng.random_bool(0.5 + lean) { Side::Bid } else { Side::Ask };
        let through = self.rng.random_range(0..3i64);
        let ticks = match (side, self.best(side.opposite())) {
            (Side::Bid, Some(a)) => a + through,
            (Side::Ask, Some(b)) => b - through,
            _ => self.fair,
        };
        if ticks <= 0 {
            return;
        }
        let lots = self.lots(6.0);
        self.submit(side, ticks, lots, true, out);
    }

    fn cancel_one(&mut self, out: &mut Vec<Msg>) {
        if self.live.is_empty() {
            return;
        }
        let id = if self.rng.random_bool(0.5) {
            self.live[self.rng.random_range(0..self.live.len())]
        } else {
            // near the top of a random side
            let side = if self.rng.random_bool(0.5) { Side::Bid } else { Side::Ask };
            let book = match side {
                Side::Bid => &self.bids,
                Side::Ask => &self.asks,
            };
            let n = book.len().min(5);
            if n == 0 {
                return;
            }
            let k = self.rng.random_range(0..n);
            let q = match side {
                Side::Bid => self.bids.values().rev().nth(k),
                Side::Ask => self.asks.values().nth(k),
            };
            let Some(q) = q else { return };
            q.orders[self.rng.random_range(0..q.orders.len())].id
        };
        let Some(w) = self.index.get(&id).copied() else { return };
        let book = match w.side {
            Side::Bid => &mut self.bids,
            Side::Ask => &mut self.asks,
        };
        let Some(q) = book.get_mut(&w.ticks) else { return };
        let Some(j) = q.orders.iter().position(|o| o.id == id) else { return };
        let o = q.orders.remove(j).expect("position found");
        q.lots -= o.lots;
        if q.orders.is_empty() {
            book.remove(&w.ticks);
        }
        self.unindex(id);
        out.push(self.cancel_msg(id, w.side, w.ticks, o.lots));
    }

    fn cancel_msg(&self, id: OrderId, side: Side, ticks: i64, lots: i64) -> Msg {
        match self.venue {
            Venue::Szse => {
                let (buy_id, sell_id) = if side == Side::Bid { (id, 0) } else { (0, id) };
                Msg::Trade {
                    buy_id,
                    sell_id,
                    price: Price::ZERO,
                    qty: qty(lots),
                    kind: TradeKind::Cancel,
                }
            }
            _ => Msg::Cancel { id, side, price: price(ticks), qty: qty(lots) },
        }
    }

    fn unindex(&mut self, id: OrderId) {
        if let Some(w) = self.index.remove(&id) {
            self.live.swap_remove(w.pos);
            if let Some(&moved) = self.live.get(w.pos) {
                if let Some(m) = self.index.get_mut(&moved) {
                    m.pos = w.pos;
                }
            }
        }
    }

    /// A new order of `side` for `lots` at limit `ticks`: matches (price-time) against the other
    /// side, then rests or (IOC) cancels its remainder, publishing as the venue does.
    fn submit(&mut self, side: Side, ticks: i64, lots: i64, ioc: bool, out: &mut Vec<Msg>) {
        if ticks <= 0 || lots <= 0 {
            return;
        }
        let id = self.next_id;
        self.next_id += 1;
        let szse = self.venue == Venue::Szse;
        if szse {
            out.push(Msg::Add { id, side, price: price(ticks), qty: qty(lots) });
        }
        let kind =
            if side == Side::Bid { TradeKind::BuyInitiated } else { TradeKind::SellInitiated };
        let mut left = lots;
        let mut filled_out = Vec::new();
        while left > 0 {
            let entry = match side {
                Side::Bid => self.asks.first_entry(),
                Side::Ask => self.bids.last_entry(),
            };
            let Some(mut entry) = entry else { break };
            let level = *entry.key();
            let crosses = if side == Side::Bid { level <= ticks } else { level >= ticks };
            if !crosses {
                break;
            }
            let q = entry.get_mut();
            while left > 0 {
                let Some(front) = q.orders.front_mut() else { break };
                let fill = front.lots.min(left);
                front.lots -= fill;
                q.lots -= fill;
                left -= fill;
                let (buy_id, sell_id) =
                    if side == Side::Bid { (id, front.id) } else { (front.id, id) };
                out.push(Msg::Trade { buy_id, sell_id, price: price(level), qty: qty(fill), kind });
                if front.lots == 0 {
                    filled_out.push(front.id);
                    q.orders.pop_front();
                }
            }
            if q.orders.is_empty() {
                entry.remove();
            }
        }
        for done in filled_out {
            self.unindex(done);
        }
        if left == 0 {
            return;
        }
        if ioc {
            if szse {
                out.push(self.cancel_msg(id, side, ticks, left));
            }
            return;
        }
        if !szse {
            out.push(Msg::Add { id, side, price: price(ticks), qty: qty(left) });
        }
        let book = match side {
            Side::Bid => &mut self.bids,
            Side::Ask => &mut self.asks,
        };
        let q = book.entry(ticks).or_default();
        q.orders.push_back(Resting { id, lots: left });
        q.lots += left;
        self.index.insert(id, Where { side, ticks, pos: self.live.len() });
        self.live.push(id);
    }
}

#[cfg(test)]
mod tests {
    use shared::l3::L3Book;

    use super::*;

    fn ten() -> Price {
        Price::parse("10.00").unwrap()
    }

    /// The published messages, applied to the shared L3 book, give exactly the simulator's book
    /// after every action, with no anomaly counted, for both venues.
    #[test]
    fn published_messages_rebuild_the_true_book() {
        for venue in [Venue::Sse, Venue::Szse] {
            let mut s = StockSim::new(venue, 11, ten());
            let mut l3 = L3Book::new(venue);
            let mut out = Vec::new();
            s.open(&mut out);
            let (mut adds, mut trades, mut cancels) = (0, 0, 0);
            for step in 0..30_000 {
                if step > 0 {
                    out.clear();
                    s.step(&mut out);
                }
                for m in &out {
                    match m {
                        Msg::Add { .. } => adds += 1,
                        Msg::Cancel { .. } | Msg::Trade { kind: TradeKind::Cancel, .. } => {
                            cancels += 1
                        }
                        _ => trades += 1,
                    }
                    l3.apply(*m);
                }
                l3.clear_updates();
                if step % 97 == 0 {
                    s.check().unwrap();
                    assert_eq!(
                        l3.top(usize::MAX),
                        (s.levels(Side::Bid, usize::MAX), s.levels(Side::Ask, usize::MAX))
                    );
                    assert!(!l3.is_crossed(), "{venue:?} step {step}");
                }
            }
            let mut mine: Vec<(OrderId, Order)> = l3.orders().collect();
            mine.sort_unstable_by_key(|(id, _)| *id);
            assert_eq!(mine, s.orders());
            let c = l3.counters();
            assert_eq!(
                (
                    c.cancels_not_found,
                    c.trades_not_found,
                    c.negative_qty_clamped,
                    c.duplicate_order_ids,
                    c.invalid
                ),
                (0, 0, 0, 0, 0),
                "{venue:?}: {c:?}"
            );
            match venue {
                Venue::Sse => {
                    assert!(c.unseen_order_refs > 0, "SSE aggressors are never published")
                }
                _ => assert_eq!(c.unseen_order_refs, 0),
            }
            assert!(
                adds > 5_000 && trades > 1_000 && cancels > 5_000,
                "{venue:?}: {adds} {trades} {cancels}"
            );
            assert!(s.order_count() > 100, "{}", s.order_count());
            // prices stay on the tick, inside the band
            let (b, a) = (s.levels(Side::Bid, 1)[0].price, s.levels(Side::Ask, 1)[0].price);
            assert!(
                b.raw() % TICK_RAW == 0
                    && b >= Price::parse("9.00").unwrap()
                    && a <= Price::parse("11.00").unwrap()
            );
        }
    }

    #[test]
    fn deterministic_per_seed() {
        let run = |seed| {
            let mut s = StockSim::new(Venue::Szse, seed, ten());
            let mut out = Vec::new();
            s.open(&mut out);
            for _ in 0..2_000 {
                s.step(&mut out);
            }
            out
        };
        assert_eq!(run(5), run(5));
        assert_ne!(run(5), run(6));
    }
}
