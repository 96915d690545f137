//! # millrace server
//!
//! The imperative shell around `shared`: it owns sockets, clocks, files and tasks, and turns bytes
//! into `shared` inputs. Entry points: [`cli::run`] (the `millrace` binary) and [`http::serve`].

pub mod app;
pub mod backfill;
pub mod binance;
pub mod books;
pub mod bus;
pub mod cli;
pub mod config;
pub mod http;
pub mod ingest;
pub mod l3engine;
pub mod metrics;
pub mod replay;
pub mod sim;
pub mod sources;
pub mod store;
pub mod tbt;

/// Wall-clock milliseconds since the Unix epoch (0 if the clock is before it). The one place the
/// server reads the wall clock as a number; simulated time is `sim::SimClock`.
pub fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// The version string shown by `millrace --version`, `/api/v1/version` and the dashboard.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
