//! The automatic migration policy: a pure decision function over [`EngineStats`] snapshots, so
//! it is tested without threads or clocks; [`super::Engine`] runs it on a timer thread.
//!
//! Rule: a shard whose pending or lag stays at or above a high threshold for `looks` consecutive
//! looks, and that has more than one symbol with load (moving its only busy symbol would just
//! move the problem), gives up its hottest symbol (most pending, then highest rate) to the least
//! loaded other shard if that one is below both low thresholds, else to a new shard while
//! `max_shards` allows. Hysteresis: the high and low thresholds differ, the streak restarts after
//! each decision, and a moved symbol, its source and its target shards all cool down before they
//! are considered again, so a symbol is never bounced back and forth.

use std::collections::HashMap;

use serde::Serialize;

use super::{BalanceConfig, SymbolIdx, Target};
use shared::protocol::ops::{EngineStats, ShardStats, SymbolStats};

/// One decision of the policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decision {
    pub symbol: SymbolIdx,
    pub from: u32,
    pub to: Target,
    pub reason: String,
}

/// The policy's memory between looks.
#[derive(Debug, Clone)]
pub struct Balancer {
    cfg: BalanceConfig,
    /// Consecutive overloaded looks, per shard.
    streak: HashMap<u32, u32>,
    symbol_moved_at: HashMap<SymbolIdx, i64>,
    shard_acted_at: HashMap<u32, i64>,
}

impl Balancer {
    pub fn new(cfg: BalanceConfig) -> Self {
        Self {
            cfg,
            streak: HashMap::new(),
            symbol_moved_at: HashMap::new(),
            shard_acted_at: HashMap::new(),
        }
    }

    pub fn config(&self) -> &BalanceConfig {
        &self.cfg
    }

    fn overloaded(&self, s: &ShardStats) -> bool {
        s.pending >= self.cfg.high_pending || s.lag_ms >= self.cfg.high_lag_ms
    }

    fn idle_enough(&self, s: &ShardStats) -> bool {
        s.pending < self.cfg.low_pending && s.lag_ms < self.cfg.low_lag_ms
    }

    /// One look at the engine: at most one migration to start.
    pub fn look(&mut self, stats: &EngineStats, now_ms: i64) -> Option<Decision> {
        for s in &stats.shards {
            let over = self.overloaded(s);
            let e = self.streak.entry(s.id).or_insert(0);
            *e = if over { *e + 1 } else { 0 };
        }
        let shard_cool = |b: &Self, id: u32| {
            b.shard_acted_at.get(&id).is_some_and(|&t| now_ms - t < b.cfg.shard_cooldown_ms as i64)
        };
        let symbol_cool = |b: &Self, id: SymbolIdx| {
            b.symbol_moved_at
                .get(&id)
                .is_some_and(|&t| now_ms - t < b.cfg.symbol_cooldown_ms as i64)
        };
        let mut sources: Vec<&ShardStats> = stats
            .shards
            .iter()
            .filter(|s| {
                self.streak.get(&s.id).copied().unwrap_or(0) >= self.cfg.looks
                    && !shard_cool(self, s.id)
            })
            .collect();
        sources.sort_unstable_by(|a, b| b.pending.cmp(&a.pending).then(b.lag_ms.cmp(&a.lag_ms)));
        for src in sources {
            let loaded: Vec<&SymbolStats> = stats
                .symbols
                .iter()
                .filter(|y| {
                    y.shard == src.id && !y.migrating && (y.pending > 0 || y.processed_per_s > 0)
                })
                .collect();
            if loaded.len() < 2 {
                continue;
            }
            let Some(hot) =
                loaded.iter().filter(|y| !symbol_cool(self, y.symbol)).max_by(|a, b| {
                    a.pending.cmp(&b.pending).then(a.processed_per_s.cmp(&b.processed_per_s))
                })
            else {
                continue;
            };
            let target = stats
                .shards
                .iter()
                .filter(|s| s.id != src.id && self.idle_enough(s))
                .min_by(|a, b| {
                    a.pending.cmp(&b.pending).then(a.lag_ms.cmp(&b.lag_ms)).then(a.id.cmp(&b.id))
                });
            let to = match target {
                Some(t) => Target::Shard(t.id),
                None if stats.shards.len() < stats.max_shards => Target::New,
                None => continue,
            };
            let reason = format!(
                "shard {} overloaded for {} looks (pending {}, lag {} ms); {} has {} pending, {}/s",
                src.id,
                self.streak.get(&src.id).copied().unwrap_or(0),
                src.pending,
                src.lag_ms,
                hot.instrument,
                hot.pending,
                hot.processed_per_s
            );
            self.streak.insert(src.id, 0);
            self.symbol_moved_at.insert(hot.symbol, now_ms);
            self.shard_acted_at.insert(src.id, now_ms);
            // the target (a new shard gets the next id) must not give the symbol straight back
            let t = match to {
                Target::Shard(t) => t,
                Target::New => stats.shards.len() as u32,
            };
            self.shard_acted_at.insert(t, now_ms);
            return Some(Decision { symbol: hot.symbol, from: src.id, to, reason });
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::l3::engine::FeedHealth;
    use shared::l3::Venue;
    use shared::protocol::ops::MigrationStats;

    fn shard(id: u32, pending: u64, lag_ms: u64) -> ShardStats {
        ShardStats {
            id,
            pending,
            queued: pending,
            buffered: 0,
            processed: 0,
            processed_per_s: 0,
            lag_us: lag_ms * 1000,
            lag_ms,
            symbols: 0,
            symbols_with_pending: 0,
            top_pending: Vec::new(),
            misrouted: 0,
            cpu_ms: 0,
            cpu_ns: 0,
        }
    }

    fn symbol(idx: SymbolIdx, shard: u32, pending: u64, rate: u64) -> SymbolStats {
        SymbolStats {
            symbol: idx,
            instrument: shared::protocol::InstrumentId::new(
                "test",
                shared::protocol::Market::Stock,
                idx.to_string(),
            ),
            venue: Venue::Sse,
            shard,
            pending,
            processed: 0,
            not_applied: 0,
            processed_per_s: rate,
            lag_us: 0,
            lag_ms: 0,
            health: FeedHealth::Live,
            gaps: 0,
            resets: 0,
            migrations: 0,
            migrating: false,
            hot: None,
        }
    }

    fn stats(shards: Vec<ShardStats>, symbols: Vec<SymbolStats>, max_shards: usize) -> EngineStats {
        EngineStats {
            uptime_ms: 0,
            auto_balance: true,
            max_shards,
            shards,
            symbols,
            migrations: MigrationStats {
                requested: 0,
                started: 0,
                completed: 0,
                queued: 0,
                rejected: 0,
                in_flight: Vec::new(),
                last_us: 0,
                max_us: 0,
                last_legacy_events: 0,
                legacy_events_total: 0,
            },
            balancer_decisions: 0,
            unknown_symbol_events: 0,
        }
    }

    fn cfg() -> BalanceConfig {
        BalanceConfig {
            interval_ms: 100,
            high_pending: 1_000,
            high_lag_ms: 100,
            low_pending: 100,
            low_lag_ms: 10,
            looks: 3,
            symbol_cooldown_ms: 10_000,
            shard_cooldown_ms: 5_000,
        }
    }

    /// Shard 0 overloaded with a hot and a cold symbol, shard 1 idle.
    fn hot_on_0(max_shards: usize, idle_pending: u64) -> EngineStats {
        stats(
            vec![shard(0, 50_000, 300), shard(1, idle_pending, 0)],
            vec![symbol(0, 0, 49_000, 900_000), symbol(1, 0, 1_000, 500), symbol(2, 1, 0, 10)],
            max_shards,
        )
    }

    #[test]
    fn acts_after_consecutive_looks_on_the_hottest_symbol() {
        let mut b = Balancer::new(cfg());
        let s = hot_on_0(4, 0);
        assert_eq!(b.look(&s, 0), None);
        assert_eq!(b.look(&s, 100), None);
        let d = b.look(&s, 200).unwrap();
        assert_eq!((d.symbol, d.from, d.to), (0, 0, Target::Shard(1)));
        // the streak restarts and the shard cools down
        for t in 3..20 {
            assert_eq!(b.look(&s, t * 100), None, "t {t}");
        }
    }

    #[test]
    fn a_load_drop_breaks_the_streak() {
        let mut b = Balancer::new(cfg());
        let hot = hot_on_0(4, 0);
        let calm = stats(vec![shard(0, 10, 1), shard(1, 0, 0)], hot.symbols.clone(), 4);
        assert_eq!(b.look(&hot, 0), None);
        assert_eq!(b.look(&hot, 100), None);
        assert_eq!(b.look(&calm, 200), None);
        assert_eq!(b.look(&hot, 300), None);
        assert_eq!(b.look(&hot, 400), None);
        assert!(b.look(&hot, 500).is_some());
    }

    #[test]
    fn a_single_busy_symbol_is_not_moved() {
        let mut b = Balancer::new(cfg());
        let s = stats(
            vec![shard(0, 50_000, 300), shard(1, 0, 0)],
            vec![symbol(0, 0, 50_000, 900_000), symbol(1, 0, 0, 0)],
            4,
        );
        for t in 0..10 {
            assert_eq!(b.look(&s, t * 100), None);
        }
    }

    #[test]
    fn no_idle_shard_means_a_new_one_up_to_the_limit() {
        let mut b = Balancer::new(cfg());
        let s = hot_on_0(4, 5_000);
        b.look(&s, 0);
        b.look(&s, 100);
        assert_eq!(b.look(&s, 200).map(|d| d.to), Some(Target::New));
        let mut b = Balancer::new(cfg());
        let s = hot_on_0(2, 5_000);
        for t in 0..10 {
            assert_eq!(b.look(&s, t * 100), None);
        }
    }

    #[test]
    fn cooldowns_prevent_thrashing() {
        let mut b = Balancer::new(cfg());
        let s = hot_on_0(4, 0);
        b.look(&s, 0);
        b.look(&s, 100);
        assert_eq!(b.look(&s, 200).map(|d| d.symbol), Some(0));
        // now symbol 0 is on shard 1, which overloads; shard 0 is idle
        let moved = stats(
            vec![shard(0, 0, 0), shard(1, 50_000, 300)],
            vec![symbol(0, 1, 49_000, 900_000), symbol(1, 0, 0, 500), symbol(2, 1, 1_000, 10)],
            4,
        );
        // shard 1 received a symbol: it cools down as a source; then symbol 0 itself is cooling,
        // so the other busy symbol is the one that may move
        for t in 3..50 {
            assert_eq!(b.look(&moved, t * 100), None, "t {t}");
        }
        let d = b.look(&moved, 5_300).unwrap();
        assert_eq!((d.symbol, d.from, d.to), (2, 1, Target::Shard(0)));
        // after the symbol cool-down the hottest may move again
        let mut b2 = b.clone();
        assert_eq!(b2.look(&moved, 12_000), None);
    }

    #[test]
    fn config_is_validated() {
        assert!(BalanceConfig::default().validate().is_ok());
        assert!(BalanceConfig { looks: 0, ..BalanceConfig::default() }.validate().is_err());
        assert!(BalanceConfig { low_pending: 10, high_pending: 5, ..BalanceConfig::default() }
            .validate()
            .is_err());
    }
}
