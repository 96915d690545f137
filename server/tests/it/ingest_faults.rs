//! End to end against the simulator with faults: after dropped connections, skipped, duplicated,
//! reordered and malformed messages, a stalled stream and failing / rate-limited REST calls,
//! the stored 1m candles equal the simulator's own closed klines exactly (none missing, none
//! duplicated), and every stored derived candle is the merge of the stored 1m candles of its
//! bucket.

use std::time::Duration;

use shared::candle::{merge, Candle, Timeframe};
use sim::{StreamClass, StreamTarget};
use testkit::*;

/// Checks one instrument's stored series against the simulator's oracle.
fn check_instrument(
    db: &std::path::Path,
    sim: &sim::SimHandle,
    instrument: &str,
    symbol: &str,
) -> usize {
    let m1 = stored(db, &format!("{instrument}:1m"));
    assert!(m1.len() >= 30, "{instrument}: only {} candles stored", m1.len());
    for w in m1.windows(2) {
        assert_eq!(
            w[1].open_time - w[0].open_time,
            60_000,
            "{instrument}: hole or duplicate after {}",
            w[0].open_time
        );
    }
    let (first, last) = (m1[0].open_time, m1[m1.len() - 1].open_time);
    let oracle = sim.closed_klines(symbol, first, last);
    assert_eq!(
        oracle.len(),
        m1.len(),
        "{instrument}: oracle has {} candles in the range",
        oracle.len()
    );
    for (got, want) in m1.iter().zip(&oracle) {
        assert_eq!(got, want, "{instrument}: stored candle differs from the exchange's");
    }
    for tf in [Timeframe::M3, Timeframe::M5, Timeframe::M15, Timeframe::H1] {
        let derived = stored(db, &format!("{instrument}:{tf}"));
        let dur = tf.duration_ms();
        // Every bucket that ended inside the stored range has its candle.
        let mut bucket = tf.bucket_open(first);
        while bucket + dur - 60_000 <= last {
            if bucket >= first {
                assert!(
                    derived.iter().any(|c| c.open_time == bucket),
                    "{instrument} {tf}: no candle for bucket {bucket}"
                );
            }
            bucket += dur;
        }
        for d in &derived {
            let minutes: Vec<Candle> = m1
                .iter()
                .filter(|c| c.open_time >= d.open_time && c.open_time < d.open_time + dur)
                .copied()
                .collect();
            assert_eq!(
                Some(*d),
                merge(tf, &minutes),
                "{instrument} {tf} {}: not the merge of its stored minutes",
                d.open_time
            );
        }
    }
    m1.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_candles_equal_the_exchange_after_faults() {
    // A simulated minute every 100 ms, so outages span minutes and REST has to fill them.
    let sim = start_sim(600.0, 11).await;
    let mut config = test_config(vec![external_sim_source(&sim)]);
    config.ingest.pinned = vec!["sim:spot:BTC/USDT".into(), "sim:spot:ETH/USDT".into()];
    config.ingest.flush_ms = 50;
    config.ingest.stall_timeout_ms = 1500;
    let server = TestServer::start(config).await;
    let db = server.db_path();
    eventually("first candles stored", || async {
        let rows = server.get_json("/api/v1/klines?series=sim:spot:BTC/USDT:1m").await;
        (rows.as_array().unwrap().len() >= 3).then_some(())
    })
    .await;

    let faults = sim.faults();
    let klines = || StreamTarget::kind(StreamClass::Kline);
    let round = Duration::from_millis(700);
    faults.drop_connections(None);
    tokio::time::sleep(round).await;
    faults.skip(klines(), 6);
    tokio::time::sleep(round).await;
    faults.duplicate(klines(), 6);
    tokio::time::sleep(round).await;
    faults.malformed(klines(), 3);
    tokio::time::sleep(round).await;
    faults.fail_rest(2, 500, Some("/api/v3/klines"), None);
    faults.drop_connections(None);
    tokio::time::sleep(round).await;
    faults.fail_rest(1, 429, None, Some(1));
    faults.drop_connections(Some("ETHUSDT"));
    tokio::time::sleep(round * 2).await;
    faults.reorder(klines(), 6);
    tokio::time::sleep(round).await;
    faults.stall(klines().for_symbol("BTCUSDT"), Duration::from_millis(2500));
    tokio::time::sleep(Duration::from_secs(4)).await;
    faults.skip(klines(), 4);
    faults.drop_connections(None);
    tokio::time::sleep(round * 2).await;

    let jobs = server.get_json("/api/v1/ops/jobs").await;
    server.stop().await;
    let c = faults.counters();
    assert!(c.skipped > 0 && c.duplicated > 0 && c.reordered > 0 && c.malformed > 0, "{c:?}");
    assert!(c.connections_dropped >= 3 && c.rest_failed + c.rate_limited >= 2, "{c:?}");
    for j in jobs["jobs"].as_array().unwrap() {
        assert!(j["crashes"].as_u64().unwrap() >= 3, "{j}");
        assert!(j["gap_filled_candles"].as_u64().unwrap() > 0, "REST never filled a gap: {j}");
    }
    let malformed: u64 =
        jobs["jobs"].as_array().unwrap().iter().map(|j| j["malformed"].as_u64().unwrap()).sum();
    assert!(malformed > 0, "malformed frames were not counted: {jobs}");
    let n = check_instrument(&db, &sim, "sim:spot:BTC/USDT", "BTCUSDT");
    let m = check_instrument(&db, &sim, "sim:spot:ETH/USDT", "ETHUSDT");
    eprintln!("checked {n} BTC and {m} ETH minutes against the exchange");
    sim.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planned_reconnects_leave_no_gap() {
    // Binance closes connections at 24 h; millrace reconnects before that. Here every second.
    let sim = start_sim(600.0, 12).await;
    let mut config = test_config(vec![external_sim_source(&sim)]);
    config.ingest.pinned = vec!["sim:spot:SOL/USDT".into()];
    config.ingest.planned_reconnect_after_s = 1;
    let server = TestServer::start(config).await;
    let db = server.db_path();
    let job = eventually("five planned reconnects", || async {
        let jobs = server.get_json("/api/v1/ops/jobs").await;
        let j = jobs["jobs"][0].clone();
        (j["connects"].as_u64().unwrap_or(0) >= 5).then_some(j)
    })
    .await;
    server.stop().await;
    assert_eq!(job["crashes"], 0, "a planned reconnect is not a crash: {job}");
    let n = check_instrument(&db, &sim, "sim:spot:SOL/USDT", "SOLUSDT");
    eprintln!("{n} minutes across {} connections", job["connects"]);
    sim.shutdown();
}
