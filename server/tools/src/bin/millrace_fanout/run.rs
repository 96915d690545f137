//! `millrace-fanout run`: the whole measurement, with `serve` and `clients` as child processes
//! of this binary (so the clients' CPU is not the server's, and both can be measured).
//!
//! 1. **Idle memory.** Start `serve`; after 2 s, read its RSS (`/proc/<pid>/status` `VmRSS`).
//!    Start `clients --idle` (connected, nothing subscribed), wait until the server's
//!    `millrace_ws_connections` gauge shows them all, wait 2 s, read the RSS again:
//!    `(after − before) / connections` is the server memory per idle connection. Then close them
//!    and read it once more (what the allocator keeps).
//! 2. **Load.** Start `clients --control` with every connection subscribed (`--streams-per-client`
//!    streams each). For each target in `--targets` (deliveries per second), set the publish
//!    rate to `target × topics / (clients × streams)`, wait `--warmup`, then measure for
//!    `--duration`: deliveries/s counted at the clients, the publish rate achieved (`STATS`),
//!    frames sent by the server (`millrace_ws_messages_sent_total`), latency percentiles, drops
//!    from the rate change on (`millrace_ws_dropped_lagging_total`, `…_slow_send_total`, and
//!    close code 4000 seen by the clients), CPU time of both processes (`/proc/<pid>/stat`) as cores
//!    used, the server's RSS
//!    and the load average. Steps stop at the first saturated one (drops, lost clients, skipped
//!    publishes or under 90 % of the target delivered) unless `--keep-going`.
//! 3. Stop both (the server gracefully) and print a table and `RESULT {json}`.

use std::io::{BufRead as _, Write as _};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::{json, Value};

use tools::child::{metric, metrics};

use crate::common::{
    cpu_time, emit, loadavg, machine_busy, parse_count, parse_duration, raise_nofile_limit,
    rss_bytes, MAX_TOPICS,
};

/// Options of `run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunOpts {
    /// Subscribed clients in the load phase.
    #[arg(long, default_value_t = 5000)]
    pub clients: usize,
    /// Idle connections in the memory phase [default: --clients].
    #[arg(long)]
    pub idle_clients: Option<usize>,
    /// Streams each client subscribes to.
    #[arg(long, default_value_t = 1)]
    pub streams_per_client: usize,
    /// Topics the server publishes on (8 symbols at 1m; more adds 3m, 5m, …).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=MAX_TOPICS as u64))]
    pub topics: u64,
    /// Target deliveries per second of the load steps, comma-separated (k and M suffixes).
    #[arg(long, default_value = "250k,500k,750k,1M,1.25M,1.5M")]
    pub targets: String,
    /// Measurement window of each step.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Time at each new rate before measuring.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Publisher tick (ms): messages due are published together at each tick.
    #[arg(long, default_value_t = 1)]
    pub tick_ms: u64,
    /// Bus capacity per topic (limits.bus_capacity).
    #[arg(long, default_value_t = 1024)]
    pub bus_capacity: usize,
    /// Server sockets with TCP_NODELAY (see `serve --nodelay`); without it Nagle's algorithm
    /// holds small writes while an earlier one is unacknowledged, as in `millrace serve`.
    #[arg(long)]
    pub nodelay: bool,
    /// Tokio worker threads of the server (default: one per core).
    #[arg(long)]
    pub server_threads: Option<usize>,
    /// Tokio worker threads of the clients process (default: one per core).
    #[arg(long)]
    pub client_threads: Option<usize>,
    /// Clients use tokio-tungstenite instead of the built-in minimal WebSocket client.
    #[arg(long)]
    pub tungstenite_clients: bool,
    /// Small and short: 500 clients, one step of 20k deliveries/s for 5 s (1 s warm-up). For
    /// tests; overrides --clients, --targets, --duration and --warmup.
    #[arg(long)]
    pub quick: bool,
    /// Skip the idle-memory phase.
    #[arg(long)]
    pub skip_idle: bool,
    /// Run every target even after a saturated step.
    #[arg(long)]
    pub keep_going: bool,
    /// Also write the result JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// The server is a cluster gateway fed over the NATS server at this URL (`serve --gateway`).
    #[arg(long)]
    pub gateway: Option<String>,
    /// With --gateway: PostgreSQL URL for the gateway's fresh database (`serve --pg`).
    #[arg(long)]
    pub pg: Option<String>,
}

/// A child process of this binary speaking the line protocol.
struct Child {
    name: &'static str,
    process: std::process::Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Child {
    fn spawn(name: &'static str, args: &[String]) -> anyhow::Result<Child> {
        let exe = std::env::current_exe().context("cannot find this executable")?;
        let mut process = Command::new(exe)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("cannot start {name}"))?;
        let stdout = process.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Child { name, stdin: process.stdin.take(), process, lines })
    }

    fn pid(&self) -> u32 {
        self.process.id()
    }

    fn send(&mut self, command: &str) -> anyhow::Result<()> {
        let stdin = self.stdin.as_mut().context("stdin already closed")?;
        writeln!(stdin, "{command}")
            .and_then(|_| stdin.flush())
            .with_context(|| format!("{} is gone", self.name))
    }

    /// The JSON of the next `keyword {...}` line; other lines are shown on stderr.
    fn expect(&mut self, keyword: &str, timeout: Duration) -> anyhow::Result<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match self.lines.recv_timeout(left) {
                Ok(l) => l,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    anyhow::bail!("{}: no {keyword} within {timeout:?}", self.name)
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = self.process.wait().ok();
                    anyhow::bail!("{} ended before {keyword} (exit status {status:?})", self.name)
                }
            };
            match line.split_once(' ') {
                Some((k, rest)) if k == keyword => {
                    return serde_json::from_str(rest)
                        .with_context(|| format!("{}: {line}", self.name))
                }
                Some(("ERROR", rest)) => anyhow::bail!("{}: {rest}", self.name),
                _ => eprintln!("[{}] {line}", self.name),
            }
        }
    }

    /// Closes stdin (the child quits), waits up to `timeout`, then kills it.
    fn finish(mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        drop(self.stdin.take());
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.process.try_wait()? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                eprintln!(
                    "millrace-fanout: {} did not exit within {timeout:?}; killing it",
                    self.name
                );
                let _ = self.process.kill();
                return Ok(self.process.wait()?);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        // Only reached with the child still running on an error path.
        if let Ok(None) = self.process.try_wait() {
            let _ = self.process.kill();
            let _ = self.process.wait();
        }
    }
}

/// Waits until the server's gauge `millrace_ws_connections` satisfies `ok`.
fn wait_connections(
    addr: SocketAddr,
    ok: impl Fn(f64) -> bool,
    timeout: Duration,
) -> anyhow::Result<f64> {
    let deadline = Instant::now() + timeout;
    loop {
        let n = metric(&metrics(addr)?, "millrace_ws_connections");
        if ok(n) {
            return Ok(n);
        }
        anyhow::ensure!(Instant::now() < deadline, "millrace_ws_connections stuck at {n}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn rss(pid: u32) -> u64 {
    rss_bytes(pid).unwrap_or(0)
}

fn cpu_secs(pid: u32) -> f64 {
    cpu_time(pid).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

fn busy_secs() -> f64 {
    machine_busy().map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

pub fn main(mut opts: RunOpts) -> anyhow::Result<()> {
    raise_nofile_limit();
    if opts.quick {
        opts.clients = 500;
        opts.idle_clients = Some(500);
        opts.targets = "20k".into();
        opts.duration = Duration::from_secs(5);
        opts.warmup = Duration::from_secs(1);
    }
    let targets: Vec<f64> = opts
        .targets
        .split(',')
        .map(parse_count)
        .collect::<Result<_, _>>()
        .map_err(anyhow::Error::msg)?;
    anyhow::ensure!(!targets.is_empty(), "--targets is empty");
    anyhow::ensure!(
        (1..=opts.topics as usize).contains(&opts.streams_per_client),
        "--streams-per-client must be between 1 and --topics"
    );
    let machine = json!({
        "cpu": std::fs::read_to_string("/proc/cpuinfo").ok()
            .and_then(|c| c.lines().find(|l| l.starts_with("model name")).map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())),
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "loadavg_at_start": loadavg(),
    });
    println!(
        "millrace-fanout run: {} clients × {} streams, {} topics; machine {machine}",
        opts.clients, opts.streams_per_client, opts.topics
    );

    let mut server_args: Vec<String> = vec![
        "serve".into(),
        "--topics".into(),
        opts.topics.to_string(),
        "--tick-ms".into(),
        opts.tick_ms.to_string(),
        "--bus-capacity".into(),
        opts.bus_capacity.to_string(),
    ];
    if opts.nodelay {
        server_args.push("--nodelay".into());
    }
    if let Some(n) = opts.server_threads {
        server_args.extend(["--worker-threads".into(), n.to_string()]);
    }
    if let Some(url) = &opts.gateway {
        server_args.extend(["--gateway".into(), url.clone()]);
    }
    if let Some(url) = &opts.pg {
        server_args.extend(["--pg".into(), url.clone()]);
    }
    let mut server = Child::spawn("serve", &server_args)?;
    let ready = server.expect("READY", Duration::from_secs(120))?;
    let addr: SocketAddr = ready["addr"].as_str().context("READY without addr")?.parse()?;
    let spid = server.pid();
    let url = format!("ws://{addr}/ws");
    println!("server pid {spid} on {url}");

    let client_args = |extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = vec![
            "clients".into(),
            "--url".into(),
            url.clone(),
            "--topics".into(),
            opts.topics.to_string(),
        ];
        if let Some(n) = opts.client_threads {
            a.extend(["--worker-threads".into(), n.to_string()]);
        }
        if opts.tungstenite_clients {
            a.push("--tungstenite".into());
        }
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };

    // ---- phase 1: memory per idle connection
    let mut idle = Value::Null;
    if !opts.skip_idle {
        let n = opts.idle_clients.unwrap_or(opts.clients);
        std::thread::sleep(Duration::from_secs(2));
        let before = rss(spid);
        let mut c = Child::spawn(
            "idle-clients",
            &client_args(&["--idle", "--control", "--clients", &n.to_string()]),
        )?;
        let up = c.expect("CONNECTED", Duration::from_secs(300))?;
        let connected = up["connected"].as_u64().unwrap_or(0);
        wait_connections(addr, |g| g >= connected as f64, Duration::from_secs(30))?;
        std::thread::sleep(Duration::from_secs(2));
        let after = rss(spid);
        let status = c.finish(Duration::from_secs(30))?;
        wait_connections(addr, |g| g == 0.0, Duration::from_secs(30))?;
        std::thread::sleep(Duration::from_secs(1));
        let closed = rss(spid);
        let per = (after.saturating_sub(before)) as f64 / connected.max(1) as f64;
        println!(
            "idle: {connected} connections ({} failed), server RSS {:.1} -> {:.1} MiB = {:.0} bytes per idle connection; {:.1} MiB after closing them",
            up["failed"], mib(before), mib(after), per, mib(closed)
        );
        idle = json!({
            "connections": connected,
            "failed": up["failed"],
            "first_error": up["first_error"],
            "connect_ms": up["elapsed_ms"],
            "rss_before": before,
            "rss_after": after,
            "rss_after_close": closed,
            "bytes_per_connection": per,
            "clients_exit_ok": status.success(),
        });
    }

    // ---- phase 2: load
    let n = opts.clients;
    let k = opts.streams_per_client;
    let mut load = Child::spawn(
        "clients",
        &client_args(&[
            "--control",
            "--clients",
            &n.to_string(),
            "--streams-per-client",
            &k.to_string(),
        ]),
    )?;
    let cpid = load.pid();
    let up = load.expect("SUBSCRIBED", Duration::from_secs(300))?;
    let subscribed = up["subscribed"].as_u64().unwrap_or(0);
    std::thread::sleep(Duration::from_secs(2));
    let rss_subscribed = rss(spid);
    println!(
        "load: {subscribed} of {n} clients subscribed in {} ms ({} failed{}); server RSS {:.1} MiB",
        up["elapsed_ms"],
        up["failed"],
        up["first_error"].as_str().map(|e| format!(": {e}")).unwrap_or_default(),
        mib(rss_subscribed)
    );
    anyhow::ensure!(subscribed > 0, "no client could subscribe: {}", up["first_error"]);
    let subscriptions = subscribed as f64 * k as f64;

    println!(
        "{:>10} {:>10} {:>11} {:>11} {:>8} {:>8} {:>9} {:>6} {:>6} {:>6} {:>6} {:>6}  load",
        "target/s",
        "publish/s",
        "deliver/s",
        "srv sent/s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "drops",
        "alive",
        "srvCPU",
        "cliCPU",
        "other"
    );
    let mut steps = Vec::new();
    // Client-side close counts are cumulative; a step's are the difference from the last report.
    let mut closes_before = (0u64, 0u64, 0u64);
    for &target in &targets {
        let rate = target * opts.topics as f64 / subscriptions;
        // Drops are counted from the rate change on: a client that cannot keep up at the new
        // rate usually goes during the warm-up.
        let m_step = metrics(addr)?;
        server.send(&format!("rate {rate}"))?;
        server.expect("OK", Duration::from_secs(10))?;
        std::thread::sleep(opts.warmup);
        let load_before = loadavg();
        server.send("stats")?;
        let s0 = server.expect("STATS", Duration::from_secs(10))?;
        let m0 = metrics(addr)?;
        let (sc0, cc0, mb0) = (cpu_secs(spid), cpu_secs(cpid), busy_secs());
        load.send("mark")?;
        load.expect("MARKED", Duration::from_secs(10))?;
        let t0 = Instant::now();
        std::thread::sleep(opts.duration);
        load.send("report")?;
        let r = load.expect("REPORT", Duration::from_secs(30))?;
        let dt = t0.elapsed().as_secs_f64();
        server.send("stats")?;
        let s1 = server.expect("STATS", Duration::from_secs(10))?;
        let m1 = metrics(addr)?;
        let (sc1, cc1, mb1) = (cpu_secs(spid), cpu_secs(cpid), busy_secs());
        let d = |v: &Value, w: &Value, key: &str| {
            w[key].as_f64().unwrap_or(0.0) - v[key].as_f64().unwrap_or(0.0)
        };
        let dm = |name: &str| metric(&m1, name) - metric(&m0, name);
        let dm_step = |name: &str| metric(&m1, name) - metric(&m_step, name);
        let closes = (
            r["lagging_closes"].as_u64().unwrap_or(0),
            r["other_closes"].as_u64().unwrap_or(0),
            r["read_errors"].as_u64().unwrap_or(0),
        );
        let (lagging, other, errors) =
            (closes.0 - closes_before.0, closes.1 - closes_before.1, closes.2 - closes_before.2);
        closes_before = closes;
        let lat = &r["latency_us"];
        let ms = |key: &str| lat[key].as_f64().unwrap_or(0.0) / 1000.0;
        let step = json!({
            "target_per_s": target,
            "publish_rate_set": rate,
            "publish_per_s": d(&s0, &s1, "published") / dt,
            "publish_skipped": d(&s0, &s1, "skipped"),
            // --gateway: updates the gateway's kline de-dup dropped (same topic, open time and
            // event time: the publisher's catch-up after a late tick sends several per ms)
            "dedup_dropped": d(&s0, &s1, "bus_duplicates"),
            "queued_per_s": d(&s0, &s1, "queued") / dt,
            "deliveries_per_s": r["deliveries_per_s"],
            "mbytes_per_s": r["mbytes_per_s"],
            "server_sent_per_s": dm("millrace_ws_messages_sent_total") / dt,
            "latency_ms": {
                "p50": ms("p50"), "p90": ms("p90"), "p99": ms("p99"), "p999": ms("p999"), "max": ms("max"),
                "mean": ms("mean"), "samples": lat["count"],
            },
            "publisher_late_mean_us": d(&s0, &s1, "late_sum_us") / d(&s0, &s1, "ticks").max(1.0),
            "publisher_late_max_us": s1["late_max_us"],
            // From the rate change (warm-up included) to the end of the window.
            "dropped_lagging": dm_step("millrace_ws_dropped_lagging_total"),
            "dropped_slow_send": dm_step("millrace_ws_dropped_slow_send_total"),
            "client_lagging_closes": lagging,
            "client_other_closes": other,
            "client_read_errors": errors,
            "alive": r["alive"],
            "server_cpu_cores": (sc1 - sc0) / dt,
            "clients_cpu_cores": (cc1 - cc0) / dt,
            "machine_busy_cores": (mb1 - mb0) / dt,
            // Busy CPU not charged to the server or the clients: other processes (and some
            // kernel work); near 0 on a quiet machine.
            "other_cpu_cores": ((mb1 - mb0) - (sc1 - sc0) - (cc1 - cc0)) / dt,
            "server_rss": rss(spid),
            "loadavg_before": load_before,
            "loadavg_after": loadavg(),
            "window_s": dt,
        });
        println!(
            "{:>10.0} {:>10.0} {:>11.0} {:>11.0} {:>8.2} {:>8.2} {:>9.1} {:>6} {:>6} {:>6.2} {:>6.2} {:>6.2}  {}",
            target,
            step["publish_per_s"].as_f64().unwrap_or(0.0),
            step["deliveries_per_s"].as_f64().unwrap_or(0.0),
            step["server_sent_per_s"].as_f64().unwrap_or(0.0),
            ms("p50"),
            ms("p99"),
            ms("max"),
            step["dropped_lagging"].as_f64().unwrap_or(0.0) + step["dropped_slow_send"].as_f64().unwrap_or(0.0),
            r["alive"],
            step["server_cpu_cores"].as_f64().unwrap_or(0.0),
            step["clients_cpu_cores"].as_f64().unwrap_or(0.0),
            step["other_cpu_cores"].as_f64().unwrap_or(0.0),
            load_before,
        );
        let mut saturated = Vec::new();
        if step["dropped_lagging"].as_f64().unwrap_or(0.0)
            + step["dropped_slow_send"].as_f64().unwrap_or(0.0)
            > 0.0
        {
            saturated.push("clients dropped");
        }
        if r["alive"].as_u64().unwrap_or(0) < subscribed {
            saturated.push("clients lost");
        }
        if step["publish_skipped"].as_f64().unwrap_or(0.0) > 0.0 {
            saturated.push("the publisher fell 100 ms behind");
        }
        if r["deliveries_per_s"].as_f64().unwrap_or(0.0) < 0.9 * target {
            saturated.push("under 90 % of the target delivered");
        }
        let mut step = step;
        step["saturated"] = json!(saturated);
        steps.push(step);
        if !saturated.is_empty() && !opts.keep_going {
            println!(
                "saturated at target {target:.0}/s ({}); stopping (--keep-going runs every target)",
                saturated.join(", ")
            );
            break;
        }
    }

    // ---- stop
    server.send("rate 0")?;
    server.expect("OK", Duration::from_secs(10))?;
    let clients_status = load.finish(Duration::from_secs(30))?;
    server.send("quit")?;
    let stopped = server.expect("STOPPED", Duration::from_secs(60));
    let server_status = server.finish(Duration::from_secs(30))?;
    if let Err(e) = &stopped {
        eprintln!("millrace-fanout: {e:#}");
    }
    let result = json!({
        "machine": machine,
        "loadavg_at_end": loadavg(),
        "options": {
            "clients": n, "streams_per_client": k, "topics": opts.topics, "tick_ms": opts.tick_ms,
            "bus_capacity": opts.bus_capacity, "nodelay": opts.nodelay, "tungstenite_clients": opts.tungstenite_clients, "duration_s": opts.duration.as_secs_f64(),
            "warmup_s": opts.warmup.as_secs_f64(), "quick": opts.quick, "gateway": opts.gateway.is_some(),
        },
        "idle": idle,
        "subscribed": subscribed,
        "rss_subscribed": rss_subscribed,
        "steps": steps,
        "server_exit_ok": server_status.success() && stopped.is_ok(),
        "clients_exit_ok": clients_status.success(),
    });
    if let Some(path) = &opts.json {
        std::fs::write(path, serde_json::to_string_pretty(&result)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    emit("RESULT", result);
    anyhow::ensure!(server_status.success(), "the server exited with {server_status}");
    anyhow::ensure!(clients_status.success(), "the clients exited with {clients_status}");
    Ok(())
}
