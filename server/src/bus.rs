//! The message bus between the pipelines (publishers) and the browser sessions (subscribers).
//!
//! A topic is a browser stream name (`kline@sim:spot:BTC/USDT:5m`, later `depth_update@…`), and a
//! message is the complete JSON text of the push frame (`{"stream":…,"data":…}`), serialised
//! **once** by the publisher and shared by every subscriber (fan-out copies a pointer, not bytes).
//!
//! Persist-then-publish is the publisher's duty: the pipeline publishes a closed candle only after
//! the store's transaction holding it committed. The bus only promises per-topic order.
//!
//! [`InProcessBus`] (the default) is a map of topic -> bounded broadcast channel. A subscriber that
//! falls more than `capacity` messages behind does not stall the publisher or other subscribers:
//! its next receive reports [`RecvError::Lagged`] and the session decides (resend fresh state or
//! drop the client with a reason). NATS JetStream will implement [`Bus`] later.

use bytes::Bytes;

/// One published message: its topic and the frame's JSON text (valid UTF-8).
#[derive(Debug, Clone)]
pub struct Message {
    pub topic: std::sync::Arc<str>,
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

/// A subscription to one topic. Dropping it unsubscribes.
pub trait Subscription: Send + 'static {
    /// The next message, in publish order.
    fn recv(&mut self) -> impl std::future::Future<Output = Result<Message, RecvError>> + Send;
}

/// Publish / subscribe by topic.
pub trait Bus: Send + Sync + 'static {
    type Sub: Subscription;
    /// Publishes `payload` on `topic`; returns how many subscribers it was queued for.
    fn publish(&self, topic: &str, payload: Bytes) -> usize;
    /// Subscribes to `topic` (created on first use; no replay of earlier messages).
    fn subscribe(&self, topic: &str) -> Self::Sub;
    /// Current number of subscribers of `topic`.
    fn subscriber_count(&self, topic: &str) -> usize;
}
