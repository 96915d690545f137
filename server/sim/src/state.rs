//! [`Srv`]: what every REST and WebSocket handler of the simulator shares.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::faults::Faults;
use crate::hub::Hub;
use crate::limiter::RateLimiter;
use crate::market::Exchange;

/// Connection-level settings the sessions read.
#[derive(Debug, Clone)]
pub(crate) struct WsSettings {
    pub ping_interval: Duration,
    pub pong_timeout: Duration,
    pub max_streams_per_connection: usize,
}

/// Everything a request handler needs; shared as `Arc<Srv>`.
pub(crate) struct Srv {
    pub ex: Arc<Exchange>,
    pub hub: Arc<Hub>,
    pub faults: Arc<Faults>,
    pub limiter: RateLimiter,
    pub config: WsSettings,
    /// Cancelled on shutdown; sessions close with 1001.
    pub stop: CancellationToken,
    /// The other venues' connections ([`crate::venues`]).
    pub venue_conns: Arc<crate::venues::VenueConns>,
}
