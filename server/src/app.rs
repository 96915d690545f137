//! The running service, assembled: store, bus, sources (with embedded simulators), ingest
//! supervisor with its kline jobs, and backfill. [`App::start`] builds it from a [`Config`];
//! [`App::stop`] stops it in order — no new subscriptions, backfill runs end, ingest jobs flush
//! their buffered closed candles into the store — so a graceful shutdown loses nothing.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use shared::protocol::{InstrumentId, SeriesId};

use crate::backfill::Backfill;
use crate::books::l3::L3Books;
use crate::books::BookRegistry;
use crate::bus::InProcessBus;
use crate::config::Config;
use crate::ingest::depth_job::{DepthJobsSnapshot, DepthRunner};
use crate::ingest::kline_job::{self, KlineJobDeps};
use crate::ingest::pipeline::Publisher;
use crate::ingest::supervisor::{JobContext, JobFuture, JobRunner, Supervisor};
use crate::ingest::{Lease, SubscribeError};
use crate::metrics::{Column, Exposition, Metrics};
use crate::sources::Sources;
use crate::store::sqlite::SqliteStore;
use crate::store::CandleStore;

/// The service.
pub struct App {
    pub config: Config,
    pub store: Arc<dyn CandleStore>,
    pub bus: Arc<InProcessBus>,
    pub sources: Arc<Sources>,
    pub supervisor: Supervisor,
    pub backfill: Backfill,
    pub metrics: Arc<Metrics>,
    /// Every order book millrace publishes (Binance depth jobs, tick-by-tick shards).
    pub books: Arc<BookRegistry>,
    /// The tick-by-tick books: sharded engine and its feeds.
    pub l3: Arc<L3Books>,
    /// The depth jobs (Binance order books synced into `books`): a supervisor of their own with
    /// the candle jobs' rules (pinned from `[depth]`, on-demand leases, capacity, reaper).
    pub depth: Supervisor,
    depth_runner: Arc<DepthRunner>,
}

/// Starts kline jobs for the supervisor.
struct KlineRunner {
    config: Config,
    sources: Arc<Sources>,
    store: Arc<dyn CandleStore>,
    bus: Arc<dyn Publisher>,
}

impl JobRunner for KlineRunner {
    fn validate(&self, series: &SeriesId) -> Result<(), String> {
        self.sources.validate_series(series)
    }

    fn run(&self, ctx: JobContext) -> JobFuture {
        let sources = self.sources.clone();
        let config = self.config.ingest.clone();
        let store = self.store.clone();
        let bus = self.bus.clone();
        Box::pin(async move {
            let mut ctx = ctx;
            let Some((source, symbol)) = crate::ingest::resolve_source(&sources, &mut ctx).await else { return };
            let deps = KlineJobDeps {
                config,
                rest: source.rest.clone(),
                ws_base: source.ws_base.clone(),
                symbol,
                store,
                bus,
            };
            kline_job::run(ctx, deps).await;
        })
    }
}

impl App {
    /// Opens the store, starts sources (and simulators), the pinned ingest jobs and the
    /// auto-start backfill tasks.
    pub async fn start(config: Config) -> anyhow::Result<App> {
        let db = config.db_path();
        let store: Arc<dyn CandleStore> = {
            let path = db.clone();
            let s = tokio::task::spawn_blocking(move || SqliteStore::open(&path))
                .await
                .context("store task failed")?
                .with_context(|| format!("cannot open the database {}", db.display()))?;
            Arc::new(s)
        };
        tracing::info!(db = %db.display(), "store open");
        let bus = Arc::new(InProcessBus::new(config.limits.bus_capacity));
        let sources = Sources::start(&config).await?;
        let publisher: Arc<dyn Publisher> = bus.clone();
        let runner = KlineRunner {
            config: config.clone(),
            sources: sources.clone(),
            store: store.clone(),
            bus: publisher.clone(),
        };
        let supervisor = Supervisor::new(config.ingest.clone(), Arc::new(runner));
        supervisor.start(&config.pinned_instruments());
        let backfill = Backfill::new(&config.backfill, &config.ingest.derived, store.clone(), publisher, sources.clone())
            .context("cannot load backfill progress")?;
        backfill.start_configured();
        let books = BookRegistry::new(bus.clone());
        let depth_runner = DepthRunner::new(&config, sources.clone(), books.clone());
        let depth = Supervisor::with_kind("depth", depth_runner.supervisor_config(), depth_runner.clone());
        depth.start(&config.pinned_depth_instruments());
        let l3 = L3Books::start(&config.l3, books.clone(), &tick_sources(&config, &sources))?;
        Ok(App { config, store, bus, sources, supervisor, backfill, metrics: Arc::default(), books, depth, depth_runner, l3 })
    }

    /// A browser's subscription to `depth_update@{instrument}` / `depth@{instrument},N`: a lease
    /// on the instrument's depth job, starting it if needed (capacity rules as for candles).
    pub fn subscribe_depth(&self, instrument: &InstrumentId) -> Result<Lease, SubscribeError> {
        self.depth.subscribe_instrument(instrument, &format!("depth@{instrument}"))
    }

    /// Depth jobs for ops: supervisor view (pinned, refcounts, crashes) plus each job's sync
    /// state and counters.
    pub fn depth_jobs_snapshot(&self) -> DepthJobsSnapshot {
        self.depth_runner.snapshot(self.depth.snapshot())
    }

    /// Stops everything in order; buffered closed candles are flushed to the store.
    pub async fn stop(&self) {
        self.l3.stop().await;
        self.supervisor.shutdown();
        self.depth.shutdown();
        self.backfill.shutdown(Duration::from_secs(5)).await;
        if !self.supervisor.wait_stopped(Duration::from_secs(10)).await {
            tracing::warn!("some ingest jobs did not stop within 10 s");
        }
        if !self.depth.wait_stopped(Duration::from_secs(5)).await {
            tracing::warn!("some depth jobs did not stop within 5 s");
        }
        for s in self.sources.all() {
            if let Some(sim) = &s.sim {
                sim.shutdown();
            }
        }
    }

    /// Depth jobs, published books and the tick-by-tick engine, for `/metrics`.
    fn render_book_metrics(&self, e: &mut Exposition) {
        let depth = self.depth_jobs_snapshot();
        e.single("millrace_depth_ondemand_jobs", "gauge", "On-demand depth jobs running.", depth.capacity.ondemand_jobs);
        e.single("millrace_depth_refusals_total", "counter", "Depth subscriptions refused for capacity.", depth.capacity.refusals);
        let per_job: [Column<crate::ingest::supervisor::JobSnapshot>; 4] = [
            ("millrace_depth_job_connected", "gauge", "1 while the depth job's stream is connected.", |j| j.connected as u64),
            ("millrace_depth_job_crashes_total", "counter", "Upstream failures per depth job.", |j| j.crashes),
            ("millrace_depth_job_messages_total", "counter", "Upstream messages per depth job.", |j| j.messages),
            ("millrace_depth_job_subscribers", "gauge", "Live subscriptions per depth job.", |j| j.subscribers as u64),
        ];
        let rows: Vec<_> = depth.jobs.iter().map(|d| d.job.clone()).collect();
        e.table(&per_job, &rows, |j| vec![("instrument", j.instrument.clone())]);
        let books = self.books.list();
        let per_book: [Column<crate::books::BookInfo>; 7] = [
            ("millrace_book_publishing", "gauge", "1 while the book is published (synced or snapshot mode).", |b| {
                b.status.health.is_publishable() as u64
            }),
            ("millrace_book_gaps_total", "counter", "Upstream sequence / update-id gaps per book.", |b| b.status.gaps),
            ("millrace_book_resyncs_total", "counter", "Rebuilds from a snapshot per book.", |b| b.status.resyncs),
            ("millrace_book_drift_total", "counter", "Verifications that found the book different from a snapshot.", |b| b.status.drift),
            ("millrace_book_deltas_total", "counter", "depth_update deltas published per book.", |b| b.deltas),
            ("millrace_book_crossed_skipped_total", "counter", "Publishes skipped because the book was crossed.", |b| b.crossed_skipped),
            ("millrace_book_update_id", "gauge", "Last published update id per book.", |b| b.id),
        ];
        e.table(&per_book, &books, |b| vec![("instrument", b.instrument.to_string()), ("source", b.source.clone())]);
        let l3 = self.l3.handle.stats();
        e.single("millrace_l3_auto_balance", "gauge", "1 while automatic shard balancing is on.", l3.auto_balance as u64);
        e.single("millrace_l3_migrations_completed_total", "counter", "Symbol migrations completed.", l3.migrations.completed);
        e.single("millrace_l3_migrations_rejected_total", "counter", "Symbol migrations refused.", l3.migrations.rejected);
        e.single("millrace_l3_balancer_decisions_total", "counter", "Migrations asked for by the automatic policy.", l3.balancer_decisions);
        let per_shard: [Column<crate::l3engine::ShardStats>; 5] = [
            ("millrace_l3_shard_pending", "gauge", "Events queued or held per shard.", |s| s.pending),
            ("millrace_l3_shard_processed_total", "counter", "Events processed per shard.", |s| s.processed),
            ("millrace_l3_shard_processed_per_second", "gauge", "Events processed per second per shard.", |s| s.processed_per_s),
            ("millrace_l3_shard_lag_ms", "gauge", "Age of the batch a shard is processing.", |s| s.lag_ms),
            ("millrace_l3_shard_symbols", "gauge", "Symbols per shard.", |s| s.symbols as u64),
        ];
        e.table(&per_shard, &l3.shards, |s| vec![("shard", s.id.to_string())]);
        let per_symbol: [Column<crate::l3engine::SymbolStats>; 4] = [
            ("millrace_l3_symbol_pending", "gauge", "Events pending per tick-by-tick book.", |s| s.pending),
            ("millrace_l3_symbol_shard", "gauge", "The shard a tick-by-tick book lives on.", |s| s.shard as u64),
            ("millrace_l3_symbol_gaps_total", "counter", "Sequence gaps per tick-by-tick book.", |s| s.gaps),
            ("millrace_l3_symbol_lag_ms", "gauge", "Dispatch-to-done time of the book's last batch.", |s| s.lag_ms),
        ];
        e.table(&per_symbol, &l3.symbols, |s| vec![("instrument", s.instrument.clone())]);
    }

    /// `GET /metrics`.
    pub fn render_metrics(&self) -> String {
        let mut e = Exposition::new();
        self.metrics.render(&mut e);
        let snap = self.supervisor.snapshot();
        e.single("millrace_ingest_ondemand_jobs", "gauge", "On-demand ingest jobs running.", snap.capacity.ondemand_jobs);
        e.single("millrace_ingest_pinned_jobs", "gauge", "Pinned ingest jobs running.", snap.capacity.pinned_jobs);
        e.single("millrace_ingest_ondemand_max_jobs", "gauge", "Capacity for on-demand jobs (0 = unlimited).", snap.capacity.ondemand_max_jobs);
        e.single("millrace_ingest_evictions_total", "counter", "Idle on-demand jobs evicted for capacity.", snap.capacity.evictions);
        e.single("millrace_ingest_refusals_total", "counter", "Subscriptions refused for capacity.", snap.capacity.refusals);
        e.single("millrace_ingest_reaped_total", "counter", "Idle on-demand jobs stopped by the reaper.", snap.capacity.reaped);
        let per_job: [Column<crate::ingest::supervisor::JobSnapshot>; 9] = [
            ("millrace_job_crashes_total", "counter", "Upstream failures per job.", |j| j.crashes),
            ("millrace_job_connected", "gauge", "1 while the job's upstream stream is connected.", |j| j.connected as u64),
            ("millrace_job_messages_total", "counter", "Upstream messages per job.", |j| j.messages),
            ("millrace_job_malformed_total", "counter", "Malformed or unexpected upstream messages per job.", |j| j.malformed),
            ("millrace_job_closed_candles_total", "counter", "Closed 1m candles accepted per job.", |j| j.closed_candles),
            ("millrace_job_gap_filled_candles_total", "counter", "Closed 1m candles fetched over REST to fill gaps.", |j| j.gap_filled_candles),
            ("millrace_job_persist_failures_total", "counter", "Failed persists (retried) per job.", |j| j.persist_failures),
            ("millrace_job_subscribers", "gauge", "Live subscriptions per job.", |j| j.subscribers as u64),
            ("millrace_job_pinned", "gauge", "1 for pinned jobs.", |j| j.pinned as u64),
        ];
        e.table(&per_job, &snap.jobs, |j| vec![("instrument", j.instrument.clone())]);
        let tasks = self.backfill.snapshot();
        e.family("millrace_backfill_progress", "gauge", "Share of the retention window covered (0-1).");
        for t in &tasks {
            e.sample("millrace_backfill_progress", &[("series", &t.series)], t.progress);
        }
        e.family("millrace_backfill_candles_written", "gauge", "Candles written by the current or last run.");
        for t in &tasks {
            e.sample("millrace_backfill_candles_written", &[("series", &t.series)], t.candles_written);
        }
        e.family("millrace_backfill_running", "gauge", "1 while a run is active.");
        for t in &tasks {
            e.sample("millrace_backfill_running", &[("series", &t.series)], t.running as u64);
        }
        self.render_book_metrics(&mut e);
        e.family("millrace_source_ready", "gauge", "1 when the source's symbols are loaded.");
        for s in self.sources.snapshot() {
            let name = s["name"].as_str().unwrap_or_default().to_string();
            e.sample("millrace_source_ready", &[("source", &name)], s["ready"].as_bool().unwrap_or(false) as u64);
        }
        e.finish()
    }
}

/// `(source name, simulator base URL)` of every simulator whose tick-by-tick feed the books
/// follow: each `sim` source once per simulator (a spot and a futures source may share one).
fn tick_sources(config: &Config, sources: &Sources) -> Vec<(String, String)> {
    if !config.l3.sim_feeds {
        return Vec::new();
    }
    let mut seen = std::collections::HashSet::new();
    sources
        .all()
        .iter()
        .filter(|s| s.config.kind == crate::config::SourceKind::Sim)
        .filter(|s| seen.insert(s.rest_base.clone()))
        .map(|s| (s.config.name.clone(), s.rest_base.clone()))
        .collect()
}
