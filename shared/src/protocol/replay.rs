//! `GET /api/v1/replay`: a time range of millrace's recording of a source, as normalized
//! messages, one JSON object per line (NDJSON), in receive order — the way a backtest wants
//! them. Each line says when millrace received it (`time_ns`, Unix ns) and on which recorded
//! connection (`conn`), then what the venue said, read by the venue's own reader: book
//! snapshots and updates with their sequence fields and checksum, trades, candles, tickers; with
//! `connection` and `rest` lines where asked, and an `error` line for a frame the reader
//! refused (it is counted, never skipped silently).

use serde::{Deserialize, Serialize};

use crate::book::Level;
use crate::candle::Candle;
use crate::trade::Trade;

/// The channels a replay can carry (`channels=` of the request; default book, trade, candle).
pub const CHANNELS: [&str; 6] = ["book", "trade", "candle", "ticker", "connection", "rest"];

/// One line of a replay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "channel", rename_all = "snake_case", deny_unknown_fields)]
pub enum ReplayLine {
    /// A book snapshot or update, as the venue sent it (levels absolute; quantity 0 removes).
    Book {
        time_ns: i64,
        conn: u64,
        /// The venue's instrument name (`BTC-USDT`, `BTCUSDT`, `BTC/USD`).
        symbol: String,
        snapshot: bool,
        /// The venue's sequence fields where it has them (OKX `seqId`/`prevSeqId`, Bybit `u`,
        /// Coinbase `sequence_num`) and Bybit's cross sequence.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seq: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        prev_seq: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cross_seq: Option<u64>,
        /// The venue's checksum of the book after this message (OKX, Kraken).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        checksum: Option<u32>,
        /// The venue's time of the message, ms, where it sends one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        venue_time_ms: Option<i64>,
        bids: Vec<Level>,
        asks: Vec<Level>,
    },
    /// Trades of one instrument.
    Trade { time_ns: i64, conn: u64, symbol: String, trades: Vec<Trade> },
    /// A candle the venue pushed (`closed` where it says).
    Candle {
        time_ns: i64,
        conn: u64,
        symbol: String,
        minutes: u32,
        candle: Candle,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        closed: Option<bool>,
    },
    /// The venue's best bid and ask.
    Ticker {
        time_ns: i64,
        conn: u64,
        symbol: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bid: Option<Level>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ask: Option<Level>,
    },
    /// A WebSocket connection opened (`detail`: its URL) or ended (why).
    Connection { time_ns: i64, conn: u64, event: ConnectionEvent, detail: String },
    /// A REST request millrace sent and the status of its answer (the body is in the
    /// recording; `millrace replay recording` reads it).
    Rest { time_ns: i64, conn: u64, request: String, status: u16, bytes: u64 },
    /// A received frame the venue's reader refused.
    Error { time_ns: i64, conn: u64, error: String },
}

impl ReplayLine {
    /// When millrace received it (Unix ns).
    pub fn time_ns(&self) -> i64 {
        match self {
            ReplayLine::Book { time_ns, .. }
            | ReplayLine::Trade { time_ns, .. }
            | ReplayLine::Candle { time_ns, .. }
            | ReplayLine::Ticker { time_ns, .. }
            | ReplayLine::Connection { time_ns, .. }
            | ReplayLine::Rest { time_ns, .. }
            | ReplayLine::Error { time_ns, .. } => *time_ns,
        }
    }

    /// The recorded connection it came on.
    pub fn conn_mut(&mut self) -> &mut u64 {
        match self {
            ReplayLine::Book { conn, .. }
            | ReplayLine::Trade { conn, .. }
            | ReplayLine::Candle { conn, .. }
            | ReplayLine::Ticker { conn, .. }
            | ReplayLine::Connection { conn, .. }
            | ReplayLine::Rest { conn, .. }
            | ReplayLine::Error { conn, .. } => conn,
        }
    }

    /// The channel it belongs to (one of [`CHANNELS`], or `error`, which is always sent).
    pub fn channel(&self) -> &'static str {
        match self {
            ReplayLine::Book { .. } => "book",
            ReplayLine::Trade { .. } => "trade",
            ReplayLine::Candle { .. } => "candle",
            ReplayLine::Ticker { .. } => "ticker",
            ReplayLine::Connection { .. } => "connection",
            ReplayLine::Rest { .. } => "rest",
            ReplayLine::Error { .. } => "error",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConnectionEvent {
    Connected,
    Closed,
}
