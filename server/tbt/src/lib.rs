//! `tbt`: the tick-by-tick (order-by-order) protocol of millrace's simulated exchange, both
//! ends' types and the consumer's client.
//!
//! - [`wire`]: the compact binary frame format of the simulator's feed (encode + decode).
//! - [`feed`]: [`feed::TbtFeed`], the network client of the simulator's feed (`/tbt/ws` plus the
//!   REST snapshot and replay), reconnecting with back-off.
//! - the JSON bodies both sides exchange ([`Hello`], [`TbtSnapshot`], [`TrueBook`],
//!   [`TbtStatus`], [`Control`]), defined here once.
//!
//! The producer side (the generator with its true books) is the `sim` crate's `tbt` module; the
//! Shanghai files are read by the `replay` crate and replayed as the same [`FeedEvent`]s by the
//! server's tick-by-tick books.
//!
//! ## Sequencing
//! Every event carries `(channel, seq)`. The simulator publishes **one channel per symbol**
//! (`channel = 1000 + symbol index`), so per-channel and per-symbol sequence numbers coincide and
//! are contiguous from 1: a consumer checks continuity with `SeqPolicy::Contiguous` and a missing
//! number is a real loss. The Shanghai files carry several stocks per channel, so there a symbol's
//! numbers have holes (use `SeqPolicy::Increasing`).

pub mod feed;
pub mod wire;

use serde::{Deserialize, Serialize};
use shared::l3::{Msg, Order, OrderId, Venue};
use shared::{Level, Price, Qty, Side};

/// One tick-by-tick message of one symbol, as the sources deliver it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeedEvent {
    /// Index into the source's symbol list ([`TbtSymbol::idx`]).
    pub symbol: u32,
    pub channel: u32,
    /// The channel's sequence number.
    pub seq: u64,
    pub msg: Msg,
}

/// (De)serialises a [`Venue`] as `"sse"`, `"szse"`, `"lobster"` (`shared` only serialises it).
pub mod venue_serde {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use shared::l3::Venue;

    pub fn serialize<S: Serializer>(v: &Venue, s: S) -> Result<S::Ok, S::Error> {
        v.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Venue, D::Error> {
        let s = String::deserialize(d)?;
        parse(&s).ok_or_else(|| serde::de::Error::custom(format!("unknown venue {s:?}")))
    }

    pub fn parse(s: &str) -> Option<Venue> {
        match s {
            "sse" => Some(Venue::Sse),
            "szse" => Some(Venue::Szse),
            "lobster" => Some(Venue::Lobster),
            _ => None,
        }
    }
}

/// One symbol of a source: the first text frame of `/tbt/ws` lists them (`{"symbols":[..]}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TbtSymbol {
    pub idx: u32,
    pub symbol: String,
    #[serde(with = "venue_serde")]
    pub venue: Venue,
    pub channel: u32,
}

/// The first frame of a `/tbt/ws` session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub symbols: Vec<TbtSymbol>,
}

/// `GET /tbt/snapshot?symbol=X`: every resting order of the symbol and the last sequence number
/// of its channel(s) the orders reflect, taken atomically.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TbtSnapshot {
    pub symbol: String,
    pub idx: u32,
    #[serde(with = "venue_serde")]
    pub venue: Venue,
    /// `(channel, last seq)`: apply stream events with a higher seq on top of the orders.
    pub channel_last_seq: Vec<(u32, u64)>,
    /// `[id, side, price, qty]` on the wire.
    #[serde(with = "orders_serde")]
    pub orders: Vec<(OrderId, Order)>,
}

mod orders_serde {
    use super::*;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[(OrderId, Order)], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|(id, o)| (*id, o.side, o.price, o.qty)))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(OrderId, Order)>, D::Error> {
        let v = Vec::<(OrderId, Side, Price, Qty)>::deserialize(d)?;
        Ok(v.into_iter().map(|(id, side, price, qty)| (id, Order { side, price, qty })).collect())
    }
}

/// `GET /tbt/book?symbol=X&levels=N`: the simulator's true aggregated book and the seq it
/// reflects (the oracle), best first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrueBook {
    pub symbol: String,
    pub seq: u64,
    pub bids: Vec<Level>,
    pub asks: Vec<Level>,
}

/// One symbol in `GET /tbt/status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SymbolStatus {
    pub idx: u32,
    pub symbol: String,
    #[serde(with = "venue_serde")]
    pub venue: Venue,
    pub channel: u32,
    /// Configured messages per second (base rate, times the hot-spot factor when hot).
    pub rate: f64,
    pub hot: bool,
    /// Last sequence number generated.
    pub seq: u64,
    /// Events still to be skipped on the wire (a `drop` fault in progress).
    pub dropping: u64,
    /// Events skipped on the wire so far.
    pub dropped: u64,
}

/// `GET /tbt/status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TbtStatus {
    pub paused: bool,
    /// Connected `/tbt/ws` clients.
    pub clients: usize,
    /// Clients disconnected for falling behind, so far.
    pub lagging_drops: u64,
    /// Messages kept per symbol for `/tbt/replay` (a ring: full once a symbol's `seq` reaches it).
    #[serde(default)]
    pub history: usize,
    pub symbols: Vec<SymbolStatus>,
}

/// `POST /tbt/control` bodies: `{"hotspot":{"symbol":"600000","hot":true}}`, `{"pause":true}`,
/// `{"drop":{"symbol":"000001","count":5}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Control {
    Hotspot { symbol: String, hot: bool },
    Pause(bool),
    Drop { symbol: String, count: u64 },
}

/// Microseconds since the Unix epoch, for frame timestamps (latency measurement only).
pub fn wall_clock_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}
