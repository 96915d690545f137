//! [`TbtFeed`]: the network client of the simulator's tick-by-tick feed.
//!
//! It connects to `ws_base/tbt/ws[?symbols=..]`, reads the symbol list (the first text frame),
//! decodes the binary frames ([`super::wire`]) and delivers [`FeedItem`]s into a **bounded**
//! channel, while its [`FeedTask`] runs. A full channel makes the reader wait, which backs up into
//! the socket; the server then
//! drops the connection as lagging rather than the feed silently losing events. Whatever ends a
//! connection (close, error, lag), the feed sends [`FeedItem::Disconnected`] and reconnects with
//! jittered exponential back-off ([`Backoff`]); each new connection
//! starts with [`FeedItem::Connected`], after which the consumer must resync (events in between
//! are lost; sequence numbers tell it which).
//!
//! A malformed frame is counted ([`FeedStats::malformed_frames`]), logged and skipped — never a
//! panic; the consumer sees the missing events as a seq gap.
//!
//! Recovery over REST: [`TbtRest::snapshot`] (resting orders + channel seq, for
//! `shared::l3::L3Book::restore`) and [`TbtRest::replay`] (re-request a seq range from the
//! server's history ring, paging through it).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use rand::{RngCore as _, SeedableRng};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{self, Message};

use crate::wire::{self, FrameError};
use crate::{Control, FeedEvent, Hello, TbtSnapshot, TbtStatus, TbtSymbol, TrueBook};
use shared::backoff::Backoff;

/// What the feed delivers, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FeedItem {
    /// A connection is up and streams these symbols; anything before it may be lost.
    Connected(Vec<TbtSymbol>),
    /// The events of one frame, in the server's order (per channel in seq order).
    Events(Vec<FeedEvent>),
    /// The connection ended (why); the feed reconnects after a back-off.
    Disconnected(String),
}

/// Configuration of a [`TbtFeed`].
#[derive(Debug, Clone)]
pub struct FeedConfig {
    /// The simulator's HTTP base, `http://127.0.0.1:PORT` (the WebSocket URL is derived from it).
    pub base: String,
    /// Symbols to stream; `None`: all.
    pub symbols: Option<Vec<String>>,
    /// Items the channel holds before the reader waits.
    pub channel_capacity: usize,
    /// First reconnect delay (doubling, with jitter).
    pub backoff_min: Duration,
    /// Largest reconnect delay.
    pub backoff_max: Duration,
    /// Time allowed for connecting and receiving the symbol list.
    pub connect_timeout: Duration,
    /// Bearer token of the source's control requests ([`TbtRest::control`]).
    pub control_token: Option<String>,
    /// The socket's read buffer (tungstenite's `read_buffer_size`), at least 1 KiB (a smaller
    /// value is raised to it). Default [`DEFAULT_READ_BUFFER_BYTES`]; a longer frame still
    /// arrives whole.
    pub read_buffer_bytes: usize,
    /// The longest frame accepted; a longer one ends the connection (counted in
    /// [`FeedStats::malformed_frames`]) and the feed reconnects. Default
    /// [`DEFAULT_MAX_FRAME_BYTES`].
    pub max_frame_bytes: usize,
}

/// Default [`FeedConfig::read_buffer_bytes`]. tungstenite's own default, 128 KiB, is allocated
/// whole by every connection and zero-filled up to its length at each read attempt; most
/// frames are a few KiB.
pub const DEFAULT_READ_BUFFER_BYTES: usize = 16 * 1024;

/// Default [`FeedConfig::max_frame_bytes`]: 8 MiB, about 160,000 events in one frame (the
/// simulator sends at most 4,096 by default). tungstenite's own limit is 64 MiB.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 8 << 20;

impl FeedConfig {
    pub fn new(base: impl Into<String>) -> Self {
        FeedConfig {
            base: base.into().trim_end_matches('/').to_string(),
            symbols: None,
            channel_capacity: 1_024,
            backoff_min: Duration::from_millis(200),
            backoff_max: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            control_token: None,
            read_buffer_bytes: DEFAULT_READ_BUFFER_BYTES,
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
        }
    }

    /// The WebSocket settings of a connection: the read buffer and the frame limit.
    pub fn ws_config(&self) -> WebSocketConfig {
        WebSocketConfig::default()
            .read_buffer_size(self.read_buffer_bytes.max(1024))
            .max_message_size(Some(self.max_frame_bytes))
            .max_frame_size(Some(self.max_frame_bytes))
    }

    /// `ws://…/tbt/ws[?symbols=a,b]`.
    pub fn ws_url(&self) -> String {
        let ws = if let Some(rest) = self.base.strip_prefix("https://") {
            format!("wss://{rest}")
        } else if let Some(rest) = self.base.strip_prefix("http://") {
            format!("ws://{rest}")
        } else {
            self.base.clone()
        };
        match &self.symbols {
            Some(s) => format!("{ws}/tbt/ws?symbols={}", s.join(",")),
            None => format!("{ws}/tbt/ws"),
        }
    }
}

/// Counters of a feed; all only increase.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct FeedStats {
    pub connects: u64,
    pub disconnects: u64,
    /// Connection attempts that failed before the symbol list arrived.
    pub connect_failures: u64,
    pub frames: u64,
    pub events: u64,
    pub bytes: u64,
    /// Frames that could not be decoded (skipped), plus unexpected text frames.
    pub malformed_frames: u64,
}

#[derive(Default)]
struct Counters {
    connects: AtomicU64,
    disconnects: AtomicU64,
    connect_failures: AtomicU64,
    frames: AtomicU64,
    events: AtomicU64,
    bytes: AtomicU64,
    malformed_frames: AtomicU64,
}

/// Errors of the REST side.
#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    #[error("request to {url} failed: {source}")]
    Http { url: String, source: reqwest::Error },
    #[error("{url} answered {status}: {msg}")]
    Status { url: String, status: u16, msg: String },
    #[error("{url}: undecodable body: {source}")]
    Wire { url: String, source: FrameError },
    #[error("{url}: {msg}")]
    Gone { url: String, first: Option<u64>, msg: String },
}

/// The REST half: snapshot, replay, oracle book, status, control.
#[derive(Clone)]
pub struct TbtRest {
    base: String,
    http: reqwest::Client,
    /// Sent as `Authorization: Bearer` with control requests.
    token: Option<String>,
}

impl TbtRest {
    pub fn new(base: impl Into<String>) -> Self {
        let http =
            reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap_or_default();
        TbtRest { base: base.into().trim_end_matches('/').to_string(), http, token: None }
    }

    /// The same client, sending `token` with its control requests (the simulator refuses them
    /// without its control token).
    pub fn with_token(mut self, token: Option<String>) -> Self {
        self.token = token;
        self
    }

    async fn get(&self, path_query: String) -> Result<reqwest::Response, FeedError> {
        let url = format!("{}{path_query}", self.base);
        let r = self
            .http
            .get(&url)
            .send()
            .await
            .map_err(|source| FeedError::Http { url: url.clone(), source })?;
        check(url, r).await
    }

    async fn json<T: serde::de::DeserializeOwned>(
        &self,
        path_query: String,
    ) -> Result<T, FeedError> {
        let url = format!("{}{path_query}", self.base);
        self.get(path_query).await?.json().await.map_err(|source| FeedError::Http { url, source })
    }

    /// Every resting order of `symbol` and the channel seq they reflect.
    pub async fn snapshot(&self, symbol: &str) -> Result<TbtSnapshot, FeedError> {
        self.json(format!("/tbt/snapshot?symbol={symbol}")).await
    }

    /// The source's true book (the simulator's oracle), `levels` per side.
    pub async fn book(&self, symbol: &str, levels: usize) -> Result<TrueBook, FeedError> {
        self.json(format!("/tbt/book?symbol={symbol}&levels={levels}")).await
    }

    pub async fn status(&self) -> Result<TbtStatus, FeedError> {
        self.json("/tbt/status".into()).await
    }

    /// Sends a control command (hot spot, pause, wire drop) as JSON, with the control token.
    pub async fn control(&self, cmd: &Control) -> Result<(), FeedError> {
        let url = format!("{}/tbt/control", self.base);
        let mut req = self.http.post(&url).json(cmd);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.map_err(|source| FeedError::Http { url: url.clone(), source })?;
        check(url, r).await.map(|_| ())
    }

    /// Re-requests the events of `symbol` with seq in `[from, to]` (fewer if the server has not
    /// generated up to `to` yet), paging through the server's answer limit.
    pub async fn replay(
        &self,
        symbol: &str,
        from: u64,
        to: u64,
    ) -> Result<Vec<FeedEvent>, FeedError> {
        let mut out: Vec<FeedEvent> = Vec::new();
        let mut next = from;
        while next <= to {
            let pq = format!("/tbt/replay?symbol={symbol}&from={next}&to={to}");
            let url = format!("{}{pq}", self.base);
            let body = self
                .get(pq)
                .await?
                .bytes()
                .await
                .map_err(|source| FeedError::Http { url: url.clone(), source })?;
            let before = out.len();
            wire::decode(&body, &mut out).map_err(|source| FeedError::Wire { url, source })?;
            match out.last() {
                Some(last) if out.len() > before => next = last.seq + 1,
                _ => break,
            }
        }
        Ok(out)
    }
}

async fn check(url: String, r: reqwest::Response) -> Result<reqwest::Response, FeedError> {
    let status = r.status();
    if status.is_success() {
        return Ok(r);
    }
    let body = r.text().await.unwrap_or_default();
    let msg = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("msg").and_then(|m| m.as_str()).map(String::from))
        .unwrap_or(body);
    if status == reqwest::StatusCode::GONE {
        // "events before seq N of X are no longer kept (asked from A)"
        let first =
            msg.split_whitespace().skip_while(|w| *w != "seq").nth(1).and_then(|n| n.parse().ok());
        return Err(FeedError::Gone { url, first, msg });
    }
    Err(FeedError::Status { url, status: status.as_u16(), msg })
}

struct Inner {
    counters: Counters,
    symbols: Mutex<Vec<TbtSymbol>>,
}

/// A feed client (see the module docs): its counters and REST client. The connection loop is
/// the [`FeedTask`] that [`TbtFeed::new`] returns, for the caller to run where its tasks run.
pub struct TbtFeed {
    inner: Arc<Inner>,
    rest: TbtRest,
}

/// The feed's connection loop: reconnects until the item receiver is dropped, or until the
/// caller stops polling it (drop it to stop the feed; it is cancel safe).
pub type FeedTask = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

impl TbtFeed {
    /// A client of `config.base`; items arrive on the receiver once the [`FeedTask`] runs.
    pub fn new(config: FeedConfig) -> (TbtFeed, mpsc::Receiver<FeedItem>, FeedTask) {
        let (tx, rx) = mpsc::channel(config.channel_capacity.max(1));
        let inner =
            Arc::new(Inner { counters: Counters::default(), symbols: Mutex::new(Vec::new()) });
        let rest = TbtRest::new(config.base.clone()).with_token(config.control_token.clone());
        let task = Box::pin(run(config, inner.clone(), tx));
        (TbtFeed { inner, rest }, rx, task)
    }

    /// The REST client of the same server.
    pub fn rest(&self) -> &TbtRest {
        &self.rest
    }

    pub async fn snapshot(&self, symbol: &str) -> Result<TbtSnapshot, FeedError> {
        self.rest.snapshot(symbol).await
    }

    pub async fn replay(
        &self,
        symbol: &str,
        from: u64,
        to: u64,
    ) -> Result<Vec<FeedEvent>, FeedError> {
        self.rest.replay(symbol, from, to).await
    }

    /// The symbol list of the latest connection.
    pub fn symbols(&self) -> Vec<TbtSymbol> {
        self.inner.symbols.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn stats(&self) -> FeedStats {
        let c = &self.inner.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FeedStats {
            connects: l(&c.connects),
            disconnects: l(&c.disconnects),
            connect_failures: l(&c.connect_failures),
            frames: l(&c.frames),
            events: l(&c.events),
            bytes: l(&c.bytes),
            malformed_frames: l(&c.malformed_frames),
        }
    }
}

async fn run(config: FeedConfig, inner: Arc<Inner>, tx: mpsc::Sender<FeedItem>) {
    let mut backoff = Backoff::new(config.backoff_min, config.backoff_max)
        .with_healthy_after(Duration::from_secs(10));
    let mut rng = rand::rngs::SmallRng::seed_from_u64(crate::wall_clock_us() ^ 0x7462_7466);
    let url = config.ws_url();
    loop {
        let started = Instant::now();
        let reason = session(&config, &url, &inner, &tx).await;
        let Some(reason) = reason else { return }; // the consumer is gone
        inner.counters.disconnects.fetch_add(1, Ordering::Relaxed);
        tracing::info!(%url, %reason, "tick-by-tick feed disconnected");
        if tx.send(FeedItem::Disconnected(reason)).await.is_err() {
            return;
        }
        backoff.connection_ended(started.elapsed());
        let delay = backoff.next_delay(rng.next_u32());
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = tx.closed() => return,
        }
    }
}

/// One connection; returns why it ended, or `None` when the consumer dropped the receiver.
async fn session(
    config: &FeedConfig,
    url: &str,
    inner: &Inner,
    tx: &mpsc::Sender<FeedItem>,
) -> Option<String> {
    let c = &inner.counters;
    let connect = async {
        let (mut ws, _) =
            tokio_tungstenite::connect_async_with_config(url, Some(config.ws_config()), true)
                .await
                .map_err(|e| format!("connect failed: {e}"))?;
        loop {
            match ws.next().await {
                Some(Ok(Message::Text(t))) => {
                    let hello: Hello = serde_json::from_str(&t).map_err(|e| {
                        c.malformed_frames.fetch_add(1, Ordering::Relaxed);
                        format!("bad symbol list: {e}")
                    })?;
                    return Ok((ws, hello));
                }
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                Some(Ok(Message::Close(f))) => {
                    return Err(format!("closed before the symbol list: {f:?}"))
                }
                Some(Ok(_)) => {
                    c.malformed_frames.fetch_add(1, Ordering::Relaxed);
                    return Err("expected the symbol list as the first frame".to_string());
                }
                Some(Err(e)) => return Err(format!("read failed: {e}")),
                None => return Err("connection closed".to_string()),
            }
        }
    };
    let (mut ws, hello) = match tokio::time::timeout(config.connect_timeout, connect).await {
        Ok(Ok(x)) => x,
        Ok(Err(e)) => {
            c.connect_failures.fetch_add(1, Ordering::Relaxed);
            return Some(e);
        }
        Err(_) => {
            c.connect_failures.fetch_add(1, Ordering::Relaxed);
            return Some(format!("no symbol list within {:?}", config.connect_timeout));
        }
    };
    c.connects.fetch_add(1, Ordering::Relaxed);
    *inner.symbols.lock().unwrap_or_else(|e| e.into_inner()) = hello.symbols.clone();
    tx.send(FeedItem::Connected(hello.symbols)).await.ok()?;
    loop {
        match ws.next().await {
            Some(Ok(Message::Binary(b))) => {
                c.frames.fetch_add(1, Ordering::Relaxed);
                c.bytes.fetch_add(b.len() as u64, Ordering::Relaxed);
                let mut events = Vec::new();
                match wire::decode(&b, &mut events) {
                    Ok(_) => {
                        c.events.fetch_add(events.len() as u64, Ordering::Relaxed);
                        if !events.is_empty() {
                            tx.send(FeedItem::Events(events)).await.ok()?;
                        }
                    }
                    Err(e) => {
                        c.malformed_frames.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(%url, "malformed tick-by-tick frame skipped: {e}");
                    }
                }
            }
            Some(Ok(Message::Text(_))) => {
                c.malformed_frames.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%url, "unexpected text frame on the tick-by-tick feed");
            }
            Some(Ok(Message::Close(f))) => {
                return Some(match f {
                    Some(f) => format!("closed by the server: {} {}", u16::from(f.code), f.reason),
                    None => "closed by the server".to_string(),
                })
            }
            Some(Ok(_)) => {} // ping / pong: tungstenite answers pings itself
            Some(Err(e @ tungstenite::Error::Capacity(_))) => {
                c.malformed_frames.fetch_add(1, Ordering::Relaxed);
                return Some(format!(
                    "read failed: {e} (limit: max_frame_bytes = {})",
                    config.max_frame_bytes
                ));
            }
            Some(Err(e)) => return Some(format!("read failed: {e}")),
            None => return Some("connection closed".to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ws_url_from_base() {
        let mut c = FeedConfig::new("http://127.0.0.1:9100/");
        assert_eq!(c.ws_url(), "ws://127.0.0.1:9100/tbt/ws");
        c.symbols = Some(vec!["600000".into(), "000001".into()]);
        assert_eq!(c.ws_url(), "ws://127.0.0.1:9100/tbt/ws?symbols=600000,000001");
        assert_eq!(FeedConfig::new("https://x").ws_url(), "wss://x/tbt/ws");
    }

    /// `n` add events of symbol 0, channel 1, from sequence 1.
    fn adds(n: u64) -> Vec<FeedEvent> {
        (1..=n)
            .map(|seq| FeedEvent {
                symbol: 0,
                channel: 1,
                seq,
                msg: shared::l3::Msg::Add {
                    id: seq,
                    side: shared::Side::Bid,
                    price: shared::Price::from_raw(1_000_000 * seq as i64),
                    qty: shared::Qty::from_raw(100),
                },
            })
            .collect()
    }

    /// A one-connection feed source on a local port: the symbol list, then `frames`, then it
    /// holds the connection open until the client leaves.
    async fn serve_once(frames: Vec<Vec<u8>>) -> String {
        use futures_util::SinkExt as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
            let hello = Hello {
                symbols: vec![TbtSymbol {
                    idx: 0,
                    symbol: "600000".into(),
                    venue: shared::l3::Venue::Sse,
                    channel: 1,
                }],
            };
            ws.send(Message::text(serde_json::to_string(&hello).unwrap())).await.unwrap();
            for f in frames {
                if ws.send(Message::binary(f)).await.is_err() {
                    return;
                }
            }
            while let Some(Ok(_)) = ws.next().await {}
        });
        format!("http://{addr}")
    }

    #[tokio::test]
    async fn frames_longer_than_the_read_buffer_arrive_whole_and_an_oversize_one_is_refused() {
        let defaults = FeedConfig::new("http://x");
        assert_eq!(defaults.ws_config().read_buffer_size, DEFAULT_READ_BUFFER_BYTES);
        assert_eq!(defaults.ws_config().max_message_size, Some(DEFAULT_MAX_FRAME_BYTES));
        let tungstenite = WebSocketConfig::default();
        assert!(defaults.ws_config().read_buffer_size < tungstenite.read_buffer_size);
        assert!(defaults.ws_config().max_message_size < tungstenite.max_message_size);

        // 4,096 events (the simulator's largest frame, ~200 KB) through a 1 KiB buffer.
        let events = adds(4_096);
        let big = wire::encode(&events, 7);
        assert!(big.len() > 100 * 1024);
        let base = serve_once(vec![wire::encode(&events[..3], 1), big]).await;
        let config = FeedConfig { read_buffer_bytes: 1, ..FeedConfig::new(base) };
        assert_eq!(config.ws_config().read_buffer_size, 1024, "raised to 1 KiB");
        let (feed, mut rx, task) = TbtFeed::new(config);
        let task = tokio::spawn(task);
        let mut got = Vec::new();
        while got.len() < events.len() {
            match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.unwrap() {
                Some(FeedItem::Events(evs)) => got.extend(evs),
                Some(FeedItem::Connected(s)) => assert_eq!(s.len(), 1),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(&got[..3], &events[..3]);
        assert_eq!(&got[3..], &events[..], "the long frame arrives whole");
        assert_eq!(feed.stats().malformed_frames, 0);
        task.abort();

        // A frame over max_frame_bytes ends the connection with a reason naming the key.
        let base = serve_once(vec![wire::encode(&events, 9)]).await;
        let config = FeedConfig { max_frame_bytes: 64 * 1024, ..FeedConfig::new(base) };
        let (feed, mut rx, task) = TbtFeed::new(config);
        let task = tokio::spawn(task);
        let reason = loop {
            match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.unwrap() {
                Some(FeedItem::Disconnected(r)) => break r,
                Some(FeedItem::Connected(_)) => {}
                other => panic!("unexpected {other:?}"),
            }
        };
        assert!(reason.contains("max_frame_bytes = 65536"), "{reason}");
        assert_eq!(feed.stats().malformed_frames, 1);
        assert_eq!(feed.stats().events, 0);
        task.abort();
    }
}
