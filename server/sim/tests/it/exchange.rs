//! The simulated exchange through its public interface: a running `Sim` on port 0, real HTTP
//! (reqwest) and WebSocket (tokio-tungstenite) clients, and millrace's own Binance connector.

use std::time::Duration;

use binance::rest::{RestClient, RestConfig};
use binance::wire::{self, DepthBody, ExchangeInfo, RestKline, StreamEvent};
use binance::Product;
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use shared::candle::{merge, Candle, Timeframe, MINUTE_MS};
use shared::sync::{BookSync, ContinuityRule, SyncConfig, SyncEvent};
use shared::{OrderBook, Price};
use sim::{Sim, SimConfig, SimHandle, StreamClass, StreamTarget};
use tokio::net::TcpStream;
use tokio::time::{timeout, Instant};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A fixed simulated start, 30 s into a minute (2025-06-15).
const START: i64 = 1_750_000_000_000 + 20_000;
const PATIENCE: Duration = Duration::from_secs(5);

fn config(speed: f64) -> SimConfig {
    SimConfig {
        seed: 7,
        speed,
        start_ms: Some(START),
        control_token: Some(crate::CONTROL_TOKEN.into()),
        ..SimConfig::default()
    }
}

/// `POST /sim/faults` as a controller sends it: the control token and a JSON body.
async fn post_faults(sim: &SimHandle, body: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}/sim/faults", sim.rest_base()))
        .bearer_auth(crate::CONTROL_TOKEN)
        .header("Content-Type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

/// Fast simulations cost CPU (debug builds, two shared cores): only the symbols a test needs.
fn config_with(speed: f64, symbols: &[&str]) -> SimConfig {
    SimConfig { symbols: SimConfig::symbols_named(symbols).unwrap(), ..config(speed) }
}

async fn start(config: SimConfig) -> SimHandle {
    Sim::start(config, "127.0.0.1:0".parse().unwrap()).await.unwrap()
}

fn live_first() -> i64 {
    START - START % MINUTE_MS
}

async fn connect(url: &str) -> Ws {
    timeout(PATIENCE, tokio_tungstenite::connect_async(url))
        .await
        .expect("connect in time")
        .expect("connect")
        .0
}

/// What a client sees next.
#[derive(Debug)]
enum Seen {
    Text(String),
    Ping,
    Pong(Vec<u8>),
    /// A close frame, with its code.
    Close(Option<u16>),
    /// The connection ended without a close frame (or errored).
    Ended,
    Timeout,
}

async fn next(ws: &mut Ws, wait: Duration) -> Seen {
    match timeout(wait, ws.next()).await {
        Err(_) => Seen::Timeout,
        Ok(None) | Ok(Some(Err(_))) => Seen::Ended,
        Ok(Some(Ok(m))) => match m {
            Message::Text(t) => Seen::Text(t.to_string()),
            Message::Ping(_) => Seen::Ping,
            Message::Pong(p) => Seen::Pong(p.to_vec()),
            Message::Close(f) => Seen::Close(f.map(|f| u16::from(f.code))),
            _ => Seen::Ended,
        },
    }
}

/// The next text frame (skipping pings and pongs); panics on anything else.
async fn text(ws: &mut Ws) -> String {
    loop {
        match next(ws, PATIENCE).await {
            Seen::Text(t) => return t,
            Seen::Ping | Seen::Pong(_) => {}
            other => panic!("expected a text frame, got {other:?}"),
        }
    }
}

async fn send_json(ws: &mut Ws, v: Value) {
    ws.send(Message::Text(v.to_string().into())).await.unwrap();
}

/// GET → (status, used-weight header, retry-after header, body).
async fn get(sim: &SimHandle, path: &str) -> (u16, Option<u64>, Option<String>, String) {
    let r = reqwest::get(format!("{}{path}", sim.rest_base())).await.unwrap();
    let status = r.status().as_u16();
    let h = |n: &str| r.headers().get(n).and_then(|v| v.to_str().ok()).map(str::to_string);
    let used = h("x-mbx-used-weight-1m").and_then(|v| v.parse().ok());
    let retry = h("retry-after");
    (status, used, retry, r.text().await.unwrap())
}

async fn get_json(sim: &SimHandle, path: &str) -> Value {
    let (status, _, _, body) = get(sim, path).await;
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

/// Asserts a Binance error response.
async fn expect_error(sim: &SimHandle, path: &str, status: u16, code: i64) {
    let (s, _, _, body) = get(sim, path).await;
    assert_eq!(s, status, "{path}: {body}");
    let e: wire::BinanceError =
        serde_json::from_str(&body).unwrap_or_else(|_| panic!("{path}: not an error body: {body}"));
    assert_eq!(e.code, code, "{path}: {body}");
}

fn rows(body: &str) -> Vec<RestKline> {
    wire::parse_body(body).unwrap()
}

/// Waits until the simulated clock reaches `t`.
async fn sim_reach(sim: &SimHandle, t: i64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while sim.now_ms() < t + 200 {
        assert!(Instant::now() < deadline, "simulated clock too slow");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // one more driver tick so the engine has run there too
    tokio::time::sleep(Duration::from_millis(120)).await;
}

fn same_candle(a: &Candle, b: &Candle) -> bool {
    Candle { minutes: 1, ..*a } == Candle { minutes: 1, ..*b }
}

// ---------------------------------------------------------------------------------------------
// REST
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn rest_endpoints_speak_binance() {
    let sim = start(config(1.0)).await;
    assert_eq!(get_json(&sim, "/api/v3/ping").await, serde_json::json!({}));
    // the driver runs the engine to the clock every tick (a lag of at most a tick or so here,
    // where a simulated ms is a real one)
    sim_reach(&sim, sim.now_ms() + 300).await;
    let lag = sim.engine_lag_ms("BTCUSDT").unwrap();
    assert!((0..1_000).contains(&lag), "{lag}");
    assert_eq!(sim.engine_lag_ms("NOPE"), None);
    let t: wire::ServerTime = serde_json::from_value(get_json(&sim, "/api/v3/time").await).unwrap();
    assert!((t.server_time - START).abs() < 5_000);
    let info: ExchangeInfo =
        serde_json::from_value(get_json(&sim, "/api/v3/exchangeInfo").await).unwrap();
    assert_eq!(info.symbols.len(), 8);
    let doge = info.symbol("DOGEUSDT").unwrap();
    assert_eq!((doge.base_asset.as_str(), doge.quote_asset.as_str()), ("DOGE", "USDT"));
    assert_eq!(doge.tick_size().unwrap().to_string(), "0.00001");
    assert_eq!(info.symbol("BTCUSDT").unwrap().step_size().unwrap().to_string(), "0.00001");
    assert!(info
        .rate_limits
        .iter()
        .any(|r| r.rate_limit_type == "REQUEST_WEIGHT" && r.limit == 6000));
    let one: ExchangeInfo =
        serde_json::from_value(get_json(&sim, "/api/v3/exchangeInfo?symbol=ETHUSDT").await)
            .unwrap();
    assert_eq!(one.symbols.len(), 1);

    // depth: limits, best first, not crossed, weight header
    let (s, used, _, body) = get(&sim, "/api/v3/depth?symbol=BTCUSDT&limit=5").await;
    assert_eq!(s, 200);
    assert!(used.unwrap() >= 5);
    let d: DepthBody = wire::parse_body(&body).unwrap();
    assert_eq!((d.bids.len(), d.asks.len()), (5, 5));
    assert!(d.bids[0].price > d.bids[1].price && d.asks[0].price < d.asks[1].price);
    assert!(d.bids[0].price < d.asks[0].price);
    let d: DepthBody =
        wire::parse_body(&get(&sim, "/api/v3/depth?symbol=DOGEUSDT&limit=5000").await.3).unwrap();
    assert!(d.bids.len() >= 100 && d.asks.len() >= 100, "a book of hundreds of levels");
    let (_, used2, _, _) = get(&sim, "/api/v3/depth?symbol=BTCUSDT&limit=5000").await;
    assert!(used2.unwrap() >= used.unwrap() + 250, "depth 5000 weighs 250");

    // errors, Binance-style
    expect_error(&sim, "/api/v3/klines?symbol=NOPEUSDT&interval=1m", 400, -1121).await;
    expect_error(&sim, "/api/v3/depth?symbol=NOPEUSDT", 400, -1121).await;
    expect_error(&sim, "/api/v3/klines?symbol=btcusdt&interval=1m", 400, -1100).await;
    expect_error(&sim, "/api/v3/klines?symbol=BTCUSDT&interval=7m", 400, -1120).await;
    expect_error(&sim, "/api/v3/klines?symbol=BTCUSDT", 400, -1102).await;
    expect_error(&sim, "/api/v3/klines?interval=1m", 400, -1102).await;
    expect_error(&sim, "/api/v3/klines?symbol=BTCUSDT&interval=1m&limit=1001", 400, -1130).await;
    expect_error(&sim, "/api/v3/klines?symbol=BTCUSDT&interval=1m&limit=abc", 400, -1100).await;
    expect_error(&sim, "/api/v3/klines?symbol=BTCUSDT&interval=1m&startTime=-5", 400, -1100).await;
    expect_error(
        &sim,
        "/api/v3/klines?symbol=BTCUSDT&interval=1m&startTime=10&endTime=5",
        400,
        -1023,
    )
    .await;
    expect_error(&sim, "/api/v3/klines?symbol=BTCUSDT&interval=1m&interval=5m", 400, -1101).await;
    expect_error(&sim, "/api/v3/depth?symbol=BTCUSDT&limit=0", 400, -1130).await;
    expect_error(&sim, "/api/v3/exchangeInfo?symbol=NOPE", 400, -1121).await;
    assert_eq!(get(&sim, "/api/v3/nothing").await.0, 404);

    // futures flavour: depth carries E and T
    let (s, _, _, body) = get(&sim, "/fapi/v1/depth?symbol=ETHUSDT&limit=10").await;
    assert_eq!(s, 200);
    let d: DepthBody = wire::parse_body(&body).unwrap();
    assert!(d.event_time.is_some() && d.transaction_time.is_some());
    assert_eq!(
        rows(&get(&sim, "/fapi/v1/klines?symbol=ETHUSDT&interval=1m&limit=1500").await.3).len(),
        1500
    );
    sim.shutdown();
    sim.stopped().await;
}

#[tokio::test]
async fn rest_klines_selection_history_and_live_join() {
    let sim = start(config_with(600.0, &["BTCUSDT", "ETHUSDT", "SOLUSDT", "BNBUSDT"])).await;
    let first = live_first();
    sim_reach(&sim, first + 6 * MINUTE_MS).await;
    // The driver starts a minute's kline at its first tick in that minute (every 50 ms real, 30 s
    // simulated at this speed): ask well inside a minute, not at its very start.
    while sim.now_ms() % MINUTE_MS < 40_000 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let now = sim.now_ms();
    let current = now - now % MINUTE_MS;

    // neither start nor end: the newest 500, the last one forming
    let k = rows(&get(&sim, "/api/v3/klines?symbol=BTCUSDT&interval=1m").await.3);
    assert_eq!(k.len(), 500);
    let last = k.last().unwrap();
    assert!(
        last.candle.open_time >= current,
        "includes the forming kline: last {} current {current} now {now} first {first}",
        last.candle.open_time
    );
    assert!(last.close_time > sim.now_ms() - 2 * MINUTE_MS);

    // across the history/live boundary: exactly the oracle, then the forming minute
    let from = first - 5 * MINUTE_MS;
    let k = rows(
        &get(
            &sim,
            &format!(
                "/api/v3/klines?symbol=BTCUSDT&interval=1m&startTime={from}&endTime={current}"
            ),
        )
        .await
        .3,
    );
    let oracle = sim.closed_klines("BTCUSDT", from, current);
    assert!(oracle.len() >= 10);
    for (row, truth) in k.iter().zip(&oracle) {
        assert!(same_candle(&row.candle, truth), "{row:?} != {truth:?}");
    }
    for w in k.windows(2) {
        assert_eq!(
            w[1].candle.open_time,
            w[0].candle.open_time + MINUTE_MS,
            "no holes, no duplicates"
        );
    }
    // the live engine starts where history ends: the first live minute opens right there
    let last_hist = &k[4].candle;
    assert_eq!(last_hist.open_time, first - MINUTE_MS);
    let reference = Price::from_units(90_000).raw();
    assert!(
        (last_hist.close.raw() - reference).abs() < reference / 4,
        "BTC near 90,000: {:?}",
        last_hist.close
    );
    let first_live = &k[5].candle;
    assert_eq!(first_live.open_time, first);
    let jump = (first_live.open.raw() - last_hist.close.raw()).abs();
    assert!(
        jump < last_hist.close.raw() / 1_000,
        "live opens near the last historical close: {jump}"
    );

    // startTime: oldest first from it; mid-minute starts at the next minute
    let k = rows(
        &get(
            &sim,
            &format!("/api/v3/klines?symbol=BTCUSDT&interval=1m&startTime={}&limit=3", from + 1),
        )
        .await
        .3,
    );
    assert_eq!(
        k.iter().map(|r| r.candle.open_time).collect::<Vec<_>>(),
        vec![from + MINUTE_MS, from + 2 * MINUTE_MS, from + 3 * MINUTE_MS]
    );
    // endTime only: the newest `limit` up to it
    let end = first - 100 * MINUTE_MS + 5;
    let k = rows(
        &get(&sim, &format!("/api/v3/klines?symbol=ETHUSDT&interval=1m&endTime={end}&limit=4"))
            .await
            .3,
    );
    assert_eq!(
        k.iter().map(|r| r.candle.open_time).collect::<Vec<_>>(),
        (0..4).rev().map(|i| end - 5 - i * MINUTE_MS).collect::<Vec<_>>()
    );
    // far back: days of history answer, and before the listing there is none
    let week = first - 7 * 86_400_000;
    let k = rows(
        &get(
            &sim,
            &format!("/api/v3/klines?symbol=SOLUSDT&interval=1h&startTime={week}&limit=1000"),
        )
        .await
        .3,
    );
    assert!(k.len() >= 7 * 24);
    assert!(rows(
        &get(&sim, "/api/v3/klines?symbol=SOLUSDT&interval=1d&startTime=0&endTime=1000000").await.3
    )
    .is_empty());
    let k =
        rows(&get(&sim, "/api/v3/klines?symbol=SOLUSDT&interval=1m&startTime=0&limit=1").await.3);
    assert_eq!(k[0].candle.open_time, 1_597_125_600_000, "history starts at the listing");

    // derived intervals are merges of the 1m rows
    for tf in [Timeframe::M5, Timeframe::M15, Timeframe::H1] {
        let b = tf.bucket_open(first - 3 * MINUTE_MS);
        let d = rows(
            &get(
                &sim,
                &format!("/api/v3/klines?symbol=BNBUSDT&interval={tf}&startTime={b}&limit=1"),
            )
            .await
            .3,
        );
        let ones = rows(
            &get(
                &sim,
                &format!(
                    "/api/v3/klines?symbol=BNBUSDT&interval=1m&startTime={b}&endTime={}&limit=1000",
                    (b + tf.duration_ms() - 1).min(current - 1)
                ),
            )
            .await
            .3,
        );
        let plain: Vec<Candle> = ones.iter().map(|r| r.candle).collect();
        let m = merge(tf, &plain).unwrap();
        if b + tf.duration_ms() <= current {
            assert!(
                same_candle(&Candle { minutes: 1, ..d[0].candle }, &Candle { minutes: 1, ..m }),
                "{tf}"
            );
            assert_eq!(d[0].close_time, b + tf.duration_ms() - 1);
        }
    }
    sim.shutdown();
}

#[tokio::test]
async fn rate_limits_429_then_418() {
    let sim =
        start(SimConfig { rest_weight_per_minute: 10, ban_after_violations: 2, ..config(1.0) })
            .await;
    let mut statuses = Vec::new();
    for _ in 0..20 {
        let (s, used, retry, body) = get(&sim, "/api/v3/time").await;
        assert!(used.is_some(), "every response carries X-MBX-USED-WEIGHT-1M");
        if s != 200 {
            assert!(retry.unwrap().parse::<u64>().unwrap() >= 1, "Retry-After on {s}");
            let e: wire::BinanceError = serde_json::from_str(&body).unwrap();
            assert_eq!(e.code, -1003);
        }
        statuses.push(s);
        if s == 418 {
            break;
        }
    }
    let first_429 = statuses.iter().position(|s| *s == 429).expect("a 429");
    assert!(first_429 >= 10 && statuses[..first_429].iter().all(|s| *s == 200));
    assert_eq!(statuses.last(), Some(&418), "{statuses:?}");
    let c = sim.faults().counters();
    assert!(c.rate_limited >= 2 && c.banned >= 1);
    // the control endpoints are not rate limited
    let (s, _, _, _) = get(&sim, "/sim/faults").await;
    assert_eq!(s, 200);
}

#[tokio::test]
async fn the_binance_connector_talks_to_the_simulator() {
    let sim = start(config(60.0)).await;
    let rest = RestClient::new(RestConfig::new(Product::Spot, sim.rest_base())).unwrap();
    let info = rest.exchange_info().await.unwrap();
    assert_eq!(info.symbols.len(), 8);
    assert!((rest.server_time().await.unwrap() - sim.now_ms()).abs() < 2_000);
    let k = rest.klines("XRPUSDT", Timeframe::M1, None, None, 1000).await.unwrap();
    assert_eq!(k.len(), 1000);
    let d = rest.depth("XRPUSDT", 100).await.unwrap();
    assert_eq!(d.bids.len(), 100);
    assert!(rest.used_weight_1m().unwrap() > 0);
    let mut conn = binance::stream::connect(
        &sim.ws_base(),
        &["xrpusdt@kline_1m", "xrpusdt@depth@100ms", "xrpusdt@trade"],
    )
    .await
    .unwrap();
    let (mut klines, mut depth, mut trades) = (0, 0, 0);
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline && (klines == 0 || depth == 0 || trades == 0) {
        match timeout(PATIENCE, conn.next()).await.unwrap().unwrap().unwrap() {
            StreamEvent::Kline { kline, .. } => {
                assert_eq!(kline.symbol, "XRPUSDT");
                klines += 1;
            }
            StreamEvent::DepthUpdate { update, .. } => {
                assert!(update.delta.first_id <= update.delta.last_id);
                depth += 1;
            }
            StreamEvent::Trade { .. } => trades += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(klines > 0 && depth > 0 && trades > 0, "{klines} {depth} {trades}");
    conn.close().await;
}

// ---------------------------------------------------------------------------------------------
// Streams
// ---------------------------------------------------------------------------------------------

/// A local book synced with `BookSync` from the REST snapshot and the diff stream, over a real
/// WebSocket, equals the simulator's true book whenever both are at the same update id.
async fn sync_equals_truth(futures: bool) {
    let sim = start(config(5.0)).await;
    let (symbol, base, api, rule) = if futures {
        ("DOGEUSDT", sim.futures_ws_base(), "/fapi/v1/depth", ContinuityRule::Futures)
    } else {
        ("BTCUSDT", sim.ws_base(), "/api/v3/depth", ContinuityRule::Spot)
    };
    let lower = symbol.to_ascii_lowercase();
    let mut ws = connect(&format!("{base}/stream?streams={lower}@depth@100ms")).await;
    let mut sync = BookSync::new(SyncConfig { verify_interval_ms: None, ..SyncConfig::new(rule) });
    let (mut compared, mut snapshots) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(8);
    while compared < 8 && Instant::now() < deadline {
        let frame = text(&mut ws).await;
        let StreamEvent::DepthUpdate { update, .. } = binance::parse_frame(&frame).unwrap() else {
            panic!("{frame}")
        };
        assert_eq!(update.delta.prev_last_id.is_some(), futures, "pu only on futures");
        sync.handle_delta(update.delta, 0);
        while let Some(ev) = sync.poll_event() {
            match ev {
                SyncEvent::NeedSnapshot { .. } => {
                    let limit = if futures { 1000 } else { 5000 };
                    let body = get(&sim, &format!("{api}?symbol={symbol}&limit={limit}")).await.3;
                    let snap: DepthBody = wire::parse_body(&body).unwrap();
                    snapshots += 1;
                    sync.handle_snapshot(snap.into_snapshot(), 0);
                }
                SyncEvent::BookChanged { last_update_id } => {
                    let (id, bids, asks) = sim.book(symbol).unwrap();
                    if id == last_update_id {
                        let mut truth = OrderBook::new();
                        truth.replace(&bids, &asks);
                        assert_eq!(
                            sync.book(),
                            &truth,
                            "local book differs from the truth at {id}"
                        );
                        assert!(!truth.is_crossed());
                        compared += 1;
                    }
                }
                SyncEvent::GapDetected { .. } | SyncEvent::Crossed { .. } => {
                    panic!("{ev:?} on a clean stream")
                }
                _ => {}
            }
        }
    }
    assert!(compared >= 8, "compared the books {compared} times");
    assert_eq!(snapshots, 1, "one snapshot is enough on a clean stream");
    assert!(sync.is_synced());
    sim.shutdown();
}

/// At speed 60 a 100 ms diff spans 6 simulated seconds (~240 actions): levels are added and
/// removed again inside one window, and a REST snapshot taken inside it holds them. The diff that
/// bridges the snapshot must remove them, or the client's book keeps phantom levels and every
/// periodic verification reports drift. Fault-free: the book equals the truth and verifications
/// (both sides whole, snapshots from inside windows) find nothing.
async fn fast_sync_verifies_without_drift(futures: bool) {
    let (symbol, lower) = if futures { ("ETHUSDT", "ethusdt") } else { ("BTCUSDT", "btcusdt") };
    let sim = start(config_with(60.0, &[symbol])).await;
    let (base, api, rule) = if futures {
        (sim.futures_ws_base(), "/fapi/v1/depth", ContinuityRule::Futures)
    } else {
        (sim.ws_base(), "/api/v3/depth", ContinuityRule::Spot)
    };
    let mut ws = connect(&format!("{base}/ws/{lower}@depth@100ms")).await;
    let mut sync =
        BookSync::new(SyncConfig { verify_interval_ms: Some(300), ..SyncConfig::new(rule) });
    let clock = Instant::now();
    let now = || clock.elapsed().as_millis() as i64;
    let mut compared = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while (sync.stats().verifications < 6 || compared < 3) && Instant::now() < deadline {
        let frame = text(&mut ws).await;
        let StreamEvent::DepthUpdate { update, .. } = binance::parse_frame(&frame).unwrap() else {
            panic!("{frame}")
        };
        sync.handle_delta(update.delta, now());
        sync.handle_timeout(now());
        while let Some(ev) = sync.poll_event() {
            match ev {
                SyncEvent::NeedSnapshot { .. } | SyncEvent::VerifyDue => {
                    // a snapshot from inside a diff's window: the driver ticks every 50 ms and
                    // publishes 100 ms diffs every other tick
                    tokio::time::sleep(Duration::from_millis(60)).await;
                    let body = get(&sim, &format!("{api}?symbol={symbol}&limit=1000")).await.3;
                    let snap: DepthBody = wire::parse_body(&body).unwrap();
                    sync.handle_snapshot(snap.into_snapshot(), now());
                }
                SyncEvent::BookChanged { last_update_id } => {
                    let (id, bids, asks) = sim.book(symbol).unwrap();
                    if id == last_update_id {
                        let mut truth = OrderBook::new();
                        truth.replace(&bids, &asks);
                        assert_eq!(sync.book(), &truth, "the book differs from the truth at {id}");
                        compared += 1;
                    }
                }
                SyncEvent::Drift { drift_levels, last_update_id } => {
                    panic!("drift of {drift_levels} levels at {last_update_id} on a clean stream")
                }
                SyncEvent::GapDetected { .. } | SyncEvent::Crossed { .. } => {
                    panic!("{ev:?} on a clean stream")
                }
                _ => {}
            }
        }
    }
    let stats = sync.stats();
    assert!(stats.verifications >= 6, "only {} verifications", stats.verifications);
    assert!(compared >= 3, "compared with the truth {compared} times");
    assert_eq!((stats.drift_events, stats.drift_levels), (0, 0));
    sim.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_speed_60_spot_verifications_find_no_drift() {
    fast_sync_verifies_without_drift(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_speed_60_futures_verifications_find_no_drift() {
    fast_sync_verifies_without_drift(true).await;
}

#[tokio::test]
async fn spot_depth_sync_equals_the_true_book() {
    sync_equals_truth(false).await;
}

#[tokio::test]
async fn futures_depth_sync_with_pu_equals_the_true_book() {
    sync_equals_truth(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_speed_600_each_minute_closes_once_in_about_100ms() {
    let sim = start(config_with(600.0, &["BTCUSDT"])).await;
    let mut ws =
        connect(&format!("{}/stream?streams=btcusdt@kline_1m/btcusdt@kline_5m", sim.ws_base()))
            .await;
    let begun = Instant::now();
    let mut closed: Vec<(wire::KlineUpdate, Instant)> = Vec::new();
    let mut closed_5m: Vec<wire::KlineUpdate> = Vec::new();
    let mut forming = 0;
    while begun.elapsed() < Duration::from_millis(2_000) {
        let f = text(&mut ws).await;
        let v: Value = serde_json::from_str(&f).unwrap();
        assert!(v["stream"] == "btcusdt@kline_1m" || v["stream"] == "btcusdt@kline_5m", "{v}");
        match binance::parse_frame(&f).unwrap() {
            StreamEvent::Kline { kline, .. }
                if kline.closed && kline.timeframe == Timeframe::M5 =>
            {
                closed_5m.push(kline)
            }
            StreamEvent::Kline { kline, .. } if kline.closed => {
                closed.push((kline, Instant::now()))
            }
            StreamEvent::Kline { .. } => forming += 1,
            other => panic!("{other:?}"),
        }
    }
    assert!(forming > 0, "forming updates between closes");
    assert!(
        (8..=28).contains(&closed.len()),
        "{} minutes closed in 2 s at speed 600",
        closed.len()
    );
    for w in closed.windows(2) {
        assert_eq!(
            w[1].0.candle.open_time,
            w[0].0.candle.open_time + MINUTE_MS,
            "each minute exactly once"
        );
    }
    let (a, b) = (closed.first().unwrap(), closed.last().unwrap());
    let per_minute = (b.1 - a.1).as_secs_f64() / (closed.len() - 1) as f64;
    assert!((0.06..0.2).contains(&per_minute), "{per_minute} s per simulated minute");
    // each closed kline is exactly the oracle's
    let oracle = sim.closed_klines("BTCUSDT", a.0.candle.open_time, b.0.candle.open_time);
    assert_eq!(oracle.len(), closed.len());
    for ((k, _), truth) in closed.iter().zip(&oracle) {
        assert!(same_candle(&k.candle, truth));
        assert!(k.event_time >= k.close_time, "closed after its minute ended");
    }
    // derived streams close too, as merges of the 1m
    assert!(closed_5m.len() >= 2, "{} 5m klines closed", closed_5m.len());
    for w in closed_5m.windows(2) {
        assert_eq!(w[1].candle.open_time, w[0].candle.open_time + 5 * MINUTE_MS);
    }
    for k in &closed_5m {
        let ones =
            sim.closed_klines("BTCUSDT", k.candle.open_time, k.candle.open_time + 4 * MINUTE_MS);
        assert_eq!(Some(k.candle), merge(Timeframe::M5, &ones));
    }
    sim.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kline_ohlcv_equals_the_trades_of_its_minute() {
    let sim = start(config(60.0)).await;
    let mut ws =
        connect(&format!("{}/stream?streams=ethusdt@trade/ethusdt@kline_1m", sim.ws_base())).await;
    let mut trades: Vec<(i64, Price, shared::Qty, u64)> = Vec::new();
    let mut closed: Vec<wire::KlineUpdate> = Vec::new();
    let begun = Instant::now();
    while begun.elapsed() < Duration::from_millis(3_600) {
        match binance::parse_frame(&text(&mut ws).await).unwrap() {
            StreamEvent::Trade { trade, .. } => {
                let t = trade;
                trades.push((t.trade_time, t.price, t.qty, t.trade_id));
            }
            StreamEvent::Kline { kline, .. } if kline.closed => closed.push(kline),
            StreamEvent::Kline { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    let (first_seen, last_seen) = (trades.first().unwrap().0, trades.last().unwrap().0);
    for w in trades.windows(2) {
        assert_eq!(w[1].3, w[0].3 + 1, "trade ids without gaps");
        assert!(w[1].0 >= w[0].0);
    }
    let mut checked = 0;
    for k in &closed {
        let (open, end) = (k.candle.open_time, k.candle.open_time + MINUTE_MS);
        if open <= first_seen || end > last_seen {
            continue; // not fully observed
        }
        let mine: Vec<_> = trades.iter().filter(|t| t.0 >= open && t.0 < end).collect();
        assert!(mine.len() as u64 >= 60, "several trades per simulated second: {}", mine.len());
        let c = &k.candle;
        assert_eq!(c.trades, mine.len() as u64);
        assert_eq!(c.open, mine[0].1);
        assert_eq!(c.close, mine.last().unwrap().1);
        assert_eq!(c.high, mine.iter().map(|t| t.1).max().unwrap());
        assert_eq!(c.low, mine.iter().map(|t| t.1).min().unwrap());
        let vol: i128 = mine.iter().map(|t| t.2.raw() as i128).sum();
        assert_eq!(c.volume.raw(), vol, "volume exact");
        checked += 1;
    }
    assert!(checked >= 2, "checked {checked} minutes");
    let (_, bids, asks) = sim.book("ETHUSDT").unwrap();
    assert!(bids[0].price < asks[0].price, "never crossed");
    sim.shutdown();
}

#[tokio::test]
async fn stream_requests_raw_and_combined() {
    let sim = start(config(30.0)).await;
    // raw stream by path
    let mut ws = connect(&format!("{}/ws/btcusdt@trade", sim.ws_base())).await;
    let v: Value = serde_json::from_str(&text(&mut ws).await).unwrap();
    assert_eq!(v["e"], "trade");
    assert_eq!(v["s"], "BTCUSDT");
    drop(ws);

    // live subscriptions on a bare connection
    let mut ws = connect(&format!("{}/ws", sim.ws_base())).await;
    assert!(
        matches!(next(&mut ws, Duration::from_millis(300)).await, Seen::Timeout),
        "nothing before SUBSCRIBE"
    );
    send_json(
        &mut ws,
        serde_json::json!({"method":"SUBSCRIBE","params":["ethusdt@depth20@100ms","ethusdt@bookTicker"],"id":1}),
    )
    .await;
    let mut got_reply = false;
    let mut partial = 0;
    while !(got_reply && partial >= 2) {
        let v: Value = serde_json::from_str(&text(&mut ws).await).unwrap();
        if v.get("id").is_some() {
            assert_eq!(v, serde_json::json!({"result":null,"id":1}));
            got_reply = true;
        } else if v.get("lastUpdateId").is_some() {
            assert_eq!(v["bids"].as_array().unwrap().len(), 20);
            partial += 1;
        } else {
            assert!(v.get("b").is_some() && v.get("u").is_some(), "bookTicker: {v}");
        }
    }
    send_json(&mut ws, serde_json::json!({"method":"LIST_SUBSCRIPTIONS","id":2})).await;
    send_json(
        &mut ws,
        serde_json::json!({"method":"UNSUBSCRIBE","params":["ethusdt@depth20@100ms","ethusdt@bookTicker"],"id":3}),
    )
    .await;
    send_json(
        &mut ws,
        serde_json::json!({"method":"SUBSCRIBE","params":["ethusdt@nonsense"],"id":4}),
    )
    .await;
    ws.send(Message::Text("{not json".into())).await.unwrap();
    send_json(
        &mut ws,
        serde_json::json!({"method":"SET_PROPERTY","params":["combined",true],"id":5}),
    )
    .await;
    send_json(
        &mut ws,
        serde_json::json!({"method":"SUBSCRIBE","params":["ltcusdt@aggTrade"],"id":6}),
    )
    .await;
    let mut replies = Vec::new();
    let mut wrapped = false;
    let deadline = Instant::now() + PATIENCE;
    while (replies.len() < 6 || !wrapped) && Instant::now() < deadline {
        let v: Value = serde_json::from_str(&text(&mut ws).await).unwrap();
        if v.get("id").is_some() || v.get("error").is_some() {
            replies.push(v);
        } else if v.get("stream").is_some() {
            assert_eq!(v["stream"], "ltcusdt@aggTrade");
            assert_eq!(v["data"]["e"], "aggTrade");
            wrapped = true;
        }
    }
    assert!(wrapped, "SET_PROPERTY combined wraps events");
    assert_eq!(
        replies[0],
        serde_json::json!({"result":["ethusdt@depth20@100ms","ethusdt@bookTicker"],"id":2})
    );
    assert_eq!(replies[1], serde_json::json!({"result":null,"id":3}));
    assert_eq!(replies[2]["error"]["code"], 2);
    assert_eq!(replies[2]["id"], 4);
    assert_eq!(replies[3]["error"]["code"], 3);
    assert_eq!(replies[4], serde_json::json!({"result":null,"id":5}));
    assert_eq!(replies[5], serde_json::json!({"result":null,"id":6}));

    // a name that is not a stream this venue offers is accepted in the URL (as Binance accepts
    // any segment: listen keys, client connection ids) and carries nothing
    let mut ws = connect(&format!("{}/ws/btcusdt@depth@7ms", sim.ws_base())).await;
    assert!(matches!(next(&mut ws, Duration::from_millis(300)).await, Seen::Timeout));
    sim.shutdown();
}

#[tokio::test]
async fn server_pings_and_answers_pings() {
    let sim = start(SimConfig { ping_interval: Duration::from_millis(100), ..config(1.0) }).await;
    let mut ws = connect(&format!("{}/ws", sim.ws_base())).await;
    let mut pings = 0;
    let begun = Instant::now();
    while pings < 3 {
        match next(&mut ws, Duration::from_secs(2)).await {
            Seen::Ping => pings += 1,
            other => panic!("expected pings, got {other:?}"),
        }
    }
    assert!(begun.elapsed() < Duration::from_millis(1_500));
    ws.send(Message::Ping(b"hello".to_vec().into())).await.unwrap();
    loop {
        match next(&mut ws, Duration::from_secs(2)).await {
            Seen::Pong(p) => {
                assert_eq!(p, b"hello");
                break;
            }
            Seen::Ping => {}
            other => panic!("expected a pong, got {other:?}"),
        }
    }
    assert_eq!(sim.faults().counters().ping_timeouts, 0, "the client answers pings");
}

#[tokio::test]
async fn a_client_that_never_answers_pings_is_closed() {
    let sim = start(SimConfig {
        ping_interval: Duration::from_millis(50),
        pong_timeout: Duration::from_millis(200),
        ..config(1.0)
    })
    .await;
    // never read, so tungstenite never answers the pings
    let _silent = connect(&format!("{}/ws", sim.ws_base())).await;
    let begun = Instant::now();
    while sim.faults().counters().ping_timeouts == 0 {
        assert!(begun.elapsed() < PATIENCE, "the silent client was never closed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(sim.connections(), 0);
}

#[tokio::test]
async fn determinism_per_seed() {
    let symbols = ["BTCUSDT", "DOGEUSDT"];
    let a = start(config_with(600.0, &symbols)).await;
    let b = start(config_with(600.0, &symbols)).await;
    let c = start(SimConfig { seed: 8, ..config_with(600.0, &symbols) }).await;
    let until = live_first() + 4 * MINUTE_MS;
    sim_reach(&a, until).await;
    sim_reach(&b, until).await;
    sim_reach(&c, until).await;
    let from = live_first() - 2 * 86_400_000;
    for s in ["BTCUSDT", "DOGEUSDT"] {
        let x = a.closed_klines(s, from, until - 1);
        assert_eq!(x.len() as i64, (until - from) / MINUTE_MS);
        assert_eq!(x, b.closed_klines(s, from, until - 1), "{s}: same seed, same candles");
        assert_ne!(x, c.closed_klines(s, from, until - 1), "{s}: another seed, other candles");
    }
}

// ---------------------------------------------------------------------------------------------
// Faults
// ---------------------------------------------------------------------------------------------

/// (U, u) of a depth diff frame.
fn ids(frame: &str) -> (u64, u64) {
    let v: Value = serde_json::from_str(frame).unwrap();
    let d = if v.get("data").is_some() { &v["data"] } else { &v };
    (d["U"].as_u64().unwrap(), d["u"].as_u64().unwrap())
}

async fn depth_client(sim: &SimHandle, symbol: &str) -> Ws {
    let mut ws = connect(&format!("{}/ws/{symbol}@depth@100ms", sim.ws_base())).await;
    text(&mut ws).await; // the stream is flowing
    ws
}

#[tokio::test]
async fn fault_skip_duplicate_reorder_malformed_on_a_stream() {
    let sim = start(config(5.0)).await;
    let faults = sim.faults();
    let stream = "btcusdt@depth@100ms";

    // skip: a gap in the update ids
    let mut ws = depth_client(&sim, "btcusdt").await;
    let mut last = ids(&text(&mut ws).await).1;
    faults.skip(StreamTarget::stream(stream), 3);
    let mut gap = false;
    for _ in 0..10 {
        let (u0, u1) = ids(&text(&mut ws).await);
        gap |= u0 > last + 1;
        last = u1;
    }
    assert!(gap, "skipped messages leave a gap");
    assert_eq!(faults.counters().skipped, 3);

    // duplicate: the same frame twice in a row
    faults.duplicate(StreamTarget::kind(StreamClass::Depth).for_symbol("BTCUSDT"), 1);
    let mut prev = text(&mut ws).await;
    let mut dup = false;
    for _ in 0..10 {
        let f = text(&mut ws).await;
        dup |= f == prev;
        prev = f;
    }
    assert!(dup, "a duplicated frame");

    // reorder: a frame with an older u after a newer one
    faults.reorder(StreamTarget::stream(stream), 1);
    let mut prev = ids(&text(&mut ws).await).1;
    let mut swapped = false;
    for _ in 0..10 {
        let u = ids(&text(&mut ws).await).1;
        swapped |= u < prev;
        prev = u;
    }
    assert!(swapped, "two frames swapped");
    assert_eq!(faults.counters().reordered, 1);

    // malformed: invalid JSON and a truncated frame
    faults.malformed(StreamTarget::stream(stream), 2);
    let mut broken = 0;
    for _ in 0..10 {
        let f = text(&mut ws).await;
        if serde_json::from_str::<Value>(&f).is_err() {
            assert!(binance::parse_frame(&f).is_err());
            broken += 1;
        }
    }
    assert_eq!(broken, 2);
    assert_eq!(faults.counters().malformed, 2);
    sim.shutdown();
}

#[tokio::test]
async fn fault_stall_keeps_the_connection_silent_then_resumes() {
    let sim = start(config(5.0)).await;
    let mut ws = depth_client(&sim, "ethusdt").await;
    sim.faults().stall(StreamTarget::kind(StreamClass::Depth), Duration::from_millis(700));
    // whatever was already queued may still arrive; then silence
    let t0 = Instant::now();
    let mut longest = Duration::ZERO;
    let mut last = Instant::now();
    while t0.elapsed() < Duration::from_millis(1_500) {
        match next(&mut ws, Duration::from_millis(1_000)).await {
            Seen::Text(_) => {
                longest = longest.max(last.elapsed());
                last = Instant::now();
            }
            Seen::Timeout => {}
            Seen::Ping | Seen::Pong(_) => {}
            other => panic!("the connection must stay open: {other:?}"),
        }
    }
    assert!(longest >= Duration::from_millis(550), "a silent gap of {longest:?}");
    assert!(last.elapsed() < Duration::from_millis(500), "messages resumed");
    assert!(sim.faults().counters().stalled > 0);
}

#[tokio::test]
async fn fault_drop_all_or_one_symbol() {
    let sim = start(config(5.0)).await;
    let mut btc = depth_client(&sim, "btcusdt").await;
    let mut eth = depth_client(&sim, "ethusdt").await;
    assert_eq!(sim.connections(), 2);
    assert_eq!(sim.faults().drop_connections(Some("BTCUSDT")), 1);
    loop {
        match next(&mut btc, PATIENCE).await {
            Seen::Text(_) => {} // queued before the drop
            Seen::Ended => break,
            other => panic!("expected an abrupt end, got {other:?}"),
        }
    }
    text(&mut eth).await;
    text(&mut eth).await;
    // over HTTP: drop everything
    let r = post_faults(&sim, r#"{"action":"drop"}"#).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["dropped"], 1);
    loop {
        match next(&mut eth, PATIENCE).await {
            Seen::Text(_) => {}
            Seen::Ended => break,
            other => panic!("expected an abrupt end, got {other:?}"),
        }
    }
    assert_eq!(sim.faults().counters().connections_dropped, 2);
}

#[tokio::test]
async fn fault_max_connection_age_closes_with_a_close_frame() {
    let sim = start(config(1.0)).await;
    let mut ws = connect(&format!("{}/ws/btcusdt@trade", sim.ws_base())).await;
    let opened = Instant::now();
    sim.faults().set_max_connection_age(Some(Duration::from_millis(300)));
    loop {
        match next(&mut ws, PATIENCE).await {
            Seen::Text(_) | Seen::Ping => {}
            Seen::Close(code) => {
                assert_eq!(code, Some(1000));
                break;
            }
            other => panic!("expected a close frame, got {other:?}"),
        }
    }
    assert!(opened.elapsed() < Duration::from_secs(2));
    assert_eq!(sim.faults().counters().connections_aged_out, 1);
    // a new connection lives until it is 300 ms old too
    let mut ws = connect(&format!("{}/ws/btcusdt@trade", sim.ws_base())).await;
    let opened = Instant::now();
    while !matches!(next(&mut ws, PATIENCE).await, Seen::Close(_)) {}
    assert!(opened.elapsed() >= Duration::from_millis(250));
}

#[tokio::test]
async fn fault_rest_failures_by_path_and_over_http() {
    let sim = start(config(1.0)).await;
    let faults = sim.faults();
    faults.fail_rest(1, 500, Some("/api/v3/depth"), None);
    assert_eq!(get(&sim, "/api/v3/time").await.0, 200, "other paths unaffected");
    assert_eq!(get(&sim, "/api/v3/depth?symbol=BTCUSDT").await.0, 500);
    assert_eq!(get(&sim, "/api/v3/depth?symbol=BTCUSDT").await.0, 200, "only the next one");
    faults.fail_rest(1, 429, None, Some(3));
    let (s, _, retry, body) = get(&sim, "/api/v3/klines?symbol=BTCUSDT&interval=1m").await;
    assert_eq!((s, retry.as_deref()), (429, Some("3")));
    assert_eq!(serde_json::from_str::<wire::BinanceError>(&body).unwrap().code, -1003);
    // scripted over HTTP
    let r = post_faults(&sim, r#"[{"action":"rest_fail","count":2,"status":418,"retry_after":7},{"action":"skip","kind":"kline","count":4}]"#).await;
    assert_eq!(r.status(), 200);
    let (s, _, retry, _) = get(&sim, "/api/v3/exchangeInfo").await;
    assert_eq!((s, retry.as_deref()), (418, Some("7")));
    let state = get_json(&sim, "/sim/faults").await;
    assert_eq!(state["plan"]["rest"][0]["remaining"], 1);
    assert_eq!(state["plan"]["messages"][0]["fault"], "skip");
    assert_eq!(state["plan"]["messages"][0]["kind"], "kline");
    assert_eq!(state["counters"]["rest_failed"], 3);
    let bad = post_faults(&sim, r#"{"action":"explode"}"#).await;
    assert_eq!(bad.status(), 400);
    faults.clear();
    assert_eq!(get(&sim, "/api/v3/exchangeInfo").await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_client_is_dropped_and_does_not_stall_others() {
    let sim =
        start(SimConfig { ws_queue: 16, ..config_with(600.0, &["BTCUSDT", "ETHUSDT"]) }).await;
    let streams =
        "btcusdt@trade/btcusdt@depth@100ms/btcusdt@depth20@100ms/ethusdt@trade/ethusdt@depth@100ms";
    // the slow client has a tiny receive buffer and never reads
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let tcp = socket.connect(sim.addr()).await.unwrap();
    let url = format!("{}/stream?streams={streams}", sim.ws_base());
    let (slow, _) = tokio_tungstenite::client_async(url, tcp).await.unwrap();
    let mut fast = connect(&format!("{}/ws/ethusdt@kline_1m", sim.ws_base())).await;
    let begun = Instant::now();
    let mut fast_frames = 0;
    while sim.faults().counters().laggards_disconnected == 0 {
        assert!(begun.elapsed() < Duration::from_secs(20), "the slow client was never dropped");
        if let Seen::Text(_) = next(&mut fast, Duration::from_millis(100)).await {
            fast_frames += 1;
        }
    }
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(1_000) {
        if let Seen::Text(_) = next(&mut fast, Duration::from_millis(100)).await {
            fast_frames += 1;
        }
    }
    assert!(fast_frames > 3, "the other client kept receiving ({fast_frames})");
    assert_eq!(sim.connections(), 1);
    drop(slow);
}

/// Idle CPU of the simulator at default speed with no client: run alone with
/// `cargo test -p server --test sim -- --ignored idle_cpu --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn idle_cpu() {
    fn cpu_ticks() -> u64 {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
        let f: Vec<&str> = stat.rsplit(')').next().unwrap().split_whitespace().collect();
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    }
    let sim = start(SimConfig::default()).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (c0, t0) = (cpu_ticks(), Instant::now());
    tokio::time::sleep(Duration::from_secs(10)).await;
    let used = (cpu_ticks() - c0) as f64 / 100.0; // USER_HZ
    let pct = 100.0 * used / t0.elapsed().as_secs_f64();
    println!("sim idle CPU: {pct:.2}% of one core ({used:.2} s over 10 s)");
    assert!(pct < 5.0);
    sim.shutdown();
}
