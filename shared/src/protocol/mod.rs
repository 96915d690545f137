//! The browser wire protocol: what crosses `GET /ws` and the REST API between millrace and its
//! own clients. JSON via serde; prices and quantities are decimal strings, never floats.
//!
//! ## Names
//! - instrument: `exchange:market:SYMBOL`, e.g. `sim:spot:BTC/USDT`, `binance:futures:ETH/USDT`
//! - series: `exchange:market:SYMBOL:tf`, e.g. `sim:spot:BTC/USDT:1m`
//! - streams: `kline@{series}`, `depth@{instrument},{levels}`, `depth_update@{instrument}`,
//!   and `heartbeat` (server liveness, once a second).
//!
//! ## Messages
//! Client -> server: `{"method":"SUBSCRIBE","params":["kline@sim:spot:BTC/USDT:5m"],"id":1}`
//! (also `UNSUBSCRIBE`). Server -> client: a reply `{"id":1,"result":null}` or
//! `{"id":1,"error":{"code":"unknown_series","msg":"..."}}`, and pushes
//! `{"stream":"...","data":{...}}` whose `data` is a [`KlineEvent`], [`DepthUpdateEvent`],
//! [`DepthSnapshotEvent`] or [`Heartbeat`], depending on the stream; a client reads either as a
//! [`ServerFrame`], its push's data typed in one pass ([`frame`]). A subscription the server
//! ends unasked is told by a reply with id 0 naming it:
//! `{"id":0,"stream":"...","error":{"code":"preempted","msg":"..."}}`.

use core::fmt;
use core::str::FromStr;

use serde::{Deserialize, Serialize};

pub mod frame;
pub mod ops;
pub mod replay;

pub use frame::{PushData, ServerFrame};

use crate::book::Level;
use crate::candle::Timeframe;
use crate::fixed::{Price, Volume};

/// A malformed instrument, series or stream name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("instrument {0:?} must look like exchange:market:BASE/QUOTE (e.g. sim:spot:BTC/USDT)")]
    Instrument(String),
    #[error(
        "series {0:?} must look like exchange:market:BASE/QUOTE:tf (e.g. sim:spot:BTC/USDT:1m)"
    )]
    Series(String),
    #[error("unknown timeframe {0:?} in series")]
    Timeframe(String),
    #[error("stream {0:?} must be kline@SERIES, depth@INSTRUMENT,LEVELS, depth_update@INSTRUMENT, trade@INSTRUMENT or heartbeat")]
    Stream(String),
    #[error("depth levels in {0:?} must be one of 5, 10, 20, 50, 100, 500, 1000")]
    Levels(String),
}

/// The kind of market an instrument trades on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Market {
    Spot,
    /// USD-margined perpetual futures (Binance USD-M).
    Futures,
    /// Exchange-listed equities (tick-by-tick sources).
    Stock,
}

impl Market {
    pub fn as_str(self) -> &'static str {
        match self {
            Market::Spot => "spot",
            Market::Futures => "futures",
            Market::Stock => "stock",
        }
    }
}

impl FromStr for Market {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "spot" => Ok(Market::Spot),
            "futures" => Ok(Market::Futures),
            "stock" => Ok(Market::Stock),
            _ => Err(()),
        }
    }
}

fn valid_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

/// `exchange:market:SYMBOL`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstrumentId {
    /// Source name from configuration: `sim`, `binance`, `sse`, ...
    pub exchange: String,
    pub market: Market,
    /// `BASE/QUOTE` for crypto pairs, the security code for stocks (`600536`).
    pub symbol: String,
}

impl InstrumentId {
    pub fn new(exchange: impl Into<String>, market: Market, symbol: impl Into<String>) -> Self {
        Self { exchange: exchange.into(), market, symbol: symbol.into() }
    }
}

impl fmt::Display for InstrumentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.exchange, self.market.as_str(), self.symbol)
    }
}

impl FromStr for InstrumentId {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, NameError> {
        let bad = || NameError::Instrument(s.to_string());
        let mut parts = s.split(':');
        let (Some(exchange), Some(market), Some(symbol), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let market: Market = market.parse().map_err(|_| bad())?;
        let symbol_ok = match symbol.split_once('/') {
            Some((base, quote)) => valid_token(base) && valid_token(quote),
            None => market == Market::Stock && valid_token(symbol),
        };
        if !valid_token(exchange) || !symbol_ok {
            return Err(bad());
        }
        Ok(Self::new(exchange, market, symbol))
    }
}

/// `exchange:market:SYMBOL:tf`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeriesId {
    pub instrument: InstrumentId,
    pub timeframe: Timeframe,
}

impl fmt::Display for SeriesId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.instrument, self.timeframe)
    }
}

impl FromStr for SeriesId {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, NameError> {
        let (inst, tf) = s.rsplit_once(':').ok_or_else(|| NameError::Series(s.to_string()))?;
        let instrument = inst.parse().map_err(|_| NameError::Series(s.to_string()))?;
        let timeframe = tf.parse().map_err(|_| NameError::Timeframe(tf.to_string()))?;
        Ok(Self { instrument, timeframe })
    }
}

macro_rules! serde_via_string {
    ($t:ty) => {
        impl Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}
serde_via_string!(InstrumentId);
serde_via_string!(SeriesId);
serde_via_string!(Stream);

/// Depth snapshot sizes a client may ask for.
pub const DEPTH_LEVELS: [u16; 7] = [5, 10, 20, 50, 100, 500, 1000];

/// A subscribable stream.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stream {
    /// `kline@{series}`: forming and closed candles of one series.
    Kline(SeriesId),
    /// `depth@{instrument},{levels}`: throttled full snapshots of the top `levels`.
    Depth { instrument: InstrumentId, levels: u16 },
    /// `depth_update@{instrument}`: throttled deltas with `U`/`u` and a checksum.
    DepthUpdate(InstrumentId),
    /// `trade@{instrument}`: the venue's trades, in batches as they arrive ([`TradesEvent`]).
    Trade(InstrumentId),
    /// `heartbeat`: server liveness.
    Heartbeat,
}

impl fmt::Display for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stream::Kline(s) => write!(f, "kline@{s}"),
            Stream::Depth { instrument, levels } => write!(f, "depth@{instrument},{levels}"),
            Stream::DepthUpdate(i) => write!(f, "depth_update@{i}"),
            Stream::Trade(i) => write!(f, "trade@{i}"),
            Stream::Heartbeat => f.write_str("heartbeat"),
        }
    }
}

impl FromStr for Stream {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, NameError> {
        if s == "heartbeat" {
            return Ok(Stream::Heartbeat);
        }
        let (kind, rest) = s.split_once('@').ok_or_else(|| NameError::Stream(s.to_string()))?;
        match kind {
            "kline" => Ok(Stream::Kline(rest.parse()?)),
            "depth_update" => Ok(Stream::DepthUpdate(rest.parse()?)),
            "trade" => Ok(Stream::Trade(rest.parse()?)),
            "depth" => {
                let (inst, levels) =
                    rest.split_once(',').ok_or_else(|| NameError::Levels(s.to_string()))?;
                let levels: u16 = levels.parse().map_err(|_| NameError::Levels(s.to_string()))?;
                if !DEPTH_LEVELS.contains(&levels) {
                    return Err(NameError::Levels(s.to_string()));
                }
                Ok(Stream::Depth { instrument: inst.parse()?, levels })
            }
            _ => Err(NameError::Stream(s.to_string())),
        }
    }
}

/// Client request methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Method {
    Subscribe,
    Unsubscribe,
}

/// A client request. `params` are stream names, kept as strings so one bad name is answered
/// with a precise error instead of failing the whole frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientRequest {
    pub method: Method,
    #[serde(default)]
    pub params: Vec<String>,
    pub id: u64,
}

/// Machine-readable error codes sent to clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The frame was not a valid request.
    Malformed,
    /// A stream name could not be parsed.
    BadStream,
    /// The series or instrument is not offered by any source.
    UnknownSeries,
    /// The server cannot take another on-demand job and none is idle to evict.
    CapacityExhausted,
    /// This connection has as many subscriptions as it may have.
    TooManySubscriptions,
    /// The frame exceeded the maximum message size.
    TooLarge,
    /// The client fell too far behind and its stream was reset or dropped.
    Lagging,
    /// The request needs an admin token.
    Unauthorized,
    /// Anything else; the message says what.
    Internal,
    /// REST: nothing of that name exists (e.g. no job for the instrument).
    NotFound,
    /// REST: no order book of that instrument.
    UnknownBook,
    /// REST: a short name that names several things; use the full id.
    Ambiguous,
    /// REST: a migration target that is not a shard id or -1.
    BadTarget,
    /// REST: the engine refused the migration (same shard, shard limit).
    MigrateRefused,
    /// REST: a simulator control asked of a book that does not come from a simulator.
    NotSimulated,
    /// REST: the simulator refused or did not answer.
    SimulatorError,
    /// HTTP: this address holds as many connections as it may.
    TooManyConnections,
    /// HTTP: a web page of this origin may not open the WebSocket (`server.allowed_origins`).
    OriginNotAllowed,
    /// HTTP: the request names this server by a host it does not answer to
    /// (`server.allowed_hosts`).
    HostNotAllowed,
    /// WebSocket: the request would start more ingest jobs than this connection or address may
    /// start now (`limits.max_job_starts_per_min_per_*`); nothing was subscribed.
    TooManyJobStarts,
    /// REST: a part of the cluster the answer needs (the leading supervisor) did not answer.
    Unavailable,
    /// REST: in a cluster, another node does this (backfill runs on the node holding the
    /// persister lease).
    OtherNode,
    /// REST: too many failed admin attempts from this address; try again later
    /// (`limits.max_admin_failures_per_min_per_ip`).
    TooManyAttempts,
    /// REST: the request's body did not arrive in time (`limits.body_timeout_ms`).
    Timeout,
    /// WebSocket, unasked (a [`Reply`] with id 0 naming the `stream`): the stream's job was
    /// stopped at full capacity to give another client address its fair share of on-demand
    /// jobs; the subscription is gone and may be asked for again later.
    Preempted,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: ErrorCode,
    pub msg: String,
}

/// Reply to a [`ClientRequest`]: `{"id":N,"result":null}` on success,
/// `{"id":N,"error":{"code":..,"msg":..}}` on failure. The server also sends one unasked, with
/// id 0 and the `stream` it is about, when a subscription ends without the client asking
/// (`{"id":0,"stream":"kline@…","error":{"code":"preempted","msg":..}}`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Reply {
    pub id: u64,
    #[serde(default)]
    pub error: Option<ErrorBody>,
    /// The stream an unasked reply is about (`None` in answers to requests).
    #[serde(default)]
    pub stream: Option<Stream>,
}

impl Serialize for Reply {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(2 + usize::from(self.stream.is_some())))?;
        m.serialize_entry("id", &self.id)?;
        if let Some(stream) = &self.stream {
            m.serialize_entry("stream", stream)?;
        }
        match &self.error {
            None => m.serialize_entry("result", &())?,
            Some(e) => m.serialize_entry("error", e)?,
        }
        m.end()
    }
}

impl Reply {
    pub fn ok(id: u64) -> Self {
        Self { id, error: None, stream: None }
    }
    pub fn error(id: u64, code: ErrorCode, msg: impl Into<String>) -> Self {
        Self { id, error: Some(ErrorBody { code, msg: msg.into() }), stream: None }
    }
    /// An unasked reply (id 0): `stream` ended for the reason `code` says.
    pub fn stream_ended(stream: Stream, code: ErrorCode, msg: impl Into<String>) -> Self {
        Self { id: 0, error: Some(ErrorBody { code, msg: msg.into() }), stream: Some(stream) }
    }
    pub fn is_ok(&self) -> bool {
        self.error.is_none()
    }
}

/// A pushed stream message: `{"stream":"...","data":{...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Push<T> {
    pub stream: Stream,
    pub data: T,
}

/// Server liveness, pushed on `heartbeat` once a second.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// Increments by one per heartbeat since the server started.
    pub seq: u64,
    /// Server wall-clock time, ms since the Unix epoch.
    pub server_time_ms: i64,
    /// The server's version.
    pub version: String,
}

/// Binance-shaped kline payload on `kline@{series}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KlineEvent {
    /// Always `"kline"`.
    pub e: String,
    /// Event time, ms.
    #[serde(rename = "E")]
    pub event_time: i64,
    /// The series id.
    pub s: SeriesId,
    pub k: KlinePayload,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KlinePayload {
    /// Open time, ms.
    pub t: i64,
    /// Close time, ms (open time + duration - 1).
    #[serde(rename = "T")]
    pub close_time: i64,
    /// Timeframe.
    pub i: Timeframe,
    pub o: Price,
    pub h: Price,
    pub l: Price,
    pub c: Price,
    pub v: Volume,
    /// Number of trades.
    pub n: u64,
    /// Closed (final) candle?
    pub x: bool,
}

/// Delta on `depth_update@{instrument}`: the levels that changed between update ids `U` and `u`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DepthUpdateEvent {
    /// Always `"depthUpdate"`.
    pub e: String,
    #[serde(rename = "E")]
    pub event_time: i64,
    pub s: InstrumentId,
    /// First update id in this event.
    #[serde(rename = "U")]
    pub first_id: u64,
    /// Last update id in this event.
    pub u: u64,
    /// Last update id of the previous event on this stream.
    pub pu: u64,
    pub b: Vec<Level>,
    pub a: Vec<Level>,
    /// CRC-32 of the top [`CHECKSUM_LEVELS`](crate::book::CHECKSUM_LEVELS) levels after applying
    /// this event
    /// (see [`OrderBook::checksum`](crate::book::OrderBook::checksum)).
    pub cs: u32,
}

/// Trades on `trade@{instrument}`, oldest first: what the venue reported since the last push
/// (ids as the venue numbers them; `taker` the side that took liquidity, where the venue says).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TradesEvent {
    pub s: InstrumentId,
    pub trades: Vec<crate::trade::Trade>,
}

/// Snapshot on `depth@{instrument},{levels}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DepthSnapshotEvent {
    #[serde(rename = "E")]
    pub event_time: i64,
    pub s: InstrumentId,
    /// Update id the snapshot reflects.
    pub u: u64,
    pub bids: Vec<Level>,
    pub asks: Vec<Level>,
}

/// Body of `GET /fapi/v1/depth?symbol=...&with_id=true`:
/// `{"code":0,"data":{...},"health":"synced"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestDepthResponse {
    pub code: i32,
    pub data: RestDepth,
    /// Whether the book is being kept up to date right now: anything but `synced` /
    /// `snapshot_mode` means it is consistent with the deltas already sent, but old.
    pub health: BookHealth,
}

/// How trustworthy a published book is right now (what its producer reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BookHealth {
    /// In sync with its source: published.
    Synced,
    /// Synced from full snapshots only (Binance `depth20` fallback while REST snapshots fail):
    /// published, but only the snapshot's depth is known.
    SnapshotMode,
    /// Waiting for a snapshot or a bridging event after a gap / reconnect: not published.
    #[default]
    Resyncing,
    /// A sequence gap the producer has not recovered from, or no producer: not published.
    Stale,
}

impl BookHealth {
    /// Whether a book in this state is sent to clients.
    pub fn is_publishable(self) -> bool {
        matches!(self, BookHealth::Synced | BookHealth::SnapshotMode)
    }
}

/// What a book's producer reports with every publish: its health and its counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BookStatus {
    pub health: BookHealth,
    /// Sequence / update-id gaps seen upstream.
    pub gaps: u64,
    /// Times the book was rebuilt from a snapshot after it was once synced.
    pub resyncs: u64,
    /// Periodic verifications that found the book different from a fresh snapshot.
    pub drift: u64,
    /// Periodic verifications done.
    pub verifications: u64,
    /// Upstream events applied.
    pub events: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestDepth {
    /// Update id the snapshot reflects.
    pub id: u64,
    pub bids: Vec<Level>,
    pub asks: Vec<Level>,
}

impl From<&KlinePayload> for crate::candle::Candle {
    fn from(k: &KlinePayload) -> Self {
        crate::candle::Candle::one_minute(k.t, k.o, k.h, k.l, k.c, k.v, k.n)
    }
}

impl From<&DepthUpdateEvent> for crate::sync::DepthDelta {
    fn from(e: &DepthUpdateEvent) -> Self {
        crate::sync::DepthDelta {
            first_id: e.first_id,
            last_id: e.u,
            prev_last_id: Some(e.pu),
            bids: e.b.clone(),
            asks: e.a.clone(),
            checksum: Some(e.cs),
        }
    }
}

impl From<&RestDepth> for crate::sync::DepthSnapshot {
    fn from(r: &RestDepth) -> Self {
        crate::sync::DepthSnapshot {
            last_update_id: r.id,
            bids: r.bids.clone(),
            asks: r.asks.clone(),
        }
    }
}

impl From<&DepthSnapshotEvent> for crate::sync::DepthSnapshot {
    fn from(r: &DepthSnapshotEvent) -> Self {
        crate::sync::DepthSnapshot {
            last_update_id: r.u,
            bids: r.bids.clone(),
            asks: r.asks.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;

    #[test]
    fn names_round_trip() {
        for s in [
            "kline@sim:spot:BTC/USDT:1m",
            "kline@binance:futures:ETH/USDT:4h",
            "depth@sim:spot:BTC/USDT,20",
            "depth_update@sse:stock:600536",
            "heartbeat",
        ] {
            let stream: Stream = s.parse().unwrap();
            assert_eq!(stream.to_string(), s);
        }
        let series: SeriesId = "sim:spot:BTC/USDT:5m".parse().unwrap();
        assert_eq!(series.instrument.symbol, "BTC/USDT");
        assert_eq!(series.timeframe.to_string(), "5m");
    }

    #[test]
    fn bad_names_say_what_is_wrong() {
        assert!(matches!(
            "kline@sim:spot:BTC/USDT:7m".parse::<Stream>(),
            Err(NameError::Timeframe(_))
        ));
        assert!(matches!("depth@sim:spot:BTC/USDT,7".parse::<Stream>(), Err(NameError::Levels(_))));
        assert!(matches!("depth@sim:spot:BTC/USDT".parse::<Stream>(), Err(NameError::Levels(_))));
        assert!(matches!("trades@x".parse::<Stream>(), Err(NameError::Stream(_))));
        assert!(matches!(
            "sim:spot:BTCUSDT".parse::<InstrumentId>(),
            Err(NameError::Instrument(_))
        ));
        assert!(matches!(
            "sim:margin:BTC/USDT".parse::<InstrumentId>(),
            Err(NameError::Instrument(_))
        ));
        assert!(matches!("sim:spot:BTC/USDT:x:1m".parse::<SeriesId>(), Err(NameError::Series(_))));
        assert!("sse:stock:600536".parse::<InstrumentId>().is_ok());
        assert!(NameError::Levels("x".into()).to_string().contains("1000"));
    }

    #[test]
    fn request_and_replies_match_the_documented_json() {
        let req: ClientRequest = serde_json::from_str(
            r#"{"method":"SUBSCRIBE","params":["kline@sim:spot:BTC/USDT:5m"],"id":1}"#,
        )
        .unwrap();
        assert_eq!(req.method, Method::Subscribe);
        assert_eq!(serde_json::to_string(&Reply::ok(1)).unwrap(), r#"{"id":1,"result":null}"#);
        assert_eq!(
            serde_json::to_string(&Reply::error(2, ErrorCode::CapacityExhausted, "full")).unwrap(),
            r#"{"id":2,"error":{"code":"capacity_exhausted","msg":"full"}}"#
        );
        let frame: ServerFrame = serde_json::from_str(r#"{"id":1,"result":null}"#).unwrap();
        assert!(matches!(frame, ServerFrame::Reply(r) if r.is_ok()));
        let frame: ServerFrame =
            serde_json::from_str(r#"{"id":3,"error":{"code":"malformed","msg":"x"}}"#).unwrap();
        assert!(matches!(frame, ServerFrame::Reply(r) if !r.is_ok()));
        let frame: ServerFrame = serde_json::from_str(
            r#"{"stream":"heartbeat","data":{"seq":1,"server_time_ms":5,"version":"0"}}"#,
        )
        .unwrap();
        assert!(matches!(frame, ServerFrame::Push(p) if p.stream == Stream::Heartbeat));
        // an unasked reply: a stream ended (its job preempted)
        let stream: Stream = "kline@sim:spot:BTC/USDT:1m".parse().unwrap();
        let ended = Reply::stream_ended(stream.clone(), ErrorCode::Preempted, "gone");
        let json = r#"{"id":0,"stream":"kline@sim:spot:BTC/USDT:1m","error":{"code":"preempted","msg":"gone"}}"#;
        assert_eq!(serde_json::to_string(&ended).unwrap(), json);
        let frame: ServerFrame = serde_json::from_str(json).unwrap();
        assert!(matches!(frame, ServerFrame::Reply(r) if r == ended && r.stream == Some(stream)));
    }

    #[test]
    fn depth_update_json_shape() {
        let json = r#"{"e":"depthUpdate","E":5,"s":"sim:spot:BTC/USDT","U":10,"u":12,"pu":9,"b":[["100.5","1"]],"a":[],"cs":42}"#;
        let ev: DepthUpdateEvent = serde_json::from_str(json).unwrap();
        assert_eq!(ev.first_id, 10);
        assert_eq!(serde_json::to_string(&ev).unwrap(), json);
        let delta = crate::sync::DepthDelta::from(&ev);
        assert_eq!((delta.first_id, delta.last_id, delta.prev_last_id), (10, 12, Some(9)));
    }
}
