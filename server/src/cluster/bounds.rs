//! [`ClusterBounds`]: what a gateway accepts from the bus, judged against its own sources.
//!
//! Everything a process reads from NATS is untrusted input (ARCHITECTURE.md, "The cluster").
//! The sans-IO checks are [`shared::cluster::bounds`]; this is the shell's part, which needs the
//! sources:
//! - **which series**: a closed candle's series must belong to a task the cluster runs or may
//!   run — a kline task of an instrument a configured source lists (pinned, matched by the
//!   pattern, or asked for on demand by a browser: a gateway subscribes any listed instrument).
//!   Any other series is foreign;
//! - **which times**: `[now − cluster.bus_retention_s, now + cluster.bus_tolerance_s]`, where
//!   now is the exchange's clock ([`crate::sources::ExchangeClock`]: a simulator may run ahead
//!   of the wall clock at any speed). A time beyond it is only refused once a fresh reading of
//!   the exchange's clock still puts it beyond: until then the message waits
//!   ([`Ruling::Wait`]), so a legitimate candle is never lost to a stale clock;
//! - **when it cannot judge** (the source's symbols or clock not loaded yet), a message waits
//!   rather than being refused.

use std::sync::Arc;

use shared::cluster::bounds::{Poison, TimeWindow};
use shared::cluster::payload::ClosedCandles;
use shared::protocol::InstrumentId;

use crate::bus::Bounds;
use crate::sources::{ResolveError, Sources};

/// How many times a message whose time is beyond the exchange's clock waits for a fresh
/// reading of that clock before it is refused.
const WAITS_FOR_THE_CLOCK: u64 = 3;

/// What to do with a message read from the bus.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ruling {
    /// It fits: act on it.
    Take,
    /// Poison: terminate it, count it.
    Refuse(Poison),
    /// It cannot be judged yet: leave it for later (redelivered after a delay).
    Wait,
}

/// A gateway's bounds (see the module docs). Cheap to share.
pub struct ClusterBounds {
    sources: Arc<Sources>,
    retention_ms: i64,
    tolerance_ms: i64,
}

impl ClusterBounds {
    pub fn new(sources: Arc<Sources>, retention_s: u64, tolerance_s: u64) -> Arc<Self> {
        let ms = |s: u64| i64::try_from(s.saturating_mul(1000)).unwrap_or(i64::MAX);
        Arc::new(ClusterBounds {
            sources,
            retention_ms: ms(retention_s),
            tolerance_ms: ms(tolerance_s),
        })
    }

    /// Judges one closed-candle message, delivered `delivered` times (1 the first time).
    pub fn closed_candles(&self, msg: &ClosedCandles, delivered: u64) -> Ruling {
        match self.sources.validate_series(&msg.series) {
            Ok(()) => {}
            Err(ResolveError::NotReady { .. }) => return Ruling::Wait,
            Err(_) => return Ruling::Refuse(Poison::ForeignSeries),
        }
        let Some(window) = self.window_of(&msg.series.instrument) else {
            return Ruling::Wait;
        };
        match msg.check(&window) {
            Ok(()) => Ruling::Take,
            Err(Poison::TooNew) if delivered < WAITS_FOR_THE_CLOCK => {
                // Maybe the clock's estimate is stale (a simulator restarted faster): read it
                // again before deciding.
                if let Some(clock) = self.sources.clock(&msg.series.instrument) {
                    clock.refresh();
                }
                Ruling::Wait
            }
            Err(p) => Ruling::Refuse(p),
        }
    }

    /// The times a message about `instrument` may carry, if its exchange's clock is known.
    pub fn window_of(&self, instrument: &InstrumentId) -> Option<TimeWindow> {
        let now = self.sources.clock(instrument)?.now_ms()?;
        Some(TimeWindow::around(now, self.retention_ms, self.tolerance_ms))
    }

    /// The sources the bounds are judged by.
    pub fn sources(&self) -> &Arc<Sources> {
        &self.sources
    }
}

impl Bounds for ClusterBounds {
    fn window(&self, instrument: &InstrumentId) -> Option<TimeWindow> {
        self.window_of(instrument)
    }

    fn refresh(&self, instrument: &InstrumentId) {
        if let Some(clock) = self.sources.clock(instrument) {
            clock.refresh();
        }
    }
}
