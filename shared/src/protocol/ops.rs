//! Every REST answer and admin request body of millrace's browser API besides the order-book
//! snapshot (`GET /fapi/v1/depth`, [`super::RestDepthResponse`]): the catalogue, stored candles,
//! the operations reports and the admin actions. The server serialises these types and the
//! dashboard deserialises the same ones, so a field renamed on one side is a compile error on
//! the other; the server's contract test (`server/tests/it/api_shapes.rs`) reads every endpoint
//! of a running server back into them and fails on any field the types do not know.
//!
//! No field has a default: a field missing from an answer is an error, never a silent zero.
//! Optional values are `Option`s that the server always writes (as `null`), except the few
//! marked `skip_serializing_if`, which say why.

use serde::{Deserialize, Serialize};

use super::{BookHealth, BookStatus, ErrorCode, InstrumentId, Market, SeriesId};
use crate::book::Level;
use crate::candle::{Candle, Timeframe};
use crate::fixed::{Price, Qty, Volume};
use crate::l3::Venue;
use crate::sync::{SyncState, SyncStats};

/// The body of every REST error answer: `{"code":"unknown_series","msg":"…"}` with a 4xx or 5xx
/// status; the same shape as a WebSocket reply's `error`.
pub type ApiErrorBody = super::ErrorBody;

/// A machine-readable error code of the REST API (the WebSocket's [`ErrorCode`]s).
pub type ApiErrorCode = ErrorCode;

/// `GET /api/v1/version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VersionInfo {
    pub version: String,
}

/// `GET /healthz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Health {
    pub status: HealthStatus,
    /// What is wrong, one sentence each (naming the configuration key where one is at fault);
    /// empty when `ok`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

/// How the service is, as `/healthz` says it (`degraded` answers 503).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthStatus {
    Ok,
    /// Serving, but a part it depends on is away (it retries): see `problems`.
    Degraded,
}

/// `GET /api/v1/series`: what can be charted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Catalog {
    /// 1m and every derived timeframe, shortest first.
    pub timeframes: Vec<Timeframe>,
    /// Every instrument every source lists.
    pub instruments: Vec<InstrumentInfo>,
    /// Every series with stored candles.
    pub stored: Vec<StoredSeries>,
}

/// One instrument a source lists (from the exchange's `exchangeInfo`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstrumentInfo {
    pub id: InstrumentId,
    /// The `[[sources]]` name.
    pub source: String,
    /// The exchange's own symbol (`BTCUSDT`).
    pub symbol: String,
    /// The exchange's trading status (`TRADING`, `BREAK`, …).
    pub status: String,
    pub tick_size: Option<Price>,
    pub step_size: Option<Qty>,
}

/// `GET /api/v1/trades`: an instrument's newest trades, newest first, held in memory while its
/// book's job runs, and what their ids went through since the server started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TradesReport {
    pub instrument: InstrumentId,
    pub trades: Vec<crate::trade::Trade>,
    /// Trades received, duplicates included.
    pub received: u64,
    /// Trades whose id was seen already: dropped.
    pub duplicates: u64,
    /// Times the venue's sequential trade ids skipped, and the ids missing in all.
    pub id_gaps: u64,
    pub missing_ids: u64,
    /// Trades recovered from REST for holes the stream left (Binance aggTrades).
    pub filled: u64,
}

/// A series with stored closed candles.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredSeries {
    pub series: SeriesId,
    pub count: u64,
    pub first_open_time: i64,
    pub last_open_time: i64,
}

/// One row of `GET /api/v1/klines`, in Binance's own array form
/// `[openTime, "open", "high", "low", "close", "volume", closeTime, null, trades]`. Index 7
/// (Binance's quote-asset volume) is always `null`: millrace does not keep it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KlineRow {
    pub open_time: i64,
    pub open: Price,
    pub high: Price,
    pub low: Price,
    pub close: Price,
    pub volume: Volume,
    /// The last millisecond of the candle's bucket.
    pub close_time: i64,
    pub trades: u64,
}

impl KlineRow {
    /// The row of a stored candle of timeframe `tf`.
    pub fn new(tf: Timeframe, c: &Candle) -> Self {
        KlineRow {
            open_time: c.open_time,
            open: c.open,
            high: c.high,
            low: c.low,
            close: c.close,
            volume: c.volume,
            close_time: c.open_time + tf.duration_ms() - 1,
            trades: c.trades,
        }
    }

    /// The candle of this row, built from `minutes` 1m candles.
    pub fn candle(&self, minutes: u32) -> Candle {
        Candle {
            open_time: self.open_time,
            open: self.open,
            high: self.high,
            low: self.low,
            close: self.close,
            volume: self.volume,
            trades: self.trades,
            minutes,
        }
    }
}

type KlineTuple = (i64, Price, Price, Price, Price, Volume, i64, Option<()>, u64);

impl Serialize for KlineRow {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let r = self;
        let t: KlineTuple =
            (r.open_time, r.open, r.high, r.low, r.close, r.volume, r.close_time, None, r.trades);
        t.serialize(s)
    }
}

impl<'de> Deserialize<'de> for KlineRow {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let (open_time, open, high, low, close, volume, close_time, _, trades) =
            KlineTuple::deserialize(d)?;
        Ok(KlineRow { open_time, open, high, low, close, volume, close_time, trades })
    }
}

/// `GET /api/v1/ops/jobs`: the ingest supervisors' debug snapshot (seed 000 §10).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobsReport {
    /// The candle jobs' capacity.
    pub capacity: Capacity,
    /// The candle jobs, pinned first.
    pub jobs: Vec<JobReport>,
    /// The depth jobs (Binance order books), with their own capacity.
    pub depth: DepthJobsReport,
}

/// On-demand capacity of one supervisor (seed 000 §4-5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Capacity {
    /// 0 = unlimited.
    pub ondemand_max_jobs: u64,
    pub ondemand_jobs: u64,
    pub pinned_jobs: u64,
    pub ondemand_idle_ttl_s: u64,
    /// Idle on-demand jobs stopped to make room.
    pub evictions: u64,
    /// Subscriptions refused with `capacity_exhausted`.
    pub refusals: u64,
    /// Idle on-demand jobs stopped by the reaper.
    pub reaped: u64,
    /// Job starts refused to a client address: its fair share of capacity, or a start rate
    /// (`rate_limited`).
    #[serde(default)]
    pub start_refusals: u64,
    /// Jobs with subscribers stopped at full capacity to give a client address holding less
    /// than its fair share a job (their subscribers were told `preempted`).
    #[serde(default)]
    pub preemptions: u64,
}

/// What a supervisor's jobs do; in a cluster, the kind of a worker's task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobKind {
    /// An instrument's 1m kline stream into the candle pipeline.
    Kline,
    /// An instrument's Binance order book kept in sync and published.
    Depth,
}

impl JobKind {
    pub const ALL: [JobKind; 2] = [JobKind::Kline, JobKind::Depth];

    pub fn as_str(self) -> &'static str {
        match self {
            JobKind::Kline => "kline",
            JobKind::Depth => "depth",
        }
    }
}

impl std::str::FromStr for JobKind {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "kline" => Ok(JobKind::Kline),
            "depth" => Ok(JobKind::Depth),
            _ => Err(()),
        }
    }
}

/// One job of a supervisor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobReport {
    pub instrument: InstrumentId,
    pub kind: JobKind,
    /// The upstream series: `{instrument}:1m` for kline jobs, `depth@{instrument}` for depth.
    pub series_id: String,
    pub pinned: bool,
    /// The seed's refcount: -1 for pinned jobs, else live subscriptions.
    pub refcount: i64,
    /// Live subscriptions (also for pinned jobs).
    pub subscribers: u32,
    /// Live subscriptions per stream.
    pub subscriptions: std::collections::BTreeMap<String, u32>,
    pub idle_since_ms: Option<i64>,
    pub idle_for_ms: Option<i64>,
    pub started_at_ms: i64,
    pub crashes: u64,
    pub last_crash_at_ms: Option<i64>,
    /// Why it last crashed (`last_error` is the last thing that went wrong, a crash or not).
    #[serde(default)]
    pub last_crash: Option<String>,
    pub last_error: Option<String>,
    pub connected: bool,
    pub connects: u64,
    pub messages: u64,
    pub malformed: u64,
    pub closed_candles: u64,
    pub gap_filled_candles: u64,
    pub persist_failures: u64,
    pub last_message_at_ms: Option<i64>,
    pub last_closed_open_time: Option<i64>,
    /// How far the exchange's clock is behind the close of the newest stored candle, ms, while
    /// it is (no candle can close until it catches up; `/healthz` says so).
    #[serde(default)]
    pub exchange_behind_ms: Option<i64>,
}

/// The depth jobs: their supervisor's view plus each job's sync state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DepthJobsReport {
    pub capacity: Capacity,
    pub jobs: Vec<DepthJobReport>,
}

/// One depth job: the supervisor's [`JobReport`] fields, and `depth`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DepthJobReport {
    #[serde(flatten)]
    pub job: JobReport,
    /// `None` until the job first ran.
    pub depth: Option<DepthJobStatus>,
}

/// What a depth job reports about its book (`Default`: before its first publish).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DepthJobStatus {
    /// The exchange's symbol.
    pub symbol: String,
    /// The upstream stream in use (`btcusdt@depth@100ms`, or `btcusdt@depth20@100ms` in
    /// snapshot mode).
    pub stream: String,
    /// The sync machine's state.
    pub state: SyncState,
    /// What was last published.
    pub health: BookHealth,
    pub last_update_id: u64,
    pub bid_levels: usize,
    pub ask_levels: usize,
    /// Levels held back at the last publish because they lie beyond the trusted price range.
    pub pruned_levels: usize,
    /// Lowest trusted bid / highest trusted ask (`None`: the side is complete).
    pub trusted_bid_floor: Option<Price>,
    pub trusted_ask_ceiling: Option<Price>,
    pub snapshot_requests: u64,
    pub snapshot_failures: u64,
    /// Failures that were rate limits (429/418, or the client's own back-off after one).
    pub snapshot_rate_limited: u64,
    /// Snapshot requests held back to the next minute because of the used REST weight.
    pub snapshot_weight_deferrals: u64,
    /// The last `X-MBX-USED-WEIGHT-1M` seen after a snapshot request.
    pub used_weight_1m: Option<u32>,
    /// Switches between the diff stream and the partial book stream.
    pub mode_switches: u64,
    /// Publishes while the book was crossed (the publisher sent nothing).
    pub crossed_publishes: u64,
    /// The sync machine's own counters.
    pub sync: SyncStats,
    /// A running hash (FNV-1a) of every book message the job handled: its sequence, its
    /// levels and the machine's state after it. Two runs over the same frames (a live run and
    /// its recording played back) show the same, frame for frame; 0 where not kept.
    #[serde(default)]
    pub book_digest: u64,
}

/// `GET /api/v1/ops/books`: every book millrace publishes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BooksReport {
    pub books: Vec<BookInfo>,
}

/// One published book.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BookInfo {
    pub instrument: InstrumentId,
    /// Who rebuilds it: `binance_depth`, `l3_sse`, `l3_szse`, `l3_lobster`.
    pub source: String,
    /// Whether a producer is attached.
    pub active: bool,
    #[serde(flatten)]
    pub status: BookStatus,
    /// Last published update id.
    pub id: u64,
    pub checksum: u32,
    pub bid_levels: usize,
    pub ask_levels: usize,
    pub best_bid: Option<Level>,
    pub best_ask: Option<Level>,
    /// Deltas published since the book was registered.
    pub deltas: u64,
    /// Publishes skipped because the book was crossed.
    pub crossed_skipped: u64,
    /// Last publish, ms since the epoch (0 = never).
    pub published_ms: i64,
}

/// `GET /api/v1/ops/shards`: the tick-by-tick engine and its sources.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardsReport {
    pub engine: EngineStats,
    pub sources: Vec<TickSourceStats>,
}

/// Sequence continuity of a tick-by-tick book.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FeedHealth {
    /// Every message so far was applied in sequence.
    Live,
    /// A gap is open (or data was lost) and the book awaits recovery: not to be shown as fresh.
    Stale,
}

impl FeedHealth {
    /// The name on the wire: `live`, `stale`.
    pub fn as_str(self) -> &'static str {
        match self {
            FeedHealth::Live => "live",
            FeedHealth::Stale => "stale",
        }
    }
}

/// The sharded tick-by-tick engine (seed 001).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineStats {
    pub uptime_ms: u64,
    pub auto_balance: bool,
    pub max_shards: usize,
    pub shards: Vec<ShardStats>,
    pub symbols: Vec<SymbolStats>,
    pub migrations: MigrationStats,
    /// Migrations the automatic policy asked for.
    pub balancer_decisions: u64,
    /// Events dropped by the dispatcher because their symbol index is not registered.
    pub unknown_symbol_events: u64,
}

impl EngineStats {
    pub fn shard(&self, id: u32) -> Option<&ShardStats> {
        self.shards.iter().find(|s| s.id == id)
    }

    pub fn symbol(&self, idx: u32) -> Option<&SymbolStats> {
        self.symbols.get(idx as usize).filter(|s| s.symbol == idx)
    }
}

/// One shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardStats {
    pub id: u32,
    /// `queued + buffered`.
    pub pending: u64,
    /// Events waiting in the shard's queue.
    pub queued: u64,
    /// Events held by the shard for migrations (incoming buffers, outgoing legacy lists).
    pub buffered: u64,
    pub processed: u64,
    pub processed_per_s: u64,
    /// Age of the batch being processed (0 when idle): how far behind the feed the shard is.
    pub lag_us: u64,
    pub lag_ms: u64,
    pub symbols: u32,
    pub symbols_with_pending: u32,
    /// The symbols with the most pending events, most first.
    pub top_pending: Vec<PendingSymbol>,
    /// Events that reached the shard for a symbol it does not hold (should stay 0).
    pub misrouted: u64,
    /// CPU time the shard's thread has used.
    pub cpu_ms: u64,
    pub cpu_ns: u64,
}

/// A symbol with pending events, in a shard's top list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PendingSymbol {
    pub symbol: u32,
    pub instrument: InstrumentId,
    pub pending: u64,
}

/// One tick-by-tick book in the engine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SymbolStats {
    /// The engine's index of the symbol.
    pub symbol: u32,
    pub instrument: InstrumentId,
    pub venue: Venue,
    /// The shard its events are routed to.
    pub shard: u32,
    pub pending: u64,
    pub processed: u64,
    /// Handled but not applied (duplicates, events behind an open gap).
    pub not_applied: u64,
    pub processed_per_s: u64,
    /// Dispatch-to-done time of the symbol's last processed batch.
    pub lag_us: u64,
    pub lag_ms: u64,
    pub health: FeedHealth,
    pub gaps: u64,
    pub resets: u64,
    pub migrations: u64,
    /// A migration of this symbol is in flight.
    pub migrating: bool,
    /// The simulator's hot spot on this symbol (its rate ×2000); absent for symbols of other
    /// sources, which have no such control.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hot: Option<bool>,
}

/// Migrations of the engine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigrationStats {
    /// Requests accepted (each ends up completed or rejected; queued ones wait in between).
    pub requested: u64,
    pub started: u64,
    pub completed: u64,
    /// Requests that waited for a previous migration of the same symbol.
    pub queued: u64,
    /// Requests refused when their turn came (same shard, shard limit).
    pub rejected: u64,
    pub in_flight: Vec<u32>,
    /// Step 1 to resumed processing at the target, for the last completed migration.
    pub last_us: u64,
    pub max_us: u64,
    /// Backlog events the source packed instead of computing, last migration and all.
    pub last_legacy_events: u64,
    pub legacy_events_total: u64,
}

/// Where a tick-by-tick source's events come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TickSourceKind {
    /// A simulator's `/tbt/ws` feed.
    Sim,
    /// Recorded files (`[[l3.replay]]`).
    Replay,
}

/// One tick-by-tick source's counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TickSourceStats {
    pub name: String,
    pub kind: TickSourceKind,
    pub events: u64,
    pub unknown_symbol: u64,
    /// Snapshots taken because the stream (re)connected.
    pub connect_snapshots: u64,
    /// Snapshots taken to recover from a sequence gap.
    pub recoveries: u64,
    pub recovery_failures: u64,
    pub held_dropped: u64,
    /// Times the feed delivered nothing for `l3.feed_stale_after_ms` (its books reported stale).
    #[serde(default)]
    pub silences: u64,
    /// A replay source has sent everything.
    pub replay_done: bool,
}

/// `GET /api/v1/ops/backfill`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackfillReport {
    pub tasks: Vec<BackfillTask>,
    /// Whether runs may start on this node: always on a single process; in a cluster, on the
    /// node holding the persister lease.
    pub runs_here: bool,
}

/// Where a backfill task is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackfillState {
    /// Never run.
    Idle,
    Running,
    /// The last run covered its window (or found the exchange has nothing older).
    Done,
    /// The last run was stopped on request.
    Stopped,
    /// The last run gave up after too many errors (progress kept).
    Failed,
}

impl BackfillState {
    /// The name on the wire: `idle`, `running`, `done`, `stopped`, `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            BackfillState::Idle => "idle",
            BackfillState::Running => "running",
            BackfillState::Done => "done",
            BackfillState::Stopped => "stopped",
            BackfillState::Failed => "failed",
        }
    }
}

/// One backfill task (seed 003).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackfillTask {
    pub series: SeriesId,
    pub retention_days: u32,
    pub running: bool,
    pub state: BackfillState,
    pub stop_reason: Option<String>,
    /// Covered ranges of 1m open times, oldest first.
    pub covered: Vec<(i64, i64)>,
    /// The window of the current or last run.
    pub window: Option<(i64, i64)>,
    /// Share of the window covered, 0..=1, for a progress bar (not a market value).
    pub progress: f64, // float: not a market value
    pub cursor: Option<i64>,
    pub run_started_from: Option<i64>,
    pub candles_written: u64,
    pub batches: u64,
    pub last_error: Option<String>,
    pub updated_at_ms: i64,
}

/// `GET /api/v1/ops/recording`: the recorder of upstream frames (`[record]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordingReport {
    /// Whether any source is recorded.
    pub enabled: bool,
    /// Where the files go.
    pub dir: String,
    /// The recorded sources.
    pub sources: Vec<String>,
    /// Frames handed to the writer, and written to files.
    pub queued: u64,
    pub recorded: u64,
    /// Frames left out of the recording (never out of the live path): the queue was full, or
    /// their write failed.
    pub dropped_queue_full: u64,
    pub dropped_write_failed: u64,
    pub write_errors: u64,
    pub bytes_written: u64,
    /// Files deleted for the disk budget or the retention.
    pub files_deleted: u64,
    /// The last failed write's error.
    pub last_error: Option<String>,
    /// The recordings played back as sources (`kind = "recording"`).
    #[serde(default)]
    pub playback: Vec<PlaybackReport>,
}

/// One recording played back as a source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlaybackReport {
    /// The source it serves, and the recorded source's directory.
    pub source: String,
    pub dir: String,
    /// Recorded seconds played per second; `None`: as fast as possible.
    pub speed: Option<f64>, // float: not a market value
    pub looped: bool,
    /// The recorded WebSocket connections in the time range, and how many were played (a
    /// connection of the job that subscribed as it did takes the next one).
    pub connections: usize,
    pub connections_played: u64,
    /// Connections whose every frame was sent.
    pub connections_finished: u64,
    pub frames_played: u64,
    /// Connections that asked for what the recording does not hold (they are kept open, silent).
    pub unmatched_connections: u64,
    /// REST answers served from the recording, and requests it held no answer for.
    pub rest_answered: u64,
    pub rest_unmatched: u64,
    /// Times a frame or an answer waited [the player's bound] for the recorded order (a frame
    /// after the answers received before it, an answer after the frames) and went on without
    /// it: a request the recorded run made and this one did not.
    #[serde(default)]
    pub order_waits_given_up: u64,
    /// The frames' time range, Unix ns.
    pub first_ns: Option<i64>,
    pub last_ns: Option<i64>,
}

/// `GET /api/v1/ops/sources`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourcesReport {
    pub sources: Vec<SourceStatus>,
}

/// Kind of a market-data source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    /// The built-in simulated exchange, spoken to over Binance's protocol.
    Sim,
    /// Binance (spot or USD-M futures).
    Binance,
    /// OKX (API v5, spot).
    Okx,
    /// Bybit (API v5, spot).
    Bybit,
    /// Coinbase Advanced Trade.
    Coinbase,
    /// Kraken (WebSocket v2).
    Kraken,
    /// A recording of another source's frames played back as that source (`kind =
    /// "recording"`): the configuration resolves it to the recorded source's kind when it loads
    /// (its `source.json`), so a running source is never of this kind.
    Recording,
}

impl SourceKind {
    /// The wire dialect a source of this kind speaks (the simulator's own is Binance's).
    pub fn dialect(self) -> crate::venue::Dialect {
        use crate::venue::Dialect;
        match self {
            // (a recording's kind is resolved when the configuration loads)
            SourceKind::Sim | SourceKind::Binance | SourceKind::Recording => Dialect::Binance,
            SourceKind::Okx => Dialect::Okx,
            SourceKind::Bybit => Dialect::Bybit,
            SourceKind::Coinbase => Dialect::Coinbase,
            SourceKind::Kraken => Dialect::Kraken,
        }
    }

    /// The kind of the venue speaking `dialect` (Binance for Binance's).
    pub fn of_dialect(dialect: crate::venue::Dialect) -> SourceKind {
        use crate::venue::Dialect;
        match dialect {
            Dialect::Binance => SourceKind::Binance,
            Dialect::Okx => SourceKind::Okx,
            Dialect::Bybit => SourceKind::Bybit,
            Dialect::Coinbase => SourceKind::Coinbase,
            Dialect::Kraken => SourceKind::Kraken,
        }
    }
}

/// One `[[sources]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceStatus {
    pub name: String,
    pub kind: SourceKind,
    pub market: Market,
    /// `None` for an embedded simulator unless an admin asks (its address is not disclosed).
    pub rest_base: Option<String>,
    pub ws_base: Option<String>,
    /// Whether millrace runs this source's simulator itself.
    pub embedded_simulator: bool,
    /// Simulated seconds per second of an embedded simulator (not a market value).
    pub speed: Option<f64>, // float: not a market value
    /// The symbol list is loaded.
    pub ready: bool,
    pub symbols: usize,
    pub last_error: Option<String>,
    pub loaded_at_ms: Option<i64>,
    /// Binance's `X-MBX-USED-WEIGHT-1M` after the last REST request.
    pub rest_used_weight_1m: Option<u32>,
    /// The REST client's own weight budget per minute (`sources[].rest_weight_budget_1m`).
    #[serde(default)]
    pub rest_weight_budget_1m: Option<u32>,
    /// REST calls not sent because they would have passed the budget.
    #[serde(default)]
    pub rest_budget_refusals: u64,
}

/// What an admin action did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdminResult {
    Ok,
    Started,
    Stopping,
    Stopped,
    /// A job's run ended and a new one took its place (admin `jobs/stop` of a pinned or
    /// subscribed job).
    Restarted,
    Migrating,
}

/// `POST /api/v1/admin/backfill/start` and `/stop`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeriesRequest {
    pub series: String,
}

/// The answer to [`SeriesRequest`]s.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeriesReply {
    pub result: AdminResult,
    pub series: String,
}

/// `POST /api/v1/admin/jobs/stop`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstrumentRequest {
    pub instrument: String,
}

/// The answer to [`InstrumentRequest`]s.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstrumentReply {
    pub result: AdminResult,
    pub instrument: InstrumentId,
}

/// `POST /api/v1/admin/shards/migrate`: move a tick-by-tick book to shard `target`, or to a new
/// shard with `-1`. `symbol` is an instrument id or, when unambiguous, a stock code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigrateRequest {
    pub symbol: String,
    pub target: i64,
}

/// The answer to a [`MigrateRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigrateReply {
    pub result: AdminResult,
    pub symbol: InstrumentId,
    /// The shard it was on.
    pub from: Option<u32>,
    pub target: i64,
}

/// `POST /api/v1/admin/shards/auto_balance`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AutoBalanceRequest {
    pub on: bool,
}

/// The answer to an [`AutoBalanceRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AutoBalanceReply {
    pub result: AdminResult,
    pub auto_balance: bool,
}

/// `POST /api/v1/admin/sim/hotspot`: the simulator multiplies a stock's tick-by-tick rate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HotspotRequest {
    pub symbol: String,
    pub hot: bool,
}

/// The answer to a [`HotspotRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HotspotReply {
    pub result: AdminResult,
    pub symbol: InstrumentId,
    pub hot: bool,
}

/// `GET /api/v1/ops/cluster`: the supervisor's view of the cluster (seed 004).
/// Tasks in a [`ClusterReport`] unless the request asks otherwise (10,000 tasks would not fit
/// one NATS message).
pub const REPORT_MAX_TASKS: usize = 1000;

/// What a report request asks for (its body; empty = the defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportQuery {
    #[serde(default = "default_max_tasks")]
    pub max_tasks: usize,
}

fn default_max_tasks() -> usize {
    REPORT_MAX_TASKS
}

impl Default for ReportQuery {
    fn default() -> Self {
        ReportQuery { max_tasks: REPORT_MAX_TASKS }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterReport {
    pub supervisor: SupervisorInfo,
    pub workers: Vec<ClusterWorker>,
    /// Wanted tasks with the workers holding each, in task id order: the first `max_tasks`
    /// of the request (default [`REPORT_MAX_TASKS`]).
    pub tasks: Vec<ClusterTask>,
    /// How many tasks are wanted.
    pub tasks_total: usize,
    /// Tasks held by fewer workers than the redundancy asks, and why (as many as `tasks`).
    pub unassigned: Vec<Shortfall>,
    pub unassigned_total: usize,
    /// The last assignment events, newest last.
    pub events: Vec<AssignmentRecord>,
}

/// Where the supervisor is in its life (seed 004 "生命周期").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SupervisorState {
    /// Not the leader: collects statuses, assigns nothing.
    Standby,
    /// Leader, collecting worker statuses before the first assignment.
    WarmingUp,
    /// Leader, waiting for the first task query's answer.
    AwaitingTasks,
    /// Leader, assigning on events.
    Running,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SupervisorInfo {
    pub state: SupervisorState,
    /// The id of the leading supervisor, if one is known.
    pub leader: Option<String>,
    /// The leader's epoch (its lease revision); instructions carry it.
    pub epoch: u64,
    /// Time left of the warm-up, while warming up.
    pub warmup_remaining_ms: Option<u64>,
    pub redundancy: u32,
    /// Handler invocations since start: statuses, demands, ticks, timer checks, assignment
    /// events and instruction sets sent (at steady state only the first three grow).
    pub stats: SupervisorStats,
    /// Messages the answering supervisor refused from the bus, by kind.
    #[serde(default)]
    pub refused: std::collections::BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SupervisorStats {
    pub statuses: u64,
    pub demands: u64,
    pub task_lists: u64,
    pub ticks: u64,
    pub timer_checks: u64,
    pub assignments: u64,
    pub instructions_sent: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterWorker {
    pub id: String,
    pub max_load: u32,
    /// Tasks assigned to it.
    pub running: u32,
    pub active: bool,
    pub leaving: bool,
    /// Milliseconds since its last status.
    pub last_seen_ms: u64,
    /// Messages it refused from the bus, by kind (as its last full status said).
    #[serde(default)]
    pub refused: std::collections::BTreeMap<String, u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterTask {
    /// `kind:instrument`.
    pub id: String,
    pub kind: JobKind,
    pub instrument: InstrumentId,
    /// Workers holding it, by id.
    pub workers: Vec<String>,
    /// Milliseconds since the freshest holder last had upstream data (`None`: none yet).
    pub last_data_age_ms: Option<u64>,
}

/// Why a task has fewer holders than the redundancy asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShortCause {
    /// Workers that could take it are at their max load.
    NoCapacity,
    /// Fewer active workers than the redundancy (every one of them holds it).
    FewWorkers,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shortfall {
    pub task: String,
    /// Replicas missing.
    pub missing: u32,
    pub cause: ShortCause,
    pub since_ms: u64,
}

/// One assignment event (seed 004 "任务分配") and what it did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AssignmentRecord {
    /// Supervisor time of the event (ms).
    pub at_ms: u64,
    /// What triggered it: `task query (reset)`, `worker w2 timed out`, `demand`, ...
    pub reason: String,
    pub reset: bool,
    /// Replicas assigned ("add task" instructions, kept sessions of a reset not counted).
    pub added: u32,
    /// "end task" instructions.
    pub ended: u32,
    /// Replicas still missing afterwards.
    pub unassigned: u32,
    /// Instruction sets sent.
    pub instructions: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kline_rows_are_binance_arrays() {
        let c = Candle::one_minute(
            1_700_000_040_000,
            Price::from_units(100),
            Price::parse("101.5").unwrap(),
            Price::from_units(99),
            Price::parse("100.25").unwrap(),
            Volume::parse("12.5").unwrap(),
            7,
        );
        let row = KlineRow::new(Timeframe::M5, &c);
        let text = serde_json::to_string(&row).unwrap();
        assert_eq!(
            text,
            r#"[1700000040000,"100","101.5","99","100.25","12.5",1700000339999,null,7]"#
        );
        let back: KlineRow = serde_json::from_str(&text).unwrap();
        assert_eq!(back, row);
        assert_eq!(back.candle(5), Candle { minutes: 5, ..c });
        // Binance's own rows carry a quote volume at index 7 (and more after it in their API)
        let binance =
            r#"[1700000040000,"100","101.5","99","100.25","12.5",1700000339999,"1250.0",7]"#;
        assert_eq!(
            serde_json::from_str::<KlineRow>(binance).map(|r| r.trades).ok(),
            None,
            "index 7 must be null"
        );
    }

    #[test]
    fn a_missing_field_is_an_error_not_a_default() {
        let e = serde_json::from_str::<VersionInfo>("{}").unwrap_err().to_string();
        assert!(e.contains("version"), "{e}");
        let e = serde_json::from_str::<VersionInfo>(r#"{"version":"1","extra":2}"#).unwrap_err();
        assert!(e.to_string().contains("extra"), "{e}");
    }
}
