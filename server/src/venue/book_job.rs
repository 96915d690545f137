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
//! - **Verification against the venue's REST book**, every `depth.verify_interval_ms`, where
//!   the REST book says where in the stream it stands (Bybit's cross sequence `seq`, OKX's and
//!   Coinbase's book time: a Coinbase update's newest `event_time`, not the time it was sent):
//!   the book as it stood at that point (its best [`verify_levels`] a side) is compared with it
//!   — after a message of that very sequence, all of it; at a millisecond some messages share,
//!   the prices they left alone; between two messages, the prices the next one left alone
//!   (`shared::venue::differing_between`).
//!   Equal is a verification; a difference is looked at again at once, and drift (counted with
//!   its levels, and the book resynced) when it is found twice in a row; an answer of a point
//!   before what the job kept, or while it resynced, or a first difference, is abandoned
//!   (counted). Kraken's `Depth` says neither, and its checksum checks every update.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use shared::backoff::Backoff;
use shared::book::Level;
use shared::fixed::Price;
use shared::protocol::{BookHealth, BookStatus};
use shared::sync::{SyncEvent, SyncState};
use shared::venue::{differing_between, SideView};
use shared::venue::{
    ConnectionSequence, ConnectionVerdict, Dialect, NumberFormat, VenueSync, VenueSyncConfig,
};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use venues::rest::{Instrument, RestBook};
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
/// Levels a side compared with the venue's REST book: the depth the job keeps (OKX `books`
/// 400, Bybit [`BYBIT_DEPTH`]); Coinbase's `level2` is the whole book, compared to its best 1,000.
pub fn verify_levels(dialect: Dialect) -> usize {
    match dialect {
        Dialect::Okx => 400,
        Dialect::Bybit => BYBIT_DEPTH,
        _ => 1_000,
    }
}
/// Book states kept while a verification is in flight.
const VERIFY_STATES: usize = 512;
/// How soon a verification that found a difference is made again (drift is a difference found
/// twice in a row).
const RECHECK: Duration = Duration::from_millis(200);
/// How long a REST book ahead of the stream waits for the stream to reach it.
const VERIFY_WAIT: Duration = Duration::from_secs(5);

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
    /// The verification against the venue's REST book in flight, and when the next is due.
    verify: Option<Verification>,
    next_verify: tokio::time::Instant,
    /// The stream point of the last book message.
    last_key: Option<u64>,
    /// [`book_digest`] of every book message handled.
    digest: u64,
    /// The last verification found a difference: the next one, soon, decides.
    suspect: bool,
    /// The job's part of the shutdown (its REST requests run in it).
    shutdown: crate::shutdown::Shutdown,
}

/// One verification against the venue's REST book (see the module docs).
struct Verification {
    task: Option<tokio::task::JoinHandle<Result<RestBook, String>>>,
    /// The answer, once it came while the stream had not reached its point yet.
    waiting: Option<(RestBook, tokio::time::Instant)>,
    /// The book's best levels after each message since the request went out (and the one
    /// before it), by the message's place in the stream; oldest first.
    states: std::collections::VecDeque<BookState>,
}

/// The book after the message(s) of one point of the stream, and the prices they changed.
struct BookState {
    key: u64,
    /// Whether `touched_*` hold what every message of this point changed (the state the
    /// verification starts from holds none of the messages before it).
    complete: bool,
    bids: Vec<Level>,
    asks: Vec<Level>,
    touched_bids: Vec<Price>,
    touched_asks: Vec<Price>,
}

/// Where a book message stands in the venue's stream, as its REST book says it
/// ([`venues::rest::RestBook::key`]): Bybit's cross sequence, OKX's and Coinbase's time (a
/// Coinbase update's newest `event_time`; its snapshot's is the time it was sent).
fn stream_key(dialect: Dialect, f: &venues::BookFrame) -> Option<u64> {
    match dialect {
        Dialect::Bybit => f.cross_seq,
        Dialect::Okx | Dialect::Coinbase => f.time_ms.and_then(|t| u64::try_from(t).ok()),
        Dialect::Kraken | Dialect::Binance => None,
    }
}

const DIGEST_START: u64 = 0xcbf2_9ce4_8422_2325;

/// `digest` (FNV-1a) folded with a book message — its sequence fields, snapshot flag and levels
/// — and the sync machine's `state` after it: equal over two runs only if every message and
/// every outcome was (`DepthJobStatus::book_digest`).
fn book_digest(digest: u64, f: &venues::BookFrame, state: SyncState) -> u64 {
    fn fold(h: u64, bytes: &[u8]) -> u64 {
        bytes.iter().fold(h, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
    }
    let mut h = digest;
    for n in [f.seq, f.prev_seq, f.cross_seq] {
        h = fold(h, &n.unwrap_or(u64::MAX).to_le_bytes());
    }
    h = fold(h, &[u8::from(f.snapshot), state as u8]);
    for (side, levels) in [(b'b', &f.bids), (b'a', &f.asks)] {
        h = fold(h, &[side]);
        for l in levels.iter() {
            h = fold(h, &l.price.raw().to_le_bytes());
            h = fold(h, &l.qty.raw().to_le_bytes());
        }
    }
    h
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
        verify: None,
        next_verify: tokio::time::Instant::now(),
        last_key: None,
        suspect: false,
        digest: DIGEST_START,
        shutdown: ctx.shutdown.clone(),
        deps,
    };
    job.next_verify = tokio::time::Instant::now() + job.verify_every().unwrap_or_default();
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
        job.abandon_verification();
        job.last_key = None;
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
        let rec = crate::recording::Conn::open(self.deps.source.tap(), url);
        self.seq.reset();
        for f in self.channel.subscribe.clone() {
            rec.sent(&f);
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
                () = tokio::time::sleep_until(self.next_verify), if self.verify_due() => {
                    self.start_verification();
                }
                answer = verification_answer(&mut self.verify) => {
                    self.on_verification_answer(answer);
                }
                frame = ws.next() => {
                    last_frame = tokio::time::Instant::now();
                    match frame {
                        Some(Ok(WsMessage::Text(t))) => {
                            rec.received(t.as_str());
                            self.on_frame(ctx, t.as_str(), &mut out)
                        }
                        Some(Ok(WsMessage::Binary(_))) => ctx.health.malformed.fetch_add(1, Relaxed),
                        Some(Ok(WsMessage::Close(c))) => return End::Lost(format!("closed by the venue: {c:?}")),
                        Some(Ok(_)) => 0,
                        Some(Err(e)) => return End::Lost(e.to_string()),
                        None => return End::Lost("the connection ended".into()),
                    };
                }
            }
            for f in out.drain(..) {
                rec.sent(&f);
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
                    self.digest = book_digest(self.digest, &f, self.sync.state());
                    // kept in order: a message stamped before the one it follows (a
                    // snapshot's send time, then updates of the book's earlier moments) counts
                    // at that one's point
                    if let Some(key) = stream_key(dialect, &f) {
                        self.record_state(key.max(self.last_key.unwrap_or(0)), &f.bids, &f.asks);
                    }
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
                    // the states kept are of the book being replaced
                    self.abandon_verification();
                    self.last_key = None;
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

    /// `depth.verify_interval_ms`, if this venue's REST book can be verified against.
    fn verify_every(&self) -> Option<Duration> {
        let every = self.deps.depth.verify_interval_ms;
        let path = venues::rest::book_path(
            self.deps.source.dialect,
            self.deps.source.config.market,
            &self.deps.listing.symbol,
            verify_levels(self.deps.source.dialect),
        );
        (every > 0 && path.is_some()).then(|| Duration::from_millis(every))
    }

    fn verify_due(&self) -> bool {
        self.verify.is_none() && self.sync.is_synced() && self.verify_every().is_some()
    }

    /// Asks the venue for its REST book; the book's states are kept from now until it comes.
    fn start_verification(&mut self) {
        let Some(every) = self.verify_every() else { return };
        self.next_verify = tokio::time::Instant::now() + every;
        let (source, market) = (self.deps.source.clone(), self.deps.source.config.market);
        let Some(path) = venues::rest::book_path(
            source.dialect,
            market,
            &self.deps.listing.symbol,
            verify_levels(source.dialect),
        ) else {
            return;
        };
        let task = self.shutdown.spawn(async move {
            let body = source.get_text(&path).await.map_err(|e| e.to_string())?;
            venues::rest::parse_book(source.dialect, &body).map_err(|e| e.to_string())
        });
        self.verify = Some(Verification {
            task: Some(task),
            waiting: None,
            states: std::collections::VecDeque::new(),
        });
        if let Some(key) = self.last_key {
            self.record_state(key, &[], &[]);
            if let Some(first) = self.verify.as_mut().and_then(|v| v.states.back_mut()) {
                first.complete = false;
            }
        }
    }

    /// Keeps the book's best levels after the message at `key` (which changed `bids` / `asks`)
    /// while a verification is in flight, and settles an answer that was waiting for the stream
    /// to pass its point.
    fn record_state(&mut self, key: u64, bids: &[Level], asks: &[Level]) {
        self.last_key = Some(key);
        let synced = self.sync.is_synced();
        let levels = verify_levels(self.deps.source.dialect);
        let Some(v) = &mut self.verify else { return };
        if synced {
            let (top_bids, top_asks) = self.sync.book().top(levels);
            let mut state = BookState {
                key,
                complete: true,
                bids: top_bids,
                asks: top_asks,
                touched_bids: bids.iter().map(|l| l.price).collect(),
                touched_asks: asks.iter().map(|l| l.price).collect(),
            };
            if v.states.back().is_some_and(|s| s.key == key) {
                // the last message of a point counts; what each changed, together
                let earlier = v.states.pop_back().expect("checked");
                state.complete = earlier.complete;
                state.touched_bids.extend(earlier.touched_bids);
                state.touched_asks.extend(earlier.touched_asks);
            }
            v.states.push_back(state);
            if v.states.len() > VERIFY_STATES {
                v.states.pop_front();
            }
        }
        if v.waiting.as_ref().is_some_and(|(answer, _)| key > answer.key) {
            let (answer, _) = v.waiting.take().expect("checked");
            self.settle(answer);
        }
    }

    fn on_verification_answer(&mut self, answer: Result<RestBook, String>) {
        let Some(v) = &mut self.verify else { return };
        v.task = None;
        match answer {
            Ok(book) => {
                let newest = v.states.back().map(|s| s.key);
                if newest.is_some_and(|n| book.key >= n) {
                    // the stream has not passed the answer's point yet: wait for it
                    v.waiting = Some((book, tokio::time::Instant::now() + VERIFY_WAIT));
                } else {
                    self.settle(book);
                }
            }
            Err(e) => {
                tracing::warn!(stream = %self.channel.name, "venue REST book for verification: {e}");
                self.abandon_verification();
            }
        }
    }

    /// Compares the REST book with the book as it stood at its point (see the module docs), if
    /// the job kept that point.
    fn settle(&mut self, book: RestBook) {
        let Some(v) = self.verify.take() else { return };
        let n = verify_levels(self.deps.source.dialect);
        // the state after the last message at or before the answer's point, and the next one
        let at = v.states.iter().rposition(|s| s.key <= book.key);
        let Some(at) = at else {
            self.sync.handle_verification_abandoned();
            return;
        };
        let before = &v.states[at];
        let (touched_bids, touched_asks): (&[Price], &[Price]) = if before.key == book.key {
            match self.deps.source.dialect {
                // a sequence names one message: the book after it, all of it
                Dialect::Bybit => (&[], &[]),
                // several messages may share a millisecond, and the REST book may stand between
                // them: the prices they changed are left out
                _ if before.complete => (&before.touched_bids, &before.touched_asks),
                _ => {
                    self.sync.handle_verification_abandoned();
                    return;
                }
            }
        } else {
            match v.states.get(at + 1) {
                Some(next) => (&next.touched_bids, &next.touched_asks),
                None => {
                    self.sync.handle_verification_abandoned();
                    return;
                }
            }
        };
        let bids = SideView { ours: &before.bids, theirs: &book.bids, touched: touched_bids };
        let asks = SideView { ours: &before.asks, theirs: &book.asks, touched: touched_asks };
        let differing = differing_between(bids, true, n) + differing_between(asks, false, n);
        if differing > 0 && !self.suspect {
            // one difference may be the REST book's own moment; drift is a difference found
            // twice in a row: look again at once
            self.suspect = true;
            self.next_verify = tokio::time::Instant::now() + RECHECK;
            self.sync.handle_verification_abandoned();
            return;
        }
        self.suspect = false;
        if differing > 0 {
            tracing::warn!(stream = %self.channel.name, key = book.key, differing, "venue book drifted from its REST book (twice in a row): resyncing");
        }
        self.sync.handle_verification(differing);
    }

    /// Ends the verification in flight, counted as abandoned.
    fn abandon_verification(&mut self) {
        if let Some(mut v) = self.verify.take() {
            if let Some(t) = v.task.take() {
                t.abort();
            }
            self.sync.handle_verification_abandoned();
        }
    }

    fn publish(&mut self) {
        let now = now_ms();
        if let Some(v) = &mut self.verify {
            if v.waiting.as_ref().is_some_and(|(_, until)| tokio::time::Instant::now() >= *until) {
                self.abandon_verification();
            }
        }
        let state = self.sync.state();
        let health =
            if state == SyncState::Synced { BookHealth::Synced } else { BookHealth::Resyncing };
        let stats = self.sync.stats();
        let status = BookStatus {
            health,
            gaps: stats.gaps,
            resyncs: stats.resyncs,
            // the book found unlike the venue's: by its checksum, or by its REST book
            drift: stats.checksum_mismatches + stats.drift_events,
            verifications: stats.checksums_verified + stats.verifications,
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
        s.book_digest = self.digest;
        self.deps.stats.set(s);
    }
}

/// The answer of the verification in flight; pending while there is none.
async fn verification_answer(v: &mut Option<Verification>) -> Result<RestBook, String> {
    match v.as_mut().and_then(|v| v.task.as_mut()) {
        Some(task) => task.await.unwrap_or_else(|e| Err(format!("the request ended: {e}"))),
        None => std::future::pending().await,
    }
}
