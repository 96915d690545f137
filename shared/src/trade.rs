//! Trades: one instrument's public prints, their id continuity, 1m candles folded from them and
//! a bounded list of the newest.
//!
//! Like the rest of `shared`, nothing here does IO or reads a clock: trades go in as values and
//! the caller, who owns the clock, says when time has passed ([`TradeFold::close_through`]).
//! Market values are fixed-point ([`Price`], [`Qty`], [`Volume`]); no float is involved.
//!
//! ## Trades and their ids
//! A [`Trade`] is what every venue publishes per print: an id, the venue's timestamp, price,
//! quantity and (where the venue says) the taker's side. Venue ids come in two kinds: sequential
//! integers (Binance aggTrade `a`, Kraken, OKX, Coinbase's numeric strings) and opaque strings
//! (Bybit's UUIDs). [`TradeId`] keeps both and is always serialised as a JSON string, so an id
//! beyond 2^53 survives JavaScript; see [`TradeId`] for the exact mapping.
//!
//! ## Continuity: [`TradeIds`]
//! Where ids are sequential, [`TradeIds::observe`] tells whether each id is the first, the next,
//! a duplicate (or stale: an id at or before the last one) or comes after a gap, and names the
//! missing ids. Keep one `TradeIds` per instrument across reconnects: it is never reset, so ids
//! missed while a connection was down show up as a gap on the first trade of the new one.
//!
//! ## 1m candles from trades: [`TradeFold`]
//! The fold follows Binance's kline semantics for one instrument:
//!
//! - A trade belongs to the UTC minute `floor(time_ms / 60_000) * 60_000` (floor division, so
//!   times before 1970 fall in the right minute too).
//! - **open** is the price of the first trade of the minute *in arrival order*, **close** the
//!   last; **high**/**low** the extremes; **volume** the sum of quantities; **trades** the count.
//!   Every candle it emits is a 1m candle (`minutes = 1`) that passes [`Candle::check`].
//! - A minute's candle is **closed** (returned) when the first trade of a later minute arrives
//!   ([`TradeFold::push`]), or when the caller says the minute is over
//!   ([`TradeFold::close_through`]).
//! - **Late trades are dropped, not folded.** A trade of a minute before the forming one, or of a
//!   minute already closed, would change a candle already handed out; it is counted in
//!   [`TradeFold::late`] instead. Venues stream one instrument's trades in time order, so a
//!   non-zero count means a misbehaving feed, or a caller that closed minutes too eagerly.
//! - **No trade, no candle.** A minute in which the venue printed no trade has no 1m candle from
//!   trades (no flat candle is invented, as in [`crate::candle`]); a caller that needs one fills it
//!   from the venue's REST klines.
//! - **Duplicates are the caller's job.** The fold counts every trade it is given; drop repeated
//!   trades first (with [`TradeIds`] where ids are sequential).
//! - A trade the fold cannot take is counted in [`TradeFold::rejected`] and otherwise ignored:
//!   a time outside `±`[`TIME_LIMIT_MS`], or one that would push the candle's trade count or
//!   volume beyond [`MAX_TRADES`] / [`MAX_VOLUME`].
//!
//! ## The newest trades: [`RecentTrades`]
//! A ring of the last `cap` trades, newest first on the way out, for a "recent trades" panel.

use core::fmt;
use std::collections::VecDeque;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::candle::{Candle, MAX_TRADES, MAX_VOLUME, MINUTE_MS, TIME_LIMIT_MS};
use crate::fixed::{Price, Qty, Volume};

/// Which side took liquidity: a `Buy` taker lifted an ask, a `Sell` taker hit a bid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TakerSide {
    Buy,
    Sell,
}

/// A venue's trade id.
///
/// Serialised as a JSON string always: `Seq(123)` as `"123"`, `Text(s)` as `s`. On the way in a
/// string of decimal digits in canonical form (no sign, no leading zero unless it is `"0"`) that
/// fits in a `u64` is a [`TradeId::Seq`], anything else a [`TradeId::Text`]; a JSON integer is
/// accepted too (Binance sends aggTrade ids as numbers). Build ids from venue strings with
/// [`TradeId::parse`] (or `From<&str>`), which applies the same rule, so that a serialised id
/// always reads back equal.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TradeId {
    /// A sequential numeric id (Binance aggTrade `a`, Kraken, OKX, Coinbase).
    Seq(u64),
    /// An opaque id (Bybit's UUIDs), or a numeric string that is not canonical (`"007"`).
    Text(String),
}

impl TradeId {
    /// Classifies a venue's id string: canonical decimal digits that fit a `u64` are
    /// [`TradeId::Seq`], anything else [`TradeId::Text`].
    pub fn parse(s: &str) -> Self {
        let canonical = match s.as_bytes() {
            [] => false,
            [b'0'] => true,
            [b'0', ..] => false,
            b => b.iter().all(u8::is_ascii_digit),
        };
        match s.parse::<u64>() {
            Ok(n) if canonical => TradeId::Seq(n),
            _ => TradeId::Text(s.to_owned()),
        }
    }

    /// The sequential id, if this is one.
    pub fn seq(&self) -> Option<u64> {
        match self {
            TradeId::Seq(n) => Some(*n),
            TradeId::Text(_) => None,
        }
    }
}

impl From<u64> for TradeId {
    fn from(n: u64) -> Self {
        TradeId::Seq(n)
    }
}

impl From<&str> for TradeId {
    fn from(s: &str) -> Self {
        TradeId::parse(s)
    }
}

impl fmt::Display for TradeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TradeId::Seq(n) => write!(f, "{n}"),
            TradeId::Text(s) => f.write_str(s),
        }
    }
}

impl Serialize for TradeId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            TradeId::Seq(n) => s.collect_str(n),
            TradeId::Text(t) => s.serialize_str(t),
        }
    }
}

impl<'de> Deserialize<'de> for TradeId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = TradeId;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a trade id string or a non-negative integer")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<TradeId, E> {
                Ok(TradeId::parse(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<TradeId, E> {
                Ok(TradeId::Seq(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<TradeId, E> {
                u64::try_from(v)
                    .map(TradeId::Seq)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self))
            }
        }
        d.deserialize_any(V)
    }
}

/// One public trade (print) of one instrument.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trade {
    pub id: TradeId,
    /// The venue's trade time, ms since the Unix epoch (UTC).
    pub time_ms: i64,
    pub price: Price,
    pub qty: Qty,
    /// The taker's side, where the venue publishes it; absent in JSON when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taker: Option<TakerSide>,
}

/// Folds one instrument's trades into 1m candles; see the [module docs](self) for the rules.
#[derive(Debug, Clone, Default)]
pub struct TradeFold {
    /// The candle of the newest minute, until it is closed.
    forming: Option<Candle>,
    /// `open_time` of the newest minute started (forming or closed): trades before it, or in it
    /// once it is closed, are late.
    last_minute: Option<i64>,
    /// Trades dropped as late.
    late: u64,
    /// Trades dropped as out of range.
    rejected: u64,
}

impl TradeFold {
    /// An empty fold: no forming candle, counters at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Folds `t` into the forming candle. Returns the previous minute's candle, closed, when `t`
    /// is the first trade of a later minute. A late trade (of a minute before the forming one,
    /// or of a closed minute) is not folded and counts in [`TradeFold::late`]; one out of range
    /// counts in [`TradeFold::rejected`].
    pub fn push(&mut self, t: &Trade) -> Option<Candle> {
        if !(-TIME_LIMIT_MS..=TIME_LIMIT_MS).contains(&t.time_ms) {
            self.rejected = self.rejected.saturating_add(1);
            return None;
        }
        let minute = t.time_ms.div_euclid(MINUTE_MS) * MINUTE_MS;
        match self.last_minute {
            Some(last) if minute < last => {
                self.late = self.late.saturating_add(1);
                None
            }
            Some(last) if minute == last => {
                match &mut self.forming {
                    None => self.late = self.late.saturating_add(1),
                    Some(c) => {
                        let volume = c.volume.add_qty(t.qty);
                        if c.trades >= MAX_TRADES || volume.raw() > MAX_VOLUME {
                            self.rejected = self.rejected.saturating_add(1);
                        } else {
                            c.high = c.high.max(t.price);
                            c.low = c.low.min(t.price);
                            c.close = t.price;
                            c.volume = volume;
                            c.trades += 1;
                        }
                    }
                }
                None
            }
            _ => {
                self.last_minute = Some(minute);
                let p = t.price;
                let first = Candle::one_minute(minute, p, p, p, p, Volume::ZERO.add_qty(t.qty), 1);
                self.forming.replace(first)
            }
        }
    }

    /// The candle of the current minute, not yet closed.
    pub fn forming(&self) -> Option<&Candle> {
        self.forming.as_ref()
    }

    /// The caller's clock says it is `now_ms`: if the forming candle's minute ended at or before
    /// then (`open_time + 60_000 <= now_ms`), closes and returns it. Later trades of that minute
    /// are late. `close_through(i64::MAX)` closes whatever is forming (end of input).
    pub fn close_through(&mut self, now_ms: i64) -> Option<Candle> {
        // open_time is within ±TIME_LIMIT_MS, so the end cannot overflow.
        self.forming.take_if(|c| c.open_time + MINUTE_MS <= now_ms)
    }

    /// Trades dropped because their minute was before the forming one or already closed.
    pub fn late(&self) -> u64 {
        self.late
    }

    /// Trades dropped because their time was outside `±`[`TIME_LIMIT_MS`] or they would have
    /// pushed the candle's trade count or volume beyond [`MAX_TRADES`] / [`MAX_VOLUME`].
    pub fn rejected(&self) -> u64 {
        self.rejected
    }
}

/// What [`TradeIds::observe`] made of an id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IdVerdict {
    /// The first id seen.
    First,
    /// The id right after the last one.
    Next,
    /// An id at or before the last one: a repeat or a stale trade; drop it.
    Duplicate,
    /// Ids `from..=to` were skipped; the observed id is `to + 1`.
    Gap { from: u64, to: u64 },
}

/// Continuity of one instrument's sequential trade ids (Binance aggTrade `a`); see the
/// [module docs](self). Counters saturate.
#[derive(Debug, Clone, Default)]
pub struct TradeIds {
    /// The highest id seen; never goes backwards, and survives reconnects.
    last: Option<u64>,
    /// Ids observed at or before `last`.
    duplicates: u64,
    /// Gaps seen (each skipping one or more ids).
    gaps: u64,
    /// Ids skipped over all gaps.
    missing: u64,
}

impl TradeIds {
    /// No id seen yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the next id received and says how it continues the sequence. Every id but a
    /// duplicate becomes the last id.
    pub fn observe(&mut self, id: u64) -> IdVerdict {
        let Some(last) = self.last else {
            self.last = Some(id);
            return IdVerdict::First;
        };
        if id <= last {
            self.duplicates = self.duplicates.saturating_add(1);
            return IdVerdict::Duplicate;
        }
        self.last = Some(id);
        // id > last, so last + 1 cannot overflow.
        let from = last + 1;
        if id == from {
            return IdVerdict::Next;
        }
        self.gaps = self.gaps.saturating_add(1);
        self.missing = self.missing.saturating_add(id - from);
        IdVerdict::Gap { from, to: id - 1 }
    }

    /// The highest id seen.
    pub fn last(&self) -> Option<u64> {
        self.last
    }

    /// Ids observed at or before the last one.
    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }

    /// Gaps seen.
    pub fn gaps(&self) -> u64 {
        self.gaps
    }

    /// Ids skipped over all gaps.
    pub fn missing(&self) -> u64 {
        self.missing
    }
}

/// The newest `cap` trades of one instrument, oldest dropped first.
#[derive(Debug, Clone)]
pub struct RecentTrades {
    /// Oldest at the front, newest at the back; never longer than `cap`.
    ring: VecDeque<Trade>,
    /// At least 1; the caller bounds it.
    cap: usize,
}

impl RecentTrades {
    /// Keeps the newest `cap` trades (at least 1; a `cap` of 0 keeps 1).
    pub fn new(cap: usize) -> Self {
        let cap = cap.max(1);
        Self { ring: VecDeque::with_capacity(cap), cap }
    }

    /// Adds the newest trade, dropping the oldest when full.
    pub fn push(&mut self, t: Trade) {
        if self.ring.len() == self.cap {
            self.ring.pop_front();
        }
        self.ring.push_back(t);
    }

    /// Up to `limit` trades, newest first.
    pub fn newest_first(&self, limit: usize) -> impl Iterator<Item = &Trade> + '_ {
        self.ring.iter().rev().take(limit)
    }

    /// How many trades are kept (at most [`RecentTrades::cap`]).
    pub fn len(&self) -> usize {
        self.ring.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// The most trades kept.
    pub fn cap(&self) -> usize {
        self.cap
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use std::collections::BTreeMap;

    use super::*;
    use crate::testkit::Rng;

    const T0: i64 = 1_577_836_800_000; // 2020-01-01T00:00:00Z

    fn p(s: &str) -> Price {
        Price::parse(s).unwrap()
    }

    fn q(s: &str) -> Qty {
        Qty::parse(s).unwrap()
    }

    fn trade(id: u64, time_ms: i64, price: &str, qty: &str) -> Trade {
        Trade { id: TradeId::Seq(id), time_ms, price: p(price), qty: q(qty), taker: None }
    }

    fn c1(t: i64, o: &str, h: &str, l: &str, c: &str, v: &str, n: u64) -> Candle {
        let v = Volume::parse(v).unwrap();
        Candle::one_minute(t, p(o), p(h), p(l), p(c), v, n)
    }

    #[test]
    fn folds_a_hand_computed_example() {
        let m = |k: i64| T0 + k * MINUTE_MS;
        let mut fold = TradeFold::new();
        let mut closed = Vec::new();
        let mut push = |fold: &mut TradeFold, t: Trade| closed.extend(fold.push(&t));
        // minute 0: 100, 101.5, 99.25, 100.5
        push(&mut fold, trade(1, m(0), "100", "1"));
        push(&mut fold, trade(2, m(0) + 10_000, "101.5", "0.5"));
        push(&mut fold, trade(3, m(0) + 20_000, "99.25", "2.25"));
        push(&mut fold, trade(4, m(0) + 59_999, "100.5", "0.00000001"));
        assert_eq!(fold.forming().map(|c| c.trades), Some(4));
        // minute 1: 100.5, 102; then a late trade of minute 0
        push(&mut fold, trade(5, m(1) + 1, "100.5", "3"));
        push(&mut fold, trade(6, m(0) + 30_000, "1", "1000"));
        push(&mut fold, trade(7, m(1) + 40_000, "102", "1"));
        // minute 2 has no trade; minute 3: one trade
        push(&mut fold, trade(8, m(3) + 5_000, "98", "4"));
        // the caller's clock: minute 3 not over yet, then over
        assert_eq!(fold.close_through(m(4) - 1), None);
        let last = fold.close_through(m(4)).unwrap();
        assert_eq!(fold.forming(), None);
        // a trade of the closed minute is late too
        push(&mut fold, trade(9, m(3) + 59_000, "97", "1"));
        closed.push(last);
        let want = vec![
            c1(m(0), "100", "101.5", "99.25", "100.5", "3.75000001", 4),
            c1(m(1), "100.5", "102", "100.5", "102", "4", 2),
            c1(m(3), "98", "98", "98", "98", "4", 1),
        ];
        assert_eq!(closed, want);
        for c in &closed {
            assert_eq!(c.check(), Ok(()));
        }
        assert_eq!(fold.late(), 2);
        assert_eq!(fold.rejected(), 0);
    }

    #[test]
    fn negative_times_floor_to_their_minute() {
        let mut fold = TradeFold::new();
        assert_eq!(fold.push(&trade(1, -1, "5", "1")), None);
        assert_eq!(fold.forming().map(|c| c.open_time), Some(-MINUTE_MS));
        let closed = fold.push(&trade(2, 0, "6", "1")).unwrap();
        assert_eq!(closed.open_time, -MINUTE_MS);
        assert_eq!(fold.forming().map(|c| c.open_time), Some(0));
        assert_eq!(fold.close_through(MINUTE_MS - 1), None);
        assert_eq!(fold.close_through(MINUTE_MS).map(|c| c.open_time), Some(0));
    }

    #[test]
    fn rejects_out_of_range_trades() {
        let mut fold = TradeFold::new();
        for t in [i64::MIN, -TIME_LIMIT_MS - 1, TIME_LIMIT_MS + 1, i64::MAX] {
            assert_eq!(fold.push(&trade(1, t, "1", "1")), None);
        }
        assert_eq!(fold.forming(), None);
        assert_eq!(fold.rejected(), 4);
        // the limits themselves are fine, and closing at i64::MAX cannot overflow
        fold.push(&trade(1, TIME_LIMIT_MS, "1", "1"));
        assert!(fold.close_through(i64::MAX).is_some_and(|c| c.check().is_ok()));
        // a trade that would take the candle past MAX_VOLUME or MAX_TRADES is refused
        let mut fold = TradeFold::new();
        fold.push(&trade(2, T0, "1", "1"));
        let c = fold.forming.as_mut().unwrap();
        c.volume = Volume::from_raw(MAX_VOLUME);
        assert_eq!(fold.push(&trade(3, T0, "2", "0.00000001")), None);
        fold.forming.as_mut().unwrap().trades = MAX_TRADES;
        assert_eq!(fold.push(&trade(4, T0, "3", "0")), None);
        assert_eq!(fold.rejected(), 2);
        let c = fold.close_through(i64::MAX).unwrap();
        assert_eq!((c.high, c.check()), (p("1"), Ok(())));
    }

    #[test]
    fn random_trades_fold_like_a_naive_grouping() {
        for seed in 0..50 {
            let mut rng = Rng::new(seed);
            // some seeds start before 1970
            let mut time = T0 - (rng.below(3) as i64) * T0;
            let mut mid: i64 = 1_000_000_000;
            let mut trades = Vec::new();
            for id in 0..rng.below(2_000) {
                // mostly within the minute, sometimes skipping minutes
                time += match rng.below(100) {
                    0..=89 => rng.below(2_000) as i64,
                    90..=98 => rng.below(60_000) as i64,
                    _ => rng.below(10 * 60_000) as i64,
                };
                mid += rng.below(2_001) as i64 - 1_000;
                let qty = Qty::from_raw((rng.next_u64() >> 24) as i64);
                let taker =
                    [None, Some(TakerSide::Buy), Some(TakerSide::Sell)][rng.below(3) as usize];
                trades.push(Trade {
                    id: TradeId::Seq(id),
                    time_ms: time,
                    price: Price(mid),
                    qty,
                    taker,
                });
            }

            let mut groups: BTreeMap<i64, Vec<&Trade>> = BTreeMap::new();
            for t in &trades {
                groups.entry(t.time_ms.div_euclid(MINUTE_MS) * MINUTE_MS).or_default().push(t);
            }
            let want: Vec<Candle> = groups
                .iter()
                .map(|(&minute, ts)| {
                    let prices = ts.iter().map(|t| t.price);
                    let volume = ts.iter().fold(Volume::ZERO, |v, t| v.add_qty(t.qty));
                    Candle::one_minute(
                        minute,
                        ts[0].price,
                        prices.clone().max().unwrap(),
                        prices.min().unwrap(),
                        ts[ts.len() - 1].price,
                        volume,
                        ts.len() as u64,
                    )
                })
                .collect();

            let mut fold = TradeFold::new();
            let mut got = Vec::new();
            for t in &trades {
                // the caller's clock, never ahead of the trades: closing changes nothing
                if rng.chance(1, 10) {
                    got.extend(fold.close_through(t.time_ms));
                }
                got.extend(fold.push(t));
            }
            got.extend(fold.close_through(i64::MAX));
            assert_eq!(got, want, "seed {seed}");
            assert!(got.iter().all(|c| c.check().is_ok()), "seed {seed}");
            assert_eq!((fold.late(), fold.rejected()), (0, 0), "seed {seed}");
        }
    }

    #[test]
    fn ids_first_next_duplicate_gap() {
        let mut ids = TradeIds::new();
        assert_eq!(ids.last(), None);
        assert_eq!(ids.observe(10), IdVerdict::First);
        assert_eq!(ids.observe(11), IdVerdict::Next);
        assert_eq!(ids.observe(11), IdVerdict::Duplicate);
        assert_eq!(ids.observe(15), IdVerdict::Gap { from: 12, to: 14 });
        // backwards: stale, and the last id stays
        assert_eq!(ids.observe(3), IdVerdict::Duplicate);
        assert_eq!(ids.last(), Some(15));
        assert_eq!(ids.observe(16), IdVerdict::Next);
        assert_eq!(ids.observe(18), IdVerdict::Gap { from: 17, to: 17 });
        assert_eq!((ids.duplicates(), ids.gaps(), ids.missing()), (2, 2, 4));
    }

    #[test]
    fn ids_at_the_edges_of_u64() {
        let mut ids = TradeIds::new();
        assert_eq!(ids.observe(0), IdVerdict::First);
        assert_eq!(ids.observe(u64::MAX), IdVerdict::Gap { from: 1, to: u64::MAX - 1 });
        assert_eq!(ids.observe(u64::MAX), IdVerdict::Duplicate);
        assert_eq!(ids.observe(0), IdVerdict::Duplicate);
        assert_eq!(ids.missing(), u64::MAX - 1);
    }

    #[test]
    fn recent_trades_are_bounded_newest_first() {
        let mut recent = RecentTrades::new(3);
        assert!(recent.is_empty());
        for id in 1..=5 {
            recent.push(trade(id, T0 + id as i64, "1", "1"));
        }
        assert_eq!(recent.len(), 3);
        let ids =
            |limit| recent.newest_first(limit).map(|t| t.id.seq().unwrap()).collect::<Vec<_>>();
        assert_eq!(ids(10), [5, 4, 3]);
        assert_eq!(ids(2), [5, 4]);
        assert_eq!(ids(0), [] as [u64; 0]);
        let mut one = RecentTrades::new(0);
        assert_eq!(one.cap(), 1);
        one.push(trade(1, T0, "1", "1"));
        one.push(trade(2, T0, "1", "1"));
        assert_eq!(
            one.newest_first(5).map(|t| t.id.clone()).collect::<Vec<_>>(),
            [TradeId::Seq(2)]
        );
    }

    #[test]
    fn trade_ids_round_trip_as_strings() {
        let cases = [
            ("\"123\"", TradeId::Seq(123)),
            ("\"0\"", TradeId::Seq(0)),
            ("\"18446744073709551615\"", TradeId::Seq(u64::MAX)),
            ("\"abc-1\"", TradeId::Text("abc-1".into())),
            ("\"0123\"", TradeId::Text("0123".into())),
            ("\"18446744073709551616\"", TradeId::Text("18446744073709551616".into())),
            ("\"-1\"", TradeId::Text("-1".into())),
            ("\"+1\"", TradeId::Text("+1".into())),
            ("\"\"", TradeId::Text(String::new())),
        ];
        for (json, id) in cases {
            assert_eq!(serde_json::from_str::<TradeId>(json).unwrap(), id, "{json}");
            assert_eq!(serde_json::to_string(&id).unwrap(), json);
            assert_eq!(TradeId::parse(&id.to_string()), id);
        }
        // Binance's numeric ids
        assert_eq!(serde_json::from_str::<TradeId>("26129").unwrap(), TradeId::Seq(26129));
        assert!(serde_json::from_str::<TradeId>("-1").is_err());
        assert!(serde_json::from_str::<TradeId>("1.5").is_err());
    }

    #[test]
    fn trade_serde_round_trip() {
        let t = Trade {
            id: TradeId::parse("9f1c2a7e-1b2c-4d5e-8f90-123456789abc"),
            time_ms: T0,
            price: p("7195.24"),
            qty: q("0.0021"),
            taker: Some(TakerSide::Sell),
        };
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(
            json,
            concat!(
                r#"{"id":"9f1c2a7e-1b2c-4d5e-8f90-123456789abc","time_ms":1577836800000,"#,
                r#""price":"7195.24","qty":"0.0021","taker":"sell"}"#
            )
        );
        assert_eq!(serde_json::from_str::<Trade>(&json).unwrap(), t);
        let no_side = r#"{"id":"7","time_ms":-5,"price":"1","qty":"2"}"#;
        let t = serde_json::from_str::<Trade>(no_side).unwrap();
        assert_eq!((t.id.clone(), t.taker), (TradeId::Seq(7), None));
        assert_eq!(serde_json::to_string(&t).unwrap(), no_side);
    }
}
