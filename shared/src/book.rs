//! The L2 order book: one price ladder per side.
//!
//! ## Data structure
//! Each [`Ladder`] keys its levels so that a larger key is better (bids by price, asks by negated
//! price), so one implementation serves both sides. It has two parts:
//!
//! - **The window**, a price-indexed array: slot `i` is the key `base + i * tick`, holding the
//!   level's quantity (zero: no level), with one occupancy bit per slot. The grid step `tick` is
//!   learnt from the data (the greatest common divisor of the distances between levels; a price
//!   off the grid refines it), so no tick size has to be configured. An update at a price in the
//!   window is one exact division (a multiply by the tick's inverse modulo 2^64, no `div`) and one
//!   store: no search and no shifting, however deep the level. The window holds the best level
//!   and every level from there down to at most `SPAN_LIMIT` (24,576) slots, with headroom above
//!   the best, in at most `MAX_SLOTS` (32,768) slots.
//! - **`far`**, a sorted `Vec` of the levels below the window (deep levels of books wider than
//!   the window, or levels added below it since it was laid out), best last.
//!
//! A price above the window, off its grid, or a window that empties while `far` still holds
//! levels, rebuilds the window around the current levels (O(levels + slots), amortised by the
//! headroom); so does a run of updates landing in `far`, after enough of them to pay for it. The
//! slots of the best 16 levels are tracked in a small sorted array updated on every insert or
//! delete among them, so `best` and `nth(d < 16)` are O(1); deeper `nth` walks the occupancy bits.
//!
//! Why: on the recorded Binance ETHUSDT `depth@100ms` stream a third of all updates insert or
//! remove a level below the top 32, where the previous layout (a sorted `Vec`, best last, with
//! tombstones near the top) shifted hundreds of slots per update; `memmove` was 42% of applying
//! it. Measured (one core of a 2.45 GHz AMD EPYC, `cargo bench -p shared --bench book` and
//! `cargo bench -p server --bench depth_parse`), previous layout -> this one: the top-skewed `book`
//! workload 40.9 -> 48-52 M updates/s for `apply` and 18.5 -> 23.8 M/s with a top-10 read after
//! every update; applying the ETHUSDT stream through `BookSync` 0.48 -> 1.46 M messages/s.
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

    /// How `a` orders against `b` among this side's levels listed best first (bids by falling
    /// price, asks by rising price).
    pub fn best_first(self, a: Price, b: Price) -> std::cmp::Ordering {
        match self {
            Side::Bid => b.cmp(&a),
            Side::Ask => a.cmp(&b),
        }
    }
}

/// Whether `levels` are `side`'s levels best first, with distinct prices and no zero quantity:
/// how exchanges send a snapshot.
pub fn is_best_first(side: Side, levels: &[Level]) -> bool {
    levels.iter().all(|l| !l.qty.is_zero())
        && levels.is_sorted_by(|a, b| side.best_first(a.price, b.price).is_lt())
}

/// Puts `levels` best first with distinct prices and no zero quantity; of levels at one price
/// the last wins. Levels already in that order are left as they are, without the sort's scratch
/// buffer.
pub fn sort_best_first(side: Side, levels: &mut Vec<Level>) {
    levels.retain(|l| !l.qty.is_zero());
    if is_best_first(side, levels) {
        return;
    }
    // stable: equal prices keep their order, and the dedup keeps the last of each run
    levels.sort_by(|a, b| side.best_first(a.price, b.price));
    levels.dedup_by(|later, kept| {
        let same = later.price == kept.price;
        if same {
            std::mem::swap(later, kept);
        }
        same
    });
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

/// One side of the book (see the module docs for the layout).
pub struct Ladder {
    side: Side,
    /// Key of window slot 0. Keys order levels so that larger is better: bids use the price,
    /// asks the negated price.
    base: i64,
    /// Key distance between neighbouring window slots, in raw units; 0 while unknown (the window
    /// then holds a single level, at slot 0).
    tick: u64,
    /// Exact division by `tick = odd << shift`: `inv` is `odd`'s inverse modulo 2^64 and `lim`
    /// is `u64::MAX / odd` (see [`Ladder::locate`]).
    shift: u32,
    inv: u64,
    lim: u64,
    /// Quantity of each window slot, zero for an empty slot; slot `i` is key `base + i * tick`.
    qtys: Vec<Qty>,
    /// Occupancy of the window slots, one bit per slot.
    bits: Vec<u64>,
    /// Occupied window slots.
    dense: usize,
    /// The window slots of the best `ntop = min(TOP, dense)` levels, best first; unused entries 0.
    top: [u32; TOP],
    ntop: usize,
    /// Levels below the window (every key here is below `base`), ascending: best last.
    far_keys: Vec<i64>,
    far_qtys: Vec<Qty>,
    /// Updates that went to `far` since the last rebuild (a rebuild pulls them into the window).
    far_ops: usize,
}

/// Most window slots a ladder uses (256 KiB of quantities).
const MAX_SLOTS: usize = 1 << 15;
/// A rebuild keeps levels in the window while they lie within this many slots of the best,
/// leaving the rest of `MAX_SLOTS` as headroom.
const SPAN_LIMIT: u64 = (MAX_SLOTS as u64) * 3 / 4;
/// How many of the best levels the ladder tracks by slot, for O(1) `best` and `nth`.
const TOP: usize = 16;

/// Where a key falls relative to the window.
enum Loc {
    /// In the window, at this slot.
    Slot(usize),
    /// Below the window: the key lives in `far`.
    Below,
    /// Above the window or off its grid: not a key the ladder holds.
    Outside,
}

impl Clone for Ladder {
    fn clone(&self) -> Self {
        Ladder {
            qtys: self.qtys.clone(),
            bits: self.bits.clone(),
            top: self.top,
            far_keys: self.far_keys.clone(),
            far_qtys: self.far_qtys.clone(),
            ..*self
        }
    }

    /// Copies into the buffers already held (a published view is refreshed this way at every
    /// publish), growing them to the source's capacity when they must grow, so that a copy keeps
    /// the source's size classes (see [`Ladder::reserve_window`]).
    fn clone_from(&mut self, src: &Self) {
        fn copy<T: Copy>(mut dst: Vec<T>, src: &Vec<T>) -> Vec<T> {
            dst.clear();
            dst.reserve_exact(src.capacity());
            dst.extend_from_slice(src);
            dst
        }
        *self = Ladder {
            qtys: copy(std::mem::take(&mut self.qtys), &src.qtys),
            bits: copy(std::mem::take(&mut self.bits), &src.bits),
            far_keys: copy(std::mem::take(&mut self.far_keys), &src.far_keys),
            far_qtys: copy(std::mem::take(&mut self.far_qtys), &src.far_qtys),
            ..*src
        };
    }
}

impl Ladder {
    pub fn new(side: Side) -> Self {
        Self {
            side,
            base: 0,
            tick: 0,
            shift: 0,
            inv: 1,
            lim: 0,
            qtys: Vec::new(),
            bits: Vec::new(),
            dense: 0,
            top: [0; TOP],
            ntop: 0,
            far_keys: Vec::new(),
            far_qtys: Vec::new(),
            far_ops: 0,
        }
    }

    pub fn side(&self) -> Side {
        self.side
    }

    #[inline]
    fn key(&self, price: Price) -> i64 {
        side_key(self.side, price)
    }

    #[inline]
    fn price_of(&self, key: i64) -> Price {
        match self.side {
            Side::Bid => Price::from_raw(key),
            Side::Ask => Price::from_raw(key.wrapping_neg()),
        }
    }

    #[inline]
    fn slot_key(&self, slot: usize) -> i64 {
        self.base.wrapping_add((slot as u64).wrapping_mul(self.tick) as i64)
    }

    #[inline]
    fn slot_level(&self, slot: usize) -> Level {
        Level::new(self.price_of(self.slot_key(slot)), self.qtys[slot])
    }

    /// Where `key` belongs. The slot is the exact quotient `(key - base) / tick`, found without a
    /// division: `d` is a multiple of `odd << shift` exactly when its low `shift` bits are zero and
    /// `(d >> shift) * inv` (mod 2^64) is at most `u64::MAX / odd`, and that product is then the
    /// quotient (Granlund and Montgomery's exact-division test).
    #[inline]
    fn locate(&self, key: i64) -> Loc {
        if key < self.base {
            return Loc::Below;
        }
        let d = (key as u64).wrapping_sub(self.base as u64);
        if d & ((1u64 << self.shift) - 1) != 0 {
            return Loc::Outside;
        }
        let q = (d >> self.shift).wrapping_mul(self.inv);
        if q > self.lim || q >= self.qtys.len() as u64 {
            return Loc::Outside;
        }
        Loc::Slot(q as usize)
    }

    fn set_tick(&mut self, tick: u64) {
        self.tick = tick;
        if tick == 0 {
            // only `d == 0` passes: the window is slot 0 alone
            (self.shift, self.inv, self.lim) = (0, 1, 0);
        } else {
            let shift = tick.trailing_zeros();
            let odd = tick >> shift;
            // Newton's iteration doubles the correct low bits: 3 (odd * odd = 1 mod 8) -> 96
            let mut inv = odd;
            for _ in 0..5 {
                inv = inv.wrapping_mul(2u64.wrapping_sub(odd.wrapping_mul(inv)));
            }
            debug_assert_eq!(odd.wrapping_mul(inv), 1);
            (self.shift, self.inv, self.lim) = (shift, inv, u64::MAX / odd);
        }
    }

    /// Sets the level at `price` to `qty`; zero removes it. Returns whether anything changed.
    #[inline]
    pub fn apply(&mut self, price: Price, qty: Qty) -> bool {
        let key = self.key(price);
        let Loc::Slot(i) = self.locate(key) else { return self.apply_off_window(key, qty) };
        let Some(slot) = self.qtys.get_mut(i) else { return false };
        let old = *slot;
        if old == qty {
            return false;
        }
        *slot = qty;
        // a changed quantity (the common case) is done; a level that appears or goes is not
        if old.is_zero() {
            self.slot_filled(i);
        } else if qty.is_zero() {
            self.slot_emptied(i);
        }
        true
    }

    #[inline(never)]
    fn slot_filled(&mut self, i: usize) {
        self.bits[i / 64] |= 1 << (i % 64);
        self.dense += 1;
        self.top_insert(i);
    }

    #[inline(never)]
    fn slot_emptied(&mut self, i: usize) {
        self.bits[i / 64] &= !(1 << (i % 64));
        self.dense -= 1;
        self.top_remove(i);
    }

    /// A key outside the window: in `far`, or one that makes the window move.
    #[inline(never)]
    fn apply_off_window(&mut self, key: i64, qty: Qty) -> bool {
        match self.locate(key) {
            Loc::Below if self.dense != 0 => self.apply_far(key, qty),
            _ => self.apply_outside(key, qty),
        }
    }

    /// A level at `key`, below the window.
    fn apply_far(&mut self, key: i64, qty: Qty) -> bool {
        let changed = match self.far_keys.binary_search(&key) {
            Ok(j) if self.far_qtys[j] == qty => false,
            Ok(j) if qty.is_zero() => {
                self.far_keys.remove(j);
                self.far_qtys.remove(j);
                true
            }
            Ok(j) => {
                self.far_qtys[j] = qty;
                true
            }
            Err(_) if qty.is_zero() => false,
            Err(j) => {
                self.far_keys.insert(j, key);
                self.far_qtys.insert(j, qty);
                true
            }
        };
        self.far_ops += 1;
        // A rebuild costs O(levels + slots); after this many slow updates it has paid for itself.
        if self.far_ops > 2 * self.len() + self.qtys.len() / 16 + 64 {
            self.rebuild_with(None);
        }
        changed
    }

    /// A key above the window, off its grid, or any key while the window is empty.
    #[cold]
    #[inline(never)]
    fn apply_outside(&mut self, key: i64, qty: Qty) -> bool {
        // no level can be there: the window holds every on-grid key from `base` up, and `far`
        // (empty when the window is) every key below
        if qty.is_zero() {
            return false;
        }
        self.rebuild_with(Some((key, qty)));
        true
    }

    /// How many tracked entries are better (higher slots) than slot `i`: they are a prefix, so
    /// the count is the first lane that is not, found from one mask of 16 compares (which
    /// vectorise) instead of a population count.
    #[inline]
    fn better_than(&self, i: usize) -> usize {
        let mask = self
            .top
            .iter()
            .enumerate()
            .fold(0u32, |m, (j, &t)| m | ((t as i32 > i as i32) as u32) << j);
        (!mask).trailing_zeros() as usize
    }

    /// Records a new window level at slot `i` among the tracked best ones.
    #[inline]
    fn top_insert(&mut self, i: usize) {
        let n = self.ntop;
        if n == TOP && i < self.top[TOP - 1] as usize {
            return;
        }
        // entries are descending and unused ones are 0, so this counts the better levels (slots
        // are below 2^15: signed 32-bit compares, which vectorise)
        let pos = self.better_than(i);
        // shift the worse entries down by one over the whole fixed-size array (selects the
        // compiler vectorises; a `copy_within` of a variable length is a call to `memmove`);
        // unused entries are 0, so what moves into them is 0
        let old = self.top;
        let mut shifted = [0; TOP];
        shifted[1..].copy_from_slice(&old[..TOP - 1]);
        for j in 0..TOP {
            self.top[j] = if j < pos { old[j] } else { shifted[j] };
        }
        self.top[pos] = i as u32;
        self.ntop = (n + 1).min(TOP);
    }

    /// Forgets the removed window level at slot `i` (its bit already cleared).
    #[inline]
    fn top_remove(&mut self, i: usize) {
        let n = self.ntop;
        if n == TOP && i < self.top[TOP - 1] as usize {
            return;
        }
        let pos = self.better_than(i);
        debug_assert_eq!(self.top[pos] as usize, i);
        // shift the worse entries up by one (see `top_insert`); the last becomes 0
        let old = self.top;
        let mut shifted = [0; TOP];
        shifted[..TOP - 1].copy_from_slice(&old[1..]);
        for j in 0..TOP {
            self.top[j] = if j < pos { old[j] } else { shifted[j] };
        }
        if n == TOP && self.dense >= TOP {
            // a level below the tracked ones moves up into them
            let next =
                self.prev_set(self.top[TOP - 2] as usize).expect("dense counts a level below");
            self.top[TOP - 1] = next as u32;
        } else {
            self.top[n - 1] = 0;
            self.ntop = n - 1;
            if n == 1 && !self.far_keys.is_empty() {
                // the window emptied: it moves down to the best levels left
                self.rebuild_with(None);
            }
        }
    }

    /// The highest occupied window slot below `from`.
    #[inline]
    fn prev_set(&self, from: usize) -> Option<usize> {
        if from == 0 {
            return None;
        }
        let mut w = (from - 1) / 64;
        let mut word = self.bits[w] & (u64::MAX >> (63 - (from - 1) % 64));
        loop {
            if word != 0 {
                return Some(w * 64 + 63 - word.leading_zeros() as usize);
            }
            if w == 0 {
                return None;
            }
            w -= 1;
            word = self.bits[w];
        }
    }

    /// The lowest occupied window slot at or above `from`.
    #[inline]
    fn next_set(&self, from: usize) -> Option<usize> {
        let mut w = from / 64;
        let mut word = *self.bits.get(w)? & (u64::MAX << (from % 64));
        loop {
            if word != 0 {
                return Some(w * 64 + word.trailing_zeros() as usize);
            }
            w += 1;
            word = *self.bits.get(w)?;
        }
    }

    /// The `k`-th occupied window slot below `from` (k = 0: the first).
    fn select_below(&self, from: usize, mut k: usize) -> Option<usize> {
        if from == 0 {
            return None;
        }
        let mut w = (from - 1) / 64;
        let mut word = self.bits[w] & (u64::MAX >> (63 - (from - 1) % 64));
        loop {
            let c = word.count_ones() as usize;
            if k < c {
                for _ in 0..k {
                    word &= !(1u64 << (63 - word.leading_zeros()));
                }
                return Some(w * 64 + 63 - word.leading_zeros() as usize);
            }
            k -= c;
            if w == 0 {
                return None;
            }
            w -= 1;
            word = self.bits[w];
        }
    }

    /// Every level, ascending by key (worst first).
    fn levels_ascending(&self) -> Vec<(i64, Qty)> {
        let mut out = Vec::with_capacity(self.len() + 1);
        out.extend(self.far_keys.iter().copied().zip(self.far_qtys.iter().copied()));
        for (w, &word) in self.bits.iter().enumerate() {
            let mut word = word;
            while word != 0 {
                let i = w * 64 + word.trailing_zeros() as usize;
                out.push((self.slot_key(i), self.qtys[i]));
                word &= word - 1;
            }
        }
        out
    }

    /// Rebuilds the window around the current levels plus `extra` (a new level; its key holds no
    /// level yet).
    #[cold]
    #[inline(never)]
    fn rebuild_with(&mut self, extra: Option<(i64, Qty)>) {
        let mut levels = self.levels_ascending();
        if let Some((key, qty)) = extra {
            match levels.binary_search_by_key(&key, |l| l.0) {
                Ok(j) => levels[j].1 = qty,
                Err(j) => levels.insert(j, (key, qty)),
            }
        }
        self.rebuild(&levels);
    }

    /// Lays the window out afresh over `levels` (ascending, distinct keys, no zero quantity).
    ///
    /// The window's grid step is the greatest common divisor of the key distances from the best
    /// level (and the previous step, when the best is on the previous grid); it takes the best
    /// levels while they lie within `SPAN_LIMIT` slots, with headroom above the best for prices
    /// that move up, and below the lowest when every level fits. The rest go to `far`.
    fn rebuild(&mut self, levels: &[(i64, Qty)]) {
        self.rebuild_from(levels.len(), |j| levels[j]);
    }

    /// [`Ladder::rebuild`] over `n` levels read through `at` (`at(0)` the worst), so that a
    /// caller whose levels are already in order lends them without copying them first.
    fn rebuild_from(&mut self, n: usize, at: impl Fn(usize) -> (i64, Qty)) {
        self.far_ops = 0;
        self.far_keys.clear();
        self.far_qtys.clear();
        self.clear_window();
        let Some(last) = n.checked_sub(1) else { return };
        let best = at(last).0;

        let on_old_grid =
            self.tick != 0 && (best as i128 - self.base as i128).rem_euclid(self.tick as i128) == 0;
        let mut g: u64 = if on_old_grid { self.tick } else { 0 };
        let mut lo = last;
        for j in (0..last).rev() {
            let diff = (best as u64).wrapping_sub(at(j).0 as u64);
            let g2 = gcd(g, diff);
            if diff / g2 >= SPAN_LIMIT {
                break;
            }
            g = g2;
            lo = j;
        }
        let low = at(lo).0;
        let needed =
            (best as u64).wrapping_sub(low as u64).checked_div(g).map_or(1, |n| n as usize + 1);
        let room = MAX_SLOTS - needed;
        let spare = (needed / 4).max(64);
        let mut below = if lo == 0 && g != 0 { spare.min(room / 2) } else { 0 };
        // the window's keys must stay within i64
        let lowest = low as i128 - below as i128 * g as i128;
        if lowest < i64::MIN as i128 {
            below = 0;
        }
        let base = low as i128 - below as i128 * g as i128;
        let mut len =
            (needed + below + spare.min(room - below)).next_multiple_of(64).min(MAX_SLOTS);
        let highest_allowed = (i64::MAX as i128 - base) / (g.max(1) as i128) + 1;
        len = len.min(highest_allowed.min(MAX_SLOTS as i128) as usize).max(needed);

        self.set_tick(g);
        self.base = base as i64;
        self.reserve_window(len);
        self.qtys.resize(len, Qty::ZERO);
        self.bits.resize(len.div_ceil(64), 0);
        for (key, qty) in (lo..n).map(&at) {
            let i = if g == 0 { 0 } else { ((key as i128 - base) / g as i128) as usize };
            self.qtys[i] = qty;
            self.bits[i / 64] |= 1 << (i % 64);
        }
        self.dense = n - lo;
        self.far_keys.extend((0..lo).map(|j| at(j).0));
        self.far_qtys.extend((0..lo).map(|j| at(j).1));
        let mut from = self.qtys.len();
        while self.ntop < TOP {
            let Some(i) = self.prev_set(from) else { break };
            self.top[self.ntop] = i as u32;
            self.ntop += 1;
            from = i;
        }
    }

    /// Makes room for a window of `len` slots. The allocation grows in power-of-two steps (up to
    /// `MAX_SLOTS`) and is written in full when it does, so a ladder whose span wanders with
    /// the market settles in one size class at once, instead of writing (and so making
    /// resident) a few more pages each time its window reaches a new widest span.
    fn reserve_window(&mut self, len: usize) {
        if len <= self.qtys.capacity() {
            return;
        }
        let class = len.next_power_of_two().min(MAX_SLOTS).max(len);
        let (n, words) = (self.qtys.len(), self.bits.len());
        self.qtys.reserve_exact(class - n);
        self.qtys.resize(class, Qty::ZERO);
        self.qtys.truncate(n);
        let class_words = class.div_ceil(64);
        self.bits.reserve_exact(class_words.saturating_sub(words));
        self.bits.resize(class_words.max(words), 0);
        self.bits.truncate(words);
    }

    /// Empties the window, keeping its grid and allocation.
    fn clear_window(&mut self) {
        for (w, word) in self.bits.iter_mut().enumerate() {
            while *word != 0 {
                self.qtys[w * 64 + word.trailing_zeros() as usize] = Qty::ZERO;
                *word &= *word - 1;
            }
        }
        self.dense = 0;
        self.top = [0; TOP];
        self.ntop = 0;
    }

    /// Quantity resting at `price` (zero if no level).
    pub fn get(&self, price: Price) -> Qty {
        let key = self.key(price);
        match self.locate(key) {
            Loc::Slot(i) => self.qtys[i],
            Loc::Below => match self.far_keys.binary_search(&key) {
                Ok(j) => self.far_qtys[j],
                Err(_) => Qty::ZERO,
            },
            Loc::Outside => Qty::ZERO,
        }
    }

    #[inline]
    pub fn best(&self) -> Option<Level> {
        // the window holds the best level whenever the ladder has any
        (self.ntop > 0).then(|| self.slot_level(self.top[0] as usize))
    }

    pub fn len(&self) -> usize {
        self.dense + self.far_keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn clear(&mut self) {
        self.clear_window();
        self.far_keys.clear();
        self.far_qtys.clear();
        self.far_ops = 0;
    }

    /// Levels from best to worst.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = Level> + DoubleEndedIterator + '_ {
        Iter {
            ladder: self,
            hi: self.qtys.len(),
            lo: 0,
            far_hi: self.far_keys.len(),
            far_lo: 0,
            live: self.len(),
        }
    }

    /// The level `depth` places from the top (0 = best).
    #[inline]
    pub fn nth(&self, depth: usize) -> Option<Level> {
        if depth < self.ntop {
            return Some(self.slot_level(self.top[depth] as usize));
        }
        self.nth_deep(depth)
    }

    /// [`Ladder::nth`] below the tracked best levels.
    #[inline(never)]
    fn nth_deep(&self, depth: usize) -> Option<Level> {
        if depth < self.dense {
            let slot = self.select_below(self.top[TOP - 1] as usize, depth - TOP)?;
            return Some(self.slot_level(slot));
        }
        let j = self.far_keys.len().checked_sub(depth - self.dense + 1)?;
        Some(Level::new(self.price_of(self.far_keys[j]), self.far_qtys[j]))
    }

    /// Copies the best `n` levels into `out` (cleared first), best first.
    pub fn top_into(&self, n: usize, out: &mut Vec<Level>) {
        out.clear();
        out.extend(self.iter().take(n));
    }

    /// Keeps the best `n` levels and drops the rest.
    pub fn truncate(&mut self, n: usize) {
        match n.checked_sub(1).map(|last| self.nth(last)) {
            None => self.clear(),
            Some(Some(worst_kept)) => self.remove_worse_than(worst_kept.price),
            Some(None) => {}
        }
    }

    /// Removes every level strictly worse than `price` (further from the top). Used to drop levels
    /// beyond a snapshot's depth, which can no longer be trusted.
    ///
    /// The levels removed are the worst, so this only empties slots and shortens `far`: the
    /// window keeps its layout and nothing is allocated.
    pub fn remove_worse_than(&mut self, price: Price) {
        let key = self.key(price);
        // `far` holds the worst levels, ascending
        let cut = self.far_keys.partition_point(|&k| k < key);
        self.far_keys.drain(..cut);
        self.far_qtys.drain(..cut);
        if self.dense == 0 || key <= self.base {
            return;
        }
        // every key below `base` is gone with `far`; in the window, slots below `end` go
        let above = (key as i128 - self.base as i128) as u128;
        let end = match self.tick {
            0 => 1,
            t => above.div_ceil(t as u128).min(self.qtys.len() as u128) as usize,
        };
        for w in 0..end.div_ceil(64) {
            let mask = if (w + 1) * 64 <= end { u64::MAX } else { (1u64 << (end % 64)) - 1 };
            let mut gone = self.bits[w] & mask;
            self.bits[w] &= !mask;
            self.dense -= gone.count_ones() as usize;
            while gone != 0 {
                self.qtys[w * 64 + gone.trailing_zeros() as usize] = Qty::ZERO;
                gone &= gone - 1;
            }
        }
        // the tracked best levels lose their worst entries, if any were removed
        let kept = self.top[..self.ntop].iter().take_while(|&&t| t as usize >= end).count();
        self.top[kept..].fill(0);
        self.ntop = kept;
        debug_assert_eq!(self.ntop, self.dense.min(TOP));
    }

    /// Replaces the whole side with `levels` (any order; zero quantities ignored; later
    /// duplicates win).
    ///
    /// Levels already best first (as exchanges send snapshots; [`is_best_first`]) are read in
    /// place, so a resync allocates nothing new for them; others are sorted in a copy first.
    pub fn replace(&mut self, levels: &[Level]) {
        if is_best_first(self.side, levels) {
            return self.rebuild_best_first(levels);
        }
        let mut sorted = levels.to_vec();
        sort_best_first(self.side, &mut sorted);
        self.rebuild_best_first(&sorted);
    }

    /// [`Ladder::rebuild`] over levels best first (distinct prices, no zero quantity).
    fn rebuild_best_first(&mut self, levels: &[Level]) {
        let (side, n) = (self.side, levels.len());
        self.rebuild_from(n, |j| {
            let l = levels[n - 1 - j];
            (side_key(side, l.price), l.qty)
        });
    }
}

/// A price's key on `side`: larger is better (bids use the price, asks the negated price).
#[inline]
fn side_key(side: Side, price: Price) -> i64 {
    match side {
        Side::Bid => price.raw(),
        Side::Ask => price.raw().wrapping_neg(),
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// [`Ladder::iter`]: the window's slots from the top down, then `far` from its best end; from the
/// back, `far` from its worst end, then the window from the bottom up.
struct Iter<'a> {
    ladder: &'a Ladder,
    /// Window slots `lo..hi` and `far` entries `far_lo..far_hi` are not yet taken.
    hi: usize,
    lo: usize,
    far_hi: usize,
    far_lo: usize,
    /// Levels left between the two ends.
    live: usize,
}

impl Iterator for Iter<'_> {
    type Item = Level;

    #[inline]
    fn next(&mut self) -> Option<Level> {
        if self.live == 0 {
            return None;
        }
        self.live -= 1;
        let l = self.ladder;
        if let Some(i) = l.prev_set(self.hi).filter(|&i| i >= self.lo) {
            self.hi = i;
            return Some(l.slot_level(i));
        }
        self.far_hi -= 1;
        Some(Level::new(l.price_of(l.far_keys[self.far_hi]), l.far_qtys[self.far_hi]))
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
        if self.live == 0 {
            return None;
        }
        self.live -= 1;
        let l = self.ladder;
        if self.far_lo < self.far_hi {
            let j = self.far_lo;
            self.far_lo += 1;
            return Some(Level::new(l.price_of(l.far_keys[j]), l.far_qtys[j]));
        }
        let i = l.next_set(self.lo).filter(|&i| i < self.hi).expect("live counts a window level");
        self.lo = i + 1;
        Some(l.slot_level(i))
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl core::fmt::Debug for Ladder {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Ladder")
            .field("side", &self.side)
            .field("levels", &self.iter().collect::<Vec<_>>())
            .finish()
    }
}

impl PartialEq for Ladder {
    fn eq(&self, o: &Self) -> bool {
        self.side == o.side && self.len() == o.len() && self.iter().eq(o.iter())
    }
}
impl Eq for Ladder {}

/// An L2 order book: bids and asks.
#[derive(Debug, PartialEq, Eq)]
pub struct OrderBook {
    pub bids: Ladder,
    pub asks: Ladder,
}

impl Clone for OrderBook {
    fn clone(&self) -> Self {
        Self { bids: self.bids.clone(), asks: self.asks.clone() }
    }

    fn clone_from(&mut self, src: &Self) {
        self.bids.clone_from(&src.bids);
        self.asks.clone_from(&src.asks);
    }
}

impl Default for OrderBook {
    fn default() -> Self {
        Self::new()
    }
}

/// How many levels per side the checksum of millrace's depth deltas (`cs`) covers.
pub const CHECKSUM_LEVELS: usize = 10;

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
        assert_eq!(
            l.iter().map(|l| l.price).collect::<Vec<_>>(),
            [10, 9, 8].map(Price::from_units)
        );
        l.remove_worse_than(Price::from_units(9));
        assert_eq!(l.len(), 2);
        let mut a = Ladder::new(Side::Ask);
        for i in 1..=10 {
            a.apply(Price::from_units(i), q("1"));
        }
        a.remove_worse_than(Price::from_units(4));
        assert_eq!(
            a.iter().map(|l| l.price).collect::<Vec<_>>(),
            [1, 2, 3, 4].map(Price::from_units)
        );
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
            let next = if rng.chance(1, 2) {
                it.next().map(|l| front.push(lv(l)))
            } else {
                it.next_back().map(|l| back.push(lv(l)))
            };
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
            assert_eq!(
                ladder.get(Price::from_raw(p)).raw(),
                model.get(&p).copied().unwrap_or(0),
                "{ctx}: get({p})"
            );
        }
        let mut out = Vec::new();
        let n = rng.below(40) as usize;
        ladder.top_into(n, &mut out);
        assert_eq!(
            out.into_iter().map(lv).collect::<Vec<_>>(),
            want[..n.min(want.len())],
            "{ctx}: top_into"
        );
        // equality is by content, whatever the tombstones
        let mut fresh = Ladder::new(ladder.side());
        fresh.replace(
            &want
                .iter()
                .map(|&(p, q)| Level::new(Price::from_raw(p), Qty::from_raw(q)))
                .collect::<Vec<_>>(),
        );
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
                    let d = if rng.chance(1, 10) { rng.below(span) } else { rng.top_skewed(span) }
                        as i64;
                    // sometimes above the top (ahead of mid) to insert new best levels
                    let d = if rng.chance(1, 20) { -(rng.below(8) as i64) } else { d };
                    let p = if side == Side::Bid { mid - d } else { mid + d };
                    let exists = model.contains_key(&p);
                    let q = if exists && rng.chance(2, 5) || rng.chance(1, 20) {
                        0
                    } else {
                        1 + rng.below(5) as i64
                    };
                    let before = model.get(&p).copied();
                    if q == 0 {
                        model.remove(&p);
                    } else {
                        model.insert(p, q);
                    }
                    let changed = ladder.apply(Price::from_raw(p), Qty::from_raw(q));
                    assert_eq!(
                        changed,
                        before != model.get(&p).copied(),
                        "seed {seed} step {step}: apply({p}, {q})"
                    );
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

    /// The window and `far` under prices that leave the window's reach: a real tick in raw units
    /// (so the grid must be learnt), prices off that grid arriving later (the grid refines), books
    /// wider than the window (levels live in `far`), trends that move the best far up and down
    /// (the window follows; it empties and refills from `far`), and keys near the ends of `i64`.
    #[test]
    fn window_and_far_match_btreemap_model() {
        let (mut seen_far, mut seen_wide_window) = (false, false);
        for seed in 0..48u64 {
            let mut rng = Rng::new(5000 + seed);
            let side = if seed % 2 == 0 { Side::Bid } else { Side::Ask };
            let mut ladder = Ladder::new(side);
            let mut model = BTreeMap::new();
            let tick: i64 = [1_000_000, 1, 7, 50_000_000][(seed % 4) as usize];
            // distances from mid in ticks: within the window, or far wider than it
            let span: u64 = [300, 5_000, 60_000, 200_000][(seed / 4 % 4) as usize];
            let mut mid: i64 = match seed % 6 {
                0 => i64::MAX - 3 * span as i64 * tick,
                1 => 3 * span as i64 * tick,
                _ => 40_000 * 100_000_000,
            };
            for step in 0..3_000 {
                // the window's allocation grows in whole size classes
                let cap = ladder.qtys.capacity();
                assert!(cap == 0 || cap.is_power_of_two(), "seed {seed} step {step}: {cap}");
                assert!(ladder.bits.capacity() * 64 >= cap, "seed {seed} step {step}");
                let r = rng.below(1000);
                if r < 4 {
                    // a trend: the best moves by up to several windows
                    let jump = rng.below(3 * span) as i64 - (3 * span / 2) as i64;
                    mid = (mid as i128 + jump as i128 * tick as i128).clamp(
                        2 * span as i128 * tick as i128,
                        i64::MAX as i128 - 2 * span as i128 * tick as i128,
                    ) as i64;
                }
                if r == 999 {
                    ladder.clear();
                    model.clear();
                    continue;
                }
                let d =
                    if rng.chance(1, 4) { rng.below(span) } else { rng.top_skewed(span.min(400)) }
                        as i64;
                let d = if rng.chance(1, 25) { -(rng.below(50) as i64) } else { d };
                let mut p = if side == Side::Bid { mid - d * tick } else { mid + d * tick };
                if rng.chance(1, 200) {
                    // off the grid
                    p += 1 + rng.below(tick.max(2) as u64 - 1) as i64;
                }
                let exists = model.contains_key(&p);
                let q = if exists && rng.chance(2, 5) || rng.chance(1, 20) {
                    0
                } else {
                    1 + rng.below(9) as i64
                };
                let before = model.get(&p).copied();
                if q == 0 {
                    model.remove(&p);
                } else {
                    model.insert(p, q);
                }
                let changed = ladder.apply(Price::from_raw(p), Qty::from_raw(q));
                assert_eq!(
                    changed,
                    before != model.get(&p).copied(),
                    "seed {seed} step {step}: apply({p}, {q})"
                );
                if step % 50 == 0 {
                    check_ladder(&ladder, &model, &mut rng, &format!("seed {seed} step {step}"));
                }
                seen_far |= !ladder.far_keys.is_empty();
                seen_wide_window |= ladder.qtys.len() >= MAX_SLOTS / 2;
                if step % 997 == 500 {
                    // the whole-ladder operations on wide books
                    let want: Vec<Level> = ladder.iter().collect();
                    let mut again = Ladder::new(side);
                    again.replace(&want);
                    assert_eq!(again, ladder, "seed {seed} step {step}: replace");
                    // worst first, and out of order with repeats and zeros
                    let mut backwards = want.clone();
                    backwards.reverse();
                    again.replace(&backwards);
                    assert_eq!(again, ladder, "seed {seed} step {step}: replace worst first");
                    let mut shuffled = want.clone();
                    for i in (1..shuffled.len()).rev() {
                        shuffled.swap(i, rng.below(i as u64 + 1) as usize);
                    }
                    if let Some(&l) = shuffled.first() {
                        shuffled.insert(0, Level::new(l.price, Qty::from_raw(1)));
                        shuffled.push(Level::new(Price::from_raw(mid), Qty::ZERO));
                    }
                    again.replace(&shuffled);
                    assert_eq!(again, ladder, "seed {seed} step {step}: replace shuffled");
                    // a copy into buffers held for another book keeps working as the ladder
                    let mut view = Ladder::new(side);
                    view.apply(Price::from_raw(mid), Qty::from_raw(1));
                    view.clone_from(&ladder);
                    check_ladder(&view, &model, &mut rng, &format!("seed {seed} step {step} copy"));
                    let d = rng.below(span) as i64;
                    let cut = if side == Side::Bid { mid - d * tick } else { mid + d * tick };
                    view.remove_worse_than(Price::from_raw(cut));
                    let mut pruned = model.clone();
                    pruned.retain(|&k, _| if side == Side::Bid { k >= cut } else { k <= cut });
                    check_ladder(
                        &view,
                        &pruned,
                        &mut rng,
                        &format!("seed {seed} step {step} prune"),
                    );
                    view.apply(Price::from_raw(cut), Qty::from_raw(3));
                    pruned.insert(cut, 3);
                    check_ladder(
                        &view,
                        &pruned,
                        &mut rng,
                        &format!("seed {seed} step {step} after"),
                    );
                    let n = rng.below(model.len() as u64 + 2) as usize;
                    ladder.truncate(n);
                    let keep: Vec<_> = match side {
                        Side::Bid => model.iter().rev().take(n).map(|(&p, &q)| (p, q)).collect(),
                        Side::Ask => model.iter().take(n).map(|(&p, &q)| (p, q)).collect(),
                    };
                    model = keep.into_iter().collect();
                    check_ladder(
                        &ladder,
                        &model,
                        &mut rng,
                        &format!("seed {seed} step {step} truncate"),
                    );
                }
            }
            check_ladder(&ladder, &model, &mut rng, &format!("seed {seed} end"));
            // drain from the best down: the window empties and refills from `far` again and again
            while let Some(best) = ladder.best() {
                ladder.apply(best.price, Qty::ZERO);
                model.remove(&best.price.raw());
                if model.len() % 37 == 0 {
                    check_ladder(&ladder, &model, &mut rng, &format!("seed {seed} drain"));
                }
            }
            assert!(model.is_empty(), "seed {seed}: drained");
        }
        assert!(seen_far && seen_wide_window, "the runs reached far levels and wide windows");
    }

    #[test]
    fn level_serde_is_an_array_of_strings() {
        let l = Level::new(p("1.5"), q("2"));
        assert_eq!(serde_json::to_string(&l).unwrap(), r#"["1.5","2"]"#);
        assert_eq!(serde_json::from_str::<Level>(r#"["1.50000000","2.0"]"#).unwrap(), l);
    }
}
