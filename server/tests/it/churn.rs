//! Subscription churn and the ingest supervisor's rules that stand between clients and the
//! upstream: a client address's fair share of on-demand capacity, the server-wide job-start
//! rate, the REST weight budget that no client behaviour can pass, and the seed's capacity rules
//! that had no test (eviction of the longest idle among several, `ondemand_max_jobs = 0`).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use shared::protocol::ErrorCode;
use testkit::*;
use tokio::net::TcpSocket;
use tokio_tungstenite::MaybeTlsStream;

fn job<'a>(jobs: &'a serde_json::Value, instrument: &str) -> Option<&'a serde_json::Value> {
    jobs["jobs"].as_array().unwrap().iter().find(|j| j["instrument"] == instrument)
}

pub(crate) fn kline(base: &str) -> String {
    format!("kline@sim:spot:{base}/USDT:1m")
}

/// A WebSocket to `addr` from the local address `from` (127.0.0.x: another client address).
pub(crate) async fn ws_from(from: &str, addr: SocketAddr) -> Ws {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from.parse::<IpAddr>().unwrap(), 0)).unwrap();
    let tcp = socket.connect(addr).await.unwrap();
    tokio_tungstenite::client_async(format!("ws://{addr}/ws"), MaybeTlsStream::Plain(tcp))
        .await
        .unwrap()
        .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_gets_its_fair_share_and_cannot_lock_the_others_out() {
    let sim = start_sim(60.0, 11).await;
    let mut config = test_config(vec![external_sim_source(&sim)]);
    config.ingest.pinned = vec![];
    config.ingest.ondemand_max_jobs = 4;
    config.ingest.ondemand_max_jobs_per_ip = 2;
    let server = TestServer::start(config).await;

    let mut a = ws_from("127.0.0.1", server.addr).await;
    for (id, base) in [(1, "BTC"), (2, "ETH")] {
        assert!(request(&mut a, "SUBSCRIBE", &[&kline(base)], id).await.is_ok(), "{base}");
    }
    // a third job for the same address: refused, with the key to raise
    let err = request(&mut a, "SUBSCRIBE", &[&kline("SOL")], 3).await.error.expect("refused");
    assert_eq!(err.code, ErrorCode::CapacityExhausted, "{}", err.msg);
    assert!(err.msg.contains("ingest.ondemand_max_jobs_per_ip"), "{}", err.msg);
    // joining a job that runs starts nothing, and is not limited
    let mut a2 = ws_from("127.0.0.1", server.addr).await;
    assert!(request(&mut a2, "SUBSCRIBE", &[&kline("BTC")], 1).await.is_ok());

    // another address still gets the rest of the capacity
    let mut b = ws_from("127.0.0.2", server.addr).await;
    for (id, base) in [(1, "SOL"), (2, "XRP")] {
        assert!(request(&mut b, "SUBSCRIBE", &[&kline(base)], id).await.is_ok(), "{base}");
    }
    let jobs = server.get_json("/api/v1/ops/jobs").await;
    assert_eq!(jobs["capacity"]["ondemand_jobs"], 4);
    assert_eq!(jobs["capacity"]["start_refusals"], 1);

    // once A lets one go, it may start another (evicting its own idle job: the only idle one)
    assert!(request(&mut a, "UNSUBSCRIBE", &[&kline("ETH")], 4).await.is_ok());
    assert!(request(&mut a, "SUBSCRIBE", &[&kline("ADA")], 5).await.is_ok());
    let jobs = server.get_json("/api/v1/ops/jobs").await;
    assert!(job(&jobs, "sim:spot:ETH/USDT").is_none(), "ETH (idle) evicted for ADA");
    server.stop().await;
    sim.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_starts_have_a_server_wide_rate() {
    let sim = start_sim(60.0, 12).await;
    let mut config = test_config(vec![external_sim_source(&sim)]);
    config.ingest.pinned = vec![];
    config.ingest.ondemand_max_jobs = 0;
    config.ingest.max_job_starts_per_min = 3;
    let server = TestServer::start(config).await;

    // three addresses, one start each, then a fourth start anywhere is refused
    for (n, (from, base)) in
        [("127.0.0.1", "BTC"), ("127.0.0.2", "ETH"), ("127.0.0.3", "SOL")].into_iter().enumerate()
    {
        let mut ws = ws_from(from, server.addr).await;
        assert!(request(&mut ws, "SUBSCRIBE", &[&kline(base)], n as u64).await.is_ok());
        std::mem::forget(ws); // keep the lease for the test's life
    }
    let mut d = ws_from("127.0.0.4", server.addr).await;
    let err = request(&mut d, "SUBSCRIBE", &[&kline("XRP")], 1).await.error.expect("refused");
    assert_eq!(err.code, ErrorCode::TooManyJobStarts, "{}", err.msg);
    assert!(err.msg.contains("ingest.max_job_starts_per_min"), "{}", err.msg);
    // a running job is still joined
    assert!(request(&mut d, "SUBSCRIBE", &[&kline("BTC")], 2).await.is_ok());
    let metrics = server.get("/metrics").await.1;
    assert!(metrics.contains("millrace_subscriptions_refused_rate_total 1"), "{metrics}");
    server.stop().await;
    sim.shutdown();
}

/// The churn: on-demand capacity 1 and subscribe/unsubscribe pairs over several
/// instruments, each pair starting a depth job whose REST snapshot (5,000 levels) costs weight
/// 250. With the client-side limits out of the way, the REST client's own weight budget is what
/// keeps the upstream under its limit: the exchange never reports more than the budget, and the
/// calls the budget held back are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_never_takes_the_upstream_past_the_weight_budget() {
    let sim = start_sim(1.0, 13).await;
    let mut source = external_sim_source(&sim);
    source.rest_weight_budget_1m = Some(300);
    let mut config = test_config(vec![source]);
    config.ingest.pinned = vec![];
    config.depth.pinned = vec![];
    config.depth.ondemand_max_jobs = 1;
    config.depth.snapshot_limit = 5000;
    config.ingest.max_job_starts_per_min = 0;
    config.limits.max_job_starts_per_min_per_connection = 100_000;
    config.limits.max_job_starts_per_min_per_ip = 100_000;
    let server = TestServer::start(config).await;

    let mut ws = server.ws().await;
    let mut id = 0;
    for _ in 0..2 {
        for base in ["BTC", "ETH", "SOL", "XRP", "ADA", "BNB"] {
            let stream = format!("depth_update@sim:spot:{base}/USDT");
            id += 1;
            let r = request(&mut ws, "SUBSCRIBE", &[&stream], id).await;
            assert!(r.is_ok(), "{stream}: {:?}", r.error);
            // long enough for the job to connect and ask for its snapshot
            tokio::time::sleep(Duration::from_millis(700)).await;
            id += 1;
            let _ = request(&mut ws, "UNSUBSCRIBE", &[&stream], id).await;
        }
    }
    let sources = eventually("the budget to hold back a snapshot", || async {
        let s = server.get_json("/api/v1/ops/sources").await;
        let source = s["sources"][0].clone();
        (source["rest_budget_refusals"].as_u64().unwrap_or(0) > 0).then_some(source)
    })
    .await;
    let used = sources["rest_used_weight_1m"].as_u64().expect("the simulator reports weight");
    assert!(used <= 300, "the exchange counted {used} weight this minute, over the budget of 300");
    assert_eq!(sources["rest_weight_budget_1m"], 300);
    server.stop().await;
    sim.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_takes_the_job_idle_the_longest_among_several() {
    let sim = start_sim(60.0, 14).await;
    let mut config = test_config(vec![external_sim_source(&sim)]);
    config.ingest.pinned = vec![];
    config.ingest.ondemand_max_jobs = 3;
    let server = TestServer::start(config).await;
    let mut ws = server.ws().await;
    for (id, base) in [(1, "BTC"), (2, "ETH"), (3, "SOL")] {
        assert!(request(&mut ws, "SUBSCRIBE", &[&kline(base)], id).await.is_ok());
    }
    // idle order: ETH first, then SOL, then BTC
    for (id, base) in [(4, "ETH"), (5, "SOL"), (6, "BTC")] {
        assert!(request(&mut ws, "UNSUBSCRIBE", &[&kline(base)], id).await.is_ok());
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert!(request(&mut ws, "SUBSCRIBE", &[&kline("XRP")], 7).await.is_ok());
    let jobs = server.get_json("/api/v1/ops/jobs").await;
    assert!(job(&jobs, "sim:spot:ETH/USDT").is_none(), "ETH, idle the longest, evicted");
    assert!(job(&jobs, "sim:spot:SOL/USDT").is_some() && job(&jobs, "sim:spot:BTC/USDT").is_some());
    assert!(request(&mut ws, "SUBSCRIBE", &[&kline("ADA")], 8).await.is_ok());
    let jobs = server.get_json("/api/v1/ops/jobs").await;
    assert!(job(&jobs, "sim:spot:SOL/USDT").is_none(), "then SOL");
    assert!(job(&jobs, "sim:spot:BTC/USDT").is_some());
    assert_eq!(jobs["capacity"]["evictions"], 2);
    server.stop().await;
    sim.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ondemand_max_jobs_zero_means_unlimited() {
    let sim = start_sim(60.0, 15).await;
    let mut config = test_config(vec![external_sim_source(&sim)]);
    config.ingest.pinned = vec![];
    config.ingest.ondemand_max_jobs = 0;
    let server = TestServer::start(config).await;
    let mut ws = server.ws().await;
    let bases = ["BTC", "ETH", "SOL", "XRP", "ADA", "BNB", "DOGE", "LTC"];
    for (id, base) in bases.iter().enumerate() {
        let r = request(&mut ws, "SUBSCRIBE", &[&kline(base)], id as u64).await;
        assert!(r.is_ok(), "{base}: {:?}", r.error);
    }
    let jobs = server.get_json("/api/v1/ops/jobs").await;
    assert_eq!(jobs["capacity"]["ondemand_jobs"], bases.len());
    assert_eq!(jobs["capacity"]["ondemand_max_jobs"], 0);
    assert_eq!(jobs["capacity"]["evictions"], 0);
    server.stop().await;
    sim.shutdown();
}
