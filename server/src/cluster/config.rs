//! `[bus]`, `[store]` and `[cluster]`: where messages and history go, and the cluster of
//! seeds/supervisor-worker-load-balancing.md. The defaults are the single process: the
//! in-process bus, SQLite under `server.data_dir`, no cluster.

use serde::{Deserialize, Serialize};
use shared::cluster::assign::AssignConfig;
use shared::cluster::{TaskId, TaskKind};
use shared::protocol::InstrumentId;

/// `[bus] kind`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BusKind {
    /// In this process only (the default).
    Inprocess,
    /// NATS (core NATS for live data, JetStream for what must not be lost).
    Nats,
}

/// `[bus]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BusConfig {
    pub kind: BusKind,
    /// NATS server URL(s), comma-separated (`nats://127.0.0.1:4222`).
    pub url: String,
    /// First token of every subject, stream and bucket name, so several clusters (or test runs)
    /// share one NATS server: letters, digits, `_` and `-`.
    pub prefix: String,
}

impl Default for BusConfig {
    fn default() -> Self {
        BusConfig {
            kind: BusKind::Inprocess,
            url: "nats://127.0.0.1:4222".into(),
            prefix: "millrace".into(),
        }
    }
}

/// `[store] kind`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// One SQLite file under `server.data_dir` (the default).
    Sqlite,
    /// PostgreSQL at `url` (the shared history of a cluster).
    Postgres,
}

/// `[store]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    pub kind: StoreKind,
    /// PostgreSQL URL (`postgres://user:password@host:5432/db`); required with `kind = "postgres"`.
    pub url: Option<String>,
    /// SQLite: check the file's integrity (`PRAGMA quick_check`) before starting, and refuse a
    /// corrupt one. `false` starts on a damaged file (reads and writes that touch the damage
    /// fail, and `/healthz` reports them).
    pub quick_check: bool,
    /// SQLite: page cache of the connection that writes candles, in KiB (64 to 1048576). It
    /// needs each series' newest pages (~8 KiB a series), not the file's history: 1024 suits
    /// ~120 series. Read connections keep their own.
    pub sqlite_writer_cache_kib: u32,
    /// SQLite: read connections at most (1 to 256), each opened when first needed and kept. A
    /// read that finds them all busy waits up to 10 s for one, then fails naming this key.
    pub sqlite_readers: u32,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            kind: StoreKind::Sqlite,
            url: None,
            quick_check: true,
            sqlite_writer_cache_kib: crate::store::sqlite::WRITER_CACHE_KIB,
            sqlite_readers: crate::store::sqlite::READERS as u32,
        }
    }
}

/// `[cluster]`: the seed's timings (its defaults), the redundancy and the task list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// `millrace serve` runs as a gateway of the cluster.
    pub enabled: bool,
    /// This gateway's id in demands and leases [default: gateway-<host>-<pid>].
    pub id: Option<String>,
    pub warmup_s: u64,
    /// The one low-precision timer's period.
    pub tick_ms: u64,
    /// How often workers and gateways publish their status / demand.
    pub status_interval_ms: u64,
    pub worker_timeout_s: u64,
    pub task_timeout_s: u64,
    pub task_query_interval_s: u64,
    /// Distinct workers per task (the seed's 2–3).
    pub redundancy: u32,
    /// Pinned instruments; each becomes one task per kind of `kinds`.
    pub instruments: Vec<InstrumentId>,
    /// The kinds of task of every pinned instrument and pattern match.
    pub kinds: Vec<TaskKind>,
    /// Symbols to add from each source's exchangeInfo at every task query: a glob over
    /// `BASE/QUOTE` (`*` matches any run of characters), e.g. `"*/USDT"`.
    pub symbol_pattern: Option<String>,
    /// Lifetime of the leader lease (JetStream KV entry); a standby takes over after it.
    pub lease_s: u64,
    /// JetStream's duplicate window of the closed-candle stream: a candle sent again within it
    /// (by another replica) is dropped before the persister.
    pub dedup_window_s: u64,
    /// How long closed candles wait in JetStream for a persister before they expire.
    pub queue_max_age_s: u64,
    /// The size of the depth diff stream (memory storage, diffs kept 60 s), in MiB. JetStream
    /// reserves it in the NATS server's memory when the stream is made, for as long as the
    /// stream exists.
    pub depth_stream_mb: u64,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            enabled: false,
            id: None,
            warmup_s: 30,
            tick_ms: 1000,
            status_interval_ms: 1000,
            worker_timeout_s: 30,
            task_timeout_s: 30,
            task_query_interval_s: 1800,
            redundancy: 2,
            instruments: Vec::new(),
            kinds: TaskKind::ALL.to_vec(),
            symbol_pattern: None,
            lease_s: 10,
            dedup_window_s: 600,
            queue_max_age_s: 7 * 86_400,
            depth_stream_mb: 512,
        }
    }
}

impl ClusterConfig {
    /// The supervisor state machine's settings.
    pub fn assign_config(&self) -> AssignConfig {
        AssignConfig {
            tick_ms: self.tick_ms,
            warmup_ms: self.warmup_s * 1000,
            worker_timeout_ms: self.worker_timeout_s * 1000,
            task_timeout_ms: self.task_timeout_s * 1000,
            task_query_interval_ms: self.task_query_interval_s * 1000,
            redundancy: self.redundancy,
        }
    }

    /// How many short statuses (data ages only) a worker sends between two full ones: as many
    /// as keep a full status at least three times in every warm-up — a supervisor that starts
    /// late learns a worker's task list only from a full status — and at most 9.
    pub fn short_statuses(&self) -> u32 {
        let per_warmup = self.warmup_s * 1000 / self.status_interval_ms.max(1);
        u32::try_from((per_warmup / 3).saturating_sub(1)).unwrap_or(u32::MAX).min(9)
    }

    /// The pinned tasks: every instrument × every kind.
    pub fn pinned_tasks(&self) -> Vec<TaskId> {
        self.instruments
            .iter()
            .flat_map(|i| self.kinds.iter().map(|k| TaskId::new(*k, i.clone())))
            .collect()
    }
}

/// Whether `symbol` (`BASE/QUOTE`) matches `pattern`, where `*` matches any run of characters.
pub fn glob_match(pattern: &str, symbol: &str) -> bool {
    let (p, s) = (pattern.as_bytes(), symbol.as_bytes());
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, si));
            pi += 1;
        } else if pi < p.len() && p[pi] == s[si] {
            pi += 1;
            si += 1;
        } else if let Some((sp, ss)) = star {
            pi = sp + 1;
            si = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// A key of `[bus]`, `[store]` or `[cluster]` with a bad value (the service's configuration
/// error names it the same way).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("configuration key `{key}`: {problem}")]
pub struct InvalidKey {
    pub key: String,
    pub problem: String,
}

fn invalid(key: &str, problem: impl Into<String>) -> InvalidKey {
    InvalidKey { key: key.into(), problem: problem.into() }
}

/// A subject token / bucket name: letters, digits, `_`, `-`.
pub fn valid_prefix(prefix: &str) -> bool {
    !prefix.is_empty()
        && prefix.len() <= 64
        && prefix.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Checks `[bus]`, `[store]` and `[cluster]`; the error names the key.
pub fn validate(
    bus: &BusConfig,
    store: &StoreConfig,
    cluster: &ClusterConfig,
) -> Result<(), InvalidKey> {
    if !valid_prefix(&bus.prefix) {
        return Err(invalid(
            "bus.prefix",
            format!("{:?} must be 1 to 64 letters, digits, `_` or `-`", bus.prefix),
        ));
    }
    if bus.kind == BusKind::Nats {
        for url in bus.url.split(',') {
            url.trim().parse::<async_nats::ServerAddr>().map_err(|e| {
                let url = crate::redact::redact(url);
                invalid("bus.url", format!("{url:?} is not a NATS server URL: {e}"))
            })?;
        }
    }
    match (store.kind, &store.url) {
        (StoreKind::Postgres, None) => {
            return Err(invalid("store.url", "is required with store.kind = \"postgres\""));
        }
        (StoreKind::Postgres, Some(url)) => {
            url.parse::<postgres::Config>().map_err(|e| {
                invalid(
                    "store.url",
                    format!("{} is not a PostgreSQL URL: {e}", crate::redact::redact(url)),
                )
            })?;
        }
        (StoreKind::Sqlite, Some(_)) => {
            return Err(invalid("store.url", "is only for store.kind = \"postgres\""));
        }
        (StoreKind::Sqlite, None) => {}
    }
    let c = cluster;
    let range = |key: &str, v: u64, lo: u64, hi: u64| {
        if v < lo || v > hi {
            Err(invalid(key, format!("must be between {lo} and {hi}, got {v}")))
        } else {
            Ok(())
        }
    };
    range("store.sqlite_writer_cache_kib", u64::from(store.sqlite_writer_cache_kib), 64, 1 << 20)?;
    range("store.sqlite_readers", u64::from(store.sqlite_readers), 1, 256)?;
    range("cluster.warmup_s", c.warmup_s, 0, 3600)?;
    range("cluster.tick_ms", c.tick_ms, 10, 60_000)?;
    range("cluster.status_interval_ms", c.status_interval_ms, 10, 60_000)?;
    range("cluster.worker_timeout_s", c.worker_timeout_s, 1, 3600)?;
    range("cluster.task_timeout_s", c.task_timeout_s, 1, 3600)?;
    range("cluster.task_query_interval_s", c.task_query_interval_s, 1, 7 * 86_400)?;
    range("cluster.redundancy", u64::from(c.redundancy), 1, 5)?;
    range("cluster.lease_s", c.lease_s, 1, 3600)?;
    range("cluster.dedup_window_s", c.dedup_window_s, 1, 86_400)?;
    range("cluster.queue_max_age_s", c.queue_max_age_s, 60, 365 * 86_400)?;
    range("cluster.depth_stream_mb", c.depth_stream_mb, 1, 1 << 20)?;
    if c.dedup_window_s > c.queue_max_age_s {
        return Err(invalid("cluster.dedup_window_s", "must not exceed cluster.queue_max_age_s"));
    }
    if c.status_interval_ms >= c.worker_timeout_s * 1000 {
        return Err(invalid(
            "cluster.status_interval_ms",
            "must be shorter than cluster.worker_timeout_s, or every worker times out",
        ));
    }
    if let Some(id) = &c.id {
        if !valid_prefix(id) {
            return Err(invalid(
                "cluster.id",
                format!("{id:?} must be 1 to 64 letters, digits, `_` or `-`"),
            ));
        }
    }
    if c.kinds.is_empty() {
        return Err(invalid("cluster.kinds", "must name at least one of kline, depth"));
    }
    if c.enabled && bus.kind != BusKind::Nats {
        return Err(invalid("bus.kind", "must be \"nats\" with cluster.enabled = true"));
    }
    if c.enabled && store.kind != StoreKind::Postgres {
        return Err(invalid("store.kind", "must be \"postgres\" with cluster.enabled = true"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("*/USDT", "BTC/USDT"));
        assert!(!glob_match("*/USDT", "BTC/USDC"));
        assert!(glob_match("B*/*", "BTC/USDT"));
        assert!(glob_match("*", ""));
        assert!(glob_match("BTC/USDT", "BTC/USDT"));
        assert!(!glob_match("BTC/USD", "BTC/USDT"));
        assert!(glob_match("*T*T", "BTC/USDT"));
    }

    #[test]
    fn a_full_status_comes_three_times_a_warm_up() {
        let c = ClusterConfig::default(); // 30 s warm-up, a status a second
        assert_eq!(c.short_statuses(), 9);
        let c = ClusterConfig { warmup_s: 1, status_interval_ms: 200, ..ClusterConfig::default() };
        assert_eq!(c.short_statuses(), 0, "5 statuses a warm-up: all full");
        let c = ClusterConfig { warmup_s: 12, ..ClusterConfig::default() };
        assert_eq!(c.short_statuses(), 3);
    }

    #[test]
    fn keys_are_named_in_errors() {
        let bus = BusConfig { kind: BusKind::Nats, url: "nats://[bad".into(), prefix: "t".into() };
        let e = validate(&bus, &StoreConfig::default(), &ClusterConfig::default()).unwrap_err();
        assert!(e.to_string().contains("bus.url"), "{e}");
        let bus = BusConfig { prefix: "a.b".into(), ..BusConfig::default() };
        let e = validate(&bus, &StoreConfig::default(), &ClusterConfig::default()).unwrap_err();
        assert!(e.to_string().contains("bus.prefix"), "{e}");
        let store = StoreConfig { kind: StoreKind::Postgres, url: None, ..Default::default() };
        let e = validate(&BusConfig::default(), &store, &ClusterConfig::default()).unwrap_err();
        assert!(e.to_string().contains("store.url"), "{e}");
        for kib in [0, 63, (1 << 20) + 1] {
            let store = StoreConfig { sqlite_writer_cache_kib: kib, ..Default::default() };
            let e = validate(&BusConfig::default(), &store, &ClusterConfig::default()).unwrap_err();
            assert!(e.to_string().contains("store.sqlite_writer_cache_kib"), "{e}");
        }
        for readers in [0, 257] {
            let store = StoreConfig { sqlite_readers: readers, ..Default::default() };
            let e = validate(&BusConfig::default(), &store, &ClusterConfig::default()).unwrap_err();
            assert!(e.to_string().contains("store.sqlite_readers"), "{e}");
        }
        let cluster = ClusterConfig { enabled: true, ..ClusterConfig::default() };
        let e = validate(&BusConfig::default(), &StoreConfig::default(), &cluster).unwrap_err();
        assert!(e.to_string().contains("bus.kind"), "{e}");
        let cluster = ClusterConfig { redundancy: 0, ..ClusterConfig::default() };
        let e = validate(&BusConfig::default(), &StoreConfig::default(), &cluster).unwrap_err();
        assert!(e.to_string().contains("cluster.redundancy"), "{e}");
        assert!(validate(
            &BusConfig::default(),
            &StoreConfig::default(),
            &ClusterConfig::default()
        )
        .is_ok());
    }
}
