//! [`Backoff`]: the one retry schedule of millrace, on both sides of the wire.
//!
//! The server waits with it between upstream reconnects, crash restarts of jobs, REST retries
//! (gap fills, snapshots, backfill pages, symbol lists); the dashboard between reconnects of its
//! feed and retries of a book's snapshot. It is pure: the caller supplies one random `u32` per
//! delay (the jitter) and does the waiting, so it runs unchanged in the browser, on tokio, and in
//! tests with chosen randomness.

use core::time::Duration;

/// Retry delays: `base` doubling per failed attempt up to `cap`, each multiplied by a random
/// factor in `[1 − jitter, 1 + jitter]` and then clamped to `cap`; back to `base` once an attempt
/// has stayed healthy for `healthy_after` (see [`Backoff::connection_ended`]) or after
/// [`Backoff::reset`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    /// First delay. Default 2 s.
    pub base: Duration,
    /// Largest delay. Default 60 s.
    pub cap: Duration,
    /// Jitter in thousandths: 200 = ±20 %, 0 = none. Default 200.
    pub jitter_permille: u32,
    /// A connection that lasted this long resets the sequence. Default 60 s.
    pub healthy_after: Duration,
    /// Failed attempts since the last reset.
    attempt: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new(Duration::from_secs(2), Duration::from_secs(60))
    }
}

impl Backoff {
    /// `base` doubling to `cap`, ±20 % jitter, reset after 60 s healthy.
    pub fn new(base: Duration, cap: Duration) -> Self {
        Backoff {
            base,
            cap,
            jitter_permille: 200,
            healthy_after: Duration::from_secs(60),
            attempt: 0,
        }
    }

    /// The same schedule with another jitter (thousandths; 0 = exact doubling).
    pub fn with_jitter(mut self, permille: u32) -> Self {
        self.jitter_permille = permille;
        self
    }

    /// The same schedule, reset by a connection that lasted `healthy_after`.
    pub fn with_healthy_after(mut self, healthy_after: Duration) -> Self {
        self.healthy_after = healthy_after;
        self
    }

    /// The delay before the next attempt; counts the attempt. `random` is the jitter: 0 gives
    /// the smallest factor, `u32::MAX` the largest, `1 << 31` none.
    pub fn next_delay(&mut self, random: u32) -> Duration {
        let base = self.base.as_millis();
        let cap = self.cap.as_millis();
        let exp = base.saturating_mul(1u128 << self.attempt.min(64)).min(cap);
        let j = u64::from(self.jitter_permille.min(1000));
        // r in [0, 2j], uniformly from one u32
        let r = (u64::from(random) * (2 * j + 1)) >> 32;
        let factor = u128::from(1000 - j + r);
        let ms = (exp * factor / 1000).min(cap);
        self.attempt = self.attempt.saturating_add(1);
        Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
    }

    /// Reports how long the last connection lasted; a healthy one resets the sequence.
    pub fn connection_ended(&mut self, lasted: Duration) {
        if lasted >= self.healthy_after {
            self.reset();
        }
    }

    /// Back to the first delay.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    /// Failed attempts since the last reset.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::Rng;

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    const MID: u32 = 1 << 31;

    #[test]
    fn doubles_to_the_cap_without_jitter_at_the_midpoint() {
        let mut b = Backoff::default();
        let delays: Vec<_> = (0..8).map(|_| b.next_delay(MID)).collect();
        assert_eq!(delays, [2000, 4000, 8000, 16000, 32000, 60000, 60000, 60000].map(ms));
        assert_eq!(b.attempt(), 8);
        let mut exact = Backoff::new(ms(500), ms(10_000)).with_jitter(0);
        let delays: Vec<_> = (0..7).map(|i| exact.next_delay(i * 0x2000_0000)).collect();
        assert_eq!(delays, [500, 1000, 2000, 4000, 8000, 10_000, 10_000].map(ms));
    }

    #[test]
    fn jitter_bounds_and_cap_is_hard() {
        let mut b = Backoff::default();
        assert_eq!(b.next_delay(0), ms(1600));
        assert_eq!(b.next_delay(u32::MAX), ms(4800));
        for _ in 0..10 {
            b.next_delay(0);
        }
        assert_eq!(b.next_delay(0), ms(48000), "-20% of the cap");
        assert_eq!(b.next_delay(u32::MAX), ms(60000), "never above the cap");
        // a seeded generator: deterministic, always within the bounds
        let run = |seed| {
            let mut rng = Rng::new(seed);
            let mut b = Backoff::default();
            (0..20).map(|_| b.next_delay(rng.next_u64() as u32)).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        for (i, d) in run(7).into_iter().enumerate() {
            let exp = (2000u64 << i.min(20)).min(60000);
            assert!(d >= ms(exp * 8 / 10) && d <= ms((exp * 12 / 10).min(60000)), "{i}: {d:?}");
        }
    }

    #[test]
    fn resets_after_a_healthy_connection_only() {
        let mut b = Backoff::default();
        b.next_delay(MID);
        b.next_delay(MID);
        b.connection_ended(Duration::from_secs(5));
        assert_eq!(b.next_delay(MID), ms(8000), "a short connection does not reset");
        b.connection_ended(Duration::from_secs(60));
        assert_eq!(b.next_delay(MID), ms(2000));
        b.next_delay(MID);
        b.reset();
        assert_eq!(b.next_delay(MID), ms(2000));
        // huge attempt counts never overflow
        let mut b = Backoff::new(Duration::from_secs(u64::MAX / 1000), Duration::MAX);
        for _ in 0..200 {
            b.next_delay(MID);
        }
    }
}
