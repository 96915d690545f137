//! Restarts after a fast simulated run: the embedded simulator's clock resumes after the candles
//! it served before (a run at speed 60 stores candles far ahead of the wall clock), so ingest
//! resumes within seconds; and a kline job whose exchange's clock is behind the newest stored
//! candle says so in `/healthz`, its job report and a metric instead of freezing silently.

use std::time::{Duration, Instant};

use server::store::{CandleStore as _, SeriesRows};
use shared::candle::MINUTE_MS;
use testkit::*;

const SERIES: &str = "sim:spot:BTC/USDT:1m";

fn newest(db: &std::path::Path) -> Option<i64> {
    stored(db, SERIES).last().map(|c| c.open_time)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_after_a_run_at_speed_60_resumes_ingest_within_seconds() {
    let mut config = test_config(vec![embedded_sim_source(60.0)]);
    config.ingest.pinned = vec!["sim:spot:BTC/USDT".into()];
    let db = config.db_path();

    // Run 1: at 60x until the stored candles are 20 simulated minutes ahead of the wall clock.
    let child = ChildServer::start(&config).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ahead = newest(&db).map_or(i64::MIN, |t| t - server::clock::wall_clock_ms());
        if ahead >= 20 * MINUTE_MS {
            break;
        }
        assert!(Instant::now() < deadline, "run 1 never got 20 minutes ahead: {ahead} ms");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    child.terminate();
    let before = newest(&db).expect("candles stored in run 1");

    // Run 2 on the same data dir: new closed candles within seconds (a simulator restarted at
    // the wall clock would need 20 s or more to get past them).
    let child = ChildServer::start(&config).await;
    let resumed = Instant::now();
    let deadline = resumed + Duration::from_secs(10);
    let after = loop {
        match newest(&db) {
            Some(t) if t > before => break t,
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "no new closed candle within 10 s of the restart (newest {before}, wall clock {})",
            server::clock::wall_clock_ms()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // contiguous with what run 1 stored: no hole, no duplicate
    let m1 = stored(&db, SERIES);
    let from = m1.iter().position(|c| c.open_time == before).unwrap();
    for w in m1[from..].windows(2) {
        assert_eq!(w[1].open_time - w[0].open_time, MINUTE_MS, "after {}", w[0].open_time);
    }
    assert!(after >= before + MINUTE_MS);
    let health = child.get_json("/healthz").await;
    assert_eq!(health["status"], "ok", "{health}");
    child.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exchange_clock_behind_the_stored_candles_is_reported() {
    // an exchange at the wall clock, and a store whose newest candle is an hour ahead of it
    let sim = start_sim(1.0, 4).await;
    let mut config = test_config(vec![external_sim_source(&sim)]);
    config.ingest.pinned = vec!["sim:spot:BTC/USDT".into()];
    let now = sim.now_ms();
    let ahead: Vec<_> = sim
        .closed_klines("BTCUSDT", now - 10 * MINUTE_MS, now)
        .into_iter()
        .map(|mut c| {
            c.open_time += 60 * MINUTE_MS;
            c
        })
        .collect();
    let newest = ahead.last().expect("history").open_time;
    {
        let store = server::store::sqlite::SqliteStore::open(&config.db_path()).unwrap();
        let series = SERIES.parse().unwrap();
        store.write(&[SeriesRows { series: &series, candles: &ahead }]).unwrap();
    }
    let server = TestServer::start_degraded(config).await;

    let (status, body) = eventually("/healthz degraded", || async {
        let (status, body) = server.get("/healthz").await;
        (status == 503).then_some((status, body))
    })
    .await;
    assert_eq!(status, 503);
    let health: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(health["status"], "degraded");
    let problem = health["problems"][0].as_str().unwrap();
    assert!(
        problem.contains("kline job sim:spot:BTC/USDT") && problem.contains("behind"),
        "{problem}"
    );
    let jobs = server.get_json("/api/v1/ops/jobs").await;
    let behind = jobs["jobs"][0]["exchange_behind_ms"].as_i64().expect("reported in the job");
    let expected = newest + MINUTE_MS - sim.now_ms();
    assert!((behind - expected).abs() < 10_000, "{behind} vs about {expected}");
    let metrics = server.get("/metrics").await.1;
    let line = metrics
        .lines()
        .find(|l| l.starts_with("millrace_job_exchange_behind_ms{"))
        .unwrap_or_else(|| panic!("no behind metric: {metrics}"));
    assert!(line.contains("sim:spot:BTC/USDT"), "{line}");
    let value: i64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(value > 50 * MINUTE_MS, "{line}");
    server.stop().await;
    sim.shutdown();
}
