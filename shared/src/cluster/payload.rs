//! Payloads between a cluster's processes, each with its natural id, and the de-duplication
//! that lets every payload reach downstream once although `redundancy` workers produce it.
//!
//! - A closed 1m candle travels from the workers to the persister as a [`ClosedCandle`] on
//!   JetStream, whose `Nats-Msg-Id` is [`ClosedCandle::msg_id`] — (series, open time) — so the
//!   stream keeps one copy of each within its duplicate window; the store's upsert by the same
//!   key covers what arrives later (a gap fill after an outage).
//! - Forming candles travel on core NATS from every replica. Replicas throttle independently,
//!   so they may send different updates of one minute and in any interleaving: [`KlineDedup`]
//!   passes each update once and never one older than what already passed (key: series, open
//!   time, event time), and each closed candle once (key: series, open time).
//! - Depth diffs travel as the exchange sent them, on a JetStream stream whose `Nats-Msg-Id`
//!   is (instrument, `U`, `u`): every replica sees the exchange's same ids, so one copy of each
//!   diff is kept whichever replica was first. A replica that missed a diff (its connection
//!   broke) can still be first with the next one; [`DiffReorder`] holds a diff that does not
//!   continue the last one briefly, until the other replica's copy of the missing diff arrives.
//! - A book snapshot is asked of the workers that hold the book ([`BookSnapshotReply`]).

use serde::{Deserialize, Serialize};

use std::collections::BTreeMap;

use crate::book::Level;
use crate::candle::Candle;
use crate::fixed::Price;
use crate::protocol::{KlineEvent, Push, SeriesId};

/// A closed 1m candle from a worker's kline task, on its way to the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClosedCandle {
    pub series: SeriesId,
    pub candle: Candle,
}

impl ClosedCandle {
    /// The natural id: `{series}|{open_time}` (JetStream's `Nats-Msg-Id`).
    pub fn msg_id(&self) -> String {
        format!("{}|{}", self.series, self.candle.open_time)
    }
}

/// What [`KlineDedup::admit`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// New: pass it on.
    Pass,
    /// Seen already, or older than what passed: drop it.
    Duplicate,
    /// Not a kline push.
    Malformed,
}

/// The high-water marks of one `kline@{series}` topic (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KlineDedup {
    /// (open time, event time) of the newest forming update passed.
    forming: Option<(i64, i64)>,
    /// Open time of the newest closed candle passed.
    closed: Option<i64>,
}

impl KlineDedup {
    pub fn new() -> Self {
        Self::default()
    }

    /// Decides on one push frame (`{"stream":"kline@…","data":{…}}`).
    pub fn admit(&mut self, frame: &[u8]) -> Admit {
        let Ok(push) = serde_json::from_slice::<Push<KlineEvent>>(frame) else {
            return Admit::Malformed;
        };
        self.admit_event(&push.data)
    }

    /// Decides on one kline event.
    pub fn admit_event(&mut self, ev: &KlineEvent) -> Admit {
        let open = ev.k.t;
        if ev.k.x {
            if self.closed.is_some_and(|c| open <= c) {
                return Admit::Duplicate;
            }
            self.closed = Some(open);
            return Admit::Pass;
        }
        // A forming update of a minute that already closed, or not newer than the last one.
        if self.closed.is_some_and(|c| open <= c)
            || self.forming.is_some_and(|f| (open, ev.event_time) <= f)
        {
            return Admit::Duplicate;
        }
        self.forming = Some((open, ev.event_time));
        Admit::Pass
    }
}

/// A worker's synced book, answered to a gateway's snapshot request: the book at
/// `last_update_id` as the worker publishes it (pruned to the range its REST snapshots
/// covered), and that range (`None`: the side is whole).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BookSnapshotReply {
    pub last_update_id: u64,
    pub bids: Vec<Level>,
    pub asks: Vec<Level>,
    pub bid_floor: Option<Price>,
    pub ask_ceiling: Option<Price>,
}

/// Depth diffs back in order after de-duplication (see the module docs). A diff is known by
/// `prev` (the id it continues from: `pu`, or `U - 1` on spot) and `u`. One that continues the
/// last diff passed (or may: `prev <= last`) passes at once, with every held diff it unblocks;
/// one that does not is held for at most `hold_ms`, after which the held diffs pass in order of
/// `u` and the consumer's own rules see the gap. A diff at or below the last `u` is a duplicate.
#[derive(Debug, Clone)]
pub struct DiffReorder<T> {
    hold_ms: i64,
    last_u: Option<u64>,
    /// Held diffs by `u`: (prev, item).
    held: BTreeMap<u64, (u64, T)>,
    /// When the oldest held diff arrived.
    since: Option<i64>,
    duplicates: u64,
    released_gaps: u64,
}

impl<T> DiffReorder<T> {
    pub fn new(hold_ms: i64) -> Self {
        DiffReorder {
            hold_ms,
            last_u: None,
            held: BTreeMap::new(),
            since: None,
            duplicates: 0,
            released_gaps: 0,
        }
    }

    /// Takes one diff; what may pass now is appended to `out`.
    pub fn push(&mut self, prev: u64, u: u64, item: T, now_ms: i64, out: &mut Vec<T>) {
        if self.last_u.is_some_and(|l| u <= l) || self.held.contains_key(&u) {
            self.duplicates += 1;
            return;
        }
        if self.last_u.is_none_or(|l| prev <= l) {
            self.last_u = Some(u);
            out.push(item);
            self.release_continuing(out);
        } else {
            self.held.insert(u, (prev, item));
            self.since.get_or_insert(now_ms);
        }
    }

    fn release_continuing(&mut self, out: &mut Vec<T>) {
        while let Some(entry) = self.held.first_entry() {
            let (u, (prev, _)) = (*entry.key(), entry.get());
            let last = self.last_u.unwrap_or(0);
            if u <= last {
                entry.remove();
                self.duplicates += 1;
            } else if *prev <= last {
                let (_, item) = entry.remove();
                self.last_u = Some(u);
                out.push(item);
            } else {
                break;
            }
        }
        if self.held.is_empty() {
            self.since = None;
        }
    }

    /// When [`DiffReorder::expire`] should be called next (`None`: nothing held).
    pub fn deadline(&self) -> Option<i64> {
        self.since.map(|s| s + self.hold_ms)
    }

    /// Releases everything held once it has waited `hold_ms`: the missing diff is not coming.
    pub fn expire(&mut self, now_ms: i64, out: &mut Vec<T>) {
        if self.deadline().is_none_or(|d| now_ms < d) {
            return;
        }
        self.released_gaps += 1;
        for (u, (_, item)) in std::mem::take(&mut self.held) {
            self.last_u = Some(u);
            out.push(item);
        }
        self.since = None;
    }

    /// Forgets the position (a new subscription).
    pub fn reset(&mut self) {
        self.last_u = None;
        self.held.clear();
        self.since = None;
    }

    /// Diffs dropped as already passed.
    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }

    /// Times held diffs were released over a gap that never filled.
    pub fn released_gaps(&self) -> u64 {
        self.released_gaps
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;
    use crate::candle::Timeframe;
    use crate::fixed::{Price, Volume};
    use crate::protocol::{KlinePayload, Stream};

    fn frame(open: i64, event: i64, closed: bool) -> Vec<u8> {
        let s: SeriesId = "sim:spot:BTC/USDT:1m".parse().unwrap();
        let p = Price(100);
        let push = Push {
            stream: Stream::Kline(s.clone()),
            data: KlineEvent {
                e: "kline".into(),
                event_time: event,
                s,
                k: KlinePayload {
                    t: open,
                    close_time: open + 59_999,
                    i: Timeframe::M1,
                    o: p,
                    h: p,
                    l: p,
                    c: p,
                    v: Volume(1),
                    n: 1,
                    x: closed,
                },
            },
        };
        serde_json::to_vec(&push).unwrap()
    }

    #[test]
    fn each_update_passes_once_and_never_goes_back() {
        let mut d = KlineDedup::new();
        // replica A: events 1, 3; replica B: 2, 3 — interleaved 1, 3(A), 2(B), 3(B)
        assert_eq!(d.admit(&frame(0, 1, false)), Admit::Pass);
        assert_eq!(d.admit(&frame(0, 3, false)), Admit::Pass);
        assert_eq!(d.admit(&frame(0, 2, false)), Admit::Duplicate, "older than what passed");
        assert_eq!(d.admit(&frame(0, 3, false)), Admit::Duplicate);
        // the next minute forms before the persister's closed candle of minute 0 arrives
        assert_eq!(d.admit(&frame(60_000, 60_500, false)), Admit::Pass);
        assert_eq!(d.admit(&frame(0, 60_000, true)), Admit::Pass);
        assert_eq!(d.admit(&frame(0, 60_000, true)), Admit::Duplicate, "a redelivery");
        assert_eq!(d.admit(&frame(60_000, 61_000, false)), Admit::Pass);
        assert_eq!(d.admit(&frame(60_000, 120_000, true)), Admit::Pass);
        // a late forming update of a closed minute
        assert_eq!(d.admit(&frame(60_000, 119_000, false)), Admit::Duplicate);
        assert_eq!(d.admit(b"{\"stream\":\"heartbeat\"}"), Admit::Malformed);
    }

    #[test]
    fn closed_candles_have_their_natural_id() {
        let c = ClosedCandle {
            series: "sim:spot:BTC/USDT:1m".parse().unwrap(),
            candle: Candle::one_minute(
                60_000,
                Price(1),
                Price(1),
                Price(1),
                Price(1),
                Volume(1),
                1,
            ),
        };
        assert_eq!(c.msg_id(), "sim:spot:BTC/USDT:1m|60000");
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<ClosedCandle>(&json).unwrap(), c);
    }

    #[test]
    fn diffs_pass_in_order_once_and_a_missing_one_is_waited_for() {
        let mut r = DiffReorder::new(200);
        let mut out = Vec::new();
        // spot ids: prev = U - 1
        r.push(9, 10, "a10", 0, &mut out);
        r.push(10, 12, "a12", 1, &mut out);
        r.push(10, 12, "b12", 2, &mut out); // the other replica's copy
        assert_eq!(out, vec!["a10", "a12"]);
        // replica a missed 13..14 and is first with 15..16: held until b's 13..14 arrives
        r.push(14, 16, "a16", 10, &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(r.deadline(), Some(210));
        r.push(12, 14, "b14", 30, &mut out);
        assert_eq!(out, vec!["a10", "a12", "b14", "a16"]);
        assert_eq!(r.deadline(), None);
        r.push(14, 16, "b16", 31, &mut out);
        assert_eq!(r.duplicates(), 2);
        // a real gap: released after hold_ms, in order of u
        r.push(20, 22, "x22", 100, &mut out);
        r.push(18, 20, "x20", 150, &mut out);
        r.expire(299, &mut out);
        assert_eq!(out.len(), 4);
        r.expire(300, &mut out);
        assert_eq!(&out[4..], ["x20", "x22"]);
        assert_eq!(r.released_gaps(), 1);
        // futures ids (prev = pu) work the same way
        r.push(22, 25, "f25", 400, &mut out);
        assert_eq!(out.last(), Some(&"f25"));
    }

    #[test]
    fn book_snapshot_replies_round_trip() {
        let reply = BookSnapshotReply {
            last_update_id: 7,
            bids: vec![Level::new(Price(100), crate::fixed::Qty(2))],
            asks: vec![],
            bid_floor: Some(Price(90)),
            ask_ceiling: None,
        };
        let json = serde_json::to_string(&reply).unwrap();
        assert_eq!(serde_json::from_str::<BookSnapshotReply>(&json).unwrap(), reply);
    }
}
