//! `millrace-depth-load`: the depth fan-out load test (issue 3/4, Speed: "2,000 clients each on
//! 1 of 40 books at 100 ms deltas, no client falls behind").
//!
//! Against a running `millrace serve` (by default its 40 simulated stocks' tick-by-tick books),
//! it opens N WebSocket clients; client `i` follows book `i mod B` exactly as the seed's client
//! does: `SUBSCRIBE depth_update@<book>`, `GET /fapi/v1/depth?symbol=<book>&with_id=true`, then
//! the shared sync machine (`BookSync`, spot rule: bridge, continuity, checksum). On a gap or
//! checksum mismatch it re-initialises from a new snapshot, as the seed says. It reports deltas
//! per second, publish-to-apply latency (`now − E`, same machine), and per client: gaps, checksum
//! mismatches, re-initialisations, and whether it was closed as lagging (4000). A client **falls
//! behind** if it lagged, saw a gap or a mismatch, or any delta arrived later than
//! `--max-latency-ms`.
//! Prints one JSON line; exits 1 if any client fell behind.
//!
//! Every client connects from this machine's address, and a server counts connections per
//! client address (`limits.max_connections_per_ip`, 512 by default): start the server with room
//! for all of them, e.g. `MILLRACE_LIMITS__MAX_CONNECTIONS_PER_IP=5000 millrace serve` for 2,000
//! clients (each also opens REST connections for its snapshots).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use futures_util::{SinkExt, StreamExt};
use shared::protocol::{PushData, RestDepthResponse, ServerFrame};
use shared::sync::{BookSync, ContinuityRule, DepthSnapshot, ResyncReason, SyncConfig, SyncEvent};
use tokio_tungstenite::tungstenite::Message;

/// Depth fan-out load test: N seed-algorithm clients against a running millrace.
#[derive(Debug, Parser)]
#[command(name = "millrace-depth-load")]
struct Args {
    /// The server, host:port.
    #[arg(long, default_value = "127.0.0.1:8080")]
    addr: String,
    /// WebSocket clients.
    #[arg(long, default_value_t = 2000)]
    clients: usize,
    /// Books to spread the clients over (the first B tick-by-tick books in /api/v1/ops/books).
    #[arg(long, default_value_t = 40)]
    books: usize,
    /// Seconds of measurement after every client is synced.
    #[arg(long, default_value_t = 60)]
    duration: u64,
    /// A delta applied later than this after its publish counts as falling behind.
    #[arg(long, default_value_t = 1000)]
    max_latency_ms: i64,
    /// PID of the server, to report its CPU and memory.
    #[arg(long)]
    server_pid: Option<u32>,
}

#[derive(Default)]
struct Totals {
    deltas: AtomicU64,
    gaps: AtomicU64,
    mismatches: AtomicU64,
    reinits: AtomicU64,
    /// Extra snapshots while starting (the REST book was older than the first delta).
    startup_snapshots: AtomicU64,
    lagging_closes: AtomicU64,
    other_closes: AtomicU64,
    synced: AtomicU64,
    behind: AtomicU64,
    measuring: std::sync::atomic::AtomicBool,
    /// Latencies (ms) of deltas applied while measuring.
    latencies: Mutex<Vec<u32>>,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

async fn snapshot(http: &reqwest::Client, addr: &str, book: &str) -> anyhow::Result<DepthSnapshot> {
    let url = format!("http://{addr}/fapi/v1/depth?symbol={book}&with_id=true");
    let r: RestDepthResponse = http.get(&url).send().await?.error_for_status()?.json().await?;
    Ok(DepthSnapshot::from(&r.data))
}

async fn client(
    args: Arc<Args>,
    http: reqwest::Client,
    book: String,
    totals: Arc<Totals>,
) -> anyhow::Result<()> {
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{}/ws", args.addr)).await?;
    let stream = format!("depth_update@{book}");
    let req = serde_json::json!({"method": "SUBSCRIBE", "params": [&stream], "id": 1}).to_string();
    ws.send(Message::Text(req.into())).await?;
    // the seed's step 1 before step 2: the subscription is live before the snapshot is taken
    let mut early = Vec::new();
    loop {
        let Some(msg) = ws.next().await else {
            anyhow::bail!("closed before the subscription reply")
        };
        let Message::Text(text) = msg? else { continue };
        match serde_json::from_str::<ServerFrame>(&text)? {
            ServerFrame::Reply(r) if r.is_ok() => break,
            ServerFrame::Reply(r) => anyhow::bail!("{book}: subscription refused: {:?}", r.error),
            ServerFrame::Push(p) => early.push(p),
        }
    }
    let mut config = SyncConfig::new(ContinuityRule::Spot);
    config.verify_interval_ms = None;
    let mut sync = BookSync::new(config);
    for p in early {
        let PushData::DepthUpdate(ev) = p.data else {
            anyhow::bail!("{book}: a {} push on {}", p.data.kind(), p.stream)
        };
        sync.handle_delta((&ev).into(), 0);
    }
    sync.handle_snapshot(snapshot(&http, &args.addr, &book).await?, 0);
    let mut counted_synced = false;
    let mut behind = false;
    // counted at once: the measurement ends by aborting the clients
    let fall_behind = |behind: &mut bool| {
        if !*behind {
            *behind = true;
            totals.behind.fetch_add(1, Relaxed);
        }
    };
    while let Some(msg) = ws.next().await {
        let text = match msg? {
            Message::Text(t) => t,
            Message::Close(frame) => {
                if frame.as_ref().is_some_and(|f| u16::from(f.code) == 4000) {
                    totals.lagging_closes.fetch_add(1, Relaxed);
                    fall_behind(&mut behind);
                } else {
                    totals.other_closes.fetch_add(1, Relaxed);
                }
                break;
            }
            _ => continue,
        };
        let Ok(ServerFrame::Push(push)) = serde_json::from_str::<ServerFrame>(&text) else {
            continue;
        };
        let PushData::DepthUpdate(ev) = push.data else {
            anyhow::bail!("{book}: a {} push on {}", push.data.kind(), push.stream)
        };
        let latency = now_ms() - ev.event_time;
        sync.handle_delta((&ev).into(), 0);
        let mut reinit = false;
        let mut need_snapshot = false;
        while let Some(e) = sync.poll_event() {
            match e {
                SyncEvent::GapDetected { .. } => {
                    totals.gaps.fetch_add(1, Relaxed);
                    reinit = true;
                }
                SyncEvent::ChecksumMismatch { .. } => {
                    totals.mismatches.fetch_add(1, Relaxed);
                    reinit = true;
                }
                // e.g. the snapshot was older than the first delta: the seed's client fetches
                // another (a start-up race, not falling behind)
                SyncEvent::NeedSnapshot { reason: ResyncReason::SnapshotTooOld } => {
                    need_snapshot = true
                }
                _ => {}
            }
        }
        if reinit {
            fall_behind(&mut behind);
            totals.reinits.fetch_add(1, Relaxed);
            sync.handle_snapshot(snapshot(&http, &args.addr, &book).await?, 0);
            continue;
        }
        if need_snapshot && !counted_synced {
            totals.startup_snapshots.fetch_add(1, Relaxed);
            sync.handle_snapshot(snapshot(&http, &args.addr, &book).await?, 0);
            continue;
        }
        if sync.is_synced() && !counted_synced {
            counted_synced = true;
            totals.synced.fetch_add(1, Relaxed);
        }
        if totals.measuring.load(Relaxed) {
            totals.deltas.fetch_add(1, Relaxed);
            if latency > args.max_latency_ms {
                fall_behind(&mut behind);
            }
            totals.latencies.lock().unwrap().push(latency.clamp(0, u32::MAX as i64) as u32);
        }
    }
    Ok(())
}

/// CPU seconds (user + system) and RSS (kB) of a process.
fn proc_usage(pid: u32) -> Option<(f64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit(')').next()?.split_whitespace().collect();
    let tck = 100.0; // USER_HZ on Linux
    let cpu = (fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?) / tck;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some((cpu, rss))
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Arc::new(Args::parse());
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .timeout(Duration::from_secs(30))
        .build()?;
    let books: serde_json::Value =
        http.get(format!("http://{}/api/v1/ops/books", args.addr)).send().await?.json().await?;
    let mut names: Vec<String> = books["books"]
        .as_array()
        .map(|b| {
            b.iter()
                .filter(|b| b["source"].as_str().is_some_and(|s| s.starts_with("l3_")))
                .filter_map(|b| b["instrument"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    names.truncate(args.books);
    anyhow::ensure!(
        !names.is_empty(),
        "the server at {} publishes no tick-by-tick books",
        args.addr
    );

    let totals = Arc::new(Totals::default());
    let mut tasks = Vec::with_capacity(args.clients);
    for i in 0..args.clients {
        let book = names[i % names.len()].clone();
        tasks.push(tokio::spawn(client(args.clone(), http.clone(), book, totals.clone())));
        if i % 100 == 99 {
            tokio::time::sleep(Duration::from_millis(20)).await; // connect in waves, as browsers would
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while totals.synced.load(Relaxed) < args.clients as u64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let synced = totals.synced.load(Relaxed);
    let usage0 = args.server_pid.and_then(proc_usage);
    let t0 = Instant::now();
    totals.measuring.store(true, Relaxed);
    tokio::time::sleep(Duration::from_secs(args.duration)).await;
    totals.measuring.store(false, Relaxed);
    let secs = t0.elapsed().as_secs_f64();
    let usage1 = args.server_pid.and_then(proc_usage);
    for t in &tasks {
        t.abort();
    }
    let mut errors = 0;
    for t in tasks {
        if let Ok(Err(_)) = t.await {
            errors += 1;
        }
    }
    let mut lat = std::mem::take(&mut *totals.latencies.lock().unwrap());
    lat.sort_unstable();
    let behind = totals.behind.load(Relaxed) + (args.clients as u64 - synced) + errors;
    let server = match (usage0, usage1) {
        (Some((c0, _)), Some((c1, rss))) => {
            serde_json::json!({"cpu_cores": (c1 - c0) / secs, "rss_kb": rss})
        }
        _ => serde_json::Value::Null,
    };
    let report = serde_json::json!({
        "clients": args.clients,
        "books": names.len(),
        "synced": synced,
        "seconds": secs,
        "deltas": totals.deltas.load(Relaxed),
        "deltas_per_s": totals.deltas.load(Relaxed) as f64 / secs,
        "latency_ms": {"p50": percentile(&lat, 0.5), "p99": percentile(&lat, 0.99), "max": lat.last().copied().unwrap_or(0)},
        "gaps": totals.gaps.load(Relaxed),
        "checksum_mismatches": totals.mismatches.load(Relaxed),
        "reinits": totals.reinits.load(Relaxed),
        "startup_snapshots": totals.startup_snapshots.load(Relaxed),
        "lagging_closes": totals.lagging_closes.load(Relaxed),
        "other_closes": totals.other_closes.load(Relaxed),
        "client_errors": errors,
        "fell_behind": behind,
        "server": server,
    });
    println!("{report}");
    if behind > 0 {
        std::process::exit(1);
    }
    Ok(())
}
