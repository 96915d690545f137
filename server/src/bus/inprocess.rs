//! [`InProcessBus`]: the single-process [`Bus`], a [`Fanout`] and nothing else.

use bytes::Bytes;

use super::{Bus, Fanout, Subscription};

/// The in-process bus (the default): a publish goes straight into the local [`Fanout`]. A
/// cheap-to-clone handle.
#[derive(Clone, Debug, Default)]
pub struct InProcessBus {
    fanout: Fanout,
}

impl InProcessBus {
    /// A bus whose topics buffer `capacity` messages (at least 1) for slow subscribers.
    pub fn new(capacity: usize) -> Self {
        Self { fanout: Fanout::new(capacity) }
    }

    /// The fan-out, for counts and shutdown.
    pub fn fanout(&self) -> &Fanout {
        &self.fanout
    }
}

impl Bus for InProcessBus {
    #[inline]
    fn publish(&self, topic: &str, payload: Bytes) -> usize {
        self.fanout.publish(topic, payload)
    }

    fn subscribe(&self, topic: &str) -> Subscription {
        self.fanout.subscribe(topic)
    }

    fn has_subscribers(&self, topic: &str) -> bool {
        self.fanout.subscriber_count(topic) > 0
    }
}
