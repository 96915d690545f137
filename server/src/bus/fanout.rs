//! [`Fanout`]: the topic table every bus delivers through, and [`Subscription`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, Weak};

use crate::lock::{read, write};

use bytes::Bytes;
use tokio::sync::broadcast;

use super::{Message, RecvError};

/// Messages kept per topic for slow subscribers unless configured otherwise.
pub const DEFAULT_CAPACITY: usize = 1024;

/// Independent topic maps; a topic lives in the shard its name hashes to, so subscribe and
/// cleanup of one topic (write locks) do not stall publishers of the others.
const SHARDS: usize = 16;

type TopicMap = HashMap<Arc<str>, broadcast::Sender<Message>>;

/// The local fan-out of every [`Bus`](super::Bus): topic -> `tokio::sync::broadcast` channel, so a
/// message published once reaches every local subscriber of its topic by a refcount. A
/// cheap-to-clone handle.
///
/// - **Publish** takes a shard's read lock, looks the topic up and sends: no allocation beyond
///   the broadcast slot it overwrites (the payload is `Bytes`, each subscriber's copy is a
///   refcount). A topic nobody subscribes to is not in the map, so publishing to it is a hash
///   and a lookup.
/// - **Cleanup**: dropping the last [`Subscription`] of a topic removes the topic, so
///   the map holds only topics with subscribers.
/// - **Lag**: a subscriber more than `capacity` messages behind gets [`RecvError::Lagged`] with
///   the number it missed, then continues from the oldest message still buffered (call
///   [`Subscription::skip_to_newest`] to continue from the next new one instead).
/// - **Closed**: after [`Fanout::close`] (or when every handle is dropped) subscribers
///   receive what is still buffered, then [`RecvError::Closed`].
#[derive(Clone)]
pub struct Fanout {
    inner: Arc<Inner>,
}

struct Inner {
    /// Capacity of each topic's channel (tokio rounds it up to a power of two).
    capacity: usize,
    /// Topic maps; see [`SHARDS`]. A read lock for publish / subscribe to an existing topic /
    /// counts, a write lock only to add or remove a topic.
    shards: [RwLock<TopicMap>; SHARDS],
    /// Set by [`Fanout::close`]: no new topics, publish is a no-op.
    closed: AtomicBool,
}

impl Default for Fanout {
    fn default() -> Self {
        Self::new(DEFAULT_CAPACITY)
    }
}

impl std::fmt::Debug for Fanout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fanout")
            .field("capacity", &self.inner.capacity)
            .field("topics", &self.topic_count())
            .finish()
    }
}

/// FNV-1a: cheap and good enough to spread topic names over the shards.
fn shard_of(topic: &str) -> usize {
    let mut h: u32 = 0x811c_9dc5;
    for &b in topic.as_bytes() {
        h = (h ^ b as u32).wrapping_mul(0x0100_0193);
    }
    (h as usize) % SHARDS
}

impl Inner {
    fn shard(&self, topic: &str) -> &RwLock<TopicMap> {
        &self.shards[shard_of(topic)]
    }

    /// Removes `topic` if it has no subscribers left.
    fn release(&self, topic: &str) {
        let shard = self.shard(topic);
        {
            let map = read(shard);
            match map.get(topic) {
                Some(tx) if tx.receiver_count() == 0 => {}
                _ => return,
            }
        }
        // Subscribing happens under this lock (read or write), so the count cannot rise while
        // we hold it for writing: no subscriber is left on a removed channel.
        let mut map = write(shard);
        if map.get(topic).is_some_and(|tx| tx.receiver_count() == 0) {
            map.remove(topic);
        }
    }
}

impl Fanout {
    /// A bus whose topics buffer `capacity` messages (at least 1) for slow subscribers.
    pub fn new(capacity: usize) -> Self {
        let inner = Inner {
            capacity: capacity.max(1),
            shards: std::array::from_fn(|_| RwLock::new(HashMap::new())),
            closed: AtomicBool::new(false),
        };
        Self { inner: Arc::new(inner) }
    }

    /// Messages buffered per topic.
    pub fn capacity(&self) -> usize {
        self.inner.capacity
    }

    /// Topics with at least one subscriber (the map never holds others for long).
    pub fn topic_count(&self) -> usize {
        self.inner.shards.iter().map(|s| read(s).len()).sum()
    }

    /// Shuts the bus down: every subscriber gets what is buffered, then [`RecvError::Closed`];
    /// later publishes reach nobody and later subscriptions are closed at once.
    pub fn close(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        for shard in &self.inner.shards {
            write(shard).clear();
        }
    }

    fn subscription(&self, topic: Arc<str>, rx: broadcast::Receiver<Message>) -> Subscription {
        Subscription { rx: Some(rx), topic, bus: Arc::downgrade(&self.inner) }
    }
}

impl Fanout {
    /// Queues `payload` for every subscriber of `topic`; returns how many.
    #[inline]
    pub fn publish(&self, topic: &str, payload: Bytes) -> usize {
        let map = read(self.inner.shard(topic));
        match map.get_key_value(topic) {
            // `send` fails only when every receiver is gone (a cleanup about to happen).
            Some((name, tx)) => tx.send(Message { topic: name.clone(), payload }).unwrap_or(0),
            None => 0,
        }
    }

    /// A new subscriber of `topic` (created on first use; no replay of earlier messages).
    pub fn subscribe(&self, topic: &str) -> Subscription {
        let shard = self.inner.shard(topic);
        {
            let map = read(shard);
            if let Some((name, tx)) = map.get_key_value(topic) {
                return self.subscription(name.clone(), tx.subscribe());
            }
        }
        let mut map = write(shard);
        // Checked under the lock `close` clears, so no topic is added after a close.
        if self.inner.closed.load(Ordering::SeqCst) {
            let (_, rx) = broadcast::channel(1);
            return self.subscription(topic.into(), rx);
        }
        if let Some((name, tx)) = map.get_key_value(topic) {
            return self.subscription(name.clone(), tx.subscribe());
        }
        let name: Arc<str> = topic.into();
        let (tx, rx) = broadcast::channel(self.inner.capacity);
        map.insert(name.clone(), tx);
        self.subscription(name, rx)
    }

    /// Current number of subscribers of `topic`.
    pub fn subscriber_count(&self, topic: &str) -> usize {
        let map = read(self.inner.shard(topic));
        map.get(topic).map_or(0, |tx| tx.receiver_count())
    }
}

/// A subscription to one topic of an [`Fanout`]. Dropping it unsubscribes (and removes the
/// topic when it was the last one).
///
/// [`Subscription::recv`] is cancel safe: dropping its future before it completes loses no
/// message, so it can be raced in `select!` / `select_all`.
pub struct Subscription {
    /// Always `Some` until `drop` takes it (it must be gone before the topic is released).
    rx: Option<broadcast::Receiver<Message>>,
    /// The topic, for cleanup.
    topic: Arc<str>,
    /// The bus, to remove the topic when this was its last subscriber; weak so that dropping
    /// every bus handle closes subscriptions instead of leaking the bus.
    bus: Weak<Inner>,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription").field("topic", &self.topic).finish_non_exhaustive()
    }
}

fn map_recv(e: broadcast::error::RecvError) -> RecvError {
    match e {
        broadcast::error::RecvError::Lagged(skipped) => RecvError::Lagged { skipped },
        broadcast::error::RecvError::Closed => RecvError::Closed,
    }
}

impl Subscription {
    /// The topic subscribed to.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The next message if one is buffered, without waiting: `Ok(None)` when there is none yet.
    /// Lets a session drain everything available into one write.
    pub fn try_recv(&mut self) -> Result<Option<Message>, RecvError> {
        let Some(rx) = self.rx.as_mut() else {
            return Err(RecvError::Closed);
        };
        match rx.try_recv() {
            Ok(m) => Ok(Some(m)),
            Err(broadcast::error::TryRecvError::Empty) => Ok(None),
            Err(broadcast::error::TryRecvError::Lagged(skipped)) => {
                Err(RecvError::Lagged { skipped })
            }
            Err(broadcast::error::TryRecvError::Closed) => Err(RecvError::Closed),
        }
    }

    /// Drops everything buffered for this subscriber: the next message received is the next one
    /// published (for a session that answers a lag by sending fresh state).
    pub fn skip_to_newest(&mut self) {
        if let Some(rx) = self.rx.as_mut() {
            *rx = rx.resubscribe();
        }
    }
}

impl Subscription {
    /// The next message, in publish order. Cancel safe.
    pub async fn recv(&mut self) -> Result<Message, RecvError> {
        match self.rx.as_mut() {
            Some(rx) => rx.recv().await.map_err(map_recv),
            None => Err(RecvError::Closed),
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        drop(self.rx.take());
        if let Some(bus) = self.bus.upgrade() {
            bus.release(&self.topic);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(m: &Message) -> &str {
        std::str::from_utf8(&m.payload).unwrap()
    }

    #[tokio::test]
    async fn per_topic_order_and_isolation() {
        let bus = Fanout::default();
        let mut a = bus.subscribe("a");
        let mut b = bus.subscribe("b");
        for i in 0..100 {
            assert_eq!(bus.publish("a", Bytes::from(format!("a{i}"))), 1);
            assert_eq!(bus.publish("b", Bytes::from(format!("b{i}"))), 1);
        }
        for i in 0..100 {
            let m = a.recv().await.unwrap();
            assert_eq!((&*m.topic, text(&m)), ("a", format!("a{i}").as_str()));
            let m = b.recv().await.unwrap();
            assert_eq!((&*m.topic, text(&m)), ("b", format!("b{i}").as_str()));
        }
        assert!(a.try_recv().unwrap().is_none());
    }

    #[tokio::test]
    async fn fans_out_to_many_subscribers_sharing_the_payload() {
        let bus = Fanout::new(16);
        let mut subs: Vec<_> = (0..1000).map(|_| bus.subscribe("t")).collect();
        assert_eq!(bus.subscriber_count("t"), 1000);
        let payload = Bytes::from_static(b"{\"x\":1}");
        for _ in 0..10 {
            assert_eq!(bus.publish("t", payload.clone()), 1000);
        }
        for s in &mut subs {
            for _ in 0..10 {
                let m = s.recv().await.unwrap();
                // Same bytes, not a copy.
                assert_eq!(m.payload.as_ptr(), payload.as_ptr());
            }
            assert!(s.try_recv().unwrap().is_none());
        }
    }

    #[tokio::test]
    async fn a_lagging_subscriber_gets_lagged_and_others_continue() {
        let bus = Fanout::new(4);
        let mut slow = bus.subscribe("t");
        let mut fast = bus.subscribe("t");
        for i in 0..10 {
            bus.publish("t", Bytes::from(i.to_string()));
            assert_eq!(text(&fast.recv().await.unwrap()), i.to_string());
        }
        assert_eq!(slow.recv().await.unwrap_err(), RecvError::Lagged { skipped: 6 });
        // Then the oldest still buffered, in order.
        for i in 6..10 {
            assert_eq!(text(&slow.recv().await.unwrap()), i.to_string());
        }
        // skip_to_newest drops the backlog.
        bus.publish("t", Bytes::from_static(b"old"));
        slow.skip_to_newest();
        bus.publish("t", Bytes::from_static(b"new"));
        assert_eq!(text(&slow.recv().await.unwrap()), "new");
        assert_eq!(bus.subscriber_count("t"), 2);
    }

    #[test]
    fn topics_without_subscribers_are_removed() {
        let bus = Fanout::default();
        assert_eq!(bus.publish("nobody", Bytes::from_static(b"x")), 0);
        assert_eq!(bus.topic_count(), 0);
        let subs: Vec<_> = (0..3).map(|i| bus.subscribe(&format!("t{}", i % 2))).collect();
        assert_eq!(bus.topic_count(), 2);
        assert_eq!(bus.subscriber_count("t0"), 2);
        drop(subs);
        assert_eq!(bus.topic_count(), 0);
        assert_eq!(bus.subscriber_count("t0"), 0);
        assert_eq!(bus.publish("t0", Bytes::from_static(b"x")), 0);
        // Many distinct topics come and go without growing the map.
        for i in 0..10_000 {
            let s = bus.subscribe(&format!("topic-{i}"));
            drop(s);
        }
        assert_eq!(bus.topic_count(), 0);
    }

    #[test]
    fn concurrent_churn_never_strands_a_subscriber() {
        let bus = Fanout::new(1 << 14);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                let bus = bus.clone();
                scope.spawn(move || {
                    for _ in 0..2000 {
                        let mut s = bus.subscribe("hot");
                        assert!(bus.publish("hot", Bytes::from_static(b"x")) >= 1);
                        // Our own message (or others' before it) is there: the channel we joined
                        // is the one in the map.
                        assert!(s.try_recv().unwrap().is_some());
                    }
                });
            }
        });
        assert_eq!(bus.topic_count(), 0);
    }

    #[tokio::test]
    async fn close_delivers_the_backlog_then_closed() {
        let bus = Fanout::default();
        let mut s = bus.subscribe("t");
        bus.publish("t", Bytes::from_static(b"last"));
        bus.close();
        assert_eq!(text(&s.recv().await.unwrap()), "last");
        assert_eq!(s.recv().await.unwrap_err(), RecvError::Closed);
        assert_eq!(bus.publish("t", Bytes::from_static(b"x")), 0);
        let mut late = bus.subscribe("t");
        assert_eq!(late.recv().await.unwrap_err(), RecvError::Closed);
        assert_eq!(bus.topic_count(), 0);
    }

    #[tokio::test]
    async fn dropping_every_bus_handle_closes_subscriptions() {
        let bus = Fanout::default();
        let mut s = bus.subscribe("t");
        drop(bus);
        assert_eq!(s.recv().await.unwrap_err(), RecvError::Closed);
    }

    #[tokio::test]
    async fn recv_is_cancel_safe() {
        let bus = Fanout::default();
        let mut s = bus.subscribe("t");
        // A recv raced against a timer and abandoned loses nothing.
        tokio::select! {
            _ = s.recv() => panic!("nothing was published"),
            _ = tokio::task::yield_now() => {}
        }
        bus.publish("t", Bytes::from_static(b"1"));
        assert_eq!(text(&s.recv().await.unwrap()), "1");
    }
}
