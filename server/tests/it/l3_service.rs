//! Tick-by-tick books in the running service, over real sockets: the embedded simulator's 40
//! stocks stream over `/tbt/ws` into the sharded engine; books are published on `depth_update@…`
//! and `GET /fapi/v1/depth`. Checked against the simulator's **true** books (kept by the
//! simulator's own matching, independently of `shared::l3`) at checkpoints where the generator is
//! paused, through hot spots, manual migrations (to a shard, to a new shard, chains), automatic
//! balancing and injected sequence gaps (recovered from snapshots). A client following the seed's
//! algorithm over a real WebSocket stays in sync throughout and equals the true book at the end.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use shared::protocol::{PushData, RestDepthResponse, ServerFrame};
use shared::sync::{BookSync, ContinuityRule, DepthSnapshot, SyncConfig, SyncEvent};
use sim::tbt::TbtHandle;
use testkit::*;
use tokio_tungstenite::tungstenite::Message;

const TOKEN: &str = "l3-service-test-token";

fn tbt(server: &TestServer) -> TbtHandle {
    server.app.simulator("sim").expect("an embedded simulator").tbt()
}

async fn admin(server: &TestServer, path: &str, body: serde_json::Value) -> (u16, String) {
    let auth = format!("Bearer {TOKEN}");
    http(
        server.addr,
        "POST",
        path,
        &[("Authorization", &auth), ("Content-Type", "application/json")],
        &body.to_string(),
    )
    .await
    .unwrap()
}

/// Pauses the generator and waits until every published book equals the simulator's true book
/// (the engine drained and published); resumes the generator. Returns how many books compared.
async fn checkpoint(server: &TestServer, what: &str) -> usize {
    let sim = tbt(server);
    sim.pause(true);
    let deadline = Instant::now() + Duration::from_secs(30);
    let symbols = sim.symbols();
    let mut last_diff = String::new();
    loop {
        let mut equal = 0;
        for s in &symbols {
            let truth = sim.book(&s.symbol, 5000).unwrap();
            let path =
                format!("/fapi/v1/depth?symbol=sim:stock:{}&with_id=true&limit=5000", s.symbol);
            let (status, body) = server.get(&path).await;
            if status != 200 {
                last_diff = format!("{}: {status} {body}", s.symbol);
                break;
            }
            let r: RestDepthResponse = serde_json::from_str(&body).unwrap();
            if r.data.bids == truth.bids && r.data.asks == truth.asks {
                equal += 1;
            } else {
                last_diff = format!(
                    "{} (true seq {}): published book differs:\n true {:?} / {:?}\n published {:?} / {:?}\n ops {}",
                    s.symbol,
                    truth.seq,
                    &truth.bids[..truth.bids.len().min(5)],
                    &truth.asks[..truth.asks.len().min(5)],
                    &r.data.bids[..r.data.bids.len().min(5)],
                    &r.data.asks[..r.data.asks.len().min(5)],
                    server.app.l3().here().unwrap().handle.stats().symbols.iter().find(|x| x.instrument.symbol == s.symbol).map(|x| format!("{x:?}")).unwrap_or_default()
                );
                break;
            }
        }
        if equal == symbols.len() {
            sim.pause(false);
            return equal;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: books never matched the simulator's: {last_diff}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A client following the seed's algorithm (the shared sync machine, spot rule, checksums) over
/// `/ws` + REST; resyncs on a gap like the seed says. Returns its sync machine.
pub struct SeedClient {
    ws: Ws,
    pub sync: BookSync,
    stream: String,
    pub deltas: u64,
    pub problems: Vec<String>,
}

impl SeedClient {
    async fn start(server: &TestServer, symbol: &str) -> SeedClient {
        Self::start_instrument(server, &format!("sim:stock:{symbol}")).await
    }

    pub async fn start_instrument(server: &TestServer, instrument: &str) -> SeedClient {
        let stream = format!("depth_update@{instrument}");
        let mut ws = server.ws().await;
        assert!(request(&mut ws, "SUBSCRIBE", &[&stream], 1).await.is_ok());
        let path = format!("/fapi/v1/depth?symbol={instrument}&with_id=true");
        let r: RestDepthResponse = serde_json::from_value(server.get_json(&path).await).unwrap();
        let mut config = SyncConfig::new(ContinuityRule::Spot);
        config.verify_interval_ms = None;
        let mut sync = BookSync::new(config);
        sync.handle_snapshot(DepthSnapshot::from(&r.data), 0);
        SeedClient { ws, sync, stream, deltas: 0, problems: Vec::new() }
    }

    /// Applies whatever arrived within `for_ms`.
    pub async fn pump(&mut self, for_ms: u64) {
        let end = tokio::time::Instant::now() + Duration::from_millis(for_ms);
        while let Ok(Some(msg)) = tokio::time::timeout_at(end, self.ws.next()).await {
            let Ok(Message::Text(text)) = msg else { continue };
            let Ok(ServerFrame::Push(push)) = serde_json::from_str::<ServerFrame>(&text) else {
                continue;
            };
            if push.stream.to_string() != self.stream {
                continue;
            }
            let PushData::DepthUpdate(ev) = push.data else {
                panic!("a {} push on {}", push.data.kind(), self.stream)
            };
            self.deltas += 1;
            self.sync.handle_delta((&ev).into(), 0);
            while let Some(e) = self.sync.poll_event() {
                if matches!(
                    e,
                    SyncEvent::GapDetected { .. }
                        | SyncEvent::ChecksumMismatch { .. }
                        | SyncEvent::Crossed { .. }
                ) {
                    self.problems.push(format!("{e:?}"));
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn books_equal_the_simulators_through_hot_spots_migrations_and_gaps() {
    let mut config = test_config(vec![embedded_sim_source(1.0)]);
    config.server.admin_token = Some(TOKEN.into());
    config.l3.engine.shards = 2;
    config.l3.engine.max_shards = 6;
    config.l3.engine.auto_balance = false;
    let server = TestServer::start(config).await;
    let sim = tbt(&server);
    tokio::time::sleep(Duration::from_secs(2)).await;

    // 1. plain trading
    assert_eq!(checkpoint(&server, "plain").await, 40);

    // The seed's client watches a symbol that will be hot, dropped and migrated.
    let mut client = SeedClient::start(&server, "600002").await;
    client.pump(1000).await;

    // 2. hot spots and manual migrations, including a chain A -> B -> new -> back
    for (symbol, hot) in [("600002", true), ("000003", true)] {
        let (status, body) = admin(
            &server,
            "/api/v1/admin/sim/hotspot",
            serde_json::json!({"symbol": symbol, "hot": hot}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    client.pump(1500).await;
    // the operations API reports the simulator's hot spots (the dashboard's toggles show them)
    let shards = server.get_json("/api/v1/ops/shards").await;
    let hot: Vec<(String, bool)> = shards["engine"]["symbols"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["instrument"].as_str().unwrap().to_string(),
                s["hot"].as_bool().expect("every simulated symbol says whether it is hot"),
            )
        })
        .collect();
    assert_eq!(hot.len(), 40);
    let hot_ones: Vec<&str> = hot.iter().filter(|(_, h)| *h).map(|(i, _)| i.as_str()).collect();
    assert_eq!(hot_ones, ["sim:stock:600002", "sim:stock:000003"]);
    let shard_of = |symbol: &str| {
        let symbol = format!("sim:stock:{symbol}");
        let stats = server.app.l3().here().unwrap().handle.stats();
        stats.symbols.iter().find(|s| s.instrument.to_string() == symbol).map(|s| s.shard).unwrap()
    };
    let start = shard_of("600002");
    let other = 1 - start as i64;
    for target in [other, -1, -1, start as i64] {
        let (status, body) = admin(
            &server,
            "/api/v1/admin/shards/migrate",
            serde_json::json!({"symbol": "600002", "target": target}),
        )
        .await;
        assert_eq!(status, 200, "migrate to {target}: {body}");
        client.pump(400).await;
    }
    let (status, body) = admin(
        &server,
        "/api/v1/admin/shards/migrate",
        serde_json::json!({"symbol": "nope", "target": 0}),
    )
    .await;
    assert_eq!(status, 404, "{body}");
    client.pump(1000).await;
    assert_eq!(checkpoint(&server, "after hot spots and migrations").await, 40);
    let stats = server.app.l3().here().unwrap().handle.stats();
    assert!(stats.migrations.completed >= 4, "{:?}", stats.migrations);
    assert_eq!(shard_of("600002"), start, "the chain ended where it began");
    assert!(stats.shards.len() >= 4, "two new shards were created");

    // 3. sequence gaps on the wire: the books go stale, recover from snapshots, equal again
    for symbol in ["600002", "000001", "600010"] {
        sim.drop_events(symbol, 5).unwrap();
    }
    client.pump(3000).await;
    assert_eq!(checkpoint(&server, "after gaps").await, 40);
    let stats = server.app.l3().here().unwrap().handle.stats();
    let gaps: u64 = stats.symbols.iter().map(|s| s.gaps).sum();
    let resets: u64 = stats.symbols.iter().map(|s| s.resets).sum();
    assert!(gaps >= 3 && resets >= 3, "gaps {gaps}, resets {resets}");
    let shards = server.get_json("/api/v1/ops/shards").await;
    assert!(shards["sources"][0]["recoveries"].as_u64().unwrap() >= 3, "{}", shards["sources"]);

    // 4. automatic balancing on, hot spots still on: books stay equal
    let (status, _) =
        admin(&server, "/api/v1/admin/shards/auto_balance", serde_json::json!({"on": true})).await;
    assert_eq!(status, 200);
    client.pump(3000).await;
    assert_eq!(checkpoint(&server, "with auto-balance").await, 40);

    // The seed client: never a gap or checksum mismatch, equal to the truth when paused.
    sim.pause(true);
    tokio::time::sleep(Duration::from_millis(300)).await;
    client.pump(700).await;
    assert!(client.problems.is_empty(), "{:?}", client.problems);
    assert!(client.sync.is_synced());
    assert!(client.deltas > 50, "deltas {}", client.deltas);
    let truth = sim.book("600002", 5000).unwrap();
    assert_eq!(client.sync.book().top(5000), (truth.bids, truth.asks));
    sim.pause(false);

    // A crossed book is never published. Shanghai books never cross in continuous trading (an
    // aggressive order is published only for the part that rests); a Shenzhen aggressive order is
    // published in full before its trades, so a publish tick between the two finds the book
    // crossed for a moment and skips it.
    let books = server.get_json("/api/v1/ops/books").await;
    for b in books["books"].as_array().unwrap() {
        if b["source"] == "l3_sse" {
            assert_eq!(b["crossed_skipped"], 0, "{b}");
        }
    }
    server.stop().await;
}

/// Minutes of simulated trading with faults injected all along (tick-by-tick gaps, hot spots,
/// migrations, and Binance-side skips, reconnects and failing snapshots): clients following the
/// seed's algorithm over real WebSockets never see a gap or checksum mismatch, and end equal to the
/// server's book at the same update id (and, for the tick-by-tick books, to the simulator's true
/// book). `MILLRACE_SOAK_SECS` sets the length (default 120).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_clients_stay_in_sync_over_minutes_of_faults() {
    let secs: u64 =
        std::env::var("MILLRACE_SOAK_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(120);
    let mut config = test_config(vec![embedded_sim_source(1.0)]);
    config.server.admin_token = Some(TOKEN.into());
    config.depth.pinned = vec!["sim:spot:BTC/USDT".into()];
    config.l3.engine.shards = 2;
    config.l3.engine.max_shards = 8;
    config.l3.engine.auto_balance = true;
    let server = TestServer::start(config).await;
    let sim_handle = server.app.simulator("sim").cloned().expect("an embedded simulator");
    let sim = sim_handle.tbt();
    tokio::time::sleep(Duration::from_secs(2)).await;

    let instruments = ["sim:stock:600004", "sim:stock:000005", "sim:spot:BTC/USDT"];
    let mut clients = Vec::new();
    for i in instruments {
        clients.push(SeedClient::start_instrument(&server, i).await);
    }
    let end = Instant::now() + Duration::from_secs(secs);
    let mut round = 0u32;
    while Instant::now() < end {
        round += 1;
        match round % 6 {
            0 => {
                sim.drop_events("600004", 3).unwrap();
                sim.drop_events("000005", 7).unwrap();
            }
            1 => {
                let hot = round % 12 == 1;
                admin(
                    &server,
                    "/api/v1/admin/sim/hotspot",
                    serde_json::json!({"symbol": "600004", "hot": hot}),
                )
                .await;
            }
            2 => {
                let target = if round % 4 == 0 { -1 } else { 0 };
                // refused when already there: fine, the next round moves it
                admin(
                    &server,
                    "/api/v1/admin/shards/migrate",
                    serde_json::json!({"symbol": "000005", "target": target}),
                )
                .await;
            }
            3 => {
                use sim::faults::{StreamClass, StreamTarget};
                sim_handle
                    .faults()
                    .skip(StreamTarget::kind(StreamClass::Depth).for_symbol("btcusdt"), 2);
            }
            4 => {
                sim_handle.faults().drop_connections(Some("btcusdt"));
            }
            _ => {
                sim_handle.faults().fail_rest(2, 500, Some("/api/v3/depth"), None);
            }
        }
        for c in clients.iter_mut() {
            c.pump(300).await;
        }
    }
    // Quiet down: no more faults, tick-by-tick generator paused.
    admin(
        &server,
        "/api/v1/admin/sim/hotspot",
        serde_json::json!({"symbol": "600004", "hot": false}),
    )
    .await;
    for c in clients.iter_mut() {
        c.pump(1500).await;
    }
    sim.pause(true);
    for c in clients.iter_mut() {
        c.pump(1500).await;
    }
    for (c, instrument) in clients.iter_mut().zip(instruments) {
        assert!(c.problems.is_empty(), "{instrument}: {:?}", c.problems);
        assert!(c.sync.is_synced(), "{instrument}: {:?}", c.sync.state());
        assert!(c.deltas > secs, "{instrument}: only {} deltas", c.deltas);
        // equal to the server's book at the same update id
        let path = format!("/fapi/v1/depth?symbol={instrument}&with_id=true&limit=5000");
        let mut matched = false;
        for _ in 0..50 {
            let r: RestDepthResponse =
                serde_json::from_value(server.get_json(&path).await).unwrap();
            if r.data.id == c.sync.last_update_id() {
                assert_eq!(c.sync.book().top(5000), (r.data.bids, r.data.asks), "{instrument}");
                matched = true;
                break;
            }
            c.pump(100).await;
        }
        assert!(matched, "{instrument}: REST never reached the client's update id");
        if let Some(code) = instrument.strip_prefix("sim:stock:") {
            let truth = sim.book(code, 5000).unwrap();
            assert_eq!(
                c.sync.book().top(5000),
                (truth.bids, truth.asks),
                "{instrument} vs the simulator"
            );
        }
    }
    let shards = server.get_json("/api/v1/ops/shards").await;
    assert!(shards["sources"][0]["recoveries"].as_u64().unwrap() >= 2, "{}", shards["sources"]);
    let jobs = server.get_json("/api/v1/ops/jobs").await;
    assert!(jobs["depth"]["jobs"][0]["depth"].is_object(), "{}", jobs["depth"]);
    sim.pause(false);
    server.stop().await;
}
