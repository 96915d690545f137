//! The load tools end to end, small: they run, measure and exit cleanly (their full-size figures
//! are in BENCHMARKS.md).

mod depth_load;
mod e2e;
mod fanout;
