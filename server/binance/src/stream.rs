//! One Binance WebSocket stream connection, and the reconnect back-off.
//!
//! [`connect`] opens `{ws_base}/stream?streams=a/b/c` (a combined stream: every event arrives as
//! `{"stream":..,"data":..}`, so the caller knows which subscription it belongs to) and
//! [`Connection::next`] yields decoded [`StreamEvent`]s.
//!
//! ## Liveness
//! - **Server pings** are answered with pongs carrying the same payload (tungstenite queues the
//!   pong; `next` flushes it at once). Binance drops a connection that stops answering (spot: no
//!   pong within a minute of its ping every 20 s; futures: every 3 min / 10 min).
//! - **Own pings**: after `idle_ping_after` without any frame the connection sends a ping;
//!   Binance answers with a pong, which counts as traffic.
//! - **Stall**: no frame at all (data, ping, pong) for `stall_timeout` means the connection is
//!   dead even if TCP has not noticed; `next` returns [`StreamError::Stalled`].
//!
//! ## Errors
//! [`StreamError::is_fatal`] separates the two kinds. A frame that does not decode is
//! [`StreamError::Malformed`]: non-fatal, the caller counts it and calls `next` again. Everything
//! else that `next` returns as an error (close frame, IO error, stall) is fatal: `next` returns
//! `None` afterwards and the caller reconnects, waiting [`shared::backoff::Backoff::next_delay`]
//! between attempts.
//!
//! ## Planned reconnect
//! Binance closes every connection after 24 hours. [`Connection::age`] and
//! [`Connection::reconnect_at`] (`planned_reconnect_after` after opening, default 23 h 50 min)
//! let the caller open a new connection *before* that, wait until the new one delivers, and only
//! then drop the old one, so no event is lost (events seen on both are de-duplicated by update
//! id / event time downstream).

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::fastdepth::{Decoded, DepthDecoder};
use crate::wire::{StreamEvent, WireError, WsRequest};

/// Default: no frame for this long means the connection is dead.
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Default: send a ping after this long without a frame.
pub const DEFAULT_IDLE_PING_AFTER: Duration = Duration::from_secs(10);
/// Default: open a replacement connection this long after opening (Binance closes at 24 h).
pub const DEFAULT_PLANNED_RECONNECT_AFTER: Duration = Duration::from_secs(23 * 3600 + 50 * 60);
/// Default: give up on a connection attempt (TCP, TLS, WebSocket handshake) after this long.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default [`StreamConfig::read_buffer_bytes`]. tungstenite's own default, 128 KiB, is allocated
/// whole by every new connection (so a reconnect holds two for a moment) and zero-filled up to
/// its length at each read attempt; Binance's frames are mostly under 4 KiB, and a larger one
/// still arrives whole (the buffer grows to it).
pub const DEFAULT_READ_BUFFER_BYTES: usize = 16 * 1024;

/// How much of a malformed frame is kept in [`StreamError::Malformed`] for the log.
const MALFORMED_EXCERPT: usize = 256;
/// Payload of our own pings.
const PING_PAYLOAD: &[u8] = b"millrace";
/// How long closing waits for the peer's close reply.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// Why a stream connection failed or a frame was not delivered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    /// The URL or a stream name cannot be used.
    #[error("invalid stream URL: {0}")]
    InvalidUrl(String),
    /// The connection could not be opened: DNS, TCP, TLS or timeout.
    #[error("cannot connect to {url}: {reason}")]
    Connect { url: String, reason: String },
    /// The server refused the WebSocket upgrade (Binance answers 400 for unknown streams).
    #[error("{url} refused the WebSocket handshake with HTTP {status}: {body}")]
    Handshake { url: String, status: u16, body: String },
    /// A text frame that did not decode (non-fatal: count it and go on). `frame` is its start.
    #[error("malformed frame ({error}): {frame}")]
    Malformed { error: WireError, frame: String },
    /// No frame at all for `silent_for` (fatal).
    #[error("no traffic for {silent_for:?}; connection presumed dead")]
    Stalled { silent_for: Duration },
    /// The server closed the connection (fatal). `code` is the close code if a close frame came.
    #[error("connection closed by the server (code {code:?}): {reason}")]
    Closed { code: Option<u16>, reason: String },
    /// Reading or writing the socket failed (fatal).
    #[error("connection failed: {0}")]
    Io(String),
}

impl StreamError {
    /// Whether the connection is finished: everything but [`StreamError::Malformed`].
    pub fn is_fatal(&self) -> bool {
        !matches!(self, StreamError::Malformed { .. })
    }
}

/// Sees every text frame a [`Connection`] receives or sends (millrace's recorder keeps them);
/// set with [`Connection::observe`], dropped with the connection (which says it closed).
pub trait FrameObserver: Send + Sync {
    fn received(&self, text: &str);
    fn sent(&self, text: &str);
}

/// Settings of a stream connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamConfig {
    /// No frame for this long: [`StreamError::Stalled`]. Default 30 s.
    pub stall_timeout: Duration,
    /// Send a ping after this long without a frame (and again every such period). Default 10 s;
    /// keep it well below `stall_timeout` so a live peer has time to answer.
    pub idle_ping_after: Duration,
    /// When [`Connection::reconnect_at`] falls, counted from opening. Default 23 h 50 min.
    pub planned_reconnect_after: Duration,
    /// Limit for opening the connection. Default 10 s.
    pub connect_timeout: Duration,
    /// The socket's read buffer (tungstenite's `read_buffer_size`), at least 1 KiB (a smaller
    /// value is raised to it). Default [`DEFAULT_READ_BUFFER_BYTES`].
    pub read_buffer_bytes: usize,
}

impl Default for StreamConfig {
    fn default() -> Self {
        StreamConfig {
            stall_timeout: DEFAULT_STALL_TIMEOUT,
            idle_ping_after: DEFAULT_IDLE_PING_AFTER,
            planned_reconnect_after: DEFAULT_PLANNED_RECONNECT_AFTER,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            read_buffer_bytes: DEFAULT_READ_BUFFER_BYTES,
        }
    }
}

/// The combined-stream URL: `{ws_base}/stream?streams=a/b/c` (`{ws_base}/stream` for none, to
/// subscribe later). `ws_base` is `wss://stream.binance.com:9443`, `wss://fstream.binance.com`
/// or the simulator's `ws://127.0.0.1:port`.
pub fn stream_url<S: AsRef<str>>(ws_base: &str, streams: &[S]) -> Result<String, StreamError> {
    let base = ws_base.trim_end_matches('/');
    let rest = base.strip_prefix("wss://").or_else(|| base.strip_prefix("ws://"));
    if rest.is_none_or(|r| r.is_empty() || r.contains(['?', '#'])) {
        return Err(StreamError::InvalidUrl(format!(
            "base {ws_base:?} must look like wss://host[:port] or ws://host[:port]"
        )));
    }
    for s in streams {
        let s = s.as_ref();
        let ok = !s.is_empty()
            && s.bytes().all(|c| {
                c.is_ascii_alphanumeric() || matches!(c, b'@' | b'_' | b'!' | b'-' | b'.')
            });
        if !ok {
            return Err(StreamError::InvalidUrl(format!(
                "stream name {s:?} has characters Binance never uses"
            )));
        }
    }
    if streams.is_empty() {
        return Ok(format!("{base}/stream"));
    }
    Ok(format!("{base}/{}", crate::wire::combined_path(streams)))
}

/// Opens a combined-stream connection with the default [`StreamConfig`].
pub async fn connect<S: AsRef<str>>(
    ws_base: &str,
    streams: &[S],
) -> Result<Connection, StreamError> {
    connect_with(ws_base, streams, StreamConfig::default()).await
}

/// Opens a combined-stream connection.
pub async fn connect_with<S: AsRef<str>>(
    ws_base: &str,
    streams: &[S],
    config: StreamConfig,
) -> Result<Connection, StreamError> {
    let url = stream_url(ws_base, streams)?;
    let ws_config = WebSocketConfig::default().read_buffer_size(config.read_buffer_bytes.max(1024));
    let attempt = tokio_tungstenite::connect_async_with_config(url.as_str(), Some(ws_config), true);
    let (ws, _response) = match tokio::time::timeout(config.connect_timeout, attempt).await {
        Err(_) => {
            return Err(StreamError::Connect {
                url,
                reason: format!("timed out after {:?}", config.connect_timeout),
            })
        }
        Ok(Err(tungstenite::Error::Http(response))) => {
            let status = response.status().as_u16();
            let body = response
                .body()
                .as_deref()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default();
            return Err(StreamError::Handshake { url, status, body: excerpt(&body) });
        }
        Ok(Err(e)) => return Err(StreamError::Connect { url, reason: e.to_string() }),
        Ok(Ok(pair)) => pair,
    };
    let now = Instant::now();
    tracing::debug!(url, "Binance stream connected");
    Ok(Connection {
        ws,
        config,
        url,
        opened_at: now,
        last_rx: now,
        last_ping: None,
        done: false,
        next_request_id: 1,
        decoder: DepthDecoder::new(),
        observer: None,
    })
}

fn excerpt(s: &str) -> String {
    let mut end = s.len().min(MALFORMED_EXCERPT);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// An open stream connection. Drive it with [`Connection::next`]; drop it to disconnect (or
/// [`Connection::close`] for a clean close handshake).
pub struct Connection {
    /// The socket (plain TCP for `ws://`, rustls for `wss://`).
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    /// Liveness and reconnect settings.
    config: StreamConfig,
    /// The URL opened, for logs and errors.
    url: String,
    /// When the connection opened: its age decides the planned reconnect.
    opened_at: Instant,
    /// When the last frame of any kind arrived: decides the idle ping and the stall.
    last_rx: Instant,
    /// When our last ping went out, so an idle connection pings once per `idle_ping_after`.
    last_ping: Option<Instant>,
    /// A fatal error was returned: `next` yields `None` from now on.
    done: bool,
    /// Id of the next request sent on this connection.
    next_request_id: u64,
    /// Decodes frames; holds the last diff-depth frame in buffers reused from frame to frame.
    decoder: DepthDecoder,
    /// Who sees the text frames, if anyone ([`Connection::observe`]).
    observer: Option<Box<dyn FrameObserver>>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("url", &self.url)
            .field("age", &self.age())
            .field("done", &self.done)
            .finish()
    }
}

impl Connection {
    /// The next event; `Some(Err(Malformed))` for a bad frame (go on calling), `Some(Err(_))`
    /// with a fatal error once, then `None`. Sends pongs and idle pings while it waits.
    ///
    /// Cancel-safe: dropping the future (e.g. in `select!`) loses no received event.
    pub async fn next(&mut self) -> Option<Result<StreamEvent, StreamError>> {
        Some(match self.next_frame().await? {
            Ok(Decoded::Depth) => Ok(self.decoder.event()),
            Ok(Decoded::Other(event)) => Ok(event),
            Err(e) => Err(e),
        })
    }

    /// [`Connection::next`] without copying diff-depth frames: for [`Decoded::Depth`] the diff
    /// is in [`Connection::decoder`] until the next call (`decoder().delta()` feeds
    /// `BookSync::handle_delta_ref`). Cancel-safe like `next`.
    pub async fn next_frame(&mut self) -> Option<Result<Decoded, StreamError>> {
        let text = match self.next_text().await? {
            Ok(text) => text,
            Err(e) => return Some(Err(e)),
        };
        let parsed = self.decoder.decode(text.as_str());
        Some(
            parsed.map_err(|error| StreamError::Malformed { error, frame: excerpt(text.as_str()) }),
        )
    }

    /// The next text frame, undecoded (for a caller with its own decoder, such as a depth job
    /// that parses diffs straight into its book); like [`Connection::next`] otherwise. Decode
    /// errors are the caller's: [`Connection::malformed`] makes the error `next` would give.
    pub async fn next_text(&mut self) -> Option<Result<tungstenite::Utf8Bytes, StreamError>> {
        if self.done {
            return None;
        }
        loop {
            let stall_at = self.last_rx + self.config.stall_timeout;
            let ping_at = self.last_ping.map_or(self.last_rx, |p| p.max(self.last_rx))
                + self.config.idle_ping_after;
            tokio::select! {
                biased;
                msg = self.ws.next() => {
                    let msg = match msg {
                        None => return self.fail(StreamError::Closed { code: None, reason: "connection ended without a close frame".into() }),
                        Some(Err(e)) => return self.fail(map_ws_error(e)),
                        Some(Ok(msg)) => msg,
                    };
                    self.last_rx = Instant::now();
                    match msg {
                        Message::Text(text) => {
                            if let Some(o) = &self.observer {
                                o.received(text.as_str());
                            }
                            return Some(Ok(text));
                        }
                        Message::Binary(bytes) => {
                            // Binance sends text only; a binary frame is malformed, not fatal
                            let frame = excerpt(&String::from_utf8_lossy(&bytes));
                            return Some(Err(StreamError::Malformed { error: WireError::UnknownFrame("a binary frame"), frame }));
                        }
                        Message::Ping(_) => {
                            // tungstenite has queued the pong with the same payload; send it now
                            if let Err(e) = self.send_within(None, stall_at).await {
                                return self.fail(e);
                            }
                        }
                        Message::Pong(_) | Message::Frame(_) => {}
                        Message::Close(frame) => {
                            // answer the close (queued by tungstenite), briefly
                            let _ = tokio::time::timeout(CLOSE_WAIT, self.ws.flush()).await;
                            let (code, reason) = match frame {
                                Some(f) => (Some(u16::from(f.code)), f.reason.as_str().to_string()),
                                None => (None, String::new()),
                            };
                            return self.fail(StreamError::Closed { code, reason });
                        }
                    }
                }
                _ = tokio::time::sleep_until(stall_at) => {
                    let silent_for = self.last_rx.elapsed();
                    tracing::warn!(url = %self.url, ?silent_for, "Binance stream stalled");
                    return self.fail(StreamError::Stalled { silent_for });
                }
                _ = tokio::time::sleep_until(ping_at) => {
                    self.last_ping = Some(Instant::now());
                    if let Err(e) = self.send_within(Some(Message::Ping(PING_PAYLOAD.into())), stall_at).await {
                        return self.fail(e);
                    }
                }
            }
        }
    }

    /// Sends `msg` (or only flushes queued control frames for `None`), giving up at `deadline`.
    async fn send_within(
        &mut self,
        msg: Option<Message>,
        deadline: Instant,
    ) -> Result<(), StreamError> {
        let fut = async {
            match msg {
                Some(m) => self.ws.send(m).await,
                None => self.ws.flush().await,
            }
        };
        match tokio::time::timeout_at(deadline, fut).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(map_ws_error(e)),
            Err(_) => Err(StreamError::Stalled { silent_for: self.last_rx.elapsed() }),
        }
    }

    /// The error for a text frame that did not decode.
    pub fn malformed(error: WireError, text: &str) -> StreamError {
        StreamError::Malformed { error, frame: excerpt(text) }
    }

    /// The decoder holding the last [`Decoded::Depth`] frame.
    pub fn decoder(&self) -> &DepthDecoder {
        &self.decoder
    }

    fn fail<T>(&mut self, e: StreamError) -> Option<Result<T, StreamError>> {
        self.done = true;
        Some(Err(e))
    }

    /// Sends `SUBSCRIBE` for `streams` and returns the request id; the answer arrives through
    /// [`Connection::next`] as a [`StreamEvent::Reply`] with that id. Binance accepts at most
    /// 5 such messages per second and 1024 streams per connection.
    pub async fn subscribe<S: AsRef<str>>(&mut self, streams: &[S]) -> Result<u64, StreamError> {
        let id = self.next_request_id;
        self.request(WsRequest::subscribe(streams, id)).await
    }

    /// Sends `UNSUBSCRIBE` for `streams`; like [`Connection::subscribe`].
    pub async fn unsubscribe<S: AsRef<str>>(&mut self, streams: &[S]) -> Result<u64, StreamError> {
        let id = self.next_request_id;
        self.request(WsRequest::unsubscribe(streams, id)).await
    }

    async fn request(&mut self, req: WsRequest) -> Result<u64, StreamError> {
        if self.done {
            return Err(StreamError::Io("the connection is finished".into()));
        }
        self.next_request_id += 1;
        let text = serde_json::to_string(&req).map_err(|e| StreamError::Io(e.to_string()))?;
        if let Some(o) = &self.observer {
            o.sent(&text);
        }
        let deadline = Instant::now() + self.config.stall_timeout;
        if let Err(e) = self.send_within(Some(Message::text(text)), deadline).await {
            self.done = true;
            return Err(e);
        }
        Ok(req.id)
    }

    /// Shows every text frame from now on, received or sent, to `observer`, replacing any
    /// earlier one; a frame that arrives whole counts, whatever its decoding gives.
    pub fn observe(&mut self, observer: Box<dyn FrameObserver>) {
        self.observer = Some(observer);
    }

    /// Closes cleanly: sends a normal close frame and waits briefly for the server's answer.
    pub async fn close(mut self) {
        if self.done {
            return;
        }
        let frame =
            tungstenite::protocol::CloseFrame { code: CloseCode::Normal, reason: "".into() };
        let _ = tokio::time::timeout(CLOSE_WAIT, async {
            if self.ws.close(Some(frame)).await.is_ok() {
                while let Some(Ok(_)) = self.ws.next().await {}
            }
        })
        .await;
    }

    /// How long the connection has been open.
    pub fn age(&self) -> Duration {
        self.opened_at.elapsed()
    }

    /// When to open a replacement connection (`planned_reconnect_after` after opening).
    pub fn reconnect_at(&self) -> Instant {
        self.opened_at + self.config.planned_reconnect_after
    }

    /// Whether [`Connection::reconnect_at`] has passed.
    pub fn is_reconnect_due(&self) -> bool {
        Instant::now() >= self.reconnect_at()
    }

    /// The socket's read buffer, in bytes ([`StreamConfig::read_buffer_bytes`]).
    pub fn read_buffer_size(&self) -> usize {
        self.ws.get_config().read_buffer_size
    }

    /// The URL this connection opened.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether a fatal error has ended the connection.
    pub fn is_finished(&self) -> bool {
        self.done
    }
}

fn map_ws_error(e: tungstenite::Error) -> StreamError {
    match e {
        tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed => {
            StreamError::Closed { code: None, reason: e.to_string() }
        }
        other => StreamError::Io(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            stream_url(
                "wss://stream.binance.com:9443",
                &["btcusdt@kline_1m", "btcusdt@depth@100ms"]
            )
            .unwrap(),
            "wss://stream.binance.com:9443/stream?streams=btcusdt@kline_1m/btcusdt@depth@100ms"
        );
        assert_eq!(
            stream_url("ws://127.0.0.1:9000/", &["!miniTicker@arr"]).unwrap(),
            "ws://127.0.0.1:9000/stream?streams=!miniTicker@arr"
        );
        assert_eq!(
            stream_url::<&str>("wss://fstream.binance.com", &[]).unwrap(),
            "wss://fstream.binance.com/stream"
        );
        for base in ["https://api.binance.com", "stream.binance.com", "wss://", "wss://h/?x=1"] {
            assert!(
                matches!(stream_url(base, &["a@trade"]), Err(StreamError::InvalidUrl(_))),
                "{base}"
            );
        }
        for name in ["", "a@trade/b@trade", "a@trade&x", "a b"] {
            assert!(
                matches!(stream_url("wss://h", &[name]), Err(StreamError::InvalidUrl(_))),
                "{name}"
            );
        }
    }

    #[test]
    fn fatality() {
        let malformed =
            StreamError::Malformed { error: WireError::UnknownFrame("x"), frame: String::new() };
        assert!(!malformed.is_fatal());
        assert!(StreamError::Stalled { silent_for: Duration::ZERO }.is_fatal());
        assert!(StreamError::Closed { code: Some(1000), reason: String::new() }.is_fatal());
    }
}
