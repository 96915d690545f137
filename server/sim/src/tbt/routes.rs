//! HTTP and WebSocket routes of the tick-by-tick feed, mounted on the simulator's server.
//!
//! | path | what |
//! |------|------|
//! | `GET /tbt/ws[?symbols=600000,000001]` | text frame `{"symbols":[{idx,symbol,venue,channel}]}`, then binary frames ([`tbt::wire`]) |
//! | `GET /tbt/snapshot?symbol=X` | [`tbt::TbtSnapshot`]: resting orders and the channel's last seq |
//! | `GET /tbt/book?symbol=X[&levels=N]` | [`tbt::TrueBook`]: the true L2 book and its seq (oracle) |
//! | `GET /tbt/replay?symbol=X&from=A[&to=B]` | the kept events in `[A, B]` as one binary frame (at most [`MAX_REPLAY`]; ask again from the next seq) |
//! | `POST /tbt/control` | a [`tbt::Control`]: hot spot, pause, wire drop |
//! | `GET /tbt/status` | [`tbt::TbtStatus`] |
//!
//! Errors are `{"code":-1,"msg":".."}` with 400 (bad request), 404 (unknown symbol) or 410 (replay
//! range no longer kept).

use std::sync::atomic::Ordering;

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::{TbtError, TbtHandle, TbtSubscription};
use tbt::{wire, Control, Hello};

/// Most events one `/tbt/replay` answer carries.
pub const MAX_REPLAY: usize = 100_000;
/// Close code of a client dropped for falling behind (as the service's own sessions use).
pub const CLOSE_LAGGING: u16 = 4000;

#[derive(Clone)]
struct Ctx {
    tbt: TbtHandle,
    stop: CancellationToken,
}

/// The `/tbt/*` routes; sessions close with 1001 when `stop` is cancelled.
pub fn router(tbt: TbtHandle, stop: CancellationToken) -> Router {
    Router::new()
        .route("/tbt/ws", get(ws))
        .route("/tbt/snapshot", get(snapshot))
        .route("/tbt/book", get(book))
        .route("/tbt/replay", get(replay))
        .route("/tbt/control", post(control))
        .route("/tbt/status", get(status))
        .with_state(Ctx { tbt, stop })
}

fn fail(status: StatusCode, msg: impl std::fmt::Display) -> Response {
    (status, Json(serde_json::json!({ "code": -1, "msg": msg.to_string() }))).into_response()
}

fn tbt_fail(e: TbtError) -> Response {
    let status = match e {
        TbtError::UnknownSymbol(_) => StatusCode::NOT_FOUND,
        TbtError::Gone { .. } => StatusCode::GONE,
        TbtError::BadRange { .. } => StatusCode::BAD_REQUEST,
    };
    fail(status, e)
}

#[derive(Deserialize)]
struct WsQuery {
    symbols: Option<String>,
}

async fn ws(
    State(ctx): State<Ctx>,
    q: Result<Query<WsQuery>, axum::extract::rejection::QueryRejection>,
    up: WebSocketUpgrade,
) -> Response {
    let Ok(Query(q)) = q else { return fail(StatusCode::BAD_REQUEST, "bad query") };
    let names: Option<Vec<String>> = q
        .symbols
        .map(|s| s.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect());
    let sub = match ctx.tbt.subscribe(names.as_deref()) {
        Ok(s) => s,
        Err(e) => return tbt_fail(e),
    };
    let timeout = ctx.tbt.config().send_timeout;
    up.read_buffer_size(crate::ws::READ_BUFFER_BYTES)
        .on_upgrade(move |socket| session(socket, sub, ctx.stop, timeout))
}

async fn session(
    mut socket: WebSocket,
    mut sub: TbtSubscription,
    stop: CancellationToken,
    timeout: std::time::Duration,
) {
    let hello = match serde_json::to_string(&Hello { symbols: sub.symbols.clone() }) {
        Ok(h) => h,
        Err(_) => return,
    };
    if socket.send(Message::Text(hello.into())).await.is_err() {
        return;
    }
    let close = |code: u16, reason: &'static str| {
        Message::Close(Some(CloseFrame { code, reason: reason.into() }))
    };
    loop {
        tokio::select! {
            frame = sub.rx.recv() => {
                if sub.lagged.load(Ordering::Relaxed) {
                    let _ = socket.send(close(CLOSE_LAGGING, "lagging: fell behind the tick-by-tick feed; reconnect and resync from /tbt/snapshot")).await;
                    return;
                }
                let Some(frame) = frame else {
                    let _ = socket.send(close(1001, "feed stopped")).await;
                    return;
                };
                match tokio::time::timeout(timeout, socket.send(Message::Binary(frame))).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => return,
                    Err(_) => {
                        tracing::info!("tick-by-tick client dropped: send slower than {timeout:?}");
                        return;
                    }
                }
            }
            incoming = socket.recv() => match incoming {
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                Some(Ok(_)) => {} // pings are answered by the WebSocket layer; text is ignored
            },
            () = stop.cancelled() => {
                let _ = socket.send(close(1001, "simulator shutting down")).await;
                return;
            }
        }
    }
}

#[derive(Deserialize)]
struct SymbolQuery {
    symbol: String,
    levels: Option<usize>,
}

async fn snapshot(
    State(ctx): State<Ctx>,
    q: Result<Query<SymbolQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(q)) = q else { return fail(StatusCode::BAD_REQUEST, "symbol is required") };
    match ctx.tbt.snapshot(&q.symbol) {
        Ok(s) => Json(s).into_response(),
        Err(e) => tbt_fail(e),
    }
}

async fn book(
    State(ctx): State<Ctx>,
    q: Result<Query<SymbolQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(q)) = q else {
        return fail(StatusCode::BAD_REQUEST, "symbol is required, levels a number");
    };
    match ctx.tbt.book(&q.symbol, q.levels.unwrap_or(usize::MAX)) {
        Ok(b) => Json(b).into_response(),
        Err(e) => tbt_fail(e),
    }
}

#[derive(Deserialize)]
struct ReplayQuery {
    symbol: String,
    from: u64,
    to: Option<u64>,
}

async fn replay(
    State(ctx): State<Ctx>,
    q: Result<Query<ReplayQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(q)) = q else {
        return fail(StatusCode::BAD_REQUEST, "symbol and from are required, from/to are numbers");
    };
    match ctx.tbt.replay(&q.symbol, q.from, q.to.unwrap_or(u64::MAX), MAX_REPLAY) {
        Ok(ev) => (
            [(header::CONTENT_TYPE, "application/octet-stream")],
            wire::encode(&ev, tbt::wall_clock_us()),
        )
            .into_response(),
        Err(e) => tbt_fail(e),
    }
}

async fn control(State(ctx): State<Ctx>, body: axum::body::Bytes) -> Response {
    let cmd: Control = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => return fail(StatusCode::BAD_REQUEST, format!("bad control command: {e}")),
    };
    let r = match &cmd {
        Control::Hotspot { symbol, hot } => ctx.tbt.set_hot(symbol, *hot),
        Control::Pause(p) => {
            ctx.tbt.pause(*p);
            Ok(())
        }
        Control::Drop { symbol, count } => ctx.tbt.drop_events(symbol, *count),
    };
    match r {
        Ok(()) => Json(serde_json::json!({ "ok": true, "applied": cmd })).into_response(),
        Err(e) => tbt_fail(e),
    }
}

async fn status(State(ctx): State<Ctx>) -> Response {
    Json(ctx.tbt.status()).into_response()
}
