//! Bybit API v5 public WebSocket (spot and linear, `wss://stream.bybit.com/v5/public/{spot|linear}`):
//! `orderbook.{depth}.{symbol}`, `publicTrade.{symbol}`, `kline.{interval}.{symbol}`,
//! `tickers.{symbol}`; the `op` answers (subscriptions, pongs).
//!
//! A book push (<https://bybit-exchange.github.io/docs/v5/websocket/public/orderbook>):
//! `{"topic":"orderbook.50.BTCUSDT","type":"snapshot"|"delta","ts":1672304484978,
//! "data":{"s":"BTCUSDT","b":[["16493.50","0.006"]],"a":[…],"u":18521288,"seq":7961638724},
//! "cts":1672304484976}`. `u` is one more per message of a topic and becomes
//! [`BookFrame::seq`]; `seq`, the cross sequence comparable across depths and with the tickers'
//! `cs`, becomes [`BookFrame::cross_seq`]. A delta with `u == 1` (the service restarted) is read
//! as it came, `snapshot: false`: [`shared::venue::VenueSync`] under
//! [`shared::venue::SequenceRule::Bybit`] takes it as the whole book. There is no checksum.
//!
//! Numbers the docs call `number` (`ts`, `u`, `T`, `start`) are read whether they arrive as
//! JSON numbers or as strings (the docs' own reminder prints `"ts": "1772694601512"`).

use std::borrow::Cow;

use serde::Deserialize;
use shared::book::Level;
use shared::trade::{TakerSide, Trade, TradeId};
use shared::venue::Dialect;

use crate::{
    candle, clip, invalid, json_error, parse_price, parse_qty, set_once, BookFrame, CandleFrame,
    Capped, IntText, Message, Payload, StrLevels, TickerFrame, WireError, MAX_ITEMS,
};

const D: Dialect = Dialect::Bybit;

struct Push<'a> {
    topic: Option<Cow<'a, str>>,
    kind: Option<Cow<'a, str>>,
    ts: Option<IntText<'a>>,
    cs: Option<IntText<'a>>,
    /// A book topic's data is read with the envelope (`topic` comes first in Bybit's pushes).
    data: Option<Payload<'a, BookData<'a>>>,
    success: Option<bool>,
    ret_msg: Option<Cow<'a, str>>,
    ret_code: Option<IntText<'a>>,
    op: Option<Cow<'a, str>>,
}

impl<'de> Deserialize<'de> for Push<'de> {
    fn deserialize<De: serde::Deserializer<'de>>(d: De) -> Result<Self, De::Error> {
        #[derive(Deserialize)]
        #[serde(field_identifier)]
        enum Field {
            #[serde(rename = "topic")]
            Topic,
            #[serde(rename = "type")]
            Kind,
            #[serde(rename = "ts")]
            Ts,
            #[serde(rename = "cs")]
            Cs,
            #[serde(rename = "data")]
            Data,
            #[serde(rename = "success")]
            Success,
            #[serde(rename = "ret_msg")]
            RetMsg,
            #[serde(rename = "retCode")]
            RetCode,
            #[serde(rename = "op")]
            Op,
            #[serde(other)]
            Other,
        }
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Push<'de>;
            fn expecting(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str("a Bybit push or answer")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Push<'de>, A::Error> {
                let mut p = Push {
                    topic: None,
                    kind: None,
                    ts: None,
                    cs: None,
                    data: None,
                    success: None,
                    ret_msg: None,
                    ret_code: None,
                    op: None,
                };
                while let Some(field) = map.next_key::<Field>()? {
                    match field {
                        Field::Topic => {
                            if let Some(v) = map.next_value()? {
                                set_once(&mut p.topic, v, "topic")?
                            }
                        }
                        Field::Kind => {
                            if let Some(v) = map.next_value()? {
                                set_once(&mut p.kind, v, "type")?
                            }
                        }
                        Field::Ts => {
                            if let Some(v) = map.next_value()? {
                                set_once(&mut p.ts, v, "ts")?
                            }
                        }
                        Field::Cs => {
                            if let Some(v) = map.next_value()? {
                                set_once(&mut p.cs, v, "cs")?
                            }
                        }
                        Field::Data => {
                            let book = p.topic.as_deref().is_some_and(is_book_topic);
                            if let Some(v) = Payload::next_value(&mut map, book)? {
                                set_once(&mut p.data, v, "data")?
                            }
                        }
                        Field::Success => {
                            if let Some(v) = map.next_value()? {
                                set_once(&mut p.success, v, "success")?
                            }
                        }
                        Field::RetMsg => {
                            if let Some(v) = map.next_value()? {
                                set_once(&mut p.ret_msg, v, "ret_msg")?
                            }
                        }
                        Field::RetCode => {
                            if let Some(v) = map.next_value()? {
                                set_once(&mut p.ret_code, v, "retCode")?
                            }
                        }
                        Field::Op => {
                            if let Some(v) = map.next_value()? {
                                set_once(&mut p.op, v, "op")?
                            }
                        }
                        Field::Other => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                        }
                    }
                }
                Ok(p)
            }
        }
        d.deserialize_map(V)
    }
}

/// Whether a topic is a book's (`orderbook.{depth}.{symbol}`).
fn is_book_topic(topic: &str) -> bool {
    topic.starts_with("orderbook.")
}

#[derive(Deserialize)]
struct BookData<'a> {
    #[serde(borrow, default)]
    s: Option<Cow<'a, str>>,
    #[serde(default)]
    b: StrLevels,
    #[serde(default)]
    a: StrLevels,
    #[serde(borrow)]
    u: IntText<'a>,
    #[serde(borrow, default)]
    seq: Option<IntText<'a>>,
}

#[derive(Deserialize)]
struct TradeData<'a> {
    #[serde(borrow, rename = "T")]
    time: IntText<'a>,
    #[serde(borrow)]
    s: Cow<'a, str>,
    #[serde(borrow, rename = "S")]
    side: Cow<'a, str>,
    #[serde(borrow)]
    v: &'a str,
    #[serde(borrow)]
    p: &'a str,
    #[serde(borrow)]
    i: Cow<'a, str>,
}

#[derive(Deserialize)]
struct KlineData<'a> {
    #[serde(borrow)]
    start: IntText<'a>,
    #[serde(borrow)]
    open: &'a str,
    #[serde(borrow)]
    high: &'a str,
    #[serde(borrow)]
    low: &'a str,
    #[serde(borrow)]
    close: &'a str,
    #[serde(borrow)]
    volume: &'a str,
    confirm: bool,
}

#[derive(Deserialize)]
struct TickerData<'a> {
    #[serde(borrow, default)]
    symbol: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "bid1Price")]
    bid_px: Option<&'a str>,
    #[serde(borrow, default, rename = "bid1Size")]
    bid_sz: Option<&'a str>,
    #[serde(borrow, default, rename = "ask1Price")]
    ask_px: Option<&'a str>,
    #[serde(borrow, default, rename = "ask1Size")]
    ask_sz: Option<&'a str>,
}

/// Bybit's "Too many visits. Exceeded the API Rate Limit." (<https://bybit-exchange.github.io/docs/v5/error>).
const RATE_LIMIT_CODE: i64 = 10_006;

/// Reads one Bybit frame into `out`; on an error `out` is left as it was.
pub fn parse(frame: &str, out: &mut Vec<Message>) -> Result<(), WireError> {
    let start = out.len();
    let read = read(frame, out);
    if read.is_err() {
        out.truncate(start);
    }
    read
}

fn read(frame: &str, out: &mut Vec<Message>) -> Result<(), WireError> {
    let push: Push<'_> = serde_json::from_str(frame).map_err(|e| json_error(D, e))?;
    let Some(topic) = push.topic.as_deref() else {
        return answer(&push, out);
    };
    let Some(data) = push.data else {
        return Err(invalid(D, format!("a push of {:?} needs `data`", clip(topic))));
    };
    let time_ms = push.ts.as_ref().map(|ts| ts.get::<i64>(D, "ts")).transpose()?;
    let (kind, rest) = topic.split_once('.').unwrap_or((topic, ""));
    match kind {
        "orderbook" => {
            let (depth, symbol) = rest
                .split_once('.')
                .ok_or_else(|| invalid(D, format!("book topic {:?} lacks a depth", clip(topic))))?;
            let depth: usize = depth
                .parse()
                .map_err(|_| invalid(D, format!("book topic {:?}: depth", clip(topic))))?;
            let snapshot = match push.kind.as_deref() {
                Some("snapshot") => true,
                Some("delta") => false,
                Some(other) => {
                    return Err(invalid(D, format!("unknown book type {:?}", clip(other))))
                }
                None => return Err(invalid(D, "a book push needs `type`")),
            };
            let b = data.read(D)?;
            out.push(Message::Book(book(symbol, depth, snapshot, time_ms, b)?));
        }
        "publicTrade" => {
            let rows: Capped<TradeData<'_>, MAX_ITEMS> =
                serde_json::from_str(data.raw(D)?.get()).map_err(|e| json_error(D, e))?;
            let mut by_symbol: Vec<(String, Vec<Trade>)> = Vec::new();
            for row in rows.0 {
                let symbol = clip(&row.s).to_string();
                let t = trade(row)?;
                match by_symbol.iter_mut().find(|(s, _)| *s == symbol) {
                    Some((_, trades)) => trades.push(t),
                    None => by_symbol.push((symbol, vec![t])),
                }
            }
            out.extend(
                by_symbol.into_iter().map(|(symbol, trades)| Message::Trades { symbol, trades }),
            );
        }
        "kline" => {
            let (interval, symbol) = rest.split_once('.').ok_or_else(|| {
                invalid(D, format!("kline topic {:?} lacks an interval", clip(topic)))
            })?;
            let Some(minutes) = interval_minutes(interval)? else {
                // a month has no fixed number of minutes: a CandleFrame cannot say it
                out.push(Message::Ignored { channel: clip(topic).to_string() });
                return Ok(());
            };
            let rows: Capped<KlineData<'_>, MAX_ITEMS> =
                serde_json::from_str(data.raw(D)?.get()).map_err(|e| json_error(D, e))?;
            for k in rows.0 {
                let c = candle(
                    D,
                    k.start.get(D, "kline start")?,
                    minutes,
                    [k.open, k.high, k.low, k.close],
                    k.volume,
                    0,
                )?;
                out.push(Message::Candle(CandleFrame {
                    symbol: clip(symbol).to_string(),
                    minutes,
                    candle: c,
                    closed: Some(k.confirm),
                }));
            }
        }
        "tickers" => {
            let t: TickerData<'_> =
                serde_json::from_str(data.raw(D)?.get()).map_err(|e| json_error(D, e))?;
            out.push(Message::Ticker(TickerFrame {
                symbol: clip(t.symbol.as_deref().unwrap_or(rest)).to_string(),
                bid: level(t.bid_px, t.bid_sz)?,
                ask: level(t.ask_px, t.ask_sz)?,
                cross_seq: push.cs.as_ref().map(|cs| cs.get(D, "cs")).transpose()?,
                time_ms,
            }));
        }
        _ => out.push(Message::Ignored { channel: clip(topic).to_string() }),
    }
    Ok(())
}

/// An `op` answer: a pong (`{"success":true,"ret_msg":"pong","op":"ping"}` on spot,
/// `{"op":"pong","args":["1672916271846"]}` on linear), a subscription's success or failure.
fn answer(push: &Push<'_>, out: &mut Vec<Message>) -> Result<(), WireError> {
    let op = push.op.as_deref().unwrap_or_default();
    let ret_msg = push.ret_msg.as_deref().unwrap_or_default();
    if op == "pong" || (push.success != Some(false) && (op == "ping" || ret_msg == "pong")) {
        out.push(Message::Heartbeat);
        return Ok(());
    }
    match push.success {
        Some(true) => out.push(Message::Ack {
            detail: format!("{} {}", clip(op), clip(ret_msg)).trim().to_string(),
        }),
        Some(false) => {
            let code = push.ret_code.as_ref().and_then(|c| c.get::<i64>(D, "retCode").ok());
            let lower = ret_msg.to_ascii_lowercase();
            let rate_limited = code == Some(RATE_LIMIT_CODE)
                || lower.contains("too many")
                || lower.contains("too frequent")
                || lower.contains("rate limit");
            out.push(Message::Refused {
                code: code.map(|c| c.to_string()).unwrap_or_default(),
                message: format!("{} {}", clip(op), clip(ret_msg)).trim().to_string(),
                rate_limited,
            });
        }
        None => return Err(invalid(D, "a frame needs `topic`, or `success` or `op`")),
    }
    Ok(())
}

fn book(
    topic_symbol: &str,
    depth: usize,
    snapshot: bool,
    time_ms: Option<i64>,
    b: BookData<'_>,
) -> Result<BookFrame, WireError> {
    let mut printed = b.a.printed;
    printed.price.merge(b.b.printed.price);
    printed.qty.merge(b.b.printed.qty);
    Ok(BookFrame {
        symbol: clip(b.s.as_deref().unwrap_or(topic_symbol)).to_string(),
        depth: Some(depth),
        snapshot,
        seq: Some(b.u.get(D, "u")?),
        prev_seq: None,
        cross_seq: b.seq.as_ref().map(|s| s.get(D, "seq")).transpose()?,
        bids: b.b.levels,
        asks: b.a.levels,
        checksum: None,
        printed: Some(printed),
        time_ms,
    })
}

fn trade(t: TradeData<'_>) -> Result<Trade, WireError> {
    // `S` is the taker's side ("Side of taker. `Buy`,`Sell`")
    let taker = match &*t.side {
        "Buy" => TakerSide::Buy,
        "Sell" => TakerSide::Sell,
        other => return Err(invalid(D, format!("unknown trade side {:?}", clip(other)))),
    };
    Ok(Trade {
        id: TradeId::parse(clip(&t.i)),
        time_ms: t.time.get(D, "trade T")?,
        price: parse_price(t.p).map_err(|e| invalid(D, format!("trade {e}")))?,
        qty: parse_qty(t.v).map_err(|e| invalid(D, format!("trade {e}")))?,
        taker: Some(taker),
    })
}

/// The best level of a ticker; `None` unless both strings are there (spot tickers carry no
/// book fields, and a linear `delta` carries only the fields that changed, so a caller keeping
/// the venue's best bid and ask merges a linear ticker's frames itself).
fn level(p: Option<&str>, q: Option<&str>) -> Result<Option<Level>, WireError> {
    match (p, q) {
        (Some(p), Some(q)) if !p.is_empty() && !q.is_empty() => Ok(Some(Level::new(
            parse_price(p).map_err(|e| invalid(D, format!("ticker {e}")))?,
            parse_qty(q).map_err(|e| invalid(D, format!("ticker {e}")))?,
        ))),
        _ => Ok(None),
    }
}

/// Minutes of a kline interval (`1` … `720`, `D`, `W`); `None` for `M`, a month.
fn interval_minutes(interval: &str) -> Result<Option<u32>, WireError> {
    Ok(Some(match interval {
        "D" => 1440,
        "W" => 10_080,
        "M" => return Ok(None),
        n => match n.parse::<u32>() {
            Ok(m @ (1 | 3 | 5 | 15 | 30 | 60 | 120 | 240 | 360 | 720)) => m,
            _ => return Err(invalid(D, format!("unknown kline interval {:?}", clip(n)))),
        },
    }))
}

/// The subscribe request of `topics` (`orderbook.50.BTCUSDT`, …). Spot takes at most 10 per
/// request.
pub fn subscribe(topics: &[&str]) -> String {
    serde_json::json!({"op": "subscribe", "args": topics}).to_string()
}

/// The unsubscribe request of `topics`.
pub fn unsubscribe(topics: &[&str]) -> String {
    serde_json::json!({"op": "unsubscribe", "args": topics}).to_string()
}

/// The keep-alive Bybit asks for every 20 s.
pub fn ping() -> String {
    r#"{"op":"ping"}"#.to_string()
}

#[cfg(test)]
mod tests;
