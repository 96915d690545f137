//! Which names a request may reach this server by: the `Host` check of every HTTP request
//! (`server.allowed_hosts`).
//!
//! A web page can make its visitors' browsers read this server's API through DNS rebinding: its
//! name first resolves to the page's server, then to 127.0.0.1 (or the server's private
//! address), and the browser, which thinks it talks to the page's own origin, lets the page read
//! every answer. The browser still sends the page's name in `Host`, so a server that answers only
//! the names it is known by closes that door. Every request (REST, static files, `/ws`,
//! `/metrics`, `/healthz`) whose `Host` is not allowed gets 421 `host_not_allowed`, counted
//! (`millrace_http_refused_host_total`).
//!
//! Allowed are the configured entries (names or addresses, any port; `*` for any host; by
//! default `localhost`, `127.0.0.1` and `[::1]`) and the address the server is bound to. A
//! request without `Host` is HTTP/1.0 from a tool (every browser sends one; HTTP/1.1 requires
//! it: such a request is 400): it is served, since `Host` proves nothing about a client that is
//! not a browser, which could send any allowed name instead. A request in absolute form
//! (`GET http://name/ …`) is checked by the name in its target too.

use std::sync::atomic::Ordering::Relaxed;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode, Version};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use shared::protocol::ops::ApiErrorCode;

use super::{ApiError, AppState};

/// Refuses a request whose `Host` (or target authority) is not allowed (see the module docs).
pub async fn check(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let metrics = &state.app.metrics();
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let (host, more) = (hosts.next(), hosts.next().is_some());
    let bad = |msg: &str| {
        metrics.http_bad_requests.fetch_add(1, Relaxed);
        ApiError::bad(ApiErrorCode::Malformed, msg).into_response()
    };
    if more {
        return bad("a request has one Host header");
    }
    let named: Option<&str> = match host {
        Some(h) => match h.to_str() {
            Ok(h) => Some(h),
            Err(_) => Some("<not text>"),
        },
        None if req.version() >= Version::HTTP_11 => {
            return bad("an HTTP/1.1 request needs a Host header");
        }
        None => None,
    };
    let authority = req.uri().authority().map(|a| a.as_str());
    if let Some(refused) = named.into_iter().chain(authority).find(|h| !state.hosts.allows(h)) {
        metrics.http_refused_host.fetch_add(1, Relaxed);
        let shown = refused.chars().take(200).collect::<String>();
        tracing::debug!(host = %shown, "request refused: host not allowed");
        return ApiError::new(
            StatusCode::MISDIRECTED_REQUEST,
            ApiErrorCode::HostNotAllowed,
            format!(
                "this server does not answer to the name {shown:?}; add it to server.allowed_hosts"
            ),
        )
        .into_response();
    }
    next.run(req).await
}
