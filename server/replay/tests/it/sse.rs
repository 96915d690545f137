//! `replay sse` on the real Shanghai tick-by-tick sample (`testdata/sse-tick-by-tick`) and on
//! small hand-written files that break one rule each.

use std::path::{Path, PathBuf};

use replay::sse::{run, SseArgs};
use serde_json::Value;
use shared::Price;

fn real_args(subset: bool) -> SseArgs {
    let dir = replay::input::testdata_dir().join("sse-tick-by-tick");
    SseArgs {
        orders: dir.join("SHorders.zip"),
        trades: dir.join("SHtrans.zip"),
        tick: Price::parse("0.01").unwrap(),
        subset,
    }
}

fn replay(args: &SseArgs) -> (bool, Vec<Value>) {
    let mut out = Vec::new();
    let ok = run(args, &mut out).expect("replay runs");
    let text = String::from_utf8(out).unwrap();
    let lines =
        text.lines().map(|l| serde_json::from_str(l).expect("one JSON object per line")).collect();
    (ok, lines)
}

fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} missing in {v}"))
}

fn price(v: &Value) -> Price {
    Price::parse(v[0].as_str().unwrap()).unwrap()
}

#[test]
fn real_sse_sample_keeps_every_invariant() {
    let (ok, lines) = replay(&real_args(true));
    assert!(ok, "every check passes on the real data: {lines:#?}");
    let symbols: Vec<&str> = lines.iter().map(|l| l["symbol"].as_str().unwrap()).collect();
    assert_eq!(symbols, ["600536.SH", "600761.SH", "600961.SH", "601825.SH", "605580.SH"]);
    let (mut order_rows, mut trade_rows, mut unseen) = (0, 0, 0);
    for l in &lines {
        let sym = l["symbol"].as_str().unwrap();
        assert_eq!(u(l, "crossed_continuous"), 0, "{sym} crossed in continuous trading");
        assert_eq!(u(l, "negative_qty"), 0, "{sym}");
        assert_eq!(u(l, "cancels_not_found"), 0, "{sym}: every cancel finds its order");
        assert_eq!(u(l, "trades_not_found"), 0, "{sym}: every passive side is on the book");
        assert_eq!(u(l, "seq_gaps"), 0, "{sym}");
        assert_eq!(u(l, "seq_duplicates"), 0, "{sym}");
        assert_eq!(l["l2_matches"], true, "{sym}");
        assert_eq!(l["stale"], false, "{sym}");
        assert_eq!(l["ok"], true, "{sym}");
        assert_eq!(l["seq_mode"], "subset");
        assert!(u(l, "channel_seq_holes") > 0, "{sym}: other securities' numbers are holes");
        // the call auction does cross, and the replay sees it
        assert!(u(l, "crossed_outside_continuous") > 0, "{sym}");
        // every trade has at most one unseen side (the aggressor)
        assert!(u(l, "unseen_order_refs") <= u(l, "trades"), "{sym}");
        order_rows += u(l, "orders") + u(l, "cancels");
        trade_rows += u(l, "trades");
        unseen += u(l, "unseen_order_refs");
        // the final book is five deep on each side and not crossed
        let bids = l["top5"]["bids"].as_array().unwrap();
        let asks = l["top5"]["asks"].as_array().unwrap();
        assert_eq!((bids.len(), asks.len()), (5, 5), "{sym}");
        assert!(price(&bids[0]) < price(&asks[0]), "{sym}");
        assert!(bids.windows(2).all(|w| price(&w[0]) > price(&w[1])), "{sym}");
        assert!(asks.windows(2).all(|w| price(&w[0]) < price(&w[1])), "{sym}");
    }
    assert_eq!(order_rows, 149_359);
    assert_eq!(trade_rows, 109_616);
    assert!(unseen > 0, "SSE trades name aggressors never published in the order stream");
    // one known book, checked against an independent recomputation of the same files
    let l = &lines[0];
    assert_eq!(l["top5"]["bids"][0], serde_json::json!(["50.73", "36493"]));
    assert_eq!(l["top5"]["asks"][0], serde_json::json!(["50.74", "1200"]));
    assert_eq!(u(l, "live_orders"), 4861);
}

/// The sample keeps five securities of channel 1: its ApplSeqNum has holes that belong to other
/// securities, which strict sequencing must report as gaps.
#[test]
fn real_sample_is_a_channel_subset() {
    let (ok, lines) = replay(&real_args(false));
    assert!(!ok);
    for l in &lines {
        assert_eq!(l["seq_mode"], "strict");
        assert!(u(l, "seq_gaps") > 0);
        assert_eq!(l["stale"], true);
    }
}

const ORDER_HEADER: &str = "MDDate,MDTime,SecurityType,SecuritySubType,SecurityIDSource,Symbol,ReceiveDateTime,OrderIndex,OrderType,OrderPrice,OrderQty,OrderBSFlag,ChannelNo,ApplSeqNum,OrderNO,SecurityID";
const TRADE_HEADER: &str = "MDDate,MDTime,SecurityType,SecuritySubType,SecurityIDSource,Symbol,TradingPhaseCode,TradeIndex,TradeBuyNo,TradeSellNo,TradeType,TradeBSFlag,TradePrice,TradeQty,TradeMoney,ReceiveDateTime,NumTrades,ChannelNo,ApplSeqNum,SecurityID";

fn order(time: &str, typ: &str, price: &str, qty: u32, bs: u8, seq: u64, no: u64) -> String {
    format!("2023.07.11,{time},2,02001,101,X,2023.07.11T09:25:21.401,1,{typ},{price},{qty},{bs},1,{seq},{no},600000.SH")
}

fn trade(time: &str, buy: u64, sell: u64, bs: u8, price: &str, qty: u32, seq: u64) -> String {
    format!("2023.07.11,{time},2,02001,101,X,,1,{buy},{sell},0,{bs},{price},{qty},0,2023.07.11T09:25:03.276,0,1,{seq},600000.SH")
}

struct Files {
    dir: PathBuf,
}

impl Files {
    fn new(name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("millrace-e2e-sse-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self { dir }
    }
    fn write(&self, name: &str, header: &str, rows: &[String]) -> PathBuf {
        let path = self.dir.join(name);
        let mut text = String::from(header);
        for r in rows {
            text.push('\n');
            text.push_str(r);
        }
        text.push('\n');
        std::fs::write(&path, text).unwrap();
        path
    }
    fn args(&self, orders: &[String], trades: &[String], subset: bool) -> SseArgs {
        SseArgs {
            orders: self.write("orders.csv", ORDER_HEADER, orders),
            trades: self.write("trades.csv", TRADE_HEADER, trades),
            tick: Price::parse("0.01").unwrap(),
            subset,
        }
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn small_stream_semantics() {
    let f = Files::new("semantics");
    let orders = [
        order("09:15:00.000", "2", "10.009999999999999", 300, 1, 1, 101), // bid 10.01
        order("09:15:01.000", "2", "10", 200, 2, 2, 102), // ask 10.00: auction crosses
        order("09:31:00.000", "2", "10.02", 100, 2, 5, 104), // ask 10.02
        order("09:32:00.000", "10", "10.02", 100, 2, 7, 104), // cancel it
    ];
    let trades = [
        trade("09:25:00.000", 101, 102, 0, "10.01", 200, 3), // auction: both sides
        // continuous: sell aggressor 105, never published, hits bid 101
        trade("09:31:30.000", 101, 105, 2, "10.01", 50, 6),
    ];
    let args = f.args(&orders, &trades, true);
    let (ok, lines) = replay(&args);
    assert!(ok, "{lines:?}");
    let l = &lines[0];
    assert_eq!((u(l, "orders"), u(l, "cancels"), u(l, "trades")), (3, 1, 2));
    assert_eq!(u(l, "unseen_order_refs"), 1, "sell aggressor 105 was never published");
    assert_eq!(u(l, "crossed_outside_continuous"), 1, "crossed between order 2 and the auction");
    assert_eq!(u(l, "channel_seq_holes"), 1, "seq 4 belongs to another security");
    assert_eq!(l["top5"]["bids"], serde_json::json!([["10.01", "50"]]));
    assert_eq!(l["top5"]["asks"], serde_json::json!([]));

    // the same stream strictly sequenced: the hole at 4 is a gap and the check fails
    let (ok, lines) = replay(&f.args(&orders, &trades, false));
    assert!(!ok);
    assert_eq!(u(&lines[0], "seq_gaps"), 1);
}

#[test]
fn broken_streams_fail_the_checks() {
    let f = Files::new("broken");
    // a cancel of an order that never existed
    let (ok, lines) =
        replay(&f.args(&[order("09:31:00.000", "10", "10", 100, 1, 1, 999)], &[], true));
    assert!(!ok);
    assert_eq!(u(&lines[0], "cancels_not_found"), 1);
    // a crossing order in continuous trading (something was lost)
    let orders = [
        order("09:31:00.000", "2", "10.01", 100, 1, 1, 1),
        order("09:31:01.000", "2", "10", 100, 2, 2, 2),
    ];
    let (ok, lines) = replay(&f.args(&orders, &[], true));
    assert!(!ok);
    assert_eq!(u(&lines[0], "crossed_continuous"), 1);
    // a trade larger than the resting order would go negative
    let orders = [order("09:31:00.000", "2", "10.01", 100, 1, 1, 1)];
    let trades = [trade("09:31:01.000", 1, 50, 2, "10.01", 150, 2)];
    let (ok, lines) = replay(&f.args(&orders, &trades, true));
    assert!(!ok);
    assert_eq!(u(&lines[0], "negative_qty"), 1);
    // the same ApplSeqNum in both files: the trade is a duplicate, dropped and counted
    let orders = [order("09:31:00.000", "2", "10.01", 100, 1, 1, 1)];
    let trades = [trade("09:31:01.000", 1, 50, 2, "10.01", 100, 1)];
    let (ok, lines) = replay(&f.args(&orders, &trades, true));
    assert!(ok);
    assert_eq!(u(&lines[0], "seq_duplicates"), 1);
    assert_eq!(u(&lines[0], "trades"), 0);
}

fn error_of(args: &SseArgs) -> String {
    let mut out = Vec::new();
    format!("{:#}", run(args, &mut out).expect_err("bad input is an error"))
}

fn at(path: &Path, line: usize) -> String {
    format!("{}:{line}", path.display())
}

#[test]
fn bad_rows_name_file_and_line() {
    let f = Files::new("bad");
    let good = order("09:31:00.000", "2", "10", 100, 1, 1, 1);
    let cases: [(&str, String, &str); 5] = [
        ("price", order("09:31:00.000", "2", "ten", 100, 1, 2, 2), "OrderPrice"),
        ("type", order("09:31:00.000", "7", "10", 100, 1, 2, 2), "unknown OrderType"),
        ("side", order("09:31:00.000", "2", "10", 100, 3, 2, 2), "OrderBSFlag"),
        ("short", "2023.07.11,09:31:00.000,2".to_string(), "columns"),
        ("time", order("9h31", "2", "10", 100, 1, 2, 2), "MDTime"),
    ];
    for (name, bad, what) in cases {
        let args = f.args(&[good.clone(), bad], &[], true);
        let e = error_of(&args);
        assert!(e.contains(&at(&args.orders, 3)), "{name}: {e}");
        assert!(e.contains(what), "{name}: {e}");
    }
    // a trade row with a non-numeric order number
    let args = f.args(
        std::slice::from_ref(&good),
        &[trade("09:31:00.000", 1, 2, 1, "10", 1, 2).replace(",1,2,0,1,", ",1,x2,0,1,")],
        true,
    );
    let e = error_of(&args);
    assert!(e.contains(&at(&args.trades, 2)) && e.contains("TradeSellNo"), "{e}");
    // a header without a needed column
    let args = f.args(std::slice::from_ref(&good), &[], true);
    std::fs::write(&args.trades, "MDDate,MDTime,TradeBuyNo\n").unwrap();
    let e = error_of(&args);
    assert!(e.contains(&at(&args.trades, 1)) && e.contains("TradeSellNo"), "{e}");
    // a missing file is an error naming it
    let args = SseArgs { orders: f.dir.join("nope.zip"), ..f.args(&[good], &[], true) };
    assert!(error_of(&args).contains("nope.zip"));
}

/// Issue 15 item 12: an OrderPrice too long for the fixed-point scaling overflowed unchecked and
/// gave a wrong price with `ok: true`; it is now an error naming file and line, as are prices
/// just past the `i64` range and overflowing trade prices.
#[test]
fn overflowing_prices_are_refused_with_file_and_line() {
    let f = Files::new("overflow");
    let good = order("09:31:00.000", "2", "10", 100, 1, 1, 1);
    for p in
        ["3402823669209384634633746074332", "92233720368.55", "-3402823669209384634633746074332"]
    {
        let args = f.args(&[good.clone(), order("09:31:00.000", "2", p, 100, 1, 2, 2)], &[], true);
        let e = error_of(&args);
        assert!(e.contains(&at(&args.orders, 3)), "{p}: {e}");
        assert!(e.contains("OrderPrice") && e.contains("out of range"), "{p}: {e}");
    }
    let args = f.args(
        std::slice::from_ref(&good),
        &[trade("09:31:00.000", 1, 2, 1, "3402823669209384634633746074332", 1, 2)],
        true,
    );
    let e = error_of(&args);
    assert!(e.contains(&at(&args.trades, 2)) && e.contains("TradePrice"), "{e}");
}
