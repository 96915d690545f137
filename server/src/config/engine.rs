//! `[l3.engine]`: the tick-by-tick engine's shards, batches and migration policy. The engine
//! (`l3::engine`) runs with it; it is here so that configuration needs nothing of the engine.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The first bad value of `[l3.engine]`, said in words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadEngineConfig(pub String);

/// Engine configuration; every field has the documented default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// Shards started with the engine (default: the number of available cores).
    pub shards: usize,
    /// Upper bound on shards, counting those created by migrations to a new shard.
    pub max_shards: usize,
    /// How often a shard publishes each changed book.
    pub publish_interval_ms: u64,
    /// Most events in one queue message: bounds how long a shard works before it looks at its
    /// clock and migration flags, and the latency a batch adds.
    pub max_batch: usize,
    /// Emptied batch vectors kept for reuse, across all shards. A burst queued far ahead of the
    /// shards reuses them instead of page-faulting fresh memory for every batch; each one keeps
    /// the capacity it grew to (at most `max_batch` events of 56 bytes), so this bounds the pool
    /// at `recycle_batches * max_batch * 56` bytes (58 MB at the defaults), held after the
    /// burst that filled it. A new batch starts with room for `l3::engine::FIRST_BATCH` events and grows,
    /// so a quiet feed keeps small ones. 0 keeps none.
    pub recycle_batches: usize,
    /// Symbols listed per shard in `top_pending`.
    pub top_n: usize,
    /// Whether the automatic policy starts switched on (it can be toggled at runtime).
    pub auto_balance: bool,
    pub balance: BalanceConfig,
}

impl Default for EngineConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
        Self {
            shards: cores,
            max_shards: cores * 4,
            publish_interval_ms: 100,
            max_batch: 1024,
            recycle_batches: 1024,
            top_n: 5,
            auto_balance: false,
            balance: BalanceConfig::default(),
        }
    }
}

impl EngineConfig {
    /// Names the first bad value.
    pub fn validate(&self) -> Result<(), BadEngineConfig> {
        let bad = |m: &str| Err(BadEngineConfig(m.to_string()));
        if self.shards == 0 {
            return bad("shards must be at least 1");
        }
        if self.max_shards < self.shards {
            return bad("max_shards must be at least shards");
        }
        if self.max_shards > 4096 {
            return bad("max_shards must be at most 4096");
        }
        if self.publish_interval_ms == 0 {
            return bad("publish_interval_ms must be positive");
        }
        if self.max_batch == 0 {
            return bad("max_batch must be positive");
        }
        if self.recycle_batches > 1 << 20 {
            return bad("recycle_batches must be at most 1048576");
        }
        self.balance.validate()
    }

    pub fn publish_interval(&self) -> Duration {
        Duration::from_millis(self.publish_interval_ms)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BalanceConfig {
    /// How often the policy looks at the shards.
    pub interval_ms: u64,
    /// A shard is overloaded at or above either high threshold...
    pub high_pending: u64,
    pub high_lag_ms: u64,
    /// ...and a target must be below both low thresholds.
    pub low_pending: u64,
    pub low_lag_ms: u64,
    /// Consecutive overloaded looks before acting.
    pub looks: u32,
    /// A moved symbol is not moved again for this long.
    pub symbol_cooldown_ms: u64,
    /// A shard that gave or received a symbol is not a source again for this long.
    pub shard_cooldown_ms: u64,
}

impl Default for BalanceConfig {
    fn default() -> Self {
        Self {
            interval_ms: 250,
            high_pending: 200_000,
            high_lag_ms: 250,
            low_pending: 20_000,
            low_lag_ms: 25,
            looks: 3,
            symbol_cooldown_ms: 10_000,
            shard_cooldown_ms: 3_000,
        }
    }
}

impl BalanceConfig {
    pub fn validate(&self) -> Result<(), BadEngineConfig> {
        let bad = |m: &str| Err(BadEngineConfig(format!("balance.{m}")));
        if self.interval_ms == 0 {
            return bad("interval_ms must be positive");
        }
        if self.looks == 0 {
            return bad("looks must be at least 1");
        }
        if self.low_pending > self.high_pending {
            return bad("low_pending must not exceed high_pending");
        }
        if self.low_lag_ms > self.high_lag_ms {
            return bad("low_lag_ms must not exceed high_lag_ms");
        }
        Ok(())
    }
}
