//! `RUST_LOG=info millrace` says which job crashed and which session a line belongs to: the
//! real binary's log, read from its stderr, while the exchange drops every connection.

use std::time::Duration;

use shared::protocol::ops::JobsReport;
use testkit::*;

fn log_lines(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(str::to_owned).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_and_session_log_lines_carry_their_instrument_and_session() {
    let sim = start_sim(60.0, 41).await;
    let mut config = test_config(vec![external_sim_source(&sim)]);
    config.ingest.pinned = vec!["sim:spot:BTC/USDT".into()];
    config.depth.pinned = vec!["sim:spot:ETH/USDT".into()];
    std::fs::create_dir_all(&config.server.data_dir).unwrap();
    let log_path = config.server.data_dir.join("millrace.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let child = ChildServer::start_logging(&config, "info,server::http=debug", log.into()).await;

    // Both jobs run, then the exchange drops every connection: each job's crash is logged
    // inside its span.
    eventually("both jobs running", || async {
        let jobs: JobsReport =
            serde_json::from_value(child.get_json("/api/v1/ops/jobs").await).unwrap();
        (!jobs.jobs.is_empty() && !jobs.depth.jobs.is_empty()).then_some(())
    })
    .await;
    let mut ws = {
        let url = format!("ws://{}/ws", child.addr);
        tokio_tungstenite::connect_async(url).await.unwrap().0
    };
    let reply = request(&mut ws, "SUBSCRIBE", &["kline@sim:spot:BTC/USDT:1m"], 1).await;
    assert!(reply.error.is_none(), "{reply:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(sim.faults().drop_connections(None) >= 1);

    let crashed = |kind: &str, instrument: &str| {
        let span = format!("job{{kind=\"{kind}\" instrument={instrument}}}");
        log_lines(&log_path).into_iter().find(|l| l.contains(&span) && l.contains("job crashed"))
    };
    let (kline, depth) = eventually("both crashes logged in their job's span", || async {
        Some((crashed("kline", "sim:spot:BTC/USDT")?, crashed("depth", "sim:spot:ETH/USDT")?))
    })
    .await;
    assert!(kline.contains("WARN"), "{kline}");
    assert!(depth.contains("WARN"), "{depth}");

    let subscribed = log_lines(&log_path)
        .into_iter()
        .find(|l| l.contains("subscribed") && l.contains("stream=kline@sim:spot:BTC/USDT:1m"))
        .unwrap_or_else(|| {
            panic!("the session's subscribe is logged: {:#?}", log_lines(&log_path))
        });
    assert!(subscribed.contains("session{id="), "the line names its session: {subscribed}");
    assert!(subscribed.contains("peer=127.0.0.1:"), "and its peer: {subscribed}");

    drop(ws);
    child.terminate();
    sim.shutdown();
}
