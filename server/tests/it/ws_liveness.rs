//! WebSocket liveness: the server pings every connection (`limits.ws_ping_interval_ms`), closes
//! one that answers nothing within `limits.ws_pong_timeout_ms` of a ping, and one that holds no
//! subscription for `limits.ws_idle_timeout_ms`; both counted in `/metrics`
//! (`millrace_ws_closed_total{reason}`). Before, an upgraded WebSocket with no subscription got
//! no frame and was never closed: half-open sockets lived forever.

use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use server::config::{Config, Overrides};
use testkit::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

const PING_MS: u64 = 200;
const PONG_MS: u64 = 300;
const IDLE_MS: u64 = 800;
/// Scheduling slack on a busy machine (2 cores shared with builds).
const SLACK: Duration = Duration::from_millis(1500);
/// Longest any wait of these tests.
const WAIT: Duration = Duration::from_secs(10);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

async fn server() -> TestServer {
    let mut config = test_config(vec![]);
    config.limits.ws_ping_interval_ms = PING_MS;
    config.limits.ws_pong_timeout_ms = PONG_MS;
    config.limits.ws_idle_timeout_ms = IDLE_MS;
    TestServer::start(config).await
}

/// `millrace_ws_closed_total{reason=…}` in `/metrics`.
async fn closed_total(server: &TestServer, reason: &str) -> u64 {
    let metrics = server.get("/metrics").await.1;
    let name = format!("millrace_ws_closed_total{{reason=\"{reason}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&name))
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{metrics}"))
        .parse()
        .unwrap()
}

/// What a client that reads (and so answers pings) receives in `within`: the pings counted, and
/// the close frame (code, reason) and when it came, if the server closed.
#[derive(Debug, Default)]
struct Seen {
    pings: usize,
    texts: usize,
    close: Option<(CloseCode, String, Instant)>,
}

async fn read_for(ws: &mut Ws, within: Duration) -> Seen {
    let mut seen = Seen::default();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, ws.next()).await {
            Err(_) => return seen,
            Ok(Some(Ok(Message::Ping(_)))) => seen.pings += 1,
            Ok(Some(Ok(Message::Text(_)))) => seen.texts += 1,
            Ok(Some(Ok(Message::Close(frame)))) => {
                let frame = frame.expect("a close frame with a code");
                seen.close = Some((frame.code, frame.reason.to_string(), Instant::now()));
                return seen;
            }
            Ok(Some(Ok(_))) => {}
            Ok(None) | Ok(Some(Err(_))) => return seen,
        }
    }
}

async fn subscribe(ws: &mut Ws, method: &str, stream: &str, id: u64) {
    let text = serde_json::json!({"method": method, "params": [stream], "id": id}).to_string();
    ws.send(Message::Text(text.into())).await.unwrap();
}

/// (a) A client that answers pings and holds a subscription stays open for several idle
/// periods, and is pinged all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribed_client_that_answers_pings_stays_open_and_is_pinged() {
    let server = server().await;
    let mut ws = server.ws().await;
    subscribe(&mut ws, "SUBSCRIBE", "heartbeat", 1).await;
    let held = ms(4 * IDLE_MS);
    let seen = read_for(&mut ws, held).await;
    assert!(seen.close.is_none(), "closed while subscribed and answering: {seen:?}");
    // a ping every 200 ms: 16 in 3.2 s, fewer on a busy machine, never none
    assert!(seen.pings >= 5, "{seen:?}");
    assert!(seen.texts >= 5, "the reply and heartbeats: {seen:?}");
    // still served
    subscribe(&mut ws, "UNSUBSCRIBE", "heartbeat", 2).await;
    subscribe(&mut ws, "SUBSCRIBE", "heartbeat", 3).await;
    let seen = read_for(&mut ws, ms(2 * IDLE_MS)).await;
    assert!(seen.close.is_none() && seen.texts >= 2, "{seen:?}");
    assert_eq!(closed_total(&server, "idle").await, 0);
    assert_eq!(closed_total(&server, "pong_timeout").await, 0);
    server.stop().await;
}

/// A masked client text frame.
fn text_frame(payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() < 126);
    let mask = [0x37, 0xfa, 0x21, 0x3d];
    let mut f = vec![0x81, 0x80 | payload.len() as u8];
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

/// Every server frame (opcode, payload) until the server ends the connection.
async fn frames_to_the_end(tcp: &mut TcpStream) -> Vec<(u8, Vec<u8>)> {
    let mut wire = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let mut chunk = [0u8; 16 * 1024];
        match tokio::time::timeout_at(deadline, tcp.read(&mut chunk)).await {
            Err(_) => panic!("the connection did not end in {WAIT:?}"),
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => wire.extend_from_slice(&chunk[..n]),
        }
    }
    let mut frames = Vec::new();
    let mut at = 0;
    while wire.len() >= at + 2 {
        let (len, header) = match wire[at + 1] & 0x7f {
            126 => (usize::from(u16::from_be_bytes([wire[at + 2], wire[at + 3]])), 4),
            127 => (u64::from_be_bytes(wire[at + 2..at + 10].try_into().unwrap()) as usize, 10),
            n => (usize::from(n), 2),
        };
        if wire.len() < at + header + len {
            break;
        }
        frames.push((wire[at] & 0x0f, wire[at + header..at + header + len].to_vec()));
        at += header + len;
    }
    frames
}

/// (b) A client that never reads, so never answers a ping (subscribed, so never idle), is
/// closed within ping + pong timeout, and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_answers_a_ping_is_closed_and_counted() {
    let server = server().await;
    let mut tcp = crate::http_hardening::raw_ws(server.addr, "").await;
    let opened = Instant::now();
    tcp.write_all(&text_frame(br#"{"method":"SUBSCRIBE","params":["heartbeat"],"id":1}"#))
        .await
        .unwrap();
    // never read: poll the counter only
    let deadline = opened + ms(PING_MS + PONG_MS) + SLACK;
    let closed_at = loop {
        if closed_total(&server, "pong_timeout").await == 1 {
            break opened.elapsed();
        }
        assert!(Instant::now() < deadline, "not closed within ping + pong timeout + slack");
        tokio::time::sleep(ms(20)).await;
    };
    assert!(closed_at >= ms(PING_MS + PONG_MS - 50), "closed too early: {closed_at:?}");
    // what it had been sent: the reply, heartbeats, at least one ping, then a close frame (1001)
    let frames = frames_to_the_end(&mut tcp).await;
    let opcodes: Vec<u8> = frames.iter().map(|f| f.0).collect();
    assert!(opcodes.contains(&0x9), "no ping: {opcodes:?}");
    let (last, payload) = frames.last().expect("frames");
    assert_eq!(*last, 0x8, "not ended by a close frame: {opcodes:?}");
    assert_eq!(u16::from_be_bytes([payload[0], payload[1]]), 1001);
    let reason = String::from_utf8_lossy(&payload[2..]);
    assert!(reason.contains("limits.ws_pong_timeout_ms"), "{reason}");
    assert_eq!(closed_total(&server, "idle").await, 0);
    server.stop().await;
}

/// (c) A client that answers pings but holds no subscription is closed after the idle timeout,
/// with a close frame saying so, and counted; subscribing resets the clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_no_subscription_is_closed_after_the_idle_timeout() {
    let server = server().await;
    let mut ws = server.ws().await;
    let opened = Instant::now();
    let seen = read_for(&mut ws, WAIT).await;
    let (code, reason, at) = seen.close.clone().expect("closed for idleness");
    let after = at - opened;
    assert!(after >= ms(IDLE_MS - 50) && after <= ms(IDLE_MS) + SLACK, "closed after {after:?}");
    assert_eq!(code, CloseCode::Policy);
    assert!(
        reason.starts_with("idle:") && reason.contains("limits.ws_idle_timeout_ms"),
        "{reason}"
    );
    assert!(seen.pings >= 1, "pinged meanwhile: {seen:?}");
    assert_eq!(closed_total(&server, "idle").await, 1);

    // subscribed at 500 ms, unsubscribed at 1.5 s: closed 800 ms after that, not before
    let mut ws = server.ws().await;
    let seen = read_for(&mut ws, ms(500)).await;
    assert!(seen.close.is_none(), "{seen:?}");
    subscribe(&mut ws, "SUBSCRIBE", "heartbeat", 1).await;
    let seen = read_for(&mut ws, ms(1000)).await;
    assert!(seen.close.is_none(), "closed while subscribed: {seen:?}");
    subscribe(&mut ws, "UNSUBSCRIBE", "heartbeat", 2).await;
    let unsubscribed = Instant::now();
    let seen = read_for(&mut ws, WAIT).await;
    let (code, _, at) = seen.close.expect("closed for idleness");
    let after = at - unsubscribed;
    assert!(after >= ms(IDLE_MS - 50) && after <= ms(IDLE_MS) + SLACK, "closed after {after:?}");
    assert_eq!(code, CloseCode::Policy);
    assert_eq!(closed_total(&server, "idle").await, 2);
    assert_eq!(closed_total(&server, "pong_timeout").await, 0);
    server.stop().await;
}

/// (d) The three keys: defaults, a value taken, and bad values refused naming the key.
#[test]
fn bad_liveness_keys_are_refused_naming_the_key() {
    let load = |pairs: &[(&str, &str)]| {
        let env = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>();
        Config::load(None, env, &Overrides::default())
    };
    let d = load(&[]).unwrap();
    assert_eq!(
        (d.limits.ws_ping_interval_ms, d.limits.ws_pong_timeout_ms, d.limits.ws_idle_timeout_ms),
        (20_000, 10_000, 60_000)
    );
    let c = load(&[
        ("MILLRACE_LIMITS__WS_PING_INTERVAL_MS", "200"),
        ("MILLRACE_LIMITS__WS_PONG_TIMEOUT_MS", "300"),
        ("MILLRACE_LIMITS__WS_IDLE_TIMEOUT_MS", "800"),
    ])
    .unwrap();
    assert_eq!(
        (c.limits.ws_ping_interval_ms, c.limits.ws_pong_timeout_ms, c.limits.ws_idle_timeout_ms),
        (200, 300, 800)
    );
    for (key, var, bad) in [
        ("limits.ws_ping_interval_ms", "MILLRACE_LIMITS__WS_PING_INTERVAL_MS", "0"),
        ("limits.ws_ping_interval_ms", "MILLRACE_LIMITS__WS_PING_INTERVAL_MS", "3600001"),
        ("limits.ws_pong_timeout_ms", "MILLRACE_LIMITS__WS_PONG_TIMEOUT_MS", "0"),
        ("limits.ws_pong_timeout_ms", "MILLRACE_LIMITS__WS_PONG_TIMEOUT_MS", "3600001"),
        ("limits.ws_idle_timeout_ms", "MILLRACE_LIMITS__WS_IDLE_TIMEOUT_MS", "5"),
        ("limits.ws_idle_timeout_ms", "MILLRACE_LIMITS__WS_IDLE_TIMEOUT_MS", "86400001"),
        ("limits.ws_idle_timeout_ms", "MILLRACE_LIMITS__WS_IDLE_TIMEOUT_MS", "-1"),
    ] {
        let e = load(&[(var, bad)]).unwrap_err().to_string();
        assert!(e.contains(&format!("`{key}`")), "{var}={bad}: {e}");
    }
}
