//! `binance::wire` against real Binance bytes: every frame and REST depth body of the captures in
//! `testdata/binance-ws` and every row of the kline archives in `testdata/klines`
//! (see `testdata/README.md`) decodes, and the decoded values reproduce the README's known
//! facts through millrace's own sync machine and candle merge, so the conversions are exact.
//! The directory is `replay::input::testdata_dir()`.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use binance::parse_frame;
use binance::wire::{
    parse_body, Combined, DepthBody, RestKline, StreamEvent, StreamName, WireError, WsDepthUpdate,
    WsKlineEvent,
};
use replay::input::for_each_line;
use shared::book::Level;
use shared::candle::{merge, Candle, Timeframe};
use shared::sync::{BookSync, ContinuityRule, SyncConfig, SyncEvent};
use shared::{Price, Volume};

fn cf(name: &str) -> PathBuf {
    replay::input::testdata_dir().join("binance-ws/cryptofeed").join(name)
}

/// A capture line's receive time in ns and its JSON.
fn split_line(line: &str) -> Option<(i128, &str)> {
    let (ts, json) = line.split_once(' ')?;
    let ts = match ts.strip_suffix(':') {
        // cryptofeed `secs.frac:`: microseconds are plenty to order the lines
        Some(secs) => {
            let (s, f) = secs.split_once('.').unwrap_or((secs, "0"));
            let f = format!("{:0<9}", &f[..f.len().min(9)]);
            s.parse::<i128>().ok()? * 1_000_000_000 + f.parse::<i128>().ok()?
        }
        None => ts.parse().ok()?,
    };
    Some((ts, json))
}

/// What the test keeps of each input, in receive order.
enum Input {
    Frame(StreamEvent),
    Snapshot { symbol: String, body: DepthBody },
}

/// Decodes a cryptofeed `.ws` + `.http` pair, failing on any frame that does not parse.
fn load_cryptofeed(prefix: &str) -> Vec<(i128, Input)> {
    let mut inputs = Vec::new();
    for_each_line(&cf(&format!("{prefix}.ws.1.0")), |origin, line| {
        if line.is_empty() || line.starts_with("wss://") {
            return Ok(());
        }
        let (ts, json) = split_line(line).unwrap_or_else(|| panic!("{origin}: no timestamp"));
        let ev = parse_frame(json).unwrap_or_else(|e| panic!("{origin}: {e}"));
        inputs.push((ts, Input::Frame(ev)));
        Ok(())
    })
    .unwrap();
    for_each_line(&cf(&format!("{prefix}.http.0.0")), |origin, line| {
        if line.is_empty() {
            return Ok(());
        }
        let (url, rest) = line.split_once(" -> ").unwrap();
        let symbol =
            url.split(['?', '&']).find_map(|kv| kv.strip_prefix("symbol=")).unwrap().to_string();
        let (ts, json) = split_line(rest).unwrap();
        let body: DepthBody = parse_body(json).unwrap_or_else(|e| panic!("{origin}: {e}"));
        assert!(!body.bids.is_empty() && !body.asks.is_empty(), "{origin}");
        inputs.push((ts, Input::Snapshot { symbol, body }));
        Ok(())
    })
    .unwrap();
    inputs.sort_by_key(|(ts, _)| *ts);
    inputs
}

#[derive(Default, Debug)]
struct Counts {
    depth: u64,
    tickers: u64,
    klines: u64,
    closed_klines: u64,
    agg_trades: u64,
    trades: u64,
    ticker_checks: u64,
    gaps: u64,
}

fn book<'a>(
    books: &'a mut BTreeMap<String, BookSync>,
    symbol: &str,
    rule: ContinuityRule,
) -> &'a mut BookSync {
    books.entry(symbol.to_string()).or_insert_with(|| {
        let mut config = SyncConfig::new(rule);
        config.verify_interval_ms = None; // the captures hold the snapshots they hold
        BookSync::new(config)
    })
}

/// Syncs one book per symbol from the decoded snapshots and diffs, and checks each `bookTicker`
/// whose `u` equals an applied diff's `u` against the book's best levels after that diff.
fn sync_and_check(inputs: Vec<(i128, Input)>, rule: ContinuityRule) -> Counts {
    let mut c = Counts::default();
    let mut books: BTreeMap<String, BookSync> = BTreeMap::new();
    let mut tops: HashMap<(String, u64), (Level, Level)> = HashMap::new();
    let mut tickers = Vec::new();
    for (ts, input) in inputs {
        let now_ms = (ts / 1_000_000) as i64;
        let (symbol, sync) = match input {
            Input::Snapshot { symbol, body } => {
                let sync = book(&mut books, &symbol, rule);
                sync.handle_snapshot(body.into_snapshot(), now_ms);
                (symbol, sync)
            }
            Input::Frame(StreamEvent::DepthUpdate { stream, update }) => {
                c.depth += 1;
                let name: StreamName = stream.as_deref().unwrap().parse().unwrap();
                assert_eq!(name.symbol, update.symbol);
                assert_eq!(update.delta.prev_last_id.is_some(), rule == ContinuityRule::Futures);
                assert_eq!(update.transaction_time.is_some(), rule == ContinuityRule::Futures);
                let sync = book(&mut books, &update.symbol, rule);
                sync.handle_delta(update.delta, now_ms);
                (update.symbol, sync)
            }
            Input::Frame(StreamEvent::BookTicker { ticker, .. }) => {
                c.tickers += 1;
                tickers.push(ticker);
                continue;
            }
            Input::Frame(StreamEvent::Kline { stream, kline }) => {
                c.klines += 1;
                c.closed_klines += kline.closed as u64;
                assert_eq!(
                    stream.unwrap(),
                    format!("{}@kline_1m", kline.symbol.to_ascii_lowercase())
                );
                assert_eq!(kline.close_time, kline.candle.open_time + 59_999);
                continue;
            }
            Input::Frame(StreamEvent::AggTrade { .. }) => {
                c.agg_trades += 1;
                continue;
            }
            Input::Frame(StreamEvent::Trade { .. }) => {
                c.trades += 1;
                continue;
            }
            Input::Frame(other) => panic!("unexpected frame {other:?}"),
        };
        while let Some(ev) = sync.poll_event() {
            if let SyncEvent::BookChanged { last_update_id } = ev {
                let b = sync.book();
                if let (Some(bid), Some(ask)) = (b.best_bid(), b.best_ask()) {
                    tops.insert((symbol.clone(), last_update_id), (bid, ask));
                }
            }
        }
    }
    for t in tickers {
        if let Some((bid, ask)) = tops.get(&(t.symbol.clone(), t.update_id)) {
            c.ticker_checks += 1;
            assert_eq!(*bid, Level::new(t.bid_price, t.bid_qty), "{t:?}");
            assert_eq!(*ask, Level::new(t.ask_price, t.ask_qty), "{t:?}");
        }
    }
    for (symbol, sync) in &books {
        assert!(sync.is_synced(), "{symbol}");
        c.gaps += sync.stats().gaps;
    }
    c
}

#[test]
fn spot_capture_decodes_and_syncs_to_every_ticker() {
    let c = sync_and_check(load_cryptofeed("BINANCE"), ContinuityRule::Spot);
    assert_eq!((c.depth, c.tickers, c.klines, c.agg_trades), (177, 84, 2, 2), "{c:?}");
    assert_eq!(c.gaps, 0);
    assert_eq!(c.ticker_checks, 26, "README: 26 of 26 spot tickers match");
}

#[test]
fn futures_capture_decodes_and_syncs_to_every_ticker() {
    let c = sync_and_check(load_cryptofeed("BINANCE_FUTURES"), ContinuityRule::Futures);
    assert_eq!(
        (c.depth, c.tickers, c.klines, c.closed_klines, c.agg_trades),
        (764, 613, 67, 4, 91),
        "{c:?}"
    );
    assert_eq!(c.gaps, 0);
    assert_eq!(c.ticker_checks, 50, "README: 50 of 50 futures tickers match");
}

#[test]
fn hftbacktest_capture_decodes_and_syncs() {
    let mut inputs = Vec::new();
    for day in ["20240808", "20240809"] {
        let path = replay::input::testdata_dir()
            .join(format!("binance-ws/hftbacktest/spot_ethusdt_{day}.gz"));
        for_each_line(&path, |origin, line| {
            let (ts, json) = split_line(line).unwrap_or_else(|| panic!("{origin}: no timestamp"));
            let input = if json.contains("\"stream\"") {
                Input::Frame(parse_frame(json).unwrap_or_else(|e| panic!("{origin}: {e}")))
            } else {
                let body: DepthBody = parse_body(json).unwrap_or_else(|e| panic!("{origin}: {e}"));
                Input::Snapshot { symbol: "ETHUSDT".into(), body }
            };
            inputs.push((ts, input));
            Ok(())
        })
        .unwrap();
    }
    inputs.sort_by_key(|(ts, _)| *ts);
    let c = sync_and_check(inputs, ContinuityRule::Spot);
    assert_eq!((c.depth, c.tickers, c.trades), (6470, 58758, 14515), "{c:?}");
    assert_eq!(c.gaps, 0);
    assert_eq!(
        c.ticker_checks, 1056,
        "README: the book matches all 1056 tickers whose u is a diff's u"
    );
}

#[test]
fn captured_events_round_trip_through_the_simulator_direction() {
    // What the simulator writes with these types is read back to the same values.
    let mut n = 0;
    for file in ["BINANCE.ws.1.0", "BINANCE_FUTURES.ws.1.0"] {
        for_each_line(&cf(file), |origin, line| {
            let Some((_, json)) = split_line(line) else { return Ok(()) };
            let original = parse_frame(json).unwrap();
            let again = if json.contains(r#""e":"depthUpdate""#) {
                let c: Combined<WsDepthUpdate> = serde_json::from_str(json).unwrap();
                parse_frame(&serde_json::to_string(&c).unwrap()).unwrap()
            } else if json.contains(r#""e":"kline""#) {
                let c: Combined<WsKlineEvent> = serde_json::from_str(json).unwrap();
                let StreamEvent::Kline { kline, .. } = &original else { panic!("{origin}") };
                // the simulator's constructor gives the same candle as the full event
                let rebuilt = WsKlineEvent::from_candle(
                    &kline.symbol,
                    kline.timeframe,
                    &kline.candle,
                    kline.closed,
                    kline.event_time,
                );
                let StreamEvent::Kline { kline: k2, .. } =
                    parse_frame(&serde_json::to_string(&rebuilt).unwrap()).unwrap()
                else {
                    panic!("{origin}")
                };
                assert_eq!(&k2, kline, "{origin}");
                parse_frame(&serde_json::to_string(&c).unwrap()).unwrap()
            } else {
                return Ok(());
            };
            assert_eq!(again, original, "{origin}");
            n += 1;
            Ok(())
        })
        .unwrap();
    }
    assert_eq!(n, 177 + 2 + 764 + 67);
}

/// The archive's CSV row written as the REST klines JSON row (same 12 columns; numbers stay
/// numbers, decimals become strings, exactly as `/api/v3/klines` returns them).
fn csv_to_rest_row(line: &str) -> String {
    let cols: Vec<&str> = line.split(',').collect();
    assert_eq!(cols.len(), 12, "{line}");
    let cells: Vec<String> = cols
        .iter()
        .enumerate()
        .map(|(i, c)| if matches!(i, 0 | 6 | 8) { c.to_string() } else { format!("\"{c}\"") })
        .collect();
    format!("[{}]", cells.join(","))
}

#[test]
fn kline_archive_rows_decode_exactly_and_merge_to_binance_daily_candles() {
    let expected = [
        ("2020-01-01", "7195.24", "7255", "7175.15", "7200.85", "16792.388165", Some(194010)),
        ("2020-01-02", "7200.77", "7212.5", "6924.74", "6965.71", "31951.483932", None),
    ];
    for (day, o, h, l, c, v, trades) in expected {
        let path = replay::input::testdata_dir()
            .join(format!("klines/binance-spot-BTCUSDT-1m/BTCUSDT-1m-{day}.csv"));
        let mut candles: Vec<Candle> = Vec::new();
        let mut rows = Vec::new();
        for_each_line(&path, |origin, line| {
            let row_json = csv_to_rest_row(line);
            rows.push(row_json.clone());
            let k: RestKline = parse_body(&row_json).unwrap_or_else(|e| panic!("{origin}: {e}"));
            // every column exactly as printed
            let cols: Vec<&str> = line.split(',').collect();
            assert_eq!(k.candle.open_time.to_string(), cols[0]);
            assert_eq!(k.candle.open, Price::parse(cols[1]).unwrap());
            assert_eq!(k.candle.volume, Volume::parse(cols[5]).unwrap());
            assert_eq!(k.close_time.to_string(), cols[6]);
            assert_eq!(k.quote_volume, Volume::parse(cols[7]).unwrap());
            assert_eq!(k.candle.trades.to_string(), cols[8]);
            assert_eq!(k.taker_buy_quote_volume, Volume::parse(cols[10]).unwrap());
            assert_eq!(k.candle.minutes, 1);
            candles.push(k.candle);
            Ok(())
        })
        .unwrap();
        assert_eq!(candles.len(), 1440);
        // the whole day as one REST response
        let body = format!("[{}]", rows.join(","));
        let all: Vec<RestKline> = parse_body(&body).unwrap();
        assert_eq!(all.iter().map(|k| k.candle).collect::<Vec<_>>(), candles);
        let d = merge(Timeframe::D1, &candles).unwrap();
        assert_eq!(
            (d.open, d.high, d.low, d.close, d.volume),
            (
                Price::parse(o).unwrap(),
                Price::parse(h).unwrap(),
                Price::parse(l).unwrap(),
                Price::parse(c).unwrap(),
                Volume::parse(v).unwrap()
            ),
            "{day}"
        );
        if let Some(t) = trades {
            assert_eq!(d.trades, t);
        }
        assert_eq!(d.minutes, 1440);
    }
}

#[test]
fn a_damaged_capture_line_is_a_typed_error_naming_the_field() {
    let text = std::fs::read_to_string(cf("BINANCE_FUTURES.ws.1.0")).unwrap();
    let json = text
        .lines()
        .find(|l| l.contains("depthUpdate"))
        .and_then(split_line)
        .unwrap()
        .1
        .to_string();
    // a negative quantity in the first bid level
    let b = json.find(r#""b":[[""#).unwrap();
    let q = b + json[b..].find(r#"",""#).unwrap() + 3;
    let damaged = format!("{}-{}", &json[..q], &json[q..]);
    match parse_frame(&damaged) {
        Err(WireError::Field { field, msg }) => {
            assert_eq!(field, "b");
            assert!(msg.contains("negative"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    // truncation anywhere is an error, never a panic
    for cut in 0..json.len() {
        assert!(parse_frame(&json[..cut]).is_err(), "{cut}");
    }
}
