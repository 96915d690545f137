//! Binance's wire formats: serde types for the stream events, stream control messages and REST
//! bodies, their exact conversion to and from millrace's `shared` types, and the names (symbols,
//! stream names) that tie them to millrace instruments.
//!
//! ## The contract
//! - **JSON field names are exactly Binance's** (`"E"`, `"U"`, `"pu"`, `"lastUpdateId"`, ...); the
//!   Rust fields have descriptive names and `#[serde(rename)]`. Every type is both `Serialize`
//!   and `Deserialize`: the client parses what Binance sends, and millrace's simulated exchange
//!   writes its output with the same types, so both sides share one definition.
//! - **Prices and quantities are parsed exactly** into `shared::fixed` (`Price`, `Qty`,
//!   `Volume`), from Binance's decimal strings, never through a float. More than 8 significant
//!   decimals, exponents or junk are errors. Volumes (sums) are parsed into `i128` units and may
//!   exceed the `i64` range of a single quantity. Serialising writes the shortest exact decimal
//!   (`"7195.24"` rather than Binance's `"7195.24000000"`): the same value, and what every
//!   Binance client (including this one) reads.
//! - **Unknown extra fields are ignored**, so Binance adding a field never breaks parsing. Fields
//!   that differ between spot and USD-M futures (`pu`, `T`, `E` in REST depth) are `Option`s.
//! - **Bad input is a [`WireError`]**, never a panic. The error names what is wrong: the JSON
//!   field whose value was rejected (`field "p": invalid character 'x' in number`), the missing
//!   field, the column of a syntax error, or the inconsistency (`U` > `u`, high below low).
//!
//! ## Streams
//! A connection to `/stream?streams=a/b/c` (a *combined* stream) wraps every event in
//! `{"stream":"btcusdt@kline_1m","data":{...}}`; a connection to `/ws/<name>` sends the bare
//! event (*raw* form). Replies to `SUBSCRIBE` requests (`{"result":null,"id":1}`) are never
//! wrapped. [`parse_frame`] accepts all of them and returns a [`StreamEvent`] carrying the
//! stream name when there was one:
//!
//! | payload                                          | event                         |
//! |--------------------------------------------------|-------------------------------|
//! | `"e":"kline"`                                    | [`StreamEvent::Kline`]        |
//! | `"e":"depthUpdate"` on `<sym>@depth[@100ms]`     | [`StreamEvent::DepthUpdate`]  |
//! | `"e":"depthUpdate"` on `<sym>@depth20[@100ms]` (futures partial book) | [`StreamEvent::PartialDepth`] |
//! | `{"lastUpdateId":..,"bids":..,"asks":..}` (spot partial book) | [`StreamEvent::PartialDepth`] |
//! | `"e":"trade"` / `"e":"aggTrade"`                 | [`StreamEvent::Trade`] / [`StreamEvent::AggTrade`] |
//! | `"e":"bookTicker"`, or `u`/`b`/`B`/`a`/`A` without `e` (spot) | [`StreamEvent::BookTicker`] |
//! | `{"result":..,"id":..}` / `{"error":{..},"id":..}` | [`StreamEvent::Reply`]      |
//! | any other `"e"`, or an array (`!miniTicker@arr`) | [`StreamEvent::Other`]        |
//!
//! A futures partial book in raw form cannot be told from a diff (same payload); subscribe to
//! partial books through combined streams.
//!
//! ## REST
//! [`RestKline`] (the 12-element kline row), [`DepthBody`] (`/depth`, also the spot partial book
//! payload), [`ExchangeInfo`], [`ServerTime`] and [`BinanceError`] (`{"code":-1121,"msg":"..."}`).
//! [`parse_body`] decodes any of them with the same field-naming errors as [`parse_frame`].
//!
//! ## Names
//! Instrument `binance:spot:BTC/USDT` ↔ symbol `BTCUSDT` ([`symbol_of`],
//! [`SymbolInfo::instrument`],
//! [`split_symbol`]) ↔ stream `btcusdt@kline_1m` ([`StreamName`]).

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use serde::de::{self, DeserializeOwned, IgnoredAny, SeqAccess, Visitor};
use serde::ser::SerializeSeq;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use shared::book::Level;
use shared::candle::{Candle, Timeframe, MINUTE_MS};
use shared::fixed::{ParseDecimalError, Price, Qty, Volume, DECIMALS, SCALE};
use shared::protocol::{InstrumentId, Market};
use shared::sync::{DepthDelta, DepthSnapshot};

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

/// Why a frame or body could not be decoded. Every variant says what was wrong; none is fatal
/// to a connection (the caller counts it and goes on).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Not JSON, or truncated JSON.
    #[error("invalid JSON at line {line} column {column}: {msg}")]
    Syntax { msg: String, line: usize, column: usize },
    /// A field is missing, has the wrong type or holds a rejected value (a bad decimal, an
    /// unknown interval). `field` is Binance's name for it (`"p"`, `"lastUpdateId"`).
    #[error("field {field:?}: {msg}")]
    Field { field: String, msg: String },
    /// Valid JSON of the wrong shape where no single field is to blame (e.g. a kline row with
    /// too few elements, an array where an object belongs).
    #[error("unexpected shape at line {line} column {column}: {msg}")]
    Shape { msg: String, line: usize, column: usize },
    /// A JSON object that is no Binance event, reply or body this module knows.
    #[error("unrecognised frame: {0}")]
    UnknownFrame(&'static str),
    /// Values that decode but contradict each other (`U` > `u`, high below low, a kline open
    /// time that is not on its interval's boundary).
    #[error("invalid {what}: {reason}")]
    Invalid { what: &'static str, reason: String },
    /// A symbol, instrument or stream name that cannot be mapped.
    #[error("bad name {name:?}: {reason}")]
    Name { name: String, reason: &'static str },
}

/// Turns a serde_json error on `text` into a [`WireError`], naming the field when it can: the
/// error position is just past the rejected value, and the nearest `"key":` before it is the field
/// (for a value inside an array, such as a level in `"b":[[..]]`, the array's field).
fn json_error(text: &str, e: serde_json::Error) -> WireError {
    use serde_json::error::Category;
    let (line, column) = (e.line(), e.column());
    let mut msg = e.to_string();
    if let Some(i) = msg.rfind(" at line ") {
        msg.truncate(i);
    }
    // serde_json reports an array with too many elements (a level `["p","q","x"]`) as
    // "trailing characters", a syntax error; on valid JSON it is a shape error like the others.
    let syntax = match e.classify() {
        Category::Io | Category::Eof => true,
        Category::Syntax => serde_json::from_str::<IgnoredAny>(text).is_err(),
        Category::Data => false,
    };
    match syntax {
        true => WireError::Syntax { msg, line, column },
        false => {
            if let Some(name) =
                msg.strip_prefix("missing field `").and_then(|r| r.split('`').next())
            {
                return WireError::Field { field: name.to_string(), msg: "missing".to_string() };
            }
            match field_before(text, line, column) {
                Some(field) => WireError::Field { field, msg },
                None => WireError::Shape { msg, line, column },
            }
        }
    }
}

/// The JSON key closest before (1-based) `line`/`column` (bytes, as serde_json counts them).
fn field_before(text: &str, line: usize, column: usize) -> Option<String> {
    let b = text.as_bytes();
    let mut start = 0;
    for _ in 1..line {
        start += b[start..].iter().position(|&c| c == b'\n')? + 1;
    }
    let end = (start + column).min(b.len());
    let head = &b[..end];
    // last `":` (a key's closing quote and colon, allowing spaces), then its opening quote
    let mut i = head.len();
    while i > 0 {
        i -= 1;
        if head[i] != b':' {
            continue;
        }
        let mut q = i;
        while q > 0 && head[q - 1].is_ascii_whitespace() {
            q -= 1;
        }
        if q == 0 || head[q - 1] != b'"' {
            continue;
        }
        let close = q - 1;
        let open = head[..close].iter().rposition(|&c| c == b'"')?;
        return std::str::from_utf8(&head[open + 1..close]).ok().map(str::to_string);
    }
    None
}

/// Decodes one REST body or any other JSON document of these types, with the same errors as
/// [`parse_frame`].
pub fn parse_body<T: DeserializeOwned>(text: &str) -> Result<T, WireError> {
    serde_json::from_str(text).map_err(|e| json_error(text, e))
}

// ---------------------------------------------------------------------------------------------
// Decimal helpers
// ---------------------------------------------------------------------------------------------

/// Parses a volume (a sum of quantities) exactly. Like [`Volume::parse`], but values beyond the
/// `i64` range of a single quantity are read into the full `i128`.
pub fn parse_volume(s: &str) -> Result<Volume, ParseDecimalError> {
    match Volume::parse(s) {
        Err(ParseDecimalError::OutOfRange) => parse_wide(s),
        other => other,
    }
}

fn parse_wide(s: &str) -> Result<Volume, ParseDecimalError> {
    let s = s.strip_prefix('+').unwrap_or(s);
    if s.starts_with('-') {
        return Err(ParseDecimalError::Negative);
    }
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    let mut v: i128 = 0;
    for c in int.bytes() {
        if !c.is_ascii_digit() {
            return Err(ParseDecimalError::InvalidChar(c as char));
        }
        v = v
            .checked_mul(10)
            .and_then(|v| v.checked_add((c - b'0') as i128))
            .ok_or(ParseDecimalError::OutOfRange)?;
    }
    let mut f: i128 = 0;
    for (i, c) in frac.bytes().enumerate() {
        if !c.is_ascii_digit() {
            return Err(ParseDecimalError::InvalidChar(c as char));
        }
        if i < DECIMALS as usize {
            f = f * 10 + (c - b'0') as i128;
        } else if c != b'0' {
            return Err(ParseDecimalError::TooPrecise);
        }
    }
    f *= 10i128.pow(DECIMALS.saturating_sub(frac.len() as u32));
    v.checked_mul(SCALE as i128)
        .and_then(|v| v.checked_add(f))
        .map(Volume)
        .ok_or(ParseDecimalError::OutOfRange)
}

/// serde `deserialize_with` for volumes in the wide range of [`parse_volume`].
fn de_volume<'de, D: Deserializer<'de>>(d: D) -> Result<Volume, D::Error> {
    struct V;
    impl Visitor<'_> for V {
        type Value = Volume;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a decimal string")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Volume, E> {
            parse_volume(v).map_err(E::custom)
        }
    }
    d.deserialize_str(V)
}

/// Deserialises a present value (even `null`) as `Some`, so a reply's `"result":null` is told
/// from a missing `result`.
fn de_present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<serde_json::Value>, D::Error> {
    serde_json::Value::deserialize(d).map(Some)
}

fn is_false(b: &bool) -> bool {
    !*b
}

// ---------------------------------------------------------------------------------------------
// Kline stream
// ---------------------------------------------------------------------------------------------

/// `<symbol>@kline_<interval>` event: `{"e":"kline","E":..,"s":"BTCUSDT","k":{..}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WsKlineEvent {
    /// `"e"`: always `"kline"`.
    #[serde(rename = "e")]
    pub event_type: String,
    /// `"E"`: event time, ms.
    #[serde(rename = "E")]
    pub event_time: i64,
    /// `"s"`: symbol, `BTCUSDT`.
    #[serde(rename = "s")]
    pub symbol: String,
    /// `"k"`: the candle.
    #[serde(rename = "k")]
    pub kline: WsKline,
}

/// The `"k"` object of a kline event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WsKline {
    /// `"t"`: open time, ms.
    #[serde(rename = "t")]
    pub open_time: i64,
    /// `"T"`: close time, ms (open time + interval − 1).
    #[serde(rename = "T")]
    pub close_time: i64,
    /// `"s"`: symbol.
    #[serde(rename = "s")]
    pub symbol: String,
    /// `"i"`: interval (`"1m"`); intervals millrace has no [`Timeframe`] for are rejected.
    #[serde(rename = "i")]
    pub interval: Timeframe,
    /// `"f"`: first trade id (−1 when none).
    #[serde(rename = "f", default = "minus_one")]
    pub first_trade_id: i64,
    /// `"L"`: last trade id (−1 when none).
    #[serde(rename = "L", default = "minus_one")]
    pub last_trade_id: i64,
    #[serde(rename = "o")]
    pub open: Price,
    #[serde(rename = "c")]
    pub close: Price,
    #[serde(rename = "h")]
    pub high: Price,
    #[serde(rename = "l")]
    pub low: Price,
    /// `"v"`: base-asset volume.
    #[serde(rename = "v", deserialize_with = "de_volume")]
    pub volume: Volume,
    /// `"n"`: number of trades.
    #[serde(rename = "n")]
    pub trades: u64,
    /// `"x"`: whether this kline is closed (final).
    #[serde(rename = "x")]
    pub closed: bool,
    /// `"q"`: quote-asset volume.
    #[serde(rename = "q", default, deserialize_with = "de_volume")]
    pub quote_volume: Volume,
    /// `"V"`: taker buy base-asset volume.
    #[serde(rename = "V", default, deserialize_with = "de_volume")]
    pub taker_buy_base_volume: Volume,
    /// `"Q"`: taker buy quote-asset volume.
    #[serde(rename = "Q", default, deserialize_with = "de_volume")]
    pub taker_buy_quote_volume: Volume,
    /// `"B"`: unused by Binance (`"0"`), kept for byte-faithful output.
    #[serde(rename = "B", default = "zero_string")]
    pub ignore: String,
}

fn minus_one() -> i64 {
    -1
}

fn zero_string() -> String {
    "0".to_string()
}

/// A kline event in millrace's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KlineUpdate {
    /// Binance symbol, `BTCUSDT`.
    pub symbol: String,
    pub timeframe: Timeframe,
    /// The candle; `minutes` is the timeframe's length (Binance's candles are complete).
    pub candle: Candle,
    /// `"T"`, ms.
    pub close_time: i64,
    /// `"x"`: final; a forming candle is `false`.
    pub closed: bool,
    /// `"E"`, ms.
    pub event_time: i64,
}

impl WsKlineEvent {
    /// The event for a candle, as the simulator publishes it. Trade ids are −1 and the quote
    /// and taker volumes zero; set the public fields to publish them.
    pub fn from_candle(
        symbol: &str,
        timeframe: Timeframe,
        candle: &Candle,
        closed: bool,
        event_time: i64,
    ) -> Self {
        WsKlineEvent {
            event_type: "kline".to_string(),
            event_time,
            symbol: symbol.to_string(),
            kline: WsKline {
                open_time: candle.open_time,
                close_time: candle.open_time + timeframe.duration_ms() - 1,
                symbol: symbol.to_string(),
                interval: timeframe,
                first_trade_id: -1,
                last_trade_id: -1,
                open: candle.open,
                close: candle.close,
                high: candle.high,
                low: candle.low,
                volume: candle.volume,
                trades: candle.trades,
                closed,
                quote_volume: Volume::ZERO,
                taker_buy_base_volume: Volume::ZERO,
                taker_buy_quote_volume: Volume::ZERO,
                ignore: zero_string(),
            },
        }
    }

    /// The candle, checked: OHLC consistent and the open time on the interval's boundary.
    pub fn to_update(&self) -> Result<KlineUpdate, WireError> {
        let k = &self.kline;
        let tf = k.interval;
        let candle = Candle {
            open_time: k.open_time,
            open: k.open,
            high: k.high,
            low: k.low,
            close: k.close,
            volume: k.volume,
            trades: k.trades,
            minutes: tf.minutes(),
        };
        check_candle(&candle, tf, k.close_time)?;
        Ok(KlineUpdate {
            symbol: self.symbol.clone(),
            timeframe: tf,
            candle,
            close_time: k.close_time,
            closed: k.closed,
            event_time: self.event_time,
        })
    }
}

fn check_candle(candle: &Candle, tf: Timeframe, close_time: i64) -> Result<(), WireError> {
    candle.check().map_err(|e| WireError::Invalid { what: "kline", reason: e.to_string() })?;
    if candle.open_time.checked_rem_euclid(tf.duration_ms()) != Some(0) {
        return Err(WireError::Invalid {
            what: "kline",
            reason: format!("open time {} is not on a {tf} boundary", candle.open_time),
        });
    }
    if close_time < candle.open_time {
        return Err(WireError::Invalid {
            what: "kline",
            reason: format!("close time {close_time} is before open time {}", candle.open_time),
        });
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Depth
// ---------------------------------------------------------------------------------------------

/// `<symbol>@depth[@100ms]` diff event (`"e":"depthUpdate"`), spot and USD-M futures. Futures
/// add `"T"` (transaction time) and `"pu"` (the previous event's `u`); the futures partial book
/// `<symbol>@depth20` uses this shape too.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WsDepthUpdate {
    /// `"e"`: `"depthUpdate"`.
    #[serde(rename = "e")]
    pub event_type: String,
    /// `"E"`: event time, ms.
    #[serde(rename = "E")]
    pub event_time: i64,
    /// `"T"`: transaction time, ms (futures).
    #[serde(rename = "T", default, skip_serializing_if = "Option::is_none")]
    pub transaction_time: Option<i64>,
    #[serde(rename = "s")]
    pub symbol: String,
    /// `"U"`: first update id in the event.
    #[serde(rename = "U")]
    pub first_update_id: u64,
    /// `"u"`: final update id in the event.
    #[serde(rename = "u")]
    pub final_update_id: u64,
    /// `"pu"`: final update id of the previous event (futures).
    #[serde(rename = "pu", default, skip_serializing_if = "Option::is_none")]
    pub prev_final_update_id: Option<u64>,
    /// `"b"`: changed bids `[["price","qty"],..]`, absolute; qty 0 removes the level.
    #[serde(rename = "b")]
    pub bids: Vec<Level>,
    /// `"a"`: changed asks.
    #[serde(rename = "a")]
    pub asks: Vec<Level>,
    /// `"cs"`: the book's checksum after this event. Binance sends none; millrace's own
    /// `depth_update` carries it, and a cluster gateway reads a worker's deltas with this
    /// parser and checks it.
    #[serde(rename = "cs", default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<u32>,
}

/// A diff event in millrace's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DepthUpdate {
    /// Binance symbol.
    pub symbol: String,
    /// `"E"`, ms.
    pub event_time: i64,
    /// `"T"`, ms (futures).
    pub transaction_time: Option<i64>,
    /// `U`, `u`, `pu` and the levels, ready for `BookSync::handle_delta`.
    pub delta: DepthDelta,
}

impl WsDepthUpdate {
    /// The event for a delta, as the simulator publishes it (`pu` from `prev_last_id`).
    pub fn from_delta(
        symbol: &str,
        event_time: i64,
        transaction_time: Option<i64>,
        delta: &DepthDelta,
    ) -> Self {
        WsDepthUpdate {
            event_type: "depthUpdate".to_string(),
            event_time,
            transaction_time,
            symbol: symbol.to_string(),
            first_update_id: delta.first_id,
            final_update_id: delta.last_id,
            prev_final_update_id: delta.prev_last_id,
            bids: delta.bids.clone(),
            asks: delta.asks.clone(),
            checksum: delta.checksum,
        }
    }

    /// The delta; `U` > `u` is rejected.
    pub fn into_update(self) -> Result<DepthUpdate, WireError> {
        if self.first_update_id > self.final_update_id {
            return Err(WireError::Invalid {
                what: "depthUpdate",
                reason: format!(
                    "first update id U={} is after final update id u={}",
                    self.first_update_id, self.final_update_id
                ),
            });
        }
        Ok(DepthUpdate {
            symbol: self.symbol,
            event_time: self.event_time,
            transaction_time: self.transaction_time,
            delta: DepthDelta {
                first_id: self.first_update_id,
                last_id: self.final_update_id,
                prev_last_id: self.prev_final_update_id,
                bids: self.bids,
                asks: self.asks,
                checksum: self.checksum,
            },
        })
    }

    /// This event read as a (futures) partial book: the levels at update id `u`.
    pub fn into_partial(self) -> PartialDepth {
        PartialDepth {
            symbol: Some(self.symbol),
            event_time: Some(self.event_time),
            snapshot: DepthSnapshot {
                last_update_id: self.final_update_id,
                bids: self.bids,
                asks: self.asks,
            },
        }
    }
}

/// A depth book with its update id: the REST `/api/v3/depth` and `/fapi/v1/depth` body, and the
/// spot partial book stream `<symbol>@depth20[@100ms]`.
/// `{"lastUpdateId":..,"E":..,"T":..,"bids":[["p","q"],..],"asks":[..]}` (`E`/`T`: futures REST).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DepthBody {
    #[serde(rename = "lastUpdateId")]
    pub last_update_id: u64,
    /// `"E"`: message output time, ms (futures REST).
    #[serde(rename = "E", default, skip_serializing_if = "Option::is_none")]
    pub event_time: Option<i64>,
    /// `"T"`: transaction time, ms (futures REST).
    #[serde(rename = "T", default, skip_serializing_if = "Option::is_none")]
    pub transaction_time: Option<i64>,
    /// Best bid first.
    pub bids: Vec<Level>,
    /// Best ask first.
    pub asks: Vec<Level>,
}

impl DepthBody {
    /// The body for a snapshot, as the simulator serves it.
    pub fn from_snapshot(snapshot: &DepthSnapshot) -> Self {
        DepthBody {
            last_update_id: snapshot.last_update_id,
            event_time: None,
            transaction_time: None,
            bids: snapshot.bids.clone(),
            asks: snapshot.asks.clone(),
        }
    }

    /// The snapshot, ready for `BookSync::handle_snapshot`.
    pub fn into_snapshot(self) -> DepthSnapshot {
        DepthSnapshot { last_update_id: self.last_update_id, bids: self.bids, asks: self.asks }
    }
}

impl From<DepthBody> for DepthSnapshot {
    fn from(b: DepthBody) -> Self {
        b.into_snapshot()
    }
}

/// A partial book stream event in millrace's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartialDepth {
    /// Binance symbol: from the payload (futures) or the stream name (spot); `None` for a spot
    /// book received in raw form.
    pub symbol: Option<String>,
    /// `"E"`, ms (futures only).
    pub event_time: Option<i64>,
    /// The top levels; `last_update_id` is `lastUpdateId` (spot) or `u` (futures).
    pub snapshot: DepthSnapshot,
}

// ---------------------------------------------------------------------------------------------
// Trades and tickers
// ---------------------------------------------------------------------------------------------

/// `<symbol>@trade` event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WsTrade {
    /// `"e"`: `"trade"`.
    #[serde(rename = "e")]
    pub event_type: String,
    #[serde(rename = "E")]
    pub event_time: i64,
    #[serde(rename = "s")]
    pub symbol: String,
    /// `"t"`: trade id.
    #[serde(rename = "t")]
    pub trade_id: u64,
    #[serde(rename = "p")]
    pub price: Price,
    #[serde(rename = "q")]
    pub qty: Qty,
    /// `"T"`: trade time, ms.
    #[serde(rename = "T")]
    pub trade_time: i64,
    /// `"m"`: the buyer was the maker (the trade was sell-initiated).
    #[serde(rename = "m")]
    pub buyer_is_maker: bool,
    /// `"M"`: unused by Binance (`true`).
    #[serde(rename = "M", default, skip_serializing_if = "is_false")]
    pub ignore: bool,
}

/// One row of `GET /api/v3/aggTrades`: `{"a":26129,"p":"0.01633102","q":"4.70443515","f":27781,
/// "l":27781,"T":1498793709153,"m":true,"M":true}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestAggTrade {
    #[serde(rename = "a")]
    pub agg_trade_id: u64,
    #[serde(rename = "p")]
    pub price: Price,
    #[serde(rename = "q")]
    pub qty: Qty,
    #[serde(rename = "f")]
    pub first_trade_id: u64,
    #[serde(rename = "l")]
    pub last_trade_id: u64,
    #[serde(rename = "T")]
    pub trade_time: i64,
    #[serde(rename = "m")]
    pub buyer_is_maker: bool,
    #[serde(rename = "M", default)]
    pub best_match: bool,
}

/// `<symbol>@aggTrade` event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WsAggTrade {
    /// `"e"`: `"aggTrade"`.
    #[serde(rename = "e")]
    pub event_type: String,
    #[serde(rename = "E")]
    pub event_time: i64,
    #[serde(rename = "s")]
    pub symbol: String,
    /// `"a"`: aggregate trade id.
    #[serde(rename = "a")]
    pub agg_trade_id: u64,
    #[serde(rename = "p")]
    pub price: Price,
    #[serde(rename = "q")]
    pub qty: Qty,
    /// `"f"`: first trade id.
    #[serde(rename = "f")]
    pub first_trade_id: u64,
    /// `"l"`: last trade id.
    #[serde(rename = "l")]
    pub last_trade_id: u64,
    /// `"T"`: trade time, ms.
    #[serde(rename = "T")]
    pub trade_time: i64,
    /// `"m"`: the buyer was the maker.
    #[serde(rename = "m")]
    pub buyer_is_maker: bool,
}

/// `<symbol>@bookTicker` event: best bid and ask. Spot sends no `"e"`, `"E"` or `"T"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WsBookTicker {
    /// `"e"`: `"bookTicker"` (futures only).
    #[serde(rename = "e", default, skip_serializing_if = "Option::is_none")]
    pub event_type: Option<String>,
    /// `"u"`: order book update id this ticker reflects.
    #[serde(rename = "u")]
    pub update_id: u64,
    #[serde(rename = "s")]
    pub symbol: String,
    #[serde(rename = "b")]
    pub bid_price: Price,
    #[serde(rename = "B")]
    pub bid_qty: Qty,
    #[serde(rename = "a")]
    pub ask_price: Price,
    #[serde(rename = "A")]
    pub ask_qty: Qty,
    /// `"T"`: transaction time (futures).
    #[serde(rename = "T", default, skip_serializing_if = "Option::is_none")]
    pub transaction_time: Option<i64>,
    /// `"E"`: event time (futures).
    #[serde(rename = "E", default, skip_serializing_if = "Option::is_none")]
    pub event_time: Option<i64>,
}

// ---------------------------------------------------------------------------------------------
// Stream control
// ---------------------------------------------------------------------------------------------

/// The combined-stream envelope `{"stream":"btcusdt@kline_1m","data":{...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Combined<T> {
    pub stream: String,
    pub data: T,
}

/// Methods of a stream connection's request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum WsMethod {
    Subscribe,
    Unsubscribe,
    ListSubscriptions,
    SetProperty,
    GetProperty,
}

/// A request on a stream connection: `{"method":"SUBSCRIBE","params":["btcusdt@kline_1m"],"id":1}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WsRequest {
    pub method: WsMethod,
    /// Stream names for (UN)SUBSCRIBE; `["combined", true]` for SET_PROPERTY.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub params: Vec<serde_json::Value>,
    pub id: u64,
}

impl WsRequest {
    /// `SUBSCRIBE` to `streams`.
    pub fn subscribe<S: AsRef<str>>(streams: &[S], id: u64) -> Self {
        WsRequest { method: WsMethod::Subscribe, params: to_params(streams), id }
    }

    /// `UNSUBSCRIBE` from `streams`.
    pub fn unsubscribe<S: AsRef<str>>(streams: &[S], id: u64) -> Self {
        WsRequest { method: WsMethod::Unsubscribe, params: to_params(streams), id }
    }

    /// The string params (stream names); non-string params are skipped.
    pub fn streams(&self) -> impl Iterator<Item = &str> {
        self.params.iter().filter_map(|p| p.as_str())
    }
}

fn to_params<S: AsRef<str>>(streams: &[S]) -> Vec<serde_json::Value> {
    streams.iter().map(|s| serde_json::Value::String(s.as_ref().to_string())).collect()
}

/// The answer to a [`WsRequest`]: `{"result":null,"id":1}` or
/// `{"error":{"code":2,"msg":"Invalid request"},"id":1}`.
#[derive(Debug, Clone, PartialEq)]
pub struct WsReply {
    /// The request's id; `None` when Binance could not read it.
    pub id: Option<u64>,
    /// `result` (`null` for (UN)SUBSCRIBE, a list for LIST_SUBSCRIPTIONS) or `error`.
    pub outcome: Result<serde_json::Value, BinanceError>,
}

impl WsReply {
    /// The success reply to request `id`.
    pub fn ok(id: u64) -> Self {
        WsReply { id: Some(id), outcome: Ok(serde_json::Value::Null) }
    }
}

#[derive(Serialize, Deserialize)]
struct RawReply {
    #[serde(default, deserialize_with = "de_present", skip_serializing_if = "Option::is_none")]
    result: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<BinanceError>,
    #[serde(default)]
    id: Option<u64>,
}

impl Serialize for WsReply {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (result, error) = match &self.outcome {
            Ok(v) => (Some(v.clone()), None),
            Err(e) => (None, Some(e.clone())),
        };
        RawReply { result, error, id: self.id }.serialize(s)
    }
}

impl<'de> Deserialize<'de> for WsReply {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = RawReply::deserialize(d)?;
        let outcome = match (raw.error, raw.result) {
            (Some(e), _) => Err(e),
            (None, Some(v)) => Ok(v),
            (None, None) => return Err(de::Error::custom("a reply needs `result` or `error`")),
        };
        Ok(WsReply { id: raw.id, outcome })
    }
}

/// Binance's error body: `{"code":-1121,"msg":"Invalid symbol."}` (REST, and `"error"` of a
/// stream reply).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("Binance error {code}: {msg}")]
pub struct BinanceError {
    pub code: i64,
    pub msg: String,
}

// ---------------------------------------------------------------------------------------------
// parse_frame
// ---------------------------------------------------------------------------------------------

/// One decoded stream frame. `stream` is the combined-stream name (`btcusdt@kline_1m`), `None`
/// for a frame in raw form.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// A forming or closed candle.
    Kline { stream: Option<String>, kline: KlineUpdate },
    /// A diff of the book.
    DepthUpdate { stream: Option<String>, update: DepthUpdate },
    /// The top levels of the book.
    PartialDepth { stream: Option<String>, depth: PartialDepth },
    /// One trade.
    Trade { stream: Option<String>, trade: WsTrade },
    /// One aggregate trade.
    AggTrade { stream: Option<String>, trade: WsAggTrade },
    /// Best bid and ask.
    BookTicker { stream: Option<String>, ticker: WsBookTicker },
    /// The answer to a request sent on the connection.
    Reply(WsReply),
    /// A well-formed event of a type this module does not decode (`24hrTicker`, ...);
    /// `event_type` is its `"e"`, or [`ARRAY_EVENT`] for an array payload.
    Other { stream: Option<String>, event_type: String },
}

impl StreamEvent {
    /// The combined-stream name the event came on.
    pub fn stream(&self) -> Option<&str> {
        match self {
            StreamEvent::Kline { stream, .. }
            | StreamEvent::DepthUpdate { stream, .. }
            | StreamEvent::PartialDepth { stream, .. }
            | StreamEvent::Trade { stream, .. }
            | StreamEvent::AggTrade { stream, .. }
            | StreamEvent::BookTicker { stream, .. }
            | StreamEvent::Other { stream, .. } => stream.as_deref(),
            StreamEvent::Reply(_) => None,
        }
    }
}

/// Deserialises any value as "present" (for the shape peek).
#[derive(Default, Clone, Copy)]
struct Present(bool);

impl<'de> Deserialize<'de> for Present {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        IgnoredAny::deserialize(d).map(|_| Present(true))
    }
}

/// The keys that tell event shapes apart.
#[derive(Deserialize, Default)]
struct PeekObject<'a> {
    #[serde(borrow, default)]
    e: Option<Cow<'a, str>>,
    #[serde(rename = "lastUpdateId", default)]
    last_update_id: Present,
    #[serde(default)]
    u: Present,
    #[serde(rename = "A", default)]
    ask_qty: Present,
    #[serde(default)]
    result: Present,
    #[serde(default)]
    error: Present,
}

/// First pass: the envelope and the inner object's shape keys.
#[derive(Deserialize)]
struct Peek<'a> {
    #[serde(default)]
    stream: Option<String>,
    #[serde(borrow, default)]
    data: Option<PeekData<'a>>,
    #[serde(borrow, default)]
    e: Option<Cow<'a, str>>,
    #[serde(rename = "lastUpdateId", default)]
    last_update_id: Present,
    #[serde(default)]
    u: Present,
    #[serde(rename = "A", default)]
    ask_qty: Present,
    #[serde(default)]
    result: Present,
    #[serde(default)]
    error: Present,
}

/// The `data` of an envelope: an event object, or an array (`!miniTicker@arr` and other
/// all-market streams), which this module does not decode.
enum PeekData<'a> {
    Object(PeekObject<'a>),
    Array,
}

impl<'de: 'a, 'a> Deserialize<'de> for PeekData<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = PeekData<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an event object or an array")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<PeekData<'a>, A::Error> {
                PeekObject::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(PeekData::Object)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<PeekData<'a>, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(PeekData::Array)
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// The `event_type` of [`StreamEvent::Other`] for an array payload.
pub const ARRAY_EVENT: &str = "[array]";

#[derive(Deserialize)]
struct DataOnly<T> {
    data: T,
}

fn decode<'a, T: Deserialize<'a>>(text: &'a str, combined: bool) -> Result<T, WireError> {
    let r = if combined {
        serde_json::from_str::<DataOnly<T>>(text).map(|c| c.data)
    } else {
        serde_json::from_str(text)
    };
    r.map_err(|e| json_error(text, e))
}

/// [`crate::parse_frame`] by serde alone: the reference the fast depth path is tested against, and
/// its fallback.
pub fn parse_frame_serde(text: &str) -> Result<StreamEvent, WireError> {
    if text.trim_start().starts_with('[') {
        // a raw all-market stream (`/ws/!miniTicker@arr`): valid JSON is an event we skip
        serde_json::from_str::<IgnoredAny>(text).map_err(|e| json_error(text, e))?;
        return Ok(StreamEvent::Other { stream: None, event_type: ARRAY_EVENT.to_string() });
    }
    let peek: Peek<'_> = serde_json::from_str(text).map_err(|e| json_error(text, e))?;
    let (stream, inner, combined) = match (peek.stream, peek.data) {
        (Some(stream), Some(PeekData::Object(data))) => (Some(stream), data, true),
        (Some(stream), Some(PeekData::Array)) => {
            return Ok(StreamEvent::Other {
                stream: Some(stream),
                event_type: ARRAY_EVENT.to_string(),
            })
        }
        (Some(_), None) => {
            return Err(WireError::Field { field: "data".into(), msg: "missing".into() })
        }
        (None, _) => {
            if peek.result.0 || peek.error.0 {
                return decode::<WsReply>(text, false).map(StreamEvent::Reply);
            }
            let inner = PeekObject {
                e: peek.e,
                last_update_id: peek.last_update_id,
                u: peek.u,
                ask_qty: peek.ask_qty,
                result: peek.result,
                error: peek.error,
            };
            (None, inner, false)
        }
    };
    match inner.e.as_deref() {
        Some("kline") => {
            let ev: WsKlineEvent = decode(text, combined)?;
            Ok(StreamEvent::Kline { stream, kline: ev.to_update()? })
        }
        Some("depthUpdate") => {
            let ev: WsDepthUpdate = decode(text, combined)?;
            if stream.as_deref().is_some_and(is_partial_depth_stream) {
                Ok(StreamEvent::PartialDepth { stream, depth: ev.into_partial() })
            } else {
                Ok(StreamEvent::DepthUpdate { stream, update: ev.into_update()? })
            }
        }
        Some("trade") => Ok(StreamEvent::Trade { trade: decode(text, combined)?, stream }),
        Some("aggTrade") => Ok(StreamEvent::AggTrade { trade: decode(text, combined)?, stream }),
        Some("bookTicker") => {
            Ok(StreamEvent::BookTicker { ticker: decode(text, combined)?, stream })
        }
        Some(other) => Ok(StreamEvent::Other { event_type: other.to_string(), stream }),
        None if inner.last_update_id.0 => {
            let body: DepthBody = decode(text, combined)?;
            let symbol = stream
                .as_deref()
                .and_then(|s| s.split_once('@'))
                .map(|(sym, _)| sym.to_ascii_uppercase());
            let depth = PartialDepth {
                symbol,
                event_time: body.event_time,
                snapshot: body.into_snapshot(),
            };
            Ok(StreamEvent::PartialDepth { stream, depth })
        }
        None if inner.u.0 && inner.ask_qty.0 => {
            Ok(StreamEvent::BookTicker { ticker: decode(text, combined)?, stream })
        }
        None if combined && (inner.result.0 || inner.error.0) => {
            Err(WireError::UnknownFrame("a reply inside a combined-stream envelope"))
        }
        None => Err(WireError::UnknownFrame(
            "no \"e\" event type and not a reply, partial book or book ticker",
        )),
    }
}

/// Whether a stream name is a partial book stream (`<symbol>@depth<levels>[@<speed>]`).
pub fn is_partial_depth_stream(name: &str) -> bool {
    matches!(
        name.parse::<StreamName>(),
        Ok(StreamName { kind: StreamKind::PartialDepth { .. }, .. })
    )
}

// ---------------------------------------------------------------------------------------------
// REST bodies
// ---------------------------------------------------------------------------------------------

/// One row of `/api/v3/klines` / `/fapi/v1/klines`:
/// `[openTime,"o","h","l","c","v",closeTime,"quoteVol",trades,"takerBase","takerQuote","0"]`.
/// The same 12 columns as Binance's CSV kline archives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestKline {
    /// The candle; `minutes` is the row's span (`(closeTime + 1 − openTime)` in minutes, at
    /// least 1), which is the timeframe's length for every row Binance returns.
    pub candle: Candle,
    /// Close time, ms (open time + interval − 1). The last row of a response is still forming
    /// when this is in the future; the caller decides by its clock.
    pub close_time: i64,
    pub quote_volume: Volume,
    pub taker_buy_base_volume: Volume,
    pub taker_buy_quote_volume: Volume,
}

impl RestKline {
    /// The row for a candle of `timeframe`, as the simulator serves it (quote and taker volumes
    /// zero).
    pub fn from_candle(timeframe: Timeframe, candle: &Candle) -> Self {
        RestKline {
            candle: *candle,
            close_time: candle.open_time + timeframe.duration_ms() - 1,
            quote_volume: Volume::ZERO,
            taker_buy_base_volume: Volume::ZERO,
            taker_buy_quote_volume: Volume::ZERO,
        }
    }
}

impl Serialize for RestKline {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let c = &self.candle;
        let mut seq = s.serialize_seq(Some(12))?;
        seq.serialize_element(&c.open_time)?;
        seq.serialize_element(&c.open)?;
        seq.serialize_element(&c.high)?;
        seq.serialize_element(&c.low)?;
        seq.serialize_element(&c.close)?;
        seq.serialize_element(&c.volume)?;
        seq.serialize_element(&self.close_time)?;
        seq.serialize_element(&self.quote_volume)?;
        seq.serialize_element(&c.trades)?;
        seq.serialize_element(&self.taker_buy_base_volume)?;
        seq.serialize_element(&self.taker_buy_quote_volume)?;
        seq.serialize_element("0")?;
        seq.end()
    }
}

/// Names of the kline row's columns, for errors.
const KLINE_COLUMNS: [&str; 12] = [
    "open time",
    "open",
    "high",
    "low",
    "close",
    "volume",
    "close time",
    "quote volume",
    "trades",
    "taker buy base volume",
    "taker buy quote volume",
    "ignore",
];

impl<'de> Deserialize<'de> for RestKline {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RestKline;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a kline row of 12 elements")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RestKline, A::Error> {
                fn at<'de, A: SeqAccess<'de>, T: Deserialize<'de>>(
                    seq: &mut A,
                    i: usize,
                ) -> Result<T, A::Error> {
                    let col = KLINE_COLUMNS[i];
                    match seq.next_element::<T>() {
                        Ok(Some(v)) => Ok(v),
                        Ok(None) => Err(de::Error::custom(format_args!(
                            "kline row has {i} elements, expected 12 (missing {col})"
                        ))),
                        Err(e) => Err(de::Error::custom(format_args!(
                            "kline row element {i} ({col}): {e}"
                        ))),
                    }
                }
                fn dec<'de, A: SeqAccess<'de>, T>(
                    seq: &mut A,
                    i: usize,
                    parse: fn(&str) -> Result<T, ParseDecimalError>,
                ) -> Result<T, A::Error> {
                    let s: Cow<'de, str> = at(seq, i)?;
                    parse(&s).map_err(|e| {
                        de::Error::custom(format_args!(
                            "kline row element {i} ({}): {e}: {s:?}",
                            KLINE_COLUMNS[i]
                        ))
                    })
                }
                let open_time: i64 = at(&mut seq, 0)?;
                let open = dec(&mut seq, 1, Price::parse)?;
                let high = dec(&mut seq, 2, Price::parse)?;
                let low = dec(&mut seq, 3, Price::parse)?;
                let close = dec(&mut seq, 4, Price::parse)?;
                let volume = dec(&mut seq, 5, parse_volume)?;
                let close_time: i64 = at(&mut seq, 6)?;
                let quote_volume = dec(&mut seq, 7, parse_volume)?;
                let trades: u64 = at(&mut seq, 8)?;
                let taker_buy_base_volume = dec(&mut seq, 9, parse_volume)?;
                let taker_buy_quote_volume = dec(&mut seq, 10, parse_volume)?;
                // column 11 is unused ("0"); accept any value, and ignore further columns
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                let span = close_time.saturating_sub(open_time).saturating_add(1) / MINUTE_MS;
                let minutes = span.clamp(1, u32::MAX as i64) as u32;
                let candle = Candle { open_time, open, high, low, close, volume, trades, minutes };
                candle.check().map_err(de::Error::custom)?;
                if close_time < open_time {
                    return Err(de::Error::custom(format_args!(
                        "kline row close time {close_time} is before open time {open_time}"
                    )));
                }
                Ok(RestKline {
                    candle,
                    close_time,
                    quote_volume,
                    taker_buy_base_volume,
                    taker_buy_quote_volume,
                })
            }
        }
        d.deserialize_seq(V)
    }
}

/// `/api/v3/time` and `/fapi/v1/time`: `{"serverTime":1499827319559}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerTime {
    #[serde(rename = "serverTime")]
    pub server_time: i64,
}

/// `/api/v3/exchangeInfo` and `/fapi/v1/exchangeInfo`, the parts millrace uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExchangeInfo {
    #[serde(default)]
    pub timezone: String,
    #[serde(rename = "serverTime", default)]
    pub server_time: i64,
    #[serde(rename = "rateLimits", default)]
    pub rate_limits: Vec<RateLimit>,
    pub symbols: Vec<SymbolInfo>,
}

impl ExchangeInfo {
    /// The symbol's entry.
    pub fn symbol(&self, symbol: &str) -> Option<&SymbolInfo> {
        self.symbols.iter().find(|s| s.symbol == symbol)
    }
}

/// One entry of `rateLimits`:
/// `{"rateLimitType":"REQUEST_WEIGHT","interval":"MINUTE","intervalNum":1,"limit":6000}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimit {
    /// `REQUEST_WEIGHT`, `ORDERS`, `RAW_REQUESTS`.
    #[serde(rename = "rateLimitType")]
    pub rate_limit_type: String,
    /// `SECOND`, `MINUTE`, `DAY`.
    pub interval: String,
    #[serde(rename = "intervalNum")]
    pub interval_num: u32,
    pub limit: u64,
}

/// One entry of `symbols`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SymbolInfo {
    /// `BTCUSDT`.
    pub symbol: String,
    /// `TRADING`, `BREAK`, `HALT`, ... (`PENDING_TRADING`, `SETTLING` on futures).
    pub status: String,
    #[serde(rename = "baseAsset")]
    pub base_asset: String,
    #[serde(rename = "quoteAsset")]
    pub quote_asset: String,
    #[serde(default)]
    pub filters: Vec<SymbolFilter>,
}

impl SymbolInfo {
    /// Whether the symbol is trading now.
    pub fn is_trading(&self) -> bool {
        self.status == "TRADING"
    }

    /// `PRICE_FILTER.tickSize`.
    pub fn tick_size(&self) -> Option<Price> {
        self.filters.iter().find_map(|f| match f {
            SymbolFilter::PriceFilter { tick_size, .. } => Some(*tick_size),
            _ => None,
        })
    }

    /// `LOT_SIZE.stepSize`.
    pub fn step_size(&self) -> Option<Qty> {
        self.filters.iter().find_map(|f| match f {
            SymbolFilter::LotSize { step_size, .. } => Some(*step_size),
            _ => None,
        })
    }

    /// The millrace instrument, `exchange:market:BASE/QUOTE`.
    pub fn instrument(&self, exchange: &str, market: Market) -> InstrumentId {
        InstrumentId::new(exchange, market, format!("{}/{}", self.base_asset, self.quote_asset))
    }
}

/// A symbol filter; the ones millrace does not use are kept as [`SymbolFilter::Other`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "filterType")]
pub enum SymbolFilter {
    /// `PRICE_FILTER`: prices are multiples of `tickSize` within `[minPrice, maxPrice]` (0 = no
    /// bound).
    #[serde(rename = "PRICE_FILTER")]
    PriceFilter {
        #[serde(rename = "minPrice")]
        min_price: Price,
        #[serde(rename = "maxPrice")]
        max_price: Price,
        #[serde(rename = "tickSize")]
        tick_size: Price,
    },
    /// `LOT_SIZE`: quantities are multiples of `stepSize` within `[minQty, maxQty]`.
    #[serde(rename = "LOT_SIZE")]
    LotSize {
        #[serde(rename = "minQty")]
        min_qty: Qty,
        #[serde(rename = "maxQty")]
        max_qty: Qty,
        #[serde(rename = "stepSize")]
        step_size: Qty,
    },
    /// Any other filter type.
    #[serde(other)]
    Other,
}

// ---------------------------------------------------------------------------------------------
// Names
// ---------------------------------------------------------------------------------------------

/// The Binance symbol of a millrace instrument: `binance:spot:BTC/USDT` → `BTCUSDT`. The
/// exchange part is not checked (the simulator speaks Binance's protocol under its own name);
/// the market must be spot or futures.
pub fn symbol_of(instrument: &InstrumentId) -> Result<String, WireError> {
    let bad = |reason| WireError::Name { name: instrument.to_string(), reason };
    if !matches!(instrument.market, Market::Spot | Market::Futures) {
        return Err(bad("Binance trades only spot and futures markets"));
    }
    let (base, quote) =
        instrument.symbol.split_once('/').ok_or_else(|| bad("symbol must be BASE/QUOTE"))?;
    if base.is_empty()
        || quote.is_empty()
        || !(base.bytes().chain(quote.bytes()).all(|c| c.is_ascii_alphanumeric()))
    {
        return Err(bad("BASE and QUOTE must be letters and digits"));
    }
    Ok(format!("{base}{quote}").to_ascii_uppercase())
}

/// Quote assets tried by [`split_symbol`], longest first within each prefix family.
pub const KNOWN_QUOTES: [&str; 16] = [
    "FDUSD", "USDT", "USDC", "BUSD", "TUSD", "USDP", "DAI", "BTC", "ETH", "BNB", "EUR", "TRY",
    "BRL", "GBP", "JPY", "AUD",
];

/// Splits a Binance symbol into base and quote by the known quote assets (`BTCUSDT` →
/// `("BTC","USDT")`). A fallback for when no `exchangeInfo` is at hand; prefer
/// [`SymbolInfo::instrument`], which uses Binance's own `baseAsset`/`quoteAsset`.
pub fn split_symbol(symbol: &str) -> Option<(&str, &str)> {
    KNOWN_QUOTES
        .iter()
        .filter(|q| symbol.len() > q.len() && symbol.ends_with(*q))
        .max_by_key(|q| q.len())
        .map(|q| symbol.split_at(symbol.len() - q.len()))
}

/// What a stream carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamKind {
    /// `kline_<interval>`.
    Kline(Timeframe),
    /// `depth[@<ms>ms]`: diffs; `None` is the venue's default speed (spot 1000 ms, futures
    /// 250 ms).
    Depth { update_ms: Option<u16> },
    /// `depth<levels>[@<ms>ms]`: partial book of 5, 10 or 20 levels.
    PartialDepth { levels: u16, update_ms: Option<u16> },
    /// `trade`.
    Trade,
    /// `aggTrade`.
    AggTrade,
    /// `bookTicker`.
    BookTicker,
}

/// A per-symbol stream name, `btcusdt@kline_1m`. Displays in Binance's form; parses it back.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StreamName {
    /// Binance symbol, upper case (`BTCUSDT`); written lower case in the name.
    pub symbol: String,
    pub kind: StreamKind,
}

impl StreamName {
    /// The stream of `kind` for `symbol` (any case).
    pub fn new(symbol: &str, kind: StreamKind) -> Self {
        StreamName { symbol: symbol.to_ascii_uppercase(), kind }
    }
}

impl fmt::Display for StreamName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.symbol.chars() {
            write!(f, "{}", c.to_ascii_lowercase())?;
        }
        let speed = |f: &mut fmt::Formatter<'_>, ms: Option<u16>| match ms {
            Some(ms) => write!(f, "@{ms}ms"),
            None => Ok(()),
        };
        match self.kind {
            StreamKind::Kline(tf) => write!(f, "@kline_{tf}"),
            StreamKind::Depth { update_ms } => {
                f.write_str("@depth")?;
                speed(f, update_ms)
            }
            StreamKind::PartialDepth { levels, update_ms } => {
                write!(f, "@depth{levels}")?;
                speed(f, update_ms)
            }
            StreamKind::Trade => f.write_str("@trade"),
            StreamKind::AggTrade => f.write_str("@aggTrade"),
            StreamKind::BookTicker => f.write_str("@bookTicker"),
        }
    }
}

impl FromStr for StreamName {
    type Err = WireError;
    fn from_str(name: &str) -> Result<Self, WireError> {
        let bad = |reason| WireError::Name { name: name.to_string(), reason };
        let (symbol, rest) =
            name.split_once('@').ok_or_else(|| bad("expected <symbol>@<stream>"))?;
        if symbol.is_empty() || !symbol.bytes().all(|c| c.is_ascii_alphanumeric()) {
            return Err(bad("symbol must be letters and digits"));
        }
        let (kind, speed) = match rest.split_once('@') {
            Some((k, s)) => (k, Some(s)),
            None => (rest, None),
        };
        let update_ms = match speed {
            None => None,
            Some(s) => Some(
                s.strip_suffix("ms")
                    .and_then(|n| n.parse::<u16>().ok())
                    .ok_or_else(|| bad("speed must look like 100ms"))?,
            ),
        };
        let kind = match kind {
            "trade" | "aggTrade" | "bookTicker" if update_ms.is_some() => {
                return Err(bad("this stream takes no speed"))
            }
            "trade" => StreamKind::Trade,
            "aggTrade" => StreamKind::AggTrade,
            "bookTicker" => StreamKind::BookTicker,
            "depth" => StreamKind::Depth { update_ms },
            k if k.starts_with("kline_") => {
                if update_ms.is_some() {
                    return Err(bad("a kline stream takes no speed"));
                }
                let tf = k["kline_".len()..].parse().map_err(|_| bad("unknown kline interval"))?;
                StreamKind::Kline(tf)
            }
            k if k.starts_with("depth") => match k["depth".len()..].parse::<u16>() {
                Ok(levels @ (5 | 10 | 20)) => StreamKind::PartialDepth { levels, update_ms },
                _ => return Err(bad("partial depth levels must be 5, 10 or 20")),
            },
            _ => return Err(bad("unknown stream type")),
        };
        Ok(StreamName { symbol: symbol.to_ascii_uppercase(), kind })
    }
}

/// The combined-stream path for `streams`: `stream?streams=a/b/c`.
pub fn combined_path<S: AsRef<str>>(streams: &[S]) -> String {
    let mut p = String::from("stream?streams=");
    for (i, s) in streams.iter().enumerate() {
        if i > 0 {
            p.push('/');
        }
        p.push_str(s.as_ref());
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_frame;

    fn p(s: &str) -> Price {
        Price::parse(s).unwrap()
    }
    fn q(s: &str) -> Qty {
        Qty::parse(s).unwrap()
    }

    // Real frames, copied from testdata/binance-ws/cryptofeed (see testdata/README.md).
    const SPOT_KLINE: &str = r#"{"stream":"nknusdt@kline_1m","data":{"e":"kline","E":1633998523963,"s":"NKNUSDT","k":{"t":1633998480000,"T":1633998539999,"s":"NKNUSDT","i":"1m","f":19862761,"L":19862790,"o":"0.35270000","c":"0.35280000","h":"0.35280000","l":"0.35220000","v":"25877.00000000","n":30,"x":false,"q":"9116.04600000","V":"58.00000000","Q":"20.46240000","B":"0"}}}"#;
    const FUT_DEPTH: &str = r#"{"stream":"sushiusdt@depth@100ms","data":{"e":"depthUpdate","E":1626992741037,"T":1626992741024,"s":"SUSHIUSDT","U":600859599090,"u":600859600917,"pu":600859598061,"b":[["7.5040","813"],["7.6090","0"],["7.6110","2"]],"a":[["7.6150","1563"],["7.6220","3284"]]}}"#;
    const SPOT_DEPTH: &str = r#"{"stream":"nknusdt@depth@100ms","data":{"e":"depthUpdate","E":1633998512568,"s":"NKNUSDT","U":499869753,"u":499869754,"b":[["0.35170000","4265.00000000"]],"a":[["0.35290000","10968.00000000"]]}}"#;
    const SPOT_TRADE: &str = r#"{"stream":"ethusdt@trade","data":{"e":"trade","E":1723161255612,"s":"ETHUSDT","t":1520538925,"p":"2683.80000000","q":"0.00200000","T":1723161255611,"m":true,"M":true}}"#;
    const FUT_TICKER: &str = r#"{"stream":"sushiusdt@bookTicker","data":{"e":"bookTicker","u":600859600576,"s":"SUSHIUSDT","b":"7.6110","B":"2","a":"7.6120","A":"297","T":1626992741012,"E":1626992741017}}"#;

    #[test]
    fn kline_event_to_candle() {
        let StreamEvent::Kline { stream, kline } = parse_frame(SPOT_KLINE).unwrap() else {
            panic!()
        };
        assert_eq!(stream.as_deref(), Some("nknusdt@kline_1m"));
        assert_eq!(kline.symbol, "NKNUSDT");
        assert_eq!(kline.timeframe, Timeframe::M1);
        assert!(!kline.closed);
        assert_eq!(kline.event_time, 1633998523963);
        assert_eq!(kline.close_time, 1633998539999);
        let c = kline.candle;
        assert_eq!(
            (c.open_time, c.open, c.high, c.low, c.close),
            (1633998480000, p("0.3527"), p("0.3528"), p("0.3522"), p("0.3528"))
        );
        assert_eq!((c.volume, c.trades, c.minutes), (Volume::parse("25877").unwrap(), 30, 1));
    }

    /// Issue 15 item 12: a trade count that would overflow a bucket's sum is an invalid frame
    /// (counted like any other), on the stream and in REST rows, never accepted.
    #[test]
    fn klines_with_out_of_range_trade_counts_are_invalid() {
        for n in ["18446744073709551615", "281474976710657"] {
            let frame = SPOT_KLINE.replace(r#""n":30"#, &format!(r#""n":{n}"#));
            let e = parse_frame(&frame).unwrap_err();
            assert!(matches!(e, WireError::Invalid { what: "kline", .. }), "{n}: {e:?}");
            assert!(e.to_string().contains("trade count out of range"), "{e}");
        }
        let max = SPOT_KLINE.replace(r#""n":30"#, r#""n":281474976710656"#);
        assert!(parse_frame(&max).is_ok());
        let row = r#"[[1577836800000,"1","1","1","1","0",1577836859999,"0",18446744073709551615,"0","0","0"]]"#;
        let e = parse_body::<Vec<RestKline>>(row).unwrap_err().to_string();
        assert!(e.contains("trade count out of range"), "{e}");
    }

    #[test]
    fn kline_round_trips_through_the_simulator_direction() {
        let candle = Candle::one_minute(
            1577836800000,
            p("7195.24"),
            p("7196.25"),
            p("7183.14"),
            p("7186.68"),
            Volume::parse("51.642812").unwrap(),
            493,
        );
        let ev = WsKlineEvent::from_candle("BTCUSDT", Timeframe::M1, &candle, true, 1577836860001);
        let text =
            serde_json::to_string(&Combined { stream: "btcusdt@kline_1m".into(), data: &ev })
                .unwrap();
        assert!(
            text.contains(r#""k":{"t":1577836800000,"T":1577836859999,"s":"BTCUSDT","i":"1m""#),
            "{text}"
        );
        let StreamEvent::Kline { kline, .. } = parse_frame(&text).unwrap() else { panic!() };
        assert_eq!(kline.candle, candle);
        assert!(kline.closed);
        // raw form too
        let raw = serde_json::to_string(&ev).unwrap();
        assert!(matches!(parse_frame(&raw).unwrap(), StreamEvent::Kline { stream: None, .. }));
    }

    #[test]
    fn futures_and_spot_depth_updates() {
        let StreamEvent::DepthUpdate { update, .. } = parse_frame(FUT_DEPTH).unwrap() else {
            panic!()
        };
        assert_eq!(update.symbol, "SUSHIUSDT");
        assert_eq!(update.transaction_time, Some(1626992741024));
        let d = update.delta;
        assert_eq!(
            (d.first_id, d.last_id, d.prev_last_id),
            (600859599090, 600859600917, Some(600859598061))
        );
        assert_eq!(d.bids[1], Level::new(p("7.609"), Qty::ZERO));
        assert_eq!(
            d.asks,
            vec![Level::new(p("7.615"), q("1563")), Level::new(p("7.622"), q("3284"))]
        );

        let StreamEvent::DepthUpdate { update, .. } = parse_frame(SPOT_DEPTH).unwrap() else {
            panic!()
        };
        assert_eq!(update.delta.prev_last_id, None);
        assert_eq!(update.transaction_time, None);
        // and back: the simulator's output parses to the same delta
        let ev = WsDepthUpdate::from_delta(&update.symbol, update.event_time, None, &update.delta);
        let StreamEvent::DepthUpdate { update: again, .. } =
            parse_frame(&serde_json::to_string(&ev).unwrap()).unwrap()
        else {
            panic!()
        };
        assert_eq!(again, update);
    }

    #[test]
    fn partial_depth_spot_and_futures() {
        let spot = r#"{"stream":"btcusdt@depth5@100ms","data":{"lastUpdateId":160,"bids":[["0.0024","10"]],"asks":[["0.0026","100"]]}}"#;
        let StreamEvent::PartialDepth { depth, .. } = parse_frame(spot).unwrap() else { panic!() };
        assert_eq!(depth.symbol.as_deref(), Some("BTCUSDT"));
        assert_eq!(depth.snapshot.last_update_id, 160);
        assert_eq!(depth.snapshot.bids, vec![Level::new(p("0.0024"), q("10"))]);
        let fut = FUT_DEPTH.replace("sushiusdt@depth@100ms", "sushiusdt@depth20@100ms");
        let StreamEvent::PartialDepth { depth, .. } = parse_frame(&fut).unwrap() else { panic!() };
        assert_eq!(depth.snapshot.last_update_id, 600859600917);
        assert_eq!(depth.symbol.as_deref(), Some("SUSHIUSDT"));
        // raw spot partial book
        let raw = r#"{"lastUpdateId":160,"bids":[],"asks":[]}"#;
        assert!(matches!(
            parse_frame(raw).unwrap(),
            StreamEvent::PartialDepth { stream: None, depth: PartialDepth { symbol: None, .. } }
        ));
    }

    #[test]
    fn trades_and_tickers() {
        let StreamEvent::Trade { trade, .. } = parse_frame(SPOT_TRADE).unwrap() else { panic!() };
        assert_eq!(
            (trade.trade_id, trade.price, trade.qty, trade.buyer_is_maker),
            (1520538925, p("2683.8"), q("0.002"), true)
        );
        let StreamEvent::BookTicker { ticker, .. } = parse_frame(FUT_TICKER).unwrap() else {
            panic!()
        };
        assert_eq!(
            (ticker.update_id, ticker.bid_price, ticker.ask_qty),
            (600859600576, p("7.611"), q("297"))
        );
        let spot = r#"{"u":400900217,"s":"BNBUSDT","b":"25.35190000","B":"31.21000000","a":"25.36520000","A":"40.66000000"}"#;
        let StreamEvent::BookTicker { ticker, stream: None } = parse_frame(spot).unwrap() else {
            panic!()
        };
        assert_eq!(ticker.event_type, None);
        let agg = r#"{"stream":"nknusdt@aggTrade","data":{"e":"aggTrade","E":1633998523963,"s":"NKNUSDT","a":15683430,"p":"0.35280000","q":"58.00000000","f":19862790,"l":19862790,"T":1633998523963,"m":false,"M":true}}"#;
        let StreamEvent::AggTrade { trade, .. } = parse_frame(agg).unwrap() else { panic!() };
        assert_eq!(
            (trade.agg_trade_id, trade.first_trade_id, trade.qty),
            (15683430, 19862790, q("58"))
        );
        let other = r#"{"e":"24hrTicker","E":1,"s":"BTCUSDT"}"#;
        assert_eq!(
            parse_frame(other).unwrap(),
            StreamEvent::Other { stream: None, event_type: "24hrTicker".into() }
        );
        let arr = r#"{"stream":"!miniTicker@arr","data":[{"e":"24hrMiniTicker","E":1,"s":"BTCUSDT","c":"1"}]}"#;
        let want = StreamEvent::Other {
            stream: Some("!miniTicker@arr".into()),
            event_type: ARRAY_EVENT.into(),
        };
        assert_eq!(parse_frame(arr).unwrap(), want);
        assert_eq!(parse_frame(r#" [{"e":"24hrMiniTicker"}]"#).unwrap().stream(), None);
    }

    #[test]
    fn replies_and_requests() {
        assert_eq!(
            parse_frame(r#"{"result":null,"id":1}"#).unwrap(),
            StreamEvent::Reply(WsReply::ok(1))
        );
        let StreamEvent::Reply(r) = parse_frame(r#"{"result":["btcusdt@trade"],"id":3}"#).unwrap()
        else {
            panic!()
        };
        assert_eq!(r.outcome, Ok(serde_json::json!(["btcusdt@trade"])));
        let StreamEvent::Reply(r) = parse_frame(
            r#"{"error":{"code":2,"msg":"Invalid request: unknown variant"},"id":null}"#,
        )
        .unwrap() else {
            panic!()
        };
        assert_eq!(r.id, None);
        assert_eq!(
            r.outcome,
            Err(BinanceError { code: 2, msg: "Invalid request: unknown variant".into() })
        );
        assert_eq!(serde_json::to_string(&WsReply::ok(1)).unwrap(), r#"{"result":null,"id":1}"#);

        let req = WsRequest::subscribe(&["btcusdt@kline_1m", "btcusdt@depth@100ms"], 1);
        assert_eq!(
            serde_json::to_string(&req).unwrap(),
            r#"{"method":"SUBSCRIBE","params":["btcusdt@kline_1m","btcusdt@depth@100ms"],"id":1}"#
        );
        let back: WsRequest =
            parse_body(r#"{"method":"UNSUBSCRIBE","params":["btcusdt@trade"],"id":7}"#).unwrap();
        assert_eq!(back, WsRequest::unsubscribe(&["btcusdt@trade"], 7));
        assert_eq!(back.streams().collect::<Vec<_>>(), ["btcusdt@trade"]);
        let list: WsRequest = parse_body(r#"{"method":"LIST_SUBSCRIPTIONS","id":3}"#).unwrap();
        assert_eq!(list.method, WsMethod::ListSubscriptions);
    }

    #[test]
    fn malformed_frames_name_what_is_wrong() {
        let field = |text: &str| match parse_frame(text) {
            Err(WireError::Field { field, msg }) => (field, msg),
            other => panic!("{text}: {other:?}"),
        };
        let (f, m) = field(&SPOT_TRADE.replace(r#""p":"2683.80000000""#, r#""p":"2683.8x""#));
        assert_eq!(f, "p");
        assert!(m.contains("invalid character 'x'"), "{m}");
        let (f, m) = field(&SPOT_TRADE.replace(r#""q":"0.00200000""#, r#""q":0.002"#));
        assert_eq!(f, "q");
        assert!(m.contains("decimal string"), "{m}");
        let (f, _) = field(&FUT_DEPTH.replace(r#"["7.6220","3284"]"#, r#"["7.6220","3284","9"]"#));
        assert_eq!(f, "a");
        let (f, m) = field(&SPOT_DEPTH.replace(r#""U":499869753,"#, ""));
        assert_eq!((f.as_str(), m.as_str()), ("U", "missing"));
        let (f, m) = field(&SPOT_KLINE.replace(r#""h":"0.35280000""#, r#""h":"0.000000001""#));
        assert_eq!(f, "h");
        assert!(m.contains("decimal places"), "{m}");
        let (f, _) = field(&SPOT_KLINE.replace(r#""i":"1m""#, r#""i":"1w""#));
        assert_eq!(f, "i");
        let (f, _) = field(&SPOT_TRADE.replace(r#""t":1520538925"#, r#""t":-5"#));
        assert_eq!(f, "t");
        assert_eq!(field(r#"{"stream":"x@trade"}"#).0, "data");

        assert!(matches!(
            parse_frame(r#"{"stream":"a@trade","data":{"e":"tra"#),
            Err(WireError::Syntax { .. })
        ));
        assert!(matches!(parse_frame("not json"), Err(WireError::Syntax { .. })));
        assert!(matches!(
            parse_frame(r#"{"stream":"a@trade","data":5}"#),
            Err(WireError::Field { .. })
        ));
        assert!(matches!(
            parse_frame(r#"{"stream":"a@trade","data":{"e":"trade"}}"#),
            Err(WireError::Field { .. })
        ));
        assert!(matches!(parse_frame("[1,2"), Err(WireError::Syntax { .. })));
        assert!(matches!(parse_frame("5"), Err(WireError::Shape { .. })));
        assert!(matches!(parse_frame(r#"{"hello":1}"#), Err(WireError::UnknownFrame(_))));
        assert!(matches!(parse_frame(""), Err(WireError::Syntax { .. })));
        // inconsistent values
        let swapped =
            SPOT_DEPTH.replace(r#""U":499869753,"u":499869754"#, r#""U":499869755,"u":499869754"#);
        assert!(matches!(
            parse_frame(&swapped),
            Err(WireError::Invalid { what: "depthUpdate", .. })
        ));
        let low_high = SPOT_KLINE.replace(r#""l":"0.35220000""#, r#""l":"0.4""#);
        assert!(matches!(parse_frame(&low_high), Err(WireError::Invalid { what: "kline", .. })));
        let misaligned = SPOT_KLINE.replace(r#""t":1633998480000"#, r#""t":1633998480001"#);
        assert!(matches!(parse_frame(&misaligned), Err(WireError::Invalid { what: "kline", .. })));
    }

    #[test]
    fn rest_kline_rows() {
        let body = r#"[[1577836800000,"7195.24000000","7196.25000000","7183.14000000","7186.68000000","51.64281200",1577836859999,"371233.51835535",493,"19.59823000","140888.41428273","0"]]"#;
        let rows: Vec<RestKline> = parse_body(body).unwrap();
        let k = &rows[0];
        assert_eq!(
            k.candle,
            Candle::one_minute(
                1577836800000,
                p("7195.24"),
                p("7196.25"),
                p("7183.14"),
                p("7186.68"),
                Volume::parse("51.642812").unwrap(),
                493
            )
        );
        assert_eq!(k.close_time, 1577836859999);
        assert_eq!(k.quote_volume, Volume::parse("371233.51835535").unwrap());
        let again: Vec<RestKline> = parse_body(&serde_json::to_string(&rows).unwrap()).unwrap();
        assert_eq!(&again, &rows);
        // a daily row spans 1440 minutes
        let day = r#"[[1577836800000,"1","1","1","1","0",1577923199999,"0",0,"0","0","0"]]"#;
        assert_eq!(parse_body::<Vec<RestKline>>(day).unwrap()[0].candle.minutes, 1440);
        // errors name the column
        let bad = body.replace(r#""7196.25000000""#, r#""7196.2.5""#);
        let e = parse_body::<Vec<RestKline>>(&bad).unwrap_err().to_string();
        assert!(e.contains("element 2 (high)"), "{e}");
        let short = r#"[[1577836800000,"1","1","1","1"]]"#;
        let e = parse_body::<Vec<RestKline>>(short).unwrap_err().to_string();
        assert!(e.contains("missing volume"), "{e}");
    }

    #[test]
    fn wide_volumes_parse_exactly() {
        assert_eq!(
            parse_volume("123456789012345.12345678").unwrap().raw(),
            12_345_678_901_234_512_345_678
        );
        assert_eq!(parse_volume("92233720369").unwrap().raw(), 9_223_372_036_900_000_000);
        assert_eq!(parse_volume("1e30"), Err(ParseDecimalError::InvalidChar('e')));
        assert_eq!(
            parse_volume("99999999999999999999.000000001"),
            Err(ParseDecimalError::TooPrecise)
        );
        assert_eq!(parse_volume("-99999999999999999999"), Err(ParseDecimalError::Negative));
        assert_eq!(parse_volume(&"9".repeat(40)), Err(ParseDecimalError::OutOfRange));
    }

    #[test]
    fn rest_bodies() {
        let info = r#"{"timezone":"UTC","serverTime":1565246363776,"rateLimits":[{"rateLimitType":"REQUEST_WEIGHT","interval":"MINUTE","intervalNum":1,"limit":6000}],"exchangeFilters":[],
            "symbols":[{"symbol":"ETHBTC","status":"TRADING","baseAsset":"ETH","baseAssetPrecision":8,"quoteAsset":"BTC","quotePrecision":8,
            "filters":[{"filterType":"PRICE_FILTER","minPrice":"0.00000100","maxPrice":"100000.00000000","tickSize":"0.00000100"},
                       {"filterType":"LOT_SIZE","minQty":"0.00100000","maxQty":"100000.00000000","stepSize":"0.00100000"},
                       {"filterType":"PERCENT_PRICE_BY_SIDE","bidMultiplierUp":"5","askMultiplierDown":"0.2","avgPriceMins":5}]}]}"#;
        let info: ExchangeInfo = parse_body(info).unwrap();
        assert_eq!(info.rate_limits[0].limit, 6000);
        let s = info.symbol("ETHBTC").unwrap();
        assert!(s.is_trading());
        assert_eq!(s.tick_size(), Some(p("0.000001")));
        assert_eq!(s.step_size(), Some(q("0.001")));
        assert_eq!(s.filters[2], SymbolFilter::Other);
        assert_eq!(s.instrument("binance", Market::Spot).to_string(), "binance:spot:ETH/BTC");
        let bad = r#"{"symbols":[{"symbol":"X","status":"TRADING","baseAsset":"A","quoteAsset":"B","filters":[{"filterType":"PRICE_FILTER","minPrice":"0","maxPrice":"0","tickSize":"-"}]}]}"#;
        assert!(matches!(
            parse_body::<ExchangeInfo>(bad),
            Err(WireError::Field { .. } | WireError::Shape { .. })
        ));

        let err: BinanceError = parse_body(r#"{"code":-1121,"msg":"Invalid symbol."}"#).unwrap();
        assert_eq!(err, BinanceError { code: -1121, msg: "Invalid symbol.".into() });
        assert_eq!(
            parse_body::<ServerTime>(r#"{"serverTime":1499827319559}"#).unwrap().server_time,
            1499827319559
        );
        let depth: DepthBody = parse_body(
            r#"{"lastUpdateId":1027024,"bids":[["4.00000000","431.00000000"]],"asks":[["4.00000200","12.00000000"]]}"#,
        )
        .unwrap();
        let snap = depth.clone().into_snapshot();
        assert_eq!(snap.last_update_id, 1027024);
        assert_eq!(snap.asks, vec![Level::new(p("4.000002"), q("12"))]);
        assert_eq!(
            parse_body::<DepthBody>(
                &serde_json::to_string(&DepthBody::from_snapshot(&snap)).unwrap()
            )
            .unwrap(),
            depth
        );
        let e = parse_body::<DepthBody>(r#"{"lastUpdateId":1,"bids":[["4","x"]],"asks":[]}"#)
            .unwrap_err();
        assert_eq!(
            e,
            WireError::Field {
                field: "bids".into(),
                msg: "invalid character 'x' in number".into()
            }
        );
    }

    #[test]
    fn names() {
        let inst: InstrumentId = "binance:spot:BTC/USDT".parse().unwrap();
        assert_eq!(symbol_of(&inst).unwrap(), "BTCUSDT");
        let fut: InstrumentId = "binance:futures:eth/usdt".parse().unwrap();
        assert_eq!(symbol_of(&fut).unwrap(), "ETHUSDT");
        let stock: InstrumentId = "sse:stock:600536".parse().unwrap();
        assert!(matches!(symbol_of(&stock), Err(WireError::Name { .. })));
        assert_eq!(split_symbol("BTCUSDT"), Some(("BTC", "USDT")));
        assert_eq!(split_symbol("ETHFDUSD"), Some(("ETH", "FDUSD")));
        assert_eq!(split_symbol("LRCBTC"), Some(("LRC", "BTC")));
        assert_eq!(split_symbol("USDT"), None);

        for (name, kind) in [
            ("btcusdt@kline_1m", StreamKind::Kline(Timeframe::M1)),
            ("btcusdt@kline_1d", StreamKind::Kline(Timeframe::D1)),
            ("btcusdt@depth", StreamKind::Depth { update_ms: None }),
            ("btcusdt@depth@100ms", StreamKind::Depth { update_ms: Some(100) }),
            (
                "btcusdt@depth20@100ms",
                StreamKind::PartialDepth { levels: 20, update_ms: Some(100) },
            ),
            ("btcusdt@depth5", StreamKind::PartialDepth { levels: 5, update_ms: None }),
            ("btcusdt@trade", StreamKind::Trade),
            ("btcusdt@aggTrade", StreamKind::AggTrade),
            ("btcusdt@bookTicker", StreamKind::BookTicker),
        ] {
            let parsed: StreamName = name.parse().unwrap();
            assert_eq!(parsed, StreamName::new("BTCUSDT", kind));
            assert_eq!(parsed.to_string(), name);
        }
        for bad in [
            "btcusdt",
            "@trade",
            "btcusdt@kline_1w",
            "btcusdt@depth15",
            "btcusdt@depth@fast",
            "btcusdt@ticker",
            "btc/usdt@trade",
        ] {
            assert!(bad.parse::<StreamName>().is_err(), "{bad}");
        }
        assert!(is_partial_depth_stream("btcusdt@depth10@100ms"));
        assert!(!is_partial_depth_stream("btcusdt@depth@100ms"));
        assert_eq!(combined_path(&["a@trade", "b@trade"]), "stream?streams=a@trade/b@trade");
    }
}
