//! The public market-data wire formats of OKX (v5), Bybit (v5), Coinbase Advanced Trade and
//! Kraken (WebSocket v2, and v1 as archives still hold it), read into `shared`'s types.
//!
//! [`parse`] takes one text frame of a venue's public WebSocket and appends what it says to a
//! `Vec<Message>`: book snapshots and updates ready for [`shared::venue::VenueSync`], trades,
//! candles, tickers, heartbeats, and the venue's acknowledgements and refusals. Everything is
//! untrusted: numbers are read exactly into fixed point (never through a float), a frame has at
//! most [`MAX_LEVELS`] levels and [`MAX_ITEMS`] trades or candles, and anything else is a
//! [`WireError`] naming what was wrong.
//!
//! The same types serve the simulator, which writes each dialect with [`write`], so the frames
//! the service reads in tests are the ones a venue sends.

pub mod bybit;
pub mod coinbase;
pub mod kraken;
pub mod okx;
pub mod rest;
mod time;

pub use time::{parse_rfc3339_ms, write_rfc3339};

use serde_json::value::RawValue;
use shared::book::Level;
use shared::candle::Candle;
use shared::trade::Trade;
use shared::venue::{Dialect, PrintedLevels};
use shared::{Price, Qty};

/// Levels one book frame may carry: Coinbase's `level2` snapshot is the whole book (tens of
/// thousands of levels on its busiest products); 100,000 levels are 1.6 MB of fixed point.
pub const MAX_LEVELS: usize = 100_000;
/// Trades or candles one frame may carry.
pub const MAX_ITEMS: usize = 5_000;

/// One thing a frame said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Book(BookFrame),
    Trades {
        symbol: String,
        trades: Vec<Trade>,
    },
    Candle(CandleFrame),
    Ticker(TickerFrame),
    /// A keep-alive of the venue's (a heartbeat, or the answer to our ping).
    Heartbeat,
    /// The venue accepted a request (a subscription, say).
    Ack {
        detail: String,
    },
    /// The venue refused a request or reported an error; `rate_limited` when it says we asked
    /// too often.
    Refused {
        code: String,
        message: String,
        rate_limited: bool,
    },
    /// A frame of a channel millrace does not read (its channel named).
    Ignored {
        channel: String,
    },
    /// Coinbase's `sequence_num`, counted per connection across all its channels. Pushed
    /// *first* for every frame that carries one, whatever its channel (books, trades,
    /// heartbeats, answers), so the connection sees every number: the caller feeds it to its
    /// [`shared::venue::ConnectionSequence::observe`] before the messages after it, and on a
    /// [`shared::venue::ConnectionVerdict::Gap`] calls [`shared::venue::VenueSync::handle_lost_message`]
    /// on every book of that connection (a message of any of them may have been the lost one).
    Sequence {
        seq: u64,
    },
    /// An instrument's metadata (Kraken's `instrument` channel).
    Instrument(InstrumentFrame),
}

/// An instrument's metadata: the precisions its prices and quantities are printed with, and its
/// tick and lot sizes, where the venue says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstrumentFrame {
    pub symbol: String,
    pub price_decimals: Option<u8>,
    pub qty_decimals: Option<u8>,
    pub tick: Option<Price>,
    pub lot: Option<Qty>,
}

/// A book snapshot or update of one instrument, for [`shared::venue::VenueSync`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BookFrame {
    /// The venue's instrument name (`BTC-USDT`, `BTCUSDT`, `BTC-USD`, `BTC/USD`).
    pub symbol: String,
    /// The channel's depth where the frame names it (Bybit `orderbook.50`, Kraken v1 `book-10`).
    pub depth: Option<usize>,
    pub snapshot: bool,
    pub seq: Option<u64>,
    pub prev_seq: Option<u64>,
    /// Bybit's cross sequence `seq`, comparable with its tickers' `cs`.
    pub cross_seq: Option<u64>,
    pub bids: Vec<Level>,
    pub asks: Vec<Level>,
    pub checksum: Option<u32>,
    pub printed: Option<PrintedLevels>,
    /// The venue's time of the frame, ms since the epoch, where it sends one.
    pub time_ms: Option<i64>,
}

impl BookFrame {
    /// The message [`shared::venue::VenueSync::handle_message`] takes.
    pub fn message(&self) -> shared::venue::BookMessage<'_> {
        shared::venue::BookMessage {
            snapshot: self.snapshot,
            seq: self.seq,
            prev_seq: self.prev_seq,
            bids: &self.bids,
            asks: &self.asks,
            checksum: self.checksum,
            printed: self.printed,
        }
    }
}

/// A 1m candle of a venue's stream (or another interval the frame names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CandleFrame {
    pub symbol: String,
    /// The candle's interval in minutes.
    pub minutes: u32,
    pub candle: Candle,
    /// Whether the venue says the candle is closed (OKX `confirm`, Bybit `confirm`); `None` when
    /// the venue does not say (Kraken, Coinbase: closed when a later one begins).
    pub closed: Option<bool>,
}

/// The venue's own best bid and ask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TickerFrame {
    pub symbol: String,
    pub bid: Option<Level>,
    pub ask: Option<Level>,
    /// Bybit's `cs`: the book's cross sequence this ticker was taken at.
    pub cross_seq: Option<u64>,
    pub time_ms: Option<i64>,
}

/// Why a frame was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("not JSON of the {dialect} format: {detail}")]
    Json { dialect: Dialect, detail: String },
    #[error("{dialect}: bad number {value:?} in {field}: {detail}")]
    Number { dialect: Dialect, field: &'static str, value: String, detail: String },
    #[error("{dialect}: {what} has {count} entries, more than the {max} allowed")]
    TooMany { dialect: Dialect, what: &'static str, count: usize, max: usize },
    #[error("{dialect}: {detail}")]
    Invalid { dialect: Dialect, detail: String },
    #[error("the {0} dialect is read by its own crate")]
    Unsupported(Dialect),
}

/// Reads one text frame of `dialect`'s public WebSocket into `out`.
pub fn parse(dialect: Dialect, frame: &str, out: &mut Vec<Message>) -> Result<(), WireError> {
    match dialect {
        Dialect::Okx => okx::parse(frame, out),
        Dialect::Bybit => bybit::parse(frame, out),
        Dialect::Coinbase => coinbase::parse(frame, out),
        // v2 objects and v1 arrays alike
        Dialect::Kraken => kraken::parse(frame, out),
        Dialect::Binance => Err(WireError::Unsupported(dialect)),
    }
}

pub(crate) fn json_error(dialect: Dialect, e: serde_json::Error) -> WireError {
    WireError::Json { dialect, detail: e.to_string() }
}

pub(crate) fn invalid(dialect: Dialect, detail: impl Into<String>) -> WireError {
    WireError::Invalid { dialect, detail: detail.into() }
}

pub(crate) fn bounded(
    dialect: Dialect,
    what: &'static str,
    count: usize,
    max: usize,
) -> Result<(), WireError> {
    if count > max {
        return Err(WireError::TooMany { dialect, what, count, max });
    }
    Ok(())
}

/// A push's payload, read in the same pass as its envelope when the fields before it (the
/// channel) say what it is: a book's levels then go straight into fixed point, and the payload
/// is not scanned twice (once to skip it as a [`RawValue`], once to read it). Otherwise (another
/// channel, or the payload before the channel) it is kept raw and read once its kind is known.
#[derive(Debug)]
pub(crate) enum Payload<'a, T> {
    Read(T),
    Raw(&'a RawValue),
}

impl<'a, T: serde::Deserialize<'a>> Payload<'a, T> {
    /// The payload read as `T`, whichever way it came.
    pub fn read(self, dialect: Dialect) -> Result<T, WireError> {
        match self {
            Payload::Read(t) => Ok(t),
            Payload::Raw(raw) => {
                serde_json::from_str(raw.get()).map_err(|e| json_error(dialect, e))
            }
        }
    }

    /// The raw payload of a channel that is not read in the envelope's pass.
    pub fn raw(&self, dialect: Dialect) -> Result<&'a RawValue, WireError> {
        match self {
            Payload::Raw(raw) => Ok(raw),
            Payload::Read(_) => Err(invalid(dialect, "a payload read as a book was asked for raw")),
        }
    }

    /// The next map value as a payload: read as `T` when `read_now`, else kept raw; JSON `null`
    /// is no payload.
    pub fn next_value<A: serde::de::MapAccess<'a>>(
        map: &mut A,
        read_now: bool,
    ) -> Result<Option<Self>, A::Error> {
        Ok(if read_now {
            map.next_value::<Option<T>>()?.map(Payload::Read)
        } else {
            map.next_value::<Option<&'a RawValue>>()?.map(Payload::Raw)
        })
    }
}

/// Stores a field read by a hand-written envelope visitor, refusing a second one as a derived
/// `Deserialize` does.
pub(crate) fn set_once<T, E: serde::de::Error>(
    slot: &mut Option<T>,
    value: T,
    field: &'static str,
) -> Result<(), E> {
    if slot.is_some() {
        return Err(E::duplicate_field(field));
    }
    *slot = Some(value);
    Ok(())
}

/// Book levels sent as arrays whose first two entries are the price and quantity strings
/// (`[["8476.98","415","0","13"], …]`: OKX, Bybit, Kraken v1), read in one pass straight into
/// fixed point, with how their strings were printed (levels being deleted left out: they never
/// reach a checksum). At most [`MAX_LEVELS`].
#[derive(Debug, Default)]
pub(crate) struct StrLevels {
    pub levels: Vec<Level>,
    pub printed: PrintedLevels,
}

impl<'de> serde::Deserialize<'de> for StrLevels {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Outer;
        impl<'de> serde::de::Visitor<'de> for Outer {
            type Value = StrLevels;
            fn expecting(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str("a list of [price, quantity, ...] levels")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<StrLevels, A::Error> {
                let mut out = StrLevels::default();
                out.levels.reserve(seq.size_hint().unwrap_or(0).min(MAX_LEVELS));
                while let Some(StrLevel(price, qty)) = seq.next_element()? {
                    if out.levels.len() == MAX_LEVELS {
                        return Err(serde::de::Error::custom(format_args!(
                            "more than {MAX_LEVELS} book levels"
                        )));
                    }
                    let l = Level::new(
                        parse_price(price).map_err(serde::de::Error::custom)?,
                        parse_qty(qty).map_err(serde::de::Error::custom)?,
                    );
                    if !l.qty.is_zero() {
                        out.printed.price.observe(price.as_bytes());
                        out.printed.qty.observe(qty.as_bytes());
                    }
                    out.levels.push(l);
                }
                Ok(out)
            }
        }
        d.deserialize_seq(Outer)
    }
}

/// One `[price, quantity, ...]` level; entries after the second are skipped.
struct StrLevel<'de>(&'de str, &'de str);

impl<'de> serde::Deserialize<'de> for StrLevel<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Inner;
        impl<'de> serde::de::Visitor<'de> for Inner {
            type Value = StrLevel<'de>;
            fn expecting(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str("a [price, quantity, ...] level of strings")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<StrLevel<'de>, A::Error> {
                let missing =
                    || serde::de::Error::custom("a book level needs a price and a quantity");
                let price: &str = seq.next_element()?.ok_or_else(missing)?;
                let qty: &str = seq.next_element()?.ok_or_else(missing)?;
                let mut extra = 0;
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                    extra += 1;
                    if extra > 8 {
                        return Err(serde::de::Error::custom("a book level has too many entries"));
                    }
                }
                Ok(StrLevel(price, qty))
            }
        }
        d.deserialize_seq(Inner)
    }
}

/// A book price: exact, positive.
pub(crate) fn parse_price(s: &str) -> Result<Price, String> {
    match Price::parse(s) {
        Ok(p) if p.raw() > 0 => Ok(p),
        Ok(_) => Err(format!("price {:?} is not positive", clip(s))),
        Err(e) => Err(format!("price {:?}: {e}", clip(s))),
    }
}

/// A book or trade quantity: exact, not negative (zero deletes a level).
pub(crate) fn parse_qty(s: &str) -> Result<Qty, String> {
    Qty::parse(s).map_err(|e| format!("quantity {:?}: {e}", clip(s)))
}

/// At most 40 characters of an outside string, for an error message.
pub(crate) fn clip(s: &str) -> &str {
    match s.char_indices().nth(40) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// An integer sent as a JSON string (`"1597026383085"`).
pub(crate) fn int_str<T: core::str::FromStr>(
    dialect: Dialect,
    field: &'static str,
    s: &str,
) -> Result<T, WireError> {
    s.parse().map_err(|_| WireError::Number {
        dialect,
        field,
        value: s.chars().take(40).collect(),
        detail: "not an integer".into(),
    })
}

/// A candle from a venue's strings, checked (`low <= open, close <= high`, volume not negative).
#[allow(clippy::too_many_arguments)]
pub(crate) fn candle(
    dialect: Dialect,
    open_time: i64,
    minutes: u32,
    [open, high, low, close]: [&str; 4],
    volume: &str,
    trades: u64,
) -> Result<Candle, WireError> {
    let p = |s: &str| parse_price(s).map_err(|e| invalid(dialect, format!("candle {e}")));
    let volume = shared::Volume::parse(volume)
        .map_err(|e| invalid(dialect, format!("candle volume {:?}: {e}", clip(volume))))?;
    let mut c =
        Candle::one_minute(open_time, p(open)?, p(high)?, p(low)?, p(close)?, volume, trades);
    c.minutes = minutes;
    c.check().map_err(|e| invalid(dialect, format!("candle: {e}")))?;
    Ok(c)
}

/// An integer a venue sends as a JSON number or as a string of one (Bybit's `ts` is a number in
/// its field tables and a string in its own reminder), read to an integer with [`Self::get`]
/// so that the error names the field.
#[derive(Debug, Clone)]
pub(crate) enum IntText<'a> {
    Int(i128),
    Text(std::borrow::Cow<'a, str>),
    /// Anything else (a fraction, a boolean), kept for the error message.
    Other(String),
}

impl IntText<'_> {
    /// The integer, or an error naming `field`.
    pub fn get<T: TryFrom<i128>>(
        &self,
        dialect: Dialect,
        field: &'static str,
    ) -> Result<T, WireError> {
        let bad = |value: &str, detail: &str| WireError::Number {
            dialect,
            field,
            value: clip(value).to_string(),
            detail: detail.into(),
        };
        let n = match self {
            IntText::Int(n) => *n,
            IntText::Text(s) => s.parse::<i128>().map_err(|_| bad(s, "not an integer"))?,
            IntText::Other(s) => return Err(bad(s, "not an integer")),
        };
        T::try_from(n).map_err(|_| bad(&n.to_string(), "out of range"))
    }
}

impl<'de: 'a, 'a> serde::Deserialize<'de> for IntText<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = IntText<'de>;
            fn expecting(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str("an integer, or a string of one")
            }
            fn visit_u64<E>(self, v: u64) -> Result<IntText<'de>, E> {
                Ok(IntText::Int(v.into()))
            }
            fn visit_i64<E>(self, v: i64) -> Result<IntText<'de>, E> {
                Ok(IntText::Int(v.into()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<IntText<'de>, E> {
                Ok(IntText::Other(v.to_string()))
            }
            fn visit_bool<E>(self, v: bool) -> Result<IntText<'de>, E> {
                Ok(IntText::Other(v.to_string()))
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<IntText<'de>, E> {
                Ok(IntText::Text(v.into()))
            }
            fn visit_str<E>(self, v: &str) -> Result<IntText<'de>, E> {
                Ok(IntText::Text(clip(v).to_string().into()))
            }
        }
        d.deserialize_any(V)
    }
}

/// A JSON array of at most `MAX` entries, refused while it is read (before the rest of an
/// oversized array is held), its error naming `what` is too long.
#[derive(Debug)]
pub(crate) struct Capped<T, const MAX: usize>(pub Vec<T>);

impl<T, const MAX: usize> Default for Capped<T, MAX> {
    fn default() -> Self {
        Capped(Vec::new())
    }
}

impl<'de, T: serde::Deserialize<'de>, const MAX: usize> serde::Deserialize<'de> for Capped<T, MAX> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T, const MAX: usize>(core::marker::PhantomData<T>);
        impl<'de, T: serde::Deserialize<'de>, const MAX: usize> serde::de::Visitor<'de> for V<T, MAX> {
            type Value = Capped<T, MAX>;
            fn expecting(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                write!(f, "a list of at most {MAX} entries")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Capped<T, MAX>, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(MAX).min(64));
                while let Some(item) = seq.next_element()? {
                    if out.len() == MAX {
                        return Err(serde::de::Error::custom(format_args!(
                            "a list has more than the {MAX} entries allowed"
                        )));
                    }
                    out.push(item);
                }
                Ok(Capped(out))
            }
        }
        d.deserialize_seq(V::<T, MAX>(core::marker::PhantomData))
    }
}
