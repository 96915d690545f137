//! `millrace serve` through its public interface: a server on port 0, real HTTP and WebSocket
//! clients.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use server::cli::ServeArgs;
use server::http::{serve, ServeConfig};
use shared::protocol::{ErrorCode, Heartbeat, Push, PushData, ServerFrame, Stream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::Message;

use testkit::{next_frame, reply, send, Ws};

const INDEX_HTML: &str = "<!doctype html><title>millrace test</title>";
/// Heartbeat interval in tests: fast, so tests take a fraction of a second.
const BEAT: Duration = Duration::from_millis(50);
/// Longest any single expected message may take.
const PATIENCE: Duration = Duration::from_secs(5);

/// A running server; stops it when dropped.
struct TestApp {
    addr: SocketAddr,
    _stop: oneshot::Sender<()>,
}

fn static_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("millrace-http-ws-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("index.html"), INDEX_HTML).unwrap();
    dir
}

async fn spawn_app() -> TestApp {
    spawn_app_with(server::http::Dashboard::Dir(static_dir())).await
}

async fn spawn_app_with(dashboard: server::http::Dashboard) -> TestApp {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut base = server::config::Config::default();
    base.server.data_dir = static_dir().join(format!("data-{}", addr.port()));
    base.ingest.pinned = vec![];
    base.backfill = vec![];
    let config = ServeConfig { config: base, dashboard, heartbeat_every: BEAT };
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        serve(listener, config, async move {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    TestApp { addr, _stop: stop }
}

/// A minimal HTTP/1.1 GET; returns (status, body).
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut raw = String::new();
    tokio::time::timeout(PATIENCE, tcp.read_to_string(&mut raw)).await.unwrap().unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(
        !head.to_ascii_lowercase().contains("transfer-encoding: chunked"),
        "test client reads plain bodies only"
    );
    (status, body.to_string())
}

async fn connect(app: &TestApp) -> Ws {
    let (ws, _) = tokio_tungstenite::connect_async(format!("ws://{}/ws", app.addr)).await.unwrap();
    ws
}

async fn next_heartbeat(ws: &mut Ws) -> Heartbeat {
    match next_frame(ws).await {
        ServerFrame::Push(Push { stream: Stream::Heartbeat, data: PushData::Heartbeat(hb) }) => hb,
        other => panic!("expected a heartbeat, got {other:?}"),
    }
}

#[tokio::test]
async fn version_reports_the_server_version() {
    let app = spawn_app().await;
    let (status, body) = get(app.addr, "/api/v1/version").await;
    assert_eq!(status, 200);
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["version"], server::VERSION);
}

#[tokio::test]
async fn healthz_is_ok() {
    let app = spawn_app().await;
    let (status, body) = get(app.addr, "/healthz").await;
    assert_eq!((status, body.as_str()), (200, r#"{"status":"ok"}"#));
}

/// `/ws` without a WebSocket upgrade is refused by the upgrade's checks, not served as a file.
#[tokio::test]
async fn ws_without_an_upgrade_is_refused() {
    let app = spawn_app().await;
    let (status, body) = get(app.addr, "/ws").await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("upgrade"), "{body}");
}

#[tokio::test]
async fn index_html_is_served_at_root() {
    let app = spawn_app().await;
    assert_eq!(get(app.addr, "/").await, (200, INDEX_HTML.to_string()));
    assert_eq!(get(app.addr, "/no-such-file.js").await.0, 404);
}

/// A binary built before the dashboard (and given no static dir) starts, serves the API, and
/// says on `/` how to build the dashboard.
#[tokio::test]
async fn without_a_dashboard_the_api_runs_and_the_root_explains_how_to_build_it() {
    let app = spawn_app_with(server::http::Dashboard::Missing).await;
    let (status, body) = get(app.addr, "/").await;
    assert_eq!(status, 200);
    assert!(body.contains("scripts/build-client") && body.contains("--static-dir"), "{body}");
    assert_eq!(get(app.addr, "/healthz").await.0, 200);
    assert_eq!(get(app.addr, "/api/v1/version").await.0, 200);
    assert_eq!(get(app.addr, "/client.js").await.0, 404);
}

#[test]
fn missing_static_dir_is_a_clear_error() {
    let args =
        ServeArgs { static_dir: Some("/nonexistent/millrace-dist".into()), ..ServeArgs::default() };
    let err = ServeConfig::new(args.load().unwrap()).unwrap_err().to_string();
    assert!(err.contains("--static-dir") && err.contains("scripts/build-client"), "{err}");
}

#[tokio::test]
async fn subscribed_client_receives_heartbeats_with_increasing_seq() {
    let app = spawn_app().await;
    let mut ws = connect(&app).await;
    send(&mut ws, r#"{"method":"SUBSCRIBE","params":["heartbeat"],"id":1}"#).await;
    assert_eq!(
        serde_json::to_string(&reply(&mut ws, 1).await).unwrap(),
        r#"{"id":1,"result":null}"#
    );
    let first = next_heartbeat(&mut ws).await;
    assert_eq!(first.version, server::VERSION);
    assert!(first.server_time_ms > 1_600_000_000_000, "wall-clock ms: {}", first.server_time_ms);
    let mut last = first.seq;
    for _ in 0..3 {
        let hb = next_heartbeat(&mut ws).await;
        assert!(hb.seq > last, "seq {} after {last}", hb.seq);
        last = hb.seq;
    }
}

#[tokio::test]
async fn unsubscribe_stops_heartbeats() {
    let app = spawn_app().await;
    let mut ws = connect(&app).await;
    send(&mut ws, r#"{"method":"SUBSCRIBE","params":["heartbeat"],"id":1}"#).await;
    assert!(reply(&mut ws, 1).await.is_ok());
    next_heartbeat(&mut ws).await;
    send(&mut ws, r#"{"method":"UNSUBSCRIBE","params":["heartbeat"],"id":2}"#).await;
    assert!(reply(&mut ws, 2).await.is_ok());
    // Nothing for ten heartbeat intervals.
    let quiet = tokio::time::timeout(BEAT * 10, ws.next()).await;
    assert!(quiet.is_err(), "got {quiet:?} after unsubscribing");
}

/// A ping is answered at once, though the server batches its writes until a burst's flush.
#[tokio::test]
async fn a_ping_is_answered_with_its_pong() {
    let app = spawn_app().await;
    let mut ws = connect(&app).await;
    ws.send(Message::Ping(b"are you there".to_vec().into())).await.unwrap();
    let pong = tokio::time::timeout(Duration::from_secs(5), ws.next()).await;
    match pong {
        Ok(Some(Ok(Message::Pong(data)))) => assert_eq!(&data[..], b"are you there"),
        other => panic!("expected the pong, got {other:?}"),
    }
}

#[tokio::test]
async fn bad_frame_gets_malformed_and_socket_stays_open() {
    let app = spawn_app().await;
    let mut ws = connect(&app).await;
    send(&mut ws, "this is not json").await;
    let r = reply(&mut ws, 0).await;
    assert_eq!(r.error.unwrap().code, ErrorCode::Malformed);
    send(&mut ws, r#"{"method":"SUBSCRIBE","params":"heartbeat","id":7}"#).await;
    assert_eq!(reply(&mut ws, 7).await.error.unwrap().code, ErrorCode::Malformed);
    ws.send(Message::Binary(vec![1, 2, 3].into())).await.unwrap();
    assert_eq!(reply(&mut ws, 0).await.error.unwrap().code, ErrorCode::Malformed);
    // Still usable.
    send(&mut ws, r#"{"method":"SUBSCRIBE","params":["heartbeat"],"id":8}"#).await;
    assert!(reply(&mut ws, 8).await.is_ok());
    next_heartbeat(&mut ws).await;
}

#[tokio::test]
async fn frame_over_64_kib_is_rejected() {
    let app = spawn_app().await;
    let mut ws = connect(&app).await;
    let big = format!(r#"{{"method":"SUBSCRIBE","params":["{}"],"id":3}}"#, "x".repeat(65 * 1024));
    send(&mut ws, &big).await;
    assert_eq!(reply(&mut ws, 0).await.error.unwrap().code, ErrorCode::TooLarge);
    send(&mut ws, r#"{"method":"UNSUBSCRIBE","params":["heartbeat"],"id":4}"#).await;
    assert!(reply(&mut ws, 4).await.is_ok());
}

#[tokio::test]
async fn unknown_and_bad_streams_get_error_replies() {
    let app = spawn_app().await;
    let mut ws = connect(&app).await;
    send(&mut ws, r#"{"method":"SUBSCRIBE","params":["depth@sim:spot:NOPE/USDT,20"],"id":5}"#)
        .await;
    let err = reply(&mut ws, 5).await.error.unwrap();
    assert_eq!(err.code, ErrorCode::UnknownSeries);
    assert!(err.msg.contains("depth@sim:spot:NOPE/USDT,20"), "{}", err.msg);
    send(&mut ws, r#"{"method":"SUBSCRIBE","params":["trades@BTC"],"id":6}"#).await;
    assert_eq!(reply(&mut ws, 6).await.error.unwrap().code, ErrorCode::BadStream);
}

#[tokio::test]
async fn shutdown_closes_websockets_with_going_away() {
    let app = spawn_app().await;
    let mut ws = connect(&app).await;
    send(&mut ws, r#"{"method":"SUBSCRIBE","params":["heartbeat"],"id":1}"#).await;
    assert!(reply(&mut ws, 1).await.is_ok());
    drop(app);
    loop {
        match tokio::time::timeout(PATIENCE, ws.next()).await.expect("close in time") {
            Some(Ok(Message::Close(Some(frame)))) => {
                assert_eq!(u16::from(frame.code), 1001);
                break;
            }
            Some(Ok(Message::Text(_))) => continue,
            other => panic!("expected a close frame, got {other:?}"),
        }
    }
}
