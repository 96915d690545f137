//! The Binance REST and stream clients over real sockets. Each test starts a small server on
//! port 0 (tokio-tungstenite for streams, axum for REST) that sends genuine Binance bytes — the
//! frames and REST bodies captured in `testdata/binance-ws/cryptofeed`, the kline rows of
//! Binance's archives in `testdata/klines`, and Binance's own rate-limit and error
//! answers — plus the failures a real connection meets: a damaged frame, server pings, silence,
//! a close frame, a dropped socket, 429/418 with `Retry-After`, a slow answer.

// tungstenite's handshake callback returns `Result<Response, ErrorResponse>`; its size is not ours.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use binance::parse_frame;
use binance::rest::{RestClient, RestConfig, RestError, DEFAULT_BAN_WAIT};
use binance::stream::{connect, connect_with, StreamConfig, StreamError};
use binance::wire::{StreamEvent, WsMethod, WsReply, WsRequest};
use binance::Product;
use futures_util::{SinkExt, StreamExt};
use shared::candle::Timeframe;
use shared::Price;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;

fn capture(name: &str) -> String {
    std::fs::read_to_string(replay::input::testdata_dir().join("binance-ws/cryptofeed").join(name))
        .unwrap()
}

/// The stream names of a cryptofeed `.ws` capture (its first line's URL) and its frames, verbatim.
fn ws_capture(name: &str) -> (Vec<String>, Vec<String>) {
    let text = capture(name);
    let mut lines = text.lines();
    let url = lines.next().unwrap().split(' ').next().unwrap();
    let streams = url.split_once("streams=").unwrap().1.split('/').map(str::to_string).collect();
    let frames =
        lines.filter_map(|l| l.split_once(": ")).map(|(_, json)| json.to_string()).collect();
    (streams, frames)
}

// ---------------------------------------------------------------------------------------------
// Stream
// ---------------------------------------------------------------------------------------------

/// Accepts one WebSocket connection on a fresh port; returns the `ws://` base and the socket
/// with the request path, once a client connects.
async fn ws_server(
) -> (String, oneshot::Receiver<(String, tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>)>)
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut path = String::new();
        let ws = tokio_tungstenite::accept_hdr_async(
            tcp,
            |req: &tokio_tungstenite::tungstenite::handshake::server::Request,
             resp: tokio_tungstenite::tungstenite::handshake::server::Response| {
                path = req.uri().to_string();
                Ok(resp)
            },
        )
        .await
        .unwrap();
        let _ = tx.send((path, ws));
    });
    (format!("ws://{addr}"), rx)
}

#[tokio::test]
async fn replays_captured_frames_skips_a_damaged_one_answers_pings_and_ends_on_close() {
    let (streams, frames) = ws_capture("BINANCE.ws.1.0");
    let sent: Vec<String> = frames[..60].to_vec();
    let damaged = frames[60][..frames[60].len() / 2].to_string();
    let after = frames[61].clone();
    let (base, accepted) = ws_server().await;
    let (pong_tx, pong_rx) = oneshot::channel();
    let server = {
        let (sent, damaged, after) = (sent.clone(), damaged.clone(), after.clone());
        tokio::spawn(async move {
            let (path, mut ws) = accepted.await.unwrap();
            for f in &sent {
                ws.send(Message::text(f.as_str())).await.unwrap();
            }
            ws.send(Message::text(damaged)).await.unwrap();
            ws.send(Message::text(after)).await.unwrap();
            ws.send(Message::Ping(b"binance-ping".as_slice().into())).await.unwrap();
            let pong = loop {
                match ws.next().await.unwrap().unwrap() {
                    Message::Pong(p) => break p,
                    _ => continue,
                }
            };
            let _ = pong_tx.send(pong.to_vec());
            ws.send(Message::Close(Some(CloseFrame {
                code: CloseCode::Away,
                reason: "24h".into(),
            })))
            .await
            .unwrap();
            path
        })
    };

    let mut conn = connect(&base, &streams).await.unwrap();
    let mut events = Vec::new();
    let mut malformed = Vec::new();
    let mut fatal = None;
    while let Some(r) = conn.next().await {
        match r {
            Ok(ev) => events.push(ev),
            Err(e) if !e.is_fatal() => malformed.push(e),
            Err(e) => {
                assert!(fatal.is_none(), "one fatal error only");
                fatal = Some(e);
            }
        }
    }
    assert!(conn.next().await.is_none(), "finished connections stay finished");
    assert!(conn.is_finished());

    let path = server.await.unwrap();
    assert_eq!(path, format!("/stream?streams={}", streams.join("/")));
    let expected: Vec<StreamEvent> =
        sent.iter().chain([&after]).map(|f| parse_frame(f).unwrap()).collect();
    assert_eq!(events, expected);
    assert_eq!(malformed.len(), 1);
    assert!(
        matches!(&malformed[0], StreamError::Malformed { frame, .. } if damaged.starts_with(frame.as_str()))
    );
    assert_eq!(
        pong_rx.await.unwrap(),
        b"binance-ping",
        "the server's ping was answered with its payload"
    );
    assert_eq!(fatal, Some(StreamError::Closed { code: Some(1001), reason: "24h".into() }));
}

/// The socket's read buffer is `read_buffer_bytes` (16 KiB by default, not tungstenite's
/// 128 KiB, which every new connection allocated whole), and frames longer than it still arrive
/// whole: with the smallest buffer, 1 KiB, every captured futures frame is read, the seven over
/// 1 KiB included.
#[tokio::test]
async fn the_read_buffer_is_small_and_longer_frames_arrive_whole() {
    let (base, accepted) = ws_server().await;
    let server = tokio::spawn(async move {
        let _ws = accepted.await.unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
    });
    let conn = connect(&base, &["btcusdt@kline_1m"]).await.unwrap();
    assert_eq!(conn.read_buffer_size(), binance::stream::DEFAULT_READ_BUFFER_BYTES);
    assert_eq!(binance::stream::DEFAULT_READ_BUFFER_BYTES, 16 * 1024);
    server.abort();

    let (streams, frames) = ws_capture("BINANCE_FUTURES.ws.1.0");
    let frames: Vec<String> = frames.into_iter().filter(|f| parse_frame(f).is_ok()).collect();
    assert!(frames.iter().filter(|f| f.len() > 1024).count() >= 7, "frames longer than the buffer");
    let (base, accepted) = ws_server().await;
    let server = {
        let frames = frames.clone();
        tokio::spawn(async move {
            let (_, mut ws) = accepted.await.unwrap();
            for f in &frames {
                ws.send(Message::text(f.as_str())).await.unwrap();
            }
            ws.close(None).await.unwrap();
        })
    };
    let config = StreamConfig { read_buffer_bytes: 1024, ..StreamConfig::default() };
    let mut conn = connect_with(&base, &streams, config).await.unwrap();
    assert_eq!(conn.read_buffer_size(), 1024);
    let mut events = Vec::new();
    while let Some(Ok(ev)) = conn.next().await {
        events.push(ev);
    }
    let expected: Vec<StreamEvent> = frames.iter().map(|f| parse_frame(f).unwrap()).collect();
    assert_eq!(events.len(), expected.len());
    assert_eq!(events, expected);
    server.await.unwrap();
}

#[tokio::test]
async fn an_idle_connection_pings_and_lives_on_pongs_then_a_silent_peer_is_a_stall() {
    let (streams, frames) = ws_capture("BINANCE_FUTURES.ws.1.0");
    let frame = frames[0].clone();
    let (base, accepted) = ws_server().await;
    let (pings_tx, pings_rx) = oneshot::channel();
    let server = tokio::spawn(async move {
        let (_, mut ws) = accepted.await.unwrap();
        // answer the client's pings (tungstenite does it while reading) for a second
        let mut pings = 0;
        let until = tokio::time::Instant::now() + Duration::from_millis(1000);
        while let Ok(Some(Ok(msg))) = tokio::time::timeout_at(until, ws.next()).await {
            pings += matches!(msg, Message::Ping(_)) as u32;
        }
        let _ = pings_tx.send(pings);
        ws.send(Message::text(frame)).await.unwrap();
        // then go silent without closing: no reads, so no pongs either
        tokio::time::sleep(Duration::from_secs(3)).await;
        drop(ws);
    });

    let config = StreamConfig {
        stall_timeout: Duration::from_millis(600),
        idle_ping_after: Duration::from_millis(100),
        ..StreamConfig::default()
    };
    let mut conn = connect_with(&base, &streams, config).await.unwrap();
    let started = std::time::Instant::now();
    let first = conn.next().await.unwrap();
    assert!(matches!(first, Ok(StreamEvent::BookTicker { .. })), "{first:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "survived a second of silence on pongs alone"
    );
    assert!(pings_rx.await.unwrap() >= 3, "pinged about every 100 ms while idle");
    let stalled = std::time::Instant::now();
    match conn.next().await {
        Some(Err(StreamError::Stalled { silent_for })) => {
            assert!(silent_for >= Duration::from_millis(600))
        }
        other => panic!("{other:?}"),
    }
    assert!(stalled.elapsed() < Duration::from_millis(3000));
    assert!(conn.next().await.is_none());
    server.abort();
}

#[tokio::test]
async fn subscribe_gets_binance_reply_then_the_stream() {
    let (_, frames) = ws_capture("BINANCE.ws.1.0");
    let depth = frames
        .iter()
        .find(|f| f.starts_with(r#"{"stream":"nknusdt@depth@100ms""#))
        .unwrap()
        .clone();
    let (base, accepted) = ws_server().await;
    let server = tokio::spawn(async move {
        let (path, mut ws) = accepted.await.unwrap();
        let Message::Text(t) = ws.next().await.unwrap().unwrap() else {
            panic!("expected a text request")
        };
        let req: WsRequest = serde_json::from_str(t.as_str()).unwrap();
        ws.send(Message::text(format!(r#"{{"result":null,"id":{}}}"#, req.id))).await.unwrap();
        ws.send(Message::text(depth)).await.unwrap();
        ws.send(Message::text(
            r#"{"error":{"code":2,"msg":"Invalid request: invalid stream"},"id":2}"#,
        ))
        .await
        .unwrap();
        // drop the socket without a close frame
        (path, req, t.to_string())
    });
    let mut conn = connect::<&str>(&base, &[]).await.unwrap();
    let id = conn.subscribe(&["nknusdt@depth@100ms"]).await.unwrap();
    assert_eq!(id, 1);
    assert_eq!(conn.next().await.unwrap().unwrap(), StreamEvent::Reply(WsReply::ok(1)));
    let Some(Ok(StreamEvent::DepthUpdate { stream, update })) = conn.next().await else { panic!() };
    assert_eq!(stream.as_deref(), Some("nknusdt@depth@100ms"));
    assert_eq!(update.symbol, "NKNUSDT");
    let Some(Ok(StreamEvent::Reply(r))) = conn.next().await else { panic!() };
    assert_eq!(r.outcome.unwrap_err().code, 2);
    let end = conn.next().await.unwrap().unwrap_err();
    assert!(end.is_fatal(), "{end:?}");
    assert!(conn.next().await.is_none());
    let (path, req, text) = server.await.unwrap();
    assert_eq!(path, "/stream");
    assert_eq!(req.method, WsMethod::Subscribe);
    assert_eq!(text, r#"{"method":"SUBSCRIBE","params":["nknusdt@depth@100ms"],"id":1}"#);
}

#[tokio::test]
async fn connect_failures_are_typed() {
    // nothing listens: connect error
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let e = connect(&format!("ws://{addr}"), &["btcusdt@trade"]).await.unwrap_err();
    assert!(matches!(e, StreamError::Connect { .. }), "{e:?}");
    // the upgrade is refused with HTTP 400
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let _ = tokio_tungstenite::accept_hdr_async(
            tcp,
            |_: &tokio_tungstenite::tungstenite::handshake::server::Request,
             _: tokio_tungstenite::tungstenite::handshake::server::Response| {
                let mut resp =
                    tokio_tungstenite::tungstenite::handshake::server::ErrorResponse::new(Some(
                        r#"{"code":-1100,"msg":"Illegal characters found in parameter 'streams'"}"#
                            .to_string(),
                    ));
                *resp.status_mut() = StatusCode::BAD_REQUEST;
                Err(resp)
            },
        )
        .await;
    });
    let e = connect(&format!("ws://{addr}"), &["btcusdt@nonsense"]).await.unwrap_err();
    match e {
        StreamError::Handshake { status: 400, body, .. } => {
            assert!(body.contains("-1100"), "{body}")
        }
        other => panic!("{other:?}"),
    }
    // a peer that accepts TCP but never answers the handshake: connect timeout
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hold = tokio::spawn(async move {
        let (_tcp, _) = listener.accept().await.unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
    });
    let config =
        StreamConfig { connect_timeout: Duration::from_millis(300), ..StreamConfig::default() };
    let e = connect_with(&format!("ws://{addr}"), &["btcusdt@trade"], config).await.unwrap_err();
    assert!(
        matches!(&e, StreamError::Connect { reason, .. } if reason.contains("timed out")),
        "{e:?}"
    );
    hold.abort();
}

#[tokio::test]
async fn age_and_planned_reconnect() {
    let (base, accepted) = ws_server().await;
    let server = tokio::spawn(async move {
        let (_, ws) = accepted.await.unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        drop(ws);
    });
    let config = StreamConfig {
        planned_reconnect_after: Duration::from_millis(200),
        ..StreamConfig::default()
    };
    let conn = connect_with(&base, &["btcusdt@kline_1m"], config).await.unwrap();
    assert!(!conn.is_reconnect_due());
    assert!(conn.age() < Duration::from_millis(200));
    tokio::time::sleep_until(conn.reconnect_at()).await;
    assert!(conn.is_reconnect_due());
    assert!(conn.age() >= Duration::from_millis(200));
    conn.close().await;
    server.abort();
}

// ---------------------------------------------------------------------------------------------
// REST
// ---------------------------------------------------------------------------------------------

/// What the REST test server answers on `/api/v3/time`.
const TIME_OK: u8 = 0;
const TIME_429: u8 = 1;
const TIME_418: u8 = 2;
const TIME_418_NO_HEADER: u8 = 3;
const TIME_SLOW: u8 = 4;

/// Binance's answer to a client over the weight limit.
const TOO_MANY: &str = r#"{"code":-1003,"msg":"Too many requests; current limit of IP(127.0.0.1) is 6000 requests per minute. Please use the websocket for live updates to avoid polling the API."}"#;
const BANNED: &str = r#"{"code":-1003,"msg":"Way too many requests; IP(127.0.0.1) banned until 1700000000000. Please use the websocket for live updates to avoid bans."}"#;
const INVALID_SYMBOL: &str = r#"{"code":-1121,"msg":"Invalid symbol."}"#;
/// The exchangeInfo example of Binance's API documentation, trimmed to one symbol.
const EXCHANGE_INFO: &str = r#"{"timezone":"UTC","serverTime":1565246363776,"rateLimits":[{"rateLimitType":"REQUEST_WEIGHT","interval":"MINUTE","intervalNum":1,"limit":6000},{"rateLimitType":"ORDERS","interval":"SECOND","intervalNum":10,"limit":100},{"rateLimitType":"RAW_REQUESTS","interval":"MINUTE","intervalNum":5,"limit":61000}],"exchangeFilters":[],"symbols":[{"symbol":"BTCUSDT","status":"TRADING","baseAsset":"BTC","baseAssetPrecision":8,"quoteAsset":"USDT","quotePrecision":8,"quoteAssetPrecision":8,"orderTypes":["LIMIT","LIMIT_MAKER","MARKET","STOP_LOSS_LIMIT","TAKE_PROFIT_LIMIT"],"icebergAllowed":true,"ocoAllowed":true,"isSpotTradingAllowed":true,"isMarginTradingAllowed":true,"filters":[{"filterType":"PRICE_FILTER","minPrice":"0.01000000","maxPrice":"1000000.00000000","tickSize":"0.01000000"},{"filterType":"LOT_SIZE","minQty":"0.00001000","maxQty":"9000.00000000","stepSize":"0.00001000"},{"filterType":"ICEBERG_PARTS","limit":10}],"permissions":["SPOT","MARGIN"]}]}"#;

struct App {
    /// `(path, symbol)` → captured REST depth body.
    depth: HashMap<(String, String), String>,
    /// The archive's 1m rows of 2020-01-01 as REST JSON rows, with their open times.
    klines: Vec<(i64, String)>,
    time_mode: AtomicU8,
    time_hits: AtomicU32,
}

fn json(status: StatusCode, body: impl Into<String>) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "application/json;charset=UTF-8"),
            (header::HeaderName::from_static("x-mbx-used-weight-1m"), "42"),
        ],
        body.into(),
    )
        .into_response()
}

async fn depth_handler(
    State(app): State<Arc<App>>,
    uri: axum::http::Uri,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let path = uri.path().to_string();
    match q.get("symbol").and_then(|s| app.depth.get(&(path, s.clone()))) {
        Some(body) => json(StatusCode::OK, body.clone()),
        None => json(StatusCode::BAD_REQUEST, INVALID_SYMBOL),
    }
}

async fn klines_handler(
    State(app): State<Arc<App>>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if q.get("symbol").map(String::as_str) != Some("BTCUSDT") {
        return json(StatusCode::BAD_REQUEST, INVALID_SYMBOL);
    }
    assert_eq!(q.get("interval").map(String::as_str), Some("1m"));
    let start: i64 = q.get("startTime").map_or(i64::MIN, |s| s.parse().unwrap());
    let end: i64 = q.get("endTime").map_or(i64::MAX, |s| s.parse().unwrap());
    let limit: usize = q.get("limit").map_or(500, |s| s.parse().unwrap());
    let rows: Vec<&str> = app
        .klines
        .iter()
        .filter(|(t, _)| *t >= start && *t <= end)
        .take(limit)
        .map(|(_, r)| r.as_str())
        .collect();
    json(StatusCode::OK, format!("[{}]", rows.join(",")))
}

async fn time_handler(State(app): State<Arc<App>>) -> Response {
    app.time_hits.fetch_add(1, Ordering::SeqCst);
    let limited = |status, retry: Option<&'static str>, body: &str| {
        let mut r = json(status, body.to_string());
        if let Some(s) = retry {
            r.headers_mut().insert(header::RETRY_AFTER, s.parse().unwrap());
        }
        r
    };
    match app.time_mode.load(Ordering::SeqCst) {
        TIME_429 => limited(StatusCode::TOO_MANY_REQUESTS, Some("1"), TOO_MANY),
        TIME_418 => limited(StatusCode::IM_A_TEAPOT, Some("2"), BANNED),
        TIME_418_NO_HEADER => limited(StatusCode::IM_A_TEAPOT, None, BANNED),
        TIME_SLOW => {
            tokio::time::sleep(Duration::from_secs(2)).await;
            json(StatusCode::OK, r#"{"serverTime":1577836800000}"#)
        }
        _ => json(StatusCode::OK, r#"{"serverTime":1577836800000}"#),
    }
}

async fn rest_server() -> (SocketAddr, Arc<App>) {
    let mut depth = HashMap::new();
    for file in ["BINANCE.http.0.0", "BINANCE_FUTURES.http.0.0"] {
        for line in capture(file).lines().filter(|l| !l.is_empty()) {
            let (url, rest) = line.split_once(" -> ").unwrap();
            let (_, body) = rest.split_once(": ").unwrap();
            let path = url
                .split("://")
                .nth(1)
                .unwrap()
                .split_once('/')
                .unwrap()
                .1
                .split('?')
                .next()
                .unwrap();
            let symbol = url.split(['?', '&']).find_map(|kv| kv.strip_prefix("symbol=")).unwrap();
            depth.insert((format!("/{path}"), symbol.to_string()), body.to_string());
        }
    }
    let csv = std::fs::read_to_string(
        replay::input::testdata_dir()
            .join("klines/binance-spot-BTCUSDT-1m/BTCUSDT-1m-2020-01-01.csv"),
    )
    .unwrap();
    let klines = csv
        .lines()
        .map(|l| {
            let c: Vec<&str> = l.split(',').collect();
            let row = format!(
                r#"[{},"{}","{}","{}","{}","{}",{},"{}",{},"{}","{}","{}"]"#,
                c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], c[10], c[11]
            );
            (c[0].parse().unwrap(), row)
        })
        .collect();
    let app = Arc::new(App {
        depth,
        klines,
        time_mode: AtomicU8::new(TIME_OK),
        time_hits: AtomicU32::new(0),
    });
    let router = Router::new()
        .route("/api/v3/depth", get(depth_handler))
        .route("/fapi/v1/depth", get(depth_handler))
        .route("/api/v3/klines", get(klines_handler))
        .route("/api/v3/time", get(time_handler))
        .route("/api/v3/exchangeInfo", get(|| async { json(StatusCode::OK, EXCHANGE_INFO) }))
        .route(
            "/fapi/v1/exchangeInfo",
            get(|| async { json(StatusCode::OK, r#"{"symbols":[{"symbol":"X""#) }),
        )
        .with_state(app.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (addr, app)
}

fn client(addr: SocketAddr, product: Product) -> RestClient {
    RestClient::new(RestConfig::new(product, format!("http://{addr}/"))).unwrap()
}

#[tokio::test]
async fn rest_calls_decode_captured_bodies_and_track_weight() {
    let (addr, _) = rest_server().await;
    let spot = client(addr, Product::Spot);
    assert_eq!(spot.used_weight_1m(), None);
    let book = spot.depth("NKNUSDT", 1000).await.unwrap();
    assert_eq!(book.last_update_id, 499869752);
    assert_eq!(book.bids[0].price, Price::parse("0.3521").unwrap());
    assert_eq!(spot.used_weight_1m(), Some(42));

    let fut = client(addr, Product::Futures);
    let book = fut.depth("sushiusdt", 1000).await.unwrap();
    assert_eq!(book.last_update_id, 600859605926);
    assert_eq!(book.bids[0].price, Price::parse("7.611").unwrap());

    let rows =
        spot.klines("BTCUSDT", Timeframe::M1, Some(1577836800000 + 60_000), None, 3).await.unwrap();
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0].candle.open_time, 1577836860000);
    assert_eq!(rows[0].candle.open, Price::parse("7187.67").unwrap());
    assert_eq!(rows[0].close_time, 1577836919999);
    let all = spot.klines("BTCUSDT", Timeframe::M1, None, Some(1577923199999), 1000).await.unwrap();
    assert_eq!(all.len(), 1000);

    let info = spot.exchange_info().await.unwrap();
    let btc = info.symbol("BTCUSDT").unwrap();
    assert_eq!(btc.tick_size(), Some(Price::parse("0.01").unwrap()));
    assert_eq!(info.rate_limits[0].limit, 6000);
    assert_eq!(spot.server_time().await.unwrap(), 1577836800000);
}

#[tokio::test]
async fn rest_errors_are_typed() {
    let (addr, _) = rest_server().await;
    let spot = client(addr, Product::Spot);
    let e = spot.depth("NOPE", 100).await.unwrap_err();
    assert_eq!(e, RestError::Api { status: 400, code: Some(-1121), msg: "Invalid symbol.".into() });
    assert!(!e.is_retryable());
    // an endpoint the server does not have: 404 with an empty body
    let fut = client(addr, Product::Futures);
    assert!(matches!(
        fut.server_time().await.unwrap_err(),
        RestError::Api { status: 404, code: None, .. }
    ));
    // a truncated body is a decode error naming what is wrong
    match fut.exchange_info().await.unwrap_err() {
        RestError::Decode { url, error } => {
            assert!(url.ends_with("/fapi/v1/exchangeInfo"));
            assert!(matches!(error, binance::wire::WireError::Syntax { .. }), "{error:?}");
        }
        other => panic!("{other:?}"),
    }
    // bad symbols never leave the client
    assert!(matches!(spot.depth("BTC&limit=5000", 5).await, Err(RestError::InvalidArgument(_))));
    // nothing listening
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = client(listener.local_addr().unwrap(), Product::Spot);
    drop(listener);
    let e = dead.server_time().await.unwrap_err();
    assert!(matches!(e, RestError::Transport { timeout: false, .. }) && e.is_retryable(), "{e:?}");
}

#[tokio::test]
async fn rest_timeout() {
    let (addr, app) = rest_server().await;
    app.time_mode.store(TIME_SLOW, Ordering::SeqCst);
    let mut config = RestConfig::new(Product::Spot, format!("http://{addr}"));
    config.timeout = Duration::from_millis(200);
    let slow = RestClient::new(config).unwrap();
    let started = std::time::Instant::now();
    let e = slow.server_time().await.unwrap_err();
    assert!(matches!(e, RestError::Transport { timeout: true, .. }), "{e:?}");
    assert!(started.elapsed() < Duration::from_millis(1500));
}

#[tokio::test]
async fn rate_limits_back_off_client_side_without_sending() {
    let (addr, app) = rest_server().await;
    let spot = client(addr, Product::Spot);
    let hits = || app.time_hits.load(Ordering::SeqCst);

    // 429 with Retry-After: 1
    app.time_mode.store(TIME_429, Ordering::SeqCst);
    assert_eq!(
        spot.server_time().await,
        Err(RestError::RateLimited { status: 429, retry_after: Duration::from_secs(1) })
    );
    assert_eq!(hits(), 1);
    app.time_mode.store(TIME_OK, Ordering::SeqCst);
    // refused before the deadline, whatever the endpoint, and nothing is sent
    match spot.server_time().await {
        Err(RestError::RateLimited { status: 429, retry_after }) => {
            assert!(retry_after <= Duration::from_secs(1))
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(spot.depth("NKNUSDT", 1000).await, Err(RestError::RateLimited { .. })));
    assert_eq!(hits(), 1);
    assert!(spot.blocked_for().is_some());
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(spot.server_time().await, Ok(1577836800000));
    assert_eq!(hits(), 2);
    assert_eq!(spot.blocked_for(), None);

    // 418 with Retry-After: 2
    app.time_mode.store(TIME_418, Ordering::SeqCst);
    assert_eq!(
        spot.server_time().await,
        Err(RestError::RateLimited { status: 418, retry_after: Duration::from_secs(2) })
    );
    // 418 without Retry-After: the 60 s default, on a fresh client
    app.time_mode.store(TIME_418_NO_HEADER, Ordering::SeqCst);
    let other = client(addr, Product::Spot);
    assert_eq!(
        other.server_time().await,
        Err(RestError::RateLimited { status: 418, retry_after: DEFAULT_BAN_WAIT })
    );
    let before = hits();
    assert!(matches!(other.server_time().await, Err(RestError::RateLimited { status: 418, .. })));
    assert!(other.blocked_for().unwrap() > Duration::from_secs(55));
    assert_eq!(hits(), before, "refused client-side");
}
