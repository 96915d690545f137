//! The REST API.
//!
//! Market data (no token):
//! - `GET /api/v1/klines?series=sim:spot:BTC/USDT:5m&startTime=&endTime=&limit=` — stored
//!   **closed** candles as Binance-style array rows
//!   `[openTime, "open", "high", "low", "close", "volume", closeTime, null, trades]`, oldest
//!   first. Index 7 (Binance's quote-asset volume) is `null`: millrace does not keep it.
//!   Selection as Binance: with `startTime`, the oldest `limit` from it; with only `endTime`, the
//!   newest `limit` up to it; with neither, the newest `limit`. `limit` defaults to 500.
//!   The forming candle is not stored; it comes over `kline@…`.
//! - `GET /api/v1/series` — the instruments each source offers, the timeframes, and what is stored.
//! - `GET /fapi/v1/depth?symbol=sim:spot:BTC/USDT&with_id=true[&limit=N]` — the order book as last
//!   published on `depth_update@…`: `{"code":0,"data":{"id":…,"bids":[["p","q"],…],"asks":[…]},
//!   "health":"synced"}` (seeds/local-order-book-snapshot-delta-sync.md; `id` is the `u` of the
//!   last delta, so the seed's client bridges with the first delta having `U <= id+1 <= u`).
//!   `limit` (levels per side) defaults to 1000, at most 5000. `health` other than `synced` /
//!   `snapshot_mode` means the book is not being updated right now (resyncing or stale): it is
//!   consistent with the deltas already sent, but old.
//!
//! Operations (no token):
//! - `GET /api/v1/ops/jobs` — the ingest supervisor's debug snapshot; depth jobs (their
//!   supervisor's view plus sync state and counters) under `depth`.
//! - `GET /api/v1/ops/backfill` — backfill tasks and their progress.
//! - `GET /api/v1/ops/books` — every published book: source, health, gaps, resyncs, drift, id,
//!   checksum, levels.
//! - `GET /api/v1/ops/shards` — the tick-by-tick engine: per shard pending, processed/s, lag,
//!   top pending symbols; per symbol shard, pending, lag, health, gaps, resets, and `hot` (a
//!   simulator's hot spot; absent for symbols of other sources); migrations; the tick-by-tick
//!   sources' counters.
//! - `GET /api/v1/ops/sources` — each source with its REST and WebSocket base URLs.
//! - `GET /metrics` — Prometheus text format.
//!
//! Admin (`Authorization: Bearer <server.admin_token>`; disabled with 403 when no token is set):
//! - `POST /api/v1/admin/backfill/start` and `/stop`, body `{"series":"sim:spot:BTC/USDT:1m"}`
//! - `POST /api/v1/admin/jobs/stop`, body `{"instrument":"sim:spot:BTC/USDT"}`
//! - `POST /api/v1/admin/shards/migrate`, body `{"symbol":"sim:stock:600000","target":N}`: move a
//!   tick-by-tick book to shard `N`, or to a new shard with `-1` (seeds/tick-by-tick-…-migration.md)
//! - `POST /api/v1/admin/shards/auto_balance`, body `{"on":true}`
//! - `POST /api/v1/admin/sim/hotspot`, body `{"symbol":"sim:stock:600000","hot":true}`: the
//!   simulator multiplies that symbol's tick-by-tick rate (x2000 by default)
//!
//! Errors are `{"code":"<snake_case>","msg":"..."}` with a 4xx status.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use shared::protocol::{InstrumentId, SeriesId};

use super::AppState;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/v1/klines", get(klines))
        .route("/api/v1/series", get(series))
        .route("/api/v1/ops/jobs", get(ops_jobs))
        .route("/api/v1/ops/backfill", get(ops_backfill))
        .route("/api/v1/ops/sources", get(ops_sources))
        .route("/metrics", get(metrics))
        .route("/fapi/v1/depth", get(rest_depth))
        .route("/api/v1/ops/books", get(ops_books))
        .route("/api/v1/ops/shards", get(ops_shards))
        .route("/api/v1/admin/shards/migrate", post(admin_migrate))
        .route("/api/v1/admin/shards/auto_balance", post(admin_auto_balance))
        .route("/api/v1/admin/sim/hotspot", post(admin_hotspot))
        .route("/api/v1/admin/backfill/start", post(admin_backfill_start))
        .route("/api/v1/admin/backfill/stop", post(admin_backfill_stop))
        .route("/api/v1/admin/jobs/stop", post(admin_job_stop))
}

/// An API error response.
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    msg: String,
}

impl ApiError {
    pub fn bad(code: &'static str, msg: impl Into<String>) -> Self {
        Self { status: StatusCode::BAD_REQUEST, code, msg: msg.into() }
    }
    fn internal(msg: impl Into<String>) -> Self {
        Self { status: StatusCode::INTERNAL_SERVER_ERROR, code: "internal", msg: msg.into() }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(serde_json::json!({"code": self.code, "msg": self.msg}))).into_response()
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KlinesQuery {
    series: Option<String>,
    #[serde(rename = "startTime")]
    start_time: Option<String>,
    #[serde(rename = "endTime")]
    end_time: Option<String>,
    limit: Option<String>,
}

fn int_param(name: &str, v: &Option<String>) -> Result<Option<i64>, ApiError> {
    match v {
        None => Ok(None),
        Some(s) => s
            .parse::<i64>()
            .map(Some)
            .map_err(|_| ApiError::bad("malformed", format!("{name} must be an integer (ms since the epoch or a count), got {s:?}"))),
    }
}

async fn klines(
    State(state): State<AppState>,
    query: Result<Query<KlinesQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let app = &state.app;
    app.metrics.http_klines_requests.fetch_add(1, Relaxed);
    let bad = |e: ApiError| {
        app.metrics.http_bad_requests.fetch_add(1, Relaxed);
        e
    };
    let Query(q) = query.map_err(|e| bad(ApiError::bad("malformed", e.body_text())))?;
    let series_text = q.series.ok_or_else(|| bad(ApiError::bad("malformed", "series is required, e.g. series=sim:spot:BTC/USDT:1m")))?;
    let series: SeriesId = series_text.parse().map_err(|e| bad(ApiError::bad("bad_stream", format!("series {series_text:?}: {e}"))))?;
    app.sources.validate_series(&series).map_err(|e| bad(ApiError::bad("unknown_series", e)))?;
    let start = int_param("startTime", &q.start_time).map_err(bad)?;
    let end = int_param("endTime", &q.end_time).map_err(bad)?;
    let max = app.config.limits.max_klines_limit;
    let limit = int_param("limit", &q.limit).map_err(bad)?.unwrap_or(500);
    if limit < 1 || limit as usize > max {
        return Err(bad(ApiError::bad("malformed", format!("limit must be between 1 and {max}, got {limit}"))));
    }
    if let (Some(s), Some(e)) = (start, end) {
        if s > e {
            return Err(bad(ApiError::bad("malformed", format!("startTime {s} is after endTime {e}"))));
        }
    }
    let store = app.store.clone();
    let tf = series.timeframe;
    let rows = tokio::task::spawn_blocking(move || store.candles(&series, start, end, limit as usize))
        .await
        .map_err(|e| ApiError::internal(format!("store task failed: {e}")))?
        .map_err(|e| ApiError::internal(e.to_string()))?;
    // Hand-written JSON: the rows are the hot path of every chart load.
    let mut out = String::with_capacity(rows.len() * 96 + 2);
    out.push('[');
    for (i, c) in rows.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        use std::fmt::Write as _;
        let _ = write!(
            out,
            "[{},\"{}\",\"{}\",\"{}\",\"{}\",\"{}\",{},null,{}]",
            c.open_time,
            c.open,
            c.high,
            c.low,
            c.close,
            c.volume,
            c.open_time + tf.duration_ms() - 1,
            c.trades
        );
    }
    out.push(']');
    Ok(([(axum::http::header::CONTENT_TYPE, "application/json")], out).into_response())
}

async fn series(State(state): State<AppState>) -> Result<Response, ApiError> {
    let app = state.app.clone();
    let store = app.store.clone();
    let stored = tokio::task::spawn_blocking(move || store.series())
        .await
        .map_err(|e| ApiError::internal(format!("store task failed: {e}")))?
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let mut timeframes = vec!["1m".to_string()];
    timeframes.extend(app.config.ingest.derived.iter().map(|t| t.to_string()));
    let stored: Vec<_> = stored
        .into_iter()
        .map(|s| {
            serde_json::json!({
                "series": s.series.to_string(),
                "count": s.count,
                "first_open_time": s.first_open_time,
                "last_open_time": s.last_open_time,
            })
        })
        .collect();
    Ok(Json(serde_json::json!({
        "timeframes": timeframes,
        "instruments": app.sources.instruments(),
        "stored": stored,
    }))
    .into_response())
}

/// The candle jobs' supervisor snapshot, with the depth jobs' (supervisor view and sync status)
/// under `depth`.
async fn ops_jobs(State(state): State<AppState>) -> Response {
    let mut v = serde_json::to_value(state.app.supervisor.snapshot()).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert("depth".into(), serde_json::to_value(state.app.depth_jobs_snapshot()).unwrap_or_default());
    }
    Json(v).into_response()
}

async fn ops_backfill(State(state): State<AppState>) -> Response {
    Json(serde_json::json!({ "tasks": state.app.backfill.snapshot() })).into_response()
}

async fn ops_sources(State(state): State<AppState>) -> Response {
    Json(serde_json::json!({ "sources": state.app.sources.snapshot() })).into_response()
}

async fn metrics(State(state): State<AppState>) -> Response {
    let text = state.app.render_metrics();
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// Checks `Authorization: Bearer <token>` against the configured admin token.
fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(expected) = state.app.config.server.admin_token.as_deref() else {
        state.app.metrics.admin_unauthorized.fetch_add(1, Relaxed);
        return Err(ApiError {
            status: StatusCode::FORBIDDEN,
            code: "unauthorized",
            msg: "admin actions are disabled: set server.admin_token or MILLRACE_ADMIN_TOKEN".into(),
        });
    };
    let given = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    // Constant-time comparison: the token must not leak through timing.
    let ok = given.is_some_and(|g| {
        g.len() == expected.len() && g.bytes().zip(expected.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    });
    if ok {
        Ok(())
    } else {
        state.app.metrics.admin_unauthorized.fetch_add(1, Relaxed);
        Err(ApiError {
            status: StatusCode::UNAUTHORIZED,
            code: "unauthorized",
            msg: "missing or wrong `Authorization: Bearer <token>`".into(),
        })
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SeriesBody {
    series: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InstrumentBody {
    instrument: String,
}

fn body<T: serde::de::DeserializeOwned>(raw: &str) -> Result<T, ApiError> {
    serde_json::from_str(raw).map_err(|e| ApiError::bad("malformed", format!("bad JSON body: {e}")))
}

async fn admin_backfill_start(State(state): State<AppState>, headers: HeaderMap, raw: String) -> Result<Response, ApiError> {
    authorize(&state, &headers)?;
    let b: SeriesBody = body(&raw)?;
    state.app.backfill.start(&b.series).map_err(|e| ApiError::bad("unknown_series", e))?;
    Ok(Json(serde_json::json!({"result": "started", "series": b.series})).into_response())
}

async fn admin_backfill_stop(State(state): State<AppState>, headers: HeaderMap, raw: String) -> Result<Response, ApiError> {
    authorize(&state, &headers)?;
    let b: SeriesBody = body(&raw)?;
    state.app.backfill.stop(&b.series).map_err(|e| ApiError::bad("unknown_series", e))?;
    Ok(Json(serde_json::json!({"result": "stopping", "series": b.series})).into_response())
}

async fn admin_job_stop(State(state): State<AppState>, headers: HeaderMap, raw: String) -> Result<Response, ApiError> {
    authorize(&state, &headers)?;
    let b: InstrumentBody = body(&raw)?;
    let inst: InstrumentId = b.instrument.parse().map_err(|e| ApiError::bad("bad_stream", format!("{e}")))?;
    if state.app.supervisor.stop_job(&inst) {
        Ok(Json(serde_json::json!({"result": "stopped", "instrument": b.instrument})).into_response())
    } else {
        Err(ApiError { status: StatusCode::NOT_FOUND, code: "not_found", msg: format!("no job for {inst}") })
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DepthQuery {
    symbol: Option<String>,
    with_id: Option<String>,
    limit: Option<String>,
}

/// How long `GET /fapi/v1/depth` waits for a starting book's first publish.
const BOOK_START_WAIT: Duration = Duration::from_secs(5);

/// Levels per side `GET /fapi/v1/depth` returns without `limit`.
const DEFAULT_DEPTH_LIMIT: i64 = 1000;

async fn rest_depth(
    State(state): State<AppState>,
    query: Result<Query<DepthQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let app = &state.app;
    let bad = |e: ApiError| {
        app.metrics.http_bad_requests.fetch_add(1, Relaxed);
        e
    };
    let Query(q) = query.map_err(|e| bad(ApiError::bad("malformed", e.body_text())))?;
    let text = q.symbol.ok_or_else(|| bad(ApiError::bad("malformed", "symbol is required, e.g. symbol=sim:spot:BTC/USDT")))?;
    let instrument: InstrumentId = text.parse().map_err(|e| bad(ApiError::bad("bad_stream", format!("symbol {text:?}: {e}"))))?;
    if let Some(w) = q.with_id.as_deref() {
        if w != "true" && w != "false" {
            return Err(bad(ApiError::bad("malformed", format!("with_id must be true or false, got {w:?}"))));
        }
    }
    let max = crate::books::MAX_REST_LEVELS as i64;
    let limit = int_param("limit", &q.limit).map_err(bad)?.unwrap_or(DEFAULT_DEPTH_LIMIT);
    if !(1..=max).contains(&limit) {
        return Err(bad(ApiError::bad("malformed", format!("limit must be between 1 and {max}, got {limit}"))));
    }
    // A book whose job has just started (the seed's client subscribes, then asks at once) is
    // waited for, up to BOOK_START_WAIT, instead of answered "unknown".
    let deadline = tokio::time::Instant::now() + BOOK_START_WAIT;
    let mut found = app.books.rest_depth(&instrument, limit as usize);
    while found.as_ref().is_none_or(|(d, _)| d.id == 0)
        && (app.books.contains(&instrument) || app.depth.health(&instrument).is_some())
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
        found = app.books.rest_depth(&instrument, limit as usize);
    }
    let Some((depth, health)) = found else {
        return Err(bad(ApiError {
            status: StatusCode::NOT_FOUND,
            code: "unknown_book",
            msg: format!("no order book for {instrument}: subscribe to depth_update@{instrument} first (that starts its depth job)"),
        }));
    };
    Ok(Json(serde_json::json!({"code": 0, "data": depth, "health": health})).into_response())
}

async fn ops_books(State(state): State<AppState>) -> Response {
    Json(serde_json::json!({ "books": state.app.books.list() })).into_response()
}

async fn ops_shards(State(state): State<AppState>) -> Response {
    let l3 = &state.app.l3;
    let sources: Vec<serde_json::Value> = l3
        .sources
        .iter()
        .map(|s| {
            let c = &s.counters;
            serde_json::json!({
                "name": s.name,
                "events": c.events.load(Relaxed),
                "unknown_symbol": c.unknown_symbol.load(Relaxed),
                "connect_snapshots": c.connect_snapshots.load(Relaxed),
                "recoveries": c.recoveries.load(Relaxed),
                "recovery_failures": c.recovery_failures.load(Relaxed),
                "held_dropped": c.held_dropped.load(Relaxed),
                "kind": if s.rest.is_some() { "sim" } else { "replay" },
                "replay_done": c.done.load(Relaxed),
            })
        })
        .collect();
    let mut engine = serde_json::to_value(l3.handle.stats()).unwrap_or_default();
    // Hot spots are the simulator's state: ask it (briefly) and mark its symbols.
    let mut hot: std::collections::HashMap<(String, String), bool> = std::collections::HashMap::new();
    for s in &l3.sources {
        let Some(rest) = &s.rest else { continue };
        match tokio::time::timeout(SIM_STATUS_WAIT, rest.status()).await {
            Ok(Ok(status)) => hot.extend(status.symbols.into_iter().map(|sym| ((s.name.clone(), sym.symbol), sym.hot))),
            Ok(Err(e)) => tracing::debug!(source = %s.name, "simulator status: {e}"),
            Err(_) => tracing::debug!(source = %s.name, "simulator status: no answer in {SIM_STATUS_WAIT:?}"),
        }
    }
    if let Some(symbols) = engine.get_mut("symbols").and_then(|v| v.as_array_mut()) {
        for sym in symbols {
            let id = sym.get("instrument").and_then(|i| i.as_str()).and_then(|i| i.parse::<InstrumentId>().ok());
            let known = id.and_then(|id| hot.get(&(id.exchange, id.symbol)).copied());
            if let (Some(h), Some(o)) = (known, sym.as_object_mut()) {
                o.insert("hot".into(), h.into());
            }
        }
    }
    Json(serde_json::json!({ "engine": engine, "sources": sources })).into_response()
}

/// How long `GET /api/v1/ops/shards` waits for a simulator's hot-spot state.
const SIM_STATUS_WAIT: Duration = Duration::from_millis(300);

/// A tick-by-tick book named by instrument id (`sim:stock:600000`) or, when unambiguous, by its
/// code alone (`600000`).
fn l3_symbol(state: &AppState, text: &str) -> Result<(InstrumentId, crate::l3engine::SymbolIdx), ApiError> {
    let handle = &state.app.l3.handle;
    let not_found = || ApiError {
        status: StatusCode::NOT_FOUND,
        code: "unknown_book",
        msg: format!("no tick-by-tick book {text:?} (see GET /api/v1/ops/shards)"),
    };
    if text.contains(':') {
        let inst: InstrumentId = text.parse().map_err(|e| ApiError::bad("bad_stream", format!("{e}")))?;
        let idx = handle.symbol(&inst).ok_or_else(not_found)?;
        return Ok((inst, idx));
    }
    let matches: Vec<_> = handle
        .stats()
        .symbols
        .into_iter()
        .filter(|s| s.instrument.rsplit(':').next() == Some(text))
        .collect();
    match matches.as_slice() {
        [one] => Ok((one.instrument.parse().map_err(|_| not_found())?, one.symbol)),
        [] => Err(not_found()),
        _ => Err(ApiError::bad("ambiguous", format!("{text:?} names several books; use the instrument id"))),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MigrateBody {
    symbol: String,
    target: i64,
}

async fn admin_migrate(State(state): State<AppState>, headers: HeaderMap, raw: String) -> Result<Response, ApiError> {
    authorize(&state, &headers)?;
    let b: MigrateBody = body(&raw)?;
    let (inst, idx) = l3_symbol(&state, &b.symbol)?;
    let target = crate::l3engine::Target::from_api(b.target).map_err(|e| ApiError::bad("bad_target", e.to_string()))?;
    let from = state.app.l3.handle.stats().symbol(idx).map(|s| s.shard);
    state.app.l3.handle.migrate(idx, target).map_err(|e| ApiError::bad("migrate_refused", e.to_string()))?;
    Ok(Json(serde_json::json!({"result": "migrating", "symbol": inst, "from": from, "target": b.target})).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OnBody {
    on: bool,
}

async fn admin_auto_balance(State(state): State<AppState>, headers: HeaderMap, raw: String) -> Result<Response, ApiError> {
    authorize(&state, &headers)?;
    let b: OnBody = body(&raw)?;
    state.app.l3.handle.set_auto_balance(b.on);
    Ok(Json(serde_json::json!({"result": "ok", "auto_balance": b.on})).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HotspotBody {
    symbol: String,
    hot: bool,
}

async fn admin_hotspot(State(state): State<AppState>, headers: HeaderMap, raw: String) -> Result<Response, ApiError> {
    authorize(&state, &headers)?;
    let b: HotspotBody = body(&raw)?;
    let (inst, _) = l3_symbol(&state, &b.symbol)?;
    let rest = state.app.l3.sim_rest(&inst).ok_or_else(|| {
        ApiError::bad("not_simulated", format!("{inst} does not come from a simulator; hot spots are a simulator control"))
    })?;
    let cmd = crate::tbt::Control::Hotspot { symbol: inst.symbol.clone(), hot: b.hot };
    rest.control(&cmd).await.map_err(|e| ApiError {
        status: StatusCode::BAD_GATEWAY,
        code: "simulator_error",
        msg: format!("the simulator refused: {e}"),
    })?;
    Ok(Json(serde_json::json!({"result": "ok", "symbol": inst, "hot": b.hot})).into_response())
}
