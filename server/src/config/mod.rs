//! Configuration of `millrace serve`: a TOML file, then `MILLRACE_*` environment variables, then
//! command-line flags, each overriding the one before. Every parameter of the design seeds is a
//! key here with the seed's default, so `millrace` with no configuration at all runs the built-in
//! simulator into an embedded SQLite file and serves the dashboard on http://127.0.0.1:8080.
//!
//! ## Environment overrides
//! `MILLRACE_<SECTION>__<KEY>` (two underscores between section and key) sets `[section] key`,
//! e.g. `MILLRACE_INGEST__ONDEMAND_MAX_JOBS=50`; nested tables take more parts
//! (`MILLRACE_L3__ENGINE__SHARDS=4`), and `MILLRACE_SOURCES` / `MILLRACE_BACKFILL` set a whole list
//! as an inline TOML array. A key that takes a string takes the raw value as it is; any other key
//! reads it as TOML (`50`, `true`, `["sim:spot:BTC/USDT"]`). The short forms
//! `MILLRACE_ADDR`, `MILLRACE_DATA_DIR`, `MILLRACE_STATIC_DIR`, `MILLRACE_SIM_SPEED` and
//! `MILLRACE_ADMIN_TOKEN` are the flags' environment forms.
//!
//! ## Errors
//! Unknown keys, values of the wrong type and values out of range stop start-up with a message
//! naming the key (`ingest.batch_max: must be between 1 and 100000, got 0`), never a fallback.
//!
//! ## Example
//! ```toml
//! [server]
//! addr = "127.0.0.1:8080"
//! data_dir = "data"
//! admin_token = "change-me"
//!
//! [ingest]
//! pinned = ["sim:spot:BTC/USDT", "sim:spot:ETH/USDT"]
//! ondemand_max_jobs = 20
//! ondemand_idle_ttl_s = 60
//!
//! [depth]
//! pinned = ["sim:spot:BTC/USDT", "sim:spot:ETH/USDT"]
//! snapshot_limit = 1000
//!
//! [[sources]]
//! name = "sim"
//! kind = "sim"
//! speed = 1.0
//!
//! [[sources]]
//! name = "binance"
//! kind = "binance"
//! market = "spot"
//!
//! [[backfill]]
//! series = "sim:spot:BTC/USDT:1m"
//! retention_days = 7
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use shared::candle::Timeframe;
pub use shared::protocol::ops::SourceKind;

pub mod cluster;
pub mod engine;
pub mod host;
pub mod origin;
pub mod pg_url;

pub use cluster::{BusAuth, BusConfig, BusKind, ClusterConfig, StoreConfig, StoreKind};
pub use engine::{BalanceConfig, EngineConfig};
use shared::protocol::{InstrumentId, Market, NameError, SeriesId};
use shared::Price;

/// Why a configuration cannot be used. Every message names the file, the key or the variable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read --config {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not a valid TOML file", path.display())]
    Toml {
        path: PathBuf,
        #[source]
        source: TomlSyntax,
    },
    /// A value out of range, of the wrong type, or naming something that does not exist.
    #[error("configuration key `{key}`: {problem}")]
    Invalid { key: String, problem: String },
    #[error("environment variable {name}: {problem}")]
    Env { name: String, problem: String },
}

impl From<cluster::InvalidKey> for ConfigError {
    fn from(e: cluster::InvalidKey) -> Self {
        ConfigError::Invalid { key: e.key, problem: e.problem }
    }
}

/// Where a configuration file is not TOML, and why: the parser's message and position, without
/// the text of the line (toml's own error quotes it, and the line may hold a secret).
#[derive(Debug, thiserror::Error)]
#[error("line {line}, column {column}: {message} (the line is not shown: it may hold a secret)")]
pub struct TomlSyntax {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl TomlSyntax {
    fn new(text: &str, e: &toml::de::Error) -> Self {
        let at = e.span().map_or(0, |s| s.start).min(text.len());
        let before = text.get(..at).unwrap_or_default();
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().unwrap_or_default().chars().count() + 1;
        TomlSyntax { line, column, message: e.message().to_string() }
    }
}

/// A [`ConfigError::Invalid`] from a message `configuration key `K`: P`.
fn invalid(message: String) -> ConfigError {
    let parsed =
        message.strip_prefix("configuration key `").and_then(|rest| rest.split_once('`')).map(
            |(key, problem)| (key.to_string(), problem.trim_start_matches([':', ' ']).to_string()),
        );
    match parsed {
        Some((key, problem)) => ConfigError::Invalid { key, problem },
        None => ConfigError::Invalid { key: String::new(), problem: message },
    }
}

/// Everything `millrace serve` runs with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub limits: LimitsConfig,
    pub ingest: IngestConfig,
    pub depth: DepthConfig,
    /// `[l3]`: tick-by-tick books (sharded engine, simulator feeds, Shanghai replay).
    pub l3: L3Config,
    pub sources: Vec<SourceConfig>,
    pub backfill: Vec<BackfillTaskConfig>,
    /// `[bus]`: in-process (default) or NATS.
    pub bus: cluster::BusConfig,
    /// `[store]`: SQLite (default) or PostgreSQL.
    pub store: cluster::StoreConfig,
    /// `[cluster]`: seed 004's supervisor, workers and gateways.
    pub cluster: cluster::ClusterConfig,
    /// `[record]`: the recorder of every upstream frame (docs/recording.md).
    pub record: RecordConfig,
}

/// `[record]`: what the recorder keeps (docs/recording.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RecordConfig {
    /// Record at all (default false).
    pub enabled: bool,
    /// Where the files go; default `{server.data_dir}/recordings`.
    pub dir: Option<PathBuf>,
    /// The sources recorded, by name; empty: every source.
    pub sources: Vec<String>,
    /// The most the files may take, MiB; the oldest go first when it is reached.
    pub budget_mb: u64,
    /// Files whose hour ended longer ago than this are deleted.
    pub retention_days: u64,
    /// Frames waiting to be written before new ones are dropped from the recording (counted;
    /// never from the live path).
    pub queue: usize,
}

impl Default for RecordConfig {
    fn default() -> Self {
        RecordConfig {
            enabled: false,
            dir: None,
            sources: Vec::new(),
            budget_mb: 10_240,
            retention_days: 7,
            queue: 65_536,
        }
    }
}

/// `[server]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Listen address.
    pub addr: SocketAddr,
    /// Directory of the SQLite file (`millrace.db`); created if missing.
    pub data_dir: PathBuf,
    /// A directory with the built dashboard (`dist`, made by `scripts/build-client`), served
    /// instead of the one embedded in the binary; default none: the embedded one.
    pub static_dir: Option<PathBuf>,
    /// Bearer token for admin actions; admin actions are disabled without one.
    pub admin_token: Option<String>,
    /// Milliseconds between heartbeats on the `heartbeat` stream.
    pub heartbeat_ms: u64,
    /// Web pages (`Origin` header) that may open `/ws`, besides the server's own origin (the
    /// one whose host and port are the request's `Host`): `scheme://host[:port]`, `:*` for any
    /// port, `"*"` for any page. A request without `Origin` (not a browser) is always allowed;
    /// others get 403. Default: localhost, 127.0.0.1 and [::1] on any port.
    pub allowed_origins: Vec<String>,
    /// Names and addresses (any port; `"*"` for any) by which requests may reach this server:
    /// a request whose `Host` is another gets 421 `host_not_allowed`, so a web page cannot read
    /// the API through DNS rebinding. The address the server is bound to is always allowed.
    /// Default: localhost, 127.0.0.1 and [::1]; a server bound to 0.0.0.0 or :: with the default
    /// warns at start, since clients reaching it by another name are refused.
    pub allowed_hosts: Vec<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            data_dir: PathBuf::from("data"),
            static_dir: None,
            admin_token: None,
            heartbeat_ms: 1000,
            allowed_origins: ["localhost", "127.0.0.1", "[::1]"]
                .iter()
                .flat_map(|h| [format!("http://{h}:*"), format!("https://{h}:*")])
                .collect(),
            allowed_hosts: ["localhost", "127.0.0.1", "[::1]"].map(String::from).to_vec(),
        }
    }
}

/// `[limits]`: protection of the browser API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Largest request frame accepted (bytes); larger ones get a `too_large` reply.
    pub max_message_bytes: usize,
    /// Streams one WebSocket connection may hold.
    pub max_subscriptions_per_connection: usize,
    /// Concurrent TCP connections (HTTP or WebSocket) from one client address (an IPv4
    /// address; an IPv6 /64), counted at accept; further ones are closed at once. At most half
    /// of `max_connections` is used. The default, 512, is out of reach of one person: a
    /// dashboard page opens one WebSocket, and a browser opens at most ~260 connections to one
    /// host in all (Chromium: 255 WebSockets and 6 HTTP/1.1 connections; Firefox: 200 and 6),
    /// while one address can take no more than 512 of the global cap. Load tests that open
    /// thousands of connections from one machine set it.
    pub max_connections_per_ip: usize,
    /// Concurrent TCP connections in all; further ones are closed at once. 0 = derived from the
    /// open-file limit (raised to its hard limit at start), leaving room for the server's own
    /// files and sockets; a value must be below that limit.
    pub max_connections: usize,
    /// A request head (request line and headers) must arrive whole within this (ms): of the
    /// connection's start for its first request, of the head's first byte for later ones on a
    /// keep-alive connection. Slower connections are closed.
    pub header_read_timeout_ms: u64,
    /// A keep-alive connection idle this long (ms) between requests is closed.
    pub idle_timeout_ms: u64,
    /// Ingest jobs one WebSocket connection may start per minute (subscriptions to a kline or
    /// depth stream whose job is not running); a request over it is refused whole.
    pub max_job_starts_per_min_per_connection: u32,
    /// ... and all connections of one IP address together.
    pub max_job_starts_per_min_per_ip: u32,
    /// Messages buffered per topic for slow subscribers; one that falls further behind is
    /// dropped with close reason `lagging`.
    pub bus_capacity: usize,
    /// A send to a client that takes longer than this (ms) drops the client.
    pub send_timeout_ms: u64,
    /// Largest `limit` of `GET /api/v1/klines`.
    pub max_klines_limit: usize,
    /// Most rows one export (`GET /api/v1/export/candles`, `millrace export`) may hold.
    pub max_export_rows: u64,
    /// A request body the server reads (the admin requests') must arrive whole within this
    /// (ms) of the request's head; slower ones get 408 and their connection is closed.
    pub body_timeout_ms: u64,
    /// Failed admin attempts (a missing or wrong token) one client address may make per minute
    /// (a token bucket: bursts up to this); beyond, its admin requests get 429 before their
    /// token is compared. Successful requests take nothing.
    pub max_admin_failures_per_min_per_ip: u32,
    /// The server sends a WebSocket Ping on every connection this often (ms).
    pub ws_ping_interval_ms: u64,
    /// A WebSocket that sends nothing (a Pong or anything else) this long (ms) after an
    /// unanswered Ping is closed (1001, or dropped when its socket is dead): a half-open socket
    /// does not live forever.
    pub ws_pong_timeout_ms: u64,
    /// A WebSocket holding no subscription (`heartbeat` counts) this long (ms) is closed (1008,
    /// reason `idle: …`); subscribing resets it, and one holding a subscription is never closed
    /// for idleness.
    pub ws_idle_timeout_ms: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_message_bytes: 64 * 1024,
            max_subscriptions_per_connection: 200,
            max_connections_per_ip: 512,
            max_connections: 0,
            header_read_timeout_ms: 10_000,
            idle_timeout_ms: 60_000,
            max_job_starts_per_min_per_connection: 20,
            max_job_starts_per_min_per_ip: 60,
            bus_capacity: 1024,
            send_timeout_ms: 10_000,
            max_klines_limit: 5000,
            max_export_rows: 50_000_000,
            body_timeout_ms: 10_000,
            max_admin_failures_per_min_per_ip: 10,
            ws_ping_interval_ms: 20_000,
            ws_pong_timeout_ms: 10_000,
            ws_idle_timeout_ms: 60_000,
        }
    }
}

/// `[ingest]`: the supervisor and candle pipeline
/// (seeds/ingest-supervisor-and-binance-kline-ws.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IngestConfig {
    /// Instruments (or series; their instrument is used) whose jobs start at boot and are never
    /// evicted (the seed's whitelist, refcount -1).
    pub pinned: Vec<String>,
    /// Most on-demand jobs at once; 0 = unlimited (seed §4).
    pub ondemand_max_jobs: usize,
    /// Most on-demand jobs one client address may hold a subscription on when it asks for a new
    /// one (its fair share); 0 = no per-address limit. Also applies to depth jobs.
    pub ondemand_max_jobs_per_ip: usize,
    /// Most job starts a minute asked by clients, on the whole server (a token bucket: bursts
    /// up to this); 0 = unlimited. Depth jobs have a bucket of their own of the same size.
    pub max_job_starts_per_min: u32,
    /// On-demand jobs idle (no subscriber) longer than this are stopped (seed §5).
    pub ondemand_idle_ttl_s: u64,
    /// How often the idle reaper runs (seed: every second).
    pub reaper_interval_ms: u64,
    /// Minimum interval between forming-candle publications per job (seed §6: 250 ms).
    pub forming_min_interval_ms: u64,
    /// Flush the closed-candle buffer at this many candles (seed §7: 200).
    pub batch_max: usize,
    /// ... or after this long (seed §7: 0.5 s).
    pub flush_ms: u64,
    /// Reconnect back-off: first delay (seed §10: 2 s), doubling up to the cap, with jitter.
    pub reconnect_base_ms: u64,
    pub reconnect_cap_ms: u64,
    /// A connection healthy this long resets the back-off.
    pub reconnect_reset_after_ms: u64,
    /// No message from upstream for this long = dead connection.
    pub stall_timeout_ms: u64,
    /// Open a new upstream connection after this long (Binance closes at 24 h).
    pub planned_reconnect_after_s: u64,
    /// Derived timeframes computed from 1m (seed §9).
    pub derived: Vec<Timeframe>,
    /// A failed persist is retried after this long, doubling per failure up to
    /// `persist_retry_cap_ms` (reset by a persist that succeeds); the candles stay buffered
    /// meanwhile.
    pub persist_retry_ms: u64,
    pub persist_retry_cap_ms: u64,
    /// Most closed 1m candles a job keeps while the store refuses them (about a week of one
    /// instrument's minutes); then it stops reading the exchange until the store takes them, and
    /// fetches the minutes that closed meanwhile over REST.
    pub max_pending_candles: usize,
}

impl Default for IngestConfig {
    fn default() -> Self {
        use Timeframe::*;
        Self {
            pinned: vec!["sim:spot:BTC/USDT".into(), "sim:spot:ETH/USDT".into()],
            ondemand_max_jobs: 20,
            ondemand_max_jobs_per_ip: 10,
            max_job_starts_per_min: 120,
            ondemand_idle_ttl_s: 60,
            reaper_interval_ms: 1000,
            forming_min_interval_ms: 250,
            batch_max: 200,
            flush_ms: 500,
            reconnect_base_ms: 2000,
            reconnect_cap_ms: 60_000,
            reconnect_reset_after_ms: 60_000,
            stall_timeout_ms: 30_000,
            planned_reconnect_after_s: 23 * 3600 + 50 * 60,
            derived: vec![M3, M5, M15, M30, H1, H2, H4, H6, H8, H12, D1],
            persist_retry_ms: 1000,
            persist_retry_cap_ms: 30_000,
            max_pending_candles: 10_000,
        }
    }
}

/// `[depth]`: Binance depth jobs, which keep millrace's copy of an exchange order book in sync
/// (`<sym>@depth@100ms` + REST snapshots, seeds/local-order-book-snapshot-delta-sync.md) and
/// publish it. Capacity, idle TTL, reaper and reconnect back-off are those of `[ingest]`, except
/// the on-demand capacity, which is counted separately for depth jobs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DepthConfig {
    /// Instruments whose depth jobs start at boot and are never evicted.
    pub pinned: Vec<String>,
    /// Most on-demand depth jobs at once; 0 = unlimited.
    pub ondemand_max_jobs: usize,
    /// Levels per side of a REST snapshot (Binance spot: up to 5000; weight grows with it).
    pub snapshot_limit: u16,
    /// How often the book is checked against a fresh REST snapshot; 0 disables it.
    pub verify_interval_ms: u64,
    /// Consecutive failed snapshots before falling back to the partial book stream
    /// (`<sym>@depth20@100ms`).
    pub snapshot_failures_before_fallback: u32,
    /// How long to stay in the fallback snapshot mode before trying deltas again.
    pub snapshot_mode_retry_ms: u64,
    /// First wait after a failed snapshot, doubling up to `snapshot_retry_cap_ms`; a rate-limit
    /// answer's `Retry-After` is waited out in full.
    pub snapshot_retry_base_ms: u64,
    pub snapshot_retry_cap_ms: u64,
    /// A snapshot request is held back until the next minute while the REST weight used in the
    /// current minute (Binance's `X-MBX-USED-WEIGHT-1M`) is above this (Binance spot allows 6000).
    pub max_used_weight: u32,
    /// How often the book is published to millrace's clients (the seed's 100 ms).
    pub publish_interval_ms: u64,
}

impl Default for DepthConfig {
    fn default() -> Self {
        Self {
            pinned: vec!["sim:spot:BTC/USDT".into(), "sim:spot:ETH/USDT".into()],
            ondemand_max_jobs: 20,
            snapshot_limit: 1000,
            verify_interval_ms: 60_000,
            snapshot_failures_before_fallback: 3,
            snapshot_mode_retry_ms: 30_000,
            snapshot_retry_base_ms: 500,
            snapshot_retry_cap_ms: 30_000,
            max_used_weight: 4800,
            publish_interval_ms: 100,
        }
    }
}

/// `[l3]`: the tick-by-tick books.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct L3Config {
    /// The process that runs the books: `gateway` (every `serve`, as on one machine) or, in a
    /// cluster, `worker:ID` — that worker alone runs them and gateways forward to it over NATS.
    pub host: String,
    /// Rebuild the books of every `sim` source's tick-by-tick feed (`/tbt/ws`).
    pub sim_feeds: bool,
    /// The sharded engine: shards, publish interval, auto-balance and its thresholds.
    pub engine: EngineConfig,
    /// Event batches queued for the dispatcher before feeds wait.
    pub queue_batches: usize,
    /// Most events held for one symbol while its recovery runs; beyond it the oldest are dropped
    /// (and the recovery starts over).
    pub max_held_events: usize,
    /// A simulator feed that delivers no event for this long (paused, or stuck upstream) has
    /// its books reported `stale` until events arrive again (the feed is ~800 events/s).
    pub feed_stale_after_ms: u64,
    /// Recorded tick-by-tick days replayed into the engine (`[[l3.replay]]`).
    pub replay: Vec<ReplaySourceConfig>,
}

/// `[[l3.replay]]`: Shanghai tick-by-tick files (逐笔委托 + 逐笔成交, CSV / .gz / .zip) replayed
/// into the engine as a live source; books are `{name}:stock:{SecurityID}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReplaySourceConfig {
    /// Source name in instrument ids.
    pub name: String,
    pub orders: PathBuf,
    pub trades: PathBuf,
    /// Price tick the float-printed prices are snapped to.
    pub tick: String,
    /// MDTime seconds per wall-clock second (1 = the original pace); 0 = as fast as possible.
    pub speed: f64,
}

impl Default for ReplaySourceConfig {
    fn default() -> Self {
        Self {
            name: "sse".into(),
            orders: PathBuf::new(),
            trades: PathBuf::new(),
            tick: "0.01".into(),
            speed: 1.0,
        }
    }
}

impl L3Config {
    /// The worker that runs the books (`host = "worker:ID"`), if not the gateways.
    pub fn worker_host(&self) -> Option<&str> {
        self.host.strip_prefix("worker:")
    }

    /// Names the first bad value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let id_ok = |id: &str| {
            (1..=64).contains(&id.len())
                && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        };
        if self.host != "gateway" && !self.worker_host().is_some_and(id_ok) {
            return Err(invalid(format!(
                "configuration key `l3.host`: {:?} must be \"gateway\" or \"worker:ID\" with a worker's --id",
                self.host
            )));
        }
        self.engine
            .validate()
            .map_err(|e| invalid(format!("configuration key `l3.engine`: {e}")))?;
        for (i, r) in self.replay.iter().enumerate() {
            let key = format!("l3.replay[{i}]");
            if r.name.is_empty() || r.name.contains([':', '@', ',', '/', ' ']) {
                return Err(invalid(format!(
                    "configuration key `{key}.name`: {:?} must be non-empty and free of `:@,/ `",
                    r.name
                )));
            }
            if !(r.speed.is_finite() && r.speed >= 0.0) {
                return Err(invalid(format!("configuration key `{key}.speed`: must be 0 (as fast as possible) or positive, got {}", r.speed)));
            }
            if Price::parse(&r.tick).map_or(true, |t| t.raw() <= 0) {
                return Err(invalid(format!(
                    "configuration key `{key}.tick`: {:?} is not a positive decimal",
                    r.tick
                )));
            }
            for (k, p) in [("orders", &r.orders), ("trades", &r.trades)] {
                if !p.is_file() {
                    return Err(invalid(format!(
                        "configuration key `{key}.{k}`: {} is not a file",
                        p.display()
                    )));
                }
            }
        }
        Ok(())
    }
}

impl Default for L3Config {
    fn default() -> Self {
        Self {
            host: "gateway".into(),
            sim_feeds: true,
            engine: EngineConfig { auto_balance: true, ..EngineConfig::default() },
            queue_batches: 4096,
            max_held_events: 2_000_000,
            feed_stale_after_ms: 2_000,
            replay: Vec::new(),
        }
    }
}

/// `[[sources]]`: where market data comes from. The `name` is the exchange part of ids
/// (`sim:spot:BTC/USDT`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SourceConfig {
    pub name: String,
    pub kind: SourceKind,
    pub market: Market,
    /// REST base URL; default: Binance's for `binance`, the embedded simulator's for `sim`.
    pub rest_base: Option<String>,
    /// WebSocket base URL; default as for `rest_base`.
    pub ws_base: Option<String>,
    /// `sim` only: simulated seconds per real second.
    pub speed: f64,
    /// `sim` only: random seed (same seed, same market).
    pub seed: u64,
    /// `sim` only: listen address of the embedded simulator (port 0 = any free port).
    pub sim_addr: SocketAddr,
    /// `sim` only: an embedded simulator also serves OKX, Bybit, Coinbase and Kraken, listed as
    /// the sources `{name}-okx`, `{name}-bybit`, `{name}-coinbase` and `{name}-kraken`.
    pub venues: bool,
    /// Most REST request weight sent to the source in a minute, whatever the clients do (gap
    /// fills, snapshots, job starts); calls past it wait for the next minute. Default: 80 % of
    /// Binance's limit (spot 4800 of 6000, futures 1920 of 2400).
    pub rest_weight_budget_1m: Option<u32>,
    /// `recording` only: the recorded source's directory (`{record.dir}/{source}`, with its
    /// `source.json`).
    pub dir: Option<PathBuf>,
    /// `recording` only: the time range played (RFC 3339 or Unix ms; default: all of it).
    pub from: Option<String>,
    pub to: Option<String>,
    /// `recording` only: start again at the end.
    #[serde(rename = "loop")]
    pub looped: bool,
    /// Set when the configuration loads: the recording this source plays back.
    #[serde(skip)]
    pub playback: Option<Playback>,
}

/// A recording played back as a source, as its `[[sources]]` entry resolves: the recorded
/// source's dialect and market (its `source.json`), the range, the speed.
#[derive(Debug, Clone, PartialEq)]
pub struct Playback {
    pub dir: PathBuf,
    pub dialect: shared::venue::Dialect,
    pub from_ms: Option<i64>,
    pub to_ms: Option<i64>,
    /// Recorded seconds per second; `None`: as fast as possible (`speed = 0`).
    pub speed: Option<f64>,
    pub looped: bool,
}

impl SourceConfig {
    /// Resolves a `recording` source to the recorded source's kind and market (from its
    /// `source.json`), keeping what to play in [`SourceConfig::playback`]; other sources are
    /// left as they are. The error names the key.
    pub fn resolve_recording(&mut self, key: &str) -> Result<(), ConfigError> {
        if self.kind != SourceKind::Recording {
            return Ok(());
        }
        let dir = self.dir.clone().ok_or_else(|| {
            invalid(format!("configuration key `{key}.dir`: a recording source needs the recorded source's directory"))
        })?;
        let described = dir.join("source.json");
        let text = std::fs::read_to_string(&described).map_err(|e| {
            invalid(format!(
                "configuration key `{key}.dir`: {} is not a recorded source's directory: {e}",
                described.display()
            ))
        })?;
        #[derive(Deserialize)]
        struct Described {
            dialect: String,
            market: String,
        }
        let d: Described = serde_json::from_str(&text).map_err(|e| {
            invalid(format!("configuration key `{key}.dir`: {}: {e}", described.display()))
        })?;
        let dialect = d.dialect.parse::<shared::venue::Dialect>().map_err(|_| {
            invalid(format!(
                "configuration key `{key}.dir`: {} names no venue ({:?})",
                described.display(),
                d.dialect
            ))
        })?;
        let market = d.market.parse::<Market>().map_err(|()| {
            invalid(format!(
                "configuration key `{key}.dir`: {} names no market ({:?})",
                described.display(),
                d.market
            ))
        })?;
        let time = |k: &str, v: &Option<String>| -> Result<Option<i64>, ConfigError> {
            v.as_deref()
                .map(|t| {
                    t.parse::<i64>().ok().or_else(|| venues::parse_rfc3339_ms(t)).ok_or_else(|| {
                        invalid(format!(
                            "configuration key `{key}.{k}`: {t:?} is neither RFC 3339 nor Unix ms"
                        ))
                    })
                })
                .transpose()
        };
        let (from_ms, to_ms) = (time("from", &self.from)?, time("to", &self.to)?);
        if let (Some(f), Some(t)) = (from_ms, to_ms) {
            if f > t {
                return Err(invalid(format!("configuration key `{key}.to`: before `from`")));
            }
        }
        if !(self.speed.is_finite() && (0.0..=100_000.0).contains(&self.speed)) {
            return Err(invalid(format!(
                "configuration key `{key}.speed`: must be between 0 (as fast as possible) and 100000, got {}",
                self.speed
            )));
        }
        self.playback = Some(Playback {
            dir,
            dialect,
            from_ms,
            to_ms,
            speed: (self.speed > 0.0).then_some(self.speed),
            looped: self.looped,
        });
        self.kind = SourceKind::of_dialect(dialect);
        self.market = market;
        self.venues = false;
        Ok(())
    }
}

impl Default for SourceConfig {
    fn default() -> Self {
        Self {
            name: "sim".into(),
            kind: SourceKind::Sim,
            market: Market::Spot,
            rest_base: None,
            ws_base: None,
            speed: 1.0,
            seed: 42,
            sim_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            venues: true,
            rest_weight_budget_1m: None,
            dir: None,
            from: None,
            to: None,
            looped: false,
            playback: None,
        }
    }
}

/// `[[backfill]]`: a history task (seeds/incremental-newest-first-backfill.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BackfillTaskConfig {
    /// A 1m series id.
    pub series: String,
    /// How far back to fetch (days before now).
    pub retention_days: u32,
    /// Candles per REST request (Binance max 1000).
    pub batch_limit: u16,
    /// A task's first run stops after this many consecutive batches with nothing inside the
    /// retention window (the seed's `max_expired_batches`, 3; later runs walk on to the
    /// window's start).
    pub max_expired_batches: u32,
    /// Start at boot (the seed's `auto_start`).
    pub auto_start: bool,
    /// Pause between REST requests (ms), to stay well inside the exchange's rate limits.
    pub pause_ms: u64,
}

impl Default for BackfillTaskConfig {
    fn default() -> Self {
        Self {
            series: String::new(),
            retention_days: 7,
            batch_limit: 1000,
            max_expired_batches: 3,
            auto_start: true,
            pause_ms: 100,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            server: ServerConfig::default(),
            limits: LimitsConfig::default(),
            ingest: IngestConfig::default(),
            depth: DepthConfig::default(),
            l3: L3Config::default(),
            sources: vec![SourceConfig::default()],
            backfill: vec![BackfillTaskConfig {
                series: "sim:spot:BTC/USDT:1m".into(),
                retention_days: 3,
                ..BackfillTaskConfig::default()
            }],
            bus: Default::default(),
            store: Default::default(),
            cluster: Default::default(),
            record: Default::default(),
        }
    }
}

/// Command-line flags that override the file and the environment (`None` = not given).
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub addr: Option<SocketAddr>,
    pub data_dir: Option<PathBuf>,
    pub static_dir: Option<PathBuf>,
    pub sim_speed: Option<f64>,
    pub admin_token: Option<String>,
}

impl Config {
    /// Loads `file` (if any), applies `env` (pairs of name and value, normally
    /// `std::env::vars()`), then `flags`, and validates the result.
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        flags: &Overrides,
    ) -> Result<Config, ConfigError> {
        let mut table = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
                text.parse::<toml::Table>().map_err(|e| ConfigError::Toml {
                    path: path.to_path_buf(),
                    source: TomlSyntax::new(&text, &e),
                })?
            }
            None => toml::Table::new(),
        };
        for (name, value) in env {
            apply_env(&mut table, &name, &value)?;
        }
        let mut config: Config = {
            let de = toml::Value::Table(table);
            serde_path_to_error::deserialize(de).map_err(|e| {
                let path = e.path().to_string();
                let name = path.rsplit('.').next().unwrap_or_default();
                if crate::redact::is_secret_key(name) || crate::redact::is_location_key(name) {
                    // serde's message quotes the value
                    return ConfigError::Invalid {
                        key: path,
                        problem: "must be a string (the value is not shown: the key holds a \
                                  secret or a location that may carry one)"
                            .into(),
                    };
                }
                invalid(format!("configuration key `{path}`: {}", e.into_inner()))
            })?
        };
        if let Some(a) = flags.addr {
            config.server.addr = a;
        }
        if let Some(d) = &flags.data_dir {
            config.server.data_dir = d.clone();
        }
        if let Some(d) = &flags.static_dir {
            config.server.static_dir = Some(d.clone());
        }
        if let Some(t) = &flags.admin_token {
            config.server.admin_token = Some(t.clone());
        }
        if let Some(speed) = flags.sim_speed {
            for s in config.sources.iter_mut().filter(|s| s.kind == SourceKind::Sim) {
                s.speed = speed;
            }
        }
        config.resolve_recordings()?;
        config.validate()?;
        Ok(config)
    }

    /// Resolves every `recording` source ([`SourceConfig::resolve_recording`]).
    pub fn resolve_recordings(&mut self) -> Result<(), ConfigError> {
        for (n, s) in self.sources.iter_mut().enumerate() {
            s.resolve_recording(&format!("sources[{n}]"))?;
        }
        Ok(())
    }

    /// Checks ranges and cross-references; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        fn range<T: PartialOrd + std::fmt::Display + Copy>(
            key: &str,
            v: T,
            lo: T,
            hi: T,
        ) -> Result<(), ConfigError> {
            if v < lo || v > hi {
                return Err(invalid(format!(
                    "configuration key `{key}`: must be between {lo} and {hi}, got {v}"
                )));
            }
            Ok(())
        }
        let r = &self.record;
        range("record.budget_mb", r.budget_mb, 1, 100_000_000)?;
        range("record.retention_days", r.retention_days, 1, 3_650)?;
        range("record.queue", r.queue, 1, 10_000_000)?;
        for (n, name) in r.sources.iter().enumerate() {
            if !self.sources.iter().any(|s| &s.name == name) {
                return Err(invalid(format!(
                    "configuration key `record.sources[{n}]`: no source named {name:?}"
                )));
            }
        }
        for s in &self.sources {
            if r.enabled && !recording::valid_source_name(&s.name) {
                return Err(invalid(format!(
                    "configuration key `sources.name`: {:?} cannot name a recording directory (letters, digits, '-', '_', '.')",
                    s.name
                )));
            }
        }
        let i = &self.ingest;
        range("ingest.batch_max", i.batch_max, 1, 100_000)?;
        range("ingest.flush_ms", i.flush_ms, 1, 3_600_000)?;
        range("ingest.forming_min_interval_ms", i.forming_min_interval_ms, 0, 3_600_000)?;
        range("ingest.ondemand_idle_ttl_s", i.ondemand_idle_ttl_s, 0, 30 * 86_400)?;
        range("ingest.ondemand_max_jobs_per_ip", i.ondemand_max_jobs_per_ip, 0, 100_000)?;
        range("ingest.max_job_starts_per_min", i.max_job_starts_per_min, 0, 1_000_000)?;
        range("ingest.reaper_interval_ms", i.reaper_interval_ms, 10, 3_600_000)?;
        range("ingest.reconnect_base_ms", i.reconnect_base_ms, 1, 3_600_000)?;
        range("ingest.reconnect_cap_ms", i.reconnect_cap_ms, i.reconnect_base_ms, 3_600_000)?;
        range("ingest.stall_timeout_ms", i.stall_timeout_ms, 100, 3_600_000)?;
        range("ingest.planned_reconnect_after_s", i.planned_reconnect_after_s, 1, 86_400)?;
        range("ingest.persist_retry_ms", i.persist_retry_ms, 1, 3_600_000)?;
        range(
            "ingest.persist_retry_cap_ms",
            i.persist_retry_cap_ms,
            i.persist_retry_ms,
            3_600_000,
        )?;
        range("ingest.max_pending_candles", i.max_pending_candles as u64, 1, 10_000_000)?;
        if i.derived.contains(&Timeframe::M1) {
            return Err(ConfigError::Invalid {
                key: "ingest.derived".into(),
                problem: "1m is the ingested timeframe, not a derived one".into(),
            });
        }
        let l = &self.limits;
        range("limits.max_message_bytes", l.max_message_bytes, 256, 1 << 20)?;
        range(
            "limits.max_subscriptions_per_connection",
            l.max_subscriptions_per_connection,
            1,
            100_000,
        )?;
        range("limits.max_connections_per_ip", l.max_connections_per_ip, 1, 1_000_000)?;
        range("limits.max_connections", l.max_connections, 0, 10_000_000)?;
        range("limits.header_read_timeout_ms", l.header_read_timeout_ms, 10, 3_600_000)?;
        range("limits.idle_timeout_ms", l.idle_timeout_ms, 10, 86_400_000)?;
        range(
            "limits.max_job_starts_per_min_per_connection",
            l.max_job_starts_per_min_per_connection,
            1,
            1_000_000,
        )?;
        range(
            "limits.max_job_starts_per_min_per_ip",
            l.max_job_starts_per_min_per_ip,
            1,
            1_000_000,
        )?;
        range("limits.bus_capacity", l.bus_capacity, 1, 1 << 20)?;
        range("limits.send_timeout_ms", l.send_timeout_ms, 1, 3_600_000)?;
        range("limits.max_klines_limit", l.max_klines_limit, 1, 100_000)?;
        range("limits.max_export_rows", l.max_export_rows, 1, 10_000_000_000)?;
        range("limits.body_timeout_ms", l.body_timeout_ms, 10, 3_600_000)?;
        range(
            "limits.max_admin_failures_per_min_per_ip",
            l.max_admin_failures_per_min_per_ip,
            1,
            100_000,
        )?;
        range("limits.ws_ping_interval_ms", l.ws_ping_interval_ms, 10, 3_600_000)?;
        range("limits.ws_pong_timeout_ms", l.ws_pong_timeout_ms, 10, 3_600_000)?;
        range("limits.ws_idle_timeout_ms", l.ws_idle_timeout_ms, 10, 86_400_000)?;
        let d = &self.depth;
        range("depth.snapshot_limit", d.snapshot_limit, 5, 5000)?;
        range("depth.verify_interval_ms", d.verify_interval_ms, 0, 86_400_000)?;
        range(
            "depth.snapshot_failures_before_fallback",
            d.snapshot_failures_before_fallback,
            1,
            1000,
        )?;
        range("depth.snapshot_mode_retry_ms", d.snapshot_mode_retry_ms, 100, 86_400_000)?;
        range("depth.snapshot_retry_base_ms", d.snapshot_retry_base_ms, 1, 3_600_000)?;
        range(
            "depth.snapshot_retry_cap_ms",
            d.snapshot_retry_cap_ms,
            d.snapshot_retry_base_ms,
            3_600_000,
        )?;
        range("depth.max_used_weight", d.max_used_weight, 1, 1_000_000)?;
        range("depth.publish_interval_ms", d.publish_interval_ms, 10, 60_000)?;
        range("server.heartbeat_ms", self.server.heartbeat_ms, 10, 3_600_000)?;
        for (n, o) in self.server.allowed_origins.iter().enumerate() {
            origin::Pattern::parse(o).map_err(|e| ConfigError::Invalid {
                key: format!("server.allowed_origins[{n}]"),
                problem: e.to_string(),
            })?;
        }
        for (n, h) in self.server.allowed_hosts.iter().enumerate() {
            host::HostPattern::parse(h).map_err(|e| ConfigError::Invalid {
                key: format!("server.allowed_hosts[{n}]"),
                problem: e.to_string(),
            })?;
        }
        self.l3.validate()?;
        if self.l3.worker_host().is_some() && !self.cluster.enabled {
            return Err(invalid(format!(
                "configuration key `l3.host`: {:?} names a cluster worker, but [cluster] enabled = false",
                self.l3.host
            )));
        }
        cluster::validate(&self.bus, &self.store, &self.cluster)?;
        range("l3.queue_batches", self.l3.queue_batches, 1, 1 << 20)?;
        range("l3.max_held_events", self.l3.max_held_events, 1, 1 << 30)?;
        range("l3.feed_stale_after_ms", self.l3.feed_stale_after_ms, 100, 3_600_000)?;
        if self.server.admin_token.as_deref().is_some_and(|t| t.trim().len() < 8) {
            return Err(ConfigError::Invalid {
                key: "server.admin_token".into(),
                problem: "must be at least 8 characters".into(),
            });
        }
        let mut names = std::collections::HashSet::new();
        for (n, s) in self.sources.iter().enumerate() {
            let key = format!("sources[{n}]");
            if s.name.is_empty() || s.name.contains([':', '@', ',', '/', ' ']) {
                return Err(invalid(format!(
                    "configuration key `{key}.name`: {:?} must be non-empty and free of `:@,/ `",
                    s.name
                )));
            }
            if let Some(b) = s.rest_weight_budget_1m {
                range(&format!("{key}.rest_weight_budget_1m"), b, 1, 1_000_000)?;
            }
            if !names.insert(s.name.as_str()) {
                return Err(invalid(format!(
                    "configuration key `{key}.name`: source {:?} is defined twice",
                    s.name
                )));
            }
            let dialect = s.kind.dialect();
            let linear = dialect == shared::venue::Dialect::Bybit && s.market == Market::Futures;
            if dialect != shared::venue::Dialect::Binance && s.market != Market::Spot && !linear {
                return Err(invalid(format!(
                    "configuration key `{key}.market`: a {dialect} source serves the spot market only{}",
                    if dialect == shared::venue::Dialect::Bybit {
                        " or \"futures\" (its linear USDT perpetuals)"
                    } else {
                        ""
                    }
                )));
            }
            if s.kind == SourceKind::Sim
                && !(s.speed.is_finite() && s.speed > 0.0 && s.speed <= 100_000.0)
            {
                return Err(invalid(format!("configuration key `{key}.speed`: must be > 0 and <= 100000 (--sim-speed), got {}", s.speed)));
            }
            for (k, url) in [("rest_base", &s.rest_base), ("ws_base", &s.ws_base)] {
                if let Some(u) = url {
                    let ok = match k {
                        "rest_base" => u.starts_with("http://") || u.starts_with("https://"),
                        _ => u.starts_with("ws://") || u.starts_with("wss://"),
                    };
                    if !ok {
                        return Err(invalid(format!(
                            "configuration key `{key}.{k}`: {u:?} is not a {} URL",
                            if k == "rest_base" { "http(s)" } else { "ws(s)" }
                        )));
                    }
                }
            }
        }
        for (n, p) in i.pinned.iter().enumerate() {
            let inst = parse_instrument_or_series(p)
                .map_err(|e| invalid(format!("configuration key `ingest.pinned[{n}]`: {e}")))?;
            self.source(&inst.exchange).ok_or_else(|| {
                invalid(format!(
                    "configuration key `ingest.pinned[{n}]`: no source named {:?}",
                    inst.exchange
                ))
            })?;
        }
        for (n, p) in self.depth.pinned.iter().enumerate() {
            let inst = parse_instrument_or_series(p)
                .map_err(|e| invalid(format!("configuration key `depth.pinned[{n}]`: {e}")))?;
            self.source(&inst.exchange).ok_or_else(|| {
                invalid(format!(
                    "configuration key `depth.pinned[{n}]`: no source named {:?}",
                    inst.exchange
                ))
            })?;
        }
        for (n, b) in self.backfill.iter().enumerate() {
            let key = format!("backfill[{n}]");
            let series: SeriesId = b
                .series
                .parse()
                .map_err(|e| invalid(format!("configuration key `{key}.series`: {e}")))?;
            if series.timeframe != Timeframe::M1 {
                return Err(invalid(format!("configuration key `{key}.series`: backfill fetches 1m candles (derived timeframes follow); got {}", series.timeframe)));
            }
            if self.source(&series.instrument.exchange).is_none() {
                return Err(invalid(format!(
                    "configuration key `{key}.series`: no source named {:?}",
                    series.instrument.exchange
                )));
            }
            range(&format!("{key}.retention_days"), b.retention_days, 1, 3650)?;
            range(&format!("{key}.batch_limit"), b.batch_limit, 1, 1000)?;
            range(&format!("{key}.max_expired_batches"), b.max_expired_batches, 1, 1000)?;
        }
        Ok(())
    }

    /// The source named `name`.
    pub fn source(&self, name: &str) -> Option<&SourceConfig> {
        self.sources.iter().find(|s| s.name == name)
    }

    /// The SQLite file.
    pub fn db_path(&self) -> PathBuf {
        self.server.data_dir.join("millrace.db")
    }

    /// Where recordings go (`record.dir`, else `{server.data_dir}/recordings`).
    pub fn record_dir(&self) -> PathBuf {
        self.record.dir.clone().unwrap_or_else(|| self.server.data_dir.join("recordings"))
    }

    /// Whether the recorder keeps `source`'s frames.
    pub fn records(&self, source: &str) -> bool {
        self.record.enabled
            && (self.record.sources.is_empty() || self.record.sources.iter().any(|s| s == source))
    }

    /// The backfill tasks with their series (checked by [`Config::validate`]).
    pub fn backfill_tasks(&self) -> Vec<(SeriesId, BackfillTaskConfig)> {
        self.backfill.iter().filter_map(|t| Some((t.series.parse().ok()?, t.clone()))).collect()
    }

    /// The pinned instruments.
    pub fn pinned_instruments(&self) -> Vec<InstrumentId> {
        instruments(&self.ingest.pinned)
    }

    /// The instruments whose depth jobs are pinned.
    pub fn pinned_depth_instruments(&self) -> Vec<InstrumentId> {
        instruments(&self.depth.pinned)
    }
}

fn instruments(list: &[String]) -> Vec<InstrumentId> {
    let mut out: Vec<InstrumentId> =
        list.iter().filter_map(|p| parse_instrument_or_series(p).ok()).collect();
    out.sort_by_key(|i| i.to_string());
    out.dedup();
    out
}

/// An instrument id, or a series id whose instrument is taken.
pub fn parse_instrument_or_series(s: &str) -> Result<InstrumentId, NameError> {
    if let Ok(series) = s.parse::<SeriesId>() {
        return Ok(series.instrument);
    }
    s.parse::<InstrumentId>()
}

/// Applies one environment variable to the raw table, if it is one of ours.
///
/// The name is a path: `MILLRACE_<SECTION>__<KEY>`, `MILLRACE_L3__ENGINE__SHARDS` for a nested
/// table, `MILLRACE_SOURCES` / `MILLRACE_BACKFILL` for a whole list of tables (an inline TOML
/// array). The value's type comes from the key, not from the value: a key that takes a string
/// takes the raw value as it is (`MILLRACE_ADMIN_TOKEN=12345678` is the token `12345678`, and
/// `'"tok"'` keeps its quotes); any other key reads the value as TOML (`50`, `true`, `["a"]`).
fn apply_env(table: &mut toml::Table, name: &str, value: &str) -> Result<(), ConfigError> {
    let short = match name {
        "MILLRACE_ADDR" => Some("server__addr"),
        "MILLRACE_DATA_DIR" => Some("server__data_dir"),
        "MILLRACE_STATIC_DIR" => Some("server__static_dir"),
        "MILLRACE_ADMIN_TOKEN" => Some("server__admin_token"),
        "MILLRACE_SOURCES" => Some("sources"),
        "MILLRACE_BACKFILL" => Some("backfill"),
        _ => None,
    };
    let path: Vec<String> = match short {
        Some(p) => p.split("__").map(str::to_string).collect(),
        None => {
            let Some(rest) = name.strip_prefix("MILLRACE_") else { return Ok(()) };
            if !rest.contains("__") {
                // MILLRACE_CONFIG, MILLRACE_SIM_SPEED (flags' forms) and the tools' own variables.
                return Ok(());
            }
            rest.split("__").map(str::to_ascii_lowercase).collect()
        }
    };
    let env_error = |problem: String| ConfigError::Env { name: name.to_string(), problem };
    if path.iter().any(String::is_empty) {
        return Err(env_error("an empty section or key between `__`".to_string()));
    }
    let sections = env_sections();
    if !sections.iter().any(|s| *s == path[0]) {
        return Err(env_error(format!(
            "`{}` is not a configuration section ({})",
            path[0],
            sections.join(", ")
        )));
    }
    let typed = if takes_string(&path, value) {
        toml::Value::String(value.to_string())
    } else {
        // Not a string key: a TOML value. A value that is not TOML stays a string, so the error
        // names the key and its expected type.
        format!("v = {value}")
            .parse::<toml::Table>()
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(value.to_string()))
    };
    let (key, tables) = path.split_last().expect("the path has a section");
    let mut at = table;
    let mut walked = String::new();
    for part in tables {
        if !walked.is_empty() {
            walked.push('.');
        }
        walked.push_str(part);
        let entry =
            at.entry(part.clone()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let toml::Value::Table(t) = entry else {
            return Err(env_error(format!("configuration key `{walked}` is not a table")));
        };
        at = t;
    }
    at.insert(key.clone(), typed);
    Ok(())
}

/// The top-level keys of the configuration (every section, lists of tables included).
fn env_sections() -> Vec<String> {
    match toml::Value::try_from(Config::default()) {
        Ok(toml::Value::Table(t)) => t.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

/// Whether the key at `path` takes a string: a configuration holding only that key, set to the
/// raw value as a string, deserializes.
fn takes_string(path: &[String], value: &str) -> bool {
    let mut probe = toml::Value::String(value.to_string());
    for part in path.iter().rev() {
        let mut t = toml::Table::new();
        t.insert(part.clone(), probe);
        probe = toml::Value::Table(t);
    }
    Config::deserialize(probe).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let dir = std::env::temp_dir().join(format!(
            "millrace-config-{}-{}",
            std::process::id(),
            text.len()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("millrace.toml");
        std::fs::write(&path, text).unwrap();
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        Config::load(Some(&path), env, &Overrides::default())
    }

    #[test]
    fn no_configuration_is_the_documented_default() {
        let c = Config::load(None, Vec::new(), &Overrides::default()).unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.server.addr.to_string(), "127.0.0.1:8080");
        assert_eq!(
            (c.ingest.batch_max, c.ingest.flush_ms, c.ingest.forming_min_interval_ms),
            (200, 500, 250)
        );
        assert_eq!(c.ingest.reconnect_base_ms, 2000);
        assert_eq!(c.sources[0].kind, SourceKind::Sim);
        assert_eq!(c.backfill[0].max_expired_batches, 3);
    }

    #[test]
    fn a_recording_source_becomes_the_recorded_venue_or_says_what_is_wrong() {
        let rec = std::env::temp_dir().join(format!("millrace-config-rec-{}", std::process::id()));
        let okx = rec.join("okx");
        std::fs::create_dir_all(&okx).unwrap();
        std::fs::write(
            okx.join("source.json"),
            r#"{"format":"millrace-recording","version":1,"source":"okx","dialect":"okx","market":"spot"}"#,
        )
        .unwrap();
        let source = |extra: &str| {
            format!(
                "[[sources]]\nname = \"sim\"\n[[sources]]\nname = \"okx\"\nkind = \"recording\"\ndir = {:?}\n{extra}",
                okx.display().to_string()
            )
        };
        let c = load(&source("from = \"2026-11-28T14:00:00Z\"\nspeed = 0.0\nloop = true\n"), &[])
            .unwrap();
        let s = &c.sources[1];
        assert_eq!((s.kind, s.market), (SourceKind::Okx, Market::Spot));
        let p = s.playback.as_ref().unwrap();
        assert_eq!(p.dialect, shared::venue::Dialect::Okx);
        assert_eq!(
            (p.from_ms, p.to_ms, p.speed, p.looped),
            (Some(1_795_874_400_000), None, None, true)
        );
        assert_eq!(
            load(&source("speed = 2.0\n"), &[]).unwrap().sources[1]
                .playback
                .as_ref()
                .unwrap()
                .speed,
            Some(2.0)
        );
        for (extra, says) in [
            ("from = \"noon\"\n", "sources[1].from"),
            ("from = \"2000\"\nto = \"1000\"\n", "sources[1].to"),
            ("speed = -1.0\n", "sources[1].speed"),
        ] {
            let e = load(&source(extra), &[]).unwrap_err().to_string();
            assert!(e.contains(says), "{extra}: {e}");
        }
        let e = load(
            "[[sources]]\nname = \"sim\"\n[[sources]]\nname = \"r\"\nkind = \"recording\"\n",
            &[],
        )
        .unwrap_err();
        assert!(e.to_string().contains("sources[1].dir"), "{e}");
        let e =
            load("[[sources]]\nname = \"sim\"\n[[sources]]\nname = \"r\"\nkind = \"recording\"\ndir = \"/nonexistent\"\n", &[])
                .unwrap_err();
        assert!(e.to_string().contains("not a recorded source's directory"), "{e}");
        // a Binance-protocol recording (the simulator's own source) plays as a Binance source
        std::fs::write(okx.join("source.json"), r#"{"dialect":"binance","market":"futures"}"#)
            .unwrap();
        let c = load(&source(""), &[]).unwrap();
        assert_eq!(
            (c.sources[1].kind, c.sources[1].market),
            (SourceKind::Binance, Market::Futures)
        );
        let _ = std::fs::remove_dir_all(&rec);
    }

    #[test]
    fn a_venue_serves_spot_and_bybit_its_linear_perpetuals_too() {
        let source = |kind: &str, market: &str| {
            format!(
                "[[sources]]\nname = \"sim\"\nkind = \"sim\"\n\
                 [[sources]]\nname = \"v\"\nkind = \"{kind}\"\nmarket = \"{market}\"\n"
            )
        };
        if let Err(e) = load(&source("bybit", "futures"), &[]) {
            panic!("{e}");
        }
        assert!(load(&source("okx", "spot"), &[]).is_ok());
        for kind in ["okx", "coinbase", "kraken"] {
            let e = load(&source(kind, "futures"), &[]).unwrap_err().to_string();
            assert!(e.contains("`sources[1].market`") && e.contains("spot market only"), "{e}");
        }
        let e = load(&source("bybit", "stock"), &[]).unwrap_err().to_string();
        assert!(e.contains("linear USDT perpetuals"), "{e}");
    }

    #[test]
    fn file_then_env_then_flags() {
        let text = "[ingest]\nondemand_max_jobs = 5\nbatch_max = 50\n[server]\naddr = \"127.0.0.1:9000\"\n";
        let c = load(
            text,
            &[("MILLRACE_INGEST__BATCH_MAX", "70"), ("MILLRACE_ADMIN_TOKEN", "secret-token")],
        )
        .unwrap();
        assert_eq!((c.ingest.ondemand_max_jobs, c.ingest.batch_max), (5, 70));
        assert_eq!(c.server.admin_token.as_deref(), Some("secret-token"));
        let flags = Overrides {
            addr: Some("127.0.0.1:7000".parse().unwrap()),
            sim_speed: Some(60.0),
            ..Default::default()
        };
        let c = Config::load(None, vec![("MILLRACE_ADDR".into(), "127.0.0.1:9999".into())], &flags)
            .unwrap();
        assert_eq!(c.server.addr.to_string(), "127.0.0.1:7000");
        assert_eq!(c.sources[0].speed, 60.0);
    }

    #[test]
    fn environment_values_take_the_type_of_their_key() {
        // A string key takes the raw value: digits stay a token, quotes stay quotes.
        let c = load("", &[("MILLRACE_ADMIN_TOKEN", "12345678")]).unwrap();
        assert_eq!(c.server.admin_token.as_deref(), Some("12345678"));
        let c = load("", &[("MILLRACE_SERVER__ADMIN_TOKEN", "\"tok-tok-tok\"")]).unwrap();
        assert_eq!(c.server.admin_token.as_deref(), Some("\"tok-tok-tok\""));
        let c = load("", &[("MILLRACE_L3__HOST", "true")]).unwrap_err().to_string();
        assert!(c.contains("l3.host"), "a string key given `true` is validated as the string: {c}");
        // Other keys read TOML.
        let c = load("", &[("MILLRACE_INGEST__ONDEMAND_MAX_JOBS", "7")]).unwrap();
        assert_eq!(c.ingest.ondemand_max_jobs, 7);
    }

    #[test]
    fn every_section_is_reachable_from_the_environment() {
        let c = load(
            "",
            &[
                ("MILLRACE_L3__ENGINE__SHARDS", "3"),
                ("MILLRACE_L3__ENGINE__AUTO_BALANCE", "false"),
                ("MILLRACE_L3__SIM_FEEDS", "false"),
                ("MILLRACE_BUS__URL", "nats://127.0.0.1:4222"),
                ("MILLRACE_BUS__PREFIX", "envtest"),
                ("MILLRACE_STORE__KIND", "sqlite"),
                ("MILLRACE_CLUSTER__TICK_MS", "250"),
                ("MILLRACE_SOURCES", "[{ name = \"sim\", kind = \"sim\", speed = 5.0 }]"),
                ("MILLRACE_BACKFILL", "[]"),
            ],
        )
        .unwrap();
        assert_eq!(c.l3.engine.shards, 3);
        assert!(!c.l3.engine.auto_balance);
        assert!(!c.l3.sim_feeds);
        assert_eq!(c.bus.url, "nats://127.0.0.1:4222");
        assert_eq!(c.bus.prefix, "envtest");
        assert_eq!(c.cluster.tick_ms, 250);
        assert_eq!((c.sources.len(), c.sources[0].speed), (1, 5.0));
        assert!(c.backfill.is_empty());
        for (name, value) in [("MILLRACE_CLUSTER__NOPE", "1"), ("MILLRACE_L3__ENGINE__NOPE", "1")] {
            let e = load("", &[(name, value)]).unwrap_err().to_string();
            assert!(e.contains("nope"), "{name}: {e}");
        }
        let e = load("", &[("MILLRACE_INGEST____X", "1")]).unwrap_err().to_string();
        assert!(e.contains("MILLRACE_INGEST____X"), "{e}");
    }

    #[test]
    fn bad_values_name_the_key() {
        let e = load("[ingest]\nbatch_max = 0\n", &[]).unwrap_err().to_string();
        assert!(e.contains("ingest.batch_max"), "{e}");
        let e = load("[ingest]\nbatch_max = \"many\"\n", &[]).unwrap_err().to_string();
        assert!(e.contains("ingest.batch_max"), "{e}");
        let e = load("[ingest]\nbatchmax = 3\n", &[]).unwrap_err().to_string();
        assert!(e.contains("batchmax"), "{e}");
        let e = load("", &[("MILLRACE_INGEST__FLUSH_MS", "soon")]).unwrap_err().to_string();
        assert!(e.contains("ingest.flush_ms"), "{e}");
        let e =
            load("[ingest]\npinned = [\"nowhere:spot:BTC/USDT\"]\n", &[]).unwrap_err().to_string();
        assert!(e.contains("ingest.pinned[0]"), "{e}");
        let e = load("[[sources]]\nname = \"sim\"\nspeed = -1.0\n", &[]).unwrap_err().to_string();
        assert!(e.contains("sources[0].speed"), "{e}");
        let e =
            load("[[backfill]]\nseries = \"sim:spot:BTC/USDT:5m\"\n", &[]).unwrap_err().to_string();
        assert!(e.contains("backfill[0].series"), "{e}");
        let e = load("[ingest]\nderived = [\"7m\"]\n", &[]).unwrap_err().to_string();
        assert!(e.contains("ingest.derived"), "{e}");
        let e = load("[depth]\nsnapshot_limit = 1\n", &[]).unwrap_err().to_string();
        assert!(e.contains("depth.snapshot_limit"), "{e}");
        let e = load("", &[("MILLRACE_DEPTH__PINNED", "[\"nowhere:spot:BTC/USDT\"]")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("depth.pinned[0]"), "{e}");
        let e = load("", &[("MILLRACE_NOPE__X", "1")]).unwrap_err().to_string();
        assert!(e.contains("MILLRACE_NOPE__X"), "{e}");
    }

    #[test]
    fn allowed_hosts_entries_are_checked() {
        let d = Config::default();
        assert_eq!(d.server.allowed_hosts, ["localhost", "127.0.0.1", "[::1]"]);
        for (text, key) in [
            (
                "[server]\nallowed_hosts = [\"localhost\", \"http://x\"]\n",
                "server.allowed_hosts[1]",
            ),
            ("[server]\nallowed_hosts = [\"a:99999\"]\n", "server.allowed_hosts[0]"),
        ] {
            let e = load(text, &[]).unwrap_err().to_string();
            assert!(e.contains(&format!("configuration key `{key}`")), "{text}: {e}");
        }
        let c = load("[server]\nallowed_hosts = [\"*\", \"::1\", \"dash.example:443\"]\n", &[])
            .unwrap();
        assert_eq!(c.server.allowed_hosts.len(), 3);
        let c = load("", &[("MILLRACE_SERVER__ALLOWED_HOSTS", "[\"dash.example\"]")]).unwrap();
        assert_eq!(c.server.allowed_hosts, ["dash.example"]);
    }

    #[test]
    fn the_feed_stale_limit_is_checked() {
        assert_eq!(Config::default().l3.feed_stale_after_ms, 2_000);
        let e = load("[l3]\nfeed_stale_after_ms = 10\n", &[]).unwrap_err().to_string();
        assert!(e.contains("l3.feed_stale_after_ms"), "{e}");
        let c = load("[l3]\nfeed_stale_after_ms = 500\n", &[]).unwrap();
        assert_eq!(c.l3.feed_stale_after_ms, 500);
    }

    /// Errors about a secret-bearing key, or a file that is not TOML, never quote the value.
    #[test]
    fn errors_never_quote_a_secret() {
        let dir =
            std::env::temp_dir().join(format!("millrace-config-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cases = [
            (
                "wrong-type",
                "[server]\nadmin_token = 31415926535\n",
                "31415926535",
                "server.admin_token",
            ),
            ("wrong-type-url", "[store]\nurl = 27182818284\n", "27182818284", "store.url"),
            (
                "not-toml",
                "[bus]\nkind = \"nats\"\nurl = \"nats://u:Unterminated-S3cret@h\n",
                "S3cret",
                "line 3, column 38",
            ),
        ];
        for (name, text, secret, named) in cases {
            let path = dir.join(format!("{name}.toml"));
            std::fs::write(&path, text).unwrap();
            let e = Config::load(Some(&path), Vec::new(), &Overrides::default()).unwrap_err();
            let shown = crate::error::report(&e);
            assert!(!shown.contains(secret), "{name}: {shown}");
            assert!(shown.contains(named), "{name}: {shown}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_body_timeout_and_the_admin_failures_are_checked() {
        let d = Config::default();
        let l = &d.limits;
        assert_eq!((l.body_timeout_ms, l.max_admin_failures_per_min_per_ip), (10_000, 10));
        for (text, key) in [
            ("[limits]\nbody_timeout_ms = 0\n", "limits.body_timeout_ms"),
            ("[limits]\nbody_timeout_ms = 3600001\n", "limits.body_timeout_ms"),
            (
                "[limits]\nmax_admin_failures_per_min_per_ip = 0\n",
                "limits.max_admin_failures_per_min_per_ip",
            ),
        ] {
            let e = load(text, &[]).unwrap_err().to_string();
            assert!(e.contains(&format!("configuration key `{key}`")), "{text}: {e}");
        }
    }
}
