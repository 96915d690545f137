//! Hostile clients at the HTTP and WebSocket layer, over raw sockets: paths that cannot name a
//! file, WebSocket protocol violations (hand-made frames), web pages of other origins, and
//! connection floods (slowloris, idle keep-alive, per-IP and global caps).

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use shared::protocol::ErrorCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use testkit::*;

const WAIT: Duration = Duration::from_secs(5);

async fn server() -> TestServer {
    TestServer::start(test_config(vec![embedded_sim_source(1.0)])).await
}

// ---- 15: paths that cannot name a file ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_that_cannot_name_a_file_are_404_never_500() {
    let server = server().await;
    let x = "x".repeat(256);
    let paths = [
        format!("/{x}"),
        format!("/{x}/"),
        format!("/{x}.js"),
        format!("/a/{x}"),
        format!("/{x}/index.html"),
        format!("/index.html/{x}"),
        format!("/api/v1/{x}"),
        format!("/api/v1/ops/{x}"),
        format!("/ws/{x}"),
        format!("/healthz/{x}"),
        // Percent-encoded: 256 characters once decoded.
        format!("/{}", "%41".repeat(256)),
        // Longer than PATH_MAX with short components, and one very long component.
        format!("/{}", "ab/".repeat(1500)),
        format!("/{}", "y".repeat(5000)),
        format!("/%00{x}"),
    ];
    for path in &paths {
        for method in ["GET", "HEAD"] {
            let (status, body) = http(server.addr, method, path, &[], "").await.unwrap();
            assert_eq!(status, 404, "{method} {}…: {body}", &path[..path.len().min(40)]);
        }
    }
    // Long names in queries are the handlers' to refuse, with a 4xx.
    for path in [format!("/api/v1/klines?series={x}"), format!("/fapi/v1/depth?symbol={x}")] {
        let (status, body) = server.get(&path).await;
        assert!((400..500).contains(&status), "{path}: {status} {body}");
    }
    assert_eq!(server.get(&format!("/?{x}")).await.0, 200, "a query on / is still the dashboard");
    assert_eq!(server.get("/healthz").await.0, 200);
    server.stop().await;
}

// ---- 15: WebSocket protocol violations, with hand-made frames ----

/// A WebSocket on a raw TCP socket: the handshake by hand (the answer read byte by byte, so
/// nothing after it is consumed), then whatever bytes the test writes.
pub(crate) async fn raw_ws(addr: SocketAddr, extra_headers: &str) -> TcpStream {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "GET /ws HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{extra_headers}\r\n"
    );
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(WAIT, tcp.read(&mut byte)).await.unwrap().unwrap();
        assert_eq!(n, 1, "connection closed during the handshake");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    tcp
}

/// A client frame: FIN + `first` (opcode and RSV bits as given), masked with `mask` if any.
fn frame(first: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
    let mut f = vec![first];
    let m = if mask.is_some() { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => f.push(m | n as u8),
        n if n <= 0xffff => {
            f.push(m | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            f.push(m | 127);
            f.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    match mask {
        Some(k) => {
            f.extend_from_slice(&k);
            f.extend(payload.iter().enumerate().map(|(i, b)| b ^ k[i % 4]));
        }
        None => f.extend_from_slice(payload),
    }
    f
}

const MASK: Option<[u8; 4]> = Some([0x37, 0xfa, 0x21, 0x3d]);

/// Reads server frames until a close frame; returns its code. Panics if the connection ends
/// without one.
async fn close_code(tcp: &mut TcpStream) -> u16 {
    let deadline = Instant::now() + WAIT;
    let mut buf = Vec::new();
    loop {
        // A whole frame in the buffer?
        if buf.len() >= 2 {
            let (len, at) = match buf[1] & 0x7f {
                126 if buf.len() >= 4 => (u16::from_be_bytes([buf[2], buf[3]]) as usize, 4),
                127 if buf.len() >= 10 => {
                    (u64::from_be_bytes(buf[2..10].try_into().unwrap()) as usize, 10)
                }
                126 | 127 => (usize::MAX, 0),
                n => (n as usize, 2),
            };
            if len != usize::MAX && buf.len() >= at + len {
                let opcode = buf[0] & 0x0f;
                let payload = buf[at..at + len].to_vec();
                buf.drain(..at + len);
                if opcode == 0x8 {
                    assert!(payload.len() >= 2, "a close frame without a code");
                    return u16::from_be_bytes([payload[0], payload[1]]);
                }
                continue;
            }
        }
        let mut chunk = [0u8; 4096];
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, tcp.read(&mut chunk)).await {
            Err(_) => panic!("no close frame in {WAIT:?}"),
            Ok(Ok(0)) => panic!("the server closed TCP without a close frame"),
            Ok(Err(e)) => panic!("the server dropped TCP without a close frame: {e}"),
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_protocol_violations_close_with_their_code() {
    let server = server().await;
    let one_mib = 1024 * 1024;
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        ("RSV1 set", frame(0x80 | 0x40 | 0x1, b"hello", MASK), 1002),
        ("RSV3 set", frame(0x80 | 0x10 | 0x2, b"hello", MASK), 1002),
        ("an unmasked frame", frame(0x81, br#"{"method":"SUBSCRIBE"}"#, None), 1002),
        ("a reserved opcode", frame(0x83, b"x", MASK), 1002),
        ("a continuation without a start", frame(0x80, b"x", MASK), 1002),
        ("invalid UTF-8 in a text frame", frame(0x81, &[b'{', 0xc3, 0x28, b'}'], MASK), 1007),
        (
            "invalid UTF-8 across fragments",
            [frame(0x01, &[b'a', 0xe2, 0x82], MASK), frame(0x80, &[0x28], MASK)].concat(),
            1007,
        ),
        (
            "a frame over 1 MiB (its header alone)",
            {
                let mut f = vec![0x82, 0x80 | 127];
                f.extend_from_slice(&(2 * one_mib as u64).to_be_bytes());
                f.extend_from_slice(&MASK.unwrap());
                f
            },
            1009,
        ),
        (
            "a message over 1 MiB in fragments",
            [frame(0x02, &vec![0u8; 600 * 1024], MASK), frame(0x80, &vec![0u8; 600 * 1024], MASK)]
                .concat(),
            1009,
        ),
    ];
    for (what, bytes, want) in cases {
        let mut tcp = raw_ws(server.addr, "").await;
        tcp.write_all(&bytes).await.unwrap();
        assert_eq!(close_code(&mut tcp).await, want, "{what}");
    }
    // A well-formed session on the same server still works.
    let mut tcp = raw_ws(server.addr, "").await;
    tcp.write_all(&frame(0x81, br#"{"method":"SUBSCRIBE","params":["heartbeat"],"id":1}"#, MASK))
        .await
        .unwrap();
    let mut got = [0u8; 64];
    let n = tokio::time::timeout(WAIT, tcp.read(&mut got)).await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&got[..n]).contains(r#""id":1"#));
    server.stop().await;
}

// ---- 4: Origin on /ws ----

async fn ws_status(addr: SocketAddr, headers: &[(&str, &str)]) -> u16 {
    ws_answer(addr, headers).await.0
}

/// The status of a WebSocket handshake with `headers`, and the body of a refusal.
async fn ws_answer(addr: SocketAddr, headers: &[(&str, &str)]) -> (u16, String) {
    let mut req = format!("ws://{addr}/ws").into_client_request().unwrap();
    for (k, v) in headers {
        let name = tokio_tungstenite::tungstenite::http::HeaderName::from_bytes(k.as_bytes());
        req.headers_mut().insert(name.unwrap(), v.parse().unwrap());
    }
    match tokio_tungstenite::connect_async(req).await {
        Ok((_ws, resp)) => (resp.status().as_u16(), String::new()),
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            let body = String::from_utf8_lossy(resp.body().as_deref().unwrap_or_default());
            (resp.status().as_u16(), body.into_owned())
        }
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websockets_from_other_origins_are_refused() {
    let mut config = test_config(vec![embedded_sim_source(1.0)]);
    // The server is also reached as millrace.test (a name it answers to, server.allowed_hosts).
    config.server.allowed_hosts.push("millrace.test".into());
    let server = TestServer::start(config).await;
    let addr = server.addr;
    // Not a browser: no Origin.
    assert_eq!(ws_status(addr, &[]).await, 101);
    // The server's own origin, as the dashboard it serves sends it.
    let own = format!("http://{addr}");
    assert_eq!(ws_status(addr, &[("Origin", &own)]).await, 101);
    assert_eq!(
        ws_status(addr, &[("Host", "millrace.test:1234"), ("Origin", "http://millrace.test:1234")])
            .await,
        101
    );
    // localhost on any port (a dashboard's dev server).
    assert_eq!(ws_status(addr, &[("Origin", "http://localhost:5173")]).await, 101);
    // Any other page.
    for origin in [
        "http://evil.example",
        "https://evil.example:443",
        "http://millrace.test:9999",
        "http://localhost.evil.example",
        "null",
    ] {
        let status = ws_status(addr, &[("Host", "millrace.test:1234"), ("Origin", origin)]).await;
        assert_eq!(status, 403, "{origin}");
    }
    // A refusal says why, and is counted.
    let (status, body) = ws_answer(addr, &[("Origin", "http://evil.example")]).await;
    assert_eq!(status, 403);
    assert!(body.contains("origin_not_allowed") && body.contains("allowed_origins"), "{body}");
    let metrics = server.get("/metrics").await.1;
    assert!(metrics.contains("millrace_ws_refused_origin_total 6"), "{metrics}");
    server.stop().await;
}

// ---- 4: the allowed origins are configurable ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_origins_are_configurable() {
    let mut config = test_config(vec![embedded_sim_source(1.0)]);
    config.server.allowed_origins = vec!["https://dash.example".into()];
    let server = TestServer::start(config).await;
    let addr = server.addr;
    assert_eq!(ws_status(addr, &[("Origin", "https://dash.example")]).await, 101);
    assert_eq!(ws_status(addr, &[("Origin", &format!("http://{addr}"))]).await, 101, "own origin");
    assert_eq!(ws_status(addr, &[("Origin", "http://localhost:5173")]).await, 403, "not listed");
    server.stop().await;
    let mut config = test_config(vec![]);
    config.server.allowed_origins = vec!["dash.example".into()];
    let e = config.validate().unwrap_err().to_string();
    assert!(e.contains("server.allowed_origins[0]"), "{e}");
}

// ---- 1: connection floods ----

/// A server with the given connection limits (and timeouts long enough not to interfere, unless
/// set).
async fn limited(f: impl FnOnce(&mut server::config::LimitsConfig)) -> TestServer {
    let mut config = test_config(vec![embedded_sim_source(1.0)]);
    config.limits.header_read_timeout_ms = 30_000;
    config.limits.idle_timeout_ms = 30_000;
    f(&mut config.limits);
    TestServer::start(config).await
}

/// A TCP connection to `addr` from the local address `from` (127.0.0.x all reach loopback).
async fn connect_from(from: IpAddr, addr: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    socket.connect(addr).await.unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// How long until the server closes `tcp` (reading and discarding what it sends), at most
/// `within`.
async fn closed_after(tcp: &mut TcpStream, within: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        let left = within.checked_sub(start.elapsed())?;
        match tokio::time::timeout(left, tcp.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0) | Err(_)) => return Some(start.elapsed()),
            Ok(Ok(_)) => continue,
        }
    }
}

/// Sends `GET path` on `tcp` (keep-alive) and reads the response; returns (status, body).
async fn get_on(tcp: &mut TcpStream, path: &str) -> (u16, String) {
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(WAIT, tcp.read(&mut chunk)).await.unwrap().unwrap();
        assert!(n > 0, "connection closed before a whole response");
        raw.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&raw).into_owned();
        let Some((head, body)) = text.split_once("\r\n\r\n") else { continue };
        let length = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length").then(|| v.trim().parse::<usize>().ok())?
            })
            .expect("a content-length");
        if body.len() >= length {
            let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
            return (status, body.to_string());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_is_closed_after_the_header_timeout() {
    let server = limited(|l| {
        l.header_read_timeout_ms = 400;
        l.idle_timeout_ms = 5_000;
    })
    .await;
    // Headers trickled a line at a time, never finished.
    let mut tcp = TcpStream::connect(server.addr).await.unwrap();
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n").await.unwrap();
    let start = Instant::now();
    let trickle = async {
        for i in 0..40 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if tcp.write_all(format!("X-Slow-{i}: 1\r\n").as_bytes()).await.is_err() {
                return;
            }
        }
    };
    trickle.await;
    let closed = closed_after(&mut tcp, Duration::from_secs(1)).await;
    let elapsed = start.elapsed();
    assert!(closed.is_some(), "a slowloris connection still open after {elapsed:?}");
    assert!(elapsed < Duration::from_millis(2_000), "closed only after {elapsed:?}");
    // Nothing at all: closed too, after the same timeout.
    let mut silent = TcpStream::connect(server.addr).await.unwrap();
    let after = closed_after(&mut silent, Duration::from_secs(3)).await.expect("closed");
    assert!(
        after >= Duration::from_millis(300) && after < Duration::from_millis(2_000),
        "{after:?}"
    );
    // The same trickle, finished in time, is served.
    let mut ok = TcpStream::connect(server.addr).await.unwrap();
    ok.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(get_on_rest(&mut ok, "Host: localhost\r\n\r\n").await.0, 200);
    let metrics = server.get("/metrics").await.1;
    assert!(
        metrics.contains("millrace_connections_timed_out_total{phase=\"header\"} 2"),
        "{metrics}"
    );
    server.stop().await;
}

/// Finishes a request whose start was already sent; reads its response.
async fn get_on_rest(tcp: &mut TcpStream, rest: &str) -> (u16, String) {
    tcp.write_all(rest.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(WAIT, tcp.read(&mut chunk)).await.unwrap().unwrap();
        assert!(n > 0, "connection closed before a response");
        raw.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&raw).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            return (head.split_whitespace().nth(1).unwrap().parse().unwrap(), body.to_string());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_connections_are_closed_after_the_idle_timeout() {
    let server = limited(|l| {
        l.header_read_timeout_ms = 300;
        l.idle_timeout_ms = 1_200;
    })
    .await;
    let mut tcp = TcpStream::connect(server.addr).await.unwrap();
    assert_eq!(get_on(&mut tcp, "/healthz").await.0, 200);
    // Idle for longer than the header timeout, shorter than the idle one: still open.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(get_on(&mut tcp, "/api/v1/version").await.0, 200, "keep-alive still works");
    let closed = closed_after(&mut tcp, Duration::from_secs(4)).await.expect("closed when idle");
    assert!(
        closed >= Duration::from_millis(1_000) && closed < Duration::from_millis(3_000),
        "closed {closed:?} after the last response"
    );
    let metrics = server.get("/metrics").await.1;
    assert!(
        metrics.contains("millrace_connections_timed_out_total{phase=\"idle\"} 1"),
        "{metrics}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_per_ip_cap_are_closed_and_other_ips_served() {
    let server = limited(|l| l.max_connections_per_ip = 3).await;
    let addr = server.addr;
    let local = ip("127.0.0.1");
    // Two idle connections and a WebSocket: a WebSocket counts against its IP before and
    // after its upgrade.
    let mut held = vec![connect_from(local, addr).await, connect_from(local, addr).await];
    let ws = server.ws().await;
    // The fourth connection of any kind is closed at once.
    for _ in 0..3 {
        let mut extra = connect_from(local, addr).await;
        assert!(
            closed_after(&mut extra, Duration::from_secs(2)).await.is_some(),
            "a connection over the per-IP cap was not closed"
        );
    }
    // Another address is served meanwhile.
    let mut other = connect_from(ip("127.0.0.2"), addr).await;
    assert_eq!(get_on(&mut other, "/healthz").await.0, 200);
    let metrics = get_on(&mut other, "/metrics").await.1;
    assert!(
        metrics.contains("millrace_connections_refused_total{reason=\"per_ip\"} 3"),
        "{metrics}"
    );
    // A slot is free again when a connection ends.
    held.pop();
    let mut again = eventually("a free slot", || async {
        let mut tcp = connect_from(local, addr).await;
        tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n").await.ok()?;
        let mut buf = [0u8; 12];
        tokio::time::timeout(WAIT, tcp.read_exact(&mut buf)).await.ok()?.ok()?;
        (&buf == b"HTTP/1.1 200").then_some(tcp)
    })
    .await;
    let _ = again.shutdown().await;
    drop(ws);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_global_cap_are_closed_until_one_ends() {
    let server = limited(|l| {
        l.max_connections = 4;
        l.max_connections_per_ip = 2;
    })
    .await;
    let addr = server.addr;
    let mut held = Vec::new();
    for from in ["127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.2"] {
        held.push(connect_from(ip(from), addr).await);
    }
    let mut fifth = connect_from(ip("127.0.0.3"), addr).await;
    assert!(
        closed_after(&mut fifth, Duration::from_secs(2)).await.is_some(),
        "a connection over the global cap was not closed"
    );
    held.remove(0);
    let mut later = eventually("a free slot", || async {
        let mut tcp = connect_from(ip("127.0.0.3"), addr).await;
        let req = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
        tcp.write_all(req).await.ok()?;
        let mut buf = [0u8; 12];
        tokio::time::timeout(WAIT, tcp.read_exact(&mut buf)).await.ok()?.ok()?;
        (&buf == b"HTTP/1.1 200").then_some(tcp)
    })
    .await;
    let mut rest = String::new();
    tokio::time::timeout(WAIT, later.read_to_string(&mut rest)).await.unwrap().unwrap();
    let refused: u64 = rest
        .lines()
        .find_map(|l| l.strip_prefix("millrace_connections_refused_total{reason=\"global\"} "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{rest}"));
    assert!(refused >= 1, "{rest}");
    drop(held);
    server.stop().await;
}

// ---- 3: job starts per connection and per IP ----

/// A WebSocket to `addr` from the local address `from`.
async fn ws_from(from: IpAddr, addr: SocketAddr) -> tokio_tungstenite::WebSocketStream<TcpStream> {
    let tcp = connect_from(from, addr).await;
    tokio_tungstenite::client_async(format!("ws://{addr}/ws"), tcp).await.unwrap().0
}

fn kline(base: &str) -> String {
    format!("kline@sim:spot:{base}/USDT:1m")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_starts_are_limited_per_connection_and_per_ip() {
    let mut config = test_config(vec![embedded_sim_source(1.0)]);
    config.ingest.ondemand_max_jobs = 1;
    config.limits.max_job_starts_per_min_per_connection = 3;
    config.limits.max_job_starts_per_min_per_ip = 5;
    let server = TestServer::start(config).await;
    let mut a = server.ws().await;
    // Subscribe/unsubscribe churn over several instruments: with room for one on-demand job,
    // each subscription evicts the last one and starts a job.
    let bases = ["BTC", "ETH", "SOL", "XRP", "ADA", "DOGE"];
    let mut served = Vec::new();
    for (i, base) in bases.iter().cycle().take(60).enumerate() {
        let id = i as u64 * 2 + 1;
        let r = request(&mut a, "SUBSCRIBE", &[&kline(base)], id).await;
        match r.error {
            None => served.push(*base),
            Some(e) => {
                assert_eq!(e.code, ErrorCode::TooManyJobStarts, "{}", e.msg);
                assert!(e.msg.contains("3 ingest jobs a minute"), "{}", e.msg);
            }
        }
        assert!(request(&mut a, "UNSUBSCRIBE", &[&kline(base)], id + 1).await.is_ok());
    }
    // Three starts (BTC, ETH, SOL: the last one still runs, idle), then only SOL, which joins
    // its running job at no cost.
    let mut want = vec!["BTC", "ETH"];
    want.extend(["SOL"; 10]);
    assert_eq!(served, want);
    let jobs = server.get_json("/api/v1/ops/jobs").await;
    assert_eq!(jobs["capacity"]["evictions"], 2, "{}", jobs["capacity"]);
    assert_eq!(jobs["jobs"][0]["instrument"], "sim:spot:SOL/USDT");

    // A second connection of the same address has its own 3, but the address only 2 left.
    let mut b = server.ws().await;
    assert!(request(&mut b, "SUBSCRIBE", &[&kline("BTC")], 1).await.is_ok());
    assert!(request(&mut b, "UNSUBSCRIBE", &[&kline("BTC")], 2).await.is_ok());
    let r = request(&mut b, "SUBSCRIBE", &[&kline("ETH"), &kline("SOL")], 3).await;
    let e = r.error.expect("over the address's starts");
    assert_eq!(e.code, ErrorCode::TooManyJobStarts);
    assert!(e.msg.contains("IP address may start 5"), "{}", e.msg);
    // Another address is not affected.
    let mut c = ws_from(ip("127.0.0.2"), server.addr).await;
    c.send(tokio_tungstenite::tungstenite::Message::Text(
        format!(r#"{{"method":"SUBSCRIBE","params":["{}"],"id":1}}"#, kline("XRP")).into(),
    ))
    .await
    .unwrap();
    let reply = loop {
        let msg = tokio::time::timeout(WAIT, c.next()).await.unwrap().unwrap().unwrap();
        if let tokio_tungstenite::tungstenite::Message::Text(t) = msg {
            if t.contains(r#""id":1"#) {
                break t.to_string();
            }
        }
    };
    assert_eq!(reply, r#"{"id":1,"result":null}"#);
    let metrics = server.get("/metrics").await.1;
    assert!(metrics.contains("millrace_subscriptions_refused_job_starts_total 49"), "{metrics}");
    server.stop().await;
}

/// A subscription refused for another reason (here: no on-demand capacity) started no job, so
/// it costs no job start: a client retrying it keeps its allowance for when it can be served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_refused_for_capacity_costs_no_job_start() {
    let mut config = test_config(vec![embedded_sim_source(1.0)]);
    config.ingest.ondemand_max_jobs = 1;
    config.limits.max_job_starts_per_min_per_connection = 2;
    config.limits.max_job_starts_per_min_per_ip = 3;
    let server = TestServer::start(config).await;
    // One connection holds the only on-demand job (one of the address's three starts).
    let mut holder = server.ws().await;
    assert!(request(&mut holder, "SUBSCRIBE", &[&kline("ETH")], 1).await.is_ok());
    // Another one retries a stream that has no room, more often than either allowance.
    let mut a = server.ws().await;
    for id in 1..=6 {
        let r = request(&mut a, "SUBSCRIBE", &[&kline("SOL"), &kline("XRP")], id).await;
        let e = r.error.expect("no room for another job");
        assert_eq!(e.code, ErrorCode::CapacityExhausted, "try {id}: {}", e.msg);
    }
    // Room again: the next try is served, from the allowance the refusals did not use.
    assert!(request(&mut holder, "UNSUBSCRIBE", &[&kline("ETH")], 2).await.is_ok());
    let r = request(&mut a, "SUBSCRIBE", &[&kline("SOL")], 7).await;
    assert!(r.is_ok(), "{:?}", r.error);
    let metrics = server.get("/metrics").await.1;
    assert!(metrics.contains("millrace_subscriptions_refused_job_starts_total 0"), "{metrics}");
    server.stop().await;
}
