//! `millrace serve` with `[cluster] enabled = true`: a gateway. Browsers see the same API and
//! dashboard as on a single process; what differs is where the data comes from.
//!
//! - **On demand.** A browser's kline subscription takes a lease on its instrument in the
//!   gateway's jobs [`crate::jobs::Supervisor`] exactly as on one process — seed 000's refcount,
//!   idle TTL (the reaper) and capacity rules apply unchanged — but the "job" it starts is a
//!   [`DemandRunner`] session: while it runs, its task is in this gateway's [`Demand`], which
//!   goes to the supervisors at once on every change and every `status_interval_ms`. The leader
//!   assigns it to workers like a pinned task.
//! - **Live data** arrives on the NATS bus: forming candles from the workers (de-duplicated by
//!   the bus), closed candles from the persister after they are stored.
//! - **History** is read from PostgreSQL, where the persister writes.
//! - **The persister** runs in every gateway; one at a time holds its lease and writes
//!   ([`super::candles`]).

use std::collections::BTreeSet;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shared::cluster::{Demand, TaskId, TaskKind};
use shared::protocol::{InstrumentId, SeriesId};
use tokio::sync::Notify;

use super::Subjects;
use crate::clock::wall_clock_ms;
use crate::jobs::supervisor::{JobContext, JobFuture, JobRunner};
use crate::lock::lock;
use crate::shutdown::Shutdown;
use crate::sources::{ResolveError, Sources};

/// The tasks this gateway's browser sessions hold.
#[derive(Debug)]
pub struct DemandSet {
    gateway: String,
    tasks: Mutex<BTreeSet<TaskId>>,
    changed: Notify,
}

impl DemandSet {
    pub fn new(gateway: &str) -> Arc<Self> {
        Arc::new(DemandSet {
            gateway: gateway.to_string(),
            tasks: Mutex::new(BTreeSet::new()),
            changed: Notify::new(),
        })
    }

    /// The message that says it.
    pub fn demand(&self) -> Demand {
        Demand { gateway: self.gateway.clone(), tasks: lock(&self.tasks).iter().cloned().collect() }
    }

    /// Holds `task` in the demand until the returned guard is dropped.
    pub fn hold(self: Arc<Self>, task: TaskId) -> DemandHold {
        if lock(&self.tasks).insert(task.clone()) {
            self.changed.notify_one();
        }
        DemandHold { set: self, task }
    }

    /// Publishes the demand on every change and every `every` until `shutdown`; an empty
    /// demand is published last, so the supervisor drops it without waiting for a timeout.
    pub async fn publish(
        self: Arc<Self>,
        client: async_nats::Client,
        subjects: Subjects,
        every: Duration,
        shutdown: Shutdown,
    ) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let send = |d: Demand| {
            let (client, subject) = (client.clone(), subjects.demand());
            async move {
                let body = serde_json::to_vec(&d).expect("serialisable");
                let _ = client.publish(subject, body.into()).await;
            }
        };
        loop {
            tokio::select! {
                () = self.changed.notified() => {}
                _ = tick.tick() => {}
                () = shutdown.stopping() => break,
            }
            send(self.demand()).await;
        }
        send(Demand { gateway: self.gateway.clone(), tasks: Vec::new() }).await;
        let _ = client.flush().await;
    }
}

/// One task held in a [`DemandSet`]; dropping it takes the task out.
pub struct DemandHold {
    set: Arc<DemandSet>,
    task: TaskId,
}

impl Drop for DemandHold {
    fn drop(&mut self) {
        if lock(&self.set.tasks).remove(&self.task) {
            self.set.changed.notify_one();
        }
    }
}

/// The gateway's "job" of one instrument and kind: it holds the task in the [`DemandSet`]
/// while it runs (see the module docs).
pub struct DemandRunner {
    kind: TaskKind,
    sources: Arc<Sources>,
    demand: Arc<DemandSet>,
}

impl DemandRunner {
    pub fn new(kind: TaskKind, sources: Arc<Sources>, demand: Arc<DemandSet>) -> Self {
        DemandRunner { kind, sources, demand }
    }
}

impl JobRunner for DemandRunner {
    fn validate(&self, series: &SeriesId) -> Result<(), ResolveError> {
        self.sources.validate_series(series)
    }

    fn validate_instrument(&self, instrument: &InstrumentId) -> Result<(), ResolveError> {
        self.sources.resolve(instrument).map(|_| ())
    }

    fn run(&self, ctx: JobContext) -> JobFuture {
        let task = TaskId::new(self.kind, ctx.instrument.clone());
        let demand = self.demand.clone();
        Box::pin(async move {
            let _held = demand.hold(task);
            ctx.health.connected.store(true, Relaxed);
            ctx.health.last_message_at_ms.store(wall_clock_ms(), Relaxed);
            ctx.stopped().await;
            ctx.health.connected.store(false, Relaxed);
        })
    }
}
