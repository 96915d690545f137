//! The simulated exchange (being written).

pub mod clock;
pub mod engine;
pub mod history;
pub mod klines;
pub mod symbols;
