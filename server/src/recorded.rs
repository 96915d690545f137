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

use recording::{FileReader, Kind};
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

/// The venue's name of `instrument` (`BASE/QUOTE`) in the instrument list recorded for
/// `source` (the REST answer its source loaded at start, the way the live source maps it);
/// `None` if no recorded list names it.
pub fn venue_symbol(
    dir: &Path,
    source: &str,
    dialect: Dialect,
    instrument: &shared::protocol::InstrumentId,
) -> Result<Option<String>, RecordedError> {
    let lists = [Market::Spot, Market::Futures].map(|m| {
        let p = venues::rest::instruments_path(dialect, m);
        p.split('?').next().unwrap_or(p).to_string()
    });
    let mut requests: HashMap<u64, bool> = HashMap::new();
    for f in recording::list_files(dir)?.into_iter().filter(|f| f.source == source) {
        let mut reader = FileReader::open(&f.path)?;
        while let Some(block) = reader.next_block()? {
            for r in block {
                match r.kind {
                    Kind::RestRequest => {
                        requests.insert(r.conn, lists.iter().any(|l| r.meta.contains(l.as_str())));
                    }
                    Kind::RestAnswer if requests.remove(&r.conn) == Some(true) => {
                        let body = String::from_utf8_lossy(&r.body);
                        let Ok(list) = venues::rest::parse_instruments(dialect, &body) else {
                            continue;
                        };
                        if let Some(i) = list
                            .into_iter()
                            .find(|i| format!("{}/{}", i.base, i.quote) == instrument.symbol)
                        {
                            return Ok(Some(i.symbol));
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    Ok(None)
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
    for f in recording::list_files(dir)?.into_iter().filter(|f| f.source == source) {
        if to_ms.is_some_and(|t| f.hour_ms > t) || from_ms.is_some_and(|t| f.hour_ms + HOUR_MS <= t)
        {
            continue;
        }
        let mut reader = FileReader::open(&f.path)?;
        while let Some(block) = reader.next_block()? {
            for r in block {
                if r.time_ns < from_ns || r.time_ns > to_ns {
                    continue;
                }
                summary.records += 1;
                let (time_ns, conn) = (r.time_ns, r.conn);
                let mut lines: Vec<ReplayLine> = Vec::new();
                match r.kind {
                    Kind::Received => {
                        let text = String::from_utf8_lossy(&r.body);
                        messages.clear();
                        match venues::parse(dialect, &text, &mut messages) {
                            Ok(()) => {
                                for m in messages.drain(..) {
                                    lines.extend(normalized(time_ns, conn, m, channels));
                                }
                            }
                            Err(e) => {
                                summary.errors += 1;
                                lines.push(ReplayLine::Error {
                                    time_ns,
                                    conn,
                                    error: e.to_string(),
                                })
                            }
                        }
                    }
                    Kind::Connected | Kind::Closed if channels.has("connection") => {
                        let event = if r.kind == Kind::Connected {
                            ConnectionEvent::Connected
                        } else {
                            ConnectionEvent::Closed
                        };
                        lines.push(ReplayLine::Connection { time_ns, conn, event, detail: r.meta });
                    }
                    Kind::RestRequest => {
                        requests.insert(conn, r.meta);
                    }
                    Kind::RestAnswer => {
                        let request = requests.remove(&conn).unwrap_or_default();
                        if channels.has("rest") {
                            lines.push(ReplayLine::Rest {
                                time_ns,
                                conn,
                                request,
                                status: r.meta.parse().unwrap_or(0),
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
                        return Ok(summary);
                    }
                }
            }
        }
        if let Some(t) = reader.torn() {
            summary.torn.push((f.path.display().to_string(), t.offset));
        }
    }
    Ok(summary)
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
