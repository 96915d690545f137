//! The message bus between the pipelines (publishers) and the browser sessions (subscribers).
//!
//! A topic is a browser stream name (`kline@sim:spot:BTC/USDT:5m`, later `depth_update@…`), and a
//! message is the complete JSON text of the push frame (`{"stream":…,"data":…}`), serialised
//! **once** by the publisher and shared by every subscriber (fan-out copies a pointer, not bytes).
//!
//! Persist-then-publish is the publisher's duty: the pipeline publishes a closed candle only after
//! the store's transaction holding it committed. The bus only promises per-topic order.
//!
//! Every bus delivers to its local subscribers through the same [`Fanout`]: a map of topic ->
//! bounded broadcast channel. A subscriber that falls more than `capacity` messages behind does
//! not stall the publisher or other subscribers: its next receive reports [`RecvError::Lagged`]
//! and the session decides (resend fresh state or drop the client with a reason). A bus differs
//! in how a publish reaches the fan-out: [`InProcessBus`] (the single-process default) hands it
//! over directly; a bus between processes carries it over a broker first.
//!
//! Code that publishes or subscribes names only [`Bus`] (`Arc<dyn Bus>`); the composition root
//! (`app.rs`) chooses the implementation.

mod fanout;
mod inprocess;
pub mod nats;
pub mod poison;

use std::sync::Arc;

use bytes::Bytes;

pub use fanout::{Fanout, Subscription, DEFAULT_CAPACITY};
pub use inprocess::InProcessBus;
pub use nats::NatsBus;
pub use poison::PoisonStats;

/// One published message: its topic and the frame's JSON text (valid UTF-8).
#[derive(Debug, Clone)]
pub struct Message {
    pub topic: Arc<str>,
    pub payload: Bytes,
}

/// Why a receive returned no message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecvError {
    /// The subscriber fell behind and `skipped` messages were dropped for it.
    #[error("subscriber lagged; {skipped} messages skipped")]
    Lagged { skipped: u64 },
    /// The bus shut down.
    #[error("bus closed")]
    Closed,
}

/// Publish / subscribe by topic. Object safe: the service holds an `Arc<dyn Bus>`.
pub trait Bus: Send + Sync + 'static {
    /// Publishes `payload` on `topic`; returns how many local subscribers it was queued for.
    fn publish(&self, topic: &str, payload: Bytes) -> usize;
    /// Publishes `payloads` on `topic`, in order (a bus between processes may carry them in
    /// fewer messages; subscribers still get one frame each).
    fn publish_all(&self, topic: &str, payloads: Vec<Bytes>) {
        for p in payloads {
            self.publish(topic, p);
        }
    }
    /// Subscribes to `topic` (no replay of earlier messages). Dropping the subscription
    /// unsubscribes.
    fn subscribe(&self, topic: &str) -> Subscription;
    /// Whether `topic` has a subscriber (publishers skip serialising for nobody).
    fn has_subscribers(&self, topic: &str) -> bool;
}

/// The times a push read from another process may carry, by instrument: the exchange's clock
/// with the cluster's margins (see [`shared::cluster::bounds`]). A bus between processes
/// refuses a push outside them, so a forged one cannot move a de-duplication mark.
pub trait Bounds: Send + Sync + 'static {
    /// `None`: not known yet (the source's clock was never read); the push is dropped.
    fn window(
        &self,
        instrument: &shared::protocol::InstrumentId,
    ) -> Option<shared::cluster::bounds::TimeWindow>;

    /// Asks for a fresh reading of `instrument`'s clock (a push was beyond the estimate).
    fn refresh(&self, instrument: &shared::protocol::InstrumentId);
}
