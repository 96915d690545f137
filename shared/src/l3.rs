//! The tick-by-tick (L3) order book: individual orders by id, rebuilt from an exchange's
//! order-by-order feed (逐笔委托 / 逐笔成交), with the aggregated L2 ladder kept in step.
//!
//! ## Model
//! * Orders live in a hash map keyed by order id ([`IdMap`], a multiply-fold hasher: ids are
//!   exchange-assigned integers, not attacker-chosen keys). Each order keeps its side, its price
//!   and its remaining quantity.
//! * The aggregated ladder is a [`crate::book::OrderBook`]. Every change to it is also pushed as a
//!   [`LevelUpdate`] (absolute new quantity, 0 = level removed) into an output buffer the caller
//!   drains ([`L3Book::drain_updates`]), so an L2 book fed those updates always equals
//!   [`L3Book::ladder`]. This is the sans-IO shape: messages go in through [`L3Book::handle`] /
//!   [`L3Book::apply`], level changes come out of the buffer.
//! * Quantities never go negative: a cancel or execution larger than what rests is clamped to what
//!   rests and counted in [`L3Counters::negative_qty_clamped`]. Nothing here panics on bad input;
//!   every anomaly has a counter.
//!
//! ## Sequencing
//! Each message carries a channel id and a per-channel sequence number. A [`Sequencer`] per
//! channel decides: `seq == last + 1` applies; `seq <= last` is a duplicate, dropped and counted;
//! `seq > last + 1` is a gap, returned as the typed error [`SeqGap`]. On a gap the message is
//! **not** applied and the sequencer does not advance, so the book stays exact up to `last` and is
//! reported stale ([`L3Book::is_stale`]). The caller decides how to resync:
//! * feed the missing messages (a retransmission), then the rejected ones again — once
//!   `last + 1` arrives the gap is closed and the book is no longer stale; or
//! * accept the loss with [`L3Book::skip_gap`] (the book stays stale until
//!   [`L3Book::clear_stale`]), or rebuild from a snapshot after [`L3Book::reset`].
//!
//! [`SeqPolicy::Increasing`] relaxes the rule for recorded files that keep only some securities of
//! a channel: numbers must still increase strictly (duplicates are dropped), but holes are allowed
//! and counted as [`L3Counters::seq_holes`] instead of being gaps.
//!
//! ## Exchange semantics ([`Venue`])
//! * **Shanghai (SSE)**: cancels arrive in the order stream (OrderType 10, mapped to
//!   [`Msg::Cancel`]). SSE publishes an aggressive order only for the part that rests after it
//!   traded, so a continuous-trading trade can name an order never seen: only the sides that are
//!   on the book are consumed, and an unknown *aggressor* is counted in
//!   [`L3Counters::unseen_order_refs`]. An unknown *passive* side (or either side of a
//!   call-auction trade, where every order rested first) is an anomaly:
//!   [`L3Counters::trades_not_found`].
//! * **Shenzhen (SZSE)**: every order is published in full, so both sides of a trade must be on
//!   the book (else `trades_not_found`). Cancels arrive in the trade stream: a [`Msg::Trade`] with
//!   [`TradeKind::Cancel`] whose non-zero id is the cancelled order (the price is 0 and ignored).
//! * **LOBSTER**: messages carry price and size even for orders that predate the file, so a
//!   cancel / execution / passive trade side naming an unknown id adjusts the level at the
//!   message's price by its size directly (never below zero) and is counted in
//!   [`L3Counters::unknown_order_adjustments`]. The starting book comes from
//!   [`L3Book::seed_level`] (anonymous liquidity).
//!
//! Order id 0 means "no order" in a trade's buy/sell id.

use core::hash::{BuildHasherDefault, Hasher};
use std::collections::hash_map::Entry;
use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::book::{Level, LevelUpdate, OrderBook, Side};
use crate::fixed::{Price, Qty};

/// An exchange order number.
pub type OrderId = u64;

/// A cheap hasher for integer ids: one 64x64->128 multiply folded to 64 bits, so both the low
/// bits (bucket index) and the high bits (hashbrown's control byte) depend on every input bit.
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHasher(u64);

const ID_HASH_K: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hasher for IdHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    #[inline]
    fn write_u64(&mut self, x: u64) {
        let m = ((self.0 ^ x) as u128).wrapping_mul(ID_HASH_K as u128);
        self.0 = (m as u64) ^ ((m >> 64) as u64);
    }
    #[inline]
    fn write_u32(&mut self, x: u32) {
        self.write_u64(x as u64)
    }
    #[inline]
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64)
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A hash map keyed by order id with [`IdHasher`].
pub type IdMap<V> = HashMap<OrderId, V, BuildHasherDefault<IdHasher>>;

/// Which exchange's publication rules the book follows (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Venue {
    Sse,
    Szse,
    Lobster,
}

impl Venue {
    /// The name on the wire: `sse`, `szse`, `lobster`.
    pub fn as_str(self) -> &'static str {
        match self {
            Venue::Sse => "sse",
            Venue::Szse => "szse",
            Venue::Lobster => "lobster",
        }
    }
}

/// Who initiated a trade, or what kind of trade record it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TradeKind {
    /// The buy order was the aggressor (SSE TradeBSFlag 1).
    BuyInitiated,
    /// The sell order was the aggressor (SSE TradeBSFlag 2).
    SellInitiated,
    /// A call-auction match (SSE TradeBSFlag 0): both orders rested before the match.
    Auction,
    /// SZSE's cancel record in the trade stream (ExecType cancel): the non-zero id is cancelled.
    Cancel,
}

/// One order-by-order message, already normalised from the venue's wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Msg {
    /// A new resting order (for SSE: the part of it that rests).
    Add { id: OrderId, side: Side, price: Price, qty: Qty },
    /// Cancels `qty` of order `id` (full or partial). `side` and `price` are as the message
    /// carries them; they are used only when the id is unknown on a LOBSTER book.
    Cancel { id: OrderId, side: Side, price: Price, qty: Qty },
    /// A trade between two orders. Each side found on the book is consumed by `qty`.
    Trade { buy_id: OrderId, sell_id: OrderId, price: Price, qty: Qty, kind: TradeKind },
    /// An execution against one resting order (LOBSTER type 4: `side` is the resting side).
    Execute { id: OrderId, side: Side, price: Price, qty: Qty },
}

/// A resting order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Order {
    pub side: Side,
    pub price: Price,
    /// Remaining quantity; never zero while the order is on the book.
    pub qty: Qty,
}

/// How an order is stored: 16 bytes, so a map entry is 24 instead of 32 and more of the live
/// orders stay in cache. The side is the sign of `qty` (negative = ask); a live order's quantity
/// is never zero, so the encoding is unambiguous.
#[derive(Debug, Clone, Copy)]
struct Slot {
    price: i64,
    qty: i64,
}

impl Slot {
    #[inline]
    fn new(side: Side, price: Price, qty: Qty) -> Self {
        let q = qty.raw();
        Self { price: price.raw(), qty: if side == Side::Ask { -q } else { q } }
    }
    #[inline]
    fn side(self) -> Side {
        if self.qty < 0 {
            Side::Ask
        } else {
            Side::Bid
        }
    }
    #[inline]
    fn remaining(self) -> i64 {
        self.qty.abs()
    }
    #[inline]
    fn order(self) -> Order {
        Order {
            side: self.side(),
            price: Price::from_raw(self.price),
            qty: Qty::from_raw(self.remaining()),
        }
    }
}

/// What the book did with everything it was given. All counters only ever increase.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct L3Counters {
    /// Applied [`Msg::Add`]s (including rejected duplicates and zero quantities).
    pub adds: u64,
    /// Applied cancels (order-stream cancels and SZSE trade-stream cancels).
    pub cancels: u64,
    /// Applied trades (not counting SZSE cancel records).
    pub trades: u64,
    /// Applied single-order executions.
    pub executions: u64,
    /// Messages dropped because their sequence number was already applied.
    pub seq_duplicates: u64,
    /// Sequence gaps detected (each gap once, however many messages it rejects).
    pub seq_gaps: u64,
    /// Holes skipped under [`SeqPolicy::Increasing`] (not errors).
    pub seq_holes: u64,
    /// Trade sides naming an order never seen where the venue allows it (SSE aggressor; LOBSTER
    /// aggressor).
    pub unseen_order_refs: u64,
    /// Cancels whose order is not on the book (on LOBSTER these are adjustments instead).
    pub cancels_not_found: u64,
    /// Trade / execution sides that must be on the book and are not.
    pub trades_not_found: u64,
    /// LOBSTER messages for unknown ids applied to the level at their price.
    pub unknown_order_adjustments: u64,
    /// Adds whose id is already live (ignored).
    pub duplicate_order_ids: u64,
    /// Times a quantity would have gone negative and was clamped to zero.
    pub negative_qty_clamped: u64,
    /// Malformed messages ignored (zero quantity, a trade kind the venue does not use, ...).
    pub invalid: u64,
}

/// How a [`Sequencer`] treats a number above `last + 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SeqPolicy {
    /// Every number must follow the previous one: a jump is a gap (an error).
    Contiguous,
    /// Numbers must increase; jumps are holes (other securities' messages in a filtered file).
    Increasing,
}

/// What a [`Sequencer`] says about a number that is not a gap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqVerdict {
    /// Apply the message.
    Apply,
    /// Already applied: drop it.
    Duplicate,
}

/// A message arrived with a sequence number beyond the next expected one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("sequence gap on channel {channel}: expected {expected}, got {got}")]
pub struct SeqGap {
    pub channel: u32,
    pub expected: u64,
    pub got: u64,
}

/// Per-channel sequence checking (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sequencer {
    policy: SeqPolicy,
    last: Option<u64>,
    gap_open: bool,
    duplicates: u64,
    gaps: u64,
    holes: u64,
}

impl Sequencer {
    /// A sequencer that takes the first number it sees as the start of the stream.
    pub fn new(policy: SeqPolicy) -> Self {
        Self { policy, last: None, gap_open: false, duplicates: 0, gaps: 0, holes: 0 }
    }

    /// A sequencer whose next expected number is `last + 1`.
    pub fn after(policy: SeqPolicy, last: u64) -> Self {
        Self { last: Some(last), ..Self::new(policy) }
    }

    pub fn policy(&self) -> SeqPolicy {
        self.policy
    }

    /// The last applied number.
    pub fn last(&self) -> Option<u64> {
        self.last
    }

    /// Whether a gap was reported and `last + 1` has not arrived since.
    pub fn gap_open(&self) -> bool {
        self.gap_open
    }

    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }

    /// Gaps reported, each once.
    pub fn gaps(&self) -> u64 {
        self.gaps
    }

    /// Holes skipped under [`SeqPolicy::Increasing`].
    pub fn holes(&self) -> u64 {
        self.holes
    }

    /// Checks `seq`, advancing when the message is to be applied. On a gap nothing advances and
    /// the expected number is returned in the error (`channel` is left 0 for the caller to fill).
    #[inline]
    pub fn check(&mut self, seq: u64) -> Result<SeqVerdict, SeqGap> {
        let Some(last) = self.last else {
            self.last = Some(seq);
            return Ok(SeqVerdict::Apply);
        };
        if seq <= last {
            self.duplicates += 1;
            return Ok(SeqVerdict::Duplicate);
        }
        let expected = last + 1;
        if seq != expected {
            match self.policy {
                SeqPolicy::Increasing => self.holes += 1,
                SeqPolicy::Contiguous => {
                    if !self.gap_open {
                        self.gap_open = true;
                        self.gaps += 1;
                    }
                    return Err(SeqGap { channel: 0, expected, got: seq });
                }
            }
        }
        self.gap_open = false;
        self.last = Some(seq);
        Ok(SeqVerdict::Apply)
    }

    /// Accepts a loss: the next expected number becomes `seq`.
    pub fn skip_to(&mut self, seq: u64) {
        self.last = seq.checked_sub(1);
        self.gap_open = false;
    }
}

/// What [`L3Book::handle`] did with a message that was not a gap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    Applied,
    Duplicate,
}

/// The tick-by-tick order book of one instrument (see the module docs).
#[derive(Debug, Clone)]
pub struct L3Book {
    venue: Venue,
    orders: IdMap<Slot>,
    ladder: OrderBook,
    /// Quantity of every ladder level by price, per side (`Side as usize`); always equal to the
    /// ladder's.
    level_qty: [IdMap<i64>; 2],
    out: Vec<LevelUpdate>,
    seq_policy: SeqPolicy,
    /// Usually one channel per book, so a short list beats a map.
    seqs: Vec<(u32, Sequencer)>,
    /// A gap was skipped (data lost) and the caller has not cleared it.
    lossy: bool,
    counters: L3Counters,
}

impl L3Book {
    pub fn new(venue: Venue) -> Self {
        Self::with_capacity(venue, 0)
    }

    /// A book with room for `orders` live orders before the id map grows.
    pub fn with_capacity(venue: Venue, orders: usize) -> Self {
        Self {
            venue,
            orders: IdMap::with_capacity_and_hasher(orders, Default::default()),
            ladder: OrderBook::new(),
            level_qty: [IdMap::default(), IdMap::default()],
            out: Vec::new(),
            seq_policy: SeqPolicy::Contiguous,
            seqs: Vec::new(),
            lossy: false,
            counters: L3Counters::default(),
        }
    }

    /// Sets the policy of the per-channel sequencers created from now on.
    pub fn with_seq_policy(mut self, policy: SeqPolicy) -> Self {
        self.seq_policy = policy;
        self
    }

    pub fn venue(&self) -> Venue {
        self.venue
    }

    /// Applies `msg` if `seq` is the next number on `channel`; drops duplicates; reports gaps
    /// without applying (the book is then stale until the gap is filled or skipped).
    #[inline]
    pub fn handle(&mut self, channel: u32, seq: u64, msg: Msg) -> Result<Handled, SeqGap> {
        let i = match self.seqs.iter().position(|(c, _)| *c == channel) {
            Some(i) => i,
            None => {
                self.seqs.push((channel, Sequencer::new(self.seq_policy)));
                self.seqs.len() - 1
            }
        };
        let s = &mut self.seqs[i].1;
        let (holes, gaps) = (s.holes, s.gaps);
        let result = s.check(seq);
        self.counters.seq_holes += s.holes - holes;
        self.counters.seq_gaps += s.gaps - gaps;
        match result {
            Ok(SeqVerdict::Apply) => {
                self.apply(msg);
                Ok(Handled::Applied)
            }
            Ok(SeqVerdict::Duplicate) => {
                self.counters.seq_duplicates += 1;
                Ok(Handled::Duplicate)
            }
            Err(gap) => Err(SeqGap { channel, ..gap }),
        }
    }

    /// Accepts the loss of an open gap on `channel`: the next expected number becomes `seq`. The
    /// book stays stale until [`Self::clear_stale`] or [`Self::reset`].
    pub fn skip_gap(&mut self, channel: u32, seq: u64) {
        if let Some((_, s)) = self.seqs.iter_mut().find(|(c, _)| *c == channel) {
            s.skip_to(seq);
            self.lossy = true;
        }
    }

    /// The sequencer of `channel`, once a message has been seen on it.
    pub fn sequencer(&self, channel: u32) -> Option<&Sequencer> {
        self.seqs.iter().find(|(c, _)| *c == channel).map(|(_, s)| s)
    }

    /// Whether the book may differ from the exchange's: a gap is open, or one was skipped, or the
    /// caller marked it.
    pub fn is_stale(&self) -> bool {
        self.lossy || self.seqs.iter().any(|(_, s)| s.gap_open())
    }

    /// Marks the book stale (e.g. a gap seen by a caller-side sequencer).
    pub fn mark_stale(&mut self) {
        self.lossy = true;
    }

    /// Clears a stale mark left by [`Self::skip_gap`] or [`Self::mark_stale`] (open gaps stay).
    pub fn clear_stale(&mut self) {
        self.lossy = false;
    }

    /// Empties the book for a resync: every level is removed (emitted as qty-0 updates), orders
    /// and sequencers are forgotten, the stale mark is cleared. Counters are kept.
    pub fn reset(&mut self) {
        for side in [Side::Bid, Side::Ask] {
            let ladder = self.ladder.side(side);
            self.out.extend(ladder.iter().map(|l| LevelUpdate {
                side,
                price: l.price,
                qty: Qty::ZERO,
            }));
        }
        self.ladder.clear();
        self.level_qty.iter_mut().for_each(IdMap::clear);
        self.orders.clear();
        self.seqs.clear();
        self.lossy = false;
    }

    /// Replaces the book with a snapshot of the source's (recovery after a gap): every current
    /// level is removed (emitted as qty-0 updates, like [`Self::reset`]), the snapshot's orders are
    /// put on the book (their levels emitted), and each listed channel's sequencer continues after
    /// the snapshot's number, so messages the snapshot already contains are dropped as duplicates.
    /// Channels not listed start afresh at the first number seen. Counters are kept and restored
    /// orders are not counted as `adds`; an order with a zero quantity or an id already restored is
    /// ignored and counted in [`L3Counters::invalid`] (bad input is never a panic).
    pub fn restore(
        &mut self,
        orders: impl IntoIterator<Item = (OrderId, Order)>,
        channel_last_seq: &[(u32, u64)],
    ) {
        self.reset();
        for (id, o) in orders {
            if o.qty.raw() <= 0 {
                self.counters.invalid += 1;
                continue;
            }
            match self.orders.entry(id) {
                Entry::Occupied(_) => self.counters.invalid += 1,
                Entry::Vacant(v) => {
                    v.insert(Slot::new(o.side, o.price, o.qty));
                    self.adjust(o.side, o.price, o.qty.raw());
                }
            }
        }
        for &(channel, last) in channel_last_seq {
            match self.seqs.iter_mut().find(|(c, _)| *c == channel) {
                Some((_, s)) => *s = Sequencer::after(self.seq_policy, last),
                None => self.seqs.push((channel, Sequencer::after(self.seq_policy, last))),
            }
        }
    }

    /// The policy new per-channel sequencers get.
    pub fn seq_policy(&self) -> SeqPolicy {
        self.seq_policy
    }

    /// Applies one message without sequence checking (the caller sequenced it).
    #[inline]
    pub fn apply(&mut self, msg: Msg) {
        match msg {
            Msg::Add { id, side, price, qty } => self.add(id, side, price, qty),
            Msg::Cancel { id, side, price, qty } => {
                self.counters.cancels += 1;
                self.cancel(id, side, price, qty)
            }
            Msg::Trade { buy_id, sell_id, price, qty, kind } => {
                self.trade(buy_id, sell_id, price, qty, kind)
            }
            Msg::Execute { id, side, price, qty } => {
                self.counters.executions += 1;
                if qty.is_zero() {
                    self.counters.invalid += 1;
                } else if !self.consume(id, qty) {
                    self.not_found_fill(side, price, qty);
                }
            }
        }
    }

    /// Adds anonymous liquidity (a level of an initial snapshot whose orders are not known by
    /// id). Later LOBSTER messages for unknown ids draw it down.
    pub fn seed_level(&mut self, side: Side, price: Price, qty: Qty) {
        if !qty.is_zero() {
            self.adjust(side, price, qty.raw());
        }
    }

    #[inline]
    fn add(&mut self, id: OrderId, side: Side, price: Price, qty: Qty) {
        self.counters.adds += 1;
        if qty.is_zero() {
            self.counters.invalid += 1;
            return;
        }
        match self.orders.entry(id) {
            Entry::Occupied(_) => {
                self.counters.duplicate_order_ids += 1;
            }
            Entry::Vacant(v) => {
                v.insert(Slot::new(side, price, qty));
                self.adjust(side, price, qty.raw());
            }
        }
    }

    #[inline]
    fn cancel(&mut self, id: OrderId, side: Side, price: Price, qty: Qty) {
        if qty.is_zero() {
            self.counters.invalid += 1;
            return;
        }
        if self.consume(id, qty) {
            return;
        }
        if self.venue == Venue::Lobster {
            self.counters.unknown_order_adjustments += 1;
            self.adjust(side, price, -qty.raw());
        } else {
            self.counters.cancels_not_found += 1;
        }
    }

    #[inline]
    fn trade(
        &mut self,
        buy_id: OrderId,
        sell_id: OrderId,
        price: Price,
        qty: Qty,
        kind: TradeKind,
    ) {
        if kind == TradeKind::Cancel {
            self.counters.cancels += 1;
            // SZSE: exactly one id names the cancelled order; the price is 0 (unknown).
            let id = match (buy_id, sell_id) {
                (b, 0) if b != 0 => b,
                (0, s) if s != 0 => s,
                _ => {
                    self.counters.invalid += 1;
                    return;
                }
            };
            if self.venue != Venue::Szse || qty.is_zero() {
                self.counters.invalid += 1;
                return;
            }
            if !self.consume(id, qty) {
                self.counters.cancels_not_found += 1;
            }
            return;
        }
        self.counters.trades += 1;
        if qty.is_zero() {
            self.counters.invalid += 1;
            return;
        }
        for (id, side) in [(buy_id, Side::Bid), (sell_id, Side::Ask)] {
            if id == 0 || self.consume(id, qty) {
                continue;
            }
            let aggressor = matches!(
                (kind, side),
                (TradeKind::BuyInitiated, Side::Bid) | (TradeKind::SellInitiated, Side::Ask)
            );
            match self.venue {
                Venue::Sse if aggressor => self.counters.unseen_order_refs += 1,
                Venue::Lobster if aggressor => self.counters.unseen_order_refs += 1,
                _ => self.not_found_fill(side, price, qty),
            }
        }
    }

    /// A fill of an order that must be on the book and is not.
    fn not_found_fill(&mut self, side: Side, price: Price, qty: Qty) {
        if self.venue == Venue::Lobster {
            self.counters.unknown_order_adjustments += 1;
            self.adjust(side, price, -qty.raw());
        } else {
            self.counters.trades_not_found += 1;
        }
    }

    /// Takes `qty` off order `id` (clamped to what rests); false if the order is not live.
    #[inline]
    fn consume(&mut self, id: OrderId, qty: Qty) -> bool {
        let (side, price, take) = match self.orders.entry(id) {
            Entry::Vacant(_) => return false,
            Entry::Occupied(mut e) => {
                let o = e.get_mut();
                let rest = o.remaining();
                let take = if qty.raw() > rest {
                    self.counters.negative_qty_clamped += 1;
                    rest
                } else {
                    qty.raw()
                };
                let (side, price) = (o.side(), Price::from_raw(o.price));
                if take == rest {
                    e.remove();
                } else if side == Side::Ask {
                    o.qty += take;
                } else {
                    o.qty -= take;
                }
                (side, price, take)
            }
        };
        self.adjust(side, price, -take);
        true
    }

    /// Moves the level at `price` by `delta` raw units (never below zero) and emits the change.
    ///
    /// The current level quantity comes from the per-side hash index (one probe in a table of a
    /// few hundred entries) rather than from the ladder, whose lookup binary-searches beyond the
    /// top few levels; the ladder is then written once.
    #[inline]
    fn adjust(&mut self, side: Side, price: Price, delta: i64) {
        let new = match self.level_qty[side as usize].entry(price.raw() as u64) {
            Entry::Occupied(mut e) => {
                let mut new = e.get().saturating_add(delta);
                if new < 0 {
                    self.counters.negative_qty_clamped += 1;
                    new = 0;
                }
                if new == 0 {
                    e.remove();
                } else {
                    *e.get_mut() = new;
                }
                new
            }
            Entry::Vacant(e) => {
                if delta < 0 {
                    self.counters.negative_qty_clamped += 1;
                }
                if delta <= 0 {
                    return;
                }
                e.insert(delta);
                delta
            }
        };
        let qty = Qty::from_raw(new);
        if self.ladder.side_mut(side).apply(price, qty) {
            self.out.push(LevelUpdate { side, price, qty });
        }
    }

    /// The level changes produced since the last drain, oldest first.
    pub fn drain_updates(&mut self) -> std::vec::Drain<'_, LevelUpdate> {
        self.out.drain(..)
    }

    /// The level changes waiting to be drained.
    pub fn pending_updates(&self) -> &[LevelUpdate] {
        &self.out
    }

    /// Discards the waiting level changes (for callers that only read the ladder).
    pub fn clear_updates(&mut self) {
        self.out.clear();
    }

    /// The aggregated L2 ladder.
    pub fn ladder(&self) -> &OrderBook {
        &self.ladder
    }

    pub fn best_bid(&self) -> Option<Level> {
        self.ladder.best_bid()
    }

    pub fn best_ask(&self) -> Option<Level> {
        self.ladder.best_ask()
    }

    /// Best bid at or above best ask.
    pub fn is_crossed(&self) -> bool {
        self.ladder.is_crossed()
    }

    /// The best `n` levels of each side, best first.
    pub fn top(&self, n: usize) -> (Vec<Level>, Vec<Level>) {
        self.ladder.top(n)
    }

    /// A live order by id.
    pub fn order(&self, id: OrderId) -> Option<Order> {
        self.orders.get(&id).map(|s| s.order())
    }

    /// Every live order, in no particular order.
    pub fn orders(&self) -> impl Iterator<Item = (OrderId, Order)> + '_ {
        self.orders.iter().map(|(&id, s)| (id, s.order()))
    }

    /// Number of live orders.
    pub fn order_count(&self) -> usize {
        self.orders.len()
    }

    pub fn counters(&self) -> &L3Counters {
        &self.counters
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
    fn q(n: i64) -> Qty {
        Qty::from_units(n)
    }
    fn add(id: u64, side: Side, price: &str, qty: i64) -> Msg {
        Msg::Add { id, side, price: p(price), qty: q(qty) }
    }
    fn cancel(id: u64, side: Side, price: &str, qty: i64) -> Msg {
        Msg::Cancel { id, side, price: p(price), qty: q(qty) }
    }
    fn trade(buy_id: u64, sell_id: u64, price: &str, qty: i64, kind: TradeKind) -> Msg {
        Msg::Trade { buy_id, sell_id, price: p(price), qty: q(qty), kind }
    }
    fn levels(l: &[Level]) -> Vec<(String, String)> {
        l.iter().map(|l| (l.price.to_string(), l.qty.to_string())).collect()
    }
    fn lv(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
    }
    /// Applies `msgs` and checks the emitted updates rebuild the ladder.
    fn run(book: &mut L3Book, msgs: &[Msg]) {
        let mut l2 = book.ladder().clone();
        book.clear_updates();
        for &m in msgs {
            book.apply(m);
            for u in book.drain_updates() {
                l2.apply_update(u);
            }
            assert_eq!(&l2, book.ladder());
        }
    }

    #[test]
    fn add_cancel_aggregates_levels() {
        let mut b = L3Book::new(Venue::Sse);
        run(
            &mut b,
            &[
                add(1, Side::Bid, "10.00", 100),
                add(2, Side::Bid, "10.00", 200),
                add(3, Side::Bid, "9.99", 50),
                add(4, Side::Ask, "10.01", 70),
            ],
        );
        assert_eq!(b.order_count(), 4);
        assert_eq!(b.best_bid(), Some(Level::new(p("10"), q(300))));
        assert_eq!(b.best_ask(), Some(Level::new(p("10.01"), q(70))));
        b.apply(cancel(1, Side::Bid, "10.00", 40));
        assert_eq!(
            b.pending_updates(),
            &[LevelUpdate { side: Side::Bid, price: p("10"), qty: q(260) }]
        );
        assert_eq!(b.order(1).unwrap().qty, q(60));
        b.clear_updates();
        b.apply(cancel(2, Side::Bid, "10.00", 200));
        b.apply(cancel(1, Side::Bid, "10.00", 60));
        assert_eq!(b.order(1), None);
        assert_eq!(b.order_count(), 2);
        let ups: Vec<_> = b.drain_updates().collect();
        assert_eq!(
            ups.last(),
            Some(&LevelUpdate { side: Side::Bid, price: p("10"), qty: Qty::ZERO })
        );
        assert_eq!(b.best_bid(), Some(Level::new(p("9.99"), q(50))));
        let (bids, asks) = b.top(5);
        assert_eq!(levels(&bids), lv(&[("9.99", "50")]));
        assert_eq!(levels(&asks), lv(&[("10.01", "70")]));
        assert_eq!(b.counters().adds, 4);
        assert_eq!(b.counters().cancels, 3);
        assert_eq!(b.counters().cancels_not_found, 0);
    }

    #[test]
    fn cancel_of_unknown_order_is_counted_not_applied() {
        for venue in [Venue::Sse, Venue::Szse] {
            let mut b = L3Book::new(venue);
            b.apply(add(1, Side::Ask, "5", 10));
            b.clear_updates();
            b.apply(cancel(99, Side::Ask, "5", 10));
            assert_eq!(b.counters().cancels_not_found, 1);
            assert!(b.pending_updates().is_empty());
            assert_eq!(b.best_ask(), Some(Level::new(p("5"), q(10))));
        }
    }

    #[test]
    fn oversized_cancel_and_fill_clamp_and_count() {
        let mut b = L3Book::new(Venue::Sse);
        run(
            &mut b,
            &[add(1, Side::Bid, "1", 10), add(2, Side::Bid, "1", 5), cancel(1, Side::Bid, "1", 15)],
        );
        assert_eq!(b.counters().negative_qty_clamped, 1);
        assert_eq!(b.order(1), None);
        assert_eq!(b.best_bid(), Some(Level::new(p("1"), q(5))));
        run(&mut b, &[trade(0, 2, "1", 0, TradeKind::SellInitiated)]);
        assert_eq!(b.counters().invalid, 1, "zero-quantity trade");
        run(&mut b, &[trade(2, 77, "1", 8, TradeKind::SellInitiated)]);
        assert_eq!(b.counters().negative_qty_clamped, 2);
        assert_eq!(b.counters().unseen_order_refs, 1);
        assert!(b.ladder().bids.is_empty());
    }

    #[test]
    fn duplicate_ids_and_zero_qty_adds_are_ignored() {
        let mut b = L3Book::new(Venue::Szse);
        run(
            &mut b,
            &[add(1, Side::Bid, "1", 10), add(1, Side::Ask, "2", 10), add(2, Side::Ask, "2", 0)],
        );
        assert_eq!(b.counters().duplicate_order_ids, 1);
        assert_eq!(b.counters().invalid, 1);
        assert_eq!(b.order_count(), 1);
        assert!(b.ladder().asks.is_empty());
    }

    /// SSE: the aggressor of a continuous trade was never published; only the resting side moves.
    #[test]
    fn sse_trade_consumes_only_the_seen_resting_side() {
        let mut b = L3Book::new(Venue::Sse);
        run(
            &mut b,
            &[
                add(10, Side::Ask, "15.93", 300),
                add(11, Side::Ask, "15.94", 100),
                // buy order 500 sweeps 300 @15.93 and 100 @15.94; 100 rests @15.94 afterwards.
                trade(500, 10, "15.93", 300, TradeKind::BuyInitiated),
                trade(500, 11, "15.94", 100, TradeKind::BuyInitiated),
            ],
        );
        assert_eq!(b.counters().unseen_order_refs, 2);
        assert_eq!(b.counters().trades_not_found, 0);
        assert!(b.ladder().asks.is_empty());
        assert!(!b.is_crossed());
        run(&mut b, &[add(500, Side::Bid, "15.94", 100)]);
        assert_eq!(b.best_bid(), Some(Level::new(p("15.94"), q(100))));
        // a sell-initiated trade whose passive buy side is unknown is an anomaly
        run(&mut b, &[trade(404, 600, "15.94", 100, TradeKind::SellInitiated)]);
        assert_eq!(b.counters().trades_not_found, 1);
        assert_eq!(b.counters().unseen_order_refs, 3);
        assert_eq!(b.counters().trades, 3);
    }

    /// SSE call auction: every order rested first; both sides are consumed.
    #[test]
    fn sse_auction_trade_consumes_both_sides() {
        let mut b = L3Book::new(Venue::Sse);
        run(
            &mut b,
            &[
                add(1, Side::Bid, "10.05", 500),
                add(2, Side::Ask, "10.00", 300),
                add(3, Side::Ask, "10.02", 400),
            ],
        );
        assert!(b.is_crossed(), "an auction book crosses before the match");
        run(
            &mut b,
            &[
                trade(1, 2, "10.02", 300, TradeKind::Auction),
                trade(1, 3, "10.02", 200, TradeKind::Auction),
            ],
        );
        assert!(!b.is_crossed());
        assert_eq!(b.order(1), None);
        assert_eq!(b.order(3).unwrap().qty, q(200));
        assert_eq!(levels(&b.top(5).1), lv(&[("10.02", "200")]));
        run(&mut b, &[trade(9, 3, "10.02", 10, TradeKind::Auction)]);
        assert_eq!(b.counters().trades_not_found, 1, "auction orders must all be known");
        assert_eq!(b.counters().unseen_order_refs, 0);
    }

    /// SZSE: orders are complete; cancels come as trade records with one id and price 0.
    #[test]
    fn szse_cancel_in_trade_stream_and_strict_trades() {
        let mut b = L3Book::new(Venue::Szse);
        run(
            &mut b,
            &[
                add(1, Side::Bid, "20", 100),
                add(2, Side::Ask, "20.01", 100),
                trade(0, 2, "0", 40, TradeKind::Cancel),
                trade(1, 0, "0", 100, TradeKind::Cancel),
            ],
        );
        assert_eq!(b.counters().cancels, 2);
        assert_eq!(b.order(2).unwrap().qty, q(60));
        assert!(b.ladder().bids.is_empty());
        // the aggressor of a SZSE trade must be known as well
        run(
            &mut b,
            &[add(3, Side::Bid, "20.01", 100), trade(3, 2, "20.01", 60, TradeKind::BuyInitiated)],
        );
        assert_eq!(b.order(3).unwrap().qty, q(40));
        assert!(b.ladder().asks.is_empty());
        run(&mut b, &[trade(3, 77, "20.01", 10, TradeKind::BuyInitiated)]);
        assert_eq!(b.counters().trades_not_found, 1);
        assert_eq!(b.counters().unseen_order_refs, 0);
        run(
            &mut b,
            &[trade(0, 55, "0", 1, TradeKind::Cancel), trade(1, 2, "0", 1, TradeKind::Cancel)],
        );
        assert_eq!(b.counters().cancels_not_found, 1);
        assert_eq!(b.counters().invalid, 1, "a cancel record naming two orders");
        // on SSE the cancel record kind is not part of the feed
        let mut s = L3Book::new(Venue::Sse);
        run(&mut s, &[add(1, Side::Bid, "1", 1), trade(1, 0, "0", 1, TradeKind::Cancel)]);
        assert_eq!(s.counters().invalid, 1);
        assert_eq!(s.order_count(), 1);
    }

    /// LOBSTER: orders from before the file are known only as levels; messages carry price/size.
    #[test]
    fn lobster_unknown_ids_adjust_levels() {
        let mut b = L3Book::new(Venue::Lobster);
        b.seed_level(Side::Ask, p("100.01"), q(500));
        b.seed_level(Side::Bid, p("100"), q(300));
        run(
            &mut b,
            &[
                cancel(7, Side::Ask, "100.01", 200),
                Msg::Execute { id: 8, side: Side::Bid, price: p("100"), qty: q(100) },
                add(9, Side::Bid, "100", 50),
                Msg::Execute { id: 9, side: Side::Bid, price: p("100"), qty: q(50) },
            ],
        );
        assert_eq!(b.counters().unknown_order_adjustments, 2);
        assert_eq!(b.best_ask(), Some(Level::new(p("100.01"), q(300))));
        assert_eq!(b.best_bid(), Some(Level::new(p("100"), q(200))));
        assert_eq!(b.order(9), None);
        run(&mut b, &[cancel(6, Side::Ask, "100.01", 400)]);
        assert_eq!(b.counters().negative_qty_clamped, 1, "never below zero");
        assert!(b.ladder().asks.is_empty());
        run(&mut b, &[cancel(5, Side::Ask, "100.05", 1)]);
        assert_eq!(b.counters().negative_qty_clamped, 2);
        assert!(b.ladder().asks.is_empty());
        assert_eq!(b.counters().cancels_not_found, 0);
        assert_eq!(b.counters().executions, 2);
    }

    #[test]
    fn sequencer_contiguous_duplicates_and_gaps() {
        let mut s = Sequencer::new(SeqPolicy::Contiguous);
        assert_eq!(s.check(5), Ok(SeqVerdict::Apply), "first number is the baseline");
        assert_eq!(s.check(6), Ok(SeqVerdict::Apply));
        assert_eq!(s.check(6), Ok(SeqVerdict::Duplicate));
        assert_eq!(s.check(2), Ok(SeqVerdict::Duplicate));
        assert_eq!(s.duplicates(), 2);
        assert_eq!(s.check(9), Err(SeqGap { channel: 0, expected: 7, got: 9 }));
        assert_eq!(s.check(10), Err(SeqGap { channel: 0, expected: 7, got: 10 }));
        assert_eq!(s.gaps(), 1, "one gap, however many messages it rejects");
        assert!(s.gap_open());
        assert_eq!(s.last(), Some(6));
        assert_eq!(s.check(7), Ok(SeqVerdict::Apply));
        assert!(!s.gap_open());
        assert_eq!(s.check(9), Err(SeqGap { channel: 0, expected: 8, got: 9 }));
        assert_eq!(s.gaps(), 2);
        s.skip_to(9);
        assert_eq!(s.check(9), Ok(SeqVerdict::Apply));
        let mut s = Sequencer::after(SeqPolicy::Contiguous, 0);
        assert!(s.check(2).is_err(), "expects 1");
    }

    #[test]
    fn sequencer_increasing_allows_holes() {
        let mut s = Sequencer::new(SeqPolicy::Increasing);
        assert_eq!(s.check(10), Ok(SeqVerdict::Apply));
        assert_eq!(s.check(15), Ok(SeqVerdict::Apply));
        assert_eq!(s.check(16), Ok(SeqVerdict::Apply));
        assert_eq!(s.check(12), Ok(SeqVerdict::Duplicate));
        assert_eq!(s.check(20), Ok(SeqVerdict::Apply));
        assert_eq!(s.holes(), 2);
        assert_eq!(s.gaps(), 0);
        assert_eq!(s.duplicates(), 1);
    }

    #[test]
    fn book_gap_is_not_applied_and_stale_until_filled() {
        let mut b = L3Book::new(Venue::Sse);
        assert_eq!(b.handle(1, 1, add(1, Side::Bid, "1", 10)), Ok(Handled::Applied));
        assert_eq!(b.handle(1, 1, add(1, Side::Bid, "1", 10)), Ok(Handled::Duplicate));
        assert_eq!(b.counters().seq_duplicates, 1);
        assert_eq!(b.counters().duplicate_order_ids, 0, "the duplicate never reached the book");
        // channel 2 is independent
        assert_eq!(b.handle(2, 100, add(50, Side::Ask, "2", 1)), Ok(Handled::Applied));
        let err = b.handle(1, 3, add(3, Side::Bid, "1", 5)).unwrap_err();
        assert_eq!(err, SeqGap { channel: 1, expected: 2, got: 3 });
        assert!(b.is_stale());
        assert_eq!(b.order(3), None, "a gap message is not applied");
        assert!(b.handle(1, 4, add(4, Side::Bid, "1", 5)).is_err());
        assert_eq!(b.counters().seq_gaps, 1);
        // retransmission fills the gap
        assert_eq!(b.handle(1, 2, add(2, Side::Bid, "1", 5)), Ok(Handled::Applied));
        assert!(!b.is_stale());
        assert_eq!(b.handle(1, 3, add(3, Side::Bid, "1", 5)), Ok(Handled::Applied));
        assert_eq!(b.best_bid(), Some(Level::new(p("1"), q(20))));
        // a gap on channel 2 is counted too; skipping it leaves the book stale
        assert!(b.handle(2, 105, cancel(50, Side::Ask, "2", 1)).is_err());
        assert_eq!(b.counters().seq_gaps, 2);
        assert!(b.handle(1, 5, add(5, Side::Bid, "1", 1)).is_err());
        assert_eq!(b.counters().seq_gaps, 3);
        b.skip_gap(2, 105);
        assert!(b.is_stale(), "channel 1 gap still open and channel 2 lost data");
        assert_eq!(b.handle(2, 105, cancel(50, Side::Ask, "2", 1)), Ok(Handled::Applied));
        assert!(b.ladder().asks.is_empty());
        b.skip_gap(1, 5);
        b.clear_stale();
        assert!(!b.is_stale());
        assert_eq!(b.counters().seq_gaps, 3);
        // reset empties the book and emits the removals
        b.clear_updates();
        b.reset();
        let mut l2 = OrderBook::new();
        l2.apply(Side::Bid, p("1"), q(20));
        for u in b.drain_updates() {
            l2.apply_update(u);
        }
        assert_eq!(l2, OrderBook::new());
        assert_eq!(b.order_count(), 0);
        assert_eq!(b.handle(1, 1000, add(1, Side::Bid, "1", 1)), Ok(Handled::Applied));
    }

    #[test]
    fn book_increasing_policy_counts_holes() {
        let mut b = L3Book::new(Venue::Sse).with_seq_policy(SeqPolicy::Increasing);
        assert!(b.handle(1, 10, add(1, Side::Bid, "1", 1)).is_ok());
        assert!(b.handle(1, 20, add(2, Side::Bid, "1", 1)).is_ok());
        assert_eq!(b.handle(1, 15, add(3, Side::Bid, "1", 1)), Ok(Handled::Duplicate));
        assert_eq!(b.counters().seq_holes, 1);
        assert_eq!(b.counters().seq_gaps, 0);
        assert_eq!(b.order_count(), 2);
        assert!(!b.is_stale());
    }

    #[test]
    fn id_hasher_spreads_regular_ids() {
        use core::hash::BuildHasher;
        let bh = BuildHasherDefault::<IdHasher>::default();
        // ids that are multiples of a power of two must still use the low bits and the top bits
        let mut low = std::collections::HashSet::new();
        let mut top = std::collections::HashSet::new();
        for i in 0..1024u64 {
            let h = bh.hash_one(i << 16);
            low.insert(h & 1023);
            top.insert(h >> 57);
        }
        assert!(low.len() > 550, "low bits poorly spread: {}", low.len());
        assert_eq!(top.len(), 128);
    }

    /// `restore` replaces the book, continues each channel after the snapshot and keeps the L2
    /// consumer in step through the emitted updates.
    #[test]
    fn restore_from_snapshot() {
        let mut b = L3Book::new(Venue::Sse);
        let mut l2 = OrderBook::new();
        for (i, m) in
            [add(1, Side::Bid, "10", 5), add(2, Side::Ask, "11", 7)].into_iter().enumerate()
        {
            b.handle(4, i as u64 + 1, m).unwrap();
        }
        assert_eq!(
            b.handle(4, 9, add(3, Side::Bid, "9", 1)),
            Err(SeqGap { channel: 4, expected: 3, got: 9 })
        );
        assert!(b.is_stale());
        b.drain_updates().for_each(|u| {
            l2.apply_update(u);
        });
        let snap = [
            (7, Order { side: Side::Bid, price: p("10.5"), qty: q(3) }),
            (8, Order { side: Side::Ask, price: p("11"), qty: q(2) }),
            (9, Order { side: Side::Ask, price: p("11"), qty: q(4) }),
            (9, Order { side: Side::Ask, price: p("12"), qty: q(4) }),
            (10, Order { side: Side::Ask, price: p("12"), qty: Qty::ZERO }),
        ];
        b.restore(snap, &[(4, 20)]);
        assert!(!b.is_stale());
        assert_eq!(b.counters().invalid, 2);
        assert_eq!(b.order_count(), 3);
        assert_eq!(levels(&b.ladder().bids.iter().collect::<Vec<_>>()), lv(&[("10.5", "3")]));
        assert_eq!(levels(&b.ladder().asks.iter().collect::<Vec<_>>()), lv(&[("11", "6")]));
        b.drain_updates().for_each(|u| {
            l2.apply_update(u);
        });
        assert_eq!(&l2, b.ladder());
        // messages up to the snapshot's number are duplicates; the next one applies
        assert_eq!(b.handle(4, 20, add(11, Side::Bid, "10", 1)), Ok(Handled::Duplicate));
        assert_eq!(b.handle(4, 21, cancel(7, Side::Bid, "10.5", 3)), Ok(Handled::Applied));
        assert_eq!(b.best_bid(), None);
        // an unlisted channel starts afresh
        assert_eq!(b.handle(5, 100, add(12, Side::Bid, "10", 1)), Ok(Handled::Applied));
    }

    /// A naive model of the L3 book used to generate valid streams.
    struct Model {
        orders: BTreeMap<u64, (Side, i64, i64)>,
        /// anonymous (seeded) liquidity per (side, price), LOBSTER only
        anon: BTreeMap<(u8, i64), i64>,
        next_id: u64,
    }

    impl Model {
        fn levels(&self, side: Side) -> Vec<(i64, i64)> {
            let mut m: BTreeMap<i64, i64> = BTreeMap::new();
            for &(s, price, qty) in self.orders.values() {
                if s == side {
                    *m.entry(price).or_default() += qty;
                }
            }
            for (&(s, price), &qty) in &self.anon {
                if s == side as u8 {
                    *m.entry(price).or_default() += qty;
                }
            }
            m.retain(|_, q| *q > 0);
            let mut v: Vec<_> = m.into_iter().collect();
            if side == Side::Bid {
                v.reverse();
            }
            v
        }
        fn best(&self, side: Side) -> Option<i64> {
            let orders = self.orders.values().filter(|o| o.0 == side).map(|o| o.1);
            let anon =
                self.anon.iter().filter(|(k, q)| k.0 == side as u8 && **q > 0).map(|(k, _)| k.1);
            let all = orders.chain(anon);
            match side {
                Side::Bid => all.max(),
                Side::Ask => all.min(),
            }
        }
        fn random_live(&self, rng: &mut Rng) -> Option<u64> {
            if self.orders.is_empty() {
                return None;
            }
            let i = rng.below(self.orders.len() as u64) as usize;
            self.orders.keys().nth(i).copied()
        }
    }

    /// A whole-unit quantity in `1..=rest` (raw units).
    fn part(rng: &mut Rng, rest: i64) -> i64 {
        let units = rest / Qty::from_units(1).raw();
        (1 + rng.below(units as u64) as i64) * Qty::from_units(1).raw()
    }

    fn take(model: &mut Model, id: u64, qty: i64) {
        let o = model.orders.get_mut(&id).unwrap();
        o.2 -= qty;
        if o.2 == 0 {
            model.orders.remove(&id);
        }
    }

    /// Random valid streams: the emitted updates rebuild the ladder after every event and the
    /// ladder equals a recomputation from the live orders.
    #[test]
    fn random_streams_keep_l2_in_step() {
        for seed in 0..45u64 {
            let venue = [Venue::Sse, Venue::Szse, Venue::Lobster][(seed % 3) as usize];
            let mut rng = Rng::new(seed);
            let mut book = L3Book::new(venue);
            let mut l2 = OrderBook::new();
            let mut model = Model { orders: BTreeMap::new(), anon: BTreeMap::new(), next_id: 1 };
            let mid: i64 = 10_000;
            let tick: i64 = 1_000_000; // 0.01
            if venue == Venue::Lobster {
                for d in 1..=5 {
                    let (bp, ap) = (mid - d * tick, mid + d * tick);
                    book.seed_level(Side::Bid, Price::from_raw(bp), Qty::from_units(d));
                    book.seed_level(Side::Ask, Price::from_raw(ap), Qty::from_units(d));
                    model.anon.insert((Side::Bid as u8, bp), Qty::from_units(d).raw());
                    model.anon.insert((Side::Ask as u8, ap), Qty::from_units(d).raw());
                }
            }
            let mut expect = L3Counters::default();
            let mut seq = 0u64;
            for step in 0..1_500u64 {
                let r = rng.below(100);
                let msg = if r < 40 || model.orders.is_empty() {
                    // a passive add that does not cross
                    let side = if rng.chance(1, 2) { Side::Bid } else { Side::Ask };
                    let d = rng.top_skewed(40) as i64;
                    let price = match side {
                        Side::Bid => model.best(Side::Ask).unwrap_or(mid + tick) - (1 + d) * tick,
                        Side::Ask => model.best(Side::Bid).unwrap_or(mid - tick) + (1 + d) * tick,
                    };
                    let qty = (1 + rng.below(50) as i64) * 100;
                    let id = model.next_id;
                    model.next_id += 1 + rng.below(3);
                    model.orders.insert(id, (side, price, Qty::from_units(qty).raw()));
                    expect.adds += 1;
                    Msg::Add { id, side, price: Price::from_raw(price), qty: Qty::from_units(qty) }
                } else if r < 75 {
                    let id = model.random_live(&mut rng).unwrap();
                    let (side, price, rest) = model.orders[&id];
                    let qty = if rng.chance(2, 3) { rest } else { part(&mut rng, rest) };
                    take(&mut model, id, qty);
                    expect.cancels += 1;
                    if venue == Venue::Szse {
                        let (b, s) = if side == Side::Bid { (id, 0) } else { (0, id) };
                        Msg::Trade {
                            buy_id: b,
                            sell_id: s,
                            price: Price::ZERO,
                            qty: Qty::from_raw(qty),
                            kind: TradeKind::Cancel,
                        }
                    } else {
                        Msg::Cancel {
                            id,
                            side,
                            price: Price::from_raw(price),
                            qty: Qty::from_raw(qty),
                        }
                    }
                } else if r < 95 {
                    // an aggressive order hits the best resting order of one side
                    let passive_side = if rng.chance(1, 2) { Side::Bid } else { Side::Ask };
                    let Some(best) = model.best(passive_side) else { continue };
                    let resting: Vec<u64> = model
                        .orders
                        .iter()
                        .filter(|(_, o)| o.0 == passive_side && o.1 == best)
                        .map(|(&id, _)| id)
                        .collect();
                    let aggressor = model.next_id;
                    model.next_id += 1;
                    let kind = if passive_side == Side::Ask {
                        TradeKind::BuyInitiated
                    } else {
                        TradeKind::SellInitiated
                    };
                    if resting.is_empty() {
                        // only anonymous liquidity at the top (LOBSTER): execute it by price
                        let key = (passive_side as u8, best);
                        let avail = model.anon[&key];
                        let qty = part(&mut rng, avail);
                        *model.anon.get_mut(&key).unwrap() -= qty;
                        expect.executions += 1;
                        expect.unknown_order_adjustments += 1;
                        Msg::Execute {
                            id: 900_000_000 + step,
                            side: passive_side,
                            price: Price::from_raw(best),
                            qty: Qty::from_raw(qty),
                        }
                    } else {
                        let id = resting[rng.below(resting.len() as u64) as usize];
                        let rest = model.orders[&id].2;
                        let qty = part(&mut rng, rest);
                        take(&mut model, id, qty);
                        if venue == Venue::Lobster && rng.chance(1, 2) {
                            expect.executions += 1;
                            Msg::Execute {
                                id,
                                side: passive_side,
                                price: Price::from_raw(best),
                                qty: Qty::from_raw(qty),
                            }
                        } else {
                            expect.trades += 1;
                            let (buy_id, sell_id) = if passive_side == Side::Ask {
                                (aggressor, id)
                            } else {
                                (id, aggressor)
                            };
                            // SZSE publishes every order: give the aggressor as id 0 (no order)
                            let (buy_id, sell_id) = match venue {
                                Venue::Szse if passive_side == Side::Ask => (0, sell_id),
                                Venue::Szse => (buy_id, 0),
                                _ => {
                                    expect.unseen_order_refs += 1;
                                    (buy_id, sell_id)
                                }
                            };
                            Msg::Trade {
                                buy_id,
                                sell_id,
                                price: Price::from_raw(best),
                                qty: Qty::from_raw(qty),
                                kind,
                            }
                        }
                    }
                } else {
                    // a cancel naming an order that is not live
                    let id = model.next_id + 1_000_000;
                    expect.cancels += 1;
                    let side = if rng.chance(1, 2) { Side::Bid } else { Side::Ask };
                    let price = Price::from_raw(mid + (rng.below(20) as i64 - 10) * tick);
                    if venue == Venue::Lobster {
                        // adjusts the level by price; mirror that in the model's anonymous part
                        // only where anonymous liquidity suffices, else skip the event
                        let key = (side as u8, price.raw());
                        let avail = model.anon.get(&key).copied().unwrap_or(0);
                        if avail == 0 {
                            expect.cancels -= 1;
                            continue;
                        }
                        let qty = part(&mut rng, avail);
                        *model.anon.get_mut(&key).unwrap() -= qty;
                        expect.unknown_order_adjustments += 1;
                        Msg::Cancel { id, side, price, qty: Qty::from_raw(qty) }
                    } else {
                        expect.cancels_not_found += 1;
                        Msg::Cancel { id, side, price, qty: Qty::from_units(1) }
                    }
                };
                seq += 1;
                assert_eq!(book.handle(3, seq, msg), Ok(Handled::Applied));
                for u in book.drain_updates() {
                    l2.apply_update(u);
                }
                assert_eq!(&l2, book.ladder(), "seed {seed} step {step}: L2 from updates");
                let got_b: Vec<_> =
                    book.ladder().bids.iter().map(|l| (l.price.raw(), l.qty.raw())).collect();
                let got_a: Vec<_> =
                    book.ladder().asks.iter().map(|l| (l.price.raw(), l.qty.raw())).collect();
                assert_eq!(got_b, model.levels(Side::Bid), "seed {seed} step {step}: bids");
                assert_eq!(got_a, model.levels(Side::Ask), "seed {seed} step {step}: asks");
                for (side, got) in [(Side::Bid, &got_b), (Side::Ask, &got_a)] {
                    let mut idx: Vec<(i64, i64)> = book.level_qty[side as usize]
                        .iter()
                        .map(|(&p, &q)| (p as i64, q))
                        .collect();
                    idx.sort_unstable_by_key(|l| if side == Side::Bid { -l.0 } else { l.0 });
                    assert_eq!(&idx, got, "seed {seed} step {step}: level index");
                }
                assert!(!book.is_crossed(), "seed {seed} step {step}");
                assert_eq!(book.order_count(), model.orders.len());
            }
            for (id, o) in book.orders() {
                let m = model.orders[&id];
                assert_eq!((o.side, o.price.raw(), o.qty.raw()), m);
            }
            let c = *book.counters();
            assert_eq!(c.adds, expect.adds, "seed {seed}");
            assert_eq!(c.cancels, expect.cancels, "seed {seed}");
            assert_eq!(c.trades, expect.trades, "seed {seed}");
            assert_eq!(c.executions, expect.executions, "seed {seed}");
            assert_eq!(c.unseen_order_refs, expect.unseen_order_refs, "seed {seed}");
            assert_eq!(c.cancels_not_found, expect.cancels_not_found, "seed {seed}");
            assert_eq!(
                c.unknown_order_adjustments, expect.unknown_order_adjustments,
                "seed {seed}"
            );
            assert_eq!(c.trades_not_found, 0);
            assert_eq!(c.negative_qty_clamped, 0);
            assert_eq!(c.invalid, 0);
            assert_eq!(c.seq_gaps + c.seq_duplicates, 0);
        }
    }

    /// Random sequence numbers with duplicates and gaps: the sequenced book equals a book fed
    /// only the messages a correct sequencer would apply.
    #[test]
    fn random_sequencing_matches_reference() {
        for seed in 0..20u64 {
            let mut rng = Rng::new(1000 + seed);
            let mut book = L3Book::new(Venue::Sse);
            let mut reference = L3Book::new(Venue::Sse);
            let mut last = 0u64;
            let (mut dups, mut gaps) = (0u64, 0u64);
            let mut gap_open = false;
            let mut skipped = false;
            for i in 0..500u64 {
                let seq = match rng.below(10) {
                    0 if last > 0 => 1 + rng.below(last), // duplicate
                    1 => last + 2 + rng.below(3),         // gap
                    _ => last + 1,
                };
                let msg = add(i + 1, Side::Bid, "1", 1 + rng.below(9) as i64);
                let r = book.handle(0, seq, msg);
                if last == 0 || seq == last + 1 {
                    assert_eq!(r, Ok(Handled::Applied));
                    reference.apply(msg);
                    last = seq;
                    gap_open = false;
                } else if seq <= last {
                    assert_eq!(r, Ok(Handled::Duplicate));
                    dups += 1;
                } else {
                    assert_eq!(r, Err(SeqGap { channel: 0, expected: last + 1, got: seq }));
                    if !gap_open {
                        gaps += 1;
                    }
                    gap_open = true;
                    if rng.chance(1, 2) {
                        book.skip_gap(0, seq);
                        skipped = true;
                        assert_eq!(book.handle(0, seq, msg), Ok(Handled::Applied));
                        reference.apply(msg);
                        last = seq;
                        gap_open = false;
                    }
                }
                assert_eq!(book.is_stale(), gap_open || skipped);
                assert_eq!(book.ladder(), reference.ladder());
            }
            assert_eq!(book.counters().seq_duplicates, dups);
            assert_eq!(book.counters().seq_gaps, gaps);
        }
    }
}
