//! Coinbase Advanced Trade public WebSocket (`wss://advanced-trade-ws.coinbase.com`): `l2_data`
//! (the `level2` subscription), `market_trades`, `candles`, `ticker` and `ticker_batch`,
//! `heartbeats`, `subscriptions`, and `{"type":"error"}` answers.
//!
//! Every push has one envelope: `{"channel":"l2_data","client_id":"","timestamp":
//! "2023-02-09T20:32:50.714964855Z","sequence_num":1,"events":[…]}`. `sequence_num` counts per
//! connection across all its channels, so it is the connection's to check, not a book's: for
//! every frame that carries one, [`Message::Sequence`] is pushed *before* what the frame says,
//! for the caller's [`shared::venue::ConnectionSequence`]. A frame that cannot be read leaves
//! nothing in `out`, its sequence number included: the next frame then shows a gap and the
//! connection's books resync, which is what an unreadable book update calls for.
//!
//! A book event: `{"type":"snapshot"|"update","product_id":"BTC-USD","updates":[{"side":"bid"|
//! "offer","event_time":…,"price_level":"21921.73","new_quantity":"0.06317902"}]}`.
//! `new_quantity` is the level's new size, not a change; `"0"` removes the level
//! (<https://docs.cdp.coinbase.com/api-reference/advanced-trade-api/websocket/level2.md>). Each
//! event becomes one [`BookFrame`] whose `seq` is the frame's `sequence_num` (kept for the
//! record: [`shared::venue::SequenceRule::Connection`] does not check it per book). There is no
//! checksum.
//!
//! Trades: the `side` of a `market_trades` trade is `BUY`/`SELL`, and no page of Coinbase's own
//! docs that we could read says whose side it is. It is read as the **taker's**, as a public
//! AsyncAPI description of this channel ("Taker side of the trade") and nautilus_trader's
//! reader (`BUY` → buyer aggressor) take it. The older Exchange API is different: its `match`
//! messages document `side` as the maker's. Check against a recording (a `BUY` print at the
//! best ask) before relying on it.

use std::borrow::Cow;

use serde::Deserialize;
use shared::book::Level;
use shared::trade::{TakerSide, Trade, TradeId};
use shared::venue::{Dialect, PrintedLevels};

use crate::{
    bounded, candle, clip, invalid, json_error, parse_price, parse_qty, parse_rfc3339_ms, set_once,
    BookFrame, CandleFrame, Capped, IntText, Message, Payload, TickerFrame, WireError, MAX_ITEMS,
    MAX_LEVELS,
};

const D: Dialect = Dialect::Coinbase;

/// The only interval the `candles` channel pushes.
const CANDLE_MINUTES: u32 = 5;

struct Frame<'a> {
    channel: Option<Cow<'a, str>>,
    kind: Option<Cow<'a, str>>,
    message: Option<Cow<'a, str>>,
    timestamp: Option<Cow<'a, str>>,
    sequence_num: Option<IntText<'a>>,
    /// `l2_data`'s events are read with the envelope (`channel` comes first in Coinbase's frames).
    events: Option<Payload<'a, Capped<BookEvent<'a>, MAX_ITEMS>>>,
}

impl<'de> Deserialize<'de> for Frame<'de> {
    fn deserialize<De: serde::Deserializer<'de>>(d: De) -> Result<Self, De::Error> {
        #[derive(Deserialize)]
        #[serde(field_identifier)]
        enum Field {
            #[serde(rename = "channel")]
            Channel,
            #[serde(rename = "type")]
            Kind,
            #[serde(rename = "message")]
            Message,
            #[serde(rename = "timestamp")]
            Timestamp,
            #[serde(rename = "sequence_num")]
            SequenceNum,
            #[serde(rename = "events")]
            Events,
            #[serde(other)]
            Other,
        }
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Frame<'de>;
            fn expecting(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str("a Coinbase frame")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Frame<'de>, A::Error> {
                let mut f = Frame {
                    channel: None,
                    kind: None,
                    message: None,
                    timestamp: None,
                    sequence_num: None,
                    events: None,
                };
                while let Some(field) = map.next_key::<Field>()? {
                    match field {
                        Field::Channel => {
                            if let Some(v) = map.next_value()? {
                                set_once(&mut f.channel, v, "channel")?
                            }
                        }
                        Field::Kind => {
                            if let Some(v) = map.next_value()? {
                                set_once(&mut f.kind, v, "type")?
                            }
                        }
                        Field::Message => {
                            if let Some(v) = map.next_value()? {
                                set_once(&mut f.message, v, "message")?
                            }
                        }
                        Field::Timestamp => {
                            if let Some(v) = map.next_value()? {
                                set_once(&mut f.timestamp, v, "timestamp")?
                            }
                        }
                        Field::SequenceNum => {
                            if let Some(v) = map.next_value()? {
                                set_once(&mut f.sequence_num, v, "sequence_num")?
                            }
                        }
                        Field::Events => {
                            let books = f.channel.as_deref() == Some("l2_data");
                            if let Some(v) = Payload::next_value(&mut map, books)? {
                                set_once(&mut f.events, v, "events")?
                            }
                        }
                        Field::Other => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                        }
                    }
                }
                Ok(f)
            }
        }
        d.deserialize_map(V)
    }
}

#[derive(Deserialize)]
struct BookEvent<'a> {
    #[serde(borrow, rename = "type")]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    product_id: Cow<'a, str>,
    #[serde(default)]
    updates: Updates,
}

#[derive(Deserialize)]
struct TradesEvent<'a> {
    #[serde(borrow, default)]
    trades: Capped<CbTrade<'a>, MAX_ITEMS>,
}

#[derive(Deserialize)]
struct CbTrade<'a> {
    #[serde(borrow)]
    trade_id: Cow<'a, str>,
    #[serde(borrow)]
    product_id: Cow<'a, str>,
    #[serde(borrow)]
    price: &'a str,
    #[serde(borrow)]
    size: &'a str,
    #[serde(borrow)]
    side: Cow<'a, str>,
    #[serde(borrow)]
    time: Cow<'a, str>,
}

#[derive(Deserialize)]
struct CandlesEvent<'a> {
    #[serde(borrow, default)]
    candles: Capped<CbCandle<'a>, MAX_ITEMS>,
}

#[derive(Deserialize)]
struct CbCandle<'a> {
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
    #[serde(borrow)]
    product_id: Cow<'a, str>,
}

#[derive(Deserialize)]
struct TickersEvent<'a> {
    #[serde(borrow, default)]
    tickers: Capped<CbTicker<'a>, MAX_ITEMS>,
}

#[derive(Deserialize)]
struct CbTicker<'a> {
    #[serde(borrow)]
    product_id: Cow<'a, str>,
    #[serde(borrow, default)]
    best_bid: Option<&'a str>,
    #[serde(borrow, default)]
    best_bid_quantity: Option<&'a str>,
    #[serde(borrow, default)]
    best_ask: Option<&'a str>,
    #[serde(borrow, default)]
    best_ask_quantity: Option<&'a str>,
}

/// Reads one Coinbase frame into `out`; on an error `out` is left as it was.
pub fn parse(frame: &str, out: &mut Vec<Message>) -> Result<(), WireError> {
    let start = out.len();
    let read = read(frame, out);
    if read.is_err() {
        out.truncate(start);
    }
    read
}

fn read(frame: &str, out: &mut Vec<Message>) -> Result<(), WireError> {
    let f: Frame<'_> = serde_json::from_str(frame).map_err(|e| json_error(D, e))?;
    let seq = f.sequence_num.as_ref().map(|s| s.get::<u64>(D, "sequence_num")).transpose()?;
    if let Some(seq) = seq {
        out.push(Message::Sequence { seq });
    }
    if f.kind.as_deref() == Some("error") {
        let message = f.message.as_deref().unwrap_or_default();
        let lower = message.to_ascii_lowercase();
        out.push(Message::Refused {
            code: String::new(),
            message: clip(message).to_string(),
            rate_limited: lower.contains("rate limit") || lower.contains("too many"),
        });
        return Ok(());
    }
    let Some(channel) = f.channel.as_deref() else {
        return Err(invalid(D, "a frame needs `channel` (or `type`: `error`)"));
    };
    let needs_events = || invalid(D, format!("{} needs `events`", clip(channel)));
    let events = || f.events.as_ref().ok_or_else(needs_events)?.raw(D);
    let time_ms = || -> Result<Option<i64>, WireError> {
        f.timestamp
            .as_deref()
            .map(|t| {
                parse_rfc3339_ms(t)
                    .ok_or_else(|| invalid(D, format!("timestamp {:?} is not RFC 3339", clip(t))))
            })
            .transpose()
    };
    match channel {
        "l2_data" => {
            let sent_ms = time_ms()?;
            let events = f.events.ok_or_else(needs_events)?.read(D)?;
            let mut levels = 0;
            for e in events.0 {
                levels += e.updates.bids.len() + e.updates.asks.len();
                bounded(D, "book levels", levels, MAX_LEVELS)?;
                let snapshot = match &*e.kind {
                    "snapshot" => true,
                    "update" => false,
                    other => {
                        return Err(invalid(
                            D,
                            format!("unknown book event type {:?}", clip(other)),
                        ))
                    }
                };
                out.push(Message::Book(BookFrame {
                    symbol: clip(&e.product_id).to_string(),
                    depth: None,
                    snapshot,
                    seq,
                    prev_seq: None,
                    cross_seq: None,
                    bids: e.updates.bids,
                    asks: e.updates.asks,
                    checksum: None,
                    printed: Some(e.updates.printed),
                    // the book's own time where the updates say it, else the time it was sent
                    time_ms: e.updates.newest_ms.or(sent_ms),
                }));
            }
        }
        "market_trades" => {
            let events: Capped<TradesEvent<'_>, MAX_ITEMS> =
                serde_json::from_str(events()?.get()).map_err(|e| json_error(D, e))?;
            let mut count = 0;
            let mut by_product: Vec<(String, Vec<Trade>)> = Vec::new();
            for e in events.0 {
                count += e.trades.0.len();
                bounded(D, "trades", count, MAX_ITEMS)?;
                for t in e.trades.0 {
                    let product = clip(&t.product_id).to_string();
                    let t = trade(t)?;
                    match by_product.iter_mut().find(|(p, _)| *p == product) {
                        Some((_, trades)) => trades.push(t),
                        None => by_product.push((product, vec![t])),
                    }
                }
            }
            out.extend(
                by_product.into_iter().map(|(symbol, trades)| Message::Trades { symbol, trades }),
            );
        }
        "candles" => {
            let events: Capped<CandlesEvent<'_>, MAX_ITEMS> =
                serde_json::from_str(events()?.get()).map_err(|e| json_error(D, e))?;
            let mut count = 0;
            for e in events.0 {
                count += e.candles.0.len();
                bounded(D, "candles", count, MAX_ITEMS)?;
                for c in e.candles.0 {
                    let start: i64 = c.start.get(D, "candle start")?;
                    let open_time = start.checked_mul(1000).ok_or_else(|| {
                        invalid(D, format!("candle start {start} is out of range"))
                    })?;
                    out.push(Message::Candle(CandleFrame {
                        symbol: clip(&c.product_id).to_string(),
                        minutes: CANDLE_MINUTES,
                        candle: candle(
                            D,
                            open_time,
                            CANDLE_MINUTES,
                            [c.open, c.high, c.low, c.close],
                            c.volume,
                            0,
                        )?,
                        closed: None,
                    }));
                }
            }
        }
        "ticker" | "ticker_batch" => {
            let time_ms = time_ms()?;
            let events: Capped<TickersEvent<'_>, MAX_ITEMS> =
                serde_json::from_str(events()?.get()).map_err(|e| json_error(D, e))?;
            let mut count = 0;
            for e in events.0 {
                count += e.tickers.0.len();
                bounded(D, "tickers", count, MAX_ITEMS)?;
                for t in e.tickers.0 {
                    out.push(Message::Ticker(TickerFrame {
                        symbol: clip(&t.product_id).to_string(),
                        bid: level(t.best_bid, t.best_bid_quantity)?,
                        ask: level(t.best_ask, t.best_ask_quantity)?,
                        cross_seq: None,
                        time_ms,
                    }));
                }
            }
        }
        "heartbeats" => out.push(Message::Heartbeat),
        "subscriptions" => out.push(Message::Ack { detail: "subscriptions".into() }),
        other => out.push(Message::Ignored { channel: clip(other).to_string() }),
    }
    Ok(())
}

fn trade(t: CbTrade<'_>) -> Result<Trade, WireError> {
    // read as the taker's side: see the module docs
    let taker = match &*t.side {
        "BUY" => Some(TakerSide::Buy),
        "SELL" => Some(TakerSide::Sell),
        "" | "UNKNOWN_ORDER_SIDE" => None,
        other => return Err(invalid(D, format!("unknown trade side {:?}", clip(other)))),
    };
    Ok(Trade {
        id: TradeId::parse(clip(&t.trade_id)),
        time_ms: parse_rfc3339_ms(&t.time)
            .ok_or_else(|| invalid(D, format!("trade time {:?} is not RFC 3339", clip(&t.time))))?,
        price: parse_price(t.price).map_err(|e| invalid(D, format!("trade {e}")))?,
        qty: parse_qty(t.size).map_err(|e| invalid(D, format!("trade {e}")))?,
        taker,
    })
}

fn level(p: Option<&str>, q: Option<&str>) -> Result<Option<Level>, WireError> {
    match (p, q) {
        (Some(p), Some(q)) if !p.is_empty() && !q.is_empty() => Ok(Some(Level::new(
            parse_price(p).map_err(|e| invalid(D, format!("ticker {e}")))?,
            parse_qty(q).map_err(|e| invalid(D, format!("ticker {e}")))?,
        ))),
        _ => Ok(None),
    }
}

/// A book event's `updates`, read in one pass into bids and asks (`side` `bid`; `offer`, or
/// `ask` as some recordings have it), with how their strings were printed (levels being
/// removed left out, as [`crate::StrLevels`] does). At most [`MAX_LEVELS`].
#[derive(Debug, Default)]
struct Updates {
    bids: Vec<Level>,
    asks: Vec<Level>,
    printed: PrintedLevels,
    /// The newest `event_time` (ms) of the updates: the moment of the book they bring it to, as
    /// a REST `product_book`'s `time` says it. A snapshot's say `1970-01-01T00:00:00Z`: none.
    newest_ms: Option<i64>,
}

#[derive(Deserialize)]
struct Update<'a> {
    #[serde(borrow)]
    side: Cow<'a, str>,
    #[serde(borrow)]
    price_level: &'a str,
    #[serde(borrow)]
    new_quantity: &'a str,
    #[serde(borrow, default)]
    event_time: Option<Cow<'a, str>>,
}

impl<'de> Deserialize<'de> for Updates {
    fn deserialize<De: serde::Deserializer<'de>>(d: De) -> Result<Self, De::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Updates;
            fn expecting(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str("a list of book updates")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Updates, A::Error> {
                use serde::de::Error;
                let mut out = Updates::default();
                // the updates of one event mostly share one time: read each new one once
                let mut last_time: Option<Cow<'de, str>> = None;
                while let Some(u) = seq.next_element::<Update<'de>>()? {
                    if let Some(t) = u.event_time.filter(|t| !t.is_empty()) {
                        if last_time.as_deref() != Some(&*t) {
                            let ms = parse_rfc3339_ms(&t).ok_or_else(|| {
                                Error::custom(format_args!(
                                    "event_time {:?} is not RFC 3339",
                                    clip(&t)
                                ))
                            })?;
                            if ms > 0 {
                                out.newest_ms = out.newest_ms.max(Some(ms));
                            }
                            last_time = Some(t);
                        }
                    }
                    if out.bids.len() + out.asks.len() == MAX_LEVELS {
                        return Err(Error::custom(format_args!(
                            "more than {MAX_LEVELS} book levels"
                        )));
                    }
                    let l = Level::new(
                        parse_price(u.price_level).map_err(Error::custom)?,
                        parse_qty(u.new_quantity).map_err(Error::custom)?,
                    );
                    if !l.qty.is_zero() {
                        out.printed.price.observe(u.price_level.as_bytes());
                        out.printed.qty.observe(u.new_quantity.as_bytes());
                    }
                    match &*u.side {
                        "bid" => out.bids.push(l),
                        "offer" | "ask" => out.asks.push(l),
                        other => {
                            return Err(Error::custom(format_args!(
                                "unknown book side {:?}",
                                clip(other)
                            )))
                        }
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_seq(V)
    }
}

/// The subscribe request of `channel` (`level2`, `market_trades`, `candles`, `ticker`,
/// `ticker_batch`, `heartbeats`) for `product_ids`. One channel per request.
pub fn subscribe(channel: &str, product_ids: &[&str]) -> String {
    serde_json::json!({"type": "subscribe", "product_ids": product_ids, "channel": channel})
        .to_string()
}

/// The unsubscribe request of `channel` for `product_ids`.
pub fn unsubscribe(channel: &str, product_ids: &[&str]) -> String {
    serde_json::json!({"type": "unsubscribe", "product_ids": product_ids, "channel": channel})
        .to_string()
}

#[cfg(test)]
mod tests;
