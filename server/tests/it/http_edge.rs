//! The HTTP edge against hostile clients, over raw sockets: admin requests checked before their
//! body is read (size and time limits on the body), failed admin attempts throttled per client
//! address, requests naming a host the server does not answer to (DNS rebinding), client
//! addresses of a dual-stack listener, and where the dashboard comes from.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use server::http::{Dashboard, ServeConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use testkit::*;

/// Longest a refusal that needs no waiting may take.
const PROMPT: Duration = Duration::from_secs(2);

const TOKEN: &str = "edge-admin-token";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A TCP connection to `addr` from the local address `from`.
async fn connect_from(from: IpAddr, addr: SocketAddr) -> TcpStream {
    let socket = match from {
        IpAddr::V4(_) => TcpSocket::new_v4(),
        IpAddr::V6(_) => TcpSocket::new_v6(),
    }
    .unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    socket.connect(addr).await.unwrap()
}

/// One HTTP response.
#[derive(Debug)]
struct Answer {
    status: u16,
    /// The head, lower case.
    head: String,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| l.strip_prefix(&format!("{name}: ")))
    }
}

/// Reads one response (a `Content-Length` body) from `tcp`; panics if it is not whole within
/// `within`.
async fn read_answer(tcp: &mut TcpStream, within: Duration) -> Answer {
    let deadline = tokio::time::Instant::now() + within;
    let mut raw = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = match tokio::time::timeout_at(deadline, tcp.read(&mut chunk)).await {
            Ok(Ok(n)) => n,
            Ok(Err(e)) => panic!("the connection failed before a response: {e}"),
            Err(_) => panic!("no response within {within:?}: {}", String::from_utf8_lossy(&raw)),
        };
        assert!(n > 0, "closed before a whole response: {}", String::from_utf8_lossy(&raw));
        raw.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&raw).into_owned();
        let Some((head, body)) = text.split_once("\r\n\r\n") else { continue };
        let head = head.to_ascii_lowercase();
        let length = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: ")?.trim().parse::<usize>().ok())
            .unwrap_or(0);
        if body.len() >= length {
            let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
            return Answer { status, head, body: body.to_string() };
        }
    }
}

/// Sends `request` on a new connection from `from` and reads the response.
async fn ask_from(from: IpAddr, addr: SocketAddr, request: &str) -> (Answer, TcpStream) {
    let mut tcp = connect_from(from, addr).await;
    tcp.write_all(request.as_bytes()).await.unwrap();
    let answer = read_answer(&mut tcp, PROMPT).await;
    (answer, tcp)
}

async fn ask(addr: SocketAddr, request: &str) -> Answer {
    ask_from(ip("127.0.0.1"), addr, request).await.0
}

/// Whether the server closes `tcp` within `within` (reading what it still sends).
async fn closes_within(tcp: &mut TcpStream, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout_at(deadline, tcp.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => continue,
        }
    }
}

/// The head of `POST path` with `auth` (a token, or none) and `extra` header lines.
fn post_head(path: &str, auth: Option<&str>, extra: &str) -> String {
    let auth = auth.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n{auth}{extra}\r\n"
    )
}

fn metric(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{metrics}"))
}

fn get(path: &str, host: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
}

// ---- the dashboard ----

/// With no `--static-dir`, the dashboard embedded in the binary is served (or none), never a
/// directory found at a path known when the binary was built.
#[test]
fn without_a_static_dir_the_embedded_dashboard_is_chosen() {
    let mut config = test_config(vec![]);
    config.server.static_dir = None;
    let serve = ServeConfig::new(config).unwrap();
    assert!(
        matches!(serve.dashboard, Dashboard::Embedded | Dashboard::Missing),
        "{:?}",
        serve.dashboard
    );
}

// ---- client addresses ----

/// A dual-stack listener sees an IPv4 client as `::ffff:a.b.c.d`, inside `::/64`, the /64 of
/// `::1`: each counts as its IPv4 address, never as that /64. (Only `::1` exists on loopback
/// here, so several addresses of one IPv6 /64 are covered by the unit tests of
/// `client_addr`, `http::conn` and `http::starts`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dual_stack_listener_counts_ipv4_clients_by_their_address_and_ipv6_ones_by_their_64() {
    let mut config = test_config(vec![embedded_sim_source(1.0)]);
    config.limits.max_connections_per_ip = 2;
    config.limits.header_read_timeout_ms = 30_000;
    let server = TestServer::start_on(config, "[::]:0".parse().unwrap()).await;
    let port = server.addr.port();
    let v6: SocketAddr = format!("[::1]:{port}").parse().unwrap();
    let v4: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let held = [connect_from(ip("::1"), v6).await, connect_from(ip("::1"), v6).await];
    let mut third = connect_from(ip("::1"), v6).await;
    assert!(closes_within(&mut third, PROMPT).await, "::/64 holds its 2");
    // IPv4 clients reach the same socket, each as itself.
    let held_v4 =
        [connect_from(ip("127.0.0.2"), v4).await, connect_from(ip("127.0.0.2"), v4).await];
    let mut over = connect_from(ip("127.0.0.2"), v4).await;
    assert!(closes_within(&mut over, PROMPT).await, "127.0.0.2 holds its 2");
    let (answer, _) = ask_from(ip("127.0.0.3"), v4, &get("/metrics", "localhost")).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("content-type"), Some("text/plain; version=0.0.4"));
    assert_eq!(metric(&answer.body, "millrace_connections_refused_total{reason=\"per_ip\"}"), 2);
    drop((held, held_v4));
    server.stop().await;
}

// ---- the Host allow-list (DNS rebinding) ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_naming_a_host_the_server_does_not_answer_to_are_refused() {
    let server = TestServer::start(test_config(vec![embedded_sim_source(1.0)])).await;
    let (addr, port) = (server.addr, server.addr.port());
    let evil = format!("rebound.evil.example:{port}");
    let upgrade = "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n";
    let mut refused = 0;
    // Every kind of request: REST, static files, /metrics, /healthz, the WebSocket upgrade.
    let paths = ["/", "/index.html", "/api/v1/series", "/api/v1/version", "/metrics", "/healthz"];
    for path in paths.iter().chain(&["/fapi/v1/depth?symbol=sim:stock:600000", "/nope.js"]) {
        let answer = ask(addr, &get(path, &evil)).await;
        assert_eq!(answer.status, 421, "{path}: {answer:?}");
        assert_eq!(answer.header("content-type"), Some("application/json"));
        assert!(
            answer.body.contains("\"host_not_allowed\"") && answer.body.contains("allowed_hosts")
        );
        refused += 1;
    }
    let ws = format!("GET /ws HTTP/1.1\r\nHost: {evil}\r\n{upgrade}\r\n");
    assert_eq!(ask(addr, &ws).await.status, 421, "the WebSocket is not upgraded");
    // A target in absolute form is checked too.
    let absolute = "GET http://rebound.evil.example/healthz HTTP/1.1\r\nHost: localhost\r\n\r\n";
    assert_eq!(ask(addr, absolute).await.status, 421);
    refused += 2;
    // The loopback names and the bound address, on any port, in any case.
    for host in [
        format!("localhost:{port}"),
        "LocalHost".to_string(),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
    ] {
        assert_eq!(ask(addr, &get("/healthz", &host)).await.status, 200, "{host}");
    }
    let ws = format!("GET /ws HTTP/1.1\r\nHost: localhost:{port}\r\n{upgrade}\r\n");
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(ws.as_bytes()).await.unwrap();
    let mut head = [0u8; 12];
    tokio::time::timeout(PROMPT, tcp.read_exact(&mut head)).await.unwrap().unwrap();
    assert_eq!(&head, b"HTTP/1.1 101");
    // HTTP/1.0 without Host (a tool, never a browser) is served; HTTP/1.1 needs one.
    assert_eq!(ask(addr, "GET /healthz HTTP/1.0\r\n\r\n").await.status, 200);
    assert_eq!(ask(addr, "GET /healthz HTTP/1.1\r\n\r\n").await.status, 400);
    let two = "GET /healthz HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\n\r\n";
    assert_eq!(ask(addr, two).await.status, 400);
    let metrics = server.get("/metrics").await.1;
    assert_eq!(metric(&metrics, "millrace_http_refused_host_total"), refused);
    server.stop().await;

    // Bound to another address: that address is allowed as well; a configured list replaces
    // the loopback names.
    let server = TestServer::start_on(
        test_config(vec![embedded_sim_source(1.0)]),
        "127.0.0.3:0".parse().unwrap(),
    )
    .await;
    let (addr, port) = (server.addr, server.addr.port());
    assert_eq!(ask(addr, &get("/healthz", &format!("127.0.0.3:{port}"))).await.status, 200);
    assert_eq!(ask(addr, &get("/healthz", &format!("127.0.0.4:{port}"))).await.status, 421);
    server.stop().await;
    let mut config = test_config(vec![embedded_sim_source(1.0)]);
    config.server.allowed_hosts = vec!["dash.example".into()];
    let server = TestServer::start_on(config, "127.0.0.3:0".parse().unwrap()).await;
    let addr = server.addr;
    assert_eq!(ask(addr, &get("/healthz", "dash.example:443")).await.status, 200);
    assert_eq!(ask(addr, &get("/healthz", "127.0.0.3")).await.status, 200, "bound");
    assert_eq!(ask(addr, &get("/healthz", "localhost")).await.status, 421, "not listed");
    server.stop().await;
}

// ---- admin requests: the token before the body; the body's size and time ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_requests_are_refused_before_their_body_is_read_and_bodies_are_bounded() {
    let mut config = test_config(vec![embedded_sim_source(1.0)]);
    config.server.admin_token = Some(TOKEN.into());
    config.limits.body_timeout_ms = 600;
    let server = TestServer::start(config).await;
    let (addr, local) = (server.addr, ip("127.0.0.1"));
    let stop = "/api/v1/admin/jobs/stop";

    // A body announced and never sent: without the token, refused at once, connection closed.
    for auth in [None, Some("not-the-token")] {
        let head = post_head(stop, auth, "Content-Length: 2000000\r\n");
        let (answer, mut tcp) = ask_from(local, addr, &head).await;
        assert_eq!(answer.status, 401, "{answer:?}");
        assert!(answer.body.contains("\"unauthorized\""), "{}", answer.body);
        assert!(closes_within(&mut tcp, PROMPT).await, "the connection stayed open");
    }

    // With the token: a body over the cap, by its length (not read) or as it arrives.
    let head = post_head(stop, Some(TOKEN), "Content-Length: 2000000\r\n");
    let (answer, mut tcp) = ask_from(local, addr, &head).await;
    assert_eq!(answer.status, 413, "{answer:?}");
    assert!(answer.body.contains("\"too_large\"") && answer.body.contains("4096"), "{answer:?}");
    assert!(closes_within(&mut tcp, PROMPT).await);
    let head = post_head(stop, Some(TOKEN), "Transfer-Encoding: chunked\r\n");
    let chunked = format!("{head}1388\r\n{}\r\n", "a".repeat(5000));
    let (answer, mut tcp) = ask_from(local, addr, &chunked).await;
    assert_eq!(answer.status, 413, "{answer:?}");
    assert!(closes_within(&mut tcp, PROMPT).await);

    // A body that trickles: 408 once limits.body_timeout_ms has passed, connection closed.
    let mut tcp = connect_from(local, addr).await;
    let head = post_head(stop, Some(TOKEN), "Content-Length: 64\r\n");
    tcp.write_all(format!("{head}{{\"instrument\"").as_bytes()).await.unwrap();
    let sent = Instant::now();
    let answer = read_answer(&mut tcp, Duration::from_secs(3)).await;
    let after = sent.elapsed();
    assert_eq!(answer.status, 408, "{answer:?}");
    assert!(answer.body.contains("\"timeout\"") && answer.body.contains("body_timeout_ms"));
    assert!(after >= Duration::from_millis(500), "408 after only {after:?}");
    assert_eq!(answer.header("connection"), Some("close"));
    assert!(closes_within(&mut tcp, PROMPT).await);

    // A whole, small body with the token is served.
    let body = r#"{"instrument":"sim:spot:NOPE/USDT"}"#;
    let head = post_head(stop, Some(TOKEN), &format!("Content-Length: {}\r\n", body.len()));
    let answer = ask(addr, &format!("{head}{body}")).await;
    assert_eq!(answer.status, 404, "{answer:?}");
    assert!(answer.body.contains("no job for sim:spot:NOPE/USDT"), "{answer:?}");

    let metrics = server.get("/metrics").await.1;
    assert_eq!(metric(&metrics, "millrace_admin_unauthorized_total"), 2);
    assert_eq!(metric(&metrics, "millrace_http_bodies_refused_total{reason=\"too_large\"}"), 2);
    assert_eq!(metric(&metrics, "millrace_http_bodies_refused_total{reason=\"timeout\"}"), 1);
    server.stop().await;
}

// ---- failed admin attempts, per client address ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_admin_attempts_are_throttled_per_client_address() {
    let mut config = test_config(vec![embedded_sim_source(1.0)]);
    config.server.admin_token = Some(TOKEN.into());
    config.limits.max_admin_failures_per_min_per_ip = 3;
    let server = TestServer::start(config).await;
    let addr = server.addr;
    let body = r#"{"instrument":"sim:spot:NOPE/USDT"}"#;
    let stop = |token: &str| {
        let head = post_head(
            "/api/v1/admin/jobs/stop",
            Some(token),
            &format!("Content-Length: {}\r\nConnection: close\r\n", body.len()),
        );
        format!("{head}{body}")
    };
    let (a, b) = (ip("127.0.0.1"), ip("127.0.0.2"));

    // Successful requests are never throttled.
    for _ in 0..12 {
        assert_eq!(ask_from(a, addr, &stop(TOKEN)).await.0.status, 404);
    }
    // Three failed attempts, then the address waits: even the right token is not compared.
    for guess in ["guess-1", "guess-2", "guess-3"] {
        assert_eq!(ask_from(a, addr, &stop(guess)).await.0.status, 401, "{guess}");
    }
    for token in ["guess-4", TOKEN] {
        let (answer, _) = ask_from(a, addr, &stop(token)).await;
        assert_eq!(answer.status, 429, "{answer:?}");
        assert!(answer.body.contains("\"too_many_attempts\""), "{answer:?}");
        assert_eq!(answer.header("retry-after"), Some("20"), "one attempt back every 20 s");
    }
    // The admin's view of ops/sources compares the token too, so it waits as well.
    let sources = format!(
        "GET /api/v1/ops/sources HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
    );
    assert_eq!(ask_from(a, addr, &sources).await.0.status, 429);
    // Another address is served, and has its own attempts.
    assert_eq!(ask_from(b, addr, &stop(TOKEN)).await.0.status, 404);
    assert_eq!(ask_from(b, addr, &stop("guess-1")).await.0.status, 401);
    let (answer, _) = ask_from(b, addr, &sources).await;
    assert_eq!(answer.status, 200);
    assert!(answer.body.contains("\"rest_base\":\"http://127.0.0.1:"), "{}", answer.body);

    let metrics = server.get("/metrics").await.1;
    assert_eq!(metric(&metrics, "millrace_admin_throttled_total"), 3);
    assert_eq!(metric(&metrics, "millrace_admin_unauthorized_total"), 4);
    server.stop().await;
}
