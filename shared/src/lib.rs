//! # millrace shared core
//!
//! The market logic that runs both in the server (native) and in the browser (wasm32): fixed-point
//! numbers, candles, trades, L2 and L3 order books, the book sync state machine and the browser
//! wire protocol.
//!
//! This crate is **sans-IO**: it never opens a socket, never spawns a thread and never reads a
//! clock. Time arrives as an argument (`now_ms`), inputs go in through `handle_*` methods and
//! outputs come out of `poll_*` methods, so the same types are driven by tokio in the server, by
//! the browser's event loop in the client, and by recorded files in tests.

pub mod backoff;
pub mod book;
pub mod candle;
pub mod chart;
pub mod cluster;
pub mod fixed;
pub mod l3;
pub mod ladder;
pub mod protocol;
pub mod publish;
pub mod sync;
pub mod testkit;
pub mod trade;
pub mod venue;

pub use book::{Level, LevelUpdate, OrderBook, Side};
pub use fixed::{ParseDecimalError, Price, Qty, Volume};
