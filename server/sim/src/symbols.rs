//! The simulated exchange's instruments: Binance symbols with realistic prices, tick and step
//! sizes, typical order sizes and listing dates.

use shared::{Price, Qty};

/// One tradable pair of the simulated exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SymbolSpec {
    /// Binance symbol, upper case: `BTCUSDT`.
    pub symbol: String,
    /// `baseAsset`: `BTC`.
    pub base: String,
    /// `quoteAsset`: `USDT`.
    pub quote: String,
    /// `PRICE_FILTER.tickSize`: every price is a multiple of it.
    pub tick: Price,
    /// `LOT_SIZE.stepSize`: every quantity is a multiple of it.
    pub step: Qty,
    /// The reference price: history wanders around it (within about ±20 %), and the live
    /// engine starts wherever history is at the start minute.
    pub reference_price: Price,
    /// A typical order size (a multiple of `step`); participants size their orders around it.
    pub lot: Qty,
    /// First minute with klines (ms): REST history starts here, like a Binance listing date.
    pub listed_ms: i64,
}

/// Why a [`SymbolSpec`] cannot be simulated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("symbol {symbol}: {problem}")]
pub struct SpecError {
    pub symbol: String,
    pub problem: &'static str,
}

impl SymbolSpec {
    fn new(
        symbol: &str,
        base: &str,
        price: &str,
        tick: &str,
        step: &str,
        lot: &str,
        listed_ms: i64,
    ) -> Self {
        let p = |s: &str| Price::parse(s).expect("catalog price");
        let q = |s: &str| Qty::parse(s).expect("catalog qty");
        SymbolSpec {
            symbol: symbol.to_string(),
            base: base.to_string(),
            quote: symbol[base.len()..].to_string(),
            tick: p(tick),
            step: q(step),
            reference_price: p(price),
            lot: q(lot),
            listed_ms,
        }
    }

    /// The default instruments: `BTCUSDT, ETHUSDT, BNBUSDT, SOLUSDT, XRPUSDT, ADAUSDT, DOGEUSDT,
    /// LTCUSDT`, with Binance's tick and step sizes and listing dates.
    pub fn catalog() -> Vec<SymbolSpec> {
        vec![
            SymbolSpec::new(
                "BTCUSDT",
                "BTC",
                "90000",
                "0.01",
                "0.00001",
                "0.002",
                1_502_942_400_000,
            ),
            SymbolSpec::new("ETHUSDT", "ETH", "3000", "0.01", "0.0001", "0.05", 1_502_942_400_000),
            SymbolSpec::new("BNBUSDT", "BNB", "650", "0.01", "0.001", "0.2", 1_509_940_800_000),
            SymbolSpec::new("SOLUSDT", "SOL", "150", "0.01", "0.001", "1", 1_597_125_600_000),
            SymbolSpec::new("XRPUSDT", "XRP", "2.2", "0.0001", "0.1", "80", 1_525_417_200_000),
            SymbolSpec::new("ADAUSDT", "ADA", "0.7", "0.0001", "0.1", "250", 1_523_937_600_000),
            SymbolSpec::new("DOGEUSDT", "DOGE", "0.3", "0.00001", "1", "600", 1_562_328_000_000),
            SymbolSpec::new("LTCUSDT", "LTC", "90", "0.01", "0.001", "2", 1_513_135_800_000),
        ]
    }

    /// The catalog entry for `symbol` (any case).
    pub fn by_name(symbol: &str) -> Option<SymbolSpec> {
        Self::catalog().into_iter().find(|s| s.symbol.eq_ignore_ascii_case(symbol))
    }

    /// Checks that the spec is usable: positive tick, step and lot, a start price on the tick,
    /// a lot on the step, and an exact quote volume (`tick × step` a multiple of 10^-8).
    pub fn validate(&self) -> Result<(), SpecError> {
        let what = |m: &'static str| Err(SpecError { symbol: self.symbol.clone(), problem: m });
        if self.symbol.is_empty()
            || !self.symbol.bytes().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
        {
            return what("the symbol must be upper-case letters and digits");
        }
        if self.tick.raw() <= 0 || self.step.raw() <= 0 || self.lot.raw() <= 0 {
            return what("tick, step and lot must be positive");
        }
        if self.reference_price.raw() <= 0 || self.reference_price.raw() % self.tick.raw() != 0 {
            return what("the reference price must be a positive multiple of the tick");
        }
        if self.reference_price.raw() / self.tick.raw() < 1_000 {
            return what("the reference price must be at least 1000 ticks");
        }
        if self.lot.raw() % self.step.raw() != 0 {
            return what("the lot must be a multiple of the step");
        }
        if (self.tick.raw() as i128 * self.step.raw() as i128) % shared::fixed::SCALE as i128 != 0 {
            return what("tick × step must be a multiple of 10^-8 (exact quote volumes)");
        }
        Ok(())
    }

    /// The reference price in ticks.
    pub(crate) fn reference_ticks(&self) -> i64 {
        self.reference_price.raw() / self.tick.raw()
    }

    /// The lot in steps.
    pub(crate) fn lot_steps(&self) -> i64 {
        self.lot.raw() / self.step.raw()
    }

    /// One basis point of the reference price, in ticks (at least 1).
    pub(crate) fn bp_ticks(&self) -> i64 {
        (self.reference_ticks() / 10_000).max(1)
    }
}

/// A 64-bit mix (SplitMix64's finaliser): derives independent seeds from (seed, parts...).
pub(crate) fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A seed derived from `seed`, a symbol name and further parts, stable across runs and
/// platforms.
pub(crate) fn derive_seed(seed: u64, symbol: &str, parts: &[u64]) -> u64 {
    let mut h = mix(seed);
    for b in symbol.bytes() {
        h = mix(h ^ b as u64);
    }
    for p in parts {
        h = mix(h ^ *p);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_is_valid() {
        let c = SymbolSpec::catalog();
        assert!(c.len() >= 8);
        for s in &c {
            s.validate().unwrap();
            assert_eq!(format!("{}{}", s.base, s.quote), s.symbol);
        }
        assert_eq!(SymbolSpec::by_name("dogeusdt").unwrap().tick.to_string(), "0.00001");
        assert!(SymbolSpec::by_name("NOPE").is_none());
    }
}
