//! `kill -9` during live ingest and during backfill, then restart: nothing accepted is lost,
//! nothing is duplicated, and no hole is left. The simulator runs in this test process, so the
//! exchange outlives every `millrace serve` child process that is killed.

use std::time::Duration;

use server::config::BackfillTaskConfig;
use testkit::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_ingest_and_backfill_loses_nothing() {
    let sim = start_sim(600.0, 23).await;
    let mut config = test_config(vec![external_sim_source(&sim)]);
    config.ingest.pinned = vec!["sim:spot:BTC/USDT".into()];
    config.ingest.flush_ms = 50;
    config.backfill = vec![BackfillTaskConfig {
        series: "sim:spot:BTC/USDT:1m".into(),
        retention_days: 4,
        batch_limit: 100,
        pause_ms: 25,
        ..Default::default()
    }];
    let series = "sim:spot:BTC/USDT:1m";

    // Run 1: killed in the middle of the backfill.
    let child = ChildServer::start(&config).await;
    eventually("a few backfill pages", || async {
        let b = child.get_json("/api/v1/ops/backfill").await;
        (b["tasks"][0]["batches"].as_u64().unwrap_or(0) >= 5).then_some(())
    })
    .await;
    child.kill9();
    let after_kill = stored(&config.db_path(), series).len();
    assert!(after_kill >= 500, "pages were stored before the kill: {after_kill}");

    // Run 2: killed again during live ingest (and likely mid-backfill).
    let child = ChildServer::start(&config).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    child.kill9();

    // Run 3: runs to completion, then stops cleanly.
    let child = ChildServer::start(&config).await;
    let task = eventually("the backfill to finish", || async {
        let b = child.get_json("/api/v1/ops/backfill").await;
        (b["tasks"][0]["state"] == "done").then(|| b["tasks"][0].clone())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    child.terminate();

    let (lo, _hi) = (task["window"][0].as_i64().unwrap(), task["window"][1].as_i64().unwrap());
    let m1 = stored(&config.db_path(), series);
    let from = m1.iter().position(|c| c.open_time >= lo).unwrap();
    let m1 = &m1[from..];
    assert_eq!(m1[0].open_time, lo, "the window's first minute is stored");
    for w in m1.windows(2) {
        assert_eq!(
            w[1].open_time - w[0].open_time,
            60_000,
            "hole or duplicate after {}",
            w[0].open_time
        );
    }
    let last = m1[m1.len() - 1].open_time;
    let oracle = sim.closed_klines("BTCUSDT", lo, last);
    assert_eq!(oracle.len(), m1.len());
    for (got, want) in m1.iter().zip(&oracle) {
        assert_eq!(got, want, "stored candle differs from the exchange's");
    }
    assert!(m1.len() >= 4 * 1440, "{} minutes", m1.len());
    sim.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_flushes_buffered_candles() {
    let sim = start_sim(600.0, 29).await;
    let mut config = test_config(vec![external_sim_source(&sim)]);
    config.ingest.pinned = vec!["sim:spot:ADA/USDT".into()];
    // Nothing is flushed while running: only the shutdown can store these candles.
    config.ingest.flush_ms = 3_600_000;
    config.ingest.batch_max = 100_000;
    let series = "sim:spot:ADA/USDT:1m";
    let child = ChildServer::start(&config).await;
    let buffered = eventually("closed candles buffered", || async {
        let jobs = child.get_json("/api/v1/ops/jobs").await;
        let n = jobs["jobs"][0]["closed_candles"].as_u64().unwrap_or(0);
        (n >= 10).then_some(n)
    })
    .await;
    assert!(stored(&config.db_path(), series).is_empty(), "nothing stored before shutdown");
    child.terminate();
    let m1 = stored(&config.db_path(), series);
    assert!(m1.len() as u64 >= buffered, "{} stored, {buffered} were buffered", m1.len());
    let oracle = sim.closed_klines("ADAUSDT", m1[0].open_time, m1[m1.len() - 1].open_time);
    assert_eq!(m1, oracle);
    sim.shutdown();
}
