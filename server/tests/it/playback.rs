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
    seen_of(server, &format!("{d}:spot:BTC/USDT")).await
}

async fn seen_of(server: &TestServer, instrument: &str) -> Seen {
    let s = status(server, instrument).0;
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
    // (not recording: the replay API reads this directory)
    c.record.dir = Some(dir.clone());
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
    replay_api(&played, &live[0]).await;
    trades_export(&played, &dir, &live[0]).await;
    played.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// `GET /api/v1/replay` streams the recording of OKX as normalized lines in receive order: its
/// connections, its books (with their sequence fields and checksums) and every trade the live
/// run kept; a range gives only its part; a bad request says what is wrong.
async fn replay_api(server: &TestServer, live: &Seen) {
    use shared::protocol::replay::ReplayLine;
    let lines = |body: &str| -> Vec<ReplayLine> {
        body.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    };
    let (status, body) =
        server.get("/api/v1/replay?source=okx&channels=book,trade,connection").await;
    assert_eq!(status, 200, "{body}");
    let all = lines(&body);
    let time = |l: &ReplayLine| l.time_ns();
    assert!(all.windows(2).all(|w| time(&w[0]) <= time(&w[1])), "receive order");
    let connected = all.iter().filter(|l| matches!(l, ReplayLine::Connection { .. })).count();
    assert!(connected >= 4, "connections opened and closed: {connected}");
    let books: Vec<_> = all
        .iter()
        .filter_map(|l| match l {
            ReplayLine::Book { symbol, snapshot, seq, checksum, .. } if symbol == "BTC-USDT" => {
                Some((*snapshot, *seq, *checksum))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        books.iter().filter(|b| b.0).count() as u64,
        live.counts.0,
        "a snapshot line for each snapshot the live book applied"
    );
    assert!(books.iter().all(|b| b.1.is_some() && b.2.is_some()), "seqId and checksum kept");
    let mut ids = std::collections::BTreeSet::new();
    for l in &all {
        if let ReplayLine::Trade { symbol, trades, .. } = l {
            if symbol == "BTC-USDT" {
                ids.extend(trades.iter().map(|t| t.id.to_string()));
            }
        }
    }
    for t in live.trades.as_array().unwrap() {
        assert!(ids.contains(t["id"].as_str().unwrap()), "live trade {t} in the replay");
    }
    assert!(!all.iter().any(|l| matches!(l, ReplayLine::Error { .. })), "no refused frame");
    // a range: only its part, and only the channels asked for
    let mid_ms = time(&all[all.len() / 2]) / 1_000_000;
    let (_, body) =
        server.get(&format!("/api/v1/replay?source=okx&from={mid_ms}&channels=trade")).await;
    let part = lines(&body);
    assert!(!part.is_empty() && part.len() < all.len(), "{} of {}", part.len(), all.len());
    assert!(part
        .iter()
        .all(|l| matches!(l, ReplayLine::Trade { .. }) && time(l) >= mid_ms * 1_000_000));
    for (query, status) in [
        ("source=okx&channels=orders", 400),
        ("source=..%2Fokx", 400),
        ("source=kraken", 404),
        ("channels=book", 400),
        ("source=okx&from=2&to=1", 400),
    ] {
        let (got, body) = server.get(&format!("/api/v1/replay?{query}")).await;
        assert_eq!(got, status, "{query}: {body}");
    }
}

/// `millrace export trades` and `GET /api/v1/export/trades` write OKX's recorded trades as
/// Parquet and CSV: read back by pyarrow and Python's csv module, every trade the live run kept
/// is there, equal (time, id, price, size, taker side), each once; the two ways give the same
/// rows. A bad request says what is wrong before any byte of a file.
async fn trades_export(server: &TestServer, dir: &std::path::Path, live: &Seen) {
    use shared::fixed::{Price, Qty};
    let script = r#"
import csv, json, sys, datetime
kind, path = sys.argv[1], sys.argv[2]
if kind == "parquet":
    import pyarrow.parquet as pq
    schema = pq.read_schema(path)
    # (`received` is ns: datetime holds µs, so it is left out of the rows here)
    t = pq.read_table(path, columns=["time", "id", "price", "qty", "taker"])
    rows = [[int(r["time"].timestamp() * 1000), r["id"], str(r["price"]), str(r["qty"]), r["taker"]] for r in t.to_pylist()]
    print(json.dumps({"schema": str(schema), "rows": rows}))
else:
    with open(path, newline="") as fh:
        r = list(csv.DictReader(fh))
    ms = lambda s: int(datetime.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp() * 1000)
    print(json.dumps({"rows": [[ms(x["time"]), x["id"], x["price"], x["qty"], x["taker"] or None] for x in r]}))
"#;
    let http = reqwest::Client::new();
    let mut exported = Vec::new();
    for format in ["parquet", "csv"] {
        let out = dir.join(format!("okx-trades.{format}"));
        let run = std::process::Command::new(millrace_bin())
            .args(["export", "trades", "--instrument", "okx:spot:BTC/USDT", "--format", format])
            .arg("--out")
            .arg(&out)
            .env("MILLRACE_RECORD__DIR", dir)
            .env("MILLRACE_DATA_DIR", dir.join("export-data"))
            .output()
            .unwrap();
        assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
        exported.push((format, out));
        let url = format!(
            "http://{}/api/v1/export/trades?instrument=okx:spot:BTC/USDT&format={format}",
            server.addr
        );
        let resp = http.get(&url).send().await.unwrap();
        assert_eq!(resp.status(), 200, "{url}");
        let ct = resp.headers()["content-type"].to_str().unwrap().to_string();
        assert!(ct.contains(if format == "csv" { "csv" } else { "parquet" }), "{ct}");
        let out = dir.join(format!("okx-trades-http.{format}"));
        std::fs::write(&out, resp.bytes().await.unwrap()).unwrap();
        exported.push((format, out));
    }
    let mut read_rows: Vec<serde_json::Value> = Vec::new();
    for (format, out) in &exported {
        let format = *format;
        let read = std::process::Command::new("python3")
            .args(["-c", script, format])
            .arg(out)
            .output()
            .expect("python3 (scripts/setup installs pyarrow)");
        assert!(read.status.success(), "python: {}", String::from_utf8_lossy(&read.stderr));
        let v: serde_json::Value = serde_json::from_slice(&read.stdout).unwrap();
        if format == "parquet" {
            let schema = v["schema"].as_str().unwrap();
            assert!(schema.contains("time: timestamp[ms, tz=UTC]"), "{schema}");
            assert!(schema.contains("price: decimal128(19, 8)"), "{schema}");
            assert!(schema.contains("received: timestamp[ns, tz=UTC]"), "{schema}");
        }
        let rows = v["rows"].as_array().unwrap();
        read_rows.push(v["rows"].clone());
        let mut ids = std::collections::HashSet::new();
        let by_id: std::collections::HashMap<String, &serde_json::Value> = rows
            .iter()
            .map(|r| {
                assert!(ids.insert(r[1].as_str().unwrap().to_string()), "{format}: {r} twice");
                (r[1].as_str().unwrap().to_string(), r)
            })
            .collect();
        let kept = live.trades.as_array().unwrap();
        assert!(rows.len() >= kept.len(), "{format}: {} rows, {} kept", rows.len(), kept.len());
        for t in kept {
            let r = by_id
                .get(t["id"].as_str().unwrap())
                .unwrap_or_else(|| panic!("{format}: live trade {t} not exported"));
            assert_eq!(r[0].as_i64(), t["time_ms"].as_i64(), "{format}: time of {t}");
            let p = |v: &serde_json::Value| Price::parse(v.as_str().unwrap()).unwrap();
            let q = |v: &serde_json::Value| Qty::parse(v.as_str().unwrap()).unwrap();
            assert_eq!((p(&r[2]), q(&r[3])), (p(&t["price"]), q(&t["qty"])), "{format}: {t}");
            assert_eq!(r[4].as_str(), t["taker"].as_str(), "{format}: side of {t}");
        }
    }
    // the CLI's file and the HTTP one hold the same rows, in each format
    assert_eq!(read_rows[0], read_rows[1], "parquet: CLI vs HTTP");
    assert_eq!(read_rows[2], read_rows[3], "csv: CLI vs HTTP");
    // a range: only its trades
    let all = read_rows[2].as_array().unwrap();
    let mid = all[all.len() / 2][0].as_i64().unwrap();
    let (status, body) = server
        .get(&format!("/api/v1/export/trades?instrument=okx:spot:BTC/USDT&format=csv&from={mid}"))
        .await;
    assert_eq!(status, 200, "{body}");
    let part = body.lines().count() - 1;
    let want = all.iter().filter(|r| r[0].as_i64().unwrap() >= mid).count();
    assert_eq!(part, want, "trades from {mid}");
    for (query, status) in [
        ("instrument=okx:spot:NOPE/USDT", 404),
        ("instrument=kraken:spot:BTC/USDT", 404),
        ("instrument=okx:futures:BTC/USDT", 404),
        ("instrument=nonsense", 400),
        ("format=csv", 400),
        ("instrument=okx:spot:BTC/USDT&format=xlsx", 400),
        ("instrument=okx:spot:BTC/USDT&from=2&to=1", 400),
        ("instrument=okx:spot:BTC/USDT&limit=5", 400),
    ] {
        let (got, body) = server.get(&format!("/api/v1/export/trades?{query}")).await;
        assert_eq!(got, status, "{query}: {body}");
        assert!(body.contains("\"msg\""), "{query}: {body}");
    }
    // an instrument the recording does not hold says so
    let run = std::process::Command::new(millrace_bin())
        .args(["export", "trades", "--instrument", "okx:spot:NOPE/USDT", "--out"])
        .arg(dir.join("nope.parquet"))
        .env("MILLRACE_RECORD__DIR", dir)
        .env("MILLRACE_DATA_DIR", dir.join("export-data"))
        .output()
        .unwrap();
    assert!(!run.status.success());
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(err.contains("lists no such instrument"), "{err}");
}

/// The simulator's own Binance-protocol source (`sim`), recorded with a lost depth diff and a
/// dropped connection, then played back as fast as possible: its streams are matched by their
/// URLs, its REST snapshots and gap fills by their requests, each in its recorded place among
/// the frames: the book syncs from them and finds the lost diff's gap, and its sync history,
/// the book it ends with, the stored minutes and the trades come out as the live run's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_binance_run_plays_back_to_the_same_book_candles_and_trades() {
    const BTC: &str = "sim:spot:BTC/USDT";
    let binance = |c: &mut Config| {
        c.depth.pinned = vec![BTC.into()];
        c.ingest.pinned = vec![BTC.into()];
        c.depth.verify_interval_ms = 0;
        c.ingest.stall_timeout_ms = 30_000;
    };
    async fn seen_binance(server: &TestServer) -> Seen {
        seen_of(server, BTC).await
    }
    let sim = start_sim(30.0, 79).await;
    let dir = temp_dir("playback-binance");
    let mut c = test_config(vec![external_sim_source(&sim)]);
    binance(&mut c);
    c.record.enabled = true;
    c.record.dir = Some(dir.clone());
    c.record.sources = vec!["sim".into()];
    let server = TestServer::start(c).await;
    let synced = || async {
        eventually("sim BTC synced", || async {
            let s = status(&server, BTC).0;
            (s.health == BookHealth::Synced).then_some(s.sync)
        })
        .await
    };
    let before = synced().await;
    sim.faults().apply(FaultCommand::Skip {
        target: StreamTarget::stream("btcusdt@depth@100ms"),
        count: 1,
    });
    eventually("resynced after the lost diff", || async {
        let s = status(&server, BTC).0;
        (s.health == BookHealth::Synced && s.sync.resyncs > before.resyncs).then_some(())
    })
    .await;
    sim.faults().apply(FaultCommand::Drop { symbol: Some("BTCUSDT".into()) });
    let db = server.db_path();
    eventually("three minutes stored", || async {
        (stored(&db, &format!("{BTC}:1m")).len() >= 3).then_some(())
    })
    .await;
    synced().await;
    sim.shutdown();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let live = seen_binance(&server).await;
    server.stop().await;
    assert!(live.counts.3 > 0, "the live run resynced: {live:?}");
    // checked offline, the recording holds the lost diff's gap and the snapshots that healed it
    let (_, book) = crate::recording::checked_offline(&dir);
    assert_eq!(book["synced"], true, "{book}");
    assert!(book["gaps"].as_u64() >= Some(1), "the lost diff: {book}");
    assert!(book["snapshots"].as_u64() >= Some(2), "{book}");

    let source = SourceConfig {
        name: "sim".into(),
        kind: SourceKind::Recording,
        dir: Some(dir.join("sim")),
        // as fast as possible: the player keeps the recorded order of the REST snapshot among
        // the diffs (a diff after the answers received before it, an answer after the diffs)
        speed: 0.0,
        ..SourceConfig::default()
    };
    let mut c = test_config(vec![source]);
    binance(&mut c);
    let played = TestServer::start(c).await;
    // the gap found, the minutes and the trades: as live, and the book synced from the
    // recorded snapshots and diffs
    let same = |p: &Seen| {
        p.counts.0 >= 1
            && p.counts.1 > 0
            && (p.counts.2, &p.trades, &p.candles) == (live.counts.2, &live.trades, &live.candles)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let p = seen_binance(&played).await;
        if same(&p) {
            break;
        }
        if std::time::Instant::now() > deadline {
            let report = played.get_json("/api/v1/ops/recording").await;
            assert_eq!(p, live, "played back vs live\n{report}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // once every recorded connection has played to its end (the lost diff, the drop, the
    // close of the simulator's shutdown), the book's whole history is the live run's: its
    // digest, and its snapshots, diffs applied, gaps, resyncs and stale diffs (the player keeps
    // each snapshot's place among the diffs: the job takes it before the frames after it)
    let report = eventually("every recorded connection played", || async {
        let report = played.get_json("/api/v1/ops/recording").await;
        let p = &report["playback"][0];
        (p["connections_finished"] == p["connections"]).then_some(report)
    })
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let p = seen_binance(&played).await;
        if p == live {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "played back vs live: {p:?}\n{live:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let p = &report["playback"][0];
    assert!(p["connections_played"].as_u64().unwrap() >= 3, "depth, trades, klines: {p}");
    assert_eq!(p["order_waits_given_up"], 0, "every recorded request was made again: {p}");
    assert!(p["rest_answered"].as_u64().unwrap() >= 3, "symbols, snapshots: {p}");
    played.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
