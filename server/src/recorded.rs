//! A recording read back as normalized messages (`shared::protocol::replay::ReplayLine`): the
//! replay API (`GET /api/v1/replay`) and the trades export read it.
//!
//! Files are read oldest hour first, block by block (memory stays at a block's size whatever
//! the range); only the hours that overlap the range are opened. Every received frame goes
//! through the venue's own reader (`venues::parse`), so a line says what the venue said as
//! millrace's live path reads it; a frame the reader refuses is an `error` line. A torn tail (a
//! process killed mid-write) ends its file; what was before it is read.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use recording::Kind;
use shared::protocol::replay::{ConnectionEvent, ReplayLine, CHANNELS};
use shared::protocol::Market;
use shared::venue::Dialect;

const HOUR_MS: i64 = 3_600_000;

/// Why a recording cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum RecordedError {
    #[error("{0:?} is not a recorded source's name")]
    Name(String),
    #[error("no recording of source {0:?} (no {0}/source.json under the recording directory)")]
    NoSource(String),
    #[error("{path}: {detail}")]
    Described { path: PathBuf, detail: String },
    #[error("unknown channel {0:?} (channels: {channels})", channels = CHANNELS.join(", "))]
    Channel(String),
    #[error(transparent)]
    Read(#[from] recording::RecordingError),
}

/// What `{dir}/{source}/source.json` says: the recorded source's dialect and market.
pub fn describe(dir: &Path, source: &str) -> Result<(Dialect, Market), RecordedError> {
    if !recording::valid_source_name(source) {
        return Err(RecordedError::Name(source.to_string()));
    }
    let path = dir.join(source).join("source.json");
    let text =
        std::fs::read_to_string(&path).map_err(|_| RecordedError::NoSource(source.to_string()))?;
    #[derive(serde::Deserialize)]
    struct Described {
        dialect: String,
        market: String,
    }
    let bad = |detail: String| RecordedError::Described { path: path.clone(), detail };
    let d: Described = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let dialect = d.dialect.parse().map_err(|_| bad(format!("unknown dialect {:?}", d.dialect)))?;
    let market = d.market.parse().map_err(|()| bad(format!("unknown market {:?}", d.market)))?;
    Ok((dialect, market))
}

/// The most replicas a read merges.
pub const MAX_REPLICAS: usize = 64;

/// The recordings of `source` under the recording directory `dir`: `dir` itself if it holds one,
/// then each cluster worker's (`{dir}/worker-{id}`, as workers record) that does, in name order,
/// at most [`MAX_REPLICAS`]. Empty when none does.
pub fn replicas(dir: &Path, source: &str) -> Result<Vec<PathBuf>, RecordedError> {
    if !recording::valid_source_name(source) {
        return Err(RecordedError::Name(source.to_string()));
    }
    let holds = |d: &Path| d.join(source).join("source.json").is_file();
    let mut workers: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with("worker-")))
            .map(|e| e.path())
            .filter(|d| holds(d))
            .collect(),
        Err(_) => Vec::new(),
    };
    workers.sort();
    let mut out: Vec<PathBuf> = holds(dir).then(|| dir.to_path_buf()).into_iter().collect();
    out.extend(workers);
    out.truncate(MAX_REPLICAS);
    Ok(out)
}

/// The venue's name of `instrument` (`BASE/QUOTE`) in the instrument list recorded for
/// `source` (the REST answer its source loaded at start, the way the live source maps it);
/// `None` if no recorded list names it.
pub fn venue_symbol(
    dir: &Path,
    source: &str,
    dialect: Dialect,
    instrument: &shared::protocol::InstrumentId,
) -> Result<Option<String>, RecordedError> {
    let lists = match dialect {
        // spot's and USD-M futures' (`/fapi/v1/exchangeInfo`)
        Dialect::Binance => ["/api/v3/exchangeInfo".to_string(), "/fapi/v1/exchangeInfo".into()],
        _ => [Market::Spot, Market::Futures].map(|m| {
            let p = venues::rest::instruments_path(dialect, m);
            p.split('?').next().unwrap_or(p).to_string()
        }),
    };
    let mut requests: HashMap<u64, bool> = HashMap::new();
    let mut found = None;
    scan_range(dir, source, i64::MIN, i64::MAX, |r| {
        match r.kind {
            Kind::RestRequest => {
                requests.insert(r.conn, lists.iter().any(|l| r.meta.contains(l.as_str())));
            }
            Kind::RestAnswer if requests.remove(&r.conn) == Some(true) => {
                let body = String::from_utf8_lossy(r.body);
                if dialect == Dialect::Binance {
                    // `exchangeInfo`, read by the binance crate as the live source reads it
                    if let Ok(info) =
                        binance::wire::parse_body::<binance::wire::ExchangeInfo>(&body)
                    {
                        found = info
                            .symbols
                            .into_iter()
                            .find(|i| {
                                format!("{}/{}", i.base_asset, i.quote_asset) == instrument.symbol
                            })
                            .map(|i| i.symbol);
                    }
                } else if let Ok(list) = venues::rest::parse_instruments(dialect, &body) {
                    found = list
                        .into_iter()
                        .find(|i| format!("{}/{}", i.base, i.quote) == instrument.symbol)
                        .map(|i| i.symbol);
                }
            }
            _ => {}
        }
        found.is_none()
    })?;
    Ok(found)
}

/// The channels asked for: a set of [`CHANNELS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Channels(u8);

impl Channels {
    /// Book, trade and candle.
    pub const DEFAULT: Channels = Channels(0b111);

    /// `book,trade,…` (empty: [`Channels::DEFAULT`]).
    pub fn parse(s: &str) -> Result<Channels, RecordedError> {
        let mut set = 0u8;
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let i = CHANNELS
                .iter()
                .position(|c| *c == name)
                .ok_or_else(|| RecordedError::Channel(name.chars().take(40).collect()))?;
            set |= 1 << i;
        }
        Ok(if set == 0 { Channels::DEFAULT } else { Channels(set) })
    }

    /// Whether `line` is of a channel asked for (an `error` line always is).
    pub fn wants(self, line: &ReplayLine) -> bool {
        let channel = line.channel();
        CHANNELS.iter().position(|c| *c == channel).is_none_or(|i| self.0 & (1 << i) != 0)
    }

    fn has(self, name: &str) -> bool {
        CHANNELS.iter().position(|c| *c == name).is_some_and(|i| self.0 & (1 << i) != 0)
    }
}

/// What a read went through.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadSummary {
    pub records: u64,
    pub lines: u64,
    pub errors: u64,
    /// Files whose tail was torn: the file, the offset the readable part ends at.
    pub torn: Vec<(String, u64)>,
}

/// Reads source `source` of the recording at `dir` between `from_ms` and `to_ms` (receive
/// times, inclusive; `None`: open), handing each line of `channels` to `each` in receive order
/// until it says stop (`false`).
pub fn read(
    dir: &Path,
    source: &str,
    from_ms: Option<i64>,
    to_ms: Option<i64>,
    channels: Channels,
    each: &mut dyn FnMut(ReplayLine) -> bool,
) -> Result<ReadSummary, RecordedError> {
    let (dialect, _) = describe(dir, source)?;
    let from_ns = from_ms.map_or(i64::MIN, |ms| ms.saturating_mul(1_000_000));
    let to_ns = to_ms.map_or(i64::MAX, |ms| ms.saturating_mul(1_000_000).saturating_add(999_999));
    let mut summary = ReadSummary::default();
    let mut requests: HashMap<u64, String> = HashMap::new();
    let mut messages = Vec::new();
    let torn = scan_range(dir, source, from_ns, to_ns, |r| {
        summary.records += 1;
        let (time_ns, conn) = (r.time_ns, r.conn);
        let mut lines: Vec<ReplayLine> = Vec::new();
        match r.kind {
            Kind::Received => {
                let text = String::from_utf8_lossy(r.body);
                messages.clear();
                let parsed = match dialect {
                    // Binance's streams are read by the binance crate, as the live jobs read them
                    Dialect::Binance => binance::fastdepth::parse_frame(&text)
                        .map(|event| messages.extend(binance_message(event)))
                        .map_err(|e| e.to_string()),
                    _ => venues::parse(dialect, &text, &mut messages).map_err(|e| e.to_string()),
                };
                match parsed {
                    Ok(()) => {
                        for m in messages.drain(..) {
                            lines.extend(normalized(time_ns, conn, m, channels));
                        }
                    }
                    Err(error) => {
                        summary.errors += 1;
                        lines.push(ReplayLine::Error { time_ns, conn, error })
                    }
                }
            }
            Kind::Connected | Kind::Closed if channels.has("connection") => {
                let event = if r.kind == Kind::Connected {
                    ConnectionEvent::Connected
                } else {
                    ConnectionEvent::Closed
                };
                let detail = r.meta.to_string();
                lines.push(ReplayLine::Connection { time_ns, conn, event, detail });
            }
            Kind::RestRequest => {
                requests.insert(conn, r.meta.to_string());
            }
            Kind::RestAnswer => {
                let request = requests.remove(&conn).unwrap_or_default();
                let status = r.meta.parse().unwrap_or(0);
                // a Binance book's snapshot comes by REST: a book line like a venue's snapshot
                if dialect == Dialect::Binance && status == 200 && channels.has("book") {
                    match binance_snapshot(time_ns, conn, &request, r.body) {
                        Some(Ok(line)) => lines.push(line),
                        Some(Err(error)) => {
                            summary.errors += 1;
                            lines.push(ReplayLine::Error { time_ns, conn, error });
                        }
                        None => {}
                    }
                }
                if channels.has("rest") {
                    lines.push(ReplayLine::Rest {
                        time_ns,
                        conn,
                        request,
                        status,
                        bytes: r.body.len() as u64,
                    });
                }
            }
            Kind::Sent | Kind::Connected | Kind::Closed => {}
        }
        for line in lines {
            if !channels.wants(&line) {
                continue;
            }
            summary.lines += 1;
            if !each(line) {
                return false;
            }
        }
        true
    })?;
    summary.torn = torn.into_iter().map(|(f, t)| (f.display().to_string(), t.offset)).collect();
    Ok(summary)
}

/// The receive times (ms, inclusive) of the recording of `source` at `dirs` that hold the trades
/// of venue symbol `symbol` whose own times lie in `from_ms` ..= `to_ms`; `None` when no hour
/// does. A venue's clock may be off from the receiving one by any amount, and drift (a
/// simulator's runs faster), so the hour files are chosen by the trades they hold, not by their
/// receive hour alone: each hour's first trade of the symbol is read (usually its first block),
/// and an hour is taken when the trade times from its first trade to the next hour's first (the
/// last hour: on) overlap the range, widened by `jitter_ms` each side for trades that arrive
/// out of their times' order.
pub fn trade_receive_range(
    dirs: &[PathBuf],
    source: &str,
    symbol: &str,
    (from_ms, to_ms): (i64, i64),
    jitter_ms: i64,
) -> Result<Option<(i64, i64)>, RecordedError> {
    let channels = Channels::parse("trade")?;
    let mut range: Option<(i64, i64)> = None;
    for dir in dirs {
        let mut hours: Vec<i64> = recording::list_files(dir)?
            .into_iter()
            .filter(|f| f.source == source)
            .map(|f| f.hour_ms)
            .collect();
        hours.sort_unstable();
        hours.dedup();
        // each hour's first trade of the symbol, in hour order (hours without one hold none)
        let mut firsts: Vec<(i64, i64)> = Vec::new();
        for hour in hours {
            let mut first = None;
            read(
                dir,
                source,
                Some(hour),
                Some(hour + HOUR_MS - 1),
                channels,
                &mut |line| match line {
                    ReplayLine::Trade { symbol: s, trades, .. } if s == symbol => {
                        first = trades.iter().map(|t| t.time_ms).min();
                        first.is_none()
                    }
                    _ => true,
                },
            )?;
            firsts.extend(first.map(|t| (hour, t)));
        }
        for (i, &(hour, first)) in firsts.iter().enumerate() {
            let next = firsts.get(i + 1).map_or(i64::MAX, |&(_, t)| t);
            let (lo, hi) = (first.saturating_sub(jitter_ms), next.saturating_add(jitter_ms));
            if lo <= to_ms && hi >= from_ms {
                let (a, b) = range.unwrap_or((hour, hour));
                range = Some((a.min(hour), b.max(hour)));
            }
        }
    }
    Ok(range.map(|(a, b)| (a, b + HOUR_MS - 1)))
}

/// Calls `each` with every record of `source`'s recording in `dir` received between `from_ns`
/// and `to_ns` (inclusive) in receive order, until it says stop (`false`). Only the hours that
/// overlap the range are opened; they are read by `recording::scan`, a block ahead on a thread
/// of their own. Returns the files whose tail was torn, and where.
pub(crate) fn scan_range(
    dir: &Path,
    source: &str,
    from_ns: i64,
    to_ns: i64,
    mut each: impl FnMut(recording::Record<'_>) -> bool,
) -> Result<Vec<(PathBuf, recording::Torn)>, recording::RecordingError> {
    const HOUR_NS: i64 = HOUR_MS * 1_000_000;
    let files: Vec<PathBuf> = recording::list_files(dir)?
        .into_iter()
        .filter(|f| f.source == source)
        .filter(|f| {
            let start = f.hour_ms.saturating_mul(1_000_000);
            start <= to_ns && start.saturating_add(HOUR_NS) > from_ns
        })
        .map(|f| f.path)
        .collect();
    recording::scan(&files, |r| {
        if r.time_ns < from_ns || r.time_ns > to_ns {
            return true;
        }
        each(r)
    })
}

/// A Binance stream event as the venues' message of the same kind: a diff is a book update
/// (`seq` its `u`, `prev_seq` its `pu` on futures, else `U` − 1: the update it continues), a
/// partial depth a snapshot, an aggregate or single trade a trade, a kline a candle, a
/// `bookTicker` a ticker; an answer or another event nothing.
fn binance_message(event: binance::wire::StreamEvent) -> Option<venues::Message> {
    use binance::wire::StreamEvent;
    use venues::{BookFrame, CandleFrame, Message, TickerFrame};
    Some(match event {
        StreamEvent::DepthUpdate { update, .. } => {
            let d = update.delta;
            Message::Book(BookFrame {
                symbol: update.symbol,
                seq: Some(d.last_id),
                prev_seq: d.prev_last_id.or(d.first_id.checked_sub(1)),
                bids: d.bids,
                asks: d.asks,
                checksum: d.checksum,
                time_ms: Some(update.event_time),
                ..BookFrame::default()
            })
        }
        StreamEvent::PartialDepth { stream, depth } => Message::Book(BookFrame {
            // a partial depth stream (`btcusdt@depth20`) names its symbol only in the stream
            symbol: depth.symbol.unwrap_or_else(|| {
                let s = stream.as_deref().unwrap_or("");
                s.split('@').next().unwrap_or("").to_ascii_uppercase()
            }),
            snapshot: true,
            seq: Some(depth.snapshot.last_update_id),
            bids: depth.snapshot.bids,
            asks: depth.snapshot.asks,
            time_ms: depth.event_time,
            ..BookFrame::default()
        }),
        StreamEvent::AggTrade { trade: a, .. } => Message::Trades {
            symbol: a.symbol,
            trades: vec![crate::trades::agg_trade(
                a.agg_trade_id,
                a.trade_time,
                a.price,
                a.qty,
                a.buyer_is_maker,
            )],
        },
        StreamEvent::Trade { trade: t, .. } => Message::Trades {
            symbol: t.symbol,
            trades: vec![crate::trades::agg_trade(
                t.trade_id,
                t.trade_time,
                t.price,
                t.qty,
                t.buyer_is_maker,
            )],
        },
        StreamEvent::Kline { kline: k, .. } => Message::Candle(CandleFrame {
            symbol: k.symbol,
            minutes: k.timeframe.minutes(),
            candle: k.candle,
            closed: Some(k.closed),
        }),
        StreamEvent::BookTicker { ticker: t, .. } => Message::Ticker(TickerFrame {
            symbol: t.symbol,
            bid: Some(shared::book::Level::new(t.bid_price, t.bid_qty)),
            ask: Some(shared::book::Level::new(t.ask_price, t.ask_qty)),
            cross_seq: None,
            time_ms: t.event_time.or(t.transaction_time),
        }),
        StreamEvent::Reply(_) | StreamEvent::Other { .. } => return None,
    })
}

/// A recorded answer to a Binance depth request (`/api/v3/depth`, `/fapi/v1/depth`) as the
/// book's snapshot line (`seq` its `lastUpdateId`, the symbol from the request); `None` for
/// any other request, an error when the answer is not a depth body.
fn binance_snapshot(
    time_ns: i64,
    conn: u64,
    request: &str,
    body: &[u8],
) -> Option<Result<ReplayLine, String>> {
    let url = request.strip_prefix("GET ").unwrap_or(request);
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    if !(path.ends_with("/api/v3/depth") || path.ends_with("/fapi/v1/depth")) {
        return None;
    }
    let symbol = query.split('&').find_map(|kv| kv.strip_prefix("symbol="))?.to_string();
    let text = String::from_utf8_lossy(body);
    Some(match binance::wire::parse_body::<binance::wire::DepthBody>(&text) {
        Ok(b) => Ok(ReplayLine::Book {
            time_ns,
            conn,
            symbol,
            snapshot: true,
            seq: Some(b.last_update_id),
            prev_seq: None,
            cross_seq: None,
            checksum: None,
            venue_time_ms: b.event_time,
            bids: b.bids,
            asks: b.asks,
        }),
        Err(e) => Err(format!("{request}: {e}")),
    })
}

/// A venue's message as a line, if it is one a replay carries.
fn normalized(
    time_ns: i64,
    conn: u64,
    m: venues::Message,
    channels: Channels,
) -> Option<ReplayLine> {
    use venues::Message;
    Some(match m {
        Message::Book(b) if channels.has("book") => ReplayLine::Book {
            time_ns,
            conn,
            symbol: b.symbol,
            snapshot: b.snapshot,
            seq: b.seq,
            prev_seq: b.prev_seq,
            cross_seq: b.cross_seq,
            checksum: b.checksum,
            venue_time_ms: b.time_ms,
            bids: b.bids,
            asks: b.asks,
        },
        Message::Trades { symbol, trades } if channels.has("trade") => {
            ReplayLine::Trade { time_ns, conn, symbol, trades }
        }
        Message::Candle(c) if channels.has("candle") => ReplayLine::Candle {
            time_ns,
            conn,
            symbol: c.symbol,
            minutes: c.minutes,
            candle: c.candle,
            closed: c.closed,
        },
        Message::Ticker(t) if channels.has("ticker") => {
            ReplayLine::Ticker { time_ns, conn, symbol: t.symbol, bid: t.bid, ask: t.ask }
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::trade::{Trade, TradeId};

    fn trade(id: u64) -> Trade {
        Trade {
            id: TradeId::Seq(id),
            time_ms: id as i64,
            price: shared::Price::from_raw(1),
            qty: shared::Qty::from_raw(1),
            taker: None,
        }
    }

    fn trades(time_ns: i64, ids: std::ops::Range<u64>) -> ReplayLine {
        ReplayLine::Trade {
            time_ns,
            conn: 1,
            symbol: "BTC-USDT".into(),
            trades: ids.map(trade).collect(),
        }
    }

    fn book(time_ns: i64, snapshot: bool, seq: u64, prev: u64) -> ReplayLine {
        ReplayLine::Book {
            time_ns,
            conn: 1,
            symbol: "BTC-USDT".into(),
            snapshot,
            seq: Some(seq),
            prev_seq: Some(prev),
            cross_seq: None,
            checksum: None,
            venue_time_ms: None,
            bids: vec![],
            asks: vec![],
        }
    }

    /// Two replicas of an OKX session; replica 0 dies at 5 s. The merged trades have every id
    /// once, and the book goes on from replica 1 at the message continuing the last one kept.
    #[test]
    fn replicas_merge_into_one_stream_with_no_copy_and_no_hole() {
        const S: i64 = 1_000_000_000;
        let mut m = Merger::new(Dialect::Okx);
        let mut out = Vec::new();
        let mut feed = |r: usize, l: ReplayLine| out.extend(m.line(r, l));
        feed(0, book(0, true, 10, 9));
        feed(1, book(S / 10, true, 10, 9));
        feed(0, trades(S, 0..5));
        feed(1, trades(S + 1, 0..5));
        feed(0, book(2 * S, false, 11, 10));
        feed(1, book(2 * S + 1, false, 11, 10));
        feed(0, trades(5 * S, 5..8)); // replica 0's last
        feed(1, trades(5 * S + 1, 5..9));
        feed(1, book(6 * S, false, 12, 11)); // 0 silent for 4 s by now
                                             // (replica 0 stopped after seq 11: 12 continues it)
        feed(1, book(7 * S, false, 13, 12));
        feed(1, trades(8 * S, 9..12));
        // another instrument's trade of the same id is its own
        let mut eth = trades(8 * S, 0..1);
        if let ReplayLine::Trade { symbol, .. } = &mut eth {
            *symbol = "ETH-USDT".into();
        }
        assert!(m.line(1, eth).is_some(), "ETH's trade 0 is not BTC's");
        let ids: Vec<u64> = out
            .iter()
            .filter_map(|l| match l {
                ReplayLine::Trade { trades, .. } => Some(trades.iter().map(|t| match t.id {
                    TradeId::Seq(n) => n,
                    TradeId::Text(_) => u64::MAX,
                })),
                _ => None,
            })
            .flatten()
            .collect();
        assert_eq!(ids, (0..12).collect::<Vec<_>>(), "every trade once, none missing");
        let seqs: Vec<(u64, u64, u64)> = out
            .iter()
            .filter_map(|l| match l {
                ReplayLine::Book { seq, prev_seq, conn, .. } => {
                    Some((seq.unwrap(), prev_seq.unwrap(), conn >> 48))
                }
                _ => None,
            })
            .collect();
        assert_eq!(seqs, [(10, 9, 0), (11, 10, 0), (12, 11, 1), (13, 12, 1)], "one chain");
    }

    /// A replica that goes on while the one followed is alive is not taken, nor is one whose
    /// next message does not continue the book (it waits for a snapshot); Coinbase switches at
    /// a snapshot only.
    #[test]
    fn a_book_moves_to_another_replica_only_where_it_continues() {
        const S: i64 = 1_000_000_000;
        let mut m = Merger::new(Dialect::Okx);
        assert!(m.line(0, book(0, true, 10, 9)).is_some());
        assert!(m.line(1, book(S, false, 11, 10)).is_none(), "replica 0 is not silent");
        assert!(m.line(1, book(3 * S, false, 14, 13)).is_none(), "does not continue 10");
        assert!(m.line(1, book(4 * S, true, 20, 19)).is_some(), "a snapshot does");
        let mut c = Merger::new(Dialect::Coinbase);
        assert!(c.line(0, book(0, true, 1, 0)).is_some());
        assert!(c.line(1, book(3 * S, false, 2, 1)).is_none(), "its sequence is a connection's");
        assert!(c.line(1, book(4 * S, true, 7, 6)).is_some());
    }

    /// An open candle's updates (many a minute, each a new state) come from one replica, all
    /// of them, until it falls silent; its closed copy comes once.
    #[test]
    fn an_open_candles_updates_follow_one_replica_and_its_close_comes_once() {
        const S: i64 = 1_000_000_000;
        let candle = |time_ns: i64, volume: i128, closed: bool| ReplayLine::Candle {
            time_ns,
            conn: 1,
            symbol: "BTC-USDT".into(),
            minutes: 1,
            candle: shared::candle::Candle {
                open_time: 60_000,
                open: shared::Price::from_raw(1),
                high: shared::Price::from_raw(1),
                low: shared::Price::from_raw(1),
                close: shared::Price::from_raw(1),
                volume: shared::fixed::Volume::from_raw(volume),
                trades: 0,
                minutes: 1,
            },
            closed: Some(closed),
        };
        let mut m = Merger::new(Dialect::Okx);
        let mut kept = Vec::new();
        for (r, t, v, closed) in [
            (0, 0, 1, false),
            (1, 1, 1, false),
            (0, S, 2, false),
            (1, S + 1, 2, false),
            (0, 2 * S, 3, false),
            (1, 5 * S, 4, false), // replica 0 silent for 3 s: 1 takes over
            (0, 6 * S, 5, true),
            (1, 6 * S + 1, 5, true),
        ] {
            if let Some(ReplayLine::Candle { candle, closed, conn, .. }) =
                m.line(r, candle(t, v, closed))
            {
                kept.push((candle.volume.raw(), closed == Some(true), conn >> 48));
            }
        }
        assert_eq!(
            kept,
            [(1, false, 0), (2, false, 0), (3, false, 0), (4, false, 1), (5, true, 0)]
        );
    }

    #[test]
    fn replicas_are_the_directory_and_its_workers_that_hold_the_source() {
        let dir = std::env::temp_dir().join(format!("millrace-replicas-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for d in ["okx", "worker-b/okx", "worker-a/okx", "worker-c/bybit", "other/okx"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
            std::fs::write(dir.join(d).join("source.json"), "{}").unwrap();
        }
        let names: Vec<PathBuf> = replicas(&dir, "okx").unwrap();
        let want = [dir.clone(), dir.join("worker-a"), dir.join("worker-b")];
        assert_eq!(names, want);
        assert!(replicas(&dir, "kraken").unwrap().is_empty());
        assert!(matches!(replicas(&dir, ".."), Err(RecordedError::Name(_))));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn channels_are_named_and_an_unknown_one_is_an_error() {
        assert_eq!(Channels::parse("").unwrap(), Channels::DEFAULT);
        let c = Channels::parse("trade, connection").unwrap();
        assert!(c.has("trade") && c.has("connection") && !c.has("book"));
        let e = ReplayLine::Error { time_ns: 0, conn: 0, error: String::new() };
        assert!(c.wants(&e), "errors are always sent");
        assert!(Channels::parse("book,orders").unwrap_err().to_string().contains("\"orders\""));
    }

    #[test]
    fn a_source_name_cannot_leave_the_recording_directory() {
        let dir = std::env::temp_dir();
        for bad in ["..", &format!("{}/etc", ".."), "a/b", ""] {
            assert!(matches!(describe(&dir, bad), Err(RecordedError::Name(_))), "{bad}");
        }
        assert!(matches!(describe(&dir, "no-such-source"), Err(RecordedError::NoSource(_))));
    }
}

/// How long the replica a book follows may be silent before another one's continuation is
/// taken (a worker killed, its session moved).
pub const FAILOVER_NS: i64 = 2_000_000_000;
/// Trade ids and candles remembered to drop another replica's copy.
const MERGE_WINDOW: usize = 100_000;

/// Merges the lines of several replicas' recordings of one source (a cluster's workers each
/// record the sessions they hold) into one stream with no copy and no hole, by the venue's
/// natural ids: a trade by its instrument and id, a closed candle by its symbol, interval and
/// open time, an open candle's updates from one replica until it falls silent for
/// [`FAILOVER_NS`] (as a book), and a book followed on one replica until that one falls silent for
/// [`FAILOVER_NS`], then on another from a line that continues it — one whose `prev_seq` is the
/// last `seq` kept (OKX), or whose `seq` is the next (Bybit) — or from its next snapshot
/// (Coinbase, whose sequence is its connection's, and Kraken, which has none). Connections,
/// REST exchanges, tickers and errors of every replica are kept, their connection numbers made
/// apart by the replica (`conn | replica << 48`). Sans-IO: lines in, lines out.
#[derive(Debug)]
pub struct Merger {
    dialect: Dialect,
    /// By instrument and id: a venue numbers each instrument's trades on its own.
    trades: Window<(String, shared::trade::TradeId)>,
    /// Closed candles, by symbol, interval and open time.
    candles: Window<(String, u32, i64)>,
    /// The replica whose updates of a still-open candle are kept, by symbol and interval.
    candle_updates: HashMap<(String, u32), Followed>,
    books: HashMap<String, Followed>,
}

#[derive(Debug, Clone, Copy)]
struct Followed {
    replica: usize,
    seq: Option<u64>,
    time_ns: i64,
}

/// A set remembering its newest `MERGE_WINDOW` keys.
#[derive(Debug)]
struct Window<K: std::hash::Hash + Eq + Clone> {
    seen: std::collections::HashSet<K>,
    order: std::collections::VecDeque<K>,
}

impl<K: std::hash::Hash + Eq + Clone> Default for Window<K> {
    fn default() -> Self {
        Window { seen: Default::default(), order: Default::default() }
    }
}

impl<K: std::hash::Hash + Eq + Clone> Window<K> {
    /// Whether `k` is new (and now remembered).
    fn first(&mut self, k: K) -> bool {
        if !self.seen.insert(k.clone()) {
            return false;
        }
        self.order.push_back(k);
        if self.order.len() > MERGE_WINDOW {
            if let Some(old) = self.order.pop_front() {
                self.seen.remove(&old);
            }
        }
        true
    }
}

impl Merger {
    pub fn new(dialect: Dialect) -> Merger {
        Merger {
            dialect,
            trades: Window::default(),
            candles: Window::default(),
            candle_updates: HashMap::new(),
            books: HashMap::new(),
        }
    }

    /// Replica `replica`'s next line (each replica's in its receive order, the replicas'
    /// interleaved by receive time): what of it the merged stream keeps.
    pub fn line(&mut self, replica: usize, mut line: ReplayLine) -> Option<ReplayLine> {
        let keep = match &mut line {
            ReplayLine::Trade { symbol, trades, .. } => {
                trades.retain(|t| self.trades.first((symbol.clone(), t.id.clone())));
                !trades.is_empty()
            }
            // a closed candle once; the updates of an open one (many a minute, each a new
            // state) from one replica, another's once that one is silent
            ReplayLine::Candle { symbol, minutes, candle, closed: Some(true), .. } => {
                self.candles.first((symbol.clone(), *minutes, candle.open_time))
            }
            ReplayLine::Candle { time_ns, symbol, minutes, .. } => {
                let key = (symbol.clone(), *minutes);
                let keep = self.candle_updates.get(&key).is_none_or(|f| {
                    f.replica == replica || time_ns.saturating_sub(f.time_ns) >= FAILOVER_NS
                });
                if keep {
                    let followed = Followed { replica, seq: None, time_ns: *time_ns };
                    self.candle_updates.insert(key, followed);
                }
                keep
            }
            ReplayLine::Book { time_ns, symbol, snapshot, seq, prev_seq, .. } => {
                let keep = match self.books.get(symbol.as_str()) {
                    None => true,
                    Some(f) if f.replica == replica => true,
                    Some(f) => {
                        let silent = time_ns.saturating_sub(f.time_ns) >= FAILOVER_NS;
                        let continues = match self.dialect {
                            Dialect::Okx => prev_seq.is_some() && *prev_seq == f.seq,
                            Dialect::Bybit => {
                                seq.is_some() && *seq == f.seq.and_then(|s| s.checked_add(1))
                            }
                            _ => false,
                        };
                        silent && (*snapshot || continues)
                    }
                };
                if keep {
                    let followed = Followed { replica, seq: *seq, time_ns: *time_ns };
                    self.books.insert(symbol.clone(), followed);
                }
                keep
            }
            _ => true,
        };
        if !keep {
            return None;
        }
        *line.conn_mut() |= (replica as u64) << 48;
        Some(line)
    }
}

/// [`read`] over the recordings of `source` in every one of `dirs` (a cluster's workers'),
/// merged ([`Merger`]) in receive order; one of them is read as [`read`] reads it. Each replica is read on a thread of its own (joined
/// before this returns), at most 1,024 lines ahead.
pub fn read_merged(
    dirs: &[PathBuf],
    source: &str,
    from_ms: Option<i64>,
    to_ms: Option<i64>,
    channels: Channels,
    each: &mut dyn FnMut(ReplayLine) -> bool,
) -> Result<ReadSummary, RecordedError> {
    if let [one] = dirs {
        // one recording: as it was received (a venue's own duplicate included)
        return read(one, source, from_ms, to_ms, channels, each);
    }
    let mut dialect = None;
    for dir in dirs {
        let (d, _) = describe(dir, source)?;
        if dialect.is_some_and(|known| known != d) {
            return Err(RecordedError::Described {
                path: dir.join(source).join("source.json"),
                detail: format!("a {d} recording among {} ones", dialect.unwrap_or(d)),
            });
        }
        dialect = Some(d);
    }
    let Some(dialect) = dialect else { return Ok(ReadSummary::default()) };
    let mut merger = Merger::new(dialect);
    std::thread::scope(|scope| {
        let mut readers = Vec::new();
        for dir in dirs {
            let (tx, rx) = std::sync::mpsc::sync_channel::<ReplayLine>(1024);
            let reader = scope.spawn(move || {
                read(dir, source, from_ms, to_ms, channels, &mut |line| tx.send(line).is_ok())
            });
            readers.push((rx, reader));
        }
        let mut heads: Vec<Option<ReplayLine>> =
            readers.iter().map(|(rx, _)| rx.recv().ok()).collect();
        let mut summary = ReadSummary::default();
        loop {
            let next = heads
                .iter()
                .enumerate()
                .filter_map(|(i, h)| h.as_ref().map(|l| (l.time_ns(), i)))
                .min();
            let Some((_, i)) = next else { break };
            let line = heads[i].take().expect("chosen");
            heads[i] = readers[i].0.recv().ok();
            if let Some(kept) = merger.line(i, line) {
                summary.lines += 1;
                if !each(kept) {
                    break;
                }
            }
        }
        // a reader stops at its next line once its channel is dropped
        for (rx, reader) in readers {
            drop(rx);
            let s = reader.join().map_err(|_| {
                RecordedError::Read(recording::RecordingError::Io {
                    path: PathBuf::new(),
                    source: std::io::Error::other("a replica's reader panicked"),
                })
            })??;
            summary.records += s.records;
            summary.errors += s.errors;
            summary.torn.extend(s.torn);
        }
        Ok(summary)
    })
}
