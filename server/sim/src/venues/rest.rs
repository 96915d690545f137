//! The other venues' public REST answers: instruments, 1m candles (newest first, each venue's
//! page size and paging), and the book. A `rest_fail` fault whose path matches answers with the
//! venue's own error body and status (429: its "too many requests").

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use shared::candle::MINUTE_MS;

use super::{pair, places};
use crate::klines::SimCandle;
use crate::market::SimMarket;
use crate::state::Srv;

type Params = Query<HashMap<String, String>>;

pub(crate) fn routes() -> Router<Arc<Srv>> {
    Router::new()
        .route("/okx/api/v5/public/instruments", get(okx_instruments))
        .route("/okx/api/v5/market/books", get(okx_books))
        .route("/okx/api/v5/market/candles", get(okx_candles))
        .route("/okx/api/v5/market/history-candles", get(okx_candles))
        .route("/bybit/v5/market/instruments-info", get(bybit_instruments))
        .route("/bybit/v5/market/kline", get(bybit_kline))
        .route("/bybit/v5/market/orderbook", get(bybit_book))
        .route("/coinbase/api/v3/brokerage/market/products", get(coinbase_products))
        .route("/coinbase/api/v3/brokerage/market/products/{id}/candles", get(coinbase_candles))
        .route("/coinbase/api/v3/brokerage/market/product_book", get(coinbase_book))
        .route("/kraken/0/public/AssetPairs", get(kraken_pairs))
        .route("/kraken/0/public/OHLC", get(kraken_ohlc))
        .route("/kraken/0/public/Depth", get(kraken_depth))
        .route("/okx/api/v5/public/time", get(okx_time))
        .route("/bybit/v5/market/time", get(bybit_time))
        .route("/coinbase/api/v3/brokerage/time", get(coinbase_time))
        .route("/kraken/0/public/Time", get(kraken_time))
}

/// A venue's refusal: its status and its own body.
fn refusal(status: StatusCode, body: Value) -> Response {
    (status, Json(body)).into_response()
}

/// The pending `rest_fail` fault of `path`, as the venue says "too many requests" (or fails).
fn fault(srv: &Srv, path: &str, body: impl Fn(u16) -> Value) -> Option<Response> {
    let (status, retry) = srv.faults.rest_fault(path)?;
    let mut r = refusal(
        StatusCode::from_u16(status).unwrap_or(StatusCode::TOO_MANY_REQUESTS),
        body(status),
    );
    if let Some(s) = retry {
        if let Ok(v) = s.to_string().parse() {
            r.headers_mut().insert("retry-after", v);
        }
    }
    Some(r)
}

fn market<'a>(
    srv: &'a Srv,
    symbol: Option<&String>,
    name: impl Fn(&crate::SymbolSpec) -> String,
) -> Option<&'a SimMarket> {
    super::market_by(srv, symbol?, name)
}

fn int(p: &HashMap<String, String>, k: &str) -> Result<Option<i64>, String> {
    p.get(k).map(|v| v.parse::<i64>().map_err(|_| format!("{k} must be an integer"))).transpose()
}

/// 1m candles of `m`, newest first: at most `limit` whose open time is in `[lo, hi]`, the forming
/// one included when it is in range.
fn candles_newest_first(m: &SimMarket, lo: i64, hi: i64, limit: usize) -> Vec<SimCandle> {
    let forming = m.forming();
    // open times are whole minutes: the newest one at or below `hi`
    let hi = hi.min(forming.candle.open_time);
    let hi = hi - hi.rem_euclid(MINUTE_MS);
    if hi < lo || limit == 0 {
        return Vec::new();
    }
    let lo = lo.max(hi - (limit as i64 - 1) * MINUTE_MS);
    let mut out = m.closed_klines(lo, hi);
    if forming.candle.open_time >= lo && forming.candle.open_time <= hi {
        out.push(forming);
    }
    out.reverse();
    out.truncate(limit);
    out
}

// ---- OKX ----------------------------------------------------------------------------------

fn okx_error(code: &str, msg: &str) -> Value {
    json!({"code": code, "msg": msg, "data": []})
}

fn okx_fault(srv: &Srv, path: &str) -> Option<Response> {
    fault(srv, path, |s| {
        if s == 429 {
            okx_error("50011", "Too Many Requests")
        } else {
            okx_error("50001", "Service temporarily unavailable")
        }
    })
}

async fn okx_instruments(State(srv): State<Arc<Srv>>) -> Response {
    if let Some(r) = okx_fault(&srv, "/okx/api/v5/public/instruments") {
        return r;
    }
    let data: Vec<Value> = srv
        .ex
        .markets
        .iter()
        .map(|m| {
            let s = &m.spec;
            json!({"instId": pair(s, "-"), "instType": "SPOT", "baseCcy": s.base, "quoteCcy": s.quote,
                   "tickSz": s.tick.to_string(), "lotSz": s.step.to_string(), "minSz": s.step.to_string(), "state": "live"})
        })
        .collect();
    Json(json!({"code": "0", "msg": "", "data": data})).into_response()
}

async fn okx_books(State(srv): State<Arc<Srv>>, Query(p): Params) -> Response {
    if let Some(r) = okx_fault(&srv, "/okx/api/v5/market/books") {
        return r;
    }
    let Some(m) = market(&srv, p.get("instId"), |s| pair(s, "-")) else {
        return refusal(
            StatusCode::BAD_REQUEST,
            okx_error("51001", "Instrument ID does not exist"),
        );
    };
    let depth = p.get("sz").and_then(|v| v.parse().ok()).unwrap_or(1).clamp(1, 400);
    let (view, now) = m.book_and_time(depth);
    let side = |ls: &[shared::Level]| -> Vec<[String; 4]> {
        ls.iter()
            .map(|l| [l.price.to_string(), l.qty.to_string(), "0".into(), "1".into()])
            .collect()
    };
    Json(json!({"code": "0", "msg": "", "data": [{"asks": side(&view.asks), "bids": side(&view.bids), "ts": now.to_string()}]}))
        .into_response()
}

/// `candles` / `history-candles`: `after` (older than), `before` (newer than), `limit` (≤ 300 /
/// 100), newest first.
async fn okx_candles(
    State(srv): State<Arc<Srv>>,
    uri: axum::http::Uri,
    Query(p): Params,
) -> Response {
    if let Some(r) = okx_fault(&srv, uri.path()) {
        return r;
    }
    let Some(m) = market(&srv, p.get("instId"), |s| pair(s, "-")) else {
        return refusal(
            StatusCode::BAD_REQUEST,
            okx_error("51001", "Instrument ID does not exist"),
        );
    };
    if p.get("bar").is_some_and(|b| b != "1m") {
        return refusal(StatusCode::BAD_REQUEST, okx_error("51000", "Parameter bar error"));
    }
    let max = if uri.path().ends_with("history-candles") { 100 } else { 300 };
    let (after, before, limit) = match (int(&p, "after"), int(&p, "before"), int(&p, "limit")) {
        (Ok(a), Ok(b), Ok(l)) => (a, b, l.unwrap_or(100).clamp(1, max) as usize),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
            return refusal(StatusCode::BAD_REQUEST, okx_error("51000", &e))
        }
    };
    let hi = after.map_or(i64::MAX, |a| a - 1);
    let lo = before.map_or(m.spec.listed_ms, |b| b + 1);
    let rows: Vec<Value> = candles_newest_first(m, lo, hi, limit)
        .iter()
        .map(|c| {
            let k = &c.candle;
            let closed = k.open_time < m.forming().candle.open_time;
            json!([
                k.open_time.to_string(),
                k.open.to_string(),
                k.high.to_string(),
                k.low.to_string(),
                k.close.to_string(),
                k.volume.to_string(),
                c.quote_volume.to_string(),
                c.quote_volume.to_string(),
                if closed { "1" } else { "0" }
            ])
        })
        .collect();
    Json(json!({"code": "0", "msg": "", "data": rows})).into_response()
}

// ---- Bybit --------------------------------------------------------------------------------

fn bybit_error(code: i64, msg: &str) -> Value {
    json!({"retCode": code, "retMsg": msg, "result": {}, "time": 0})
}

fn bybit_fault(srv: &Srv, path: &str) -> Option<Response> {
    fault(srv, path, |s| {
        if s == 429 {
            bybit_error(10006, "Too many visits!")
        } else {
            bybit_error(10016, "Server error")
        }
    })
}

/// `instruments-info?category=spot|linear`: the same markets in either category (a linear
/// instrument is a `LinearPerpetual` with a `qtyStep`, as Bybit lists them), on one page.
async fn bybit_instruments(State(srv): State<Arc<Srv>>, Query(p): Params) -> Response {
    if let Some(r) = bybit_fault(&srv, "/bybit/v5/market/instruments-info") {
        return r;
    }
    let category = p.get("category").map(String::as_str).unwrap_or("spot");
    if !matches!(category, "spot" | "linear") {
        return Json(bybit_error(10001, "Illegal category")).into_response();
    }
    let list: Vec<Value> = srv
        .ex
        .markets
        .iter()
        .map(|m| {
            let s = &m.spec;
            if category == "linear" {
                json!({"symbol": s.symbol, "contractType": "LinearPerpetual", "baseCoin": s.base,
                       "quoteCoin": s.quote, "settleCoin": s.quote, "status": "Trading",
                       "lotSizeFilter": {"qtyStep": s.step.to_string(), "minOrderQty": s.step.to_string()},
                       "priceFilter": {"tickSize": s.tick.to_string()}})
            } else {
                json!({"symbol": s.symbol, "baseCoin": s.base, "quoteCoin": s.quote, "status": "Trading",
                       "lotSizeFilter": {"basePrecision": s.step.to_string(), "minOrderQty": s.step.to_string()},
                       "priceFilter": {"tickSize": s.tick.to_string()}})
            }
        })
        .collect();
    Json(json!({"retCode": 0, "retMsg": "OK",
                "result": {"category": category, "list": list, "nextPageCursor": ""}}))
    .into_response()
}

async fn bybit_kline(State(srv): State<Arc<Srv>>, Query(p): Params) -> Response {
    if let Some(r) = bybit_fault(&srv, "/bybit/v5/market/kline") {
        return r;
    }
    let Some(m) = market(&srv, p.get("symbol"), |s| s.symbol.clone()) else {
        return Json(bybit_error(10001, "Not supported symbols")).into_response();
    };
    if p.get("interval").is_some_and(|i| i != "1") {
        return Json(bybit_error(10001, "Invalid period!")).into_response();
    }
    let (start, end, limit) = match (int(&p, "start"), int(&p, "end"), int(&p, "limit")) {
        (Ok(s), Ok(e), Ok(l)) => (s, e, l.unwrap_or(200).clamp(1, 1000) as usize),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
            return Json(bybit_error(10001, &e)).into_response()
        }
    };
    let places_p = u32::from(places(m.spec.tick.raw()));
    let list: Vec<Value> =
        candles_newest_first(m, start.unwrap_or(m.spec.listed_ms), end.unwrap_or(i64::MAX), limit)
            .iter()
            .map(|c| {
                let k = &c.candle;
                json!([
                    k.open_time.to_string(),
                    k.open.to_string_fixed(places_p),
                    k.high.to_string_fixed(places_p),
                    k.low.to_string_fixed(places_p),
                    k.close.to_string_fixed(places_p),
                    k.volume.to_string(),
                    c.quote_volume.to_string()
                ])
            })
            .collect();
    let category = if p.get("category").is_some_and(|c| c == "linear") { "linear" } else { "spot" };
    Json(json!({"retCode": 0, "retMsg": "OK", "result": {"category": category, "symbol": m.spec.symbol, "list": list}}))
        .into_response()
}

async fn bybit_book(State(srv): State<Arc<Srv>>, Query(p): Params) -> Response {
    if let Some(r) = bybit_fault(&srv, "/bybit/v5/market/orderbook") {
        return r;
    }
    let Some(m) = market(&srv, p.get("symbol"), |s| s.symbol.clone()) else {
        return Json(bybit_error(10001, "Not supported symbols")).into_response();
    };
    let depth = p.get("limit").and_then(|v| v.parse().ok()).unwrap_or(1).clamp(1, 200);
    let (view, now) = m.book_and_time(depth);
    let (tp, sp) = (u32::from(places(m.spec.tick.raw())), u32::from(places(m.spec.step.raw())));
    let side = |ls: &[shared::Level]| -> Vec<[String; 2]> {
        ls.iter().map(|l| [l.price.to_string_fixed(tp), l.qty.to_string_fixed(sp)]).collect()
    };
    Json(json!({"retCode": 0, "retMsg": "OK", "result": {"s": m.spec.symbol, "b": side(&view.bids), "a": side(&view.asks),
                "ts": now, "u": view.last_update_id, "seq": view.last_update_id}}))
        .into_response()
}

// ---- Coinbase -----------------------------------------------------------------------------

fn coinbase_error(msg: &str) -> Value {
    json!({"error": "INVALID_ARGUMENT", "message": msg})
}

fn coinbase_fault(srv: &Srv, path: &str) -> Option<Response> {
    fault(srv, path, |s| {
        if s == 429 {
            json!({"error": "RATE_LIMIT_EXCEEDED", "message": "Too many requests"})
        } else {
            json!({"error": "INTERNAL", "message": "internal error"})
        }
    })
}

async fn coinbase_products(State(srv): State<Arc<Srv>>) -> Response {
    if let Some(r) = coinbase_fault(&srv, "/coinbase/api/v3/brokerage/market/products") {
        return r;
    }
    let products: Vec<Value> = srv
        .ex
        .markets
        .iter()
        .map(|m| {
            let s = &m.spec;
            json!({"product_id": pair(s, "-"), "base_currency_id": s.base, "quote_currency_id": s.quote,
                   "base_increment": s.step.to_string(), "quote_increment": s.tick.to_string(),
                   "price_increment": s.tick.to_string(), "status": "online"})
        })
        .collect();
    Json(json!({"products": products, "num_products": products.len()})).into_response()
}

/// `start` and `end` in unix seconds, `granularity=ONE_MINUTE`, at most 350 candles.
async fn coinbase_candles(
    State(srv): State<Arc<Srv>>,
    Path(id): Path<String>,
    uri: axum::http::Uri,
    Query(p): Params,
) -> Response {
    if let Some(r) = coinbase_fault(&srv, uri.path()) {
        return r;
    }
    let Some(m) = super::market_by(&srv, &id, |s| pair(s, "-")) else {
        return refusal(
            StatusCode::NOT_FOUND,
            json!({"error": "NOT_FOUND", "message": "product not found"}),
        );
    };
    if p.get("granularity").is_some_and(|g| g != "ONE_MINUTE") {
        return refusal(StatusCode::BAD_REQUEST, coinbase_error("unsupported granularity"));
    }
    let (start, end, limit) = match (int(&p, "start"), int(&p, "end"), int(&p, "limit")) {
        (Ok(s), Ok(e), Ok(l)) => (s, e, l.unwrap_or(350)),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
            return refusal(StatusCode::BAD_REQUEST, coinbase_error(&e))
        }
    };
    if !(1..=350).contains(&limit) {
        return refusal(StatusCode::BAD_REQUEST, coinbase_error("limit must be between 1 and 350"));
    }
    let lo = start.map_or(m.spec.listed_ms, |s| s.saturating_mul(1000));
    let hi = end.map_or(i64::MAX, |e| e.saturating_mul(1000));
    let tp = u32::from(places(m.spec.tick.raw()));
    let candles: Vec<Value> = candles_newest_first(m, lo, hi, limit as usize)
        .iter()
        .map(|c| {
            let k = &c.candle;
            json!({"start": (k.open_time / 1000).to_string(), "low": k.low.to_string_fixed(tp), "high": k.high.to_string_fixed(tp),
                   "open": k.open.to_string_fixed(tp), "close": k.close.to_string_fixed(tp), "volume": k.volume.to_string()})
        })
        .collect();
    Json(json!({"candles": candles})).into_response()
}

async fn coinbase_book(State(srv): State<Arc<Srv>>, Query(p): Params) -> Response {
    if let Some(r) = coinbase_fault(&srv, "/coinbase/api/v3/brokerage/market/product_book") {
        return r;
    }
    let Some(m) = market(&srv, p.get("product_id"), |s| pair(s, "-")) else {
        return refusal(
            StatusCode::NOT_FOUND,
            json!({"error": "NOT_FOUND", "message": "product not found"}),
        );
    };
    let depth = p.get("limit").and_then(|v| v.parse().ok()).unwrap_or(50).clamp(1, 1000);
    let (view, now) = m.book_and_time(depth);
    let side = |ls: &[shared::Level]| -> Vec<Value> {
        ls.iter()
            .map(|l| json!({"price": l.price.to_string(), "size": l.qty.to_string()}))
            .collect()
    };
    let t = super::time(now);
    Json(json!({"pricebook": {"product_id": pair(&m.spec, "-"), "bids": side(&view.bids), "asks": side(&view.asks), "time": t}}))
        .into_response()
}

// ---- Kraken -------------------------------------------------------------------------------

fn kraken_fault(srv: &Srv, path: &str) -> Option<Response> {
    fault(
        srv,
        path,
        |s| json!({"error": [if s == 429 { "EGeneral:Too many requests" } else { "EService:Unavailable" }]}),
    )
}

async fn kraken_pairs(State(srv): State<Arc<Srv>>) -> Response {
    if let Some(r) = kraken_fault(&srv, "/kraken/0/public/AssetPairs") {
        return r;
    }
    let result: serde_json::Map<String, Value> = srv
        .ex
        .markets
        .iter()
        .map(|m| {
            let s = &m.spec;
            (s.symbol.clone(), json!({"altname": s.symbol, "wsname": pair(s, "/"), "base": s.base, "quote": s.quote,
                 "pair_decimals": places(s.tick.raw()), "lot_decimals": 8, "tick_size": s.tick.to_string(),
                 "ordermin": s.step.to_string(), "status": "online"}))
        })
        .collect();
    Json(json!({"error": [], "result": result})).into_response()
}

/// The newest 720 candles only (Kraken keeps no older history); `since` in unix seconds.
async fn kraken_ohlc(State(srv): State<Arc<Srv>>, Query(p): Params) -> Response {
    if let Some(r) = kraken_fault(&srv, "/kraken/0/public/OHLC") {
        return r;
    }
    let Some(m) = market(&srv, p.get("pair"), |s| pair(s, "/"))
        .or_else(|| market(&srv, p.get("pair"), |s| s.symbol.clone()))
    else {
        return Json(json!({"error": ["EQuery:Unknown asset pair"]})).into_response();
    };
    if p.get("interval").is_some_and(|i| i != "1") {
        return Json(json!({"error": ["EGeneral:Invalid arguments"]})).into_response();
    }
    let since = match int(&p, "since") {
        Ok(s) => s.map(|s| s.saturating_mul(1000)),
        Err(_) => return Json(json!({"error": ["EGeneral:Invalid arguments"]})).into_response(),
    };
    let now = m.forming().candle.open_time;
    let oldest = now - 719 * MINUTE_MS;
    let mut rows = candles_newest_first(m, since.map_or(oldest, |s| s.max(oldest)), i64::MAX, 720);
    rows.reverse();
    let tp = u32::from(places(m.spec.tick.raw()));
    let list: Vec<Value> = rows
        .iter()
        .map(|c| {
            let k = &c.candle;
            json!([
                k.open_time / 1000,
                k.open.to_string_fixed(tp),
                k.high.to_string_fixed(tp),
                k.low.to_string_fixed(tp),
                k.close.to_string_fixed(tp),
                k.close.to_string_fixed(tp),
                k.volume.to_string(),
                k.trades
            ])
        })
        .collect();
    let last = rows.last().map_or(0, |c| c.candle.open_time / 1000);
    Json(json!({"error": [], "result": {pair(&m.spec, "/"): list, "last": last}})).into_response()
}

async fn kraken_depth(State(srv): State<Arc<Srv>>, Query(p): Params) -> Response {
    if let Some(r) = kraken_fault(&srv, "/kraken/0/public/Depth") {
        return r;
    }
    let Some(m) = market(&srv, p.get("pair"), |s| pair(s, "/"))
        .or_else(|| market(&srv, p.get("pair"), |s| s.symbol.clone()))
    else {
        return Json(json!({"error": ["EQuery:Unknown asset pair"]})).into_response();
    };
    let depth = p.get("count").and_then(|v| v.parse().ok()).unwrap_or(100).clamp(1, 500);
    let (view, now) = m.book_and_time(depth);
    let tp = u32::from(places(m.spec.tick.raw()));
    let side = |ls: &[shared::Level]| -> Vec<Value> {
        ls.iter()
            .map(|l| json!([l.price.to_string_fixed(tp), l.qty.to_string_fixed(8), now / 1000]))
            .collect()
    };
    Json(json!({"error": [], "result": {pair(&m.spec, "/"): {"asks": side(&view.asks), "bids": side(&view.bids)}}})).into_response()
}

/// The venues' clocks: the simulated now every market has been advanced to (as Binance's
/// `/api/v3/time`), in each venue's answer (OKX ms, Bybit s and ns, Coinbase ISO and ms, Kraken
/// seconds).
async fn okx_time(State(srv): State<Arc<Srv>>) -> Response {
    let now = crate::rest::produced_until(&srv);
    Json(json!({"code": "0", "msg": "", "data": [{"ts": now.to_string()}]})).into_response()
}

async fn bybit_time(State(srv): State<Arc<Srv>>) -> Response {
    let now = crate::rest::produced_until(&srv);
    let (secs, nanos) = (now.div_euclid(1000), i128::from(now) * 1_000_000);
    Json(json!({
        "retCode": 0, "retMsg": "OK",
        "result": {"timeSecond": secs.to_string(), "timeNano": nanos.to_string()},
        "retExtInfo": {}, "time": now,
    }))
    .into_response()
}

async fn coinbase_time(State(srv): State<Arc<Srv>>) -> Response {
    let now = crate::rest::produced_until(&srv);
    let mut iso = String::new();
    venues::write_rfc3339(&mut iso, now);
    Json(json!({
        "iso": iso,
        "epochSeconds": now.div_euclid(1000).to_string(),
        "epochMillis": now.to_string(),
    }))
    .into_response()
}

async fn kraken_time(State(srv): State<Arc<Srv>>) -> Response {
    let secs = crate::rest::produced_until(&srv).div_euclid(1000);
    // (its `rfc1123` text is not served: nothing here reads it)
    Json(json!({"error": [], "result": {"unixtime": secs}})).into_response()
}
