//! The `millrace replay klines` command line, run as a real process on the Binance archives in
//! `testdata/klines`.

use std::path::PathBuf;
use std::process::{Command, Output};

fn day_file(day: u32, ext: &str) -> PathBuf {
    replay::input::testdata_dir()
        .join(format!("klines/binance-spot-BTCUSDT-1m/BTCUSDT-1m-2020-01-{day:02}.{ext}"))
}

fn millrace(args: &[&str], files: &[PathBuf]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_millrace"))
        .args(args)
        .args(files)
        .output()
        .expect("the millrace binary runs")
}

/// The day's trades summed straight from the CSV's ninth column.
fn csv_trades(day: u32) -> u64 {
    std::fs::read_to_string(day_file(day, "csv"))
        .unwrap()
        .lines()
        .map(|l| l.split(',').nth(8).unwrap().parse::<u64>().unwrap())
        .sum()
}

#[test]
fn merges_two_daily_archives_into_binance_1d_candles() {
    let zips = [day_file(1, "zip"), day_file(2, "zip")];
    let expected = format!(
        "open_time,open,high,low,close,volume,trades\n\
         1577836800000,7195.24,7255,7175.15,7200.85,16792.388165,194010\n\
         1577923200000,7200.77,7212.5,6924.74,6965.71,31951.483932,{}\n",
        csv_trades(2)
    );
    assert_eq!(csv_trades(1), 194_010);
    let out = millrace(&["replay", "klines", "--tf", "1d"], &zips);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");
    assert_eq!(String::from_utf8(out.stdout).unwrap(), expected);
    // Complete days: no note about missing minutes.
    assert!(!stderr.contains("fewer"), "{stderr}");
    // 1d is the default.
    let out = millrace(&["replay", "klines"], &zips);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8(out.stdout).unwrap(), expected);
}

#[test]
fn partial_day_is_printed_with_a_note() {
    let lines: Vec<String> = std::fs::read_to_string(day_file(1, "csv"))
        .unwrap()
        .lines()
        .take(90)
        .map(str::to_string)
        .collect();
    let path = std::env::temp_dir()
        .join(format!("millrace-cli-klines-{}-partial.csv", std::process::id()));
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let out = millrace(&["replay", "klines", "--tf", "1h"], std::slice::from_ref(&path));
    let _ = std::fs::remove_file(&path);
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 3, "{stdout}"); // header, 00:00 (complete), 01:00 (30 minutes)
    assert!(stdout.lines().nth(2).unwrap().starts_with("1577840400000,"), "{stdout}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("1 of 2 1h candles"), "{:?}", out.stderr);
}

#[test]
fn bad_file_exits_non_zero_naming_file_and_line() {
    let mut lines: Vec<String> = std::fs::read_to_string(day_file(1, "csv"))
        .unwrap()
        .lines()
        .take(10)
        .map(str::to_string)
        .collect();
    lines[6] = lines[6].replacen(",7", ",seven", 1);
    let path =
        std::env::temp_dir().join(format!("millrace-cli-klines-{}-bad.csv", std::process::id()));
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let out = millrace(&["replay", "klines", "--tf", "1h"], std::slice::from_ref(&path));
    let _ = std::fs::remove_file(&path);
    assert_ne!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("{}:7", path.display())), "{stderr}");
    assert!(stderr.contains("seven"), "{stderr}");

    // An unknown timeframe is rejected by the argument parser, listing the valid ones.
    let out = millrace(&["replay", "klines", "--tf", "7m"], &[day_file(1, "zip")]);
    assert_ne!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("7m") && stderr.contains("12h"), "{stderr}");
}
