use shared::sync::{ResyncReason, SyncEvent};
use shared::venue::{ChecksumRule, SequenceRule, VenueSync, VenueSyncConfig};

use super::*;

fn all(frame: &str) -> Vec<Message> {
    let mut out = Vec::new();
    parse(frame, &mut out).unwrap();
    out
}

fn one(frame: &str) -> Message {
    let mut out = all(frame);
    assert_eq!(out.len(), 1, "{out:?}");
    out.pop().unwrap()
}

fn lv(p: &str, q: &str) -> Level {
    Level::new(shared::Price::parse(p).unwrap(), shared::Qty::parse(q).unwrap())
}

fn book_of(frame: &str) -> BookFrame {
    match one(frame) {
        Message::Book(b) => b,
        other => panic!("{other:?}"),
    }
}

fn events(s: &mut VenueSync) -> Vec<SyncEvent> {
    std::iter::from_fn(|| s.poll_event()).collect()
}

/// The delta example of <https://bybit-exchange.github.io/docs/v5/websocket/public/orderbook>,
/// verbatim.
const DOCS_DELTA: &str = r#"{
    "topic": "orderbook.50.BTCUSDT",
    "type": "delta",
    "ts": 1687940967466,
    "data": {
        "s": "BTCUSDT",
        "b": [
            [
                "30247.20",
                "30.028"
            ],
            [
                "30245.40",
                "0.224"
            ],
            [
                "30242.10",
                "1.593"
            ],
            [
                "30240.30",
                "1.305"
            ],
            [
                "30240.00",
                "0"
            ]
        ],
        "a": [
            [
                "30248.70",
                "0"
            ],
            [
                "30249.30",
                "0.892"
            ],
            [
                "30249.50",
                "1.778"
            ],
            [
                "30249.60",
                "0"
            ],
            [
                "30251.90",
                "2.947"
            ],
            [
                "30252.20",
                "0.659"
            ],
            [
                "30252.50",
                "4.591"
            ]
        ],
        "u": 177400507,
        "seq": 66544703342
    },
    "cts": 1687940967464
}"#;

/// The snapshot example of the same page, its `...` elisions (not JSON) taken out.
const DOCS_SNAPSHOT: &str = r#"{
    "topic": "orderbook.50.BTCUSDT",
    "type": "snapshot",
    "ts": 1672304484978,
    "data": {
        "s": "BTCUSDT",
        "b": [
            [
                "16493.50",
                "0.006"
            ],
            [
                "16493.00",
                "0.100"
            ]
        ],
        "a": [
            [
                "16611.00",
                "0.029"
            ],
            [
                "16612.00",
                "0.213"
            ]
        ],
    "u": 18521288,
    "seq": 7961638724
    },
    "cts": 1672304484976
}"#;

fn bybit_sync() -> VenueSync {
    VenueSync::new(VenueSyncConfig::new(SequenceRule::Bybit, ChecksumRule::None))
}

#[test]
fn the_docs_book_examples_read_exactly() {
    let s = book_of(DOCS_SNAPSHOT);
    assert!(s.snapshot);
    assert_eq!(s.symbol, "BTCUSDT");
    assert_eq!(s.depth, Some(50));
    assert_eq!((s.seq, s.prev_seq, s.cross_seq), (Some(18_521_288), None, Some(7_961_638_724)));
    assert_eq!(s.time_ms, Some(1_672_304_484_978));
    assert_eq!(s.bids, [lv("16493.5", "0.006"), lv("16493", "0.1")]);
    assert_eq!(s.asks, [lv("16611", "0.029"), lv("16612", "0.213")]);
    assert_eq!(s.checksum, None);
    // Bybit pads its strings ("16493.00", "0.100"): a learning book sees two places of price
    let printed = s.printed.unwrap();
    assert_eq!(printed.price.format(), Some(shared::venue::NumberFormat::Fixed(2)));

    let d = book_of(DOCS_DELTA);
    assert!(!d.snapshot);
    assert_eq!((d.seq, d.cross_seq), (Some(177_400_507), Some(66_544_703_342)));
    assert_eq!(d.time_ms, Some(1_687_940_967_466));
    assert_eq!(d.bids.len(), 5);
    assert_eq!(d.bids[4], lv("30240", "0"));
    assert_eq!(d.asks.len(), 7);
    assert_eq!(d.asks[0], lv("30248.7", "0"));
}

#[test]
fn snapshot_and_deltas_sync_and_a_gap_resyncs_until_u_one_restarts() {
    let mut sync = bybit_sync();
    // a snapshot one before the docs' delta, holding the levels it deletes
    let snapshot = r#"{"topic":"orderbook.50.BTCUSDT","type":"snapshot","ts":1687940967400,"data":{"s":"BTCUSDT","b":[["30240.00","2.5"],["30239.90","1"]],"a":[["30248.70","0.5"],["30249.60","0.7"],["30253.00","1"]],"u":177400506,"seq":66544703300},"cts":1687940967398}"#;
    sync.handle_message(book_of(snapshot).message());
    assert_eq!(events(&mut sync), [SyncEvent::Synced { last_update_id: 1 }]);

    sync.handle_message(book_of(DOCS_DELTA).message());
    assert!(sync.is_synced());
    assert_eq!(sync.last_seq(), Some(177_400_507));
    assert_eq!(sync.book().best_bid(), Some(lv("30247.2", "30.028")));
    assert_eq!(sync.book().best_ask(), Some(lv("30249.3", "0.892")));
    // the deleted levels are gone, the untouched one stays
    assert_eq!(sync.book().bids.len(), 5);
    assert_eq!(sync.book().asks.len(), 6);

    // u skips 177400508: a gap, and the book waits for a snapshot
    let gap = DOCS_DELTA.replace("177400507", "177400509");
    sync.handle_message(book_of(&gap).message());
    assert!(!sync.is_synced());
    assert_eq!(sync.stats().gaps, 1);
    assert!(events(&mut sync).contains(&SyncEvent::NeedSnapshot { reason: ResyncReason::Gap }));
    let later = DOCS_DELTA.replace("177400507", "177400510");
    sync.handle_message(book_of(&later).message());
    assert_eq!(sync.stats().unsynced_dropped, 1);

    // the service restarted: a delta with u = 1 is read as it came, and is the whole book
    let restart = r#"{"topic":"orderbook.50.BTCUSDT","type":"delta","ts":1687941000000,"data":{"s":"BTCUSDT","b":[["30100.00","1.000"]],"a":[["30101.00","2.000"]],"u":1,"seq":66544709999},"cts":1687940999998}"#;
    let b = book_of(restart);
    assert!(!b.snapshot);
    assert_eq!(b.seq, Some(1));
    sync.handle_message(b.message());
    assert!(sync.is_synced());
    assert_eq!(sync.stats().sequence_resets, 1);
    assert_eq!(sync.book().bids.len(), 1);
    assert_eq!(sync.book().best_ask(), Some(lv("30101", "2")));
    let next =
        restart.replace(r#""u":1,"#, r#""u":2,"#).replace("30100.00\",\"1.000", "30100.00\",\"0");
    sync.handle_message(book_of(&next).message());
    assert!(sync.is_synced());
    assert_eq!(sync.book().best_bid(), None);
}

#[test]
fn trades_one_message_per_symbol_in_the_order_received() {
    // the example of <https://bybit-exchange.github.io/docs/v5/websocket/public/trade>, verbatim
    let docs = r#"{
    "topic": "publicTrade.BTCUSDT",
    "type": "snapshot",
    "ts": 1672304486868,
    "data": [
        {
            "T": 1672304486865,
            "s": "BTCUSDT",
            "S": "Buy",
            "v": "0.001",
            "p": "16578.50",
            "L": "PlusTick",
            "i": "20f43950-d8dd-5b31-9112-a178eb6023af",
            "BT": false,
            "seq": 1783284617
        }
    ]
}"#;
    let Message::Trades { symbol, trades } = one(docs) else { panic!() };
    assert_eq!(symbol, "BTCUSDT");
    assert_eq!(
        trades,
        [Trade {
            id: TradeId::Text("20f43950-d8dd-5b31-9112-a178eb6023af".into()),
            time_ms: 1_672_304_486_865,
            price: shared::Price::parse("16578.5").unwrap(),
            qty: shared::Qty::parse("0.001").unwrap(),
            taker: Some(TakerSide::Buy),
        }]
    );

    let mixed = r#"{"topic":"publicTrade.BTCUSDT","type":"snapshot","ts":1,"data":[
        {"T":3,"s":"BTCUSDT","S":"Sell","v":"1","p":"10","i":"2290000000036455162"},
        {"T":4,"s":"ETHUSDT","S":"Buy","v":"2","p":"20","i":"b"},
        {"T":5,"s":"BTCUSDT","S":"Buy","v":"3","p":"11","i":"c"}]}"#;
    let out = all(mixed);
    assert_eq!(out.len(), 2, "{out:?}");
    let Message::Trades { symbol, trades } = &out[0] else { panic!() };
    assert_eq!(symbol, "BTCUSDT");
    assert_eq!(trades.iter().map(|t| t.time_ms).collect::<Vec<_>>(), [3, 5]);
    assert_eq!(trades[0].id, TradeId::Seq(2_290_000_000_036_455_162));
    assert_eq!(trades[0].taker, Some(TakerSide::Sell));
    let Message::Trades { symbol, trades } = &out[1] else { panic!() };
    assert_eq!((symbol.as_str(), trades.len()), ("ETHUSDT", 1));
}

#[test]
fn klines_with_confirm_and_their_intervals() {
    // the example of <https://bybit-exchange.github.io/docs/v5/websocket/public/kline>, verbatim
    let docs = r#"{
    "topic": "kline.5.BTCUSDT",
    "data": [
        {
            "start": 1672324800000,
            "end": 1672325099999,
            "interval": "5",
            "open": "16649.5",
            "close": "16677",
            "high": "16677",
            "low": "16608",
            "volume": "2.081",
            "turnover": "34666.4005",
            "confirm": false,
            "timestamp": 1672324988882
        }
    ],
    "ts": 1672324988882,
    "type": "snapshot"
}"#;
    let Message::Candle(c) = one(docs) else { panic!() };
    assert_eq!((c.symbol.as_str(), c.minutes, c.closed), ("BTCUSDT", 5, Some(false)));
    assert_eq!(c.candle.open_time, 1_672_324_800_000);
    assert_eq!(c.candle.minutes, 5);
    assert_eq!(c.candle.close, shared::Price::parse("16677").unwrap());
    assert_eq!(c.candle.volume, shared::Volume::parse("2.081").unwrap());

    let closed = docs.replace("\"confirm\": false", "\"confirm\": true");
    let Message::Candle(c) = one(&closed) else { panic!() };
    assert_eq!(c.closed, Some(true));

    let day = docs.replace("kline.5.", "kline.D.");
    let Message::Candle(c) = one(&day) else { panic!() };
    assert_eq!(c.minutes, 1440);
    let week = docs.replace("kline.5.", "kline.W.");
    let Message::Candle(c) = one(&week) else { panic!() };
    assert_eq!(c.minutes, 10_080);
    // a month has no fixed length in minutes
    let month = docs.replace("kline.5.", "kline.M.");
    assert_eq!(one(&month), Message::Ignored { channel: "kline.M.BTCUSDT".into() });
}

#[test]
fn tickers_of_linear_and_spot() {
    // the linear example of <https://bybit-exchange.github.io/docs/v5/websocket/public/ticker>,
    // verbatim
    let linear = r#"{
    "topic": "tickers.BTCUSDT",
    "type": "snapshot",
    "data": {
        "symbol": "BTCUSDT",
        "tickDirection": "PlusTick",
        "price24hPcnt": "0.017103",
        "lastPrice": "17216.00",
        "prevPrice24h": "16926.50",
        "highPrice24h": "17281.50",
        "lowPrice24h": "16915.00",
        "prevPrice1h": "17238.00",
        "markPrice": "17217.33",
        "indexPrice": "17227.36",
        "openInterest": "68744.761",
        "openInterestValue": "1183601235.91",
        "turnover24h": "1570383121.943499",
        "volume24h": "91705.276",
        "nextFundingTime": "1673280000000",
        "fundingRate": "-0.000212",
        "bid1Price": "17215.50",
        "bid1Size": "84.489",
        "ask1Price": "17216.00",
        "ask1Size": "83.020"
    },
    "cs": 24987956059,
    "ts": 1673272861686
}"#;
    assert_eq!(
        one(linear),
        Message::Ticker(TickerFrame {
            symbol: "BTCUSDT".into(),
            bid: Some(lv("17215.5", "84.489")),
            ask: Some(lv("17216", "83.02")),
            cross_seq: Some(24_987_956_059),
            time_ms: Some(1_673_272_861_686),
        })
    );
    // the spot example of the same page, verbatim: no book fields
    let spot = r#"{
    "topic": "tickers.BTCUSDT",
    "ts": 1672305380595,
    "type": "snapshot",
    "cs": 496622841,
    "data": {
        "symbol": "BTCUSDT",
        "lastPrice": "16363.78",
        "highPrice24h": "16566.64",
        "lowPrice24h": "16009.19",
        "prevPrice24h": "16443.66",
        "volume24h": "5865.470182",
        "turnover24h": "95949815.680875",
        "price24hPcnt": "-0.0049"
    }
}"#;
    let Message::Ticker(t) = one(spot) else { panic!() };
    assert_eq!((t.bid, t.ask, t.cross_seq), (None, None, Some(496_622_841)));
    // a linear delta carries only what changed: a price without its size is no level
    let delta = r#"{"topic":"tickers.BTCUSDT","type":"delta","data":{"symbol":"BTCUSDT","bid1Price":"17215.00"},"cs":24987956060,"ts":1673272861786}"#;
    let Message::Ticker(t) = one(delta) else { panic!() };
    assert_eq!(t.bid, None);
    // `ts` as a string, as the docs' own reminder prints it
    let text_ts = r#"{"topic":"orderbook.1.BTCUSDT","ts":"1772694601512","type":"snapshot","data":{"s":"BTCUSDT","b":[["1","1"]],"a":[],"u":5,"seq":6}}"#;
    assert_eq!(book_of(text_ts).time_ms, Some(1_772_694_601_512));
}

#[test]
fn answers() {
    // the pong examples of <https://bybit-exchange.github.io/docs/v5/ws/connect>, verbatim
    for pong in [
        r#"{
    "success": true,
    "ret_msg": "pong",
    "conn_id": "0970e817-426e-429a-a679-ff7f55e0b16a",
    "op": "ping"
}"#,
        r#"{
    "success": true,
    "ret_msg": "pong",
    "conn_id": "465772b1-7630-4fdc-a492-e003e6f0f260",
    "req_id": "",
    "op": "ping"
}"#,
        r#"{
    "args": [
        "1672916271846"
    ],
    "op": "pong"
}"#,
    ] {
        assert_eq!(one(pong), Message::Heartbeat, "{pong}");
    }
    // the subscription answer of the same page, verbatim
    let ack = one(r#"{
    "success": true,
    "ret_msg": "subscribe",
    "conn_id": "2324d924-aa4d-45b0-a858-7b8be29ab52b",
    "req_id": "10001",
    "op": "subscribe"
}"#);
    assert_eq!(ack, Message::Ack { detail: "subscribe subscribe".into() });
    let Message::Refused { rate_limited, message, .. } = one(
        r#"{"success":false,"ret_msg":"Invalid symbol :[orderbook.50.NOPE]","conn_id":"c","req_id":"","op":"subscribe"}"#,
    ) else {
        panic!()
    };
    assert!(!rate_limited);
    assert!(message.starts_with("subscribe Invalid symbol"), "{message}");
    // "Too many visits!" and its code 10006 (<https://bybit-exchange.github.io/docs/v5/rate-limit>)
    for limited in [
        r#"{"success":false,"ret_msg":"Too many visits!","op":"subscribe"}"#,
        r#"{"success":false,"retCode":10006,"ret_msg":"","op":"subscribe"}"#,
    ] {
        let m = one(limited);
        assert!(matches!(m, Message::Refused { rate_limited: true, .. }), "{m:?}");
    }
    assert_eq!(
        one(r#"{"topic":"liquidation.BTCUSDT","data":{}}"#),
        Message::Ignored { channel: "liquidation.BTCUSDT".into() }
    );
    assert_eq!(
        subscribe(&["orderbook.50.BTCUSDT"]),
        r#"{"args":["orderbook.50.BTCUSDT"],"op":"subscribe"}"#
    );
    assert_eq!(ping(), r#"{"op":"ping"}"#);
}

#[test]
fn bad_frames_are_errors_naming_what_is_wrong() {
    let book =
        |data: &str| format!(r#"{{"topic":"orderbook.50.X","type":"delta","ts":1,"data":{data}}}"#);
    let mut out = Vec::new();
    for (frame, says) in [
        (book(r#"{"s":"X","b":[["1e3","1"]],"a":[],"u":2}"#), "price"),
        (book(r#"{"s":"X","b":[["-1","1"]],"a":[],"u":2}"#), "not positive"),
        (book(r#"{"s":"X","b":[["1","x"]],"a":[],"u":2}"#), "quantity"),
        (book(r#"{"s":"X","b":[["1"]],"a":[],"u":2}"#), "price and a quantity"),
        (book(r#"{"s":"X","b":[],"a":[]}"#), "missing field `u`"),
        (book(r#"{"s":"X","b":[],"a":[],"u":-3}"#), "bad number \"-3\" in u"),
        (book(r#"{"s":"X","b":[],"a":[],"u":"7x"}"#), "in u"),
        (book(r#"{"s":"X","b":[],"a":[],"u":1.5}"#), "in u"),
        (r#"{"topic":"orderbook.50.X","type":"later","data":{"u":1}}"#.into(), "book type"),
        (r#"{"topic":"orderbook.fifty.X","type":"delta","data":{"u":1}}"#.into(), "depth"),
        (r#"{"topic":"orderbook.50.X","type":"delta"}"#.into(), "`data`"),
        (r#"{"topic":"orderbook.50.X","type":"delta","ts":"soon","data":{"u":1}}"#.into(), "in ts"),
        (
            r#"{"topic":"publicTrade.X","data":[{"T":1,"s":"X","S":"Both","v":"1","p":"1","i":"a"}]}"#.into(),
            "trade side",
        ),
        (r#"{"topic":"publicTrade.X","data":[{"T":1,"s":"X","S":"Buy","v":"1","i":"a"}]}"#.into(), "`p`"),
        (
            r#"{"topic":"publicTrade.X","data":[{"T":1,"s":"X","S":"Buy","v":"1","p":"1.2.3","i":"a"}]}"#.into(),
            "trade price",
        ),
        (
            r#"{"topic":"kline.2.X","data":[]}"#.into(),
            "kline interval",
        ),
        (
            r#"{"topic":"kline.1.X","data":[{"start":0,"open":"5","high":"4","low":"3","close":"4","volume":"1","confirm":true}]}"#.into(),
            "candle",
        ),
        (
            r#"{"topic":"tickers.X","data":{"bid1Price":"0","bid1Size":"1"}}"#.into(),
            "ticker price",
        ),
        (r#"{"conn_id":"x"}"#.into(), "`topic`"),
        ("nonsense".into(), "JSON"),
    ] {
        let e = parse(&frame, &mut out).unwrap_err().to_string();
        assert!(e.contains(says), "{frame}: {e}");
    }
    let many = book(&format!(
        r#"{{"s":"X","b":[{}],"a":[],"u":2}}"#,
        vec![r#"["1","1"]"#; crate::MAX_LEVELS + 1].join(",")
    ));
    assert!(parse(&many, &mut out).unwrap_err().to_string().contains("more than"));
    let trades = format!(
        r#"{{"topic":"publicTrade.X","data":[{}]}}"#,
        vec![r#"{"T":1,"s":"X","S":"Buy","v":"1","p":"1","i":"a"}"#; crate::MAX_ITEMS + 1]
            .join(",")
    );
    assert!(parse(&trades, &mut out).unwrap_err().to_string().contains("more than"));
    // a kline list that fails part way leaves nothing behind
    let half = r#"{"topic":"kline.1.X","data":[{"start":0,"open":"1","high":"1","low":"1","close":"1","volume":"1","confirm":true},{"start":60000,"open":"x","high":"1","low":"1","close":"1","volume":"1","confirm":true}]}"#;
    assert!(parse(half, &mut out).is_err());
    assert!(out.is_empty());
}

#[test]
fn cut_and_altered_frames_never_panic() {
    let mut out = Vec::new();
    for frame in [DOCS_SNAPSHOT, DOCS_DELTA] {
        for cut in 0..frame.len() {
            let _ = parse(&frame[..cut], &mut out);
            // every byte in turn made a digit, a quote, a bracket
            for b in ["9", "\"", "]"] {
                let altered = format!("{}{b}{}", &frame[..cut], &frame[cut + 1..]);
                let _ = parse(&altered, &mut out);
            }
        }
    }
}

/// A book's `data` is read in the envelope's pass when `topic` came first (as Bybit sends it),
/// and kept raw and read afterwards when it did not: the same book either way.
#[test]
fn a_book_reads_the_same_whichever_field_comes_first() {
    let data = r#"{"s":"BTCUSDT","b":[["16493.50","0.006"]],"a":[["16611.00","0.029"]],"u":18521288,"seq":7961638724}"#;
    let topic = r#""topic":"orderbook.50.BTCUSDT","type":"snapshot","ts":1672304484978"#;
    let first = one(&format!(r#"{{{topic},"data":{data},"cts":1672304484976}}"#));
    let last = one(&format!(r#"{{"data":{data},{topic},"cts":1672304484976}}"#));
    assert_eq!(first, last);
    let Message::Book(b) = first else { panic!("{first:?}") };
    assert_eq!((b.seq, b.bids.len(), b.asks.len()), (Some(18_521_288), 1, 1));
}
