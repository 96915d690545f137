//! Publishing an order book to millrace's own clients
//! (seeds/local-order-book-snapshot-delta-sync.md,
//! the server's side), the pure part: [`BookDiff`] compares a producer's book with what was last
//! published and mints the `depth_update@` event that takes a client from one to the other.
//!
//! Diffing (rather than forwarding the producer's own changes) costs the producer nothing per
//! upstream event, and makes the published stream self-consistent whatever happened upstream:
//! after a resync, a job restart or a migration between shards, the next delta takes a client
//! from exactly what it was sent to exactly the new book. The rules:
//! - **Only a trustworthy book is published**: nothing while the producer's [`BookHealth`] is not
//!   publishable, or while the book is crossed ([`Verdict`]).
//! - **Each event continues the last**: `U = u = pu + 1`, where `pu` is the previous event's `u`
//!   (consecutive ids, so a client on Binance's spot rule `U <= last + 1` and one on the futures
//!   rule `pu == last` both follow), and `cs` is the checksum of the top [`CHECKSUM_LEVELS`]
//!   after the event. A producer that replaces another continues from the id the last one
//!   published (the server's registry keeps it), so ids strictly increase per instrument.
//!
//! The server wraps this in its `BookPublisher` (registry, bus, REST snapshot); a test can drive
//! it alone and apply the events with the client's own `BookSync`.

use crate::book::{Ladder, Level, OrderBook, Side, CHECKSUM_LEVELS};
use crate::fixed::Qty;
use crate::protocol::{BookHealth, DepthSnapshotEvent, DepthUpdateEvent, InstrumentId};

/// What [`BookDiff::check`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The producer's book is not trustworthy right now: nothing may be sent.
    Withheld,
    /// The book is crossed: nothing may be sent (a crossed book is never shown).
    Crossed,
    /// Nothing changed since the last publish.
    Unchanged,
    /// Levels changed: [`BookDiff::mint`] the event.
    Changed,
}

/// The published side of one book: the book as last published, its last update id, and the
/// pending difference to a producer's newer book.
#[derive(Debug, Clone)]
pub struct BookDiff {
    instrument: InstrumentId,
    /// The book as last published (what every in-sync client holds).
    last: OrderBook,
    last_id: u64,
    /// The changed levels found by the last [`BookDiff::check`], best first.
    bids: Vec<Level>,
    asks: Vec<Level>,
}

impl BookDiff {
    /// Continues after a book published as `bids` / `asks` (best first) with update id `last_id`
    /// (an empty book and the first id to continue from, for a new instrument).
    pub fn new(instrument: InstrumentId, bids: &[Level], asks: &[Level], last_id: u64) -> Self {
        let mut last = OrderBook::new();
        last.replace(bids, asks);
        BookDiff { instrument, last, last_id, bids: Vec::new(), asks: Vec::new() }
    }

    pub fn instrument(&self) -> &InstrumentId {
        &self.instrument
    }

    /// The book as last published.
    pub fn last(&self) -> &OrderBook {
        &self.last
    }

    /// The `u` of the last event minted.
    pub fn last_id(&self) -> u64 {
        self.last_id
    }

    /// Compares the producer's `book` (in the state `health`) with what was last published.
    pub fn check(&mut self, book: &OrderBook, health: BookHealth) -> Verdict {
        self.bids.clear();
        self.asks.clear();
        if !health.is_publishable() {
            return Verdict::Withheld;
        }
        if book.is_crossed() {
            return Verdict::Crossed;
        }
        diff_side(self.last.side(Side::Bid), book.side(Side::Bid), &mut self.bids);
        diff_side(self.last.side(Side::Ask), book.side(Side::Ask), &mut self.asks);
        if self.bids.is_empty() && self.asks.is_empty() {
            Verdict::Unchanged
        } else {
            Verdict::Changed
        }
    }

    /// After [`Verdict::Changed`]: the event carrying the difference as update
    /// [`Self::last_id`]` + 1`, applied to the published book. Hand the event back with
    /// [`Self::recycle`] once it is sent, so the next diff reuses its buffers.
    pub fn mint(&mut self, now_ms: i64) -> DepthUpdateEvent {
        let id = self.last_id + 1;
        for l in &self.bids {
            self.last.apply(Side::Bid, l.price, l.qty);
        }
        for l in &self.asks {
            self.last.apply(Side::Ask, l.price, l.qty);
        }
        let event = DepthUpdateEvent {
            e: "depthUpdate".into(),
            event_time: now_ms,
            s: self.instrument.clone(),
            first_id: id,
            u: id,
            pu: self.last_id,
            b: std::mem::take(&mut self.bids),
            a: std::mem::take(&mut self.asks),
            cs: self.last.checksum(CHECKSUM_LEVELS),
        };
        self.last_id = id;
        event
    }

    /// Takes back a minted event's level buffers.
    pub fn recycle(&mut self, event: DepthUpdateEvent) {
        self.bids = event.b;
        self.asks = event.a;
        self.bids.clear();
        self.asks.clear();
    }

    /// The `depth@…,{levels}` snapshot of the published book.
    pub fn snapshot(&self, levels: u16, now_ms: i64) -> DepthSnapshotEvent {
        let (bids, asks) = self.last.top(usize::from(levels));
        DepthSnapshotEvent {
            event_time: now_ms,
            s: self.instrument.clone(),
            u: self.last_id,
            bids,
            asks,
        }
    }
}

/// The levels of `new` that differ from `old` (quantity 0 for a level that is gone), best first.
/// Both ladders iterate best first, so one merge pass over both does it.
fn diff_side(old: &Ladder, new: &Ladder, out: &mut Vec<Level>) {
    out.clear();
    let better = |a: &Level, b: &Level| match old.side() {
        Side::Bid => a.price > b.price,
        Side::Ask => a.price < b.price,
    };
    let mut o = old.iter().peekable();
    let mut n = new.iter().peekable();
    loop {
        match (o.peek(), n.peek()) {
            (None, None) => break,
            (Some(a), None) => {
                out.push(Level::new(a.price, Qty::ZERO));
                o.next();
            }
            (None, Some(b)) => {
                out.push(*b);
                n.next();
            }
            (Some(a), Some(b)) => {
                if a.price == b.price {
                    if a.qty != b.qty {
                        out.push(*b);
                    }
                    o.next();
                    n.next();
                } else if better(a, b) {
                    out.push(Level::new(a.price, Qty::ZERO));
                    o.next();
                } else {
                    out.push(*b);
                    n.next();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixed::Price;
    use crate::protocol::Market;
    use crate::sync::{BookSync, ContinuityRule, DepthSnapshot, SyncConfig, SyncEvent};
    use crate::testkit::{mutate_book, Rng};

    fn inst() -> InstrumentId {
        InstrumentId::new("sim", Market::Spot, "BTC/USDT")
    }

    #[test]
    fn diff_applied_to_the_old_book_gives_the_new_one() {
        let mut rng = Rng::new(7);
        for _ in 0..500 {
            let mut old = OrderBook::new();
            mutate_book(&mut old, &mut rng);
            mutate_book(&mut old, &mut rng);
            let mut new = old.clone();
            mutate_book(&mut new, &mut rng);
            if rng.below(10) == 0 {
                new.clear();
            }
            let mut patched = old.clone();
            for side in [Side::Bid, Side::Ask] {
                let mut out = Vec::new();
                diff_side(old.side(side), new.side(side), &mut out);
                // no level twice, and no no-op entries
                for w in out.windows(2) {
                    assert_ne!(w[0].price, w[1].price);
                }
                for l in &out {
                    assert_ne!(old.side(side).get(l.price), l.qty, "no-op entry {l:?}");
                    patched.apply(side, l.price, l.qty);
                }
            }
            assert_eq!(patched.top(1000), new.top(1000));
        }
    }

    /// The events, applied by a client's `BookSync` synced from the published book, keep it equal
    /// to the producer's book whenever it may be shown; unhealthy and crossed books send nothing.
    #[test]
    fn a_client_following_the_events_holds_the_producers_book() {
        let mut rng = Rng::new(42);
        let mut book = OrderBook::new();
        while book.bids.is_empty() && book.asks.is_empty() {
            mutate_book(&mut book, &mut rng);
        }
        let mut diff = BookDiff::new(inst(), &[], &[], 1000);
        assert_eq!(diff.check(&book, BookHealth::Synced), Verdict::Changed);
        let first = diff.mint(0);
        assert_eq!((first.first_id, first.u, first.pu), (1001, 1001, 1000));
        diff.recycle(first);
        let (bids, asks) = diff.last().top(usize::MAX);
        let mut config = SyncConfig::new(ContinuityRule::Spot);
        config.verify_interval_ms = None;
        let mut client = BookSync::new(config);
        client.handle_snapshot(DepthSnapshot { last_update_id: diff.last_id(), bids, asks }, 0);
        for step in 0..3000 {
            mutate_book(&mut book, &mut rng);
            let health = match step % 97 {
                0..=4 => BookHealth::Resyncing,
                5 => BookHealth::Stale,
                6 => BookHealth::SnapshotMode,
                _ => BookHealth::Synced,
            };
            let mut shown = book.clone();
            if step % 151 == 0 {
                shown.apply(Side::Bid, Price::from_units(2000), Qty::from_units(1));
            }
            let verdict = diff.check(&shown, health);
            match verdict {
                Verdict::Withheld => assert!(!health.is_publishable()),
                Verdict::Crossed => assert!(shown.is_crossed()),
                Verdict::Unchanged => {
                    assert_eq!(shown.top(usize::MAX), diff.last().top(usize::MAX))
                }
                Verdict::Changed => {
                    let last = diff.last_id();
                    let ev = diff.mint(step);
                    assert_eq!((ev.first_id, ev.u, ev.pu), (last + 1, last + 1, last));
                    assert_eq!(ev.cs, diff.last().checksum(CHECKSUM_LEVELS));
                    client.handle_delta((&ev).into(), step);
                    diff.recycle(ev);
                }
            }
            while let Some(e) = client.poll_event() {
                assert!(
                    !matches!(
                        e,
                        SyncEvent::ChecksumMismatch { .. } | SyncEvent::GapDetected { .. }
                    ),
                    "{e:?}"
                );
            }
            if matches!(verdict, Verdict::Changed | Verdict::Unchanged) {
                assert_eq!(client.book().top(usize::MAX), book.top(usize::MAX), "step {step}");
            }
        }
        let snap = diff.snapshot(20, 5);
        assert_eq!((snap.u, snap.bids.len() <= 20), (diff.last_id(), true));
        assert_eq!((snap.bids, snap.asks), diff.last().top(20));
    }
}
