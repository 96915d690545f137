//! The store under faults, on real SQLite files written by the server: one server per data
//! directory (a second is refused, naming the holder), a corrupt file refused at start (or, with
//! `store.quick_check = false`, reported by `/healthz`), and writes refused by the database for
//! a while — retried, bounded by `ingest.max_pending_candles`, reported by `/healthz`, and
//! nothing lost or duplicated once the database takes writes again.

use std::io::{Seek as _, SeekFrom, Write as _};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt as _;
use testkit::*;
use tokio_tungstenite::tungstenite::Message;

const PAGE: u64 = 4096;

fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// Overwrites page `page` (0-based) of `db` with garbage.
fn garbage_page(db: &Path, page: u64) {
    let mut f = std::fs::OpenOptions::new().write(true).open(db).unwrap();
    f.seek(SeekFrom::Start(page * PAGE)).unwrap();
    let junk: Vec<u8> = (0..PAGE).map(|i| (i * 131 % 251) as u8 ^ 0x5a).collect();
    f.write_all(&junk).unwrap();
    f.sync_all().unwrap();
}

/// A data directory with a few minutes of BTC/USDT candles in every timeframe, written by a
/// `millrace serve` that then stopped cleanly (its log checkpointed into the file).
async fn stored_data(sim: &sim::SimHandle, tag: &str) -> server::config::Config {
    let mut config = test_config(vec![external_sim_source(sim)]);
    config.server.data_dir = temp_dir(tag);
    config.ingest.pinned = vec!["sim:spot:BTC/USDT".into(), "sim:spot:ETH/USDT".into()];
    config.ingest.flush_ms = 50;
    let child = ChildServer::start(&config).await;
    eventually("an hour of candles stored", || async {
        let rows = child.get_json("/api/v1/klines?series=sim:spot:BTC/USDT:1m&limit=1000").await;
        (rows.as_array().unwrap().len() >= 60).then_some(())
    })
    .await;
    child.terminate();
    config
}

/// `millrace serve` on `config` as a child process, expected to refuse to start: its exit
/// status (not success) and its log.
async fn refused(config: &server::config::Config, name: &str) -> String {
    let mut config = config.clone();
    config.server.addr = free_addr();
    let dir = temp_dir(name);
    let mut role = ChildRole::start(name, &["serve"], &config, &dir, "warn");
    let status = role.exited(PATIENCE).await.expect("the server refused to start");
    assert!(!status.success(), "{name}: exited with {status}");
    role.log_text()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_server_on_the_same_data_dir_is_refused() {
    let sim = start_sim(60.0, 41).await;
    let mut config = test_config(vec![external_sim_source(&sim)]);
    config.ingest.pinned = vec!["sim:spot:BTC/USDT".into()];
    let first = ChildServer::start(&config).await;
    let log = refused(&config, "second").await;
    let dir = config.server.data_dir.display().to_string();
    assert!(log.contains(&dir), "the error names the data directory: {log}");
    assert!(log.contains(&format!("pid {}", first.child.id())), "and the holder: {log}");
    // The first one never noticed.
    let (status, _) = http_get(first.addr, "/healthz").await.unwrap();
    assert_eq!(status, 200);
    first.terminate();
    // Once it is gone, the directory is free again.
    let again = ChildServer::start(&config).await;
    again.terminate();
    sim.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_database_is_refused_at_start() {
    let sim = start_sim(600.0, 43).await;
    for (tag, which) in [("corrupt-last", "last"), ("corrupt-mid", "middle")] {
        let config = stored_data(&sim, tag).await;
        let db = config.db_path();
        let pages = std::fs::metadata(&db).unwrap().len() / PAGE;
        assert!(pages >= 8, "{pages} pages");
        garbage_page(&db, if which == "last" { pages - 1 } else { pages / 2 });
        let log = refused(&config, &format!("{tag}-serve")).await;
        assert!(log.contains("corrupt"), "{which} page: {log}");
        assert!(log.contains(&db.display().to_string()), "{which} page: names the file: {log}");
    }
    sim.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_check_a_corrupt_database_makes_healthz_degraded() {
    let sim = start_sim(600.0, 47).await;
    let mut config = stored_data(&sim, "corrupt-unchecked").await;
    let db = config.db_path();
    // a leaf of a candle table: opening the file reads the schema's pages, not these
    let leaf: u64 = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row(
            "SELECT max(pageno) FROM dbstat WHERE name LIKE 'candles_%' AND pagetype = 'leaf'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    garbage_page(&db, leaf - 1);
    config.store.quick_check = false;
    config.ingest.pinned = vec![];
    // degraded from the start: loading the series catalogue at open reads every candle table
    let server = TestServer::start_degraded(config).await;
    // loading the series catalogue at open read over the damage: that series is left out
    let (status, body) = server.get("/api/v1/series").await;
    assert_eq!(status, 200, "the catalogue is answered from memory: {body}");
    let (status, body) = server.get("/healthz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("corrupt") && body.contains("millrace.db"), "{body}");
    server.stop().await;
    sim.shutdown();
}

/// Closed 1m candles pushed on `ws` (after a SUBSCRIBE), collected by a task.
pub fn collect_closed(mut ws: Ws) -> Arc<Mutex<Vec<shared::candle::Candle>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let out = seen.clone();
    tokio::spawn(async move {
        while let Some(Ok(msg)) = ws.next().await {
            let Message::Text(text) = msg else { continue };
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            if v["data"]["k"]["x"] == true {
                let k: shared::protocol::KlinePayload =
                    serde_json::from_value(v["data"]["k"].clone()).unwrap();
                out.lock().unwrap().push(shared::candle::Candle::from(&k));
            }
        }
    });
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_writes_are_retried_bounded_reported_and_nothing_is_lost() {
    // A simulated minute every 100 ms.
    let sim = start_sim(600.0, 53).await;
    let mut config = test_config(vec![external_sim_source(&sim)]);
    config.ingest.pinned = vec!["sim:spot:BTC/USDT".into()];
    config.ingest.flush_ms = 50;
    // Each refused write waits out the store's busy timeout (5 s); between retries the job goes
    // on taking candles (20 simulated minutes), so the bound of 10 is reached at the first.
    config.ingest.persist_retry_ms = 2000;
    config.ingest.persist_retry_cap_ms = 2000;
    config.ingest.max_pending_candles = 10;
    let series = "sim:spot:BTC/USDT:1m";
    let server = TestServer::start(config).await;
    let mut ws = server.ws().await;
    assert!(request(&mut ws, "SUBSCRIBE", &[&format!("kline@{series}")], 1).await.is_ok());
    let pushed = collect_closed(ws);
    let stored_n = || async {
        let rows = server.get_json(&format!("/api/v1/klines?series={series}&limit=1000")).await;
        rows.as_array().unwrap().len()
    };
    eventually("first candles stored", || async { (stored_n().await >= 5).then_some(()) }).await;

    // Another process takes the database's write lock and keeps it: every write fails
    // (`database is locked`, after the store's busy timeout).
    let db = server.db_path();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let (held_tx, held_rx) = std::sync::mpsc::channel::<()>();
    let blocker = std::thread::spawn({
        let db = db.clone();
        move || {
            let conn = rusqlite::Connection::open(&db).unwrap();
            conn.busy_timeout(Duration::from_secs(30)).unwrap();
            conn.execute_batch("BEGIN IMMEDIATE").unwrap();
            held_tx.send(()).unwrap();
            let _ = release_rx.recv();
            conn.execute_batch("ROLLBACK").unwrap();
        }
    });
    tokio::task::spawn_blocking(move || held_rx.recv().unwrap()).await.unwrap();
    let before = stored_n().await;
    let degraded = eventually("healthz degraded", || async {
        let (status, body) = server.get("/healthz").await;
        (status == 503 && body.contains("writes to the store")).then_some(body)
    })
    .await;
    assert!(degraded.contains("millrace.db"), "{degraded}");
    // The job takes at most max_pending_candles (plus one REST page) and then pauses.
    let paused = eventually("ingest paused by back-pressure", || async {
        let jobs = server.get_json("/api/v1/ops/jobs").await;
        let j = jobs["jobs"][0].clone();
        let why = j["last_error"].as_str().unwrap_or_default().to_string();
        (why.contains("ingest paused") && j["connected"] == false).then_some(j)
    })
    .await;
    assert!(paused["persist_failures"].as_u64().unwrap() >= 1, "{paused}");
    let accepted = paused["closed_candles"].as_u64().unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await; // 30 simulated minutes
    let jobs = server.get_json("/api/v1/ops/jobs").await;
    let later = jobs["jobs"][0]["closed_candles"].as_u64().unwrap();
    assert_eq!(later, accepted, "nothing more is taken while paused: {jobs}");
    assert_eq!(stored_n().await, before, "nothing was written meanwhile");

    // The database takes writes again: everything waiting is stored, then the minutes that
    // closed meanwhile come from REST, and health recovers.
    release_tx.send(()).unwrap();
    blocker.join().unwrap();
    eventually("healthz ok again", || async {
        (server.get("/healthz").await.0 == 200).then_some(())
    })
    .await;
    let caught_up = eventually("ingest caught up", || async {
        let jobs = server.get_json("/api/v1/ops/jobs").await;
        let j = jobs["jobs"][0].clone();
        let n = stored_n().await;
        (j["connected"] == true && n >= before + 40).then_some(n)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.stop().await;

    let m1 = stored(&db, series);
    assert!(m1.len() >= caught_up, "{} stored", m1.len());
    for w in m1.windows(2) {
        assert_eq!(w[1].open_time - w[0].open_time, 60_000, "hole after {}", w[0].open_time);
    }
    let (first, last) = (m1[0].open_time, m1[m1.len() - 1].open_time);
    assert_eq!(m1, sim.closed_klines("BTCUSDT", first, last), "stored = the exchange's");
    // Every closed candle was pushed once, in order, equal to the stored one.
    let pushed = pushed.lock().unwrap().clone();
    assert!(pushed.len() >= 40, "{} pushed", pushed.len());
    for w in pushed.windows(2) {
        assert_eq!(w[1].open_time - w[0].open_time, 60_000, "pushed: gap or repeat");
    }
    let from = m1.iter().position(|c| c.open_time == pushed[0].open_time).unwrap();
    assert_eq!(&m1[from..from + pushed.len()], &pushed[..], "pushed = stored");
    sim.shutdown();
}

/// Page number (0-based) of the root of the candle table of `series` in `db`.
fn table_root_page(db: &Path, series: &str) -> u64 {
    let conn = rusqlite::Connection::open(db).unwrap();
    let id: i64 =
        conn.query_row("SELECT id FROM series WHERE name = ?1", [series], |r| r.get(0)).unwrap();
    let root: i64 = conn
        .query_row(
            "SELECT rootpage FROM sqlite_schema WHERE name = ?1",
            [format!("candles_{id}")],
            |r| r.get(0),
        )
        .unwrap();
    root as u64 - 1
}

/// A corrupt page under a series the job writes: every persist fails, and the retries back off
/// (`persist_retry_ms` doubling to `persist_retry_cap_ms`) instead of hammering the file every
/// `persist_retry_ms`; `/healthz` says the store is corrupt. The job itself does not crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_persists_back_off_and_healthz_reports_a_corrupt_store() {
    let sim = start_sim(600.0, 59).await;
    let mut config = stored_data(&sim, "corrupt-table").await;
    let db = config.db_path();
    garbage_page(&db, table_root_page(&db, "sim:spot:BTC/USDT:1h"));
    config.store.quick_check = false;
    config.ingest.pinned = vec!["sim:spot:BTC/USDT".into()];
    config.ingest.persist_retry_ms = 100;
    config.ingest.persist_retry_cap_ms = 1600;
    // degraded from the start: loading the series catalogue at open reads the damaged table
    let server = TestServer::start_degraded(config).await;
    let failing = eventually("persists failing", || async {
        let jobs = server.get_json("/api/v1/ops/jobs").await;
        let j = jobs["jobs"][0].clone();
        (j["persist_failures"].as_u64().unwrap() >= 1).then_some(j)
    })
    .await;
    assert!(failing["last_error"].as_str().unwrap().contains("malformed"), "{failing}");
    let first = failing["persist_failures"].as_u64().unwrap();
    tokio::time::sleep(Duration::from_secs(8)).await;
    let jobs = server.get_json("/api/v1/ops/jobs").await;
    let j = &jobs["jobs"][0];
    let failures = j["persist_failures"].as_u64().unwrap() - first;
    // 0.1 + 0.2 + 0.4 + 0.8 + 1.6 + 1.6 ... s (±20 %): at most 9 in 8 s; a fixed 100 ms
    // retry would have failed about 80 times.
    assert!((3..=9).contains(&failures), "{failures} retries in 8 s: {j}");
    // the persists' failures never crash the job (a loaded machine may still lose the upstream
    // connection now and then: that crash names the stream, not the store)
    let crash = j["last_crash"].as_str().unwrap_or("");
    assert!(
        j["crashes"] == 0
            || !["persist", "store", "SQLite", "malformed"].iter().any(|w| crash.contains(w)),
        "{j}"
    );
    let (status, body) = server.get("/healthz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("corrupt"), "{body}");
    server.stop().await;
    sim.shutdown();
}
