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
//! - **Books** come from the cluster's workers ([`super::depth::ClusterBooks`] fills the depth
//!   jobs' [`crate::books::upstream::DepthSource`] plug), and a running depth job is a demand
//!   too ([`Demanding`]).
//!
//! The gateway is a layer around the service ([`GatewayLayer`], an [`app::Layer`]): it fills the
//! service's plug points and adds its health problems, metrics and the cluster's report
//! ([`Gateway`], an [`app::Extension`]); the service knows none of it. [`start`] is how every
//! `millrace serve` on the NATS bus starts.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use shared::cluster::{Demand, TaskId, TaskKind};
use shared::protocol::ops::{ClusterReport, ReportQuery};
use shared::protocol::{InstrumentId, SeriesId};
use tokio::sync::Notify;

use super::bounds::ClusterBounds;
use super::candles::{Persister, PersisterStats};
use super::depth::ClusterBooks;
use super::l3::RemoteL3;
use super::{connect, ConnectError, Role, Subjects};
use crate::app::{self, App, Parts, Plugs};
use crate::books::depth_job::DepthRunner;
use crate::bus::nats::Publisher;
use crate::bus::{NatsBus, PoisonStats};
use crate::clock::wall_clock_ms;
use crate::config::Config;
use crate::jobs::supervisor::{JobContext, JobFuture, JobRunner};
use crate::lock::lock;
use crate::metrics::Exposition;
use crate::shutdown::Shutdown;
use crate::sources::{ResolveError, Sources};
use crate::store::CandleStore;

/// Why a service on the NATS bus could not start.
#[derive(Debug, thiserror::Error)]
pub enum BusStartError {
    #[error(transparent)]
    Bus(#[from] ConnectError),
    #[error(transparent)]
    Service(#[from] app::StartError),
    #[error("configuration key `bus.kind`: a gateway (cluster.enabled) needs NATS")]
    NotOnNats,
}

/// Starts the service `config` describes: on one process ([`App::start`]) with the in-process
/// bus; on the NATS bus with `[bus] kind = "nats"`; and as a gateway of the cluster with
/// `[cluster] enabled`.
pub async fn start(config: Config) -> Result<App, BusStartError> {
    use crate::config::BusKind;
    match (config.bus.kind, config.cluster.enabled) {
        (BusKind::Inprocess, false) => Ok(App::start(config).await?),
        (BusKind::Inprocess, true) => Err(BusStartError::NotOnNats),
        (BusKind::Nats, enabled) => {
            // (the store first, as on one process: its errors come first)
            let stores = app::Stores::open(&config).await?;
            let client = connect(&config.bus, Role::Gateway, "millrace serve").await?;
            let url = crate::redact::redact(&config.bus.url);
            tracing::info!(%url, prefix = %config.bus.prefix, "bus on NATS");
            let bus = Arc::new(
                NatsBus::new(
                    client.clone(),
                    &config.bus.prefix,
                    Publisher::Gateway,
                    config.limits.bus_capacity,
                    &Shutdown::new(),
                )
                .share_tick_books(config.l3.worker_host().is_some()),
            );
            let backends = stores.with_bus(bus.clone());
            let layer = enabled.then(|| {
                Box::new(GatewayLayer { client, bus: Some(bus) }) as Box<dyn app::Layer + Send>
            });
            Ok(App::start_layered(config, backends, layer).await?)
        }
    }
}

/// Why there is no cluster report.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("no leading supervisor answered within {0:?}")]
    Timeout(Duration),
    #[error("no leading supervisor answered")]
    Request(#[source] async_nats::RequestError),
    #[error("the supervisor's report did not parse")]
    Parse(#[source] serde_json::Error),
}

/// How often a gateway reads its sources' clocks (the bounds of what it reads from the bus).
const CLOCK_EVERY: Duration = Duration::from_secs(10);

/// A gateway around the service (see the module docs): its NATS connection, and the bus on it
/// (`None`: the caller publishes on another; nothing read is then bounded by this gateway).
pub struct GatewayLayer {
    pub client: async_nats::Client,
    pub bus: Option<Arc<NatsBus>>,
}

impl app::Layer for GatewayLayer {
    fn plugs(self: Box<Self>, parts: &Parts<'_>) -> Plugs {
        let GatewayLayer { client, bus } = *self;
        let config = parts.config;
        let g = Arc::new(Gateway::start(parts, client.clone(), bus));
        let depth_demand = g.demand.clone();
        let remote_books = config.l3.worker_host().map(|_| {
            let mut names: Vec<String> = crate::l3::sim_feeds(config, parts.sources)
                .into_iter()
                .map(|(name, _)| name)
                .collect();
            names.extend(config.l3.replay.iter().map(|r| r.name.clone()));
            RemoteL3::start(
                client.clone(),
                &g.subjects.prefix,
                &config.l3.host,
                names,
                parts.books.clone(),
                Duration::from_millis(config.cluster.tick_ms.max(500)),
                config.server.admin_token.clone(),
                parts.shutdown,
            ) as Arc<dyn crate::l3::remote::RemoteBooks>
        });
        let venues = parts.sources.venues().iter().map(|v| v.config.name.clone()).collect();
        let books = ClusterBooks::new(
            client,
            g.subjects.clone(),
            config.cluster.depth_stream_mb,
            g.poison.clone(),
            venues,
            g.bounds.clone(),
        );
        Plugs {
            kline_jobs: Some(Arc::new(DemandRunner::new(
                TaskKind::Kline,
                parts.sources.clone(),
                g.demand.clone(),
            ))),
            depth_source: Some(books),
            depth_jobs: Some(Box::new(move |runner: Arc<DepthRunner>| {
                Arc::new(Demanding { inner: runner, kind: TaskKind::Depth, demand: depth_demand })
                    as Arc<dyn JobRunner>
            })),
            backfill_lease: Some(g.lead.clone()),
            remote_books,
            extension: Some(Arc::new(GatewayExtension { g })),
        }
    }
}

/// What a gateway runs besides the service.
pub struct Gateway {
    pub id: String,
    pub client: async_nats::Client,
    pub subjects: Subjects,
    pub demand: Arc<DemandSet>,
    pub persister: Arc<PersisterStats>,
    /// Whether this gateway holds the persister lease (and so runs backfill).
    pub lead: tokio::sync::watch::Receiver<bool>,
    /// Why the store did not answer its last check (every `tick_ms`), if it did not.
    pub store_down: Arc<Mutex<Option<String>>>,
    /// What it accepts from the bus.
    pub bounds: Arc<ClusterBounds>,
    /// What it refused from the bus, by kind.
    pub poison: Arc<PoisonStats>,
    /// The bus on NATS (its counters).
    pub nats_bus: Option<Arc<NatsBus>>,
}

impl Gateway {
    /// Starts a gateway's demand publisher, persister and store check in the service's
    /// shutdown, and bounds what it reads from the bus by its sources' clocks.
    fn start(
        parts: &Parts<'_>,
        client: async_nats::Client,
        nats_bus: Option<Arc<NatsBus>>,
    ) -> Self {
        let (config, shutdown) = (parts.config, parts.shutdown);
        parts.sources.keep_clocks(CLOCK_EVERY, shutdown);
        let bounds = ClusterBounds::new(
            parts.sources.clone(),
            config.cluster.bus_retention_s,
            config.cluster.bus_tolerance_s,
        );
        let poison = Arc::new(PoisonStats::default());
        if let Some(bus) = &nats_bus {
            bus.guard_with(bounds.clone(), poison.clone());
        }
        let id = config.cluster.id.clone().unwrap_or_else(|| {
            let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
            format!("gateway-{}-{}", host.trim(), std::process::id())
        });
        let subjects = Subjects::new(&config.bus.prefix);
        let demand = DemandSet::new(&id);
        let every = Duration::from_millis(config.cluster.status_interval_ms);
        shutdown.spawn(demand.clone().publish(
            client.clone(),
            subjects.clone(),
            every,
            shutdown.clone(),
        ));
        let persister = Arc::new(PersisterStats::default());
        let (leading, lead) = tokio::sync::watch::channel(false);
        let run = Persister {
            client: client.clone(),
            subjects: subjects.clone(),
            cluster: config.cluster.clone(),
            derived: config.ingest.derived.clone(),
            writer: parts.writer.clone(),
            id: id.clone(),
            stats: persister.clone(),
            leading,
            bounds: bounds.clone(),
            poison: poison.clone(),
        }
        .run(shutdown.clone());
        shutdown.spawn(async move {
            if let Err(e) = run.await {
                tracing::error!("the persister stopped: {}", crate::error::report(&e));
            }
        });
        let store_down = Arc::new(Mutex::new(None));
        shutdown.spawn_until_stopped(check_store(
            parts.store.clone(),
            store_down.clone(),
            Duration::from_millis(config.cluster.tick_ms),
        ));
        tracing::info!(%id, prefix = %subjects.prefix, "gateway of the cluster");
        Gateway {
            id,
            client,
            subjects,
            demand,
            persister,
            lead,
            store_down,
            bounds,
            poison,
            nats_bus,
        }
    }

    /// The leading supervisor's report over NATS (request/reply), waiting at most `wait`.
    pub async fn cluster_report(
        &self,
        max_tasks: usize,
        wait: Duration,
    ) -> Result<ClusterReport, ReportError> {
        let body = serde_json::to_vec(&ReportQuery { max_tasks }).expect("serialisable");
        let ask = self.client.request(self.subjects.report(), body.into());
        let answer = tokio::time::timeout(wait, ask)
            .await
            .map_err(|_| ReportError::Timeout(wait))?
            .map_err(ReportError::Request)?;
        serde_json::from_slice(&answer.payload).map_err(ReportError::Parse)
    }
}

/// A gateway's additions to the service's health, metrics and operations API.
struct GatewayExtension {
    g: Arc<Gateway>,
}

impl app::Extension for GatewayExtension {
    /// NATS away (the client reconnects), the store not answering the gateway's check, and
    /// the persister's writes failing (its round is written again after a back-off).
    fn problems(&self) -> Vec<String> {
        let g = &self.g;
        let mut out = Vec::new();
        if g.client.connection_state() != async_nats::connection::State::Connected {
            out.push("NATS (bus.url) is unreachable; reconnecting".to_string());
        }
        if let Some(why) = lock(&g.store_down).as_ref() {
            out.push(format!("the store (store.url) does not answer: {why}; retrying"));
        }
        let since = g.persister.failing_since_ms.load(Relaxed);
        if since != 0 {
            let secs = (wall_clock_ms() - since).max(0) / 1000;
            out.push(format!(
                "the persister cannot write closed candles to the store (store.url) for {secs} s; retrying"
            ));
        }
        out
    }

    /// What it refused from the bus, its persister and its bus; what the leader and the workers
    /// refused, from the leader's report (asked briefly: a scrape never waits long for a
    /// supervisor that is away).
    fn metrics(&self) -> BoxFuture<'_, String> {
        Box::pin(async move {
            let report = self.g.cluster_report(0, Duration::from_millis(500)).await.ok();
            let mut e = Exposition::new();
            render_gateway_metrics(&self.g, report.as_ref(), &mut e);
            e.finish()
        })
    }

    fn cluster_report(
        &self,
        max_tasks: usize,
    ) -> BoxFuture<'_, Result<ClusterReport, app::Unavailable>> {
        Box::pin(async move {
            self.g
                .cluster_report(max_tasks, Duration::from_secs(2))
                .await
                .map_err(|e| app::Unavailable(crate::error::report(&e).to_string()))
        })
    }
}

/// A job runner that holds its task in a [`DemandSet`] while each job runs (a gateway's depth
/// jobs: a book in sync through the cluster is a demand for the cluster's depth task).
pub struct Demanding<R> {
    inner: Arc<R>,
    kind: TaskKind,
    demand: Arc<DemandSet>,
}

impl<R: JobRunner> JobRunner for Demanding<R> {
    fn validate(&self, series: &SeriesId) -> Result<(), ResolveError> {
        self.inner.validate(series)
    }

    fn validate_instrument(&self, instrument: &InstrumentId) -> Result<(), ResolveError> {
        self.inner.validate_instrument(instrument)
    }

    fn run(&self, ctx: JobContext) -> JobFuture {
        let held = self.demand.clone().hold(TaskId::new(self.kind, ctx.instrument.clone()));
        let job = self.inner.run(ctx);
        Box::pin(async move {
            let _held = held;
            job.await;
        })
    }
}

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
        self.sources.validate_instrument(instrument)
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

/// A gateway's part of `/metrics`: what it refused from the bus, its persister, its bus, and
/// what the leader and the workers refused (from the leader's `report`, when it answered).
fn render_gateway_metrics(g: &Gateway, report: Option<&ClusterReport>, e: &mut Exposition) {
    use std::sync::atomic::Ordering::Relaxed;
    e.family(
        "millrace_bus_poison_total",
        "counter",
        "Messages read from the bus that did not fit their bounds (terminated or dropped, never acted on), by kind.",
    );
    for (kind, n) in g.poison.counts() {
        e.sample("millrace_bus_poison_total", &[("kind", kind.as_str())], n);
    }
    let p = &g.persister;
    let persister: [(&str, &str, &str, u64); 8] = [
        (
            "millrace_persister_candles_total",
            "counter",
            "Closed 1m candles the persister wrote.",
            p.candles.load(Relaxed),
        ),
        (
            "millrace_persister_rounds_total",
            "counter",
            "Rounds (transactions) the persister committed.",
            p.batches.load(Relaxed),
        ),
        (
            "millrace_persister_write_failures_total",
            "counter",
            "Failed persister writes (retried).",
            p.write_failures.load(Relaxed),
        ),
        (
            "millrace_persister_refused_total",
            "counter",
            "Closed-candle messages refused (terminated).",
            p.malformed.load(Relaxed),
        ),
        (
            "millrace_persister_deferred_total",
            "counter",
            "Closed-candle messages sent back to wait (a source's symbols or clock not known yet).",
            p.deferred.load(Relaxed),
        ),
        (
            "millrace_persister_redelivered_total",
            "counter",
            "Closed-candle messages delivered more than once.",
            p.redelivered.load(Relaxed),
        ),
        (
            "millrace_persister_repeated_total",
            "counter",
            "Closed candles not written again (written already by this lease holder).",
            p.repeated.load(Relaxed),
        ),
        (
            "millrace_persister_leading",
            "gauge",
            "1 while this gateway holds the persister lease.",
            p.leading.load(Relaxed),
        ),
    ];
    for (name, kind, help, value) in persister {
        e.single(name, kind, help, value);
    }
    if let Some(b) = &g.nats_bus {
        let s = b.stats();
        let bus: [(&str, &str, u64); 6] = [
            ("millrace_nats_bus_received_total", "Messages received from NATS for local subscribers.", s.received.load(Relaxed)),
            ("millrace_nats_bus_published_total", "Messages published to NATS.", s.published.load(Relaxed)),
            ("millrace_nats_bus_dropped_total", "Publishes dropped (queue full or NATS away).", s.dropped.load(Relaxed)),
            ("millrace_nats_bus_duplicates_total", "Kline pushes dropped as already delivered.", s.duplicates.load(Relaxed)),
            ("millrace_nats_bus_malformed_total", "Messages that were not kline pushes or batches.", s.malformed.load(Relaxed)),
            ("millrace_nats_bus_unbounded_total", "Kline pushes dropped because the exchange's clock of their instrument is not known yet.", s.unbounded.load(Relaxed)),
        ];
        for (name, help, value) in bus {
            e.single(name, "counter", help, value);
        }
    }
    e.family(
        "millrace_cluster_refused_total",
        "counter",
        "Messages the leading supervisor and each worker refused from the bus, by kind (from the leader's report).",
    );
    if let Some(r) = report {
        let process = r.supervisor.leader.clone().unwrap_or_default();
        for (kind, n) in &r.supervisor.refused {
            e.sample(
                "millrace_cluster_refused_total",
                &[("process", &process), ("role", "supervisor"), ("kind", kind)],
                n,
            );
        }
        for w in &r.workers {
            for (kind, n) in &w.refused {
                e.sample(
                    "millrace_cluster_refused_total",
                    &[("process", &w.id), ("role", "worker"), ("kind", kind)],
                    n,
                );
            }
        }
    }
}

/// Checks the store every `every`, keeping why it did not answer (a check that takes longer
/// than `every` + 2 s counts as no answer; the next starts only once it has ended); logs the
/// changes.
async fn check_store(
    store: Arc<dyn CandleStore>,
    down: Arc<Mutex<Option<String>>>,
    every: Duration,
) {
    let limit = every + Duration::from_secs(2);
    let set = |why: Option<String>| {
        let mut was = lock(&down);
        match (&*was, &why) {
            (None, Some(w)) => {
                tracing::warn!(key = "store.url", error = %w, "the store does not answer")
            }
            (Some(_), None) => tracing::info!("the store answers again"),
            _ => {}
        }
        *was = why;
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let s = store.clone();
        let mut check = std::pin::pin!(crate::store::blocking(move || s.check()));
        let done = tokio::select! {
            r = &mut check => r,
            () = tokio::time::sleep(limit) => {
                set(Some(format!("no answer within {limit:?}")));
                check.await
            }
        };
        set(done.err().map(|e| crate::error::report(&e).to_string()));
    }
}
