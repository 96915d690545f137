//! Live ingest: the supervisor (control plane), the candle pipeline, the kline job that
//! connects an exchange's 1m kline stream to the pipeline, and the depth job that keeps an
//! exchange order book in sync and publishes it (data plane).

pub mod depth_job;
pub mod kline_job;
pub mod pipeline;
pub mod supervisor;

pub use supervisor::{JobContext, JobHealth, JobRunner, Lease, SubscribeError, Supervisor};

/// The source and exchange symbol of a job's instrument, waiting while the source is still
/// loading its symbols (e.g. the exchange is unreachable: the job's health shows why). `None`
/// when the job is stopped meanwhile.
pub async fn resolve_source(
    sources: &crate::sources::Sources,
    ctx: &mut JobContext,
) -> Option<(std::sync::Arc<crate::sources::Source>, String)> {
    loop {
        match sources.resolve(&ctx.instrument) {
            Ok(r) => return Some(r),
            Err(e) => {
                ctx.health.error(e);
                tokio::select! {
                    _ = tokio::time::sleep(std::time::Duration::from_secs(2)) => {}
                    _ = ctx.stopped() => return None,
                }
            }
        }
    }
}
