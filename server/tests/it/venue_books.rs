//! OKX, Bybit, Coinbase and Kraken books in the service (issue 29): a real server syncs each
//! venue's books from the simulator's dialect over real sockets, publishes them like Binance's,
//! and each fault the venue can show (a lost message, a wrong checksum, the venue's reset, a
//! duplicate, a dropped connection) resyncs the faulty book alone; the other book of the same
//! venue never notices. Every published delta chains and no crossed book is published.

use std::time::Duration;

use server::config::{Config, SourceConfig, SourceKind};
use shared::protocol::ops::DepthJobStatus;
use shared::protocol::{BookHealth, Market};
use shared::sync::SyncStats;
use shared::venue::Dialect;
use sim::{FaultCommand, SimHandle, StreamTarget};
use testkit::*;

use crate::depth_faults::{status, watch_bus};

pub(crate) const VENUES: [Dialect; 4] =
    [Dialect::Okx, Dialect::Bybit, Dialect::Coinbase, Dialect::Kraken];

/// The venue's name of the simulated BTC market (what the simulator's fault targets use).
fn btc_name(d: Dialect) -> &'static str {
    match d {
        Dialect::Bybit => "BTCUSDT",
        Dialect::Kraken => "BTC/USDT",
        _ => "BTC-USDT",
    }
}

/// A source of each venue's dialect on the simulator, named after the venue (`okx`, ...).
pub(crate) fn venue_sources(sim: &SimHandle) -> Vec<SourceConfig> {
    VENUES
        .iter()
        .map(|&d| {
            let (rest, ws) =
                server::venue::sim_urls(d, Market::Spot, &sim.rest_base(), &sim.ws_base());
            SourceConfig {
                name: d.as_str().into(),
                kind: SourceKind::of_dialect(d),
                rest_base: Some(rest),
                ws_base: Some(ws),
                ..SourceConfig::default()
            }
        })
        .collect()
}

fn config(sim: &SimHandle) -> Config {
    let mut sources = vec![external_sim_source(sim)];
    sources.extend(venue_sources(sim));
    let mut c = test_config(sources);
    c.depth.pinned =
        VENUES.iter().flat_map(|d| ["BTC", "ETH"].map(|b| format!("{d}:spot:{b}/USDT"))).collect();
    c.ingest.reconnect_base_ms = 100;
    c.ingest.reconnect_cap_ms = 500;
    c
}

fn stats(server: &TestServer, d: Dialect, base: &str) -> (DepthJobStatus, SyncStats) {
    let (s, _) = status(server, &format!("{d}:spot:{base}/USDT"));
    let sync = s.sync.clone();
    (s, sync)
}

/// Waits until `ok` holds for the venue's BTC book while it is synced.
async fn btc_until(server: &TestServer, d: Dialect, what: &str, ok: impl Fn(&SyncStats) -> bool) {
    eventually(&format!("{d} BTC: {what}"), || async {
        let (s, sync) = stats(server, d, "BTC");
        (s.health == BookHealth::Synced && ok(&sync)).then_some(())
    })
    .await;
}

fn fault(action: &str, d: Dialect) -> FaultCommand {
    let target = StreamTarget::stream(&format!("{d}:book:{}", btc_name(d)));
    match action {
        "skip" => FaultCommand::Skip { target, count: 1 },
        "corrupt" => FaultCommand::Corrupt { target, count: 1 },
        "reset" => FaultCommand::Reset { target, count: 1 },
        _ => FaultCommand::Duplicate { target, count: 1 },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_venue_book_resyncs_alone_from_each_of_its_faults() {
    let sim = start_sim(5.0, 29).await;
    let server = TestServer::start(config(&sim)).await;
    let watches: Vec<_> = VENUES
        .iter()
        .flat_map(|d| {
            ["BTC", "ETH"]
                .map(|b| (format!("{d} {b}"), watch_bus(&server, &format!("{d}:spot:{b}/USDT"))))
        })
        .collect();
    for d in VENUES {
        for base in ["BTC", "ETH"] {
            eventually(&format!("{d} {base} synced"), || async {
                (stats(&server, d, base).0.health == BookHealth::Synced).then_some(())
            })
            .await;
        }
    }
    // the series catalogue lists every venue's markets
    let series = server.get_json("/api/v1/series").await;
    for d in VENUES {
        let id = format!("{d}:spot:BTC/USDT");
        assert!(
            series["instruments"].as_array().unwrap().iter().any(|i| i["id"] == id.as_str()),
            "{id} listed"
        );
    }

    // a lost message: a sequence gap (OKX, Bybit, Coinbase), a checksum that disagrees (Kraken)
    let before: Vec<SyncStats> = VENUES.iter().map(|&d| stats(&server, d, "BTC").1).collect();
    for d in VENUES {
        sim.faults().apply(fault("skip", d));
    }
    for (d, b) in VENUES.into_iter().zip(&before) {
        btc_until(&server, d, "the lost message found and resynced", |s| match d {
            Dialect::Kraken => {
                s.checksum_mismatches > b.checksum_mismatches && s.resyncs > b.resyncs
            }
            _ => s.gaps > b.gaps && s.resyncs > b.resyncs,
        })
        .await;
    }
    // a wrong checksum (the venues that send one)
    for d in [Dialect::Okx, Dialect::Kraken] {
        let b = stats(&server, d, "BTC").1;
        sim.faults().apply(fault("corrupt", d));
        btc_until(&server, d, "the wrong checksum found and resynced", |s| {
            s.checksum_mismatches > b.checksum_mismatches && s.resyncs > b.resyncs
        })
        .await;
    }
    // the venue's reset: continued from (OKX), the book taken whole (Bybit u = 1, Coinbase and
    // Kraken snapshots)
    let before: Vec<SyncStats> = VENUES.iter().map(|&d| stats(&server, d, "BTC").1).collect();
    for d in VENUES {
        sim.faults().apply(fault("reset", d));
    }
    for (d, b) in VENUES.into_iter().zip(&before) {
        btc_until(&server, d, "the reset taken", |s| match d {
            Dialect::Okx | Dialect::Bybit => {
                s.sequence_resets > b.sequence_resets && s.gaps == b.gaps
            }
            _ => s.snapshots_applied > b.snapshots_applied,
        })
        .await;
    }
    // a duplicate is dropped (the venues with a per-book sequence)
    for d in [Dialect::Okx, Dialect::Bybit] {
        let b = stats(&server, d, "BTC").1;
        sim.faults().apply(fault("duplicate", d));
        btc_until(&server, d, "the duplicate dropped", |s| {
            s.stale_dropped > b.stale_dropped && s.gaps == b.gaps
        })
        .await;
    }
    // a dropped connection: every BTC book reconnects and resyncs
    let before: Vec<SyncStats> = VENUES.iter().map(|&d| stats(&server, d, "BTC").1).collect();
    sim.faults().apply(FaultCommand::Drop { symbol: Some("BTCUSDT".into()) });
    for (d, b) in VENUES.into_iter().zip(&before) {
        btc_until(&server, d, "reconnected and resynced", |s| {
            s.snapshots_applied > b.snapshots_applied
        })
        .await;
    }

    // the ETH books had their own connections: none of it reached them
    for d in VENUES {
        let (s, sync) = stats(&server, d, "ETH");
        assert_eq!(s.health, BookHealth::Synced, "{d} ETH: {s:?}");
        assert_eq!(
            (sync.gaps, sync.checksum_mismatches, sync.resyncs),
            (0, 0, 0),
            "{d} ETH: {sync:?}"
        );
        if matches!(d, Dialect::Okx | Dialect::Kraken) {
            assert!(
                sync.checksums_verified > 10 && sync.checksums_unchecked == 0,
                "{d} ETH: {sync:?}"
            );
        }
    }
    for (what, w) in &watches {
        w.assert_clean(what);
        w.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    server.stop().await;
    sim.shutdown();
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// Trades on `trade@{instrument}`, for Binance (aggTrade beside the depth job) and a venue
/// (its trades channel beside its book): the trades of every minute the subscription saw whole
/// fold (`shared::trade::TradeFold`) into the exchange's own 1m candle; a trade message the venue
/// lost shows as an id gap in `GET /api/v1/trades`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trades_fold_into_the_exchanges_candles_and_a_lost_one_is_counted() {
    use shared::protocol::{PushData, ServerFrame};
    use shared::trade::TradeFold;

    let sim = start_sim(60.0, 31).await;
    let mut c = config(&sim);
    c.depth.pinned.clear();
    let server = TestServer::start(c).await;
    let ids = ["sim:spot:BTC/USDT", "okx:spot:BTC/USDT", "kraken:spot:BTC/USDT"];
    let mut ws = server.ws().await;
    let streams: Vec<String> = ids.iter().map(|i| format!("trade@{i}")).collect();
    let names: Vec<&str> = streams.iter().map(String::as_str).collect();
    let reply = request(&mut ws, "SUBSCRIBE", &names, 1).await;
    assert!(reply.error.is_none(), "{reply:?}");
    let mut folds: Vec<(TradeFold, Vec<shared::candle::Candle>, Option<i64>)> =
        ids.iter().map(|_| (TradeFold::new(), Vec::new(), None)).collect();
    // a little over four simulated minutes
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::time::Instant::now() < until {
        let ServerFrame::Push(p) = next_frame(&mut ws).await else { continue };
        let PushData::Trades(ev) = p.data else { continue };
        let i = ids.iter().position(|i| *i == ev.s.to_string()).expect("a subscribed instrument");
        let (fold, closed, first) = &mut folds[i];
        for t in &ev.trades {
            first.get_or_insert(t.time_ms);
            closed.extend(fold.push(t));
        }
    }
    for (id, (_, closed, first)) in ids.iter().zip(&folds) {
        let first = first.expect("trades arrived");
        // the minutes seen whole: after the first trade's minute
        let whole: Vec<_> = closed.iter().filter(|c| c.open_time > first).collect();
        assert!(whole.len() >= 2, "{id}: {} whole minutes", whole.len());
        for c in whole {
            let truth = sim.closed_klines("BTCUSDT", c.open_time, c.open_time);
            let t = truth.first().expect("the exchange's candle");
            assert_eq!(
                (c.open, c.high, c.low, c.close, c.volume),
                (t.open, t.high, t.low, t.close, t.volume),
                "{id}: minute {} from trades against the exchange's",
                c.open_time
            );
        }
    }
    // OKX loses a trades message: the ids skip, and the report says how many are missing
    sim.faults().apply(FaultCommand::Skip {
        target: StreamTarget::stream("okx:trades:BTC-USDT"),
        count: 1,
    });
    let report = eventually("an OKX trade id gap", || async {
        let r = server.get_json("/api/v1/trades?instrument=okx:spot:BTC/USDT&limit=5").await;
        (r["id_gaps"].as_u64() >= Some(1)).then_some(r)
    })
    .await;
    assert!(report["missing_ids"].as_u64() >= Some(1), "{report}");
    assert_eq!(report["trades"].as_array().unwrap().len(), 5, "{report}");
    // Binance loses aggTrade frames: the ids' hole is filled from REST aggTrades before the
    // next trade, so no gap remains
    sim.faults()
        .apply(FaultCommand::Skip { target: StreamTarget::stream("btcusdt@aggTrade"), count: 3 });
    let before = server.get_json("/api/v1/trades?instrument=sim:spot:BTC/USDT&limit=1").await;
    let skipped_before = sim.faults().counters().skipped;
    eventually_explained(
        "the skipped aggTrades gone by",
        || sim_state(&sim, "BTCUSDT"),
        || async { (sim.faults().counters().skipped >= skipped_before + 3).then_some(()) },
    )
    .await;
    let report = eventually("aggTrades after the hole", || async {
        let r = server.get_json("/api/v1/trades?instrument=sim:spot:BTC/USDT&limit=200").await;
        (r["received"].as_u64()? > before["received"].as_u64()? + 20).then_some(r)
    })
    .await;
    assert_eq!(report["id_gaps"], 0, "the hole was filled from REST: {}", report["id_gaps"]);
    assert!(
        report["filled"].as_u64() >= Some(3),
        "three frames' trades recovered: {}",
        report["filled"]
    );
    let ids: Vec<u64> = report["trades"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().parse().unwrap())
        .collect();
    assert!(ids.windows(2).all(|w| w[0] == w[1] + 1), "the newest ids follow one another: {ids:?}");
    let (status, body) = server.get("/api/v1/trades?instrument=sim:stock:600000").await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = server.get("/api/v1/trades?limit=0&instrument=sim:spot:BTC/USDT").await;
    assert_eq!(status, 400, "{body}");
    server.stop().await;
    sim.shutdown();
}

/// Each venue's 1m candles (OKX `candle1m`, Bybit `kline.1`, Kraken `ohlc`, Coinbase folded from
/// its trades) stored once each, equal to the exchange's own, through lost candle messages and a
/// dropped connection: the REST fill leaves no hole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_venue_stores_its_minutes_once_through_lost_messages_and_drops() {
    let sim = start_sim(60.0, 37).await;
    let mut c = config(&sim);
    c.depth.pinned.clear();
    c.ingest.pinned = VENUES.iter().map(|d| format!("{d}:spot:BTC/USDT")).collect();
    let server = TestServer::start(c).await;
    let stored = |d: Dialect| {
        let db = server.db_path();
        move || testkit::stored(&db, &format!("{d}:spot:BTC/USDT:1m"))
    };
    for d in VENUES {
        let f = stored(d);
        eventually(&format!("{d}: three minutes stored"), || async {
            (f().len() >= 3).then_some(())
        })
        .await;
    }
    // lose candle messages (and, on Coinbase, trades) and then the connections
    for d in VENUES {
        let channel = if d == Dialect::Coinbase { "trades" } else { "candles" };
        sim.faults().apply(FaultCommand::Skip {
            target: StreamTarget::stream(&format!("{d}:{channel}:{}", btc_name(d))),
            count: 3,
        });
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    sim.faults().apply(FaultCommand::Drop { symbol: Some("BTCUSDT".into()) });
    for d in VENUES {
        let f = stored(d);
        let first = f()[0].open_time;
        let want = first + 6 * 60_000;
        eventually(&format!("{d}: minutes stored past the faults"), || async {
            f().last().is_some_and(|c| c.open_time >= want).then_some(())
        })
        .await;
        let got = f();
        for w in got.windows(2) {
            assert_eq!(w[1].open_time - w[0].open_time, 60_000, "{d}: no hole, no duplicate");
        }
        let truth = sim.closed_klines("BTCUSDT", got[0].open_time, got.last().unwrap().open_time);
        for (g, t) in got.iter().zip(&truth) {
            assert_eq!(
                (g.open_time, g.open, g.high, g.low, g.close, g.volume),
                (t.open_time, t.open, t.high, t.low, t.close, t.volume),
                "{d}: a stored minute differs from the exchange's"
            );
        }
    }
    server.stop().await;
    sim.shutdown();
}

/// Backfill from each venue's REST history, newest first in the venue's page size, with the
/// exchange's own minutes: a day of OKX (100 a page), Bybit (1,000), Coinbase (350); Kraken keeps
/// only its newest 720 minutes, so its first run ends where its history does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_venue_backfills_its_rest_history_newest_first() {
    use server::config::BackfillTaskConfig;
    let sim = start_sim(1.0, 41).await;
    let mut c = config(&sim);
    c.depth.pinned.clear();
    c.backfill = VENUES
        .iter()
        .map(|d| BackfillTaskConfig {
            series: format!("{d}:spot:ETH/USDT:1m"),
            retention_days: 1,
            batch_limit: 1000,
            pause_ms: 0,
            max_expired_batches: 2,
            ..Default::default()
        })
        .collect();
    let server = TestServer::start(c).await;
    let tasks = eventually("every venue's backfill done", || async {
        let b = server.get_json("/api/v1/ops/backfill").await;
        let tasks = b["tasks"].as_array()?.clone();
        (tasks.len() == 4 && tasks.iter().all(|t| t["state"] == "done")).then_some(tasks)
    })
    .await;
    // the requests went at the venue's pace, and are counted
    let sources = server.get_json("/api/v1/ops/sources").await;
    let okx =
        sources["sources"].as_array().unwrap().iter().find(|s| s["name"] == "okx").unwrap().clone();
    assert!(okx["rest_used_weight_1m"].as_u64() >= Some(15), "a day of 100-minute pages: {okx}");
    assert_eq!(okx["rest_weight_budget_1m"], 500, "{okx}");
    for d in VENUES {
        let series = format!("{d}:spot:ETH/USDT:1m");
        let t = tasks.iter().find(|t| t["series"] == series.as_str()).unwrap();
        let got = testkit::stored(&server.db_path(), &series);
        let want = if d == Dialect::Kraken { 700 } else { 1400 };
        assert!(got.len() >= want, "{series}: {} minutes stored: {t}", got.len());
        for w in got.windows(2) {
            assert_eq!(w[1].open_time - w[0].open_time, 60_000, "{series}: no hole");
        }
        let truth = sim.closed_klines("ETHUSDT", got[0].open_time, got.last().unwrap().open_time);
        assert_eq!(truth.len(), got.len(), "{series}");
        for (g, t) in got.iter().zip(&truth) {
            assert_eq!(
                (g.open_time, g.open, g.high, g.low, g.close, g.volume),
                (t.open_time, t.open, t.high, t.low, t.close, t.volume),
                "{series}"
            );
        }
    }
    server.stop().await;
    sim.shutdown();
}

/// Bybit's linear USDT perpetuals (`market = "futures"`): the instrument list of
/// `category=linear` (perpetuals, `qtyStep`), the `/v5/public/linear` stream, the book synced by
/// Bybit's rules and resynced alone from a lost message, trades, and 1m candles stored once each,
/// equal to the exchange's, with the REST gap fill of `category=linear`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bybit_linear_perpetuals_are_a_futures_source() {
    let sim = start_sim(60.0, 53).await;
    let (rest, ws) =
        server::venue::sim_urls(Dialect::Bybit, Market::Futures, &sim.rest_base(), &sim.ws_base());
    assert!(ws.ends_with("/bybit/v5/public/linear"), "{ws}");
    let linear = SourceConfig {
        name: "bybit-linear".into(),
        kind: SourceKind::of_dialect(Dialect::Bybit),
        market: Market::Futures,
        rest_base: Some(rest),
        ws_base: Some(ws),
        ..SourceConfig::default()
    };
    let mut c = test_config(vec![external_sim_source(&sim), linear]);
    let btc = "bybit-linear:futures:BTC/USDT";
    c.depth.pinned = vec![btc.into()];
    c.ingest.pinned = vec![btc.into()];
    c.ingest.reconnect_base_ms = 100;
    c.ingest.reconnect_cap_ms = 500;
    let server = TestServer::start(c).await;
    let series = server.get_json("/api/v1/series").await;
    let listed = series["instruments"].as_array().unwrap();
    assert!(listed.iter().any(|i| i["id"] == btc), "{btc} listed");
    assert!(!listed.iter().any(|i| i["id"] == "bybit-linear:spot:BTC/USDT"));
    let watch = watch_bus(&server, btc);
    let synced = || async {
        let (s, _) = status(&server, btc);
        (s.health == BookHealth::Synced).then_some(s.sync)
    };
    let before = eventually("the linear book synced", synced).await;
    sim.faults()
        .apply(FaultCommand::Skip { target: StreamTarget::stream("bybit:book:BTCUSDT"), count: 1 });
    eventually("the lost message found and resynced", || async {
        let s = synced().await?;
        (s.gaps > before.gaps && s.resyncs > before.resyncs).then_some(())
    })
    .await;
    eventually("linear trades", || async {
        let r = server.get_json(&format!("/api/v1/trades?instrument={btc}&limit=5")).await;
        (r["received"].as_u64()? > 5).then_some(())
    })
    .await;
    let db = server.db_path();
    let stored = || testkit::stored(&db, &format!("{btc}:1m"));
    eventually("three linear minutes stored", || async { (stored().len() >= 3).then_some(()) })
        .await;
    let got = stored();
    assert!(got.windows(2).all(|w| w[1].open_time - w[0].open_time == 60_000), "no hole");
    let truth = sim.closed_klines("BTCUSDT", got[0].open_time, got.last().unwrap().open_time);
    for (g, t) in got.iter().zip(&truth) {
        assert_eq!(
            (g.open_time, g.open, g.high, g.low, g.close, g.volume),
            (t.open_time, t.open, t.high, t.low, t.close, t.volume),
            "a stored linear minute differs from the exchange's"
        );
    }
    watch.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    watch.assert_clean("the linear book");
    server.stop().await;
    sim.shutdown();
}

/// Periodic verification against the venue's REST book, where it says where in the stream it
/// stands (Bybit's cross sequence, OKX's and Coinbase's book time): a synced book verifies equal;
/// a phantom level the venue slipped into its stream — which neither Bybit nor Coinbase can show
/// by a checksum — is found as drift and the book resynced, alone. Kraken, whose REST book says
/// neither, is not verified this way (its checksum checks every update).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_verification_finds_a_phantom_level_no_checksum_can() {
    let sim = start_sim(1.0, 59).await;
    let mut c = config(&sim);
    c.depth.verify_interval_ms = 300;
    // a loaded machine must not make a connection look stalled: its reconnect would take the
    // phantom level away before a verification finds it
    c.ingest.stall_timeout_ms = 15_000;
    let server = TestServer::start(c).await;
    let verified = [Dialect::Okx, Dialect::Bybit, Dialect::Coinbase];
    for d in verified {
        btc_until(&server, d, "two REST verifications, equal", |s| {
            s.verifications >= 2 && s.drift_events == 0
        })
        .await;
    }
    for d in verified {
        let s = stats(&server, d, "BTC").1;
        eprintln!("{d}: {} verified, {} abandoned", s.verifications, s.verifications_abandoned);
    }
    let kraken = stats(&server, Dialect::Kraken, "BTC").1;
    assert_eq!(kraken.verifications, 0, "Kraken's REST book says not where it stands");
    for d in [Dialect::Bybit, Dialect::Coinbase] {
        let before = stats(&server, d, "BTC").1;
        let eth_before = stats(&server, d, "ETH").1;
        sim.faults().apply(fault("corrupt", d));
        // (a loaded machine abandons verifications whose point its job did not keep: a minute)
        let found = |s: &SyncStats| {
            s.drift_events > before.drift_events
                && s.drift_levels > before.drift_levels
                && s.resyncs > before.resyncs
                && s.verifications > before.verifications
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let (st, sync) = stats(&server, d, "BTC");
            if st.health == BookHealth::Synced && found(&sync) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{d}: phantom not found: {sync:?} {}",
                sim_state(&sim, "BTCUSDT")
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let eth = stats(&server, d, "ETH").1;
        assert_eq!(eth.drift_events, eth_before.drift_events, "{d} ETH saw nothing");
        assert_eq!(eth.resyncs, eth_before.resyncs, "{d} ETH saw nothing");
        // and verifies equal again after its resync
        let after = stats(&server, d, "BTC").1;
        btc_until(&server, d, "equal again", |s| {
            s.verifications > after.verifications && s.drift_events == after.drift_events
        })
        .await;
    }
    let (_, ops) = server.get("/api/v1/ops/books").await;
    assert!(ops.contains("\"drift\""), "{ops}");
    server.stop().await;
    sim.shutdown();
}
