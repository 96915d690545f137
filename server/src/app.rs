//! The composition root: the running service, assembled. [`App::start`] builds it from a
//! [`Config`] — the only place that names concrete parts ([`InProcessBus`], [`SqliteStore`], the
//! embedded simulator); [`App::start_with`] takes the bus and the store from the caller (tests
//! run the service on other implementations). [`App::stop`] stops it in order — the tick-by-tick
//! books, then the jobs and backfill runs (which flush their buffered closed candles into the
//! store), then the sources' background work and the embedded simulators, then the store — so a
//! graceful shutdown loses nothing and leaves no task or thread behind.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use shared::candle::{Timeframe, MINUTE_MS};
use shared::protocol::ops::{ClusterReport, JobKind, ReportQuery, SourceKind};
use shared::protocol::{InstrumentId, SeriesId};
use sim::{Sim, SimConfig, SimHandle};
use tracing::Instrument as _;

use crate::books::depth_job::{DepthRole, DepthRunner};
use crate::books::BookRegistry;
use crate::bus::nats::Side;
use crate::bus::{Bus, InProcessBus, NatsBus, PoisonStats};
use crate::candles::backfill::Backfill;
use crate::candles::kline_job::KlineRunner;
use crate::candles::writer::CandleWriter;
use crate::cluster::bounds::ClusterBounds;
use crate::cluster::candles::{Persister, PersisterStats};
use crate::cluster::config::{BusKind, StoreKind};
use crate::cluster::depth::ClusterBooks;
use crate::cluster::gateway::{DemandRunner, DemandSet};
use crate::cluster::Subjects;
use crate::config::{Config, SourceConfig};
use crate::jobs::supervisor::JobRunner;
use crate::jobs::{Lease, SubscribeError, Supervisor};
use crate::l3::remote::{L3Access, RemoteL3};
use crate::l3::L3Books;
use crate::lock::lock;
use crate::metrics::{Column, Exposition, Metrics};
use crate::shutdown::Shutdown;
use crate::sources::{Endpoint, Sources};
use crate::store::dir_lock::{DataDirLock, DirLockError};
use crate::store::postgres::PostgresStore;
use crate::store::sqlite::{SqliteOptions, SqliteStore};
use crate::store::{blocking, BackfillStore, CandleStore, StoreError};

/// Why the service could not start. Each names what to fix.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot open the database {path}")]
    Store {
        path: String,
        #[source]
        source: StoreError,
    },
    #[error(transparent)]
    DataDir(#[from] DirLockError),
    #[error(transparent)]
    Bus(#[from] crate::cluster::ConnectError),
    #[error("cannot load backfill progress")]
    Backfill(#[source] StoreError),
    #[error("cannot start the embedded simulator of source {name}")]
    Simulator {
        name: String,
        #[source]
        source: anyhow::Error,
    },
    #[error(
        "cannot read the newest stored candles of source {name} (its simulator resumes after them)"
    )]
    SimResume {
        name: String,
        #[source]
        source: StoreError,
    },
    #[error(transparent)]
    Source(#[from] crate::sources::SourceError),
    #[error("configuration key `bus.kind`: a gateway (cluster.enabled) needs NATS")]
    NotOnNats,
    #[error("cannot start the tick-by-tick books")]
    TickBooks(#[source] crate::l3::L3Error),
}

/// The bus and the store the service runs on.
#[derive(Clone)]
pub struct Backends {
    pub bus: Arc<dyn Bus>,
    pub store: Arc<dyn CandleStore>,
    pub backfill_store: Arc<dyn BackfillStore>,
    /// The NATS connection, with `[bus] kind = "nats"` (a gateway's demand and persister use it).
    pub nats: Option<async_nats::Client>,
    /// The bus itself when it is NATS (a gateway bounds what it reads).
    pub nats_bus: Option<Arc<NatsBus>>,
    /// The data directory's lock, with the SQLite store: held as long as the service runs.
    pub data_lock: Option<Arc<DataDirLock>>,
}

impl Backends {
    /// The bus and store `[bus]` and `[store]` name: by default the in-process bus and the
    /// SQLite file of the data directory; NATS and PostgreSQL when configured (an unreachable
    /// server is an error naming the key). The data directory of the SQLite store is locked
    /// first: a second server on it is refused ([`DirLockError::Held`]).
    pub async fn open(config: &Config) -> Result<Backends, StartError> {
        let mut data_lock = None;
        let (store, backfill_store): (Arc<dyn CandleStore>, Arc<dyn BackfillStore>) = match config
            .store
            .kind
        {
            StoreKind::Sqlite => {
                // A few file-system calls, once at start.
                data_lock = Some(Arc::new(DataDirLock::acquire(&config.server.data_dir)?));
                let path = config.db_path();
                let (file, check) = (path.clone(), config.store.quick_check);
                let options = SqliteOptions {
                    writer_cache_kib: config.store.sqlite_writer_cache_kib,
                    readers: config.store.sqlite_readers as usize,
                };
                let store = blocking(move || {
                    let store = SqliteStore::open_with(&file, options)?;
                    if check {
                        let started = std::time::Instant::now();
                        store.quick_check()?;
                        tracing::info!(took = ?started.elapsed(), "store integrity checked");
                    }
                    Ok(store)
                })
                .await
                .map(Arc::new)
                .map_err(|source| StartError::Store { path: path.display().to_string(), source })?;
                tracing::info!(db = %path.display(), "store open");
                (store.clone(), store)
            }
            StoreKind::Postgres => {
                let url = config.store.url.clone().unwrap_or_default();
                let shown = crate::redact::redact(&url);
                let store = blocking(move || PostgresStore::open(&url))
                    .await
                    .map(Arc::new)
                    .map_err(|source| StartError::Store {
                        path: format!("{shown} (configuration key `store.url`)"),
                        source,
                    })?;
                tracing::info!(db = %shown, "store open");
                (store.clone(), store)
            }
        };
        let (bus, nats, nats_bus): (Arc<dyn Bus>, _, _) = match config.bus.kind {
            BusKind::Inprocess => {
                (Arc::new(InProcessBus::new(config.limits.bus_capacity)), None, None)
            }
            BusKind::Nats => {
                let client = crate::cluster::connect(
                    &config.bus,
                    crate::cluster::Role::Gateway,
                    "millrace serve",
                )
                .await?;
                let url = crate::redact::redact(&config.bus.url);
                tracing::info!(%url, prefix = %config.bus.prefix, "bus on NATS");
                let bus = NatsBus::new(
                    client.clone(),
                    &config.bus.prefix,
                    Side::Gateway,
                    config.limits.bus_capacity,
                    &Shutdown::new(),
                )
                .share_tick_books(config.l3.worker_host().is_some());
                let bus = Arc::new(bus);
                (bus.clone(), Some(client), Some(bus))
            }
        };
        Ok(Backends { bus, store, backfill_store, nats, nats_bus, data_lock })
    }
}

/// A cluster worker's parts (see [`crate::cluster::worker`]): the cluster's PostgreSQL store
/// (read: where its kline tasks resume), the NATS bus (its forming candles), and an in-process
/// bus for the books it keeps for snapshot requests (published to nobody).
pub struct WorkerBackends {
    pub store: Arc<dyn CandleStore>,
    pub bus: Arc<dyn Bus>,
    pub local: Arc<dyn Bus>,
}

impl WorkerBackends {
    /// Opens `[store] url` and the bus on `client`; the bus's tasks end with `shutdown`.
    pub async fn open(
        config: &Config,
        client: async_nats::Client,
        shutdown: &Shutdown,
    ) -> Result<WorkerBackends, StartError> {
        let url = config.store.url.clone().unwrap_or_default();
        let shown = crate::redact::redact(&url);
        let store = blocking(move || PostgresStore::open(&url)).await.map_err(|source| {
            StartError::Store { path: format!("{shown} (configuration key `store.url`)"), source }
        })?;
        let bus = NatsBus::new(
            client,
            &config.bus.prefix,
            Side::Worker,
            config.limits.bus_capacity,
            shutdown,
        )
        .share_tick_books(config.l3.worker_host().is_some());
        Ok(WorkerBackends {
            store: Arc::new(store),
            bus: Arc::new(bus),
            local: Arc::new(InProcessBus::new(config.limits.bus_capacity)),
        })
    }
}

/// The service.
pub struct App {
    pub config: Config,
    pub store: Arc<dyn CandleStore>,
    pub bus: Arc<dyn Bus>,
    pub sources: Arc<Sources>,
    /// The candle jobs.
    pub supervisor: Supervisor,
    pub backfill: Backfill,
    pub metrics: Arc<Metrics>,
    /// Every order book millrace publishes (Binance depth jobs, tick-by-tick shards).
    pub books: Arc<BookRegistry>,
    /// The tick-by-tick books: sharded engine and its feeds, here or on a worker
    /// (`[l3] host`).
    pub l3: L3Access,
    /// The depth jobs (Binance order books synced into `books`): a supervisor of their own with
    /// the candle jobs' rules (pinned from `[depth]`, on-demand leases, capacity, reaper).
    pub depth: Supervisor,
    depth_runner: Arc<DepthRunner>,
    /// The simulators this process runs for its `sim` sources, by source name.
    simulators: Vec<(String, SimHandle)>,
    /// The gateway's parts, with `[cluster] enabled = true`.
    pub gateway: Option<Gateway>,
    /// The whole service's part of the shutdown; every subsystem's is a child of it.
    shutdown: Shutdown,
    /// The data directory's lock (SQLite store), released when the service is dropped.
    _data_lock: Option<Arc<DataDirLock>>,
}

/// What a gateway runs besides the service (see [`crate::cluster::gateway`]).
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

/// How often a gateway reads its sources' clocks (the bounds of what it reads from the bus).
const CLOCK_EVERY: Duration = Duration::from_secs(10);

impl App {
    /// What `/healthz` reports as wrong: the store's reads or writes failing, or its file found
    /// corrupt ([`CandleStore::problems`]); a kline job whose exchange's clock is behind the
    /// newest stored candle; in a cluster also NATS away (the client reconnects) or the
    /// persister's writes failing (its round is written again after a back-off).
    pub fn problems(&self) -> Vec<String> {
        let mut out = self.store.problems();
        for j in self.supervisor.snapshot().jobs {
            if let Some(ms) = j.exchange_behind_ms {
                out.push(format!(
                    "kline job {}: the exchange's clock is {} s behind the newest stored candle ({}); no candle closes until it catches up",
                    j.instrument,
                    ms / 1000,
                    j.last_closed_open_time.map_or_else(|| "?".to_string(), |t| t.to_string()),
                ));
            }
        }
        if let Some(g) = &self.gateway {
            if g.client.connection_state() != async_nats::connection::State::Connected {
                out.push("NATS (bus.url) is unreachable; reconnecting".to_string());
            }
            if let Some(why) = lock(&g.store_down).as_ref() {
                out.push(format!("the store (store.url) does not answer: {why}; retrying"));
            }
            if let Some(why) = self.l3.remote().and_then(|r| r.problem()) {
                out.push(why);
            }
            let since = g.persister.failing_since_ms.load(std::sync::atomic::Ordering::Relaxed);
            if since != 0 {
                let secs = (crate::clock::wall_clock_ms() - since).max(0) / 1000;
                out.push(format!(
                    "the persister cannot write closed candles to the store (store.url) for {secs} s; retrying"
                ));
            }
        }
        out
    }

    /// Opens the default bus and store and starts the service (see [`App::start_with`]).
    pub async fn start(config: Config) -> Result<App, StartError> {
        let backends = Backends::open(&config).await?;
        App::start_with(config, backends).await
    }

    /// Starts the embedded simulators and sources, the pinned jobs, the auto-start backfill tasks
    /// and the tick-by-tick books, on the given bus and store.
    pub async fn start_with(config: Config, backends: Backends) -> Result<App, StartError> {
        let Backends { bus, store, backfill_store, nats, nats_bus, data_lock } = backends;
        let shutdown = Shutdown::new();
        // The simulators stop with the service, after everything that talks to them.
        let (endpoints, simulators) =
            start_simulators(&config, &store, &shutdown.token().child_token()).await?;
        let sources =
            Sources::start(&config.sources, endpoints, &config.ingest.derived, &shutdown.child())
                .await?;
        let writer = CandleWriter::new(store.clone(), bus.clone());
        let gateway = match (config.cluster.enabled, nats) {
            (false, _) => None,
            (true, Some(client)) => Some(start_gateway(
                &config,
                client,
                nats_bus.clone(),
                &sources,
                writer.clone(),
                store.clone(),
                &shutdown,
            )),
            (true, None) => return Err(StartError::NotOnNats),
        };
        let runner: Arc<dyn JobRunner> = match &gateway {
            Some(g) => Arc::new(DemandRunner::new(
                shared::cluster::TaskKind::Kline,
                sources.clone(),
                g.demand.clone(),
            )),
            None => Arc::new(KlineRunner::new(&config, sources.clone(), writer.clone())),
        };
        let supervisor = Supervisor::new(JobKind::Kline, config.ingest.clone(), runner, &shutdown);
        supervisor.start(&config.pinned_instruments());
        let tasks = config.backfill_tasks();
        let backfill = {
            let (derived, sources, shutdown) =
                (config.ingest.derived.clone(), sources.clone(), shutdown.clone());
            blocking(move || {
                Backfill::new(&tasks, &derived, backfill_store, writer, sources, &shutdown)
            })
            .await
            .map_err(StartError::Backfill)?
        };
        match &gateway {
            None => backfill.start_configured(),
            // In a cluster the holder of the persister lease backfills (see `Backfill::lease`).
            Some(g) => {
                backfill.needs_lease();
                let (mut lead, backfill, stop) =
                    (g.lead.clone(), backfill.clone(), shutdown.clone());
                shutdown.spawn(async move {
                    loop {
                        tokio::select! {
                            changed = lead.changed() => if changed.is_err() { break },
                            () = stop.stopping() => break,
                        }
                        let held = *lead.borrow_and_update();
                        if let Err(e) = backfill.lease(held).await {
                            tracing::error!(
                                "cannot take over backfill: {}",
                                crate::error::report(&e)
                            );
                        }
                    }
                });
            }
        }
        let books = BookRegistry::new(bus.clone());
        let role = match &gateway {
            Some(g) => DepthRole::Gateway(
                ClusterBooks::new(
                    g.client.clone(),
                    g.subjects.clone(),
                    config.cluster.depth_stream_mb,
                    g.poison.clone(),
                ),
                g.demand.clone(),
            ),
            None => DepthRole::Alone,
        };
        let depth_runner = DepthRunner::new(&config, sources.clone(), books.clone(), role);
        let depth = Supervisor::new(
            JobKind::Depth,
            depth_runner.supervisor_config(),
            depth_runner.clone(),
            &shutdown,
        );
        depth.start(&config.pinned_depth_instruments());
        let l3 = match (&gateway, config.l3.worker_host()) {
            (Some(g), Some(_)) => {
                let mut names: Vec<String> =
                    tick_sources(&config, &sources).into_iter().map(|(name, _)| name).collect();
                names.extend(config.l3.replay.iter().map(|r| r.name.clone()));
                L3Access::Remote(RemoteL3::start(
                    g.client.clone(),
                    &g.subjects.prefix,
                    &config.l3.host,
                    names,
                    books.clone(),
                    Duration::from_millis(config.cluster.tick_ms.max(500)),
                    config.server.admin_token.clone(),
                    &shutdown,
                ))
            }
            _ => L3Access::Here(
                L3Books::start(
                    &config.l3,
                    books.clone(),
                    &tick_sources(&config, &sources),
                    config.server.admin_token.clone(),
                    &shutdown.child(),
                )
                .map_err(StartError::TickBooks)?,
            ),
        };
        Ok(App {
            config,
            store,
            bus,
            sources,
            supervisor,
            backfill,
            metrics: Arc::default(),
            books,
            depth,
            depth_runner,
            l3,
            simulators,
            gateway,
            shutdown,
            _data_lock: data_lock,
        })
    }

    /// The embedded simulator of source `name`, if millrace runs it.
    pub fn simulator(&self, name: &str) -> Option<&SimHandle> {
        self.simulators.iter().find(|(n, _)| n == name).map(|(_, s)| s)
    }

    /// The service's part of the shutdown (a child of it stops with the service).
    pub fn shutdown(&self) -> &Shutdown {
        &self.shutdown
    }

    /// A browser's subscription to `depth_update@{instrument}` / `depth@{instrument},N`: a lease
    /// on the instrument's depth job, starting it if needed (capacity rules as for candles).
    pub fn subscribe_depth(&self, instrument: &InstrumentId) -> Result<Lease, SubscribeError> {
        self.depth.subscribe_instrument(instrument, &format!("depth@{instrument}"), None)
    }

    /// [`App::subscribe_depth`] for a client at `owner` (its fair share and start rate apply).
    pub fn subscribe_depth_as(
        &self,
        instrument: &InstrumentId,
        owner: Option<crate::client_addr::ClientAddr>,
    ) -> Result<Lease, SubscribeError> {
        self.depth.subscribe_instrument(instrument, &format!("depth@{instrument}"), owner)
    }

    /// Depth jobs for ops: supervisor view (pinned, refcounts, crashes) plus each job's sync
    /// state and counters.
    pub fn depth_jobs_snapshot(&self) -> shared::protocol::ops::DepthJobsReport {
        self.depth_runner.snapshot(self.depth.snapshot())
    }

    /// Stops everything in order (see the module docs); buffered closed candles are flushed to
    /// the store. Returns whether every task and thread ended in time.
    pub async fn stop(&self) -> bool {
        self.l3.stop().await;
        let (kline, depth, backfill) = tokio::join!(
            self.supervisor.stop(Duration::from_secs(10)),
            self.depth.stop(Duration::from_secs(5)),
            self.backfill.shutdown(Duration::from_secs(5)),
        );
        if !kline {
            tracing::warn!("some ingest jobs did not stop within 10 s");
        }
        if !depth {
            tracing::warn!("some depth jobs did not stop within 5 s");
        }
        if !backfill {
            tracing::warn!("some backfill runs did not stop within 5 s");
        }
        let all = self.shutdown.stopped(Duration::from_secs(5)).await;
        for (_, sim) in &self.simulators {
            sim.shutdown();
            let _ = tokio::time::timeout(Duration::from_secs(5), sim.stopped()).await;
        }
        let store = self.store.clone();
        let _ = blocking(move || {
            store.close();
            Ok(())
        })
        .await;
        all && kline && depth && backfill
    }

    /// Depth jobs, published books and the tick-by-tick engine, for `/metrics`.
    fn render_book_metrics(&self, e: &mut Exposition) {
        let depth = self.depth_jobs_snapshot();
        e.single(
            "millrace_depth_ondemand_jobs",
            "gauge",
            "On-demand depth jobs running.",
            depth.capacity.ondemand_jobs,
        );
        e.single(
            "millrace_depth_refusals_total",
            "counter",
            "Depth subscriptions refused for capacity.",
            depth.capacity.refusals,
        );
        let per_job: [Column<shared::protocol::ops::JobReport>; 4] = [
            (
                "millrace_depth_job_connected",
                "gauge",
                "1 while the depth job's stream is connected.",
                |j| j.connected as u64,
            ),
            (
                "millrace_depth_job_crashes_total",
                "counter",
                "Upstream failures per depth job.",
                |j| j.crashes,
            ),
            (
                "millrace_depth_job_messages_total",
                "counter",
                "Upstream messages per depth job.",
                |j| j.messages,
            ),
            ("millrace_depth_job_subscribers", "gauge", "Live subscriptions per depth job.", |j| {
                j.subscribers as u64
            }),
        ];
        let rows: Vec<_> = depth.jobs.iter().map(|d| d.job.clone()).collect();
        e.table(&per_job, &rows, |j| vec![("instrument", j.instrument.to_string())]);
        let books = self.books.list();
        let per_book: [Column<shared::protocol::ops::BookInfo>; 7] = [
            (
                "millrace_book_publishing",
                "gauge",
                "1 while the book is published (synced or snapshot mode).",
                |b| b.status.health.is_publishable() as u64,
            ),
            (
                "millrace_book_gaps_total",
                "counter",
                "Upstream sequence / update-id gaps per book.",
                |b| b.status.gaps,
            ),
            ("millrace_book_resyncs_total", "counter", "Rebuilds from a snapshot per book.", |b| {
                b.status.resyncs
            }),
            (
                "millrace_book_drift_total",
                "counter",
                "Verifications that found the book different from a snapshot.",
                |b| b.status.drift,
            ),
            (
                "millrace_book_deltas_total",
                "counter",
                "depth_update deltas published per book.",
                |b| b.deltas,
            ),
            (
                "millrace_book_crossed_skipped_total",
                "counter",
                "Publishes skipped because the book was crossed.",
                |b| b.crossed_skipped,
            ),
            ("millrace_book_update_id", "gauge", "Last published update id per book.", |b| b.id),
        ];
        e.table(&per_book, &books, |b| {
            vec![("instrument", b.instrument.to_string()), ("source", b.source.clone())]
        });
        // A remote host's as last reported (none before it first answers).
        let Some(l3) = self.l3.engine() else { return };
        e.single(
            "millrace_l3_auto_balance",
            "gauge",
            "1 while automatic shard balancing is on.",
            l3.auto_balance as u64,
        );
        e.single(
            "millrace_l3_migrations_completed_total",
            "counter",
            "Symbol migrations completed.",
            l3.migrations.completed,
        );
        e.single(
            "millrace_l3_migrations_rejected_total",
            "counter",
            "Symbol migrations refused.",
            l3.migrations.rejected,
        );
        e.single(
            "millrace_l3_balancer_decisions_total",
            "counter",
            "Migrations asked for by the automatic policy.",
            l3.balancer_decisions,
        );
        let per_shard: [Column<shared::protocol::ops::ShardStats>; 5] = [
            ("millrace_l3_shard_pending", "gauge", "Events queued or held per shard.", |s| {
                s.pending
            }),
            ("millrace_l3_shard_processed_total", "counter", "Events processed per shard.", |s| {
                s.processed
            }),
            (
                "millrace_l3_shard_processed_per_second",
                "gauge",
                "Events processed per second per shard.",
                |s| s.processed_per_s,
            ),
            ("millrace_l3_shard_lag_ms", "gauge", "Age of the batch a shard is processing.", |s| {
                s.lag_ms
            }),
            ("millrace_l3_shard_symbols", "gauge", "Symbols per shard.", |s| s.symbols as u64),
        ];
        e.table(&per_shard, &l3.shards, |s| vec![("shard", s.id.to_string())]);
        let per_symbol: [Column<shared::protocol::ops::SymbolStats>; 4] = [
            ("millrace_l3_symbol_pending", "gauge", "Events pending per tick-by-tick book.", |s| {
                s.pending
            }),
            ("millrace_l3_symbol_shard", "gauge", "The shard a tick-by-tick book lives on.", |s| {
                s.shard as u64
            }),
            (
                "millrace_l3_symbol_gaps_total",
                "counter",
                "Sequence gaps per tick-by-tick book.",
                |s| s.gaps,
            ),
            (
                "millrace_l3_symbol_lag_ms",
                "gauge",
                "Dispatch-to-done time of the book's last batch.",
                |s| s.lag_ms,
            ),
        ];
        e.table(&per_symbol, &l3.symbols, |s| vec![("instrument", s.instrument.to_string())]);
    }

    /// `GET /metrics`; `cluster`: the leading supervisor's report, on a gateway (its workers'
    /// and its own refused bus messages are shown).
    pub fn render_metrics(&self, cluster: Option<&ClusterReport>) -> String {
        let mut e = Exposition::new();
        self.metrics.render(&mut e);
        if let Some(g) = &self.gateway {
            render_gateway_metrics(g, cluster, &mut e);
        }
        let snap = self.supervisor.snapshot();
        e.single(
            "millrace_ingest_ondemand_jobs",
            "gauge",
            "On-demand ingest jobs running.",
            snap.capacity.ondemand_jobs,
        );
        e.single(
            "millrace_ingest_pinned_jobs",
            "gauge",
            "Pinned ingest jobs running.",
            snap.capacity.pinned_jobs,
        );
        e.single(
            "millrace_ingest_ondemand_max_jobs",
            "gauge",
            "Capacity for on-demand jobs (0 = unlimited).",
            snap.capacity.ondemand_max_jobs,
        );
        e.single(
            "millrace_ingest_evictions_total",
            "counter",
            "Idle on-demand jobs evicted for capacity.",
            snap.capacity.evictions,
        );
        e.single(
            "millrace_ingest_refusals_total",
            "counter",
            "Subscriptions refused for capacity.",
            snap.capacity.refusals,
        );
        e.single(
            "millrace_ingest_reaped_total",
            "counter",
            "Idle on-demand jobs stopped by the reaper.",
            snap.capacity.reaped,
        );
        let per_job: [Column<shared::protocol::ops::JobReport>; 10] = [
            ("millrace_job_crashes_total", "counter", "Upstream failures per job.", |j| j.crashes),
            (
                "millrace_job_connected",
                "gauge",
                "1 while the job's upstream stream is connected.",
                |j| j.connected as u64,
            ),
            ("millrace_job_messages_total", "counter", "Upstream messages per job.", |j| {
                j.messages
            }),
            (
                "millrace_job_malformed_total",
                "counter",
                "Malformed or unexpected upstream messages per job.",
                |j| j.malformed,
            ),
            (
                "millrace_job_closed_candles_total",
                "counter",
                "Closed 1m candles accepted per job.",
                |j| j.closed_candles,
            ),
            (
                "millrace_job_gap_filled_candles_total",
                "counter",
                "Closed 1m candles fetched over REST to fill gaps.",
                |j| j.gap_filled_candles,
            ),
            (
                "millrace_job_persist_failures_total",
                "counter",
                "Failed persists (retried) per job.",
                |j| j.persist_failures,
            ),
            ("millrace_job_subscribers", "gauge", "Live subscriptions per job.", |j| {
                j.subscribers as u64
            }),
            ("millrace_job_pinned", "gauge", "1 for pinned jobs.", |j| j.pinned as u64),
            (
                "millrace_job_exchange_behind_ms",
                "gauge",
                "How far the exchange's clock is behind the newest stored candle (0: not behind).",
                |j| j.exchange_behind_ms.map_or(0, |ms| ms.max(0) as u64),
            ),
        ];
        e.table(&per_job, &snap.jobs, |j| vec![("instrument", j.instrument.to_string())]);
        let tasks = self.backfill.snapshot();
        e.family(
            "millrace_backfill_progress",
            "gauge",
            "Share of the retention window covered (0-1).",
        );
        for t in &tasks {
            e.sample(
                "millrace_backfill_progress",
                &[("series", &t.series.to_string())],
                t.progress,
            );
        }
        e.family(
            "millrace_backfill_candles_written",
            "gauge",
            "Candles written by the current or last run.",
        );
        for t in &tasks {
            e.sample(
                "millrace_backfill_candles_written",
                &[("series", &t.series.to_string())],
                t.candles_written,
            );
        }
        e.family("millrace_backfill_running", "gauge", "1 while a run is active.");
        for t in &tasks {
            e.sample(
                "millrace_backfill_running",
                &[("series", &t.series.to_string())],
                u64::from(t.running),
            );
        }
        self.render_book_metrics(&mut e);
        e.family("millrace_source_ready", "gauge", "1 when the source's symbols are loaded.");
        for s in self.sources.snapshot(false) {
            e.sample("millrace_source_ready", &[("source", &s.name)], u64::from(s.ready));
        }
        e.finish()
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

impl Gateway {
    /// The leading supervisor's report over NATS (request/reply), waiting at most `wait`.
    pub async fn cluster_report(
        &self,
        max_tasks: usize,
        wait: Duration,
    ) -> Result<ClusterReport, String> {
        let body = serde_json::to_vec(&ReportQuery { max_tasks }).expect("serialisable");
        let ask = self.client.request(self.subjects.report(), body.into());
        let answer = tokio::time::timeout(wait, ask)
            .await
            .map_err(|_| format!("no leading supervisor answered within {wait:?}"))?
            .map_err(|e| format!("no leading supervisor answered: {e}"))?;
        serde_json::from_slice(&answer.payload)
            .map_err(|e| format!("the supervisor's report did not parse: {e}"))
    }
}

/// Starts a gateway's demand publisher and persister (see [`crate::cluster::gateway`]), and
/// bounds what it reads from the bus by its sources' clocks.
fn start_gateway(
    config: &Config,
    client: async_nats::Client,
    nats_bus: Option<Arc<NatsBus>>,
    sources: &Arc<Sources>,
    writer: CandleWriter,
    store: Arc<dyn CandleStore>,
    shutdown: &Shutdown,
) -> Gateway {
    sources.keep_clocks(CLOCK_EVERY, shutdown);
    let bounds = ClusterBounds::new(
        sources.clone(),
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
        writer,
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
        store,
        store_down.clone(),
        Duration::from_millis(config.cluster.tick_ms),
    ));
    tracing::info!(%id, prefix = %subjects.prefix, "gateway of the cluster");
    Gateway { id, client, subjects, demand, persister, lead, store_down, bounds, poison, nats_bus }
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

/// Starts an embedded simulator for every `sim` source without URLs (stopping when `stop` is
/// cancelled); returns every source's endpoint (in order) and the simulators started. Their
/// control requests (`POST /sim/faults`, `POST /tbt/control`) take the admin token, like the
/// admin API (disabled without one).
///
/// A simulator's clock starts at the wall clock, or just after the newest 1m candle stored for
/// its symbols if that is later ([`sim_resume_ms`]): a run at `speed` 60 stores candles far
/// ahead of the wall clock, and a restarted simulator behind them would close no candle the
/// store does not already have until its clock caught up (minutes to hours).
async fn start_simulators(
    config: &Config,
    store: &Arc<dyn CandleStore>,
    stop: &tokio_util::sync::CancellationToken,
) -> Result<(Vec<Endpoint>, Vec<(String, SimHandle)>), StartError> {
    let mut endpoints = Vec::new();
    let mut simulators = Vec::new();
    for sc in &config.sources {
        let Some(product) = binance::Product::of_market(sc.market) else {
            return Err(crate::sources::SourceError::NotBinance {
                name: sc.name.clone(),
                market: sc.market,
            }
            .into());
        };
        let endpoint = match (sc.kind, &sc.rest_base, &sc.ws_base) {
            (SourceKind::Sim, None, None) => {
                let mut config = SimConfig {
                    seed: sc.seed,
                    speed: sc.speed,
                    control_token: config.server.admin_token.clone(),
                    ..SimConfig::default()
                };
                config.start_ms = sim_resume_ms(store, sc, &config.symbols).await?;
                let span = tracing::info_span!("simulator", source = %sc.name);
                let sim = Sim::start_until(config, sc.sim_addr, stop.clone())
                    .instrument(span)
                    .await
                    .map_err(|source| StartError::Simulator { name: sc.name.clone(), source })?;
                // The simulator serves USD-M futures under /fapi (REST and streams).
                let ws_base = match product {
                    binance::Product::Spot => sim.ws_base(),
                    binance::Product::Futures => sim.futures_ws_base(),
                };
                let endpoint = Endpoint { rest_base: sim.rest_base(), ws_base, embedded: true };
                tracing::info!(source = %sc.name, rest = %endpoint.rest_base, ws = %endpoint.ws_base, speed = sc.speed, "embedded simulator started");
                simulators.push((sc.name.clone(), sim));
                endpoint
            }
            _ => Endpoint::remote(sc, product),
        };
        endpoints.push(endpoint);
    }
    Ok((endpoints, simulators))
}

/// Where an embedded simulator's clock starts: `None` (the wall clock) unless the store holds a
/// 1m candle of one of its symbols that closes later, then that close time (the minute after the
/// newest stored candle), so ingest resumes at once whatever speed the earlier run had.
async fn sim_resume_ms(
    store: &Arc<dyn CandleStore>,
    sc: &SourceConfig,
    symbols: &[sim::SymbolSpec],
) -> Result<Option<i64>, StartError> {
    let series: Vec<SeriesId> = symbols
        .iter()
        .map(|s| SeriesId {
            instrument: InstrumentId::new(
                sc.name.clone(),
                sc.market,
                format!("{}/{}", s.base, s.quote),
            ),
            timeframe: Timeframe::M1,
        })
        .collect();
    let s = store.clone();
    let last = blocking(move || s.last_open_times(&series))
        .await
        .map_err(|source| StartError::SimResume { name: sc.name.clone(), source })?
        .into_iter()
        .flatten()
        .max();
    let wall = crate::clock::wall_clock_ms();
    Ok(match last {
        Some(open) if open + MINUTE_MS > wall => {
            let resume = open + MINUTE_MS;
            tracing::info!(
                source = %sc.name,
                resume_ms = resume,
                ahead_s = (resume - wall) / 1000,
                "the simulator resumes after the newest stored candle (ahead of the wall clock)"
            );
            Some(resume)
        }
        _ => None,
    })
}

/// `(source name, simulator base URL)` of every simulator whose tick-by-tick feed the books
/// follow: each `sim` source once per simulator (a spot and a futures source may share one).
pub(crate) fn tick_sources(config: &Config, sources: &Sources) -> Vec<(String, String)> {
    if !config.l3.sim_feeds {
        return Vec::new();
    }
    let mut seen = std::collections::HashSet::new();
    sources
        .all()
        .iter()
        .filter(|s| s.config.kind == SourceKind::Sim)
        .filter(|s| seen.insert(s.endpoint.rest_base.clone()))
        .map(|s| (s.config.name.clone(), s.endpoint.rest_base.clone()))
        .collect()
}
