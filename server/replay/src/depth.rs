//! `millrace replay depth FILE...`: sync order books from recorded Binance depth streams with the
//! shared [`BookSync`] machine and check them against the exchange's own `bookTicker`.
//!
//! Accepted recordings (any mix, any number of symbols):
//! - cryptofeed pairs: `*.http.*` files of REST depth snapshots (`<url> -> <ts>: <json>`) and
//!   `*.ws.*` files of combined-stream messages (`<ts>: <json>`, first line the stream URL);
//! - hftbacktest files (`<recv_ns> <json>`, plain or `.gz`), where one line without `"stream"` is
//!   the REST snapshot; several files are one continuous stream.
//!
//! All events are merged by their receive timestamps (equal times in file order, then line
//! order), read as a stream ([`crate::input::for_each_merged`]): only the lines a file's own
//! disorder could still put behind one to come are held, not the recording.
//! Each symbol uses the futures continuity rule when its depth events carry `pu`, else the spot
//! rule. A `bookTicker` is checked when its `u` equals the final `u` of an applied diff, whether
//! it arrives before or after that diff: best bid/ask price and quantity must be equal.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::Write;
use std::path::PathBuf;

use serde::Serialize;
use serde_json::Value;
use shared::book::Level;
use shared::sync::{
    BookSync, ContinuityRule, DepthDelta, DepthSnapshot, SyncConfig, SyncEvent, SyncState,
};
use shared::{Price, Qty};

use crate::input::{self, bad, parse_secs, InputError, Origin, MAX_HELD_BYTES};
use crate::venue::RecordedEvent;

/// Arguments of `millrace replay depth`.
#[derive(Debug, clap::Args)]
pub struct DepthArgs {
    /// Recorded files: cryptofeed `.http.*`/`.ws.*` pairs or hftbacktest `<recv_ns> <json>` files;
    /// for another venue, its captures (`<ts>: <json>`, `<url> <- <ts>: <json>`, `<url> <-> <ts>`).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Whose wire format the files hold: binance, okx, bybit, coinbase or kraken.
    #[arg(long, default_value = "binance")]
    pub venue: shared::venue::Dialect,
}

/// One recorded message, decoded.
#[derive(Debug, Clone)]
enum Event {
    Delta {
        symbol: String,
        delta: DepthDelta,
    },
    Ticker {
        symbol: String,
        ticker: Ticker,
    },
    /// A REST snapshot; `symbol` is `None` when the recording does not say (hftbacktest).
    Snapshot {
        symbol: Option<String>,
        snapshot: DepthSnapshot,
    },
    /// A recorded connection that streams the symbol's diffs opened again: its book starts
    /// over, as a live job's does when its stream reconnects.
    Reconnected {
        symbol: String,
    },
    Other,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ticker {
    u: u64,
    bid: Level,
    ask: Level,
}

/// Best bid and ask after an applied diff.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Top {
    bid: Option<Level>,
    ask: Option<Level>,
}

/// Per-symbol result, printed as one JSON line.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct DepthReport {
    pub symbol: String,
    pub market: &'static str,
    pub diffs: u64,
    pub diffs_applied: u64,
    pub levels_applied: u64,
    pub stale_dropped: u64,
    pub gaps: u64,
    pub resyncs: u64,
    pub snapshots: u64,
    pub verifications: u64,
    pub drift_levels: u64,
    pub ticker_checks: u64,
    pub ticker_mismatches: u64,
    pub crossed: u64,
    pub synced: bool,
    pub last_update_id: u64,
    /// The first mismatching ticker, for diagnosis.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_mismatch: Option<String>,
}

impl DepthReport {
    /// Whether the book is right at the end, its gaps found and healed: synced, never crossed,
    /// every ticker and verification agreeing (a recording of a live run holds the gaps the
    /// run met, and the snapshots that healed them).
    pub fn consistent(&self) -> bool {
        self.synced && self.ticker_mismatches == 0 && self.crossed == 0 && self.drift_levels == 0
    }

    /// Whether every check passed for this symbol.
    pub fn ok(&self) -> bool {
        self.synced
            && self.gaps == 0
            && self.ticker_mismatches == 0
            && self.crossed == 0
            && self.drift_levels == 0
    }
}

/// How many applied diffs to remember for tickers that arrive after later diffs.
const APPLIED_WINDOW: usize = 4096;

struct SymbolState {
    sync: BookSync,
    report: DepthReport,
    /// Top of book after each recently applied diff, by its `u`.
    applied: HashMap<u64, Top>,
    applied_order: VecDeque<u64>,
    /// Tickers whose `u` is ahead of the book, waiting for that diff.
    pending: BTreeMap<u64, Ticker>,
}

impl SymbolState {
    fn new(symbol: &str, futures: bool) -> Self {
        let mut config =
            SyncConfig::new(if futures { ContinuityRule::Futures } else { ContinuityRule::Spot });
        config.verify_interval_ms = None; // recordings hold the snapshots they hold
        let mut sync = BookSync::new(config);
        while sync.poll_event().is_some() {}
        Self {
            sync,
            report: DepthReport {
                symbol: symbol.to_string(),
                market: if futures { "futures" } else { "spot" },
                diffs: 0,
                diffs_applied: 0,
                levels_applied: 0,
                stale_dropped: 0,
                gaps: 0,
                resyncs: 0,
                snapshots: 0,
                verifications: 0,
                drift_levels: 0,
                ticker_checks: 0,
                ticker_mismatches: 0,
                crossed: 0,
                synced: false,
                last_update_id: 0,
                first_mismatch: None,
            },
            applied: HashMap::new(),
            applied_order: VecDeque::new(),
            pending: BTreeMap::new(),
        }
    }

    fn check(&mut self, t: &Ticker, top: &Top) {
        self.report.ticker_checks += 1;
        if top.bid != Some(t.bid) || top.ask != Some(t.ask) {
            self.report.ticker_mismatches += 1;
            if self.report.first_mismatch.is_none() {
                self.report.first_mismatch = Some(format!(
                    "u={}: ticker bid {}x{} ask {}x{}, book bid {:?} ask {:?}",
                    t.u, t.bid.price, t.bid.qty, t.ask.price, t.ask.qty, top.bid, top.ask
                ));
            }
        }
    }

    fn on_ticker(&mut self, t: Ticker) {
        let last = self.sync.last_update_id();
        if self.sync.state() == SyncState::Synced && t.u <= last {
            if let Some(top) = self.applied.get(&t.u).copied() {
                self.check(&t, &top);
            }
        } else {
            self.pending.insert(t.u, t);
        }
    }

    fn drain(&mut self) {
        while let Some(e) = self.sync.poll_event() {
            if let SyncEvent::BookChanged { last_update_id: u } = e {
                let book = self.sync.book();
                let top = Top { bid: book.best_bid(), ask: book.best_ask() };
                if let Some(t) = self.pending.remove(&u) {
                    self.check(&t, &top);
                }
                // tickers behind the book can never match a later diff
                self.pending = self.pending.split_off(&u);
                self.applied.insert(u, top);
                self.applied_order.push_back(u);
                if self.applied_order.len() > APPLIED_WINDOW {
                    let old = self.applied_order.pop_front().expect("non-empty");
                    self.applied.remove(&old);
                }
            }
        }
    }

    fn finish(mut self) -> DepthReport {
        let s = self.sync.stats();
        let r = &mut self.report;
        r.diffs_applied = s.deltas_applied;
        r.levels_applied = s.levels_applied;
        r.stale_dropped = s.stale_dropped;
        r.gaps = s.gaps;
        r.resyncs = s.resyncs;
        r.snapshots = s.snapshots_applied;
        r.verifications = s.verifications;
        r.drift_levels = s.drift_levels;
        r.crossed = s.crossed;
        r.synced = self.sync.state() == SyncState::Synced;
        r.last_update_id = self.sync.last_update_id();
        self.report
    }
}

/// What the first reading of a capture learns before its books are synced: each symbol's rule,
/// and the symbols each file streams (to attribute hftbacktest's snapshots, which name none).
struct Learned {
    /// Symbols with depth events, and whether they follow the futures (`pu`) rule.
    futures: HashMap<String, bool>,
    file_symbols: Vec<Vec<String>>,
}

/// Calls `each(time ns, event)` with the events of `files` in receive order (equal times in
/// file order, then line order), read as a stream ([`crate::input::for_each_merged`]): a first
/// reading learns the symbols' rules and each file's symbols, the second hands the events on,
/// a snapshot without a symbol given its file's one symbol.
fn for_each_event(
    files: &[PathBuf],
    mut each: impl FnMut(&HashMap<String, bool>, i128, Event),
) -> anyhow::Result<()> {
    let kinds: Vec<FileKind> = files.iter().map(|p| FileKind::of(p)).collect();
    let parse = |i: usize, origin: &Origin, line: &str| parse_line(kinds[i], origin, line);
    let mut learned =
        Learned { futures: HashMap::new(), file_symbols: vec![Vec::new(); files.len()] };
    let surveyed = input::survey(files, parse, |i, event| {
        if let Event::Delta { symbol, delta } = event {
            if !learned.file_symbols[i].contains(symbol) {
                learned.file_symbols[i].push(symbol.clone());
            }
            *learned.futures.entry(symbol.clone()).or_default() |= delta.prev_last_id.is_some();
        }
    })?;
    input::for_each_merged(files, &surveyed, MAX_HELD_BYTES, parse, |i, origin, ts_ns, event| {
        let event = attributed(event, &learned.file_symbols[i], origin)?;
        each(&learned.futures, ts_ns, event);
        Ok(())
    })
}

/// `event`, a snapshot without a symbol given the one symbol its file streams (`symbols`); such
/// a snapshot in a file of several symbols is an error.
fn attributed(mut event: Event, symbols: &[String], origin: Origin) -> anyhow::Result<Event> {
    if let Event::Snapshot { symbol: symbol @ None, .. } = &mut event {
        let [one] = symbols else {
            return Err(InputError::new(
                origin,
                format!(
                    "a depth snapshot without a symbol in a file that streams {} symbols ({}); \
                     record one symbol per file",
                    symbols.len(),
                    symbols.join(", ")
                ),
            )
            .into());
        };
        *symbol = Some(one.clone());
    }
    Ok(event)
}

/// One input of a book sync, as recorded.
#[derive(Debug, Clone)]
pub enum BookInput {
    Delta(DepthDelta),
    Snapshot(DepthSnapshot),
}

/// The book inputs of every symbol in a recording, in receive order, with whether the symbol
/// follows the futures rule: what the sync benchmark replays without JSON parsing in the loop.
pub fn book_inputs(files: &[PathBuf]) -> anyhow::Result<BTreeMap<String, (bool, Vec<BookInput>)>> {
    let mut out: BTreeMap<String, (bool, Vec<BookInput>)> = BTreeMap::new();
    for_each_event(files, |futures, _, event| {
        let (symbol, input) = match event {
            Event::Delta { symbol, delta } => (symbol, BookInput::Delta(delta)),
            Event::Snapshot { symbol: Some(symbol), snapshot } => {
                (symbol, BookInput::Snapshot(snapshot))
            }
            _ => return,
        };
        let Some(&is_futures) = futures.get(&symbol) else { return };
        out.entry(symbol).or_insert_with(|| (is_futures, Vec::new())).1.push(input);
    })?;
    Ok(out)
}

/// Replays `files` and returns one report per symbol, in symbol order.
pub fn replay(files: &[PathBuf]) -> anyhow::Result<Vec<DepthReport>> {
    let mut symbols: BTreeMap<String, SymbolState> = BTreeMap::new();
    for_each_event(files, |futures, ts_ns, event| step(&mut symbols, futures, ts_ns, event))?;
    Ok(symbols.into_values().map(SymbolState::finish).collect())
}

/// The check of a millrace recording of a Binance-protocol source (`millrace replay
/// recording`), fed its events `(receive time ns, connection, where, event)` twice in receive
/// order (as [`crate::recording::for_each_event`] gives them): [`RecordedBooks::learn`] first
/// learns which rule each symbol follows and which symbols each connection streams (a
/// reconnection resyncs those), then [`RecordedBooks::step`] syncs the books. Its
/// combined-stream frames are the diffs and tickers, its answers to depth requests
/// (`…/depth?symbol=…`) the snapshots; an answer or a frame of anything else (an instrument list,
/// a subscription's reply, an error answer) is passed over.
#[derive(Default)]
pub struct RecordedBooks {
    /// Symbols with depth events, and whether they follow the futures (`pu`) rule.
    futures: HashMap<String, bool>,
    conn_symbols: HashMap<usize, Vec<String>>,
    symbols: BTreeMap<String, SymbolState>,
}

impl RecordedBooks {
    /// The event a recorded one is to the check: `None` for what it passes over (a
    /// connection's opening is told by the caller).
    fn event_of(origin: &Origin, event: &RecordedEvent) -> anyhow::Result<Option<Event>> {
        Ok(Some(match event {
            RecordedEvent::Received(text) => {
                let v: Value = serde_json::from_str(text)
                    .map_err(|e| bad(origin, format!("invalid JSON: {e}")))?;
                if v.get("stream").is_none() {
                    return Ok(None); // a reply to a request on the connection
                }
                parse_message(origin, &v)?
            }
            RecordedEvent::RestAnswer { request, body } => {
                let url = request.strip_prefix("GET ").unwrap_or(request);
                let path = url.split('?').next().unwrap_or(url);
                let depth = path.ends_with("/api/v3/depth") || path.ends_with("/fapi/v1/depth");
                if !depth || !body.contains("\"lastUpdateId\"") {
                    return Ok(None);
                }
                snapshot_answer(origin, url, body)?
            }
            RecordedEvent::Connected | RecordedEvent::Sent(_) => return Ok(None),
        }))
    }

    /// The first reading: a symbol's rule and a connection's symbols, from its diffs.
    pub fn learn(
        &mut self,
        conn: usize,
        origin: &Origin,
        event: &RecordedEvent,
    ) -> anyhow::Result<()> {
        if let Some(Event::Delta { symbol, delta }) = Self::event_of(origin, event)? {
            *self.futures.entry(symbol.clone()).or_default() |= delta.prev_last_id.is_some();
            let symbols = self.conn_symbols.entry(conn).or_default();
            if !symbols.contains(&symbol) {
                symbols.push(symbol);
            }
        }
        Ok(())
    }

    /// The second reading: each event into its symbol's book; a connection that opens resyncs
    /// the books it streams.
    pub fn step(
        &mut self,
        ts_ns: i128,
        conn: usize,
        origin: &Origin,
        event: RecordedEvent,
    ) -> anyhow::Result<()> {
        if event == RecordedEvent::Connected {
            for symbol in self.conn_symbols.get(&conn).into_iter().flatten() {
                let event = Event::Reconnected { symbol: symbol.clone() };
                step(&mut self.symbols, &self.futures, ts_ns, event);
            }
        } else if let Some(event) = Self::event_of(origin, &event)? {
            step(&mut self.symbols, &self.futures, ts_ns, event);
        }
        Ok(())
    }

    /// One report per symbol, in symbol order.
    pub fn finish(self) -> Vec<DepthReport> {
        self.symbols.into_values().map(SymbolState::finish).collect()
    }
}

/// One event, received at `ts_ns`, into its symbol's book (`futures`: the symbols with depth
/// events and their rule).
fn step(
    symbols: &mut BTreeMap<String, SymbolState>,
    futures: &HashMap<String, bool>,
    ts_ns: i128,
    event: Event,
) {
    let now_ms = (ts_ns / 1_000_000) as i64;
    match event {
        Event::Delta { symbol, delta } => {
            let Some(&is_futures) = futures.get(&symbol) else { return };
            let st = symbols
                .entry(symbol.clone())
                .or_insert_with(|| SymbolState::new(&symbol, is_futures));
            st.report.diffs += 1;
            st.sync.handle_delta(delta, now_ms);
            st.drain();
        }
        Event::Snapshot { symbol: Some(symbol), snapshot } => {
            // a snapshot for a symbol without depth events has nothing to sync
            let Some(&is_futures) = futures.get(&symbol) else { return };
            let st = symbols
                .entry(symbol.clone())
                .or_insert_with(|| SymbolState::new(&symbol, is_futures));
            st.sync.handle_snapshot(snapshot, now_ms);
            st.drain();
        }
        Event::Ticker { symbol, ticker } => {
            if let Some(st) = symbols.get_mut(&symbol) {
                st.on_ticker(ticker);
            } else if let Some(&is_futures) = futures.get(&symbol) {
                let st = symbols
                    .entry(symbol.clone())
                    .or_insert_with(|| SymbolState::new(&symbol, is_futures));
                st.on_ticker(ticker);
            }
        }
        Event::Reconnected { symbol } => {
            if let Some(st) = symbols.get_mut(&symbol) {
                st.sync.handle_connection_lost(now_ms);
                st.drain();
            }
        }
        Event::Snapshot { symbol: None, .. } | Event::Other => {}
    }
}

/// Runs the replay, printing one JSON object per symbol; returns whether every check passed.
pub fn run(args: &DepthArgs, out: &mut dyn Write) -> anyhow::Result<bool> {
    if args.venue != shared::venue::Dialect::Binance {
        return crate::venue::run(args.venue, &args.files, out);
    }
    let reports = replay(&args.files)?;
    if reports.is_empty() {
        anyhow::bail!("no depth updates found in {} file(s)", args.files.len());
    }
    let mut ok = true;
    for r in &reports {
        ok &= r.ok();
        serde_json::to_writer(&mut *out, r)?;
        writeln!(out)?;
    }
    Ok(ok)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FileKind {
    /// cryptofeed `*.http.*`: `<url> -> <ts>: <json>`
    CryptofeedHttp,
    /// cryptofeed `*.ws.*`: `<ts>: <json>`, or hftbacktest `<ns> <json>`: told apart per line.
    Stream,
}

impl FileKind {
    fn of(path: &std::path::Path) -> Self {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if name.contains(".http.") {
            FileKind::CryptofeedHttp
        } else {
            FileKind::Stream
        }
    }
}

fn parse_line(
    kind: FileKind,
    origin: &Origin,
    line: &str,
) -> anyhow::Result<Option<(i128, Event)>> {
    let line = line.trim();
    if line.is_empty() {
        return Ok(None);
    }
    match kind {
        FileKind::CryptofeedHttp => {
            let (url, rest) = line
                .split_once(" -> ")
                .ok_or_else(|| bad(origin, "expected `<url> -> <ts>: <json>`"))?;
            let (ts, json) = rest
                .split_once(": ")
                .ok_or_else(|| bad(origin, "expected `<ts>: <json>` after `->`"))?;
            let ts_ns = parse_secs(origin, ts)?;
            Ok(Some((ts_ns, snapshot_answer(origin, url, json)?)))
        }
        FileKind::Stream => {
            if line.starts_with("wss://") || line.starts_with("ws://") {
                return Ok(None); // cryptofeed's header: the stream URL
            }
            let (ts, json) =
                line.split_once(' ').ok_or_else(|| bad(origin, "expected `<timestamp> <json>`"))?;
            let ts_ns = match ts.strip_suffix(':') {
                Some(secs) => parse_secs(origin, secs)?,
                None => {
                    ts.parse::<i128>().map_err(|_| bad(origin, format!("bad timestamp {ts:?}")))?
                }
            };
            let v: Value = serde_json::from_str(json)
                .map_err(|e| bad(origin, format!("invalid JSON: {e}")))?;
            Ok(Some((ts_ns, parse_message(origin, &v)?)))
        }
    }
}

/// A REST depth answer to a request for `url` (whose `symbol=` names the book).
fn snapshot_answer(origin: &Origin, url: &str, json: &str) -> anyhow::Result<Event> {
    let symbol = url
        .split(['?', '&'])
        .find_map(|kv| kv.strip_prefix("symbol="))
        .ok_or_else(|| bad(origin, "snapshot URL has no symbol= parameter"))?;
    let v: Value =
        serde_json::from_str(json).map_err(|e| bad(origin, format!("invalid JSON: {e}")))?;
    let snapshot = parse_snapshot(origin, &v)?;
    Ok(Event::Snapshot { symbol: Some(symbol.to_ascii_uppercase()), snapshot })
}

fn field_u64(origin: &Origin, v: &Value, key: &str) -> anyhow::Result<u64> {
    v.get(key)
        .and_then(Value::as_u64)
        .ok_or_else(|| bad(origin, format!("missing or non-integer field {key:?}")))
}

fn field_str<'a>(origin: &Origin, v: &'a Value, key: &str) -> anyhow::Result<&'a str> {
    v.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| bad(origin, format!("missing or non-string field {key:?}")))
}

fn parse_price(origin: &Origin, s: &str) -> anyhow::Result<Price> {
    Price::parse(s).map_err(|e| bad(origin, format!("bad price {s:?}: {e}")))
}

fn parse_qty(origin: &Origin, s: &str) -> anyhow::Result<Qty> {
    Qty::parse(s).map_err(|e| bad(origin, format!("bad quantity {s:?}: {e}")))
}

fn parse_levels(origin: &Origin, v: &Value, key: &str) -> anyhow::Result<Vec<Level>> {
    let arr = v
        .get(key)
        .and_then(Value::as_array)
        .ok_or_else(|| bad(origin, format!("missing level list {key:?}")))?;
    arr.iter()
        .map(|pair| {
            let (Some(p), Some(q)) =
                (pair.get(0).and_then(Value::as_str), pair.get(1).and_then(Value::as_str))
            else {
                return Err(bad(origin, format!("{key:?} entries must be [\"price\",\"qty\"]")));
            };
            Ok(Level::new(parse_price(origin, p)?, parse_qty(origin, q)?))
        })
        .collect()
}

fn parse_snapshot(origin: &Origin, v: &Value) -> anyhow::Result<DepthSnapshot> {
    Ok(DepthSnapshot {
        last_update_id: field_u64(origin, v, "lastUpdateId")?,
        bids: parse_levels(origin, v, "bids")?,
        asks: parse_levels(origin, v, "asks")?,
    })
}

fn parse_message(origin: &Origin, v: &Value) -> anyhow::Result<Event> {
    let Some(stream) = v.get("stream").and_then(Value::as_str) else {
        if v.get("lastUpdateId").is_some() {
            return Ok(Event::Snapshot { symbol: None, snapshot: parse_snapshot(origin, v)? });
        }
        return Err(bad(
            origin,
            "message is neither a combined-stream message nor a depth snapshot",
        ));
    };
    let data = v.get("data").ok_or_else(|| bad(origin, "combined-stream message without data"))?;
    let kind = stream.split_once('@').map(|(_, k)| k).unwrap_or("");
    if kind.starts_with("depth") && data.get("e").and_then(Value::as_str) == Some("depthUpdate") {
        let symbol = field_str(origin, data, "s")?.to_ascii_uppercase();
        let first_id = field_u64(origin, data, "U")?;
        let last_id = field_u64(origin, data, "u")?;
        if first_id > last_id {
            return Err(bad(origin, format!("depth update with U {first_id} > u {last_id}")));
        }
        let prev_last_id = match data.get("pu") {
            None => None,
            Some(_) => Some(field_u64(origin, data, "pu")?),
        };
        let delta = DepthDelta {
            first_id,
            last_id,
            prev_last_id,
            bids: parse_levels(origin, data, "b")?,
            asks: parse_levels(origin, data, "a")?,
            checksum: None,
        };
        Ok(Event::Delta { symbol, delta })
    } else if kind == "bookTicker" {
        let symbol = field_str(origin, data, "s")?.to_ascii_uppercase();
        let ticker = Ticker {
            u: field_u64(origin, data, "u")?,
            bid: Level::new(
                parse_price(origin, field_str(origin, data, "b")?)?,
                parse_qty(origin, field_str(origin, data, "B")?)?,
            ),
            ask: Level::new(
                parse_price(origin, field_str(origin, data, "a")?)?,
                parse_qty(origin, field_str(origin, data, "A")?)?,
            ),
        };
        Ok(Event::Ticker { symbol, ticker })
    } else {
        Ok(Event::Other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin() -> Origin {
        Origin { path: "x".into(), line: 3 }
    }

    #[test]
    fn timestamps_parse_exactly() {
        assert_eq!(parse_secs(&origin(), "1633998512.0633569").unwrap(), 1_633_998_512_063_356_900);
        assert_eq!(parse_secs(&origin(), "1633998512").unwrap(), 1_633_998_512_000_000_000);
        assert!(parse_secs(&origin(), "16x").is_err());
        assert!(parse_secs(&origin(), "999999999999999999999999999999.5").is_err());
    }

    #[test]
    fn bad_lines_name_the_place() {
        let e = parse_line(FileKind::Stream, &origin(), "123 {\"stream\":\"x@depth\",\"data\":{\"e\":\"depthUpdate\",\"s\":\"X\",\"U\":1,\"u\":2,\"b\":[[\"abc\",\"1\"]],\"a\":[]}}")
            .unwrap_err();
        assert!(e.to_string().starts_with("x:3: bad price \"abc\""), "{e}");
        let e = parse_line(FileKind::Stream, &origin(), "123 {not json").unwrap_err();
        assert!(e.to_string().contains("invalid JSON"), "{e}");
        let e = parse_line(FileKind::CryptofeedHttp, &origin(), "https://x/depth -> 1: {}")
            .unwrap_err();
        assert!(e.to_string().contains("no symbol="), "{e}");
        let e = parse_line(FileKind::Stream, &origin(), "123 {\"stream\":\"x@depth\",\"data\":{\"e\":\"depthUpdate\",\"s\":\"X\",\"U\":5,\"u\":2,\"b\":[],\"a\":[]}}").unwrap_err();
        assert!(e.to_string().contains("U 5 > u 2"), "{e}");
    }

    /// Randomly damaged lines (bytes flipped, cut, duplicated) give errors or events, never panics.
    #[test]
    fn damaged_lines_never_panic() {
        let lines = [
            (
                FileKind::Stream,
                r#"1633998512.564785: {"stream":"nknusdt@depth@100ms","data":{"e":"depthUpdate","E":1633998512568,"s":"NKNUSDT","U":499869753,"u":499869754,"b":[["0.35170000","4265.00000000"]],"a":[["0.35290000","10968.00000000"]]}}"#,
            ),
            (
                FileKind::Stream,
                r#"1723161254024619568 {"stream":"ethusdt@bookTicker","data":{"u":35346513501,"s":"ETHUSDT","b":"2683.80000000","B":"3.02920000","a":"2683.81000000","A":"31.43950000"}}"#,
            ),
            (
                FileKind::Stream,
                r#"1626992741.081672: {"stream":"sushiusdt@depth@100ms","data":{"e":"depthUpdate","E":1626992741037,"T":1626992741024,"s":"SUSHIUSDT","U":600859599090,"u":600859600917,"pu":600859598061,"b":[["7.5040","813"]],"a":[["7.6150","1563"]]}}"#,
            ),
            (
                FileKind::CryptofeedHttp,
                r#"https://api.binance.com/api/v3/depth?symbol=NKNUSDT&limit=1000 -> 1633998512.320639: {"lastUpdateId":499869752,"bids":[["0.35210000","672.00000000"]],"asks":[["0.35290000","1.0"]]}"#,
            ),
        ];
        let mut rng = shared::testkit::Rng::new(1);
        let (mut ok, mut err) = (0, 0);
        for _ in 0..20_000 {
            let (kind, line) = lines[rng.below(lines.len() as u64) as usize];
            let mut b = line.as_bytes().to_vec();
            for _ in 0..1 + rng.below(4) {
                let i = rng.below(b.len() as u64) as usize;
                match rng.below(4) {
                    0 => {
                        let pool = b"0123456789-.,:\"[]{}ex ";
                        b[i] = pool[rng.below(pool.len() as u64) as usize];
                    }
                    1 => b.truncate(i.max(1)),
                    2 => b.insert(i, b[i]),
                    _ => {
                        b.remove(i);
                    }
                }
                if b.is_empty() {
                    b.push(b'x');
                }
            }
            let Ok(text) = std::str::from_utf8(&b) else { continue };
            match parse_line(kind, &origin(), text) {
                Ok(_) => ok += 1,
                Err(e) => {
                    assert!(e.to_string().starts_with("x:3: "), "{e}");
                    err += 1;
                }
            }
        }
        assert!(ok > 100 && err > 100, "ok {ok} err {err}");
    }

    #[test]
    fn spot_book_ticker_without_event_type_is_recognised() {
        let (_, ev) = parse_line(
            FileKind::Stream,
            &origin(),
            r#"1 {"stream":"ethusdt@bookTicker","data":{"u":5,"s":"ETHUSDT","b":"1.0","B":"2","a":"1.1","A":"3"}}"#,
        )
        .unwrap()
        .unwrap();
        assert!(matches!(ev, Event::Ticker { ticker: Ticker { u: 5, .. }, .. }));
    }
}
