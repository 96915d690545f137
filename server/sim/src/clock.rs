//! Simulated time.

use std::time::Duration;

use tokio::time::Instant;

/// Simulated time: a start time plus the real time elapsed since, times `speed`.
///
/// Every event and kline time the simulator publishes is simulated milliseconds; stream cadence
/// (depth every 100 ms, kline updates every ~250 ms) is real time. At `speed` 60 one simulated
/// minute passes per real second; at 1 simulated time is wall-clock time when the start time is
/// the wall clock's now.
#[derive(Debug, Clone, Copy)]
pub struct SimClock {
    origin: Instant,
    start_ms: i64,
    speed: f64,
}

impl SimClock {
    /// A clock reading `start_ms` now and running `speed` times faster than real time.
    /// A non-finite or negative speed is treated as 0 (stopped).
    pub fn new(start_ms: i64, speed: f64) -> Self {
        let speed = if speed.is_finite() && speed > 0.0 { speed } else { 0.0 };
        SimClock { origin: Instant::now(), start_ms, speed }
    }

    /// The simulated time at which the clock started, ms since the Unix epoch.
    pub fn start_ms(&self) -> i64 {
        self.start_ms
    }

    /// Simulated milliseconds per real millisecond.
    pub fn speed(&self) -> f64 {
        self.speed
    }

    /// Now, in simulated ms since the Unix epoch.
    pub fn now_ms(&self) -> i64 {
        self.at(Instant::now())
    }

    /// The simulated time at real instant `t`.
    pub fn at(&self, t: Instant) -> i64 {
        let real_ms = t.saturating_duration_since(self.origin).as_secs_f64() * 1000.0;
        self.start_ms + (real_ms * self.speed) as i64
    }

    /// Real time until the simulated clock reads `sim_ms` (zero if it already has; `None` if
    /// the clock is stopped).
    pub fn real_until(&self, sim_ms: i64) -> Option<Duration> {
        if self.speed == 0.0 {
            return None;
        }
        let ahead = (sim_ms - self.now_ms()).max(0) as f64 / self.speed;
        Some(Duration::from_secs_f64(ahead / 1000.0))
    }
}

/// Real wall-clock time, ms since the Unix epoch (0 if the clock is before it): where a
/// simulation starts by default, and the base of ban expiry times.
pub fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_at_speed() {
        let c = SimClock::new(1_000, 600.0);
        std::thread::sleep(Duration::from_millis(20));
        let now = c.now_ms();
        assert!(now >= 1_000 + 12_000, "{now}");
        assert!(c.real_until(now + 60_000).unwrap() <= Duration::from_millis(101));
        let stopped = SimClock::new(5, f64::NAN);
        assert_eq!(stopped.now_ms(), 5);
        assert_eq!(stopped.real_until(6), None);
    }
}
