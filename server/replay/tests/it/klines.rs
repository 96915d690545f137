//! `millrace replay klines` on real Binance archives (`testdata/klines`): the merged daily
//! candles equal Binance's published 1d candles, every input form gives the same answer, and bad
//! input is an error naming the file and line.

use std::path::PathBuf;

use replay::klines::{run, KlinesArgs};
use shared::candle::{merge, Candle, Timeframe};
use shared::{Price, Volume};

const DAY1: i64 = 1_577_836_800_000; // 2020-01-01T00:00:00Z
const DAY2: i64 = 1_577_923_200_000; // 2020-01-02T00:00:00Z

fn day_file(day: u32, ext: &str) -> PathBuf {
    replay::input::testdata_dir()
        .join(format!("klines/binance-spot-BTCUSDT-1m/BTCUSDT-1m-2020-01-{day:02}.{ext}"))
}

fn zips() -> Vec<PathBuf> {
    vec![day_file(1, "zip"), day_file(2, "zip")]
}

fn csvs() -> Vec<PathBuf> {
    vec![day_file(1, "csv"), day_file(2, "csv")]
}

/// Runs the replay and returns its raw output.
fn replay_raw(tf: Timeframe, files: &[PathBuf]) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    let ok = run(&KlinesArgs { tf, files: files.to_vec() }, &mut out)?;
    assert!(ok, "replay reported a failed check");
    Ok(out)
}

/// Parses the replay's CSV back into fixed-point candles. The CSV has no minute count, so
/// `minutes` is 0 in every parsed candle.
fn parse_output(out: &[u8]) -> Vec<Candle> {
    let text = std::str::from_utf8(out).expect("UTF-8 output");
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("open_time,open,high,low,close,volume,trades"));
    lines
        .map(|line| {
            let f: Vec<&str> = line.split(',').collect();
            assert_eq!(f.len(), 7, "{line}");
            Candle {
                open_time: f[0].parse().unwrap(),
                open: Price::parse(f[1]).unwrap(),
                high: Price::parse(f[2]).unwrap(),
                low: Price::parse(f[3]).unwrap(),
                close: Price::parse(f[4]).unwrap(),
                volume: Volume::parse(f[5]).unwrap(),
                trades: f[6].parse().unwrap(),
                minutes: 0,
            }
        })
        .collect()
}

fn replay(tf: Timeframe, files: &[PathBuf]) -> Vec<Candle> {
    parse_output(&replay_raw(tf, files).unwrap())
}

fn p(s: &str) -> Price {
    Price::parse(s).unwrap()
}

fn v(s: &str) -> Volume {
    Volume::parse(s).unwrap()
}

/// Trades of one day summed straight from the CSV's ninth column (an independent check).
fn csv_trades(day: u32) -> u64 {
    std::fs::read_to_string(day_file(day, "csv"))
        .unwrap()
        .lines()
        .map(|l| l.split(',').nth(8).unwrap().parse::<u64>().unwrap())
        .sum()
}

/// A temporary file removed on drop.
struct Temp(PathBuf);

impl Temp {
    fn new(name: &str, contents: &str) -> Temp {
        let path =
            std::env::temp_dir().join(format!("millrace-klines-{}-{name}", std::process::id()));
        std::fs::write(&path, contents).unwrap();
        Temp(path)
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn day1_lines() -> Vec<String> {
    std::fs::read_to_string(day_file(1, "csv")).unwrap().lines().map(str::to_string).collect()
}

#[test]
fn daily_candles_equal_binance_published_1d() {
    let days = replay(Timeframe::D1, &zips());
    assert_eq!(days.len(), 2);
    let d1 = days[0];
    assert_eq!(d1.open_time, DAY1);
    assert_eq!(
        (d1.open, d1.high, d1.low, d1.close),
        (p("7195.24"), p("7255.00"), p("7175.15"), p("7200.85"))
    );
    assert_eq!(d1.volume, v("16792.388165"));
    assert_eq!(d1.trades, 194_010);
    let d2 = days[1];
    assert_eq!(d2.open_time, DAY2);
    assert_eq!(
        (d2.open, d2.high, d2.low, d2.close),
        (p("7200.77"), p("7212.50"), p("6924.74"), p("6965.71"))
    );
    assert_eq!(d2.volume, v("31951.483932"));
    assert_eq!(d2.trades, csv_trades(2));
    assert_eq!(d1.trades, csv_trades(1));
}

#[test]
fn zip_and_csv_give_identical_output() {
    for tf in [Timeframe::D1, Timeframe::H1, Timeframe::M1, Timeframe::M5] {
        let from_zip = replay_raw(tf, &zips()).unwrap();
        let from_csv = replay_raw(tf, &csvs()).unwrap();
        assert_eq!(from_zip, from_csv, "{tf}");
        // Mixing the two forms is fine too.
        assert_eq!(
            replay_raw(tf, &[day_file(1, "csv"), day_file(2, "zip")]).unwrap(),
            from_zip,
            "{tf}"
        );
    }
}

#[test]
fn one_minute_passes_through_2880_rows() {
    let rows = replay(Timeframe::M1, &zips());
    assert_eq!(rows.len(), 2880);
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r.open_time, DAY1 + i as i64 * 60_000);
        assert!(r.low <= r.open && r.open <= r.high && r.low <= r.close && r.close <= r.high);
    }
    // The first row is the archive's first line, exactly.
    let first = &rows[0];
    assert_eq!(
        (first.open, first.high, first.low, first.close),
        (p("7195.24"), p("7196.25"), p("7183.14"), p("7186.68"))
    );
    assert_eq!((first.volume, first.trades), (v("51.642812"), 493));
    // Every 1m row matches its source line.
    let lines = day1_lines();
    for (r, line) in rows.iter().zip(&lines) {
        let f: Vec<&str> = line.split(',').collect();
        assert_eq!(r.open_time, f[0].parse::<i64>().unwrap());
        assert_eq!((r.open, r.high, r.low, r.close), (p(f[1]), p(f[2]), p(f[3]), p(f[4])));
        assert_eq!((r.volume, r.trades), (v(f[5]), f[8].parse().unwrap()));
    }
    // And merging them gives the days.
    let days = replay(Timeframe::D1, &zips());
    assert_eq!(merge(Timeframe::D1, &rows[..1440]), Some(days[0]));
    assert_eq!(merge(Timeframe::D1, &rows[1440..]), Some(days[1]));
}

#[test]
fn hourly_candles_merge_back_to_the_daily() {
    let hours = replay(Timeframe::H1, &zips());
    assert_eq!(hours.len(), 48);
    for (i, h) in hours.iter().enumerate() {
        assert_eq!(h.open_time, DAY1 + i as i64 * 3_600_000);
    }
    let days = replay(Timeframe::D1, &zips());
    assert_eq!(merge(Timeframe::D1, &hours[..24]), Some(days[0]));
    assert_eq!(merge(Timeframe::D1, &hours[24..]), Some(days[1]));
    // Every timeframe merges back to the same days.
    for tf in Timeframe::ALL {
        let candles = replay(tf, &csvs());
        assert_eq!(candles.len() as u32, 2 * 1440 / tf.minutes(), "{tf}");
        let split = candles.iter().position(|c| c.open_time >= DAY2).unwrap();
        assert_eq!(merge(Timeframe::D1, &candles[..split]), Some(days[0]), "{tf}");
        assert_eq!(merge(Timeframe::D1, &candles[split..]), Some(days[1]), "{tf}");
    }
}

#[test]
fn header_row_and_microsecond_timestamps_are_accepted() {
    let body = std::fs::read_to_string(day_file(1, "csv")).unwrap();
    let header =
        "open_time,open,high,low,close,volume,close_time,quote_volume,count,taker_buy_volume,\
                  taker_buy_quote_volume,ignore\n";
    let with_header = Temp::new("header.csv", &format!("{header}{body}"));
    let expected = replay_raw(Timeframe::D1, &[day_file(1, "csv")]).unwrap();
    assert_eq!(replay_raw(Timeframe::D1, std::slice::from_ref(&with_header.0)).unwrap(), expected);
    assert_eq!(
        replay_raw(Timeframe::M1, &[with_header.0.clone(), day_file(2, "zip")]).unwrap(),
        replay_raw(Timeframe::M1, &zips()).unwrap()
    );
    // Binance's newer archives: open_time and close_time in microseconds.
    let micros: String = body
        .lines()
        .map(|l| {
            let mut f: Vec<String> = l.split(',').map(str::to_string).collect();
            f[0] = format!("{}000", f[0]);
            f[6] = format!("{}999", f[6]);
            f.join(",") + "\n"
        })
        .collect();
    let micro = Temp::new("micros.csv", &micros);
    assert_eq!(replay_raw(Timeframe::D1, std::slice::from_ref(&micro.0)).unwrap(), expected);
}

/// `line` with its comma-separated field `i` replaced by `value`.
fn with_field(line: &str, i: usize, value: &str) -> String {
    let mut f: Vec<&str> = line.split(',').collect();
    f[i] = value;
    f.join(",")
}

/// Day 1 with line `line` (1-based) replaced, run through the replay; returns the error text.
fn error_for(name: &str, line: usize, replacement: &str) -> (String, PathBuf, Temp) {
    let mut lines = day1_lines();
    lines[line - 1] = replacement.to_string();
    let temp = Temp::new(name, &(lines.join("\n") + "\n"));
    let err =
        replay_raw(Timeframe::D1, std::slice::from_ref(&temp.0)).expect_err("bad input must fail");
    (format!("{err:#}"), temp.0.clone(), temp)
}

#[test]
fn bad_input_names_file_and_line() {
    let lines = day1_lines();
    let cases: Vec<(&str, usize, String, &str)> = vec![
        ("truncated.csv", 5, lines[4][..30].to_string(), "columns"),
        ("truncated-last-field.csv", 6, lines[5][..lines[5].len() - 1].to_string(), "ignore"),
        ("columns.csv", 7, format!("{},1", lines[6]), "found 13"),
        ("nonnumeric.csv", 8, with_field(&lines[7], 3, "71x3.5"), "low \"71x3.5\""),
        ("nonnumeric-volume.csv", 9, with_field(&lines[8], 5, "NaN"), "volume"),
        ("duplicate.csv", 10, lines[8].clone(), "duplicate"),
        ("order.csv", 11, lines[2].clone(), "out of order"),
    ];
    for (name, line, replacement, what) in cases {
        let (err, path, _temp) = error_for(name, line, &replacement);
        let at = format!("{}:{line}", path.display());
        assert!(err.contains(&at), "{name}: {err:?} should name {at}");
        assert!(err.contains(what), "{name}: {err:?} should mention {what}");
    }
    // High below low (the two columns swapped).
    let f: Vec<&str> = lines[11].split(',').collect();
    let swapped = with_field(&with_field(&lines[11], 2, f[3]), 3, f[2]);
    let (err, path, _temp) = error_for("highlow.csv", 12, &swapped);
    assert!(err.contains(&format!("{}:12", path.display())), "{err}");
    assert!(err.contains("high is below low"), "{err}");
    // Days given in the wrong order: the second file's first line is out of order.
    let err = replay_raw(Timeframe::D1, &[day_file(2, "csv"), day_file(1, "csv")]).unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains(&format!("{}:1:", day_file(1, "csv").display())), "{msg}");
    assert!(msg.contains("out of order"), "{msg}");
    // The same file twice: a duplicate at its first line.
    let err = replay_raw(Timeframe::D1, &[day_file(1, "zip"), day_file(1, "zip")]).unwrap_err();
    assert!(
        format!("{err:#}").contains(&format!("{}:1:", day_file(1, "zip").display())),
        "{err:#}"
    );
    // A header anywhere but line 1 is an error too.
    let (err, path, _temp) =
        error_for("late-header.csv", 3, "open_time,open,high,low,close,volume,a,b,c,d,e,f");
    assert!(err.contains(&format!("{}:3", path.display())), "{err}");
    // A missing file is an error naming it.
    let missing = std::env::temp_dir().join("millrace-klines-does-not-exist.zip");
    let err = replay_raw(Timeframe::D1, std::slice::from_ref(&missing)).unwrap_err();
    assert!(format!("{err:#}").contains(&missing.display().to_string()), "{err:#}");
}
