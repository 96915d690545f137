//! The recorder (`[record]`, issue 30): a real server records every frame its venue sources
//! receive and send, with their connections, into hourly zstd files; read back offline, the
//! recording syncs the same books by each venue's rules. When the disk refuses the writes
//! (the hour's file is `/dev/full`), the recording counts what it lost and the live books go on.
//! The replay of a recording learns Kraken's precisions from the recorded instrument list (a REST
//! answer), as the live job does.

use std::time::Duration;

use server::config::Config;
use shared::protocol::BookHealth;
use shared::venue::Dialect;
use sim::SimHandle;
use testkit::*;

use crate::depth_faults::status;
use crate::venue_books::venue_sources;

fn config(sim: &SimHandle, dir: &std::path::Path) -> Config {
    let mut sources = vec![external_sim_source(sim)];
    sources.extend(venue_sources(sim));
    let mut c = test_config(sources);
    c.depth.pinned =
        ["okx", "kraken", "coinbase", "sim"].map(|v| format!("{v}:spot:BTC/USDT")).into();
    c.ingest.pinned = vec!["sim:spot:BTC/USDT".into()];
    c.record.enabled = true;
    c.record.dir = Some(dir.to_path_buf());
    c.record.sources = vec!["okx".into(), "kraken".into(), "coinbase".into(), "sim".into()];
    c
}

async fn synced(server: &TestServer, instrument: &str) {
    eventually(&format!("{instrument} synced"), || async {
        (status(server, instrument).0.health == BookHealth::Synced).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_frame_is_recorded_and_the_recording_syncs_the_same_books() {
    let sim = start_sim(5.0, 61).await;
    let dir = temp_dir("recording");
    let server = TestServer::start(config(&sim, &dir)).await;
    for v in ["okx", "kraken", "coinbase", "sim"] {
        synced(&server, &format!("{v}:spot:BTC/USDT")).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let live: Vec<u64> = ["okx", "kraken"]
        .iter()
        .map(|v| status(&server, &format!("{v}:spot:BTC/USDT")).0.sync.checksums_verified)
        .collect();
    let report = server.get_json("/api/v1/ops/recording").await;
    assert_eq!(report["enabled"], true, "{report}");
    assert_eq!(report["dropped_queue_full"], 0, "{report}");
    server.stop().await; // the writer writes what is queued
    sim.shutdown();

    // each venue's BTC book as read whole, for the command line's streamed reading below
    let mut venue_lines = Vec::new();
    for (d, live_verified) in
        [(Dialect::Okx, live[0]), (Dialect::Kraken, live[1]), (Dialect::Coinbase, 0)]
    {
        let source = d.as_str();
        let (files, connections, events) = replay::recording::read_source(&dir, source).unwrap();
        assert!(!files.is_empty(), "{source}: files");
        for f in &files {
            assert!(f.file.ends_with(".mrec.zst"), "{f:?}");
            assert_eq!(f.torn, None, "{f:?}");
        }
        let kinds =
            |k: &str| files.iter().map(|f| f.kinds.get(k).copied().unwrap_or(0)).sum::<u64>();
        assert!(
            kinds("connected") >= 1 && kinds("sent") >= 1 && kinds("received") > 10,
            "{files:?}"
        );
        let described = std::fs::read_to_string(dir.join(source).join("source.json")).unwrap();
        assert!(described.contains(&format!("\"dialect\":\"{source}\"")), "{described}");
        let reports = replay::venue::replay_events(d, connections, events).unwrap();
        let btc = reports.iter().find(|r| r.symbol.contains("BTC")).expect("the BTC book");
        venue_lines.push(serde_json::to_string(btc).unwrap());
        assert!(btc.ok, "{source}: {btc:?}");
        let book = btc.books.last().expect("a book");
        assert!(book.synced, "{source}: {book:?}");
        assert!(book.applied > 10, "{source}: {book:?}");
        // every checksum the live book verified is in the recording, and verifies again
        assert!(book.checksums_verified >= live_verified, "{source}: {book:?} vs {live_verified}");
        assert_eq!(book.checksums_failed, 0, "{source}: {book:?}");
    }
    // a Binance-protocol source's REST answers are recorded too: its symbol list and the
    // depth job's snapshot, each after its request
    let (files, _, events) = replay::recording::read_source(&dir, "sim").unwrap();
    let answered = |path: &str| {
        events.iter().any(|(_, _, _, e)| {
            matches!(e, replay::venue::RecordedEvent::RestAnswer { request, body }
                if request.contains(path) && !body.is_empty())
        })
    };
    assert!(answered("/api/v3/exchangeInfo"), "{files:?}");
    assert!(answered("/api/v3/depth?symbol=BTCUSDT"), "{files:?}");
    // and every one of its streams' frames: the depth diffs, the 1m klines, the trades
    for event in ["\"e\":\"depthUpdate\"", "\"e\":\"kline\"", "\"e\":\"aggTrade\""] {
        let received = events.iter().any(|(_, _, _, e)| {
            matches!(e, replay::venue::RecordedEvent::Received(t) if t.contains(event))
        });
        assert!(received, "no {event} frame recorded: {files:?}");
    }
    // the command line reads it the same way, and the Binance-protocol source's book too, from
    // its diffs and its REST snapshot
    let (text, sim_btc) = checked_offline(&dir);
    assert!(text.lines().any(|l| l.contains("\"file\"") && l.contains("okx")), "{text}");
    // reading as a stream (in receive order, holding only its disorder), it finds the same
    for line in &venue_lines {
        assert!(text.lines().any(|l| l == line), "{line} not in {text}");
    }
    assert_eq!(sim_btc["synced"], true, "{sim_btc}");
    assert!(sim_btc["snapshots"].as_u64() >= Some(1), "{sim_btc}");
    assert!(sim_btc["diffs_applied"].as_u64() > Some(5), "{sim_btc}");
    binance_recording_normalized(&dir);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `millrace replay recording DIR`, which must pass: its output, and its line of the BTCUSDT
/// book of a Binance-protocol source.
pub(crate) fn checked_offline(dir: &std::path::Path) -> (String, serde_json::Value) {
    let out = std::process::Command::new(millrace_bin())
        .args(["replay", "recording"])
        .arg(dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let book = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["symbol"] == "BTCUSDT" && v.get("diffs_applied").is_some())
        .unwrap_or_else(|| panic!("no BTCUSDT book in {text}"));
    (text, book)
}

/// A Binance-protocol recording reads back as normalized lines (what `GET /api/v1/replay`
/// streams), by the binance crate as the live jobs read it: the REST depth snapshot a book
/// line with its `lastUpdateId`, the diffs book lines that continue it (`prev_seq` = `U` − 1),
/// trades, candles, no error; and its trades export, by the symbol its `exchangeInfo` gave.
fn binance_recording_normalized(dir: &std::path::Path) {
    use shared::protocol::replay::ReplayLine;
    let channels = server::recorded::Channels::parse("book,trade,candle,ticker").unwrap();
    let mut lines = Vec::new();
    server::recorded::read(dir, "sim", None, None, channels, &mut |l| {
        lines.push(l);
        true
    })
    .unwrap();
    let errors: Vec<_> = lines.iter().filter(|l| matches!(l, ReplayLine::Error { .. })).collect();
    assert!(errors.is_empty(), "{errors:?}");
    let books: Vec<(bool, Option<u64>, Option<u64>)> = lines
        .iter()
        .filter_map(|l| match l {
            ReplayLine::Book { symbol, snapshot, seq, prev_seq, .. } if symbol == "BTCUSDT" => {
                Some((*snapshot, *seq, *prev_seq))
            }
            _ => None,
        })
        .collect();
    let snap = books.iter().position(|b| b.0).expect("the REST snapshot as a book line");
    let snap_id = books[snap].1.expect("its lastUpdateId");
    // the diffs continue it (received before or after it): one spans its id, then each follows
    // the one before
    let diffs: Vec<_> = books.iter().filter(|b| !b.0).collect();
    let spans = diffs
        .iter()
        .position(|b| b.2 <= Some(snap_id) && b.1 > Some(snap_id))
        .unwrap_or_else(|| panic!("no diff spans the snapshot's {snap_id}: {books:?}"));
    let chain = &diffs[spans..];
    assert!(chain.len() > 5, "{books:?}");
    for w in chain.windows(2) {
        assert_eq!(w[1].2, w[0].1, "consecutive diffs: {books:?}");
    }
    let trades = lines.iter().filter(|l| matches!(l, ReplayLine::Trade { .. })).count();
    let candles = lines.iter().filter(|l| matches!(l, ReplayLine::Candle { .. })).count();
    assert!(trades > 0 && candles > 0, "{trades} trades, {candles} candles");
    let instrument = "sim:spot:BTC/USDT".parse().unwrap();
    let range = server::export::ExportRange {
        from: 0,
        to: i64::MAX,
        max_rows: u64::MAX,
        format: server::export::Format::Csv,
    };
    let (rows, csv) =
        server::export::trades(&[dir.to_path_buf()], &instrument, range, Vec::new()).unwrap();
    let csv = String::from_utf8(csv).unwrap();
    assert!(rows > 0 && csv.lines().count() as u64 == rows + 1, "{rows}: {csv}");
    let ids: std::collections::HashSet<&str> =
        csv.lines().skip(1).map(|l| l.split(',').nth(1).unwrap()).collect();
    assert_eq!(ids.len() as u64, rows, "each trade once");
}

/// The disk refuses the recording's writes: the recorder counts the frames it lost and the
/// failed writes, and the live books are untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_stops_the_recording_not_the_books() {
    let sim = start_sim(5.0, 67).await;
    let dir = temp_dir("recording-full");
    // the hour's file of okx, now and in the next hour, is /dev/full: every write fails (ENOSPC)
    let now_ns = i64::try_from(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos(),
    )
    .unwrap();
    for t in [now_ns, now_ns + 3_600_000_000_000] {
        let path = recording::file_path(&dir, "okx", t).unwrap();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink("/dev/full", &path).unwrap();
    }
    let server = TestServer::start(config(&sim, &dir)).await;
    synced(&server, "okx:spot:BTC/USDT").await;
    let report = eventually("the failed writes counted", || async {
        let r = server.get_json("/api/v1/ops/recording").await;
        (r["write_errors"].as_u64()? > 0 && r["dropped_write_failed"].as_u64()? > 0).then_some(r)
    })
    .await;
    // the error names the file that could not be written
    assert!(report["last_error"].as_str().is_some_and(|e| e.contains(".mrec.zst")), "{report}");
    // the books go on: synced, moving, while the recording of okx keeps failing
    let before = status(&server, "okx:spot:BTC/USDT").0.sync.deltas_applied;
    eventually("okx's book moving on", || async {
        let (s, _) = status(&server, "okx:spot:BTC/USDT");
        (s.health == BookHealth::Synced && s.sync.deltas_applied > before + 10).then_some(())
    })
    .await;
    // the other sources are still recorded
    let (_, m) = server.get("/metrics").await;
    assert!(m.contains("millrace_recording_write_errors_total"), "{m}");
    let recorded = report["recorded"].as_u64().unwrap();
    eventually("kraken and coinbase still recorded", || async {
        let r = server.get_json("/api/v1/ops/recording").await;
        (r["recorded"].as_u64()? > recorded).then_some(())
    })
    .await;
    server.stop().await;
    sim.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}
