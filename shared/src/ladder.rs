//! What an order-book ladder shows (the dashboard's display of a book): the best levels of each
//! side with their cumulative depth and depth bars, the spread and the mid, exact. It reads an
//! [`OrderBook`]; the book knows nothing of it.

use core::fmt::Write as _;

use crate::book::{Ladder, Level, OrderBook};
use crate::fixed::{Price, Qty};

/// One row of a ladder display: a level and the depth through it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DepthRow {
    pub price: Price,
    pub qty: Qty,
    /// Sum of the quantities from the best level through this one.
    pub cumulative: Qty,
    /// `cumulative` against the deeper of the two sides shown (the larger of the two last
    /// cumulatives), in thousandths, rounded down: the length of the row's depth bar.
    pub bar_permille: u16,
}

/// What an order-book ladder shows: the best `n` levels of each side with cumulative depth, the
/// spread and the mid, all exact (fixed point; the mid is kept doubled because it may fall on
/// half a raw unit).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DepthLadder {
    /// Best first.
    pub bids: Vec<DepthRow>,
    /// Best first.
    pub asks: Vec<DepthRow>,
}

impl DepthLadder {
    /// The ladder of the best `n` levels per side of `book`.
    pub fn of(book: &OrderBook, n: usize) -> Self {
        let rows = |side: &Ladder| -> Vec<(Level, Qty)> {
            let mut cumulative = Qty::ZERO;
            side.iter()
                .take(n)
                .map(|l| {
                    // quantities are bounded far below i64::MAX per level, but a sum of absurd
                    // ones must not wrap
                    cumulative = Qty::from_raw(cumulative.raw().saturating_add(l.qty.raw()));
                    (l, cumulative)
                })
                .collect()
        };
        let (bids, asks) = (rows(&book.bids), rows(&book.asks));
        let deepest = [bids.last(), asks.last()]
            .into_iter()
            .flatten()
            .map(|(_, c)| c.raw())
            .max()
            .unwrap_or(0);
        let finish = |rows: Vec<(Level, Qty)>| -> Vec<DepthRow> {
            rows.into_iter()
                .map(|(l, cumulative)| DepthRow {
                    price: l.price,
                    qty: l.qty,
                    cumulative,
                    bar_permille: if deepest > 0 {
                        (cumulative.raw() as i128 * 1000 / deepest as i128).clamp(0, 1000) as u16
                    } else {
                        0
                    },
                })
                .collect()
        };
        DepthLadder { bids: finish(bids), asks: finish(asks) }
    }

    /// Best ask minus best bid (negative when the book is crossed).
    pub fn spread(&self) -> Option<Price> {
        Some(Price::from_raw(
            self.asks.first()?.price.raw().checked_sub(self.bids.first()?.price.raw())?,
        ))
    }

    /// Best bid plus best ask, in raw units: twice the mid, exactly.
    pub fn mid_x2(&self) -> Option<i128> {
        Some(self.bids.first()?.price.raw() as i128 + self.asks.first()?.price.raw() as i128)
    }

    /// The mid as the shortest exact decimal (`2682.785`, or one digit past the raw units,
    /// `0.000000015`, when it falls on half a unit).
    pub fn mid_string(&self) -> Option<String> {
        Some(mid_string(self.bids.first()?.price, self.asks.first()?.price))
    }
}

/// The mid of `bid` and `ask` as the shortest exact decimal (`2682.785`, or one digit past the
/// raw units, `0.000000015`, when it falls on half a unit).
pub fn mid_string(bid: crate::fixed::Price, ask: crate::fixed::Price) -> String {
    let x2 = bid.raw() as i128 + ask.raw() as i128;
    let mut s = String::new();
    if x2 % 2 == 0 {
        crate::fixed::write_raw(&mut s, x2 / 2).expect("writing to a String");
    } else {
        // half a raw unit: ten times the value has one more decimal
        let tenfold = x2 * 5; // (x2 / 2) * 10
        let negative = tenfold < 0;
        let abs = tenfold.unsigned_abs();
        let scale = crate::fixed::SCALE as u128 * 10;
        let (int, frac) = (abs / scale, abs % scale);
        let width = crate::fixed::DECIMALS as usize + 1;
        let frac = format!("{frac:0width$}");
        write!(s, "{}{int}.{}", if negative { "-" } else { "" }, frac.trim_end_matches('0'))
            .expect("writing to a String");
    }
    s
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;

    fn p(s: &str) -> Price {
        Price::parse(s).unwrap()
    }

    fn q(s: &str) -> Qty {
        Qty::parse(s).unwrap()
    }

    #[test]
    fn depth_ladder_rows_spread_and_mid() {
        let mut book = OrderBook::new();
        book.replace(
            &[
                Level::new(p("100"), q("1")),
                Level::new(p("99"), q("2")),
                Level::new(p("98"), q("3")),
                Level::new(p("97"), q("9")),
            ],
            &[Level::new(p("101"), q("4")), Level::new(p("102.5"), q("1"))],
        );
        let ladder = DepthLadder::of(&book, 3);
        let row = |r: &DepthRow| {
            (r.price.to_string(), r.qty.to_string(), r.cumulative.to_string(), r.bar_permille)
        };
        let bids: Vec<_> = ladder.bids.iter().map(row).collect();
        let asks: Vec<_> = ladder.asks.iter().map(row).collect();
        // the deeper side shown is the bids' 6: bars are thousandths of it, rounded down
        assert_eq!(
            bids,
            [
                ("100".into(), "1".into(), "1".into(), 166),
                ("99".into(), "2".into(), "3".into(), 500),
                ("98".into(), "3".into(), "6".into(), 1000)
            ]
        );
        assert_eq!(
            asks,
            [
                ("101".into(), "4".into(), "4".into(), 666),
                ("102.5".into(), "1".into(), "5".into(), 833)
            ]
        );
        assert_eq!(ladder.spread(), Some(p("1")));
        assert_eq!(ladder.mid_string().as_deref(), Some("100.5"));
        // a mid on half a raw unit keeps its last digit
        let mut tight = OrderBook::new();
        tight.replace(
            &[Level::new(Price::from_raw(1), q("1"))],
            &[Level::new(Price::from_raw(2), q("1"))],
        );
        assert_eq!(DepthLadder::of(&tight, 20).mid_string().as_deref(), Some("0.000000015"));
        tight.replace(
            &[Level::new(Price::from_raw(-3), q("1"))],
            &[Level::new(Price::from_raw(0), q("1"))],
        );
        assert_eq!(DepthLadder::of(&tight, 20).mid_string().as_deref(), Some("-0.000000015"));
        // one side or none: no spread, no mid, bars against what is there
        let mut one = OrderBook::new();
        one.replace(&[Level::new(p("5"), q("2"))], &[]);
        let l = DepthLadder::of(&one, 20);
        assert_eq!((l.spread(), l.mid_string(), l.bids[0].bar_permille), (None, None, 1000));
        assert_eq!(DepthLadder::of(&OrderBook::new(), 20), DepthLadder::default());
        // absurd quantities saturate instead of wrapping
        let mut absurd = OrderBook::new();
        let huge = Qty::from_raw(i64::MAX / 2);
        absurd.replace(
            &[Level::new(p("3"), huge), Level::new(p("2"), huge), Level::new(p("1"), huge)],
            &[Level::new(p("4"), q("1"))],
        );
        let l = DepthLadder::of(&absurd, 20);
        assert_eq!(l.bids[2].cumulative, Qty::from_raw(i64::MAX));
        assert!(l.bids.iter().chain(&l.asks).all(|r| r.bar_permille <= 1000));
        assert!(l.bids.windows(2).all(|w| w[0].cumulative <= w[1].cumulative));
    }
}
