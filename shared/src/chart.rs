//! A chart's candle series, kept live: closed history from REST merged with the forming and
//! closed candles of a `kline@…` stream.
//!
//! The order of arrival is the browser's, not the server's: the stream is subscribed before the
//! history is fetched (so nothing falls between them), pushes may therefore come before, during
//! and after the history, and a reconnect may skip minutes. [`LiveSeries`] turns all of that
//! into one ordered series with at most one candle per open time:
//! - history and live candles are merged by open time; a closed candle is final and is never
//!   replaced by a forming one of the same open time;
//! - an update older than the last candle is ignored and counted (never reorders the chart);
//! - a candle that opens more than one interval after the last one, or that replaces a forming
//!   candle whose close was never seen, reports [`Applied::Gap`]: the caller refetches history
//!   from [`LiveSeries::refetch_from`] and merges it with [`LiveSeries::load_history`].
//!
//! Painting is incremental: [`LiveSeries::take_changes`] says whether the whole series must be
//! redrawn or only its last few candles.

use std::collections::VecDeque;

use crate::candle::{Candle, Timeframe};
use crate::fixed::DECIMALS;

/// What [`LiveSeries::apply`] did with a live candle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// A new last candle.
    Appended,
    /// The last candle was updated (the forming candle moved, or it closed).
    Updated,
    /// Older than the last candle, or a forming update of a candle already closed: ignored.
    Stale,
    /// Applied, but candles are missing before it (from [`LiveSeries::refetch_from`]).
    Gap,
}

/// What changed since the last [`LiveSeries::take_changes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Changes {
    None,
    /// Redraw everything.
    All,
    /// Only the candles from this index on changed (or were appended).
    From(usize),
}

/// Counters a chart can show.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SeriesStats {
    pub stale: u64,
    pub gaps: u64,
    pub history_loads: u64,
}

/// Candles of one series in open-time order, the last one possibly forming.
#[derive(Debug, Clone)]
pub struct LiveSeries {
    tf: Timeframe,
    cap: usize,
    candles: VecDeque<Candle>,
    /// Whether `candles.back()` is closed (final).
    last_closed: bool,
    changes: Changes,
    /// Open time from which history must be refetched, if a gap was seen.
    refetch_from: Option<i64>,
    stats: SeriesStats,
}

impl LiveSeries {
    /// An empty series of `tf` keeping at most `cap` candles (the oldest are dropped).
    pub fn new(tf: Timeframe, cap: usize) -> Self {
        LiveSeries {
            tf,
            cap: cap.max(1),
            candles: VecDeque::new(),
            last_closed: true,
            changes: Changes::None,
            refetch_from: None,
            stats: SeriesStats::default(),
        }
    }

    pub fn timeframe(&self) -> Timeframe {
        self.tf
    }

    pub fn len(&self) -> usize {
        self.candles.len()
    }

    pub fn is_empty(&self) -> bool {
        self.candles.is_empty()
    }

    pub fn candles(&self) -> &VecDeque<Candle> {
        &self.candles
    }

    /// The last candle and whether it is closed.
    pub fn last(&self) -> Option<(&Candle, bool)> {
        self.candles.back().map(|c| (c, self.last_closed))
    }

    pub fn stats(&self) -> SeriesStats {
        self.stats
    }

    /// Where history should be refetched from after a gap (`None` when there is none).
    pub fn refetch_from(&self) -> Option<i64> {
        self.refetch_from
    }

    /// Merges closed candles from REST (any order; duplicates collapse). A stored (closed) candle
    /// replaces a live one of the same open time; live candles newer than the history stay (the
    /// forming one among them). Clears a pending refetch: what the server stored is the truth.
    pub fn load_history(&mut self, mut history: Vec<Candle>) {
        self.stats.history_loads += 1;
        history.sort_by_key(|c| c.open_time);
        history.dedup_by_key(|c| c.open_time);
        let mut merged: Vec<(Candle, bool)> =
            Vec::with_capacity(history.len() + self.candles.len());
        let n = self.candles.len();
        let mut live = self
            .candles
            .drain(..)
            .enumerate()
            .map(|(i, c)| (c, i + 1 < n || self.last_closed))
            .peekable();
        let mut hist = history.into_iter().peekable();
        loop {
            match (hist.peek(), live.peek()) {
                (Some(h), Some((l, _))) if h.open_time == l.open_time => {
                    merged.push((*h, true));
                    hist.next();
                    live.next();
                }
                (Some(h), Some((l, _))) if h.open_time < l.open_time => {
                    merged.push((*h, true));
                    hist.next();
                }
                (Some(_), Some(_)) | (None, Some(_)) => merged.push(live.next().expect("peeked")),
                (Some(_), None) => merged.push((hist.next().expect("peeked"), true)),
                (None, None) => break,
            }
        }
        drop(live);
        self.last_closed = merged.last().is_none_or(|&(_, closed)| closed);
        self.candles = merged.into_iter().map(|(c, _)| c).collect();
        // what the server has stored is the truth: a gap it cannot fill stays, without asking again
        self.refetch_from = None;
        self.trim();
        self.changes = Changes::All;
    }

    /// Applies one candle from the stream (`closed`: Binance's `x`).
    pub fn apply(&mut self, candle: Candle, closed: bool) -> Applied {
        let d = self.tf.duration_ms();
        let Some(last) = self.candles.back().copied() else {
            self.candles.push_back(candle);
            self.last_closed = closed;
            self.mark(0);
            return Applied::Appended;
        };
        if candle.open_time < last.open_time
            || (candle.open_time == last.open_time && self.last_closed && !closed)
        {
            self.stats.stale += 1;
            return Applied::Stale;
        }
        if candle.open_time == last.open_time {
            *self.candles.back_mut().expect("not empty") = candle;
            self.last_closed = closed;
            self.mark(self.candles.len() - 1);
            return Applied::Updated;
        }
        // a later candle: the last one's close was missed if it was forming, and whole intervals
        // were missed if this one is not the next
        let missed_close = !self.last_closed;
        let gap = missed_close || candle.open_time - last.open_time > d;
        self.candles.push_back(candle);
        self.last_closed = closed;
        self.mark(self.candles.len() - 1);
        self.trim();
        if gap {
            self.stats.gaps += 1;
            let from = if missed_close { last.open_time } else { last.open_time + d };
            self.refetch_from = Some(self.refetch_from.map_or(from, |f| f.min(from)));
            Applied::Gap
        } else {
            Applied::Appended
        }
    }

    fn mark(&mut self, from: usize) {
        self.changes = match self.changes {
            Changes::None => Changes::From(from),
            Changes::From(f) => Changes::From(f.min(from)),
            Changes::All => Changes::All,
        };
    }

    fn trim(&mut self) {
        let mut dropped = 0;
        while self.candles.len() > self.cap {
            self.candles.pop_front();
            dropped += 1;
        }
        if dropped > 0 {
            if let Changes::From(f) = self.changes {
                self.changes = if f < dropped { Changes::All } else { Changes::From(f - dropped) };
            }
        }
    }

    /// What changed since the last call, and forgets it.
    pub fn take_changes(&mut self) -> Changes {
        std::mem::replace(&mut self.changes, Changes::None)
    }

    /// Decimal places the prices in the series use (for axis labels): the most any of them
    /// needs, at least 0.
    pub fn price_decimals(&self) -> u32 {
        let mut needed = 0;
        for c in &self.candles {
            for p in [c.open, c.high, c.low, c.close] {
                needed = needed.max(decimals_of(p.raw()));
            }
        }
        needed
    }
}

/// Decimal places a raw 10^-8 value needs.
fn decimals_of(raw: i64) -> u32 {
    let mut raw = raw.unsigned_abs();
    let mut d = DECIMALS;
    while d > 0 && raw % 10 == 0 {
        raw /= 10;
        d -= 1;
    }
    d
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;
    use crate::{Price, Volume};

    const M: i64 = 60_000;

    fn c(t: i64, close: &str) -> Candle {
        let p = Price::parse(close).unwrap();
        Candle::one_minute(t * M, p, p, p, p, Volume::parse("1").unwrap(), 1)
    }

    fn times(s: &LiveSeries) -> Vec<i64> {
        s.candles().iter().map(|c| c.open_time / M).collect()
    }

    #[test]
    fn live_before_history_merges_without_duplicates() {
        let mut s = LiveSeries::new(Timeframe::M1, 100);
        assert_eq!(s.apply(c(10, "5"), false), Applied::Appended);
        s.load_history((5..10).map(|t| c(t, "4")).collect());
        assert_eq!(times(&s), vec![5, 6, 7, 8, 9, 10]);
        assert_eq!(
            s.last().map(|(c, closed)| (c.close, closed)),
            Some((Price::parse("5").unwrap(), false))
        );
        assert_eq!(s.take_changes(), Changes::All);
        // history that overlaps the live part: the stored closed candle wins, the forming stays
        s.load_history((8..11).map(|t| c(t, "3")).collect());
        assert_eq!(times(&s), vec![5, 6, 7, 8, 9, 10]);
        assert_eq!(s.candles()[5].close, Price::parse("3").unwrap());
        assert!(s.last().unwrap().1, "a stored candle is closed");
    }

    #[test]
    fn forming_moves_then_closes_then_next_opens() {
        let mut s = LiveSeries::new(Timeframe::M1, 100);
        s.load_history((0..3).map(|t| c(t, "1")).collect());
        s.take_changes();
        assert_eq!(s.apply(c(3, "2"), false), Applied::Appended);
        assert_eq!(s.apply(c(3, "2.5"), false), Applied::Updated);
        assert_eq!(s.take_changes(), Changes::From(3));
        assert_eq!(s.apply(c(3, "2.25"), true), Applied::Updated);
        assert_eq!(s.apply(c(3, "9"), false), Applied::Stale, "a closed candle is final");
        assert_eq!(s.apply(c(2, "9"), true), Applied::Stale);
        assert_eq!(s.apply(c(4, "3"), false), Applied::Appended);
        assert_eq!(times(&s), vec![0, 1, 2, 3, 4]);
        assert_eq!(s.candles()[3].close, Price::parse("2.25").unwrap());
        assert_eq!(s.stats().stale, 2);
        assert_eq!(s.refetch_from(), None);
    }

    #[test]
    fn skipped_minutes_ask_for_history_and_history_fills_them() {
        let mut s = LiveSeries::new(Timeframe::M1, 100);
        s.load_history((0..3).map(|t| c(t, "1")).collect());
        assert_eq!(s.apply(c(6, "2"), false), Applied::Gap);
        assert_eq!(s.refetch_from(), Some(3 * M));
        s.load_history((3..6).map(|t| c(t, "1")).collect());
        assert_eq!(times(&s), (0..7).collect::<Vec<_>>());
        assert_eq!(s.refetch_from(), None);
        assert!(!s.last().unwrap().1);
    }

    #[test]
    fn a_missed_close_asks_for_that_candle_again() {
        let mut s = LiveSeries::new(Timeframe::M1, 100);
        s.apply(c(0, "1"), true);
        s.apply(c(1, "1.5"), false);
        // the close of minute 1 was lost in a reconnect
        assert_eq!(s.apply(c(2, "2"), false), Applied::Gap);
        assert_eq!(s.refetch_from(), Some(M));
        s.load_history(vec![c(0, "1"), c(1, "1.75")]);
        assert_eq!(s.candles()[1].close, Price::parse("1.75").unwrap());
        assert_eq!(s.refetch_from(), None);
        assert_eq!(s.stats().gaps, 1);
    }

    #[test]
    fn cap_drops_oldest_and_keeps_changes_right() {
        let mut s = LiveSeries::new(Timeframe::M1, 3);
        s.load_history((0..3).map(|t| c(t, "1")).collect());
        s.take_changes();
        s.apply(c(3, "1"), false);
        assert_eq!(times(&s), vec![1, 2, 3]);
        assert_eq!(s.take_changes(), Changes::From(2));
    }

    #[test]
    fn price_decimals_is_the_most_any_price_needs() {
        let mut s = LiveSeries::new(Timeframe::M1, 10);
        s.load_history(vec![c(0, "100"), c(1, "100.25"), c(2, "99.5")]);
        assert_eq!(s.price_decimals(), 2);
        assert_eq!(decimals_of(1), 8);
        assert_eq!(decimals_of(0), 0);
    }
}
