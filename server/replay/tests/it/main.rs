//! The replay tools on recorded data: every fact `testdata/README.md` states about the real
//! captures, kline archives and Shanghai day, reproduced through the same `shared` code the live
//! service runs; and LOBSTER's own output on hand-made fixtures (`tests/fixtures/lobster`).

mod depth;
mod klines;
mod lobster;
mod sse;
mod venue;
