//! The HTTP/WebSocket server: the dashboard's static files, the REST API and `GET /ws`.
//!
//! [`serve`] starts the whole service ([`crate::app::App`]) and serves it on a listener until a
//! shutdown future completes (tests bind port 0); [`serve_app`] serves an [`App`] the caller
//! started. On shutdown, WebSocket sessions close with 1001, open connections drain (at most
//! [`DRAIN_TIMEOUT`]), then the service stops in order, flushing buffered candles.
//!
//! Connections are accepted by the server's own loop ([`conn`]): capped per client address and
//! in total at accept, and closed when a request head is too slow or a keep-alive connection
//! idles too long. Every request naming a host this server does not answer to is refused (421,
//! [`host`]); `GET /ws` is refused (403) to web pages of origins not allowed ([`origin`]); admin
//! requests are checked before their body is read ([`admin`]).
//!
//! Routes (see [`api`] for the REST details):
//! - `GET /ws` -> WebSocket speaking [`shared::protocol`] (see [`ws`])
//! - `GET /api/v1/version`, `GET /healthz`, `GET /metrics`
//! - `GET /api/v1/klines`, `GET /api/v1/series`, `GET /fapi/v1/depth`
//! - `GET /api/v1/ops/{jobs,backfill,books,shards,sources}`
//! - `POST /api/v1/admin/...` (Bearer token, [`admin`])
//! - anything else -> a file from the static directory (`index.html` at `/`)

pub mod admin;
pub mod api;
mod batch;
pub mod conn;
mod dashboard;
mod error;
mod heartbeat;
pub mod host;
mod metrics;
pub mod starts;
mod upgrade;
pub mod ws;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use shared::protocol::ops::{ApiErrorCode, Health, HealthStatus, VersionInfo};
use shared::protocol::InstrumentId;
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tower_http::services::ServeDir;

pub use dashboard::Dashboard;
use tracing::Instrument as _;

pub use error::ApiError;
pub use heartbeat::Heartbeats;

use crate::app::App;
use crate::bus::Bus;
use crate::client_addr::ClientAddr;
use crate::config::{Config, LimitsConfig};
use crate::jobs::{Lease, SubscribeError, Supervisor};
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
    Start(#[from] crate::cluster::gateway::BusStartError),
    #[error("the listener has no local address")]
    Listener(#[source] std::io::Error),
    #[error(transparent)]
    ConnectionCap(#[from] conn::CapOverFileLimit),
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
    /// error that says how to make it; with none configured, the copy embedded at build time,
    /// or none (the API runs; `/` says how to build it).
    pub fn new(config: Config) -> Result<Self, ServeError> {
        let dashboard = Dashboard::choose(config.server.static_dir.as_deref())?;
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
    /// Would subscribing to this stream start an ingest job (none running for it)?
    pub starts_job: StartsJob,
    /// Job starts left per client address (`limits.max_job_starts_per_min_per_ip`).
    pub ip_starts: starts::IpStarts,
}

/// See [`Sessions::starts_job`].
pub type StartsJob = Arc<dyn Fn(&shared::protocol::Stream) -> bool + Send + Sync>;

/// Whether a subscription would start a job: a kline stream whose instrument's job is not
/// running, or a depth stream of a book that needs a depth job which is not running.
fn starts_job(app: &Arc<App>) -> StartsJob {
    use shared::protocol::Stream;
    let app = app.clone();
    Arc::new(move |stream: &Stream| match stream {
        Stream::Heartbeat => false,
        Stream::Kline(series) => app.supervisor().health(&series.instrument).is_none(),
        // an instrument's trades come with its book's job
        Stream::Depth { instrument, .. }
        | Stream::DepthUpdate(instrument)
        | Stream::Trade(instrument) => {
            !(app.books().is_always_on(instrument)
                || app.l3().remote().is_some_and(|r| r.serves(instrument)))
                && app.depth().health(instrument).is_none()
        }
    })
}

/// See [`Sessions::depth_leases`].
pub type DepthLeases = Arc<
    dyn Fn(&InstrumentId, Option<ClientAddr>) -> Result<Option<Lease>, SubscribeError>
        + Send
        + Sync,
>;

/// Depth subscriptions: books of the tick-by-tick engine are always on; others need their depth
/// job, which the subscription's lease keeps running.
fn depth_leases(app: &Arc<App>) -> DepthLeases {
    let app = app.clone();
    Arc::new(move |instrument: &InstrumentId, peer: Option<ClientAddr>| {
        if app.books().is_always_on(instrument)
            || app.l3().remote().is_some_and(|r| r.serves(instrument))
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
    /// The dashboard's files, when they come from a directory.
    static_files: Option<ServeDir>,
    /// Web pages that may open `/ws` (`server.allowed_origins`).
    origins: Arc<crate::config::origin::AllowedOrigins>,
    /// Names requests may reach this server by (`server.allowed_hosts`).
    hosts: Arc<crate::config::host::AllowedHosts>,
    /// The admin token, failed attempts per address, admin bodies.
    admin: Arc<admin::AdminGate>,
}

/// The router: API, WebSocket and the dashboard's files. Every request passes the `Host` check
/// first ([`host`]); admin requests then pass their gate ([`admin`]) before their handler.
fn router(dashboard: &Dashboard, state: AppState) -> Router {
    use axum::middleware::from_fn_with_state;
    let admin = api::admin_routes().route_layer(from_fn_with_state(state.clone(), admin::guard));
    let routes = Router::new()
        .route("/api/v1/version", get(version))
        .route("/healthz", get(healthz))
        .route("/ws", get(ws_upgrade))
        .merge(api::routes())
        .merge(admin);
    let routes = match dashboard {
        Dashboard::Dir(_) => routes.fallback(static_file),
        Dashboard::Embedded => routes.fallback(dashboard::serve_embedded),
        Dashboard::Missing => routes.fallback(dashboard::serve_missing),
    };
    routes.layer(from_fn_with_state(state.clone(), host::check)).with_state(state)
}

/// A file of the static directory (`index.html` at `/`). A path that cannot name a file (too
/// long, a NUL byte, a loop, a file used as a directory) is 404 like a missing one; only the
/// server's own failures (e.g. out of file descriptors) are 500.
async fn static_file(State(state): State<AppState>, request: Request) -> Response {
    let Some(mut files) = state.static_files.clone() else {
        return StatusCode::NOT_FOUND.into_response();
    };
    match files.try_call(request).await {
        Ok(response) => response.map(Body::new),
        Err(e) => {
            use std::io::ErrorKind::*;
            let errno = rustix::io::Errno::from_io_error(&e);
            let impossible_name = matches!(e.kind(), InvalidFilename | InvalidInput)
                || errno.is_some_and(|n| n == rustix::io::Errno::LOOP);
            if impossible_name {
                state.app.metrics().http_bad_requests.fetch_add(1, Relaxed);
            }
            if impossible_name || matches!(e.kind(), NotFound | NotADirectory | IsADirectory) {
                return StatusCode::NOT_FOUND.into_response();
            }
            tracing::error!("cannot serve a static file: {e}");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
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

/// Session ids for the `session` span: unique per process.
static NEXT_SESSION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// `GET /ws`. Connections per IP are counted (and capped) at accept, before the upgrade
/// ([`conn`]); a web page of an origin not allowed gets 403 before the upgrade.
async fn ws_upgrade(
    upgrade: upgrade::Upgrade,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    State(state): State<AppState>,
    headers: HeaderMap,
) -> axum::response::Response {
    let text = |name| headers.get(name).and_then(|v: &header::HeaderValue| v.to_str().ok());
    let origin = headers.get(header::ORIGIN).map(|v| v.to_str().unwrap_or("<not text>"));
    if !state.origins.allows(origin, text(header::HOST)) {
        state.sessions.metrics.ws_refused_origin.fetch_add(1, Relaxed);
        let origin = origin.unwrap_or_default().chars().take(200).collect::<String>();
        tracing::debug!(%peer, %origin, "WebSocket refused: origin not allowed");
        return ApiError::new(
            StatusCode::FORBIDDEN,
            ApiErrorCode::OriginNotAllowed,
            format!("pages of origin {origin:?} may not open this server's WebSocket; add it to server.allowed_origins"),
        )
        .into_response();
    }
    let sessions = state.sessions.clone();
    let id = NEXT_SESSION.fetch_add(1, Relaxed);
    let span = tracing::info_span!("session", id, peer = %peer);
    let config = WebSocketConfig::default()
        // The transport's hard cap; requests over `limits.max_message_bytes` get a `too_large`
        // reply.
        .max_message_size(Some(ws::MAX_TRANSPORT_BYTES))
        .max_frame_size(Some(ws::MAX_TRANSPORT_BYTES))
        // Memory and CPU per connection: tungstenite zero-fills up to this much of its read
        // buffer at every read attempt, i.e. each time the session polls for a request (128 KiB
        // by default: ~141 KB of RSS per idle connection, docs/bench-fanout.md). Browsers send
        // a few small requests; a larger frame still arrives whole (the buffer grows to it).
        .read_buffer_size(ws::READ_BUFFER_BYTES)
        // Each frame (at most ws::FRAGMENT_BYTES of payload) is handed at once to the
        // connection's batch (`batch.rs`), which writes a burst with one syscall and then frees
        // its buffer: tungstenite's own buffer would keep its largest size for good.
        .write_buffer_size(0);
    // The session is a task of the sessions' part from the upgrade on.
    upgrade.on_upgrade(config, &state.sessions.shutdown, move |socket| {
        async move {
            sessions.metrics.ws_connections.fetch_add(1, Relaxed);
            sessions.metrics.ws_connections_total.fetch_add(1, Relaxed);
            ws::session(socket, sessions.clone(), Some(ClientAddr::of(peer.ip()))).await;
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
    let app = Arc::new(crate::cluster::gateway::start(config.config.clone()).await?);
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
        bus: app.bus().clone(),
        supervisor: app.supervisor().clone(),
        limits: config.config.limits.clone(),
        metrics: app.metrics().clone(),
        depth_leases: depth_leases(&app),
        shutdown: http.clone(),
        starts_job: starts_job(&app),
        ip_starts: starts::IpStarts::new(config.config.limits.max_job_starts_per_min_per_ip),
    });
    let nofile = conn::raise_nofile_limit();
    let limits = conn::ConnLimits::new(&config.config.limits, nofile)?;
    let connections = conn::Connections::new(limits, app.metrics().clone());
    let static_files = match &config.dashboard {
        Dashboard::Dir(dir) => Some(ServeDir::new(dir)),
        Dashboard::Embedded | Dashboard::Missing => None,
    };
    let addr = listener.local_addr().map_err(ServeError::Listener)?;
    let server = &config.config.server;
    if let Some(warning) =
        crate::config::host::AllowedHosts::bound_everywhere_warning(&server.allowed_hosts, addr)
    {
        tracing::warn!("{warning}");
    }
    let state = AppState {
        sessions,
        app: app.clone(),
        static_files,
        origins: Arc::new(crate::config::origin::AllowedOrigins::new(&server.allowed_origins)),
        hosts: Arc::new(crate::config::host::AllowedHosts::new(&server.allowed_hosts, addr)),
        admin: Arc::new(admin::AdminGate::new(&config.config, app.metrics().clone())),
    };
    let router = router(&config.dashboard, state);
    tracing::info!(%addr, dashboard = %config.dashboard.describe(), "millrace listening on http://{addr}/");
    tracing::info!(
        open_file_limit = nofile,
        max_connections = limits.max_connections,
        max_connections_per_ip = limits.max_per_ip,
        "connection caps"
    );

    tokio::pin!(shutdown);
    tokio::select! {
        // Ends when the service is stopped from elsewhere.
        () = conn::accept_loop(listener, router, connections, http.clone()) => {}
        () = &mut shutdown => tracing::info!("shutting down"),
    }
    // No new connections (the listener is gone); sessions close with 1001, idle connections
    // close and requests in progress finish.
    http.stop();
    if !http.stopped(DRAIN_TIMEOUT).await {
        tracing::warn!("connections still open after {DRAIN_TIMEOUT:?}; stopping anyway");
    }
    if !app.stop().await {
        tracing::warn!("some tasks did not stop in time");
    }
    tracing::info!("stopped");
    Ok(())
}
