//! The venues beside Binance (OKX, Bybit, Coinbase, Kraken): a `[[sources]]` entry of one of
//! their kinds is a [`VenueSource`] (its instrument list, its URLs), and each order book asked of
//! it is a venue book job ([`book_job`]), supervised like Binance's depth jobs, synced by the
//! venue's own rules (`shared::venue::VenueSync`) and published through the same
//! `BookPublisher`.
//!
//! An embedded simulator serves the four dialects too: with `venues = true` (the default) a
//! `sim` source named `sim` also lists `sim-okx`, `sim-bybit`, `sim-coinbase` and `sim-kraken`,
//! whose books start on demand like any other.
//!
//! Adding the next venue: its wire format in `server/venues` (frames into `venues::Message`,
//! its instrument list in `venues::rest`), its sequence and checksum rules in
//! `shared::venue` (a `SequenceRule` / `ChecksumRule` if it has new ones), its dialect in the
//! simulator (`server/sim/src/venues`), and here its URLs ([`default_urls`], [`sim_urls`]) and
//! its subscription frames ([`book_job::Channel`]).

pub mod book_job;
pub mod kline_job;
mod source;

pub use source::{VenueRestError, VenueSource};

use shared::protocol::Market;
use shared::venue::Dialect;

/// The venue's listing of the job's instrument, waiting (and saying why in the job's health)
/// while the venue's instrument list is not loaded; `None` if the job is stopped meanwhile.
pub async fn listing_for(
    ctx: &crate::jobs::supervisor::JobContext,
    venue: &VenueSource,
) -> Option<venues::rest::Instrument> {
    loop {
        match venue.listing(&ctx.instrument) {
            Ok(l) => return Some(l),
            Err(e) => {
                ctx.health.error(&e);
                if ctx.sleep(std::time::Duration::from_secs(2)).await {
                    return None;
                }
            }
        }
    }
}

/// The venue's own public REST base and book WebSocket URL for `market` (Bybit's differ by
/// category; the others are read for spot only).
pub fn default_urls(dialect: Dialect, market: Market) -> (&'static str, &'static str) {
    match dialect {
        Dialect::Okx => ("https://www.okx.com", "wss://ws.okx.com:8443/ws/v5/public"),
        Dialect::Bybit if market == Market::Futures => {
            ("https://api.bybit.com", "wss://stream.bybit.com/v5/public/linear")
        }
        Dialect::Bybit => ("https://api.bybit.com", "wss://stream.bybit.com/v5/public/spot"),
        Dialect::Coinbase => ("https://api.coinbase.com", "wss://advanced-trade-ws.coinbase.com"),
        Dialect::Kraken => ("https://api.kraken.com", "wss://ws.kraken.com/v2"),
        Dialect::Binance => ("https://api.binance.com", "wss://stream.binance.com:9443"),
    }
}

/// The REST base and book WebSocket URL of `dialect`'s `market` on a simulator at `rest_base` /
/// `ws_base`.
pub fn sim_urls(
    dialect: Dialect,
    market: Market,
    rest_base: &str,
    ws_base: &str,
) -> (String, String) {
    let path = match dialect {
        Dialect::Okx => "/okx/ws/v5/public",
        Dialect::Bybit if market == Market::Futures => "/bybit/v5/public/linear",
        Dialect::Bybit => "/bybit/v5/public/spot",
        Dialect::Coinbase => "/coinbase/ws",
        Dialect::Kraken => "/kraken/v2",
        Dialect::Binance => "/ws",
    };
    let rest_prefix = match dialect {
        Dialect::Coinbase => "/coinbase",
        Dialect::Okx => "/okx",
        Dialect::Bybit => "/bybit",
        Dialect::Kraken => "/kraken",
        Dialect::Binance => "",
    };
    (format!("{rest_base}{rest_prefix}"), format!("{ws_base}{path}"))
}

/// The venues an embedded simulator also serves, in the order the picker lists them.
pub const SIM_DIALECTS: [Dialect; 4] =
    [Dialect::Okx, Dialect::Bybit, Dialect::Coinbase, Dialect::Kraken];
