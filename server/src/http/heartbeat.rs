//! The `heartbeat` stream: one task ticks once a second and publishes a ready-to-send push frame on
//! a tokio broadcast channel; every subscribed WebSocket session holds a receiver.

use std::sync::Arc;
use std::time::Duration;

use shared::protocol::{Heartbeat, Push, Stream};
use tokio::sync::broadcast;

use crate::clock::wall_clock_ms as now_ms;
use crate::shutdown::Shutdown;

/// Heartbeats kept for slow receivers; one that falls further behind skips to the newest.
const BACKLOG: usize = 4;

/// Handle to the heartbeat publisher; cheap to clone.
#[derive(Clone)]
pub struct Heartbeats {
    /// Serialized `{"stream":"heartbeat","data":{...}}` frames, encoded once for all sessions.
    tx: broadcast::Sender<Arc<str>>,
}

impl Heartbeats {
    /// Spawns the ticker on the current runtime, as a part of `shutdown`.
    pub fn start(every: Duration, shutdown: &Shutdown) -> Self {
        let (tx, _) = broadcast::channel(BACKLOG);
        let publisher = tx.clone();
        shutdown.spawn_until_stopped(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut seq = 0u64;
            loop {
                ticks.tick().await;
                seq += 1;
                // No receivers is normal: nobody is subscribed.
                let _ = publisher.send(encode(seq, now_ms()));
            }
        });
        Self { tx }
    }

    /// A new receiver that sees heartbeats published from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<str>> {
        self.tx.subscribe()
    }
}

/// The push frame for heartbeat `seq` at `server_time_ms`.
pub fn encode(seq: u64, server_time_ms: i64) -> Arc<str> {
    let push = Push {
        stream: Stream::Heartbeat,
        data: Heartbeat { seq, server_time_ms, version: crate::VERSION.to_string() },
    };
    serde_json::to_string(&push).expect("a heartbeat always serializes").into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_matches_the_protocol() {
        let frame = encode(7, 1_700_000_000_000);
        assert_eq!(
            &*frame,
            format!(
                r#"{{"stream":"heartbeat","data":{{"seq":7,"server_time_ms":1700000000000,"version":"{}"}}}}"#,
                crate::VERSION
            )
        );
    }
}
