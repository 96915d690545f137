//! The server's own accept loop: every TCP connection is counted at accept, per client address
//! and in total, and timed while it waits for a request.
//!
//! - **Caps.** A connection over `limits.max_connections_per_ip` (its client address's open
//!   connections, HTTP and WebSocket alike; an IPv6 client counts by its /64, [`ClientAddr`]) or over `limits.max_connections` (all open connections) is closed
//!   at once and counted (`millrace_connections_refused_total{reason}`). The global cap stays
//!   below the open-file limit, which [`raise_nofile_limit`] raises to its hard limit at start,
//!   so `accept` keeps working and the server keeps answering other addresses while one address
//!   holds all it may.
//! - **Timeouts.** A connection waiting for a request head is closed when the head is not
//!   complete `limits.header_read_timeout_ms` after the connection opened or after the head's
//!   first byte (slowloris: headers sent a byte at a time, or never); a keep-alive connection
//!   idle between requests is closed after `limits.idle_timeout_ms`
//!   (`millrace_connections_timed_out_total{phase}`). A request being handled is not timed
//!   (its handler bounds it), and a WebSocket leaves this loop at its upgrade.
//!
//! The slot of a connection lives in its socket ([`TrackedIo`]), so a WebSocket keeps counting
//! against its IP after the upgrade, until it closes.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::Instant;
use tower::ServiceExt as _;

use crate::client_addr::ClientAddr;
use crate::config::LimitsConfig;
use crate::lock::lock;
use crate::metrics::Metrics;
use crate::shutdown::Shutdown;

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; returns the soft limit in force
/// (`u64::MAX` when unlimited).
pub fn raise_nofile_limit() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let r = getrlimit(Resource::Nofile);
    let Some(current) = r.current else { return u64::MAX };
    if r.maximum.is_none_or(|max| current < max)
        && setrlimit(Resource::Nofile, Rlimit { current: r.maximum, maximum: r.maximum }).is_ok()
    {
        return r.maximum.unwrap_or(u64::MAX);
    }
    current
}

/// File descriptors kept for the server's own files and sockets (store, bus, upstream
/// connections, static files being sent): a tenth of the limit, at least 256, at most 10,000.
pub fn headroom(nofile: u64) -> u64 {
    (nofile / 10).clamp(256, 10_000)
}

/// The connection caps and timeouts in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    pub max_connections: usize,
    pub max_per_ip: usize,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
}

/// `limits.max_connections` at or above the open-file limit.
#[derive(Debug, thiserror::Error)]
#[error("configuration key `limits.max_connections`: {max} must be below the open-file limit ({nofile}, ulimit -n), with room for the server's own files; leave it 0 to derive it ({derived} here)")]
pub struct CapOverFileLimit {
    pub max: usize,
    pub nofile: u64,
    pub derived: usize,
}

impl ConnLimits {
    /// The caps for an open-file limit of `nofile`: `limits.max_connections`, or, when 0, the
    /// limit minus [`headroom`]; the per-IP cap at most half the global one.
    pub fn new(limits: &LimitsConfig, nofile: u64) -> Result<Self, CapOverFileLimit> {
        let nofile_capped = nofile.min(10_000_000);
        let derived = nofile_capped.saturating_sub(headroom(nofile_capped)).max(1) as usize;
        let max_connections = match limits.max_connections {
            0 => derived,
            n if (n as u64) < nofile => n,
            n => return Err(CapOverFileLimit { max: n, nofile, derived }),
        };
        Ok(Self {
            max_connections,
            max_per_ip: limits.max_connections_per_ip.min((max_connections / 2).max(1)),
            header_read_timeout: Duration::from_millis(limits.header_read_timeout_ms),
            idle_timeout: Duration::from_millis(limits.idle_timeout_ms),
        })
    }
}

/// Open connections, in all and per client address.
pub struct Connections {
    limits: ConnLimits,
    table: Mutex<Table>,
    metrics: Arc<Metrics>,
}

#[derive(Default)]
struct Table {
    open: usize,
    per_ip: HashMap<ClientAddr, usize>,
}

/// Why a connection was closed at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refused {
    PerIp,
    Global,
}

/// A connection's place in [`Connections`]; released when dropped.
struct Slot {
    conns: Arc<Connections>,
    ip: ClientAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut t = lock(&self.conns.table);
        t.open -= 1;
        if let Some(n) = t.per_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                t.per_ip.remove(&self.ip);
            }
        }
        self.conns.metrics.connections.fetch_sub(1, Relaxed);
    }
}

impl Connections {
    pub fn new(limits: ConnLimits, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Self { limits, table: Mutex::default(), metrics })
    }

    pub fn limits(&self) -> ConnLimits {
        self.limits
    }

    /// A slot for a new connection from `ip`, if both caps allow it.
    fn admit(self: &Arc<Self>, ip: ClientAddr) -> Result<Slot, Refused> {
        let mut t = lock(&self.table);
        if t.open >= self.limits.max_connections {
            self.metrics.connections_refused_global.fetch_add(1, Relaxed);
            return Err(Refused::Global);
        }
        let n = t.per_ip.get(&ip).copied().unwrap_or(0);
        if n >= self.limits.max_per_ip {
            self.metrics.connections_refused_per_ip.fetch_add(1, Relaxed);
            return Err(Refused::PerIp);
        }
        t.per_ip.insert(ip, n + 1);
        t.open += 1;
        self.metrics.connections.fetch_add(1, Relaxed);
        self.metrics.connections_total.fetch_add(1, Relaxed);
        Ok(Slot { conns: self.clone(), ip })
    }
}

/// What a connection is doing, for its timeouts.
const WAITING_HEAD: u8 = 0;
const IN_REQUEST: u8 = 1;
const IDLE: u8 = 2;

/// A connection's phase and the deadline of that phase.
struct Clock {
    /// Fast path of the read side (which only cares about `IDLE`).
    phase: AtomicU8,
    state: Mutex<(u8, Instant)>,
    changed: Notify,
    header: Duration,
    idle: Duration,
}

/// Which timeout closed a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expired {
    Header,
    Idle,
}

impl Clock {
    /// A new connection waits for its first request head.
    fn new(limits: &ConnLimits) -> Self {
        Self {
            phase: AtomicU8::new(WAITING_HEAD),
            state: Mutex::new((WAITING_HEAD, Instant::now() + limits.header_read_timeout)),
            changed: Notify::new(),
            header: limits.header_read_timeout,
            idle: limits.idle_timeout,
        }
    }

    fn set(&self, phase: u8, deadline: Instant) {
        *lock(&self.state) = (phase, deadline);
        self.phase.store(phase, Ordering::Release);
        self.changed.notify_waiters();
    }

    /// Bytes arrived: on an idle connection, a request head has begun.
    fn bytes_read(&self) {
        if self.phase.load(Ordering::Acquire) == IDLE {
            let mut s = lock(&self.state);
            if s.0 == IDLE {
                *s = (WAITING_HEAD, Instant::now() + self.header);
                self.phase.store(WAITING_HEAD, Ordering::Release);
                drop(s);
                self.changed.notify_waiters();
            }
        }
    }

    fn request_started(&self) {
        self.set(IN_REQUEST, Instant::now());
    }

    fn request_done(&self) {
        self.set(IDLE, Instant::now() + self.idle);
    }

    /// Completes when the phase's deadline passes (never while a request is handled).
    async fn expired(&self) -> Expired {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let (phase, deadline) = *lock(&self.state);
            if phase != IN_REQUEST && Instant::now() >= deadline {
                return if phase == IDLE { Expired::Idle } else { Expired::Header };
            }
            if phase == IN_REQUEST {
                changed.await;
            } else {
                tokio::select! {
                    () = &mut changed => {}
                    () = tokio::time::sleep_until(deadline) => {}
                }
            }
        }
    }
}

/// A client socket with its slot and its clock.
struct TrackedIo {
    stream: TcpStream,
    clock: Arc<Clock>,
    _slot: Slot,
}

impl AsyncRead for TrackedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.clock.bytes_read();
        }
        r
    }
}

impl AsyncWrite for TrackedIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Marks the end of a request when dropped: with its response body (sent, or abandoned), or
/// with the handler's future if the connection goes first.
struct RequestDone(Arc<Clock>);

impl Drop for RequestDone {
    fn drop(&mut self) {
        self.0.request_done();
    }
}

/// A response body that marks its request done when dropped.
struct TrackedBody {
    inner: Body,
    _done: RequestDone,
}

impl http_body::Body for TrackedBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The router, for one connection: adds the peer's address (`ConnectInfo`) and times requests.
#[derive(Clone)]
struct ConnService {
    router: Router,
    peer: SocketAddr,
    clock: Arc<Clock>,
}

type ServiceFuture =
    Pin<Box<dyn Future<Output = Result<axum::response::Response, Infallible>> + Send>>;

impl hyper::service::Service<hyper::Request<Incoming>> for ConnService {
    type Response = axum::response::Response;
    type Error = Infallible;
    type Future = ServiceFuture;

    fn call(&self, req: hyper::Request<Incoming>) -> Self::Future {
        self.clock.request_started();
        let done = RequestDone(self.clock.clone());
        let mut req = req.map(Body::new);
        req.extensions_mut().insert(ConnectInfo(self.peer));
        let response = self.router.clone().oneshot(req);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|inner| Body::new(TrackedBody { inner, _done: done })))
        })
    }
}

/// Is this `accept` error about one connection only (the next accept may well succeed)?
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Accepts connections on `listener` and serves `router` on them, until `http` stops. Each
/// connection runs as a task of `http`: on stop, idle ones close and requests in progress
/// finish.
pub async fn accept_loop(
    listener: TcpListener,
    router: Router,
    conns: Arc<Connections>,
    http: Shutdown,
) {
    let metrics = conns.metrics.clone();
    loop {
        let accepted = tokio::select! {
            () = http.stopping() => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                metrics.accept_errors.fetch_add(1, Relaxed);
                if !is_connection_error(&e) {
                    // Out of file descriptors (the global cap keeps clients from getting here)
                    // or of memory: wait a little for some to be freed.
                    tracing::error!("accept failed: {e}");
                    tokio::select! {
                        () = http.stopping() => return,
                        () = tokio::time::sleep(Duration::from_millis(100)) => {}
                    }
                }
                continue;
            }
        };
        let slot = match conns.admit(ClientAddr::of(peer.ip())) {
            Ok(slot) => slot,
            Err(why) => {
                tracing::debug!(%peer, ?why, "connection closed at accept");
                drop(stream);
                continue;
            }
        };
        let clock = Arc::new(Clock::new(&conns.limits));
        let io = TokioIo::new(TrackedIo { stream, clock: clock.clone(), _slot: slot });
        let service = ConnService { router: router.clone(), peer, clock: clock.clone() };
        let stop = http.clone();
        let metrics = metrics.clone();
        http.spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .with_upgrades();
            tokio::pin!(conn);
            let mut draining = false;
            loop {
                tokio::select! {
                    result = conn.as_mut() => {
                        if let Err(e) = result {
                            tracing::debug!(%peer, "connection failed: {e}");
                        }
                        break;
                    }
                    expired = clock.expired() => {
                        let counter = match expired {
                            Expired::Header => &metrics.connections_header_timeouts,
                            Expired::Idle => &metrics.connections_idle_timeouts,
                        };
                        counter.fetch_add(1, Relaxed);
                        tracing::debug!(%peer, ?expired, "closing a connection that timed out");
                        break;
                    }
                    () = stop.stopping(), if !draining => {
                        draining = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_cap_leaves_room_below_the_file_limit() {
        let limits = LimitsConfig::default();
        let l = ConnLimits::new(&limits, 20_000).unwrap();
        assert_eq!(l.max_connections, 18_000);
        assert_eq!(l.max_per_ip, 512, "far below the global cap");
        let small = ConnLimits::new(&limits, 800).unwrap();
        assert_eq!((small.max_connections, small.max_per_ip), (544, 272), "at most half of it");
        assert_eq!(ConnLimits::new(&limits, 1024).unwrap().max_connections, 768);
        assert_eq!(ConnLimits::new(&limits, 1 << 20).unwrap().max_connections, (1 << 20) - 10_000);
        assert!(ConnLimits::new(&limits, u64::MAX).is_ok());
        let explicit = LimitsConfig { max_connections: 500, ..LimitsConfig::default() };
        assert_eq!(ConnLimits::new(&explicit, 1024).unwrap().max_connections, 500);
        let over = LimitsConfig { max_connections: 1024, ..LimitsConfig::default() };
        let e = ConnLimits::new(&over, 1024).unwrap_err().to_string();
        assert!(e.contains("limits.max_connections") && e.contains("1024"), "{e}");
    }

    /// The cap counts client addresses ([`ClientAddr`]): every address of an IPv6 /64 together,
    /// an IPv4 client the same whether it reached an IPv4 or a dual-stack socket.
    #[test]
    fn the_per_address_cap_counts_an_ipv6_64_as_one_client() {
        let limits = LimitsConfig { max_connections_per_ip: 2, ..LimitsConfig::default() };
        let conns = Connections::new(ConnLimits::new(&limits, 1024).unwrap(), Arc::default());
        let admit = |ip: &str| conns.admit(ClientAddr::of(ip.parse().unwrap()));
        let held = [admit("2001:db8:7:7::1").unwrap(), admit("2001:db8:7:7::2").unwrap()];
        assert_eq!(admit("2001:db8:7:7:abcd::3").err(), Some(Refused::PerIp));
        assert_eq!(admit("2001:db8:7:7:ffff:ffff:ffff:ffff").err(), Some(Refused::PerIp));
        let next_64 = admit("2001:db8:7:8::1").unwrap();
        let v4 = [admit("192.0.2.1").unwrap(), admit("::ffff:192.0.2.1").unwrap()];
        assert_eq!(admit("192.0.2.1").err(), Some(Refused::PerIp), "mapped: the same client");
        let other_v4 = admit("::ffff:192.0.2.2").unwrap();
        drop(held);
        let again = admit("2001:db8:7:7::99").unwrap();
        assert_eq!(conns.metrics.connections_refused_per_ip.load(Relaxed), 3);
        drop((next_64, v4, other_v4, again));
        assert!(lock(&conns.table).per_ip.is_empty(), "released slots leave no entry");
    }

    #[test]
    fn raising_the_file_limit_reaches_the_hard_limit() {
        let soft = raise_nofile_limit();
        let hard = rustix::process::getrlimit(rustix::process::Resource::Nofile).maximum;
        assert_eq!(soft, hard.unwrap_or(u64::MAX));
    }
}
