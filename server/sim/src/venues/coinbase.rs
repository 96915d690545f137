//! Coinbase Advanced Trade WebSocket, the server side: `{"type":"subscribe","product_ids":
//! ["BTC-USDT"],"channel":"level2"}`; `l2_data` (a snapshot event, then update events, absolute
//! quantities), `market_trades`, `candles` (5-minute candles only), `ticker`, `heartbeats`. Every
//! message carries `sequence_num`, one more per message of the connection whatever its channel;
//! there is no checksum. A trade's `side` is the taker's, as millrace reads it.

use serde_json::{json, Value};
use shared::book::Level;
use shared::venue::{Dialect, NumberFormat};

use super::{places, time, BookOut, Channel, Ctx, Request, Sub, Venue};
use crate::engine::Fill;
use crate::klines::SimCandle;
use crate::symbols::SymbolSpec;

#[derive(Default)]
pub(crate) struct Coinbase;

fn envelope(channel: &str, events: Value, ctx: &mut Ctx) -> String {
    json!({
        "channel": channel,
        "client_id": "",
        "timestamp": time(ctx.now_ms),
        "sequence_num": ctx.next_seq(),
        "events": events,
    })
    .to_string()
}

/// A price with the tick's places; one off the tick grid (a `corrupt` fault's phantom level)
/// with all of its digits, so it reads as the very price sent.
fn px(spec: &SymbolSpec, p: shared::Price) -> String {
    if p.raw() % spec.tick.raw().max(1) != 0 {
        return p.to_string();
    }
    p.to_string_fixed(u32::from(places(spec.tick.raw())))
}

impl Venue for Coinbase {
    fn dialect(&self) -> Dialect {
        Dialect::Coinbase
    }

    fn name(&self, spec: &SymbolSpec) -> String {
        super::pair(spec, "-")
    }

    fn default_depth(&self) -> usize {
        1_000
    }

    fn formats(&self, spec: &SymbolSpec) -> (NumberFormat, NumberFormat) {
        (NumberFormat::Fixed(places(spec.tick.raw())), NumberFormat::Shortest)
    }

    fn request(&self, text: &str) -> Result<Request, String> {
        let v: Value = serde_json::from_str(text).map_err(|e| format!("failure to parse: {e}"))?;
        let kind = v["type"].as_str().ok_or("type is required")?;
        let channel = v["channel"].as_str().ok_or("channel is required")?;
        let ids: Vec<String> = v["product_ids"]
            .as_array()
            .map(|a| a.iter().filter_map(|p| p.as_str().map(str::to_string)).collect())
            .unwrap_or_default();
        let channel = match channel {
            "level2" | "l2_data" => Channel::Book,
            "market_trades" => Channel::Trades,
            "candles" => Channel::Candles,
            "ticker" => Channel::Ticker,
            "heartbeats" => Channel::Other("heartbeats"),
            other => return Err(format!("unknown channel {other:?}")),
        };
        let subs = if let Channel::Other(_) = channel {
            vec![Sub { channel, symbol: String::new(), depth: None }]
        } else {
            if ids.is_empty() {
                return Err("product_ids are required".into());
            }
            ids.into_iter().map(|symbol| Sub { channel, symbol, depth: None }).collect()
        };
        match kind {
            "subscribe" => Ok(Request::Subscribe { subs, id: None }),
            "unsubscribe" => Ok(Request::Unsubscribe { subs, id: None }),
            other => Err(format!("unknown type {other:?}")),
        }
    }

    fn answer(&self, req: &Request, outcome: Result<(), &str>, ctx: &mut Ctx) -> Option<String> {
        if let Err(msg) = outcome {
            return Some(json!({"type": "error", "message": msg}).to_string());
        }
        let subs = match req {
            Request::Subscribe { subs, .. } | Request::Unsubscribe { subs, .. } => subs,
            Request::Ping { .. } => return None,
        };
        let ids: Vec<&str> = subs.iter().map(|s| s.symbol.as_str()).collect();
        Some(envelope("subscriptions", json!([{"subscriptions": {"level2": ids}}]), ctx))
    }

    fn book(&self, b: &BookOut<'_>, ctx: &mut Ctx) -> String {
        // an update's levels carry the time of the book they bring it to (the time its REST
        // `product_book` says); a snapshot's, as Coinbase sends them, the epoch
        let t = if b.snapshot { "1970-01-01T00:00:00Z".to_string() } else { time(b.time_ms) };
        let mut updates: Vec<Value> = Vec::with_capacity(b.bids.len() + b.asks.len());
        for (side, levels) in [("bid", b.bids), ("offer", b.asks)] {
            for l in levels {
                updates.push(json!({
                    "side": side, "event_time": t,
                    "price_level": px(b.spec, l.price), "new_quantity": l.qty.to_string(),
                }));
            }
        }
        let kind = if b.snapshot { "snapshot" } else { "update" };
        envelope(
            "l2_data",
            json!([{"type": kind, "product_id": b.symbol, "updates": updates}]),
            ctx,
        )
    }

    fn book_heartbeat(&self, _b: &BookOut<'_>, _ctx: &mut Ctx) -> Option<String> {
        None
    }

    fn trades(&self, symbol: &str, spec: &SymbolSpec, trades: &[Fill], ctx: &mut Ctx) -> String {
        let rows: Vec<Value> = trades
            .iter()
            .map(|t| {
                json!({
                    "trade_id": t.id.to_string(), "product_id": symbol,
                    "price": px(spec, t.price), "size": t.qty.to_string(),
                    "side": if t.buyer_is_maker { "SELL" } else { "BUY" }, "time": time(t.time_ms),
                })
            })
            .collect();
        envelope("market_trades", json!([{"type": "update", "trades": rows}]), ctx)
    }

    fn candle(
        &self,
        symbol: &str,
        spec: &SymbolSpec,
        c: &SimCandle,
        _closed: bool,
        ctx: &mut Ctx,
    ) -> String {
        let k = &c.candle;
        envelope(
            "candles",
            json!([{"type": "update", "candles": [{
                "start": (k.open_time / 1000).to_string(),
                "high": px(spec, k.high), "low": px(spec, k.low), "open": px(spec, k.open),
                "close": px(spec, k.close), "volume": k.volume.to_string(), "product_id": symbol,
            }]}]),
            ctx,
        )
    }

    fn candle_minutes(&self) -> i64 {
        5
    }

    fn ticker(
        &self,
        symbol: &str,
        spec: &SymbolSpec,
        bid: Level,
        ask: Level,
        _cs: u64,
        ctx: &mut Ctx,
    ) -> String {
        envelope(
            "ticker",
            json!([{"type": "update", "tickers": [{
                "type": "ticker", "product_id": symbol, "price": px(spec, bid.price),
                "best_bid": px(spec, bid.price), "best_bid_quantity": bid.qty.to_string(),
                "best_ask": px(spec, ask.price), "best_ask_quantity": ask.qty.to_string(),
            }]}]),
            ctx,
        )
    }

    fn heartbeat(&self, subs: &[Sub], ctx: &mut Ctx) -> Option<String> {
        if !subs.iter().any(|s| s.channel == Channel::Other("heartbeats")) {
            return None;
        }
        let counter = ctx.conn_seq;
        Some(envelope(
            "heartbeats",
            json!([{"current_time": time(ctx.now_ms), "heartbeat_counter": counter}]),
            ctx,
        ))
    }
}
