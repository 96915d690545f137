//! `millrace-fanout serve`: the real service plus a synthetic kline publisher.
//!
//! The service is [`App::start`] with an embedded simulator source (speed 1), no pinned jobs, no
//! backfill and its data in a fresh temp dir, served by [`serve_app`] — the router, WebSocket
//! sessions, per-IP limits, job leases and bus of `millrace serve`. Three settings differ from
//! the defaults: `limits.max_connections_per_ip` is raised (every client comes from 127.0.0.1),
//! `limits.ws_idle_timeout_ms` too (the idle phase's connections subscribe to nothing and must
//! stay open while memory is measured), and, to keep the measured traffic the publisher's,
//! `ingest.forming_min_interval_ms` is an hour, so the ingest jobs the clients' leases start
//! publish their first forming candle and then only closed candles (`"x":true`, at most one per
//! topic per minute), which clients count but leave out of the latency figures.
//!
//! The publisher is a plain thread: it sleeps to the next `--tick-ms` boundary of the wall clock,
//! then publishes every message due by then (the configured rate times the time since the rate
//! was set, minus what it already sent), round-robin over the topics. Each message is a forming
//! 1m (or 3m, …) candle of a seeded random walk on the symbol's catalog price, serialised by
//! [`kline_frame`] with event time `E` = the tick's wall-clock millisecond. So `receive time − E`
//! at a client is the time from the scheduled publish instant to delivery, including the
//! publisher's own wake-up delay (reported as `late_*` in `STATS`).
//!
//! **`--gateway NATS_URL`**: the service is a cluster gateway (`[cluster] enabled`, `[bus] kind =
//! "nats"`, `[store] kind = "postgres"` on a fresh database made from `--pg` and dropped at the
//! end), and the publisher sends on a NATS connection of its own under the same prefix, as a
//! worker does: every message goes publisher → nats-server → the gateway's subscription of its
//! topic (kline de-dup) → fan-out → WebSocket sessions. The clients' subscriptions become the
//! gateway's on-demand cluster tasks (no supervisor runs, so no worker feeds them). The
//! publisher still runs in this process (its NATS client's CPU is counted as the server's);
//! nats-server's CPU shows as `other` in `run`'s tables.
//!
//! stdin, one command a line: `rate <messages/s>` (total over all topics; answers `OK {...}`),
//! `stats` (answers `STATS {...}`), `quit`. End of input also quits, so a server started by
//! `run` never outlives it; Ctrl-C and SIGTERM stop it too.

use std::io::BufRead as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use serde_json::json;
use server::app::{App, Backends, Layer, Stores};
use server::bus::nats::Publisher as BusSide;
use server::bus::{Bus, Fanout, InProcessBus, NatsBus};
use server::candles::writer::kline_frame;
use server::cluster::gateway::GatewayLayer;
use server::cluster::Role;
use server::config::{BusConfig, BusKind, StoreConfig, StoreKind};
use server::config::{Config, SourceConfig};
use server::http::{serve_app, ServeConfig};
use server::shutdown::signal as shutdown_signal;
use server::shutdown::Shutdown;
use shared::candle::Candle;
use shared::protocol::SeriesId;
use shared::testkit::Rng;
use shared::{Price, Volume};
use sim::SymbolSpec;

use testkit::PgDb;

use crate::common::{emit, raise_nofile_limit, topic_series, wall_us, MAX_TOPICS};

/// Options of `serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeOpts {
    /// Address to listen on (port 0 = any free port; the chosen one is in the READY line).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub addr: SocketAddr,
    /// Topics to publish on: kline@sim:spot:<BASE>/USDT:1m for the 8 simulator symbols, then
    /// the same symbols at 3m, 5m, … (at most 96).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=MAX_TOPICS as u64))]
    pub topics: u64,
    /// Messages per second published in total over all topics, until a `rate` command.
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// The publisher wakes at every multiple of this many milliseconds of the wall clock and
    /// publishes what is due.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub tick_ms: u64,
    /// Messages buffered per topic for slow subscribers (limits.bus_capacity); a client further
    /// behind is closed with code 4000.
    #[arg(long, default_value_t = 1024)]
    pub bus_capacity: usize,
    /// Seed of the synthetic candles' random walk (same seed, same frames).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Tokio worker threads (default: one per core).
    #[arg(long)]
    pub worker_threads: Option<usize>,
    /// Set TCP_NODELAY on the listening socket, which Linux copies to every accepted socket
    /// (`millrace serve` does not, so Nagle's algorithm is on for its connections).
    #[arg(long)]
    pub nodelay: bool,
    /// Ignore stdin (run until Ctrl-C / SIGTERM), e.g. when started in the background.
    #[arg(long)]
    pub no_stdin: bool,
    /// Serve as a cluster gateway fed over the NATS server at this URL (see the module docs).
    #[arg(long)]
    pub gateway: Option<String>,
    /// With --gateway: a PostgreSQL URL whose user may create databases; the gateway's store is
    /// a fresh database, dropped at the end.
    #[arg(long, default_value = "postgres://postgres:postgres@127.0.0.1:5432/postgres")]
    pub pg: String,
}

/// Counters and settings shared by the publisher, the control thread and the service.
#[derive(Default)]
struct Publisher {
    /// Messages per second (f64 bits).
    rate_bits: AtomicU64,
    /// Bumped at each rate change; the publisher restarts its schedule from there.
    generation: AtomicU64,
    stop: AtomicBool,
    /// Messages published.
    published: AtomicU64,
    /// Sum over messages of the subscribers each was queued for (deliveries offered to sessions).
    queued: AtomicU64,
    /// Messages not published because the publisher fell more than 100 ms behind its schedule.
    skipped: AtomicU64,
    /// Ticks with at least one message.
    ticks: AtomicU64,
    /// Microseconds from the tick boundary to the end of its publishing: sum, and maximum since
    /// the last `stats`.
    late_sum_us: AtomicU64,
    late_max_us: AtomicU64,
}

impl Publisher {
    fn set_rate(&self, rate: f64) {
        self.rate_bits.store(rate.to_bits(), Relaxed);
        self.generation.fetch_add(1, Relaxed);
    }

    fn stats(
        &self,
        fanout: &Fanout,
        gateway: Option<&NatsBus>,
        topics: &[String],
    ) -> serde_json::Value {
        let ticks = self.ticks.load(Relaxed);
        let subscribers: Vec<usize> = topics.iter().map(|t| fanout.subscriber_count(t)).collect();
        json!({
            "bus_duplicates": gateway.map_or(0, |b| b.stats().duplicates.load(Relaxed)),
            "rate": f64::from_bits(self.rate_bits.load(Relaxed)),
            "published": self.published.load(Relaxed),
            "queued": self.queued.load(Relaxed),
            "skipped": self.skipped.load(Relaxed),
            "ticks": ticks,
            "late_sum_us": self.late_sum_us.load(Relaxed),
            // Since the previous `stats`, so a caller gets a per-window maximum.
            "late_max_us": self.late_max_us.swap(0, Relaxed),
            "subscribers": subscribers.iter().sum::<usize>(),
            "subscribers_per_topic": subscribers,
        })
    }
}

/// One topic's synthetic forming candle.
struct Walk {
    series: SeriesId,
    topic: String,
    tick: i64,
    lot: i64,
    candle: Candle,
}

impl Walk {
    fn new(series: SeriesId, spec: &SymbolSpec) -> Self {
        let p = spec.reference_price;
        Walk {
            topic: format!("kline@{series}"),
            series,
            tick: spec.tick.raw(),
            lot: spec.lot.raw(),
            candle: Candle::one_minute(0, p, p, p, p, Volume::from_raw(0), 0),
        }
    }

    /// The next forming candle at event time `e_ms`, serialised.
    fn next_frame(&mut self, rng: &mut Rng, e_ms: i64) -> Bytes {
        let d = self.series.timeframe.duration_ms();
        let open_time = e_ms - e_ms.rem_euclid(d);
        let c = &mut self.candle;
        if c.open_time != open_time {
            let p = c.close;
            *c = Candle::one_minute(open_time, p, p, p, p, Volume::from_raw(0), 0);
            c.minutes = self.series.timeframe.minutes();
        }
        let step = (rng.below(5) as i64 - 2) * self.tick;
        let close = Price::from_raw((c.close.raw() + step).max(self.tick));
        c.close = close;
        c.high = c.high.max(close);
        c.low = c.low.min(close);
        c.volume =
            Volume::from_raw(c.volume.raw() + (self.lot * (1 + rng.below(4) as i64)) as i128);
        c.trades += 1;
        kline_frame(&self.series, c, false, e_ms)
    }
}

fn publisher_loop(
    state: Arc<Publisher>,
    bus: Arc<dyn Bus>,
    mut walks: Vec<Walk>,
    tick_ms: u64,
    seed: u64,
) {
    let tick_us = tick_ms as i64 * 1000;
    let mut rng = Rng::new(seed);
    let mut generation = u64::MAX;
    let mut base_us = 0i64;
    let mut sent_since = 0u64;
    let mut next_topic = 0usize;
    while !state.stop.load(Relaxed) {
        let now = wall_us();
        let boundary = (now / tick_us + 1) * tick_us;
        std::thread::sleep(Duration::from_micros((boundary - now) as u64));
        let g = state.generation.load(Relaxed);
        let rate = f64::from_bits(state.rate_bits.load(Relaxed));
        if g != generation {
            generation = g;
            base_us = boundary;
            sent_since = 0;
        }
        let due = (rate * (boundary - base_us) as f64 / 1e6) as u64;
        let mut n = due.saturating_sub(sent_since);
        // Never burst more than 100 ms worth after a stall; count what is given up.
        let cap = ((rate / 10.0) as u64).max(1);
        if n > cap {
            state.skipped.fetch_add(n - cap, Relaxed);
            sent_since += n - cap;
            n = cap;
        }
        if n == 0 {
            continue;
        }
        let e_ms = boundary / 1000;
        let mut queued = 0u64;
        for _ in 0..n {
            let len = walks.len();
            let walk = &mut walks[next_topic];
            next_topic = (next_topic + 1) % len;
            let frame = walk.next_frame(&mut rng, e_ms);
            queued += bus.publish(&walk.topic, frame) as u64;
        }
        sent_since += n;
        state.published.fetch_add(n, Relaxed);
        state.queued.fetch_add(queued, Relaxed);
        state.ticks.fetch_add(1, Relaxed);
        let late = (wall_us() - boundary).max(0) as u64;
        state.late_sum_us.fetch_add(late, Relaxed);
        state.late_max_us.fetch_max(late, Relaxed);
    }
}

/// The service's configuration for the load test (see the module docs).
fn config(opts: &ServeOpts, dir: &std::path::Path, db: Option<&PgDb>) -> anyhow::Result<Config> {
    let static_dir = dir.join("static");
    std::fs::create_dir_all(&static_dir).context("cannot create the static dir")?;
    std::fs::write(static_dir.join("index.html"), "<!doctype html><title>millrace-fanout</title>")
        .context("cannot write index.html")?;
    let mut c = Config::default();
    c.server.data_dir = dir.join("data");
    c.server.static_dir = Some(static_dir);
    c.ingest.pinned = vec![];
    c.ingest.ondemand_max_jobs = 0;
    c.ingest.forming_min_interval_ms = 3_600_000;
    c.backfill = vec![];
    c.limits.max_connections_per_ip = 1_000_000;
    // the idle phase holds connections with no subscription for longer than the default
    c.limits.ws_idle_timeout_ms = 86_400_000;
    c.limits.bus_capacity = opts.bus_capacity;
    c.sources = vec![SourceConfig { speed: 1.0, seed: opts.seed, ..SourceConfig::default() }];
    if let (Some(url), Some(db)) = (&opts.gateway, db) {
        let prefix = format!("fanout{}", std::process::id());
        c.bus = BusConfig { kind: BusKind::Nats, url: url.clone(), prefix, ..BusConfig::default() };
        c.store = StoreConfig {
            kind: StoreKind::Postgres,
            url: Some(db.url().to_string()),
            ..Default::default()
        };
        c.cluster.enabled = true;
        c.cluster.id = Some("fanout-gateway".into());
        c.cluster.instruments = vec![];
    }
    c.validate()?;
    Ok(c)
}

pub fn main(opts: ServeOpts) -> anyhow::Result<()> {
    let nofile = raise_nofile_limit();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let dir: PathBuf = std::env::temp_dir().join(format!("millrace-fanout-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let db = opts.gateway.as_ref().map(|_| PgDb::create(&opts.pg, "fanout")).transpose()?;
    let config = config(&opts, &dir, db.as_ref())?;
    let serve_config = ServeConfig::new(config.clone())?;

    let mut rt = tokio::runtime::Builder::new_multi_thread();
    rt.enable_all();
    if let Some(n) = opts.worker_threads {
        rt.worker_threads(n.max(1));
    }
    let rt = rt.build().context("cannot start the tokio runtime")?;
    let result = rt.block_on(run(opts, config, serve_config, nofile));
    rt.shutdown_timeout(Duration::from_secs(2));
    drop(db);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn run(
    opts: ServeOpts,
    config: Config,
    serve_config: ServeConfig,
    nofile: u64,
) -> anyhow::Result<()> {
    // The tool chooses the service's bus and keeps a handle on its fan-out: the in-process bus
    // (the default), or a gateway's NATS bus with a second connection to publish on.
    let capacity = config.limits.bus_capacity;
    let tools = Shutdown::new();
    let stores = Stores::open(&config).await?;
    type Gateway = Option<Box<dyn Layer + Send>>;
    let (backends, fanout, gateway, publish_on, layer): (
        Backends,
        Fanout,
        _,
        Arc<dyn Bus>,
        Gateway,
    ) = match &opts.gateway {
        None => {
            let bus = Arc::new(InProcessBus::new(capacity));
            let fanout = bus.fanout().clone();
            (stores.with_bus(bus.clone()), fanout, None, bus, None)
        }
        Some(url) => {
            let prefix = config.bus.prefix.clone();
            let client = server::cluster::connect(&config.bus, Role::Gateway, "millrace-fanout")
                .await
                .context("the gateway's NATS connection")?;
            let bus =
                Arc::new(NatsBus::new(client.clone(), &prefix, BusSide::Gateway, capacity, &tools));
            let worker = async_nats::connect(url.as_str()).await.with_context(|| {
                format!("cannot connect to NATS at --gateway {}", server::redact::redact(url))
            })?;
            // (it publishes closed candles too, as the persister does: the gateway's side)
            let worker_bus: Arc<dyn Bus> =
                Arc::new(NatsBus::new(worker, &prefix, BusSide::Gateway, PUBLISH_CAPACITY, &tools));
            let fanout = bus.fanout().clone();
            let layer = config.cluster.enabled.then(|| {
                Box::new(GatewayLayer { client, bus: Some(bus.clone()) }) as Box<dyn Layer + Send>
            });
            (stores.with_bus(bus.clone()), fanout, Some(bus), worker_bus, layer)
        }
    };
    let app = Arc::new(App::start_layered(config.clone(), backends, layer).await?);
    // Subscriptions need the simulator's symbols; wait for them before saying READY.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !app.sources().snapshot(false).iter().all(|s| s.ready) {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the simulator source did not become ready in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let socket = if opts.addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }?;
    socket.set_reuseaddr(true)?;
    if opts.nodelay {
        socket.set_nodelay(true)?;
    }
    socket.bind(opts.addr).with_context(|| format!("cannot listen on --addr {}", opts.addr))?;
    // A deep accept queue: thousands of clients connect at once.
    let listener = socket.listen(4096)?;
    let addr = listener.local_addr()?;

    let series = topic_series(opts.topics as usize);
    let specs = SymbolSpec::catalog();
    let walks: Vec<Walk> = series
        .iter()
        .enumerate()
        .map(|(i, s)| Walk::new(s.clone(), &specs[i % specs.len()]))
        .collect();
    let topics: Vec<String> = walks.iter().map(|w| w.topic.clone()).collect();
    let state = Arc::new(Publisher::default());
    state.set_rate(opts.rate.max(0.0));
    let publisher = {
        let (state, bus, tick, seed) = (state.clone(), publish_on.clone(), opts.tick_ms, opts.seed);
        std::thread::Builder::new()
            .name("fanout-publisher".into())
            .spawn(move || publisher_loop(state, bus, walks, tick, seed))?
    };

    let quit = Arc::new(tokio::sync::Notify::new());
    if !opts.no_stdin {
        let (quit, state, fanout, topics) =
            (quit.clone(), state.clone(), fanout.clone(), topics.clone());
        let gateway = gateway.clone();
        std::thread::Builder::new().name("fanout-control".into()).spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                let mut words = line.split_whitespace();
                match (words.next(), words.next()) {
                    (Some("rate"), Some(r)) => match crate::common::parse_count(r) {
                        Ok(rate) => {
                            state.set_rate(rate);
                            emit("OK", json!({ "rate": rate }));
                        }
                        Err(e) => emit("ERROR", json!({ "msg": e.to_string() })),
                    },
                    (Some("stats"), None) => {
                        emit("STATS", state.stats(&fanout, gateway.as_deref(), &topics))
                    }
                    (Some("quit"), None) => break,
                    (None, _) => {}
                    _ => emit(
                        "ERROR",
                        json!({ "msg": format!("unknown command {line:?}; use rate N | stats | quit") }),
                    ),
                }
            }
            quit.notify_one();
        })?;
    }

    emit(
        "READY",
        json!({
            "addr": addr.to_string(),
            "pid": std::process::id(),
            "topics": topics,
            "tick_ms": opts.tick_ms,
            "bus_capacity": opts.bus_capacity,
            "nofile": nofile,
            "nodelay": opts.nodelay,
            "gateway": opts.gateway.is_some(),
        }),
    );
    let shutdown = async move {
        tokio::select! {
            _ = quit.notified() => {}
            _ = shutdown_signal() => {}
        }
    };
    let served = serve_app(listener, serve_config, app.clone(), shutdown).await;
    state.stop.store(true, Relaxed);
    let _ = publisher.join();
    emit("STOPPED", state.stats(&fanout, gateway.as_deref(), &topics));
    tools.stop();
    if let Some(url) = &opts.gateway {
        testkit::remove_cluster_streams(url, &config.bus.prefix).await;
    }
    Ok(served?)
}

/// Frames the publisher's NATS bus may queue (a worker's default).
const PUBLISH_CAPACITY: usize = 1024;
