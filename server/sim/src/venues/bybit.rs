//! Bybit API v5 public WebSocket, the server side: `{"op":"subscribe","args":["orderbook.50.BTCUSDT"]}`;
//! `orderbook.{1,50,200,1000}.SYM` (a snapshot, then deltas with `u` one more per message and
//! `seq` the market's cross sequence; no checksum), `publicTrade.SYM`, `kline.1.SYM` (with
//! `confirm`), `tickers.SYM` (with `bid1Price`…, and `cs` the book's cross sequence);
//! `{"op":"ping"}` answered with `"ret_msg":"pong"`. Prices are printed with the tick's places and
//! quantities with the step's, as Bybit does.

use serde_json::{json, Value};
use shared::book::Level;
use shared::venue::{Dialect, NumberFormat};

use super::{places, BookOut, Channel, Ctx, Request, Sub, Venue};
use crate::engine::Fill;
use crate::klines::SimCandle;
use crate::symbols::SymbolSpec;

#[derive(Default)]
pub(crate) struct Bybit;

/// Depths Bybit's `orderbook` offers.
const DEPTHS: [usize; 4] = [1, 50, 200, 1000];

fn px(spec: &SymbolSpec, p: shared::Price) -> String {
    p.to_string_fixed(u32::from(places(spec.tick.raw())))
}

fn sz(spec: &SymbolSpec, q: shared::Qty) -> String {
    q.to_string_fixed(u32::from(places(spec.step.raw())))
}

fn levels(spec: &SymbolSpec, levels: &[Level]) -> Vec<[String; 2]> {
    levels.iter().map(|l| [px(spec, l.price), sz(spec, l.qty)]).collect()
}

impl Venue for Bybit {
    fn dialect(&self) -> Dialect {
        Dialect::Bybit
    }

    fn name(&self, spec: &SymbolSpec) -> String {
        spec.symbol.clone()
    }

    fn default_depth(&self) -> usize {
        50
    }

    fn formats(&self, spec: &SymbolSpec) -> (NumberFormat, NumberFormat) {
        (NumberFormat::Fixed(places(spec.tick.raw())), NumberFormat::Fixed(places(spec.step.raw())))
    }

    fn request(&self, text: &str) -> Result<Request, String> {
        let v: Value = serde_json::from_str(text).map_err(|e| format!("error:{e}"))?;
        let id = v.get("req_id").cloned();
        let op = v["op"].as_str().ok_or("error:no op")?;
        if op == "ping" {
            return Ok(Request::Ping { id });
        }
        let mut subs = Vec::new();
        for a in v["args"].as_array().ok_or("error:no args")? {
            let topic = a.as_str().ok_or("error:a topic must be a string")?;
            let parts: Vec<&str> = topic.split('.').collect();
            let sub = match parts.as_slice() {
                ["orderbook", depth, sym] => {
                    let depth: usize = depth
                        .parse()
                        .map_err(|_| format!("error:handler not found,topic:{topic}"))?;
                    if !DEPTHS.contains(&depth) {
                        return Err(format!("error:handler not found,topic:{topic}"));
                    }
                    Sub { channel: Channel::Book, symbol: sym.to_string(), depth: Some(depth) }
                }
                ["publicTrade", sym] => {
                    Sub { channel: Channel::Trades, symbol: sym.to_string(), depth: None }
                }
                ["kline", "1", sym] => {
                    Sub { channel: Channel::Candles, symbol: sym.to_string(), depth: None }
                }
                ["tickers", sym] => {
                    Sub { channel: Channel::Ticker, symbol: sym.to_string(), depth: None }
                }
                _ => return Err(format!("error:handler not found,topic:{topic}")),
            };
            subs.push(sub);
        }
        match op {
            "subscribe" => Ok(Request::Subscribe { subs, id }),
            "unsubscribe" => Ok(Request::Unsubscribe { subs, id }),
            other => Err(format!("error:unknown op {other}")),
        }
    }

    fn answer(&self, req: &Request, outcome: Result<(), &str>, _ctx: &mut Ctx) -> Option<String> {
        let (op, id) = match req {
            Request::Ping { id } => ("ping", id),
            Request::Subscribe { id, .. } => ("subscribe", id),
            Request::Unsubscribe { id, .. } => ("unsubscribe", id),
        };
        let (success, ret_msg) = match (outcome, op) {
            (Ok(()), "ping") => (true, "pong".to_string()),
            (Ok(()), _) => (true, String::new()),
            (Err(e), _) => (false, e.to_string()),
        };
        Some(
            json!({"success": success, "ret_msg": ret_msg, "conn_id": "sim", "req_id": id.clone().unwrap_or(Value::Null), "op": op})
                .to_string(),
        )
    }

    fn book(&self, b: &BookOut<'_>, _ctx: &mut Ctx) -> String {
        json!({
            "topic": format!("orderbook.{}.{}", b.depth, b.symbol),
            "type": if b.snapshot { "snapshot" } else { "delta" },
            "ts": b.time_ms,
            "data": {"s": b.symbol, "b": levels(b.spec, b.bids), "a": levels(b.spec, b.asks), "u": b.seq, "seq": b.cross_seq},
            "cts": b.time_ms,
        })
        .to_string()
    }

    fn book_heartbeat(&self, _b: &BookOut<'_>, _ctx: &mut Ctx) -> Option<String> {
        None
    }

    fn trades(&self, symbol: &str, spec: &SymbolSpec, trades: &[Fill], ctx: &mut Ctx) -> String {
        let data: Vec<Value> = trades
            .iter()
            .map(|t| {
                json!({
                    "T": t.time_ms, "s": symbol, "S": if t.buyer_is_maker { "Sell" } else { "Buy" },
                    "v": sz(spec, t.qty), "p": px(spec, t.price), "L": "ZeroPlusTick",
                    "i": format!("sim-{}-{}", symbol, t.id), "BT": false,
                })
            })
            .collect();
        json!({"topic": format!("publicTrade.{symbol}"), "type": "snapshot", "ts": ctx.now_ms, "data": data}).to_string()
    }

    fn candle(
        &self,
        symbol: &str,
        spec: &SymbolSpec,
        c: &SimCandle,
        closed: bool,
        ctx: &mut Ctx,
    ) -> String {
        let k = &c.candle;
        json!({
            "topic": format!("kline.1.{symbol}"),
            "data": [{
                "start": k.open_time, "end": k.open_time + 59_999, "interval": "1",
                "open": px(spec, k.open), "close": px(spec, k.close), "high": px(spec, k.high), "low": px(spec, k.low),
                "volume": k.volume.to_string(), "turnover": c.quote_volume.to_string(),
                "confirm": closed, "timestamp": ctx.now_ms,
            }],
            "ts": ctx.now_ms,
            "type": "snapshot",
        })
        .to_string()
    }

    fn ticker(
        &self,
        symbol: &str,
        spec: &SymbolSpec,
        bid: Level,
        ask: Level,
        cs: u64,
        ctx: &mut Ctx,
    ) -> String {
        json!({
            "topic": format!("tickers.{symbol}"),
            "type": "snapshot",
            "cs": cs,
            "ts": ctx.now_ms,
            "data": {
                "symbol": symbol,
                "bid1Price": px(spec, bid.price), "bid1Size": sz(spec, bid.qty),
                "ask1Price": px(spec, ask.price), "ask1Size": sz(spec, ask.qty),
            },
        })
        .to_string()
    }

    fn heartbeat(&self, _subs: &[Sub], _ctx: &mut Ctx) -> Option<String> {
        None
    }
}
