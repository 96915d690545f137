//! [`NatsBus`]: the [`Bus`] between processes, on core NATS (`[bus] kind = "nats"`).
//!
//! A topic `T` travels on the subject `{prefix}.bus.{side}.{encode(T)}` ([`subject_of`]), where
//! `side` says who publishes it ([`Publisher`]: `w` a worker — forming candles, the tick-by-tick
//! host's books — or `g` a gateway — the persister's stored closed candles): a NATS server with
//! a user per role lets a worker publish only `bus.w.>`, and a gateway takes a closed candle
//! only from `bus.g.`, so a worker's credentials cannot make a browser see a closed candle that
//! was never stored ([`Poison::Sender`]). A process subscribes to `{prefix}.bus.*.{encode(T)}`.
//! Publishing
//! hands the frame to one task that writes it to the NATS connection (a bounded queue: a
//! publisher never waits for the network; what does not fit is counted in
//! [`NatsBusStats::dropped`], never silently). A process subscribes to a topic's subject when its
//! first local subscriber arrives and unsubscribes when the last one has gone; messages reach the
//! local subscribers through the same [`Fanout`] as the in-process bus, so sessions do not know
//! which bus they are on.
//!
//! Book and heartbeat topics ([`is_local`]) never leave the process: each process's books carry
//! its own update ids. The exception is a cluster whose tick-by-tick books run on one worker
//! (`[l3] host = "worker:ID"`, [`NatsBus::share_tick_books`]): their topics travel, and every
//! gateway passes the host's deltas (with the host's ids) to its clients.
//!
//! Kline topics are de-duplicated on the way in ([`KlineDedup`]): in a cluster every replica
//! of a kline task publishes its forming candles, and a persister's redelivered batch publishes
//! its closed candles again; local subscribers see each update once, never an older one.
//!
//! Core NATS is at-most-once. It carries what a newer message supersedes — forming candles,
//! book deltas (a client that misses one resyncs by the seed 002 rule), heartbeats, stored
//! closed candles as pushes. What must not be lost (closed candles on their way to the store)
//! goes through JetStream, not through this bus.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt as _;
use shared::cluster::bounds::{Poison, TimeWindow};
use shared::cluster::payload::{Admit, KlineDedup};
use shared::protocol::{InstrumentId, Stream};
use tokio::sync::mpsc;

use super::{Bounds, Bus, Fanout, PoisonStats, Subscription};
use crate::lock::lock;
use crate::shutdown::Shutdown;

/// Frames queued for the NATS connection before publishes are dropped.
pub const PUBLISH_QUEUE: usize = 65_536;

/// Most bytes of frames [`NatsBus`] packs into one NATS message by `publish_all`: some hundred
/// kline frames, well within a subscriber's queue (`limits.bus_capacity`, default 1,024), since a
/// batch reaches the local subscribers at once (NATS's default maximum payload is 1 MiB).
const BATCH_BYTES: usize = 64 * 1024;

/// The first byte of a NATS message holding several frames (a frame is a JSON object: it never
/// starts with it); then each frame as a 4-byte big-endian length and its bytes.
const BATCH_MARK: u8 = 0;

/// Packs `frames` into batch messages of at most [`BATCH_BYTES`] (a larger frame alone).
fn pack(frames: Vec<Bytes>) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut buf = bytes::BytesMut::new();
    for f in frames {
        if buf.len() > 1 && buf.len() + 4 + f.len() > BATCH_BYTES {
            out.push(std::mem::take(&mut buf).freeze());
        }
        if buf.is_empty() {
            buf.extend_from_slice(&[BATCH_MARK]);
        }
        buf.extend_from_slice(&u32::try_from(f.len()).unwrap_or(u32::MAX).to_be_bytes());
        buf.extend_from_slice(&f);
    }
    if buf.len() > 1 {
        out.push(buf.freeze());
    }
    out
}

/// The frames of a NATS message: itself, or those of a batch; `None` for a malformed batch.
fn unpack(payload: Bytes) -> Option<Vec<Bytes>> {
    if payload.first() != Some(&BATCH_MARK) {
        return Some(vec![payload]);
    }
    let mut frames = Vec::new();
    let mut at = 1;
    while at < payload.len() {
        let len = payload.get(at..at + 4)?;
        let len = u32::from_be_bytes(len.try_into().ok()?) as usize;
        let end = (at + 4).checked_add(len).filter(|&e| e <= payload.len())?;
        frames.push(payload.slice(at + 4..end));
        at = end;
    }
    Some(frames)
}

/// Every time: the window of a bus that checks nothing.
const UNBOUNDED: TimeWindow = TimeWindow { earliest_ms: i64::MIN, latest_ms: i64::MAX };

/// How often a topic's NATS subscription checks whether it still has local subscribers.
const IDLE_CHECK: Duration = Duration::from_secs(5);

/// Counters of a [`NatsBus`] (for `/metrics` and tests).
#[derive(Debug, Default)]
pub struct NatsBusStats {
    pub published: AtomicU64,
    /// Publishes dropped because the queue to the NATS connection was full or it failed.
    pub dropped: AtomicU64,
    /// Messages received from NATS for local subscribers.
    pub received: AtomicU64,
    /// NATS subscriptions opened (one per topic with local subscribers).
    pub subscriptions: AtomicU64,
    /// Kline pushes dropped as already delivered (the same update from another replica).
    pub duplicates: AtomicU64,
    /// Kline pushes dropped because they were not kline pushes.
    pub malformed: AtomicU64,
    /// Kline pushes dropped because the exchange's clock of their instrument is not known yet
    /// (nothing to check their times against).
    pub unbounded: AtomicU64,
    /// Kline pushes refused: a time beyond the exchange's clock, or a closed candle from a
    /// worker (by kind in the process's [`PoisonStats`]).
    pub refused: AtomicU64,
}

/// What a [`NatsBus`] checks what it reads against, and where it counts what it refuses.
struct Guard {
    bounds: Arc<dyn Bounds>,
    poison: Arc<PoisonStats>,
}

/// Who publishes on a [`NatsBus`]: the subject token after `bus` (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Publisher {
    /// A cluster's worker: forming candles, the tick-by-tick host's books.
    Worker,
    /// A gateway (or a single server on the NATS bus): everything it publishes, among which
    /// the stored closed candles.
    Gateway,
}

impl Publisher {
    fn token(self) -> &'static str {
        match self {
            Publisher::Worker => "w",
            Publisher::Gateway => "g",
        }
    }
}

/// The subject of `topic` published by `side` under `prefix`. Topics are browser stream names
/// (`kline@sim:spot:BTC/USDT:5m`, `depth@…,20`); the characters NATS gives a meaning to — `.`
/// (token separator), `*`, `>` and whitespace — and `%` are percent-encoded, so every topic is
/// one subject token and distinct topics have distinct subjects.
pub fn subject_of(prefix: &str, side: Publisher, topic: &str) -> String {
    format!("{prefix}.bus.{}.{}", side.token(), token(topic))
}

/// The subject a process subscribes to for `topic`, whoever publishes it.
fn any_side(prefix: &str, topic: &str) -> String {
    format!("{prefix}.bus.*.{}", token(topic))
}

/// Who published a message on `subject` (`None`: not a bus subject of a side).
fn side_of(prefix: &str, subject: &str) -> Option<Publisher> {
    let rest = subject.strip_prefix(prefix)?.strip_prefix(".bus.")?;
    match rest.split_once('.')?.0 {
        "w" => Some(Publisher::Worker),
        "g" => Some(Publisher::Gateway),
        _ => None,
    }
}

/// The name a [`token`] stands for (`None`: not a token [`token`] makes).
pub fn untoken(token: &str) -> Option<String> {
    let b = token.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// `name` as one subject token (see [`subject_of`]).
pub fn token(name: &str) -> String {
    let mut s = String::with_capacity(name.len());
    for c in name.chars() {
        match c {
            '.' | '*' | '>' | '%' => s.push_str(&format!("%{:02X}", c as u32)),
            c if c.is_whitespace() => {
                for b in c.to_string().bytes() {
                    s.push_str(&format!("%{b:02X}"));
                }
            }
            c => s.push(c),
        }
    }
    s
}

/// The bus on NATS. See the module documentation.
pub struct NatsBus {
    client: async_nats::Client,
    prefix: String,
    fanout: Fanout,
    queue: mpsc::Sender<(String, Bytes)>,
    /// Topics with a NATS subscription (the task forwarding it into the fan-out).
    subscribed: Arc<Mutex<HashMap<String, tokio::task::JoinHandle<()>>>>,
    stats: Arc<NatsBusStats>,
    /// Tick-by-tick book topics travel (see the module docs).
    tick_books_shared: bool,
    /// Set once by the gateway ([`NatsBus::guard_with`]); unset, pushes are not time-checked
    /// (a worker's bus reads none).
    guard: Arc<OnceLock<Guard>>,
    /// Who this process publishes as.
    side: Publisher,
    shutdown: Shutdown,
}

impl NatsBus {
    /// Makes the tick-by-tick books' topics (`depth_update@{source}:stock:…`) travel between
    /// processes: they have one producer in the cluster.
    pub fn share_tick_books(mut self, on: bool) -> Self {
        self.tick_books_shared = on;
        self
    }

    fn local(&self, topic: &str) -> bool {
        is_local(topic, self.tick_books_shared)
    }

    /// Checks the times of every push read from NATS against `bounds`, counting what is
    /// refused in `poison` (set once; later calls are ignored).
    pub fn guard_with(&self, bounds: Arc<dyn Bounds>, poison: Arc<PoisonStats>) {
        let _ = self.guard.set(Guard { bounds, poison });
    }

    /// A bus on `client` under `prefix`, delivering locally through a fan-out of `capacity`
    /// messages per topic. Its tasks end with `shutdown`, or when the bus is dropped.
    pub fn new(
        client: async_nats::Client,
        prefix: &str,
        side: Publisher,
        capacity: usize,
        shutdown: &Shutdown,
    ) -> Self {
        let shutdown = shutdown.child();
        let (queue, mut rx) = mpsc::channel::<(String, Bytes)>(PUBLISH_QUEUE);
        let stats = Arc::new(NatsBusStats::default());
        {
            let (client, stats, token) = (client.clone(), stats.clone(), shutdown.token().clone());
            shutdown.spawn(async move {
                loop {
                    let (subject, payload) = tokio::select! {
                        m = rx.recv() => match m { Some(m) => m, None => break },
                        () = token.cancelled() => break,
                    };
                    match client.publish(subject, payload).await {
                        Ok(()) => stats.published.fetch_add(1, Relaxed),
                        Err(_) => stats.dropped.fetch_add(1, Relaxed),
                    };
                }
                let _ = client.flush().await;
            });
        }
        NatsBus {
            client,
            prefix: prefix.to_string(),
            fanout: Fanout::new(capacity),
            queue,
            subscribed: Arc::new(Mutex::new(HashMap::new())),
            tick_books_shared: false,
            guard: Arc::new(OnceLock::new()),
            side,
            stats,
            shutdown,
        }
    }

    pub fn stats(&self) -> &NatsBusStats {
        &self.stats
    }

    /// The local fan-out (counts for the operations view).
    pub fn fanout(&self) -> &Fanout {
        &self.fanout
    }

    /// Whether the NATS connection is up.
    pub fn connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// Opens the NATS subscription of `topic` (the caller holds the `subscribed` lock).
    fn open(&self, topic: &str) -> tokio::task::JoinHandle<()> {
        let subject = any_side(&self.prefix, topic);
        let prefix = self.prefix.clone();
        let (client, fanout, stats, guard) =
            (self.client.clone(), self.fanout.clone(), self.stats.clone(), self.guard.clone());
        let (subscribed, token, topic) =
            (self.subscribed.clone(), self.shutdown.token().clone(), topic.to_string());
        stats.subscriptions.fetch_add(1, Relaxed);
        self.shutdown.spawn(async move {
            let mut sub = match client.subscribe(subject.clone()).await {
                Ok(sub) => sub,
                Err(e) => {
                    tracing::warn!(%subject, error = %e, "bus: NATS subscribe failed");
                    lock(&subscribed).remove(&topic);
                    return;
                }
            };
            let mut idle = tokio::time::interval(IDLE_CHECK);
            idle.tick().await;
            // Every replica of a kline task publishes its forming candles: pass each update once,
            // and none whose times the exchange cannot have sent.
            let instrument: Option<InstrumentId> = match topic.parse::<Stream>() {
                Ok(Stream::Kline(series)) => Some(series.instrument),
                _ => None,
            };
            let mut dedup = instrument.as_ref().map(|_| KlineDedup::new());
            loop {
                tokio::select! {
                    m = sub.next() => match m {
                        Some(m) => {
                            stats.received.fetch_add(1, Relaxed);
                            let sender = side_of(&prefix, m.subject.as_str());
                            let Some(frames) = unpack(m.payload) else {
                                stats.malformed.fetch_add(1, Relaxed);
                                if let Some(g) = guard.get() {
                                    g.poison.record(Poison::Unparsable, format_args!("{subject}: a batch cut short"));
                                }
                                continue;
                            };
                            let batch = frames.len() > 1;
                            let window = match (guard.get(), &instrument) {
                                (Some(g), Some(i)) => g.bounds.window(i),
                                _ => Some(UNBOUNDED),
                            };
                            for frame in frames {
                                let admit = match (dedup.as_mut(), &window) {
                                    (None, _) => Admit::Pass,
                                    (Some(d), Some(w)) => d.admit_from(&frame, w, sender == Some(Publisher::Gateway)),
                                    (Some(_), None) => {
                                        stats.unbounded.fetch_add(1, Relaxed);
                                        continue;
                                    }
                                };
                                match admit {
                                    Admit::Pass => {
                                        fanout.publish(&topic, frame);
                                    }
                                    Admit::Duplicate => {
                                        stats.duplicates.fetch_add(1, Relaxed);
                                    }
                                    Admit::Malformed => {
                                        stats.malformed.fetch_add(1, Relaxed);
                                        if let Some(g) = guard.get() {
                                            g.poison.record(Poison::Unparsable, format_args!("{subject}: not a kline push"));
                                        }
                                    }
                                    Admit::Outside(kind) => {
                                        stats.refused.fetch_add(1, Relaxed);
                                        if let (Some(g), Some(i), Poison::TooNew) = (guard.get(), &instrument, kind) {
                                            // maybe the clock's estimate is stale: read it again
                                            g.bounds.refresh(i);
                                        }
                                        if let Some(g) = guard.get() {
                                            g.poison.record(kind, format_args!("{}: a push refused", m.subject));
                                        }
                                    }
                                }
                            }
                            if batch {
                                // the subscribers' turn to take them before the next batch
                                tokio::task::yield_now().await;
                            }
                        }
                        None => break,
                    },
                    _ = idle.tick() => {
                        // the last local subscriber has gone: leave, unless one arrives now (it
                        // would take the same lock to find this subscription)
                        let mut map = lock(&subscribed);
                        if fanout.subscriber_count(&topic) == 0 {
                            map.remove(&topic);
                            break;
                        }
                    }
                    () = token.cancelled() => break,
                }
            }
            let _ = sub.unsubscribe().await;
        })
    }
}

impl Drop for NatsBus {
    fn drop(&mut self) {
        self.shutdown.stop();
    }
}

/// Topics that stay in their process: every process's books are its own (a gateway's
/// `BookPublisher` mints its update ids; a browser follows one gateway's ids), and so is its
/// heartbeat — except tick-by-tick books when `tick_books_shared` (one host publishes them).
pub fn is_local(topic: &str, tick_books_shared: bool) -> bool {
    let book = topic.starts_with("depth_update@") || topic.starts_with("depth@");
    (book && !(tick_books_shared && is_tick_book(topic))) || topic == "heartbeat"
}

/// A book topic of a stock (`depth_update@sse:stock:600000`, `depth@sim:stock:600000,20`):
/// only the tick-by-tick engine rebuilds those.
fn is_tick_book(topic: &str) -> bool {
    topic.split_once('@').is_some_and(|(_, id)| id.split(':').nth(1) == Some("stock"))
}

impl Bus for NatsBus {
    fn publish(&self, topic: &str, payload: Bytes) -> usize {
        if self.local(topic) {
            return self.fanout.publish(topic, payload);
        }
        let local = self.fanout.subscriber_count(topic);
        if self.queue.try_send((subject_of(&self.prefix, self.side, topic), payload)).is_err() {
            self.stats.dropped.fetch_add(1, Relaxed);
        }
        local
    }

    /// Frames of one topic travel packed into as few NATS messages as fit (a persister's round
    /// publishes thousands of one series' candles at once).
    fn publish_all(&self, topic: &str, payloads: Vec<Bytes>) {
        if self.local(topic) || payloads.len() < 2 {
            for p in payloads {
                self.publish(topic, p);
            }
            return;
        }
        let subject = subject_of(&self.prefix, self.side, topic);
        for batch in pack(payloads) {
            if self.queue.try_send((subject.clone(), batch)).is_err() {
                self.stats.dropped.fetch_add(1, Relaxed);
            }
        }
    }

    fn subscribe(&self, topic: &str) -> Subscription {
        if self.local(topic) {
            return self.fanout.subscribe(topic);
        }
        let mut map = lock(&self.subscribed);
        let sub = self.fanout.subscribe(topic);
        if map.get(topic).is_none_or(|h| h.is_finished()) {
            let handle = self.open(topic);
            map.insert(topic.to_string(), handle);
        }
        sub
    }

    /// Subscribers of a shared topic may be in any process of the cluster: always true.
    fn has_subscribers(&self, topic: &str) -> bool {
        !self.local(topic) || self.fanout.subscriber_count(topic) > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_become_one_subject_token_each() {
        assert_eq!(
            subject_of("mr", Publisher::Worker, "kline@sim:spot:BTC/USDT:5m"),
            "mr.bus.w.kline@sim:spot:BTC/USDT:5m"
        );
        assert_eq!(
            subject_of("mr", Publisher::Gateway, "depth@x:spot:A.B/C*>:1 %"),
            "mr.bus.g.depth@x:spot:A%2EB/C%2A%3E:1%20%25"
        );
        assert_ne!(
            subject_of("mr", Publisher::Worker, "a.b"),
            subject_of("mr", Publisher::Worker, "a%2Eb")
        );
        assert_eq!(any_side("mr", "kline@x:spot:A/B:1m"), "mr.bus.*.kline@x:spot:A/B:1m");
        for name in ["depth@x:spot:A.B/C*>:1 %", "sim:spot:BTC/USDT", "a\tb.c"] {
            assert_eq!(untoken(&token(name)).as_deref(), Some(name));
        }
        assert_eq!(untoken("%zz"), None);
        assert_eq!(untoken("%4"), None);
        for side in [Publisher::Worker, Publisher::Gateway] {
            assert_eq!(side_of("mr", &subject_of("mr", side, "heartbeat")), Some(side));
        }
        assert_eq!(side_of("mr", "mr.bus.x.heartbeat"), None);
        assert_eq!(side_of("mr", "other.bus.w.heartbeat"), None);
    }

    #[test]
    fn only_tick_by_tick_books_travel_and_only_when_shared() {
        for shared in [false, true] {
            assert!(is_local("heartbeat", shared));
            assert!(is_local("depth_update@sim:spot:BTC/USDT", shared));
            assert!(is_local("depth@sim:futures:BTC/USDT,20", shared));
            assert!(!is_local("kline@sim:spot:BTC/USDT:1m", shared));
            assert!(!is_local("kline@sse:stock:600000:1m", shared));
            assert_eq!(is_local("depth_update@sse:stock:600000", shared), !shared);
            assert_eq!(is_local("depth@sim:stock:600000,20", shared), !shared);
        }
    }

    #[test]
    fn frames_packed_into_batches_come_out_as_they_went_in() {
        let frame = |i: usize, len: usize| Bytes::from(format!("{{\"i\":{i}}}{}", " ".repeat(len)));
        let frames: Vec<Bytes> = (0..3_000).map(|i| frame(i, i % 300)).collect();
        let batches = pack(frames.clone());
        assert!(batches.len() > 1 && batches.len() < 40, "{} batches", batches.len());
        assert!(batches.iter().all(|b| b.len() <= BATCH_BYTES && b[0] == BATCH_MARK));
        let out: Vec<Bytes> = batches.into_iter().flat_map(|b| unpack(b).unwrap()).collect();
        assert_eq!(out, frames);
        // a frame larger than a batch travels alone
        let big = vec![frame(1, 10), frame(2, BATCH_BYTES * 2), frame(3, 10)];
        let batches = pack(big.clone());
        assert_eq!(batches.len(), 3);
        assert_eq!(batches.into_iter().flat_map(|b| unpack(b).unwrap()).collect::<Vec<_>>(), big);
        // a plain message is one frame; a cut or lying batch is refused, not read past its end
        assert_eq!(unpack(frame(7, 0)), Some(vec![frame(7, 0)]));
        let whole = pack(vec![frame(1, 0), frame(2, 0)]).pop().unwrap();
        assert_eq!(unpack(whole.slice(..whole.len() - 1)), None);
        assert_eq!(unpack(whole.slice(..3)), None);
        assert_eq!(unpack(Bytes::from_static(&[0, 255, 255, 255, 255, b'{'])), None);
    }
}
