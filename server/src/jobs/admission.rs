//! Who may start a job, and how often: the defences against subscription churn. Without them,
//! one client subscribing and unsubscribing in a loop started and evicted a job per request
//! (600 in 0.2 s), and every start costs the upstream REST weight (gap fills, snapshots).
//!
//! - a **fair share** of on-demand capacity per client address (`ondemand_max_jobs_per_ip`): one
//!   address holding leases can no longer lock every other client out;
//! - a **job-start rate** for the whole supervisor (`max_job_starts_per_min`), a token bucket:
//!   bursts up to the minute's allowance, refilled continuously. (Per connection and per address,
//!   the `/ws` sessions limit job-starting subscriptions before they reach here:
//!   `http::starts`.)
//!
//! Joining a running job starts nothing and is never limited here. Jobs the service starts itself
//! (pinned, or a cluster worker's instructions) are not counted.

use std::net::IpAddr;

/// A token bucket of `per_minute` tokens, refilled continuously (milli-tokens, integer maths).
#[derive(Debug, Clone)]
struct Bucket {
    per_minute: u32,
    milli: u64,
    at_ms: i64,
}

impl Bucket {
    /// A full bucket.
    fn new(per_minute: u32, now_ms: i64) -> Self {
        Bucket { per_minute, milli: u64::from(per_minute) * 1000, at_ms: now_ms }
    }

    fn refill(&mut self, now_ms: i64) {
        let elapsed = u64::try_from(now_ms.saturating_sub(self.at_ms)).unwrap_or(0);
        let cap = u64::from(self.per_minute) * 1000;
        // per_minute tokens per 60,000 ms = per_minute milli-tokens per 60 ms
        self.milli =
            (self.milli + elapsed.saturating_mul(u64::from(self.per_minute)) / 60).min(cap);
        self.at_ms = self.at_ms.max(now_ms);
    }

    /// Whether a token is there now (without taking it); else the ms until one is.
    fn check(&mut self, now_ms: i64) -> Result<(), u64> {
        if self.per_minute == 0 {
            return Ok(());
        }
        self.refill(now_ms);
        if self.milli >= 1000 {
            return Ok(());
        }
        let missing = 1000 - self.milli;
        Err((missing * 60).div_ceil(u64::from(self.per_minute)))
    }

    /// Takes a token (after a successful [`Bucket::check`]).
    fn take(&mut self) {
        if self.per_minute > 0 {
            self.milli = self.milli.saturating_sub(1000);
        }
    }
}

/// Why a job start was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The address holds its share of on-demand jobs.
    FairShare { max_per_ip: usize },
    /// Too many job starts on the whole server.
    Rate { per_minute: u32, retry_after_ms: u64 },
}

/// The start limits of one supervisor.
#[derive(Debug)]
pub struct Admission {
    max_jobs_per_ip: usize,
    starts: Bucket,
}

impl Admission {
    pub fn new(max_jobs_per_ip: usize, starts_per_minute: u32, now_ms: i64) -> Self {
        Admission { max_jobs_per_ip, starts: Bucket::new(starts_per_minute, now_ms) }
    }

    /// Admits one job start for `owner` (`None`: the service itself, which is not limited
    /// here), which holds `held` on-demand jobs already; takes the start's token.
    pub fn admit(
        &mut self,
        owner: Option<IpAddr>,
        held: usize,
        now_ms: i64,
    ) -> Result<(), Refused> {
        if owner.is_none() {
            return Ok(());
        }
        if self.max_jobs_per_ip > 0 && held >= self.max_jobs_per_ip {
            return Err(Refused::FairShare { max_per_ip: self.max_jobs_per_ip });
        }
        self.starts.check(now_ms).map_err(|retry_after_ms| Refused::Rate {
            per_minute: self.starts.per_minute,
            retry_after_ms,
        })?;
        self.starts.take();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([10, 0, 0, last]))
    }

    #[test]
    fn a_bucket_allows_a_minute_of_starts_at_once_then_refills_continuously() {
        let mut b = Bucket::new(6, 0);
        for _ in 0..6 {
            b.check(0).unwrap();
            b.take();
        }
        assert_eq!(b.check(0), Err(10_000), "one token every 10 s");
        assert_eq!(b.check(4_000), Err(6_000));
        assert_eq!(b.check(10_000), Ok(()));
        let mut unlimited = Bucket::new(0, 0);
        for _ in 0..1000 {
            unlimited.check(0).unwrap();
            unlimited.take();
        }
    }

    #[test]
    fn an_address_gets_its_share_and_the_server_rate_bounds_all_together() {
        let mut a = Admission::new(2, 4, 0);
        assert_eq!(a.admit(ip(1), 2, 0), Err(Refused::FairShare { max_per_ip: 2 }));
        for n in 0..4 {
            a.admit(ip(n), 1, 0).unwrap();
        }
        assert_eq!(
            a.admit(ip(9), 0, 0),
            Err(Refused::Rate { per_minute: 4, retry_after_ms: 15_000 })
        );
        // the service's own starts are not limited here
        a.admit(None, 99, 0).unwrap();
        // a refused start spent nothing: one token 15 s later
        a.admit(ip(9), 0, 15_000).unwrap();
        assert!(a.admit(ip(9), 0, 15_000).is_err());
    }
}
