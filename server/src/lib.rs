//! # millrace server
//!
//! The imperative shell around `shared`: it owns sockets, clocks, files and tasks, and turns bytes
//! into `shared` inputs. Entry points: [`cli::run`] (the `millrace` binary) and [`http::serve`].

pub mod app;
pub mod backfill;
pub mod binance;
pub mod bus;
pub mod cli;
pub mod config;
pub mod http;
pub mod ingest;
pub mod metrics;
pub mod replay;
pub mod sim;
pub mod sources;
pub mod store;

/// The version string shown by `millrace --version`, `/api/v1/version` and the dashboard.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
