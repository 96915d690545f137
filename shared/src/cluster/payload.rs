//! Payloads between a cluster's processes, each with its natural id, and the de-duplication
//! that lets every payload reach downstream once although `redundancy` workers produce it.
//!
//! - Closed 1m candles travel from the workers to the persister on JetStream as
//!   [`ClosedCandles`]: a series' candles of one aligned block of [`CANDLES_PER_MESSAGE`]
//!   minutes per message (a live minute alone; a gap fill in few messages), whose
//!   `Nats-Msg-Id` names the series and the minutes it holds ([`ClosedCandles::msg_id`]; a
//!   single candle's is (series, open time)), so the stream keeps one copy of what replicas
//!   send alike within its duplicate window. Replicas that cut a gap fill differently send
//!   overlapping messages; the persister drops a minute it has already written
//!   ([`MinuteRuns`]), and the store's upsert by (series, open time) covers the rest.
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

use super::bounds::{IdWindow, Poison, TimeWindow};
use crate::candle::{Timeframe, MINUTE_MS};

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

/// Most closed candles in one [`ClosedCandles`] message (about 60 KiB of JSON).
pub const CANDLES_PER_MESSAGE: usize = 500;

/// Closed 1m candles of one series, ascending, within one aligned block of
/// [`CANDLES_PER_MESSAGE`] minutes: one JetStream message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClosedCandles {
    pub series: SeriesId,
    pub candles: Vec<Candle>,
}

impl ClosedCandles {
    /// `candles` of `series` (ascending) cut into messages, one per aligned block of
    /// [`CANDLES_PER_MESSAGE`] minutes: replicas sending the same minutes send the same
    /// messages, whichever way their batches were cut.
    pub fn messages(series: &SeriesId, candles: &[Candle]) -> Vec<ClosedCandles> {
        let block = |c: &Candle| {
            c.open_time.div_euclid(crate::candle::MINUTE_MS * CANDLES_PER_MESSAGE as i64)
        };
        candles
            .chunk_by(|a, b| block(a) == block(b))
            .map(|run| ClosedCandles { series: series.clone(), candles: run.to_vec() })
            .collect()
    }

    /// The natural id: `{series}|{open_time}` for one candle (each minute's own id), else
    /// `{series}|{first}|{last}|{count}`.
    pub fn msg_id(&self) -> String {
        match self.candles.as_slice() {
            [] => format!("{}|-", self.series),
            [one] => format!("{}|{}", self.series, one.open_time),
            [first, .., last] => format!(
                "{}|{}|{}|{}",
                self.series,
                first.open_time,
                last.open_time,
                self.candles.len()
            ),
        }
    }
}

/// A closed 1m candle as a worker sends it: one minute, on a minute boundary, consistent.
pub fn is_closed_minute(c: &Candle) -> bool {
    c.minutes == 1 && c.open_time.rem_euclid(MINUTE_MS) == 0 && c.check().is_ok()
}

impl ClosedCandles {
    /// Checks a message as the persister takes it: a 1m series; 1 to
    /// [`CANDLES_PER_MESSAGE`] candles, strictly ascending, all in one aligned block of that
    /// many minutes (so a message spans less than one block, whatever it says); each a closed
    /// minute, opened within `window` and ended (closed) by its end. Which series the cluster
    /// runs is the shell's to check.
    pub fn check(&self, window: &TimeWindow) -> Result<(), Poison> {
        if self.series.timeframe != Timeframe::M1 {
            return Err(Poison::NotOneMinute);
        }
        let (Some(first), Some(last)) = (self.candles.first(), self.candles.last()) else {
            return Err(Poison::NotOneBlock);
        };
        if self.candles.len() > CANDLES_PER_MESSAGE {
            return Err(Poison::TooMany);
        }
        if !self.candles.iter().all(is_closed_minute) {
            return Err(Poison::NotClosedMinute);
        }
        let block = |t: i64| t.div_euclid(MINUTE_MS * CANDLES_PER_MESSAGE as i64);
        if block(first.open_time) != block(last.open_time)
            || self.candles.windows(2).any(|w| w[0].open_time >= w[1].open_time)
        {
            return Err(Poison::NotOneBlock);
        }
        // ascending within one block: the first and the last bound every other
        window.place(first.open_time)?;
        window.place(last.open_time + MINUTE_MS - 1)
    }
}

/// The minutes of one series a persister has written, as runs of consecutive minutes (one run
/// at steady state); the oldest runs are forgotten beyond [`MinuteRuns::MAX_RUNS`] (a minute
/// forgotten is written again, which the upsert makes harmless).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MinuteRuns {
    /// First open time -> last open time, both included.
    runs: BTreeMap<i64, i64>,
}

impl MinuteRuns {
    pub const MAX_RUNS: usize = 64;

    /// Whether the minute opening at `open_time` was written.
    pub fn contains(&self, open_time: i64) -> bool {
        self.runs.range(..=open_time).next_back().is_some_and(|(_, &last)| open_time <= last)
    }

    /// Marks the minute opening at `open_time` written.
    pub fn insert(&mut self, open_time: i64) {
        if self.contains(open_time) {
            return;
        }
        let step = crate::candle::MINUTE_MS;
        let mut first = open_time;
        let mut last = open_time;
        if let Some((&f, &l)) = self.runs.range(..open_time).next_back() {
            if l + step == open_time {
                first = f;
            }
        }
        if let Some(&l) = self.runs.get(&(open_time + step)) {
            self.runs.remove(&(open_time + step));
            last = l;
        }
        self.runs.insert(first, last);
        while self.runs.len() > Self::MAX_RUNS {
            self.runs.pop_first();
        }
    }

    /// How many runs are kept.
    pub fn runs(&self) -> usize {
        self.runs.len()
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
    /// Refused without moving the marks, so it cannot hold back the real updates that follow:
    /// a time beyond the exchange's clock ([`Poison::TooNew`]), or a closed candle from a
    /// sender that stores none ([`Poison::Sender`]).
    Outside(Poison),
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

    /// Decides on one push frame (`{"stream":"kline@…","data":{…}}`) whose times must lie in
    /// `window` (the exchange's clock with its margins).
    pub fn admit(&mut self, frame: &[u8], window: &TimeWindow) -> Admit {
        self.admit_from(frame, window, true)
    }

    /// [`KlineDedup::admit`] for a frame whose sender may (`stored`: the persister, after its
    /// commit) or may not (a worker: forming candles only) send a closed candle: a closed
    /// candle from a sender that stores none is refused ([`Poison::Sender`]).
    pub fn admit_from(&mut self, frame: &[u8], window: &TimeWindow, stored: bool) -> Admit {
        let Ok(push) = serde_json::from_slice::<Push<KlineEvent>>(frame) else {
            return Admit::Malformed;
        };
        if push.data.k.x && !stored {
            return Admit::Outside(Poison::Sender);
        }
        self.admit_event(&push.data, window)
    }

    /// Decides on one kline event. Its event time, its open time and, once closed, its close
    /// time must not lie beyond `window` (the exchange cannot have sent them yet): a mark never
    /// moves past what the exchange can have sent. (An old push is not refused: it cannot move
    /// a mark, and history pushed after a backfill is old.)
    pub fn admit_event(&mut self, ev: &KlineEvent, window: &TimeWindow) -> Admit {
        let open = ev.k.t;
        let newest = if ev.k.x { ev.k.close_time.max(open) } else { open };
        if newest.max(ev.event_time) > window.latest_ms {
            return Admit::Outside(Poison::TooNew);
        }
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
///
/// The diffs come from the bus, so their ids are checked against an [`IdWindow`] before they
/// can move the position: a diff covering no ids or too many, or continuing from too far past
/// the last `u`, is refused; at most [`DiffReorder::MAX_HELD`] diffs are held. A diff far below
/// the last `u` means that position came from a diff outside the book's ids (the first diff
/// of a feed has nothing to be checked against): the position is taken anew from it.
#[derive(Debug, Clone)]
pub struct DiffReorder<T> {
    hold_ms: i64,
    ids: IdWindow,
    last_u: Option<u64>,
    /// Held diffs by `u`: (prev, item).
    held: BTreeMap<u64, (u64, T)>,
    /// When the oldest held diff arrived.
    since: Option<i64>,
    duplicates: u64,
    released_gaps: u64,
    refused: u64,
    reanchored: u64,
}

/// What [`DiffReorder::push`] did with a diff.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// Passed (with whatever held diffs it unblocked).
    Passed,
    /// Held until the diff it continues from arrives, or `hold_ms` ends.
    Held,
    /// Already passed (or held).
    Duplicate,
    /// Outside the book's ids (see [`IdWindow`]), or more than [`DiffReorder::MAX_HELD`] held.
    Refused,
}

impl<T> DiffReorder<T> {
    /// Most diffs held at once (a few 100 ms diffs of each replica are held, at most).
    pub const MAX_HELD: usize = 256;

    pub fn new(hold_ms: i64) -> Self {
        Self::with_ids(hold_ms, IdWindow::default())
    }

    pub fn with_ids(hold_ms: i64, ids: IdWindow) -> Self {
        DiffReorder {
            hold_ms,
            ids,
            last_u: None,
            held: BTreeMap::new(),
            since: None,
            duplicates: 0,
            released_gaps: 0,
            refused: 0,
            reanchored: 0,
        }
    }

    /// Takes one diff; what may pass now is appended to `out`.
    pub fn push(&mut self, prev: u64, u: u64, item: T, now_ms: i64, out: &mut Vec<T>) -> Pushed {
        if u <= prev || u - prev > self.ids.span {
            self.refused += 1;
            return Pushed::Refused;
        }
        if let Some(last) = self.last_u {
            if u <= last {
                if last - u < self.ids.below {
                    self.duplicates += 1;
                    return Pushed::Duplicate;
                }
                // The position came from outside the book's ids: take it anew from here.
                self.reset();
                self.reanchored += 1;
            } else if prev > last.saturating_add(self.ids.ahead) {
                self.refused += 1;
                return Pushed::Refused;
            }
        }
        if self.held.contains_key(&u) {
            self.duplicates += 1;
            return Pushed::Duplicate;
        }
        if self.last_u.is_none_or(|l| prev <= l) {
            self.last_u = Some(u);
            out.push(item);
            self.release_continuing(out);
            Pushed::Passed
        } else if self.held.len() >= Self::MAX_HELD {
            self.refused += 1;
            Pushed::Refused
        } else {
            self.held.insert(u, (prev, item));
            self.since.get_or_insert(now_ms);
            Pushed::Held
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

    /// Diffs refused as outside the book's ids.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Times the position was taken anew because it had come from outside the book's ids.
    pub fn reanchored(&self) -> u64 {
        self.reanchored
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
    use std::collections::BTreeSet;

    fn minute(m: i64) -> Candle {
        let p = Price(100 + m % 7);
        Candle::one_minute(m * MINUTE, p, p, p, p, Volume(1), 1)
    }

    const MINUTE: i64 = crate::candle::MINUTE_MS;

    #[test]
    fn closed_candles_are_cut_on_aligned_blocks_whatever_the_batches() {
        let s: SeriesId = "sim:spot:BTC/USDT:1m".parse().unwrap();
        let n = CANDLES_PER_MESSAGE as i64;
        let all: Vec<Candle> = (n - 30..3 * n + 10).map(minute).collect();
        let whole = ClosedCandles::messages(&s, &all);
        assert_eq!(whole.len(), 4);
        assert!(whole.iter().all(|m| m.candles.len() <= CANDLES_PER_MESSAGE));
        assert_eq!(whole.iter().flat_map(|m| m.candles.clone()).collect::<Vec<_>>(), all);
        // another replica's batches cut elsewhere: the full blocks' messages are the same
        let mut other = Vec::new();
        for part in all.chunks(137) {
            other.extend(ClosedCandles::messages(&s, part));
        }
        let ids = |ms: &[ClosedCandles]| ms.iter().map(|m| m.msg_id()).collect::<BTreeSet<_>>();
        let (a, b) = (ids(&whole), ids(&other));
        assert!(a.intersection(&b).count() >= 2, "{a:?} / {b:?}");
        // one candle's id is its minute's
        let one = ClosedCandles { series: s.clone(), candles: vec![minute(7)] };
        assert_eq!(one.msg_id(), format!("{s}|{}", 7 * MINUTE));
        assert_ne!(whole[1].msg_id(), whole[2].msg_id());
        let text = serde_json::to_string(&whole[0]).unwrap();
        assert_eq!(serde_json::from_str::<ClosedCandles>(&text).unwrap(), whole[0]);
    }

    fn closed_minute(t: i64) -> Candle {
        Candle::one_minute(t, Price(10), Price(12), Price(9), Price(11), Volume(3), 2)
    }

    fn msg(series: &str, opens: &[i64]) -> ClosedCandles {
        ClosedCandles {
            series: series.parse::<SeriesId>().unwrap(),
            candles: opens.iter().map(|&t| closed_minute(t)).collect(),
        }
    }

    const NOW: i64 = 1_700_000_040_000;
    const M1: &str = "sim:spot:BTC/USDT:1m";

    #[test]
    fn closed_candle_messages_are_checked_as_the_persister_takes_them() {
        let w = TimeWindow::around(NOW, 86_400_000, 120_000);
        let t = NOW - NOW.rem_euclid(MINUTE_MS) - 10 * MINUTE_MS;
        assert_eq!(msg(M1, &[t, t + MINUTE_MS]).check(&w), Ok(()));
        // the out-of-memory batch of the issue: minute 0 and a minute near 2^53 ms
        let far = (1_i64 << 53) / MINUTE_MS * MINUTE_MS;
        assert_eq!(msg(M1, &[0, far]).check(&w), Err(Poison::NotOneBlock));
        assert_eq!(msg(M1, &[0]).check(&w), Err(Poison::TooOld));
        assert_eq!(msg(M1, &[far]).check(&w), Err(Poison::TooNew));
        assert_eq!(msg(M1, &[t + 100 * MINUTE_MS]).check(&w), Err(Poison::TooNew));
        // closed means ended: a minute that ends after now + the tolerance is not closed yet
        let current = NOW - NOW.rem_euclid(MINUTE_MS);
        assert_eq!(msg(M1, &[current]).check(&w), Ok(()), "it ends within the tolerance");
        assert_eq!(msg(M1, &[current + 2 * MINUTE_MS]).check(&w), Err(Poison::TooNew));
        assert_eq!(msg("sim:spot:BTC/USDT:5m", &[t]).check(&w), Err(Poison::NotOneMinute));
        assert_eq!(msg(M1, &[]).check(&w), Err(Poison::NotOneBlock));
        assert_eq!(msg(M1, &[t, t]).check(&w), Err(Poison::NotOneBlock), "a minute twice");
        assert_eq!(msg(M1, &[t + MINUTE_MS, t]).check(&w), Err(Poison::NotOneBlock));
        assert_eq!(msg(M1, &[t + 1]).check(&w), Err(Poison::NotClosedMinute));
        let mut inconsistent = msg(M1, &[t]);
        inconsistent.candles[0].high = Price(1);
        assert_eq!(inconsistent.check(&w), Err(Poison::NotClosedMinute));
        // a message holds at most one aligned block: a legit gap fill message is cut that way
        let block = MINUTE_MS * CANDLES_PER_MESSAGE as i64;
        let b0 = (t - 2 * block).div_euclid(block) * block;
        let whole: Vec<i64> = (0..CANDLES_PER_MESSAGE as i64).map(|i| b0 + i * MINUTE_MS).collect();
        assert_eq!(msg(M1, &whole).check(&w), Ok(()));
        assert_eq!(msg(M1, &[b0 - MINUTE_MS, b0]).check(&w), Err(Poison::NotOneBlock));
    }

    #[test]
    fn minute_runs_know_what_was_written() {
        let mut runs = MinuteRuns::default();
        let mut written = BTreeSet::new();
        // a deterministic shuffle of minutes with holes (120 minutes: never more than 64 runs)
        let mut x: u64 = 7;
        for _ in 0..1_000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let m = ((x >> 33) % 120) as i64;
            if m % 11 == 3 {
                continue; // never written
            }
            runs.insert(m * MINUTE);
            written.insert(m);
            for probe in 0..130 {
                assert_eq!(runs.contains(probe * MINUTE), written.contains(&probe), "{probe}");
            }
        }
        assert!(runs.runs() <= 12, "runs merged: {}", runs.runs());
        // only the newest runs are kept
        let mut many = MinuteRuns::default();
        for m in 0..(MinuteRuns::MAX_RUNS as i64 + 10) {
            many.insert(m * 2 * MINUTE);
        }
        assert_eq!(many.runs(), MinuteRuns::MAX_RUNS);
        assert!(!many.contains(0));
        assert!(many.contains((MinuteRuns::MAX_RUNS as i64 + 9) * 2 * MINUTE));
    }

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

    const ANY: TimeWindow = TimeWindow { earliest_ms: i64::MIN, latest_ms: i64::MAX };

    #[test]
    fn each_update_passes_once_and_never_goes_back() {
        let mut d = KlineDedup::new();
        // replica A: events 1, 3; replica B: 2, 3 — interleaved 1, 3(A), 2(B), 3(B)
        assert_eq!(d.admit(&frame(0, 1, false), &ANY), Admit::Pass);
        assert_eq!(d.admit(&frame(0, 3, false), &ANY), Admit::Pass);
        assert_eq!(d.admit(&frame(0, 2, false), &ANY), Admit::Duplicate, "older than what passed");
        assert_eq!(d.admit(&frame(0, 3, false), &ANY), Admit::Duplicate);
        // the next minute forms before the persister's closed candle of minute 0 arrives
        assert_eq!(d.admit(&frame(60_000, 60_500, false), &ANY), Admit::Pass);
        assert_eq!(d.admit(&frame(0, 60_000, true), &ANY), Admit::Pass);
        assert_eq!(d.admit(&frame(0, 60_000, true), &ANY), Admit::Duplicate, "a redelivery");
        assert_eq!(d.admit(&frame(60_000, 61_000, false), &ANY), Admit::Pass);
        assert_eq!(d.admit(&frame(60_000, 120_000, true), &ANY), Admit::Pass);
        // a late forming update of a closed minute
        assert_eq!(d.admit(&frame(60_000, 119_000, false), &ANY), Admit::Duplicate);
        assert_eq!(d.admit(b"{\"stream\":\"heartbeat\"}", &ANY), Admit::Malformed);
    }

    #[test]
    fn a_push_beyond_the_exchange_clock_moves_no_mark() {
        const TEN_YEARS: i64 = 10 * 365 * 86_400_000;
        let now = 1_700_000_000_000 / 60_000 * 60_000;
        let w = TimeWindow::around(now, 3_600_000, 120_000);
        let mut d = KlineDedup::new();
        assert_eq!(d.admit(&frame(now - 60_000, now, true), &w), Admit::Pass);
        // a real closed push moved ten years ahead, then one at the end of time
        assert_eq!(
            d.admit(&frame(now + TEN_YEARS, now + TEN_YEARS, true), &w),
            Admit::Outside(Poison::TooNew)
        );
        assert_eq!(d.admit(&frame(1 << 53, 1 << 53, false), &w), Admit::Outside(Poison::TooNew));
        assert_eq!(d.admit(&frame(now, now + 500, false), &w), Admit::Pass, "live goes on");
        assert_eq!(d.admit(&frame(now, now + 60_000, true), &w), Admit::Pass);
        // a forming update whose event time alone is far ahead
        assert_eq!(
            d.admit(&frame(now + 60_000, now + TEN_YEARS, false), &w),
            Admit::Outside(Poison::TooNew)
        );
        assert_eq!(d.admit(&frame(now + 60_000, now + 61_000, false), &w), Admit::Pass);
        // a closed candle whose minute has not ended by the exchange's clock
        assert_eq!(
            d.admit(&frame(now + 60_000, now + 90_000, true), &w),
            Admit::Pass,
            "ends in time"
        );
        assert_eq!(
            d.admit(&frame(now + 120_000, now + 120_000, true), &w),
            Admit::Outside(Poison::TooNew),
            "its minute ends at now + 180 s"
        );
        // the past is no threat to a mark: an old push is a duplicate
        assert_eq!(d.admit(&frame(0, 0, true), &w), Admit::Duplicate);
        // a closed candle from a sender that stores none (a worker) is refused
        let mut e = KlineDedup::new();
        let closed = frame(now - 60_000, now, true);
        assert_eq!(e.admit_from(&closed, &w, false), Admit::Outside(Poison::Sender));
        assert_eq!(e.admit_from(&frame(now, now + 500, false), &w, false), Admit::Pass);
        assert_eq!(e.admit_from(&closed, &w, true), Admit::Pass, "from the persister");
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
    fn diffs_outside_the_books_ids_never_move_the_position() {
        let ids = IdWindow { ahead: 1_000, span: 500, below: 10_000 };
        let mut r = DiffReorder::with_ids(200, ids);
        let mut out = Vec::new();
        assert_eq!(r.push(99, 100, "a", 0, &mut out), Pushed::Passed);
        // `Millrace-U` at u64::MAX, continuing from the last id: covers too many ids
        assert_eq!(r.push(100, u64::MAX, "max", 1, &mut out), Pushed::Refused);
        // a diff continuing from far past the position
        assert_eq!(r.push(100 + 1_001, 100 + 1_002, "far", 2, &mut out), Pushed::Refused);
        // no ids at all, or backwards
        assert_eq!(r.push(150, 150, "none", 3, &mut out), Pushed::Refused);
        assert_eq!(r.push(160, 150, "back", 3, &mut out), Pushed::Refused);
        assert_eq!(r.refused(), 4);
        // the book goes on
        assert_eq!(r.push(100, 120, "b", 4, &mut out), Pushed::Passed);
        assert_eq!(out, vec!["a", "b"]);
        // at most MAX_HELD held: diffs beyond a gap are refused rather than kept
        for i in 0..DiffReorder::<&str>::MAX_HELD as u64 {
            assert_eq!(r.push(130 + i, 131 + i, "held", 5, &mut out), Pushed::Held);
        }
        assert_eq!(r.push(900, 901, "one too many", 6, &mut out), Pushed::Refused);
        r.expire(205, &mut out);
        assert_eq!(out.len(), 2 + DiffReorder::<&str>::MAX_HELD);
    }

    #[test]
    fn a_position_taken_from_a_forged_first_diff_is_taken_anew() {
        let ids = IdWindow { ahead: 1_000, span: 500, below: 10_000 };
        let mut r = DiffReorder::with_ids(200, ids);
        let mut out = Vec::new();
        // the feed's first diff has nothing to be checked against
        assert_eq!(r.push(5_000_000, 5_000_100, "forged", 0, &mut out), Pushed::Passed);
        // the book's real diffs are far below it: not late copies
        assert_eq!(r.push(99, 100, "a", 1, &mut out), Pushed::Passed);
        assert_eq!(r.reanchored(), 1);
        assert_eq!(r.push(100, 110, "b", 2, &mut out), Pushed::Passed);
        // a late copy near the position is still a duplicate
        assert_eq!(r.push(99, 100, "a again", 3, &mut out), Pushed::Duplicate);
        assert_eq!(out, vec!["forged", "a", "b"]);
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
