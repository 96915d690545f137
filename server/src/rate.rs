//! The one token bucket of the service: `per_minute` tokens, refilled continuously and exactly
//! (integer units of 1/60,000 token, so a refill never rounds away time however often it is
//! called), bursts up to a minute's allowance. Used for job starts per connection, per address
//! (`http::starts`) and per server (`jobs::admission`). Time is tokio's, so tests can pause it.

use std::time::Duration;

use tokio::time::Instant;

/// Units per token: a bucket of `per_minute` gains `per_minute` units per millisecond.
const UNITS: u64 = 60_000;

#[derive(Debug, Clone, Copy)]
pub struct Bucket {
    per_minute: u32,
    units: u64,
    at: Instant,
}

impl Bucket {
    /// A full bucket (a bucket of 0 a minute never has a token).
    pub fn full(per_minute: u32, now: Instant) -> Self {
        Bucket { per_minute, units: u64::from(per_minute) * UNITS, at: now }
    }

    pub fn per_minute(&self) -> u32 {
        self.per_minute
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_millis();
        let elapsed = u64::try_from(elapsed).unwrap_or(u64::MAX);
        let cap = u64::from(self.per_minute) * UNITS;
        self.units =
            self.units.saturating_add(elapsed.saturating_mul(u64::from(self.per_minute))).min(cap);
        // whole milliseconds only: the rest of one stays for the next refill
        self.at += Duration::from_millis(elapsed);
    }

    /// Whether `n` tokens are there now (without taking them); else how long until they are.
    pub fn check(&mut self, n: u32, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        let need = u64::from(n) * UNITS;
        if self.units >= need {
            return Ok(());
        }
        let per_ms = u64::from(self.per_minute.max(1));
        Err(Duration::from_millis((need - self.units).div_ceil(per_ms)))
    }

    /// Takes `n` tokens (after a successful [`Bucket::check`]).
    pub fn take(&mut self, n: u32) {
        self.units = self.units.saturating_sub(u64::from(n) * UNITS);
    }

    /// Puts back `n` tokens taken for work that did not happen (never above a full bucket).
    pub fn give_back(&mut self, n: u32) {
        let cap = u64::from(self.per_minute) * UNITS;
        self.units = self.units.saturating_add(u64::from(n) * UNITS).min(cap);
    }

    /// Whether the bucket has filled up again (its owner has been idle a minute).
    pub fn is_full(&mut self, now: Instant) -> bool {
        self.refill(now);
        self.units >= u64::from(self.per_minute) * UNITS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_allows_a_minute_at_once_then_refills_exactly() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut b = Bucket::full(6, t0);
        b.check(6, t0).unwrap();
        b.take(6);
        assert_eq!(b.check(1, t0), Err(Duration::from_secs(10)), "one token every 10 s");
        assert_eq!(b.check(1, ms(4_000)), Err(Duration::from_secs(6)));
        // asked every millisecond, the refill still adds up
        for t in 4_001..10_000 {
            assert!(b.check(1, ms(t)).is_err());
        }
        assert_eq!(b.check(1, ms(10_000)), Ok(()));
        assert!(!b.is_full(ms(10_000)));
        assert!(b.is_full(ms(60_000)));
        let mut none = Bucket::full(0, t0);
        assert!(none.check(1, ms(3_600_000)).is_err(), "0 a minute never has a token");
    }
}
