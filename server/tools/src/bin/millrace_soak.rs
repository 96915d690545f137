//! `millrace-soak`: a long run of the real service under many WebSocket clients while the
//! upstream exchange misbehaves (issue 15, "Proof"). Not run in CI; method and figures in
//! docs/soak.md and BENCHMARKS.md ("Soak").
//!
//! - The server is a real `millrace serve` child process (the binary beside this one, or
//!   `--bin`) on a fresh data dir, with its embedded simulator at `--sim-speed` (60: a 1m candle
//!   closes every second), the simulator's 8 instruments pinned for klines and depth, an admin
//!   token (the simulator's fault endpoint takes it) and the connection and job-start limits
//!   raised for many loopback clients. With `--separate-sim` the simulator is a `millrace sim`
//!   process of its own, which the server reaches as a remote exchange, so that the server's
//!   RSS and CPU are its own (the simulator's are reported beside them).
//! - `--clients` WebSocket clients in this process (one tokio runtime) each subscribe to the 1m
//!   klines of two instruments, and every fourth also to an instrument's `depth_update@`. Each
//!   keeps every closed candle (`"x":true`) it receives; a close with code 4000 or a `lagging`
//!   error counts as a client that fell behind, and any other end of the connection as a
//!   disconnect; both reconnect and subscribe again.
//! - Every `--fault-every` seconds one upstream fault is posted to the simulator's
//!   `POST /sim/faults` (a rotation through connection drops, stalls, skipped, duplicated,
//!   reordered and malformed messages, corrupt depth diffs and REST 429/500 answers with a drop),
//!   so the server's recovery paths run under load. None in the last 20 s of the run (a quarter
//!   of a shorter one).
//! - An optional warm-up (`--warmup <s>`) runs the load and the faults before the `start`
//!   reading, so that the figures compare the server with itself in its steady state.
//! - Server RSS (`/proc/<pid>/status` `VmRSS`) is read once every client is subscribed (`cold`),
//!   then every 10 s; the figures are at the end of the warm-up (`start`; `cold` without one),
//!   halfway through the measured `--duration` and at its end. CPU time (`/proc/<pid>/stat`
//!   utime + stime) over the measured part.
//! - At the end, for every series: no client saw a closed candle twice or missed one between its
//!   first and its last (late gap fills may come out of order; they count once they came); every
//!   client saw the same values; `GET /api/v1/klines` holds each minute of the run once, without
//!   gaps, with the values the clients saw.
//!
//! Prints a table and a `RESULT {json}` line; exits 1 if a candle was lost, duplicated or
//! differed, or a client fell behind (closed as lagging, or as too slow to send to).
//!
//! Usage: `millrace-soak [--warmup 0] [--duration 600] [--clients 2000] [--quick]`.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Parser;
use futures_util::{SinkExt as _, StreamExt as _};
use serde_json::{json, Value};
use server::config::{Config, SourceConfig, SourceKind};
use shared::fixed::{Price, Volume};
use shared::protocol::{ErrorCode, KlineEvent, PushData, ServerFrame, Stream};
use sim::SymbolSpec;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;
use tools::child::{free_port, metrics, start, start_args, wait_healthy, wait_ok};
use tools::procfs::{
    cpu_time, heap_mapping, loadavg, machine_busy, raise_nofile_limit, rss_anon_bytes, rss_bytes,
};
use tools::KillOnDrop;

/// The admin token of the server under test (its simulator's control endpoints take it).
const ADMIN_TOKEN: &str = "soak-admin-token";

/// A soak test of the real service: many WebSocket clients, upstream faults, memory and CPU,
/// every closed candle checked.
#[derive(Debug, Parser)]
#[command(name = "millrace-soak", version = server::VERSION)]
struct Args {
    /// Seconds of load measured, after the warm-up [default: 600; 60 with --quick].
    #[arg(long)]
    duration: Option<u64>,
    /// Seconds of load (with faults) between every client subscribing and the `start` memory
    /// and CPU reading, so that the readings compare the server with itself once its buffers
    /// and caches have been through the faults' recovery paths (docs/soak.md). The reading at
    /// subscription is reported too (`cold`); every candle of the warm-up is checked like the
    /// others.
    #[arg(long, default_value_t = 0)]
    warmup: u64,
    /// WebSocket clients [default: 2000; 200 with --quick].
    #[arg(long)]
    clients: Option<usize>,
    /// A short run (60 s, 200 clients, a fault every 10 s) to try the tool.
    #[arg(long)]
    quick: bool,
    /// Seconds between upstream faults [default: 40; 10 with --quick].
    #[arg(long)]
    fault_every: Option<u64>,
    /// Simulated seconds per real second of the embedded simulator.
    #[arg(long, default_value_t = 60.0)]
    sim_speed: f64,
    /// Simulator seed.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Skip filling the embedded simulator's tick-by-tick replay rings before the first memory
    /// reading (then the rings' filling shows as RSS growth during the run).
    #[arg(long)]
    no_tbt_fill: bool,
    /// Run the simulator as a process of its own (`millrace sim`, which the server reaches over
    /// loopback as it would a remote exchange) instead of embedded in the server, so that the
    /// server's RSS and CPU are the server's alone; the simulator's are reported beside them.
    #[arg(long)]
    separate_sim: bool,
    /// The `millrace` binary [default: beside this one].
    #[arg(long)]
    bin: Option<PathBuf>,
}

/// The run's settings, defaults applied.
struct Plan {
    warmup: Duration,
    duration: Duration,
    clients: usize,
    fault_every: Duration,
}

impl Args {
    fn plan(&self) -> Plan {
        let (d, c, f) = if self.quick { (60, 200, 10) } else { (600, 2000, 40) };
        Plan {
            warmup: Duration::from_secs(self.warmup),
            duration: Duration::from_secs(self.duration.unwrap_or(d)),
            clients: self.clients.unwrap_or(c).max(1),
            fault_every: Duration::from_secs(self.fault_every.unwrap_or(f).max(1)),
        }
    }
}

/// Memory readings over the run, `(seconds since every client subscribed, bytes)`: the
/// server's RSS and its anonymous part, the size of its `[heap]` mapping and that mapping's RSS,
/// and the separate simulator's RSS.
#[derive(Default)]
struct Readings {
    pid: u32,
    sim_pid: Option<u32>,
    rss: Vec<(u64, u64)>,
    anon: Vec<(u64, u64)>,
    heap_size: Vec<(u64, u64)>,
    heap_rss: Vec<(u64, u64)>,
    sim: Vec<(u64, u64)>,
}

impl Readings {
    /// Reads all three at `t`; returns the server's and the simulator's RSS.
    fn take(&mut self, t: u64) -> anyhow::Result<(u64, Option<u64>)> {
        let rss = rss_bytes(self.pid).context("server RSS (did it exit?)")?;
        self.rss.push((t, rss));
        self.anon.push((t, rss_anon_bytes(self.pid).unwrap_or(0)));
        let (size, resident) = heap_mapping(self.pid).unwrap_or_default();
        self.heap_size.push((t, size));
        self.heap_rss.push((t, resident));
        let sim = self.sim_pid.and_then(rss_bytes);
        self.sim.extend(sim.map(|b| (t, b)));
        Ok((rss, sim))
    }
}

/// The simulator's instruments (`sim:spot:BTC/USDT`, …) and their Binance symbols.
fn instruments() -> Vec<(String, String)> {
    SymbolSpec::catalog()
        .iter()
        .map(|s| (format!("sim:spot:{}/{}", s.base, s.quote), format!("{}{}", s.base, s.quote)))
        .collect()
}

/// What a client received of one series: the open times of the closed candles, in order.
type Closed = HashMap<String, Vec<i64>>;

/// The values of a closed candle (fixed-point; compared exactly).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Values {
    o: Price,
    h: Price,
    l: Price,
    c: Price,
    v: Volume,
    n: u64,
}

/// What every client adds to.
#[derive(Default)]
struct Tally {
    /// Clients whose subscription was accepted at least once.
    subscribed: AtomicU64,
    /// Closes with code 4000 and `lagging` errors.
    fell_behind: AtomicU64,
    /// Other ends of a connection (closes, read errors).
    disconnects: AtomicU64,
    /// Connections opened again after the first.
    reconnects: AtomicU64,
    /// Refused subscriptions other than `lagging`.
    refused: AtomicU64,
    /// Frames that did not decode.
    undecodable: AtomicU64,
    /// Closed candles received (all clients).
    closed: AtomicU64,
    /// Forming updates received.
    forming: AtomicU64,
    /// `depth_update` pushes received.
    depth: AtomicU64,
    /// Closed candles whose values differ from another client's copy of the same minute.
    mismatched: AtomicU64,
    /// The first values seen of each (series, open time).
    values: Mutex<HashMap<(String, i64), Values>>,
    /// Why the last disconnects happened (a few, for the report).
    last_errors: Mutex<Vec<String>>,
}

impl Tally {
    fn note(&self, what: String) {
        let mut e = self.last_errors.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if e.len() < 20 {
            e.push(what);
        }
    }

    fn record(&self, series: &str, ev: &KlineEvent) {
        let k = &ev.k;
        let v = Values { o: k.o, h: k.h, l: k.l, c: k.c, v: k.v, n: k.n };
        let mut m = self.values.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let first = *m.entry((series.to_string(), k.t)).or_insert(v);
        if first != v {
            self.mismatched.fetch_add(1, Relaxed);
        }
    }
}

/// One browser-like client: subscribes to `topics`, keeps the open times of the closed candles
/// it receives, reconnects when the connection ends; returns them when `stop` is set.
async fn client(url: String, topics: Vec<String>, stop: Arc<AtomicBool>, t: Arc<Tally>) -> Closed {
    let mut closed = Closed::new();
    let mut first = true;
    let mut counted = false;
    while !stop.load(Relaxed) {
        if !first {
            t.reconnects.fetch_add(1, Relaxed);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        first = false;
        let mut ws = match tokio_tungstenite::connect_async(&url).await {
            Ok((ws, _)) => ws,
            Err(e) => {
                t.disconnects.fetch_add(1, Relaxed);
                t.note(format!("connect: {e}"));
                continue;
            }
        };
        let request = json!({"method": "SUBSCRIBE", "params": topics, "id": 1});
        if ws.send(Message::text(request.to_string())).await.is_err() {
            t.disconnects.fetch_add(1, Relaxed);
            continue;
        }
        while !stop.load(Relaxed) {
            let msg = match tokio::time::timeout(Duration::from_millis(500), ws.next()).await {
                Err(_) => continue,
                Ok(Some(Ok(m))) => m,
                Ok(other) => {
                    t.disconnects.fetch_add(1, Relaxed);
                    t.note(format!("connection ended: {other:?}"));
                    break;
                }
            };
            let text = match msg {
                Message::Text(text) => text,
                Message::Close(frame) => {
                    match &frame {
                        Some(f) if f.code == CloseCode::from(4000) => {
                            t.fell_behind.fetch_add(1, Relaxed)
                        }
                        _ => t.disconnects.fetch_add(1, Relaxed),
                    };
                    t.note(format!("closed by the server: {frame:?}"));
                    break;
                }
                _ => continue,
            };
            match serde_json::from_str::<ServerFrame>(text.as_str()) {
                Ok(ServerFrame::Reply(r)) => match r.error {
                    None if !counted => {
                        counted = true;
                        t.subscribed.fetch_add(1, Relaxed);
                    }
                    None => {}
                    Some(e) if e.code == ErrorCode::Lagging => {
                        t.fell_behind.fetch_add(1, Relaxed);
                    }
                    Some(e) => {
                        t.refused.fetch_add(1, Relaxed);
                        t.note(format!("refused: {}", e.msg));
                    }
                },
                // (a kline whose data does not decode makes the frame undecodable, below)
                Ok(ServerFrame::Push(p)) => match (p.stream, p.data) {
                    (Stream::Kline(series), PushData::Kline(ev)) if ev.k.x => {
                        t.closed.fetch_add(1, Relaxed);
                        let series = series.to_string();
                        t.record(&series, &ev);
                        closed.entry(series).or_default().push(ev.k.t);
                    }
                    (_, PushData::Kline(_)) => {
                        t.forming.fetch_add(1, Relaxed);
                    }
                    (_, PushData::DepthUpdate(_)) => {
                        t.depth.fetch_add(1, Relaxed);
                    }
                    _ => {}
                },
                Err(_) => {
                    t.undecodable.fetch_add(1, Relaxed);
                }
            }
        }
    }
    closed
}

/// What the clients' candles of one series show.
#[derive(Debug, Default, Clone, serde::Serialize)]
struct SeriesCheck {
    clients: usize,
    /// Closed candles delivered to clients.
    delivered: u64,
    /// A minute a client received twice.
    duplicated: u64,
    /// A minute missing between a client's first and last candle of the series.
    lost: u64,
    /// Candles that arrived after a later minute (late gap fills).
    out_of_order: u64,
    /// Minutes of the run (first to last seen by any client).
    minutes: u64,
    /// Minutes stored by the server in that span.
    stored: u64,
    /// Minutes of the span missing in the store, or stored twice.
    store_gaps: u64,
    store_duplicates: u64,
    /// Minutes clients saw that the store does not hold, or holds with other values.
    not_stored: u64,
    store_differs: u64,
}

/// Checks every client's open times of every series (one minute apart): none twice, none
/// missing from its first up to `newest` (the newest stored minute of the series when the run
/// ended).
fn check_clients(all: &[Closed], newest: &BTreeMap<String, i64>) -> BTreeMap<String, SeriesCheck> {
    const MINUTE: i64 = 60_000;
    let mut out: BTreeMap<String, SeriesCheck> = BTreeMap::new();
    for closed in all {
        for (series, times) in closed {
            let c = out.entry(series.clone()).or_default();
            c.clients += 1;
            c.delivered += times.len() as u64;
            let mut max = i64::MIN;
            for &t in times {
                if t < max {
                    c.out_of_order += 1;
                }
                max = max.max(t);
            }
            let mut sorted = times.clone();
            sorted.sort_unstable();
            for w in sorted.windows(2) {
                match w[1] - w[0] {
                    0 => c.duplicated += 1,
                    d if d > MINUTE => c.lost += (d / MINUTE - 1) as u64,
                    _ => {}
                }
            }
            if let (Some(&end), Some(&last)) = (newest.get(series), sorted.last()) {
                c.lost += ((end - last).max(0) / MINUTE) as u64;
            }
        }
    }
    out
}

/// `GET /api/v1/klines` of `series` from `start` to `end` (open times, inclusive), all pages.
async fn stored(
    http: &reqwest::Client,
    base: &str,
    series: &str,
    start: i64,
    end: i64,
) -> anyhow::Result<Vec<(i64, Values)>> {
    let mut rows = Vec::new();
    let mut from = start;
    loop {
        let url = format!("{base}/api/v1/klines");
        let q = [
            ("series", series.to_string()),
            ("startTime", from.to_string()),
            ("endTime", end.to_string()),
            ("limit", "1000".to_string()),
        ];
        let page: Vec<Value> =
            http.get(&url).query(&q).send().await?.error_for_status()?.json().await?;
        let n = page.len();
        for r in page {
            let p = |i: usize| -> anyhow::Result<String> {
                Ok(r[i].as_str().with_context(|| format!("kline row {r}"))?.to_string())
            };
            let t = r[0].as_i64().context("open time")?;
            let values = Values {
                o: p(1)?.parse()?,
                h: p(2)?.parse()?,
                l: p(3)?.parse()?,
                c: p(4)?.parse()?,
                v: p(5)?.parse()?,
                n: r[8].as_u64().context("trades")?,
            };
            from = t + 1;
            rows.push((t, values));
        }
        if n < 1000 {
            return Ok(rows);
        }
    }
}

/// Compares the clients' candles of each series with the store.
async fn check_store(
    base: &str,
    checks: &mut BTreeMap<String, SeriesCheck>,
    tally: &Tally,
) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let values = std::mem::take(&mut *tally.values.lock().unwrap_or_else(|e| e.into_inner()));
    let mut seen: BTreeMap<&str, BTreeMap<i64, Values>> = BTreeMap::new();
    for ((series, t), v) in &values {
        seen.entry(series.as_str()).or_default().insert(*t, *v);
    }
    for (series, minutes) in seen {
        let (Some((&first, _)), Some((&last, _))) =
            (minutes.first_key_value(), minutes.last_key_value())
        else {
            continue;
        };
        let rows = stored(&http, base, series, first, last).await?;
        let c = checks.entry(series.to_string()).or_default();
        c.minutes = ((last - first) / 60_000 + 1) as u64;
        c.stored = rows.len() as u64;
        let mut by_time: BTreeMap<i64, Values> = BTreeMap::new();
        for w in rows.windows(2) {
            match w[1].0 - w[0].0 {
                0 => c.store_duplicates += 1,
                d if d > 60_000 => c.store_gaps += (d / 60_000 - 1) as u64,
                _ => {}
            }
        }
        for (t, v) in rows {
            by_time.insert(t, v);
        }
        if by_time.first_key_value().is_some_and(|(&t, _)| t > first) {
            c.store_gaps +=
                ((by_time.first_key_value().map_or(first, |(&t, _)| t) - first) / 60_000) as u64;
        }
        for (t, v) in &minutes {
            match by_time.get(t) {
                None => c.not_stored += 1,
                Some(s) if s != v => c.store_differs += 1,
                Some(_) => {}
            }
        }
    }
    Ok(())
}

/// The upstream faults, in the order they are injected (then again from the start).
fn faults() -> Vec<(&'static str, Value)> {
    vec![
        ("drop every upstream connection", json!({"action": "drop"})),
        ("stall kline streams 3 s", json!({"action": "stall", "kind": "kline", "ms": 3000})),
        ("skip 20 kline messages", json!({"action": "skip", "kind": "kline", "count": 20})),
        (
            "REST 429 x5 (Retry-After 1) + drop",
            json!([{"action": "rest_fail", "count": 5, "status": 429, "retry_after": 1},
                   {"action": "drop"}]),
        ),
        (
            "duplicate 20 kline messages",
            json!({"action": "duplicate", "kind": "kline", "count": 20}),
        ),
        ("reorder 10 kline messages", json!({"action": "reorder", "kind": "kline", "count": 10})),
        ("10 malformed messages", json!({"action": "malformed", "count": 10})),
        ("corrupt 3 depth diffs", json!({"action": "corrupt", "kind": "depth", "count": 3})),
        (
            "REST 500 x3 + drop BTCUSDT",
            json!([{"action": "rest_fail", "count": 3, "status": 500},
                   {"action": "drop", "symbol": "BTCUSDT"}]),
        ),
        ("stall depth streams 5 s", json!({"action": "stall", "kind": "depth", "ms": 5000})),
    ]
}

async fn post_fault(http: &reqwest::Client, sim: &str, body: &Value) -> anyhow::Result<()> {
    post_control(http, sim, "/sim/faults", body).await
}

/// One of the simulator's control POSTs (`/sim/faults`, `/tbt/control`): admin token, JSON.
async fn post_control(
    http: &reqwest::Client,
    sim: &str,
    path: &str,
    body: &Value,
) -> anyhow::Result<()> {
    let r = http.post(format!("{sim}{path}")).bearer_auth(ADMIN_TOKEN).json(body).send().await?;
    let status = r.status();
    if !status.is_success() {
        bail!("POST {path} {body}: {status} {}", r.text().await.unwrap_or_default());
    }
    Ok(())
}

/// Symbols made hot at once while filling the replay rings: enough to finish in seconds, few
/// enough that the generator and the server's L3 engine keep up.
const FILL_AT_ONCE: usize = 8;

/// Fills the embedded tick-by-tick simulator's replay rings (`history` messages per symbol, kept
/// for `/tbt/replay`) before the first memory reading, so the run's RSS is not the rings filling:
/// a few symbols at a time are made hot through `POST /tbt/control` until each has generated
/// `history` messages (`GET /tbt/status`), then cooled again. Returns (symbols, ring size,
/// seconds taken); (0, 0, 0) when the simulator has no tick-by-tick feed.
async fn fill_tbt_history(http: &reqwest::Client, sim: &str) -> anyhow::Result<(usize, u64, f64)> {
    let t0 = Instant::now();
    let Some(st) = tbt_status(http, sim).await? else { return Ok((0, 0, 0.0)) };
    let history = st.history as u64;
    let symbols: Vec<String> = st.symbols.into_iter().map(|s| s.symbol).collect();
    let hot = |symbol: &str, hot: bool| {
        let body = json!({"hotspot": {"symbol": symbol, "hot": hot}});
        async move { post_control(http, sim, "/tbt/control", &body).await }
    };
    for batch in symbols.chunks(FILL_AT_ONCE) {
        for symbol in batch {
            hot(symbol, true).await?;
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let st = tbt_status(http, sim).await?.context("GET /tbt/status went away")?;
            let full =
                st.symbols.iter().filter(|s| batch.contains(&s.symbol)).all(|s| s.seq >= history);
            if full {
                break;
            }
            if Instant::now() > deadline {
                bail!("the tick-by-tick rings of {batch:?} did not fill in 120 s");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        for symbol in batch {
            hot(symbol, false).await?;
        }
    }
    Ok((symbols.len(), history, t0.elapsed().as_secs_f64()))
}

/// `GET /tbt/status`, or `None` when the simulator has no tick-by-tick feed.
async fn tbt_status(http: &reqwest::Client, sim: &str) -> anyhow::Result<Option<tbt::TbtStatus>> {
    let r = http.get(format!("{sim}/tbt/status")).send().await?;
    if r.status() == reqwest::StatusCode::NOT_FOUND {
        return Ok(None);
    }
    Ok(Some(r.error_for_status()?.json().await?))
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

async fn soak(args: &Args) -> anyhow::Result<(Value, bool)> {
    let plan = args.plan();
    let nofile = raise_nofile_limit();
    let bin = match &args.bin {
        Some(b) => b.clone(),
        None => tools::child::millrace_beside_me()?,
    };
    let dir = std::env::temp_dir().join(format!("millrace-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (port, sim_port) = (free_port()?, free_port()?);
    let instruments = instruments();
    let mut config = Config::default();
    config.server.addr = format!("127.0.0.1:{port}").parse()?;
    config.server.data_dir = dir.join("data");
    config.server.admin_token = Some(ADMIN_TOKEN.into());
    config.ingest.pinned = instruments.iter().map(|(i, _)| i.clone()).collect();
    config.depth.pinned = config.ingest.pinned.clone();
    config.backfill = vec![];
    let connections = plan.clients * 2 + 1000;
    config.limits.max_connections_per_ip = connections;
    config.limits.max_job_starts_per_min_per_connection = 1000;
    config.limits.max_job_starts_per_min_per_ip = 100_000;
    let sim = format!("http://127.0.0.1:{sim_port}");
    let mut source = SourceConfig {
        name: "sim".into(),
        kind: SourceKind::Sim,
        speed: args.sim_speed,
        seed: args.seed,
        sim_addr: format!("127.0.0.1:{sim_port}").parse()?,
        ..SourceConfig::default()
    };
    // the separate simulator: a child of its own, with the same speed, seed and control token
    let separate = if args.separate_sim {
        let (addr, speed, seed) =
            (source.sim_addr.to_string(), args.sim_speed.to_string(), args.seed.to_string());
        let sim_args = [
            "sim",
            "--addr",
            &addr,
            "--speed",
            &speed,
            "--seed",
            &seed,
            "--control-token",
            ADMIN_TOKEN,
        ]
        .map(std::ffi::OsStr::new);
        let child = start_args(&bin, &dir, "sim", &sim_args)?;
        wait_ok(&format!("{sim}/api/v3/ping")).await.context("the separate simulator")?;
        source.rest_base = Some(sim.clone());
        source.ws_base = Some(format!("ws://127.0.0.1:{sim_port}"));
        Some(child)
    } else {
        None
    };
    let sim_pid = separate.as_ref().map(KillOnDrop::id);
    config.sources = vec![source];
    let server = start(&bin, &dir, "server", &["serve"], &config)?;
    let pid = server.id();
    if let Err(e) = wait_healthy(port).await {
        let log = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
        bail!("{e:#}; the server's log:\n{log}");
    }
    let base = format!("http://127.0.0.1:{port}");
    let addr: SocketAddr = config.server.addr;
    println!(
        "millrace-soak: {} clients, {} s warm-up + {} s measured, a fault every {} s, simulator speed {} ({}), server pid {pid} ({}), log {}",
        plan.clients,
        plan.warmup.as_secs(),
        plan.duration.as_secs(),
        plan.fault_every.as_secs(),
        args.sim_speed,
        sim_pid.map_or("embedded".to_string(), |p| format!("separate, pid {p}")),
        bin.display(),
        dir.join("server.log").display()
    );

    let http = reqwest::Client::new();
    let tbt_fill = if args.no_tbt_fill {
        json!(null)
    } else {
        let (symbols, history, secs) = fill_tbt_history(&http, &sim).await?;
        println!(
            "filled the simulator's tick-by-tick replay rings: {symbols} symbols × {history} messages in {secs:.1} s"
        );
        json!({"symbols": symbols, "history": history, "seconds": secs})
    };

    // clients: two 1m kline streams each, every fourth also a depth_update stream
    let (stop, tally) = (Arc::new(AtomicBool::new(false)), Arc::new(Tally::default()));
    let n = instruments.len();
    let mut tasks = Vec::with_capacity(plan.clients);
    for i in 0..plan.clients {
        let mut topics = vec![
            format!("kline@{}:1m", instruments[i % n].0),
            format!("kline@{}:1m", instruments[(i / n + i + 1) % n].0),
        ];
        topics.dedup();
        if i % 4 == 0 {
            topics.push(format!("depth_update@{}", instruments[(i / 4) % n].0));
        }
        let url = format!("ws://127.0.0.1:{port}/ws");
        tasks.push(tokio::spawn(client(url, topics, stop.clone(), tally.clone())));
        if i % 100 == 99 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while tally.subscribed.load(Relaxed) < plan.clients as u64 {
        if Instant::now() > deadline {
            stop.store(true, Relaxed);
            bail!(
                "only {} of {} clients subscribed within 120 s",
                tally.subscribed.load(Relaxed),
                plan.clients
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let metrics0 = tokio::task::spawn_blocking(move || metrics(addr)).await??;

    // the run: RSS every 10 s, a fault every `fault_every`; the warm-up, then what is measured
    let t0 = Instant::now();
    let warmup = plan.warmup.as_secs();
    let total = plan.warmup + plan.duration;
    // CPU counters where the measured part starts (again when a warm-up ends)
    let cpu_mark = || -> anyhow::Result<_> {
        Ok((
            cpu_time(pid).context("server CPU")?,
            machine_busy().unwrap_or_default(),
            sim_pid.and_then(cpu_time),
        ))
    };
    let (mut cpu0, mut busy0, mut sim_cpu0) = cpu_mark()?;
    let mut measuring = plan.warmup.is_zero();
    let mut readings = Readings { pid, sim_pid, ..Readings::default() };
    let (rss0, _) = readings.take(0)?;
    println!(
        "{:>6} s  RSS {:>7.1} MiB (anon {:.1})  (all {} clients subscribed)",
        0,
        mib(rss0),
        mib(readings.anon[0].1),
        plan.clients
    );
    let rotation = faults();
    let mut injected: Vec<Value> = Vec::new();
    let mut fault_errors = 0u64;
    let mut next_fault = plan.fault_every;
    let mut next_rss = Duration::from_secs(10);
    let quiet = Duration::from_secs(20).min(plan.duration / 4);
    let last_fault = total.saturating_sub(quiet);
    loop {
        let now = t0.elapsed();
        if now >= total {
            break;
        }
        if !measuring && now >= plan.warmup {
            // CPU from here, and the `start` reading
            measuring = true;
            (cpu0, busy0, sim_cpu0) = cpu_mark()?;
            readings.take(warmup)?;
            println!(
                "{:>6} s  warm-up over: the measured {} s start",
                now.as_secs(),
                plan.duration.as_secs()
            );
        }
        if now >= next_fault && next_fault <= last_fault {
            let (name, body) = &rotation[injected.len() % rotation.len()];
            match post_fault(&http, &sim, body).await {
                Ok(()) => println!("{:>6} s  fault: {name}", now.as_secs()),
                Err(e) => {
                    fault_errors += 1;
                    println!("{:>6} s  fault {name} not injected: {e:#}", now.as_secs());
                }
            }
            injected.push(json!({"at_s": now.as_secs(), "fault": name}));
            next_fault += plan.fault_every;
        }
        if now >= next_rss {
            let (rss, sim_now) = readings.take(next_rss.as_secs())?;
            println!(
                "{:>6} s  RSS {:>7.1} MiB (anon {:.1}; [heap] {:.2} of {:.2}{})  closed {} fell behind {} disconnects {}",
                next_rss.as_secs(),
                mib(rss),
                mib(readings.anon.last().map_or(0, |a| a.1)),
                mib(readings.heap_rss.last().map_or(0, |a| a.1)),
                mib(readings.heap_size.last().map_or(0, |a| a.1)),
                sim_now.map_or(String::new(), |b| format!("; simulator {:.1}", mib(b))),
                tally.closed.load(Relaxed),
                tally.fell_behind.load(Relaxed),
                tally.disconnects.load(Relaxed)
            );
            next_rss += Duration::from_secs(10);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let elapsed = t0.elapsed().saturating_sub(plan.warmup).as_secs_f64();
    let (rss_end, _) = readings.take(total.as_secs())?;
    let Readings {
        rss: rss_samples,
        anon: anon_samples,
        heap_size,
        heap_rss,
        sim: sim_samples,
        ..
    } = readings;
    let cpu = (cpu_time(pid).context("server CPU")? - cpu0).as_secs_f64();
    let sim_cpu = sim_pid.zip(sim_cpu0).and_then(|(p, c0)| Some((cpu_time(p)? - c0).as_secs_f64()));
    let busy = (machine_busy().unwrap_or_default().saturating_sub(busy0)).as_secs_f64();
    let load = loadavg();
    let metrics1 = tokio::task::spawn_blocking(move || metrics(addr)).await??;
    let _ = post_fault(&http, &sim, &json!({"action": "clear"})).await;
    let sim_faults: Value = http
        .get(format!("{sim}/sim/faults"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await?
        .json()
        .await
        .unwrap_or(Value::Null);

    // the newest minute stored of each series; 3 s later every client must have it
    let mut newest = BTreeMap::new();
    for (instrument, _) in &instruments {
        let series = format!("{instrument}:1m");
        let q = [("series", series.as_str()), ("limit", "1")];
        let rows: Vec<Value> = http
            .get(format!("{base}/api/v1/klines"))
            .query(&q)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        if let Some(t) = rows.first().and_then(|r| r[0].as_i64()) {
            newest.insert(series, t);
        }
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Relaxed);
    let mut all = Vec::with_capacity(tasks.len());
    for t in tasks {
        all.push(t.await?);
    }
    let mut checks = check_clients(&all, &newest);
    check_store(&base, &mut checks, &tally).await?;
    drop(server);
    drop(separate);

    let delta = |m: &str| tools::child::metric(&metrics1, m) - tools::child::metric(&metrics0, m);
    let sum = |f: fn(&SeriesCheck) -> u64| checks.values().map(f).sum::<u64>();
    let lost = sum(|c| c.lost);
    let duplicated = sum(|c| c.duplicated);
    let store_bad = sum(|c| c.store_gaps + c.store_duplicates + c.not_stored + c.store_differs);
    let mismatched = tally.mismatched.load(Relaxed);
    let fell_behind = tally.fell_behind.load(Relaxed);
    let delivered = sum(|c| c.delivered);
    let slow_send = delta("millrace_ws_dropped_slow_send_total");
    let ok = lost == 0
        && slow_send == 0.0
        && duplicated == 0
        && store_bad == 0
        && mismatched == 0
        && fell_behind == 0
        && delivered > 0
        && fault_errors == 0;
    let at = |samples: &[(u64, u64)], s: u64| {
        samples.iter().rev().find(|(t, _)| *t <= s).map(|(_, b)| mib(*b)).unwrap_or(0.0)
    };
    // readings at the end of the warm-up, halfway through what is measured, and at its end
    let half = warmup + plan.duration.as_secs() / 2;
    let interesting = |k: &str| {
        [
            "lagging",
            "slow_send",
            "refused",
            "gap",
            "resync",
            "reconnect",
            "repair",
            "error",
            "timed_out",
        ]
        .iter()
        .any(|w| k.contains(w))
    };
    let total = |prefix: &str| -> f64 {
        metrics1.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(_, v)| v).sum()
    };
    let server_metrics: BTreeMap<&String, f64> =
        metrics1.iter().filter(|(k, _)| interesting(k)).map(|(k, v)| (k, *v)).collect();
    let r = json!({
        "ok": ok,
        "clients": plan.clients,
        "duration_s": elapsed,
        "sim_speed": args.sim_speed,
        "nofile": nofile,
        "tbt_fill": tbt_fill,
        "warmup_s": warmup,
        "rss_mib": {
            "cold": mib(rss0),
            "anon_cold": at(&anon_samples, 0),
            "start": at(&rss_samples, warmup),
            "half": at(&rss_samples, half),
            "anon_start": at(&anon_samples, warmup),
            "anon_half": at(&anon_samples, half),
            "anon_end": at(&anon_samples, u64::MAX),
            "half_at_s": half - warmup,
            "end": mib(rss_end),
            "max": rss_samples
                .iter()
                .filter(|(t, _)| *t >= warmup)
                .map(|(_, b)| mib(*b))
                .fold(0.0, f64::max),
            "samples": rss_samples.iter().map(|(t, b)| json!([t, mib(*b)])).collect::<Vec<_>>(),
            "anon_samples": anon_samples.iter().map(|(t, b)| json!([t, mib(*b)])).collect::<Vec<_>>(),
            // the main malloc arena: its extent and how much of it is resident
            "heap_size_start": at(&heap_size, warmup),
            "heap_size_half": at(&heap_size, half),
            "heap_size_end": at(&heap_size, u64::MAX),
            "heap_rss_start": at(&heap_rss, warmup),
            "heap_rss_half": at(&heap_rss, half),
            "heap_rss_end": at(&heap_rss, u64::MAX),
            "heap_samples": heap_size
                .iter()
                .zip(&heap_rss)
                .map(|((t, size), (_, rss))| json!([t, mib(*size), mib(*rss)]))
                .collect::<Vec<_>>(),
        },
        "server_cpu_pct_of_one_core": 100.0 * cpu / elapsed,
        "simulator": match sim_pid {
            None => json!("embedded in the server (its RSS and CPU are in the server's)"),
            Some(_) => json!({
                "rss_mib": {
                    "start": at(&sim_samples, warmup),
                    "half": at(&sim_samples, half),
                    "end": at(&sim_samples, u64::MAX),
                },
                "cpu_pct_of_one_core": sim_cpu.map(|c| 100.0 * c / elapsed),
            }),
        },
        "machine_busy_cores": busy / elapsed,
        "loadavg_at_end": load,
        "closed_candles_delivered": delivered,
        "lost": lost,
        "duplicated": duplicated,
        "mismatched_between_clients": mismatched,
        "store_problems": store_bad,
        "out_of_order": sum(|c| c.out_of_order),
        "fell_behind": fell_behind,
        "disconnects": tally.disconnects.load(Relaxed),
        "reconnects": tally.reconnects.load(Relaxed),
        "refused": tally.refused.load(Relaxed),
        "undecodable": tally.undecodable.load(Relaxed),
        "forming_updates": tally.forming.load(Relaxed),
        "depth_updates": tally.depth.load(Relaxed),
        "server_lagging_drops": delta("millrace_ws_dropped_lagging_total"),
        "server_slow_send_drops": slow_send,
        "server_messages_sent": delta("millrace_ws_messages_sent_total"),
        "server_gap_filled_candles": total("millrace_job_gap_filled_candles_total"),
        "server_book_resyncs": total("millrace_book_resyncs_total"),
        "server_metrics": server_metrics,
        "faults": injected,
        "fault_errors": fault_errors,
        "sim_faults": sim_faults,
        "series": checks,
        "client_errors": *tally.last_errors.lock().unwrap_or_else(|e| e.into_inner()),
    });
    if ok {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok((r, ok))
}

fn table(r: &Value) {
    let f = |k: &str| r[k].to_string();
    let rss = &r["rss_mib"];
    println!();
    println!("| measure                                   | value |");
    println!("|-------------------------------------------|-------|");
    println!(
        "| clients / warm-up (s) / measured (s)       | {} / {} / {:.0} |",
        f("clients"),
        f("warmup_s"),
        r["duration_s"].as_f64().unwrap_or(0.0)
    );
    println!(
        "| server RSS at subscription (MiB)           | {:.1} (anon {:.1}) |",
        rss["cold"].as_f64().unwrap_or(0.0),
        rss["anon_cold"].as_f64().unwrap_or(0.0)
    );
    println!(
        "| server RSS start / {} s / end (MiB)        | {:.1} / {:.1} / {:.1} (max {:.1}) |",
        rss["half_at_s"],
        rss["start"].as_f64().unwrap_or(0.0),
        rss["half"].as_f64().unwrap_or(0.0),
        rss["end"].as_f64().unwrap_or(0.0),
        rss["max"].as_f64().unwrap_or(0.0)
    );
    println!(
        "| server anonymous RSS start / {} s / end     | {:.1} / {:.1} / {:.1} |",
        rss["half_at_s"],
        rss["anon_start"].as_f64().unwrap_or(0.0),
        rss["anon_half"].as_f64().unwrap_or(0.0),
        rss["anon_end"].as_f64().unwrap_or(0.0)
    );
    println!(
        "| server [heap] RSS of its size, start / {} s / end | {:.2} of {:.2} / {:.2} of {:.2} / {:.2} of {:.2} |",
        rss["half_at_s"],
        rss["heap_rss_start"].as_f64().unwrap_or(0.0),
        rss["heap_size_start"].as_f64().unwrap_or(0.0),
        rss["heap_rss_half"].as_f64().unwrap_or(0.0),
        rss["heap_size_half"].as_f64().unwrap_or(0.0),
        rss["heap_rss_end"].as_f64().unwrap_or(0.0),
        rss["heap_size_end"].as_f64().unwrap_or(0.0)
    );
    if let Some(sim) = r["simulator"].as_object() {
        println!(
            "| separate simulator RSS start / {} s / end  | {:.1} / {:.1} / {:.1}; CPU {:.1} % |",
            rss["half_at_s"],
            sim["rss_mib"]["start"].as_f64().unwrap_or(0.0),
            sim["rss_mib"]["half"].as_f64().unwrap_or(0.0),
            sim["rss_mib"]["end"].as_f64().unwrap_or(0.0),
            sim["cpu_pct_of_one_core"].as_f64().unwrap_or(0.0)
        );
    }
    println!(
        "| server CPU (% of one core)                 | {:.1} (machine busy {:.2} cores) |",
        r["server_cpu_pct_of_one_core"].as_f64().unwrap_or(0.0),
        r["machine_busy_cores"].as_f64().unwrap_or(0.0)
    );
    for k in [
        "closed_candles_delivered",
        "lost",
        "duplicated",
        "mismatched_between_clients",
        "store_problems",
        "out_of_order",
        "fell_behind",
        "server_lagging_drops",
        "server_slow_send_drops",
        "disconnects",
        "reconnects",
        "refused",
        "fault_errors",
        "server_gap_filled_candles",
        "server_book_resyncs",
    ] {
        println!("| {k:<42} | {} |", f(k));
    }
    println!(
        "| faults injected                            | {} |",
        r["faults"].as_array().map_or(0, Vec::len)
    );
    println!();
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match soak(&args).await {
        Ok((r, ok)) => {
            table(&r);
            println!("RESULT {r}");
            if ok {
                ExitCode::SUCCESS
            } else {
                eprintln!(
                    "millrace-soak: FAILED (see lost / duplicated / store_problems / fell_behind)"
                );
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("millrace-soak: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_check_finds_lost_duplicated_and_late_candles() {
        const M: i64 = 60_000;
        let s = "sim:spot:BTC/USDT:1m".to_string();
        let newest = BTreeMap::from([(s.clone(), 9 * M)]);
        let clean = Closed::from([(s.clone(), (0..10).map(|i| i * M).collect())]);
        // minute 3 twice, minute 5 missing, minute 7 late, the last two never came
        let bad = Closed::from([(
            s.clone(),
            vec![0, M, 2 * M, 3 * M, 3 * M, 4 * M, 6 * M, 8 * M, 7 * M],
        )]);
        let c = &check_clients(std::slice::from_ref(&clean), &newest)[&s];
        assert_eq!((c.lost, c.duplicated, c.out_of_order, c.delivered), (0, 0, 0, 10));
        let c = &check_clients(&[clean, bad], &newest)[&s];
        assert_eq!((c.clients, c.lost, c.duplicated, c.out_of_order), (2, 2, 1, 1));
    }
}
