//! The one place the service reads the wall clock as a number. Simulated time is the simulator's
//! (`sim::SimClock`); the market logic in `shared` never reads a clock at all.

/// Wall-clock milliseconds since the Unix epoch (0 if the clock is before it).
pub fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Wall-clock nanoseconds since the Unix epoch (0 if the clock is before it): a recording's
/// receive times.
pub fn wall_clock_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// Both clocks read once, by the shell, and passed down as an input: the wall clock (candle
/// batching, in ms since the Unix epoch) and the monotonic one (throttles and retry times), so
/// everything one call decides agrees on the time and a test can give it any time it likes.
#[derive(Debug, Clone, Copy)]
pub struct Now {
    pub ms: i64,
    pub at: std::time::Instant,
}

impl Now {
    /// The clocks now.
    pub fn read() -> Now {
        Now { ms: wall_clock_ms(), at: std::time::Instant::now() }
    }
}
