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
