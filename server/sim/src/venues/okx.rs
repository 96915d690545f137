//! OKX API v5 public WebSocket, the server side: `{"op":"subscribe","args":[{"channel":"books",
//! "instId":"BTC-USDT"}]}`; `books` (400 levels: a snapshot, then updates with `seqId` /
//! `prevSeqId` and the CRC-32 of the top 25 levels), `trades`, `candle1m`, `tickers`; the text
//! `ping` answered `pong`. Numbers are the shortest decimals, as OKX prints them.

use serde_json::{json, Value};
use shared::book::Level;
use shared::venue::{Dialect, NumberFormat};

use super::{BookOut, Channel, Ctx, Request, Sub, Venue};
use crate::engine::Fill;
use crate::klines::SimCandle;
use crate::symbols::SymbolSpec;

#[derive(Default)]
pub(crate) struct Okx;

fn levels(levels: &[Level]) -> Vec<[String; 4]> {
    levels
        .iter()
        .map(|l| [l.price.to_string(), l.qty.to_string(), "0".into(), "1".into()])
        .collect()
}

impl Venue for Okx {
    fn dialect(&self) -> Dialect {
        Dialect::Okx
    }

    fn name(&self, spec: &SymbolSpec) -> String {
        super::pair(spec, "-")
    }

    fn default_depth(&self) -> usize {
        400
    }

    fn formats(&self, _spec: &SymbolSpec) -> (NumberFormat, NumberFormat) {
        (NumberFormat::Shortest, NumberFormat::Shortest)
    }

    fn request(&self, text: &str) -> Result<Request, String> {
        if text == "ping" {
            return Ok(Request::Ping { id: None });
        }
        let v: Value = serde_json::from_str(text).map_err(|e| format!("Invalid request: {e}"))?;
        let op = v["op"].as_str().ok_or("Invalid request: no op")?;
        let args = v["args"].as_array().ok_or("Invalid request: no args")?;
        let mut subs = Vec::new();
        for a in args {
            let channel = a["channel"].as_str().ok_or("Invalid request: no channel")?;
            let symbol = a["instId"].as_str().ok_or("Invalid request: no instId")?.to_string();
            let channel = match channel {
                "books" => Channel::Book,
                "trades" => Channel::Trades,
                "candle1m" => Channel::Candles,
                "tickers" => Channel::Ticker,
                other => return Err(format!("Invalid request: unknown channel {other:?}")),
            };
            subs.push(Sub { channel, symbol, depth: None });
        }
        let id = v.get("id").cloned();
        match op {
            "subscribe" => Ok(Request::Subscribe { subs, id }),
            "unsubscribe" => Ok(Request::Unsubscribe { subs, id }),
            other => Err(format!("Invalid request: unknown op {other:?}")),
        }
    }

    fn answer(&self, req: &Request, outcome: Result<(), &str>, _ctx: &mut Ctx) -> Option<String> {
        let (event, subs) = match req {
            Request::Ping { .. } if outcome.is_ok() => return Some("pong".into()),
            Request::Ping { .. } => ("error", &[][..]),
            Request::Subscribe { subs, .. } => ("subscribe", &subs[..]),
            Request::Unsubscribe { subs, .. } => ("unsubscribe", &subs[..]),
        };
        if let Err(msg) = outcome {
            return Some(
                json!({"event": "error", "code": "60012", "msg": msg, "connId": "sim"}).to_string(),
            );
        }
        let arg = subs.first().map(|s| {
            let channel = match s.channel {
                Channel::Book => "books",
                Channel::Trades => "trades",
                Channel::Candles => "candle1m",
                Channel::Ticker => "tickers",
                Channel::Other(c) => c,
            };
            json!({"channel": channel, "instId": s.symbol})
        });
        Some(json!({"event": event, "arg": arg, "connId": "sim"}).to_string())
    }

    fn book(&self, b: &BookOut<'_>, _ctx: &mut Ctx) -> String {
        let prev: i64 = if b.snapshot { -1 } else { b.prev_seq.map_or(-1, |p| p as i64) };
        json!({
            "arg": {"channel": "books", "instId": b.symbol},
            "action": if b.snapshot { "snapshot" } else { "update" },
            "data": [{
                "asks": levels(b.asks),
                "bids": levels(b.bids),
                "ts": b.time_ms.to_string(),
                "checksum": b.checksum.map_or(0, |c| c as i32),
                "prevSeqId": prev,
                "seqId": b.seq,
            }]
        })
        .to_string()
    }

    fn book_heartbeat(&self, b: &BookOut<'_>, ctx: &mut Ctx) -> Option<String> {
        Some(self.book(b, ctx))
    }

    fn trades(&self, symbol: &str, _spec: &SymbolSpec, trades: &[Fill], _ctx: &mut Ctx) -> String {
        let data: Vec<Value> = trades
            .iter()
            .map(|t| {
                json!({
                    "instId": symbol,
                    "tradeId": t.id.to_string(),
                    "px": t.price.to_string(),
                    "sz": t.qty.to_string(),
                    "side": if t.buyer_is_maker { "sell" } else { "buy" },
                    "ts": t.time_ms.to_string(),
                    "count": "1",
                })
            })
            .collect();
        json!({"arg": {"channel": "trades", "instId": symbol}, "data": data}).to_string()
    }

    fn candle(
        &self,
        symbol: &str,
        _spec: &SymbolSpec,
        c: &SimCandle,
        closed: bool,
        _ctx: &mut Ctx,
    ) -> String {
        let k = &c.candle;
        json!({
            "arg": {"channel": "candle1m", "instId": symbol},
            "data": [[
                k.open_time.to_string(), k.open.to_string(), k.high.to_string(), k.low.to_string(),
                k.close.to_string(), k.volume.to_string(), c.quote_volume.to_string(),
                c.quote_volume.to_string(), if closed { "1" } else { "0" },
            ]]
        })
        .to_string()
    }

    fn ticker(
        &self,
        symbol: &str,
        _spec: &SymbolSpec,
        bid: Level,
        ask: Level,
        _cs: u64,
        ctx: &mut Ctx,
    ) -> String {
        json!({
            "arg": {"channel": "tickers", "instId": symbol},
            "data": [{
                "instType": "SPOT", "instId": symbol,
                "bidPx": bid.price.to_string(), "bidSz": bid.qty.to_string(),
                "askPx": ask.price.to_string(), "askSz": ask.qty.to_string(),
                "ts": ctx.now_ms.to_string(),
            }]
        })
        .to_string()
    }

    fn heartbeat(&self, _subs: &[Sub], _ctx: &mut Ctx) -> Option<String> {
        None
    }
}
