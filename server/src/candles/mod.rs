//! Candles: one 1m stream per instrument in, every derived timeframe out, persisted then
//! published.

pub mod backfill;
pub mod kline_job;
pub mod pipeline;
pub mod writer;
