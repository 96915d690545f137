//! Who may start a job, and how often: the defences against subscription churn. Without them,
//! one client subscribing and unsubscribing in a loop started and evicted a job per request
//! (600 in 0.2 s), and every start costs the upstream REST weight (gap fills, snapshots).
//!
//! - a **fair share** of on-demand capacity per client address (`ondemand_max_jobs_per_ip`; an
//!   IPv6 client counts by its /64, [`ClientAddr`]): one
//!   address holding leases can no longer lock every other client out;
//! - a **job-start rate** for the whole supervisor (`max_job_starts_per_min`), a token bucket:
//!   bursts up to the minute's allowance, refilled continuously. (Per connection and per address,
//!   the `/ws` sessions limit job-starting subscriptions before they reach here:
//!   `http::starts`.)
//!
//! Joining a running job starts nothing and is never limited here. Jobs the service starts itself
//! (pinned, or a cluster worker's instructions) are not counted.

use tokio::time::Instant;

use crate::client_addr::ClientAddr;
use crate::rate::Bucket;

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
    /// `None`: no server-wide start rate (`max_job_starts_per_min = 0`).
    starts: Option<Bucket>,
}

impl Admission {
    pub fn new(max_jobs_per_ip: usize, starts_per_minute: u32, now: Instant) -> Self {
        let starts = (starts_per_minute > 0).then(|| Bucket::full(starts_per_minute, now));
        Admission { max_jobs_per_ip, starts }
    }

    /// Admits one job start for `owner` (`None`: the service itself, which is not limited
    /// here), which holds `held` on-demand jobs already; takes the start's token.
    pub fn admit(
        &mut self,
        owner: Option<ClientAddr>,
        held: usize,
        now: Instant,
    ) -> Result<(), Refused> {
        if owner.is_none() {
            return Ok(());
        }
        if self.max_jobs_per_ip > 0 && held >= self.max_jobs_per_ip {
            return Err(Refused::FairShare { max_per_ip: self.max_jobs_per_ip });
        }
        if let Some(starts) = &mut self.starts {
            starts.check(1, now).map_err(|wait| Refused::Rate {
                per_minute: starts.per_minute(),
                retry_after_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
            })?;
            starts.take(1);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn ip(last: u8) -> Option<ClientAddr> {
        Some(ClientAddr::of(std::net::IpAddr::from([10, 0, 0, last])))
    }

    #[test]
    fn an_address_gets_its_share_and_the_server_rate_bounds_all_together() {
        let t0 = Instant::now();
        let mut a = Admission::new(2, 4, t0);
        assert_eq!(a.admit(ip(1), 2, t0), Err(Refused::FairShare { max_per_ip: 2 }));
        for n in 0..4 {
            a.admit(ip(n), 1, t0).unwrap();
        }
        assert_eq!(
            a.admit(ip(9), 0, t0),
            Err(Refused::Rate { per_minute: 4, retry_after_ms: 15_000 })
        );
        // the service's own starts are not limited here
        a.admit(None, 99, t0).unwrap();
        // a refused start spent nothing: one token 15 s later
        let later = t0 + Duration::from_secs(15);
        a.admit(ip(9), 0, later).unwrap();
        assert!(a.admit(ip(9), 0, later).is_err());
        // 0 a minute: no server-wide rate
        let mut unlimited = Admission::new(0, 0, t0);
        for n in 0..200 {
            unlimited.admit(ip(n), 0, t0).unwrap();
        }
    }
}
