//! The book checksums OKX and Kraken publish, reproduced from a fixed-point book.
//!
//! Both are CRC-32 (IEEE) over a string of the top levels' prices and quantities as the venue
//! prints them, so the book's numbers are written back in the venue's [`NumberFormat`] first.
//! A level whose value that format cannot print (more places than the instrument's precision)
//! makes the checksum uncomputable (`None`): the caller counts it as unchecked.

use crate::book::{Ladder, OrderBook};

use super::NumberFormat;

/// Levels of each side in OKX's checksum.
pub const OKX_LEVELS: usize = 25;
/// Levels of each side in Kraken's checksum.
pub const KRAKEN_LEVELS: usize = 10;

/// OKX's string: the best 25 bids and asks interleaved, `bidPx:bidSz:askPx:askSz:…`; where one
/// side has fewer levels, the other's remaining ones follow alone. Written into `out` (cleared).
pub fn okx_string(
    book: &OrderBook,
    price: NumberFormat,
    qty: NumberFormat,
    out: &mut String,
) -> bool {
    out.clear();
    let mut bids = book.bids.iter().take(OKX_LEVELS);
    let mut asks = book.asks.iter().take(OKX_LEVELS);
    loop {
        let (bid, ask) = (bids.next(), asks.next());
        if bid.is_none() && ask.is_none() {
            return true;
        }
        for level in [bid, ask].into_iter().flatten() {
            if !out.is_empty() {
                out.push(':');
            }
            if !price.write(out, level.price.raw()) {
                return false;
            }
            out.push(':');
            if !qty.write(out, level.qty.raw()) {
                return false;
            }
        }
    }
}

/// OKX's checksum of `book`: the CRC-32 of [`okx_string`] as the signed integer OKX sends.
pub fn okx(
    book: &OrderBook,
    price: NumberFormat,
    qty: NumberFormat,
    scratch: &mut String,
) -> Option<i32> {
    okx_string(book, price, qty, scratch).then(|| crc32fast::hash(scratch.as_bytes()) as i32)
}

/// Kraken's string: the best 10 asks (lowest first) then the best 10 bids (highest first); of
/// each level its price then its quantity, printed with the instrument's precision, the `.`
/// removed and the leading zeros stripped. Written into `out` (cleared).
pub fn kraken_string(
    book: &OrderBook,
    price: NumberFormat,
    qty: NumberFormat,
    out: &mut String,
) -> bool {
    out.clear();
    kraken_side(&book.asks, price, qty, out) && kraken_side(&book.bids, price, qty, out)
}

fn kraken_side(side: &Ladder, price: NumberFormat, qty: NumberFormat, out: &mut String) -> bool {
    side.iter()
        .take(KRAKEN_LEVELS)
        .all(|l| kraken_digits(out, price, l.price.raw()) && kraken_digits(out, qty, l.qty.raw()))
}

/// Appends `raw` printed in `format`, without its `.` and its leading zeros.
fn kraken_digits(out: &mut String, format: NumberFormat, raw: i64) -> bool {
    format.write_digits(out, raw)
}

/// Kraken's checksum of `book`: the CRC-32 of [`kraken_string`], unsigned as Kraken sends it.
pub fn kraken(
    book: &OrderBook,
    price: NumberFormat,
    qty: NumberFormat,
    scratch: &mut String,
) -> Option<u32> {
    kraken_string(book, price, qty, scratch).then(|| crc32fast::hash(scratch.as_bytes()))
}
