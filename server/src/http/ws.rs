//! One WebSocket session on `GET /ws`: requests in, replies and pushes out.
//!
//! Requests are handled by [`Session::handle_text`], which does no IO: it returns the reply and
//! changes which streams the session receives. The async [`session`] loop owns the socket and the
//! broadcast receivers. A bad frame is answered with an error reply; the socket stays open.

use std::sync::Arc;

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use shared::protocol::{ClientRequest, ErrorCode, Method, Reply, Stream};
use tokio::sync::{broadcast, watch};

use super::Heartbeats;

/// Largest request accepted; larger frames get a `too_large` reply.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// Largest frame the transport reads at all; larger ones end the connection.
pub const MAX_TRANSPORT_BYTES: usize = 1024 * 1024;

/// Close code "going away" (RFC 6455 7.4.1), sent when the server shuts down.
const GOING_AWAY: u16 = 1001;

/// The request-handling state of one connection.
pub struct Session {
    /// Source of heartbeat receivers.
    heartbeats: Heartbeats,
    /// `Some` while the client is subscribed to `heartbeat`.
    heartbeat: Option<broadcast::Receiver<Arc<str>>>,
}

impl Session {
    pub fn new(heartbeats: Heartbeats) -> Self {
        Self { heartbeats, heartbeat: None }
    }

    /// Is the client subscribed to `heartbeat`?
    #[cfg(test)]
    pub fn is_subscribed_to_heartbeat(&self) -> bool {
        self.heartbeat.is_some()
    }

    /// Handles one text frame and returns the reply to send. A request naming several streams
    /// is applied only if every name is acceptable; otherwise the first bad one is reported.
    pub fn handle_text(&mut self, text: &str) -> Reply {
        if text.len() > MAX_REQUEST_BYTES {
            return Reply::error(
                0,
                ErrorCode::TooLarge,
                format!("request of {} bytes exceeds the limit of {MAX_REQUEST_BYTES}", text.len()),
            );
        }
        let request: ClientRequest = match serde_json::from_str(text) {
            Ok(r) => r,
            Err(e) => return Reply::error(id_of(text), ErrorCode::Malformed, malformed_msg(&e)),
        };
        let mut streams = Vec::with_capacity(request.params.len());
        for name in &request.params {
            match name.parse::<Stream>() {
                Ok(Stream::Heartbeat) => streams.push(Stream::Heartbeat),
                Ok(other) => {
                    return Reply::error(
                        request.id,
                        ErrorCode::UnknownSeries,
                        format!("{other} is not offered: no market data source is configured"),
                    )
                }
                Err(e) => return Reply::error(request.id, ErrorCode::BadStream, e.to_string()),
            }
        }
        for stream in streams {
            match (request.method, stream) {
                (Method::Subscribe, Stream::Heartbeat) => {
                    if self.heartbeat.is_none() {
                        self.heartbeat = Some(self.heartbeats.subscribe());
                    }
                }
                (Method::Unsubscribe, Stream::Heartbeat) => self.heartbeat = None,
                _ => unreachable!("only heartbeat is accepted above"),
            }
        }
        Reply::ok(request.id)
    }

    /// The next heartbeat frame, or pending forever while unsubscribed.
    async fn next_heartbeat(&mut self) -> Arc<str> {
        loop {
            let Some(rx) = self.heartbeat.as_mut() else {
                return std::future::pending().await;
            };
            match rx.recv().await {
                Ok(frame) => return frame,
                // A slow client skips what it missed and continues from the newest heartbeat.
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::debug!(missed, "heartbeat receiver lagged");
                    *rx = rx.resubscribe();
                }
                // The publisher stopped: the server is shutting down.
                Err(broadcast::error::RecvError::Closed) => self.heartbeat = None,
            }
        }
    }
}

/// The request id of an unparseable frame if it has one, else 0.
fn id_of(text: &str) -> u64 {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| v.get("id").and_then(|id| id.as_u64()))
        .unwrap_or(0)
}

fn malformed_msg(e: &serde_json::Error) -> String {
    format!(
        "not a request ({e}); send {{\"method\":\"SUBSCRIBE\"|\"UNSUBSCRIBE\",\"params\":[\"heartbeat\"],\"id\":1}}"
    )
}

/// Runs one connection until the client leaves, the socket fails, or the server shuts down.
pub async fn session(mut socket: WebSocket, heartbeats: Heartbeats, mut shutdown: watch::Receiver<bool>) {
    let mut session = Session::new(heartbeats);
    tracing::debug!("websocket session started");
    loop {
        let out = tokio::select! {
            msg = socket.recv() => match msg {
                Some(Ok(Message::Text(text))) => Some(reply_frame(session.handle_text(text.as_str()))),
                Some(Ok(Message::Binary(_))) => Some(reply_frame(Reply::error(
                    0,
                    ErrorCode::Malformed,
                    "binary frames are not accepted; send JSON text frames",
                ))),
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => None,
                Some(Ok(Message::Close(_))) | None => break,
                Some(Err(e)) => {
                    tracing::debug!("websocket read failed: {e}");
                    break;
                }
            },
            frame = session.next_heartbeat() => Some(Message::Text(frame.as_ref().into())),
            _ = super::stopped(&mut shutdown) => {
                let close = CloseFrame { code: GOING_AWAY, reason: "server shutting down".into() };
                let _ = socket.send(Message::Close(Some(close))).await;
                break;
            }
        };
        if let Some(out) = out {
            if let Err(e) = socket.send(out).await {
                tracing::debug!("websocket write failed: {e}");
                break;
            }
        }
    }
    tracing::debug!("websocket session ended");
}

fn reply_frame(reply: Reply) -> Message {
    Message::Text(serde_json::to_string(&reply).expect("a reply always serializes").into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session() -> Session {
        let (_tx, rx) = watch::channel(false);
        Session::new(Heartbeats::start(std::time::Duration::from_secs(3600), rx))
    }

    fn json(reply: &Reply) -> String {
        serde_json::to_string(reply).unwrap()
    }

    #[tokio::test]
    async fn subscribe_and_unsubscribe_heartbeat() {
        let mut s = session();
        let r = s.handle_text(r#"{"method":"SUBSCRIBE","params":["heartbeat"],"id":1}"#);
        assert_eq!(json(&r), r#"{"id":1,"result":null}"#);
        assert!(s.is_subscribed_to_heartbeat());
        let r = s.handle_text(r#"{"method":"UNSUBSCRIBE","params":["heartbeat"],"id":2}"#);
        assert_eq!(json(&r), r#"{"id":2,"result":null}"#);
        assert!(!s.is_subscribed_to_heartbeat());
    }

    #[tokio::test]
    async fn errors_name_the_problem() {
        let mut s = session();
        let r = s.handle_text("hello");
        assert_eq!(r.id, 0);
        assert_eq!(r.error.unwrap().code, ErrorCode::Malformed);
        let r = s.handle_text(r#"{"method":"WATCH","params":[],"id":9}"#);
        assert_eq!((r.id, r.error.unwrap().code), (9, ErrorCode::Malformed));
        let r = s.handle_text(r#"{"method":"SUBSCRIBE","params":["heartbeat","kline@sim:spot:BTC/USDT:1m"],"id":3}"#);
        assert_eq!((r.id, r.error.unwrap().code), (3, ErrorCode::UnknownSeries));
        assert!(!s.is_subscribed_to_heartbeat(), "a failed request changes nothing");
        let r = s.handle_text(r#"{"method":"SUBSCRIBE","params":["trades@x"],"id":4}"#);
        assert_eq!((r.id, r.error.unwrap().code), (4, ErrorCode::BadStream));
        let big = format!(r#"{{"method":"SUBSCRIBE","params":["{}"],"id":5}}"#, "x".repeat(MAX_REQUEST_BYTES));
        assert_eq!(s.handle_text(&big).error.unwrap().code, ErrorCode::TooLarge);
    }
}
