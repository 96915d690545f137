//! Candles: timeframes, UTC bucket alignment, 1m -> derived merging, flush batches.
//!
//! millrace takes one stream of **1m candles** per series from the exchange and derives every
//! larger timeframe locally (design seed §9), so all timeframes share one source of truth.
//!
//! ## Timeframes and alignment
//! [`Timeframe`] covers Binance's intraday and daily intervals (`1m` … `1d`). A bucket of a
//! timeframe starts at a multiple of its duration counted from the Unix epoch, in UTC
//! ([`Timeframe::bucket_open`]); this is floor division, so it is also right for timestamps before
//! 1970. Every duration divides every larger one that is a multiple of it (`5m` | `15m` | `1h` …),
//!       so buckets nest and a `1d` bucket is exactly the union of its 24 `1h` buckets.
//!
//! ## Merging
//! [`merge`] combines candles of one bucket, oldest first: open of the first, highest high, lowest
//! low, close of the last, summed volume, trades and [`Candle::minutes`]; its `open_time` is the
//! bucket open of the first candle.
//!
//! ## Deriving timeframes from 1m candles: the missing-minute rules
//! [`DerivedAggregator`] is fed closed 1m candles in time order and emits closed candles of each
//! configured timeframe. Exchanges do skip minutes (outages, maintenance, no-trade minutes on some
//! venues), so the rules for gaps are explicit:
//!
//! 1. **No invented data.** A derived candle is built only from the 1m candles that exist; no
//!    synthetic flat candle is made up for a missing minute, and a bucket with no 1m candle at all
//!    yields **no** candle (the series simply has no entry for that time).
//! 2. **Completeness is visible.** Every candle carries [`Candle::minutes`], the number of 1m
//!    candles it was built from (1 for a 1m candle). A derived candle with
//!    `minutes < tf.minutes()` ([`Candle::is_complete`] is false) came from a bucket with missing
//!    minutes.
//! 3. **When a bucket closes.** A bucket closes (is emitted) as soon as its last minute arrives, or
//!    else when the first 1m candle of a *later* bucket arrives, or when the caller closes it
//!    explicitly with [`DerivedAggregator::flush`] (e.g. at the end of a file).
//! 4. **Strict order.** A 1m candle whose `open_time` equals the last accepted minute is rejected
//!    as
//!    [`CandleError::Duplicate`], one before it as [`CandleError::OutOfOrder`]; misaligned or
//!    internally inconsistent candles are rejected too. A rejected candle leaves the aggregator
//!    exactly as it was.
//! 5. **Flush is final.** After `flush`, a later 1m candle of a bucket that was flushed starts a
//!    new candle of that bucket, so the same `open_time` would be emitted twice; flush only where
//!    the input really ends (a [`FlushBatch`] downstream keeps the first one and drops the rest as
//!    already emitted).
//!
//! The *forming* (not yet closed) candle of a timeframe is the closed 1m candles of its current
//! bucket plus the exchange's current forming 1m candle ([`DerivedAggregator::forming`]).
//!
//! ## Hot path
//! Timeframes are chained: each derived timeframe consumes the closed candles of the largest
//! configured smaller timeframe whose duration divides its own (`15m` ← `5m` ← `1m`,
//! `1d` ← `12h` ← `6h` ← `2h` ← `1h` …), keeping one running accumulator per timeframe. A 1m
//! candle therefore touches only the accumulators fed directly by 1m (`3m` and `5m` when all are
//! configured); larger ones are updated when a smaller bucket closes. Merging is associative, so
//! this gives exactly the same candles as merging the 1m candles of each bucket directly (the
//! randomized test checks it against a naive recomputation).
//!
//! [`DerivedAggregator::push_closed_1m_batch`] takes a slice (backfill, replay, flush batches) and
//! gives exactly the concatenated output of feeding it one by one (a randomized test compares
//! them, errors and state included). A run of minutes that directly follow each other skips the
//! per-candle `Result` and output reset: validation is one branch-free test per candle, volume and
//! trades go into prefix sums shared by all levels fed by 1m, and those levels keep only high,
//! low and a countdown to their bucket end in registers. When the levels fed by 1m are 3m and 5m
//! (whenever both are configured), aligned 15-minute blocks are handled in straight-line code:
//! the 15 candles are validated together and folded once into the 7 segments the 3m and 5m
//! boundaries cut them into, giving five 3m, three 5m and (if it is 5m's only consumer) one 15m
//! candle without per-candle branches; longer timeframes are fed once per block. Gaps, rejected
//! candles and the first candle take the one-by-one path.
//!
//! ## Flush batches
//! [`FlushBatch`] (design seed §7) buffers closed candles of one series and says when to hand them
//! on: when `batch_max` are buffered or `flush_ms` have passed since the last flush. Flushing
//! sorts by `open_time`, keeps the last received version of each `open_time`, and drops anything
//! at or before the last emitted `open_time`, so a candle received twice is processed once.

use core::fmt;
use core::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::fixed::{Price, Volume};

/// Milliseconds in a minute.
pub const MINUTE_MS: i64 = 60_000;

/// Candle timestamps must lie within `±TIME_LIMIT_MS` (2^53 ms, about ±285,000 years) so bucket
/// arithmetic can never overflow; the aggregator rejects anything outside.
pub const TIME_LIMIT_MS: i64 = 1 << 53;

/// The most trades one candle may carry (2^48, about 2.8 * 10^14; Binance's busiest markets see a
/// few million a day). Larger counts are rejected as [`CandleError::Overflow`], so the sum over
/// any bucket (at most 1,440 candles) stays far inside `u64`: a count never wraps.
pub const MAX_TRADES: u64 = 1 << 48;

/// The largest volume one candle may carry, in raw units (2^100, about 1.3 * 10^22 whole units);
/// like [`MAX_TRADES`], it keeps every bucket sum inside `i128`.
pub const MAX_VOLUME: i128 = 1 << 100;

/// A candle interval. Ordered by duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Timeframe {
    M1,
    M3,
    M5,
    M15,
    M30,
    H1,
    H2,
    H4,
    H6,
    H8,
    H12,
    D1,
}

impl Timeframe {
    /// Every timeframe, shortest first.
    pub const ALL: [Timeframe; 12] = [
        Timeframe::M1,
        Timeframe::M3,
        Timeframe::M5,
        Timeframe::M15,
        Timeframe::M30,
        Timeframe::H1,
        Timeframe::H2,
        Timeframe::H4,
        Timeframe::H6,
        Timeframe::H8,
        Timeframe::H12,
        Timeframe::D1,
    ];

    /// Binance's name for it: `"1m"`, `"1h"`, `"1d"`.
    pub const fn name(self) -> &'static str {
        match self {
            Timeframe::M1 => "1m",
            Timeframe::M3 => "3m",
            Timeframe::M5 => "5m",
            Timeframe::M15 => "15m",
            Timeframe::M30 => "30m",
            Timeframe::H1 => "1h",
            Timeframe::H2 => "2h",
            Timeframe::H4 => "4h",
            Timeframe::H6 => "6h",
            Timeframe::H8 => "8h",
            Timeframe::H12 => "12h",
            Timeframe::D1 => "1d",
        }
    }

    /// Length in minutes.
    pub const fn minutes(self) -> u32 {
        match self {
            Timeframe::M1 => 1,
            Timeframe::M3 => 3,
            Timeframe::M5 => 5,
            Timeframe::M15 => 15,
            Timeframe::M30 => 30,
            Timeframe::H1 => 60,
            Timeframe::H2 => 120,
            Timeframe::H4 => 240,
            Timeframe::H6 => 360,
            Timeframe::H8 => 480,
            Timeframe::H12 => 720,
            Timeframe::D1 => 1440,
        }
    }

    /// Length in milliseconds.
    pub const fn duration_ms(self) -> i64 {
        self.minutes() as i64 * MINUTE_MS
    }

    /// Open time of the bucket containing `ts_ms`: `ts_ms` floored to a multiple of the duration
    /// since the Unix epoch (UTC). Floor, not truncation, so `-1` maps to `-duration`.
    /// Valid for `ts_ms >= i64::MIN + duration` (certainly for `|ts_ms| <= TIME_LIMIT_MS`).
    #[inline]
    pub const fn bucket_open(self, ts_ms: i64) -> i64 {
        ts_ms - ts_ms.rem_euclid(self.duration_ms())
    }

    /// Position in [`Timeframe::ALL`].
    #[inline]
    pub const fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Timeframe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown timeframe name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown timeframe {value:?}; valid timeframes: 1m, 3m, 5m, 15m, 30m, 1h, 2h, 4h, 6h, 8h, 12h, 1d")]
pub struct ParseTimeframeError {
    /// The rejected text.
    pub value: String,
}

impl FromStr for Timeframe {
    type Err = ParseTimeframeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Timeframe::ALL
            .into_iter()
            .find(|tf| tf.name() == s)
            .ok_or_else(|| ParseTimeframeError { value: s.to_string() })
    }
}

/// Serialised as its name (`"5m"`).
impl Serialize for Timeframe {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Timeframe {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

fn one() -> u32 {
    1
}

/// One OHLCV candle. The timeframe is known from context (the series or the aggregator output).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Candle {
    /// Bucket open time, ms since the Unix epoch (UTC).
    pub open_time: i64,
    pub open: Price,
    pub high: Price,
    pub low: Price,
    pub close: Price,
    /// Base-asset volume.
    pub volume: Volume,
    /// Number of trades.
    pub trades: u64,
    /// How many 1m candles this candle was built from: 1 for a 1m candle, `tf.minutes()` for a
    /// complete derived candle, fewer when minutes of its bucket were missing. Defaults to 1 when
    /// absent from serialised input.
    #[serde(default = "one")]
    pub minutes: u32,
}

impl Candle {
    /// A 1m candle (`minutes = 1`).
    pub fn one_minute(
        open_time: i64,
        open: Price,
        high: Price,
        low: Price,
        close: Price,
        volume: Volume,
        trades: u64,
    ) -> Self {
        Candle { open_time, open, high, low, close, volume, trades, minutes: 1 }
    }

    /// Whether every minute of `tf`'s bucket contributed (`minutes == tf.minutes()`).
    pub fn is_complete(&self, tf: Timeframe) -> bool {
        self.minutes == tf.minutes()
    }

    /// Checks the OHLC invariants: `low <= open, close <= high`, volume not negative; and that
    /// trades and volume are within [`MAX_TRADES`] and [`MAX_VOLUME`] (so sums cannot overflow).
    pub fn check(&self) -> Result<(), CandleError> {
        if self.trades > MAX_TRADES {
            return Err(CandleError::Overflow { open_time: self.open_time, what: "trade count" });
        }
        if self.volume.raw() > MAX_VOLUME {
            return Err(CandleError::Overflow { open_time: self.open_time, what: "volume" });
        }
        let reason = if self.high < self.low {
            "high is below low"
        } else if self.open < self.low || self.open > self.high {
            "open is outside [low, high]"
        } else if self.close < self.low || self.close > self.high {
            "close is outside [low, high]"
        } else if self.volume.raw() < 0 {
            "volume is negative"
        } else {
            return Ok(());
        };
        Err(CandleError::Inconsistent { open_time: self.open_time, reason })
    }

    /// Folds a later candle of the same bucket into this one (everything but `open_time`/`open`).
    /// A sum that would overflow is [`CandleError::Overflow`], and `self` is left unchanged.
    #[inline(always)]
    fn absorb(&mut self, later: &Candle) -> Result<(), CandleError> {
        *self = self.absorbed(later)?;
        Ok(())
    }

    /// This candle with a later candle of the same bucket folded in; every sum checked.
    #[inline(always)]
    fn absorbed(&self, later: &Candle) -> Result<Candle, CandleError> {
        let overflow = |what| CandleError::Overflow { open_time: self.open_time, what };
        Ok(Candle {
            open_time: self.open_time,
            open: self.open,
            high: if later.high > self.high { later.high } else { self.high },
            low: if later.low < self.low { later.low } else { self.low },
            close: later.close,
            volume: self.volume.checked_add(later.volume).ok_or_else(|| overflow("volume"))?,
            trades: self.trades.checked_add(later.trades).ok_or_else(|| overflow("trade count"))?,
            minutes: self.minutes.checked_add(later.minutes).ok_or_else(|| overflow("minutes"))?,
        })
    }
}

/// Merges candles of one `tf` bucket, given oldest first, into one candle of `tf`: open of the
/// first, max high, min low, close of the last, summed volume, trades and minutes;
/// `open_time = tf.bucket_open(first.open_time)`. `Ok(None)` for an empty slice;
/// [`CandleError::Overflow`] when a sum does not fit (it is never wrapped).
pub fn try_merge(tf: Timeframe, candles: &[Candle]) -> Result<Option<Candle>, CandleError> {
    let Some((first, rest)) = candles.split_first() else { return Ok(None) };
    let mut acc = *first;
    acc.open_time = tf.bucket_open(first.open_time);
    for c in rest {
        acc.absorb(c)?;
    }
    Ok(Some(acc))
}

/// [`try_merge`] for candles known to fit: each passed [`Candle::check`] (so is within
/// [`MAX_TRADES`] and [`MAX_VOLUME`]) and a bucket holds at most 1,440 of them, so no sum can
/// overflow. `None` for an empty slice. Panics on an overflow, which such input cannot cause;
/// merge candles from outside with [`try_merge`].
pub fn merge(tf: Timeframe, candles: &[Candle]) -> Option<Candle> {
    try_merge(tf, candles).expect("merged candles within MAX_TRADES and MAX_VOLUME")
}

/// Why a candle was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CandleError {
    #[error("duplicate 1m candle: open_time {open_time} was already accepted")]
    Duplicate { open_time: i64 },
    #[error(
        "1m candle out of order: open_time {open_time} is before the last accepted minute {last}"
    )]
    OutOfOrder { open_time: i64, last: i64 },
    #[error("open_time {open_time} is not on a whole minute")]
    Misaligned { open_time: i64 },
    #[error("open_time {open_time} is outside the supported range of ±2^53 ms")]
    OutOfRange { open_time: i64 },
    #[error("candle at {open_time} is not a single 1m candle (minutes = {minutes})")]
    NotOneMinute { open_time: i64, minutes: u32 },
    #[error("candle at {open_time} is inconsistent: {reason}")]
    Inconsistent { open_time: i64, reason: &'static str },
    /// A trade count or volume beyond [`MAX_TRADES`] / [`MAX_VOLUME`], or a sum of candles that
    /// would not fit: refused, never wrapped.
    #[error("candle at {open_time}: {what} out of range (a sum of candles would overflow)")]
    Overflow { open_time: i64, what: &'static str },
}

/// Index of a level in `DerivedAggregator::levels`; `RAW` stands for the 1m input itself.
type LevelId = u8;
const RAW: LevelId = u8::MAX;

/// One derived timeframe's running accumulator.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Level {
    /// The bucket being built while `active`; after it closes, the closed candle (which the
    /// levels built from this one read from here).
    acc: Candle,
    /// Exclusive end of the active bucket, or of the last one when inactive (ms; starts at 0,
    /// which is a bucket boundary of every timeframe).
    end: i64,
    /// Duration of this level's buckets (ms).
    dur: i64,
    /// Duration of one input candle (ms).
    source_ms: i64,
    active: bool,
    tf: Timeframe,
    /// Where its input comes from: an earlier level's closed candles, or [`RAW`] 1m candles.
    source: LevelId,
    /// Bit mask of the levels built from this one's closed candles.
    sinks: u16,
}

impl Level {
    /// Adds the next input candle; when that completes the bucket, emits it into `out` and
    /// returns true. Only the changed fields are written back, and the emitted copy is built
    /// from the freshly computed values rather than read back from `acc` (a wide read of
    /// just-written fields stalls on store forwarding).
    #[inline(always)]
    fn feed(&mut self, c: &Candle, out: &mut Vec<(Timeframe, Candle)>) -> bool {
        if self.active {
            // Only the fields that change are written back.
            let a = &mut self.acc;
            let high = if c.high > a.high { c.high } else { a.high };
            let low = if c.low < a.low { c.low } else { a.low };
            // Cannot overflow: every 1m candle is within MAX_TRADES / MAX_VOLUME (validated),
            // and a bucket holds at most 1,440 of them.
            let volume = Volume(a.volume.0 + c.volume.0);
            let trades = a.trades + c.trades;
            let minutes = a.minutes + c.minutes;
            a.high = high;
            a.low = low;
            a.close = c.close;
            a.volume = volume;
            a.trades = trades;
            a.minutes = minutes;
            let closes = c.open_time + self.source_ms == self.end;
            if closes {
                self.active = false;
                let (open_time, open) = (a.open_time, a.open);
                let close = c.close;
                out.push((
                    self.tf,
                    Candle { open_time, open, high, low, close, volume, trades, minutes },
                ));
            }
            closes
        } else {
            // Usually the bucket right after the previous one; avoid the division then.
            let open = if c.open_time >= self.end && c.open_time < self.end + self.dur {
                self.end
            } else {
                bucket_open_slow(c.open_time, self.dur)
            };
            self.end = open + self.dur;
            // Field by field: `c` may have just been written the same way, and a wide copy of it
            // would stall on store forwarding.
            let (o, h, l, cl, v, t, m) =
                (c.open, c.high, c.low, c.close, c.volume, c.trades, c.minutes);
            let a = &mut self.acc;
            a.open_time = open;
            a.open = o;
            a.high = h;
            a.low = l;
            a.close = cl;
            a.volume = v;
            a.trades = t;
            a.minutes = m;
            let closes = c.open_time + self.source_ms == self.end;
            self.active = !closes;
            if closes {
                let k = Candle {
                    open_time: open,
                    open: o,
                    high: h,
                    low: l,
                    close: cl,
                    volume: v,
                    trades: t,
                    minutes: m,
                };
                out.push((self.tf, k));
            }
            closes
        }
    }

    /// Closes the active bucket into `out`.
    #[inline(always)]
    fn close(&mut self, out: &mut Vec<(Timeframe, Candle)>) {
        self.active = false;
        out.push((self.tf, self.acc));
    }
}

#[cold]
#[inline(never)]
fn bucket_open_slow(ts: i64, dur: i64) -> i64 {
    ts - ts.rem_euclid(dur)
}

/// The validation of [`DerivedAggregator::push_closed_1m`] for a candle expected at `expect`
/// (directly after the last accepted minute, within range), as one branch-free test. A candle that
/// fails it goes through the general path, which finds the exact error.
#[inline(always)]
fn fast_ok(c: &Candle, expect: i64) -> bool {
    // open and close within [low, high] also implies low <= high.
    let bad = (c.open_time != expect)
        | (c.minutes != 1)
        | (c.open < c.low)
        | (c.open > c.high)
        | (c.close < c.low)
        | (c.close > c.high)
        | (c.volume.0 < 0)
        | (c.volume.0 > MAX_VOLUME)
        | (c.trades > MAX_TRADES);
    !bad
}

/// Minutes in a block of [`DerivedAggregator::run_blocks_3_5`] (the least common multiple of 3
/// and 5).
const BLOCK: usize = 15;
const BLOCK_MS: i64 = BLOCK as i64 * MINUTE_MS;

/// High, low, volume and trades of a few consecutive validated 1m candles.
#[derive(Clone, Copy)]
struct Seg {
    high: Price,
    low: Price,
    volume: i128,
    trades: u64,
}

impl Seg {
    #[inline(always)]
    fn of(cs: &[Candle]) -> Seg {
        let mut s = Seg { high: Price(i64::MIN), low: Price(i64::MAX), volume: 0, trades: 0 };
        for c in cs {
            s.high = if c.high > s.high { c.high } else { s.high };
            s.low = if c.low < s.low { c.low } else { s.low };
            // Bounded by validation (`block_ok`): no overflow.
            s.volume += c.volume.0;
            s.trades += c.trades;
        }
        s
    }

    #[inline(always)]
    fn join(&self, o: &Seg) -> Seg {
        Seg {
            high: if o.high > self.high { o.high } else { self.high },
            low: if o.low < self.low { o.low } else { self.low },
            volume: self.volume + o.volume,
            trades: self.trades + o.trades,
        }
    }

    /// The candle of `b[lo..hi]`, which this segment folds, opening at `open_time`.
    #[inline(always)]
    fn candle(&self, open_time: i64, b: &[Candle; BLOCK], lo: usize, hi: usize) -> Candle {
        Candle {
            open_time,
            open: b[lo].open,
            high: self.high,
            low: self.low,
            close: b[hi - 1].close,
            volume: Volume(self.volume),
            trades: self.trades,
            minutes: (hi - lo) as u32,
        }
    }
}

/// [`fast_ok`] for every candle of a block starting at `t0`, with the time, minutes and volume
/// sign checks folded into bit accumulators tested once.
#[inline(always)]
fn block_ok(b: &[Candle; BLOCK], t0: i64) -> bool {
    let mut time_bits = 0i64;
    let mut minute_bits = 0u32;
    // Bits at or above MAX_VOLUME / MAX_TRADES (and the sign of the volume): must all be zero.
    let mut volume_high = 0i128;
    let mut trades_high = 0u64;
    let mut ohlc_ok = true;
    for (t, c) in b.iter().enumerate() {
        time_bits |= c.open_time ^ (t0 + t as i64 * MINUTE_MS);
        minute_bits |= c.minutes ^ 1;
        volume_high |= c.volume.0 >> MAX_VOLUME.trailing_zeros();
        trades_high |= c.trades >> MAX_TRADES.trailing_zeros();
        ohlc_ok &=
            (c.open >= c.low) & (c.open <= c.high) & (c.close >= c.low) & (c.close <= c.high);
    }
    time_bits == 0 && minute_bits == 0 && volume_high == 0 && trades_high == 0 && ohlc_ok
}

/// A level fed by 1m candles, held in registers during [`DerivedAggregator::run_contiguous`].
#[derive(Clone, Copy)]
struct RawAcc {
    high: Price,
    low: Price,
    /// 1m candles still to come before the bucket's last minute is in.
    rem: u32,
    /// `minutes` of the bucket when it closes (its carried minutes plus those still to come).
    minutes_bias: u32,
    open_time: i64,
    open: Price,
    /// The run's volume and trade prefix sums at the bucket start, less what the bucket already
    /// had from before the run.
    volume_base: i128,
    trades_base: u64,
    /// Bucket length in minutes.
    dur_min: u32,
}

impl RawAcc {
    const EMPTY: RawAcc = RawAcc {
        high: Price(0),
        low: Price(0),
        rem: 0,
        minutes_bias: 0,
        open_time: 0,
        open: Price(0),
        volume_base: 0,
        trades_base: 0,
        dur_min: 0,
    };

    /// The state of `lv` about to receive `first`, the minute right after the last accepted one.
    #[inline(always)]
    fn load(lv: &Level, first: &Candle) -> RawAcc {
        let dur_min = (lv.dur / MINUTE_MS) as u32;
        let m = first.open_time;
        if lv.active {
            // `first` lies in the active bucket: buckets close on their last minute or on a gap.
            let rem = ((lv.end - m) / MINUTE_MS) as u32;
            RawAcc {
                high: lv.acc.high,
                low: lv.acc.low,
                rem,
                minutes_bias: lv.acc.minutes + rem,
                open_time: lv.acc.open_time,
                open: lv.acc.open,
                volume_base: 0i128.wrapping_sub(lv.acc.volume.0),
                trades_base: 0u64.wrapping_sub(lv.acc.trades),
                dur_min,
            }
        } else {
            // A new bucket; after a flush it may be the rest of the flushed one (rule 5).
            let open_time = if m >= lv.end && m < lv.end + lv.dur {
                lv.end
            } else {
                bucket_open_slow(m, lv.dur)
            };
            let rem = ((open_time + lv.dur - m) / MINUTE_MS) as u32;
            RawAcc {
                high: Price(i64::MIN),
                low: Price(i64::MAX),
                rem,
                minutes_bias: rem,
                open_time,
                open: first.open,
                volume_base: 0,
                trades_base: 0,
                dur_min,
            }
        }
    }

    /// Starts the next bucket after a close; `next` is the following candle if there is one (its
    /// open is only used if it turns out valid and contiguous, i.e. in this bucket).
    #[inline(always)]
    fn restart(&mut self, next: Option<&Candle>, volume: i128, trades: u64) {
        self.high = Price(i64::MIN);
        self.low = Price(i64::MAX);
        self.rem = self.dur_min;
        self.minutes_bias = self.dur_min;
        self.open_time += self.dur_min as i64 * MINUTE_MS;
        if let Some(n) = next {
            self.open = n.open;
        }
        self.volume_base = volume;
        self.trades_base = trades;
    }

    /// Writes the state back to `lv` after the run ended with `last`.
    #[inline(always)]
    fn store(
        &self,
        lv: &mut Level,
        last: &Candle,
        volume: i128,
        trades: u64,
        out: &[(Timeframe, Candle)],
    ) {
        if self.rem == self.dur_min {
            // Nothing in the current bucket: the level closed on `last`, so its candle is among
            // the last ones emitted.
            lv.active = false;
            lv.end = self.open_time;
            if let Some((_, k)) = out.iter().rev().find(|(tf, _)| *tf == lv.tf) {
                lv.acc = *k;
            }
        } else {
            lv.active = true;
            lv.end = self.open_time + lv.dur;
            lv.acc = Candle {
                open_time: self.open_time,
                open: self.open,
                high: self.high,
                low: self.low,
                close: last.close,
                volume: Volume(volume.wrapping_sub(self.volume_base)),
                trades: trades.wrapping_sub(self.trades_base),
                minutes: self.minutes_bias - self.rem,
            };
        }
    }
}

/// At most this many derived timeframes (all of [`Timeframe::ALL`] but 1m).
const MAX_LEVELS: usize = Timeframe::ALL.len() - 1;

/// Builds candles of configured timeframes from closed 1m candles; see the module docs for the
/// missing-minute rules and the hot-path design.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DerivedAggregator {
    /// Configured derived timeframes (all but 1m), shortest first; a level's source always comes
    /// before it.
    levels: Vec<Level>,
    /// Bit mask of the levels fed directly by 1m candles.
    raw_sinks: u16,
    /// How many levels that is (at most 2, since every timeframe but 3m and 5m is a multiple of
    /// 15m, and of any two of 4h, 6h, 8h, 12h and 1d that are not multiples of each other the
    /// next larger ones are multiples of one of them).
    raw_count: u32,
    /// Whether the levels fed by 1m are exactly 3m and 5m (levels 0 and 1), so that
    /// `run_blocks_3_5` applies.
    blocks_3_5: bool,
    /// Whether 1m itself is configured (each accepted 1m candle is emitted as closed).
    emit_1m: bool,
    last_minute: Option<i64>,
    out: Vec<(Timeframe, Candle)>,
}

impl DerivedAggregator {
    /// An aggregator emitting the given timeframes (any order, duplicates ignored). Including
    /// [`Timeframe::M1`] makes it emit each accepted 1m candle too.
    pub fn new(timeframes: &[Timeframe]) -> Self {
        let mut tfs: Vec<Timeframe> = timeframes.to_vec();
        tfs.sort();
        tfs.dedup();
        let emit_1m = tfs.first() == Some(&Timeframe::M1);
        if emit_1m {
            tfs.remove(0);
        }
        debug_assert!(tfs.len() <= MAX_LEVELS);
        let mut levels: Vec<Level> = Vec::with_capacity(tfs.len());
        let mut raw_sinks = 0u16;
        for (i, &tf) in tfs.iter().enumerate() {
            // The largest shorter configured timeframe whose buckets nest in this one's.
            let source = (0..i).rev().find(|&j| tf.minutes() % tfs[j].minutes() == 0);
            let (source, source_ms) = match source {
                Some(j) => {
                    levels[j].sinks |= 1 << i;
                    (j as LevelId, tfs[j].duration_ms())
                }
                None => {
                    raw_sinks |= 1 << i;
                    (RAW, MINUTE_MS)
                }
            };
            let zero = Price::ZERO;
            levels.push(Level {
                acc: Candle::one_minute(0, zero, zero, zero, zero, Volume::ZERO, 0),
                end: 0,
                dur: tf.duration_ms(),
                source_ms,
                active: false,
                tf,
                source,
                sinks: 0,
            });
        }
        // A level closes at most twice per 1m candle (once for a gap, once more if that candle is
        // its bucket's last minute), so the output never reallocates.
        let out = Vec::with_capacity(2 * levels.len() + 1);
        let raw_count = raw_sinks.count_ones();
        let blocks_3_5 = raw_sinks == 0b11
            && levels.first().is_some_and(|l| l.tf == Timeframe::M3 && l.sinks == 0)
            && levels.get(1).is_some_and(|l| l.tf == Timeframe::M5);
        Self { levels, raw_sinks, raw_count, blocks_3_5, emit_1m, last_minute: None, out }
    }

    /// An aggregator for every timeframe in [`Timeframe::ALL`], 1m included.
    pub fn all() -> Self {
        Self::new(&Timeframe::ALL)
    }

    /// The configured timeframes, shortest first.
    pub fn timeframes(&self) -> Vec<Timeframe> {
        let mut v = Vec::with_capacity(self.levels.len() + 1);
        if self.emit_1m {
            v.push(Timeframe::M1);
        }
        v.extend(self.levels.iter().map(|l| l.tf));
        v
    }

    /// `open_time` of the last accepted 1m candle.
    pub fn last_minute(&self) -> Option<i64> {
        self.last_minute
    }

    /// Accepts the next closed 1m candle and returns the candles it closed, as `(timeframe,
    /// candle)` in the order they closed (earlier buckets first, shorter timeframes first within
    /// one instant). The slice is valid until the next call. On error nothing changes.
    #[inline]
    pub fn push_closed_1m(&mut self, c: Candle) -> Result<&[(Timeframe, Candle)], CandleError> {
        let contiguous = self.validate(&c)?;
        let mut out = core::mem::take(&mut self.out);
        out.clear();
        self.apply(c, contiguous, &mut out);
        self.out = out;
        Ok(&self.out)
    }

    /// Accepts a batch of closed 1m candles, oldest first, and **appends** to `out` the candles
    /// they close: exactly what feeding them one by one to [`DerivedAggregator::push_closed_1m`]
    /// would return, concatenated. Stops at the first rejected candle and returns its index and
    /// the error `push_closed_1m` would give; `out` then holds the output of the candles before
    /// it and the aggregator is as after the last accepted one (so the caller may skip the bad
    /// candle and resume with the rest).
    ///
    /// Faster than one by one: a run of minutes that directly follow each other is validated and
    /// folded in one tight pass (see the module docs, "Hot path").
    pub fn push_closed_1m_batch(
        &mut self,
        candles: &[Candle],
        out: &mut Vec<(Timeframe, Candle)>,
    ) -> Result<(), (usize, CandleError)> {
        let mut i = 0;
        while i < candles.len() {
            let from = i;
            let mut max = usize::MAX;
            if self.blocks_3_5 {
                i = if self.emit_1m {
                    self.run_blocks_3_5::<true>(candles, i, out)
                } else {
                    self.run_blocks_3_5::<false>(candles, i, out)
                };
                // Candle by candle only up to the next block boundary, then blocks again.
                if let Some(last) = self.last_minute {
                    max = (BLOCK_MS - (last + MINUTE_MS).rem_euclid(BLOCK_MS)) as usize
                        / MINUTE_MS as usize;
                }
            }
            i = match (self.raw_count, self.emit_1m) {
                (1, false) => self.run_contiguous::<1, false>(candles, i, max, out),
                (2, false) => self.run_contiguous::<2, false>(candles, i, max, out),
                (1, true) => self.run_contiguous::<1, true>(candles, i, max, out),
                (2, true) => self.run_contiguous::<2, true>(candles, i, max, out),
                (0, _) => self.run_contiguous::<0, true>(candles, i, max, out),
                _ => i,
            };
            if i > from {
                continue;
            }
            let Some(&c) = candles.get(i) else { break };
            // A gap, a rejected candle, or the first candle: the general path.
            self.push_into(c, out).map_err(|e| (i, e))?;
            i += 1;
        }
        Ok(())
    }

    /// [`DerivedAggregator::push_closed_1m`], appending to `out`.
    #[inline(always)]
    fn push_into(
        &mut self,
        c: Candle,
        out: &mut Vec<(Timeframe, Candle)>,
    ) -> Result<(), CandleError> {
        let contiguous = self.validate(&c)?;
        self.apply(c, contiguous, out);
        Ok(())
    }

    /// The checks of [`DerivedAggregator::push_closed_1m`]; whether `c` directly follows the last
    /// accepted minute.
    #[inline(always)]
    fn validate(&self, c: &Candle) -> Result<bool, CandleError> {
        let m = c.open_time;
        // The common case, the minute right after the last one, is aligned by construction.
        let contiguous =
            self.last_minute.is_some_and(|last| m == last + MINUTE_MS) && m <= TIME_LIMIT_MS;
        if !contiguous {
            self.check_time(m)?;
        }
        if c.minutes != 1 {
            return Err(CandleError::NotOneMinute { open_time: m, minutes: c.minutes });
        }
        c.check()?;
        Ok(contiguous)
    }

    /// Accepts a validated candle, appending what it closes to `out`.
    #[inline(always)]
    fn apply(&mut self, c: Candle, contiguous: bool, out: &mut Vec<(Timeframe, Candle)>) {
        let m = c.open_time;
        self.last_minute = Some(m);
        if !contiguous {
            // Minutes were skipped: close every bucket that ended before this minute.
            self.close_ended(m, out);
        }
        if self.emit_1m {
            out.push((Timeframe::M1, c));
        }
        // Feed the levels built from 1m; a level that completes feeds the levels built from it.
        // Sources have lower indices than their sinks, so lowest-pending-first is a valid order.
        let mut pending = 0u16;
        let mut raw = self.raw_sinks;
        while raw != 0 {
            let i = raw.trailing_zeros() as usize;
            raw &= raw - 1;
            let Some(lv) = self.levels.get_mut(i) else { break };
            if lv.feed(&c, out) {
                pending |= lv.sinks;
            }
        }
        self.cascade(pending, out);
    }

    /// Feeds the levels in `pending` (and, as they close, their sinks) from their sources'
    /// freshly closed candles, lowest index first.
    #[inline(always)]
    fn cascade(&mut self, mut pending: u16, out: &mut Vec<(Timeframe, Candle)>) {
        while pending != 0 {
            let i = pending.trailing_zeros() as usize;
            pending &= pending - 1;
            let (lower, rest) = self.levels.split_at_mut(i);
            let Some(lv) = rest.first_mut() else { break };
            if lv.feed(&lower[lv.source as usize].acc, out) {
                pending |= lv.sinks;
            }
        }
    }

    /// A raw level's bucket closed inside [`DerivedAggregator::run_contiguous`]: emit it, and
    /// keep it as the level's last closed candle if levels read it from there; returns those
    /// levels. (Otherwise `RawAcc::store` fetches it back from `out` at the end of the run.)
    #[inline(always)]
    fn close_raw(
        &mut self,
        level: usize,
        closed: Candle,
        out: &mut Vec<(Timeframe, Candle)>,
    ) -> u16 {
        let Some(lv) = self.levels.get_mut(level) else { return 0 };
        out.push((lv.tf, closed));
        if lv.sinks != 0 {
            lv.acc = closed;
        }
        lv.sinks
    }

    /// [`DerivedAggregator::cascade`], with the levels fed by level `src` reading `with` instead of
    /// its accumulator.
    #[inline(never)]
    fn cascade_with(
        &mut self,
        mut pending: u16,
        src: usize,
        with: &Candle,
        out: &mut Vec<(Timeframe, Candle)>,
    ) {
        while pending != 0 {
            let i = pending.trailing_zeros() as usize;
            pending &= pending - 1;
            let (lower, rest) = self.levels.split_at_mut(i);
            let Some(lv) = rest.first_mut() else { break };
            let c = if lv.source as usize == src { with } else { &lower[lv.source as usize].acc };
            if lv.feed(c, out) {
                pending |= lv.sinks;
            }
        }
    }

    /// The usual configuration, 3m and 5m fed by 1m (levels 0 and 1; 3m feeds nothing since
    /// every longer timeframe is a multiple of 5m): whole 15-minute blocks of contiguous valid
    /// candles starting on a block boundary, each handled in straight-line code. The 15 candles
    /// are validated together, folded once into the 7 segments the 3m and 5m boundaries cut the
    /// block into, and the five 3m and three 5m candles are emitted in the order `push_into`
    /// would emit them. The levels fed by 5m get the block as one candle (open time that of the
    /// last 5m candle, so it closes them exactly as that would): their buckets end on multiples
    /// of 15 minutes, so they cannot close on the block's first two 5m candles, and merging is
    /// associative. Returns the index of the first candle not taken.
    #[inline(always)]
    fn run_blocks_3_5<const EMIT_1M: bool>(
        &mut self,
        candles: &[Candle],
        start: usize,
        out: &mut Vec<(Timeframe, Candle)>,
    ) -> usize {
        let Some(last) = self.last_minute else { return start };
        let m0 = last + MINUTE_MS;
        // On a block boundary the last minute closed both 3m and 5m.
        let inactive = self.levels.get(..2).is_some_and(|l| !l[0].active && !l[1].active);
        if m0.rem_euclid(BLOCK_MS) != 0 || !inactive {
            return start;
        }
        let room = usize::try_from((TIME_LIMIT_MS - last) / MINUTE_MS)
            .unwrap_or(if last > TIME_LIMIT_MS { 0 } else { usize::MAX });
        let stop = candles.len().min(start.saturating_add(room));
        let Some(run) = candles.get(start..stop) else { return start };
        let (tf3, tf5, sinks) = (self.levels[0].tf, self.levels[1].tf, self.levels[1].sinks);
        // When 5m feeds only 15m, the block is 15m's candle: emit it directly.
        let direct_15m = sinks == 0b100
            && self.levels.get(2).is_some_and(|l| l.tf == Timeframe::M15 && !l.active);
        let sinks_15m = if direct_15m { self.levels[2].sinks } else { 0 };
        let mut last_15m = None;
        let mut t0 = m0;
        let mut taken = 0;
        let mut last_3m = None;
        let mut last_5m = None;
        for b in run.chunks_exact(BLOCK) {
            let Ok(b) = <&[Candle; BLOCK]>::try_from(b) else { break };
            // A gap inside the block usually shows in its last candle's time: reject it early.
            if b[BLOCK - 1].open_time != t0 + (BLOCK as i64 - 1) * MINUTE_MS || !block_ok(b, t0) {
                break;
            }
            out.reserve(if EMIT_1M { BLOCK + 8 } else { 8 });
            let at = |k: i64| t0 + k * MINUTE_MS;
            let s0 = Seg::of(&b[0..3]);
            let s1 = Seg::of(&b[3..5]);
            let s2 = Seg::of(&b[5..6]);
            let s3 = Seg::of(&b[6..9]);
            let s4 = Seg::of(&b[9..10]);
            let s5 = Seg::of(&b[10..12]);
            let s6 = Seg::of(&b[12..15]);
            let emit_1m = |out: &mut Vec<(Timeframe, Candle)>, r: core::ops::Range<usize>| {
                if EMIT_1M {
                    for c in &b[r] {
                        out.push((Timeframe::M1, *c));
                    }
                }
            };
            emit_1m(out, 0..3);
            out.push((tf3, s0.candle(at(0), b, 0, 3)));
            emit_1m(out, 3..5);
            out.push((tf5, s0.join(&s1).candle(at(0), b, 0, 5)));
            emit_1m(out, 5..6);
            out.push((tf3, s1.join(&s2).candle(at(3), b, 3, 6)));
            emit_1m(out, 6..9);
            out.push((tf3, s3.candle(at(6), b, 6, 9)));
            emit_1m(out, 9..10);
            out.push((tf5, s2.join(&s3).join(&s4).candle(at(5), b, 5, 10)));
            emit_1m(out, 10..12);
            out.push((tf3, s4.join(&s5).candle(at(9), b, 9, 12)));
            emit_1m(out, 12..15);
            let k3 = s6.candle(at(12), b, 12, 15);
            out.push((tf3, k3));
            let s56 = s5.join(&s6);
            let k5 = s56.candle(at(10), b, 10, 15);
            out.push((tf5, k5));
            last_3m = Some(k3);
            last_5m = Some(k5);
            if direct_15m {
                let whole =
                    s0.join(&s1).join(&s2).join(&s3).join(&s4).join(&s56).candle(t0, b, 0, 15);
                out.push((Timeframe::M15, whole));
                last_15m = Some(whole);
                if sinks_15m != 0 {
                    if let Some(lv) = self.levels.get_mut(2) {
                        lv.acc = whole;
                    }
                    self.cascade_cold(sinks_15m, out);
                }
            } else if sinks != 0 {
                let whole =
                    s0.join(&s1).join(&s2).join(&s3).join(&s4).join(&s56).candle(at(10), b, 0, 15);
                if let Some(lv) = self.levels.get_mut(1) {
                    lv.acc = k5;
                }
                self.cascade_with(sinks, 1, &whole, out);
            }
            taken += BLOCK;
            t0 += BLOCK_MS;
        }
        if let (Some(k3), Some(k5)) = (last_3m, last_5m) {
            for (lv, k) in self.levels.iter_mut().zip([k3, k5]) {
                lv.active = false;
                lv.end = t0;
                lv.acc = k;
            }
            self.last_minute = Some(t0 - MINUTE_MS);
            if let (Some(k), Some(lv)) = (last_15m, self.levels.get_mut(2)) {
                lv.active = false;
                lv.end = t0;
                lv.acc = k;
            }
        }
        start + taken
    }

    /// [`DerivedAggregator::cascade`], out of line.
    #[inline(never)]
    fn cascade_cold(&mut self, pending: u16, out: &mut Vec<(Timeframe, Candle)>) {
        self.cascade(pending, out);
    }

    /// Accepts candles from `candles[start..]` while each is valid and directly follows the last
    /// accepted minute, with the `N` levels fed by 1m (`raw_count`) kept in registers; returns
    /// the index of the first candle not taken. Same effect as `push_into` on each of them.
    ///
    /// Per candle this only validates, adds volume and trades to running prefix sums (shared by
    /// all levels), and updates each raw level's high, low and countdown to its bucket end; the
    /// rest of a bucket (open, close, volume and trade differences, minutes) is worked out when
    /// it closes.
    #[inline(always)]
    fn run_contiguous<const N: usize, const EMIT_1M: bool>(
        &mut self,
        candles: &[Candle],
        start: usize,
        max: usize,
        out: &mut Vec<(Timeframe, Candle)>,
    ) -> usize {
        let Some(last) = self.last_minute else { return start };
        // Stay within TIME_LIMIT_MS; a candle past it goes to the general path (and is rejected).
        let room = usize::try_from((TIME_LIMIT_MS - last) / MINUTE_MS)
            .unwrap_or(if last > TIME_LIMIT_MS { 0 } else { usize::MAX });
        let stop = candles.len().min(start.saturating_add(room.min(max)));
        let Some(run) = candles.get(start..stop) else { return start };
        let Some(first) = run.first() else { return start };
        let m0 = last + MINUTE_MS;
        if !fast_ok(first, m0) {
            return start;
        }
        let mut raw = [RawAcc::EMPTY; N];
        let mut ids = [0usize; N];
        let mut mask = self.raw_sinks;
        for k in 0..N {
            let i = mask.trailing_zeros() as usize;
            mask &= mask.wrapping_sub(1);
            ids[k] = i;
            raw[k] = RawAcc::load(&self.levels[i], first);
        }
        // Prefix sums over the run (wrapping; differences of them are exact).
        let mut volume: i128 = 0;
        let mut trades: u64 = 0;
        let mut taken = 0;
        for (j, c) in run.iter().enumerate() {
            // `j` is below 2^53 / 60000, so this cannot overflow.
            if !fast_ok(c, m0 + j as i64 * MINUTE_MS) {
                break;
            }
            if EMIT_1M && self.emit_1m {
                out.push((Timeframe::M1, *c));
            }
            volume = volume.wrapping_add(c.volume.0);
            trades = trades.wrapping_add(c.trades);
            // All raw levels first, then what they feed: the order of `push_into`.
            let mut pending = 0u16;
            for k in 0..N {
                let a = &mut raw[k];
                a.high = if c.high > a.high { c.high } else { a.high };
                a.low = if c.low < a.low { c.low } else { a.low };
                a.rem -= 1;
                if a.rem == 0 {
                    let closed = Candle {
                        open_time: a.open_time,
                        open: a.open,
                        high: a.high,
                        low: a.low,
                        close: c.close,
                        volume: Volume(volume.wrapping_sub(a.volume_base)),
                        trades: trades.wrapping_sub(a.trades_base),
                        minutes: a.minutes_bias,
                    };
                    pending |= self.close_raw(ids[k], closed, out);
                    a.restart(run.get(j + 1), volume, trades);
                }
            }
            if pending != 0 {
                self.cascade_cold(pending, out);
            }
            taken = j + 1;
        }
        let Some(last_c) = run.get(taken.wrapping_sub(1)) else { return start };
        for k in 0..N {
            raw[k].store(&mut self.levels[ids[k]], last_c, volume, trades, out);
        }
        self.last_minute = Some(last_c.open_time);
        start + taken
    }

    /// The checks on a 1m `open_time` that does not directly follow the last accepted minute.
    #[inline(never)]
    fn check_time(&self, m: i64) -> Result<(), CandleError> {
        if !(-TIME_LIMIT_MS..=TIME_LIMIT_MS).contains(&m) {
            return Err(CandleError::OutOfRange { open_time: m });
        }
        if m.rem_euclid(MINUTE_MS) != 0 {
            return Err(CandleError::Misaligned { open_time: m });
        }
        match self.last_minute {
            Some(last) if m == last => Err(CandleError::Duplicate { open_time: m }),
            Some(last) if m < last => Err(CandleError::OutOfOrder { open_time: m, last }),
            _ => Ok(()),
        }
    }

    /// Closes, shortest timeframe first, every active bucket that ends at or before `limit`,
    /// after passing on to each level the candles its source closed in this same sweep.
    fn close_ended(&mut self, limit: i64, out: &mut Vec<(Timeframe, Candle)>) {
        let mut pending = 0u16;
        for i in 0..self.levels.len() {
            let (lower, rest) = self.levels.split_at_mut(i);
            let lv = &mut rest[0];
            if pending & (1 << i) != 0 && lv.feed(&lower[lv.source as usize].acc, out) {
                pending |= lv.sinks;
            } else if lv.active && lv.end <= limit {
                lv.close(out);
                pending |= lv.sinks;
            }
        }
    }

    /// Closes every partially built bucket now (e.g. at the end of the input) and returns them,
    /// shorter timeframes first. The last accepted minute is kept, so older input is still
    /// rejected; see rule 5 in the module docs for input that continues a flushed bucket.
    pub fn flush(&mut self) -> &[(Timeframe, Candle)] {
        let mut out = core::mem::take(&mut self.out);
        out.clear();
        self.close_ended(i64::MAX, &mut out);
        self.out = out;
        &self.out
    }

    /// The forming candle of `tf`: the accepted 1m candles of its current bucket merged with
    /// `forming_1m`, the exchange's not-yet-closed 1m candle. The current bucket is the one
    /// holding `forming_1m`, or without it the one holding the last accepted minute.
    /// A `forming_1m` at or before the last accepted minute is stale and ignored. `None` when
    /// `tf` is not configured or the bucket has nothing yet (or it already closed).
    /// For `tf = 1m` this is just `forming_1m`.
    pub fn forming(&self, tf: Timeframe, forming_1m: Option<&Candle>) -> Option<Candle> {
        // A forming candle that fails the checks (trades or volume out of range included) is
        // ignored like a stale one, so the sums below cannot overflow.
        let fresh = forming_1m.filter(|f| {
            self.last_minute.is_none_or(|last| f.open_time > last) && f.check().is_ok()
        });
        if tf == Timeframe::M1 {
            return fresh.copied();
        }
        let top = self.levels.iter().position(|l| l.tf == tf)?;
        let anchor = match fresh {
            Some(f) => f.open_time,
            None => self.last_minute?,
        };
        let open = tf.bucket_open(anchor);
        let end = open + tf.duration_ms();
        let within = |t: i64| open <= t && t < end;
        let mut acc: Option<Candle> = None;
        let mut overflow = false;
        let mut add = |c: &Candle| match &mut acc {
            Some(a) => overflow |= a.absorb(c).is_err(),
            None => acc = Some(*c),
        };
        // The level's own accumulator holds the oldest part of the bucket, its source's the next,
        // and so on down to 1m.
        let mut i = top as LevelId;
        while i != RAW {
            let lv = &self.levels[i as usize];
            if lv.active && within(lv.acc.open_time) {
                add(&lv.acc);
            }
            i = lv.source;
        }
        if let Some(f) = fresh {
            if within(f.open_time) {
                add(f);
            }
        }
        if overflow {
            return None;
        }
        acc.map(|mut a| {
            a.open_time = open;
            a
        })
    }
}

/// Parameters of a [`FlushBatch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlushConfig {
    /// Flush once this many candles are buffered (default 200).
    pub batch_max: usize,
    /// Flush once this long has passed since the last flush, if anything is buffered (default
    /// 500 ms).
    pub flush_ms: i64,
}

impl Default for FlushConfig {
    fn default() -> Self {
        Self { batch_max: 200, flush_ms: 500 }
    }
}

/// Buffers the closed candles of one series and releases them in sorted, de-duplicated batches
/// (design seed §7): "a truckload or half a second, whichever comes first".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlushBatch {
    config: FlushConfig,
    buf: Vec<Candle>,
    last_flush_ms: i64,
    last_emitted: Option<i64>,
}

impl FlushBatch {
    /// An empty batch whose flush timer starts at `now_ms`.
    pub fn new(config: FlushConfig, now_ms: i64) -> Self {
        Self { config, buf: Vec::new(), last_flush_ms: now_ms, last_emitted: None }
    }

    /// With the default parameters (200 candles / 500 ms).
    pub fn with_defaults(now_ms: i64) -> Self {
        Self::new(FlushConfig::default(), now_ms)
    }

    /// Resumes after candles up to `open_time` were already emitted (e.g. read back from storage
    /// after a restart): those and older are dropped at flush.
    pub fn with_last_emitted(mut self, open_time: Option<i64>) -> Self {
        self.last_emitted = open_time;
        self
    }

    pub fn config(&self) -> FlushConfig {
        self.config
    }

    /// `open_time` of the newest candle flushed so far.
    pub fn last_emitted(&self) -> Option<i64> {
        self.last_emitted
    }

    /// Candles buffered (before de-duplication).
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Buffers a closed candle; returns [`FlushBatch::is_due`] afterwards.
    pub fn push(&mut self, candle: Candle, now_ms: i64) -> bool {
        self.buf.push(candle);
        self.is_due(now_ms)
    }

    /// Whether to flush now: `batch_max` or more buffered, or something buffered and `flush_ms`
    /// passed since the last flush (a clock that went backwards counts as no time passed).
    pub fn is_due(&self, now_ms: i64) -> bool {
        !self.buf.is_empty()
            && (self.buf.len() >= self.config.batch_max
                || now_ms.saturating_sub(self.last_flush_ms) >= self.config.flush_ms)
    }

    /// Empties the buffer and returns its candles sorted by `open_time`, keeping the last received
    /// version of each `open_time` and dropping those at or before the last emitted one; restarts
    /// the timer and advances [`FlushBatch::last_emitted`].
    pub fn flush(&mut self, now_ms: i64) -> Vec<Candle> {
        self.last_flush_ms = now_ms;
        let mut buf = core::mem::take(&mut self.buf);
        buf.sort_by_key(|c| c.open_time); // stable: equal open_times stay in arrival order
        let mut out: Vec<Candle> = Vec::with_capacity(buf.len());
        for c in buf {
            if self.last_emitted.is_some_and(|last| c.open_time <= last) {
                continue;
            }
            match out.last_mut() {
                Some(prev) if prev.open_time == c.open_time => *prev = c,
                _ => out.push(c),
            }
        }
        if let Some(last) = out.last() {
            self.last_emitted = Some(last.open_time);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;

    use crate::testkit::Rng;

    const T0: i64 = 1_577_836_800_000; // 2020-01-01T00:00:00Z
    const HOUR: i64 = 3_600_000;
    const DAY: i64 = 86_400_000;

    fn p(s: &str) -> Price {
        Price::parse(s).unwrap()
    }

    fn c1(t: i64, o: i64, h: i64, l: i64, c: i64, v: i128, n: u64) -> Candle {
        Candle::one_minute(t, Price(o), Price(h), Price(l), Price(c), Volume(v), n)
    }

    /// A random valid 1m candle at `t` around `mid`.
    fn random_1m(rng: &mut Rng, t: i64, mid: &mut i64) -> Candle {
        *mid += rng.below(2001) as i64 - 1000;
        let a = *mid + rng.below(500) as i64 - 250;
        let b = *mid + rng.below(500) as i64 - 250;
        let hi = a.max(b) + rng.below(100) as i64;
        let lo = a.min(b) - rng.below(100) as i64;
        c1(t, a, hi, lo, b, (rng.next_u64() >> 24) as i128, rng.below(1000))
    }

    /// Straightforward reference: group by bucket, then fold field by field.
    fn naive(tf: Timeframe, ones: &[Candle]) -> Vec<Candle> {
        let mut groups: Vec<Vec<Candle>> = Vec::new();
        for c in ones {
            let b = c.open_time.div_euclid(tf.duration_ms()) * tf.duration_ms();
            match groups.last_mut() {
                Some(g) if g[0].open_time.div_euclid(tf.duration_ms()) * tf.duration_ms() == b => {
                    g.push(*c)
                }
                _ => groups.push(vec![*c]),
            }
        }
        groups
            .into_iter()
            .map(|g| Candle {
                open_time: g[0].open_time.div_euclid(tf.duration_ms()) * tf.duration_ms(),
                open: g[0].open,
                high: g.iter().map(|c| c.high).max().unwrap(),
                low: g.iter().map(|c| c.low).min().unwrap(),
                close: g[g.len() - 1].close,
                volume: Volume(g.iter().map(|c| c.volume.0).sum()),
                trades: g.iter().map(|c| c.trades).sum(),
                minutes: g.len() as u32,
            })
            .collect()
    }

    fn collect(out: &[(Timeframe, Candle)], tf: Timeframe) -> Vec<Candle> {
        out.iter().filter(|(t, _)| *t == tf).map(|(_, c)| *c).collect()
    }

    #[test]
    fn timeframe_names_round_trip() {
        let names = ["1m", "3m", "5m", "15m", "30m", "1h", "2h", "4h", "6h", "8h", "12h", "1d"];
        assert_eq!(Timeframe::ALL.len(), names.len());
        for (i, (tf, name)) in Timeframe::ALL.iter().zip(names).enumerate() {
            assert_eq!(tf.to_string(), name);
            assert_eq!(name.parse::<Timeframe>().unwrap(), *tf);
            assert_eq!(tf.index(), i);
            assert_eq!(serde_json::to_string(tf).unwrap(), format!("\"{name}\""));
            assert_eq!(serde_json::from_str::<Timeframe>(&format!("\"{name}\"")).unwrap(), *tf);
            assert_eq!(tf.duration_ms(), tf.minutes() as i64 * 60_000);
        }
        assert_eq!(Timeframe::H4.minutes(), 240);
        assert_eq!(Timeframe::D1.duration_ms(), DAY);
        assert!(Timeframe::ALL.windows(2).all(|w| w[0] < w[1] && w[0].minutes() < w[1].minutes()));
    }

    #[test]
    fn timeframe_parse_error_names_value_and_lists_valid() {
        for bad in ["7m", "1M", "", "1w", " 1m", "60m", "1D"] {
            let e = bad.parse::<Timeframe>().unwrap_err();
            assert_eq!(e, ParseTimeframeError { value: bad.to_string() });
            let msg = e.to_string();
            assert!(msg.contains(&format!("{bad:?}")), "{msg}");
            for tf in Timeframe::ALL {
                assert!(msg.contains(tf.name()), "{msg} lacks {tf}");
            }
        }
        assert!(serde_json::from_str::<Timeframe>("\"2m\"")
            .unwrap_err()
            .to_string()
            .contains("\"2m\""));
        assert!(serde_json::from_str::<Timeframe>("5").is_err());
    }

    #[test]
    fn bucket_open_aligns_each_timeframe() {
        // 2020-01-01T13:47:25.123Z
        let ts = T0 + 13 * HOUR + 47 * 60_000 + 25_123;
        let expected = [
            (Timeframe::M1, T0 + 13 * HOUR + 47 * 60_000),
            (Timeframe::M3, T0 + 13 * HOUR + 45 * 60_000),
            (Timeframe::M5, T0 + 13 * HOUR + 45 * 60_000),
            (Timeframe::M15, T0 + 13 * HOUR + 45 * 60_000),
            (Timeframe::M30, T0 + 13 * HOUR + 30 * 60_000),
            (Timeframe::H1, T0 + 13 * HOUR),
            (Timeframe::H2, T0 + 12 * HOUR),
            (Timeframe::H4, T0 + 12 * HOUR),
            (Timeframe::H6, T0 + 12 * HOUR),
            (Timeframe::H8, T0 + 8 * HOUR),
            (Timeframe::H12, T0 + 12 * HOUR),
            (Timeframe::D1, T0),
        ];
        for (tf, open) in expected {
            assert_eq!(tf.bucket_open(ts), open, "{tf}");
            assert_eq!(tf.bucket_open(open), open, "{tf}: an open time is its own bucket");
            assert_eq!(tf.bucket_open(open - 1), open - tf.duration_ms(), "{tf}");
            assert_eq!(tf.bucket_open(open + tf.duration_ms() - 1), open, "{tf}");
        }
        // 3m buckets are counted from the epoch: 2020-01-01T00:00Z is minute 26297280 = 3 x
        // 8765760,
        // so 00:04 lies in the bucket opening at 00:03.
        assert_eq!(Timeframe::M3.bucket_open(T0 + 4 * 60_000), T0 + 3 * 60_000);
        // 8h buckets start at 00:00, 08:00 and 16:00 UTC.
        assert_eq!(Timeframe::H8.bucket_open(T0 + 17 * HOUR), T0 + 16 * HOUR);
        // Before the epoch: floor, not truncation towards zero.
        assert_eq!(Timeframe::D1.bucket_open(-1), -DAY);
        assert_eq!(Timeframe::M1.bucket_open(-60_000), -60_000);
        assert_eq!(Timeframe::M1.bucket_open(-60_001), -120_000);
        assert_eq!(Timeframe::H1.bucket_open(-HOUR - 1), -2 * HOUR);
        assert_eq!(Timeframe::D1.bucket_open(0), 0);
        // 1969-12-31T13:20Z lies in the 12h bucket opening 1969-12-31T12:00Z.
        assert_eq!(Timeframe::H12.bucket_open(-(10 * HOUR + 40 * 60_000)), -12 * HOUR);

        let mut rng = Rng::new(11);
        for _ in 0..20_000 {
            let ts = (rng.next_u64() % (2 * TIME_LIMIT_MS as u64 + 1)) as i64 - TIME_LIMIT_MS;
            for tf in Timeframe::ALL {
                let open = tf.bucket_open(ts);
                let d = tf.duration_ms();
                assert!(open <= ts && ts < open + d, "{tf} {ts} -> {open}");
                assert_eq!(open % d, 0, "{tf} {ts} -> {open}");
                // Buckets nest: a bucket of a longer timeframe that is a multiple of this one
                // starts on one of this one's bucket boundaries.
                for big in Timeframe::ALL {
                    if big.minutes() % tf.minutes() == 0 {
                        assert_eq!(tf.bucket_open(big.bucket_open(ts)), big.bucket_open(ts));
                    }
                }
            }
        }
    }

    #[test]
    fn merge_takes_first_open_extremes_last_close_and_sums() {
        let a = c1(T0 + 60_000, 100, 150, 90, 120, 7, 3);
        let b = c1(T0 + 120_000, 121, 200, 95, 110, 5, 4);
        let c = c1(T0 + 240_000, 111, 130, 80, 125, 11, 0);
        let m = merge(Timeframe::M5, &[a, b, c]).unwrap();
        assert_eq!(
            m,
            Candle {
                open_time: T0,
                open: Price(100),
                high: Price(200),
                low: Price(80),
                close: Price(125),
                volume: Volume(23),
                trades: 7,
                minutes: 3,
            }
        );
        assert!(!m.is_complete(Timeframe::M5));
        assert_eq!(merge(Timeframe::M5, &[]), None);
        let single = merge(Timeframe::H1, &[b]).unwrap();
        assert_eq!(
            (single.open_time, single.open, single.close, single.minutes),
            (T0, b.open, b.close, 1)
        );
        // Merging merged candles sums their minute counts.
        let again = merge(Timeframe::H1, &[m, m]).unwrap();
        assert_eq!(again.minutes, 6);
        assert_eq!(again.volume, Volume(46));
    }

    #[test]
    fn candle_check_and_serde() {
        let good = Candle::one_minute(
            T0,
            p("7195.24"),
            p("7196.25"),
            p("7183.14"),
            p("7186.68"),
            Volume(5),
            493,
        );
        assert_eq!(good.check(), Ok(()));
        let json = serde_json::to_string(&good).unwrap();
        assert_eq!(
            json,
            r#"{"open_time":1577836800000,"open":"7195.24","high":"7196.25","low":"7183.14","close":"7186.68","volume":"0.00000005","trades":493,"minutes":1}"#
        );
        assert_eq!(serde_json::from_str::<Candle>(&json).unwrap(), good);
        let without_minutes = json.replace(r#","minutes":1"#, "");
        assert_eq!(serde_json::from_str::<Candle>(&without_minutes).unwrap(), good);

        let bad = |f: &dyn Fn(&mut Candle), reason: &'static str| {
            let mut c = good;
            f(&mut c);
            assert_eq!(c.check(), Err(CandleError::Inconsistent { open_time: T0, reason }));
        };
        bad(&|c| c.low = p("8000"), "high is below low");
        bad(&|c| c.open = p("7000"), "open is outside [low, high]");
        bad(&|c| c.open = p("7200"), "open is outside [low, high]");
        bad(&|c| c.close = p("7183.13"), "close is outside [low, high]");
        bad(&|c| c.volume = Volume(-1), "volume is negative");
    }

    #[test]
    fn aggregator_full_day_gives_complete_candles() {
        let mut rng = Rng::new(1);
        let mut mid = 1_000_000;
        let ones: Vec<Candle> =
            (0..1440).map(|i| random_1m(&mut rng, T0 + i * 60_000, &mut mid)).collect();
        let mut agg = DerivedAggregator::all();
        let mut out = Vec::new();
        for c in &ones {
            out.extend_from_slice(agg.push_closed_1m(*c).unwrap());
        }
        assert!(agg.flush().is_empty(), "the last minute of the day closed every bucket");
        for tf in Timeframe::ALL {
            let got = collect(&out, tf);
            assert_eq!(got.len() as u32, 1440 / tf.minutes(), "{tf}");
            assert!(got.iter().all(|c| c.is_complete(tf)), "{tf}");
            assert_eq!(got, naive(tf, &ones), "{tf}");
        }
        let day = collect(&out, Timeframe::D1)[0];
        assert_eq!(day, merge(Timeframe::D1, &ones).unwrap());
        assert_eq!(merge(Timeframe::D1, &collect(&out, Timeframe::H1)).unwrap(), day);
        // The day closed on the push of its last minute, after all its parts.
        assert_eq!(out.last().unwrap(), &(Timeframe::D1, day));
    }

    #[test]
    fn aggregator_missing_minutes_are_not_invented() {
        let mut agg = DerivedAggregator::new(&[Timeframe::M5, Timeframe::M15]);
        let at = |m: i64| T0 + m * 60_000;
        // Minutes 0, 1, 3 of the first 5m bucket; nothing closes yet (minute 4 may still come).
        assert!(agg.push_closed_1m(c1(at(0), 10, 12, 9, 11, 1, 1)).unwrap().is_empty());
        assert!(agg.push_closed_1m(c1(at(1), 11, 15, 11, 14, 2, 1)).unwrap().is_empty());
        assert!(agg.push_closed_1m(c1(at(3), 14, 14, 5, 6, 3, 1)).unwrap().is_empty());
        // Minute 4 missing; minute 6 is in the next bucket, so [0,5) closes with 3 minutes.
        let out = agg.push_closed_1m(c1(at(6), 6, 7, 6, 7, 4, 2)).unwrap().to_vec();
        assert_eq!(
            out,
            vec![(
                Timeframe::M5,
                Candle {
                    open_time: at(0),
                    open: Price(10),
                    high: Price(15),
                    low: Price(5),
                    close: Price(6),
                    volume: Volume(6),
                    trades: 3,
                    minutes: 3
                }
            )]
        );
        // Minute 9 is the last of [5,10): closes at once, with 2 minutes.
        let out = agg.push_closed_1m(c1(at(9), 7, 8, 7, 8, 5, 1)).unwrap().to_vec();
        assert_eq!(out.len(), 1);
        assert_eq!(
            (out[0].0, out[0].1.open_time, out[0].1.minutes, out[0].1.open),
            (Timeframe::M5, at(5), 2, Price(6))
        );
        // A jump to minute 47 skips [10,15), [15,20) ... [40,45) entirely: no candle for them;
        // the 15m bucket [0,15) closes with the 5 minutes it had; [15,30) and [30,45) yield
        // nothing.
        let out = agg.push_closed_1m(c1(at(47), 8, 9, 8, 9, 1, 1)).unwrap().to_vec();
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].0, out[0].1.open_time, out[0].1.minutes), (Timeframe::M15, at(0), 5));
        assert_eq!(out[0].1.close, Price(8));
        assert!(!out[0].1.is_complete(Timeframe::M15));
        // End of input: flush closes the partial [45,50) and [45,60).
        let out = agg.flush().to_vec();
        assert_eq!(out.len(), 2);
        assert_eq!((out[0].0, out[0].1.open_time, out[0].1.minutes), (Timeframe::M5, at(45), 1));
        assert_eq!((out[1].0, out[1].1.open_time, out[1].1.minutes), (Timeframe::M15, at(45), 1));
        assert!(agg.flush().is_empty());
    }

    #[test]
    fn aggregator_bucket_with_only_its_last_minute_closes_at_once() {
        let mut agg = DerivedAggregator::new(&[Timeframe::M3, Timeframe::H1]);
        agg.push_closed_1m(c1(T0, 1, 1, 1, 1, 1, 1)).unwrap();
        // Minute 5 is the last of [3,6): [0,3) closes for the gap, then [3,6) closes at once.
        let out = agg.push_closed_1m(c1(T0 + 5 * 60_000, 2, 2, 2, 2, 1, 1)).unwrap().to_vec();
        let times: Vec<(Timeframe, i64, u32)> =
            out.iter().map(|(tf, c)| (*tf, c.open_time, c.minutes)).collect();
        assert_eq!(times, vec![(Timeframe::M3, T0, 1), (Timeframe::M3, T0 + 3 * 60_000, 1)]);
        // The hour keeps both.
        let out = agg.push_closed_1m(c1(T0 + 59 * 60_000, 3, 3, 3, 3, 1, 1)).unwrap().to_vec();
        let h = collect(&out, Timeframe::H1);
        assert_eq!(h.len(), 1);
        assert_eq!(
            (h[0].minutes, h[0].open, h[0].close, h[0].volume),
            (3, Price(1), Price(3), Volume(3))
        );
    }

    #[test]
    fn aggregator_rejects_duplicates_and_out_of_order_leaving_state_unchanged() {
        let mut agg = DerivedAggregator::all();
        let mut rng = Rng::new(5);
        let mut mid = 500_000;
        for i in 0..10 {
            agg.push_closed_1m(random_1m(&mut rng, T0 + i * 60_000, &mut mid)).unwrap();
        }
        let before = agg.clone();
        let last = T0 + 9 * 60_000;
        let dup = random_1m(&mut rng, last, &mut mid);
        assert_eq!(agg.push_closed_1m(dup), Err(CandleError::Duplicate { open_time: last }));
        assert_eq!(agg, before);
        let old = random_1m(&mut rng, T0 + 3 * 60_000, &mut mid);
        assert_eq!(
            agg.push_closed_1m(old),
            Err(CandleError::OutOfOrder { open_time: T0 + 3 * 60_000, last })
        );
        assert_eq!(agg, before);
        let mut odd = random_1m(&mut rng, T0 + 10 * 60_000 + 1, &mut mid);
        assert_eq!(
            agg.push_closed_1m(odd),
            Err(CandleError::Misaligned { open_time: odd.open_time })
        );
        odd.open_time = T0 + 10 * 60_000;
        odd.minutes = 5;
        assert_eq!(
            agg.push_closed_1m(odd),
            Err(CandleError::NotOneMinute { open_time: odd.open_time, minutes: 5 })
        );
        odd.minutes = 1;
        odd.high = Price(odd.low.0 - 1);
        assert!(matches!(agg.push_closed_1m(odd), Err(CandleError::Inconsistent { .. })));
        let far = c1(TIME_LIMIT_MS + 60_000 - TIME_LIMIT_MS % 60_000, 1, 1, 1, 1, 1, 1);
        assert!(matches!(agg.push_closed_1m(far), Err(CandleError::OutOfRange { .. })));
        assert_eq!(agg, before);
        // The error messages name the offending time.
        assert!(CandleError::Duplicate { open_time: last }.to_string().contains(&last.to_string()));
        // And the aggregator goes on as if nothing happened.
        let next = random_1m(&mut rng, T0 + 10 * 60_000, &mut mid);
        assert!(agg.push_closed_1m(next).is_ok());
        assert_eq!(agg.last_minute(), Some(T0 + 10 * 60_000));
    }

    #[test]
    fn aggregator_flush_then_continue_in_same_bucket() {
        let mut agg = DerivedAggregator::new(&[Timeframe::H1]);
        agg.push_closed_1m(c1(T0, 1, 2, 1, 2, 1, 1)).unwrap();
        let out = agg.flush().to_vec();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].1.minutes, 1);
        // Old input is still rejected after a flush.
        assert_eq!(
            agg.push_closed_1m(c1(T0, 1, 2, 1, 2, 1, 1)),
            Err(CandleError::Duplicate { open_time: T0 })
        );
        // Rule 5: continuing the flushed hour starts a second candle of the same hour.
        agg.push_closed_1m(c1(T0 + 60_000, 5, 6, 5, 6, 1, 1)).unwrap();
        let out = agg.flush().to_vec();
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].1.open_time, out[0].1.open, out[0].1.minutes), (T0, Price(5), 1));
    }

    #[test]
    fn aggregator_only_1m_passes_through() {
        let mut agg = DerivedAggregator::new(&[Timeframe::M1]);
        assert_eq!(agg.timeframes(), vec![Timeframe::M1]);
        let c = c1(T0, 1, 2, 1, 2, 1, 1);
        assert_eq!(agg.push_closed_1m(c).unwrap(), &[(Timeframe::M1, c)]);
        assert!(agg.flush().is_empty());
        assert_eq!(agg.forming(Timeframe::M1, None), None);
        let f = c1(T0 + 60_000, 2, 3, 2, 3, 1, 1);
        assert_eq!(agg.forming(Timeframe::M1, Some(&f)), Some(f));
        assert_eq!(agg.forming(Timeframe::M1, Some(&c)), None, "stale forming 1m is ignored");
        assert_eq!(agg.forming(Timeframe::H1, Some(&f)), None, "1h is not configured");
        assert_eq!(
            DerivedAggregator::new(&[Timeframe::D1, Timeframe::M5, Timeframe::D1]).timeframes(),
            vec![Timeframe::M5, Timeframe::D1]
        );
    }

    #[test]
    fn aggregator_forming_combines_closed_minutes_and_forming_1m() {
        let mut agg = DerivedAggregator::all();
        assert_eq!(agg.forming(Timeframe::H1, None), None);
        let f0 = c1(T0, 5, 6, 4, 6, 1, 1);
        let only = agg.forming(Timeframe::H1, Some(&f0)).unwrap();
        assert_eq!(only, f0, "bucket of the forming minute with nothing closed yet");
        let mut rng = Rng::new(9);
        let mut mid = 100_000;
        let ones: Vec<Candle> =
            (0..37).map(|i| random_1m(&mut rng, T0 + i * 60_000, &mut mid)).collect();
        for c in &ones {
            agg.push_closed_1m(*c).unwrap();
        }
        let forming = random_1m(&mut rng, T0 + 37 * 60_000, &mut mid);
        let mut all = ones.clone();
        all.push(forming);
        for tf in Timeframe::ALL.into_iter().skip(1) {
            let open = tf.bucket_open(forming.open_time);
            let part: Vec<Candle> =
                all.iter().copied().filter(|c| tf.bucket_open(c.open_time) == open).collect();
            assert_eq!(agg.forming(tf, Some(&forming)), merge(tf, &part), "{tf}");
            // Without a forming 1m: the bucket of the last accepted minute (36), unless minute 36
            // was that bucket's last and closed it.
            let open36 = tf.bucket_open(T0 + 36 * 60_000);
            let closed36: Vec<Candle> =
                ones.iter().copied().filter(|c| tf.bucket_open(c.open_time) == open36).collect();
            let still_open = tf.bucket_open(T0 + 37 * 60_000) == open36;
            let want = if still_open { merge(tf, &closed36) } else { None };
            assert_eq!(agg.forming(tf, None), want, "{tf}");
        }
        // A stale forming 1m is ignored.
        assert_eq!(agg.forming(Timeframe::H1, Some(&ones[3])), agg.forming(Timeframe::H1, None));
        // Forming minute in a later bucket than the open one: only the forming minute counts.
        let later = c1(T0 + 60 * 60_000, 1, 1, 1, 1, 1, 1);
        assert_eq!(agg.forming(Timeframe::H1, Some(&later)), Some(later));
    }

    /// Derived candles (closed and forming) equal a naive recomputation from the 1m candles, for
    /// every timeframe, with random gaps, across the epoch, and close exactly when the rules say.
    #[test]
    fn randomized_matches_naive_recomputation() {
        for seed in 0..120u64 {
            let mut rng = Rng::new(seed);
            // Start anywhere within ±3 days of the epoch, or in 2020.
            let base = if seed % 2 == 0 { 0 } else { T0 };
            let mut t = base + (rng.below(6 * 1440) as i64 - 3 * 1440) * 60_000;
            let mut mid = 5_000_000;
            let n = 200 + rng.below(3000) as usize;
            // Gap profile per seed: none, sparse single minutes, or long holes.
            let profile = rng.below(4);
            let mut ones = Vec::with_capacity(n);
            for _ in 0..n {
                ones.push(random_1m(&mut rng, t, &mut mid));
                let step = match profile {
                    0 => 1,
                    1 => 1 + rng.below(3) as i64,
                    2 => {
                        if rng.chance(1, 50) {
                            2 + rng.below(2000) as i64
                        } else {
                            1
                        }
                    }
                    _ => {
                        if rng.chance(1, 3) {
                            1 + rng.below(200) as i64
                        } else {
                            1
                        }
                    }
                };
                t += step * 60_000;
            }
            let mut agg = DerivedAggregator::all();
            let mut out: Vec<(usize, Timeframe, Candle)> = Vec::new();
            for (j, c) in ones.iter().enumerate() {
                // The forming candle of every timeframe, with minute j still forming.
                if rng.chance(1, 8) {
                    for tf in Timeframe::ALL.into_iter().skip(1) {
                        let open = tf.bucket_open(c.open_time);
                        let start = ones[..=j].partition_point(|x| x.open_time < open);
                        assert_eq!(
                            agg.forming(tf, Some(c)),
                            merge(tf, &ones[start..=j]),
                            "seed {seed} {tf} j {j}"
                        );
                    }
                }
                for (tf, k) in agg.push_closed_1m(*c).unwrap() {
                    out.push((j, *tf, *k));
                }
            }
            for (tf, k) in agg.flush() {
                out.push((usize::MAX, *tf, *k));
            }
            for tf in Timeframe::ALL {
                let want = naive(tf, &ones);
                let got: Vec<(usize, Candle)> =
                    out.iter().filter(|(_, t, _)| *t == tf).map(|(j, _, c)| (*j, *c)).collect();
                assert_eq!(
                    got.iter().map(|(_, c)| *c).collect::<Vec<_>>(),
                    want,
                    "seed {seed} {tf}"
                );
                for (j, c) in got {
                    // Closed by the first minute at or after the bucket's last minute, or by flush.
                    let last_minute = c.open_time + tf.duration_ms() - 60_000;
                    let expected = match ones.partition_point(|x| x.open_time < last_minute) {
                        i if i == ones.len() => usize::MAX,
                        i => i,
                    };
                    assert_eq!(j, expected, "seed {seed} {tf} bucket {}", c.open_time);
                    assert!(c.minutes >= 1 && c.minutes <= tf.minutes());
                }
            }
        }
    }

    /// Everything but the scratch output buffer.
    fn same_state(a: &DerivedAggregator, b: &DerivedAggregator) -> bool {
        a.levels == b.levels
            && a.last_minute == b.last_minute
            && (a.raw_sinks, a.raw_count, a.blocks_3_5, a.emit_1m)
                == (b.raw_sinks, b.raw_count, b.blocks_3_5, b.emit_1m)
    }

    /// `push_closed_1m_batch` gives exactly what `push_closed_1m` one by one gives: the same
    /// candles in the same order, the same errors at the same candles (with the state as after
    /// the last good one), the same state and forming candles after every batch, for random
    /// timeframe sets and inputs with gaps, duplicates, out-of-order, misaligned, inconsistent and
    /// out-of-range candles, flushes between batches, and batches of every size.
    #[test]
    fn batch_matches_one_by_one() {
        let sets: [&[Timeframe]; 6] = [
            &Timeframe::ALL,
            &[Timeframe::H4, Timeframe::H6, Timeframe::H8, Timeframe::H12, Timeframe::D1],
            &[Timeframe::M3, Timeframe::M5, Timeframe::M15],
            &[Timeframe::M1],
            &[Timeframe::M5],
            &[Timeframe::M1, Timeframe::H6, Timeframe::H8],
        ];
        for seed in 0..300u64 {
            let mut rng = Rng::new(1000 + seed);
            let tfs: Vec<Timeframe> = if seed % 3 == 0 {
                sets[(seed / 3) as usize % sets.len()].to_vec()
            } else {
                Timeframe::ALL.into_iter().filter(|_| rng.chance(1, 2)).collect()
            };
            let top = TIME_LIMIT_MS - TIME_LIMIT_MS % 60_000;
            let mut t = match seed % 5 {
                0 => top - rng.below(3000) as i64 * 60_000,
                1 => (rng.below(4 * 1440) as i64 - 2 * 1440) * 60_000,
                _ => T0 + rng.below(1440) as i64 * 60_000,
            };
            let mut mid = 3_000_000;
            let n = 50 + rng.below(4000) as usize;
            let gap_rate = [0, 200, 20, 3][rng.below(4) as usize];
            let bad_rate = [0, 500, 30][rng.below(3) as usize];
            let mut input: Vec<Candle> = Vec::with_capacity(n);
            for _ in 0..n {
                let mut c = random_1m(&mut rng, t, &mut mid);
                if bad_rate != 0 && rng.chance(1, bad_rate) {
                    match rng.below(10) {
                        8 => c.close = Price(c.high.0 + 1),
                        9 => c.open = Price(c.low.0 - 1),
                        0 => c.open_time -= 60_000, // duplicate
                        1 => c.open_time -= (2 + rng.below(50) as i64) * 60_000, // out of order
                        2 => c.open_time += 1 + rng.below(59_999) as i64, // misaligned
                        3 => c.minutes = rng.below(3) as u32 * 2, // 0 or 2 or 4
                        4 => c.high = Price(c.low.0 - 1),
                        5 => c.open = Price(c.high.0 + 1),
                        6 => c.close = Price(c.low.0 - 1),
                        _ => c.volume = Volume(-1 - rng.below(10) as i128),
                    }
                    input.push(c);
                    // Half the time the bad candle takes the place of a minute, so the stream
                    // goes on right after it (a bad candle inside an otherwise contiguous run).
                    if rng.chance(1, 2) {
                        t += 60_000;
                    }
                    continue;
                }
                input.push(c);
                t += if gap_rate != 0 && rng.chance(1, gap_rate) {
                    let span = if rng.chance(1, 4) { 3000 } else { 20 };
                    (2 + rng.below(span) as i64) * 60_000
                } else {
                    60_000
                };
            }

            let mut one = DerivedAggregator::new(&tfs);
            let mut bat = DerivedAggregator::new(&tfs);
            let mut want: Vec<(Timeframe, Candle)> = Vec::new();
            let mut got: Vec<(Timeframe, Candle)> = Vec::new();
            let mut want_err: Vec<(usize, CandleError)> = Vec::new();
            let mut got_err: Vec<(usize, CandleError)> = Vec::new();
            let mut pos = 0;
            while pos < input.len() {
                let len = match rng.below(4) {
                    0 => 1,
                    1 => rng.below(8) as usize,
                    2 => rng.below(300) as usize,
                    _ => input.len(),
                }
                .min(input.len() - pos);
                let batch = &input[pos..pos + len];
                if rng.chance(1, 3) {
                    // The caller consumed the output.
                    got.clear();
                    want.clear();
                }
                // Reference, one by one.
                for (k, c) in batch.iter().enumerate() {
                    match one.push_closed_1m(*c) {
                        Ok(o) => want.extend_from_slice(o),
                        Err(e) => want_err.push((pos + k, e)),
                    }
                }
                // Batch: resume after each rejected candle.
                let mut from = 0;
                let mark = got.len();
                while from <= batch.len() {
                    let rest = &batch[from..];
                    let before = bat.clone();
                    match bat.push_closed_1m_batch(rest, &mut got) {
                        Ok(()) => break,
                        Err((i, e)) => {
                            // The state is as after the last good candle: replaying rest[..i]
                            // one by one on `before` gives it.
                            let mut check = before;
                            for c in &rest[..i] {
                                check.push_closed_1m(*c).unwrap();
                            }
                            assert!(same_state(&check, &bat), "seed {seed}: state after error");
                            got_err.push((pos + from + i, e));
                            from += i + 1;
                        }
                    }
                }
                assert!(got.len() >= mark);
                assert_eq!(got, want, "seed {seed} tfs {tfs:?} batch at {pos} len {len}");
                assert_eq!(got_err, want_err, "seed {seed}");
                assert!(same_state(&one, &bat), "seed {seed} after batch at {pos}");
                let probe = input.get(pos + len).copied();
                for tf in &tfs {
                    assert_eq!(one.forming(*tf, probe.as_ref()), bat.forming(*tf, probe.as_ref()));
                }
                if rng.chance(1, 20) {
                    assert_eq!(one.flush().to_vec(), bat.flush().to_vec(), "seed {seed}");
                }
                pos += len;
            }
            assert_eq!(one.flush().to_vec(), bat.flush().to_vec());
        }
    }

    #[test]
    fn flush_batch_defaults_and_triggers() {
        let cfg = FlushConfig::default();
        assert_eq!((cfg.batch_max, cfg.flush_ms), (200, 500));
        let mut b = FlushBatch::with_defaults(1_000);
        assert!(!b.is_due(1_000_000), "nothing buffered: never due");
        assert!(!b.push(c1(T0, 1, 1, 1, 1, 1, 1), 1_100));
        assert!(!b.is_due(1_499));
        assert!(b.is_due(1_500), "500 ms since the last flush");
        assert!(!b.is_due(900), "a clock going backwards is not time passing");
        assert_eq!(b.flush(1_500).len(), 1);
        assert!(!b.is_due(5_000));
        // Size trigger: the 200th candle makes it due without any time passing.
        for i in 1..200 {
            assert!(!b.push(c1(T0 + i * 60_000, 1, 1, 1, 1, 1, 1), 1_500), "{i}");
        }
        assert!(b.push(c1(T0 + 200 * 60_000, 1, 1, 1, 1, 1, 1), 1_500));
        assert_eq!(b.len(), 200);
        let out = b.flush(1_500);
        assert_eq!(out.len(), 200);
        assert!(b.is_empty());
        assert_eq!(b.last_emitted(), Some(T0 + 200 * 60_000));

        let mut small = FlushBatch::new(FlushConfig { batch_max: 2, flush_ms: 10 }, 0);
        assert!(!small.push(c1(T0, 1, 1, 1, 1, 1, 1), 0));
        assert!(small.push(c1(T0 + 60_000, 1, 1, 1, 1, 1, 1), 0));
        assert_eq!(small.flush(3).len(), 2);
        assert!(!small.push(c1(T0 + 120_000, 1, 1, 1, 1, 1, 1), 12));
        assert!(small.push(c1(T0 + 180_000, 1, 1, 1, 1, 1, 1), 13));
    }

    #[test]
    fn flush_batch_sorts_dedupes_and_drops_already_emitted() {
        let k = |t: i64, close: i64| c1(T0 + t * 60_000, 1, 100, 1, close, 1, 1);
        let mut b = FlushBatch::with_defaults(0);
        for c in [k(3, 30), k(1, 10), k(2, 20), k(1, 11), k(3, 31), k(1, 12)] {
            b.push(c, 0);
        }
        let out = b.flush(10);
        // Sorted, and the last received version of minutes 1 and 3 wins.
        assert_eq!(out, vec![k(1, 12), k(2, 20), k(3, 31)]);
        assert_eq!(b.last_emitted(), Some(T0 + 3 * 60_000));
        // A re-delivered candle (network jitter) and an older one are dropped next time.
        b.push(k(3, 99), 20);
        b.push(k(2, 99), 20);
        b.push(k(4, 40), 20);
        assert_eq!(b.flush(30), vec![k(4, 40)]);
        // Only stale candles: nothing comes out and last_emitted stays.
        b.push(k(4, 41), 40);
        assert_eq!(b.flush(50), vec![]);
        assert_eq!(b.last_emitted(), Some(T0 + 4 * 60_000));
        // The timer restarted at the flush.
        b.push(k(5, 50), 60);
        assert!(!b.is_due(549));
        assert!(b.is_due(550));
        // Resuming after a restart.
        let mut r = FlushBatch::with_defaults(0).with_last_emitted(Some(T0 + 60_000));
        r.push(k(1, 1), 0);
        r.push(k(2, 2), 0);
        assert_eq!(r.flush(0), vec![k(2, 2)]);
        assert_eq!(FlushBatch::with_defaults(0).flush(0), vec![]);
    }

    #[test]
    fn flush_batch_randomized_against_reference() {
        let mut rng = Rng::new(3);
        for _ in 0..200 {
            let mut b = FlushBatch::new(
                FlushConfig { batch_max: 1 + rng.below(20) as usize, flush_ms: 50 },
                0,
            );
            let mut emitted: Vec<Candle> = Vec::new();
            let mut pending: Vec<Candle> = Vec::new();
            let mut now = 0;
            for _ in 0..300 {
                now += rng.below(30) as i64;
                let c = c1(
                    T0 + rng.below(100) as i64 * 60_000,
                    1,
                    10,
                    1,
                    rng.below(10) as i64 + 1,
                    1,
                    1,
                );
                pending.push(c);
                if b.push(c, now) {
                    let out = b.flush(now);
                    // Reference: stable sort, last version per open_time, newer than emitted.
                    let last = emitted.last().map(|c| c.open_time);
                    let mut want: Vec<Candle> = Vec::new();
                    let mut sorted = core::mem::take(&mut pending);
                    sorted.sort_by_key(|c| c.open_time);
                    for c in sorted {
                        if last.is_some_and(|l| c.open_time <= l) {
                            continue;
                        }
                        if want.last().is_some_and(|w| w.open_time == c.open_time) {
                            want.pop();
                        }
                        want.push(c);
                    }
                    assert_eq!(out, want);
                    emitted.extend(out);
                }
            }
            assert!(emitted.windows(2).all(|w| w[0].open_time < w[1].open_time));
        }
    }

    /// Issue 15 item 12: trade counts were summed with `wrapping_add`, so two huge counts made a
    /// small, wrong one. A count (or volume) beyond the bound is now a typed error everywhere:
    /// one by one, in batches (both the block and the run paths), and in `merge`.
    #[test]
    fn trade_count_and_volume_overflow_are_errors_not_wraps() {
        let huge = u64::MAX / 2 + 1;
        let bad = c1(T0, 100, 100, 100, 100, 1, huge);
        let overflow = CandleError::Overflow { open_time: T0, what: "trade count" };
        assert_eq!(bad.check(), Err(overflow.clone()));
        let over_volume = c1(T0, 100, 100, 100, 100, MAX_VOLUME + 1, 1);
        assert_eq!(
            over_volume.check(),
            Err(CandleError::Overflow { open_time: T0, what: "volume" })
        );
        assert_eq!(c1(T0, 100, 100, 100, 100, MAX_VOLUME, MAX_TRADES).check(), Ok(()));

        // One by one: refused, the aggregator unchanged.
        let mut agg = DerivedAggregator::new(&[Timeframe::M3, Timeframe::M5, Timeframe::M15]);
        let before = agg.clone();
        assert_eq!(agg.push_closed_1m(bad).map(<[_]>::to_vec), Err(overflow));
        assert_eq!(agg, before);

        // In a batch, at every position of aligned 15-minute blocks and of plain runs, for
        // every configuration: the error names the candle, nothing wrapped was emitted.
        for tfs in [
            &[Timeframe::M3, Timeframe::M5, Timeframe::M15][..],
            &[Timeframe::M1, Timeframe::M3, Timeframe::M5][..],
            &[Timeframe::M1, Timeframe::H1][..],
            &[Timeframe::M15, Timeframe::D1][..],
        ] {
            for at in [0usize, 1, 14, 15, 16, 29, 44] {
                for (trades, volume) in [(huge, 1), (MAX_TRADES + 1, 1), (1, MAX_VOLUME + 1)] {
                    let mut ones: Vec<Candle> =
                        (0..45).map(|i| c1(T0 + i * MINUTE_MS, 100, 100, 100, 100, 1, 1)).collect();
                    ones[at].trades = trades;
                    ones[at].volume = Volume(volume);
                    let mut agg = DerivedAggregator::new(tfs);
                    agg.push_closed_1m(c1(T0 - MINUTE_MS, 100, 100, 100, 100, 1, 1)).unwrap();
                    let mut out = Vec::new();
                    let err = agg.push_closed_1m_batch(&ones, &mut out).unwrap_err();
                    assert_eq!(err.0, at, "{tfs:?} at {at}");
                    assert!(matches!(err.1, CandleError::Overflow { .. }), "{err:?}");
                    for (_, k) in &out {
                        assert!(k.trades <= 1440 && k.volume.raw() <= 1440, "{k:?}");
                    }
                }
            }
        }

        // try_merge: sums that do not fit are errors, not wraps.
        let a = c1(T0, 100, 100, 100, 100, 1, u64::MAX - 1);
        let b = c1(T0 + MINUTE_MS, 100, 100, 100, 100, 1, 2);
        assert_eq!(
            try_merge(Timeframe::M5, &[a, b]),
            Err(CandleError::Overflow { open_time: T0, what: "trade count" })
        );
        let v = c1(T0, 100, 100, 100, 100, i128::MAX, 1);
        assert_eq!(
            try_merge(Timeframe::M5, &[v, v]),
            Err(CandleError::Overflow { open_time: T0, what: "volume" })
        );

        // forming: an out-of-range forming 1m candle is ignored like a stale one.
        let mut agg = DerivedAggregator::new(&[Timeframe::M5]);
        agg.push_closed_1m(c1(T0, 100, 100, 100, 100, 1, 7)).unwrap();
        let forming = c1(T0 + MINUTE_MS, 100, 100, 100, 100, 1, u64::MAX);
        assert_eq!(agg.forming(Timeframe::M5, Some(&forming)).map(|k| k.trades), Some(7));
    }
}
