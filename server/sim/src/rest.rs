//! The REST side of the simulated exchange: Binance spot (`/api/v3`) and USD-M futures
//! (`/fapi/v1`) market-data endpoints, their errors, request weights and rate limits.
//!
//! | endpoint            | spot weight | futures weight |
//! |---------------------|-------------|----------------|
//! | `ping`, `time`      | 1           | 1              |
//! | `exchangeInfo`      | 20          | 1              |
//! | `klines`            | 2           | 1 / 2 / 5 / 10 by limit (<100, <500, ≤1000, more) |
//! | `depth`             | 5 / 25 / 50 / 250 (limit ≤100, ≤500, ≤1000, more) | 2 / 5 / 10 / 20 (≤50, 100, 500, 1000) |
//!
//! Every `/api` and `/fapi` response carries `X-MBX-USED-WEIGHT-1M`. A client over the budget of
//! its window gets `429` with `Retry-After` (seconds to the next window); one that keeps calling
//! after `ban_after` 429s in a window is banned: `418` with `Retry-After` until the ban ends.
//! Injected REST faults ([`crate::faults`]) come first and do not use weight.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use shared::candle::Timeframe;

use binance::wire::{
    BinanceError, DepthBody, ExchangeInfo, RateLimit, ServerTime, SymbolFilter, SymbolInfo,
};

use crate::faults::Count;
use crate::hub::Flavour;
use crate::klines::SimCandle;
use crate::limiter::Refusal;
use crate::state::Srv;

/// A Binance error response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fail {
    pub status: StatusCode,
    pub code: i64,
    pub msg: String,
    pub retry_after: Option<u64>,
}

impl Fail {
    fn bad(code: i64, msg: impl Into<String>) -> Fail {
        Fail { status: StatusCode::BAD_REQUEST, code, msg: msg.into(), retry_after: None }
    }

    fn illegal(param: &str, range: &str) -> Fail {
        Fail::bad(
            -1100,
            format!("Illegal characters found in parameter '{param}'; legal range is '{range}'."),
        )
    }

    fn mandatory(param: &str) -> Fail {
        Fail::bad(
            -1102,
            format!("Mandatory parameter '{param}' was not sent, was empty/null, or malformed."),
        )
    }

    fn invalid(param: &str) -> Fail {
        Fail::bad(-1130, format!("Data sent for parameter '{param}' is not valid."))
    }
}

impl IntoResponse for Fail {
    fn into_response(self) -> Response {
        let mut r =
            (self.status, Json(BinanceError { code: self.code, msg: self.msg })).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert("retry-after", HeaderValue::from(s));
        }
        r
    }
}

/// Query parameters, percent-decoded; a repeated name is Binance's -1101.
struct Params(HashMap<String, String>);

impl Params {
    fn parse(query: Option<&str>) -> Result<Params, Fail> {
        let mut map = HashMap::new();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let (k, v) = (decode(k), decode(v));
            if map.insert(k, v).is_some() {
                return Err(Fail::bad(-1101, "Duplicate values for a parameter detected."));
            }
        }
        Ok(Params(map))
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    /// A present, non-empty parameter.
    fn required(&self, name: &str) -> Result<&str, Fail> {
        self.get(name).filter(|v| !v.is_empty()).ok_or_else(|| Fail::mandatory(name))
    }

    /// An optional unsigned integer parameter (`^[0-9]{1,20}$`).
    fn number(&self, name: &str) -> Result<Option<u64>, Fail> {
        match self.get(name) {
            None | Some("") => Ok(None),
            Some(v) => v.parse::<u64>().map(Some).map_err(|_| Fail::illegal(name, "^[0-9]{1,20}$")),
        }
    }
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = |c: u8| (c as char).to_digit(16);
                match (hex(b[i + 1]), hex(b[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The `symbol` parameter: `^[A-Z0-9-_.]{1,20}$` and listed.
fn symbol_param<'a>(srv: &'a Srv, p: &Params) -> Result<&'a crate::market::SimMarket, Fail> {
    let s = p.required("symbol")?;
    if s.len() > 20
        || !s.bytes().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || b"-_.".contains(&c))
    {
        return Err(Fail::illegal("symbol", "^[A-Z0-9-_.]{1,20}$"));
    }
    srv.ex.market(s).ok_or_else(|| Fail::bad(-1121, "Invalid symbol."))
}

/// The request weight of a call to `path` with `query`.
fn weight(path: &str, query: Option<&str>) -> u64 {
    let limit =
        Params::parse(query).ok().and_then(|p| p.get("limit").and_then(|v| v.parse::<u64>().ok()));
    let futures = path.starts_with("/fapi/");
    let endpoint = path.rsplit('/').next().unwrap_or("");
    match (futures, endpoint) {
        (false, "exchangeInfo") => 20,
        (false, "klines" | "uiKlines") => 2,
        (false, "depth") => match limit.unwrap_or(100) {
            0..=100 => 5,
            101..=500 => 25,
            501..=1000 => 50,
            _ => 250,
        },
        (true, "klines") => match limit.unwrap_or(500) {
            0..=99 => 1,
            100..=499 => 2,
            500..=1000 => 5,
            _ => 10,
        },
        (true, "depth") => match limit.unwrap_or(500) {
            0..=50 => 2,
            51..=100 => 5,
            101..=500 => 10,
            _ => 20,
        },
        _ => 1,
    }
}

/// Middleware on `/api` and `/fapi`: injected failures, then weight and rate limits, then the
/// `X-MBX-USED-WEIGHT-1M` header.
pub(crate) async fn limits(State(srv): State<Arc<Srv>>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    if let Some((status, retry_after)) = srv.faults.rest_fault(&path) {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let (code, msg, retry) = match status.as_u16() {
            429 => (-1003, "Too many requests (injected fault).", Some(retry_after.unwrap_or(1))),
            418 => (-1003, "Way too many requests; IP banned (injected fault).", Some(retry_after.unwrap_or(1))),
            503 => (
                -1008,
                "Server is currently overloaded with other requests. Please try again in a few minutes.",
                retry_after,
            ),
            _ => (-1000, "An unknown error occurred while processing the request.", retry_after),
        };
        return Fail { status, code, msg: msg.to_string(), retry_after: retry }.into_response();
    }
    let ip = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
        .unwrap_or(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
    let w = weight(&path, req.uri().query());
    let (mut resp, used) = match srv.limiter.charge(ip, w) {
        Ok(used) => (next.run(req).await, used),
        Err(Refusal::TooMany { used, retry_after }) => {
            srv.faults.count(Count::RateLimited, 1);
            let msg = format!(
                "Too much request weight used; current limit is {} request weight per 1 MINUTE. Please use WebSocket Streams for live updates to avoid polling the API.",
                srv.limiter.budget()
            );
            let f = Fail {
                status: StatusCode::TOO_MANY_REQUESTS,
                code: -1003,
                msg,
                retry_after: Some(retry_after),
            };
            (f.into_response(), used)
        }
        Err(Refusal::Banned { used, retry_after, until_ms }) => {
            srv.faults.count(Count::Banned, 1);
            let msg = format!(
                "Way too much request weight used; IP banned until {until_ms}. Please use WebSocket Streams for live updates to avoid bans."
            );
            let status = StatusCode::from_u16(418).expect("418 is a status");
            (
                Fail { status, code: -1003, msg, retry_after: Some(retry_after) }.into_response(),
                used,
            )
        }
    };
    resp.headers_mut().insert("x-mbx-used-weight-1m", HeaderValue::from(used));
    resp.headers_mut().insert("x-mbx-used-weight", HeaderValue::from(used));
    resp
}

/// `GET /api/v3/ping`, `/fapi/v1/ping`: `{}`.
pub(crate) async fn ping() -> Response {
    Json(serde_json::json!({})).into_response()
}

/// `GET /api/v3/time`, `/fapi/v1/time`: simulated now — the time every market's engine has
/// run to, not the clock's reading: the driver advances engines once per tick, and at high
/// speeds a tick spans simulated seconds. A kline whose close time is before this time is final
/// (it is closed in the engine and will not change), which is what a client relies on when it
/// decides from `serverTime` which REST rows are closed.
pub(crate) async fn time(State(srv): State<Arc<Srv>>) -> Response {
    Json(ServerTime { server_time: produced_until(&srv) }).into_response()
}

/// The simulated time every market has been advanced to.
pub(crate) fn produced_until(srv: &Srv) -> i64 {
    srv.ex.markets.iter().map(|m| m.now_ms()).min().unwrap_or_else(|| srv.ex.clock.now_ms())
}

/// `GET /api/v3/exchangeInfo[?symbol=X | ?symbols=["X","Y"]]`.
pub(crate) async fn exchange_info(
    State(srv): State<Arc<Srv>>,
    req: Request,
) -> Result<Response, Fail> {
    let p = Params::parse(req.uri().query())?;
    let mut wanted: Option<Vec<String>> = None;
    if let Some(s) = p.get("symbol") {
        wanted = Some(vec![s.to_string()]);
    }
    if let Some(list) = p.get("symbols") {
        let names: Vec<String> = serde_json::from_str(list).map_err(|_| {
            Fail::illegal(
                "symbols",
                "^\\[(\"[A-Z0-9-_.]{1,20}\"(,\"[A-Z0-9-_.]{1,20}\"){0,}){0,1}\\]$",
            )
        })?;
        wanted = Some(names);
    }
    let markets: Vec<&crate::market::SimMarket> = match &wanted {
        None => srv.ex.markets.iter().collect(),
        Some(names) => names
            .iter()
            .map(|n| srv.ex.market(n).ok_or_else(|| Fail::bad(-1121, "Invalid symbol.")))
            .collect::<Result<_, _>>()?,
    };
    let rl = |t: &str, i: &str, n: u32, limit: u64| RateLimit {
        rate_limit_type: t.into(),
        interval: i.into(),
        interval_num: n,
        limit,
    };
    let info = ExchangeInfo {
        timezone: "UTC".into(),
        server_time: produced_until(&srv),
        rate_limits: vec![
            rl("REQUEST_WEIGHT", "MINUTE", 1, srv.limiter.budget()),
            rl("ORDERS", "SECOND", 10, 100),
            rl("ORDERS", "DAY", 1, 200_000),
            rl("RAW_REQUESTS", "MINUTE", 5, 61_000),
        ],
        symbols: markets
            .iter()
            .map(|m| SymbolInfo {
                symbol: m.spec.symbol.clone(),
                status: "TRADING".into(),
                base_asset: m.spec.base.clone(),
                quote_asset: m.spec.quote.clone(),
                filters: vec![
                    SymbolFilter::PriceFilter {
                        min_price: m.spec.tick,
                        max_price: shared::Price::from_units(1_000_000),
                        tick_size: m.spec.tick,
                    },
                    SymbolFilter::LotSize {
                        min_qty: m.spec.step,
                        max_qty: shared::Qty::from_units(9_000_000),
                        step_size: m.spec.step,
                    },
                ],
            })
            .collect(),
    };
    Ok(Json(info).into_response())
}

/// `GET /api/v3/klines` (and `/fapi/v1/klines`): see [`crate::market::SimMarket::klines`] for the
/// selection. Default limit 500, max 1000 (futures 1500).
pub(crate) async fn klines(State(srv): State<Arc<Srv>>, req: Request) -> Result<Response, Fail> {
    let futures = req.uri().path().starts_with("/fapi/");
    let p = Params::parse(req.uri().query())?;
    symbol_param(&srv, &p)?;
    let symbol = p.required("symbol")?.to_string();
    let interval = p.required("interval")?;
    let tf: Timeframe = interval.parse().map_err(|_| Fail::bad(-1120, "Invalid interval."))?;
    let start = p.number("startTime")?.map(|v| v.min(i64::MAX as u64) as i64);
    let end = p.number("endTime")?.map(|v| v.min(i64::MAX as u64) as i64);
    let max = if futures { 1500 } else { 1000 };
    let limit = p.number("limit")?.unwrap_or(500);
    if limit == 0 || limit > max {
        return Err(Fail::invalid("limit"));
    }
    if let (Some(s), Some(e)) = (start, end) {
        if s > e {
            return Err(Fail::bad(-1023, "Start time is greater than end time."));
        }
    }
    let srv2 = srv.clone();
    let rows = tokio::task::spawn_blocking(move || {
        let m = srv2.ex.market(&symbol).expect("checked above");
        m.klines(tf, start, end, limit as usize)
            .iter()
            .map(|c: &SimCandle| c.rest_row(tf))
            .collect::<Vec<_>>()
    })
    .await
    .map_err(|_| Fail {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        code: -1000,
        msg: "internal error".into(),
        retry_after: None,
    })?;
    Ok(Json(rows).into_response())
}

/// `GET /api/v3/depth?symbol&limit` (default 100, at most 5000; futures default 500, at most
/// 1000): the book and its `lastUpdateId`, read together.
pub(crate) async fn depth(State(srv): State<Arc<Srv>>, req: Request) -> Result<Response, Fail> {
    let flavour =
        if req.uri().path().starts_with("/fapi/") { Flavour::Futures } else { Flavour::Spot };
    let p = Params::parse(req.uri().query())?;
    let m = symbol_param(&srv, &p)?;
    let (default, max) = match flavour {
        Flavour::Spot => (100, 5000),
        Flavour::Futures => (500, 1000),
    };
    let limit = p.number("limit")?.unwrap_or(default);
    if limit == 0 {
        return Err(Fail::invalid("limit"));
    }
    let book = m.book(limit.min(max) as usize);
    let now = srv.ex.clock.now_ms();
    let futures = flavour == Flavour::Futures;
    let body = DepthBody {
        last_update_id: book.last_update_id,
        event_time: futures.then_some(now),
        transaction_time: futures.then_some(now),
        bids: book.bids,
        asks: book.asks,
    };
    Ok(Json(body).into_response())
}

/// `GET /api/v3/aggTrades?symbol=&fromId=&limit=` (and `/fapi/v1/aggTrades`): the published
/// aggregate trades from `fromId` on (limit default 500, at most 1000), oldest first.
pub(crate) async fn agg_trades(
    State(srv): State<Arc<Srv>>,
    req: Request,
) -> Result<Response, Fail> {
    let p = Params::parse(req.uri().query())?;
    let m = symbol_param(&srv, &p)?;
    let limit = p.number("limit")?.unwrap_or(500);
    if limit == 0 || limit > 1000 {
        return Err(Fail::invalid("limit"));
    }
    let from = p.number("fromId")?.unwrap_or(0);
    let rows: Vec<binance::wire::RestAggTrade> = m
        .agg_trades(from, limit as usize)
        .into_iter()
        .map(|a| binance::wire::RestAggTrade {
            agg_trade_id: a.agg_trade_id,
            price: a.price,
            qty: a.qty,
            first_trade_id: a.first_trade_id,
            last_trade_id: a.last_trade_id,
            trade_time: a.trade_time,
            buyer_is_maker: a.buyer_is_maker,
            best_match: true,
        })
        .collect();
    Ok(Json(rows).into_response())
}

/// Anything else under `/api` or `/fapi`: 404 with an empty body, like Binance.
pub(crate) async fn not_found() -> Response {
    (StatusCode::NOT_FOUND, Body::empty()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_decode_and_reject_duplicates() {
        let p = Params::parse(Some("symbol=BTCUSDT&symbols=%5B%22A%22%5D&x=a+b&y=%zz")).unwrap();
        assert_eq!(p.get("symbols"), Some("[\"A\"]"));
        assert_eq!(p.get("x"), Some("a b"));
        assert_eq!(p.get("y"), Some("%zz"));
        assert_eq!(Params::parse(Some("a=1&a=2")).err().unwrap().code, -1101);
        assert_eq!(p.number("symbol").unwrap_err().code, -1100);
        assert_eq!(decode("%4"), "%4");
    }

    #[test]
    fn weights() {
        assert_eq!(weight("/api/v3/depth", Some("symbol=X&limit=5000")), 250);
        assert_eq!(weight("/api/v3/depth", None), 5);
        assert_eq!(weight("/api/v3/klines", Some("limit=1000")), 2);
        assert_eq!(weight("/fapi/v1/klines", Some("limit=1000")), 5);
        assert_eq!(weight("/api/v3/exchangeInfo", None), 20);
        assert_eq!(weight("/api/v3/time", None), 1);
    }
}
