//! The SQLite candle store through its public interface, on real files: idempotence, atomicity,
//! the query forms, progress records, migrations, exact extremes, corrupt rows, concurrency, and a
//! writer process killed with SIGKILL mid-stream.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::Connection;
use server::error::report;
use server::store::sqlite::{SqliteStore, SCHEMA_VERSION};
use server::store::{
    BackfillProgress, BackfillStore, CandleStore, SeriesInfo, SeriesRows, StoreError,
};
use shared::candle::Candle;
use shared::fixed::{Price, Volume};
use shared::protocol::ops::BackfillState;
use shared::protocol::SeriesId;

pub(crate) const MIN: i64 = 60_000;

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "millrace-store-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    fn db(&self) -> PathBuf {
        self.0.join("candles.db")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(crate) fn sid(s: &str) -> SeriesId {
    s.parse().unwrap()
}

/// A 1m candle whose values are all derived from `t` and `tag`, so every field is checked.
pub(crate) fn candle(t: i64, tag: i64) -> Candle {
    let p = 100_000 + tag * 1000 + t / MIN;
    Candle {
        open_time: t,
        open: Price::from_raw(p),
        high: Price::from_raw(p + 7),
        low: Price::from_raw(p - 5),
        close: Price::from_raw(p + 1),
        volume: Volume::from_raw((p as i128) * 3),
        trades: (tag as u64) * 10 + 1,
        minutes: 1,
    }
}

pub(crate) fn run(from: i64, n: i64, tag: i64) -> Vec<Candle> {
    (0..n).map(|i| candle(from + i * MIN, tag)).collect()
}

pub(crate) fn rows<'a>(series: &'a SeriesId, candles: &'a [Candle]) -> SeriesRows<'a> {
    SeriesRows { series, candles }
}

/// Every candle of `series`.
pub(crate) fn all(store: &dyn CandleStore, series: &SeriesId) -> Vec<Candle> {
    store.candles(series, Some(i64::MIN), None, usize::MAX).unwrap()
}

/// A trigger that makes adding series `name` to the dictionary fail, as a disk error would.
fn fail_new_series(path: &Path, name: &str) {
    let conn = Connection::open(path).unwrap();
    conn.execute_batch(&format!(
        "CREATE TRIGGER fail_series BEFORE INSERT ON series WHEN NEW.name = '{name}'
         BEGIN SELECT RAISE(ABORT, 'injected failure'); END;"
    ))
    .unwrap();
}

/// The candle table of `series` (tables are named after the dictionary id).
fn table_of(conn: &Connection, series: &str) -> String {
    let id: i64 =
        conn.query_row("SELECT id FROM series WHERE name = ?1", [series], |r| r.get(0)).unwrap();
    format!("candles_{id}")
}

pub(crate) fn progress(task: &str) -> BackfillProgress {
    BackfillProgress {
        task: task.into(),
        covered: vec![(0, 59 * MIN), (120 * MIN, 600 * MIN)],
        run_started_from: Some(600 * MIN),
        cursor: Some(120 * MIN),
        state: BackfillState::Running,
        stop_reason: None,
        candles_written: 481,
        batches: 1,
        last_error: Some("HTTP 429: slow down".into()),
        updated_at_ms: 1_700_000_000_123,
    }
}

#[test]
fn store_is_send_sync_and_object_safe() {
    fn send_sync<T: Send + Sync + 'static>() {}
    send_sync::<SqliteStore>();
    let dir = TempDir::new("dyn");
    let store: Arc<dyn CandleStore> = Arc::new(SqliteStore::open(&dir.db()).unwrap());
    assert_eq!(store.series().unwrap(), vec![]);
}

#[test]
fn migrates_an_empty_file_creates_parents_and_reopens() {
    let dir = TempDir::new("migrate");
    // A zero-byte file, as `touch` leaves it.
    let empty = dir.db();
    std::fs::write(&empty, b"").unwrap();
    let s = sid("sim:spot:BTC/USDT:1m");
    {
        let store = SqliteStore::open(&empty).unwrap();
        assert_eq!(store.write(&[rows(&s, &run(0, 10, 1))]).unwrap(), 10);
    }
    let conn = Connection::open(&empty).unwrap();
    let v: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
    assert_eq!(v, SCHEMA_VERSION);
    let mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0)).unwrap();
    assert_eq!(mode, "wal");
    drop(conn);
    // Reopen: no migration to run, data intact, writes continue.
    let store = SqliteStore::open(&empty).unwrap();
    assert_eq!(all(&store, &s), run(0, 10, 1));
    store.write(&[rows(&s, &run(10 * MIN, 5, 1))]).unwrap();
    assert_eq!(all(&store, &s), run(0, 15, 1));

    // A path whose directories do not exist yet.
    let nested = dir.0.join("a/b/c/store.db");
    let store = SqliteStore::open(&nested).unwrap();
    assert_eq!(store.path(), nested.as_path());
    assert!(nested.exists());
}

#[test]
fn refuses_a_newer_schema_without_touching_it() {
    let dir = TempDir::new("too-new");
    let path = dir.db();
    {
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch("CREATE TABLE future (x); PRAGMA user_version = 99;").unwrap();
    }
    match SqliteStore::open(&path) {
        Err(StoreError::SchemaTooNew { path: p, found, supported }) => {
            assert_eq!((found, supported), (99, SCHEMA_VERSION));
            assert!(p.ends_with("candles.db"), "{p}");
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
    let err = SqliteStore::open(&path).unwrap_err().to_string();
    assert!(err.contains("99") && err.contains("newer"), "{err}");
    let conn = Connection::open(&path).unwrap();
    let mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0)).unwrap();
    assert_eq!(mode, "delete", "the file was not switched to WAL");
}

#[test]
fn writes_are_idempotent_and_replace_by_key() {
    let dir = TempDir::new("idempotent");
    writes_are_idempotent(&SqliteStore::open(&dir.db()).unwrap());
}

/// Store behaviour every [`CandleStore`] keeps (also run on PostgreSQL, `store_pg.rs`).
pub(crate) fn writes_are_idempotent(store: &dyn CandleStore) {
    let (a, b) = (sid("sim:spot:BTC/USDT:1m"), sid("sim:spot:BTC/USDT:5m"));
    let ca = run(0, 50, 1);
    let cb = run(0, 10, 2);
    let batch = [rows(&a, &ca), rows(&b, &cb)];
    assert_eq!(store.write(&batch).unwrap(), 60);
    assert_eq!(store.write(&batch).unwrap(), 60);
    assert_eq!(all(store, &a), ca);
    assert_eq!(all(store, &b), cb);

    // The same keys with other values replace the rows; unsorted input is fine.
    let mut newer = run(20 * MIN, 40, 3);
    newer.reverse();
    store.write(&[rows(&a, &newer)]).unwrap();
    let mut expected = run(0, 20, 1);
    expected.extend(run(20 * MIN, 40, 3));
    assert_eq!(all(store, &a), expected);

    // Within one batch the later duplicate wins.
    let dup = [candle(0, 8), candle(0, 9)];
    store.write(&[rows(&b, &dup)]).unwrap();
    assert_eq!(store.candles(&b, Some(0), Some(0), 10).unwrap(), vec![candle(0, 9)]);

    // Empty batches and empty series slices are fine and create nothing.
    let c = sid("sim:spot:ETH/USDT:1m");
    assert_eq!(store.write(&[]).unwrap(), 0);
    assert_eq!(store.write(&[rows(&c, &[])]).unwrap(), 0);
    let names: Vec<_> = store.series().unwrap().into_iter().map(|i| i.series).collect();
    assert_eq!(names, vec![a, b]);
}

#[test]
fn a_failing_batch_leaves_nothing() {
    let dir = TempDir::new("atomic");
    let path = dir.db();
    let store = SqliteStore::open(&path).unwrap();
    let (a, b, c) =
        (sid("sim:spot:BTC/USDT:1m"), sid("sim:spot:BTC/USDT:5m"), sid("sim:spot:ETH/USDT:1m"));
    store.write(&[rows(&a, &run(0, 10, 1))]).unwrap();
    fail_new_series(&path, "sim:spot:ETH/USDT:1m");

    // New and replaced rows for `a`, a new series `b` (a new table), then `c` fails.
    let ca = run(5 * MIN, 10, 2);
    let cb = run(0, 300, 3);
    let cc = [candle(998 * MIN, 4), candle(999 * MIN, 4)];
    let err = store.write(&[rows(&a, &ca), rows(&b, &cb), rows(&c, &cc)]).unwrap_err();
    assert!(
        matches!(&err, StoreError::Db { .. }) && report(&err).contains("injected failure"),
        "{err:?}"
    );
    assert_eq!(all(&store, &a), run(0, 10, 1), "a unchanged");
    assert_eq!(all(&store, &b), vec![]);
    assert_eq!(all(&store, &c), vec![]);
    assert_eq!(store.series().unwrap().len(), 1);
    let conn = Connection::open(&path).unwrap();
    let tables: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name LIKE 'candles_%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(tables, 1, "b's table was rolled back");

    // The rolled-back series are not reused from a stale cache: later writes land right.
    conn.execute_batch("DROP TRIGGER fail_series").unwrap();
    store.write(&[rows(&c, &cc[..1]), rows(&b, &cb[..2])]).unwrap();
    assert_eq!(all(&store, &b), cb[..2].to_vec());
    assert_eq!(all(&store, &c), cc[..1].to_vec());
    let names: Vec<_> = store.series().unwrap().into_iter().map(|i| i.series).collect();
    assert_eq!(names, vec![a.clone(), b.clone(), c.clone()]);

    // Progress is not saved when its candles fail, and candles are not when their progress fails.
    let d = sid("sim:spot:SOL/USDT:1m");
    fail_new_series(&path, "sim:spot:SOL/USDT:1m");
    let p = progress("sim:spot:SOL/USDT:1m");
    assert!(store.write_with_progress(&[rows(&c, &cc), rows(&d, &cc)], &p).is_err());
    assert_eq!(store.backfill_progress(&p.task).unwrap(), None);
    assert_eq!(all(&store, &c), cc[..1].to_vec());
    conn.execute_batch(
        "DROP TRIGGER fail_series;
         CREATE TRIGGER fail_progress BEFORE INSERT ON backfill_progress
         BEGIN SELECT RAISE(ABORT, 'injected failure'); END;",
    )
    .unwrap();
    assert!(store.write_with_progress(&[rows(&c, &cc), rows(&d, &cc)], &p).is_err());
    assert_eq!(all(&store, &c), cc[..1].to_vec());
    assert_eq!(all(&store, &d), vec![]);
    conn.execute_batch("DROP TRIGGER fail_progress").unwrap();
    assert_eq!(store.write_with_progress(&[rows(&c, &cc), rows(&d, &cc)], &p).unwrap(), 4);
    assert_eq!(store.backfill_progress(&p.task).unwrap(), Some(p));
    assert_eq!(all(&store, &d), cc.to_vec());
}

#[test]
fn range_and_limit_queries() {
    let dir = TempDir::new("ranges");
    range_and_limit(&SqliteStore::open(&dir.db()).unwrap());
}

pub(crate) fn range_and_limit(store: &dyn CandleStore) {
    let s = sid("binance:spot:BTC/USDT:1m");
    let other = sid("binance:spot:BTC/USDT:3m");
    let base = 1_700_000_040_000 - 1_700_000_040_000 % MIN;
    let cs = run(base, 100, 1);
    store.write(&[rows(&s, &cs), rows(&other, &run(base, 100, 2))]).unwrap();
    let t = |i: i64| base + i * MIN;
    let slice = |from: usize, to: usize| cs[from..to].to_vec();

    // start and end, inclusive, oldest first, limited from the start.
    assert_eq!(store.candles(&s, Some(t(10)), Some(t(19)), 1000).unwrap(), slice(10, 20));
    assert_eq!(store.candles(&s, Some(t(10)), Some(t(19)), 3).unwrap(), slice(10, 13));
    // start only: oldest first from start.
    assert_eq!(store.candles(&s, Some(t(95)), None, 1000).unwrap(), slice(95, 100));
    assert_eq!(store.candles(&s, Some(t(10)), None, 5).unwrap(), slice(10, 15));
    assert_eq!(store.candles(&s, Some(t(10) - 1), None, 2).unwrap(), slice(10, 12));
    // end only: the newest `limit` up to end, returned oldest first.
    assert_eq!(store.candles(&s, None, Some(t(50)), 5).unwrap(), slice(46, 51));
    assert_eq!(store.candles(&s, None, Some(t(50) + 1), 5).unwrap(), slice(46, 51));
    assert_eq!(store.candles(&s, None, Some(t(2)), 500).unwrap(), slice(0, 3));
    // neither: the newest `limit` (like Binance).
    assert_eq!(store.candles(&s, None, None, 4).unwrap(), slice(96, 100));
    assert_eq!(store.candles(&s, None, None, 1000).unwrap(), cs);
    // Empty answers.
    assert_eq!(store.candles(&s, None, None, 0).unwrap(), vec![]);
    assert_eq!(store.candles(&s, Some(t(20)), Some(t(10)), 10).unwrap(), vec![]);
    assert_eq!(store.candles(&s, Some(t(100)), None, 10).unwrap(), vec![]);
    assert_eq!(store.candles(&s, None, Some(base - 1), 10).unwrap(), vec![]);
    assert_eq!(store.candles(&sid("binance:spot:ETH/USDT:1m"), None, None, 10).unwrap(), vec![]);
    // Extreme bounds.
    assert_eq!(store.candles(&s, Some(i64::MIN), Some(i64::MAX), usize::MAX).unwrap(), cs);
    // A read as large as an export's chunk (PostgreSQL reads it through COPY) answers the same.
    assert_eq!(store.candles(&s, None, Some(t(50)), 65_536).unwrap(), slice(0, 51));
    assert_eq!(store.candles(&s, Some(t(10)), Some(t(19)), 65_536).unwrap(), slice(10, 20));
    assert_eq!(store.candles(&s, Some(t(10)), None, 65_536).unwrap(), slice(10, 100));
    // Each series sees only its own rows.
    assert_eq!(store.candles(&other, Some(t(0)), Some(t(0)), 10).unwrap(), vec![candle(base, 2)]);
}

#[test]
fn last_open_time_and_series() {
    let dir = TempDir::new("series");
    newest_and_series(&SqliteStore::open(&dir.db()).unwrap());
}

pub(crate) fn newest_and_series(store: &dyn CandleStore) {
    let (a, b) = (sid("sim:spot:BTC/USDT:1m"), sid("sim:futures:ETH/USDT:1h"));
    assert_eq!(store.last_open_time(&a).unwrap(), None);
    assert_eq!(store.series().unwrap(), vec![]);
    store.write(&[rows(&a, &run(10 * MIN, 30, 1))]).unwrap();
    store.write(&[rows(&a, &run(0, 5, 1)), rows(&b, &run(-3_600_000, 2, 1))]).unwrap();
    assert_eq!(store.last_open_time(&a).unwrap(), Some(39 * MIN));
    assert_eq!(store.last_open_time(&b).unwrap(), Some(-3_600_000 + MIN));
    // Several series at once (one round trip where it matters), in the order asked, an unknown
    // one included.
    let none = sid("sim:spot:SOL/USDT:1m");
    assert_eq!(
        store.last_open_times(&[b.clone(), none.clone(), a.clone()]).unwrap(),
        vec![Some(-3_600_000 + MIN), None, Some(39 * MIN)]
    );
    assert_eq!(store.last_open_times(&[]).unwrap(), Vec::<Option<i64>>::new());
    let ranges = [
        (a.clone(), 2 * MIN, 12 * MIN),
        (none, 0, MIN),
        (b.clone(), i64::MIN / 2, 0),
        (a.clone(), 0, 0),
    ];
    let got = store.candles_in(&ranges).unwrap();
    assert_eq!(got.len(), 4);
    for ((series, first, last), got) in ranges.iter().zip(&got) {
        assert_eq!(*got, store.candles(series, Some(*first), Some(*last), 100_000).unwrap());
    }
    assert_eq!(
        got[0].iter().map(|c| c.open_time).collect::<Vec<_>>(),
        vec![2 * MIN, 3 * MIN, 4 * MIN, 10 * MIN, 11 * MIN, 12 * MIN]
    );
    assert!(got[1].is_empty());
    assert_eq!(got[2].len(), 2);
    assert_eq!(
        store.series().unwrap(),
        vec![
            SeriesInfo {
                series: b.clone(),
                count: 2,
                first_open_time: -3_600_000,
                last_open_time: -3_600_000 + MIN
            },
            SeriesInfo {
                series: a.clone(),
                count: 35,
                first_open_time: 0,
                last_open_time: 39 * MIN
            },
        ]
    );
}

#[test]
fn backfill_progress_round_trips() {
    let dir = TempDir::new("progress");
    let path = dir.db();
    progress_round_trips(&|| Box::new(SqliteStore::open(&path).unwrap()));
}

/// A store opened by `open`, which opens the same database again when called again.
pub(crate) type Open<'a> = &'a dyn Fn() -> Box<dyn BackfillStore>;

/// The series catalogue stays exact through every kind of write — new minutes, stored ones
/// written again (counted once), a gap filled inside the span, a backfill page before it, a key
/// twice in one batch, several series at once — and a store opened again reads the same. The
/// truth is counted from the rows themselves.
pub(crate) fn catalogue_stays_exact(open: Open<'_>) {
    let store = open();
    let (a, b) = (sid("sim:spot:BTC/USDT:1m"), sid("sim:spot:BTC/USDT:5m"));
    let check = |store: &dyn CandleStore, what: &str| {
        let truth: Vec<SeriesInfo> = [&a, &b]
            .into_iter()
            .filter_map(|series| {
                let rows = all(store, series);
                Some(SeriesInfo {
                    series: series.clone(),
                    count: rows.len() as u64,
                    first_open_time: rows.first()?.open_time,
                    last_open_time: rows.last()?.open_time,
                })
            })
            .collect();
        assert_eq!(store.series().unwrap(), truth, "{what}");
        truth
    };
    // live minutes with a hole: 0-9 and 20-29
    store.write(&[rows(&a, &run(0, 10, 1))]).unwrap();
    store.write(&[rows(&a, &run(20 * MIN, 10, 1))]).unwrap();
    assert_eq!(check(&*store, "live")[0].count, 20);
    // stored minutes again, at the ends and inside, the series twice in the batch
    store.write(&[rows(&a, &run(0, 10, 2)), rows(&a, &run(29 * MIN, 1, 3))]).unwrap();
    assert_eq!(check(&*store, "upserts")[0].count, 20, "counted once");
    // a gap fill across the hole: 10-19 are new
    store.write(&[rows(&a, &run(5 * MIN, 20, 4))]).unwrap();
    assert_eq!(check(&*store, "gap fill")[0].count, 30);
    // a backfill page before the first minute, touching it
    let p = progress("sim:spot:BTC/USDT:1m");
    store.write_with_progress(&[rows(&a, &run(-10 * MIN, 11, 5))], &p).unwrap();
    assert_eq!(check(&*store, "backfill")[0].count, 40);
    // two series in one write, a key twice
    store
        .write(&[rows(&b, &[candle(0, 1), candle(0, 2)]), rows(&a, &run(30 * MIN, 1, 6))])
        .unwrap();
    let truth = check(&*store, "two series");
    assert_eq!((truth[0].count, truth[1].count), (41, 1));
    drop(store);
    assert_eq!(open().series().unwrap(), truth, "read again at open");
}

#[test]
fn the_catalogue_stays_exact() {
    let dir = TempDir::new("catalogue");
    let path = dir.db();
    catalogue_stays_exact(&|| Box::new(SqliteStore::open(&path).unwrap()));
}

pub(crate) fn progress_round_trips(open: Open<'_>) {
    let store = open();
    assert_eq!(store.backfill_progress("nope").unwrap(), None);
    let p = progress("binance:spot:BTC/USDT:1m");
    store.save_backfill_progress(&p).unwrap();
    assert_eq!(store.backfill_progress(&p.task).unwrap(), Some(p.clone()));

    // Replaced, not merged; empty and extreme values survive.
    let q = BackfillProgress {
        task: p.task.clone(),
        covered: vec![(i64::MIN, i64::MAX)],
        candles_written: u64::MAX,
        batches: u64::MAX - 1,
        updated_at_ms: i64::MIN,
        ..BackfillProgress::new(String::new())
    };
    store.save_backfill_progress(&q).unwrap();
    assert_eq!(store.backfill_progress(&p.task).unwrap(), Some(q.clone()));
    let empty = BackfillProgress::new("other".into());
    store.save_backfill_progress(&empty).unwrap();
    assert_eq!(store.backfill_progress("other").unwrap(), Some(empty));

    // write_with_progress: candles and progress together, visible after a reopen.
    let s = sid("binance:spot:BTC/USDT:1m");
    let cs = run(0, 300, 1);
    let r = BackfillProgress { covered: vec![(0, 299 * MIN)], candles_written: 300, ..p.clone() };
    assert_eq!(store.write_with_progress(&[rows(&s, &cs)], &r).unwrap(), 300);
    drop(store);
    let store = open();
    assert_eq!(store.backfill_progress(&p.task).unwrap(), Some(r));
    assert_eq!(all(&*store, &s), cs);
}

#[test]
fn extreme_values_round_trip_exactly() {
    let dir = TempDir::new("extremes");
    let path = dir.db();
    extremes_round_trip(&|| Box::new(SqliteStore::open(&path).unwrap()));
    // Volumes that fit an i64 are plain integers to SQL.
    let conn = Connection::open(&path).unwrap();
    let table = table_of(&conn, "sim:spot:BTC/USDT:1d");
    let v: i64 = conn
        .query_row(&format!("SELECT volume FROM {table} WHERE open_time = 86400000"), [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(v, 1);
}

pub(crate) fn extremes_round_trip(open: Open<'_>) {
    let store = open();
    let s = sid("sim:spot:BTC/USDT:1d");
    let volumes = [
        0,
        1,
        i64::MAX as i128,
        i64::MAX as i128 + 1,
        i64::MIN as i128,
        i64::MIN as i128 - 1,
        i128::MAX,
        i128::MAX - 1,
        i128::MIN,
        -1,
        u64::MAX as i128,
    ];
    let prices = [i64::MIN, i64::MIN + 1, -1, 0, 1, i64::MAX - 1, i64::MAX];
    let mut cs = Vec::new();
    for (i, &v) in volumes.iter().enumerate() {
        let p = |k: usize| Price::from_raw(prices[(i + k) % prices.len()]);
        cs.push(Candle {
            open_time: i as i64 * 86_400_000,
            open: p(0),
            high: p(1),
            low: p(2),
            close: p(3),
            volume: Volume::from_raw(v),
            trades: [0, 1, i64::MAX as u64, i64::MAX as u64 + 1, u64::MAX][i % 5],
            minutes: [0, 1, 1440, u32::MAX][i % 4],
        });
    }
    cs.push(Candle { open_time: i64::MIN, ..cs[0] });
    cs.push(Candle { open_time: i64::MAX, ..cs[1] });
    store.write(&[rows(&s, &cs)]).unwrap();
    drop(store);
    let store = open();
    let mut expected = cs.clone();
    expected.sort_by_key(|c| c.open_time);
    assert_eq!(all(&*store, &s), expected);
    assert_eq!(store.last_open_time(&s).unwrap(), Some(i64::MAX));
}

#[test]
fn corrupt_rows_are_errors_not_panics() {
    let dir = TempDir::new("corrupt");
    let path = dir.db();
    let store = SqliteStore::open(&path).unwrap();
    let s = sid("sim:spot:BTC/USDT:1m");
    store.write(&[rows(&s, &run(0, 10, 1))]).unwrap();
    store.save_backfill_progress(&progress("t")).unwrap();
    let conn = Connection::open(&path).unwrap();
    let read_all = |st: &SqliteStore| st.candles(&s, None, None, 100).map(|_| ());
    let damage = |sql: &str, undo: &str, check: &dyn Fn(&SqliteStore) -> Result<(), StoreError>| {
        conn.execute_batch(sql).unwrap();
        match check(&store) {
            Err(StoreError::Corrupt { table, detail }) => assert!(!detail.is_empty(), "{table}"),
            other => panic!("{sql}: expected Corrupt, got {other:?}"),
        }
        conn.execute_batch(undo).unwrap();
        check(&store).unwrap();
    };
    let t = table_of(&conn, "sim:spot:BTC/USDT:1m");
    let fix = &format!("UPDATE {t} SET volume = 1, minutes = 1 WHERE open_time = 60000");
    for damaged in [
        "volume = x'0102'",
        "volume = 1.5",
        "volume = 'lots'",
        "minutes = -1",
        "minutes = 4294967296",
    ] {
        damage(&format!("UPDATE {t} SET {damaged} WHERE open_time = 60000"), fix, &read_all);
    }
    // A dictionary entry without its table.
    let (hide, restore) =
        (format!("ALTER TABLE {t} RENAME TO hidden"), format!("ALTER TABLE hidden RENAME TO {t}"));
    damage(&hide, &restore, &read_all);
    damage(&hide, &restore, &|st| st.last_open_time(&s).map(|_| ()));
    // The catalogue is kept in memory: `series` reads no candle table (the table hidden, it
    // still answers what was written); a store opened on the damaged file leaves the series out
    // and reports the damage.
    let catalogue = vec![SeriesInfo {
        series: s.clone(),
        count: 10,
        first_open_time: 0,
        last_open_time: 9 * MIN,
    }];
    for (sql, undo) in [
        (hide.as_str(), restore.as_str()),
        (
            "UPDATE series SET name = 'not a series'",
            "UPDATE series SET name = 'sim:spot:BTC/USDT:1m'",
        ),
    ] {
        conn.execute_batch(sql).unwrap();
        assert_eq!(store.series().unwrap(), catalogue, "{sql}");
        let reopened = SqliteStore::open(&path).unwrap();
        assert_eq!(reopened.series().unwrap(), vec![], "{sql}");
        let problems = reopened.problems();
        assert!(problems.iter().any(|p| p.contains("corrupt row in series")), "{problems:?}");
        conn.execute_batch(undo).unwrap();
    }
    damage(
        "UPDATE backfill_progress SET covered = '[[1,2,3]]'",
        "UPDATE backfill_progress SET covered = '[]'",
        &|st| st.backfill_progress("t").map(|_| ()),
    );
    damage(
        "UPDATE backfill_progress SET covered = 'nonsense'",
        "UPDATE backfill_progress SET covered = '[]'",
        &|st| st.backfill_progress("t").map(|_| ()),
    );
}

#[test]
fn reads_do_not_wait_for_a_writer() {
    let dir = TempDir::new("readers");
    let path = dir.db();
    let store = Arc::new(SqliteStore::open(&path).unwrap());
    let s = sid("sim:spot:BTC/USDT:1m");
    store.write(&[rows(&s, &run(0, 10, 1))]).unwrap();

    // Another connection holds the write lock with uncommitted rows.
    let other = Connection::open(&path).unwrap();
    let table = table_of(&other, "sim:spot:BTC/USDT:1m");
    other.execute_batch(&format!("BEGIN IMMEDIATE; DELETE FROM {table};")).unwrap();
    let t0 = Instant::now();
    assert_eq!(all(&*store, &s), run(0, 10, 1));
    assert_eq!(store.last_open_time(&s).unwrap(), Some(9 * MIN));
    assert!(t0.elapsed() < Duration::from_secs(1), "reads waited {:?}", t0.elapsed());
    other.execute_batch("ROLLBACK").unwrap();

    // In process: reads complete while one long write transaction is running.
    let big = run(1_000 * MIN, 150_000, 2);
    let writing = Arc::new(AtomicBool::new(true));
    let reads_during_write = std::thread::scope(|scope| {
        let (st, w) = (store.clone(), writing.clone());
        let big = &big;
        let s2 = &s;
        scope.spawn(move || {
            st.write(&[rows(s2, big)]).unwrap();
            w.store(false, Ordering::SeqCst);
        });
        let (before, after) = (run(0, 10, 1), big[big.len() - 20..].to_vec());
        let mut n = 0;
        while writing.load(Ordering::SeqCst) {
            // Only a committed state is ever visible: the old rows or all of `big`, never a part.
            let got = store.candles(&s, None, None, 20).unwrap();
            if got == before {
                n += 1;
            } else {
                assert!(got == after, "a partial write was visible");
            }
        }
        n
    });
    assert!(reads_during_write > 0, "no read completed during the write");
    assert_eq!(store.last_open_time(&s).unwrap(), Some(big.last().unwrap().open_time));
}

#[test]
fn concurrent_writers_and_readers() {
    let dir = TempDir::new("concurrent");
    let store = Arc::new(SqliteStore::open(&dir.db()).unwrap());
    let names: Vec<SeriesId> = (0..4).map(|i| sid(&format!("sim:spot:S{i}/USDT:1m"))).collect();
    std::thread::scope(|scope| {
        for (i, name) in names.iter().enumerate() {
            let store = store.clone();
            scope.spawn(move || {
                for k in 0..20 {
                    store.write(&[rows(name, &run(k * 50 * MIN, 50, i as i64))]).unwrap();
                    let got = store.candles(name, None, None, 1000).unwrap();
                    assert_eq!(got.len() as i64, (k + 1) * 50);
                }
            });
        }
    });
    for (i, name) in names.iter().enumerate() {
        assert_eq!(all(&*store, name), run(0, 1000, i as i64));
    }
}

// --- kill -9 -------------------------------------------------------------------------------------

const KILL_CHILD_ENV: &str = "MILLRACE_STORE_TEST_KILL_CHILD";
const KILL_SERIES: [&str; 3] =
    ["sim:spot:BTC/USDT:1m", "sim:spot:BTC/USDT:5m", "sim:spot:ETH/USDT:1m"];
const KILL_ROWS: i64 = 400;

/// The child half of `survives_kill_9_mid_stream`: a no-op unless run by it. Writes batch after
/// batch (batch `k`: `KILL_ROWS` rows in each of three series, tagged `k`) resuming after what is
/// stored, and reports each commit on stdout, until killed or the parent goes away.
#[test]
fn kill_child_writer() {
    let Some(path) = std::env::var_os(KILL_CHILD_ENV) else {
        return;
    };
    let store = SqliteStore::open(Path::new(&path)).unwrap();
    let series: Vec<SeriesId> = KILL_SERIES.iter().map(|s| sid(s)).collect();
    let first = match store.last_open_time(&series[0]).unwrap() {
        Some(t) => (t / MIN + 1) / KILL_ROWS,
        None => 0,
    };
    let mut out = std::io::stdout().lock();
    for k in first..first + 100_000 {
        let cs = run(k * KILL_ROWS * MIN, KILL_ROWS, k);
        let batch: Vec<SeriesRows<'_>> = series.iter().map(|s| rows(s, &cs)).collect();
        store.write(&batch).unwrap();
        if writeln!(out, "committed {k}").and_then(|_| out.flush()).is_err() {
            return; // the parent is gone
        }
    }
}

#[test]
fn survives_kill_9_mid_stream() {
    let dir = TempDir::new("kill");
    let path = dir.db();
    let series: Vec<SeriesId> = KILL_SERIES.iter().map(|s| sid(s)).collect();
    let mut reported = -1i64;
    for (round, kill_after) in [(0, 15i64), (1, 10), (2, 25)] {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["store::kill_child_writer", "--exact", "--nocapture", "--test-threads=1"])
            .env(KILL_CHILD_ENV, &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut seen = 0;
        for line in lines.by_ref() {
            let line = line.unwrap();
            // libtest may print its "test ... " prefix on the same line as our first report.
            let Some((_, k)) = line.split_once("committed ") else {
                continue;
            };
            reported = reported.max(k.parse().unwrap());
            seen += 1;
            if seen == kill_after {
                break;
            }
        }
        assert_eq!(seen, kill_after, "round {round}: the child stopped early");
        // Vary the moment of death within the next batches.
        std::thread::sleep(Duration::from_micros(1_000 * round + 300));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();

        let conn = Connection::open(&path).unwrap();
        let check: String = conn.query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
        assert_eq!(check, "ok");
        drop(conn);
        let store = SqliteStore::open(&path).unwrap();
        let stored: Vec<Vec<Candle>> = series.iter().map(|s| all(&store, s)).collect();
        let n = stored[0].len() as i64;
        assert_eq!(n % KILL_ROWS, 0, "round {round}: a partial batch in the first series");
        let batches = n / KILL_ROWS;
        assert!(
            batches > reported,
            "round {round}: batch {reported} was reported committed, {batches} stored"
        );
        let expected: Vec<Candle> =
            (0..batches).flat_map(|k| run(k * KILL_ROWS * MIN, KILL_ROWS, k)).collect();
        for (s, got) in series.iter().zip(&stored) {
            assert!(got == &expected, "round {round}: {s} is not exactly batches 0..{batches}");
        }
        reported = batches - 1;
    }
}

#[test]
fn the_log_stays_bounded_under_continuous_writes() {
    let dir = TempDir::new("wal");
    let path = dir.db();
    let wal = PathBuf::from(format!("{}-wal", path.display()));
    let store = SqliteStore::open(&path).unwrap();
    let names: Vec<SeriesId> = (0..8).map(|i| sid(&format!("sim:spot:S{i}/USDT:1m"))).collect();
    let mut max_wal = 0;
    let t0 = Instant::now();
    let mut k = 0;
    // Back-to-back 200-row batches over 8 series, about 12 WAL frames (48 KiB) each: 5000 of them
    // would make a 240 MiB log if it were never restarted. The checkpointer restarts it from
    // 8192 frames (32 MiB) on, plus what is committed while it catches up; SQLite's own
    // checkpoint in the writer is the backstop at 32768 frames (128 MiB).
    while k < 5000 && t0.elapsed() < Duration::from_secs(120) {
        let cs = run(k * 25 * MIN, 25, 1);
        let batch: Vec<SeriesRows<'_>> = names.iter().map(|s| rows(s, &cs)).collect();
        store.write(&batch).unwrap();
        max_wal = max_wal.max(std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0));
        k += 1;
    }
    assert!(k >= 3000, "only {k} batches written in 2 minutes");
    assert!(max_wal < 130 << 20, "the WAL grew to {} MiB", max_wal >> 20);
    drop(store);
    let store = SqliteStore::open(&path).unwrap();
    for s in &names {
        assert_eq!(store.last_open_time(s).unwrap(), Some((k * 25 - 1) * MIN));
        assert_eq!(store.candles(s, Some(0), None, usize::MAX).unwrap().len() as i64, k * 25);
    }
}
