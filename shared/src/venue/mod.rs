//! The venues millrace syncs books from beside Binance (OKX, Bybit, Coinbase, Kraken): their
//! sequence and checksum rules, sans-IO.
//!
//! Each venue's book stream is a snapshot followed by updates, in one of a few shapes. What
//! differs is how a lost message shows ([`SequenceRule`]) and how the venue lets a client prove
//! its book ([`ChecksumRule`]): OKX and Kraken publish a CRC-32 of their top levels, computed over
//! the decimal strings *as they print them*. A fixed-point book reproduces those strings only
//! when it knows how the venue prints a number ([`NumberFormat`]): given by the instrument's
//! metadata, or learnt from the strings themselves ([`Printed`]). A checksum that cannot be
//! reproduced is counted as unchecked, never passed.
//!
//! [`VenueSync`] is the machine, the same shape as [`crate::sync::BookSync`]: `handle_*` in,
//! [`VenueSync::poll_event`] out (the same [`crate::sync::SyncEvent`]s), the same
//! [`crate::sync::SyncStats`], no clock and no IO. Where it says
//! [`crate::sync::SyncEvent::NeedSnapshot`], the caller resubscribes that book's channel (the
//! venue then sends a fresh snapshot) or takes a REST snapshot where the venue allows it: one
//! book resyncs, never the connection.

pub mod checksum;
mod sync;

pub use sync::{
    differing_between, differing_levels, BookMessage, ConnectionSequence, ConnectionVerdict,
    SideView, VenueSync, VenueSyncConfig,
};

use core::fmt;

use crate::fixed::DECIMALS;

/// The wire dialects millrace speaks, upstream and in its simulator.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Dialect {
    Binance,
    Okx,
    Bybit,
    Coinbase,
    Kraken,
}

impl Dialect {
    pub const ALL: [Dialect; 5] =
        [Dialect::Binance, Dialect::Okx, Dialect::Bybit, Dialect::Coinbase, Dialect::Kraken];

    /// The name in configuration and on the wire: `binance`, `okx`, `bybit`, `coinbase`, `kraken`.
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::Binance => "binance",
            Dialect::Okx => "okx",
            Dialect::Bybit => "bybit",
            Dialect::Coinbase => "coinbase",
            Dialect::Kraken => "kraken",
        }
    }

    /// How this venue's book stream shows a lost message.
    pub fn sequence_rule(self) -> SequenceRule {
        match self {
            Dialect::Binance => SequenceRule::None,
            Dialect::Okx => SequenceRule::Okx,
            Dialect::Bybit => SequenceRule::Bybit,
            Dialect::Coinbase => SequenceRule::Connection,
            Dialect::Kraken => SequenceRule::None,
        }
    }

    /// The checksum this venue's book messages carry.
    pub fn checksum_rule(self) -> ChecksumRule {
        match self {
            Dialect::Okx => ChecksumRule::Okx,
            Dialect::Kraken => ChecksumRule::Kraken,
            Dialect::Binance | Dialect::Bybit | Dialect::Coinbase => ChecksumRule::None,
        }
    }
}

impl fmt::Display for Dialect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl core::str::FromStr for Dialect {
    type Err = UnknownDialect;
    fn from_str(s: &str) -> Result<Self, UnknownDialect> {
        Dialect::ALL.into_iter().find(|d| d.as_str() == s).ok_or_else(|| UnknownDialect(s.into()))
    }
}

/// A dialect name that is none of [`Dialect::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown venue dialect {0:?} (expected binance, okx, bybit, coinbase or kraken)")]
pub struct UnknownDialect(pub String);

/// How a venue's book stream shows that a message was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequenceRule {
    /// OKX `seqId` / `prevSeqId`: the snapshot's `prevSeqId` is -1; each update's `prevSeqId` is
    /// the previous message's `seqId`; `seqId == prevSeqId` with no levels is a heartbeat;
    /// `seqId < prevSeqId` is a reset after maintenance, continued from.
    Okx,
    /// Bybit `u`: one more per message of a topic; `u == 1` is a restarted service (taken as a
    /// snapshot); any snapshot replaces the book.
    Bybit,
    /// Coinbase `sequence_num`: counted per connection across all its channels, so a lost
    /// message is seen by the connection ([`ConnectionSequence`]), which tells each of its books
    /// ([`VenueSync::handle_lost_message`]).
    Connection,
    /// No sequence (Kraken): only the checksum proves the book.
    None,
}

/// The checksum a venue's book messages carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChecksumRule {
    None,
    /// CRC-32 of the top 25 levels, `bidPx:bidSz:askPx:askSz:…`, compared signed.
    Okx,
    /// CRC-32 of the top 10 asks then the top 10 bids, digits only, compared unsigned.
    Kraken,
}

impl ChecksumRule {
    /// Levels of each side the checksum covers.
    pub fn levels(self) -> usize {
        match self {
            ChecksumRule::None => 0,
            ChecksumRule::Okx => checksum::OKX_LEVELS,
            ChecksumRule::Kraken => checksum::KRAKEN_LEVELS,
        }
    }
}

/// How a venue prints a decimal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumberFormat {
    /// The shortest exact decimal: `3366`, `3366.1`, `0.0001` (OKX).
    Shortest,
    /// Exactly this many places: `0.00100000` (Kraken, with the instrument's precision).
    Fixed(u8),
}

impl NumberFormat {
    /// Writes `raw` (10^-8 units) the venue's way; `false` (and nothing written) when the value
    /// has more places than a fixed format prints, so the venue's string cannot be this value.
    /// Digits are written by hand (a checksum writes 20 to 100 numbers per message).
    pub fn write(self, out: &mut String, raw: i64) -> bool {
        let places = match self {
            NumberFormat::Shortest => None,
            NumberFormat::Fixed(d) if u32::from(d) <= DECIMALS => Some(u32::from(d)),
            NumberFormat::Fixed(_) => return false,
        };
        let abs = raw.unsigned_abs();
        let scale = 10u64.pow(DECIMALS);
        let (int, frac) = (abs / scale, abs % scale);
        if let Some(d) = places {
            if frac % 10u64.pow(DECIMALS - d) != 0 {
                return false;
            }
        }
        if raw < 0 {
            out.push('-');
        }
        push_digits(out, int);
        match places {
            None if frac == 0 => {}
            None => {
                let mut frac = frac;
                let mut width = DECIMALS;
                while frac % 10 == 0 {
                    frac /= 10;
                    width -= 1;
                }
                out.push('.');
                push_padded(out, frac, width);
            }
            Some(0) => {}
            Some(d) => {
                out.push('.');
                push_padded(out, frac / 10u64.pow(DECIMALS - d), d);
            }
        }
        true
    }

    /// Kraken's digits of `raw` in this format: the printed number without its `.` and its
    /// leading zeros, which for a fixed format is the value in units of its last place
    /// (`0.00100000` → `100000`, `45285.2` → `452852`, zero → nothing).
    pub(crate) fn write_digits(self, out: &mut String, raw: i64) -> bool {
        let NumberFormat::Fixed(d) = self else {
            let start = out.len();
            if !self.write(out, raw) {
                return false;
            }
            let printed: String = out.split_off(start);
            out.extend(printed.chars().filter(|&c| c != '.').skip_while(|&c| c == '0'));
            return true;
        };
        let d = u32::from(d);
        if d > DECIMALS || raw < 0 {
            return false;
        }
        let unit = 10u64.pow(DECIMALS - d);
        let abs = raw.unsigned_abs();
        if abs % unit != 0 {
            return false;
        }
        if abs != 0 {
            push_digits(out, abs / unit);
        }
        true
    }
}

/// The decimal digits of `v`.
fn push_digits(out: &mut String, v: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    let mut v = v;
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend(buf[i..].iter().map(|&b| char::from(b)));
}

/// `v` in exactly `width` digits, zeros first.
fn push_padded(out: &mut String, v: u64, width: u32) {
    let mut buf = [b'0'; 20];
    let mut i = buf.len();
    let mut v = v;
    for _ in 0..width {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
    }
    out.extend(buf[i..].iter().map(|&b| char::from(b)));
}

/// What a run of a venue's decimal strings says about how it prints them: whether any was
/// padded with trailing zeros (`0.10`), and whether they all had the same number of places.
/// Strings of the shortest form never end their fraction with a zero; strings of a fixed form
/// all have its places. The parser observes each string of a message (those of levels being
/// deleted excepted: they never reach a checksum) and [`VenueSync`] keeps what a book's strings
/// said since its snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Printed {
    padded: bool,
    places: Places,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Places {
    #[default]
    NoneSeen,
    All(u8),
    Differ,
}

impl Places {
    fn merge(self, other: Places) -> Places {
        match (self, other) {
            (Places::NoneSeen, p) | (p, Places::NoneSeen) => p,
            (Places::All(a), Places::All(b)) if a == b => Places::All(a),
            _ => Places::Differ,
        }
    }
}

impl Printed {
    /// Notes one decimal string as it was received (already checked to be a plain decimal).
    #[inline]
    pub fn observe(&mut self, s: &[u8]) {
        let places = match s.iter().position(|&b| b == b'.') {
            Some(dot) => s.len() - dot - 1,
            None => 0,
        };
        self.padded |= places > 0 && s.last() == Some(&b'0');
        let places = Places::All(u8::try_from(places).unwrap_or(u8::MAX));
        self.places = self.places.merge(places);
    }

    /// Everything `other` saw, added to what this saw.
    pub fn merge(&mut self, other: Printed) {
        self.padded |= other.padded;
        self.places = self.places.merge(other.places);
    }

    /// The format every string seen fits: the shortest form when none was padded, the fixed
    /// form of their common places when some were; `None` when they fit neither (padded, with
    /// differing places), so no checksum over them can be reproduced.
    pub fn format(self) -> Option<NumberFormat> {
        if !self.padded {
            return Some(NumberFormat::Shortest);
        }
        match self.places {
            Places::All(d) => Some(NumberFormat::Fixed(d)),
            Places::NoneSeen | Places::Differ => None,
        }
    }
}

/// What one message's price and quantity strings said ([`Printed`]), for a learning book.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrintedLevels {
    pub price: Printed,
    pub qty: Printed,
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;

    fn printed(strings: &[&str]) -> Printed {
        let mut p = Printed::default();
        for s in strings {
            p.observe(s.as_bytes());
        }
        p
    }

    #[test]
    fn the_format_is_learnt_from_the_strings() {
        assert_eq!(printed(&["3366.1", "3366", "0.0001"]).format(), Some(NumberFormat::Shortest));
        assert_eq!(printed(&["0.10", "1.25", "7.00"]).format(), Some(NumberFormat::Fixed(2)));
        assert_eq!(printed(&["0.10", "1.2"]).format(), None);
        assert_eq!(printed(&[]).format(), Some(NumberFormat::Shortest));
        let mut a = printed(&["5541.3"]);
        a.merge(printed(&["5541.0"]));
        assert_eq!(a.format(), Some(NumberFormat::Fixed(1)));
    }

    #[test]
    fn formats_write_what_the_venue_prints() {
        let mut s = String::new();
        assert!(NumberFormat::Fixed(8).write(&mut s, 100_000));
        assert_eq!(s, "0.00100000");
        s.clear();
        assert!(NumberFormat::Shortest.write(&mut s, 336_600_000_000));
        assert_eq!(s, "3366");
        s.clear();
        // 0.123 cannot be printed with two places: the venue's string was something else
        assert!(!NumberFormat::Fixed(2).write(&mut s, 12_300_000));
        assert!(s.is_empty());
    }

    #[test]
    fn numbers_are_written_as_the_fixed_point_display_writes_them() {
        use crate::fixed::{write_raw, write_raw_fixed};
        let mut rng = crate::testkit::Rng::new(7);
        for _ in 0..20_000 {
            let raw = (rng.next_u64() % 10u64.pow(rng.below(17) as u32 + 1)) as i64;
            let raw = if rng.chance(1, 10) { -raw } else { raw };
            let (mut a, mut b) = (String::new(), String::new());
            assert!(NumberFormat::Shortest.write(&mut a, raw));
            write_raw(&mut b, raw as i128).unwrap();
            assert_eq!(a, b, "{raw}");
            let d = rng.below(9) as u8;
            let (mut a, mut b) = (String::new(), String::new());
            let exact = raw % 10i64.pow(8 - u32::from(d)) == 0;
            assert_eq!(NumberFormat::Fixed(d).write(&mut a, raw), exact, "{raw} with {d} places");
            if exact {
                write_raw_fixed(&mut b, raw as i128, u32::from(d)).unwrap();
                assert_eq!(a, b, "{raw} with {d} places");
                // Kraken's digits: the printed number without '.' and leading zeros
                if raw >= 0 {
                    let mut k = String::new();
                    assert!(NumberFormat::Fixed(d).write_digits(&mut k, raw));
                    let want: String =
                        b.chars().filter(|&c| c != '.').skip_while(|&c| c == '0').collect();
                    assert_eq!(k, want, "{raw} with {d} places");
                }
            }
        }
    }

    #[test]
    fn dialects_round_trip_their_names() {
        for d in Dialect::ALL {
            assert_eq!(d.as_str().parse::<Dialect>(), Ok(d));
        }
        assert!("ftx".parse::<Dialect>().is_err());
    }
}
