//! The composition root of the service: the running service, assembled. [`App::start`] builds it
//! from a [`Config`] — the only place that names concrete parts ([`InProcessBus`],
//! [`SqliteStore`], the embedded simulator); [`App::start_with`] takes the bus and the store from
//! the caller (tests run the service on other implementations). [`App::stop`] stops it in order
//! — the tick-by-tick books, then the jobs and backfill runs (which flush their buffered closed
//! candles into the store), then the sources' background work and the embedded simulators, then
//! the store — so a graceful shutdown loses nothing and leaves no task or thread behind.
//!
//! **Plug points.** A second way of running wraps the service instead of threading through it
//! ([`Layer`]): the service offers [`Plugs`] — who runs the kline jobs, where depth comes from
//! and what a running depth job holds, when backfill may run, where the tick-by-tick books are,
//! and an [`Extension`] of `/healthz`, `/metrics` and the operations API — and a layer fills
//! them from the service's [`Parts`]. The cluster's gateway is such a layer
//! (`crate::cluster::gateway`); the single process fills none. Nothing here knows the cluster.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use shared::candle::{Timeframe, MINUTE_MS};
use shared::protocol::ops::{ClusterReport, DepthJobsReport, JobKind};
use shared::protocol::{InstrumentId, Market, SeriesId};
use sim::{Sim, SimConfig, SimHandle};
use tracing::Instrument as _;

use crate::books::depth_job::DepthRunner;
use crate::books::upstream::DepthSource;
use crate::books::BookRegistry;
use crate::bus::{Bus, InProcessBus};
use crate::candles::backfill::Backfill;
use crate::candles::kline_job::KlineRunner;
use crate::candles::writer::CandleWriter;
use crate::config::StoreKind;
use crate::config::{Config, SourceConfig, SourceKind};
use crate::jobs::supervisor::JobRunner;
use crate::jobs::{Lease, SubscribeError, Supervisor};
use crate::l3::remote::{L3Access, RemoteBooks};
use crate::l3::L3Books;
use crate::metrics::Metrics;
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
    #[error("cannot start the tick-by-tick books")]
    TickBooks(#[source] crate::l3::L3Error),
    #[error("cannot start the recorder (record.dir)")]
    Recording(#[source] std::io::Error),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("cannot play the recording of source {name}")]
    Playback {
        name: String,
        #[source]
        source: crate::playback::PlaybackError,
    },
}

/// The bus and the store the service runs on.
#[derive(Clone)]
pub struct Backends {
    pub bus: Arc<dyn Bus>,
    pub store: Arc<dyn CandleStore>,
    pub backfill_store: Arc<dyn BackfillStore>,
    /// The data directory's lock, with the SQLite store: held as long as the service runs.
    pub data_lock: Option<Arc<DataDirLock>>,
}

/// The store `[store]` names, for [`Backends`].
pub struct Stores {
    pub store: Arc<dyn CandleStore>,
    pub backfill_store: Arc<dyn BackfillStore>,
    pub data_lock: Option<Arc<DataDirLock>>,
}

impl Stores {
    /// The SQLite file of the data directory (locked first: a second server on it is refused,
    /// [`DirLockError::Held`]), or PostgreSQL at `store.url` (an unreachable server is an error
    /// naming the key).
    pub async fn open(config: &Config) -> Result<Stores, StartError> {
        match config.store.kind {
            StoreKind::Sqlite => {
                // A few file-system calls, once at start.
                let data_lock = Arc::new(DataDirLock::acquire(&config.server.data_dir)?);
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
                Ok(Stores {
                    store: store.clone(),
                    backfill_store: store,
                    data_lock: Some(data_lock),
                })
            }
            StoreKind::Postgres => {
                let store = open_postgres(config).await?;
                Ok(Stores { store: store.clone(), backfill_store: store, data_lock: None })
            }
        }
    }

    /// These stores with `bus`.
    pub fn with_bus(self, bus: Arc<dyn Bus>) -> Backends {
        Backends {
            bus,
            store: self.store,
            backfill_store: self.backfill_store,
            data_lock: self.data_lock,
        }
    }
}

/// PostgreSQL at `store.url` (a cluster's shared history), with `[store]`'s pool and TLS.
pub async fn open_postgres(config: &Config) -> Result<Arc<PostgresStore>, StartError> {
    let url = config.store.url.clone().unwrap_or_default();
    let shown = crate::redact::redact(&url);
    let options = crate::store::postgres::PgOptions::from_config(&config.store);
    let store = blocking(move || PostgresStore::open_with(&url, options))
        .await
        .map(Arc::new)
        .map_err(|source| StartError::Store {
            path: format!("{shown} (configuration key `store.url`)"),
            source,
        })?;
    tracing::info!(db = %shown, "store open");
    Ok(store)
}

impl Backends {
    /// The in-process bus and the store `[store]` names (see [`Stores::open`]).
    pub async fn open(config: &Config) -> Result<Backends, StartError> {
        let bus = Arc::new(InProcessBus::new(config.limits.bus_capacity));
        Ok(Stores::open(config).await?.with_bus(bus))
    }
}

/// What a layer around the service adds to `/healthz`, `/metrics` and the operations API.
pub trait Extension: Send + Sync + 'static {
    /// What `/healthz` reports as wrong, besides the service's own problems.
    fn problems(&self) -> Vec<String>;
    /// More of `/metrics` (Prometheus text: whole families).
    fn metrics(&self) -> BoxFuture<'_, String>;
    /// `GET /api/v1/ops/cluster`: the cluster's report (`Err`: why there is none).
    fn cluster_report(&self, max_tasks: usize)
        -> BoxFuture<'_, Result<ClusterReport, Unavailable>>;
}

/// Why a layer cannot answer now (`503`), said for a person.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unavailable(pub String);

/// Wraps the depth jobs' runner (see [`Plugs::depth_jobs`]).
pub type WrapRunner = Box<dyn FnOnce(Arc<DepthRunner>) -> Arc<dyn JobRunner> + Send>;

/// The plug points of the service (see the module docs). `Plugs::default()` is one process.
#[derive(Default)]
pub struct Plugs {
    /// Runs the kline "jobs" instead of ingesting the exchange (a gateway's hold demands).
    pub kline_jobs: Option<Arc<dyn JobRunner>>,
    /// Where the depth jobs' diffs and snapshots come from instead of the exchange.
    pub depth_source: Option<Arc<dyn DepthSource>>,
    /// Wraps the depth jobs' runner (a gateway's: a running job is a demand).
    pub depth_jobs: Option<WrapRunner>,
    /// Backfill runs only while this says so (a gateway's: while it holds the persister
    /// lease); `None`: always.
    pub backfill_lease: Option<tokio::sync::watch::Receiver<bool>>,
    /// The tick-by-tick books run in another process.
    pub remote_books: Option<Arc<dyn RemoteBooks>>,
    pub extension: Option<Arc<dyn Extension>>,
}

/// The parts of the service a [`Layer`] makes its plugs from.
pub struct Parts<'a> {
    pub config: &'a Config,
    pub sources: &'a Arc<Sources>,
    pub store: &'a Arc<dyn CandleStore>,
    /// Stores, then publishes.
    pub writer: &'a CandleWriter,
    pub books: &'a Arc<BookRegistry>,
    /// The service's part of the shutdown: the layer's tasks stop with the service.
    pub shutdown: &'a Shutdown,
}

/// A second way of running, wrapped around the service (see the module docs).
pub trait Layer {
    fn plugs(self: Box<Self>, parts: &Parts<'_>) -> Plugs;
}

/// The service.
pub struct App {
    config: Config,
    store: Arc<dyn CandleStore>,
    bus: Arc<dyn Bus>,
    sources: Arc<Sources>,
    /// The candle jobs.
    supervisor: Supervisor,
    backfill: Backfill,
    metrics: Arc<Metrics>,
    /// Every order book millrace publishes (Binance depth jobs, tick-by-tick shards).
    books: Arc<BookRegistry>,
    /// The tick-by-tick books: sharded engine and its feeds, here or elsewhere.
    l3: L3Access,
    /// The depth jobs (Binance order books synced into `books`): a supervisor of their own with
    /// the candle jobs' rules (pinned from `[depth]`, on-demand leases, capacity, reaper).
    depth: Supervisor,
    depth_runner: Arc<DepthRunner>,
    /// The simulators this process runs for its `sim` sources, by source name.
    simulators: Vec<(String, SimHandle)>,
    /// The recordings played back as sources (`kind = "recording"`).
    players: Vec<crate::playback::Player>,
    /// What a layer around the service added (see [`Extension`]).
    extension: Option<Arc<dyn Extension>>,
    /// The recorder of upstream frames (`[record]`).
    recording: Arc<crate::recording::Recording>,
    /// The whole service's part of the shutdown; every subsystem's is a child of it.
    shutdown: Shutdown,
    /// The data directory's lock (SQLite store), released when the service is dropped.
    _data_lock: Option<Arc<DataDirLock>>,
}

impl App {
    /// What `/healthz` reports as wrong: the store's reads or writes failing, or its file found
    /// corrupt ([`CandleStore::problems`]); a kline job whose exchange's clock is behind the
    /// newest stored candle; the tick-by-tick books elsewhere not answering; and what a layer
    /// adds ([`Extension::problems`]).
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
        if let Some(why) = self.l3.remote().and_then(|r| r.problem()) {
            out.push(why);
        }
        if let Some(x) = &self.extension {
            out.extend(x.problems());
        }
        out
    }

    /// Opens the in-process bus and the store and starts the service (see [`App::start_with`]).
    pub async fn start(config: Config) -> Result<App, StartError> {
        let backends = Backends::open(&config).await?;
        App::start_with(config, backends).await
    }

    /// Starts the embedded simulators and sources, the pinned jobs, the auto-start backfill tasks
    /// and the tick-by-tick books, on the given bus and store.
    pub async fn start_with(config: Config, backends: Backends) -> Result<App, StartError> {
        App::start_layered(config, backends, None).await
    }

    /// [`App::start_with`] with a `layer` around the service (see the module docs).
    pub async fn start_layered(
        config: Config,
        backends: Backends,
        layer: Option<Box<dyn Layer + Send>>,
    ) -> Result<App, StartError> {
        let Backends { bus, store, backfill_store, data_lock } = backends;
        let mut config = config;
        config.resolve_recordings()?;
        let shutdown = Shutdown::new();
        // The simulators stop with the service, after everything that talks to them.
        let (mut endpoints, simulators) =
            start_simulators(&config, &store, &shutdown.token().child_token()).await?;
        let players = start_players(&config, &mut endpoints, &shutdown.child()).await?;
        let extra = simulated_venues(&config, &endpoints);
        let recording = crate::recording::Recording::start(&config, &shutdown.child())
            .map_err(StartError::Recording)?;
        let sources = Sources::start_with(
            &config.sources,
            endpoints,
            extra,
            &config.ingest.derived,
            Some(&recording),
            &shutdown.child(),
        )
        .await?;
        let writer = CandleWriter::new(store.clone(), bus.clone());
        let books = BookRegistry::new(bus.clone());
        let plugs = match layer {
            Some(layer) => {
                let parts = Parts {
                    config: &config,
                    sources: &sources,
                    store: &store,
                    writer: &writer,
                    books: &books,
                    shutdown: &shutdown,
                };
                layer.plugs(&parts)
            }
            None => Plugs::default(),
        };
        let runner: Arc<dyn JobRunner> = match plugs.kline_jobs {
            Some(runner) => runner,
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
        match plugs.backfill_lease {
            None => backfill.start_configured(),
            Some(mut lease) => {
                backfill.needs_lease();
                let (backfill, stop) = (backfill.clone(), shutdown.clone());
                shutdown.spawn(async move {
                    loop {
                        tokio::select! {
                            changed = lease.changed() => if changed.is_err() { break },
                            () = stop.stopping() => break,
                        }
                        let held = *lease.borrow_and_update();
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
        let mut depth_runner = DepthRunner::new(&config, sources.clone(), books.clone());
        if let Some(source) = plugs.depth_source {
            depth_runner = depth_runner.with_source(source);
        }
        let depth_runner = Arc::new(depth_runner);
        let depth_jobs: Arc<dyn JobRunner> = match plugs.depth_jobs {
            Some(wrap) => wrap(depth_runner.clone()),
            None => depth_runner.clone(),
        };
        let depth = Supervisor::new(
            JobKind::Depth,
            depth_runner.supervisor_config(),
            depth_jobs,
            &shutdown,
        );
        depth.start(&config.pinned_depth_instruments());
        let l3 = match plugs.remote_books {
            Some(remote) => L3Access::Remote(remote),
            None => L3Access::Here(
                L3Books::start(
                    &config.l3,
                    books.clone(),
                    &crate::l3::sim_feeds(&config, &sources),
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
            players,
            extension: plugs.extension,
            recording,
            shutdown,
            _data_lock: data_lock,
        })
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn store(&self) -> &Arc<dyn CandleStore> {
        &self.store
    }

    pub fn bus(&self) -> &Arc<dyn Bus> {
        &self.bus
    }

    /// The recorder of upstream frames.
    pub fn recording(&self) -> &Arc<crate::recording::Recording> {
        &self.recording
    }

    pub fn sources(&self) -> &Arc<Sources> {
        &self.sources
    }

    /// The kline jobs' supervisor.
    pub fn supervisor(&self) -> &Supervisor {
        &self.supervisor
    }

    /// The depth jobs' supervisor.
    pub fn depth(&self) -> &Supervisor {
        &self.depth
    }

    pub fn backfill(&self) -> &Backfill {
        &self.backfill
    }

    /// Process-wide counters (`/metrics`).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Every published book.
    pub fn books(&self) -> &Arc<BookRegistry> {
        &self.books
    }

    /// The tick-by-tick books, here or elsewhere.
    pub fn l3(&self) -> &L3Access {
        &self.l3
    }

    /// What a layer around the service added, if any.
    pub fn extension(&self) -> Option<&Arc<dyn Extension>> {
        self.extension.as_ref()
    }

    /// The recordings played back as sources.
    pub fn players(&self) -> &[crate::playback::Player] {
        &self.players
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
    pub fn depth_jobs_snapshot(&self) -> DepthJobsReport {
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

/// Starts a player for every `recording` source and points its endpoint at it.
async fn start_players(
    config: &Config,
    endpoints: &mut [Endpoint],
    shutdown: &Shutdown,
) -> Result<Vec<crate::playback::Player>, StartError> {
    let mut players = Vec::new();
    for (sc, endpoint) in config.sources.iter().zip(endpoints.iter_mut()) {
        let Some(playback) = &sc.playback else { continue };
        let player = crate::playback::Player::start(&sc.name, playback, shutdown)
            .await
            .map_err(|source| StartError::Playback { name: sc.name.clone(), source })?;
        *endpoint =
            Endpoint { rest_base: player.rest_base(), ws_base: player.ws_base(), embedded: true };
        players.push(player);
    }
    Ok(players)
}

/// The other venues an embedded simulator serves (`venues = true`): a source per dialect,
/// `{name}-okx` and so on, at the simulator's paths, unless a configured source has that name.
fn simulated_venues(config: &Config, endpoints: &[Endpoint]) -> Vec<(SourceConfig, Endpoint)> {
    let mut out = Vec::new();
    for (sc, e) in config.sources.iter().zip(endpoints) {
        if sc.kind != SourceKind::Sim
            || !e.embedded
            || !sc.venues
            || sc.market != shared::protocol::Market::Spot
        {
            continue;
        }
        for dialect in crate::venue::SIM_DIALECTS {
            let name = format!("{}-{}", sc.name, dialect.as_str());
            if config.sources.iter().any(|s| s.name == name) {
                continue;
            }
            let (rest_base, ws_base) =
                crate::venue::sim_urls(dialect, Market::Spot, &e.rest_base, &e.ws_base);
            let venue = SourceConfig {
                name,
                kind: shared::protocol::ops::SourceKind::of_dialect(dialect),
                market: shared::protocol::Market::Spot,
                rest_base: Some(rest_base.clone()),
                ws_base: Some(ws_base.clone()),
                venues: false,
                ..sc.clone()
            };
            out.push((venue, Endpoint { rest_base, ws_base, embedded: true }));
        }
    }
    out
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
