//! [`VenueSync`]: one venue book kept in sync by that venue's own rules.

use std::collections::VecDeque;

use crate::book::{Level, OrderBook, Side};
use crate::sync::{ResyncReason, SyncEvent, SyncState, SyncStats};

use super::{checksum, ChecksumRule, NumberFormat, Printed, PrintedLevels, SequenceRule};

/// How one book of one venue is synced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VenueSyncConfig {
    pub sequence: SequenceRule,
    pub checksum: ChecksumRule,
    /// Levels kept per side after each message: Kraken drops the levels beyond the subscribed
    /// depth and expects its clients to; a depth-limited channel of any venue is kept the same.
    pub depth: Option<usize>,
    /// How the venue prints prices and quantities, from the instrument's metadata (Kraken's
    /// precisions); `None` learns it from the strings received ([`Printed`], OKX).
    pub price_format: Option<NumberFormat>,
    pub qty_format: Option<NumberFormat>,
}

impl VenueSyncConfig {
    /// A venue's rules, formats to be learnt.
    pub fn new(sequence: SequenceRule, checksum: ChecksumRule) -> Self {
        Self { sequence, checksum, depth: None, price_format: None, qty_format: None }
    }
}

/// One book message of a venue, its levels already read into fixed point.
#[derive(Debug, Clone, Copy, Default)]
pub struct BookMessage<'a> {
    /// A snapshot replaces the book; an update changes the levels it names.
    pub snapshot: bool,
    /// The message's own sequence number: OKX `seqId`, Bybit `u`, Coinbase `sequence_num`.
    pub seq: Option<u64>,
    /// The previous message's sequence number, where the venue sends it: OKX `prevSeqId`
    /// (`None` for the snapshot's -1).
    pub prev_seq: Option<u64>,
    /// Changed bid levels, absolute quantities; zero removes the level.
    pub bids: &'a [Level],
    pub asks: &'a [Level],
    /// The checksum the venue sent, as a 32-bit pattern (OKX's signed value cast).
    pub checksum: Option<u32>,
    /// How this message printed its numbers, for a book learning its venue's format; `None`
    /// when the parser could not tell (numbers that arrived as JSON numbers).
    pub printed: Option<PrintedLevels>,
}

impl BookMessage<'_> {
    fn is_empty(&self) -> bool {
        self.bids.is_empty() && self.asks.is_empty()
    }
}

/// What a connection-wide sequence says about one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionVerdict {
    First,
    Next,
    /// At or below the last one: a duplicate, dropped.
    Duplicate,
    /// Messages `expected..got` were lost.
    Gap {
        expected: u64,
        got: u64,
    },
}

/// A sequence counted per connection across all its channels (Coinbase `sequence_num`): a gap
/// means a message of one of the connection's books was lost, and each of them resyncs.
#[derive(Debug, Clone, Default)]
pub struct ConnectionSequence {
    last: Option<u64>,
    pub gaps: u64,
    pub duplicates: u64,
}

impl ConnectionSequence {
    /// A new connection counts from its first message.
    pub fn reset(&mut self) {
        self.last = None;
    }

    pub fn observe(&mut self, seq: u64) -> ConnectionVerdict {
        let verdict = match self.last {
            None => ConnectionVerdict::First,
            Some(last) if seq <= last => ConnectionVerdict::Duplicate,
            Some(last) if seq == last + 1 => ConnectionVerdict::Next,
            Some(last) => ConnectionVerdict::Gap { expected: last + 1, got: seq },
        };
        match verdict {
            ConnectionVerdict::Duplicate => self.duplicates += 1,
            ConnectionVerdict::Gap { .. } => self.gaps += 1,
            ConnectionVerdict::First | ConnectionVerdict::Next => {}
        }
        if verdict != ConnectionVerdict::Duplicate {
            self.last = Some(seq);
        }
        verdict
    }
}

/// One venue book: snapshots and updates in, [`SyncEvent`]s out (drain [`Self::poll_event`]).
///
/// States: [`SyncState::AwaitingSnapshot`] (every book starts there, and goes back after a gap,
/// a checksum mismatch or a lost connection: updates are dropped until the venue's next
/// snapshot) and [`SyncState::Synced`]. The update ids of the events are the machine's own
/// count of applied messages, one more per message across resyncs (Kraken has no sequence);
/// the venue's sequence is [`Self::last_seq`].
#[derive(Debug, Clone)]
pub struct VenueSync {
    config: VenueSyncConfig,
    state: SyncState,
    book: OrderBook,
    last_seq: Option<u64>,
    update_id: u64,
    printed: PrintedLevels,
    /// Whether any message since the snapshot said how its numbers were printed: a format is
    /// learnt only from strings seen, never assumed.
    learnable: bool,
    /// Whether the last message's checksum could not be checked (reported once per run of them).
    unchecked: bool,
    events: VecDeque<SyncEvent>,
    stats: SyncStats,
    scratch: String,
}

impl VenueSync {
    pub fn new(config: VenueSyncConfig) -> Self {
        Self {
            config,
            state: SyncState::AwaitingSnapshot,
            book: OrderBook::new(),
            last_seq: None,
            update_id: 0,
            printed: PrintedLevels::default(),
            learnable: false,
            unchecked: false,
            events: VecDeque::new(),
            stats: SyncStats::default(),
            scratch: String::new(),
        }
    }

    pub fn config(&self) -> &VenueSyncConfig {
        &self.config
    }

    pub fn state(&self) -> SyncState {
        self.state
    }

    pub fn is_synced(&self) -> bool {
        self.state == SyncState::Synced
    }

    pub fn book(&self) -> &OrderBook {
        &self.book
    }

    /// The machine's count of applied messages (see the type's docs).
    pub fn last_update_id(&self) -> u64 {
        self.update_id
    }

    /// The venue's sequence number of the last message applied.
    pub fn last_seq(&self) -> Option<u64> {
        self.last_seq
    }

    pub fn stats(&self) -> &SyncStats {
        &self.stats
    }

    pub fn poll_event(&mut self) -> Option<SyncEvent> {
        self.events.pop_front()
    }

    /// One book message of the venue.
    pub fn handle_message(&mut self, m: BookMessage<'_>) {
        // Bybit's u = 1: the service restarted, and this message is the whole book (a snapshot,
        // or a delta that must be taken as one)
        let restart = self.config.sequence == SequenceRule::Bybit && m.seq == Some(1);
        if m.snapshot || restart {
            if restart && self.last_seq.is_some() {
                self.stats.sequence_resets += 1;
                self.events.push_back(SyncEvent::SequenceReset { from: self.last_seq, to: 1 });
            }
            self.apply_snapshot(m);
            return;
        }
        if self.state != SyncState::Synced {
            self.stats.unsynced_dropped += 1;
            return;
        }
        match self.continuity(&m) {
            Continuity::Apply => {}
            Continuity::Heartbeat => {
                self.stats.heartbeats += 1;
                return;
            }
            Continuity::Stale => {
                self.stats.stale_dropped += 1;
                let id = m.seq.unwrap_or_default();
                self.events.push_back(SyncEvent::DroppedStale { first_id: id, last_id: id });
                return;
            }
            Continuity::Gap => {
                self.stats.gaps += 1;
                self.events.push_back(SyncEvent::GapDetected {
                    last_update_id: self.last_seq.unwrap_or_default(),
                    first_id: m.seq.unwrap_or_default(),
                    prev_last_id: m.prev_seq,
                });
                self.resync(ResyncReason::Gap);
                return;
            }
        }
        for l in m.bids {
            self.book.bids.apply(l.price, l.qty);
        }
        for l in m.asks {
            self.book.asks.apply(l.price, l.qty);
        }
        self.stats.levels_applied += (m.bids.len() + m.asks.len()) as u64;
        self.stats.deltas_applied += 1;
        self.after_apply(m);
        if self.state == SyncState::Synced {
            self.events.push_back(SyncEvent::BookChanged { last_update_id: self.update_id });
        }
    }

    /// The connection's sequence lost a message ([`ConnectionSequence`]): this book may miss it.
    pub fn handle_lost_message(&mut self) {
        if self.state == SyncState::Synced {
            self.stats.gaps += 1;
            self.resync(ResyncReason::Gap);
        }
    }

    /// A periodic verification compared the venue's REST book with this book at the same point
    /// of the venue's stream (see [`differing_levels`]): `differing` levels disagreed. Equal is
    /// a verification; any difference is drift, reported ([`SyncEvent::Drift`]) and resynced.
    /// A book that is not synced (it resynced meanwhile) counts the verification as abandoned.
    pub fn handle_verification(&mut self, differing: usize) {
        if self.state != SyncState::Synced {
            self.stats.verifications_abandoned += 1;
            return;
        }
        self.stats.verifications += 1;
        if differing > 0 {
            self.stats.drift_events += 1;
            self.stats.drift_levels += differing as u64;
            let last_update_id = self.last_update_id();
            self.events.push_back(SyncEvent::Drift { last_update_id, drift_levels: differing });
            self.resync(ResyncReason::Drift);
        }
    }

    /// A periodic verification could not be made (the REST book failed, or it was of a point of
    /// the stream the book did not keep): counted.
    pub fn handle_verification_abandoned(&mut self) {
        self.stats.verifications_abandoned += 1;
    }

    /// The connection dropped: the book waits for the snapshot its resubscription brings.
    pub fn handle_connection_lost(&mut self) {
        if self.state == SyncState::Synced {
            self.resync(ResyncReason::ConnectionLost);
        }
        self.last_seq = None;
    }

    fn continuity(&self, m: &BookMessage<'_>) -> Continuity {
        let (Some(last), Some(seq)) = (self.last_seq, m.seq) else {
            // a message without a sequence (OKX captures from before `seqId`, Kraken): the
            // checksum is all there is
            return Continuity::Apply;
        };
        match self.config.sequence {
            SequenceRule::Okx => match m.prev_seq {
                Some(prev) if prev == last => {
                    if seq == prev && m.is_empty() {
                        Continuity::Heartbeat
                    } else {
                        Continuity::Apply
                    }
                }
                _ if seq == last => Continuity::Stale,
                Some(prev) if prev < last && seq <= last => Continuity::Stale,
                _ => Continuity::Gap,
            },
            SequenceRule::Bybit => {
                if seq <= last {
                    Continuity::Stale
                } else if seq == last + 1 {
                    Continuity::Apply
                } else {
                    Continuity::Gap
                }
            }
            SequenceRule::Connection | SequenceRule::None => Continuity::Apply,
        }
    }

    fn apply_snapshot(&mut self, m: BookMessage<'_>) {
        self.book.clear();
        for l in m.bids.iter().filter(|l| !l.qty.is_zero()) {
            self.book.bids.apply(l.price, l.qty);
        }
        for l in m.asks.iter().filter(|l| !l.qty.is_zero()) {
            self.book.asks.apply(l.price, l.qty);
        }
        self.printed = PrintedLevels::default();
        self.learnable = false;
        self.unchecked = false;
        self.stats.snapshots_applied += 1;
        let was_synced = self.state == SyncState::Synced;
        self.state = SyncState::Synced;
        self.after_apply(m);
        if self.state == SyncState::Synced {
            if was_synced {
                self.events.push_back(SyncEvent::BookChanged { last_update_id: self.update_id });
            } else {
                self.events.push_back(SyncEvent::Synced { last_update_id: self.update_id });
            }
        }
    }

    /// What every applied message shares: the sequence moves on, depth is cut, the checksum is
    /// checked and a crossed book reported.
    fn after_apply(&mut self, m: BookMessage<'_>) {
        if let (Some(prev), Some(seq)) = (m.prev_seq, m.seq) {
            if self.config.sequence == SequenceRule::Okx && seq < prev {
                self.stats.sequence_resets += 1;
                self.events.push_back(SyncEvent::SequenceReset { from: Some(prev), to: seq });
            }
        }
        if m.seq.is_some() {
            self.last_seq = m.seq;
        }
        self.update_id += 1;
        if let Some(depth) = self.config.depth {
            self.book.bids.truncate(depth);
            self.book.asks.truncate(depth);
        }
        if let Some(p) = m.printed {
            self.learnable = true;
            self.printed.price.merge(p.price);
            self.printed.qty.merge(p.qty);
        }
        self.check_sum(m.checksum);
        if self.state == SyncState::Synced && self.book.is_crossed() {
            self.stats.crossed += 1;
            self.events.push_back(SyncEvent::Crossed { last_update_id: self.update_id });
        }
    }

    fn check_sum(&mut self, sent: Option<u32>) {
        let rule = self.config.checksum;
        if rule == ChecksumRule::None {
            return;
        }
        let computed = match (sent, self.formats()) {
            (Some(_), Some((price, qty))) => match rule {
                ChecksumRule::Okx => {
                    checksum::okx(&self.book, price, qty, &mut self.scratch).map(|c| c as u32)
                }
                ChecksumRule::Kraken => checksum::kraken(&self.book, price, qty, &mut self.scratch),
                ChecksumRule::None => None,
            },
            _ => None,
        };
        let (Some(expected), Some(computed)) = (sent, computed) else {
            self.stats.checksums_unchecked += 1;
            if !self.unchecked {
                self.unchecked = true;
                self.events
                    .push_back(SyncEvent::ChecksumUnchecked { last_update_id: self.update_id });
            }
            return;
        };
        self.unchecked = false;
        if expected == computed {
            self.stats.checksums_verified += 1;
            return;
        }
        self.stats.checksum_mismatches += 1;
        self.events.push_back(SyncEvent::ChecksumMismatch {
            last_update_id: self.update_id,
            expected,
            computed,
        });
        self.resync(ResyncReason::ChecksumMismatch);
    }

    fn formats(&self) -> Option<(NumberFormat, NumberFormat)> {
        let learnable = self.learnable;
        let learnt = |given: Option<NumberFormat>, seen: Printed| {
            given.or_else(|| learnable.then(|| seen.format()).flatten())
        };
        Some((
            learnt(self.config.price_format, self.printed.price)?,
            learnt(self.config.qty_format, self.printed.qty)?,
        ))
    }

    fn resync(&mut self, reason: ResyncReason) {
        if self.state == SyncState::Synced {
            self.stats.resyncs += 1;
        }
        self.state = SyncState::AwaitingSnapshot;
        self.events.push_back(SyncEvent::NeedSnapshot { reason });
    }
}

/// How many of the best `n` levels a side of `bids` / `asks` (a venue's REST book, best first)
/// and of `book` disagree, position by position (a price or a quantity that differs, or a level
/// one has and the other not).
pub fn differing_levels(book: &OrderBook, bids: &[Level], asks: &[Level], n: usize) -> usize {
    let side = |ours: &crate::book::Ladder, theirs: &[Level]| {
        let theirs = &theirs[..theirs.len().min(n)];
        let mine = ours.len().min(n);
        let same = ours.iter().take(n).zip(theirs).filter(|(a, b)| a == *b).count();
        mine.max(theirs.len()) - same
    };
    side(book.side(Side::Bid), bids) + side(book.side(Side::Ask), asks)
}

/// One side of a book, best first, for [`differing_between`].
#[derive(Debug, Clone, Copy)]
pub struct SideView<'a> {
    pub ours: &'a [Level],
    pub theirs: &'a [Level],
    /// Prices the venue's next message changed: the REST book may stand on either side of those
    /// changes, so they are not compared.
    pub touched: &'a [crate::fixed::Price],
}

/// How many levels of a venue's REST book of a point between two messages disagree with the
/// book after the earlier one (`ours`), by price: a venue sends what changed up to a point in its
/// next message, so a price that message did not change stood the same at every point between
/// the two, and must be the same in the REST book; a price it changed is skipped. Each list is at
/// most `n` levels long; a list of `n` is cut, so only prices at least as good as the better of
/// the two lists' `n`-th levels (where both are complete) are compared. `bid` says how a side is ordered.
pub fn differing_between(side: SideView<'_>, bid: bool, n: usize) -> usize {
    let better_or_eq =
        |a: crate::fixed::Price, b: crate::fixed::Price| if bid { a >= b } else { a <= b };
    let cut = |l: &[Level]| (l.len() >= n).then(|| l[n - 1].price);
    let edge = match (cut(side.ours), cut(side.theirs)) {
        (Some(a), Some(b)) => Some(if better_or_eq(a, b) { a } else { b }),
        (a, b) => a.or(b),
    };
    let in_range = |p: crate::fixed::Price| {
        edge.is_none_or(|e| better_or_eq(p, e)) && !side.touched.contains(&p)
    };
    let qty = |l: &[Level], p: crate::fixed::Price| l.iter().find(|x| x.price == p).map(|x| x.qty);
    let mut differing = 0;
    for l in side.ours.iter().take(n).filter(|l| in_range(l.price)) {
        if qty(side.theirs, l.price) != Some(l.qty) {
            differing += 1;
        }
    }
    for l in side.theirs.iter().take(n).filter(|l| in_range(l.price)) {
        if qty(side.ours, l.price).is_none() {
            differing += 1;
        }
    }
    differing
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Continuity {
    Apply,
    Heartbeat,
    Stale,
    Gap,
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;
    use crate::fixed::{Price, Qty};

    fn lv(p: &str, q: &str) -> Level {
        Level::new(Price::parse(p).unwrap(), Qty::parse(q).unwrap())
    }

    fn printed(levels: &[(&str, &str)]) -> PrintedLevels {
        let mut p = PrintedLevels::default();
        for (price, qty) in levels {
            p.price.observe(price.as_bytes());
            p.qty.observe(qty.as_bytes());
        }
        p
    }

    fn events(s: &mut VenueSync) -> Vec<SyncEvent> {
        std::iter::from_fn(|| s.poll_event()).collect()
    }

    fn okx() -> VenueSync {
        VenueSync::new(VenueSyncConfig::new(SequenceRule::Okx, ChecksumRule::None))
    }

    fn okx_msg<'a>(
        snapshot: bool,
        seq: u64,
        prev: Option<u64>,
        bids: &'a [Level],
        asks: &'a [Level],
    ) -> BookMessage<'a> {
        BookMessage { snapshot, seq: Some(seq), prev_seq: prev, bids, asks, ..Default::default() }
    }

    #[test]
    fn okx_updates_continue_the_previous_seq_id() {
        let mut s = okx();
        let bids = [lv("100", "1")];
        let asks = [lv("101", "2")];
        s.handle_message(okx_msg(true, 10, None, &bids, &asks));
        assert_eq!(events(&mut s), [SyncEvent::Synced { last_update_id: 1 }]);
        s.handle_message(okx_msg(false, 15, Some(10), &[lv("100", "0")], &[]));
        assert_eq!(s.book().best_bid(), None);
        assert_eq!(s.last_seq(), Some(15));
        // heartbeat: seqId == prevSeqId, no levels
        s.handle_message(okx_msg(false, 15, Some(15), &[], &[]));
        assert_eq!(s.stats().heartbeats, 1);
        // a duplicate of the last message is dropped
        s.handle_message(okx_msg(false, 15, Some(10), &[lv("100", "0")], &[]));
        assert_eq!(s.stats().stale_dropped, 1);
        // a reset after maintenance: seqId below prevSeqId, continued from
        s.handle_message(okx_msg(false, 3, Some(15), &[lv("99", "1")], &[]));
        assert_eq!(s.stats().sequence_resets, 1);
        assert_eq!(s.last_seq(), Some(3));
        s.handle_message(okx_msg(false, 4, Some(3), &[lv("99", "2")], &[]));
        assert!(s.is_synced());
        assert_eq!(s.book().best_bid(), Some(lv("99", "2")));
        let ev = events(&mut s);
        assert!(ev.contains(&SyncEvent::SequenceReset { from: Some(15), to: 3 }), "{ev:?}");
        // a gap: prevSeqId is not the last seqId
        s.handle_message(okx_msg(false, 9, Some(7), &[lv("98", "1")], &[]));
        assert_eq!(s.state(), SyncState::AwaitingSnapshot);
        assert_eq!(s.stats().gaps, 1);
        assert_eq!(s.stats().resyncs, 1);
        assert!(events(&mut s).contains(&SyncEvent::NeedSnapshot { reason: ResyncReason::Gap }));
        // updates until the next snapshot are dropped, the snapshot syncs again
        s.handle_message(okx_msg(false, 10, Some(9), &[lv("98", "1")], &[]));
        assert_eq!(s.stats().unsynced_dropped, 1);
        s.handle_message(okx_msg(true, 20, None, &bids, &asks));
        assert!(s.is_synced());
        assert_eq!(s.book().best_bid(), Some(lv("100", "1")));
    }

    #[test]
    fn a_rest_book_at_the_same_point_verifies_or_finds_drift() {
        let mut s = okx();
        let bids = [lv("100", "1"), lv("99", "3")];
        let asks = [lv("101", "2")];
        s.handle_message(okx_msg(true, 10, None, &bids, &asks));
        events(&mut s);
        // the same levels: equal within the levels compared
        assert_eq!(differing_levels(s.book(), &bids, &asks, 20), 0);
        assert_eq!(differing_levels(s.book(), &bids[..1], &asks, 1), 0);
        s.handle_verification(0);
        assert_eq!((s.stats().verifications, s.stats().drift_events), (1, 0));
        assert!(s.is_synced());
        // a phantom level in ours, a quantity that differs, a level missing on one side
        let theirs_bids = [lv("100", "1"), lv("99", "4")];
        assert_eq!(differing_levels(s.book(), &theirs_bids, &asks, 20), 1);
        assert_eq!(differing_levels(s.book(), &bids, &[], 20), 1);
        assert_eq!(differing_levels(s.book(), &[lv("100.5", "1")], &asks, 20), 2);
        s.handle_verification(2);
        let st = s.stats();
        assert_eq!((st.verifications, st.drift_events, st.drift_levels, st.resyncs), (2, 1, 2, 1));
        let ev = events(&mut s);
        assert!(ev.contains(&SyncEvent::Drift { last_update_id: 1, drift_levels: 2 }), "{ev:?}");
        assert!(ev.contains(&SyncEvent::NeedSnapshot { reason: ResyncReason::Drift }), "{ev:?}");
        // while it resyncs, a verification's answer is abandoned
        s.handle_verification(0);
        s.handle_verification_abandoned();
        assert_eq!(s.stats().verifications_abandoned, 2);
        assert_eq!(s.stats().verifications, 2);
    }

    #[test]
    fn a_rest_book_between_two_messages_is_compared_where_the_next_left_it_alone() {
        let p = |s: &str| Price::parse(s).unwrap();
        let ours = [lv("100", "1"), lv("99", "2"), lv("98", "3")];
        // the next message changed 99: the REST book may show 99 either way
        let theirs = [lv("100", "1"), lv("99", "7"), lv("98", "3")];
        let touched = [p("99")];
        let view = |theirs, touched| SideView { ours: &ours, theirs, touched };
        assert_eq!(differing_between(view(&theirs, &touched), true, 20), 0);
        // untouched prices must agree: a phantom level of ours, one missing, another quantity
        assert_eq!(differing_between(view(&theirs, &[]), true, 20), 1);
        let phantom = [lv("100", "1"), lv("99", "2")];
        assert_eq!(differing_between(view(&phantom, &[]), true, 20), 1);
        let extra = [lv("100", "1"), lv("99", "2"), lv("98", "3"), lv("97.5", "1")];
        assert_eq!(differing_between(view(&extra, &[]), true, 20), 1);
        let other = [lv("100", "2"), lv("99", "2"), lv("98", "3")];
        assert_eq!(differing_between(view(&other, &touched), true, 20), 1);
        // lists cut at n: only prices at least as good as the worse n-th level are compared
        let cut = [lv("100", "1"), lv("99.5", "1")];
        assert_eq!(differing_between(view(&cut, &[p("99.5")]), true, 2), 0);
        // asks the other way round
        let asks = [lv("101", "1"), lv("102", "2")];
        let theirs = [lv("101", "1"), lv("102", "2"), lv("103", "1")];
        let v = SideView { ours: &asks, theirs: &theirs, touched: &[] };
        assert_eq!(differing_between(v, false, 2), 0, "103 is past both cuts");
        assert_eq!(differing_between(v, false, 3), 1, "ours lacks 103");
    }

    #[test]
    fn bybit_u_counts_messages_and_u_one_is_a_restart() {
        let mut s = VenueSync::new(VenueSyncConfig::new(SequenceRule::Bybit, ChecksumRule::None));
        let m = |snapshot, u, bids: &'static [Level]| BookMessage {
            snapshot,
            seq: Some(u),
            bids,
            ..Default::default()
        };
        let snap: &'static [Level] = Box::leak(Box::new([lv("5", "1"), lv("4", "1")]));
        let d: &'static [Level] = Box::leak(Box::new([lv("4", "0")]));
        s.handle_message(m(true, 100, snap));
        s.handle_message(m(false, 101, d));
        assert_eq!(s.book().bids.len(), 1);
        s.handle_message(m(false, 101, d));
        assert_eq!(s.stats().stale_dropped, 1);
        // u = 1: the service restarted and this message is the whole book
        s.handle_message(m(false, 1, snap));
        assert_eq!(s.book().bids.len(), 2);
        assert_eq!(s.stats().sequence_resets, 1);
        s.handle_message(m(false, 2, d));
        assert!(s.is_synced());
        // a later snapshot replaces the book
        s.handle_message(m(true, 50, d));
        assert!(s.book().bids.is_empty());
        // u skipping one: a gap
        s.handle_message(m(false, 52, d));
        assert_eq!(s.stats().gaps, 1);
        assert!(!s.is_synced());
    }

    #[test]
    fn a_connection_sequence_finds_lost_and_duplicate_messages() {
        let mut c = ConnectionSequence::default();
        assert_eq!(c.observe(0), ConnectionVerdict::First);
        assert_eq!(c.observe(1), ConnectionVerdict::Next);
        assert_eq!(c.observe(1), ConnectionVerdict::Duplicate);
        assert_eq!(c.observe(4), ConnectionVerdict::Gap { expected: 2, got: 4 });
        assert_eq!(c.observe(5), ConnectionVerdict::Next);
        c.reset();
        assert_eq!(c.observe(0), ConnectionVerdict::First);
        assert_eq!((c.gaps, c.duplicates), (1, 1));

        let mut s =
            VenueSync::new(VenueSyncConfig::new(SequenceRule::Connection, ChecksumRule::None));
        s.handle_message(BookMessage {
            snapshot: true,
            bids: &[lv("1", "1")],
            ..Default::default()
        });
        s.handle_lost_message();
        assert_eq!(s.state(), SyncState::AwaitingSnapshot);
        assert_eq!(s.stats().resyncs, 1);
    }

    /// OKX's checksum over strings typed here, not produced by the code under test.
    #[test]
    fn okx_checksum_is_checked_over_the_learnt_strings() {
        let mut s = VenueSync::new(VenueSyncConfig::new(SequenceRule::Okx, ChecksumRule::Okx));
        let raw = [("3366.1", "7"), ("3366.8", "9"), ("3366", "6"), ("3368", "8")];
        let bids = [lv("3366.1", "7"), lv("3366", "6")];
        let asks = [lv("3366.8", "9"), lv("3368", "8")];
        let sum = crc32fast::hash(b"3366.1:7:3366.8:9:3366:6:3368:8") as i32;
        s.handle_message(BookMessage {
            checksum: Some(sum as u32),
            printed: Some(printed(&raw)),
            ..okx_msg(true, 1, None, &bids, &asks)
        });
        let verified = s.stats().checksums_verified;
        assert_eq!(verified, 1, "{:?}", events(&mut s));
        // an update whose checksum is the book's after it
        let sum = crc32fast::hash(b"3366.1:7:3366.8:9:3366:6:3368:8:3365.5:0.25") as i32;
        let bid = [lv("3365.5", "0.25")];
        s.handle_message(BookMessage {
            checksum: Some(sum as u32),
            printed: Some(printed(&[("3365.5", "0.25")])),
            ..okx_msg(false, 2, Some(1), &bid, &[])
        });
        assert_eq!(s.stats().checksums_verified, 2);
        // a wrong one resyncs the book
        s.handle_message(BookMessage {
            checksum: Some(12345),
            printed: Some(printed(&[("3365.5", "1")])),
            ..okx_msg(false, 3, Some(2), &[lv("3365.5", "1")], &[])
        });
        assert_eq!(s.stats().checksum_mismatches, 1);
        assert!(events(&mut s)
            .contains(&SyncEvent::NeedSnapshot { reason: ResyncReason::ChecksumMismatch }));
        assert_eq!(s.state(), SyncState::AwaitingSnapshot);
    }

    #[test]
    fn padded_strings_are_reproduced_with_their_zeros_and_mixed_ones_are_unchecked() {
        let mut s = VenueSync::new(VenueSyncConfig::new(SequenceRule::Okx, ChecksumRule::Okx));
        let bids = [lv("10.50", "1.000")];
        let asks = [lv("10.60", "2.500")];
        let sum = crc32fast::hash(b"10.50:1.000:10.60:2.500") as i32;
        s.handle_message(BookMessage {
            checksum: Some(sum as u32),
            printed: Some(printed(&[("10.50", "1.000"), ("10.60", "2.500")])),
            ..okx_msg(true, 1, None, &bids, &asks)
        });
        assert_eq!(s.stats().checksums_verified, 1);
        // a string with other places than the padded ones: no format fits every string
        s.handle_message(BookMessage {
            checksum: Some(1),
            printed: Some(printed(&[("10.4", "1.000")])),
            ..okx_msg(false, 2, Some(1), &[lv("10.4", "1")], &[])
        });
        assert_eq!(s.stats().checksums_unchecked, 1);
        assert_eq!(s.stats().checksum_mismatches, 0);
        assert!(s.is_synced());
        assert!(events(&mut s).contains(&SyncEvent::ChecksumUnchecked { last_update_id: 2 }));
        // a message without the checksum it should carry is unchecked too
        s.handle_message(okx_msg(false, 3, Some(2), &[], &[]));
        assert_eq!(s.stats().checksums_unchecked, 2);
    }

    #[test]
    fn numbers_whose_printing_is_unknown_leave_the_checksum_unchecked() {
        // Kraken v2 sends JSON numbers: without the pair's precisions nothing says how Kraken
        // printed them for its checksum
        let mut s = VenueSync::new(VenueSyncConfig::new(SequenceRule::None, ChecksumRule::Kraken));
        let bids = [lv("45283.5", "0.1")];
        s.handle_message(BookMessage {
            snapshot: true,
            bids: &bids,
            checksum: Some(1),
            ..Default::default()
        });
        assert!(s.is_synced());
        assert_eq!((s.stats().checksums_unchecked, s.stats().checksum_mismatches), (1, 0));
    }

    #[test]
    fn kraken_books_keep_their_depth_and_check_with_the_instrument_precision() {
        let mut config = VenueSyncConfig::new(SequenceRule::None, ChecksumRule::Kraken);
        config.depth = Some(2);
        config.price_format = Some(NumberFormat::Fixed(1));
        config.qty_format = Some(NumberFormat::Fixed(8));
        let mut s = VenueSync::new(config);
        let bids = [lv("45283.5", "0.1"), lv("45283.4", "1.5")];
        let asks = [lv("45285.2", "0.001"), lv("45286.4", "1.54582015")];
        // asks low to high then bids high to low, each price then quantity, '.' and leading
        // zeros removed
        let sum = crc32fast::hash(b"45285210000045286415458201545283510000000452834150000000");
        s.handle_message(BookMessage {
            snapshot: true,
            bids: &bids,
            asks: &asks,
            checksum: Some(sum),
            ..Default::default()
        });
        let verified = s.stats().checksums_verified;
        assert_eq!(verified, 1, "{:?}", events(&mut s));
        // a better bid pushes the worst one out of the subscribed depth
        let better = [lv("45284", "2")];
        let sum = crc32fast::hash(b"45285210000045286415458201545284020000000045283510000000");
        s.handle_message(BookMessage { bids: &better, checksum: Some(sum), ..Default::default() });
        assert_eq!(s.book().bids.len(), 2);
        let verified = s.stats().checksums_verified;
        assert_eq!(verified, 2, "{:?}", events(&mut s));
        // a quantity with more places than the instrument prints cannot be checked
        let fine = [lv("45284.05", "1")];
        s.handle_message(BookMessage { bids: &fine, checksum: Some(sum), ..Default::default() });
        assert_eq!(s.stats().checksums_unchecked, 1);
    }
}
