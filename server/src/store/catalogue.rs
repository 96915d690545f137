//! [`Catalogue`]: what `GET /api/v1/series` answers ([`super::CandleStore::series`]: each stored
//! series' count and first and last open time), kept in memory by each store, so the answer
//! touches no candle table. It used to count every row of every series per request.
//!
//! Each store loads it once at open and updates it from its own write path after a commit. A
//! write knows how many of its rows are new from the series' [`Span`] before it
//! ([`Span::plan`]): candles are never deleted, so an open time outside `[first, last]` is new and
//! one at either end exists; only the times strictly between (a gap fill, a rewrite of older
//! minutes) need asking the database, one query for all of them. So an upsert of stored minutes
//! never counts them twice, and live ingest and backfill pages (after the last minute, before
//! the first) ask nothing.
//!
//! Spans only grow (more candles, an earlier first, a later last), so [`Catalogue::merge`] keeps
//! the larger of what it has and what it is told: a refresh that read the database just before a
//! commit cannot undo that commit's update.

use std::collections::BTreeMap;
use std::sync::RwLock;

use shared::protocol::SeriesId;

use super::SeriesInfo;
use crate::lock::{read, write};

/// One series' stored candles: how many, the first and the last open time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub count: u64,
    pub first: i64,
    pub last: i64,
}

/// What a write of some open times does to a series ([`Span::plan`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Times not stored before, for sure.
    pub new: u64,
    /// Times strictly inside the stored span: stored or not, the database says.
    pub unsure: Vec<i64>,
    /// Times written.
    total: u64,
    /// The span once written, given how many of `unsure` are stored ([`Plan::after`]).
    first: i64,
    last: i64,
    before: u64,
}

impl Span {
    /// What writing `times` (sorted, distinct, not empty) does to a series spanning `span`
    /// (`None`: nothing stored).
    pub fn plan(span: Option<Span>, times: &[i64]) -> Plan {
        let (Some(&lo), Some(&hi)) = (times.first(), times.last()) else {
            return Plan {
                new: 0,
                unsure: Vec::new(),
                total: 0,
                first: span.map_or(0, |s| s.first),
                last: span.map_or(0, |s| s.last),
                before: span.map_or(0, |s| s.count),
            };
        };
        let Some(span) = span else {
            return Plan {
                new: times.len() as u64,
                unsure: Vec::new(),
                total: times.len() as u64,
                first: lo,
                last: hi,
                before: 0,
            };
        };
        let outside = times.iter().filter(|t| **t < span.first || **t > span.last).count();
        let unsure = times.iter().copied().filter(|t| *t > span.first && *t < span.last).collect();
        Plan {
            new: outside as u64,
            unsure,
            total: times.len() as u64,
            first: span.first.min(lo),
            last: span.last.max(hi),
            before: span.count,
        }
    }
}

impl Plan {
    /// The span once written, `stored` of [`Plan::unsure`] being stored already.
    pub fn after(&self, stored: u64) -> Span {
        let unsure = self.unsure.len() as u64;
        Span {
            count: self.before + self.new + unsure.saturating_sub(stored),
            first: self.first,
            last: self.last,
        }
    }

    /// Whether none of the times written was stored, `stored` of [`Plan::unsure`] being stored
    /// (the store may then take its bulk path for new rows).
    pub fn none_stored(&self, stored: u64) -> bool {
        stored == 0 && self.total == self.new + self.unsure.len() as u64
    }
}

/// The series catalogue of a store (see the module documentation).
#[derive(Debug, Default)]
pub struct Catalogue {
    /// By series name, the order of [`Catalogue::list`].
    series: RwLock<BTreeMap<String, (SeriesId, Span)>>,
}

impl Catalogue {
    /// The span of `series`, if it has candles.
    pub fn get(&self, series: &SeriesId) -> Option<Span> {
        read(&self.series).get(&series.to_string()).map(|(_, span)| *span)
    }

    /// Every series with candles, by name.
    pub fn list(&self) -> Vec<SeriesInfo> {
        read(&self.series)
            .values()
            .map(|(series, span)| SeriesInfo {
                series: series.clone(),
                count: span.count,
                first_open_time: span.first,
                last_open_time: span.last,
            })
            .collect()
    }

    /// Takes in what a commit or the database says of `series`, keeping the larger span.
    pub fn merge(&self, series: &SeriesId, span: Span) {
        let mut all = write(&self.series);
        let (_, have) = all.entry(series.to_string()).or_insert_with(|| (series.clone(), span));
        *have = Span {
            count: have.count.max(span.count),
            first: have.first.min(span.first),
            last: have.last.max(span.last),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(count: u64, first: i64, last: i64) -> Span {
        Span { count, first, last }
    }

    #[test]
    fn times_outside_the_span_are_new_and_inside_it_are_asked() {
        // nothing stored: everything new
        let p = Span::plan(None, &[5, 6, 7]);
        assert_eq!((p.new, p.unsure.clone()), (3, vec![]));
        assert_eq!(p.after(0), span(3, 5, 7));
        assert!(p.none_stored(0));
        // live ingest: after the last minute, and the last minute again (a derived bucket)
        let s = Some(span(10, 0, 9));
        let p = Span::plan(s, &[9, 10, 11]);
        assert_eq!((p.new, p.unsure.clone()), (2, vec![]));
        assert_eq!(p.after(0), span(12, 0, 11));
        assert!(!p.none_stored(0), "9 is stored");
        // a backfill page before the first, touching it
        let p = Span::plan(s, &[-3, -2, -1, 0]);
        assert_eq!(p.after(0), span(13, -3, 9));
        // a gap fill inside: the database says which are stored
        let p = Span::plan(Some(span(5, 0, 9)), &[0, 3, 4, 9, 12]);
        assert_eq!((p.new, p.unsure.clone()), (1, vec![3, 4]));
        assert_eq!(p.after(1), span(7, 0, 12), "one of 3, 4 was stored");
        assert_eq!(p.after(2), span(6, 0, 12));
        let p = Span::plan(Some(span(5, 0, 9)), &[3, 4, 12]);
        assert!(p.none_stored(0) && !p.none_stored(1));
        // a rewrite of stored minutes only: the count does not move
        let p = Span::plan(s, &[0, 9]);
        assert_eq!(p.after(0), span(10, 0, 9));
    }

    #[test]
    fn merging_keeps_the_larger_span() {
        let c = Catalogue::default();
        let (a, b): (SeriesId, SeriesId) =
            ("sim:spot:ETH/USDT:1m".parse().unwrap(), "sim:spot:BTC/USDT:1m".parse().unwrap());
        c.merge(&a, span(3, 10, 12));
        c.merge(&b, span(1, 0, 0));
        c.merge(&a, span(2, 10, 11)); // an older reading
        c.merge(&a, span(5, 8, 12));
        assert_eq!(c.get(&a), Some(span(5, 8, 12)));
        let names: Vec<String> = c.list().iter().map(|s| s.series.to_string()).collect();
        assert_eq!(names, ["sim:spot:BTC/USDT:1m", "sim:spot:ETH/USDT:1m"]);
    }
}
