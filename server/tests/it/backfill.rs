//! Backfill through the public API: auto-start, progress, stop on request, resume without a hole,
//! and an incremental run that stops at the previous coverage.

use server::config::BackfillTaskConfig;
use testkit::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_resume_and_incremental_runs_leave_no_hole() {
    let sim = start_sim(60.0, 31).await;
    let mut config = test_config(vec![external_sim_source(&sim)]);
    config.server.admin_token = Some("backfill-token".into());
    config.backfill = vec![BackfillTaskConfig {
        series: "sim:spot:XRP/USDT:1m".into(),
        retention_days: 3,
        batch_limit: 100,
        pause_ms: 60,
        ..Default::default()
    }];
    let server = TestServer::start(config).await;
    let auth = [("Authorization", "Bearer backfill-token")];
    let body = r#"{"series":"sim:spot:XRP/USDT:1m"}"#;

    // Auto-started at boot; progress is visible while it runs.
    let running = eventually("a few pages", || async {
        let b = server.get_json("/api/v1/ops/backfill").await;
        let t = b["tasks"][0].clone();
        (t["batches"].as_u64().unwrap_or(0) >= 3).then_some(t)
    })
    .await;
    assert_eq!(running["state"], "running");
    let p = running["progress"].as_f64().unwrap();
    assert!(p > 0.0 && p < 1.0, "{running}");

    // Stop on request.
    let (s, b) =
        http(server.addr, "POST", "/api/v1/admin/backfill/stop", &auth, body).await.unwrap();
    assert_eq!(s, 200, "{b}");
    let stopped = eventually("the run to stop", || async {
        let b = server.get_json("/api/v1/ops/backfill").await;
        (b["tasks"][0]["state"] == "stopped" && b["tasks"][0]["running"] == false)
            .then(|| b["tasks"][0].clone())
    })
    .await;
    assert!(stopped["progress"].as_f64().unwrap() < 1.0);

    // Resume: the next run fills what is missing, newest first, to the end of the window.
    let (s, _) =
        http(server.addr, "POST", "/api/v1/admin/backfill/start", &auth, body).await.unwrap();
    assert_eq!(s, 200);
    let done = eventually("the resumed run to finish", || async {
        let b = server.get_json("/api/v1/ops/backfill").await;
        (b["tasks"][0]["state"] == "done" && b["tasks"][0]["running"] == false)
            .then(|| b["tasks"][0].clone())
    })
    .await;
    assert!(done["progress"].as_f64().unwrap() > 0.999, "{done}");
    assert!(done["stop_reason"].as_str().unwrap().contains("interrupted run"), "{done}");
    let covered = done["covered"].as_array().unwrap();
    assert_eq!(covered.len(), 1, "one contiguous covered range: {done}");

    // An incremental run later fetches only the new minutes and stops at the previous coverage.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await; // three simulated minutes
    let (s, _) =
        http(server.addr, "POST", "/api/v1/admin/backfill/start", &auth, body).await.unwrap();
    assert_eq!(s, 200);
    let again = eventually("the incremental run to finish", || async {
        let b = server.get_json("/api/v1/ops/backfill").await;
        let t = b["tasks"][0].clone();
        (t["state"] == "done" && t["run_started_from"] != done["run_started_from"]).then_some(t)
    })
    .await;
    assert!(again["candles_written"].as_u64().unwrap() <= 10, "only the new minutes: {again}");
    assert_eq!(again["batches"], 1, "{again}");
    assert!(again["stop_reason"].as_str().unwrap().contains("previous coverage"), "{again}");

    let (lo, hi) = (again["window"][0].as_i64().unwrap(), again["window"][1].as_i64().unwrap());
    let db = server.db_path();
    server.stop().await;
    let m1: Vec<_> = stored(&db, "sim:spot:XRP/USDT:1m")
        .into_iter()
        .filter(|c| c.open_time >= lo && c.open_time <= hi)
        .collect();
    assert_eq!(m1.first().map(|c| c.open_time), Some(lo));
    assert_eq!(m1.last().map(|c| c.open_time), Some(hi));
    assert_eq!(
        m1,
        sim.closed_klines("XRPUSDT", lo, hi),
        "the window equals the exchange's candles"
    );
    sim.shutdown();
}

/// A simulator at `speed` whose XRPUSDT was listed `listed_days_ago` days before now.
async fn sim_listing_xrp(speed: f64, seed: u64, listed_days_ago: f64) -> sim::SimHandle {
    let now = server::clock::wall_clock_ms();
    let mut symbols = sim::SymbolSpec::catalog();
    let xrp = symbols.iter_mut().find(|s| s.symbol == "XRPUSDT").unwrap();
    xrp.listed_ms = now - (listed_days_ago * 86_400_000.0) as i64;
    let config = sim::SimConfig { speed, seed, symbols, ..sim::SimConfig::default() };
    sim::Sim::start(config, "127.0.0.1:0".parse().unwrap()).await.unwrap()
}

async fn backfill_task(server: &TestServer) -> serde_json::Value {
    server.get_json("/api/v1/ops/backfill").await["tasks"][0].clone()
}

/// Seed 003: "3 consecutive batches of expired data stop the crawl — on the first run only".
/// With time paging a page holds nothing only where the exchange has nothing (before the
/// listing, or an outage): the first run stops after 3 such pages; a later run walks on through
/// them to the window's start, so an outage inside the window never ends every run early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_pages_stop_only_the_first_run() {
    // Listed a day ago; a three-day window.
    let sim = sim_listing_xrp(60.0, 33, 1.0).await;
    let mut config = test_config(vec![external_sim_source(&sim)]);
    config.server.admin_token = Some("backfill-token".into());
    config.backfill = vec![BackfillTaskConfig {
        series: "sim:spot:XRP/USDT:1m".into(),
        retention_days: 3,
        batch_limit: 200,
        pause_ms: 5,
        ..Default::default()
    }];
    let server = TestServer::start(config).await;
    let first = eventually("the first run to end", || async {
        let t = backfill_task(&server).await;
        (t["state"] == "done" && t["running"] == false).then_some(t)
    })
    .await;
    let reason = first["stop_reason"].as_str().unwrap();
    assert!(reason.contains("3 consecutive pages without candles on the first run"), "{first}");
    // A day of candles and three empty pages (600 minutes) of the three-day window covered.
    let p = first["progress"].as_f64().unwrap();
    assert!(p > 0.4 && p < 0.6, "{first}");

    // A later run does not stop at empty pages: it covers the window to its start.
    let auth = [("Authorization", "Bearer backfill-token")];
    let body = r#"{"series":"sim:spot:XRP/USDT:1m"}"#;
    let (s, b) =
        http(server.addr, "POST", "/api/v1/admin/backfill/start", &auth, body).await.unwrap();
    assert_eq!(s, 200, "{b}");
    let second = eventually("the second run to end", || async {
        let t = backfill_task(&server).await;
        let reason = t["stop_reason"].as_str().unwrap_or_default().to_string();
        (t["state"] == "done" && t["running"] == false && !reason.contains("consecutive"))
            .then_some(t)
    })
    .await;
    assert!(second["progress"].as_f64().unwrap() > 0.999, "{second}");
    assert!(second["stop_reason"].as_str().unwrap().contains("window covered"), "{second}");
    assert_eq!(second["covered"].as_array().unwrap().len(), 1, "{second}");
    let batches = second["batches"].as_u64().unwrap();
    assert!(batches >= 10, "walked the empty part of the window: {second}");
    let (lo, hi) = (second["window"][0].as_i64().unwrap(), second["window"][1].as_i64().unwrap());
    let db = server.db_path();
    server.stop().await;
    let m1: Vec<_> = stored(&db, "sim:spot:XRP/USDT:1m")
        .into_iter()
        .filter(|c| c.open_time >= lo && c.open_time <= hi)
        .collect();
    assert_eq!(m1, sim.closed_klines("XRPUSDT", lo, hi), "the window equals the exchange's");
    assert!(m1.len() > 1400 && m1.len() < 1600, "a day of candles: {}", m1.len());
    sim.shutdown();
}

/// Seed 003: "each batch goes to Kafka immediately" — every page backfill stores is published
/// on the series' stream (1m and derived), equal to what was stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_publishes_every_stored_page() {
    let sim = start_sim(1.0, 37).await;
    let mut config = test_config(vec![external_sim_source(&sim)]);
    config.server.admin_token = Some("backfill-token".into());
    config.backfill = vec![BackfillTaskConfig {
        series: "sim:spot:ADA/USDT:1m".into(),
        retention_days: 1,
        batch_limit: 100,
        pause_ms: 5,
        auto_start: false,
        ..Default::default()
    }];
    let server = TestServer::start(config).await;
    let mut m1_ws = server.ws().await;
    assert!(request(&mut m1_ws, "SUBSCRIBE", &["kline@sim:spot:ADA/USDT:1m"], 1).await.is_ok());
    let m1_pushed = crate::store_faults::collect_closed(m1_ws);
    let mut h1_ws = server.ws().await;
    assert!(request(&mut h1_ws, "SUBSCRIBE", &["kline@sim:spot:ADA/USDT:1h"], 1).await.is_ok());
    let h1_pushed = crate::store_faults::collect_closed(h1_ws);

    let auth = [("Authorization", "Bearer backfill-token")];
    let body = r#"{"series":"sim:spot:ADA/USDT:1m"}"#;
    let (s, b) =
        http(server.addr, "POST", "/api/v1/admin/backfill/start", &auth, body).await.unwrap();
    assert_eq!(s, 200, "{b}");
    let done = eventually("the run to end", || async {
        let t = server.get_json("/api/v1/ops/backfill").await["tasks"][0].clone();
        (t["state"] == "done" && t["running"] == false).then_some(t)
    })
    .await;
    let (lo, hi) = (done["window"][0].as_i64().unwrap(), done["window"][1].as_i64().unwrap());
    assert!(done["batches"].as_u64().unwrap() >= 14, "{done}");
    tokio::time::sleep(std::time::Duration::from_millis(500)).await; // the last pushes
    let db = server.db_path();
    server.stop().await;

    let in_window = |c: &shared::candle::Candle| c.open_time >= lo && c.open_time <= hi;
    let stored_m1: Vec<_> =
        stored(&db, "sim:spot:ADA/USDT:1m").into_iter().filter(in_window).collect();
    assert_eq!(stored_m1.len() as i64, (hi - lo) / 60_000 + 1, "the window is stored");
    let mut pushed: Vec<_> = m1_pushed.lock().unwrap().iter().copied().filter(in_window).collect();
    pushed.sort_by_key(|c| c.open_time);
    assert_eq!(pushed, stored_m1, "every stored 1m candle was pushed once, as stored");
    // The 1h candles: each stored one (buckets the window completes) was pushed as stored.
    let stored_h1: Vec<_> =
        stored(&db, "sim:spot:ADA/USDT:1h").into_iter().filter(in_window).collect();
    assert!(stored_h1.len() >= 23, "{} 1h candles", stored_h1.len());
    let h1: Vec<(i64, shared::fixed::Price, u64)> =
        h1_pushed.lock().unwrap().iter().map(|c| (c.open_time, c.close, c.trades)).collect();
    for c in &stored_h1 {
        assert!(h1.contains(&(c.open_time, c.close, c.trades)), "1h {} not pushed", c.open_time);
    }
    sim.shutdown();
}
