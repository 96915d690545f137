//! How many ingest jobs a client may start: per connection and per client address
//! ([`ClientAddr`]: an IPv4 address, or an IPv6 /64), a token bucket
//! holding `limits.max_job_starts_per_min_per_connection` (`…_per_ip`) starts, refilled at that
//! many per minute. A subscription that joins a running job (or an always-on book) costs
//! nothing; one that would start a job costs one start, and a request whose starts exceed either
//! bucket is refused whole (`too_many_job_starts`) before any job starts. So subscribe /
//! unsubscribe churn cannot turn into a stream of job starts and evictions (and upstream
//! requests) faster than the limits, from one connection or from many of one address.
//! A request refused after its starts were taken (no capacity, an unknown series) gives back
//! the starts of the jobs it did not start ([`IpStarts::give_back`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::client_addr::ClientAddr;
use crate::lock::lock;
pub use crate::rate::Bucket;

/// Whole seconds to wait, for a refusal's message.
fn secs(wait: Duration) -> u64 {
    u64::try_from(wait.as_millis().div_ceil(1000)).unwrap_or(u64::MAX)
}

/// The per-address buckets, shared by every session.
pub struct IpStarts {
    capacity: u32,
    buckets: Mutex<HashMap<ClientAddr, Bucket>>,
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
        ip: Option<ClientAddr>,
    ) -> Result<(), TooManyStarts> {
        let now = Instant::now();
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        connection
            .check(n, now)
            .map_err(|w| TooManyStarts::Connection { limit: per_connection, wait_s: secs(w) })?;
        if let Some(ip) = ip {
            let mut buckets = lock(&self.buckets);
            // Forget addresses whose bucket has filled up again, so the table stays as large as
            // the set of recently active addresses.
            if buckets.len() > 4096 {
                buckets.retain(|_, b| !b.is_full(now));
            }
            let bucket = buckets.entry(ip).or_insert_with(|| Bucket::full(self.capacity, now));
            bucket
                .check(n, now)
                .map_err(|w| TooManyStarts::Ip { limit: self.capacity, wait_s: secs(w) })?;
            bucket.take(n);
        }
        connection.take(n);
        Ok(())
    }

    /// Puts back `n` starts [`IpStarts::take`] took for jobs that did not start (the request
    /// was refused for another reason: capacity, an unknown series), so a client retrying a
    /// refused subscription does not use up its allowance for the ones that will be served.
    pub fn give_back(&self, n: usize, connection: &mut Bucket, ip: Option<ClientAddr>) {
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        connection.give_back(n);
        if let Some(ip) = ip {
            if let Some(bucket) = lock(&self.buckets).get_mut(&ip) {
                bucket.give_back(n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> ClientAddr {
        ClientAddr::of(s.parse().unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn buckets_refill_at_their_rate_and_refuse_whole_requests() {
        let ip = ClientAddr::of("10.0.0.1".parse().unwrap());
        let starts = IpStarts::new(5);
        let mut a = Bucket::full(3, Instant::now());
        let mut b = Bucket::full(3, Instant::now());
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
        starts.take(1, &mut Bucket::full(3, Instant::now()), 3, Some(addr("10.0.0.2"))).unwrap();
        tokio::time::advance(Duration::from_secs(60)).await;
        starts.take(3, &mut b, 3, Some(ip)).unwrap();

        // Starts given back (the jobs did not start) can be taken again, up to a full bucket.
        assert!(starts.take(1, &mut b, 3, Some(ip)).is_err(), "b is empty");
        starts.give_back(2, &mut b, Some(ip));
        starts.take(2, &mut b, 3, Some(ip)).unwrap();
        starts.give_back(100, &mut b, Some(ip));
        assert!(starts.take(4, &mut b, 3, Some(ip)).is_err(), "never above a full bucket");
        starts.take(3, &mut b, 3, Some(ip)).unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn the_addresses_of_one_ipv6_64_share_one_bucket() {
        let starts = IpStarts::new(2);
        // Each take on a fresh connection's bucket: only the address's bucket limits.
        let conn = |_: u8| Bucket::full(10, Instant::now());
        starts.take(1, &mut conn(0), 10, Some(addr("2001:db8:1:2::1"))).unwrap();
        starts.take(1, &mut conn(1), 10, Some(addr("2001:db8:1:2::2"))).unwrap();
        let e = starts.take(1, &mut conn(2), 10, Some(addr("2001:db8:1:2:ffff::3"))).unwrap_err();
        assert!(matches!(e, TooManyStarts::Ip { limit: 2, .. }), "{e:?}");
        // The next /64 is another client; so is an IPv4 client seen as a mapped address.
        starts.take(2, &mut conn(3), 10, Some(addr("2001:db8:1:3::1"))).unwrap();
        starts.take(2, &mut conn(4), 10, Some(addr("::ffff:10.0.0.1"))).unwrap();
        assert!(starts.take(1, &mut conn(5), 10, Some(addr("10.0.0.1"))).is_err(), "the same one");
    }
}
