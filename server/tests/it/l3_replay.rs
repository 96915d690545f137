//! The Shanghai tick-by-tick files (testdata/sse-tick-by-tick, real SSE data) replayed into
//! the running service's sharded engine at 3600x the original pace, with the books migrated between
//! shards while the day plays: the published books end equal to single-threaded processing of the
//! same rows, and to the `millrace replay sse` tool's books.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use server::config::ReplaySourceConfig;
use shared::l3::{L3Book, SeqPolicy, Venue};
use shared::protocol::RestDepthResponse;
use shared::Price;
use testkit::*;

const TOKEN: &str = "l3-replay-test-token";

fn data() -> PathBuf {
    replay::input::testdata_dir().join("sse-tick-by-tick")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_shanghai_day_ends_equal_to_single_threaded_processing() {
    let (orders, trades) = (data().join("SHorders.zip"), data().join("SHtrans.zip"));
    let mut config = test_config(vec![embedded_sim_source(1.0)]);
    config.server.admin_token = Some(TOKEN.into());
    config.l3.sim_feeds = false;
    config.l3.engine.shards = 2;
    config.l3.engine.auto_balance = false;
    config.l3.replay = vec![ReplaySourceConfig {
        name: "sse".into(),
        orders: orders.clone(),
        trades: trades.clone(),
        speed: 3600.0,
        ..ReplaySourceConfig::default()
    }];
    let server = TestServer::start(config).await;
    let auth = format!("Bearer {TOKEN}");

    // move books around while the day plays: to the other shard, to new shards, back
    let mut moves = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let shards = server.get_json("/api/v1/ops/shards").await;
        let done = shards["sources"][0]["replay_done"].as_bool().unwrap();
        if done {
            break;
        }
        assert!(Instant::now() < deadline, "the replay did not finish: {}", shards["sources"]);
        let symbols = shards["engine"]["symbols"].as_array().unwrap().clone();
        if let Some(s) = symbols.get(moves % symbols.len().max(1)) {
            let target = if moves % 3 == 2 { -1 } else { 1 - s["shard"].as_i64().unwrap().min(1) };
            let body = serde_json::json!({"symbol": s["instrument"], "target": target}).to_string();
            let (status, reply) = http(
                server.addr,
                "POST",
                "/api/v1/admin/shards/migrate",
                &[("Authorization", &auth)],
                &body,
            )
            .await
            .unwrap();
            assert!(status == 200 || status == 400, "{status} {reply}");
            moves += usize::from(status == 200);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(moves >= 5, "only {moves} migrations during the replay");

    // the oracle: the same rows through one L3Book per symbol, on this thread
    let loaded = replay::sse::load(&orders, &trades, Price::parse("0.01").unwrap()).unwrap();
    let mut books: Vec<L3Book> = loaded
        .symbols
        .iter()
        .map(|_| L3Book::new(Venue::Sse).with_seq_policy(SeqPolicy::Increasing))
        .collect();
    for e in &loaded.events {
        books[e.symbol as usize].handle(e.channel, e.seq, e.msg).unwrap();
    }
    let args =
        replay::sse::SseArgs { orders, trades, tick: Price::parse("0.01").unwrap(), subset: true };
    let reports = replay::sse::replay(&args).unwrap();

    for (code, book) in loaded.symbols.iter().zip(&books) {
        assert!(!book.is_crossed(), "{code}: the day ends uncrossed");
        let expected = book.top(5000);
        let path = format!("/fapi/v1/depth?symbol=sse:stock:{code}&with_id=true&limit=5000");
        let got = eventually(&format!("{code} published as processed single-threaded"), || async {
            let r: RestDepthResponse =
                serde_json::from_value(server.get_json(&path).await).unwrap();
            ((r.data.bids.clone(), r.data.asks.clone()) == expected).then_some(r)
        })
        .await;
        let report = reports.iter().find(|r| &r.symbol == code).unwrap();
        assert_eq!(
            got.data.bids[..report.top5.bids.len()],
            report.top5.bids[..],
            "{code} vs replay sse"
        );
        assert_eq!(
            got.data.asks[..report.top5.asks.len()],
            report.top5.asks[..],
            "{code} vs replay sse"
        );
    }
    let stats = server.app.l3().here().unwrap().handle.stats();
    assert!(stats.migrations.completed >= 5, "{:?}", stats.migrations);
    assert_eq!(stats.symbols.iter().map(|s| s.gaps).sum::<u64>(), 0);
    server.stop().await;
}
