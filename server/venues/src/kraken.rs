//! Kraken spot public WebSocket: v2 (`wss://ws.kraken.com/v2`, JSON objects) and v1 (JSON
//! arrays, as recorded archives still hold it). Both arrive on [`Dialect::Kraken`]; a frame whose
//! first non-space byte is `[` is v1.
//!
//! v2: `{"channel":"book","type":"snapshot"|"update","data":[{"symbol":"BTC/USD","bids":[{"price":
//! 45283.5,"qty":0.1}],"asks":[…],"checksum":3310070434,"timestamp":"…Z"}]}`, and the `trade`,
//! `ohlc`, `ticker`, `instrument`, `heartbeat` and `status` channels; answers to our requests are
//! `{"method":"subscribe"|"pong"|…,"success":…,"error":…}`. Prices and quantities are JSON
//! numbers: their text is read exactly ([`plain_decimal`] moves an exponent's digits, no float
//! is involved). That text is the shortest float form (`0.566` for a pair printed with 4 places),
//! so it does not say how Kraken pads numbers for its checksum: v2 books carry no
//! [`shared::venue::PrintedLevels`], and the caller gives `VenueSyncConfig::price_format` /
//! `qty_format` from the `instrument` channel's precisions.
//!
//! v1: `[channelID, {"as":[[price, volume, time]…],"bs":[…]}, "book-10", "XBT/USD"]` (snapshot),
//! `[channelID, {"a":[[price, volume, time(, "r")]…]}, ({"b":[…],"c":"checksum"},) "book-10",
//! "XBT/USD"]` (update; `"r"` marks a republished level, applied like any other), `trade`,
//! `ohlc-N`, and `{"event":…}` objects. Prices and volumes are padded strings (`"0.10000000"`),
//! so their printed form is learnt from them and the checksum needs no instrument metadata.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use shared::book::Level;
use shared::trade::{TakerSide, Trade, TradeId};
use shared::venue::{Dialect, PrintedLevels};
use shared::{ParseDecimalError, Price, Qty};

use crate::{
    bounded, candle, clip, int_str, invalid, json_error, parse_price, parse_qty, parse_rfc3339_ms,
    set_once, BookFrame, CandleFrame, InstrumentFrame, Message, Payload, StrLevels, TickerFrame,
    WireError, MAX_ITEMS, MAX_LEVELS,
};

const D: Dialect = Dialect::Kraken;

/// Books one v2 push may carry ("The book element is always the first and only item in the data
/// payload", Kraken's docs; a few allowed).
const MAX_BOOKS: usize = 16;
/// Entries of the v2 `status` channel's data.
const MAX_STATUS: usize = 16;
/// Elements of a v1 array frame: the channel id, one or two payloads, the channel name, the pair.
const MAX_V1_ELEMENTS: usize = 5;
/// Entries of one v1 trade: price, volume, time, side, order type, misc and the trade id.
const MAX_V1_TRADE_ENTRIES: usize = 7;
/// The largest exponent [`plain_decimal`] moves digits by: no price or quantity is further from 1
/// than 10^±40, and the plain text stays short.
const MAX_EXPONENT: u32 = 40;

/// Reads one Kraken frame (v2 object or v1 array) into `out`.
pub fn parse(frame: &str, out: &mut Vec<Message>) -> Result<(), WireError> {
    match frame.trim_start_matches([' ', '\t', '\n', '\r']).as_bytes().first() {
        Some(b'[') => v1(frame, out),
        _ => object(frame, out),
    }
}

/// The subscribe request of v2 `channel` for `symbols` (none for `instrument`), with the book
/// depth (10, 25, 100, 500 or 1000) where given. `ohlc` is subscribed with Kraken's default
/// interval, 1 minute.
pub fn subscribe_v2(channel: &str, symbols: &[&str], depth: Option<u32>) -> String {
    let mut params = serde_json::Map::new();
    params.insert("channel".into(), channel.into());
    if !symbols.is_empty() {
        params.insert("symbol".into(), symbols.into());
    }
    if let Some(depth) = depth {
        params.insert("depth".into(), depth.into());
    }
    serde_json::json!({"method": "subscribe", "params": params}).to_string()
}

/// The v2 application-level ping; Kraken answers `{"method":"pong",…}`.
pub fn ping_v2() -> String {
    serde_json::json!({"method": "ping"}).to_string()
}

// ---------------------------------------------------------------------------------------------
// exact numbers

/// The plain decimal of a JSON number's text: `1.5e-7` → `0.00000015`, `4E+2` → `400`, `-2.5e1`
/// → `-25`; text without an exponent is returned as it is. The digits are moved, never computed,
/// so the result is exact; whether it fits millrace's 8 decimals is for `Price::parse` /
/// `Qty::parse` to say. An exponent beyond ±40 is refused.
pub fn plain_decimal(s: &str) -> Result<Cow<'_, str>, String> {
    let Some(e) = s.bytes().position(|b| b == b'e' || b == b'E') else {
        return Ok(Cow::Borrowed(s));
    };
    let (mantissa, exponent) = (&s[..e], &s[e + 1..]);
    let (negative, exponent_digits) = match exponent.as_bytes().first() {
        Some(b'-') => (true, &exponent[1..]),
        Some(b'+') => (false, &exponent[1..]),
        _ => (false, exponent),
    };
    if exponent_digits.is_empty() || !exponent_digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("exponent {:?} is not an integer", clip(exponent)));
    }
    let significant = exponent_digits.trim_start_matches('0');
    let magnitude = match significant.len() {
        0 => 0,
        1..=3 => significant.parse::<u32>().unwrap_or(u32::MAX),
        _ => u32::MAX,
    };
    if magnitude > MAX_EXPONENT {
        return Err(format!("exponent {:?} is beyond ±{MAX_EXPONENT}", clip(exponent)));
    }
    let (sign, unsigned) = match mantissa.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", mantissa),
    };
    let (int, frac) = unsigned.split_once('.').unwrap_or((unsigned, ""));
    if int.is_empty()
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
        || (unsigned.contains('.') && frac.is_empty())
    {
        return Err(format!("mantissa {:?} is not a decimal", clip(mantissa)));
    }
    // the digits with the point after `point` of them (negative: zeros before them)
    let digits = [int, frac].concat();
    let point =
        int.len() as i64 + if negative { -i64::from(magnitude) } else { i64::from(magnitude) };
    let mut out = String::with_capacity(digits.len() + MAX_EXPONENT as usize + 3);
    out.push_str(sign);
    if point <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', point.unsigned_abs() as usize));
        out.push_str(&digits);
    } else if point as usize >= digits.len() {
        out.push_str(&digits);
        out.extend(std::iter::repeat_n('0', point as usize - digits.len()));
    } else {
        let (a, b) = digits.split_at(point as usize);
        out.push_str(a);
        out.push('.');
        out.push_str(b);
    }
    Ok(Cow::Owned(out))
}

/// The text of a number: a JSON number's own text, or a JSON string's contents (the docs' own
/// copies of v2 books sometimes quote them); nothing else.
fn number_text(raw: &RawValue) -> Result<&str, String> {
    let t = raw.get();
    match t.as_bytes().first() {
        Some(b'-' | b'0'..=b'9') => Ok(t),
        Some(b'"') if t.len() >= 2 && !t.contains('\\') => Ok(&t[1..t.len() - 1]),
        _ => Err(format!("{:?} is not a number", clip(t))),
    }
}

/// The plain decimal text of a number or numeric string.
fn decimal(raw: &RawValue) -> Result<Cow<'_, str>, String> {
    plain_decimal(number_text(raw)?)
}

fn number_error(field: &'static str, raw: &RawValue, detail: String) -> WireError {
    WireError::Number { dialect: D, field, value: clip(raw.get()).to_string(), detail }
}

/// A positive price from a number, the field named on error.
fn price(field: &'static str, raw: &RawValue) -> Result<Price, WireError> {
    decimal(raw).and_then(|s| parse_price(&s)).map_err(|e| number_error(field, raw, e))
}

/// A non-negative quantity from a number, the field named on error.
fn qty(field: &'static str, raw: &RawValue) -> Result<Qty, WireError> {
    decimal(raw).and_then(|s| parse_qty(&s)).map_err(|e| number_error(field, raw, e))
}

/// An RFC 3339 UTC time in ms, the field named on error.
fn rfc3339(field: &'static str, s: &str) -> Result<i64, WireError> {
    parse_rfc3339_ms(s).ok_or_else(|| WireError::Number {
        dialect: D,
        field,
        value: clip(s).to_string(),
        detail: "not an RFC 3339 UTC time".into(),
    })
}

/// v2 book levels, `[{"price":…,"qty":…}, …]`, read in one pass into fixed point; at most
/// [`MAX_LEVELS`].
#[derive(Debug, Default)]
struct NumLevels(Vec<Level>);

#[derive(Deserialize)]
struct NumLevel<'a> {
    #[serde(borrow)]
    price: &'a RawValue,
    #[serde(borrow)]
    qty: &'a RawValue,
}

impl<'de> Deserialize<'de> for NumLevels {
    fn deserialize<De: serde::Deserializer<'de>>(d: De) -> Result<Self, De::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = NumLevels;
            fn expecting(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str("a list of {price, qty} levels")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<NumLevels, A::Error> {
                let mut levels = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(MAX_LEVELS));
                while let Some(l) = seq.next_element::<NumLevel<'de>>()? {
                    if levels.len() == MAX_LEVELS {
                        return Err(serde::de::Error::custom(format_args!(
                            "more than {MAX_LEVELS} book levels"
                        )));
                    }
                    let p = decimal(l.price)
                        .and_then(|s| parse_price(&s))
                        .map_err(serde::de::Error::custom)?;
                    let q = decimal(l.qty)
                        .and_then(|s| parse_qty(&s))
                        .map_err(serde::de::Error::custom)?;
                    levels.push(Level::new(p, q));
                }
                Ok(NumLevels(levels))
            }
        }
        d.deserialize_seq(Visitor)
    }
}

// ---------------------------------------------------------------------------------------------
// objects: v2 pushes and answers, v1 events

struct Object<'a> {
    channel: Option<Cow<'a, str>>,
    kind: Option<Cow<'a, str>>,
    /// A book's data is read with the envelope (`channel` comes first in Kraken's pushes).
    data: Option<Payload<'a, Vec<BookData<'a>>>>,
    method: Option<Cow<'a, str>>,
    success: Option<bool>,
    error: Option<Cow<'a, str>>,
    result: Option<&'a RawValue>,
    // v1 events
    event: Option<Cow<'a, str>>,
    status: Option<Cow<'a, str>>,
    error_message: Option<Cow<'a, str>>,
    channel_name: Option<Cow<'a, str>>,
    pair: Option<Cow<'a, str>>,
}

impl<'de> Deserialize<'de> for Object<'de> {
    fn deserialize<De: serde::Deserializer<'de>>(d: De) -> Result<Self, De::Error> {
        #[derive(Deserialize)]
        #[serde(field_identifier)]
        enum Field {
            #[serde(rename = "channel")]
            Channel,
            #[serde(rename = "type")]
            Kind,
            #[serde(rename = "data")]
            Data,
            #[serde(rename = "method")]
            Method,
            #[serde(rename = "success")]
            Success,
            #[serde(rename = "error")]
            Error,
            #[serde(rename = "result")]
            Result,
            #[serde(rename = "event")]
            Event,
            #[serde(rename = "status")]
            Status,
            #[serde(rename = "errorMessage")]
            ErrorMessage,
            #[serde(rename = "channelName")]
            ChannelName,
            #[serde(rename = "pair")]
            Pair,
            #[serde(other)]
            Other,
        }
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Object<'de>;
            fn expecting(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str("a Kraken object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Object<'de>, A::Error> {
                let mut o = Object {
                    channel: None,
                    kind: None,
                    data: None,
                    method: None,
                    success: None,
                    error: None,
                    result: None,
                    event: None,
                    status: None,
                    error_message: None,
                    channel_name: None,
                    pair: None,
                };
                while let Some(field) = map.next_key::<Field>()? {
                    match field {
                        Field::Channel => {
                            if let Some(v) = map.next_value()? {
                                set_once(&mut o.channel, v, "channel")?
                            }
                        }
                        Field::Kind => {
                            if let Some(v) = map.next_value()? {
                                set_once(&mut o.kind, v, "type")?
                            }
                        }
                        Field::Data => {
                            let book = o.channel.as_deref() == Some("book");
                            if let Some(v) = Payload::next_value(&mut map, book)? {
                                set_once(&mut o.data, v, "data")?
                            }
                        }
                        Field::Method => {
                            if let Some(v) = map.next_value()? {
                                set_once(&mut o.method, v, "method")?
                            }
                        }
                        Field::Success => {
                            if let Some(v) = map.next_value()? {
                                set_once(&mut o.success, v, "success")?
                            }
                        }
                        Field::Error => {
                            if let Some(v) = map.next_value()? {
                                set_once(&mut o.error, v, "error")?
                            }
                        }
                        Field::Result => {
                            if let Some(v) = map.next_value()? {
                                set_once(&mut o.result, v, "result")?
                            }
                        }
                        Field::Event => {
                            if let Some(v) = map.next_value()? {
                                set_once(&mut o.event, v, "event")?
                            }
                        }
                        Field::Status => {
                            if let Some(v) = map.next_value()? {
                                set_once(&mut o.status, v, "status")?
                            }
                        }
                        Field::ErrorMessage => {
                            if let Some(v) = map.next_value()? {
                                set_once(&mut o.error_message, v, "errorMessage")?
                            }
                        }
                        Field::ChannelName => {
                            if let Some(v) = map.next_value()? {
                                set_once(&mut o.channel_name, v, "channelName")?
                            }
                        }
                        Field::Pair => {
                            if let Some(v) = map.next_value()? {
                                set_once(&mut o.pair, v, "pair")?
                            }
                        }
                        Field::Other => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                        }
                    }
                }
                Ok(o)
            }
        }
        d.deserialize_map(V)
    }
}

#[derive(Deserialize)]
struct BookData<'a> {
    #[serde(borrow)]
    symbol: Cow<'a, str>,
    #[serde(default)]
    bids: NumLevels,
    #[serde(default)]
    asks: NumLevels,
    #[serde(default)]
    checksum: Option<u64>,
    #[serde(borrow, default)]
    timestamp: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct TradeData<'a> {
    #[serde(borrow)]
    symbol: Cow<'a, str>,
    #[serde(borrow)]
    side: Cow<'a, str>,
    #[serde(borrow)]
    price: &'a RawValue,
    #[serde(borrow)]
    qty: &'a RawValue,
    trade_id: TradeId,
    #[serde(borrow)]
    timestamp: Cow<'a, str>,
}

#[derive(Deserialize)]
struct OhlcData<'a> {
    #[serde(borrow)]
    symbol: Cow<'a, str>,
    #[serde(borrow)]
    open: &'a RawValue,
    #[serde(borrow)]
    high: &'a RawValue,
    #[serde(borrow)]
    low: &'a RawValue,
    #[serde(borrow)]
    close: &'a RawValue,
    #[serde(default)]
    trades: u64,
    #[serde(borrow)]
    volume: &'a RawValue,
    #[serde(borrow)]
    interval_begin: Cow<'a, str>,
    interval: u32,
}

#[derive(Deserialize)]
struct TickerData<'a> {
    #[serde(borrow)]
    symbol: Cow<'a, str>,
    #[serde(borrow, default)]
    bid: Option<&'a RawValue>,
    #[serde(borrow, default)]
    bid_qty: Option<&'a RawValue>,
    #[serde(borrow, default)]
    ask: Option<&'a RawValue>,
    #[serde(borrow, default)]
    ask_qty: Option<&'a RawValue>,
    #[serde(borrow, default)]
    timestamp: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct InstrumentData<'a> {
    #[serde(borrow, default)]
    pairs: Vec<PairData<'a>>,
}

#[derive(Deserialize)]
struct PairData<'a> {
    #[serde(borrow)]
    symbol: Cow<'a, str>,
    #[serde(default)]
    price_precision: Option<u64>,
    #[serde(default)]
    qty_precision: Option<u64>,
    #[serde(borrow, default)]
    price_increment: Option<&'a RawValue>,
    #[serde(borrow, default)]
    qty_increment: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct StatusData<'a> {
    #[serde(borrow, default)]
    system: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct AckResult<'a> {
    #[serde(borrow, default)]
    channel: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    symbol: Option<Cow<'a, str>>,
}

fn object(frame: &str, out: &mut Vec<Message>) -> Result<(), WireError> {
    let o: Object<'_> = serde_json::from_str(frame).map_err(|e| json_error(D, e))?;
    if let Some(event) = &o.event {
        return v1_event(event, &o, out);
    }
    if o.method.is_some() || o.success.is_some() {
        return answer(&o, out);
    }
    let Some(channel) = &o.channel else {
        return Err(invalid(D, "an object needs `channel`, `method` or `event`"));
    };
    let needs_data = || invalid(D, format!("a {} push needs `data`", clip(channel)));
    let data = || o.data.as_ref().ok_or_else(needs_data)?.raw(D);
    match &**channel {
        "book" => {
            let snapshot = match o.kind.as_deref() {
                Some("snapshot") => true,
                Some("update") => false,
                other => {
                    return Err(invalid(D, format!("unknown book type {:?}", other.map(clip))))
                }
            };
            let books = o.data.ok_or_else(needs_data)?.read(D)?;
            bounded(D, "book entries", books.len(), MAX_BOOKS)?;
            for b in books {
                out.push(Message::Book(v2_book(snapshot, b)?));
            }
        }
        "trade" => {
            let rows: Vec<TradeData<'_>> =
                serde_json::from_str(data()?.get()).map_err(|e| json_error(D, e))?;
            bounded(D, "trades", rows.len(), MAX_ITEMS)?;
            let mut groups: Vec<(Cow<'_, str>, Vec<Trade>)> = Vec::new();
            for t in rows {
                let trade = v2_trade(&t)?;
                match groups.iter_mut().rev().find(|(s, _)| *s == t.symbol) {
                    Some((_, trades)) => trades.push(trade),
                    None => groups.push((t.symbol, vec![trade])),
                }
            }
            out.extend(
                groups.into_iter().map(|(symbol, trades)| Message::Trades {
                    symbol: symbol.into_owned(),
                    trades,
                }),
            );
        }
        "ohlc" => {
            let rows: Vec<OhlcData<'_>> =
                serde_json::from_str(data()?.get()).map_err(|e| json_error(D, e))?;
            bounded(D, "candles", rows.len(), MAX_ITEMS)?;
            for r in rows {
                out.push(Message::Candle(v2_candle(r)?));
            }
        }
        "ticker" => {
            let rows: Vec<TickerData<'_>> =
                serde_json::from_str(data()?.get()).map_err(|e| json_error(D, e))?;
            bounded(D, "tickers", rows.len(), MAX_ITEMS)?;
            for t in rows {
                out.push(Message::Ticker(v2_ticker(t)?));
            }
        }
        "instrument" => {
            let data: InstrumentData<'_> =
                serde_json::from_str(data()?.get()).map_err(|e| json_error(D, e))?;
            bounded(D, "instrument pairs", data.pairs.len(), MAX_ITEMS)?;
            for p in data.pairs {
                out.push(Message::Instrument(instrument(p)?));
            }
        }
        "heartbeat" => out.push(Message::Heartbeat),
        "status" => {
            let rows: Vec<StatusData<'_>> = match &o.data {
                Some(d) => serde_json::from_str(d.raw(D)?.get()).map_err(|e| json_error(D, e))?,
                None => Vec::new(),
            };
            bounded(D, "status entries", rows.len(), MAX_STATUS)?;
            let system = rows.iter().find_map(|r| r.system.as_deref()).unwrap_or("");
            out.push(Message::Ack { detail: format!("status {}", clip(system)).trim_end().into() });
        }
        other => out.push(Message::Ignored { channel: clip(other).to_string() }),
    }
    Ok(())
}

/// An answer to one of our requests (`subscribe`, `unsubscribe`, `ping`, …).
fn answer(o: &Object<'_>, out: &mut Vec<Message>) -> Result<(), WireError> {
    let method = o.method.as_deref().unwrap_or("");
    if o.success == Some(false) {
        out.push(refused(o.error.as_deref().unwrap_or("")));
        return Ok(());
    }
    if method == "pong" {
        out.push(Message::Heartbeat);
        return Ok(());
    }
    // what was accepted, for the log only: a result of another shape is not an error
    let result = o.result.and_then(|r| serde_json::from_str::<AckResult<'_>>(r.get()).ok());
    let mut detail = clip(method).to_string();
    for part in [
        result.as_ref().and_then(|r| r.channel.as_deref()),
        result.as_ref().and_then(|r| r.symbol.as_deref()),
    ]
    .into_iter()
    .flatten()
    {
        detail.push(' ');
        detail.push_str(clip(part));
    }
    out.push(Message::Ack { detail });
    Ok(())
}

/// Kraken's error text as a refusal: the code is its category (`EGeneral` of
/// `EGeneral:Invalid arguments`) where it has one.
fn refused(error: &str) -> Message {
    let lower = error.to_ascii_lowercase();
    let code = match error.split_once(':') {
        Some((c, _)) if c.starts_with('E') && c.bytes().all(|b| b.is_ascii_alphanumeric()) => {
            clip(c).to_string()
        }
        _ => String::new(),
    };
    Message::Refused {
        code,
        message: clip(error).to_string(),
        rate_limited: lower.contains("rate limit") || lower.contains("exceeded msg rate"),
    }
}

fn v1_event(event: &str, o: &Object<'_>, out: &mut Vec<Message>) -> Result<(), WireError> {
    match event {
        "heartbeat" | "pong" => out.push(Message::Heartbeat),
        "subscriptionStatus" => match o.status.as_deref() {
            Some("error") => out.push(refused(o.error_message.as_deref().unwrap_or(""))),
            status => {
                let mut detail = clip(status.unwrap_or("subscriptionStatus")).to_string();
                for part in [o.channel_name.as_deref(), o.pair.as_deref()].into_iter().flatten() {
                    detail.push(' ');
                    detail.push_str(clip(part));
                }
                out.push(Message::Ack { detail });
            }
        },
        "systemStatus" => out.push(Message::Ack {
            detail: format!("systemStatus {}", clip(o.status.as_deref().unwrap_or("")))
                .trim_end()
                .into(),
        }),
        "error" => out.push(refused(o.error_message.as_deref().unwrap_or(""))),
        other => out.push(Message::Ignored { channel: clip(other).to_string() }),
    }
    Ok(())
}

fn v2_book(snapshot: bool, b: BookData<'_>) -> Result<BookFrame, WireError> {
    let checksum = b
        .checksum
        .map(|c| {
            u32::try_from(c).map_err(|_| WireError::Number {
                dialect: D,
                field: "checksum",
                value: c.to_string(),
                detail: "not an unsigned 32-bit integer".into(),
            })
        })
        .transpose()?;
    Ok(BookFrame {
        symbol: b.symbol.into_owned(),
        // the subscription's depth is the caller's
        depth: None,
        snapshot,
        seq: None,
        prev_seq: None,
        cross_seq: None,
        bids: b.bids.0,
        asks: b.asks.0,
        checksum,
        // JSON numbers do not carry Kraken's padding: the caller gives the precisions
        printed: None,
        time_ms: b.timestamp.as_deref().map(|t| rfc3339("timestamp", t)).transpose()?,
    })
}

fn v2_trade(t: &TradeData<'_>) -> Result<Trade, WireError> {
    Ok(Trade {
        id: t.trade_id.clone(),
        time_ms: rfc3339("timestamp", &t.timestamp)?,
        price: price("price", t.price)?,
        qty: qty("qty", t.qty)?,
        taker: Some(match &*t.side {
            "buy" => TakerSide::Buy,
            "sell" => TakerSide::Sell,
            other => return Err(invalid(D, format!("unknown trade side {:?}", clip(other)))),
        }),
    })
}

fn v2_candle(r: OhlcData<'_>) -> Result<CandleFrame, WireError> {
    if r.interval == 0 {
        return Err(invalid(D, "ohlc interval 0"));
    }
    let text = |field, raw: &RawValue| -> Result<String, WireError> {
        decimal(raw).map(Cow::into_owned).map_err(|e| number_error(field, raw, e))
    };
    let [o, h, l, c] = [
        text("open", r.open)?,
        text("high", r.high)?,
        text("low", r.low)?,
        text("close", r.close)?,
    ];
    let volume = text("volume", r.volume)?;
    let open_time = rfc3339("interval_begin", &r.interval_begin)?;
    Ok(CandleFrame {
        symbol: r.symbol.into_owned(),
        minutes: r.interval,
        candle: candle(D, open_time, r.interval, [&o, &h, &l, &c], &volume, r.trades)?,
        // Kraken does not say: a candle is closed when the next one begins
        closed: None,
    })
}

fn v2_ticker(t: TickerData<'_>) -> Result<TickerFrame, WireError> {
    let level = |p: Option<&RawValue>, pf, q: Option<&RawValue>, qf| match (p, q) {
        (Some(p), Some(q)) => Ok::<_, WireError>(Some(Level::new(price(pf, p)?, qty(qf, q)?))),
        _ => Ok(None),
    };
    Ok(TickerFrame {
        symbol: t.symbol.into_owned(),
        bid: level(t.bid, "bid", t.bid_qty, "bid_qty")?,
        ask: level(t.ask, "ask", t.ask_qty, "ask_qty")?,
        cross_seq: None,
        time_ms: t.timestamp.as_deref().map(|s| rfc3339("timestamp", s)).transpose()?,
    })
}

/// One pair of the `instrument` channel. An increment finer than 10^-8 (which millrace's fixed
/// point cannot hold) is left out (`None`) rather than refusing the whole list of pairs; any
/// other bad number is an error.
fn instrument(p: PairData<'_>) -> Result<InstrumentFrame, WireError> {
    let decimals = |field: &'static str, v: Option<u64>| {
        v.map(|d| {
            u8::try_from(d).map_err(|_| WireError::Number {
                dialect: D,
                field,
                value: d.to_string(),
                detail: "not a number of decimals".into(),
            })
        })
        .transpose()
    };
    fn increment<T>(
        field: &'static str,
        raw: Option<&RawValue>,
        parse: fn(&str) -> Result<T, ParseDecimalError>,
        positive: fn(&T) -> bool,
    ) -> Result<Option<T>, WireError> {
        let Some(raw) = raw else { return Ok(None) };
        let text = decimal(raw).map_err(|e| number_error(field, raw, e))?;
        match parse(&text) {
            Ok(v) if positive(&v) => Ok(Some(v)),
            Ok(_) => Err(number_error(field, raw, "not positive".into())),
            Err(ParseDecimalError::TooPrecise) => Ok(None),
            Err(e) => Err(number_error(field, raw, e.to_string())),
        }
    }
    Ok(InstrumentFrame {
        price_decimals: decimals("price_precision", p.price_precision)?,
        qty_decimals: decimals("qty_precision", p.qty_precision)?,
        tick: increment("price_increment", p.price_increment, Price::parse, |p| p.raw() > 0)?,
        lot: increment("qty_increment", p.qty_increment, Qty::parse, |q| !q.is_zero())?,
        symbol: p.symbol.into_owned(),
    })
}

// ---------------------------------------------------------------------------------------------
// v1 arrays

#[derive(Deserialize)]
struct V1Book<'a> {
    #[serde(default, rename = "as")]
    snapshot_asks: Option<StrLevels>,
    #[serde(default, rename = "bs")]
    snapshot_bids: Option<StrLevels>,
    #[serde(default, rename = "a")]
    asks: Option<StrLevels>,
    #[serde(default, rename = "b")]
    bids: Option<StrLevels>,
    #[serde(borrow, default, rename = "c")]
    checksum: Option<Cow<'a, str>>,
}

fn v1(frame: &str, out: &mut Vec<Message>) -> Result<(), WireError> {
    let items: Vec<&RawValue> = serde_json::from_str(frame).map_err(|e| json_error(D, e))?;
    bounded(D, "elements of a v1 frame", items.len(), MAX_V1_ELEMENTS)?;
    let [id, payloads @ .., name, pair] = &items[..] else {
        return Err(invalid(D, "a v1 frame needs channelID, a payload, channel name and pair"));
    };
    if payloads.is_empty() {
        return Err(invalid(D, "a v1 frame needs channelID, a payload, channel name and pair"));
    }
    if !id.get().bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid(D, format!("v1 channelID {:?} is not an integer", clip(id.get()))));
    }
    let name: Cow<'_, str> = serde_json::from_str(name.get()).map_err(|e| json_error(D, e))?;
    let pair: Cow<'_, str> = serde_json::from_str(pair.get()).map_err(|e| json_error(D, e))?;
    let suffix = |prefix: &str| -> Result<Option<u32>, WireError> {
        name.strip_prefix(prefix)
            .map(|n| {
                n.parse::<u32>()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| invalid(D, format!("v1 channel {:?}", clip(&name))))
            })
            .transpose()
    };
    if let Some(depth) = suffix("book-")? {
        out.push(Message::Book(v1_book(pair.into_owned(), depth as usize, payloads)?));
    } else if let Some(minutes) = suffix("ohlc-")? {
        let [payload] = payloads else {
            return Err(invalid(D, "a v1 ohlc frame has one payload"));
        };
        out.push(Message::Candle(v1_candle(pair.into_owned(), minutes, payload)?));
    } else if name == "trade" {
        let [payload] = payloads else {
            return Err(invalid(D, "a v1 trade frame has one payload"));
        };
        let trades = v1_trades(payload)?;
        out.push(Message::Trades { symbol: pair.into_owned(), trades });
    } else {
        out.push(Message::Ignored { channel: clip(&name).to_string() });
    }
    Ok(())
}

fn v1_book(symbol: String, depth: usize, payloads: &[&RawValue]) -> Result<BookFrame, WireError> {
    let (mut snapshot, mut update) = (false, false);
    let (mut bids, mut asks) = (Vec::new(), Vec::new());
    let mut printed = PrintedLevels::default();
    let mut checksum = None;
    for p in payloads {
        let b: V1Book<'_> = serde_json::from_str(p.get()).map_err(|e| json_error(D, e))?;
        snapshot |= b.snapshot_asks.is_some() || b.snapshot_bids.is_some();
        update |= b.asks.is_some() || b.bids.is_some();
        for (is_ask, levels) in
            [(true, b.snapshot_asks), (false, b.snapshot_bids), (true, b.asks), (false, b.bids)]
        {
            let Some(levels) = levels else { continue };
            printed.price.merge(levels.printed.price);
            printed.qty.merge(levels.printed.qty);
            if is_ask { &mut asks } else { &mut bids }.extend(levels.levels);
        }
        if let Some(c) = b.checksum {
            checksum = Some(int_str::<u32>(D, "c", &c)?);
        }
    }
    if snapshot && update {
        return Err(invalid(D, "a v1 book frame mixes snapshot (as/bs) and update (a/b) levels"));
    }
    bounded(D, "book levels", bids.len() + asks.len(), MAX_LEVELS)?;
    Ok(BookFrame {
        symbol,
        depth: Some(depth),
        snapshot,
        seq: None,
        prev_seq: None,
        cross_seq: None,
        bids,
        asks,
        checksum,
        printed: Some(printed),
        time_ms: None,
    })
}

/// A JSON string's contents (without escapes: Kraken's numbers and names have none).
fn v1_str<'a>(field: &'static str, raw: &'a RawValue) -> Result<&'a str, WireError> {
    let t = raw.get();
    match t.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
        Some(s) if !s.contains('\\') => Ok(s),
        _ => Err(number_error(field, raw, "not a plain string".into())),
    }
}

/// Seconds since the epoch with a fraction (`"1534614057.321597"`) in ms; the fraction beyond
/// ms is cut.
fn secs_ms(field: &'static str, s: &str) -> Result<i64, WireError> {
    let bad = || WireError::Number {
        dialect: D,
        field,
        value: clip(s).to_string(),
        detail: "not a time in seconds".into(),
    };
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    if int.is_empty() || int.len() > 12 || !int.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let secs: i64 = int.parse().map_err(|_| bad())?;
    let mut ms = 0;
    for i in 0..3 {
        ms = ms * 10 + frac.as_bytes().get(i).map_or(0, |&c| i64::from(c - b'0'));
    }
    Ok(secs * 1000 + ms)
}

/// `[[price, volume, time, side, orderType, misc(, tradeId)], …]`. Archives from before Kraken
/// added the trade id have six entries: such a trade's id is `Text("<time>-<index in the
/// frame>")`, unique within a frame but not a sequence (so continuity of ids cannot be checked).
fn v1_trades(payload: &RawValue) -> Result<Vec<Trade>, WireError> {
    let rows: Vec<Vec<&RawValue>> =
        serde_json::from_str(payload.get()).map_err(|e| json_error(D, e))?;
    bounded(D, "trades", rows.len(), MAX_ITEMS)?;
    rows.iter()
        .enumerate()
        .map(|(i, row)| {
            bounded(D, "entries of a v1 trade", row.len(), MAX_V1_TRADE_ENTRIES)?;
            let [p, v, t, side, _order_type, _misc, rest @ ..] = &row[..] else {
                return Err(invalid(
                    D,
                    "a v1 trade needs price, volume, time, side, orderType and misc",
                ));
            };
            let time = v1_str("time", t)?;
            let id = match rest.first() {
                None => TradeId::Text(format!("{time}-{i}")),
                Some(raw) => match raw.get().as_bytes().first() {
                    Some(b'"') => TradeId::parse(v1_str("tradeId", raw)?),
                    _ => TradeId::Seq(int_str(D, "tradeId", raw.get())?),
                },
            };
            Ok(Trade {
                id,
                time_ms: secs_ms("time", time)?,
                price: parse_price(v1_str("price", p)?).map_err(|e| number_error("price", p, e))?,
                qty: parse_qty(v1_str("volume", v)?).map_err(|e| number_error("volume", v, e))?,
                taker: Some(match v1_str("side", side)? {
                    "b" => TakerSide::Buy,
                    "s" => TakerSide::Sell,
                    other => {
                        return Err(invalid(D, format!("unknown trade side {:?}", clip(other))))
                    }
                }),
            })
        })
        .collect()
}

/// `[time, etime, open, high, low, close, vwap, volume, count]`: `etime` is the end of the
/// interval, so the candle opens `minutes` before it (`etime` floored to its minute first: the
/// docs' example has a fraction after the whole second).
fn v1_candle(symbol: String, minutes: u32, payload: &RawValue) -> Result<CandleFrame, WireError> {
    let row: Vec<&RawValue> = serde_json::from_str(payload.get()).map_err(|e| json_error(D, e))?;
    let [_time, etime, o, h, l, c, _vwap, volume, count] = &row[..] else {
        return Err(invalid(
            D,
            "a v1 ohlc needs time, etime, open, high, low, close, vwap, volume and count",
        ));
    };
    let end = secs_ms("etime", v1_str("etime", etime)?)?;
    let open_time = end.div_euclid(60_000) * 60_000 - i64::from(minutes) * 60_000;
    let count = match count.get().as_bytes().first() {
        Some(b'"') => int_str(D, "count", v1_str("count", count)?)?,
        _ => int_str(D, "count", count.get())?,
    };
    let s = |field, raw| v1_str(field, raw);
    Ok(CandleFrame {
        symbol,
        minutes,
        candle: candle(
            D,
            open_time,
            minutes,
            [s("open", o)?, s("high", h)?, s("low", l)?, s("close", c)?],
            s("volume", volume)?,
            count,
        )?,
        closed: None,
    })
}

#[cfg(test)]
mod tests;
