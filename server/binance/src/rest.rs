//! The Binance REST client: klines, depth snapshots, exchange info and server time, for spot
//! (`/api/v3/...`) and USD-M futures (`/fapi/v1/...`), against a configurable base URL (real
//! Binance, or millrace's simulated exchange).
//!
//! ## Rate limits
//! Binance counts request *weight* per IP and minute and reports the running total in the
//! `X-MBX-USED-WEIGHT-1M` response header; [`RestClient::used_weight_1m`] exposes the last value
//! seen so the caller can slow down before the limit. Past the limit Binance answers `429` with a
//! `Retry-After` header (seconds); a client that keeps calling is banned with `418` (from 2
//! minutes up to 3 days, again with `Retry-After`). Either status becomes
//! [`RestError::RateLimited`], and the client **refuses every further call until the deadline
//! without sending it** (client-side back-off), returning `RateLimited` with the time still to
//! wait. Without a `Retry-After` header the wait is 60 s for 418 and 10 s for 429
//! ([`retry_after`]).
//!
//! ## The weight budget
//! The client also keeps its own ledger of the weight it sends each minute (each endpoint's
//! documented weight, and the exchange's header when that says more) and **never sends a call
//! that would take the minute past its budget** ([`RestConfig::weight_budget_1m`], by default
//! 80 % of the product's limit: 4,800 of spot's 6,000, 1,920 of futures' 2,400). Such a call fails
//! at once with [`RestError::WeightBudget`] and the time to the next minute, so no caller's
//! behaviour (subscription churn, gap fills, snapshots) can take the IP to a 429 and a ban.
//! Binance's minutes turn on its own clock, which may lie a little off ours: a call sent within
//! [`MINUTE_EDGE_MS`] of a minute's edge counts in both minutes, so it fits whichever the
//! exchange puts it in.
//!
//! ## Errors
//! [`RestError`] says whether a failure is worth retrying ([`RestError::is_retryable`]): rate
//! limits, transport failures (connect, timeout) and 5xx are; Binance's 4xx answers (`-1121
//! Invalid symbol.`) and undecodable bodies are not.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::StatusCode;
use serde::de::DeserializeOwned;
use shared::candle::Timeframe;
use shared::sync::DepthSnapshot;
use tokio::time::Instant;

use crate::wire::{
    parse_body, BinanceError, DepthBody, ExchangeInfo, RestKline, ServerTime, WireError,
};
use crate::Product;

/// Default request timeout (connect + whole response).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Wait after a `418` without `Retry-After`.
pub const DEFAULT_BAN_WAIT: Duration = Duration::from_secs(60);
/// Wait after a `429` without `Retry-After`.
pub const DEFAULT_RATE_LIMIT_WAIT: Duration = Duration::from_secs(10);
/// The response header carrying the IP's request weight used in the current minute.
pub const USED_WEIGHT_HEADER: &str = "x-mbx-used-weight-1m";

/// How much of an unexpected error body is kept in [`RestError::Api`].
const MAX_ERROR_BODY: usize = 512;

/// A failed REST call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RestError {
    /// Binance answered 429 (too many requests) or 418 (IP banned), or an earlier such answer's
    /// deadline has not passed (then nothing was sent). Retry after `retry_after`.
    #[error("rate limited by Binance (HTTP {status}); retry in {retry_after:?}")]
    RateLimited { status: u16, retry_after: Duration },
    /// Binance rejected the request: HTTP `status` with its error body (`code` is Binance's
    /// error code, e.g. -1121; `None` when the body was not Binance's error JSON, then `msg` is
    /// the start of the body).
    #[error("Binance answered HTTP {status}{}: {msg}", code.map(|c| format!(" (code {c})")).unwrap_or_default())]
    Api { status: u16, code: Option<i64>, msg: String },
    /// The request did not complete: DNS, connect, TLS, timeout, reset.
    #[error("request to {url} failed: {reason}")]
    Transport { url: String, reason: String, timeout: bool },
    /// A 2xx body that is not what the endpoint returns.
    #[error("undecodable response from {url}: {error}")]
    Decode { url: String, error: WireError },
    /// The call's arguments cannot be sent (a symbol with characters Binance never uses).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Sending the call would take this minute's weight past the client's budget; nothing was
    /// sent. Retry after `retry_after` (the next minute).
    #[error("REST weight budget: {used} of {budget} used this minute, the call needs {needed}; retry in {retry_after:?}")]
    WeightBudget { needed: u32, used: u32, budget: u32, retry_after: Duration },
}

impl RestError {
    /// Whether the same call may succeed later (rate limits after their wait, transport
    /// failures, server errors). Binance's 4xx answers and bad bodies will not.
    pub fn is_retryable(&self) -> bool {
        match self {
            RestError::RateLimited { .. }
            | RestError::WeightBudget { .. }
            | RestError::Transport { .. } => true,
            RestError::Api { status, .. } => *status >= 500,
            RestError::Decode { .. } | RestError::InvalidArgument(_) => false,
        }
    }

    /// Whether a rate limit refused the call (the exchange's 429/418, or the client's own
    /// weight budget).
    pub fn is_rate_limit(&self) -> bool {
        matches!(self, RestError::RateLimited { .. } | RestError::WeightBudget { .. })
    }

    /// How long a rate limit asks the caller to wait.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            RestError::RateLimited { retry_after, .. }
            | RestError::WeightBudget { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }
}

/// The documented request weight of a call (Binance spot `/api/v3`, futures `/fapi/v1`).
pub fn request_weight(product: Product, endpoint: &str, limit: u16) -> u32 {
    match (product, endpoint) {
        (Product::Spot, "klines") => 2,
        (Product::Futures, "klines") => match limit {
            0..=99 => 1,
            100..=499 => 2,
            500..=1000 => 5,
            _ => 10,
        },
        (Product::Spot, "depth") => match limit {
            0..=100 => 5,
            101..=500 => 25,
            501..=1000 => 50,
            _ => 250,
        },
        (Product::Futures, "depth") => match limit {
            0..=50 => 2,
            51..=100 => 5,
            101..=500 => 10,
            _ => 20,
        },
        (Product::Spot, "exchangeInfo") => 20,
        (Product::Spot, "aggTrades") => 4,
        (Product::Futures, "aggTrades") => 20,
        _ => 1,
    }
}

/// How far the exchange's minute may lie from this machine's: a call sent within this much of a
/// minute's edge may land in either minute on the exchange's clock, so the ledger counts it in
/// both (and the exchange's reported weight, likewise, in both).
pub const MINUTE_EDGE_MS: i64 = 1_000;

/// The client's weight ledger: the weight of each minute a call may still land in.
#[derive(Debug, Default)]
struct Ledger {
    /// (minute since the epoch, weight sent in it or reported by the exchange, if more), for at
    /// most the few minutes around now.
    minutes: Vec<(i64, u32)>,
}

impl Ledger {
    /// The minutes a call sent at `now` may be counted in by an exchange whose clock is within
    /// [`MINUTE_EDGE_MS`] of ours: one, or two near an edge.
    fn candidates(now: i64) -> [i64; 2] {
        [(now - MINUTE_EDGE_MS).div_euclid(60_000), (now + MINUTE_EDGE_MS).div_euclid(60_000)]
    }

    fn used(&self, minute: i64) -> u32 {
        self.minutes.iter().find(|(m, _)| *m == minute).map_or(0, |(_, u)| *u)
    }

    /// The most any minute around `now` has used.
    fn used_at(&self, now: i64) -> u32 {
        let [oldest, newest] = Self::candidates(now);
        (oldest..=newest).map(|m| self.used(m)).max().unwrap_or(0)
    }

    /// Sets the weight of every minute a call at `now` may land in to `f` of its current one,
    /// dropping minutes that are over.
    fn update(&mut self, now: i64, f: impl Fn(u32) -> u32) {
        let [oldest, newest] = Self::candidates(now);
        self.minutes.retain(|(m, _)| *m >= oldest);
        for minute in oldest..=newest {
            match self.minutes.iter_mut().find(|(m, _)| *m == minute) {
                Some((_, used)) => *used = f(*used),
                None => self.minutes.push((minute, f(0))),
            }
        }
    }
}

fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Settings of a [`RestClient`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestConfig {
    /// Spot or futures: decides the path prefix (`/api/v3` or `/fapi/v1`).
    pub product: Product,
    /// `https://api.binance.com`, or the simulator's `http://127.0.0.1:port`. No trailing slash
    /// needed.
    pub base_url: String,
    /// Whole-request timeout.
    pub timeout: Duration,
    /// Most request weight sent in a minute (see the module's docs); 0 = no budget.
    pub weight_budget_1m: u32,
}

impl RestConfig {
    /// Real Binance for `product`, default timeout.
    pub fn binance(product: Product) -> Self {
        Self::new(product, product.default_rest_url())
    }

    /// `base_url` for `product`, default timeout.
    pub fn new(product: Product, base_url: impl Into<String>) -> Self {
        RestConfig {
            product,
            base_url: base_url.into(),
            timeout: DEFAULT_TIMEOUT,
            weight_budget_1m: default_weight_budget(product),
        }
    }
}

/// 80 % of the product's weight limit per minute (spot 6,000, futures 2,400).
pub fn default_weight_budget(product: Product) -> u32 {
    match product {
        Product::Spot => 4_800,
        Product::Futures => 1_920,
    }
}

/// The time to wait after a `429`/`418`: the `Retry-After` header in whole seconds (Binance's
/// form), else [`DEFAULT_BAN_WAIT`] for 418 and [`DEFAULT_RATE_LIMIT_WAIT`] otherwise.
pub fn retry_after(status: u16, header: Option<&str>) -> Duration {
    match header.map(str::trim).and_then(|h| h.parse::<u64>().ok()) {
        Some(secs) => Duration::from_secs(secs),
        None if status == 418 => DEFAULT_BAN_WAIT,
        None => DEFAULT_RATE_LIMIT_WAIT,
    }
}

/// Whether `symbol` can go into a query string unescaped (Binance symbols are `A-Z0-9`; the
/// simulator's too).
fn check_symbol(symbol: &str) -> Result<(), RestError> {
    if symbol.is_empty() || !symbol.bytes().all(|c| c.is_ascii_alphanumeric()) {
        return Err(RestError::InvalidArgument(format!(
            "symbol {symbol:?} must be letters and digits, like BTCUSDT"
        )));
    }
    Ok(())
}

/// The query of a klines call (`symbol=BTCUSDT&interval=1m&startTime=..&endTime=..&limit=..`).
pub fn klines_query(
    symbol: &str,
    timeframe: Timeframe,
    start_ms: Option<i64>,
    end_ms: Option<i64>,
    limit: u16,
) -> String {
    let mut q = format!("symbol={}&interval={}", symbol.to_ascii_uppercase(), timeframe.name());
    if let Some(s) = start_ms {
        q.push_str(&format!("&startTime={s}"));
    }
    if let Some(e) = end_ms {
        q.push_str(&format!("&endTime={e}"));
    }
    q.push_str(&format!("&limit={limit}"));
    q
}

/// Sees every request a [`RestClient`] sends and its answer (millrace's recorder keeps them).
pub trait RestObserver: Send + Sync {
    /// A request to `url` goes out; what is returned is handed back with its answer.
    fn request(&self, url: &str) -> u64;
    /// The answer of request `token`: its status and body (empty when it was not read: a rate
    /// limit).
    fn answer(&self, token: u64, status: u16, body: &[u8]);
}

/// A REST client for one product and base URL. Methods take `&self`; share it behind an `Arc`.
pub struct RestClient {
    /// The connection pool; reqwest keeps connections alive between calls.
    http: reqwest::Client,
    /// Base URL without a trailing slash.
    base_url: String,
    /// Decides the path prefix.
    product: Product,
    /// Last `X-MBX-USED-WEIGHT-1M` seen; `u64::MAX` before the first one.
    used_weight: AtomicU64,
    /// The client-side back-off after a 429/418: until when, and which status caused it. A
    /// std mutex: held only to read or replace the value, never across an await.
    blocked: Mutex<Option<(Instant, u16)>>,
    /// See [`RestConfig::weight_budget_1m`].
    budget: u32,
    /// This minute's weight. A std mutex: held only to read or update it, never across an await.
    ledger: Mutex<Ledger>,
    /// Calls refused by the budget.
    budget_refusals: AtomicU64,
    /// Who sees the requests and answers, if anyone ([`RestClient::observe`]).
    observer: std::sync::OnceLock<std::sync::Arc<dyn RestObserver>>,
}

impl std::fmt::Debug for RestClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestClient")
            .field("base_url", &self.base_url)
            .field("product", &self.product)
            .field("observed", &self.observer.get().is_some())
            .finish_non_exhaustive()
    }
}

impl RestClient {
    /// A client for `config`. Fails only if the TLS backend cannot be set up.
    pub fn new(config: RestConfig) -> Result<Self, RestError> {
        let http = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout)
            .user_agent(concat!("millrace/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| RestError::Transport {
                url: config.base_url.clone(),
                reason: e.to_string(),
                timeout: false,
            })?;
        Ok(RestClient {
            http,
            base_url: config.base_url.trim_end_matches('/').to_string(),
            product: config.product,
            used_weight: AtomicU64::new(u64::MAX),
            blocked: Mutex::new(None),
            budget: config.weight_budget_1m,
            ledger: Mutex::new(Ledger::default()),
            budget_refusals: AtomicU64::new(0),
            observer: std::sync::OnceLock::new(),
        })
    }

    /// Shows every request from now on, and its answer, to `observer` (once; a second is
    /// refused and returns `false`).
    pub fn observe(&self, observer: std::sync::Arc<dyn RestObserver>) -> bool {
        self.observer.set(observer).is_ok()
    }

    /// The product this client talks to.
    pub fn product(&self) -> Product {
        self.product
    }

    /// The full URL of `endpoint` (`klines`) with `query`.
    pub fn url(&self, endpoint: &str, query: &str) -> String {
        let mut url = format!("{}{}/{endpoint}", self.base_url, self.product.api_prefix());
        if !query.is_empty() {
            url.push('?');
            url.push_str(query);
        }
        url
    }

    /// The last `X-MBX-USED-WEIGHT-1M` Binance reported, if any response carried it.
    pub fn used_weight_1m(&self) -> Option<u32> {
        match self.used_weight.load(Ordering::Relaxed) {
            u64::MAX => None,
            w => Some(w.min(u32::MAX as u64) as u32),
        }
    }

    /// The weight this client counts as used in the current minute, and its budget.
    pub fn weight_ledger(&self) -> (u32, u32) {
        let ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        (ledger.used_at(wall_clock_ms()), self.budget)
    }

    /// Calls refused by the weight budget since the start.
    pub fn budget_refusals(&self) -> u64 {
        self.budget_refusals.load(Ordering::Relaxed)
    }

    /// Counts `weight` into this minute's ledger, or refuses if that would pass the budget.
    fn reserve(&self, weight: u32) -> Result<(), RestError> {
        self.reserve_at(weight, wall_clock_ms())
    }

    fn reserve_at(&self, weight: u32, now: i64) -> Result<(), RestError> {
        if self.budget == 0 {
            return Ok(());
        }
        let [oldest, newest] = Ledger::candidates(now);
        let mut ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        // the call must fit every minute it may land in; it can go once the last full one is over
        if let Some(full) =
            (oldest..=newest).rev().find(|m| ledger.used(*m).saturating_add(weight) > self.budget)
        {
            self.budget_refusals.fetch_add(1, Ordering::Relaxed);
            let to_free = u64::try_from((full + 1) * 60_000 + MINUTE_EDGE_MS - now).unwrap_or(0);
            return Err(RestError::WeightBudget {
                needed: weight,
                used: ledger.used_at(now),
                budget: self.budget,
                retry_after: Duration::from_millis(to_free),
            });
        }
        ledger.update(now, |used| used + weight);
        Ok(())
    }

    /// The time left of the client-side back-off, if one is running.
    pub fn blocked_for(&self) -> Option<Duration> {
        self.blocked_now().map(|(d, _)| d)
    }

    fn blocked_now(&self) -> Option<(Duration, u16)> {
        let mut guard = self.blocked.lock().unwrap_or_else(|p| p.into_inner());
        let (until, status) = (*guard)?;
        let now = Instant::now();
        if now >= until {
            *guard = None;
            return None;
        }
        Some((until - now, status))
    }

    /// Candles of `symbol` at `timeframe`, oldest first: `GET {prefix}/klines`. `limit` is at
    /// most 1000 on spot and 1500 on futures. The last row may still be forming: compare its
    /// `close_time` with the clock.
    pub async fn klines(
        &self,
        symbol: &str,
        timeframe: Timeframe,
        start_ms: Option<i64>,
        end_ms: Option<i64>,
        limit: u16,
    ) -> Result<Vec<RestKline>, RestError> {
        check_symbol(symbol)?;
        let query = klines_query(symbol, timeframe, start_ms, end_ms, limit);
        self.get("klines", &query, limit).await
    }

    /// The order book snapshot of `symbol`, `limit` levels a side: `GET {prefix}/depth`.
    pub async fn depth(&self, symbol: &str, limit: u16) -> Result<DepthSnapshot, RestError> {
        check_symbol(symbol)?;
        let query = format!("symbol={}&limit={limit}", symbol.to_ascii_uppercase());
        self.get::<DepthBody>("depth", &query, limit).await.map(DepthBody::into_snapshot)
    }

    /// Symbols, their status and filters, and the rate limits: `GET {prefix}/exchangeInfo`.
    pub async fn exchange_info(&self) -> Result<ExchangeInfo, RestError> {
        self.get("exchangeInfo", "", 0).await
    }

    /// Aggregate trades from id `from_id` on, at most `limit` (1 – 1000), oldest first:
    /// `GET {prefix}/aggTrades?fromId=`.
    pub async fn agg_trades(
        &self,
        symbol: &str,
        from_id: u64,
        limit: u16,
    ) -> Result<Vec<crate::wire::RestAggTrade>, RestError> {
        check_symbol(symbol)?;
        let limit = limit.clamp(1, 1000);
        let query =
            format!("symbol={}&fromId={from_id}&limit={limit}", symbol.to_ascii_uppercase());
        self.get("aggTrades", &query, limit).await
    }

    /// The server's clock, ms since the epoch: `GET {prefix}/time`.
    pub async fn server_time(&self) -> Result<i64, RestError> {
        self.get::<ServerTime>("time", "", 0).await.map(|t| t.server_time)
    }

    /// One GET: back-off check, weight budget, send, track the weight, map the status, decode.
    async fn get<T: DeserializeOwned>(
        &self,
        endpoint: &str,
        query: &str,
        limit: u16,
    ) -> Result<T, RestError> {
        if let Some((retry_after, status)) = self.blocked_now() {
            return Err(RestError::RateLimited { status, retry_after });
        }
        self.reserve(request_weight(self.product, endpoint, limit))?;
        let url = self.url(endpoint, query);
        let transport = |e: reqwest::Error, url: &str| RestError::Transport {
            url: url.to_string(),
            reason: e.to_string(),
            timeout: e.is_timeout(),
        };
        let observed = self.observer.get().map(|o| (o, o.request(&url)));
        let response = self.http.get(&url).send().await.map_err(|e| transport(e, &url))?;
        let status = response.status();
        self.note_weight(response.headers());
        let seen = |body: &[u8]| {
            if let Some((o, token)) = observed {
                o.answer(token, status.as_u16(), body);
            }
        };
        if status == StatusCode::TOO_MANY_REQUESTS || status.as_u16() == 418 {
            let header = response.headers().get(RETRY_AFTER).and_then(|v| v.to_str().ok());
            let wait = retry_after(status.as_u16(), header);
            *self.blocked.lock().unwrap_or_else(|p| p.into_inner()) =
                Some((Instant::now() + wait, status.as_u16()));
            tracing::warn!(
                url,
                status = status.as_u16(),
                retry_after_s = wait.as_secs(),
                "Binance rate limit; backing off"
            );
            seen(b"");
            return Err(RestError::RateLimited { status: status.as_u16(), retry_after: wait });
        }
        let body = response.text().await.map_err(|e| transport(e, &url))?;
        seen(body.as_bytes());
        if !status.is_success() {
            return Err(api_error(status.as_u16(), &body));
        }
        parse_body(&body).map_err(|error| RestError::Decode { url, error })
    }

    fn note_weight(&self, headers: &HeaderMap) {
        if let Some(w) = headers
            .get(USED_WEIGHT_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u32>().ok())
        {
            self.used_weight.store(w as u64, Ordering::Relaxed);
            // the exchange counts calls this client did not make (other processes on the IP)
            // which minute the exchange meant is only known away from an edge: near one, both
            let mut ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
            ledger.update(wall_clock_ms(), |used| used.max(w));
        }
    }
}

/// The error for a non-2xx answer: Binance's `{"code":..,"msg":..}` when the body is one.
fn api_error(status: u16, body: &str) -> RestError {
    match serde_json::from_str::<BinanceError>(body) {
        Ok(e) => RestError::Api { status, code: Some(e.code), msg: e.msg },
        Err(_) => {
            let mut end = body.len().min(MAX_ERROR_BODY);
            while !body.is_char_boundary(end) {
                end -= 1;
            }
            RestError::Api { status, code: None, msg: body[..end].to_string() }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_parsing() {
        assert_eq!(retry_after(429, Some("7")), Duration::from_secs(7));
        assert_eq!(retry_after(418, Some(" 120 ")), Duration::from_secs(120));
        assert_eq!(retry_after(418, None), DEFAULT_BAN_WAIT);
        assert_eq!(retry_after(429, None), DEFAULT_RATE_LIMIT_WAIT);
        // an HTTP-date or junk falls back to the default
        assert_eq!(retry_after(418, Some("Wed, 21 Oct 2015 07:28:00 GMT")), DEFAULT_BAN_WAIT);
        assert_eq!(retry_after(429, Some("-3")), DEFAULT_RATE_LIMIT_WAIT);
        assert_eq!(retry_after(429, Some("0")), Duration::ZERO);
    }

    #[test]
    fn urls() {
        let spot = RestClient::new(RestConfig::binance(Product::Spot)).unwrap();
        assert_eq!(
            spot.url("klines", &klines_query("btcusdt", Timeframe::M1, Some(1577836800000), None, 1000)),
            "https://api.binance.com/api/v3/klines?symbol=BTCUSDT&interval=1m&startTime=1577836800000&limit=1000"
        );
        assert_eq!(spot.url("time", ""), "https://api.binance.com/api/v3/time");
        let fut =
            RestClient::new(RestConfig::new(Product::Futures, "http://127.0.0.1:9000/")).unwrap();
        assert_eq!(
            fut.url("klines", &klines_query("ETHUSDT", Timeframe::H4, Some(1), Some(2), 1500)),
            "http://127.0.0.1:9000/fapi/v1/klines?symbol=ETHUSDT&interval=4h&startTime=1&endTime=2&limit=1500"
        );
        assert_eq!(fut.url("exchangeInfo", ""), "http://127.0.0.1:9000/fapi/v1/exchangeInfo");
        assert_eq!(fut.used_weight_1m(), None);
        assert_eq!(fut.blocked_for(), None);
    }

    #[test]
    fn symbols_are_checked_before_sending() {
        assert!(check_symbol("BTCUSDT").is_ok());
        for bad in ["", "BTC/USDT", "BTC&limit=5", "BTC USDT"] {
            assert!(matches!(check_symbol(bad), Err(RestError::InvalidArgument(_))), "{bad}");
        }
    }

    #[test]
    fn error_bodies() {
        assert_eq!(
            api_error(400, r#"{"code":-1121,"msg":"Invalid symbol."}"#),
            RestError::Api { status: 400, code: Some(-1121), msg: "Invalid symbol.".into() }
        );
        let html = "<html>".to_string() + &"é".repeat(400);
        let RestError::Api { code: None, msg, .. } = api_error(502, &html) else { panic!() };
        assert!(msg.len() <= MAX_ERROR_BODY && msg.starts_with("<html>"));
        assert!(api_error(502, "").is_retryable());
        assert!(!api_error(400, "").is_retryable());
        assert!(RestError::RateLimited { status: 429, retry_after: Duration::ZERO }.is_retryable());
    }

    #[test]
    fn request_weights_follow_binance() {
        assert_eq!(request_weight(Product::Spot, "depth", 1000), 50);
        assert_eq!(request_weight(Product::Spot, "depth", 5000), 250);
        assert_eq!(request_weight(Product::Futures, "depth", 1000), 20);
        assert_eq!(request_weight(Product::Spot, "klines", 1000), 2);
        assert_eq!(request_weight(Product::Futures, "klines", 1500), 10);
        assert_eq!(request_weight(Product::Spot, "exchangeInfo", 0), 20);
    }

    #[test]
    fn the_budget_refuses_what_would_pass_it_without_sending() {
        let mut config = RestConfig::new(Product::Spot, "http://127.0.0.1:9");
        config.weight_budget_1m = 120;
        let c = RestClient::new(config).unwrap();
        let t = 1_699_999_990_000; // 10 s into a minute
        c.reserve_at(50, t).unwrap();
        c.reserve_at(50, t + 1).unwrap();
        let e = c.reserve_at(50, t + 2).unwrap_err();
        assert!(matches!(e, RestError::WeightBudget { needed: 50, used: 100, budget: 120, .. }));
        assert!(e.is_rate_limit() && e.is_retryable());
        // free once the minute is over on any clock within the edge of ours
        assert_eq!(e.retry_after(), Some(Duration::from_millis(49_998 + 1_000)));
        c.reserve_at(20, t + 3).unwrap();
        assert_eq!(c.budget_refusals(), 1);
        // the next minute starts a new ledger, once clear of the edge
        c.reserve_at(120, t + 51_000).unwrap();
    }

    /// The exchange's minute need not turn when ours does: a call near the edge may land in
    /// either, so it counts in both, and neither may pass the budget.
    #[test]
    fn calls_near_a_minute_edge_count_in_both_minutes() {
        let mut config = RestConfig::new(Product::Spot, "http://127.0.0.1:9");
        config.weight_budget_1m = 300;
        let c = RestClient::new(config).unwrap();
        let edge = 1_700_000_040_000; // a minute's start
        c.reserve_at(250, edge - 5_000).unwrap();
        // 400 ms before our minute turns: the exchange may already count the next one, or not
        let e = c.reserve_at(250, edge - 400).unwrap_err();
        assert_eq!(e.retry_after(), Some(Duration::from_millis(1_400)));
        // fits both: 290 and 40
        c.reserve_at(40, edge - 400).unwrap();
        // 300 ms into ours: the exchange may still be in the old minute (290 used)
        assert!(c.reserve_at(250, edge + 300).is_err());
        // clear of the edge only the new minute counts, and it holds the 40 sent near the edge
        c.reserve_at(250, edge + 1_000).unwrap();
        assert!(c.reserve_at(20, edge + 1_001).is_err());
        assert_eq!(c.budget_refusals(), 3);
    }
}
