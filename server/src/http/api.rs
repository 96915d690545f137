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
//! - `GET /api/v1/ops/sources` — each source with its REST and WebSocket base URLs (an embedded
//!   simulator's only with the admin token: its control endpoints take that token).
//! - `GET /api/v1/ops/recording` — the recorder (`[record]`): whether it runs, its directory and
//!   sources, frames queued, written and dropped (queue full, write failed), bytes, deleted files.
//! - `GET /metrics` — Prometheus text format.
//!
//! Admin (`Authorization: Bearer <server.admin_token>`; disabled with 403 when no token is set;
//! the token, the address's failed attempts and the body's size and time are checked by
//! [`super::admin`] before the handler runs):
//! - `POST /api/v1/admin/backfill/start` and `/stop`, body `{"series":"sim:spot:BTC/USDT:1m"}`
//! - `POST /api/v1/admin/jobs/stop`, body `{"instrument":"sim:spot:BTC/USDT"}`: ends the job's
//!   run; a pinned or subscribed job starts again in place (`"result":"restarted"`, its sessions
//!   stay attached), an idle on-demand one is removed (`"stopped"`)
//! - `POST /api/v1/admin/shards/migrate`, body `{"symbol":"sim:stock:600000","target":N}`: move a
//!   tick-by-tick book to shard `N`, or to a new shard with `-1` (seeds/tick-by-tick-…-migration.md)
//! - `POST /api/v1/admin/shards/auto_balance`, body `{"on":true}`
//! - `POST /api/v1/admin/sim/hotspot`, body `{"symbol":"sim:stock:600000","hot":true}`: the
//!   simulator multiplies that symbol's tick-by-tick rate (x2000 by default)
//!
//! Every answer is a type of `shared::protocol::ops` (or `shared::protocol::RestDepthResponse`),
//! the same the dashboard reads. Errors are `{"code":"<snake_case>","msg":"..."}`
//! ([`ApiError`]) with a 4xx status, or 5xx for the server's own failures.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use shared::protocol::ops::{
    AdminResult, ApiErrorCode as Code, AutoBalanceReply, AutoBalanceRequest, BackfillReport,
    BooksReport, Catalog, ClusterReport, HotspotReply, HotspotRequest, InstrumentReply,
    InstrumentRequest, JobsReport, KlineRow, MigrateReply, MigrateRequest, SeriesReply,
    SeriesRequest, ShardsReport, SourcesReport, StoredSeries, REPORT_MAX_TASKS,
};
use shared::protocol::{InstrumentId, RestDepthResponse, SeriesId};

use super::admin::TokenVerdict;
use super::{ApiError, AppState};
use crate::candles::backfill::BackfillError;
use crate::store::blocking;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/v1/klines", get(klines))
        .route("/api/v1/export/candles", get(export_candles))
        .route("/api/v1/export/trades", get(export_trades))
        .route("/api/v1/replay", get(replay))
        .route("/api/v1/trades", get(trades))
        .route("/api/v1/series", get(series))
        .route("/api/v1/ops/jobs", get(ops_jobs))
        .route("/api/v1/ops/backfill", get(ops_backfill))
        .route("/api/v1/ops/sources", get(ops_sources))
        .route("/api/v1/ops/recording", get(ops_recording))
        .route("/api/v1/ops/cluster", get(ops_cluster))
        .route("/metrics", get(metrics))
        .route("/fapi/v1/depth", get(rest_depth))
        .route("/api/v1/ops/books", get(ops_books))
        .route("/api/v1/ops/shards", get(ops_shards))
}

/// The admin requests; the caller puts them behind [`super::admin::guard`].
pub fn admin_routes() -> Router<AppState> {
    Router::new()
        .route("/api/v1/admin/shards/migrate", post(admin_migrate))
        .route("/api/v1/admin/shards/auto_balance", post(admin_auto_balance))
        .route("/api/v1/admin/sim/hotspot", post(admin_hotspot))
        .route("/api/v1/admin/backfill/start", post(admin_backfill_start))
        .route("/api/v1/admin/backfill/stop", post(admin_backfill_stop))
        .route("/api/v1/admin/jobs/stop", post(admin_job_stop))
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

#[derive(Debug, Deserialize)]
pub struct TradesQuery {
    instrument: Option<String>,
    limit: Option<String>,
}

/// `GET /api/v1/trades?instrument=…&limit=…`: the newest trades held in memory (at most
/// [`crate::trades::RECENT_TRADES`], newest first) and what their ids went through.
async fn trades(
    State(state): State<AppState>,
    query: Result<Query<TradesQuery>, QueryRejection>,
) -> Result<Json<shared::protocol::ops::TradesReport>, ApiError> {
    let app = &state.app;
    let bad = |e: ApiError| state.bad_request(e);
    let Query(q) = query.map_err(|e| bad(ApiError::bad(Code::Malformed, e.body_text())))?;
    let instrument = instrument_param(q.instrument, "sim-okx:spot:BTC/USDT").map_err(bad)?;
    let max = crate::trades::RECENT_TRADES as i64;
    let limit = int_param("limit", q.limit.as_deref()).map_err(bad)?.unwrap_or(100);
    if !(1..=max).contains(&limit) {
        return Err(bad(ApiError::bad(
            Code::Malformed,
            format!("limit must be between 1 and {max}, got {limit}"),
        )));
    }
    let (trades, stats) =
        app.books().trades().recent(&instrument, limit as usize).unwrap_or_default();
    Ok(Json(shared::protocol::ops::TradesReport {
        instrument,
        trades,
        received: stats.received,
        duplicates: stats.duplicates,
        id_gaps: stats.gaps,
        missing_ids: stats.missing,
        filled: stats.filled,
    }))
}

fn int_param(name: &str, v: Option<&str>) -> Result<Option<i64>, ApiError> {
    match v {
        None => Ok(None),
        Some(s) => s.parse::<i64>().map(Some).map_err(|_| {
            ApiError::bad(
                Code::Malformed,
                format!("{name} must be an integer (ms since the epoch or a count), got {s:?}"),
            )
        }),
    }
}

impl AppState {
    /// Counts a rejected request and passes its error on.
    fn bad_request(&self, e: ApiError) -> ApiError {
        self.app.metrics().http_bad_requests.fetch_add(1, Relaxed);
        e
    }
}

async fn klines(
    State(state): State<AppState>,
    query: Result<Query<KlinesQuery>, QueryRejection>,
) -> Result<Json<Vec<KlineRow>>, ApiError> {
    let app = &state.app;
    app.metrics().http_klines_requests.fetch_add(1, Relaxed);
    let bad = |e: ApiError| state.bad_request(e);
    let Query(q) = query.map_err(|e| bad(ApiError::bad(Code::Malformed, e.body_text())))?;
    let series = served_series(app, q.series.as_deref()).map_err(bad)?;
    let start = int_param("startTime", q.start_time.as_deref()).map_err(bad)?;
    let end = int_param("endTime", q.end_time.as_deref()).map_err(bad)?;
    let max = app.config().limits.max_klines_limit;
    let limit = int_param("limit", q.limit.as_deref()).map_err(bad)?.unwrap_or(500);
    if limit < 1 || limit as usize > max {
        return Err(bad(ApiError::bad(
            Code::Malformed,
            format!("limit must be between 1 and {max}, got {limit}"),
        )));
    }
    if let (Some(s), Some(e)) = (start, end) {
        if s > e {
            return Err(bad(ApiError::bad(
                Code::Malformed,
                format!("startTime {s} is after endTime {e}"),
            )));
        }
    }
    let tf = series.timeframe;
    // queued for the store's read connections without taking a thread; over its bound, 503
    let rows =
        crate::store::read(app.store(), move |s| s.candles(&series, start, end, limit as usize))
            .await
            .map_err(|e| match e {
                crate::store::StoreError::Busy { .. } => {
                    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, Code::Unavailable, e.to_string())
                }
                e => ApiError::internal(&e),
            })?;
    Ok(Json(rows.iter().map(|c| KlineRow::new(tf, c)).collect()))
}

/// The `series` parameter of a read: given, well formed, and one the sources serve.
fn served_series(app: &crate::app::App, text: Option<&str>) -> Result<SeriesId, ApiError> {
    let text = text.ok_or_else(|| {
        ApiError::bad(Code::Malformed, "series is required, e.g. series=sim:spot:BTC/USDT:1m")
    })?;
    let series: SeriesId = text
        .parse()
        .map_err(|e| ApiError::bad(Code::BadStream, format!("series {text:?}: {e}")))?;
    app.sources()
        .validate_series(&series)
        .map_err(|e| ApiError::bad(Code::UnknownSeries, e.to_string()))?;
    Ok(series)
}

#[derive(Deserialize)]
struct ExportQuery {
    series: Option<String>,
    from: Option<String>,
    to: Option<String>,
    format: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TradesExportQuery {
    instrument: Option<String>,
    from: Option<String>,
    to: Option<String>,
    format: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayQuery {
    source: Option<String>,
    from: Option<String>,
    to: Option<String>,
    channels: Option<String>,
}

/// Replays streaming at once; another is refused until one ends (each reads files and parses
/// every frame of its range).
static REPLAYS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(4);

/// `GET /api/v1/replay?source=…&from=…&to=…&channels=…`: a time range (receive times, ms, both
/// optional) of the recording of `source` (`record.dir`), as normalized messages, one JSON
/// object per line (`shared::protocol::replay::ReplayLine`), streamed as it is read
/// (`crate::recorded`).
async fn replay(
    State(state): State<AppState>,
    query: Result<Query<ReplayQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let app = state.app.clone();
    let bad = |e: ApiError| state.bad_request(e);
    let Query(q) = query.map_err(|e| bad(ApiError::bad(Code::Malformed, e.body_text())))?;
    let source = q
        .source
        .ok_or_else(|| bad(ApiError::bad(Code::Malformed, "source is required".to_string())))?;
    let from = int_param("from", q.from.as_deref()).map_err(bad)?;
    let to = int_param("to", q.to.as_deref()).map_err(bad)?;
    if let (Some(f), Some(t)) = (from, to) {
        if f > t {
            return Err(bad(ApiError::bad(Code::Malformed, format!("from {f} is after to {t}"))));
        }
    }
    let channels = crate::recorded::Channels::parse(q.channels.as_deref().unwrap_or(""))
        .map_err(|e| bad(ApiError::bad(Code::Malformed, e.to_string())))?;
    // this process's recording, and its cluster workers' (merged by the venue's ids)
    let dirs = match crate::recorded::replicas(&app.config().record_dir(), &source) {
        Ok(dirs) => dirs,
        Err(e) => return Err(bad(ApiError::bad(Code::Malformed, e.to_string()))),
    };
    let Some(first) = dirs.first() else {
        let e = crate::recorded::RecordedError::NoSource(source);
        return Err(ApiError::not_found(Code::NotFound, e.to_string()));
    };
    if let Err(e) = crate::recorded::describe(first, &source) {
        return Err(ApiError::not_found(Code::NotFound, e.to_string()));
    }
    let permit = REPLAYS.try_acquire().map_err(|_| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            Code::Unavailable,
            "as many replays as may run are streaming; try again when one ends",
        )
    })?;
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<bytes::Bytes>>(4);
    app.shutdown().spawn(async move {
        let failed = tx.clone();
        let read = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let mut buf = Vec::with_capacity(64 << 10);
            let mut gone = false;
            let summary =
                crate::recorded::read_merged(&dirs, &source, from, to, channels, &mut |line| {
                    if serde_json::to_writer(&mut buf, &line).is_err() {
                        return true;
                    }
                    buf.push(b'\n');
                    if buf.len() >= 64 << 10 {
                        let piece = bytes::Bytes::from(std::mem::take(&mut buf));
                        gone = tx.blocking_send(Ok(piece)).is_err();
                    }
                    !gone
                });
            if !buf.is_empty() && !gone {
                let _ = tx.blocking_send(Ok(bytes::Bytes::from(buf)));
            }
            summary
        })
        .await;
        end_stream("replay", read, &failed).await;
    });
    Ok(([(axum::http::header::CONTENT_TYPE, "application/x-ndjson")], streamed(rx)).into_response())
}

/// A body streamed from what `rx` receives, a piece at a time (an error ends it, cut).
fn streamed(rx: tokio::sync::mpsc::Receiver<std::io::Result<bytes::Bytes>>) -> axum::body::Body {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|piece| (piece, rx))
    });
    axum::body::Body::from_stream(stream)
}

/// Ends a [`streamed`] body with the error of `outcome` (the work's, or its task's), if it
/// failed: the client sees the body cut, never a short file that looks whole.
async fn end_stream<T, E: std::fmt::Display, J: std::fmt::Display>(
    what: &str,
    outcome: Result<Result<T, E>, J>,
    tx: &tokio::sync::mpsc::Sender<std::io::Result<bytes::Bytes>>,
) {
    let error = match outcome {
        Ok(Ok(_)) => return,
        Ok(Err(e)) => e.to_string(),
        Err(e) => e.to_string(),
    };
    tracing::warn!("{what} failed: {error}");
    let _ = tx.send(Err(std::io::Error::other(error))).await;
}

/// `GET /api/v1/export/candles?series=…&from=…&to=…&format=parquet|csv`: the stored candles of a
/// series (open times `from` ..= `to`, ms; both optional) as a file, streamed while it is read
/// from the store a chunk at a time (`crate::export`), at most `limits.max_export_rows` rows.
async fn export_candles(
    State(state): State<AppState>,
    query: Result<Query<ExportQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let app = state.app.clone();
    let bad = |e: ApiError| state.bad_request(e);
    let Query(q) = query.map_err(|e| bad(ApiError::bad(Code::Malformed, e.body_text())))?;
    let series = served_series(&app, q.series.as_deref()).map_err(bad)?;
    let range = export_range(&app, q.from, q.to, q.format).map_err(bad)?;
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<bytes::Bytes>>(4);
    let name = file_name(&series.to_string(), "", range.format);
    let store = app.store().clone();
    // read and written on the store's read connections, a chunk at a time; a failure after the
    // first bytes ends the body with an error (the client sees it cut, never a short file)
    app.shutdown().spawn(async move {
        let failed = tx.clone();
        let done = crate::store::read(&store, move |s| {
            let out = crate::export::ChannelWriter::new(tx);
            Ok(crate::export::candles(s, &series, range, out).map(|_| ()))
        })
        .await;
        end_stream("export of candles", done, &failed).await;
    });
    Ok(file_response(range.format, &name, rx))
}

/// An export's range and format from its query (`from`, `to`: ms, both optional; `format`:
/// parquet, the default, or csv), at most `limits.max_export_rows` rows.
fn export_range(
    app: &crate::app::App,
    from: Option<String>,
    to: Option<String>,
    format: Option<String>,
) -> Result<crate::export::ExportRange, ApiError> {
    let from = int_param("from", from.as_deref())?.unwrap_or(0);
    let to = int_param("to", to.as_deref())?.unwrap_or(i64::MAX);
    if from > to {
        return Err(ApiError::bad(Code::Malformed, format!("from {from} is after to {to}")));
    }
    let format: crate::export::Format =
        format.as_deref().unwrap_or("parquet").parse().map_err(
            |e: crate::export::ExportError| ApiError::bad(Code::Malformed, e.to_string()),
        )?;
    Ok(crate::export::ExportRange {
        from,
        to,
        max_rows: app.config().limits.max_export_rows,
        format,
    })
}

/// An exported file's name: what it holds (`:` and `/` made `_`), a suffix, its extension.
fn file_name(what: &str, suffix: &str, format: crate::export::Format) -> String {
    format!("{}{suffix}.{}", what.replace([':', '/'], "_"), format.extension())
}

/// An exported file as an attachment, its body streamed from `rx`.
fn file_response(
    format: crate::export::Format,
    name: &str,
    rx: tokio::sync::mpsc::Receiver<std::io::Result<bytes::Bytes>>,
) -> Response {
    (
        [
            (axum::http::header::CONTENT_TYPE, format.content_type().to_string()),
            (axum::http::header::CONTENT_DISPOSITION, format!("attachment; filename=\"{name}\"")),
        ],
        streamed(rx),
    )
        .into_response()
}

/// The `instrument` parameter, required (`example` shows one).
fn instrument_param(text: Option<String>, example: &str) -> Result<InstrumentId, ApiError> {
    let text = text.ok_or_else(|| {
        ApiError::bad(Code::Malformed, format!("instrument is required, e.g. instrument={example}"))
    })?;
    text.parse().map_err(|e| ApiError::bad(Code::BadStream, format!("instrument {text:?}: {e}")))
}

/// `GET /api/v1/export/trades?instrument=…&from=…&to=…&format=parquet|csv`: an instrument's
/// trades (the venue's trade times `from` ..= `to`, ms; both optional) from the recording of its
/// source, this process's and its cluster workers' merged by trade id (`crate::recorded`), as
/// `millrace export trades` writes them; streamed while it is read, at most
/// `limits.max_export_rows` rows, and counted among the replays that may stream at once.
async fn export_trades(
    State(state): State<AppState>,
    query: Result<Query<TradesExportQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let app = state.app.clone();
    let bad = |e: ApiError| state.bad_request(e);
    let Query(q) = query.map_err(|e| bad(ApiError::bad(Code::Malformed, e.body_text())))?;
    let instrument = instrument_param(q.instrument, "okx:spot:BTC/USDT").map_err(bad)?;
    let range = export_range(&app, q.from, q.to, q.format).map_err(bad)?;
    let dirs = crate::recorded::replicas(&app.config().record_dir(), &instrument.exchange)
        .map_err(|e| bad(ApiError::bad(Code::Malformed, e.to_string())))?;
    let permit = REPLAYS.try_acquire().map_err(|_| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            Code::Unavailable,
            "as many replays and trade exports as may run are streaming; try again when one ends",
        )
    })?;
    // the instrument is looked up before the first byte, so a wrong one is a 404, not a cut body
    let find = instrument.clone();
    let found =
        tokio::task::spawn_blocking(move || crate::export::RecordedTrades::find(&dirs, &find))
            .await
            .map_err(|e| ApiError::internal(&e))?
            .map_err(|e| {
                use crate::export::ExportError::{NotRecorded, Recorded};
                match e {
                    NotRecorded(_) | Recorded(crate::recorded::RecordedError::NoSource(_)) => {
                        ApiError::not_found(Code::NotFound, e.to_string())
                    }
                    other => ApiError::internal(&other),
                }
            })?;
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<bytes::Bytes>>(4);
    let name = file_name(&instrument.to_string(), "-trades", range.format);
    app.shutdown().spawn(async move {
        let failed = tx.clone();
        let written = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let out = crate::export::ChannelWriter::new(tx);
            crate::export::recorded_trades(&found, range, out).map(|_| ())
        })
        .await;
        end_stream("export of trades", written, &failed).await;
    });
    Ok(file_response(range.format, &name, rx))
}

async fn series(State(state): State<AppState>) -> Result<Json<Catalog>, ApiError> {
    let app = state.app.clone();
    let store = app.store().clone();
    let stored = blocking(move || store.series()).await.map_err(|e| ApiError::internal(&e))?;
    Ok(Json(Catalog {
        timeframes: app.sources().timeframes().to_vec(),
        instruments: app.sources().instruments(),
        stored: stored
            .into_iter()
            .map(|s| StoredSeries {
                series: s.series,
                count: s.count,
                first_open_time: s.first_open_time,
                last_open_time: s.last_open_time,
            })
            .collect(),
    }))
}

/// The candle jobs' supervisor snapshot, with the depth jobs' (supervisor view and sync status)
/// under `depth`.
async fn ops_jobs(State(state): State<AppState>) -> Json<JobsReport> {
    let kline = state.app.supervisor().snapshot();
    Json(JobsReport {
        capacity: kline.capacity,
        jobs: kline.jobs,
        depth: state.app.depth_jobs_snapshot(),
    })
}

async fn ops_backfill(State(state): State<AppState>) -> Json<BackfillReport> {
    Json(BackfillReport {
        tasks: state.app.backfill().snapshot(),
        runs_here: state.app.backfill().runs_here(),
    })
}

/// Every source. The address of an embedded simulator (whose control endpoints take the admin
/// token) is shown only to a request carrying the admin token. A request carrying a wrong one
/// is a failed admin attempt like any other: counted against its address, and refused (429)
/// once the address used them up.
async fn ops_recording(State(state): State<AppState>) -> Response {
    let mut report = state.app.recording().report();
    report.playback = state.app.players().iter().map(|p| p.report()).collect();
    Json(report).into_response()
}

async fn ops_sources(State(state): State<AppState>, request: Request) -> Response {
    let headers = request.headers();
    let reveal = match headers.contains_key(axum::http::header::AUTHORIZATION) {
        false => false,
        true => {
            let who = super::admin::client_of(&request);
            match state.admin.verdict(who, headers, tokio::time::Instant::now()) {
                TokenVerdict::Admin => true,
                TokenVerdict::Disabled => false,
                TokenVerdict::Wrong => {
                    state.app.metrics().admin_unauthorized.fetch_add(1, Relaxed);
                    false
                }
                throttled @ TokenVerdict::Throttled { .. } => {
                    return state.admin.refusal(throttled)
                }
            }
        }
    };
    Json(SourcesReport { sources: state.app.sources().snapshot(reveal) }).into_response()
}

/// The leading supervisor's report, asked over NATS (a gateway only); `?max_tasks=N` (default
/// 1,000) bounds the task list.
async fn ops_cluster(
    State(state): State<AppState>,
    query: Result<Query<ReportQueryParams>, QueryRejection>,
) -> Result<Json<ClusterReport>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::bad(Code::Malformed, e.body_text()))?;
    let Some(x) = state.app.extension() else {
        return Err(ApiError::not_found(
            Code::NotFound,
            "this server is not a gateway of a cluster ([cluster] enabled = false)",
        ));
    };
    let max_tasks = q.max_tasks.unwrap_or(REPORT_MAX_TASKS).min(5_000);
    x.cluster_report(max_tasks)
        .await
        .map(Json)
        .map_err(|why| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, Code::Unavailable, why.0))
}

/// `GET /api/v1/ops/cluster` parameters.
#[derive(Debug, serde::Deserialize)]
struct ReportQueryParams {
    max_tasks: Option<usize>,
}

async fn metrics(State(state): State<AppState>) -> Response {
    let text = super::metrics::render(&state.app).await;
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// An admin request's JSON body (the request passed [`super::admin::guard`]: authorized, and
/// its body read within its limits).
fn admin<T: serde::de::DeserializeOwned>(state: &AppState, raw: &str) -> Result<T, ApiError> {
    serde_json::from_str(raw).map_err(|e| {
        state.bad_request(ApiError::bad(Code::Malformed, format!("bad JSON body: {e}")))
    })
}

async fn admin_backfill_start(
    State(state): State<AppState>,
    raw: String,
) -> Result<Json<SeriesReply>, ApiError> {
    let b: SeriesRequest = admin(&state, &raw)?;
    state.app.backfill().start(&b.series).map_err(|e| match e {
        BackfillError::UnknownTask(_) => ApiError::bad(Code::UnknownSeries, e.to_string()),
        BackfillError::OtherNode => {
            ApiError::new(StatusCode::CONFLICT, Code::OtherNode, e.to_string())
        }
    })?;
    Ok(Json(SeriesReply { result: AdminResult::Started, series: b.series }))
}

async fn admin_backfill_stop(
    State(state): State<AppState>,
    raw: String,
) -> Result<Json<SeriesReply>, ApiError> {
    let b: SeriesRequest = admin(&state, &raw)?;
    state
        .app
        .backfill()
        .stop(&b.series)
        .map_err(|e| ApiError::bad(Code::UnknownSeries, e.to_string()))?;
    Ok(Json(SeriesReply { result: AdminResult::Stopping, series: b.series }))
}

async fn admin_job_stop(
    State(state): State<AppState>,
    raw: String,
) -> Result<Json<InstrumentReply>, ApiError> {
    let b: InstrumentRequest = admin(&state, &raw)?;
    let inst: InstrumentId =
        b.instrument.parse().map_err(|e| ApiError::bad(Code::BadStream, format!("{e}")))?;
    // A pinned or subscribed job restarts in place (its sessions stay attached); an idle
    // on-demand one is removed.
    let result = match state.app.supervisor().admin_stop(&inst) {
        Some(crate::jobs::AdminStop::Stopped) => AdminResult::Stopped,
        Some(crate::jobs::AdminStop::Restarted) => AdminResult::Restarted,
        None => return Err(ApiError::not_found(Code::NotFound, format!("no job for {inst}"))),
    };
    Ok(Json(InstrumentReply { result, instrument: inst }))
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
    query: Result<Query<DepthQuery>, QueryRejection>,
) -> Result<Json<RestDepthResponse>, ApiError> {
    let app = &state.app;
    let bad = |e: ApiError| state.bad_request(e);
    let Query(q) = query.map_err(|e| bad(ApiError::bad(Code::Malformed, e.body_text())))?;
    let text = q.symbol.ok_or_else(|| {
        bad(ApiError::bad(Code::Malformed, "symbol is required, e.g. symbol=sim:spot:BTC/USDT"))
    })?;
    let instrument: InstrumentId = text
        .parse()
        .map_err(|e| bad(ApiError::bad(Code::BadStream, format!("symbol {text:?}: {e}"))))?;
    if let Some(w) = q.with_id.as_deref() {
        if w != "true" && w != "false" {
            return Err(bad(ApiError::bad(
                Code::Malformed,
                format!("with_id must be true or false, got {w:?}"),
            )));
        }
    }
    let max = crate::books::MAX_REST_LEVELS as i64;
    let limit = int_param("limit", q.limit.as_deref()).map_err(bad)?.unwrap_or(DEFAULT_DEPTH_LIMIT);
    if !(1..=max).contains(&limit) {
        return Err(bad(ApiError::bad(
            Code::Malformed,
            format!("limit must be between 1 and {max}, got {limit}"),
        )));
    }
    // A book whose job has just started (the seed's client subscribes, then asks at once) is
    // waited for, up to BOOK_START_WAIT, instead of answered "unknown".
    let deadline = tokio::time::Instant::now() + BOOK_START_WAIT;
    if let Some(remote) = app.l3().remote().filter(|r| r.serves(&instrument)) {
        // The tick-by-tick host's book, with the ids of the deltas it publishes.
        let mut found = remote.depth(&instrument, limit as usize).await?;
        while found.as_ref().is_some_and(|(d, _)| d.id == 0)
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
            found = remote.depth(&instrument, limit as usize).await?;
        }
        let (data, health) = found.ok_or_else(|| {
            bad(ApiError::not_found(
                Code::UnknownBook,
                format!("no tick-by-tick book {instrument} (see GET /api/v1/ops/shards)"),
            ))
        })?;
        return Ok(Json(RestDepthResponse { code: 0, data, health }));
    }
    let mut found = app.books().rest_depth(&instrument, limit as usize);
    while found.as_ref().is_none_or(|(d, _)| d.id == 0)
        && (app.books().contains(&instrument) || app.depth().health(&instrument).is_some())
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
        found = app.books().rest_depth(&instrument, limit as usize);
    }
    let Some((data, health)) = found else {
        return Err(bad(ApiError::not_found(
            Code::UnknownBook,
            format!("no order book for {instrument}: subscribe to depth_update@{instrument} first (that starts its depth job)"),
        )));
    };
    Ok(Json(RestDepthResponse { code: 0, data, health }))
}

/// This process's books, and a remote tick-by-tick host's (when it answers).
async fn ops_books(State(state): State<AppState>) -> Json<BooksReport> {
    let mut books = state.app.books().list();
    if let Some(remote) = state.app.l3().remote() {
        match remote.books().await {
            Ok(theirs) => books.extend(theirs),
            Err(e) => tracing::debug!("tick-by-tick host's books: {e}"),
        }
    }
    Json(BooksReport { books })
}

async fn ops_shards(State(state): State<AppState>) -> Result<Json<ShardsReport>, ApiError> {
    Ok(Json(state.app.l3().shards().await?))
}

async fn admin_migrate(
    State(state): State<AppState>,
    raw: String,
) -> Result<Json<MigrateReply>, ApiError> {
    let b: MigrateRequest = admin(&state, &raw)?;
    Ok(Json(state.app.l3().migrate(b).await?))
}

async fn admin_auto_balance(
    State(state): State<AppState>,
    raw: String,
) -> Result<Json<AutoBalanceReply>, ApiError> {
    let b: AutoBalanceRequest = admin(&state, &raw)?;
    Ok(Json(state.app.l3().auto_balance(b).await?))
}

async fn admin_hotspot(
    State(state): State<AppState>,
    raw: String,
) -> Result<Json<HotspotReply>, ApiError> {
    let b: HotspotRequest = admin(&state, &raw)?;
    Ok(Json(state.app.l3().hotspot(b).await?))
}
