//! The browser API over real sockets: kline pushes, publish-after-persist, REST klines and its
//! errors, limits, operations endpoints, admin authorization, metrics.

use std::collections::BTreeMap;

use shared::protocol::{ErrorCode, KlineEvent, Push, PushData, ServerFrame};
use testkit::*;

/// Waits for the next kline push.
async fn next_kline(ws: &mut Ws) -> KlineEvent {
    loop {
        match next_frame(ws).await {
            ServerFrame::Push(Push { data: PushData::Kline(ev), .. }) => return ev,
            _ => continue,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_candles_are_stored_before_any_client_sees_them() {
    stored_before_seen(|_| {}).await;
}

/// Pushes of closed candles, checked against the REST API the moment they arrive, on the
/// backends `backends` configures (the defaults, or PostgreSQL and NATS).
pub(crate) async fn stored_before_seen(backends: impl FnOnce(&mut server::config::Config)) {
    // 600x: a simulated minute every 100 ms.
    let mut config = test_config(vec![embedded_sim_source(600.0)]);
    config.ingest.flush_ms = 50;
    backends(&mut config);
    let server = TestServer::start(config).await;
    let mut ws = server.ws().await;
    let r = request(
        &mut ws,
        "SUBSCRIBE",
        &["kline@sim:spot:BTC/USDT:1m", "kline@sim:spot:BTC/USDT:5m"],
        1,
    )
    .await;
    assert!(r.is_ok(), "{r:?}");
    let mut closed_1m = 0;
    let mut closed_5m = 0;
    let mut forming = 0;
    while closed_1m < 12 || closed_5m < 1 || forming < 3 {
        let ev = next_kline(&mut ws).await;
        assert_eq!(ev.e, "kline");
        let series = ev.s.to_string();
        if !ev.k.x {
            forming += 1;
            continue;
        }
        // The moment a client sees a closed candle, the REST API already returns it.
        let path =
            format!("/api/v1/klines?series={series}&startTime={}&endTime={}", ev.k.t, ev.k.t);
        let rows = server.get_json(&path).await;
        let rows = rows.as_array().unwrap();
        assert_eq!(rows.len(), 1, "{series} {} not stored when published", ev.k.t);
        let row = rows[0].as_array().unwrap();
        assert_eq!(row[0], ev.k.t);
        assert_eq!(row[1], ev.k.o.to_string());
        assert_eq!(row[2], ev.k.h.to_string());
        assert_eq!(row[3], ev.k.l.to_string());
        assert_eq!(row[4], ev.k.c.to_string());
        assert_eq!(row[5], ev.k.v.to_string());
        assert_eq!(row[6], ev.k.close_time);
        assert_eq!(row[8], ev.k.n);
        match ev.k.i.name() {
            "1m" => closed_1m += 1,
            "5m" => closed_5m += 1,
            other => panic!("unexpected timeframe {other}"),
        }
    }
    // Unsubscribing stops the pushes.
    assert!(request(
        &mut ws,
        "UNSUBSCRIBE",
        &["kline@sim:spot:BTC/USDT:1m", "kline@sim:spot:BTC/USDT:5m"],
        2
    )
    .await
    .is_ok());
    let quiet = tokio::time::timeout(std::time::Duration::from_millis(600), async {
        loop {
            if let ServerFrame::Push(_) = next_frame(&mut ws).await {
                return;
            }
        }
    })
    .await;
    assert!(quiet.is_err(), "pushes after unsubscribing");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_klines_selection_and_errors() {
    let mut config = test_config(vec![embedded_sim_source(600.0)]);
    config.ingest.pinned = vec!["sim:spot:ETH/USDT".into()];
    let server = TestServer::start(config).await;
    let series = "sim:spot:ETH/USDT:1m";
    let rows = eventually("ten stored candles", || async {
        let rows = server.get_json(&format!("/api/v1/klines?series={series}&limit=1000")).await;
        (rows.as_array().unwrap().len() >= 10).then_some(rows)
    })
    .await;
    let times: Vec<i64> = rows.as_array().unwrap().iter().map(|r| r[0].as_i64().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[1] - w[0] == 60_000), "contiguous, oldest first: {times:?}");
    // startTime: oldest first from it; endTime only: the newest `limit` up to it.
    let from = server
        .get_json(&format!("/api/v1/klines?series={series}&startTime={}&limit=3", times[2]))
        .await;
    let got: Vec<i64> = from.as_array().unwrap().iter().map(|r| r[0].as_i64().unwrap()).collect();
    assert_eq!(got, times[2..5].to_vec());
    let upto = server
        .get_json(&format!("/api/v1/klines?series={series}&endTime={}&limit=2", times[6]))
        .await;
    let got: Vec<i64> = upto.as_array().unwrap().iter().map(|r| r[0].as_i64().unwrap()).collect();
    assert_eq!(got, times[5..7].to_vec());

    let cases: [(&str, &str); 7] = [
        ("/api/v1/klines", "malformed"),
        ("/api/v1/klines?series=BTCUSDT", "bad_stream"),
        ("/api/v1/klines?series=sim:spot:NOPE/USDT:1m", "unknown_series"),
        ("/api/v1/klines?series=sim:spot:ETH/USDT:1m&limit=0", "malformed"),
        ("/api/v1/klines?series=sim:spot:ETH/USDT:1m&limit=abc", "malformed"),
        ("/api/v1/klines?series=sim:spot:ETH/USDT:1m&startTime=10&endTime=5", "malformed"),
        ("/api/v1/klines?series=sim:spot:ETH/USDT:7m", "bad_stream"),
    ];
    for (path, code) in cases {
        let (status, body) = server.get(path).await;
        assert_eq!(status, 400, "{path}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["code"], code, "{path}: {body}");
        assert!(!v["msg"].as_str().unwrap().is_empty());
    }
    let metrics = server.get("/metrics").await.1;
    assert!(metrics.contains("millrace_http_bad_requests_total 7"), "{metrics}");

    let series_list = server.get_json("/api/v1/series").await;
    let ids: Vec<&str> = series_list["instruments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap())
        .collect();
    for want in ["sim:spot:BTC/USDT", "sim:spot:ETH/USDT", "sim:spot:DOGE/USDT"] {
        assert!(ids.contains(&want), "{ids:?}");
    }
    assert!(series_list["timeframes"].as_array().unwrap().iter().any(|t| t == "1h"));
    assert!(series_list["stored"].as_array().unwrap().iter().any(|s| s["series"] == series));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_protect_the_server() {
    let mut config = test_config(vec![embedded_sim_source(1.0)]);
    config.limits.max_subscriptions_per_connection = 3;
    config.limits.max_connections_per_ip = 2;
    config.limits.max_message_bytes = 1024;
    let server = TestServer::start(config).await;
    let mut a = server.ws().await;
    let r = request(
        &mut a,
        "SUBSCRIBE",
        &["heartbeat", "kline@sim:spot:BTC/USDT:1m", "kline@sim:spot:BTC/USDT:5m"],
        1,
    )
    .await;
    assert!(r.is_ok(), "{r:?}");
    let r = request(&mut a, "SUBSCRIBE", &["kline@sim:spot:BTC/USDT:15m"], 2).await;
    assert_eq!(r.error.unwrap().code, ErrorCode::TooManySubscriptions);
    // Re-subscribing to what it already has is not a new subscription.
    assert!(request(&mut a, "SUBSCRIBE", &["kline@sim:spot:BTC/USDT:5m"], 3).await.is_ok());
    let big = format!(r#"{{"method":"SUBSCRIBE","params":["{}"],"id":4}}"#, "x".repeat(2000));
    send(&mut a, &big).await;
    assert_eq!(reply(&mut a, 0).await.error.unwrap().code, ErrorCode::TooLarge);
    // A failed multi-stream request changes nothing.
    let r = request(&mut a, "UNSUBSCRIBE", &["kline@sim:spot:BTC/USDT:5m", "heartbeat"], 5).await;
    assert!(r.is_ok());
    let r = request(
        &mut a,
        "SUBSCRIBE",
        &["kline@sim:spot:BTC/USDT:15m", "kline@sim:spot:NOPE/USDT:1m"],
        6,
    )
    .await;
    assert_eq!(r.error.unwrap().code, ErrorCode::UnknownSeries);
    let jobs = server.get_json("/api/v1/ops/jobs").await;
    let btc = jobs["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["instrument"] == "sim:spot:BTC/USDT")
        .unwrap();
    assert_eq!(btc["refcount"], 1, "{btc}");

    // Connections per IP, counted at accept: the third is closed before any HTTP. The second
    // may have to wait until the server has seen the end of the `GET` above (the client can
    // read the server's close before the server's connection task has released its slot).
    let b = eventually("a second connection slot", || async {
        tokio_tungstenite::connect_async(format!("ws://{}/ws", server.addr)).await.ok()
    })
    .await;
    let third = tokio_tungstenite::connect_async(format!("ws://{}/ws", server.addr)).await;
    assert!(third.is_err(), "a third connection from one IP was served");
    drop(b);
    let metrics = eventually("a free connection slot", || async {
        testkit::http_get(server.addr, "/metrics").await.ok().filter(|(s, _)| *s == 200)
    })
    .await
    .1;
    // (1, or more if the poll above raced the release of `b`'s slot.)
    let refused = metrics
        .lines()
        .find_map(|l| l.strip_prefix("millrace_connections_refused_total{reason=\"per_ip\"} "))
        .and_then(|v| v.parse::<u64>().ok());
    assert!(refused >= Some(1), "{metrics}");
    drop(a);
    // The slot is released when a connection ends.
    let again = eventually("a free connection slot", || async {
        tokio_tungstenite::connect_async(format!("ws://{}/ws", server.addr)).await.ok()
    })
    .await;
    drop(again);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_endpoints_and_admin_token() {
    let mut config = test_config(vec![embedded_sim_source(60.0)]);
    config.ingest.pinned = vec!["sim:spot:BTC/USDT".into()];
    config.backfill = vec![server::config::BackfillTaskConfig {
        series: "sim:spot:BTC/USDT:1m".into(),
        retention_days: 1,
        batch_limit: 200,
        pause_ms: 0,
        ..Default::default()
    }];
    config.server.admin_token = Some("s3cret-token".into());
    let server = TestServer::start(config).await;

    // the embedded simulator's address is an admin's to know (its controls take the token)
    let sources = server.get_json("/api/v1/ops/sources").await;
    let sim = &sources["sources"][0];
    assert_eq!(sim["name"], "sim");
    assert_eq!(sim["embedded_simulator"], true);
    assert!(sim["rest_base"].is_null() && sim["ws_base"].is_null(), "{sim}");
    assert_eq!(sim["ready"], true);
    let (status, body) = http(
        server.addr,
        "GET",
        "/api/v1/ops/sources",
        &[("Authorization", "Bearer wrong-token!")],
        "",
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
    assert!(!body.contains("127.0.0.1"), "{body}");
    let sources = admin_get_json(&server, "/api/v1/ops/sources", "s3cret-token").await;
    let sim = &sources["sources"][0];
    assert!(sim["rest_base"].as_str().unwrap().starts_with("http://127.0.0.1:"), "{sim}");
    assert!(sim["ws_base"].as_str().unwrap().starts_with("ws://127.0.0.1:"), "{sim}");

    let done = eventually("the backfill to finish", || async {
        let b = server.get_json("/api/v1/ops/backfill").await;
        (b["tasks"][0]["state"] == "done").then_some(b)
    })
    .await;
    let task = &done["tasks"][0];
    assert_eq!(task["series"], "sim:spot:BTC/USDT:1m");
    assert!(task["progress"].as_f64().unwrap() > 0.999, "{task}");
    assert!(task["candles_written"].as_u64().unwrap() >= 1440, "{task}");

    // Admin: bad token 401, good token 200; unknown task 400.
    let body = r#"{"series":"sim:spot:BTC/USDT:1m"}"#;
    let (s, _) =
        http(server.addr, "POST", "/api/v1/admin/backfill/start", &[], body).await.unwrap();
    assert_eq!(s, 401);
    let (s, _) = http(
        server.addr,
        "POST",
        "/api/v1/admin/backfill/start",
        &[("Authorization", "Bearer nope-nope")],
        body,
    )
    .await
    .unwrap();
    assert_eq!(s, 401);
    let auth = [("Authorization", "Bearer s3cret-token")];
    let (s, b) =
        http(server.addr, "POST", "/api/v1/admin/backfill/start", &auth, body).await.unwrap();
    assert_eq!(s, 200, "{b}");
    let (s, b) = http(
        server.addr,
        "POST",
        "/api/v1/admin/backfill/stop",
        &auth,
        r#"{"series":"sim:spot:XRP/USDT:1m"}"#,
    )
    .await
    .unwrap();
    assert_eq!(s, 400, "{b}");
    let (s, b) = http(
        server.addr,
        "POST",
        "/api/v1/admin/jobs/stop",
        &auth,
        r#"{"instrument":"sim:spot:BTC/USDT"}"#,
    )
    .await
    .unwrap();
    assert_eq!(s, 200, "{b}");
    assert!(b.contains(r#""result":"restarted""#), "a pinned job restarts: {b}");
    let jobs = server.get_json("/api/v1/ops/jobs").await;
    assert_eq!(jobs["jobs"][0]["instrument"], "sim:spot:BTC/USDT", "{jobs}");

    let metrics = server.get("/metrics").await.1;
    for name in [
        "millrace_ws_connections ",
        "millrace_backfill_progress{series=\"sim:spot:BTC/USDT:1m\"}",
        // the two refused admin requests, and the wrong token shown to ops/sources
        "millrace_admin_unauthorized_total 3",
        "millrace_source_ready{source=\"sim\"} 1",
    ] {
        assert!(metrics.contains(name), "missing {name} in\n{metrics}");
    }
    let _: BTreeMap<String, String> = BTreeMap::new();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_is_disabled_without_a_token() {
    let server = TestServer::start(test_config(vec![embedded_sim_source(1.0)])).await;
    let (s, b) = http(
        server.addr,
        "POST",
        "/api/v1/admin/jobs/stop",
        &[("Authorization", "Bearer anything-at-all")],
        r#"{"instrument":"sim:spot:BTC/USDT"}"#,
    )
    .await
    .unwrap();
    assert_eq!(s, 403, "{b}");
    assert!(b.contains("admin_token"), "{b}");
    server.stop().await;
}

type RawWs = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

/// A WebSocket client with a 2 KiB receive buffer, subscribed to `streams` (reply not awaited).
async fn tiny_buffer_client(server: &TestServer, streams: &[&str]) -> RawWs {
    use futures_util::SinkExt;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(2048).unwrap();
    let tcp = socket.connect(server.addr).await.unwrap();
    let (mut ws, _) =
        tokio_tungstenite::client_async(format!("ws://{}/ws", server.addr), tcp).await.unwrap();
    let text = serde_json::json!({"method": "SUBSCRIBE", "params": streams, "id": 1}).to_string();
    ws.send(tokio_tungstenite::tungstenite::Message::Text(text.into())).await.unwrap();
    ws
}

/// Publishes `n` kline frames (about 1 KiB each) on `topic` through the server's own bus, in
/// bursts a healthy reader keeps up with. Stands for a burst of market data.
async fn burst(server: &TestServer, topic: &str, n: usize) {
    let series: shared::protocol::SeriesId = topic.trim_start_matches("kline@").parse().unwrap();
    let candle = shared::candle::Candle::one_minute(
        1_700_000_040_000,
        shared::fixed::Price(1),
        shared::fixed::Price(1),
        shared::fixed::Price(1),
        shared::fixed::Price(1),
        shared::fixed::Volume(1),
        1,
    );
    let frame = server::candles::writer::kline_frame(&series, &candle, false, 1_700_000_040_000);
    // Pad to ~1 KiB with insignificant JSON whitespace, so socket buffers fill quickly.
    let mut padded = frame.to_vec();
    padded.splice(1..1, std::iter::repeat_n(b' ', 1000));
    let payload = bytes::Bytes::from(padded);
    for i in 0..n {
        server::bus::Bus::publish(server.app.bus().as_ref(), topic, payload.clone());
        if i % 64 == 63 {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    }
}

const TOPIC: &str = "kline@sim:spot:BTC/USDT:1m";

/// A client that falls behind by more than the bus keeps is closed with 4000 `lagging`; a
/// healthy client on the same stream receives everything meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_client_is_closed_and_others_continue() {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    let mut config = test_config(vec![embedded_sim_source(1.0)]);
    config.limits.bus_capacity = 256;
    config.limits.send_timeout_ms = 60_000;
    let server = TestServer::start(config).await;
    let mut healthy = server.ws().await;
    assert!(request(&mut healthy, "SUBSCRIBE", &[TOPIC], 1).await.is_ok());
    // This one does not read: its socket fills, its session blocks, the bus moves on without it.
    let mut slow = tiny_buffer_client(&server, &[TOPIC]).await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let n = 5_000;
    let reader = tokio::spawn(async move {
        let mut got = 0;
        while got < n {
            if let ServerFrame::Push(_) = next_frame(&mut healthy).await {
                got += 1;
            }
        }
        healthy
    });
    burst(&server, TOPIC, n).await;
    let _healthy = tokio::time::timeout(PATIENCE, reader)
        .await
        .expect("the healthy client got every frame")
        .unwrap();
    // When the slow one reads again it finds what was sent before the lag, then the close.
    let (code, reason) = tokio::time::timeout(PATIENCE, async {
        loop {
            match slow.next().await {
                Some(Ok(Message::Close(Some(frame)))) => {
                    return (u16::from(frame.code), frame.reason.to_string())
                }
                Some(Ok(_)) => continue,
                other => panic!("no close frame: {other:?}"),
            }
        }
    })
    .await
    .expect("a close frame in time");
    assert_eq!(code, 4000, "{reason}");
    assert!(reason.starts_with("lagging"), "{reason}");
    let m = server.get("/metrics").await.1;
    assert!(m.contains("millrace_ws_dropped_lagging_total 1"), "{m}");
    server.stop().await;
}

/// A client that never reads is dropped when a send takes longer than `send_timeout_ms`; a
/// healthy client on the same stream keeps receiving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_client_is_dropped_by_the_send_timeout() {
    let mut config = test_config(vec![embedded_sim_source(1.0)]);
    config.limits.send_timeout_ms = 300;
    config.limits.bus_capacity = 8192;
    let server = TestServer::start(config).await;
    let mut healthy = server.ws().await;
    assert!(request(&mut healthy, "SUBSCRIBE", &[TOPIC], 1).await.is_ok());
    let _stuck = tiny_buffer_client(&server, &[TOPIC]).await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let n = 3_000;
    let reader = tokio::spawn(async move {
        let mut got = 0;
        while got < n {
            if let ServerFrame::Push(_) = next_frame(&mut healthy).await {
                got += 1;
            }
        }
        healthy
    });
    burst(&server, TOPIC, n).await;
    let _healthy = tokio::time::timeout(PATIENCE, reader)
        .await
        .expect("the healthy client got every frame")
        .unwrap();
    eventually("the stuck client to be dropped", || async {
        let m = server.get("/metrics").await.1;
        m.contains("millrace_ws_dropped_slow_send_total 1").then_some(())
    })
    .await;
    let m = server.get("/metrics").await.1;
    assert!(m.contains("millrace_ws_connections 1"), "only the healthy client is left: {m}");
    server.stop().await;
}

/// A futures-market source (USD-M over /fapi) ingests through the same pipeline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn futures_source_ingests_klines() {
    let futures = server::config::SourceConfig {
        name: "simf".into(),
        market: shared::protocol::Market::Futures,
        speed: 600.0,
        ..Default::default()
    };
    let mut config = test_config(vec![embedded_sim_source(600.0), futures]);
    config.ingest.pinned = vec!["simf:futures:ETH/USDT".into()];
    config.server.admin_token = Some("futures-admin-token".into());
    let server = TestServer::start(config).await;
    let rows = eventually("futures candles stored", || async {
        let rows = server.get_json("/api/v1/klines?series=simf:futures:ETH/USDT:1m").await;
        (rows.as_array().unwrap().len() >= 3).then_some(rows)
    })
    .await;
    let times: Vec<i64> = rows.as_array().unwrap().iter().map(|r| r[0].as_i64().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[1] - w[0] == 60_000), "{times:?}");
    let sources = admin_get_json(&server, "/api/v1/ops/sources", "futures-admin-token").await;
    let f = sources["sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "simf")
        .unwrap()
        .clone();
    assert!(f["ws_base"].as_str().unwrap().ends_with("/fapi"), "{f}");
    // A spot instrument is not offered by the futures source.
    let (status, body) = server.get("/api/v1/klines?series=simf:spot:ETH/USDT:1m").await;
    assert_eq!(status, 400, "{body}");
    server.stop().await;
}

/// `GET path` with `Authorization: Bearer <token>`, as JSON (200 expected).
async fn admin_get_json(server: &TestServer, path: &str, token: &str) -> serde_json::Value {
    let auth = format!("Bearer {token}");
    let (status, body) =
        http(server.addr, "GET", path, &[("Authorization", &auth)], "").await.unwrap();
    assert_eq!(status, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap()
}
