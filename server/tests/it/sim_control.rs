//! The embedded simulator's controls in the running service: `POST /sim/faults` and
//! `POST /tbt/control` take the admin token and JSON only (so neither anyone on loopback nor a
//! web page can drop the upstream connections or pause the tick-by-tick books), and a paused
//! tick-by-tick feed has its books reported `stale`, not `synced`, until events flow again.

use std::time::Duration;

use testkit::*;

const TOKEN: &str = "sim-control-admin-token";

fn books_health(books: &serde_json::Value) -> Vec<(String, String)> {
    books["books"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["instrument"].as_str().unwrap().starts_with("sim:stock:"))
        .map(|b| {
            (
                b["instrument"].as_str().unwrap().to_string(),
                b["health"].as_str().unwrap_or("?").to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_simulator_controls_take_the_admin_token_and_json() {
    let mut config = test_config(vec![embedded_sim_source(1.0)]);
    config.server.admin_token = Some(TOKEN.into());
    config.l3.sim_feeds = false;
    let server = TestServer::start(config).await;
    let sim = server.app.simulator("sim").expect("an embedded simulator");
    let addr = sim.addr();
    let auth = format!("Bearer {TOKEN}");
    let json = ("Content-Type", "application/json");
    for (path, body) in
        [("/sim/faults", r#"{"action":"drop"}"#), ("/tbt/control", r#"{"pause":true}"#)]
    {
        let (status, reply) = http(addr, "POST", path, &[json], body).await.unwrap();
        assert_eq!(status, 401, "{path} without a token: {reply}");
        let (status, reply) = http(
            addr,
            "POST",
            path,
            &[("Authorization", &auth), ("Content-Type", "text/plain")],
            body,
        )
        .await
        .unwrap();
        assert_eq!(status, 415, "{path} as text/plain: {reply}");
    }
    assert!(!sim.tbt().is_paused());
    assert_eq!(sim.faults().counters().control_refused, 4);
    let (status, reply) =
        http(addr, "POST", "/tbt/control", &[("Authorization", &auth), json], r#"{"pause":true}"#)
            .await
            .unwrap();
    assert_eq!(status, 200, "{reply}");
    assert!(sim.tbt().is_paused());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_admin_token_the_embedded_simulator_takes_no_control() {
    let mut config = test_config(vec![embedded_sim_source(1.0)]);
    config.l3.sim_feeds = false;
    let server = TestServer::start(config).await;
    let sim = server.app.simulator("sim").expect("an embedded simulator");
    let (status, reply) = http(
        sim.addr(),
        "POST",
        "/tbt/control",
        &[("Content-Type", "application/json")],
        r#"{"pause":true}"#,
    )
    .await
    .unwrap();
    assert_eq!(status, 403, "{reply}");
    assert!(!sim.tbt().is_paused());
    // and its address is not disclosed
    let sources = server.get_json("/api/v1/ops/sources").await;
    assert!(sources["sources"][0]["rest_base"].is_null(), "{sources}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_tick_by_tick_feed_reports_its_books_stale() {
    let mut config = test_config(vec![embedded_sim_source(1.0)]);
    config.l3.feed_stale_after_ms = 500;
    let server = TestServer::start(config).await;
    let tbt = server.app.simulator("sim").expect("an embedded simulator").tbt();
    let all_synced = || async {
        let h = books_health(&server.get_json("/api/v1/ops/books").await);
        (h.len() == 40 && h.iter().all(|(_, s)| s == "synced")).then_some(())
    };
    eventually("the 40 tick-by-tick books synced", all_synced).await;

    tbt.pause(true);
    let stale = eventually("every tick-by-tick book stale while the feed is paused", || async {
        let h = books_health(&server.get_json("/api/v1/ops/books").await);
        h.iter().all(|(_, s)| s == "stale").then_some(h)
    })
    .await;
    assert_eq!(stale.len(), 40);
    // and the REST snapshot says so too
    let r = server.get_json("/fapi/v1/depth?symbol=sim:stock:600000").await;
    assert_eq!(r["health"], "stale", "{r}");
    // it stays stale while paused
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let h = books_health(&server.get_json("/api/v1/ops/books").await);
    assert!(h.iter().all(|(_, s)| s == "stale"), "{h:?}");
    let shards = server.get_json("/api/v1/ops/shards").await;
    let silences = shards["sources"][0]["silences"].as_u64();
    assert_eq!(silences, Some(1), "{}", shards["sources"]);

    tbt.pause(false);
    eventually("the books synced again once events flow", all_synced).await;
    server.stop().await;
}
