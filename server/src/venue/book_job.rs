//! A venue book job: one order book of OKX, Bybit, Coinbase or Kraken kept in sync by the
//! venue's own rules and published like every book millrace serves.
//!
//! - **Its own connection.** Each book has a WebSocket of its own, subscribed to its book channel
//!   and its market's trades (OKX `books` and `trades`, Bybit `orderbook.200` and `publicTrade`,
//!   Coinbase `level2`, `market_trades` and `heartbeats`, Kraken `book` depth 100 and `trade`): a
//!   hot book cannot hold back another, and Coinbase's per-connection `sequence_num` numbers this
//!   market's messages alone. Trades go to the [`crate::trades::TradeRegistry`]
//!   (`trade@{instrument}`, `GET /api/v1/trades`).
//! - **Sync.** Frames are read by `venues::parse` and fed to `shared::venue::VenueSync`. A gap,
//!   a checksum mismatch or a reset the machine cannot continue from makes it ask for a
//!   snapshot: the job unsubscribes and subscribes that channel again, and the venue sends the
//!   book whole. The connection stays.
//! - **Checksums** over the venue's own strings: OKX learns its formats from the strings, Kraken
//!   prints with the pair's precisions (its instrument list); one that cannot be checked is
//!   counted (`checksums_unchecked`), never passed.
//! - **Keep-alives**: OKX `ping`, Bybit `{"op":"ping"}`, Kraken `{"method":"ping"}` every
//!   [`PING_EVERY`]; a connection silent for the ingest stall timeout is replaced.
//! - **Refusals** of the venue (a bad subscription, a rate limit) are logged, counted as the
//!   job's errors and answered with the reconnect back-off.
//! - **Publishing** every `depth.publish_interval_ms`: `Synced` only while the machine is.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use shared::backoff::Backoff;
use shared::protocol::{BookHealth, BookStatus};
use shared::sync::{SyncEvent, SyncState};
use shared::venue::{
    ConnectionSequence, ConnectionVerdict, Dialect, NumberFormat, VenueSync, VenueSyncConfig,
};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use venues::rest::Instrument;
use venues::Message;

use super::VenueSource;
use crate::books::depth_job::DepthJobStats;
use crate::books::{BookPublisher, BookRegistry};
use crate::clock::wall_clock_ms as now_ms;
use crate::config::{DepthConfig, IngestConfig};
use crate::jitter::Jitter;
use crate::jobs::supervisor::JobContext;

/// How often a connection sends the venue's ping.
pub const PING_EVERY: Duration = Duration::from_secs(20);
/// The largest frame read (a Coinbase `level2` snapshot is the whole book).
const MAX_FRAME_BYTES: usize = 32 << 20;
/// Kraken book depth subscribed (its checksum covers the best 10 of it).
const KRAKEN_DEPTH: usize = 100;
/// Bybit book depth subscribed.
const BYBIT_DEPTH: usize = 200;

/// What a venue book job needs besides its [`JobContext`].
pub struct VenueBookDeps {
    pub source: Arc<VenueSource>,
    pub listing: Instrument,
    pub books: Arc<BookRegistry>,
    pub stats: Arc<DepthJobStats>,
    pub depth: DepthConfig,
    pub ingest: IngestConfig,
}

/// The `source` a venue's books are published under (registry, ops).
pub fn source_name(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Okx => "okx_books",
        Dialect::Bybit => "bybit_orderbook",
        Dialect::Coinbase => "coinbase_level2",
        Dialect::Kraken => "kraken_book",
        Dialect::Binance => "binance_depth",
    }
}

/// The book channel's frames of one venue.
pub struct Channel {
    pub subscribe: Vec<String>,
    pub unsubscribe: Vec<String>,
    /// What the job shows as its stream.
    pub name: String,
    pub ping: Option<String>,
}

impl Channel {
    pub fn of(dialect: Dialect, symbol: &str) -> Channel {
        match dialect {
            Dialect::Okx => Channel {
                subscribe: vec![
                    venues::okx::subscribe("books", symbol),
                    venues::okx::subscribe("trades", symbol),
                ],
                unsubscribe: vec![venues::okx::unsubscribe("books", symbol)],
                name: format!("books:{symbol}"),
                ping: Some("ping".into()),
            },
            Dialect::Bybit => {
                let topic = format!("orderbook.{BYBIT_DEPTH}.{symbol}");
                Channel {
                    subscribe: vec![
                        venues::bybit::subscribe(&[&topic]),
                        venues::bybit::subscribe(&[&format!("publicTrade.{symbol}")]),
                    ],
                    unsubscribe: vec![venues::bybit::unsubscribe(&[&topic])],
                    name: topic,
                    ping: Some(venues::bybit::ping()),
                }
            }
            Dialect::Coinbase => Channel {
                subscribe: vec![
                    venues::coinbase::subscribe("level2", &[symbol]),
                    venues::coinbase::subscribe("heartbeats", &[]),
                    venues::coinbase::subscribe("market_trades", &[symbol]),
                ],
                unsubscribe: vec![venues::coinbase::unsubscribe("level2", &[symbol])],
                name: format!("level2:{symbol}"),
                ping: None,
            },
            Dialect::Kraken => {
                let unsub = serde_json::json!({"method": "unsubscribe",
                    "params": {"channel": "book", "symbol": [symbol], "depth": KRAKEN_DEPTH}});
                Channel {
                    subscribe: vec![
                        venues::kraken::subscribe_v2("book", &[symbol], Some(KRAKEN_DEPTH as u32)),
                        venues::kraken::subscribe_v2("trade", &[symbol], None),
                    ],
                    unsubscribe: vec![unsub.to_string()],
                    name: format!("book:{symbol}:{KRAKEN_DEPTH}"),
                    ping: Some(venues::kraken::ping_v2()),
                }
            }
            Dialect::Binance => Channel {
                subscribe: Vec::new(),
                unsubscribe: Vec::new(),
                name: String::new(),
                ping: None,
            },
        }
    }

    /// Resubscribing: the venue sends the book whole again (the book channel is the first
    /// subscription; trades and heartbeats stay subscribed).
    fn resubscribe(&self) -> impl Iterator<Item = &String> {
        self.unsubscribe.iter().chain(self.subscribe.iter().take(1))
    }
}

/// The machine's rules for a venue's book of `listing`.
pub fn sync_config(dialect: Dialect, listing: &Instrument) -> VenueSyncConfig {
    let mut c = VenueSyncConfig::new(dialect.sequence_rule(), dialect.checksum_rule());
    match dialect {
        Dialect::Kraken => {
            c.depth = Some(KRAKEN_DEPTH);
            // v2 sends JSON numbers: Kraken's checksum prints them with the pair's precisions
            c.price_format = listing.price_decimals.map(NumberFormat::Fixed);
            c.qty_format = listing.qty_decimals.map(NumberFormat::Fixed);
        }
        Dialect::Bybit => c.depth = Some(BYBIT_DEPTH),
        _ => {}
    }
    c
}

/// Why a connection ended.
enum End {
    Stopped,
    Lost(String),
}

struct Job {
    deps: VenueBookDeps,
    sync: VenueSync,
    publisher: BookPublisher,
    channel: Channel,
    seq: ConnectionSequence,
    messages: Vec<Message>,
    /// What ops shows of the job, written at each publish.
    status: shared::protocol::ops::DepthJobStatus,
}

/// Runs the job until `ctx` stops it.
pub async fn run(ctx: JobContext, deps: VenueBookDeps) {
    let dialect = deps.source.dialect;
    let channel = Channel::of(dialect, &deps.listing.symbol);
    let publisher = deps.books.publisher(&ctx.instrument, source_name(dialect), now_ms());
    let mut job = Job {
        sync: VenueSync::new(sync_config(dialect, &deps.listing)),
        publisher,
        channel,
        seq: ConnectionSequence::default(),
        messages: Vec::new(),
        status: Default::default(),
        deps,
    };
    let ingest = job.deps.ingest.clone();
    let mut backoff = Backoff::new(
        Duration::from_millis(ingest.reconnect_base_ms),
        Duration::from_millis(ingest.reconnect_cap_ms),
    );
    let mut jitter = Jitter::new(&ctx.instrument.to_string());
    loop {
        let started = tokio::time::Instant::now();
        match job.connection(&ctx).await {
            End::Stopped => return,
            End::Lost(why) => ctx.health.crash(format!("{} {}: {why}", dialect, job.channel.name)),
        }
        ctx.health.connected.store(false, Relaxed);
        job.sync.handle_connection_lost();
        job.drain(&mut Vec::new());
        job.publish();
        if started.elapsed() >= Duration::from_millis(ingest.reconnect_reset_after_ms) {
            backoff.reset();
        }
        if ctx.sleep(backoff.next_delay(jitter.draw())).await {
            return;
        }
    }
}

impl Job {
    async fn connection(&mut self, ctx: &JobContext) -> End {
        let url = &self.deps.source.endpoint.ws_base;
        let mut config = WebSocketConfig::default();
        config.max_message_size = Some(MAX_FRAME_BYTES);
        config.max_frame_size = Some(MAX_FRAME_BYTES);
        tokio::select! {
            () = self.deps.source.connect_pace.turn() => {}
            () = ctx.stopped() => return End::Stopped,
        }
        let connect =
            tokio_tungstenite::connect_async_with_config(url.as_str(), Some(config), false);
        let ws = tokio::select! {
            r = tokio::time::timeout(Duration::from_secs(10), connect) => r,
            () = ctx.stopped() => return End::Stopped,
        };
        let mut ws = match ws {
            Ok(Ok((ws, _))) => ws,
            Ok(Err(e)) => {
                return End::Lost(format!("connect: {}", crate::redact::redact(&e.to_string())))
            }
            Err(_) => return End::Lost("connect: timed out after 10 s".into()),
        };
        ctx.health.connected.store(true, Relaxed);
        ctx.health.connects.fetch_add(1, Relaxed);
        self.seq.reset();
        for f in self.channel.subscribe.clone() {
            if let Err(e) = ws.send(WsMessage::Text(f.into())).await {
                return End::Lost(format!("subscribe: {e}"));
            }
        }
        let publish_every = Duration::from_millis(self.deps.depth.publish_interval_ms);
        let mut publish = tokio::time::interval(publish_every);
        let mut ping =
            tokio::time::interval_at(tokio::time::Instant::now() + PING_EVERY, PING_EVERY);
        let stall = Duration::from_millis(self.deps.ingest.stall_timeout_ms.max(1_000));
        let mut last_frame = tokio::time::Instant::now();
        let mut out: Vec<String> = Vec::new();
        loop {
            tokio::select! {
                () = ctx.stopped() => {
                    let _ = tokio::time::timeout(Duration::from_secs(1), ws.close(None)).await;
                    return End::Stopped;
                }
                _ = publish.tick() => {
                    if last_frame.elapsed() > stall {
                        return End::Lost(format!("nothing received for {} ms", stall.as_millis()));
                    }
                    self.publish();
                }
                _ = ping.tick() => {
                    if let Some(p) = &self.channel.ping {
                        out.push(p.clone());
                    }
                }
                frame = ws.next() => {
                    last_frame = tokio::time::Instant::now();
                    match frame {
                        Some(Ok(WsMessage::Text(t))) => self.on_frame(ctx, t.as_str(), &mut out),
                        Some(Ok(WsMessage::Binary(_))) => ctx.health.malformed.fetch_add(1, Relaxed),
                        Some(Ok(WsMessage::Close(c))) => return End::Lost(format!("closed by the venue: {c:?}")),
                        Some(Ok(_)) => 0,
                        Some(Err(e)) => return End::Lost(e.to_string()),
                        None => return End::Lost("the connection ended".into()),
                    };
                }
            }
            for f in out.drain(..) {
                if let Err(e) = ws.send(WsMessage::Text(f.into())).await {
                    return End::Lost(format!("send: {e}"));
                }
            }
        }
    }

    /// One frame; what must be sent in answer goes to `out`. Returns 0 (for the select arm).
    fn on_frame(&mut self, ctx: &JobContext, text: &str, out: &mut Vec<String>) -> u64 {
        ctx.health.messages.fetch_add(1, Relaxed);
        ctx.health.last_message_at_ms.store(now_ms(), Relaxed);
        let dialect = self.deps.source.dialect;
        let mut messages = std::mem::take(&mut self.messages);
        messages.clear();
        if let Err(e) = venues::parse(dialect, text, &mut messages) {
            ctx.health.malformed.fetch_add(1, Relaxed);
            ctx.health.error(&e);
        }
        for m in messages.drain(..) {
            match m {
                Message::Sequence { seq } => match self.seq.observe(seq) {
                    ConnectionVerdict::Gap { .. } => self.sync.handle_lost_message(),
                    ConnectionVerdict::Duplicate => break,
                    ConnectionVerdict::First | ConnectionVerdict::Next => {}
                },
                Message::Book(f) if f.symbol == self.deps.listing.symbol => {
                    self.sync.handle_message(f.message());
                }
                Message::Trades { symbol, trades } if symbol == self.deps.listing.symbol => {
                    self.deps.books.trades().push(&ctx.instrument, trades);
                }
                Message::Refused { code, message, rate_limited } => {
                    let what = if rate_limited { "rate limit" } else { "refusal" };
                    tracing::warn!(%code, %message, "{dialect} {what}");
                    ctx.health.error(format!("{dialect} {what}: {code} {message}"));
                }
                _ => {}
            }
        }
        self.messages = messages;
        self.drain(out);
        0
    }

    /// Acts on the machine's events: a book that must be sent whole again is resubscribed.
    fn drain(&mut self, out: &mut Vec<String>) {
        let mut resubscribe = false;
        while let Some(e) = self.sync.poll_event() {
            match e {
                SyncEvent::NeedSnapshot { reason } => {
                    tracing::info!(stream = %self.channel.name, ?reason, "venue book resync: resubscribing");
                    resubscribe = true;
                }
                SyncEvent::ChecksumMismatch { expected, computed, .. } => {
                    tracing::info!(stream = %self.channel.name, expected, computed, "venue checksum mismatch");
                }
                SyncEvent::SequenceReset { from, to } => {
                    tracing::info!(stream = %self.channel.name, ?from, to, "venue sequence reset: continued");
                }
                _ => {}
            }
        }
        if resubscribe && self.sync.state() == SyncState::AwaitingSnapshot {
            out.extend(self.channel.resubscribe().cloned());
        }
    }

    fn publish(&mut self) {
        let now = now_ms();
        let state = self.sync.state();
        let health =
            if state == SyncState::Synced { BookHealth::Synced } else { BookHealth::Resyncing };
        let stats = self.sync.stats();
        let status = BookStatus {
            health,
            gaps: stats.gaps,
            resyncs: stats.resyncs,
            drift: stats.checksum_mismatches,
            verifications: stats.checksums_verified,
            events: stats.deltas_applied + stats.snapshots_applied,
        };
        let book = self.sync.book();
        self.publisher.publish(book, status, now);
        let s = &mut self.status;
        s.symbol.clone_from(&self.deps.listing.symbol);
        s.stream.clone_from(&self.channel.name);
        s.state = state;
        s.health = health;
        s.last_update_id = self.sync.last_seq().unwrap_or_else(|| self.sync.last_update_id());
        s.bid_levels = book.bids.len();
        s.ask_levels = book.asks.len();
        if health.is_publishable() && book.is_crossed() {
            s.crossed_publishes += 1;
        }
        s.sync.clone_from(stats);
        self.deps.stats.set(s);
    }
}
