//! The default books at speed 60 with verifications every 500 ms: a fault-free run finds no
//! drift. (The simulator's 100 ms diffs once left out levels that were added and removed inside
//! their window, so a REST snapshot taken inside a window left phantom levels in the book, and
//! every verification at speed 60 reported 7-10 drifted levels a minute.)

use testkit::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_speed_60_the_default_books_verify_without_drift() {
    let mut config = test_config(vec![embedded_sim_source(60.0)]);
    config.depth.pinned = vec!["sim:spot:BTC/USDT".into(), "sim:spot:ETH/USDT".into()];
    config.depth.verify_interval_ms = 500;
    config.l3.sim_feeds = false;
    let server = TestServer::start(config).await;
    let books = eventually("at least 5 verifications of each default book", || async {
        let books = server.get_json("/api/v1/ops/books").await;
        let ours: Vec<serde_json::Value> = books["books"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| b["instrument"].as_str().unwrap().starts_with("sim:spot:"))
            .cloned()
            .collect();
        (ours.len() == 2 && ours.iter().all(|b| b["verifications"].as_u64().unwrap_or(0) >= 5))
            .then_some(ours)
    })
    .await;
    for b in &books {
        assert_eq!(b["drift"], 0, "{b}");
        assert_eq!(b["gaps"], 0, "{b}");
        assert_eq!(b["health"], "synced", "{b}");
    }
    server.stop().await;
}
