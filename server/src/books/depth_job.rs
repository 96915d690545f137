//! The Binance depth job: the data plane that keeps millrace's copy of one exchange order book
//! in sync (the server side of seeds/local-order-book-snapshot-delta-sync.md) and publishes it
//! through a [`BookPublisher`] — the only way a book reaches millrace's clients.
//!
//! The sync logic is `shared::sync::BookSync`; this job owns the IO around it:
//! - **Streams.** In delta mode it connects `<sym>@depth@100ms` (spot or USD-M futures, by the
//!   source's product; the machine's [`ContinuityRule`] follows the product). Deltas are fed as they
//!   arrive; the machine buffers them until a snapshot bridges them.
//! - **Snapshots.** Whenever the machine asks (`NeedSnapshot`: start, gap, reconnect, too old a
//!   snapshot, leaving fallback mode; `VerifyDue`: periodic verification) and the delta stream is
//!   connected, the job fetches `GET /depth?limit={snapshot_limit}` concurrently with the stream.
//!   A failed fetch is reported (`handle_snapshot_failed`) and retried after a doubling back-off;
//!   the REST client refuses calls itself during a 429/418 back-off (nothing is sent), and a fetch
//!   is held back to the next minute while the IP's used weight is above `max_used_weight`.
//! - **A gap** resyncs this symbol only: the machine drops back to awaiting a snapshot; other
//!   jobs have their own machines and connections. **A lost connection** re-initialises
//!   (`handle_connection_lost`, a new connection, then a fresh snapshot).
//! - **Fallback.** After `snapshot_failures_before_fallback` failed snapshots in a row the machine
//!   enters snapshot mode; the job then reconnects to the partial book stream
//!   `<sym>@depth20@100ms` and every push replaces the book. After `snapshot_mode_retry_ms` the
//!   machine asks to try deltas again and the job switches back.
//! - **Trusted range.** A REST snapshot holds at most `snapshot_limit` levels a side; when a side
//!   was cut there, levels beyond its worst price that never changed since are unknown, so the
//!   book beyond that price is incomplete. The job publishes the book *pruned* to the price range
//!   the snapshot covered (widened by later verifications that agreed, replaced by one that found
//!   drift). A side the snapshot returned whole is complete and never pruned.
//! - **Publishing.** Every `publish_interval_ms` (100 ms) the job hands the book to the
//!   publisher with [`BookHealth::Synced`] only while the machine is synced,
//!   [`BookHealth::SnapshotMode`] in fallback mode once it holds a partial book, and
//!   [`BookHealth::Resyncing`] otherwise; the publisher sends nothing for an unsynced or crossed
//!   book, so clients never see a stale book as fresh.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use binance::fastdepth::{Decoded, DepthDecoder, Parsed};
use binance::rest::{RestClient, RestError};
use binance::stream::{connect_with, Connection, StreamConfig, StreamError};
use binance::wire::{StreamEvent, StreamKind, StreamName};
use shared::backoff::Backoff;
use shared::book::OrderBook;
use shared::fixed::Price;
use shared::protocol::ops::{DepthJobReport, DepthJobStatus, DepthJobsReport};
use shared::protocol::{BookHealth, BookStatus, InstrumentId};
use shared::sync::{
    BookSync, ContinuityRule, DepthSnapshot, ResyncReason, SyncConfig, SyncEvent, SyncState,
};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Utf8Bytes;

use super::upstream::{DepthSource, DiffFeed, DiffTap, SourceBook};
use crate::books::{BookPublisher, BookRegistry};
use crate::clock::wall_clock_ms as now_ms;
use crate::config::{Config, DepthConfig, IngestConfig};
use crate::jitter::Jitter;
use crate::jobs::supervisor::{JobContext, JobFuture, JobHealth, JobRunner, SupervisorSnapshot};
use crate::lock::lock;
use crate::shutdown::Shutdown;
use crate::sources::{ResolveError, Sources};

/// The `source` of books rebuilt by this job, as the registry and ops show it.
pub const SOURCE: &str = "binance_depth";
/// Levels of the fallback partial book stream (`<sym>@depth20@100ms`).
pub const PARTIAL_LEVELS: u16 = 20;
/// Update speed of both depth streams.
const STREAM_MS: u16 = 100;

/// Shared handle on a job's [`DepthJobStatus`] (written at every publish).
#[derive(Debug)]
pub struct DepthJobStats(Mutex<DepthJobStatus>);

impl DepthJobStats {
    pub(crate) fn new(symbol: &str) -> Self {
        DepthJobStats(Mutex::new(initial_status(symbol)))
    }

    pub fn get(&self) -> DepthJobStatus {
        lock(&self.0).clone()
    }

    pub(crate) fn set(&self, s: &DepthJobStatus) {
        lock(&self.0).clone_from(s);
    }
}

/// A job's status before its first publish.
fn initial_status(symbol: &str) -> DepthJobStatus {
    DepthJobStatus { symbol: symbol.to_string(), ..DepthJobStatus::default() }
}

/// Everything a depth job needs besides its [`JobContext`].
#[derive(Clone)]
pub struct DepthJobDeps {
    pub depth: DepthConfig,
    /// Reconnect back-off and stall timeout are the ingest ones.
    pub ingest: IngestConfig,
    /// The exchange's REST client (its snapshots); `None` for a book whose `source` is the
    /// only upstream (a venue's book on a cluster gateway: the workers hold the venue).
    pub rest: Option<Arc<RestClient>>,
    pub ws_base: String,
    /// The symbol the frames name (Binance's `BTCUSDT`; a worker's relayed deltas name the
    /// instrument).
    pub symbol: String,
    /// How the diffs' ids continue one another (the product's rule; millrace's own deltas
    /// follow the spot rule).
    pub continuity: ContinuityRule,
    pub books: Arc<BookRegistry>,
    pub stats: Arc<DepthJobStats>,
    /// Where the diffs and snapshots come from instead of the exchange (a plug point).
    pub source: Option<Arc<dyn DepthSource>>,
    /// Who hears every diff (a plug point).
    pub tap: Option<Arc<dyn DiffTap>>,
    /// Where the exchange's frames are recorded (`[record]`), if they are.
    pub recording: Option<crate::recording::Tap>,
}

/// A connected upstream.
enum Conn {
    /// The exchange: `<sym>@depth@100ms` (or the partial stream) and REST `/depth`.
    Exchange(Box<Connection>),
    /// Another [`DepthSource`]'s feed.
    Other(Box<dyn DiffFeed>),
}

impl Conn {
    async fn next_text(&mut self) -> Option<Result<Utf8Bytes, StreamError>> {
        match self {
            Conn::Exchange(c) => c.next_text().await,
            Conn::Other(f) => f.next_text().await,
        }
    }

    fn is_reconnect_due(&self) -> bool {
        match self {
            Conn::Exchange(c) => c.is_reconnect_due(),
            Conn::Other(_) => false,
        }
    }

    fn age(&self) -> Duration {
        match self {
            Conn::Exchange(c) => c.age(),
            Conn::Other(f) => f.age(),
        }
    }
}

/// A snapshot, and the price range it is complete in when its source says so (a worker's).
type SnapshotResult = Result<(DepthSnapshot, Option<Trusted>), RestError>;

/// The price range a snapshot covered: within it the book is complete.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Trusted {
    /// `None`: the snapshot returned the whole side.
    bid_floor: Option<Price>,
    ask_ceiling: Option<Price>,
}

impl Trusted {
    fn of(s: &DepthSnapshot, limit: usize) -> Trusted {
        let cut = |levels: &[shared::book::Level],
                   worst: fn(&[shared::book::Level]) -> Option<Price>| {
            if levels.len() >= limit {
                worst(levels)
            } else {
                None
            }
        };
        Trusted {
            bid_floor: cut(&s.bids, |l| l.iter().map(|l| l.price).min()),
            ask_ceiling: cut(&s.asks, |l| l.iter().map(|l| l.price).max()),
        }
    }

    /// The union of two ranges that are both known complete.
    fn widen(self, o: Trusted) -> Trusted {
        let merge =
            |a: Option<Price>, b: Option<Price>, pick: fn(Price, Price) -> Price| match (a, b) {
                (Some(a), Some(b)) => Some(pick(a, b)),
                _ => None,
            };
        Trusted {
            bid_floor: merge(self.bid_floor, o.bid_floor, std::cmp::min),
            ask_ceiling: merge(self.ask_ceiling, o.ask_ceiling, std::cmp::max),
        }
    }
}

/// How a connected session ended.
enum Ended {
    Stopped,
    /// The machine changed between delta and snapshot mode: reconnect on the other stream.
    SwitchStream,
    /// Planned reconnect (connection age); re-initialises like a loss.
    Planned,
    Lost(String),
}

/// Runs the job until it is stopped; connection failures are counted as crashes and retried.
pub async fn run(ctx: JobContext, deps: DepthJobDeps) {
    let mut job = Job::new(&ctx, &deps);
    job.run(&ctx).await;
}

struct Job<'a> {
    deps: &'a DepthJobDeps,
    health: Arc<JobHealth>,
    /// The job's part of the shutdown (its snapshot requests run in it).
    shutdown: Shutdown,
    sync: BookSync,
    publisher: BookPublisher,
    status: DepthJobStatus,
    want_snapshot: bool,
    snapshot_not_before: Instant,
    snapshot_retry: Duration,
    inflight: Option<JoinHandle<SnapshotResult>>,
    trusted: Trusted,
    /// The range of the verification snapshot fed while synced, until its verdict.
    verify_range: Option<Trusted>,
    /// Scratch book for publishing a pruned view.
    view: OrderBook,
    /// Used weight after our last request, and the wall-clock minute it was seen in.
    weight_seen: Option<(u32, i64)>,
    /// Decodes the stream's frames; diffs in the usual layout go straight into `sync`'s book.
    decoder: DepthDecoder,
    instrument: InstrumentId,
}

impl<'a> Job<'a> {
    fn new(ctx: &JobContext, deps: &'a DepthJobDeps) -> Self {
        let mut sc = SyncConfig::new(deps.continuity);
        sc.verify_interval_ms =
            (deps.depth.verify_interval_ms > 0).then_some(deps.depth.verify_interval_ms as i64);
        sc.snapshot_failures_before_fallback = deps.depth.snapshot_failures_before_fallback;
        sc.snapshot_mode_retry_ms = deps.depth.snapshot_mode_retry_ms as i64;
        if deps.source.is_some() {
            // Another source has no partial book stream to fall back to: keep asking it.
            sc.snapshot_failures_before_fallback = u32::MAX;
        }
        let status = initial_status(&deps.symbol);
        Job {
            deps,
            health: ctx.health.clone(),
            shutdown: ctx.shutdown.clone(),
            sync: BookSync::new(sc),
            publisher: deps.books.publisher(&ctx.instrument, SOURCE, now_ms()),
            status,
            want_snapshot: false,
            snapshot_not_before: Instant::now(),
            snapshot_retry: Duration::from_millis(deps.depth.snapshot_retry_base_ms),
            inflight: None,
            trusted: Trusted::default(),
            verify_range: None,
            view: OrderBook::new(),
            weight_seen: None,
            decoder: DepthDecoder::new(),
            instrument: ctx.instrument.clone(),
        }
    }

    fn stream_name(&self) -> String {
        if let Some(source) = &self.deps.source {
            return source.feed_name(&self.instrument);
        }
        let kind = if self.sync.state() == SyncState::SnapshotMode {
            StreamKind::PartialDepth { levels: PARTIAL_LEVELS, update_ms: Some(STREAM_MS) }
        } else {
            StreamKind::Depth { update_ms: Some(STREAM_MS) }
        };
        StreamName::new(&self.deps.symbol, kind).to_string()
    }

    async fn run(&mut self, ctx: &JobContext) {
        let cfg = &self.deps.ingest;
        let mut backoff = Backoff::new(
            Duration::from_millis(cfg.reconnect_base_ms),
            Duration::from_millis(cfg.reconnect_cap_ms),
        );
        backoff.healthy_after = Duration::from_millis(cfg.reconnect_reset_after_ms);
        let mut jitter = Jitter::new(&self.deps.symbol);
        let stream_config = StreamConfig {
            stall_timeout: Duration::from_millis(cfg.stall_timeout_ms),
            planned_reconnect_after: Duration::from_secs(cfg.planned_reconnect_after_s),
            ..StreamConfig::default()
        };
        self.drain_events();
        // Its synced book, for whoever asks the registry (a cluster worker's snapshot answers).
        let mut answering = self.deps.books.source_books().answer(&self.instrument);
        while !ctx.is_stopped() {
            let stream = self.stream_name();
            self.status.stream.clone_from(&stream);
            let streams = [stream.as_str()];
            let connect = async {
                match &self.deps.source {
                    None => connect_with(&self.deps.ws_base, &streams, stream_config.clone())
                        .await
                        .map(|mut c| {
                            // recorded as every Binance stream is, frame by frame
                            crate::recording::observe(self.deps.recording.clone(), &mut c);
                            Conn::Exchange(Box::new(c))
                        }),
                    Some(source) => source
                        .open(&self.instrument, stream_config.stall_timeout)
                        .await
                        .map(Conn::Other),
                }
            };
            let conn = tokio::select! {
                c = connect => c,
                _ = ctx.stopped() => break,
            };
            let mut conn = match conn {
                Ok(c) => c,
                Err(e) => {
                    self.health.crash(format!("connect {}: {e}", self.deps.ws_base));
                    self.publish(now_ms());
                    if ctx.sleep(backoff.next_delay(jitter.draw())).await {
                        break;
                    }
                    continue;
                }
            };
            self.health.connects.fetch_add(1, Relaxed);
            self.health.connected.store(true, Relaxed);
            let connected_at = std::time::Instant::now();
            let mut tick =
                tokio::time::interval(Duration::from_millis(self.deps.depth.publish_interval_ms));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let partial = self.sync.state() == SyncState::SnapshotMode;
            let ended = loop {
                let fetch_ready = self.want_snapshot && self.inflight.is_none() && !partial;
                let ended = tokio::select! {
                    ev = conn.next_text() => self.on_stream(ev, partial),
                    res = join_inflight(&mut self.inflight) => {
                        self.inflight = None;
                        self.on_snapshot(res);
                        None
                    }
                    _ = tokio::time::sleep_until(self.snapshot_not_before), if fetch_ready => {
                        self.start_snapshot();
                        None
                    }
                    _ = tick.tick() => {
                        let now = now_ms();
                        if self.sync.poll_timeout().is_some_and(|t| now >= t) {
                            self.sync.handle_timeout(now);
                        }
                        self.publish(now);
                        conn.is_reconnect_due().then_some(Ended::Planned)
                    }
                    Some(question) = answering.questions.recv() => {
                        let _ = question.send(self.source_book());
                        None
                    }
                    _ = ctx.stopped() => Some(Ended::Stopped),
                };
                if let Some(e) = ended {
                    break e;
                }
                if self.drain_events() {
                    break Ended::SwitchStream;
                }
            };
            match ended {
                Ended::Stopped => break,
                Ended::SwitchStream => {
                    self.status.mode_switches += 1;
                    tracing::info!(symbol = %self.deps.symbol, state = ?self.sync.state(), "depth job switches stream");
                    self.publish(now_ms());
                }
                Ended::Planned => {
                    tracing::info!(symbol = %self.deps.symbol, "planned reconnect after {:?}", conn.age());
                    self.connection_lost();
                }
                Ended::Lost(reason) => {
                    self.health.connected.store(false, Relaxed);
                    self.health.crash(reason);
                    self.connection_lost();
                    backoff.connection_ended(connected_at.elapsed());
                    if ctx.sleep(backoff.next_delay(jitter.draw())).await {
                        break;
                    }
                }
            }
        }
        self.health.connected.store(false, Relaxed);
        if let Some(h) = self.inflight.take() {
            h.abort();
        }
    }

    /// One stream item; `Some` when the connection is over. A diff in Binance's usual layout
    /// that continues the synced book is parsed straight into it (`DepthDecoder::decode_into`);
    /// any other diff is applied from the decoder's buffers with `handle_delta_ref`.
    fn on_stream(
        &mut self,
        ev: Option<Result<Utf8Bytes, StreamError>>,
        partial: bool,
    ) -> Option<Ended> {
        let now = now_ms();
        let text = match ev {
            Some(Ok(text)) => text,
            Some(Err(e @ StreamError::Malformed { .. })) => {
                // a binary frame: counted, not fatal
                self.health.malformed.fetch_add(1, Relaxed);
                tracing::warn!(symbol = %self.deps.symbol, "malformed depth frame from upstream: {e}");
                return None;
            }
            Some(Err(e)) => return Some(Ended::Lost(format!("stream: {e}"))),
            None => return Some(Ended::Lost("stream closed by the server".into())),
        };
        let symbol = &self.deps.symbol;
        let accept = |s: &str| !partial && s.eq_ignore_ascii_case(symbol);
        // A worker forwards every diff with its ids: no parsing straight into the book.
        let decoded = if self.deps.tap.is_some() {
            self.decoder.decode(text.as_str()).map(Parsed::Decoded)
        } else {
            self.decoder.decode_into(text.as_str(), &mut self.sync, accept)
        };
        match decoded {
            Ok(frame) => {
                self.health.messages.fetch_add(1, Relaxed);
                self.health.last_message_at_ms.store(now, Relaxed);
                match frame {
                    Parsed::Applied => {}
                    Parsed::Decoded(Decoded::Depth)
                        if !partial && self.is_ours(self.decoder.symbol()) =>
                    {
                        let d = self.decoder.delta();
                        if let Some(tap) = &self.deps.tap {
                            let (i, text) = (&self.instrument, text.as_str());
                            tap.diff(i, d.first_id, d.last_id, d.prev_last_id, text);
                        }
                        self.sync.handle_delta_ref(d, now);
                    }
                    Parsed::Decoded(Decoded::Other(StreamEvent::PartialDepth {
                        depth, ..
                    })) if partial && depth.symbol.as_deref().is_none_or(|s| self.is_ours(s)) => {
                        self.sync.handle_snapshot(depth.snapshot, now);
                    }
                    Parsed::Decoded(Decoded::Other(StreamEvent::Reply(_))) => {}
                    // another symbol's or another kind's event on our connection: not ours to apply
                    _ => {
                        self.health.malformed.fetch_add(1, Relaxed);
                    }
                }
            }
            Err(error) => {
                self.health.malformed.fetch_add(1, Relaxed);
                let e = Connection::malformed(error, text.as_str());
                tracing::warn!(symbol = %self.deps.symbol, "malformed depth frame from upstream: {e}");
            }
        }
        None
    }

    fn is_ours(&self, symbol: &str) -> bool {
        symbol.eq_ignore_ascii_case(&self.deps.symbol)
    }

    /// Re-initialises after the connection went away: the machine restarts from step 1, a
    /// snapshot still in flight belongs to the old connection.
    fn connection_lost(&mut self) {
        if let Some(h) = self.inflight.take() {
            h.abort();
        }
        self.sync.handle_connection_lost(now_ms());
        self.drain_events();
        self.publish(now_ms());
    }

    /// Starts a REST snapshot, unless the used weight says to wait for the next minute.
    fn start_snapshot(&mut self) {
        let now = now_ms();
        let minute = now.div_euclid(60_000);
        if let Some((w, m)) = self.weight_seen {
            if m == minute && w > self.deps.depth.max_used_weight {
                self.status.snapshot_weight_deferrals += 1;
                let to_next = (minute + 1) * 60_000 - now + 50;
                tracing::info!(symbol = %self.deps.symbol, used_weight = w, "depth snapshot held back to the next minute");
                self.snapshot_not_before = Instant::now() + Duration::from_millis(to_next as u64);
                return;
            }
        }
        self.want_snapshot = false;
        self.status.snapshot_requests += 1;
        let rest = self.deps.rest.clone();
        let symbol = self.deps.symbol.clone();
        let limit = self.deps.depth.snapshot_limit;
        let asked = self.deps.source.as_ref().map(|s| s.snapshot(&self.instrument));
        self.inflight = Some(self.shutdown.spawn(async move {
            match asked {
                None => match rest {
                    Some(rest) => rest.depth(&symbol, limit).await.map(|s| (s, None)),
                    None => Err(RestError::Transport {
                        url: symbol,
                        reason: "no REST snapshot for this book".into(),
                        timeout: false,
                    }),
                },
                Some(asked) => {
                    let (s, bid_floor, ask_ceiling) = asked.await?;
                    Ok((s, Some(Trusted { bid_floor, ask_ceiling })))
                }
            }
        }));
    }

    fn on_snapshot(&mut self, res: SnapshotResult) {
        let now = now_ms();
        if let Some(w) = self.deps.rest.as_ref().and_then(|r| r.used_weight_1m()) {
            self.weight_seen = Some((w, now.div_euclid(60_000)));
            self.status.used_weight_1m = Some(w);
        }
        match res {
            Ok((snapshot, given)) => {
                self.snapshot_retry = Duration::from_millis(self.deps.depth.snapshot_retry_base_ms);
                let range = given.unwrap_or_else(|| {
                    Trusted::of(&snapshot, self.deps.depth.snapshot_limit as usize)
                });
                match self.sync.state() {
                    SyncState::Synced => self.verify_range = Some(range),
                    SyncState::SnapshotMode => self.trusted = Trusted::default(),
                    SyncState::AwaitingSnapshot | SyncState::Bridging => self.trusted = range,
                }
                self.sync.handle_snapshot(snapshot, now);
            }
            Err(e) => {
                self.status.snapshot_failures += 1;
                if e.is_rate_limit() {
                    self.status.snapshot_rate_limited += 1;
                }
                tracing::warn!(symbol = %self.deps.symbol, "depth snapshot failed: {e}");
                self.health.error(format!("depth snapshot: {e}"));
                // Doubling back-off between attempts; during a 429/418 back-off the REST client
                // refuses without sending, so retries never reach the exchange early.
                self.snapshot_not_before = Instant::now() + self.snapshot_retry;
                self.snapshot_retry = (self.snapshot_retry * 2)
                    .min(Duration::from_millis(self.deps.depth.snapshot_retry_cap_ms));
                self.sync.handle_snapshot_failed(now);
            }
        }
    }

    /// Acts on the machine's outputs; returns `true` when the upstream stream must change.
    fn drain_events(&mut self) -> bool {
        let mut switch = false;
        while let Some(ev) = self.sync.poll_event() {
            match ev {
                SyncEvent::NeedSnapshot { reason } => {
                    tracing::debug!(symbol = %self.deps.symbol, ?reason, "depth snapshot needed");
                    self.want_snapshot = true;
                    if reason == ResyncReason::RetryDeltaMode {
                        switch = true;
                    }
                }
                SyncEvent::VerifyDue => self.want_snapshot = true,
                SyncEvent::EnteredSnapshotMode => {
                    tracing::warn!(symbol = %self.deps.symbol, "depth snapshots keep failing: snapshot mode (partial book stream)");
                    self.want_snapshot = false;
                    self.trusted = Trusted::default();
                    if let Some(h) = self.inflight.take() {
                        h.abort();
                    }
                    switch = true;
                }
                SyncEvent::GapDetected { last_update_id, first_id, prev_last_id } => {
                    tracing::info!(symbol = %self.deps.symbol, last_update_id, first_id, ?prev_last_id, "depth gap: resync");
                }
                SyncEvent::Verified { drift_levels: 0, .. } => {
                    if let Some(r) = self.verify_range.take() {
                        self.trusted = self.trusted.widen(r);
                    }
                }
                SyncEvent::Drift { last_update_id, drift_levels } => {
                    tracing::warn!(symbol = %self.deps.symbol, last_update_id, drift_levels, "depth book drifted from the exchange's: replaced");
                    // the book is now the verification snapshot's shadow: its range
                    if let Some(r) = self.verify_range.take() {
                        self.trusted = r;
                    }
                }
                SyncEvent::ChecksumMismatch { .. } | SyncEvent::Crossed { .. } => {}
                // only a venue's machine (shared::venue) reports these
                SyncEvent::SequenceReset { .. } | SyncEvent::ChecksumUnchecked { .. } => {}
                SyncEvent::BookChanged { .. }
                | SyncEvent::Synced { .. }
                | SyncEvent::DroppedStale { .. }
                | SyncEvent::Verified { .. } => {}
            }
        }
        switch
    }

    /// The synced book at the exchange's update id, pruned to the range it is complete in
    /// (`None` while not synced: whoever asks takes another job's).
    fn source_book(&self) -> Option<SourceBook> {
        if self.sync.state() != SyncState::Synced || !self.sync.is_synced() {
            return None;
        }
        let book = self.sync.book();
        let keep_bid = |p: Price| self.trusted.bid_floor.is_none_or(|f| p >= f);
        let keep_ask = |p: Price| self.trusted.ask_ceiling.is_none_or(|c| p <= c);
        Some(SourceBook {
            last_update_id: self.sync.last_update_id(),
            bids: book.bids.iter().filter(|l| keep_bid(l.price)).collect(),
            asks: book.asks.iter().filter(|l| keep_ask(l.price)).collect(),
            bid_floor: self.trusted.bid_floor,
            ask_ceiling: self.trusted.ask_ceiling,
        })
    }

    /// Hands the book to the publisher with its health and counters.
    fn publish(&mut self, now: i64) {
        let state = self.sync.state();
        let health = match state {
            SyncState::Synced => BookHealth::Synced,
            SyncState::SnapshotMode if self.sync.is_synced() => BookHealth::SnapshotMode,
            _ => BookHealth::Resyncing,
        };
        let stats = self.sync.stats();
        let status = BookStatus {
            health,
            gaps: stats.gaps,
            resyncs: stats.resyncs,
            drift: stats.drift_events,
            verifications: stats.verifications,
            events: stats.deltas_applied + stats.snapshots_applied,
        };
        let book = self.sync.book();
        let worse = |a: Option<shared::book::Level>, f: Option<Price>, below: bool| match (a, f) {
            (Some(l), Some(f)) => {
                if below {
                    l.price < f
                } else {
                    l.price > f
                }
            }
            _ => false,
        };
        let prune_bids = worse(book.bids.iter().next_back(), self.trusted.bid_floor, true);
        let prune_asks = worse(book.asks.iter().next_back(), self.trusted.ask_ceiling, false);
        let total = book.bids.len() + book.asks.len();
        let shown: &OrderBook = if prune_bids || prune_asks {
            self.view.clone_from(book);
            if let (true, Some(f)) = (prune_bids, self.trusted.bid_floor) {
                self.view.bids.remove_worse_than(f);
            }
            if let (true, Some(c)) = (prune_asks, self.trusted.ask_ceiling) {
                self.view.asks.remove_worse_than(c);
            }
            &self.view
        } else {
            book
        };
        let s = &mut self.status;
        s.pruned_levels = total - (shown.bids.len() + shown.asks.len());
        s.bid_levels = shown.bids.len();
        s.ask_levels = shown.asks.len();
        if health.is_publishable() && shown.is_crossed() {
            s.crossed_publishes += 1;
        }
        self.publisher.publish(shown, status, now);
        s.state = state;
        s.health = health;
        s.last_update_id = self.sync.last_update_id();
        s.trusted_bid_floor = self.trusted.bid_floor;
        s.trusted_ask_ceiling = self.trusted.ask_ceiling;
        s.sync.clone_from(stats);
        self.deps.stats.set(s);
    }
}

/// Completes with the in-flight snapshot's result; never while none is in flight.
async fn join_inflight(h: &mut Option<JoinHandle<SnapshotResult>>) -> SnapshotResult {
    match h {
        Some(h) => match h.await {
            Ok(r) => r,
            Err(e) => Err(RestError::Transport {
                url: "depth snapshot task".into(),
                reason: e.to_string(),
                timeout: false,
            }),
        },
        None => std::future::pending().await,
    }
}

/// Starts depth jobs for a depth [`crate::jobs::Supervisor`]; keeps every job's [`DepthJobStats`].
pub struct DepthRunner {
    config: Config,
    sources: Arc<Sources>,
    books: Arc<BookRegistry>,
    stats: Mutex<HashMap<InstrumentId, Arc<DepthJobStats>>>,
    /// The plug points ([`super::upstream`]): none on one process.
    source: Option<Arc<dyn DepthSource>>,
    tap: Option<Arc<dyn DiffTap>>,
}

impl DepthRunner {
    /// The jobs of one process: the exchange's books, published into `books`.
    pub fn new(config: &Config, sources: Arc<Sources>, books: Arc<BookRegistry>) -> Self {
        DepthRunner {
            config: config.clone(),
            sources,
            books,
            stats: Mutex::default(),
            source: None,
            tap: None,
        }
    }

    /// Its jobs take their diffs and snapshots from `source` instead of the exchange.
    pub fn with_source(mut self, source: Arc<dyn DepthSource>) -> Self {
        self.source = Some(source);
        self
    }

    /// Its jobs tell `tap` every diff they receive.
    pub fn with_tap(mut self, tap: Arc<dyn DiffTap>) -> Self {
        self.tap = Some(tap);
        self
    }

    /// The supervisor settings of depth jobs: the ingest ones with the depth capacity.
    pub fn supervisor_config(&self) -> IngestConfig {
        IngestConfig {
            ondemand_max_jobs: self.config.depth.ondemand_max_jobs,
            ..self.config.ingest.clone()
        }
    }

    /// The supervisor's snapshot with each running job's depth status.
    pub fn snapshot(&self, sup: SupervisorSnapshot) -> DepthJobsReport {
        let stats = lock(&self.stats);
        let jobs = sup
            .jobs
            .into_iter()
            .map(|job| {
                let depth = stats.get(&job.instrument).map(|s| s.get());
                DepthJobReport { job, depth }
            })
            .collect();
        DepthJobsReport { capacity: sup.capacity, jobs }
    }
}

impl JobRunner for DepthRunner {
    fn validate(&self, series: &shared::protocol::SeriesId) -> Result<(), ResolveError> {
        self.validate_instrument(&series.instrument)
    }

    fn validate_instrument(&self, instrument: &InstrumentId) -> Result<(), ResolveError> {
        self.sources.validate_instrument(instrument)
    }

    fn run(&self, ctx: JobContext) -> JobFuture {
        let sources = self.sources.clone();
        let books = self.books.clone();
        let depth = self.config.depth.clone();
        let ingest = self.config.ingest.clone();
        let stats = Arc::new(DepthJobStats::new(""));
        lock(&self.stats).insert(ctx.instrument.clone(), stats.clone());
        let (depth_source, tap) = (self.source.clone(), self.tap.clone());
        if let Some(venue) = sources.venue(&ctx.instrument.exchange).cloned() {
            if let Some(source) = depth_source {
                // a venue's book where another source holds the venue (a cluster gateway: the
                // workers keep it by the venue's rules and relay their published deltas, which
                // follow millrace's own spot rule)
                return Box::pin(async move {
                    let deps = DepthJobDeps {
                        depth,
                        ingest,
                        rest: None,
                        ws_base: source.feed_name(&ctx.instrument),
                        symbol: ctx.instrument.to_string(),
                        continuity: ContinuityRule::Spot,
                        books,
                        stats,
                        source: Some(source),
                        tap: None,
                        recording: None,
                    };
                    with_trades(ctx, deps).await;
                });
            }
            // another venue's book: its own job, by its own rules
            return Box::pin(async move {
                let Some(listing) = crate::venue::listing_for(&ctx, &venue).await else { return };
                let deps = crate::venue::book_job::VenueBookDeps {
                    source: venue,
                    listing,
                    books,
                    stats,
                    depth,
                    ingest,
                };
                crate::venue::book_job::run(ctx, deps).await;
            });
        }
        Box::pin(async move {
            let Some((source, symbol)) = crate::jobs::resolve_source(&sources, &ctx).await else {
                return;
            };
            let deps = DepthJobDeps {
                depth,
                ingest,
                rest: Some(source.rest.clone()),
                ws_base: source.endpoint.ws_base.clone(),
                symbol,
                continuity: source.product.continuity_rule(),
                books,
                stats,
                recording: depth_source.is_none().then(|| source.tap()).flatten(),
                source: depth_source,
                tap,
            };
            with_trades(ctx, deps).await;
        })
    }
}

/// Runs a depth job with its market's trades beside it: from the exchange (a Binance book's
/// `aggTrade` stream), or from the book's other source (a cluster gateway's: the trades its
/// workers relay), when it has them.
async fn with_trades(ctx: JobContext, deps: DepthJobDeps) {
    let trades: Option<futures_util::future::BoxFuture<'static, ()>> =
        match (&deps.source, &deps.rest) {
            (None, Some(rest)) => Some(Box::pin(crate::trades::binance_agg_trades(
                deps.books.trades().clone(),
                ctx.instrument.clone(),
                deps.ws_base.clone(),
                rest.clone(),
                deps.symbol.clone(),
                deps.ingest.clone(),
                deps.recording.clone(),
                ctx.shutdown.clone(),
            ))),
            (Some(source), _) => {
                source.trades(&ctx.instrument, deps.books.trades().clone(), ctx.shutdown.clone())
            }
            (None, None) => None,
        };
    match trades {
        Some(trades) => {
            tokio::join!(run(ctx, deps), trades);
        }
        None => run(ctx, deps).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::book::Level;
    use shared::fixed::Qty;

    fn lv(p: i64) -> Level {
        Level::new(Price::from_units(p), Qty::from_units(1))
    }

    #[test]
    fn trusted_range_only_for_cut_sides_and_widens() {
        let s = DepthSnapshot {
            last_update_id: 1,
            bids: vec![lv(10), lv(9), lv(8)],
            asks: vec![lv(11), lv(12)],
        };
        let t = Trusted::of(&s, 3);
        assert_eq!(t, Trusted { bid_floor: Some(Price::from_units(8)), ask_ceiling: None });
        let s2 = DepthSnapshot {
            last_update_id: 2,
            bids: vec![lv(9), lv(8), lv(7)],
            asks: vec![lv(11), lv(12), lv(13)],
        };
        let t2 = Trusted::of(&s2, 3);
        assert_eq!(t2.ask_ceiling, Some(Price::from_units(13)));
        let w = t.widen(t2);
        assert_eq!(w, Trusted { bid_floor: Some(Price::from_units(7)), ask_ceiling: None });
    }
}
