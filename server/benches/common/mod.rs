//! What the storage benchmarks share: the candles they write.

use shared::candle::Candle;
use shared::fixed::{Price, Volume};

pub const MIN: i64 = 60_000;

/// Realistic BTC-like values: prices around 6.5e12 raw, volumes of a few coins.
pub fn candle(t: i64, salt: i64) -> Candle {
    let p = 6_500_000_000_000 + (t / MIN * 7919 + salt * 104_729) % 10_000_000_000;
    Candle {
        open_time: t,
        open: Price::from_raw(p),
        high: Price::from_raw(p + 1_500_000_000),
        low: Price::from_raw(p - 1_200_000_000),
        close: Price::from_raw(p + 300_000_000),
        volume: Volume::from_raw(1_234_567_890 + (t / MIN % 1000) as i128 * 1_000_003),
        trades: 1500 + (t / MIN % 300) as u64,
        minutes: 1,
    }
}
