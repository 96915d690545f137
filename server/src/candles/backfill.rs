//! Historical backfill (seeds/incremental-newest-first-backfill.md), with millrace's one change:
//! an interrupted run leaves no hole.
//!
//! A task is a 1m series and a retention window. A run:
//! 1. asks the exchange for its time and takes the window `[now − retention, last closed minute]`;
//! 2. subtracts what earlier runs covered (the persisted [`BackfillProgress::covered`] ranges) and
//!    walks the remaining gaps **newest first**, paging backwards through REST klines
//!    (`batch_limit` per request);
//! 3. stores every page **and** the extended coverage in one transaction
//!    ([`CandleStore::write_with_progress`]), together with the derived candles of every bucket
//!    the page completes, and publishes them right away (the seed: "each batch goes to Kafka
//!    immediately");
//! 4. stops when the window is covered. The seed's stop conditions map as follows: "reached the
//!    previous run's start" is reaching covered ground — and where the seed would stop there, a
//!    millrace run continues with the next older gap, which is exactly the range an interrupted
//!    run missed; "N (3) consecutive batches older than retention, on the first run only"
//!    becomes N consecutive pages with no candle in the window, on a task's first run only (no
//!    coverage recorded yet): time-based paging never asks for data beyond the window, so a
//!    page holds no valid row only where the exchange has nothing — before the symbol's listing,
//!    or an outage. The first run stops there (as the seed's does, which would otherwise walk
//!    the whole window of a recently listed symbol); every later run walks on through such
//!    pages to the window's start, covering them, so an outage that ended a first run early
//!    costs one more run, never a hole; "manual stop" is [`Backfill::stop`].
//!
//! Because coverage is only ever recorded in the transaction that stored the candles, a crash or
//! `kill -9` at any point loses at most the page in flight, and the next run fetches it again.
//! Rate limits (HTTP 429/418) pause the run for the exchange's `Retry-After`; other errors are
//! retried with back-off and, after several failures, end the run as `failed` (progress kept).
//!
//! **In a cluster** one node at a time backfills: the holder of the persister lease (which also
//! writes the live closed candles, so a series has one writer). Every gateway has the tasks;
//! [`Backfill::lease`] tells it when it gains the lease (it reloads every task's progress from
//! the shared store, so it resumes where the previous holder stopped, and starts the
//! `auto_start` tasks) and when it loses it (its runs stop after the page in flight). A
//! start asked of a node without the lease is refused with [`BackfillError::OtherNode`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shared::backoff::Backoff;
use shared::candle::{Candle, Timeframe, MINUTE_MS};
use shared::protocol::ops::{BackfillState, BackfillTask};
use shared::protocol::SeriesId;
use tracing::Instrument as _;

use super::writer::{CandleWriter, Derive};
use crate::clock::wall_clock_ms as now_ms;
use crate::config::BackfillTaskConfig;
use crate::error::report;
use crate::jitter::Jitter;
use crate::lock::lock;
use crate::shutdown::Shutdown;
use crate::sources::Sources;
use crate::store::{blocking, BackfillProgress, BackfillStore, StoreError};

const DAY_MS: i64 = 86_400_000;
/// Consecutive failed requests before a run gives up (progress is kept).
const MAX_FAILURES: u32 = 8;

/// Where a task's history comes from: Binance's REST klines, or another venue's REST candles
/// (`venues::rest::candles_page`, each venue's page size; Kraken keeps only its newest 720
/// minutes, so its pages older than that come back empty and a first run ends there).
enum History {
    Binance(Arc<crate::sources::Source>, String),
    Venue(Arc<crate::venue::VenueSource>, venues::rest::Instrument),
}

/// A failed history request: why, and what the venue asked for.
struct HistoryError {
    message: String,
    rate_limit: bool,
    retry_after: Option<Duration>,
}

impl std::fmt::Display for HistoryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl HistoryError {
    fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    fn is_rate_limit(&self) -> bool {
        self.rate_limit
    }

    fn of_rest(e: binance::rest::RestError) -> Self {
        HistoryError {
            message: e.to_string(),
            rate_limit: e.is_rate_limit(),
            retry_after: e.retry_after(),
        }
    }

    fn of_venue(message: String) -> Self {
        HistoryError { rate_limit: message.contains("rate limit"), retry_after: None, message }
    }
}

impl History {
    /// The exchange's time: Binance's `/time`; a venue's is taken as the local clock.
    async fn now(&self) -> Result<i64, HistoryError> {
        match self {
            History::Binance(s, _) => s.rest.server_time().await.map_err(HistoryError::of_rest),
            History::Venue(..) => Ok(crate::clock::wall_clock_ms()),
        }
    }

    /// Rows a page may ask for: the configured batch, at most what the venue answers at once.
    fn page_limit(&self, batch: u16) -> u16 {
        match self {
            History::Binance(..) => batch,
            History::Venue(v, _) => batch.min(venues::rest::candles_page_size(v.dialect)),
        }
    }

    /// The 1m candles with open times in `[lo, hi]`, with their close times.
    async fn page(&self, lo: i64, hi: i64, limit: u16) -> Result<Vec<(Candle, i64)>, HistoryError> {
        match self {
            History::Binance(s, symbol) => s
                .rest
                .klines(symbol, Timeframe::M1, Some(lo), Some(hi + MINUTE_MS - 1), limit)
                .await
                .map(|rows| rows.into_iter().map(|r| (r.candle, r.close_time)).collect())
                .map_err(HistoryError::of_rest),
            History::Venue(v, listing) => {
                let path = venues::rest::candles_page(
                    v.dialect,
                    v.config.market,
                    &listing.symbol,
                    lo,
                    Some(hi + MINUTE_MS),
                );
                let body = v.get_text(&path).await.map_err(|e| HistoryError {
                    rate_limit: e.is_rate_limit(),
                    retry_after: None,
                    message: e.to_string(),
                })?;
                let rows = venues::rest::parse_candles(v.dialect, &body)
                    .map_err(|e| HistoryError::of_venue(e.to_string()))?;
                Ok(rows
                    .into_iter()
                    .filter(|r| r.closed != Some(false))
                    .map(|r| (r.candle, r.candle.open_time + MINUTE_MS - 1))
                    .collect())
            }
        }
    }
}

/// Why an admin request on a backfill task was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackfillError {
    #[error("no backfill task for {0:?}")]
    UnknownTask(String),
    #[error(
        "backfill runs on the cluster node holding the persister lease, and this node does not \
         hold it"
    )]
    OtherNode,
}

/// Where backfill may run: [`Inner::gate`].
const ALWAYS: u8 = 0;
const LEASE_HELD: u8 = 1;
const LEASE_NOT_HELD: u8 = 2;

struct Task {
    config: BackfillTaskConfig,
    series: SeriesId,
    progress: Arc<Mutex<BackfillProgress>>,
    window: Arc<Mutex<Option<(i64, i64)>>>,
    /// The current (or last) run's part of the shutdown; `None` before the first run.
    run: Option<Shutdown>,
}

impl Task {
    fn running(&self) -> bool {
        self.run.as_ref().is_some_and(|r| r.running() > 0)
    }
}

/// The backfill manager: configured tasks, started at boot or on request.
#[derive(Clone)]
pub struct Backfill {
    inner: Arc<Inner>,
}

struct Inner {
    tasks: Mutex<BTreeMap<String, Task>>,
    store: Arc<dyn BackfillStore>,
    writer: CandleWriter,
    sources: Arc<Sources>,
    derived: Vec<Timeframe>,
    /// `ALWAYS` on a single process; in a cluster whether this node holds the lease.
    gate: AtomicU8,
    /// Serialises lease changes (a reload of progress and the starts after it).
    lease_change: tokio::sync::Mutex<()>,
    /// Backfill's part of the service: every run is a child of it.
    shutdown: Shutdown,
}

impl Backfill {
    /// Loads every task's progress from the store (blocking: call it on a blocking thread or at
    /// start). The tasks' series were checked with the configuration.
    pub fn new(
        tasks: &[(SeriesId, BackfillTaskConfig)],
        derived: &[Timeframe],
        store: Arc<dyn BackfillStore>,
        writer: CandleWriter,
        sources: Arc<Sources>,
        shutdown: &Shutdown,
    ) -> Result<Self, StoreError> {
        let mut map = BTreeMap::new();
        for (series, config) in tasks {
            let key = series.to_string();
            let progress = store
                .backfill_progress(&key)?
                .unwrap_or_else(|| BackfillProgress::new(key.clone()));
            let task = Task {
                config: config.clone(),
                series: series.clone(),
                progress: Arc::new(Mutex::new(progress)),
                window: Arc::default(),
                run: None,
            };
            map.insert(key, task);
        }
        let inner = Inner {
            tasks: Mutex::new(map),
            store,
            writer,
            sources,
            derived: derived.to_vec(),
            gate: AtomicU8::new(ALWAYS),
            lease_change: tokio::sync::Mutex::new(()),
            shutdown: shutdown.child(),
        };
        Ok(Self { inner: Arc::new(inner) })
    }

    /// Starts every task configured with `auto_start` (the seed's `auto_start_all`).
    pub fn start_configured(&self) {
        let keys: Vec<String> = lock(&self.inner.tasks)
            .iter()
            .filter(|(_, t)| t.config.auto_start)
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            let _ = self.start(&k);
        }
    }

    /// In a cluster: runs only while this node holds the lease; it does not yet.
    pub fn needs_lease(&self) {
        self.inner.gate.store(LEASE_NOT_HELD, Relaxed);
    }

    /// Whether runs may start here (always on a single process).
    pub fn runs_here(&self) -> bool {
        self.inner.gate.load(Relaxed) != LEASE_NOT_HELD
    }

    /// This node gained (`true`) or lost the lease (see the module docs). On gaining it,
    /// every task's progress is read again from the store, where the previous holder left it.
    pub async fn lease(&self, held: bool) -> Result<(), StoreError> {
        let _one = self.inner.lease_change.lock().await;
        if !held {
            self.inner.gate.store(LEASE_NOT_HELD, Relaxed);
            for task in lock(&self.inner.tasks).values() {
                if let Some(run) = &task.run {
                    run.stop();
                }
            }
            return Ok(());
        }
        // The runs the last loss stopped must be over before their progress is replaced.
        let runs: Vec<Shutdown> =
            lock(&self.inner.tasks).values().filter_map(|t| t.run.clone()).collect();
        for run in runs {
            run.stopped(Duration::from_secs(30)).await;
        }
        let keys: Vec<String> = lock(&self.inner.tasks).keys().cloned().collect();
        let store = self.inner.store.clone();
        let stored = blocking(move || {
            keys.into_iter()
                .map(|k| Ok((k.clone(), store.backfill_progress(&k)?)))
                .collect::<Result<Vec<_>, StoreError>>()
        })
        .await?;
        for (key, progress) in stored {
            if let (Some(task), Some(p)) = (lock(&self.inner.tasks).get(&key), progress) {
                *lock(&task.progress) = p;
            }
        }
        self.inner.gate.store(LEASE_HELD, Relaxed);
        self.start_configured();
        Ok(())
    }

    /// Starts a run of the task for `series` (no-op if one is running).
    pub fn start(&self, series: &str) -> Result<(), BackfillError> {
        if !self.runs_here() {
            return Err(BackfillError::OtherNode);
        }
        let mut tasks = lock(&self.inner.tasks);
        let task =
            tasks.get_mut(series).ok_or_else(|| BackfillError::UnknownTask(series.to_string()))?;
        if task.running() {
            return Ok(());
        }
        let shutdown = self.inner.shutdown.child();
        let run = Run {
            inner: self.inner.clone(),
            config: task.config.clone(),
            series: task.series.clone(),
            progress: task.progress.clone(),
            window: task.window.clone(),
            shutdown: shutdown.clone(),
        };
        let span = tracing::info_span!("backfill", series = %task.series);
        shutdown.spawn(run.run().instrument(span));
        task.run = Some(shutdown);
        Ok(())
    }

    /// Asks the run of `series` to stop after the page in flight.
    pub fn stop(&self, series: &str) -> Result<(), BackfillError> {
        let tasks = lock(&self.inner.tasks);
        let task =
            tasks.get(series).ok_or_else(|| BackfillError::UnknownTask(series.to_string()))?;
        if let Some(run) = &task.run {
            run.stop();
        }
        Ok(())
    }

    /// Stops every run and waits for them (at most `timeout`); returns whether all ended.
    pub async fn shutdown(&self, timeout: Duration) -> bool {
        self.inner.shutdown.stopped(timeout).await
    }

    /// Every task's state and progress.
    pub fn snapshot(&self) -> Vec<BackfillTask> {
        let tasks = lock(&self.inner.tasks);
        tasks
            .values()
            .map(|t| {
                let p = lock(&t.progress).clone();
                let window = *lock(&t.window);
                BackfillTask {
                    series: t.series.clone(),
                    retention_days: t.config.retention_days,
                    running: t.running(),
                    state: p.state,
                    stop_reason: p.stop_reason,
                    progress: window.map_or(0.0, |w| covered_share(&p.covered, w)),
                    covered: p.covered,
                    window,
                    cursor: p.cursor,
                    run_started_from: p.run_started_from,
                    candles_written: p.candles_written,
                    batches: p.batches,
                    last_error: p.last_error,
                    updated_at_ms: p.updated_at_ms,
                }
            })
            .collect()
    }
}

/// Share of the window `[lo, hi]` that `covered` covers, 0..=1.
fn covered_share(covered: &[(i64, i64)], (lo, hi): (i64, i64)) -> f64 {
    let total = ((hi - lo) / MINUTE_MS + 1) as f64;
    let done: i64 = covered
        .iter()
        .map(|&(a, b)| (b.min(hi) - a.max(lo)) / MINUTE_MS + 1)
        .filter(|n| *n > 0)
        .sum();
    (done as f64 / total).clamp(0.0, 1.0)
}

/// The parts of `[lo, hi]` not in `covered` (sorted, disjoint), newest first.
pub fn gaps(covered: &[(i64, i64)], lo: i64, hi: i64) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    let mut next_hi = hi;
    for &(a, b) in covered.iter().rev() {
        if b < lo || next_hi < lo {
            break;
        }
        if a > next_hi {
            continue;
        }
        if b < next_hi {
            out.push((b + MINUTE_MS, next_hi));
        }
        next_hi = a - MINUTE_MS;
    }
    if next_hi >= lo {
        out.push((lo, next_hi));
    }
    out
}

/// Adds `[a, b]` to sorted disjoint ranges, merging neighbours (adjacent minutes join).
pub fn cover(covered: &mut Vec<(i64, i64)>, a: i64, b: i64) {
    covered.push((a, b));
    covered.sort_unstable();
    let mut merged: Vec<(i64, i64)> = Vec::with_capacity(covered.len());
    for &(x, y) in covered.iter() {
        match merged.last_mut() {
            Some(last) if x <= last.1 + MINUTE_MS => last.1 = last.1.max(y),
            _ => merged.push((x, y)),
        }
    }
    *covered = merged;
}

struct Run {
    inner: Arc<Inner>,
    config: BackfillTaskConfig,
    series: SeriesId,
    progress: Arc<Mutex<BackfillProgress>>,
    window: Arc<Mutex<Option<(i64, i64)>>>,
    /// This run's part of the shutdown: stopped on request or with the service.
    shutdown: Shutdown,
}

enum Ended {
    Done(String),
    Stopped,
    Failed(String),
}

impl Run {
    fn update(&self, f: impl FnOnce(&mut BackfillProgress)) -> BackfillProgress {
        let mut p = lock(&self.progress);
        f(&mut p);
        p.updated_at_ms = now_ms();
        p.clone()
    }

    async fn save(&self, p: BackfillProgress) {
        let store = self.inner.store.clone();
        if let Err(e) = blocking(move || store.save_backfill_progress(&p)).await {
            tracing::error!("cannot save backfill progress: {}", report(&e));
        }
    }

    async fn run(self) {
        let p = self.update(|p| {
            p.state = BackfillState::Running;
            p.stop_reason = None;
            p.last_error = None;
            p.candles_written = 0;
            p.batches = 0;
        });
        self.save(p).await;
        let ended = self.crawl().await;
        let p = self.update(|p| match ended {
            Ended::Done(reason) => {
                p.state = BackfillState::Done;
                p.stop_reason = Some(reason);
            }
            Ended::Stopped => {
                p.state = BackfillState::Stopped;
                p.stop_reason = Some("stopped on request".into());
            }
            Ended::Failed(e) => {
                p.state = BackfillState::Failed;
                p.stop_reason = Some("too many errors".into());
                p.last_error = Some(e);
            }
        });
        tracing::info!(state = ?p.state, reason = ?p.stop_reason, written = p.candles_written, "backfill run ended");
        self.save(p).await;
    }

    fn stopped(&self) -> bool {
        self.shutdown.is_stopping()
    }

    /// Sleeps; `true` if stopped meanwhile.
    async fn pause(&self, d: Duration) -> bool {
        tokio::select! {
            () = tokio::time::sleep(d) => self.stopped(),
            () = self.shutdown.stopping() => true,
        }
    }

    async fn crawl(&self) -> Ended {
        let history = loop {
            let instrument = &self.series.instrument;
            let found = match self.inner.sources.venue(&instrument.exchange) {
                Some(v) => v.listing(instrument).map(|l| History::Venue(v.clone(), l)),
                None => {
                    self.inner.sources.resolve(instrument).map(|(s, sym)| History::Binance(s, sym))
                }
            };
            match found {
                Ok(r) => break r,
                Err(e) => {
                    self.update(|p| p.last_error = Some(e.to_string()));
                    if self.pause(Duration::from_secs(2)).await {
                        return Ended::Stopped;
                    }
                }
            }
        };
        let mut failures = 0u32;
        // Retries of failed requests; a rate limit's own wait overrides it.
        let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
        let mut jitter = Jitter::new(&self.series.to_string());
        let now = loop {
            match history.now().await {
                Ok(t) => break t,
                Err(e) => {
                    failures += 1;
                    if failures >= MAX_FAILURES {
                        return Ended::Failed(e.to_string());
                    }
                    let delay = backoff.next_delay(jitter.draw());
                    if self.pause(e.retry_after().unwrap_or(delay)).await {
                        return Ended::Stopped;
                    }
                }
            }
        };
        backoff.reset();
        let newest = Timeframe::M1.bucket_open(now) - MINUTE_MS;
        let oldest =
            Timeframe::M1.bucket_open(now - i64::from(self.config.retention_days) * DAY_MS);
        *lock(&self.window) = Some((oldest, newest));
        let covered = self.update(|p| p.run_started_from = Some(newest)).covered;
        let todo = gaps(&covered, oldest, newest);
        if todo.is_empty() {
            return Ended::Done("window already covered".into());
        }
        let limit = history.page_limit(self.config.batch_limit.max(1));
        // The seed's "consecutive expired batches" stop applies to a task's first run only.
        let first_run = covered.is_empty();
        let mut empty_pages = 0u32;
        // A gap ending above the window's start meets earlier coverage (the seed's stop point);
        // a gap starting below the newest minute is a range an earlier run did not reach.
        let reached_previous = todo.iter().any(|&(lo, _)| lo > oldest);
        let resumed = todo.iter().any(|&(_, hi)| hi < newest);
        for (lo, hi) in todo {
            let mut cursor_hi = hi;
            while cursor_hi >= lo {
                if self.stopped() {
                    return Ended::Stopped;
                }
                let page_lo = (cursor_hi - (limit as i64 - 1) * MINUTE_MS).max(lo);
                let rows = match history.page(page_lo, cursor_hi, limit).await {
                    Ok(rows) => {
                        failures = 0;
                        backoff.reset();
                        rows
                    }
                    Err(e) => {
                        failures += 1;
                        self.update(|p| p.last_error = Some(e.to_string()));
                        if failures >= MAX_FAILURES && !e.is_rate_limit() {
                            return Ended::Failed(e.to_string());
                        }
                        let wait =
                            e.retry_after().unwrap_or_else(|| backoff.next_delay(jitter.draw()));
                        tracing::warn!("backfill request failed, retrying in {wait:?}: {e}");
                        if self.pause(wait).await {
                            return Ended::Stopped;
                        }
                        continue;
                    }
                };
                let mut page: Vec<Candle> = rows
                    .iter()
                    .filter(|(c, close_time)| {
                        c.open_time >= page_lo && c.open_time <= cursor_hi && *close_time < now
                    })
                    .map(|(c, _)| Candle { minutes: 1, ..*c })
                    .filter(|c| c.check().is_ok())
                    .collect();
                page.sort_by_key(|c| c.open_time);
                page.dedup_by_key(|c| c.open_time);
                if page.is_empty() {
                    empty_pages += 1;
                } else {
                    empty_pages = 0;
                }
                if let Err(e) = self.store_page(&page, page_lo, cursor_hi, newest).await {
                    let e = report(&e);
                    failures += 1;
                    self.update(|p| p.last_error = Some(e.clone()));
                    if failures >= MAX_FAILURES {
                        return Ended::Failed(e);
                    }
                    if self.pause(backoff.next_delay(jitter.draw())).await {
                        return Ended::Stopped;
                    }
                    continue;
                }
                if first_run && empty_pages >= self.config.max_expired_batches {
                    return Ended::Done(format!(
                        "{empty_pages} consecutive pages without candles on the first run: the \
                         exchange has no older data"
                    ));
                }
                cursor_hi = page_lo - MINUTE_MS;
                if self.pause(Duration::from_millis(self.config.pause_ms)).await {
                    return Ended::Stopped;
                }
            }
        }
        let mut reason = String::from("retention window covered");
        if reached_previous {
            reason.push_str("; stopped at the previous coverage");
        }
        if resumed {
            reason.push_str("; completed the range an interrupted run had not reached");
        }
        Ended::Done(reason)
    }

    /// Stores a page (1m + the derived candles of every bucket it completes) and the extended
    /// coverage in one transaction, then publishes.
    async fn store_page(
        &self,
        page: &[Candle],
        page_lo: i64,
        page_hi: i64,
        newest: i64,
    ) -> Result<(), StoreError> {
        let progress = {
            let mut p = lock(&self.progress).clone();
            cover(&mut p.covered, page_lo, page_hi);
            p.cursor = Some(page_lo);
            p.candles_written += page.len() as u64;
            p.batches += 1;
            p.updated_at_ms = now_ms();
            p
        };
        let derive = Derive::Buckets {
            timeframes: self.inner.derived.clone(),
            lo: page_lo,
            hi: page_hi,
            newest,
        };
        let store = self.inner.store.clone();
        let record = progress.clone();
        let rows = vec![(self.series.clone(), page.to_vec())];
        self.inner
            .writer
            .write(rows, derive, move |batch| store.write_with_progress(batch, &record))
            .await?;
        *lock(&self.progress) = progress;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: i64 = MINUTE_MS;

    #[test]
    fn gaps_are_the_uncovered_parts_newest_first() {
        assert_eq!(gaps(&[], 0, 10 * M), vec![(0, 10 * M)]);
        assert_eq!(gaps(&[(3 * M, 5 * M)], 0, 10 * M), vec![(6 * M, 10 * M), (0, 2 * M)]);
        assert_eq!(gaps(&[(0, 10 * M)], 0, 10 * M), vec![]);
        assert_eq!(gaps(&[(0, 4 * M), (8 * M, 20 * M)], 2 * M, 10 * M), vec![(5 * M, 7 * M)]);
        // An interrupted run covered [7, 10]; a new run at 15 fills [11, 15], then [0, 6].
        assert_eq!(gaps(&[(7 * M, 10 * M)], 0, 15 * M), vec![(11 * M, 15 * M), (0, 6 * M)]);
        assert_eq!(gaps(&[(-5 * M, -M)], 0, 3 * M), vec![(0, 3 * M)]);
    }

    #[test]
    fn cover_merges_adjacent_minutes() {
        let mut c = vec![];
        cover(&mut c, 5 * M, 7 * M);
        cover(&mut c, 0, 2 * M);
        assert_eq!(c, vec![(0, 2 * M), (5 * M, 7 * M)]);
        cover(&mut c, 3 * M, 4 * M);
        assert_eq!(c, vec![(0, 7 * M)]);
        cover(&mut c, 10 * M, 12 * M);
        cover(&mut c, 6 * M, 11 * M);
        assert_eq!(c, vec![(0, 12 * M)]);
    }
}
