//! The simulator's OKX, Bybit, Coinbase and Kraken dialects, synced live by millrace's own
//! readers (`venues`) and machines (`shared::venue::VenueSync`) with every fault injected, then
//! the recording of that session replayed offline (`replay::venue`): the live books must resync
//! from each fault, and the replay must come to the same counts.
//!
//! With `MILLRACE_WRITE_VENUE_FIXTURES=1` the recordings are also written (gzip) to
//! `server/replay/tests/fixtures/venues/`, the replay tests' fixtures.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::{SinkExt, StreamExt};
use shared::sync::SyncEvent;
use shared::venue::{
    ConnectionSequence, ConnectionVerdict, Dialect, NumberFormat, VenueSync, VenueSyncConfig,
};
use sim::{FaultCommand, Sim, SimConfig, SimHandle, StreamTarget};
use tokio_tungstenite::tungstenite::Message as WsMessage;
use venues::Message;

const SYMBOLS: [&str; 2] = ["BTCUSDT", "ETHUSDT"];

async fn start() -> SimHandle {
    let config = SimConfig {
        seed: 11,
        speed: 60.0,
        start_ms: Some(1_750_000_000_000),
        control_token: Some(crate::CONTROL_TOKEN.into()),
        symbols: SimConfig::symbols_named(&SYMBOLS).unwrap(),
        ..SimConfig::default()
    };
    Sim::start(config, "127.0.0.1:0".parse().unwrap()).await.unwrap()
}

fn now_secs() -> String {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    format!("{}.{:09}", d.as_secs(), d.subsec_nanos())
}

/// One venue as a test drives it: its path, names and requests.
struct Dialect2 {
    dialect: Dialect,
    path: &'static str,
    /// The venue's names of the two markets.
    names: [&'static str; 2],
    subscribe_book: fn(&str) -> Vec<String>,
    unsubscribe_book: fn(&str) -> Vec<String>,
    /// Trades and candles of a market.
    subscribe_rest: fn(&str) -> Vec<String>,
    /// Kraken's v2 books need the pair's precisions: (price places, quantity places).
    precisions: Option<(u8, u8)>,
}

/// What the live session saw, per book.
#[derive(Debug, Default)]
struct Live {
    books: BTreeMap<String, VenueSync>,
    resubscribed: u64,
    reconnects: u64,
    trades: u64,
    candles: u64,
    capture: Vec<String>,
}

impl Live {
    fn book(&mut self, d: &Dialect2, symbol: &str) -> &mut VenueSync {
        self.books.entry(symbol.to_string()).or_insert_with(|| {
            let mut c = VenueSyncConfig::new(d.dialect.sequence_rule(), d.dialect.checksum_rule());
            if d.dialect == Dialect::Kraken {
                c.depth = Some(10);
            }
            if let Some((p, q)) = d.precisions {
                c.price_format = Some(NumberFormat::Fixed(p));
                c.qty_format = Some(NumberFormat::Fixed(q));
            }
            VenueSync::new(c)
        })
    }
}

/// Connects, subscribes and syncs for `duration`, applying `faults` one by one at even
/// intervals (a `drop` makes the client reconnect and subscribe again).
async fn session(
    sim: &SimHandle,
    d: &Dialect2,
    faults: Vec<FaultCommand>,
    duration: Duration,
) -> Live {
    let url = format!("{}{}", sim.ws_base(), d.path);
    let mut live = Live::default();
    let deadline = tokio::time::Instant::now() + duration;
    let step = duration / (faults.len() as u32 + 1);
    let mut next_fault = tokio::time::Instant::now() + step;
    let mut faults = faults.into_iter();
    let mut seq = ConnectionSequence::default();
    let mut messages = Vec::new();
    'connect: while tokio::time::Instant::now() < deadline {
        let (mut ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
        live.capture.push(format!("{url} <-> {}", now_secs()));
        seq.reset();
        for b in live.books.values_mut() {
            b.handle_connection_lost();
            while b.poll_event().is_some() {}
        }
        let mut first: Vec<String> = Vec::new();
        if d.dialect == Dialect::Kraken {
            first.push(venues::kraken::subscribe_v2("instrument", &[], None));
        }
        for n in d.names {
            first.extend((d.subscribe_book)(n));
            first.extend((d.subscribe_rest)(n));
        }
        if d.dialect == Dialect::Coinbase {
            first.push(venues::coinbase::subscribe("heartbeats", &[]));
        }
        for f in first {
            live.capture.push(format!("{url} <- {}: {f}", now_secs()));
            ws.send(WsMessage::Text(f.into())).await.unwrap();
        }
        loop {
            let now = tokio::time::Instant::now();
            if now >= deadline {
                break 'connect;
            }
            if now >= next_fault {
                next_fault += step;
                if let Some(f) = faults.next() {
                    sim.faults().apply(f);
                }
            }
            let frame = tokio::time::timeout(Duration::from_millis(50), ws.next()).await;
            let text = match frame {
                Err(_) => continue,
                Ok(Some(Ok(WsMessage::Text(t)))) => t.to_string(),
                Ok(Some(Ok(_))) => continue,
                Ok(Some(Err(_)) | None) => {
                    live.reconnects += 1;
                    continue 'connect;
                }
            };
            live.capture.push(format!("{}: {text}", now_secs()));
            messages.clear();
            if venues::parse(d.dialect, &text, &mut messages).is_err() {
                continue; // a malformed frame: counted by the replay as an error line
            }
            let mut resubscribe = Vec::new();
            let mut skip = false;
            for m in messages.drain(..) {
                match m {
                    Message::Sequence { seq: n } => match seq.observe(n) {
                        ConnectionVerdict::Gap { .. } => {
                            for b in live.books.values_mut() {
                                b.handle_lost_message();
                            }
                        }
                        ConnectionVerdict::Duplicate => skip = true,
                        _ => {}
                    },
                    _ if skip => {}
                    Message::Book(f) => {
                        let book = live.book(d, &f.symbol);
                        book.handle_message(f.message());
                        while let Some(e) = book.poll_event() {
                            if let SyncEvent::NeedSnapshot { .. } = e {
                                resubscribe.push(f.symbol.clone());
                            }
                        }
                    }
                    Message::Trades { trades, .. } => live.trades += trades.len() as u64,
                    Message::Candle(_) => live.candles += 1,
                    _ => {}
                }
            }
            // a lost message found by the connection's sequence: every book resubscribes
            for (symbol, b) in &mut live.books {
                while let Some(e) = b.poll_event() {
                    if let SyncEvent::NeedSnapshot { .. } = e {
                        resubscribe.push(symbol.clone());
                    }
                }
            }
            resubscribe.dedup();
            for symbol in resubscribe {
                live.resubscribed += 1;
                for f in
                    (d.unsubscribe_book)(&symbol).into_iter().chain((d.subscribe_book)(&symbol))
                {
                    live.capture.push(format!("{url} <- {}: {f}", now_secs()));
                    ws.send(WsMessage::Text(f.into())).await.unwrap();
                }
            }
        }
    }
    live
}

fn book_fault(action: &str, stream: &str, count: u32) -> FaultCommand {
    let target = StreamTarget::stream(stream);
    match action {
        "skip" => FaultCommand::Skip { target, count },
        "corrupt" => FaultCommand::Corrupt { target, count },
        "reset" => FaultCommand::Reset { target, count },
        "duplicate" => FaultCommand::Duplicate { target, count },
        _ => unreachable!(),
    }
}

/// Replays the live session's recording and checks it reaches the same counts.
fn replay_matches(d: &Dialect2, live: &Live) -> Vec<replay::venue::VenueReport> {
    let dir =
        std::env::temp_dir().join(format!("millrace-venue-{}-{}", d.dialect, std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{}.capture", d.dialect));
    std::fs::write(&path, live.capture.join("\n")).unwrap();
    if std::env::var_os("MILLRACE_WRITE_VENUE_FIXTURES").is_some() {
        let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../replay/tests/fixtures/venues")
            .join(format!("{}.capture.gz", d.dialect));
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        let mut gz = flate2::write::GzEncoder::new(
            std::fs::File::create(&out).unwrap(),
            flate2::Compression::best(),
        );
        gz.write_all(live.capture.join("\n").as_bytes()).unwrap();
        gz.finish().unwrap();
    }
    let reports = replay::venue::replay(d.dialect, &[path]).unwrap();
    for r in &reports {
        let Some(live_book) = live.books.get(&r.symbol) else { continue };
        let s = live_book.stats();
        let b = &r.books[0];
        assert_eq!(
            (
                b.gaps,
                b.resyncs,
                b.checksums_verified,
                b.checksums_failed,
                b.sequence_resets,
                b.synced
            ),
            (
                s.gaps,
                s.resyncs,
                s.checksums_verified,
                s.checksum_mismatches,
                s.sequence_resets,
                live_book.is_synced()
            ),
            "{}: the replay of the recording disagrees with the live session: {r:?}",
            r.symbol
        );
    }
    std::fs::remove_dir_all(&dir).ok();
    reports
}

fn okx() -> Dialect2 {
    Dialect2 {
        dialect: Dialect::Okx,
        path: "/okx/ws/v5/public",
        names: ["BTC-USDT", "ETH-USDT"],
        subscribe_book: |s| vec![venues::okx::subscribe("books", s)],
        unsubscribe_book: |s| vec![venues::okx::unsubscribe("books", s)],
        subscribe_rest: |s| {
            vec![venues::okx::subscribe("trades", s), venues::okx::subscribe("candle1m", s)]
        },
        precisions: None,
    }
}

fn bybit() -> Dialect2 {
    Dialect2 {
        dialect: Dialect::Bybit,
        path: "/bybit/v5/public/linear",
        names: ["BTCUSDT", "ETHUSDT"],
        subscribe_book: |s| vec![venues::bybit::subscribe(&[&format!("orderbook.50.{s}")])],
        unsubscribe_book: |s| vec![venues::bybit::unsubscribe(&[&format!("orderbook.50.{s}")])],
        subscribe_rest: |s| {
            vec![venues::bybit::subscribe(&[
                &format!("publicTrade.{s}"),
                &format!("kline.1.{s}"),
                &format!("tickers.{s}"),
            ])]
        },
        precisions: None,
    }
}

fn coinbase() -> Dialect2 {
    Dialect2 {
        dialect: Dialect::Coinbase,
        path: "/coinbase/ws",
        names: ["BTC-USDT", "ETH-USDT"],
        subscribe_book: |s| vec![venues::coinbase::subscribe("level2", &[s])],
        unsubscribe_book: |s| vec![venues::coinbase::unsubscribe("level2", &[s])],
        subscribe_rest: |s| vec![venues::coinbase::subscribe("market_trades", &[s])],
        precisions: None,
    }
}

fn kraken_unsubscribe(channel: &str, symbol: &str, depth: Option<u32>) -> String {
    let mut params = serde_json::json!({"channel": channel, "symbol": [symbol]});
    if let Some(d) = depth {
        params["depth"] = d.into();
    }
    serde_json::json!({"method": "unsubscribe", "params": params}).to_string()
}

fn kraken() -> Dialect2 {
    Dialect2 {
        dialect: Dialect::Kraken,
        path: "/kraken/v2",
        names: ["BTC/USDT", "ETH/USDT"],
        subscribe_book: |s| vec![venues::kraken::subscribe_v2("book", &[s], Some(10))],
        unsubscribe_book: |s| vec![kraken_unsubscribe("book", s, Some(10))],
        subscribe_rest: |s| {
            vec![
                venues::kraken::subscribe_v2("trade", &[s], None),
                serde_json::json!({"method": "subscribe", "params": {"channel": "ohlc", "symbol": [s], "interval": 1}})
                    .to_string(),
            ]
        },
        // the simulated pairs' tick is 0.01 and Kraken prints quantities with 8 places; the
        // replay reads them from the `instrument` channel the session subscribes first
        precisions: Some((2, 8)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn okx_books_resync_alone_from_every_fault_and_the_recording_replays_the_same() {
    let sim = start().await;
    let d = okx();
    let s = "okx:book:BTC-USDT";
    let faults = vec![
        book_fault("skip", s, 1),
        book_fault("corrupt", s, 1),
        book_fault("reset", s, 1),
        book_fault("duplicate", s, 1),
        FaultCommand::Drop { symbol: None },
    ];
    let live = session(&sim, &d, faults, Duration::from_secs(12)).await;
    let btc = live.books["BTC-USDT"].stats().clone();
    let eth = live.books["ETH-USDT"].stats().clone();
    assert!(live.books.values().all(VenueSync::is_synced), "{live:?}");
    assert!(btc.checksums_verified > 20 && eth.checksums_verified > 20, "{btc:?} {eth:?}");
    assert_eq!(btc.gaps, 1, "the skipped message is a seqId gap: {btc:?}");
    assert_eq!(btc.checksum_mismatches, 1, "{btc:?}");
    assert_eq!(btc.sequence_resets, 1, "{btc:?}");
    assert!(btc.stale_dropped >= 1, "the duplicate is dropped: {btc:?}");
    // ETH saw none of BTC's faults: only the dropped connection resynced it
    assert_eq!((eth.gaps, eth.checksum_mismatches, eth.resyncs), (0, 0, 1), "{eth:?}");
    assert_eq!(live.reconnects, 1);
    assert!(live.trades > 0 && live.candles > 0, "{live:?}");
    let reports = replay_matches(&d, &live);
    assert_eq!(reports.len(), 2);
    sim.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bybit_books_resync_alone_and_tickers_link_by_cross_sequence() {
    let sim = start().await;
    let d = bybit();
    let s = "bybit:book:BTCUSDT";
    let faults =
        vec![book_fault("skip", s, 1), book_fault("reset", s, 1), book_fault("duplicate", s, 1)];
    let live = session(&sim, &d, faults, Duration::from_secs(9)).await;
    let btc = live.books["BTCUSDT"].stats().clone();
    let eth = live.books["ETHUSDT"].stats().clone();
    assert!(live.books.values().all(VenueSync::is_synced), "{live:?}");
    assert_eq!(btc.gaps, 1, "{btc:?}");
    assert_eq!(btc.sequence_resets, 1, "u = 1 is taken as the whole book: {btc:?}");
    assert!(btc.stale_dropped >= 1, "{btc:?}");
    assert_eq!((eth.gaps, eth.resyncs), (0, 0), "{eth:?}");
    let reports = replay_matches(&d, &live);
    for r in &reports {
        let b = &r.books[0];
        assert!(b.ticker_checks > 0, "tickers are checked against the book at their cs: {r:?}");
        assert_eq!(b.ticker_mismatches, 0, "{r:?}");
    }
    sim.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coinbase_books_resync_on_a_connection_gap_and_a_duplicate_is_dropped() {
    let sim = start().await;
    let d = coinbase();
    let s = "coinbase:book:BTC-USDT";
    let faults =
        vec![book_fault("skip", s, 1), book_fault("duplicate", s, 1), book_fault("reset", s, 1)];
    let live = session(&sim, &d, faults, Duration::from_secs(9)).await;
    let btc = live.books["BTC-USDT"].stats().clone();
    let eth = live.books["ETH-USDT"].stats().clone();
    assert!(live.books.values().all(VenueSync::is_synced), "{live:?}");
    // a lost message of the connection could be any book's: both resync, once
    assert_eq!((btc.gaps, eth.gaps), (1, 1), "{btc:?} {eth:?}");
    assert!(btc.snapshots_applied >= 3, "the first, the resync's and the reset's: {btc:?}");
    replay_matches(&d, &live);
    sim.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kraken_books_prove_themselves_by_checksum_alone_through_every_fault() {
    let sim = start().await;
    let d = kraken();
    let s = "kraken:book:BTC/USDT";
    let faults = vec![
        book_fault("skip", s, 1),
        book_fault("corrupt", s, 1),
        book_fault("reset", s, 1),
        book_fault("duplicate", s, 1),
        FaultCommand::Drop { symbol: None },
    ];
    let live = session(&sim, &d, faults, Duration::from_secs(12)).await;
    let btc = live.books["BTC/USDT"].stats().clone();
    let eth = live.books["ETH/USDT"].stats().clone();
    assert!(live.books.values().all(VenueSync::is_synced), "{live:?}");
    assert!(btc.checksums_verified > 20 && eth.checksums_verified > 20, "{btc:?} {eth:?}");
    // no sequence: the skipped update and the corrupted checksum both show as a mismatch
    assert_eq!(btc.checksum_mismatches, 2, "{btc:?}");
    assert_eq!(btc.checksums_unchecked, 0, "{btc:?}");
    assert_eq!((eth.checksum_mismatches, eth.resyncs), (0, 1), "only the drop: {eth:?}");
    assert!(live.trades > 0 && live.candles > 0, "{live:?}");
    let reports = replay_matches(&d, &live);
    for r in &reports {
        assert_eq!(
            r.books[0].checksums_unchecked, 0,
            "the capture's instrument frame gave the precisions: {r:?}"
        );
        assert!(r.trades.candles_compared > 0 && r.trades.candle_mismatches == 0, "{r:?}");
    }
    sim.shutdown();
}
