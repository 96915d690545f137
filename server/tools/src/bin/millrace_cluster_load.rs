//! `millrace-cluster-load`: the supervisor of seed 004 at scale, over the real NATS.
//!
//! Starts a `millrace supervisor` child process whose configuration pins `--instruments`
//! instruments × 2 kinds (`--instruments 5000` = 10,000 tasks), and `--workers` simulated
//! workers in this process that speak the protocol exactly as `millrace worker` does (status
//! out every `--status-interval-ms` and on change, with every held task and a fresh data age;
//! instruction sets in, applied with `shared::cluster::worker::WorkerTasks`). Measures:
//!
//! - **full assignment**: from the task list's arrival in the supervisor (its log line
//!   `task list`, wall clock) to the last worker having applied the set that completes
//!   `tasks × redundancy` replicas (wall clock; one machine, one clock);
//! - **steady state**: the supervisor process's CPU over `--steady-s` seconds (utime + stime
//!   from `/proc`) and its handler invocations over the same span (from its report), while
//!   every worker keeps publishing its status.
//!
//! Usage: `millrace-cluster-load [--workers 100] [--instruments 5000] [--steady-s 30]`.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use futures_util::StreamExt as _;
use server::cluster::Subjects;
use server::config::Config;
use server::config::{BusConfig, BusKind, ClusterConfig};
use shared::cluster::worker::{Identity, WorkerTasks};
use shared::cluster::{Instructions, TaskKind};
use shared::protocol::ops::ClusterReport;
use shared::protocol::{InstrumentId, Market};

#[derive(Debug, Parser)]
struct Args {
    /// NATS server.
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats: String,
    /// Simulated workers.
    #[arg(long, default_value_t = 100)]
    workers: u32,
    /// Pinned instruments; each is two tasks (kline, depth).
    #[arg(long, default_value_t = 5000)]
    instruments: u32,
    #[arg(long, default_value_t = 2)]
    redundancy: u32,
    /// Each worker's max load [default: enough for every replica with 25 % to spare].
    #[arg(long)]
    max_load: Option<u32>,
    #[arg(long, default_value_t = 1000)]
    status_interval_ms: u64,
    #[arg(long, default_value_t = 1000)]
    tick_ms: u64,
    /// The supervisor's warm-up (it sets how often workers send their full task list).
    #[arg(long, default_value_t = 30)]
    warmup_s: u64,
    /// Seconds of steady state measured.
    #[arg(long, default_value_t = 30)]
    steady_s: u64,
    /// The `millrace` binary [default: beside this one].
    #[arg(long)]
    bin: Option<PathBuf>,
}

/// Replicas applied, over all workers, and when the count last grew (wall clock, ms).
#[derive(Default)]
struct Applied {
    replicas: AtomicU64,
    last_growth_ms: AtomicU64,
}

/// One simulated worker until the process ends.
async fn worker(
    client: async_nats::Client,
    subjects: Subjects,
    id: String,
    max_load: u32,
    every: Duration,
    short_max: u32,
    applied: Arc<Applied>,
) -> anyhow::Result<()> {
    let mut instructions = client.subscribe(subjects.instructions(&id)).await?;
    let tasks = Arc::new(Mutex::new(WorkerTasks::new()));
    let instance = u64::from(std::process::id()) << 32 | u64::from(id.len() as u32);
    // every task with fresh data: no task times out
    let who = Identity { worker: id.clone(), instance, max_load };
    // as `millrace worker`: the full list on change and a few times a warm-up, else data ages
    let status = |t: &mut WorkerTasks| t.next_status(&who, false, |_| Some(100), false, short_max);
    let mut tick = tokio::time::interval(every);
    loop {
        let st = tokio::select! {
            Some(m) = instructions.next() => {
                let set: Instructions = serde_json::from_slice(&m.payload)?;
                let mut t = tasks.lock().unwrap();
                let before = t.wanted().len() as i64;
                if t.apply(&set).is_none() {
                    continue;
                }
                let grew = t.wanted().len() as i64 - before;
                if grew > 0 {
                    applied.replicas.fetch_add(grew as u64, Relaxed);
                    applied.last_growth_ms.store(server::clock::wall_clock_ms() as u64, Relaxed);
                } else if grew < 0 {
                    applied.replicas.fetch_sub((-grew) as u64, Relaxed);
                }
                status(&mut t)
            }
            _ = tick.tick() => status(&mut tasks.lock().unwrap()),
        };
        client.publish(subjects.status(), serde_json::to_vec(&st)?.into()).await?;
    }
}

fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(')').context("/proc stat")?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    Ok(f[11].parse::<u64>()? + f[12].parse::<u64>()?)
}

async fn report(client: &async_nats::Client, subjects: &Subjects) -> Option<ClusterReport> {
    // the supervisor's counters only: no task list
    let query = shared::protocol::ops::ReportQuery { max_tasks: 0 };
    let ask = client.request(subjects.report(), serde_json::to_vec(&query).ok()?.into());
    let m = tokio::time::timeout(Duration::from_secs(5), ask).await.ok()?.ok()?;
    serde_json::from_slice(&m.payload).ok()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let prefix = format!("load{}", std::process::id());
    let subjects = Subjects::new(&prefix);
    let tasks = u64::from(args.instruments) * 2;
    let replicas = tasks * u64::from(args.redundancy);
    let max_load = args
        .max_load
        .unwrap_or_else(|| (replicas * 5 / 4).div_ceil(u64::from(args.workers.max(1))) as u32);
    let dir = std::env::temp_dir().join(format!("millrace-cluster-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let config = Config {
        bus: BusConfig {
            kind: BusKind::Nats,
            url: args.nats.clone(),
            prefix: prefix.clone(),
            ..BusConfig::default()
        },
        cluster: ClusterConfig {
            warmup_s: args.warmup_s,
            tick_ms: args.tick_ms,
            status_interval_ms: args.status_interval_ms,
            redundancy: args.redundancy,
            instruments: (0..args.instruments)
                .map(|i| InstrumentId::new("sim", Market::Spot, format!("S{i}/USDT")))
                .collect(),
            kinds: vec![TaskKind::Kline, TaskKind::Depth],
            ..ClusterConfig::default()
        },
        ..Config::default()
    };
    let path = dir.join("cluster.toml");
    std::fs::write(&path, toml::to_string(&config)?)?;

    let short_max = config.cluster.short_statuses();
    let client = async_nats::connect(&args.nats).await.context("NATS")?;
    let applied = Arc::new(Applied::default());
    let every = Duration::from_millis(args.status_interval_ms);
    for w in 0..args.workers {
        let (c, s, a) = (client.clone(), subjects.clone(), applied.clone());
        tokio::spawn(async move {
            if let Err(e) = worker(c, s, format!("w{w}"), max_load, every, short_max, a).await {
                eprintln!("worker w{w}: {e:#}");
            }
        });
    }
    let bin = match args.bin {
        Some(b) => b,
        None => std::env::current_exe()?.with_file_name("millrace"),
    };
    let log = dir.join("supervisor.log");
    // stopped however this run ends
    let child = tools::KillOnDrop::spawn(
        Command::new(&bin)
            .args(["supervisor", "--id", "load-sup", "--config"])
            .arg(&path)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?),
    )
    .with_context(|| format!("starting {}", bin.display()))?;
    let pid = child.id();
    println!(
        "{} workers (max load {max_load}), {tasks} tasks x {} = {replicas} replicas, prefix {prefix}",
        args.workers, args.redundancy
    );

    // Full assignment.
    let deadline = Instant::now() + Duration::from_secs(120);
    while applied.replicas.load(Relaxed) < replicas {
        if Instant::now() > deadline {
            bail!(
                "only {} of {replicas} replicas applied after 120 s",
                applied.replicas.load(Relaxed)
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let done_ms = applied.last_growth_ms.load(Relaxed);
    let text = std::fs::read_to_string(&log)?;
    let line = text
        .lines()
        .find(|l| l.contains("task list"))
        .context("the supervisor's task list line")?;
    let field = |name: &str| -> Option<u64> {
        let rest = line.split(&format!("{name}=")).nth(1)?;
        rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
    };
    let received = field("received_ms").context("received_ms")?;
    let decided_us = field("decided_us").unwrap_or(0);
    println!(
        "full assignment: {} ms from the task list's arrival to the last replica applied ({} ms deciding)",
        done_ms.saturating_sub(received),
        decided_us / 1000
    );

    // Steady state.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let r0 = report(&client, &subjects).await.context("report")?;
    let (c0, t0) = (cpu_ticks(pid)?, Instant::now());
    tokio::time::sleep(Duration::from_secs(args.steady_s)).await;
    let (c1, t1) = (cpu_ticks(pid)?, Instant::now());
    let r1 = report(&client, &subjects).await.context("report")?;
    let hz = 100.0; // USER_HZ on Linux
    let cpu = (c1 - c0) as f64 / hz / (t1 - t0).as_secs_f64() * 100.0;
    let (s0, s1) = (r0.supervisor.stats, r1.supervisor.stats);
    println!(
        "steady state over {} s: supervisor CPU {cpu:.2} % of one core; statuses {}, ticks {}, timer checks {}, assignments {}, instruction sets {}",
        args.steady_s,
        s1.statuses - s0.statuses,
        s1.ticks - s0.ticks,
        s1.timer_checks - s0.timer_checks,
        s1.assignments - s0.assignments,
        s1.instructions_sent - s0.instructions_sent,
    );
    println!("tasks {}, unassigned {}", r1.tasks_total, r1.unassigned_total);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
