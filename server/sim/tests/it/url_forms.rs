//! Every URL form Binance's stream endpoints accept, through a real WebSocket client: raw
//! streams by path (one or several), any other path segment (a listen key, a third-party
//! client's connection id such as `/ws/0`) accepted with nothing on it until SUBSCRIBE, combined
//! streams by query (percent-encoded too), `/stream` alone with SUBSCRIBE later, a trailing
//! slash, `timeUnit`, and the futures routed paths.

use std::collections::BTreeSet;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use sim::{Sim, SimConfig, SimHandle};
use tokio::net::TcpStream;
use tokio::time::{timeout, Instant};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

async fn start() -> SimHandle {
    let config = SimConfig {
        seed: 3,
        speed: 30.0,
        symbols: SimConfig::symbols_named(&["BTCUSDT", "ETHUSDT"]).unwrap(),
        ..SimConfig::default()
    };
    Sim::start(config, "127.0.0.1:0".parse().unwrap()).await.unwrap()
}

async fn connect(url: &str) -> Ws {
    match timeout(Duration::from_secs(5), tokio_tungstenite::connect_async(url)).await {
        Ok(Ok((ws, _))) => ws,
        Ok(Err(e)) => panic!("{url}: refused: {e}"),
        Err(_) => panic!("{url}: no handshake in 5 s"),
    }
}

/// The next text frames' JSON until `n` were seen or `wait` passed.
async fn texts(ws: &mut Ws, n: usize, wait: Duration) -> Vec<Value> {
    let deadline = Instant::now() + wait;
    let mut out = Vec::new();
    while out.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        match timeout(left, ws.next()).await {
            Ok(Some(Ok(Message::Text(t)))) => out.push(serde_json::from_str(&t).unwrap()),
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(_)) | None) | Err(_) => break,
        }
    }
    out
}

/// The labels seen until every one of `want` was, or `wait` passed: a quiet symbol's trades may
/// come seconds apart on a loaded machine, so a fixed number of frames proves nothing.
async fn until_seen(ws: &mut Ws, want: &[&str], wait: Duration) -> BTreeSet<String> {
    let deadline = Instant::now() + wait;
    let mut seen = BTreeSet::new();
    while !want.iter().all(|w| seen.contains(*w)) {
        let left = deadline.saturating_duration_since(Instant::now());
        let frames = texts(ws, 1, left).await;
        if frames.is_empty() {
            break;
        }
        seen.extend(labels(&frames));
    }
    seen
}

/// Raw events (`e`/`s`) or combined ones (`stream`), as `stream-or-event:symbol` labels.
fn labels(frames: &[Value]) -> BTreeSet<String> {
    frames
        .iter()
        .filter(|v| v.get("id").is_none())
        .map(|v| match v.get("stream") {
            Some(s) => format!("combined:{}", s.as_str().unwrap()),
            None => {
                format!("raw:{}:{}", v["e"].as_str().unwrap_or("?"), v["s"].as_str().unwrap_or("?"))
            }
        })
        .collect()
}

async fn subscribe(ws: &mut Ws, stream: &str) {
    let req = serde_json::json!({"method":"SUBSCRIBE","params":[stream],"id":1});
    ws.send(Message::Text(req.to_string().into())).await.unwrap();
}

#[tokio::test]
async fn every_binance_stream_url_form_connects() {
    let sim = start().await;
    let base = sim.ws_base();
    let quiet = Duration::from_millis(400);

    // a third-party client's connection id, and a listen key: accepted, silent, then SUBSCRIBE
    for path in [
        "/ws/0",
        "/ws/multi:1",
        "/ws/pqia91ma19a5s61cv6a81va65sdf19v8a65a1a5s61cv6a81va65sdf19v8a65a1",
    ] {
        let mut ws = connect(&format!("{base}{path}")).await;
        assert!(texts(&mut ws, 1, quiet).await.is_empty(), "{path}: nothing before SUBSCRIBE");
        subscribe(&mut ws, "btcusdt@trade").await;
        let got = texts(&mut ws, 1, Duration::from_secs(5)).await;
        assert_eq!(got[0], serde_json::json!({"result":null,"id":1}), "{path}");
        let seen = until_seen(&mut ws, &["raw:trade:BTCUSDT"], Duration::from_secs(20)).await;
        assert!(seen.contains("raw:trade:BTCUSDT"), "{path}: {seen:?}");
    }

    // several raw streams in the path, a segment that is not a stream among them
    let mut ws = connect(&format!("{base}/ws/btcusdt@trade/0/ethusdt@trade")).await;
    let want = ["raw:trade:BTCUSDT", "raw:trade:ETHUSDT"];
    let seen = until_seen(&mut ws, &want, Duration::from_secs(20)).await;
    assert!(want.iter().all(|w| seen.contains(*w)), "{seen:?}");

    // combined by query, percent-encoded, with timeUnit in milliseconds
    for path in [
        "/stream?streams=btcusdt@trade/ethusdt@trade",
        "/stream?streams=btcusdt%40trade%2Fethusdt%40trade&timeUnit=MILLISECOND",
        "/stream/?timeUnit=millisecond&streams=btcusdt@trade/ethusdt@trade",
    ] {
        let mut ws = connect(&format!("{base}{path}")).await;
        let want = ["combined:btcusdt@trade", "combined:ethusdt@trade"];
        let seen = until_seen(&mut ws, &want, Duration::from_secs(20)).await;
        assert!(want.iter().all(|w| seen.contains(*w)), "{path}: {seen:?}");
    }

    // bare endpoints, streams by SUBSCRIBE later; `/stream` wraps them
    for (path, want) in [
        ("/ws", "raw:trade:ETHUSDT"),
        ("/ws/", "raw:trade:ETHUSDT"),
        ("/ws?timeUnit=MILLISECOND", "raw:trade:ETHUSDT"),
        ("/stream", "combined:ethusdt@trade"),
    ] {
        let mut ws = connect(&format!("{base}{path}")).await;
        assert!(texts(&mut ws, 1, quiet).await.is_empty(), "{path}: nothing before SUBSCRIBE");
        subscribe(&mut ws, "ethusdt@trade").await;
        let seen = until_seen(&mut ws, &[want], Duration::from_secs(20)).await;
        assert!(seen.contains(want), "{path}: {seen:?}");
    }

    // USD-M futures: the classic and the routed paths
    for path in [
        "/fapi/ws/btcusdt@depth@100ms",
        "/fapi/public/ws/btcusdt@depth@100ms",
        "/fapi/market/ws/btcusdt@depth@100ms",
    ] {
        let mut ws = connect(&format!("{base}{path}")).await;
        let got = texts(&mut ws, 1, Duration::from_secs(5)).await;
        assert_eq!(got.first().map(|v| v["e"].clone()), Some("depthUpdate".into()), "{path}");
        assert!(got[0].get("pu").is_some(), "{path}: futures diffs carry pu: {got:?}");
    }
    let mut ws = connect(&format!("{base}/fapi/market/stream?streams=ethusdt@aggTrade")).await;
    let want = "combined:ethusdt@aggTrade";
    let seen = until_seen(&mut ws, &[want], Duration::from_secs(20)).await;
    assert!(seen.contains(want), "{seen:?}");

    // microseconds are not produced: refused with a reason rather than sent as milliseconds
    let refused =
        tokio_tungstenite::connect_async(format!("{base}/ws/btcusdt@trade?timeUnit=MICROSECOND"))
            .await;
    match refused {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 400),
        other => panic!("timeUnit=MICROSECOND: {:?}", other.map(|_| ())),
    }
    sim.shutdown();
}
