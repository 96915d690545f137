//! Live ingest: the supervisor (control plane), the candle pipeline, the kline job that
//! connects an exchange's 1m kline stream to the pipeline, and the depth job that keeps an
//! exchange order book in sync and publishes it (data plane).

pub mod depth_job;
pub mod kline_job;
pub mod pipeline;
pub mod supervisor;

pub use supervisor::{JobContext, JobHealth, JobRunner, Lease, SubscribeError, Supervisor};
