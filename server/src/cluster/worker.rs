//! `millrace worker`: seed 004's Worker. It holds the upstream sessions its instruction sets
//! give it — `kline:{instrument}` runs today's kline job (the 1m stream with the REST gap fill),
//! whose closed candles go to JetStream ([`JetStreamForward`]) and whose forming candles go to
//! the bus — or `depth:{instrument}`, today's depth job with a diff tap
//! ([`super::depth::DepthTap`]) — and says what it holds in a [`WorkerStatus`] every `status_interval_ms` and at
//! once on every change, with each session's data age (for the supervisor's task timeout).
//!
//! Instruction sets are applied by [`WorkerTasks`] (stale epochs and sets ignored; a pre-reset
//! keeps what is unchanged). A job is pinned in the worker's own jobs [`Supervisor`], so seed
//! 000's crash restarts and back-off apply to it as in the single process.
//!
//! **Tick-by-tick books.** The worker named by `[l3] host = "worker:ID"` also runs the
//! tick-by-tick engine and its feeds, and answers the gateways' requests for it
//! ([`crate::l3::remote`]).
//!
//! **Drain.** When asked to leave (SIGTERM), the worker says so in a status at once; the leader
//! moves its tasks to other workers and ends them here. The worker keeps its sessions until
//! then (at most `drain_s`), so with redundancy 1 the new holder is connecting while the old one
//! still delivers; then it stops its jobs, which hand their last closed candles to JetStream.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use shared::cluster::worker::{Identity, WorkerTasks};
use shared::cluster::{Instructions, TaskId, TaskKind, WorkerStatus};
use shared::protocol::ops::JobKind;

use super::candles::{ensure_stream, JetStreamForward};
use super::l3::{request_subject, serve};
use super::Subjects;
use crate::books::depth_job::DepthRunner;
use crate::books::BookRegistry;
use crate::bus::nats::Publisher;
use crate::bus::NatsBus;
use crate::bus::PoisonStats;
use crate::candles::kline_job::KlineRunner;
use crate::candles::writer::CandleOut;
use crate::clock::wall_clock_ms;
use crate::config::Config;
use crate::jobs::Supervisor;
use crate::l3::L3Books;
use crate::shutdown::Shutdown;
use crate::sources::Sources;
use crate::store::blocking;
use shared::cluster::bounds::Poison;

/// Who this worker is.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    pub id: String,
    /// The most sessions it holds (declared in every status).
    pub max_load: u32,
    /// The longest a draining worker waits for its tasks to be moved before it stops them.
    pub drain: Duration,
}

/// Counters of a worker.
#[derive(Debug, Default)]
pub struct WorkerStats {
    pub statuses: AtomicU64,
    pub instruction_sets: AtomicU64,
    /// Instruction sets that were not valid JSON, or addressed to another worker.
    pub malformed: AtomicU64,
    pub started: AtomicU64,
    pub stopped: AtomicU64,
}

/// Why a worker could not start.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("configuration key `store.kind`: a worker reads where its kline tasks resume from the cluster's PostgreSQL store")]
    NotPostgres,
    #[error(transparent)]
    Store(#[from] crate::app::StartError),
    #[error("cannot set up JetStream's candle stream")]
    JetStream(#[source] async_nats::Error),
    #[error("cannot subscribe to {subject}")]
    Subscribe {
        subject: String,
        #[source]
        source: async_nats::SubscribeError,
    },
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Source(#[from] crate::sources::SourceError),
    #[error("cannot start the tick-by-tick books this worker hosts (l3.host)")]
    TickBooks(#[source] crate::l3::L3Error),
    #[error("cannot start the recorder (record.dir)")]
    Recording(#[source] std::io::Error),
}

/// A worker's sessions: one jobs supervisor per kind it runs.
struct Sessions {
    kline: Supervisor,
    depth: Supervisor,
}

impl Sessions {
    fn jobs(&self, kind: TaskKind) -> &Supervisor {
        match kind {
            TaskKind::Kline => &self.kline,
            TaskKind::Depth => &self.depth,
        }
    }

    fn start(&self, task: &TaskId) {
        self.jobs(task.kind).pin(&task.instrument);
    }

    fn stop(&self, task: &TaskId) {
        self.jobs(task.kind).stop_job(&task.instrument);
    }

    /// Data age of `task`, ms, by the worker's clock; `None` before its first message.
    fn data_age_ms(&self, task: &TaskId, now_ms: i64) -> Option<u64> {
        let health = self.jobs(task.kind).health(&task.instrument)?;
        let last = health.last_message_at_ms.load(Relaxed);
        (last > 0).then(|| u64::try_from(now_ms - last).unwrap_or(0))
    }
}

/// Runs worker `options.id` until `shutdown` (at once) or `drain` (gracefully, see the module
/// docs).
pub async fn run(
    config: Config,
    client: async_nats::Client,
    options: WorkerOptions,
    stats: Arc<WorkerStats>,
    shutdown: Shutdown,
    drain: impl std::future::Future<Output = ()>,
) -> Result<(), WorkerError> {
    let subjects = Subjects::new(&config.bus.prefix);
    let js = async_nats::jetstream::new(client.clone());
    ensure_stream(&js, &subjects, &config.cluster).await.map_err(WorkerError::JetStream)?;
    if config.store.kind != crate::config::StoreKind::Postgres {
        return Err(WorkerError::NotPostgres);
    }
    // The cluster's PostgreSQL (read: where its kline tasks resume), the NATS bus (its forming
    // candles; the tick-by-tick books' deltas when it hosts them), and an in-process bus for
    // the books it keeps for snapshot requests (published to nobody).
    let store: Arc<dyn crate::store::CandleStore> = crate::app::open_postgres(&config).await?;
    let bus: Arc<dyn crate::bus::Bus> = Arc::new(
        NatsBus::new(
            client.clone(),
            &config.bus.prefix,
            Publisher::Worker,
            config.limits.bus_capacity,
            &shutdown,
        )
        .share_tick_books(config.l3.worker_host().is_some()),
    );
    let local: Arc<dyn crate::bus::Bus> =
        Arc::new(crate::bus::InProcessBus::new(config.limits.bus_capacity));
    // What it refuses from the bus (instruction sets, admin requests to the books it hosts).
    let poison = Arc::new(PoisonStats::default());
    // The leader lease, against which a new leader's epoch is checked (read only, and only
    // when a new epoch comes).
    let leases = (js.clone(), subjects.lease_bucket());
    let endpoints = crate::sources::remote_endpoints(&config.sources)?;
    // The sessions it holds are recorded here (`[record]`), as on one process, each worker in
    // a directory of its own (`{record.dir}/worker-{id}`): workers sharing a configuration or a
    // disk never write one file, and a reader merges the replicas (`recorded::read_merged`).
    let recording = {
        let mut own = config.clone();
        own.record.dir = Some(config.record_dir().join(format!("worker-{}", options.id)));
        crate::recording::Recording::start(&own, &shutdown.child())
            .map_err(WorkerError::Recording)?
    };
    let sources = Sources::start_with(
        &config.sources,
        endpoints,
        Vec::new(),
        &config.ingest.derived,
        Some(&recording),
        &shutdown.child(),
    )
    .await?;
    // The tick-by-tick books, when this worker hosts them (`[l3] host = "worker:{id}"`): they
    // publish on the bus (their topics travel) and answer the gateways' requests.
    let l3 = if config.l3.worker_host() == Some(options.id.as_str()) {
        let registry = BookRegistry::new(bus.clone());
        let feeds = crate::l3::sim_feeds(&config, &sources);
        let books = L3Books::start(
            &config.l3,
            registry,
            &feeds,
            config.server.admin_token.clone(),
            &shutdown.child(),
        )
        .map_err(WorkerError::TickBooks)?;
        let subject = request_subject(&subjects.prefix);
        let token = config.server.admin_token.as_deref();
        serve(books.clone(), client.clone(), subject.clone(), token, poison.clone(), &shutdown)
            .await
            .map_err(|source| WorkerError::Subscribe { subject, source })?;
        tracing::info!(
            books = books.handle.stats().symbols.len(),
            "hosting the tick-by-tick books"
        );
        Some(books)
    } else {
        None
    };
    let forward = Arc::new(JetStreamForward::new(js.clone(), subjects.clone()));
    let out = CandleOut { store: store.clone(), bus, closed: forward };
    // Its gap fills stop where the persister's bounds do (an hour inside them, for the time the
    // candles may wait in JetStream).
    let max_age_ms = i64::try_from(config.cluster.bus_retention_s.saturating_sub(3_600) * 1000)
        .unwrap_or(i64::MAX);
    let runner = KlineRunner::new(&config, sources.clone(), out).gap_fill_within(max_age_ms);
    // Depth sessions sync their books as on one process, forward every diff (the tap), and
    // their synced books answer the gateways' snapshot requests (through the book registry).
    super::depth::ensure_stream(&js, &subjects, config.cluster.depth_stream_mb)
        .await
        .map_err(WorkerError::JetStream)?;
    let tap = super::depth::DepthTap::new(client.clone(), subjects.clone(), &shutdown);
    // Venue books and every market's trades are relayed as this worker publishes them
    // (`super::relay`): the registry's bus sends those topics to NATS too.
    let venues: std::collections::HashSet<String> =
        sources.venues().iter().map(|v| v.config.name.clone()).collect();
    let relay = super::relay::RelayBus::new(
        local,
        client.clone(),
        &subjects.prefix,
        &options.id,
        venues.clone(),
        &shutdown,
    );
    let relay_stats = relay.stats.clone();
    let local = BookRegistry::new(relay);
    super::relay::serve(
        local.clone(),
        client.clone(),
        subjects.prefix.clone(),
        options.id.clone(),
        venues,
        relay_stats,
        &shutdown,
    )
    .await
    .map_err(|source| WorkerError::Subscribe {
        subject: format!("{}.relaysnap.>", subjects.prefix),
        source,
    })?;
    tap.answer_snapshots(local.clone(), &shutdown).await.map_err(|source| {
        WorkerError::Subscribe { subject: format!("{}.booksnap.*", subjects.prefix), source }
    })?;
    let depth = DepthRunner::new(&config, sources.clone(), local).with_tap(tap);
    let depth_config = depth.supervisor_config();
    let sessions = Sessions {
        kline: Supervisor::new(JobKind::Kline, config.ingest.clone(), Arc::new(runner), &shutdown),
        depth: Supervisor::new(JobKind::Depth, depth_config, Arc::new(depth), &shutdown),
    };
    sessions.kline.start(&[]);
    sessions.depth.start(&[]);

    let id = options.id.clone();
    let subject = subjects.instructions(&id);
    let mut instructions = client
        .subscribe(subject.clone())
        .await
        .map_err(|source| WorkerError::Subscribe { subject, source })?;
    let instance = instance_id();
    let mut tasks = WorkerTasks::new();
    let mut leaving = false;
    let who = Identity { worker: id.clone(), instance, max_load: options.max_load };
    // The full task list when it changed, on leaving, and a few times every warm-up; at steady
    // state otherwise only the data ages.
    let short_max = config.cluster.short_statuses();
    let status = |tasks: &mut WorkerTasks, leaving: bool, full: bool| {
        let now = wall_clock_ms();
        let age = |t: &TaskId| sessions.data_age_ms(t, now);
        let mut st = tasks.next_status(&who, leaving, age, full, short_max);
        if st.ages.is_none() {
            st.refused = poison.nonzero();
        }
        st
    };
    let publish = |st: WorkerStatus| {
        let (client, subject, stats) = (client.clone(), subjects.status(), stats.clone());
        async move {
            let body = serde_json::to_vec(&st).expect("serialisable");
            if client.publish(subject, body.into()).await.is_ok() {
                stats.statuses.fetch_add(1, Relaxed);
            }
        }
    };
    let mut tick = tokio::time::interval(Duration::from_millis(config.cluster.status_interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(drain);
    let drain_deadline = tokio::time::sleep(Duration::from_secs(86_400 * 365));
    tokio::pin!(drain_deadline);
    tracing::info!(%id, max_load = options.max_load, prefix = %subjects.prefix, "worker started");
    loop {
        tokio::select! {
            Some(m) = instructions.next() => {
                let set = match serde_json::from_slice::<Instructions>(&m.payload) {
                    Ok(set) => set,
                    Err(_) => {
                        stats.malformed.fetch_add(1, Relaxed);
                        poison.record(Poison::Unparsable, format_args!("{}: not an instruction set", m.subject));
                        continue;
                    }
                };
                if let Err(kind) = check_instructions(&set, &tasks, &id, options.max_load, &leases).await {
                    stats.malformed.fetch_add(1, Relaxed);
                    poison.record(kind, format_args!(
                        "{}: an instruction set of epoch {} seq {} refused",
                        m.subject, set.epoch, set.seq
                    ));
                    continue;
                }
                stats.instruction_sets.fetch_add(1, Relaxed);
                if let Some(change) = tasks.apply(&set) {
                    for t in &change.stop {
                        sessions.stop(t);
                        stats.stopped.fetch_add(1, Relaxed);
                    }
                    if !leaving {
                        for t in &change.start {
                            sessions.start(t);
                            stats.started.fetch_add(1, Relaxed);
                        }
                    }
                    tracing::info!(epoch = set.epoch, seq = set.seq, reset = set.reset,
                        stop = change.stop.len(), start = change.start.len(),
                        "instructions applied");
                    publish(status(&mut tasks, leaving, false)).await;
                }
                if leaving && tasks.wanted().is_empty() {
                    break; // every task moved
                }
            }
            _ = tick.tick() => publish(status(&mut tasks, leaving, false)).await,
            () = &mut drain, if !leaving => {
                tracing::info!(%id, "draining: leaving the cluster");
                leaving = true;
                drain_deadline.as_mut().reset(tokio::time::Instant::now() + options.drain);
                publish(status(&mut tasks, leaving, true)).await;
                if tasks.wanted().is_empty() {
                    break;
                }
            }
            () = &mut drain_deadline, if leaving => break,
            () = shutdown.stopping() => break,
        }
    }
    if let Some(l3) = &l3 {
        l3.stop().await;
    }
    // Stop every session (closed candles still buffered go to JetStream), then say so.
    tokio::join!(
        sessions.kline.stop(Duration::from_secs(10)),
        sessions.depth.stop(Duration::from_secs(5))
    );
    tasks.clear();
    publish(status(&mut tasks, true, true)).await;
    let _ = client.flush().await;
    let _ = blocking(move || {
        store.close();
        Ok(())
    })
    .await;
    Ok(())
}

/// Whether worker `id` can take `set` from the bus: its own bounds
/// ([`Instructions::check`]), and a newer epoch than the one it follows must not be beyond the
/// leader lease: an epoch is the revision the lease was created with, so it can never exceed
/// the lease's current revision (a set of epoch `u64::MAX` would make the worker ignore every
/// real leader). When the lease cannot be read, the set is taken (the worker must not stop
/// following a real new leader because NATS hiccupped).
async fn check_instructions(
    set: &Instructions,
    tasks: &WorkerTasks,
    id: &str,
    max_load: u32,
    leases: &(async_nats::jetstream::Context, String),
) -> Result<(), Poison> {
    set.check(id, tasks.applied(), max_load)?;
    if set.epoch <= tasks.applied().0 {
        return Ok(());
    }
    let (js, bucket) = leases;
    let entry = match js.get_key_value(bucket.as_str()).await {
        Ok(kv) => kv.entry(super::supervisor::LEADER_KEY).await.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    match entry {
        Ok(Some(entry)) if set.epoch <= entry.revision => Ok(()),
        Ok(_) => Err(Poison::Instructions),
        Err(e) => {
            tracing::warn!(epoch = set.epoch, error = %e, "cannot read the leader lease to check a new epoch; taking it");
            Ok(())
        }
    }
}

/// A random id per process start (a worker restarted under the same id has lost its sessions).
fn instance_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_i64(wall_clock_ms());
    h.finish()
}
