//! How many ingest jobs a client may start: per connection and per client IP, a token bucket
//! holding `limits.max_job_starts_per_min_per_connection` (`…_per_ip`) starts, refilled at that
//! many per minute. A subscription that joins a running job (or an always-on book) costs
//! nothing; one that would start a job costs one start, and a request whose starts exceed either
//! bucket is refused whole (`too_many_job_starts`) before any job starts. So subscribe /
//! unsubscribe churn cannot turn into a stream of job starts and evictions (and upstream
//! requests) faster than the limits, from one connection or from many of one address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::lock::lock;

/// Refill period: a bucket's capacity per this long.
const PER: Duration = Duration::from_secs(60);

/// A token bucket of job starts.
#[derive(Debug, Clone, Copy)]
pub struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    pub fn full(capacity: u32) -> Self {
        Self { tokens: f64::from(capacity), at: Instant::now() }
    }

    fn refill(&mut self, capacity: u32, now: Instant) {
        let rate = f64::from(capacity) / PER.as_secs_f64();
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(f64::from(capacity));
        self.at = now;
    }

    fn has(&self, n: usize) -> bool {
        self.tokens >= n as f64
    }

    /// Seconds until `n` tokens are there (for the refusal's message).
    fn wait_for(&self, n: usize, capacity: u32) -> u64 {
        let missing = (n as f64 - self.tokens).max(0.0);
        (missing * PER.as_secs_f64() / f64::from(capacity.max(1))).ceil() as u64
    }
}

/// The per-IP buckets, shared by every session.
pub struct IpStarts {
    capacity: u32,
    buckets: Mutex<HashMap<IpAddr, Bucket>>,
}

/// Why a request's job starts were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TooManyStarts {
    #[error("this connection may start {limit} ingest jobs a minute (subscriptions to streams nobody else follows); try again in {wait_s} s, or subscribe to running ones")]
    Connection { limit: u32, wait_s: u64 },
    #[error("this IP address may start {limit} ingest jobs a minute (subscriptions to streams nobody else follows); try again in {wait_s} s, or subscribe to running ones")]
    Ip { limit: u32, wait_s: u64 },
}

impl IpStarts {
    pub fn new(capacity: u32) -> Self {
        Self { capacity, buckets: Mutex::default() }
    }

    /// Takes `n` starts from `connection` (of capacity `per_connection`) and from `ip`'s bucket,
    /// or from neither.
    pub fn take(
        &self,
        n: usize,
        connection: &mut Bucket,
        per_connection: u32,
        ip: Option<IpAddr>,
    ) -> Result<(), TooManyStarts> {
        let now = Instant::now();
        connection.refill(per_connection, now);
        if !connection.has(n) {
            let wait_s = connection.wait_for(n, per_connection);
            return Err(TooManyStarts::Connection { limit: per_connection, wait_s });
        }
        if let Some(ip) = ip {
            let mut buckets = lock(&self.buckets);
            // Forget addresses whose bucket has filled up again, so the table stays as large as
            // the set of recently active addresses.
            if buckets.len() > 4096 {
                let capacity = self.capacity;
                buckets.retain(|_, b| {
                    b.refill(capacity, now);
                    !b.has(capacity as usize)
                });
            }
            let bucket = buckets.entry(ip).or_insert_with(|| Bucket::full(self.capacity));
            bucket.refill(self.capacity, now);
            if !bucket.has(n) {
                let wait_s = bucket.wait_for(n, self.capacity);
                return Err(TooManyStarts::Ip { limit: self.capacity, wait_s });
            }
            bucket.tokens -= n as f64;
        }
        connection.tokens -= n as f64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn buckets_refill_at_their_rate_and_refuse_whole_requests() {
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let starts = IpStarts::new(5);
        let mut a = Bucket::full(3);
        let mut b = Bucket::full(3);
        starts.take(2, &mut a, 3, Some(ip)).unwrap();
        // Two more from `a` exceed its 3.
        let e = starts.take(2, &mut a, 3, Some(ip)).unwrap_err();
        assert!(matches!(e, TooManyStarts::Connection { limit: 3, wait_s: 20 }), "{e:?}");
        starts.take(1, &mut a, 3, Some(ip)).unwrap();
        // `b` has its own 3, but the address has 2 left of 5.
        starts.take(2, &mut b, 3, Some(ip)).unwrap();
        let e = starts.take(1, &mut b, 3, Some(ip)).unwrap_err();
        assert!(matches!(e, TooManyStarts::Ip { limit: 5, .. }), "{e:?}");
        // Another address is not affected; a minute later all is full again.
        starts.take(1, &mut Bucket::full(3), 3, Some("10.0.0.2".parse().unwrap())).unwrap();
        tokio::time::advance(PER).await;
        starts.take(3, &mut b, 3, Some(ip)).unwrap();
    }
}
