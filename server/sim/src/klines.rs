//! Klines of the simulated exchange: candles built from the engine's trades, with the extra
//! columns Binance publishes (quote volume, taker volumes, trade ids).

use std::collections::VecDeque;

use shared::candle::{merge, Candle, Timeframe, MINUTE_MS};
use shared::fixed::SCALE;
use shared::{Price, Volume};

use binance::wire::{RestKline, WsKlineEvent};

use crate::engine::Fill;

/// A kline with every column Binance publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimCandle {
    /// OHLC, base volume, trade count.
    pub candle: Candle,
    /// Σ price × qty (exact: the catalog's tick × step is a multiple of 10^-8).
    pub quote_volume: Volume,
    /// Base volume of buyer-initiated trades.
    pub taker_buy_base: Volume,
    /// Quote volume of buyer-initiated trades.
    pub taker_buy_quote: Volume,
    /// First trade id (−1 when none, and for generated history).
    pub first_trade_id: i64,
    /// Last trade id (−1 when none, and for generated history).
    pub last_trade_id: i64,
}

impl SimCandle {
    /// Binance's candle for a minute without trades: o = h = l = c = `price`, no volume.
    pub fn flat(open_time: i64, price: Price) -> Self {
        SimCandle {
            candle: Candle::one_minute(open_time, price, price, price, price, Volume::ZERO, 0),
            quote_volume: Volume::ZERO,
            taker_buy_base: Volume::ZERO,
            taker_buy_quote: Volume::ZERO,
            first_trade_id: -1,
            last_trade_id: -1,
        }
    }

    /// Folds a trade of this candle's minute in; the first trade sets the open.
    pub fn add_trade(&mut self, t: &Fill) {
        let c = &mut self.candle;
        if c.trades == 0 {
            c.open = t.price;
            c.high = t.price;
            c.low = t.price;
            self.first_trade_id = t.id as i64;
        }
        c.high = c.high.max(t.price);
        c.low = c.low.min(t.price);
        c.close = t.price;
        c.volume = c.volume.add_qty(t.qty);
        c.trades += 1;
        self.last_trade_id = t.id as i64;
        let quote = Volume(t.price.raw() as i128 * t.qty.raw() as i128 / SCALE as i128);
        self.quote_volume = self.quote_volume + quote;
        if !t.buyer_is_maker {
            self.taker_buy_base = self.taker_buy_base.add_qty(t.qty);
            self.taker_buy_quote = self.taker_buy_quote + quote;
        }
    }

    /// Merges candles of one `tf` bucket, oldest first ([`shared::candle::merge`] plus the extra
    /// columns).
    pub fn merge(tf: Timeframe, candles: &[SimCandle]) -> Option<SimCandle> {
        let plain: Vec<Candle> = candles.iter().map(|c| c.candle).collect();
        let candle = merge(tf, &plain)?;
        let sum = |f: fn(&SimCandle) -> Volume| candles.iter().fold(Volume::ZERO, |a, c| a + f(c));
        let ids: Vec<&SimCandle> = candles.iter().filter(|c| c.first_trade_id >= 0).collect();
        Some(SimCandle {
            candle,
            quote_volume: sum(|c| c.quote_volume),
            taker_buy_base: sum(|c| c.taker_buy_base),
            taker_buy_quote: sum(|c| c.taker_buy_quote),
            first_trade_id: ids.first().map_or(-1, |c| c.first_trade_id),
            last_trade_id: ids.last().map_or(-1, |c| c.last_trade_id),
        })
    }

    /// The REST klines row.
    pub fn rest_row(&self, tf: Timeframe) -> RestKline {
        let mut row = RestKline::from_candle(tf, &self.candle);
        row.quote_volume = self.quote_volume;
        row.taker_buy_base_volume = self.taker_buy_base;
        row.taker_buy_quote_volume = self.taker_buy_quote;
        row
    }

    /// The `<symbol>@kline_<tf>` event.
    pub fn ws_event(
        &self,
        symbol: &str,
        tf: Timeframe,
        closed: bool,
        event_time: i64,
    ) -> WsKlineEvent {
        let mut ev = WsKlineEvent::from_candle(symbol, tf, &self.candle, closed, event_time);
        ev.kline.first_trade_id = self.first_trade_id;
        ev.kline.last_trade_id = self.last_trade_id;
        ev.kline.quote_volume = self.quote_volume;
        ev.kline.taker_buy_base_volume = self.taker_buy_base;
        ev.kline.taker_buy_quote_volume = self.taker_buy_quote;
        ev
    }
}

/// Closed live minutes kept per symbol: 32 days, more than the longest bucket (a month of 31
/// days) that is merged from them, so every timeframe's candles stay whole. ~6.6 MB per symbol
/// once full (at speed 60, after ~12 hours); older live minutes are forgotten, so a simulator
/// that runs for weeks stays bounded.
pub const LIVE_KEPT_MINUTES: usize = 32 * 1_440;
const _: () = assert!(LIVE_KEPT_MINUTES > 31 * 1_440, "a month's bucket merges from kept minutes");

/// The live 1m klines of one symbol: the closed minutes since the engine started (the oracle;
/// the last [`LIVE_KEPT_MINUTES`] of them), and the forming one.
#[derive(Debug, Clone)]
pub struct LiveKlines {
    /// Open time of the first live minute.
    first_minute: i64,
    /// Open time of `closed`'s first minute (`first_minute` until minutes are forgotten).
    first_kept: i64,
    /// Closed minutes, contiguous from `first_kept`.
    closed: VecDeque<SimCandle>,
    /// Most closed minutes kept.
    keep: usize,
    forming: SimCandle,
}

impl LiveKlines {
    /// Starts at the minute `first_minute` (aligned), flat at `price` until the first trade.
    pub fn new(first_minute: i64, price: Price) -> Self {
        Self::keeping(first_minute, price, LIVE_KEPT_MINUTES)
    }

    /// [`LiveKlines::new`] keeping at most `keep` closed minutes.
    pub fn keeping(first_minute: i64, price: Price, keep: usize) -> Self {
        LiveKlines {
            first_minute,
            first_kept: first_minute,
            // exactly `keep`, so the ring's buffer never grows past it (pages are touched only
            // as minutes close)
            closed: VecDeque::with_capacity(keep.max(1)),
            keep: keep.max(1),
            forming: SimCandle::flat(first_minute, price),
        }
    }

    /// Open time of the first live minute.
    pub fn first_minute(&self) -> i64 {
        self.first_minute
    }

    /// The forming minute.
    pub fn forming(&self) -> &SimCandle {
        &self.forming
    }

    /// Closes every minute that ends at or before `t_ms` (a minute without trades closes flat
    /// at the previous close), appending them to `out`.
    pub fn close_until(&mut self, t_ms: i64, out: &mut Vec<SimCandle>) {
        while self.forming.candle.open_time + MINUTE_MS <= t_ms {
            let done = self.forming;
            if self.closed.len() == self.keep {
                self.closed.pop_front();
                self.first_kept += MINUTE_MS;
            }
            self.closed.push_back(done);
            out.push(done);
            self.forming = SimCandle::flat(done.candle.open_time + MINUTE_MS, done.candle.close);
        }
    }

    /// Adds a trade; its time must lie in the forming minute (call
    /// [`LiveKlines::close_until`] first).
    pub fn add(&mut self, t: &Fill) {
        debug_assert!(
            t.time_ms >= self.forming.candle.open_time
                && t.time_ms < self.forming.candle.open_time + MINUTE_MS
        );
        self.forming.add_trade(t);
    }

    /// Closed minutes with open time in `[start_ms, end_ms]`, of those still kept.
    pub fn closed_between(
        &self,
        start_ms: i64,
        end_ms: i64,
    ) -> impl ExactSizeIterator<Item = SimCandle> + '_ {
        let idx = |t: i64| {
            let minutes = t.saturating_sub(self.first_kept).div_euclid(MINUTE_MS).max(0) as usize;
            minutes.min(self.closed.len())
        };
        let a = idx(start_ms.saturating_add(MINUTE_MS - 1));
        let b = idx(end_ms.saturating_add(MINUTE_MS)).max(a);
        self.closed.range(a..b).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::Qty;

    fn trade(id: u64, p: i64, q: i64, t: i64, m: bool) -> Fill {
        Fill {
            id,
            price: Price::from_units(p),
            qty: Qty::from_units(q),
            time_ms: t,
            buyer_is_maker: m,
        }
    }

    #[test]
    fn minutes_close_flat_when_empty_and_from_trades_otherwise() {
        let mut k = LiveKlines::new(60_000, Price::from_units(10));
        let mut out = Vec::new();
        k.close_until(60_000 + 59_999, &mut out);
        assert!(out.is_empty());
        k.add(&trade(1, 11, 2, 60_500, false));
        k.add(&trade(2, 9, 1, 61_000, true));
        k.add(&trade(3, 10, 1, 119_999, false));
        k.close_until(240_000, &mut out);
        assert_eq!(out.len(), 3);
        let c = out[0];
        assert_eq!(
            (c.candle.open, c.candle.high, c.candle.low, c.candle.close),
            (
                Price::from_units(11),
                Price::from_units(11),
                Price::from_units(9),
                Price::from_units(10)
            )
        );
        assert_eq!(c.candle.volume, Volume::from_units(4));
        assert_eq!(c.quote_volume, Volume::from_units(22 + 9 + 10));
        assert_eq!(c.taker_buy_base, Volume::from_units(3));
        assert_eq!((c.first_trade_id, c.last_trade_id), (1, 3));
        assert_eq!(out[1], SimCandle::flat(120_000, Price::from_units(10)));
        assert_eq!(out[2].candle.open_time, 180_000);
        assert_eq!(k.forming().candle.open_time, 240_000);
        let between = |a, b| k.closed_between(a, b).collect::<Vec<_>>();
        assert_eq!(k.closed_between(0, i64::MAX).len(), 3);
        assert_eq!(between(120_000, 120_000), &out[1..2]);
        assert_eq!(between(119_999, 180_001), &out[1..3]);
        assert!(between(240_000, 500_000).is_empty());
        let m = SimCandle::merge(Timeframe::M3, &out).unwrap();
        assert_eq!(m.candle.open_time, 0);
        assert_eq!(m.candle.volume, Volume::from_units(4));
        assert_eq!((m.first_trade_id, m.last_trade_id), (1, 3));
    }

    /// A simulator that runs for weeks keeps a bounded number of live minutes: the newest ones.
    #[test]
    fn only_the_newest_live_minutes_are_kept() {
        let mut k = LiveKlines::keeping(0, Price::from_units(10), 3);
        let mut out = Vec::new();
        k.close_until(10 * MINUTE_MS, &mut out);
        assert_eq!(out.len(), 10, "every minute is still published");
        let kept: Vec<i64> = k.closed_between(0, i64::MAX).map(|c| c.candle.open_time).collect();
        assert_eq!(kept, [7, 8, 9].map(|m| m * MINUTE_MS));
        assert_eq!(k.closed_between(0, 6 * MINUTE_MS).len(), 0, "forgotten");
        assert_eq!(k.closed_between(0, 8 * MINUTE_MS).len(), 2);
        assert_eq!(k.first_minute(), 0, "the live start does not move");
    }
}
