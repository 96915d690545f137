//! Live ingest: the supervisor (control plane), the candle pipeline, and the kline job that
//! connects an exchange's 1m kline stream to the pipeline (data plane).

pub mod kline_job;
pub mod pipeline;
pub mod supervisor;

pub use supervisor::{JobContext, JobHealth, JobRunner, Lease, SubscribeError, Supervisor};
