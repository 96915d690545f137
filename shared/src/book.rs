//! The L2 order book: one price ladder per side.
//!
//! ## Data structure
//! Each [`Ladder`] is a sorted `Vec` of price keys with a parallel `Vec` of quantities, ordered so
//! that the **best level is the last element**. Real update streams hit the top of the book far
//! more than the tail, so inserts and deletes near the top move only a few elements, and lookups
//! scan the last few slots before falling back to a binary search. The `book` benchmark compares
//! this against a `BTreeMap` ladder on the same skewed input (see BENCHMARKS.md).
//!
//! Bids are keyed by price and asks by negated price, so one ascending implementation serves both
//! sides.
//!
//! ## Checksum
//! [`OrderBook::checksum`] is CRC-32 (IEEE) over the canonical string of the top `n` levels,
//! interleaved bid then ask per depth and joined by `:` (the OKX/Kraken idea):
//! `bid1_price:bid1_qty:ask1_price:ask1_qty:bid2_price:...`. A side with fewer than `n` levels
//! simply contributes fewer fields. Numbers are written as the shortest exact decimal (`7195.24`,
//! `0.0001`, `3`), the same text [`Price`]'s `Display` produces, so any client can recompute it.

use core::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::fixed::{Price, Qty};

/// The side of the book a level or order belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    Bid,
    Ask,
}

impl Side {
    pub fn opposite(self) -> Side {
        match self {
            Side::Bid => Side::Ask,
            Side::Ask => Side::Bid,
        }
    }
}

/// One price level. Serialised as `["price","qty"]`, the shape every exchange uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Level {
    pub price: Price,
    pub qty: Qty,
}

impl Level {
    pub fn new(price: Price, qty: Qty) -> Self {
        Self { price, qty }
    }
}

impl Serialize for Level {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (self.price, self.qty).serialize(s)
    }
}

impl<'de> Deserialize<'de> for Level {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let (price, qty) = <(Price, Qty)>::deserialize(d)?;
        Ok(Level { price, qty })
    }
}

/// An absolute L2 change: the level at `price` on `side` now holds `qty` (0 = removed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LevelUpdate {
    pub side: Side,
    pub price: Price,
    pub qty: Qty,
}

/// One side of the book, best level last (see the module docs).
#[derive(Debug, Clone)]
pub struct Ladder {
    side: Side,
    /// Price keys, ascending; bids store `price`, asks store `-price`, so the best is last.
    keys: Vec<i64>,
    /// Quantity of each level, parallel to `keys`; never zero.
    qtys: Vec<Qty>,
}

/// How many top slots [`Ladder::find`] scans linearly before binary-searching the rest.
const LINEAR_SCAN: usize = 8;

impl Ladder {
    pub fn new(side: Side) -> Self {
        Self { side, keys: Vec::new(), qtys: Vec::new() }
    }

    pub fn side(&self) -> Side {
        self.side
    }

    #[inline]
    fn key(&self, price: Price) -> i64 {
        match self.side {
            Side::Bid => price.raw(),
            Side::Ask => price.raw().wrapping_neg(),
        }
    }

    #[inline]
    fn price_of(&self, key: i64) -> Price {
        match self.side {
            Side::Bid => Price::from_raw(key),
            Side::Ask => Price::from_raw(key.wrapping_neg()),
        }
    }

    /// Like `binary_search`, but scans the top few slots first, where most updates land.
    #[inline]
    fn find(&self, key: i64) -> Result<usize, usize> {
        let n = self.keys.len();
        let stop = n.saturating_sub(LINEAR_SCAN);
        let mut i = n;
        while i > stop {
            let k = self.keys[i - 1];
            if k == key {
                return Ok(i - 1);
            }
            if k < key {
                return Err(i);
            }
            i -= 1;
        }
        self.keys[..stop].binary_search(&key)
    }

    /// Sets the level at `price` to `qty`; zero removes it. Returns whether anything changed.
    #[inline]
    pub fn apply(&mut self, price: Price, qty: Qty) -> bool {
        let key = self.key(price);
        match self.find(key) {
            Ok(i) => {
                if qty.is_zero() {
                    self.keys.remove(i);
                    self.qtys.remove(i);
                    true
                } else if self.qtys[i] != qty {
                    self.qtys[i] = qty;
                    true
                } else {
                    false
                }
            }
            Err(i) => {
                if qty.is_zero() {
                    false
                } else {
                    self.keys.insert(i, key);
                    self.qtys.insert(i, qty);
                    true
                }
            }
        }
    }

    /// Quantity resting at `price` (zero if no level).
    pub fn get(&self, price: Price) -> Qty {
        match self.find(self.key(price)) {
            Ok(i) => self.qtys[i],
            Err(_) => Qty::ZERO,
        }
    }

    #[inline]
    pub fn best(&self) -> Option<Level> {
        let i = self.keys.len().checked_sub(1)?;
        Some(Level::new(self.price_of(self.keys[i]), self.qtys[i]))
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn clear(&mut self) {
        self.keys.clear();
        self.qtys.clear();
    }

    /// Levels from best to worst.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = Level> + DoubleEndedIterator + '_ {
        self.keys.iter().zip(self.qtys.iter()).rev().map(|(&k, &q)| Level::new(self.price_of(k), q))
    }

    /// The level `depth` places from the top (0 = best).
    #[inline]
    pub fn nth(&self, depth: usize) -> Option<Level> {
        let i = self.keys.len().checked_sub(depth + 1)?;
        Some(Level::new(self.price_of(self.keys[i]), self.qtys[i]))
    }

    /// Copies the best `n` levels into `out` (cleared first), best first.
    pub fn top_into(&self, n: usize, out: &mut Vec<Level>) {
        out.clear();
        out.extend(self.iter().take(n));
    }

    /// Keeps the best `n` levels and drops the rest.
    pub fn truncate(&mut self, n: usize) {
        let drop = self.keys.len().saturating_sub(n);
        self.keys.drain(..drop);
        self.qtys.drain(..drop);
    }

    /// Removes every level strictly worse than `price` (further from the top). Used to drop levels
    /// beyond a snapshot's depth, which can no longer be trusted.
    pub fn remove_worse_than(&mut self, price: Price) {
        let key = self.key(price);
        let cut = self.keys.partition_point(|&k| k < key);
        self.keys.drain(..cut);
        self.qtys.drain(..cut);
    }

    /// Replaces the whole side with `levels` (any order; zero quantities ignored; later
    /// duplicates win).
    pub fn replace(&mut self, levels: &[Level]) {
        self.clear();
        let mut pairs: Vec<(i64, Qty)> =
            levels.iter().filter(|l| !l.qty.is_zero()).map(|l| (self.key(l.price), l.qty)).collect();
        // stable sort keeps input order among equal keys; dedup keeps the last of each run
        pairs.sort_by_key(|p| p.0);
        let mut i = 0;
        while i < pairs.len() {
            let mut j = i;
            while j + 1 < pairs.len() && pairs[j + 1].0 == pairs[i].0 {
                j += 1;
            }
            self.keys.push(pairs[j].0);
            self.qtys.push(pairs[j].1);
            i = j + 1;
        }
    }
}

impl PartialEq for Ladder {
    fn eq(&self, o: &Self) -> bool {
        self.side == o.side && self.keys == o.keys && self.qtys == o.qtys
    }
}
impl Eq for Ladder {}

/// An L2 order book: bids and asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderBook {
    pub bids: Ladder,
    pub asks: Ladder,
}

impl Default for OrderBook {
    fn default() -> Self {
        Self::new()
    }
}

impl OrderBook {
    pub fn new() -> Self {
        Self { bids: Ladder::new(Side::Bid), asks: Ladder::new(Side::Ask) }
    }

    #[inline]
    pub fn side(&self, side: Side) -> &Ladder {
        match side {
            Side::Bid => &self.bids,
            Side::Ask => &self.asks,
        }
    }

    #[inline]
    pub fn side_mut(&mut self, side: Side) -> &mut Ladder {
        match side {
            Side::Bid => &mut self.bids,
            Side::Ask => &mut self.asks,
        }
    }

    /// Sets one level (qty 0 deletes). Returns whether the book changed.
    #[inline]
    pub fn apply(&mut self, side: Side, price: Price, qty: Qty) -> bool {
        self.side_mut(side).apply(price, qty)
    }

    #[inline]
    pub fn apply_update(&mut self, u: LevelUpdate) -> bool {
        self.apply(u.side, u.price, u.qty)
    }

    pub fn best_bid(&self) -> Option<Level> {
        self.bids.best()
    }

    pub fn best_ask(&self) -> Option<Level> {
        self.asks.best()
    }

    /// Best ask minus best bid, when both sides have a level.
    pub fn spread(&self) -> Option<Price> {
        Some(Price::from_raw(self.best_ask()?.price.raw() - self.best_bid()?.price.raw()))
    }

    /// A book is crossed when the best bid is at or above the best ask.
    pub fn is_crossed(&self) -> bool {
        match (self.best_bid(), self.best_ask()) {
            (Some(b), Some(a)) => b.price >= a.price,
            _ => false,
        }
    }

    pub fn clear(&mut self) {
        self.bids.clear();
        self.asks.clear();
    }

    /// Replaces both sides.
    pub fn replace(&mut self, bids: &[Level], asks: &[Level]) {
        self.bids.replace(bids);
        self.asks.replace(asks);
    }

    /// The best `n` levels of each side, best first.
    pub fn top(&self, n: usize) -> (Vec<Level>, Vec<Level>) {
        (self.bids.iter().take(n).collect(), self.asks.iter().take(n).collect())
    }

    /// The canonical checksum string of the top `n` levels (see the module docs).
    pub fn checksum_string(&self, n: usize) -> String {
        let mut s = String::with_capacity(n * 40);
        for d in 0..n {
            for level in [self.bids.nth(d), self.asks.nth(d)].into_iter().flatten() {
                if !s.is_empty() {
                    s.push(':');
                }
                write!(s, "{}:{}", level.price, level.qty).expect("writing to a String");
            }
        }
        s
    }

    /// CRC-32 of [`Self::checksum_string`].
    pub fn checksum(&self, n: usize) -> u32 {
        crc32fast::hash(self.checksum_string(n).as_bytes())
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;
    use crate::testkit::Rng;
    use std::collections::BTreeMap;

    fn p(s: &str) -> Price {
        Price::parse(s).unwrap()
    }
    fn q(s: &str) -> Qty {
        Qty::parse(s).unwrap()
    }

    #[test]
    fn apply_inserts_updates_and_deletes() {
        let mut b = OrderBook::new();
        assert!(b.apply(Side::Bid, p("100"), q("1")));
        assert!(b.apply(Side::Bid, p("101"), q("2")));
        assert!(b.apply(Side::Bid, p("99"), q("3")));
        assert!(b.apply(Side::Ask, p("103"), q("1")));
        assert!(b.apply(Side::Ask, p("102"), q("4")));
        assert_eq!(b.best_bid(), Some(Level::new(p("101"), q("2"))));
        assert_eq!(b.best_ask(), Some(Level::new(p("102"), q("4"))));
        assert_eq!(b.spread(), Some(p("1")));
        assert!(!b.apply(Side::Bid, p("101"), q("2")), "same qty is no change");
        assert!(b.apply(Side::Bid, p("101"), q("0")));
        assert!(!b.apply(Side::Bid, p("101"), q("0")), "deleting a missing level is no change");
        assert_eq!(b.best_bid().unwrap().price, p("100"));
        let prices: Vec<_> = b.bids.iter().map(|l| l.price.to_string()).collect();
        assert_eq!(prices, ["100", "99"]);
        let prices: Vec<_> = b.asks.iter().map(|l| l.price.to_string()).collect();
        assert_eq!(prices, ["102", "103"]);
        assert_eq!(b.asks.get(p("103")), q("1"));
        assert_eq!(b.asks.get(p("104")), Qty::ZERO);
    }

    #[test]
    fn crossed_detection() {
        let mut b = OrderBook::new();
        assert!(!b.is_crossed());
        b.apply(Side::Bid, p("10"), q("1"));
        assert!(!b.is_crossed(), "one side only");
        b.apply(Side::Ask, p("11"), q("1"));
        assert!(!b.is_crossed());
        b.apply(Side::Bid, p("11"), q("1"));
        assert!(b.is_crossed(), "locked counts as crossed");
        b.apply(Side::Bid, p("11"), q("0"));
        b.apply(Side::Bid, p("12"), q("1"));
        assert!(b.is_crossed());
    }

    #[test]
    fn checksum_string_is_interleaved_and_short() {
        let mut b = OrderBook::new();
        b.replace(
            &[Level::new(p("100.50"), q("1.25")), Level::new(p("100"), q("2"))],
            &[Level::new(p("101"), q("0.5"))],
        );
        assert_eq!(b.checksum_string(1), "100.5:1.25:101:0.5");
        assert_eq!(b.checksum_string(5), "100.5:1.25:101:0.5:100:2");
        assert_eq!(b.checksum(5), crc32fast::hash(b"100.5:1.25:101:0.5:100:2"));
        assert_eq!(OrderBook::new().checksum_string(10), "");
    }

    #[test]
    fn replace_sorts_dedups_and_skips_zero() {
        let mut l = Ladder::new(Side::Ask);
        l.replace(&[
            Level::new(p("3"), q("1")),
            Level::new(p("1"), q("1")),
            Level::new(p("2"), q("0")),
            Level::new(p("1"), q("7")),
        ]);
        let v: Vec<_> = l.iter().map(|l| (l.price.to_string(), l.qty.to_string())).collect();
        assert_eq!(v, [("1".into(), "7".into()), ("3".into(), "1".into())]);
    }

    #[test]
    fn truncate_and_remove_worse() {
        let mut l = Ladder::new(Side::Bid);
        for i in 1..=10 {
            l.apply(Price::from_units(i), q("1"));
        }
        l.truncate(3);
        assert_eq!(l.iter().map(|l| l.price).collect::<Vec<_>>(), [10, 9, 8].map(Price::from_units));
        l.remove_worse_than(Price::from_units(9));
        assert_eq!(l.len(), 2);
        let mut a = Ladder::new(Side::Ask);
        for i in 1..=10 {
            a.apply(Price::from_units(i), q("1"));
        }
        a.remove_worse_than(Price::from_units(4));
        assert_eq!(a.iter().map(|l| l.price).collect::<Vec<_>>(), [1, 2, 3, 4].map(Price::from_units));
        assert_eq!(a.nth(1).unwrap().price, Price::from_units(2));
        assert_eq!(a.nth(4), None);
    }

    /// The ladder behaves exactly like a BTreeMap under random top-skewed updates.
    #[test]
    fn matches_btreemap_model() {
        for seed in 0..20 {
            let mut rng = Rng::new(seed);
            let mut book = OrderBook::new();
            let mut model: [BTreeMap<i64, i64>; 2] = [BTreeMap::new(), BTreeMap::new()];
            for _ in 0..5_000 {
                let side = if rng.chance(1, 2) { Side::Bid } else { Side::Ask };
                let d = rng.top_skewed(300) as i64;
                let price = match side {
                    Side::Bid => 10_000 - d,
                    Side::Ask => 10_001 + d,
                };
                let qty = if rng.chance(1, 3) { 0 } else { 1 + rng.below(1000) as i64 };
                let m = &mut model[side as usize];
                let before = m.get(&price).copied();
                if qty == 0 {
                    m.remove(&price);
                } else {
                    m.insert(price, qty);
                }
                let changed = book.apply(side, Price::from_raw(price), Qty::from_raw(qty));
                assert_eq!(changed, before != m.get(&price).copied());
            }
            let bids: Vec<_> = model[0].iter().rev().map(|(&p, &q)| (p, q)).collect();
            let asks: Vec<_> = model[1].iter().map(|(&p, &q)| (p, q)).collect();
            let got_b: Vec<_> = book.bids.iter().map(|l| (l.price.raw(), l.qty.raw())).collect();
            let got_a: Vec<_> = book.asks.iter().map(|l| (l.price.raw(), l.qty.raw())).collect();
            assert_eq!(got_b, bids);
            assert_eq!(got_a, asks);
        }
    }

    #[test]
    fn level_serde_is_an_array_of_strings() {
        let l = Level::new(p("1.5"), q("2"));
        assert_eq!(serde_json::to_string(&l).unwrap(), r#"["1.5","2"]"#);
        assert_eq!(serde_json::from_str::<Level>(r#"["1.50000000","2.0"]"#).unwrap(), l);
    }
}
