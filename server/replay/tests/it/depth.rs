//! `replay depth` on the real Binance captures in testdata/binance-ws: the known facts of
//! testdata/README.md hold through millrace's own sync machine, and a damaged capture is
//! caught.

use std::io::Write as _;
use std::path::PathBuf;

use replay::depth::{replay, run, DepthArgs, DepthReport};
use replay::input::testdata_dir as data_dir;
use shared::venue::Dialect;

fn cf(name: &str) -> PathBuf {
    data_dir().join("binance-ws/cryptofeed").join(name)
}

fn hft(name: &str) -> PathBuf {
    data_dir().join("binance-ws/hftbacktest").join(name)
}

fn total(reports: &[DepthReport], f: impl Fn(&DepthReport) -> u64) -> u64 {
    reports.iter().map(f).sum()
}

#[test]
fn spot_capture_syncs_without_gaps_and_matches_all_26_tickers() {
    let reports = replay(&[cf("BINANCE.http.0.0"), cf("BINANCE.ws.1.0")]).unwrap();
    let symbols: Vec<_> = reports.iter().map(|r| r.symbol.as_str()).collect();
    assert_eq!(symbols, ["BLZETH", "LRCBTC", "NKNUSDT", "RUNEEUR"]);
    for r in &reports {
        assert_eq!(r.market, "spot");
        assert!(r.synced, "{r:?}");
        assert_eq!(r.gaps, 0, "{r:?}");
        assert_eq!(r.crossed, 0, "{r:?}");
        assert!(r.ok());
    }
    assert_eq!(total(&reports, |r| r.diffs), 177, "177 depthUpdate messages in the capture");
    assert_eq!(total(&reports, |r| r.ticker_checks), 26);
    assert_eq!(total(&reports, |r| r.ticker_mismatches), 0);
}

#[test]
fn futures_capture_uses_pu_and_matches_all_50_tickers() {
    let reports = replay(&[cf("BINANCE_FUTURES.http.0.0"), cf("BINANCE_FUTURES.ws.1.0")]).unwrap();
    assert_eq!(reports.len(), 4);
    for r in &reports {
        assert_eq!(r.market, "futures", "{r:?}");
        assert!(r.ok(), "{r:?}");
    }
    assert_eq!(total(&reports, |r| r.diffs), 764);
    assert_eq!(total(&reports, |r| r.ticker_checks), 50);
    assert_eq!(total(&reports, |r| r.ticker_mismatches), 0);
    assert_eq!(total(&reports, |r| r.gaps), 0);
}

#[test]
fn hftbacktest_files_are_one_stream_6468_diffs_1056_tickers() {
    let reports =
        replay(&[hft("spot_ethusdt_20240808.gz"), hft("spot_ethusdt_20240809.gz")]).unwrap();
    assert_eq!(reports.len(), 1);
    let r = &reports[0];
    assert_eq!(r.symbol, "ETHUSDT");
    assert_eq!(r.market, "spot");
    assert_eq!(r.diffs_applied, 6468);
    assert_eq!(r.gaps, 0);
    assert_eq!(r.ticker_checks, 1056);
    assert_eq!(r.ticker_mismatches, 0);
    assert_eq!(r.crossed, 0);
    assert!(r.ok());
}

#[test]
fn run_prints_one_json_line_per_symbol() {
    let mut out = Vec::new();
    let ok = run(
        &DepthArgs {
            files: vec![cf("BINANCE.http.0.0"), cf("BINANCE.ws.1.0")],
            venue: Dialect::Binance,
        },
        &mut out,
    )
    .unwrap();
    assert!(ok);
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<serde_json::Value> =
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 4);
    for key in [
        "symbol",
        "market",
        "diffs_applied",
        "stale_dropped",
        "gaps",
        "resyncs",
        "ticker_checks",
        "ticker_mismatches",
        "crossed",
    ] {
        assert!(lines[0].get(key).is_some(), "missing {key}");
    }
}

fn temp(name: &str, content: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("millrace-depth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::File::create(&p).unwrap().write_all(content.as_bytes()).unwrap();
    p
}

/// Removing one diff from a real capture must be caught as a gap and fail the run.
#[test]
fn a_missing_diff_is_a_gap_and_fails() {
    let ws = std::fs::read_to_string(cf("BINANCE_FUTURES.ws.1.0")).unwrap();
    let mut removed = false;
    let damaged: String = ws
        .lines()
        .filter(|l| {
            // drop the 100th SUSHIUSDT diff (well after its snapshot)
            if !removed && l.contains("\"sushiusdt@depth@100ms\"") {
                static COUNT: std::sync::atomic::AtomicUsize =
                    std::sync::atomic::AtomicUsize::new(0);
                if COUNT.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 100 {
                    removed = true;
                    return false;
                }
            }
            true
        })
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(removed);
    let ws_path = temp("BINANCE_FUTURES.ws.1.0", &damaged);
    let reports = replay(&[cf("BINANCE_FUTURES.http.0.0"), ws_path.clone()]).unwrap();
    let sushi = reports.iter().find(|r| r.symbol == "SUSHIUSDT").unwrap();
    assert_eq!(sushi.gaps, 1, "{sushi:?}");
    assert!(!sushi.synced, "no second snapshot in the file: the book must not claim to be synced");
    assert!(!sushi.ok());
    let mut out = Vec::new();
    assert!(!run(
        &DepthArgs {
            files: vec![cf("BINANCE_FUTURES.http.0.0"), ws_path],
            venue: Dialect::Binance
        },
        &mut out
    )
    .unwrap());
}

/// A ticker that disagrees with the book is counted as a mismatch.
#[test]
fn a_wrong_ticker_is_a_mismatch() {
    let ws = std::fs::read_to_string(cf("BINANCE.ws.1.0")).unwrap();
    // NKNUSDT's tickers: prefix a 9 to every best-bid quantity
    let damaged: String = ws
        .lines()
        .map(|l| {
            if l.contains("nknusdt@bookTicker") {
                l.replace("\"B\":\"", "\"B\":\"9")
            } else {
                l.to_string()
            }
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let ws_path = temp("BINANCE.ws.1.0", &damaged);
    let reports = replay(&[cf("BINANCE.http.0.0"), ws_path]).unwrap();
    let nkn = reports.iter().find(|r| r.symbol == "NKNUSDT").unwrap();
    assert_eq!(nkn.ticker_checks, 19);
    assert!(nkn.ticker_mismatches > 0, "{nkn:?}");
    assert!(nkn.first_mismatch.is_some());
}

#[test]
fn bad_files_name_file_and_line() {
    let p = temp("bad.ws.1.0", "wss://x <-> 1\n1.5: {\"stream\":\"abc@depth@100ms\",\"data\":{\"e\":\"depthUpdate\",\"s\":\"ABC\",\"U\":1,\"u\":2,\"b\":[[\"1.x\",\"1\"]],\"a\":[]}}\n");
    let e = replay(std::slice::from_ref(&p)).unwrap_err().to_string();
    assert!(e.contains("bad.ws.1.0:2") && e.contains("bad price"), "{e}");
    let p = temp(
        "trunc.ws.1.0",
        "wss://x <-> 1\n1.5: {\"stream\":\"abc@depth@100ms\",\"data\":{\"e\":\"depthUp",
    );
    let e = replay(&[p]).unwrap_err().to_string();
    assert!(e.contains("trunc.ws.1.0:2") && e.contains("invalid JSON"), "{e}");
    let e = replay(&[PathBuf::from("/nonexistent/x.gz")]).unwrap_err().to_string();
    assert!(e.contains("/nonexistent/x.gz"), "{e}");
}

/// The files are read as a stream in receive order, not loaded and sorted: named in either
/// order, or with neighbouring lines written out of time order, the capture gives the same
/// books; a snapshot that names no symbol in a file of two symbols is an error naming its line.
#[test]
fn files_in_any_order_and_lines_out_of_order_give_the_same_books() {
    use std::io::BufRead as _;
    let files = [hft("spot_ethusdt_20240808.gz"), hft("spot_ethusdt_20240809.gz")];
    let want = replay(&files).unwrap();
    assert_eq!(want[0].diffs_applied, 6468);
    assert_eq!(replay(&[files[1].clone(), files[0].clone()]).unwrap(), want);
    let time = |l: &str| l.split_once(' ').map(|(t, _)| t.parse::<i128>().unwrap());
    let mut swapped = 0;
    let mut shuffled = Vec::new();
    for path in &files {
        let mut lines: Vec<String> =
            replay::input::open(path).unwrap().lines().map(Result::unwrap).collect();
        // swap each pair of neighbours with different times: every second line out of order
        for pair in lines.chunks_mut(2) {
            if let [a, b] = pair {
                if time(a) < time(b) {
                    std::mem::swap(a, b);
                    swapped += 1;
                }
            }
        }
        let name = path.file_name().unwrap().to_string_lossy().replace(".gz", ".swapped");
        shuffled.push(temp(&name, &(lines.join("\n") + "\n")));
    }
    assert!(swapped > 3000, "{swapped}");
    assert_eq!(replay(&shuffled).unwrap(), want);

    let diff = |s: &str, u: u64| {
        format!(
            "{u} {{\"stream\":\"{l}@depth@100ms\",\"data\":{{\"e\":\"depthUpdate\",\"E\":1,\"s\":\"{s}\",\"U\":{u},\"u\":{u},\"b\":[],\"a\":[]}}}}",
            l = s.to_lowercase()
        )
    };
    let snapshot = "5 {\"lastUpdateId\":1,\"bids\":[],\"asks\":[]}";
    let two = temp(
        "two_symbols.hft",
        &format!("{}\n{}\n{snapshot}\n", diff("ETHUSDT", 3), diff("BTCUSDT", 4)),
    );
    let e = replay(&[two]).unwrap_err().to_string();
    assert!(
        e.contains("two_symbols.hft:3") && e.contains("streams 2 symbols (ETHUSDT, BTCUSDT)"),
        "{e}"
    );
}
