//! The local order-book sync state machine (seeds/local-order-book-snapshot-delta-sync.md),
//! sans-IO.
//!
//! One [`BookSync`] keeps one L2 book in step with a source that publishes a REST/stream
//! snapshot carrying an update id plus a stream of deltas carrying first/last update ids
//! (`U`/`u`, and on Binance futures the previous event's last id `pu`). The same type runs in
//! the server against Binance and in the browser against millrace's own `depth_update` stream.
//!
//! Inputs: [`BookSync::handle_delta`], [`BookSync::handle_snapshot`],
//! [`BookSync::handle_snapshot_failed`], [`BookSync::handle_connection_lost`],
//! [`BookSync::handle_timeout`] (call at [`BookSync::poll_timeout`]). Outputs: drain
//! [`BookSync::poll_event`]. The caller owns all IO and the clock.
//!
//! ## The algorithm (Binance's numbered steps, and the seed's)
//! 1. Subscribe to deltas and buffer them ([`SyncState::AwaitingSnapshot`]); ask for a snapshot
//!    ([`SyncEvent::NeedSnapshot`]).
//! 2. Apply the snapshot (its update id `S` becomes `last`), then walk the buffer: drop stale
//!    events, and the first event that bridges the snapshot is applied; if the first non-stale
//!    event does not bridge, the snapshot is too old and a new one is needed.
//!    - spot rule ([`ContinuityRule::Spot`], also millrace's own API): stale if `u <= S`,
//!      bridge if `U <= S + 1 <= u`;
//!    - futures rule ([`ContinuityRule::Futures`]): stale if `u < S`, bridge if `U <= S <= u`.
//! 3. Continuity while synced:
//!    - spot: `u <= last` is stale (dropped); `U > last + 1` is a gap; otherwise apply (an
//!      overlapping event carries absolute quantities as of `u`, so applying it is exact);
//!    - futures: `u <= last` is stale; `pu != last` is a gap; otherwise apply.
//! 4. A gap, a checksum mismatch or a lost connection throws the book back to step 1.
//! 5. Periodic verification: every `verify_interval_ms` a fresh snapshot is requested
//!    ([`SyncEvent::VerifyDue`]) and synced into a *shadow* book from the same deltas; once the
//!    shadow has caught up to the same update id, both are compared over the snapshot's price
//!    range. Differences are reported as [`SyncEvent::Drift`] and the book is replaced by the
//!    shadow (a resync without a gap). This works for Binance, whose snapshot ids fall inside
//!    delta ranges, and for millrace's own API alike.
//! 6. When snapshots keep failing (`snapshot_failures_before_fallback` in a row), the machine
//!    falls back to snapshot-only mode ([`SyncState::SnapshotMode`]): every snapshot replaces the
//!    book and deltas are ignored; after `snapshot_mode_retry_ms` it tries delta mode again.
//!    [`SyncMode::SnapshotOnly`] starts (and stays) there.

use std::collections::VecDeque;

use crate::book::{sort_best_first, Level, OrderBook, Side};

/// A delta event from the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DepthDelta {
    /// First update id in the event (`U`).
    pub first_id: u64,
    /// Last update id in the event (`u`).
    pub last_id: u64,
    /// Last update id of the previous event (`pu`), when the source publishes it.
    pub prev_last_id: Option<u64>,
    /// Changed bid levels, absolute quantities; zero removes the level.
    pub bids: Vec<Level>,
    /// Changed ask levels.
    pub asks: Vec<Level>,
    /// Checksum of the top levels after applying this event, when the source publishes one
    /// (see [`OrderBook::checksum`]).
    pub checksum: Option<u32>,
}

/// A delta whose levels are borrowed (from a parser's reused buffers, say): what
/// [`BookSync::handle_delta_ref`] takes, so a synced book is updated without copying or
/// allocating. The machine copies it only when it must keep it (buffering, verification).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaRef<'a> {
    /// First update id in the event (`U`).
    pub first_id: u64,
    /// Last update id in the event (`u`).
    pub last_id: u64,
    /// Last update id of the previous event (`pu`), when the source publishes it.
    pub prev_last_id: Option<u64>,
    /// Changed bid levels, absolute quantities; zero removes the level.
    pub bids: &'a [Level],
    /// Changed ask levels.
    pub asks: &'a [Level],
    /// Checksum of the top levels after applying this event, when the source publishes one.
    pub checksum: Option<u32>,
}

impl DepthDelta {
    /// The same delta, borrowed.
    pub fn as_ref(&self) -> DeltaRef<'_> {
        DeltaRef {
            first_id: self.first_id,
            last_id: self.last_id,
            prev_last_id: self.prev_last_id,
            bids: &self.bids,
            asks: &self.asks,
            checksum: self.checksum,
        }
    }
}

impl DeltaRef<'_> {
    /// An owned copy.
    pub fn to_delta(&self) -> DepthDelta {
        DepthDelta {
            first_id: self.first_id,
            last_id: self.last_id,
            prev_last_id: self.prev_last_id,
            bids: self.bids.to_vec(),
            asks: self.asks.to_vec(),
            checksum: self.checksum,
        }
    }
}

/// One delta being applied level by level; see [`BookSync::direct_delta`]. Dropping it without
/// `commit` or `abandon` abandons it.
#[derive(Debug)]
pub struct DirectDelta<'a> {
    sync: &'a mut BookSync,
    last_id: u64,
    levels: u64,
    committed: bool,
}

impl DirectDelta<'_> {
    /// Sets the level at `price` on `side` to `qty` (zero removes it).
    #[inline]
    pub fn level(&mut self, side: Side, level: Level) {
        match side {
            Side::Bid => self.sync.book.bids.apply(level.price, level.qty),
            Side::Ask => self.sync.book.asks.apply(level.price, level.qty),
        };
        self.levels += 1;
    }

    /// The delta was read to its end: the book is at its last update id.
    pub fn commit(mut self) {
        self.committed = true;
        self.sync.applied(self.last_id, self.levels, None);
    }

    /// The delta could not be read to its end; the book holds part of it: resync.
    pub fn abandon(self) {}
}

impl Drop for DirectDelta<'_> {
    fn drop(&mut self) {
        if !self.committed {
            self.sync.restart(ResyncReason::PartialDelta);
        }
    }
}

/// A full (possibly depth-limited) snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DepthSnapshot {
    pub last_update_id: u64,
    pub bids: Vec<Level>,
    pub asks: Vec<Level>,
}

/// Which continuity rule the source follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContinuityRule {
    /// Binance spot and millrace's own `depth_update`: `U <= id+1 <= u`, then `U == last+1`.
    Spot,
    /// Binance USD-M futures: `U <= id <= u`, then `pu == last`.
    Futures,
}

/// Whether the machine syncs deltas or only takes snapshots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    /// Snapshot + deltas (the precise mode).
    Delta,
    /// Snapshots only (`depth@X,20`): simpler, coarser.
    SnapshotOnly,
}

/// Tuning of a [`BookSync`]. Every field has the default the product documents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncConfig {
    pub rule: ContinuityRule,
    pub mode: SyncMode,
    /// How many deltas to hold while waiting for a snapshot; the oldest are dropped beyond it.
    pub max_buffered: usize,
    /// How often to verify the book against a fresh snapshot; `None` disables it.
    pub verify_interval_ms: Option<i64>,
    /// A verification that has not completed after this long is abandoned.
    pub verify_timeout_ms: i64,
    /// Levels per side covered by delta checksums.
    pub checksum_levels: usize,
    /// Consecutive snapshot failures before falling back to snapshot-only mode.
    pub snapshot_failures_before_fallback: u32,
    /// How long to stay in fallback snapshot mode before trying delta mode again.
    pub snapshot_mode_retry_ms: i64,
}

impl SyncConfig {
    pub fn new(rule: ContinuityRule) -> Self {
        Self {
            rule,
            mode: SyncMode::Delta,
            max_buffered: 10_000,
            verify_interval_ms: Some(60_000),
            verify_timeout_ms: 30_000,
            checksum_levels: crate::book::CHECKSUM_LEVELS,
            snapshot_failures_before_fallback: 3,
            snapshot_mode_retry_ms: 30_000,
        }
    }
}

/// Where the machine is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SyncState {
    /// Buffering deltas until a snapshot arrives (where every machine starts).
    #[default]
    AwaitingSnapshot,
    /// A snapshot is applied; waiting for the first delta that bridges it.
    Bridging,
    /// In sync: every applied delta continued the previous one.
    Synced,
    /// Snapshot-only mode (configured, or fallback after failing snapshots).
    SnapshotMode,
}

/// Why a fresh snapshot is needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResyncReason {
    /// First sync.
    Startup,
    /// An update-id gap.
    Gap,
    /// The connection was lost; the stream restarts.
    ConnectionLost,
    /// The delta checksum did not match the local book.
    ChecksumMismatch,
    /// The first non-stale delta starts after the snapshot: the snapshot is too old.
    SnapshotTooOld,
    /// The previous snapshot request failed; try again (with back-off).
    SnapshotFailed,
    /// Leaving fallback snapshot mode to try delta mode again.
    RetryDeltaMode,
    /// A delta applied level by level ([`BookSync::direct_delta`]) could not be read to its end:
    /// the book holds part of it.
    PartialDelta,
    /// A venue's REST book at the same point of its stream differed from the local book
    /// ([`crate::venue::VenueSync::handle_verification`]).
    Drift,
}

/// What the machine reports. Drain with [`BookSync::poll_event`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncEvent {
    /// The book changed; it is now at `last_update_id`.
    BookChanged { last_update_id: u64 },
    /// The book became synced (after a snapshot and its bridging delta).
    Synced { last_update_id: u64 },
    /// The caller should fetch a snapshot (and, in delta mode, keep the delta stream running).
    NeedSnapshot { reason: ResyncReason },
    /// A delta older than the book was dropped.
    DroppedStale { first_id: u64, last_id: u64 },
    /// A delta did not continue the previous one; the book is resyncing.
    GapDetected { last_update_id: u64, first_id: u64, prev_last_id: Option<u64> },
    /// The delta checksum disagrees with the local book; the book is resyncing.
    ChecksumMismatch { last_update_id: u64, expected: u32, computed: u32 },
    /// The caller should fetch a snapshot for verification (keep feeding deltas as usual).
    VerifyDue,
    /// A verification finished: `drift_levels` levels differed (0 = the book was right).
    Verified { last_update_id: u64, drift_levels: usize },
    /// A verification found differences; the book was replaced by the verified one.
    Drift { last_update_id: u64, drift_levels: usize },
    /// The book crossed (best bid >= best ask) after an update.
    Crossed { last_update_id: u64 },
    /// Fell back to snapshot-only mode; the caller should switch to the snapshot stream.
    EnteredSnapshotMode,
    /// The venue's sequence restarted (OKX `seqId` below `prevSeqId` after maintenance, Bybit
    /// `u = 1`): continued from, not a gap.
    SequenceReset { from: Option<u64>, to: u64 },
    /// A checksum the venue sent could not be checked (no checksum in a message that should
    /// carry one, or numbers the venue's format cannot be reproduced for); reported at the
    /// first of a run of such messages, each counted in [`SyncStats::checksums_unchecked`].
    ChecksumUnchecked { last_update_id: u64 },
}

/// Counters, cumulative over the machine's life.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SyncStats {
    pub deltas_applied: u64,
    pub levels_applied: u64,
    pub stale_dropped: u64,
    pub gaps: u64,
    /// Times the book had to be rebuilt after being synced (gap, checksum, drift, reconnect).
    pub resyncs: u64,
    pub snapshots_applied: u64,
    pub snapshot_failures: u64,
    pub checksum_mismatches: u64,
    pub verifications: u64,
    pub verifications_abandoned: u64,
    pub drift_events: u64,
    pub drift_levels: u64,
    pub crossed: u64,
    pub buffer_overflow_dropped: u64,
    pub snapshot_mode_entries: u64,
    /// Checksums computed and equal to the venue's.
    pub checksums_verified: u64,
    /// Checksums that could not be checked (see [`SyncEvent::ChecksumUnchecked`]).
    pub checksums_unchecked: u64,
    /// Venue sequence restarts continued from ([`SyncEvent::SequenceReset`]).
    pub sequence_resets: u64,
    /// Venue heartbeats (messages that only repeat the sequence).
    pub heartbeats: u64,
    /// Updates dropped while waiting for the venue's snapshot.
    pub unsynced_dropped: u64,
}

/// What the continuity rule says about one delta.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Stale,
    Apply,
    Gap,
}

fn bridge_verdict(rule: ContinuityRule, snapshot_id: u64, d: DeltaRef<'_>) -> Verdict {
    match rule {
        ContinuityRule::Spot => {
            if d.last_id <= snapshot_id {
                Verdict::Stale
            } else if d.first_id <= snapshot_id.saturating_add(1) {
                Verdict::Apply
            } else {
                Verdict::Gap
            }
        }
        ContinuityRule::Futures => {
            if d.last_id < snapshot_id {
                Verdict::Stale
            } else if d.first_id <= snapshot_id {
                Verdict::Apply
            } else {
                Verdict::Gap
            }
        }
    }
}

fn continue_verdict(rule: ContinuityRule, last: u64, d: DeltaRef<'_>) -> Verdict {
    if d.last_id <= last {
        return Verdict::Stale;
    }
    match (rule, d.prev_last_id) {
        (ContinuityRule::Futures, Some(pu)) => {
            if pu == last {
                Verdict::Apply
            } else {
                Verdict::Gap
            }
        }
        _ => {
            if d.first_id > last.saturating_add(1) {
                Verdict::Gap
            } else {
                Verdict::Apply
            }
        }
    }
}

fn apply_levels(book: &mut OrderBook, d: DeltaRef<'_>) {
    for l in d.bids {
        book.bids.apply(l.price, l.qty);
    }
    for l in d.asks {
        book.asks.apply(l.price, l.qty);
    }
}

/// A verification in progress: a shadow book synced from a fresh snapshot and the same deltas.
#[derive(Debug, Clone)]
struct Verifier {
    started_at: i64,
    /// Deltas seen since the verification started, until the snapshot arrives.
    buffer: Vec<DepthDelta>,
    shadow: Option<Shadow>,
}

/// The book a verification syncs from its snapshot: each side is the snapshot's own vector,
/// best first, kept in order as the deltas are applied. A verification runs every minute on
/// every book, so the shadow borrows nothing from the allocator beyond what the snapshot came
/// in (a ladder of its own would lay out a whole window, up to 256 KiB a side, and free it at
/// once).
#[derive(Debug, Clone)]
struct Shadow {
    bids: Vec<Level>,
    asks: Vec<Level>,
    last: u64,
    bridged: bool,
    /// The snapshot's worst bid and ask: only levels at or inside these are compared.
    bid_floor: Option<crate::fixed::Price>,
    ask_ceiling: Option<crate::fixed::Price>,
}

impl Shadow {
    fn new(s: DepthSnapshot) -> Self {
        let (mut bids, mut asks) = (s.bids, s.asks);
        sort_best_first(Side::Bid, &mut bids);
        sort_best_first(Side::Ask, &mut asks);
        Shadow {
            bid_floor: bids.last().map(|l| l.price),
            ask_ceiling: asks.last().map(|l| l.price),
            bids,
            asks,
            last: s.last_update_id,
            bridged: false,
        }
    }

    /// Feeds one delta; `Err(())` when the shadow cannot be synced from it.
    fn feed(&mut self, rule: ContinuityRule, d: DeltaRef<'_>) -> Result<(), ()> {
        let verdict = if self.bridged {
            continue_verdict(rule, self.last, d)
        } else {
            bridge_verdict(rule, self.last, d)
        };
        match verdict {
            Verdict::Stale => Ok(()),
            Verdict::Gap => Err(()),
            Verdict::Apply => {
                for &l in d.bids {
                    apply_sorted(Side::Bid, &mut self.bids, l);
                }
                for &l in d.asks {
                    apply_sorted(Side::Ask, &mut self.asks, l);
                }
                self.last = d.last_id;
                self.bridged = true;
                Ok(())
            }
        }
    }
}

/// Applies one level update to `side`'s levels, best first.
fn apply_sorted(side: Side, levels: &mut Vec<Level>, l: Level) {
    match levels.binary_search_by(|x| side.best_first(x.price, l.price)) {
        Ok(i) if l.qty.is_zero() => {
            levels.remove(i);
        }
        Ok(i) => levels[i].qty = l.qty,
        Err(_) if l.qty.is_zero() => {}
        Err(i) => levels.insert(i, l),
    }
}

/// Counts the levels that differ between `book`'s side and `shadow` (that side's levels, best
/// first), among prices that are at or better than `limit` (the snapshot's worst level); `None`
/// limit = the side was empty.
fn side_drift(
    side: Side,
    book: &OrderBook,
    shadow: &[Level],
    limit: Option<crate::fixed::Price>,
) -> usize {
    let inside = |l: &Level| match (side, limit) {
        (_, None) => false,
        (Side::Bid, Some(f)) => l.price >= f,
        (Side::Ask, Some(c)) => l.price <= c,
    };
    // both are best first: a merge
    let mut xs = book.side(side).iter().take_while(inside).peekable();
    let mut ys = shadow.iter().copied().take_while(inside).peekable();
    let mut diff = 0;
    loop {
        match (xs.peek(), ys.peek()) {
            (Some(x), Some(y)) => match side.best_first(x.price, y.price) {
                std::cmp::Ordering::Equal => {
                    diff += usize::from(x.qty != y.qty);
                    xs.next();
                    ys.next();
                }
                std::cmp::Ordering::Less => {
                    diff += 1;
                    xs.next();
                }
                std::cmp::Ordering::Greater => {
                    diff += 1;
                    ys.next();
                }
            },
            (Some(_), None) => {
                diff += 1;
                xs.next();
            }
            (None, Some(_)) => {
                diff += 1;
                ys.next();
            }
            (None, None) => return diff,
        }
    }
}

/// The sync state machine. See the module docs.
#[derive(Debug, Clone)]
pub struct BookSync {
    config: SyncConfig,
    state: SyncState,
    book: OrderBook,
    /// Update id the book reflects (meaningful from `Bridging` on).
    last_update_id: u64,
    /// Deltas held while awaiting a snapshot.
    buffer: VecDeque<DepthDelta>,
    events: VecDeque<SyncEvent>,
    stats: SyncStats,
    /// Consecutive snapshot failures.
    snapshot_failures: u32,
    next_verify_at: Option<i64>,
    verifier: Option<Verifier>,
    /// When fallback snapshot mode should try delta mode again.
    retry_delta_at: Option<i64>,
    /// Whether the book has ever been synced (so a later loss counts as a resync).
    was_synced: bool,
}

impl BookSync {
    /// A machine that immediately asks for its first snapshot.
    pub fn new(config: SyncConfig) -> Self {
        let mut s = Self {
            state: SyncState::AwaitingSnapshot,
            book: OrderBook::new(),
            last_update_id: 0,
            buffer: VecDeque::new(),
            events: VecDeque::new(),
            stats: SyncStats::default(),
            snapshot_failures: 0,
            next_verify_at: None,
            verifier: None,
            retry_delta_at: None,
            was_synced: false,
            config,
        };
        if s.config.mode == SyncMode::SnapshotOnly {
            s.state = SyncState::SnapshotMode;
        }
        s.events.push_back(SyncEvent::NeedSnapshot { reason: ResyncReason::Startup });
        s
    }

    pub fn config(&self) -> &SyncConfig {
        &self.config
    }

    pub fn state(&self) -> SyncState {
        self.state
    }

    /// True when the book may be shown as in sync: delta-synced, or holding a snapshot in
    /// snapshot mode.
    pub fn is_synced(&self) -> bool {
        match self.state {
            SyncState::Synced => true,
            SyncState::SnapshotMode => self.stats.snapshots_applied > 0,
            _ => false,
        }
    }

    pub fn book(&self) -> &OrderBook {
        &self.book
    }

    pub fn last_update_id(&self) -> u64 {
        self.last_update_id
    }

    pub fn stats(&self) -> &SyncStats {
        &self.stats
    }

    pub fn buffered(&self) -> usize {
        self.buffer.len()
    }

    /// Next output, if any.
    pub fn poll_event(&mut self) -> Option<SyncEvent> {
        self.events.pop_front()
    }

    /// When [`Self::handle_timeout`] should next be called, if ever.
    pub fn poll_timeout(&self) -> Option<i64> {
        let verify_deadline =
            self.verifier.as_ref().map(|v| v.started_at + self.config.verify_timeout_ms);
        [self.next_verify_at, verify_deadline, self.retry_delta_at].into_iter().flatten().min()
    }

    /// A delta arrived.
    pub fn handle_delta(&mut self, d: DepthDelta, now_ms: i64) {
        match self.state {
            SyncState::SnapshotMode => {}
            SyncState::AwaitingSnapshot => self.buffer_delta(d),
            SyncState::Bridging => self.bridge(d, now_ms),
            SyncState::Synced => {
                if self.synced_delta(d.as_ref()) {
                    // The gapped delta is the newest data: the next snapshot may bridge it.
                    self.buffer.push_back(d);
                }
            }
        }
    }

    /// [`BookSync::handle_delta`] for a borrowed delta: while synced (the steady state) the book
    /// is updated straight from `d`; the machine copies it only to keep it.
    pub fn handle_delta_ref(&mut self, d: DeltaRef<'_>, now_ms: i64) {
        match self.state {
            SyncState::SnapshotMode => {}
            SyncState::Synced => {
                if self.synced_delta(d) {
                    self.buffer.push_back(d.to_delta());
                }
            }
            SyncState::AwaitingSnapshot | SyncState::Bridging => {
                self.handle_delta(d.to_delta(), now_ms)
            }
        }
    }

    /// A delta whose levels the caller applies one by one as it reads them (a parser writing
    /// straight into the book), for the steady state: `Some` only when a delta with these ids
    /// would be applied as it is right now — synced, continuous by the rule, no verification
    /// collecting deltas. Call [`DirectDelta::level`] for each level, then
    /// [`DirectDelta::commit`]; [`DirectDelta::abandon`] if the delta cannot be read to its end
    /// (the book then holds part of it, and the machine goes back to step 1). `None`: use
    /// [`BookSync::handle_delta_ref`] with the whole delta.
    pub fn direct_delta(
        &mut self,
        first_id: u64,
        last_id: u64,
        prev_last_id: Option<u64>,
    ) -> Option<DirectDelta<'_>> {
        if self.state != SyncState::Synced || self.verifier.is_some() {
            return None;
        }
        let head =
            DeltaRef { first_id, last_id, prev_last_id, bids: &[], asks: &[], checksum: None };
        if first_id > last_id
            || continue_verdict(self.config.rule, self.last_update_id, head) != Verdict::Apply
        {
            return None;
        }
        Some(DirectDelta { sync: self, last_id, levels: 0, committed: false })
    }

    fn buffer_delta(&mut self, d: DepthDelta) {
        if self.buffer.len() >= self.config.max_buffered {
            self.buffer.pop_front();
            self.stats.buffer_overflow_dropped += 1;
        }
        self.buffer.push_back(d);
    }

    /// Step 3 for one delta while synced; `true` when it showed a gap (the machine restarted and
    /// the caller buffers the delta for the next snapshot).
    fn synced_delta(&mut self, d: DeltaRef<'_>) -> bool {
        self.feed_verifier(d);
        match continue_verdict(self.config.rule, self.last_update_id, d) {
            Verdict::Stale => self.drop_stale(d),
            Verdict::Gap => {
                self.stats.gaps += 1;
                self.events.push_back(SyncEvent::GapDetected {
                    last_update_id: self.last_update_id,
                    first_id: d.first_id,
                    prev_last_id: d.prev_last_id,
                });
                self.restart(ResyncReason::Gap);
                return true;
            }
            Verdict::Apply => {
                self.apply(d);
                self.check_verifier();
            }
        }
        false
    }

    /// A snapshot arrived (REST or the snapshot stream).
    pub fn handle_snapshot(&mut self, s: DepthSnapshot, now_ms: i64) {
        self.snapshot_failures = 0;
        match self.state {
            SyncState::SnapshotMode => {
                self.book.replace(&s.bids, &s.asks);
                self.last_update_id = s.last_update_id;
                self.stats.snapshots_applied += 1;
                self.events.push_back(SyncEvent::BookChanged { last_update_id: s.last_update_id });
                self.note_crossed();
            }
            SyncState::AwaitingSnapshot | SyncState::Bridging => {
                self.book.replace(&s.bids, &s.asks);
                self.last_update_id = s.last_update_id;
                self.stats.snapshots_applied += 1;
                self.state = SyncState::Bridging;
                // walked out of its own allocation, which the buffer gets back afterwards
                let mut buffered = std::mem::take(&mut self.buffer);
                for d in buffered.drain(..) {
                    match self.state {
                        SyncState::Bridging => self.bridge(d, now_ms),
                        SyncState::Synced => self.handle_delta(d, now_ms),
                        // the snapshot was too old: keep the rest for the next one
                        _ => self.buffer.push_back(d),
                    }
                }
                if self.buffer.is_empty() {
                    self.buffer = buffered;
                }
            }
            SyncState::Synced => self.start_shadow(s),
        }
    }

    /// The last snapshot request failed (network, HTTP error, rate limit).
    pub fn handle_snapshot_failed(&mut self, now_ms: i64) {
        self.stats.snapshot_failures += 1;
        match self.state {
            SyncState::Synced => {
                // a verification snapshot failed: give up on this verification only
                if self.verifier.take().is_some() {
                    self.stats.verifications_abandoned += 1;
                }
            }
            SyncState::SnapshotMode => {}
            SyncState::AwaitingSnapshot | SyncState::Bridging => {
                self.snapshot_failures += 1;
                if self.snapshot_failures >= self.config.snapshot_failures_before_fallback {
                    self.enter_snapshot_mode(now_ms);
                } else {
                    self.events.push_back(SyncEvent::NeedSnapshot {
                        reason: ResyncReason::SnapshotFailed,
                    });
                }
            }
        }
    }

    /// The stream's connection was lost: everything restarts from step 1 once it is back.
    pub fn handle_connection_lost(&mut self, _now_ms: i64) {
        if self.state == SyncState::SnapshotMode {
            return; // the next snapshot replaces the book anyway
        }
        self.restart(ResyncReason::ConnectionLost);
    }

    /// Time passed: starts due verifications, abandons stuck ones, and leaves fallback snapshot
    /// mode when its time is up.
    pub fn handle_timeout(&mut self, now_ms: i64) {
        if let Some(v) = &self.verifier {
            if now_ms >= v.started_at + self.config.verify_timeout_ms {
                self.verifier = None;
                self.stats.verifications_abandoned += 1;
            }
        }
        if let Some(at) = self.retry_delta_at {
            if now_ms >= at && self.state == SyncState::SnapshotMode {
                self.retry_delta_at = None;
                self.state = SyncState::AwaitingSnapshot;
                self.events
                    .push_back(SyncEvent::NeedSnapshot { reason: ResyncReason::RetryDeltaMode });
            }
        }
        if let Some(at) = self.next_verify_at {
            if now_ms >= at && self.state == SyncState::Synced {
                self.next_verify_at = self.config.verify_interval_ms.map(|i| now_ms + i);
                if self.verifier.is_none() {
                    self.verifier =
                        Some(Verifier { started_at: now_ms, buffer: Vec::new(), shadow: None });
                    self.events.push_back(SyncEvent::VerifyDue);
                }
            }
        }
    }

    /// Asks for a verification now (e.g. an operator action), regardless of the interval.
    pub fn request_verify(&mut self, now_ms: i64) {
        if self.state == SyncState::Synced && self.verifier.is_none() {
            self.verifier = Some(Verifier { started_at: now_ms, buffer: Vec::new(), shadow: None });
            self.events.push_back(SyncEvent::VerifyDue);
        }
    }

    fn restart(&mut self, reason: ResyncReason) {
        if self.was_synced && matches!(self.state, SyncState::Synced | SyncState::Bridging) {
            self.stats.resyncs += 1;
        }
        self.state = SyncState::AwaitingSnapshot;
        self.buffer.clear();
        self.verifier = None;
        self.next_verify_at = None;
        self.events.push_back(SyncEvent::NeedSnapshot { reason });
    }

    fn enter_snapshot_mode(&mut self, now_ms: i64) {
        self.state = SyncState::SnapshotMode;
        self.buffer.clear();
        self.verifier = None;
        self.next_verify_at = None;
        self.snapshot_failures = 0;
        self.stats.snapshot_mode_entries += 1;
        self.retry_delta_at = Some(now_ms + self.config.snapshot_mode_retry_ms);
        self.events.push_back(SyncEvent::EnteredSnapshotMode);
    }

    fn drop_stale(&mut self, d: DeltaRef<'_>) {
        self.stats.stale_dropped += 1;
        self.events.push_back(SyncEvent::DroppedStale { first_id: d.first_id, last_id: d.last_id });
    }

    /// Step 5 of the algorithm: find the first delta that bridges the snapshot.
    fn bridge(&mut self, d: DepthDelta, now_ms: i64) {
        match bridge_verdict(self.config.rule, self.last_update_id, d.as_ref()) {
            Verdict::Stale => self.drop_stale(d.as_ref()),
            Verdict::Gap => {
                self.state = SyncState::AwaitingSnapshot;
                self.events
                    .push_back(SyncEvent::NeedSnapshot { reason: ResyncReason::SnapshotTooOld });
                self.buffer.push_back(d);
            }
            Verdict::Apply => {
                self.state = SyncState::Synced;
                self.was_synced = true;
                self.next_verify_at = self.config.verify_interval_ms.map(|i| now_ms + i);
                self.events.push_back(SyncEvent::Synced { last_update_id: d.last_id });
                self.apply(d.as_ref());
            }
        }
    }

    fn apply(&mut self, d: DeltaRef<'_>) {
        apply_levels(&mut self.book, d);
        self.applied(d.last_id, (d.bids.len() + d.asks.len()) as u64, d.checksum);
    }

    /// Bookkeeping once a delta's levels are in the book (by [`BookSync::apply`] or a committed
    /// [`DirectDelta`]): the new update id, the counts, the checksum check, the event.
    fn applied(&mut self, last_id: u64, levels: u64, checksum: Option<u32>) {
        self.last_update_id = last_id;
        self.stats.deltas_applied += 1;
        self.stats.levels_applied += levels;
        if let Some(expected) = checksum {
            let computed = self.book.checksum(self.config.checksum_levels);
            if computed != expected {
                self.stats.checksum_mismatches += 1;
                self.events.push_back(SyncEvent::ChecksumMismatch {
                    last_update_id: last_id,
                    expected,
                    computed,
                });
                self.restart(ResyncReason::ChecksumMismatch);
                return;
            }
            self.stats.checksums_verified += 1;
        }
        self.events.push_back(SyncEvent::BookChanged { last_update_id: last_id });
        self.note_crossed();
    }

    fn note_crossed(&mut self) {
        if self.book.is_crossed() {
            self.stats.crossed += 1;
            self.events.push_back(SyncEvent::Crossed { last_update_id: self.last_update_id });
        }
    }

    fn feed_verifier(&mut self, d: DeltaRef<'_>) {
        let rule = self.config.rule;
        let Some(v) = &mut self.verifier else { return };
        match &mut v.shadow {
            None => v.buffer.push(d.to_delta()),
            Some(shadow) => {
                if shadow.feed(rule, d).is_err() {
                    self.verifier = None;
                    self.stats.verifications_abandoned += 1;
                }
            }
        }
    }

    fn start_shadow(&mut self, s: DepthSnapshot) {
        let rule = self.config.rule;
        let Some(v) = &mut self.verifier else {
            // an unsolicited snapshot while synced: verify against it as well
            self.verifier = Some(Verifier { started_at: 0, buffer: Vec::new(), shadow: None });
            return self.start_shadow(s);
        };
        let mut shadow = Shadow::new(s);
        let mut ok = true;
        for d in v.buffer.drain(..) {
            if shadow.feed(rule, d.as_ref()).is_err() {
                ok = false;
                break;
            }
        }
        if ok {
            v.shadow = Some(shadow);
            self.check_verifier();
        } else {
            self.verifier = None;
            self.stats.verifications_abandoned += 1;
        }
    }

    /// Compares the shadow with the book once both are at the same update id.
    fn check_verifier(&mut self) {
        let Some(Verifier { shadow: Some(shadow), .. }) = &self.verifier else { return };
        // The shadow only ever sees deltas the book also sees, so it is never ahead of the book
        // once bridged; a snapshot newer than the book waits until the book catches up.
        if shadow.last != self.last_update_id {
            return;
        }
        let Some(Verifier { shadow: Some(shadow), .. }) = self.verifier.take() else {
            unreachable!()
        };
        let drift = side_drift(Side::Bid, &self.book, &shadow.bids, shadow.bid_floor)
            + side_drift(Side::Ask, &self.book, &shadow.asks, shadow.ask_ceiling);
        self.stats.verifications += 1;
        self.events.push_back(SyncEvent::Verified {
            last_update_id: self.last_update_id,
            drift_levels: drift,
        });
        if drift > 0 {
            self.stats.drift_events += 1;
            self.stats.drift_levels += drift as u64;
            self.stats.resyncs += 1;
            // The shadow is exact within the snapshot's range; levels beyond it cannot be
            // trusted any more, so the book becomes the shadow.
            self.book.replace(&shadow.bids, &shadow.asks);
            self.events.push_back(SyncEvent::Drift {
                last_update_id: self.last_update_id,
                drift_levels: drift,
            });
            self.events.push_back(SyncEvent::BookChanged { last_update_id: self.last_update_id });
        }
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;
    use crate::fixed::{Price, Qty};
    use crate::testkit::Rng;

    fn lv(p: i64, q: i64) -> Level {
        Level::new(Price::from_units(p), Qty::from_units(q))
    }

    fn delta(first: u64, last: u64, bids: &[(i64, i64)], asks: &[(i64, i64)]) -> DepthDelta {
        DepthDelta {
            first_id: first,
            last_id: last,
            prev_last_id: None,
            bids: bids.iter().map(|&(p, q)| lv(p, q)).collect(),
            asks: asks.iter().map(|&(p, q)| lv(p, q)).collect(),
            checksum: None,
        }
    }

    fn snap(id: u64, bids: &[(i64, i64)], asks: &[(i64, i64)]) -> DepthSnapshot {
        DepthSnapshot {
            last_update_id: id,
            bids: bids.iter().map(|&(p, q)| lv(p, q)).collect(),
            asks: asks.iter().map(|&(p, q)| lv(p, q)).collect(),
        }
    }

    fn drain(s: &mut BookSync) -> Vec<SyncEvent> {
        std::iter::from_fn(|| s.poll_event()).collect()
    }

    fn spot() -> SyncConfig {
        let mut c = SyncConfig::new(ContinuityRule::Spot);
        c.verify_interval_ms = None;
        c
    }

    /// The seed's sequence diagram: snapshot id=100, U=99,u=101 applies, U=101,u=103 applies,
    /// U=200,u=201 is a gap.
    #[test]
    fn seed_timeline() {
        let mut s = BookSync::new(spot());
        assert_eq!(drain(&mut s), [SyncEvent::NeedSnapshot { reason: ResyncReason::Startup }]);
        s.handle_delta(delta(95, 98, &[(9, 1)], &[]), 0);
        s.handle_delta(delta(99, 101, &[(10, 2)], &[]), 0);
        assert_eq!(s.state(), SyncState::AwaitingSnapshot);
        assert_eq!(s.buffered(), 2);
        s.handle_snapshot(snap(100, &[(10, 1)], &[(11, 1)]), 0);
        assert_eq!(
            drain(&mut s),
            [
                SyncEvent::DroppedStale { first_id: 95, last_id: 98 },
                SyncEvent::Synced { last_update_id: 101 },
                SyncEvent::BookChanged { last_update_id: 101 },
            ]
        );
        assert_eq!(s.book().best_bid(), Some(lv(10, 2)));
        s.handle_delta(delta(101, 103, &[], &[(11, 0), (12, 3)]), 0);
        assert_eq!(drain(&mut s), [SyncEvent::BookChanged { last_update_id: 103 }]);
        assert_eq!(s.book().best_ask(), Some(lv(12, 3)));
        s.handle_delta(delta(200, 201, &[], &[]), 0);
        assert_eq!(
            drain(&mut s),
            [
                SyncEvent::GapDetected { last_update_id: 103, first_id: 200, prev_last_id: None },
                SyncEvent::NeedSnapshot { reason: ResyncReason::Gap },
            ]
        );
        assert_eq!(s.state(), SyncState::AwaitingSnapshot);
        assert!(!s.is_synced());
        assert_eq!(s.stats().gaps, 1);
        assert_eq!(s.stats().resyncs, 1);
        // the gapped delta is kept: a snapshot at 200 is bridged by it
        s.handle_snapshot(snap(200, &[(10, 5)], &[(12, 1)]), 0);
        assert_eq!(s.state(), SyncState::Synced);
        assert_eq!(s.last_update_id(), 201);
    }

    #[test]
    fn stale_deltas_while_synced_are_dropped() {
        let mut s = BookSync::new(spot());
        s.handle_snapshot(snap(10, &[(1, 1)], &[(2, 1)]), 0);
        s.handle_delta(delta(11, 12, &[(1, 2)], &[]), 0);
        drain(&mut s);
        s.handle_delta(delta(11, 12, &[(1, 9)], &[]), 0);
        assert_eq!(drain(&mut s), [SyncEvent::DroppedStale { first_id: 11, last_id: 12 }]);
        assert_eq!(s.book().best_bid(), Some(lv(1, 2)));
        // overlapping but newer: applied (absolute quantities as of u)
        s.handle_delta(delta(12, 14, &[(1, 3)], &[]), 0);
        assert_eq!(s.last_update_id(), 14);
    }

    #[test]
    fn snapshot_too_old_asks_again() {
        let mut s = BookSync::new(spot());
        drain(&mut s);
        s.handle_delta(delta(50, 55, &[(1, 1)], &[]), 0);
        s.handle_snapshot(snap(40, &[], &[]), 0);
        assert_eq!(
            drain(&mut s),
            [SyncEvent::NeedSnapshot { reason: ResyncReason::SnapshotTooOld }]
        );
        assert_eq!(s.state(), SyncState::AwaitingSnapshot);
        assert_eq!(s.buffered(), 1);
        s.handle_snapshot(snap(52, &[(2, 2)], &[]), 0);
        assert_eq!(s.state(), SyncState::Synced);
        assert_eq!(s.stats().resyncs, 0, "initial sync is not a resync");
    }

    #[test]
    fn snapshot_newer_than_buffer_waits_for_bridge() {
        let mut s = BookSync::new(spot());
        s.handle_delta(delta(1, 5, &[], &[]), 0);
        s.handle_snapshot(snap(7, &[(1, 1)], &[]), 0);
        assert_eq!(s.state(), SyncState::Bridging);
        s.handle_delta(delta(6, 7, &[], &[]), 0);
        assert_eq!(s.state(), SyncState::Bridging);
        s.handle_delta(delta(8, 9, &[(1, 4)], &[]), 0);
        assert_eq!(s.state(), SyncState::Synced);
        assert_eq!(s.book().best_bid(), Some(lv(1, 4)));
    }

    #[test]
    fn futures_rule_uses_pu() {
        let mut c = spot();
        c.rule = ContinuityRule::Futures;
        let mut s = BookSync::new(c);
        let fd =
            |u0, u1, pu| DepthDelta { prev_last_id: Some(pu), ..delta(u0, u1, &[(5, 1)], &[]) };
        s.handle_delta(fd(90, 99, 80), 0);
        s.handle_delta(fd(100, 120, 99), 0);
        s.handle_snapshot(snap(110, &[], &[]), 0);
        assert_eq!(s.state(), SyncState::Synced);
        assert_eq!(s.stats().stale_dropped, 1);
        // U jumps but pu matches: fine under the futures rule
        s.handle_delta(fd(130, 140, 120), 0);
        assert_eq!(s.last_update_id(), 140);
        s.handle_delta(fd(141, 150, 139), 0);
        assert_eq!(s.stats().gaps, 1);
        assert_eq!(s.state(), SyncState::AwaitingSnapshot);
    }

    #[test]
    fn futures_first_event_may_end_at_snapshot_id() {
        let mut c = spot();
        c.rule = ContinuityRule::Futures;
        let mut s = BookSync::new(c);
        s.handle_snapshot(snap(100, &[], &[]), 0);
        s.handle_delta(DepthDelta { prev_last_id: Some(90), ..delta(95, 100, &[(1, 1)], &[]) }, 0);
        assert_eq!(s.state(), SyncState::Synced);
    }

    #[test]
    fn checksum_mismatch_resyncs() {
        let mut s = BookSync::new(spot());
        s.handle_snapshot(snap(1, &[(10, 1)], &[(11, 1)]), 0);
        let mut good = delta(2, 2, &[(10, 2)], &[]);
        let mut expect = OrderBook::new();
        expect.replace(&[lv(10, 2)], &[lv(11, 1)]);
        good.checksum = Some(expect.checksum(10));
        s.handle_delta(good, 0);
        assert_eq!(s.state(), SyncState::Synced);
        let mut bad = delta(3, 3, &[(10, 3)], &[]);
        bad.checksum = Some(12345);
        s.handle_delta(bad, 0);
        let ev = drain(&mut s);
        assert!(ev
            .iter()
            .any(|e| matches!(e, SyncEvent::ChecksumMismatch { expected: 12345, .. })));
        assert_eq!(
            ev.last(),
            Some(&SyncEvent::NeedSnapshot { reason: ResyncReason::ChecksumMismatch })
        );
        assert_eq!(s.stats().checksum_mismatches, 1);
        assert_eq!(s.stats().resyncs, 1);
    }

    #[test]
    fn connection_lost_reinitialises() {
        let mut s = BookSync::new(spot());
        s.handle_snapshot(snap(1, &[(10, 1)], &[]), 0);
        s.handle_delta(delta(2, 2, &[], &[]), 0);
        drain(&mut s);
        s.handle_connection_lost(0);
        assert_eq!(
            drain(&mut s),
            [SyncEvent::NeedSnapshot { reason: ResyncReason::ConnectionLost }]
        );
        assert!(!s.is_synced());
        assert_eq!(s.stats().resyncs, 1);
    }

    #[test]
    fn failing_snapshots_fall_back_to_snapshot_mode_and_retry() {
        let mut s = BookSync::new(spot());
        drain(&mut s);
        s.handle_snapshot_failed(0);
        s.handle_snapshot_failed(10);
        assert_eq!(
            drain(&mut s),
            vec![SyncEvent::NeedSnapshot { reason: ResyncReason::SnapshotFailed }; 2]
        );
        s.handle_snapshot_failed(20);
        assert_eq!(drain(&mut s), [SyncEvent::EnteredSnapshotMode]);
        assert_eq!(s.state(), SyncState::SnapshotMode);
        assert!(!s.is_synced());
        s.handle_delta(delta(1, 2, &[(1, 1)], &[]), 30);
        assert!(s.book().best_bid().is_none(), "deltas are ignored in snapshot mode");
        s.handle_snapshot(snap(7, &[(3, 1)], &[(4, 1)]), 40);
        assert!(s.is_synced());
        assert_eq!(s.book().best_bid(), Some(lv(3, 1)));
        s.handle_snapshot(snap(8, &[(2, 1)], &[(4, 1)]), 50);
        assert_eq!(s.book().best_bid(), Some(lv(2, 1)), "each snapshot replaces the book");
        assert_eq!(s.poll_timeout(), Some(20 + 30_000));
        s.handle_timeout(20 + 30_000);
        assert_eq!(s.state(), SyncState::AwaitingSnapshot);
        assert!(drain(&mut s)
            .contains(&SyncEvent::NeedSnapshot { reason: ResyncReason::RetryDeltaMode }));
    }

    #[test]
    fn snapshot_only_mode_stays() {
        let mut c = spot();
        c.mode = SyncMode::SnapshotOnly;
        let mut s = BookSync::new(c);
        s.handle_snapshot(snap(3, &[(1, 1)], &[(2, 1)]), 0);
        assert!(s.is_synced());
        assert_eq!(s.poll_timeout(), None);
    }

    fn verify_config() -> SyncConfig {
        let mut c = spot();
        c.verify_interval_ms = Some(1_000);
        c
    }

    #[test]
    fn verification_without_drift() {
        let mut s = BookSync::new(verify_config());
        s.handle_snapshot(snap(10, &[(10, 1), (9, 1)], &[(11, 1)]), 0);
        s.handle_delta(delta(11, 11, &[(10, 2)], &[]), 0);
        assert_eq!(s.poll_timeout(), Some(1_000));
        drain(&mut s);
        s.handle_timeout(1_000);
        assert_eq!(drain(&mut s), [SyncEvent::VerifyDue]);
        // deltas keep flowing while the snapshot request is in flight
        s.handle_delta(delta(12, 13, &[(9, 0)], &[]), 1_001);
        s.handle_delta(delta(14, 15, &[], &[(12, 1)]), 1_002);
        drain(&mut s);
        // snapshot taken at id 13 (inside the stream) arrives after u=15 was applied
        s.handle_snapshot(snap(13, &[(10, 2)], &[(11, 1)]), 1_003);
        let ev = drain(&mut s);
        assert_eq!(ev, [SyncEvent::Verified { last_update_id: 15, drift_levels: 0 }]);
        assert_eq!(s.stats().verifications, 1);
    }

    #[test]
    fn verification_waits_for_a_newer_snapshot_and_repairs_drift() {
        let mut s = BookSync::new(verify_config());
        s.handle_snapshot(snap(10, &[(10, 1), (9, 1), (1, 1)], &[(11, 1)]), 0);
        s.handle_delta(delta(11, 11, &[], &[]), 0);
        s.request_verify(5);
        drain(&mut s);
        // the source's truth at 20 differs from ours at level 9 (a silently lost update)
        s.handle_snapshot(snap(20, &[(10, 1), (9, 7)], &[(11, 1)]), 6);
        assert!(drain(&mut s).is_empty(), "book is behind the snapshot: wait");
        s.handle_delta(delta(12, 20, &[], &[]), 7);
        let ev = drain(&mut s);
        assert_eq!(
            ev,
            [
                SyncEvent::BookChanged { last_update_id: 20 },
                SyncEvent::Verified { last_update_id: 20, drift_levels: 1 },
                SyncEvent::Drift { last_update_id: 20, drift_levels: 1 },
                SyncEvent::BookChanged { last_update_id: 20 },
            ]
        );
        assert_eq!(s.book().bids.get(Price::from_units(9)), Qty::from_units(7));
        assert_eq!(
            s.book().bids.get(Price::from_units(1)),
            Qty::ZERO,
            "beyond the snapshot: pruned"
        );
        assert_eq!(s.stats().drift_levels, 1);
        assert_eq!(s.stats().resyncs, 1);
        assert_eq!(s.state(), SyncState::Synced);
    }

    /// The shadow's sides (the snapshot's own vectors, kept best first) hold what a ladder fed
    /// the same snapshot and deltas holds, whatever order, repeats and zeros the snapshot has;
    /// and the drift count is the number of prices within the snapshot's range whose quantity
    /// differs.
    #[test]
    fn shadow_sides_match_a_ladder_and_drift_counts_every_difference() {
        use std::collections::BTreeMap;
        for seed in 0..200u64 {
            let mut rng = Rng::new(77 + seed);
            let side = if seed % 2 == 0 { Side::Bid } else { Side::Ask };
            let span = [5u64, 40, 400][(seed % 3) as usize];
            let level = |rng: &mut Rng, zero: bool| {
                let q = if zero && rng.chance(1, 8) { 0 } else { 1 + rng.below(9) as i64 };
                lv(1_000 + rng.below(span) as i64, q)
            };
            let mut snapshot: Vec<Level> =
                (0..rng.below(2 * span)).map(|_| level(&mut rng, true)).collect();
            let mut ladder = crate::book::Ladder::new(side);
            if seed % 4 < 2 {
                // as exchanges send them: best first, distinct, no zeros
                ladder.replace(&snapshot);
                snapshot = ladder.iter().collect();
            } else {
                ladder.replace(&snapshot);
            }
            let mut shadow = snapshot;
            sort_best_first(side, &mut shadow);
            assert_eq!(shadow, ladder.iter().collect::<Vec<_>>(), "seed {seed}: snapshot");
            let limit = shadow.last().map(|l| l.price);
            for step in 0..300 {
                let zero = rng.chance(1, 3);
                let l = level(&mut rng, zero);
                apply_sorted(side, &mut shadow, l);
                ladder.apply(l.price, l.qty);
                if step % 37 == 0 {
                    assert_eq!(shadow, ladder.iter().collect::<Vec<_>>(), "seed {seed} {step}");
                }
            }
            // the book differs from the shadow at a few prices, inside the range and beyond it
            let mut book = OrderBook::new();
            *book.side_mut(side) = ladder.clone();
            for _ in 0..rng.below(6) {
                let l = level(&mut rng, true);
                book.side_mut(side).apply(l.price, l.qty);
            }
            let beyond = Price::from_units(if side == Side::Bid { 1 } else { 9_999 });
            book.side_mut(side).apply(beyond, Qty::from_units(1));
            let as_map = |levels: &mut dyn Iterator<Item = Level>| -> BTreeMap<Price, Qty> {
                levels.map(|l| (l.price, l.qty)).collect()
            };
            let (a, b) = (as_map(&mut book.side(side).iter()), as_map(&mut shadow.iter().copied()));
            let inside = |p: &Price| match (side, limit) {
                (_, None) => false,
                (Side::Bid, Some(f)) => *p >= f,
                (Side::Ask, Some(c)) => *p <= c,
            };
            let mut prices: Vec<&Price> = a.keys().chain(b.keys()).filter(|p| inside(p)).collect();
            prices.sort();
            prices.dedup();
            let want = prices.iter().filter(|p| a.get(p) != b.get(p)).count();
            assert_eq!(side_drift(side, &book, &shadow, limit), want, "seed {seed}: drift");
        }
    }

    #[test]
    fn failed_or_stuck_verification_is_abandoned() {
        let mut s = BookSync::new(verify_config());
        s.handle_snapshot(snap(1, &[], &[]), 0);
        s.handle_delta(delta(2, 2, &[], &[]), 0);
        s.request_verify(0);
        s.handle_snapshot_failed(1);
        assert_eq!(s.stats().verifications_abandoned, 1);
        assert_eq!(s.state(), SyncState::Synced, "a failed verification does not desync");
        s.request_verify(2);
        s.handle_timeout(2 + 30_000);
        assert_eq!(s.stats().verifications_abandoned, 2);
    }

    /// Absurd update ids (0, u64::MAX, U > u) never panic and never corrupt a synced book.
    #[test]
    fn absurd_ids_do_not_panic() {
        for rule in [ContinuityRule::Spot, ContinuityRule::Futures] {
            let mut c = spot();
            c.rule = rule;
            let mut s = BookSync::new(c);
            s.handle_snapshot(snap(u64::MAX, &[(1, 1)], &[(2, 1)]), 0);
            s.handle_delta(delta(u64::MAX, u64::MAX, &[(1, 5)], &[]), 0);
            s.handle_delta(delta(0, 0, &[(1, 6)], &[]), 0);
            let mut s = BookSync::new(SyncConfig { rule, ..spot() });
            s.handle_snapshot(snap(5, &[(1, 1)], &[(2, 1)]), 0);
            s.handle_delta(
                DepthDelta { prev_last_id: Some(u64::MAX), ..delta(9, 3, &[(1, 7)], &[]) },
                0,
            );
            s.handle_delta(delta(u64::MAX, u64::MAX, &[(1, 8)], &[]), 0);
            while s.poll_event().is_some() {}
            assert!(
                s.book().best_bid().unwrap().qty != Qty::from_units(7),
                "{rule:?}: U > u must not bridge"
            );
        }
    }

    #[test]
    fn buffer_is_bounded() {
        let mut c = spot();
        c.max_buffered = 3;
        let mut s = BookSync::new(c);
        for i in 0..5 {
            s.handle_delta(delta(i + 1, i + 1, &[], &[]), 0);
        }
        assert_eq!(s.buffered(), 3);
        assert_eq!(s.stats().buffer_overflow_dropped, 2);
    }

    /// A source that publishes the true book and its deltas; the channel between it and the
    /// machine drops, duplicates and reorders deltas. The machine must never show a book that
    /// differs from the truth at its update id, must ask for a snapshot on every gap, and must
    /// converge once the channel is clean again.
    #[test]
    fn converges_under_drops_duplicates_and_reordering() {
        converge(ContinuityRule::Spot, Feed::Owned);
    }

    /// The same through `handle_delta_ref` (borrowed levels, as the server's depth connections
    /// feed the machine).
    #[test]
    fn borrowed_deltas_converge_under_drops_duplicates_and_reordering() {
        converge(ContinuityRule::Spot, Feed::Borrowed);
        converge(ContinuityRule::Futures, Feed::Borrowed);
    }

    /// The same with levels applied one by one through `direct_delta` whenever the machine
    /// takes them that way, and one delta in 40 abandoned half-way (a frame that turns out
    /// malformed after some of its levels were applied), then handed over whole as the server
    /// does when the frame decodes after all.
    #[test]
    fn direct_deltas_converge_and_abandoned_ones_resync() {
        converge(ContinuityRule::Spot, Feed::Direct);
        converge(ContinuityRule::Futures, Feed::Direct);
    }

    #[derive(Clone, Copy, PartialEq)]
    enum Feed {
        Owned,
        Borrowed,
        Direct,
    }

    /// The same with Binance futures events, which carry `pu` and are checked by it.
    #[test]
    fn futures_rule_converges_under_drops_duplicates_and_reordering() {
        converge(ContinuityRule::Futures, Feed::Owned);
    }

    fn converge(rule: ContinuityRule, how: Feed) {
        let mut abandoned = 0;
        let mut direct = 0;
        let mut feed = |s: &mut BookSync, d: DepthDelta, now: i64| match how {
            Feed::Owned => s.handle_delta(d, now),
            Feed::Borrowed => s.handle_delta_ref(d.as_ref(), now),
            Feed::Direct => {
                let abandon = d.last_id % 40 == 7 && d.checksum.is_none();
                if d.checksum.is_none() {
                    if let Some(mut dd) = s.direct_delta(d.first_id, d.last_id, d.prev_last_id) {
                        direct += 1;
                        let levels = d
                            .bids
                            .iter()
                            .map(|l| (Side::Bid, *l))
                            .chain(d.asks.iter().map(|l| (Side::Ask, *l)));
                        let n = d.bids.len() + d.asks.len();
                        for (i, (side, l)) in levels.enumerate() {
                            if abandon && i == n / 2 {
                                break;
                            }
                            dd.level(side, l);
                        }
                        if !abandon {
                            dd.commit();
                            return;
                        }
                        abandoned += 1;
                        dd.abandon();
                    }
                }
                s.handle_delta_ref(d.as_ref(), now);
            }
        };
        for seed in 0..40 {
            let mut rng = Rng::new(seed);
            let mut truth = OrderBook::new();
            let mut history: Vec<(u64, OrderBook)> = Vec::new();
            let mut config = spot();
            config.rule = rule;
            let mut s = BookSync::new(config);
            let mut id = 0u64;
            let mut pending_snapshot = false;
            let mut in_flight: Vec<DepthDelta> = Vec::new();
            // Drains the machine after every input, checking each announced book against the
            // truth at that update id.
            let pump = |s: &mut BookSync, pending: &mut bool, history: &[(u64, OrderBook)]| {
                while let Some(e) = s.poll_event() {
                    match e {
                        SyncEvent::NeedSnapshot { .. } => *pending = true,
                        SyncEvent::BookChanged { last_update_id } => {
                            let at =
                                history.iter().rev().find(|(u, _)| *u == last_update_id).unwrap();
                            assert_eq!(
                                s.book(),
                                &at.1,
                                "seed {seed}: book differs from truth at {last_update_id}"
                            );
                        }
                        SyncEvent::ChecksumMismatch { .. } => {
                            panic!("seed {seed}: a correct book failed its checksum")
                        }
                        _ => {}
                    }
                }
            };
            for step in 0..3_000 {
                // the source changes its book
                let n = 1 + rng.below(4) as usize;
                let mut bids = Vec::new();
                let mut asks = Vec::new();
                for _ in 0..n {
                    let d = rng.top_skewed(50) as i64;
                    let q = if rng.chance(1, 4) { 0 } else { 1 + rng.below(9) as i64 };
                    if rng.chance(1, 2) {
                        truth.apply(Side::Bid, Price::from_units(1000 - d), Qty::from_units(q));
                        bids.push(lv(1000 - d, q));
                    } else {
                        truth.apply(Side::Ask, Price::from_units(1001 + d), Qty::from_units(q));
                        asks.push(lv(1001 + d, q));
                    }
                }
                let prev = id;
                // futures events may skip ids (pu links them); spot events are contiguous
                let first =
                    if rule == ContinuityRule::Futures { id + 1 + rng.below(3) } else { id + 1 };
                id = first + rng.below(3); // several raw updates per event
                history.push((id, truth.clone()));
                let prev_last_id = (rule == ContinuityRule::Futures).then_some(prev);
                let mut ev = DepthDelta {
                    first_id: first,
                    last_id: id,
                    prev_last_id,
                    bids,
                    asks,
                    checksum: None,
                };
                if rng.chance(1, 3) {
                    ev.checksum = Some(truth.checksum(10));
                }
                // a noisy channel for the first 2000 steps, clean afterwards
                let noisy = step < 2_000;
                if noisy && rng.chance(1, 50) {
                    // dropped
                } else if noisy && rng.chance(1, 30) {
                    in_flight.push(ev.clone());
                    in_flight.push(ev);
                } else {
                    in_flight.push(ev);
                }
                if noisy && in_flight.len() >= 2 && rng.chance(1, 30) {
                    let k = in_flight.len();
                    in_flight.swap(k - 1, k - 2);
                }
                // deliver everything but (sometimes) the newest
                let keep = if noisy && !in_flight.is_empty() && rng.chance(1, 4) { 1 } else { 0 };
                let deliver: Vec<_> = in_flight.drain(..in_flight.len() - keep).collect();
                for d in deliver {
                    feed(&mut s, d, step);
                    pump(&mut s, &mut pending_snapshot, &history);
                }
                if pending_snapshot && rng.chance(1, 3) {
                    pending_snapshot = false;
                    let (b, a) = truth.top(1000);
                    s.handle_snapshot(DepthSnapshot { last_update_id: id, bids: b, asks: a }, step);
                    pump(&mut s, &mut pending_snapshot, &history);
                }
            }
            // clean tail: flush whatever is in flight and let the machine settle
            for d in in_flight.drain(..) {
                feed(&mut s, d, 10_000);
                pump(&mut s, &mut pending_snapshot, &history);
            }
            for _ in 0..5 {
                if pending_snapshot {
                    pending_snapshot = false;
                    let (b, a) = truth.top(1000);
                    s.handle_snapshot(
                        DepthSnapshot { last_update_id: id, bids: b, asks: a },
                        10_000,
                    );
                    pump(&mut s, &mut pending_snapshot, &history);
                }
            }
            // the machine is either synced with an exact book or waiting for a bridging delta
            if s.state() == SyncState::Synced {
                assert_eq!(s.book(), &truth, "seed {seed}");
                assert_eq!(s.last_update_id(), id);
            } else {
                assert_eq!(s.state(), SyncState::Bridging, "seed {seed}");
            }
            assert!(
                s.stats().gaps > 0
                    || s.stats().checksum_mismatches > 0
                    || s.stats().stale_dropped > 0
            );
        }
        if how == Feed::Direct {
            assert!(
                direct > 10_000 && abandoned > 100,
                "{direct} direct deltas, {abandoned} abandoned"
            );
        }
    }
}
