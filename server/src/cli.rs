//! The `millrace` binary's commands: `serve` (the default), `sim`, `replay …`. Each sets up what
//! it needs (logging, a tokio runtime, the configuration) and hands over to the library.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use tokio::net::TcpListener;

use crate::config::{Config, Overrides};
use crate::http::ServeConfig;

/// millrace: real-time market data you can prove is right.
#[derive(Debug, Parser)]
#[command(name = "millrace", version = crate::VERSION, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
}

impl Cli {
    /// Whether the command runs until stopped (a server, a simulator, a cluster member), rather
    /// than a replay that ends by itself.
    pub fn is_long_running(&self) -> bool {
        !matches!(self.command, Some(Command::Replay(_)))
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server (the default when no subcommand is given).
    Serve(ServeArgs),
    /// Run the simulated exchange alone, speaking Binance's REST and WebSocket protocol
    /// (point a `[[sources]]` entry's rest_base / ws_base at it).
    Sim(sim::SimArgs),
    /// Replay recorded exchange data through millrace's market logic and check it.
    #[command(subcommand)]
    Replay(ReplayCommand),
    /// Run seed 004's supervisor of a cluster (`[bus]` NATS, `[cluster]` settings): assigns
    /// the tasks to the workers; several may run, one leads.
    Supervisor(SupervisorArgs),
    /// Run one of seed 004's workers (`[bus]` NATS, `[store]` PostgreSQL): holds the upstream
    /// sessions the leading supervisor assigns it.
    Worker(WorkerArgs),
    /// Export stored history as a file: Parquet or CSV.
    #[command(subcommand)]
    Export(ExportCommand),
}

/// What `millrace export` writes.
#[derive(Debug, clap::Subcommand)]
pub enum ExportCommand {
    /// A series' stored candles (from the store `--config` / `--data-dir` name, as `serve`
    /// reads it; a server running on the same SQLite directory holds it: use its
    /// `GET /api/v1/export/candles` then).
    Candles(ExportArgs),
    /// An instrument's trades, from the recording (`[record]`; `record.dir` of `--config`, else
    /// `{data_dir}/recordings`): millrace keeps no trades table, and the recording holds every
    /// trade it received, with when.
    Trades(TradesExportArgs),
}

/// Arguments of `millrace export trades`.
#[derive(Debug, Clone, clap::Args)]
pub struct TradesExportArgs {
    /// The instrument, e.g. `okx:spot:BTC/USDT` (its source is the recorded one).
    #[arg(long)]
    pub instrument: String,
    /// Another recording directory of the same source, merged by trade id (a cluster's
    /// workers record in `{record.dir}/worker-{id}`); repeatable.
    #[arg(long)]
    pub replica: Vec<PathBuf>,
    #[command(flatten)]
    pub file: ExportFileArgs,
}

/// Arguments of `millrace export candles`.
#[derive(Debug, Clone, clap::Args)]
pub struct ExportArgs {
    /// The series, e.g. `sim:spot:BTC/USDT:1m`.
    #[arg(long)]
    pub series: String,
    #[command(flatten)]
    pub file: ExportFileArgs,
}

/// What every `millrace export` reads and writes.
#[derive(Debug, Clone, clap::Args)]
pub struct ExportFileArgs {
    /// Configuration file (TOML), the same keys as `serve`'s.
    #[arg(long, env = "MILLRACE_CONFIG")]
    pub config: Option<PathBuf>,
    /// The data directory, as `serve --data-dir` (the SQLite store; the recordings in
    /// `recordings` unless `record.dir` says).
    #[arg(long, env = "MILLRACE_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// The first time, ms: a candle's open time, a trade's time (default: the first).
    #[arg(long, default_value_t = 0)]
    pub from: i64,
    /// The last time, ms (default: the last).
    #[arg(long, default_value_t = i64::MAX)]
    pub to: i64,
    /// parquet or csv.
    #[arg(long, default_value = "parquet")]
    pub format: String,
    /// The file to write.
    #[arg(long)]
    pub out: PathBuf,
}

impl ExportFileArgs {
    /// The configuration (`--config`, `--data-dir`), the range, and the file created.
    fn open(
        &self,
    ) -> anyhow::Result<(Config, crate::export::ExportRange, std::io::BufWriter<std::fs::File>)>
    {
        let flags = Overrides { data_dir: self.data_dir.clone(), ..Overrides::default() };
        let config = Config::load(self.config.as_deref(), std::env::vars(), &flags)?;
        let format: crate::export::Format = self.format.parse()?;
        anyhow::ensure!(self.from <= self.to, "--from {} is after --to {}", self.from, self.to);
        let range = crate::export::ExportRange {
            from: self.from,
            to: self.to,
            max_rows: config.limits.max_export_rows,
            format,
        };
        let file = std::fs::File::create(&self.out)
            .with_context(|| format!("cannot create --out {}", self.out.display()))?;
        Ok((config, range, std::io::BufWriter::new(file)))
    }
}

/// Arguments of `millrace worker`.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// Configuration file (TOML), the same keys as `serve`'s.
    #[arg(long, env = "MILLRACE_CONFIG")]
    pub config: Option<PathBuf>,
    /// This worker's id, unique in the cluster (letters, digits, `_`, `-`).
    #[arg(long)]
    pub id: String,
    /// The most sessions this worker holds.
    #[arg(long, default_value_t = 50)]
    pub max_load: u32,
    /// On SIGTERM, the longest wait for the supervisor to move the tasks before stopping them.
    #[arg(long, default_value_t = 5)]
    pub drain_s: u64,
}

/// Arguments of `millrace supervisor`.
#[derive(Debug, Clone, clap::Args)]
pub struct SupervisorArgs {
    /// Configuration file (TOML), the same keys as `serve`'s.
    #[arg(long, env = "MILLRACE_CONFIG")]
    pub config: Option<PathBuf>,
    /// This supervisor's id (shown as the leader) [default: supervisor-<host>-<pid>].
    #[arg(long)]
    pub id: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum ReplayCommand {
    /// Sync order books from Binance depth captures and check them against bookTicker.
    Depth(replay::depth::DepthArgs),
    /// Merge Binance 1m kline archives into a timeframe; prints CSV.
    Klines(replay::klines::KlinesArgs),
    /// Rebuild Shanghai tick-by-tick books from order and trade files; prints JSON per symbol.
    Sse(replay::sse::SseArgs),
    /// Rebuild a LOBSTER book from a message file; prints LOBSTER's orderbook CSV.
    Lobster(replay::lobster::LobsterArgs),
    /// Check millrace's own recording (`[record]`): every file's blocks and torn tail, and
    /// another venue's books synced from it by the venue's rules; prints JSON per file and book.
    Recording(replay::recording::RecordingArgs),
}

/// Arguments of `millrace serve`. Every flag overrides the configuration file and `MILLRACE_*`
/// variables (see [`crate::config`] for all keys).
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Configuration file (TOML). Without one, the built-in defaults: simulator, SQLite, in-process
    /// bus.
    #[arg(long, env = "MILLRACE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:8080; key server.addr; env MILLRACE_ADDR].
    #[arg(long)]
    pub addr: Option<SocketAddr>,
    /// Directory of the SQLite database [default: data; key server.data_dir; env
    /// MILLRACE_DATA_DIR].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Simulated seconds per real second of the built-in simulator (60 = a candle closes every
    /// second) [default: 1; key sources[].speed; env MILLRACE_SIM_SPEED].
    #[arg(long, env = "MILLRACE_SIM_SPEED")]
    pub sim_speed: Option<f64>,
    /// Directory with the built dashboard (index.html, client.js, client_bg.wasm), made by
    /// `scripts/build-client` [default: none, the dashboard embedded in the binary; key
    /// server.static_dir; env MILLRACE_STATIC_DIR].
    #[arg(long)]
    pub static_dir: Option<PathBuf>,
    /// Print the effective configuration (defaults, file, environment and flags merged) as TOML
    /// and exit: every key millrace understands, with its value — secrets (`server.admin_token`,
    /// keys ending in password, token, seed, secret) as "<redacted>", URLs without credentials.
    #[arg(long)]
    pub print_config: bool,
}

impl Default for ServeArgs {
    /// What `millrace serve` gets with no flags.
    fn default() -> Self {
        #[derive(clap::Parser)]
        struct Bare {
            #[command(flatten)]
            args: ServeArgs,
        }
        Bare::parse_from(["millrace"]).args
    }
}

impl ServeArgs {
    /// The flags that override configuration keys.
    pub fn overrides(&self) -> Overrides {
        Overrides {
            addr: self.addr,
            data_dir: self.data_dir.clone(),
            static_dir: self.static_dir.clone(),
            sim_speed: self.sim_speed,
            admin_token: None,
        }
    }

    /// The configuration these arguments and the environment describe.
    pub fn load(&self) -> Result<Config, crate::config::ConfigError> {
        Config::load(self.config.as_deref(), std::env::vars(), &self.overrides())
    }
}

/// Runs a parsed command line. Replay commands exit 1 when a check fails.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        None => serve(&ServeArgs::default()),
        Some(Command::Serve(args)) => serve(&args),
        Some(Command::Sim(args)) => {
            crate::telemetry::init();
            runtime()?.block_on(sim::run_until(&args, crate::shutdown::signal()))?;
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Supervisor(args)) => supervisor(&args),
        Some(Command::Worker(args)) => worker(&args),
        Some(Command::Export(ExportCommand::Candles(args))) => export_candles(&args),
        Some(Command::Export(ExportCommand::Trades(args))) => export_trades(&args),
        Some(Command::Replay(cmd)) => {
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            let ok = match cmd {
                ReplayCommand::Depth(a) => replay::depth::run(&a, &mut out)?,
                ReplayCommand::Klines(a) => replay::klines::run(&a, &mut out)?,
                ReplayCommand::Sse(a) => replay::sse::run(&a, &mut out)?,
                ReplayCommand::Lobster(a) => replay::lobster::run(&a, &mut out)?,
                ReplayCommand::Recording(a) => replay::recording::run(&a, &mut out)?,
            };
            out.flush()?;
            Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
    }
}

/// `millrace export candles`: the series' candles from the configured store into `--out`.
fn export_candles(args: &ExportArgs) -> anyhow::Result<ExitCode> {
    let series: shared::protocol::SeriesId =
        args.series.parse().map_err(|e| anyhow::anyhow!("--series {:?}: {e}", args.series))?;
    let (config, range, out) = args.file.open()?;
    let rt = runtime()?;
    let stores = rt.block_on(crate::app::Stores::open(&config))?;
    let (rows, _) = crate::export::candles(stores.store.as_ref(), &series, range, out)?;
    eprintln!("{rows} candles of {series} written to {}", args.file.out.display());
    stores.store.close();
    Ok(ExitCode::SUCCESS)
}

/// `millrace export trades`: the instrument's recorded trades into `--out`.
fn export_trades(args: &TradesExportArgs) -> anyhow::Result<ExitCode> {
    let instrument: shared::protocol::InstrumentId = args
        .instrument
        .parse()
        .map_err(|e| anyhow::anyhow!("--instrument {:?}: {e}", args.instrument))?;
    let (config, range, out) = args.file.open()?;
    let mut dirs = vec![config.record_dir()];
    dirs.extend(args.replica.iter().cloned());
    let (rows, _) = crate::export::trades(&dirs, &instrument, range, out)?;
    eprintln!("{rows} trades of {instrument} written to {}", args.file.out.display());
    Ok(ExitCode::SUCCESS)
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Runtime::new().context("cannot start the tokio runtime")
}

/// `millrace supervisor`: until Ctrl-C / SIGTERM.
fn supervisor(args: &SupervisorArgs) -> anyhow::Result<ExitCode> {
    crate::telemetry::init();
    let config = Config::load(args.config.as_deref(), std::env::vars(), &Overrides::default())?;
    if config.bus.kind != crate::config::BusKind::Nats {
        anyhow::bail!("configuration key `bus.kind`: must be \"nats\" for `millrace supervisor`");
    }
    let id = args.id.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
        format!("supervisor-{}-{}", host.trim(), std::process::id())
    });
    runtime()?.block_on(async {
        let client =
            crate::cluster::connect(&config.bus, crate::cluster::Role::Supervisor, &id).await?;
        let shutdown = crate::shutdown::Shutdown::new();
        // The sources list what the pattern matches, and what a gateway's demand may name (a
        // task of an instrument no source lists is refused).
        let sources = if !config.sources.is_empty() {
            let endpoints = crate::sources::remote_endpoints(&config.sources)?;
            Some(
                crate::sources::Sources::start(
                    &config.sources,
                    endpoints,
                    &config.ingest.derived,
                    &shutdown,
                )
                .await?,
            )
        } else {
            None
        };
        let subjects = crate::cluster::Subjects::new(&config.bus.prefix);
        let run = crate::cluster::supervisor::run(
            client,
            subjects,
            config.cluster.clone(),
            sources,
            id,
            shutdown.clone(),
        );
        tokio::pin!(run);
        tokio::select! {
            r = &mut run => r?,
            () = crate::shutdown::signal() => {
                shutdown.stop();
                run.await?;
            }
        }
        shutdown.stopped(std::time::Duration::from_secs(5)).await;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `millrace worker`: until Ctrl-C / SIGTERM, which drains it.
fn worker(args: &WorkerArgs) -> anyhow::Result<ExitCode> {
    crate::telemetry::init();
    let config = Config::load(args.config.as_deref(), std::env::vars(), &Overrides::default())?;
    if config.bus.kind != crate::config::BusKind::Nats {
        anyhow::bail!("configuration key `bus.kind`: must be \"nats\" for `millrace worker`");
    }
    if !crate::config::cluster::valid_prefix(&args.id) {
        anyhow::bail!("--id {:?}: must be 1 to 64 letters, digits, `_` or `-`", args.id);
    }
    if args.max_load == 0 {
        anyhow::bail!("--max-load must be at least 1");
    }
    let options = crate::cluster::worker::WorkerOptions {
        id: args.id.clone(),
        max_load: args.max_load,
        drain: std::time::Duration::from_secs(args.drain_s),
    };
    runtime()?.block_on(async {
        let client =
            crate::cluster::connect(&config.bus, crate::cluster::Role::Worker, &args.id).await?;
        let shutdown = crate::shutdown::Shutdown::new();
        crate::cluster::worker::run(
            config,
            client,
            options,
            Default::default(),
            shutdown.clone(),
            crate::shutdown::signal(),
        )
        .await?;
        shutdown.stop();
        shutdown.stopped(std::time::Duration::from_secs(5)).await;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `millrace serve`: the service until Ctrl-C / SIGTERM.
fn serve(args: &ServeArgs) -> anyhow::Result<ExitCode> {
    crate::telemetry::init();
    if args.print_config {
        // The configuration keeps its real values; only what is printed is redacted.
        let mut table =
            toml::Table::try_from(args.load()?).context("cannot print the configuration")?;
        crate::redact::redact_config(&mut table);
        print!("{}", toml::to_string(&table).context("cannot print the configuration")?);
        return Ok(ExitCode::SUCCESS);
    }
    let config = ServeConfig::new(args.load()?)?;
    let addr = config.config.server.addr;
    runtime()?.block_on(async {
        let listener = TcpListener::bind(addr).await.with_context(|| {
            format!("cannot listen on --addr {addr} (is another server running?)")
        })?;
        crate::http::serve(listener, config, crate::shutdown::signal()).await?;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}
