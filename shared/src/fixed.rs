//! Fixed-point prices and quantities.
//!
//! Every market value in millrace is an integer count of 10^-8 units ([`SCALE`]). Exchange
//! decimal strings are parsed exactly (no float ever touches them); formatting gives the shortest
//! exact decimal back. Binance publishes at most 8 decimals, the Shanghai and LOBSTER files fewer,
//! so one global scale covers every source and comparisons are plain integer comparisons.
//!
//! Range: `i64` raw values, so a price or a single quantity may be up to ~92 billion units.
//! Sums that can exceed that (candle volume) use [`Volume`], which is `i128`.

use core::fmt;
use core::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Number of decimal places kept.
pub const DECIMALS: u32 = 8;
/// Raw units per whole unit.
pub const SCALE: i64 = 100_000_000;

/// Why a decimal string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseDecimalError {
    #[error("empty number")]
    Empty,
    #[error("invalid character {0:?} in number")]
    InvalidChar(char),
    #[error("more than {DECIMALS} significant decimal places")]
    TooPrecise,
    #[error("number out of range")]
    OutOfRange,
    #[error("negative value where only non-negative is allowed")]
    Negative,
    #[error("tick size must be positive")]
    BadTick,
}

/// Parses a plain decimal string (`-12.345`, `0.35210000`, `7`) into raw units of 10^-8.
/// Extra fractional digits are accepted only when they are zeros.
pub fn parse_raw(s: &str) -> Result<i64, ParseDecimalError> {
    let b = s.as_bytes();
    if b.is_empty() {
        return Err(ParseDecimalError::Empty);
    }
    let (neg, digits) = match b[0] {
        b'-' => (true, &b[1..]),
        b'+' => (false, &b[1..]),
        _ => (false, b),
    };
    if digits.is_empty() {
        return Err(ParseDecimalError::Empty);
    }
    let mut int: i64 = 0;
    let mut frac: i64 = 0;
    let mut frac_digits: u32 = 0;
    let mut seen_dot = false;
    let mut seen_digit = false;
    for &c in digits {
        match c {
            b'0'..=b'9' => {
                seen_digit = true;
                let d = (c - b'0') as i64;
                if seen_dot {
                    if frac_digits < DECIMALS {
                        frac = frac * 10 + d;
                        frac_digits += 1;
                    } else if d != 0 {
                        return Err(ParseDecimalError::TooPrecise);
                    }
                } else {
                    int = int
                        .checked_mul(10)
                        .and_then(|v| v.checked_add(d))
                        .ok_or(ParseDecimalError::OutOfRange)?;
                }
            }
            b'.' if !seen_dot => seen_dot = true,
            other => return Err(ParseDecimalError::InvalidChar(other as char)),
        }
    }
    if !seen_digit {
        return Err(ParseDecimalError::Empty);
    }
    frac *= 10i64.pow(DECIMALS - frac_digits);
    let raw = int
        .checked_mul(SCALE)
        .and_then(|v| v.checked_add(frac))
        .ok_or(ParseDecimalError::OutOfRange)?;
    Ok(if neg { -raw } else { raw })
}

/// Parses a decimal that was printed from a binary float (`15.929999999999999`) and snaps it to
/// the nearest multiple of `tick_raw` (raw units). The digits are read exactly (up to 30
/// significant digits), so the rounding is decided on the printed decimal, never on a float.
pub fn parse_raw_snapped(s: &str, tick_raw: i64) -> Result<i64, ParseDecimalError> {
    if tick_raw <= 0 {
        return Err(ParseDecimalError::BadTick);
    }
    let b = s.as_bytes();
    let (neg, digits) = match b.first() {
        None => return Err(ParseDecimalError::Empty),
        Some(b'-') => (true, &b[1..]),
        Some(b'+') => (false, &b[1..]),
        _ => (false, b),
    };
    // value = mant / 10^exp, exactly.
    let mut mant: i128 = 0;
    let mut exp: u32 = 0;
    let mut seen_dot = false;
    let mut seen_digit = false;
    for &c in digits {
        match c {
            b'0'..=b'9' => {
                seen_digit = true;
                if seen_dot {
                    if exp >= 20 {
                        continue; // beyond 10^-20: cannot change rounding to an 10^-8 tick
                    }
                    exp += 1;
                }
                mant = mant
                    .checked_mul(10)
                    .and_then(|v| v.checked_add((c - b'0') as i128))
                    .ok_or(ParseDecimalError::OutOfRange)?;
            }
            b'.' if !seen_dot => seen_dot = true,
            other => return Err(ParseDecimalError::InvalidChar(other as char)),
        }
    }
    if !seen_digit {
        return Err(ParseDecimalError::Empty);
    }
    // tick in the same 10^-exp scale; work at a common scale of 10^-(max(exp, 8)). Every step is
    // checked: a long integer part (`3402823669209384634633746074332`) must be out of range, not a
    // wrapped, wrong price.
    let scale_exp = exp.max(DECIMALS);
    let mant =
        mant.checked_mul(10i128.pow(scale_exp - exp)).ok_or(ParseDecimalError::OutOfRange)?;
    let tick = (tick_raw as i128)
        .checked_mul(10i128.pow(scale_exp - DECIMALS))
        .ok_or(ParseDecimalError::OutOfRange)?;
    // round half up on the magnitude
    let ticks = mant.checked_add(tick / 2).ok_or(ParseDecimalError::OutOfRange)? / tick;
    let raw = ticks.checked_mul(tick_raw as i128).ok_or(ParseDecimalError::OutOfRange)?;
    let raw = i64::try_from(raw).map_err(|_| ParseDecimalError::OutOfRange)?;
    Ok(if neg { -raw } else { raw })
}

/// Writes `raw` (10^-8 units) as the shortest exact decimal: `7195.24`, `0.0001`, `-3`.
pub fn write_raw(f: &mut impl fmt::Write, raw: i128) -> fmt::Result {
    let scale = SCALE as i128;
    if raw < 0 {
        f.write_char('-')?;
    }
    let abs = raw.unsigned_abs();
    let int = abs / scale as u128;
    let mut frac = (abs % scale as u128) as u64;
    write!(f, "{int}")?;
    if frac != 0 {
        let mut width = DECIMALS as usize;
        while frac % 10 == 0 {
            frac /= 10;
            width -= 1;
        }
        write!(f, ".{frac:0width$}")?;
    }
    Ok(())
}

/// Writes `raw` with exactly `decimals` places (truncating nothing: `decimals` must be at least
/// the value's own precision for an exact result, which the callers guarantee).
pub fn write_raw_fixed(f: &mut impl fmt::Write, raw: i128, decimals: u32) -> fmt::Result {
    let decimals = decimals.min(DECIMALS);
    let scale = SCALE as i128;
    if raw < 0 {
        f.write_char('-')?;
    }
    let abs = raw.unsigned_abs();
    let int = abs / scale as u128;
    let frac = (abs % scale as u128) as u64 / 10u64.pow(DECIMALS - decimals);
    write!(f, "{int}")?;
    if decimals > 0 {
        write!(f, ".{frac:0width$}", width = decimals as usize)?;
    }
    Ok(())
}

macro_rules! fixed_type {
    ($(#[$m:meta])* $name:ident, $raw:ty, signed = $signed:expr) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name(pub $raw);

        impl $name {
            pub const ZERO: Self = Self(0);
            /// Raw units of 10^-8.
            #[inline]
            pub const fn raw(self) -> $raw {
                self.0
            }
            #[inline]
            pub const fn from_raw(raw: $raw) -> Self {
                Self(raw)
            }
            /// A whole number of units. Panics if that is out of range (a programming error:
            /// outside input goes through [`Self::parse`], which returns an error instead).
            pub const fn from_units(units: i64) -> Self {
                match (units as $raw).checked_mul(SCALE as $raw) {
                    Some(raw) => Self(raw),
                    None => panic!("fixed-point value out of range"),
                }
            }
            #[inline]
            pub const fn is_zero(self) -> bool {
                self.0 == 0
            }
            /// Parses an exchange decimal string exactly.
            pub fn parse(s: &str) -> Result<Self, ParseDecimalError> {
                let raw = parse_raw(s)?;
                if !$signed && raw < 0 {
                    return Err(ParseDecimalError::Negative);
                }
                Ok(Self(raw as $raw))
            }
            /// Parses a float-printed decimal and snaps it to the nearest multiple of `tick`.
            pub fn parse_snapped(s: &str, tick: Self) -> Result<Self, ParseDecimalError> {
                let tick = i64::try_from(tick.0).map_err(|_| ParseDecimalError::BadTick)?;
                let raw = parse_raw_snapped(s, tick)?;
                if !$signed && raw < 0 {
                    return Err(ParseDecimalError::Negative);
                }
                Ok(Self(raw as $raw))
            }
            /// Formats with exactly `decimals` places, as exchanges print (`"0.35210000"`).
            pub fn to_string_fixed(self, decimals: u32) -> String {
                let mut s = String::new();
                write_raw_fixed(&mut s, self.0 as i128, decimals).expect("writing to a String");
                s
            }
            #[inline]
            pub fn checked_add(self, o: Self) -> Option<Self> {
                self.0.checked_add(o.0).map(Self)
            }
            #[inline]
            pub fn checked_sub(self, o: Self) -> Option<Self> {
                self.0.checked_sub(o.0).map(Self)
            }
            #[inline]
            pub fn saturating_sub(self, o: Self) -> Self {
                Self(self.0.saturating_sub(o.0))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write_raw(f, self.0 as i128)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self)
            }
        }

        impl FromStr for $name {
            type Err = ParseDecimalError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::parse(s)
            }
        }

        /// Serialised as a decimal string, as exchanges do, so JSON never carries a float.
        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl serde::de::Visitor<'_> for V {
                    type Value = $name;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str("a decimal string")
                    }
                    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<$name, E> {
                        $name::parse(v).map_err(E::custom)
                    }
                }
                d.deserialize_str(V)
            }
        }
    };
}

fixed_type!(
    /// A price in 10^-8 units of the quote currency. May be negative (some futures trade below 0).
    Price, i64, signed = true
);
fixed_type!(
    /// A quantity in 10^-8 units of the base asset. Never negative.
    Qty, i64, signed = false
);
fixed_type!(
    /// A sum of quantities (candle volume), wide enough for a day of any market.
    Volume, i128, signed = false
);

impl Volume {
    #[inline]
    pub fn add_qty(self, q: Qty) -> Self {
        Self(self.0 + q.0 as i128)
    }
}

impl core::ops::Add for Volume {
    type Output = Volume;
    #[inline]
    fn add(self, o: Volume) -> Volume {
        Volume(self.0 + o.0)
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;

    #[test]
    fn parses_exchange_strings_exactly() {
        assert_eq!(Price::parse("0.35210000").unwrap().raw(), 35_210_000);
        assert_eq!(Price::parse("7195.24").unwrap().raw(), 719_524_000_000);
        assert_eq!(Price::parse("-3.5").unwrap().raw(), -350_000_000);
        assert_eq!(Qty::parse("0").unwrap(), Qty::ZERO);
        assert_eq!(Qty::parse("0.00000000").unwrap(), Qty::ZERO);
        assert_eq!(Qty::parse("16792.388165").unwrap().raw(), 1_679_238_816_500);
        assert_eq!(Qty::parse("1.123456780000").unwrap().raw(), 112_345_678);
        assert_eq!(Price::parse(".5").unwrap().raw(), 50_000_000);
        assert_eq!(Price::parse("5.").unwrap().raw(), 500_000_000);
    }

    #[test]
    fn rejects_bad_strings_with_reasons() {
        assert_eq!(Price::parse(""), Err(ParseDecimalError::Empty));
        assert_eq!(Price::parse("-"), Err(ParseDecimalError::Empty));
        assert_eq!(Price::parse("."), Err(ParseDecimalError::Empty));
        assert_eq!(Price::parse("1.2.3"), Err(ParseDecimalError::InvalidChar('.')));
        assert_eq!(Price::parse("1e5"), Err(ParseDecimalError::InvalidChar('e')));
        assert_eq!(Price::parse("abc"), Err(ParseDecimalError::InvalidChar('a')));
        assert_eq!(Price::parse("0.000000001"), Err(ParseDecimalError::TooPrecise));
        assert_eq!(Qty::parse("-1"), Err(ParseDecimalError::Negative));
        assert_eq!(Price::parse("99999999999999999999"), Err(ParseDecimalError::OutOfRange));
        assert_eq!(Price::parse("92233720369"), Err(ParseDecimalError::OutOfRange));
    }

    #[test]
    fn formats_shortest_exact() {
        for s in ["0", "7195.24", "0.0001", "-3", "0.00000001", "123456789.12345678"] {
            assert_eq!(Price::parse(s).unwrap().to_string(), s);
        }
        assert_eq!(Price::parse("0.35210000").unwrap().to_string(), "0.3521");
        assert_eq!(Price::parse("0.3521").unwrap().to_string_fixed(8), "0.35210000");
        assert_eq!(Price::parse("-0.5").unwrap().to_string_fixed(2), "-0.50");
        assert_eq!(Volume(-5).to_string(), "-0.00000005");
    }

    #[test]
    fn snaps_float_printed_prices_to_tick() {
        let tick = Price::parse("0.01").unwrap();
        let p = |s| Price::parse_snapped(s, tick).unwrap().to_string();
        assert_eq!(p("15.929999999999999"), "15.93");
        assert_eq!(p("15.199999999999999"), "15.2");
        assert_eq!(p("14.92"), "14.92");
        assert_eq!(p("14"), "14");
        assert_eq!(p("0.30000000000000004"), "0.3");
        assert_eq!(p("-2.0099999999999998"), "-2.01");
        let milli = Price::parse("0.001").unwrap();
        assert_eq!(Price::parse_snapped("3.1415000000000002", milli).unwrap().to_string(), "3.142");
        assert_eq!(Price::parse_snapped("1", Price::ZERO), Err(ParseDecimalError::BadTick));
        assert_eq!(Price::parse_snapped("1x", tick), Err(ParseDecimalError::InvalidChar('x')));
    }

    /// Issue 15 item 12: a long integer part overflowed the i128 scaling unchecked and came out
    /// as a wrapped, wrong price (`ok:true` in `replay sse`). Every size is now an error.
    #[test]
    fn snapped_overflow_is_an_error_not_a_wrong_price() {
        let tick = Price::parse("0.01").unwrap();
        let oor = Err(ParseDecimalError::OutOfRange);
        for s in [
            "3402823669209384634633746074332",
            "-3402823669209384634633746074332",
            "170141183460469231731687303715884105727",
            "99999999999999999999999999999999999999",
            "1701411834604692317316873037158841057270",
            "92233720369",
            "92233720368.55",
            "17014118346046923173168730371.5884105727",
        ] {
            assert_eq!(Price::parse_snapped(s, tick), oor, "{s}");
        }
        // The largest tick multiple that fits still parses; the rounding step cannot overflow.
        let max_tick = Price::from_raw(i64::MAX);
        assert_eq!(Price::parse_snapped("92233720368.54775807", max_tick), Ok(max_tick));
        assert_eq!(Price::parse_snapped("0", max_tick), Ok(Price::ZERO));
        assert_eq!(
            Price::parse_snapped("92233720368", Price::from_raw(1)),
            Ok(Price::from_raw(9_223_372_036_800_000_000))
        );
        // A Volume tick wider than i64 is refused, not truncated.
        assert_eq!(
            Volume::parse_snapped("1", Volume::from_raw(1 << 64)),
            Err(ParseDecimalError::BadTick)
        );
    }

    #[test]
    fn round_trips_random_values() {
        let mut rng = crate::testkit::Rng::new(7);
        for _ in 0..10_000 {
            let raw = (rng.next_u64() >> 1) as i64 * if rng.below(2) == 0 { 1 } else { -1 };
            let p = Price::from_raw(raw);
            assert_eq!(Price::parse(&p.to_string()).unwrap(), p);
            assert_eq!(Price::parse(&p.to_string_fixed(8)).unwrap(), p);
        }
    }

    #[test]
    fn serde_as_strings() {
        let q = Qty::parse("1.5").unwrap();
        assert_eq!(serde_json::to_string(&q).unwrap(), "\"1.5\"");
        assert_eq!(serde_json::from_str::<Qty>("\"1.50\"").unwrap(), q);
        assert!(serde_json::from_str::<Qty>("\"-1\"").is_err());
        assert!(serde_json::from_str::<Qty>("1.5").is_err());
    }
}
