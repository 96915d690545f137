//! The one place the service reads the wall clock as a number. Simulated time is the simulator's
//! (`sim::SimClock`); the market logic in `shared` never reads a clock at all.

/// Wall-clock milliseconds since the Unix epoch (0 if the clock is before it).
pub fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
