//! `millrace-e2e`: end-to-end latency of live candles, from the exchange's event to the browser's
//! WebSocket, through a cluster and through one process, measured in the same run.
//!
//! The exchange is the simulator, in this process, at speed 1 (its clock is the wall clock), with
//! `--instruments` of its symbols. Every kline update it sends carries its event time `E`.
//! `--clients` WebSocket clients (in this process) each subscribe to the 1m kline stream of every
//! instrument, as a dashboard does, and take `receive wall-clock − E` for every forming update
//! (`"x":false`) as one sample. Both ends read the same clock.
//!
//! - **single**: one `millrace serve` (child process; in-process bus, SQLite) with a pinned kline
//!   job per instrument.
//! - **cluster**: `millrace supervisor`, two `millrace worker`s (redundancy 2) and a gateway
//!   (`millrace serve` with `[cluster] enabled`), all child processes, on the NATS server at
//!   `--nats` (a prefix of this run's own) and a fresh PostgreSQL database made from `--pg`. A
//!   sample is exchange → worker (its upstream session) → NATS → the gateway's subscription
//!   (kline de-dup of the two replicas) → fan-out → the browser.
//!
//! So a sample is an upper bound on "worker receipt → browser push": it also holds the
//! simulator's own send and the loopback hop to the worker (both in every mode). `E` and the
//! receive time are whole milliseconds: each sample is within ±1 ms. Forming updates go out as
//! they arrive (`ingest.forming_min_interval_ms = 0`) so the throttle's wait is not measured.
//! Each client also checks that it sees every update once (the cluster de-duplicates the
//! replicas' copies).
//!
//! Usage: `millrace-e2e [--mode both|single|cluster] [--clients 100] [--duration-s 30]`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use futures_util::{SinkExt as _, StreamExt as _};
use server::clock::wall_clock_ms;
use server::config::{BusConfig, BusKind, ClusterConfig, StoreConfig, StoreKind};
use server::config::{Config, SourceConfig, SourceKind};
use shared::cluster::TaskKind;
use sim::{Sim, SimConfig, SimHandle, SymbolSpec};
use testkit::PgDb;
use tokio_tungstenite::tungstenite::Message;
use tools::child::{free_port, start, wait_healthy};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Mode {
    Both,
    Single,
    Cluster,
}

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, value_enum, default_value_t = Mode::Both)]
    mode: Mode,
    /// NATS server (cluster mode).
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats: String,
    /// PostgreSQL URL whose user may create databases (cluster mode; a fresh one is made and
    /// dropped).
    #[arg(long, default_value = "postgres://postgres:postgres@127.0.0.1:5432/postgres")]
    pg: String,
    /// WebSocket clients, each subscribed to every instrument's 1m klines.
    #[arg(long, default_value_t = 100)]
    clients: usize,
    /// Simulator symbols used (at most the catalog's).
    #[arg(long, default_value_t = 8)]
    instruments: usize,
    /// Seconds measured, after every stream has delivered.
    #[arg(long, default_value_t = 30)]
    duration_s: u64,
    /// The `millrace` binary [default: beside this one].
    #[arg(long)]
    bin: Option<PathBuf>,
    /// Simulator seed.
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

/// What the clients saw while measuring.
#[derive(Default)]
struct Seen {
    samples: Mutex<Vec<i64>>,
    /// Forming updates seen twice by one client (same stream, open time and event time).
    duplicates: AtomicU64,
    /// Frames that were not the expected push.
    other: AtomicU64,
}

/// The simulator's symbols as instruments (`sim:spot:BTC/USDT`, …).
fn instruments(n: usize) -> Vec<String> {
    SymbolSpec::catalog()
        .iter()
        .take(n.max(1))
        .map(|s| format!("sim:spot:{}/{}", s.base, s.quote))
        .collect()
}

/// The configuration both modes share: the external simulator, forming updates unthrottled,
/// nothing else running.
fn base_config(sim: &SimHandle, dir: &Path, port: u16) -> anyhow::Result<Config> {
    let static_dir = dir.join("static");
    std::fs::create_dir_all(&static_dir)?;
    std::fs::write(static_dir.join("index.html"), "<!doctype html><title>millrace-e2e</title>")?;
    let mut c = Config::default();
    c.server.addr = format!("127.0.0.1:{port}").parse()?;
    c.server.data_dir = dir.join("data");
    c.server.static_dir = Some(static_dir);
    c.ingest.pinned = vec![];
    c.ingest.forming_min_interval_ms = 0;
    c.depth.pinned = vec![];
    c.backfill = vec![];
    c.limits.max_connections_per_ip = 100_000;
    c.sources = vec![SourceConfig {
        name: "sim".into(),
        kind: SourceKind::Sim,
        rest_base: Some(sim.rest_base()),
        ws_base: Some(sim.ws_base()),
        ..SourceConfig::default()
    }];
    Ok(c)
}

/// One browser: subscribes to `topics` on `url`, and while `measuring` records a sample per
/// forming update; `ready` counts the topics it has had an update of.
async fn client(
    url: String,
    topics: Vec<String>,
    measuring: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    seen: Arc<Seen>,
    ready: Arc<AtomicU64>,
) -> anyhow::Result<()> {
    let (mut ws, _) = tokio_tungstenite::connect_async(&url).await.context("connect")?;
    let request = serde_json::json!({"method": "SUBSCRIBE", "params": topics, "id": 1});
    ws.send(Message::text(request.to_string())).await?;
    let mut fresh: HashSet<String> = topics.iter().cloned().collect();
    let mut once: HashSet<(String, i64, i64)> = HashSet::new();
    let mut samples = Vec::new();
    while !stop.load(Relaxed) {
        let msg = match tokio::time::timeout(Duration::from_millis(200), ws.next()).await {
            Err(_) => continue,
            Ok(None) => bail!("the server closed the connection"),
            Ok(Some(m)) => m?,
        };
        let Message::Text(text) = msg else { continue };
        let now = wall_clock_ms();
        let v: serde_json::Value = match serde_json::from_str(text.as_str()) {
            Ok(v) => v,
            Err(_) => {
                seen.other.fetch_add(1, Relaxed);
                continue;
            }
        };
        let (Some(stream), Some(e), Some(t), Some(x)) = (
            v["stream"].as_str(),
            v["data"]["E"].as_i64(),
            v["data"]["k"]["t"].as_i64(),
            v["data"]["k"]["x"].as_bool(),
        ) else {
            continue; // the subscription's reply
        };
        if fresh.remove(stream) {
            ready.fetch_add(1, Relaxed);
        }
        if x || !measuring.load(Relaxed) {
            continue;
        }
        if !once.insert((stream.to_string(), t, e)) {
            seen.duplicates.fetch_add(1, Relaxed);
        }
        samples.push(now - e);
    }
    seen.samples.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend(samples);
    Ok(())
}

/// Connects the clients to `addr`, waits until every client has had an update of every topic,
/// measures for `duration`; returns the report line's values.
async fn measure(addr: &str, args: &Args) -> anyhow::Result<serde_json::Value> {
    let topics: Vec<String> =
        instruments(args.instruments).iter().map(|i| format!("kline@{i}:1m")).collect();
    let (measuring, stop) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let (seen, ready) = (Arc::new(Seen::default()), Arc::new(AtomicU64::new(0)));
    let mut tasks = Vec::new();
    for _ in 0..args.clients {
        let (m, s, seen, ready) = (measuring.clone(), stop.clone(), seen.clone(), ready.clone());
        tasks.push(tokio::spawn(client(
            format!("ws://{addr}/ws"),
            topics.clone(),
            m,
            s,
            seen,
            ready,
        )));
    }
    let all = (args.clients * topics.len()) as u64;
    let deadline = Instant::now() + Duration::from_secs(120);
    while ready.load(Relaxed) < all {
        if Instant::now() > deadline || tasks.iter().any(|t| t.is_finished()) {
            stop.store(true, Relaxed);
            for t in tasks {
                if let Ok(Err(e)) = t.await {
                    bail!("a client failed: {e:#}");
                }
            }
            bail!("only {} of {all} client streams delivered within 120 s", ready.load(Relaxed));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    measuring.store(true, Relaxed);
    tokio::time::sleep(Duration::from_secs(args.duration_s)).await;
    measuring.store(false, Relaxed);
    stop.store(true, Relaxed);
    for t in tasks {
        t.await?.context("a client failed")?;
    }
    let mut s = std::mem::take(
        &mut *seen.samples.lock().unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    if s.is_empty() {
        bail!("no samples");
    }
    s.sort_unstable();
    let q = |p: f64| s[((s.len() - 1) as f64 * p).round() as usize];
    Ok(serde_json::json!({
        "samples": s.len(),
        "per_s": s.len() as f64 / args.duration_s as f64,
        "p50_ms": q(0.5), "p90_ms": q(0.9), "p99_ms": q(0.99), "p999_ms": q(0.999),
        "max_ms": s[s.len() - 1], "min_ms": s[0],
        "duplicates": seen.duplicates.load(Relaxed),
    }))
}

async fn single(
    sim: &SimHandle,
    bin: &Path,
    dir: &Path,
    args: &Args,
) -> anyhow::Result<serde_json::Value> {
    let port = free_port()?;
    let mut config = base_config(sim, dir, port)?;
    config.ingest.pinned = instruments(args.instruments);
    let _serve = start(bin, dir, "single", &["serve"], &config)?;
    wait_healthy(port).await?;
    measure(&format!("127.0.0.1:{port}"), args).await
}

async fn cluster(
    sim: &SimHandle,
    bin: &Path,
    dir: &Path,
    args: &Args,
) -> anyhow::Result<serde_json::Value> {
    let db = {
        let pg = args.pg.clone();
        tokio::task::spawn_blocking(move || PgDb::create(&pg, "e2e")).await??
    };
    let port = free_port()?;
    let prefix = format!("e2e{}", std::process::id());
    let mut config = base_config(sim, dir, port)?;
    config.bus = BusConfig {
        kind: BusKind::Nats,
        url: args.nats.clone(),
        prefix: prefix.clone(),
        ..BusConfig::default()
    };
    config.store = StoreConfig {
        kind: StoreKind::Postgres,
        url: Some(db.url().to_string()),
        ..Default::default()
    };
    config.cluster = ClusterConfig {
        enabled: true,
        warmup_s: 1,
        tick_ms: 200,
        status_interval_ms: 200,
        redundancy: 2,
        instruments: instruments(args.instruments)
            .iter()
            .map(|s| s.parse())
            .collect::<Result<_, _>>()?,
        kinds: vec![TaskKind::Kline],
        depth_stream_mb: 16, // kline tasks only: the diff stream stays empty
        ..ClusterConfig::default()
    };
    let result = async {
        let _sup = start(bin, dir, "supervisor", &["supervisor", "--id", "s1"], &config)?;
        let _w1 = start(bin, dir, "w1", &["worker", "--id", "w1", "--max-load", "64"], &config)?;
        let _w2 = start(bin, dir, "w2", &["worker", "--id", "w2", "--max-load", "64"], &config)?;
        let _gateway = start(bin, dir, "gateway", &["serve"], &config)?;
        wait_healthy(port).await?;
        measure(&format!("127.0.0.1:{port}"), args).await
    }
    .await;
    // leave nothing behind on the shared NATS server and PostgreSQL
    testkit::remove_cluster_streams(&args.nats, &prefix).await;
    drop(db); // its blocking client steps aside from the runtime (see `PgDb`)
    result
}

fn line(name: &str, r: &serde_json::Value) {
    println!(
        "{name:>8}: p50 {} ms, p90 {} ms, p99 {} ms, p99.9 {} ms, max {} ms; {} samples ({:.0}/s), {} duplicates",
        r["p50_ms"], r["p90_ms"], r["p99_ms"], r["p999_ms"], r["max_ms"], r["samples"],
        r["per_s"].as_f64().unwrap_or(0.0), r["duplicates"]
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let bin = match &args.bin {
        Some(b) => b.clone(),
        None => tools::child::millrace_beside_me()?,
    };
    let dir = std::env::temp_dir().join(format!("millrace-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let symbols: Vec<SymbolSpec> =
        SymbolSpec::catalog().into_iter().take(args.instruments.max(1)).collect();
    let sim = Sim::start(
        SimConfig { speed: 1.0, seed: args.seed, symbols, ..SimConfig::default() },
        "127.0.0.1:0".parse()?,
    )
    .await?;
    println!(
        "millrace-e2e: {} clients x {} kline streams, {} s measured, simulator at speed 1",
        args.clients, args.instruments, args.duration_s
    );
    let mut out = serde_json::Map::new();
    if matches!(args.mode, Mode::Both | Mode::Single) {
        let d = dir.join("single");
        std::fs::create_dir_all(&d)?;
        let r = single(&sim, &bin, &d, &args).await.context("single process")?;
        line("single", &r);
        out.insert("single".into(), r);
    }
    if matches!(args.mode, Mode::Both | Mode::Cluster) {
        let d = dir.join("cluster");
        std::fs::create_dir_all(&d)?;
        let r = cluster(&sim, &bin, &d, &args).await.context("cluster")?;
        line("cluster", &r);
        out.insert("cluster".into(), r);
    }
    println!("RESULT {}", serde_json::Value::Object(out));
    sim.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
