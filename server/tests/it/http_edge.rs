//! The HTTP edge against hostile clients, over raw sockets: client addresses of a dual-stack
//! listener, and where the dashboard comes from.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use server::http::{Dashboard, ServeConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use testkit::*;

/// Longest a refusal that needs no waiting may take.
const PROMPT: Duration = Duration::from_secs(2);

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
