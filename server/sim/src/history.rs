//! Kline history before the simulator started: a pure function of (seed, symbol, minute).
//!
//! Backfill asks for days back, so REST klines must answer for any past minute, the same way on
//! every call and every run with the same seed, and the live engine must start exactly where
//! history ends so history and live candles join without a jump.
//!
//! ## Construction (integer ticks throughout)
//! 1. **Anchors.** The price at the start of UTC day `d` is `p_ref + N(d)`, where `p_ref` is the
//!    symbol's reference price and `N` a sum of four octaves of seeded value noise (periods
//!    180 d, 30 d, 7 d, 1 d; amplitudes 10 %, 5 %, 3 %, 1 % of `p_ref`) linearly interpolated
//!    between lattice points hashed from (seed, symbol, octave, index). Any anchor costs four
//!    hashes; no walk from a distant origin is needed.
//! 2. **Day blocks.** Day `d`'s 1440 minutes are a random walk (~6 bp per minute) from a
//!    `SmallRng` seeded with (seed, symbol, day), bent into a bridge from `anchor(d)` to
//!    `anchor(d + 1)`. Each minute opens at the previous close; wicks, volume (around the live
//!    engine's activity), trade count and taker share are drawn per minute.
//! 3. **The join.** History covers the minutes before the live start minute; the live engine
//!    starts at the close of the last of them ([`History::start_price`]).
//!
//! A minute's candle therefore depends only on (seed, symbol, minute) — not even on when the
//! simulator started, so restarts serve the same history for the minutes before both starts.
//! The last few generated blocks are cached.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use shared::candle::{Candle, MINUTE_MS};
use shared::fixed::SCALE;
use shared::{Price, Volume};

use crate::klines::SimCandle;
use crate::symbols::{derive_seed, SymbolSpec};

const DAY_MINUTES: i64 = 1_440;
/// (period in minutes, amplitude in 1/10000 of the start price).
const OCTAVES: [(i64, i64); 4] = [
    (DAY_MINUTES * 180, 1_000),
    (DAY_MINUTES * 30, 500),
    (DAY_MINUTES * 7, 300),
    (DAY_MINUTES, 100),
];
/// Generated day blocks kept.
const CACHE_BLOCKS: usize = 8;

/// The generated history of one symbol. See the module docs.
#[derive(Debug)]
pub struct History {
    seed: u64,
    symbol: String,
    tick: i64,
    step: i64,
    lot_steps: i64,
    /// Reference price, ticks.
    p0: i64,
    /// Lowest price history may reach, ticks.
    floor: i64,
    /// First minute index with history (the listing).
    first: i64,
    /// First live minute index (history is the minutes before it).
    end: i64,
    /// Recently generated blocks by day index; a lock because REST handlers share it.
    cache: Mutex<VecDeque<(i64, Arc<Vec<SimCandle>>)>>,
}

impl History {
    /// The history of `spec` under `seed`, for the minutes before `live_start_ms` (floored to a
    /// minute), from the symbol's listing on.
    pub fn new(spec: &SymbolSpec, seed: u64, live_start_ms: i64) -> History {
        let p0 = spec.reference_ticks();
        History {
            seed,
            symbol: spec.symbol.clone(),
            tick: spec.tick.raw(),
            step: spec.step.raw(),
            lot_steps: spec.lot_steps(),
            p0,
            floor: (p0 / 20).max(10),
            first: spec.listed_ms.div_euclid(MINUTE_MS),
            end: live_start_ms.div_euclid(MINUTE_MS),
            cache: Mutex::new(VecDeque::new()),
        }
    }

    /// The price at the start of the live minute: the close of the last historical minute
    /// (computed the same way even when the start precedes the listing).
    pub fn start_price(&self) -> Price {
        let m = self.end - 1;
        let day = m.div_euclid(DAY_MINUTES);
        self.block(day)[(m - day * DAY_MINUTES) as usize].candle.close
    }

    /// Open time of the first historical minute, ms.
    pub fn first_minute_ms(&self) -> i64 {
        self.first * MINUTE_MS
    }

    /// Open time of the first live minute (history ends before it), ms.
    pub fn end_minute_ms(&self) -> i64 {
        self.end * MINUTE_MS
    }

    /// Calls `f` with every historical minute whose open time lies in `[start_ms, end_ms]`,
    /// oldest first.
    pub fn visit(&self, start_ms: i64, end_ms: i64, mut f: impl FnMut(&SimCandle)) {
        let lo = start_ms.saturating_add(MINUTE_MS - 1).div_euclid(MINUTE_MS).max(self.first);
        let hi = end_ms.div_euclid(MINUTE_MS).min(self.end - 1);
        let mut m = lo;
        while m <= hi {
            let day = m.div_euclid(DAY_MINUTES);
            let block = self.block(day);
            let day_start = day * DAY_MINUTES;
            let upto = hi.min(day_start + block.len() as i64 - 1);
            for c in &block[(m - day_start) as usize..=(upto - day_start) as usize] {
                f(c);
            }
            m = upto + 1;
        }
    }

    /// Historical minutes with open time in `[start_ms, end_ms]`, oldest first.
    pub fn candles(&self, start_ms: i64, end_ms: i64) -> Vec<SimCandle> {
        let mut out = Vec::new();
        self.visit(start_ms, end_ms, |c| out.push(*c));
        out
    }

    /// The hashed lattice value of `octave` at `i`, in `[-amp, amp]` ticks.
    fn lattice(&self, octave: usize, i: i64, amp: i64) -> i64 {
        let h = derive_seed(self.seed, &self.symbol, &[100 + octave as u64, i as u64]);
        (h % (2 * amp as u64 + 1)) as i64 - amp
    }

    /// `N(m)`: the value noise at minute index `m`, ticks.
    fn noise(&self, m: i64) -> i64 {
        let mut sum = 0i64;
        for (k, &(period, amp_bp)) in OCTAVES.iter().enumerate() {
            let amp = self.p0 * amp_bp / 10_000;
            if amp == 0 {
                continue;
            }
            let i = m.div_euclid(period);
            let f = m.rem_euclid(period);
            let v0 = self.lattice(k, i, amp) as i128;
            let v1 = self.lattice(k, i + 1, amp) as i128;
            sum += (v0 + (v1 - v0) * f as i128 / period as i128) as i64;
        }
        sum
    }

    /// The price at the boundary before minute `m`, ticks.
    fn anchor(&self, m: i64) -> i64 {
        (self.p0 + self.noise(m)).max(self.floor)
    }

    /// The 1440 minutes of day `day`, cached.
    fn block(&self, day: i64) -> Arc<Vec<SimCandle>> {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, b)) = cache.iter().find(|(d, _)| *d == day) {
            return b.clone();
        }
        drop(cache);
        let b = Arc::new(self.generate(day));
        cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= CACHE_BLOCKS {
            cache.pop_front();
        }
        cache.push_back((day, b.clone()));
        b
    }

    fn generate(&self, day: i64) -> Vec<SimCandle> {
        let s = day * DAY_MINUTES;
        let e = s + DAY_MINUTES;
        let n = DAY_MINUTES;
        let mut rng =
            SmallRng::seed_from_u64(derive_seed(self.seed, &self.symbol, &[200, day as u64]));
        let a = self.anchor(s);
        let b = self.anchor(e);
        let sigma = (a as f64 * 6e-4).max(1.0);
        // the walk, then bent so it ends exactly at b
        let mut w = Vec::with_capacity(n as usize + 1);
        w.push(0i64);
        for _ in 0..n {
            let g: f64 = ((0..4).map(|_| rng.random::<f64>()).sum::<f64>() - 2.0) * 3f64.sqrt();
            let u: f64 = rng.random();
            let step = (g * sigma + u).floor() as i64;
            w.push(w.last().unwrap() + step);
        }
        let drift = (w[n as usize] - (b - a)) as i128;
        let x: Vec<i64> = (0..=n)
            .map(|i| {
                if i == n {
                    b
                } else {
                    (a + w[i as usize] - (drift * i as i128 / n as i128) as i64).max(self.floor)
                }
            })
            .collect();
        let mut out = Vec::with_capacity(n as usize);
        for i in 1..=n as usize {
            let (o, c) = (x[i - 1], x[i]);
            let wick =
                |rng: &mut SmallRng| (-(1.0 - rng.random::<f64>()).ln() * sigma * 0.5) as i64;
            let high = o.max(c) + wick(&mut rng);
            let low = (o.min(c) - wick(&mut rng)).max(1);
            let trades = rng.random_range(150..600u64);
            let k: f64 = 0.5 + -(1.0 - rng.random::<f64>()).ln();
            let steps = ((trades as f64 * self.lot_steps as f64 * k * 0.6).round() as i64).max(1);
            let taker_share: f64 = rng.random_range(0.35..0.65);
            let taker_steps = (steps as f64 * taker_share) as i64;
            let vol = steps as i128 * self.step as i128;
            let taker = taker_steps as i128 * self.step as i128;
            let mid = ((o + c) / 2) as i128 * self.tick as i128;
            let open_time = (s + i as i64 - 1) * MINUTE_MS;
            let p = |t: i64| Price::from_raw(t * self.tick);
            out.push(SimCandle {
                candle: Candle::one_minute(
                    open_time,
                    p(o),
                    p(high),
                    p(low),
                    p(c),
                    Volume(vol),
                    trades,
                ),
                quote_volume: Volume(vol * mid / SCALE as i128),
                taker_buy_base: Volume(taker),
                taker_buy_quote: Volume(taker * mid / SCALE as i128),
                first_trade_id: -1,
                last_trade_id: -1,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIVE: i64 = 1_750_000_000_000 + 12_345; // mid-minute

    #[test]
    fn ends_at_the_start_price_and_joins_without_gaps() {
        for spec in SymbolSpec::catalog() {
            let h = History::new(&spec, 3, LIVE);
            assert_eq!(h.end_minute_ms(), LIVE - LIVE.rem_euclid(MINUTE_MS));
            let days = h.candles(h.end_minute_ms() - 3 * 86_400_000, i64::MAX);
            assert_eq!(days.len(), 3 * 1440);
            let last = days.last().unwrap().candle;
            assert_eq!(last.close, h.start_price(), "{}", spec.symbol);
            assert_eq!(last.open_time, h.end_minute_ms() - MINUTE_MS);
            let r = spec.reference_price.raw();
            assert!(
                (h.start_price().raw() - r).abs() < r / 4,
                "{}: near the reference price",
                spec.symbol
            );
            for w in days.windows(2) {
                assert_eq!(w[1].candle.open_time, w[0].candle.open_time + MINUTE_MS);
                assert_eq!(w[1].candle.open, w[0].candle.close, "{}: minutes join", spec.symbol);
            }
            for c in &days {
                c.candle.check().unwrap();
                assert!(c.candle.low.raw() > 0 && c.candle.volume.raw() > 0 && c.candle.trades > 0);
                assert_eq!(c.candle.low.raw() % spec.tick.raw(), 0);
                assert_eq!(c.candle.volume.raw() % spec.step.raw() as i128, 0);
            }
        }
    }

    #[test]
    fn independent_of_the_start_time() {
        let spec = SymbolSpec::by_name("ADAUSDT").unwrap();
        let early = History::new(&spec, 3, LIVE);
        let late = History::new(&spec, 3, LIVE + 3 * 86_400_000 + 777_777);
        let t = LIVE - 2 * 86_400_000;
        let (a, b) = (early.candles(t, LIVE - MINUTE_MS), late.candles(t, LIVE - MINUTE_MS));
        assert_eq!(a.len(), b.len());
        let diff = a.iter().zip(&b).position(|(x, y)| x != y);
        assert_eq!(
            diff,
            None,
            "the same minutes whatever the start: {:?}",
            diff.map(|i| (a[i], b[i]))
        );
        assert_ne!(early.start_price(), late.start_price());
    }

    #[test]
    fn pure_function_of_seed_symbol_and_minute() {
        let spec = SymbolSpec::by_name("BTCUSDT").unwrap();
        let a = History::new(&spec, 9, LIVE);
        let b = History::new(&spec, 9, LIVE);
        let t = LIVE - 400 * 86_400_000;
        // different access orders, same candles
        let x = a.candles(t, t + 3 * 86_400_000);
        let _ = b.candles(t + 86_400_000, t + 86_400_000);
        let y = b.candles(t, t + 3 * 86_400_000);
        assert_eq!(x, y);
        assert_eq!(x.len(), 3 * 1440, "mid-minute bounds: open times in [t, t + 3d]");
        let c = History::new(&spec, 10, LIVE).candles(t, t + 86_400_000);
        assert_ne!(x[..c.len()], c[..]);
        // before the listing: nothing; the listing minute is the first
        assert!(a.candles(0, spec.listed_ms - 1).is_empty());
        assert_eq!(a.candles(0, spec.listed_ms)[0].candle.open_time, spec.listed_ms);
        // nothing at or after the live start
        assert!(a.candles(a.end_minute_ms(), i64::MAX).is_empty());
        assert!(a.candles(i64::MIN, i64::MIN + 1).is_empty());
    }
}
