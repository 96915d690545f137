//! Replay tools: recorded exchange data through the same `shared` logic the live server runs.
//!
//! Each tool reads files (plain, `.gz`, or `.zip`), prints one result per symbol, and reports
//! whether every check passed; bad input is an error naming the file and line.

pub mod depth;
pub mod input;
pub mod klines;
pub mod lobster;
pub mod recording;
pub mod sse;
pub mod venue;
