//! `replay depth --venue` on captures of OKX, Bybit, Coinbase and Kraken.
//!
//! - `tests/fixtures/venues/*.capture.gz`: recordings of live sessions against the simulator's
//!   dialects, with faults injected (made by `server/sim/tests/it/venues.rs` with
//!   `MILLRACE_WRITE_VENUE_FIXTURES=1`; simulated markets, not real data). Each was synced live by
//!   the same machines; the facts below are what that session saw.
//! - Captures written here from the venues' documented examples: an OKX book from before
//!   `seqId` (its checksum example strings) and a Kraken v1 book (its v2 checksum example book,
//!   printed the v1 way).

use std::path::{Path, PathBuf};

use replay::venue::{replay, run, VenueReport};
use shared::venue::Dialect;

fn fixture(venue: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/venues/{venue}.capture.gz"))
}

fn report<'a>(reports: &'a [VenueReport], symbol: &str) -> &'a VenueReport {
    reports
        .iter()
        .find(|r| r.symbol == symbol)
        .unwrap_or_else(|| panic!("no {symbol} in {reports:?}"))
}

#[test]
fn okx_recording_shows_each_fault_and_its_resync() {
    let reports = replay(Dialect::Okx, &[fixture("okx")]).unwrap();
    let btc = report(&reports, "BTC-USDT");
    let b = &btc.books[0];
    assert!(b.synced, "{btc:?}");
    // the injected skip, wrong checksum, reset and duplicate, then the dropped connection
    assert_eq!((b.gaps, b.checksums_failed, b.sequence_resets), (1, 1, 1), "{btc:?}");
    assert!(b.stale_dropped >= 1, "{btc:?}");
    assert_eq!(b.resyncs, 3, "the gap, the checksum and the reconnection: {btc:?}");
    assert!(b.checksums_verified > 100, "{btc:?}");
    assert!(!btc.ok, "a failed checksum is reported");
    let eth = report(&reports, "ETH-USDT");
    assert!(eth.ok, "{eth:?}");
    assert_eq!((eth.books[0].gaps, eth.books[0].checksums_failed), (0, 0));
    for r in &reports {
        assert!(r.trades.candles_compared >= 5, "{r:?}");
        assert_eq!(
            r.trades.candle_mismatches, 0,
            "trades fold into the venue's own candles: {r:?}"
        );
    }
}

#[test]
fn bybit_recording_links_tickers_by_cross_sequence() {
    let reports = replay(Dialect::Bybit, &[fixture("bybit")]).unwrap();
    for r in &reports {
        let b = &r.books[0];
        assert!(r.ok, "{r:?}");
        assert_eq!(b.depth, Some(50));
        assert!(b.ticker_checks > 20 && b.ticker_mismatches == 0, "{r:?}");
        assert!(r.trades.candles_compared >= 5 && r.trades.candle_mismatches == 0, "{r:?}");
    }
    let b = &report(&reports, "BTCUSDT").books[0];
    assert_eq!((b.gaps, b.sequence_resets), (1, 1), "{b:?}");
}

#[test]
fn coinbase_recording_resyncs_every_book_of_a_connection_after_a_lost_message() {
    let reports = replay(Dialect::Coinbase, &[fixture("coinbase")]).unwrap();
    assert_eq!(reports.len(), 2);
    for r in &reports {
        assert!(r.ok, "{r:?}");
        assert_eq!(r.books[0].gaps, 1, "a lost message could be any book's: {r:?}");
    }
}

#[test]
fn kraken_recording_is_proven_by_checksums_with_the_captured_precisions() {
    let reports = replay(Dialect::Kraken, &[fixture("kraken")]).unwrap();
    let b = &report(&reports, "BTC/USDT").books[0];
    assert_eq!(b.checksums_failed, 2, "the skipped update and the wrong checksum: {b:?}");
    assert_eq!(b.checksums_unchecked, 0, "{b:?}");
    for r in &reports {
        assert!(r.books[0].synced && r.books[0].checksums_verified > 50, "{r:?}");
        assert_eq!(r.books[0].depth, Some(10));
        assert!(r.trades.candles_compared >= 5 && r.trades.candle_mismatches == 0, "{r:?}");
    }
}

fn write(name: &str, lines: &[&str]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("millrace-replay-venue-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, lines.join("\n")).unwrap();
    path
}

/// OKX's documented book (its checksum example), as a capture from before `seqId`: the book is
/// proven by its checksums alone, and the report says so. The checksums are CRC-32s of the
/// docs' strings, computed with Python's zlib, not by this code.
#[test]
fn an_okx_capture_without_seq_id_syncs_on_checksums_alone() {
    let path = write(
        "okx-old.capture",
        &[
            "wss://ws.okx.com:8443/ws/v5/public <-> 1597026383.000",
            r#"wss://ws.okx.com:8443/ws/v5/public <- 1597026383.001: {"op":"subscribe","args":[{"channel":"books","instId":"BTC-USDT"}]}"#,
            r#"1597026383.100: {"arg":{"channel":"books","instId":"BTC-USDT"},"action":"snapshot","data":[{"asks":[["3366.8","9","10","3"],["3368","8","0","2"]],"bids":[["3366.1","7","0","3"],["3366","6","3","4"]],"ts":"1597026383085","checksum":-1881014294}]}"#,
            r#"1597026383.200: {"arg":{"channel":"books","instId":"BTC-USDT"},"action":"update","data":[{"asks":[["3372","8","0","1"]],"bids":[["3366","0","0","0"]],"ts":"1597026383185","checksum":831078360}]}"#,
        ],
    );
    let reports = replay(Dialect::Okx, &[path]).unwrap();
    let r = &reports[0];
    assert!(r.ok, "{r:?}");
    assert_eq!(r.books[0].checksums_verified, 2);
    assert!(r.notes.iter().any(|n| n.contains("checksums alone")), "{r:?}");
}

/// Kraken's documented checksum book (v2 guide, CRC 3310070434), printed the v1 way: strings
/// with the pair's places. A v1 snapshot carries no checksum; the republish update after it
/// carries the book's. The precisions are learnt from the strings.
#[test]
fn a_kraken_v1_capture_learns_the_precisions_from_its_strings() {
    let asks = r#"[["45285.2","0.00100000","1"],["45286.4","1.54571953","1"],["45286.6","1.54571109","1"],["45289.6","1.54560911","1"],["45290.2","0.15890660","1"],["45291.8","1.54553491","1"],["45294.7","0.04454749","1"],["45296.1","0.35380000","1"],["45297.5","0.09945542","1"],["45299.5","0.18772827","1"]]"#;
    let bids = r#"[["45283.5","0.10000000","1"],["45283.4","1.54582015","1"],["45282.1","0.10000000","1"],["45281.0","0.10000000","1"],["45280.3","1.54592586","1"],["45279.0","0.07990000","1"],["45277.6","0.03310103","1"],["45277.5","0.30000000","1"],["45277.3","1.54602737","1"],["45276.6","0.15445238","1"]]"#;
    let snapshot =
        format!(r#"1700000000.100: [336,{{"as":{asks},"bs":{bids}}},"book-10","XBT/USD"]"#);
    let republish = r#"1700000000.200: [336,{"a":[["45285.2","0.00100000","1700000000.150","r"]],"c":"3310070434"},"book-10","XBT/USD"]"#;
    let path = write(
        "kraken-v1.capture",
        &["wss://ws.kraken.com <-> 1700000000.000", &snapshot, republish],
    );
    let reports = replay(Dialect::Kraken, &[path]).unwrap();
    let r = &reports[0];
    assert_eq!(r.symbol, "XBT/USD");
    assert!(r.ok, "{r:?}");
    assert_eq!((r.books[0].checksums_verified, r.books[0].depth), (1, Some(10)), "{r:?}");
}

#[test]
fn the_report_is_one_json_line_per_instrument_and_a_broken_frame_is_counted() {
    let path = write(
        "okx-broken.capture",
        &[
            r#"1597026383.100: {"arg":{"channel":"books","instId":"BTC-USDT"},"action":"snapshot","data":[{"asks":[["3366.8","9","10","3"]],"bids":[["3366.1","7","0","3"]],"ts":"1597026383085","checksum":0,"prevSeqId":-1,"seqId":5}]}"#,
            r#"1597026383.200: {"arg":{"channel":"books","#,
        ],
    );
    let mut out = Vec::new();
    assert!(run(Dialect::Okx, &[path], &mut out).unwrap());
    let text = String::from_utf8(out).unwrap();
    assert_eq!(text.lines().count(), 1);
    let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(v["bad_frames"], 1);
    assert_eq!(v["books"][0]["checksums_unchecked"], 1, "OKX's checksum is 0 since June 2026");
}
