use shared::sync::SyncState;
use shared::venue::{ChecksumRule, NumberFormat, SequenceRule, VenueSync, VenueSyncConfig};

use super::*;

fn one(frame: &str) -> Message {
    let mut out = Vec::new();
    parse(frame, &mut out).unwrap();
    assert_eq!(out.len(), 1, "{out:?}");
    out.pop().unwrap()
}

fn book(frame: &str) -> BookFrame {
    match one(frame) {
        Message::Book(b) => b,
        other => panic!("{other:?}"),
    }
}

fn lv(p: &str, q: &str) -> Level {
    Level::new(Price::parse(p).unwrap(), Qty::parse(q).unwrap())
}

/// The book of Kraken's v2 checksum example (https://docs.kraken.com/api/docs/guides/spot-ws-book-v2,
/// as copied by public repositories citing it; /tmp/venue_facts.md 1.1), best first.
const BIDS: [(&str, &str); 10] = [
    ("45283.5", "0.10000000"),
    ("45283.4", "1.54582015"),
    ("45282.1", "0.10000000"),
    ("45281.0", "0.10000000"),
    ("45280.3", "1.54592586"),
    ("45279.0", "0.07990000"),
    ("45277.6", "0.03310103"),
    ("45277.5", "0.30000000"),
    ("45277.3", "1.54602737"),
    ("45276.6", "0.15445238"),
];
const ASKS: [(&str, &str); 10] = [
    ("45285.2", "0.00100000"),
    ("45286.4", "1.54571953"),
    ("45286.6", "1.54571109"),
    ("45289.6", "1.54560911"),
    ("45290.2", "0.15890660"),
    ("45291.8", "1.54553491"),
    ("45294.7", "0.04454749"),
    ("45296.1", "0.35380000"),
    ("45297.5", "0.09945542"),
    ("45299.5", "0.18772827"),
];
/// The docs' checksum of that book.
const DOCS_CHECKSUM: u32 = 3_310_070_434;

/// The example book as a v2 snapshot: JSON numbers in the shortest form a float prints
/// (`0.1`, `45281`), one in exponent notation as a JSON encoder may write it (`1E-3`).
fn v2_snapshot() -> String {
    let number = |s: &str| {
        let s = s.trim_end_matches('0').trim_end_matches('.');
        if s == "0.001" {
            "1E-3".to_string()
        } else {
            s.to_string()
        }
    };
    let side = |levels: &[(&str, &str)]| {
        levels
            .iter()
            .map(|(p, q)| format!(r#"{{"price":{},"qty":{}}}"#, number(p), number(q)))
            .collect::<Vec<_>>()
            .join(",")
    };
    format!(
        r#"{{"channel":"book","type":"snapshot","data":[{{"symbol":"BTC/USD","bids":[{}],"asks":[{}],"checksum":{DOCS_CHECKSUM},"timestamp":"2023-10-06T17:35:55.440295Z"}}]}}"#,
        side(&BIDS),
        side(&ASKS)
    )
}

fn kraken_sync(depth: Option<usize>, given: bool) -> VenueSync {
    let mut config = VenueSyncConfig::new(SequenceRule::None, ChecksumRule::Kraken);
    config.depth = depth;
    if given {
        // BTC/USD's `price_precision` 1 and `qty_precision` 8 (the instrument channel's example)
        config.price_format = Some(NumberFormat::Fixed(1));
        config.qty_format = Some(NumberFormat::Fixed(8));
    }
    VenueSync::new(config)
}

#[test]
fn the_docs_checksum_example_verifies_from_a_v2_snapshot() {
    let b = book(&v2_snapshot());
    assert!(b.snapshot);
    assert_eq!((b.symbol.as_str(), b.depth, b.printed), ("BTC/USD", None, None));
    assert_eq!(b.checksum, Some(DOCS_CHECKSUM));
    assert_eq!(b.time_ms, Some(1_696_613_755_440));
    assert_eq!(b.bids[3], lv("45281.0", "0.1"));
    assert_eq!(b.asks[0], lv("45285.2", "0.001"));
    assert_eq!((b.bids.len(), b.asks.len()), (10, 10));

    let mut sync = kraken_sync(Some(10), true);
    sync.handle_message(b.message());
    assert!(sync.is_synced());
    assert_eq!(sync.stats().checksums_verified, 1);
}

#[test]
fn a_depth_10_book_drops_the_level_a_better_one_pushes_out() {
    let mut sync = kraken_sync(Some(10), true);
    sync.handle_message(book(&v2_snapshot()).message());
    // a new best bid 45284.0 × 0.5; the 11th bid (45276.6) falls out of the book, and the
    // checksum is over the ten kept: the string written out by hand, segment by segment
    let expected = concat!(
        // asks, unchanged
        "452852100000",
        "45286415457195345286615457110945289615456091145290215890660452918154553491",
        "452947445474945296135380000452975994554245299518772827",
        // bids: the new one, then the first nine of the snapshot
        "45284050000000",
        "45283510000000",
        "452834154582015",
        "45282110000000",
        "45281010000000",
        "452803154592586",
        "4527907990000",
        "4527763310103",
        "45277530000000",
        "452773154602737",
    );
    let sum = crc32fast::hash(expected.as_bytes());
    let update = format!(
        r#"{{"channel":"book","type":"update","data":[{{"symbol":"BTC/USD","bids":[{{"price":45284.0,"qty":0.5}}],"asks":[],"checksum":{sum},"timestamp":"2023-10-06T17:35:55.540295Z"}}]}}"#
    );
    let b = book(&update);
    assert!(!b.snapshot);
    sync.handle_message(b.message());
    assert_eq!(sync.stats().checksums_verified, 2, "{:?}", sync.stats());
    let bids: Vec<_> = sync.book().bids.iter().map(|l| l.price).collect();
    assert_eq!(bids.len(), 10);
    assert_eq!(bids[0], Price::parse("45284").unwrap());
    assert!(!bids.contains(&Price::parse("45276.6").unwrap()));
}

/// The example book as a v1 frame payload of `[price, volume, time]` strings.
fn v1_levels(levels: &[(&str, &str)]) -> String {
    levels
        .iter()
        .map(|(p, q)| format!(r#"["{p}","{q}","1696613755.440295"]"#))
        .collect::<Vec<_>>()
        .join(",")
}

#[test]
fn a_v1_book_learns_kraken_s_padding_and_verifies_without_metadata() {
    let snapshot = format!(
        r#"[336,{{"as":[{}],"bs":[{}]}},"book-10","XBT/USD"]"#,
        v1_levels(&ASKS),
        v1_levels(&BIDS)
    );
    let b = book(&snapshot);
    assert!(b.snapshot);
    assert_eq!((b.symbol.as_str(), b.depth, b.checksum), ("XBT/USD", Some(10), None));
    let printed = b.printed.unwrap();
    assert_eq!(printed.price.format(), Some(NumberFormat::Fixed(1)));
    assert_eq!(printed.qty.format(), Some(NumberFormat::Fixed(8)));
    let mut sync = kraken_sync(Some(10), false);
    sync.handle_message(b.message());
    // "there is no checksum on the snapshot" (v1 docs): the first update carries one
    assert!(sync.is_synced());

    // a republished level (the "r" flag) changes nothing; its checksum is the docs' one
    let republish = format!(
        r#"[336,{{"a":[["45285.2","0.00100000","1696613756.000001","r"]],"c":"{DOCS_CHECKSUM}"}},"book-10","XBT/USD"]"#
    );
    sync.handle_message(book(&republish).message());
    assert_eq!(sync.stats().checksums_verified, 1, "{:?}", sync.stats());

    // the best ask's volume becomes 0.00200000: its segment 452852100000 becomes 452852200000
    let expected = concat!(
        "452852200000",
        "45286415457195345286615457110945289615456091145290215890660452918154553491",
        "452947445474945296135380000452975994554245299518772827",
        "452835100000004528341545820154528211000000045281010000000452803154592586",
        "452790799000045277633101034527753000000045277315460273745276615445238",
    );
    let sum = crc32fast::hash(expected.as_bytes());
    // the checksum in the second object, as Kraken sends it when both sides change
    let update = format!(
        r#"[336,{{"a":[["45285.2","0.00200000","1696613757.000001"]]}},{{"b":[],"c":"{sum}"}},"book-10","XBT/USD"]"#
    );
    let b = book(&update);
    assert_eq!((b.snapshot, b.checksum), (false, Some(sum)));
    sync.handle_message(b.message());
    assert_eq!(sync.stats().checksums_verified, 2, "{:?}", sync.stats());

    // a wrong checksum: the book resyncs (the caller resubscribes for a fresh snapshot)
    let wrong = format!(
        r#"[336,{{"a":[["45285.2","0.00300000","1696613758.000001"]],"c":"{sum}"}},"book-10","XBT/USD"]"#
    );
    sync.handle_message(book(&wrong).message());
    assert_eq!(sync.stats().checksum_mismatches, 1);
    assert_eq!(sync.stats().resyncs, 1);
    assert_eq!(sync.state(), SyncState::AwaitingSnapshot);
}

#[test]
fn the_v1_docs_update_with_its_checksum_in_the_second_object() {
    // https://docs.kraken.com/exchange/guides/websockets/book-checksum-v1.md, verbatim
    let b = book(
        r#"[
    0,
    {
        "a": [
            ["0.05120", "0.00000500", "1582905486.493008"],
            ["0.05275", "0.00000500", "1582905486.493034"]
        ]
    },
    {
        "b": [
            ["0.04765", "0.00000500", "1582905486.493008"],
            ["0.04940", "0.00000500", "1582905486.493034"]
        ],
        "c": "974947235"
    },
    "book-1000",
    "BTC/USD"
]"#,
    );
    assert_eq!((b.snapshot, b.depth, b.checksum), (false, Some(1000), Some(974_947_235)));
    assert_eq!(b.asks, [lv("0.0512", "0.000005"), lv("0.05275", "0.000005")]);
    assert_eq!(b.bids, [lv("0.04765", "0.000005"), lv("0.0494", "0.000005")]);
    assert_eq!(b.printed.unwrap().price.format(), Some(NumberFormat::Fixed(5)));
}

#[test]
fn v2_trades_candles_tickers_and_instruments() {
    // https://docs.kraken.com/api/docs/websocket-v2/trade, verbatim
    let mut out = Vec::new();
    crate::parse(
        Dialect::Kraken,
        r#"{
    "channel": "trade",
    "type": "snapshot",
    "data": [
        {
            "symbol": "MATIC/USD",
            "side": "buy",
            "price": 0.5147,
            "qty": 6423.46326,
            "ord_type": "limit",
            "trade_id": 4665846,
            "timestamp": "2023-09-25T07:48:36.925533Z"
        },
        {
            "symbol": "MATIC/USD",
            "side": "buy",
            "price": 0.5147,
            "qty": 1136.19677815,
            "ord_type": "limit",
            "trade_id": 4665847,
            "timestamp": "2023-09-25T07:49:36.925603Z"
        }
    ]
}"#,
        &mut out,
    )
    .unwrap();
    let [Message::Trades { symbol, trades }] = &out[..] else { panic!("{out:?}") };
    assert_eq!(symbol, "MATIC/USD");
    assert_eq!(trades.len(), 2);
    assert_eq!(trades[1].id, TradeId::Seq(4_665_847));
    assert_eq!(trades[1].qty, Qty::parse("1136.19677815").unwrap());
    assert_eq!(trades[0].taker, Some(TakerSide::Buy));
    assert_eq!(trades[0].time_ms, 1_695_628_116_925);

    // trades of two symbols in one push: one message each, in order
    let mut out = Vec::new();
    parse(
        r#"{"channel":"trade","type":"update","data":[{"symbol":"A/USD","side":"sell","price":1,"qty":2,"ord_type":"market","trade_id":1,"timestamp":"2023-09-25T07:48:36Z"},{"symbol":"B/USD","side":"buy","price":3,"qty":4,"ord_type":"limit","trade_id":7,"timestamp":"2023-09-25T07:48:36Z"},{"symbol":"A/USD","side":"buy","price":5,"qty":6,"ord_type":"limit","trade_id":2,"timestamp":"2023-09-25T07:48:37Z"}]}"#,
        &mut out,
    )
    .unwrap();
    let ids: Vec<_> = out
        .iter()
        .map(|m| match m {
            Message::Trades { symbol, trades } => {
                (symbol.as_str(), trades.iter().map(|t| t.id.seq().unwrap()).collect::<Vec<_>>())
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(ids, [("A/USD", vec![1, 2]), ("B/USD", vec![7])]);

    // https://docs.kraken.com/exchange/api-reference/spot-websocket-v2/ohlc, verbatim
    let mut out = Vec::new();
    parse(
        r#"{
    "channel": "ohlc",
    "type": "snapshot",
    "timestamp": "2023-10-04T16:26:01.806315597Z",
    "data": [
        {
            "symbol": "ALGO/USD",
            "open": 0.09875,
            "high": 0.09875,
            "low": 0.09875,
            "close": 0.09875,
            "trades": 1,
            "volume": 201.86015,
            "vwap": 0.09875,
            "interval_begin": "2023-10-04T15:25:00.000000000Z",
            "interval": 5,
            "timestamp": "2023-10-04T15:30:00.000000Z"
        },
        {
            "symbol": "ALGO/USD",
            "open": 0.09875,
            "high": 0.0988,
            "low": 0.09875,
            "close": 0.09875,
            "trades": 13,
            "volume": 16255.46368,
            "vwap": 0.09879,
            "interval_begin": "2023-10-04T15:30:00.000000000Z",
            "interval": 5,
            "timestamp": "2023-10-04T15:35:00.000000Z"
        }
    ]
}"#,
        &mut out,
    )
    .unwrap();
    let [Message::Candle(a), Message::Candle(b)] = &out[..] else { panic!("{out:?}") };
    assert_eq!((a.symbol.as_str(), a.minutes, a.closed), ("ALGO/USD", 5, None));
    // 2023-10-04T15:25:00Z
    assert_eq!(a.candle.open_time, 1_696_433_100_000);
    assert_eq!(b.candle.open_time - a.candle.open_time, 300_000);
    assert_eq!((b.candle.high, b.candle.trades), (Price::parse("0.0988").unwrap(), 13));
    assert_eq!(b.candle.volume, shared::Volume::parse("16255.46368").unwrap());

    // the ticker page's example was not retrievable: a push with its documented fields
    let t = one(
        r#"{"channel":"ticker","type":"update","data":[{"symbol":"BTC/USD","bid":45283.5,"bid_qty":0.1,"ask":45285.2,"ask_qty":1e-3,"last":45285.2,"volume":1234.5,"vwap":45200.1,"low":44000,"high":46000,"change":100.5,"change_pct":0.22}]}"#,
    );
    let Message::Ticker(t) = t else { panic!("{t:?}") };
    assert_eq!((t.bid, t.ask), (Some(lv("45283.5", "0.1")), Some(lv("45285.2", "0.001"))));
    assert_eq!(t.time_ms, None);

    // https://docs.kraken.com/api/docs/websocket-v2/instrument: the docs' first pair verbatim (the
    // page is cut off after it, so the list is closed here)
    let mut out = Vec::new();
    parse(
        r#"{
    "channel": "instrument",
    "type": "snapshot",
    "data": {
        "assets": [
            { "id": "USD", "status": "enabled", "precision": 4, "precision_display": 2, "borrowable": true, "collateral_value": 1.0, "margin_rate": 0.015 }
        ],
        "pairs": [
            {
                "symbol": "BTC/USD",
                "base": "BTC",
                "quote": "USD",
                "status": "online",
                "qty_precision": 8,
                "qty_increment": 1e-08,
                "price_precision": 1,
                "cost_precision": 5,
                "marginable": true,
                "has_index": true,
                "cost_min": 0.5,
                "margin_initial": 0.2,
                "position_limit_long": 250,
                "position_limit_short": 200,
                "tick_size": 0.1,
                "price_increment": 0.1,
                "qty_min": 0.0001
            },
            { "symbol": "TINY/USD", "price_precision": 10, "qty_precision": 2, "price_increment": 1e-10, "qty_increment": 0.01 }
        ]
    }
}"#,
        &mut out,
    )
    .unwrap();
    assert_eq!(
        out,
        [
            Message::Instrument(InstrumentFrame {
                symbol: "BTC/USD".into(),
                price_decimals: Some(1),
                qty_decimals: Some(8),
                tick: Some(Price::parse("0.1").unwrap()),
                lot: Some(Qty::parse("0.00000001").unwrap()),
            }),
            // a tick finer than 10^-8 cannot be held in fixed point: left out, not an error
            Message::Instrument(InstrumentFrame {
                symbol: "TINY/USD".into(),
                price_decimals: Some(10),
                qty_decimals: Some(2),
                tick: None,
                lot: Some(Qty::parse("0.01").unwrap()),
            }),
        ]
    );
}

#[test]
fn v1_trades_and_candles() {
    // the v1 trade shape ([price, volume, time, side, orderType, misc]), archives before the id
    let mut out = Vec::new();
    parse(
        r#"[0,[["5541.20000","0.15850568","1534614057.321597","s","l",""],["6060.00000","0.02455000","1534614057.324998","b","l",""]],"trade","XBT/USD"]"#,
        &mut out,
    )
    .unwrap();
    let [Message::Trades { symbol, trades }] = &out[..] else { panic!("{out:?}") };
    assert_eq!(symbol, "XBT/USD");
    assert_eq!(trades[0].id, TradeId::Text("1534614057.321597-0".into()));
    assert_eq!(trades[0].taker, Some(TakerSide::Sell));
    assert_eq!(trades[1].time_ms, 1_534_614_057_324);
    assert_eq!(trades[1].price, Price::parse("6060").unwrap());

    // with the trade id as its seventh entry
    let t = one(
        r#"[0,[["5541.20000","0.15850568","1534614057.321597","b","m","",12345]],"trade","XBT/USD"]"#,
    );
    let Message::Trades { trades, .. } = t else { panic!("{t:?}") };
    assert_eq!(
        (trades[0].id.clone(), trades[0].taker),
        (TradeId::Seq(12_345), Some(TakerSide::Buy))
    );

    // v1 ohlc: etime 1542057360.435743 is the interval's end; the 5m candle opens 5 minutes
    // before its whole minute
    let c = one(
        r#"[42,["1542057314.748456","1542057360.435743","3586.70000","3586.70000","3586.60000","3586.60000","3586.68894","0.03373000",2],"ohlc-5","XBT/USD"]"#,
    );
    let Message::Candle(c) = c else { panic!("{c:?}") };
    assert_eq!((c.symbol.as_str(), c.minutes, c.closed), ("XBT/USD", 5, None));
    assert_eq!(c.candle.open_time, 1_542_057_360_000 - 300_000);
    assert_eq!((c.candle.low, c.candle.trades), (Price::parse("3586.6").unwrap(), 2));

    assert_eq!(
        one(r#"[1234,{"a":["5525.40000","5525.10000","1.0"]},"spread","XBT/USD"]"#),
        Message::Ignored { channel: "spread".into() }
    );
}

#[test]
fn answers_heartbeats_and_status() {
    // https://docs.kraken.com/api/docs/websocket-v2/book: the subscribe answer, verbatim
    assert_eq!(
        one(r#"{
"method": "subscribe",
"result": {
"channel": "book",
"depth": 10,
"snapshot": true,
"symbol": "ALGO/USD"
},
"success": true,
"time_in": "2023-10-06T17:35:55.219022Z",
"time_out": "2023-10-06T17:35:55.219067Z"
}"#),
        Message::Ack { detail: "subscribe book ALGO/USD".into() }
    );
    // https://docs.kraken.com/api/docs/websocket-v2/heartbeat, verbatim
    assert_eq!(one("{\n\"channel\": \"heartbeat\"\n}"), Message::Heartbeat);
    assert_eq!(
        one(
            r#"{"method":"pong","req_id":101,"time_in":"2022-12-25T09:30:59.123456Z","time_out":"2022-12-25T09:30:59.123457Z"}"#
        ),
        Message::Heartbeat
    );
    assert_eq!(
        one(
            r#"{"method":"subscribe","error":"Exceeded msg rate","success":false,"time_in":"2023-10-06T17:35:55.219022Z","time_out":"2023-10-06T17:35:55.219067Z"}"#
        ),
        Message::Refused {
            code: String::new(),
            message: "Exceeded msg rate".into(),
            rate_limited: true
        }
    );
    assert_eq!(
        one(
            r#"{"method":"subscribe","error":"EGeneral:Invalid arguments","success":false,"req_id":3}"#
        ),
        Message::Refused {
            code: "EGeneral".into(),
            message: "EGeneral:Invalid arguments".into(),
            rate_limited: false
        }
    );
    assert_eq!(
        one(
            r#"{"channel":"status","type":"update","data":[{"api_version":"v2","connection_id":12393906104898154338,"system":"online","version":"2.0.4"}]}"#
        ),
        Message::Ack { detail: "status online".into() }
    );
    // v1 events: https://docs.kraken.com/exchange/api-reference/spot-websocket-v1/heartbeat and
    // .../ping.md verbatim; the status answers in their documented shape
    assert_eq!(one(r#"{ "event": "heartbeat" }"#), Message::Heartbeat);
    assert_eq!(one("{\n  \"event\": \"pong\",\n  \"reqid\": 42\n}"), Message::Heartbeat);
    assert_eq!(
        one(
            r#"{"channelID":336,"channelName":"book-10","event":"subscriptionStatus","pair":"XBT/USD","status":"subscribed","subscription":{"depth":10,"name":"book"}}"#
        ),
        Message::Ack { detail: "subscribed book-10 XBT/USD".into() }
    );
    assert!(matches!(
        one(
            r#"{"errorMessage":"Subscription depth not supported","event":"subscriptionStatus","pair":"XBT/USD","status":"error","subscription":{"depth":42,"name":"book"}}"#
        ),
        Message::Refused { rate_limited: false, .. }
    ));
    assert_eq!(
        one(
            r#"{"connectionID":8628615390848610000,"event":"systemStatus","status":"online","version":"1.0.0"}"#
        ),
        Message::Ack { detail: "systemStatus online".into() }
    );
    assert_eq!(
        one(r#"{"channel":"level3","data":[]}"#),
        Message::Ignored { channel: "level3".into() }
    );
}

#[test]
fn requests() {
    assert_eq!(
        subscribe_v2("book", &["BTC/USD"], Some(10)),
        r#"{"method":"subscribe","params":{"channel":"book","depth":10,"symbol":["BTC/USD"]}}"#
    );
    assert_eq!(
        subscribe_v2("instrument", &[], None),
        r#"{"method":"subscribe","params":{"channel":"instrument"}}"#
    );
    assert_eq!(ping_v2(), r#"{"method":"ping"}"#);
}

#[test]
fn bad_frames_are_errors_naming_what_is_wrong() {
    let v2 = |bids: &str| {
        format!(
            r#"{{"channel":"book","type":"update","data":[{{"symbol":"BTC/USD","bids":[{bids}],"asks":[],"checksum":1}}]}}"#
        )
    };
    let mut out = Vec::new();
    for (frame, says) in [
        (v2(r#"{"price":"4x","qty":1}"#), "invalid character 'x'"),
        (v2(r#"{"price":1.5e-9,"qty":1}"#), "more than 8"),
        (v2(r#"{"price":1,"qty":2.5e-9}"#), "quantity"),
        (v2(r#"{"price":1e99,"qty":1}"#), "exponent"),
        (v2(r#"{"price":-1,"qty":1}"#), "not positive"),
        (v2(r#"{"price":true,"qty":1}"#), "not a number"),
        (v2(r#"{"price":1}"#), "missing field `qty`"),
        (
            r#"{"channel":"book","type":"update","data":[{"bids":[]}]}"#.into(),
            "missing field `symbol`",
        ),
        (
            r#"{"channel":"book","type":"update","data":[{"symbol":"X","checksum":4294967296}]}"#
                .into(),
            "checksum",
        ),
        (
            r#"{"channel":"book","type":"update","data":[{"symbol":"X","timestamp":"yesterday"}]}"#
                .into(),
            "timestamp",
        ),
        (r#"{"channel":"book","type":"later","data":[]}"#.into(), "book type"),
        (r#"{"channel":"book","type":"update"}"#.into(), "`data`"),
        (
            r#"{"channel":"trade","type":"update","data":[{"symbol":"X","side":"up","price":1,"qty":1,"trade_id":1,"timestamp":"2023-09-25T07:48:36Z"}]}"#.into(),
            "trade side",
        ),
        (
            r#"{"channel":"ohlc","data":[{"symbol":"X","open":2,"high":1,"low":1,"close":1,"volume":1,"interval_begin":"2023-10-04T15:25:00Z","interval":1}]}"#.into(),
            "open is outside",
        ),
        (
            r#"{"channel":"instrument","data":{"pairs":[{"symbol":"X","price_precision":300}]}}"#
                .into(),
            "price_precision",
        ),
        (r#"{"hello":1}"#.into(), "`channel`, `method` or `event`"),
        (r#"[1,{"a":[["1","1","1"]],"c":"x"},"book-10","XBT/USD"]"#.into(), "in c"),
        (r#"[1,{"as":[["1","1"]]},{"b":[["1","1"]]},"book-10","X"]"#.into(), "mixes"),
        (r#"[1,{"a":[["1","1"]]},"book-ten","X"]"#.into(), "book-ten"),
        (r#"[1,{"a":[["1"]]},"book-10","X"]"#.into(), "price and a quantity"),
        (r#"[1,"book-10","X"]"#.into(), "channelID, a payload"),
        (r#"[1,{},{},{},"book-10","X"]"#.into(), "more than the 5"),
        (r#"["x",{},"book-10","X"]"#.into(), "channelID"),
        (r#"[1,[["1","1","1534614057.3","x","l",""]],"trade","X"]"#.into(), "trade side"),
        (r#"[1,[["1","1","soon","b","l",""]],"trade","X"]"#.into(), "time"),
        (r#"[1,[["1","1","1534614057.3","b"]],"trade","X"]"#.into(), "orderType"),
        (r#"[1,["1","2","3"],"ohlc-1","X"]"#.into(), "etime"),
        ("nonsense".into(), "JSON"),
        (" [".into(), "JSON"),
        ("".into(), "JSON"),
    ] {
        let e = parse(&frame, &mut out).unwrap_err().to_string();
        assert!(e.contains(says), "{frame}: {e}");
    }
    let many = v2(&vec![r#"{"price":1,"qty":1}"#; MAX_LEVELS + 1].join(","));
    assert!(parse(&many, &mut out).unwrap_err().to_string().contains("more than"));
    let many = format!(
        r#"[1,{{"a":[{}]}},{{"b":[{}]}},"book-10","X"]"#,
        vec![r#"["1","1"]"#; MAX_LEVELS / 2 + 1].join(","),
        vec![r#"["1","1"]"#; MAX_LEVELS / 2 + 1].join(",")
    );
    assert!(parse(&many, &mut out).unwrap_err().to_string().contains("book levels"));
    assert!(out.is_empty(), "{out:?}");
}

#[test]
fn exponents_become_plain_decimals_exactly() {
    for (number, plain) in [
        ("45283.5", "45283.5"),
        ("1.5e-7", "0.00000015"),
        ("1e-08", "0.00000001"),
        ("4E+2", "400"),
        ("4e2", "400"),
        ("-2.5e1", "-25"),
        ("1.25e1", "12.5"),
        ("12.5e-1", "1.25"),
        ("0.001e3", "0001"),
        ("5e0", "5"),
        ("5e-000", "5"),
        ("123e-3", "0.123"),
    ] {
        assert_eq!(plain_decimal(number).as_deref(), Ok(plain), "{number}");
    }
    // through the fixed point: trailing zeros past the 8th place are fine, digits are not
    assert_eq!(Price::parse(&plain_decimal("1.50e-7").unwrap()), Price::parse("0.00000015"));
    assert_eq!(Price::parse(&plain_decimal("1.5e-9").unwrap()), Err(ParseDecimalError::TooPrecise));
    for bad in ["1e", "1e+", "1ex", "e5", "1.e5", ".5e1", "1e41", "1e-99999999999", "--1e2"] {
        assert!(plain_decimal(bad).is_err(), "{bad}");
    }
    assert_eq!(plain_decimal("1e40").map(|s| s.len()), Ok(41));
}

/// A v2 book's `data` is read in the envelope's pass when `channel` came first (as Kraken sends
/// it), and kept raw and read afterwards when it did not: the same book either way.
#[test]
fn a_book_reads_the_same_whichever_field_comes_first() {
    let data = r#"[{"symbol":"BTC/USD","bids":[{"price":45283.5,"qty":0.1}],"asks":[{"price":45285.2,"qty":1.5e-3}],"checksum":3310070434}]"#;
    let first = one(&format!(r#"{{"channel":"book","type":"snapshot","data":{data}}}"#));
    let last = one(&format!(r#"{{"data":{data},"type":"snapshot","channel":"book"}}"#));
    assert_eq!(first, last);
    let Message::Book(b) = first else { panic!("{first:?}") };
    assert_eq!((b.bids.len(), b.asks.len(), b.checksum), (1, 1, Some(3_310_070_434)));
    assert_eq!(b.asks[0].qty, shared::Qty::parse("0.0015").unwrap());
}
