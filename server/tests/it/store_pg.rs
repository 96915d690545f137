//! The PostgreSQL candle store on the machine's real PostgreSQL, each test in a database of its
//! own: the behaviour every store keeps (shared with the SQLite tests), with both write methods;
//! atomicity; migrations racing and a newer schema refused; writers in parallel; and a store whose
//! connections are killed under it.

use std::sync::Arc;

use server::error::report;
use server::store::postgres::{
    PgOptions, PostgresStore, WriteMethod, CATALOGUE_REFRESH, SCHEMA_VERSION,
};
use server::store::{BackfillStore, CandleStore, SeriesInfo, StoreError};
use shared::protocol::SeriesId;
use testkit::PgDb;

use super::store::{
    all, catalogue_stays_exact, extremes_round_trip, newest_and_series, progress,
    progress_round_trips, range_and_limit, rows, run, sid, writes_are_idempotent, MIN,
};

fn open(db: &PgDb, method: WriteMethod) -> PostgresStore {
    PostgresStore::open_with(db.url(), PgOptions { method, ..PgOptions::default() }).unwrap()
}

/// Creates `fail()`, a trigger function that raises "injected failure", and runs `trigger`
/// (a `CREATE TRIGGER … EXECUTE FUNCTION fail()`).
fn inject_failure(admin: &mut postgres::Client, trigger: &str) {
    admin
        .batch_execute(
            "CREATE FUNCTION fail() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN RAISE EXCEPTION 'injected failure'; END $$;",
        )
        .and_then(|()| admin.batch_execute(trigger))
        .unwrap();
}

#[test]
fn every_store_behaviour_with_both_write_methods() {
    for method in [WriteMethod::CopyStaging, WriteMethod::Unnest] {
        let db = PgDb::fresh("conformance");
        writes_are_idempotent(&open(&db, method));
        let db = PgDb::fresh("ranges");
        range_and_limit(&open(&db, method));
        let db = PgDb::fresh("series");
        newest_and_series(&open(&db, method));
        let db = PgDb::fresh("progress");
        progress_round_trips(&|| Box::new(open(&db, method)));
        let db = PgDb::fresh("extremes");
        extremes_round_trip(&|| Box::new(open(&db, method)));
        let db = PgDb::fresh("catalogue");
        catalogue_stays_exact(&|| Box::new(open(&db, method)));
    }
}

/// `GET /api/v1/series` counts no row: the catalogue is answered while another session holds
/// `candles` locked against any read (`ACCESS EXCLUSIVE`), and it shows what another process
/// (another store) committed within `CATALOGUE_REFRESH`, read from `series_stats`.
#[test]
fn the_catalogue_reads_no_candle_and_follows_other_writers() {
    let db = PgDb::fresh("catalogue_lock");
    let (here, there) = (open(&db, WriteMethod::default()), open(&db, WriteMethod::default()));
    let (a, b) = (sid("sim:spot:BTC/USDT:1m"), sid("sim:spot:ETH/USDT:1m"));
    here.write(&[rows(&a, &run(0, 10, 1))]).unwrap();
    there.write(&[rows(&a, &run(5 * MIN, 10, 2)), rows(&b, &run(0, 3, 2))]).unwrap();
    let mut admin = db.client();
    admin.batch_execute("BEGIN; LOCK TABLE candles IN ACCESS EXCLUSIVE MODE").unwrap();
    std::thread::sleep(CATALOGUE_REFRESH);
    let (tx, rx) = std::sync::mpsc::channel();
    let here = Arc::new(here);
    let asking = here.clone();
    let asker = std::thread::spawn(move || tx.send(asking.series()).unwrap());
    let answer = rx.recv_timeout(std::time::Duration::from_secs(5));
    admin.batch_execute("ROLLBACK").unwrap();
    asker.join().unwrap();
    let answer = answer.expect("answered while candles are locked").unwrap();
    let info = |series: &SeriesId, count, last| SeriesInfo {
        series: series.clone(),
        count,
        first_open_time: 0,
        last_open_time: last,
    };
    assert_eq!(answer, vec![info(&a, 15, 14 * MIN), info(&b, 3, 2 * MIN)]);
}

#[test]
fn a_failing_batch_leaves_nothing() {
    let db = PgDb::fresh("atomic");
    let store = open(&db, WriteMethod::default());
    let (a, b, c) =
        (sid("sim:spot:BTC/USDT:1m"), sid("sim:spot:BTC/USDT:5m"), sid("sim:spot:ETH/USDT:1m"));
    store.write(&[rows(&a, &run(0, 10, 1))]).unwrap();
    let mut admin = db.client();
    inject_failure(
        &mut admin,
        "CREATE TRIGGER fail_series BEFORE INSERT ON series
           FOR EACH ROW WHEN (NEW.name = 'sim:spot:ETH/USDT:1m') EXECUTE FUNCTION fail();",
    );
    let ca = run(5 * MIN, 10, 2);
    let cb = run(0, 300, 3);
    let cc = run(998 * MIN, 2, 4);
    let err = store.write(&[rows(&a, &ca), rows(&b, &cb), rows(&c, &cc)]).unwrap_err();
    assert!(
        matches!(&err, StoreError::Db { .. }) && report(&err).contains("injected failure"),
        "{}",
        report(&err)
    );
    assert_eq!(all(&store, &a), run(0, 10, 1), "a unchanged");
    assert_eq!(all(&store, &b), vec![]);
    assert_eq!(store.series().unwrap().len(), 1);

    // the rolled-back series id is not reused from a stale cache
    admin.batch_execute("DROP TRIGGER fail_series ON series").unwrap();
    store.write(&[rows(&c, &cc[..1]), rows(&b, &cb[..2])]).unwrap();
    assert_eq!(all(&store, &b), cb[..2].to_vec());
    assert_eq!(all(&store, &c), cc[..1].to_vec());

    // progress and its candles commit together or not at all
    let p = progress("sim:spot:ETH/USDT:1m");
    admin
        .batch_execute(
            "CREATE TRIGGER fail_progress BEFORE INSERT ON backfill_progress
               FOR EACH ROW EXECUTE FUNCTION fail();",
        )
        .unwrap();
    assert!(store.write_with_progress(&[rows(&c, &cc)], &p).is_err());
    assert_eq!(all(&store, &c), cc[..1].to_vec());
    admin.batch_execute("DROP TRIGGER fail_progress ON backfill_progress").unwrap();
    assert_eq!(store.write_with_progress(&[rows(&c, &cc)], &p).unwrap(), 2);
    assert_eq!(store.backfill_progress(&p.task).unwrap(), Some(p));
    assert_eq!(all(&store, &c), cc);
}

/// `/healthz` reflects the PostgreSQL store as it does the SQLite one: failing writes until one
/// commits, failing reads until one succeeds, and a row that does not decode for good.
#[test]
fn failing_writes_and_corrupt_rows_reach_the_health_report() {
    let db = PgDb::fresh("health");
    let store = open(&db, WriteMethod::default());
    let s = sid("sim:spot:BTC/USDT:1m");
    store.write(&[rows(&s, &run(0, 10, 1))]).unwrap();
    assert_eq!(store.problems(), Vec::<String>::new());
    let mut admin = db.client();
    inject_failure(
        &mut admin,
        "CREATE TRIGGER fail_candles BEFORE INSERT ON candles FOR EACH ROW EXECUTE FUNCTION fail();",
    );
    assert!(store.write(&[rows(&s, &run(10 * MIN, 1, 1))]).is_err());
    let problems = store.problems();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].starts_with("writes to the store at `store.url`"), "{problems:?}");
    assert!(problems[0].contains("injected failure"), "{problems:?}");
    admin.batch_execute("DROP TRIGGER fail_candles ON candles").unwrap();
    store.write(&[rows(&s, &run(10 * MIN, 1, 1))]).unwrap();
    assert_eq!(store.problems(), Vec::<String>::new(), "a committed write clears it");

    admin.batch_execute("UPDATE candles SET minutes = -1 WHERE open_time = 0").unwrap();
    let err = store.candles(&s, Some(0), None, 100).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{}", report(&err));
    let problems = store.problems();
    assert!(problems.iter().any(|p| p.contains("is corrupt (")), "{problems:?}");
    assert!(problems.iter().any(|p| p.starts_with("a read of the store")), "{problems:?}");
    // a read that works clears the failed read; the corrupt row stays reported
    assert_eq!(store.candles(&s, Some(MIN), None, 100).unwrap().len(), 10);
    let problems = store.problems();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("is corrupt ("), "{problems:?}");
    // numerics read in binary: one beyond an i128, NaN, a negative trade count, each a corrupt
    // row (not a panic) by a row read and by an export-sized read of column arrays
    admin.batch_execute("UPDATE candles SET minutes = 1 WHERE open_time = 0").unwrap();
    for (set, says) in [
        ("volume = 1e39", "beyond an i128"),
        ("volume = 'NaN'", "NaN"),
        ("trades = 0 - trades - 1", "not a u64"),
    ] {
        admin.batch_execute(&format!("UPDATE candles SET {set} WHERE open_time = {MIN}")).unwrap();
        for limit in [100, 20_000] {
            let err = store.candles(&s, None, None, limit).unwrap_err();
            assert!(matches!(err, StoreError::Corrupt { .. }), "{set}: {}", report(&err));
            assert!(report(&err).contains(says), "{set}: {}", report(&err));
        }
        admin
            .batch_execute(&format!(
                "UPDATE candles SET volume = 5, trades = 3 WHERE open_time = {MIN}"
            ))
            .unwrap();
    }
    assert_eq!(store.candles(&s, None, None, 20_000).unwrap().len(), 11);
}

#[test]
fn migrations_race_once_and_a_newer_schema_is_refused() {
    let db = PgDb::fresh("migrate");
    let url = db.url().to_string();
    let opens: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || PostgresStore::open(&url).map(|_| ()))
        })
        .collect();
    for o in opens {
        o.join().unwrap().unwrap();
    }
    let mut admin = db.client();
    let v: i32 = admin.query_one("SELECT version FROM millrace_schema", &[]).unwrap().get(0);
    assert_eq!(v, SCHEMA_VERSION);
    let rows: i64 = admin.query_one("SELECT count(*) FROM millrace_schema", &[]).unwrap().get(0);
    assert_eq!(rows, 1);
    admin.execute("UPDATE millrace_schema SET version = version + 1", &[]).unwrap();
    match PostgresStore::open(&url) {
        Err(StoreError::SchemaTooNew { found, supported, .. }) => {
            assert_eq!((found, supported), (i64::from(v) + 1, i64::from(v)));
        }
        other => panic!("{:?}", other.err()),
    }
}

#[test]
fn a_bad_or_unreachable_url_is_a_clear_error() {
    let e = PostgresStore::open("postgres://millrace:secret@127.0.0.1:1/nothing").err().unwrap();
    let text = report(&e);
    // the key, never the URL (it may hold a password; the log shows it redacted at start)
    assert!(text.contains("connecting to PostgreSQL at `store.url`"), "{text}");
    assert!(!text.contains("secret") && !text.contains("127.0.0.1"), "{text}");
    let e = PostgresStore::open("postgres://[nope").err().unwrap();
    let text = report(&e);
    assert!(text.starts_with("configuration key `store.url`: not a PostgreSQL URL"), "{text}");
    assert!(!text.contains("nope"), "{text}");
}

#[test]
fn parallel_writers_of_one_series_never_lose_or_duplicate_a_row() {
    let db = PgDb::fresh("parallel");
    // two stores stand for two processes; each writes interleaved minutes of the same series
    let stores: Vec<Arc<PostgresStore>> =
        (0..2).map(|_| Arc::new(open(&db, WriteMethod::default()))).collect();
    let s = sid("sim:spot:BTC/USDT:1m");
    let threads: Vec<_> = stores
        .iter()
        .enumerate()
        .map(|(k, store)| {
            let (store, s) = (store.clone(), s.clone());
            std::thread::spawn(move || {
                for batch in 0..40 {
                    let cs: Vec<_> = (0..25)
                        .map(|i| super::store::candle(((batch * 25 + i) * 2 + k as i64) * MIN, 1))
                        .collect();
                    store.write(&[rows(&s, &cs)]).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let got = all(&*stores[0], &s);
    assert_eq!(got, run(0, 2000, 1));
}

#[test]
fn killed_connections_cost_one_error_and_the_store_reconnects() {
    let db = PgDb::fresh("reconnect");
    let store = open(&db, WriteMethod::default());
    let s = sid("sim:spot:BTC/USDT:1m");
    store.write(&[rows(&s, &run(0, 10, 1))]).unwrap();
    assert_eq!(all(&store, &s).len(), 10);
    let mut admin = db.client();
    let name: String = admin.query_one("SELECT current_database()", &[]).unwrap().get(0);
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = $1 AND pid <> pg_backend_pid()",
            &[&name],
        )
        .unwrap();
    // the first call on each dead connection may fail; the store then opens a new one
    let mut failures = 0;
    let written = loop {
        match store.write(&[rows(&s, &run(10 * MIN, 10, 1))]) {
            Ok(n) => break n,
            Err(e) => {
                failures += 1;
                assert!(failures <= 1, "{}", report(&e));
            }
        }
    };
    assert_eq!(written, 10);
    let mut reads = 0;
    loop {
        match store.candles(&s, Some(0), None, 100) {
            Ok(cs) => {
                assert_eq!(cs, run(0, 20, 1));
                break;
            }
            Err(e) => {
                reads += 1;
                assert!(reads <= 1, "{}", report(&e));
            }
        }
    }
}
