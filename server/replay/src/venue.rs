//! `millrace replay depth --venue okx|bybit|coinbase|kraken FILE...`: sync the books of a
//! venue's recorded public stream with [`VenueSync`], by that venue's own rules, and check its
//! trades against its own candles.
//!
//! The capture format (one frame per line; several files, one per connection, are merged by
//! receive time):
//! - `<url> <-> <unix seconds>`: a connection opened (every book of the file waits for the
//!   snapshot of its resubscription);
//! - `<url> <- <unix seconds>: <json>`: a frame we sent (Kraken's book `depth` is read from its
//!   subscription);
//! - `<unix seconds>: <json>` (or a bare `pong`): a frame received;
//! - a first line holding only the stream URL (cryptofeed's header) is a connection too.
//!
//! Per book it reports messages, applied, gaps, resyncs, checksums verified, failed and
//! unchecked, crossed books, and the top of the book against the venue's own ticker where the
//! two can be linked exactly (Bybit: the ticker's `cs` is the book's cross sequence); other
//! tickers are counted as unlinked, never compared loosely. Per instrument, its trades are
//! folded into 1m candles ([`TradeFold`]) and compared with the venue's own closed 1m candles for
//! every minute the capture covers whole.
//!
//! Older captures lack fields: an OKX book without `seqId` is synced on its checksums alone,
//! Kraken v1 books on theirs (their strings carry the precision), and the report says so in
//! `notes`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::Write;
use std::path::PathBuf;

use serde::Serialize;
use shared::book::Level;
use shared::candle::Candle;
use shared::sync::{SyncEvent, SyncState};
use shared::trade::{TradeFold, TradeIds};
use shared::venue::{
    ConnectionSequence, ConnectionVerdict, Dialect, NumberFormat, VenueSync, VenueSyncConfig,
};
use venues::{BookFrame, CandleFrame, Message, TickerFrame};

use crate::input::{self, bad, parse_secs, Origin};

/// Kraken's book depth when the capture does not say (its documented default).
const KRAKEN_DEFAULT_DEPTH: usize = 10;
/// How many applied book messages to remember for tickers that arrive after later ones.
const APPLIED_WINDOW: usize = 4096;

/// One line of a capture.
#[derive(Debug, Clone)]
enum Line {
    Connected,
    Sent(String),
    Received(String),
}

struct Recorded {
    file: usize,
    origin: Origin,
    line: Line,
}

/// One book's result.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct BookReport {
    /// The channel's depth, where it has one.
    pub depth: Option<usize>,
    pub messages: u64,
    pub snapshots: u64,
    pub applied: u64,
    pub heartbeats: u64,
    pub stale_dropped: u64,
    pub unsynced_dropped: u64,
    pub gaps: u64,
    pub resyncs: u64,
    pub sequence_resets: u64,
    pub checksums_verified: u64,
    pub checksums_failed: u64,
    pub checksums_unchecked: u64,
    pub crossed: u64,
    pub ticker_checks: u64,
    pub ticker_mismatches: u64,
    pub tickers_unlinked: u64,
    pub synced: bool,
    pub last_seq: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_mismatch: Option<String>,
}

/// Trades of one instrument, and their 1m candles against the venue's.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct VenueTradesReport {
    pub trades: u64,
    /// Numeric trade ids that skipped (informative: only some venues number trades
    /// consecutively).
    pub id_gaps: u64,
    pub duplicate_ids: u64,
    pub venue_candles: u64,
    pub candles_compared: u64,
    pub candle_mismatches: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_candle_mismatch: Option<String>,
}

/// One instrument's result, printed as one JSON line.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct VenueReport {
    pub venue: Dialect,
    pub symbol: String,
    pub books: Vec<BookReport>,
    pub trades: VenueTradesReport,
    pub refusals: u64,
    /// Frames of the capture that could not be read (all instruments': a broken frame names
    /// none), and the first one's error.
    pub bad_frames: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_bad_frame: Option<String>,
    /// What the capture lacked, and how the replay made do.
    pub notes: Vec<String>,
    pub ok: bool,
}

impl VenueReport {
    fn judge(&mut self) {
        let books_ok = self.books.iter().all(|b| {
            b.synced && b.checksums_failed == 0 && b.crossed == 0 && b.ticker_mismatches == 0
        });
        self.ok = books_ok && self.trades.candle_mismatches == 0;
    }
}

/// Top of book after an applied message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Top {
    bid: Option<Level>,
    ask: Option<Level>,
}

struct BookState {
    file: usize,
    sync: VenueSync,
    report: BookReport,
    /// Top of the book by the cross sequence it was at (Bybit), for linking tickers.
    applied: HashMap<u64, Top>,
    applied_order: VecDeque<u64>,
    pending: BTreeMap<u64, TickerFrame>,
    unsequenced: bool,
}

impl BookState {
    fn new(file: usize, config: VenueSyncConfig, depth: Option<usize>) -> Self {
        Self {
            file,
            sync: VenueSync::new(config),
            report: BookReport { depth, ..BookReport::default() },
            applied: HashMap::new(),
            applied_order: VecDeque::new(),
            pending: BTreeMap::new(),
            unsequenced: false,
        }
    }

    fn apply(&mut self, f: &BookFrame) {
        self.report.messages += 1;
        self.unsequenced |= f.seq.is_none();
        self.sync.handle_message(f.message());
        self.drain();
        if let (Some(cs), true) = (f.cross_seq, self.sync.is_synced()) {
            let book = self.sync.book();
            let top = Top { bid: book.best_bid(), ask: book.best_ask() };
            if let Some(t) = self.pending.remove(&cs) {
                self.check(&t, top);
            }
            // tickers behind the book can never match a later message
            self.pending = self.pending.split_off(&cs);
            self.applied.insert(cs, top);
            self.applied_order.push_back(cs);
            if self.applied_order.len() > APPLIED_WINDOW {
                let old = self.applied_order.pop_front().expect("non-empty");
                self.applied.remove(&old);
            }
        }
    }

    fn drain(&mut self) {
        while let Some(e) = self.sync.poll_event() {
            if let SyncEvent::ChecksumMismatch { last_update_id, expected, computed } = e {
                self.report.first_mismatch.get_or_insert_with(|| {
                    format!("message {last_update_id}: checksum {expected}, the book's {computed}")
                });
            }
        }
    }

    fn on_ticker(&mut self, t: TickerFrame) {
        let (Some(cs), Some(_), Some(_)) = (t.cross_seq, t.bid, t.ask) else {
            self.report.tickers_unlinked += 1;
            return;
        };
        match self.applied.get(&cs) {
            Some(&top) => self.check(&t, top),
            None if self.applied_order.back().is_none_or(|&last| cs > last) => {
                self.pending.insert(cs, t);
            }
            None => self.report.tickers_unlinked += 1,
        }
    }

    fn check(&mut self, t: &TickerFrame, top: Top) {
        self.report.ticker_checks += 1;
        if top.bid != t.bid || top.ask != t.ask {
            self.report.ticker_mismatches += 1;
            self.report.first_mismatch.get_or_insert_with(|| {
                format!(
                    "cs={:?}: ticker bid {:?} ask {:?}, book bid {:?} ask {:?}",
                    t.cross_seq, t.bid, t.ask, top.bid, top.ask
                )
            });
        }
    }

    fn finish(mut self) -> BookReport {
        self.report.tickers_unlinked += self.pending.len() as u64;
        let s = self.sync.stats();
        let r = &mut self.report;
        r.snapshots = s.snapshots_applied;
        r.applied = s.deltas_applied;
        r.heartbeats = s.heartbeats;
        r.stale_dropped = s.stale_dropped;
        r.unsynced_dropped = s.unsynced_dropped;
        r.gaps = s.gaps;
        r.resyncs = s.resyncs;
        r.sequence_resets = s.sequence_resets;
        r.checksums_verified = s.checksums_verified;
        r.checksums_failed = s.checksum_mismatches;
        r.checksums_unchecked = s.checksums_unchecked;
        r.crossed = s.crossed;
        r.synced = self.sync.state() == SyncState::Synced;
        r.last_seq = self.sync.last_seq();
        self.report
    }
}

#[derive(Default)]
struct TradeState {
    report: VenueTradesReport,
    ids: TradeIds,
    fold: TradeFold,
    /// 1m candles folded from the trades, by open time.
    folded: BTreeMap<i64, Candle>,
    /// The venue's own 1m candles, by open time, and whether the venue said they closed.
    venue: BTreeMap<i64, (Candle, bool)>,
    /// The venue's time of the first trade the capture has of this instrument.
    first_trade_ms: Option<i64>,
    /// The venue's time of the last trade before each reconnection of its connection, and of
    /// the first after it: trades in between may be missing.
    interruptions: Vec<(i64, i64)>,
    last_trade_ms: Option<i64>,
    /// A reconnection happened since the last trade.
    interrupted: bool,
    /// The file its trades came on.
    file: Option<usize>,
}

/// Everything one replay holds.
struct Replay {
    dialect: Dialect,
    books: BTreeMap<(String, Option<usize>), BookState>,
    trades: BTreeMap<String, TradeState>,
    refusals: BTreeMap<String, u64>,
    /// Kraken v2 book depth by symbol, from the subscriptions sent.
    depths: HashMap<String, usize>,
    /// Precisions by symbol (Kraken's `instrument` channel).
    precisions: HashMap<String, (Option<u8>, Option<u8>)>,
    /// Each file's connection sequence (Coinbase).
    sequences: Vec<ConnectionSequence>,
    messages: Vec<Message>,
    bad_frames: u64,
    first_bad_frame: Option<String>,
}

impl Replay {
    fn new(dialect: Dialect, files: usize) -> Self {
        Self {
            dialect,
            books: BTreeMap::new(),
            trades: BTreeMap::new(),
            refusals: BTreeMap::new(),
            depths: HashMap::new(),
            precisions: HashMap::new(),
            sequences: vec![ConnectionSequence::default(); files],
            messages: Vec::new(),
            bad_frames: 0,
            first_bad_frame: None,
        }
    }

    fn on_line(&mut self, r: Recorded) -> anyhow::Result<()> {
        match r.line {
            Line::Connected => {
                self.sequences[r.file].reset();
                for t in self.trades.values_mut().filter(|t| t.file == Some(r.file)) {
                    t.interrupted = true;
                }
                for b in self.books.values_mut().filter(|b| b.file == r.file) {
                    b.sync.handle_connection_lost();
                    b.drain();
                }
            }
            Line::Sent(json) => self.on_sent(&json),
            Line::Received(json) => {
                let mut messages = std::mem::take(&mut self.messages);
                messages.clear();
                if let Err(e) = venues::parse(self.dialect, &json, &mut messages) {
                    // a broken frame is the venue's (or the recorder's): counted, and the
                    // books go on, as they would live
                    self.bad_frames += 1;
                    self.first_bad_frame.get_or_insert_with(|| format!("{}: {e}", r.origin));
                }
                for m in messages.drain(..) {
                    if let Message::Sequence { seq } = m {
                        if !self.on_sequence(r.file, seq) {
                            break; // a frame already seen on this connection
                        }
                        continue;
                    }
                    self.on_message(r.file, m);
                }
                self.messages = messages;
            }
        }
        Ok(())
    }

    /// Kraken v2's book depth is the subscription's, not in the book messages.
    fn on_sent(&mut self, json: &str) {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(json) else { return };
        let params = &v["params"];
        if v["method"] != "subscribe" || params["channel"] != "book" {
            return;
        }
        let depth = params["depth"].as_u64().map_or(KRAKEN_DEFAULT_DEPTH, |d| d as usize);
        for s in params["symbol"].as_array().into_iter().flatten().filter_map(|s| s.as_str()) {
            self.depths.insert(s.to_string(), depth);
        }
    }

    fn on_message(&mut self, file: usize, m: Message) {
        match m {
            Message::Book(f) => self.on_book(file, f),
            Message::Ticker(t) => {
                let mut linked = false;
                for ((symbol, _), b) in self.books.iter_mut() {
                    if *symbol == t.symbol && !linked {
                        b.on_ticker(t.clone());
                        linked = true;
                    }
                }
            }
            Message::Trades { symbol, trades } => {
                let s = self.trades.entry(symbol).or_default();
                s.file = Some(file);
                for t in &trades {
                    s.first_trade_ms.get_or_insert(t.time_ms);
                    if std::mem::take(&mut s.interrupted) {
                        let before = s.last_trade_ms.unwrap_or(t.time_ms);
                        s.interruptions.push((before, t.time_ms));
                    }
                    s.last_trade_ms = Some(t.time_ms);
                    s.report.trades += 1;
                    if let Some(id) = t.id.seq() {
                        match s.ids.observe(id) {
                            shared::trade::IdVerdict::Duplicate => {
                                s.report.duplicate_ids += 1;
                                continue;
                            }
                            shared::trade::IdVerdict::Gap { .. } => s.report.id_gaps += 1,
                            _ => {}
                        }
                    }
                    if let Some(c) = s.fold.push(t) {
                        s.folded.insert(c.open_time, c);
                    }
                }
            }
            Message::Candle(CandleFrame { symbol, minutes: 1, candle, closed }) => {
                let s = self.trades.entry(symbol).or_default();
                s.venue.insert(candle.open_time, (candle, closed == Some(true)));
            }
            Message::Candle(_) => {}
            Message::Sequence { seq } => {
                self.on_sequence(file, seq);
            }
            Message::Instrument(i) => {
                self.precisions.insert(i.symbol, (i.price_decimals, i.qty_decimals));
            }
            Message::Refused { code, message, .. } => {
                *self.refusals.entry(format!("{code} {message}")).or_default() += 1;
            }
            Message::Heartbeat | Message::Ack { .. } | Message::Ignored { .. } => {}
        }
    }

    /// A connection-wide sequence number; `false` for a duplicate, whose frame is dropped.
    fn on_sequence(&mut self, file: usize, seq: u64) -> bool {
        match self.sequences[file].observe(seq) {
            ConnectionVerdict::Gap { .. } => {
                for b in self.books.values_mut().filter(|b| b.file == file) {
                    b.sync.handle_lost_message();
                    b.drain();
                }
                true
            }
            ConnectionVerdict::Duplicate => false,
            ConnectionVerdict::First | ConnectionVerdict::Next => true,
        }
    }

    fn on_book(&mut self, file: usize, f: BookFrame) {
        let dialect = self.dialect;
        let kraken_v2 = dialect == Dialect::Kraken && f.printed.is_none();
        let depth = match f.depth {
            Some(d) => Some(d),
            None if dialect == Dialect::Kraken => {
                Some(self.depths.get(&f.symbol).copied().unwrap_or(KRAKEN_DEFAULT_DEPTH))
            }
            None => None,
        };
        let precision = self.precisions.get(&f.symbol).copied();
        let key = (f.symbol.clone(), f.depth);
        let book = self.books.entry(key).or_insert_with(|| {
            let mut config = VenueSyncConfig::new(dialect.sequence_rule(), dialect.checksum_rule());
            config.depth = depth;
            if kraken_v2 {
                // JSON numbers carry no padding: the instrument's precisions print them
                let (p, q) = precision.unwrap_or_default();
                config.price_format = p.map(NumberFormat::Fixed);
                config.qty_format = q.map(NumberFormat::Fixed);
            }
            BookState::new(file, config, depth)
        });
        book.file = file;
        book.apply(&f);
    }

    fn finish(self) -> Vec<VenueReport> {
        let mut symbols: BTreeMap<String, VenueReport> = BTreeMap::new();
        let dialect = self.dialect;
        let report = |symbol: &str| -> VenueReport {
            VenueReport {
                venue: dialect,
                symbol: symbol.to_string(),
                books: Vec::new(),
                trades: VenueTradesReport::default(),
                refusals: 0,
                bad_frames: 0,
                first_bad_frame: None,
                notes: Vec::new(),
                ok: false,
            }
        };
        for ((symbol, _), b) in self.books {
            let r = symbols.entry(symbol.clone()).or_insert_with(|| report(&symbol));
            if b.unsequenced && dialect == Dialect::Okx {
                r.notes.push(
                    "OKX books without seqId (an older capture): synced on checksums alone".into(),
                );
            }
            let unchecked = b.sync.stats().checksums_unchecked;
            if unchecked > 0
                && dialect == Dialect::Kraken
                && b.sync.config().price_format.is_none()
                && b.sync.config().qty_format.is_none()
            {
                r.notes.push("Kraken v2 books without the instrument's precisions in the capture: checksums unchecked".into());
            }
            r.books.push(b.finish());
        }
        for (symbol, t) in self.trades {
            let r = symbols.entry(symbol.clone()).or_insert_with(|| report(&symbol));
            r.trades = compare_candles(t);
        }
        let refusals: u64 = self.refusals.values().sum();
        for r in symbols.values_mut() {
            r.refusals = refusals;
            r.bad_frames = self.bad_frames;
            r.first_bad_frame.clone_from(&self.first_bad_frame);
            r.notes.dedup();
            r.judge();
        }
        symbols.into_values().collect()
    }
}

/// Folds the last trades and compares the venue's closed 1m candles with the ones its trades
/// make, for each minute the capture covers whole (by the venue's clock): trades seen since
/// before the minute began, and no reconnection between two trades around it.
fn compare_candles(mut t: TradeState) -> VenueTradesReport {
    if let Some(c) = t.fold.close_through(i64::MAX) {
        t.folded.insert(c.open_time, c);
    }
    // a venue that never says "closed" (Kraken) has closed every candle but its last
    let last_open = t.venue.keys().next_back().copied();
    let mut r = t.report;
    for (&open, &(venue, said_closed)) in &t.venue {
        let closed = said_closed || Some(open) != last_open;
        if !closed {
            continue;
        }
        r.venue_candles += 1;
        let end = open + 60_000;
        let covered = t.first_trade_ms.is_some_and(|first| first < open)
            && t.last_trade_ms.is_some_and(|last| last >= end)
            && !t.interruptions.iter().any(|&(a, b)| a < end && b >= open);
        if !covered {
            continue;
        }
        r.candles_compared += 1;
        let ours = t.folded.get(&open);
        let same = ours.is_some_and(|c| {
            c.open == venue.open
                && c.high == venue.high
                && c.low == venue.low
                && c.close == venue.close
                && c.volume == venue.volume
                && (venue.trades == 0 || c.trades == venue.trades)
        });
        if !same {
            r.candle_mismatches += 1;
            r.first_candle_mismatch.get_or_insert_with(|| {
                format!("minute {open}: venue {venue:?}, from trades {ours:?}")
            });
        }
    }
    r
}

/// One line of a capture, with its time; `None` for a blank line.
fn parse_line(origin: &Origin, line: &str, first: bool) -> anyhow::Result<Option<(i128, Line)>> {
    let line = line.trim();
    if line.is_empty() {
        return Ok(None);
    }
    if let Some((_url, ts)) = line.split_once(" <-> ") {
        return Ok(Some((parse_secs(origin, ts.trim())?, Line::Connected)));
    }
    if let Some((_url, rest)) = line.split_once(" <- ") {
        let (ts, json) =
            rest.split_once(": ").ok_or_else(|| bad(origin, "expected `<url> <- <ts>: <json>`"))?;
        return Ok(Some((parse_secs(origin, ts)?, Line::Sent(json.to_string()))));
    }
    if first && (line.starts_with("wss://") || line.starts_with("ws://")) && !line.contains(' ') {
        // cryptofeed's header: the stream URL, before any frame
        return Ok(Some((i128::MIN, Line::Connected)));
    }
    let (ts, frame) = line.split_once(": ").ok_or_else(|| {
        bad(origin, "expected `<ts>: <frame>`, `<url> <- <ts>: <json>` or `<url> <-> <ts>`")
    })?;
    Ok(Some((parse_secs(origin, ts)?, Line::Received(frame.to_string()))))
}

/// One event of millrace's own recording of a venue's connections (the `recording` crate):
/// what it is, with the frame's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordedEvent {
    Connected,
    Sent(String),
    Received(String),
    /// A REST answer (its request, its body): the venue's instrument list gives the
    /// instruments' precisions (Kraken's checksums print with them).
    RestAnswer {
        request: String,
        body: String,
    },
}

/// Replays a recording of `dialect`: `(receive time ns, connection index, where, event)` in
/// receive order, `connections` connections in all (as [`crate::recording::read_source`] gives
/// them); one report per instrument, in name order.
pub fn replay_events(
    dialect: Dialect,
    connections: usize,
    events: Vec<(i128, usize, Origin, RecordedEvent)>,
) -> anyhow::Result<Vec<VenueReport>> {
    let mut replay = EventReplay::new(dialect, connections);
    for (_, conn, origin, e) in events {
        replay.on(conn, origin, e)?;
    }
    Ok(replay.finish())
}

/// [`replay_events`] one event at a time, for a recording read as a stream.
pub struct EventReplay {
    dialect: Dialect,
    replay: Replay,
}

impl EventReplay {
    pub fn new(dialect: Dialect, connections: usize) -> Self {
        EventReplay { dialect, replay: Replay::new(dialect, connections.max(1)) }
    }

    /// The next event in receive order, of connection `conn` (an index below `connections`).
    pub fn on(&mut self, conn: usize, origin: Origin, e: RecordedEvent) -> anyhow::Result<()> {
        let line = match e {
            RecordedEvent::Connected => Line::Connected,
            RecordedEvent::Sent(s) => Line::Sent(s),
            RecordedEvent::Received(s) => Line::Received(s),
            RecordedEvent::RestAnswer { request, body } => {
                let lists = [shared::protocol::Market::Spot, shared::protocol::Market::Futures]
                    .map(|m| venues::rest::instruments_path(self.dialect, m));
                let path = |p: &str| p.split('?').next().unwrap_or(p).to_string();
                if lists.iter().any(|l| request.contains(&path(l))) {
                    if let Ok(list) = venues::rest::parse_instruments(self.dialect, &body) {
                        for i in list {
                            self.replay
                                .precisions
                                .insert(i.symbol, (i.price_decimals, i.qty_decimals));
                        }
                    }
                }
                return Ok(());
            }
        };
        self.replay.on_line(Recorded { file: conn, origin, line })
    }

    /// One report per instrument, in name order.
    pub fn finish(self) -> Vec<VenueReport> {
        self.replay.finish()
    }
}

/// Replays `files` of `dialect` and returns one report per instrument, in name order. The files
/// are read as a stream in receive order ([`crate::input::for_each_merged`]; equal times keep
/// file order, then line order), each file one connection.
pub fn replay(dialect: Dialect, files: &[PathBuf]) -> anyhow::Result<Vec<VenueReport>> {
    // cryptofeed's header is a file's first line
    let parse = |_, origin: &Origin, line: &str| parse_line(origin, line, origin.line == 1);
    let surveyed = input::survey(files, parse, |_, _| {})?;
    let mut replay = Replay::new(dialect, files.len());
    input::for_each_merged(
        files,
        &surveyed,
        input::MAX_HELD_BYTES,
        parse,
        |file, origin, _, line| replay.on_line(Recorded { file, origin, line }),
    )?;
    Ok(replay.finish())
}

/// Runs the replay, printing one JSON object per instrument; returns whether every check passed.
pub fn run(dialect: Dialect, files: &[PathBuf], out: &mut dyn Write) -> anyhow::Result<bool> {
    let reports = replay(dialect, files)?;
    if reports.is_empty() {
        anyhow::bail!("no {dialect} books, trades or candles found in {} file(s)", files.len());
    }
    let mut ok = true;
    for r in &reports {
        ok &= r.ok;
        serde_json::to_writer(&mut *out, r)?;
        writeln!(out)?;
    }
    Ok(ok)
}
