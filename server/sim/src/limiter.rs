//! [`RateLimiter`]: Binance's per-IP request weight in fixed windows, with 429s and bans.
//!
//! As on Binance, a window is a span of the wall clock (a minute from :00 to :59.999 by
//! default), not of the time since the simulator started, so a client that keeps its own
//! ledger by the clock's minutes agrees with the simulator on which minute a call falls in.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Per-IP request weight accounting in fixed windows.
pub(crate) struct RateLimiter {
    budget: u64,
    window: Duration,
    ban_after: u32,
    ban_for: Duration,
    /// Per-IP state; a lock because requests run concurrently (held for a few operations).
    ips: Mutex<HashMap<IpAddr, IpState>>,
}

#[derive(Default)]
struct IpState {
    window: u64,
    used: u64,
    violations: u32,
    banned_until: Option<Instant>,
}

/// Why a request was refused by the limiter.
pub(crate) enum Refusal {
    TooMany { used: u64, retry_after: u64 },
    Banned { used: u64, retry_after: u64, until_ms: i64 },
}

impl RateLimiter {
    pub(crate) fn new(
        budget: u64,
        window: Duration,
        ban_after: u32,
        ban_for: Duration,
    ) -> RateLimiter {
        RateLimiter {
            budget,
            window: window.max(Duration::from_millis(1)),
            ban_after,
            ban_for,
            ips: Mutex::new(HashMap::new()),
        }
    }

    /// Charges `weight` to `ip`; the used weight of the window, or why not.
    pub(crate) fn charge(&self, ip: IpAddr, weight: u64) -> Result<u64, Refusal> {
        self.charge_at(ip, weight, crate::clock::wall_clock_ms())
    }

    fn charge_at(&self, ip: IpAddr, weight: u64, now_ms: i64) -> Result<u64, Refusal> {
        let now = Instant::now();
        let window_ms = i64::try_from(self.window.as_millis()).unwrap_or(i64::MAX).max(1);
        let index = now_ms.div_euclid(window_ms);
        let window = index as u64;
        let to_end = index.saturating_add(1).saturating_mul(window_ms).saturating_sub(now_ms);
        let window_end = now + Duration::from_millis(u64::try_from(to_end).unwrap_or(0));
        let secs_to =
            |t: Instant| t.saturating_duration_since(now).as_secs_f64().ceil().max(1.0) as u64;
        let mut ips = self.ips.lock().unwrap_or_else(|e| e.into_inner());
        let st = ips.entry(ip).or_default();
        if st.window != window {
            st.window = window;
            st.used = 0;
            st.violations = 0;
        }
        if let Some(until) = st.banned_until {
            if until > now {
                let until_ms =
                    crate::clock::wall_clock_ms() + until.duration_since(now).as_millis() as i64;
                return Err(Refusal::Banned {
                    used: st.used,
                    retry_after: secs_to(until),
                    until_ms,
                });
            }
            st.banned_until = None;
        }
        st.used += weight;
        if st.used <= self.budget {
            return Ok(st.used);
        }
        st.violations += 1;
        if st.violations > self.ban_after {
            let until = now + self.ban_for;
            st.banned_until = Some(until);
            let until_ms = crate::clock::wall_clock_ms() + self.ban_for.as_millis() as i64;
            return Err(Refusal::Banned { used: st.used, retry_after: secs_to(until), until_ms });
        }
        Err(Refusal::TooMany { used: st.used, retry_after: secs_to(window_end) })
    }

    /// The budget per window.
    pub(crate) fn budget(&self) -> u64 {
        self.budget
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limiter_429_then_418() {
        let l = RateLimiter::new(10, Duration::from_secs(60), 2, Duration::from_secs(120));
        let ip = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
        assert_eq!(l.charge(ip, 5).ok(), Some(5));
        assert_eq!(l.charge(ip, 5).ok(), Some(10));
        assert!(matches!(l.charge(ip, 1), Err(Refusal::TooMany { .. })));
        assert!(matches!(l.charge(ip, 1), Err(Refusal::TooMany { .. })));
        assert!(matches!(l.charge(ip, 1), Err(Refusal::Banned { retry_after: 120, .. })));
        assert!(matches!(l.charge(ip, 1), Err(Refusal::Banned { .. })));
        let other = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));
        assert!(l.charge(other, 1).is_ok());
    }

    #[test]
    fn windows_are_minutes_of_the_wall_clock() {
        let l = RateLimiter::new(10, Duration::from_secs(60), 5, Duration::from_secs(120));
        let ip = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
        let minute = 1_700_000_040_000; // a minute's start on the wall clock
        assert_eq!(l.charge_at(ip, 8, minute - 1).ok(), Some(8));
        assert!(matches!(
            l.charge_at(ip, 8, minute - 1),
            Err(Refusal::TooMany { retry_after: 1, .. })
        ));
        // the window turns with the clock's minute, however long the simulator has run
        assert_eq!(l.charge_at(ip, 8, minute).ok(), Some(8));
        assert_eq!(l.charge_at(ip, 2, minute + 59_999).ok(), Some(10));
    }
}
