//! Payloads between a cluster's processes, each with its natural id, and the de-duplication
//! that lets every payload reach downstream once although `redundancy` workers produce it.
//!
//! - A closed 1m candle travels from the workers to the persister as a [`ClosedCandle`] on
//!   JetStream, whose `Nats-Msg-Id` is [`ClosedCandle::msg_id`] — (series, open time) — so the
//!   stream keeps one copy of each within its duplicate window; the store's upsert by the same
//!   key covers what arrives later (a gap fill after an outage).
//! - Forming candles travel on core NATS from every replica. Replicas throttle independently,
//!   so they may send different updates of one minute and in any interleaving: [`KlineDedup`]
//!   passes each update once and never one older than what already passed (key: series, open
//!   time, event time), and each closed candle once (key: series, open time).

use serde::{Deserialize, Serialize};

use crate::candle::Candle;
use crate::protocol::{KlineEvent, Push, SeriesId};

/// A closed 1m candle from a worker's kline task, on its way to the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClosedCandle {
    pub series: SeriesId,
    pub candle: Candle,
}

impl ClosedCandle {
    /// The natural id: `{series}|{open_time}` (JetStream's `Nats-Msg-Id`).
    pub fn msg_id(&self) -> String {
        format!("{}|{}", self.series, self.candle.open_time)
    }
}

/// What [`KlineDedup::admit`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// New: pass it on.
    Pass,
    /// Seen already, or older than what passed: drop it.
    Duplicate,
    /// Not a kline push.
    Malformed,
}

/// The high-water marks of one `kline@{series}` topic (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KlineDedup {
    /// (open time, event time) of the newest forming update passed.
    forming: Option<(i64, i64)>,
    /// Open time of the newest closed candle passed.
    closed: Option<i64>,
}

impl KlineDedup {
    pub fn new() -> Self {
        Self::default()
    }

    /// Decides on one push frame (`{"stream":"kline@…","data":{…}}`).
    pub fn admit(&mut self, frame: &[u8]) -> Admit {
        let Ok(push) = serde_json::from_slice::<Push<KlineEvent>>(frame) else {
            return Admit::Malformed;
        };
        self.admit_event(&push.data)
    }

    /// Decides on one kline event.
    pub fn admit_event(&mut self, ev: &KlineEvent) -> Admit {
        let open = ev.k.t;
        if ev.k.x {
            if self.closed.is_some_and(|c| open <= c) {
                return Admit::Duplicate;
            }
            self.closed = Some(open);
            return Admit::Pass;
        }
        // A forming update of a minute that already closed, or not newer than the last one.
        if self.closed.is_some_and(|c| open <= c)
            || self.forming.is_some_and(|f| (open, ev.event_time) <= f)
        {
            return Admit::Duplicate;
        }
        self.forming = Some((open, ev.event_time));
        Admit::Pass
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;
    use crate::candle::Timeframe;
    use crate::fixed::{Price, Volume};
    use crate::protocol::{KlinePayload, Stream};

    fn frame(open: i64, event: i64, closed: bool) -> Vec<u8> {
        let s: SeriesId = "sim:spot:BTC/USDT:1m".parse().unwrap();
        let p = Price(100);
        let push = Push {
            stream: Stream::Kline(s.clone()),
            data: KlineEvent {
                e: "kline".into(),
                event_time: event,
                s,
                k: KlinePayload {
                    t: open,
                    close_time: open + 59_999,
                    i: Timeframe::M1,
                    o: p,
                    h: p,
                    l: p,
                    c: p,
                    v: Volume(1),
                    n: 1,
                    x: closed,
                },
            },
        };
        serde_json::to_vec(&push).unwrap()
    }

    #[test]
    fn each_update_passes_once_and_never_goes_back() {
        let mut d = KlineDedup::new();
        // replica A: events 1, 3; replica B: 2, 3 — interleaved 1, 3(A), 2(B), 3(B)
        assert_eq!(d.admit(&frame(0, 1, false)), Admit::Pass);
        assert_eq!(d.admit(&frame(0, 3, false)), Admit::Pass);
        assert_eq!(d.admit(&frame(0, 2, false)), Admit::Duplicate, "older than what passed");
        assert_eq!(d.admit(&frame(0, 3, false)), Admit::Duplicate);
        // the next minute forms before the persister's closed candle of minute 0 arrives
        assert_eq!(d.admit(&frame(60_000, 60_500, false)), Admit::Pass);
        assert_eq!(d.admit(&frame(0, 60_000, true)), Admit::Pass);
        assert_eq!(d.admit(&frame(0, 60_000, true)), Admit::Duplicate, "a redelivery");
        assert_eq!(d.admit(&frame(60_000, 61_000, false)), Admit::Pass);
        assert_eq!(d.admit(&frame(60_000, 120_000, true)), Admit::Pass);
        // a late forming update of a closed minute
        assert_eq!(d.admit(&frame(60_000, 119_000, false)), Admit::Duplicate);
        assert_eq!(d.admit(b"{\"stream\":\"heartbeat\"}"), Admit::Malformed);
    }

    #[test]
    fn closed_candles_have_their_natural_id() {
        let c = ClosedCandle {
            series: "sim:spot:BTC/USDT:1m".parse().unwrap(),
            candle: Candle::one_minute(
                60_000,
                Price(1),
                Price(1),
                Price(1),
                Price(1),
                Volume(1),
                1,
            ),
        };
        assert_eq!(c.msg_id(), "sim:spot:BTC/USDT:1m|60000");
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<ClosedCandle>(&json).unwrap(), c);
    }
}
