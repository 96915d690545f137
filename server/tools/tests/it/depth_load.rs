//! The depth fan-out load tool end to end, small: `millrace-depth-load` against a real server's
//! tick-by-tick books with 80 seed-algorithm clients for 2 s; it must find every client synced and
//! none behind. The figures at full size (2,000 clients) are in BENCHMARKS.md.

use std::process::Command;

use testkit::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_depth_load_tool_runs_clean_against_a_server() {
    let server = TestServer::start(test_config(vec![embedded_sim_source(1.0)])).await;
    // the 40 tick-by-tick books are registered once the feed connected
    eventually("40 tick-by-tick books", || async {
        let books = server.get_json("/api/v1/ops/books").await;
        let n = books["books"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| b["source"].as_str().unwrap().starts_with("l3_"))
            .count();
        (n == 40).then_some(())
    })
    .await;
    let addr = server.addr.to_string();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_millrace-depth-load"))
            .args(["--addr", &addr, "--clients", "80", "--duration", "2"])
            .output()
            .expect("millrace-depth-load runs")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["synced"], 80, "{report}");
    assert_eq!(report["fell_behind"], 0, "{report}");
    assert_eq!(report["books"], 40, "{report}");
    assert!(report["deltas"].as_u64().unwrap() > 80, "{report}");
    server.stop().await;
}
