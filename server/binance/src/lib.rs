//! The Binance protocol, client side: what millrace speaks to real Binance and to its own
//! simulated exchange (which serialises its output with the same [`wire`] types).
//!
//! - [`wire`] — serde types for stream events, stream requests/replies and REST bodies, exact
//!   conversion to `shared` types, symbol and stream names.
//! - [`fastdepth`] — [`fastdepth::parse_depth_frame`]: diff-depth frames in one pass straight
//!   into fixed point and reusable level buffers, exactly equal to the serde path (its fallback).
//! - [`rest`] — [`rest::RestClient`]: klines, depth, exchangeInfo, time; request-weight tracking
//!   and client-side back-off after 429/418.
//! - [`stream`] — [`stream::connect`] / [`stream::Connection`]: one combined-stream WebSocket
//!   with pong replies, idle pings, stall detection and the planned reconnect before Binance's
//!   24 h cut.
//!
//! The caller (the ingest supervisor) owns reconnecting, counting malformed frames and feeding
//! `shared::sync::BookSync` / the candle pipeline; nothing here spawns a task.
//!
//! Only this module (and the simulator, through [`wire`]) knows Binance's formats; everything
//! downstream sees `shared` types.

pub mod fastdepth;
pub mod rest;
pub mod stream;
pub mod wire;

pub use fastdepth::parse_frame;

use shared::protocol::Market;
use shared::sync::ContinuityRule;

/// Real Binance spot REST base URL.
pub const SPOT_REST_URL: &str = "https://api.binance.com";
/// Real Binance spot WebSocket base URL.
pub const SPOT_WS_URL: &str = "wss://stream.binance.com:9443";
/// Real Binance USD-M futures REST base URL.
pub const FUTURES_REST_URL: &str = "https://fapi.binance.com";
/// Real Binance USD-M futures WebSocket base URL.
pub const FUTURES_WS_URL: &str = "wss://fstream.binance.com";

/// Which Binance product's API: spot (`/api/v3`) or USD-M futures (`/fapi/v1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Product {
    Spot,
    Futures,
}

impl Product {
    /// The product for a millrace market; `None` for markets Binance does not have.
    pub fn of_market(market: Market) -> Option<Product> {
        match market {
            Market::Spot => Some(Product::Spot),
            Market::Futures => Some(Product::Futures),
            Market::Stock => None,
        }
    }

    /// The REST path prefix: `/api/v3` or `/fapi/v1`.
    pub const fn api_prefix(self) -> &'static str {
        match self {
            Product::Spot => "/api/v3",
            Product::Futures => "/fapi/v1",
        }
    }

    /// Real Binance's REST base URL.
    pub const fn default_rest_url(self) -> &'static str {
        match self {
            Product::Spot => SPOT_REST_URL,
            Product::Futures => FUTURES_REST_URL,
        }
    }

    /// Real Binance's WebSocket base URL.
    pub const fn default_ws_url(self) -> &'static str {
        match self {
            Product::Spot => SPOT_WS_URL,
            Product::Futures => FUTURES_WS_URL,
        }
    }

    /// The depth continuity rule of this product's diff stream.
    pub const fn continuity_rule(self) -> ContinuityRule {
        match self {
            Product::Spot => ContinuityRule::Spot,
            Product::Futures => ContinuityRule::Futures,
        }
    }

    /// The millrace market.
    pub const fn market(self) -> Market {
        match self {
            Product::Spot => Market::Spot,
            Product::Futures => Market::Futures,
        }
    }
}
