//! `millrace supervisor`: the shell of [`shared::cluster::assign::Assigner`] on NATS.
//!
//! One task owns the state machine and waits on four things: a worker status, a gateway
//! demand, a report request, the answer of a task query, and the one timer (`tick_ms`). Each
//! tick it also keeps the leader lease (module docs of [`crate::cluster`]). Between events
//! nothing runs: at steady state the work is one status parse per worker per
//! `status_interval_ms`, one lease renewal and one timer check per tick.
//!
//! The task query runs on its own task (it may call the sources' exchangeInfo): the pinned
//! instruments × kinds, plus every symbol of every source matching `symbol_pattern`.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use shared::cluster::assign::{Assigner, Output};
use shared::cluster::bounds::{Poison, MAX_GATEWAYS, MAX_WORKERS};
use shared::cluster::{Demand, TaskId, WorkerStatus};
use shared::protocol::ops::ReportQuery;
use tokio::sync::mpsc;

use super::lease::RoleLease;
use super::Subjects;
use crate::bus::PoisonStats;
use crate::config::cluster::glob_match;
use crate::config::ClusterConfig;
use crate::shutdown::Shutdown;
use crate::sources::{ResolveError, Sources};

/// The key of the leader lease in the lease bucket.
pub const LEADER_KEY: &str = "leader";

/// Counters of the shell (the state machine counts its own handler invocations).
#[derive(Debug, Default)]
pub struct ShellStats {
    /// Messages that were not valid JSON of their subject's type.
    pub malformed: AtomicU64,
    /// Lease operations that failed (NATS down): the supervisor stands by meanwhile.
    pub lease_errors: AtomicU64,
    /// Instruction sets that could not be published.
    pub publish_errors: AtomicU64,
}

/// Why the supervisor stopped.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error("cannot create the lease bucket {bucket} in JetStream")]
    Bucket {
        bucket: String,
        #[source]
        source: async_nats::Error,
    },
    #[error("cannot subscribe to {subject}")]
    Subscribe {
        subject: String,
        #[source]
        source: async_nats::SubscribeError,
    },
}

/// The pinned tasks and the pattern's matches over `sources` (as the sources list them now).
pub fn query_tasks(cluster: &ClusterConfig, sources: Option<&Sources>) -> Vec<TaskId> {
    let mut tasks = cluster.pinned_tasks();
    if let (Some(pattern), Some(sources)) = (&cluster.symbol_pattern, sources) {
        for info in sources.instruments() {
            if glob_match(pattern, &info.id.symbol) {
                for kind in &cluster.kinds {
                    tasks.push(TaskId::new(*kind, info.id.clone()));
                }
            }
        }
    }
    tasks.sort();
    tasks.dedup();
    tasks
}

/// A status's bounds ([`WorkerStatus::check`]), and room for it if it is a new worker's.
fn check_status(st: &WorkerStatus, assigner: &Assigner) -> Result<(), Poison> {
    st.check()?;
    if !assigner.knows_worker(&st.worker) && assigner.worker_count() >= MAX_WORKERS {
        return Err(Poison::Status);
    }
    Ok(())
}

/// A demand's bounds ([`Demand::check`]), room for it if it is a new gateway's, and its tasks
/// of instruments the sources list (those they do not are dropped and counted; while a
/// source's list is not loaded its tasks are kept). Returns the demand to apply and how many
/// tasks were dropped.
fn check_demand(
    mut d: Demand,
    assigner: &Assigner,
    sources: Option<&Sources>,
) -> Result<(Demand, usize), Poison> {
    d.check()?;
    if !assigner.knows_gateway(&d.gateway) && assigner.gateway_count() >= MAX_GATEWAYS {
        return Err(Poison::Demand);
    }
    let before = d.tasks.len();
    if let Some(sources) = sources {
        d.tasks.retain(|t| match sources.validate_instrument(&t.instrument) {
            Ok(_) | Err(ResolveError::NotReady { .. }) => true,
            Err(_) => false,
        });
    }
    let foreign = before - d.tasks.len();
    Ok((d, foreign))
}

/// Runs the supervisor `id` until `shutdown`.
pub async fn run(
    client: async_nats::Client,
    subjects: Subjects,
    cluster: ClusterConfig,
    sources: Option<Arc<Sources>>,
    id: String,
    shutdown: Shutdown,
) -> Result<(), SupervisorError> {
    let js = async_nats::jetstream::new(client.clone());
    let bucket = subjects.lease_bucket();
    let kv = super::kv_bucket(&js, &bucket, Duration::from_secs(cluster.lease_s))
        .await
        .map_err(|source| SupervisorError::Bucket { bucket, source })?;
    let mut lease = RoleLease::new(kv, LEADER_KEY, &id);
    let subscribe = |subject: String| {
        let client = client.clone();
        async move {
            client
                .subscribe(subject.clone())
                .await
                .map_err(|source| SupervisorError::Subscribe { subject, source })
        }
    };
    let mut status = subscribe(subjects.status()).await?;
    let mut demand = subscribe(subjects.demand()).await?;
    let mut report = subscribe(subjects.report()).await?;
    let stats = ShellStats::default();
    let poison = PoisonStats::default();
    // What each worker's last full status said it refused (for the report).
    let mut refused_by: std::collections::BTreeMap<
        String,
        std::collections::BTreeMap<String, u64>,
    > = std::collections::BTreeMap::new();
    let t0 = Instant::now();
    let now = || t0.elapsed().as_millis() as u64;
    let mut assigner = Assigner::new(cluster.assign_config(), id.clone(), now());
    let (query_tx, mut query_rx) = mpsc::channel::<(Vec<TaskId>, bool)>(4);
    let mut tick = tokio::time::interval(Duration::from_millis(cluster.tick_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tracing::info!(%id, prefix = %subjects.prefix, "supervisor started, standing by");
    loop {
        tokio::select! {
            Some(m) = status.next() => match serde_json::from_slice::<WorkerStatus>(&m.payload) {
                Ok(st) => match check_status(&st, &assigner) {
                    Ok(()) => {
                        if st.ages.is_none() {
                            refused_by.insert(st.worker.clone(), st.refused.clone());
                        }
                        assigner.handle_status(now(), &st);
                    }
                    Err(kind) => poison.record(kind, format_args!("{}: a status of {:?}", m.subject, st.worker)),
                },
                Err(_) => {
                    stats.malformed.fetch_add(1, Relaxed);
                    poison.record(Poison::Unparsable, format_args!("{}: not a worker status", m.subject));
                }
            },
            Some(m) = demand.next() => match serde_json::from_slice::<Demand>(&m.payload) {
                Ok(d) => match check_demand(d, &assigner, sources.as_deref()) {
                    Ok((d, foreign)) => {
                        if foreign > 0 {
                            poison.record(Poison::ForeignSeries, format_args!("{}: {foreign} tasks of {:?} the sources do not list", m.subject, d.gateway));
                        }
                        assigner.handle_demand(now(), &d.gateway, &d.tasks);
                    }
                    Err(kind) => poison.record(kind, format_args!("{}: a demand refused", m.subject)),
                },
                Err(_) => {
                    stats.malformed.fetch_add(1, Relaxed);
                    poison.record(Poison::Unparsable, format_args!("{}: not a demand", m.subject));
                }
            },
            Some(m) = report.next() => {
                if let (true, Some(reply)) = (assigner.is_leader(), m.reply) {
                    let q: ReportQuery = serde_json::from_slice(&m.payload).unwrap_or_default();
                    let mut report = assigner.report(now(), q.max_tasks);
                    report.supervisor.refused = poison.nonzero();
                    for w in &mut report.workers {
                        if let Some(r) = refused_by.get(&w.id) {
                            w.refused = r.clone();
                        }
                    }
                    refused_by.retain(|id, _| assigner.knows_worker(id));
                    let body = serde_json::to_vec(&report).expect("serialisable");
                    let _ = client.publish(reply, body.into()).await;
                }
            }
            Some((tasks, reset)) = query_rx.recv() => {
                // (wall clock: `millrace-cluster-load` times a full assignment from here to the
                // last worker's instruction set applied)
                let received_ms = crate::clock::wall_clock_ms();
                let started = Instant::now();
                assigner.handle_task_list(now(), &tasks, reset);
                tracing::info!(tasks = tasks.len(), reset, received_ms,
                    decided_us = started.elapsed().as_micros() as u64, "task list");
            }
            _ = tick.tick() => {
                match lease.keep(&stats.lease_errors).await {
                    Ok(Some(epoch)) => {
                        tracing::info!(%id, epoch, "leading");
                        assigner.set_leader(now(), epoch);
                    }
                    Ok(None) => {
                        if !assigner.is_leader() {
                            assigner.set_leader_id(lease.holder().await);
                        }
                    }
                    Err(()) => assigner.resign(),
                }
                assigner.tick(now());
            }
            () = shutdown.stopping() => break,
        }
        while let Some(out) = assigner.poll_output() {
            match out {
                Output::Send(set) => {
                    let body = serde_json::to_vec(&set).expect("serialisable");
                    if client
                        .publish(subjects.instructions(&set.worker), body.into())
                        .await
                        .is_err()
                    {
                        stats.publish_errors.fetch_add(1, Relaxed);
                    }
                }
                Output::QueryTasks { reset } => {
                    let (cluster, sources, tx) =
                        (cluster.clone(), sources.clone(), query_tx.clone());
                    shutdown.spawn(async move {
                        if let Some(s) = &sources {
                            for source in s.all() {
                                if let Err(e) = source.reload_symbols().await {
                                    tracing::warn!(source = %source.config.name, error = %e, "task query: exchangeInfo failed, using the symbols known");
                                }
                            }
                            for venue in s.venues() {
                                if let Err(e) = venue.load().await {
                                    tracing::warn!(source = %venue.config.name, error = %e, "task query: the instrument list failed, using the instruments known");
                                }
                            }
                        }
                        let tasks = query_tasks(&cluster, sources.as_deref());
                        let _ = tx.send((tasks, reset)).await;
                    });
                }
            }
        }
    }
    lease.release().await;
    Ok(())
}
