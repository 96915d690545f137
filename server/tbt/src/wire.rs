//! The binary wire format of the tick-by-tick feed (`/tbt/ws` binary frames and `/tbt/replay`
//! bodies): many events per frame, fixed-size little-endian records, so a frame is decoded by
//! straight offset arithmetic with no allocation per event and no text parsing on the hot path.
//!
//! ## Frame
//! ```text
//! offset size  field
//!      0    2  magic  = b"TB"
//!      2    1  version = 1
//!      3    1  flags   = 0 (reserved; a non-zero value is rejected so it can mean something later)
//!      4    4  count   u32: number of events that follow
//!      8    8  sent_us u64: sender's wall clock when it encoded the frame, µs since the Unix epoch
//!                      (0 = unknown; for latency measurement only, never used for ordering)
//!     16    …  count events, back to back
//! ```
//! ## Event
//! ```text
//!      0    1  kind    1 Add, 2 Cancel, 3 Trade, 4 Execute (shared::l3::Msg variants)
//!      1    1  aux     Add / Cancel / Execute: side (0 bid, 1 ask)
//!                      Trade: kind (0 buy-initiated, 1 sell-initiated, 2 auction, 3 cancel)
//!      2    4  symbol  u32: index into the symbol list the stream started with
//!      6    4  channel u32
//!     10    8  seq     u64: the channel's sequence number
//!     18       body:
//! Add / Cancel / Execute: id u64, price i64, qty i64            (24 bytes -> 42 total)
//! Trade: buy_id u64, sell_id u64, price i64, qty i64            (32 bytes -> 50 total)
//! ```
//! Prices and quantities are the raw `shared::fixed` integers (10^-8 units), so nothing on the wire
//! is a float. A quantity must not be negative. Every violation (short buffer, bad magic, unknown
//! version / kind / side, truncated event, bytes after the last event, negative quantity) is a
//! [`FrameError`]; the decoder never panics and leaves the output untouched on error.

use shared::l3::{Msg, TradeKind};
use shared::{Price, Qty, Side};

use crate::FeedEvent;

/// `b"TB"`.
pub const MAGIC: [u8; 2] = *b"TB";
pub const VERSION: u8 = 1;
/// Bytes of the frame header.
pub const HEADER_LEN: usize = 16;
/// Bytes of the fixed part of every event.
const EVENT_HEAD: usize = 18;
/// Bytes of an Add / Cancel / Execute event.
pub const ORDER_EVENT_LEN: usize = EVENT_HEAD + 24;
/// Bytes of a Trade event.
pub const TRADE_EVENT_LEN: usize = EVENT_HEAD + 32;

const K_ADD: u8 = 1;
const K_CANCEL: u8 = 2;
const K_TRADE: u8 = 3;
const K_EXECUTE: u8 = 4;

/// Why a frame could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {0} bytes is shorter than the {HEADER_LEN}-byte header")]
    Short(usize),
    #[error("bad magic {0:02x?} (expected \"TB\")")]
    Magic([u8; 2]),
    #[error("unsupported wire version {0} (this build speaks {VERSION})")]
    Version(u8),
    #[error("unknown header flags {0:#04x}")]
    Flags(u8),
    #[error("event {index} at byte {offset}: unknown kind {kind}")]
    Kind { index: u32, offset: usize, kind: u8 },
    #[error("event {index} at byte {offset}: bad {what} {value}")]
    Aux { index: u32, offset: usize, what: &'static str, value: u8 },
    #[error("event {index} at byte {offset}: truncated ({need} bytes needed, {have} left)")]
    Truncated { index: u32, offset: usize, need: usize, have: usize },
    #[error("event {index} at byte {offset}: negative quantity {qty}")]
    NegativeQty { index: u32, offset: usize, qty: i64 },
    #[error("{0} bytes after the last of the {1} events the header announces")]
    Trailing(usize, u32),
}

/// The header of a decoded frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub count: u32,
    pub sent_us: u64,
}

/// Encoded size of one event.
pub fn event_len(msg: &Msg) -> usize {
    match msg {
        Msg::Trade { .. } => TRADE_EVENT_LEN,
        _ => ORDER_EVENT_LEN,
    }
}

/// Starts a frame in `out` (cleared first); add events with [`push_event`], then [`finish`].
pub fn begin(out: &mut Vec<u8>, sent_us: u64) {
    out.clear();
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.push(0);
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&sent_us.to_le_bytes());
}

/// Appends one event to a frame started with [`begin`].
pub fn push_event(out: &mut Vec<u8>, e: &FeedEvent) {
    let side = |s: Side| match s {
        Side::Bid => 0u8,
        Side::Ask => 1u8,
    };
    let (kind, aux) = match e.msg {
        Msg::Add { side: s, .. } => (K_ADD, side(s)),
        Msg::Cancel { side: s, .. } => (K_CANCEL, side(s)),
        Msg::Execute { side: s, .. } => (K_EXECUTE, side(s)),
        Msg::Trade { kind, .. } => (
            K_TRADE,
            match kind {
                TradeKind::BuyInitiated => 0,
                TradeKind::SellInitiated => 1,
                TradeKind::Auction => 2,
                TradeKind::Cancel => 3,
            },
        ),
    };
    out.push(kind);
    out.push(aux);
    out.extend_from_slice(&e.symbol.to_le_bytes());
    out.extend_from_slice(&e.channel.to_le_bytes());
    out.extend_from_slice(&e.seq.to_le_bytes());
    match e.msg {
        Msg::Add { id, price, qty, .. }
        | Msg::Cancel { id, price, qty, .. }
        | Msg::Execute { id, price, qty, .. } => {
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&price.raw().to_le_bytes());
            out.extend_from_slice(&qty.raw().to_le_bytes());
        }
        Msg::Trade { buy_id, sell_id, price, qty, .. } => {
            out.extend_from_slice(&buy_id.to_le_bytes());
            out.extend_from_slice(&sell_id.to_le_bytes());
            out.extend_from_slice(&price.raw().to_le_bytes());
            out.extend_from_slice(&qty.raw().to_le_bytes());
        }
    }
}

/// Writes the event count into a frame built with [`begin`] / [`push_event`].
pub fn finish(out: &mut [u8], count: u32) {
    if out.len() >= HEADER_LEN {
        out[4..8].copy_from_slice(&count.to_le_bytes());
    }
}

/// One whole frame holding `events`.
pub fn encode(events: &[FeedEvent], sent_us: u64) -> Vec<u8> {
    let mut out =
        Vec::with_capacity(HEADER_LEN + events.iter().map(|e| event_len(&e.msg)).sum::<usize>());
    begin(&mut out, sent_us);
    for e in events {
        push_event(&mut out, e);
    }
    finish(&mut out, events.len() as u32);
    out
}

#[inline]
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

#[inline]
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Decodes one frame, appending its events to `out`. On error `out` is left as it was.
pub fn decode(buf: &[u8], out: &mut Vec<FeedEvent>) -> Result<FrameHeader, FrameError> {
    let start = out.len();
    let r = decode_into(buf, out);
    if r.is_err() {
        out.truncate(start);
    }
    r
}

fn decode_into(buf: &[u8], out: &mut Vec<FeedEvent>) -> Result<FrameHeader, FrameError> {
    if buf.len() < HEADER_LEN {
        return Err(FrameError::Short(buf.len()));
    }
    if buf[0..2] != MAGIC {
        return Err(FrameError::Magic([buf[0], buf[1]]));
    }
    if buf[2] != VERSION {
        return Err(FrameError::Version(buf[2]));
    }
    if buf[3] != 0 {
        return Err(FrameError::Flags(buf[3]));
    }
    let count = u32_at(buf, 4);
    let sent_us = u64_at(buf, 8);
    // Never trust `count` for an allocation beyond what the bytes can hold.
    out.reserve((count as usize).min((buf.len() - HEADER_LEN) / ORDER_EVENT_LEN));
    let mut at = HEADER_LEN;
    for index in 0..count {
        let have = buf.len() - at;
        if have < EVENT_HEAD {
            return Err(FrameError::Truncated { index, offset: at, need: EVENT_HEAD, have });
        }
        let (kind, aux) = (buf[at], buf[at + 1]);
        let need = match kind {
            K_ADD | K_CANCEL | K_EXECUTE => ORDER_EVENT_LEN,
            K_TRADE => TRADE_EVENT_LEN,
            _ => return Err(FrameError::Kind { index, offset: at, kind }),
        };
        if have < need {
            return Err(FrameError::Truncated { index, offset: at, need, have });
        }
        let symbol = u32_at(buf, at + 2);
        let channel = u32_at(buf, at + 6);
        let seq = u64_at(buf, at + 10);
        let b = at + EVENT_HEAD;
        let side = || match aux {
            0 => Ok(Side::Bid),
            1 => Ok(Side::Ask),
            v => Err(FrameError::Aux { index, offset: at, what: "side", value: v }),
        };
        let qty_at = |o: usize| {
            let q = u64_at(buf, o) as i64;
            if q < 0 {
                Err(FrameError::NegativeQty { index, offset: at, qty: q })
            } else {
                Ok(Qty::from_raw(q))
            }
        };
        let msg = match kind {
            K_TRADE => {
                let kind = match aux {
                    0 => TradeKind::BuyInitiated,
                    1 => TradeKind::SellInitiated,
                    2 => TradeKind::Auction,
                    3 => TradeKind::Cancel,
                    v => {
                        return Err(FrameError::Aux {
                            index,
                            offset: at,
                            what: "trade kind",
                            value: v,
                        })
                    }
                };
                Msg::Trade {
                    buy_id: u64_at(buf, b),
                    sell_id: u64_at(buf, b + 8),
                    price: Price::from_raw(u64_at(buf, b + 16) as i64),
                    qty: qty_at(b + 24)?,
                    kind,
                }
            }
            _ => {
                let (side, id, price, qty) = (
                    side()?,
                    u64_at(buf, b),
                    Price::from_raw(u64_at(buf, b + 8) as i64),
                    qty_at(b + 16)?,
                );
                match kind {
                    K_ADD => Msg::Add { id, side, price, qty },
                    K_CANCEL => Msg::Cancel { id, side, price, qty },
                    _ => Msg::Execute { id, side, price, qty },
                }
            }
        };
        out.push(FeedEvent { symbol, channel, seq, msg });
        at += need;
    }
    if at != buf.len() {
        return Err(FrameError::Trailing(buf.len() - at, count));
    }
    Ok(FrameHeader { count, sent_us })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<FeedEvent> {
        let p = |s: &str| Price::parse(s).unwrap();
        let q = |s: &str| Qty::parse(s).unwrap();
        vec![
            FeedEvent {
                symbol: 0,
                channel: 1000,
                seq: 1,
                msg: Msg::Add { id: 7, side: Side::Bid, price: p("10.01"), qty: q("300") },
            },
            FeedEvent {
                symbol: 1,
                channel: 1001,
                seq: 1,
                msg: Msg::Add { id: 8, side: Side::Ask, price: p("9.99"), qty: q("1000") },
            },
            FeedEvent {
                symbol: 0,
                channel: 1000,
                seq: 2,
                msg: Msg::Trade {
                    buy_id: 7,
                    sell_id: 9,
                    price: p("10.01"),
                    qty: q("100"),
                    kind: TradeKind::SellInitiated,
                },
            },
            FeedEvent {
                symbol: 1,
                channel: 1001,
                seq: 2,
                msg: Msg::Trade {
                    buy_id: 0,
                    sell_id: 8,
                    price: Price::ZERO,
                    qty: q("1000"),
                    kind: TradeKind::Cancel,
                },
            },
            FeedEvent {
                symbol: 0,
                channel: 1000,
                seq: 3,
                msg: Msg::Cancel { id: 7, side: Side::Bid, price: p("10.01"), qty: q("200") },
            },
            FeedEvent {
                symbol: 4,
                channel: u32::MAX,
                seq: u64::MAX,
                msg: Msg::Execute {
                    id: u64::MAX,
                    side: Side::Ask,
                    price: p("-1.5"),
                    qty: q("0.00000001"),
                },
            },
            FeedEvent {
                symbol: 2,
                channel: 6,
                seq: 99,
                msg: Msg::Trade {
                    buy_id: 1,
                    sell_id: 2,
                    price: p("15.93"),
                    qty: q("5"),
                    kind: TradeKind::Auction,
                },
            },
            FeedEvent {
                symbol: 2,
                channel: 6,
                seq: 100,
                msg: Msg::Trade {
                    buy_id: 3,
                    sell_id: 2,
                    price: p("15.94"),
                    qty: q("5"),
                    kind: TradeKind::BuyInitiated,
                },
            },
        ]
    }

    #[test]
    fn round_trip() {
        let ev = sample();
        let buf = encode(&ev, 1_234_567);
        assert_eq!(buf.len(), HEADER_LEN + 4 * ORDER_EVENT_LEN + 4 * TRADE_EVENT_LEN);
        let mut out = vec![ev[0]]; // decode appends
        let h = decode(&buf, &mut out).unwrap();
        assert_eq!(h, FrameHeader { count: 8, sent_us: 1_234_567 });
        assert_eq!(&out[1..], &ev[..]);
        // empty frame
        let empty = encode(&[], 0);
        assert_eq!(decode(&empty, &mut out).unwrap().count, 0);
        assert_eq!(out.len(), 9);
    }

    #[test]
    fn malformed_input_is_an_error_and_leaves_output_alone() {
        let good = encode(&sample(), 5);
        let mut out = Vec::new();
        let mut check = |buf: &[u8], want: &str| {
            let e = decode(buf, &mut out).unwrap_err();
            assert!(e.to_string().contains(want), "{e} !~ {want}");
            assert!(out.is_empty());
        };
        check(&good[..3], "shorter than");
        let mut b = good.clone();
        b[0] = b'X';
        check(&b, "magic");
        let mut b = good.clone();
        b[2] = 9;
        check(&b, "version 9");
        let mut b = good.clone();
        b[3] = 1;
        check(&b, "flags");
        let mut b = good.clone();
        b[HEADER_LEN] = 77;
        check(&b, "unknown kind 77");
        let mut b = good.clone();
        b[HEADER_LEN + 1] = 5;
        check(&b, "bad side 5");
        let mut b = good.clone();
        let third = HEADER_LEN + 2 * ORDER_EVENT_LEN;
        b[third + 1] = 4;
        check(&b, "bad trade kind 4");
        check(&good[..good.len() - 1], "truncated");
        check(&good[..HEADER_LEN + 5], "truncated");
        let mut b = good.clone();
        b.push(0);
        check(&b, "1 bytes after");
        let mut b = good.clone();
        b[4..8].copy_from_slice(&u32::MAX.to_le_bytes()); // absurd count: no huge allocation, an error
        check(&b, "truncated");
        let mut b = good.clone();
        let qty_at = HEADER_LEN + EVENT_HEAD + 16;
        b[qty_at..qty_at + 8].copy_from_slice(&(-5i64).to_le_bytes());
        check(&b, "negative quantity -5");
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut rng = shared::testkit::Rng::new(3);
        let good = encode(&sample(), 1);
        let mut out = Vec::new();
        for _ in 0..20_000 {
            let mut b = good.clone();
            let n = 1 + rng.below(4) as usize;
            for _ in 0..n {
                let i = rng.below(b.len() as u64) as usize;
                b[i] = rng.next_u64() as u8;
            }
            let cut = rng.below(b.len() as u64 + 1) as usize;
            let _ = decode(&b[..cut], &mut out);
            out.clear();
        }
    }
}
