//! OKX API v5 public WebSocket: `books` (and `books5`, `bbo-tbt`, `books-l2-tbt`,
//! `books50-l2-tbt`), `trades`, `candle1m` (and the other `candle…` bars), `tickers`; the
//! `event` answers and the `pong` text.
//!
//! A book push: `{"arg":{"channel":"books","instId":"BTC-USDT"},"action":"snapshot"|"update",
//! "data":[{"asks":[["8476.98","415","0","13"]],"bids":[…],"ts":"1597026383085",
//! "checksum":-855196043,"prevSeqId":-1,"seqId":123456}]}`. Captures from before `seqId` lack
//! both sequence fields: the book is then proven by its checksum alone.

use serde::Deserialize;
use std::borrow::Cow;

use shared::book::Level;
use shared::trade::{TakerSide, Trade, TradeId};
use shared::venue::Dialect;

use crate::{
    bounded, candle, clip, int_str, invalid, json_error, parse_price, parse_qty, set_once,
    BookFrame, CandleFrame, Message, Payload, StrLevels, TickerFrame, WireError, MAX_ITEMS,
};

const D: Dialect = Dialect::Okx;

struct Push<'a> {
    arg: Option<Arg<'a>>,
    action: Option<&'a str>,
    /// A book channel's data is read with the envelope (`arg` comes first in OKX's pushes).
    data: Option<Payload<'a, Vec<BookData<'a>>>>,
    event: Option<Cow<'a, str>>,
    code: Option<Cow<'a, str>>,
    msg: Option<Cow<'a, str>>,
}

/// The channels whose pushes are books.
fn is_book_channel(channel: &str) -> bool {
    matches!(channel, "books" | "books5" | "bbo-tbt" | "books-l2-tbt" | "books50-l2-tbt")
}

impl<'de> Deserialize<'de> for Push<'de> {
    fn deserialize<De: serde::Deserializer<'de>>(d: De) -> Result<Self, De::Error> {
        #[derive(Deserialize)]
        #[serde(field_identifier, rename_all = "lowercase")]
        enum Field {
            Arg,
            Action,
            Data,
            Event,
            Code,
            Msg,
            #[serde(other)]
            Other,
        }
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Push<'de>;
            fn expecting(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str("an OKX push or answer")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Push<'de>, A::Error> {
                let mut p = Push {
                    arg: None,
                    action: None,
                    data: None,
                    event: None,
                    code: None,
                    msg: None,
                };
                while let Some(field) = map.next_key::<Field>()? {
                    match field {
                        Field::Arg => {
                            if let Some(v) = map.next_value()? {
                                set_once(&mut p.arg, v, "arg")?
                            }
                        }
                        Field::Action => {
                            if let Some(v) = map.next_value()? {
                                set_once(&mut p.action, v, "action")?
                            }
                        }
                        Field::Data => {
                            let books = p.arg.as_ref().is_some_and(|a| is_book_channel(&a.channel));
                            if let Some(v) = Payload::next_value(&mut map, books)? {
                                set_once(&mut p.data, v, "data")?
                            }
                        }
                        Field::Event => {
                            if let Some(v) = map.next_value()? {
                                set_once(&mut p.event, v, "event")?
                            }
                        }
                        Field::Code => {
                            if let Some(v) = map.next_value()? {
                                set_once(&mut p.code, v, "code")?
                            }
                        }
                        Field::Msg => {
                            if let Some(v) = map.next_value()? {
                                set_once(&mut p.msg, v, "msg")?
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

#[derive(Deserialize)]
struct Arg<'a> {
    #[serde(borrow)]
    channel: std::borrow::Cow<'a, str>,
    #[serde(borrow, default, rename = "instId")]
    inst_id: Option<std::borrow::Cow<'a, str>>,
}

#[derive(Deserialize)]
struct BookData<'a> {
    #[serde(default)]
    asks: StrLevels,
    #[serde(default)]
    bids: StrLevels,
    #[serde(borrow, default)]
    ts: Option<&'a str>,
    #[serde(default)]
    checksum: Option<i64>,
    #[serde(default, rename = "seqId")]
    seq_id: Option<i64>,
    #[serde(default, rename = "prevSeqId")]
    prev_seq_id: Option<i64>,
}

#[derive(Deserialize)]
struct TradeData<'a> {
    #[serde(borrow, rename = "tradeId")]
    trade_id: &'a str,
    #[serde(borrow)]
    px: &'a str,
    #[serde(borrow)]
    sz: &'a str,
    #[serde(borrow)]
    side: &'a str,
    #[serde(borrow)]
    ts: &'a str,
}

#[derive(Deserialize)]
struct TickerData<'a> {
    #[serde(borrow, default, rename = "bidPx")]
    bid_px: Option<&'a str>,
    #[serde(borrow, default, rename = "bidSz")]
    bid_sz: Option<&'a str>,
    #[serde(borrow, default, rename = "askPx")]
    ask_px: Option<&'a str>,
    #[serde(borrow, default, rename = "askSz")]
    ask_sz: Option<&'a str>,
    #[serde(borrow, default)]
    ts: Option<&'a str>,
}

/// OKX error codes that mean "too many requests".
const RATE_LIMIT_CODES: [&str; 3] = ["50011", "60014", "63999"];

/// Reads one OKX frame into `out`.
pub fn parse(frame: &str, out: &mut Vec<Message>) -> Result<(), WireError> {
    if frame == "pong" {
        out.push(Message::Heartbeat);
        return Ok(());
    }
    let push: Push<'_> = serde_json::from_str(frame).map_err(|e| json_error(D, e))?;
    if let Some(event) = push.event {
        let code = push.code.map(|c| c.into_owned()).unwrap_or_default();
        let message = push.msg.map(|m| clip(&m).to_string()).unwrap_or_default();
        out.push(match &*event {
            "error" => Message::Refused {
                rate_limited: RATE_LIMIT_CODES.contains(&code.as_str()),
                code,
                message,
            },
            other => {
                Message::Ack { detail: format!("{} {message}", clip(other)).trim_end().to_string() }
            }
        });
        return Ok(());
    }
    let (Some(arg), Some(data)) = (push.arg, push.data) else {
        return Err(invalid(D, "a push needs `arg` and `data`"));
    };
    let symbol = || {
        arg.inst_id
            .as_deref()
            .map(str::to_string)
            .ok_or_else(|| invalid(D, "a push needs `arg.instId`"))
    };
    let channel = &*arg.channel;
    match channel {
        c if is_book_channel(c) => {
            let symbol = symbol()?;
            // the depth-limited channels push whole books, without `action`
            let snapshot = match push.action {
                Some("snapshot") | None => true,
                Some("update") => false,
                Some(other) => {
                    return Err(invalid(D, format!("unknown book action {:?}", clip(other))))
                }
            };
            let depth = match channel {
                "books5" => Some(5),
                "bbo-tbt" => Some(1),
                "books50-l2-tbt" => Some(50),
                _ => None,
            };
            let books = data.read(D)?;
            bounded(D, "book pushes", books.len(), 16)?;
            for b in books {
                out.push(Message::Book(book(symbol.clone(), depth, snapshot, b)?));
            }
        }
        "trades" | "trades-all" => {
            let symbol = symbol()?;
            let rows: Vec<TradeData<'_>> =
                serde_json::from_str(data.raw(D)?.get()).map_err(|e| json_error(D, e))?;
            bounded(D, "trades", rows.len(), MAX_ITEMS)?;
            let trades = rows.into_iter().map(trade).collect::<Result<_, _>>()?;
            out.push(Message::Trades { symbol, trades });
        }
        "tickers" => {
            let symbol = symbol()?;
            let rows: Vec<TickerData<'_>> =
                serde_json::from_str(data.raw(D)?.get()).map_err(|e| json_error(D, e))?;
            bounded(D, "tickers", rows.len(), MAX_ITEMS)?;
            for t in rows {
                let level =
                    |p: Option<&str>, q: Option<&str>| -> Result<Option<Level>, WireError> {
                        match (p, q) {
                            (Some(p), Some(q)) if !p.is_empty() && !q.is_empty() => {
                                Ok(Some(Level::new(
                                    parse_price(p).map_err(|e| invalid(D, e))?,
                                    parse_qty(q).map_err(|e| invalid(D, e))?,
                                )))
                            }
                            _ => Ok(None),
                        }
                    };
                out.push(Message::Ticker(TickerFrame {
                    symbol: symbol.clone(),
                    bid: level(t.bid_px, t.bid_sz)?,
                    ask: level(t.ask_px, t.ask_sz)?,
                    cross_seq: None,
                    time_ms: t.ts.map(|ts| int_str(D, "ts", ts)).transpose()?,
                }));
            }
        }
        c if c.starts_with("candle") => {
            let symbol = symbol()?;
            let minutes = bar_minutes(&c["candle".len()..])
                .ok_or_else(|| invalid(D, format!("unknown candle channel {:?}", clip(c))))?;
            let rows: Vec<Vec<&str>> =
                serde_json::from_str(data.raw(D)?.get()).map_err(|e| json_error(D, e))?;
            bounded(D, "candles", rows.len(), MAX_ITEMS)?;
            for row in rows {
                out.push(Message::Candle(candle_row(symbol.clone(), minutes, &row)?));
            }
        }
        other => out.push(Message::Ignored { channel: clip(other).to_string() }),
    }
    Ok(())
}

fn book(
    symbol: String,
    depth: Option<usize>,
    snapshot: bool,
    b: BookData<'_>,
) -> Result<BookFrame, WireError> {
    let seq = |v: Option<i64>, field| match v {
        None | Some(-1) => Ok(None),
        Some(n) => {
            u64::try_from(n).map(Some).map_err(|_| invalid(D, format!("{field} {n} is negative")))
        }
    };
    // OKX deprecated the checksum on 23 June 2026: the field stays, always 0, "must no longer be
    // used" (its notice of 21 May 2026). 0 is read as no checksum, so such a book is counted as
    // unchecked and proven by seqId/prevSeqId alone; captures from before keep theirs.
    let checksum = match b.checksum {
        None | Some(0) => None,
        Some(c) => Some(
            i32::try_from(c)
                .map_err(|_| invalid(D, format!("checksum {c} is not a 32-bit integer")))?
                as u32,
        ),
    };
    let mut printed = b.asks.printed;
    printed.price.merge(b.bids.printed.price);
    printed.qty.merge(b.bids.printed.qty);
    Ok(BookFrame {
        symbol,
        depth,
        snapshot,
        seq: seq(b.seq_id, "seqId")?,
        prev_seq: seq(b.prev_seq_id, "prevSeqId")?,
        cross_seq: None,
        bids: b.bids.levels,
        asks: b.asks.levels,
        checksum,
        printed: Some(printed),
        time_ms: b.ts.map(|ts| int_str(D, "ts", ts)).transpose()?,
    })
}

fn trade(t: TradeData<'_>) -> Result<Trade, WireError> {
    let taker = match t.side {
        "buy" => Some(TakerSide::Buy),
        "sell" => Some(TakerSide::Sell),
        other => return Err(invalid(D, format!("unknown trade side {:?}", clip(other)))),
    };
    Ok(Trade {
        id: TradeId::parse(clip(t.trade_id)),
        time_ms: int_str(D, "ts", t.ts)?,
        price: parse_price(t.px).map_err(|e| invalid(D, e))?,
        qty: parse_qty(t.sz).map_err(|e| invalid(D, e))?,
        taker,
    })
}

/// `[ts, o, h, l, c, vol, volCcy, volCcyQuote, confirm]`: `vol` is in the base currency on spot.
fn candle_row(symbol: String, minutes: u32, row: &[&str]) -> Result<CandleFrame, WireError> {
    let [ts, o, h, l, c, vol, rest @ ..] = row else {
        return Err(invalid(D, "a candle needs ts, open, high, low, close and volume"));
    };
    let closed = match rest.get(2) {
        Some(&"1") => Some(true),
        Some(&"0") => Some(false),
        None => None,
        Some(other) => return Err(invalid(D, format!("candle confirm {:?}", clip(other)))),
    };
    Ok(CandleFrame {
        symbol,
        minutes,
        candle: candle(D, int_str(D, "candle ts", ts)?, minutes, [o, h, l, c], vol, 0)?,
        closed,
    })
}

/// Minutes of an OKX bar (`1m`, `5m`, `1H`, `1D`, also the `utc` variants).
fn bar_minutes(bar: &str) -> Option<u32> {
    let bar = bar.strip_suffix("utc").unwrap_or(bar);
    let (n, unit) = bar.split_at(bar.len().checked_sub(1)?);
    let n: u32 = n.parse().ok()?;
    let per = match unit {
        "m" => 1,
        "H" => 60,
        "D" => 1440,
        "W" => 10_080,
        _ => return None,
    };
    n.checked_mul(per)
}

/// The subscribe request of `channel` for `inst_id`.
pub fn subscribe(channel: &str, inst_id: &str) -> String {
    serde_json::json!({"op": "subscribe", "args": [{"channel": channel, "instId": inst_id}]})
        .to_string()
}

/// The unsubscribe request of `channel` for `inst_id`.
pub fn unsubscribe(channel: &str, inst_id: &str) -> String {
    serde_json::json!({"op": "unsubscribe", "args": [{"channel": channel, "instId": inst_id}]})
        .to_string()
}

#[cfg(test)]
mod tests;
