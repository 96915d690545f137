//! [`SqliteStore`]: the [`CandleStore`] in one SQLite file (WAL mode), the default store.
//!
//! # Schema (version [`SCHEMA_VERSION`], kept in `PRAGMA user_version`)
//!
//! ```sql
//! series            (id INTEGER PRIMARY KEY, name TEXT UNIQUE)     -- `exchange:market:SYMBOL:tf`
//! candles_<id>      (open_time INTEGER PRIMARY KEY, open, high, low, close, volume, trades,
//! minutes)
//! backfill_progress (task TEXT PRIMARY KEY, covered TEXT -- JSON [[from,to],...], ...)
//! ```
//!
//! **One candle table per series**, created in the transaction that first writes the series and
//! named after its id in the `series` dictionary, keyed by `open_time` as the rowid. Chosen by
//! measurement over the single `candles (series_id, open_time, ...) PRIMARY KEY (series_id,
//! open_time) WITHOUT ROWID` table (benches/store.rs, 200-row batches over 8 series, same
//! statements otherwise): 2.2 us -> 1.05 us of CPU and 836 -> 318 bytes written per row, 2.2x the
//! rows/s. New candles append at the right edge of their series' b-tree; in the shared table that
//! edge is in the middle of the tree for all but the last series, and SQLite splits such pages by
//! rebalancing them with their neighbours (its append fast path, `balance_quick`, exists only for
//! the rightmost page of a rowid table): a commit wrote ~34 WAL pages there against ~15 here.
//! Reads are one contiguous range of one table either way. Series are few (instruments x
//! timeframes) and never dropped; a connection re-reads the schema once after another one added a
//! series.
//!
//! Every value is stored exactly, as an integer, never a float:
//! - prices are the raw `i64` of [`shared::fixed::Price`];
//! - `volume` (an `i128`) is an `INTEGER` when it fits in an `i64` (always, in practice: 9.2e10
//!   units) and otherwise a 16-byte big-endian two's-complement `BLOB` (the column is `ANY`). One
//!   column, varint-small on disk, readable by SQL in the common case, exact at the extremes;
//! - `trades` (a `u64`) and the progress counters are stored as the `i64` with the same bits, so
//!   values above `i64::MAX` (never seen) read back exactly but look negative to raw SQL.
//!
//! The tables are `STRICT`: SQLite itself refuses a non-integer in an integer column.
//!
//! # Migrations
//!
//! [`MIGRATIONS`] lists the schema steps in order; a file at version `n` gets steps `n..` applied
//! in
//! one `BEGIN IMMEDIATE` transaction together with the new `user_version`, so a crash mid-migration
//! leaves the old version intact and two processes opening the same new file do not race. A file
//! whose version is newer than this build knows is refused ([`StoreError::SchemaTooNew`]) before
//! anything is written to it. Add a migration by appending a step; never edit a released one. The
//! candle tables are created from [`candle_table_ddl`]; a step that changes them must change every
//! `candles_<id>` of the `series` dictionary and the DDL together.
//!
//! # Durability: WAL with `synchronous = NORMAL`
//!
//! A commit appends the transaction's pages to the write-ahead log (`<file>-wal`) without an
//! `fsync`; the log is synced only when it is checkpointed back into the database file.
//! - **Process crash / `kill -9`: safe.** A committed transaction is in the log (in the OS page
//!   cache), so it survives; an uncommitted one is ignored on the next open. Tested by killing a
//!   writer process mid-stream (`tests/store.rs`).
//! - **Power loss / kernel panic:** the database stays consistent (never corrupt, never a partial
//!   transaction), but the transactions committed since the last checkpoint (at most about
//!   `CHECKPOINT_INTERVAL` plus one checkpoint's duration ago, under steady writes) may be
//!   rolled back. For candles this is harmless: the ingest job refetches from the newest stored
//!   candle, and backfill progress is written in the same transaction as its candles, so it never
//!   claims coverage that was lost. `synchronous = FULL` would close this window at the cost of
//!   an `fsync` per commit.
//!
//! Checkpoints run on a background thread (`run_checkpointer`), not inside the commit that
//! happens to cross SQLite's threshold: a `write` costs CPU and page-cache copies, never a wait
//! for the disk.
//!
//! # The series catalogue
//!
//! Each series' count and first and last open time ([`CandleStore::series`]) are kept in memory
//! ([`super::catalogue`]): counted once per table at open (a read of the candle tables' pages;
//! a table that cannot be read leaves its series out and the damage reported) and updated by
//! each write after its commit, the write counting its new rows from the series' span (open
//! times strictly inside it are looked up, one indexed lookup each). One process writes the file
//! (the data directory's lock), so memory stays exact.
//!
//! # Concurrency
//!
//! One writer connection behind a [`Mutex`] (SQLite allows one writer at a time anyway; the lock
//! queues writers in-process instead of spinning on `SQLITE_BUSY`). Reads use other connections
//! from a small pool, so with WAL a read never waits for a write, however long: it sees the last
//! committed state. Writes take the write lock at `BEGIN` (`IMMEDIATE`), so another process
//! writing the same file makes us wait (`busy_timeout`), never fail mid-transaction. The
//! checkpointer has its own connection. Every connection keeps its statements prepared (an LRU of
//! `STATEMENT_CACHE`); a batch costs one dictionary lookup per series only the first time.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags, OptionalExtension, Row, Statement, TransactionBehavior};
use shared::candle::Candle;
use shared::fixed::{Price, Volume};
use shared::protocol::SeriesId;

use crate::lock::{lock, wait_timeout, wait_timeout_while, wait_while};

use super::admission::ReadQueue;
use super::catalogue::{Catalogue, Span};
use super::health::StoreHealth;
use super::{
    backfill_state_name, backfill_state_of, BackfillProgress, BackfillStore, CandleStore,
    RangeQuery, SeriesInfo, SeriesRows, StoreError,
};

/// The schema version this build writes (the number of [`MIGRATIONS`]).
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Schema steps; step `i` takes a file from version `i` to `i + 1`.
pub const MIGRATIONS: &[&str] = &[
    // 1: series dictionary, backfill progress (candle tables come with their series).
    "CREATE TABLE series (
         id   INTEGER PRIMARY KEY,
         name TEXT NOT NULL UNIQUE
     ) STRICT;
     CREATE TABLE backfill_progress (
         task             TEXT    NOT NULL PRIMARY KEY,
         covered          TEXT    NOT NULL,
         run_started_from INTEGER,
         cursor           INTEGER,
         state            TEXT    NOT NULL,
         stop_reason      TEXT,
         candles_written  INTEGER NOT NULL,
         batches          INTEGER NOT NULL,
         last_error       TEXT,
         updated_at_ms    INTEGER NOT NULL
     ) STRICT;",
];

/// The candle table of the series with dictionary id `id`.
pub fn candle_table(id: i64) -> String {
    format!("candles_{id}")
}

/// Creates the candle table of series `id` if it does not exist (schema version 1).
pub fn candle_table_ddl(id: i64) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS candles_{id} (
             open_time INTEGER PRIMARY KEY,
             open      INTEGER NOT NULL,
             high      INTEGER NOT NULL,
             low       INTEGER NOT NULL,
             close     INTEGER NOT NULL,
             volume    ANY     NOT NULL,
             trades    INTEGER NOT NULL,
             minutes   INTEGER NOT NULL
         ) STRICT"
    )
}

/// Page size of a new file (the SQLite default). Each commit rewrites the last page of every
/// series it appends to, so the WAL grows by about `series x page size` per batch: larger pages
/// write more (with the earlier single-table layout, 8 KiB wrote 1.6x the bytes per row of 4 KiB
/// for 200-row batches over 8 series, at the same CPU per row from 1 to 8 KiB).
const PAGE_SIZE: u32 = 4096;
/// How often (at most) the checkpointer copies committed WAL frames into the database file.
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(100);
/// WAL frames (32 MiB at 4 KiB pages) after which the checkpointer briefly holds off writers to
/// finish a checkpoint, so that the next commit starts the log from its beginning again.
const RESTART_FRAMES: i64 = 8192;
/// Safety net should the checkpointer fall far behind: the committing writer checkpoints inline.
const WAL_AUTOCHECKPOINT: i64 = 4 * RESTART_FRAMES;
/// Page cache of each read (and the checkpoint) connection, in KiB (negative `cache_size`).
/// SQLite empties a WAL reader's cache whenever the file changed since its last read, so this
/// holds the pages of one query (a chart load), not the file's history.
const CACHE_KIB: i64 = 32 * 1024;
/// Page cache of the connection that writes candles, in KiB, unless `store.sqlite_writer_cache_kib`
/// says otherwise. Its own writes never empty it, so it keeps every page it ever touched up to
/// this size: as the tables grow, that is their history, while a write needs only each series'
/// newest leaf and the few pages above it (a series' table is 3 levels deep at ~5 million rows).
/// 1 MiB keeps those of ~120 series; more series read theirs from the OS page cache, which costs
/// CPU: 400 series written together took 1.9 µs per row with 1 MiB against 1.5 µs with 4 MiB
/// (BENCHMARKS.md, "Soak"). Raise it for hundreds of series.
pub const WRITER_CACHE_KIB: u32 = crate::config::cluster::SQLITE_WRITER_CACHE_KIB;
/// How long a statement waits for a lock held by another process before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Read connections at most, unless `store.sqlite_readers` says otherwise. Each is opened when
/// first needed and kept; a read that finds them all busy waits for one ([`READER_WAIT`]). Before,
/// such a read opened an extra connection (~0.4 MB with its page cache) and closed it after: a
/// burst of reads could open one per blocking thread, and each made the heap reach a new peak.
pub const READERS: usize = crate::config::cluster::SQLITE_READERS as usize;
/// How long a read waits for a free read connection before it fails with [`StoreError::Busy`].
const READER_WAIT: Duration = Duration::from_secs(10);

/// How a SQLite store is opened (the `[store]` keys that concern it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SqliteOptions {
    /// Page cache of the write connection, in KiB (`store.sqlite_writer_cache_kib`).
    pub writer_cache_kib: u32,
    /// Read connections at most (`store.sqlite_readers`, at least 1).
    pub readers: usize,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions { writer_cache_kib: WRITER_CACHE_KIB, readers: READERS }
    }
}

/// Prepared statements kept per connection: a few per series (write: upsert; read: range both
/// ways, last), so that the active series stay prepared.
const STATEMENT_CACHE: usize = 512;

fn upsert_sql(id: i64) -> String {
    format!(
        "INSERT INTO candles_{id} (open_time, open, high, low, close, volume, trades, minutes) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT (open_time) DO UPDATE SET \
         open = excluded.open, high = excluded.high, low = excluded.low, close = excluded.close, \
         volume = excluded.volume, trades = excluded.trades, minutes = excluded.minutes"
    )
}

const SELECT_SERIES_ID: &str = "SELECT id FROM series WHERE name = ?1";
const INSERT_SERIES: &str = "INSERT INTO series (name) VALUES (?1) ON CONFLICT (name) DO NOTHING";

fn db(e: rusqlite::Error) -> StoreError {
    StoreError::db("SQLite", e)
}

/// The SQLite candle store. Cheap to share behind an `Arc`; every method is blocking (see the
/// module docs of [`super`]).
pub struct SqliteStore {
    /// The database file, for error messages and for opening read connections.
    path: PathBuf,
    /// The one write connection and its series-id cache. Locked for the duration of a write
    /// transaction: SQLite has a single writer per file, so queueing here costs nothing.
    /// Shared with the checkpointer, which takes it to hold writers off while it finishes a log.
    writer: Arc<Mutex<Writer>>,
    /// The read connections (WAL readers never block on the writer).
    readers: Readers,
    /// The queue of reads for them ([`CandleStore::admission`]).
    admission: ReadQueue,
    /// Each series' count and first and last open time, loaded at open and kept by
    /// [`SqliteStore::write_tx`] (one process writes the file: the data directory's lock).
    catalogue: Catalogue,
    /// Wakes the checkpointer after commits; stops it on drop.
    checkpoints: Arc<CheckpointSignal>,
    /// The checkpointer thread, joined by [`CandleStore::close`] or on drop (the store owns it:
    /// it is part of the store, not of the service's tasks).
    checkpointer: Mutex<Option<JoinHandle<()>>>,
    /// What went wrong lately, for `/healthz` ([`CandleStore::problems`]).
    health: StoreHealth,
}

/// Whether `e` says the database file is damaged (`SQLITE_CORRUPT`, `SQLITE_NOTADB`).
fn is_corruption(e: &StoreError) -> bool {
    if matches!(e, StoreError::CorruptFile { .. }) {
        return true;
    }
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(rusqlite::Error::SqliteFailure(f, _)) = c.downcast_ref::<rusqlite::Error>() {
            return matches!(
                f.code,
                rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase
            );
        }
        cause = c.source();
    }
    false
}

/// Between the writer and the checkpointer thread.
#[derive(Default)]
struct CheckpointSignal {
    /// `(committed since the last checkpoint, stop)`.
    state: Mutex<(bool, bool)>,
    cv: Condvar,
}

impl CheckpointSignal {
    fn committed(&self) {
        let mut st = lock(&self.state);
        if !st.0 {
            st.0 = true;
            self.cv.notify_one();
        }
    }

    fn stop(&self) {
        lock(&self.state).1 = true;
        self.cv.notify_one();
    }

    /// Waits for a commit; `false` when asked to stop.
    fn wait_for_commit(&self) -> bool {
        let mut st = wait_while(&self.cv, lock(&self.state), |st| !st.0 && !st.1);
        st.0 = false;
        !st.1
    }

    /// Sleeps `d` unless asked to stop; `false` when asked to stop.
    fn pause(&self, d: Duration) -> bool {
        let st = wait_timeout_while(&self.cv, lock(&self.state), d, |st| !st.1);
        !st.1
    }
}

/// The checkpointer thread: copies committed WAL frames into the database file off the write
/// path, so a commit never waits for a checkpoint's `fsync`s (SQLite's automatic checkpoint runs
/// them inside the commit that crosses its threshold; moving them here gave 1.6x the rows/s of
/// 200-row batches over 8 series on this machine, 650-690 k against 420-430 k, benches/store.rs
/// load tool).
///
/// A `PASSIVE` checkpoint neither blocks nor waits for anyone. Under a continuous stream of
/// commits it never quite reaches the end of the log, and SQLite restarts the log from its
/// beginning only when a write finds it fully checkpointed; so once the log holds
/// [`RESTART_FRAMES`], the checkpointer takes the writer lock for one more `PASSIVE` pass (the few
/// frames committed since the last pass, and two `fsync`s) and the next commit starts the log
/// over. A reader still holding an old snapshot can prevent that; it is retried next time.
fn run_checkpointer(
    conn: Connection,
    writer: Arc<Mutex<Writer>>,
    signal: Arc<CheckpointSignal>,
    path: PathBuf,
) {
    let passive = || -> rusqlite::Result<i64> {
        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get::<_, i64>(1))
    };
    while signal.wait_for_commit() {
        let result = passive().and_then(|log| {
            if log >= RESTART_FRAMES {
                let _writers_wait = lock(&writer);
                passive()?;
            }
            Ok(())
        });
        if let Err(e) = result {
            tracing::warn!(path = %path.display(), error = %e, "store checkpoint failed");
        }
        if !signal.pause(CHECKPOINT_INTERVAL) {
            break;
        }
    }
}

/// The write connection and what it caches.
struct Writer {
    conn: Connection,
    /// Series -> (dictionary id, upsert SQL), filled as series are written. Cleared when a
    /// transaction fails, since series (and tables) it created do not exist.
    series: HashMap<SeriesId, (i64, String)>,
}

/// A bounded pool of read connections: at most `max` open, opened on demand and kept.
struct Readers {
    /// `(idle connections, connections open: idle and in use)`. Locked only to take or return
    /// a connection, never while a query runs.
    state: Mutex<(Vec<Connection>, usize)>,
    /// Signalled when a connection is returned or a slot freed.
    returned: Condvar,
    max: usize,
    /// How long a read waits for a connection.
    wait: Duration,
}

/// What [`Readers::take`] found.
enum Slot {
    /// An idle connection.
    Idle(Connection),
    /// A free slot: open a connection, or give the slot back with [`Readers::release_slot`].
    Open,
    /// All `max` stayed busy for `wait`.
    Busy,
}

impl Readers {
    fn new(max: usize, wait: Duration) -> Self {
        Readers { state: Mutex::new((Vec::new(), 0)), returned: Condvar::new(), max, wait }
    }

    fn take(&self) -> Slot {
        let deadline = Instant::now() + self.wait;
        let mut st = lock(&self.state);
        loop {
            if let Some(conn) = st.0.pop() {
                return Slot::Idle(conn);
            }
            if st.1 < self.max {
                st.1 += 1;
                return Slot::Open;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Slot::Busy;
            }
            st = wait_timeout(&self.returned, st, left);
        }
    }

    /// Adds a connection opened outside [`Readers::take`] (the one opened with the store).
    fn adopt(&self, conn: Connection) {
        lock(&self.state).1 += 1;
        self.give_back(conn);
    }

    fn give_back(&self, conn: Connection) {
        lock(&self.state).0.push(conn);
        self.returned.notify_one();
    }

    /// A slot taken with [`Slot::Open`] whose connection could not be opened.
    fn release_slot(&self) {
        lock(&self.state).1 -= 1;
        self.returned.notify_one();
    }
}

/// A read connection in use; returned to the pool when dropped (also if the query panicked).
struct PoolLease<'a> {
    conn: Option<Connection>,
    pool: &'a Readers,
}

impl Drop for PoolLease<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.give_back(conn);
        }
    }
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore").field("path", &self.path).finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens (creating if needed, with its parent directory) the database at `path`, switches it
    /// to WAL and brings its schema up to [`SCHEMA_VERSION`].
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_with(path, SqliteOptions::default())
    }

    /// [`Self::open`] with the given page cache and read connections.
    pub fn open_with(path: &Path, options: SqliteOptions) -> Result<Self, StoreError> {
        let SqliteOptions { writer_cache_kib, readers } = options;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                StoreError::db(format!("cannot create directory {}", dir.display()), e)
            })?;
        }
        let with_path = |e: rusqlite::Error| StoreError::db(path.display().to_string(), e);
        let mut conn = Connection::open(path).map_err(with_path)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(with_path)?;
        let found: i64 =
            conn.pragma_query_value(None, "user_version", |r| r.get(0)).map_err(with_path)?;
        check_version(path, found)?;
        // Only effective while the file is still empty (a new database); before WAL, which fixes
        // it.
        conn.pragma_update(None, "page_size", PAGE_SIZE).map_err(with_path)?;
        let mode: String =
            conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0)).map_err(with_path)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::db(
                path.display().to_string(),
                format!("cannot switch to WAL mode (got {mode})"),
            ));
        }
        conn.execute_batch(&format!(
            "PRAGMA synchronous = NORMAL; PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT}; \
             PRAGMA cache_size = -{writer_cache_kib}; PRAGMA temp_store = MEMORY;"
        ))
        .map_err(with_path)?;
        migrate(&mut conn, path)?;
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        let writer = Writer { conn, series: HashMap::new() };
        let store = SqliteStore {
            path: path.to_path_buf(),
            writer: Arc::new(Mutex::new(writer)),
            readers: Readers::new(readers.max(1), READER_WAIT),
            admission: ReadQueue::new(
                readers.max(1),
                READER_WAIT,
                path.display().to_string(),
                "store.sqlite_readers",
            ),
            catalogue: Catalogue::default(),
            checkpoints: Arc::new(CheckpointSignal::default()),
            checkpointer: Mutex::new(None),
            health: StoreHealth::new(
                path.display().to_string(),
                "stop the server and restore the file from a backup, or move it aside",
            ),
        };
        let conn = store.open_connection()?;
        let (writer, signal, file) =
            (store.writer.clone(), store.checkpoints.clone(), store.path.clone());
        let handle = std::thread::Builder::new()
            .name("store-checkpoint".into())
            .spawn(move || run_checkpointer(conn, writer, signal, file))
            .map_err(|e| StoreError::db("cannot start the checkpoint thread", e))?;
        *lock(&store.checkpointer) = Some(handle);
        // Open one reader now, so a file we cannot read fails here rather than on the first query.
        store.readers.adopt(store.open_reader()?);
        // A series whose table cannot be read (the file is damaged: `store.quick_check = false`
        // starts on it) is left out and the damage reported, as any read that meets it.
        for found in store.read(load_catalogue)? {
            match found {
                Ok((series, span)) => store.catalogue.merge(&series, span),
                Err(e) => store.failed(false, &e),
            }
        }
        Ok(store)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `PRAGMA quick_check`: reads every page of the file and checks the structure of every
    /// b-tree (not that indexes match their tables — the candle tables have none besides their
    /// rowid). A damaged file is [`StoreError::CorruptFile`] with SQLite's first findings. Costs
    /// a read of the whole file: on the 2-core development VM, 2-3.4 s for a 1.07 GB file in the
    /// page cache, 14-18 s from a cold cache (ARCHITECTURE.md, "Storage faults").
    pub fn quick_check(&self) -> Result<(), StoreError> {
        let corrupt = |detail: String| StoreError::CorruptFile {
            path: self.path.display().to_string(),
            detail,
        };
        let found = self.read(|conn| {
            let mut stmt = conn.prepare("PRAGMA quick_check(5)").map_err(db)?;
            let rows = stmt.query_map([], |r| r.get::<_, String>(0)).map_err(db)?;
            rows.collect::<Result<Vec<String>, _>>().map_err(db)
        });
        match found {
            Ok(lines) if lines.len() == 1 && lines[0] == "ok" => Ok(()),
            Ok(lines) => Err(corrupt(lines.join("; "))),
            Err(e) if is_corruption(&e) => Err(corrupt(crate::error::report(&e))),
            Err(e) => Err(e),
        }
    }

    /// Notes a failed read or write for [`CandleStore::problems`].
    fn failed(&self, write: bool, e: &StoreError) {
        self.health.failed(write, is_corruption(e), e);
    }

    /// A connection to the file for reading or checkpointing (not for writing candles).
    fn open_connection(&self) -> Result<Connection, StoreError> {
        let with_path = |e: rusqlite::Error| StoreError::db(self.path.display().to_string(), e);
        let conn = Connection::open_with_flags(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
                | OpenFlags::SQLITE_OPEN_URI,
        )
        .map_err(with_path)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(with_path)?;
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        conn.execute_batch(&format!(
            "PRAGMA wal_autocheckpoint = 0; PRAGMA cache_size = -{CACHE_KIB};"
        ))
        .map_err(with_path)?;
        Ok(conn)
    }

    fn open_reader(&self) -> Result<Connection, StoreError> {
        let conn = self.open_connection()?;
        // Read-write open (a WAL reader maintains the -shm index) but refusing any write.
        conn.execute_batch("PRAGMA query_only = ON")
            .map_err(|e| StoreError::db(self.path.display().to_string(), e))?;
        Ok(conn)
    }

    /// Runs `f` on a pooled read connection.
    fn read<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let conn = match self.readers.take() {
            Slot::Idle(conn) => conn,
            Slot::Open => self.open_reader().inspect_err(|e| {
                self.readers.release_slot();
                self.failed(false, e);
            })?,
            // Load, not a fault of the file: not counted against the store's health.
            Slot::Busy => {
                return Err(StoreError::Busy {
                    location: self.path.display().to_string(),
                    what: "read",
                    connections: self.readers.max,
                    waited: self.readers.wait,
                    key: "store.sqlite_readers",
                })
            }
        };
        let lease = PoolLease { conn: Some(conn), pool: &self.readers };
        let result = f(lease.conn.as_ref().expect("a lease holds its connection until dropped"));
        match &result {
            Ok(_) => self.health.read(),
            Err(e) => self.failed(false, e),
        }
        result
    }

    /// One transaction: the rows of `batch`, then `progress` if given.
    fn write_tx(
        &self,
        batch: &[SeriesRows<'_>],
        progress: Option<&BackfillProgress>,
    ) -> Result<usize, StoreError> {
        // each series' open times, for the catalogue
        let mut times: BTreeMap<&SeriesId, Vec<i64>> = BTreeMap::new();
        for rows in batch {
            times.entry(rows.series).or_default().extend(rows.candles.iter().map(|c| c.open_time));
        }
        let mut guard = lock(&self.writer);
        let Writer { conn, series } = &mut *guard;
        let result = (|| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(db)?;
            // what the write does to each series' span, asked before any row is written
            let mut spans = Vec::with_capacity(times.len());
            for (s, times) in &mut times {
                times.sort_unstable();
                times.dedup();
                if times.is_empty() {
                    continue;
                }
                let plan = Span::plan(self.catalogue.get(s), times);
                let mut stored = 0;
                if !plan.unsure.is_empty() {
                    series_for_write(&tx, series, s)?;
                    let id = series[*s].0;
                    let sql = format!("SELECT count(*) FROM candles_{id} WHERE open_time = ?1");
                    let mut stmt = tx.prepare_cached(&sql).map_err(on_table(id))?;
                    for t in &plan.unsure {
                        let n: i64 = stmt.query_row([t], |r| r.get(0)).map_err(on_table(id))?;
                        stored += n as u64;
                    }
                }
                spans.push((*s, plan.after(stored)));
            }
            let mut written = 0;
            for rows in batch {
                if rows.candles.is_empty() {
                    continue;
                }
                let upsert = series_for_write(&tx, series, rows.series)?;
                let mut stmt = tx.prepare_cached(upsert).map_err(db)?;
                for c in rows.candles {
                    bind_and_run(&mut stmt, c)?;
                }
                written += rows.candles.len();
            }
            if let Some(p) = progress {
                save_progress(&tx, p)?;
            }
            tx.commit().map_err(db)?;
            Ok((written, spans))
        })();
        let result = result.map(|(written, spans)| {
            for (s, span) in spans {
                self.catalogue.merge(s, span);
            }
            written
        });
        match &result {
            Ok(_) => {
                self.checkpoints.committed();
                self.health.wrote();
            }
            // The transaction rolled back (dropped): series it created are gone.
            Err(e) => {
                series.clear();
                drop(guard);
                self.failed(true, e);
            }
        }
        result
    }
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        self.checkpoints.stop();
        if let Some(t) = lock(&self.checkpointer).take() {
            let _ = t.join();
        }
    }
}

fn check_version(path: &Path, found: i64) -> Result<(), StoreError> {
    if found > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            path: path.display().to_string(),
            found,
            supported: SCHEMA_VERSION,
        });
    }
    if found < 0 {
        return Err(StoreError::Corrupt {
            table: "user_version",
            detail: format!("negative schema version {found}"),
        });
    }
    Ok(())
}

fn migrate(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    let with_path =
        |e: rusqlite::Error| StoreError::db(format!("{}: migrating the schema", path.display()), e);
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(with_path)?;
    // Read again under the write lock: another process may have migrated meanwhile.
    let found: i64 =
        tx.pragma_query_value(None, "user_version", |r| r.get(0)).map_err(with_path)?;
    check_version(path, found)?;
    if found == SCHEMA_VERSION {
        return Ok(()); // dropping `tx` ends the empty transaction
    }
    for (i, step) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        tx.execute_batch(step).map_err(|e| {
            StoreError::db(format!("{}: migration {} failed", path.display(), i + 1), e)
        })?;
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION).map_err(with_path)?;
    tx.commit().map_err(with_path)?;
    tracing::info!(path = %path.display(), from = found, to = SCHEMA_VERSION, "store schema migrated");
    Ok(())
}

/// The upsert SQL of `series`, adding it to the dictionary and creating its table if needed.
fn series_for_write<'a>(
    conn: &Connection,
    cache: &'a mut HashMap<SeriesId, (i64, String)>,
    series: &SeriesId,
) -> Result<&'a str, StoreError> {
    if !cache.contains_key(series) {
        let name = series.to_string();
        conn.prepare_cached(INSERT_SERIES).map_err(db)?.execute([&name]).map_err(db)?;
        let id: i64 = conn
            .prepare_cached(SELECT_SERIES_ID)
            .map_err(db)?
            .query_row([&name], |r| r.get(0))
            .map_err(db)?;
        // A no-op (no schema change) when it exists: once per series per process.
        conn.execute_batch(&candle_table_ddl(id)).map_err(db)?;
        cache.insert(series.clone(), (id, upsert_sql(id)));
    }
    Ok(&cache[series].1)
}

fn series_id_for_read(conn: &Connection, series: &SeriesId) -> Result<Option<i64>, StoreError> {
    conn.prepare_cached(SELECT_SERIES_ID)
        .map_err(db)?
        .query_row([series.to_string()], |r| r.get(0))
        .optional()
        .map_err(db)
}

/// Maps errors of statements on series `id`'s candle table: a missing table (at prepare time, or
/// at step time after a schema change) means a corrupt dictionary.
fn on_table(id: i64) -> impl Fn(rusqlite::Error) -> StoreError {
    move |e| match &e {
        rusqlite::Error::SqliteFailure(_, Some(msg)) if msg.starts_with("no such table") => {
            corrupt("series", format!("series id {id} has no table {}", candle_table(id)))
        }
        _ => db(e),
    }
}

/// Binds one candle to the upsert and executes it.
fn bind_and_run(stmt: &mut Statement<'_>, c: &Candle) -> Result<(), StoreError> {
    stmt.raw_bind_parameter(1, c.open_time).map_err(db)?;
    stmt.raw_bind_parameter(2, c.open.raw()).map_err(db)?;
    stmt.raw_bind_parameter(3, c.high.raw()).map_err(db)?;
    stmt.raw_bind_parameter(4, c.low.raw()).map_err(db)?;
    stmt.raw_bind_parameter(5, c.close.raw()).map_err(db)?;
    let v = c.volume.raw();
    match i64::try_from(v) {
        Ok(small) => stmt.raw_bind_parameter(6, small),
        Err(_) => stmt.raw_bind_parameter(6, v.to_be_bytes()),
    }
    .map_err(db)?;
    stmt.raw_bind_parameter(7, c.trades as i64).map_err(db)?;
    stmt.raw_bind_parameter(8, c.minutes).map_err(db)?;
    stmt.raw_execute().map_err(db)?;
    Ok(())
}

fn corrupt(table: &'static str, detail: impl Into<String>) -> StoreError {
    StoreError::Corrupt { table, detail: detail.into() }
}

/// An integer column, or `Corrupt`.
fn int(row: &Row<'_>, idx: usize, table: &'static str, column: &str) -> Result<i64, StoreError> {
    match row.get_ref(idx).map_err(db)? {
        ValueRef::Integer(v) => Ok(v),
        other => {
            Err(corrupt(table, format!("{column} is {:?}, not an integer", other.data_type())))
        }
    }
}

fn opt_int(
    row: &Row<'_>,
    idx: usize,
    table: &'static str,
    column: &str,
) -> Result<Option<i64>, StoreError> {
    match row.get_ref(idx).map_err(db)? {
        ValueRef::Null => Ok(None),
        _ => int(row, idx, table, column).map(Some),
    }
}

fn opt_text(
    row: &Row<'_>,
    idx: usize,
    table: &'static str,
    column: &str,
) -> Result<Option<String>, StoreError> {
    match row.get_ref(idx).map_err(db)? {
        ValueRef::Null => Ok(None),
        ValueRef::Text(t) => std::str::from_utf8(t)
            .map(|s| Some(s.to_owned()))
            .map_err(|_| corrupt(table, format!("{column} is not UTF-8"))),
        other => Err(corrupt(table, format!("{column} is {:?}, not text", other.data_type()))),
    }
}

fn text(
    row: &Row<'_>,
    idx: usize,
    table: &'static str,
    column: &str,
) -> Result<String, StoreError> {
    opt_text(row, idx, table, column)?.ok_or_else(|| corrupt(table, format!("{column} is NULL")))
}

/// Decodes a row of `SELECT open_time, open, high, low, close, volume, trades, minutes`.
fn decode_candle(row: &Row<'_>) -> Result<Candle, StoreError> {
    const T: &str = "candles";
    let open_time = int(row, 0, T, "open_time")?;
    let at = |what: String| corrupt(T, format!("open_time {open_time}: {what}"));
    let volume = match row.get_ref(5).map_err(db)? {
        ValueRef::Integer(v) => v as i128,
        ValueRef::Blob(b) => match <[u8; 16]>::try_from(b) {
            Ok(bytes) => i128::from_be_bytes(bytes),
            Err(_) => return Err(at(format!("volume is a {}-byte blob, not 16", b.len()))),
        },
        other => return Err(at(format!("volume is {:?}, not an integer", other.data_type()))),
    };
    let minutes = int(row, 7, T, "minutes")?;
    Ok(Candle {
        open_time,
        open: Price::from_raw(int(row, 1, T, "open")?),
        high: Price::from_raw(int(row, 2, T, "high")?),
        low: Price::from_raw(int(row, 3, T, "low")?),
        close: Price::from_raw(int(row, 4, T, "close")?),
        volume: Volume::from_raw(volume),
        trades: int(row, 6, T, "trades")? as u64,
        minutes: u32::try_from(minutes)
            .map_err(|_| at(format!("minutes {minutes} out of range")))?,
    })
}

fn save_progress(conn: &Connection, p: &BackfillProgress) -> Result<(), StoreError> {
    let covered =
        serde_json::to_string(&p.covered).map_err(|e| StoreError::db("encoding coverage", e))?;
    conn.prepare_cached(
        "INSERT OR REPLACE INTO backfill_progress (task, covered, run_started_from, cursor, state, \
         stop_reason, candles_written, batches, last_error, updated_at_ms) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )
    .map_err(db)?
    .execute(rusqlite::params![
        p.task,
        covered,
        p.run_started_from,
        p.cursor,
        backfill_state_name(p.state),
        p.stop_reason,
        p.candles_written as i64,
        p.batches as i64,
        p.last_error,
        p.updated_at_ms,
    ])
    .map_err(db)?;
    Ok(())
}

fn decode_progress(row: &Row<'_>) -> Result<BackfillProgress, StoreError> {
    const T: &str = "backfill_progress";
    let task = text(row, 0, T, "task")?;
    let covered_json = text(row, 1, T, "covered")?;
    let covered: Vec<(i64, i64)> = serde_json::from_str(&covered_json)
        .map_err(|e| corrupt(T, format!("task {task}: covered {covered_json:?}: {e}")))?;
    Ok(BackfillProgress {
        covered,
        run_started_from: opt_int(row, 2, T, "run_started_from")?,
        cursor: opt_int(row, 3, T, "cursor")?,
        state: {
            let name = text(row, 4, T, "state")?;
            backfill_state_of(&name)
                .ok_or_else(|| corrupt(T, format!("task {task}: state {name:?}")))?
        },
        stop_reason: opt_text(row, 5, T, "stop_reason")?,
        candles_written: int(row, 6, T, "candles_written")? as u64,
        batches: int(row, 7, T, "batches")? as u64,
        last_error: opt_text(row, 8, T, "last_error")?,
        updated_at_ms: int(row, 9, T, "updated_at_ms")?,
        task,
    })
}

/// Each series with candles and its span, or why it cannot be read: the catalogue's load at
/// open, the one time the store counts the rows of every candle table (a read of their pages).
#[allow(clippy::type_complexity)]
fn load_catalogue(
    conn: &Connection,
) -> Result<Vec<Result<(SeriesId, Span), StoreError>>, StoreError> {
    let mut all = Vec::new();
    {
        let mut stmt = conn.prepare_cached("SELECT id, name FROM series").map_err(db)?;
        let mut rows = stmt.query([]).map_err(db)?;
        while let Some(row) = rows.next().map_err(db)? {
            all.push((int(row, 0, "series", "id")?, text(row, 1, "series", "name")?));
        }
    }
    let span = |id: i64, name: &str| -> Result<Option<(SeriesId, Span)>, StoreError> {
        let series = name.parse().map_err(|e| corrupt("series", format!("name {name:?}: {e}")))?;
        let count: i64 = conn
            .prepare_cached(&format!("SELECT count(*) FROM candles_{id}"))
            .and_then(|mut stmt| stmt.query_row([], |r| r.get(0)))
            .map_err(on_table(id))?;
        // a series whose only batch failed to write has an empty table
        Ok(match (edge(conn, id, "ASC")?, edge(conn, id, "DESC")?) {
            (Some(first), Some(last)) => Some((series, Span { count: count as u64, first, last })),
            _ => None,
        })
    };
    Ok(all.iter().filter_map(|(id, name)| span(*id, name).transpose()).collect())
}

/// The oldest (`ASC`) or newest (`DESC`) open time in series `id`'s table.
fn edge(conn: &Connection, id: i64, order: &str) -> Result<Option<i64>, StoreError> {
    let sql = format!("SELECT open_time FROM candles_{id} ORDER BY open_time {order} LIMIT 1");
    let mut stmt = conn.prepare_cached(&sql).map_err(on_table(id))?;
    let mut rows = stmt.query([]).map_err(on_table(id))?;
    match rows.next().map_err(on_table(id))? {
        Some(row) => int(row, 0, "candles", "open_time").map(Some),
        None => Ok(None),
    }
}

impl CandleStore for SqliteStore {
    fn write(&self, batch: &[SeriesRows<'_>]) -> Result<usize, StoreError> {
        self.write_tx(batch, None)
    }

    fn problems(&self) -> Vec<String> {
        self.health.problems()
    }

    /// With neither bound, the newest `limit` candles (like Binance). Rows come back oldest first.
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
        self.read(|conn| {
            let Some(id) = series_id_for_read(conn, series)? else {
                return Ok(Vec::new());
            };
            let sql = format!(
                "SELECT open_time, open, high, low, close, volume, trades, minutes FROM candles_{id} \
                 WHERE open_time BETWEEN ?1 AND ?2 ORDER BY open_time {} LIMIT ?3",
                q.order()
            );
            let mut stmt = conn.prepare_cached(&sql).map_err(on_table(id))?;
            let mut rows =
                stmt.query(rusqlite::params![q.lo, q.hi, q.sql_limit()]).map_err(on_table(id))?;
            let mut out = Vec::with_capacity(q.limit.min(4096));
            while let Some(row) = rows.next().map_err(on_table(id))? {
                out.push(decode_candle(row)?);
            }
            Ok(q.finish(out))
        })
    }

    fn last_open_time(&self, series: &SeriesId) -> Result<Option<i64>, StoreError> {
        self.read(|conn| match series_id_for_read(conn, series)? {
            Some(id) => edge(conn, id, "DESC"),
            None => Ok(None),
        })
    }

    /// Sorted by series name; from memory (the catalogue), touching no table.
    fn series(&self) -> Result<Vec<SeriesInfo>, StoreError> {
        Ok(self.catalogue.list())
    }

    fn admission(&self) -> Option<&ReadQueue> {
        Some(&self.admission)
    }

    fn close(&self) {
        self.checkpoints.stop();
        if let Some(t) = lock(&self.checkpointer).take() {
            let _ = t.join();
        }
        // Fold the log into the file now, so the next start reads a short WAL.
        if let Err(e) =
            lock(&self.writer).conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        {
            tracing::warn!(path = %self.path.display(), error = %e, "final store checkpoint failed");
        }
    }
}

impl BackfillStore for SqliteStore {
    fn backfill_progress(&self, task: &str) -> Result<Option<BackfillProgress>, StoreError> {
        self.read(|conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT task, covered, run_started_from, cursor, state, stop_reason, candles_written, \
                     batches, last_error, updated_at_ms FROM backfill_progress WHERE task = ?1",
                )
                .map_err(db)?;
            let mut rows = stmt.query([task]).map_err(db)?;
            match rows.next().map_err(db)? {
                Some(row) => decode_progress(row).map(Some),
                None => Ok(None),
            }
        })
    }

    fn save_backfill_progress(&self, progress: &BackfillProgress) -> Result<(), StoreError> {
        self.write_tx(&[], Some(progress)).map(|_| ())
    }

    fn write_with_progress(
        &self,
        batch: &[SeriesRows<'_>],
        progress: &BackfillProgress,
    ) -> Result<usize, StoreError> {
        self.write_tx(batch, Some(progress))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_follow_the_dictionary_id() {
        assert_eq!(candle_table(42), "candles_42");
        assert!(candle_table_ddl(42).contains("candles_42 ("));
        assert!(upsert_sql(42).starts_with("INSERT INTO candles_42 "));
    }

    #[test]
    fn versions() {
        let p = Path::new("x.db");
        assert!(check_version(p, 0).is_ok());
        assert!(check_version(p, SCHEMA_VERSION).is_ok());
        assert!(matches!(
            check_version(p, SCHEMA_VERSION + 1),
            Err(StoreError::SchemaTooNew { found, supported, .. }) if found == SCHEMA_VERSION + 1 && supported == SCHEMA_VERSION
        ));
        assert!(matches!(check_version(p, -1), Err(StoreError::Corrupt { .. })));
    }

    /// The writer's page cache is the configured one (its own writes never empty it); readers
    /// keep theirs for chart loads.
    #[test]
    fn the_writer_has_its_own_page_cache_size() {
        let dir =
            std::env::temp_dir().join(format!("millrace-sqlite-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let cache = |conn: &Connection| -> i64 {
            conn.pragma_query_value(None, "cache_size", |r| r.get(0)).unwrap()
        };
        for (file, store) in [
            ("default.db", SqliteStore::open(&dir.join("default.db")).unwrap()),
            (
                "small.db",
                SqliteStore::open_with(
                    &dir.join("small.db"),
                    SqliteOptions { writer_cache_kib: 256, ..SqliteOptions::default() },
                )
                .unwrap(),
            ),
        ] {
            let want = if file == "small.db" { 256 } else { i64::from(WRITER_CACHE_KIB) };
            assert_eq!(cache(&lock(&store.writer).conn), -want, "{file}");
            assert_eq!(store.read(|c| Ok(cache(c))).unwrap(), -CACHE_KIB, "{file}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Reads share at most `store.sqlite_readers` connections, opened when first needed and
    /// kept: more reads at once wait for one (before, each opened a connection of its own and
    /// closed it after). A read that waits too long fails as busy, which is load, not a fault of
    /// the file; a read that panics still returns its connection.
    #[test]
    fn reads_share_a_bounded_pool_of_connections() {
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        let dir = std::env::temp_dir().join(format!("millrace-sqlite-pool-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let options = SqliteOptions { readers: 2, ..SqliteOptions::default() };
        let mut store = SqliteStore::open_with(&dir.join("pool.db"), options).unwrap();
        let (now, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    store
                        .read(|_| {
                            most.fetch_max(now.fetch_add(1, SeqCst) + 1, SeqCst);
                            std::thread::sleep(Duration::from_millis(50));
                            now.fetch_sub(1, SeqCst);
                            Ok(())
                        })
                        .unwrap()
                });
            }
        });
        assert_eq!(most.load(SeqCst), 2, "reads at once");
        let (idle, open) = {
            let st = lock(&store.readers.state);
            (st.0.len(), st.1)
        };
        assert_eq!((idle, open), (2, 2), "connections kept and opened");

        store.readers = Readers::new(1, Duration::from_millis(100));
        let shared = &store;
        let busy = std::thread::scope(|s| {
            let (held_tx, held_rx) = std::sync::mpsc::channel();
            let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
            s.spawn(move || {
                shared
                    .read(move |_| {
                        held_tx.send(()).unwrap();
                        go_rx.recv().unwrap();
                        Ok(())
                    })
                    .unwrap()
            });
            held_rx.recv().unwrap();
            let busy = shared.read(|_| Ok(()));
            go_tx.send(()).unwrap();
            busy
        });
        match busy {
            Err(e @ StoreError::Busy { connections: 1, .. }) => {
                assert!(e.to_string().contains("store.sqlite_readers"), "{e}")
            }
            other => panic!("expected Busy, got {other:?}"),
        }
        assert!(store.problems().is_empty(), "{:?}", store.problems());
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            store.read(|_| -> Result<(), StoreError> { panic!("a query that panics") })
        }));
        assert!(panicked.is_err());
        store.read(|_| Ok(())).expect("the panicking read returned its connection");
        assert_eq!(lock(&store.readers.state).1, 1);
        drop(store);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn every_migration_applies_to_an_empty_database() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn, Path::new(":memory:")).unwrap();
        let v: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0)).unwrap();
        assert_eq!(v, SCHEMA_VERSION);
        // Idempotent: a second run is a no-op.
        migrate(&mut conn, Path::new(":memory:")).unwrap();
    }

    #[test]
    fn range_queries_use_the_rowid_without_sorting() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn, Path::new(":memory:")).unwrap();
        conn.execute_batch(&candle_table_ddl(1)).unwrap();
        for (sql, range) in [
            ("SELECT open_time FROM candles_1 WHERE open_time BETWEEN 0 AND 9 ORDER BY open_time DESC LIMIT 5", true),
            ("SELECT open_time FROM candles_1 WHERE open_time BETWEEN 0 AND 9 ORDER BY open_time ASC LIMIT 5", true),
            ("SELECT open_time FROM candles_1 ORDER BY open_time DESC LIMIT 1", false),
        ] {
            let plan: Vec<String> = conn
                .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                .unwrap()
                .query_map([], |r| r.get::<_, String>(3))
                .unwrap()
                .map(Result::unwrap)
                .collect();
            let plan = plan.join(" | ");
            assert!(!range || plan.contains("USING INTEGER PRIMARY KEY"), "{sql}: {plan}");
            assert!(!plan.contains("TEMP B-TREE"), "{sql} sorts: {plan}");
        }
    }
}
