//! [`LowResTimer`]: the seed's low-precision timer. Deadlines are kept in buckets of one tick;
//! [`LowResTimer::due`] (called once per tick) hands back every key whose bucket has started, so
//! a deadline fires at the first tick at or after it — at most one tick late — and the cost of a
//! tick is the number of keys due, never the number of keys armed.
//!
//! Keys are re-armed lazily: a worker's status does not touch the timer; when its deadline
//! comes, the owner checks the real deadline and arms again if it moved. So steady state costs
//! one check per key per timeout period, not one timer operation per message.

use std::collections::BTreeMap;

/// Keys bucketed by tick. Times are milliseconds.
#[derive(Debug, Clone)]
pub struct LowResTimer<K> {
    tick_ms: u64,
    buckets: BTreeMap<u64, Vec<K>>,
    armed: usize,
}

impl<K> LowResTimer<K> {
    /// A timer of `tick_ms` resolution (at least 1).
    pub fn new(tick_ms: u64) -> Self {
        LowResTimer { tick_ms: tick_ms.max(1), buckets: BTreeMap::new(), armed: 0 }
    }

    pub fn tick_ms(&self) -> u64 {
        self.tick_ms
    }

    /// Arms `key` to come due at `deadline_ms` (rounded down to its tick: the tick that starts
    /// at or before the deadline hands it back, and the owner re-arms if it is early).
    pub fn arm(&mut self, deadline_ms: u64, key: K) {
        self.buckets.entry(deadline_ms / self.tick_ms).or_default().push(key);
        self.armed += 1;
    }

    /// Every key whose bucket started at or before `now_ms`, removed from the timer.
    pub fn due(&mut self, now_ms: u64) -> Vec<K> {
        let now_bucket = now_ms / self.tick_ms;
        let mut out = Vec::new();
        while let Some(entry) = self.buckets.first_entry() {
            if *entry.key() > now_bucket {
                break;
            }
            out.extend(entry.remove());
        }
        self.armed -= out.len();
        out
    }

    /// Keys armed (for tests and the operations view).
    pub fn len(&self) -> usize {
        self.armed
    }

    pub fn is_empty(&self) -> bool {
        self.armed == 0
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;

    #[test]
    fn a_deadline_comes_due_at_the_first_tick_of_its_bucket() {
        let mut t = LowResTimer::new(1000);
        t.arm(2_500, "a");
        t.arm(2_999, "b");
        t.arm(3_000, "c");
        assert!(t.due(1_999).is_empty());
        // the tick at 2 000 ms hands back a and b (their owners see they are early and re-arm)
        assert_eq!(t.due(2_000), vec!["a", "b"]);
        assert_eq!(t.len(), 1);
        assert_eq!(t.due(3_400), vec!["c"]);
        assert!(t.is_empty());
    }
}
