//! # millrace server
//!
//! The imperative shell around `shared`: it owns sockets, clocks, files and tasks, and turns bytes
//! into `shared` inputs. Entry points: [`cli::run`] (the `millrace` binary) and [`http::serve`].

pub mod app;
pub mod books;
pub mod bus;
pub mod candles;
pub mod cli;
pub mod client_addr;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod error;
pub mod export;
pub mod http;
pub mod jitter;
pub mod jobs;
pub mod l3;
pub mod lock;
pub mod malloc;
pub mod metrics;
pub mod playback;
pub mod rate;
pub mod recorded;
pub mod recording;
pub mod redact;
pub mod shutdown;
pub mod sources;
pub mod store;
pub mod telemetry;
pub mod trades;
pub mod venue;

/// The version string shown by `millrace --version`, `/api/v1/version` and the dashboard.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
