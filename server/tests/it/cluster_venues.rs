//! OKX, Bybit, Coinbase and Kraken through the cluster (issue 29), as processes on the
//! machine's real NATS and PostgreSQL: the simulator speaking the four dialects, a supervisor,
//! three workers (each venue's `kline` and `depth` tasks on two of them) and a gateway.
//!
//! - **Books**: the gateway syncs each venue's book from a worker's relay (snapshot at the
//!   worker's publisher id, then its deltas, each checked by id and checksum); its book's best
//!   levels are the exchange's. A `kill -9` of a worker holding a book moves the gateway to the
//!   other replica: the deltas its browsers get still chain, no crossed book, no checksum
//!   mismatch, and the book is the exchange's again.
//! - **Trades**: each venue's trades, and Binance's aggregate trades, reach the gateway from
//!   both replicas and are kept once (the second copies counted as duplicates), with no id gap
//!   through the kill.
//! - **Candles**: each venue's closed 1m candles, forwarded by both replicas, are written once
//!   each by the persister, with no hole through the kill, equal to the exchange's.
//! - **Recording**: the workers record OKX, each in a directory of its own; merged by the
//!   venue's ids (by the readers and by the gateway's `GET /api/v1/replay`), their recordings
//!   hold every trade once with no hole, and one book chain,
//!   through the kill.

use std::collections::VecDeque;
use std::sync::Mutex;

use server::config::Config;
use shared::book::Level;
use shared::cluster::TaskKind;
use shared::protocol::ops::JobKind;
use shared::protocol::{BookHealth, InstrumentId};
use shared::venue::Dialect;
use sim::SimHandle;
use testkit::*;

use crate::cluster_workers::{fully_assigned, stored_pg, TestCluster};
use crate::depth_faults::{status, watch_bus};
use crate::venue_books::{venue_sources, VENUES};

/// Levels a side compared with the exchange's (within every venue's depth and checksum).
const TOP: usize = 10;

fn btc(d: Dialect) -> String {
    format!("{d}:spot:BTC/USDT")
}

/// Binance's BTC (the simulator's own dialect): its trades are relayed like the venues'.
const BINANCE_BTC: &str = "sim:spot:BTC/USDT";

fn configure(sim: &SimHandle, config: &mut Config) {
    config.sources.extend(venue_sources(sim));
    config.cluster.instruments = VENUES.iter().map(|&d| btc(d).parse().unwrap()).collect();
    config.cluster.instruments.push(BINANCE_BTC.parse().unwrap());
    config.cluster.kinds = vec![TaskKind::Kline, TaskKind::Depth];
    config.depth.verify_interval_ms = 0;
    config.ingest.reconnect_base_ms = 100;
    config.ingest.reconnect_cap_ms = 500;
    // a loaded test machine must not make a live replica's connection look stalled (its
    // reconnect would be a hole no replica covers, which this test is not about)
    config.ingest.stall_timeout_ms = 15_000;
    // the workers record OKX, each in a directory of its own
    config.record.enabled = true;
    config.record.dir =
        Some(std::env::temp_dir().join(format!("millrace-cluster-rec-{}", std::process::id())));
    config.record.sources = vec!["okx".into()];
}

/// The workers' recordings of OKX merged by the venue's ids (`recorded::read_merged`): the
/// killed replica's ends at the kill; the merge has every trade id once with no hole, and one
/// book chain (each update continues the one before, or a snapshot starts it again).
fn merged_recording_has_no_hole(c: &TestCluster, victim: &str) {
    let rec = c.gateway.config.record_dir();
    let dirs: Vec<std::path::PathBuf> = (1..=3)
        .map(|i| rec.join(format!("worker-w{i}")))
        .filter(|d| d.join("okx").join("source.json").is_file())
        .collect();
    assert!(dirs.len() >= 2, "the replicas recorded: {dirs:?}");
    let last_ns = |dirs: &[std::path::PathBuf]| {
        let mut last = 0;
        let channels = server::recorded::Channels::parse("book,trade").unwrap();
        server::recorded::read_merged(dirs, "okx", None, None, channels, &mut |l| {
            last = l.time_ns();
            true
        })
        .unwrap();
        last
    };
    let mut ids: Vec<u64> = Vec::new();
    let mut chain: Vec<(bool, Option<u64>, Option<u64>)> = Vec::new();
    let channels = server::recorded::Channels::parse("book,trade").unwrap();
    server::recorded::read_merged(&dirs, "okx", None, None, channels, &mut |l| {
        use shared::protocol::replay::ReplayLine;
        match l {
            ReplayLine::Trade { symbol, trades, .. } if symbol == "BTC-USDT" => {
                ids.extend(trades.iter().filter_map(|t| t.id.to_string().parse::<u64>().ok()))
            }
            ReplayLine::Book { symbol, snapshot, seq, prev_seq, .. } if symbol == "BTC-USDT" => {
                chain.push((snapshot, seq, prev_seq))
            }
            _ => {}
        }
        true
    })
    .unwrap();
    assert!(ids.len() > 20 && chain.len() > 20, "{} trades, {} book lines", ids.len(), chain.len());
    let unique: std::collections::BTreeSet<u64> = ids.iter().copied().collect();
    assert_eq!(unique.len(), ids.len(), "each trade once");
    let sorted: Vec<u64> = unique.into_iter().collect();
    assert!(sorted.windows(2).all(|w| w[1] == w[0] + 1), "no hole in the trade ids");
    for w in chain.windows(2) {
        let ((_, seq, _), (snapshot, _, prev)) = (w[0], w[1]);
        assert!(snapshot || prev == seq, "one book chain: {:?} then {:?}", w[0], w[1]);
    }
    // the trades export merges the replicas the same way
    let range = server::export::ExportRange {
        from: 0,
        to: i64::MAX,
        max_rows: u64::MAX,
        format: server::export::Format::Csv,
    };
    let inst: InstrumentId = btc(Dialect::Okx).parse().unwrap();
    let (rows, csv) = server::export::trades(&dirs, &inst, range, Vec::new()).unwrap();
    // (read a moment later: the live replicas recorded more meanwhile)
    assert!(rows as usize >= ids.len(), "{rows} < {}", ids.len());
    let exported: Vec<&str> = std::str::from_utf8(&csv)
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(1).unwrap())
        .collect();
    let unique: std::collections::HashSet<&&str> = exported.iter().collect();
    assert_eq!((unique.len(), exported.len()), (rows as usize, rows as usize), "each once");
    // the killed replica's own recording stops at the kill; the merge goes on past it
    let own = rec.join(format!("worker-{victim}"));
    if own.join("okx").join("source.json").is_file() {
        let (alone, all) = (last_ns(&[own]), last_ns(&dirs));
        assert!(all > alone + 1_000_000_000, "the merge covers what the victim missed");
    }
}

/// Waits until the gateway's published book of `instrument` is synced and its best [`TOP`]
/// levels a side are the exchange's at one of the moments seen while waiting (the gateway
/// trails the exchange by a worker and NATS).
async fn top_matches_sim(c: &TestCluster, instrument: &str) {
    let inst: InstrumentId = instrument.parse().unwrap();
    let seen: Mutex<VecDeque<(Vec<Level>, Vec<Level>)>> = Mutex::default();
    let top = |l: &[Level]| l.iter().take(TOP).copied().collect::<Vec<_>>();
    eventually(&format!("{instrument}: the gateway's best levels are the exchange's"), || async {
        let (_, bids, asks) = c.sim.book("BTCUSDT").unwrap();
        {
            let mut seen = seen.lock().unwrap();
            let now = (top(&bids), top(&asks));
            if seen.back() != Some(&now) {
                seen.push_back(now);
                if seen.len() > 2_000 {
                    seen.pop_front();
                }
            }
        }
        let (published, health) = c.gateway.app.books().snapshot(&inst)?;
        if health != BookHealth::Synced || published.bids.len() < TOP {
            return None;
        }
        let ours = (top(&published.bids), top(&published.asks));
        seen.lock().unwrap().iter().any(|s| *s == ours).then_some(())
    })
    .await;
}

async fn trades_report(c: &TestCluster, instrument: &str) -> serde_json::Value {
    c.gateway.get_json(&format!("/api/v1/trades?instrument={instrument}&limit=200")).await
}

/// The stored minutes of `d`'s BTC equal the exchange's (what a venue's candle carries: the
/// prices and the volume), one a minute, from the first stored.
fn stored_equal(c: &TestCluster, d: Dialect) -> Option<usize> {
    let got = stored_pg(&c.pg, &format!("{}:1m", btc(d)));
    let (first, last) = (got.first()?.open_time, got.last()?.open_time);
    let truth = c.sim.closed_klines("BTCUSDT", first, last);
    let fields =
        |k: &shared::candle::Candle| (k.open_time, k.open, k.high, k.low, k.close, k.volume);
    let same =
        got.len() == truth.len() && got.iter().zip(&truth).all(|(g, t)| fields(g) == fields(t));
    same.then_some(got.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn venue_books_trades_and_candles_go_through_workers_and_survive_a_kill() {
    let sim = start_sim(20.0, 47).await;
    let mut c = TestCluster::start_with_sim(sim, "clustervenue", configure).await;
    c.supervisor("sup1");
    for i in 1..=3 {
        c.worker(&format!("w{i}"), &[]);
    }
    let r = fully_assigned(&c.gateway, 2, &[]).await;

    // A browser's subscription to each venue's book and trades on the gateway.
    let leases: Vec<_> = VENUES
        .iter()
        .map(|&d| c.gateway.app.subscribe_depth(&btc(d).parse().unwrap()).unwrap())
        .collect();
    let watches: Vec<_> = VENUES.iter().map(|&d| watch_bus(&c.gateway, &btc(d))).collect();
    for d in VENUES {
        top_matches_sim(&c, &btc(d)).await;
        let (s, _) = status(&c.gateway, &btc(d));
        assert!(s.stream.contains(".relay."), "{d}: fed by the workers' relay: {}", s.stream);
        eventually(&format!("{d}: trades from both replicas, kept once"), || async {
            let r = trades_report(&c, &btc(d)).await;
            (r["received"].as_u64()? > 20 && r["duplicates"].as_u64()? > 0).then_some(())
        })
        .await;
    }
    // Binance's aggregate trades too, from both replicas, kept once
    let _binance = c.gateway.app.subscribe_depth(&BINANCE_BTC.parse().unwrap()).unwrap();
    eventually("Binance: trades from both replicas, kept once", || async {
        let r = trades_report(&c, BINANCE_BTC).await;
        (r["received"].as_u64()? > 20 && r["duplicates"].as_u64()? > 0).then_some(())
    })
    .await;
    let before: Vec<_> = VENUES.iter().map(|&d| status(&c.gateway, &btc(d)).0.sync).collect();
    for d in VENUES {
        eventually(&format!("{d}: minutes stored"), || async {
            stored_equal(&c, d).filter(|&n| n >= 2)
        })
        .await;
    }

    // kill -9 a worker holding OKX's book; every task is on two live workers again
    let victim = r
        .tasks
        .iter()
        .find(|t| t.kind == JobKind::Depth && t.instrument.to_string() == btc(Dialect::Okx))
        .unwrap()
        .workers[0]
        .clone();
    c.role(&victim).kill9();
    fully_assigned(&c.gateway, 2, &[victim.as_str()]).await;
    let after_kill: Vec<usize> = VENUES.iter().map(|&d| stored_equal(&c, d).unwrap_or(0)).collect();

    for (i, d) in VENUES.into_iter().enumerate() {
        top_matches_sim(&c, &btc(d)).await;
        let (s, _) = status(&c.gateway, &btc(d));
        eprintln!("{d} on the gateway after the kill: {:?} (stream {})", s.sync, s.stream);
        assert_eq!(s.sync.checksum_mismatches, 0, "{d}: the gateway's book is the worker's");
        assert_eq!(
            s.sync.checksums_verified, s.sync.deltas_applied,
            "{d}: every delta's checksum checked on the gateway"
        );
        assert_eq!(s.sync.gaps, before[i].gaps, "{d}: no gap in a replica's deltas");
        // trades go on, each kept once, with no hole in the ids that follow one another
        let r0 = trades_report(&c, &btc(d)).await["received"].as_u64().unwrap();
        let r = eventually(&format!("{d}: trades after the kill"), || async {
            let r = trades_report(&c, &btc(d)).await;
            (r["received"].as_u64()? > r0 + 20).then_some(r)
        })
        .await;
        if d != Dialect::Bybit {
            assert_eq!(r["id_gaps"], 0, "{d}: a replica's trades cover the other's: {r}");
        }
        let ids: Vec<&str> =
            r["trades"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap()).collect();
        let unique: std::collections::HashSet<&&str> = ids.iter().collect();
        assert_eq!(unique.len(), ids.len(), "{d}: each trade kept once");
        // minutes go on being stored once each, without a hole
        eventually(&format!("{d}: minutes stored after the kill"), || async {
            stored_equal(&c, d).filter(|&n| n >= after_kill[i] + 2)
        })
        .await;
    }
    let r0 = trades_report(&c, BINANCE_BTC).await["received"].as_u64().unwrap();
    let r = eventually("Binance: trades after the kill", || async {
        let r = trades_report(&c, BINANCE_BTC).await;
        (r["received"].as_u64()? > r0 + 20).then_some(r)
    })
    .await;
    assert_eq!(r["id_gaps"], 0, "Binance: a replica's trades cover the other's: {r}");
    for (d, w) in VENUES.iter().zip(&watches) {
        w.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        w.assert_clean(&format!("{d} BTC through the kill"));
    }
    // (the recorders write every 200 ms)
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    merged_recording_has_no_hole(&c, &victim);
    // the gateway's replay API merges its workers' recordings the same way
    let (status, body) = c.gateway.get("/api/v1/replay?source=okx&channels=trade").await;
    assert_eq!(status, 200, "{body}");
    let mut ids: Vec<u64> = Vec::new();
    for line in body.lines() {
        let l: shared::protocol::replay::ReplayLine = serde_json::from_str(line).unwrap();
        if let shared::protocol::replay::ReplayLine::Trade { symbol, trades, .. } = l {
            if symbol == "BTC-USDT" {
                ids.extend(trades.iter().filter_map(|t| t.id.to_string().parse::<u64>().ok()));
            }
        }
    }
    let unique: std::collections::BTreeSet<u64> = ids.iter().copied().collect();
    assert!(ids.len() > 20 && unique.len() == ids.len(), "each trade once: {}", ids.len());
    let sorted: Vec<u64> = unique.into_iter().collect();
    assert!(sorted.windows(2).all(|w| w[1] == w[0] + 1), "no hole in the API's trade ids");
    let rec = c.gateway.config.record_dir();
    drop(leases);
    c.stop().await;
    let _ = std::fs::remove_dir_all(rec);
}
