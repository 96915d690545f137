//! Candle and progress storage behind two small traits, so the ingest pipeline, backfill and
//! the HTTP API do not care which database holds the data: [`CandleStore`] (candles, for
//! everyone) and [`BackfillStore`] (backfill's progress records, for backfill alone). SQLite
//! (embedded, one file under the data directory, [`sqlite::SqliteStore`]) implements both; the
//! composition root (`app.rs`) is the only place that names it.
//!
//! Writes are **idempotent**: a candle is keyed by `(series, open_time)` and writing the same key
//! again replaces the row, so replays, REST gap fills and backfill overlap never duplicate.
//! One [`CandleStore::write`] call is one transaction: every row of every series in it becomes
//! visible together, or none does (the pipeline relies on this for persist-then-publish, and for
//! "1m and its derived candles are never out of step" after a crash).
//!
//! The trait is synchronous: callers on the async runtime run it on a blocking thread
//! (`tokio::task::spawn_blocking`), SQLite being a blocking library.

pub mod admission;
pub mod catalogue;
pub mod dir_lock;
pub mod health;
pub mod pg_connect;
pub mod pg_pool;
pub mod postgres;
pub mod sqlite;

use std::sync::Arc;

use shared::candle::{Candle, MINUTE_MS};
use shared::protocol::ops::BackfillState;
use shared::protocol::SeriesId;

/// Errors from a store. The database's own error is kept as the
/// [`source`](std::error::Error::source)
/// (print the whole chain with [`crate::error::report`]).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database failed an operation; `context` says which (and on which file).
    #[error("{context}")]
    Db {
        context: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The database file is damaged (found by [`sqlite::SqliteStore::quick_check`] or by SQLite
    /// on a read); `detail` is what SQLite found.
    #[error(
        "the database {path} is corrupt ({detail}); restore it from a backup, or move it (with \
         its -wal and -shm files) aside to start with an empty store that backfill fills again"
    )]
    CorruptFile { path: String, detail: String },
    /// A stored row could not be decoded.
    #[error("corrupt row in {table}: {detail}")]
    Corrupt { table: &'static str, detail: String },
    #[error(
        "schema version {found} of {path} is newer than this millrace understands ({supported})"
    )]
    SchemaTooNew { path: String, found: i64, supported: i64 },
    /// Every `what` (read, write) connection stayed busy for `waited`: load, not a fault of
    /// the store (`key` sizes the connections: `store.sqlite_readers`, `store.pg_pool_size`).
    #[error(
        "all {connections} {what} connections of {location} stayed busy for {waited:?}; raise \
         {key} if they queue this long"
    )]
    Busy {
        location: String,
        what: &'static str,
        connections: usize,
        waited: std::time::Duration,
        key: &'static str,
    },
    /// `store.url` says something the PostgreSQL store cannot use (the URL's text is not shown:
    /// it may hold a password).
    #[error("configuration key `store.url`")]
    Url(#[source] pg_connect::UrlError),
    /// The blocking task that ran the store call panicked.
    #[error("the store task failed")]
    Task(#[source] tokio::task::JoinError),
}

impl StoreError {
    /// A database error with what was being done.
    pub fn db(
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        StoreError::Db { context: context.into(), source: source.into() }
    }
}

/// Runs a read of `store` on a blocking thread once the store admits it
/// ([`CandleStore::admission`]): reads beyond the store's read connections wait on the runtime,
/// not on a blocking thread each, and fail with [`StoreError::Busy`] after the store's bound.
/// For reads that anyone may cause (the REST API); the service's own reads may use [`blocking`].
pub async fn read<T, F>(store: &Arc<dyn CandleStore>, f: F) -> Result<T, StoreError>
where
    F: FnOnce(&dyn CandleStore) -> Result<T, StoreError> + Send + 'static,
    T: Send + 'static,
{
    let permit = match store.admission() {
        Some(admission) => Some(admission.enter().await?),
        None => None,
    };
    let store = store.clone();
    blocking(move || {
        let _admitted = permit;
        f(store.as_ref())
    })
    .await
}

/// Runs a blocking store call on a blocking thread and waits for it (stores are blocking
/// libraries; the service runs on tokio).
pub async fn blocking<T, F>(f: F) -> Result<T, StoreError>
where
    F: FnOnce() -> Result<T, StoreError> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f).await.map_err(StoreError::Task)?
}

/// The candles of one series to write in a [`CandleStore::write`] batch. The slice need not be
/// sorted; rows with an `open_time` already stored replace the stored row.
#[derive(Debug, Clone, Copy)]
pub struct SeriesRows<'a> {
    pub series: &'a SeriesId,
    pub candles: &'a [Candle],
}

/// A series that has stored candles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeriesInfo {
    pub series: SeriesId,
    pub count: u64,
    pub first_open_time: i64,
    pub last_open_time: i64,
}

/// Persisted progress of one backfill task (seeds/incremental-newest-first-backfill.md, adapted:
/// millrace keeps the covered *ranges*, so an interrupted run leaves no hole — the next run fills
/// every part of `[now - retention, now]` not covered yet, newest first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackfillProgress {
    /// Task key (the 1m series id as a string).
    pub task: String,
    /// Disjoint, sorted, closed ranges `[from, to]` of 1m open times known to be complete in the
    /// store (fetched from the exchange; minutes the exchange has no candle for count as covered).
    pub covered: Vec<(i64, i64)>,
    /// Open time the current/last run started from (the newest minute it asked for).
    pub run_started_from: Option<i64>,
    /// Oldest open time the current/last run reached.
    pub cursor: Option<i64>,
    pub state: BackfillState,
    /// Why the last run ended (e.g. `reached previous coverage`, `3 batches older than retention`).
    pub stop_reason: Option<String>,
    /// Candles written by the current/last run.
    pub candles_written: u64,
    /// Batches fetched by the current/last run.
    pub batches: u64,
    pub last_error: Option<String>,
    /// Wall-clock ms of the last update.
    pub updated_at_ms: i64,
}

impl BackfillProgress {
    /// The record of a task that never ran.
    pub fn new(task: String) -> Self {
        BackfillProgress {
            task,
            covered: Vec::new(),
            run_started_from: None,
            cursor: None,
            state: BackfillState::Idle,
            stop_reason: None,
            candles_written: 0,
            batches: 0,
            last_error: None,
            updated_at_ms: 0,
        }
    }
}

/// The rows a [`CandleStore::candles`] call asks for, in the terms of a query: an inclusive
/// open-time range, its order and its limit. `None` when the answer is empty whatever is stored
/// (a zero limit, `start` after `end`). Every store reads with this, so the Binance-like forms
/// mean the same on each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeQuery {
    pub lo: i64,
    pub hi: i64,
    /// Without a start: the newest `limit` rows up to `hi`, read newest first and handed back
    /// oldest first ([`RangeQuery::finish`]).
    pub newest_first: bool,
    pub limit: usize,
}

impl RangeQuery {
    pub fn new(start: Option<i64>, end: Option<i64>, limit: usize) -> Option<RangeQuery> {
        let (lo, hi) = (start.unwrap_or(i64::MIN), end.unwrap_or(i64::MAX));
        (limit > 0 && lo <= hi).then_some(RangeQuery {
            lo,
            hi,
            newest_first: start.is_none(),
            limit,
        })
    }

    /// `ASC` or `DESC`, for the query's `ORDER BY open_time`.
    pub fn order(&self) -> &'static str {
        if self.newest_first {
            "DESC"
        } else {
            "ASC"
        }
    }

    /// The limit as an SQL integer.
    pub fn sql_limit(&self) -> i64 {
        i64::try_from(self.limit).unwrap_or(i64::MAX)
    }

    /// The rows as read, oldest first.
    pub fn finish(&self, mut rows: Vec<Candle>) -> Vec<Candle> {
        if self.newest_first {
            rows.reverse();
        }
        rows
    }
}

/// The name a backfill state is stored as.
pub(crate) fn backfill_state_name(s: BackfillState) -> &'static str {
    match s {
        BackfillState::Idle => "idle",
        BackfillState::Running => "running",
        BackfillState::Done => "done",
        BackfillState::Stopped => "stopped",
        BackfillState::Failed => "failed",
    }
}

/// The backfill state stored as `name`.
pub(crate) fn backfill_state_of(name: &str) -> Option<BackfillState> {
    [
        BackfillState::Idle,
        BackfillState::Running,
        BackfillState::Done,
        BackfillState::Stopped,
        BackfillState::Failed,
    ]
    .into_iter()
    .find(|s| backfill_state_name(*s) == name)
}

/// Candle storage. Implementations are cheap to share (`Arc<dyn CandleStore>`).
pub trait CandleStore: Send + Sync + 'static {
    /// Writes all rows in one transaction; returns the number of rows written.
    fn write(&self, batch: &[SeriesRows<'_>]) -> Result<usize, StoreError>;

    /// Candles of `series` with `start <= open_time <= end` (bounds optional), oldest first, at
    /// most `limit`. With only `end` given, the newest `limit` candles up to `end`; with neither,
    /// the newest `limit` candles (both like Binance). Still returned oldest first.
    fn candles(
        &self,
        series: &SeriesId,
        start: Option<i64>,
        end: Option<i64>,
        limit: usize,
    ) -> Result<Vec<Candle>, StoreError>;

    /// The newest stored open time of `series`, if any.
    fn last_open_time(&self, series: &SeriesId) -> Result<Option<i64>, StoreError>;

    /// [`CandleStore::last_open_time`] of each of `series`, in order. A store across the
    /// network answers in one round trip (a persister's round touches thousands of series).
    fn last_open_times(&self, series: &[SeriesId]) -> Result<Vec<Option<i64>>, StoreError> {
        series.iter().map(|s| self.last_open_time(s)).collect()
    }

    /// Every stored candle of each `(series, first, last)` with `first <= open_time <= last`,
    /// oldest first, in order of `ranges`; one round trip for a store across the network.
    fn candles_in(&self, ranges: &[(SeriesId, i64, i64)]) -> Result<Vec<Vec<Candle>>, StoreError> {
        ranges
            .iter()
            .map(|(s, first, last)| {
                let span = usize::try_from((last - first) / MINUTE_MS + 1).unwrap_or(usize::MAX);
                self.candles(s, Some(*first), Some(*last), span)
            })
            .collect()
    }

    /// Every series with at least one candle, sorted by name. Cheap: from the store's catalogue
    /// in memory ([`catalogue`]), counting no row.
    fn series(&self) -> Result<Vec<SeriesInfo>, StoreError>;

    /// Whether the store answers (a store across the network: one trivial query). Cheap.
    fn check(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// What is wrong with the store now, for `/healthz` (which answers 503 `degraded` while
    /// this is not empty): reads or writes failing, the file found corrupt. Cheap: it reports
    /// what the store's own calls ran into, it queries nothing.
    fn problems(&self) -> Vec<String> {
        Vec::new()
    }

    /// Finishes background work (a final checkpoint) before the service exits; reads and writes
    /// still work afterwards.
    fn close(&self) {}

    /// The queue of reads for [`read`]: as many at once as the store has read connections.
    /// `None`: every read goes at once.
    fn admission(&self) -> Option<&admission::ReadQueue> {
        None
    }
}

/// Backfill's progress records, kept in the same database as the candles so that coverage and
/// candles commit together.
pub trait BackfillStore: CandleStore {
    /// Progress record of a backfill task, if one was saved.
    fn backfill_progress(&self, task: &str) -> Result<Option<BackfillProgress>, StoreError>;

    /// Saves (replaces) a task's progress record.
    fn save_backfill_progress(&self, progress: &BackfillProgress) -> Result<(), StoreError>;

    /// Writes candles and the task's progress in **one** transaction, so a crash never records
    /// coverage for candles that were not stored (and never stores candles twice on a re-run,
    /// writes being idempotent anyway).
    fn write_with_progress(
        &self,
        batch: &[SeriesRows<'_>],
        progress: &BackfillProgress,
    ) -> Result<usize, StoreError>;
}
