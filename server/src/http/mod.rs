//! The HTTP/WebSocket server: the dashboard's static files, the REST API and `GET /ws`.
//!
//! [`serve`] starts the whole service ([`crate::app::App`]) and serves it on a listener until a
//! shutdown future completes (tests bind port 0); [`serve_app`] serves an [`App`] the caller
//! started. On shutdown, WebSocket sessions close with 1001, open connections drain (at most
//! [`DRAIN_TIMEOUT`]), then the service stops in order, flushing buffered candles.
//!
//! Routes (see [`api`] for the REST details):
//! - `GET /ws` -> WebSocket speaking [`shared::protocol`] (see [`ws`])
//! - `GET /api/v1/version`, `GET /healthz`, `GET /metrics`
//! - `GET /api/v1/klines`, `GET /api/v1/series`, `GET /fapi/v1/depth`
//! - `GET /api/v1/ops/{jobs,backfill,books,shards,sources}`
//! - `POST /api/v1/admin/...` (Bearer token)
//! - anything else -> a file from the static directory (`index.html` at `/`)

pub mod api;
mod dashboard;
mod error;
mod heartbeat;
pub mod ws;

use std::collections::HashMap;
use std::future::{Future, IntoFuture};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{ConnectInfo, State, WebSocketUpgrade};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use shared::protocol::ops::{ApiErrorCode, Health, HealthStatus, VersionInfo};
use shared::protocol::InstrumentId;
use tokio::net::TcpListener;
use tower_http::services::ServeDir;

pub use dashboard::Dashboard;
use tracing::Instrument as _;

pub use error::ApiError;
pub use heartbeat::Heartbeats;

use crate::app::App;
use crate::bus::Bus;
use crate::config::{Config, LimitsConfig};
use crate::jobs::{Lease, SubscribeError, Supervisor};
use crate::lock::lock;
use crate::metrics::Metrics;
use crate::shutdown::Shutdown;

/// How long shutdown waits for open connections before giving up on them.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    NoDashboard(#[from] dashboard::NoDashboard),
    #[error(transparent)]
    Start(#[from] crate::app::StartError),
    #[error("the listener has no local address")]
    Listener(#[source] std::io::Error),
    #[error("the HTTP server failed")]
    Server(#[source] std::io::Error),
}

/// The workspace's `dist` directory, where `scripts/build-client` writes the dashboard.
pub fn default_static_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap_or(Path::new(".")).join("dist")
}

/// Everything [`serve`] needs besides a listener, checked at start-up.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub config: Config,
    /// Where the dashboard's files come from.
    pub dashboard: Dashboard,
    /// Interval between heartbeats on the `heartbeat` stream.
    pub heartbeat_every: Duration,
}

impl ServeConfig {
    /// Checks a loaded configuration: a configured static directory without a dashboard is an
    /// error that says how to make it; with none configured, the workspace's built `dist/`, the
    /// copy embedded at build time, or none (the API runs; `/` says how to build it).
    pub fn new(config: Config) -> Result<Self, ServeError> {
        let dashboard =
            Dashboard::choose(config.server.static_dir.as_deref(), &default_static_dir())?;
        let heartbeat_every = Duration::from_millis(config.server.heartbeat_ms);
        Ok(Self { config, dashboard, heartbeat_every })
    }
}

/// What every WebSocket session shares.
pub struct Sessions {
    pub heartbeats: Heartbeats,
    pub bus: Arc<dyn Bus>,
    pub supervisor: Supervisor,
    pub limits: LimitsConfig,
    pub metrics: Arc<Metrics>,
    /// Takes the lease a depth subscription holds (`None` for books that need no job).
    pub depth_leases: DepthLeases,
    /// The sessions' part of the shutdown: stopping it closes every session with 1001.
    pub shutdown: Shutdown,
}

/// See [`Sessions::depth_leases`].
pub type DepthLeases =
    Arc<dyn Fn(&InstrumentId, IpAddr) -> Result<Option<Lease>, SubscribeError> + Send + Sync>;

/// Depth subscriptions: books of the tick-by-tick engine are always on; others need their depth
/// job, which the subscription's lease keeps running.
fn depth_leases(app: &Arc<App>) -> DepthLeases {
    let app = app.clone();
    Arc::new(move |instrument: &InstrumentId, peer: IpAddr| {
        if app.books.is_always_on(instrument)
            || app.l3.remote().is_some_and(|r| r.serves(instrument))
        {
            return Ok(None);
        }
        app.subscribe_depth_as(instrument, peer).map(Some)
    })
}

/// Shared state of the request handlers: a cheap-to-clone handle.
#[derive(Clone)]
pub struct AppState {
    pub sessions: Arc<Sessions>,
    pub app: Arc<App>,
    /// Open WebSocket connections per client IP.
    per_ip: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// The router: API, WebSocket and the dashboard's files.
fn router(dashboard: &Dashboard, state: AppState) -> Router {
    let routes = Router::new()
        .route("/api/v1/version", get(version))
        .route("/healthz", get(healthz))
        .route("/ws", get(ws_upgrade))
        .merge(api::routes());
    let routes = match dashboard {
        Dashboard::Dir(dir) => routes.fallback_service(ServeDir::new(dir)),
        Dashboard::Embedded => routes.fallback(dashboard::serve_embedded),
        Dashboard::Missing => routes.fallback(dashboard::serve_missing),
    };
    routes.with_state(state)
}

async fn version() -> Json<VersionInfo> {
    Json(VersionInfo { version: crate::VERSION.to_string() })
}

/// `ok` (200), or `degraded` (503) with what is wrong.
async fn healthz(State(state): State<AppState>) -> axum::response::Response {
    let problems = state.app.problems();
    let (code, status) = if problems.is_empty() {
        (StatusCode::OK, HealthStatus::Ok)
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, HealthStatus::Degraded)
    };
    (code, Json(Health { status, problems })).into_response()
}

/// Releases a connection's slot in the per-IP table.
struct IpSlot {
    table: Arc<Mutex<HashMap<IpAddr, usize>>>,
    ip: IpAddr,
}

impl Drop for IpSlot {
    fn drop(&mut self) {
        let mut t = lock(&self.table);
        if let Some(n) = t.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                t.remove(&self.ip);
            }
        }
    }
}

/// Session ids for the `session` span: unique per process.
static NEXT_SESSION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

async fn ws_upgrade(
    upgrade: WebSocketUpgrade,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    State(state): State<AppState>,
) -> axum::response::Response {
    let limit = state.sessions.limits.max_connections_per_ip;
    let slot = {
        let mut t = lock(&state.per_ip);
        let n = t.entry(peer.ip()).or_default();
        if *n >= limit {
            state.sessions.metrics.ws_refused_per_ip.fetch_add(1, Relaxed);
            let msg = format!("at most {limit} WebSocket connections per IP address");
            return ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                ApiErrorCode::TooManyConnections,
                msg,
            )
            .into_response();
        }
        *n += 1;
        IpSlot { table: state.per_ip.clone(), ip: peer.ip() }
    };
    let sessions = state.sessions.clone();
    let id = NEXT_SESSION.fetch_add(1, Relaxed);
    let span = tracing::info_span!("session", id, peer = %peer);
    // Counts as a running task of the sessions' part from the upgrade on.
    let alive = sessions.shutdown.guard();
    upgrade
        // The transport's hard cap; requests over `limits.max_message_bytes` get a `too_large`
        // reply.
        .max_message_size(ws::MAX_TRANSPORT_BYTES)
        .max_frame_size(ws::MAX_TRANSPORT_BYTES)
        // Memory and CPU per connection: tungstenite zero-fills up to this much of its read
        // buffer at every read attempt, i.e. each time the session polls for a request (128 KiB
        // by default: ~141 KB of RSS per idle connection, docs/bench-fanout.md). Browsers send
        // a few small requests; a larger frame still arrives whole (the buffer grows to it).
        .read_buffer_size(ws::READ_BUFFER_BYTES)
        .on_upgrade(move |socket| {
            async move {
                let _slot = slot;
                let _alive = alive;
                sessions.metrics.ws_connections.fetch_add(1, Relaxed);
                sessions.metrics.ws_connections_total.fetch_add(1, Relaxed);
                ws::session(socket, sessions.clone(), peer.ip()).await;
                sessions.metrics.ws_connections.fetch_sub(1, Relaxed);
            }
            .instrument(span)
        })
}

/// Starts the service, serves on `listener` until `shutdown` completes, then drains open
/// connections (at most [`DRAIN_TIMEOUT`]), stops the ingest jobs (flushing their buffered
/// candles into the store) and the rest of the service.
pub async fn serve(
    listener: TcpListener,
    config: ServeConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let app = Arc::new(App::start(config.config.clone()).await?);
    serve_app(listener, config, app, shutdown).await
}

/// [`serve`] for an [`App`] the caller started (e.g. a load tool that also publishes on its bus).
pub async fn serve_app(
    listener: TcpListener,
    config: ServeConfig,
    app: Arc<App>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let http = app.shutdown().child();
    let heartbeats = Heartbeats::start(config.heartbeat_every, &http);
    let sessions = Arc::new(Sessions {
        heartbeats,
        bus: app.bus.clone(),
        supervisor: app.supervisor.clone(),
        limits: config.config.limits.clone(),
        metrics: app.metrics.clone(),
        depth_leases: depth_leases(&app),
        shutdown: http.clone(),
    });
    let state = AppState { sessions, app: app.clone(), per_ip: Arc::default() };
    let router = router(&config.dashboard, state);
    let addr = listener.local_addr().map_err(ServeError::Listener)?;
    tracing::info!(%addr, dashboard = %config.dashboard.describe(), "millrace listening on http://{addr}/");

    let stopping = http.clone();
    let server = axum::serve(listener, router.into_make_service_with_connect_info::<SocketAddr>())
        .with_graceful_shutdown(async move {
            shutdown.await;
            tracing::info!("shutting down");
            // Sessions close with 1001 (axum's graceful shutdown does not track upgraded
            // connections: they watch this part's token).
            stopping.stop();
        });
    let server = server.into_future();
    tokio::pin!(server);
    let result = tokio::select! {
        res = &mut server => res.map_err(ServeError::Server),
        () = async {
            http.stopping().await;
            tokio::time::sleep(DRAIN_TIMEOUT).await;
        } => {
            tracing::warn!("connections still open after {DRAIN_TIMEOUT:?}; stopping anyway");
            Ok(())
        }
    };
    if !http.stopped(DRAIN_TIMEOUT).await {
        tracing::warn!("some WebSocket sessions did not close in {DRAIN_TIMEOUT:?}");
    }
    if !app.stop().await {
        tracing::warn!("some tasks did not stop in time");
    }
    tracing::info!("stopped");
    result
}
