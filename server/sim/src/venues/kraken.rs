//! Kraken spot WebSocket v2, the server side: `{"method":"subscribe","params":{"channel":"book",
//! "symbol":["BTC/USDT"],"depth":10}}`; `book` (a snapshot, then updates; prices and quantities
//! as JSON numbers; each message carries the CRC-32 of the top 10 asks and bids printed with the
//! pair's precisions; no sequence), `trade`, `ohlc` (interval 1, updated on trades, no "closed"
//! flag), `ticker`, `instrument` (the pairs and their precisions); `heartbeat` every second;
//! `{"method":"ping"}` answered `pong`.

use serde_json::{json, value::RawValue, Value};
use shared::book::Level;
use shared::venue::{Dialect, NumberFormat};

use super::{places, time, BookOut, Channel, Ctx, Request, Sub, Venue};
use crate::engine::Fill;
use crate::klines::SimCandle;
use crate::market::SimMarket;
use crate::symbols::SymbolSpec;

#[derive(Default)]
pub(crate) struct Kraken;

/// Depths Kraken's `book` offers.
const DEPTHS: [usize; 5] = [10, 25, 100, 500, 1000];
/// Places of every pair's quantities (Kraken prints most with 8).
const QTY_PLACES: u8 = 8;

/// A decimal as a JSON number, exactly as printed (never through a float).
fn num(v: impl std::fmt::Display) -> Box<RawValue> {
    RawValue::from_string(v.to_string()).expect("a decimal is a JSON number")
}

fn levels(levels: &[Level]) -> Vec<Value> {
    levels.iter().map(|l| json!({"price": num(l.price), "qty": num(l.qty)})).collect()
}

impl Venue for Kraken {
    fn dialect(&self) -> Dialect {
        Dialect::Kraken
    }

    fn name(&self, spec: &SymbolSpec) -> String {
        super::pair(spec, "/")
    }

    fn default_depth(&self) -> usize {
        10
    }

    fn formats(&self, spec: &SymbolSpec) -> (NumberFormat, NumberFormat) {
        (NumberFormat::Fixed(places(spec.tick.raw())), NumberFormat::Fixed(QTY_PLACES))
    }

    fn request(&self, text: &str) -> Result<Request, String> {
        let v: Value =
            serde_json::from_str(text).map_err(|_| "EGeneral:Invalid arguments".to_string())?;
        let id = v.get("req_id").cloned();
        let method = v["method"].as_str().ok_or("EGeneral:Invalid arguments")?;
        if method == "ping" {
            return Ok(Request::Ping { id });
        }
        let p = &v["params"];
        let channel = match p["channel"].as_str().ok_or("EGeneral:Invalid arguments")? {
            "book" => Channel::Book,
            "trade" => Channel::Trades,
            "ohlc" => {
                if p["interval"].as_u64() != Some(1) {
                    return Err("EGeneral:Invalid arguments:interval".into());
                }
                Channel::Candles
            }
            "ticker" => Channel::Ticker,
            "instrument" => Channel::Other("instrument"),
            other => return Err(format!("EGeneral:Invalid arguments:channel {other}")),
        };
        let depth = match (channel, p["depth"].as_u64()) {
            (Channel::Book, Some(d)) if DEPTHS.contains(&(d as usize)) => Some(d as usize),
            (Channel::Book, Some(_)) => return Err("EGeneral:Invalid arguments:depth".into()),
            (Channel::Book, None) => Some(10),
            _ => None,
        };
        let subs = if let Channel::Other(_) = channel {
            vec![Sub { channel, symbol: String::new(), depth: None }]
        } else {
            let symbols = p["symbol"].as_array().ok_or("EGeneral:Invalid arguments:symbol")?;
            symbols
                .iter()
                .map(|s| s.as_str().map(|s| Sub { channel, symbol: s.to_string(), depth }))
                .collect::<Option<Vec<_>>>()
                .ok_or("EGeneral:Invalid arguments:symbol")?
        };
        match method {
            "subscribe" => Ok(Request::Subscribe { subs, id }),
            "unsubscribe" => Ok(Request::Unsubscribe { subs, id }),
            _ => Err("EGeneral:Invalid arguments:method".into()),
        }
    }

    fn answer(&self, req: &Request, outcome: Result<(), &str>, ctx: &mut Ctx) -> Option<String> {
        let t = time(ctx.now_ms);
        let (method, id) = match req {
            Request::Ping { id } if outcome.is_ok() => {
                return Some(
                    json!({"method": "pong", "req_id": id, "time_in": t, "time_out": t})
                        .to_string(),
                );
            }
            Request::Ping { id } => ("ping", id),
            Request::Subscribe { id, .. } => ("subscribe", id),
            Request::Unsubscribe { id, .. } => ("unsubscribe", id),
        };
        Some(match outcome {
            Ok(()) => json!({"method": method, "success": true, "req_id": id, "time_in": t, "time_out": t}),
            Err(e) => json!({"method": method, "success": false, "error": e, "req_id": id, "time_in": t, "time_out": t}),
        }
        .to_string())
    }

    fn book(&self, b: &BookOut<'_>, _ctx: &mut Ctx) -> String {
        json!({
            "channel": "book",
            "type": if b.snapshot { "snapshot" } else { "update" },
            "data": [{
                "symbol": b.symbol,
                "bids": levels(b.bids),
                "asks": levels(b.asks),
                "checksum": b.checksum.unwrap_or_default(),
                "timestamp": time(b.time_ms),
            }]
        })
        .to_string()
    }

    fn book_heartbeat(&self, _b: &BookOut<'_>, _ctx: &mut Ctx) -> Option<String> {
        None
    }

    fn trades(&self, symbol: &str, _spec: &SymbolSpec, trades: &[Fill], _ctx: &mut Ctx) -> String {
        let data: Vec<Value> = trades
            .iter()
            .map(|t| {
                json!({
                    "symbol": symbol, "side": if t.buyer_is_maker { "sell" } else { "buy" },
                    "price": num(t.price), "qty": num(t.qty), "ord_type": "market",
                    "trade_id": t.id, "timestamp": time(t.time_ms),
                })
            })
            .collect();
        json!({"channel": "trade", "type": "update", "data": data}).to_string()
    }

    fn candle(
        &self,
        symbol: &str,
        _spec: &SymbolSpec,
        c: &SimCandle,
        _closed: bool,
        ctx: &mut Ctx,
    ) -> String {
        let k = &c.candle;
        json!({
            "channel": "ohlc",
            "type": "update",
            "timestamp": time(ctx.now_ms),
            "data": [{
                "symbol": symbol, "open": num(k.open), "high": num(k.high), "low": num(k.low),
                "close": num(k.close), "trades": k.trades, "volume": num(k.volume), "vwap": num(k.close),
                "interval_begin": time(k.open_time), "interval": 1, "timestamp": time(k.open_time + 60_000),
            }]
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
        _ctx: &mut Ctx,
    ) -> String {
        json!({
            "channel": "ticker",
            "type": "update",
            "data": [{
                "symbol": symbol, "bid": num(bid.price), "bid_qty": num(bid.qty),
                "ask": num(ask.price), "ask_qty": num(ask.qty), "last": num(bid.price),
            }]
        })
        .to_string()
    }

    fn heartbeat(&self, _subs: &[Sub], _ctx: &mut Ctx) -> Option<String> {
        Some(json!({"channel": "heartbeat"}).to_string())
    }

    fn on_other(&self, sub: &Sub, markets: &[&SimMarket], _ctx: &mut Ctx) -> Vec<String> {
        if sub.channel != Channel::Other("instrument") {
            return Vec::new();
        }
        let pairs: Vec<Value> = markets
            .iter()
            .map(|m| {
                let s = &m.spec;
                json!({
                    "symbol": self.name(s), "base": s.base, "quote": s.quote, "status": "online",
                    "qty_precision": QTY_PLACES, "qty_increment": num(s.step),
                    "price_precision": places(s.tick.raw()), "price_increment": num(s.tick),
                    "qty_min": num(s.step),
                })
            })
            .collect();
        vec![json!({"channel": "instrument", "type": "snapshot", "data": {"assets": [], "pairs": pairs}}).to_string()]
    }
}
