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
}

impl RestError {
    /// Whether the same call may succeed later (rate limits after their wait, transport
    /// failures, server errors). Binance's 4xx answers and bad bodies will not.
    pub fn is_retryable(&self) -> bool {
        match self {
            RestError::RateLimited { .. } | RestError::Transport { .. } => true,
            RestError::Api { status, .. } => *status >= 500,
            RestError::Decode { .. } | RestError::InvalidArgument(_) => false,
        }
    }
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
}

impl RestConfig {
    /// Real Binance for `product`, default timeout.
    pub fn binance(product: Product) -> Self {
        Self::new(product, product.default_rest_url())
    }

    /// `base_url` for `product`, default timeout.
    pub fn new(product: Product, base_url: impl Into<String>) -> Self {
        RestConfig { product, base_url: base_url.into(), timeout: DEFAULT_TIMEOUT }
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

/// A REST client for one product and base URL. Methods take `&self`; share it behind an `Arc`.
#[derive(Debug)]
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
        })
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
        self.get("klines", &klines_query(symbol, timeframe, start_ms, end_ms, limit)).await
    }

    /// The order book snapshot of `symbol`, `limit` levels a side: `GET {prefix}/depth`.
    pub async fn depth(&self, symbol: &str, limit: u16) -> Result<DepthSnapshot, RestError> {
        check_symbol(symbol)?;
        let query = format!("symbol={}&limit={limit}", symbol.to_ascii_uppercase());
        self.get::<DepthBody>("depth", &query).await.map(DepthBody::into_snapshot)
    }

    /// Symbols, their status and filters, and the rate limits: `GET {prefix}/exchangeInfo`.
    pub async fn exchange_info(&self) -> Result<ExchangeInfo, RestError> {
        self.get("exchangeInfo", "").await
    }

    /// The server's clock, ms since the epoch: `GET {prefix}/time`.
    pub async fn server_time(&self) -> Result<i64, RestError> {
        self.get::<ServerTime>("time", "").await.map(|t| t.server_time)
    }

    /// One GET: back-off check, send, track the weight, map the status, decode.
    async fn get<T: DeserializeOwned>(&self, endpoint: &str, query: &str) -> Result<T, RestError> {
        if let Some((retry_after, status)) = self.blocked_now() {
            return Err(RestError::RateLimited { status, retry_after });
        }
        let url = self.url(endpoint, query);
        let transport = |e: reqwest::Error, url: &str| RestError::Transport {
            url: url.to_string(),
            reason: e.to_string(),
            timeout: e.is_timeout(),
        };
        let response = self.http.get(&url).send().await.map_err(|e| transport(e, &url))?;
        let status = response.status();
        self.note_weight(response.headers());
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
            return Err(RestError::RateLimited { status: status.as_u16(), retry_after: wait });
        }
        let body = response.text().await.map_err(|e| transport(e, &url))?;
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
}
