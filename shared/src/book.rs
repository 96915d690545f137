//! The L2 order book: one price ladder per side.
//!
//! ## Data structure
//! Each [`Ladder`] is a sorted `Vec` of price keys with a parallel `Vec` of quantities, ordered so
//! that the **best level is the last element**. Real update streams hit the top of the book far
//! more than the tail, so inserts and deletes near the top move only a few elements, and lookups
//! scan the last 4 slots, then binary-search the next 64, then the rest.
//!
//! Bids are keyed by price and asks by negated price, so one ascending implementation serves both
//! sides.
//!
//! **Tombstones near the top.** A delete within the top `WINDOW` (32) slots only zeroes the
//! quantity; the key stays, marked in a 32-bit `dead` mask (bit = depth from the top). A later
//! update at that price revives the slot, and a new price next to a tombstone takes its slot, so
//! the common delete/re-add churn near the top never shifts the key array. That shift was the main
//! cost, not the search: the next update's search reads exactly the keys the `memmove` just wrote,
//! so consecutive updates serialise on it. The top slot is always live (deleting the best level
//! pops it and the tombstones right below it), and a tombstone pushed down to depth 32 by inserts
//! above it is removed for real, so `best` stays O(1) and tombstones never pile up. `nth(d)` maps
//! the live rank to a slot through a nibble table of the top 16 depths (`ranks16`, rebuilt from
//! two byte lookups whenever `dead` changes), so it stays O(1) for the depths clients read.
//!
//! Measured on the `book` benchmark (1000 levels per side, 1M top-skewed updates, one core of a
//! 2.45 GHz AMD EPYC; A/B always within one run), in M updates/s for `apply` / `apply_read_top10`:
//! - previous ladder (scan the top 8, then binary search, every delete/insert shifts): 33.7 / 22.6
//! - that plus the current search (scan 4, the next 64, then the rest): 37.4 / 24.1; scan lengths
//!   2-64 and a second tier of 16-512 are all within ±2
//! - current ladder (that plus tombstones): 40.9 / 18.5; `BTreeMap`: 19.6 / 11.2
//!
//! Alternatives measured on the way (same-run A/B in a scratch harness, M/s, the previous ladder at
//! 33-36 in the same runs): a branchless count of the keys below in the top 8/16/32 slots (x86-64
//! has no baseline 64-bit vector compare, so it costs ~100 instructions): 28.9 / 25.2 / 18.6; a
//! hand-written branchless binary search: 28.8 (std's `binary_search` is already branchless and
//! better); fixed-size shifts of the top 4-32 slots instead of `memmove`: +0-1.5; tombstones with
//! no rank table (`nth` clears bits in a loop): 43.3 apply but only 13.0 with the top-10 reads;
//! a rank table for the whole 32-slot window: 38 / 19.6; tombstone windows of 16 / 24 / 32 / 64
//! slots: 35 / 36 / 43 / 39 (a narrow window misses the 5-25-deep churn, a wide one lengthens the
//! scans). Earlier experiments: interleaving keys and quantities in one `Vec` did not help.
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
#[derive(Clone)]
pub struct Ladder {
    side: Side,
    /// Price keys of the slots, ascending; bids store `price`, asks store `-price`, so the best is
    /// last. A slot is a live level or a tombstone (see `dead`).
    keys: Vec<i64>,
    /// Quantity of each slot, parallel to `keys`; zero exactly for tombstones.
    qtys: Vec<Qty>,
    /// Bit `b` set: the slot `b` places below the top (its *depth*) is a tombstone. Tombstones
    /// only ever sit at depths `1..WINDOW`: the top slot is always live, and a tombstone pushed
    /// down to depth `WINDOW` is removed for real.
    dead: u64,
    /// Live slots among depths `0..16`, counting the empty depths beyond the last slot as live.
    live16: u8,
    /// Nibble `r` (for `r < live16`) is the depth of the `r`-th live slot from the top: a rank ->
    /// depth table, so [`Ladder::nth`] is O(1) for the top 16 levels despite the tombstones.
    ranks16: u64,
}

/// How many top slots [`Ladder::find`] scans linearly before binary-searching the rest.
const LINEAR_SCAN: usize = 4;
/// Below the linear scan, keys within this many slots are binary-searched on their own first.
const NEAR: usize = 64;
/// Deletes within this many slots of the top leave a tombstone instead of shifting the slots
/// above (at most 64: the `dead` mask is a `u64`).
const WINDOW: usize = 32;
const WINDOW_MASK: u64 = u64::MAX >> (64 - WINDOW);

/// `BYTE_POP[b]`: set bits of `b`; `BYTE_NIBBLES[b]`: their positions packed into nibbles,
/// lowest first.
const BYTE_POP: [u8; 256] = byte_tables().0;
const BYTE_NIBBLES: [u32; 256] = byte_tables().1;

const fn byte_tables() -> ([u8; 256], [u32; 256]) {
    let mut pop = [0u8; 256];
    let mut nib = [0u32; 256];
    let mut b = 0;
    while b < 256 {
        let (mut n, mut pos) = (0, 0);
        while pos < 8 {
            if (b >> pos) & 1 == 1 {
                nib[b] |= (pos as u32) << (4 * n);
                n += 1;
            }
            pos += 1;
        }
        pop[b] = n as u8;
        b += 1;
    }
    (pop, nib)
}

impl Ladder {
    pub fn new(side: Side) -> Self {
        Self { side, keys: Vec::new(), qtys: Vec::new(), dead: 0, live16: 16, ranks16: IDENTITY_RANKS }
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

    /// Like `binary_search` over the slots (live or not), but scans the top few slots first,
    /// where most updates land, then the next `NEAR` slots, then the rest.
    #[inline]
    fn find(&self, key: i64) -> Result<usize, usize> {
        let keys = &self.keys[..];
        let n = keys.len();
        let stop = n.saturating_sub(LINEAR_SCAN);
        let mut i = n;
        while i > stop {
            let k = keys[i - 1];
            if k == key {
                return Ok(i - 1);
            }
            if k < key {
                return Err(i);
            }
            i -= 1;
        }
        if stop > NEAR && keys[stop - NEAR] <= key {
            let lo = stop - NEAR;
            return match keys[lo..stop].binary_search(&key) {
                Ok(i) => Ok(lo + i),
                Err(i) => Err(lo + i),
            };
        }
        keys[..stop].binary_search(&key)
    }

    /// Stores the tombstone mask and refreshes the rank table of the top 16 depths.
    #[inline]
    fn set_dead(&mut self, dead: u64) {
        debug_assert_eq!(dead & !(WINDOW_MASK & !1), 0, "tombstones only at depths 1..WINDOW");
        self.dead = dead;
        let live = !dead;
        let lo = (live & 0xff) as usize;
        let hi = ((live >> 8) & 0xff) as usize;
        let n_lo = BYTE_POP[lo];
        self.live16 = n_lo + BYTE_POP[hi];
        // depths 8..16 are 8 + position, i.e. the position nibble with its top bit set
        self.ranks16 = BYTE_NIBBLES[lo] as u64 | ((BYTE_NIBBLES[hi] | 0x8888_8888) as u64) << (4 * n_lo);
    }

    /// Removes the tombstone that an insert above it pushed down to depth `WINDOW`.
    #[cold]
    #[inline(never)]
    fn evict(&mut self) {
        let i = self.keys.len() - 1 - WINDOW;
        debug_assert!(self.qtys[i].is_zero());
        self.keys.remove(i);
        self.qtys.remove(i);
    }

    /// Removes every tombstone (for the rarely used whole-ladder operations).
    fn compact(&mut self) {
        if self.dead == 0 {
            return;
        }
        let n = self.keys.len();
        let start = n.saturating_sub(WINDOW);
        let mut w = start;
        for r in start..n {
            if !self.qtys[r].is_zero() {
                self.keys[w] = self.keys[r];
                self.qtys[w] = self.qtys[r];
                w += 1;
            }
        }
        self.keys.truncate(w);
        self.qtys.truncate(w);
        self.set_dead(0);
    }

    /// Sets the level at `price` to `qty`; zero removes it. Returns whether anything changed.
    #[inline]
    pub fn apply(&mut self, price: Price, qty: Qty) -> bool {
        let key = self.key(price);
        let n = self.keys.len();
        match self.find(key) {
            Ok(i) => {
                // a live level or a tombstone (qty zero) at this price
                if self.qtys[i] == qty {
                    return false;
                }
                let depth = n - 1 - i;
                if depth < WINDOW {
                    if depth == 0 && qty.is_zero() {
                        // the best level goes, with the tombstones right below it
                        let k = 1 + (self.dead >> 1).trailing_ones() as usize;
                        self.keys.truncate(n - k);
                        self.qtys.truncate(n - k);
                        self.set_dead(self.dead >> k);
                    } else {
                        self.qtys[i] = qty;
                        self.set_dead((self.dead & !(1 << depth)) | ((qty.is_zero() as u64) << depth));
                    }
                } else if qty.is_zero() {
                    self.keys.remove(i);
                    self.qtys.remove(i);
                } else {
                    self.qtys[i] = qty;
                }
                true
            }
            Err(i) => {
                if qty.is_zero() {
                    return false;
                }
                // the new level goes between slot i - 1 (at `depth`) and slot i (at `depth - 1`);
                // a tombstone in either place is simply reused
                let depth = n - i;
                if depth < WINDOW && (self.dead >> depth) & 1 != 0 {
                    self.keys[i - 1] = key;
                    self.qtys[i - 1] = qty;
                    self.set_dead(self.dead & !(1 << depth));
                    return true;
                }
                if (1..=WINDOW).contains(&depth) && (self.dead >> (depth - 1)) & 1 != 0 {
                    self.keys[i] = key;
                    self.qtys[i] = qty;
                    self.set_dead(self.dead & !(1 << (depth - 1)));
                    return true;
                }
                self.keys.insert(i, key);
                self.qtys.insert(i, qty);
                if depth < WINDOW {
                    // the slots below the new one are one deeper now
                    let d = self.dead;
                    let above = (1u64 << depth) - 1;
                    self.set_dead(((d & above) | ((d & !above) << 1)) & WINDOW_MASK);
                    if (d >> (WINDOW - 1)) & 1 != 0 {
                        self.evict();
                    }
                }
                true
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
        // the top slot is never a tombstone
        let i = self.keys.len().checked_sub(1)?;
        Some(Level::new(self.price_of(self.keys[i]), self.qtys[i]))
    }

    pub fn len(&self) -> usize {
        self.keys.len() - self.dead.count_ones() as usize
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn clear(&mut self) {
        self.keys.clear();
        self.qtys.clear();
        self.set_dead(0);
    }

    /// Levels from best to worst.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = Level> + DoubleEndedIterator + '_ {
        Iter { ladder: self, keys: &self.keys, qtys: &self.qtys, live: self.len() }
    }

    /// The level `depth` places from the top (0 = best).
    #[inline]
    pub fn nth(&self, depth: usize) -> Option<Level> {
        let slot_depth = if depth < self.live16 as usize {
            ((self.ranks16 >> (4 * depth)) & 15) as usize
        } else {
            self.nth_deep(depth)
        };
        let i = self.keys.len().checked_sub(slot_depth + 1)?;
        Some(Level::new(self.price_of(self.keys[i]), self.qtys[i]))
    }

    /// The slot depth of the `depth`-th live level when it is below the top 16 slots.
    fn nth_deep(&self, depth: usize) -> usize {
        let mut live = !self.dead & WINDOW_MASK & !0xffff;
        let mut k = depth - self.live16 as usize;
        while live != 0 {
            if k == 0 {
                return live.trailing_zeros() as usize;
            }
            live &= live - 1;
            k -= 1;
        }
        // below the window every slot is live
        depth + (self.dead & WINDOW_MASK).count_ones() as usize
    }

    /// Copies the best `n` levels into `out` (cleared first), best first.
    pub fn top_into(&self, n: usize, out: &mut Vec<Level>) {
        out.clear();
        out.extend(self.iter().take(n));
    }

    /// Keeps the best `n` levels and drops the rest.
    pub fn truncate(&mut self, n: usize) {
        self.compact();
        let drop = self.keys.len().saturating_sub(n);
        self.keys.drain(..drop);
        self.qtys.drain(..drop);
    }

    /// Removes every level strictly worse than `price` (further from the top). Used to drop levels
    /// beyond a snapshot's depth, which can no longer be trusted.
    pub fn remove_worse_than(&mut self, price: Price) {
        self.compact();
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

/// `ranks16` with no tombstones: rank r sits at depth r.
const IDENTITY_RANKS: u64 = 0xfedc_ba98_7654_3210;

/// [`Ladder::iter`]: the live slots, skipping tombstones from either end.
struct Iter<'a> {
    ladder: &'a Ladder,
    keys: &'a [i64],
    qtys: &'a [Qty],
    /// Live levels left between the two ends.
    live: usize,
}

impl Iterator for Iter<'_> {
    type Item = Level;

    #[inline]
    fn next(&mut self) -> Option<Level> {
        while self.live > 0 {
            let (&k, keys) = self.keys.split_last()?;
            let (&q, qtys) = self.qtys.split_last()?;
            self.keys = keys;
            self.qtys = qtys;
            if !q.is_zero() {
                self.live -= 1;
                return Some(Level::new(self.ladder.price_of(k), q));
            }
        }
        None
    }

    #[inline]
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.live, Some(self.live))
    }

    fn last(mut self) -> Option<Level> {
        self.next_back()
    }
}

impl DoubleEndedIterator for Iter<'_> {
    #[inline]
    fn next_back(&mut self) -> Option<Level> {
        while self.live > 0 {
            let (&k, keys) = self.keys.split_first()?;
            let (&q, qtys) = self.qtys.split_first()?;
            self.keys = keys;
            self.qtys = qtys;
            if !q.is_zero() {
                self.live -= 1;
                return Some(Level::new(self.ladder.price_of(k), q));
            }
        }
        None
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl core::fmt::Debug for Ladder {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Ladder").field("side", &self.side).field("levels", &self.iter().collect::<Vec<_>>()).finish()
    }
}

impl PartialEq for Ladder {
    fn eq(&self, o: &Self) -> bool {
        self.side == o.side && self.len() == o.len() && self.iter().eq(o.iter())
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

    /// Every read of `ladder` agrees with `model` (price -> qty), best first.
    fn check_ladder(ladder: &Ladder, model: &BTreeMap<i64, i64>, rng: &mut Rng, ctx: &str) {
        let want: Vec<(i64, i64)> = match ladder.side() {
            Side::Bid => model.iter().rev().map(|(&p, &q)| (p, q)).collect(),
            Side::Ask => model.iter().map(|(&p, &q)| (p, q)).collect(),
        };
        let lv = |l: Level| (l.price.raw(), l.qty.raw());
        assert_eq!(ladder.len(), want.len(), "{ctx}: len");
        assert_eq!(ladder.is_empty(), want.is_empty(), "{ctx}: is_empty");
        assert_eq!(ladder.best().map(lv), want.first().copied(), "{ctx}: best");
        for d in 0..want.len().min(80) + 3 {
            assert_eq!(ladder.nth(d).map(lv), want.get(d).copied(), "{ctx}: nth({d})");
        }
        let d = rng.below(want.len() as u64 + 5) as usize;
        assert_eq!(ladder.nth(d).map(lv), want.get(d).copied(), "{ctx}: nth({d})");
        assert_eq!(ladder.iter().map(lv).collect::<Vec<_>>(), want, "{ctx}: iter");
        let mut rev: Vec<_> = ladder.iter().rev().map(lv).collect();
        rev.reverse();
        assert_eq!(rev, want, "{ctx}: iter().rev()");
        assert_eq!(ladder.iter().last().map(lv), want.last().copied(), "{ctx}: iter().last()");
        // mixed ends, with exact lengths all the way
        let mut it = ladder.iter();
        let (mut front, mut back) = (Vec::new(), Vec::new());
        loop {
            assert_eq!(it.len(), want.len() - front.len() - back.len(), "{ctx}: ExactSizeIterator");
            let next = if rng.chance(1, 2) { it.next().map(|l| front.push(lv(l))) } else { it.next_back().map(|l| back.push(lv(l))) };
            if next.is_none() {
                break;
            }
        }
        back.reverse();
        front.extend(back);
        assert_eq!(front, want, "{ctx}: mixed next/next_back");
        for _ in 0..4 {
            let p = match want.len() {
                0 => 10_000,
                n => want[rng.below(n as u64) as usize].0 + rng.below(3) as i64 - 1,
            };
            assert_eq!(ladder.get(Price::from_raw(p)).raw(), model.get(&p).copied().unwrap_or(0), "{ctx}: get({p})");
        }
        let mut out = Vec::new();
        let n = rng.below(40) as usize;
        ladder.top_into(n, &mut out);
        assert_eq!(out.into_iter().map(lv).collect::<Vec<_>>(), want[..n.min(want.len())], "{ctx}: top_into");
        // equality is by content, whatever the tombstones
        let mut fresh = Ladder::new(ladder.side());
        fresh.replace(&want.iter().map(|&(p, q)| Level::new(Price::from_raw(p), Qty::from_raw(q))).collect::<Vec<_>>());
        assert_eq!(&fresh, ladder, "{ctx}: eq");
        if let Some(&(p, q)) = want.get(rng.below(want.len() as u64 + 1) as usize) {
            fresh.apply(Price::from_raw(p), Qty::from_raw(q + 1));
            assert_ne!(&fresh, ladder, "{ctx}: ne");
        }
    }

    /// Long random runs against a BTreeMap model, reading everything back after every few
    /// updates: near-top churn (tombstones, reuse, the best level leaving), new levels above the
    /// top (pushing tombstones out of the window), far-tail updates, small and large ladders, and
    /// the whole-ladder operations.
    #[test]
    fn every_read_matches_btreemap_model() {
        for seed in 0..40u64 {
            let mut rng = Rng::new(1000 + seed);
            let side = if seed % 2 == 0 { Side::Bid } else { Side::Ask };
            let mut ladder = Ladder::new(side);
            let mut model = BTreeMap::new();
            // a range of book sizes: 3 .. 1500 price points
            let span = [3u64, 10, 40, 200, 1500][(seed % 5) as usize];
            let mut mid: i64 = 1_000_000;
            for step in 0..4_000 {
                let r = rng.below(1000);
                if r < 3 {
                    // the market moves: the top price points shift
                    mid += rng.below(21) as i64 - 10;
                }
                if r == 999 {
                    let n = rng.below(span + 5) as usize;
                    ladder.truncate(n);
                    let keep: Vec<_> = match side {
                        Side::Bid => model.iter().rev().take(n).map(|(&p, &q)| (p, q)).collect(),
                        Side::Ask => model.iter().take(n).map(|(&p, &q)| (p, q)).collect(),
                    };
                    model = keep.into_iter().collect();
                } else if r == 998 {
                    let d = rng.below(span + 5) as i64;
                    let p = if side == Side::Bid { mid - d } else { mid + d };
                    ladder.remove_worse_than(Price::from_raw(p));
                    model.retain(|&k, _| if side == Side::Bid { k >= p } else { k <= p });
                } else if r == 997 && rng.chance(1, 4) {
                    ladder.clear();
                    model.clear();
                } else {
                    let d = if rng.chance(1, 10) { rng.below(span) } else { rng.top_skewed(span) } as i64;
                    // sometimes above the top (ahead of mid) to insert new best levels
                    let d = if rng.chance(1, 20) { -(rng.below(8) as i64) } else { d };
                    let p = if side == Side::Bid { mid - d } else { mid + d };
                    let exists = model.contains_key(&p);
                    let q = if exists && rng.chance(2, 5) || rng.chance(1, 20) { 0 } else { 1 + rng.below(5) as i64 };
                    let before = model.get(&p).copied();
                    if q == 0 {
                        model.remove(&p);
                    } else {
                        model.insert(p, q);
                    }
                    let changed = ladder.apply(Price::from_raw(p), Qty::from_raw(q));
                    assert_eq!(changed, before != model.get(&p).copied(), "seed {seed} step {step}: apply({p}, {q})");
                }
                if step % 7 == 0 || r >= 997 {
                    check_ladder(&ladder, &model, &mut rng, &format!("seed {seed} step {step}"));
                }
            }
            check_ladder(&ladder, &model, &mut rng, &format!("seed {seed} end"));
        }
    }

    /// Deletes just below the top leave tombstones; inserting better levels pushes them down and
    /// out of the tombstone window.
    #[test]
    fn tombstones_pushed_out_of_the_window() {
        let mut rng = Rng::new(7);
        let mut l = Ladder::new(Side::Ask);
        let mut model = BTreeMap::new();
        let set = |l: &mut Ladder, model: &mut BTreeMap<i64, i64>, p: i64, q: i64| {
            l.apply(Price::from_raw(p), Qty::from_raw(q));
            if q == 0 {
                model.remove(&p);
            } else {
                model.insert(p, q);
            }
        };
        for p in 1000..1100 {
            set(&mut l, &mut model, p, 1);
        }
        for round in 0..5 {
            // every other level just below the top becomes a tombstone
            for p in (1001..1060).step_by(2) {
                set(&mut l, &mut model, p + round, 0);
            }
            check_ladder(&l, &model, &mut rng, &format!("round {round} deleted"));
            // new best levels, one at a time
            for k in 1..=40 {
                set(&mut l, &mut model, 1000 - 40 * round - k, 5);
                check_ladder(&l, &model, &mut rng, &format!("round {round} insert {k}"));
            }
            // delete the best levels one by one, uncovering tombstones
            for _ in 0..10 {
                let best = *model.keys().next().unwrap();
                set(&mut l, &mut model, best, 0);
                check_ladder(&l, &model, &mut rng, &format!("round {round} pop"));
            }
        }
        // delete everything from the top down, then from the bottom up
        let mut added = 0;
        while let Some(&best) = model.keys().next() {
            set(&mut l, &mut model, best, 0);
            if model.len() % 3 == 0 && added < 100 {
                added += 1;
                set(&mut l, &mut model, best + 1000, 2);
            }
            check_ladder(&l, &model, &mut rng, "drain");
            if model.len() > 60 {
                let worst = *model.keys().next_back().unwrap();
                set(&mut l, &mut model, worst, 0);
            }
        }
        assert!(l.is_empty());
        assert_eq!(l, Ladder::new(Side::Ask));
    }

    #[test]
    fn level_serde_is_an_array_of_strings() {
        let l = Level::new(p("1.5"), q("2"));
        assert_eq!(serde_json::to_string(&l).unwrap(), r#"["1.5","2"]"#);
        assert_eq!(serde_json::from_str::<Level>(r#"["1.50000000","2.0"]"#).unwrap(), l);
    }
}
