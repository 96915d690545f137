//! The ingest supervisor's capacity rules (seed: test_ingest_supervisor_capacity) through the
//! browser API, against real kline jobs ingesting from a real simulator.

use shared::protocol::ErrorCode;
use testkit::*;

fn job<'a>(jobs: &'a serde_json::Value, instrument: &str) -> Option<&'a serde_json::Value> {
    jobs["jobs"].as_array().unwrap().iter().find(|j| j["instrument"] == instrument)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_eviction_refusal_reaper_and_refcounts() {
    let sim = start_sim(60.0, 7).await;
    let mut config = test_config(vec![external_sim_source(&sim)]);
    config.ingest.ondemand_max_jobs = 2;
    config.ingest.ondemand_idle_ttl_s = 1;
    config.ingest.reaper_interval_ms = 100;
    config.ingest.pinned = vec!["sim:spot:BNB/USDT".into()];
    let server = TestServer::start(config).await;

    // The pinned job runs with nobody watching and shows the seed's refcount -1.
    let jobs = server.get_json("/api/v1/ops/jobs").await;
    let bnb = job(&jobs, "sim:spot:BNB/USDT").expect("pinned job");
    assert_eq!((bnb["pinned"].as_bool(), bnb["refcount"].as_i64()), (Some(true), Some(-1)));

    // Two timeframes of one instrument share one job; each subscription counts once.
    let mut a = server.ws().await;
    assert!(request(
        &mut a,
        "SUBSCRIBE",
        &["kline@sim:spot:BTC/USDT:1m", "kline@sim:spot:BTC/USDT:5m"],
        1
    )
    .await
    .is_ok());
    let mut b = server.ws().await;
    assert!(request(&mut b, "SUBSCRIBE", &["kline@sim:spot:BTC/USDT:1h"], 1).await.is_ok());
    let jobs = server.get_json("/api/v1/ops/jobs").await;
    let btc = job(&jobs, "sim:spot:BTC/USDT").expect("BTC job");
    assert_eq!(btc["refcount"], 3);
    assert_eq!(btc["subscriptions"]["sim:spot:BTC/USDT:5m"], 1);
    assert_eq!(jobs["capacity"]["ondemand_jobs"], 1);

    // Second on-demand job fills the capacity (2); a third instrument is refused: nothing idle.
    assert!(request(&mut a, "SUBSCRIBE", &["kline@sim:spot:ETH/USDT:1m"], 2).await.is_ok());
    let r = request(&mut a, "SUBSCRIBE", &["kline@sim:spot:SOL/USDT:1m"], 3).await;
    let err = r.error.expect("refused");
    assert_eq!(err.code, ErrorCode::CapacityExhausted, "{}", err.msg);
    let jobs = server.get_json("/api/v1/ops/jobs").await;
    assert_eq!(jobs["capacity"]["refusals"], 1);
    assert!(job(&jobs, "sim:spot:SOL/USDT").is_none());

    // ETH becomes idle; SOL then evicts it (the longest idle), BTC (watched) stays.
    assert!(request(&mut a, "UNSUBSCRIBE", &["kline@sim:spot:ETH/USDT:1m"], 4).await.is_ok());
    let jobs = server.get_json("/api/v1/ops/jobs").await;
    assert_eq!(job(&jobs, "sim:spot:ETH/USDT").unwrap()["refcount"], 0);
    assert!(request(&mut a, "SUBSCRIBE", &["kline@sim:spot:SOL/USDT:1m"], 5).await.is_ok());
    let jobs = server.get_json("/api/v1/ops/jobs").await;
    assert!(job(&jobs, "sim:spot:ETH/USDT").is_none(), "ETH evicted");
    assert!(job(&jobs, "sim:spot:SOL/USDT").is_some());
    assert!(job(&jobs, "sim:spot:BTC/USDT").is_some());
    assert_eq!(jobs["capacity"]["evictions"], 1);

    // Unknown series are refused with a typed error, and change nothing.
    let r = request(&mut a, "SUBSCRIBE", &["kline@sim:spot:NOPE/USDT:1m"], 6).await;
    assert_eq!(r.error.unwrap().code, ErrorCode::UnknownSeries);
    let r = request(&mut a, "SUBSCRIBE", &["kline@nowhere:spot:BTC/USDT:1m"], 7).await;
    assert_eq!(r.error.unwrap().code, ErrorCode::UnknownSeries);

    // A closing tab releases its references; the reaper stops idle on-demand jobs after the TTL.
    drop(a);
    let jobs = eventually("the BTC refcount to drop to 1 after tab A closed", || async {
        let jobs = server.get_json("/api/v1/ops/jobs").await;
        (job(&jobs, "sim:spot:BTC/USDT").map(|j| j["refcount"].clone()) == Some(1.into()))
            .then_some(jobs)
    })
    .await;
    assert!(
        job(&jobs, "sim:spot:SOL/USDT").is_some_and(|j| j["refcount"] == 0)
            || job(&jobs, "sim:spot:SOL/USDT").is_none()
    );
    eventually("the reaper to stop SOL", || async {
        let jobs = server.get_json("/api/v1/ops/jobs").await;
        job(&jobs, "sim:spot:SOL/USDT").is_none().then_some(())
    })
    .await;
    drop(b);
    let jobs = eventually("the reaper to stop BTC", || async {
        let jobs = server.get_json("/api/v1/ops/jobs").await;
        job(&jobs, "sim:spot:BTC/USDT").is_none().then_some(jobs)
    })
    .await;
    // The pinned job is never reaped.
    assert!(job(&jobs, "sim:spot:BNB/USDT").is_some());
    assert!(jobs["capacity"]["reaped"].as_u64().unwrap() >= 2);
    server.stop().await;
    sim.shutdown();
}

/// `POST /api/v1/admin/jobs/stop` with the test's token; the reply's status and body.
async fn admin_stop(server: &TestServer, instrument: &str) -> (u16, serde_json::Value) {
    let auth = [("Authorization", "Bearer jobs-token")];
    let body = serde_json::json!({ "instrument": instrument }).to_string();
    let (status, body) =
        http(server.addr, "POST", "/api/v1/admin/jobs/stop", &auth, &body).await.unwrap();
    (status, serde_json::from_str(&body).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_stop_restarts_wanted_jobs_and_their_sessions_stay_attached() {
    // A simulated minute every 100 ms.
    let sim = start_sim(600.0, 61).await;
    let mut config = test_config(vec![external_sim_source(&sim)]);
    config.server.admin_token = Some("jobs-token".into());
    config.ingest.pinned = vec!["sim:spot:BTC/USDT".into()];
    config.ingest.flush_ms = 50;
    let server = TestServer::start(config).await;
    let (btc, eth, sol) = ("sim:spot:BTC/USDT", "sim:spot:ETH/USDT", "sim:spot:SOL/USDT");

    // Session A watches the pinned job's closed candles; B holds a second lease on it, one on
    // an on-demand job (ETH), and leaves another on-demand job idle (SOL).
    let mut a = server.ws().await;
    assert!(request(&mut a, "SUBSCRIBE", &["kline@sim:spot:BTC/USDT:1m"], 1).await.is_ok());
    let pushed = crate::store_faults::collect_closed(a);
    let mut b = server.ws().await;
    let streams = ["kline@sim:spot:BTC/USDT:5m", "kline@sim:spot:ETH/USDT:1m"];
    assert!(request(&mut b, "SUBSCRIBE", &streams, 1).await.is_ok());
    assert!(request(&mut b, "SUBSCRIBE", &["kline@sim:spot:SOL/USDT:1m"], 2).await.is_ok());
    assert!(request(&mut b, "UNSUBSCRIBE", &["kline@sim:spot:SOL/USDT:1m"], 3).await.is_ok());
    eventually("closed candles pushed", || async {
        (pushed.lock().unwrap().len() >= 5).then_some(())
    })
    .await;
    let jobs = server.get_json("/api/v1/ops/jobs").await;
    let started = job(&jobs, btc).unwrap()["started_at_ms"].as_i64().unwrap();
    assert_eq!(job(&jobs, btc).unwrap()["subscribers"], 2);

    // The pinned job restarts in place: still pinned, its two sessions still counted.
    let (status, reply) = admin_stop(&server, btc).await;
    assert_eq!((status, reply["result"].as_str()), (200, Some("restarted")), "{reply}");
    let jobs = server.get_json("/api/v1/ops/jobs").await;
    let j = job(&jobs, btc).expect("the pinned job is still there");
    assert_eq!((j["pinned"].as_bool(), j["subscribers"].as_u64()), (Some(true), Some(2)), "{j}");
    assert!(j["started_at_ms"].as_i64().unwrap() >= started, "{j}");
    // A subscribed on-demand job restarts too; an idle one is removed.
    let (status, reply) = admin_stop(&server, eth).await;
    assert_eq!((status, reply["result"].as_str()), (200, Some("restarted")), "{reply}");
    assert_eq!(job(&server.get_json("/api/v1/ops/jobs").await, eth).unwrap()["subscribers"], 1);
    let (status, reply) = admin_stop(&server, sol).await;
    assert_eq!((status, reply["result"].as_str()), (200, Some("stopped")), "{reply}");
    assert!(job(&server.get_json("/api/v1/ops/jobs").await, sol).is_none());

    // Session A keeps receiving closed candles from the new run: none missing, none twice.
    let before = pushed.lock().unwrap().len();
    eventually("closed candles from the restarted job", || async {
        (pushed.lock().unwrap().len() >= before + 20).then_some(())
    })
    .await;
    let got = pushed.lock().unwrap().clone();
    for w in got.windows(2) {
        assert_eq!(w[1].open_time - w[0].open_time, 60_000, "a gap or a repeat across the restart");
    }
    let oracle = sim.closed_klines("BTCUSDT", got[0].open_time, got[got.len() - 1].open_time);
    assert_eq!(got, oracle);

    // The leases count on the new run: releasing one is seen.
    assert!(request(&mut b, "UNSUBSCRIBE", &["kline@sim:spot:BTC/USDT:5m"], 4).await.is_ok());
    let jobs = server.get_json("/api/v1/ops/jobs").await;
    assert_eq!(job(&jobs, btc).unwrap()["subscribers"], 1, "{jobs}");
    drop(b);
    let jobs = eventually("ETH released", || async {
        let jobs = server.get_json("/api/v1/ops/jobs").await;
        (job(&jobs, eth).is_some_and(|j| j["subscribers"] == 0)).then_some(jobs)
    })
    .await;
    assert_eq!(job(&jobs, btc).unwrap()["subscribers"], 1);
    server.stop().await;
    sim.shutdown();
}
