use shared::sync::{ResyncReason, SyncEvent};
use shared::venue::{
    ChecksumRule, ConnectionSequence, ConnectionVerdict, SequenceRule, VenueSync, VenueSyncConfig,
};

use super::*;

fn all(frame: &str) -> Vec<Message> {
    let mut out = Vec::new();
    parse(frame, &mut out).unwrap();
    out
}

fn lv(p: &str, q: &str) -> Level {
    Level::new(shared::Price::parse(p).unwrap(), shared::Qty::parse(q).unwrap())
}

/// The connection's side of a Coinbase session: every frame's `sequence_num` goes to its
/// [`ConnectionSequence`] first; a gap tells each book; book frames go to their book.
struct Connection {
    sequence: ConnectionSequence,
    book: VenueSync,
}

impl Connection {
    fn new() -> Self {
        Self {
            sequence: ConnectionSequence::default(),
            book: VenueSync::new(VenueSyncConfig::new(
                SequenceRule::Connection,
                ChecksumRule::None,
            )),
        }
    }

    fn receive(&mut self, frame: &str) -> Vec<Message> {
        let out = all(frame);
        for m in &out {
            match m {
                Message::Sequence { seq } => {
                    if let ConnectionVerdict::Gap { .. } = self.sequence.observe(*seq) {
                        self.book.handle_lost_message();
                    }
                }
                Message::Book(b) => self.book.handle_message(b.message()),
                _ => {}
            }
        }
        out
    }
}

fn l2(seq: u64, kind: &str, updates: &str) -> String {
    format!(
        r#"{{"channel":"l2_data","client_id":"","timestamp":"2023-02-09T20:32:50.714964855Z","sequence_num":{seq},"events":[{{"type":"{kind}","product_id":"BTC-USD","updates":[{updates}]}}]}}"#
    )
}

#[test]
fn a_book_syncs_and_a_lost_message_of_any_channel_resyncs_it() {
    let mut c = Connection::new();
    // shaped as recorded l2_data frames are (no l2_data example was found in Coinbase's docs)
    let out = c.receive(&l2(
        0,
        "snapshot",
        r#"{"side":"bid","event_time":"1970-01-01T00:00:00Z","price_level":"21921.73","new_quantity":"0.06317902"},
           {"side":"bid","event_time":"1970-01-01T00:00:00Z","price_level":"21921.3","new_quantity":"0.02"},
           {"side":"offer","event_time":"1970-01-01T00:00:00Z","price_level":"21921.74","new_quantity":"0.11"}"#,
    ));
    assert_eq!(out[0], Message::Sequence { seq: 0 });
    let Message::Book(b) = &out[1] else { panic!("{out:?}") };
    assert!(b.snapshot);
    assert_eq!((b.symbol.as_str(), b.seq, b.depth), ("BTC-USD", Some(0), None));
    assert_eq!(b.time_ms, Some(1_675_974_770_714));
    assert_eq!(b.bids, [lv("21921.73", "0.06317902"), lv("21921.3", "0.02")]);
    assert_eq!(b.asks, [lv("21921.74", "0.11")]);
    assert_eq!(b.printed.unwrap().price.format(), Some(shared::venue::NumberFormat::Shortest));
    assert!(c.book.is_synced());

    // an update: new_quantity is absolute, "0" removes the level; its time is the newest of
    // its updates' (the book's), not the time it was sent
    let out = c.receive(&l2(
        1,
        "update",
        r#"{"side":"bid","event_time":"2023-02-09T20:32:50.700964855Z","price_level":"21921.73","new_quantity":"0"},
           {"side":"offer","event_time":"2023-02-09T20:32:50.701Z","price_level":"21921.74","new_quantity":"0.5"},
           {"side":"offer","event_time":"2023-02-09T20:32:50.701Z","price_level":"21921.75","new_quantity":"0.5"}"#,
    ));
    let Message::Book(b) = &out[1] else { panic!("{out:?}") };
    assert_eq!(b.time_ms, Some(1_675_974_770_701));
    assert!(c.book.is_synced());
    assert_eq!(c.book.book().best_bid(), Some(lv("21921.3", "0.02")));
    assert_eq!(c.book.book().best_ask(), Some(lv("21921.74", "0.5")));

    // a heartbeat counts in the same sequence
    let hb = r#"{"channel":"heartbeats","client_id":"","timestamp":"2023-06-23T20:31:26.122969572Z","sequence_num":2,"events":[{"current_time":"2023-06-23 20:31:56.121961769 +0000 UTC m=+91717.525857105","heartbeat_counter":"3049"}]}"#;
    assert_eq!(c.receive(hb), [Message::Sequence { seq: 2 }, Message::Heartbeat]);
    assert!(c.book.is_synced());

    // sequence_num 3 (a trade, say) was lost: the book cannot know it was not one of its own
    let trade = r#"{"channel":"market_trades","client_id":"","timestamp":"2023-02-09T20:32:51Z","sequence_num":4,"events":[{"type":"update","trades":[{"trade_id":"1","product_id":"BTC-USD","price":"21921.74","size":"0.1","side":"BUY","time":"2023-02-09T20:32:50.9Z"}]}]}"#;
    c.receive(trade);
    assert!(!c.book.is_synced());
    assert_eq!(c.sequence.gaps, 1);
    assert!(std::iter::from_fn(|| c.book.poll_event())
        .any(|e| e == SyncEvent::NeedSnapshot { reason: ResyncReason::Gap }));
    // updates are dropped until the next snapshot (the resubscription's)
    c.receive(&l2(
        5,
        "update",
        r#"{"side":"bid","event_time":"","price_level":"1","new_quantity":"1"}"#,
    ));
    assert_eq!(c.book.stats().unsynced_dropped, 1);
    c.receive(&l2(
        6,
        "snapshot",
        r#"{"side":"bid","event_time":"","price_level":"21900","new_quantity":"1"}"#,
    ));
    assert!(c.book.is_synced());
    assert_eq!(c.book.book().best_bid(), Some(lv("21900", "1")));
}

#[test]
fn trades_candles_tickers_and_answers() {
    let trades = r#"{"channel":"market_trades","client_id":"","timestamp":"2023-02-09T20:19:35.39625135Z","sequence_num":7,"events":[{"type":"update","trades":[
        {"trade_id":"000000000","product_id":"ETH-USD","price":"1260.01","size":"0.3","side":"BUY","time":"2019-08-14T20:42:27.265Z"},
        {"trade_id":"355495415","product_id":"BTC-USD","price":"120.71","size":"1.29080517","side":"SELL","time":"2026-09-26T04:15:00.114692Z"},
        {"trade_id":"355495416","product_id":"ETH-USD","price":"1260.02","size":"0.1","side":"SELL","time":"2019-08-14T20:42:27.300Z"}]}]}"#;
    let out = all(trades);
    assert_eq!(out.len(), 3, "{out:?}");
    assert_eq!(out[0], Message::Sequence { seq: 7 });
    let Message::Trades { symbol, trades } = &out[1] else { panic!("{out:?}") };
    assert_eq!(symbol, "ETH-USD");
    assert_eq!(trades.len(), 2);
    // "000000000" is no canonical number: kept as text, so it reads back the same
    assert_eq!(trades[0].id, TradeId::Text("000000000".into()));
    assert_eq!(trades[0].taker, Some(TakerSide::Buy));
    assert_eq!(trades[0].time_ms, 1_565_815_347_265);
    assert_eq!(trades[1].id, TradeId::Seq(355_495_416));
    let Message::Trades { symbol, trades } = &out[2] else { panic!("{out:?}") };
    assert_eq!((symbol.as_str(), trades[0].taker), ("BTC-USD", Some(TakerSide::Sell)));
    assert_eq!(trades[0].qty, shared::Qty::parse("1.29080517").unwrap());

    let candles = r#"{"channel":"candles","client_id":"","timestamp":"2023-06-09T20:19:35.39625135Z","sequence_num":8,"events":[{"type":"snapshot","candles":[{"start":"1688998200","high":"1867.72","low":"1865.63","open":"1867.38","close":"1866.81","volume":"0.20269406","product_id":"ETH-USD"}]}]}"#;
    let out = all(candles);
    let Message::Candle(c) = &out[1] else { panic!("{out:?}") };
    assert_eq!((c.symbol.as_str(), c.minutes, c.closed), ("ETH-USD", 5, None));
    assert_eq!(c.candle.open_time, 1_688_998_200_000);
    assert_eq!(c.candle.minutes, 5);
    assert_eq!(c.candle.low, shared::Price::parse("1865.63").unwrap());

    let ticker = r#"{"channel":"ticker","client_id":"","timestamp":"2023-02-09T20:30:37.167359596Z","sequence_num":9,"events":[{"type":"snapshot","tickers":[{"type":"ticker","product_id":"BTC-USD","price":"21932.98","volume_24_h":"16038.28770938","low_24_h":"21835.29","high_24_h":"23011.18","low_52_w":"15460","high_52_w":"48240","price_percent_chg_24_h":"-4.15775596190603","best_bid":"21931.98","best_bid_quantity":"0.50000000","best_ask":"21932.98","best_ask_quantity":"0.03000000"}]}]}"#;
    let out = all(ticker);
    assert_eq!(
        out[1],
        Message::Ticker(TickerFrame {
            symbol: "BTC-USD".into(),
            bid: Some(lv("21931.98", "0.5")),
            ask: Some(lv("21932.98", "0.03")),
            cross_seq: None,
            time_ms: Some(1_675_974_637_167),
        })
    );
    let batch = ticker.replace(r#""channel":"ticker""#, r#""channel":"ticker_batch""#);
    assert!(matches!(all(&batch)[1], Message::Ticker(_)));

    // the heartbeats message of Coinbase's channel docs
    // (<https://docs.cdp.coinbase.com/coinbase-app/advanced-trade-apis/websocket/websocket-channels>),
    // verbatim
    let hb = r#"{
"channel": "heartbeats",
"client_id": "",
"timestamp": "2023-06-23T20:31:26.122969572Z",
"sequence_num": 0,
"events": [
{
"current_time": "2023-06-23 20:31:56.121961769 +0000 UTC m=+91717.525857105",
"heartbeat_counter": "3049"
}
]
}"#;
    assert_eq!(all(hb), [Message::Sequence { seq: 0 }, Message::Heartbeat]);

    let subs = r#"{"channel":"subscriptions","client_id":"","timestamp":"2023-02-09T20:32:50Z","sequence_num":1,"events":[{"subscriptions":{"level2":["BTC-USD"]}}]}"#;
    assert_eq!(
        all(subs),
        [Message::Sequence { seq: 1 }, Message::Ack { detail: "subscriptions".into() }]
    );
    let refused = all(r#"{"type":"error","message":"failure to subscribe"}"#);
    assert!(matches!(&refused[..], [Message::Refused { rate_limited: false, .. }]), "{refused:?}");
    let limited = all(r#"{"type":"error","message":"rate limit exceeded"}"#);
    assert!(matches!(&limited[..], [Message::Refused { rate_limited: true, .. }]), "{limited:?}");
    let status = r#"{"channel":"status","client_id":"","timestamp":"2023-02-09T20:29:49Z","sequence_num":3,"events":[]}"#;
    assert_eq!(all(status)[1], Message::Ignored { channel: "status".into() });

    assert_eq!(
        subscribe("level2", &["BTC-USD", "ETH-USD"]),
        r#"{"channel":"level2","product_ids":["BTC-USD","ETH-USD"],"type":"subscribe"}"#
    );
}

#[test]
fn bad_frames_are_errors_naming_what_is_wrong_and_leave_nothing() {
    let mut out = Vec::new();
    let trade = |t: &str| {
        format!(
            r#"{{"channel":"market_trades","sequence_num":1,"events":[{{"type":"update","trades":[{t}]}}]}}"#
        )
    };
    for (frame, says) in [
        (l2(1, "update", r#"{"side":"bid","price_level":"1e3","new_quantity":"1"}"#), "price"),
        (l2(1, "update", r#"{"side":"bid","price_level":"-1","new_quantity":"1"}"#), "not positive"),
        (l2(1, "update", r#"{"side":"bid","price_level":"1","new_quantity":"-1"}"#), "quantity"),
        (l2(1, "update", r#"{"side":"middle","price_level":"1","new_quantity":"1"}"#), "book side"),
        (l2(1, "update", r#"{"side":"bid","new_quantity":"1"}"#), "`price_level`"),
        (l2(1, "later", ""), "book event type"),
        (
            l2(1, "update", r#"{"side":"bid","event_time":"today","price_level":"1","new_quantity":"1"}"#),
            "event_time",
        ),
        (
            l2(1, "update", "").replace("2023-02-09T20:32:50.714964855Z", "yesterday"),
            "timestamp",
        ),
        (l2(1, "update", "").replace(r#""sequence_num":1"#, r#""sequence_num":-1"#), "sequence_num"),
        (r#"{"channel":"l2_data","sequence_num":1}"#.into(), "`events`"),
        (
            trade(r#"{"trade_id":"1","product_id":"X","price":"1","size":"1","side":"BUY","time":"noon"}"#),
            "trade time",
        ),
        (
            trade(r#"{"trade_id":"1","product_id":"X","price":"1","size":"1","side":"HOLD","time":"2023-02-09T20:32:50Z"}"#),
            "trade side",
        ),
        (
            trade(r#"{"trade_id":"1","product_id":"X","price":"1","side":"BUY","time":"2023-02-09T20:32:50Z"}"#),
            "`size`",
        ),
        (
            r#"{"channel":"candles","events":[{"candles":[{"start":"soon","high":"1","low":"1","open":"1","close":"1","volume":"1","product_id":"X"}]}]}"#.into(),
            "candle start",
        ),
        (
            r#"{"channel":"candles","events":[{"candles":[{"start":"9223372036854776","high":"1","low":"1","open":"1","close":"1","volume":"1","product_id":"X"}]}]}"#.into(),
            "out of range",
        ),
        (
            r#"{"channel":"ticker","events":[{"tickers":[{"product_id":"X","best_bid":"x","best_bid_quantity":"1"}]}]}"#.into(),
            "ticker price",
        ),
        (r#"{"sequence_num":1}"#.into(), "`channel`"),
        ("nonsense".into(), "JSON"),
    ] {
        let e = parse(&frame, &mut out).unwrap_err().to_string();
        assert!(e.contains(says), "{frame}: {e}");
        // not even the sequence number is left: the next frame shows the gap
        assert!(out.is_empty(), "{frame}: {out:?}");
    }
    let many = l2(
        1,
        "update",
        &vec![r#"{"side":"bid","price_level":"1","new_quantity":"1"}"#; crate::MAX_LEVELS + 1]
            .join(","),
    );
    assert!(parse(&many, &mut out).unwrap_err().to_string().contains("more than"));
    // levels are bounded across a frame's events too
    let event = format!(
        r#"{{"type":"update","product_id":"X","updates":[{}]}}"#,
        vec![r#"{"side":"bid","price_level":"1","new_quantity":"1"}"#; crate::MAX_LEVELS / 2 + 1]
            .join(",")
    );
    let two = format!(r#"{{"channel":"l2_data","events":[{event},{event}]}}"#);
    assert!(parse(&two, &mut out).unwrap_err().to_string().contains("more than"));
    let trades = trade(
        &vec![r#"{"trade_id":"1","product_id":"X","price":"1","size":"1","side":"BUY","time":"2023-02-09T20:32:50Z"}"#; crate::MAX_ITEMS + 1]
            .join(","),
    );
    assert!(parse(&trades, &mut out).unwrap_err().to_string().contains("more than"));
    assert!(out.is_empty());
}

#[test]
fn cut_and_altered_frames_never_panic() {
    let mut out = Vec::new();
    let book = l2(
        3,
        "snapshot",
        r#"{"side":"bid","event_time":"1970-01-01T00:00:00Z","price_level":"21921.73","new_quantity":"0.06317902"}"#,
    );
    let trade = r#"{"channel":"market_trades","timestamp":"2023-02-09T20:32:51Z","sequence_num":4,"events":[{"type":"update","trades":[{"trade_id":"1","product_id":"BTC-USD","price":"21921.74","size":"0.1","side":"BUY","time":"2023-02-09T20:32:50.9Z"}]}]}"#;
    for frame in [book.as_str(), trade] {
        for cut in 0..frame.len() {
            let _ = parse(&frame[..cut], &mut out);
            for b in ["9", "\"", "]"] {
                let altered = format!("{}{b}{}", &frame[..cut], &frame[cut + 1..]);
                let _ = parse(&altered, &mut out);
            }
        }
    }
}

/// `l2_data`'s events are read in the envelope's pass when `channel` came first (as Coinbase
/// sends it), and kept raw and read afterwards when it did not: the same messages either way.
#[test]
fn a_book_reads_the_same_whichever_field_comes_first() {
    let events = r#"[{"type":"snapshot","product_id":"BTC-USD","updates":[{"side":"bid","event_time":"1970-01-01T00:00:00Z","price_level":"21921.73","new_quantity":"0.06317902"},{"side":"offer","event_time":"1970-01-01T00:00:00Z","price_level":"21921.74","new_quantity":"0.5"}]}]"#;
    let head = r#""channel":"l2_data","client_id":"","timestamp":"2023-02-09T20:32:50.714964855Z","sequence_num":7"#;
    let first = all(&format!(r#"{{{head},"events":{events}}}"#));
    let last = all(&format!(r#"{{"events":{events},{head}}}"#));
    assert_eq!(first, last);
    assert_eq!(first.len(), 2, "{first:?}");
    assert_eq!(first[0], Message::Sequence { seq: 7 });
    let Message::Book(b) = &first[1] else { panic!("{first:?}") };
    assert_eq!((b.bids.len(), b.asks.len(), b.snapshot), (1, 1, true));
}
