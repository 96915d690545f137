//! A recording as a live source (issue 30): a run of the simulator's OKX and Bybit with faults
//! injected (a lost message, a duplicate, the venue's reset, a dropped connection) is recorded,
//! then played back as fast as possible by a second server whose sources are that recording
//! (`kind = "recording"`). Through the same connector code, the played-back books go through
//! the same states frame for frame (the book digest of every message and its outcome), and the
//! stored closed candles and the trades equal the live run's.

use std::time::Duration;

use server::config::{Config, SourceConfig, SourceKind};
use shared::protocol::BookHealth;
use shared::venue::Dialect;
use sim::{FaultCommand, StreamTarget};
use testkit::*;

use crate::depth_faults::status;
use crate::venue_books::venue_sources;

const PLAYED: [Dialect; 2] = [Dialect::Okx, Dialect::Bybit];

fn pinned(c: &mut Config) {
    let btc: Vec<String> = PLAYED.iter().map(|d| format!("{d}:spot:BTC/USDT")).collect();
    c.depth.pinned = btc.clone();
    c.ingest.pinned = btc;
    // a verification's REST answer lands where the wall clock puts it: not part of the frames
    c.depth.verify_interval_ms = 0;
    c.ingest.reconnect_base_ms = 100;
    c.ingest.reconnect_cap_ms = 500;
    c.ingest.stall_timeout_ms = 30_000;
}

/// What one run showed of a venue's BTC: its book's counters and digest, its trades, its
/// stored minutes.
#[derive(Debug, PartialEq)]
struct Seen {
    digest: u64,
    counts: (u64, u64, u64, u64, u64, u64),
    trades: serde_json::Value,
    candles: Vec<(i64, String, String, String, String, String)>,
}

async fn seen(server: &TestServer, d: Dialect) -> Seen {
    let instrument = format!("{d}:spot:BTC/USDT");
    let s = status(server, &instrument).0;
    let y = &s.sync;
    let trades =
        server.get_json(&format!("/api/v1/trades?instrument={instrument}&limit=1000")).await;
    let candles = stored(&server.db_path(), &format!("{instrument}:1m"))
        .into_iter()
        .map(|c| {
            (
                c.open_time,
                c.open.to_string(),
                c.high.to_string(),
                c.low.to_string(),
                c.close.to_string(),
                c.volume.to_string(),
            )
        })
        .collect();
    Seen {
        digest: s.book_digest,
        counts: (
            y.snapshots_applied,
            y.deltas_applied,
            y.gaps,
            y.resyncs,
            y.checksums_verified,
            y.stale_dropped,
        ),
        trades: trades["trades"].clone(),
        candles,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_run_with_faults_plays_back_to_the_same_books_candles_and_trades() {
    let sim = start_sim(30.0, 73).await;
    let dir = temp_dir("playback");
    let mut c = test_config(venue_sources(&sim));
    pinned(&mut c);
    c.record.enabled = true;
    c.record.dir = Some(dir.clone());
    c.record.sources = PLAYED.iter().map(|d| d.as_str().to_string()).collect();
    let server = TestServer::start(c).await;
    let synced = |d: Dialect| {
        let server = &server;
        async move {
            eventually(&format!("{d} BTC synced"), || async {
                let s = status(server, &format!("{d}:spot:BTC/USDT")).0;
                (s.health == BookHealth::Synced).then_some(s.sync)
            })
            .await
        }
    };
    for d in PLAYED {
        synced(d).await;
    }
    // the faults: a lost book message and a duplicate (OKX), the venue's reset (Bybit), a
    // dropped connection (both)
    let book = |d: Dialect| {
        let name = if d == Dialect::Bybit { "BTCUSDT" } else { "BTC-USDT" };
        StreamTarget::stream(&format!("{d}:book:{name}"))
    };
    let before = synced(Dialect::Okx).await;
    sim.faults().apply(FaultCommand::Skip { target: book(Dialect::Okx), count: 1 });
    sim.faults().apply(FaultCommand::Reset { target: book(Dialect::Bybit), count: 1 });
    eventually("OKX resynced after its gap", || async {
        let s = status(&server, "okx:spot:BTC/USDT").0;
        (s.health == BookHealth::Synced && s.sync.resyncs > before.resyncs).then_some(())
    })
    .await;
    sim.faults().apply(FaultCommand::Duplicate { target: book(Dialect::Okx), count: 1 });
    tokio::time::sleep(Duration::from_millis(500)).await;
    sim.faults().apply(FaultCommand::Drop { symbol: Some("BTCUSDT".into()) });
    for d in PLAYED {
        let f = {
            let db = server.db_path();
            move || stored(&db, &format!("{d}:spot:BTC/USDT:1m"))
        };
        eventually(&format!("{d}: three minutes stored"), || async {
            (f().len() >= 3).then_some(())
        })
        .await;
        synced(d).await;
    }
    // the venue goes away: nothing more arrives, and what the jobs hold is final
    sim.shutdown();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut live = Vec::new();
    for d in PLAYED {
        live.push(seen(&server, d).await);
    }
    server.stop().await;
    for (d, l) in PLAYED.iter().zip(&live) {
        assert!(l.counts.2 > 0 || l.counts.3 > 0, "{d}: the live run saw its faults: {l:?}");
        assert!(l.trades.as_array().is_some_and(|t| !t.is_empty()), "{d}: trades");
    }

    // the recording, played back as the sources, as fast as possible
    let sources = PLAYED
        .iter()
        .map(|d| SourceConfig {
            name: d.as_str().into(),
            kind: SourceKind::Recording,
            dir: Some(dir.join(d.as_str())),
            speed: 0.0,
            ..SourceConfig::default()
        })
        .collect();
    let mut c = test_config(sources);
    pinned(&mut c);
    let played = TestServer::start(c).await;
    for (d, l) in PLAYED.iter().zip(&live) {
        let instrument = format!("{d}:spot:BTC/USDT");
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while status(&played, &instrument).0.book_digest != l.digest {
            if std::time::Instant::now() > deadline {
                let report = played.get_json("/api/v1/ops/recording").await;
                let p = seen(&played, *d).await;
                panic!(
                    "{d}: the played-back book never reached the live one's digest:\nlive {:?} {:?}\nplayed {:?} {:?}\n{report}",
                    l.counts, l.candles, p.counts, p.candles
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let p = eventually(&format!("{d}: the same minutes and trades"), || async {
            let p = seen(&played, *d).await;
            (p.candles.len() >= l.candles.len()).then_some(p)
        })
        .await;
        assert_eq!(&p, l, "{d}: played back vs live");
    }
    let report = played.get_json("/api/v1/ops/recording").await;
    let playback = report["playback"].as_array().expect("playback reports");
    assert_eq!(playback.len(), 2, "{report}");
    for p in playback {
        assert!(p["frames_played"].as_u64().unwrap() > 100, "{p}");
        // the instrument list at least (after the recording's end, a reconnecting job may ask
        // for what it holds no answer to)
        assert!(p["rest_answered"].as_u64().unwrap() >= 1, "{p}");
    }
    played.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
