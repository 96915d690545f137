//! [`PoisonStats`]: messages read from the bus that did not fit their bounds
//! ([`shared::cluster::bounds`]), counted by kind and logged once per kind.
//!
//! A poison message is never acted on: a JetStream message is terminated (never redelivered),
//! a core NATS message dropped. The first of each kind is logged at `warn` with what it was and
//! why; later ones only count (a flood of forged messages must not flood the log), and each
//! kind's count is `millrace_bus_poison_total{kind}` in `/metrics`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use shared::cluster::bounds::Poison;

/// Counters of refused bus messages, by kind (see the module docs). Shared by every reader of
/// one process.
#[derive(Debug, Default)]
pub struct PoisonStats {
    counts: [AtomicU64; Poison::ALL.len()],
    logged: [AtomicBool; Poison::ALL.len()],
}

impl PoisonStats {
    /// Counts one refused message of `kind`; the first of its kind is logged with `what` (the
    /// subject and the reason).
    pub fn record(&self, kind: Poison, what: impl std::fmt::Display) {
        self.counts[kind.index()].fetch_add(1, Relaxed);
        if !self.logged[kind.index()].swap(true, Relaxed) {
            tracing::warn!(kind = kind.as_str(), "bus: refused a message ({what}); further ones of this kind are counted in millrace_bus_poison_total, not logged");
        } else {
            tracing::debug!(kind = kind.as_str(), "bus: refused a message ({what})");
        }
    }

    /// How many of `kind` were refused.
    pub fn count(&self, kind: Poison) -> u64 {
        self.counts[kind.index()].load(Relaxed)
    }

    /// Every kind with its count (for `/metrics`).
    pub fn counts(&self) -> impl Iterator<Item = (Poison, u64)> + '_ {
        Poison::ALL.iter().map(|&k| (k, self.count(k)))
    }

    /// Every kind refused at least once, with its count (for reports).
    pub fn nonzero(&self) -> std::collections::BTreeMap<String, u64> {
        self.counts().filter(|(_, n)| *n > 0).map(|(k, n)| (k.as_str().to_string(), n)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_is_counted_apart() {
        let p = PoisonStats::default();
        p.record(Poison::TooNew, "a");
        p.record(Poison::TooNew, "b");
        p.record(Poison::ForeignSeries, "c");
        assert_eq!(p.count(Poison::TooNew), 2);
        assert_eq!(p.count(Poison::ForeignSeries), 1);
        assert_eq!(p.count(Poison::Unsigned), 0);
        assert_eq!(p.nonzero().len(), 2);
        assert_eq!(p.counts().count(), Poison::ALL.len());
    }
}
