//! Jobs: the long-lived upstream sessions of the service (a kline job per instrument, a depth job
//! per instrument) and the one [`Supervisor`] that runs every kind of them by seed 000's rules.
//! A job gets a [`JobContext`] (its instrument, its part of the shutdown, its health counters);
//! it waits between retries with the one back-off, `shared::backoff::Backoff`, jittered by a
//! [`crate::jitter::Jitter`].

pub mod admission;
pub mod supervisor;

use std::sync::Arc;
use std::time::Duration;

pub use supervisor::{
    AdminStop, JobContext, JobHealth, JobRunner, Lease, SubscribeError, Supervisor,
};

use crate::sources::{Source, Sources};

/// The source and exchange symbol of a job's instrument, waiting while the source is still
/// loading its symbols (e.g. the exchange is unreachable: the job's health shows why). `None`
/// when the job is stopped meanwhile.
pub async fn resolve_source(sources: &Sources, ctx: &JobContext) -> Option<(Arc<Source>, String)> {
    loop {
        match sources.resolve(&ctx.instrument) {
            Ok(r) => return Some(r),
            Err(e) => {
                ctx.health.error(&e);
                if ctx.sleep(Duration::from_secs(2)).await {
                    return None;
                }
            }
        }
    }
}
