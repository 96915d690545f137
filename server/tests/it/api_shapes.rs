//! One source of truth for API shapes: every answer of every `/api/v1/*` endpoint (and the
//! order-book snapshot, the health check and the admin actions) of a running server is read back
//! into the `shared` type the dashboard reads it with, and written again: the JSON must come back
//! identical. A field renamed, added or dropped on the server's side only (or a type changed)
//! fails here, and a field renamed in `shared` fails to compile on both sides at once.
//!
//! The list of GET endpoints is checked against the router's source, so a new endpoint cannot
//! be added without its shape being checked here.

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use shared::protocol::ops::{
    ApiErrorBody, AutoBalanceReply, BackfillReport, BooksReport, Catalog, Health, HotspotReply,
    InstrumentReply, JobsReport, KlineRow, MigrateReply, RecordingReport, SeriesReply,
    ShardsReport, SourcesReport, TradesReport, VersionInfo,
};
use shared::protocol::RestDepthResponse;
use testkit::*;

/// `body` (JSON) read as `T` and written again must be `body` itself.
fn round_trip<T: DeserializeOwned + Serialize>(what: &str, body: &str) -> T {
    let original: Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {body}"));
    let typed: T = serde_json::from_value(original.clone()).unwrap_or_else(|e| {
        panic!("{what}: does not read as {}: {e}\n{body}", std::any::type_name::<T>())
    });
    let again = serde_json::to_value(&typed).unwrap();
    assert_eq!(
        again, original,
        "{what}: a field the shared type does not know (or reads differently)"
    );
    typed
}

/// The GET routes of `server/src/http/{mod,api}.rs`, as written in the source.
fn get_routes_in_source() -> Vec<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/http");
    let mut routes = Vec::new();
    for file in ["mod.rs", "api.rs"] {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        for line in text.lines().filter(|l| l.contains(".route(\"") && l.contains("get(")) {
            let path = line.split('"').nth(1).unwrap().to_string();
            routes.push(path);
        }
    }
    routes.sort();
    routes
}

/// Checks one endpoint's answer.
type Check = Box<dyn Fn(&str)>;

const TOKEN: &str = "shapes-test-token";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_reads_back_into_its_shared_type() {
    let mut config = busy_config();
    config.server.admin_token = Some(TOKEN.into());
    let server = TestServer::start(config).await;
    // Wait until every report has something in it: a stored candle, a synced depth book, the
    // tick-by-tick books, a backfill run.
    eventually("stored candles, a depth book and the tick-by-tick books", || async {
        let catalog: Catalog = serde_json::from_str(&server.get("/api/v1/series").await.1).ok()?;
        let books: BooksReport =
            serde_json::from_str(&server.get("/api/v1/ops/books").await.1).ok()?;
        let depth_synced = books.books.iter().any(|b| b.source == "binance_depth" && b.id > 0);
        let l3 = books.books.iter().filter(|b| b.source.starts_with("l3_")).count();
        (!catalog.stored.is_empty() && depth_synced && l3 == 40).then_some(())
    })
    .await;

    let checked: Vec<(&str, Check)> = vec![
        (
            "/api/v1/version",
            Box::new(|b| {
                round_trip::<VersionInfo>("version", b);
            }),
        ),
        (
            "/healthz",
            Box::new(|b| {
                round_trip::<Health>("healthz", b);
            }),
        ),
        (
            "/api/v1/series",
            Box::new(|b| {
                let c: Catalog = round_trip("series", b);
                assert!(c.instruments.len() >= 8 && !c.stored.is_empty(), "{b}");
            }),
        ),
        (
            "/api/v1/klines?series=sim:spot:BTC/USDT:1m&limit=50",
            Box::new(|b| assert!(!round_trip::<Vec<KlineRow>>("klines", b).is_empty())),
        ),
        (
            "/api/v1/ops/jobs",
            Box::new(|b| {
                let j: JobsReport = round_trip("ops/jobs", b);
                assert!(!j.jobs.is_empty() && !j.depth.jobs.is_empty(), "{b}");
                assert!(j.depth.jobs.iter().all(|d| d.depth.is_some()), "{b}");
            }),
        ),
        (
            "/api/v1/ops/backfill",
            Box::new(|b| {
                assert_eq!(round_trip::<BackfillReport>("ops/backfill", b).tasks.len(), 1)
            }),
        ),
        (
            "/api/v1/ops/books",
            Box::new(|b| {
                round_trip::<BooksReport>("ops/books", b);
            }),
        ),
        (
            "/api/v1/ops/shards",
            Box::new(|b| {
                let s: ShardsReport = round_trip("ops/shards", b);
                assert_eq!(s.engine.symbols.len(), 40, "{b}");
                assert!(
                    s.engine.symbols.iter().all(|x| x.hot.is_some()),
                    "simulated symbols carry `hot`: {b}"
                );
            }),
        ),
        (
            // no `[record]` here: off, and says so
            "/api/v1/ops/recording",
            Box::new(|b| assert!(!round_trip::<RecordingReport>("ops/recording", b).enabled)),
        ),
        (
            "/api/v1/ops/sources",
            Box::new(|b| assert!(round_trip::<SourcesReport>("ops/sources", b).sources[0].ready)),
        ),
        (
            // the pinned ETH book's job runs its aggTrade stream beside it
            "/api/v1/trades?instrument=sim:spot:ETH/USDT&limit=5",
            Box::new(|b| {
                let t: TradesReport = round_trip("trades", b);
                assert_eq!(t.instrument.to_string(), "sim:spot:ETH/USDT", "{b}");
            }),
        ),
        (
            "/fapi/v1/depth?symbol=sim:spot:ETH/USDT&with_id=true&limit=20",
            Box::new(|b| assert!(round_trip::<RestDepthResponse>("depth", b).data.id > 0)),
        ),
    ];
    for (path, check) in &checked {
        let (status, body) = server.get(path).await;
        assert_eq!(status, 200, "GET {path}: {body}");
        check(&body);
    }
    // `/ws`, `/metrics` and the exports are not JSON: the WebSocket protocol is tested in
    // http_ws.rs, the metrics text in api.rs. Every other GET route is checked above.
    let mut covered: Vec<String> =
        checked.iter().map(|(p, _)| p.split('?').next().unwrap().to_string()).collect();
    covered.extend(["/ws".to_string(), "/metrics".to_string()]);
    // exports are files (Parquet, CSV), read back by pyarrow in export.rs (candles) and
    // playback.rs (trades, from a recording); with no recording here trades are the error shape
    covered.push("/api/v1/export/candles".to_string());
    let (status, body) = server.get("/api/v1/export/trades?instrument=sim:spot:BTC/USDT").await;
    assert_eq!(status, 404, "{body}");
    round_trip::<ApiErrorBody>("export/trades", &body);
    covered.push("/api/v1/export/trades".to_string());
    // `/api/v1/ops/cluster` answers on a gateway only (its `ClusterReport` is read back in
    // cluster_workers.rs); here it is the error shape.
    let (status, body) = server.get("/api/v1/ops/cluster").await;
    assert_eq!(status, 404, "{body}");
    round_trip::<ApiErrorBody>("ops/cluster", &body);
    covered.push("/api/v1/ops/cluster".to_string());
    // `/api/v1/replay` is NDJSON of `ReplayLine`, read back line by line in playback.rs; with
    // no recording here it is the error shape
    let (status, body) = server.get("/api/v1/replay?source=sim").await;
    assert_eq!(status, 404, "{body}");
    round_trip::<ApiErrorBody>("replay", &body);
    covered.push("/api/v1/replay".to_string());
    covered.sort();
    assert_eq!(covered, get_routes_in_source(), "a GET route without a shape check");

    // Errors have one shape.
    for path in [
        "/api/v1/klines?series=nope",
        "/fapi/v1/depth?symbol=sim:spot:NOPE/USDT",
        "/api/v1/klines?limit=x",
    ] {
        let (status, body) = server.get(path).await;
        assert!((400..500).contains(&status), "{path}: {status}");
        round_trip::<ApiErrorBody>(path, &body);
    }

    // The admin actions answer with their types (and refuse with the error shape).
    let auth =
        [("Authorization", &*format!("Bearer {TOKEN}")), ("Content-Type", "application/json")];
    let addr = server.addr;
    let post = |path: &'static str, body: &'static str| async move {
        http(addr, "POST", path, &auth, body).await.unwrap()
    };
    let (s, b) = post("/api/v1/admin/shards/auto_balance", r#"{"on":false}"#).await;
    assert_eq!(s, 200, "{b}");
    round_trip::<AutoBalanceReply>("auto_balance", &b);
    let (s, b) =
        post("/api/v1/admin/shards/migrate", r#"{"symbol":"sim:stock:600000","target":-1}"#).await;
    assert_eq!(s, 200, "{b}");
    round_trip::<MigrateReply>("migrate", &b);
    let (s, b) = post("/api/v1/admin/sim/hotspot", r#"{"symbol":"600000","hot":false}"#).await;
    assert_eq!(s, 200, "{b}");
    round_trip::<HotspotReply>("hotspot", &b);
    let (s, b) = post("/api/v1/admin/backfill/stop", r#"{"series":"sim:spot:BTC/USDT:1m"}"#).await;
    assert_eq!(s, 200, "{b}");
    round_trip::<SeriesReply>("backfill/stop", &b);
    let (s, b) = post("/api/v1/admin/backfill/start", r#"{"series":"sim:spot:BTC/USDT:1m"}"#).await;
    assert_eq!(s, 200, "{b}");
    round_trip::<SeriesReply>("backfill/start", &b);
    let (s, b) = post("/api/v1/admin/jobs/stop", r#"{"instrument":"sim:spot:BTC/USDT"}"#).await;
    assert_eq!(s, 200, "{b}");
    round_trip::<InstrumentReply>("jobs/stop", &b);
    let (s, b) = post("/api/v1/admin/jobs/stop", r#"{"instrument":"sim:spot:NOPE/USDT"}"#).await;
    assert_eq!(s, 404, "{b}");
    round_trip::<ApiErrorBody>("jobs/stop refused", &b);
    server.stop().await;
}
