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
//!    run missed; "N (3) consecutive batches older than retention" becomes N consecutive pages
//!    with no candle in the window (the exchange has nothing older: before the symbol's listing),
//!    since time-based paging never asks for data beyond the window; "manual stop" is
//!    [`Backfill::stop`].
//!
//! Because coverage is only ever recorded in the transaction that stored the candles, a crash or
//! `kill -9` at any point loses at most the page in flight, and the next run fetches it again.
//! Rate limits (HTTP 429/418) pause the run for the exchange's `Retry-After`; other errors are
//! retried with back-off and, after several failures, end the run as `failed` (progress kept).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use shared::candle::{merge, Candle, Timeframe, MINUTE_MS};
use shared::protocol::SeriesId;
use tokio::sync::watch;

use crate::binance::rest::RestError;
use crate::config::BackfillTaskConfig;
use crate::ingest::pipeline::{publish_closed, Publisher};
use crate::ingest::supervisor::now_ms;
use crate::sources::Sources;
use crate::store::{BackfillProgress, CandleStore, SeriesRows, StoreError};

const DAY_MS: i64 = 86_400_000;
/// Consecutive failed requests before a run gives up (progress is kept).
const MAX_FAILURES: u32 = 8;

/// One task as shown by `GET /api/v1/ops/backfill`.
#[derive(Debug, Clone, Serialize)]
pub struct TaskSnapshot {
    pub series: String,
    pub retention_days: u32,
    pub running: bool,
    pub state: String,
    pub stop_reason: Option<String>,
    /// Covered ranges of 1m open times, oldest first.
    pub covered: Vec<(i64, i64)>,
    /// The window of the current or last run.
    pub window: Option<(i64, i64)>,
    /// Share of the window covered, 0..=1 (for a progress bar).
    pub progress: f64,
    pub cursor: Option<i64>,
    pub run_started_from: Option<i64>,
    pub candles_written: u64,
    pub batches: u64,
    pub last_error: Option<String>,
    pub updated_at_ms: i64,
}

struct Task {
    config: BackfillTaskConfig,
    series: SeriesId,
    progress: Arc<Mutex<BackfillProgress>>,
    window: Arc<Mutex<Option<(i64, i64)>>>,
    stop: Option<watch::Sender<bool>>,
    running: Arc<AtomicBool>,
}

/// The backfill manager: configured tasks, started at boot or on request.
#[derive(Clone)]
pub struct Backfill {
    inner: Arc<Inner>,
}

struct Inner {
    tasks: Mutex<BTreeMap<String, Task>>,
    store: Arc<dyn CandleStore>,
    bus: Arc<dyn Publisher>,
    sources: Arc<Sources>,
    derived: Vec<Timeframe>,
}

impl Backfill {
    /// Loads every task's progress from the store.
    pub fn new(
        tasks: &[BackfillTaskConfig],
        derived: &[Timeframe],
        store: Arc<dyn CandleStore>,
        bus: Arc<dyn Publisher>,
        sources: Arc<Sources>,
    ) -> Result<Self, StoreError> {
        let mut map = BTreeMap::new();
        for t in tasks {
            let series: SeriesId = t.series.parse().map_err(|e| StoreError::Db(format!("backfill series {}: {e}", t.series)))?;
            let key = series.to_string();
            let progress = store.backfill_progress(&key)?.unwrap_or_else(|| BackfillProgress {
                task: key.clone(),
                state: "idle".into(),
                ..Default::default()
            });
            map.insert(
                key,
                Task {
                    config: t.clone(),
                    series,
                    progress: Arc::new(Mutex::new(progress)),
                    window: Arc::default(),
                    stop: None,
                    running: Arc::default(),
                },
            );
        }
        Ok(Self {
            inner: Arc::new(Inner { tasks: Mutex::new(map), store, bus, sources, derived: derived.to_vec() }),
        })
    }

    /// Starts every task configured with `auto_start` (the seed's `auto_start_all`).
    pub fn start_configured(&self) {
        let keys: Vec<String> = {
            let tasks = self.inner.tasks.lock().unwrap_or_else(|p| p.into_inner());
            tasks.iter().filter(|(_, t)| t.config.auto_start).map(|(k, _)| k.clone()).collect()
        };
        for k in keys {
            let _ = self.start(&k);
        }
    }

    /// Starts a run of the task for `series` (no-op if one is running).
    pub fn start(&self, series: &str) -> Result<(), String> {
        let mut tasks = self.inner.tasks.lock().unwrap_or_else(|p| p.into_inner());
        let task = tasks.get_mut(series).ok_or_else(|| format!("no backfill task for {series:?}"))?;
        if task.running.load(Relaxed) {
            return Ok(());
        }
        let (tx, rx) = watch::channel(false);
        task.stop = Some(tx);
        task.running.store(true, Relaxed);
        let run = Run {
            inner: self.inner.clone(),
            config: task.config.clone(),
            series: task.series.clone(),
            progress: task.progress.clone(),
            window: task.window.clone(),
            stop: rx,
        };
        let running = task.running.clone();
        tokio::spawn(async move {
            run.run().await;
            running.store(false, Relaxed);
        });
        Ok(())
    }

    /// Asks the run of `series` to stop after the page in flight.
    pub fn stop(&self, series: &str) -> Result<(), String> {
        let tasks = self.inner.tasks.lock().unwrap_or_else(|p| p.into_inner());
        let task = tasks.get(series).ok_or_else(|| format!("no backfill task for {series:?}"))?;
        if let Some(tx) = &task.stop {
            let _ = tx.send(true);
        }
        Ok(())
    }

    /// Stops every run and waits for them (at most `timeout`).
    pub async fn shutdown(&self, timeout: Duration) {
        let running: Vec<Arc<AtomicBool>> = {
            let tasks = self.inner.tasks.lock().unwrap_or_else(|p| p.into_inner());
            for t in tasks.values() {
                if let Some(tx) = &t.stop {
                    let _ = tx.send(true);
                }
            }
            tasks.values().map(|t| t.running.clone()).collect()
        };
        let deadline = tokio::time::Instant::now() + timeout;
        while running.iter().any(|r| r.load(Relaxed)) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Every task's state and progress.
    pub fn snapshot(&self) -> Vec<TaskSnapshot> {
        let tasks = self.inner.tasks.lock().unwrap_or_else(|p| p.into_inner());
        tasks
            .iter()
            .map(|(k, t)| {
                let p = t.progress.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let window = *t.window.lock().unwrap_or_else(|p| p.into_inner());
                let progress = window.map_or(0.0, |(lo, hi)| {
                    let total = ((hi - lo) / MINUTE_MS + 1) as f64;
                    let done: i64 = p
                        .covered
                        .iter()
                        .map(|&(a, b)| (b.min(hi) - a.max(lo)) / MINUTE_MS + 1)
                        .filter(|n| *n > 0)
                        .sum();
                    (done as f64 / total).clamp(0.0, 1.0)
                });
                TaskSnapshot {
                    series: k.clone(),
                    retention_days: t.config.retention_days,
                    running: t.running.load(Relaxed),
                    state: p.state.clone(),
                    stop_reason: p.stop_reason.clone(),
                    covered: p.covered.clone(),
                    window,
                    progress,
                    cursor: p.cursor,
                    run_started_from: p.run_started_from,
                    candles_written: p.candles_written,
                    batches: p.batches,
                    last_error: p.last_error.clone(),
                    updated_at_ms: p.updated_at_ms,
                }
            })
            .collect()
    }
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
    stop: watch::Receiver<bool>,
}

enum Ended {
    Done(String),
    Stopped,
    Failed(String),
}

impl Run {
    fn update(&self, f: impl FnOnce(&mut BackfillProgress)) -> BackfillProgress {
        let mut p = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut p);
        p.updated_at_ms = now_ms();
        p.clone()
    }

    async fn save(&self, p: BackfillProgress) {
        let store = self.inner.store.clone();
        let r = tokio::task::spawn_blocking(move || store.save_backfill_progress(&p)).await;
        if let Ok(Err(e)) | Err(e) = r.map_err(|e| StoreError::Db(e.to_string())) {
            tracing::error!(series = %self.series, "cannot save backfill progress: {e}");
        }
    }

    async fn run(mut self) {
        let p = self.update(|p| {
            p.state = "running".into();
            p.stop_reason = None;
            p.last_error = None;
            p.candles_written = 0;
            p.batches = 0;
        });
        self.save(p).await;
        let ended = self.crawl().await;
        let p = self.update(|p| match ended {
            Ended::Done(reason) => {
                p.state = "done".into();
                p.stop_reason = Some(reason);
            }
            Ended::Stopped => {
                p.state = "stopped".into();
                p.stop_reason = Some("stopped on request".into());
            }
            Ended::Failed(e) => {
                p.state = "failed".into();
                p.stop_reason = Some("too many errors".into());
                p.last_error = Some(e);
            }
        });
        tracing::info!(series = %self.series, state = %p.state, reason = ?p.stop_reason, written = p.candles_written, "backfill run ended");
        self.save(p).await;
    }

    fn stopped(&self) -> bool {
        *self.stop.borrow()
    }

    /// Sleeps; `true` if stopped meanwhile.
    async fn pause(&mut self, d: Duration) -> bool {
        let mut stop = self.stop.clone();
        let stopped = tokio::select! {
            _ = tokio::time::sleep(d) => false,
            _ = stop.wait_for(|s| *s) => true,
        };
        stopped || self.stopped()
    }

    async fn crawl(&mut self) -> Ended {
        let (source, symbol) = loop {
            match self.inner.sources.resolve(&self.series.instrument) {
                Ok(r) => break r,
                Err(e) => {
                    self.update(|p| p.last_error = Some(e));
                    if self.pause(Duration::from_secs(2)).await {
                        return Ended::Stopped;
                    }
                }
            }
        };
        let mut failures = 0u32;
        let mut delay = Duration::from_millis(500);
        let now = loop {
            match source.rest.server_time().await {
                Ok(t) => break t,
                Err(e) => {
                    failures += 1;
                    if failures >= MAX_FAILURES {
                        return Ended::Failed(e.to_string());
                    }
                    let wait = crate::ingest::kline_job::retry_wait(&e).unwrap_or(delay);
                    delay = (delay * 2).min(Duration::from_secs(30));
                    if self.pause(wait).await {
                        return Ended::Stopped;
                    }
                }
            }
        };
        let newest = Timeframe::M1.bucket_open(now) - MINUTE_MS;
        let oldest = Timeframe::M1.bucket_open(now - self.config.retention_days as i64 * DAY_MS);
        *self.window.lock().unwrap_or_else(|p| p.into_inner()) = Some((oldest, newest));
        let covered = self.update(|p| p.run_started_from = Some(newest)).covered;
        let todo = gaps(&covered, oldest, newest);
        if todo.is_empty() {
            return Ended::Done("window already covered".into());
        }
        let limit = self.config.batch_limit.max(1);
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
                let rows = match source.rest.klines(&symbol, Timeframe::M1, Some(page_lo), Some(cursor_hi + MINUTE_MS - 1), limit).await {
                    Ok(rows) => {
                        failures = 0;
                        delay = Duration::from_millis(500);
                        rows
                    }
                    Err(e) => {
                        failures += 1;
                        self.update(|p| p.last_error = Some(e.to_string()));
                        if failures >= MAX_FAILURES && !matches!(e, RestError::RateLimited { .. }) {
                            return Ended::Failed(e.to_string());
                        }
                        let wait = crate::ingest::kline_job::retry_wait(&e).unwrap_or(delay);
                        delay = (delay * 2).min(Duration::from_secs(30));
                        tracing::warn!(series = %self.series, "backfill request failed, retrying in {wait:?}: {e}");
                        if self.pause(wait).await {
                            return Ended::Stopped;
                        }
                        continue;
                    }
                };
                let mut page: Vec<Candle> = rows
                    .iter()
                    .filter(|r| r.candle.open_time >= page_lo && r.candle.open_time <= cursor_hi && r.close_time < now)
                    .map(|r| Candle { minutes: 1, ..r.candle })
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
                    failures += 1;
                    self.update(|p| p.last_error = Some(e.to_string()));
                    if failures >= MAX_FAILURES {
                        return Ended::Failed(e.to_string());
                    }
                    if self.pause(delay).await {
                        return Ended::Stopped;
                    }
                    continue;
                }
                if empty_pages >= self.config.max_expired_batches {
                    return Ended::Done(format!(
                        "{empty_pages} consecutive pages without candles: the exchange has no older data"
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
    async fn store_page(&self, page: &[Candle], page_lo: i64, page_hi: i64, newest: i64) -> Result<(), StoreError> {
        let store = self.inner.store.clone();
        let series = self.series.clone();
        let derived_tfs = self.inner.derived.clone();
        let page_owned = page.to_vec();
        let progress = {
            let mut p = self.progress.lock().unwrap_or_else(|p| p.into_inner()).clone();
            cover(&mut p.covered, page_lo, page_hi);
            p.cursor = Some(page_lo);
            p.candles_written += page.len() as u64;
            p.batches += 1;
            p.updated_at_ms = now_ms();
            p
        };
        let progress_owned = progress.clone();
        let derived = tokio::task::spawn_blocking(move || -> Result<Vec<(SeriesId, Vec<Candle>)>, StoreError> {
            // Derived candles of the buckets this page touches, from every stored 1m candle of
            // those buckets plus the page; only buckets that have ended on the exchange.
            let mut out = Vec::new();
            for tf in derived_tfs {
                let first = tf.bucket_open(page_lo);
                let last = tf.bucket_open(page_hi);
                let stored = store.candles(&series, Some(first), Some(last + tf.duration_ms() - MINUTE_MS), 100_000)?;
                let mut minutes: BTreeMap<i64, Candle> = stored.into_iter().map(|c| (c.open_time, c)).collect();
                for c in &page_owned {
                    minutes.insert(c.open_time, *c);
                }
                let mut candles = Vec::new();
                let mut bucket = first;
                while bucket <= last {
                    let end = bucket + tf.duration_ms();
                    if end - MINUTE_MS <= newest {
                        let inside: Vec<Candle> = minutes.range(bucket..end).map(|(_, c)| *c).collect();
                        if let Some(c) = merge(tf, &inside) {
                            candles.push(c);
                        }
                    }
                    bucket = end;
                }
                let s = SeriesId { instrument: series.instrument.clone(), timeframe: tf };
                out.push((s, candles));
            }
            let mut rows: Vec<SeriesRows<'_>> = vec![SeriesRows { series: &series, candles: &page_owned }];
            rows.extend(out.iter().map(|(s, c)| SeriesRows { series: s, candles: c }));
            store.write_with_progress(&rows, &progress_owned)?;
            Ok(out)
        })
        .await
        .map_err(|e| StoreError::Db(format!("store task failed: {e}")))??;
        *self.progress.lock().unwrap_or_else(|p| p.into_inner()) = progress;
        // Stored: publish the page right away.
        let bus = self.inner.bus.as_ref();
        publish_closed(bus, &format!("kline@{}", self.series), &self.series, page);
        for (s, candles) in &derived {
            publish_closed(bus, &format!("kline@{s}"), s, candles);
        }
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
