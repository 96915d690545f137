//! The HTTP/WebSocket server: the dashboard's static files, a small REST API and `GET /ws`.
//!
//! Entry points: [`run_blocking`] (used by `millrace serve`) builds a runtime, binds `--addr` and
//! calls [`serve`], which tests call directly with a listener bound to port 0.
//!
//! Routes:
//! - `GET /api/v1/version` -> `{"version":"0.1.0"}`
//! - `GET /healthz` -> `{"status":"ok"}`
//! - `GET /ws` -> WebSocket speaking [`shared::protocol`] (see [`ws`])
//! - anything else -> a file from `--static-dir` (`index.html` at `/`)

mod heartbeat;
mod ws;

use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use axum::extract::{State, WebSocketUpgrade};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use clap::Parser as _;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tower_http::services::ServeDir;

pub use heartbeat::Heartbeats;

/// How long shutdown waits for open connections before giving up on them.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Arguments of `millrace serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "MILLRACE_ADDR", default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,
    /// Directory with the built dashboard (index.html, client.js, client_bg.wasm), made by
    /// `scripts/build-client`. Defaults to `dist` at the root of the millrace workspace.
    #[arg(long, env = "MILLRACE_STATIC_DIR")]
    pub static_dir: Option<PathBuf>,
}

impl Default for ServeArgs {
    /// What `millrace serve` gets with no flags: the defaults above, after `MILLRACE_*` variables.
    fn default() -> Self {
        #[derive(clap::Parser)]
        struct Bare {
            #[command(flatten)]
            args: ServeArgs,
        }
        Bare::parse_from(["millrace"]).args
    }
}

/// The workspace's `dist` directory, where `scripts/build-client` writes the dashboard.
pub fn default_static_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap_or(Path::new(".")).join("dist")
}

/// Everything [`serve`] needs besides a listener, checked at start-up.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Root of the static files; must exist.
    pub static_dir: PathBuf,
    /// Interval between heartbeats on the `heartbeat` stream (1 s; tests shorten it).
    pub heartbeat_every: Duration,
}

impl ServeConfig {
    /// Checks the arguments: a missing static directory is an error that says how to make it.
    pub fn from_args(args: &ServeArgs) -> anyhow::Result<Self> {
        let static_dir = args.static_dir.clone().unwrap_or_else(default_static_dir);
        if !static_dir.join("index.html").is_file() {
            anyhow::bail!(
                "--static-dir {} has no index.html: build the dashboard first with `scripts/build-client` \
                 (or pass --static-dir / set MILLRACE_STATIC_DIR to a built dist directory)",
                static_dir.display()
            );
        }
        Ok(Self { static_dir, heartbeat_every: Duration::from_secs(1) })
    }
}

/// Shared state of the request handlers: a cheap-to-clone handle.
#[derive(Clone)]
struct AppState {
    /// The `heartbeat` stream every WebSocket session subscribes to on request.
    heartbeats: Heartbeats,
    /// Flips to `true` when the server shuts down, so WebSocket sessions close with 1001.
    /// (Upgraded connections are not tracked by axum's graceful shutdown.)
    shutdown: watch::Receiver<bool>,
}

/// The router: API, WebSocket and static files.
fn router(config: &ServeConfig, state: AppState) -> Router {
    Router::new()
        .route("/api/v1/version", get(version))
        .route("/healthz", get(healthz))
        .route("/ws", get(ws_upgrade))
        .fallback_service(ServeDir::new(&config.static_dir))
        .with_state(state)
}

async fn version() -> impl IntoResponse {
    Json(serde_json::json!({ "version": crate::VERSION }))
}

async fn healthz() -> impl IntoResponse {
    Json(serde_json::json!({ "status": "ok" }))
}

async fn ws_upgrade(upgrade: WebSocketUpgrade, State(state): State<AppState>) -> impl IntoResponse {
    upgrade
        // The transport's hard cap; requests over `ws::MAX_REQUEST_BYTES` get a `too_large` reply.
        .max_message_size(ws::MAX_TRANSPORT_BYTES)
        .max_frame_size(ws::MAX_TRANSPORT_BYTES)
        .on_upgrade(move |socket| ws::session(socket, state.heartbeats, state.shutdown))
}

/// Serves on `listener` until `shutdown` completes, then drains open connections (at most
/// [`DRAIN_TIMEOUT`]) and stops the heartbeat.
pub async fn serve(
    listener: TcpListener,
    config: ServeConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let heartbeats = Heartbeats::start(config.heartbeat_every, stop_rx.clone());
    let app = router(&config, AppState { heartbeats, shutdown: stop_rx.clone() });
    let addr = listener.local_addr().context("listener has no local address")?;
    tracing::info!(%addr, static_dir = %config.static_dir.display(), "millrace listening on http://{addr}/");

    let mut drained = stop_rx.clone();
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        shutdown.await;
        tracing::info!("shutting down");
        let _ = stop_tx.send(true);
    });
    let server = server.into_future();
    tokio::pin!(server);
    tokio::select! {
        res = &mut server => res.context("server failed")?,
        _ = async {
            stopped(&mut drained).await;
            tokio::time::sleep(DRAIN_TIMEOUT).await;
        } => tracing::warn!("connections still open after {DRAIN_TIMEOUT:?}; stopping anyway"),
    }
    tracing::info!("stopped");
    Ok(())
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
    let config = ServeConfig::from_args(&args)?;
    let runtime = tokio::runtime::Runtime::new().context("cannot start the tokio runtime")?;
    runtime.block_on(async {
        let listener = TcpListener::bind(args.addr)
            .await
            .with_context(|| format!("cannot listen on --addr {} (is another server running?)", args.addr))?;
        serve(listener, config, shutdown_signal()).await
    })?;
    Ok(ExitCode::SUCCESS)
}
