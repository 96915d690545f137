//! The gate of the admin requests (`POST /api/v1/admin/…`, and the admin's view of
//! `GET /api/v1/ops/sources`): the token, failed attempts per client address, and the body.
//!
//! In this order, each before the next, so an unauthenticated client costs nothing to refuse:
//! 1. **Attempts.** A client address ([`ClientAddr`]) that used up its failed attempts
//!    (`limits.max_admin_failures_per_min_per_ip`, a token bucket refilled at that many a minute)
//!    gets 429 `too_many_attempts` with `Retry-After`, before its token is even compared:
//!    comparing it would let the guessing go on. A successful request takes nothing from the
//!    bucket. (Counted: `millrace_admin_throttled_total`.)
//! 2. **Token**, from the headers, before one byte of the body is read: 403 when no admin token
//!    is configured (admin actions disabled), 401 for a missing or wrong one (a failed attempt;
//!    `millrace_admin_unauthorized_total`). The comparison takes the same time whatever the
//!    given token is and wherever it differs: SHA-256 digests of both are compared in constant
//!    time, so neither the token's length nor its first differing byte leaks through timing.
//! 3. **Body**: at most [`MAX_ADMIN_BODY_BYTES`] (413 `too_large`, by its `Content-Length` before
//!    reading, or as it arrives), whole within `limits.body_timeout_ms` of the request's head
//!    (408 `timeout`); counted (`millrace_http_bodies_refused_total{reason}`).
//!
//! Every refusal closes the connection (`Connection: close`): a body the server did not read
//! cannot be skipped to reach a next request.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt as _;
use sha2::{Digest as _, Sha256};
use shared::protocol::ops::ApiErrorCode;
use subtle::ConstantTimeEq as _;
use tokio::time::Instant;

use super::{ApiError, AppState};
use crate::client_addr::ClientAddr;
use crate::config::Config;
use crate::lock::lock;
use crate::metrics::Metrics;
use crate::rate::Bucket;

/// The largest admin request body: the admin requests are a few short fields
/// (`{"symbol":"sim:stock:600000","target":1}`).
pub const MAX_ADMIN_BODY_BYTES: usize = 4096;

/// Addresses kept in the attempts table before those whose bucket refilled are forgotten.
const FORGET_ABOVE: usize = 4096;

/// What a request's `Authorization` header makes of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenVerdict {
    /// The admin token.
    Admin,
    /// No admin token is configured: admin actions are disabled.
    Disabled,
    /// A missing or wrong token (a failed attempt, counted against the address).
    Wrong,
    /// The address used up its failed attempts; the token was not compared.
    Throttled { retry_after: Duration },
}

/// The admin token and the failed attempts of each client address.
pub struct AdminGate {
    /// SHA-256 of `server.admin_token` (`None`: admin actions disabled).
    token: Option<[u8; 32]>,
    /// `limits.max_admin_failures_per_min_per_ip`.
    failures_per_min: u32,
    /// Failed attempts left per client address; only addresses that failed are here.
    failures: Mutex<HashMap<ClientAddr, Bucket>>,
    /// `limits.body_timeout_ms`.
    body_timeout: Duration,
    metrics: Arc<Metrics>,
}

fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

impl AdminGate {
    pub fn new(config: &Config, metrics: Arc<Metrics>) -> Self {
        Self {
            token: config.server.admin_token.as_deref().map(|t| digest(t.as_bytes())),
            failures_per_min: config.limits.max_admin_failures_per_min_per_ip,
            failures: Mutex::default(),
            body_timeout: Duration::from_millis(config.limits.body_timeout_ms),
            metrics,
        }
    }

    /// Checks `headers`' `Authorization: Bearer <token>` for a client at `who`, at `now`.
    pub fn verdict(&self, who: ClientAddr, headers: &HeaderMap, now: Instant) -> TokenVerdict {
        let Some(expected) = &self.token else { return TokenVerdict::Disabled };
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
            .map(digest);
        let mut failures = lock(&self.failures);
        if let Some(bucket) = failures.get_mut(&who) {
            if let Err(retry_after) = bucket.check(1, now) {
                return TokenVerdict::Throttled { retry_after };
            }
        }
        if given.is_some_and(|g| bool::from(g.ct_eq(expected))) {
            return TokenVerdict::Admin;
        }
        if failures.len() >= FORGET_ABOVE {
            failures.retain(|_, b| !b.is_full(now));
        }
        let per_min = self.failures_per_min;
        failures.entry(who).or_insert_with(|| Bucket::full(per_min, now)).take(1);
        TokenVerdict::Wrong
    }

    /// A request that is not the admin's, answered: 403, 401 or 429 (counted).
    pub fn refusal(&self, verdict: TokenVerdict) -> Response {
        let (status, code, msg, retry_after) = match verdict {
            TokenVerdict::Admin => unreachable!("the admin is not refused"),
            TokenVerdict::Disabled => (
                StatusCode::FORBIDDEN,
                ApiErrorCode::Unauthorized,
                "admin actions are disabled: set server.admin_token or MILLRACE_ADMIN_TOKEN"
                    .to_string(),
                None,
            ),
            TokenVerdict::Wrong => (
                StatusCode::UNAUTHORIZED,
                ApiErrorCode::Unauthorized,
                "missing or wrong `Authorization: Bearer <token>`".to_string(),
                None,
            ),
            TokenVerdict::Throttled { retry_after } => {
                let secs = retry_after.as_millis().div_ceil(1000).max(1);
                let msg = format!("too many failed admin attempts from this address (limits.max_admin_failures_per_min_per_ip = {}); try again in {secs} s", self.failures_per_min);
                (StatusCode::TOO_MANY_REQUESTS, ApiErrorCode::TooManyAttempts, msg, Some(secs))
            }
        };
        let counter = match verdict {
            TokenVerdict::Throttled { .. } => &self.metrics.admin_throttled,
            _ => &self.metrics.admin_unauthorized,
        };
        counter.fetch_add(1, Relaxed);
        let mut response = ApiError::new(status, code, msg).into_response();
        if let Some(secs) = retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs as u64));
        }
        response
    }

    /// The body of an admin request: at most [`MAX_ADMIN_BODY_BYTES`], whole within
    /// `limits.body_timeout_ms` of `started`; else the refusal (counted).
    async fn read_body(
        &self,
        headers: &HeaderMap,
        body: Body,
        started: Instant,
    ) -> Result<Bytes, Response> {
        let too_large = || {
            self.metrics.http_body_too_large.fetch_add(1, Relaxed);
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                ApiErrorCode::TooLarge,
                format!("an admin request's body is at most {MAX_ADMIN_BODY_BYTES} bytes"),
            )
            .into_response()
        };
        let declared = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > MAX_ADMIN_BODY_BYTES as u64) {
            return Err(too_large());
        }
        let deadline = started + self.body_timeout;
        let mut data = body.into_data_stream();
        let mut bytes = Vec::new();
        loop {
            match tokio::time::timeout_at(deadline, data.next()).await {
                Err(_) => {
                    self.metrics.http_body_timeouts.fetch_add(1, Relaxed);
                    return Err(ApiError::new(
                        StatusCode::REQUEST_TIMEOUT,
                        ApiErrorCode::Timeout,
                        format!(
                            "the request's body did not arrive within {} ms (limits.body_timeout_ms)",
                            self.body_timeout.as_millis()
                        ),
                    )
                    .into_response());
                }
                Ok(None) => return Ok(Bytes::from(bytes)),
                Ok(Some(Ok(chunk))) => {
                    if bytes.len() + chunk.len() > MAX_ADMIN_BODY_BYTES {
                        return Err(too_large());
                    }
                    bytes.extend_from_slice(&chunk);
                }
                Ok(Some(Err(e))) => {
                    self.metrics.http_bad_requests.fetch_add(1, Relaxed);
                    let msg = format!("the request's body could not be read: {e}");
                    return Err(ApiError::bad(ApiErrorCode::Malformed, msg).into_response());
                }
            }
        }
    }
}

/// The client address of a request (from the connection; a request that came another way, as
/// in a test calling the router directly, counts as one unknown client).
pub fn client_of(req: &Request) -> ClientAddr {
    let ip = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0.ip());
    ClientAddr::of(ip)
}

/// Ends the connection after `response`.
fn closing(mut response: Response) -> Response {
    response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// The middleware of the admin routes (see the module docs): the handlers get an authorized
/// request whose body has been read, within its limits.
pub async fn guard(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let gate = &state.admin;
    match gate.verdict(client_of(&req), req.headers(), started) {
        TokenVerdict::Admin => {}
        refused => return closing(gate.refusal(refused)),
    }
    let (parts, body) = req.into_parts();
    match gate.read_body(&parts.headers, body, started).await {
        Ok(bytes) => next.run(Request::from_parts(parts, Body::from(bytes))).await,
        Err(refused) => closing(refused),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(token: Option<&str>, failures_per_min: u32) -> AdminGate {
        let mut config = Config::default();
        config.server.admin_token = token.map(str::to_string);
        config.limits.max_admin_failures_per_min_per_ip = failures_per_min;
        AdminGate::new(&config, Arc::default())
    }

    fn bearer(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, format!("Bearer {token}").parse().unwrap());
        h
    }

    fn addr(s: &str) -> ClientAddr {
        ClientAddr::of(s.parse().unwrap())
    }

    #[test]
    fn only_the_whole_token_is_the_admins() {
        let g = gate(Some("secret-token"), 1000);
        let (a, now) = (addr("10.0.0.1"), Instant::now());
        assert_eq!(g.verdict(a, &bearer("secret-token"), now), TokenVerdict::Admin);
        for wrong in ["secret-toke", "secret-tokeN", "secret-token ", "", "secret-token-and-more"] {
            assert_eq!(g.verdict(a, &bearer(wrong), now), TokenVerdict::Wrong, "{wrong:?}");
        }
        assert_eq!(g.verdict(a, &HeaderMap::new(), now), TokenVerdict::Wrong, "no header");
        let mut basic = HeaderMap::new();
        basic.insert(header::AUTHORIZATION, "Basic secret-token".parse().unwrap());
        assert_eq!(g.verdict(a, &basic, now), TokenVerdict::Wrong);
        assert_eq!(gate(None, 10).verdict(a, &bearer("secret-token"), now), TokenVerdict::Disabled);
    }

    #[tokio::test(start_paused = true)]
    async fn failed_attempts_are_limited_per_address_and_successes_cost_nothing() {
        let g = gate(Some("secret-token"), 3);
        let (a, b) = (addr("2001:db8::1"), addr("2001:db8::2"));
        let t0 = Instant::now();
        // Successes take nothing from the bucket.
        for _ in 0..10 {
            assert_eq!(g.verdict(a, &bearer("secret-token"), t0), TokenVerdict::Admin);
        }
        // Three failures from one /64 (two addresses of it), then it waits: even the right
        // token is not compared.
        assert_eq!(g.verdict(a, &bearer("guess-1"), t0), TokenVerdict::Wrong);
        assert_eq!(g.verdict(b, &bearer("guess-2"), t0), TokenVerdict::Wrong);
        assert_eq!(g.verdict(a, &bearer("guess-3"), t0), TokenVerdict::Wrong);
        let throttled = g.verdict(b, &bearer("secret-token"), t0);
        assert_eq!(throttled, TokenVerdict::Throttled { retry_after: Duration::from_secs(20) });
        let r = g.refusal(throttled);
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "20");
        // Another address is not affected.
        assert_eq!(g.verdict(addr("10.0.0.1"), &bearer("secret-token"), t0), TokenVerdict::Admin);
        // One attempt back every 20 s.
        let later = t0 + Duration::from_secs(20);
        assert_eq!(g.verdict(a, &bearer("secret-token"), later), TokenVerdict::Admin);
        assert_eq!(g.verdict(a, &bearer("guess-4"), later), TokenVerdict::Wrong);
        assert!(matches!(g.verdict(a, &bearer("guess-5"), later), TokenVerdict::Throttled { .. }));
        assert_eq!(g.metrics.admin_throttled.load(Relaxed), 1, "refusal() counts");
    }
}
