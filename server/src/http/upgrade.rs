//! The WebSocket upgrade of `GET /ws`, done here rather than by axum's `WebSocketUpgrade`
//! so that the session drives tokio-tungstenite's stream itself: it sends large pushes as
//! fragments ([`ws::feed_text`](super::ws)), which axum's `Message` cannot express, over an
//! I/O adapter that batches a burst's writes and frees its buffer after ([`super::batch`]).
//! Both keep an idle connection's write memory small and constant (docs/soak.md).
//!
//! The request is checked by axum's own extractor (same refusals, same statuses); the 101
//! answer and the stream are made here.

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::{FromRequestParts, WebSocketUpgrade};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::WebSocketStream;

use shared::protocol::ErrorCode;

use super::batch::WriteBatch;
use super::ApiError;
use crate::shutdown::Shutdown;

/// A server-side WebSocket on an upgraded HTTP/1.1 connection, its writes batched per burst.
pub type Socket = WebSocketStream<WriteBatch<TokioIo<hyper::upgrade::Upgraded>>>;

/// A valid WebSocket upgrade request, not yet answered.
pub struct Upgrade {
    accept: HeaderValue,
    on_upgrade: OnUpgrade,
}

impl<S: Send + Sync> FromRequestParts<S> for Upgrade {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        // axum's extractor takes the connection's upgrade handle; a clone of it is ours.
        let on_upgrade = parts.extensions.get::<OnUpgrade>().cloned();
        // Only its checks are used: the answer and the stream are made here.
        let _checked = WebSocketUpgrade::from_request_parts(parts, state)
            .await
            .map_err(WebSocketUpgradeRejection::into_response)?;
        // The extractor checked the method, `Connection`, `Upgrade` and the version; HTTP/2 is
        // not served, so the key is there.
        let key = parts.headers.get(header::SEC_WEBSOCKET_KEY);
        let (Some(on_upgrade), Some(key)) = (on_upgrade, key) else {
            let msg = "a WebSocket upgrade needs Sec-WebSocket-Key over HTTP/1.1";
            return Err(
                ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::Malformed, msg).into_response()
            );
        };
        let accept = HeaderValue::from_str(&derive_accept_key(key.as_bytes()))
            .expect("a base64 digest is a valid header value");
        Ok(Self { accept, on_upgrade })
    }
}

impl Upgrade {
    /// Answers 101 and runs `session` on the WebSocket once the client has it, as a task of
    /// `tasks`. A connection that fails to upgrade is dropped.
    pub fn on_upgrade<F, Fut>(
        self,
        config: WebSocketConfig,
        tasks: &Shutdown,
        session: F,
    ) -> Response
    where
        F: FnOnce(Socket) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let Self { accept, on_upgrade } = self;
        tasks.spawn(async move {
            match on_upgrade.await {
                Ok(upgraded) => {
                    let io = WriteBatch::new(TokioIo::new(upgraded));
                    session(WebSocketStream::from_raw_socket(io, Role::Server, Some(config)).await)
                        .await;
                }
                Err(e) => tracing::debug!("WebSocket upgrade failed: {e}"),
            }
        });
        (
            StatusCode::SWITCHING_PROTOCOLS,
            [
                (header::CONNECTION, HeaderValue::from_static("upgrade")),
                (header::UPGRADE, HeaderValue::from_static("websocket")),
                (header::SEC_WEBSOCKET_ACCEPT, accept),
            ],
        )
            .into_response()
    }
}
