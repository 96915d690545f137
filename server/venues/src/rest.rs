//! The venues' public REST answers millrace reads: each venue's instrument list (and where it is),
//! read exactly, bounded, with the venue's own refusal recognised.
//!
//! | venue | instruments | fields read |
//! | --- | --- | --- |
//! | OKX | `/api/v5/public/instruments?instType=SPOT` | `instId`, `baseCcy`, `quoteCcy`, `tickSz`, `lotSz`, `state` |
//! | Bybit | `/v5/market/instruments-info?category=spot` | `symbol`, `baseCoin`, `quoteCoin`, `priceFilter.tickSize`, `lotSizeFilter.basePrecision`, `status` |
//! | Coinbase | `/api/v3/brokerage/market/products` | `product_id`, `base_currency_id`, `quote_currency_id`, `price_increment`, `base_increment`, `status` |
//! | Kraken | `/0/public/AssetPairs` | `wsname`, `base`, `quote`, `pair_decimals`, `lot_decimals`, `tick_size`, `status` |

use serde_json::Value;
use shared::protocol::Market;
use shared::venue::Dialect;
use shared::{Price, Qty};

use crate::{clip, WireError};

/// Instruments one answer may list.
pub const MAX_INSTRUMENTS: usize = 20_000;

/// One instrument of a venue's list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instrument {
    /// The venue's name (`BTC-USDT`, `BTCUSDT`, `BTC/USD`).
    pub symbol: String,
    pub base: String,
    pub quote: String,
    pub tick: Option<Price>,
    pub lot: Option<Qty>,
    /// Places of prices and quantities, where the venue says (Kraken), else those of the tick
    /// and lot.
    pub price_decimals: Option<u8>,
    pub qty_decimals: Option<u8>,
    /// The venue's trading status (`live`, `Trading`, `online`).
    pub status: String,
}

/// Bybit's category of `market`: `spot`, or `linear` (USDT perpetuals, millrace's `futures`).
/// The other venues are read for spot only.
pub fn bybit_category(market: Market) -> &'static str {
    match market {
        Market::Futures => "linear",
        _ => "spot",
    }
}

/// Where the instrument list of `market` is, under the venue's REST base (Bybit's linear list
/// comes in pages of up to 1,000: [`next_page_cursor`]).
pub fn instruments_path(dialect: Dialect, market: Market) -> &'static str {
    match dialect {
        Dialect::Okx => "/api/v5/public/instruments?instType=SPOT",
        Dialect::Bybit if market == Market::Futures => {
            "/v5/market/instruments-info?category=linear&limit=1000"
        }
        Dialect::Bybit => "/v5/market/instruments-info?category=spot",
        Dialect::Coinbase => "/api/v3/brokerage/market/products",
        Dialect::Kraken => "/0/public/AssetPairs",
        Dialect::Binance => "/api/v3/exchangeInfo",
    }
}

/// Where the venue's clock is, under its REST base (OKX `/api/v5/public/time`, Bybit
/// `/v5/market/time`, Coinbase `/api/v3/brokerage/time`, Kraken `/0/public/Time`).
pub fn time_path(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Okx => "/api/v5/public/time",
        Dialect::Bybit => "/v5/market/time",
        Dialect::Coinbase => "/api/v3/brokerage/time",
        Dialect::Kraken => "/0/public/Time",
        Dialect::Binance => "/api/v3/time",
    }
}

/// The venue's time (Unix ms) from its clock's answer: OKX `data[0].ts` (ms), Bybit
/// `result.timeNano` (ns), Coinbase `epochMillis`, Kraken `result.unixtime` (seconds: its
/// clock is read to the second). A refusal in the venue's own form is an error quoting it.
pub fn parse_server_time(dialect: Dialect, body: &str) -> Result<i64, WireError> {
    let v = answer(dialect, body)?;
    let int = |v: &Value| match v {
        Value::String(s) => s.parse::<i64>().ok(),
        other => other.as_i64(),
    };
    let ms = match dialect {
        Dialect::Okx => int(&v["data"][0]["ts"]),
        Dialect::Bybit => int(&v["result"]["timeNano"]).map(|ns| ns / 1_000_000),
        Dialect::Coinbase => int(&v["epochMillis"]),
        Dialect::Kraken => int(&v["result"]["unixtime"]).and_then(|s| s.checked_mul(1000)),
        Dialect::Binance => int(&v["serverTime"]),
    };
    // a time before 2001 or after 2286 is not a clock's
    ms.filter(|ms| (1_000_000_000_000..10_000_000_000_000).contains(ms))
        .ok_or_else(|| invalid(dialect, "no time in the clock's answer"))
}

/// A venue's REST answer as JSON, or its refusal in the venue's own form (OKX `code`, Bybit
/// `retCode`, Coinbase `error`, Kraken `error`) as an error quoting it.
fn answer(dialect: Dialect, body: &str) -> Result<Value, WireError> {
    let v: Value = serde_json::from_str(body)
        .map_err(|e| WireError::Json { dialect, detail: e.to_string() })?;
    let s = |v: &Value| match v {
        Value::String(s) => clip(s).to_string(),
        other => clip(&other.to_string()).to_string(),
    };
    let refusal = match dialect {
        Dialect::Okx => v["code"]
            .as_str()
            .filter(|c| *c != "0")
            .map(|_| format!("{} {}", s(&v["code"]), s(&v["msg"]))),
        Dialect::Bybit => v["retCode"]
            .as_i64()
            .filter(|c| *c != 0)
            .map(|_| format!("{} {}", v["retCode"], s(&v["retMsg"]))),
        Dialect::Coinbase => {
            v["error"].as_str().map(|_| format!("{} {}", s(&v["error"]), s(&v["message"])))
        }
        Dialect::Kraken => v["error"].as_array().and_then(|e| e.first()).map(s),
        Dialect::Binance => None,
    };
    match refusal {
        Some(r) => Err(invalid(dialect, format!("refused: {r}"))),
        None => Ok(v),
    }
}

/// The list the answer holds (at most `max` entries).
fn listed<'a>(
    dialect: Dialect,
    list: Option<&'a Vec<Value>>,
    what: &'static str,
    max: usize,
) -> Result<&'a [Value], WireError> {
    let list = list.ok_or_else(|| invalid(dialect, format!("no {what} list in the answer")))?;
    crate::bounded(dialect, what, list.len(), max)?;
    Ok(list)
}

fn invalid(dialect: Dialect, detail: impl Into<String>) -> WireError {
    WireError::Invalid { dialect, detail: detail.into() }
}

/// Places of a tick or lot (`0.01` → 2).
fn places(v: i64) -> u8 {
    let mut d = 8u8;
    let mut r = v;
    while d > 0 && r % 10 == 0 {
        r /= 10;
        d -= 1;
    }
    d
}

/// The cursor of the next page of an instrument list (Bybit's `result.nextPageCursor`), if the
/// answer says there is one. At most 512 characters are taken.
pub fn next_page_cursor(dialect: Dialect, body: &str) -> Option<String> {
    if dialect != Dialect::Bybit {
        return None;
    }
    let v: Value = serde_json::from_str(body).ok()?;
    let c = v["result"]["nextPageCursor"].as_str()?;
    (!c.is_empty() && c.len() <= 512).then(|| c.to_string())
}

/// Reads a venue's instrument list. A refusal in the venue's own form (OKX `code`, Bybit
/// `retCode`, Kraken `error`, Coinbase `error`) is an error quoting it. Instruments whose tick or
/// lot millrace cannot hold (more than 8 places) are listed without them. Bybit's linear list
/// gives its perpetuals (`contractType` `LinearPerpetual`, lot `qtyStep`); its dated futures
/// are left out (their `BASE/QUOTE` would name the perpetual).
pub fn parse_instruments(dialect: Dialect, body: &str) -> Result<Vec<Instrument>, WireError> {
    let v = answer(dialect, body)?;
    let s = |v: &Value| v.as_str().map(str::to_string).unwrap_or_default();
    let tick = |v: &Value| v.as_str().and_then(|t| Price::parse(t).ok()).filter(|p| p.raw() > 0);
    let lot = |v: &Value| v.as_str().and_then(|t| Qty::parse(t).ok()).filter(|q| q.raw() > 0);
    let list = |v| listed(dialect, v, "instruments", MAX_INSTRUMENTS);
    let mut out = Vec::new();
    match dialect {
        Dialect::Okx => {
            for i in list(v["data"].as_array())? {
                out.push(Instrument {
                    symbol: s(&i["instId"]),
                    base: s(&i["baseCcy"]),
                    quote: s(&i["quoteCcy"]),
                    tick: tick(&i["tickSz"]),
                    lot: lot(&i["lotSz"]),
                    price_decimals: None,
                    qty_decimals: None,
                    status: s(&i["state"]),
                });
            }
        }
        Dialect::Bybit => {
            for i in list(v["result"]["list"].as_array())? {
                let contract = &i["contractType"];
                if !contract.is_null() && contract != "LinearPerpetual" {
                    continue;
                }
                let step = &i["lotSizeFilter"]["qtyStep"];
                let step = if step.is_null() { &i["lotSizeFilter"]["basePrecision"] } else { step };
                out.push(Instrument {
                    symbol: s(&i["symbol"]),
                    base: s(&i["baseCoin"]),
                    quote: s(&i["quoteCoin"]),
                    tick: tick(&i["priceFilter"]["tickSize"]),
                    lot: lot(step),
                    price_decimals: None,
                    qty_decimals: None,
                    status: s(&i["status"]),
                });
            }
        }
        Dialect::Coinbase => {
            for i in list(v["products"].as_array())? {
                out.push(Instrument {
                    symbol: s(&i["product_id"]),
                    base: s(&i["base_currency_id"]),
                    quote: s(&i["quote_currency_id"]),
                    tick: tick(&i["price_increment"]),
                    lot: lot(&i["base_increment"]),
                    price_decimals: None,
                    qty_decimals: None,
                    status: s(&i["status"]),
                });
            }
        }
        Dialect::Kraken => {
            let pairs = v["result"]
                .as_object()
                .ok_or_else(|| invalid(dialect, "no result in the answer"))?;
            crate::bounded(dialect, "instruments", pairs.len(), MAX_INSTRUMENTS)?;
            for (_, i) in pairs {
                let wsname = s(&i["wsname"]);
                let (base, quote) = wsname.split_once('/').unwrap_or_default();
                let dec =
                    |v: &Value| v.as_u64().and_then(|d| u8::try_from(d).ok()).filter(|&d| d <= 8);
                out.push(Instrument {
                    symbol: wsname.clone(),
                    base: base.to_string(),
                    quote: quote.to_string(),
                    tick: tick(&i["tick_size"]),
                    lot: None,
                    price_decimals: dec(&i["pair_decimals"]),
                    qty_decimals: dec(&i["lot_decimals"]),
                    status: s(&i["status"]),
                });
            }
        }
        Dialect::Binance => return Err(WireError::Unsupported(dialect)),
    }
    out.retain(|i| !i.symbol.is_empty() && !i.base.is_empty() && !i.quote.is_empty());
    for i in &mut out {
        i.price_decimals = i.price_decimals.or(i.tick.map(|t| places(t.raw())));
        i.qty_decimals = i.qty_decimals.or(i.lot.map(|l| places(l.raw())));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_times_of_the_documented_answers() {
        // the venues' documented examples
        let okx = r#"{"code":"0","msg":"","data":[{"ts":"1597026383085"}]}"#;
        assert_eq!(parse_server_time(Dialect::Okx, okx).unwrap(), 1_597_026_383_085);
        let bybit = r#"{"retCode":0,"retMsg":"OK","result":{"timeSecond":"1688639403","timeNano":"1688639403423213947"},"retExtInfo":{},"time":1688639403423}"#;
        assert_eq!(parse_server_time(Dialect::Bybit, bybit).unwrap(), 1_688_639_403_423);
        let coinbase = r#"{"iso":"2023-07-06T18:50:48Z","epochSeconds":"1688669448","epochMillis":"1688669448123"}"#;
        assert_eq!(parse_server_time(Dialect::Coinbase, coinbase).unwrap(), 1_688_669_448_123);
        let kraken = r#"{"error":[],"result":{"unixtime":1688669448,"rfc1123":"Thu, 06 Jul 23 18:50:48 +0000"}}"#;
        assert_eq!(parse_server_time(Dialect::Kraken, kraken).unwrap(), 1_688_669_448_000);
        // refusals and nonsense are errors
        let refused = r#"{"code":"50011","msg":"Too Many Requests","data":[]}"#;
        assert!(parse_server_time(Dialect::Okx, refused)
            .unwrap_err()
            .to_string()
            .contains("50011"));
        assert!(parse_server_time(Dialect::Kraken, r#"{"error":["EGeneral:Too many requests"]}"#)
            .is_err());
        assert!(parse_server_time(Dialect::Coinbase, r#"{"epochMillis":"12"}"#).is_err());
        assert!(parse_server_time(Dialect::Bybit, r#"{"retCode":0,"result":{"timeNano":"x"}}"#)
            .is_err());
        assert!(parse_server_time(
            Dialect::Kraken,
            r#"{"error":[],"result":{"unixtime":9223372036854775807}}"#
        )
        .is_err());
    }

    #[test]
    fn each_venue_lists_its_instruments() {
        let okx = r#"{"code":"0","msg":"","data":[{"instId":"BTC-USDT","instType":"SPOT","baseCcy":"BTC","quoteCcy":"USDT","tickSz":"0.1","lotSz":"0.00000001","state":"live"}]}"#;
        let i = &parse_instruments(Dialect::Okx, okx).unwrap()[0];
        assert_eq!(
            (i.symbol.as_str(), i.base.as_str(), i.price_decimals, i.qty_decimals),
            ("BTC-USDT", "BTC", Some(1), Some(8))
        );
        let bybit = r#"{"retCode":0,"retMsg":"OK","result":{"category":"spot","list":[{"symbol":"BTCUSDT","baseCoin":"BTC","quoteCoin":"USDT","status":"Trading","lotSizeFilter":{"basePrecision":"0.000001"},"priceFilter":{"tickSize":"0.01"}}]}}"#;
        assert_eq!(parse_instruments(Dialect::Bybit, bybit).unwrap()[0].qty_decimals, Some(6));
        let cb = r#"{"products":[{"product_id":"BTC-USD","base_currency_id":"BTC","quote_currency_id":"USD","base_increment":"0.00000001","price_increment":"0.01","status":"online"}]}"#;
        assert_eq!(
            parse_instruments(Dialect::Coinbase, cb).unwrap()[0].tick,
            Price::parse("0.01").ok()
        );
        let kraken = r#"{"error":[],"result":{"XXBTZUSD":{"altname":"XBTUSD","wsname":"XBT/USD","base":"XXBT","quote":"ZUSD","pair_decimals":1,"lot_decimals":8,"tick_size":"0.1","status":"online"}}}"#;
        let k = &parse_instruments(Dialect::Kraken, kraken).unwrap()[0];
        assert_eq!(
            (k.symbol.as_str(), k.base.as_str(), k.quote.as_str(), k.price_decimals),
            ("XBT/USD", "XBT", "USD", Some(1))
        );
    }

    #[test]
    fn refusals_are_errors_quoting_the_venue() {
        for (d, body, says) in [
            (Dialect::Okx, r#"{"code":"50011","msg":"Too Many Requests","data":[]}"#, "50011"),
            (
                Dialect::Bybit,
                r#"{"retCode":10006,"retMsg":"Too many visits!","result":{}}"#,
                "10006",
            ),
            (Dialect::Kraken, r#"{"error":["EGeneral:Too many requests"]}"#, "Too many"),
            (
                Dialect::Coinbase,
                r#"{"error":"RATE_LIMIT_EXCEEDED","message":"Too many requests"}"#,
                "RATE_LIMIT",
            ),
            (Dialect::Okx, "<html>", "JSON"),
        ] {
            let e = parse_instruments(d, body).unwrap_err().to_string();
            assert!(e.contains(says), "{d}: {e}");
        }
    }
}

/// One row of a venue's REST candles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CandleRow {
    pub candle: shared::candle::Candle,
    /// Whether the venue says the candle is closed (OKX's `confirm`); `None` when it does not
    /// say (the newest row may be the forming one).
    pub closed: Option<bool>,
}

/// The most levels a side of a REST book answer may hold.
pub const MAX_BOOK_LEVELS: usize = 5_000;

/// A venue's REST book and where in its stream it stands: `key` is Bybit's cross sequence
/// `seq` (the same as its book messages'), OKX's `ts` and Coinbase's `time` (ms; the same as
/// its book messages' times when both are of the same moment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestBook {
    pub key: u64,
    /// Best first.
    pub bids: Vec<shared::Level>,
    pub asks: Vec<shared::Level>,
}

/// The path and query of `symbol`'s REST book, its best `levels` a side, for a venue whose REST
/// book says where in the stream it stands (OKX, Bybit, Coinbase); `None` for Kraken, whose
/// `Depth` carries no book time or id (its checksum verifies every update instead).
pub fn book_path(dialect: Dialect, market: Market, symbol: &str, levels: usize) -> Option<String> {
    match dialect {
        Dialect::Okx => Some(format!("/api/v5/market/books?instId={symbol}&sz={levels}")),
        Dialect::Bybit => Some(format!(
            "/v5/market/orderbook?category={}&symbol={symbol}&limit={levels}",
            bybit_category(market)
        )),
        Dialect::Coinbase => Some(format!(
            "/api/v3/brokerage/market/product_book?product_id={symbol}&limit={levels}"
        )),
        Dialect::Kraken | Dialect::Binance => None,
    }
}

/// Reads a REST book answer of [`book_path`]. A refusal in the venue's own form is an error
/// quoting it.
pub fn parse_book(dialect: Dialect, body: &str) -> Result<RestBook, WireError> {
    let v = answer(dialect, body)?;
    fn number<T, E: std::fmt::Display>(
        dialect: Dialect,
        v: &Value,
        what: &'static str,
        parse: fn(&str) -> Result<T, E>,
    ) -> Result<T, WireError> {
        let t = v.as_str().ok_or_else(|| invalid(dialect, format!("{what} is not a string")))?;
        parse(t).map_err(|e| WireError::Number {
            dialect,
            field: what,
            value: clip(t).to_string(),
            detail: e.to_string(),
        })
    }
    let price = |v: &Value, what| number(dialect, v, what, shared::Price::parse);
    let qty = |v: &Value, what| number(dialect, v, what, shared::Qty::parse);
    // rows of [price, size, …] (OKX, Bybit) or {"price","size"} objects (Coinbase)
    let side = |rows: &Value, what: &'static str| -> Result<Vec<shared::Level>, WireError> {
        let rows = listed(dialect, rows.as_array(), what, MAX_BOOK_LEVELS)?;
        rows.iter()
            .map(|r| {
                let (p, q) = match r {
                    Value::Array(a) => {
                        (a.first().unwrap_or(&Value::Null), a.get(1).unwrap_or(&Value::Null))
                    }
                    _ => (&r["price"], &r["size"]),
                };
                Ok(shared::Level::new(price(p, "price")?, qty(q, "size")?))
            })
            .collect()
    };
    let int = |v: &Value| match v {
        Value::String(s) => s.parse::<u64>().ok(),
        other => other.as_u64(),
    };
    let (key, bids, asks) = match dialect {
        Dialect::Okx => {
            let b = &v["data"][0];
            (int(&b["ts"]), side(&b["bids"], "bids")?, side(&b["asks"], "asks")?)
        }
        Dialect::Bybit => {
            let r = &v["result"];
            (int(&r["seq"]), side(&r["b"], "b")?, side(&r["a"], "a")?)
        }
        Dialect::Coinbase => {
            let b = &v["pricebook"];
            let time = b["time"].as_str().and_then(crate::parse_rfc3339_ms);
            let key = time.and_then(|t| u64::try_from(t).ok());
            (key, side(&b["bids"], "bids")?, side(&b["asks"], "asks")?)
        }
        Dialect::Kraken | Dialect::Binance => return Err(WireError::Unsupported(dialect)),
    };
    let key =
        key.ok_or_else(|| invalid(dialect, "the book says not where in the stream it stands"))?;
    Ok(RestBook { key, bids, asks })
}

/// Rows one candle answer may hold.
pub const MAX_CANDLES: usize = 2_000;

/// The most 1m candles a venue answers at once (OKX `history-candles` 100, Bybit 1,000,
/// Coinbase 350, Kraken its newest 720).
pub fn candles_page_size(dialect: Dialect) -> u16 {
    match dialect {
        Dialect::Okx => 100,
        Dialect::Bybit => 1_000,
        Dialect::Coinbase => 350,
        Dialect::Kraken => 720,
        Dialect::Binance => 1_000,
    }
}

/// The path and query of a page of `symbol`'s 1m candles (of `market`: Bybit's category) whose
/// open time is at least `from_ms` and below `below_ms` (when given): the newest such page,
/// newest first, except Kraken's, which is its newest 720 from `since` on.
pub fn candles_page(
    dialect: Dialect,
    market: Market,
    symbol: &str,
    from_ms: i64,
    below_ms: Option<i64>,
) -> String {
    let enc = |s: &str| s.replace('/', "%2F");
    match dialect {
        Dialect::Okx => {
            let mut q = format!(
                "/api/v5/market/history-candles?instId={}&bar=1m&limit=100&before={}",
                enc(symbol),
                from_ms - 1
            );
            if let Some(b) = below_ms {
                q.push_str(&format!("&after={b}"));
            }
            q
        }
        Dialect::Bybit => format!(
            "/v5/market/kline?category={}&symbol={symbol}&interval=1&limit=1000&start={from_ms}&end={}",
            bybit_category(market),
            below_ms.map_or(i64::MAX / 2, |b| b - 1)
        ),
        Dialect::Coinbase => format!(
            "/api/v3/brokerage/market/products/{symbol}/candles?granularity=ONE_MINUTE&limit=350&start={}&end={}",
            from_ms.div_euclid(1000),
            below_ms.map_or(i64::MAX / 2000, |b| (b - 1).div_euclid(1000))
        ),
        Dialect::Kraken => format!("/0/public/OHLC?pair={}&interval=1&since={}", enc(symbol), from_ms.div_euclid(1000) - 1),
        Dialect::Binance => String::new(),
    }
}

/// Reads a page of a venue's REST 1m candles (any order; the caller sorts). A refusal in the
/// venue's own form is an error quoting it.
pub fn parse_candles(dialect: Dialect, body: &str) -> Result<Vec<CandleRow>, WireError> {
    let v = answer(dialect, body)?;
    let s = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let row =
        |open_time: i64, ohlc: [String; 4], volume: String, trades: u64, closed: Option<bool>| {
            let [o, h, l, c] = &ohlc;
            crate::candle(dialect, open_time, 1, [o, h, l, c], &volume, trades)
                .map(|candle| CandleRow { candle, closed })
        };
    let int = |v: &Value| -> Result<i64, WireError> {
        match v {
            Value::Number(n) => n.as_i64(),
            Value::String(t) => t.parse().ok(),
            _ => None,
        }
        .ok_or_else(|| invalid(dialect, format!("candle time {:?}", clip(&v.to_string()))))
    };
    let rows = |v| listed(dialect, v, "candles", MAX_CANDLES);
    let mut out = Vec::new();
    match dialect {
        Dialect::Okx => {
            for r in rows(v["data"].as_array())? {
                let closed = match r[8].as_str() {
                    Some("1") => Some(true),
                    Some("0") => Some(false),
                    _ => None,
                };
                out.push(row(
                    int(&r[0])?,
                    [s(&r[1]), s(&r[2]), s(&r[3]), s(&r[4])],
                    s(&r[5]),
                    0,
                    closed,
                )?);
            }
        }
        Dialect::Bybit => {
            for r in rows(v["result"]["list"].as_array())? {
                out.push(row(
                    int(&r[0])?,
                    [s(&r[1]), s(&r[2]), s(&r[3]), s(&r[4])],
                    s(&r[5]),
                    0,
                    None,
                )?);
            }
        }
        Dialect::Coinbase => {
            for r in rows(v["candles"].as_array())? {
                let t = int(&r["start"])?
                    .checked_mul(1000)
                    .ok_or_else(|| invalid(dialect, "candle start out of range"))?;
                out.push(row(
                    t,
                    [s(&r["open"]), s(&r["high"]), s(&r["low"]), s(&r["close"])],
                    s(&r["volume"]),
                    0,
                    None,
                )?);
            }
        }
        Dialect::Kraken => {
            let result = v["result"]
                .as_object()
                .ok_or_else(|| invalid(dialect, "no result in the answer"))?;
            for (k, list) in result {
                if k == "last" {
                    continue;
                }
                for r in rows(list.as_array())? {
                    let t = int(&r[0])?
                        .checked_mul(1000)
                        .ok_or_else(|| invalid(dialect, "candle time out of range"))?;
                    let trades = r[7].as_u64().unwrap_or(0);
                    out.push(row(
                        t,
                        [s(&r[1]), s(&r[2]), s(&r[3]), s(&r[4])],
                        s(&r[6]),
                        trades,
                        None,
                    )?);
                }
            }
        }
        Dialect::Binance => return Err(WireError::Unsupported(dialect)),
    }
    Ok(out)
}

#[cfg(test)]
mod candle_tests {
    use super::*;

    #[test]
    fn each_venue_pages_its_candles() {
        let okx = r#"{"code":"0","msg":"","data":[["1597026383085","8533.02","8553.74","8527.17","8548.26","45247","529.5858061","529.5858061","1"]]}"#;
        let r = &parse_candles(Dialect::Okx, okx).unwrap()[0];
        assert_eq!((r.candle.open_time, r.closed), (1_597_026_383_085, Some(true)));
        let bybit = r#"{"retCode":0,"retMsg":"OK","result":{"list":[["1670608800000","17071","17073","17027","17055.5","268611","4582247.5"]]}}"#;
        assert_eq!(
            parse_candles(Dialect::Bybit, bybit).unwrap()[0].candle.open_time,
            1_670_608_800_000
        );
        let cb = r#"{"candles":[{"start":"1639508050","low":"140.21","high":"140.21","open":"140.21","close":"140.21","volume":"56437345"}]}"#;
        assert_eq!(
            parse_candles(Dialect::Coinbase, cb).unwrap()[0].candle.open_time,
            1_639_508_050_000
        );
        let kraken = r#"{"error":[],"result":{"XBT/USD":[[1688671200,"30306.1","30306.2","30305.7","30305.7","30306.1","3.39243896",23]],"last":1688672160}}"#;
        let k = &parse_candles(Dialect::Kraken, kraken).unwrap()[0];
        assert_eq!((k.candle.open_time, k.candle.trades), (1_688_671_200_000, 23));
        assert!(parse_candles(
            Dialect::Okx,
            r#"{"code":"50011","msg":"Too Many Requests","data":[]}"#
        )
        .is_err());
        assert!(parse_candles(
            Dialect::Bybit,
            r#"{"retCode":0,"result":{"list":[["1","2","1","3","2","1","1"]]}}"#
        )
        .unwrap_err()
        .to_string()
        .contains("candle"));
        assert!(candles_page(Dialect::Okx, Market::Spot, "BTC-USDT", 60_000, Some(600_000))
            .contains("before=59999&after=600000"));
        let linear = candles_page(Dialect::Bybit, Market::Futures, "BTCUSDT", 60_000, None);
        assert!(linear.starts_with("/v5/market/kline?category=linear&symbol=BTCUSDT"), "{linear}");
    }

    /// The venues' REST books (the documented shapes) and where they stand in the stream.
    #[test]
    fn rest_books_say_where_in_the_stream_they_stand() {
        let bybit = r#"{"retCode":0,"retMsg":"OK","result":{"s":"BTCUSDT","b":[["62710.2","5.52"]],"a":[["62710.3","0.01"]],"ts":1709199771584,"u":243781,"seq":3887177875},"retExtInfo":{},"time":1709199771643}"#;
        let b = parse_book(Dialect::Bybit, bybit).unwrap();
        assert_eq!(b.key, 3_887_177_875);
        assert_eq!(
            b.bids,
            [shared::Level::new(Price::parse("62710.2").unwrap(), Qty::parse("5.52").unwrap())]
        );
        let okx = r#"{"code":"0","msg":"","data":[{"asks":[["41006.8","0.60038921","0","1"]],"bids":[["41006.3","0.30178218","0","2"]],"ts":"1629966436396"}]}"#;
        let o = parse_book(Dialect::Okx, okx).unwrap();
        assert_eq!((o.key, o.asks.len(), o.bids.len()), (1_629_966_436_396, 1, 1));
        let coinbase = r#"{"pricebook":{"product_id":"BTC-USD","bids":[{"price":"27000.01","size":"0.5"}],"asks":[{"price":"27000.02","size":"1"}],"time":"2023-09-07T13:58:51.312Z"}}"#;
        let c = parse_book(Dialect::Coinbase, coinbase).unwrap();
        assert_eq!(c.key, 1_694_095_131_312);
        assert_eq!(c.asks[0].price, Price::parse("27000.02").unwrap());
        // no place in the stream, a bad number, a refusal, Kraken
        assert!(parse_book(Dialect::Bybit, &bybit.replace(",\"seq\":3887177875", "")).is_err());
        assert!(parse_book(Dialect::Okx, &okx.replace("41006.8", "4x"))
            .unwrap_err()
            .to_string()
            .contains("4x"));
        assert!(parse_book(
            Dialect::Okx,
            r#"{"code":"51001","msg":"Instrument ID does not exist","data":[]}"#
        )
        .is_err());
        assert!(book_path(Dialect::Kraken, Market::Spot, "BTC/USD", 20).is_none());
        assert_eq!(
            book_path(Dialect::Bybit, Market::Futures, "BTCUSDT", 20).unwrap(),
            "/v5/market/orderbook?category=linear&symbol=BTCUSDT&limit=20"
        );
    }

    /// Bybit's linear list (the documented shape: `contractType`, `lotSizeFilter.qtyStep`,
    /// paged by `nextPageCursor`): perpetuals listed, dated futures left out, the lot its
    /// `qtyStep`.
    #[test]
    fn bybit_linear_instruments_are_its_perpetuals_paged_by_cursor() {
        assert_eq!(
            instruments_path(Dialect::Bybit, Market::Futures),
            "/v5/market/instruments-info?category=linear&limit=1000"
        );
        assert_eq!(
            instruments_path(Dialect::Bybit, Market::Spot),
            "/v5/market/instruments-info?category=spot"
        );
        let page = r#"{"retCode":0,"retMsg":"OK","result":{"category":"linear","list":[
            {"symbol":"BTCUSDT","contractType":"LinearPerpetual","status":"Trading","baseCoin":"BTC","quoteCoin":"USDT","priceFilter":{"minPrice":"0.10","maxPrice":"1999999.80","tickSize":"0.10"},"lotSizeFilter":{"maxOrderQty":"1190.000","minOrderQty":"0.001","qtyStep":"0.001"}},
            {"symbol":"BTCUSDT-27DEC24","contractType":"LinearFutures","status":"Trading","baseCoin":"BTC","quoteCoin":"USDT","priceFilter":{"tickSize":"0.50"},"lotSizeFilter":{"qtyStep":"0.001"}}
        ],"nextPageCursor":"first%3DBTCUSDT%26last%3DBTCUSDT-27DEC24"},"retExtInfo":{},"time":1672712537130}"#;
        let list = parse_instruments(Dialect::Bybit, page).unwrap();
        assert_eq!(list.len(), 1, "{list:?}");
        assert_eq!(list[0].symbol, "BTCUSDT");
        assert_eq!(list[0].tick, Some(Price::parse("0.1").unwrap()));
        assert_eq!(list[0].lot, Some(Qty::parse("0.001").unwrap()));
        assert_eq!(
            next_page_cursor(Dialect::Bybit, page).as_deref(),
            Some("first%3DBTCUSDT%26last%3DBTCUSDT-27DEC24")
        );
        let last = page.replace("first%3DBTCUSDT%26last%3DBTCUSDT-27DEC24", "");
        assert_eq!(next_page_cursor(Dialect::Bybit, &last), None);
        assert_eq!(next_page_cursor(Dialect::Okx, page), None);
    }
}
