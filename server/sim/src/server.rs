//! The simulator's HTTP server: the router (Binance REST, WebSocket streams, `/sim` control) and
//! the start-up of the driver and server tasks.
//!
//! | path | what |
//! |------|------|
//! | `/api/v3/{ping,time,exchangeInfo,klines,uiKlines,depth}` | Binance spot REST ([`crate::rest`]) |
//! | `/fapi/v1/{ping,time,exchangeInfo,klines,depth}` | Binance USD-M futures REST (same markets) |
//! | `/ws`, `/ws/<streams or any id>`, `/stream?streams=`, `/stream` | spot streams ([`crate::ws`]) |
//! | the same under `/fapi`, `/fapi/public`, `/fapi/market` | futures streams |
//! | `GET /sim/faults`, `POST /sim/faults` | the fault plan and counters; inject faults ([`crate::faults`]; token and JSON, [`crate::control`]) |
//! | `GET /sim/status` | symbols, clock, connections |
//! | `/tbt/*` | the tick-by-tick feed ([`crate::tbt::routes`]) |
//! | `/okx/…`, `/bybit/…`, `/coinbase/…`, `/kraken/…` | the other venues' WebSocket and REST protocols ([`crate::venues`]) |

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::faults::{FaultCommand, Faults};
use crate::hub::Hub;
use crate::limiter::RateLimiter;
use crate::market::{run_driver, Exchange};
use crate::rest;
use crate::state::{Srv, WsSettings};
use crate::{ws, SimConfig};

/// The running pieces, for the handle.
pub(crate) struct Running {
    pub addr: SocketAddr,
    pub ex: Arc<Exchange>,
    pub hub: Arc<Hub>,
    pub faults: Arc<Faults>,
    pub stop: CancellationToken,
    pub tbt: crate::tbt::TbtHandle,
    pub tasks: TaskTracker,
}

/// Binds `bind` and spawns the driver and the server on the current tokio runtime; they stop
/// when `stop` is cancelled.
pub(crate) async fn start(
    config: SimConfig,
    bind: SocketAddr,
    stop: CancellationToken,
) -> anyhow::Result<Running> {
    tokio::runtime::Handle::try_current()
        .context("Sim::start must be called inside a tokio runtime")?;
    for s in &config.symbols {
        s.validate()?;
    }
    if config.symbols.is_empty() {
        anyhow::bail!("the simulator needs at least one symbol");
    }
    let listener = tokio::net::TcpListener::bind(bind)
        .await
        .with_context(|| format!("cannot listen on {bind} (is another simulator running?)"))?;
    let addr = listener.local_addr().context("listener has no local address")?;

    let start_ms = config.start_ms.unwrap_or_else(crate::clock::wall_clock_ms);
    let clock = crate::SimClock::new(start_ms, config.speed);
    let ex = Arc::new(Exchange::new(config.symbols.clone(), config.seed, clock));
    let faults = Arc::new(Faults::new(config.max_connection_age));
    let hub = Arc::new(Hub::new(config.ws_queue, faults.clone()));
    let weak = Arc::downgrade(&hub);
    let venue_conns = Arc::new(crate::venues::VenueConns::default());
    let weak_venues = Arc::downgrade(&venue_conns);
    faults.attach_dropper(Box::new(move |symbol| {
        weak.upgrade().map_or(0, |h| h.drop_connections(symbol))
            + weak_venues.upgrade().map_or(0, |v| v.drop_connections(symbol))
    }));
    let tasks = TaskTracker::new();
    let srv = Arc::new(Srv {
        ex: ex.clone(),
        hub: hub.clone(),
        faults: faults.clone(),
        limiter: RateLimiter::new(
            config.rest_weight_per_minute,
            config.rate_window,
            config.ban_after_violations,
            config.ban_duration,
        ),
        config: WsSettings {
            ping_interval: config.ping_interval,
            pong_timeout: config.pong_timeout,
            max_streams_per_connection: config.max_streams_per_connection,
        },
        stop: stop.clone(),
        venue_conns,
    });
    let tbt = crate::tbt::TbtHandle::start(config.tbt.clone(), stop.child_token(), &tasks)?;
    let guard = crate::control::Guard {
        token: config.control_token.as_deref().map(Arc::from),
        faults: faults.clone(),
    };
    let control = control_router(srv.clone())
        .merge(crate::tbt::routes::router(tbt.clone(), stop.clone()))
        .route_layer(axum::middleware::from_fn_with_state(guard, crate::control::guard));
    let app = router(srv).merge(control);
    tasks.spawn(run_driver(ex.clone(), hub.clone(), faults.clone(), stop.clone()));
    let stop_serve = stop.clone();
    tasks.spawn(async move {
        let serve = axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
            .with_graceful_shutdown(stop_serve.cancelled_owned());
        if let Err(e) = serve.await {
            tracing::error!("sim server failed: {e}");
        }
    });
    tracing::info!(%addr, symbols = config.symbols.len(), speed = config.speed, seed = config.seed, "simulated exchange listening");
    Ok(Running { addr, ex, hub, faults, stop, tbt, tasks })
}

fn router(srv: Arc<Srv>) -> Router {
    let api = |prefix: &str, r: Router<Arc<Srv>>| {
        let p = |e: &str| format!("{prefix}/{e}");
        r.route(&p("ping"), get(rest::ping))
            .route(&p("time"), get(rest::time))
            .route(&p("exchangeInfo"), get(rest::exchange_info))
            .route(&p("klines"), get(rest::klines))
            .route(&p("depth"), get(rest::depth))
            .route(&p("aggTrades"), get(rest::agg_trades))
    };
    let rest_routes = api("/fapi/v1", api("/api/v3", Router::new()))
        .route("/api/v3/uiKlines", get(rest::klines))
        .route("/api/{*rest}", get(rest::not_found))
        .route("/fapi/{*rest}", get(rest::not_found))
        .route_layer(axum::middleware::from_fn_with_state(srv.clone(), rest::limits));
    // Binance's stream URL forms (spot at the root; USD-M futures under /fapi, also under its
    // routed /fapi/public and /fapi/market paths)
    let mut ws_routes = Router::new();
    for base in ["", "/fapi", "/fapi/public", "/fapi/market"] {
        ws_routes = ws_routes
            .route(&format!("{base}/ws"), get(ws::ws_bare))
            .route(&format!("{base}/ws/"), get(ws::ws_bare))
            .route(&format!("{base}/ws/{{*streams}}"), get(ws::ws_raw))
            .route(&format!("{base}/stream"), get(ws::ws_combined))
            .route(&format!("{base}/stream/"), get(ws::ws_combined));
    }
    rest_routes.merge(ws_routes).merge(crate::venues::routes()).with_state(srv)
}

/// `/sim/*`; the caller guards it ([`crate::control`]).
fn control_router(srv: Arc<Srv>) -> Router {
    Router::new()
        .route("/sim/faults", get(get_faults).post(post_faults))
        .route("/sim/status", get(status))
        .with_state(srv)
}

/// `GET /sim/faults`: `{"plan":..,"counters":..}`.
async fn get_faults(State(srv): State<Arc<Srv>>) -> Response {
    Json(serde_json::json!({ "plan": srv.faults.plan(), "counters": srv.faults.counters() }))
        .into_response()
}

/// `POST /sim/faults` with one [`FaultCommand`] or a list: `{"applied":n,"dropped":k}`.
async fn post_faults(State(srv): State<Arc<Srv>>, body: axum::body::Bytes) -> Response {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Body {
        One(FaultCommand),
        Many(Vec<FaultCommand>),
    }
    let cmds = match serde_json::from_slice::<Body>(&body) {
        Ok(Body::One(c)) => vec![c],
        Ok(Body::Many(v)) => v,
        Err(_) => {
            // parse again as a single command for a useful message
            let msg = match serde_json::from_slice::<FaultCommand>(&body) {
                Err(e) => e.to_string(),
                Ok(_) => "invalid fault command".into(),
            };
            let body =
                serde_json::json!({ "code": -1, "msg": format!("bad fault command: {msg}") });
            return (StatusCode::BAD_REQUEST, Json(body)).into_response();
        }
    };
    let applied = cmds.len();
    let dropped: usize = cmds.into_iter().map(|c| srv.faults.apply(c)).sum();
    Json(serde_json::json!({ "applied": applied, "dropped": dropped })).into_response()
}

/// `GET /sim/status`.
async fn status(State(srv): State<Arc<Srv>>) -> Response {
    Json(serde_json::json!({
        "now_ms": srv.ex.clock.now_ms(),
        "start_ms": srv.ex.clock.start_ms(),
        "speed": srv.ex.clock.speed(),
        "symbols": srv.ex.markets.iter().map(|m| m.spec.symbol.clone()).collect::<Vec<_>>(),
        "connections": srv.hub.connections(),
    }))
    .into_response()
}
