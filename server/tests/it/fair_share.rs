//! A client address's fair share of a full on-demand capacity. Before, two addresses holding 10
//! leased jobs each (`ondemand_max_jobs` 20, `ondemand_max_jobs_per_ip` 10) locked every other
//! client out with `capacity_exhausted`: jobs with subscribers were never evicted. Now a
//! newcomer below its fair share (capacity / addresses holding jobs, itself counted) preempts a
//! job of the address most above its share; that job's subscribers are told `preempted`.

use std::time::Duration;

use shared::protocol::{ErrorCode, Reply, ServerFrame, Stream};
use testkit::*;

use crate::churn::{kline, ws_from};

/// The next unasked reply (id 0) on `ws`, skipping pushes; at most 10 s.
async fn unasked_reply(ws: &mut Ws) -> Reply {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let ServerFrame::Reply(r) = next_frame(ws).await {
                assert_eq!(r.id, 0, "an answer to a request nobody sent: {r:?}");
                return r;
            }
        }
    })
    .await
    .expect("an unasked reply within 10 s")
}

fn has_job(jobs: &serde_json::Value, base: &str) -> bool {
    let name = format!("sim:spot:{base}/USDT");
    jobs["jobs"].as_array().unwrap().iter().any(|j| j["instrument"] == name.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_below_its_fair_share_preempts_a_job_of_the_address_holding_the_most() {
    let sim = start_sim(60.0, 21).await;
    let mut config = test_config(vec![external_sim_source(&sim)]);
    config.ingest.pinned = vec![];
    config.ingest.ondemand_max_jobs = 4;
    // the per-address limit stays at its default (10): above the capacity, as in the report
    let server = TestServer::start(config).await;

    // the hog takes the whole capacity
    let mut hog = ws_from("127.0.0.2", server.addr).await;
    for (id, base) in [(1, "BTC"), (2, "ETH"), (3, "SOL"), (4, "XRP")] {
        assert!(request(&mut hog, "SUBSCRIBE", &[&kline(base)], id).await.is_ok(), "{base}");
    }
    let jobs = server.get_json("/api/v1/ops/jobs").await;
    assert_eq!(jobs["capacity"]["ondemand_jobs"], 4);

    // a newcomer (share 4 / 2 = 2, holds 0) gets a job: the hog's least recently subscribed
    let mut newcomer = ws_from("127.0.0.3", server.addr).await;
    let r = request(&mut newcomer, "SUBSCRIBE", &[&kline("ADA")], 1).await;
    assert!(r.is_ok(), "the newcomer was refused: {r:?}");
    let told = unasked_reply(&mut hog).await;
    let error = told.error.expect("an error");
    assert_eq!(error.code, ErrorCode::Preempted, "{}", error.msg);
    assert_eq!(told.stream, Some(kline("BTC").parse::<Stream>().unwrap()));
    assert!(error.msg.contains("fair share"), "{}", error.msg);
    let jobs = server.get_json("/api/v1/ops/jobs").await;
    assert!(!has_job(&jobs, "BTC") && has_job(&jobs, "ADA"), "{jobs}");
    assert_eq!(jobs["capacity"]["ondemand_jobs"], 4);
    assert_eq!(jobs["capacity"]["preemptions"], 1);

    // the hog, at or above its share (3 >= 2), is refused as before; its socket stays open
    let err = request(&mut hog, "SUBSCRIBE", &[&kline("BTC")], 5).await.error.expect("refused");
    assert_eq!(err.code, ErrorCode::CapacityExhausted, "{}", err.msg);

    // the newcomer below its share takes a second job (ETH, the hog's next); then both hold 2
    assert!(request(&mut newcomer, "SUBSCRIBE", &[&kline("BTC")], 2).await.is_ok());
    let told = unasked_reply(&mut hog).await;
    assert_eq!(told.stream, Some(kline("ETH").parse::<Stream>().unwrap()));
    let err =
        request(&mut newcomer, "SUBSCRIBE", &[&kline("DOGE")], 3).await.error.expect("refused");
    assert_eq!(err.code, ErrorCode::CapacityExhausted, "{}", err.msg);
    // the hog still receives what it kept, and may unsubscribe what it lost (nothing to do)
    assert!(request(&mut hog, "UNSUBSCRIBE", &[&kline("BTC")], 6).await.is_ok());

    let metrics = server.get("/metrics").await.1;
    assert!(metrics.contains("\nmillrace_ingest_preemptions_total 2\n"), "{metrics}");
    assert!(metrics.contains("\nmillrace_subscriptions 4\n"), "{metrics}");
    let jobs = server.get_json("/api/v1/ops/jobs").await;
    assert_eq!(jobs["capacity"]["preemptions"], 2);
    assert_eq!(jobs["capacity"]["refusals"], 2);
    server.stop().await;
    sim.shutdown();
}
