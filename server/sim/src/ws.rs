//! WebSocket sessions in Binance's stream protocol.
//!
//! - Every URL form Binance's stream endpoints accept: `/ws/<stream>[/<stream>...]` sends raw
//!   events; `/stream?streams=a/b/c` wraps every event as `{"stream":"a","data":{..}}`; `/ws`,
//!   `/ws/` and `/stream` alone start with no stream. A path segment that is not a stream this
//!   venue offers (a listen key, a client's connection id such as `/ws/0`) is accepted and
//!   carries nothing, as on Binance; the client subscribes later. Query values are
//!   percent-decoded; `timeUnit=MILLISECOND` is accepted, `MICROSECOND` refused (the simulator's
//!   times are milliseconds). The same under `/fapi` speaks the USD-M futures flavour, also
//!   under futures' routed paths `/fapi/public/...` and `/fapi/market/...`.
//! - Requests
//!   `{"method":"SUBSCRIBE"|"UNSUBSCRIBE"|"LIST_SUBSCRIPTIONS"|"SET_PROPERTY"|"GET_PROPERTY","params":[..],"id":N}`
//!   are answered like Binance: `{"result":null,"id":N}`, `{"result":["btcusdt@trade"],"id":N}`,
//!   or `{"error":{"code":2,"msg":"Invalid request: .."},"id":N}` (`code` 3 for invalid JSON).
//!   Streams of symbols the exchange does not list are accepted and stay silent, like Binance.
//! - The server pings every `ping_interval` (Binance: 20 s) and closes a connection whose last
//!   ping is unanswered for `pong_timeout`; client pings are answered with pongs.
//! - A connection older than the maximum age (Binance: 24 h; a fault can shorten it) gets a
//!   close frame. A connection dropped by the hub (slow client, `drop` fault) is closed without
//!   one.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::Uri;
use axum::response::{IntoResponse, Response};
use tokio::sync::Notify;
use tokio::time::{sleep_until, Instant};

use binance::wire::{BinanceError, StreamName, WsMethod, WsReply, WsRequest};

use crate::faults::Count;
use crate::hub::Flavour;
use crate::market::supported;
use crate::rest::Fail;
use crate::state::Srv;

/// Bytes a WebSocket connection to the simulator reads per syscall: its clients send little
/// (requests, pongs), so not tungstenite's 128 KiB allocated and zero-filled per connection.
pub(crate) const READ_BUFFER_BYTES: usize = 4096;
/// Payload of the server's pings.
const PING_PAYLOAD: &[u8] = b"millrace-sim";

/// Validates stream names for `flavour`, canonicalising the symbol to lower case.
fn streams(flavour: Flavour, names: &[&str]) -> Result<Vec<String>, String> {
    names
        .iter()
        .map(|n| match n.parse::<StreamName>() {
            Ok(s) if supported(flavour, &s.kind) => Ok(s.to_string()),
            Ok(_) => Err(format!("stream {n:?} has a speed this venue does not offer")),
            Err(e) => Err(e.to_string()),
        })
        .collect()
}

/// The streams named in a URL: every name that is a stream this venue offers, canonicalised.
/// Binance accepts any path segment after `/ws/` (a listen key, a client's own connection id
/// such as `/ws/0`, a stream of a symbol it does not list) and the connection then carries only
/// what it names or later subscribes to; so a name that is not a stream is accepted and silent.
fn url_streams(flavour: Flavour, names: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for n in names {
        if let Ok(s) = streams(flavour, &[n]) {
            for s in s {
                if !out.contains(&s) {
                    out.push(s);
                }
            }
        }
    }
    out
}

fn url_error(msg: String) -> Response {
    Fail { status: axum::http::StatusCode::BAD_REQUEST, code: -1121, msg, retry_after: None }
        .into_response()
}

/// The flavour a stream path speaks: `/fapi/...` (and its routed `/fapi/public`, `/fapi/market`)
/// is USD-M futures, the rest spot.
fn flavour_of(uri: &Uri) -> Flavour {
    if uri.path().starts_with("/fapi") {
        Flavour::Futures
    } else {
        Flavour::Spot
    }
}

/// The query parameters of a stream URL, percent-decoded; `streams` is the combined list.
/// `timeUnit=MILLISECOND` (any case) is Binance's default and accepted; microseconds are not
/// produced by the simulator and are refused rather than sent as milliseconds.
fn parse_query(uri: &Uri) -> Result<Option<String>, String> {
    let pairs: Vec<(String, String)> = match uri.query() {
        None => Vec::new(),
        Some(q) => match axum::extract::Query::<Vec<(String, String)>>::try_from_uri(uri) {
            Ok(axum::extract::Query(v)) => v,
            Err(_) => return Err(format!("malformed query string {q:?}")),
        },
    };
    let mut list = None;
    for (k, v) in pairs {
        match k.as_str() {
            "streams" => list = Some(v),
            "timeUnit" if v.eq_ignore_ascii_case("millisecond") => {}
            "timeUnit" => {
                return Err(format!(
                    "timeUnit={v} is not supported by the simulator (its times are milliseconds)"
                ))
            }
            _ => {} // unknown parameters are ignored, as Binance does
        }
    }
    Ok(list)
}

/// `GET /ws` and `/fapi/ws` (also `/ws/`, and futures' routed `/fapi/public/ws`,
/// `/fapi/market/ws`): no stream until SUBSCRIBE.
pub(crate) async fn ws_bare(
    State(srv): State<Arc<Srv>>,
    uri: Uri,
    up: WebSocketUpgrade,
) -> Response {
    if let Err(e) = parse_query(&uri) {
        return url_error(e);
    }
    upgrade(srv, up, flavour_of(&uri), false, Vec::new())
}

/// `GET /ws/<stream>[/<stream>...]` (also `/ws/<listenKey or any id>`): raw events of the named
/// streams.
pub(crate) async fn ws_raw(
    State(srv): State<Arc<Srv>>,
    Path(path): Path<String>,
    uri: Uri,
    up: WebSocketUpgrade,
) -> Response {
    if let Err(e) = parse_query(&uri) {
        return url_error(e);
    }
    let flavour = flavour_of(&uri);
    let names: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    if names.len() > srv.config.max_streams_per_connection {
        return url_error(format!(
            "too many streams: at most {}",
            srv.config.max_streams_per_connection
        ));
    }
    upgrade(srv, up, flavour, false, url_streams(flavour, &names))
}

/// `GET /stream?streams=a/b/c` (and `/stream` alone, streams by SUBSCRIBE later): every event
/// wrapped as `{"stream":..,"data":..}`.
pub(crate) async fn ws_combined(
    State(srv): State<Arc<Srv>>,
    uri: Uri,
    up: WebSocketUpgrade,
) -> Response {
    let list = match parse_query(&uri) {
        Ok(l) => l.unwrap_or_default(),
        Err(e) => return url_error(e),
    };
    let flavour = flavour_of(&uri);
    let names: Vec<&str> = list.split('/').filter(|s| !s.is_empty()).collect();
    if names.len() > srv.config.max_streams_per_connection {
        return url_error(format!(
            "too many streams: at most {}",
            srv.config.max_streams_per_connection
        ));
    }
    upgrade(srv, up, flavour, true, url_streams(flavour, &names))
}

fn upgrade(
    srv: Arc<Srv>,
    up: WebSocketUpgrade,
    flavour: Flavour,
    combined: bool,
    initial: Vec<String>,
) -> Response {
    if initial.len() > srv.config.max_streams_per_connection {
        return url_error(format!(
            "too many streams: at most {}",
            srv.config.max_streams_per_connection
        ));
    }
    up.read_buffer_size(READ_BUFFER_BYTES)
        .on_upgrade(move |socket| session(socket, srv, flavour, combined, initial))
}

/// Sends `msg` unless the connection is killed first; false if it could not be sent.
async fn send(socket: &mut WebSocket, kill: &Notify, msg: Message) -> bool {
    tokio::select! {
        r = socket.send(msg) => r.is_ok(),
        _ = kill.notified() => false,
    }
}

async fn session(
    mut socket: WebSocket,
    srv: Arc<Srv>,
    flavour: Flavour,
    combined: bool,
    initial: Vec<String>,
) {
    let mut reg = srv.hub.register(flavour, combined);
    let id = reg.id;
    srv.hub.subscribe(id, &initial);
    let opened = Instant::now();
    let stop = srv.stop.clone();
    let mut max_age = srv.faults.max_age();
    let ping_every = srv.config.ping_interval.max(Duration::from_millis(10));
    let mut ping = tokio::time::interval_at(opened + ping_every, ping_every);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut unanswered_since: Option<Instant> = None;
    let far = opened + Duration::from_secs(86_400 * 365 * 30);
    let kill = reg.kill.clone();
    loop {
        let deadline = (*max_age.borrow_and_update()).map_or(far, |a| opened + a);
        tokio::select! {
            biased;
            _ = kill.notified() => break,
            () = stop.cancelled() => {
                let frame = CloseFrame { code: 1001, reason: Utf8Bytes::from_static("server shutting down") };
                let _ = tokio::time::timeout(Duration::from_secs(1), socket.send(Message::Close(Some(frame)))).await;
                break;
            }
            _ = sleep_until(deadline) => {
                srv.faults.count(Count::AgedOut, 1);
                let frame = CloseFrame { code: 1000, reason: Utf8Bytes::from_static("maximum connection age") };
                let _ = tokio::time::timeout(Duration::from_secs(1), socket.send(Message::Close(Some(frame)))).await;
                break;
            }
            r = max_age.changed() => {
                if r.is_err() {
                    break;
                }
            }
            _ = ping.tick() => {
                if unanswered_since.is_some_and(|t| t.elapsed() >= srv.config.pong_timeout) {
                    srv.faults.count(Count::PingTimeout, 1);
                    tracing::info!(conn = id, "sim: closing a WebSocket that does not answer pings");
                    break;
                }
                unanswered_since.get_or_insert_with(Instant::now);
                if !send(&mut socket, &kill, Message::Ping(PING_PAYLOAD.into())).await {
                    break;
                }
            }
            frame = reg.rx.recv() => {
                let Some(text) = frame else { break };
                if !send(&mut socket, &kill, Message::Text(text)).await {
                    break;
                }
            }
            msg = socket.recv() => {
                match msg {
                    Some(Ok(Message::Text(t))) => {
                        let Some(reply) = handle_request(&srv, id, flavour, t.as_str()) else { break };
                        let text = serde_json::to_string(&reply).unwrap_or_default();
                        if !send(&mut socket, &kill, Message::Text(text.into())).await {
                            break;
                        }
                    }
                    Some(Ok(Message::Pong(_))) => unanswered_since = None,
                    Some(Ok(Message::Ping(_) | Message::Binary(_))) => {}
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                }
            }
        }
    }
    srv.hub.unregister(id);
}

/// Answers one request; `None` when the connection is gone from the hub.
fn handle_request(srv: &Srv, id: u64, flavour: Flavour, text: &str) -> Option<WsReply> {
    let err = |rid: Option<u64>, code: i64, msg: String| WsReply {
        id: rid,
        outcome: Err(BinanceError { code, msg }),
    };
    let value: serde_json::Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return Some(err(None, 3, format!("Invalid JSON: {e}"))),
    };
    let rid = value.get("id").and_then(|v| v.as_u64());
    let req: WsRequest = match serde_json::from_value(value) {
        Ok(r) => r,
        Err(e) => return Some(err(rid, 2, format!("Invalid request: {e}"))),
    };
    let names: Vec<&str> = req.streams().collect();
    let ok = |v: serde_json::Value| Some(WsReply { id: Some(req.id), outcome: Ok(v) });
    match req.method {
        WsMethod::Subscribe | WsMethod::Unsubscribe => {
            if names.len() != req.params.len() {
                return Some(err(
                    Some(req.id),
                    2,
                    "Invalid request: stream names must be strings".into(),
                ));
            }
            let valid = match streams(flavour, &names) {
                Ok(v) => v,
                Err(e) => return Some(err(Some(req.id), 2, format!("Invalid request: {e}"))),
            };
            if req.method == WsMethod::Subscribe {
                let now = srv.hub.list(id).len();
                let fresh = valid.iter().filter(|v| !srv.hub.list(id).contains(v)).count();
                if now + fresh > srv.config.max_streams_per_connection {
                    return Some(err(
                        Some(req.id),
                        2,
                        "Invalid request: too many streams on this connection".into(),
                    ));
                }
                srv.hub.subscribe(id, &valid)?;
            } else {
                srv.hub.unsubscribe(id, &valid);
            }
            ok(serde_json::Value::Null)
        }
        WsMethod::ListSubscriptions => ok(serde_json::json!(srv.hub.list(id))),
        WsMethod::SetProperty => {
            match (req.params.first().and_then(|p| p.as_str()), req.params.get(1)) {
                (Some("combined"), Some(serde_json::Value::Bool(b))) => {
                    srv.hub.set_combined(id, Some(*b));
                    ok(serde_json::Value::Null)
                }
                (Some("combined"), _) => {
                    Some(err(Some(req.id), 1, "Invalid value type: expected Boolean".into()))
                }
                _ => Some(err(Some(req.id), 0, "Unknown property".into())),
            }
        }
        WsMethod::GetProperty => match req.params.first().and_then(|p| p.as_str()) {
            Some("combined") => ok(serde_json::Value::Bool(srv.hub.set_combined(id, None))),
            _ => Some(err(Some(req.id), 0, "Unknown property".into())),
        },
    }
}
