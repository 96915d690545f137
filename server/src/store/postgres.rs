//! [`PostgresStore`]: the [`CandleStore`] and [`BackfillStore`] in PostgreSQL, the shared history
//! of a cluster (`[store] kind = "postgres"`).
//!
//! # Schema (version [`SCHEMA_VERSION`], kept in `millrace_schema`)
//!
//! ```sql
//! series            (id integer identity PRIMARY KEY, name text UNIQUE)   -- exchange:market:SYMBOL:tf
//! candles           (series_id, open_time, open, high, low, close, volume numeric(40,0),
//!                    trades numeric(20,0), minutes, PRIMARY KEY (series_id, open_time))
//! backfill_progress (task text PRIMARY KEY, covered jsonb, ...)
//! series_stats      (series_id PRIMARY KEY, candles, first_open_time, last_open_time)
//! ```
//!
//! One table for every series (PostgreSQL's heap appends wherever there is room and the
//! primary-key b-tree splits pages cheaply; the per-series tables of the SQLite store answer an
//! SQLite-specific page-split cost). Every value is exact: prices are the raw `i64` of
//! [`Price`], volume (`i128`) and trades (`u64`) are `numeric`, which holds them whole.
//!
//! # Writes
//!
//! One [`CandleStore::write`] is one transaction. Rows are de-duplicated by key in the batch
//! (the last wins, as in SQLite), then upserted (`ON CONFLICT (series_id, open_time) DO UPDATE`):
//! writing a candle twice never duplicates it. How the rows reach the server is
//! [`WriteMethod`]: by default COPY straight into `candles` under a savepoint (PostgreSQL's bulk
//! path; new keys are the common case: live ingest, a new backfill page) and, when a key exists,
//! COPY into a session-local staging table and one `INSERT … SELECT … ON CONFLICT` from it; or
//! one `INSERT … SELECT FROM unnest($arrays) ON CONFLICT`. Chosen by benchmark
//! (`benches/store_pg.rs`, BENCHMARKS.md).
//!
//! The same transaction keeps `series_stats`, each series' count and first and last open time
//! (the catalogue, [`super::catalogue`]): read for the written series under their locks, the
//! rows newly stored counted from it (one query only for open times strictly inside a series'
//! span), written back. Which keys are stored is then known before the rows are sent, so a
//! write with a stored key (a derived bucket written again) goes to the staging table at once.
//! The store keeps the catalogue in memory, updated after each commit, and reads
//! `series_stats` again at most every [`CATALOGUE_REFRESH`] when asked for it, for what other
//! processes wrote: `GET /api/v1/series` counts no row. `series_stats` is kept by this
//! version's writes: migrating to it (version 2) counts every series once; a process of an
//! older version writing on meanwhile would leave its rows uncounted.
//!
//! Writers of one series are serialised by a transaction-scoped advisory lock on its id, so two
//! processes writing the same series (two persisters, two backfills) commit one after the
//! other, never interleaved.
//!
//! # Migrations
//!
//! [`MIGRATIONS`] run in one transaction under an advisory lock, so processes starting together
//! migrate once; a database newer than this build is refused ([`StoreError::SchemaTooNew`]).
//!
//! # Connections
//!
//! One bounded pool of every connection the store opens (`store.pg_pool_size`), in a write
//! lane (writes, the reads writes need, the health check) and a read lane, so reads never
//! starve writes; reads from the REST API queue for the read lane before they take a blocking
//! thread ([`CandleStore::admission`]). The trait is blocking: the service calls it on blocking
//! threads. A connection found broken is dropped and the next call opens a new one, so a
//! PostgreSQL restart costs the calls made while it is down an error each (the callers retry
//! with back-off), never the process. TLS and `store.url`: [`super::pg_connect`]. The pool:
//! [`super::pg_pool`].

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use postgres::{Client, Row, Transaction};
use shared::candle::Candle;
use shared::fixed::{Price, Volume};
use shared::protocol::SeriesId;

use super::admission::ReadQueue;
use super::catalogue::{Catalogue, Plan, Span};
use super::health::StoreHealth;
use super::pg_connect::{Connector, PgUrl};
use super::pg_pool::{self, Lane, Pool, PoolLease, Slot};
use super::{
    backfill_state_name, backfill_state_of, BackfillProgress, BackfillStore, CandleStore,
    RangeQuery, SeriesInfo, SeriesRows, StoreError,
};
use crate::lock::lock;

/// The schema version this build writes (the number of [`MIGRATIONS`]).
pub const SCHEMA_VERSION: i32 = MIGRATIONS.len() as i32;

/// Schema steps; step `i` takes a database from version `i` to `i + 1`.
pub const MIGRATIONS: &[&str] = &[
    // 1: series dictionary, candles, backfill progress.
    "CREATE TABLE series (
         id   integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
         name text NOT NULL UNIQUE
     );
     CREATE TABLE candles (
         series_id integer NOT NULL,
         open_time bigint  NOT NULL,
         open      bigint  NOT NULL,
         high      bigint  NOT NULL,
         low       bigint  NOT NULL,
         close     bigint  NOT NULL,
         volume    numeric(40, 0) NOT NULL,
         trades    numeric(20, 0) NOT NULL,
         minutes   bigint  NOT NULL,
         PRIMARY KEY (series_id, open_time)
     );
     CREATE TABLE backfill_progress (
         task             text   NOT NULL PRIMARY KEY,
         covered          jsonb  NOT NULL,
         run_started_from bigint,
         cursor           bigint,
         state            text   NOT NULL,
         stop_reason      text,
         candles_written  bigint NOT NULL,
         batches          bigint NOT NULL,
         last_error       text,
         updated_at_ms    bigint NOT NULL
     );",
    // 2: each series' count and first and last open time, kept by every write in its
    // transaction, for the catalogue (`GET /api/v1/series`) without counting `candles`.
    "CREATE TABLE series_stats (
         series_id       integer PRIMARY KEY,
         candles         bigint  NOT NULL,
         first_open_time bigint  NOT NULL,
         last_open_time  bigint  NOT NULL
     );
     INSERT INTO series_stats
         SELECT series_id, count(*), min(open_time), max(open_time) FROM candles
         GROUP BY series_id;",
];

/// The advisory lock key of migrations ("millrace" in ASCII, as an i64).
const MIGRATION_LOCK: i64 = 0x6d69_6c6c_7261_6365;

/// How a write's rows reach PostgreSQL (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WriteMethod {
    /// `COPY` straight into `candles` (under a savepoint); when a key already exists, `COPY`
    /// into a temporary staging table and one `INSERT … SELECT … ON CONFLICT` instead.
    #[default]
    CopyStaging,
    /// One `INSERT … SELECT FROM unnest(arrays) … ON CONFLICT` with the rows as array
    /// parameters.
    Unnest,
}

/// How a PostgreSQL store is opened (the `[store]` keys that concern it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PgOptions {
    /// Connections at most (`store.pg_pool_size`; at least [`pg_pool::MIN_POOL_SIZE`]).
    pub pool_size: usize,
    pub method: WriteMethod,
}

impl PgOptions {
    /// As `[store]` says (`store.pg_pool_size`).
    pub fn from_config(store: &crate::config::StoreConfig) -> Self {
        PgOptions { pool_size: store.pg_pool_size as usize, ..Default::default() }
    }
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions { pool_size: pg_pool::POOL_SIZE, method: WriteMethod::default() }
    }
}

/// The PostgreSQL store. See the module documentation.
pub struct PostgresStore {
    /// How to open a connection (`store.url`, TLS included).
    connector: Connector,
    /// How messages name the store ([`LOCATION`]).
    display: String,
    method: WriteMethod,
    /// Every connection of the store, in a read and a write lane.
    pool: Pool,
    /// The REST API's reads queue here for the read lane ([`CandleStore::admission`]).
    admission: ReadQueue,
    /// Series name -> id, for series whose row is committed.
    ids: Mutex<HashMap<String, i32>>,
    /// Each series' count and first and last open time (`series_stats`), for
    /// [`CandleStore::series`].
    catalogue: Catalogue,
    refresh: Mutex<Refresh>,
    /// What went wrong lately, for `/healthz` ([`CandleStore::problems`]).
    health: StoreHealth,
}

/// The catalogue's last refresh from `series_stats`.
#[derive(Debug, Default)]
struct Refresh {
    at: Option<Instant>,
    running: bool,
}

/// How often at most the catalogue is read again from `series_stats` when asked for: what another
/// process committed (the persister on another gateway) shows in `GET /api/v1/series` at most
/// this late; this process's own writes show at once.
pub const CATALOGUE_REFRESH: Duration = Duration::from_secs(2);

fn db(context: impl Into<String>) -> impl FnOnce(postgres::Error) -> StoreError {
    let context = context.into();
    move |e| StoreError::db(context, e)
}

/// Whether `e` may have left its connection unusable: an error of the client library that the
/// server did not report (an IO error, a reset, a protocol error), or a server error that ends
/// the session (`FATAL`, e.g. the backend terminated by an administrator or a restart). Such a
/// connection is dropped and the next call opens a new one.
fn connection_suspect(e: &StoreError) -> bool {
    match e {
        StoreError::Db { source, .. } => {
            source.downcast_ref::<postgres::Error>().is_some_and(|pg| match pg.as_db_error() {
                None => true,
                Some(db) => matches!(db.severity(), "FATAL" | "PANIC"),
            })
        }
        _ => false,
    }
}

fn corrupt(table: &'static str, detail: impl Into<String>) -> StoreError {
    StoreError::Corrupt { table, detail: detail.into() }
}

/// How messages, the log and `/healthz` name the store: by its configuration key, never by the
/// URL, which may hold a password (`crate::redact` shows it at start, in the log only).
const LOCATION: &str = "at `store.url`";

impl PostgresStore {
    /// Parses `url` (a `postgres://` URL or a `key=value` string), connects, and migrates the
    /// database to [`SCHEMA_VERSION`].
    pub fn open(url: &str) -> Result<Self, StoreError> {
        Self::open_with(url, PgOptions::default())
    }

    /// [`PostgresStore::open`] with a pool size and a [`WriteMethod`].
    pub fn open_with(url: &str, options: PgOptions) -> Result<Self, StoreError> {
        let display = LOCATION.to_string();
        let connector = PgUrl::parse(url).and_then(Connector::new).map_err(StoreError::Url)?;
        let health =
            StoreHealth::new(display.clone(), "find the rows that do not decode and repair them");
        let pool = Pool::new(options.pool_size);
        let admission = ReadQueue::new(
            pool.cap(Lane::Reads),
            pg_pool::READ_WAIT,
            "the PostgreSQL store".into(),
            "store.pg_pool_size",
        );
        let store = PostgresStore {
            connector,
            display,
            method: options.method,
            pool,
            admission,
            ids: Mutex::new(HashMap::new()),
            catalogue: Catalogue::default(),
            refresh: Mutex::new(Refresh::default()),
            health,
        };
        store.on_lane(Lane::Writes, |client| migrate(client, &store.display))?;
        store.refresh_catalogue()?;
        lock(&store.refresh).at = Some(Instant::now());
        Ok(store)
    }

    /// Open connections of the read and the write lane.
    pub fn connections(&self) -> (usize, usize) {
        self.pool.open()
    }

    /// How this store is named in messages: by its configuration key, not its URL.
    pub fn location(&self) -> &str {
        &self.display
    }

    fn connect(&self) -> Result<Client, StoreError> {
        self.connector.connect().map_err(|e| {
            let mode = self.connector.mode();
            let display = &self.display;
            StoreError::db(format!("connecting to PostgreSQL {display} (sslmode={mode})"), e)
        })
    }

    /// Runs `f` on a connection of `lane` (an idle one, or a new one if the lane has room;
    /// else it waits for one, up to the lane's bound); a connection that may have broken is
    /// dropped, its place left for a new one.
    fn on_lane<T>(
        &self,
        lane: Lane,
        f: impl FnOnce(&mut Client) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let client = match self.pool.take(lane) {
            Slot::Idle(client) if !client.is_closed() => *client,
            // closed while idle (a restart, a terminated backend): a new one in its place
            Slot::Idle(_) | Slot::Open => {
                self.connect().inspect_err(|_| self.pool.release(lane))?
            }
            Slot::Busy => return Err(self.pool.busy(lane)),
        };
        let mut lease = PoolLease::new(&self.pool, lane, client);
        let out = f(lease.client());
        if out.as_ref().is_err_and(connection_suspect) {
            lease.discard();
        }
        out
    }

    /// Runs `f` on a connection of the read lane.
    fn read<T>(
        &self,
        f: impl FnOnce(&mut Client) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.read_on(Lane::Reads, f)
    }

    /// A read on `lane` (the write lane: the reads the service's own work needs), noted for
    /// [`CandleStore::problems`]; waiting too long is load, not a fault of the store.
    fn read_on<T>(
        &self,
        lane: Lane,
        f: impl FnOnce(&mut Client) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let out = self.on_lane(lane, f);
        match &out {
            Ok(_) => self.health.read(),
            Err(StoreError::Busy { .. }) => {}
            Err(e) => self.failed(false, e),
        }
        out
    }

    /// Notes a failed read or write for [`CandleStore::problems`]; a row that does not decode
    /// is damaged data.
    fn failed(&self, write: bool, e: &StoreError) {
        let corrupt = matches!(e, StoreError::Corrupt { .. });
        self.health.failed(write, corrupt, e);
    }

    /// Runs `f` in one transaction on a connection of the write lane.
    fn write_tx<T>(
        &self,
        f: impl FnOnce(&mut Transaction<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let result = self.on_lane(Lane::Writes, |client| {
            let mut tx = client.transaction().map_err(db("beginning a transaction"))?;
            let out = f(&mut tx)?;
            tx.commit().map_err(db("committing"))?;
            Ok(out)
        });
        match &result {
            Ok(_) => self.health.wrote(),
            Err(e) => self.failed(true, e),
        }
        result
    }

    /// Ids of `names` (creating the missing series in `tx`, two statements for all of them);
    /// returns the ones created, to be cached once the transaction commits.
    fn series_ids(
        &self,
        tx: &mut Transaction<'_>,
        names: &[String],
        out: &mut Vec<i32>,
    ) -> Result<Vec<(String, i32)>, StoreError> {
        let missing: Vec<&String> = {
            let ids = lock(&self.ids);
            names.iter().filter(|n| !ids.contains_key(*n)).collect()
        };
        let mut created: Vec<(String, i32)> = Vec::new();
        if !missing.is_empty() {
            tx.execute(
                "INSERT INTO series (name) SELECT unnest($1::text[]) ON CONFLICT (name) DO NOTHING",
                &[&missing],
            )
            .map_err(db("adding series"))?;
            created = tx
                .query("SELECT name, id FROM series WHERE name = ANY($1)", &[&missing])
                .map_err(db("reading the ids of series"))?
                .iter()
                .map(|r| (r.get::<_, String>(0), r.get::<_, i32>(1)))
                .collect();
        }
        let new: HashMap<&str, i32> = created.iter().map(|(n, id)| (n.as_str(), *id)).collect();
        let ids = lock(&self.ids);
        for name in names {
            let id =
                ids.get(name).or_else(|| new.get(name.as_str())).copied().ok_or_else(|| {
                    StoreError::db(format!("series {name}"), "no id after adding it")
                })?;
            out.push(id);
        }
        Ok(created)
    }

    fn write_batch(
        &self,
        batch: &[SeriesRows<'_>],
        progress: Option<&BackfillProgress>,
    ) -> Result<usize, StoreError> {
        // the last row of a key wins, as in one SQLite transaction of INSERT OR REPLACE
        let mut by_series: BTreeMap<String, (&SeriesId, BTreeMap<i64, &Candle>)> = BTreeMap::new();
        for rows in batch {
            let (_, m) =
                by_series.entry(rows.series.to_string()).or_insert((rows.series, BTreeMap::new()));
            for c in rows.candles {
                m.insert(c.open_time, c);
            }
        }
        let names: Vec<String> = by_series.keys().cloned().collect();
        let written: usize = by_series.values().map(|(_, m)| m.len()).sum();
        let (created, spans) = self.write_tx(|tx| {
            let mut ids = Vec::with_capacity(names.len());
            let created = self.series_ids(tx, &names, &mut ids)?;
            // one writer per series at a time across processes, in id order (no deadlock)
            let mut locks = ids.clone();
            locks.sort_unstable();
            if !locks.is_empty() {
                tx.execute(
                    "SELECT pg_advisory_xact_lock(1, id) FROM unnest($1::int4[]) AS id ORDER BY id",
                    &[&locks],
                )
                .map_err(db("locking the series"))?;
            }
            // what the write does to each series' span (read under the series' locks: exact)
            let written: Vec<(i32, &SeriesId, Vec<i64>)> = ids
                .iter()
                .zip(by_series.values())
                .filter(|(_, (_, m))| !m.is_empty())
                .map(|(id, (series, m))| (*id, *series, m.keys().copied().collect()))
                .collect();
            let spans = plan_spans(tx, &written)?;
            let none_stored = spans.iter().all(|(_, _, none_stored)| *none_stored);
            let rows: Vec<(i32, &Candle)> = ids
                .iter()
                .zip(by_series.values())
                .flat_map(|(id, (_, m))| m.values().map(move |c| (*id, *c)))
                .collect();
            if !rows.is_empty() {
                match self.method {
                    WriteMethod::CopyStaging => copy_rows(tx, &rows, none_stored)?,
                    WriteMethod::Unnest => unnest_rows(tx, &rows)?,
                }
                save_spans(tx, &spans)?;
            }
            if let Some(p) = progress {
                save_progress(tx, p)?;
            }
            let spans: Vec<(SeriesId, Span)> =
                spans.into_iter().map(|(s, span, _)| (s.clone(), span.1)).collect();
            Ok((created, spans))
        })?;
        lock(&self.ids).extend(created);
        for (series, span) in &spans {
            self.catalogue.merge(series, *span);
        }
        Ok(written)
    }

    /// Reads `series_stats` into the catalogue (at open, and at most every
    /// [`CATALOGUE_REFRESH`] when asked for it: other processes write too). On the write lane.
    fn refresh_catalogue(&self) -> Result<(), StoreError> {
        let rows = self.read_on(Lane::Writes, |client| {
            client
                .query(
                    "SELECT s.name, s.id, st.candles, st.first_open_time, st.last_open_time \
                     FROM series_stats st JOIN series s ON s.id = st.series_id",
                    &[],
                )
                .map_err(db("reading the series catalogue"))
        })?;
        let mut ids = Vec::with_capacity(rows.len());
        for r in &rows {
            let name: String = r.get(0);
            let series: SeriesId =
                name.parse().map_err(|e| corrupt("series", format!("name {name:?}: {e}")))?;
            let count: i64 = r.get(2);
            let span = Span {
                count: u64::try_from(count)
                    .map_err(|_| corrupt("series_stats", format!("{name}: {count} candles")))?,
                first: r.get(3),
                last: r.get(4),
            };
            self.catalogue.merge(&series, span);
            ids.push((name, r.get::<_, i32>(1)));
        }
        lock(&self.ids).extend(ids);
        Ok(())
    }

    /// [`PostgresStore::refresh_catalogue`] if the last one is older than
    /// [`CATALOGUE_REFRESH`] and none is running; a failure is noted and the catalogue in
    /// memory stays.
    fn refresh_catalogue_if_due(&self) {
        {
            let mut r = lock(&self.refresh);
            if r.running || r.at.is_some_and(|at| at.elapsed() < CATALOGUE_REFRESH) {
                return;
            }
            r.running = true;
        }
        // (running cleared however the refresh ends)
        struct Done<'a>(&'a Mutex<Refresh>);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                let mut r = lock(self.0);
                r.running = false;
                r.at = Some(Instant::now());
            }
        }
        let _done = Done(&self.refresh);
        if let Err(e) = self.refresh_catalogue() {
            tracing::warn!(error = %crate::error::report(&e), "the series catalogue was not refreshed");
        }
    }

    /// The ids of `series` (those not stored yet: `None`), one query for the ones not cached.
    fn series_ids_for_read(
        &self,
        client: &mut Client,
        series: &[SeriesId],
    ) -> Result<Vec<Option<i32>>, StoreError> {
        let names: Vec<String> = series.iter().map(ToString::to_string).collect();
        let missing: Vec<&String> = {
            let ids = lock(&self.ids);
            names.iter().filter(|n| !ids.contains_key(*n)).collect()
        };
        if !missing.is_empty() {
            let rows = client
                .query("SELECT name, id FROM series WHERE name = ANY($1)", &[&missing])
                .map_err(db("reading the ids of series"))?;
            let mut ids = lock(&self.ids);
            for r in rows {
                ids.insert(r.get::<_, String>(0), r.get::<_, i32>(1));
            }
        }
        let ids = lock(&self.ids);
        Ok(names.iter().map(|n| ids.get(n).copied()).collect())
    }

    fn series_id_for_read(
        &self,
        client: &mut Client,
        series: &SeriesId,
    ) -> Result<Option<i32>, StoreError> {
        let ids = self.series_ids_for_read(client, std::slice::from_ref(series))?;
        Ok(ids.into_iter().next().flatten())
    }
}

const UPSERT_SET: &str = "ON CONFLICT (series_id, open_time) DO UPDATE SET open = EXCLUDED.open, \
     high = EXCLUDED.high, low = EXCLUDED.low, close = EXCLUDED.close, volume = EXCLUDED.volume, \
     trades = EXCLUDED.trades, minutes = EXCLUDED.minutes";

/// The rows as COPY text (the columns of `candles`, in order: `series_id open_time open high
/// low close volume trades minutes`).
pub fn copy_text(rows: &[(i32, &Candle)]) -> Vec<u8> {
    let mut text = Vec::with_capacity(rows.len() * 96);
    for (id, c) in rows {
        writeln!(
            text,
            "{id}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            c.open_time,
            c.open.raw(),
            c.high.raw(),
            c.low.raw(),
            c.close.raw(),
            c.volume.raw(),
            c.trades,
            c.minutes
        )
        .expect("writing to a Vec");
    }
    text
}

fn copy_into(tx: &mut Transaction<'_>, table: &str, text: &[u8]) -> Result<(), StoreError> {
    let context = || format!("copying candles into {table}");
    let mut w = tx.copy_in(&format!("COPY {table} FROM STDIN")).map_err(db(context()))?;
    w.write_all(text).map_err(|e| StoreError::db(context(), e))?;
    w.finish().map_err(db(context()))?;
    Ok(())
}

fn is_unique_violation(e: &StoreError) -> bool {
    matches!(e, StoreError::Db { source, .. } if source
        .downcast_ref::<postgres::Error>()
        .and_then(postgres::Error::code)
        == Some(&postgres::error::SqlState::UNIQUE_VIOLATION))
}

/// COPY straight into `candles` under a savepoint when no key is stored (`none_stored`, from
/// the series' spans: live 1m minutes, a new backfill page): PostgreSQL's bulk path. If a key
/// exists after all (rows written by hand), the COPY fails with a unique violation, the
/// savepoint is rolled back, and the rows go through the staging table and one upsert, as they
/// do at once when a key is known to be stored (a derived bucket written again, a gap fill).
fn copy_rows(
    tx: &mut Transaction<'_>,
    rows: &[(i32, &Candle)],
    none_stored: bool,
) -> Result<(), StoreError> {
    let text = copy_text(rows);
    if none_stored {
        let mut sp = tx.savepoint("fresh").map_err(db("starting a savepoint"))?;
        match copy_into(&mut sp, "candles", &text) {
            Ok(()) => {
                sp.commit().map_err(db("releasing the savepoint"))?;
                return Ok(());
            }
            Err(e) if is_unique_violation(&e) => {
                sp.rollback().map_err(db("rolling back to the savepoint"))?;
            }
            Err(e) => return Err(e),
        }
    }
    // (created here each time it is needed: a table created in a transaction that later
    // rolled back is gone)
    tx.batch_execute(
        "CREATE TEMPORARY TABLE IF NOT EXISTS candles_in \
         (LIKE candles INCLUDING DEFAULTS) ON COMMIT DELETE ROWS",
    )
    .map_err(db("creating the staging table"))?;
    copy_into(tx, "candles_in", &text)?;
    tx.execute(&format!("INSERT INTO candles SELECT * FROM candles_in {UPSERT_SET}"), &[])
        .map_err(db("upserting candles from the staging table"))?;
    // the staging rows go at commit (ON COMMIT DELETE ROWS); a failed transaction rolls them
    // back with everything else
    Ok(())
}

/// What a write does to each series of `written` (id, series, its open times sorted): the span
/// after it, and whether none of its rows was stored before. From the spans of `series_stats`,
/// read under the series' locks (so exact), and one query for the times strictly inside a span
/// ([`Span::plan`]), if any.
#[allow(clippy::type_complexity)]
fn plan_spans<'a>(
    tx: &mut Transaction<'_>,
    written: &[(i32, &'a SeriesId, Vec<i64>)],
) -> Result<Vec<(&'a SeriesId, (i32, Span), bool)>, StoreError> {
    let ids: Vec<i32> = written.iter().map(|(id, _, _)| *id).collect();
    let mut before: HashMap<i32, Span> = HashMap::new();
    for r in tx
        .query(
            "SELECT series_id, candles, first_open_time, last_open_time FROM series_stats \
             WHERE series_id = ANY($1)",
            &[&ids],
        )
        .map_err(db("reading the spans of series"))?
    {
        let count: i64 = r.get(1);
        let span = Span { count: count.max(0) as u64, first: r.get(2), last: r.get(3) };
        before.insert(r.get(0), span);
    }
    let plans: Vec<Plan> =
        written.iter().map(|(id, _, times)| Span::plan(before.get(id).copied(), times)).collect();
    let (mut ask_ids, mut ask_times) = (Vec::new(), Vec::new());
    for ((id, _, _), plan) in written.iter().zip(&plans) {
        ask_ids.extend(std::iter::repeat_n(*id, plan.unsure.len()));
        ask_times.extend_from_slice(&plan.unsure);
    }
    let mut stored: HashMap<i32, u64> = HashMap::new();
    if !ask_ids.is_empty() {
        for r in tx
            .query(
                "SELECT u.s, count(*) FROM unnest($1::int4[], $2::int8[]) AS u(s, t) \
                 JOIN candles c ON c.series_id = u.s AND c.open_time = u.t GROUP BY u.s",
                &[&ask_ids, &ask_times],
            )
            .map_err(db("finding the stored candles of a write"))?
        {
            stored.insert(r.get(0), r.get::<_, i64>(1).max(0) as u64);
        }
    }
    Ok(written
        .iter()
        .zip(plans)
        .map(|((id, series, _), plan)| {
            let stored = stored.get(id).copied().unwrap_or(0);
            (*series, (*id, plan.after(stored)), plan.none_stored(stored))
        })
        .collect())
}

/// Records the spans of a write in `series_stats`.
fn save_spans(
    tx: &mut Transaction<'_>,
    spans: &[(&SeriesId, (i32, Span), bool)],
) -> Result<(), StoreError> {
    let (mut ids, mut counts, mut firsts, mut lasts) = (vec![], vec![], vec![], vec![]);
    for (_, (id, span), _) in spans {
        ids.push(*id);
        counts.push(i64::try_from(span.count).unwrap_or(i64::MAX));
        firsts.push(span.first);
        lasts.push(span.last);
    }
    tx.execute(
        "INSERT INTO series_stats (series_id, candles, first_open_time, last_open_time) \
         SELECT * FROM unnest($1::int4[], $2::int8[], $3::int8[], $4::int8[]) \
         ON CONFLICT (series_id) DO UPDATE SET candles = EXCLUDED.candles, \
         first_open_time = EXCLUDED.first_open_time, last_open_time = EXCLUDED.last_open_time",
        &[&ids, &counts, &firsts, &lasts],
    )
    .map_err(db("recording the spans of series"))?;
    Ok(())
}

fn unnest_rows(tx: &mut Transaction<'_>, rows: &[(i32, &Candle)]) -> Result<(), StoreError> {
    let n = rows.len();
    let mut ids = Vec::with_capacity(n);
    let mut times = Vec::with_capacity(n);
    let mut prices: [Vec<i64>; 4] = std::array::from_fn(|_| Vec::with_capacity(n));
    let mut volumes = Vec::with_capacity(n);
    let mut trades = Vec::with_capacity(n);
    let mut minutes = Vec::with_capacity(n);
    for (id, c) in rows {
        ids.push(*id);
        times.push(c.open_time);
        for (col, p) in prices.iter_mut().zip([c.open, c.high, c.low, c.close]) {
            col.push(p.raw());
        }
        volumes.push(c.volume.raw().to_string());
        trades.push(c.trades.to_string());
        minutes.push(i64::from(c.minutes));
    }
    let sql = format!(
        "INSERT INTO candles (series_id, open_time, open, high, low, close, volume, trades, minutes) \
         SELECT s, t, o, h, l, c, v::numeric, n::numeric, m FROM unnest($1::int4[], $2::int8[], \
         $3::int8[], $4::int8[], $5::int8[], $6::int8[], $7::text[], $8::text[], $9::int8[]) \
         AS u(s, t, o, h, l, c, v, n, m) {UPSERT_SET}"
    );
    tx.execute(
        &sql,
        &[
            &ids, &times, &prices[0], &prices[1], &prices[2], &prices[3], &volumes, &trades,
            &minutes,
        ],
    )
    .map_err(db("upserting candles"))?;
    Ok(())
}

fn save_progress(tx: &mut Transaction<'_>, p: &BackfillProgress) -> Result<(), StoreError> {
    let covered =
        serde_json::to_string(&p.covered).map_err(|e| StoreError::db("encoding coverage", e))?;
    tx.execute(
        "INSERT INTO backfill_progress (task, covered, run_started_from, cursor, state, \
         stop_reason, candles_written, batches, last_error, updated_at_ms) \
         VALUES ($1, $2::text::jsonb, $3, $4, $5, $6, $7, $8, $9, $10) \
         ON CONFLICT (task) DO UPDATE SET covered = EXCLUDED.covered, \
         run_started_from = EXCLUDED.run_started_from, cursor = EXCLUDED.cursor, \
         state = EXCLUDED.state, stop_reason = EXCLUDED.stop_reason, \
         candles_written = EXCLUDED.candles_written, batches = EXCLUDED.batches, \
         last_error = EXCLUDED.last_error, updated_at_ms = EXCLUDED.updated_at_ms",
        &[
            &p.task,
            &covered,
            &p.run_started_from,
            &p.cursor,
            &backfill_state_name(p.state),
            &p.stop_reason,
            &(p.candles_written as i64),
            &(p.batches as i64),
            &p.last_error,
            &p.updated_at_ms,
        ],
    )
    .map_err(db(format!("saving the progress of backfill task {}", p.task)))?;
    Ok(())
}

fn migrate(client: &mut Client, display: &str) -> Result<(), StoreError> {
    let mut tx = client.transaction().map_err(db(format!("migrating the schema {display}")))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .map_err(db("locking for migration"))?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS millrace_schema (version integer NOT NULL)")
        .map_err(db("creating millrace_schema"))?;
    let found: Option<i32> = tx
        .query_opt("SELECT version FROM millrace_schema", &[])
        .map_err(db("reading the schema version"))?
        .map(|r| r.get(0));
    let found = found.unwrap_or(0);
    if found > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            path: format!("the database {display}"),
            found: i64::from(found),
            supported: i64::from(SCHEMA_VERSION),
        });
    }
    if found < 0 {
        return Err(corrupt("millrace_schema", format!("version {found}")));
    }
    for (i, step) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        tx.batch_execute(step).map_err(db(format!("schema migration {}", i + 1)))?;
    }
    tx.execute("DELETE FROM millrace_schema", &[]).map_err(db("recording the schema version"))?;
    tx.execute("INSERT INTO millrace_schema (version) VALUES ($1)", &[&SCHEMA_VERSION])
        .map_err(db("recording the schema version"))?;
    tx.commit().map_err(db(format!("committing the schema migration {display}")))?;
    Ok(())
}

fn decode_candle(row: &Row) -> Result<Candle, StoreError> {
    let open_time: i64 = row.get(0);
    let at = |what: String| corrupt("candles", format!("open_time {open_time}: {what}"));
    let whole = |i: usize, name: &str| {
        row.try_get::<_, WholeNumeric>(i)
            .map(|n| n.0)
            .map_err(|e| at(format!("{name}: {}", crate::error::report(&e))))
    };
    let volume = whole(5, "volume")?;
    let trades = whole(6, "trades")?;
    let minutes: i64 = row.get(7);
    Ok(Candle {
        open_time,
        open: Price::from_raw(row.get(1)),
        high: Price::from_raw(row.get(2)),
        low: Price::from_raw(row.get(3)),
        close: Price::from_raw(row.get(4)),
        volume: Volume::from_raw(volume),
        trades: u64::try_from(trades).map_err(|_| at(format!("trades {trades} is not a u64")))?,
        minutes: u32::try_from(minutes).map_err(|_| at(format!("minutes {minutes}")))?,
    })
}

/// A `numeric` without a fraction, read in PostgreSQL's binary form (base-10000 digits) into
/// an `i128`: neither side prints or parses text (a third of an export's read time when
/// `volume` and `trades` came as text).
struct WholeNumeric(i128);

impl WholeNumeric {
    /// The value of a `numeric` in its binary form; `Err` says why it is not a whole i128.
    fn decode(raw: &[u8]) -> Result<i128, String> {
        let word = |i: usize| {
            raw.get(2 * i..2 * i + 2)
                .map(|b| u16::from_be_bytes([b[0], b[1]]))
                .ok_or("a numeric cut short")
        };
        let (digits, weight, sign) = (usize::from(word(0)?), word(1)? as i16, word(2)?);
        if raw.len() != 8 + 2 * digits {
            return Err(format!("a numeric of {} bytes for {digits} digits", raw.len()));
        }
        let negative = match sign {
            0x0000 => false,
            0x4000 => true,
            _ => return Err("a numeric that is NaN or infinite".into()),
        };
        let overflow = || "a numeric beyond an i128";
        // accumulated towards its sign, so i128::MIN reads too
        let mut v: i128 = 0;
        for i in 0..digits {
            let d = word(4 + i)?;
            if d >= 10_000 {
                return Err(format!("a numeric digit {d}"));
            }
            let d = if negative { -i128::from(d) } else { i128::from(d) };
            v = v.checked_mul(10_000).and_then(|v| v.checked_add(d)).ok_or_else(overflow)?;
        }
        if digits > 0 {
            // the digits run from 10000^weight down; trailing zero digits are not sent
            let shift = i32::from(weight) - (digits as i32 - 1);
            if shift < 0 {
                return Err("a numeric with a fraction".into());
            }
            for _ in 0..shift {
                v = v.checked_mul(10_000).ok_or_else(overflow)?;
            }
        }
        Ok(v)
    }
}

impl<'a> postgres::types::FromSql<'a> for WholeNumeric {
    fn from_sql(
        _: &postgres::types::Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(WholeNumeric(WholeNumeric::decode(raw)?))
    }

    fn accepts(ty: &postgres::types::Type) -> bool {
        *ty == postgres::types::Type::NUMERIC
    }
}

const CANDLE_COLUMNS: &str = "open_time, open, high, low, close, volume, trades, minutes";

/// A read of at least this many rows (an export's chunk) comes by `COPY … TO STDOUT` in the
/// binary format: no message per row, every column in binary (BENCHMARKS.md, "Record, replay,
/// export").
const COPY_READ_ROWS: usize = 10_000;

/// `q`'s candles of series `id`, by `COPY (SELECT …) TO STDOUT (FORMAT binary)`, read as they
/// stream in. `COPY` takes no parameters: every value in it is an integer of ours (the bounds
/// typed `int8`: a bare `-9223372036854775808` is a `numeric`, which would miss the index).
fn copy_candles(
    client: &mut Client,
    id: i32,
    q: &RangeQuery,
    series: &SeriesId,
) -> Result<Vec<Candle>, StoreError> {
    use std::io::Read;
    let sql = format!(
        "COPY (SELECT {CANDLE_COLUMNS} FROM candles WHERE series_id = {id} \
         AND open_time BETWEEN '{}'::int8 AND '{}'::int8 ORDER BY open_time {} LIMIT {}) \
         TO STDOUT (FORMAT binary)",
        q.lo,
        q.hi,
        q.order(),
        q.sql_limit()
    );
    let reader =
        client.copy_out(sql.as_str()).map_err(db(format!("reading candles of {series}")))?;
    let mut r = std::io::BufReader::with_capacity(1 << 16, reader);
    let io = |e: std::io::Error| StoreError::Db {
        context: format!("reading candles of {series}"),
        source: Box::new(e),
    };
    let bad = |what: String| corrupt("candles", format!("{series}: {what}"));
    // the signature, the flags, and the header extension (skipped)
    let mut head = [0u8; 19];
    r.read_exact(&mut head).map_err(io)?;
    if &head[..11] != b"PGCOPY\n\xff\r\n\0" {
        return Err(bad("not a binary COPY stream".into()));
    }
    let extension = u32::from_be_bytes(head[15..19].try_into().expect("4 bytes"));
    std::io::copy(&mut (&mut r).take(u64::from(extension)), &mut std::io::sink()).map_err(io)?;
    let mut out = Vec::with_capacity(q.limit.min(1 << 16));
    let mut field = Vec::with_capacity(64);
    loop {
        let mut n = [0u8; 2];
        r.read_exact(&mut n).map_err(io)?;
        match i16::from_be_bytes(n) {
            -1 => break,
            8 => {}
            n => return Err(bad(format!("a row of {n} columns, not 8"))),
        }
        // one column's bytes into `field`: at most 64 (a numeric(40,0) takes 30), never NULL
        let mut next = |field: &mut Vec<u8>| -> Result<(), StoreError> {
            let mut len = [0u8; 4];
            r.read_exact(&mut len).map_err(io)?;
            let len = i32::from_be_bytes(len);
            if !(0..=64).contains(&len) {
                return Err(bad(format!("a column of {len} bytes")));
            }
            field.resize(len as usize, 0);
            r.read_exact(field).map_err(io)
        };
        let mut cols = [0i64; 6];
        let mut wholes = [0i128; 2];
        for (i, slot) in [0usize, 1, 2, 3, 4, 8, 9, 5].into_iter().enumerate() {
            next(&mut field)?;
            if slot >= 8 {
                let name = if slot == 8 { "volume" } else { "trades" };
                wholes[slot - 8] = WholeNumeric::decode(&field)
                    .map_err(|e| bad(format!("open_time {}: {name}: {e}", cols[0])))?;
            } else {
                let b: [u8; 8] = field[..]
                    .try_into()
                    .map_err(|_| bad(format!("column {i}: a bigint not of 8 bytes")))?;
                cols[slot] = i64::from_be_bytes(b);
            }
        }
        let [open_time, open, high, low, close, minutes] = cols;
        let [volume, trades] = wholes;
        let at = |what: String| corrupt("candles", format!("open_time {open_time}: {what}"));
        out.push(Candle {
            open_time,
            open: Price::from_raw(open),
            high: Price::from_raw(high),
            low: Price::from_raw(low),
            close: Price::from_raw(close),
            volume: Volume::from_raw(volume),
            trades: u64::try_from(trades)
                .map_err(|_| at(format!("trades {trades} is not a u64")))?,
            minutes: u32::try_from(minutes).map_err(|_| at(format!("minutes {minutes}")))?,
        });
    }
    Ok(out)
}

impl Drop for PostgresStore {
    /// Closing a blocking client runs a small runtime of its own, which must not happen on a
    /// thread of the service's runtime (the last handle is often dropped there): the
    /// connections are closed on a thread of their own then.
    fn drop(&mut self) {
        let clients = self.pool.drain();
        if tokio::runtime::Handle::try_current().is_ok() {
            // joined at once: closing takes a round trip per connection, and nothing is left
            // running after the store is gone
            let closer =
                std::thread::Builder::new().name("pg-close".into()).spawn(move || drop(clients));
            if let Ok(closer) = closer {
                let _ = closer.join();
            }
        }
    }
}

impl CandleStore for PostgresStore {
    fn write(&self, batch: &[SeriesRows<'_>]) -> Result<usize, StoreError> {
        self.write_batch(batch, None)
    }

    fn candles(
        &self,
        series: &SeriesId,
        start: Option<i64>,
        end: Option<i64>,
        limit: usize,
    ) -> Result<Vec<Candle>, StoreError> {
        let Some(q) = RangeQuery::new(start, end, limit) else {
            return Ok(Vec::new());
        };
        self.read(|client| {
            let Some(id) = self.series_id_for_read(client, series)? else {
                return Ok(Vec::new());
            };
            if q.limit >= COPY_READ_ROWS {
                return Ok(q.finish(copy_candles(client, id, &q, series)?));
            }
            let sql = format!(
                "SELECT {CANDLE_COLUMNS} FROM candles WHERE series_id = $1 \
                 AND open_time BETWEEN $2 AND $3 ORDER BY open_time {} LIMIT $4",
                q.order()
            );
            let rows = client
                .query(&sql, &[&id, &q.lo, &q.hi, &q.sql_limit()])
                .map_err(db(format!("reading candles of {series}")))?;
            let out = rows.iter().map(decode_candle).collect::<Result<Vec<_>, _>>()?;
            Ok(q.finish(out))
        })
    }

    /// One query: each series' newest row by its index (a lateral `max` per id). On the write
    /// lane: a write needs it.
    fn last_open_times(&self, series: &[SeriesId]) -> Result<Vec<Option<i64>>, StoreError> {
        self.read_on(Lane::Writes, |client| {
            let ids = self.series_ids_for_read(client, series)?;
            let known: Vec<i32> = ids.iter().flatten().copied().collect();
            let rows = client
                .query(
                    "SELECT i.id, (SELECT max(open_time) FROM candles c WHERE c.series_id = i.id) \
                     FROM unnest($1::int4[]) AS i(id)",
                    &[&known],
                )
                .map_err(db("reading the newest candles of series"))?;
            let newest: BTreeMap<i32, Option<i64>> =
                rows.iter().map(|r| (r.get::<_, i32>(0), r.get::<_, Option<i64>>(1))).collect();
            Ok(ids.iter().map(|id| id.and_then(|id| newest.get(&id).copied().flatten())).collect())
        })
    }

    /// One query for every range (joined against their array, by the primary key's index). On
    /// the write lane: a write needs it.
    fn candles_in(&self, ranges: &[(SeriesId, i64, i64)]) -> Result<Vec<Vec<Candle>>, StoreError> {
        self.read_on(Lane::Writes, |client| {
            let series: Vec<SeriesId> = ranges.iter().map(|(s, _, _)| s.clone()).collect();
            let ids = self.series_ids_for_read(client, &series)?;
            let (mut ks, mut qs, mut los, mut his) = (vec![], vec![], vec![], vec![]);
            for (k, (id, (_, lo, hi))) in ids.iter().zip(ranges).enumerate() {
                if let Some(id) = id {
                    ks.push(k as i32);
                    qs.push(*id);
                    los.push(*lo);
                    his.push(*hi);
                }
            }
            let sql = format!(
                "SELECT {CANDLE_COLUMNS}, r.k FROM unnest($1::int4[], $2::int4[], $3::int8[], \
                 $4::int8[]) AS r(k, id, lo, hi) JOIN candles c ON c.series_id = r.id \
                 AND c.open_time BETWEEN r.lo AND r.hi ORDER BY r.k, c.open_time"
            );
            let rows = client
                .query(&sql, &[&ks, &qs, &los, &his])
                .map_err(db("reading candles of series"))?;
            let mut out = vec![Vec::new(); ranges.len()];
            for r in &rows {
                let k: i32 = r.get(8);
                if let Some(list) = usize::try_from(k).ok().and_then(|k| out.get_mut(k)) {
                    list.push(decode_candle(r)?);
                }
            }
            Ok(out)
        })
    }

    fn problems(&self) -> Vec<String> {
        self.health.problems()
    }

    fn admission(&self) -> Option<&ReadQueue> {
        Some(&self.admission)
    }

    /// On the write lane: reads cannot delay it.
    fn check(&self) -> Result<(), StoreError> {
        self.read_on(Lane::Writes, |client| {
            client.simple_query("SELECT 1").map_err(db("asking PostgreSQL for SELECT 1"))?;
            Ok(())
        })
    }

    fn last_open_time(&self, series: &SeriesId) -> Result<Option<i64>, StoreError> {
        self.read(|client| {
            let Some(id) = self.series_id_for_read(client, series)? else {
                return Ok(None);
            };
            let row = client
                .query_one("SELECT max(open_time) FROM candles WHERE series_id = $1", &[&id])
                .map_err(db(format!("reading the newest candle of {series}")))?;
            Ok(row.get::<_, Option<i64>>(0))
        })
    }

    /// Sorted by series name; from memory, read again from `series_stats` (one small query)
    /// at most every [`CATALOGUE_REFRESH`] for what other processes wrote.
    fn series(&self) -> Result<Vec<SeriesInfo>, StoreError> {
        self.refresh_catalogue_if_due();
        Ok(self.catalogue.list())
    }
}

impl BackfillStore for PostgresStore {
    fn backfill_progress(&self, task: &str) -> Result<Option<BackfillProgress>, StoreError> {
        const T: &str = "backfill_progress";
        self.read(|client| {
            let Some(r) = client
                .query_opt(
                    "SELECT task, covered::text, run_started_from, cursor, state, stop_reason, \
                     candles_written, batches, last_error, updated_at_ms \
                     FROM backfill_progress WHERE task = $1",
                    &[&task],
                )
                .map_err(db(format!("reading the progress of backfill task {task}")))?
            else {
                return Ok(None);
            };
            let covered_json: String = r.get(1);
            let covered: Vec<(i64, i64)> = serde_json::from_str(&covered_json)
                .map_err(|e| corrupt(T, format!("task {task}: covered {covered_json:?}: {e}")))?;
            let state: String = r.get(4);
            Ok(Some(BackfillProgress {
                task: r.get(0),
                covered,
                run_started_from: r.get(2),
                cursor: r.get(3),
                state: backfill_state_of(&state)
                    .ok_or_else(|| corrupt(T, format!("task {task}: state {state:?}")))?,
                stop_reason: r.get(5),
                candles_written: r.get::<_, i64>(6) as u64,
                batches: r.get::<_, i64>(7) as u64,
                last_error: r.get(8),
                updated_at_ms: r.get(9),
            }))
        })
    }

    fn save_backfill_progress(&self, progress: &BackfillProgress) -> Result<(), StoreError> {
        self.write_batch(&[], Some(progress)).map(|_| ())
    }

    fn write_with_progress(
        &self,
        batch: &[SeriesRows<'_>],
        progress: &BackfillProgress,
    ) -> Result<usize, StoreError> {
        self.write_batch(batch, Some(progress))
    }
}
