//! `millrace-fanout clients`: N WebSocket connections in this process.
//!
//! Each connection is a task on a multi-threaded tokio runtime: TCP connect, the WebSocket
//! handshake, then — unless `--idle` — one `SUBSCRIBE` request for its `--streams-per-client`
//! streams, waiting for the `{"id":1,"result":null}` reply. The WebSocket client is a minimal
//! built-in one (handshake, masked frames out, frames parsed in place from one buffer), because
//! the clients share the machine's cores with the server and tungstenite's client costs more
//! (it zero-fills its read buffer before every read and copies each payload): at 1 M
//! deliveries/s it took 0.96 cores against 0.77, leaving the server less (docs/bench-fanout.md).
//! `--tungstenite` uses tokio-tungstenite instead, as a cross-check. Connection
//! `i` takes topics `i·K, i·K+1, … (mod topics)`, so every topic has the same number of
//! subscribers when `clients × K` is a multiple of the topic count. At most
//! `--connect-concurrency` handshakes are in flight (the server's accept queue stays short).
//!
//! Every push frame received is counted (frames and bytes). Frames of the publisher (forming
//! candles, `"x":false`) also give a latency sample `receive wall-clock − E·1000` µs, recorded in
//! a histogram (±3 %); closed candles (`"x":true`) come from the service's own ingest jobs and
//! are counted apart. Parsing is cheap: `E` is found by a byte search, nothing else is decoded.
//! A close with code 4000 (`lagging`) or any other close or read error ends the connection and
//! is counted; clients do not reconnect, so `alive` shows what is left.
//!
//! Counters are sharded atomics (relaxed); a measurement window is the difference of two
//! snapshots. Timed mode (default): after all connections are up, wait `--warmup`, measure for
//! `--duration`, print `REPORT {...}` and exit. `--control`: stdin commands `mark` (start a
//! window, answers `MARKED`), `report` (answers `REPORT {...}` for the window since the last
//! `mark`) and `quit` (or end of input).

use std::io::BufRead as _;
use std::net::SocketAddr;
use std::sync::atomic::{
    AtomicI64, AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures_util::{SinkExt as _, StreamExt as _};
use serde_json::json;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;

use crate::common::{
    emit, parse_duration, raise_nofile_limit, topic_series, wall_us, AtomicHistogram, Histogram,
    MAX_TOPICS,
};

/// Options of `clients`.
#[derive(Debug, Clone, clap::Args)]
pub struct ClientsOpts {
    /// The server's WebSocket URL, e.g. ws://127.0.0.1:9000/ws.
    #[arg(long)]
    pub url: String,
    /// Connections to open.
    #[arg(long, default_value_t = 5000)]
    pub clients: usize,
    /// Streams each connection subscribes to (at most --topics).
    #[arg(long, default_value_t = 1)]
    pub streams_per_client: usize,
    /// Topics the server publishes on (as its --topics).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=MAX_TOPICS as u64))]
    pub topics: u64,
    /// Connect only: no subscription (for memory per idle connection).
    #[arg(long)]
    pub idle: bool,
    /// Timed mode: measurement window after the warm-up.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Timed mode: wait this long after every connection is up before measuring.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Take commands on stdin (mark | report | quit) instead of the timed run.
    #[arg(long)]
    pub control: bool,
    /// Handshakes in flight at once.
    #[arg(long, default_value_t = 256)]
    pub connect_concurrency: usize,
    /// Tokio worker threads (default: one per core).
    #[arg(long)]
    pub worker_threads: Option<usize>,
    /// Read buffer per connection (bytes read per syscall at most).
    #[arg(long, default_value_t = 16 * 1024)]
    pub read_buffer: usize,
    /// Use tokio-tungstenite for the connections instead of the built-in minimal client (a
    /// cross-check; it costs the clients process more CPU, which the server then lacks).
    #[arg(long)]
    pub tungstenite: bool,
    /// Print deliveries per second on stderr every second.
    #[arg(long)]
    pub progress: bool,
}

/// Counter shards, so two worker threads rarely touch the same cache line.
const SHARDS: usize = 32;

#[repr(align(128))]
#[derive(Default)]
struct Shard {
    /// Push frames received (`{"stream":…`).
    frames: AtomicU64,
    /// Of which the publisher's (forming candles): these have a latency sample.
    synthetic: AtomicU64,
    bytes: AtomicU64,
    latency_us: AtomicHistogram,
    /// Samples with receive time before `E` (clock trouble; recorded as 0).
    negative: AtomicU64,
}

#[derive(Default)]
struct Shared {
    shards: Vec<Shard>,
    connected: AtomicU64,
    subscribed: AtomicU64,
    failed: AtomicU64,
    first_error: Mutex<Option<String>>,
    alive: AtomicI64,
    lagging_closes: AtomicU64,
    other_closes: AtomicU64,
    read_errors: AtomicU64,
    /// Largest latency since the last `mark`.
    max_latency_us: AtomicU64,
}

/// Counters at one instant.
struct Snapshot {
    at: Instant,
    frames: u64,
    synthetic: u64,
    bytes: u64,
    negative: u64,
    latency: Histogram,
}

impl Shared {
    fn snapshot(&self) -> Snapshot {
        let mut s = Snapshot {
            at: Instant::now(),
            frames: 0,
            synthetic: 0,
            bytes: 0,
            negative: 0,
            latency: Histogram::default(),
        };
        for sh in &self.shards {
            // A frame bumps `frames` before `synthetic`, so reading them in the
            // other order keeps `synthetic <= frames` in one snapshot.
            s.synthetic += sh.synthetic.load(Acquire);
            s.frames += sh.frames.load(Acquire);
            s.bytes += sh.bytes.load(Relaxed);
            s.negative += sh.negative.load(Relaxed);
            sh.latency_us.add_to(&mut s.latency);
        }
        s
    }

    fn fail(&self, e: impl std::fmt::Display) {
        self.failed.fetch_add(1, Relaxed);
        let mut first = self.first_error.lock().unwrap_or_else(|p| p.into_inner());
        if first.is_none() {
            *first = Some(e.to_string());
        }
    }

    /// The report of the window from `start` to now.
    fn report(&self, start: &Snapshot) -> serde_json::Value {
        let now = self.snapshot();
        let secs = now.at.duration_since(start.at).as_secs_f64().max(1e-9);
        let frames = now.frames - start.frames;
        let synthetic = now.synthetic - start.synthetic;
        let lat = now.latency.since(&start.latency);
        json!({
            "window_s": secs,
            "frames": frames,
            "synthetic": synthetic,
            "closed_candles": frames.saturating_sub(synthetic),
            "bytes": now.bytes - start.bytes,
            "deliveries_per_s": frames as f64 / secs,
            "mbytes_per_s": (now.bytes - start.bytes) as f64 / secs / 1e6,
            "latency_us": {
                "count": lat.count(),
                "p50": lat.quantile(0.50),
                "p90": lat.quantile(0.90),
                "p99": lat.quantile(0.99),
                "p999": lat.quantile(0.999),
                "max": self.max_latency_us.load(Relaxed),
                "mean": lat.mean(),
            },
            "negative_latency": now.negative - start.negative,
            "alive": self.alive.load(Relaxed),
            "connected": self.connected.load(Relaxed),
            "subscribed": self.subscribed.load(Relaxed),
            "failed": self.failed.load(Relaxed),
            "first_error": *self.first_error.lock().unwrap_or_else(|p| p.into_inner()),
            "lagging_closes": self.lagging_closes.load(Relaxed),
            "other_closes": self.other_closes.load(Relaxed),
            "read_errors": self.read_errors.load(Relaxed),
        })
    }
}

/// Finds `"E":` and parses the integer after it.
#[inline]
fn event_time(frame: &[u8]) -> Option<i64> {
    const KEY: &[u8] = b"\"E\":";
    let at = frame.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let mut v: i64 = 0;
    let mut any = false;
    for &b in &frame[at..] {
        if !b.is_ascii_digit() {
            break;
        }
        v = v * 10 + (b - b'0') as i64;
        any = true;
    }
    any.then_some(v)
}

/// Is this a closed candle (`"x":true` near the end)?
#[inline]
fn is_closed(frame: &[u8]) -> bool {
    let tail = &frame[frame.len().saturating_sub(16)..];
    tail.windows(8).any(|w| w == b"\"x\":true")
}

#[inline]
fn on_frame(frame: &[u8], shard: &Shard, shared: &Shared) {
    if !frame.starts_with(b"{\"stream\"") {
        return; // a reply, not a push
    }
    let received = wall_us();
    shard.frames.fetch_add(1, Release);
    shard.bytes.fetch_add(frame.len() as u64, Relaxed);
    if is_closed(frame) {
        return;
    }
    let Some(e) = event_time(frame) else { return };
    shard.synthetic.fetch_add(1, Release);
    let mut lat = received - e * 1000;
    if lat < 0 {
        shard.negative.fetch_add(1, Relaxed);
        lat = 0;
    }
    shard.latency_us.record(lat as u64);
    shared.max_latency_us.fetch_max(lat as u64, Relaxed);
}

type Ws = tokio_tungstenite::WebSocketStream<TcpStream>;

// ---- the minimal client ---------------------------------------------------------------------
//
// RFC 6455 as far as this server needs it: the opening handshake with a fixed key, masked text
// frames out, unmasked frames in (text, close, ping; the server never fragments), parsed in
// place from one reusable buffer — no per-read zeroing and no per-frame allocation.

/// Sends `payload` as one masked client frame with `opcode`.
async fn send_frame(
    tcp: &mut TcpStream,
    opcode: u8,
    payload: &[u8],
    mask: [u8; 4],
) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt as _;
    let mut f = Vec::with_capacity(payload.len() + 14);
    f.push(0x80 | opcode);
    match payload.len() {
        n if n < 126 => f.push(0x80 | n as u8),
        n if n <= 0xffff => {
            f.push(0x80 | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            f.push(0x80 | 127);
            f.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    tcp.write_all(&f).await
}

/// One parsed server frame: opcode, payload range in the buffer, total length.
struct RawFrame {
    fin: bool,
    opcode: u8,
    payload: std::ops::Range<usize>,
    len: usize,
}

/// Parses the frame at the start of `b`, if it is complete.
#[inline]
fn parse_frame(b: &[u8]) -> Result<Option<RawFrame>, String> {
    if b.len() < 2 {
        return Ok(None);
    }
    let fin = b[0] & 0x80 != 0;
    let opcode = b[0] & 0x0f;
    if b[1] & 0x80 != 0 {
        return Err("masked frame from the server".into());
    }
    let (header, n) = match b[1] & 0x7f {
        126 if b.len() >= 4 => (4, u16::from_be_bytes([b[2], b[3]]) as usize),
        127 if b.len() >= 10 => {
            (10, u64::from_be_bytes(b[2..10].try_into().expect("8 bytes")) as usize)
        }
        126 | 127 => return Ok(None),
        n => (2, n as usize),
    };
    if b.len() < header + n {
        return Ok(None);
    }
    Ok(Some(RawFrame { fin, opcode, payload: header..header + n, len: header + n }))
}

/// Connects and completes the opening handshake; returns the socket and any bytes read past
/// the response.
async fn open_raw(
    addr: SocketAddr,
    host: &str,
    path: &str,
) -> anyhow::Result<(TcpStream, Vec<u8>)> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut tcp = TcpStream::connect(addr).await.context("connect")?;
    tcp.set_nodelay(true)?;
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    tcp.write_all(req.as_bytes()).await.context("send handshake")?;
    let mut buf = Vec::with_capacity(1024);
    loop {
        let mut chunk = [0u8; 1024];
        let n = tcp.read(&mut chunk).await.context("read handshake")?;
        anyhow::ensure!(n > 0, "closed during the handshake");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            anyhow::ensure!(
                head.starts_with("HTTP/1.1 101"),
                "handshake refused: {}",
                head.lines().next().unwrap_or("")
            );
            // RFC 6455 4.2.2: the accept value for the fixed key above.
            anyhow::ensure!(
                head.contains("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
                "bad Sec-WebSocket-Accept"
            );
            return Ok((tcp, buf.split_off(end + 4)));
        }
        anyhow::ensure!(buf.len() < 16 * 1024, "handshake response too long");
    }
}

/// Where and how every connection connects.
struct Dial {
    addr: SocketAddr,
    /// `host:port` and path of the URL (the raw client's request line and Host header).
    host: String,
    path: String,
    url: String,
    read_buffer: usize,
    /// Limits handshakes in flight.
    gate: tokio::sync::Semaphore,
    /// For `--tungstenite`.
    config: WebSocketConfig,
}

async fn connection(i: usize, dial: Arc<Dial>, request: Option<String>, shared: Arc<Shared>) {
    use tokio::io::AsyncReadExt as _;
    let mut permit = Some(dial.gate.acquire().await.expect("the gate is never closed"));
    let mask = (i as u32).wrapping_mul(0x9E37_79B9).to_le_bytes();
    let (mut tcp, leftover) = match open_raw(dial.addr, &dial.host, &dial.path).await {
        Ok(r) => r,
        Err(e) => return shared.fail(format!("{e:#}")),
    };
    if let Some(req) = &request {
        if let Err(e) = send_frame(&mut tcp, 0x1, req.as_bytes(), mask).await {
            return shared.fail(format!("send SUBSCRIBE: {e}"));
        }
    } else {
        permit = None;
    }
    shared.connected.fetch_add(1, Relaxed);
    shared.alive.fetch_add(1, Relaxed);
    let shard = &shared.shards[i % SHARDS];
    let mut buf = vec![0u8; dial.read_buffer.max(leftover.len()).max(1024)];
    buf[..leftover.len()].copy_from_slice(&leftover);
    let (mut start, mut end) = (0usize, leftover.len());
    let outcome: Result<(), String> = 'conn: loop {
        loop {
            let frame = match parse_frame(&buf[start..end]) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => break 'conn Err(e),
            };
            if !frame.fin {
                break 'conn Err("fragmented frame".into());
            }
            let payload = &buf[start + frame.payload.start..start + frame.payload.end];
            match frame.opcode {
                0x1 => {
                    if permit.is_some() && payload.starts_with(b"{\"id\"") {
                        if payload.windows(7).any(|w| w == b"\"error\"") {
                            shared.alive.fetch_sub(1, Relaxed);
                            shared.connected.fetch_sub(1, Relaxed);
                            return shared.fail(format!(
                                "SUBSCRIBE refused: {}",
                                String::from_utf8_lossy(payload)
                            ));
                        }
                        permit = None;
                        shared.subscribed.fetch_add(1, Relaxed);
                    } else {
                        on_frame(payload, shard, &shared);
                    }
                }
                0x8 => {
                    let code =
                        (payload.len() >= 2).then(|| u16::from_be_bytes([payload[0], payload[1]]));
                    if code == Some(4000) {
                        shared.lagging_closes.fetch_add(1, Relaxed);
                    } else {
                        shared.other_closes.fetch_add(1, Relaxed);
                    }
                    break 'conn Ok(());
                }
                0x9 => {
                    let pong = payload.to_vec();
                    if let Err(e) = send_frame(&mut tcp, 0xA, &pong, mask).await {
                        break 'conn Err(e.to_string());
                    }
                }
                _ => {}
            }
            start += frame.len;
        }
        // Keep the unparsed tail at the front; grow for a frame larger than the buffer.
        if start > 0 {
            buf.copy_within(start..end, 0);
            end -= start;
            start = 0;
        }
        if end == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        match tcp.read(&mut buf[end..]).await {
            Ok(0) => break 'conn Err("connection closed without a close frame".into()),
            Ok(n) => end += n,
            Err(e) => break 'conn Err(e.to_string()),
        }
    };
    if outcome.is_err() {
        shared.read_errors.fetch_add(1, Relaxed);
    }
    if permit.is_some() {
        shared.fail(format!("no SUBSCRIBE reply: {outcome:?}"));
    }
    shared.alive.fetch_sub(1, Relaxed);
}

/// Connects, shakes hands and subscribes.
async fn open(
    url: &str,
    addr: SocketAddr,
    config: WebSocketConfig,
    request: Option<&str>,
) -> anyhow::Result<Ws> {
    let stream = TcpStream::connect(addr).await.context("connect")?;
    stream.set_nodelay(true)?;
    let (mut ws, _) = tokio_tungstenite::client_async_with_config(url, stream, Some(config))
        .await
        .context("handshake")?;
    if let Some(req) = request {
        ws.send(Message::Text(req.into())).await.context("send SUBSCRIBE")?;
        loop {
            match ws.next().await {
                Some(Ok(Message::Text(t))) if t.starts_with("{\"id\"") => {
                    anyhow::ensure!(!t.contains("\"error\""), "SUBSCRIBE refused: {t}");
                    break;
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => anyhow::bail!("waiting for the SUBSCRIBE reply: {e}"),
                None => anyhow::bail!("closed before the SUBSCRIBE reply"),
            }
        }
    }
    Ok(ws)
}

async fn connection_tungstenite(
    i: usize,
    dial: Arc<Dial>,
    request: Option<String>,
    shared: Arc<Shared>,
) {
    let permit = dial.gate.acquire().await.expect("the gate is never closed");
    let mut ws = match open(&dial.url, dial.addr, dial.config, request.as_deref()).await {
        Ok(ws) => ws,
        Err(e) => {
            shared.fail(format!("{e:#}"));
            return;
        }
    };
    drop(permit);
    shared.connected.fetch_add(1, Relaxed);
    if request.is_some() {
        shared.subscribed.fetch_add(1, Relaxed);
    }
    shared.alive.fetch_add(1, Relaxed);
    let shard = &shared.shards[i % SHARDS];
    while let Some(msg) = ws.next().await {
        match msg {
            Ok(Message::Text(t)) => on_frame(t.as_bytes(), shard, &shared),
            Ok(Message::Close(frame)) => {
                if frame.is_some_and(|f| u16::from(f.code) == 4000) {
                    shared.lagging_closes.fetch_add(1, Relaxed);
                } else {
                    shared.other_closes.fetch_add(1, Relaxed);
                }
                break;
            }
            Ok(_) => {}
            Err(_) => {
                shared.read_errors.fetch_add(1, Relaxed);
                break;
            }
        }
    }
    shared.alive.fetch_sub(1, Relaxed);
}

pub fn main(opts: ClientsOpts) -> anyhow::Result<()> {
    raise_nofile_limit();
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    rt.enable_all();
    if let Some(n) = opts.worker_threads {
        rt.worker_threads(n.max(1));
    }
    let rt = rt.build().context("cannot start the tokio runtime")?;
    let result = rt.block_on(run(opts));
    // Exit without closing thousands of sockets one by one (the kernel does it).
    rt.shutdown_background();
    result
}

async fn run(opts: ClientsOpts) -> anyhow::Result<()> {
    let k = opts.streams_per_client;
    anyhow::ensure!(
        opts.idle || (1..=opts.topics as usize).contains(&k),
        "--streams-per-client must be between 1 and --topics ({})",
        opts.topics
    );
    let rest = opts.url.strip_prefix("ws://").context("--url must start with ws://")?;
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let addr: SocketAddr = tokio::net::lookup_host(host)
        .await?
        .next()
        .with_context(|| format!("cannot resolve {host}"))?;
    let dial = Arc::new(Dial {
        addr,
        host: host.to_string(),
        path: path.to_string(),
        url: opts.url.clone(),
        read_buffer: opts.read_buffer.max(1024),
        gate: tokio::sync::Semaphore::new(opts.connect_concurrency.max(1)),
        config: WebSocketConfig::default().read_buffer_size(opts.read_buffer.max(1024)),
    });
    let topics: Vec<String> =
        topic_series(opts.topics as usize).iter().map(|s| format!("kline@{s}")).collect();
    let shared = Arc::new(Shared {
        shards: (0..SHARDS).map(|_| Shard::default()).collect(),
        ..Shared::default()
    });
    let started = Instant::now();
    for i in 0..opts.clients {
        let request = (!opts.idle).then(|| {
            let params: Vec<&str> =
                (0..k).map(|j| topics[(i * k + j) % topics.len()].as_str()).collect();
            json!({ "method": "SUBSCRIBE", "params": params, "id": 1 }).to_string()
        });
        if opts.tungstenite {
            tokio::spawn(connection_tungstenite(i, dial.clone(), request, shared.clone()));
        } else {
            tokio::spawn(connection(i, dial.clone(), request, shared.clone()));
        }
    }
    // Wait until every connection is up (or failed).
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let up = if opts.idle { &shared.connected } else { &shared.subscribed };
        let done = up.load(Relaxed) + shared.failed.load(Relaxed);
        if done >= opts.clients as u64 {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {done} of {} connections done after 300 s",
            opts.clients
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let setup = json!({
        "connected": shared.connected.load(Relaxed),
        "subscribed": shared.subscribed.load(Relaxed),
        "failed": shared.failed.load(Relaxed),
        "first_error": *shared.first_error.lock().unwrap_or_else(|p| p.into_inner()),
        "elapsed_ms": started.elapsed().as_millis() as u64,
        "pid": std::process::id(),
    });
    emit(if opts.idle { "CONNECTED" } else { "SUBSCRIBED" }, setup);

    if opts.progress {
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut last = shared.snapshot();
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let now = shared.snapshot();
                let secs = now.at.duration_since(last.at).as_secs_f64();
                eprintln!(
                    "clients: {:>10.0} deliveries/s, alive {}, lagging closes {}",
                    (now.frames - last.frames) as f64 / secs,
                    shared.alive.load(Relaxed),
                    shared.lagging_closes.load(Relaxed)
                );
                last = now;
            }
        });
    }

    if opts.control {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        std::thread::Builder::new().name("clients-control".into()).spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        })?;
        let mut start = shared.snapshot();
        while let Some(line) = rx.recv().await {
            match line.trim() {
                "mark" => {
                    start = shared.snapshot();
                    shared.max_latency_us.store(0, Relaxed);
                    emit("MARKED", json!({}));
                }
                "report" => emit("REPORT", shared.report(&start)),
                "quit" => break,
                "" => {}
                other => emit(
                    "ERROR",
                    json!({ "msg": format!("unknown command {other:?}; use mark | report | quit") }),
                ),
            }
        }
    } else {
        tokio::time::sleep(opts.warmup).await;
        let start = shared.snapshot();
        shared.max_latency_us.store(0, Relaxed);
        tokio::time::sleep(opts.duration).await;
        emit("REPORT", shared.report(&start));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_real_frame() {
        let series: shared::protocol::SeriesId = "sim:spot:BTC/USDT:1m".parse().unwrap();
        let p = shared::Price::parse("90000.01").unwrap();
        let c = shared::candle::Candle::one_minute(
            1_700_000_040_000,
            p,
            p,
            p,
            p,
            shared::Volume::from_raw(5),
            3,
        );
        let open = server::candles::writer::kline_frame(&series, &c, false, 1_700_000_041_234);
        assert_eq!(event_time(&open), Some(1_700_000_041_234));
        assert!(!is_closed(&open));
        let closed = server::candles::writer::kline_frame(&series, &c, true, 1_700_000_100_000);
        assert!(is_closed(&closed));
        assert!(open.starts_with(b"{\"stream\""));
    }

    /// An unmasked server frame as tungstenite's server writes it.
    fn server_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0x80 | opcode];
        match payload.len() {
            n if n < 126 => f.push(n as u8),
            n if n <= 0xffff => {
                f.push(126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                f.push(127);
                f.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn parses_frames_of_every_length_form_and_waits_for_incomplete_ones() {
        for n in [0usize, 5, 125, 126, 300, 65_535, 65_536, 70_000] {
            let payload: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
            let mut bytes = server_frame(0x1, &payload);
            let total = bytes.len();
            bytes.extend_from_slice(&server_frame(0x8, &4000u16.to_be_bytes()));
            let f = parse_frame(&bytes).unwrap().expect("complete");
            assert!(f.fin);
            assert_eq!((f.opcode, f.len), (0x1, total), "{n}");
            assert_eq!(&bytes[f.payload.clone()], &payload[..]);
            let close = parse_frame(&bytes[f.len..]).unwrap().expect("the close frame");
            assert_eq!(close.opcode, 0x8);
            for cut in [1, total / 2, total - 1] {
                assert!(parse_frame(&bytes[..cut]).unwrap().is_none(), "{n} cut at {cut}");
            }
        }
        assert!(
            parse_frame(&[0x81, 0x85, 0, 0, 0, 0, 1, 2, 3, 4, 5]).is_err(),
            "masked frames are refused"
        );
    }
}
