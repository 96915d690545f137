//! `sim`: millrace's built-in simulated exchange, the default source.
//!
//! It runs a small matching engine per symbol with simulated participants ([`engine`]), builds
//! trades, books and klines from it ([`market`], [`klines`]), generates deterministic history
//! before its start ([`history`]), and serves all of it on loopback **in Binance's own wire
//! protocol** ([`server`], [`rest`], [`ws`]), so millrace's real Binance connector talks to it
//! unchanged. Faults can be injected on purpose ([`faults`]).
//!
//! ## Using it
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use sim::{Sim, SimConfig};
//! let sim = Sim::start(SimConfig { speed: 60.0, ..SimConfig::default() },
//! "127.0.0.1:0".parse()?).await?;
//! let rest = sim.rest_base(); // http://127.0.0.1:PORT  (+ /api/v3/klines ...)
//! let ws = sim.ws_base(); //     ws://127.0.0.1:PORT    (+ /stream?streams=btcusdt@kline_1m)
//! let truth = sim.closed_klines("BTCUSDT", 0, sim.now_ms()); // the oracle
//! sim.faults().drop_connections(None);
//! sim.shutdown();
//! sim.stopped().await;
//! # Ok(()) }
//! ```
//! `millrace sim` runs it standalone ([`SimArgs`], [`run_until`]); with `--state-file` its clock
//! survives restarts ([`clock_file`]).
//!
//! ## Guarantees
//! - **Fixed point.** Prices are integer ticks, quantities integer steps; random `f64`s only
//!   choose actions.
//! - **Deterministic per seed.** The engine's actions are drawn in order from a seeded
//!   `SmallRng`, so the book, trades and klines at a simulated time do not depend on how the real
//!   clock sliced the work; history is a pure function of (seed, symbol, minute).
//! - **Klines.** Each closed 1m kline is recorded (the oracle, [`SimHandle::closed_klines`]) and
//!   published once with `x:true` right after its minute ends; a minute without trades is
//!   Binance's flat candle. History ends exactly at the live start price. REST intervals above
//!   1m are merges of the 1m ([`shared::candle::merge`]).
//! - **Depth.** Update ids grow by one per book-changing action; diffs and REST snapshots obey
//!   Binance's spot and futures continuity rules (see [`market`]), so a client running the sync
//!   algorithm ends with exactly [`SimHandle::book`].
//! - **Light when idle.** One 50 ms driver tick for all symbols, a ping timer per connection,
//!   nothing serialised for streams without subscribers.
//! - **Slow clients** are dropped when their bounded queue fills; they never stall the engine.

pub mod clock;
pub mod clock_file;
mod control;
pub mod engine;
pub mod faults;
pub mod history;
pub mod hub;
pub mod klines;
mod limiter;
pub mod market;
pub mod rest;
pub mod server;
mod state;
pub mod symbols;
pub mod tbt;
pub mod venues;
pub mod ws;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use shared::candle::Candle;
use shared::Level;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use clock::SimClock;
pub use faults::{
    FaultCommand, FaultCounters, FaultPlan, Faults, MessageFault, StreamClass, StreamTarget,
};
pub use symbols::SymbolSpec;

/// Configuration of a simulated exchange. `Default` is Binance-like: the eight catalog symbols,
/// real-time speed, pings every 20 s, 6000 weight per minute, 24 h connections.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Seed of every random choice (engine participants, history).
    pub seed: u64,
    /// Simulated time per real time: 60 = one simulated minute per real second.
    pub speed: f64,
    /// The instruments ([`SymbolSpec::catalog`] by default).
    pub symbols: Vec<SymbolSpec>,
    /// Simulated start time, ms since the Unix epoch; `None`: the wall clock at start.
    pub start_ms: Option<i64>,
    /// How often the server pings each WebSocket (Binance spot: 20 s).
    pub ping_interval: Duration,
    /// A connection whose ping stays unanswered this long is closed (Binance: 1 min).
    pub pong_timeout: Duration,
    /// REST request weight allowed per window and IP (Binance spot: 6000 per minute).
    pub rest_weight_per_minute: u64,
    /// The rate-limit window (Binance: one minute).
    pub rate_window: Duration,
    /// Requests answered 429 within one window before the IP is banned (418).
    pub ban_after_violations: u32,
    /// How long a ban lasts (Binance: 2 minutes, growing to 3 days).
    pub ban_duration: Duration,
    /// WebSocket connections are closed at this age (Binance: 24 h); `None`: never.
    pub max_connection_age: Option<Duration>,
    /// Frames a WebSocket connection may have queued before it is dropped as too slow.
    pub ws_queue: usize,
    /// Streams one connection may subscribe to (Binance: 1024).
    pub max_streams_per_connection: usize,
    /// The tick-by-tick feed (`/tbt/*`, [`tbt`]).
    pub tbt: tbt::TbtConfig,
    /// Bearer token of the control requests (`POST /sim/faults`, `POST /tbt/control`); `None`:
    /// control over HTTP is disabled (403). The [`SimHandle`] controls work without it.
    pub control_token: Option<String>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            seed: 1,
            speed: 1.0,
            symbols: SymbolSpec::catalog(),
            start_ms: None,
            ping_interval: Duration::from_secs(20),
            pong_timeout: Duration::from_secs(60),
            rest_weight_per_minute: 6_000,
            rate_window: Duration::from_secs(60),
            ban_after_violations: 5,
            ban_duration: Duration::from_secs(120),
            max_connection_age: Some(Duration::from_secs(24 * 3600)),
            ws_queue: 4_096,
            max_streams_per_connection: 1_024,
            tbt: tbt::TbtConfig::default(),
            control_token: None,
        }
    }
}

impl SimConfig {
    /// The catalog entries named in `names` (any case); an unknown name is an error that lists
    /// the known ones.
    pub fn symbols_named<S: AsRef<str>>(names: &[S]) -> anyhow::Result<Vec<SymbolSpec>> {
        names
            .iter()
            .map(|n| {
                SymbolSpec::by_name(n.as_ref()).ok_or_else(|| {
                    let known: Vec<String> =
                        SymbolSpec::catalog().into_iter().map(|s| s.symbol).collect();
                    anyhow::anyhow!(
                        "unknown simulator symbol {:?}; known: {}",
                        n.as_ref(),
                        known.join(", ")
                    )
                })
            })
            .collect()
    }
}

/// The simulated exchange.
pub struct Sim;

impl Sim {
    /// Starts the simulator on the current tokio runtime, listening on `bind` (port 0 picks a
    /// free port; see [`SimHandle::addr`]). Fails when the address is taken or a symbol spec is
    /// invalid. Returns once it listens; the engine and the server run as spawned tasks, until
    /// [`SimHandle::shutdown`].
    pub async fn start(config: SimConfig, bind: SocketAddr) -> anyhow::Result<SimHandle> {
        Self::start_until(config, bind, CancellationToken::new()).await
    }

    /// [`Sim::start`], stopping also when `stop` is cancelled (a service that embeds the
    /// simulator passes a token of its own shutdown).
    pub async fn start_until(
        config: SimConfig,
        bind: SocketAddr,
        stop: CancellationToken,
    ) -> anyhow::Result<SimHandle> {
        let r = server::start(config, bind, stop).await?;
        Ok(SimHandle {
            inner: Arc::new(Inner {
                addr: r.addr,
                ex: r.ex,
                hub: r.hub,
                faults: r.faults,
                stop: r.stop,
                tbt: r.tbt,
                tasks: r.tasks,
            }),
        })
    }
}

struct Inner {
    addr: SocketAddr,
    ex: Arc<market::Exchange>,
    hub: Arc<hub::Hub>,
    faults: Arc<Faults>,
    /// Cancelled on shutdown: every task and thread of the simulator watches it.
    stop: CancellationToken,
    tbt: tbt::TbtHandle,
    /// The driver, the server, its sessions' feed and the tick-by-tick generator thread.
    tasks: TaskTracker,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A running simulator. Cheap to clone; the simulator shuts down when [`SimHandle::shutdown`]
/// is called or the last clone is dropped.
#[derive(Clone)]
pub struct SimHandle {
    inner: Arc<Inner>,
}

impl SimHandle {
    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// REST base URL, `http://127.0.0.1:PORT` (Binance paths follow: `/api/v3/klines`,
    /// `/fapi/v1/depth`).
    pub fn rest_base(&self) -> String {
        format!("http://{}", self.inner.addr)
    }

    /// Spot WebSocket base URL, `ws://127.0.0.1:PORT` (`/ws/<stream>`, `/stream?streams=`).
    pub fn ws_base(&self) -> String {
        format!("ws://{}", self.inner.addr)
    }

    /// USD-M futures WebSocket base URL, `ws://127.0.0.1:PORT/fapi` (depth diffs carry `pu`).
    pub fn futures_ws_base(&self) -> String {
        format!("ws://{}/fapi", self.inner.addr)
    }

    /// The tick-by-tick feed: hot spots, pause, wire drops, snapshots and the true books.
    pub fn tbt(&self) -> tbt::TbtHandle {
        self.inner.tbt.clone()
    }

    /// The fault-injection handle.
    pub fn faults(&self) -> Arc<Faults> {
        self.inner.faults.clone()
    }

    /// The oracle: exactly the closed 1m candles the exchange has (generated history before the
    /// start, recorded live minutes after), open time in `[start_ms, end_ms]`, oldest first.
    /// Empty for an unknown symbol.
    pub fn closed_klines(&self, symbol: &str, start_ms: i64, end_ms: i64) -> Vec<Candle> {
        match self.inner.ex.market(symbol) {
            Some(m) => market::plain(&m.closed_klines(start_ms, end_ms)),
            None => Vec::new(),
        }
    }

    /// The whole book of `symbol` with its update id: `(last_update_id, bids, asks)`, best
    /// first. `None` for an unknown symbol.
    pub fn book(&self, symbol: &str) -> Option<(u64, Vec<Level>, Vec<Level>)> {
        let b = self.inner.ex.market(symbol)?.book(usize::MAX);
        Some((b.last_update_id, b.bids, b.asks))
    }

    /// The listed symbols (`BTCUSDT`, ...).
    pub fn symbols(&self) -> Vec<String> {
        self.inner.ex.markets.iter().map(|m| m.spec.symbol.clone()).collect()
    }

    /// Simulated now, ms since the Unix epoch.
    pub fn now_ms(&self) -> i64 {
        self.inner.ex.clock.now_ms()
    }

    /// How far, in simulated ms, the engine of `symbol` lags the clock. The driver runs every
    /// market to the clock each tick (50 ms), so a lag of more than a few ticks' worth means it
    /// is not running and the market stands still: no trades, no book changes, so no message
    /// for a fault to act on. For a test's diagnosis; `None` for an unknown symbol.
    pub fn engine_lag_ms(&self, symbol: &str) -> Option<i64> {
        let m = self.inner.ex.market(symbol)?;
        Some(self.now_ms() - m.now_ms())
    }

    /// The simulated clock.
    pub fn clock(&self) -> SimClock {
        self.inner.ex.clock
    }

    /// Open WebSocket connections.
    pub fn connections(&self) -> usize {
        self.inner.hub.connections()
    }

    /// WebSocket connections opened since start (upstream connects and reconnects).
    pub fn connections_opened(&self) -> u64 {
        self.inner.hub.connections_opened()
    }

    /// Starts shutting down: WebSockets get a 1001 close, the server stops accepting, the
    /// engine stops. Returns at once; [`SimHandle::stopped`] waits for the end.
    pub fn shutdown(&self) {
        self.inner.stop.cancel();
    }

    /// Waits until the driver, the server and the generator have stopped (after
    /// [`SimHandle::shutdown`]).
    pub async fn stopped(&self) {
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
    }
}

/// `millrace sim`: the simulated exchange on its own.
#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9100", env = "MILLRACE_SIM_ADDR")]
    pub addr: SocketAddr,
    /// Simulated time per real time (60: one simulated minute per second).
    #[arg(long, alias = "sim-speed", default_value_t = 1.0, env = "MILLRACE_SIM_SPEED")]
    pub speed: f64,
    /// Seed of the simulation (same seed, same markets).
    #[arg(long, default_value_t = 1, env = "MILLRACE_SIM_SEED")]
    pub seed: u64,
    /// Symbols to simulate, comma separated (default: all of BTCUSDT, ETHUSDT, BNBUSDT,
    /// SOLUSDT, XRPUSDT, ADAUSDT, DOGEUSDT, LTCUSDT).
    #[arg(long, value_delimiter = ',', env = "MILLRACE_SIM_SYMBOLS")]
    pub symbols: Vec<String>,
    /// Bearer token the control requests (`POST /sim/faults`, `POST /tbt/control`) must carry
    /// (at least 8 characters); without one, control over HTTP is disabled.
    #[arg(long, env = "MILLRACE_SIM_TOKEN", hide_env_values = true)]
    pub control_token: Option<String>,
    /// A file that keeps the simulated clock across restarts: a restarted simulator resumes
    /// after the time the last run served, if that is ahead of the wall clock (after a run at
    /// `--speed 60` it is), so a server following it closes candles again at once. Rewritten
    /// every second and at shutdown; a damaged file is an error.
    #[arg(long, env = "MILLRACE_SIM_STATE")]
    pub state_file: Option<std::path::PathBuf>,
}

impl SimArgs {
    /// The configuration these arguments describe.
    pub fn config(&self) -> anyhow::Result<SimConfig> {
        if !(self.speed.is_finite() && self.speed > 0.0) {
            anyhow::bail!("--speed must be a positive number, got {}", self.speed);
        }
        if self.control_token.as_deref().is_some_and(|t| t.trim().len() < 8) {
            anyhow::bail!("--control-token (MILLRACE_SIM_TOKEN) must be at least 8 characters");
        }
        let mut c = SimConfig {
            seed: self.seed,
            speed: self.speed,
            control_token: self.control_token.clone(),
            ..SimConfig::default()
        };
        if !self.symbols.is_empty() {
            c.symbols = SimConfig::symbols_named(&self.symbols)?;
        }
        Ok(c)
    }
}

/// Runs the simulator described by `args` until `shutdown` completes (the `millrace sim`
/// command passes Ctrl-C / SIGTERM), then stops it, waiting at most 5 s. With a state file the
/// clock resumes from it and is saved every [`clock_file::SAVE_EVERY`] and at the end.
pub async fn run_until(
    args: &SimArgs,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let mut config = args.config()?;
    let clock_file = args.state_file.as_ref().map(clock_file::ClockFile::new);
    if let Some(file) = &clock_file {
        config.start_ms = file.resume_ms(clock::wall_clock_ms())?;
        if let Some(ms) = config.start_ms {
            eprintln!(
                "millrace sim: the clock resumes at {ms} ms, {} s ahead of the wall clock ({})",
                (ms - clock::wall_clock_ms()) / 1000,
                file.path().display()
            );
        }
    } else if config.speed > 1.0 {
        eprintln!(
            "millrace sim: no --state-file: a restart begins at the wall clock again, behind what this run at speed {} serves",
            config.speed
        );
    }
    let speed = config.speed;
    let sim = Sim::start(config, args.addr).await?;
    eprintln!(
        "millrace sim: REST {} · WebSocket {} · futures WebSocket {}",
        sim.rest_base(),
        sim.ws_base(),
        sim.futures_ws_base()
    );
    match &clock_file {
        None => shutdown.await,
        Some(file) => {
            // A file that cannot be written at all is a configuration error (returning drops
            // `sim`, which stops it); one that fails later (a full disk) is reported, and the
            // exchange keeps serving.
            file.save(sim.now_ms(), speed, false)?;
            let save = async {
                let period = clock_file::SAVE_EVERY;
                let mut every =
                    tokio::time::interval_at(tokio::time::Instant::now() + period, period);
                let mut failing = false;
                loop {
                    every.tick().await;
                    match file.save(sim.now_ms(), speed, false) {
                        Ok(()) if failing => {
                            failing = false;
                            eprintln!("millrace sim: the clock file is written again");
                        }
                        Ok(()) => {}
                        Err(e) if !failing => {
                            failing = true;
                            eprintln!("millrace sim: {e}; retrying every {period:?}");
                        }
                        Err(_) => {}
                    }
                }
            };
            tokio::select! {
                () = shutdown => {}
                () = save => {}
            }
        }
    }
    sim.shutdown();
    let end = sim.now_ms();
    let _ = tokio::time::timeout(Duration::from_secs(5), sim.stopped()).await;
    if let Some(file) = &clock_file {
        file.save(end, speed, true)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(token: Option<&str>) -> SimArgs {
        SimArgs {
            addr: "127.0.0.1:0".parse().unwrap(),
            speed: 1.0,
            seed: 1,
            symbols: Vec::new(),
            control_token: token.map(String::from),
            state_file: None,
        }
    }

    #[test]
    fn the_control_token_is_passed_on_and_checked() {
        assert_eq!(args(None).config().unwrap().control_token, None);
        let c = args(Some("long-enough-token")).config().unwrap();
        assert_eq!(c.control_token.as_deref(), Some("long-enough-token"));
        let e = args(Some("short")).config().unwrap_err().to_string();
        assert!(e.contains("--control-token"), "{e}");
    }
}
