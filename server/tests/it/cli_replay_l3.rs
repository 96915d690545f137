//! The `millrace` binary's `replay sse` and `replay lobster` commands, end to end: exit codes,
//! stdout, and file:line on stderr for bad input.

use std::path::PathBuf;
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn millrace(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_millrace")).args(args).output().expect("the binary runs")
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("millrace-cli-l3-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn replay_sse_on_the_real_sample() {
    let dir = replay::input::shared_data_dir().join("sse-tick-by-tick");
    let (orders, trades) = (dir.join("SHorders.zip"), dir.join("SHtrans.zip"));
    let out = millrace(&[
        "replay",
        "sse",
        "--orders",
        orders.to_str().unwrap(),
        "--trades",
        trades.to_str().unwrap(),
        "--subset",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<serde_json::Value> =
        stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 5);
    for l in &lines {
        assert_eq!(l["ok"], true, "{l}");
        assert_eq!(l["crossed_continuous"], 0, "{l}");
        assert_eq!(l["top5"]["bids"].as_array().unwrap().len(), 5);
    }
    // strict sequencing on a five-security subset of the channel fails with exit 1
    let out = millrace(&[
        "replay",
        "sse",
        "--orders",
        orders.to_str().unwrap(),
        "--trades",
        trades.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn replay_sse_bad_row_names_file_and_line() {
    let d = temp_dir("sse");
    let orders = d.join("orders.csv");
    let trades = d.join("trades.csv");
    std::fs::write(
        &orders,
        "MDTime,OrderType,OrderPrice,OrderQty,OrderBSFlag,ChannelNo,ApplSeqNum,OrderNO,SecurityID\n\
         09:31:00.000,2,10.01,100,1,1,1,1,600000.SH\n\
         09:31:00.000,2,10.01,100,1,1,2,2,600000.SH\n\
         09:31:00.000,5,10.01,100,1,1,3,3,600000.SH\n",
    )
    .unwrap();
    std::fs::write(
        &trades,
        "MDTime,TradeBuyNo,TradeSellNo,TradeBSFlag,TradePrice,TradeQty,ChannelNo,ApplSeqNum,SecurityID\n",
    )
    .unwrap();
    let out = millrace(&[
        "replay",
        "sse",
        "--orders",
        orders.to_str().unwrap(),
        "--trades",
        trades.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr.contains(&format!("{}:4", orders.display())), "{stderr}");
    assert!(stderr.contains("OrderType"), "{stderr}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn replay_lobster_on_the_fixture() {
    let f = root().join("server/replay/tests/fixtures/lobster");
    let out = millrace(&[
        "replay",
        "lobster",
        "--messages",
        f.join("seeded_message_3.csv").to_str().unwrap(),
        "--initial-book",
        f.join("seeded_orderbook_3.csv").to_str().unwrap(),
        "--levels",
        "3",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let expected = std::fs::read_to_string(f.join("seeded_orderbook_3.csv")).unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), expected);
    // default depth: 10 levels, 40 columns per row, one row per message
    let out = millrace(&[
        "replay",
        "lobster",
        "--messages",
        f.join("handmade_message_3.csv").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 18);
    assert!(stdout.lines().all(|l| l.split(',').count() == 40));
    // the same messages without the initial book take liquidity that is not there: exit 1
    let out = millrace(&[
        "replay",
        "lobster",
        "--messages",
        f.join("seeded_message_3.csv").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn replay_lobster_bad_row_names_file_and_line() {
    let d = temp_dir("lobster");
    let m = d.join("m.csv");
    std::fs::write(
        &m,
        "34200.1,1,1,100,1000000,1\n34200.2,1,2,100,1000100,-1\n34200.3,9,2,100,1000100,-1\n",
    )
    .unwrap();
    let out = millrace(&["replay", "lobster", "--messages", m.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr.contains(&format!("{}:3", m.display())), "{stderr}");
    std::fs::remove_dir_all(&d).unwrap();
}
