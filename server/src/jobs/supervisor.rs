//! The ingest supervisor: the control plane over ingest jobs
//! (seeds/ingest-supervisor-and-binance-kline-ws.md
//! §§1-5, 10-11). It decides which jobs run; the jobs themselves (the data plane, one
//! [`JobRunner::run`] future per instrument) move the data.
//!
//! - A job per **instrument**: only 1m candles are ingested, so subscribing to `…:5m` and `…:1h`
//!   of one instrument shares one job (seed §9).
//! - **Pinned** jobs (the whitelist) start at boot and are never evicted or reaped (the seed's
//!   `refcount = -1`; here `pinned: true`, and their subscriber count is still shown).
//! - **On-demand** jobs are reference counted by subscriptions: each [`Lease`] (one browser tab's
//!   subscription to one series) counts once, and dropping the lease releases it, so a closing tab
//!   can never leak a reference.
//! - **Capacity** `ondemand_max_jobs`: when full, the on-demand job idle (refcount 0) the longest
//!   is evicted; if none is idle, the requester may **preempt** a job (below); otherwise the
//!   subscription is refused with [`SubscribeError::CapacityExhausted`] (seed §4: "an orderly
//!   no, not a crash").
//! - **Preemption** (a fair share of a full capacity): jobs with subscribers are never evicted,
//!   so a few addresses holding leases could lock every other client out. At capacity with no
//!   idle job, a client address holding fewer jobs than its fair share — `ondemand_max_jobs` /
//!   the number of distinct addresses holding on-demand jobs, the requester counted, at least 1
//!   — takes a job from the address holding the most jobs above its share: that address's job
//!   subscribed least recently (by anyone), among those whose every holder stays at or above
//!   its share and that no service lease (`owner` `None`) holds. The job is stopped and its
//!   leases are told ([`Lease::preempted`]; a WebSocket session sends its subscribers
//!   `preempted`); counted (`preemptions`) and logged once. A requester already at its share is refused as before. A
//!   job counts for **every** address holding a lease on it (as for the per-address limit of
//!   [`super::admission`]), so a job two addresses share counts once for each.
//! - **Admission** ([`super::admission`]): a job start asked by a client address is limited by
//!   its fair share of on-demand capacity and by job-start rates (per address and in all), so
//!   subscription churn cannot start jobs faster than the upstream allows.
//! - **Idle reaper**: on-demand jobs idle longer than `ondemand_idle_ttl_s` are stopped (seed §5).
//! - **Crashes**: a job future that panics or returns while not asked to stop is counted
//!   (`crashes`, `last_crash_at_ms`, `last_error`) and restarted after the job's back-off
//!   (`reconnect_base_ms` doubling to `reconnect_cap_ms`, reset by a run that lasted
//!   `reconnect_reset_after_ms`). Connection failures inside a running job are reported through
//!   [`JobHealth::crash`] by the job itself.
//! - [`Supervisor::snapshot`] is the debug snapshot served at `GET /api/v1/ops/jobs`.
//!
//! One supervisor runs one [`JobKind`] (kline, depth), each with its own [`JobRunner`] and
//! capacity; the rules above are the same for every kind. Kline jobs are subscribed by series
//! ([`Supervisor::subscribe`]), depth jobs by instrument ([`Supervisor::subscribe_instrument`]).
//!
//! Every job runs as a [`Shutdown::child`] of the supervisor's part, inside a `job` span with its
//! `kind` and `instrument`, so its log lines say which job they are about.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use shared::backoff::Backoff;
use shared::protocol::ops::{Capacity, JobKind, JobReport};
use shared::protocol::{InstrumentId, SeriesId};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::admission::{Admission, Refused};
use crate::client_addr::ClientAddr;
use crate::clock::wall_clock_ms as now_ms;
use crate::config::IngestConfig;
use crate::jitter::Jitter;
use crate::lock::lock;
use crate::shutdown::Shutdown;
use crate::sources::ResolveError;

/// A boxed job future.
pub type JobFuture = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Runs the data plane of one job until its context is stopped.
pub trait JobRunner: Send + Sync + 'static {
    /// Checks that a series can be served (known source and symbol, ingested or derived
    /// timeframe); the error reaches the client.
    fn validate(&self, series: &SeriesId) -> Result<(), ResolveError>;
    /// Checks that an instrument can be served, for subscriptions by instrument
    /// ([`Supervisor::subscribe_instrument`]).
    fn validate_instrument(&self, instrument: &InstrumentId) -> Result<(), ResolveError>;
    /// The job loop. It must return soon after `ctx` is stopped (after flushing what it holds);
    /// returning earlier counts as a crash and the job is restarted.
    fn run(&self, ctx: JobContext) -> JobFuture;
}

/// What a running job gets from the supervisor.
#[derive(Clone)]
pub struct JobContext {
    pub instrument: InstrumentId,
    /// Stopped when the job must end (eviction, reaper, admin stop, shutdown).
    pub shutdown: Shutdown,
    pub health: Arc<JobHealth>,
}

impl JobContext {
    /// Completes when the job is asked to stop. Cancel safe.
    pub async fn stopped(&self) {
        self.shutdown.stopping().await;
    }

    pub fn is_stopped(&self) -> bool {
        self.shutdown.is_stopping()
    }

    /// Sleeps `delay`; returns `true` if the job was stopped meanwhile.
    pub async fn sleep(&self, delay: Duration) -> bool {
        tokio::select! {
            () = tokio::time::sleep(delay) => self.is_stopped(),
            () = self.stopped() => true,
        }
    }
}

/// Live counters of one job, written by the job, read by the snapshot and metrics.
#[derive(Debug, Default)]
pub struct JobHealth {
    pub crashes: AtomicU64,
    pub last_crash_at_ms: AtomicI64,
    /// Why the job last crashed (`last_error` is whatever went wrong last, a crash or not).
    last_crash: Mutex<Option<String>>,
    last_error: Mutex<Option<String>>,
    pub connected: AtomicBool,
    pub connects: AtomicU64,
    pub messages: AtomicU64,
    pub malformed: AtomicU64,
    pub closed_candles: AtomicU64,
    pub gap_filled_candles: AtomicU64,
    pub persisted_batches: AtomicU64,
    pub persist_failures: AtomicU64,
    pub last_message_at_ms: AtomicI64,
    pub last_closed_open_time: AtomicI64,
    /// How far the exchange's clock is behind the close of the newest stored candle, ms (0:
    /// not behind). While it is, no new candle can close (a kline job; see `kline_job`).
    pub exchange_behind_ms: AtomicI64,
}

impl JobHealth {
    /// Records a crash (a lost connection, a failed REST fill, a panic) with its reason.
    pub fn crash(&self, error: impl std::fmt::Display) {
        let error = error.to_string();
        self.crashes.fetch_add(1, Relaxed);
        self.last_crash_at_ms.store(now_ms(), Relaxed);
        tracing::warn!(%error, "job crashed");
        *lock(&self.last_crash) = Some(error.clone());
        *lock(&self.last_error) = Some(error);
    }

    /// Records an error that is not a crash (e.g. a persist to retry).
    pub fn error(&self, error: impl std::fmt::Display) {
        *lock(&self.last_error) = Some(error.to_string());
    }

    pub fn last_error(&self) -> Option<String> {
        lock(&self.last_error).clone()
    }

    /// Why the job last crashed.
    pub fn last_crash(&self) -> Option<String> {
        lock(&self.last_crash).clone()
    }
}

/// What [`Supervisor::admin_stop`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminStop {
    /// An idle on-demand job: removed.
    Stopped,
    /// A pinned or subscribed job: its run ended and a new one started in its place.
    Restarted,
}

/// Why a subscription was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubscribeError {
    #[error(transparent)]
    Unknown(#[from] ResolveError),
    #[error(
        "capacity exhausted: {max} on-demand jobs are running and none is idle; try again later"
    )]
    CapacityExhausted { max: usize },
    #[error("this address already holds {max_per_ip} on-demand jobs (ingest.ondemand_max_jobs_per_ip), its share of the server's capacity; release one or try again later")]
    FairShare { max_per_ip: usize },
    #[error("too many job starts: at most {per_minute} a minute on this server (ingest.max_job_starts_per_min); try again in {} s", retry_after_ms.div_ceil(1000))]
    RateLimited { per_minute: u32, retry_after_ms: u64 },
    #[error("the server is shutting down")]
    ShuttingDown,
}

struct Job {
    pinned: bool,
    /// Live subscriptions per series.
    subs: BTreeMap<String, u32>,
    /// Live subscriptions per client address (for the addresses' fair share).
    holders: HashMap<ClientAddr, u32>,
    /// When the job was last subscribed (a sequence number of the supervisor's subscriptions):
    /// preemption takes the job of an address subscribed least recently.
    last_subscribed: u64,
    /// Cancelled when the job is preempted; every lease holds a clone.
    preempted: CancellationToken,
    refcount: u32,
    /// When the refcount last became 0 (ms); `None` while referenced. New on-demand jobs start
    /// referenced by the subscription creating them.
    last_zero_at_ms: Option<i64>,
    started_at_ms: i64,
    /// Unique per start, so a lease of an evicted job never touches its successor.
    generation: u64,
    /// The job's part of the supervisor's shutdown: stopping it stops the job.
    shutdown: Shutdown,
    health: Arc<JobHealth>,
}

struct State {
    jobs: HashMap<InstrumentId, Job>,
    next_generation: u64,
    shutting_down: bool,
    evictions: u64,
    refusals: u64,
    reaped: u64,
    /// Job starts refused by [`Admission`] (fair share or start rate).
    rate_limited: u64,
    /// Jobs stopped to give a client address its fair share of a full capacity.
    preemptions: u64,
    /// Subscriptions taken so far (orders the jobs by their last subscription).
    subscriptions: u64,
    admission: Admission,
}

struct Inner {
    /// What the jobs do, shown in the snapshot and the spans.
    kind: JobKind,
    config: IngestConfig,
    runner: Arc<dyn JobRunner>,
    /// Guarded by one lock, held only for bookkeeping (never across an await).
    state: Mutex<State>,
    /// The supervisor's part of the service: the reaper and every job run in it.
    shutdown: Shutdown,
}

/// Handle to the supervisor; cheap to clone.
#[derive(Clone)]
pub struct Supervisor {
    inner: Arc<Inner>,
}

/// One subscription's reference on a job. Dropping it releases the reference.
pub struct Lease {
    inner: Weak<Inner>,
    instrument: InstrumentId,
    series: String,
    generation: u64,
    /// The client address that holds it (`None`: the service).
    owner: Option<ClientAddr>,
    /// The job's preemption signal.
    preempted: CancellationToken,
}

impl Lease {
    /// Completes when the job was preempted (stopped to give another client address its fair
    /// share of capacity): the subscription gets nothing more and should be dropped. Pending
    /// forever otherwise (a job stopped for any other reason is not preempted). Cancel safe.
    pub async fn preempted(&self) {
        self.preempted.cancelled().await;
    }

    /// [`Lease::preempted`] as a future the caller keeps and polls again and again: it waits
    /// once, where a new `preempted()` per poll would register and drop a waiter each time.
    pub fn preempted_owned(&self) -> tokio_util::sync::WaitForCancellationFutureOwned {
        self.preempted.clone().cancelled_owned()
    }

    /// Was the job preempted?
    pub fn is_preempted(&self) -> bool {
        self.preempted.is_cancelled()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.upgrade() {
            Supervisor { inner }.release(
                &self.instrument,
                &self.series,
                self.generation,
                self.owner,
            );
        }
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Lease({})", self.series)
    }
}

impl Supervisor {
    /// A supervisor of `kind` jobs with no jobs yet, running as a child of `shutdown`; call
    /// [`Supervisor::start`] to start the pinned jobs and the reaper.
    pub fn new(
        kind: JobKind,
        config: IngestConfig,
        runner: Arc<dyn JobRunner>,
        shutdown: &Shutdown,
    ) -> Self {
        let state = State {
            jobs: HashMap::new(),
            next_generation: 1,
            shutting_down: false,
            evictions: 0,
            refusals: 0,
            reaped: 0,
            rate_limited: 0,
            preemptions: 0,
            subscriptions: 0,
            admission: Admission::new(
                config.ondemand_max_jobs_per_ip,
                config.max_job_starts_per_min,
                tokio::time::Instant::now(),
            ),
        };
        let inner =
            Inner { kind, config, runner, state: Mutex::new(state), shutdown: shutdown.child() };
        Self { inner: Arc::new(inner) }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.inner.state)
    }

    /// The kind of job this supervisor runs.
    pub fn kind(&self) -> JobKind {
        self.inner.kind
    }

    /// Starts the pinned jobs and the idle reaper (on the current tokio runtime). The reaper
    /// stops with the supervisor.
    pub fn start(&self, pinned: &[InstrumentId]) {
        for inst in pinned {
            self.pin(inst);
        }
        let weak = Arc::downgrade(&self.inner);
        let every = Duration::from_millis(self.inner.config.reaper_interval_ms);
        let span = tracing::info_span!("reaper", kind = self.inner.kind.as_str());
        self.inner.shutdown.spawn_until_stopped(
            async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let Some(inner) = weak.upgrade() else { break };
                    Supervisor { inner }.reap(now_ms());
                }
            }
            .instrument(span),
        );
    }

    /// Runs `instrument`'s job until [`Supervisor::stop_job`], starting it if needed (a pinned
    /// job is never evicted nor reaped). A cluster worker pins what its instructions add.
    pub fn pin(&self, instrument: &InstrumentId) {
        let mut st = self.lock();
        if st.shutting_down {
            return;
        }
        if let Some(job) = st.jobs.get_mut(instrument) {
            job.pinned = true;
            return;
        }
        let job = self.spawn_job(&mut st, instrument.clone(), true);
        st.jobs.insert(instrument.clone(), job);
    }

    /// Checks `series` and takes a reference on its instrument's job, starting it if needed
    /// (evicting the longest-idle on-demand job when at capacity).
    pub fn subscribe(&self, series: &SeriesId) -> Result<Lease, SubscribeError> {
        self.inner.runner.validate(series)?;
        self.acquire(series.instrument.clone(), series.to_string(), None)
    }

    /// [`Supervisor::subscribe`] for a client at `owner`: a job it starts counts against the
    /// address's fair share and start rate ([`super::admission`]).
    pub fn subscribe_as(
        &self,
        series: &SeriesId,
        owner: Option<ClientAddr>,
    ) -> Result<Lease, SubscribeError> {
        self.inner.runner.validate(series)?;
        self.acquire(series.instrument.clone(), series.to_string(), owner)
    }

    /// Like [`Supervisor::subscribe`] for jobs subscribed by instrument; `stream` names the
    /// subscription in the snapshot (`depth_update@sim:spot:BTC/USDT`).
    pub fn subscribe_instrument(
        &self,
        instrument: &InstrumentId,
        stream: &str,
        owner: Option<ClientAddr>,
    ) -> Result<Lease, SubscribeError> {
        self.inner.runner.validate_instrument(instrument)?;
        self.acquire(instrument.clone(), stream.to_string(), owner)
    }

    fn acquire(
        &self,
        instrument: InstrumentId,
        name: String,
        owner: Option<ClientAddr>,
    ) -> Result<Lease, SubscribeError> {
        let mut st = self.lock();
        if st.shutting_down {
            return Err(SubscribeError::ShuttingDown);
        }
        if !st.jobs.contains_key(&instrument) {
            let held = owner.map_or(0, |ip| {
                st.jobs.values().filter(|j| !j.pinned && j.holders.contains_key(&ip)).count()
            });
            if let Err(refused) = st.admission.admit(owner, held, tokio::time::Instant::now()) {
                st.rate_limited += 1;
                tracing::info!(instrument = %instrument, kind = self.inner.kind.as_str(), ?owner, ?refused, "job start refused");
                return Err(match refused {
                    Refused::FairShare { max_per_ip } => SubscribeError::FairShare { max_per_ip },
                    Refused::Rate { per_minute, retry_after_ms } => {
                        SubscribeError::RateLimited { per_minute, retry_after_ms }
                    }
                });
            }
            let max = self.inner.config.ondemand_max_jobs;
            let ondemand = st.jobs.values().filter(|j| !j.pinned).count();
            if max > 0 && ondemand >= max {
                let victim = st
                    .jobs
                    .iter()
                    .filter(|(_, j)| !j.pinned && j.refcount == 0)
                    .filter_map(|(k, j)| j.last_zero_at_ms.map(|t| (t, k.clone())))
                    .min();
                match victim {
                    Some((_, key)) => {
                        let job = st.jobs.remove(&key).expect("victim exists");
                        job.shutdown.stop();
                        st.evictions += 1;
                        tracing::info!(instrument = %key, kind = self.inner.kind.as_str(), "evicted the longest-idle on-demand job");
                    }
                    None => match owner.and_then(|ip| preemption(&st.jobs, ip, max)) {
                        Some(p) => {
                            let job = st.jobs.remove(&p.instrument).expect("victim exists");
                            job.shutdown.stop();
                            job.preempted.cancel();
                            st.preemptions += 1;
                            tracing::info!(
                                instrument = %p.instrument,
                                kind = self.inner.kind.as_str(),
                                from = ?p.from,
                                from_holds = p.from_holds,
                                to = ?owner,
                                share = p.share,
                                subscribers = job.refcount,
                                "preempted an on-demand job: capacity is full and the requester holds less than its fair share"
                            );
                        }
                        None => {
                            st.refusals += 1;
                            return Err(SubscribeError::CapacityExhausted { max });
                        }
                    },
                }
            }
            let job = self.spawn_job(&mut st, instrument.clone(), false);
            st.jobs.insert(instrument.clone(), job);
        }
        st.subscriptions += 1;
        let seq = st.subscriptions;
        let job = st.jobs.get_mut(&instrument).expect("inserted above");
        job.last_subscribed = seq;
        job.refcount += 1;
        *job.subs.entry(name.clone()).or_default() += 1;
        if let Some(ip) = owner {
            *job.holders.entry(ip).or_default() += 1;
        }
        job.last_zero_at_ms = None;
        Ok(Lease {
            inner: Arc::downgrade(&self.inner),
            instrument,
            series: name,
            generation: job.generation,
            owner,
            preempted: job.preempted.clone(),
        })
    }

    fn release(
        &self,
        instrument: &InstrumentId,
        series: &str,
        generation: u64,
        owner: Option<ClientAddr>,
    ) {
        let mut st = self.lock();
        let Some(job) = st.jobs.get_mut(instrument) else { return };
        if job.generation != generation {
            return; // the job this lease referenced was stopped; its successor is not ours
        }
        job.refcount = job.refcount.saturating_sub(1);
        if let Some(ip) = owner {
            if let Some(n) = job.holders.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    job.holders.remove(&ip);
                }
            }
        }
        if let Some(n) = job.subs.get_mut(series) {
            *n -= 1;
            if *n == 0 {
                job.subs.remove(series);
            }
        }
        if job.refcount == 0 {
            job.last_zero_at_ms = Some(now_ms());
        }
    }

    /// Stops on-demand jobs idle longer than the TTL; returns how many.
    pub fn reap(&self, now_ms: i64) -> usize {
        let ttl_ms = i64::try_from(self.inner.config.ondemand_idle_ttl_s)
            .unwrap_or(i64::MAX)
            .saturating_mul(1000);
        let mut st = self.lock();
        let expired: Vec<InstrumentId> = st
            .jobs
            .iter()
            .filter(|(_, j)| !j.pinned && j.refcount == 0)
            .filter(|(_, j)| j.last_zero_at_ms.is_some_and(|t| now_ms - t >= ttl_ms))
            .map(|(k, _)| k.clone())
            .collect();
        for k in &expired {
            if let Some(job) = st.jobs.remove(k) {
                job.shutdown.stop();
                tracing::info!(instrument = %k, kind = self.inner.kind.as_str(), "reaped idle on-demand job");
            }
        }
        st.reaped += expired.len() as u64;
        expired.len()
    }

    /// The admin's `jobs/stop`: ends the job's current run (its connection, its pipeline, after
    /// a flush of what it holds). A job still wanted — pinned, or with live subscriptions —
    /// starts again at once, in place, once the old run has ended: its subscriptions stay on it
    /// (the leases keep their generation), so the subscribed sessions stay attached, are still
    /// counted, and receive the new run's candles (it fills what closed meanwhile from REST
    /// first). Only an idle on-demand job is removed. `None` when there is no such job.
    pub fn admin_stop(&self, instrument: &InstrumentId) -> Option<AdminStop> {
        let mut st = self.lock();
        let old = st.jobs.remove(instrument)?;
        old.shutdown.stop();
        if !old.pinned && old.refcount == 0 {
            return Some(AdminStop::Stopped);
        }
        let mut job =
            self.spawn_job_after(&mut st, instrument.clone(), old.pinned, Some(old.shutdown));
        job.generation = old.generation;
        job.subs = old.subs;
        job.holders = old.holders;
        job.last_subscribed = old.last_subscribed;
        job.preempted = old.preempted;
        job.refcount = old.refcount;
        job.last_zero_at_ms = old.last_zero_at_ms;
        tracing::info!(%instrument, kind = self.inner.kind.as_str(), subscribers = job.refcount, "job restarted by an admin");
        st.jobs.insert(instrument.clone(), job);
        Some(AdminStop::Restarted)
    }

    /// Stops a job now and forgets it (a cluster worker whose instructions dropped the task).
    /// Its leases are left dangling: a new subscription starts a fresh job. Returns whether it
    /// existed.
    pub fn stop_job(&self, instrument: &InstrumentId) -> bool {
        let mut st = self.lock();
        match st.jobs.remove(instrument) {
            Some(job) => {
                job.shutdown.stop();
                true
            }
            None => false,
        }
    }

    /// Stops every job and the reaper, refuses new subscriptions, and waits (at most `timeout`)
    /// until the jobs have ended, flushing their buffers as they stop. Returns whether all did.
    pub async fn stop(&self, timeout: Duration) -> bool {
        {
            let mut st = self.lock();
            st.shutting_down = true;
            st.jobs.clear();
        }
        self.inner.shutdown.stopped(timeout).await
    }

    fn spawn_job(&self, st: &mut State, instrument: InstrumentId, pinned: bool) -> Job {
        self.spawn_job_after(st, instrument, pinned, None)
    }

    /// [`Supervisor::spawn_job`], whose first run starts once the tasks of `after` (a stopped
    /// predecessor) have ended, so the two never write the same series at once.
    fn spawn_job_after(
        &self,
        st: &mut State,
        instrument: InstrumentId,
        pinned: bool,
        after: Option<Shutdown>,
    ) -> Job {
        let health = Arc::new(JobHealth::default());
        let generation = st.next_generation;
        st.next_generation += 1;
        let shutdown = self.inner.shutdown.child();
        let ctx = JobContext {
            instrument: instrument.clone(),
            shutdown: shutdown.clone(),
            health: health.clone(),
        };
        let runner = self.inner.runner.clone();
        let config = &self.inner.config;
        let mut backoff = Backoff::new(
            Duration::from_millis(config.reconnect_base_ms),
            Duration::from_millis(config.reconnect_cap_ms),
        )
        .with_healthy_after(Duration::from_millis(config.reconnect_reset_after_ms));
        let kind = self.inner.kind;
        let span = tracing::info_span!("job", kind = kind.as_str(), instrument = %instrument);
        let task = async move {
            if let Some(before) = after {
                if !before.stopped(Duration::from_secs(30)).await {
                    tracing::warn!("the job's previous run did not end within 30 s");
                }
            }
            let mut jitter = Jitter::new(&ctx.instrument.to_string());
            loop {
                let started = Instant::now();
                // A job of its own, so a panic is caught here and the loop restarts it.
                let outcome = ctx.shutdown.spawn(runner.run(ctx.clone()).in_current_span()).await;
                if ctx.is_stopped() {
                    break;
                }
                match outcome {
                    Ok(()) => ctx.health.crash("job loop returned without being stopped"),
                    Err(e) => ctx.health.crash(format_args!("job loop panicked: {e}")),
                }
                backoff.connection_ended(started.elapsed());
                let delay = backoff.next_delay(jitter.draw());
                tracing::info!(?delay, "restarting the job");
                if ctx.sleep(delay).await {
                    break;
                }
            }
            tracing::debug!("job stopped");
        };
        shutdown.spawn(task.instrument(span));
        tracing::info!(%instrument, pinned, kind = kind.as_str(), "job started");
        Job {
            pinned,
            subs: BTreeMap::new(),
            holders: HashMap::new(),
            last_subscribed: 0,
            preempted: CancellationToken::new(),
            refcount: 0,
            last_zero_at_ms: if pinned { None } else { Some(now_ms()) },
            started_at_ms: now_ms(),
            generation,
            shutdown,
            health,
        }
    }

    /// The debug snapshot (seed §10: "which pair keeps crashing").
    pub fn snapshot(&self) -> SupervisorSnapshot {
        let st = self.lock();
        let now = now_ms();
        let mut jobs: Vec<JobReport> = st
            .jobs
            .iter()
            .map(|(inst, j)| {
                let h = &j.health;
                let load = |a: &AtomicI64| Some(a.load(Relaxed)).filter(|v| *v != 0);
                JobReport {
                    instrument: inst.clone(),
                    kind: self.inner.kind,
                    series_id: match self.inner.kind {
                        JobKind::Kline => format!("{inst}:1m"),
                        JobKind::Depth => format!("depth@{inst}"),
                    },
                    pinned: j.pinned,
                    refcount: if j.pinned { -1 } else { i64::from(j.refcount) },
                    subscribers: j.refcount,
                    subscriptions: j.subs.clone(),
                    idle_since_ms: j.last_zero_at_ms,
                    idle_for_ms: j.last_zero_at_ms.map(|t| now - t),
                    started_at_ms: j.started_at_ms,
                    crashes: h.crashes.load(Relaxed),
                    last_crash_at_ms: load(&h.last_crash_at_ms),
                    last_crash: h.last_crash(),
                    last_error: h.last_error(),
                    connected: h.connected.load(Relaxed),
                    connects: h.connects.load(Relaxed),
                    messages: h.messages.load(Relaxed),
                    malformed: h.malformed.load(Relaxed),
                    closed_candles: h.closed_candles.load(Relaxed),
                    gap_filled_candles: h.gap_filled_candles.load(Relaxed),
                    persist_failures: h.persist_failures.load(Relaxed),
                    last_message_at_ms: load(&h.last_message_at_ms),
                    last_closed_open_time: load(&h.last_closed_open_time),
                    exchange_behind_ms: load(&h.exchange_behind_ms),
                }
            })
            .collect();
        jobs.sort_by(|a, b| (!a.pinned, &a.instrument).cmp(&(!b.pinned, &b.instrument)));
        let ondemand = jobs.iter().filter(|j| !j.pinned).count();
        SupervisorSnapshot {
            capacity: Capacity {
                ondemand_max_jobs: self.inner.config.ondemand_max_jobs as u64,
                ondemand_jobs: ondemand as u64,
                pinned_jobs: (jobs.len() - ondemand) as u64,
                ondemand_idle_ttl_s: self.inner.config.ondemand_idle_ttl_s,
                evictions: st.evictions,
                refusals: st.refusals,
                reaped: st.reaped,
                start_refusals: st.rate_limited,
                preemptions: st.preemptions,
            },
            jobs,
        }
    }

    /// Health counters of a job, if it runs.
    pub fn health(&self, instrument: &InstrumentId) -> Option<Arc<JobHealth>> {
        self.lock().jobs.get(instrument).map(|j| j.health.clone())
    }
}

/// A job to preempt, and why.
#[derive(Debug, PartialEq, Eq)]
struct Preemption {
    instrument: InstrumentId,
    /// The address it is taken from (the one holding the most jobs above its share) ...
    from: ClientAddr,
    /// ... which holds this many on-demand jobs.
    from_holds: usize,
    /// The fair share: capacity / addresses holding on-demand jobs (the requester counted).
    share: usize,
}

/// The job `requester` may take from another address when capacity (`max` on-demand jobs) is
/// full and none is idle, or `None` when it already holds its fair share or no job can be taken
/// (see the module docs).
fn preemption(
    jobs: &HashMap<InstrumentId, Job>,
    requester: ClientAddr,
    max: usize,
) -> Option<Preemption> {
    let ondemand = || jobs.iter().filter(|(_, j)| !j.pinned);
    let mut held: HashMap<ClientAddr, usize> = HashMap::new();
    for (_, job) in ondemand() {
        for ip in job.holders.keys() {
            *held.entry(*ip).or_default() += 1;
        }
    }
    let addresses = held.len() + usize::from(!held.contains_key(&requester));
    let share = (max / addresses).max(1);
    if held.get(&requester).copied().unwrap_or(0) >= share {
        return None;
    }
    // Addresses above their share, the most jobs first (ties: by address, to be repeatable).
    let mut hogs: Vec<(ClientAddr, usize)> = held
        .iter()
        .filter(|(ip, n)| **ip != requester && **n > share)
        .map(|(ip, n)| (*ip, *n))
        .collect();
    hogs.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    hogs.into_iter().find_map(|(from, from_holds)| {
        ondemand()
            .filter(|(_, j)| j.holders.contains_key(&from))
            // no service lease on it ...
            .filter(|(_, j)| j.holders.values().sum::<u32>() == j.refcount)
            // ... and every holder keeps at least its share
            .filter(|(_, j)| j.holders.keys().all(|ip| held[ip] > share))
            .min_by_key(|(_, j)| j.last_subscribed)
            .map(|(k, _)| Preemption { instrument: k.clone(), from, from_holds, share })
    })
}

/// A supervisor's debug snapshot: its capacity and its jobs, pinned first.
#[derive(Debug, Clone)]
pub struct SupervisorSnapshot {
    pub capacity: Capacity,
    pub jobs: Vec<JobReport>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job loop with a bug: every run panics at once, except run `healthy_run`, which first
    /// works for `healthy_for`. Records when each run started.
    struct Panicking {
        starts: Arc<Mutex<Vec<Instant>>>,
        healthy_run: usize,
        healthy_for: Duration,
    }

    impl JobRunner for Panicking {
        fn validate(&self, _: &SeriesId) -> Result<(), ResolveError> {
            Ok(())
        }

        fn validate_instrument(&self, _: &InstrumentId) -> Result<(), ResolveError> {
            Ok(())
        }

        fn run(&self, _ctx: JobContext) -> JobFuture {
            let (starts, healthy_run, healthy_for) =
                (self.starts.clone(), self.healthy_run, self.healthy_for);
            Box::pin(async move {
                let n = {
                    let mut s = lock(&starts);
                    s.push(Instant::now());
                    s.len() - 1
                };
                if n == healthy_run {
                    tokio::time::sleep(healthy_for).await;
                }
                panic!("a bug in the job loop (run {n})");
            })
        }
    }

    fn ms(d: Duration) -> u64 {
        d.as_millis() as u64
    }

    /// A job loop that runs until it is stopped.
    struct Idle;

    impl JobRunner for Idle {
        fn validate(&self, _: &SeriesId) -> Result<(), ResolveError> {
            Ok(())
        }

        fn validate_instrument(&self, _: &InstrumentId) -> Result<(), ResolveError> {
            Ok(())
        }

        fn run(&self, ctx: JobContext) -> JobFuture {
            Box::pin(async move { ctx.stopped().await })
        }
    }

    fn addr(last: u8) -> Option<ClientAddr> {
        Some(ClientAddr::of(std::net::IpAddr::from([10, 0, 0, last])))
    }

    fn inst(base: &str) -> InstrumentId {
        format!("sim:spot:{base}/USDT").parse().unwrap()
    }

    /// Capacity 4, no per-address limit: one address takes it all; a newcomer preempts the
    /// hog's least recently subscribed job (its lease is told), until both hold their share;
    /// then each is refused. A job shared with an address below its share, or held by the
    /// service, is never taken.
    #[tokio::test]
    async fn a_newcomer_below_its_fair_share_preempts_the_address_most_above_its_share() {
        let config = IngestConfig {
            ondemand_max_jobs: 4,
            ondemand_max_jobs_per_ip: 0,
            max_job_starts_per_min: 0,
            ..IngestConfig::default()
        };
        let shutdown = Shutdown::new();
        let sup = Supervisor::new(JobKind::Depth, config, Arc::new(Idle), &shutdown);
        let take = |base: &str, owner| sup.subscribe_instrument(&inst(base), base, owner);
        let (hog, newcomer, third) = (addr(1), addr(2), addr(3));
        let hogs: Vec<Lease> =
            ["BTC", "ETH", "SOL", "XRP"].iter().map(|b| take(b, hog).unwrap()).collect();
        // the hog holds 4 > its share (4 / 2 addresses): its least recently subscribed job goes
        let _got = take("ADA", newcomer).unwrap();
        assert!(hogs[0].is_preempted() && !hogs[1].is_preempted());
        assert!(sup.health(&inst("BTC")).is_none(), "BTC stopped");
        tokio::time::timeout(Duration::from_secs(1), hogs[0].preempted()).await.unwrap();
        // the hog (3 >= 2) is refused; the newcomer (1 < 2) takes one more
        assert_eq!(take("DOT", hog).unwrap_err(), SubscribeError::CapacityExhausted { max: 4 });
        let _second = take("DOT", newcomer).unwrap();
        assert!(hogs[1].is_preempted(), "ETH, the hog's next least recently subscribed");
        // 2 and 2: both at their share
        assert!(take("LTC", newcomer).is_err());
        assert!(take("LTC", hog).is_err());
        let snap = sup.snapshot();
        assert_eq!((snap.capacity.preemptions, snap.capacity.ondemand_jobs), (2, 4));
        assert_eq!(snap.capacity.refusals, 3);
        // a third address (share 4 / 3 = 1): the hog's SOL is shared with it, so XRP is taken
        let _shared = take("SOL", third).unwrap();
        let fourth = addr(4);
        // 4 addresses, share 1: the hog holds 2, the newcomer 2, the third 1 (SOL, shared)
        let _t = take("TRX", fourth).unwrap();
        assert!(!hogs[2].is_preempted(), "SOL is shared with the third address, at its share");
        assert!(hogs[3].is_preempted(), "XRP, the hog's only job held by it alone");
        drop(hogs);
        sup.stop(Duration::from_secs(5)).await;
    }

    /// A job held by the service itself (a lease without owner) is never preempted.
    #[tokio::test]
    async fn jobs_the_service_holds_are_never_preempted() {
        let config = IngestConfig {
            ondemand_max_jobs: 2,
            ondemand_max_jobs_per_ip: 0,
            max_job_starts_per_min: 0,
            ..IngestConfig::default()
        };
        let shutdown = Shutdown::new();
        let sup = Supervisor::new(JobKind::Depth, config, Arc::new(Idle), &shutdown);
        let take = |base: &str, owner| sup.subscribe_instrument(&inst(base), base, owner);
        let a = [take("BTC", addr(1)).unwrap(), take("ETH", addr(1)).unwrap()];
        let _service = [take("BTC", None).unwrap(), take("ETH", None).unwrap()];
        assert_eq!(take("SOL", addr(2)).unwrap_err(), SubscribeError::CapacityExhausted { max: 2 });
        // nor does the service preempt anyone (it has no share)
        assert!(take("SOL", None).is_err());
        assert!(!a[0].is_preempted() && !a[1].is_preempted());
        assert_eq!(sup.snapshot().capacity.preemptions, 0);
        sup.stop(Duration::from_secs(5)).await;
    }

    /// Seed 000: a panicking job loop is restarted with back-off — doubling from
    /// `reconnect_base_ms` to `reconnect_cap_ms` (±20 % jitter), back to the base after a run
    /// that lasted `reconnect_reset_after_ms`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panicking_job_is_restarted_with_back_off() {
        // These panics are expected: no report (printing a backtrace takes longer than the
        // delays measured here). Other panics are reported as usual.
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !info.to_string().contains("a bug in the job loop") {
                report(info);
            }
        }));
        let starts = Arc::new(Mutex::new(Vec::new()));
        let runner = Panicking {
            starts: starts.clone(),
            healthy_run: 5,
            healthy_for: Duration::from_millis(400),
        };
        let config = IngestConfig {
            reconnect_base_ms: 40,
            reconnect_cap_ms: 320,
            reconnect_reset_after_ms: 300,
            ..IngestConfig::default()
        };
        let shutdown = Shutdown::new();
        let sup = Supervisor::new(JobKind::Kline, config, Arc::new(runner), &shutdown);
        let inst: InstrumentId = "sim:spot:BTC/USDT".parse().unwrap();
        sup.start(std::slice::from_ref(&inst));
        let deadline = Instant::now() + Duration::from_secs(10);
        while lock(&starts).len() < 9 {
            assert!(Instant::now() < deadline, "restarts stopped: {:?}", lock(&starts).len());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let health = sup.health(&inst).expect("the job is still there");
        assert!(health.crashes.load(Relaxed) >= 8);
        assert!(health.last_error().unwrap().contains("panicked"), "{:?}", health.last_error());
        sup.stop(Duration::from_secs(5)).await;
        let s = lock(&starts).clone();
        let gap = |i: usize| ms(s[i + 1] - s[i]);
        // Doubling to the cap: 40, 80, 160, 320, 320 ms (±20 %, plus scheduling).
        for (i, want) in [40u64, 80, 160, 320, 320].into_iter().enumerate() {
            let g = gap(i);
            assert!(g >= want * 8 / 10 && g <= want * 12 / 10 + 40, "restart {i}: {g} ms");
        }
        // Run 5 lasted 400 ms (>= 300): the next restart is back at the base, then doubles.
        let after_healthy = gap(5) - 400;
        assert!((32..=48 + 40).contains(&after_healthy), "after a healthy run: {after_healthy}");
        assert!(gap(6) >= 64 && gap(6) <= 96 + 40, "{}", gap(6));
    }
}
