use shared::venue::{NumberFormat, SequenceRule, VenueSync, VenueSyncConfig};

use super::*;

fn one(frame: &str) -> Message {
    let mut out = Vec::new();
    parse(frame, &mut out).unwrap();
    assert_eq!(out.len(), 1, "{out:?}");
    out.pop().unwrap()
}

fn lv(p: &str, q: &str) -> Level {
    Level::new(shared::Price::parse(p).unwrap(), shared::Qty::parse(q).unwrap())
}

#[test]
fn a_book_snapshot_and_its_update_sync_with_the_checksum() {
    // the four levels of OKX's checksum example (docs, "Checksum": the string
    // "3366.1:7:3366.8:9:3366:6:3368:8"); its CRC-32 as a signed integer, computed with Python's
    // zlib.crc32, not by this code
    let sum = -1_881_014_294;
    let snapshot = format!(
        r#"{{"arg":{{"channel":"books","instId":"BTC-USDT"}},"action":"snapshot","data":[{{"asks":[["3366.8","9","0","3"],["3368","8","0","1"]],"bids":[["3366.1","7","0","2"],["3366","6","0","1"]],"ts":"1597026383085","checksum":{sum},"prevSeqId":-1,"seqId":123456}}]}}"#
    );
    let Message::Book(b) = one(&snapshot) else { panic!() };
    assert!(b.snapshot);
    assert_eq!((b.seq, b.prev_seq, b.time_ms), (Some(123_456), None, Some(1_597_026_383_085)));
    assert_eq!(b.bids, [lv("3366.1", "7"), lv("3366", "6")]);
    assert_eq!(b.printed.unwrap().price.format(), Some(NumberFormat::Shortest));
    let mut sync =
        VenueSync::new(VenueSyncConfig::new(SequenceRule::Okx, shared::venue::ChecksumRule::Okx));
    sync.handle_message(b.message());
    assert_eq!(sync.stats().checksums_verified, 1);

    let sum = crc32fast::hash(b"3366.1:7:3366.8:9:3366:6:3368:8:3365.9:0.5") as i32;
    let update = format!(
        r#"{{"arg":{{"channel":"books","instId":"BTC-USDT"}},"action":"update","data":[{{"asks":[],"bids":[["3365.9","0.5","0","1"]],"ts":"1597026383185","checksum":{sum},"prevSeqId":123456,"seqId":123457}}]}}"#
    );
    let Message::Book(b) = one(&update) else { panic!() };
    sync.handle_message(b.message());
    assert_eq!(sync.stats().checksums_verified, 2);
    assert!(sync.is_synced());
}

#[test]
fn a_zero_checksum_is_no_checksum_since_okx_deprecated_it() {
    let frame = r#"{"arg":{"channel":"books","instId":"BTC-USDT"},"action":"snapshot","data":[{"asks":[["3366.8","9","0","3"]],"bids":[["3366.1","7","0","2"]],"ts":"1597026383085","checksum":0,"prevSeqId":-1,"seqId":5}]}"#;
    let Message::Book(b) = one(frame) else { panic!() };
    assert_eq!(b.checksum, None);
    let mut sync =
        VenueSync::new(VenueSyncConfig::new(SequenceRule::Okx, shared::venue::ChecksumRule::Okx));
    sync.handle_message(b.message());
    assert!(sync.is_synced());
    assert_eq!((sync.stats().checksums_verified, sync.stats().checksums_unchecked), (0, 1));
}

#[test]
fn trades_candles_tickers_and_answers() {
    let t = one(
        r#"{"arg":{"channel":"trades","instId":"BTC-USDT"},"data":[{"instId":"BTC-USDT","tradeId":"130639474","px":"42219.9","sz":"0.12060306","side":"buy","ts":"1630048897897","count":"3"}]}"#,
    );
    let Message::Trades { symbol, trades } = t else { panic!("{t:?}") };
    assert_eq!(symbol, "BTC-USDT");
    assert_eq!(trades[0].id, TradeId::Seq(130_639_474));
    assert_eq!(trades[0].taker, Some(TakerSide::Buy));
    assert_eq!(trades[0].time_ms, 1_630_048_897_897);

    let c = one(
        r#"{"arg":{"channel":"candle1m","instId":"BTC-USDT"},"data":[["1597026383085","8533.02","8553.74","8527.17","8548.26","45247","529.5858061","529.5858061","0"]]}"#,
    );
    let Message::Candle(c) = c else { panic!("{c:?}") };
    assert_eq!((c.minutes, c.closed), (1, Some(false)));
    assert_eq!(c.candle.high, shared::Price::parse("8553.74").unwrap());

    let k = one(
        r#"{"arg":{"channel":"tickers","instId":"BTC-USDT"},"data":[{"instType":"SPOT","instId":"BTC-USDT","last":"9999.99","lastSz":"0.1","askPx":"9999.99","askSz":"11","bidPx":"8888.88","bidSz":"5","ts":"1597026383085"}]}"#,
    );
    let Message::Ticker(k) = k else { panic!("{k:?}") };
    assert_eq!(k.bid, Some(lv("8888.88", "5")));

    assert_eq!(one("pong"), Message::Heartbeat);
    let refused = one(
        r#"{"event":"error","code":"60014","msg":"Requests too frequent.","connId":"a4d3ae55"}"#,
    );
    assert!(matches!(refused, Message::Refused { rate_limited: true, .. }), "{refused:?}");
    assert!(matches!(
        one(
            r#"{"event":"subscribe","arg":{"channel":"books","instId":"BTC-USDT"},"connId":"a4d3ae55"}"#
        ),
        Message::Ack { .. }
    ));
}

#[test]
fn bad_frames_are_errors_naming_what_is_wrong() {
    let mut out = Vec::new();
    for (frame, says) in [
        (
            r#"{"arg":{"channel":"books","instId":"X"},"action":"update","data":[{"asks":[["1e3","1"]],"bids":[]}]}"#,
            "price",
        ),
        (
            r#"{"arg":{"channel":"books","instId":"X"},"action":"update","data":[{"asks":[["-1","1"]],"bids":[]}]}"#,
            "not positive",
        ),
        (
            r#"{"arg":{"channel":"books","instId":"X"},"action":"update","data":[{"asks":[["1"]],"bids":[]}]}"#,
            "price and a quantity",
        ),
        (
            r#"{"arg":{"channel":"books","instId":"X"},"action":"update","data":[{"checksum":99999999999}]}"#,
            "32-bit",
        ),
        (r#"{"arg":{"channel":"books","instId":"X"},"action":"later","data":[]}"#, "action"),
        (r#"{"arg":{"channel":"books"},"data":[]}"#, "instId"),
        ("nonsense", "JSON"),
    ] {
        let e = parse(frame, &mut out).unwrap_err().to_string();
        assert!(e.contains(says), "{frame}: {e}");
    }
    let many = format!(
        r#"{{"arg":{{"channel":"books","instId":"X"}},"action":"update","data":[{{"asks":[{}],"bids":[]}}]}}"#,
        vec![r#"["1","1"]"#; crate::MAX_LEVELS + 1].join(",")
    );
    assert!(parse(&many, &mut out).unwrap_err().to_string().contains("more than"));
    assert!(out.is_empty());
}

/// A book's `data` is read in the envelope's pass when `arg` came first (as OKX sends it), and
/// kept raw and read afterwards when it did not: the same book either way. A repeated field is
/// refused, as a derived reader would.
#[test]
fn a_book_reads_the_same_whichever_field_comes_first() {
    let data = r#"[{"asks":[["3366.8","9","0","3"]],"bids":[["3366.1","7","0","2"]],"ts":"1597026383085","checksum":-855196043,"prevSeqId":-1,"seqId":5}]"#;
    let arg = r#"{"channel":"books","instId":"BTC-USDT"}"#;
    let first = one(&format!(r#"{{"arg":{arg},"action":"snapshot","data":{data}}}"#));
    let last = one(&format!(r#"{{"data":{data},"action":"snapshot","arg":{arg},"extra":[1]}}"#));
    assert_eq!(first, last);
    let Message::Book(b) = first else { panic!("{first:?}") };
    assert_eq!(b.asks, [lv("3366.8", "9")]);
    let twice = format!(r#"{{"arg":{arg},"action":"snapshot","data":{data},"data":{data}}}"#);
    let e = parse(&twice, &mut Vec::new()).unwrap_err().to_string();
    assert!(e.contains("duplicate field `data`"), "{e}");
}
