//! The HTTP/WebSocket server: the dashboard's static files, the REST API and `GET /ws`.
//!
//! Entry points: [`run_blocking`] (used by `millrace serve`) loads the configuration, builds a
//! runtime, binds `--addr` and calls [`serve`], which tests call directly with a listener bound
//! to port 0. [`serve`] starts the whole service ([`crate::app::App`]: store, simulator, sources,
//! ingest supervisor, backfill) and stops it on shutdown, flushing buffered candles.
//!
//! Routes (see [`api`] for the REST details):
//! - `GET /ws` -> WebSocket speaking [`shared::protocol`] (see [`ws`])
//! - `GET /api/v1/version`, `GET /healthz`, `GET /metrics`
//! - `GET /api/v1/klines`, `GET /api/v1/series`
//! - `GET /api/v1/ops/jobs`, `GET /api/v1/ops/backfill`, `GET /api/v1/ops/sources`
//! - `POST /api/v1/admin/...` (Bearer token)
//! - anything else -> a file from the static directory (`index.html` at `/`)

pub mod api;
mod heartbeat;
pub mod ws;

use std::collections::HashMap;
use std::future::{Future, IntoFuture};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use axum::extract::{ConnectInfo, State, WebSocketUpgrade};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use clap::Parser as _;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tower_http::services::ServeDir;

pub use heartbeat::Heartbeats;

use crate::app::App;
use shared::protocol::InstrumentId;
use crate::bus::InProcessBus;
use crate::config::{Config, LimitsConfig, Overrides};
use crate::ingest::Supervisor;
use crate::metrics::Metrics;

/// How long shutdown waits for open connections before giving up on them.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Arguments of `millrace serve`. Every flag overrides the configuration file and `MILLRACE_*`
/// variables (see [`crate::config`] for all keys).
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Configuration file (TOML). Without one, the built-in defaults: simulator, SQLite, in-process bus.
    #[arg(long, env = "MILLRACE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:8080; key server.addr; env MILLRACE_ADDR].
    #[arg(long)]
    pub addr: Option<SocketAddr>,
    /// Directory of the SQLite database [default: data; key server.data_dir; env MILLRACE_DATA_DIR].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Simulated seconds per real second of the built-in simulator (60 = a candle closes every
    /// second) [default: 1; key sources[].speed; env MILLRACE_SIM_SPEED].
    #[arg(long, env = "MILLRACE_SIM_SPEED")]
    pub sim_speed: Option<f64>,
    /// Directory with the built dashboard (index.html, client.js, client_bg.wasm), made by
    /// `scripts/build-client` [default: dist at the workspace root; key server.static_dir;
    /// env MILLRACE_STATIC_DIR].
    #[arg(long)]
    pub static_dir: Option<PathBuf>,
    /// Print the effective configuration (defaults, file, environment and flags merged) as TOML
    /// and exit: every key millrace understands, with its value.
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
}

/// The workspace's `dist` directory, where `scripts/build-client` writes the dashboard.
pub fn default_static_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap_or(Path::new(".")).join("dist")
}

/// Everything [`serve`] needs besides a listener, checked at start-up.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub config: Config,
    /// Root of the static files; must exist.
    pub static_dir: PathBuf,
    /// Interval between heartbeats on the `heartbeat` stream.
    pub heartbeat_every: Duration,
}

impl ServeConfig {
    /// Loads the configuration (file, environment, flags) and checks it; a missing static
    /// directory is an error that says how to make it.
    pub fn from_args(args: &ServeArgs) -> anyhow::Result<Self> {
        let config = Config::load(args.config.as_deref(), std::env::vars(), &args.overrides())?;
        Self::new(config)
    }

    /// Checks a loaded configuration.
    pub fn new(config: Config) -> anyhow::Result<Self> {
        let static_dir = config.server.static_dir.clone().unwrap_or_else(default_static_dir);
        if !static_dir.join("index.html").is_file() {
            anyhow::bail!(
                "--static-dir {} has no index.html: build the dashboard first with `scripts/build-client` \
                 (or pass --static-dir / set MILLRACE_STATIC_DIR to a built dist directory)",
                static_dir.display()
            );
        }
        let heartbeat_every = Duration::from_millis(config.server.heartbeat_ms);
        Ok(Self { config, static_dir, heartbeat_every })
    }
}

/// What every WebSocket session shares.
pub struct Hub {
    pub heartbeats: Heartbeats,
    pub bus: Arc<InProcessBus>,
    pub supervisor: Supervisor,
    pub limits: LimitsConfig,
    pub metrics: Arc<Metrics>,
    /// Takes the lease a depth subscription holds (`None` for books that need no job).
    pub depth_leases: DepthLeases,
}

/// See [`Hub::depth_leases`].
pub type DepthLeases =
    Arc<dyn Fn(&InstrumentId) -> Result<Option<crate::ingest::Lease>, crate::ingest::SubscribeError> + Send + Sync>;

/// Depth subscriptions: books of the tick-by-tick engine are always on; others need their depth
/// job, which the subscription's lease keeps running.
fn depth_leases(app: &Arc<App>) -> DepthLeases {
    let app = app.clone();
    Arc::new(move |instrument: &InstrumentId| {
        if app.books.is_always_on(instrument) {
            return Ok(None);
        }
        app.subscribe_depth(instrument).map(Some)
    })
}

/// Shared state of the request handlers: a cheap-to-clone handle.
#[derive(Clone)]
pub struct AppState {
    pub hub: Arc<Hub>,
    pub app: Arc<App>,
    /// Open WebSocket connections per client IP.
    per_ip: Arc<Mutex<HashMap<IpAddr, usize>>>,
    /// Flips to `true` when the server shuts down, so WebSocket sessions close with 1001.
    /// (Upgraded connections are not tracked by axum's graceful shutdown.)
    shutdown: watch::Receiver<bool>,
}

/// The router: API, WebSocket and static files.
fn router(static_dir: &Path, state: AppState) -> Router {
    Router::new()
        .route("/api/v1/version", get(version))
        .route("/healthz", get(healthz))
        .route("/ws", get(ws_upgrade))
        .merge(api::routes())
        .fallback_service(ServeDir::new(static_dir))
        .with_state(state)
}

async fn version() -> impl IntoResponse {
    Json(serde_json::json!({ "version": crate::VERSION }))
}

async fn healthz() -> impl IntoResponse {
    Json(serde_json::json!({ "status": "ok" }))
}

/// Releases a connection's slot in the per-IP table.
struct IpSlot {
    table: Arc<Mutex<HashMap<IpAddr, usize>>>,
    ip: IpAddr,
}

impl Drop for IpSlot {
    fn drop(&mut self) {
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = t.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                t.remove(&self.ip);
            }
        }
    }
}

async fn ws_upgrade(
    upgrade: WebSocketUpgrade,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    State(state): State<AppState>,
) -> axum::response::Response {
    let limit = state.hub.limits.max_connections_per_ip;
    let slot = {
        let mut t = state.per_ip.lock().unwrap_or_else(|p| p.into_inner());
        let n = t.entry(peer.ip()).or_default();
        if *n >= limit {
            state.hub.metrics.ws_refused_per_ip.fetch_add(1, Relaxed);
            return (
                StatusCode::TOO_MANY_REQUESTS,
                Json(serde_json::json!({"code": "too_many_connections", "msg": format!("at most {limit} WebSocket connections per IP address")})),
            )
                .into_response();
        }
        *n += 1;
        IpSlot { table: state.per_ip.clone(), ip: peer.ip() }
    };
    let hub = state.hub.clone();
    let shutdown = state.shutdown.clone();
    upgrade
        // The transport's hard cap; requests over `limits.max_message_bytes` get a `too_large` reply.
        .max_message_size(ws::MAX_TRANSPORT_BYTES)
        .max_frame_size(ws::MAX_TRANSPORT_BYTES)
        // Memory and CPU per connection: tungstenite zero-fills up to this much of its read
        // buffer at every read attempt, i.e. each time the session polls for a request (128 KiB
        // by default: ~141 KB of RSS per idle connection, docs/bench-fanout.md). Browsers send
        // a few small requests; a larger frame still arrives whole (the buffer grows to it).
        .read_buffer_size(ws::READ_BUFFER_BYTES)
        .on_upgrade(move |socket| async move {
            let _slot = slot;
            hub.metrics.ws_connections.fetch_add(1, Relaxed);
            hub.metrics.ws_connections_total.fetch_add(1, Relaxed);
            ws::session(socket, hub.clone(), shutdown).await;
            hub.metrics.ws_connections.fetch_sub(1, Relaxed);
        })
}

/// Starts the service, serves on `listener` until `shutdown` completes, then drains open
/// connections (at most [`DRAIN_TIMEOUT`]), stops the ingest jobs (flushing their buffered
/// candles into the store) and the rest of the service.
pub async fn serve(
    listener: TcpListener,
    config: ServeConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let app = Arc::new(App::start(config.config.clone()).await?);
    serve_app(listener, config, app, shutdown).await
}

/// [`serve`] for an [`App`] the caller started (e.g. a load tool that also publishes on its bus).
pub async fn serve_app(
    listener: TcpListener,
    config: ServeConfig,
    app: Arc<App>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let heartbeats = Heartbeats::start(config.heartbeat_every, stop_rx.clone());
    let hub = Arc::new(Hub {
        heartbeats,
        bus: app.bus.clone(),
        supervisor: app.supervisor.clone(),
        limits: config.config.limits.clone(),
        metrics: app.metrics.clone(),
        depth_leases: depth_leases(&app),
    });
    let state = AppState { hub, app: app.clone(), per_ip: Arc::default(), shutdown: stop_rx.clone() };
    let router = router(&config.static_dir, state);
    let addr = listener.local_addr().context("listener has no local address")?;
    tracing::info!(%addr, static_dir = %config.static_dir.display(), "millrace listening on http://{addr}/");

    let mut drained = stop_rx.clone();
    let server = axum::serve(listener, router.into_make_service_with_connect_info::<SocketAddr>())
        .with_graceful_shutdown(async move {
            shutdown.await;
            tracing::info!("shutting down");
            let _ = stop_tx.send(true);
        });
    let server = server.into_future();
    tokio::pin!(server);
    let result = tokio::select! {
        res = &mut server => res.context("server failed"),
        _ = async {
            stopped(&mut drained).await;
            tokio::time::sleep(DRAIN_TIMEOUT).await;
        } => {
            tracing::warn!("connections still open after {DRAIN_TIMEOUT:?}; stopping anyway");
            Ok(())
        }
    };
    app.stop().await;
    tracing::info!("stopped");
    result
}

/// Completes when the server starts shutting down (the flag becomes `true` or its sender is gone).
async fn stopped(flag: &mut watch::Receiver<bool>) {
    let _ = flag.wait_for(|stop| *stop).await;
}

/// Completes on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!("cannot listen for Ctrl-C: {e}");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// Runs the server until Ctrl-C / SIGTERM.
pub fn run_blocking(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    if args.print_config {
        let mut config = Config::load(args.config.as_deref(), std::env::vars(), &args.overrides())?;
        if config.server.admin_token.is_some() {
            config.server.admin_token = Some("<redacted>".into());
        }
        print!("{}", toml::to_string(&config).context("cannot print the configuration")?);
        return Ok(ExitCode::SUCCESS);
    }
    let config = ServeConfig::from_args(&args)?;
    let addr = config.config.server.addr;
    let runtime = tokio::runtime::Runtime::new().context("cannot start the tokio runtime")?;
    runtime.block_on(async {
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on --addr {addr} (is another server running?)"))?;
        serve(listener, config, shutdown_signal()).await
    })?;
    Ok(ExitCode::SUCCESS)
}
