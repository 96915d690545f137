//! `millrace replay lobster`: rebuilds a LOBSTER book from a message file and prints it after
//! every message in LOBSTER's own orderbook layout, so the output can be diffed against the
//! `..._orderbook_N.csv` file LOBSTER ships with the messages.
//!
//! ## Formats (LOBSTER documentation)
//! * LobsterMessage file, no header, one row per event: `time,type,order_id,size,price,direction` —
//!   time in seconds after midnight (decimal), price in dollars x 10000 (integer), direction 1 buy
//!   / -1 sell. Types: 1 submission, 2 partial cancellation, 3 deletion, 4 execution of a visible
//!   order (direction is the *resting* order's side), 5 execution of a hidden order, 6 cross
//!   trade, 7 trading halt (5-7 do not change the visible book).
//! * Orderbook file: row k is the book *after* message k; per level `ask price, ask size,
//!   bid price, bid size`; unoccupied levels are written as ask price 9999999999, bid price
//!   -9999999999, size 0.
//!
//! ## Orders that predate the file
//! A message file starts mid-day, so cancels and executions can name orders it never submitted.
//! The book runs with [`Venue::Lobster`] rules: such a message moves the level at its own price by
//! its size (never below zero; counted). `--initial-book` seeds the levels from the first row of
//! an orderbook file. Because that row is the book after message 1, message 1's own effect is
//! taken out of it first (a submission subtracted, a cancel or execution added back), and then
//! every message, the first included, is replayed; the first printed row therefore equals the
//! seed row.
//!
//! The check fails (exit 1) when a quantity would have gone negative, the book crosses, or a
//! message is malformed for the book (zero size); the counts go to stderr.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context as _;

use shared::l3::{L3Book, Msg, Venue};
use shared::{OrderBook, Price, Qty, Side};

use crate::input::{for_each_line, InputError, Origin};

/// Arguments of `millrace replay lobster`.
#[derive(Debug, Clone, clap::Args)]
pub struct LobsterArgs {
    /// LOBSTER message file (`..._message_N.csv`), plain, .gz or .zip.
    #[arg(long)]
    pub messages: PathBuf,
    /// LOBSTER orderbook file whose first row seeds the book (orders before the message file).
    #[arg(long)]
    pub initial_book: Option<PathBuf>,
    /// Levels per side to print.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..))]
    pub levels: u16,
}

/// LOBSTER's placeholder for an empty ask level's price.
pub const EMPTY_ASK_PRICE: i64 = 9_999_999_999;
/// LOBSTER's placeholder for an empty bid level's price.
pub const EMPTY_BID_PRICE: i64 = -9_999_999_999;
/// Raw price units (10^-8) per LOBSTER price unit (10^-4 dollars).
const PRICE_UNIT: i64 = 10_000;

/// One parsed message row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LobsterMessage {
    /// Seconds after midnight, in nanoseconds (LOBSTER prints up to 9 decimals).
    pub time_ns: u64,
    pub kind: u8,
    pub id: u64,
    pub size: Qty,
    pub price: Price,
    pub side: Side,
}

impl LobsterMessage {
    /// The book message, for the types that change the visible book.
    pub fn to_msg(self) -> Option<Msg> {
        let LobsterMessage { id, size: qty, price, side, .. } = self;
        match self.kind {
            1 => Some(Msg::Add { id, side, price, qty }),
            2 | 3 => Some(Msg::Cancel { id, side, price, qty }),
            4 => Some(Msg::Execute { id, side, price, qty }),
            _ => None,
        }
    }
}

fn bad(origin: &Origin, msg: String) -> InputError {
    InputError::new(origin.clone(), msg)
}

/// Nanoseconds in a day: a LOBSTER time is seconds after midnight, so it lies in `[0, 86400]`.
const DAY_NS: u64 = 86_400 * 1_000_000_000;

/// A LOBSTER time (`34200.004241176`: seconds after midnight, up to 9 decimals) in nanoseconds.
fn parse_time(origin: &Origin, s: &str) -> Result<u64, InputError> {
    let err = || {
        bad(
            origin,
            format!("time {s:?} is not seconds after midnight (a decimal between 0 and 86400)"),
        )
    };
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    let digits = |d: &str| d.bytes().all(|c| c.is_ascii_digit());
    if int.is_empty() || int.len() > 5 || !digits(int) || !digits(frac) || frac.len() > 9 {
        return Err(err());
    }
    let secs: u64 = int.parse().map_err(|_| err())?;
    let mut ns: u64 = 0;
    for (i, c) in frac.bytes().enumerate() {
        ns += u64::from(c - b'0') * 10u64.pow(8 - i as u32);
    }
    let t = secs * 1_000_000_000 + ns;
    if t > DAY_NS {
        return Err(err());
    }
    Ok(t)
}

/// A LOBSTER size: a whole number of shares (`18`); fractions are refused, not truncated.
fn parse_size(origin: &Origin, what: &str, s: &str) -> Result<Qty, InputError> {
    let err = |why: &str| bad(origin, format!("{what} {s:?} {why}"));
    if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
        return Err(err("is not a whole number of shares"));
    }
    s.parse::<i64>()
        .ok()
        .and_then(|n| n.checked_mul(Qty::from_units(1).raw()))
        .map(Qty::from_raw)
        .ok_or_else(|| err("is out of range"))
}

/// Parses a message row.
pub fn parse_message(origin: &Origin, line: &str) -> Result<LobsterMessage, InputError> {
    let f: Vec<&str> = line.split(',').map(str::trim).collect();
    if f.len() < 6 {
        return Err(bad(
            origin,
            format!(
                "message row has {} columns, expected 6 (time,type,order_id,size,price,direction)",
                f.len()
            ),
        ));
    }
    let time_ns = parse_time(origin, f[0])?;
    let kind: u8 =
        f[1].parse().map_err(|_| bad(origin, format!("type {:?} is not an integer", f[1])))?;
    if !(1..=7).contains(&kind) {
        return Err(bad(origin, format!("unknown message type {kind} (expected 1-7)")));
    }
    let id: u64 =
        f[2].parse().map_err(|_| bad(origin, format!("order id {:?} is not an integer", f[2])))?;
    let size = parse_size(origin, "size", f[3])?;
    let price: i64 = f[4].parse().map_err(|_| {
        bad(origin, format!("price {:?} is not an integer (dollars x 10000)", f[4]))
    })?;
    let price = price
        .checked_mul(PRICE_UNIT)
        .map(Price::from_raw)
        .ok_or_else(|| bad(origin, format!("price {price} out of range")))?;
    let side = match f[5] {
        "1" => Side::Bid,
        "-1" => Side::Ask,
        other => return Err(bad(origin, format!("direction {other:?} (expected 1 or -1)"))),
    };
    Ok(LobsterMessage { time_ns, kind, id, size, price, side })
}

/// Reads the first row of a LOBSTER orderbook file as (side, price, size) levels.
fn read_seed(path: &Path) -> anyhow::Result<Vec<(Side, Price, Qty)>> {
    let mut levels = None;
    let mut done = false;
    for_each_line(path, |origin, line| {
        if done || line.trim().is_empty() {
            return Ok(());
        }
        done = true;
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        if f.is_empty() || f.len() % 4 != 0 {
            return Err(bad(
                origin,
                format!("orderbook row has {} columns, expected a multiple of 4", f.len()),
            )
            .into());
        }
        let mut out = Vec::new();
        for (i, chunk) in f.chunks(4).enumerate() {
            for (side, p, s) in [(Side::Ask, chunk[0], chunk[1]), (Side::Bid, chunk[2], chunk[3])] {
                let price: i64 = p.parse().map_err(|_| {
                    bad(origin, format!("level {} price {p:?} is not an integer", i + 1))
                })?;
                let size = parse_size(origin, &format!("level {} size", i + 1), s)?;
                if size.is_zero() || price == EMPTY_ASK_PRICE || price == EMPTY_BID_PRICE {
                    continue;
                }
                let price = price
                    .checked_mul(PRICE_UNIT)
                    .map(Price::from_raw)
                    .ok_or_else(|| bad(origin, format!("price {price} out of range")))?;
                out.push((side, price, size));
            }
        }
        levels = Some(out);
        Ok(())
    })?;
    levels.ok_or_else(|| anyhow::anyhow!("{}: orderbook file is empty", path.display()))
}

/// Writes one orderbook row (no newline) for `levels` levels in LOBSTER's layout.
pub fn write_row(book: &OrderBook, levels: usize, out: &mut String) {
    fn lobster_price(p: Price) -> i64 {
        // every price came in as an integer number of 10^-4 units
        p.raw() / PRICE_UNIT
    }
    for d in 0..levels {
        if d > 0 {
            out.push(',');
        }
        match book.asks.nth(d) {
            Some(l) => write!(out, "{},{}", lobster_price(l.price), l.qty),
            None => write!(out, "{EMPTY_ASK_PRICE},0"),
        }
        .expect("writing to a String");
        match book.bids.nth(d) {
            Some(l) => write!(out, ",{},{}", lobster_price(l.price), l.qty),
            None => write!(out, ",{EMPTY_BID_PRICE},0"),
        }
        .expect("writing to a String");
    }
}

/// What a replay saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    pub messages: u64,
    pub unknown_order_adjustments: u64,
    pub negative_qty: u64,
    pub crossed: u64,
    pub invalid: u64,
    pub duplicate_order_ids: u64,
}

impl Summary {
    pub fn ok(&self) -> bool {
        self.negative_qty == 0
            && self.crossed == 0
            && self.invalid == 0
            && self.duplicate_order_ids == 0
    }
}

/// Replays the message file, writing one orderbook row per message to `out`.
pub fn replay(args: &LobsterArgs, out: &mut dyn Write) -> anyhow::Result<Summary> {
    let levels = args.levels as usize;
    let mut book = L3Book::new(Venue::Lobster);
    let mut summary = Summary::default();
    let mut seed: Option<Vec<(Side, Price, Qty)>> = match &args.initial_book {
        Some(p) => {
            Some(read_seed(p).with_context(|| format!("reading initial book {}", p.display()))?)
        }
        None => None,
    };
    let mut row = String::with_capacity(levels * 48);
    for_each_line(&args.messages, |origin, line| {
        if line.trim().is_empty() {
            return Ok(());
        }
        let m = parse_message(origin, line)?;
        if let Some(levels) = seed.take() {
            seed_before(&mut book, levels, &m, origin)?;
        }
        if let Some(msg) = m.to_msg() {
            book.apply(msg);
            book.clear_updates();
        }
        summary.messages += 1;
        if book.is_crossed() {
            summary.crossed += 1;
        }
        row.clear();
        write_row(book.ladder(), levels, &mut row);
        row.push('\n');
        out.write_all(row.as_bytes())?;
        Ok(())
    })?;
    if summary.messages == 0 {
        return Err(InputError::new(
            Origin { path: args.messages.clone(), line: 1 },
            "no message rows: the message file is empty",
        )
        .into());
    }
    let c = book.counters();
    summary.unknown_order_adjustments = c.unknown_order_adjustments;
    summary.negative_qty = c.negative_qty_clamped;
    summary.invalid = c.invalid;
    summary.duplicate_order_ids = c.duplicate_order_ids;
    Ok(summary)
}

/// Seeds `book` with the initial-book levels minus the first message's own effect.
fn seed_before(
    book: &mut L3Book,
    levels: Vec<(Side, Price, Qty)>,
    first: &LobsterMessage,
    origin: &Origin,
) -> Result<(), InputError> {
    let mut map: BTreeMap<(bool, Price), i64> = BTreeMap::new();
    for (side, price, qty) in levels {
        *map.entry((side == Side::Bid, price)).or_default() += qty.raw();
    }
    let delta = match first.kind {
        1 => -first.size.raw(),
        2..=4 => first.size.raw(),
        _ => 0,
    };
    if delta != 0 {
        let e = map.entry((first.side == Side::Bid, first.price)).or_default();
        *e += delta;
        if *e < 0 {
            return Err(InputError::new(
                origin.clone(),
                "the initial book's first row does not contain this first message's order \
                 (LOBSTER's orderbook row 1 is the book after message 1)",
            ));
        }
    }
    for ((bid, price), qty) in map {
        book.seed_level(if bid { Side::Bid } else { Side::Ask }, price, Qty::from_raw(qty));
    }
    book.clear_updates();
    Ok(())
}

/// Runs the replay, writing LOBSTER orderbook rows to `out` and counts to stderr; returns
/// whether every check passed.
pub fn run(args: &LobsterArgs, out: &mut dyn Write) -> anyhow::Result<bool> {
    let s = replay(args, out)?;
    eprintln!(
        "lobster: {} messages, {} unknown-order adjustments, {} negative-quantity clamps, {} crossed, {} invalid, {} duplicate ids",
        s.messages, s.unknown_order_adjustments, s.negative_qty, s.crossed, s.invalid, s.duplicate_order_ids
    );
    Ok(s.ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o() -> Origin {
        Origin { path: "m.csv".into(), line: 4 }
    }

    #[test]
    fn parses_message_rows() {
        let m = parse_message(&o(), "34200.004241176,1,16113575,18,5853300,1").unwrap();
        assert_eq!(m.kind, 1);
        assert_eq!(m.id, 16113575);
        assert_eq!(m.size, Qty::from_units(18));
        assert_eq!(m.price, Price::parse("585.33").unwrap());
        assert_eq!(m.side, Side::Bid);
        assert_eq!(
            m.to_msg(),
            Some(Msg::Add { id: 16113575, side: Side::Bid, price: m.price, qty: m.size })
        );
        assert_eq!(m.time_ns, 34_200_004_241_176);
        assert_eq!(parse_message(&o(), "0,1,1,1,1,1").unwrap().time_ns, 0);
        assert_eq!(parse_message(&o(), "86400,1,1,1,1,1").unwrap().time_ns, DAY_NS);
        assert_eq!(parse_message(&o(), "5.,1,1,1,1,1").unwrap().time_ns, 5_000_000_000);
        let halt = parse_message(&o(), "34300.5,7,0,0,-1,-1").unwrap();
        assert_eq!(halt.to_msg(), None);
        for (bad_row, what) in [
            ("34200,9,1,1,1,1", "unknown message type"),
            ("34200,1,1,1,1", "columns"),
            ("34200,1,x,1,1,1", "order id"),
            ("34200,1,1,1,5853300.5,1", "price"),
            ("34200,1,1,1,5853300,0", "direction"),
            ("34200,1,1,-3,5853300,1", "size"),
            ("34200,1,1,1.5,5853300,1", "size"),
            ("34200,1,1,0.0001,5853300,1", "size"),
            ("34200,1,1,,5853300,1", "size"),
            ("abc,1,1,1,5853300,1", "time"),
            ("-1,1,1,1,5853300,1", "time"),
            ("86400.000000001,1,1,1,5853300,1", "time"),
            ("34200.0000000001,1,1,1,5853300,1", "time"),
            ("1e4,1,1,1,5853300,1", "time"),
            (",1,1,1,5853300,1", "time"),
            ("NaN,1,1,1,5853300,1", "time"),
        ] {
            let e = parse_message(&o(), bad_row).unwrap_err().to_string();
            assert!(e.starts_with("m.csv:4: ") && e.contains(what), "{bad_row}: {e}");
        }
    }

    #[test]
    fn empty_levels_use_lobster_placeholders() {
        let mut b = OrderBook::new();
        b.apply(Side::Bid, Price::from_raw(5_853_300 * PRICE_UNIT), Qty::from_units(18));
        let mut s = String::new();
        write_row(&b, 2, &mut s);
        assert_eq!(s, "9999999999,0,5853300,18,9999999999,0,-9999999999,0");
    }
}
