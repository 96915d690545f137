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
